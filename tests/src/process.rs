//! skiff-server as its own process, for the benchmarks that measure it as users run it
//! (its own allocator, its own RSS): started on a free loopback port with a fresh data
//! directory, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub struct ServerProcess {
    pub child: Child,
    pub kubeconfig: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn rss_mb(&self) -> f64 {
        vm_rss_mb(self.child.id()).unwrap_or(0.0)
    }
}

/// VmRSS of process `pid` in MB; `None` when it is gone.
pub fn vm_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(16443)
}

/// The apiserver alone (`--no-controllers`: no in-process scheduler or controllers
/// reacting to the load).
pub async fn start_server(bin: &Path) -> Result<ServerProcess> {
    start_server_with(bin, &["--no-controllers"]).await
}

/// skiff-server with `args` (its controllers and scheduler run unless they say
/// `--no-controllers`), once it has written its kubeconfig.
pub async fn start_server_with(bin: &Path, args: &[&str]) -> Result<ServerProcess> {
    start_in(bin, args, tempfile::tempdir()?).await
}

impl ServerProcess {
    /// Kills the server and starts it again with `args` on the same data directory.
    pub async fn restart(mut self, bin: &Path, args: &[&str]) -> Result<ServerProcess> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.kubeconfig);
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir()?);
        start_in(bin, args, dir).await
    }
}

async fn start_in(bin: &Path, args: &[&str], dir: tempfile::TempDir) -> Result<ServerProcess> {
    let port = free_port();
    let child = Command::new(bin)
        .args(args)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        if Instant::now() > deadline {
            bail!("skiff-server did not write its kubeconfig");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(ServerProcess { child, kubeconfig, dir })
}
