//! NodeRestriction: a node's credentials (`system:node:<name>` in `system:nodes`) may write
//! only its own Node (not its taints, nor labels under `node-restriction.kubernetes.io/`),
//! the status of pods bound to it, mirror pods bound to it, and its own Lease in
//! `kube-node-lease` (upstream `plugin/pkg/admission/noderestriction`, main rules).

use async_trait::async_trait;
use serde_json::Value;

use super::serviceaccount::MIRROR_POD_ANNOTATION;
use super::{AdmissionRequest, Operation, Resource, ValidatingPlugin, labels_of};
use crate::state::State;
use crate::status::ApiResult;
use crate::user::UserInfo;
use skiff_core::json::ValueAt;
use skiff_core::names;

/// Labels only an administrator may set on a Node.
pub const RESTRICTED_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/";

pub struct NodeRestriction;

#[async_trait]
impl ValidatingPlugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation != Operation::Connect
            && (resource.is_core("pods")
                || resource.is_core("nodes")
                || (resource.group == "coordination.k8s.io" && resource.resource == "leases"))
    }

    fn active(&self, _server: &State, user: &UserInfo) -> bool {
        user.in_group(names::NODES)
    }

    async fn validate(&self, _server: &State, req: &AdmissionRequest) -> ApiResult<()> {
        admit_node_request(req)
    }
}

/// The rules, without I/O (unit-testable).
pub fn admit_node_request(req: &AdmissionRequest) -> ApiResult<()> {
    if !req.user.in_group(names::NODES) {
        return Ok(());
    }
    let Some(node) = req.user.node_name() else {
        return Err(
            req.forbidden(format!("could not determine node from user \"{}\"", req.user.name))
        );
    };
    let r = req.resource();
    if r.is_core("pods") {
        return admit_pod(node, req);
    }
    if r.is_core("nodes") {
        return admit_node(node, req);
    }
    admit_lease(node, req)
}

fn node_name_of(obj: Option<&Value>) -> &str {
    obj.and_then(|p| p.at(&["spec", "nodeName"])).and_then(Value::as_str).unwrap_or_default()
}

fn admit_pod(node: &str, req: &AdmissionRequest) -> ApiResult<()> {
    match (req.subresource.as_deref(), req.operation) {
        (None, Operation::Create) => {
            let pod = req.object.as_ref();
            let mirror = pod
                .and_then(|p| p.at(&["metadata", "annotations"]))
                .and_then(Value::as_object)
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
            if !mirror {
                return Err(req.forbidden(format!(
                    "pod does not have \"{MIRROR_POD_ANNOTATION}\" annotation, node \"{node}\" can only create mirror pods"
                )));
            }
            if node_name_of(pod) != node {
                return Err(req.forbidden(format!(
                    "node \"{node}\" can only create pods with spec.nodeName set to itself"
                )));
            }
            let volumes = pod.and_then(|p| p.at(&["spec", "volumes"])).and_then(Value::as_array);
            for v in volumes.into_iter().flatten() {
                for (field, what) in [
                    ("secret", "secrets"),
                    ("configMap", "configmaps"),
                    ("persistentVolumeClaim", "persistentvolumeclaims"),
                ] {
                    if v.get(field).is_some() {
                        return Err(req.forbidden(format!(
                            "node \"{node}\" can not create pods that reference {what}"
                        )));
                    }
                }
            }
            Ok(())
        }
        (None, Operation::Update) => {
            Err(req.forbidden(format!("node \"{node}\" can only update pod status")))
        }
        (None, Operation::Delete) => {
            if node_name_of(req.old_object.as_ref()) != node {
                return Err(req.forbidden(format!(
                    "node \"{node}\" can only delete pods with spec.nodeName set to itself"
                )));
            }
            Ok(())
        }
        (Some("status"), _) => {
            if node_name_of(req.old_object.as_ref()) != node {
                return Err(req.forbidden(format!(
                    "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                )));
            }
            Ok(())
        }
        (Some(sub), _) => Err(req.forbidden(format!(
            "unexpected pod subresource \"{sub}\", only 'status' and 'eviction' are allowed"
        ))),
        (None, _) => Ok(()),
    }
}

fn admit_node(node: &str, req: &AdmissionRequest) -> ApiResult<()> {
    let requested = req
        .object
        .as_ref()
        .and_then(|o| o.at(&["metadata", "name"]))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(&req.name);
    if requested != node {
        return Err(
            req.forbidden(format!("node \"{node}\" is not allowed to modify node \"{requested}\""))
        );
    }
    let restricted =
        |labels: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            labels
                .iter()
                .filter(|(k, _)| {
                    k.starts_with(RESTRICTED_LABEL_PREFIX)
                        || k.split('/')
                            .next()
                            .is_some_and(|p| p.ends_with(".node-restriction.kubernetes.io"))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
    match req.operation {
        Operation::Create => {
            let bad = restricted(&labels_of(req.object.as_ref()));
            if !bad.is_empty() {
                let keys: Vec<String> = bad.into_iter().map(|(k, _)| k).collect();
                return Err(req.forbidden(format!(
                    "node \"{node}\" is not allowed to set the following labels: {}",
                    keys.join(", ")
                )));
            }
        }
        Operation::Update if req.subresource.is_none() => {
            let new = restricted(&labels_of(req.object.as_ref()));
            let old = restricted(&labels_of(req.old_object.as_ref()));
            if new != old {
                let mut keys: Vec<String> = new
                    .iter()
                    .chain(old.iter())
                    .filter(|kv| !(new.contains(kv) && old.contains(kv)))
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.sort();
                keys.dedup();
                return Err(req.forbidden(format!(
                    "node \"{node}\" is not allowed to modify labels: {}",
                    keys.join(", ")
                )));
            }
            let taints = |o: Option<&Value>| {
                o.and_then(|o| o.at(&["spec", "taints"]))
                    .cloned()
                    .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
            };
            if taints(req.object.as_ref()) != taints(req.old_object.as_ref()) {
                return Err(
                    req.forbidden(format!("node \"{node}\" is not allowed to modify taints"))
                );
            }
        }
        _ => {}
    }
    Ok(())
}

fn admit_lease(node: &str, req: &AdmissionRequest) -> ApiResult<()> {
    if req.namespace.as_deref() != Some("kube-node-lease") {
        return Err(req.forbidden("can only access leases in the \"kube-node-lease\" namespace"));
    }
    let name = req
        .subject()
        .and_then(|o| o.at(&["metadata", "name"]))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(&req.name);
    if name != node {
        return Err(
            req.forbidden("can only access node lease with the same name as the requesting node")
        );
    }
    Ok(())
}
