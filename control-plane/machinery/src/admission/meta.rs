//! ObjectMeta validation shared by every kind (upstream `ValidateObjectMetaAccessor` and
//! `ValidateObjectMetaUpdate`): names, namespace, labels, annotations, owner references,
//! finalizers, and the identity fields an update must keep.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use super::field::{ErrorList, FieldError, Path, Raw, go_string_list};
use super::names;

/// Upstream `TotalAnnotationSizeLimitB`.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// How a kind's `metadata.name` is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain (most kinds).
    Subdomain,
    /// DNS-1123 label (Namespace).
    Label,
    /// DNS-1035 label (Service).
    Dns1035,
    /// A path segment (RBAC kinds, Events use subdomain... see callers).
    PathSegment,
}

impl NameRule {
    /// Messages for a name; `prefix` for a generateName (trailing dash masked as upstream).
    pub fn check(self, name: &str, prefix: bool) -> Vec<String> {
        let masked;
        let name = if prefix {
            masked = mask_trailing_dash(name);
            masked.as_str()
        } else {
            name
        };
        match self {
            Self::Subdomain => names::is_dns1123_subdomain(name),
            Self::Label => names::is_dns1123_label(name),
            Self::Dns1035 => names::is_dns1035_label(name),
            Self::PathSegment => {
                if prefix {
                    names::is_valid_path_segment_name(name)
                        .into_iter()
                        .filter(|m| m.starts_with("may not contain"))
                        .collect()
                } else {
                    names::is_valid_path_segment_name(name)
                }
            }
        }
    }
}

fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') && name.is_char_boundary(name.len() - 2) {
        format!("{}a", &name[..name.len() - 2])
    } else {
        name.to_string()
    }
}

/// Upstream `ValidateObjectMeta` for a kind with the given name rule and scope.
pub fn validate_object_meta(
    meta: &ObjectMeta,
    namespaced: bool,
    rule: NameRule,
    path: &Path,
) -> ErrorList {
    let mut errs = ErrorList::new();
    if let Some(gen_name) = meta.generate_name.as_deref().filter(|g| !g.is_empty()) {
        for msg in rule.check(gen_name, true) {
            errs.push(FieldError::invalid(&path.child("generateName"), gen_name, msg));
        }
    }
    match meta.name.as_deref().filter(|n| !n.is_empty()) {
        None => {
            errs.push(FieldError::required(&path.child("name"), "name or generateName is required"))
        }
        Some(name) => {
            for msg in rule.check(name, false) {
                errs.push(FieldError::invalid(&path.child("name"), name, msg));
            }
        }
    }
    let ns = meta.namespace.as_deref().unwrap_or_default();
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required(&path.child("namespace"), ""));
        } else {
            for msg in names::is_dns1123_label(ns) {
                errs.push(FieldError::invalid(&path.child("namespace"), ns, msg));
            }
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(&path.child("namespace"), "not allowed on this type"));
    }
    if let Some(g) = meta.generation
        && g < 0
    {
        errs.push(FieldError::invalid(&path.child("generation"), g, NEGATIVE));
    }
    if let Some(labels) = &meta.labels {
        errs.extend(validate_labels(labels, &path.child("labels")));
    }
    if let Some(ann) = &meta.annotations {
        errs.extend(validate_annotations(ann, &path.child("annotations")));
    }
    if let Some(refs) = &meta.owner_references {
        errs.extend(validate_owner_references(refs, &path.child("ownerReferences")));
    }
    if let Some(fins) = &meta.finalizers {
        errs.extend(validate_finalizers(fins, &path.child("finalizers")));
    }
    errs
}

/// Upstream `ValidateObjectMetaUpdate` (the identity part; generation, timestamps and uid
/// are restored from the old object by the apiserver before validation).
pub fn validate_object_meta_update(new: &ObjectMeta, old: &ObjectMeta, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    immutable_str(&mut errs, &new.name, &old.name, &path.child("name"));
    immutable_str(&mut errs, &new.namespace, &old.namespace, &path.child("namespace"));
    if new.uid.as_deref().is_some_and(|u| !u.is_empty())
        && old.uid.as_deref().is_some_and(|u| !u.is_empty())
    {
        immutable_str(&mut errs, &new.uid, &old.uid, &path.child("uid"));
    }
    errs
}

fn immutable_str(errs: &mut ErrorList, new: &Option<String>, old: &Option<String>, path: &Path) {
    let n = new.as_deref().unwrap_or_default();
    let o = old.as_deref().unwrap_or_default();
    if n != o {
        errs.push(FieldError::invalid(path, n, FIELD_IMMUTABLE));
    }
}

pub const FIELD_IMMUTABLE: &str = "field is immutable";
pub const NEGATIVE: &str = "must be greater than or equal to 0";

/// Upstream `ValidateNonnegativeField`.
pub fn nonnegative(errs: &mut ErrorList, v: Option<i64>, path: &Path) {
    if let Some(v) = v
        && v < 0
    {
        errs.push(FieldError::invalid(path, v, NEGATIVE));
    }
}

pub fn validate_labels(labels: &BTreeMap<String, String>, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    for (k, v) in labels {
        for msg in names::is_qualified_name(k) {
            errs.push(FieldError::invalid(path, k, msg));
        }
        for msg in names::is_valid_label_value(v) {
            errs.push(FieldError::invalid(path, v, msg));
        }
    }
    errs
}

pub fn validate_annotations(ann: &BTreeMap<String, String>, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    let mut total = 0usize;
    for (k, v) in ann {
        total += k.len() + v.len();
        for msg in names::is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid(path, k, msg));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

pub fn validate_owner_references(refs: &[OwnerReference], path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    let mut first_controller: Option<String> = None;
    for r in refs {
        let version = r.api_version.rsplit('/').next().unwrap_or_default();
        if r.api_version.is_empty() || version.is_empty() {
            errs.push(FieldError::invalid(
                &path.child("apiVersion"),
                &r.api_version,
                "version must not be empty",
            ));
        }
        if r.kind.is_empty() {
            errs.push(FieldError::invalid(&path.child("kind"), &r.kind, "kind must not be empty"));
        }
        if r.name.is_empty() {
            errs.push(FieldError::invalid(&path.child("name"), &r.name, "name must not be empty"));
        }
        if r.uid.is_empty() {
            errs.push(FieldError::invalid(&path.child("uid"), &r.uid, "uid must not be empty"));
        }
        if r.controller == Some(true) {
            let cur = format!("{}/{}", r.kind, r.name);
            match &first_controller {
                Some(first) => errs.push(FieldError::invalid(
                    path,
                    Raw(serde_json::to_string(refs).unwrap_or_default()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {cur}"
                    ),
                )),
                None => first_controller = Some(cur),
            }
        }
    }
    errs
}

pub fn validate_finalizers(fins: &[String], path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    for f in fins {
        for msg in names::is_qualified_name(f) {
            errs.push(FieldError::invalid(path, f, msg));
        }
    }
    if fins.iter().any(|f| f == "orphan") && fins.iter().any(|f| f == "foregroundDeletion") {
        errs.push(FieldError::invalid(
            path,
            go_string_list(fins),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

/// Upstream `ValidateLabelSelector` (metav1 validation): keys, operators, values.
pub fn validate_label_selector(sel: &LabelSelector, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    for (i, req) in sel.match_expressions.iter().flatten().enumerate() {
        let p = path.child("matchExpressions").index(i);
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        &p.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        &p.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => errs.push(FieldError::invalid(
                &p.child("operator"),
                other,
                "not a valid selector operator",
            )),
        }
        for msg in names::is_qualified_name(&req.key) {
            errs.push(FieldError::invalid(&p.child("key"), &req.key, msg));
        }
        for (j, v) in values.iter().enumerate() {
            for msg in names::is_valid_label_value(v) {
                errs.push(FieldError::invalid(&p.child("values").index(j), v, msg));
            }
        }
    }
    if let Some(ml) = &sel.match_labels {
        errs.extend(validate_labels(ml, &path.child("matchLabels")));
    }
    errs
}
