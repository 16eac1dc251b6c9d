//! The smaller core/v1 kinds: Namespace, Node, Endpoints, ConfigMap, Secret,
//! ServiceAccount, Event and the pods/binding body (defaults and validation as upstream).

use std::collections::HashSet;
use std::net::IpAddr;

use base64::Engine;
use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, EndpointAddress, Endpoints, Event, LimitRange, Namespace, Node,
    ResourceQuota, Secret, ServiceAccount,
};
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, Raw, go_string_list, json_value};
use super::kind::{Gvk, typed, validate_meta};
use super::meta::FIELD_IMMUTABLE;
use super::names;
use super::pod::{validate_protocol, validate_taint_effect};
use super::value::{self, Obj, default, each, ensure};
use skiff_core::quantity;

/// Upstream `MaxSecretSize` (also the ConfigMap limit).
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;
const IMMUTABLE_SET: &str = "field is immutable when `immutable` is set";

// ---------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------

/// A ResourceQuota's amounts in upstream's canonical form (`1024Mi` is stored as `1Gi`).
pub fn default_resource_quota(o: &mut Obj) {
    for path in [["spec", "hard"], ["status", "hard"], ["status", "used"]] {
        let map =
            o.get_mut(path[0]).and_then(|v| v.get_mut(path[1])).and_then(Value::as_object_mut);
        for v in map.into_iter().flat_map(|m| m.values_mut()) {
            quantity::canonicalize(Some(v));
        }
    }
}

/// `SetDefaults_LimitRangeItem`: a Container item's default limit is its max, its default
/// request its default limit, else its min.
pub fn default_limit_range(o: &mut Obj) {
    let Some(items) =
        o.get_mut("spec").and_then(|s| s.get_mut("limits")).and_then(Value::as_array_mut)
    else {
        return;
    };
    for item in items.iter_mut().filter_map(Value::as_object_mut) {
        for field in ["min", "max", "default", "defaultRequest", "maxLimitRequestRatio"] {
            let map = item.get_mut(field).and_then(Value::as_object_mut);
            for v in map.into_iter().flat_map(|m| m.values_mut()) {
                quantity::canonicalize(Some(v));
            }
        }
        if item.get("type").and_then(Value::as_str) != Some("Container") {
            continue;
        }
        let fill = |item: &mut Obj, to: &str, from: &str| {
            let source = item.get(from).and_then(Value::as_object).cloned().unwrap_or_default();
            let target = item.entry(to).or_insert_with(|| json!({}));
            if let Some(target) = target.as_object_mut() {
                for (k, v) in source {
                    target.entry(k).or_insert(v);
                }
            }
        };
        fill(item, "default", "max");
        fill(item, "defaultRequest", "default");
        fill(item, "defaultRequest", "min");
    }
}

/// `SetDefaults_Namespace`: the `kubernetes.io/metadata.name` label; status phase Active.
pub fn default_namespace(o: &mut Obj) {
    if let Some(m) = ensure(o, "metadata") {
        let name = value::str_of(m, "name").to_string();
        if !name.is_empty()
            && let Some(labels) = ensure(m, "labels")
        {
            labels.insert("kubernetes.io/metadata.name".into(), name.into());
        }
    }
    if let Some(st) = ensure(o, "status") {
        default(st, "phase", "Active");
    }
}

/// Namespace `PrepareForCreate`: status Active and the `kubernetes` finalizer.
pub fn prepare_namespace_create(o: &mut Obj) {
    o.insert("status".into(), json!({"phase": "Active"}));
    if let Some(spec) = ensure(o, "spec") {
        let list = spec.entry("finalizers").or_insert_with(|| Value::Array(Vec::new()));
        if list.is_null() {
            *list = Value::Array(Vec::new());
        }
        if let Some(list) = list.as_array_mut()
            && !list.iter().any(|f| f == "kubernetes")
        {
            list.push("kubernetes".into());
        }
    }
}

/// Namespace `PrepareForUpdate`: finalizers only change through `/finalize`.
pub fn prepare_namespace_update(n: &mut Obj, o: &Obj) {
    let old = o.get("spec").and_then(|s| s.get("finalizers")).cloned();
    if let Some(spec) = ensure(n, "spec") {
        match old {
            Some(f) => spec.insert("finalizers".into(), f),
            None => spec.remove("finalizers"),
        };
    }
}

/// `SetDefaults_Secret` (type Opaque) and the v1 conversion of `stringData` into `data`.
pub fn default_secret(o: &mut Obj) {
    default(o, "type", "Opaque");
    if let Some(Value::Object(sd)) = o.remove("stringData")
        && let Some(data) = ensure(o, "data")
    {
        for (k, v) in sd {
            let s = v.as_str().unwrap_or_default();
            let enc = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
            data.insert(k, enc.into());
        }
    }
}

/// Node: `podCIDR` and `podCIDRs[0]` agree (v1 conversion); allocatable defaults to
/// capacity (`SetDefaults_NodeStatus`).
pub fn default_node(o: &mut Obj) {
    if let Some(spec) = value::child(o, "spec") {
        let cidr = value::str_of(spec, "podCIDR").to_string();
        let first = spec
            .get("podCIDRs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .map(str::to_string);
        match (cidr.is_empty(), first) {
            (false, None) => {
                spec.insert("podCIDRs".into(), json!([cidr]));
            }
            (true, Some(f)) => {
                spec.insert("podCIDR".into(), f.into());
            }
            _ => {}
        }
    }
    if let Some(st) = value::child(o, "status") {
        quantity::canonicalize_list(st.get_mut("capacity"));
        quantity::canonicalize_list(st.get_mut("allocatable"));
        if !value::is_set(st, "allocatable")
            && let Some(cap) = st.get("capacity").cloned()
        {
            st.insert("allocatable".into(), cap);
        }
    }
}

/// `SetDefaults_EndpointPort`: protocol TCP.
pub fn default_endpoints(o: &mut Obj) {
    for ss in each(o, "subsets") {
        for p in each(ss, "ports") {
            default(p, "protocol", "TCP");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

fn gvk(kind: &str) -> Gvk<'_> {
    Gvk::new("", "v1", kind)
}

fn decode<T: serde::de::DeserializeOwned>(
    new: &Value,
    old: Option<&Value>,
) -> Result<(T, Option<T>), ErrorList> {
    let n = typed(new)?;
    let o = old.map(typed).transpose()?;
    Ok((n, o))
}

pub fn validate(kind: &str, new: &Value, old: Option<&Value>) -> ErrorList {
    let r = match kind {
        "Namespace" => {
            decode::<Namespace>(new, old).map(|(n, o)| validate_namespace(&n, o.as_ref()))
        }
        "Node" => decode::<Node>(new, old).map(|(n, o)| validate_node(&n, o.as_ref())),
        "ConfigMap" => {
            decode::<ConfigMap>(new, old).map(|(n, o)| validate_config_map(&n, o.as_ref()))
        }
        "Secret" => decode::<Secret>(new, old).map(|(n, o)| validate_secret(&n, o.as_ref())),
        "ServiceAccount" => decode::<ServiceAccount>(new, old)
            .map(|(n, o)| validate_meta(gvk(kind), &n.metadata, o.as_ref().map(|o| &o.metadata))),
        "Endpoints" => {
            decode::<Endpoints>(new, old).map(|(n, o)| validate_endpoints(&n, o.as_ref()))
        }
        "Event" => decode::<Event>(new, old).map(|(n, o)| validate_event(&n, o.as_ref())),
        "ResourceQuota" => {
            decode::<ResourceQuota>(new, old).map(|(n, o)| validate_resource_quota(&n, o.as_ref()))
        }
        "LimitRange" => {
            decode::<LimitRange>(new, old).map(|(n, o)| validate_limit_range(&n, o.as_ref()))
        }
        _ => Ok(ErrorList::new()),
    };
    r.unwrap_or_else(|e| e)
}

fn validate_namespace(ns: &Namespace, old: Option<&Namespace>) -> ErrorList {
    let mut errs = validate_meta(gvk("Namespace"), &ns.metadata, old.map(|o| &o.metadata));
    let fp = Path::root("spec").child("finalizers");
    for f in ns.spec.iter().flat_map(|s| s.finalizers.iter().flatten()) {
        let msgs = names::is_qualified_name(f);
        if !msgs.is_empty() {
            for m in msgs {
                errs.push(FieldError::invalid(&fp, f, m));
            }
        } else if !f.contains('/') && f != "kubernetes" {
            errs.push(FieldError::invalid(
                &fp,
                f,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    if old.is_some() {
        let phase = ns.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
        let deleting = ns.metadata.deletion_timestamp.is_some();
        let pp = Path::root("status").child("Phase");
        if !deleting && phase != "Active" && !phase.is_empty() {
            errs.push(FieldError::invalid(
                &pp,
                phase,
                "may only be 'Active' if `deletionTimestamp` is empty",
            ));
        } else if deleting && phase != "Terminating" {
            errs.push(FieldError::invalid(
                &pp,
                phase,
                "may only be 'Terminating' if `deletionTimestamp` is not empty",
            ));
        }
    }
    errs
}

fn validate_node(node: &Node, old: Option<&Node>) -> ErrorList {
    let mut errs = validate_meta(gvk("Node"), &node.metadata, old.map(|o| &o.metadata));
    let spec = node.spec.clone().unwrap_or_default();
    // Upstream reports taints under `metadata` (its path is built from the meta path).
    let tp = Path::root("metadata").child("taints");
    let mut seen = HashSet::new();
    for (i, t) in spec.taints.iter().flatten().enumerate() {
        let p = tp.index(i);
        for m in names::is_qualified_name(&t.key) {
            errs.push(FieldError::invalid(&p.child("key"), &t.key, m));
        }
        let v = t.value.as_deref().unwrap_or_default();
        let msgs = names::is_valid_label_value(v);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(&p.child("value"), v, msgs.join(";")));
        }
        if t.effect.is_empty() {
            errs.push(FieldError::required(&p.child("effect"), ""));
        } else {
            validate_taint_effect(&t.effect, &p.child("effect"), &mut errs);
        }
        if !seen.insert((t.effect.clone(), t.key.clone())) {
            let mut e = FieldError::duplicate(&p, json_value(t));
            e.detail = "taints must be unique by key and effect pair".into();
            errs.push(e);
        }
    }
    let cp = Path::root("spec").child("podCIDRs");
    let cidrs = spec.pod_cidrs.as_deref().unwrap_or_default();
    let mut parsed = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        match names::parse_cidr(c) {
            Some((ip, _)) => parsed.push(ip),
            None => errs.push(FieldError::invalid(&cp.index(i), c, names::CIDR_ERROR)),
        }
    }
    if cidrs.len() > 1 {
        let dual = parsed.len() == 2 && parsed[0].is_ipv4() != parsed[1].is_ipv4();
        if !dual || cidrs.len() > 2 {
            errs.push(FieldError::invalid(
                &cp,
                go_string_list(cidrs),
                "may specify no more than one CIDR for each IP family",
            ));
        }
    }
    if let Some(old_spec) = old.and_then(|o| o.spec.as_ref()) {
        let old_cidrs = old_spec.pod_cidrs.as_deref().unwrap_or_default();
        if !old_cidrs.is_empty() && old_cidrs != cidrs {
            errs.push(FieldError::forbidden(
                &cp,
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        let old_pid = old_spec.provider_id.as_deref().unwrap_or_default();
        if !old_pid.is_empty() && spec.provider_id.as_deref().unwrap_or_default() != old_pid {
            errs.push(FieldError::forbidden(
                &Path::root("spec").child("providerID"),
                "node updates may not change providerID except from \"\" to valid",
            ));
        }
    }
    errs
}

/// Upstream's standard quota resource names (`IsStandardQuotaResourceName`); other names
/// must be qualified with a `/` (`count/deployments.apps`, `example.com/gpu`).
const QUOTA_RESOURCES: [&str; 19] = [
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
];

/// Resources counted in whole objects (upstream's `IsIntegerResourceName`).
fn integer_quota_resource(name: &str) -> bool {
    QUOTA_RESOURCES[..9].contains(&name)
        || name.starts_with("count/")
        || name.ends_with(".storageclass.storage.k8s.io/persistentvolumeclaims")
}

/// Upstream `ValidateResourceQuota`: standard or qualified resource names, non-negative
/// (and for counts whole) amounts, known and compatible scopes; status like spec.
fn validate_resource_quota(rq: &ResourceQuota, old: Option<&ResourceQuota>) -> ErrorList {
    let mut errs = validate_meta(gvk("ResourceQuota"), &rq.metadata, old.map(|o| &o.metadata));
    let spec = rq.spec.clone().unwrap_or_default();
    let amounts = |errs: &mut ErrorList, path: &Path, map: Option<&ResourceList>| {
        for (k, v) in map.into_iter().flatten() {
            let p = path.key(k);
            if !k.contains('/')
                && !QUOTA_RESOURCES.contains(&k.as_str())
                && !k.starts_with("hugepages-")
                && !k.starts_with("requests.hugepages-")
            {
                errs.push(FieldError::invalid(
                    &p,
                    k.as_str(),
                    "must be a standard resource for quota",
                ));
            } else {
                for m in names::is_qualified_name(k) {
                    errs.push(FieldError::invalid(&p, k.as_str(), m));
                }
            }
            if let Some(q) = super::pod::validate_quantity(&v.0, &p, errs)
                && integer_quota_resource(k)
                && q.0 % 1_000_000_000 != 0
            {
                errs.push(FieldError::invalid(&p, v.0.as_str(), "must be an integer"));
            }
        }
    };
    amounts(&mut errs, &Path::root("spec").child("hard"), spec.hard.as_ref());
    if let Some(status) = &rq.status {
        amounts(&mut errs, &Path::root("status").child("hard"), status.hard.as_ref());
        amounts(&mut errs, &Path::root("status").child("used"), status.used.as_ref());
    }
    let scopes = spec.scopes.clone().unwrap_or_default();
    let sp = Path::root("spec").child("scopes");
    // Upstream prints the whole list as Go syntax.
    let quoted: Vec<String> = scopes.iter().map(|s| super::field::go_quote(s)).collect();
    let shown = || Raw(format!("[]core.ResourceQuotaScope{{{}}}", quoted.join(", ")));
    const SCOPES: [&str; 6] = [
        "Terminating",
        "NotTerminating",
        "BestEffort",
        "NotBestEffort",
        "PriorityClass",
        "CrossNamespacePodAffinity",
    ];
    for scope in &scopes {
        if !SCOPES.contains(&scope.as_str()) {
            errs.push(FieldError::invalid(&sp, shown(), "unsupported scope"));
        }
        // BestEffort pods request nothing: only their count can be limited.
        for k in spec.hard.iter().flat_map(|h| h.keys()) {
            let pod_count = matches!(k.as_str(), "pods" | "count/pods");
            let compute = QUOTA_RESOURCES[9..].contains(&k.as_str()) && k != "requests.storage";
            let valid = match scope.as_str() {
                "BestEffort" => pod_count,
                _ if SCOPES.contains(&scope.as_str()) => pod_count || compute,
                _ => true,
            };
            if QUOTA_RESOURCES.contains(&k.as_str()) && !valid {
                errs.push(FieldError::invalid(
                    &sp,
                    shown(),
                    "unsupported scope applied to resource",
                ));
            }
        }
    }
    let has = |s: &str| scopes.iter().any(|x| x == s);
    if has("BestEffort") && has("NotBestEffort") || has("Terminating") && has("NotTerminating") {
        errs.push(FieldError::invalid(&sp, shown(), "conflicting scopes"));
    }
    errs
}

/// A `ResourceList`: resource name to quantity.
type ResourceList =
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// Upstream `ValidateLimitRange`: known types, valid resource names and quantities, a Pod
/// item without defaults, and for each resource min <= default request <= default <= max.
fn validate_limit_range(lr: &LimitRange, old: Option<&LimitRange>) -> ErrorList {
    use quantity::Quantity;
    let mut errs = validate_meta(gvk("LimitRange"), &lr.metadata, old.map(|o| &o.metadata));
    let lp = Path::root("spec").child("limits");
    for (i, item) in lr.spec.iter().flat_map(|s| s.limits.iter()).enumerate() {
        let ip = lp.index(i);
        let ty = item.type_.as_str();
        if !matches!(ty, "Pod" | "Container" | "PersistentVolumeClaim") {
            errs.push(FieldError::not_supported(
                &ip.child("type"),
                ty,
                &["Container", "PersistentVolumeClaim", "Pod"],
            ));
        }
        let maps = [
            ("min", item.min.as_ref()),
            ("max", item.max.as_ref()),
            ("default", item.default.as_ref()),
            ("defaultRequest", item.default_request.as_ref()),
            ("maxLimitRequestRatio", item.max_limit_request_ratio.as_ref()),
        ];
        for (field, map) in maps {
            for (k, v) in map.into_iter().flatten() {
                let p = ip.child(field).key(k);
                for m in names::is_qualified_name(k) {
                    errs.push(FieldError::invalid(&p, k.as_str(), m));
                }
                super::pod::validate_quantity(&v.0, &p, &mut errs);
            }
        }
        if ty == "Pod" {
            if item.default.as_ref().is_some_and(|d| !d.is_empty()) {
                errs.push(FieldError::forbidden(
                    &ip.child("default"),
                    "may not be specified when `type` is 'Pod'",
                ));
            }
            if item.default_request.as_ref().is_some_and(|d| !d.is_empty()) {
                errs.push(FieldError::forbidden(
                    &ip.child("defaultRequest"),
                    "may not be specified when `type` is 'Pod'",
                ));
            }
        }
        let get = |map: Option<&ResourceList>, k: &str| {
            map.and_then(|m| m.get(k)).and_then(|q| Quantity::parse(&q.0).map(|p| (p, q.0.clone())))
        };
        let mut keys: Vec<&String> =
            maps[..4].iter().flat_map(|(_, m)| m.iter().flat_map(|m| m.keys())).collect();
        keys.sort();
        keys.dedup();
        // Upstream's order of checks: (lower, higher, field reported, report the lower
        // value?, names in the message).
        const ORDER: [(usize, usize, &str, bool, &str, &str); 6] = [
            (0, 1, "min", true, "min", "max"),
            (0, 3, "defaultRequest", false, "min", "default request"),
            (3, 1, "defaultRequest", true, "default request", "max"),
            (3, 2, "defaultRequest", true, "default request", "default limit"),
            (0, 2, "default", true, "min", "default"),
            (2, 1, "default", false, "default", "max"),
        ];
        for k in keys {
            // min, max, default, defaultRequest
            let values: Vec<_> = maps[..4].iter().map(|(_, m)| get(*m, k)).collect();
            for (lower, higher, field, report_lower, lower_name, higher_name) in ORDER {
                let (Some(low), Some(high)) = (&values[lower], &values[higher]) else { continue };
                if low.0 > high.0 {
                    let shown = if report_lower { &low.1 } else { &high.1 };
                    errs.push(FieldError::invalid(
                        &ip.child(field).key(k),
                        shown.as_str(),
                        format!(
                            "{lower_name} value {} is greater than {higher_name} value {}",
                            low.1, high.1
                        ),
                    ));
                }
            }
        }
    }
    errs
}

fn validate_config_map(cm: &ConfigMap, old: Option<&ConfigMap>) -> ErrorList {
    let mut errs = ErrorList::new();
    if let Some(old) = old
        && old.immutable == Some(true)
    {
        if cm.immutable != Some(true) {
            errs.push(FieldError::forbidden(&Path::root("immutable"), IMMUTABLE_SET));
        }
        if cm.data.as_ref().filter(|d| !d.is_empty()) != old.data.as_ref().filter(|d| !d.is_empty())
        {
            errs.push(FieldError::forbidden(&Path::root("data"), IMMUTABLE_SET));
        }
        if cm.binary_data.as_ref().filter(|d| !d.is_empty())
            != old.binary_data.as_ref().filter(|d| !d.is_empty())
        {
            errs.push(FieldError::forbidden(&Path::root("binaryData"), IMMUTABLE_SET));
        }
    }
    errs.extend(validate_meta(gvk("ConfigMap"), &cm.metadata, old.map(|o| &o.metadata)));
    let mut total = 0usize;
    let dp = Path::root("data");
    for (k, v) in cm.data.iter().flatten() {
        for m in names::is_config_map_key(k) {
            errs.push(FieldError::invalid(&dp.key(k), k, m));
        }
        if cm.binary_data.as_ref().is_some_and(|b| b.contains_key(k)) {
            errs.push(FieldError::invalid(&dp.key(k), k, "duplicate of key present in binaryData"));
        }
        total += v.len();
    }
    let bp = Path::root("binaryData");
    for (k, v) in cm.binary_data.iter().flatten() {
        for m in names::is_config_map_key(k) {
            errs.push(FieldError::invalid(&bp.key(k), k, m));
        }
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(&Path::root(""), MAX_SECRET_SIZE));
    }
    errs
}

fn validate_secret(s: &Secret, old: Option<&Secret>) -> ErrorList {
    let mut errs = ErrorList::new();
    if let Some(old) = old {
        if s.type_ != old.type_ {
            errs.push(FieldError::invalid(
                &Path::root("type"),
                s.type_.as_deref().unwrap_or_default(),
                FIELD_IMMUTABLE,
            ));
        }
        if old.immutable == Some(true) {
            if s.immutable != Some(true) {
                errs.push(FieldError::forbidden(&Path::root("immutable"), IMMUTABLE_SET));
            }
            if s.data.as_ref().filter(|d| !d.is_empty())
                != old.data.as_ref().filter(|d| !d.is_empty())
            {
                errs.push(FieldError::forbidden(&Path::root("data"), IMMUTABLE_SET));
            }
        }
    }
    errs.extend(validate_meta(gvk("Secret"), &s.metadata, old.map(|o| &o.metadata)));
    let dp = Path::root("data");
    let empty = Default::default();
    let data = s.data.as_ref().unwrap_or(&empty);
    let mut total = 0usize;
    for (k, v) in data {
        for m in names::is_config_map_key(k) {
            errs.push(FieldError::invalid(&dp.key(k), k, m));
        }
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(&dp, MAX_SECRET_SIZE));
    }
    let has = |k: &str| data.contains_key(k);
    match s.type_.as_deref().unwrap_or_default() {
        "kubernetes.io/service-account-token" => {
            let name = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/service-account.name"))
                .map(String::as_str)
                .unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(
                    &Path::root("metadata")
                        .child("annotations")
                        .key("kubernetes.io/service-account.name"),
                    "",
                ));
            }
        }
        t @ ("kubernetes.io/dockercfg" | "kubernetes.io/dockerconfigjson") => {
            let key =
                if t == "kubernetes.io/dockercfg" { ".dockercfg" } else { ".dockerconfigjson" };
            match data.get(key) {
                None => errs.push(FieldError::required(&dp.key(key), "")),
                Some(b) => {
                    if let Err(e) = serde_json::from_slice::<serde_json::Map<String, Value>>(&b.0) {
                        errs.push(FieldError::invalid(
                            &dp.key(key),
                            "<secret contents redacted>",
                            e.to_string(),
                        ));
                    }
                }
            }
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errs.push(FieldError::required(&dp.key("username"), ""));
            errs.push(FieldError::required(&dp.key("password"), ""));
        }
        "kubernetes.io/ssh-auth" if data.get("ssh-privatekey").is_none_or(|v| v.0.is_empty()) => {
            errs.push(FieldError::required(&dp.key("ssh-privatekey"), ""));
        }
        "kubernetes.io/tls" => {
            if !has("tls.crt") {
                errs.push(FieldError::required(&dp.key("tls.crt"), ""));
            }
            if !has("tls.key") {
                errs.push(FieldError::required(&dp.key("tls.key"), ""));
            }
        }
        _ => {}
    }
    errs
}

fn validate_endpoints(ep: &Endpoints, old: Option<&Endpoints>) -> ErrorList {
    let mut errs = validate_meta(gvk("Endpoints"), &ep.metadata, old.map(|o| &o.metadata));
    let sp = Path::root("subsets");
    for (i, ss) in ep.subsets.iter().flatten().enumerate() {
        let p = sp.index(i);
        let addrs = ss.addresses.as_deref().unwrap_or_default();
        let not_ready = ss.not_ready_addresses.as_deref().unwrap_or_default();
        if addrs.is_empty() && not_ready.is_empty() {
            errs.push(FieldError::required(&p, "must specify `addresses` or `notReadyAddresses`"));
        }
        for (name, list) in [("addresses", addrs), ("notReadyAddresses", not_ready)] {
            for (j, a) in list.iter().enumerate() {
                validate_endpoint_address(a, &p.child(name).index(j), &mut errs);
            }
        }
        let ports = ss.ports.as_deref().unwrap_or_default();
        for (j, port) in ports.iter().enumerate() {
            let pp = p.child("ports").index(j);
            let name = port.name.as_deref().unwrap_or_default();
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(&pp.child("name"), ""));
            } else if !name.is_empty() {
                for m in names::is_dns1123_label(name) {
                    errs.push(FieldError::invalid(&pp.child("name"), name, m));
                }
            }
            for m in names::is_valid_port_num(i64::from(port.port)) {
                errs.push(FieldError::invalid(&pp.child("port"), port.port, m));
            }
            validate_protocol(port.protocol.as_deref(), &pp.child("protocol"), &mut errs);
        }
    }
    errs
}

fn validate_endpoint_address(a: &EndpointAddress, p: &Path, errs: &mut ErrorList) {
    let ip_path = p.child("ip");
    match names::parse_ip(&a.ip) {
        None => {
            errs.push(FieldError::invalid(&ip_path, &a.ip, names::IP_ERROR));
            errs.push(FieldError::invalid(&ip_path, &a.ip, "must be a valid IP address"));
        }
        Some(ip) => non_special_ip(ip, &a.ip, &ip_path, errs),
    }
    if let Some(h) = a.hostname.as_deref().filter(|h| !h.is_empty()) {
        for m in names::is_dns1123_label(h) {
            errs.push(FieldError::invalid(&p.child("hostname"), h, m));
        }
    }
    if let Some(n) = a.node_name.as_deref() {
        for m in names::is_dns1123_subdomain(n) {
            errs.push(FieldError::invalid(&p.child("nodeName"), n, m));
        }
    }
}

/// Upstream `ValidateNonSpecialIP`.
pub fn non_special_ip(ip: IpAddr, raw: &str, path: &Path, errs: &mut ErrorList) {
    if ip.is_unspecified() {
        errs.push(FieldError::invalid(path, raw, format!("may not be unspecified ({raw})")));
    }
    if ip.is_loopback() {
        errs.push(FieldError::invalid(
            path,
            raw,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ));
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        errs.push(FieldError::invalid(
            path,
            raw,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ));
    }
    let ll_multicast = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            o[0] == 224 && o[1] == 0 && o[2] == 0
        }
        IpAddr::V6(v6) => (v6.segments()[0] & 0xff0f) == 0xff02,
    };
    if ll_multicast {
        errs.push(FieldError::invalid(
            path,
            raw,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        ));
    }
}

/// core/v1 Event (upstream `legacyValidateEvent` for v1 requests, then the generic meta
/// checks every registry runs).
fn validate_event(ev: &Event, old: Option<&Event>) -> ErrorList {
    let mut errs = ErrorList::new();
    let ns = ev.metadata.namespace.as_deref().unwrap_or_default();
    let inv_ns = ev.involved_object.namespace.as_deref().unwrap_or_default();
    let inp = Path::root("involvedObject").child("namespace");
    if ev.event_time.is_none() {
        if inv_ns.is_empty() {
            if !ns.is_empty() && ns != "default" {
                errs.push(FieldError::invalid(&inp, inv_ns, "does not match event.namespace"));
            }
        } else if ns != inv_ns {
            errs.push(FieldError::invalid(&inp, inv_ns, "does not match event.namespace"));
        }
    } else {
        if inv_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(FieldError::invalid(&inp, inv_ns, "does not match event.namespace"));
        }
        let rc = ev.reporting_component.as_deref().unwrap_or_default();
        if rc.is_empty() {
            errs.push(FieldError::required(&Path::root("source"), ""));
        }
        for m in names::is_qualified_name(rc) {
            errs.push(FieldError::invalid(&Path::root("source"), rc, m));
        }
        for (v, name, limit, required) in [
            (ev.reporting_instance.as_deref(), "reportingInstance", 128, true),
            (ev.action.as_deref(), "action", 128, true),
            (ev.reason.as_deref(), "reason", 128, true),
            (ev.message.as_deref(), "message", 1024, false),
        ] {
            let v = v.unwrap_or_default();
            if required && v.is_empty() {
                errs.push(FieldError::required(&Path::root(name), ""));
            }
            if v.len() > limit {
                errs.push(FieldError::invalid(
                    &Path::root(name),
                    "",
                    format!("can have at most {limit} characters"),
                ));
            }
        }
    }
    for m in names::is_dns1123_subdomain(ns) {
        errs.push(FieldError::invalid(&Path::root("namespace"), ns, m));
    }
    if errs.is_empty() {
        errs.extend(validate_meta(gvk("Event"), &ev.metadata, old.map(|o| &o.metadata)));
    }
    errs
}

/// `ValidatePodBinding`: the target is a Node by name.
pub fn validate_binding(new: &Value) -> ErrorList {
    let b: Binding = match typed(new) {
        Ok(b) => b,
        Err(e) => return e,
    };
    let mut errs = ErrorList::new();
    let kind = b.target.kind.as_deref().unwrap_or_default();
    if !kind.is_empty() && kind != "Node" {
        errs.push(FieldError::not_supported(
            &Path::root("target").child("kind"),
            kind,
            &["Node", "<empty>"],
        ));
    }
    if b.target.name.as_deref().unwrap_or_default().is_empty() {
        errs.push(FieldError::required(&Path::root("target").child("name"), ""));
    }
    errs
}
