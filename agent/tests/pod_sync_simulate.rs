//! `skiff-agent simulate`: several full agents over in-memory runtimes in one process.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use skiff_agent::simulate::{self, SIMULATED_LABEL, SimulateConfig};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

#[tokio::test]
async fn simulated_nodes_register_and_run_their_pods() {
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
        .await
        .expect("apiserver");
    let client = api.client();
    skiff_agent::testing::seed_namespace(&client, "default").await;
    let state = tempfile::tempdir().expect("tmp");
    let cfg = SimulateConfig {
        state_dir: Some(state.path().to_path_buf()),
        ..SimulateConfig::default().with_nodes(4).with_relist(Duration::from_millis(50))
    };
    let sim = simulate::start(client.clone(), cfg).await.expect("simulate");
    assert_eq!(sim.node_names(), vec!["sim-node-0", "sim-node-1", "sim-node-2", "sim-node-3"]);
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&format!("{SIMULATED_LABEL}=true")))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 4);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..8 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}")},
            "spec": {"nodeName": format!("sim-node-{}", i % 4),
                     "containers": [{"name": "c", "image": format!("registry.example/app:{i}")}]}}))
        .expect("pod");
        pods.create(&PostParams::default(), &p).await.expect("create");
    }
    let mut running = 0;
    for _ in 0..200 {
        let list = pods.list(&ListParams::default()).await.expect("list");
        running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running, 8, "every simulated node runs its pods");
    let p1 = pods.get("p1").await.expect("get");
    assert_eq!(p1.status.and_then(|s| s.host_ip).as_deref(), Some("172.30.0.2"), "sim-node-1's IP");
    assert_eq!(
        sim.nodes[1]
            .runtime
            .containers_in(skiff_agent::runtime::api::ContainerState::ContainerRunning)
            .len(),
        2
    );

    pods.delete("p1", &DeleteParams::default()).await.expect("delete");
    for _ in 0..200 {
        if pods.get_opt("p1").await.expect("get").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        pods.get_opt("p1").await.expect("get").is_none(),
        "graceful deletion finished by the node"
    );
}
