//! The agent's configuration (flags, defaults, derived paths).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default agent state directory (pod volumes, logs, static manifests).
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/skiff/agent";
/// Default containerd CRI socket of the skiff-managed containerd.
pub const DEFAULT_CONTAINERD_SOCKET: &str = "/run/skiff/containerd/containerd.sock";
/// The node-local cluster DNS address (NodeLocal DNSCache style; see AGENT.md).
pub const DEFAULT_CLUSTER_DNS: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(169, 254, 20, 10));
/// The sandbox ("pause") image built by `cargo xtask images`.
pub const DEFAULT_SANDBOX_IMAGE: &str = "skiff.test/pause:1";

/// Node resources when not read from the host (simulated nodes, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeResources {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

/// The node's network glue (see [`crate::network`]): skiff-cni's conflist once the node has
/// a podCIDR, the plugin binaries, cross-node routes.
#[derive(Debug, Clone)]
pub struct NetworkGlue {
    /// containerd's CNI conf dir (the conflist goes here).
    pub cni_conf_dir: PathBuf,
    /// containerd's CNI bin dir.
    pub cni_bin_dir: PathBuf,
    /// Install skiff-cni and loopback into `cni_bin_dir` at start, and write the conflist
    /// once the node has a podCIDR. Without: both come from elsewhere (the proxy
    /// DaemonSet's init container, whose conflist reads the pod CIDR from `cni_node_config`).
    pub install_plugins: bool,
    /// The node file skiff-cni reads the pod CIDR and MTU from when its conflist names it
    /// (always written once the node has a podCIDR).
    pub cni_node_config: PathBuf,
    /// Keep routes to other nodes' pod CIDRs (netlink, in the agent's network namespace).
    pub routes: Option<skiff_cni::routes::RouteConfig>,
    /// skiff-cni's IPAM store directory (conflist `dataDir`); `None`: skiff-cni's default.
    /// Nodes sharing a machine (the lab) need one each.
    pub cni_data_dir: Option<PathBuf>,
}

impl NetworkGlue {
    /// The paths containerd's config uses by default (`containerd::ContainerdConfig`),
    /// plugins installed, host-gw routes with the kubeadm defaults.
    pub fn new(node_name: &str) -> Self {
        NetworkGlue {
            cni_conf_dir: "/etc/skiff/cni/net.d".into(),
            cni_bin_dir: "/var/lib/skiff/cni/bin".into(),
            install_plugins: true,
            cni_node_config: skiff_cni::config::DEFAULT_NODE_CONFIG.into(),
            routes: Some(skiff_cni::routes::RouteConfig::new(node_name)),
            cni_data_dir: None,
        }
    }
}

/// Crash-loop and image-pull back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// First delay (kubelet: 10 s).
    pub initial: Duration,
    /// Cap (kubelet: 5 min, `MaxContainerBackOff`).
    pub max: Duration,
    /// A container that ran at least this long resets its back-off (kubelet: 10 min,
    /// twice the cap).
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

/// Everything the agent needs to run one node.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The Node's name (default: the host name).
    pub node_name: String,
    /// The node's InternalIP (pods' hostIP); `None`: the first non-loopback address, else
    /// 127.0.0.1.
    pub node_ip: Option<IpAddr>,
    /// State directory: `pods/<uid>/volumes/...`, `pods/<ns>_<name>_<uid>/` logs.
    pub root_dir: PathBuf,
    /// containerd's CRI socket.
    pub containerd_socket: PathBuf,
    /// Cluster domain of pod DNS search paths (kubelet `--cluster-domain`, `cluster.local`).
    pub cluster_domain: String,
    /// Nameservers of ClusterFirst pods (kubelet `--cluster-dns`).
    pub cluster_dns: Vec<IpAddr>,
    /// The sandbox image (containerd's `sandbox_image`).
    pub sandbox_image: String,
    /// Directory of static pod manifests (kubelet `staticPodPath`); `None`: none.
    pub static_pod_dir: Option<PathBuf>,
    /// Lease renewal period (kubelet: 10 s, a quarter of the 40 s lease duration).
    pub heartbeat: Duration,
    /// Node status is reported on every change and at least this often (kubelet
    /// `nodeStatusReportFrequency`: 5 min).
    pub status_report: Duration,
    /// How often a pod worker re-reads the runtime when nothing else wakes it (the
    /// kubelet's PLEG relist period: 1 s).
    pub pod_relist: Duration,
    /// Workers read the runtime through the node-wide relist cache (`pods::relist`); off:
    /// each worker asks the runtime about its own pod on every pass (3 + N calls; kept to
    /// compare in `cargo xtask bench agent`).
    pub pod_cache: bool,
    /// Pods capacity (kubelet `maxPods`: 110).
    pub max_pods: u32,
    /// CPU and memory capacity; `None`: read from the host.
    pub resources: Option<NodeResources>,
    /// Whether pressure conditions are read from the host (false for simulated nodes).
    pub host_conditions: bool,
    /// Extra labels of the Node.
    pub node_labels: BTreeMap<String, String>,
    /// Port of the streaming (logs/exec) endpoint, published as the kubelet endpoint.
    pub streaming_port: u16,
    /// Crash-loop / image pull back-off.
    pub backoff: BackoffConfig,
    /// CNI config, plugins and routes; `None`: left to someone else (tests, simulation).
    pub network: Option<NetworkGlue>,
    /// The node-local cluster DNS ([`crate::dns`]); `None`: not served by this agent.
    pub dns: Option<crate::dns::DnsConfig>,
    /// Put the DNS listen addresses on the `skiff-dns` link first (a real node).
    pub dns_link: bool,
    /// The logs/exec endpoint ([`crate::streaming`]); `None`: not served. Its bound port is
    /// published as the Node's kubelet endpoint.
    pub streaming: Option<crate::streaming::StreamingConfig>,
    /// cgroup parent of the pods (`LinuxPodSandboxConfig.cgroup_parent`); empty: the
    /// runtime's default. Nodes sharing a machine (the lab) need one each.
    pub cgroup_parent: String,
    /// Hard eviction thresholds: below them the node reports memory, disk or PID pressure
    /// (and is tainted by the node lifecycle controller).
    pub eviction_hard: Thresholds,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            node_name: String::new(),
            node_ip: None,
            root_dir: PathBuf::from(DEFAULT_ROOT_DIR),
            containerd_socket: PathBuf::from(DEFAULT_CONTAINERD_SOCKET),
            cluster_domain: "cluster.local".into(),
            cluster_dns: vec![DEFAULT_CLUSTER_DNS],
            sandbox_image: DEFAULT_SANDBOX_IMAGE.into(),
            static_pod_dir: None,
            heartbeat: Duration::from_secs(10),
            status_report: Duration::from_secs(300),
            pod_relist: Duration::from_secs(1),
            pod_cache: true,
            max_pods: 110,
            resources: None,
            host_conditions: true,
            node_labels: BTreeMap::new(),
            streaming_port: 10250,
            backoff: BackoffConfig::default(),
            network: None,
            cgroup_parent: String::new(),
            dns: None,
            dns_link: false,
            streaming: None,
            eviction_hard: Thresholds::default(),
        }
    }
}

impl AgentConfig {
    pub fn new(node_name: impl Into<String>) -> Self {
        AgentConfig { node_name: node_name.into(), ..Default::default() }
    }
    pub fn with_node_ip(mut self, ip: IpAddr) -> Self {
        self.node_ip = Some(ip);
        self
    }
    pub fn with_root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self
    }
    pub fn with_resources(mut self, cpu_millis: u64, memory_bytes: u64) -> Self {
        self.resources = Some(NodeResources { cpu_millis, memory_bytes });
        self
    }
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff.initial = initial;
        self.backoff.max = max;
        self
    }
    pub fn with_relist(mut self, every: Duration) -> Self {
        self.pod_relist = every;
        self
    }
    pub fn with_heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }
    pub fn with_static_pod_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.static_pod_dir = Some(dir.into());
        self
    }

    /// The node IP to publish: configured, else the first global address, else loopback.
    pub fn effective_node_ip(&self) -> IpAddr {
        self.node_ip.unwrap_or_else(detect_node_ip)
    }

    /// `<root>/pods/<uid>`: the pod's volumes live below it.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }

    /// `<root>/pods/<ns>_<name>_<uid>`: the pod's log directory (the kubelet's layout).
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(format!("{namespace}_{name}_{uid}"))
    }

    /// The directory of a container's logs, `<log dir>/<container>`.
    pub fn container_log_dir(log_dir: &Path, container: &str) -> PathBuf {
        log_dir.join(container)
    }
}

/// The host name (`/proc/sys/kernel/hostname`), lower-cased as node names must be.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
}

/// The source address of the default route, found without sending anything (a UDP
/// socket's `connect` only picks a route); 127.0.0.1 when the host has no route.
fn detect_node_ip() -> IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.connect("192.0.2.1:9")?;
        s.local_addr()
    });
    match probe {
        Ok(addr) if !addr.ip().is_unspecified() => addr.ip(),
        _ => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    }
}

/// One hard eviction threshold: an absolute amount (bytes, or processes for
/// `pid.available`) or a share of the total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Amount(u64),
    Percent(f64),
}

impl Threshold {
    /// Whether `available` out of `total` is below the threshold (never for an unknown total).
    pub(crate) fn crossed(&self, available: u64, total: u64) -> bool {
        total > 0
            && match *self {
                Threshold::Amount(a) => available < a,
                Threshold::Percent(p) => (available as f64) < p / 100.0 * total as f64,
            }
    }
}

/// Pressure thresholds, the kubelet's `--eviction-hard`. The default is the kubelet's:
/// `memory.available<100Mi,nodefs.available<10%,pid.available<10%` (pid.available is a
/// soft signal in the kubelet; hard here). A signal left out of an explicit
/// `--eviction-hard` has no threshold, as in the kubelet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub memory_available: Option<Threshold>,
    pub nodefs_available: Option<Threshold>,
    pub pid_available: Option<Threshold>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            memory_available: Some(Threshold::Amount(100 << 20)),
            nodefs_available: Some(Threshold::Percent(10.0)),
            pid_available: Some(Threshold::Percent(10.0)),
        }
    }
}

impl std::str::FromStr for Thresholds {
    type Err = String;

    /// Parses `signal<value,...`, a value being a quantity ("100Mi", "1Gi", "1000") or a
    /// percentage ("10%"). An empty string disables every threshold.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut t =
            Thresholds { memory_available: None, nodefs_available: None, pid_available: None };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (signal, value) = item
                .split_once('<')
                .ok_or_else(|| format!("{item:?}: want signal<value, e.g. nodefs.available<10%"))?;
            let value = value.trim();
            let threshold = match value.strip_suffix('%') {
                Some(p) => match p.parse::<f64>() {
                    Ok(p) if (0.0..=100.0).contains(&p) => Threshold::Percent(p),
                    _ => return Err(format!("{item:?}: a percentage must be within 0% and 100%")),
                },
                None => skiff_core::quantity::Quantity::parse(value)
                    .and_then(|q| u64::try_from(q.value()).ok())
                    .map(Threshold::Amount)
                    .ok_or_else(|| format!("{item:?}: {value:?} is not a quantity"))?,
            };
            let slot = match signal.trim() {
                "memory.available" => &mut t.memory_available,
                "nodefs.available" => &mut t.nodefs_available,
                "pid.available" => &mut t.pid_available,
                other => {
                    return Err(format!(
                        "unsupported eviction signal {other:?} (supported: memory.available, \
                         nodefs.available, pid.available)"
                    ));
                }
            };
            *slot = Some(threshold);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let c = AgentConfig::new("n1").with_root_dir("/r");
        assert_eq!(c.pod_dir("u1"), PathBuf::from("/r/pods/u1"));
        assert_eq!(c.pod_log_dir("default", "web", "u1"), PathBuf::from("/r/pods/default_web_u1"));
        assert_eq!(c.cluster_dns, vec![DEFAULT_CLUSTER_DNS]);
        assert_eq!(c.backoff.initial, Duration::from_secs(10));
        assert_eq!(c.backoff.max, Duration::from_secs(300));
    }
}
