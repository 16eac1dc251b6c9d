//! Delete and deletecollection: preconditions, grace periods, finalizers and propagation.

use std::sync::Arc;

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::admit as plugins;
use super::read::get_object;
use super::update::same_object;
use super::verb::Target;
use super::verb::{
    CACHE_WAIT, MAX_RETRIES, encode, meta_mut, meta_str, release_on_delete, store_error,
};
use crate::cache::{CachedObject, set_resource_version};
use crate::list_options::Filter;
use crate::negotiate::{self};
use crate::render::json_response;
use crate::request::Input;
use crate::request::Query;
use crate::status::{ApiError, ApiResult, success_status};
use skiff_core::json::ValueAt;
use skiff_machinery::admission::{self};
use skiff_store::{self as store, StoreExt};

/// Namespaces that may not be deleted (upstream's NamespaceLifecycle admission).
pub(super) const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Delete one object with `options` (DeleteOptions). `admit`: run the DELETE admission
/// (false for an eviction, admitted as a `pods/eviction` create instead).
pub(super) async fn delete(
    t: Target<'_>,
    name: &str,
    query: &Query,
    options: &Value,
    admit: bool,
) -> ApiResult<(Value, StatusCode)> {
    let Target { server, rt, ns } = t;
    let dry_run = query.dry_run()?
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    // Upstream: a negative grace period is taken as 1 s on the delete path.
    let grace_override = match query.int("gracePeriodSeconds")? {
        Some(g) => Some(g),
        None => grace_in_options(options)?,
    }
    .map(|g| if g < 0 { 1 } else { g });
    let propagation = query
        .get("propagationPolicy")
        .map(str::to_string)
        .or_else(|| options.get("propagationPolicy").and_then(Value::as_str).map(str::to_string))
        .or_else(|| match options.get("orphanDependents").and_then(Value::as_bool) {
            Some(true) => Some("Orphan".into()),
            _ => None,
        });
    if let Some(p) = &propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(ApiError::invalid(
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
            ),
            vec![],
        ));
    }
    if rt.kind() == "Namespace" && rt.group().is_empty() && IMMORTAL_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        ))
        .with_details(rt.group(), rt.plural(), name));
    }
    if rt.kind() == "PriorityClass"
        && admission::SYSTEM_PRIORITY_CLASSES.iter().any(|(system, _, _)| *system == name)
    {
        return Err(ApiError::forbidden(format!(
            "priorityclasses.scheduling.k8s.io \"{name}\" is forbidden: this is a system priority class and cannot be deleted"
        ))
        .with_details(rt.group(), rt.plural(), name));
    }
    let is_pod = rt.kind() == "Pod" && rt.group().is_empty();
    let is_namespace = rt.kind() == "Namespace" && rt.group().is_empty();
    let key = rt.key(ns, name);
    let mut admitted = !admit;
    for _ in 0..MAX_RETRIES {
        let (current, rev) = get_object(t, name).await?;
        if !admitted {
            plugins::admit_delete(t, name, &current, dry_run).await?;
            admitted = true;
        }
        if let Some(pre) = options.get("preconditions") {
            let uid = meta_str(&current, "uid").unwrap_or_default();
            if let Some(want) = pre.get("uid").and_then(Value::as_str)
                && want != uid
            {
                return Err(ApiError::conflict(
                    &rt.qualified(),
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                    ),
                ));
            }
            if let Some(want) = pre.get("resourceVersion").and_then(Value::as_str)
                && want != rev.to_string()
            {
                return Err(ApiError::conflict(
                    &rt.qualified(),
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rev}"
                    ),
                ));
            }
        }
        let mut finalizers: Vec<Value> = current
            .at(&["metadata", "finalizers"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let add_finalizer = match propagation.as_deref() {
            Some("Orphan") => Some("orphan"),
            Some("Foreground") => Some("foregroundDeletion"),
            _ => None,
        };
        if let Some(f) = add_finalizer
            && !finalizers.iter().any(|x| x == f)
        {
            finalizers.push(json!(f));
        }
        let grace = if is_pod {
            let scheduled = meta_str(&current, "deletionTimestamp").is_some()
                || current
                    .at(&["spec", "nodeName"])
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty());
            let finished = matches!(
                current.at(&["status", "phase"]).and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            if !scheduled || finished {
                0
            } else {
                grace_override
                    .or_else(|| {
                        current
                            .at(&["spec", "terminationGracePeriodSeconds"])
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    .max(0)
            }
        } else {
            0
        };
        let namespace_finalizers = is_namespace
            && current
                .at(&["spec", "finalizers"])
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
        if grace > 0 || !finalizers.is_empty() || namespace_finalizers {
            // Graceful: mark the object; its finalizers / the agent finish the deletion.
            let mut marked = current.clone();
            let already = meta_str(&current, "deletionTimestamp").is_some();
            {
                let meta = meta_mut(&mut marked);
                if !already
                    || (is_pod
                        && grace
                            < meta
                                .get("deletionGracePeriodSeconds")
                                .and_then(Value::as_i64)
                                .unwrap_or(i64::MAX))
                {
                    let when = skiff_core::time::api_add_secs(jiff::Timestamp::now(), grace);
                    meta.insert(
                        "deletionTimestamp".into(),
                        json!(skiff_core::time::rfc3339_seconds(when)),
                    );
                    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                if !finalizers.is_empty() {
                    meta.insert("finalizers".into(), Value::Array(finalizers));
                }
                meta.remove("resourceVersion");
            }
            if is_namespace {
                marked["status"] = json!({"phase": "Terminating"});
            }
            if !is_pod && grace == 0 {
                meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if same_object(&marked, &current) || dry_run {
                return Ok((current, StatusCode::OK));
            }
            match server.store.update(&key, encode(&marked), rev).await {
                Ok(kv) => {
                    set_resource_version(&mut marked, kv.mod_revision);
                    return Ok((marked, StatusCode::OK));
                }
                Err(store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(store_error(rt, name, e)),
            }
        }
        if dry_run {
            return Ok((current, StatusCode::OK));
        }
        match server.store.delete(&key, Some(rev)).await {
            Ok(_) => {
                release_on_delete(server, rt, &current);
                let uid = meta_str(&current, "uid").unwrap_or_default();
                let out = if is_pod {
                    current.clone()
                } else {
                    success_status(rt.group(), rt.plural(), name, uid)
                };
                return Ok((out, StatusCode::OK));
            }
            Err(store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(store_error(rt, name, e)),
        }
    }
    Err(ApiError::conflict(&rt.qualified(), name, "too many concurrent writes; please retry"))
}

/// `gracePeriodSeconds` of a DeleteOptions body: an integer, or refused (a float or a
/// number past int64 is not silently dropped).
pub(super) fn grace_in_options(options: &Value) -> ApiResult<Option<i64>> {
    match options.get("gracePeriodSeconds") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "DeleteOptions.gracePeriodSeconds: invalid value {v}: must be a 64-bit integer"
            ))
        }),
    }
}

pub(super) async fn delete_collection(t: Target<'_>, input: Input<'_>) -> ApiResult<Response> {
    let Input { query, headers, body } = input;
    let Target { server, rt, ns } = t;
    let options = negotiate::decode_delete_options(headers, body)?;
    let filter = Filter::from_query(rt, ns, query)?;
    let current = server.store.current_revision().await?;
    server.cache.wait_for(current, CACHE_WAIT).await;
    let items: Vec<Arc<CachedObject>> = server
        .cache
        .resource(rt)
        .list(&filter.prefix(rt), None)
        .into_iter()
        .filter(|o| filter.matches(o))
        .collect();
    let mut deleted = Vec::new();
    for obj in &items {
        let obj_ns = (!obj.namespace.is_empty()).then_some(obj.namespace.as_str());
        match delete(Target { ns: obj_ns, ..t }, &obj.name, query, &options, true).await {
            Ok((v, _)) => {
                if v.get("kind").and_then(Value::as_str) == Some(rt.kind()) {
                    deleted.push(v);
                } else {
                    deleted.push(obj.value());
                }
            }
            Err(e) if e.reason == "NotFound" => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": rt.list_kind(),
        "apiVersion": rt.desc.api_version(),
        "metadata": {"resourceVersion": server.cache.revision().to_string()},
        "items": deleted,
    });
    Ok(json_response(StatusCode::OK, &list))
}

// subresources
