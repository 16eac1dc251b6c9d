//! The real agent (pod sync, probes, back-off, termination, adoption) against a real
//! containerd: each test starts a node with the testing rig (its own network namespace,
//! containerd, skiff-cni, the busybox test images) and an in-process apiserver, and runs
//! `agent::start` over the rig's CRI socket. Needs root, containerd, runc, ctr,
//! busybox-static and a built skiff-cni (`cargo build -p skiff-cni`); a missing piece fails
//! the test with the reason, it never skips. Everything (pods, containerd, namespace,
//! cgroups, directories) goes with the rig, also when a test fails.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use skiff_agent::agent::{self, AgentHandle};
use skiff_agent::config::AgentConfig;
use skiff_agent::images::TOOLS_IMAGE;
use skiff_agent::runtime::cri::CriRuntime;
use skiff_agent::runtime::{POD_UID_LABEL, Runtime, api};
use skiff_agent::testing::{NodeRig, NodeRigConfig};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

const NODE: &str = "ctr-node";

struct Harness {
    _api: Arc<ApiServer>,
    client: Client,
    cri: CriRuntime,
    dir: tempfile::TempDir,
    agent: Option<AgentHandle>,
    // Last: dropped after the agent, it removes every pod, containerd and the namespace.
    rig: NodeRig,
}

impl Harness {
    async fn new(octet: u8) -> Harness {
        let cfg = NodeRigConfig::default()
            .pod_cidr(format!("10.244.{octet}.0/24").parse().expect("cidr"))
            .node_ip(Ipv4Addr::new(10, 250, octet, 1));
        let rig =
            NodeRig::start(cfg).await.unwrap_or_else(|e| panic!("starting the node rig: {e:#?}"));
        let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("apiserver");
        let client = api.client();
        skiff_agent::testing::seed_namespace(&client, "default").await;
        let cri = rig.runtime().await.expect("CRI client");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = Harness { _api: api, client, cri, dir, agent: None, rig };
        h.start_agent().await;
        h
    }

    fn config(&self) -> AgentConfig {
        let mut c = AgentConfig::new(NODE)
            .with_node_ip(self.rig.node_ip().into())
            .with_root_dir(self.dir.path())
            .with_resources(4000, 8 << 30)
            .with_backoff(Duration::from_secs(1), Duration::from_secs(8))
            .with_relist(Duration::from_millis(250));
        c.host_conditions = false;
        c.cgroup_parent = self.rig.cgroup_parent().to_string();
        c
    }

    async fn start_agent(&mut self) {
        let handle = agent::start(self.client.clone(), self.config(), self.cri.clone())
            .await
            .expect("agent starts");
        self.agent = Some(handle);
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, name: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(NODE);
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
        .expect("pod json");
        self.pods().create(&PostParams::default(), &pod).await.expect("create pod")
    }

    /// Polls the pod every 50 ms until `f` holds (or fails after `secs`, with the last
    /// status and containerd's log tail).
    async fn wait_for(&self, name: &str, what: &str, secs: u64, f: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(p) = self.pods().get_opt(name).await.expect("get pod") {
                if f(&p) {
                    return p;
                }
                last = Some(p);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = self.rig.containerd_log();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        panic!(
            "timed out after {secs} s waiting for {name}: {what}; last status: {:#?}\ncontainerd log (newest first): {tail:#?}",
            last.and_then(|p| p.status)
        );
    }

    /// The pod's containers in containerd (by the pod-uid label).
    async fn containers_of(&self, uid: &str) -> Vec<api::Container> {
        let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
        self.cri.list_containers(&labels).await.expect("ListContainers")
    }
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn cstatus<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

fn restarts(p: &Pod, name: &str) -> i32 {
    cstatus(p, name).map(|c| c.restart_count).unwrap_or(0)
}

fn running(p: &Pod, name: &str) -> bool {
    cstatus(p, name).and_then(|c| c.state.as_ref()).is_some_and(|s| s.running.is_some())
}

fn waiting_reason(p: &Pod, name: &str) -> Option<String> {
    cstatus(p, name)?.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

fn container_id(p: &Pod, name: &str) -> Option<String> {
    cstatus(p, name)?.container_id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container_and_counts_it() {
    let h = Harness::new(210).await;
    // The probe never passes (/tmp/healthy never exists): every instance is killed after
    // two failed probes and started again.
    h.create(
        "live",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"],
            "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/healthy"]},
                              "periodSeconds": 1, "failureThreshold": 2}}]}),
    )
    .await;
    let first = h.wait_for("live", "Running", 60, |p| running(p, "c")).await;
    let first_id = container_id(&first, "c").expect("containerID");
    assert!(first_id.starts_with("containerd://"), "{first_id}");
    assert_eq!(restarts(&first, "c"), 0);

    let again = h
        .wait_for("live", "restarted by the liveness probe and running again", 60, |p| {
            restarts(p, "c") >= 1 && running(p, "c")
        })
        .await;
    let c = cstatus(&again, "c").expect("status");
    assert_ne!(c.container_id.as_deref(), Some(first_id.as_str()), "a new container instance");
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("lastState");
    assert_eq!(last.container_id.as_deref(), Some(first_id.as_str()), "{last:?}");
    // Killed: SIGTERM (143), or SIGKILL (137) when it outlived the probe's grace period.
    assert!([137, 143].contains(&last.exit_code), "{last:?}");

    // restartCount keeps counting, and containerd holds the running instance plus the
    // newest dead one (lastState), never more.
    let more = h.wait_for("live", "a second restart", 60, |p| restarts(p, "c") >= 2).await;
    let uid = more.uid().expect("uid");
    let instances = h.containers_of(&uid).await;
    assert!(instances.len() <= 2, "old instances are removed: {instances:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_backs_off_with_doubling_intervals() {
    let h = Harness::new(211).await;
    h.create(
        "crash",
        json!({"restartPolicy": "Always", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "exit 3"]}]}),
    )
    .await;
    // Record when each restart count first shows up, and that CrashLoopBackOff is shown
    // while waiting.
    let start = Instant::now();
    let mut seen: Vec<(i32, Instant)> = Vec::new();
    let mut crash_loop = None;
    let mut last_terminated = None;
    while start.elapsed() < Duration::from_secs(60) && seen.last().map(|s| s.0) < Some(4) {
        if let Some(p) = h.pods().get_opt("crash").await.expect("get") {
            let n = restarts(&p, "c");
            if seen.last().map(|s| s.0) != Some(n) && cstatus(&p, "c").is_some() {
                seen.push((n, Instant::now()));
            }
            if let Some(r) = waiting_reason(&p, "c").filter(|r| r == "CrashLoopBackOff") {
                crash_loop = Some(r);
                last_terminated = cstatus(&p, "c")
                    .and_then(|c| c.last_state.as_ref())
                    .and_then(|s| s.terminated.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(crash_loop.as_deref(), Some("CrashLoopBackOff"), "restarts seen: {seen:?}");
    let t = last_terminated.expect("lastState.terminated while backing off");
    assert_eq!(t.exit_code, 3, "{t:?}");
    assert_eq!(t.reason.as_deref(), Some("Error"), "{t:?}");
    let counts: Vec<i32> = seen.iter().map(|s| s.0).collect();
    assert!(counts.windows(2).all(|w| w[1] == w[0] + 1), "counted one by one: {counts:?}");
    assert!(counts.contains(&3), "at least three restarts within 60 s: {counts:?}");
    // Back-off 1 s doubling (8 s cap): restart k+1 comes >= 2^k s after restart k (minus the
    // 50 ms poll), and not much later (relist 250 ms, container run time, status write).
    let gaps: Vec<Duration> =
        seen.windows(2).filter(|w| w[0].0 >= 1).map(|w| w[1].1.duration_since(w[0].1)).collect();
    for (k, gap) in gaps.iter().enumerate() {
        let want = Duration::from_secs(1 << (k + 1).min(3));
        assert!(
            *gap + Duration::from_millis(300) >= want && *gap <= want + Duration::from_secs(3),
            "gap {k} between restarts was {gap:?}, the back-off is {want:?} (all gaps {gaps:?})"
        );
    }
    assert!(!gaps.is_empty(), "restarts seen: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_delete_runs_prestop_then_sigkills_after_the_grace_period() {
    let h = Harness::new(212).await;
    let shared = h.dir.path().join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    // The container traps SIGTERM and carries on; preStop and the trap leave marks on a
    // hostPath volume the test reads.
    h.create(
        "graceful",
        json!({"terminationGracePeriodSeconds": 4,
               "volumes": [{"name": "shared", "hostPath": {"path": shared.to_string_lossy()}}],
               "containers": [{
            "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c",
                "trap 'echo term >> /shared/log' TERM; echo up >> /shared/log; while true; do sleep 1; done"],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /shared/log"]}}}}]}),
    )
    .await;
    let pod = h.wait_for("graceful", "Running", 60, |p| running(p, "c")).await;
    let uid = pod.uid().expect("uid");
    // The shell is up once it wrote its line.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(shared.join("log")).unwrap_or_default().contains("up") {
        assert!(Instant::now() < deadline, "the container never wrote to the hostPath volume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = Instant::now();
    h.pods().delete("graceful", &DeleteParams::default()).await.expect("delete");
    // Still running after SIGTERM, until the grace period ends.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let during = h.containers_of(&uid).await;
    assert!(
        during.iter().any(|c| c.state == api::ContainerState::ContainerRunning as i32),
        "the container must survive its ignored SIGTERM within the grace period: {during:#?}"
    );
    let log = std::fs::read_to_string(shared.join("log")).unwrap_or_default();
    assert!(log.contains("prestop"), "preStop ran before the kill: {log:?}");
    // Gone (SIGKILL, sandbox removed, object deleted) shortly after the 4 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.pods().get_opt("graceful").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "the pod was not deleted within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(3800) && took <= Duration::from_secs(9),
        "deletion took {took:?} with a 4 s grace period"
    );
    let log = std::fs::read_to_string(shared.join("log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let prestop = lines.iter().position(|l| *l == "prestop").expect("prestop line");
    let term = lines.iter().position(|l| *l == "term");
    assert!(term.is_some_and(|t| t > prestop), "preStop, then SIGTERM (trapped): {lines:?}");
    assert!(h.containers_of(&uid).await.is_empty(), "the container is removed");
    let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]);
    assert!(h.cri.list_pod_sandboxes(&labels).await.expect("list").is_empty(), "sandbox removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_and_restarted_keeps_the_pod_running_untouched() {
    let mut h = Harness::new(213).await;
    h.create(
        "keep",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"]}]}),
    )
    .await;
    let before = h.wait_for("keep", "Running", 60, |p| running(p, "c")).await;
    let uid = before.uid().expect("uid");
    let id = container_id(&before, "c").expect("containerID");
    let count = restarts(&before, "c");
    let cri_before = h.containers_of(&uid).await;
    assert_eq!(cri_before.len(), 1, "{cri_before:#?}");

    // kill -9: the agent's tasks are aborted where they stand; nothing is cleaned up.
    drop(h.agent.take());
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.start_agent().await;
    // Several relists and worker passes later, nothing changed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = h.wait_for("keep", "Running", 10, |p| running(p, "c")).await;
    assert_eq!(container_id(&after, "c").as_deref(), Some(id.as_str()), "same container");
    assert_eq!(restarts(&after, "c"), count, "no restart counted");
    let cri_after = h.containers_of(&uid).await;
    assert_eq!(cri_after.len(), 1, "{cri_after:#?}");
    assert_eq!(cri_after[0].id, cri_before[0].id);
    assert_eq!(cri_after[0].state, api::ContainerState::ContainerRunning as i32);
    let st = h.cri.container_status(&cri_after[0].id).await.expect("status");
    let cri_id = format!("containerd://{}", st.id);
    assert_eq!(cri_id, id);
    let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]);
    let sandboxes = h.cri.list_pod_sandboxes(&labels).await.expect("list");
    assert_eq!(sandboxes.len(), 1, "the sandbox is not recreated: {sandboxes:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_absent_image_invalid_command_and_an_unrunnable_pod() {
    let h = Harness::new(214).await;
    // An image that is nowhere (no registry is reachable from the node namespace).
    h.create(
        "absent",
        json!({"containers": [{"name": "c", "image": "skiff.test/absent:1",
                               "imagePullPolicy": "IfNotPresent", "command": ["sh"]}]}),
    )
    .await;
    // A command that does not exist, never restarted.
    h.create(
        "badcmd",
        json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": TOOLS_IMAGE,
               "imagePullPolicy": "IfNotPresent", "command": ["/no/such/binary"]}]}),
    )
    .await;
    // More CPU than the node has.
    h.create(
        "huge",
        json!({"containers": [{"name": "c", "image": TOOLS_IMAGE, "command": ["sleep", "1"],
               "resources": {"requests": {"cpu": "64"}}}]}),
    )
    .await;

    let p = h
        .wait_for("absent", "ErrImagePull", 60, |p| {
            waiting_reason(p, "c").as_deref() == Some("ErrImagePull")
        })
        .await;
    let msg = cstatus(&p, "c")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("skiff.test/absent:1"), "{msg}");
    assert_eq!(phase(&p), "Pending");
    h.wait_for("absent", "ImagePullBackOff", 60, |p| {
        waiting_reason(p, "c").as_deref() == Some("ImagePullBackOff")
    })
    .await;

    let p = h.wait_for("badcmd", "Failed", 60, |p| phase(p) == "Failed").await;
    let t = cstatus(&p, "c")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.clone())
        .expect("terminated state");
    assert_ne!(t.exit_code, 0, "{t:?}");
    assert!(t.reason.as_deref().is_some_and(|r| !r.is_empty()), "{t:?}");
    assert!(
        t.message.as_deref().is_some_and(|m| m.contains("/no/such/binary")),
        "the runtime's reason reaches the status: {t:?}"
    );

    let p = h.wait_for("huge", "rejected", 30, |p| phase(p) == "Failed").await;
    let st = p.status.clone().expect("status");
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"), "{st:?}");
    assert!(st.message.as_deref().is_some_and(|m| !m.is_empty()), "{st:?}");
    let uid = p.uid().expect("uid");
    let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid)]);
    assert!(
        h.cri.list_pod_sandboxes(&labels).await.expect("list").is_empty(),
        "a rejected pod gets no sandbox"
    );

    // The agent is still well: a good pod runs next to the bad ones.
    h.create(
        "good",
        json!({"containers": [{"name": "c", "image": TOOLS_IMAGE,
               "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}]}),
    )
    .await;
    h.wait_for("good", "Running", 60, |p| running(p, "c")).await;
}

/// `<hierarchy>/<parent>/pod<uid>` in every cgroup hierarchy.
fn pod_cgroup_dirs(parent: &str, uid: &str) -> Vec<std::path::PathBuf> {
    skiff_agent::cgroups::cgroup_mounts()
        .expect("cgroup mounts")
        .into_iter()
        .map(|m| m.join(parent.trim_start_matches('/')).join(format!("pod{uid}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cgroup_dirs_go_with_the_pod_and_on_adoption() {
    let mut h = Harness::new(215).await;
    let parent = h.rig.cgroup_parent().to_string();
    let spec = json!({"terminationGracePeriodSeconds": 1, "containers": [{
        "name": "c", "image": TOOLS_IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", "3600"]}]});

    // A deleted pod's cgroup directory goes with it.
    let a = h.create("a", spec.clone()).await;
    let a_uid = a.uid().expect("uid");
    h.wait_for("a", "Running", 60, |p| running(p, "c")).await;
    let dirs = pod_cgroup_dirs(&parent, &a_uid);
    assert!(dirs.iter().any(|d| d.is_dir()), "pods live under <parent>/pod<uid>: {dirs:?}");
    h.pods().delete("a", &DeleteParams::default()).await.expect("delete");
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.pods().get_opt("a").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "pod a was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<_> = dirs.iter().filter(|d| d.exists()).collect();
    assert!(left.is_empty(), "cgroup directories left behind: {left:?}");

    // A pod removed from the API while no agent runs: the next agent removes its sandbox
    // and cgroups, and stray pod directories of unknown pods.
    let b = h.create("b", spec.clone()).await;
    let b_uid = b.uid().expect("uid");
    h.wait_for("b", "Running", 60, |p| running(p, "c")).await;
    drop(h.agent.take());
    let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    h.pods().delete("b", &force).await.expect("force delete");
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.pods().get_opt("b").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "pod b was not force-deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b_dirs = pod_cgroup_dirs(&parent, &b_uid);
    assert!(b_dirs.iter().any(|d| d.is_dir()), "b's cgroups are there while no agent runs");
    let stray = pod_cgroup_dirs(&parent, "00000000-stray");
    for d in &stray {
        if d.parent().is_some_and(|p| p.is_dir()) {
            std::fs::create_dir(d).expect("stray cgroup dir");
        }
    }
    h.start_agent().await;
    let labels = HashMap::from([(POD_UID_LABEL.to_string(), b_uid.clone())]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sandboxes = h.cri.list_pod_sandboxes(&labels).await.expect("list");
        let left: Vec<_> = b_dirs.iter().chain(&stray).filter(|d| d.exists()).collect();
        if sandboxes.is_empty() && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "adoption left sandboxes {sandboxes:#?} and cgroup directories {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
