//! Running skiff-server: open the store, start the apiserver, serve HTTPS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use skiff_apiserver::authn::{AuthConfig, PeerCert};
use skiff_apiserver::pki::{self, Pki};
use skiff_apiserver::{self as apiserver, ApiConfig, ApiServer};
use skiff_store::DynStore;

/// Which store backs the apiserver.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// The embedded store under `<data-dir>/store` (the default).
    Embedded,
    /// etcd v3 endpoints with a key prefix (for HA: several servers share one etcd).
    /// `tls`: the CA and client certificate (`--etcd-cafile`, `--etcd-certfile`,
    /// `--etcd-keyfile`); endpoints without a scheme are then `https://`.
    Etcd { endpoints: Vec<String>, prefix: String, tls: Option<skiff_store::etcd::EtcdTls> },
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the store, the PKI and admin.kubeconfig live (default /var/lib/skiff/server).
    pub data_dir: PathBuf,
    /// HTTPS listen address (default 0.0.0.0:6443, upstream's secure port).
    pub listen: SocketAddr,
    pub store: StoreConfig,
    pub api: ApiConfig,
    /// Run the controllers in process (over the apiserver's in-memory client), while this
    /// server holds the `kube-controller-manager` Lease. `None` keeps a bare apiserver (the
    /// library default, what the API tests use; the skiff-server binary turns it on).
    pub controllers: Option<skiff_controllers::ControllerConfig>,
    /// Run the scheduler in process while holding the `kube-scheduler` Lease.
    pub scheduler: Option<skiff_scheduler::SchedulerConfig>,
    /// `--advertise-address`: the address the `kubernetes` Service's endpoints name. By
    /// default the listen address, or when that is unspecified the host's address on the
    /// interface of its default route (as upstream's `ChooseHostInterface`).
    pub advertise_address: Option<IpAddr>,
    /// `--tls-san`: more names and addresses for the serving certificate (a load
    /// balancer's, a DNS name the agents use).
    pub tls_sans: Vec<String>,
    /// Encryption at rest: an EncryptionConfiguration file (`--encryption-provider-config`).
    pub encryption_provider_config: Option<PathBuf>,
    /// Encryption at rest of Secrets with one AES-GCM key (`--encryption-key-file`).
    pub encryption_key_file: Option<PathBuf>,
    pub auth: AuthOptions,
    pub connections: ConnectionLimits,
}

/// What a connection may cost before it has proven to be a client: the bounds that keep
/// connections which never finish their TLS handshake or request head from holding file
/// descriptors for ever.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A TLS handshake not finished within this is dropped (10 s, Go's `http.Server`
    /// `TLSHandshakeTimeout` default for clients, enough for any real one).
    pub tls_handshake_timeout: Duration,
    /// The head of a request (the first after the handshake, and each next one on an
    /// HTTP/1 connection) must arrive within this (32 s, kube-apiserver's
    /// `ReadHeaderTimeout`).
    pub request_header_timeout: Duration,
    /// Connections open at once; more are refused with a log line. `None`: what the
    /// process's open-file limit allows, less a reserve for the store and logs.
    pub max_connections: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            tls_handshake_timeout: Duration::from_secs(10),
            request_header_timeout: Duration::from_secs(32),
            max_connections: None,
        }
    }
}

/// File descriptors kept for everything but client connections (store files, logs,
/// connections to agents and etcd).
const FD_RESERVE: u64 = 512;

impl ConnectionLimits {
    /// The connection limit in effect.
    pub fn max_connections(&self) -> usize {
        self.max_connections.unwrap_or_else(|| {
            let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024);
            usize::try_from(soft.saturating_sub(FD_RESERVE).clamp(64, 1 << 20)).unwrap_or(64)
        })
    }
}

/// Raise the soft open-file limit to the hard one (a server holds a descriptor per
/// connection; the usual soft default of 1024 is a few hundred idle clients). Returns the
/// limit in effect.
pub fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "raising the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "reading the open-file limit");
            1024
        }
    }
}

/// Authentication and authorization options of skiff-server.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// `--token-auth-file`: static bearer tokens (CSV: token,user,uid,"group1,group2").
    pub token_auth_file: Option<PathBuf>,
    /// `--authorization-mode`: Node,RBAC (default) or AlwaysAllow.
    pub authorization: apiserver::authz::AuthorizationMode,
    /// `--insecure-http`: serve plain HTTP with authentication and authorization off (every
    /// request is an administrator). Local development only.
    pub insecure_http: bool,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            token_auth_file: None,
            authorization: apiserver::authz::AuthorizationMode::NodeRbac,
            insecure_http: false,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("/var/lib/skiff/server"),
            listen: "0.0.0.0:6443".parse().expect("valid default address"),
            store: StoreConfig::Embedded,
            api: ApiConfig::default(),
            controllers: None,
            scheduler: None,
            advertise_address: None,
            tls_sans: Vec::new(),
            encryption_provider_config: None,
            encryption_key_file: None,
            auth: AuthOptions::default(),
            connections: ConnectionLimits::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening the store")]
    Store(#[source] skiff_store::Error),
    #[error("loading the encryption configuration")]
    Encryption(#[source] skiff_store::encryption::Error),
    #[error("setting up the PKI")]
    Pki(#[from] pki::Error),
    #[error("loading the token file")]
    TokenFile(#[source] apiserver::authn::Error),
    #[error("starting the apiserver")]
    Api(#[from] apiserver::Error),
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A started server: its address and the apiserver state (for in-process clients).
pub struct Running {
    pub addr: SocketAddr,
    pub api: Arc<ApiServer>,
    pub kubeconfig: PathBuf,
}

pub async fn open_store(config: &ServerConfig) -> Result<DynStore, Error> {
    use skiff_store::encryption::{EncryptedStore, EncryptionConfig};
    let encryption = match (&config.encryption_provider_config, &config.encryption_key_file) {
        (Some(path), _) => Some(EncryptionConfig::from_file(path).map_err(Error::Encryption)?),
        (None, Some(path)) => {
            Some(EncryptionConfig::from_key_file(path).map_err(Error::Encryption)?)
        }
        (None, None) => None,
    };
    let store = open_backend(config).await?;
    Ok(match encryption {
        Some(e) => Arc::new(EncryptedStore::new(store, e)),
        None => store,
    })
}

async fn open_backend(config: &ServerConfig) -> Result<DynStore, Error> {
    match &config.store {
        StoreConfig::Embedded => {
            let dir = config.data_dir.join("store");
            // redb's page cache stays small: reads are served from the watch cache, writes
            // reach redb only at checkpoints, and the cache would otherwise grow to 32 MiB
            // with the data (4 MiB holds the B-tree's branch pages at 100k pods).
            let store_config = skiff_store::embedded::EmbeddedConfig::default().cache_size(4 << 20);
            // Opening replays the write-ahead log: blocking work, off the async workers.
            let store = tokio::task::spawn_blocking(move || {
                skiff_store::embedded::EmbeddedStore::open_with(&dir, store_config)
            })
            .await
            .map_err(|e| Error::Store(skiff_store::Error::backend("opening the store", e)))?
            .map_err(Error::Store)?;
            Ok(Arc::new(store))
        }
        StoreConfig::Etcd { endpoints, prefix, tls } => {
            let etcd_config =
                skiff_store::etcd::EtcdConfig { tls: tls.clone(), ..Default::default() };
            let store = skiff_store::etcd::EtcdStore::connect_with(endpoints, prefix, etcd_config)
                .await
                .map_err(Error::Store)?;
            Ok(Arc::new(store))
        }
    }
}

/// Start everything and serve until the process ends.
pub async fn start(config: ServerConfig) -> Result<Running, Error> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|source| Error::Listen { addr: config.listen, source })?;
    let pki = Pki::load_or_create(&config.data_dir, &serving_hosts(&config))?;
    // The admin kubeconfig names the listen address, or loopback when listening on all.
    let host = if config.listen.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        config.listen.ip().to_string()
    };
    let mut api_config = config.api.clone();
    api_config.auth = auth_config(&config, &pki)?;
    api_config.kubelet_client =
        Some(apiserver::kubelet::KubeletClient::new(pki.kubelet_client_config()?));
    api_config.front_proxy = Some(apiserver::config::FrontProxy {
        ca_cert_pem: pki.front_proxy_ca_cert_pem.clone(),
        client_cert_pem: pki.front_proxy_client_cert_pem.clone(),
        client_key_pem: pki.front_proxy_client_key_pem.clone(),
    });
    let store = open_store(&config).await?;
    let api = ApiServer::start(store, api_config).await?;
    api.spawn_compactor(config.api.compaction_interval);
    api.spawn_bootstrap_repair(config.api.bootstrap_repair_interval);
    api.spawn_metrics_scraper(config.api.metric_resolution);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen { addr: config.listen, source })?;
    let addr =
        listener.local_addr().map_err(|source| Error::Listen { addr: config.listen, source })?;
    // Several skiff-servers on one store: one active scheduler and one active controller
    // set at a time, through leader election on Leases (as kube-scheduler and
    // kube-controller-manager do).
    let identity = format!("{}_{}", hostname(), uuid::Uuid::new_v4());
    if let Some(mut cc) = config.controllers.clone() {
        if cc.root_ca_pem.is_none() {
            cc.root_ca_pem = Some(pki.ca_cert_pem.clone());
        }
        if cc.signing_ca.is_none() {
            cc.signing_ca = Some(skiff_controllers::context::SigningCa {
                cert_pem: pki.ca_cert_pem.clone(),
                key_pem: pki.ca_key_pem.clone(),
            });
        }
        if cc.apiserver_endpoint.is_none() {
            cc.apiserver_endpoint = apiserver_endpoint(&config, addr.port());
        }
        let client = api.client_as("kube-controller-manager");
        let id = identity.clone();
        let health = api.components.clone();
        tokio::spawn(async move {
            crate::leader::run_leading(
                client.clone(),
                "kube-system",
                "kube-controller-manager",
                &id,
                Default::default(),
                || skiff_controllers::run(client.clone(), cc.clone(), health.clone()),
            )
            .await
        });
    }
    if let Some(sc) = config.scheduler.clone() {
        let client = api.client_as("kube-scheduler");
        let id = identity.clone();
        let health = api.components.clone();
        tokio::spawn(async move {
            crate::leader::run_leading(
                client.clone(),
                "kube-system",
                "kube-scheduler",
                &id,
                Default::default(),
                || {
                    let (client, sc) = (client.clone(), sc.clone());
                    skiff_core::supervisor::supervise(
                        "scheduler",
                        health.clone(),
                        Default::default(),
                        move || skiff_scheduler::run(client.clone(), sc.clone()),
                    )
                },
            )
            .await
        });
    }

    let kubeconfig = config.data_dir.join("admin.kubeconfig");
    let router = api.router();
    if config.auth.insecure_http {
        write_insecure_kubeconfig(&kubeconfig, &format!("http://{host}:{}", addr.port()))?;
        tracing::warn!(%addr, "serving plain HTTP without authentication (--insecure-http)");
        serve_plain(listener, router);
        return Ok(Running { addr, api, kubeconfig });
    }
    pki.write_admin_kubeconfig(&kubeconfig, &format!("https://{host}:{}", addr.port()))?;
    let acceptor = TlsAcceptor::from(Arc::new(pki.server_config()?));
    let limits = config.connections;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections()));
    tokio::spawn(async move {
        let mut refusals = Refusals::default();
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE/ENFILE among others: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                refusals.refused(peer, limits.max_connections());
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let tls =
                    match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(t)) => t,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                // rustls verified the chain against the cluster CA; the leaf names the user.
                let cert = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| PeerCert::from_der(c.as_ref()))
                    .unwrap_or_default();
                let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let seen_by_service = seen.clone();
                let service = TowerToHyperService::new(
                    tower::ServiceBuilder::new()
                        .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                            seen_by_service.store(true, std::sync::atomic::Ordering::Relaxed);
                            req.extensions_mut().insert(cert.clone());
                            // The peer's address for the audit log's sourceIPs.
                            req.extensions_mut().insert(apiserver::audit::PeerAddr(peer));
                            req
                        })
                        .service(router),
                );
                serve_connection(TokioIo::new(tls), service, &limits, &seen, peer).await;
            });
        }
    });
    tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "skiff-server is serving");
    Ok(Running { addr, api, kubeconfig })
}

/// The (address, port) the `kubernetes` Service's endpoints name; `None` when only a
/// loopback address is known (Endpoints may not hold loopback addresses).
fn apiserver_endpoint(config: &ServerConfig, port: u16) -> Option<(String, u16)> {
    let ip = config.advertise_address.or_else(|| {
        let listen = config.listen.ip();
        if listen.is_unspecified() { host_address().map(IpAddr::V4) } else { Some(listen) }
    });
    match ip {
        Some(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some((ip.to_string(), port)),
        _ => {
            tracing::info!(
                "no non-loopback advertise address: the kubernetes Service gets no endpoints"
            );
            None
        }
    }
}

/// The host's IPv4 address on the interface of its default route (else any non-loopback
/// local address), from /proc/net/route and /proc/net/fib_trie.
pub fn host_address() -> Option<Ipv4Addr> {
    let route = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let trie = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    choose_host_address(&route, &trie)
}

/// [`host_address`] on the two files' contents.
pub fn choose_host_address(route: &str, fib_trie: &str) -> Option<Ipv4Addr> {
    // /proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask ..., the
    // addresses in little-endian hex.
    let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(|v| Ipv4Addr::from(v.swap_bytes()));
    let rows: Vec<(String, Ipv4Addr, Ipv4Addr)> = route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), hex(f.get(1)?)?, hex(f.get(7)?)?))
        })
        .collect();
    let default_iface = rows
        .iter()
        .find(|(_, dst, mask)| dst.is_unspecified() && mask.is_unspecified())
        .map(|(i, _, _)| i.clone());
    let subnets: Vec<(u32, u32)> = rows
        .iter()
        .filter(|(i, _, mask)| Some(i) == default_iface.as_ref() && !mask.is_unspecified())
        .map(|(_, dst, mask)| (u32::from(*dst), u32::from(*mask)))
        .collect();
    let locals = fib_local_addresses(fib_trie);
    locals
        .iter()
        .find(|ip| subnets.iter().any(|(net, mask)| u32::from(**ip) & mask == *net))
        .or(locals.first())
        .copied()
}

/// The host's local non-loopback IPv4 addresses, from /proc/net/fib_trie.
pub fn local_addresses() -> Vec<Ipv4Addr> {
    fib_local_addresses(&std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default())
}

/// The local non-loopback addresses in /proc/net/fib_trie: "|-- <ip>" followed by
/// "/32 host LOCAL".
fn fib_local_addresses(fib_trie: &str) -> Vec<Ipv4Addr> {
    let mut locals: Vec<Ipv4Addr> = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            last = ip.parse().ok();
        } else if t == "/32 host LOCAL"
            && let Some(ip) = last
            && !ip.is_loopback()
            && !locals.contains(&ip)
        {
            locals.push(ip);
        }
    }
    locals
}

/// The names and addresses the serving certificate must hold besides the built-in ones:
/// `--tls-san`, the advertise and listen addresses, the host's name and, when listening on
/// every address, each local address (as k3s puts its node IPs and hostname in it).
fn serving_hosts(config: &ServerConfig) -> Vec<String> {
    let mut hosts: Vec<String> = config.tls_sans.clone();
    hosts.extend(config.advertise_address.map(|a| a.to_string()));
    let listen = config.listen.ip();
    if listen.is_unspecified() {
        hosts.push(hostname());
        hosts.extend(local_addresses().iter().map(Ipv4Addr::to_string));
    } else {
        hosts.push(listen.to_string());
    }
    hosts
}

fn auth_config(config: &ServerConfig, pki: &Pki) -> Result<AuthConfig, Error> {
    let static_tokens = match &config.auth.token_auth_file {
        Some(path) => apiserver::authn::tokens::load_token_file(path).map_err(Error::TokenFile)?,
        None => Vec::new(),
    };
    Ok(AuthConfig {
        enabled: !config.auth.insecure_http,
        authorization: config.auth.authorization,
        static_tokens,
        sa_key_pem: pki.sa_key_pem.clone(),
        sa_pub_pem: pki.sa_pub_pem.clone(),
        ca_cert_pem: pki.ca_cert_pem.clone(),
        ca_key_pem: pki.ca_key_pem.clone(),
        ..config.api.auth.clone()
    })
}

fn write_insecure_kubeconfig(path: &std::path::Path, server: &str) -> Result<(), Error> {
    let cfg = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server}\ncontexts:\n- name: admin@skiff\n  context:\n    cluster: skiff\n    user: admin\ncurrent-context: admin@skiff\nusers:\n- name: admin\n  user: {{}}\n"
    );
    std::fs::write(path, cfg)
        .map_err(|source| Error::Pki(pki::Error::Io { path: path.to_path_buf(), source }))
}

/// Serve one connection (HTTP/1 or HTTP/2), closing it if no request head has arrived
/// within the header timeout (hyper's own HTTP/1 timeout covers the later ones; HTTP/2
/// peers that stop answering pings are dropped too).
async fn serve_connection<I, S>(
    io: I,
    service: S,
    limits: &ConnectionLimits,
    seen: &std::sync::atomic::AtomicBool,
    peer: SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<axum::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use hyper_util::rt::TokioTimer;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.request_header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1000)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let conn = builder.serve_connection_with_upgrades(io, service);
    let first_request = async {
        tokio::time::sleep(limits.request_header_timeout).await;
        if seen.load(std::sync::atomic::Ordering::Relaxed) {
            futures::future::pending::<()>().await;
        }
    };
    tokio::select! {
        ended = conn => {
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        }
        () = first_request => tracing::debug!(%peer, "no request head in time; closing"),
    }
}

/// Connections refused at the limit: one warning at the first, then at most one every
/// 10 s with the count since.
#[derive(Default)]
struct Refusals {
    since_warning: u64,
    warned: Option<std::time::Instant>,
}

impl Refusals {
    fn refused(&mut self, peer: SocketAddr, limit: usize) {
        self.since_warning += 1;
        if self.warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(
                %peer,
                limit,
                refused = self.since_warning,
                "connection limit reached: refusing new connections (raise --max-connections or the open-file limit)"
            );
            self.warned = Some(std::time::Instant::now());
            self.since_warning = 0;
        }
    }
}

fn serve_plain(listener: TcpListener, router: axum::Router) {
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                if let Err(e) =
                    builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).await
                {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
            });
        }
    });
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "skiff-server".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
";

    const TRIE: &str = "Local:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
     |-- 172.17.0.1
        /32 host LOCAL
     +-- 192.0.2.0/24 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
";

    #[test]
    fn host_address_is_on_the_default_route_interface() {
        assert_eq!(choose_host_address(ROUTE, TRIE), Some(Ipv4Addr::new(192, 0, 2, 2)));
        // Without a default route: any non-loopback local address.
        assert_eq!(choose_host_address("", TRIE), Some(Ipv4Addr::new(172, 17, 0, 1)));
        assert_eq!(choose_host_address(ROUTE, "|-- 127.0.0.1\n/32 host LOCAL\n"), None);
    }

    #[test]
    fn loopback_advertise_addresses_get_no_endpoints() {
        let mut c =
            ServerConfig { listen: "127.0.0.1:6443".parse().expect("addr"), ..Default::default() };
        assert_eq!(apiserver_endpoint(&c, 6443), None);
        c.advertise_address = Some("192.0.2.7".parse().expect("ip"));
        assert_eq!(apiserver_endpoint(&c, 7443), Some(("192.0.2.7".into(), 7443)));
        c.advertise_address = None;
        c.listen = "192.0.2.8:6443".parse().expect("addr");
        assert_eq!(apiserver_endpoint(&c, 6443), Some(("192.0.2.8".into(), 6443)));
    }
}
