//! Building the eBPF object (`ebpf/` for bpfel-unknown-none) and installing what that needs.
//!
//! Shared with `proxy/build.rs` (included there by path), so the proxy's embedded object and
//! `cargo xtask build-ebpf` are built by exactly the same command. Only `std` and `anyhow`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The eBPF target.
pub const TARGET: &str = "bpfel-unknown-none";
/// The pinned bpf-linker (LLVM 22, matching rustc 1.95's LLVM).
pub const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where the eBPF build keeps its own cargo target dir: apart from the host one so a build
/// script can run it while the outer cargo holds the host target dir's lock.
pub fn ebpf_target_dir(root: &Path) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    base.join("bpf")
}

/// Builds `ebpf/` and returns the path of the object (an ELF with all programs and maps).
/// `cargo <subcommand>` of the eBPF crate for bpfel-unknown-none, in its own target dir.
fn ebpf_cargo(root: &Path, subcommand: &str, target_dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .args([subcommand, "--package", "skiff-ebpf", "--bin", "skiff-ebpf", "--target", TARGET])
        .args(["-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(target_dir)
        // Stable 1.95 with the nightly-only -Z build-std (DESIGN.md "Pinned toolchain").
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags())
        // bpf-linker links the object's bitcode itself: the verifier-checked object is
        // built with cargo's release defaults, whatever the workspace's profiles say.
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
    // Set by an outer cargo (build script, clippy): they must not leak into this build.
    for key in
        ["RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "CARGO_TARGET_DIR"]
    {
        cmd.env_remove(key);
    }
    cmd
}

/// Clippy over the eBPF crate for its real target (the workspace clippy cannot reach it),
/// warnings denied.
pub fn clippy_ebpf(root: &Path) -> Result<()> {
    let target_dir = root.join("target").join("bpf-clippy");
    let mut cmd = ebpf_cargo(root, "clippy", &target_dir);
    cmd.args(["--", "-D", "warnings"]);
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("clippy of the eBPF crate failed ({status})");
    }
    Ok(())
}

pub fn build_ebpf(root: &Path, release: bool) -> Result<PathBuf> {
    let target_dir = ebpf_target_dir(root);
    let mut cmd = ebpf_cargo(root, "build", &target_dir);
    if release {
        cmd.arg("--release");
    } else {
        // Unoptimised BPF does not pass the verifier: the dev object is optimised too, it
        // only keeps its own directory and debug assertions off like release.
        for (k, v) in [
            ("CARGO_PROFILE_DEV_OPT_LEVEL", "3"),
            ("CARGO_PROFILE_DEV_DEBUG_ASSERTIONS", "false"),
            ("CARGO_PROFILE_DEV_OVERFLOW_CHECKS", "false"),
            ("CARGO_PROFILE_DEV_PANIC", "abort"),
        ] {
            cmd.env(k, v);
        }
    }
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!(
            "eBPF build failed ({status}); is bpf-linker {BPF_LINKER_VERSION} installed? \
             run `cargo xtask build-ebpf --install`"
        );
    }
    let profile = if release { "release" } else { "debug" };
    let obj = target_dir.join(TARGET).join(profile).join("skiff-ebpf");
    if !obj.is_file() {
        bail!("eBPF build succeeded but {} is missing", obj.display());
    }
    Ok(obj)
}

fn rustflags() -> OsString {
    // aya-ebpf reads bpf_target_arch; BTF makes the object inspectable with bpftool.
    let arch = std::env::consts::ARCH;
    let flags = [
        format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2".into(),
        "-Clink-arg=--btf".into(),
    ];
    flags.join("\x1f").into()
}

/// Idempotently installs what `build_ebpf` needs: LLVM 22 dev files and zlib (apt),
/// rust-src (rustup) and bpf-linker 0.13.0 built against LLVM 22.
pub fn ensure_toolchain() -> Result<()> {
    let missing: Vec<&str> = ["llvm-22-dev", "zlib1g-dev"]
        .into_iter()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if !missing.is_empty() {
        run(Command::new("apt-get").args(["install", "-y"]).args(&missing))?;
    }
    run(Command::new("rustup").args(["component", "add", "rust-src"]))?;
    let have = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if !have {
        run(Command::new("cargo")
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked"])
            .args(["--no-default-features", "--features", "llvm-22"]))?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
