//! ResourceQuota accounting, as upstream's `pkg/quota/v1/evaluator/core`: what one object
//! charges against a namespace's quotas (object counts, pod compute requests and limits,
//! Service node ports and load balancers, claim storage), which objects a quota's scopes
//! select, and the quantities written into a quota's status. The apiserver's quota
//! admission and the resource quota controller both count through here.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::json::ValueAt;
use crate::quantity::{Quantity, canonical};

/// Resource name → amount, as a quota's `hard` and `used` hold them.
pub type Usage = BTreeMap<String, Quantity>;

const NANO: i128 = 1_000_000_000;

/// The compute resources of pods that quotas name bare (`cpu` is `requests.cpu`).
const BARE_COMPUTE: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The object-count names upstream keeps from before `count/<resource>` existed.
fn legacy_count(group: &str, resource: &str) -> Option<&'static str> {
    if !group.is_empty() {
        return None;
    }
    Some(match resource {
        "pods" => "pods",
        "services" => "services",
        "replicationcontrollers" => "replicationcontrollers",
        "resourcequotas" => "resourcequotas",
        "secrets" => "secrets",
        "configmaps" => "configmaps",
        "persistentvolumeclaims" => "persistentvolumeclaims",
        _ => return None,
    })
}

/// `count/<resource>` (core) or `count/<resource>.<group>`.
pub fn count_name(group: &str, resource: &str) -> String {
    if group.is_empty() { format!("count/{resource}") } else { format!("count/{resource}.{group}") }
}

/// The (group, resource) a `count/...` name counts.
pub fn counted_resource(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("count/")?;
    Some(match rest.split_once('.') {
        Some((resource, group)) => (group, resource),
        None => ("", rest),
    })
}

/// What one object of `group`/`resource` charges, at `now` (pods that are terminal, or past
/// their deletion grace period, charge only `count/pods`).
pub fn usage(group: &str, resource: &str, obj: &Value, now: &str) -> Usage {
    let mut u = Usage::new();
    let one = Quantity(NANO);
    // `count/pods` counts every stored pod; `pods` and compute only those not at their end
    // of life (upstream's PodUsageFunc).
    u.insert(count_name(group, resource), one);
    if group.is_empty() && resource == "pods" && !pod_counts(obj, now) {
        return u;
    }
    if let Some(legacy) = legacy_count(group, resource) {
        u.insert(legacy.to_string(), one);
    }
    match (group, resource) {
        ("", "pods") => pod_compute(obj, &mut u),
        ("", "services") => service_usage(obj, &mut u),
        ("", "persistentvolumeclaims") => claim_usage(obj, &mut u),
        _ => {}
    }
    u
}

/// Upstream's `QuotaV1Pod`: terminal pods, and pods whose deletion grace period is over,
/// no longer charge their quota.
fn pod_counts(pod: &Value, now: &str) -> bool {
    let phase = pod.at(&["status", "phase"]).and_then(Value::as_str).unwrap_or_default();
    if matches!(phase, "Succeeded" | "Failed") {
        return false;
    }
    let deleted = pod.at(&["metadata", "deletionTimestamp"]).and_then(Value::as_str);
    let grace = pod.at(&["metadata", "deletionGracePeriodSeconds"]).and_then(Value::as_i64);
    match (deleted, grace) {
        (Some(at), Some(grace)) => {
            let (Ok(at), Ok(now)) = (at.parse::<jiff::Timestamp>(), now.parse::<jiff::Timestamp>())
            else {
                return true;
            };
            at.checked_add(jiff::SignedDuration::from_secs(grace)).is_ok_and(|end| end > now)
        }
        _ => true,
    }
}

fn containers<'a>(pod: &'a Value, key: &str) -> &'a [Value] {
    pod.at(&["spec", key]).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

fn amounts(container: &Value, which: &str) -> Usage {
    container
        .at(&["resources", which])
        .and_then(Value::as_object)
        .map(|m| {
            m.iter().filter_map(|(k, v)| Some((k.clone(), Quantity::parse(v.as_str()?)?))).collect()
        })
        .unwrap_or_default()
}

fn add_into(to: &mut Usage, from: &Usage) {
    for (k, v) in from {
        let e = to.entry(k.clone()).or_insert(Quantity::ZERO);
        *e = e.saturating_add(*v);
    }
}

fn max_into(to: &mut Usage, from: &Usage) {
    for (k, v) in from {
        let e = to.entry(k.clone()).or_insert(Quantity::ZERO);
        *e = (*e).max(*v);
    }
}

/// Upstream's `resource.PodRequests`/`PodLimits`: containers and restartable (sidecar) init
/// containers summed, each other init container as a floor, overhead added.
fn pod_amounts(pod: &Value, which: &str) -> Usage {
    let mut total = Usage::new();
    for c in containers(pod, "containers") {
        add_into(&mut total, &amounts(c, which));
    }
    let mut sidecars = Usage::new();
    let mut init_floor = Usage::new();
    for c in containers(pod, "initContainers") {
        let own = amounts(c, which);
        if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            add_into(&mut sidecars, &own);
            add_into(&mut total, &own);
        } else {
            // An init container runs beside the sidecars started before it.
            let mut running = sidecars.clone();
            add_into(&mut running, &own);
            max_into(&mut init_floor, &running);
        }
    }
    max_into(&mut total, &init_floor);
    if let Some(overhead) = pod.at(&["spec", "overhead"]).and_then(Value::as_object) {
        for (k, v) in overhead {
            if let Some(q) = v.as_str().and_then(Quantity::parse) {
                let e = total.entry(k.clone()).or_insert(Quantity::ZERO);
                *e = e.saturating_add(q);
            }
        }
    }
    total
}

fn pod_compute(pod: &Value, u: &mut Usage) {
    for (name, q) in pod_amounts(pod, "requests") {
        if BARE_COMPUTE.contains(&name.as_str()) || name.starts_with("hugepages-") {
            u.insert(name.clone(), q);
        }
        u.insert(format!("requests.{name}"), q);
    }
    for (name, q) in pod_amounts(pod, "limits") {
        u.insert(format!("limits.{name}"), q);
    }
}

fn service_usage(svc: &Value, u: &mut Usage) {
    let ty = svc.at(&["spec", "type"]).and_then(Value::as_str).unwrap_or("ClusterIP");
    let ports = svc.at(&["spec", "ports"]).and_then(Value::as_array).map_or(0, Vec::len) as i128;
    let node_ports = match ty {
        "NodePort" => ports,
        "LoadBalancer"
            if svc.at(&["spec", "allocateLoadBalancerNodePorts"]).and_then(Value::as_bool)
                != Some(false) =>
        {
            ports
        }
        _ => 0,
    };
    u.insert("services.nodeports".into(), Quantity(node_ports * NANO));
    u.insert("services.loadbalancers".into(), Quantity(i128::from(ty == "LoadBalancer") * NANO));
}

/// A claim charges its storage request (or what was allocated, when more) in total and per
/// storage class.
fn claim_usage(claim: &Value, u: &mut Usage) {
    let requested = claim
        .at(&["spec", "resources", "requests", "storage"])
        .and_then(Value::as_str)
        .and_then(Quantity::parse);
    let allocated = claim
        .at(&["status", "allocatedResources", "storage"])
        .and_then(Value::as_str)
        .and_then(Quantity::parse);
    let storage = requested.max(allocated).unwrap_or(Quantity::ZERO);
    u.insert("requests.storage".into(), storage);
    if let Some(class) = claim.at(&["spec", "storageClassName"]).and_then(Value::as_str) {
        let prefix = format!("{class}.storageclass.storage.k8s.io/");
        u.insert(format!("{prefix}requests.storage"), storage);
        u.insert(format!("{prefix}persistentvolumeclaims"), Quantity(NANO));
    }
}

/// Whether a quota names a resource only pods charge (its scopes then apply to pods only).
fn is_pod_resource(name: &str) -> bool {
    matches!(name, "pods" | "count/pods")
        || BARE_COMPUTE.contains(&name)
        || name.starts_with("requests.")
            && !name.ends_with(".storage")
            && name != "requests.storage"
        || name.starts_with("limits.")
        || name.starts_with("hugepages-")
}

/// The resources of `hard` that an object of `group`/`resource` can charge.
pub fn charged_names<'a>(
    hard: impl Iterator<Item = &'a String>,
    group: &str,
    resource: &str,
) -> Vec<&'a String> {
    let pods = group.is_empty() && resource == "pods";
    hard.filter(|name| {
        if let Some((g, r)) = counted_resource(name) {
            return g == group && r == resource;
        }
        if legacy_count(group, resource) == Some(name.as_str()) {
            return true;
        }
        match (group, resource) {
            ("", "pods") => pods && is_pod_resource(name),
            ("", "services") => name.starts_with("services."),
            ("", "persistentvolumeclaims") => {
                name.as_str() == "requests.storage"
                    || name.contains(".storageclass.storage.k8s.io/")
            }
            _ => false,
        }
    })
    .collect()
}

/// The (group, resource) whose objects a quota resource name counts: `None` for a name no
/// object charges.
pub fn counted_by(name: &str) -> Option<(&str, &str)> {
    if let Some(gr) = counted_resource(name) {
        return Some(gr);
    }
    if let Some(legacy) = legacy_count("", name) {
        return Some(("", legacy));
    }
    if name.starts_with("services.") {
        return Some(("", "services"));
    }
    if name == "requests.storage" || name.contains(".storageclass.storage.k8s.io/") {
        return Some(("", "persistentvolumeclaims"));
    }
    is_pod_resource(name).then_some(("", "pods"))
}

/// Whether a quota's `scopes` and `scopeSelector` select the object. Only pods are scoped;
/// a scoped quota charges nothing else.
pub fn scopes_match(spec: &Value, group: &str, resource: &str, obj: &Value) -> bool {
    let mut scopes: Vec<(String, String, Vec<String>)> = spec
        .get("scopes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| (s.to_string(), "Exists".to_string(), Vec::new()))
        .collect();
    for e in spec
        .at(&["scopeSelector", "matchExpressions"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let values = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        scopes.push((field("scopeName"), field("operator"), values));
    }
    if scopes.is_empty() {
        return true;
    }
    if !(group.is_empty() && resource == "pods") {
        return false;
    }
    scopes.iter().all(|(scope, operator, values)| pod_in_scope(obj, scope, operator, values))
}

fn pod_in_scope(pod: &Value, scope: &str, operator: &str, values: &[String]) -> bool {
    let matched = match scope {
        "Terminating" => pod.at(&["spec", "activeDeadlineSeconds"]).is_some_and(|v| !v.is_null()),
        "NotTerminating" => pod.at(&["spec", "activeDeadlineSeconds"]).is_none_or(Value::is_null),
        "BestEffort" => best_effort(pod),
        "NotBestEffort" => !best_effort(pod),
        "PriorityClass" => {
            let class = pod.at(&["spec", "priorityClassName"]).and_then(Value::as_str);
            return match operator {
                "In" => class.is_some_and(|c| values.iter().any(|v| v == c)),
                "NotIn" => class.is_none_or(|c| !values.iter().any(|v| v == c)),
                "DoesNotExist" => class.is_none_or(str::is_empty),
                _ => class.is_some_and(|c| !c.is_empty()),
            };
        }
        "CrossNamespacePodAffinity" => cross_namespace_affinity(pod),
        _ => false,
    };
    if operator == "DoesNotExist" { !matched } else { matched }
}

/// No container requests or limits anything (upstream's BestEffort QoS class).
fn best_effort(pod: &Value) -> bool {
    ["containers", "initContainers"].iter().flat_map(|k| containers(pod, k)).all(|c| {
        ["requests", "limits"].iter().all(|w| {
            c.at(&["resources", w]).and_then(Value::as_object).is_none_or(|m| m.is_empty())
        })
    })
}

/// A pod (anti-)affinity term names other namespaces or a namespace selector.
fn cross_namespace_affinity(pod: &Value) -> bool {
    ["podAffinity", "podAntiAffinity"].iter().any(|kind| {
        let Some(a) = pod.at(&["spec", "affinity", kind]) else { return false };
        let required = a
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        let preferred = a
            .get("preferredDuringSchedulingIgnoredDuringExecution")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|w| w.get("podAffinityTerm"));
        required.chain(preferred).any(|t| {
            t.get("namespaceSelector").is_some_and(|s| !s.is_null())
                || t.get("namespaces").and_then(Value::as_array).is_some_and(|n| !n.is_empty())
        })
    })
}

/// The compute resources a quota names that some container does not state (upstream's pod
/// evaluator `Constraints`, kept for backward compatibility: a cpu or memory quota needs
/// every container to request, or limit, it). Sorted.
pub fn missing_compute(hard: &[&String], pod: &Value) -> Vec<String> {
    const VALIDATED: [&str; 6] =
        ["cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"];
    let mut out: Vec<String> = Vec::new();
    for name in hard.iter().filter(|n| VALIDATED.contains(&n.as_str())) {
        let (which, resource) = match name.split_once('.') {
            Some((which, resource)) => (which, resource),
            None => ("requests", name.as_str()),
        };
        let lacking = ["containers", "initContainers"]
            .iter()
            .flat_map(|k| containers(pod, k))
            .any(|c| c.at(&["resources", which, resource]).is_none());
        if lacking {
            out.push(name.to_string());
        }
    }
    out.sort();
    out
}

/// A status quantity of resource `name` as upstream prints it: memory and storage in binary
/// units when they are whole KiB, everything else in decimal SI (`1500m`, `3`).
pub fn format(name: &str, q: Quantity) -> String {
    let bytes = name.contains("memory") || name.contains("storage") || name.contains("hugepages-");
    let text = if q.0 % NANO == 0 {
        let whole = q.0 / NANO;
        if bytes && whole != 0 && whole % 1024 == 0 {
            format!("{}Ki", whole / 1024)
        } else {
            whole.to_string()
        }
    } else {
        format!("{}n", q.0)
    };
    canonical(&text).unwrap_or(text)
}

/// Parse a quota's `hard` or `used` map.
pub fn parse_usage(v: Option<&Value>) -> Usage {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter().filter_map(|(k, v)| Some((k.clone(), Quantity::parse(v.as_str()?)?))).collect()
        })
        .unwrap_or_default()
}

/// A usage map as a status map.
pub fn usage_value(u: &Usage) -> Value {
    Value::Object(u.iter().map(|(k, v)| (k.clone(), Value::String(format(k, *v)))).collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: &str = "2026-11-28T10:00:00Z";

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn a_pod_charges_its_count_and_compute() {
        let pod = json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                    "limits": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"memory": "16Mi"},
        }});
        let u = usage("", "pods", &pod, NOW);
        assert_eq!(u["pods"], q("1"));
        assert_eq!(u["count/pods"], q("1"));
        // The init container's 2 cpu is more than the containers' 500m together.
        assert_eq!(u["requests.cpu"], q("2"));
        assert_eq!(u["cpu"], q("2"));
        assert_eq!(u["requests.memory"], q("80Mi"));
        assert_eq!(u["limits.cpu"], q("1"));
        assert_eq!(format("requests.memory", u["requests.memory"]), "80Mi");
        assert_eq!(format("requests.cpu", q("1500m")), "1500m");
        assert_eq!(format("pods", q("3")), "3");
        assert_eq!(format("requests.cpu", q("2048")), "2048");
        assert_eq!(format("requests.storage", q("2048")), "2Ki");
        assert_eq!(format("pods", Quantity::ZERO), "0");
    }

    #[test]
    fn terminal_and_expired_pods_charge_only_their_count() {
        let only_count = |u: Usage| u.keys().cloned().collect::<Vec<_>>() == ["count/pods"];
        assert!(only_count(usage("", "pods", &json!({"status": {"phase": "Succeeded"}}), NOW)));
        let deleting = |grace: i64| {
            json!({"metadata": {"deletionTimestamp": "2026-11-28T09:59:30Z",
                "deletionGracePeriodSeconds": grace}})
        };
        assert!(only_count(usage("", "pods", &deleting(10), NOW)));
        assert_eq!(usage("", "pods", &deleting(60), NOW)["pods"], q("1"));
    }

    #[test]
    fn services_claims_and_other_kinds() {
        let svc = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        let u = usage("", "services", &svc, NOW);
        assert_eq!(
            (u["services"], u["services.loadbalancers"], u["services.nodeports"]),
            (q("1"), q("1"), q("2"))
        );
        let claim = json!({"spec": {"storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"allocatedResources": {"storage": "2Gi"}}});
        let u = usage("", "persistentvolumeclaims", &claim, NOW);
        assert_eq!(u["requests.storage"], q("2Gi"));
        assert_eq!(u["fast.storageclass.storage.k8s.io/persistentvolumeclaims"], q("1"));
        let u = usage("apps", "deployments", &json!({}), NOW);
        assert_eq!(u.keys().collect::<Vec<_>>(), ["count/deployments.apps"]);
        assert_eq!(counted_resource("count/deployments.apps"), Some(("apps", "deployments")));
        assert_eq!(counted_resource("count/pods"), Some(("", "pods")));
    }

    #[test]
    fn charged_names_and_scopes() {
        let hard: Vec<String> =
            ["pods", "requests.cpu", "services", "count/configmaps", "requests.storage"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let names = |g: &str, r: &str| charged_names(hard.iter(), g, r);
        assert_eq!(names("", "pods"), ["pods", "requests.cpu"]);
        assert_eq!(names("", "configmaps"), ["count/configmaps"]);
        assert_eq!(names("", "persistentvolumeclaims"), ["requests.storage"]);
        assert!(names("apps", "deployments").is_empty());

        let best_effort = json!({"spec": {"containers": [{"name": "c"}]}});
        let burstable = json!({"spec": {"activeDeadlineSeconds": 5, "priorityClassName": "high",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}});
        let spec = json!({"scopes": ["BestEffort"]});
        assert!(scopes_match(&spec, "", "pods", &best_effort));
        assert!(!scopes_match(&spec, "", "pods", &burstable));
        assert!(!scopes_match(&spec, "", "services", &json!({})));
        let spec = json!({"scopes": ["Terminating"], "scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}});
        assert!(scopes_match(&spec, "", "pods", &burstable));
        assert!(!scopes_match(&spec, "", "pods", &best_effort));
        assert!(scopes_match(&json!({}), "", "services", &json!({})));
    }

    #[test]
    fn compute_quotas_require_every_container_to_state_them() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}}},
            {"name": "b"},
        ]}});
        let hard = ["requests.cpu", "limits.memory", "pods", "cpu", "limits.cpu"].map(String::from);
        let hard: Vec<&String> = hard.iter().collect();
        assert_eq!(
            missing_compute(&hard, &pod),
            ["cpu", "limits.cpu", "limits.memory", "requests.cpu"]
        );
        let stated = json!({"spec": {"containers": [{"name": "a", "resources": {
            "requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert!(missing_compute(&hard, &stated).is_empty());
    }
}
