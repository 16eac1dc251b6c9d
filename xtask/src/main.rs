//! Project tasks: `cargo xtask setup | up | down | test | bench <name>`.
//!
//! `setup` installs what the project needs on a fresh Debian machine (idempotently);
//! `up` starts a cluster on the embedded store; `test` runs every test suite.

mod bench;
mod cni;
mod ebpf;
mod images;
mod scheduler_bench;
mod setup;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "skiff project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install system packages, toolchain components and the Python client venv.
    Setup,
    /// Build and start skiff-server on the embedded store (foreground; Ctrl-C stops it).
    Up {
        /// Data directory of the server (its admin.kubeconfig is written there).
        #[arg(long, default_value = "/var/lib/skiff/server")]
        data_dir: PathBuf,
        #[arg(long, default_value = "0.0.0.0:6443")]
        listen: String,
    },
    /// Stop what `up` started and remove its state.
    Down {
        #[arg(long, default_value = "/var/lib/skiff/server")]
        data_dir: PathBuf,
    },
    /// Run the whole test suite (Rust, real kubectl, Python client).
    Test,
    /// Build the eBPF object (ebpf/ for bpfel-unknown-none) and print its path.
    BuildEbpf {
        /// Optimised release profile (the dev profile is optimised too; see xtask/src/ebpf.rs).
        #[arg(long)]
        release: bool,
        /// First install llvm-22-dev, zlib1g-dev, rust-src and bpf-linker 0.13.0.
        #[arg(long)]
        install: bool,
    },
    /// Build the busybox test images (skiff.test/pause:1, skiff.test/tools:1) as OCI
    /// archives into target/images/ (import: skiff-agent images import FILE).
    Images {
        /// Output directory instead of target/images.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run a benchmark and print its figures (JSON under target/bench/).
    Bench { name: String },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.command {
        Cmd::Setup => setup::all(&root),
        Cmd::Up { data_dir, listen } => up(&root, &data_dir, &listen),
        Cmd::Down { data_dir } => down(&data_dir),
        Cmd::Test => test(&root),
        Cmd::BuildEbpf { release, install } => {
            if install {
                ebpf::ensure_toolchain()?;
            }
            let obj = ebpf::build_ebpf(&root, release)?;
            println!("{}", obj.display());
            Ok(())
        }
        Cmd::Images { out_dir } => {
            images::build(&root, out_dir).map(|dir| println!("{}", dir.display()))
        }
        Cmd::Bench { name } => bench::run_bench(&root, &name),
    }
}

pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").into()
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn up(root: &Path, data_dir: &Path, listen: &str) -> Result<()> {
    setup::all(root)?;
    run(cargo().current_dir(root).args(["build", "--release", "-p", "skiff-control-plane"]))?;
    let server = root.join("target/release/skiff-server");
    eprintln!(
        "xtask: starting skiff-server; kubeconfig: {}\n       try: kubectl --kubeconfig {} get namespaces",
        data_dir.join("admin.kubeconfig").display(),
        data_dir.join("admin.kubeconfig").display()
    );
    let pid_file = data_dir.join("skiff-server.pid");
    std::fs::create_dir_all(data_dir)?;
    let mut child = Command::new(server)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg(listen)
        .spawn()
        .context("starting skiff-server")?;
    std::fs::write(&pid_file, child.id().to_string())?;
    let status = child.wait()?;
    let _ = std::fs::remove_file(&pid_file);
    if !status.success() {
        bail!("skiff-server exited: {status}");
    }
    Ok(())
}

fn down(data_dir: &Path) -> Result<()> {
    let pid_file = data_dir.join("skiff-server.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let _ = Command::new("kill").arg(pid.trim()).status();
        let _ = std::fs::remove_file(&pid_file);
    }
    if data_dir.exists() {
        std::fs::remove_dir_all(data_dir)
            .with_context(|| format!("removing {}", data_dir.display()))?;
    }
    eprintln!("xtask: stopped skiff-server and removed {}", data_dir.display());
    Ok(())
}

fn test(root: &Path) -> Result<()> {
    setup::python_venv(root)?;
    // Build the binaries first: the end-to-end tests start them from target/debug.
    run(cargo().current_dir(root).args(["build", "--workspace", "--bins"]))?;
    run(cargo().current_dir(root).args(["test", "--workspace", "--no-fail-fast"]))?;
    Ok(())
}
