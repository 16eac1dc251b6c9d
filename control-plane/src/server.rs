//! Running skiff-server: open the store, start the apiserver, serve HTTPS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::apiserver::authn::{AuthConfig, PeerCert};
use crate::apiserver::{self, ApiConfig, ApiServer};
use crate::pki::{self, Pki};
use crate::store::DynStore;

/// Which store backs the apiserver.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// The embedded store under `<data-dir>/store` (the default).
    Embedded,
    /// etcd v3 endpoints with a key prefix (for HA: several servers share one etcd).
    Etcd { endpoints: Vec<String>, prefix: String },
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
    pub controllers: Option<crate::controllers::ControllerConfig>,
    /// Run the scheduler in process while holding the `kube-scheduler` Lease.
    pub scheduler: Option<crate::scheduler::SchedulerConfig>,
    pub auth: AuthOptions,
}

/// Authentication and authorization options of skiff-server.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// `--token-auth-file`: static bearer tokens (CSV: token,user,uid,"group1,group2").
    pub token_auth_file: Option<PathBuf>,
    /// `--authorization-mode`: Node,RBAC (default) or AlwaysAllow.
    pub authorization: apiserver::authn::AuthorizationMode,
    /// `--insecure-http`: serve plain HTTP with authentication and authorization off (every
    /// request is an administrator). Local development only.
    pub insecure_http: bool,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            token_auth_file: None,
            authorization: apiserver::authn::AuthorizationMode::NodeRbac,
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
            auth: AuthOptions::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening the store")]
    Store(#[source] crate::store::Error),
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
    match &config.store {
        StoreConfig::Embedded => {
            let dir = config.data_dir.join("store");
            // redb's page cache stays small: reads are served from the watch cache, and the
            // store's cache would otherwise grow to 32 MiB with the data.
            let store_config =
                crate::store::embedded::EmbeddedConfig::default().cache_size(8 << 20);
            // Opening replays the write-ahead log: blocking work, off the async workers.
            let store = tokio::task::spawn_blocking(move || {
                crate::store::embedded::EmbeddedStore::open_with(&dir, store_config)
            })
            .await
            .map_err(|e| Error::Store(crate::store::Error::backend("opening the store", e)))?
            .map_err(Error::Store)?;
            Ok(Arc::new(store))
        }
        StoreConfig::Etcd { endpoints, prefix } => {
            let store = crate::store::etcd::EtcdStore::connect(endpoints, prefix)
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
    let host = if config.listen.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        config.listen.ip().to_string()
    };
    let pki = Pki::load_or_create(&config.data_dir, std::slice::from_ref(&host))?;
    let mut api_config = config.api.clone();
    api_config.auth = auth_config(&config, &pki)?;
    let store = open_store(&config).await?;
    let api = ApiServer::start(store, api_config).await?;
    api.spawn_compactor(config.api.compaction_interval);
    // Several skiff-servers on one store: one active scheduler and one active controller
    // set at a time, through leader election on Leases (as kube-scheduler and
    // kube-controller-manager do).
    let identity = format!("{}_{}", hostname(), uuid::Uuid::new_v4());
    if let Some(cc) = config.controllers.clone() {
        let client = api.client();
        let id = identity.clone();
        tokio::spawn(async move {
            crate::leader::run_leading(
                client.clone(),
                "kube-system",
                "kube-controller-manager",
                &id,
                Default::default(),
                || crate::controllers::run(client.clone(), cc.clone()),
            )
            .await
        });
    }
    if let Some(sc) = config.scheduler.clone() {
        let client = api.client();
        let id = identity.clone();
        tokio::spawn(async move {
            crate::leader::run_leading(
                client.clone(),
                "kube-system",
                "kube-scheduler",
                &id,
                Default::default(),
                || crate::scheduler::run(client.clone(), sc.clone()),
            )
            .await
        });
    }

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen { addr: config.listen, source })?;
    let addr =
        listener.local_addr().map_err(|source| Error::Listen { addr: config.listen, source })?;
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
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
                // rustls verified the chain against the cluster CA; the leaf names the user.
                let cert = PeerCert(
                    tls.get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| apiserver::authn::user_from_cert(c.as_ref())),
                );
                let service = TowerToHyperService::new(
                    tower::ServiceBuilder::new()
                        .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                            req.extensions_mut().insert(cert.clone());
                            req
                        })
                        .service(router),
                );
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder.http2().max_concurrent_streams(1000);
                if let Err(e) =
                    builder.serve_connection_with_upgrades(TokioIo::new(tls), service).await
                {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
            });
        }
    });
    tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "skiff-server is serving");
    Ok(Running { addr, api, kubeconfig })
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
