//! `cargo xtask bench cni`: skiff-cni ADD and DEL latency (p50/p99), one at a time and 50
//! in parallel, with the plugin run as libcni runs it (env + stdin, in a node namespace),
//! side by side with the reference `ptp` + `host-local` plugins (Debian package
//! `containernetworking-plugins`, the closest upstream layout: routed veth, file IPAM) in
//! the same run, with the ratio. Everything happens in network namespaces this benchmark
//! creates and removes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

const SEQUENTIAL: usize = 200;
const PARALLEL: usize = 50;
const PARALLEL_ROUNDS: usize = 4;
/// Where Debian installs the reference plugins.
const REFERENCE_DIR: &str = "/usr/lib/cni";

/// One plugin under test: its binary, CNI_PATH and configuration.
struct Subject {
    label: &'static str,
    bin: PathBuf,
    cni_path: PathBuf,
    config: String,
}

/// Named network namespaces (a node and its pods) deleted on drop, and the IPAM dir.
struct Rig {
    node: String,
    pods: Vec<String>,
    data_dir: PathBuf,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for ns in self.pods.iter().chain(std::iter::once(&self.node)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

impl Rig {
    fn new(label: &str, pods: usize) -> Result<Self> {
        let tag = std::process::id();
        let mut rig = Rig {
            node: format!("skb{tag}{label}-node"),
            pods: Vec::new(),
            data_dir: std::env::temp_dir().join(format!("skiff-cni-bench-{tag}-{label}")),
        };
        ip(&["netns", "add", &rig.node])?;
        ip(&["-n", &rig.node, "link", "set", "lo", "up"])?;
        ip(&["-n", &rig.node, "addr", "add", "10.250.0.1/32", "dev", "lo"])?;
        for i in 0..pods {
            let name = format!("skb{tag}{label}-p{i}");
            ip(&["netns", "add", &name])?;
            rig.pods.push(name);
        }
        Ok(rig)
    }
}

/// Both subjects speak 1.0.0 (the reference plugins' newest).
fn skiff(bin: PathBuf, data_dir: &Path) -> Subject {
    let cni_path = bin.parent().unwrap_or(Path::new("/")).to_path_buf();
    let config = format!(
        r#"{{"cniVersion":"1.0.0","name":"bench","type":"skiff-cni","podCIDR":"10.244.0.0/22","dataDir":"{}","mtu":1500}}"#,
        data_dir.display()
    );
    Subject { label: "skiff-cni", bin, cni_path, config }
}

fn reference(data_dir: &Path) -> Subject {
    let config = format!(
        r#"{{"cniVersion":"1.0.0","name":"bench","type":"ptp","mtu":1500,"ipam":{{"type":"host-local","subnet":"10.244.0.0/22","dataDir":"{}"}}}}"#,
        data_dir.display()
    );
    Subject {
        label: "ptp+host-local",
        bin: Path::new(REFERENCE_DIR).join("ptp"),
        cni_path: REFERENCE_DIR.into(),
        config,
    }
}

/// One plugin invocation; returns its wall time.
fn invoke(subject: &Subject, node: &str, cmd: &str, cid: &str, pod: &str) -> Result<Duration> {
    let start = Instant::now();
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{node}"))
        .arg(&subject.bin)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", format!("/run/netns/{pod}"))
        .env("CNI_PATH", &subject.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning nsenter <plugin>")?;
    child.stdin.take().context("plugin stdin")?.write_all(subject.config.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    if !out.status.success() {
        bail!(
            "{} {cmd} {cid} failed: {}{}",
            subject.label,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

#[derive(Debug)]
struct Stats {
    subject: &'static str,
    op: &'static str,
    mode: &'static str,
    n: usize,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

fn stats(
    subject: &'static str,
    op: &'static str,
    mode: &'static str,
    mut v: Vec<Duration>,
) -> Stats {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: f64| ms(v[((v.len() as f64 - 1.0) * p).round() as usize]);
    Stats {
        subject,
        op,
        mode,
        n: v.len(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        mean_ms: v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64,
    }
}

/// ADD/DEL alone, then 50 at once (released together by a barrier), for one subject.
fn measure(subject: &Subject, rig: &Rig) -> Result<Vec<Stats>> {
    let node = &rig.node;
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..SEQUENTIAL {
        let pod = &rig.pods[i % rig.pods.len()];
        let cid = format!("seq-{i}");
        adds.push(invoke(subject, node, "ADD", &cid, pod)?);
        dels.push(invoke(subject, node, "DEL", &cid, pod)?);
    }
    let l = subject.label;
    let mut table = vec![stats(l, "ADD", "alone", adds), stats(l, "DEL", "alone", dels)];
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for round in 0..PARALLEL_ROUNDS {
        let barrier = Arc::new(Barrier::new(rig.pods.len()));
        let results: Vec<Result<(Duration, Duration)>> = std::thread::scope(|s| {
            let handles: Vec<_> = rig
                .pods
                .iter()
                .enumerate()
                .map(|(i, pod)| {
                    let barrier = barrier.clone();
                    s.spawn(move || -> Result<(Duration, Duration)> {
                        let cid = format!("par-{round}-{i}");
                        barrier.wait();
                        let add = invoke(subject, node, "ADD", &cid, pod);
                        barrier.wait();
                        let del = invoke(subject, node, "DEL", &cid, pod);
                        Ok((add?, del?))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("bench thread panicked"))))
                .collect()
        });
        for r in results {
            let (a, d) = r?;
            adds.push(a);
            dels.push(d);
        }
    }
    table.push(stats(l, "ADD", "50 parallel", adds));
    table.push(stats(l, "DEL", "50 parallel", dels));
    Ok(table)
}

pub fn bench(root: &Path) -> Result<()> {
    let bin = build(root)?;
    let rig = Rig::new("s", PARALLEL)?;
    let mut table = measure(&skiff(bin, &rig.data_dir), &rig)?;
    drop(rig);
    if Path::new(REFERENCE_DIR).join("ptp").exists() {
        let rig = Rig::new("r", PARALLEL)?;
        table.extend(measure(&reference(&rig.data_dir), &rig)?);
    } else {
        eprintln!(
            "bench cni: {REFERENCE_DIR}/ptp not found (apt-get install containernetworking-plugins): no comparison"
        );
    }

    println!(
        "{:<15} {:<4} {:<12} {:>4} {:>8} {:>8} {:>8} {:>10}",
        "plugin", "op", "mode", "n", "p50 ms", "p99 ms", "mean ms", "p50/ref"
    );
    let reference_p50 = |op: &str, mode: &str| {
        table
            .iter()
            .find(|r| r.subject != "skiff-cni" && r.op == op && r.mode == mode)
            .map(|r| r.p50_ms)
    };
    let mut json = Vec::new();
    for s in &table {
        let ratio = match reference_p50(s.op, s.mode) {
            Some(r) if s.subject == "skiff-cni" && r > 0.0 => Some(s.p50_ms / r),
            _ => None,
        };
        println!(
            "{:<15} {:<4} {:<12} {:>4} {:>8.2} {:>8.2} {:>8.2} {:>10}",
            s.subject,
            s.op,
            s.mode,
            s.n,
            s.p50_ms,
            s.p99_ms,
            s.mean_ms,
            ratio.map(|r| format!("{r:.2}x")).unwrap_or_default()
        );
        json.push(format!(
            r#"{{"plugin":"{}","op":"{}","mode":"{}","n":{},"p50_ms":{:.3},"p99_ms":{:.3},"mean_ms":{:.3},"p50_ratio_to_reference":{}}}"#,
            s.subject,
            s.op,
            s.mode,
            s.n,
            s.p50_ms,
            s.p99_ms,
            s.mean_ms,
            ratio.map(|r| format!("{r:.3}")).unwrap_or_else(|| "null".into())
        ));
    }
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join("cni.json");
    std::fs::write(&path, format!("{{\"benchmark\":\"cni\",\"results\":[{}]}}\n", json.join(",")))?;
    println!("wrote {}", path.display());
    Ok(())
}
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    ensure!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
fn build(root: &Path) -> Result<PathBuf> {
    crate::process::run(crate::process::cargo().current_dir(root).args([
        "build",
        "--release",
        "-p",
        "skiff-cni",
        "--bin",
        "skiff-cni",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release/skiff-cni");
    ensure!(bin.exists(), "{} not built", bin.display());
    Ok(bin)
}
