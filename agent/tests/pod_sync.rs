//! Pod sync end to end over the in-process apiserver and the in-memory runtime: every state
//! of a pod's life as the API sees it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use skiff_agent::agent::{self, AgentHandle};
use skiff_agent::config::AgentConfig;
use skiff_agent::runtime::memory::{Behavior, MemoryRuntime};
use skiff_agent::runtime::{POD_UID_LABEL, api};
use skiff_apiserver::ApiServer;

const NODE: &str = "node-1";

struct Harness {
    _api: Arc<ApiServer>,
    client: Client,
    rt: MemoryRuntime,
    dir: tempfile::TempDir,
    agent: Option<AgentHandle>,
}

fn config(dir: &std::path::Path) -> AgentConfig {
    let mut c = AgentConfig::new(NODE)
        .with_node_ip("192.0.2.10".parse().expect("ip"))
        .with_root_dir(dir)
        .with_resources(4000, 8 << 30)
        .with_backoff(Duration::from_millis(200), Duration::from_secs(1))
        .with_relist(Duration::from_millis(50));
    c.host_conditions = false;
    c
}

/// The in-memory runtime with the images the pods here use.
fn runtime() -> MemoryRuntime {
    let rt = MemoryRuntime::new();
    rt.add_image("skiff.test/pause:1");
    rt.add_image("busybox:1");
    rt
}

impl Harness {
    async fn new() -> Harness {
        let (api, client) = skiff_agent::testing::apiserver().await;
        let rt = runtime();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = Harness { _api: api, client, rt, dir, agent: None };
        h.start_agent().await;
        h
    }

    async fn start_agent(&mut self) {
        let handle = agent::start(self.client.clone(), config(self.dir.path()), self.rt.clone())
            .await
            .expect("agent starts");
        self.agent = Some(handle);
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: serde_json::Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).expect("pod json");
        self.pods().create(&PostParams::default(), &pod).await.expect("create pod")
    }

    async fn wait_for(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
        let mut last = None;
        for _ in 0..400 {
            if let Some(p) = self.pods().get_opt(name).await.expect("get pod") {
                if f(&p) {
                    return p;
                }
                last = Some(p);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {name}: {what}; last: {:#?}", last.and_then(|p| p.status));
    }
}

fn pod(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut spec = spec;
    spec["nodeName"] = json!(NODE);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn condition(p: &Pod, t: &str) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == t))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn cstatus<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

fn waiting_reason(p: &Pod, name: &str) -> Option<String> {
    cstatus(p, name)?.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

fn by_name(name: &'static str, b: Behavior) -> impl Fn(&api::ContainerConfig) -> Behavior {
    move |cfg: &api::ContainerConfig| {
        if cfg.metadata.as_ref().is_some_and(|m| m.name == name) {
            b.clone()
        } else {
            Behavior::Run
        }
    }
}

#[tokio::test]
async fn node_registers_and_pod_goes_pending_to_running() {
    let h = Harness::new().await;
    let node = Api::<Node>::all(h.client.clone()).get(NODE).await.expect("node");
    let st = node.status.expect("node status");
    let ready = st.conditions.iter().flatten().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.status, "True");
    assert_eq!(st.allocatable.expect("alloc")["cpu"].0, "4");
    let lease = Api::<Lease>::namespaced(h.client.clone(), "kube-node-lease").get(NODE).await;
    assert_eq!(lease.expect("lease").spec.and_then(|s| s.holder_identity).as_deref(), Some(NODE));

    h.create(pod(
        "web",
        json!({"containers": [{"name": "c", "image": "busybox:1",
        "command": ["sh", "-c", "echo $(GREETING)"],
        "env": [{"name": "GREETING", "value": "hi"},
                {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"containerPort": 80}]}]}),
    ))
    .await;
    let p = h
        .wait_for("web", "Running and Ready", |p| {
            phase(p) == "Running" && condition(p, "Ready") == "True"
        })
        .await;
    let st = p.status.as_ref().expect("status");
    assert_eq!(st.host_ip.as_deref(), Some("192.0.2.10"));
    assert!(st.pod_ip.as_deref().is_some_and(|ip| ip.starts_with("10.88.")), "{st:?}");
    assert!(st.start_time.is_some());
    for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&p, t), "True", "{t}");
    }
    let c = cstatus(&p, "c").expect("container status");
    assert!(c.ready);
    assert_eq!(c.restart_count, 0);
    assert_eq!(c.image, "busybox:1");
    assert!(c.image_id.starts_with("sha256:"));
    assert!(c.container_id.as_deref().is_some_and(|id| id.starts_with("skiff-memory://ct")));
    assert!(c.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    // The sandbox carries the pod uid; the container got its env and log path.
    let uid = p.uid().expect("uid");
    let sandboxes =
        h.rt.list_pod_sandboxes(&HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]))
            .await
            .expect("sandboxes");
    assert_eq!(sandboxes.len(), 1);
    assert!(h.dir.path().join(format!("pods/default_web_{uid}/c")).is_dir(), "log dir");
    // What `kubectl describe` shows.
    let mut reasons = Vec::new();
    for _ in 0..40 {
        let events =
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(h.client.clone(), "default")
                .list(&Default::default())
                .await
                .expect("events");
        reasons = events.items.iter().filter_map(|e| e.reason.clone()).collect::<Vec<_>>();
        if ["Pulled", "Created", "Started"].iter().all(|r| reasons.iter().any(|x| x == r)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for r in ["Pulled", "Created", "Started"] {
        assert!(reasons.iter().any(|x| x == r), "event {r} in {reasons:?}");
    }
    // Only real transitions are written: relists of an unchanged pod write nothing.
    let rv = p.resource_version();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = h.pods().get("web").await.expect("get");
    assert_eq!(again.resource_version(), rv, "no status write without a transition");
}

use skiff_agent::runtime::Runtime;

#[tokio::test]
async fn init_containers_run_in_order_before_containers() {
    let h = Harness::new().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    h.rt.set_behavior(move |cfg| {
        let name = cfg.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        seen.lock().expect("lock").push(name.clone());
        if name.starts_with("init") { Behavior::Exit(0) } else { Behavior::Run }
    });
    h.create(pod(
        "withinit",
        json!({"initContainers": [
            {"name": "init-a", "image": "busybox:1"}, {"name": "init-b", "image": "busybox:1"}],
        "containers": [{"name": "main", "image": "busybox:1"}]}),
    ))
    .await;
    let p = h.wait_for("withinit", "Running", |p| phase(p) == "Running").await;
    assert_eq!(*order.lock().expect("lock"), vec!["init-a", "init-b", "main"]);
    let inits =
        p.status.as_ref().and_then(|s| s.init_container_statuses.clone()).expect("init statuses");
    for i in &inits {
        let t = i.state.as_ref().and_then(|s| s.terminated.as_ref()).expect("terminated");
        assert_eq!(t.exit_code, 0);
        assert_eq!(t.reason.as_deref(), Some("Completed"));
    }
    assert_eq!(condition(&p, "Initialized"), "True");
}

#[tokio::test]
async fn crashing_container_restarts_with_backoff_and_counts() {
    let h = Harness::new().await;
    h.rt.set_behavior(by_name("crash", Behavior::Exit(1)));
    h.create(pod(
        "crasher",
        json!({"containers": [
        {"name": "crash", "image": "busybox:1"}, {"name": "ok", "image": "busybox:1"}]}),
    ))
    .await;
    let p = h
        .wait_for("crasher", "CrashLoopBackOff", |p| {
            waiting_reason(p, "crash").as_deref() == Some("CrashLoopBackOff")
        })
        .await;
    let c = cstatus(&p, "crash").expect("status");
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("lastState");
    assert_eq!(last.exit_code, 1);
    assert_eq!(phase(&p), "Running");
    let p = h
        .wait_for("crasher", "restartCount >= 3", |p| {
            cstatus(p, "crash").is_some_and(|c| c.restart_count >= 3)
        })
        .await;
    assert_eq!(cstatus(&p, "ok").map(|c| c.restart_count), Some(0));
    // Only the newest dead instance is kept (for lastState).
    let uid = p.uid().expect("uid");
    let all =
        h.rt.list_containers(&HashMap::from([(POD_UID_LABEL.to_string(), uid)]))
            .await
            .expect("containers");
    assert!(all.len() <= 3, "old instances removed: {}", all.len());
}

#[tokio::test]
async fn restart_policy_never_ends_succeeded_or_failed() {
    let h = Harness::new().await;
    h.rt.set_behavior(|cfg| match cfg.metadata.as_ref().map(|m| m.name.as_str()) {
        Some("good") => Behavior::Exit(0),
        _ => Behavior::Exit(3),
    });
    h.create(pod(
        "done",
        json!({"restartPolicy": "Never",
        "containers": [{"name": "good", "image": "busybox:1"}]}),
    ))
    .await;
    h.create(pod(
        "broken",
        json!({"restartPolicy": "Never",
        "containers": [{"name": "bad", "image": "busybox:1"}]}),
    ))
    .await;
    h.create(pod(
        "onfailure",
        json!({"restartPolicy": "OnFailure",
        "containers": [{"name": "good", "image": "busybox:1"}]}),
    ))
    .await;
    let p = h.wait_for("done", "Succeeded", |p| phase(p) == "Succeeded").await;
    assert_eq!(condition(&p, "Ready"), "False");
    let p = h.wait_for("broken", "Failed", |p| phase(p) == "Failed").await;
    let t = cstatus(&p, "bad")
        .and_then(|c| c.state.clone())
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(t.exit_code, 3);
    assert_eq!(cstatus(&p, "bad").map(|c| c.restart_count), Some(0));
    h.wait_for("onfailure", "Succeeded", |p| phase(p) == "Succeeded").await;
}

#[tokio::test]
async fn failing_liveness_probe_restarts_the_container() {
    let h = Harness::new().await;
    h.rt.set_exec(|_, cmd| api::ExecSyncResponse {
        exit_code: if cmd.iter().any(|a| a == "live") { 1 } else { 0 },
        ..Default::default()
    });
    h.create(pod("unhealthy", json!({"containers": [{"name": "c", "image": "busybox:1",
        "livenessProbe": {"exec": {"command": ["check", "live"]}, "periodSeconds": 1, "failureThreshold": 1}}]})))
    .await;
    let p = h
        .wait_for("unhealthy", "restarted", |p| {
            cstatus(p, "c").is_some_and(|c| c.restart_count >= 1)
        })
        .await;
    let c = cstatus(&p, "c").expect("status");
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("lastState");
    assert_eq!(last.exit_code, 143, "killed with SIGTERM");
    assert!(h.rt.calls().iter().any(|c| c.starts_with("ExecSync") && c.ends_with("check live")));
}

#[tokio::test]
async fn readiness_probe_flips_ready() {
    let h = Harness::new().await;
    let ready = Arc::new(AtomicBool::new(false));
    let flag = ready.clone();
    h.rt.set_exec(move |_, _| api::ExecSyncResponse {
        exit_code: if flag.load(Ordering::SeqCst) { 0 } else { 1 },
        ..Default::default()
    });
    h.create(pod("ready", json!({"containers": [{"name": "c", "image": "busybox:1",
        "readinessProbe": {"exec": {"command": ["ready"]}, "periodSeconds": 1, "failureThreshold": 1}}]})))
    .await;
    let p = h.wait_for("ready", "Running", |p| phase(p) == "Running").await;
    assert_eq!(condition(&p, "Ready"), "False");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let p = h.pods().get("ready").await.expect("get");
    assert_eq!(condition(&p, "Ready"), "False", "the probe fails");
    ready.store(true, Ordering::SeqCst);
    let p = h.wait_for("ready", "Ready", |p| condition(p, "Ready") == "True").await;
    assert!(cstatus(&p, "c").is_some_and(|c| c.ready));
    ready.store(false, Ordering::SeqCst);
    h.wait_for("ready", "not Ready again", |p| condition(p, "Ready") == "False").await;
    assert_eq!(
        cstatus(&h.pods().get("ready").await.expect("get"), "c").map(|c| c.restart_count),
        Some(0)
    );
}

#[tokio::test]
async fn absent_image_reports_pull_errors_without_crashing() {
    let h = Harness::new().await;
    h.create(pod("noimage", json!({"containers": [{"name": "c", "image": "nowhere/absent:1"}]})))
        .await;
    let p = h
        .wait_for("noimage", "ErrImagePull", |p| {
            matches!(waiting_reason(p, "c").as_deref(), Some("ErrImagePull" | "ImagePullBackOff"))
        })
        .await;
    assert_eq!(phase(&p), "Pending");
    h.wait_for("noimage", "ImagePullBackOff", |p| {
        waiting_reason(p, "c").as_deref() == Some("ImagePullBackOff")
    })
    .await;
    // The agent keeps serving other pods.
    h.create(pod("fine", json!({"containers": [{"name": "c", "image": "busybox:1"}]}))).await;
    h.wait_for("fine", "Running", |p| phase(p) == "Running").await;
    // The image appears in the registry: the next pull after the back-off succeeds.
    h.rt.add_pullable("nowhere/absent:1");
    h.wait_for("noimage", "Running", |p| phase(p) == "Running").await;
}

#[tokio::test]
async fn failed_start_reports_its_reason() {
    let h = Harness::new().await;
    h.rt.set_behavior(by_name(
        "c",
        Behavior::FailStart("exec: \"nope\": executable file not found in $PATH".into()),
    ));
    h.create(pod(
        "badcmd",
        json!({"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox:1", "command": ["nope"]}]}),
    ))
    .await;
    let p = h.wait_for("badcmd", "Failed", |p| phase(p) == "Failed").await;
    let t = cstatus(&p, "c")
        .and_then(|c| c.state.clone())
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(t.reason.as_deref(), Some("StartError"));
    assert!(t.message.as_deref().is_some_and(|m| m.contains("executable file not found")), "{t:?}");
}

#[tokio::test]
async fn graceful_delete_stops_containers_and_deletes_the_pod() {
    let h = Harness::new().await;
    h.create(pod(
        "bye",
        json!({"terminationGracePeriodSeconds": 5, "containers": [
        {"name": "c", "image": "busybox:1",
         "lifecycle": {"preStop": {"exec": {"command": ["pre-stop"]}}}}]}),
    ))
    .await;
    let p = h.wait_for("bye", "Running", |p| phase(p) == "Running").await;
    let uid = p.uid().expect("uid");
    h.pods().delete("bye", &DeleteParams::default()).await.expect("delete");
    for _ in 0..200 {
        if h.pods().get_opt("bye").await.expect("get").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h.pods().get_opt("bye").await.expect("get").is_none(), "pod deleted by the agent");
    let calls = h.rt.calls();
    let pre = calls.iter().position(|c| c.ends_with("pre-stop")).expect("preStop ran");
    let stop = calls.iter().position(|c| c.starts_with("StopContainer")).expect("stopped");
    assert!(pre < stop, "preStop before SIGTERM: {calls:?}");
    let left =
        h.rt.list_pod_sandboxes(&HashMap::from([(POD_UID_LABEL.to_string(), uid)]))
            .await
            .expect("list");
    assert!(left.is_empty(), "sandbox removed");
}

#[tokio::test]
async fn restarted_agent_adopts_running_containers_and_removes_orphans() {
    let mut h = Harness::new().await;
    h.create(pod(
        "keep",
        json!({"containers": [{"name": "c", "image": "busybox:1",
        "readinessProbe": {"exec": {"command": ["ready"]}, "periodSeconds": 1, "initialDelaySeconds": 1}}]}),
    ))
    .await;
    let p = h
        .wait_for("keep", "Running", |p| phase(p) == "Running" && condition(p, "Ready") == "True")
        .await;
    let rv = p.resource_version();
    let id = cstatus(&p, "c").and_then(|c| c.container_id.clone()).expect("container id");
    // The agent goes away; a pod is deleted meanwhile (its sandbox is an orphan now).
    h.agent = None;
    let orphan_cfg = api::PodSandboxConfig {
        labels: HashMap::from([(POD_UID_LABEL.to_string(), "gone-uid".to_string())]),
        ..Default::default()
    };
    h.rt.run_pod_sandbox(orphan_cfg).await.expect("orphan sandbox");
    let creates_before = h.rt.calls().iter().filter(|c| c.starts_with("CreateContainer")).count();
    h.start_agent().await;
    for _ in 0..100 {
        let orphans =
            h.rt.list_pod_sandboxes(&HashMap::from([(
                POD_UID_LABEL.to_string(),
                "gone-uid".to_string(),
            )]))
            .await
            .expect("list");
        if orphans.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let orphans = h
        .rt
        .list_pod_sandboxes(&HashMap::from([(POD_UID_LABEL.to_string(), "gone-uid".to_string())]))
        .await
        .expect("list");
    assert!(orphans.is_empty(), "orphan removed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p = h.pods().get("keep").await.expect("get");
    assert_eq!(cstatus(&p, "c").and_then(|c| c.container_id.clone()), Some(id), "same container");
    assert_eq!(p.resource_version(), rv, "the adopted pod's status is unchanged (still Ready)");
    assert_eq!(phase(&p), "Running");
    let creates_after = h.rt.calls().iter().filter(|c| c.starts_with("CreateContainer")).count();
    assert_eq!(creates_before, creates_after, "nothing restarted");
    assert!(!h.rt.calls().iter().any(|c| c.starts_with("StopContainer")), "nothing stopped");
}

#[tokio::test]
async fn pods_the_node_cannot_run_are_rejected() {
    let h = Harness::new().await;
    h.create(pod(
        "huge",
        json!({"containers": [{"name": "c", "image": "busybox:1",
        "resources": {"requests": {"cpu": "100"}}}]}),
    ))
    .await;
    let p = h.wait_for("huge", "Failed", |p| phase(p) == "Failed").await;
    let st = p.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    assert!(st.message.as_deref().is_some_and(|m| m.contains("cpu")));
    h.create(pod(
        "port-a",
        json!({"containers": [{"name": "c", "image": "busybox:1",
        "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
    ))
    .await;
    h.wait_for("port-a", "Running", |p| phase(p) == "Running").await;
    h.create(pod(
        "port-b",
        json!({"containers": [{"name": "c", "image": "busybox:1",
        "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
    ))
    .await;
    let p = h.wait_for("port-b", "Failed", |p| phase(p) == "Failed").await;
    assert_eq!(p.status.and_then(|s| s.reason).as_deref(), Some("NodePorts"));
    assert_eq!(
        h.rt.calls().iter().filter(|c| c.starts_with("RunPodSandbox")).count(),
        1,
        "rejected pods never start"
    );
}

#[tokio::test(start_paused = true)]
async fn crash_loop_backoff_doubles_from_10s_on_paused_time() {
    let (_api, client) = skiff_agent::testing::apiserver().await;
    let rt = runtime();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    rt.set_behavior(move |_| {
        seen.lock().expect("lock").push(tokio::time::Instant::now());
        Behavior::Exit(1)
    });
    let dir = tempfile::tempdir().expect("tmp");
    // The kubelet's defaults: back-off 10 s doubling to 5 min, relist every second.
    let mut c = AgentConfig::new(NODE)
        .with_node_ip("192.0.2.10".parse().expect("ip"))
        .with_root_dir(dir.path())
        .with_resources(4000, 8 << 30);
    c.host_conditions = false;
    let _agent = agent::start(client.clone(), c, rt.clone()).await.expect("agent");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p: Pod = serde_json::from_value(pod(
        "loop",
        json!({"containers": [{"name": "c", "image": "busybox:1"}]}),
    ))
    .expect("pod");
    pods.create(&PostParams::default(), &p).await.expect("create");
    for _ in 0..600 {
        if starts.lock().expect("lock").len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let starts = starts.lock().expect("lock").clone();
    assert!(starts.len() >= 5, "five starts, got {}", starts.len());
    let gaps: Vec<f64> = starts.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
    for (gap, want) in gaps.iter().zip([10.0, 20.0, 40.0, 80.0]) {
        assert!(*gap >= want && *gap <= want + 1.5, "restart gaps {gaps:?}, want 10/20/40/80 s");
    }
    let p = pods.get("loop").await.expect("get");
    let cs = cstatus(&p, "c").expect("status");
    assert!(cs.restart_count >= 3, "{cs:?}");
}

#[tokio::test]
async fn network_glue_writes_the_node_file_and_conflist_once_the_node_has_a_pod_cidr() {
    let (_api, client) = skiff_agent::testing::apiserver().await;
    let rt = MemoryRuntime::new();
    let dir = tempfile::tempdir().expect("tmp");
    let mut c = config(dir.path());
    c.network = Some(skiff_agent::config::NetworkGlue {
        cni_conf_dir: dir.path().join("net.d"),
        cni_bin_dir: dir.path().join("bin"),
        install_plugins: true,
        cni_node_config: dir.path().join("run/node.json"),
        routes: None,
        cni_data_dir: None,
    });
    let _agent = agent::start(client.clone(), c, rt).await.expect("agent");
    let conflist = dir.path().join("net.d").join(skiff_agent::network::CONFLIST_NAME);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!conflist.exists(), "no conflist before the node has a podCIDR");
    assert!(!dir.path().join("run/node.json").exists(), "nor a node file");
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"]}});
    nodes
        .patch(NODE, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("podCIDR");
    for _ in 0..100 {
        if conflist.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = std::fs::read_to_string(&conflist).expect("conflist written");
    assert!(body.contains("10.244.7.0/24"), "{body}");
    // The node file, which a conflist from the proxy DaemonSet's init container reads.
    let node = skiff_cni::config::NodeConfig::read(&dir.path().join("run/node.json"))
        .expect("node file written");
    assert_eq!(node.pod_cidr, "10.244.7.0/24");
}

#[tokio::test]
async fn agent_serves_dns_and_streaming_and_publishes_the_streaming_port() {
    let (_api, client) = skiff_agent::testing::apiserver().await;
    let dir = tempfile::tempdir().expect("tmp");
    let pki = skiff_apiserver::pki::Pki::load_or_create(&dir.path().join("pki"), &[]).expect("pki");
    let mut c = config(dir.path());
    let ca = skiff_agent::streaming::StreamingConfig::ca_from_pem(&pki.ca_cert_pem).expect("ca");
    let mut s = skiff_agent::streaming::StreamingConfig::new(ca);
    s.listen = "127.0.0.1:0".parse().expect("addr");
    s.root_dir = dir.path().to_path_buf();
    c.streaming = Some(s);
    c.dns = Some(
        skiff_agent::dns::DnsConfig::default().with_listen(["127.0.0.1:0".parse().expect("addr")]),
    );
    let agent = agent::start(client.clone(), c, MemoryRuntime::new()).await.expect("agent");
    let port = agent.streaming_addr().expect("streaming serves").port();
    assert_ne!(port, 0);
    let node = Api::<Node>::all(client.clone()).get(NODE).await.expect("node");
    let published = node
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port);
    assert_eq!(published, Some(i32::from(port)), "the Node points at the bound port");
    let dns = agent.dns().expect("dns serves");
    assert!(!dns.local_addrs().is_empty());
    let mut synced = false;
    for _ in 0..100 {
        if dns.is_synced() {
            synced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(synced, "the DNS watches synced");
}

#[tokio::test(start_paused = true)]
async fn projected_service_account_tokens_are_refreshed_at_80_percent_of_their_lifetime() {
    use std::os::unix::fs::MetadataExt;
    let h = Harness::new().await;
    let created = h
        .create(pod(
            "tok",
            json!({"volumes": [{"name": "sa", "projected": {"sources": [
                      {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}]}}],
                   "containers": [{"name": "c", "image": "busybox:1",
                                   "volumeMounts": [{"name": "sa", "mountPath": "/var/run/sa"}]}]}),
        ))
        .await;
    let uid = created.uid().expect("uid");
    let file = h.dir.path().join(format!("pods/{uid}/volumes/kubernetes.io~projected/sa/token"));
    let mut written = None;
    for _ in 0..100 {
        if let Ok(m) = std::fs::metadata(&file) {
            written = Some((tokio::time::Instant::now(), m.ino()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (t0, first) = written.expect("the token file is written");
    let token = std::fs::read_to_string(&file).expect("token");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    // 80% of 600 s is 480 s: untouched before, written again (a new file) right after.
    tokio::time::sleep_until(t0 + Duration::from_secs(470)).await;
    assert_eq!(std::fs::metadata(&file).expect("token").ino(), first, "refreshed too early");
    let mut refreshed = None;
    while tokio::time::Instant::now() < t0 + Duration::from_secs(500) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ino = std::fs::metadata(&file).expect("token").ino();
        if ino != first {
            refreshed = Some(tokio::time::Instant::now() - t0);
            break;
        }
    }
    let at = refreshed.expect("the token was not refreshed by 500 s");
    assert!(at >= Duration::from_secs(479), "refreshed after {at:?}");
    let again = std::fs::read_to_string(&file).expect("token");
    assert_eq!(again.split('.').count(), 3, "a JWT: {again}");
}
