//! `cargo xtask bench <name>`: benchmarks print a table and write JSON under target/bench/.
//! Each runs its comparison baseline in the same run on the same machine.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::process::{cargo, run};

pub fn run_bench(root: &Path, name: &str) -> Result<()> {
    match name {
        "apiserver" => apiserver(root),
        "cni" => crate::cni::bench(root),
        // proxy/examples/bench_dataplane.rs: BPF_PROG_TEST_RUN ns/packet and map programming.
        "dataplane" => run(cargo().current_dir(root).args([
            "run",
            "--release",
            "-p",
            "skiff-proxy",
            "--example",
            "bench_dataplane",
        ])),
        // agent/examples/bench_dns.rs: queries/s, p99 and RSS of the cluster DNS at 10k services.
        "dns" => run(cargo().current_dir(root).args([
            "run",
            "--release",
            "-p",
            "skiff-agent",
            "--example",
            "bench_dns",
        ])),
        "scheduler" => crate::scheduler_bench::bench(root),
        "controllers" => controllers(root),
        "lab-load" => lab_load(root),
        "agent" => agent(root),
        // tests/tests/e2e.rs bench_e2e: network programming and pod start in a 3-node lab.
        "e2e" => {
            run(cargo().current_dir(root).args(["build", "--workspace", "--bins"]))?;
            run(cargo().current_dir(root).args([
                "test",
                "-p",
                "skiff-tests",
                "--test",
                "e2e",
                "bench_e2e",
                "--",
                "--ignored",
                "--nocapture",
            ]))
        }
        // tests/tests/crds_bench.rs: custom resources against ConfigMaps, CRD readiness with
        // 50 CRDs, RSS growth.
        "crds" => {
            // The server as users run it (release, as the apiserver bench); the load
            // generator in the test binary.
            run(cargo().current_dir(root).args([
                "build",
                "--release",
                "-p",
                "skiff-control-plane",
                "--bin",
                "skiff-server",
            ]))?;
            run(cargo().current_dir(root).args([
                "test",
                "-p",
                "skiff-tests",
                "--test",
                "crds_bench",
                "--",
                "--ignored",
                "--nocapture",
            ]))
        }
        // tests/tests/proxy_daemonset.rs bench_install: kubectl apply -k deploy/proxy to
        // every proxy Ready and programmed in a 3-node lab, and a rolling update under load.
        "install" => {
            run(cargo().current_dir(root).args(["build", "--workspace", "--bins"]))?;
            run(cargo().current_dir(root).args([
                "test",
                "-p",
                "skiff-tests",
                "--test",
                "proxy_daemonset",
                "bench_install",
                "--",
                "--ignored",
                "--nocapture",
            ]))
        }
        other => bail!(
            "unknown benchmark {other:?} (known: agent, apiserver, cni, controllers, crds, dataplane, dns, e2e, install, lab-load, scheduler)"
        ),
    }
}

/// agent/examples/bench_agent.rs: pod start latency (create → Running) p50/p99 over 50 pods
/// on one node and the agent's RSS. In-memory runtime by default; `SKIFF_BENCH_CONTAINERD=1`
/// (or `rig`): a real containerd the bench starts in a network namespace of its own with the
/// test images (needs root, containerd, runc, busybox-static; skiff-cni is built here);
/// `SKIFF_BENCH_CONTAINERD=<CRI socket>`: an existing containerd (images imported;
/// `SKIFF_BENCH_IMAGE` names the container image, default skiff.test/tools:1).
/// `SKIFF_BENCH_PODS` overrides the count.
fn agent(root: &Path) -> Result<()> {
    let containerd = std::env::var("SKIFF_BENCH_CONTAINERD").ok().filter(|s| !s.is_empty());
    let rig = matches!(containerd.as_deref(), Some("1" | "rig" | "true"));
    if rig {
        // The rig installs skiff-cni from beside the bench binary (target/release).
        run(cargo().current_dir(root).args(["build", "--release", "-p", "skiff-cni"]))?;
    }
    let mut cmd = cargo();
    cmd.current_dir(root).args([
        "run",
        "--release",
        "-p",
        "skiff-agent",
        "--example",
        "bench_agent",
        "--",
        "--out",
    ]);
    cmd.arg(root.join("target/bench/agent.json"));
    match containerd {
        Some(_) if rig => {
            cmd.arg("--rig");
        }
        Some(socket) => {
            cmd.args(["--containerd-socket", &socket]);
        }
        None => {}
    }
    if let Ok(image) = std::env::var("SKIFF_BENCH_IMAGE") {
        cmd.args(["--image", &image]);
    }
    if let Ok(pods) = std::env::var("SKIFF_BENCH_PODS") {
        cmd.args(["--pods", &pods]);
    }
    // SKIFF_BENCH_SERIAL=1: each pod created once the previous one runs (no queueing).
    if std::env::var("SKIFF_BENCH_SERIAL").is_ok_and(|v| !v.is_empty() && v != "0") {
        cmd.arg("--serial");
    }
    run(&mut cmd)
}

/// `dist` builds (fat LTO) of skiff-server and the bench driver, then the driver against the
/// server.
fn apiserver(root: &Path) -> Result<()> {
    let target = dist_build(root)?;
    run(Command::new(target.join("skiff-bench"))
        .arg("apiserver")
        .arg(target.join("skiff-server"))
        .arg(root.join("target/bench")))
}

/// skiff-server with its controllers at 10k pods: watches per component and RSS. With
/// `SKIFF_BENCH_BASELINE=<skiff-server>` (another build, e.g. of an earlier commit), that
/// build runs first on a fresh server and this one is compared with it; `SKIFF_BENCH_PODS`
/// overrides the pod count.
fn controllers(root: &Path) -> Result<()> {
    let target = dist_build(root)?;
    let mut cmd = Command::new(target.join("skiff-bench"));
    cmd.arg("controllers");
    if let Ok(baseline) = std::env::var("SKIFF_BENCH_BASELINE") {
        cmd.arg(baseline);
    }
    cmd.arg(target.join("skiff-server"));
    if let Ok(pods) = std::env::var("SKIFF_BENCH_PODS") {
        cmd.args(["--pods", &pods]);
    }
    run(&mut cmd)
}

/// A one-node lab at 10k pods and 100 Services: watches per process, RSS of skiff-server
/// and skiff-agent (tests/src/bin/bench_lab_load). The lab's binaries, as `cargo xtask up`
/// builds them (`SKIFF_BENCH_RELEASE=1`: the release profile). With
/// `SKIFF_BENCH_BASELINE=<bin-dir>` (the same binaries of another build), that lab runs
/// first and this one is compared with it; `SKIFF_BENCH_PODS` overrides the pod count.
fn lab_load(root: &Path) -> Result<()> {
    crate::setup::all(root)?;
    let release = std::env::var("SKIFF_BENCH_RELEASE").is_ok_and(|v| !v.is_empty() && v != "0");
    let bin = crate::cluster::build(root, release)?;
    if release {
        run(cargo().current_dir(root).args([
            "build",
            "--release",
            "-p",
            "skiff-tests",
            "--bin",
            "skiff-bench",
        ]))?;
    }
    let mut cmd = Command::new(bin.join("skiff-bench"));
    cmd.arg("lab-load");
    if let Ok(baseline) = std::env::var("SKIFF_BENCH_BASELINE") {
        cmd.arg(baseline);
    }
    cmd.arg(&bin);
    if let Ok(pods) = std::env::var("SKIFF_BENCH_PODS") {
        cmd.args(["--pods", &pods]);
    }
    run(&mut cmd)
}

/// `dist` builds of skiff-server and skiff-bench; the directory they are in.
fn dist_build(root: &Path) -> Result<std::path::PathBuf> {
    run(cargo().current_dir(root).args([
        "build",
        "--profile",
        "dist",
        "-p",
        "skiff-control-plane",
        "-p",
        "skiff-tests",
        "--bin",
        "skiff-server",
        "--bin",
        "skiff-bench",
    ]))?;
    // Where cargo put them (CARGO_TARGET_DIR when set, as the builds above honour it).
    Ok(std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| root.join("target"), Into::into)
        .join("dist"))
}
