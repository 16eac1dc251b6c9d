//! The pod sync over the real CRI client: the agent talks gRPC (CriRuntime) to the fake CRI
//! server, which serves the in-memory runtime. Every runtime call of a pod's life crosses
//! the socket.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skiff_agent::config::AgentConfig;
use skiff_agent::runtime::cri::CriRuntime;
use skiff_agent::runtime::fake_cri;
use skiff_agent::runtime::memory::{Behavior, MemoryRuntime};

async fn wait_for(pods: &Api<Pod>, name: &str, what: &str, f: impl Fn(Option<&Pod>) -> bool) {
    for _ in 0..400 {
        let p = pods.get_opt(name).await.expect("get");
        if f(p.as_ref()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {name}: {what}: {:#?}", pods.get_opt(name).await);
}

fn phase(p: Option<&Pod>) -> Option<String> {
    p?.status.as_ref()?.phase.clone()
}

#[tokio::test]
async fn pods_run_restart_and_terminate_through_the_cri_client() {
    let (_api, client) = skiff_agent::testing::apiserver().await;
    let dir = tempfile::tempdir().expect("tmp");
    let memory = MemoryRuntime::new();
    memory.add_image("skiff.test/pause:1");
    memory.add_image("skiff.test/tools:1");
    memory.set_behavior(|cfg| match cfg.metadata.as_ref().map(|m| m.name.as_str()) {
        Some("crash") => Behavior::Exit(2),
        _ => Behavior::Run,
    });
    let server =
        fake_cri::serve(memory.clone(), &dir.path().join("cri.sock")).await.expect("fake CRI");
    let cri = CriRuntime::connect(server.socket()).await.expect("connect");
    let mut config = AgentConfig::new("cri-node")
        .with_node_ip("192.0.2.20".parse().expect("ip"))
        .with_root_dir(dir.path().join("root"))
        .with_resources(2000, 4 << 30)
        .with_backoff(Duration::from_millis(100), Duration::from_millis(400))
        .with_relist(Duration::from_millis(50));
    config.host_conditions = false;
    let agent = skiff_agent::agent::start(client.clone(), config, cri).await.expect("agent");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "nodeName": "cri-node", "terminationGracePeriodSeconds": 3,
        "containers": [{"name": "c", "image": "skiff.test/tools:1"},
                       {"name": "crash", "image": "skiff.test/tools:1"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create");
    wait_for(&pods, "web", "crash restarted twice", |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == "crash"))
            .is_some_and(|c| c.restart_count >= 2)
    })
    .await;
    let p = pods.get("web").await.expect("get");
    assert_eq!(phase(Some(&p)).as_deref(), Some("Running"));
    let c = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "c"))
        .expect("c");
    assert!(c.container_id.as_deref().is_some_and(|id| id.starts_with("skiff-memory://")), "{c:?}");
    assert!(c.ready);

    pods.delete("web", &DeleteParams::default()).await.expect("delete");
    wait_for(&pods, "web", "deleted", |p| p.is_none()).await;
    assert!(
        memory
            .containers_in(skiff_agent::runtime::api::ContainerState::ContainerRunning)
            .is_empty()
    );
    drop(agent);
    server.shutdown().await;
}
