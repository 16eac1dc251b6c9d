//! Create (POST): decode, default, admit, name, validate, charge quota, allocate a
//! Service's IPs and ports, store.

use http::StatusCode;
use serde_json::{Value, json};

use super::admit as plugins;
use super::decode::{decode_for, kind_schema, manager};
use super::verb::Target;
use super::verb::{
    Answer, Written, encode, ensure_namespace, gvk, invalid, meta_mut, meta_str, store_error,
    written,
};
use crate::negotiate::{self};
use crate::request::Input;
use crate::status::{ApiError, ApiResult, Cause};
use skiff_machinery::admission::{self, Operation};
use skiff_machinery::apply;
use skiff_store::{self as store, StoreExt};

pub async fn create(
    t: Target<'_>,
    input: Input<'_>,
) -> ApiResult<(Value, StatusCode, Vec<String>)> {
    let (created, code, warnings) = create_rendered(t, input, Answer::Object).await?;
    Ok((created.object(), code, warnings))
}

pub(super) async fn create_rendered(
    t: Target<'_>,
    input: Input<'_>,
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    let Input { query, headers, body } = input;
    let Target { rt, .. } = t;
    if rt.custom.as_ref().is_some_and(|c| c.terminating) {
        // Upstream's NewMethodNotSupported with its message replaced.
        let mut e =
            ApiError::method_not_allowed("create").with_details(rt.desc.group, rt.desc.plural, "");
        e.message = "create not allowed while custom resource definition is terminating".into();
        return Err(e);
    }
    let mut warnings = Vec::new();
    let body_type = negotiate::body_type(headers)?;
    let obj = decode_for(rt, body_type, body, query.field_validation()?, &mut warnings)?;
    let manager = manager(query, headers, "CreateOptions")?;
    let dry_run = query.dry_run()?;
    let created = create_object(t, obj, &manager, dry_run, true, answer).await?;
    Ok((created, StatusCode::CREATED, warnings))
}

/// The create path after decoding, shared by POST and apply-creates (which computed their
/// managed fields already: `track` false).
pub(super) async fn create_object(
    t: Target<'_>,
    mut obj: Value,
    manager: &str,
    dry_run: bool,
    track: bool,
    answer: Answer,
) -> ApiResult<Written> {
    let Target { server, rt, ns } = t;
    ensure_namespace(ns, &mut obj)?;
    let g = gvk(rt);
    // Upstream's order: decode+default, the field manager, mutating admission, then system
    // metadata, then the strategy, then validate, then validating admission.
    admission::default_object(g, &mut obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let ts = skiff_core::time::now_rfc3339();
    // The field manager sees the request as decoded and defaulted: the fields admission and
    // the strategy set are nobody's.
    if track {
        meta_mut(&mut obj).remove("managedFields");
        apply::track_update(
            None,
            &mut obj,
            manager,
            None,
            &rt.desc.api_version(),
            kind_schema(rt),
            &ts,
        );
    }
    let mut obj = plugins::admit_create(t, obj, dry_run).await?;
    let generate = meta_str(&obj, "name")
        .is_none()
        .then(|| meta_str(&obj, "generateName").map(str::to_string))
        .flatten();
    {
        let meta = meta_mut(&mut obj);
        if meta.get("resourceVersion").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(ts));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        if rt.tracks_generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
    }

    for attempt in 0..3 {
        // Only a generated name is ever retried: otherwise the object is used up once.
        let mut candidate = if generate.is_some() { obj.clone() } else { std::mem::take(&mut obj) };
        if let Some(prefix) = &generate {
            meta_mut(&mut candidate)
                .insert("name".into(), json!(format!("{prefix}{}", generate_suffix())));
        }
        let name = meta_str(&candidate, "name").unwrap_or_default().to_string();
        admission::prepare_for_create(g, &mut candidate);
        admission::drop_omitted_empties(g, &mut candidate);
        // A custom resource with a status subresource starts without one (upstream's
        // custom resource strategy).
        if rt.custom.is_some()
            && rt.has_status
            && let Some(m) = candidate.as_object_mut()
        {
            m.remove("status");
        }
        // Validation reads no managed fields: its typed view is built without them (their
        // fieldsV1 trees would be copied into it for nothing).
        let managed = meta_mut(&mut candidate).remove("managedFields");
        let mut errs = admission::validate(g, Operation::Create, None, &candidate, None);
        if let Some(info) = &rt.custom {
            errs.extend(admission::apiextensions::validate_custom_meta(
                rt.desc.namespaced,
                &candidate,
                None,
            ));
            if let Some(schema) = &info.structural {
                errs.extend(admission::apiextensions::validate_custom(schema, &candidate, None));
            }
        }
        if let Some(managed) = managed {
            meta_mut(&mut candidate).insert("managedFields".into(), managed);
        }
        if !errs.is_empty() {
            return Err(invalid(rt, &name, errs));
        }
        if name.is_empty() {
            return Err(ApiError::invalid(
                format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    rt.kind()
                ),
                vec![Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value: name or generateName is required".into(),
                    field: "metadata.name".into(),
                }],
            ));
        }
        plugins::validate_create(t, &mut candidate, dry_run).await?;
        // Charged once: a retry under another generated name is the same object.
        if attempt == 0 {
            super::update::charge(t, &candidate, dry_run).await?;
        }
        let reservation = if rt.kind() == "Service" && rt.group().is_empty() {
            Some(server.alloc.allocate(&mut candidate)?)
        } else {
            None
        };
        if dry_run {
            if let Some(r) = &reservation {
                server.alloc.release(r);
            }
            return Ok(Written::Object(candidate));
        }
        crate::conversion::for_storage(&server.state, rt, &mut candidate).await?;
        let stored = encode(&candidate);
        let key = rt.key(ns, &name);
        let cache = server.cache.resource(rt);
        cache.expect(rt, &key, &stored, &candidate);
        let kept = (answer == Answer::Object).then_some(candidate);
        let result = server.store.create(&key, stored.clone()).await;
        if result.is_err() {
            cache.unexpect(&stored);
        }
        match result {
            Ok(kv) => return written(kept, &stored, kv.mod_revision),
            Err(e) => {
                if let Some(r) = &reservation {
                    server.alloc.release(r);
                }
                if matches!(e, store::Error::AlreadyExists { .. })
                    && generate.is_some()
                    && attempt < 2
                {
                    continue;
                }
                return Err(store_error(rt, &name, e));
            }
        }
    }
    Err(ApiError::internal("could not generate a unique name"))
}

pub(super) fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let u = uuid::Uuid::new_v4();
    u.as_bytes().iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}
