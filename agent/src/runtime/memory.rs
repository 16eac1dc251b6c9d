//! An in-memory [`Runtime`]: sandboxes and containers are records, "processes" are states.
//! Deterministic (no background tasks; containers change state only when a method or a
//! test tells them to), so pod-sync tests can step through every transition.
//!
//! How a container behaves is decided when it starts, by the [`Behavior`] hook (by default
//! it runs until stopped); exec results come from the exec hook (by default exit 0).

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Error, Result, Runtime, api};

/// What a container does when started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behavior {
    /// Runs until stopped.
    Run,
    /// Exits at once with this code.
    Exit(i32),
    /// StartContainer fails with this message (e.g. the executable does not exist).
    FailStart(String),
}

type BehaviorHook = dyn Fn(&api::ContainerConfig) -> Behavior + Send + Sync;
type ExecHook = dyn Fn(&api::ContainerStatus, &[String]) -> api::ExecSyncResponse + Send + Sync;

/// The in-memory runtime. Cheap to clone (shared state).
#[derive(Clone)]
pub struct MemoryRuntime {
    inner: Arc<Mutex<State>>,
    behavior: Arc<Mutex<Arc<BehaviorHook>>>,
    exec: Arc<Mutex<Arc<ExecHook>>>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    next_ip: u32,
    /// Sandbox IPs are `ip_base + next_ip` (10.88.0.0 unless set).
    ip_base: u32,
    images: BTreeMap<String, api::Image>,
    /// Images PullImage can fetch (a stand-in for a registry).
    pullable: BTreeMap<String, ()>,
    /// Every image is pullable (simulated nodes).
    pull_any: bool,
    sandboxes: BTreeMap<String, api::PodSandboxStatus>,
    containers: BTreeMap<String, Record>,
    /// Resource use of containers, as set by [`MemoryRuntime::set_usage`] (none: idle).
    usage: BTreeMap<String, Usage>,
    /// Every call, in order, as "Method id" (tests assert on what was asked of the runtime).
    calls: Vec<String>,
    /// Read-only calls (lists and statuses) by method: counted, not logged.
    reads: BTreeMap<&'static str, usize>,
}

/// A container's steady use: CPU (nanocores, since a time) and working set.
#[derive(Debug, Clone, Copy)]
struct Usage {
    nanocores: u64,
    since_ms: i64,
    working_set_bytes: u64,
}

struct Record {
    sandbox_id: String,
    status: api::ContainerStatus,
    /// Decided at create time, applied at start.
    behavior: Behavior,
}

impl std::fmt::Debug for MemoryRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("MemoryRuntime")
            .field("sandboxes", &s.sandboxes.len())
            .field("containers", &s.containers.len())
            .finish()
    }
}

impl Default for MemoryRuntime {
    fn default() -> Self {
        Self::new()
    }
}

fn now_nanos() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn labels_match(have: &HashMap<String, String>, want: &HashMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

impl MemoryRuntime {
    pub fn new() -> Self {
        MemoryRuntime {
            inner: Arc::new(Mutex::new(State {
                next_ip: 2,
                ip_base: u32::from(Ipv4Addr::new(10, 88, 0, 0)),
                ..State::default()
            })),
            behavior: Arc::new(Mutex::new(Arc::new(|_: &api::ContainerConfig| Behavior::Run))),
            exec: Arc::new(Mutex::new(Arc::new(|_: &api::ContainerStatus, _: &[String]| {
                api::ExecSyncResponse { stdout: Vec::new(), stderr: Vec::new(), exit_code: 0 }
            }))),
        }
    }

    /// Sandboxes get addresses from `base` on (`base + 2`, `base + 3`, ...): distinct ranges
    /// keep pod IPs unique across several runtimes (simulated nodes).
    pub fn with_pod_network(self, base: Ipv4Addr) -> Self {
        self.lock().ip_base = u32::from(base);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes an image present locally.
    pub fn add_image(&self, name: &str) {
        let mut s = self.lock();
        s.images.insert(name.to_string(), image(name));
    }

    /// Makes an image pullable (present in the pretend registry).
    pub fn add_pullable(&self, name: &str) {
        self.lock().pullable.insert(name.to_string(), ());
    }

    /// Makes every image pullable (the hollow nodes of `skiff-lab simulate`).
    pub fn set_pull_any(&self, any: bool) {
        self.lock().pull_any = any;
    }

    /// Decides how containers behave when started.
    pub fn set_behavior(
        &self,
        hook: impl Fn(&api::ContainerConfig) -> Behavior + Send + Sync + 'static,
    ) {
        *self.behavior.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(hook);
    }

    /// Decides what exec (probes, hooks) returns.
    pub fn set_exec(
        &self,
        hook: impl Fn(&api::ContainerStatus, &[String]) -> api::ExecSyncResponse + Send + Sync + 'static,
    ) {
        *self.exec.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(hook);
    }

    /// Makes a running container exit with `code` (a crash, or a normal completion).
    pub fn exit_container(&self, id: &str, code: i32) -> Result<()> {
        let mut s = self.lock();
        let rec = s.containers.get_mut(id).ok_or_else(|| Error::not_found("container", id))?;
        if rec.status.state == api::ContainerState::ContainerRunning as i32 {
            exit(&mut rec.status, code, if code == 0 { "Completed" } else { "Error" });
        }
        Ok(())
    }

    /// From now on the container uses `nanocores` of CPU (its cumulative CPU time grows by
    /// that much per second of its samples' times, which are whole milliseconds, so a rate
    /// over any two samples is exact) and has this working set.
    pub fn set_usage(&self, id: &str, nanocores: u64, working_set_bytes: u64) {
        let usage = Usage { nanocores, since_ms: now_ms(), working_set_bytes };
        self.lock().usage.insert(id.to_string(), usage);
    }

    /// Every runtime call so far, as "Method id".
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// How many read-only calls (ListPodSandbox, PodSandboxStatus, ListContainers,
    /// ContainerStatus) were made, by method.
    pub fn reads(&self) -> BTreeMap<&'static str, usize> {
        self.lock().reads.clone()
    }

    /// Ids of the containers currently in the given state.
    pub fn containers_in(&self, state: api::ContainerState) -> Vec<String> {
        let s = self.lock();
        s.containers
            .iter()
            .filter(|(_, r)| r.status.state == state as i32)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn next_id(s: &mut State, prefix: &str) -> String {
        s.next_id += 1;
        format!("{prefix}{:016x}", s.next_id)
    }
}

fn image(name: &str) -> api::Image {
    let digest = format!("sha256:{:064x}", fxhash(name));
    api::Image {
        id: digest.clone(),
        repo_tags: vec![name.to_string()],
        repo_digests: vec![format!("{}@{digest}", name.split(':').next().unwrap_or(name))],
        size: 1 << 20,
        spec: Some(api::ImageSpec { image: name.to_string(), ..Default::default() }),
        ..Default::default()
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

fn exit(status: &mut api::ContainerStatus, code: i32, reason: &str) {
    status.state = api::ContainerState::ContainerExited as i32;
    status.exit_code = code;
    status.finished_at = now_nanos();
    status.reason = reason.to_string();
}

impl Runtime for MemoryRuntime {
    async fn version(&self) -> Result<api::VersionResponse> {
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "skiff-memory".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn image_status(&self, name: &str) -> Result<Option<api::Image>> {
        let mut s = self.lock();
        s.calls.push(format!("ImageStatus {name}"));
        Ok(s.images.get(name).cloned())
    }

    async fn pull_image(
        &self,
        name: &str,
        _auth: Option<api::AuthConfig>,
        _sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<String> {
        let mut s = self.lock();
        s.calls.push(format!("PullImage {name}"));
        if !s.pull_any && !s.pullable.contains_key(name) {
            return Err(Error::Failed(format!(
                "failed to pull and unpack image \"{name}\": not found"
            )));
        }
        let img = image(name);
        let id = img.id.clone();
        s.images.insert(name.to_string(), img);
        Ok(id)
    }

    async fn list_images(&self) -> Result<Vec<api::Image>> {
        Ok(self.lock().images.values().cloned().collect())
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> Result<String> {
        let mut s = self.lock();
        let id = Self::next_id(&mut s, "sb");
        s.calls.push(format!("RunPodSandbox {id}"));
        let n = s.next_ip;
        s.next_ip += 1;
        let ip = Ipv4Addr::from(s.ip_base + n);
        let status = api::PodSandboxStatus {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: api::PodSandboxState::SandboxReady as i32,
            created_at: now_nanos(),
            network: Some(api::PodSandboxNetworkStatus {
                ip: ip.to_string(),
                additional_ips: vec![],
            }),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            ..Default::default()
        };
        s.sandboxes.insert(id.clone(), status);
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.lock();
        s.calls.push(format!("StopPodSandbox {id}"));
        // CRI: stopping a sandbox that is gone is not an error.
        if let Some(sb) = s.sandboxes.get_mut(id) {
            sb.state = api::PodSandboxState::SandboxNotready as i32;
        }
        for rec in s.containers.values_mut().filter(|r| r.sandbox_id == id) {
            if rec.status.state == api::ContainerState::ContainerRunning as i32 {
                exit(&mut rec.status, 137, "Error");
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.lock();
        s.calls.push(format!("RemovePodSandbox {id}"));
        s.sandboxes.remove(id);
        s.containers.retain(|_, r| r.sandbox_id != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus> {
        let mut s = self.lock();
        *s.reads.entry("PodSandboxStatus").or_default() += 1;
        s.sandboxes.get(id).cloned().ok_or_else(|| Error::not_found("sandbox", id))
    }

    async fn list_pod_sandboxes(
        &self,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<api::PodSandbox>> {
        let mut s = self.lock();
        *s.reads.entry("ListPodSandbox").or_default() += 1;
        Ok(s.sandboxes
            .values()
            .filter(|sb| labels_match(&sb.labels, labels))
            .map(|sb| api::PodSandbox {
                id: sb.id.clone(),
                metadata: sb.metadata.clone(),
                state: sb.state,
                created_at: sb.created_at,
                labels: sb.labels.clone(),
                annotations: sb.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String> {
        let mut s = self.lock();
        match s.sandboxes.get(sandbox_id) {
            Some(sb) if sb.state == api::PodSandboxState::SandboxReady as i32 => {}
            Some(_) => return Err(Error::Failed(format!("sandbox {sandbox_id} is not ready"))),
            None => return Err(Error::not_found("sandbox", sandbox_id)),
        }
        let image_name = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        let Some(img) = s.images.get(&image_name).cloned() else {
            return Err(Error::Failed(format!("image \"{image_name}\" not present")));
        };
        let id = Self::next_id(&mut s, "ct");
        s.calls.push(format!("CreateContainer {id}"));
        let status = api::ContainerStatus {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: api::ContainerState::ContainerCreated as i32,
            created_at: now_nanos(),
            image: config.image.clone(),
            image_ref: img.id.clone(),
            image_id: img.id.clone(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_path: config.log_path.clone(),
            ..Default::default()
        };
        let behavior = (self.behavior.lock().unwrap_or_else(|e| e.into_inner()).clone())(&config);
        s.containers
            .insert(id.clone(), Record { sandbox_id: sandbox_id.to_string(), status, behavior });
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let mut s = self.lock();
        s.calls.push(format!("StartContainer {id}"));
        let rec = s.containers.get_mut(id).ok_or_else(|| Error::not_found("container", id))?;
        if rec.status.state != api::ContainerState::ContainerCreated as i32 {
            return Err(Error::Failed(format!("container {id} is not in created state")));
        }
        match rec.behavior.clone() {
            Behavior::Run => {
                rec.status.state = api::ContainerState::ContainerRunning as i32;
                rec.status.started_at = now_nanos();
            }
            Behavior::Exit(code) => {
                rec.status.started_at = now_nanos();
                exit(&mut rec.status, code, if code == 0 { "Completed" } else { "Error" });
            }
            Behavior::FailStart(message) => {
                exit(&mut rec.status, 128, "StartError");
                rec.status.message = message.clone();
                return Err(Error::Failed(message));
            }
        }
        Ok(())
    }

    async fn stop_container(&self, id: &str, _timeout_secs: i64) -> Result<()> {
        let mut s = self.lock();
        s.calls.push(format!("StopContainer {id}"));
        let rec = s.containers.get_mut(id).ok_or_else(|| Error::not_found("container", id))?;
        if rec.status.state == api::ContainerState::ContainerRunning as i32 {
            // Pretend the process honoured SIGTERM.
            exit(&mut rec.status, 143, "Error");
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut s = self.lock();
        s.calls.push(format!("RemoveContainer {id}"));
        s.containers.remove(id);
        s.usage.remove(id);
        Ok(())
    }

    async fn list_containers(
        &self,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<api::Container>> {
        let mut s = self.lock();
        *s.reads.entry("ListContainers").or_default() += 1;
        Ok(s.containers
            .iter()
            .filter(|(_, r)| labels_match(&r.status.labels, labels))
            .map(|(id, r)| api::Container {
                id: id.clone(),
                pod_sandbox_id: r.sandbox_id.clone(),
                metadata: r.status.metadata.clone(),
                image: r.status.image.clone(),
                image_ref: r.status.image_ref.clone(),
                state: r.status.state,
                created_at: r.status.created_at,
                labels: r.status.labels.clone(),
                annotations: r.status.annotations.clone(),
                image_id: r.status.image_id.clone(),
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        let mut s = self.lock();
        *s.reads.entry("ContainerStatus").or_default() += 1;
        s.containers
            .get(id)
            .map(|r| r.status.clone())
            .ok_or_else(|| Error::not_found("container", id))
    }

    async fn list_container_stats(&self) -> Result<Vec<api::ContainerStats>> {
        let mut s = self.lock();
        *s.reads.entry("ListContainerStats").or_default() += 1;
        let now = now_ms();
        let value = |value| Some(api::UInt64Value { value });
        Ok(s.containers
            .iter()
            .filter(|(_, r)| r.status.state == api::ContainerState::ContainerRunning as i32)
            .map(|(id, r)| {
                let (cpu_ns, working_set) = s.usage.get(id).map_or((0, 0), |u| {
                    let elapsed_ms = u64::try_from(now - u.since_ms).unwrap_or(0);
                    (u.nanocores * elapsed_ms / 1000, u.working_set_bytes)
                });
                api::ContainerStats {
                    attributes: Some(api::ContainerAttributes {
                        id: id.clone(),
                        metadata: r.status.metadata.clone(),
                        labels: r.status.labels.clone(),
                        annotations: r.status.annotations.clone(),
                    }),
                    cpu: Some(api::CpuUsage {
                        timestamp: now * 1_000_000,
                        usage_core_nano_seconds: value(cpu_ns),
                        usage_nano_cores: None,
                    }),
                    memory: Some(api::MemoryUsage {
                        timestamp: now * 1_000_000,
                        working_set_bytes: value(working_set),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        _timeout_secs: i64,
    ) -> Result<api::ExecSyncResponse> {
        let status = {
            let mut s = self.lock();
            s.calls.push(format!("ExecSync {id} {}", cmd.join(" ")));
            let rec = s.containers.get(id).ok_or_else(|| Error::not_found("container", id))?;
            if rec.status.state != api::ContainerState::ContainerRunning as i32 {
                return Err(Error::Failed(format!("container {id} is not running")));
            }
            rec.status.clone()
        };
        let hook = self.exec.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(hook(&status, &cmd))
    }

    async fn exec(&self, request: api::ExecRequest) -> Result<String> {
        let s = self.lock();
        if !s.containers.contains_key(&request.container_id) {
            return Err(Error::not_found("container", &request.container_id));
        }
        Err(Error::Failed("the in-memory runtime has no streaming server".into()))
    }
}

/// Wall-clock milliseconds since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
