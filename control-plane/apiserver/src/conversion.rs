//! Conversion of custom objects between their CRD's versions, as upstream's
//! apiextensions-apiserver converts them: objects are stored at the storage version and
//! served at the request's. Strategy `None` only rewrites `apiVersion`
//! ([`crate::custom::to_storage_version`]); strategy `Webhook` sends the objects that are
//! not at the wanted version in one `ConversionReview` over HTTPS (trusting the CRD's
//! caBundle, through the admission webhooks' client) and checks what comes back: one
//! object per object sent, each at the wanted apiVersion and of the same kind, with
//! name, namespace and uid unchanged; of the metadata only labels and annotations are
//! taken from the webhook (upstream's `restoreObjectMeta`).
//!
//! A failed conversion fails the request with 500 `conversion webhook for <gvk> failed:
//! <reason>`, as upstream.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::custom::ConversionWebhook;
use crate::registry::ResourceType;
use crate::state::State;
use crate::status::{ApiError, ApiResult};

/// Upstream's conversion webhook timeout.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `objs` at `version` of `rt`'s group: apiVersion rewritten (strategy `None`), or
/// converted by the CRD's webhook in one review (only the objects not at `version`).
pub async fn to_version(
    state: &State,
    rt: &ResourceType,
    objs: &mut [Value],
    version: &str,
) -> ApiResult<()> {
    let Some(info) = &rt.custom else { return Ok(()) };
    let desired = format!("{}/{version}", rt.desc.group);
    let stale: Vec<usize> = (0..objs.len())
        .filter(|&i| objs[i].get("apiVersion").and_then(Value::as_str) != Some(&desired))
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    let Some(webhook) = &info.webhook else {
        for &i in &stale {
            if let Some(m) = objs[i].as_object_mut() {
                m.insert("apiVersion".into(), desired.clone().into());
            }
        }
        return Ok(());
    };
    let sent: Vec<Value> = stale.iter().map(|&i| objs[i].clone()).collect();
    let failed = |reason: String| {
        ApiError::internal(format!(
            "conversion webhook for {desired}, Kind={} failed: {reason}",
            rt.desc.kind
        ))
    };
    let converted = review(state, webhook, &desired, &sent).await.map_err(failed)?;
    for (&i, (mut new, old)) in stale.iter().zip(converted.into_iter().zip(&sent)) {
        check_converted(&new, old, &desired)
            .map_err(|e| failed(format!("invalid converted object at index {i}: {e}")))?;
        restore_meta(&mut new, old);
        objs[i] = new;
    }
    Ok(())
}

/// One ConversionReview: the converted objects, in order, or why there are none.
async fn review(
    state: &State,
    webhook: &ConversionWebhook,
    desired: &str,
    objects: &[Value],
) -> Result<Vec<Value>, String> {
    let uid = uuid::Uuid::new_v4().to_string();
    let body = json!({
        "apiVersion": format!("apiextensions.k8s.io/{}", webhook.review_version),
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
    });
    let body = Bytes::from(serde_json::to_vec(&body).map_err(|e| e.to_string())?);
    let answer = tokio::time::timeout(
        TIMEOUT,
        crate::admission::webhook::post(state, &webhook.client, body),
    )
    .await
    .map_err(|_| format!("context deadline exceeded (timeout {}s)", TIMEOUT.as_secs()))?
    .map_err(|e| crate::admission::webhook::chain(&e))?;
    let review: Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("the response is not a ConversionReview: {e}"))?;
    let response = review.get("response").ok_or("no response provided")?;
    let got = response["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(format!("expected response.uid=\"{uid}\", got \"{got}\""));
    }
    let result = &response["result"];
    if result["status"] != "Success" {
        let message = result["message"].as_str().unwrap_or_default();
        return Err(if message.is_empty() {
            "the webhook answered Failure".into()
        } else {
            message.into()
        });
    }
    let converted = response["convertedObjects"].as_array().cloned().unwrap_or_default();
    if converted.len() != objects.len() {
        return Err(format!("returned {} objects, expected {}", converted.len(), objects.len()));
    }
    Ok(converted)
}

/// Upstream's checks of one converted object against the one sent.
fn check_converted(new: &Value, old: &Value, desired: &str) -> Result<(), String> {
    let api_version = new["apiVersion"].as_str().unwrap_or_default();
    if api_version != desired {
        return Err(format!("invalid apiVersion \"{api_version}\", expected \"{desired}\""));
    }
    if new["kind"] != old["kind"] {
        return Err(format!("invalid kind {}, expected {}", new["kind"], old["kind"]));
    }
    if !new["metadata"].is_object() {
        return Err("metadata must be an object".into());
    }
    for field in ["name", "namespace", "uid"] {
        if new["metadata"].get(field).unwrap_or(&Value::Null)
            != old["metadata"].get(field).unwrap_or(&Value::Null)
        {
            return Err(format!("must not change metadata.{field}"));
        }
    }
    Ok(())
}

/// The sent object's metadata, with the webhook's labels and annotations.
fn restore_meta(new: &mut Value, old: &Value) {
    let mut meta = old["metadata"].clone();
    if let (Some(m), Some(converted)) = (meta.as_object_mut(), new["metadata"].as_object()) {
        for field in ["labels", "annotations"] {
            match converted.get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
    }
    new["metadata"] = meta;
}

/// An object as it is stored: at the storage version.
pub async fn for_storage(state: &State, rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    let Some(info) = &rt.custom else { return Ok(()) };
    to_version(state, rt, std::slice::from_mut(obj), &info.storage_version).await
}

/// A stored object as the request's version serves it: converted, then defaulted with
/// that version's schema (upstream defaults on reads from storage too).
pub async fn for_request(state: &State, rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    if rt.custom.is_none() {
        return Ok(());
    }
    to_version(state, rt, std::slice::from_mut(obj), rt.desc.version).await?;
    crate::custom::apply_read_defaults(rt, obj);
    Ok(())
}

/// [`for_request`] of stored JSON, several objects in one review: `None` for the ones
/// that serve as they are (a built-in kind, or the request's version of a schema
/// without defaults).
pub async fn jsons_for_request(
    state: &State,
    rt: &ResourceType,
    jsons: &[&[u8]],
) -> ApiResult<Vec<Option<Bytes>>> {
    let mut out: Vec<Option<Bytes>> = vec![None; jsons.len()];
    let Some(info) = &rt.custom else { return Ok(out) };
    let todo: Vec<usize> = (0..jsons.len())
        .filter(|&i| info.has_defaults || !crate::custom::at_version(rt, jsons[i]))
        .collect();
    if todo.is_empty() {
        return Ok(out);
    }
    let mut objs: Vec<Value> =
        todo.iter().map(|&i| serde_json::from_slice(jsons[i]).unwrap_or(Value::Null)).collect();
    to_version(state, rt, &mut objs, rt.desc.version).await?;
    for (&i, mut obj) in todo.iter().zip(objs) {
        crate::custom::apply_read_defaults(rt, &mut obj);
        out[i] = serde_json::to_vec(&obj).ok().map(Bytes::from);
    }
    Ok(out)
}

/// [`jsons_for_request`] of one object.
pub async fn json_for_request(
    state: &State,
    rt: &ResourceType,
    json: &[u8],
) -> ApiResult<Option<Bytes>> {
    Ok(jsons_for_request(state, rt, &[json]).await?.pop().flatten())
}
