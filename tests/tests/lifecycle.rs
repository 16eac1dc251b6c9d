//! The cluster-lifecycle controllers together (`controllers::run`) against the apiserver in
//! memory with simulated nodes (`skiff-agent simulate`: the real agent over its in-memory
//! runtime): node loss, namespace deletion with garbage collection.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use skiff_agent::simulate::{self, SimulateConfig, Simulation};
use skiff_apiserver::ApiServer;
use skiff_controllers::{self as controllers, ControllerConfig};
use skiff_scheduler::{self as scheduler, SchedulerConfig};
use skiff_store::memory::MemoryStore;

async fn wait_for<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_up_to(what, Duration::from_secs(120), f).await;
}

/// Poll `f` every 50 ms (of tokio time) for at most `limit`.
async fn wait_for_up_to<F, Fut>(what: &str, limit: Duration, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..limit.as_millis() / 50 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The apiserver, simulated nodes and every lifecycle controller; aborted on drop.
struct Cluster {
    _api: Arc<ApiServer>,
    client: Client,
    sim: Simulation,
    controllers: tokio::task::JoinHandle<()>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controllers.abort();
    }
}

async fn cluster(nodes: usize) -> Cluster {
    cluster_with(SimulateConfig::default().with_nodes(nodes)).await
}

async fn cluster_with(sim: SimulateConfig) -> Cluster {
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
        .await
        .expect("apiserver");
    let client = api.client();
    let sim = simulate::start(client.clone(), sim).await.expect("simulated nodes");
    let config = ControllerConfig {
        // Endpoints may not hold loopback addresses (validation), so a documentation address.
        apiserver_endpoint: Some(("192.0.2.1".into(), 6443)),
        // Published as kube-root-ca.crt, which the agents mount into every pod.
        root_ca_pem: Some("test CA\n".into()),
        ..Default::default()
    };
    let controllers = tokio::spawn(controllers::run(client.clone(), config, Default::default()));
    Cluster { _api: api, client, sim, controllers }
}

fn pod(ns: &str, name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .expect("pod")
}

fn service(ns: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}
    }))
    .expect("service")
}

fn ready_ips(slices: &[EndpointSlice]) -> Vec<String> {
    let mut ips: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses.clone())
        .collect();
    ips.sort();
    ips
}

#[tokio::test(start_paused = true)]
async fn node_loss_marks_not_ready_drops_endpoints_and_evicts() {
    let mut c = cluster(3).await;
    let pp = PostParams::default();
    Api::<Service>::namespaced(c.client.clone(), "default")
        .create(&pp, &service("default"))
        .await
        .expect("service");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for i in 0..3 {
        pods.create(&pp, &pod("default", &format!("web-{i}"), &format!("sim-node-{i}")))
            .await
            .expect("pod");
    }
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    wait_for("3 ready endpoints", || async {
        ready_ips(&slices.list(&lp).await.expect("slices").items).len() == 3
    })
    .await;
    let lost_ip = pods.get("web-2").await.expect("pod").status.and_then(|s| s.pod_ip).expect("ip");

    c.sim.stop_node("sim-node-2").expect("stop");
    let nodes: Api<Node> = Api::all(c.client.clone());
    let ready = |n: Node| {
        n.status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status)
    };
    wait_for("sim-node-2 NotReady", || async {
        ready(nodes.get("sim-node-2").await.expect("node")).as_deref() == Some("Unknown")
    })
    .await;
    let taints = nodes.get("sim-node-2").await.expect("node").spec.and_then(|s| s.taints);
    assert!(
        taints
            .iter()
            .flatten()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"),
        "{taints:?}"
    );
    wait_for("endpoints drop the lost pod", || async {
        let ips = ready_ips(&slices.list(&lp).await.expect("slices").items);
        ips.len() == 2 && !ips.contains(&lost_ip)
    })
    .await;
    let eps: Api<Endpoints> = Api::namespaced(c.client.clone(), "default");
    wait_for("legacy endpoints: lost pod not ready", || async {
        let e = eps.get("web").await.expect("endpoints");
        let subsets = e.subsets.unwrap_or_default();
        subsets.iter().flat_map(|s| s.not_ready_addresses.iter().flatten()).any(|a| a.ip == lost_ip)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert!(
        pods.get("web-2").await.expect("pod").metadata.deletion_timestamp.is_none(),
        "evicted before the 300 s toleration ran out"
    );
    wait_for("lost pod evicted after its 300 s toleration", || async {
        pods.get("web-2").await.expect("pod").metadata.deletion_timestamp.is_some()
    })
    .await;
    for p in ["web-0", "web-1"] {
        assert!(pods.get(p).await.expect("pod").metadata.deletion_timestamp.is_none(), "{p}");
    }
    // Every node got a podCIDR; the kubernetes Service names the apiserver.
    for n in nodes.list(&ListParams::default()).await.expect("nodes").items {
        assert!(n.spec.and_then(|s| s.pod_cidr).is_some_and(|c| c.starts_with("10.244.")));
    }
    wait_for("kubernetes endpoints", || async {
        eps.get_opt("kubernetes").await.expect("get").is_some_and(|e| {
            e.subsets
                .unwrap_or_default()
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .any(|a| a.ip == "192.0.2.1")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_deletion_cascades_with_the_garbage_collector_running() {
    let c = cluster(2).await;
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "shop"}})).expect("ns");
    namespaces.create(&pp, &ns).await.expect("ns");
    Api::<Service>::namespaced(c.client.clone(), "shop")
        .create(&pp, &service("shop"))
        .await
        .expect("svc");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    pods.create(&pp, &pod("shop", "web-0", "sim-node-0")).await.expect("pod");
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
    let owner: ConfigMap = cms
        .create(&pp, &serde_json::from_value(json!({"metadata": {"name": "owner"}})).expect("cm"))
        .await
        .expect("owner");
    let dep = json!({"metadata": {"name": "dep", "ownerReferences": [{"apiVersion": "v1",
        "kind": "ConfigMap", "name": "owner", "uid": owner.uid().expect("uid")}]}});
    cms.create(&pp, &serde_json::from_value(dep).expect("cm")).await.expect("dep");
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(c.client.clone(), "shop");
    wait_for("default service account", || async {
        sas.get_opt("default").await.expect("get").is_some()
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "shop");
    wait_for("endpoint slice", || async {
        ready_ips(&slices.list(&ListParams::default()).await.expect("slices").items).len() == 1
    })
    .await;
    // Background deletion of the owner collects the dependent.
    cms.delete("owner", &DeleteParams::default()).await.expect("delete owner");
    wait_for("dependent collected", || async { cms.get_opt("dep").await.expect("get").is_none() })
        .await;

    namespaces.delete("shop", &DeleteParams::default()).await.expect("delete ns");
    wait_for("namespace gone", || async {
        namespaces.get_opt("shop").await.expect("get").is_none()
    })
    .await;
    assert!(pods.list(&ListParams::default()).await.expect("pods").items.is_empty());
    assert!(slices.list(&ListParams::default()).await.expect("slices").items.is_empty());
    assert!(cms.list(&ListParams::default()).await.expect("cms").items.is_empty());
}

/// Aborts a task on drop.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn lost_node_pods_are_recreated_elsewhere_and_collected_when_out_of_service() {
    let mut c = cluster(3).await;
    let _scheduler =
        AbortOnDrop(tokio::spawn(scheduler::run(c.client.clone(), SchedulerConfig::default())));
    let rs: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("rs");
    Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &rs)
        .await
        .expect("replicaset");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let running = || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect::<Vec<_>>()
    };
    wait_for("3 running pods", || async { running().await.len() == 3 }).await;
    let lost = node_of(&running().await[0]);
    let on_lost = running().await.iter().filter(|p| node_of(p) == lost).count();
    c.sim.stop_node(&lost).expect("stop");

    // 40 s to NotReady, 300 s of toleration, then eviction: the ReplicaSet ignores the
    // terminating pods and the scheduler places their replacements on the live nodes.
    wait_for_up_to("replacements running on the live nodes", Duration::from_secs(900), || async {
        let r = running().await;
        r.len() == 3 && r.iter().all(|p| node_of(p) != lost)
    })
    .await;
    let stuck = || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter(|p| node_of(p) == lost)
            .collect::<Vec<_>>()
    };
    let left = stuck().await;
    assert_eq!(left.len(), on_lost, "pods of an unreachable node stay until declared gone");
    assert!(left.iter().all(|p| p.metadata.deletion_timestamp.is_some()));

    // The operator declares the node out of service: the pod GC force-deletes its pods.
    let nodes: Api<Node> = Api::all(c.client.clone());
    // The node lifecycle controller writes the node too: retry on conflicts.
    for attempt in 0.. {
        let mut node = nodes.get(&lost).await.expect("node");
        let spec = node.spec.get_or_insert_with(Default::default);
        spec.taints.get_or_insert_with(Vec::new).push(k8s_openapi::api::core::v1::Taint {
            key: "node.kubernetes.io/out-of-service".into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            time_added: None,
        });
        match nodes.replace(&lost, &PostParams::default(), &node).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 20 => continue,
            Err(e) => panic!("tainting the node: {e}"),
        }
    }
    wait_for("pods of the out-of-service node collected", || async { stuck().await.is_empty() })
        .await;
    assert_eq!(running().await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_service_names_the_advertised_apiserver_address() {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let dir = tempfile::tempdir().expect("temp dir");
    let config = skiff_control_plane::server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        // A documentation address: Endpoints may not name loopback.
        advertise_address: Some("192.0.2.7".parse().expect("ip")),
        controllers: Some(ControllerConfig::default()),
        ..Default::default()
    };
    let server = skiff_tests::TestServer::start_with(dir, config);
    let port = i32::from(server.addr.port());
    let kubeconfig = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let client = Client::try_from(
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("client config"),
    )
    .expect("client");
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    wait_for("kubernetes endpoints", || async {
        eps.get_opt("kubernetes").await.expect("get").is_some_and(|e| {
            let s = e.subsets.unwrap_or_default();
            s.len() == 1
                && s[0].addresses.as_ref().is_some_and(|a| a.len() == 1 && a[0].ip == "192.0.2.7")
                && s[0].ports.as_ref().is_some_and(|p| p[0].port == port)
        })
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    wait_for("kubernetes endpoint slice", || async {
        slices.get_opt("kubernetes").await.expect("get").is_some_and(|s| {
            s.endpoints.iter().flat_map(|e| e.addresses.iter()).eq(["192.0.2.7"].iter())
                && s.ports.as_ref().is_some_and(|p| p[0].port == Some(port))
        })
    })
    .await;
    let svc = Api::<Service>::namespaced(client, "default").get("kubernetes").await.expect("svc");
    let ports = svc.spec.and_then(|s| s.ports).expect("ports");
    assert_eq!(
        ports[0].target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)),
        "the https port targets the port the apiserver serves on"
    );
}

fn ready_of(node: &Node) -> Option<String> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node lifecycle's timings, one by one: Ready through the 40 s grace period, then
/// Unknown with upstream's reason and message and the unreachable taints; pods marked not
/// Ready at once (endpoints drop) but evicted only after their 300 s default toleration;
/// the node back: Ready, taints gone, the evicted pod's deletion finished by its agent.
#[tokio::test(start_paused = true)]
async fn lost_node_timings_follow_the_grace_period_and_tolerations() {
    // Heartbeats every 2 s so that the grace period is measured from the stop, not from a
    // renewal up to 10 s earlier.
    let mut c = cluster_with(
        SimulateConfig::default().with_nodes(3).with_heartbeat(Duration::from_secs(2)),
    )
    .await;
    let pp = PostParams::default();
    Api::<Service>::namespaced(c.client.clone(), "default")
        .create(&pp, &service("default"))
        .await
        .expect("service");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for (p, n) in [("web-0", "sim-node-0"), ("web-1", "sim-node-1")] {
        pods.create(&pp, &pod("default", p, n)).await.expect("pod");
    }
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let ready_endpoints =
        || async { ready_ips(&slices.list(&lp).await.expect("slices").items).len() };
    wait_for("2 ready endpoints", || async { ready_endpoints().await == 2 }).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    wait_for("podCIDRs", || async {
        let l = nodes.list(&ListParams::default()).await.expect("nodes");
        let mut cidrs: Vec<String> =
            l.items.iter().filter_map(|n| n.spec.as_ref()?.pod_cidr.clone()).collect();
        cidrs.sort();
        cidrs == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"]
    })
    .await;

    // Still fine well within the grace period.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref(), Some("True"));

    c.sim.stop_node("sim-node-0").expect("stop");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref(),
        Some("True"),
        "not NotReady before the 40 s grace period"
    );
    wait_for("sim-node-0 NotReady", || async {
        ready_of(&nodes.get("sim-node-0").await.expect("node")).as_deref() == Some("Unknown")
    })
    .await;
    let lost = nodes.get("sim-node-0").await.expect("node");
    let cond = lost
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .expect("Ready condition");
    assert_eq!(cond.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(cond.message.as_deref(), Some("Kubelet stopped posting node status."));
    // The kubelet's other health conditions go Unknown with it; NetworkUnavailable (the
    // network's, not the kubelet's) keeps what the agent said.
    let status_of = |type_: &str| {
        let conditions = lost.status.as_ref().and_then(|s| s.conditions.as_ref());
        let c = conditions.and_then(|cs| cs.iter().find(|c| c.type_ == type_)).expect(type_);
        (c.status.clone(), c.reason.clone().unwrap_or_default())
    };
    for type_ in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(status_of(type_), ("Unknown".into(), "NodeStatusUnknown".into()), "{type_}");
    }
    assert_eq!(status_of("NetworkUnavailable"), ("False".into(), "RouteCreated".into()));
    let taints: Vec<(String, String)> = lost
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    let unreachable = "node.kubernetes.io/unreachable".to_string();
    assert!(taints.contains(&(unreachable.clone(), "NoSchedule".into())), "{taints:?}");
    assert!(taints.contains(&(unreachable, "NoExecute".into())), "{taints:?}");
    assert_eq!(ready_of(&nodes.get("sim-node-1").await.expect("node")).as_deref(), Some("True"));
    wait_for("web-0 Ready=False", || async { !pod_ready(&pods.get("web-0").await.expect("pod")) })
        .await;
    wait_for("endpoints drop web-0", || async { ready_endpoints().await == 1 }).await;
    assert!(pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_none());

    // The admission default toleration is 300 s: evicted after it, not before.
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert!(
        pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_none(),
        "evicted before its toleration ran out"
    );
    tokio::time::sleep(Duration::from_secs(45)).await;
    wait_for("web-0 evicted", || async {
        pods.get("web-0").await.expect("pod").metadata.deletion_timestamp.is_some()
    })
    .await;
    assert!(pods.get("web-1").await.expect("pod").metadata.deletion_timestamp.is_none());

    // The node comes back: Ready again, taints gone; its agent finishes the evicted pod's
    // deletion.
    c.sim.resume_node("sim-node-0").await.expect("resume");
    wait_for("sim-node-0 back", || async {
        let n = nodes.get("sim-node-0").await.expect("node");
        ready_of(&n).as_deref() == Some("True")
            && n.spec.and_then(|s| s.taints).unwrap_or_default().is_empty()
    })
    .await;
    wait_for("web-0 gone", || async { pods.get_opt("web-0").await.expect("get").is_none() }).await;
}

fn taints_of(node: &Node) -> Vec<(String, String)> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.into_iter().map(|t| (t.key, t.effect)).collect()
}

/// A Node registered through the API that never posts a status waits out the 60 s startup
/// grace period, then gets upstream's NodeStatusNeverUpdated conditions and the unreachable
/// taints. A cordon is a `node.kubernetes.io/unschedulable` NoSchedule taint until undone.
#[tokio::test(start_paused = true)]
async fn silent_and_cordoned_nodes_get_upstreams_conditions_and_taints() {
    let c = cluster(0).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = serde_json::from_value(json!({"metadata": {"name": "quiet"}})).expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("create node");
    let unschedulable = ("node.kubernetes.io/unschedulable".to_string(), "NoSchedule".to_string());
    let cordon = |on: bool| {
        let nodes = nodes.clone();
        async move {
            let patch = json!({"spec": {"unschedulable": on}});
            nodes
                .patch("quiet", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("cordon");
        }
    };
    cordon(true).await;
    wait_for("the unschedulable taint", || async {
        taints_of(&nodes.get("quiet").await.expect("node")) == [unschedulable.clone()]
    })
    .await;

    // Past the 40 s grace of a node that did post, within the startup grace.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let n = nodes.get("quiet").await.expect("node");
    assert!(n.status.and_then(|s| s.conditions).unwrap_or_default().is_empty());

    wait_for("NodeStatusNeverUpdated", || async {
        ready_of(&nodes.get("quiet").await.expect("node")).as_deref() == Some("Unknown")
    })
    .await;
    let n = nodes.get("quiet").await.expect("node");
    let conditions = n.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let mut types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    types.sort();
    assert_eq!(types, ["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]);
    for cond in &conditions {
        assert_eq!(cond.status, "Unknown");
        assert_eq!(cond.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(cond.message.as_deref(), Some("Kubelet never posted node status."));
    }
    wait_for("the unreachable taints", || async {
        let mut taints = taints_of(&nodes.get("quiet").await.expect("node"));
        taints.sort();
        let unreachable = "node.kubernetes.io/unreachable".to_string();
        taints
            == [
                (unreachable.clone(), "NoExecute".into()),
                (unreachable, "NoSchedule".into()),
                unschedulable.clone(),
            ]
    })
    .await;

    cordon(false).await;
    wait_for("the unschedulable taint removed", || async {
        !taints_of(&nodes.get("quiet").await.expect("node")).contains(&unschedulable)
    })
    .await;
    assert_eq!(taints_of(&nodes.get("quiet").await.expect("node")).len(), 2);
    // A node that never was Ready records no NodeNotReady event.
    let events = Api::<k8s_openapi::api::core::v1::Event>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(!events.items.iter().any(|e| e.reason.as_deref() == Some("NodeNotReady")));
}
