//! kube-rs against skiff-server: typed Api, kube-runtime watcher, discovery, 410 recovery.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config, Discovery};
use skiff_control_plane::server::ServerConfig;
use skiff_tests::TestServer;

async fn client(server: &TestServer) -> Client {
    let kubeconfig = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    Client::try_from(config).expect("client")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"suite": "kube-rs"}},
        "data": {"k": name},
    }))
    .expect("configmap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_api_and_runtime_watcher() {
    let server = TestServer::start();
    let client = client(&server).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("first")).await.expect("create");

    let lp = ListParams::default().labels("suite=kube-rs");
    let listed = api.list(&lp).await.expect("list");
    assert_eq!(listed.items.len(), 1);
    assert!(listed.metadata.resource_version.is_some());

    // The watcher's initial list, then live events.
    let mut stream =
        watcher(api.clone(), watcher::Config::default().labels("suite=kube-rs")).boxed();
    let mut init = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await {
            Ok(Ok(Some(watcher::Event::InitApply(o)))) => {
                init.push(o.metadata.name.unwrap_or_default())
            }
            Ok(Ok(Some(watcher::Event::InitDone))) => break,
            Ok(Ok(Some(_))) => {}
            other => panic!("watcher init: {other:?}"),
        }
    }
    assert_eq!(init, vec!["first".to_string()]);
    api.create(&PostParams::default(), &cm("second")).await.expect("create");
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await;
    match ev {
        Ok(Ok(Some(watcher::Event::Apply(o)))) => {
            assert_eq!(o.metadata.name.as_deref(), Some("second"))
        }
        other => panic!("expected Apply(second), got {other:?}"),
    }
    api.delete("first", &Default::default()).await.expect("delete");
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await;
    match ev {
        Ok(Ok(Some(watcher::Event::Delete(o)))) => {
            assert_eq!(o.metadata.name.as_deref(), Some("first"))
        }
        other => panic!("expected Delete(first), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_legacy_and_aggregated() {
    let server = TestServer::start();
    let client = client(&server).await;
    for discovery in [
        Discovery::new(client.clone()).run().await.expect("legacy discovery"),
        Discovery::new(client.clone()).run_aggregated().await.expect("aggregated discovery"),
    ] {
        let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
        for want in [
            "",
            "apps",
            "batch",
            "discovery.k8s.io",
            "coordination.k8s.io",
            "rbac.authorization.k8s.io",
        ] {
            assert!(groups.iter().any(|g| g == want), "group {want:?} missing from {groups:?}");
        }
        let apps = discovery.get("apps").expect("apps group");
        let kinds: Vec<String> =
            apps.recommended_resources().into_iter().map(|(r, _)| r.kind).collect();
        for want in ["Deployment", "ReplicaSet", "DaemonSet", "StatefulSet"] {
            assert!(kinds.iter().any(|k| k == want), "{want} missing from {kinds:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_resource_version_is_410_then_relist_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Default::default()
    };
    config.api.watch_history = 5;
    config.api.compaction_interval = Duration::from_millis(300);
    let server = TestServer::start_with(dir, config);
    let client = client(&server).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = api.create(&PostParams::default(), &cm("old-0")).await.expect("create");
    let old_rv = first.metadata.resource_version.expect("rv");
    for i in 1..20 {
        api.create(&PostParams::default(), &cm(&format!("old-{i}"))).await.expect("create");
    }
    // Let two compactions pass: the store forgets the history before the last creates.
    tokio::time::sleep(Duration::from_millis(900)).await;
    // A watch from a revision neither the cache nor the store holds: 200, then ERROR 410.
    let mut stream =
        api.watch(&WatchParams::default(), &old_rv).await.expect("watch starts").boxed();
    match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
        Ok(Some(Ok(WatchEvent::Error(e)))) => {
            assert_eq!(e.code, 410, "{e:?}");
            assert_eq!(e.reason, "Expired", "{e:?}");
        }
        other => panic!("expected an ERROR 410 event, got {other:?}"),
    }
    // Recovery: re-list and watch from the new revision.
    let listed = api.list(&ListParams::default()).await.expect("relist");
    assert_eq!(listed.items.len(), 20);
    let rv = listed.metadata.resource_version.expect("list rv");
    let mut stream = api.watch(&WatchParams::default(), &rv).await.expect("watch").boxed();
    api.create(&PostParams::default(), &cm("after")).await.expect("create");
    match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
        Ok(Some(Ok(WatchEvent::Added(o)))) => assert_eq!(o.metadata.name.as_deref(), Some("after")),
        other => panic!("expected ADDED after re-list, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_client_over_the_tower_service() {
    let store = std::sync::Arc::new(skiff_store::memory::MemoryStore::new());
    let api =
        skiff_apiserver::ApiServer::start(store, Default::default()).await.expect("apiserver");
    let client = api.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("in-memory")).await.expect("create");
    let got = cms.get("in-memory").await.expect("get");
    assert_eq!(got.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("in-memory"));
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
}
