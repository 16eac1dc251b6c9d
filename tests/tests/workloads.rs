//! The workload controllers inside skiff-server, driven by real kubectl: `rollout status`,
//! `rollout history` and `rollout undo` (client side since kubectl 1.27). A tiny kubelet
//! stand-in (over a kube-rs client) binds pods to one node, marks them Running and Ready, and
//! removes terminating pods, since no scheduler or node agent runs here.

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use skiff_tests::{Kubectl, TestServer};

async fn client(server: &TestServer) -> Client {
    let kubeconfig = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    Client::try_from(config).expect("client")
}

/// Binds every pending pod to `node`, marks bound pods Running/Ready, deletes terminating
/// pods at once.
async fn kubelet_stand_in(client: Client, node: String) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects());
    while let Ok(Some(pod)) = stream.try_next().await {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            let dp = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
            let _ = api.delete(&name, &dp).await;
        } else if bound.is_empty() {
            let binding = Binding {
                metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                target: ObjectReference {
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                },
            };
            let _: Result<serde_json::Value, _> =
                api.create_subresource("binding", &name, &PostParams::default(), &binding).await;
        } else if phase != "Running" {
            let status = json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": k8s_openapi::jiff::Timestamp::now()}],
            }});
            let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
        }
    }
}

/// Run kubectl off the async workers (the stand-in keeps running meanwhile).
async fn kubectl(k: &Kubectl, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let k = Kubectl {
        bin: k.bin.clone(),
        kubeconfig: k.kubeconfig.clone(),
        cache: tempfile::tempdir().unwrap(),
    };
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        k.ok(&refs)
    })
    .await
    .expect("kubectl thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rollout_status_history_and_undo() {
    let server = TestServer::start_with_controllers();
    let client = client(&server).await;
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("node");
    let stand_in = tokio::spawn(kubelet_stand_in(client.clone(), "n1".into()));
    let k = server.kubectl(33);

    kubectl(&k, &["create", "deployment", "web", "--image=skiff.local/busybox:1", "--replicas=3"])
        .await;
    let out = kubectl(&k, &["rollout", "status", "deployment/web", "--timeout=60s"]).await;
    assert!(out.contains("successfully rolled out"), "{out}");
    // The controller stamps the revision through the status subresource, which leaves the
    // generation alone (a change of the annotations through the main resource bumps it).
    let path = r"jsonpath={.metadata.generation} {.status.observedGeneration} {.metadata.annotations.deployment\.kubernetes\.io/revision}";
    let stamped = kubectl(&k, &["get", "deployment", "web", "-o", path]).await;
    assert_eq!(stamped, "1 1 1");
    // The in-process controllers write as kube-controller-manager.
    let path = "jsonpath={.metadata.managedFields[*].manager}";
    let managers = kubectl(&k, &["get", "deployment", "web", "-o", path]).await;
    let mut managers: Vec<&str> = managers.split_whitespace().collect();
    managers.sort();
    assert_eq!(managers, ["kube-controller-manager", "kubectl-create"]);

    kubectl(&k, &["set", "image", "deployment/web", "busybox=skiff.local/busybox:2"]).await;
    let out = kubectl(&k, &["rollout", "status", "deployment/web", "--timeout=60s"]).await;
    assert!(out.contains("successfully rolled out"), "{out}");

    let history = kubectl(&k, &["rollout", "history", "deployment/web"]).await;
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");
    let rev1 = kubectl(&k, &["rollout", "history", "deployment/web", "--revision=1"]).await;
    assert!(rev1.contains("skiff.local/busybox:1"), "{rev1}");

    let out = kubectl(&k, &["rollout", "undo", "deployment/web"]).await;
    assert!(out.contains("rolled back"), "{out}");
    let out = kubectl(&k, &["rollout", "status", "deployment/web", "--timeout=60s"]).await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let image = kubectl(
        &k,
        &["get", "deployment", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image}"],
    )
    .await;
    assert_eq!(image, "skiff.local/busybox:1");
    let history = kubectl(&k, &["rollout", "history", "deployment/web"]).await;
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["2", "3"], "revision 1 became 3: {history}");
    let pods =
        kubectl(&k, &["get", "pods", "-o", "jsonpath={.items[*].spec.containers[0].image}"]).await;
    // Terminating old pods may linger a moment; the live ones all run the rolled-back image.
    assert!(pods.contains("skiff.local/busybox:1"), "{pods}");

    stand_in.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
}
