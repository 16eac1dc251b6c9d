//! The Node authorizer (upstream's, chained before RBAC): a node's identity
//! (`system:node:<name>` in `system:nodes`) may read pods (as upstream's NodeRules) and only
//! the secrets, configmaps, PVCs (and the volumes bound to them) and service accounts its
//! own pods reference, read services, endpoints, endpointslices and nodes, and write only
//! its own Node, its own Lease, its pods' status (and delete its pods) and events.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::attributes::{Attributes, Decision};
use crate::cache::CachedObject;
use crate::state::State;

fn deny(node: &str, why: &str) -> Decision {
    Decision::Deny(format!("node '{node}' {why}"))
}

fn no_relationship(node: &str) -> Decision {
    Decision::Deny(format!("no relationship found between node '{node}' and this object"))
}

/// Pods bound to `node` (optionally in one namespace), from the watch cache.
fn pods_on(state: &State, node: &str, namespace: Option<&str>) -> Vec<Arc<CachedObject>> {
    let Some(rt) = state.registry.find("", "v1", "pods") else { return Vec::new() };
    state
        .cache
        .resource(rt)
        .list(&rt.namespace_prefix(namespace), None)
        .into_iter()
        .filter(|o| o.fields.iter().any(|(f, v)| *f == "spec.nodeName" && v == node))
        .collect()
}

fn pod_bound(state: &State, node: &str, ns: &str, name: &str) -> bool {
    let Some(rt) = state.registry.find("", "v1", "pods") else { return false };
    state
        .cache
        .resource(rt)
        .get(&rt.key(Some(ns), name))
        .is_some_and(|o| o.fields.iter().any(|(f, v)| *f == "spec.nodeName" && v == node))
}

/// The objects of `kind` ("secrets", "configmaps", "persistentvolumeclaims",
/// "serviceaccounts") that a pod references.
pub fn references(pod: &Value, kind: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let spec = &pod["spec"];
    let mut add = |v: &Value| {
        if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
            out.insert(s.to_string());
        }
    };
    match kind {
        "serviceaccounts" => match spec.get("serviceAccountName").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => add(&Value::String(n.into())),
            _ => add(&Value::String("default".into())),
        },
        "persistentvolumeclaims" => {
            for v in spec["volumes"].as_array().into_iter().flatten() {
                add(&v["persistentVolumeClaim"]["claimName"]);
            }
        }
        "secrets" | "configmaps" => {
            let secret = kind == "secrets";
            if secret {
                for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
                    add(&s["name"]);
                }
            }
            for v in spec["volumes"].as_array().into_iter().flatten() {
                if secret {
                    add(&v["secret"]["secretName"]);
                } else {
                    add(&v["configMap"]["name"]);
                }
                for src in v["projected"]["sources"].as_array().into_iter().flatten() {
                    add(&src[if secret { "secret" } else { "configMap" }]["name"]);
                }
            }
            let containers = ["containers", "initContainers", "ephemeralContainers"];
            for c in containers.iter().flat_map(|k| spec[*k].as_array().into_iter().flatten()) {
                for e in c["env"].as_array().into_iter().flatten() {
                    add(
                        &e["valueFrom"][if secret { "secretKeyRef" } else { "configMapKeyRef" }]["name"],
                    );
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    add(&e[if secret { "secretRef" } else { "configMapRef" }]["name"]);
                }
            }
        }
        _ => {}
    }
    out
}

/// Whether a pod on `node` in `ns` references `kind/name`.
fn referenced(state: &State, node: &str, ns: &str, kind: &str, name: &str) -> bool {
    pods_on(state, node, Some(ns)).iter().any(|p| references(&p.value(), kind).contains(name))
}

/// Whether a pod on `node` uses the claim the PersistentVolume `name` is bound to (upstream's
/// graph edge pod → PVC → PV). The volume's `claimRef` decides, not the claim's
/// `volumeName`, which a claim's author may set to any volume; both halves must agree.
fn volume_referenced(state: &State, node: &str, name: &str) -> bool {
    let (Some(pvs), Some(pvcs)) = (
        state.registry.find("", "v1", "persistentvolumes"),
        state.registry.find("", "v1", "persistentvolumeclaims"),
    ) else {
        return false;
    };
    let Some(pv) = state.cache.resource(pvs).get(&pvs.key(None, name)) else { return false };
    let claim_ref = &pv.value()["spec"]["claimRef"];
    let (Some(ns), Some(claim)) = (claim_ref["namespace"].as_str(), claim_ref["name"].as_str())
    else {
        return false;
    };
    let bound_back = state.cache.resource(pvcs).get(&pvcs.key(Some(ns), claim)).is_some_and(|c| {
        let c = c.value();
        c["spec"]["volumeName"] == name && c["metadata"]["uid"] == claim_ref["uid"]
    });
    bound_back && referenced(state, node, ns, "persistentvolumeclaims", claim)
}

pub fn authorize(state: &State, a: &Attributes) -> Decision {
    let Some(node) = a.user.node_name() else { return Decision::NoOpinion(String::new()) };
    if !a.resource_request {
        return Decision::NoOpinion(String::new());
    }
    let read = matches!(a.verb.as_str(), "get" | "list" | "watch");
    match (a.group.as_str(), a.resource.as_str(), a.subresource.as_str()) {
        ("", "nodes", _) => match a.verb.as_str() {
            "get" | "list" | "watch" => Decision::Allow,
            // The name is in the body; NodeRestriction admission checks it.
            "create" if a.subresource.is_empty() => Decision::Allow,
            "update" | "patch" | "delete" if a.name == node => Decision::Allow,
            _ => deny(node, "cannot modify node objects other than its own"),
        },
        // Reading pods is upstream's NodeRules (get/list/watch on all pods): the agent lists
        // its own with spec.nodeName=<node>, and its cluster DNS cache watches every pod.
        ("", "pods", "") => match a.verb.as_str() {
            "get" | "list" | "watch" => Decision::Allow,
            "delete" if pod_bound(state, node, &a.namespace, &a.name) => Decision::Allow,
            _ => no_relationship(node),
        },
        ("", "pods", "status") => match a.verb.as_str() {
            "get" | "update" | "patch" if pod_bound(state, node, &a.namespace, &a.name) => {
                Decision::Allow
            }
            _ => no_relationship(node),
        },
        ("", "pods", "eviction") if a.verb == "create" => {
            if pod_bound(state, node, &a.namespace, &a.name) {
                Decision::Allow
            } else {
                no_relationship(node)
            }
        }
        (
            "",
            kind @ ("secrets" | "configmaps" | "persistentvolumeclaims" | "serviceaccounts"),
            "",
        ) => {
            let name = if a.verb == "get" {
                a.name.clone()
            } else if matches!(a.verb.as_str(), "list" | "watch") {
                // Single-object watches (as the kubelet's) name the object in the selector.
                a.field_selector
                    .split(',')
                    .find_map(|t| {
                        t.trim()
                            .strip_prefix("metadata.name=")
                            .map(|n| n.trim_start_matches('=').to_string())
                    })
                    .unwrap_or_default()
            } else {
                return no_relationship(node);
            };
            if !name.is_empty() && referenced(state, node, &a.namespace, kind, &name) {
                Decision::Allow
            } else {
                no_relationship(node)
            }
        }
        ("", "persistentvolumes", "") if a.verb == "get" => {
            if volume_referenced(state, node, &a.name) {
                Decision::Allow
            } else {
                no_relationship(node)
            }
        }
        ("", "serviceaccounts", "token") if a.verb == "create" => {
            if referenced(state, node, &a.namespace, "serviceaccounts", &a.name) {
                Decision::Allow
            } else {
                no_relationship(node)
            }
        }
        ("", "services" | "endpoints", "") | ("discovery.k8s.io", "endpointslices", "") if read => {
            Decision::Allow
        }
        ("coordination.k8s.io", "leases", "") if a.namespace == "kube-node-lease" => {
            match a.verb.as_str() {
                "create" => Decision::Allow,
                _ if a.name == node => Decision::Allow,
                _ => deny(node, "can only access its own Lease"),
            }
        }
        ("" | "events.k8s.io", "events", "")
            if matches!(a.verb.as_str(), "create" | "update" | "patch") =>
        {
            Decision::Allow
        }
        // Its certificate requests (rotation): create, and read them back (upstream's
        // system:node role).
        ("certificates.k8s.io", "certificatesigningrequests", "")
            if matches!(a.verb.as_str(), "create" | "get" | "list" | "watch") =>
        {
            Decision::Allow
        }
        _ => Decision::NoOpinion(String::new()),
    }
}
