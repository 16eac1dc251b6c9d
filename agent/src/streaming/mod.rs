//! The agent's authenticated endpoint: container logs, exec and resource metrics, for
//! skiff-server.
//!
//! HTTPS on port 10250 (the kubelet's), with the kubelet's paths:
//! - `GET /containerLogs/{ns}/{pod}/{container}?follow=&tailLines=&timestamps=&sinceSeconds=&sinceTime=&limitBytes=&previous=`
//!   streams the container's CRI log file ([`logs`]);
//! - `GET|POST /exec/{ns}/{pod}/{container}?command=..&stdin=&stdout=&stderr=&tty=` asks the
//!   runtime for a streaming URL (CRI `Exec`) and proxies the upgraded connection (SPDY/3.1 or
//!   WebSocket) to the runtime's stream server ([`exec`]);
//! - `GET /metrics/resource`: the node's and its containers' CPU time and working set, in
//!   the kubelet's resource metrics format ([`metrics`]), scraped for `kubectl top`.
//!
//! Only clients presenting a certificate signed by the cluster CA with the common name
//! [`APISERVER_CLIENT_CN`] are served: no certificate gets 401, another name 403, a
//! certificate from another CA fails the TLS handshake. The serving certificate is
//! self-signed at start (the apiserver does not verify kubelet serving certificates by
//! default, as upstream).

pub mod exec;
pub mod logs;
pub mod metrics;
mod response;
pub mod spdy;
pub mod websocket;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub(crate) use self::response::{Body, text};
use crate::runtime::{self, Runtime, api};

/// The common name of the apiserver's client certificate, the only client this endpoint
/// serves (skiff-server's `pki::KUBELET_CLIENT_CN` is the same string; a test checks it).
pub const APISERVER_CLIENT_CN: &str = "skiff-apiserver";

/// The kubelet's port, what `Node.status.daemonEndpoints.kubeletEndpoint.port` advertises.
pub const DEFAULT_PORT: u16 = 10250;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the serving certificate")]
    Certificate(#[source] rcgen::Error),
    #[error("loading the client CA: {0}")]
    ClientCa(String),
    #[error("configuring TLS")]
    Tls(#[source] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of the streaming endpoint.
#[derive(Debug, Clone)]
pub struct StreamingConfig {
    /// Listen address (default `0.0.0.0:10250`).
    pub listen: SocketAddr,
    /// The agent's root dir: pod logs are under `<root>/pods/<ns>_<name>_<uid>/`.
    pub root_dir: PathBuf,
    /// DER certificates of the CA(s) that sign the allowed client: the cluster CA, as in the
    /// agent's kubeconfig (`kube::Config::root_cert`).
    pub client_ca: Vec<Vec<u8>>,
    /// The common name the client certificate must carry.
    pub allowed_client: String,
    /// Names and addresses in the self-signed serving certificate (hostname, node IPs).
    pub serving_names: Vec<String>,
    /// The network namespace of the runtime's stream server (a loopback address) when it is
    /// not the agent's own: a node living in a namespace of its own, as in the test rig.
    /// `None` (the default) dials from the agent's namespace.
    pub runtime_netns: Option<PathBuf>,
}

impl StreamingConfig {
    /// Defaults (port 10250, `/var/lib/skiff/agent`, the apiserver's CN) for a cluster CA.
    pub fn new(client_ca: Vec<Vec<u8>>) -> Self {
        StreamingConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            root_dir: PathBuf::from("/var/lib/skiff/agent"),
            client_ca,
            allowed_client: APISERVER_CLIENT_CN.to_string(),
            serving_names: vec!["localhost".into()],
            runtime_netns: None,
        }
    }

    /// DER certificates from PEM text (for a CA read from a file).
    pub fn ca_from_pem(pem: &str) -> Result<Vec<Vec<u8>>> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .map(|c| c.map(|c| c.to_vec()).map_err(|e| Error::ClientCa(e.to_string())))
            .collect()
    }
}

/// The running endpoint; stops accepting (and ends open streams) on drop or [`shutdown`].
///
/// [`shutdown`]: StreamingServer::shutdown
pub struct StreamingServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl StreamingServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

impl Drop for StreamingServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

/// Start the endpoint.
pub async fn serve<R: Runtime>(runtime: R, config: StreamingConfig) -> Result<StreamingServer> {
    let tls = Arc::new(tls_config(&config)?);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen { addr: config.listen, source })?;
    let addr =
        listener.local_addr().map_err(|source| Error::Listen { addr: config.listen, source })?;
    let (stop, stopped) = watch::channel(false);
    let state = Arc::new(State { runtime, config });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "streaming endpoint: accepting a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let state = state.clone();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "streaming endpoint: TLS handshake failed");
                        return;
                    }
                };
                let client = Client::of(tls.get_ref().1.peer_certificates(), &state.config);
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    let client = client.clone();
                    async move { Ok::<_, Infallible>(handle(&state, &client, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades();
                tokio::select! {
                    r = conn => if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "streaming endpoint: connection ended");
                    },
                    _ = stopped.wait_for(|s| *s) => {}
                }
            });
        }
    });
    tracing::info!(%addr, "streaming endpoint is serving");
    Ok(StreamingServer { addr, stop, task })
}

fn tls_config(config: &StreamingConfig) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for der in &config.client_ca {
        roots.add(CertificateDer::from(der.clone())).map_err(Error::Tls)?;
    }
    if roots.is_empty() {
        return Err(Error::ClientCa("no CA certificate given".into()));
    }
    // Unauthenticated clients complete the handshake so that they get a 401 they can read;
    // a certificate that is presented must chain to the cluster CA.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| Error::ClientCa(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(
        config
            .serving_names
            .iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_err())
            .cloned()
            .collect::<Vec<_>>(),
    )
    .map_err(Error::Certificate)?;
    for ip in config.serving_names.iter().filter_map(|n| n.parse::<std::net::IpAddr>().ok()) {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    }
    params.distinguished_name.push(rcgen::DnType::CommonName, "skiff-agent");
    let key = rcgen::KeyPair::generate().map_err(Error::Certificate)?;
    let cert = params.self_signed(&key).map_err(Error::Certificate)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.der().clone()], key)
        .map_err(Error::Tls)?;
    // Upgrades (SPDY, WebSocket) are HTTP/1.1 only.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Client {
    /// No client certificate.
    Anonymous,
    /// A CA-signed certificate with the allowed name.
    Allowed,
    /// A CA-signed certificate with another name.
    Other(String),
}

impl Client {
    fn of(certs: Option<&[CertificateDer<'_>]>, config: &StreamingConfig) -> Client {
        let Some(leaf) = certs.and_then(|c| c.first()) else { return Client::Anonymous };
        let cn = x509_parser::parse_x509_certificate(leaf)
            .ok()
            .and_then(|(_, cert)| {
                cert.subject()
                    .iter_common_name()
                    .next()
                    .and_then(|cn| cn.as_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        if cn == config.allowed_client { Client::Allowed } else { Client::Other(cn) }
    }
}

struct State<R> {
    runtime: R,
    config: StreamingConfig,
}

async fn handle<R: Runtime>(
    state: &Arc<State<R>>,
    client: &Client,
    req: Request<Incoming>,
) -> Response<Body> {
    match client {
        Client::Allowed => {}
        Client::Anonymous => return text(StatusCode::UNAUTHORIZED, "Unauthorized"),
        Client::Other(cn) => {
            return text(
                StatusCode::FORBIDDEN,
                format!("Forbidden: user \"{cn}\" may not use the node's streaming endpoint"),
            );
        }
    }
    let path = req.uri().path().to_string();
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned())
        .collect();
    let query: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    match (req.method(), segments.iter().map(String::as_str).collect::<Vec<_>>().as_slice()) {
        (&Method::GET, ["containerLogs", ns, pod, container]) => {
            container_logs(state, ns, pod, container, &query).await
        }
        (&Method::GET | &Method::POST, ["exec", ns, pod, container]) => {
            let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
            let netns = state.config.runtime_netns.as_deref();
            exec::exec(&state.runtime, netns, req, &ns, &pod, &container, &query).await
        }
        (&Method::GET, ["metrics", "resource"]) => {
            let scrape = metrics::scrape(&state.runtime).await;
            let body = skiff_core::resource_metrics::render(&scrape);
            let mut resp = text(StatusCode::OK, body);
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok"),
        _ => text(StatusCode::NOT_FOUND, format!("404 page not found: {path}")),
    }
}

async fn container_logs<R: Runtime>(
    state: &Arc<State<R>>,
    ns: &str,
    pod: &str,
    container: &str,
    query: &[(String, String)],
) -> Response<Body> {
    let opts = match logs::LogOptions::from_query(query, jiff::Timestamp::now()) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (path, follow_id) = match resolve_log(state, ns, pod, container, opts.previous).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let mut opts = opts;
    opts.follow &= follow_id.is_some();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let alive = ContainerAlive { state: state.clone(), id: follow_id.unwrap_or_default() };
    tokio::spawn(async move {
        if let Err(e) = logs::stream(&path, &opts, alive, tx).await {
            tracing::warn!(error = %e, "streaming a container log");
        }
    });
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(Frame::data(b)), rx))
    }));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The log file to read, and the container to follow (none for a previous instance).
async fn resolve_log<R: Runtime>(
    state: &Arc<State<R>>,
    ns: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<(PathBuf, Option<String>), Response<Body>> {
    let mut containers = exec::find_containers(&state.runtime, ns, pod, container)
        .await
        .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, format!("listing containers: {e}")))?;
    let Some(newest) = containers.first().cloned() else {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!("container \"{container}\" in pod \"{pod}\" is not available"),
        ));
    };
    // Instances of this pod only (a pod re-created under the same name has another UID).
    let uid = newest.labels.get(runtime::POD_UID_LABEL).cloned().unwrap_or_default();
    containers.retain(|c| c.labels.get(runtime::POD_UID_LABEL).map_or("", String::as_str) == uid);
    let pod_dir = state.config.root_dir.join("pods").join(format!("{ns}_{pod}_{uid}"));
    let current =
        state.runtime.container_status(&newest.id).await.map_err(|e| {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("container status: {e}"))
        })?;
    if current.log_path.is_empty() {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!("container \"{container}\" in pod \"{pod}\" has no log"),
        ));
    }
    let current_path = absolute(&pod_dir, &current.log_path);
    let (path, follow) = if previous {
        // The previous instance's own status, else the kubelet's file naming.
        let mut found = None;
        if let Some(older) = containers.get(1)
            && let Ok(s) = state.runtime.container_status(&older.id).await
            && !s.log_path.is_empty()
        {
            found = Some(absolute(&pod_dir, &s.log_path));
        }
        if found.is_none() {
            found = previous_log(&current_path).await;
        }
        let Some(path) = found else {
            return Err(text(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container \"{container}\" in pod \"{pod}\" not found"),
            ));
        };
        (path, None)
    } else {
        (current_path, Some(newest.id))
    };
    if let Err(e) = tokio::fs::metadata(&path).await {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!(
                "reading log of container \"{container}\" in pod \"{pod}\": {}: {e}",
                path.display()
            ),
        ));
    }
    Ok((path, follow))
}

/// A log path as the runtime reports it: containerd gives it absolute; relative ones are
/// under the pod's log directory.
fn absolute(pod_dir: &Path, log_path: &str) -> PathBuf {
    let p = Path::new(log_path);
    if p.is_absolute() { p.to_path_buf() } else { pod_dir.join(p) }
}

/// The log of the container's previous instance: `<n>.log` with the highest `n` below the
/// current one's, in the same directory.
async fn previous_log(current: &Path) -> Option<PathBuf> {
    let number =
        |p: &Path| -> Option<u64> { p.file_name()?.to_str()?.strip_suffix(".log")?.parse().ok() };
    let now = number(current)?;
    let mut dir = tokio::fs::read_dir(current.parent()?).await.ok()?;
    let mut best: Option<(u64, PathBuf)> = None;
    while let Ok(Some(entry)) = dir.next_entry().await {
        let path = entry.path();
        if let Some(n) = number(&path)
            && n < now
            && best.as_ref().is_none_or(|(b, _)| n > *b)
        {
            best = Some((n, path));
        }
    }
    best.map(|(_, p)| p)
}

/// Follow ends when the container no longer runs.
struct ContainerAlive<R> {
    state: Arc<State<R>>,
    id: String,
}

impl<R: Runtime> logs::Liveness for ContainerAlive<R> {
    async fn running(&mut self) -> bool {
        match self.state.runtime.container_status(&self.id).await {
            Ok(s) => s.state == api::ContainerState::ContainerRunning as i32,
            Err(_) => false,
        }
    }
}
