//! Shared rig for the end-to-end tests: an in-process skiff-server on a free loopback port
//! with its own data dir, and the real kubectl binaries with a fresh discovery cache.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use skiff_control_plane::server::{self, ServerConfig};

pub mod extension;
pub mod lab;
pub mod process;
pub mod webhook;

/// A skiff-server running on a background thread until dropped.
pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub kubeconfig: PathBuf,
    pub dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("addr"),
            ..Default::default()
        };
        Self::start_with(dir, config)
    }

    /// [`TestServer::start`] with the controllers running in process.
    pub fn start_with_controllers() -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("addr"),
            controllers: Some(Default::default()),
            ..Default::default()
        };
        Self::start_with(dir, config)
    }

    pub fn start_with(dir: tempfile::TempDir, config: ServerConfig) -> TestServer {
        match Self::try_start(dir, config) {
            Ok(server) => server,
            Err((_, e)) => panic!("skiff-server failed to start: {e}"),
        }
    }

    /// [`TestServer::start_with`], the directory handed back with the error.
    fn try_start(
        dir: tempfile::TempDir,
        config: ServerConfig,
    ) -> Result<TestServer, (tempfile::TempDir, String)> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                match server::start(config).await {
                    Ok(running) => {
                        let _ = ready_tx.send(Ok((running.addr, running.kubeconfig.clone())));
                        let _ = stop_rx.await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("{e:?}")));
                    }
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("skiff-server did not start within 30 s");
        match ready {
            Ok((addr, kubeconfig)) => {
                Ok(TestServer { addr, kubeconfig, dir, stop: Some(stop_tx), thread: Some(thread) })
            }
            Err(e) => {
                let _ = thread.join();
                Err((dir, e))
            }
        }
    }

    pub fn kubectl(&self, minor: u32) -> Kubectl {
        Kubectl::new(minor, &self.kubeconfig)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// The server's PKI (CA, keys) from its data dir.
    pub fn pki(&self) -> skiff_apiserver::pki::Pki {
        skiff_apiserver::pki::Pki::load_or_create(self.dir.path(), &[]).expect("loading the PKI")
    }

    /// A kubeconfig (written into the data dir as `<file>`) authenticating with a client
    /// certificate for `user` in `groups`, signed by the server's CA.
    pub fn cert_kubeconfig(&self, file: &str, user: &str, groups: &[&str]) -> PathBuf {
        let pki = self.pki();
        let (cert, key) = pki.issue_client(user, groups).expect("issuing a client certificate");
        let path = self.dir.path().join(file);
        std::fs::write(&path, pki.kubeconfig(&self.url(), "user", &cert, &key))
            .expect("writing a kubeconfig");
        path
    }

    /// A kubeconfig with a bearer token (`None`: no credentials at all) and `ca_pem` as the
    /// trusted CA (default: the server's CA).
    pub fn token_kubeconfig(
        &self,
        file: &str,
        token: Option<&str>,
        ca_pem: Option<&str>,
    ) -> PathBuf {
        use base64::Engine;
        let pki = self.pki();
        let ca = base64::engine::general_purpose::STANDARD
            .encode(ca_pem.unwrap_or(&pki.ca_cert_pem).as_bytes());
        let user = match token {
            Some(t) => format!("    token: {t}\n"),
            None => "    {}\n".to_string(),
        };
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context:\n    cluster: skiff\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user}",
            self.url()
        );
        let path = self.dir.path().join(file);
        std::fs::write(&path, cfg).expect("writing a kubeconfig");
        path
    }
}

impl TestServer {
    /// Stops the server and starts it again with `config` on the same data directory
    /// (the serving certificate and the embedded store kept).
    pub fn restart_with(mut self, config: ServerConfig) -> TestServer {
        self.stop();
        let mut dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let config = ServerConfig { data_dir: dir.path().to_path_buf(), ..config };
        // The stopped server's embedded store closes when the last of its blocking tasks
        // ends, which a loaded machine may leave running past the runtime's shutdown.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match TestServer::try_start(dir, config.clone()) {
                Ok(server) => return server,
                Err((d, e))
                    if e.contains("DatabaseAlreadyOpen")
                        && std::time::Instant::now() < deadline =>
                {
                    dir = d;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err((_, e)) => panic!("skiff-server failed to restart: {e}"),
            }
        }
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `f` until it is true, failing with `what` after `timeout` (every 100 ms).
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One real kubectl binary (`/usr/lib/google-cloud-sdk/bin/kubectl.1.<minor>`).
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub cache: tempfile::TempDir,
}

impl Kubectl {
    pub fn new(minor: u32, kubeconfig: &Path) -> Kubectl {
        let bin = PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.1.{minor}"));
        assert!(
            bin.exists(),
            "{} is missing: the real kubectl binaries are required",
            bin.display()
        );
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
            cache: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(self.cache.path());
        c.args(args);
        c.env("HOME", self.cache.path());
        c
    }

    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.command(args);
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child =
            c.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", self.bin.display()));
        if let Some(input) = stdin {
            child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("writing stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// Run and require success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_stdin(args, None)
    }

    pub fn ok_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
            self.bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Run and require failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        self.fails_stdin(args, None)
    }

    /// Run with `stdin` and require failure; returns stderr.
    pub fn fails_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.status.success(),
            "{args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

/// The debug skiff-server binary the end-to-end tests start as a process of its own
/// (`cargo xtask test` builds it first).
pub fn server_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target.join("debug/skiff-server");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build --bins`; `cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// A kube-rs client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// The workspace root (for tests that run project files such as the Python suite).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}
