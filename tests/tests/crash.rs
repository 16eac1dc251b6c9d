//! kill -9 of skiff-server during writes loses no acknowledged write, and a watcher resumes
//! from its last resourceVersion after the restart.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use skiff_tests::server_binary;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, port: u16) -> Server {
    let child = Command::new(server_binary())
        .arg("--data-dir")
        .arg(dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting skiff-server");
    Server(child)
}

async fn client(dir: &Path) -> Client {
    let kubeconfig = dir.join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if kubeconfig.exists() {
            let kc = Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
            let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .expect("config");
            let client = Client::try_from(config).expect("client");
            if client.apiserver_version().await.is_ok() {
                return client;
            }
        }
        assert!(Instant::now() < deadline, "skiff-server did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"v": name}}))
        .expect("cm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut server = start(dir.path(), port);
    let c = client(dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let rv0 = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");

    for round in 0..3 {
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let mut writers = Vec::new();
        for w in 0..8 {
            let api = api.clone();
            let acked = acked.clone();
            writers.push(tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("r{round}-w{w}-{i}");
                    match api.create(&PostParams::default(), &cm(&name)).await {
                        Ok(_) => {
                            acked.lock().expect("lock").insert(name);
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        // SIGKILL: no chance to flush anything.
        let _ = server.0.kill();
        let _ = server.0.wait();
        for w in writers {
            let _ = w.await;
        }
        server = start(dir.path(), port);
        let c = client(dir.path()).await;
        let api2: Api<ConfigMap> = Api::namespaced(c, "default");
        let stored: BTreeSet<String> = api2
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect();
        let acked = acked.lock().expect("lock").clone();
        assert!(!acked.is_empty(), "round {round}: some writes were acknowledged");
        let lost: Vec<&String> = acked.difference(&stored).collect();
        assert!(lost.is_empty(), "round {round}: acknowledged writes lost after kill -9: {lost:?}");
    }

    // A watcher resumes from a resourceVersion taken before the restarts: it sees every
    // object created since, in order.
    let c = client(dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(c, "default");
    // The test's own objects (the controllers publish kube-root-ca.crt in the namespace too).
    let ours = |cm: &ConfigMap| cm.metadata.name.as_deref().is_some_and(|n| n.starts_with('r'));
    let total = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter(|c| ours(c))
        .count();
    let mut stream = api.watch(&WatchParams::default(), &rv0).await.expect("watch").boxed();
    let mut added = 0;
    while added < total {
        match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(cm)))) if ours(&cm) => added += 1,
            Ok(Ok(Some(WatchEvent::Error(e)))) => {
                panic!("watch from {rv0} after restart failed: {e:?}")
            }
            Ok(Ok(Some(_))) => {}
            other => panic!("watch ended after {added}/{total} events: {other:?}"),
        }
    }
    drop(server);
}
