//! `skiff-bench lab-load <bin-dir>...`: a one-node lab (skiff-server, the node's containerd
//! and skiff-agent with its proxy and cluster DNS, as `cargo xtask up` runs them) taking
//! 100 Services and 10,000 Pods: the watches each process opens and the RSS of skiff-server
//! and of the agent, idle and loaded. With two or more build directories each gets a fresh
//! lab in turn and the last is compared with the first.
//!
//! - The lab is `skiff-lab up` from the build directory, under its own name, directories and
//!   segment (`lload`, /var/lib/skiff/lab-load*, 10.252.0.0/24), so a lab of `cargo xtask up`
//!   is left alone; it is taken down after each run, also when the run fails. Root only.
//! - skiff-server writes an audit log (Metadata level); watches are its informer-initial
//!   lists, counted as `skiff-bench controllers` counts them, per user agent (the user when
//!   a client sends none).
//! - The pods are bound to a Node object no agent runs: the agent holds them in its DNS and
//!   proxy watches but starts none. The Services select them, 100 pods each.
//! - RSS is VmRSS: idle once the node is Ready (after 10 s), loaded as the last of four
//!   samples 5 s apart after the last create.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::bench_controllers::{core, informer_lists, load_pods};
use super::{client, vm_rss_mb};

const NAME: &str = "lload";
const DIR: &str = "/var/lib/skiff/lab-load";
const SERVER_DIR: &str = "/var/lib/skiff/lab-load-server";
const SUBNET: &str = "10.252.0.0/24";
const SERVICES: usize = 100;

/// What one lab measured.
struct Run {
    /// (component, resource) → informers opened.
    watches: BTreeMap<(String, String), usize>,
    /// (process, idle MB, loaded MB).
    rss: Vec<(&'static str, f64, f64)>,
}

impl Run {
    fn total(&self, component: &str) -> usize {
        self.watches.iter().filter(|((c, _), _)| c == component).map(|(_, n)| n).sum()
    }

    fn components(&self) -> Vec<String> {
        let mut out: Vec<String> = self.watches.keys().map(|(c, _)| c.clone()).collect();
        out.dedup();
        out
    }
}

/// Takes the lab down when dropped, however the run ended.
struct LabGuard {
    lab: PathBuf,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        let status = Command::new(&self.lab).args(["down", "--dir", DIR]).status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("skiff-bench lab-load: `skiff-lab down --dir {DIR}` failed");
        }
    }
}

pub async fn lab_load_bench(bin_dirs: &[PathBuf], pods: usize) -> Result<()> {
    if bin_dirs.is_empty() {
        bail!("usage: skiff-bench lab-load <bin-dir> [<bin-dir B> ...] [--pods N]");
    }
    let mut runs = Vec::new();
    for dir in bin_dirs {
        println!("== {} ({pods} pods, {SERVICES} services)", dir.display());
        let run = one_run(dir, pods).await?;
        println!("{:<28} {:<60} {:>8}", "component", "resource", "watches");
        for ((component, resource), n) in &run.watches {
            println!("{component:<28} {resource:<60} {n:>8}");
        }
        for c in run.components() {
            println!("{c:<28} {:<60} {:>8}", "(total)", run.total(&c));
        }
        for (process, idle, loaded) in &run.rss {
            println!("{process:<28} RSS idle {idle:>8.1} MB, at {pods} pods {loaded:>8.1} MB");
        }
        runs.push(run);
    }
    if let (Some(first), Some(last)) = (runs.first(), runs.last())
        && runs.len() > 1
    {
        println!("== last against first");
        let mut components = first.components();
        components.extend(last.components());
        components.sort();
        components.dedup();
        for c in components {
            println!("{c:<40} watches {:>4} -> {:>4}", first.total(&c), last.total(&c));
        }
        for ((process, idle_a, a), (_, idle_b, b)) in first.rss.iter().zip(&last.rss) {
            println!(
                "{process:<14} RSS idle {idle_a:.1} -> {idle_b:.1} MB ({:.2}x), at {pods} pods {a:.1} -> {b:.1} MB ({:.2}x)",
                idle_b / idle_a,
                b / a
            );
        }
    }
    Ok(())
}

async fn one_run(bin_dir: &Path, pods: usize) -> Result<Run> {
    let lab = bin_dir.join("skiff-lab");
    if !lab.is_file() {
        bail!("{} not found (cargo build --workspace --bins builds it)", lab.display());
    }
    let audit = Path::new(DIR).join("audit.log");
    let _ = std::fs::remove_file(&audit);
    let guard = LabGuard { lab: lab.clone() };
    let out = Command::new(&lab)
        .args(["up", "--nodes", "1", "--name", NAME, "--dir", DIR, "--server-data-dir"])
        .arg(SERVER_DIR)
        .args(["--subnet", SUBNET, "--log-filter", "warn", "--bin-dir"])
        .arg(bin_dir)
        .arg(format!("--server-arg=--audit-log-path={}", audit.display()))
        .arg("--server-arg=--audit-level=Metadata")
        .output()
        .context("running skiff-lab up")?;
    if !out.status.success() {
        bail!("skiff-lab up failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let state: Value = serde_json::from_slice(
        &std::fs::read(Path::new(DIR).join("lab.json")).context("reading the lab record")?,
    )?;
    let pid = |v: &Value| v["pid"].as_u64().map(|p| p as u32);
    let server = pid(&state["server"]).context("the lab record names no server")?;
    let agent = pid(&state["nodes"][0]["agent"]).context("the lab record names no agent")?;
    let kubeconfig = PathBuf::from(state["kubeconfig"].as_str().context("no kubeconfig")?);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = [rss_mb(server)?, rss_mb(agent)?];

    let client = client(&kubeconfig).await?;
    load_pods(&client, pods).await?;
    let services: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "bench", &core("Service", "services"));
    let services = &services;
    let created = futures::stream::iter(0..SERVICES)
        .map(|i| async move {
            let svc: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("s-{i}")},
                "spec": {"selector": {"app": format!("a{i}")},
                         "ports": [{"port": 80, "targetPort": 8080}]},
            }))?;
            services.create(&PostParams::default(), &svc).await?;
            Ok::<(), anyhow::Error>(())
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        return Err(e.context("creating services"));
    }
    let mut loaded = [0.0, 0.0];
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        loaded = [rss_mb(server)?, rss_mb(agent)?];
    }
    let watches = informer_lists(&audit)?;
    drop(guard);
    Ok(Run {
        watches,
        rss: vec![("skiff-server", idle[0], loaded[0]), ("skiff-agent", idle[1], loaded[1])],
    })
}

/// VmRSS of a running process, in MB; an error when it is gone (it crashed under the load).
fn rss_mb(pid: u32) -> Result<f64> {
    vm_rss_mb(pid).with_context(|| format!("process {pid} is gone"))
}
