//! `cargo xtask bench cni`: skiff-cni ADD and DEL latency (p50/p99), one at a time and 50
//! in parallel, with the plugin run as libcni runs it (env + stdin, in a node namespace).
//! Everything happens in network namespaces this benchmark creates and removes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

const SEQUENTIAL: usize = 200;
const PARALLEL: usize = 50;
const PARALLEL_ROUNDS: usize = 4;

/// Named network namespaces deleted on drop, and the IPAM dir.
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

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    ensure!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

impl Rig {
    fn new(pods: usize) -> Result<Self> {
        let tag = std::process::id();
        let mut rig = Rig {
            node: format!("skb{tag}-node"),
            pods: Vec::new(),
            data_dir: std::env::temp_dir().join(format!("skiff-cni-bench-{tag}")),
        };
        ip(&["netns", "add", &rig.node])?;
        ip(&["-n", &rig.node, "link", "set", "lo", "up"])?;
        ip(&["-n", &rig.node, "addr", "add", "10.250.0.1/32", "dev", "lo"])?;
        for i in 0..pods {
            let name = format!("skb{tag}-p{i}");
            ip(&["netns", "add", &name])?;
            rig.pods.push(name);
        }
        Ok(rig)
    }

    fn config(&self) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"bench","type":"skiff-cni","podCIDR":"10.244.0.0/22","dataDir":"{}","mtu":1500}}"#,
            self.data_dir.display()
        )
    }
}

/// One plugin invocation; returns its wall time.
fn invoke(
    bin: &Path,
    rig_node: &str,
    cmd: &str,
    cid: &str,
    pod: &str,
    config: &str,
) -> Result<Duration> {
    let start = Instant::now();
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{rig_node}"))
        .arg(bin)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", format!("/run/netns/{pod}"))
        .env("CNI_PATH", bin.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning nsenter skiff-cni")?;
    child.stdin.take().context("plugin stdin")?.write_all(config.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    if !out.status.success() {
        bail!(
            "{cmd} {cid} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

#[derive(Debug)]
struct Stats {
    op: &'static str,
    mode: &'static str,
    n: usize,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

fn stats(op: &'static str, mode: &'static str, mut v: Vec<Duration>) -> Stats {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: f64| ms(v[((v.len() as f64 - 1.0) * p).round() as usize]);
    Stats {
        op,
        mode,
        n: v.len(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        mean_ms: v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64,
    }
}

fn build(root: &Path) -> Result<PathBuf> {
    crate::run(crate::cargo().current_dir(root).args([
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

pub fn bench(root: &Path) -> Result<()> {
    let bin = build(root)?;
    let rig = Rig::new(PARALLEL)?;
    let config = rig.config();
    let node = rig.node.clone();

    // One at a time.
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..SEQUENTIAL {
        let pod = &rig.pods[i % rig.pods.len()];
        let cid = format!("seq-{i}");
        adds.push(invoke(&bin, &node, "ADD", &cid, pod, &config)?);
        dels.push(invoke(&bin, &node, "DEL", &cid, pod, &config)?);
    }
    let mut table = vec![stats("ADD", "alone", adds), stats("DEL", "alone", dels)];

    // 50 at once, released together by a barrier.
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for round in 0..PARALLEL_ROUNDS {
        let barrier = Arc::new(Barrier::new(PARALLEL));
        let results: Vec<Result<(Duration, Duration)>> = std::thread::scope(|s| {
            let handles: Vec<_> = rig
                .pods
                .iter()
                .enumerate()
                .map(|(i, pod)| {
                    let (bin, node, config, barrier) = (&bin, &node, &config, barrier.clone());
                    s.spawn(move || -> Result<(Duration, Duration)> {
                        let cid = format!("par-{round}-{i}");
                        barrier.wait();
                        let add = invoke(bin, node, "ADD", &cid, pod, config);
                        barrier.wait();
                        let del = invoke(bin, node, "DEL", &cid, pod, config);
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
    table.push(stats("ADD", "50 parallel", adds));
    table.push(stats("DEL", "50 parallel", dels));

    println!(
        "{:<5} {:<12} {:>5} {:>9} {:>9} {:>9}",
        "op", "mode", "n", "p50 ms", "p99 ms", "mean ms"
    );
    for s in &table {
        println!(
            "{:<5} {:<12} {:>5} {:>9.2} {:>9.2} {:>9.2}",
            s.op, s.mode, s.n, s.p50_ms, s.p99_ms, s.mean_ms
        );
    }
    let json: Vec<String> = table
        .iter()
        .map(|s| {
            format!(
                r#"{{"op":"{}","mode":"{}","n":{},"p50_ms":{:.3},"p99_ms":{:.3},"mean_ms":{:.3}}}"#,
                s.op, s.mode, s.n, s.p50_ms, s.p99_ms, s.mean_ms
            )
        })
        .collect();
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join("cni.json");
    std::fs::write(&path, format!("{{\"benchmark\":\"cni\",\"results\":[{}]}}\n", json.join(",")))?;
    println!("wrote {}", path.display());
    Ok(())
}
