//! Test support shared by the storage suite and the end-to-end tests: real etcd clusters
//! (Debian's `etcd-server`, `/usr/bin/etcd`) on loopback, in a temp dir, killed and removed
//! by their guard.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use skiff_store::{etcd::EtcdStore, testing::EtcdCluster};
//! let mut cluster = EtcdCluster::start(3).await?;
//! let store = EtcdStore::connect(&cluster.endpoints(), "/skiff").await?;
//! cluster.kill(0); // SIGKILL one member; the other two keep the quorum
//! # Ok(()) }
//! ```

use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's etcd-server installs etcd.
pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// How long a cluster may take to elect a leader and serve a linearizable read.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum EtcdProcessError {
    #[error(
        "{ETCD_BIN} not found: the etcd tests need Debian's etcd-server package \
         (apt-get install etcd-server)"
    )]
    Missing,
    #[error("create the cluster's temp dir")]
    TempDir(#[source] io::Error),
    #[error("reserve loopback ports")]
    Ports(#[source] io::Error),
    #[error("open log file {path}")]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spawn etcd member {name}")]
    Spawn {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("etcd member {name} exited while starting ({status}); its log:\n{log}")]
    Exited { name: String, status: ExitStatus, log: String },
    #[error("etcd cluster not healthy after {waited:?}: {last}; member logs:\n{logs}")]
    Unhealthy { waited: Duration, last: String, logs: String },
}

/// One etcd process.
#[derive(Debug)]
pub struct EtcdMember {
    pub name: String,
    /// `http://127.0.0.1:PORT`
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

impl EtcdMember {
    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGKILL the process and reap it (no-op if already gone).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

/// A running etcd cluster; dropping it kills every member (SIGKILL) and removes the data.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    tls: Option<TlsFiles>,
    // Dropped after the members (field order): the processes are gone before their data.
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Start `size` members on free loopback ports and wait until the cluster has a leader and
    /// serves a linearizable read through every member.
    pub async fn start(size: usize) -> Result<EtcdCluster, EtcdProcessError> {
        Self::start_with(size, false).await
    }

    /// [`start`](Self::start) over TLS: client URLs `https://`, serving certificates from a
    /// CA of the cluster's own, and client certificates required (`--client-cert-auth`);
    /// [`tls`](Self::tls) and [`tls_files`](Self::tls_files) give what a client needs.
    pub async fn start_tls(size: usize) -> Result<EtcdCluster, EtcdProcessError> {
        Self::start_with(size, true).await
    }

    async fn start_with(size: usize, tls: bool) -> Result<EtcdCluster, EtcdProcessError> {
        if !Path::new(ETCD_BIN).exists() {
            return Err(EtcdProcessError::Missing);
        }
        let dir = tempfile::Builder::new()
            .prefix("skiff-etcd-")
            .tempdir()
            .map_err(EtcdProcessError::TempDir)?;
        // A port reserved by binding to 0 can be taken by someone else before etcd binds it:
        // start again on new ports if a member dies while starting.
        let tls = match tls {
            true => Some(TlsFiles::generate(&dir.path().join("pki"))?),
            false => None,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let run = dir.path().join(format!("attempt-{attempt}"));
            // Members kill themselves when dropped (on every early return below too).
            let mut members = spawn_members(&run, size, tls.as_ref())?;
            match wait_healthy(&mut members, tls.as_ref()).await {
                Ok(()) => return Ok(EtcdCluster { members, tls, _dir: dir }),
                Err(EtcdProcessError::Exited { .. }) if attempt < 3 => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// What a client of a [`start_tls`](Self::start_tls) cluster needs (None otherwise).
    pub fn tls(&self) -> Option<crate::etcd::EtcdTls> {
        self.tls.as_ref().map(TlsFiles::client)
    }

    /// The PEM files of a TLS cluster's CA and of a client certificate it accepts: (ca,
    /// cert, key), as `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile` take them.
    pub fn tls_files(&self) -> Option<(PathBuf, PathBuf, PathBuf)> {
        self.tls.as_ref().map(|t| (t.ca.clone(), t.client_cert.clone(), t.client_key.clone()))
    }

    /// Client URLs of every member (including killed ones: clients must cope).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    pub fn member_mut(&mut self, index: usize) -> &mut EtcdMember {
        &mut self.members[index]
    }

    /// The index of the current leader, asked from the running members.
    pub async fn leader(&self) -> Option<usize> {
        for member in &self.members {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_timeout(Duration::from_secs(2));
            let Ok(mut client) =
                etcd_client::Client::connect([&member.client_url], Some(options)).await
            else {
                continue;
            };
            let Ok(status) = client.status().await else { continue };
            let mut ids = Vec::new();
            for other in &self.members {
                let options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(2));
                let id =
                    match etcd_client::Client::connect([&other.client_url], Some(options)).await {
                        Ok(mut c) => {
                            c.status().await.ok().and_then(|s| s.header().map(|h| h.member_id()))
                        }
                        Err(_) => None,
                    };
                ids.push(id);
            }
            return ids.iter().position(|id| *id == Some(status.leader()));
        }
        None
    }

    /// SIGKILL member `index`.
    pub fn kill(&mut self, index: usize) {
        self.members[index].kill();
    }

    /// All member logs, for failure messages.
    pub fn logs(&self) -> String {
        logs(&self.members)
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
    }
}

fn logs(members: &[EtcdMember]) -> String {
    members
        .iter()
        .map(|m| format!("--- {} ---\n{}", m.name, tail(&m.log(), 4000)))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_healthy(
    members: &mut [EtcdMember],
    tls: Option<&TlsFiles>,
) -> Result<(), EtcdProcessError> {
    let started = Instant::now();
    loop {
        for member in members.iter_mut() {
            if let Some(Ok(Some(status))) = member.child.as_mut().map(|c| c.try_wait()) {
                return Err(EtcdProcessError::Exited {
                    name: member.name.clone(),
                    status,
                    log: tail(&member.log(), 4000).to_owned(),
                });
            }
        }
        let last = match probe(members, tls).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if started.elapsed() > START_TIMEOUT {
            return Err(EtcdProcessError::Unhealthy {
                waited: started.elapsed(),
                last,
                logs: logs(members),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every member has a leader and serves a linearizable read.
async fn probe(members: &[EtcdMember], tls: Option<&TlsFiles>) -> Result<(), String> {
    for member in members {
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        if let Some(t) = tls {
            options = options.with_tls(t.client().tls_options());
        }
        let mut client = etcd_client::Client::connect([&member.client_url], Some(options))
            .await
            .map_err(|e| format!("{}: connect: {e}", member.name))?;
        let status = client.status().await.map_err(|e| format!("{}: status: {e}", member.name))?;
        if status.leader() == 0 {
            return Err(format!("{}: no leader yet", member.name));
        }
        client
            .get("health", None)
            .await
            .map_err(|e| format!("{}: linearizable read: {e}", member.name))?;
    }
    Ok(())
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Free loopback ports: bound all at once (so they are distinct), then released for etcd.
fn free_ports(count: usize) -> io::Result<Vec<u16>> {
    let listeners =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<io::Result<Vec<_>>>()?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

fn spawn_members(
    run: &Path,
    size: usize,
    tls: Option<&TlsFiles>,
) -> Result<Vec<EtcdMember>, EtcdProcessError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    std::fs::create_dir_all(run).map_err(EtcdProcessError::TempDir)?;
    let ports = free_ports(size * 2).map_err(EtcdProcessError::Ports)?;
    let mut members: Vec<EtcdMember> = (0..size)
        .map(|i| EtcdMember {
            name: format!("m{i}"),
            client_url: format!("{scheme}://127.0.0.1:{}", ports[2 * i]),
            peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
            data_dir: run.join(format!("m{i}")),
            log_path: run.join(format!("m{i}.log")),
            child: None,
        })
        .collect();
    let initial_cluster =
        members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect::<Vec<_>>().join(",");
    let token =
        format!("skiff-test-{}-{}", std::process::id(), ports.first().copied().unwrap_or_default());
    for member in &mut members {
        let log = File::create(&member.log_path)
            .map_err(|source| EtcdProcessError::Log { path: member.log_path.clone(), source })?;
        let log_err = log
            .try_clone()
            .map_err(|source| EtcdProcessError::Log { path: member.log_path.clone(), source })?;
        let mut command = Command::new(ETCD_BIN);
        // Settings from the environment (ETCD_*) would override the flags below.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &member.client_url])
            .args(["--advertise-client-urls", &member.client_url])
            .args(["--listen-peer-urls", &member.peer_url])
            .args(["--initial-advertise-peer-urls", &member.peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token])
            // Fast elections on loopback so a killed leader is replaced within a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .stdin(Stdio::null());
        if let Some(t) = tls {
            command
                .arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        command.stdout(log).stderr(log_err);
        let child = command
            .spawn()
            .map_err(|source| EtcdProcessError::Spawn { name: member.name.clone(), source })?;
        member.child = Some(child);
    }
    Ok(members)
}

/// The PEM files of a TLS cluster: its CA, the members' serving certificate (127.0.0.1 and
/// localhost) and a client certificate.
#[derive(Debug)]
struct TlsFiles {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl TlsFiles {
    fn generate(dir: &Path) -> Result<TlsFiles, EtcdProcessError> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let fail = |e: rcgen::Error| EtcdProcessError::TempDir(io::Error::other(e));
        std::fs::create_dir_all(dir).map_err(EtcdProcessError::TempDir)?;
        let write = |name: &str, pem: String| -> Result<PathBuf, EtcdProcessError> {
            let path = dir.join(name);
            std::fs::write(&path, pem).map_err(EtcdProcessError::TempDir)?;
            Ok(path)
        };
        let ca_key = KeyPair::generate().map_err(fail)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
        let ca_path = write("ca.crt", ca_cert.pem())?;
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>| -> Result<(String, String), EtcdProcessError> {
            let key = KeyPair::generate().map_err(fail)?;
            let cert = CertificateParams::new(names)
                .map_err(fail)?
                .signed_by(&key, &issuer)
                .map_err(fail)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()])?;
        let (client_cert, client_key) = leaf(vec!["skiff-server".into()])?;
        Ok(TlsFiles {
            ca: ca_path,
            server_cert: write("server.crt", server_cert)?,
            server_key: write("server.key", server_key)?,
            client_cert: write("client.crt", client_cert)?,
            client_key: write("client.key", client_key)?,
        })
    }

    fn client(&self) -> crate::etcd::EtcdTls {
        crate::etcd::EtcdTls::from_files(&self.ca, Some(&self.client_cert), Some(&self.client_key))
            .expect("the cluster's own PEM files")
    }
}
