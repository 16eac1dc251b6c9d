//! `cargo xtask up [--nodes N]` and `cargo xtask down`: a whole cluster on this machine.
//!
//! The lab itself (lab bridge in its own namespace, one namespace per node with its own
//! containerd and skiff-agent hosting the proxy, skiff-server on the host's lab address) is
//! `skiff_agent::lab`, driven through `skiff-lab up|down` (the agent's development binary,
//! built with its `testing` feature): xtask does not link the agent (it installs protoc,
//! which the agent needs to build). The end-to-end tests use the same code.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::process::{cargo, run};

/// The lab's state directory and the server's data dir (its admin.kubeconfig).
pub const LAB_DIR: &str = "/var/lib/skiff/lab";
pub const SERVER_DIR: &str = "/var/lib/skiff/server";

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"))
}

/// Builds every binary the lab runs and `skiff-lab` itself (the proxy's build script builds
/// and embeds the eBPF object with the pinned toolchain); returns their directory.
///
/// By default the dev profile, with exactly the `cargo build --workspace --bins` that
/// `cargo xtask test` runs first, so either command warms the other. `release`: the release
/// profile (optimised, no LTO), for a lab whose control plane should run at full speed; from
/// cold on two cores it took 2004 s against the dev profile's 418 s.
pub fn build(root: &Path, release: bool) -> Result<PathBuf> {
    let started = std::time::Instant::now();
    if release {
        run(cargo().current_dir(root).args([
            "build",
            "--release",
            "-p",
            "skiff-control-plane",
            "-p",
            "skiff-agent",
            "-p",
            "skiff-cni",
            "-p",
            "skiff-proxy",
            "--bins",
        ]))?;
        build_lab(root, true)?;
        crate::ebpf::build_ebpf(root, true)?;
    } else {
        run(cargo().current_dir(root).args(["build", "--workspace", "--bins"]))?;
    }
    let profile = if release { "release" } else { "debug" };
    eprintln!("xtask: {profile} build took {:.0?}", started.elapsed());
    Ok(target_dir(root).join(profile))
}

/// Installs what is missing, builds, starts an N-node lab and returns once the nodes are
/// Ready.
pub fn up(root: &Path, nodes: usize, release: bool, proxy: &str, join: bool) -> Result<()> {
    if !matches!(proxy, "in-process" | "daemonset") {
        anyhow::bail!("--proxy {proxy:?}: expected in-process or daemonset");
    }
    crate::setup::all(root)?;
    let bin = build(root, release)?;
    // The test images (also built into each node by the lab; here for `ctr import` by hand).
    run(Command::new(bin.join("skiff-lab"))
        .args(["images", "build"])
        .arg(bin.parent().unwrap_or(&bin).join("images")))?;
    let mut lab = Command::new(bin.join("skiff-lab"));
    lab.args([
        "up",
        "--nodes",
        &nodes.to_string(),
        "--dir",
        LAB_DIR,
        "--server-data-dir",
        SERVER_DIR,
        "--proxy",
        proxy,
    ]);
    if join {
        lab.arg("--join");
    }
    run(&mut lab).context("starting the lab (logs under /var/lib/skiff/lab)")?;
    let kubeconfig = Path::new(SERVER_DIR).join("admin.kubeconfig");
    println!(
        "\nskiff is up: {nodes} node(s), logs under {LAB_DIR}/ (server.log, node-*/agent.log, \
         node-*/containerd.log)\n\n  export KUBECONFIG={}\n  kubectl get nodes -o wide\n  \
         kubectl create deployment web --image=skiff.test/tools:1 --replicas=2 -- httpd -f -p 8080\n  \
         kubectl expose deployment web --port=80 --target-port=8080 --type=NodePort\n\n\
         `cargo xtask down` removes it all.",
        kubeconfig.display()
    );
    Ok(())
}

/// Stops everything `up` started and removes every trace; nothing to do when nothing runs.
pub fn down(root: &Path) -> Result<()> {
    let agent = ["debug", "release"]
        .iter()
        .map(|p| target_dir(root).join(p).join("skiff-lab"))
        .find(|p| p.is_file());
    let agent = match agent {
        Some(a) => a,
        None if Path::new(LAB_DIR).join("lab.json").exists() => {
            build_lab(root, false)?;
            target_dir(root).join("debug").join("skiff-lab")
        }
        None => {
            eprintln!("xtask: no lab in {LAB_DIR}");
            return Ok(());
        }
    };
    run(Command::new(agent).args(["down", "--dir", LAB_DIR]))?;
    eprintln!("xtask: the lab is down ({LAB_DIR} and {SERVER_DIR} removed)");
    Ok(())
}

/// The lab binary alone (development tooling: the agent's `testing` feature), in its own
/// cargo invocation: asked for together with other packages, `--features skiff-agent/testing`
/// left skiff-lab unbuilt.
fn build_lab(root: &Path, release: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(root).arg("build");
    if release {
        cmd.arg("--release");
    }
    run(cmd.args(["-p", "skiff-agent", "--features", "testing", "--bin", "skiff-lab"]))
}
