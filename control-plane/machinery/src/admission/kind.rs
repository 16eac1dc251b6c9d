//! What every kind's strategy shares, below them all: the [`Gvk`] of an object, the scope
//! and name rule of each kind this crate knows, typed views of an object, and ObjectMeta
//! validation by those rules.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::field::{FieldError, FieldErrorKind, Path};
use super::meta::{self, NameRule};

/// The kind of the object handed to admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gvk<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
}

impl<'a> Gvk<'a> {
    pub const fn new(group: &'a str, version: &'a str, kind: &'a str) -> Self {
        Self { group, version, kind }
    }
}

/// Scope and name rule of a kind this module knows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KindInfo {
    pub namespaced: bool,
    pub name_rule: NameRule,
    /// Whether the main resource's writes leave `status` alone (a status subresource).
    pub has_status: bool,
    /// Whether the strategy keeps `metadata.generation` (1 on create, +1 on spec change).
    pub tracks_generation: bool,
}

pub(crate) fn kind_info(gvk: Gvk) -> Option<KindInfo> {
    use NameRule::*;
    let k = |namespaced, name_rule, has_status, tracks_generation| {
        Some(KindInfo { namespaced, name_rule, has_status, tracks_generation })
    };
    match (gvk.group, gvk.kind) {
        ("", "Namespace") => k(false, Label, true, false),
        ("", "Node") => k(false, Subdomain, true, false),
        ("", "Pod") => k(true, Subdomain, true, true),
        ("", "Service") => k(true, Dns1035, true, false),
        ("", "Endpoints") => k(true, Subdomain, false, false),
        ("", "ConfigMap") => k(true, Subdomain, false, false),
        ("", "Secret") => k(true, Subdomain, false, false),
        ("", "ServiceAccount") => k(true, Subdomain, false, false),
        ("", "Event") => k(true, PathSegment, false, false),
        ("", "Binding") => k(true, Subdomain, false, false),
        ("", "PersistentVolume") => k(false, Subdomain, true, false),
        ("", "PersistentVolumeClaim") => k(true, Subdomain, true, false),
        ("", "ReplicationController") => k(true, Subdomain, true, true),
        ("networking.k8s.io", "Ingress") => k(true, Subdomain, true, true),
        ("networking.k8s.io", "IngressClass") => k(false, Subdomain, false, true),
        ("storage.k8s.io", "StorageClass") => k(false, Subdomain, false, false),
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet") => {
            k(true, Subdomain, true, true)
        }
        ("apps", "ControllerRevision") => k(true, Subdomain, false, false),
        ("autoscaling", "Scale") => k(true, Subdomain, false, false),
        ("autoscaling", "HorizontalPodAutoscaler") => k(true, Subdomain, true, false),
        ("batch", "Job") => k(true, Subdomain, true, true),
        ("batch", "CronJob") => k(true, Subdomain, true, true),
        ("policy", "PodDisruptionBudget") => k(true, Subdomain, true, true),
        ("discovery.k8s.io", "EndpointSlice") => k(true, Subdomain, false, false),
        ("coordination.k8s.io", "Lease") => k(true, Subdomain, false, false),
        ("certificates.k8s.io", "CertificateSigningRequest") => k(false, PathSegment, true, false),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => k(false, Subdomain, true, true),
        ("apiregistration.k8s.io", "APIService") => k(false, PathSegment, true, false),
        ("rbac.authorization.k8s.io", "Role" | "RoleBinding") => k(true, PathSegment, false, false),
        ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => {
            k(false, PathSegment, false, false)
        }
        _ => None,
    }
}

/// Deserializes a typed view of `v` without copying it; a shape error becomes one field
/// error (the apiserver's decoding normally rejects such bodies first).
/// The new object and the old one (an update's), typed.
pub(crate) fn typed_pair<T: DeserializeOwned>(
    new: &Value,
    old: Option<&Value>,
) -> Result<(T, Option<T>), Vec<FieldError>> {
    Ok((typed(new)?, old.map(typed).transpose()?))
}

pub(crate) fn typed<T: DeserializeOwned>(v: &Value) -> Result<T, Vec<FieldError>> {
    T::deserialize(v).map_err(|e| {
        vec![FieldError {
            kind: FieldErrorKind::Invalid,
            field: String::new(),
            value: None,
            detail: format!("cannot decode object: {e}"),
        }]
    })
}

/// ObjectMeta validation for a known kind (create, or create + update checks).
pub(crate) fn validate_meta(
    kind: Gvk,
    new: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    old: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
) -> Vec<FieldError> {
    let Some(info) = kind_info(kind) else {
        return Vec::new();
    };
    let path = Path::root("metadata");
    let mut errs = meta::validate_object_meta(new, info.namespaced, info.name_rule, &path);
    if let Some(old) = old {
        errs.extend(meta::validate_object_meta_update(new, old, &path));
    }
    errs
}
