//! `skiff-bench scheduler <skiff-server> <out-dir>`: 1,000 Ready nodes created through the
//! API of a release skiff-server process, then 10,000 and 50,000 pods created through the
//! API (64 concurrent clients) and bound by (a) the skiff scheduler running out of process
//! over a kubeconfig client and (b) the baseline: a trivial round-robin binder with the
//! same watch and 64 bindings in flight but no filtering or scoring. Two modes each:
//! streaming (binder running while pods are created: pods/s create→bound and the p50/p99
//! create→bound latency) and backlog (all pods created first, then the binder starts:
//! pure binding throughput). A fresh server per run; its RSS is read at the end.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use skiff_control_plane::scheduler::{self, SchedulerConfig};

use super::{client, percentile, start_server};

const NODES: usize = 1000;
const CONCURRENCY: usize = 64;
const NS: &str = "bench";

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
}

async fn post(client: &Client, path: &str, body: &Value) -> Result<()> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)?;
    client.request_text(req).await.with_context(|| format!("POST {path}"))?;
    Ok(())
}

async fn patch_status(client: &Client, path: &str, body: &Value) -> Result<()> {
    let req = http::Request::patch(path)
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(body)?)?;
    client.request_text(req).await.with_context(|| format!("PATCH {path}"))?;
    Ok(())
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

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
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

fn pod(i: usize, scheduler_name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p-{i}"), "namespace": NS, "labels": {"app": "bench"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench",
                "uid": "00000000-0000-4000-8000-00000000be9c", "controller": true}]},
        "spec": {"schedulerName": scheduler_name,
            "containers": [{"name": "c", "image": "skiff.local/busybox:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})
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
            .applied_objects();
    stream
        .for_each_concurrent(CONCURRENCY, |obj| {
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

/// The binder under test, with its own client (as a separate process would have).
async fn start_binder(kubeconfig: &Path, binder: Binder) -> Result<tokio::task::JoinHandle<()>> {
    let sc = client(kubeconfig).await?;
    Ok(match binder {
        Binder::Skiff => {
            let config = SchedulerConfig {
                scheduled_events: std::env::var_os("SKIFF_BENCH_NO_EVENTS").is_none(),
                ..Default::default()
            };
            tokio::spawn(scheduler::run(sc, config))
        }
        Binder::RoundRobin => tokio::spawn(round_robin_binder(sc)),
    })
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
    create_nodes(&c).await?;

    // Bound times, seen by our own watch.
    let created: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; pods]));
    let bound: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(tokio::sync::Notify::new());
    let observer = {
        let bound = bound.clone();
        let done = done.clone();
        let stream = watcher(pods_api(&c, false), watcher::Config::default()).applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(obj) = stream.next().await {
                let Ok(obj) = obj else { continue };
                if bound_node(&obj).is_none() {
                    continue;
                }
                let mut b = bound.lock().unwrap_or_else(|e| e.into_inner());
                b.entry(obj.metadata.name.clone().unwrap_or_default()).or_insert_with(Instant::now);
                if b.len() >= pods {
                    done.notify_one();
                }
            }
        })
    };

    let scheduler_name = match binder {
        Binder::Skiff => "default-scheduler",
        Binder::RoundRobin => "round-robin",
    };
    let mut binder_task = None;
    if mode == Mode::Streaming {
        binder_task = Some(start_binder(&server.kubeconfig, binder).await?);
        tokio::time::sleep(Duration::from_millis(500)).await; // initial list and sync
    }
    let t0 = Instant::now();
    {
        let c = c.clone();
        let created = created.clone();
        let name = scheduler_name.to_string();
        parallel(pods, CONCURRENCY, move |i| {
            let (c, created, name) = (c.clone(), created.clone(), name.clone());
            async move {
                created.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(Instant::now());
                post(&c, &format!("/api/v1/namespaces/{NS}/pods"), &pod(i, &name)).await
            }
        })
        .await?;
    }
    let start = if mode == Mode::Backlog {
        let s = Instant::now();
        binder_task = Some(start_binder(&server.kubeconfig, binder).await?);
        s
    } else {
        t0
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
    let rss_mb = server.rss_mb();
    if let Some(t) = binder_task {
        t.abort();
    }
    observer.abort();
    if waited.is_err() {
        bail!(
            "{binder:?}/{mode:?}: only {} of {pods} pods bound in 600 s",
            bound.lock().map(|b| b.len()).unwrap_or(0)
        );
    }
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
    })
}

pub async fn scheduler_bench(server_bin: &Path, out_dir: &Path) -> Result<()> {
    let sizes: Vec<usize> = std::env::var("SKIFF_BENCH_PODS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 50_000]);
    let mut runs = Vec::new();
    for &pods in &sizes {
        for mode in [Mode::Streaming, Mode::Backlog] {
            for binder in [Binder::RoundRobin, Binder::Skiff] {
                eprintln!("scheduler bench: {binder:?} {mode:?} {pods} pods on {NODES} nodes ...");
                runs.push(run_one(server_bin, binder, mode, pods).await?);
            }
        }
    }
    println!("\nscheduler: {NODES} nodes, pods created through the API by {CONCURRENCY} clients");
    println!(
        "{:<12} {:<10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>14}",
        "binder", "mode", "pods", "pods/s", "p50 ms", "p99 ms", "RSS MB", "vs round-robin"
    );
    let mut json_runs = Vec::new();
    for r in &runs {
        let base = runs
            .iter()
            .find(|b| b.binder == Binder::RoundRobin && b.mode == r.mode && b.pods == r.pods)
            .map_or(f64::NAN, |b| r.pods_per_s / b.pods_per_s);
        println!(
            "{:<12} {:<10} {:>7} {:>10.0} {:>10.1} {:>10.1} {:>9.0} {:>13.2}x",
            format!("{:?}", r.binder),
            format!("{:?}", r.mode),
            r.pods,
            r.pods_per_s,
            r.p50_ms,
            r.p99_ms,
            r.rss_mb,
            base
        );
        json_runs.push(json!({"binder": format!("{:?}", r.binder), "mode": format!("{:?}", r.mode), "pods": r.pods,
            "pods_per_s": r.pods_per_s, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "server_rss_mb": r.rss_mb,
            "ratio_vs_round_robin": base}));
    }
    println!(
        "target: >= 5,000 pods/s (upstream scheduler_perf thresholds 680-810 pods/s at 5,000 nodes)"
    );
    std::fs::create_dir_all(out_dir)?;
    let path = out_dir.join("scheduler.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(
            &json!({"nodes": NODES, "clients": CONCURRENCY, "runs": json_runs}),
        )?,
    )?;
    println!("JSON: {}", path.display());
    Ok(())
}
