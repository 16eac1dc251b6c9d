//! HA: two skiff-servers on one 3-member etcd cluster. A write through one server is read and
//! watched through the other, and both keep serving when an etcd member is killed.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use skiff_control_plane::server::{ServerConfig, StoreConfig};
use skiff_store::testing::EtcdCluster;
use skiff_tests::TestServer;

async fn client(server: &TestServer) -> Client {
    let kc = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config =
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("config");
    Client::try_from(config).expect("client")
}

fn server_on(endpoints: Vec<String>) -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        store: StoreConfig::Etcd { endpoints, prefix: "/skiff-ha".into(), tls: None },
        ..Default::default()
    };
    TestServer::start_with(dir, config)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"v": name}}))
        .expect("cm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_etcd_cluster() {
    let mut etcd =
        EtcdCluster::start(3).await.expect("a 3-member etcd cluster (Debian's etcd-server)");
    let a = server_on(etcd.endpoints());
    let b = server_on(etcd.endpoints());
    let api_a: Api<ConfigMap> = Api::namespaced(client(&a).await, "default");
    let api_b: Api<ConfigMap> = Api::namespaced(client(&b).await, "default");

    // Both bootstrapped the same system namespaces without fighting over them.
    let rv = api_b
        .list(&ListParams::default())
        .await
        .expect("list on b")
        .metadata
        .resource_version
        .expect("rv");
    let mut watch_b = api_b.watch(&WatchParams::default(), &rv).await.expect("watch on b").boxed();

    api_a.create(&PostParams::default(), &cm("from-a")).await.expect("create on a");
    let got = api_b.get("from-a").await.expect("read on b what a wrote");
    assert_eq!(got.data.and_then(|d| d.get("v").cloned()).as_deref(), Some("from-a"));
    match tokio::time::timeout(Duration::from_secs(10), watch_b.try_next()).await {
        Ok(Ok(Some(WatchEvent::Added(o)))) => {
            assert_eq!(o.metadata.name.as_deref(), Some("from-a"))
        }
        other => panic!("b's watch did not see a's write: {other:?}"),
    }

    // Optimistic concurrency holds across servers.
    let mut stale = api_a.get("from-a").await.expect("get");
    let mut fresh = stale.clone();
    fresh.data = Some([("v".to_string(), "b".to_string())].into());
    api_b.replace("from-a", &PostParams::default(), &fresh).await.expect("replace on b");
    stale.data = Some([("v".to_string(), "a".to_string())].into());
    let err = api_a
        .replace("from-a", &PostParams::default(), &stale)
        .await
        .expect_err("stale write on a");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("expected 409, got {other:?}"),
    }

    // Lose an etcd member: both servers keep serving writes and watches.
    etcd.kill(0);
    for i in 0..5 {
        let name = format!("after-kill-{i}");
        let api = if i % 2 == 0 { &api_a } else { &api_b };
        let mut ok = false;
        for _ in 0..20 {
            if api.create(&PostParams::default(), &cm(&name)).await.is_ok()
                || api.get(&name).await.is_ok()
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(ok, "{name} could not be written after losing one etcd member");
    }
    let mut seen = 0;
    while seen < 5 {
        match tokio::time::timeout(Duration::from_secs(20), watch_b.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(o))))
                if o.metadata.name.as_deref().is_some_and(|n| n.starts_with("after-kill")) =>
            {
                seen += 1
            }
            Ok(Ok(Some(_))) => {}
            other => panic!("b's watch stopped after the member loss ({seen}/5): {other:?}"),
        }
    }
    let names: Vec<String> = api_a
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("after-kill")).count(), 5, "{names:?}");
}

fn lease_holder(lease: &k8s_openapi::api::coordination::v1::Lease) -> String {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_failover_when_it_is_killed() {
    use k8s_openapi::api::coordination::v1::Lease;
    use skiff_controllers::ControllerConfig;
    use skiff_scheduler::SchedulerConfig;

    let etcd = EtcdCluster::start(1).await.expect("etcd (Debian's etcd-server)");
    let with_control_plane = |endpoints: Vec<String>| {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("addr"),
            store: StoreConfig::Etcd { endpoints, prefix: "/skiff-leader".into(), tls: None },
            controllers: Some(ControllerConfig::default()),
            scheduler: Some(SchedulerConfig::default()),
            ..Default::default()
        };
        TestServer::start_with(dir, config)
    };
    let a = with_control_plane(etcd.endpoints());
    let c = client(&a).await;
    let leases: Api<Lease> = Api::namespaced(c, "kube-system");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        if let Ok(l) = leases.get("kube-scheduler").await
            && !lease_holder(&l).is_empty()
        {
            break lease_holder(&l);
        }
        assert!(std::time::Instant::now() < deadline, "server a never became scheduler leader");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // A second server joins: the leader does not change.
    let b = with_control_plane(etcd.endpoints());
    let leases_b: Api<Lease> = Api::namespaced(client(&b).await, "kube-system");
    tokio::time::sleep(Duration::from_secs(4)).await;
    for name in ["kube-scheduler", "kube-controller-manager"] {
        let l = leases_b.get(name).await.expect("lease");
        assert!(!lease_holder(&l).is_empty(), "{name} has a holder");
    }
    assert_eq!(
        lease_holder(&leases_b.get("kube-scheduler").await.expect("lease")),
        first,
        "one leader, kept"
    );

    // Kill a (no release of its Leases): b takes over once they expire (15 s).
    drop(a);
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let l = leases_b.get("kube-scheduler").await.expect("lease");
        let holder = lease_holder(&l);
        if !holder.is_empty() && holder != first {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "b did not take over the scheduler lease");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And b's scheduler works: a pod binds to a node.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client(&b).await);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("node");
    // A merge patch of status: node IPAM may have updated the node in between.
    let status = serde_json::json!({"status": serde_json::to_value(&node.status).expect("status")});
    nodes
        .patch_status("n1", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("node status");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client(&b).await, "default");
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "after-failover"},
        "spec": {"containers": [{"name": "c", "image": "skiff.local/busybox:1"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("pod");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p = pods.get("after-failover").await.expect("pod");
        if p.spec.and_then(|s| s.node_name).as_deref() == Some("n1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new leader did not schedule the pod");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// GET `path` as text: (status, body).
async fn get_text(client: &Client, path: &str) -> (u16, String) {
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("send");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The health endpoints check the store: with etcd gone, /readyz and /livez fail (500,
/// every check listed, the reason withheld) and /livez/etcd says why; excluding the
/// etcd check passes again. With etcd up they pass, in upstream's verbose form on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_follow_the_store() {
    let mut etcd = EtcdCluster::start(1).await.expect("an etcd member (Debian's etcd-server)");
    let server = server_on(etcd.endpoints());
    let c = client(&server).await;
    assert_eq!(get_text(&c, "/readyz").await, (200, "ok".into()));
    assert_eq!(
        get_text(&c, "/livez?verbose").await,
        (200, "[+]ping ok\n[+]log ok\n[+]etcd ok\nlivez check passed\n".into())
    );
    assert_eq!(get_text(&c, "/readyz/etcd").await, (200, "ok".into()));
    assert_eq!(
        get_text(&c, "/healthz?verbose&exclude=log&exclude=nope").await,
        (
            200,
            "[+]ping ok\n[+]log excluded: ok\n[+]etcd ok\n\
             warn: some health checks cannot be excluded: no matches for \"nope\"\n\
             healthz check passed\n"
                .into()
        )
    );
    assert_eq!(get_text(&c, "/readyz/bogus").await.0, 404);

    etcd.kill(0);
    assert_eq!(
        get_text(&c, "/readyz").await,
        (
            500,
            "[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\nreadyz check failed\n".into()
        )
    );
    let (code, why) = get_text(&c, "/livez/etcd").await;
    assert_eq!(code, 500);
    assert!(why.starts_with("internal server error: "), "{why}");
    assert_eq!(get_text(&c, "/livez?exclude=etcd").await, (200, "ok".into()));
}

/// etcd over TLS with client certificates required: skiff-server connects with the CA and
/// client certificate files (`--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`) and
/// serves from it; without a client certificate it fails to start with the connect error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_etcd_over_tls() {
    let etcd = EtcdCluster::start_tls(1).await.expect("a 1-member etcd cluster over TLS");
    let (ca, cert, key) = etcd.tls_files().expect("TLS files");
    let tls = skiff_store::etcd::EtcdTls::from_files(&ca, Some(&cert), Some(&key)).expect("pem");
    let endpoints = etcd.endpoints();
    assert!(endpoints.iter().all(|e| e.starts_with("https://")), "{endpoints:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        store: StoreConfig::Etcd {
            endpoints: endpoints.clone(),
            prefix: "/skiff-tls".into(),
            tls: Some(tls),
        },
        ..Default::default()
    };
    let server = TestServer::start_with(dir, config);
    let api: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    api.create(&PostParams::default(), &cm("over-tls")).await.expect("create through TLS etcd");
    let got = api.get("over-tls").await.expect("read back");
    assert_eq!(got.data.and_then(|d| d.get("v").cloned()).as_deref(), Some("over-tls"));

    // The CA alone: etcd refuses the handshake (it requires a client certificate).
    let ca_only = skiff_store::etcd::EtcdTls::from_files(&ca, None, None).expect("pem");
    let config = skiff_store::etcd::EtcdConfig {
        tls: Some(ca_only),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let refused =
        skiff_store::etcd::EtcdStore::connect_with(&endpoints, "/skiff-tls", config).await;
    assert!(refused.is_err(), "no client certificate, yet connected");
}
