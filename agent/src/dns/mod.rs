//! Cluster DNS served from the agent's watch cache (Services, EndpointSlices, Pods).
//!
//! The stages, one module each: [`records`] synthesizes the records of one object (pure),
//! [`cache`] keeps the [`zone`] index in step with the watches, [`server`] answers UDP and
//! TCP queries from it, [`forward`] sends other names upstream with a bounded cache,
//! [`link`] puts the node-local listen address on a dummy link, and [`resolv`] gives each
//! pod sandbox its resolv.conf (dnsPolicy, dnsConfig) pointing at it.
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> Result<(), skiff_agent::dns::Error> {
//! use skiff_agent::dns::{self, DnsConfig};
//! let config = DnsConfig::default().with_resolv_conf("/etc/resolv.conf".as_ref())?;
//! dns::ensure_listen_address(config.listen[0].ip()).await?;
//! let server = dns::serve(client, config).await?;
//! // ... pods use 169.254.20.10 as their nameserver; dropping `server` stops it.
//! # drop(server); Ok(()) }
//! ```

pub mod cache;
pub mod forward;
pub mod link;
pub mod records;
pub mod resolv;
pub mod server;
pub mod zone;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::rr::Name;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tracing::info;

use skiff_core::informers::Informers;

pub use link::{
    DNS_LINK, ensure_listen_address, ensure_listen_address_with, remove_listen_address,
    remove_listen_address_with,
};
pub use resolv::{ClusterDns, DEFAULT_DNS_ADDRESS, HostResolv, sandbox_dns_config};
pub use server::DnsStats;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster domain {domain:?} is not a valid DNS name")]
    Domain {
        domain: String,
        #[source]
        source: hickory_proto::ProtoError,
    },
    #[error("no listen address configured")]
    NoListenAddress,
    #[error("binding UDP {addr}")]
    BindUdp {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("binding TCP {addr}")]
    BindTcp {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the upstream resolvers")]
    Upstreams(#[from] forward::Error),
    #[error("configuring the DNS listen address")]
    Link(#[from] link::Error),
}

/// How the cluster DNS serves. `Default` is the node agent's setup.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// Where to listen, UDP and TCP on each (default `169.254.20.10:53`, the address pods
    /// get as nameserver; a port 0 picks one free port for both UDP and TCP).
    pub listen: Vec<SocketAddr>,
    /// The cluster domain (default `cluster.local`, the kubelet's `--cluster-domain`).
    pub cluster_domain: String,
    /// TTL of cluster records and of negative answers (default 5 s, CoreDNS's
    /// `kubernetes` plugin default: short, so answers follow the watches).
    pub ttl: Duration,
    /// Resolvers for names outside the cluster domain (default none: such names get
    /// REFUSED; the agent passes the node's resolv.conf nameservers, see
    /// [`DnsConfig::with_resolv_conf`]). Our own listen addresses are never used.
    pub upstreams: Vec<SocketAddr>,
    /// How long one upstream has to answer before the next is tried (default 2 s, as
    /// CoreDNS's forward plugin dial/read timeouts).
    pub upstream_timeout: Duration,
    /// Forwarded answers kept (default 10,000 entries, CoreDNS's cache plugin capacity order).
    pub forward_cache_entries: usize,
    /// Longest time a forwarded answer is cached (default 30 s, NodeLocal DNSCache's
    /// `cache 30` for external names).
    pub forward_cache_max_ttl: Duration,
    /// Forwarded queries in flight at once over UDP; more are dropped (default 1,000,
    /// CoreDNS forward's `max_concurrent` order of magnitude).
    pub max_inflight: usize,
    /// TCP connections at once; more are closed on accept (default 256).
    pub max_tcp_connections: usize,
    /// A TCP connection idle this long is closed (default 10 s, RFC 7766's suggestion).
    pub tcp_idle_timeout: Duration,
    /// Receive tasks per UDP socket (default: available cores, at most 4).
    pub udp_workers: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            listen: vec![SocketAddr::new(DEFAULT_DNS_ADDRESS, 53)],
            cluster_domain: "cluster.local".into(),
            ttl: Duration::from_secs(5),
            upstreams: Vec::new(),
            upstream_timeout: Duration::from_secs(2),
            forward_cache_entries: 10_000,
            forward_cache_max_ttl: Duration::from_secs(30),
            max_inflight: 1000,
            max_tcp_connections: 256,
            tcp_idle_timeout: Duration::from_secs(10),
            udp_workers: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
        }
    }
}

impl DnsConfig {
    pub fn with_listen(mut self, listen: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.listen = listen.into_iter().collect();
        self
    }

    pub fn with_cluster_domain(mut self, domain: impl Into<String>) -> Self {
        self.cluster_domain = domain.into();
        self
    }

    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    pub fn with_upstreams(mut self, upstreams: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.upstreams = upstreams.into_iter().collect();
        self
    }

    /// Upstreams from the `nameserver` lines of a resolv.conf (the node's `/etc/resolv.conf`).
    pub fn with_resolv_conf(mut self, path: &Path) -> Result<Self> {
        self.upstreams = forward::upstreams_from_resolv_conf(path)?;
        Ok(self)
    }
}

/// A running DNS server. Stops (listeners closed, watches ended) on drop or [`shutdown`].
///
/// [`shutdown`]: DnsServer::shutdown
pub struct DnsServer {
    local: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
    synced: watch::Receiver<bool>,
    handler: Arc<server::Handler>,
}

impl DnsServer {
    /// The bound addresses (UDP and TCP each listen on every one).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local
    }

    /// Waits until Services, EndpointSlices and Pods have been listed once (before that,
    /// cluster names get SERVFAIL so that clients retry instead of caching NXDOMAIN).
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub fn stats(&self) -> DnsStats {
        self.handler.counters.snapshot()
    }

    /// A reader of the counters that outlives no one (for the metrics endpoint).
    pub fn stats_reader(&self) -> impl Fn() -> DnsStats + Send + Sync + 'static {
        let handler = Arc::downgrade(&self.handler);
        move || handler.upgrade().map(|h| h.counters.snapshot()).unwrap_or_default()
    }

    /// Forwarded answers currently cached.
    pub fn forward_cache_len(&self) -> usize {
        self.handler.forwarder.cached()
    }

    /// Stops every task and closes the sockets.
    pub async fn shutdown(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Binds UDP and TCP on `addr` (for port 0, the same free port for both).
async fn bind(addr: SocketAddr) -> Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind(addr).await.map_err(|source| Error::BindUdp { addr, source })?;
        let local = udp.local_addr().map_err(|source| Error::BindUdp { addr, source })?;
        match TcpListener::bind(local).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(source) if addr.port() == 0 => last = Some(source),
            Err(source) => return Err(Error::BindTcp { addr, source }),
        }
    }
    Err(Error::BindTcp {
        addr,
        source: last.unwrap_or_else(|| std::io::Error::other("no common free port")),
    })
}

/// Starts the cluster DNS: binds the listeners, starts the watches, returns at once (see
/// [`DnsServer::wait_synced`]).
pub async fn serve(client: kube::Client, config: DnsConfig) -> Result<DnsServer> {
    serve_with(Informers::new(client), config).await
}

/// [`serve`] over the process's shared informers (Services and EndpointSlices; the pods are
/// watched here, reduced to what DNS keeps of them).
pub async fn serve_with(informers: Arc<Informers>, config: DnsConfig) -> Result<DnsServer> {
    let mut apex = Name::from_ascii(config.cluster_domain.trim_end_matches('.'))
        .map_err(|source| Error::Domain { domain: config.cluster_domain.clone(), source })?
        .to_lowercase();
    apex.set_fqdn(true);
    if config.listen.is_empty() {
        return Err(Error::NoListenAddress);
    }
    let mut sockets = Vec::new();
    for addr in &config.listen {
        sockets.push(bind(*addr).await?);
    }
    let mut local = Vec::new();
    for (udp, _) in &sockets {
        local.push(
            udp.local_addr().map_err(|source| Error::BindUdp { addr: config.listen[0], source })?,
        );
    }
    // Forwarding to ourselves would loop.
    let upstreams: Vec<SocketAddr> = config
        .upstreams
        .iter()
        .copied()
        .filter(|u| !local.contains(u) && !config.listen.contains(u))
        .collect();
    let ttl = u32::try_from(config.ttl.as_secs()).unwrap_or(u32::MAX);
    let zone = Arc::new(RwLock::new(zone::Zone::new(apex.clone())));
    let (synced_tx, synced) = watch::channel(false);
    let handler = Arc::new(server::Handler {
        apex: apex.clone(),
        zone: zone.clone(),
        synced: synced.clone(),
        forwarder: forward::Forwarder::new(
            upstreams.clone(),
            config.upstream_timeout,
            config.forward_cache_entries,
            config.forward_cache_max_ttl,
        ),
        ttl,
        soa: server::soa_record(&apex, ttl),
        counters: Default::default(),
    });
    let mut tasks = vec![tokio::spawn(cache::run(informers, zone, apex.clone(), synced_tx))];
    let inflight = Arc::new(Semaphore::new(config.max_inflight));
    let connections = Arc::new(Semaphore::new(config.max_tcp_connections));
    for (udp, tcp) in sockets {
        let udp = Arc::new(udp);
        for _ in 0..config.udp_workers.max(1) {
            tasks.push(tokio::spawn(server::udp_loop(
                udp.clone(),
                handler.clone(),
                inflight.clone(),
            )));
        }
        tasks.push(tokio::spawn(server::tcp_loop(
            tcp,
            handler.clone(),
            connections.clone(),
            config.tcp_idle_timeout,
        )));
    }
    info!(listen = ?local, domain = %apex, upstreams = ?upstreams, "cluster DNS serving");
    Ok(DnsServer { local, tasks, synced, handler })
}
