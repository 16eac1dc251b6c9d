//! The proxy daemon: load and attach the data plane (maps and links pinned, so a restart
//! interrupts nothing), resume from the pinned maps, then keep them in sync with Services and
//! EndpointSlices watched through kube-rs (skiff-server or any Kubernetes apiserver).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use tokio::sync::Notify;
use tracing::{info, info_span, warn};

use skiff_core::informers::Informers;
use skiff_core::supervisor::AbortOnDrop;

use crate::desired::{NodeContext, compute};
use crate::loader::{self, Dataplane};
use crate::maps::{self, ServiceMaps};
use crate::status::ProxyStatus;
use crate::sync::{self, ServiceMapSync};

/// The annotation the EndpointSlice controller stamps with the time of the change that
/// last touched a slice (kube-proxy's network programming latency starts there).
const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The trigger times already measured, per slice, so each change is observed once.
#[derive(Default)]
struct ProgrammingLatency {
    seen: std::collections::HashMap<String, String>,
}

impl ProgrammingLatency {
    /// After a sync: each slice whose trigger time is new (and after this process started)
    /// is now programmed; observe how long that took.
    fn observe<'a>(
        &mut self,
        slices: impl Iterator<Item = &'a EndpointSlice>,
        status: &ProxyStatus,
    ) {
        let now = std::time::SystemTime::now();
        let mut live = std::collections::HashSet::new();
        for slice in slices {
            let Some(uid) = slice.metadata.uid.clone() else { continue };
            live.insert(uid.clone());
            let Some(trigger) =
                slice.metadata.annotations.as_ref().and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
            else {
                continue;
            };
            if self.seen.get(&uid) == Some(trigger) {
                continue;
            }
            if let Some(t) = skiff_core::time::parse_rfc3339(trigger)
                && t >= status.started
                && let Ok(took) = now.duration_since(t)
            {
                status.metrics.programming.observe(took.as_secs_f64());
            }
            self.seen.insert(uid, trigger.clone());
        }
        self.seen.retain(|uid, _| live.contains(uid));
    }
}

/// Configuration of the proxy. See `Default` for the defaults and why.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// This node's name (endpoint locality, traffic policies).
    pub node_name: String,
    /// This node's address: NodePort frontends and the SNAT source.
    pub node_ip: Ipv4Addr,
    /// bpffs directory holding maps (and `links/`); default `/sys/fs/bpf/skiff`, where
    /// bpftool and `skiff-proxy maps` find them.
    pub pin_dir: PathBuf,
    /// Attach the socket-LB hooks (default true: like Cilium's kube-proxy replacement, it
    /// removes per-packet NAT for in-cluster traffic).
    pub socket_lb: bool,
    /// cgroup v2 directory for the socket-LB hooks; default: the cgroup v2 root from
    /// mountinfo, so every process on the node is covered.
    pub cgroup: Option<PathBuf>,
    /// Interfaces that get the tc program on ingress and egress (per-packet path).
    pub tc_interfaces: Vec<String>,
    /// Node-facing interfaces that get the XDP program (NodePort/ExternalIP/LB); where XDP
    /// cannot attach, the tc programs (ingress and egress) serve them instead.
    pub xdp_interfaces: Vec<String>,
    /// How remote NodePort/ExternalIP/LB backends are reached: SNAT (default, kube-proxy's
    /// behaviour) or DSR (client address kept, replies straight from the backend's node).
    pub nodeport_mode: loader::NodePortMode,
    /// Where `/metrics` is served; default 127.0.0.1:10249, kube-proxy's metrics address.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where kube-proxy's `/healthz` and `/livez` (and `/readyz`) are served; default
    /// 0.0.0.0:10256, kube-proxy's `--healthz-bind-address` (load balancers probe it).
    pub healthz_addr: Option<std::net::SocketAddr>,
    /// How long a change may wait for its sync before `/healthz` answers 503 (default 60 s,
    /// kube-proxy's twice its 30 s sync period).
    pub health_timeout: Duration,
    /// Mount a bpffs at the pin dir's parent when none is there (default true, for a proxy
    /// in the host's mount namespace); false in a pod, where such a mount would be the
    /// pod's own and vanish with it: a missing bpffs is then an error saying so.
    pub mount_bpffs: bool,
    /// `--nodeport-addresses`: the node's addresses in these CIDRs serve NodePorts too
    /// (default none: the node address alone, kube-proxy's `primary`). Followed as the
    /// node's addresses change.
    pub nodeport_addresses: Vec<skiff_core::cidr::Cidr>,
    /// `--cluster-cidr`: the pod ranges. A new flow to a Service address arriving through
    /// the tc path from outside them is SNATed to the node for a remote backend, so the
    /// replies come back this way (kube-proxy's masquerade of off-cluster traffic). Empty
    /// (the default): sources are left alone.
    pub cluster_cidrs: Vec<skiff_core::cidr::Cidr>,
    /// Coalesce watch events for this long before a sync (default 10 ms: a burst of
    /// EndpointSlice updates becomes one sync, well below the 10 ms programming target).
    pub debounce: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            node_ip: Ipv4Addr::UNSPECIFIED,
            pin_dir: PathBuf::from("/sys/fs/bpf/skiff"),
            socket_lb: true,
            cgroup: None,
            tc_interfaces: Vec::new(),
            xdp_interfaces: Vec::new(),
            nodeport_mode: loader::NodePortMode::Snat,
            metrics_addr: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 10249))),
            healthz_addr: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 10256))),
            health_timeout: Duration::from_secs(60),
            debounce: Duration::from_millis(10),
            mount_bpffs: true,
            nodeport_addresses: Vec::new(),
            cluster_cidrs: Vec::new(),
        }
    }
}

/// Errors of the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading or attaching the data plane")]
    Dataplane(#[from] loader::Error),
    #[error("opening the pinned maps")]
    Maps(#[from] maps::Error),
    #[error("syncing the maps")]
    Sync(#[from] sync::Error),
    #[error("watch stream of {kind} ended")]
    WatchEnded { kind: &'static str },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The running data plane: programs loaded, links pinned under `pin_dir/links` (they stay
/// attached across restarts; `skiff-proxy unpin` detaches them).
pub struct RunningDataplane {
    pub dataplane: Dataplane,
    pub maps: ServiceMaps,
}

/// Loads the object, pins maps, attaches the programs the config asks for.
pub fn start_dataplane(config: &ProxyConfig) -> Result<RunningDataplane> {
    if let Some(parent) = config.pin_dir.parent() {
        if config.mount_bpffs {
            loader::ensure_bpffs(parent)?;
        } else if !loader::on_bpffs(parent) {
            return Err(loader::Error::NoBpffs(parent.to_path_buf()).into());
        }
    }
    let options = loader::LoadOptions::default().nodeport_mode(config.nodeport_mode);
    let mut dataplane = Dataplane::load_with(&config.pin_dir, config.node_ip, &options)?;
    if config.socket_lb {
        let cgroup = match &config.cgroup {
            Some(c) => c.clone(),
            None => loader::cgroup2_root()?,
        };
        let n = dataplane.attach_sock_lb_pinned(&cgroup, &config.pin_dir.join("links"))?;
        info!(cgroup = %cgroup.display(), newly_attached = n, "socket LB attached");
    }
    let links = config.pin_dir.join("links");
    std::fs::create_dir_all(&links)
        .map_err(|source| loader::Error::PinDir { path: links.clone(), source })?;
    for iface in &config.tc_interfaces {
        for (dir, tag) in [
            (aya::programs::TcAttachType::Ingress, "ingress"),
            (aya::programs::TcAttachType::Egress, "egress"),
        ] {
            let pin = links.join(format!("tc-{iface}-{tag}"));
            if !loader::link_pinned(&pin) {
                dataplane.attach_tc(iface, dir)?.pin(&pin)?;
            }
        }
    }
    for iface in &config.xdp_interfaces {
        let pin = links.join(format!("xdp-{iface}"));
        let tc_pins =
            [links.join(format!("tc-{iface}-ingress")), links.join(format!("tc-{iface}-egress"))];
        let tc_there = tc_pins.iter().all(|p| loader::link_pinned(p));
        // Pinned by a previous run: XDP, or the tc fallback (kept as it is, so a restart
        // changes nothing on the wire).
        if loader::link_pinned(&pin) || (tc_there && !config.tc_interfaces.contains(iface)) {
            continue;
        }
        match dataplane.attach_xdp(iface) {
            Ok(x) => x.pin(&pin)?,
            Err(e) if tc_there => {
                warn!(iface, error = %error_chain(&e), "XDP could not attach; the tc programs already there serve NodePort");
            }
            Err(e) => {
                warn!(iface, error = %error_chain(&e), "XDP could not attach; NodePort served by the tc fallback");
                let (ingress, egress) = dataplane.attach_tc_nodeport(iface)?;
                ingress.pin(&tc_pins[0])?;
                egress.pin(&tc_pins[1])?;
            }
        }
    }
    let mut maps = ServiceMaps::open_pinned(&config.pin_dir)?;
    set_nodeport_addresses(&mut maps, config)?;
    let cidrs: Vec<(Ipv4Addr, u8)> =
        config.cluster_cidrs.iter().map(|c| (c.base(), c.prefix())).collect();
    maps.set_cluster_cidrs(&cidrs)?;
    Ok(RunningDataplane { dataplane, maps })
}

/// The node's addresses in `--nodeport-addresses` (but the node address, which always
/// serves NodePorts) into the data plane.
fn set_nodeport_addresses(maps: &mut ServiceMaps, config: &ProxyConfig) -> Result<Vec<Ipv4Addr>> {
    let mut addrs = Vec::new();
    if !config.nodeport_addresses.is_empty() {
        let local = crate::netaddrs::local_ipv4().unwrap_or_else(|e| {
            warn!(error = %e, "listing the node's addresses");
            Vec::new()
        });
        addrs = local
            .into_iter()
            .filter(|a| {
                *a != config.node_ip && config.nodeport_addresses.iter().any(|c| c.contains(*a))
            })
            .take(skiff_ebpf_common::MAX_NODE_ADDRS as usize)
            .collect();
    }
    maps.set_node_addresses(&addrs)?;
    Ok(addrs)
}

/// Follows the node's addresses for `--nodeport-addresses` (kube-proxy re-reads them on
/// every sync): every 5 s, logging a change.
async fn follow_nodeport_addresses(config: ProxyConfig) {
    let mut last = None;
    loop {
        let set = ServiceMaps::open_pinned(&config.pin_dir)
            .map_err(Error::from)
            .and_then(|mut maps| set_nodeport_addresses(&mut maps, &config));
        match set {
            Ok(addrs) if last.as_ref() != Some(&addrs) => {
                info!(addresses = ?addrs, "NodePorts also served on");
                last = Some(addrs);
            }
            Ok(_) => {}
            Err(e) => warn!(error = %error_chain(&e), "updating the NodePort addresses"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// An error with its causes, for one log line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}

/// The node's IPv4 InternalIP from its Node object, as kube-proxy finds its node address
/// when none is given; waits (with a log line every attempt) until the Node exists and has
/// one.
pub async fn node_internal_ip(client: &Client, node: &str) -> Result<Ipv4Addr> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    loop {
        let why = match nodes.get_opt(node).await {
            Ok(Some(n)) => {
                let ip = n
                    .status
                    .and_then(|s| s.addresses)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|a| a.type_ == "InternalIP")
                    .find_map(|a| a.address.parse::<Ipv4Addr>().ok());
                match ip {
                    Some(ip) => return Ok(ip),
                    None => "it has no IPv4 InternalIP yet".to_string(),
                }
            }
            Ok(None) => "it does not exist yet".to_string(),
            Err(e) => format!("reading it failed: {e}"),
        };
        warn!(node, "waiting for the Node's InternalIP (no --node-ip given): {why}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs the proxy until the watch streams end: the agent's and `skiff-proxy run`'s entry.
pub async fn run(client: Client, config: ProxyConfig) -> Result<()> {
    run_with(&Informers::new(client), config).await
}

/// [`run`] over the process's shared informers (the agent's: its DNS reads the same
/// Services and EndpointSlices).
pub async fn run_with(informers: &Informers, config: ProxyConfig) -> Result<()> {
    let mut running = start_dataplane(&config)?;
    let status = Arc::new(ProxyStatus::new(config.health_timeout));
    let metrics = config.metrics_addr.map(|addr| {
        let (pin_dir, status) = (config.pin_dir.clone(), status.clone());
        AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = crate::http::serve_metrics(addr, pin_dir, status).await {
                warn!(error = %error_chain(&e), "/metrics not served");
            }
        }))
    });
    let health = config.healthz_addr.map(|addr| {
        let status = status.clone();
        AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = crate::http::serve_health(addr, status).await {
                warn!(error = %error_chain(&e), "/healthz not served");
            }
        }))
    });
    let eligibility = (!config.node_name.is_empty()).then(|| {
        let node = informers.selected::<Node>(&format!("metadata.name={}", config.node_name));
        AbortOnDrop(tokio::spawn(watch_node_eligibility(node, status.clone())))
    });
    let addresses = (!config.nodeport_addresses.is_empty())
        .then(|| AbortOnDrop(tokio::spawn(follow_nodeport_addresses(config.clone()))));
    let r = sync_observed(informers, &config, &mut running.maps, &status).await;
    drop((metrics, health, eligibility, addresses));
    r
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Whether a node may still receive traffic from outside, as kube-proxy's `/healthz` judges.
pub fn node_eligible(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

/// Follows this node's Node object (one object, by field selector) into `/healthz`.
async fn watch_node_eligibility(
    informer: Arc<skiff_core::informers::Informer<Node>>,
    status: Arc<ProxyStatus>,
) {
    let mut events = informer.subscribe();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(
                kube::runtime::watcher::Event::Apply(n)
                | kube::runtime::watcher::Event::InitApply(n),
            ) => status.health.set_node_eligible(node_eligible(&n)),
            Ok(kube::runtime::watcher::Event::Delete(_)) => status.health.set_node_eligible(false),
            _ => {}
        }
    }
}

/// Watches Services and EndpointSlices and keeps `maps` in sync (level-triggered: every
/// sync recomputes the whole desired state from the reflector stores and applies the diff).
pub async fn sync_forever(
    client: Client,
    config: &ProxyConfig,
    maps: &mut ServiceMaps,
) -> Result<()> {
    sync_forever_with(&Informers::new(client), config, maps).await
}

/// [`sync_forever`] over shared informers.
pub async fn sync_forever_with(
    informers: &Informers,
    config: &ProxyConfig,
    maps: &mut ServiceMaps,
) -> Result<()> {
    sync_observed(informers, config, maps, &Arc::new(ProxyStatus::new(config.health_timeout))).await
}

/// [`sync_forever_with`], reporting each change and sync to `status` (health and metrics).
pub async fn sync_observed(
    informers: &Informers,
    config: &ProxyConfig,
    maps: &mut ServiceMaps,
    status: &Arc<ProxyStatus>,
) -> Result<()> {
    let mut state = ServiceMapSync::resume(maps)?;
    let mut programmed = ProgrammingLatency::default();
    let mut health = crate::http::HealthCheckServers::default();
    let node = NodeContext { node_name: config.node_name.clone() };
    let (services, slices) = (informers.all::<Service>(), informers.all::<EndpointSlice>());
    let (svc_store, eps_store) = (services.ready_store().await, slices.ready_store().await);
    let changed = Arc::new(Notify::new());
    let svc_stream = services.subscribe();
    let eps_stream = slices.subscribe();
    let drive = |kind: &'static str, stream: futures::stream::BoxStream<'static, bool>| {
        let (changed, status) = (changed.clone(), status.clone());
        tokio::spawn(async move {
            let mut stream = stream;
            while let Some(ok) = stream.next().await {
                if ok {
                    status.changed(kind);
                    changed.notify_one();
                }
            }
            warn!(kind, "watch stream ended");
            changed.notify_one();
        })
    };
    let svc_task = drive(
        "Service",
        svc_stream
            .map(|e| e.map_err(|err| warn!(error = %err, "Service watch error")).is_ok())
            .boxed(),
    );
    let eps_task = drive(
        "EndpointSlice",
        eps_stream
            .map(|e| e.map_err(|err| warn!(error = %err, "EndpointSlice watch error")).is_ok())
            .boxed(),
    );
    // Never sync from a half-listed cache: that would delete live entries after a restart.
    let _ = svc_store.wait_until_ready().await;
    let _ = eps_store.wait_until_ready().await;
    loop {
        if svc_task.is_finished() {
            return Err(Error::WatchEnded { kind: "Service" });
        }
        if eps_task.is_finished() {
            return Err(Error::WatchEnded { kind: "EndpointSlice" });
        }
        let span = info_span!("map_sync");
        let _g = span.enter();
        let t = Instant::now();
        let services = svc_store.state();
        let slices = eps_store.state();
        let desired =
            compute(services.iter().map(|s| s.as_ref()), slices.iter().map(|s| s.as_ref()), &node);
        let ops = match state.sync(maps, &desired) {
            Ok(ops) => ops,
            Err(e) => {
                status.metrics.failures.inc();
                return Err(e.into());
            }
        };
        status.synced(t.elapsed());
        programmed.observe(slices.iter().map(|s| s.as_ref()), status);
        health.reconcile(&desired.health_checks).await;
        if ops > 0 {
            info!(
                ops,
                frontends = state.frontend_count(),
                elapsed_us = t.elapsed().as_micros() as u64,
                "maps synced"
            );
        }
        drop(_g);
        changed.notified().await;
        tokio::time::sleep(config.debounce).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a pod (mount_bpffs false) a missing bpffs is an error that says what to do, not
    /// a private mount whose pins would vanish with the pod.
    #[test]
    fn a_proxy_that_may_not_mount_refuses_a_missing_bpffs() {
        let dir = tempfile::tempdir().unwrap();
        let config = ProxyConfig {
            pin_dir: dir.path().join("skiff"),
            mount_bpffs: false,
            ..ProxyConfig::default()
        };
        let err = start_dataplane(&config).err().expect("no bpffs there");
        let text = err.to_string();
        let chain = std::error::Error::source(&err).map(|e| e.to_string()).unwrap_or_default();
        assert!(format!("{text}: {chain}").contains("no bpffs mounted at"), "{text}: {chain}");
        assert!(!loader::on_bpffs(dir.path()), "nothing was mounted");
    }
}
