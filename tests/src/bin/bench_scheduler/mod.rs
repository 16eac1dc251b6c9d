//! `skiff-bench scheduler <skiff-server> <out-dir>`: 1,000 Ready nodes created through the
//! API of a release skiff-server process, then 10,000 and 50,000 pods created through the
//! API (64 concurrent clients) and bound by (a) the skiff scheduler running out of process
//! over a kubeconfig client and (b) the baseline: a trivial round-robin binder with the
//! same watch and as many bindings in flight (256) but no filtering or scoring. Two modes each:
//! streaming (binder running while pods are created: pods/s create→bound and the p50/p99
//! create→bound latency) and backlog (all pods created first, then the binder starts:
//! pure binding throughput). A fresh server per run; its RSS is read at the end.
//!
//! The harness reports its own costs: the binder under test runs on its own tokio runtime
//! (threads named `binder`), so the CPU time of the server process, of the binder and of
//! the rest of this process (pod creators and the bound-detection watch) over the measured
//! window is printed as CPU µs per pod. The creators send pre-rendered JSON; the
//! bound-detection watch asks only for bound pods (`fieldSelector=spec.nodeName!=`) and
//! parses only their name and node.
//!
//! `SKIFF_BENCH_PODS=2000,5000` sets the pod counts, `SKIFF_BENCH_NO_EVENTS` turns the
//! scheduler's Scheduled events off, `SKIFF_BENCH_SIMNODES` runs skiff's simulated nodes
//! (Lease heartbeats, bound pods marked Running) instead of static Ready nodes, `SKIFF_BENCH_EVENT_WRITERS=4` sets how many of them
//! it writes at once (default 1), `SKIFF_BENCH_BINDERS=skiff` runs only the skiff
//! scheduler (no round-robin baseline), `SKIFF_BENCH_MODES=backlog` only one mode.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::WatchEvent;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde_json::{Value, json};
use skiff_agent::simulate::{self, SimulateConfig};
use skiff_scheduler::{self as scheduler, SchedulerConfig};

use super::{client, percentile, start_server};

const NODES: usize = 1000;
const CONCURRENCY: usize = 64;
const NS: &str = "bench";
/// Name prefix of the binder runtime's threads (their CPU time is the binder's cost).
const BINDER_THREAD: &str = "binder";
/// Name prefix of the simulated nodes' runtime threads (`SKIFF_BENCH_SIMNODES`).
const SIM_THREAD: &str = "simnodes";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Binder {
    Skiff,
    RoundRobin,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Streaming,
    Backlog,
}

struct Run {
    binder: Binder,
    mode: Mode,
    pods: usize,
    pods_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_mb: f64,
    /// CPU µs per pod over the measured window: server, binder, simulated nodes, rest of
    /// the harness.
    cpu_us: Cpu,
    /// Scheduled events: seconds after the last binding until every pod had one, and the
    /// CPU µs per pod until then (None: not recorded in this run).
    events: Option<EventsDone>,
}

#[derive(Clone, Copy, Debug)]
struct EventsDone {
    lag_s: f64,
    cpu_us: Cpu,
}

/// Events in the bench namespace: one `limit=1` LIST (the rest is `remainingItemCount`).
async fn count_events(c: &Client) -> Result<usize> {
    let req =
        http::Request::get(format!("/api/v1/namespaces/{NS}/events?limit=1")).body(Vec::new())?;
    let list: Value = serde_json::from_str(&c.request_text(req).await?)?;
    let items = list["items"].as_array().map_or(0, Vec::len);
    let rest = list["metadata"]["remainingItemCount"].as_u64().unwrap_or(0) as usize;
    Ok(items + rest)
}

#[derive(Clone, Copy, Default, Debug)]
struct Cpu {
    server: f64,
    binder: f64,
    sim: f64,
    harness: f64,
}

/// utime + stime of a /proc/<..>/stat file, in seconds.
pub(crate) fn stat_cpu(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(14) + ticks(15)) / 100.0 // USER_HZ is 100 on Linux
}

/// CPU seconds of the server, the binder threads, the simulated nodes' threads and the
/// rest of this process at one instant.
fn cpu_now(server_pid: u32) -> Cpu {
    let total = stat_cpu("/proc/self/stat");
    let (mut binder, mut sim) = (0.0, 0.0);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let dir = t.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.starts_with(BINDER_THREAD) {
                binder += stat_cpu(&dir.join("stat").to_string_lossy());
            } else if comm.starts_with(SIM_THREAD) {
                sim += stat_cpu(&dir.join("stat").to_string_lossy());
            }
        }
    }
    Cpu {
        server: stat_cpu(&format!("/proc/{server_pid}/stat")),
        binder,
        sim,
        harness: total - binder - sim,
    }
}

impl Cpu {
    /// µs per pod from `self` to `later`.
    fn per_pod(&self, later: &Cpu, pods: usize) -> Cpu {
        let f = |a: f64, b: f64| (b - a) * 1e6 / pods as f64;
        Cpu {
            server: f(self.server, later.server),
            binder: f(self.binder, later.binder),
            sim: f(self.sim, later.sim),
            harness: f(self.harness, later.harness),
        }
    }
}

async fn send(
    client: &Client,
    method: http::Method,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> Result<()> {
    let req =
        http::Request::builder().method(method).uri(path).header("content-type", ct).body(body)?;
    client.request_text(req).await.with_context(|| path.to_string())?;
    Ok(())
}

async fn post(client: &Client, path: &str, body: &Value) -> Result<()> {
    send(client, http::Method::POST, path, "application/json", serde_json::to_vec(body)?).await
}

async fn patch_status(client: &Client, path: &str, body: &Value) -> Result<()> {
    let body = serde_json::to_vec(body)?;
    send(client, http::Method::PATCH, path, "application/merge-patch+json", body).await
}

/// Run `f(i)` for i in 0..total with `concurrency` workers.
async fn parallel<F, Fut>(total: usize, concurrency: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let next = next.clone();
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                f(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Static and simulated nodes are named alike (`simulate` names them `{prefix}-{i}`).
fn node_name(i: usize) -> String {
    format!("node-{i}")
}

async fn create_nodes(client: &Client) -> Result<()> {
    let c = client.clone();
    parallel(NODES, CONCURRENCY, move |i| {
        let c = c.clone();
        async move {
            let name = node_name(i);
            let status = json!({
                "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            });
            let node = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
                "spec": {}, "status": status});
            post(&c, "/api/v1/nodes", &node).await?;
            patch_status(&c, &format!("/api/v1/nodes/{name}/status"), &json!({"status": status})).await
        }
    })
    .await
}

/// The JSON of pod `p-{i}` (rendered once as a template: the creators' cost stays small).
fn pod_template(scheduler_name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p-@I@", "namespace": NS, "labels": {"app": "bench"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench",
                "uid": "00000000-0000-4000-8000-00000000be9c", "controller": true}]},
        "spec": {"schedulerName": scheduler_name,
            "containers": [{"name": "c", "image": "skiff.local/busybox:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})
    .to_string()
}

fn pod_body(template: &str, i: usize) -> Vec<u8> {
    template.replacen("@I@", &i.to_string(), 1).into_bytes()
}

fn pods_api(client: &Client, all: bool) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods");
    if all {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), NS, &ar)
    }
}

fn bound_node(obj: &DynamicObject) -> Option<&str> {
    obj.data.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty())
}

/// The baseline: bind every pending pod of `scheduler_name` to the next node, round robin.
async fn round_robin_binder(client: Client) {
    let next = AtomicUsize::new(0);
    let stream =
        watcher(pods_api(&client, true), watcher::Config::default().fields("spec.nodeName="))
            .default_backoff()
            .applied_objects();
    stream
        .for_each_concurrent(SchedulerConfig::default().parallel_binds, |obj| {
            let client = client.clone();
            let next = &next;
            async move {
                let Ok(obj) = obj else { return };
                if bound_node(&obj).is_some() {
                    return;
                }
                let name = obj.metadata.name.clone().unwrap_or_default();
                let node = node_name(next.fetch_add(1, Ordering::Relaxed) % NODES);
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": NS},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                let _ = post(&client, &format!("/api/v1/namespaces/{NS}/pods/{name}/binding"), &binding).await;
            }
        })
        .await;
}

/// A runtime of its own (so its threads' CPU time can be told apart), shut down on drop.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn new(name: &str, threads: usize) -> Result<OwnRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(OwnRuntime(Some(rt)))
    }

    fn handle(&self) -> Result<&tokio::runtime::Runtime> {
        self.0.as_ref().context("runtime already shut down")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The binder under test on its own runtime (threads named [`BINDER_THREAD`]), with its
/// own client (as a separate process would have).
async fn start_binder(kubeconfig: &Path, binder: Binder) -> Result<OwnRuntime> {
    let own = OwnRuntime::new(BINDER_THREAD, 2)?;
    let rt = own.handle()?;
    let kubeconfig = kubeconfig.to_path_buf();
    let sc = rt.spawn(async move { client(&kubeconfig).await }).await??;
    match binder {
        Binder::Skiff => {
            let mut config = SchedulerConfig {
                scheduled_events: std::env::var_os("SKIFF_BENCH_NO_EVENTS").is_none(),
                ..Default::default()
            };
            if let Some(n) =
                std::env::var("SKIFF_BENCH_EVENT_WRITERS").ok().and_then(|n| n.parse().ok())
            {
                config.events.writers = n;
            }
            rt.spawn(scheduler::run(sc, config));
        }
        Binder::RoundRobin => {
            rt.spawn(round_robin_binder(sc));
        }
    }
    Ok(own)
}

/// `SKIFF_BENCH_SIMNODES`: the nodes are `skiff-lab simulate` nodes (the real agent over
/// its in-memory runtime: Lease heartbeats, bound pods run and reported Running, more
/// writes per pod) on a runtime of their own.
async fn start_simnodes(kubeconfig: &Path) -> Result<OwnRuntime> {
    let own = OwnRuntime::new(SIM_THREAD, 1)?;
    let kubeconfig = kubeconfig.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<()>>();
    own.handle()?.spawn(async move {
        let config = SimulateConfig {
            cpu_millis: 32_000,
            memory_bytes: 128 << 30,
            ..SimulateConfig::default()
                .with_nodes(NODES)
                .with_prefix("node")
                .with_zones(&["zone-0", "zone-1", "zone-2"])
        };
        let started = match client(&kubeconfig).await {
            Ok(c) => simulate::start(c, config).await.map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        match started {
            Ok(sim) => {
                let _ = tx.send(Ok(()));
                // Serve until the runtime is shut down.
                std::future::pending::<()>().await;
                drop(sim);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    rx.await.context("simulated nodes did not start")??;
    Ok(own)
}

/// What the bound-detection watch reads of a pod.
#[derive(Clone, Deserialize)]
struct BoundPod {
    metadata: BoundMeta,
    spec: Option<BoundSpec>,
}

#[derive(Clone, Deserialize)]
struct BoundMeta {
    name: Option<String>,
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Clone, Deserialize)]
struct BoundSpec {
    #[serde(rename = "nodeName")]
    node_name: Option<String>,
}

/// Watch the bound pods of the bench namespace from `rv` on, recording when each was first
/// seen bound; reconnects from the last resourceVersion seen.
async fn observe_bound(
    c: Client,
    mut rv: String,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
    pods: usize,
    done: Arc<tokio::sync::Notify>,
) {
    loop {
        let path = format!(
            "/api/v1/namespaces/{NS}/pods?watch=true&allowWatchBookmarks=true&fieldSelector=spec.nodeName%21%3D&resourceVersion={rv}&timeoutSeconds=900"
        );
        let Ok(req) = http::Request::get(path).body(Vec::new()) else { return };
        let stream = match c.request_events::<BoundPod>(req).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bound watch: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let pod = match ev {
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => p,
                Ok(WatchEvent::Bookmark(b)) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                Ok(WatchEvent::Deleted(_)) => continue,
                Ok(WatchEvent::Error(e)) => {
                    eprintln!("bound watch: {e:?}");
                    break;
                }
                Err(e) => {
                    eprintln!("bound watch: {e}");
                    break;
                }
            };
            if let Some(v) = pod.metadata.resource_version {
                rv = v;
            }
            if pod.spec.and_then(|s| s.node_name).is_none_or(|n| n.is_empty()) {
                continue;
            }
            let mut b = bound.lock().unwrap_or_else(|e| e.into_inner());
            b.entry(pod.metadata.name.unwrap_or_default()).or_insert_with(Instant::now);
            if b.len() >= pods {
                done.notify_one();
            }
        }
    }
}

async fn run_one(server_bin: &Path, binder: Binder, mode: Mode, pods: usize) -> Result<Run> {
    let server = start_server(server_bin).await?;
    let c = client(&server.kubeconfig).await?;
    post(
        &c,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await?;
    let simnodes = if std::env::var_os("SKIFF_BENCH_SIMNODES").is_some() {
        Some(start_simnodes(&server.kubeconfig).await?)
    } else {
        create_nodes(&c).await?;
        None
    };

    // Bound times, seen by our own watch (from the empty namespace's resourceVersion on).
    let rv = {
        let req = http::Request::get(format!("/api/v1/namespaces/{NS}/pods")).body(Vec::new())?;
        let list: Value = serde_json::from_str(&c.request_text(req).await?)?;
        list["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string()
    };
    let created: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; pods]));
    let bound: Arc<Mutex<HashMap<String, Instant>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(pods)));
    let done = Arc::new(tokio::sync::Notify::new());
    let observer = tokio::spawn(observe_bound(c.clone(), rv, bound.clone(), pods, done.clone()));

    let scheduler_name = match binder {
        Binder::Skiff => "default-scheduler",
        Binder::RoundRobin => "round-robin",
    };
    let mut binder_rt = None;
    if mode == Mode::Streaming {
        binder_rt = Some(start_binder(&server.kubeconfig, binder).await?);
        tokio::time::sleep(Duration::from_millis(500)).await; // initial list and sync
    }
    let t0 = Instant::now();
    let cpu0 = cpu_now(server.pid());
    {
        let c = c.clone();
        let created = created.clone();
        let template = Arc::new(pod_template(scheduler_name));
        parallel(pods, CONCURRENCY, move |i| {
            let (c, created, template) = (c.clone(), created.clone(), template.clone());
            async move {
                let body = pod_body(&template, i);
                created.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(Instant::now());
                let path = format!("/api/v1/namespaces/{NS}/pods");
                send(&c, http::Method::POST, &path, "application/json", body).await
            }
        })
        .await?;
    }
    let (start, cpu0) = if mode == Mode::Backlog {
        let s = Instant::now();
        let cpu = cpu_now(server.pid());
        binder_rt = Some(start_binder(&server.kubeconfig, binder).await?);
        (s, cpu)
    } else {
        (t0, cpu0)
    };
    let waited = tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            let notified = done.notified();
            if bound.lock().unwrap_or_else(|e| e.into_inner()).len() >= pods {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    })
    .await;
    let cpu1 = cpu_now(server.pid());
    let rss_mb = server.rss_mb();
    observer.abort();
    if waited.is_err() {
        bail!(
            "{binder:?}/{mode:?}: only {} of {pods} pods bound in 600 s",
            bound.lock().map(|b| b.len()).unwrap_or(0)
        );
    }
    // The Scheduled events follow the bindings: wait for all of them (the binder keeps
    // running meanwhile) and report how long after the last binding that was.
    let mut events = None;
    if binder == Binder::Skiff && std::env::var_os("SKIFF_BENCH_NO_EVENTS").is_none() {
        let until = Instant::now() + Duration::from_secs(300);
        loop {
            let n = count_events(&c).await?;
            if n >= pods {
                let now = Instant::now();
                let cpu = cpu_now(server.pid());
                let last = bound.lock().unwrap_or_else(|e| e.into_inner()).values().max().copied();
                events = Some(EventsDone {
                    lag_s: last.map_or(0.0, |l| now.duration_since(l).as_secs_f64()),
                    cpu_us: cpu0.per_pod(&cpu, pods),
                });
                break;
            }
            if Instant::now() > until {
                eprintln!("only {n} of {pods} Scheduled events written 300 s after the bindings");
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    drop(binder_rt);
    drop(simnodes);
    let bound = bound.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let created = created.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let last = bound.values().max().copied().context("no pod bound")?;
    let mut lat: Vec<f64> = (0..pods)
        .filter_map(|i| {
            let b = bound.get(&format!("p-{i}"))?;
            let from = if mode == Mode::Backlog { start } else { created[i]? };
            Some(b.saturating_duration_since(from).as_secs_f64() * 1000.0)
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    Ok(Run {
        binder,
        mode,
        pods,
        pods_per_s: pods as f64 / last.duration_since(start).as_secs_f64(),
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        rss_mb,
        cpu_us: cpu0.per_pod(&cpu1, pods),
        events,
    })
}

fn env_list(name: &str) -> Option<Vec<String>> {
    let v = std::env::var(name).ok()?;
    Some(v.split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()).collect())
}

pub async fn scheduler_bench(server_bin: &Path, out_dir: &Path) -> Result<()> {
    let sizes: Vec<usize> = env_list("SKIFF_BENCH_PODS")
        .map(|l| l.iter().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 50_000]);
    let binders: Vec<Binder> = env_list("SKIFF_BENCH_BINDERS").map_or_else(
        || vec![Binder::RoundRobin, Binder::Skiff],
        |l| {
            [Binder::RoundRobin, Binder::Skiff]
                .into_iter()
                .filter(|b| l.contains(&format!("{b:?}").to_ascii_lowercase()))
                .collect()
        },
    );
    let modes: Vec<Mode> = env_list("SKIFF_BENCH_MODES").map_or_else(
        || vec![Mode::Streaming, Mode::Backlog],
        |l| {
            [Mode::Streaming, Mode::Backlog]
                .into_iter()
                .filter(|m| l.contains(&format!("{m:?}").to_ascii_lowercase()))
                .collect()
        },
    );
    let mut runs = Vec::new();
    for &pods in &sizes {
        for &mode in &modes {
            for &binder in &binders {
                eprintln!("scheduler bench: {binder:?} {mode:?} {pods} pods on {NODES} nodes ...");
                runs.push(run_one(server_bin, binder, mode, pods).await?);
            }
        }
    }
    let events = if std::env::var_os("SKIFF_BENCH_NO_EVENTS").is_some() {
        "without Scheduled events"
    } else {
        "with Scheduled events"
    };
    println!(
        "\nscheduler: {NODES} nodes, pods created through the API by {CONCURRENCY} clients, skiff scheduler {events}"
    );
    println!(
        "{:<12} {:<10} {:>7} {:>8} {:>8} {:>8} {:>7} {:>8} | {:>7} {:>7} {:>7} {:>7}",
        "binder",
        "mode",
        "pods",
        "pods/s",
        "p50 ms",
        "p99 ms",
        "RSS MB",
        "vs RR",
        "server",
        "binder",
        "simnode",
        "harness"
    );
    let mut json_runs = Vec::new();
    for r in &runs {
        let base = runs
            .iter()
            .find(|b| b.binder == Binder::RoundRobin && b.mode == r.mode && b.pods == r.pods)
            .map_or(f64::NAN, |b| r.pods_per_s / b.pods_per_s);
        let c = r.cpu_us;
        println!(
            "{:<12} {:<10} {:>7} {:>8.0} {:>8.1} {:>8.1} {:>7.0} {:>7.2}x | {:>7.0} {:>7.0} {:>7.0} {:>7.0}",
            format!("{:?}", r.binder),
            format!("{:?}", r.mode),
            r.pods,
            r.pods_per_s,
            r.p50_ms,
            r.p99_ms,
            r.rss_mb,
            base,
            c.server,
            c.binder,
            c.sim,
            c.harness,
        );
        if let Some(e) = r.events {
            let c = e.cpu_us;
            println!(
                "{:>72} | {:>7.0} {:>7.0} {:>7.0} {:>7.0}",
                format!(
                    "  Scheduled events all written {:.1} s after the last binding; until then:",
                    e.lag_s
                ),
                c.server,
                c.binder,
                c.sim,
                c.harness
            );
        }
        let cpu = |c: Cpu| json!({"server": c.server, "binder": c.binder, "simnodes": c.sim, "harness": c.harness});
        json_runs.push(json!({"binder": format!("{:?}", r.binder), "mode": format!("{:?}", r.mode), "pods": r.pods,
            "pods_per_s": r.pods_per_s, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "server_rss_mb": r.rss_mb,
            "ratio_vs_round_robin": base, "cpu_us_per_pod": cpu(c),
            "scheduled_events_done": r.events.map(|e| json!({"after_last_binding_s": e.lag_s,
                "cpu_us_per_pod": cpu(e.cpu_us)}))}));
    }
    println!(
        "target: >= 5,000 pods/s (upstream scheduler_perf thresholds 680-810 pods/s at 5,000 nodes)"
    );
    println!(
        "CPU µs per pod (right): over the measured window (streaming: creation included; backlog: binding only); the machine has {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    std::fs::create_dir_all(out_dir)?;
    let path = out_dir.join("scheduler.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(
            &json!({"nodes": NODES, "clients": CONCURRENCY, "scheduled_events": events, "runs": json_runs}),
        )?,
    )?;
    println!("JSON: {}", path.display());
    Ok(())
}
