//! Idempotent installation of everything the project needs on a fresh Debian 12 machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::process::run;

/// Debian packages: protoc and the well-known types it imports (CRI/etcd protobufs:
/// `protobuf-compiler` only recommends `libprotobuf-dev`, and recommends are not installed), etcd (HA store tests), containerd + runc
/// (agent), busybox-static (test images), python3-venv (client tests), iproute2 (lab netns),
/// nftables (pod masquerade), containernetworking-plugins (`loopback` for containerd, and the
/// reference ptp/host-local plugins the CNI benchmark compares against).
const APT_PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "libprotobuf-dev",
    "etcd-server",
    "containerd",
    "runc",
    "busybox-static",
    "python3-venv",
    "iproute2",
    "nftables",
    "containernetworking-plugins",
];

/// Python packages for the client tests (the official `kubernetes` client and pytest).
const PIP_PACKAGES: &[&str] = &["kubernetes==33.1.0", "pytest"];

pub fn all(root: &Path) -> Result<()> {
    apt(APT_PACKAGES)?;
    // llvm-22-dev, zlib1g-dev, rust-src and bpf-linker 0.13 for the eBPF build.
    crate::ebpf::ensure_toolchain()?;
    python_venv(root)?;
    Ok(())
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

pub fn apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing))
}

pub fn venv_dir(root: &Path) -> PathBuf {
    root.join("target/venv")
}

/// The venv for the Python client tests, at target/venv (created once, then reused).
pub fn python_venv(root: &Path) -> Result<()> {
    let venv = venv_dir(root);
    let python = venv.join("bin/python");
    let stamp = venv.join(".skiff-installed");
    let want = PIP_PACKAGES.join(" ");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(());
    }
    if !python.exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    run(Command::new(&python).args(["-m", "pip", "install", "-q"]).args(PIP_PACKAGES))?;
    std::fs::write(stamp, want)?;
    Ok(())
}
