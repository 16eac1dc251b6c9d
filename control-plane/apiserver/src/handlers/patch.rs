//! Patch: JSON, merge, strategic-merge and server-side apply, each a transform of the current
//! object for the update path (an apply to a missing object creates it).

use http::StatusCode;
use serde_json::{Value, json};

use super::create::create_object;
use super::decode::{
    check_apply_config, check_type_meta, kind_schema, manager, normalize, validate_fields,
    validate_patch_options,
};
use super::update::{Writer, guaranteed_write};
use super::verb::Target;
use super::verb::{Answer, Written, check_name, meta_mut, meta_str};
use crate::negotiate::{self, BodyType};
use crate::registry::ResourceType;
use crate::request::Input;
use crate::status::{ApiError, ApiResult, Cause};
use skiff_core::json::ValueAt;
use skiff_machinery::{apply, jsonpatch, strategic};

pub(super) async fn patch(
    t: Target<'_>,
    name: &str,
    sub: Option<&str>,
    input: Input<'_>,
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    let Input { query, headers, body } = input;
    let Target { server, rt, ns } = t;
    if body.len() > negotiate::MAX_BODY {
        return Err(ApiError::too_large(negotiate::MAX_BODY));
    }
    let body_type = negotiate::patch_type(headers)?;
    // Custom resources have no patch strategies to merge by (upstream answers 415 too).
    if rt.custom.is_some() && body_type == negotiate::BodyType::StrategicMergePatch {
        return Err(ApiError::unsupported_media_type(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ]));
    }
    validate_patch_options(query, body_type)?;
    let validation = query.field_validation()?;
    let dry_run = query.dry_run()?;
    let warnings = Vec::new();

    if body_type == BodyType::ApplyPatch {
        let manager = query.get("fieldManager").unwrap_or_default();
        let force = query.flag("force");
        let mut applied = negotiate::decode_object(BodyType::ApplyPatch, body)?;
        check_apply_config(rt, &applied)?;
        check_type_meta(rt, &mut applied)?;
        check_name(&applied, name, ns)?;
        if applied.at(&["metadata", "managedFields"]).is_some_and(|m| !m.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        let api_version = rt.desc.api_version();
        let ts = skiff_core::time::now_rfc3339();
        let apply_to = |live: Option<&Value>| -> ApiResult<Value> {
            let merged = apply::server_side_apply(
                live,
                &applied,
                manager,
                force,
                &api_version,
                kind_schema(rt),
                &ts,
            )
            .map_err(|e| apply_error(rt, name, e))?;
            normalize(rt, merged)
        };
        // Apply creates the object when it does not exist (its Apply entry is computed).
        if server.store.get(&rt.key(ns, name)).await?.is_none() {
            let mut obj = apply_to(None)?;
            if meta_str(&obj, "name").is_none() {
                meta_mut(&mut obj).insert("name".into(), json!(name));
            }
            let created = create_object(t, obj, manager, dry_run, false, answer).await?;
            return Ok((created, StatusCode::CREATED, warnings));
        }
        let precondition = meta_str(&applied, "resourceVersion").map(str::to_string);
        let written = guaranteed_write(
            t,
            name,
            Writer { manager, sub, track: false, admit: true, dry_run },
            precondition,
            |live| apply_to(Some(live)),
            answer,
        )
        .await;
        return written.map(|w| (w, StatusCode::OK, warnings));
    }

    let patch_value = match body_type {
        BodyType::JsonPatch | BodyType::MergePatch | BodyType::StrategicMergePatch => {
            negotiate::decode_json(body)?
        }
        _ => return Err(ApiError::unsupported_media_type(&negotiate::PATCH_MEDIA_TYPES)),
    };
    let manager = manager(query, headers, "PatchOptions")?;
    let precondition = match body_type {
        BodyType::JsonPatch => None,
        _ => patch_value
            .at(&["metadata", "resourceVersion"])
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    // The unknown fields of the attempt that was written (a retry patches anew).
    let unknown = std::sync::Mutex::new(Vec::new());
    let written = guaranteed_write(
        t,
        name,
        Writer { manager: &manager, sub, track: true, admit: true, dry_run },
        precondition,
        |current| {
            let patched = apply_patch_body(rt, body_type, &patch_value, current)?;
            let mut w = Vec::new();
            validate_fields(rt, &patched, validation, &mut w)?;
            *unknown.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = w;
            let mut obj = normalize(rt, patched)?;
            check_type_meta(rt, &mut obj)?;
            check_name(&obj, name, ns)?;
            Ok(obj)
        },
        answer,
    )
    .await?;
    let warnings = unknown.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok((written, StatusCode::OK, warnings))
}

pub(super) fn apply_patch_body(
    rt: &ResourceType,
    body_type: BodyType,
    patch: &Value,
    current: &Value,
) -> ApiResult<Value> {
    let mut doc = current.clone();
    match body_type {
        BodyType::JsonPatch => {
            let ops = jsonpatch::decode(patch).map_err(json_patch_error)?;
            jsonpatch::apply(&mut doc, &ops).map_err(json_patch_error)?;
            Ok(doc)
        }
        BodyType::MergePatch => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        BodyType::StrategicMergePatch => strategic::apply_patch(current, patch, kind_schema(rt))
            .map_err(|e| {
                let message =
                    format!("the server rejected our request due to an error in our request: {e}");
                if e.is_bad_request() {
                    ApiError::bad_request(message)
                } else {
                    ApiError::invalid(message, vec![])
                }
            }),
        _ => Err(ApiError::unsupported_media_type(&negotiate::PATCH_MEDIA_TYPES)),
    }
}

/// Upstream's answers to a JSON patch: 413 for too many operations, 400 for one that is
/// not a patch, 422 for one that does not apply or copies too much.
pub(super) fn json_patch_error(e: jsonpatch::Error) -> ApiError {
    let message = format!("the server rejected our request due to an error in our request: {e}");
    match e {
        jsonpatch::Error::TooManyOperations(_) => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", e.to_string())
        }
        jsonpatch::Error::Decode(_) => ApiError::bad_request(message),
        jsonpatch::Error::CopyTooLarge { .. } | jsonpatch::Error::Apply(_) => {
            ApiError::invalid(message, vec![])
        }
    }
}

pub(super) fn apply_error(rt: &ResourceType, name: &str, e: apply::ApplyError) -> ApiError {
    let code = StatusCode::from_u16(e.status_code()).unwrap_or(StatusCode::CONFLICT);
    let mut err = match code {
        StatusCode::CONFLICT => ApiError::new(code, "Conflict", e.to_string()),
        StatusCode::BAD_REQUEST => ApiError::bad_request(e.to_string()),
        _ => ApiError::invalid(e.to_string(), vec![]),
    }
    .with_details(rt.group(), rt.plural(), name);
    if let apply::ApplyError::Conflicts(conflicts) = &e {
        err.causes = conflicts
            .iter()
            .map(|c| Cause {
                reason: "FieldManagerConflict".into(),
                message: c.cause_message(),
                field: c.field_path.clone(),
            })
            .collect();
    }
    err
}

// delete
