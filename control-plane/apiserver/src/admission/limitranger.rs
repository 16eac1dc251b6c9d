//! LimitRanger (upstream `plugin/pkg/admission/limitranger`): the LimitRanges of a
//! namespace give a created pod's containers the requests and limits they leave unset
//! (recorded in the `kubernetes.io/limit-ranger` annotation), then refuse a pod, container
//! or claim outside their min, max and limit/request ratio.

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin};
use crate::state::State;
use crate::status::ApiResult;
use skiff_core::json::ValueAt;
use skiff_core::quantity::{Quantity, canonical};

const ANNOTATION: &str = "kubernetes.io/limit-ranger";

pub struct LimitRanger;

/// The LimitRanges of `ns` in the watch cache (eventually consistent, as upstream's lister).
fn ranges(state: &State, ns: Option<&str>) -> Vec<Value> {
    let Some(rt) = state.registry.find("", "v1", "limitranges") else { return Vec::new() };
    let Some(ns) = ns else { return Vec::new() };
    state
        .cache
        .resource(rt)
        .list(&rt.namespace_prefix(Some(ns)), None)
        .iter()
        .map(|o| o.value())
        .collect()
}

/// The items of `ranges` of one type.
fn items<'a>(ranges: &'a [Value], ty: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    ranges
        .iter()
        .flat_map(|r| r.at(&["spec", "limits"]).and_then(Value::as_array).into_iter().flatten())
        .filter(move |i| i.get("type").and_then(Value::as_str) == Some(ty))
}

#[async_trait]
impl MutatingPlugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && resource.is_core("pods") && resource.subresource.is_none()
    }

    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        let ranges = ranges(state, req.namespace.as_deref());
        if ranges.is_empty() {
            return Ok(());
        }
        // Upstream's defaultContainerResourceRequirements: the Container items' defaults,
        // a later item's overriding an earlier one's.
        let (mut requests, mut limits) = (Map::new(), Map::new());
        for item in items(&ranges, "Container") {
            for (to, field) in [(&mut requests, "defaultRequest"), (&mut limits, "default")] {
                for (k, v) in item.get(field).and_then(Value::as_object).into_iter().flatten() {
                    to.insert(k.clone(), v.clone());
                }
            }
        }
        if requests.is_empty() && limits.is_empty() {
            return Ok(());
        }
        let Some(pod) = req.object.as_mut() else { return Ok(()) };
        if let Some(note) = set_defaults(pod, &requests, &limits) {
            let meta = pod
                .as_object_mut()
                .and_then(|p| p.entry("metadata").or_insert_with(|| json!({})).as_object_mut());
            if let Some(meta) = meta {
                let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
                if let Some(a) = annotations.as_object_mut() {
                    a.insert(ANNOTATION.into(), Value::String(note));
                }
            }
        }
        Ok(())
    }
}

/// Fill what each container leaves unset; the annotation upstream writes, if anything was.
fn set_defaults(
    pod: &mut Value,
    requests: &Map<String, Value>,
    limits: &Map<String, Value>,
) -> Option<String> {
    let mut notes = Vec::new();
    for (key, prefix) in [("containers", "container"), ("initContainers", "init container")] {
        let Some(cs) =
            pod.get_mut("spec").and_then(|s| s.get_mut(key)).and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            let resources = c.entry("resources").or_insert_with(|| json!({}));
            let Some(resources) = resources.as_object_mut() else { continue };
            let mut set_requests = Vec::new();
            let mut set_limits = Vec::new();
            for (which, defaults, set) in
                [("limits", limits, &mut set_limits), ("requests", requests, &mut set_requests)]
            {
                if defaults.is_empty() {
                    continue;
                }
                let target = resources.entry(which).or_insert_with(|| json!({}));
                let Some(target) = target.as_object_mut() else { continue };
                for (k, v) in defaults {
                    if !target.contains_key(k) {
                        target.insert(k.clone(), v.clone());
                        set.push(k.clone());
                    }
                }
            }
            set_requests.sort();
            set_limits.sort();
            if !set_requests.is_empty() {
                notes.push(format!("{} request for {prefix} {name}", set_requests.join(", ")));
            }
            if !set_limits.is_empty() {
                notes.push(format!("{} limit for {prefix} {name}", set_limits.join(", ")));
            }
        }
    }
    (!notes.is_empty()).then(|| format!("LimitRanger plugin set: {}", notes.join("; ")))
}

#[async_trait]
impl ValidatingPlugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        resource.subresource.is_none()
            && (operation == Operation::Create && resource.is_core("pods")
                || matches!(operation, Operation::Create | Operation::Update)
                    && resource.is_core("persistentvolumeclaims"))
    }

    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        let ranges = ranges(state, req.namespace.as_deref());
        let Some(obj) = req.object.as_ref() else { return Ok(()) };
        let errs = if req.resource == "pods" {
            pod_errors(&ranges, obj)
        } else {
            claim_errors(&ranges, obj)
        };
        // Upstream's aggregate error prints each message once.
        let mut seen = std::collections::HashSet::new();
        let errs: Vec<String> = errs.into_iter().filter(|e| seen.insert(e.clone())).collect();
        match errs.as_slice() {
            [] => Ok(()),
            [one] => Err(req.forbidden(one)),
            many => Err(req.forbidden(format!("[{}]", many.join(", ")))),
        }
    }
}

/// A resource list (`requests` or `limits`) as quantities, keeping how each was written.
type Amounts = Vec<(String, Quantity, String)>;

fn amounts(v: Option<&Value>) -> Amounts {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, q)| {
            let s = q.as_str()?;
            Some((k.clone(), Quantity::parse(s)?, canonical(s).unwrap_or_else(|| s.to_string())))
        })
        .collect()
}

fn find<'a>(a: &'a Amounts, k: &str) -> Option<&'a (String, Quantity, String)> {
    a.iter().find(|(n, _, _)| n == k)
}

/// Upstream's pod-level sums: containers added, each init container as a floor.
fn pod_totals(pod: &Value, which: &str) -> Amounts {
    let list =
        |key: &str| pod.at(&["spec", key]).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut total: Vec<(String, Quantity)> = Vec::new();
    for c in list("containers") {
        for (k, q, _) in amounts(c.at(&["resources", which])) {
            match total.iter_mut().find(|(n, _)| *n == k) {
                Some(t) => t.1 = t.1.saturating_add(q),
                None => total.push((k, q)),
            }
        }
    }
    for c in list("initContainers") {
        for (k, q, _) in amounts(c.at(&["resources", which])) {
            match total.iter_mut().find(|(n, _)| *n == k) {
                Some(t) => t.1 = t.1.max(q),
                None => total.push((k, q)),
            }
        }
    }
    total
        .into_iter()
        .map(|(k, q)| {
            let shown = skiff_core::quota::format(&k, q);
            (k, q, shown)
        })
        .collect()
}

/// The min, max and ratio checks of one item against one set of requests and limits.
fn check(item: &Value, ty: &str, requests: &Amounts, limits: &Amounts, errs: &mut Vec<String>) {
    let enforced = |field: &str| amounts(item.get(field));
    for (k, min, shown) in enforced("min") {
        match (find(requests, &k), find(limits, &k)) {
            (None, _) => errs
                .push(format!("minimum {k} usage per {ty} is {shown}.  No request is specified")),
            (Some(r), _) if r.1 < min => {
                errs.push(format!("minimum {k} usage per {ty} is {shown}, but request is {}", r.2))
            }
            (_, Some(l)) if l.1 < min => {
                errs.push(format!("minimum {k} usage per {ty} is {shown}, but limit is {}", l.2))
            }
            _ => {}
        }
    }
    for (k, max, shown) in enforced("max") {
        match (find(requests, &k), find(limits, &k)) {
            (_, None) => {
                errs.push(format!("maximum {k} usage per {ty} is {shown}.  No limit is specified"))
            }
            (_, Some(l)) if l.1 > max => {
                errs.push(format!("maximum {k} usage per {ty} is {shown}, but limit is {}", l.2))
            }
            (Some(r), _) if r.1 > max => {
                errs.push(format!("maximum {k} usage per {ty} is {shown}, but request is {}", r.2))
            }
            _ => {}
        }
    }
    for (k, ratio, shown) in enforced("maxLimitRequestRatio") {
        let request = find(requests, &k).filter(|r| r.1 != Quantity::ZERO);
        let limit = find(limits, &k).filter(|l| l.1 != Quantity::ZERO);
        let (Some(request), Some(limit)) = (request, limit) else {
            let missing = if request.is_none() { "request" } else { "limit" };
            errs.push(format!(
                "{k} max limit to request ratio per {ty} is {shown}, but no {missing} is specified or {missing} is 0"
            ));
            continue;
        };
        let observed = limit.1.0 as f64 / request.1.0 as f64;
        if observed > ratio.0 as f64 / 1e9 {
            errs.push(format!(
                "{k} max limit to request ratio per {ty} is {shown}, but provided ratio is {observed:.6}"
            ));
        }
    }
}

fn pod_errors(ranges: &[Value], pod: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for item in items(ranges, "Container") {
        for key in ["initContainers", "containers"] {
            for c in pod.at(&["spec", key]).and_then(Value::as_array).into_iter().flatten() {
                let requests = amounts(c.at(&["resources", "requests"]));
                let limits = amounts(c.at(&["resources", "limits"]));
                check(item, "Container", &requests, &limits, &mut errs);
            }
        }
    }
    for item in items(ranges, "Pod") {
        check(item, "Pod", &pod_totals(pod, "requests"), &pod_totals(pod, "limits"), &mut errs);
    }
    errs
}

fn claim_errors(ranges: &[Value], claim: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let requests = amounts(claim.at(&["spec", "resources", "requests"]));
    for item in items(ranges, "PersistentVolumeClaim") {
        let ty = "PersistentVolumeClaim";
        for (k, min, shown) in amounts(item.get("min")) {
            match find(&requests, &k) {
                None => errs.push(format!(
                    "minimum {k} usage per {ty} is {shown}.  No request is specified"
                )),
                Some(r) if r.1 < min => errs
                    .push(format!("minimum {k} usage per {ty} is {shown}, but request is {}", r.2)),
                _ => {}
            }
        }
        for (k, max, shown) in amounts(item.get("max")) {
            match find(&requests, &k) {
                None => errs.push(format!(
                    "maximum {k} usage per {ty} is {shown}.  No request is specified"
                )),
                Some(r) if r.1 > max => errs
                    .push(format!("maximum {k} usage per {ty} is {shown}, but request is {}", r.2)),
                _ => {}
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range() -> Vec<Value> {
        vec![json!({"spec": {"limits": [
            {"type": "Container", "default": {"cpu": "500m"}, "defaultRequest": {"cpu": "100m"},
                "max": {"cpu": "1"}, "min": {"cpu": "50m"}},
            {"type": "Pod", "max": {"cpu": "1500m"}},
        ]}})]
    }

    #[test]
    fn defaults_fill_only_what_containers_leave_unset() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a"},
            {"name": "b", "resources": {"requests": {"cpu": "200m"}}},
        ]}});
        let (mut requests, mut limits) = (Map::new(), Map::new());
        requests.insert("cpu".into(), json!("100m"));
        limits.insert("cpu".into(), json!("500m"));
        let note = set_defaults(&mut pod, &requests, &limits).unwrap();
        assert_eq!(
            note,
            "LimitRanger plugin set: cpu request for container a; cpu limit for container a; \
             cpu limit for container b"
        );
        assert_eq!(
            pod["spec"]["containers"][1]["resources"],
            json!({"limits": {"cpu": "500m"}, "requests": {"cpu": "200m"}})
        );
        assert!(pod_errors(&range(), &pod).is_empty(), "{:?}", pod_errors(&range(), &pod));
    }

    #[test]
    fn min_max_and_pod_totals_are_enforced_with_upstreams_messages() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "2"}}},
            {"name": "b", "resources": {"requests": {"cpu": "100m"}}},
        ]}});
        assert_eq!(
            pod_errors(&range(), &pod),
            [
                "minimum cpu usage per Container is 50m, but request is 10m",
                "maximum cpu usage per Container is 1, but limit is 2",
                "maximum cpu usage per Container is 1.  No limit is specified",
                "maximum cpu usage per Pod is 1500m, but limit is 2",
            ]
        );
        let ratio = vec![json!({"spec": {"limits": [
            {"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}}]}})];
        let pod = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "300m"}}}]}});
        assert_eq!(
            pod_errors(&ratio, &pod),
            ["cpu max limit to request ratio per Container is 2, but provided ratio is 3.000000"]
        );
        let claim = json!({"spec": {"resources": {"requests": {"storage": "5Gi"}}}});
        let pvc = vec![json!({"spec": {"limits": [
            {"type": "PersistentVolumeClaim", "max": {"storage": "2Gi"}}]}})];
        assert_eq!(
            claim_errors(&pvc, &claim),
            ["maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 5Gi"]
        );
    }
}
