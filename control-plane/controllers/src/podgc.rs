//! Pod garbage collection (upstream's podgc controller): every `pod_gc_period` it
//! force-deletes (gracePeriodSeconds=0) the pods nothing else will ever finish:
//! - terminated pods (Succeeded/Failed) beyond `terminated_pod_gc_threshold`, oldest first
//!   (evicted ones before the others);
//! - terminating pods on a node that is not Ready and carries the
//!   `node.kubernetes.io/out-of-service` taint (the operator's statement that the node is
//!   gone for good — upstream does not force-delete pods of a merely unreachable node, so
//!   that StatefulSet pods keep their at-most-one semantics);
//! - orphaned pods, bound to a node that no longer exists (after a quarantine of
//!   `pod_gc_quarantine`, and confirmed with a GET of the node);
//! - terminating pods that were never scheduled.
//!
//! Non-terminal pods are first moved to phase Failed (orphaned ones with a DisruptionTarget
//! condition, reason DeletionByPodGC), as upstream's `markFailedAndDeletePodWithCondition`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::informer::informer;
use crate::context::Context;

/// The taint an operator puts on a node that is out of service for good.
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("marking pod {pod} failed")]
    MarkFailed {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("force-deleting pod {pod}")]
    Delete {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("checking whether node {node} exists")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a pod is collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Terminated pods beyond the threshold.
    Terminated,
    /// Terminating on a NotReady node with the out-of-service taint.
    OutOfService,
    /// Bound to a node that no longer exists.
    Orphaned,
    /// Terminating but never scheduled.
    UnscheduledTerminating,
}

/// What podgc needs to know of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView {
    pub ready: bool,
    pub out_of_service: bool,
}

impl NodeView {
    pub fn of(node: &Node) -> NodeView {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let out_of_service = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TAINT_OUT_OF_SERVICE));
        NodeView { ready, out_of_service }
    }
}

fn node_of(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

fn is_terminated(pod: &Pod) -> bool {
    matches!(super::pods::phase(pod), "Succeeded" | "Failed")
}

/// Node names pods are bound to that are not among `nodes`.
pub fn missing_nodes(pods: &[Arc<Pod>], nodes: &HashMap<String, NodeView>) -> HashSet<String> {
    pods.iter()
        .map(|p| node_of(p))
        .filter(|n| !n.is_empty() && !nodes.contains_key(*n))
        .map(str::to_string)
        .collect()
}

/// The pods to collect and why, in upstream's order (terminated, terminating on
/// out-of-service nodes, orphaned, unscheduled terminating); each pod at most once.
/// `gone` are the nodes confirmed deleted; `threshold` 0 disables the terminated-pod GC.
pub fn plan(
    pods: &[Arc<Pod>],
    nodes: &HashMap<String, NodeView>,
    gone: &HashSet<String>,
    threshold: usize,
) -> Vec<(Arc<Pod>, Why)> {
    let mut out: Vec<(Arc<Pod>, Why)> = Vec::new();
    if threshold > 0 {
        let mut terminated: Vec<&Arc<Pod>> = pods.iter().filter(|p| is_terminated(p)).collect();
        if terminated.len() > threshold {
            // byEvictionAndCreationTimestamp: evicted first, then oldest.
            let evicted =
                |p: &Pod| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted");
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            terminated.sort_by(|a, b| {
                evicted(b)
                    .cmp(&evicted(a))
                    .then_with(|| created(a).cmp(&created(b)))
                    .then_with(|| a.name_any().cmp(&b.name_any()))
            });
            let n = terminated.len() - threshold;
            out.extend(terminated.into_iter().take(n).map(|p| (p.clone(), Why::Terminated)));
        }
    }
    for p in pods.iter().filter(|p| super::pods::is_terminating(p)) {
        if nodes.get(node_of(p)).is_some_and(|n| !n.ready && n.out_of_service) {
            out.push((p.clone(), Why::OutOfService));
        }
    }
    for p in pods {
        if gone.contains(node_of(p)) {
            out.push((p.clone(), Why::Orphaned));
        }
    }
    for p in pods.iter().filter(|p| super::pods::is_terminating(p) && node_of(p).is_empty()) {
        out.push((p.clone(), Why::UnscheduledTerminating));
    }
    let mut seen = HashSet::new();
    out.retain(|(p, _)| seen.insert(p.uid().unwrap_or_else(|| p.name_any())));
    out
}

struct Gc {
    client: Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    threshold: usize,
    quarantine: Duration,
    /// Nodes pods point at that our cache lacks, and since when.
    missing_since: HashMap<String, Instant>,
}

/// Run the pod garbage collector until dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (tx, _rx) = mpsc::unbounded_channel::<ObjectRef<Pod>>();
    let pods = informer(&ctx.informers.all::<Pod>(), tx.clone(), |_| Vec::new()).await;
    let nodes = informer(&ctx.informers.all::<Node>(), tx, |_| Vec::new()).await;
    let _ = pods.wait_until_ready().await;
    let _ = nodes.wait_until_ready().await;
    let mut gc = Gc {
        client,
        pods,
        nodes,
        threshold: ctx.config.terminated_pod_gc_threshold,
        quarantine: ctx.config.pod_gc_quarantine,
        missing_since: HashMap::new(),
    };
    let mut tick = tokio::time::interval(ctx.config.pod_gc_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        gc.pass().await;
    }
}

impl Gc {
    async fn pass(&mut self) {
        let now = Instant::now();
        let pods = self.pods.state();
        let nodes: HashMap<String, NodeView> =
            self.nodes.state().iter().map(|n| (n.name_any(), NodeView::of(n))).collect();
        let missing = missing_nodes(&pods, &nodes);
        self.missing_since.retain(|n, _| missing.contains(n));
        let mut gone = HashSet::new();
        for name in missing {
            let since = *self.missing_since.entry(name.clone()).or_insert(now);
            if now.duration_since(since) < self.quarantine {
                continue;
            }
            // The cache may lag: only the API's NotFound makes a node gone.
            match Api::<Node>::all(self.client.clone()).get_opt(&name).await {
                Ok(None) => {
                    gone.insert(name);
                }
                Ok(Some(_)) => {
                    self.missing_since.remove(&name);
                }
                Err(source) => {
                    tracing::warn!(error = %Error::GetNode { node: name, source }, "pod gc");
                }
            }
        }
        for (pod, why) in plan(&pods, &nodes, &gone, self.threshold) {
            if let Err(e) = self.collect(&pod, why).await {
                tracing::warn!(error = %e, "pod gc");
            }
        }
    }

    async fn collect(&self, pod: &Pod, why: Why) -> Result<()> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let key = format!("{ns}/{name}");
        tracing::info!(pod = %key, reason = ?why, "PodGC is force deleting Pod");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        if !is_terminated(pod) {
            let mut status = json!({"phase": "Failed"});
            if why == Why::Orphaned {
                status["conditions"] = json!([{
                    "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists",
                    "lastTransitionTime": Time(super::pods::now()),
                }]);
            }
            let patch = json!({"status": status});
            match api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await
            {
                Ok(_) => {}
                Err(e) if super::pods::is_not_found(&e) => return Ok(()),
                Err(source) => return Err(Error::MarkFailed { pod: key, source }),
            }
        }
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: pod
                .uid()
                .map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(source) => Err(Error::Delete { pod: key, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ControllerConfig;
    use crate::testutil::{api, pod, wait_for};
    use kube::api::PostParams;

    fn p(name: &str, node: &str, phase: &str, terminating: bool, created: i64) -> Arc<Pod> {
        let mut v = json!({
            "metadata": {"name": name, "uid": name,
                         "creationTimestamp": format!("2026-01-01T00:00:{created:02}Z")},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase}
        });
        if terminating {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        }
        Arc::new(serde_json::from_value(v).expect("pod"))
    }

    fn names(plan: &[(Arc<Pod>, Why)]) -> Vec<(String, Why)> {
        plan.iter().map(|(p, w)| (p.name_any(), *w)).collect()
    }

    #[test]
    fn plan_follows_upstream_podgc() {
        let nodes: HashMap<String, NodeView> = [
            ("ready".to_string(), NodeView { ready: true, out_of_service: false }),
            ("lost".to_string(), NodeView { ready: false, out_of_service: false }),
            ("oos".to_string(), NodeView { ready: false, out_of_service: true }),
        ]
        .into();
        let pods = vec![
            p("done-new", "ready", "Succeeded", false, 30),
            p("done-old", "ready", "Failed", false, 10),
            p("done-mid", "ready", "Succeeded", false, 20),
            p("running", "ready", "Running", false, 1),
            p("stuck-lost", "lost", "Running", true, 1),
            p("stuck-oos", "oos", "Running", true, 1),
            p("live-oos", "oos", "Running", false, 1),
            p("orphan", "deleted", "Running", false, 1),
            p("unscheduled", "", "Pending", true, 1),
            p("pending", "", "Pending", false, 1),
        ];
        assert_eq!(missing_nodes(&pods, &nodes), HashSet::from(["deleted".to_string()]));
        let gone = HashSet::from(["deleted".to_string()]);
        assert_eq!(
            names(&plan(&pods, &nodes, &gone, 1)),
            vec![
                ("done-old".to_string(), Why::Terminated),
                ("done-mid".to_string(), Why::Terminated),
                ("stuck-oos".to_string(), Why::OutOfService),
                ("orphan".to_string(), Why::Orphaned),
                ("unscheduled".to_string(), Why::UnscheduledTerminating),
            ]
        );
        // Threshold 0 disables the terminated-pod GC; a node in quarantine is not gone yet.
        assert_eq!(
            names(&plan(&pods, &nodes, &HashSet::new(), 0)),
            vec![
                ("stuck-oos".to_string(), Why::OutOfService),
                ("unscheduled".to_string(), Why::UnscheduledTerminating),
            ]
        );
    }

    #[test]
    fn evicted_pods_go_first() {
        let mut evicted = (*p("evicted-new", "n", "Failed", false, 50)).clone();
        evicted.status.as_mut().expect("status").reason = Some("Evicted".into());
        let pods = vec![p("old", "n", "Failed", false, 1), Arc::new(evicted)];
        let nodes =
            HashMap::from([("n".to_string(), NodeView { ready: true, out_of_service: false })]);
        assert_eq!(
            names(&plan(&pods, &nodes, &HashSet::new(), 1)),
            vec![("evicted-new".to_string(), Why::Terminated)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn collects_orphans_after_quarantine_and_terminated_beyond_threshold() {
        let (_api, client) = api().await;
        let pp = PostParams::default();
        let nodes: Api<Node> = Api::all(client.clone());
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node");
        nodes.create(&pp, &node).await.expect("node");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        pods.create(&pp, &pod("on-n1", "a", Some("n1"))).await.expect("pod");
        pods.create(&pp, &pod("orphan", "a", Some("vanished"))).await.expect("pod");
        for i in 0..3 {
            let name = format!("done-{i}");
            pods.create(&pp, &pod(&name, "a", Some("n1"))).await.expect("pod");
            let patch = json!({"status": {"phase": "Succeeded"}});
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("phase");
        }
        let config = ControllerConfig { terminated_pod_gc_threshold: 1, ..Default::default() };
        let ctx = Context::new(client.clone(), config);
        let task = tokio::spawn(run(ctx));
        wait_for("terminated pods beyond the threshold", || async {
            let mut left = 0;
            for n in ["done-0", "done-1", "done-2"] {
                left += usize::from(pods.get_opt(n).await.expect("get").is_some());
            }
            left == 1
        })
        .await;
        assert!(pods.get_opt("done-2").await.expect("get").is_some(), "the newest stays");
        // The orphan waits out the 40 s quarantine.
        assert!(
            pods.get_opt("orphan").await.expect("get").is_some(),
            "collected before quarantine"
        );
        wait_for("orphan collected", || async {
            pods.get_opt("orphan").await.expect("get").is_none()
        })
        .await;
        assert!(pods.get_opt("on-n1").await.expect("get").is_some());

        // A pod stuck terminating on a NotReady node stays until the node is declared out of
        // service.
        pods.delete("on-n1", &DeleteParams::default()).await.expect("graceful delete");
        tokio::time::sleep(Duration::from_secs(60)).await;
        let stuck = pods.get_opt("on-n1").await.expect("get").expect("still terminating");
        assert!(stuck.metadata.deletion_timestamp.is_some());
        let taint = json!({"spec": {"taints": [{"key": TAINT_OUT_OF_SERVICE,
                                                "value": "nodeshutdown", "effect": "NoExecute"}]}});
        nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&taint)).await.expect("taint");
        wait_for("out-of-service pod collected", || async {
            pods.get_opt("on-n1").await.expect("get").is_none()
        })
        .await;
        task.abort();
    }
}
