//! The node lifecycle controller: watches node Leases (kube-node-lease) and Node status.
//! - A node not heard from for `node_monitor_grace_period` (`node_startup_grace_period` if it
//!   never posted a status) gets its Ready, MemoryPressure, DiskPressure and PIDPressure
//!   conditions set to Unknown. NetworkUnavailable is left alone, as upstream.
//! - Conditions become NoSchedule taints as upstream's `doNoScheduleTaintingPass`: Ready
//!   False/Unknown (`not-ready` / `unreachable`), memory, disk and PID pressure, an
//!   unavailable network, and a cordoned node (`unschedulable`). Ready False/Unknown also
//!   become NoExecute taints. Each is removed when its condition clears.
//! - Pods of a node not Ready are marked Ready=False at once (so endpoints drop them) and
//!   evicted once their toleration of the NoExecute taint runs out (the taint-eviction
//!   controller's job upstream).
//!
//! Staleness is measured on the controller's own monotonic clock (when it last saw the
//! Lease change), as upstream's `nodeHealthData.probeTimestamp`, so skewed node clocks do
//! not matter and tests can use paused time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::informer::{Change, informer};
use crate::context::Context;
use skiff_core::events::{EventRecorder, EventType};

pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// (condition type, status, NoSchedule taint key): upstream's
/// `nodeConditionToTaintKeyStatusMap`.
const CONDITION_TAINTS: [(&str, &str, &str); 6] = [
    ("Ready", "False", TAINT_NOT_READY),
    ("Ready", "Unknown", TAINT_UNREACHABLE),
    ("MemoryPressure", "True", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    ("NetworkUnavailable", "True", "node.kubernetes.io/network-unavailable"),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];

/// The conditions set to Unknown on a silent node (NetworkUnavailable is the control
/// plane's, not the kubelet's).
const HEALTH_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
const LEASE_NAMESPACE: &str = "kube-node-lease";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("marking node {node} status unknown")]
    NodeStatus {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the taints of node {node}")]
    Taints {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("marking pod {pod} not ready")]
    PodNotReady {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("evicting pod {pod}")]
    Evict {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Per node: the last Lease renewTime / Ready heartbeat seen and when it was seen.
struct Health {
    renew: Option<String>,
    heartbeat: Option<String>,
    probe: Instant,
}

struct Monitor {
    client: Client,
    grace: Duration,
    startup_grace: Duration,
    default_toleration: Duration,
    nodes: Store<Node>,
    leases: Store<Lease>,
    pods: Store<Pod>,
    health: HashMap<String, Health>,
    /// When each NoExecute taint (node, key) was first seen.
    taint_seen: HashMap<(String, String), Instant>,
    recorder: EventRecorder,
}

/// The node monitor period (upstream `--node-monitor-period` 5 s).
pub const MONITOR_PERIOD: Duration = Duration::from_secs(5);

/// Run the node lifecycle controller until dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<ObjectRef<Node>>();
    let nodes = informer(&ctx.informers.all::<Node>(), tx.clone(), {
        |c| match c {
            Change::Applied(n) => vec![ObjectRef::from_obj(n)],
            Change::Deleted(_) => Vec::new(),
        }
    })
    .await;
    // Every Lease and every Pod (shared with the other controllers); the node leases are
    // looked up in LEASE_NAMESPACE, and unscheduled pods belong to no node.
    let leases = informer(&ctx.informers.all::<Lease>(), tx.clone(), |_| Vec::new()).await;
    let pods = informer(&ctx.informers.all::<Pod>(), tx, |_| Vec::new()).await;
    let _ = nodes.wait_until_ready().await;
    let _ = leases.wait_until_ready().await;
    let _ = pods.wait_until_ready().await;
    let mut m = Monitor {
        recorder: EventRecorder::new(client.clone(), "node-controller"),
        client,
        grace: ctx.config.node_monitor_grace_period,
        startup_grace: ctx.config.node_startup_grace_period,
        default_toleration: ctx.config.default_toleration,
        nodes,
        leases,
        pods,
        health: HashMap::new(),
        taint_seen: HashMap::new(),
    };
    let mut tick = tokio::time::interval(MONITOR_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(_) = rx.recv() => {
                // Node changes (Ready reported again): act promptly, coalescing bursts.
                while rx.try_recv().is_ok() {}
            }
        }
        m.monitor().await;
    }
}

fn conditions_of(node: &Node) -> &[NodeCondition] {
    node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    conditions_of(node).iter().find(|c| c.type_ == "Ready")
}

/// The taints (key, effect) that `conditions` and a cordon call for.
pub fn desired_taints(
    conditions: &[NodeCondition],
    unschedulable: bool,
) -> Vec<(&'static str, &'static str)> {
    let mut taints: Vec<(&str, &str)> = CONDITION_TAINTS
        .iter()
        .filter(|(type_, status, _)| {
            conditions.iter().any(|c| c.type_ == *type_ && c.status == *status)
        })
        .map(|&(_, _, key)| (key, "NoSchedule"))
        .collect();
    if unschedulable {
        taints.push((TAINT_UNSCHEDULABLE, "NoSchedule"));
    }
    match conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str()) {
        Some("False") => taints.push((TAINT_NOT_READY, "NoExecute")),
        Some("Unknown") => taints.push((TAINT_UNREACHABLE, "NoExecute")),
        _ => {}
    }
    taints
}

/// Whether this controller owns `t`: the taints [`desired_taints`] can ask for.
fn managed(t: &Taint) -> bool {
    match t.effect.as_str() {
        "NoSchedule" => {
            t.key == TAINT_UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key)
        }
        "NoExecute" => t.key == TAINT_UNREACHABLE || t.key == TAINT_NOT_READY,
        _ => false,
    }
}

/// Upstream's conditions for a node not heard from: each health condition not already
/// Unknown becomes Unknown (NodeStatusUnknown); one never posted is added as
/// NodeStatusNeverUpdated. `None` when nothing changes.
fn unknown_conditions(node: &Node, now: &Time) -> Option<Vec<NodeCondition>> {
    let mut conditions = conditions_of(node).to_vec();
    let mut changed = false;
    for type_ in HEALTH_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            None => conditions.push(NodeCondition {
                type_: type_.into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                last_transition_time: Some(now.clone()),
            }),
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(now.clone());
            }
            Some(_) => continue,
        }
        changed = true;
    }
    changed.then_some(conditions)
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    match t.key.as_deref().unwrap_or("") {
        "" => t.operator.as_deref() == Some("Exists"),
        key if key != taint.key => false,
        _ => match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        },
    }
}

/// How long a pod may stay on a node with these NoExecute taints: `None` when some taint
/// is not tolerated (evict now, unless `default` applies: pods with no toleration at all for
/// the lifecycle taints get `default`, as the DefaultTolerationSeconds admission would
/// have given them), `Some(None)` forever, `Some(Some(d))` for `d` after the taint.
pub fn toleration_time(pod: &Pod, taints: &[Taint], default: Duration) -> Option<Option<Duration>> {
    let tolerations: &[Toleration] =
        pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
    let mut min: Option<Duration> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let matching: Vec<&Toleration> =
            tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        let d = if matching.is_empty() {
            if taint.key == TAINT_UNREACHABLE || taint.key == TAINT_NOT_READY {
                Some(default)
            } else {
                return None;
            }
        } else {
            matching
                .iter()
                .map(|t| t.toleration_seconds.map(|s| Duration::from_secs(s.max(0) as u64)))
                // The most permissive matching toleration wins (None = forever).
                .try_fold(Duration::ZERO, |acc, d| d.map(|d| acc.max(d)))
        };
        if let Some(d) = d {
            min = Some(min.map_or(d, |m: Duration| m.min(d)));
        }
    }
    Some(min)
}

impl Monitor {
    async fn monitor(&mut self) {
        let now = Instant::now();
        let nodes = self.nodes.state();
        self.health.retain(|n, _| nodes.iter().any(|x| x.name_any() == *n));
        self.taint_seen.retain(|(n, _), _| nodes.iter().any(|x| x.name_any() == *n));
        for node in nodes {
            if let Err(e) = self.monitor_node(&node, now).await {
                tracing::warn!(node = %node.name_any(), error = %e, "node lifecycle");
            }
        }
    }

    async fn monitor_node(&mut self, node: &Node, now: Instant) -> Result<()> {
        let name = node.name_any();
        let renew = self
            .leases
            .get(&ObjectRef::new(&name).within(LEASE_NAMESPACE))
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| format!("{:?}", t.0)));
        let ready = ready_condition(node);
        let heartbeat =
            ready.and_then(|c| c.last_heartbeat_time.as_ref().map(|t| format!("{:?}", t.0)));
        let h = self.health.entry(name.clone()).or_insert(Health {
            renew: renew.clone(),
            heartbeat: heartbeat.clone(),
            probe: now,
        });
        if h.renew != renew || h.heartbeat != heartbeat {
            h.renew = renew;
            h.heartbeat = heartbeat;
            h.probe = now;
        }
        // A node that never posted a status has the longer startup grace period.
        let grace = if ready.is_some() { self.grace } else { self.startup_grace };
        let was_ready = ready.is_some_and(|c| c.status == "True");
        let mut conditions = conditions_of(node).to_vec();
        let mut patched = None;
        if now.duration_since(h.probe) > grace
            && let Some(unknown) =
                unknown_conditions(node, &Time(k8s_openapi::jiff::Timestamp::now()))
        {
            patched = self.mark_unknown(node, &unknown).await?;
            conditions = unknown;
            if was_ready {
                self.recorder
                    .record(
                        node,
                        EventType::Normal,
                        "NodeNotReady",
                        &format!("Node {name} status is now: NodeNotReady"),
                    )
                    .await;
            }
        }
        // The taints go on the node as just written (its new resourceVersion).
        let node = patched.as_ref().unwrap_or(node);
        let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        self.reconcile_taints(node, &desired_taints(&conditions, unschedulable), now).await?;
        // Not reported yet (and not stale) is not "not ready".
        if conditions.iter().any(|c| c.type_ == "Ready" && c.status != "True") {
            self.mark_pods_not_ready(&name).await?;
        }
        self.evict(node, now).await
    }

    /// Write `conditions`; the node as written, `None` if it changed or went meanwhile.
    async fn mark_unknown(
        &self,
        node: &Node,
        conditions: &[NodeCondition],
    ) -> Result<Option<Node>> {
        let name = node.name_any();
        let patch = json!({"metadata": {"resourceVersion": node.resource_version()},
                           "status": {"conditions": conditions}});
        let api: Api<Node> = Api::all(self.client.clone());
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(written) => Ok(Some(written)),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(None),
            Err(source) => Err(Error::NodeStatus { node: name, source }),
        }
    }

    async fn reconcile_taints(
        &mut self,
        node: &Node,
        want: &[(&'static str, &'static str)],
        now: Instant,
    ) -> Result<()> {
        let name = node.name_any();
        let current: Vec<Taint> =
            node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let mut next: Vec<Taint> = current
            .iter()
            .filter(|t| !managed(t) || want.contains(&(t.key.as_str(), t.effect.as_str())))
            .cloned()
            .collect();
        for (key, effect) in want {
            if !next.iter().any(|t| t.key == *key && t.effect == *effect) {
                next.push(Taint {
                    key: key.to_string(),
                    effect: effect.to_string(),
                    time_added: (*effect == "NoExecute")
                        .then(|| Time(k8s_openapi::jiff::Timestamp::now())),
                    value: None,
                });
            }
        }
        // Remember when each NoExecute taint appeared (from its timeAdded if it predates us).
        for t in next.iter().filter(|t| t.effect == "NoExecute") {
            self.taint_seen.entry((name.clone(), t.key.clone())).or_insert_with(|| {
                let age = t
                    .time_added
                    .as_ref()
                    .map(|ta| k8s_openapi::jiff::Timestamp::now().duration_since(ta.0))
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default();
                now.checked_sub(age).unwrap_or(now)
            });
        }
        self.taint_seen.retain(|(n, k), _| {
            *n != name || next.iter().any(|t| t.key == *k && t.effect == "NoExecute")
        });
        if next == current {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": node.resource_version()},
                           "spec": {"taints": next}});
        let api: Api<Node> = Api::all(self.client.clone());
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(source) => Err(Error::Taints { node: name, source }),
        }
    }

    fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .collect()
    }

    /// Upstream `MarkPodsNotReady`: Ready=False on every pod of the node.
    async fn mark_pods_not_ready(&self, node: &str) -> Result<()> {
        for pod in self.pods_on(node) {
            let conds = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let Some(i) = conds.iter().position(|c| c.type_ == "Ready") else { continue };
            if conds[i].status != "True" {
                continue;
            }
            let mut conds = conds;
            conds[i].status = "False".into();
            conds[i].reason = Some("NodeNotReady".into());
            conds[i].message = Some(format!("Node {node} is not ready"));
            conds[i].last_transition_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let patch = json!({"metadata": {"resourceVersion": pod.resource_version()},
                               "status": {"conditions": conds}});
            match api
                .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => {
                    return Err(Error::PodNotReady {
                        pod: format!("{ns}/{}", pod.name_any()),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Evict (gracefully delete) pods whose toleration of the node's NoExecute taints ran out.
    async fn evict(&self, node: &Node, now: Instant) -> Result<()> {
        let name = node.name_any();
        let taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.effect == "NoExecute")
            .collect();
        if taints.is_empty() {
            return Ok(());
        }
        let since = taints
            .iter()
            .filter_map(|t| self.taint_seen.get(&(name.clone(), t.key.clone())))
            .max()
            .copied()
            .unwrap_or(now);
        for pod in self.pods_on(&name) {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let due = match toleration_time(&pod, &taints, self.default_toleration) {
                None => true,
                Some(None) => false,
                Some(Some(d)) => now.duration_since(since) >= d,
            };
            if !due {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            self.recorder
                .record(
                    pod.as_ref(),
                    EventType::Normal,
                    "TaintManagerEviction",
                    "Marking for deletion Pod",
                )
                .await;
            match api.delete(&pod.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => {
                    return Err(Error::Evict { pod: format!("{ns}/{}", pod.name_any()), source });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
