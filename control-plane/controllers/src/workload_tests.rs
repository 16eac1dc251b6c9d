//! Scenario tests of the workload controllers against the real apiserver in memory, with a
//! "kubelet stand-in" that binds pending pods (to the node a DaemonSet pod's affinity names,
//! else round robin), marks bound pods Running and Ready (or Succeeded/Failed for pods
//! labelled `test.skiff/outcome`, container "c" exiting with `test.skiff/exit-code`; an
//! Indexed Job's pod whose index `test.skiff/succeed-indexes` or `test.skiff/fail-indexes`
//! lists, dot-separated, succeeds or fails), and removes terminating pods with
//! gracePeriodSeconds=0.
//! Pods annotated `test.skiff/kubelet: ignore` are left alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

use super::{Context, ControllerConfig, pods};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

/// Of paused time: long enough for the Job backoff (10 s, 20 s, ...).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Harness {
    client: Client,
    _api: Arc<ApiServer>,
    _tasks: Vec<AbortOnDrop>,
}

impl Harness {
    async fn start(nodes: &[&str]) -> Harness {
        let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("apiserver starts");
        let client = api.client();
        for n in nodes {
            add_node(&client, n, &[]).await;
        }
        let ctx = Context::new(client.clone(), ControllerConfig::default());
        let controllers = AbortOnDrop(tokio::spawn(super::run_workloads(ctx)));
        let kubelet = AbortOnDrop(tokio::spawn(kubelet_stand_in(client.clone())));
        Harness { client, _api: api, _tasks: vec![controllers, kubelet] }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn pods(&self) -> Vec<Pod> {
        self.api::<Pod>().list(&ListParams::default()).await.expect("list pods").items
    }
}

async fn add_node(client: &Client, name: &str, labels: &[(&str, &str)]) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("node json");
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

/// Wait until `f` holds, polling the API.
async fn wait_for<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn daemon_node(pod: &Pod) -> Option<String> {
    let terms = pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?;
    terms.node_selector_terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|f| {
        (f.key == "metadata.name" && f.operator == "In")
            .then(|| f.values.as_ref()?.first().cloned())
            .flatten()
    })
}

async fn kubelet_stand_in(client: Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let stream = watcher(pods, watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Ok(Some(pod)) = stream.try_next().await {
        if pod.annotations().get("test.skiff/kubelet").map(String::as_str) == Some("ignore") {
            continue;
        }
        let client = client.clone();
        let nodes = nodes.clone();
        let next = next.clone();
        tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
            let name = pod.name_any();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            if pods::is_terminating(&pod) {
                let _ = api
                    .delete(
                        &name,
                        &DeleteParams { grace_period_seconds: Some(0), ..Default::default() },
                    )
                    .await;
            } else if node.is_empty() {
                let target = match daemon_node(&pod) {
                    Some(n) => n,
                    None => {
                        let all = nodes
                            .list(&ListParams::default())
                            .await
                            .map(|l| l.items)
                            .unwrap_or_default();
                        if all.is_empty() {
                            return;
                        }
                        all[next.fetch_add(1, Ordering::Relaxed) % all.len()].name_any()
                    }
                };
                let binding = Binding {
                    metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                    target: ObjectReference {
                        kind: Some("Node".into()),
                        name: Some(target),
                        ..Default::default()
                    },
                };
                let _: Result<serde_json::Value, _> = api
                    .create_subresource("binding", &name, &PostParams::default(), &binding)
                    .await;
            } else if pods::phase(&pod) == "Pending" {
                let index = pod.labels().get("batch.kubernetes.io/job-completion-index");
                let listed = |key: &str| {
                    let list = pod.labels().get(key).map(String::as_str).unwrap_or_default();
                    index.is_some_and(|i| list.split('.').any(|l| l == i))
                };
                let outcome = if listed("test.skiff/fail-indexes") {
                    Some("fail")
                } else if listed("test.skiff/succeed-indexes") {
                    Some("succeed")
                } else {
                    pod.labels().get("test.skiff/outcome").map(String::as_str)
                };
                let status = match outcome {
                    // Ready=False when the pod finished, as the kubelet reports it.
                    // Container "c" exited with `test.skiff/exit-code` (default 0, or 1 on
                    // failure).
                    Some(outcome @ ("succeed" | "fail")) => {
                        let code: i32 = pod
                            .labels()
                            .get("test.skiff/exit-code")
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(if outcome == "succeed" { 0 } else { 1 });
                        json!({
                            "phase": if outcome == "succeed" { "Succeeded" } else { "Failed" },
                            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": pods::now()}],
                            "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                                                   "state": {"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}}}],
                        })
                    }
                    _ => json!({
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": pods::now()}],
                        "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "started": true}],
                    }),
                };
                let _ = api
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await;
            }
        });
    }
}

fn deployment(name: &str, replicas: i32, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    }))
    .expect("deployment json")
}

fn deploy_done(d: &Deployment, replicas: i32) -> bool {
    let Some(s) = d.status.as_ref() else { return false };
    let progressing = s.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "True"
            && c.reason.as_deref() == Some("NewReplicaSetAvailable")
    });
    let available =
        s.conditions.iter().flatten().any(|c| c.type_ == "Available" && c.status == "True");
    s.observed_generation == d.metadata.generation
        && s.updated_replicas.unwrap_or(0) == replicas
        && s.available_replicas.unwrap_or(0) == replicas
        && s.replicas.unwrap_or(0) == replicas
        && progressing
        && available
}

async fn wait_deploy_done(h: &Harness, name: &str, replicas: i32) {
    let api = h.api::<Deployment>();
    wait_for(&format!("deployment {name} complete"), || async {
        api.get(name).await.is_ok_and(|d| deploy_done(&d, replicas))
    })
    .await;
}

fn image_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn deployment_of_three_becomes_three_ready_pods_and_available() {
    let h = Harness::start(&["n1", "n2", "n3"]).await;
    h.api::<Deployment>()
        .create(&PostParams::default(), &deployment("web", 3, "nginx:1"))
        .await
        .unwrap();
    wait_deploy_done(&h, "web", 3).await;
    let d = h.api::<Deployment>().get("web").await.unwrap();
    assert_eq!(d.annotations().get(super::deployment::REVISION).map(String::as_str), Some("1"));
    let rss = h.api::<ReplicaSet>().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rss.len(), 1, "one replicaset");
    let rs = &rss[0];
    let hash = rs.labels().get("pod-template-hash").expect("pod-template-hash label").clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    assert_eq!(
        rs.annotations().get("deployment.kubernetes.io/desired-replicas").map(String::as_str),
        Some("3")
    );
    assert_eq!(
        rs.annotations().get("deployment.kubernetes.io/max-replicas").map(String::as_str),
        Some("4")
    );
    assert_eq!(pods::controller_ref(&rs.metadata).map(|r| r.uid.clone()), d.metadata.uid.clone());
    let live: Vec<Pod> = h.pods().await.into_iter().filter(pods::is_active).collect();
    assert_eq!(live.len(), 3);
    for p in &live {
        assert!(pods::is_ready(p), "pod {} ready", p.name_any());
        assert!(p.name_any().starts_with(&format!("web-{hash}-")));
        assert_eq!(p.labels().get("pod-template-hash"), Some(&hash));
        let r = pods::controller_ref(&p.metadata).expect("controller ref");
        assert_eq!((r.kind.as_str(), r.block_owner_deletion), ("ReplicaSet", Some(true)));
    }
    let nodes: std::collections::BTreeSet<_> =
        live.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    assert_eq!(nodes.len(), 3, "spread by the stand-in binder");
}

/// Watches the pods of `app` and records the fewest ready, non-terminating ones seen at
/// any moment.
fn watch_min_ready(client: Client, app: &str) -> (Arc<Mutex<usize>>, AbortOnDrop) {
    let min = Arc::new(Mutex::new(usize::MAX));
    let m = min.clone();
    let api: Api<Pod> = Api::namespaced(client, "default");
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let task = tokio::spawn(async move {
        let mut state: HashMap<String, bool> = HashMap::new();
        // Only count once a (re)list is complete: mid-list the state is partial.
        let mut listed = false;
        let mut stream = std::pin::pin!(watcher(api, cfg));
        while let Ok(Some(ev)) = stream.try_next().await {
            match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    state.insert(p.name_any(), pods::is_ready(&p) && !pods::is_terminating(&p));
                }
                watcher::Event::Delete(p) => {
                    state.remove(&p.name_any());
                }
                watcher::Event::Init => {
                    state.clear();
                    listed = false;
                }
                watcher::Event::InitDone => listed = true,
            }
            if !listed {
                continue;
            }
            let ready = state.values().filter(|r| **r).count();
            let mut g = m.lock().unwrap();
            *g = (*g).min(ready);
        }
    });
    (min, AbortOnDrop(task))
}

async fn set_image(h: &Harness, name: &str, image: &str) {
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
    h.api::<Deployment>()
        .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn rolling_update_keeps_min_available_then_rollback() {
    let h = Harness::start(&["n1", "n2"]).await;
    h.api::<Deployment>()
        .create(&PostParams::default(), &deployment("web", 4, "nginx:1"))
        .await
        .unwrap();
    wait_deploy_done(&h, "web", 4).await;
    let (min_ready, _watch) = watch_min_ready(h.client.clone(), "web");
    // Let the watcher see the initial state.
    wait_for("watcher primed", || async { *min_ready.lock().unwrap() != usize::MAX }).await;
    set_image(&h, "web", "nginx:2").await;
    wait_deploy_done(&h, "web", 4).await;
    let live: Vec<Pod> = h.pods().await.into_iter().filter(pods::is_active).collect();
    assert_eq!(live.len(), 4);
    assert!(live.iter().all(|p| image_of(p) == "nginx:2"), "only new pods remain");
    let min = *min_ready.lock().unwrap();
    assert!(min >= 3, "ready pods fell to {min} (< replicas - maxUnavailable = 3)");
    let d = h.api::<Deployment>().get("web").await.unwrap();
    assert_eq!(d.annotations().get(super::deployment::REVISION).map(String::as_str), Some("2"));
    let new_hash = live[0].labels().get("pod-template-hash").cloned();
    assert!(live.iter().all(|p| p.labels().get("pod-template-hash") == new_hash.as_ref()));

    // `kubectl rollout undo` as kubectl >= 1.27 does it: the template of revision 1's RS.
    let rss = h.api::<ReplicaSet>().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rss.len(), 2);
    let rev1 = rss
        .iter()
        .find(|rs| {
            rs.annotations().get(super::deployment::REVISION).map(String::as_str) == Some("1")
        })
        .expect("revision 1 kept in history");
    let mut template = rev1.spec.as_ref().unwrap().template.clone().unwrap();
    template.metadata.as_mut().unwrap().labels.as_mut().unwrap().remove("pod-template-hash");
    // (kubectl sends a JSON patch replacing /spec/template; a merge patch of the whole
    // template is equivalent here: only the container list differs.)
    let patch = json!({"spec": {"template": template}});
    h.api::<Deployment>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_deploy_done(&h, "web", 4).await;
    let rs = h.api::<ReplicaSet>().get(&rev1.name_any()).await.unwrap();
    assert_eq!(rs.annotations().get(super::deployment::REVISION).map(String::as_str), Some("3"));
    assert_eq!(
        rs.annotations().get(super::deployment::REVISION_HISTORY).map(String::as_str),
        Some("1")
    );
    assert_eq!(rs.spec.as_ref().unwrap().replicas, Some(4));
    let live: Vec<Pod> = h.pods().await.into_iter().filter(pods::is_active).collect();
    assert!(live.iter().all(|p| image_of(p) == "nginx:1"), "rolled back to nginx:1");
    assert!(*min_ready.lock().unwrap() >= 3, "availability kept during the rollback too");
}

#[tokio::test(start_paused = true)]
async fn paused_deployment_does_not_roll() {
    let h = Harness::start(&["n1"]).await;
    h.api::<Deployment>()
        .create(&PostParams::default(), &deployment("web", 2, "nginx:1"))
        .await
        .unwrap();
    wait_deploy_done(&h, "web", 2).await;
    let pause = json!({"spec": {"paused": true}});
    h.api::<Deployment>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .unwrap();
    set_image(&h, "web", "nginx:2").await;
    let api = h.api::<Deployment>();
    wait_for("paused deployment observed", || async {
        api.get("web").await.is_ok_and(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
                && d.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.type_ == "Progressing" && c.reason.as_deref() == Some("DeploymentPaused")
                    })
                })
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.api::<ReplicaSet>().list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "no new RS"
    );
    assert!(h.pods().await.iter().all(|p| image_of(p) == "nginx:1"));
    let resume = json!({"spec": {"paused": false}});
    h.api::<Deployment>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .unwrap();
    wait_deploy_done(&h, "web", 2).await;
    let live: Vec<Pod> = h.pods().await.into_iter().filter(pods::is_active).collect();
    assert!(live.iter().all(|p| image_of(p) == "nginx:2"), "resumed deployment rolled");
}

#[tokio::test(start_paused = true)]
async fn recreate_deployment_replaces_all_pods() {
    let h = Harness::start(&["n1"]).await;
    let mut d = deployment("db", 2, "pg:1");
    d.spec.as_mut().unwrap().strategy =
        serde_json::from_value(json!({"type": "Recreate"})).unwrap();
    h.api::<Deployment>().create(&PostParams::default(), &d).await.unwrap();
    wait_deploy_done(&h, "db", 2).await;
    let (min_ready, _w) = watch_min_ready(h.client.clone(), "db");
    set_image(&h, "db", "pg:2").await;
    wait_deploy_done(&h, "db", 2).await;
    assert_eq!(*min_ready.lock().unwrap(), 0, "Recreate takes all old pods down first");
    assert!(h.pods().await.iter().all(|p| image_of(p) == "pg:2"));
}

fn replicaset(name: &str, replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }))
    .expect("replicaset json")
}

fn rs_settled(rs: &ReplicaSet, replicas: i32) -> bool {
    rs.status.as_ref().is_some_and(|s| {
        s.replicas == replicas
            && s.ready_replicas.unwrap_or(0) == replicas
            && s.available_replicas.unwrap_or(0) == replicas
            && s.fully_labeled_replicas.unwrap_or(0) == replicas
            && s.observed_generation == rs.metadata.generation
    })
}

#[tokio::test(start_paused = true)]
async fn replicaset_adopts_orphans_and_deletes_in_upstream_order() {
    let h = Harness::start(&["n1", "n2"]).await;
    let pods_api = h.api::<Pod>();
    // A matching orphan, already running.
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "rs"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    pods_api.create(&PostParams::default(), &orphan).await.unwrap();
    wait_for("orphan ready", || async {
        pods_api.get("orphan").await.is_ok_and(|p| pods::is_ready(&p))
    })
    .await;

    let rs_api = h.api::<ReplicaSet>();
    rs_api.create(&PostParams::default(), &replicaset("rs", 3)).await.unwrap();
    wait_for("rs of 3", || async { rs_api.get("rs").await.is_ok_and(|rs| rs_settled(&rs, 3)) })
        .await;
    let rs = rs_api.get("rs").await.unwrap();
    let adopted = pods_api.get("orphan").await.unwrap();
    assert_eq!(
        pods::controller_ref(&adopted.metadata).map(|r| r.uid.clone()),
        rs.metadata.uid.clone(),
        "orphan adopted"
    );
    assert_eq!(
        h.pods().await.iter().filter(|p| pods::is_active(p)).count(),
        3,
        "adopted pod counts: only 2 created"
    );

    // One owned pod turns not ready; an unscheduled orphan appears (the stand-in leaves it).
    let victim = h.pods().await.into_iter().find(|p| p.name_any() != "orphan").unwrap().name_any();
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods_api
        .patch_status(&victim, &PatchParams::default(), &Patch::Merge(&not_ready))
        .await
        .unwrap();
    let pending: Pod = serde_json::from_value(json!({
        "metadata": {"name": "unscheduled", "labels": {"app": "rs"}, "annotations": {"test.skiff/kubelet": "ignore"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    pods_api.create(&PostParams::default(), &pending).await.unwrap();
    // Adopted, then one too many: the unscheduled pod goes first.
    wait_for("unscheduled pod deleted", || async { pods_api.get("unscheduled").await.is_err() })
        .await;
    // Scale to 2: the not-ready pod goes next, the ready ones stay.
    let scale = json!({"spec": {"replicas": 2}});
    rs_api.patch("rs", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    wait_for("not-ready pod deleted", || async { pods_api.get(&victim).await.is_err() }).await;
    wait_for("rs of 2", || async {
        rs_api.get("rs").await.is_ok_and(|rs| rs.status.as_ref().is_some_and(|s| s.replicas == 2))
    })
    .await;
    assert!(pods_api.get("orphan").await.is_ok(), "ready pods kept");

    // Relabelled pod: released, and replaced.
    let relabel = json!({"metadata": {"labels": {"app": "other"}}});
    pods_api.patch("orphan", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    wait_for("released", || async {
        pods_api.get("orphan").await.is_ok_and(|p| pods::controller_ref(&p.metadata).is_none())
    })
    .await;
    wait_for("replacement", || async { rs_api.get("rs").await.is_ok_and(|rs| rs_settled(&rs, 2)) })
        .await;
    let owned = h
        .pods()
        .await
        .into_iter()
        .filter(|p| p.labels().get("app").map(String::as_str) == Some("rs"))
        .filter(pods::is_active)
        .count();
    assert_eq!(owned, 2);
}

async fn add_tainted_node(client: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("node json");
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

fn ds_settled(ds: &DaemonSet, n: i32) -> bool {
    ds.status.as_ref().is_some_and(|s| {
        s.desired_number_scheduled == n
            && s.current_number_scheduled == n
            && s.number_ready == n
            && s.number_available.unwrap_or(0) == n
            && s.updated_number_scheduled.unwrap_or(0) == n
            && s.observed_generation == ds.metadata.generation
    })
}

/// The DaemonSet "agent": app=agent pods running image agent:1.
fn agent_daemonset() -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "agent:1"}]},
            },
        },
    }))
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn daemonset_covers_new_nodes_and_rolls() {
    let h = Harness::start(&["n1", "n2"]).await;
    let ds = agent_daemonset();
    let api = h.api::<DaemonSet>();
    api.create(&PostParams::default(), &ds).await.unwrap();
    wait_for("daemonset on 2 nodes", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 2))
    })
    .await;
    add_node(&h.client, "n3", &[]).await;
    add_tainted_node(&h.client, "gpu1").await;
    wait_for("daemonset on 3 nodes", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 3))
    })
    .await;
    let nodes_of = |pods: Vec<Pod>| {
        let mut v: Vec<String> = pods
            .into_iter()
            .filter(pods::is_active)
            .filter_map(|p| p.spec.and_then(|s| s.node_name))
            .collect();
        v.sort();
        v
    };
    assert_eq!(nodes_of(h.pods().await), ["n1", "n2", "n3"], "one pod per untainted node");
    let pod = h.pods().await.into_iter().next().unwrap();
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
    assert!(tolerations.iter().any(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable")));

    // Rolling update with maxUnavailable 1: never fewer than 2 ready daemons.
    let (min_ready, _w) = watch_min_ready(h.client.clone(), "agent");
    wait_for("watcher primed", || async { *min_ready.lock().unwrap() != usize::MAX }).await;
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:2"}]}}}});
    api.patch("agent", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    wait_for("daemonset rolled", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 3))
            && h.pods()
                .await
                .iter()
                .filter(|p| pods::is_active(p))
                .all(|p| image_of(p) == "agent:2")
    })
    .await;
    assert_eq!(nodes_of(h.pods().await), ["n1", "n2", "n3"]);
    let min = *min_ready.lock().unwrap();
    assert!(min >= 2, "ready daemons fell to {min}");
}

/// maxSurge 1, maxUnavailable 0: each node's new daemon starts beside the old one, so a
/// ready daemon never leaves any node during the roll (without surge, one node at a time
/// would be without one).
#[tokio::test(start_paused = true)]
async fn daemonset_rolls_with_surge_and_no_node_goes_without() {
    let h = Harness::start(&["n1", "n2", "n3"]).await;
    let mut ds = agent_daemonset();
    ds.spec.as_mut().unwrap().update_strategy = Some(
        serde_json::from_value(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
        )
        .unwrap(),
    );
    let api = h.api::<DaemonSet>();
    api.create(&PostParams::default(), &ds).await.unwrap();
    wait_for("daemonset on 3 nodes", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 3))
    })
    .await;
    let (min_ready, _w) = watch_min_ready(h.client.clone(), "agent");
    wait_for("watcher primed", || async { *min_ready.lock().unwrap() != usize::MAX }).await;
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:2"}]}}}});
    api.patch("agent", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    let most_active = std::cell::Cell::new(0);
    wait_for("daemonset rolled", || async {
        let active: Vec<Pod> = h.pods().await.into_iter().filter(pods::is_active).collect();
        most_active.set(most_active.get().max(active.len()));
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 3))
            && active.len() == 3
            && active.iter().all(|p| image_of(p) == "agent:2")
    })
    .await;
    let min = *min_ready.lock().unwrap();
    assert!(min >= 3, "ready daemons fell to {min} with maxUnavailable 0");
    let most = most_active.get();
    assert!(most <= 4, "{most} pods at once: more than one surging");
}

fn job(name: &str, completions: i32, parallelism: i32, backoff: i32, outcome: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "backoffLimit": backoff,
            "template": {
                "metadata": {"labels": {"test.skiff/outcome": outcome}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }))
    .expect("job json")
}

fn job_condition(j: &Job, type_: &str) -> Option<String> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")?
        .reason
        .clone()
}

/// Counts the most pods of a job that were active at once.
fn watch_max_active(client: Client, job: &str) -> (Arc<Mutex<usize>>, AbortOnDrop) {
    let max = Arc::new(Mutex::new(0));
    let m = max.clone();
    let api: Api<Pod> = Api::namespaced(client, "default");
    let cfg = watcher::Config::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    let task = tokio::spawn(async move {
        let mut state: HashMap<String, bool> = HashMap::new();
        let mut stream = std::pin::pin!(watcher(api, cfg));
        while let Ok(Some(ev)) = stream.try_next().await {
            match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    state.insert(p.name_any(), pods::is_active(&p));
                }
                watcher::Event::Delete(p) => {
                    state.remove(&p.name_any());
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
            let active = state.values().filter(|a| **a).count();
            let mut g = m.lock().unwrap();
            *g = (*g).max(active);
        }
    });
    (max, AbortOnDrop(task))
}

#[tokio::test(start_paused = true)]
async fn job_completes_with_completions_and_parallelism() {
    let h = Harness::start(&["n1", "n2"]).await;
    let (max_active, _w) = watch_max_active(h.client.clone(), "ok");
    let api = h.api::<Job>();
    api.create(&PostParams::default(), &job("ok", 3, 2, 6, "succeed")).await.unwrap();
    wait_for("job complete", || async {
        api.get("ok").await.is_ok_and(|j| job_condition(&j, "Complete").is_some())
    })
    .await;
    let j = api.get("ok").await.unwrap();
    let s = j.status.clone().unwrap();
    assert_eq!((s.succeeded, s.failed, s.active), (Some(3), None, None), "zeros are omitted");
    assert!(s.start_time.is_some() && s.completion_time.is_some());
    assert_eq!(job_condition(&j, "SuccessCriteriaMet").as_deref(), Some("CompletionsReached"));
    assert_eq!(job_condition(&j, "Complete").as_deref(), Some("CompletionsReached"));
    let pods = h.pods().await;
    assert_eq!(pods.len(), 3, "exactly completions pods were created");
    assert!(pods.iter().all(|p| p.labels().contains_key("batch.kubernetes.io/controller-uid")));
    assert!(*max_active.lock().unwrap() <= 2, "parallelism respected");
}

#[tokio::test(start_paused = true)]
async fn job_fails_after_backoff_limit_and_deadline() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    // When each pod of the job first shows up (tokio's paused clock).
    let seen: Arc<Mutex<Vec<(String, tokio::time::Instant)>>> = Arc::default();
    let record = seen.clone();
    let pods_api = h.api::<Pod>();
    let _w = AbortOnDrop(tokio::spawn(async move {
        let cfg = watcher::Config::default().labels("batch.kubernetes.io/job-name=bad");
        let mut stream = std::pin::pin!(watcher(pods_api, cfg).applied_objects());
        while let Ok(Some(p)) = stream.try_next().await {
            let mut g = record.lock().unwrap();
            if !g.iter().any(|(n, _)| *n == p.name_any()) {
                g.push((p.name_any(), tokio::time::Instant::now()));
            }
        }
    }));
    api.create(&PostParams::default(), &job("bad", 1, 1, 2, "fail")).await.unwrap();
    wait_for("job failed", || async {
        api.get("bad").await.is_ok_and(|j| job_condition(&j, "Failed").is_some())
    })
    .await;
    // Replacements wait out the backoff: 10 s after the first failure, 20 s after the second
    // (less up to a second: finish times are whole seconds).
    let times: Vec<tokio::time::Instant> = seen.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(times.len(), 3);
    let gaps = [times[1] - times[0], times[2] - times[1]];
    assert!(gaps[0] >= Duration::from_secs(9) && gaps[0] < Duration::from_secs(12), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_secs(19) && gaps[1] < Duration::from_secs(22), "{gaps:?}");
    let j = api.get("bad").await.unwrap();
    assert_eq!(job_condition(&j, "FailureTarget").as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(job_condition(&j, "Failed").as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(
        j.status.as_ref().and_then(|s| s.failed),
        Some(3),
        "backoffLimit 2: the third failure fails it"
    );
    assert!(j.status.as_ref().unwrap().completion_time.is_none());
    assert_eq!(h.pods().await.len(), 3, "restartPolicy Never: a new pod per failure");

    // activeDeadlineSeconds: pods that never finish (the stand-in ignores them).
    let mut slow = job("slow", 1, 1, 6, "run");
    slow.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
    slow.spec.as_mut().unwrap().ttl_seconds_after_finished = Some(1);
    slow.spec.as_mut().unwrap().template.metadata.as_mut().unwrap().annotations =
        Some([("test.skiff/kubelet".to_string(), "ignore".to_string())].into());
    api.create(&PostParams::default(), &slow).await.unwrap();
    wait_for("deadline exceeded", || async {
        api.get("slow")
            .await
            .is_ok_and(|j| job_condition(&j, "Failed").as_deref() == Some("DeadlineExceeded"))
    })
    .await;
    let pods = h.pods().await;
    assert!(
        !pods.iter().any(|p| p.labels().get("batch.kubernetes.io/job-name").map(String::as_str)
            == Some("slow")
            && pods::is_active(p)),
        "active pods of a failed job are deleted"
    );
    // ttlSecondsAfterFinished: the finished job is deleted (foreground, as upstream).
    wait_for("job deleted after ttl", || async {
        api.get("slow").await.map_or(true, |j| j.metadata.deletion_timestamp.is_some())
    })
    .await;
}

#[derive(Default)]
struct StsLog {
    created: Vec<String>,
    terminating: Vec<String>,
    /// Pods created while a lower ordinal was not Running and Ready.
    early: Vec<String>,
}

/// Records creation and termination order of the pods of a StatefulSet.
fn watch_sts(client: Client, app: &str) -> (Arc<Mutex<StsLog>>, AbortOnDrop) {
    let log = Arc::new(Mutex::new(StsLog::default()));
    let l = log.clone();
    let api: Api<Pod> = Api::namespaced(client, "default");
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let app = app.to_string();
    let task = tokio::spawn(async move {
        let mut ready: BTreeMap<i32, bool> = BTreeMap::new();
        let mut stream = std::pin::pin!(watcher(api, cfg).applied_objects());
        while let Ok(Some(p)) = stream.try_next().await {
            let Some(o) = super::statefulset::ordinal(&app, &p.name_any()) else { continue };
            let mut g = l.lock().unwrap();
            if !g.created.contains(&p.name_any()) && !pods::is_terminating(&p) {
                if (0..o).any(|lower| ready.get(&lower) != Some(&true)) {
                    g.early.push(p.name_any());
                }
                g.created.push(p.name_any());
            }
            if pods::is_terminating(&p) && !g.terminating.contains(&p.name_any()) {
                g.terminating.push(p.name_any());
            }
            ready.insert(
                o,
                pods::phase(&p) == "Running" && pods::is_ready(&p) && !pods::is_terminating(&p),
            );
        }
    });
    (log, AbortOnDrop(task))
}

fn sts_settled(s: &StatefulSet, n: i32) -> bool {
    s.status.as_ref().is_some_and(|st| {
        st.replicas == n
            && st.ready_replicas.unwrap_or(0) == n
            && st.updated_replicas.unwrap_or(0) == n
            && st.current_revision == st.update_revision
            && st.observed_generation == s.metadata.generation
    })
}

#[tokio::test(start_paused = true)]
async fn statefulset_orders_creation_scale_down_and_update() {
    let h = Harness::start(&["n1", "n2"]).await;
    let (log, _w) = watch_sts(h.client.clone(), "db");
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "db:1"}]},
            },
        },
    }))
    .unwrap();
    let api = h.api::<StatefulSet>();
    api.create(&PostParams::default(), &sts).await.unwrap();
    wait_for("3 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 3)) })
        .await;
    {
        let g = log.lock().unwrap();
        assert_eq!(g.created, ["db-0", "db-1", "db-2"]);
        assert!(g.early.is_empty(), "created before the previous ordinal was ready: {:?}", g.early);
    }
    let p = h.api::<Pod>().get("db-1").await.unwrap();
    assert_eq!(p.spec.as_ref().unwrap().hostname.as_deref(), Some("db-1"));
    assert_eq!(p.spec.as_ref().unwrap().subdomain.as_deref(), Some("db"));
    assert_eq!(
        p.labels().get("statefulset.kubernetes.io/pod-name").map(String::as_str),
        Some("db-1")
    );
    assert!(p.labels().get("controller-revision-hash").is_some_and(|h| h.starts_with("db-")));

    // Rolling update: 2, 1, 0.
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "db:2"}]}}}});
    api.patch("db", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    wait_for("updated", || async {
        api.get("db").await.is_ok_and(|s| sts_settled(&s, 3))
            && h.pods().await.iter().filter(|p| pods::is_active(p)).all(|p| image_of(p) == "db:2")
    })
    .await;
    assert_eq!(log.lock().unwrap().terminating, ["db-2", "db-1", "db-0"], "reverse ordinal update");

    // Scale down to 1: 2 goes first, then 1.
    log.lock().unwrap().terminating.clear();
    let scale = json!({"spec": {"replicas": 1}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    wait_for("1 member", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 1)) }).await;
    wait_for("pods gone", || async { h.pods().await.len() == 1 }).await;
    assert_eq!(log.lock().unwrap().terminating, ["db-2", "db-1"]);
    assert_eq!(h.pods().await[0].name_any(), "db-0");
}

#[tokio::test(start_paused = true)]
async fn history_limit_events_and_progress_deadline() {
    let h = Harness::start(&["n1"]).await;
    let mut d = deployment("web", 1, "v:1");
    d.spec.as_mut().unwrap().revision_history_limit = Some(1);
    h.api::<Deployment>().create(&PostParams::default(), &d).await.unwrap();
    wait_deploy_done(&h, "web", 1).await;
    for image in ["v:2", "v:3"] {
        set_image(&h, "web", image).await;
        wait_deploy_done(&h, "web", 1).await;
    }
    let rss = h.api::<ReplicaSet>();
    wait_for("old replicasets beyond the history limit deleted", || async {
        rss.list(&ListParams::default()).await.is_ok_and(|l| l.items.len() == 2)
    })
    .await;
    let revisions: std::collections::BTreeSet<String> = rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|rs| rs.annotations().get(super::deployment::REVISION).cloned())
        .collect();
    assert_eq!(revisions, ["2".to_string(), "3".to_string()].into(), "revision 1 cleaned up");
    let events = h
        .api::<k8s_openapi::api::core::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("ScalingReplicaSet")
            && e.message.as_deref().is_some_and(|m| m.starts_with("Scaled up replica set web-"))),
        "ScalingReplicaSet events recorded"
    );

    // Pods that never become ready: the rollout times out after progressDeadlineSeconds.
    let mut stuck = deployment("stuck", 1, "v:1");
    let spec = stuck.spec.as_mut().unwrap();
    spec.progress_deadline_seconds = Some(1);
    spec.template.metadata.as_mut().unwrap().annotations =
        Some([("test.skiff/kubelet".to_string(), "ignore".to_string())].into());
    let api = h.api::<Deployment>();
    api.create(&PostParams::default(), &stuck).await.unwrap();
    wait_for("ProgressDeadlineExceeded", || async {
        api.get("stuck").await.is_ok_and(|d| {
            d.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "Progressing"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
                })
            })
        })
    })
    .await;
    let d = api.get("stuck").await.unwrap();
    let available = d
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Available")
        .cloned();
    // 1 replica, maxUnavailable 1: minimum availability is 0, so Available stays True.
    assert_eq!(available.map(|c| c.status).as_deref(), Some("True"));
    assert_eq!(d.status.as_ref().unwrap().unavailable_replicas, Some(1));
}

/// A rollout whose pods never become ready holds the old ReplicaSet (maxUnavailable 0) while
/// the surge pod is created: `unavailableReplicas` counts every pod the ReplicaSets want
/// (2 old + 1 surge), as upstream's `calculateStatus` does, not the Deployment's 2.
#[tokio::test(start_paused = true)]
async fn unavailable_replicas_count_the_surge() {
    let h = Harness::start(&["n1"]).await;
    let mut d = deployment("held", 2, "v:1");
    let spec = d.spec.as_mut().unwrap();
    spec.strategy = serde_json::from_value(
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    )
    .unwrap();
    spec.template.metadata.as_mut().unwrap().annotations =
        Some([("test.skiff/kubelet".to_string(), "ignore".to_string())].into());
    let api = h.api::<Deployment>();
    api.create(&PostParams::default(), &d).await.unwrap();
    set_image(&h, "held", "v:2").await;
    wait_for("the surge ReplicaSet and the held old one", || async {
        api.get("held").await.is_ok_and(|d| {
            let s = d.status.unwrap_or_default();
            s.observed_generation == d.metadata.generation
                && s.updated_replicas == Some(1)
                && s.replicas == Some(3)
        })
    })
    .await;
    let s = api.get("held").await.unwrap().status.unwrap();
    assert_eq!(s.available_replicas, None);
    assert_eq!(s.unavailable_replicas, Some(3));
}

/// A ReplicaSet created while the surge is used up starts at 0 replicas. As upstream's
/// `getNewReplicaSet`, that records no "Scaled up ... from 0 to 0" event; the first scale-up
/// event comes when the ReplicaSet grows.
#[tokio::test(start_paused = true)]
async fn a_replicaset_created_empty_records_no_scale_up() {
    let h = Harness::start(&["n1"]).await;
    let mut d = deployment("held", 2, "v:1");
    let spec = d.spec.as_mut().unwrap();
    spec.strategy = serde_json::from_value(
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    )
    .unwrap();
    spec.template.metadata.as_mut().unwrap().annotations =
        Some([("test.skiff/kubelet".to_string(), "ignore".to_string())].into());
    let api = h.api::<Deployment>();
    api.create(&PostParams::default(), &d).await.unwrap();
    let settled = |replicas: i32| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                api.get("held").await.is_ok_and(|d| {
                    let s = d.status.unwrap_or_default();
                    s.observed_generation == d.metadata.generation
                        && s.updated_replicas == Some(1)
                        && s.replicas == Some(replicas)
                })
            }
        }
    };
    set_image(&h, "held", "v:2").await;
    wait_for("v:1 held at 2 and the v:2 surge pod", settled(3)).await;
    // Old 2 + surge 1 is the most allowed: the v:3 ReplicaSet is created with 0 replicas,
    // the unready v:2 pod is scaled away, and then v:3 grows to 1.
    set_image(&h, "held", "v:3").await;
    wait_for("v:3 at 1 replica", settled(3)).await;
    let v3 = h
        .api::<ReplicaSet>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|rs| {
            let template = rs.spec.as_ref().and_then(|s| s.template.as_ref());
            let spec = template.and_then(|t| t.spec.as_ref());
            spec.and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref()) == Some("v:3")
        })
        .expect("the v:3 ReplicaSet");
    let v3 = v3.metadata.name.unwrap();
    let events = h.api::<k8s_openapi::api::core::v1::Event>();
    let messages = || async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        list.into_iter()
            .filter(|e| e.reason.as_deref() == Some("ScalingReplicaSet"))
            .filter_map(|e| e.message)
            .collect::<Vec<_>>()
    };
    let grew = format!("Scaled up replica set {v3} from 0 to 1");
    wait_for("the v:3 scale-up event", || async { messages().await.contains(&grew) }).await;
    let messages = messages().await;
    assert!(!messages.iter().any(|m| m.ends_with("from 0 to 0")), "{messages:?}");
}

/// The owner's ControllerRevisions as (revision, image of the template it restores),
/// oldest first.
async fn revisions_of(h: &Harness, owner: &str) -> Vec<(i64, String)> {
    use k8s_openapi::api::apps::v1::ControllerRevision;
    let mut revisions: Vec<(i64, String)> = h
        .api::<ControllerRevision>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|r| pods::controller_ref(&r.metadata).is_some_and(|o| o.name == owner))
        .map(|r| {
            let template = super::history::template_of(&r).expect("data restores a template");
            let image = template.spec.and_then(|s| s.containers.first()?.image.clone());
            (r.revision, image.unwrap_or_default())
        })
        .collect();
    revisions.sort();
    revisions
}

/// A DaemonSet records each template as a ControllerRevision (what `kubectl rollout
/// history` lists and `rollout undo` applies): a new template is the next revision, going
/// back renumbers the old one as the newest, and revisionHistoryLimit drops unused ones.
#[tokio::test(start_paused = true)]
async fn daemonset_templates_are_controller_revisions() {
    use k8s_openapi::api::apps::v1::ControllerRevision;
    let h = Harness::start(&["n1"]).await;
    let mut ds = agent_daemonset();
    ds.metadata.annotations = Some([("kubernetes.io/change-cause".into(), "first".into())].into());
    let api = h.api::<DaemonSet>();
    api.create(&PostParams::default(), &ds).await.unwrap();
    wait_for("daemonset on 1 node", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 1))
    })
    .await;
    let set_image = |image: &str| {
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
        let api = api.clone();
        async move {
            api.patch("agent", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap()
        }
    };
    let rolled = |image: &'static str| {
        let api = api.clone();
        let h = &h;
        move || {
            let api = api.clone();
            async move {
                api.get("agent").await.is_ok_and(|d| ds_settled(&d, 1))
                    && h.pods()
                        .await
                        .iter()
                        .filter(|p| pods::is_active(p))
                        .all(|p| image_of(p) == image)
            }
        }
    };
    set_image("agent:2").await;
    wait_for("rolled to agent:2", rolled("agent:2")).await;
    assert_eq!(revisions_of(&h, "agent").await, [(1, "agent:1".into()), (2, "agent:2".into())]);
    // The revision is named after the hash its pods carry and labelled for the selector.
    let pod = h.pods().await.into_iter().find(pods::is_active).unwrap();
    let hash = pod.labels()["controller-revision-hash"].clone();
    let current = h.api::<ControllerRevision>().get(&format!("agent-{hash}")).await.unwrap();
    assert_eq!(current.revision, 2);
    assert_eq!(current.labels().get("app").map(String::as_str), Some("agent"));
    assert_eq!(current.labels().get("controller-revision-hash"), Some(&hash));
    assert_eq!(
        current.annotations().get("kubernetes.io/change-cause").map(String::as_str),
        Some("first")
    );

    // Back to agent:1 (what `rollout undo` does): its revision becomes 3, nothing new.
    set_image("agent:1").await;
    wait_for("rolled back to agent:1", rolled("agent:1")).await;
    assert_eq!(revisions_of(&h, "agent").await, [(2, "agent:2".into()), (3, "agent:1".into())]);

    // A limit of 0 keeps only what pods use.
    let patch = json!({"spec": {"revisionHistoryLimit": 0}});
    api.patch("agent", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("unused revisions dropped", || async {
        revisions_of(&h, "agent").await == [(3, "agent:1".to_string())]
    })
    .await;
}

/// Pods of a StatefulSet below the partition are recreated from the current revision's
/// template, not the update's (upstream's `newVersionedStatefulSetPod`).
#[tokio::test(start_paused = true)]
async fn statefulset_pods_below_the_partition_keep_the_current_revision() {
    let h = Harness::start(&["n1"]).await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "db:1"}]},
            },
        },
    }))
    .unwrap();
    let api = h.api::<StatefulSet>();
    api.create(&PostParams::default(), &sts).await.unwrap();
    wait_for("2 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 2)) })
        .await;
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "db:2"}]}}}});
    api.patch("db", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    let pods_api = h.api::<Pod>();
    let image = |name: &'static str| {
        let pods_api = pods_api.clone();
        async move {
            pods_api
                .get(name)
                .await
                .ok()
                .filter(|p| pods::is_active(p) && pods::is_ready(p))
                .map(|p| image_of(&p))
        }
    };
    wait_for("db-1 updated", || async { image("db-1").await.as_deref() == Some("db:2") }).await;
    assert_eq!(image("db-0").await.as_deref(), Some("db:1"), "below the partition");
    let status = api.get("db").await.unwrap().status.unwrap();
    assert_ne!(status.current_revision, status.update_revision);
    assert_eq!(revisions_of(&h, "db").await, [(1, "db:1".into()), (2, "db:2".into())]);

    // db-0 lost: it comes back on the current revision.
    let old_uid = pods_api.get("db-0").await.unwrap().metadata.uid;
    pods_api.delete("db-0", &DeleteParams::default()).await.unwrap();
    wait_for("db-0 recreated", || async {
        pods_api
            .get("db-0")
            .await
            .is_ok_and(|p| p.metadata.uid != old_uid && pods::is_active(&p) && pods::is_ready(&p))
    })
    .await;
    let db0 = pods_api.get("db-0").await.unwrap();
    assert_eq!(image_of(&db0), "db:1");
    assert_eq!(
        db0.labels().get("controller-revision-hash"),
        status.current_revision.as_ref(),
        "labelled with the current revision"
    );
}

/// An Indexed Job runs one pod per index (at most `parallelism` at once), each carrying its
/// index (annotation, label, hostname, JOB_COMPLETION_INDEX), and completes when every index
/// has succeeded, listing them in `completedIndexes`.
#[tokio::test(start_paused = true)]
async fn indexed_job_runs_each_index_once() {
    let h = Harness::start(&["n1"]).await;
    let mut j = job("ix", 4, 2, 0, "succeed");
    j.spec.as_mut().unwrap().completion_mode = Some("Indexed".into());
    let (max_active, _w) = watch_max_active(h.client.clone(), "ix");
    let api = h.api::<Job>();
    api.create(&PostParams::default(), &j).await.unwrap();
    wait_for("Complete", || async {
        api.get("ix").await.is_ok_and(|j| job_condition(&j, "Complete").is_some())
    })
    .await;
    let status = api.get("ix").await.unwrap().status.unwrap();
    assert_eq!(status.succeeded, Some(4));
    assert_eq!(status.completed_indexes.as_deref(), Some("0-3"));
    assert!(*max_active.lock().unwrap() <= 2, "parallelism 2");
    let mut indexes: Vec<i32> = Vec::new();
    for p in h.pods().await {
        let i = super::job::indexed::index_of(&p).expect("an index annotation");
        assert!(p.name_any().starts_with(&format!("ix-{i}-")), "{}", p.name_any());
        assert_eq!(
            p.labels().get("batch.kubernetes.io/job-completion-index"),
            Some(&i.to_string())
        );
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname, Some(format!("ix-{i}")));
        let env = spec.containers[0].env.clone().unwrap_or_default();
        assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"), "{env:?}");
        indexes.push(i);
    }
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2, 3], "each index ran once");
}

/// A DaemonSet re-created after an orphaning delete adopts the orphaned revision of its
/// template (upstream's `ClaimControllerRevisions`) instead of failing on its name.
#[tokio::test(start_paused = true)]
async fn a_recreated_daemonset_adopts_its_orphaned_revision() {
    use k8s_openapi::api::apps::v1::ControllerRevision;
    let h = Harness::start(&["n1"]).await;
    let ds = agent_daemonset();
    let api = h.api::<DaemonSet>();
    api.create(&PostParams::default(), &ds).await.unwrap();
    wait_for("daemonset on 1 node", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 1))
    })
    .await;
    let revisions = h.api::<ControllerRevision>();
    let name = revisions.list(&ListParams::default()).await.unwrap().items[0].name_any();
    // What `delete --cascade=orphan` leaves: the revision without its owner.
    api.delete("agent", &DeleteParams::default()).await.unwrap();
    let orphan = json!({"metadata": {"ownerReferences": null}});
    revisions.patch(&name, &PatchParams::default(), &Patch::Merge(&orphan)).await.unwrap();

    let created = api.create(&PostParams::default(), &ds).await.unwrap();
    wait_for("the revision adopted", || async {
        revisions.get(&name).await.is_ok_and(|r| {
            pods::controller_ref(&r.metadata).map(|o| o.uid.clone()) == created.metadata.uid
        })
    })
    .await;
    wait_for("the new daemonset settled", || async {
        api.get("agent").await.is_ok_and(|d| ds_settled(&d, 1))
    })
    .await;
    assert_eq!(revisions_of(&h, "agent").await, [(1, "agent:1".to_string())]);
}

fn pdb_status(pdb: &PodDisruptionBudget) -> (i32, i32, i32, i32, Option<String>) {
    let s = pdb.status.clone().unwrap_or_default();
    let cond = s.conditions.iter().flatten().find(|c| c.type_ == "DisruptionAllowed");
    (
        s.expected_pods,
        s.current_healthy,
        s.desired_healthy,
        s.disruptions_allowed,
        cond.map(|c| format!("{}/{}", c.status, c.reason)),
    )
}

async fn wait_pdb(h: &Harness, name: &str, want: (i32, i32, i32, i32, &str)) {
    let api = h.api::<PodDisruptionBudget>();
    let want = (want.0, want.1, want.2, want.3, Some(want.4.to_string()));
    wait_for(&format!("poddisruptionbudget {name} at {want:?}"), || async {
        api.get(name).await.is_ok_and(|p| {
            p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
                && pdb_status(&p) == want
        })
    })
    .await;
}

async fn ready_pods_of(h: &Harness, app: &str) -> Vec<String> {
    let mut names: Vec<String> = h
        .pods()
        .await
        .into_iter()
        .filter(|p| p.labels().get("app").map(String::as_str) == Some(app))
        .filter(|p| !pods::is_terminating(p) && pods::is_ready(p))
        .map(|p| p.name_any())
        .collect();
    names.sort();
    names
}

#[tokio::test(start_paused = true)]
async fn disruption_budgets_count_healthy_pods_and_evictions_charge_them() {
    let h = Harness::start(&["n1", "n2"]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _disruption = AbortOnDrop(tokio::spawn(super::disruption::run(ctx)));
    h.api::<Deployment>()
        .create(&PostParams::default(), &deployment("web", 3, "web:1"))
        .await
        .expect("create deployment");
    wait_deploy_done(&h, "web", 3).await;
    let pdbs = h.api::<PodDisruptionBudget>();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .expect("pdb json");
    pdbs.create(&PostParams::default(), &pdb).await.expect("create pdb");
    wait_pdb(&h, "web", (3, 3, 2, 1, "True/SufficientPods")).await;

    // One eviction is allowed; it charges the budget before the pod goes, so a second one
    // at once is refused with a 429 naming the budget.
    let pods_api = h.api::<Pod>();
    let ready = ready_pods_of(&h, "web").await;
    let dry = EvictParams {
        post_options: PostParams { dry_run: true, ..Default::default() },
        ..Default::default()
    };
    // A dry run in the query or only in the Eviction's deleteOptions (kubectl drain
    // --dry-run=server) charges and deletes nothing.
    // (kube-rs names the body's field `delete_options`: the body is written here.)
    let body = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": ready[0]}, "deleteOptions": {"dryRun": ["All"]},
    });
    for in_body in [false, true] {
        if in_body {
            let req = http::Request::post(format!(
                "/api/v1/namespaces/default/pods/{}/eviction",
                ready[0]
            ))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("body"))
            .expect("request");
            let _: serde_json::Value = h.client.request(req).await.expect("dry-run eviction");
        } else {
            pods_api.evict(&ready[0], &dry).await.expect("dry-run eviction");
        }
        let after_dry = pdbs.get("web").await.expect("pdb");
        assert_eq!(pdb_status(&after_dry).3, 1, "a dry run charges nothing");
        assert!(after_dry.status.and_then(|s| s.disrupted_pods).is_none());
        let pod = pods_api.get(&ready[0]).await.expect("a dry run deletes nothing");
        let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(!conditions.iter().any(|c| c.type_ == "DisruptionTarget"), "nor marks the pod");
    }

    pods_api.evict(&ready[0], &EvictParams::default()).await.expect("first eviction");
    let refused = pods_api.evict(&ready[1], &EvictParams::default()).await;
    match refused {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"), "{s:?}");
            assert_eq!(
                s.message,
                "Cannot evict pod as it would violate the pod's disruption budget."
            );
        }
        other => panic!("second eviction: {other:?}"),
    }
    assert!(pods_api.get(&ready[1]).await.is_ok(), "the refused pod stays");

    // The ReplicaSet replaces the evicted pod; once it is ready the budget allows one again.
    wait_pdb(&h, "web", (3, 3, 2, 1, "True/SufficientPods")).await;
    let charged = pdbs.get("web").await.expect("pdb");
    assert!(
        charged.status.and_then(|s| s.disrupted_pods).is_none(),
        "the evicted pod is gone, so is its entry"
    );
    pods_api.evict(&ready[1], &EvictParams::default()).await.expect("eviction after recovery");

    // A percentage counts the Deployment's scale: 50% of 3 unavailable rounds up to 2.
    let patch = json!({"spec": {"minAvailable": null, "maxUnavailable": "50%"}});
    pdbs.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch pdb");
    wait_pdb(&h, "web", (3, 3, 1, 2, "True/SufficientPods")).await;

    // Pods of a controller without a scale (a DaemonSet) cannot be counted: no disruption.
    h.api::<DaemonSet>()
        .create(&PostParams::default(), &agent_daemonset())
        .await
        .expect("create daemonset");
    let agent: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "agent"}}},
    }))
    .expect("pdb json");
    pdbs.create(&PostParams::default(), &agent).await.expect("create pdb");
    wait_for("agent budget fails safe", || async {
        pdbs.get("agent").await.is_ok_and(|p| {
            let s = p.status.unwrap_or_default();
            let cond =
                s.conditions.iter().flatten().find(|c| c.type_ == "DisruptionAllowed").cloned();
            s.disruptions_allowed == 0
                && cond.is_some_and(|c| {
                    c.reason == "SyncFailed" && c.message.contains("found no controllers")
                })
        })
    })
    .await;
}

fn cronjob(name: &str, policy: &str, outcome: Option<&str>) -> CronJob {
    let labels = outcome.map(|o| json!({"test.skiff/outcome": o}));
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": policy,
            "successfulJobsHistoryLimit": 1,
            "jobTemplate": {
                "metadata": {"labels": {"cron": name}},
                "spec": {"template": {
                    "metadata": {"labels": labels},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
                }},
            },
        },
    }))
    .expect("cronjob json")
}

async fn jobs_of(h: &Harness, cronjob: &str) -> Vec<Job> {
    let lp = ListParams::default().labels(&format!("cron={cronjob}"));
    let mut jobs = h.api::<Job>().list(&lp).await.expect("list jobs").items;
    jobs.retain(|j| j.metadata.deletion_timestamp.is_none());
    jobs.sort_by_key(|j| j.name_any());
    jobs
}

/// Sleeps `minutes` of (paused) time in small steps, so the controllers keep up.
async fn pass_minutes(minutes: u64) {
    for _ in 0..minutes * 12 {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn cronjobs_start_jobs_on_schedule_and_keep_history() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<CronJob>();
    api.create(&PostParams::default(), &cronjob("tick", "Allow", Some("succeed")))
        .await
        .expect("create cronjob");
    wait_for("a first run of tick", || async { !jobs_of(&h, "tick").await.is_empty() }).await;
    let first = jobs_of(&h, "tick").await[0].name_any();
    wait_for("a later completed run of tick replacing the first", || async {
        let jobs = jobs_of(&h, "tick").await;
        let done = api.get("tick").await.is_ok_and(|c| {
            c.status.is_some_and(|s| s.last_successful_time.is_some() && s.active.is_none())
        });
        done && jobs.len() == 1 && jobs[0].name_any() != first
    })
    .await;
    // One minute apart, named after the minute, owned by the CronJob; the older finished
    // run was deleted (successfulJobsHistoryLimit 1).
    let tick = api.get("tick").await.expect("cronjob");
    let jobs = jobs_of(&h, "tick").await;
    assert_eq!(
        jobs.len(),
        1,
        "history limit: {:?}",
        jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    let last = tick.status.and_then(|s| s.last_schedule_time).expect("lastScheduleTime").0;
    assert_eq!(last.as_second() % 60, 0, "scheduled on the minute");
    assert_eq!(jobs[0].name_any(), format!("tick-{}", last.as_second() / 60));
    let annotations = jobs[0].annotations();
    assert_eq!(
        annotations.get("batch.kubernetes.io/cronjob-scheduled-timestamp").map(String::as_str),
        Some(last.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().as_str())
    );
    assert_eq!(pods::controller_ref(&jobs[0].metadata).map(|r| r.kind.as_str()), Some("CronJob"));
    let events = h.api::<k8s_openapi::api::core::v1::Event>();
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("tick"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.contains(&"SuccessfulCreate".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"SawCompletedJob".to_string()), "{reasons:?}");
    assert!(!reasons.contains(&"UnexpectedJob".to_string()), "its own jobs: {reasons:?}");

    // Suspended: no new run.
    let suspend = json!({"spec": {"suspend": true}});
    api.patch("tick", &PatchParams::default(), &Patch::Merge(&suspend)).await.expect("suspend");
    pass_minutes(3).await;
    let after = api.get("tick").await.expect("cronjob");
    assert_eq!(after.status.and_then(|s| s.last_schedule_time).map(|t| t.0), Some(last));

    // Forbid: a run that never ends holds back the next ones.
    api.create(&PostParams::default(), &cronjob("slow", "Forbid", None)).await.expect("create");
    wait_for("a run of slow", || async { jobs_of(&h, "slow").await.len() == 1 }).await;
    pass_minutes(3).await;
    let slow = jobs_of(&h, "slow").await;
    assert_eq!(slow.len(), 1, "Forbid started another run");
    let active = api.get("slow").await.expect("slow").status.and_then(|s| s.active);
    assert_eq!(active.map(|a| a.len()), Some(1));

    // Replace: the next run replaces it.
    let replace = json!({"spec": {"concurrencyPolicy": "Replace"}});
    api.patch("slow", &PatchParams::default(), &Patch::Merge(&replace)).await.expect("replace");
    wait_for("slow's run replaced", || async {
        let jobs = jobs_of(&h, "slow").await;
        jobs.len() == 1 && jobs[0].name_any() != slow[0].name_any()
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn replication_controllers_keep_their_replicas() {
    use k8s_openapi::api::core::v1::ReplicationController;
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<ReplicationController>();
    let rc: ReplicationController = serde_json::from_value(json!({
        "metadata": {"name": "legacy"},
        "spec": {"replicas": 3, "template": {
            "metadata": {"labels": {"app": "legacy"}},
            "spec": {"containers": [{"name": "c", "image": "legacy:1"}]}}}
    }))
    .expect("rc");
    api.create(&PostParams::default(), &rc).await.expect("create rc");
    let ready = |n: i32| {
        let api = api.clone();
        async move {
            api.get("legacy").await.is_ok_and(|rc| {
                rc.status.is_some_and(|s| {
                    s.replicas == n
                        && s.ready_replicas == Some(n)
                        && s.observed_generation == Some(1)
                })
            })
        }
    };
    wait_for("3 ready replicas", || ready(3)).await;
    let owned: Vec<Pod> = h
        .pods()
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            pods::controller_ref(&p.metadata).is_some_and(|r| r.kind == "ReplicationController")
        })
        .collect();
    assert_eq!(owned.len(), 3);
    assert!(owned.iter().all(|p| p.name_any().starts_with("legacy-")));
    // The selector and the labels defaulted to the template's labels.
    let stored = api.get("legacy").await.expect("rc");
    let selector = stored.spec.and_then(|s| s.selector).unwrap_or_default();
    assert_eq!(selector.get("app").map(String::as_str), Some("legacy"));
    let labels = stored.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("app").map(String::as_str), Some("legacy"));
    // A deleted pod is replaced by one the RC owns.
    h.api::<Pod>()
        .delete(&owned[0].name_any(), &DeleteParams::default())
        .await
        .expect("delete a pod");
    wait_for("a replacement pod owned by the RC", || async {
        let pods = h.pods().await;
        let owned_now = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                pods::controller_ref(&p.metadata)
                    .is_some_and(|r| r.kind == "ReplicationController" && r.name == "legacy")
            })
            .count();
        owned_now == 3 && !pods.iter().any(|p| p.name_any() == owned[0].name_any())
    })
    .await;
    // Scaled down through the scale subresource: the status follows.
    let scale = json!({"spec": {"replicas": 1}});
    api.patch_scale("legacy", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale");
    wait_for("1 ready replica", || async {
        api.get("legacy").await.is_ok_and(|rc| {
            rc.status.is_some_and(|s| s.replicas == 1 && s.ready_replicas == Some(1))
        })
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn claims_bind_to_fitting_volumes_and_release_them() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let h = Harness::start(&[]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _binder = AbortOnDrop(tokio::spawn(super::volume::run(ctx.clone())));
    // A deleted claim keeps its protection finalizer until this controller sees no pod uses it.
    let _protection = AbortOnDrop(tokio::spawn(super::volume_protection::run(ctx)));
    let volumes: Api<PersistentVolume> = Api::all(h.client.clone());
    for (name, size, policy) in [("big", "10Gi", "Retain"), ("small", "2Gi", "Delete")] {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": format!("/srv/{name}")},
                     "persistentVolumeReclaimPolicy": policy}
        }))
        .expect("pv");
        volumes.create(&PostParams::default(), &pv).await.expect("create pv");
    }
    let phase_of = |name: &'static str| {
        let volumes = volumes.clone();
        async move {
            volumes
                .get(name)
                .await
                .ok()
                .and_then(|v| v.status)
                .and_then(|s| s.phase)
                .unwrap_or_default()
        }
    };
    wait_for("both volumes Available", || async {
        phase_of("big").await == "Available" && phase_of("small").await == "Available"
    })
    .await;
    let claims = h.api::<PersistentVolumeClaim>();
    let claim = |name: &str, size: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": size}}}
        }))
        .expect("pvc")
    };
    claims.create(&PostParams::default(), &claim("data", "1Gi")).await.expect("create pvc");
    wait_for("data bound", || async {
        claims
            .get("data")
            .await
            .is_ok_and(|c| c.status.and_then(|s| s.phase).as_deref() == Some("Bound"))
    })
    .await;
    // The smallest volume that fits; both halves of the binding recorded.
    let data = claims.get("data").await.expect("pvc");
    assert_eq!(data.spec.as_ref().and_then(|s| s.volume_name.as_deref()), Some("small"));
    let status = data.status.expect("status");
    assert_eq!(
        status.capacity.and_then(|c| c.get("storage").cloned()).map(|q| q.0).as_deref(),
        Some("2Gi")
    );
    assert_eq!(
        data.metadata
            .annotations
            .unwrap_or_default()
            .get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes")
    );
    wait_for("small Bound", || async { phase_of("small").await == "Bound" }).await;
    let small = volumes.get("small").await.expect("pv");
    let r = small.spec.and_then(|s| s.claim_ref).expect("claimRef");
    assert_eq!((r.namespace.as_deref(), r.name.as_deref()), (Some("default"), Some("data")));
    assert_eq!(r.uid, data.metadata.uid);

    // Nothing left that fits: the claim waits, with upstream's event.
    claims.create(&PostParams::default(), &claim("huge", "20Gi")).await.expect("create pvc");
    wait_for("a FailedBinding event", || async {
        h.api::<k8s_openapi::api::core::v1::Event>().list(&ListParams::default()).await.is_ok_and(
            |l| {
                l.items.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some("huge")
                        && e.reason.as_deref() == Some("FailedBinding")
                })
            },
        )
    })
    .await;
    assert_eq!(
        claims.get("huge").await.expect("pvc").status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );

    // A claim without a class gets the default StorageClass.
    let classes: Api<StorageClass> = Api::all(h.client.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "standard",
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "example.com/none"
    }))
    .expect("sc");
    classes.create(&PostParams::default(), &sc).await.expect("create sc");
    let mut classless = claim("classless", "1Gi");
    classless.spec.as_mut().expect("spec").storage_class_name = None;
    claims.create(&PostParams::default(), &classless).await.expect("create pvc");
    wait_for("the default class assigned", || async {
        claims
            .get("classless")
            .await
            .is_ok_and(|c| c.spec.and_then(|s| s.storage_class_name).as_deref() == Some("standard"))
    })
    .await;

    // The claim goes: a Delete volume fails (no plugin here can delete its storage).
    claims.delete("data", &DeleteParams::default()).await.expect("delete pvc");
    wait_for("small Failed", || async { phase_of("small").await == "Failed" }).await;
    let msg = volumes.get("small").await.expect("pv").status.and_then(|s| s.message);
    assert!(msg.is_some_and(|m| m.contains("no deletable volume plugin matched")));
}

#[tokio::test(start_paused = true)]
async fn statefulset_pods_get_their_own_claims() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let h = Harness::start(&["n1"]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _binder = AbortOnDrop(tokio::spawn(super::volume::run(ctx)));
    let volumes: Api<PersistentVolume> = Api::all(h.client.clone());
    for i in 0..2 {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("disk-{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "manual", "hostPath": {"path": format!("/srv/disk-{i}")}}
        }))
        .expect("pv");
        volumes.create(&PostParams::default(), &pv).await.expect("create pv");
    }
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "db:1",
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/db"}]}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "labels": {"tier": "storage"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                         "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .expect("sts");
    let api = h.api::<StatefulSet>();
    api.create(&PostParams::default(), &sts).await.expect("create sts");
    wait_for("2 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 2)) })
        .await;
    let claims = h.api::<PersistentVolumeClaim>();
    for i in 0..2 {
        let name = format!("data-db-{i}");
        let pod = h.api::<Pod>().get(&format!("db-{i}")).await.expect("pod");
        let volume = pod
            .spec
            .and_then(|s| s.volumes)
            .unwrap_or_default()
            .into_iter()
            .find(|v| v.name == "data")
            .expect("the claim template's volume");
        assert_eq!(volume.persistent_volume_claim.map(|c| c.claim_name), Some(name.clone()));
        let claim = claims.get(&name).await.expect("claim");
        let labels = claim.labels();
        assert_eq!(labels.get("app").map(String::as_str), Some("db"), "{labels:?}");
        assert_eq!(labels.get("tier").map(String::as_str), Some("storage"), "{labels:?}");
        wait_for("the claim bound", || async {
            claims
                .get(&name)
                .await
                .is_ok_and(|c| c.status.and_then(|s| s.phase).as_deref() == Some("Bound"))
        })
        .await;
    }
    // Claims outlive their pods and, by default (Retain), the StatefulSet: the garbage
    // collector removes the set's pods and leaves the claims.
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _gc = AbortOnDrop(tokio::spawn(async move {
        let _ = super::garbage_collector::run(ctx).await;
    }));
    api.delete("db", &DeleteParams::default()).await.expect("delete sts");
    wait_for("the StatefulSet and its pods gone", || async {
        api.get_opt("db").await.is_ok_and(|s| s.is_none())
            && h.pods().await.iter().all(|p| !p.name_any().starts_with("db-"))
    })
    .await;
    for i in 0..2 {
        let claim = claims.get_opt(&format!("data-db-{i}")).await.expect("get claim");
        assert!(claim.is_some_and(|c| c.metadata.deletion_timestamp.is_none()));
    }
}

#[tokio::test(start_paused = true)]
async fn claims_and_volumes_in_use_stay_until_released() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let h = Harness::start(&["n1"]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _binder = AbortOnDrop(tokio::spawn(super::volume::run(ctx.clone())));
    let _protection = AbortOnDrop(tokio::spawn(super::volume_protection::run(ctx)));
    let volumes: Api<PersistentVolume> = Api::all(h.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "disk"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/srv/disk"}}
    }))
    .expect("pv");
    let pv = volumes.create(&PostParams::default(), &pv).await.expect("create pv");
    assert_eq!(pv.finalizers(), ["kubernetes.io/pv-protection"]);
    let claims = h.api::<PersistentVolumeClaim>();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("pvc");
    let pvc = claims.create(&PostParams::default(), &pvc).await.expect("create pvc");
    assert_eq!(pvc.finalizers(), ["kubernetes.io/pvc-protection"]);
    let phase = |c: &PersistentVolumeClaim| c.status.as_ref().and_then(|s| s.phase.clone());
    wait_for("data bound", || async {
        claims.get("data").await.is_ok_and(|c| phase(&c).as_deref() == Some("Bound"))
    })
    .await;

    // A finalizer taken off a live claim comes back.
    let strip = json!({"metadata": {"finalizers": null}});
    claims.patch("data", &PatchParams::default(), &Patch::Merge(&strip)).await.expect("patch");
    wait_for("the finalizer restored", || async {
        claims.get("data").await.is_ok_and(|c| c.finalizers() == ["kubernetes.io/pvc-protection"])
    })
    .await;

    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {"containers": [{"name": "c", "image": "i"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))
    .expect("pod");
    h.api::<Pod>().create(&PostParams::default(), &pod).await.expect("create pod");
    wait_for("the pod running on n1", || async {
        h.api::<Pod>().get("user").await.is_ok_and(|p| pods::phase(&p) == "Running")
    })
    .await;

    // In use: deleting the claim and its volume leaves both Terminating, still bound.
    claims.delete("data", &DeleteParams::default()).await.expect("delete pvc");
    volumes.delete("disk", &DeleteParams::default()).await.expect("delete pv");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let held = claims.get("data").await.expect("the claim stays while the pod uses it");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(phase(&held).as_deref(), Some("Bound"));
    let held = volumes.get("disk").await.expect("the volume stays while bound");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.status.and_then(|s| s.phase).as_deref(), Some("Bound"));

    // The pod goes: the claim goes, the volume is released and goes.
    h.api::<Pod>().delete("user", &DeleteParams::default()).await.expect("delete pod");
    wait_for("the claim and the volume gone", || async {
        claims.get_opt("data").await.is_ok_and(|c| c.is_none())
            && volumes.get_opt("disk").await.is_ok_and(|v| v.is_none())
    })
    .await;
}

/// A harness with the pvc-protection controller and the garbage collector, and a
/// StatefulSet `db` of `replicas` with one claim template and `policy` as its claim
/// retention policy (not created yet).
async fn claim_retention_rig(
    replicas: i32,
    policy: serde_json::Value,
) -> (Harness, StatefulSet, [AbortOnDrop; 2]) {
    let h = Harness::start(&["n1"]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let protection = AbortOnDrop(tokio::spawn(super::volume_protection::run(ctx.clone())));
    let gc = AbortOnDrop(tokio::spawn(async move {
        let _ = super::garbage_collector::run(ctx).await;
    }));
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": replicas,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                         "spec": {"containers": [{"name": "c", "image": "db:1"}]}},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            }],
            "persistentVolumeClaimRetentionPolicy": policy,
        },
    }))
    .expect("sts");
    (h, sts, [protection, gc])
}

#[tokio::test(start_paused = true)]
async fn statefulset_claims_of_scaled_down_pods_go_with_them() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let (h, sts, _controllers) = claim_retention_rig(3, json!({"whenScaled": "Delete"})).await;
    let api = h.api::<StatefulSet>();
    api.create(&PostParams::default(), &sts).await.expect("create sts");
    wait_for("3 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 3)) })
        .await;
    let claims = h.api::<PersistentVolumeClaim>();
    let names = || async {
        let mut n: Vec<String> = claims
            .list(&ListParams::default())
            .await
            .expect("list claims")
            .items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.name_any())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names().await, ["data-db-0", "data-db-1", "data-db-2"]);
    // whenDeleted is Retain: no claim is owned by the set or a pod while it is a member.
    for c in claims.list(&ListParams::default()).await.expect("list").items {
        assert!(c.owner_references().is_empty(), "{:?}", c.metadata.owner_references);
    }

    // Scale down to 1: the claims of db-2 and db-1 go with their pods.
    let scale = |n: i32| json!({"spec": {"replicas": n}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&scale(1))).await.expect("scale");
    wait_for("the scaled-down claims gone", || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| l.items.len() == 1)
    })
    .await;
    assert_eq!(names().await, ["data-db-0"]);
    wait_for("1 ready member", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 1)) })
        .await;

    // Back to 2: a fresh claim for db-1, owned by nobody.
    api.patch("db", &PatchParams::default(), &Patch::Merge(&scale(2))).await.expect("scale");
    wait_for("2 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 2)) })
        .await;
    assert_eq!(names().await, ["data-db-0", "data-db-1"]);
    let fresh = claims.get("data-db-1").await.expect("claim");
    assert!(fresh.owner_references().is_empty(), "{:?}", fresh.metadata.owner_references);
}

/// A retention policy changed on a live set applies to the claims it has: whenDeleted:
/// Delete makes the set their owner (and deleting the set deletes them), Retain again
/// frees them.
#[tokio::test(start_paused = true)]
async fn statefulset_retention_policy_changes_apply_to_existing_claims() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let (h, sts, _controllers) = claim_retention_rig(2, json!({"whenDeleted": "Retain"})).await;
    let api = h.api::<StatefulSet>();
    let created = api.create(&PostParams::default(), &sts).await.expect("create sts");
    wait_for("2 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 2)) })
        .await;
    let claims = h.api::<PersistentVolumeClaim>();
    let set_uid = created.metadata.uid.clone().expect("uid");
    let owned_by_set = |c: &PersistentVolumeClaim| {
        c.owner_references().iter().map(|r| r.uid.clone()).collect::<Vec<_>>() == [set_uid.clone()]
    };
    let all_claims = || async {
        let mut l = claims.list(&ListParams::default()).await.expect("claims").items;
        l.sort_by_key(|c| c.name_any());
        l
    };
    let policy = |p: &str| json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": p, "whenScaled": "Retain"}}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&policy("Delete")))
        .await
        .expect("patch");
    wait_for("the set owns both claims", || async {
        let l = all_claims().await;
        l.len() == 2 && l.iter().all(owned_by_set)
    })
    .await;
    api.patch("db", &PatchParams::default(), &Patch::Merge(&policy("Retain")))
        .await
        .expect("patch");
    wait_for("the claims free again", || async {
        all_claims().await.iter().all(|c| c.owner_references().is_empty())
    })
    .await;
    api.patch("db", &PatchParams::default(), &Patch::Merge(&policy("Delete")))
        .await
        .expect("patch");
    wait_for("the set owns both claims again", || async {
        all_claims().await.iter().all(owned_by_set)
    })
    .await;
    api.delete("db", &DeleteParams::default()).await.expect("delete sts");
    wait_for("the claims deleted with the set", || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
}

/// whenScaled: Delete also covers members that were already terminating when a scale-down
/// condemned them, all of them (the ordered scale-down stops at the first): their claims
/// go with them.
#[tokio::test(start_paused = true)]
async fn statefulset_claims_of_terminating_condemned_pods_go_too() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let (h, sts, _controllers) = claim_retention_rig(3, json!({"whenScaled": "Delete"})).await;
    let api = h.api::<StatefulSet>();
    api.create(&PostParams::default(), &sts).await.expect("create sts");
    wait_for("3 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 3)) })
        .await;
    // db-1 and db-2 are deleted, and their (stand-in) kubelet is slow to finish them.
    let pods = h.api::<Pod>();
    let slow = json!({"metadata": {"annotations": {"test.skiff/kubelet": "ignore"}}});
    for p in ["db-1", "db-2"] {
        pods.patch(p, &PatchParams::default(), &Patch::Merge(&slow)).await.expect("annotate");
        pods.delete(p, &DeleteParams::default()).await.expect("delete");
    }
    let scale = json!({"spec": {"replicas": 1}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale");
    let claims = h.api::<PersistentVolumeClaim>();
    for (claim, pod) in [("data-db-1", "db-1"), ("data-db-2", "db-2")] {
        wait_for(&format!("{claim} owned by {pod}"), || async {
            claims.get(claim).await.is_ok_and(|c| {
                c.owner_references().iter().any(|r| r.kind == "Pod" && r.name == pod)
            })
        })
        .await;
    }
    // The kubelet finishes them: the claims follow.
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for p in ["db-1", "db-2"] {
        pods.delete(p, &now).await.expect("finish");
    }
    wait_for("the condemned claims gone", || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| l.items.len() == 1)
    })
    .await;
    assert!(claims.get_opt("data-db-0").await.expect("get").is_some(), "the member's claim stays");
}

/// A local-path volume whose teardown helper never finishes (here it runs for ever): after
/// the helper timeout it is deleted, a VolumeFailedDelete event says why, and the volume
/// stays until a later helper succeeds.
#[tokio::test(start_paused = true)]
async fn local_path_teardown_helpers_time_out() {
    use k8s_openapi::api::core::v1::{Event, PersistentVolume};
    let h = Harness::start(&["n1"]).await;
    let ctx = Context::new(h.client.clone(), ControllerConfig::default());
    let _provisioner =
        AbortOnDrop(tokio::spawn(super::local_path::run(ctx, "/var/lib/skiff/storage".into())));
    let volumes: Api<PersistentVolume> = Api::all(h.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pvc-u1", "annotations": {"pv.kubernetes.io/provisioned-by": "skiff.dev/local-path"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "local-path",
                 "hostPath": {"path": "/var/lib/skiff/storage/pvc-u1_default_data"},
                 "claimRef": {"namespace": "default", "name": "data", "uid": "u1"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}
    }))
    .unwrap();
    volumes.create(&PostParams::default(), &pv).await.expect("create pv");
    let released = json!({"status": {"phase": "Released"}});
    volumes
        .patch_status("pvc-u1", &PatchParams::default(), &Patch::Merge(&released))
        .await
        .expect("released");
    let events: Api<Event> = Api::all(h.client.clone());
    // Most of the helper's 120 s first: wait_for gives up after 120 s itself.
    tokio::time::sleep(Duration::from_secs(100)).await;
    let helpers: Api<Pod> = Api::namespaced(h.client.clone(), "kube-system");
    assert!(helpers.get_opt("helper-pod-delete-pvc-u1").await.expect("get").is_some());
    wait_for("a VolumeFailedDelete event", || async {
        events.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("VolumeFailedDelete")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("did not finish within 120s"))
            })
        })
    })
    .await;
    assert!(volumes.get_opt("pvc-u1").await.expect("get").is_some(), "kept until torn down");
}

#[tokio::test(start_paused = true)]
async fn pod_failure_policy_fails_the_job_or_ignores_the_failure() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    let with_policy = |name: &str, exit_code: &str, rules: serde_json::Value| {
        let mut j = job(name, 1, 1, 6, "fail");
        let t = j.spec.as_mut().unwrap();
        t.template
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert("test.skiff/exit-code".into(), exit_code.into());
        t.pod_failure_policy = Some(serde_json::from_value(json!({"rules": rules})).unwrap());
        j
    };
    // Exit code 42 is fatal at once, whatever the backoff limit.
    let fatal = with_policy(
        "fatal",
        "42",
        json!([{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
               {"action": "FailJob", "onExitCodes": {"containerName": "c", "operator": "In", "values": [1, 42]}}]),
    );
    api.create(&PostParams::default(), &fatal).await.unwrap();
    wait_for("fatal failed", || async {
        api.get("fatal").await.is_ok_and(|j| job_condition(&j, "Failed").is_some())
    })
    .await;
    let j = api.get("fatal").await.unwrap();
    let pods: Vec<Pod> = h
        .pods()
        .await
        .into_iter()
        .filter(|p| {
            p.labels().get("batch.kubernetes.io/job-name").map(String::as_str) == Some("fatal")
        })
        .collect();
    assert_eq!(pods.len(), 1, "no replacement after a FailJob match");
    let failed = j
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Failed")
        .cloned()
        .unwrap();
    assert_eq!(failed.reason.as_deref(), Some("PodFailurePolicy"));
    assert_eq!(
        failed.message.as_deref(),
        Some(format!("Container c for pod default/{} failed with exit code 42 matching FailJob rule at index 1", pods[0].name_any()).as_str())
    );

    // Exit code 137 is ignored: the pod is replaced and the failure is not counted, even
    // with backoffLimit 0.
    let mut flaky = with_policy(
        "flaky",
        "137",
        json!([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
               {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [137]}}]),
    );
    flaky.spec.as_mut().unwrap().backoff_limit = Some(0);
    api.create(&PostParams::default(), &flaky).await.unwrap();
    let flaky_pods = || async {
        h.pods()
            .await
            .into_iter()
            .filter(|p| {
                p.labels().get("batch.kubernetes.io/job-name").map(String::as_str) == Some("flaky")
            })
            .filter(|p| pods::phase(p) == "Failed")
            .count()
    };
    wait_for("three ignored failures", || async { flaky_pods().await >= 3 }).await;
    let j = api.get("flaky").await.unwrap();
    assert_eq!(job_condition(&j, "FailureTarget"), None, "{:?}", j.status);
    assert_eq!(j.status.as_ref().and_then(|s| s.failed), None, "ignored failures are not counted");
}

/// An Indexed Job with `outcome` for the indexes not listed, and these spec fields.
fn indexed_job(
    name: &str,
    completions: i32,
    outcome: &str,
    labels: serde_json::Value,
    spec: serde_json::Value,
) -> Job {
    let mut j = serde_json::to_value(job(name, completions, completions, 6, outcome)).unwrap();
    j["spec"]["completionMode"] = json!("Indexed");
    for (k, v) in labels.as_object().unwrap() {
        j["spec"]["template"]["metadata"]["labels"][k] = v.clone();
    }
    for (k, v) in spec.as_object().unwrap() {
        j["spec"][k] = v.clone();
    }
    serde_json::from_value(j).unwrap()
}

async fn pods_of_job(h: &Harness, job: &str) -> Vec<Pod> {
    h.pods()
        .await
        .into_iter()
        .filter(|p| p.labels().get("batch.kubernetes.io/job-name").map(String::as_str) == Some(job))
        .collect()
}

fn condition_of(j: &Job, type_: &str) -> Option<(String, String)> {
    let c = j
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")?;
    Some((c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// backoffLimitPerIndex: an index failing more often than the limit is failed and not run
/// again while the other indexes go on; once every index finished, the Job fails with
/// `FailedIndexes`. Each pod carries its index's failures so far.
#[tokio::test(start_paused = true)]
async fn backoff_limit_per_index_fails_indexes_not_the_job_at_once() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    let j = indexed_job(
        "per-index",
        4,
        "succeed",
        json!({"test.skiff/fail-indexes": "1.3"}),
        json!({"backoffLimitPerIndex": 1, "backoffLimit": 2147483647}),
    );
    api.create(&PostParams::default(), &j).await.unwrap();
    wait_for("per-index failed", || async {
        api.get("per-index").await.is_ok_and(|j| job_condition(&j, "Failed").is_some())
    })
    .await;
    let j = api.get("per-index").await.unwrap();
    let s = j.status.clone().unwrap();
    assert_eq!(s.failed_indexes.as_deref(), Some("1,3"));
    assert_eq!(s.completed_indexes.as_deref(), Some("0,2"));
    assert_eq!((s.succeeded, s.failed), (Some(2), Some(4)));
    assert_eq!(
        condition_of(&j, "Failed"),
        Some(("FailedIndexes".into(), "Job has failed indexes".into()))
    );
    let mut counts: Vec<(i32, String)> = pods_of_job(&h, "per-index")
        .await
        .iter()
        .map(|p| {
            let i = super::job::indexed::index_of(p).unwrap();
            let n = p.annotations().get("batch.kubernetes.io/job-index-failure-count").cloned();
            (i, n.unwrap_or_default())
        })
        .collect();
    counts.sort();
    let want: Vec<(i32, String)> = [(0, "0"), (1, "0"), (1, "1"), (2, "0"), (3, "0"), (3, "1")]
        .map(|(i, n)| (i, n.to_string()))
        .into();
    assert_eq!(counts, want, "one retry per failing index, carrying its failures");
}

/// With backoffLimitPerIndex the backoff is each index's own: an index that failed holds
/// back only its own retries, not the next index.
#[tokio::test(start_paused = true)]
async fn per_index_backoff_holds_back_only_its_index() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    let j = indexed_job(
        "own-backoff",
        3,
        "succeed",
        json!({"test.skiff/fail-indexes": "0"}),
        json!({"parallelism": 1, "backoffLimitPerIndex": 0, "backoffLimit": 2147483647}),
    );
    let start = tokio::time::Instant::now();
    api.create(&PostParams::default(), &j).await.unwrap();
    wait_for("own-backoff failed", || async {
        api.get("own-backoff").await.is_ok_and(|j| job_condition(&j, "Failed").is_some())
    })
    .await;
    // A Job-wide backoff would have held index 1 for 10 s after index 0 failed.
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    let s = api.get("own-backoff").await.unwrap().status.unwrap();
    assert_eq!(
        (s.failed_indexes.as_deref(), s.completed_indexes.as_deref()),
        (Some("0"), Some("1,2"))
    );
}

/// maxFailedIndexes: one failed index more than allowed fails the Job at once, before the
/// remaining indexes run.
#[tokio::test(start_paused = true)]
async fn max_failed_indexes_fails_the_job() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    let j = indexed_job(
        "max",
        5,
        "succeed",
        json!({"test.skiff/fail-indexes": "0.1"}),
        json!({"parallelism": 1, "backoffLimitPerIndex": 0, "maxFailedIndexes": 1, "backoffLimit": 2147483647}),
    );
    api.create(&PostParams::default(), &j).await.unwrap();
    wait_for("max failed", || async {
        api.get("max").await.is_ok_and(|j| job_condition(&j, "Failed").is_some())
    })
    .await;
    let j = api.get("max").await.unwrap();
    assert_eq!(
        condition_of(&j, "Failed"),
        Some((
            "MaxFailedIndexesExceeded".into(),
            "Job has exceeded the specified maximal number of failed indexes".into()
        ))
    );
    assert_eq!(j.status.unwrap().failed_indexes.as_deref(), Some("0,1"));
    let ran: BTreeSet<i32> =
        pods_of_job(&h, "max").await.iter().filter_map(super::job::indexed::index_of).collect();
    assert_eq!(ran, BTreeSet::from([0, 1]), "no index after the limit was passed");
}

/// successPolicy: the first rule the succeeded indexes satisfy completes the Job; the
/// indexes still running are stopped.
#[tokio::test(start_paused = true)]
async fn success_policy_completes_the_job_early() {
    let h = Harness::start(&["n1"]).await;
    let api = h.api::<Job>();
    // Indexes 0 and 2 succeed; 1 and 3 would run for ever.
    let j = indexed_job(
        "leader",
        4,
        "run",
        json!({"test.skiff/succeed-indexes": "0.2"}),
        json!({"successPolicy": {"rules": [{"succeededIndexes": "1"}, {"succeededIndexes": "0-2", "succeededCount": 2}]}}),
    );
    api.create(&PostParams::default(), &j).await.unwrap();
    wait_for("leader complete", || async {
        api.get("leader").await.is_ok_and(|j| job_condition(&j, "Complete").is_some())
    })
    .await;
    let j = api.get("leader").await.unwrap();
    let matched = Some(("SuccessPolicy".to_string(), "Matched rules at index 1".to_string()));
    assert_eq!(condition_of(&j, "SuccessCriteriaMet"), matched);
    assert_eq!(condition_of(&j, "Complete"), matched);
    let s = j.status.unwrap();
    assert_eq!(s.completed_indexes.as_deref(), Some("0,2"));
    assert!(s.completion_time.is_some());
    assert!(
        pods_of_job(&h, "leader").await.iter().all(|p| !pods::is_active(p)),
        "the indexes still running were stopped"
    );
}

#[tokio::test(start_paused = true)]
async fn statefulset_claims_deleted_with_set_and_on_scale_down() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let policy = json!({"whenScaled": "Delete", "whenDeleted": "Delete"});
    let (h, sts, _controllers) = claim_retention_rig(2, policy).await;
    let api = h.api::<StatefulSet>();
    let created = api.create(&PostParams::default(), &sts).await.expect("create sts");
    wait_for("2 ready members", || async { api.get("db").await.is_ok_and(|s| sts_settled(&s, 2)) })
        .await;
    let claims = h.api::<PersistentVolumeClaim>();
    let scale = json!({"spec": {"replicas": 1}});
    api.patch("db", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale");
    // The scaled-down member's claim goes even though the set also owns claims.
    wait_for("data-db-1 gone", || async {
        claims.get_opt("data-db-1").await.is_ok_and(|c| c.is_none())
    })
    .await;
    let kept = claims.get("data-db-0").await.expect("the member's claim");
    let owners: Vec<_> = kept.owner_references().iter().map(|r| r.uid.clone()).collect();
    assert_eq!(owners, [created.metadata.uid.clone().expect("uid")], "owned by the set alone");
    // The set goes: so does the rest.
    api.delete("db", &DeleteParams::default()).await.expect("delete sts");
    wait_for("every claim gone", || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
}
