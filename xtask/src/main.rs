//! Project tasks: `cargo xtask setup | up | down | test | lint | bench <name>`.
//!
//! `setup` installs what the project needs on a fresh Debian machine (idempotently);
//! `up` starts a cluster (server + N lab nodes) in the background, `down` removes it;
//! `test` runs every test suite; `lint` checks formatting and runs clippy everywhere.

mod bench;
mod cluster;
mod cni;
mod ebpf;
mod images;
mod process;
mod scheduler_bench;
mod setup;

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Parser, Subcommand};

use process::{cargo, run};

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
    /// Install what is missing, build, start skiff-server and N nodes (each a network
    /// namespace on a lab bridge with containerd and skiff-agent) in the background, wait
    /// until Ready. Kubeconfig: /var/lib/skiff/server/admin.kubeconfig.
    Up {
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Build and run the release profile (optimised; from cold about five times the build
        /// time of the default dev profile, which `cargo xtask test` shares).
        #[arg(long)]
        release: bool,
        /// Where the data plane runs: `in-process` (in each agent, the default) or
        /// `daemonset` (the agents without it; deploy/proxy applied with kubectl -k from the
        /// skiff/proxy image built from these binaries).
        #[arg(long, default_value = "in-process")]
        proxy: String,
        /// Each agent joins with its own bootstrap token over the lab network and runs as its
        /// node (a node certificate, rotated before it expires), as on real machines.
        #[arg(long)]
        join: bool,
    },
    /// Stop everything `up` started and remove every trace of it.
    Down,
    /// Lint (as `lint`), then run the whole test suite (Rust, real kubectl, Python client).
    Test,
    /// `cargo fmt --check`, clippy over the workspace and over the eBPF crate for its BPF
    /// target, warnings denied.
    Lint,
    /// Build the eBPF object (ebpf/ for bpfel-unknown-none) and print its path.
    BuildEbpf {
        /// Optimised release profile (the dev profile is optimised too; see xtask/src/ebpf.rs).
        #[arg(long)]
        release: bool,
        /// First install llvm-22-dev, zlib1g-dev, rust-src and bpf-linker 0.13.0.
        #[arg(long)]
        install: bool,
    },
    /// Build skiff's images (skiff/proxy, skiff/cni, skiff/agent, skiff/server, tagged with
    /// the version) from the release binaries, and the busybox test images
    /// (skiff.test/pause:1, skiff.test/tools:1), as OCI archives into target/images/
    /// (`ctr images import FILE`, or any registry: `skopeo copy oci-archive:FILE ...`).
    Images {
        /// Output directory instead of target/images.
        #[arg(long)]
        out_dir: Option<PathBuf>,
        /// From the dev-profile binaries (as `cargo xtask test` builds them) instead.
        #[arg(long)]
        debug: bool,
        /// Only these components (proxy, cni, agent, server); default all.
        #[arg(long = "component")]
        components: Vec<String>,
    },
    /// Run a benchmark and print its figures (JSON under target/bench/).
    Bench { name: String },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.command {
        Cmd::Setup => setup::all(&root),
        Cmd::Up { nodes, release, proxy, join } => cluster::up(&root, nodes, release, &proxy, join),
        Cmd::Down => cluster::down(&root),
        Cmd::Test => test(&root),
        Cmd::Lint => lint(&root),
        Cmd::BuildEbpf { release, install } => {
            if install {
                ebpf::ensure_toolchain()?;
            }
            let obj = ebpf::build_ebpf(&root, release)?;
            println!("{}", obj.display());
            Ok(())
        }
        Cmd::Images { out_dir, debug, components } => {
            images::build(&root, out_dir, !debug, &components)
                .map(|dir| println!("{}", dir.display()))
        }
        Cmd::Bench { name } => bench::run_bench(&root, &name),
    }
}

pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").into()
}

fn lint(root: &Path) -> Result<()> {
    run(cargo().current_dir(root).args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    ebpf::clippy_ebpf(root)
}

fn test(root: &Path) -> Result<()> {
    lint(root)?;
    setup::python_venv(root)?;
    // Build the binaries first: the end-to-end tests start them from target/debug.
    let started = std::time::Instant::now();
    run(cargo().current_dir(root).args(["build", "--workspace", "--bins"]))?;
    eprintln!("xtask: build took {:.0?}", started.elapsed());
    run(cargo().current_dir(root).args(["test", "--workspace", "--no-fail-fast"]))?;
    Ok(())
}
