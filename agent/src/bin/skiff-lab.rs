//! skiff-lab: the development side of the node agent, never shipped: the one-machine lab
//! behind `cargo xtask up` and the end-to-end tests, the busybox test images, and simulated
//! nodes (the agent's code over the in-memory runtime) for the scheduler's benchmark.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use skiff_agent::{images, lab, simulate};

#[derive(Debug, Parser)]
#[command(name = "skiff-lab", version, about = "skiff's lab, test images and simulated nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Test images: import an OCI archive, build the busybox test images.
    #[command(subcommand)]
    Images(images::ImagesCommand),
    /// A whole cluster on this machine in network namespaces (`cargo xtask up`, e2e tests).
    #[command(flatten)]
    Lab(lab::LabCommand),
    /// N simulated nodes in this process: the real agent code over the in-memory runtime.
    Simulate {
        /// kubeconfig of the nodes' identity.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Node name prefix (`<prefix>-<i>`).
        #[arg(long, default_value = "sim-node")]
        prefix: String,
        /// CPU millicores of each node.
        #[arg(long, default_value_t = 4000)]
        cpu_millis: u64,
        /// Memory of each node, in MiB.
        #[arg(long, default_value_t = 16384)]
        memory_mib: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    match Cli::parse().command {
        Command::Images(cmd) => images::run_command(cmd).await,
        Command::Lab(cmd) => lab::run_command(cmd).await,
        Command::Simulate { kubeconfig, nodes, prefix, cpu_millis, memory_mib } => {
            let kc = Kubeconfig::read_from(&kubeconfig)
                .with_context(|| format!("reading {}", kubeconfig.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .context("kubeconfig")?;
            let client = kube::Client::try_from(config).context("client")?;
            let cfg = simulate::SimulateConfig {
                nodes,
                prefix,
                cpu_millis,
                memory_bytes: memory_mib << 20,
                ..Default::default()
            };
            let sim = simulate::start(client, cfg).await?;
            tracing::info!(nodes = sim.nodes.len(), "simulated nodes running; Ctrl-C stops them");
            tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
            Ok(())
        }
    }
}
