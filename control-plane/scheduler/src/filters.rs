//! Filters: whether a pod fits a node. [`PodState`] is computed once per pod per cycle
//! (upstream's PreFilter: affinity terms resolved to topology domains, spread counts), then
//! [`filter`] checks one node in O(1) amortised: node name, Ready, unschedulable,
//! nodeSelector and required node affinity, taints, the node affinity of the pod's bound
//! volumes, resources, host ports, inter-pod affinity and anti-affinity (both directions)
//! and hard topology spread constraints.

use std::collections::{HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{
    NodeSelectorTerm, PodAffinityTerm, Taint, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::cache::{Cache, NodeInfo, PodInfo};
use super::resources::Resources;
use skiff_core::labels::{Labels, selector_matches, terms_match, tolerated};

/// Why a node does not fit, worded as upstream's plugins word it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    NodeName,
    NotReady,
    Unschedulable,
    NodeAffinity,
    Taint(String),
    InsufficientCpu,
    InsufficientMemory,
    TooManyPods,
    HostPorts,
    PodAffinity,
    PodAntiAffinity,
    ExistingAntiAffinity,
    TopologySpread,
    TopologySpreadMissingLabel,
    VolumeNodeAffinity,
}

impl Reason {
    /// Whether evicting pods from the node could remove this reason (upstream:
    /// `Unschedulable` vs `UnschedulableAndUnresolvable`).
    pub fn resolvable_by_preemption(&self) -> bool {
        matches!(
            self,
            Reason::InsufficientCpu
                | Reason::InsufficientMemory
                | Reason::TooManyPods
                | Reason::HostPorts
                | Reason::PodAntiAffinity
                | Reason::ExistingAntiAffinity
                | Reason::TopologySpread
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NodeName => f.write_str("node(s) didn't match the requested node name"),
            Reason::NotReady => {
                f.write_str("node(s) had untolerated taint {node.kubernetes.io/not-ready: }")
            }
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::NodeAffinity => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Reason::Taint(t) => write!(f, "node(s) had untolerated taint {{{t}}}"),
            Reason::InsufficientCpu => f.write_str("Insufficient cpu"),
            Reason::InsufficientMemory => f.write_str("Insufficient memory"),
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::HostPorts => {
                f.write_str("node(s) didn't have free ports for the requested pod ports")
            }
            Reason::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Reason::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Reason::ExistingAntiAffinity => {
                f.write_str("node(s) didn't satisfy existing pods anti-affinity rules")
            }
            Reason::TopologySpread => {
                f.write_str("node(s) didn't match pod topology spread constraints")
            }
            Reason::TopologySpreadMissingLabel => f.write_str(
                "node(s) didn't match pod topology spread constraints (missing required label)",
            ),
            Reason::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
        }
    }
}

/// A required affinity term resolved to the topology values where matching pods run.
#[derive(Debug)]
pub struct ResolvedTerm {
    pub topology_key: String,
    pub values: HashSet<String>,
    /// The incoming pod matches its own term (first pod of a group may go anywhere).
    pub matches_self: bool,
}

/// A topology spread constraint with counts of matching pods per domain.
#[derive(Debug)]
pub struct Spread {
    pub topology_key: String,
    pub max_skew: i32,
    pub hard: bool,
    pub counts: HashMap<String, i64>,
    pub min: i64,
    pub matches_self: bool,
}

/// What the filters and scores need about one pod, computed once per scheduling cycle.
pub struct PodState<'a> {
    pub pod: &'a PodInfo,
    pub node_name: Option<&'a str>,
    pub node_selector: Option<&'a Labels>,
    pub required_terms: Option<&'a [NodeSelectorTerm]>,
    pub tolerations: &'a [Toleration],
    pub affinity: Vec<ResolvedTerm>,
    pub anti_affinity: Vec<ResolvedTerm>,
    /// (topology key, value) domains that existing pods' anti-affinity closes to this pod.
    pub existing_anti: HashSet<(String, String)>,
    pub spread: Vec<Spread>,
    /// Resources of higher-or-equal priority pods nominated to each node (kept free).
    pub nominated: HashMap<String, Resources>,
    /// The required node affinity of each volume the pod's claims are bound to
    /// ([`super::volumes::VolumeCache::prefilter`]).
    pub volume_affinity: Vec<Vec<NodeSelectorTerm>>,
}

fn term_namespaces<'t>(term: &'t PodAffinityTerm, own: &'t str) -> Option<Vec<&'t str>> {
    // `None`: all namespaces (a namespace selector is present; namespace labels are not
    // watched, so a non-empty selector is treated as matching all namespaces).
    if term.namespace_selector.is_some() {
        return None;
    }
    match term.namespaces.as_deref() {
        Some(ns) if !ns.is_empty() => Some(ns.iter().map(String::as_str).collect()),
        _ => Some(vec![own]),
    }
}

/// Whether `target` is selected by `term` of a pod in namespace `owner_ns`.
pub fn term_selects(term: &PodAffinityTerm, owner_ns: &str, target: &PodInfo) -> bool {
    let ns_ok =
        term_namespaces(term, owner_ns).is_none_or(|ns| ns.contains(&target.namespace.as_str()));
    ns_ok && selector_matches(term.label_selector.as_ref(), target.labels())
}

fn resolve(cache: &Cache, pod: &PodInfo, term: &PodAffinityTerm) -> ResolvedTerm {
    let mut values = HashSet::new();
    for node in cache.nodes() {
        let Some(value) = node.labels.get(&term.topology_key) else { continue };
        if values.contains(value) {
            continue;
        }
        if node.pods.values().any(|p| p.key != pod.key && term_selects(term, &pod.namespace, p)) {
            values.insert(value.clone());
        }
    }
    ResolvedTerm {
        topology_key: term.topology_key.clone(),
        values,
        matches_self: term_selects(term, &pod.namespace, pod),
    }
}

impl<'a> PodState<'a> {
    pub fn new(
        cache: &Cache,
        pod: &'a PodInfo,
        nominated: HashMap<String, Resources>,
    ) -> PodState<'a> {
        let spec = pod.pod.spec.as_ref();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let required_terms = affinity
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|r| r.node_selector_terms.as_slice());
        let pod_aff = affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_deref())
            .unwrap_or_default();
        let pod_anti = affinity
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_deref())
            .unwrap_or_default();
        let mut existing_anti = HashSet::new();
        for other in cache.anti_affinity_pods() {
            if other.key == pod.key {
                continue;
            }
            let Some(node) = other
                .node_name()
                .and_then(|n| cache.node(n))
                .or_else(|| cache.nodes().iter().find(|n| n.pods.contains_key(&other.key)))
            else {
                continue;
            };
            let terms = other
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_deref())
                .unwrap_or_default();
            for term in terms {
                if term_selects(term, &other.namespace, pod)
                    && let Some(v) = node.labels.get(&term.topology_key)
                {
                    existing_anti.insert((term.topology_key.clone(), v.clone()));
                }
            }
        }
        let mut state = PodState {
            pod,
            node_name: spec.and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()),
            node_selector: spec.and_then(|s| s.node_selector.as_ref()).filter(|s| !s.is_empty()),
            required_terms,
            tolerations: spec.and_then(|s| s.tolerations.as_deref()).unwrap_or_default(),
            affinity: pod_aff.iter().map(|t| resolve(cache, pod, t)).collect(),
            anti_affinity: pod_anti.iter().map(|t| resolve(cache, pod, t)).collect(),
            existing_anti,
            spread: Vec::new(),
            nominated,
            volume_affinity: Vec::new(),
        };
        state.spread = state.spread_counts(cache);
        state
    }

    /// The first of the node's NoSchedule and NoExecute taints the pod does not tolerate.
    pub fn untolerated_taint<'n>(&self, node: &'n NodeInfo) -> Option<&'n Taint> {
        node.taints.iter().find(|taint| {
            (taint.effect == "NoSchedule" || taint.effect == "NoExecute")
                && !tolerated(self.tolerations, taint)
        })
    }

    /// Node name, selector and required node affinity (upstream NodeName + NodeAffinity).
    pub fn matches_node_affinity(&self, node: &NodeInfo) -> bool {
        let Some(n) = node.node.as_deref() else { return false };
        if let Some(sel) = self.node_selector
            && !sel.iter().all(|(k, v)| node.labels.get(k) == Some(v))
        {
            return false;
        }
        self.required_terms.is_none_or(|terms| terms_match(terms, n))
    }

    fn spread_counts(&self, cache: &Cache) -> Vec<Spread> {
        let constraints = self
            .pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_deref())
            .unwrap_or_default();
        // A node counts for a constraint only if it carries the topology keys of every
        // constraint of the same kind (upstream counts hard and soft ones apart).
        let hard = |c: &TopologySpreadConstraint| c.when_unsatisfiable == "DoNotSchedule";
        let has_keys = |node: &NodeInfo, hard_ones: bool| {
            constraints
                .iter()
                .filter(|c| hard(c) == hard_ones)
                .all(|c| node.labels.contains_key(&c.topology_key))
        };
        let mut out = Vec::new();
        for c in constraints {
            let selector: Option<&LabelSelector> = c.label_selector.as_ref();
            // The nodes whose domains count (upstream's node inclusion policies): by default
            // those the pod's node selector and required affinity admit (`nodeAffinityPolicy:
            // Ignore`: all), tainted ones included (`nodeTaintsPolicy: Honor`: only those
            // whose NoSchedule and NoExecute taints the pod tolerates).
            let honor_affinity = c.node_affinity_policy.as_deref() != Some("Ignore");
            let honor_taints = c.node_taints_policy.as_deref() == Some("Honor");
            let mut counts: HashMap<String, i64> = HashMap::new();
            for node in cache.nodes() {
                let Some(value) = node.labels.get(&c.topology_key) else { continue };
                if node.node.is_none()
                    || !has_keys(node, hard(c))
                    || (honor_affinity && !self.matches_node_affinity(node))
                    || (honor_taints && self.untolerated_taint(node).is_some())
                {
                    continue;
                }
                // Terminating pods are on their way out and do not count (as upstream).
                let n = node
                    .pods
                    .values()
                    .filter(|p| p.key != self.pod.key && p.namespace == self.pod.namespace)
                    .filter(|p| !p.terminating && selector_matches(selector, p.labels()))
                    .count() as i64;
                *counts.entry(value.clone()).or_default() += n;
            }
            let mut min = counts.values().copied().min().unwrap_or(0);
            if let Some(min_domains) = c.min_domains
                && (counts.len() as i32) < min_domains
            {
                min = 0;
            }
            out.push(Spread {
                topology_key: c.topology_key.clone(),
                max_skew: c.max_skew,
                hard: hard(c),
                counts,
                min,
                matches_self: selector_matches(selector, self.pod.labels()),
            });
        }
        out
    }
}

/// Whether the pod fits `node`; the reasons it does not otherwise.
pub fn filter(state: &PodState<'_>, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    if let Some(name) = state.node_name
        && name != node.name
    {
        return Err(vec![Reason::NodeName]);
    }
    if node.node.is_none() || !node.ready {
        return Err(vec![Reason::NotReady]);
    }
    if node.unschedulable
        && !state.tolerations.iter().any(|t| {
            t.key.as_deref() == Some("node.kubernetes.io/unschedulable")
                && t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule")
        })
    {
        return Err(vec![Reason::Unschedulable]);
    }
    if !state.matches_node_affinity(node) {
        return Err(vec![Reason::NodeAffinity]);
    }
    if let Some(taint) = state.untolerated_taint(node) {
        let t = format!("{}: {}", taint.key, taint.value.as_deref().unwrap_or_default());
        return Err(vec![Reason::Taint(t)]);
    }
    if let Some(n) = node.node.as_deref()
        && !state.volume_affinity.iter().all(|terms| terms_match(terms, n))
    {
        return Err(vec![Reason::VolumeNodeAffinity]);
    }
    fits_resources(state, node)?;
    fits_ports(state.pod, node)?;
    fits_inter_pod(state, node)?;
    fits_spread(state, node)
}

/// NodeResourcesFit: requests vs allocatable minus assigned (and nominated) pods.
pub fn fits_resources(state: &PodState<'_>, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    let mut used = node.requested;
    if let Some(n) = state.nominated.get(&node.name) {
        used.add(n);
    }
    let req = &state.pod.requests;
    let alloc = &node.allocatable;
    let mut reasons = Vec::new();
    if used.pods + 1 > alloc.pods {
        reasons.push(Reason::TooManyPods);
    }
    if req.milli_cpu > 0 && used.milli_cpu + req.milli_cpu > alloc.milli_cpu {
        reasons.push(Reason::InsufficientCpu);
    }
    if req.memory > 0 && used.memory + req.memory > alloc.memory {
        reasons.push(Reason::InsufficientMemory);
    }
    if reasons.is_empty() { Ok(()) } else { Err(reasons) }
}

pub fn fits_ports(pod: &PodInfo, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    if pod.host_ports.iter().any(|p| node.used_ports.iter().any(|u| u.conflicts(p))) {
        return Err(vec![Reason::HostPorts]);
    }
    Ok(())
}

pub fn fits_inter_pod(state: &PodState<'_>, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    for term in &state.affinity {
        let value = node.labels.get(&term.topology_key);
        let ok = match value {
            Some(v) => term.values.contains(v) || (term.values.is_empty() && term.matches_self),
            None => false,
        };
        if !ok {
            return Err(vec![Reason::PodAffinity]);
        }
    }
    for term in &state.anti_affinity {
        if node.labels.get(&term.topology_key).is_some_and(|v| term.values.contains(v)) {
            return Err(vec![Reason::PodAntiAffinity]);
        }
    }
    // Upstream order: affinity, own anti-affinity, then existing pods' anti-affinity.
    if !state.existing_anti.is_empty()
        && node.labels.iter().any(|(k, v)| state.existing_anti.contains(&(k.clone(), v.clone())))
    {
        return Err(vec![Reason::ExistingAntiAffinity]);
    }
    Ok(())
}

pub fn fits_spread(state: &PodState<'_>, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    for s in state.spread.iter().filter(|s| s.hard) {
        let Some(value) = node.labels.get(&s.topology_key) else {
            return Err(vec![Reason::TopologySpreadMissingLabel]);
        };
        let count = s.counts.get(value).copied().unwrap_or(0) + i64::from(s.matches_self);
        if count - s.min > i64::from(s.max_skew) {
            return Err(vec![Reason::TopologySpread]);
        }
    }
    Ok(())
}

/// Upstream's FitError message: `0/3 nodes are available: 1 Insufficient cpu, 2 node(s)
/// didn't match Pod's node affinity/selector.` (reasons sorted by text); with no node at all,
/// upstream's `ErrNoNodesAvailable`.
pub fn fit_error_message(total_nodes: usize, reasons: &HashMap<Reason, usize>) -> String {
    if total_nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    if parts.is_empty() {
        format!("0/{total_nodes} nodes are available.")
    } else {
        format!("0/{total_nodes} nodes are available: {}.", parts.join(", "))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::{Value, json};

    use super::*;

    pub fn node(name: &str, cpu: &str, extra: Value) -> Node {
        let mut n = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        merge(&mut n, extra);
        serde_json::from_value(n).unwrap()
    }

    pub fn pod(name: &str, extra: Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}
        });
        merge(&mut p, extra);
        serde_json::from_value(p).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn cache_with(nodes: Vec<Node>, pods: Vec<Pod>) -> Cache {
        let mut cache = Cache::default();
        for n in nodes {
            cache.upsert_node(n);
        }
        for p in pods {
            cache.add_pod(Arc::new(PodInfo::new(p)));
        }
        cache
    }

    fn check(cache: &Cache, p: Pod, node: &str) -> Result<(), Vec<Reason>> {
        let info = PodInfo::new(p);
        let state = PodState::new(cache, &info, HashMap::new());
        filter(&state, cache.node(node).unwrap())
    }

    #[test]
    fn resources() {
        let cache = cache_with(
            vec![node("n1", "1", json!({}))],
            vec![pod(
                "a",
                json!({"spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "600m"}}}]}}),
            )],
        );
        let small = pod(
            "b",
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "400m"}}}]}}),
        );
        let big = pod(
            "c",
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "9Gi"}}}]}}),
        );
        assert_eq!(check(&cache, small, "n1"), Ok(()));
        assert_eq!(
            check(&cache, big, "n1"),
            Err(vec![Reason::InsufficientCpu, Reason::InsufficientMemory])
        );
        let full = cache_with(
            vec![node("n1", "1", json!({"status": {"allocatable": {"pods": "1"}}}))],
            vec![pod("a", json!({"spec": {"nodeName": "n1"}}))],
        );
        assert_eq!(check(&full, pod("b", json!({})), "n1"), Err(vec![Reason::TooManyPods]));
    }

    #[test]
    fn nominated_resources_are_kept_free() {
        let cache = cache_with(vec![node("n1", "1", json!({}))], vec![]);
        let info = PodInfo::new(pod(
            "b",
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "600m"}}}]}}),
        ));
        let nominated =
            HashMap::from([("n1".to_string(), Resources { milli_cpu: 500, memory: 0, pods: 1 })]);
        let state = PodState::new(&cache, &info, nominated);
        assert_eq!(filter(&state, cache.node("n1").unwrap()), Err(vec![Reason::InsufficientCpu]));
    }

    #[test]
    fn node_name_ready_unschedulable() {
        let cache = cache_with(
            vec![
                node("n1", "1", json!({})),
                node(
                    "n2",
                    "1",
                    json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                ),
                node("n3", "1", json!({"spec": {"unschedulable": true}})),
            ],
            vec![],
        );
        assert_eq!(
            check(&cache, pod("a", json!({"spec": {"nodeName": "n2"}})), "n1"),
            Err(vec![Reason::NodeName])
        );
        assert_eq!(check(&cache, pod("a", json!({})), "n2"), Err(vec![Reason::NotReady]));
        assert_eq!(check(&cache, pod("a", json!({})), "n3"), Err(vec![Reason::Unschedulable]));
        assert_eq!(check(&cache, pod("a", json!({})), "n1"), Ok(()));
    }

    #[test]
    fn selectors_and_node_affinity() {
        let cache = cache_with(
            vec![
                node("n1", "1", json!({"metadata": {"labels": {"disk": "ssd"}}})),
                node("n2", "1", json!({})),
            ],
            vec![],
        );
        let sel = pod("a", json!({"spec": {"nodeSelector": {"disk": "ssd"}}}));
        assert_eq!(check(&cache, sel.clone(), "n1"), Ok(()));
        assert_eq!(check(&cache, sel, "n2"), Err(vec![Reason::NodeAffinity]));
        let aff = pod(
            "a",
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "DoesNotExist"}]}]}}}}}),
        );
        assert_eq!(check(&cache, aff.clone(), "n1"), Err(vec![Reason::NodeAffinity]));
        assert_eq!(check(&cache, aff, "n2"), Ok(()));
    }

    #[test]
    fn taints_and_tolerations() {
        let cache = cache_with(
            vec![
                node(
                    "n1",
                    "1",
                    json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}),
                ),
                node(
                    "n2",
                    "1",
                    json!({"spec": {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}}),
                ),
            ],
            vec![],
        );
        assert_eq!(
            check(&cache, pod("a", json!({})), "n1"),
            Err(vec![Reason::Taint("gpu: yes".into())])
        );
        assert_eq!(check(&cache, pod("a", json!({})), "n2"), Ok(()));
        let tol = pod(
            "a",
            json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(check(&cache, tol, "n1"), Ok(()));
        assert_eq!(
            Reason::Taint("gpu: yes".into()).to_string(),
            "node(s) had untolerated taint {gpu: yes}"
        );
    }

    #[test]
    fn host_ports() {
        let port = |ip: &str| json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]}]}});
        let mut bound = port("");
        bound["spec"]["nodeName"] = json!("n1");
        let cache = cache_with(
            vec![node("n1", "1", json!({})), node("n2", "1", json!({}))],
            vec![pod("a", bound)],
        );
        assert_eq!(check(&cache, pod("b", port("10.0.0.1")), "n1"), Err(vec![Reason::HostPorts]));
        assert_eq!(check(&cache, pod("b", port("")), "n2"), Ok(()));
        let udp = json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]}});
        assert_eq!(check(&cache, pod("b", udp), "n1"), Ok(()));
    }

    #[test]
    fn inter_pod_affinity_and_anti_affinity() {
        let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}});
        let aff = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}]}});
        let cache = cache_with(
            vec![
                node("n1", "1", json!({"metadata": {"labels": {"zone": "a"}}})),
                node("n2", "1", json!({"metadata": {"labels": {"zone": "b"}}})),
            ],
            vec![
                pod("web1", json!({"spec": {"nodeName": "n1"}})),
                pod(
                    "db1",
                    json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "n2"}}),
                ),
            ],
        );
        let web2 = pod("web2", json!({"spec": {"affinity": anti.clone()}}));
        assert_eq!(check(&cache, web2.clone(), "n1"), Err(vec![Reason::PodAntiAffinity]));
        assert_eq!(check(&cache, web2, "n2"), Ok(()));
        let with_db =
            pod("x", json!({"metadata": {"labels": {"app": "x"}}, "spec": {"affinity": aff}}));
        assert_eq!(check(&cache, with_db.clone(), "n1"), Err(vec![Reason::PodAffinity]));
        assert_eq!(check(&cache, with_db, "n2"), Ok(()));

        // Symmetry: an existing pod's anti-affinity keeps matching pods away from its node.
        let mut guarded = pod(
            "g",
            json!({"metadata": {"labels": {"app": "g"}}, "spec": {"nodeName": "n2", "affinity": anti}}),
        );
        guarded.metadata.labels.as_mut().unwrap().insert("app".into(), "guard".into());
        let cache =
            cache_with(vec![node("n1", "1", json!({})), node("n2", "1", json!({}))], vec![guarded]);
        assert_eq!(
            check(&cache, pod("w", json!({})), "n2"),
            Err(vec![Reason::ExistingAntiAffinity])
        );
        assert_eq!(check(&cache, pod("w", json!({})), "n1"), Ok(()));
    }

    #[test]
    fn hard_topology_spread() {
        let spread = json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}});
        let cache = cache_with(
            vec![
                node("n1", "1", json!({"metadata": {"labels": {"zone": "a"}}})),
                node("n2", "1", json!({"metadata": {"labels": {"zone": "b"}}})),
                node("n3", "1", json!({})),
            ],
            vec![pod("w1", json!({"spec": {"nodeName": "n1"}}))],
        );
        assert_eq!(
            check(&cache, pod("w2", spread.clone()), "n1"),
            Err(vec![Reason::TopologySpread])
        );
        assert_eq!(check(&cache, pod("w2", spread.clone()), "n2"), Ok(()));
        assert_eq!(
            check(&cache, pod("w2", spread), "n3"),
            Err(vec![Reason::TopologySpreadMissingLabel])
        );
    }

    /// A node without every hard constraint's topology key cannot take the pod, so its
    /// domains do not count either: here the zoneless n3's empty hostname domain would
    /// otherwise hold the minimum at 0 and keep the third pod off n1.
    #[test]
    fn topology_spread_counts_only_nodes_with_every_key() {
        let constraint = |key: &str| {
            json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}}})
        };
        let spread = json!({"spec": {"topologySpreadConstraints":
            [constraint("zone"), constraint("kubernetes.io/hostname")]}});
        let zone = |zone: &str| json!({"metadata": {"labels": {"zone": zone}}});
        let cache = cache_with(
            vec![
                node("n1", "1", zone("a")),
                node("n2", "1", zone("b")),
                node("n3", "1", json!({})),
            ],
            vec![
                pod("w1", json!({"spec": {"nodeName": "n1"}})),
                pod("w2", json!({"spec": {"nodeName": "n2"}})),
            ],
        );
        assert_eq!(check(&cache, pod("w3", spread.clone()), "n1"), Ok(()));
        assert_eq!(
            check(&cache, pod("w3", spread), "n3"),
            Err(vec![Reason::TopologySpreadMissingLabel])
        );
    }

    #[test]
    fn topology_spread_leaves_out_terminating_pods() {
        let spread = json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}}]}});
        let going = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1"}});
        let cache = cache_with(
            vec![node("n1", "1", json!({})), node("n2", "1", json!({}))],
            vec![pod("w1", going)],
        );
        assert_eq!(check(&cache, pod("w2", spread), "n1"), Ok(()), "n1 counts 0 pods, as n2");
    }

    /// A lost node (tainted unreachable, its pods evicted): `nodeTaintsPolicy: Honor` leaves
    /// its domain out, so the pods it held fit on the others; by default it still counts.
    #[test]
    fn topology_spread_node_inclusion_policies() {
        let spread = |policies: Value| {
            let mut c = json!({"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}});
            merge(&mut c, policies);
            json!({"spec": {"nodeSelector": {"pool": "web"}, "topologySpreadConstraints": [c]}})
        };
        let pool = json!({"metadata": {"labels": {"pool": "web"}}});
        let mut lost = pool.clone();
        merge(
            &mut lost,
            json!({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}}),
        );
        let cache = cache_with(
            vec![
                node("n1", "1", pool.clone()),
                node("n2", "1", pool),
                node("lost", "1", lost),
                node("other", "1", json!({})),
            ],
            vec![
                pod("w1", json!({"spec": {"nodeName": "n1"}})),
                pod("w2", json!({"spec": {"nodeName": "n2"}})),
            ],
        );
        // The lost node's empty domain counts: every other domain is one pod ahead.
        assert_eq!(
            check(&cache, pod("w3", spread(json!({}))), "n1"),
            Err(vec![Reason::TopologySpread])
        );
        let honor = spread(json!({"nodeTaintsPolicy": "Honor"}));
        assert_eq!(check(&cache, pod("w3", honor), "n1"), Ok(()));
        // The unselected node counts only under `nodeAffinityPolicy: Ignore`.
        let ignore_affinity =
            spread(json!({"nodeTaintsPolicy": "Honor", "nodeAffinityPolicy": "Ignore"}));
        assert_eq!(
            check(&cache, pod("w3", ignore_affinity), "n1"),
            Err(vec![Reason::TopologySpread])
        );
    }

    #[test]
    fn fit_error_messages_match_upstream() {
        let reasons = HashMap::from([(Reason::InsufficientCpu, 3)]);
        assert_eq!(fit_error_message(3, &reasons), "0/3 nodes are available: 3 Insufficient cpu.");
        assert_eq!(fit_error_message(0, &HashMap::new()), "no nodes available to schedule pods");
    }
}
