//! `cargo xtask bench agent`: pod start latency (API create → Running, as the API reports
//! it) over N pods on one node, and the agent's RSS.
//!
//! The apiserver runs in process; the runtime is either the in-memory runtime (the default:
//! measures the agent's own overhead — watch, sync, status writes), a real containerd the
//! bench starts itself (`--rig`: the testing rig's node — its own network namespace,
//! containerd, skiff-cni, the test images imported; needs root, containerd, runc and
//! busybox-static, and skiff-cni beside this binary or in `$SKIFF_CNI_BIN`), or an existing
//! containerd (`--containerd-socket PATH`, with `--image` present locally and the sandbox
//! image imported). Prints a table and writes JSON to `--out` (default
//! target/bench/agent.json).
//!
//! Targets (issue 6): p50 < 0.5 s, p99 < 1.5 s with containerd; upstream SLO p99 <= 5 s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use skiff_agent::config::AgentConfig;
use skiff_agent::runtime::cri::CriRuntime;
use skiff_agent::runtime::memory::MemoryRuntime;
use skiff_agent::runtime::{Result as RtResult, Runtime, api};
use skiff_agent::testing::{NodeRig, NodeRigConfig};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

struct Args {
    pods: usize,
    socket: Option<PathBuf>,
    image: String,
    out: PathBuf,
    concurrency: usize,
    rig: bool,
    no_cache: bool,
    serial: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        pods: 50,
        socket: None,
        image: "skiff.test/tools:1".into(),
        out: PathBuf::from("target/bench/agent.json"),
        concurrency: 1,
        rig: false,
        no_cache: false,
        serial: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--pods" => a.pods = value()?.parse()?,
            "--containerd-socket" => a.socket = Some(value()?.into()),
            "--image" => a.image = value()?,
            "--out" => a.out = value()?.into(),
            "--concurrency" => a.concurrency = value()?.parse()?,
            "--rig" => a.rig = true,
            "--no-cache" => a.no_cache = true,
            "--serial" => a.serial = true,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn measure<R: Runtime + Clone>(
    client: Client,
    runtime: R,
    a: &Args,
    root: PathBuf,
    cgroup_parent: String,
) -> Result<serde_json::Value> {
    let mut config = AgentConfig::new("bench-node")
        .with_node_ip("192.0.2.30".parse()?)
        .with_root_dir(root)
        .with_resources(64_000, 256 << 30);
    config.max_pods = (a.pods as u32 + 10).max(110);
    config.cgroup_parent = cgroup_parent;
    config.pod_cache = !a.no_cache;
    let runtime = Timed::new(runtime);
    let calls = runtime.calls.clone();
    config.host_conditions = false;
    skiff_agent::testing::seed_namespace(&client, "default").await;
    let agent = skiff_agent::agent::start(client.clone(), config, runtime).await?;
    let rss_idle = rss_kib();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Watch phases: the latency ends when the API says Running.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch_pods = pods.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher(watch_pods, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(p)) = s.next().await {
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                let _ = tx.send((p.name_any(), Instant::now()));
            }
        }
    });
    let mut created: HashMap<String, Instant> = HashMap::new();
    let mut running: HashMap<String, Instant> = HashMap::new();
    let start = Instant::now();
    let names: Vec<String> = (0..a.pods).map(|i| format!("bench-{i}")).collect();
    for chunk in names.chunks(a.concurrency.max(1)) {
        let posts = chunk.iter().map(|name| {
            let pods = pods.clone();
            let image = a.image.clone();
            async move {
                let pod: Pod =
                    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
                    "nodeName": "bench-node", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                                    "command": ["sleep", "3600"]}]}}))?;
                let t = Instant::now();
                pods.create(&PostParams::default(), &pod).await?;
                Ok::<_, anyhow::Error>((name.clone(), t))
            }
        });
        for r in futures::future::join_all(posts).await {
            let (n, t) = r?;
            created.insert(n, t);
        }
        // Serial: the next pod is created once these run (latency without queueing
        // behind other pods' sandbox creation).
        let deadline = Instant::now() + Duration::from_secs(60);
        while a.serial && chunk.iter().any(|n| !running.contains_key(n)) {
            match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
                Ok(Some((n, t))) => {
                    running.entry(n).or_insert(t);
                }
                _ => bail!("pods {chunk:?} did not reach Running within 60 s"),
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120 + a.pods as u64);
    while running.len() < a.pods && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
            Ok(Some((n, t))) => {
                running.entry(n).or_insert(t);
            }
            Ok(None) => break,
            Err(_) => {}
        }
    }
    let total = start.elapsed();
    let rss_loaded = rss_kib();
    let during = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    // Idle: what the agent asks the runtime per second with every pod running.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    let idle_calls_per_s = idle.values().map(Vec::len).sum::<usize>() as f64 / 3.0;
    let mut breakdown = serde_json::Map::new();
    let mut methods: Vec<_> = during.into_iter().collect();
    methods.sort_by(|a, b| a.0.cmp(b.0));
    for (m, mut d) in methods {
        d.sort();
        breakdown.insert(
            m.to_string(),
            json!({"calls": d.len(),
                   "p50_ms": percentile(&d, 0.5).as_secs_f64() * 1e3,
                   "p99_ms": percentile(&d, 0.99).as_secs_f64() * 1e3}),
        );
    }
    let mut lat: Vec<Duration> = running
        .iter()
        .filter_map(|(n, t)| created.get(n).map(|c| t.saturating_duration_since(*c)))
        .collect();
    lat.sort();
    for n in &names {
        let _ = pods.delete(n, &DeleteParams::default()).await;
    }
    let cleanup = Instant::now();
    while cleanup.elapsed() < Duration::from_secs(60) {
        if pods.list(&Default::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
    drop(agent);
    if running.len() < a.pods {
        bail!("only {} of {} pods reached Running", running.len(), a.pods);
    }
    Ok(json!({
        "pods": a.pods,
        "p50_ms": percentile(&lat, 0.50).as_secs_f64() * 1e3,
        "p90_ms": percentile(&lat, 0.90).as_secs_f64() * 1e3,
        "p99_ms": percentile(&lat, 0.99).as_secs_f64() * 1e3,
        "max_ms": lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        "all_running_s": total.as_secs_f64(),
        "rss_idle_kib": rss_idle,
        "rss_loaded_kib": rss_loaded,
        "pod_cache": !a.no_cache,
        "mode": if a.serial { "serial: each pod created once the previous runs" } else { "burst: all pods created back to back" },
        "idle_cri_calls_per_s": idle_calls_per_s,
        "cri_calls_while_starting": breakdown,
    }))
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await?;
    let client = api.client();
    let root = tempfile::tempdir()?;
    let root_dir = root.path().to_path_buf();
    let (mode, mut result) = match (&a.socket, a.rig) {
        (_, true) => {
            let rig = NodeRig::start(NodeRigConfig::default())
                .await
                .map_err(|e| anyhow::anyhow!("starting the node rig: {e:#?}"))?;
            let cri = CriRuntime::connect(rig.socket()).await?;
            let parent = rig.cgroup_parent().to_string();
            let r = measure(client, cri, &a, root_dir, parent).await;
            drop(rig);
            ("containerd", r?)
        }
        (Some(socket), false) => {
            let cri = CriRuntime::connect(socket).await?;
            ("containerd", measure(client, cri, &a, root_dir, String::new()).await?)
        }
        (None, false) => {
            let memory = MemoryRuntime::new();
            memory.add_image("skiff.test/pause:1");
            memory.add_image(&a.image);
            ("memory", measure(client, memory, &a, root_dir, String::new()).await?)
        }
    };
    result["runtime"] = json!(mode);
    result["note"] = json!("RSS is of the whole bench process (agent + in-process apiserver)");
    println!("agent pod start latency ({mode} runtime, {} pods)", a.pods);
    for k in [
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "all_running_s",
        "rss_idle_kib",
        "rss_loaded_kib",
        "pod_cache",
        "mode",
        "idle_cri_calls_per_s",
    ] {
        println!("  {k:<22} {}", result[k]);
    }
    println!("  CRI calls while the pods started (count, p50 ms, p99 ms):");
    if let Some(calls) = result["cri_calls_while_starting"].as_object() {
        for (m, v) in calls {
            println!(
                "    {m:<20} {:>6} {:>9.2} {:>9.2}",
                v["calls"],
                v["p50_ms"].as_f64().unwrap_or(0.0),
                v["p99_ms"].as_f64().unwrap_or(0.0)
            );
        }
    }
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_vec_pretty(&result)?)?;
    println!("written to {}", a.out.display());
    Ok(())
}

type CallLog = Arc<std::sync::Mutex<HashMap<&'static str, Vec<Duration>>>>;

/// The runtime under test, timing every call by method (where the pod start time goes).
#[derive(Clone)]
struct Timed<R> {
    inner: R,
    calls: CallLog,
}

impl<R> Timed<R> {
    fn new(inner: R) -> Self {
        Timed { inner, calls: Default::default() }
    }

    async fn time<T>(&self, method: &'static str, f: impl std::future::Future<Output = T>) -> T {
        let t = Instant::now();
        let out = f.await;
        let d = t.elapsed();
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).entry(method).or_default().push(d);
        out
    }
}

impl<R: Runtime> Runtime for Timed<R> {
    async fn version(&self) -> RtResult<api::VersionResponse> {
        self.time("Version", self.inner.version()).await
    }
    async fn image_status(&self, image: &str) -> RtResult<Option<api::Image>> {
        self.time("ImageStatus", self.inner.image_status(image)).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> RtResult<String> {
        self.time("PullImage", self.inner.pull_image(image, auth, sandbox)).await
    }
    async fn list_images(&self) -> RtResult<Vec<api::Image>> {
        self.time("ListImages", self.inner.list_images()).await
    }
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> RtResult<String> {
        self.time("RunPodSandbox", self.inner.run_pod_sandbox(config)).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> RtResult<()> {
        self.time("StopPodSandbox", self.inner.stop_pod_sandbox(id)).await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> RtResult<()> {
        self.time("RemovePodSandbox", self.inner.remove_pod_sandbox(id)).await
    }
    async fn pod_sandbox_status(&self, id: &str) -> RtResult<api::PodSandboxStatus> {
        self.time("PodSandboxStatus", self.inner.pod_sandbox_status(id)).await
    }
    async fn list_pod_sandboxes(
        &self,
        labels: &HashMap<String, String>,
    ) -> RtResult<Vec<api::PodSandbox>> {
        self.time("ListPodSandbox", self.inner.list_pod_sandboxes(labels)).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> RtResult<String> {
        self.time(
            "CreateContainer",
            self.inner.create_container(sandbox_id, config, sandbox_config),
        )
        .await
    }
    async fn start_container(&self, id: &str) -> RtResult<()> {
        self.time("StartContainer", self.inner.start_container(id)).await
    }
    async fn stop_container(&self, id: &str, timeout_secs: i64) -> RtResult<()> {
        self.time("StopContainer", self.inner.stop_container(id, timeout_secs)).await
    }
    async fn remove_container(&self, id: &str) -> RtResult<()> {
        self.time("RemoveContainer", self.inner.remove_container(id)).await
    }
    async fn list_containers(
        &self,
        labels: &HashMap<String, String>,
    ) -> RtResult<Vec<api::Container>> {
        self.time("ListContainers", self.inner.list_containers(labels)).await
    }
    async fn container_status(&self, id: &str) -> RtResult<api::ContainerStatus> {
        self.time("ContainerStatus", self.inner.container_status(id)).await
    }
    async fn list_container_stats(&self) -> RtResult<Vec<api::ContainerStats>> {
        self.time("ListContainerStats", self.inner.list_container_stats()).await
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> RtResult<api::ExecSyncResponse> {
        self.time("ExecSync", self.inner.exec_sync(id, cmd, timeout_secs)).await
    }
    async fn exec(&self, request: api::ExecRequest) -> RtResult<String> {
        self.time("Exec", self.inner.exec(request)).await
    }
}
