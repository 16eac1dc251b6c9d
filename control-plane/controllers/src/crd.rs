//! The CustomResourceDefinition controllers of upstream's apiextensions-apiserver, through
//! the API:
//!
//! - naming (`NamingConditionController`): a CRD's names are accepted unless another CRD
//!   of its group already accepted one of them (plural, singular, short names, kind, list
//!   kind); `status.acceptedNames` and the `NamesAccepted` condition say which.
//! - establishing (`EstablishingController`): `Established` once the names are accepted
//!   (the apiserver serves a CRD's resources from then on), and `status.storedVersions`
//!   keeps every version objects were stored at.
//! - finalizing (`CRDFinalizer`): a deleted CRD is `Terminating`; its custom objects are
//!   deleted, then its `customresourcecleanup.apiextensions.k8s.io` finalizer removed.
//!
//! Any CRD change re-queues every CRD of its group, since names freed or taken by one
//! decide another's.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::informer::{Change, informer_with_store, run_applier};
use crate::context::Context;

/// The finalizer every CRD gets at creation (the apiserver adds it).
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";
const MANAGER: &str = "apiextensions-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the status of CustomResourceDefinition {name}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the objects of CustomResourceDefinition {name}")]
    Cleanup {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the controllers until dropped.
pub async fn run(ctx: Arc<Context>) {
    let (tx, rx) = mpsc::unbounded_channel::<ObjectRef<CustomResourceDefinition>>();
    let store = informer_with_store(
        &ctx.informers.all::<CustomResourceDefinition>(),
        tx,
        |change, store: &Store<CustomResourceDefinition>| {
            let (crd, group) = match change {
                Change::Applied(c) => (c, c.spec.group.clone()),
                Change::Deleted(c) => (c, c.spec.group.clone()),
            };
            let mut refs: Vec<_> = store
                .state()
                .iter()
                .filter(|c| c.spec.group == group)
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect();
            refs.push(ObjectRef::from_obj(crd));
            refs
        },
    )
    .await;
    let reader = store.clone();
    run_applier("customresourcedefinitions", store, rx, ctx, move |crd, ctx| {
        // Only the names the other CRDs of the group accepted (a CRD's schema can be a
        // megabyte: reconciles must not copy every CRD).
        let others: Vec<Value> = reader
            .state()
            .iter()
            .filter(|c| c.spec.group == crd.spec.group && c.name_any() != crd.name_any())
            .map(|c| {
                let names = c.status.as_ref().and_then(|s| s.accepted_names.as_ref());
                json!({"status": {"acceptedNames": serde_json::to_value(names).unwrap_or_default()}})
            })
            .collect();
        async move { reconcile(&crd, &others, &ctx).await }
    })
    .await;
}

fn as_value(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(crd).unwrap_or_default()
}

/// The names a CRD asks for, with upstream's defaults (singular: the lowercased kind,
/// listKind: kind + "List").
fn requested_names(crd: &Value) -> Value {
    let mut names = crd.pointer("/spec/names").cloned().unwrap_or_else(|| json!({}));
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if names["singular"].as_str().unwrap_or_default().is_empty() {
        names["singular"] = json!(kind.to_lowercase());
    }
    if names["listKind"].as_str().unwrap_or_default().is_empty() {
        names["listKind"] = json!(format!("{kind}List"));
    }
    names
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// (accepted names, NamesAccepted condition) for `crd` given the other CRDs of its group:
/// a name some other CRD accepted is a conflict, and the names the CRD had accepted before
/// are kept in the meantime.
pub fn accepted_names(crd: &Value, others: &[Value]) -> (Value, Value) {
    let requested = requested_names(crd);
    let taken = |field: &str, name: &str| {
        !name.is_empty()
            && others.iter().any(|o| {
                let a = &o["status"]["acceptedNames"];
                a["plural"] == name
                    || a["singular"] == name
                    || strs(&a["shortNames"]).contains(&name)
                    || (field == "kind" || field == "listKind")
                        && (a["kind"] == name || a["listKind"] == name)
            })
    };
    let s = |k: &str| requested[k].as_str().unwrap_or_default();
    let conflict = if taken("plural", s("plural")) {
        Some(("PluralConflict", format!("\"{}\" is already in use", s("plural"))))
    } else if taken("singular", s("singular")) {
        Some(("SingularConflict", format!("\"{}\" is already in use", s("singular"))))
    } else if let Some(short) =
        strs(&requested["shortNames"]).into_iter().find(|n| taken("short", n))
    {
        Some(("ShortNamesConflict", format!("\"{short}\" is already in use")))
    } else if taken("kind", s("kind")) {
        Some(("KindConflict", format!("\"{}\" is already in use", s("kind"))))
    } else if taken("listKind", s("listKind")) {
        Some(("ListKindConflict", format!("\"{}\" is already in use", s("listKind"))))
    } else {
        None
    };
    match conflict {
        None => (requested, condition("NamesAccepted", true, "NoConflicts", "no conflicts found")),
        Some((reason, message)) => (
            crd.pointer("/status/acceptedNames")
                .cloned()
                .unwrap_or_else(|| json!({"plural": "", "kind": ""})),
            condition("NamesAccepted", false, reason, &message),
        ),
    }
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> Value {
    json!({
        "type": kind,
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
    })
}

/// `conditions` with `new` in place of its type's entry; the transition time moves only
/// when the status does.
fn set_condition(conditions: &mut Vec<Value>, mut new: Value) {
    let now = skiff_core::time::now_rfc3339();
    match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
        Some(old) => {
            let time = if old["status"] == new["status"] {
                old["lastTransitionTime"].clone()
            } else {
                json!(now)
            };
            new["lastTransitionTime"] = time;
            *old = new;
        }
        None => {
            new["lastTransitionTime"] = json!(now);
            conditions.push(new);
        }
    }
}

/// The status a CRD should have (from its current one and the other CRDs of its group).
pub fn desired_status(crd: &Value, others: &[Value]) -> Value {
    let mut status = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let (names, accepted) = accepted_names(crd, others);
    let names_ok = accepted["status"] == "True";
    set_condition(&mut conditions, accepted);
    let terminating = crd.pointer("/metadata/deletionTimestamp").is_some();
    if names_ok && !terminating {
        set_condition(
            &mut conditions,
            condition(
                "Established",
                true,
                "InitialNamesAccepted",
                "the initial names have been accepted",
            ),
        );
    } else if !conditions.iter().any(|c| c["type"] == "Established" && c["status"] == "True") {
        set_condition(
            &mut conditions,
            condition("Established", false, "NotAccepted", "not all names are accepted"),
        );
    }
    if terminating {
        set_condition(
            &mut conditions,
            condition(
                "Terminating",
                true,
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            ),
        );
    }
    status["acceptedNames"] = names;
    status["conditions"] = Value::Array(conditions);
    let mut stored: Vec<String> =
        strs(&status["storedVersions"]).into_iter().map(str::to_string).collect();
    if let Some(storage) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        && !stored.iter().any(|s| s == storage)
    {
        stored.push(storage.to_string());
    }
    status["storedVersions"] = json!(stored);
    status
}

/// Equal but for the conditions' transition times.
fn same_status(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(cs) = v.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(m) = c.as_object_mut() {
                    m.remove("lastTransitionTime");
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// `others`: the other CRDs of the group, their `status.acceptedNames` only.
async fn reconcile(
    crd: &CustomResourceDefinition,
    others: &[Value],
    ctx: &Context,
) -> Result<Action, Error> {
    let name = crd.name_any();
    let value = as_value(crd);
    let status = desired_status(&value, others);
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    if !same_status(&status, value.get("status").unwrap_or(&Value::Null)) {
        let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
        api.patch_status(&name, &params, &Patch::Merge(&json!({"status": status})))
            .await
            .map_err(|source| Error::Status { name: name.clone(), source })?;
        // The next event brings the written status back.
        return Ok(Action::await_change());
    }
    if crd.metadata.deletion_timestamp.is_some()
        && crd.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
    {
        return cleanup(crd, &api, ctx).await;
    }
    Ok(Action::await_change())
}

/// Deletes the CRD's objects; once none is left, removes the finalizer.
async fn cleanup(
    crd: &CustomResourceDefinition,
    api: &Api<CustomResourceDefinition>,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = crd.name_any();
    let cleanup_err = |source| Error::Cleanup { name: name.clone(), source };
    let accepted = crd.status.as_ref().and_then(|s| s.accepted_names.as_ref());
    let plural = accepted.map(|n| n.plural.clone()).unwrap_or_default();
    let version = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone());
    if let Some(version) = version.filter(|_| !plural.is_empty()) {
        let kind = accepted.map(|n| n.kind.clone()).unwrap_or_default();
        let ar = ApiResource {
            group: crd.spec.group.clone(),
            version: version.clone(),
            api_version: format!("{}/{version}", crd.spec.group),
            kind,
            plural,
        };
        let objects: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &ar);
        let listed = match objects.list(&ListParams::default()).await {
            Ok(l) => l.items,
            // Not served any more (the apiserver stopped serving it): nothing to list.
            Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
            Err(e) => return Err(cleanup_err(e)),
        };
        if !listed.is_empty() {
            for o in &listed {
                let api: Api<DynamicObject> = match o.namespace() {
                    Some(ns) => Api::namespaced_with(ctx.client.clone(), &ns, &ar),
                    None => Api::all_with(ctx.client.clone(), &ar),
                };
                match api.delete(&o.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(cleanup_err(e)),
                }
            }
            // Objects with finalizers of their own go when those are done: look again.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    let finalizers: Vec<String> =
        crd.finalizers().iter().filter(|f| *f != CLEANUP_FINALIZER).cloned().collect();
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": crd.resource_version()}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(cleanup_err)?;
    tracing::info!(crd = %name, "custom objects deleted; finalizer removed");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(name: &str, plural: &str, kind: &str, short: &[&str]) -> Value {
        json!({
            "metadata": {"name": format!("{plural}.example.com")},
            "spec": {"group": "example.com", "names": {"plural": plural, "kind": kind, "shortNames": short},
                "versions": [{"name": "v1", "served": true, "storage": true}]},
            "status": {"acceptedNames": {"plural": plural, "singular": name, "kind": kind, "listKind": format!("{kind}List"), "shortNames": short}},
        })
    }

    #[test]
    fn names_are_accepted_without_conflicts_and_established() {
        let mut c = crd("widget", "widgets", "Widget", &["wg"]);
        c["status"] = json!({});
        let s = desired_status(&c, &[]);
        assert_eq!(s["acceptedNames"]["singular"], "widget");
        assert_eq!(s["acceptedNames"]["listKind"], "WidgetList");
        let cond = |t: &str| {
            s["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).cloned().unwrap()
        };
        assert_eq!(cond("NamesAccepted")["reason"], "NoConflicts");
        assert_eq!(cond("Established")["status"], "True");
        assert_eq!(s["storedVersions"], json!(["v1"]));
        assert!(same_status(&s, &desired_status(&json!({"spec": c["spec"], "status": s}), &[])));
    }

    #[test]
    fn a_name_another_crd_accepted_is_a_conflict() {
        let other = crd("gadget", "gadgets", "Gadget", &["wg"]);
        let mut c = crd("widget", "widgets", "Widget", &["wg"]);
        c["status"] = json!({});
        let s = desired_status(&c, std::slice::from_ref(&other));
        let names = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "NamesAccepted")
            .unwrap();
        assert_eq!(names["status"], "False");
        assert_eq!(names["reason"], "ShortNamesConflict");
        assert_eq!(names["message"], "\"wg\" is already in use");
        let est = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Established")
            .unwrap();
        assert_eq!(est["status"], "False");
        let mut plural = crd("gadget2", "gadgets", "Gadget2", &[]);
        plural["status"] = json!({});
        let s = desired_status(&plural, &[other]);
        assert!(s["conditions"].to_string().contains("PluralConflict"), "{s}");
    }
}
