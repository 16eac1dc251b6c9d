//! `kubectl logs` and the exec upgrade path through a real skiff-server: the apiserver
//! proxies pods/log and pods/exec to this agent's streaming endpoint (a Node object points
//! at it on loopback), with the real kubectl 1.27 and 1.33 binaries.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use skiff_agent::testing::streaming::*;
use skiff_control_plane::server::ServerConfig;
use skiff_controllers::ControllerConfig;
use skiff_tests::{Kubectl, TestServer};
use tokio::io::AsyncWriteExt;

async fn kubectl(k: &Arc<Kubectl>, args: &[&str]) -> String {
    let k = k.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        k.ok(&args)
    })
    .await
    .unwrap()
}

async fn kubectl_fails(k: &Arc<Kubectl>, args: &[&str]) -> String {
    let k = k.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        k.fails(&args)
    })
    .await
    .unwrap()
}

/// A skiff-server, an agent endpoint with its PKI, and a Node and a Pod pointing at it.
struct Cluster {
    server: TestServer,
    node: Node,
    uid: String,
}

async fn cluster(exec_url: Option<String>) -> Cluster {
    cluster_with(exec_url, None).await
}

/// [`cluster`] with the controllers running in the server.
async fn cluster_with(exec_url: Option<String>, controllers: Option<ControllerConfig>) -> Cluster {
    // Resource metrics scraped every second, for `kubectl top`.
    let server = tokio::task::spawn_blocking(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            controllers,
            ..Default::default()
        };
        config.api.metric_resolution = Duration::from_secs(1);
        TestServer::start_with(dir, config)
    })
    .await
    .unwrap();
    let node = Node::start_for_server(server.dir.path(), exec_url).await;
    let k = Arc::new(server.kubectl(33));
    let port = node.addr().port();
    kubectl(
        &k,
        &[
            "create",
            "-f",
            &write_tmp(&node, "node.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n"),
        ],
    )
    .await;
    let status = format!(
        r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"127.0.0.1"}}],"daemonEndpoints":{{"kubeletEndpoint":{{"Port":{port}}}}}}}}}"#
    );
    kubectl(&k, &["patch", "node", "n1", "--subresource=status", "--type=merge", "-p", &status])
        .await;
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: n1\n  containers:\n  - name: app\n    image: skiff.test/tools:1\n";
    kubectl(&k, &["create", "-f", &write_tmp(&node, "pod.yaml", pod)]).await;
    let unbound = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pending\nspec:\n  containers:\n  - name: app\n    image: skiff.test/tools:1\n";
    kubectl(&k, &["create", "-f", &write_tmp(&node, "pending.yaml", unbound)]).await;
    let uid = kubectl(&k, &["get", "pod", "web", "-o", "jsonpath={.metadata.uid}"]).await;
    Cluster { server, node, uid }
}

fn write_tmp(node: &Node, name: &str, content: &str) -> String {
    let p = node.pki_dir.path().join(name);
    std::fs::write(&p, content).unwrap();
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_through_the_apiserver() {
    let c = cluster(None).await;
    let ct = c.node.container("default", "web", &c.uid, "app", 0, LOG_0).await;
    for minor in [27, 33] {
        let k = Arc::new(c.server.kubectl(minor));
        assert_eq!(kubectl(&k, &["logs", "web"]).await, "first\nsecond half\nthird\n", "1.{minor}");
        assert_eq!(kubectl(&k, &["logs", "web", "-c", "app", "--tail=1"]).await, "third\n");
        assert_eq!(
            kubectl(&k, &["logs", "pod/web", "--timestamps", "--tail=2"]).await,
            "2024-01-01T00:00:01.5Z second half\n2024-01-01T00:00:02Z third\n"
        );
        assert_eq!(kubectl(&k, &["logs", "web", "--since=1h"]).await, "", "old lines are filtered");
        let err = kubectl_fails(&k, &["logs", "pending"]).await;
        assert!(err.contains("does not have a host assigned"), "{err}");
        let err = kubectl_fails(&k, &["logs", "web", "-c", "nope"]).await;
        assert!(err.contains("container nope is not valid for pod web"), "{err}");
        let err = kubectl_fails(&k, &["logs", "web", "--previous"]).await;
        assert!(err.contains("previous terminated container"), "{err}");
    }

    // A node whose agent does not answer: an error, not a hang.
    let k = Arc::new(c.server.kubectl(33));
    kubectl(
        &k,
        &[
            "create",
            "-f",
            &write_tmp(&c.node, "n2.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n2\n"),
        ],
    )
    .await;
    let status = r#"{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":1}}}}"#;
    kubectl(&k, &["patch", "node", "n2", "--subresource=status", "--type=merge", "-p", status])
        .await;
    let lost = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: lost\nspec:\n  nodeName: n2\n  containers:\n  - name: app\n    image: skiff.test/tools:1\n";
    kubectl(&k, &["create", "-f", &write_tmp(&c.node, "lost.yaml", lost)]).await;
    let err = kubectl_fails(&k, &["logs", "lost"]).await;
    assert!(err.contains("connecting to the node's agent at 127.0.0.1:1"), "{err}");
    let err = kubectl_fails(&k, &["exec", "lost", "--", "true"]).await;
    assert!(err.contains("127.0.0.1:1"), "{err}");

    // A restart: --previous shows restart 0, the default the new instance.
    c.node.runtime.exit_container(&ct, 1).unwrap();
    let now = jiff::Timestamp::now().to_string();
    let ct1 = c
        .node
        .container("default", "web", &c.uid, "app", 1, &format!("{now} stdout F again\n"))
        .await;
    for minor in [27, 33] {
        let k = Arc::new(c.server.kubectl(minor));
        assert_eq!(kubectl(&k, &["logs", "web"]).await, "again\n");
        assert_eq!(kubectl(&k, &["logs", "web", "--since=1h"]).await, "again\n");
        assert_eq!(kubectl(&k, &["logs", "web", "-p"]).await, "first\nsecond half\nthird\n");
    }

    // -f: lines as they are written, and the end when the container stops.
    let path = c.node.log_path("default", "web", &c.uid, "app", 1);
    let k = c.server.kubectl(33);
    let mut child = k
        .command(&["logs", "-f", "web"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let recv = |what: &str| {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("kubectl logs -f: no {what}"))
    };
    assert_eq!(recv("first line"), "again");
    append(&path, &format!("{now} stdout F more\n"));
    assert_eq!(recv("followed line"), "more");
    c.node.runtime.exit_container(&ct1, 0).unwrap();
    let status = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Some(s) = child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    })
    .await
    .unwrap();
    let status = status.expect("kubectl logs -f did not end after the container stopped");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_upgrades_through_the_apiserver() {
    let upstream = FakeStreamServer::start().await;
    let c = cluster(Some(upstream.url())).await;
    c.node.container("default", "web", &c.uid, "app", 0, LOG_0).await;
    let admin = client_tls(&c.node.pki.admin_cert_pem, &c.node.pki.admin_key_pem);

    // SPDY (kubectl ≤ 1.29, and newer ones falling back): POST with Upgrade.
    let (head, mut io) = upgrade(
        &admin,
        c.server.addr,
        "POST",
        "/api/v1/namespaces/default/pods/web/exec?command=echo&command=hi%20there&container=app&stdout=true&stderr=true",
        &[("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io"), ("X-Stream-Protocol-Version", "v3.channel.k8s.io")],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: spdy/3.1"), "{head}");
    io.write_all(b"stream").await.unwrap();
    assert_eq!(read_n(&mut io, 6).await, b"STREAM");
    let execs = c.node.execs();
    assert_eq!(execs[0].cmd, vec!["echo", "hi there"]);
    assert!(execs[0].stdout && execs[0].stderr && !execs[0].stdin);
    let seen = upstream.requests();
    let lower = seen[0].to_ascii_lowercase();
    assert!(lower.contains("x-stream-protocol-version: v4.channel.k8s.io"), "{}", seen[0]);
    assert!(lower.contains("x-stream-protocol-version: v3.channel.k8s.io"), "{}", seen[0]);

    // WebSocket v5 (kubectl ≥ 1.30): GET with Upgrade: websocket.
    let (head, _io) = upgrade(
        &admin,
        c.server.addr,
        "GET",
        "/api/v1/namespaces/default/pods/web/exec?command=date&stdout=true",
        &[
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("sec-websocket-protocol: v5.channel.k8s.io"),
        "{head}"
    );

    // Without an upgrade, and for a pod without a node: errors, not 101.
    let (head, _) = upgrade(
        &admin,
        c.server.addr,
        "POST",
        "/api/v1/namespaces/default/pods/pending/exec?command=date&stdout=true",
        &[("Upgrade", "SPDY/3.1")],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
}

/// Runs `kubectl args` until its output passes `done` (up to 20 s); returns that output.
async fn kubectl_until(k: &Arc<Kubectl>, args: &[&str], done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (k2, owned) = (k.clone(), args.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let out = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = owned.iter().map(String::as_str).collect();
            k2.run(&args, None)
        })
        .await
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && done(&text) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "kubectl {args:?} never passed: {text}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The whitespace-separated cells of an output line that starts with `first`.
fn row(out: &str, first: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_reads_the_agents_resource_metrics() {
    let c = cluster(None).await;
    let k = Arc::new(c.server.kubectl(33));
    let capacity = r#"{"status":{"capacity":{"cpu":"2","memory":"4Gi"},"allocatable":{"cpu":"2","memory":"4Gi"}}}"#;
    kubectl(&k, &["patch", "node", "n1", "--subresource=status", "--type=merge", "-p", capacity])
        .await;
    kubectl(&k, &["label", "pod", "web", "app=web"]).await;
    let ct = c.node.container("default", "web", &c.uid, "app", 0, "").await;
    c.node.runtime.set_usage(&ct, 250_000_000, 8 << 20);

    // Two scrapes after the change: a quarter of a core, 8 MiB.
    let top =
        kubectl_until(&k, &["top", "pod", "web"], |out| row(out, "web") == ["web", "250m", "8Mi"])
            .await;
    assert!(top.starts_with("NAME"), "{top}");
    let all = kubectl(&k, &["top", "pod"]).await;
    assert_eq!(row(&all, "web"), ["web", "250m", "8Mi"], "{all}");
    assert!(row(&all, "pending").is_empty(), "a pod without containers has no metrics: {all}");
    assert_eq!(row(&kubectl(&k, &["top", "pod", "-l", "app=web"]).await, "web")[1], "250m");
    let none = kubectl(&k, &["top", "pod", "-l", "app=other"]).await;
    assert!(!none.contains("web"), "{none}");
    let containers = kubectl(&k, &["top", "pod", "web", "--containers"]).await;
    assert_eq!(row(&containers, "web"), ["web", "app", "250m", "8Mi"], "{containers}");
    let err = kubectl_fails(&k, &["top", "pod", "pending"]).await;
    assert!(err.contains(r#"podmetrics.metrics.k8s.io "default/pending" not found"#), "{err}");

    // The node: its use (this machine's, read from the kernel) against its allocatable.
    let node = kubectl(&k, &["top", "node"]).await;
    let cells = row(&node, "n1");
    assert_eq!(cells.len(), 5, "{node}");
    assert!(cells[2].ends_with('%') && cells[4].ends_with('%'), "{node}");
    assert!(cells[1].ends_with('m') && cells[3].ends_with("Mi"), "{node}");

    // The API itself: the objects metrics-server serves, their table, discovery.
    let raw: serde_json::Value = serde_json::from_str(
        &kubectl(&k, &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web"])
            .await,
    )
    .unwrap();
    assert_eq!(raw["kind"], "PodMetrics");
    assert_eq!(raw["apiVersion"], "metrics.k8s.io/v1beta1");
    assert_eq!(raw["metadata"]["labels"]["app"], "web");
    assert_eq!(
        raw["containers"],
        serde_json::json!([{"name": "app", "usage": {"cpu": "250m", "memory": "8Mi"}}])
    );
    assert!(raw["window"].as_str().unwrap().ends_with('s'), "{raw}");
    let table = kubectl(&k, &["get", "podmetrics"]).await;
    assert_eq!(row(&table, "NAME")[..4], ["NAME", "CPU", "MEMORY", "WINDOW"], "{table}");
    assert_eq!(row(&table, "web")[..3], ["web", "250m", "8Mi"], "{table}");
    let nodes: serde_json::Value = serde_json::from_str(
        &kubectl(&k, &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"]).await,
    )
    .unwrap();
    assert_eq!(nodes["kind"], "NodeMetricsList");
    assert_eq!(nodes["items"][0]["metadata"]["name"], "n1");
    let resources = kubectl(&k, &["api-resources", "--api-group=metrics.k8s.io"]).await;
    assert!(row(&resources, "nodes").contains(&"NodeMetrics".to_string()), "{resources}");
    assert!(row(&resources, "pods").contains(&"PodMetrics".to_string()), "{resources}");
    let err = kubectl_fails(&k, &["delete", "podmetrics", "web"]).await;
    assert!(
        err.contains("MethodNotAllowed")
            || err.contains("not allowed")
            || err.contains("not supported"),
        "{err}"
    );

    // A stopped container stops being reported: the pod drops out.
    c.node.runtime.exit_container(&ct, 0).unwrap();
    let gone = kubectl_until(&k, &["get", "podmetrics"], |out| row(out, "web").is_empty()).await;
    assert!(gone.contains("No resources found"), "{gone}");
    let err = kubectl_fails(&k, &["top", "pod"]).await;
    assert!(err.contains("metrics not available yet"), "{err}");
}

/// Marks a pod Running and Ready (no agent runs its node here) and gives it a container in
/// the node's runtime using `nanocores` of CPU; returns the container's id.
async fn run_pod(
    c: &Cluster,
    k: &Arc<Kubectl>,
    pod: &str,
    container: &str,
    nanocores: u64,
) -> String {
    let now =
        kubectl(k, &["get", "pod", pod, "-o", "jsonpath={.metadata.creationTimestamp}"]).await;
    let status = format!(
        r#"{{"status":{{"phase":"Running","startTime":"{now}","conditions":[{{"type":"Ready","status":"True","lastTransitionTime":"{now}"}}]}}}}"#
    );
    kubectl(k, &["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &status]).await;
    let uid = kubectl(k, &["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"]).await;
    let id = c.node.container("default", pod, &uid, container, 0, "").await;
    c.node.runtime.set_usage(&id, nanocores, 16 << 20);
    id
}

fn pod_names(out: &str) -> Vec<String> {
    out.split_whitespace().map(|p| p.trim_start_matches("pod/").to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_follows_the_pods_cpu() {
    let controllers =
        ControllerConfig { hpa_sync_period: Duration::from_secs(1), ..Default::default() };
    let c = cluster_with(None, Some(controllers)).await;
    let k = Arc::new(c.server.kubectl(33));
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  selector:\n    matchLabels: {app: app}\n  template:\n    metadata:\n      labels: {app: app}\n    spec:\n      containers:\n      - name: tools\n        image: skiff.test/tools:1\n        resources:\n          requests: {cpu: 100m}\n";
    kubectl(&k, &["create", "-f", &write_tmp(&c.node, "app.yaml", deployment)]).await;
    let first = kubectl_until(&k, &["get", "pods", "-l", "app=app", "-o", "name"], |out| {
        pod_names(out).len() == 1
    })
    .await;
    let first = pod_names(&first).remove(0);
    let out =
        kubectl(&k, &["autoscale", "deployment", "app", "--cpu-percent=50", "--min=1", "--max=4"])
            .await;
    assert!(out.contains("autoscaled"), "{out}");
    let hpa = kubectl(&k, &["get", "hpa", "app"]).await;
    assert_eq!(row(&hpa, "app")[1..3], ["Deployment/app", "cpu:"], "{hpa}");

    // 300m of 100m requested, against 50%: 6 replicas, limited to max(2 × 1, 4) = 4.
    let first_id = run_pod(&c, &k, &first, "tools", 300_000_000).await;
    kubectl_until(&k, &["get", "deployment", "app", "-o", "jsonpath={.spec.replicas}"], |out| {
        out.trim() == "4"
    })
    .await;
    let hpa = kubectl_until(&k, &["get", "hpa", "app"], |out| {
        row(out, "app").get(3).map(String::as_str) == Some("300%/50%")
    })
    .await;
    assert_eq!(row(&hpa, "app")[4..6], ["1", "4"], "{hpa}");
    let describe = kubectl(&k, &["describe", "hpa", "app"]).await;
    assert!(
        describe.contains(
            "New size: 4; reason: cpu resource utilization (percentage of request) above target"
        ),
        "{describe}"
    );
    assert!(
        describe.contains("ScaleUpLimit") || describe.contains("TooManyReplicas"),
        "{describe}"
    );

    // Idle pods, every one measured, and no stabilization window: back to the minimum.
    kubectl(
        &k,
        &[
            "patch",
            "hpa",
            "app",
            "--type=merge",
            "-p",
            r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
        ],
    )
    .await;
    let pods = kubectl_until(&k, &["get", "pods", "-l", "app=app", "-o", "name"], |out| {
        pod_names(out).len() == 4
    })
    .await;
    for pod in pod_names(&pods) {
        if pod == first {
            c.node.runtime.set_usage(&first_id, 0, 16 << 20);
        } else {
            run_pod(&c, &k, &pod, "tools", 0).await;
        }
    }
    kubectl_until(&k, &["get", "deployment", "app", "-o", "jsonpath={.spec.replicas}"], |out| {
        out.trim() == "1"
    })
    .await;
    let describe = kubectl(&k, &["describe", "hpa", "app"]).await;
    assert!(describe.contains("New size: 1; reason: All metrics below target"), "{describe}");
    let status: serde_json::Value =
        serde_json::from_str(&kubectl(&k, &["get", "hpa", "app", "-o", "json"]).await).unwrap();
    let conditions: Vec<&str> = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(conditions, ["AbleToScale", "ScalingActive", "ScalingLimited"], "{status}");
    assert!(status["status"]["lastScaleTime"].is_string(), "{status}");

    // A metric skiff cannot read (no custom metrics API): ScalingActive False, no rescale.
    let custom = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: custom\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: app}\n  maxReplicas: 3\n  metrics:\n  - type: Pods\n    pods:\n      metric: {name: requests_per_second}\n      target: {type: AverageValue, averageValue: \"10\"}\n";
    kubectl(&k, &["create", "-f", &write_tmp(&c.node, "custom.yaml", custom)]).await;
    let active = kubectl_until(
        &k,
        &[
            "get",
            "hpa",
            "custom",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"ScalingActive\")].reason}",
        ],
        |out| !out.trim().is_empty(),
    )
    .await;
    assert_eq!(active.trim(), "FailedGetResourceMetric");
    let hpa = kubectl(&k, &["get", "hpa", "custom"]).await;
    assert_eq!(row(&hpa, "custom")[2], "<unknown>/10", "{hpa}");
    assert_eq!(
        kubectl(&k, &["get", "deployment", "app", "-o", "jsonpath={.spec.replicas}"]).await.trim(),
        "1"
    );
}
