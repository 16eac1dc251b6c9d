//! The scheduling parts of a pod spec: node and pod (anti-)affinity and topology spread
//! constraints (upstream `validateAffinity`, `validateTopologySpreadConstraints`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm, TopologySpreadConstraint,
    WeightedPodAffinityTerm,
};

use super::field::{ErrorList, FieldError, Path};
use super::meta;
use super::names;

const NOT_POSITIVE: &str = "must be greater than zero";

pub fn validate_affinity(a: &Affinity, path: &Path, errs: &mut ErrorList) {
    if let Some(na) = &a.node_affinity {
        let np = path.child("nodeAffinity");
        if let Some(req) = &na.required_during_scheduling_ignored_during_execution {
            let tp = np
                .child("requiredDuringSchedulingIgnoredDuringExecution")
                .child("nodeSelectorTerms");
            if req.node_selector_terms.is_empty() {
                errs.push(FieldError::required(&tp, "must have at least one node selector term"));
            }
            for (i, t) in req.node_selector_terms.iter().enumerate() {
                node_selector_term(t, true, &tp.index(i), errs);
            }
        }
        let pp = np.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, t) in
            na.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate()
        {
            weight(t.weight, &pp.index(i).child("weight"), errs);
            node_selector_term(&t.preference, false, &pp.index(i).child("preference"), errs);
        }
    }
    let pod_affinities = [
        (
            "podAffinity",
            a.pod_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            a.pod_anti_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ];
    for (name, terms) in pod_affinities {
        let Some((required, preferred)) = terms else {
            continue;
        };
        let p = path.child(name);
        let rp = p.child("requiredDuringSchedulingIgnoredDuringExecution");
        for (i, t) in required.iter().flatten().enumerate() {
            pod_affinity_term(t, &rp.index(i), errs);
        }
        let pp = p.child("preferredDuringSchedulingIgnoredDuringExecution");
        for (i, t) in preferred.iter().flatten().enumerate() {
            weighted_term(t, &pp.index(i), errs);
        }
    }
}

fn weight(w: i32, path: &Path, errs: &mut ErrorList) {
    if !(1..=100).contains(&w) {
        errs.push(FieldError::invalid(path, w, "must be in the range 1-100"));
    }
}

fn node_selector_term(
    t: &NodeSelectorTerm,
    strict_values: bool,
    path: &Path,
    errs: &mut ErrorList,
) {
    for (j, req) in t.match_expressions.iter().flatten().enumerate() {
        node_selector_requirement(
            req,
            strict_values,
            &path.child("matchExpressions").index(j),
            errs,
        );
    }
    for (j, req) in t.match_fields.iter().flatten().enumerate() {
        let p = path.child("matchFields").index(j);
        if req.key != "metadata.name" {
            errs.push(FieldError::invalid(
                &p.child("key"),
                &req.key,
                "not a valid field selector key",
            ));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.len() != 1 {
                    errs.push(FieldError::required(
                        &p.child("values"),
                        "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                    ));
                }
            }
            other => errs.push(FieldError::invalid(
                &p.child("operator"),
                other,
                "not a valid selector operator",
            )),
        }
    }
}

fn node_selector_requirement(
    req: &NodeSelectorRequirement,
    strict_values: bool,
    path: &Path,
    errs: &mut ErrorList,
) {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                errs.push(FieldError::required(
                    &path.child("values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                ));
            }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                errs.push(FieldError::forbidden(
                    &path.child("values"),
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                ));
            }
        }
        "Gt" | "Lt" => {
            if values.len() != 1 {
                errs.push(FieldError::required(
                    &path.child("values"),
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                ));
            }
        }
        other => errs.push(FieldError::invalid(
            &path.child("operator"),
            other,
            "not a valid selector operator",
        )),
    }
    for m in names::is_qualified_name(&req.key) {
        errs.push(FieldError::invalid(&path.child("key"), &req.key, m));
    }
    if strict_values {
        for (i, v) in values.iter().enumerate() {
            for m in names::is_valid_label_value(v) {
                errs.push(FieldError::invalid(&path.child("values").index(i), v, m));
            }
        }
    }
}

fn pod_affinity_term(t: &PodAffinityTerm, path: &Path, errs: &mut ErrorList) {
    if let Some(sel) = &t.label_selector {
        errs.extend(meta::validate_label_selector(sel, &path.child("labelSelector")));
    }
    if let Some(sel) = &t.namespace_selector {
        errs.extend(meta::validate_label_selector(sel, &path.child("namespaceSelector")));
    }
    for ns in t.namespaces.iter().flatten() {
        for m in names::is_dns1123_label(ns) {
            errs.push(FieldError::invalid(&path.child("namespace"), ns, m));
        }
    }
    let tk = path.child("topologyKey");
    if t.topology_key.is_empty() {
        errs.push(FieldError::required(&tk, "can not be empty"));
    }
    for m in names::is_qualified_name(&t.topology_key) {
        errs.push(FieldError::invalid(&tk, &t.topology_key, m));
    }
}

fn weighted_term(t: &WeightedPodAffinityTerm, path: &Path, errs: &mut ErrorList) {
    weight(t.weight, &path.child("weight"), errs);
    pod_affinity_term(&t.pod_affinity_term, &path.child("podAffinityTerm"), errs);
}

pub fn validate_topology_spread(
    cs: &[TopologySpreadConstraint],
    path: &Path,
    errs: &mut ErrorList,
) {
    let mut seen = HashSet::new();
    for (i, c) in cs.iter().enumerate() {
        let p = path.index(i);
        if c.max_skew <= 0 {
            errs.push(FieldError::invalid(&p.child("maxSkew"), c.max_skew, NOT_POSITIVE));
        }
        let tk = p.child("topologyKey");
        if c.topology_key.is_empty() {
            errs.push(FieldError::required(&tk, "can not be empty"));
        } else if let Some(m) = names::is_qualified_name(&c.topology_key).into_iter().next() {
            errs.push(FieldError::invalid(&tk, &c.topology_key, m));
        }
        let wu = c.when_unsatisfiable.as_str();
        if !matches!(wu, "DoNotSchedule" | "ScheduleAnyway") {
            errs.push(FieldError::not_supported(
                &p.child("whenUnsatisfiable"),
                wu,
                &["DoNotSchedule", "ScheduleAnyway"],
            ));
        }
        if !seen.insert((c.topology_key.as_str(), wu)) {
            errs.push(FieldError::duplicate(
                &p.child("{topologyKey, whenUnsatisfiable}"),
                format!("{{{}, {wu}}}", c.topology_key),
            ));
        }
        if let Some(md) = c.min_domains {
            let mp = p.child("minDomains");
            if md <= 0 {
                errs.push(FieldError::invalid(&mp, md, NOT_POSITIVE));
            }
            if wu != "DoNotSchedule" {
                errs.push(FieldError::invalid(
                    &mp,
                    md,
                    format!("can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {wu}"),
                ));
            }
        }
        for (name, policy) in [
            ("nodeAffinityPolicy", &c.node_affinity_policy),
            ("nodeTaintsPolicy", &c.node_taints_policy),
        ] {
            if let Some(policy) = policy.as_deref()
                && !matches!(policy, "Honor" | "Ignore")
            {
                errs.push(FieldError::not_supported(&p.child(name), policy, &["Honor", "Ignore"]));
            }
        }
        if let Some(sel) = &c.label_selector {
            errs.extend(meta::validate_label_selector(sel, &p.child("labelSelector")));
        }
    }
}
