//! Preemption (upstream DefaultPreemption, without PodDisruptionBudgets, which are not
//! served): for a pod that fits nowhere, find the node where evicting the fewest and
//! lowest-priority pods makes it fit. Victims are chosen by removing every lower-priority
//! pod, then reprieving as many as possible, highest priority first.

use std::collections::HashMap;
use std::sync::Arc;

use super::cache::{Cache, NodeInfo, PodInfo};
use super::filters::{PodState, Reason, filter};

/// Where to preempt and whom.
#[derive(Debug)]
pub struct Candidate {
    pub node: String,
    pub victims: Vec<Arc<PodInfo>>,
}

/// Upstream `PodEligibleToPreemptOthers`: not with `preemptionPolicy: Never`, and not again
/// while lower-priority pods on the node it was nominated to are still terminating.
pub fn eligible(cache: &Cache, pod: &PodInfo, nominated_node: Option<&str>) -> bool {
    let policy = pod.pod.spec.as_ref().and_then(|s| s.preemption_policy.as_deref());
    if policy == Some("Never") {
        return false;
    }
    if let Some(node) = nominated_node.and_then(|n| cache.node(n))
        && node.pods.values().any(|p| p.terminating && p.priority < pod.priority)
    {
        return false;
    }
    true
}

fn fits(state: &PodState<'_>, node: &NodeInfo) -> bool {
    filter(state, node).is_ok()
}

/// Victims on one node, or `None` if removing every lower-priority pod is not enough.
pub fn select_victims_on_node(state: &PodState<'_>, node: &NodeInfo) -> Option<Vec<Arc<PodInfo>>> {
    let mut trial = node.clone();
    let mut lower: Vec<Arc<PodInfo>> = node
        .pods
        .values()
        .filter(|p| p.priority < state.pod.priority && !p.terminating)
        .cloned()
        .collect();
    if lower.is_empty() {
        return None;
    }
    for p in &lower {
        trial.remove_pod(&p.key);
    }
    if !fits(state, &trial) {
        return None;
    }
    // Reprieve highest priority first (then the longest running, as upstream: by key here).
    lower.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.key.cmp(&b.key)));
    let mut victims = Vec::new();
    for p in lower {
        trial.add_pod(p.clone());
        if !fits(state, &trial) {
            trial.remove_pod(&p.key);
            victims.push(p);
        }
    }
    Some(victims)
}

/// The best node to preempt on, given the filter's reasons per node (nodes failing for a
/// reason preemption cannot fix are skipped).
pub fn find_candidate(
    cache: &Cache,
    state: &PodState<'_>,
    node_reasons: &HashMap<String, Vec<Reason>>,
) -> Option<Candidate> {
    let mut best: Option<((i32, i64, usize), Candidate)> = None;
    for node in cache.nodes() {
        if node.node.is_none() {
            continue;
        }
        let resolvable = node_reasons
            .get(&node.name)
            .is_some_and(|rs| rs.iter().all(Reason::resolvable_by_preemption));
        if !resolvable {
            continue;
        }
        let Some(victims) = select_victims_on_node(state, node) else { continue };
        let highest = victims.iter().map(|v| v.priority).max().unwrap_or(i32::MIN);
        let sum: i64 = victims.iter().map(|v| i64::from(v.priority)).sum();
        let rank = (highest, sum, victims.len());
        if best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, Candidate { node: node.name.clone(), victims }));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::filters::tests::{node, pod};

    fn req(
        name: &str,
        cpu: &str,
        priority: i32,
        node: Option<&str>,
    ) -> k8s_openapi::api::core::v1::Pod {
        pod(
            name,
            json!({"spec": {"priority": priority, "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
    }

    fn setup() -> Cache {
        let mut c = Cache::default();
        c.upsert_node(node("n1", "1", json!({})));
        c.upsert_node(node("n2", "1", json!({})));
        for p in [
            req("a", "500m", 10, Some("n1")),
            req("b", "500m", 5, Some("n1")),
            req("c", "500m", 1, Some("n2")),
            req("d", "500m", 1, Some("n2")),
        ] {
            c.add_pod(Arc::new(PodInfo::new(p)));
        }
        c
    }

    fn reasons(c: &Cache, state: &PodState<'_>) -> HashMap<String, Vec<Reason>> {
        c.nodes()
            .iter()
            .filter_map(|n| filter(state, n).err().map(|r| (n.name.clone(), r)))
            .collect()
    }

    #[test]
    fn minimal_lowest_priority_victims() {
        let c = setup();
        let p = PodInfo::new(req("x", "500m", 100, None));
        let state = PodState::new(&c, &p, HashMap::new());
        let cand = find_candidate(&c, &state, &reasons(&c, &state)).expect("a candidate");
        // n2 only holds priority-1 pods: one of them goes, not both.
        assert_eq!(cand.node, "n2");
        assert_eq!(cand.victims.len(), 1);
        assert_eq!(cand.victims[0].priority, 1);
    }

    #[test]
    fn never_preempts_equal_or_higher_priority() {
        let c = setup();
        // Priority 1: n1 holds 10 and 5, n2 holds 1 and 1: nothing strictly lower.
        let p = PodInfo::new(req("x", "500m", 1, None));
        let state = PodState::new(&c, &p, HashMap::new());
        let none = find_candidate(&c, &state, &reasons(&c, &state));
        assert!(none.is_none(), "{none:?}");
        // Priority 7: either b (5) on n1 or one priority-1 pod on n2: the lower one wins.
        let p = PodInfo::new(req("y", "500m", 7, None));
        let state = PodState::new(&c, &p, HashMap::new());
        let cand = find_candidate(&c, &state, &reasons(&c, &state)).expect("a candidate");
        assert_eq!(cand.node, "n2");
        assert!(cand.victims.iter().all(|v| v.priority == 1));
    }

    #[test]
    fn unresolvable_nodes_are_skipped_and_policy_never_respected() {
        let c = setup();
        let p = PodInfo::new(pod(
            "x",
            json!({"spec": {"priority": 100, "nodeSelector": {"none": "x"},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}),
        ));
        let state = PodState::new(&c, &p, HashMap::new());
        assert!(find_candidate(&c, &state, &reasons(&c, &state)).is_none());
        let never =
            PodInfo::new(pod("y", json!({"spec": {"priority": 100, "preemptionPolicy": "Never"}})));
        assert!(!eligible(&c, &never, None));
        assert!(eligible(&c, &p, Some("n1")));
    }
}
