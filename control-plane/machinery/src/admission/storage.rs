//! Storage kinds: core/v1 PersistentVolume and PersistentVolumeClaim, storage.k8s.io/v1
//! StorageClass. `SetDefaults_*`, the strategies' create preparation and upstream's
//! `ValidatePersistentVolume*` / `ValidateStorageClass*`.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, json_value};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::{self, FIELD_IMMUTABLE};
use super::names;
use super::value::{Obj, default, ensure};
use skiff_core::quantity::{self, Quantity};

pub const ACCESS_MODES: &[&str] =
    &["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
const SC_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];
/// `HostPathType` values ("" checks nothing).
pub(super) const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];
/// The members of `PersistentVolumeSource` (a PV names exactly one).
const PV_SOURCES: &[&str] = &[
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "nfs",
    "rbd",
    "iscsi",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];
const GREATER_THAN_ZERO: &str = "must be greater than zero";

// ---------------------------------------------------------------------------------------
// Defaulting and create preparation
// ---------------------------------------------------------------------------------------

/// `SetDefaults_PersistentVolume`: reclaim policy Retain, volume mode Filesystem.
pub fn default_pv(o: &mut Obj) {
    if let Some(spec) = ensure(o, "spec") {
        default(spec, "persistentVolumeReclaimPolicy", "Retain");
        default(spec, "volumeMode", "Filesystem");
        quantity::canonicalize_list(spec.get_mut("capacity"));
        // SetDefaults_HostPathVolumeSource: the type is "" (no checks) when unset.
        if let Some(h) = spec.get_mut("hostPath").and_then(Value::as_object_mut) {
            h.entry("type").or_insert_with(|| "".into());
        }
    }
}

/// `SetDefaults_PersistentVolumeClaim`: volume mode Filesystem.
pub fn default_pvc(o: &mut Obj) {
    if let Some(spec) = ensure(o, "spec") {
        default(spec, "volumeMode", "Filesystem");
        if let Some(r) = spec.get_mut("resources").and_then(Value::as_object_mut) {
            quantity::canonicalize_list(r.get_mut("requests"));
            quantity::canonicalize_list(r.get_mut("limits"));
        }
    }
}

/// `SetDefaults_StorageClass`: reclaim policy Delete, binding mode Immediate.
pub fn default_storage_class(o: &mut Obj) {
    default(o, "reclaimPolicy", "Delete");
    default(o, "volumeBindingMode", "Immediate");
}

/// The strategies start a volume or claim `Pending` (the phase a read of the stored object
/// defaults).
pub fn prepare_create(o: &mut Obj) {
    o.insert("status".into(), json!({"phase": "Pending"}));
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

fn access_modes(modes: &[String], path: &Path, errs: &mut ErrorList, required: &str) {
    if modes.is_empty() {
        errs.push(FieldError::required(path, required));
    }
    for m in modes {
        if !ACCESS_MODES.contains(&m.as_str()) {
            errs.push(FieldError::not_supported(path, m.as_str(), ACCESS_MODES));
        }
    }
    if modes.iter().any(|m| m == "ReadWriteOncePod")
        && modes.iter().any(|m| m != "ReadWriteOncePod" && ACCESS_MODES.contains(&m.as_str()))
    {
        errs.push(FieldError::forbidden(
            path,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

fn class_name(name: Option<&str>, path: &Path, errs: &mut ErrorList) {
    if let Some(n) = name.filter(|n| !n.is_empty()) {
        for m in names::is_dns1123_subdomain(n) {
            errs.push(FieldError::invalid(path, n, m));
        }
    }
}

fn volume_mode(mode: Option<&str>, path: &Path, errs: &mut ErrorList) {
    if let Some(m) = mode
        && !VOLUME_MODES.contains(&m)
    {
        errs.push(FieldError::not_supported(path, m, VOLUME_MODES));
    }
}

/// A storage size: well formed and above zero.
fn positive_quantity(q: &str, path: &Path, errs: &mut ErrorList) {
    match Quantity::parse(q) {
        None => errs.push(FieldError::invalid(path, q, quantity::QUANTITY_FORMAT_ERROR)),
        Some(v) if v.0 <= 0 => errs.push(FieldError::invalid(path, q, GREATER_THAN_ZERO)),
        Some(_) => {}
    }
}

/// An absolute path without `..` elements.
fn absolute_path(p: &str, path: &Path, errs: &mut ErrorList) {
    if !p.starts_with('/') {
        errs.push(FieldError::invalid(path, p, "must be an absolute path"));
    }
    no_backsteps(p, path, errs);
}

fn no_backsteps(p: &str, path: &Path, errs: &mut ErrorList) {
    if p.split('/').any(|part| part == "..") {
        errs.push(FieldError::invalid(path, p, "must not contain '..'"));
    }
}

/// `ValidatePersistentVolume` and, with `old`, `ValidatePersistentVolumeUpdate`.
pub fn validate_pv(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("", "v1", "PersistentVolume");
    let (n, o) = match typed_pair::<PersistentVolume>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    if sub == Some("status") {
        return errs;
    }
    let spec = n.spec.clone().unwrap_or_default();
    let sp = Path::root("spec");
    access_modes(
        spec.access_modes.as_deref().unwrap_or_default(),
        &sp.child("accessModes"),
        &mut errs,
        "",
    );
    let cp = sp.child("capacity");
    match &spec.capacity {
        None => errs.push(FieldError::required(&cp, "")),
        Some(c) if c.is_empty() => errs.push(FieldError::required(&cp, "")),
        Some(c) => {
            if !c.contains_key("storage") || c.len() > 1 {
                errs.push(FieldError::not_supported(&cp, json_value(c), &["storage"]));
            }
            if let Some(q) = c.get("storage") {
                positive_quantity(&q.0, &cp.key("storage"), &mut errs);
            }
        }
    }
    if let Some(p) = spec.persistent_volume_reclaim_policy.as_deref()
        && !PV_RECLAIM_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported(
            &sp.child("persistentVolumeReclaimPolicy"),
            p,
            PV_RECLAIM_POLICIES,
        ));
    }
    class_name(spec.storage_class_name.as_deref(), &sp.child("storageClassName"), &mut errs);
    volume_mode(spec.volume_mode.as_deref(), &sp.child("volumeMode"), &mut errs);
    let json_spec = new.get("spec").and_then(Value::as_object);
    let sources: Vec<&str> = PV_SOURCES
        .iter()
        .copied()
        .filter(|s| json_spec.and_then(|j| j.get(*s)).is_some_and(|v| !v.is_null()))
        .collect();
    match sources.as_slice() {
        [] => errs.push(FieldError::required(&sp, "must specify a volume type")),
        [_] => {}
        [_, rest @ ..] => {
            for s in rest {
                errs.push(FieldError::forbidden(
                    &sp.child(s),
                    "may not specify more than 1 volume type",
                ));
            }
        }
    }
    if let Some(h) = &spec.host_path {
        let hp = sp.child("hostPath");
        if h.path.is_empty() {
            errs.push(FieldError::required(&hp.child("path"), ""));
        } else {
            no_backsteps(&h.path, &hp.child("path"), &mut errs);
        }
        if let Some(t) = h.type_.as_deref()
            && !HOST_PATH_TYPES.contains(&t)
        {
            errs.push(FieldError::not_supported(&hp.child("type"), t, HOST_PATH_TYPES));
        }
    }
    if let Some(l) = &spec.local {
        let lp = sp.child("local").child("path");
        if l.path.is_empty() {
            errs.push(FieldError::required(&lp, ""));
        } else {
            no_backsteps(&l.path, &lp, &mut errs);
        }
        if spec.node_affinity.is_none() {
            errs.push(FieldError::required(
                &sp.child("nodeAffinity"),
                "Local volume requires node affinity",
            ));
        }
    }
    if let Some(nfs) = &spec.nfs {
        let np = sp.child("nfs");
        if nfs.server.is_empty() {
            errs.push(FieldError::required(&np.child("server"), ""));
        }
        if nfs.path.is_empty() {
            errs.push(FieldError::required(&np.child("path"), ""));
        } else {
            absolute_path(&nfs.path, &np.child("path"), &mut errs);
        }
    }
    if let Some(csi) = &spec.csi {
        let p = sp.child("csi");
        if csi.driver.is_empty() {
            errs.push(FieldError::required(&p.child("driver"), ""));
        }
        if csi.volume_handle.is_empty() {
            errs.push(FieldError::required(&p.child("volumeHandle"), ""));
        }
    }
    if let Some(required) = spec.node_affinity.as_ref().and_then(|a| a.required.as_ref())
        && required.node_selector_terms.is_empty()
    {
        errs.push(FieldError::required(
            &sp.child("nodeAffinity").child("required").child("nodeSelectorTerms"),
            "must have at least one node selector term",
        ));
    }
    if let Some(o) = &o {
        let old_spec = o.spec.clone().unwrap_or_default();
        // Compared as Go's Semantic.DeepEqual compares the structs: a member at its zero
        // value (false, "", 0, empty) equals an absent one.
        let source = |s: Option<&Value>| -> Vec<(&str, Value)> {
            let s = s.and_then(Value::as_object);
            PV_SOURCES
                .iter()
                .filter_map(|k| s.and_then(|s| s.get(*k)).map(|v| (*k, without_zeros(v))))
                .collect()
        };
        if source(new.get("spec")) != source(old.and_then(|o| o.get("spec"))) {
            errs.push(FieldError::forbidden(
                &sp.child("persistentvolumesource"),
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        // Upstream reports this one at the top-level path `volumeMode`.
        if spec.volume_mode != old_spec.volume_mode {
            errs.push(FieldError::invalid(
                &Path::root("volumeMode"),
                spec.volume_mode.as_deref().unwrap_or_default(),
                FIELD_IMMUTABLE,
            ));
        }
        if old_spec.node_affinity.is_some() && spec.node_affinity != old_spec.node_affinity {
            errs.push(FieldError::invalid(
                &sp.child("nodeAffinity"),
                json_value(&spec.node_affinity),
                FIELD_IMMUTABLE,
            ));
        }
    }
    errs
}

/// `v` without the members Go would leave at their zero value.
fn without_zeros(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), without_zeros(v)))
                .filter(|(_, v)| !is_zero(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_zeros).collect()),
        other => other.clone(),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
    }
}

/// `ValidatePersistentVolumeClaim` and, with `old`, `ValidatePersistentVolumeClaimUpdate`:
/// a claim's spec is fixed once created, except that binding sets `volumeName` and a bound
/// claim's storage request may grow.
pub fn validate_pvc(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("", "v1", "PersistentVolumeClaim");
    let (n, o) = match typed_pair::<PersistentVolumeClaim>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    if sub == Some("status") {
        return errs;
    }
    let spec = n.spec.clone().unwrap_or_default();
    let sp = Path::root("spec");
    access_modes(
        spec.access_modes.as_deref().unwrap_or_default(),
        &sp.child("accessModes"),
        &mut errs,
        "at least 1 access mode is required",
    );
    if let Some(sel) = &spec.selector {
        errs.extend(meta::validate_label_selector(sel, &sp.child("selector")));
    }
    class_name(spec.storage_class_name.as_deref(), &sp.child("storageClassName"), &mut errs);
    volume_mode(spec.volume_mode.as_deref(), &sp.child("volumeMode"), &mut errs);
    let rp = sp.child("resources").key("storage");
    let request = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
    };
    match request(&n) {
        None => errs.push(FieldError::required(&rp, "")),
        Some(q) => positive_quantity(&q, &rp, &mut errs),
    }
    if let Some(o) = &o {
        let mut old_spec = o.spec.clone().unwrap_or_default();
        let mut new_spec = spec.clone();
        // The binder sets volumeName once; a default class may be filled in later.
        if old_spec.volume_name.as_deref().unwrap_or_default().is_empty() {
            old_spec.volume_name = new_spec.volume_name.clone();
        }
        if old_spec.storage_class_name.is_none() {
            old_spec.storage_class_name = new_spec.storage_class_name.clone();
        }
        let bound = n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if bound {
            let old_req = old_spec.resources.as_ref().and_then(|r| r.requests.as_ref());
            let old_storage = old_req.and_then(|r| r.get("storage")).cloned();
            if let Some(reqs) = new_spec.resources.as_mut().and_then(|r| r.requests.as_mut()) {
                match old_storage {
                    Some(q) => reqs.insert("storage".into(), q),
                    None => reqs.remove("storage"),
                };
            }
        }
        if new_spec != old_spec {
            errs.push(FieldError::forbidden(
                &sp,
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ));
        }
        let size = |q: Option<String>| q.and_then(|q| Quantity::parse(&q)).map(|q| q.0);
        if let (Some(new_size), Some(old_size)) = (size(request(&n)), size(request(o)))
            && new_size < old_size
        {
            errs.push(FieldError::forbidden(
                &sp.child("resources").child("requests").child("storage"),
                "field can not be less than previous value",
            ));
        }
    }
    errs
}

/// `ValidateStorageClass` and, with `old`, `ValidateStorageClassUpdate`.
pub fn validate_storage_class(new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("storage.k8s.io", "v1", "StorageClass");
    let (n, o) = match typed_pair::<StorageClass>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    let pp = Path::root("provisioner");
    if n.provisioner.is_empty() {
        errs.push(FieldError::required(&pp, ""));
    } else {
        for m in names::is_qualified_name(&n.provisioner.to_lowercase()) {
            errs.push(FieldError::invalid(&pp, n.provisioner.as_str(), m));
        }
    }
    if let Some(p) = n.reclaim_policy.as_deref()
        && !SC_RECLAIM_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported(&Path::root("reclaimPolicy"), p, SC_RECLAIM_POLICIES));
    }
    let bp = Path::root("volumeBindingMode");
    match n.volume_binding_mode.as_deref() {
        None => errs.push(FieldError::required(&bp, "")),
        Some(m) if !BINDING_MODES.contains(&m) => {
            errs.push(FieldError::not_supported(&bp, m, BINDING_MODES));
        }
        Some(_) => {}
    }
    if let Some(o) = &o {
        if n.parameters != o.parameters {
            errs.push(FieldError::forbidden(
                &Path::root("parameters"),
                "updates to parameters are forbidden.",
            ));
        }
        if n.provisioner != o.provisioner {
            errs.push(FieldError::forbidden(&pp, "updates to provisioner are forbidden."));
        }
        if n.reclaim_policy != o.reclaim_policy {
            errs.push(FieldError::forbidden(
                &Path::root("reclaimPolicy"),
                "updates to reclaimPolicy are forbidden.",
            ));
        }
        if n.volume_binding_mode != o.volume_binding_mode {
            errs.push(FieldError::invalid(
                &bp,
                n.volume_binding_mode.as_deref().unwrap_or_default(),
                FIELD_IMMUTABLE,
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
    }

    #[test]
    fn volumes_need_modes_capacity_and_one_source() {
        let pv = json!({"metadata": {"name": "v"}, "spec": {
            "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem"}});
        let m = messages(&validate_pv(None, &pv, None));
        assert_eq!(
            m,
            [
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                "spec: Required value: must specify a volume type",
            ],
        );
        let pv = json!({"metadata": {"name": "v"}, "spec": {
            "accessModes": ["ReadWriteOnce", "ReadWriteOncePod"],
            "capacity": {"storage": "0"},
            "hostPath": {"path": "/data"}, "nfs": {"server": "s", "path": "x"},
            "persistentVolumeReclaimPolicy": "Keep", "volumeMode": "Filesystem"}});
        let m = messages(&validate_pv(None, &pv, None));
        assert!(m.contains(&"spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes".to_string()), "{m:?}");
        assert!(
            m.contains(
                &"spec.capacity[storage]: Invalid value: \"0\": must be greater than zero"
                    .to_string()
            ),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.nfs: Forbidden: may not specify more than 1 volume type".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(
                &"spec.nfs.path: Invalid value: \"x\": must be an absolute path".to_string()
            ),
            "{m:?}"
        );
        assert!(
            m.iter().any(|e| e
                .starts_with("spec.persistentVolumeReclaimPolicy: Unsupported value: \"Keep\"")),
            "{m:?}"
        );
    }

    #[test]
    fn a_volume_source_is_fixed_once_created() {
        let pv = |path: &str| {
            json!({"metadata": {"name": "v", "resourceVersion": "1"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                "hostPath": {"path": path}, "persistentVolumeReclaimPolicy": "Retain",
                "volumeMode": "Filesystem"}})
        };
        assert!(validate_pv(None, &pv("/a"), Some(&pv("/a"))).is_empty());
        // Zero values equal absent ones.
        let mut same = pv("/a");
        same["spec"]["hostPath"]["type"] = json!("");
        assert!(validate_pv(None, &same, Some(&pv("/a"))).is_empty());
        let m = messages(&validate_pv(None, &pv("/b"), Some(&pv("/a"))));
        assert_eq!(
            m,
            [
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
            ]
        );
    }

    #[test]
    fn claims_need_a_size_and_keep_their_spec() {
        let pvc = |size: Option<&str>, volume: &str, phase: &str| {
            let mut c = json!({"metadata": {"name": "c", "namespace": "d", "resourceVersion": "1"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                         "resources": {"requests": {}}},
                "status": {"phase": phase}});
            if let Some(s) = size {
                c["spec"]["resources"]["requests"]["storage"] = json!(s);
            }
            if !volume.is_empty() {
                c["spec"]["volumeName"] = json!(volume);
            }
            c
        };
        let m = messages(&validate_pvc(None, &pvc(None, "", "Pending"), None));
        assert_eq!(m, ["spec.resources[storage]: Required value"]);
        let old = pvc(Some("1Gi"), "", "Pending");
        // Binding sets volumeName; growing a pending claim is a spec change.
        assert!(validate_pvc(None, &pvc(Some("1Gi"), "v1", "Pending"), Some(&old)).is_empty());
        let m = messages(&validate_pvc(None, &pvc(Some("2Gi"), "", "Pending"), Some(&old)));
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].starts_with("spec: Forbidden: spec is immutable after creation"), "{m:?}");
        // A bound claim may grow, never shrink.
        let bound = pvc(Some("1Gi"), "v1", "Bound");
        assert!(validate_pvc(None, &pvc(Some("2Gi"), "v1", "Bound"), Some(&bound)).is_empty());
        let m = messages(&validate_pvc(None, &pvc(Some("512Mi"), "v1", "Bound"), Some(&bound)));
        assert_eq!(
            m,
            [
                "spec.resources.requests.storage: Forbidden: field can not be less than previous value"
            ]
        );
    }

    #[test]
    fn storage_classes_keep_their_provisioner_and_parameters() {
        let mut sc = json!({"metadata": {"name": "fast"}, "provisioner": "skiff.io/hostpath",
                            "parameters": {"a": "1"}});
        default_storage_class(sc.as_object_mut().unwrap());
        assert_eq!(sc["reclaimPolicy"], "Delete");
        assert_eq!(sc["volumeBindingMode"], "Immediate");
        assert!(validate_storage_class(&sc, None).is_empty());
        let mut changed = sc.clone();
        changed["parameters"]["a"] = json!("2");
        changed["provisioner"] = json!("other.io/x");
        let m = messages(&validate_storage_class(&changed, Some(&sc)));
        assert_eq!(
            m,
            [
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
            ]
        );
    }
}
