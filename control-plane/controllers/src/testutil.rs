//! Test rig shared by the controller tests: an apiserver in memory and small builders.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use serde_json::json;

use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

pub async fn api() -> (Arc<ApiServer>, Client) {
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
        .await
        .expect("apiserver");
    let client = api.client();
    (api, client)
}

/// Poll `f` (every 50 ms of tokio time, which also works with paused time) until true,
/// for at most 120 s (generous: CI machines are shared).
pub async fn wait_for<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..2400 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A pod in `default` with labels app=`app`, one container with a named port `http`:8080.
pub fn pod(name: &str, app: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .expect("pod")
}

/// Creates Ready nodes `name` with an optional `topology.kubernetes.io/zone` label (the node
/// objects an agent registers; nothing heartbeats them: for controllers that read nodes but
/// not their Leases).
pub async fn ready_nodes(client: &Client, nodes: &[(&str, Option<&str>)]) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let api: Api<Node> = Api::all(client.clone());
    for (name, zone) in nodes {
        let labels = zone.map(|z| json!({"topology.kubernetes.io/zone": z}));
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("node");
        api.create(&PostParams::default(), &node).await.expect("create node");
        let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("node status");
    }
}

/// What the node's agent reports once a pod's containers run and are ready: phase Running,
/// Ready, `ip` (a status patch, as the agent writes it).
pub async fn report_running(client: &Client, namespace: &str, name: &str, ip: &str) {
    use kube::api::{Api, Patch, PatchParams};
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"},
                       {"type": "ContainersReady", "status": "True"}]}});
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
}
