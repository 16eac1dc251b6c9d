//! Test images as OCI archives (built from busybox-static) and their import into containerd.

use std::path::PathBuf;

/// `skiff-agent images ...`
#[derive(Debug, clap::Subcommand)]
pub enum ImagesCommand {
    /// Imports an OCI archive into containerd's k8s.io namespace.
    Import {
        /// The OCI archive (a tar with index.json and oci-layout).
        file: PathBuf,
        /// containerd's socket.
        #[arg(long, default_value = "/run/skiff/containerd/containerd.sock")]
        containerd_socket: PathBuf,
    },
}

/// Runs an `images` subcommand.
pub async fn run_command(command: ImagesCommand) -> anyhow::Result<()> {
    match command {
        ImagesCommand::Import { .. } => anyhow::bail!("images import: not built yet"),
    }
}
