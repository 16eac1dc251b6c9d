//! `skiff-bench controllers <skiff-server>...`: skiff-server with its controllers and
//! scheduler running, at 10,000 pods: how many watches each component opens (per resource)
//! and the server's RSS. With two or more builds, each runs on a fresh server in turn and
//! the last is compared with the first.
//!
//! Watches are counted from the audit log (Metadata level): every informer (a kube-runtime
//! watcher, shared or not) starts with a paginated list (`limit=500`, no `continue`), and
//! nothing else lists that way, so those requests per user agent and resource are the
//! watches each component opened. The pods are bound to one Node object (no agent runs), so
//! the scheduler leaves them alone and the pod garbage collector keeps them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::{ServerProcess, client, create_ns, free_port};

/// What one run measured.
struct Run {
    /// (component, resource) → informers opened.
    watches: BTreeMap<(String, String), usize>,
    rss_mb: f64,
}

impl Run {
    fn component_total(&self, component: &str) -> usize {
        self.watches.iter().filter(|((c, _), _)| c == component).map(|(_, n)| n).sum()
    }

    fn count(&self, component: &str, resource: &str) -> usize {
        self.watches.get(&(component.to_string(), resource.to_string())).copied().unwrap_or(0)
    }
}

const COMPONENTS: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];

pub async fn controllers_bench(bins: &[PathBuf], pods: usize) -> Result<()> {
    if bins.is_empty() {
        bail!("usage: skiff-bench controllers <skiff-server> [<skiff-server B> ...] [--pods N]");
    }
    let mut runs = Vec::new();
    for bin in bins {
        println!("== {} ({pods} pods)", bin.display());
        let run = one_run(bin, pods).await?;
        println!("{:<28} {:<32} {:>8}", "component", "resource", "watches");
        for ((component, resource), n) in &run.watches {
            println!("{component:<28} {resource:<32} {n:>8}");
        }
        for c in COMPONENTS {
            println!("{c:<28} {:<32} {:>8}", "(total)", run.component_total(c));
        }
        println!("{:<61} {:>8.1} MB", "server RSS", run.rss_mb);
        runs.push(run);
    }
    if let (Some(first), Some(last)) = (runs.first(), runs.last())
        && runs.len() > 1
    {
        println!("== last against first");
        for c in COMPONENTS {
            let (a, b) = (first.component_total(c), last.component_total(c));
            println!("{c:<28} watches {a:>4} -> {b:>4}");
        }
        let (a, b) = (first.count(COMPONENTS[0], "pods"), last.count(COMPONENTS[0], "pods"));
        println!("{:<28} Pod watches {a:>4} -> {b:>4}", COMPONENTS[0]);
        println!(
            "server RSS at {pods} pods: {:.1} MB -> {:.1} MB ({:.2}x)",
            first.rss_mb,
            last.rss_mb,
            last.rss_mb / first.rss_mb
        );
    }
    Ok(())
}

async fn one_run(bin: &Path, pods: usize) -> Result<Run> {
    let dir = tempfile::tempdir()?;
    let audit = dir.path().join("audit.log");
    let port = free_port();
    let child = Command::new(bin)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--audit-log-path")
        .arg(&audit)
        .args(["--audit-level", "Metadata"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let server = ServerProcess { child, kubeconfig: kubeconfig.clone(), dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        if Instant::now() > deadline {
            bail!("skiff-server did not write its kubeconfig");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = client(&server.kubeconfig).await?;
    load_pods(&client, pods).await?;
    // Controllers and the scheduler take in the 10k pods (their stores and queues), then
    // the figure settles: the last of a few samples a few seconds apart.
    let mut rss = 0.0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        rss = server.rss_mb();
    }
    Ok(Run { watches: informer_lists(&audit)?, rss_mb: rss })
}

/// Initial informer lists in the audit log: (user agent's program, else the user;
/// resource) → count.
pub(super) fn informer_lists(audit: &Path) -> Result<BTreeMap<(String, String), usize>> {
    let text = std::fs::read_to_string(audit).context("reading the audit log")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<Value>(line) else { continue };
        let uri = ev["requestURI"].as_str().unwrap_or_default();
        if ev["verb"] != "list" || !uri.contains("limit=500") || uri.contains("continue=") {
            continue;
        }
        // A client that sends no User-Agent is named by its user.
        let agent = ev["userAgent"].as_str().unwrap_or_default();
        let component = match agent.split('/').next().unwrap_or_default() {
            "" => ev["user"]["username"].as_str().unwrap_or("(unknown)").to_string(),
            program => program.to_string(),
        };
        let resource = ev["objectRef"]["resource"].as_str().unwrap_or_default();
        let group = ev["objectRef"]["apiGroup"].as_str().unwrap_or_default();
        let resource =
            if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
        *out.entry((component, resource)).or_insert(0) += 1;
    }
    Ok(out)
}

/// A core/v1 resource for the dynamic API.
pub(super) fn core(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A Node object no agent runs (`bench-node`, huge capacity), namespace `bench`, and `pods`
/// pods bound to that node, 32 creates in flight: nothing starts them, the pod garbage
/// collector keeps them, the scheduler leaves them alone.
pub(super) async fn load_pods(client: &kube::Client, pods: usize) -> Result<()> {
    let node: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "bench-node"},
        "status": {"capacity": {"cpu": "100000", "memory": "1000Ti", "pods": "1000000"}},
    }))?;
    Api::<DynamicObject>::all_with(client.clone(), &core("Node", "nodes"))
        .create(&PostParams::default(), &node)
        .await
        .context("the node")?;
    create_ns(client, "bench").await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "bench", &core("Pod", "pods"));
    let api = &api;
    let created = futures::stream::iter(0..pods)
        .map(|i| async move {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p-{i}"), "labels": {"app": format!("a{}", i % 100)}},
                "spec": {"nodeName": "bench-node",
                    "containers": [{"name": "c", "image": "skiff.local/busybox:1"}]},
            });
            let pod: DynamicObject = serde_json::from_value(pod)?;
            api.create(&PostParams::default(), &pod).await?;
            Ok::<(), anyhow::Error>(())
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        return Err(e.context("creating pods"));
    }
    Ok(())
}
