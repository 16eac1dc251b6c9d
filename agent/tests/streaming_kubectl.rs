//! `kubectl logs` and the exec upgrade path through a real skiff-server: the apiserver
//! proxies pods/log and pods/exec to this agent's streaming endpoint (a Node object points
//! at it on loopback), with the real kubectl 1.27 and 1.33 binaries.

mod streaming_common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use skiff_tests::{Kubectl, TestServer};
use streaming_common::*;
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
    let server = tokio::task::spawn_blocking(TestServer::start).await.unwrap();
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
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
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
