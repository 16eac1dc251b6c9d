//! The whole control plane in skiff-server (scheduler and controllers in process) with
//! simulated nodes, driven by real kubectl: a Deployment becomes Running pods spread over
//! the nodes, its Service gets endpoints, and `kubectl rollout status` returns.

use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use skiff_agent::simulate::{self, SimulateConfig};
use skiff_control_plane::server::ServerConfig;
use skiff_controllers::ControllerConfig;
use skiff_scheduler::SchedulerConfig;
use skiff_tests::TestServer;

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: httpd
        image: skiff.local/busybox:1
        ports: [{name: http, containerPort: 8080}]
        resources: {requests: {cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
"#;

fn server_with_control_plane() -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        controllers: Some(ControllerConfig::default()),
        scheduler: Some(SchedulerConfig::default()),
        ..Default::default()
    };
    TestServer::start_with(dir, config)
}

async fn client(server: &TestServer) -> Client {
    let kc = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config =
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("config");
    Client::try_from(config).expect("client")
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<String>) -> String {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match check() {
            Some(out) => return out,
            None => std::thread::sleep(Duration::from_millis(500)),
        }
        last = what.to_string();
    }
    panic!("timed out waiting for {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_runs_on_simulated_nodes() {
    let server = server_with_control_plane();
    let sim = simulate::start(client(&server).await, SimulateConfig::default().with_nodes(3))
        .await
        .expect("simulated nodes");
    let k = server.kubectl(33);
    let nodes = k.ok(&["get", "nodes"]);
    assert_eq!(nodes.lines().filter(|l| l.contains(" Ready ")).count(), 3, "{nodes}");

    k.ok_stdin(&["apply", "-f", "-"], Some(APP));
    let out = k.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    assert!(out.contains("successfully rolled out"), "{out}");

    // Three Running pods on three different nodes (the scheduler spreads a ReplicaSet).
    let pods = wait_for("3 Running pods", Duration::from_secs(60), || {
        let out = k.ok(&["get", "pods", "-l", "app=web", "-o", "wide", "--no-headers"]);
        (out.lines().filter(|l| l.contains("Running")).count() == 3).then_some(out)
    });
    let mut nodes_used: Vec<&str> =
        pods.lines().filter_map(|l| l.split_whitespace().nth(6)).collect();
    nodes_used.sort();
    nodes_used.dedup();
    assert_eq!(nodes_used.len(), 3, "pods spread over three nodes:\n{pods}");

    // The Service's EndpointSlice lists the three ready pods on the named target port.
    let slices = wait_for("3 ready endpoints", Duration::from_secs(60), || {
        let out =
            k.ok(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let ready = v["items"][0]["endpoints"]
            .as_array()?
            .iter()
            .filter(|e| e["conditions"]["ready"] == true)
            .count();
        (ready == 3).then_some(out)
    });
    assert!(slices.contains("8080"), "named target port resolved: {slices}");

    // describe shows the scheduler's and controllers' events.
    let pod =
        pods.lines().next().and_then(|l| l.split_whitespace().next()).expect("a pod").to_string();
    let describe = k.ok(&["describe", "pod", &pod]);
    assert!(
        describe.contains("Scheduled") && describe.contains("Successfully assigned"),
        "{describe}"
    );

    // Scale down and delete: the ReplicaSet and pods follow, the garbage collector cleans up.
    k.ok(&["scale", "deployment", "web", "--replicas=1"]);
    wait_for("1 pod", Duration::from_secs(60), || {
        let out = k.ok(&["get", "pods", "-l", "app=web", "--no-headers"]);
        (out.lines().filter(|l| !l.trim().is_empty()).count() == 1).then_some(out)
    });
    k.ok(&["delete", "deployment", "web"]);
    wait_for("no ReplicaSets or pods left", Duration::from_secs(60), || {
        let rs = k.ok(&["get", "replicasets", "-o", "name"]);
        let pods = k.ok(&["get", "pods", "-l", "app=web", "-o", "name"]);
        (rs.trim().is_empty() && pods.trim().is_empty()).then_some(String::new())
    });
    drop(sim);
}
