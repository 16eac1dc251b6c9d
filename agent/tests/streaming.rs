//! The agent's streaming endpoint: container logs from fabricated CRI log files (the
//! in-memory runtime reports the containers and their log paths), exec proxying to a fake
//! stream server, and client authentication (only the apiserver's certificate is served).

use std::time::Duration;

use skiff_agent::streaming;
use skiff_agent::testing::streaming::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_with_the_kubelet_options() {
    let node = Node::start().await;
    let ct = node.container("default", "web", "uid-1", "app", 0, LOG_0).await;
    let client = node.apiserver_tls();

    let (code, body) = get(&client, node.addr(), "/containerLogs/default/web/app").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, "first\nsecond half\nthird\n");

    let (_, body) = get(&client, node.addr(), "/containerLogs/default/web/app?tailLines=1").await;
    assert_eq!(body, "third\n");

    let (_, body) =
        get(&client, node.addr(), "/containerLogs/default/web/app?timestamps=true&tailLines=2")
            .await;
    assert_eq!(body, "2024-01-01T00:00:01.5Z second half\n2024-01-01T00:00:02Z third\n");

    let (_, body) = get(&client, node.addr(), "/containerLogs/default/web/app?limitBytes=8").await;
    assert_eq!(body, "first\nse");

    // sinceTime after the second line.
    let (_, body) = get(
        &client,
        node.addr(),
        "/containerLogs/default/web/app?sinceTime=2024-01-01T00:00:01.9Z",
    )
    .await;
    assert_eq!(body, "third\n");

    // The log of the previous instance (restart 0) once restart 1 exists.
    node.runtime.exit_container(&ct, 1).expect("exit");
    node.container("default", "web", "uid-1", "app", 1, "2024-01-01T00:01:00Z stdout F again\n")
        .await;
    let (_, body) = get(&client, node.addr(), "/containerLogs/default/web/app").await;
    assert_eq!(body, "again\n");
    let (code, body) =
        get(&client, node.addr(), "/containerLogs/default/web/app?previous=true").await;
    assert_eq!((code, body.as_str()), (200, "first\nsecond half\nthird\n"));

    let (code, body) = get(&client, node.addr(), "/containerLogs/default/web/nope").await;
    assert_eq!(code, 404, "{body}");
    let (code, _) = get(&client, node.addr(), "/containerLogs/default/web/app?tailLines=x").await;
    assert_eq!(code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_streams_until_the_container_stops() {
    let node = Node::start().await;
    let ct = node
        .container("default", "f", "uid-2", "app", 0, "2024-01-01T00:00:00Z stdout F one\n")
        .await;
    let path = node.log_path("default", "f", "uid-2", "app", 0);
    let client = node.apiserver_tls();
    let mut stream =
        open_stream(&client, node.addr(), "/containerLogs/default/f/app?follow=true").await;
    assert_eq!(stream.next_chunk().await, "one\n");
    // A raw line split across writes, and a logical line split across entries.
    append(&path, "2024-01-01T00:00:01Z stdout P t");
    append(&path, "w\n2024-01-01T00:00:02Z stdout F o\n");
    let mut got = String::new();
    while got != "two\n" {
        got.push_str(&stream.next_chunk().await);
        assert!(got.len() <= 4, "unexpected output {got:?}");
    }
    node.runtime.exit_container(&ct, 0).expect("exit");
    append(&path, "2024-01-01T00:00:03Z stderr F bye\n");
    let rest = tokio::time::timeout(Duration::from_secs(10), stream.rest())
        .await
        .expect("follow did not end after the container stopped");
    assert_eq!(rest, "bye\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_apiserver_is_served() {
    let node = Node::start().await;
    node.container("default", "web", "uid-1", "app", 0, LOG_0).await;
    let path = "/containerLogs/default/web/app";

    let (code, _) = get(&anonymous_tls(), node.addr(), path).await;
    assert_eq!(code, 401, "no client certificate");

    // Signed by the cluster CA, but another user.
    let (cert, key) = node.pki.issue_client("mallory", &[]).expect("client cert");
    let (code, body) = get(&client_tls(&cert, &key), node.addr(), path).await;
    assert_eq!(code, 403, "{body}");

    // The right name from another CA: the handshake fails.
    let other = tempfile::tempdir().expect("tmp");
    let other_pki = skiff_apiserver::pki::Pki::load_or_create(other.path(), &[]).expect("pki");
    let other_client = other_pki.kubelet_client_config().expect("tls");
    let err = try_get(&other_client, node.addr(), path).await.expect_err("foreign CA accepted");
    assert!(err.contains("TLS") || err.contains("alert") || err.contains("certificate"), "{err}");

    let (code, _) = get(&node.apiserver_tls(), node.addr(), path).await;
    assert_eq!(code, 200);
}

#[test]
fn the_allowed_name_is_the_apiservers() {
    assert_eq!(streaming::APISERVER_CLIENT_CN, skiff_apiserver::pki::KUBELET_CLIENT_CN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_splices_the_upgraded_connection() {
    let upstream = FakeStreamServer::start().await;
    let node = Node::start_with_exec(upstream.url()).await;
    node.container("default", "web", "uid-1", "app", 0, LOG_0).await;
    let client = node.apiserver_tls();

    // SPDY-style upgrade: bytes flow both ways after the 101.
    let (head, mut io) = upgrade(
        &client,
        node.addr(),
        "POST",
        "/exec/default/web/app?command=echo&command=hi&stdout=true",
        &[("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io")],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    io.write_all(b"ping").await.unwrap();
    assert_eq!(read_n(&mut io, 4).await, b"PING");
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].contains("upgrade: SPDY/3.1") || seen[0].contains("Upgrade: SPDY/3.1"),
        "{}",
        seen[0]
    );

    // WebSocket v4 passes through as it is.
    let (head, _io) = upgrade(
        &client,
        node.addr(),
        "GET",
        "/exec/default/web/app?command=sh&stdout=true&tty=true",
        &[
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Protocol", "v4.channel.k8s.io"),
        ],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("sec-websocket-protocol: v4.channel.k8s.io"),
        "{head}"
    );
    let seen = upstream.requests();
    assert!(
        seen[1].to_ascii_lowercase().contains("sec-websocket-protocol: v4.channel.k8s.io"),
        "{}",
        seen[1]
    );

    // WebSocket v5: answered by the agent, the runtime driven over SPDY.
    let (head, _io) = upgrade(
        &client,
        node.addr(),
        "GET",
        "/exec/default/web/app?command=cat&stdin=true&stdout=true&stderr=true",
        &[
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("sec-websocket-protocol: v5.channel.k8s.io"), "{head}");
    assert!(lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="), "{head}");
    let seen = upstream.requests();
    let up = seen[2].to_ascii_lowercase();
    assert!(up.starts_with("post /exec/token123"), "{}", seen[2]);
    assert!(
        up.contains("upgrade: spdy/3.1")
            && up.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{}",
        seen[2]
    );

    // The exec request the runtime got.
    let execs = node.execs();
    assert_eq!(execs[0].cmd, vec!["echo", "hi"]);
    assert!(execs[0].stdout && !execs[0].stdin && !execs[0].tty);
    assert!(!execs[1].stdin && execs[1].tty);

    assert!(execs[2].stdin && execs[2].stdout && execs[2].stderr);

    // No command: refused before the runtime is asked.
    let (head, _) = upgrade(
        &client,
        node.addr(),
        "POST",
        "/exec/default/web/app?stdout=true",
        &[("Upgrade", "SPDY/3.1")],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    // A stopped container cannot exec.
    let (head, _) = upgrade(
        &client,
        node.addr(),
        "POST",
        "/exec/default/web/other?command=x&stdout=1",
        &[("Upgrade", "SPDY/3.1")],
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

use tokio::io::AsyncWriteExt;
