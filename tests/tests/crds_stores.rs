//! Custom resources in both stores: on the embedded store and on a real etcd, a CRD and
//! its objects survive a restart of skiff-server (served again at once from the stored
//! CRD), and on etcd a second server sharing the cluster serves them and watches the
//! first one's writes through its own watch cache.

use std::time::Duration;

use serde_json::Value;
use skiff_control_plane::server::{ServerConfig, StoreConfig};
use skiff_store::testing::EtcdCluster;
use skiff_tests::{Kubectl, TestServer};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: notes.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: notes, kind: Note}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              text: {type: string}
              pages: {type: integer, default: 1}
"#;

fn note(name: &str, text: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Note\nmetadata: {{name: {name}, namespace: default}}\nspec: {{text: {text}}}\n"
    )
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    skiff_tests::wait_until(what, Duration::from_secs(30), f);
}

fn served(k: &Kubectl) -> bool {
    k.run(&["get", "notes"], None).status.success()
}

fn texts(k: &Kubectl) -> Vec<String> {
    let list: Value = serde_json::from_str(&k.ok(&["get", "notes", "-o", "json"])).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}={}",
                i["metadata"]["name"].as_str().unwrap(),
                i["spec"]["text"].as_str().unwrap()
            )
        })
        .collect()
}

/// The CRD applied and two notes written through `k`.
fn install(k: &Kubectl) {
    k.ok_stdin(&["apply", "-f", "-"], Some(CRD));
    k.ok(&["wait", "--for=condition=Established", "crd/notes.example.com", "--timeout=30s"]);
    wait_for("notes served", || served(k));
    k.ok_stdin(&["create", "-f", "-"], Some(&note("a", "alpha")));
    k.ok_stdin(&["create", "-f", "-"], Some(&note("b", "beta")));
}

/// After a restart: the CRD serves at once, objects kept with their defaults, writes work.
fn check_after_restart(k: &Kubectl) {
    wait_for("notes served after the restart", || served(k));
    assert_eq!(texts(k), ["a=alpha", "b=beta"]);
    let a: Value = serde_json::from_str(&k.ok(&["get", "note", "a", "-o", "json"])).unwrap();
    assert_eq!(a["spec"]["pages"], 1, "{a}");
    k.ok(&["patch", "note", "b", "--type=merge", "-p", r#"{"spec":{"text":"beta2"}}"#]);
    k.ok_stdin(&["create", "-f", "-"], Some(&note("c", "gamma")));
    assert_eq!(texts(k), ["a=alpha", "b=beta2", "c=gamma"]);
}

#[test]
fn custom_resources_survive_a_restart_on_the_embedded_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        controllers: Some(Default::default()),
        ..Default::default()
    };
    let server = TestServer::start_with(dir, config.clone());
    install(&server.kubectl(33));
    let server = server.restart_with(config);
    check_after_restart(&server.kubectl(33));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_on_etcd_are_shared_and_survive_restarts() {
    let etcd = EtcdCluster::start(1).await.expect("etcd (Debian's etcd-server)");
    let config = |controllers: bool| ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        store: StoreConfig::Etcd {
            endpoints: etcd.endpoints(),
            prefix: "/skiff-crds".into(),
            tls: None,
        },
        controllers: controllers.then(Default::default),
        ..Default::default()
    };
    let start = |controllers: bool| {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ServerConfig { data_dir: dir.path().to_path_buf(), ..config(controllers) };
        TestServer::start_with(dir, config)
    };
    tokio::task::block_in_place(|| {
        let a = start(true);
        let ka = a.kubectl(33);
        install(&ka);
        // A second server on the same etcd serves the CRD and sees a's writes in its watch.
        let b = start(false);
        let kb = b.kubectl(33);
        wait_for("notes served by the second server", || served(&kb));
        assert_eq!(texts(&kb), ["a=alpha", "b=beta"]);
        let list: Value = serde_json::from_str(&kb.ok(&[
            "get",
            "--raw",
            "/apis/example.com/v1/namespaces/default/notes",
        ]))
        .unwrap();
        let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        ka.ok(&["patch", "note", "a", "--type=merge", "-p", r#"{"spec":{"text":"alpha2"}}"#]);
        let events = kb.ok(&[
            "get",
            "--raw",
            &format!("/apis/example.com/v1/namespaces/default/notes?watch=1&resourceVersion={rv}&timeoutSeconds=2"),
        ]);
        let first: Value = serde_json::from_str(events.lines().next().unwrap_or("{}")).unwrap();
        assert_eq!(first["type"], "MODIFIED", "{events}");
        assert_eq!(first["object"]["spec"]["text"], "alpha2");
        ka.ok(&["patch", "note", "a", "--type=merge", "-p", r#"{"spec":{"text":"alpha"}}"#]);
        drop((a, b));
        // Both gone; a new server on the same etcd has everything.
        let c = start(true);
        check_after_restart(&c.kubectl(33));
    });
}
