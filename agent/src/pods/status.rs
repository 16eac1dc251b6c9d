//! Pod status from what the runtime reports (pure): phase, conditions (PodScheduled,
//! PodReadyToStartContainers, Initialized, ContainersReady, Ready), container statuses
//! (state, lastState, restartCount, image, imageID, containerID, ready, started), podIP(s),
//! hostIP(s), startTime; and whether it differs from what the API has (only real transitions
//! are written).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::runtime::api;

/// The runtime's view of one pod.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The newest sandbox: (id, ready, ip).
    pub sandbox: Option<SandboxView>,
    /// Container instances by container name, newest first.
    pub containers: HashMap<String, Vec<api::ContainerStatus>>,
}

#[derive(Debug, Clone, Default)]
pub struct SandboxView {
    pub id: String,
    pub ready: bool,
    pub ip: String,
    pub attempt: u32,
}

impl Observed {
    pub fn latest(&self, name: &str) -> Option<&api::ContainerStatus> {
        self.containers.get(name).and_then(|v| v.first())
    }
}

/// The agent's own knowledge of a pod's containers (not visible in the runtime).
#[derive(Debug, Clone, Default)]
pub struct Knowledge {
    /// Waiting reason and message per container name (image errors, back-off, config errors).
    pub waiting: HashMap<String, (String, String)>,
    /// Ready (readiness probe) per container name.
    pub ready: HashMap<String, bool>,
    /// Started (startup probe) per container name.
    pub started: HashMap<String, bool>,
}

pub fn is_running(c: &api::ContainerStatus) -> bool {
    c.state == api::ContainerState::ContainerRunning as i32
}
pub fn is_exited(c: &api::ContainerStatus) -> bool {
    c.state == api::ContainerState::ContainerExited as i32
}

/// A time from CRI nanoseconds, at the API's one-second precision.
pub fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    k8s_openapi::jiff::Timestamp::from_second(nanos / 1_000_000_000).ok().map(Time)
}

pub fn now() -> Time {
    let s = k8s_openapi::jiff::Timestamp::now().as_second();
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default())
}

fn terminated(c: &api::ContainerStatus, runtime: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(if c.reason.is_empty() {
                if c.exit_code == 0 { "Completed" } else { "Error" }.to_string()
            } else {
                c.reason.clone()
            }),
            message: Some(c.message.clone()).filter(|m| !m.is_empty()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(format!("{runtime}://{}", c.id)),
            signal: None,
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

/// The status of one container.
pub fn container_status(
    spec: &Container,
    obs: &Observed,
    know: &Knowledge,
    runtime: &str,
    default_waiting: &str,
) -> ContainerStatus {
    let instances = obs.containers.get(&spec.name).map(Vec::as_slice).unwrap_or_default();
    let latest = instances.first();
    let previous = instances.get(1);
    let override_waiting = know.waiting.get(&spec.name);
    let mut st = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: String::new(),
        restart_count: latest
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.attempt as i32)
            .unwrap_or(0),
        ready: false,
        started: Some(false),
        ..Default::default()
    };
    match latest {
        None => {
            let (r, m) = override_waiting
                .map(|(r, m)| (r.as_str(), m.as_str()))
                .unwrap_or((default_waiting, ""));
            st.state = Some(waiting(r, m));
        }
        Some(c) => {
            st.image_id = c.image_ref.clone();
            st.container_id = Some(format!("{runtime}://{}", c.id));
            if is_running(c) {
                st.state = Some(ContainerState {
                    running: Some(ContainerStateRunning { started_at: time(c.started_at) }),
                    ..Default::default()
                });
                st.started = Some(know.started.get(&spec.name).copied().unwrap_or(true));
                st.ready = know.ready.get(&spec.name).copied().unwrap_or(false);
                st.last_state = previous.map(|p| terminated(p, runtime));
            } else if is_exited(c) {
                match override_waiting {
                    Some((r, m)) => {
                        st.state = Some(waiting(r, m));
                        st.last_state = Some(terminated(c, runtime));
                    }
                    None => {
                        st.state = Some(terminated(c, runtime));
                        st.last_state = previous.map(|p| terminated(p, runtime));
                    }
                }
            } else {
                st.state = Some(waiting("ContainerCreating", ""));
                st.last_state = previous.map(|p| terminated(p, runtime));
            }
        }
    }
    if st.last_state.is_none() {
        st.last_state = Some(ContainerState::default());
    }
    st
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// The phase per the kubelet's rules.
fn phase(
    pod: &Pod,
    init_failed: bool,
    initialized: bool,
    statuses: &[ContainerStatus],
) -> &'static str {
    let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always");
    if init_failed {
        return "Failed";
    }
    if !initialized {
        return "Pending";
    }
    let (mut running, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in statuses {
        let state = s.state.as_ref();
        if state.and_then(|s| s.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
            stopped += 1;
        } else {
            waiting_n += 1;
        }
    }
    if waiting_n > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match policy {
            "Always" => "Running",
            "OnFailure" if stopped == succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ if stopped == succeeded => "Succeeded",
            _ => "Failed",
        };
    }
    "Pending"
}

/// The full status of `pod` from the observation (pure but for "now" in new timestamps).
pub fn compute(
    pod: &Pod,
    obs: &Observed,
    know: &Knowledge,
    host_ip: &str,
    runtime: &str,
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let existing = pod.status.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let mut init_statuses = Vec::new();
    let mut initialized = true;
    let mut init_failed = false;
    let mut incomplete = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        let st = container_status(c, obs, know, runtime, "PodInitializing");
        let done = obs.latest(&c.name).is_some_and(|l| is_exited(l) && l.exit_code == 0);
        if !done {
            if initialized
                && policy == "Never"
                && obs.latest(&c.name).is_some_and(|l| is_exited(l) && l.exit_code != 0)
            {
                init_failed = true;
            }
            initialized = false;
            incomplete.push(c.name.clone());
        }
        init_statuses.push(st);
    }
    let default_waiting = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let statuses: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, obs, know, runtime, default_waiting))
        .collect();
    let mut phase = phase(pod, init_failed, initialized, &statuses).to_string();
    if matches!(existing.phase.as_deref(), Some("Succeeded" | "Failed")) {
        phase = existing.phase.clone().unwrap_or(phase);
    }
    let terminal = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<String> =
        statuses.iter().filter(|s| !s.ready).map(|s| s.name.clone()).collect();
    let containers_ready = unready.is_empty() && !terminal;
    let (reason, msg) = if terminal {
        (Some("PodCompleted".to_string()), None)
    } else {
        (
            Some("ContainersNotReady".to_string()),
            Some(format!("containers with unready status: [{}]", unready.join(" "))),
        )
    };
    let sandbox_ready = obs.sandbox.as_ref().is_some_and(|s| s.ready);
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None),
        condition(
            "Initialized",
            initialized,
            Some("ContainersNotInitialized".into()),
            Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
        ),
        condition("Ready", containers_ready, reason.clone(), msg.clone()),
        condition("ContainersReady", containers_ready, reason, msg),
        condition("PodScheduled", true, None, None),
    ];
    let t = now();
    for c in &mut conditions {
        let prev = existing.conditions.iter().flatten().find(|p| p.type_ == c.type_);
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(t.clone()),
        };
    }
    let host_network = spec.host_network.unwrap_or(false);
    let pod_ip = if host_network {
        Some(host_ip.to_string())
    } else {
        obs.sandbox
            .as_ref()
            .map(|s| s.ip.clone())
            .filter(|ip| !ip.is_empty())
            .or(existing.pod_ip.clone())
    };
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        pod_ips: pod_ip.clone().map(|ip| vec![PodIP { ip }]),
        pod_ip,
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![HostIP { ip: host_ip.to_string() }]),
        start_time: existing.start_time.clone().or(Some(t)),
        qos_class: existing.qos_class.clone(),
        ..Default::default()
    }
}

/// The status of a pod the node rejected.
pub fn rejected(pod: &Pod, reason: &str, message: &str, host_ip: &str) -> PodStatus {
    let existing = pod.status.clone().unwrap_or_default();
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(reason.into()),
        message: Some(message.into()),
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![HostIP { ip: host_ip.to_string() }]),
        start_time: existing.start_time.or(Some(now())),
        conditions: existing.conditions,
        qos_class: existing.qos_class,
        ..Default::default()
    }
}

/// Whether `computed` says anything `existing` does not (every field `computed` sets is
/// compared; conditions ignore timestamps other than the transition).
pub fn differs(existing: Option<&PodStatus>, computed: &PodStatus) -> bool {
    let Some(existing) = existing else { return true };
    let a = serde_json::to_value(existing).unwrap_or_default();
    let b = serde_json::to_value(computed).unwrap_or_default();
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return true };
    b.iter().any(|(k, v)| {
        if k == "conditions" {
            let strip = |v: Option<&serde_json::Value>| -> Vec<(String, String, String)> {
                let mut out: Vec<(String, String, String)> = v
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let s = |f: &str| {
                            c.get(f).and_then(|x| x.as_str()).unwrap_or_default().to_string()
                        };
                        (s("type"), s("status"), s("reason"))
                    })
                    .collect();
                out.sort();
                out
            };
            strip(a.get(k)) != strip(Some(v))
        } else {
            a.get(k) != Some(v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(policy: &str, init: bool) -> Pod {
        let mut spec = json!({"restartPolicy": policy, "containers": [
            {"name": "a", "image": "img:1"}, {"name": "b", "image": "img:1"}]});
        if init {
            spec["initContainers"] = json!([{"name": "i", "image": "img:1"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
            .expect("pod")
    }

    fn instance(
        name: &str,
        id: &str,
        attempt: u32,
        state: api::ContainerState,
        code: i32,
    ) -> api::ContainerStatus {
        api::ContainerStatus {
            id: id.into(),
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt }),
            state: state as i32,
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == api::ContainerState::ContainerExited {
                1_700_000_010_000_000_000
            } else {
                0
            },
            exit_code: code,
            image_ref: "sha256:abc".into(),
            ..Default::default()
        }
    }

    fn obs(entries: Vec<(&str, Vec<api::ContainerStatus>)>) -> Observed {
        Observed {
            sandbox: Some(SandboxView {
                id: "sb".into(),
                ready: true,
                ip: "10.0.0.9".into(),
                attempt: 0,
            }),
            containers: entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    fn cond(st: &PodStatus, t: &str) -> String {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
            .expect("condition")
    }

    #[test]
    fn pending_then_running_and_ready() {
        let p = pod("Always", false);
        let empty = Observed::default();
        let st = compute(&p, &empty, &Knowledge::default(), "192.168.0.2", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        let cs = &st.container_statuses.as_ref().expect("cs")[0];
        assert_eq!(
            cs.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()),
            Some("ContainerCreating")
        );
        assert_eq!(st.pod_ip, None);

        let running = obs(vec![
            ("a", vec![instance("a", "c1", 0, api::ContainerState::ContainerRunning, 0)]),
            ("b", vec![instance("b", "c2", 0, api::ContainerState::ContainerRunning, 0)]),
        ]);
        let mut know = Knowledge::default();
        know.ready.insert("a".into(), true);
        let st = compute(&p, &running, &know, "192.168.0.2", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&st, "Ready"), "False");
        assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.9"));
        let cs = &st.container_statuses.as_ref().expect("cs")[0];
        assert_eq!(cs.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!(cs.image_id, "sha256:abc");
        assert!(cs.ready);
        know.ready.insert("b".into(), true);
        let st = compute(&p, &running, &know, "192.168.0.2", "containerd");
        assert_eq!(cond(&st, "Ready"), "True");
        assert_eq!(cond(&st, "ContainersReady"), "True");
        assert_eq!(cond(&st, "Initialized"), "True");
        assert_eq!(st.host_ip.as_deref(), Some("192.168.0.2"));
    }

    #[test]
    fn crash_loop_shows_waiting_with_last_state_and_restart_count() {
        let p = pod("Always", false);
        let o = obs(vec![
            (
                "a",
                vec![
                    instance("a", "c3", 2, api::ContainerState::ContainerExited, 1),
                    instance("a", "c2", 1, api::ContainerState::ContainerExited, 1),
                ],
            ),
            ("b", vec![instance("b", "c4", 0, api::ContainerState::ContainerRunning, 0)]),
        ]);
        let mut know = Knowledge::default();
        know.waiting.insert("a".into(), ("CrashLoopBackOff".into(), "back-off 20s".into()));
        let st = compute(&p, &o, &know, "h", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let a = &st.container_statuses.as_ref().expect("cs")[0];
        assert_eq!(a.restart_count, 2);
        assert_eq!(
            a.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );
        let last = a.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("last");
        assert_eq!(last.exit_code, 1);
        assert_eq!(last.container_id.as_deref(), Some("containerd://c3"));
    }

    #[test]
    fn never_policy_ends_in_succeeded_or_failed() {
        let p = pod("Never", false);
        let done = |code_b| {
            obs(vec![
                ("a", vec![instance("a", "c1", 0, api::ContainerState::ContainerExited, 0)]),
                ("b", vec![instance("b", "c2", 0, api::ContainerState::ContainerExited, code_b)]),
            ])
        };
        let st = compute(&p, &done(0), &Knowledge::default(), "h", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&st, "Ready"), "False");
        let st = compute(&p, &done(2), &Knowledge::default(), "h", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        let p = pod("OnFailure", false);
        let st = compute(&p, &done(2), &Knowledge::default(), "h", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Running"), "OnFailure restarts failed containers");
    }

    #[test]
    fn init_containers_gate_initialized() {
        let p = pod("Never", true);
        let o = obs(vec![(
            "i",
            vec![instance("i", "c0", 0, api::ContainerState::ContainerRunning, 0)],
        )]);
        let st = compute(&p, &o, &Knowledge::default(), "h", "containerd");
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&st, "Initialized"), "False");
        let a = &st.container_statuses.as_ref().expect("cs")[0];
        assert_eq!(
            a.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()),
            Some("PodInitializing")
        );
        let o =
            obs(vec![("i", vec![instance("i", "c0", 0, api::ContainerState::ContainerExited, 1)])]);
        let st = compute(&p, &o, &Knowledge::default(), "h", "containerd");
        assert_eq!(
            st.phase.as_deref(),
            Some("Failed"),
            "a failed init container with Never fails the pod"
        );
    }

    #[test]
    fn differs_ignores_timestamps_of_unchanged_conditions() {
        let p = pod("Always", false);
        let st = compute(&p, &Observed::default(), &Knowledge::default(), "h", "containerd");
        let mut p2 = p.clone();
        p2.status = Some(st.clone());
        let again = compute(&p2, &Observed::default(), &Knowledge::default(), "h", "containerd");
        assert!(!differs(p2.status.as_ref(), &again), "same observation: no write");
        let o = obs(vec![]);
        let st3 = compute(&p2, &o, &Knowledge::default(), "h", "containerd");
        assert!(differs(p2.status.as_ref(), &st3), "a sandbox appeared");
    }
}
