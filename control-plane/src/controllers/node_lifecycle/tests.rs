use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::*;
use crate::controllers::testutil::{api, pod, wait_for};
use crate::controllers::{ControllerConfig, endpointslice, node_ipam};
use crate::simnodes::{SimConfig, SimulatedNodes};

fn pod_with_tolerations(tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [], "tolerations": tolerations}}))
    .expect("pod")
}

fn taint(key: &str) -> Taint {
    Taint { key: key.into(), effect: "NoExecute".into(), ..Default::default() }
}

#[test]
fn toleration_time_follows_the_taint_manager() {
    let d = Duration::from_secs(300);
    let unreachable = [taint(TAINT_UNREACHABLE)];
    let p = pod_with_tolerations(json!([{"key": TAINT_UNREACHABLE, "operator": "Exists",
        "effect": "NoExecute", "tolerationSeconds": 30}]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(Some(Duration::from_secs(30))));
    let p = pod_with_tolerations(json!([{"operator": "Exists"}]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(None), "tolerates everything forever");
    let p = pod_with_tolerations(json!([]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(Some(d)), "default toleration");
    assert_eq!(toleration_time(&p, &[taint("custom")], d), None, "untolerated: evict now");
    assert_eq!(desired_taints(Some("True")), vec![]);
    assert_eq!(desired_taints(Some("False"))[1], (TAINT_NOT_READY, "NoExecute"));
    assert_eq!(desired_taints(Some("Unknown"))[0], (TAINT_UNREACHABLE, "NoSchedule"));
}

fn ready_of(node: &Node) -> Option<String> {
    ready_condition(node).map(|c| c.status.clone())
}

#[tokio::test(start_paused = true)]
async fn lost_node_goes_not_ready_drops_endpoints_and_evicts_after_toleration() {
    let (_api, client) = api().await;
    let sim = SimulatedNodes::start(client.clone(), SimConfig::default()).await.expect("sim");
    let ctx = Arc::new(Context { client: client.clone(), config: ControllerConfig::default() });
    let tasks = [
        tokio::spawn(run(ctx.clone())),
        tokio::spawn(endpointslice::run(ctx.clone())),
        tokio::spawn(async move {
            let _ = node_ipam::run(ctx).await;
        }),
    ];
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "default");
    let svc = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}}))
    .expect("svc");
    services.create(&PostParams::default(), &svc).await.expect("svc");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (p, n) in [("web-0", "sim-node-0"), ("web-1", "sim-node-1")] {
        pods.create(&PostParams::default(), &pod(p, "web", Some(n))).await.expect("pod");
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let ready_endpoints = || async {
        let l = slices.list(&ListParams::default().labels("kubernetes.io/service-name=web")).await;
        l.expect("slices")
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count()
    };
    wait_for("2 ready endpoints", || async { ready_endpoints().await == 2 }).await;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("podCIDRs", || async {
        let l = nodes.list(&ListParams::default()).await.expect("nodes");
        let mut cidrs: Vec<String> =
            l.items.iter().filter_map(|n| n.spec.as_ref()?.pod_cidr.clone()).collect();
        cidrs.sort();
        cidrs == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"]
    })
    .await;

    // Still fine well within the grace period.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref(), Some("True"));

    sim.stop_node("sim-node-0").expect("stop");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref(),
        Some("True"),
        "not NotReady before the 40 s grace period"
    );
    wait_for("sim-node-0 NotReady", || async {
        ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref() == Some("Unknown")
    })
    .await;
    let lost = nodes.get("sim-node-0").await.expect("node");
    let cond = ready_condition(&lost).expect("ready");
    assert_eq!(cond.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(cond.message.as_deref(), Some("Kubelet stopped posting node status."));
    let taints: Vec<(String, String)> = lost
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    assert!(taints.contains(&(TAINT_UNREACHABLE.into(), "NoSchedule".into())), "{taints:?}");
    assert!(taints.contains(&(TAINT_UNREACHABLE.into(), "NoExecute".into())), "{taints:?}");
    assert_eq!(ready_of(&nodes.get("sim-node-1").await.expect("node")).as_deref(), Some("True"));
    wait_for("web-0 Ready=False", || async {
        !endpointslice::pod_ready(&pods.get("web-0").await.expect("pod"))
    })
    .await;
    wait_for("endpoints drop web-0", || async { ready_endpoints().await == 1 }).await;
    assert!(pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_none());

    // The admission default toleration is 300 s: evicted after it, not before.
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert!(
        pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_none(),
        "evicted before its toleration ran out"
    );
    tokio::time::sleep(Duration::from_secs(45)).await;
    wait_for("web-0 evicted", || async {
        pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_some()
    })
    .await;
    assert!(pods.get("web-1").await.expect("pod").metadata.deletion_timestamp.is_none());

    // The node comes back: Ready again, taints gone; the evicted pod's deletion finishes.
    sim.resume_node("sim-node-0").await.expect("resume");
    wait_for("sim-node-0 back", || async {
        let n = nodes.get("sim-node-0").await.expect("node");
        ready_of(&n).as_deref() == Some("True")
            && n.spec.and_then(|s| s.taints).unwrap_or_default().is_empty()
    })
    .await;
    wait_for("web-0 gone", || async { pods.get_opt("web-0").await.expect("get").is_none() }).await;
    for t in tasks {
        t.abort();
    }
}
