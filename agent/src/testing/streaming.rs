//! Shared rig of the streaming tests (this crate's and the workspace's): an agent streaming
//! endpoint over the in-memory runtime with fabricated containers and CRI log files, TLS
//! clients with and without the apiserver's certificate, and a fake runtime stream server
//! for exec.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::runtime::memory::MemoryRuntime;
use crate::runtime::{self, Runtime, api};
use crate::streaming::{self, StreamingConfig, StreamingServer};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use skiff_apiserver::pki::Pki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Restart 0 of a container: a partial line joined across stdout/stderr entries.
pub const LOG_0: &str = "2024-01-01T00:00:00Z stdout F first\n\
2024-01-01T00:00:01.5Z stdout P second \n\
2024-01-01T00:00:01.6Z stderr F half\n\
2024-01-01T00:00:02Z stdout F third\n";

/// The in-memory runtime, with `exec` answering a fixed streaming URL.
#[derive(Clone)]
pub struct ExecRuntime {
    pub memory: MemoryRuntime,
    pub exec_url: Option<String>,
    pub execs: Arc<Mutex<Vec<api::ExecRequest>>>,
}

impl Runtime for ExecRuntime {
    async fn version(&self) -> runtime::Result<api::VersionResponse> {
        self.memory.version().await
    }
    async fn image_status(&self, image: &str) -> runtime::Result<Option<api::Image>> {
        self.memory.image_status(image).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> runtime::Result<String> {
        self.memory.pull_image(image, auth, sandbox).await
    }
    async fn list_images(&self) -> runtime::Result<Vec<api::Image>> {
        self.memory.list_images().await
    }
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> runtime::Result<String> {
        self.memory.run_pod_sandbox(config).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> runtime::Result<()> {
        self.memory.stop_pod_sandbox(id).await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> runtime::Result<()> {
        self.memory.remove_pod_sandbox(id).await
    }
    async fn pod_sandbox_status(&self, id: &str) -> runtime::Result<api::PodSandboxStatus> {
        self.memory.pod_sandbox_status(id).await
    }
    async fn list_pod_sandboxes(
        &self,
        labels: &HashMap<String, String>,
    ) -> runtime::Result<Vec<api::PodSandbox>> {
        self.memory.list_pod_sandboxes(labels).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> runtime::Result<String> {
        self.memory.create_container(sandbox_id, config, sandbox_config).await
    }
    async fn start_container(&self, id: &str) -> runtime::Result<()> {
        self.memory.start_container(id).await
    }
    async fn stop_container(&self, id: &str, timeout_secs: i64) -> runtime::Result<()> {
        self.memory.stop_container(id, timeout_secs).await
    }
    async fn remove_container(&self, id: &str) -> runtime::Result<()> {
        self.memory.remove_container(id).await
    }
    async fn list_containers(
        &self,
        labels: &HashMap<String, String>,
    ) -> runtime::Result<Vec<api::Container>> {
        self.memory.list_containers(labels).await
    }
    async fn container_status(&self, id: &str) -> runtime::Result<api::ContainerStatus> {
        self.memory.container_status(id).await
    }
    async fn list_container_stats(&self) -> runtime::Result<Vec<api::ContainerStats>> {
        self.memory.list_container_stats().await
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> runtime::Result<api::ExecSyncResponse> {
        self.memory.exec_sync(id, cmd, timeout_secs).await
    }
    async fn exec(&self, request: api::ExecRequest) -> runtime::Result<String> {
        match &self.exec_url {
            Some(url) => {
                self.execs.lock().unwrap().push(request);
                Ok(url.clone())
            }
            None => self.memory.exec(request).await,
        }
    }
}

/// A node: PKI, root dir, runtime and the streaming endpoint on a loopback port.
pub struct Node {
    pub pki: Pki,
    pub pki_dir: tempfile::TempDir,
    pub root: tempfile::TempDir,
    pub runtime: MemoryRuntime,
    pub execs: Arc<Mutex<Vec<api::ExecRequest>>>,
    pub server: StreamingServer,
}

impl Node {
    pub async fn start() -> Node {
        Self::start_inner(None, None).await
    }

    pub async fn start_with_exec(url: String) -> Node {
        Self::start_inner(Some(url), None).await
    }

    /// With the PKI of an existing skiff-server data dir.
    pub async fn start_for_server(data_dir: &std::path::Path, exec_url: Option<String>) -> Node {
        Self::start_inner(exec_url, Some(data_dir)).await
    }

    async fn start_inner(exec_url: Option<String>, data_dir: Option<&std::path::Path>) -> Node {
        let pki_dir = tempfile::tempdir().expect("tmp");
        let pki = Pki::load_or_create(data_dir.unwrap_or(pki_dir.path()), &[]).expect("pki");
        let root = tempfile::tempdir().expect("tmp");
        let memory = MemoryRuntime::new();
        memory.add_image("skiff.test/tools:1");
        let execs = Arc::new(Mutex::new(Vec::new()));
        let rt = ExecRuntime { memory: memory.clone(), exec_url, execs: execs.clone() };
        let mut config =
            StreamingConfig::new(StreamingConfig::ca_from_pem(&pki.ca_cert_pem).expect("ca"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.root_dir = root.path().to_path_buf();
        let server = streaming::serve(rt, config).await.expect("streaming endpoint");
        Node { pki, pki_dir, root, runtime: memory, execs, server }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    pub fn execs(&self) -> Vec<api::ExecRequest> {
        self.execs.lock().unwrap().clone()
    }

    pub fn log_path(&self, ns: &str, pod: &str, uid: &str, c: &str, restart: u32) -> PathBuf {
        self.root.path().join(format!("pods/{ns}_{pod}_{uid}/{c}/{restart}.log"))
    }

    /// A running container with this log (the kubelet's layout, a relative log path).
    pub async fn container(
        &self,
        ns: &str,
        pod: &str,
        uid: &str,
        name: &str,
        restart: u32,
        log: &str,
    ) -> String {
        let path = self.log_path(ns, pod, uid, name, restart);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, log).unwrap();
        let labels = HashMap::from([
            (runtime::POD_UID_LABEL.to_string(), uid.to_string()),
            (runtime::POD_NAME_LABEL.to_string(), pod.to_string()),
            (runtime::POD_NAMESPACE_LABEL.to_string(), ns.to_string()),
        ]);
        let sandbox = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: pod.into(),
                uid: uid.into(),
                namespace: ns.into(),
                attempt: 0,
            }),
            labels: labels.clone(),
            log_directory: self
                .root
                .path()
                .join(format!("pods/{ns}_{pod}_{uid}"))
                .display()
                .to_string(),
            ..Default::default()
        };
        let sb = self.runtime.run_pod_sandbox(sandbox.clone()).await.unwrap();
        let mut clabels = labels;
        clabels.insert(runtime::CONTAINER_NAME_LABEL.into(), name.into());
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: restart }),
            image: Some(api::ImageSpec {
                image: "skiff.test/tools:1".into(),
                ..Default::default()
            }),
            labels: clabels,
            log_path: format!("{name}/{restart}.log"),
            ..Default::default()
        };
        let id = self.runtime.create_container(&sb, config, &sandbox).await.unwrap();
        self.runtime.start_container(&id).await.unwrap();
        // Distinct creation times (newest first ordering).
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        id
    }

    pub fn apiserver_tls(&self) -> rustls::ClientConfig {
        self.pki.kubelet_client_config().expect("client tls")
    }
}

pub fn append(path: &std::path::Path, s: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(s.as_bytes()).unwrap();
}

#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
}

pub fn anonymous_tls() -> rustls::ClientConfig {
    builder().with_no_client_auth()
}

pub fn client_tls(cert_pem: &str, key_pem: &str) -> rustls::ClientConfig {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    builder().with_client_auth_cert(certs, key).unwrap()
}

pub type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

pub async fn tls_connect(client: &rustls::ClientConfig, addr: SocketAddr) -> Result<Tls, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client.clone()));
    connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))
}

async fn request(
    client: &rustls::ClientConfig,
    addr: SocketAddr,
    path: &str,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    let tls = tls_connect(client, addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("TLS/HTTP: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(req).await.map_err(|e| format!("TLS/HTTP request: {e:?}"))
}

pub async fn try_get(
    client: &rustls::ClientConfig,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), String> {
    let resp = request(client, addr, path).await?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

pub async fn get(client: &rustls::ClientConfig, addr: SocketAddr, path: &str) -> (u16, String) {
    try_get(client, addr, path).await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A streamed response body, read chunk by chunk.
pub struct Stream(hyper::body::Incoming);

pub async fn open_stream(client: &rustls::ClientConfig, addr: SocketAddr, path: &str) -> Stream {
    let resp = request(client, addr, path).await.unwrap();
    assert_eq!(resp.status(), 200);
    Stream(resp.into_body())
}

impl Stream {
    pub async fn next_chunk(&mut self) -> String {
        loop {
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), self.0.frame())
                .await
                .expect("no log data within 10 s")
                .expect("stream ended")
                .expect("stream error");
            if let Ok(data) = frame.into_data() {
                return String::from_utf8_lossy(&data).into_owned();
            }
        }
    }

    pub async fn rest(self) -> String {
        let body = self.0.collect().await.expect("body").to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }
}

/// Send an upgrade request by hand; returns the response head and the connection.
pub async fn upgrade(
    client: &rustls::ClientConfig,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (String, Tls) {
    let mut io = tls_connect(client, addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    io.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut io).await;
    (head, io)
}

pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(io: &mut S) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), io.read(&mut b))
            .await
            .expect("no response head within 10 s")
            .unwrap();
        if n == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

pub async fn read_n<S: tokio::io::AsyncRead + Unpin>(io: &mut S, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(std::time::Duration::from_secs(10), io.read_exact(&mut buf))
        .await
        .expect("no data within 10 s")
        .unwrap();
    buf
}

/// A stand-in for containerd's stream server: answers any upgrade with 101 (SPDY, or the
/// first offered WebSocket protocol) and then echoes bytes upper-cased.
pub struct FakeStreamServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeStreamServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeStreamServer {
    pub async fn start() -> FakeStreamServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let head = read_head(&mut tcp).await;
                    s.lock().unwrap().push(head.clone());
                    let lower = head.to_ascii_lowercase();
                    let answer = if lower.contains("upgrade: websocket") {
                        let proto = lower
                            .lines()
                            .find_map(|l| l.strip_prefix("sec-websocket-protocol: "))
                            .and_then(|p| p.split(',').next())
                            .unwrap_or("")
                            .trim()
                            .to_string();
                        format!(
                            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: {proto}\r\n\r\n"
                        )
                    } else {
                        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n".to_string()
                    };
                    tcp.write_all(answer.as_bytes()).await.unwrap();
                    let mut buf = [0u8; 1024];
                    loop {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                let up = buf[..n].to_ascii_uppercase();
                                if tcp.write_all(&up).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        FakeStreamServer { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/exec/token123", self.addr)
    }

    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}
