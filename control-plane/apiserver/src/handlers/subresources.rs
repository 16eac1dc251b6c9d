//! The scale and binding subresources.

use bytes::Bytes;
use serde_json::{Value, json};

use super::admit as plugins;
use super::decode::{manager, validate_patch_options};
use super::patch::json_patch_error;
use super::update::{Writer, guaranteed_update};
use super::verb::Target;
use super::verb::{meta_str, store_error};
use crate::negotiate::{self, BodyType};
use crate::request::Input;
use crate::request::Verb;
use crate::status::{ApiError, ApiResult, Cause};
use skiff_core::json::ValueAt;
use skiff_machinery::jsonpatch;
use skiff_store::{self as store, StoreExt};

/// autoscaling/v1 Scale of a workload.
/// A custom resource's scale paths (`subresources.scale` of its CRD version): spec and
/// status replicas, and the label selector (a string), each a `.`-separated path.
struct ScalePaths {
    spec: Vec<String>,
    status: Vec<String>,
    selector: Option<Vec<String>>,
}

fn scale_paths(rt: &crate::registry::ResourceType) -> Option<ScalePaths> {
    let scale = rt.custom.as_ref()?.scale.as_ref()?;
    let split = |k: &str| {
        scale[k]
            .as_str()
            .map(|p| p.trim_start_matches('.').split('.').map(str::to_string).collect::<Vec<_>>())
    };
    Some(ScalePaths {
        spec: split("specReplicasPath")?,
        status: split("statusReplicasPath")?,
        selector: split("labelSelectorPath"),
    })
}

fn at_path<'v>(obj: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(obj, |v, p| v.get(p))
}

/// The Scale of `obj`: a built-in kind's `spec.replicas`, or a custom resource's at the
/// paths its CRD names (upstream: replicas 0 where a path finds nothing).
pub(super) fn scale_of(rt: &crate::registry::ResourceType, obj: &Value) -> Value {
    let Some(paths) = scale_paths(rt) else { return to_scale(obj) };
    let selector = paths
        .selector
        .as_ref()
        .and_then(|p| at_path(obj, p))
        .and_then(Value::as_str)
        .unwrap_or_default();
    scale_json(
        obj,
        json!(at_path(obj, &paths.spec).and_then(Value::as_i64).unwrap_or(0)),
        json!(at_path(obj, &paths.status).and_then(Value::as_i64).unwrap_or(0)),
        selector,
    )
}

/// An autoscaling/v1 Scale of `obj` with these replicas and selector.
fn scale_json(obj: &Value, spec_replicas: Value, status_replicas: Value, selector: &str) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": {"replicas": spec_replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    })
}

/// `obj` with `replicas` where its Scale's spec reads them.
fn set_replicas(rt: &crate::registry::ResourceType, obj: &mut Value, replicas: i64) {
    let path = match scale_paths(rt) {
        Some(p) => p.spec,
        None => vec!["spec".to_string(), "replicas".to_string()],
    };
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = obj;
    for p in parents {
        if !cur.get(p).is_some_and(Value::is_object) {
            cur[p.as_str()] = json!({});
        }
        cur = &mut cur[p.as_str()];
    }
    cur[last.as_str()] = json!(replicas);
}

pub(super) fn to_scale(obj: &Value) -> Value {
    // A ReplicationController's selector is a plain label map; the apps kinds' a
    // LabelSelector (matchLabels).
    let labels = match obj.get("kind").and_then(Value::as_str) {
        Some("ReplicationController") => obj.at(&["spec", "selector"]),
        _ => obj.at(&["spec", "selector", "matchLabels"]),
    };
    let selector = labels
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    scale_json(
        obj,
        obj.at(&["spec", "replicas"]).cloned().unwrap_or(json!(1)),
        obj.at(&["status", "replicas"]).cloned().unwrap_or(json!(0)),
        &selector,
    )
}

pub(super) async fn scale(
    t: Target<'_>,
    name: &str,
    verb: Verb,
    input: Input<'_>,
) -> ApiResult<Value> {
    let Input { query, headers, body } = input;
    let body_type = match verb {
        Verb::Update => negotiate::body_type(headers)?,
        _ => negotiate::patch_type(headers)?,
    };
    let manager = match verb {
        Verb::Update => manager(query, headers, "UpdateOptions")?,
        _ => {
            validate_patch_options(query, body_type)?;
            manager(query, headers, "PatchOptions")?
        }
    };
    let dry_run = query.dry_run()?;
    let (scale_body, precondition) = match verb {
        Verb::Update => {
            let v = negotiate::decode_object(body_type, body)?;
            let rv =
                v.at(&["metadata", "resourceVersion"]).and_then(Value::as_str).map(str::to_string);
            (Some(v), rv)
        }
        _ => (None, None),
    };
    let patch_value = match verb {
        Verb::Patch => Some(negotiate::decode_json(body)?),
        _ => None,
    };
    let obj = guaranteed_update(t, name, Writer { manager: &manager, sub: None, track: true, admit: true, dry_run }, precondition.filter(|s| !s.is_empty()), |current| {
        let current_scale = scale_of(t.rt, current);
        let new_scale = match (&scale_body, &patch_value) {
            (Some(b), _) => b.clone(),
            (None, Some(p)) => {
                let mut doc = current_scale.clone();
                match body_type {
                    BodyType::JsonPatch => {
                        let ops = jsonpatch::decode(p).map_err(json_patch_error)?;
                        jsonpatch::apply(&mut doc, &ops).map_err(json_patch_error)?;
                    }
                    _ => json_patch::merge(&mut doc, p),
                }
                doc
            }
            (None, None) => current_scale,
        };
        let replicas = new_scale.at(&["spec", "replicas"]).and_then(Value::as_i64).unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"),
                vec![Cause { reason: "FieldValueInvalid".into(), message: "must be greater than or equal to 0".into(), field: "spec.replicas".into() }],
            ));
        }
        let mut out = current.clone();
        set_replicas(t.rt, &mut out, replicas);
        Ok(out)
    })
    .await?;
    Ok(scale_of(t.rt, &obj))
}

/// pods/binding: assign a pod to a node once.
pub(super) async fn bind(t: Target<'_>, name: &str, input: Input<'_>) -> ApiResult<Value> {
    let Input { query, headers, body } = input;
    let Target { server, rt, ns } = t;
    let binding = negotiate::decode_object(negotiate::body_type(headers)?, body)?;
    let node =
        binding.at(&["target", "name"]).and_then(Value::as_str).unwrap_or_default().to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            format!("Binding \"{name}\" is invalid: target.name: Required value"),
            vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "target.name".into(),
            }],
        ));
    }
    let manager = manager(query, headers, "CreateOptions")?;
    let dry_run = query.dry_run()?;
    plugins::admit_subresource_create(t, name, "binding", &binding, dry_run).await?;
    let success = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    // The common case without decoding the pod: the cached copy, if it can be bound, edited
    // as JSON and compare-and-swapped on its revision. Anything else (no copy, a stale one,
    // a pod that is terminating or bound already, a dry run) takes the general path below,
    // which decides on the store's current object.
    let key = rt.key(ns, name);
    if !dry_run
        && let Some(cached) = server.cache.resource(rt).get(&key)
        && let Some(bound) = bound_json(&cached.json, &node, &skiff_core::time::now_rfc3339())
    {
        match server.store.update(&key, Bytes::from(bound), cached.rv).await {
            Ok(_) => return Ok(success),
            Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_error(rt, name, e)),
        }
    }
    // Upstream assigns the pod straight in storage (`assignPod`), past the field manager: a
    // binding leaves managedFields as they were (no scheduler entry), and skips their diff.
    // Admitted above as a subresource create of its Binding body.
    let w = Writer { manager: &manager, sub: Some("binding"), track: false, admit: false, dry_run };
    guaranteed_update(t, name, w, None, move |current| {
        if meta_str(current, "deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(existing) =
            current.at(&["spec", "nodeName"]).and_then(Value::as_str).filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "pods/binding",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut out = current.clone();
        out["spec"]["nodeName"] = json!(node);
        let status = std::mem::take(&mut out["status"]);
        out["status"] = scheduled_status(status, &skiff_core::time::now_rfc3339());
        Ok(out)
    })
    .await?;
    Ok(success)
}

/// `status` with its PodScheduled condition replaced by a True one (what a binding writes).
pub(super) fn scheduled_status(mut status: Value, now: &str) -> Value {
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let mut conditions: Vec<Value> =
        conditions.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
    conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                           "lastTransitionTime": now}));
    status["conditions"] = Value::Array(conditions);
    status
}

/// The stored form of a pod (`cached`: its JSON as the watch cache holds it) bound to
/// `node`, edited member by member: only `status` is decoded, the other members are copied
/// as they are. The bytes are those the general path would store (members in key order,
/// no resourceVersion). `None` when the pod cannot be bound (terminating, assigned
/// already) or the JSON is not the object expected; the caller then decides on a store
/// read.
pub(super) fn bound_json(cached: &[u8], node: &str, now: &str) -> Option<Vec<u8>> {
    use serde_json::value::{RawValue, to_raw_value};
    use std::collections::BTreeMap;
    type Members<'a> = BTreeMap<String, &'a RawValue>;

    let mut top: Members = serde_json::from_slice(cached).ok()?;
    let mut meta: Members = serde_json::from_str(top.get("metadata")?.get()).ok()?;
    if meta.contains_key("deletionTimestamp") {
        return None;
    }
    meta.remove("resourceVersion");
    meta.remove("selfLink");
    let mut spec: Members = serde_json::from_str(top.get("spec")?.get()).ok()?;
    if spec.get("nodeName").is_some_and(|n| !matches!(n.get(), "\"\"" | "null")) {
        return None;
    }
    let status: Value = match top.get("status") {
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
        None => Value::Null,
    };
    let node = to_raw_value(node).ok()?;
    spec.insert("nodeName".into(), &node);
    let (meta, spec) = (to_raw_value(&meta).ok()?, to_raw_value(&spec).ok()?);
    let status = to_raw_value(&scheduled_status(status, now)).ok()?;
    top.insert("metadata".into(), &meta);
    top.insert("spec".into(), &spec);
    top.insert("status".into(), &status);
    serde_json::to_vec(&top).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// The binding fast path stores exactly what the general path (decode, transform,
    /// encode) would, and declines every pod the general path would refuse.
    #[test]
    fn bound_json_is_the_general_paths_binding() {
        use super::super::verb::encode;
        use super::{bound_json, scheduled_status};
        use crate::cache::with_resource_version;

        let stored = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "\u{e9}\"x"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
                "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {}}}}]},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}],
                "nodeName": "", "priority": 0, "terminationGracePeriodSeconds": 30},
            "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                {"type": "Other", "status": "True"}]}});
        let now = "2026-11-22T12:00:00Z";
        let general = |obj: &serde_json::Value| {
            let mut out = obj.clone();
            out["spec"]["nodeName"] = json!("n1");
            let status = std::mem::take(&mut out["status"]);
            out["status"] = scheduled_status(status, now);
            encode(&out).to_vec()
        };
        for obj in [stored.clone(), {
            let mut o = stored.clone();
            o.as_object_mut().unwrap().remove("status");
            o["spec"].as_object_mut().unwrap().remove("nodeName");
            o
        }] {
            let cached = with_resource_version(&serde_json::to_vec(&obj).unwrap(), 42).unwrap();
            let fast = bound_json(&cached, "n1", now).expect("bindable");
            assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(general(&obj)).unwrap());
        }
        let mut bound = stored.clone();
        bound["spec"]["nodeName"] = json!("n2");
        let mut terminating = stored.clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
        for refused in [bound, terminating] {
            assert_eq!(bound_json(&serde_json::to_vec(&refused).unwrap(), "n1", now), None);
        }
        assert_eq!(bound_json(b"[1]", "n1", now), None);
    }
}
