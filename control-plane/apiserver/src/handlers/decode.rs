//! Decoding a write's body and options: type meta, field validation (Strict, Warn, Ignore),
//! the field manager, patch options and apply configurations.

use http::HeaderMap;
use serde_json::{Value, json};

use super::verb::meta_str;
use crate::negotiate::{self, BodyType};
use crate::registry::ResourceType;
use crate::request::{FieldValidation, Query};
use crate::status::invalid_of;
use crate::status::{ApiError, ApiResult};
use skiff_machinery::admission::{self};
use skiff_machinery::{apply, schema};

/// The field manager of a write: `fieldManager`, else the user agent's program name.
/// The field manager of a write: `fieldManager`, else the User-Agent up to its first `/`.
/// A bad `fieldManager` is a 422 on the request's options kind (`CreateOptions`, ...).
pub(super) fn manager(query: &Query, headers: &HeaderMap, options: &str) -> ApiResult<String> {
    if let Some(m) = query.get("fieldManager") {
        let errs = field_manager_errors(m);
        if !errs.is_empty() {
            return Err(invalid_of(options, "meta.k8s.io", "", errs));
        }
        return Ok(m.to_string());
    }
    let ua =
        headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
    Ok(ua.split('/').next().unwrap_or("unknown").chars().take(128).collect())
}

/// What upstream's field manager requires of an apply configuration before it merges it,
/// whatever the `fieldValidation`: the resource's apiVersion and a kind, and only fields
/// its schema declares (the typed conversion of the patch object). Upstream answers the
/// last two with a 500, being fixed upstream to the 400 used here.
pub(super) fn check_apply_config(rt: &ResourceType, applied: &Value) -> ApiResult<()> {
    let expected = rt.desc.api_version();
    let specified = applied.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if specified != expected {
        return Err(ApiError::bad_request(
            apply::ApplyError::VersionMismatch { specified: specified.into(), expected }
                .to_string(),
        ));
    }
    let kind = applied.get("kind").and_then(Value::as_str).unwrap_or_default();
    let gvk = format!("{}/{}, Kind={kind}", rt.group(), rt.desc.version);
    // Upstream names the configuration as sent (kubectl sets its namespace).
    let object = format!(
        "{}/{}; {gvk}",
        meta_str(applied, "namespace").unwrap_or_default(),
        meta_str(applied, "name").unwrap_or_default()
    );
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({object}): no corresponding type for {gvk}"
        )));
    }
    let schemas = schema::Schemas::builtin();
    let Some(root) = schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) else {
        return Ok(());
    };
    let errors: Vec<String> = schemas
        .unknown_fields(schemas.field(root), applied)
        .iter()
        .map(|path| format!("{path}: field not declared in schema"))
        .collect();
    let detail = match errors.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    Err(ApiError::bad_request(format!("failed to create typed patch object ({object}): {detail}")))
}

/// Upstream's `ValidateFieldManager`: at most 128 bytes, printable characters only.
pub(super) fn field_manager_errors(m: &str) -> Vec<admission::FieldError> {
    let path = admission::Path::root("fieldManager");
    let mut errs = Vec::new();
    if m.len() > 128 {
        errs.push(admission::FieldError::too_long(&path, 128));
    }
    for (i, c) in m.char_indices() {
        if c.is_control() || (c.is_whitespace() && c != ' ') {
            let detail = format!("invalid character U+{:04X} (at position {i})", c as u32);
            errs.push(admission::FieldError::invalid(&path, m, detail));
        }
    }
    errs
}

/// Upstream's `ValidatePatchOptions`: `force` only for an apply patch, which needs a
/// `fieldManager`. A 422 on `PatchOptions.meta.k8s.io`.
pub(super) fn validate_patch_options(query: &Query, body_type: BodyType) -> ApiResult<()> {
    let mut errs = Vec::new();
    let apply = body_type == BodyType::ApplyPatch;
    if !apply && query.has("force") {
        errs.push(admission::FieldError::forbidden(
            &admission::Path::root("force"),
            "may not be specified for non-apply patch",
        ));
    }
    match query.get("fieldManager") {
        None if apply => errs.push(admission::FieldError::required(
            &admission::Path::root("fieldManager"),
            "is required for apply patch",
        )),
        None => {}
        Some(m) => errs.extend(field_manager_errors(m)),
    }
    if errs.is_empty() {
        return Ok(());
    }
    Err(invalid_of("PatchOptions", "meta.k8s.io", "", errs))
}

/// Decode a create/update body, check its type meta and apply field validation.
pub(super) fn decode_for(
    rt: &ResourceType,
    body_type: BodyType,
    body: &[u8],
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<Value> {
    // The common case, a JSON body of known fields only, takes one pass: anything else
    // (errors to report, unknown fields to warn about) takes the full path below.
    if body_type == BodyType::Json
        && body.len() <= negotiate::MAX_BODY
        && let Some(normalized) = (rt.normalize.clean_json)(body)
    {
        return Ok(normalized);
    }
    let mut obj = negotiate::decode_object(body_type, body)?;
    check_type_meta(rt, &mut obj)?;
    if let Some(schema) = rt.custom.as_ref().and_then(|c| c.structural.as_deref()) {
        return decode_custom(rt, schema, obj, validation, warnings);
    }
    // The typed round trip drops exactly the fields the schema does not know (both come from
    // the same types): when it changes nothing, there is no unknown field to look for.
    match (rt.normalize.borrowed)(&obj) {
        Ok(normalized) if normalized == obj => Ok(normalized),
        Ok(normalized) => {
            validate_fields(rt, &obj, validation, warnings)?;
            Ok(normalized)
        }
        Err(e) => {
            // Unknown fields are reported first, as upstream's strict decoder does.
            validate_fields(rt, &obj, validation, warnings)?;
            Err(normalize_error(rt, e))
        }
    }
}

/// A custom resource's body: its metadata normalized, the fields its schema does not know
/// pruned (reported as fieldValidation says), nulls dropped and defaults applied.
fn decode_custom(
    rt: &ResourceType,
    schema: &skiff_machinery::crd::Structural,
    obj: Value,
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<Value> {
    let mut obj = (rt.normalize.owned)(obj).map_err(|e| normalize_error(rt, e))?;
    let pruned = admission::apiextensions::decode_custom(schema, &mut obj);
    report_unknown(&pruned, validation, warnings)?;
    Ok(obj)
}

/// Unknown fields as fieldValidation says: an error (Strict), warnings (Warn) or nothing.
fn report_unknown(
    unknown: &[String],
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<()> {
    if unknown.is_empty() || validation == FieldValidation::Ignore {
        return Ok(());
    }
    let msgs: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{}\"", p.trim_start_matches('.')))
        .collect();
    if validation == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!("strict decoding error: {}", msgs.join(", "))));
    }
    warnings.extend(msgs);
    Ok(())
}

/// kind/apiVersion must name this resource (or be absent); they are filled in.
pub(super) fn check_type_meta(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    let api_version = rt.desc.api_version();
    let map = obj.as_object_mut().ok_or_else(|| ApiError::bad_request("body must be an object"))?;
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(rt.kind()));
        }
        Some(k) if k == rt.kind() => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({api_version}) or kind {k} does not match {}",
                map.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                rt.kind()
            )));
        }
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(api_version));
        }
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    Ok(())
}

pub(super) fn validate_fields(
    rt: &ResourceType,
    obj: &Value,
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<()> {
    if validation == FieldValidation::Ignore {
        return Ok(());
    }
    let schemas = schema::Schemas::builtin();
    let Some(root) = schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) else {
        return Ok(());
    };
    let unknown = schemas.unknown_fields(schemas.field(root), obj);
    report_unknown(&unknown, validation, warnings)
}

/// The schema of a kind's objects (an empty schema for kinds without one).
pub(super) fn kind_schema(rt: &ResourceType) -> schema::FieldSchema<'_> {
    static EMPTY: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({}));
    let schemas = schema::Schemas::builtin();
    // A custom resource's: its CRD's schema, with ObjectMeta's for metadata.
    if let Some(s) = rt.custom.as_ref().and_then(|c| c.apply_schema.as_ref()) {
        return schemas.field(s);
    }
    match schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) {
        Some(root) => schemas.field(root),
        None => schemas.field(&EMPTY),
    }
}

pub(super) fn normalize(rt: &ResourceType, obj: Value) -> ApiResult<Value> {
    let mut obj = (rt.normalize.owned)(obj).map_err(|e| normalize_error(rt, e))?;
    // A patched custom object is pruned and defaulted as a decoded one is.
    if let Some(schema) = rt.custom.as_ref().and_then(|c| c.structural.as_deref()) {
        admission::apiextensions::decode_custom(schema, &mut obj);
    }
    Ok(obj)
}

pub(super) fn normalize_error(rt: &ResourceType, e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("error decoding {} {}: {e}", rt.kind(), rt.desc.api_version()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Decoding skips the unknown-field walk when the typed round trip changes nothing; that
    /// holds only if every unknown field makes it change something. Checked for every kind,
    /// at the top level and nested in metadata, in every validation mode; and a plain pod
    /// takes the fast path.
    #[test]
    fn unknown_fields_are_found_whether_or_not_the_walk_is_skipped() {
        use super::{BodyType, FieldValidation, decode_for};
        use crate::registry::Registry;

        let registry = Registry::new();
        // Read-only resources (componentstatuses, metrics) never decode a body.
        for rt in registry.all().iter().filter(|rt| rt.desc.verbs.contains(&"create")) {
            let clean = json!({"apiVersion": rt.desc.api_version(), "kind": rt.kind(),
                "metadata": {"name": "x", "labels": {"a": "b"}}});
            let mut top = clean.clone();
            top["bogusTop"] = json!(1);
            let mut nested = clean.clone();
            nested["metadata"]["bogusMeta"] = json!({"deep": true});
            for (obj, field) in [(top, "bogusTop"), (nested, "metadata.bogusMeta")] {
                let body = serde_json::to_vec(&obj).unwrap();
                let mut warnings = Vec::new();
                let strict =
                    decode_for(rt, BodyType::Json, &body, FieldValidation::Strict, &mut warnings);
                let err = strict.expect_err(&format!("{}: {field} passed Strict", rt.kind()));
                assert!(format!("{err:?}").contains(field), "{}: {err:?}", rt.kind());
                let warned =
                    decode_for(rt, BodyType::Json, &body, FieldValidation::Warn, &mut warnings)
                        .unwrap();
                assert!(warnings.iter().any(|w| w.contains(field)), "{}: {warnings:?}", rt.kind());
                let pruned = warned.get("bogusTop").is_none()
                    && warned["metadata"].get("bogusMeta").is_none();
                assert!(pruned, "{}: {field} not pruned", rt.kind());
            }
        }
        let pods = registry.find("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "labels": {"app": "bench"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let normalized = (pods.normalize.borrowed)(&pod).unwrap();
        assert_eq!(normalized, pod, "a plain pod round-trips unchanged (no walk needed)");
    }
}
