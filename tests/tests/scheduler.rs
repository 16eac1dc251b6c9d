//! The scheduler against the real apiserver in memory (no TCP): nodes are Node objects
//! created through the API (Ready, with allocatable), pods are created through the API, and
//! the scheduler binds them through pods/binding.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use skiff_apiserver::ApiServer;
use skiff_scheduler::{self as scheduler, SchedulerConfig};
use skiff_store::memory::MemoryStore;

struct Rig {
    _api: Arc<ApiServer>,
    client: Client,
    scheduler: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.scheduler.abort();
    }
}

async fn rig() -> Rig {
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
        .await
        .expect("apiserver");
    let client = api.client();
    let config = SchedulerConfig {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(500),
        ..Default::default()
    };
    let scheduler = tokio::spawn(scheduler::run(client.clone(), config));
    Rig { _api: api, client, scheduler }
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

async fn node(client: &Client, name: &str, cpu: &str, extra: Value) {
    let mut n = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        }
    });
    merge(&mut n, extra);
    let node: Node = serde_json::from_value(n.clone()).expect("node");
    let api: Api<Node> = Api::all(client.clone());
    api.create(&PostParams::default(), &node).await.expect("create node");
    // Status is the node's own to write (as the kubelet does after registering).
    api.patch_status(
        name,
        &Default::default(),
        &kube::api::Patch::Merge(json!({"status": n["status"]})),
    )
    .await
    .expect("node status");
}

async fn pod(client: &Client, name: &str, cpu: &str, extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                  "resources": {"requests": {"cpu": cpu}}}]}
    });
    merge(&mut p, extra);
    let pod: Pod = serde_json::from_value(p).expect("pod");
    Api::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty())
}

/// Poll `f` every 20 ms until it returns Some, failing with `what` after 10 s.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get(client: &Client, name: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), "default").get(name).await.expect("get pod")
}

async fn bound(client: &Client, name: &str) -> String {
    let c = client.clone();
    let n = name.to_string();
    eventually(&format!("{name} to be bound"), move || {
        let (c, n) = (c.clone(), n.clone());
        async move { node_of(&get(&c, &n).await) }
    })
    .await
}

/// Waits for PodScheduled=False/Unschedulable and returns its message.
async fn unschedulable(client: &Client, name: &str) -> String {
    unschedulable_as(client, name, None).await
}

/// Wait until the pod is marked unschedulable, with `message` when given. A scheduler whose
/// node informer has not seen the last node yet reports fewer nodes first, then retries the
/// pod when that node arrives: the message is waited for, not read once.
async fn unschedulable_as(client: &Client, name: &str, message: Option<&str>) -> String {
    let c = client.clone();
    let n = name.to_string();
    let want = message.map(str::to_string);
    let what = match message {
        Some(m) => format!("{name} to be marked unschedulable with {m:?}"),
        None => format!("{name} to be marked unschedulable"),
    };
    eventually(&what, move || {
        let (c, n, want) = (c.clone(), n.clone(), want.clone());
        async move {
            let p = get(&c, &n).await;
            let cond = p.status?.conditions?.into_iter().find(|c| c.type_ == "PodScheduled")?;
            let message = cond.message.unwrap_or_default();
            (cond.status == "False"
                && cond.reason.as_deref() == Some("Unschedulable")
                && want.as_ref().is_none_or(|w| *w == message))
            .then_some(message)
        }
    })
    .await
}

async fn events_for(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// Returns once the scheduler has seen the nodes created up to `last` (its node informer
/// may still be catching up on a loaded machine): a pod that fits only `last` is bound,
/// then deleted at once.
async fn seen_through(client: &Client, last: &str) {
    let probe = json!({"metadata": {"labels": {"app": "probe"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": last}}});
    pod(client, "probe", "1m", probe).await;
    assert_eq!(bound(client, "probe").await, last);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let now = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    pods.delete("probe", &now).await.expect("delete probe");
}

fn owned_by_rs() -> Value {
    json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
        "uid": "6d1f8f8e-0000-4000-8000-000000000001", "controller": true}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_spread_over_nodes_and_get_scheduled_events() {
    let rig = rig().await;
    for n in ["n1", "n2", "n3"] {
        node(&rig.client, n, "4", json!({})).await;
    }
    seen_through(&rig.client, "n3").await;
    for i in 0..3 {
        pod(&rig.client, &format!("web-{i}"), "100m", owned_by_rs()).await;
    }
    let mut nodes = BTreeSet::new();
    for i in 0..3 {
        nodes.insert(bound(&rig.client, &format!("web-{i}")).await);
    }
    assert_eq!(nodes.len(), 3, "3 replicas on 3 nodes: {nodes:?}");
    let p = get(&rig.client, "web-0").await;
    let cond = p
        .status
        .clone()
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(cond.status, "True");
    let c = rig.client.clone();
    let ev = eventually("a Scheduled event", move || {
        let c = c.clone();
        async move { events_for(&c, "web-0", "Scheduled").await.into_iter().next() }
    })
    .await;
    let node = node_of(&p).unwrap();
    assert_eq!(
        ev.message.as_deref(),
        Some(format!("Successfully assigned default/web-0 to {node}").as_str())
    );
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insufficient_resources_then_a_node_is_added() {
    let rig = rig().await;
    for n in ["n1", "n2", "n3"] {
        node(&rig.client, n, "1", json!({})).await;
    }
    seen_through(&rig.client, "n3").await;
    pod(&rig.client, "big", "2", json!({})).await;
    unschedulable_as(&rig.client, "big", Some("0/3 nodes are available: 3 Insufficient cpu."))
        .await;
    let c = rig.client.clone();
    let ev = eventually("a FailedScheduling event", move || {
        let c = c.clone();
        async move { events_for(&c, "big", "FailedScheduling").await.into_iter().next() }
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.message.as_deref(), Some("0/3 nodes are available: 3 Insufficient cpu."));
    assert!(node_of(&get(&rig.client, "big").await).is_none());

    node(&rig.client, "large", "8", json!({})).await;
    assert_eq!(bound(&rig.client, "big").await, "large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_bump_one_event_and_leave_the_status_alone() {
    let rig = rig().await;
    node(&rig.client, "small", "1", json!({})).await;
    pod(&rig.client, "big", "2", json!({})).await;
    unschedulable(&rig.client, "big").await;
    let c = rig.client.clone();
    eventually("a FailedScheduling event", move || {
        let c = c.clone();
        async move { events_for(&c, "big", "FailedScheduling").await.into_iter().next() }
    })
    .await;
    let version = get(&rig.client, "big").await.metadata.resource_version;
    // Each node update is a cluster event that retries the pod, with the same outcome.
    let nodes: Api<Node> = Api::all(rig.client.clone());
    for i in 0..5 {
        let patch = json!({"metadata": {"labels": {"round": i.to_string()}}});
        nodes
            .patch("small", &Default::default(), &kube::api::Patch::Merge(&patch))
            .await
            .expect("label");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let c = rig.client.clone();
    let events = eventually("the FailedScheduling count to grow", move || {
        let c = c.clone();
        async move {
            let ev = events_for(&c, "big", "FailedScheduling").await;
            (ev.first().and_then(|e| e.count).unwrap_or(0) >= 3).then_some(ev)
        }
    })
    .await;
    assert_eq!(events.len(), 1, "repeats are one Event with a count: {events:?}");
    assert_eq!(
        get(&rig.client, "big").await.metadata.resource_version,
        version,
        "an unchanged PodScheduled=False condition is not written again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assume_cache_never_overbooks() {
    let rig = rig().await;
    node(&rig.client, "n1", "1", json!({})).await;
    // 20 pods of 100m on a 1-cpu node, created at once: exactly 10 fit.
    for i in 0..20 {
        pod(&rig.client, &format!("p{i}"), "100m", json!({})).await;
    }
    let c = rig.client.clone();
    eventually("10 bound and 10 unschedulable", move || {
        let c = c.clone();
        async move {
            let pods =
                Api::<Pod>::namespaced(c, "default").list(&ListParams::default()).await.ok()?.items;
            let bound = pods.iter().filter(|p| node_of(p).is_some()).count();
            let waiting = pods
                .iter()
                .filter(|p| {
                    p.status
                        .iter()
                        .flat_map(|s| s.conditions.iter().flatten())
                        .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                })
                .count();
            (bound == 10 && waiting == 10).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = Api::<Pod>::namespaced(rig.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(pods.iter().filter(|p| node_of(p).is_some()).count(), 10, "never more than fit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_tolerations_and_node_affinity() {
    let rig = rig().await;
    node(
        &rig.client,
        "gpu",
        "4",
        json!({"metadata": {"labels": {"accel": "gpu"}},
        "spec": {"taints": [{"key": "accel", "value": "gpu", "effect": "NoSchedule"}]}}),
    )
    .await;
    node(&rig.client, "plain", "4", json!({"metadata": {"labels": {"disk": "ssd"}}})).await;

    pod(&rig.client, "any", "100m", json!({})).await;
    assert_eq!(bound(&rig.client, "any").await, "plain", "the tainted node is avoided");

    let to_gpu = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "accel", "operator": "In", "values": ["gpu"]}]}]}}}}});
    pod(&rig.client, "intolerant", "100m", to_gpu.clone()).await;
    unschedulable_as(
        &rig.client,
        "intolerant",
        Some(
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {accel: gpu}.",
        ),
    )
    .await;
    let mut tolerant = to_gpu;
    merge(
        &mut tolerant,
        json!({"spec": {"tolerations": [{"key": "accel", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}}),
    );
    pod(&rig.client, "tolerant", "100m", tolerant).await;
    assert_eq!(bound(&rig.client, "tolerant").await, "gpu");

    pod(&rig.client, "selected", "100m", json!({"spec": {"nodeSelector": {"disk": "ssd"}}})).await;
    assert_eq!(bound(&rig.client, "selected").await, "plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affinity_and_host_ports() {
    let rig = rig().await;
    node(&rig.client, "n1", "4", json!({})).await;
    node(&rig.client, "n2", "4", json!({})).await;
    let anti = json!({"metadata": {"labels": {"app": "db"}}, "spec": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}});
    for i in 0..3 {
        pod(&rig.client, &format!("db-{i}"), "100m", anti.clone()).await;
    }
    let mut placed = BTreeSet::new();
    let mut waiting = Vec::new();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        let name = format!("db-{i}");
        let c = rig.client.clone();
        let n = name.clone();
        // Each pod either binds or is marked unschedulable.
        let outcome = eventually(&format!("{name} decided"), move || {
            let (c, n) = (c.clone(), n.clone());
            async move {
                let p = get(&c, &n).await;
                if let Some(node) = node_of(&p) {
                    return Some(Ok(node));
                }
                let cond = p.status?.conditions?.into_iter().find(|c| c.type_ == "PodScheduled")?;
                (cond.status == "False").then(|| Err(cond.message.unwrap_or_default()))
            }
        })
        .await;
        match outcome {
            Ok(node) => {
                placed.insert(node);
            }
            Err(msg) => waiting.push(msg),
        }
    }
    assert_eq!(placed.len(), 2, "two db pods on two nodes: {placed:?}");
    assert_eq!(
        waiting,
        vec![
            "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules.".to_string()
        ]
    );

    let port = json!({"metadata": {"labels": {"app": "edge"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}});
    pod(&rig.client, "edge-0", "100m", port.clone()).await;
    let first = bound(&rig.client, "edge-0").await;
    pod(&rig.client, "edge-1", "100m", port.clone()).await;
    let second = bound(&rig.client, "edge-1").await;
    assert_ne!(first, second, "one pod per host port per node");
    pod(&rig.client, "edge-2", "100m", port).await;
    unschedulable_as(
        &rig.client,
        "edge-2",
        Some("0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports."),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_evicts_the_lower_priority_pod() {
    let rig = rig().await;
    node(&rig.client, "n1", "1", json!({})).await;
    pod(&rig.client, "low", "800m", json!({"spec": {"priority": 0}})).await;
    assert_eq!(bound(&rig.client, "low").await, "n1");

    pod(&rig.client, "high", "500m", json!({"spec": {"priority": 1000}})).await;
    // The victim is deleted gracefully (it has a node: deletionTimestamp first).
    let c = rig.client.clone();
    eventually("the victim to be terminating", move || {
        let c = c.clone();
        async move { get(&c, "low").await.metadata.deletion_timestamp.map(|_| ()) }
    })
    .await;
    let c = rig.client.clone();
    let nominated = eventually("nominatedNodeName", move || {
        let c = c.clone();
        async move { get(&c, "high").await.status?.nominated_node_name }
    })
    .await;
    assert_eq!(nominated, "n1");
    assert!(
        node_of(&get(&rig.client, "high").await).is_none(),
        "not bound while the victim still runs"
    );
    let c = rig.client.clone();
    eventually("a Preempted event", move || {
        let c = c.clone();
        async move { events_for(&c, "low", "Preempted").await.into_iter().next() }
    })
    .await;

    // The node agent stops the victim and deletes it for good.
    Api::<Pod>::namespaced(rig.client.clone(), "default")
        .delete("low", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .expect("final delete");
    assert_eq!(bound(&rig.client, "high").await, "n1");

    // A pod of equal priority does not preempt: it waits.
    pod(&rig.client, "peer", "800m", json!({"spec": {"priority": 1000}})).await;
    unschedulable(&rig.client, "peer").await;
    assert!(get(&rig.client, "high").await.metadata.deletion_timestamp.is_none());
}

/// Upstream's VolumeBinding for bound claims: a missing or unbound claim keeps the pod
/// pending with upstream's message; once the claim is bound to a local volume, the pod goes
/// to the one node the volume's affinity names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_must_be_bound_and_local_volumes_pick_the_node() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let r = rig().await;
    for n in ["n1", "n2", "n3"] {
        node(&r.client, n, "4", json!({})).await;
    }
    let with_claim = json!({"spec": {"volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    pod(&r.client, "db", "100m", with_claim).await;
    unschedulable_as(
        &r.client,
        "db",
        Some("0/3 nodes are available: persistentvolumeclaim \"data\" not found. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(r.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("pvc");
    claims.create(&PostParams::default(), &claim).await.expect("create pvc");
    unschedulable_as(
        &r.client,
        "db",
        Some("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."),
    )
    .await;
    // What the binder does: a local volume on n2, bound to the claim.
    let volumes: Api<PersistentVolume> = Api::all(r.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "disk-n2"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "local", "local": {"path": "/mnt/disk"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}}
    }))
    .expect("pv");
    volumes.create(&PostParams::default(), &pv).await.expect("create pv");
    let bind = json!({"spec": {"volumeName": "disk-n2"}});
    claims
        .patch("data", &Default::default(), &kube::api::Patch::Merge(&bind))
        .await
        .expect("bind the claim");
    assert_eq!(bound(&r.client, "db").await, "n2");

    // A volume on a node that is not there: no node satisfies it.
    let mut gone = pv.clone();
    gone.metadata.name = Some("disk-n9".into());
    let terms = &mut gone.spec.as_mut().expect("spec").node_affinity.as_mut().expect("affinity");
    terms.required.as_mut().expect("required").node_selector_terms[0]
        .match_expressions
        .as_mut()
        .expect("expressions")[0]
        .values = Some(vec!["n9".into()]);
    volumes.create(&PostParams::default(), &gone).await.expect("create pv");
    let mut other = claim.clone();
    other.metadata.name = Some("logs".into());
    other.spec.as_mut().expect("spec").volume_name = Some("disk-n9".into());
    claims.create(&PostParams::default(), &other).await.expect("create pvc");
    let with_logs = json!({"spec": {"volumes": [
        {"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}]}});
    pod(&r.client, "shipper", "100m", with_logs).await;
    unschedulable_as(
        &r.client,
        "shipper",
        Some("0/3 nodes are available: 3 node(s) had volume node affinity conflict."),
    )
    .await;
}

/// The local-path provisioner's claims (WaitForFirstConsumer): the scheduler places the
/// first pod anywhere and writes its node on the claim, the provisioner makes a volume on
/// that node, the binder binds it, and later pods of the claim follow it; once released,
/// the volume goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_path_claims_are_provisioned_where_their_first_pod_goes() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    use skiff_controllers::{Context, ControllerConfig, local_path, volume, volume_protection};
    let r = rig().await;
    for n in ["n1", "n2", "n3"] {
        node(&r.client, n, "4", json!({})).await;
    }
    let ctx = Context::new(r.client.clone(), ControllerConfig::default());
    let controllers = [
        tokio::spawn(local_path::run(ctx.clone(), "/var/lib/skiff/storage".into())),
        tokio::spawn(volume::run(ctx.clone())),
        tokio::spawn(volume_protection::run(ctx)),
    ];
    let classes: Api<StorageClass> = Api::all(r.client.clone());
    let sc = eventually("the local-path class", || {
        let classes = classes.clone();
        async move { classes.get_opt("local-path").await.ok().flatten() }
    })
    .await;
    assert_eq!(sc.provisioner, "skiff.dev/local-path");
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("WaitForFirstConsumer"));

    // No class: the default (local-path) is filled in.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(r.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("pvc");
    let claim = claims.create(&PostParams::default(), &claim).await.expect("create pvc");
    let with_claim = json!({"spec": {"volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "cache"}}]}});
    pod(&r.client, "web", "100m", with_claim.clone()).await;
    let chosen = bound(&r.client, "web").await;
    // PreBind waited for the volume: the claim was bound before the pod was.
    let now = claims.get("cache").await.expect("claim");
    assert!(now.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some(), "{now:?}");
    let pv_name = format!("pvc-{}", claim.metadata.uid.as_deref().expect("uid"));
    let c = claims.clone();
    let bound_claim = eventually("the claim bound to its provisioned volume", move || {
        let c = c.clone();
        async move {
            c.get("cache")
                .await
                .ok()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        }
    })
    .await;
    assert_eq!(
        bound_claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.kubernetes.io/selected-node")),
        Some(&chosen)
    );
    assert_eq!(
        bound_claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some(pv_name.as_str())
    );
    let volumes: Api<PersistentVolume> = Api::all(r.client.clone());
    let pv = volumes.get(&pv_name).await.expect("the provisioned volume");
    let spec = pv.spec.clone().expect("spec");
    let affinity = spec.node_affinity.and_then(|a| a.required).expect("required affinity");
    assert_eq!(
        affinity.node_selector_terms[0].match_expressions.as_ref().expect("terms")[0].values,
        Some(vec![chosen.clone()])
    );
    let path = spec.host_path.expect("a hostPath volume").path;
    assert_eq!(path, format!("/var/lib/skiff/storage/{pv_name}_default_cache"));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));

    // A second pod of the claim goes where the volume is.
    pod(&r.client, "web-2", "100m", with_claim).await;
    assert_eq!(bound(&r.client, "web-2").await, chosen);

    // Pods and claim gone: the volume is released and deleted.
    let pods: Api<Pod> = Api::namespaced(r.client.clone(), "default");
    for p in ["web", "web-2"] {
        pods.delete(p, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await
            .expect("delete pod");
    }
    claims.delete("cache", &DeleteParams::default()).await.expect("delete pvc");
    // A helper pod on the volume's node removes its directory (the test plays the agent).
    let helpers: Api<Pod> = Api::namespaced(r.client.clone(), "kube-system");
    let helper_name = format!("helper-pod-delete-{pv_name}");
    let (h, n) = (helpers.clone(), helper_name.clone());
    let helper = eventually("the teardown helper pod", move || {
        let (h, n) = (h.clone(), n.clone());
        async move { h.get_opt(&n).await.ok().flatten() }
    })
    .await;
    let spec = helper.spec.expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some(chosen.as_str()));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.containers[0].command,
        Some(vec![
            "rm".to_string(),
            "-rf".into(),
            "--".into(),
            format!("/data/{pv_name}_default_cache")
        ])
    );
    let host = spec.volumes.expect("volumes")[0].host_path.clone().expect("hostPath");
    assert_eq!(host.path, "/var/lib/skiff/storage");
    // Not deleted while the helper runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(volumes.get_opt(&pv_name).await.expect("get pv").is_some(), "deleted before teardown");
    let done = json!({"status": {"phase": "Succeeded"}});
    helpers
        .patch_status(&helper_name, &Default::default(), &kube::api::Patch::Merge(&done))
        .await
        .expect("helper succeeded");
    let v = volumes.clone();
    eventually("the volume deleted", move || {
        let v = v.clone();
        let name = pv_name.clone();
        async move { v.get_opt(&name).await.ok().filter(|pv| pv.is_none()).map(|_| ()) }
    })
    .await;
    let h = helpers.clone();
    eventually("the helper pod deleted", move || {
        let (h, n) = (h.clone(), helper_name.clone());
        async move { h.get_opt(&n).await.ok().filter(|p| p.is_none()).map(|_| ()) }
    })
    .await;
    for c in controllers {
        c.abort();
    }
}

/// A 1Gi ReadWriteOnce claim of the local-path class.
async fn local_path_claim(
    claims: &Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    name: &str,
) {
    let claim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("pvc");
    claims.create(&PostParams::default(), &claim).await.expect("create pvc");
}

/// The message of the pod's FailedScheduling event from a failed PreBind, once there is one.
async fn prebind_failure(client: &Client, pod: &str) -> String {
    let (c, p) = (client.clone(), pod.to_string());
    eventually(&format!("a PreBind FailedScheduling event of {pod}"), move || {
        let (c, p) = (c.clone(), p.clone());
        async move {
            events_for(&c, &p, "FailedScheduling")
                .await
                .into_iter()
                .find_map(|e| e.message.filter(|m| m.contains("PreBind")))
        }
    })
    .await
}

/// Upstream's VolumeBinding PreBind: a pod whose claim is still being provisioned is bound
/// only once the claim is, and a claim lost meanwhile sends the pod back to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_waits_for_claims_being_provisioned() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let r = rig().await;
    for n in ["n1", "n2"] {
        node(&r.client, n, "4", json!({})).await;
    }
    // The provisioner's class, with no provisioner running: the test plays it.
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "local-path"}, "provisioner": "skiff.dev/local-path",
        "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"
    }))
    .expect("class");
    Api::<StorageClass>::all(r.client.clone())
        .create(&PostParams::default(), &sc)
        .await
        .expect("create class");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(r.client.clone(), "default");
    for name in ["data", "scratch"] {
        local_path_claim(&claims, name).await;
    }
    async fn selected(claims: &Api<PersistentVolumeClaim>, name: &'static str) -> String {
        let c = claims.clone();
        eventually(&format!("a node selected for {name}"), move || {
            let c = c.clone();
            async move {
                let mut annotations = c.get(name).await.ok()?.metadata.annotations?;
                annotations.remove("volume.kubernetes.io/selected-node")
            }
        })
        .await
    }
    let with = |claim: &str| {
        json!({"spec": {"volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})
    };
    pod(&r.client, "db", "100m", with("data")).await;
    let chosen = selected(&claims, "data").await;
    // The node is chosen, the volume is not there yet: the pod is not bound.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(node_of(&get(&r.client, "db").await), None, "bound before its claim");

    // What the provisioner and the binder do: a volume on that node, bound to the claim.
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pvc-data"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "local-path", "hostPath": {"path": "/tmp/pvc-data"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [chosen]}]}]}}}
    }))
    .expect("pv");
    Api::<PersistentVolume>::all(r.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("create pv");
    let bind = json!({"spec": {"volumeName": "pvc-data"}});
    claims.patch("data", &Default::default(), &kube::api::Patch::Merge(&bind)).await.expect("bind");
    assert_eq!(bound(&r.client, "db").await, chosen);

    // A claim deleted while its pod waits (held Terminating by its protection finalizer):
    // the binding gives up (upstream would keep waiting until its timeout) and the pod is
    // pending again.
    pod(&r.client, "cache", "100m", with("scratch")).await;
    selected(&claims, "scratch").await;
    claims.delete("scratch", &DeleteParams::default()).await.expect("delete pvc");
    assert_eq!(
        prebind_failure(&r.client, "cache").await,
        "running PreBind plugin \"VolumeBinding\": binding volumes: persistentvolumeclaim \"scratch\" is being deleted"
    );
    unschedulable_as(
        &r.client,
        "cache",
        Some("0/2 nodes are available: persistentvolumeclaim \"scratch\" is being deleted. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."),
    )
    .await;
    assert_eq!(node_of(&get(&r.client, "cache").await), None);

    // The provisioner drops a claim's selection (its node went away) while a pod waits:
    // the binding gives up with upstream's message and the pod is placed again.
    local_path_claim(&claims, "spare").await;
    pod(&r.client, "late", "100m", with("spare")).await;
    selected(&claims, "spare").await;
    let reset = json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": null}}});
    claims
        .patch("spare", &Default::default(), &kube::api::Patch::Merge(&reset))
        .await
        .expect("reset");
    assert_eq!(
        prebind_failure(&r.client, "late").await,
        "running PreBind plugin \"VolumeBinding\": binding volumes: selectedNode annotation reset for PVC \"spare\""
    );
    selected(&claims, "spare").await;
    assert_eq!(node_of(&get(&r.client, "late").await), None, "still waiting for its volume");

    // Deleted while it waits (a finalizer holds it): the binding ends at once, without a
    // FailedScheduling event for a pod on its way out.
    let hold = json!({"metadata": {"finalizers": ["test.skiff/hold"]}});
    let pods: Api<Pod> = Api::namespaced(r.client.clone(), "default");
    pods.patch("late", &Default::default(), &kube::api::Patch::Merge(&hold)).await.expect("hold");
    pods.delete("late", &DeleteParams::default()).await.expect("delete");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Its volume arrives after all: nothing is bound, nothing is reported.
    let mut spare = pv.clone();
    spare.metadata.name = Some("pvc-spare".into());
    Api::<PersistentVolume>::all(r.client.clone())
        .create(&PostParams::default(), &spare)
        .await
        .expect("create pv");
    let bind = json!({"spec": {"volumeName": "pvc-spare"}});
    claims
        .patch("spare", &Default::default(), &kube::api::Patch::Merge(&bind))
        .await
        .expect("bind");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = get(&r.client, "late").await;
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(node_of(&p), None, "not bound on its way out");
    let rejected = events_for(&r.client, "late", "FailedScheduling").await;
    assert!(
        !rejected
            .iter()
            .any(|e| e.message.as_deref().is_some_and(|m| m.starts_with("Binding rejected"))),
        "the binding went on after the deletion: {rejected:?}"
    );
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch("late", &Default::default(), &kube::api::Patch::Merge(&release))
        .await
        .expect("release");
}
