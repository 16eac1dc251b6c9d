//! Admission for the built-in kinds: upstream defaulting (`SetDefaults_*`, the defaulting
//! admission plugins and the strategies' `PrepareForCreate/Update`) and validation
//! (`pkg/apis/*/validation`) with upstream's field errors and 422 messages.
//!
//! Objects cross this boundary as `serde_json::Value`. Defaulting edits the JSON in place
//! (so unknown fields survive); validation reads typed k8s-openapi structs deserialized by
//! reference.
//!
//! The apiserver calls, in this order:
//! - create: [`default_object`] → (name from generateName, uid, namespace,
//!   creationTimestamp set by the apiserver) → [`prepare_for_create`] →
//!   [`validate`]`(Create)`; a non-empty result is a 422 built with [`invalid_status`].
//! - update (PUT or patched object, main resource or `/status`): [`default_object`] on the
//!   new object → [`prepare_for_update`] → [`validate`]`(Update, sub, new, Some(old))`.
//! - `/scale`: [`validate`] on the autoscaling/v1 Scale body (or the parent kind with
//!   subresource `"scale"`); then the parent with the new replicas goes through
//!   [`prepare_for_update`] (subresource `None` or `"scale"`, same effect) and
//!   [`validate`]`(Update, None, ..)` like a main-resource update.
//! - `/binding`: [`validate`] on the core/v1 Binding body only; setting `spec.nodeName`
//!   (and the PodScheduled condition) is not a pod update and must not go through pod
//!   update validation, which forbids changing `spec.nodeName` as upstream does.
//! - graceful deletion (deletionTimestamp, deletionGracePeriodSeconds) and finalizer
//!   removal need no admission beyond what the apiserver checks itself.
//!
//! Kinds not listed in `kind_info` pass through untouched and valid.

pub mod apiextensions;
pub mod apiregistration;
mod apps;
pub mod autoscaling;
mod batch;
mod certificates;
mod core;
pub(crate) mod field;
mod kind;
mod meta;
mod names;
mod networking;
mod other;
mod pod;
mod policy;
mod scheduling;
mod service;
mod storage;
mod value;

use serde_json::Value;

pub use field::{FieldError, FieldErrorKind, Path, aggregate};
pub use kind::Gvk;
use kind::kind_info;
pub use other::SYSTEM_PRIORITY_CLASSES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

/// What `prepare_for_update` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prepared {
    /// The write changed what the kind's generation tracks (spec, for Deployments also
    /// annotations); `metadata.generation` of `new` has already been set to old + 1 then
    /// (and to old's otherwise) for kinds that keep a generation.
    pub spec_changed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the {kind} object is not a JSON object")]
    NotAnObject { kind: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Upstream defaulting (`SetDefaults_*` of the versioned types), applied to the object as
/// received on create and update, before `prepare_for_*` and `validate`. Unknown kinds are
/// left alone.
pub fn default_object(gvk: Gvk, obj: &mut Value) -> Result<()> {
    let Some(o) = obj.as_object_mut() else {
        return Err(Error::NotAnObject { kind: gvk.kind.to_string() });
    };
    match (gvk.group, gvk.kind) {
        ("", "Pod") => pod::default_pod(o),
        ("", "Service") => service::default_service(o),
        ("", "Namespace") => core::default_namespace(o),
        ("", "Secret") => core::default_secret(o),
        ("", "Node") => core::default_node(o),
        ("", "Endpoints") => core::default_endpoints(o),
        ("", "PersistentVolume") => storage::default_pv(o),
        ("", "PersistentVolumeClaim") => storage::default_pvc(o),
        ("", "ReplicationController") => apps::default_replication_controller(o),
        ("", "LimitRange") => core::default_limit_range(o),
        ("", "ResourceQuota") => core::default_resource_quota(o),
        ("storage.k8s.io", "StorageClass") => storage::default_storage_class(o),
        // SetDefaults_IngressClass: parameters are cluster-scoped unless said otherwise.
        ("networking.k8s.io", "IngressClass") => {
            if let Some(p) = o
                .get_mut("spec")
                .and_then(|s| s.get_mut("parameters"))
                .and_then(Value::as_object_mut)
            {
                value::default_ptr(p, "scope", "Cluster");
            }
        }
        ("apps", "ControllerRevision") => {}
        ("apps", _) => apps::default_workload(gvk.kind, o),
        ("autoscaling", "HorizontalPodAutoscaler") => autoscaling::default_hpa(o),
        ("batch", "Job") => batch::default_job(o),
        ("batch", "CronJob") => batch::default_cronjob(o),
        ("discovery.k8s.io", "EndpointSlice") => other::default_endpoint_slice(o),
        ("rbac.authorization.k8s.io", _) => other::default_rbac(gvk.kind, o),
        ("scheduling.k8s.io", "PriorityClass") => other::default_priority_class(o),
        (apiextensions::GROUP, "CustomResourceDefinition") => apiextensions::default_crd(o),
        (apiregistration::GROUP, "APIService") => apiregistration::default_api_service(o),
        _ => {}
    }
    Ok(())
}

/// What the strategies and defaulting admission plugins set on create: status reset, the
/// pod's phase and QoS class, service account, priority and default tolerations, the Job's
/// generated selector, `metadata.generation` 1 for kinds that keep one. Call after
/// `default_object`, with `metadata.uid` already set.
pub fn prepare_for_create(gvk: Gvk, obj: &mut Value) {
    let Some(info) = kind_info(gvk) else { return };
    let Some(o) = obj.as_object_mut() else { return };
    if info.tracks_generation
        && let Some(m) = value::ensure(o, "metadata")
    {
        m.insert("generation".into(), Value::from(1));
    }
    match (gvk.group, gvk.kind) {
        ("", "Pod") => pod::prepare_pod_create(o),
        ("", "Namespace") => core::prepare_namespace_create(o),
        ("", "PersistentVolume" | "PersistentVolumeClaim") => storage::prepare_create(o),
        // ReplicationControllerStatus.replicas is not omitempty.
        ("", "ReplicationController") => {
            o.insert("status".into(), serde_json::json!({"replicas": 0}));
        }
        ("networking.k8s.io", "Ingress") => {
            o.insert("status".into(), serde_json::json!({"loadBalancer": {}}));
        }
        ("", "Service") => {
            o.insert("status".into(), serde_json::json!({"loadBalancer": {}}));
            service::normalize_cluster_ips_create(o);
        }
        ("apps", "ControllerRevision") => {}
        ("apps", _) => apps::prepare_create(gvk.kind, o),
        ("batch", "Job") => batch::prepare_job_create(o),
        ("certificates.k8s.io", "CertificateSigningRequest") => certificates::prepare_create(o),
        (apiextensions::GROUP, "CustomResourceDefinition") => apiextensions::prepare_crd_create(o),
        ("batch", "CronJob") => {
            o.insert("status".into(), serde_json::json!({}));
        }
        // HorizontalPodAutoscalerStatus.desiredReplicas is not omitempty.
        ("autoscaling", "HorizontalPodAutoscaler") => {
            o.insert("status".into(), serde_json::json!({"desiredReplicas": 0}));
        }
        // Upstream's PDB strategy starts from an empty status (its counts are not omitempty).
        ("policy", "PodDisruptionBudget") => {
            o.insert(
                "status".into(),
                serde_json::json!({
                    "disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0
                }),
            );
        }
        _ => {}
    }
}

/// What an update must not change: through the main resource `status` is reset to old's;
/// through `/status` everything but `status` and `metadata` is reset to old's (for apps
/// kinds also `metadata.labels`). Sets `metadata.generation` (old's, +1 when the spec
/// changed) for kinds that keep one and says whether the spec changed.
pub fn prepare_for_update(
    gvk: Gvk,
    subresource: Option<&str>,
    new: &mut Value,
    old: &Value,
) -> Prepared {
    let Some(info) = kind_info(gvk) else {
        return Prepared::default();
    };
    let (Some(n), Some(o)) = (new.as_object_mut(), old.as_object()) else {
        return Prepared::default();
    };
    let csr = (gvk.group, gvk.kind) == ("certificates.k8s.io", "CertificateSigningRequest");
    match subresource {
        Some("status") | Some("approval") => {
            let keys: Vec<String> = n
                .keys()
                .chain(o.keys())
                .filter(|k| !matches!(k.as_str(), "status" | "metadata" | "apiVersion" | "kind"))
                .cloned()
                .collect();
            for k in keys {
                match o.get(&k) {
                    Some(v) => n.insert(k, v.clone()),
                    None => n.remove(&k),
                };
            }
            match (gvk.group, gvk.kind) {
                ("apps", _) => restore_meta_field(n, o, "labels"),
                ("", "Pod") => {
                    restore_meta_field(n, o, "ownerReferences");
                    pod::backfill_qos_class(n, o);
                }
                _ if csr => certificates::prepare_update(subresource, n, o),
                _ => {}
            }
        }
        None | Some("scale") if info.has_status => {
            match o.get("status") {
                Some(s) => n.insert("status".into(), s.clone()),
                None => n.remove("status"),
            };
            match (gvk.group, gvk.kind) {
                ("", "Namespace") => core::prepare_namespace_update(n, o),
                ("", "Service") => service::prepare_service_update(n, o),
                ("apps", kind) => apps::prepare_update(kind, n, o),
                _ if csr => certificates::prepare_update(None, n, o),
                _ => {}
            }
        }
        _ => {}
    }
    let mut spec_changed = n.get("spec") != o.get("spec");
    // Annotations are copied from a Deployment to its ReplicaSets: a change through the main
    // resource bumps the generation (upstream's deploymentStrategy), not through status.
    if gvk.group == "apps" && gvk.kind == "Deployment" && subresource.is_none() {
        spec_changed |= n.get("metadata").and_then(|m| m.get("annotations"))
            != o.get("metadata").and_then(|m| m.get("annotations"));
    }
    if !info.tracks_generation {
        return Prepared { spec_changed: false };
    }
    let old_gen =
        o.get("metadata").and_then(|m| m.get("generation")).and_then(Value::as_i64).unwrap_or(0);
    if let Some(m) = value::ensure(n, "metadata") {
        let g = if spec_changed { old_gen + 1 } else { old_gen };
        m.insert("generation".into(), Value::from(g));
    }
    Prepared { spec_changed }
}

use skiff_core::status::omitted_zero_status;

/// Drop what upstream's types would not serialize: empty strings, maps and lists in
/// `metadata` (every ObjectMeta field is `omitempty`; numbers there are pointers and stay),
/// and the zero counts of [`skiff_core::status::OMITTED_ZERO_STATUS`]. A `labels: {}` or `readyReplicas: 0`
/// written by a client or a controller reads back as upstream's would: absent.
pub fn drop_omitted_empties(gvk: Gvk, obj: &mut Value) {
    let Some(o) = obj.as_object_mut() else { return };
    if let Some(Value::Object(meta)) = o.get_mut("metadata") {
        meta.retain(|_, v| match v {
            Value::String(s) => !s.is_empty(),
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        });
    }
    let fields = omitted_zero_status(gvk.group, gvk.kind);
    if let Some(Value::Object(status)) = o.get_mut("status") {
        for field in fields {
            if status.get(*field).and_then(Value::as_i64) == Some(0) {
                status.remove(*field);
            }
        }
    }
}

fn restore_meta_field(n: &mut value::Obj, o: &value::Obj, key: &str) {
    let old = o.get("metadata").and_then(|m| m.get(key)).cloned();
    if let Some(m) = value::ensure(n, "metadata") {
        match old {
            Some(v) => m.insert(key.into(), v),
            None => m.remove(key),
        };
    }
}

/// Upstream validation of a create or update (`ValidateX`/`ValidateXUpdate`, and the
/// status, scale and binding variants by `subresource`). Call after defaulting and
/// `prepare_for_*`. `old` is required for updates. Unknown kinds yield no errors.
pub fn validate(
    gvk: Gvk,
    op: Operation,
    subresource: Option<&str>,
    new: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    let old = match op {
        Operation::Create => None,
        Operation::Update => old,
    };
    match (gvk.group, gvk.kind, subresource) {
        (_, _, Some("binding")) | ("", "Binding", _) => core::validate_binding(new),
        (_, _, Some("scale")) | ("autoscaling", "Scale", _) => apps::validate_scale(new),
        ("", "Pod", Some("status")) => pod::validate_pod_status(new, old),
        ("", "Pod", _) => pod::validate_pod(new, old),
        ("", "Service", _) => service::validate_service(subresource, new, old),
        ("", "PersistentVolume", _) => storage::validate_pv(subresource, new, old),
        ("", "PersistentVolumeClaim", _) => storage::validate_pvc(subresource, new, old),
        ("", "ReplicationController", _) => {
            apps::validate_replication_controller(subresource, new, old)
        }
        ("", _, _) => core::validate(gvk.kind, new, old),
        ("apps", _, _) => apps::validate(gvk.kind, subresource, new, old),
        ("autoscaling", "HorizontalPodAutoscaler", _) => {
            autoscaling::validate_hpa(subresource, new, old)
        }
        ("batch", "Job", _) => batch::validate_job(subresource, new, old),
        ("batch", "CronJob", _) => batch::validate_cronjob(subresource, new, old),
        ("certificates.k8s.io", "CertificateSigningRequest", _) => {
            certificates::validate(subresource, new, old)
        }
        (apiextensions::GROUP, "CustomResourceDefinition", _) => {
            let mut errs = apiextensions::validate_crd(new, old);
            if let Ok((n, o)) = kind::typed_pair::<
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
            >(new, old)
            {
                errs.splice(0..0, kind::validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata)));
            }
            errs
        }
        (apiregistration::GROUP, "APIService", _) => {
            apiregistration::validate(subresource, new, old)
        }
        ("policy", "PodDisruptionBudget", _) => policy::validate_pdb(subresource, new, old),
        ("networking.k8s.io", "Ingress", _) => networking::validate_ingress(subresource, new, old),
        ("networking.k8s.io", "IngressClass", _) => networking::validate_ingress_class(new, old),
        ("storage.k8s.io", "StorageClass", _) => storage::validate_storage_class(new, old),
        _ => other::validate(gvk, new, old),
    }
}

/// The message of upstream's 422 `Invalid` status:
/// `Deployment.apps "web" is invalid: [spec.replicas: Invalid value: -1: ..., ...]`.
pub fn invalid_message(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> String {
    let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
    let name = field::go_quote(name);
    if errs.is_empty() {
        format!("{qualified} {name} is invalid")
    } else {
        format!("{qualified} {name} is invalid: {}", aggregate(errs))
    }
}

/// The whole 422 `Status` object upstream sends for these errors (`details.causes` with
/// `reason`, `message` and `field` per error).
pub fn invalid_status(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> Value {
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| {
            let mut c = serde_json::Map::new();
            c.insert("reason".into(), e.reason().into());
            c.insert("message".into(), e.body().into());
            // `omitempty` fields are left out when empty, as upstream serializes them.
            if !e.field.is_empty() {
                c.insert("field".into(), e.field.clone().into());
            }
            Value::Object(c)
        })
        .collect();
    let mut details = serde_json::Map::new();
    if !name.is_empty() {
        details.insert("name".into(), name.into());
    }
    if !group.is_empty() {
        details.insert("group".into(), group.into());
    }
    details.insert("kind".into(), kind.into());
    if !causes.is_empty() {
        details.insert("causes".into(), Value::Array(causes));
    }
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": invalid_message(kind, group, name, errs),
        "reason": "Invalid",
        "details": details,
        "code": 422,
    })
}

#[cfg(test)]
mod tests;
