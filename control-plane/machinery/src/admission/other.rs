//! discovery.k8s.io/v1 EndpointSlice, coordination.k8s.io/v1 Lease, scheduling.k8s.io/v1
//! PriorityClass and the rbac.authorization.k8s.io/v1 kinds: defaults and validation as
//! upstream.

use std::collections::HashSet;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde_json::Value;

use super::core::non_special_ip;
use super::field::{ErrorList, FieldError, Path, Raw, go_string_list, json_value};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::{self, FIELD_IMMUTABLE};
use super::names;
use super::pod::validate_protocol;
use super::value::{self, Obj, default, default_ptr, each, ensure};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

// ---------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------

/// `SetDefaults_PriorityClass`: preemptionPolicy PreemptLowerPriority.
pub fn default_priority_class(o: &mut Obj) {
    default_ptr(o, "preemptionPolicy", "PreemptLowerPriority");
}

/// The classes the apiserver creates at start, and the only ones a `system-` name may have
/// (upstream `scheduling.SystemPriorityClasses`): name, value, description.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i32, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The highest value a user-defined PriorityClass may have.
const HIGHEST_USER_DEFINABLE_PRIORITY: i32 = 1_000_000_000;

/// `ValidatePriorityClass` and `ValidatePriorityClassUpdate`.
fn validate_priority_class(gvk: Gvk, pc: &PriorityClass, old: Option<&PriorityClass>) -> ErrorList {
    let mut errs = validate_meta(gvk, &pc.metadata, old.map(|o| &o.metadata));
    let name = pc.metadata.name.as_deref().unwrap_or_default();
    if name.starts_with("system-") {
        let known = SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _, _)| *n == name);
        let why = match known {
            None => Some(format!("{name} is not a known system priority class")),
            Some((_, value, _)) if *value != pc.value => {
                Some(format!("value of {name} PriorityClass must be {value}"))
            }
            Some(_) if pc.global_default == Some(true) => {
                Some(format!("globalDefault of {name} PriorityClass must be false"))
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            errs.push(FieldError::forbidden(
                &Path::root("metadata").child("name"),
                format!(
                    "priority class names with 'system-' prefix are reserved for system use only. error: {why}"
                ),
            ));
        }
    } else if pc.value > HIGHEST_USER_DEFINABLE_PRIORITY {
        errs.push(FieldError::forbidden(
            &Path::root("value"),
            format!(
                "maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"
            ),
        ));
    }
    if let Some(pp) = pc.preemption_policy.as_deref()
        && !matches!(pp, "PreemptLowerPriority" | "Never")
    {
        errs.push(FieldError::not_supported(
            &Path::root("preemptionPolicy"),
            pp,
            &["Never", "PreemptLowerPriority"],
        ));
    }
    if let Some(old) = old {
        if pc.value != old.value {
            errs.push(FieldError::forbidden(
                &Path::root("value"),
                "may not be changed in an update.",
            ));
        }
        if pc.preemption_policy != old.preemption_policy {
            let shown = pc
                .preemption_policy
                .as_deref()
                .map_or(Raw("null".into()), |p| Raw(super::field::go_quote(p)));
            errs.push(FieldError::invalid(&Path::root("preemptionPolicy"), shown, FIELD_IMMUTABLE));
        }
    }
    errs
}

/// `SetDefaults_EndpointPort` (discovery): name "" and protocol TCP.
pub fn default_endpoint_slice(o: &mut Obj) {
    for p in each(o, "ports") {
        default_ptr(p, "name", "");
        default_ptr(p, "protocol", "TCP");
    }
}

/// `SetDefaults_RoleBinding/ClusterRoleBinding/Subject`: API groups.
pub fn default_rbac(kind: &str, o: &mut Obj) {
    if !matches!(kind, "RoleBinding" | "ClusterRoleBinding") {
        return;
    }
    if let Some(r) = ensure(o, "roleRef") {
        default(r, "apiGroup", RBAC_GROUP);
    }
    for s in each(o, "subjects") {
        if value::str_of(s, "apiGroup").is_empty() {
            match value::str_of(s, "kind") {
                "ServiceAccount" => {
                    s.insert("apiGroup".into(), "".into());
                }
                "User" | "Group" => {
                    s.insert("apiGroup".into(), RBAC_GROUP.into());
                }
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

pub fn validate(gvk: Gvk, new: &Value, old: Option<&Value>) -> ErrorList {
    let r = match (gvk.group, gvk.kind) {
        ("discovery.k8s.io", "EndpointSlice") => typed_pair::<EndpointSlice>(new, old)
            .map(|(n, o)| validate_endpoint_slice(gvk, &n, o.as_ref())),
        ("coordination.k8s.io", "Lease") => {
            typed_pair::<Lease>(new, old).map(|(n, o)| validate_lease(gvk, &n, o.as_ref()))
        }
        (RBAC_GROUP, "Role") => typed_pair::<Role>(new, old).map(|(n, o)| {
            let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
            validate_rules(n.rules.as_deref().unwrap_or_default(), true, &mut errs);
            errs
        }),
        (RBAC_GROUP, "ClusterRole") => typed_pair::<ClusterRole>(new, old).map(|(n, o)| {
            let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
            validate_rules(n.rules.as_deref().unwrap_or_default(), false, &mut errs);
            if let Some(agg) = &n.aggregation_rule {
                let sp = Path::root("aggregationRule").child("clusterRoleSelectors");
                let sels = agg.cluster_role_selectors.as_deref().unwrap_or_default();
                if sels.is_empty() {
                    errs.push(FieldError::required(
                        &sp,
                        "at least one clusterRoleSelector required if aggregationRule is non-nil",
                    ));
                }
                for (i, s) in sels.iter().enumerate() {
                    errs.extend(meta::validate_label_selector(s, &sp.index(i)));
                }
            }
            errs
        }),
        (RBAC_GROUP, "RoleBinding") => typed_pair::<RoleBinding>(new, old).map(|(n, o)| {
            let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
            validate_binding(
                &n.role_ref,
                o.as_ref().map(|o| &o.role_ref),
                n.subjects.as_deref().unwrap_or_default(),
                true,
                &mut errs,
            );
            errs
        }),
        (RBAC_GROUP, "ClusterRoleBinding") => {
            typed_pair::<ClusterRoleBinding>(new, old).map(|(n, o)| {
                let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
                validate_binding(
                    &n.role_ref,
                    o.as_ref().map(|o| &o.role_ref),
                    n.subjects.as_deref().unwrap_or_default(),
                    false,
                    &mut errs,
                );
                errs
            })
        }
        ("scheduling.k8s.io", "PriorityClass") => typed_pair::<PriorityClass>(new, old)
            .map(|(n, o)| validate_priority_class(gvk, &n, o.as_ref())),
        _ => Ok(ErrorList::new()),
    };
    r.unwrap_or_else(|e| e)
}

fn validate_endpoint_slice(gvk: Gvk, es: &EndpointSlice, old: Option<&EndpointSlice>) -> ErrorList {
    let mut errs = validate_meta(gvk, &es.metadata, old.map(|o| &o.metadata));
    let at = es.address_type.as_str();
    let ap = Path::root("addressType");
    match old {
        Some(old) => {
            if old.address_type != es.address_type {
                errs.push(FieldError::invalid(&ap, at, FIELD_IMMUTABLE));
            }
        }
        None => {
            if at.is_empty() {
                errs.push(FieldError::required(&ap, ""));
            } else if !matches!(at, "IPv4" | "IPv6" | "FQDN") {
                errs.push(FieldError::not_supported(&ap, at, &["FQDN", "IPv4", "IPv6"]));
            }
        }
    }
    let ep = Path::root("endpoints");
    if es.endpoints.len() > 1000 {
        errs.push(FieldError::too_many(&ep, es.endpoints.len(), 1000));
    } else {
        for (i, e) in es.endpoints.iter().enumerate() {
            let p = ep.index(i);
            let addr_path = p.child("addresses");
            if e.addresses.is_empty() {
                errs.push(FieldError::required(&addr_path, "must contain at least 1 address"));
            } else if e.addresses.len() > 100 {
                errs.push(FieldError::too_many(&addr_path, e.addresses.len(), 100));
            }
            for (j, a) in e.addresses.iter().enumerate() {
                let aj = addr_path.index(j);
                match at {
                    "IPv4" | "IPv6" => {
                        let want_v4 = at == "IPv4";
                        match names::parse_ip(a).filter(|ip| ip.is_ipv4() == want_v4) {
                            None => errs.push(FieldError::invalid(
                                &aj,
                                a,
                                format!("must be a valid {at} address"),
                            )),
                            Some(ip) => non_special_ip(ip, a, &aj, &mut errs),
                        }
                    }
                    "FQDN" => {
                        let msgs = names::is_dns1123_subdomain(a);
                        if !msgs.is_empty() || !a.contains('.') {
                            errs.push(FieldError::invalid(
                                &aj,
                                a,
                                "should be a domain with at least two segments separated by dots",
                            ));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(n) = e.node_name.as_deref() {
                for m in names::is_dns1123_subdomain(n) {
                    errs.push(FieldError::invalid(&p.child("nodeName"), n, m));
                }
            }
            if let Some(t) = &e.deprecated_topology {
                errs.extend(meta::validate_labels(t, &p.child("deprecatedTopology")));
            }
            if let Some(h) = e.hostname.as_deref() {
                for m in names::is_dns1123_label(h) {
                    errs.push(FieldError::invalid(&p.child("hostname"), h, m));
                }
            }
        }
    }
    let pp = Path::root("ports");
    let ports = es.ports.as_deref().unwrap_or_default();
    if ports.len() > 20000 {
        errs.push(FieldError::too_many(&pp, ports.len(), 20000));
        return errs;
    }
    let mut seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = pp.index(i);
        let name = port.name.as_deref().unwrap_or_default();
        if !name.is_empty() {
            for m in names::is_dns1123_label(name) {
                errs.push(FieldError::invalid(&p.child("name"), name, m));
            }
        }
        if !seen.insert(name) {
            errs.push(FieldError::duplicate(&p.child("name"), name));
        }
        validate_protocol(port.protocol.as_deref(), &p.child("protocol"), &mut errs);
    }
    errs
}

fn validate_lease(gvk: Gvk, l: &Lease, old: Option<&Lease>) -> ErrorList {
    let mut errs = validate_meta(gvk, &l.metadata, old.map(|o| &o.metadata));
    if let Some(spec) = &l.spec {
        let sp = Path::root("spec");
        if let Some(d) = spec.lease_duration_seconds
            && d <= 0
        {
            errs.push(FieldError::invalid(
                &sp.child("leaseDurationSeconds"),
                d,
                "must be greater than 0",
            ));
        }
        if let Some(t) = spec.lease_transitions
            && t < 0
        {
            errs.push(FieldError::invalid(&sp.child("leaseTransitions"), t, meta::NEGATIVE));
        }
    }
    errs
}

fn validate_rules(rules: &[PolicyRule], namespaced: bool, errs: &mut ErrorList) {
    for (i, r) in rules.iter().enumerate() {
        let p = Path::root("rules").index(i);
        if r.verbs.is_empty() {
            errs.push(FieldError::required(
                &p.child("verbs"),
                "verbs must contain at least one value",
            ));
        }
        let urls = r.non_resource_urls.as_deref().unwrap_or_default();
        let len = |v: &Option<Vec<String>>| v.as_ref().map_or(0, Vec::len);
        if !urls.is_empty() {
            if namespaced {
                errs.push(FieldError::invalid(
                    &p.child("nonResourceURLs"),
                    go_string_list(urls),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if len(&r.api_groups) + len(&r.resources) + len(&r.resource_names) > 0 {
                errs.push(FieldError::invalid(
                    &p.child("nonResourceURLs"),
                    go_string_list(urls),
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if len(&r.api_groups) == 0 {
            errs.push(FieldError::required(
                &p.child("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if len(&r.resources) == 0 {
            errs.push(FieldError::required(
                &p.child("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

fn validate_binding(
    role_ref: &RoleRef,
    old_ref: Option<&RoleRef>,
    subjects: &[Subject],
    namespaced: bool,
    errs: &mut ErrorList,
) {
    let rp = Path::root("roleRef");
    if role_ref.api_group != RBAC_GROUP {
        errs.push(FieldError::not_supported(
            &rp.child("apiGroup"),
            &role_ref.api_group,
            &[RBAC_GROUP],
        ));
    }
    let kinds: &[&str] = if namespaced { &["Role", "ClusterRole"] } else { &["ClusterRole"] };
    if !kinds.contains(&role_ref.kind.as_str()) {
        errs.push(FieldError::not_supported(&rp.child("kind"), &role_ref.kind, kinds));
    }
    if role_ref.name.is_empty() {
        errs.push(FieldError::required(&rp.child("name"), ""));
    } else {
        for m in names::is_valid_path_segment_name(&role_ref.name) {
            errs.push(FieldError::invalid(&rp.child("name"), &role_ref.name, m));
        }
    }
    for (i, s) in subjects.iter().enumerate() {
        let p = Path::root("subjects").index(i);
        if s.name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        }
        let group = s.api_group.as_deref().unwrap_or_default();
        match s.kind.as_str() {
            "ServiceAccount" => {
                if !s.name.is_empty() {
                    for m in names::is_dns1123_subdomain(&s.name) {
                        errs.push(FieldError::invalid(&p.child("name"), &s.name, m));
                    }
                }
                if !group.is_empty() {
                    errs.push(FieldError::not_supported(&p.child("apiGroup"), group, &[""]));
                }
                if !namespaced && s.namespace.as_deref().unwrap_or_default().is_empty() {
                    errs.push(FieldError::required(&p.child("namespace"), ""));
                }
            }
            "User" | "Group" => {
                if group != RBAC_GROUP {
                    errs.push(FieldError::not_supported(
                        &p.child("apiGroup"),
                        group,
                        &[RBAC_GROUP],
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                &p.child("kind"),
                other,
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
    if let Some(old) = old_ref
        && old != role_ref
    {
        errs.push(FieldError::invalid(&rp, json_value(role_ref), "cannot change roleRef"));
    }
}
