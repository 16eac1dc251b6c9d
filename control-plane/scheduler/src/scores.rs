//! Scores: how well a feasible node suits a pod, each plugin normalised to 0..=100 and
//! weighted as upstream's default profile (resources 1, balanced 1, node affinity 2,
//! inter-pod affinity 2, topology spread 2, taint toleration 3). Default spreading counts
//! pods of the same controller owner per node, so replicas land on different nodes.

use std::collections::HashMap;

use super::cache::{Cache, NodeInfo};
use super::filters::{PodState, term_selects};
use skiff_core::labels::{term_matches, tolerated};

pub const MAX_SCORE: i64 = 100;

/// Scores of the feasible nodes (indexes into `nodes`), same order.
pub fn score(cache: &Cache, state: &PodState<'_>, nodes: &[&NodeInfo]) -> Vec<i64> {
    let mut total: Vec<i64> =
        nodes.iter().map(|n| least_allocated(state, n) + balanced(state, n)).collect();
    let mut add = |raw: Vec<i64>, weight: i64, reverse: bool| {
        let norm = normalize(&raw, reverse);
        for (t, s) in total.iter_mut().zip(norm) {
            *t += s * weight;
        }
    };
    if let Some(raw) = preferred_node_affinity(state, nodes) {
        add(raw, 2, false);
    }
    if let Some(raw) = preferred_pod_affinity(cache, state, nodes) {
        add(raw, 2, false);
    }
    if let Some(raw) = spreading(state, nodes) {
        add(raw, 2, true);
    }
    if let Some(raw) = prefer_no_schedule_taints(state, nodes) {
        add(raw, 3, true);
    }
    total
}

/// Min-max normalisation to 0..=100 (`reverse`: lower raw is better).
pub fn normalize(raw: &[i64], reverse: bool) -> Vec<i64> {
    let (Some(&min), Some(&max)) = (raw.iter().min(), raw.iter().max()) else { return Vec::new() };
    raw.iter()
        .map(|&r| {
            let s = if max == min { MAX_SCORE } else { (r - min) * MAX_SCORE / (max - min) };
            if reverse { if max == min { MAX_SCORE } else { MAX_SCORE - s } } else { s }
        })
        .collect()
}

fn fractions(state: &PodState<'_>, node: &NodeInfo) -> (f64, f64) {
    let req = &node.nonzero_requested;
    let pod = &state.pod.nonzero;
    let frac = |used: i64, alloc: i64| {
        if alloc <= 0 { 1.0 } else { ((used as f64) / (alloc as f64)).min(1.0) }
    };
    (
        frac(req.milli_cpu + pod.milli_cpu, node.allocatable.milli_cpu),
        frac(req.memory + pod.memory, node.allocatable.memory),
    )
}

/// NodeResourcesFit LeastAllocated: the emptier the node after placing the pod, the better.
pub fn least_allocated(state: &PodState<'_>, node: &NodeInfo) -> i64 {
    let (cpu, mem) = fractions(state, node);
    (((1.0 - cpu) + (1.0 - mem)) / 2.0 * MAX_SCORE as f64) as i64
}

/// NodeResourcesBalancedAllocation: cpu and memory used in the same proportion.
pub fn balanced(state: &PodState<'_>, node: &NodeInfo) -> i64 {
    let (cpu, mem) = fractions(state, node);
    let std = (cpu - mem).abs() / 2.0;
    ((1.0 - std) * MAX_SCORE as f64) as i64
}

pub fn preferred_node_affinity(state: &PodState<'_>, nodes: &[&NodeInfo]) -> Option<Vec<i64>> {
    let terms = state
        .pod
        .pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .preferred_during_scheduling_ignored_during_execution
        .as_ref()?;
    Some(
        nodes
            .iter()
            .map(|n| {
                terms
                    .iter()
                    .filter(|t| term_matches(&t.preference, &n.name, &n.labels))
                    .map(|t| i64::from(t.weight))
                    .sum()
            })
            .collect(),
    )
}

/// Preferred pod affinity (+weight) and anti-affinity (-weight) per matching pod in the
/// node's topology domain.
pub fn preferred_pod_affinity(
    cache: &Cache,
    state: &PodState<'_>,
    nodes: &[&NodeInfo],
) -> Option<Vec<i64>> {
    let affinity = state.pod.pod.spec.as_ref()?.affinity.as_ref()?;
    let mut terms = Vec::new();
    for t in affinity
        .pod_affinity
        .iter()
        .flat_map(|a| a.preferred_during_scheduling_ignored_during_execution.iter().flatten())
    {
        terms.push((&t.pod_affinity_term, i64::from(t.weight)));
    }
    for t in affinity
        .pod_anti_affinity
        .iter()
        .flat_map(|a| a.preferred_during_scheduling_ignored_during_execution.iter().flatten())
    {
        terms.push((&t.pod_affinity_term, -i64::from(t.weight)));
    }
    if terms.is_empty() {
        return None;
    }
    // (topology key, value) → summed weight of matching pods there.
    let mut domains: HashMap<(&str, &str), i64> = HashMap::new();
    for node in cache.nodes() {
        for (term, weight) in &terms {
            let Some(value) = node.labels.get(&term.topology_key) else { continue };
            let n = node
                .pods
                .values()
                .filter(|p| p.key != state.pod.key && term_selects(term, &state.pod.namespace, p))
                .count();
            *domains.entry((term.topology_key.as_str(), value.as_str())).or_default() +=
                weight * n as i64;
        }
    }
    Some(
        nodes
            .iter()
            .map(|n| {
                n.labels.iter().filter_map(|(k, v)| domains.get(&(k.as_str(), v.as_str()))).sum()
            })
            .collect(),
    )
}

/// PodTopologySpread scoring: soft constraints, or by default the pods of the same owner
/// per node. Lower is better.
pub fn spreading(state: &PodState<'_>, nodes: &[&NodeInfo]) -> Option<Vec<i64>> {
    let soft: Vec<_> = state.spread.iter().filter(|s| !s.hard).collect();
    if !soft.is_empty() {
        return Some(
            nodes
                .iter()
                .map(|n| {
                    soft.iter()
                        .map(|s| {
                            n.labels
                                .get(&s.topology_key)
                                .and_then(|v| s.counts.get(v))
                                .copied()
                                .unwrap_or(0)
                        })
                        .sum()
                })
                .collect(),
        );
    }
    if !state.spread.is_empty() {
        return None;
    }
    let owner = state.pod.owner.as_ref()?;
    Some(
        nodes
            .iter()
            .map(|n| {
                if n.owner_counts.is_empty() {
                    return 0;
                }
                i64::from(n.owner_counts.get(owner).copied().unwrap_or(0))
            })
            .collect(),
    )
}

pub fn prefer_no_schedule_taints(state: &PodState<'_>, nodes: &[&NodeInfo]) -> Option<Vec<i64>> {
    if nodes.iter().all(|n| n.taints.is_empty()) {
        return None;
    }
    Some(
        nodes
            .iter()
            .map(|n| {
                n.taints
                    .iter()
                    .filter(|t| t.effect == "PreferNoSchedule" && !tolerated(state.tolerations, t))
                    .count() as i64
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::cache::PodInfo;
    use crate::filters::tests::{node, pod};

    fn cache(
        nodes: Vec<k8s_openapi::api::core::v1::Node>,
        pods: Vec<k8s_openapi::api::core::v1::Pod>,
    ) -> Cache {
        let mut c = Cache::default();
        for n in nodes {
            c.upsert_node(n);
        }
        for p in pods {
            c.add_pod(Arc::new(PodInfo::new(p)));
        }
        c
    }

    fn scores(c: &Cache, p: k8s_openapi::api::core::v1::Pod) -> Vec<i64> {
        let info = PodInfo::new(p);
        let state = PodState::new(c, &info, HashMap::new());
        let nodes: Vec<&NodeInfo> = c.nodes().iter().collect();
        score(c, &state, &nodes)
    }

    #[test]
    fn normalisation() {
        assert_eq!(normalize(&[0, 5, 10], false), vec![0, 50, 100]);
        assert_eq!(normalize(&[0, 5, 10], true), vec![100, 50, 0]);
        assert_eq!(normalize(&[3, 3], true), vec![100, 100]);
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let c = cache(
            vec![node("n1", "2", json!({})), node("n2", "2", json!({}))],
            vec![pod(
                "a",
                json!({"spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}),
            )],
        );
        let s = scores(&c, pod("b", json!({})));
        assert!(s[1] > s[0], "{s:?}");
    }

    #[test]
    fn balanced_prefers_even_use() {
        let info = PodInfo::new(pod(
            "b",
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}]}}),
        ));
        let c = cache(vec![node("n1", "2", json!({})), node("n2", "8", json!({}))], vec![]);
        let state = PodState::new(&c, &info, HashMap::new());
        // n1: cpu 50 %, memory 50 % → perfectly balanced; n2: cpu 12.5 %, memory 50 %.
        assert_eq!(balanced(&state, c.node("n1").unwrap()), 100);
        assert!(balanced(&state, c.node("n2").unwrap()) < 100);
    }

    #[test]
    fn preferred_node_affinity_wins() {
        let c = cache(
            vec![
                node("n1", "2", json!({})),
                node("n2", "2", json!({"metadata": {"labels": {"disk": "ssd"}}})),
            ],
            vec![],
        );
        let p = pod(
            "b",
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}}),
        );
        let s = scores(&c, p);
        assert!(s[1] > s[0], "{s:?}");
    }

    #[test]
    fn preferred_pod_affinity_wins() {
        let c = cache(
            vec![node("n1", "2", json!({})), node("n2", "2", json!({}))],
            vec![pod(
                "db",
                json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "n2"}}),
            )],
        );
        let p = pod(
            "b",
            json!({"spec": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}}]}}}}),
        );
        let s = scores(&c, p);
        assert!(s[1] > s[0], "{s:?}");
    }

    #[test]
    fn default_spreading_by_owner() {
        let owned = |name: &str, node: Option<&str>| {
            pod(
                name,
                json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": true}]},
                             "spec": {"nodeName": node, "containers": [{"name": "c"}]}}),
            )
        };
        let c = cache(
            vec![node("n1", "2", json!({})), node("n2", "2", json!({}))],
            vec![owned("a", Some("n1"))],
        );
        let s = scores(&c, owned("b", None));
        assert!(s[1] > s[0], "{s:?}");
    }

    #[test]
    fn soft_spread_and_prefer_no_schedule() {
        let c = cache(
            vec![
                node("n1", "2", json!({"metadata": {"labels": {"zone": "a"}}})),
                node(
                    "n2",
                    "2",
                    json!({"metadata": {"labels": {"zone": "b"}}, "spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}),
                ),
            ],
            vec![pod("a", json!({"spec": {"nodeName": "n2"}}))],
        );
        let s = scores(&c, pod("b", json!({})));
        assert!(s[0] > s[1], "PreferNoSchedule: {s:?}");
        let spread = pod(
            "b",
            json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}]}}),
        );
        let s = scores(&c, spread);
        assert!(s[0] > s[1], "{s:?}");
    }
}
