//! A whole skiff cluster on one machine (`skiff-lab up|down|status`): the rig behind
//! `cargo xtask up` and the end-to-end tests.
//!
//! Layout, the same for one node or many:
//! - a lab segment: bridge `br0` in the namespace `<name>-lab`, connected to nothing but the
//!   nodes and one veth to the host (`<name>-h`, holding the lab's first address). The host
//!   reaches the nodes (NodePorts, the agents' logs/exec endpoint) and the nodes reach the
//!   server through it; only the lab subnet is routed there, nothing is bridged to the
//!   host's uplink;
//! - skiff-server on the host, listening on the host's lab address (so its admin kubeconfig
//!   works from the host and from the nodes), data dir `server_data_dir`;
//! - node `i` (`node-i`): namespace `<name>-node-i` with `lab0` on the segment, its own
//!   containerd (per-instance root/state/socket/runc root under `<dir>/node-i/containerd`,
//!   started with nsenter, the test images imported) and a `skiff-agent` in the same
//!   namespace (root dir `<dir>/node-i/agent`, pods under the cgroup parent
//!   `/skiff-<name>-node-i`, the proxy's pins under `/sys/fs/bpf/skiff-<name>-node-i`).
//!
//! Every process runs in the background with its log under `<dir>`; `<dir>/lab.json`
//! records what was made (written after each step), so [`down`] removes exactly that, also
//! after a failed or interrupted [`up`]: processes (checked by command line before they are
//! signalled), pods and shims, mounts, cgroups, bpffs pins, namespaces, links, directories.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnetwork::Ipv4Network;
use serde::{Deserialize, Serialize};

use crate::containerd::{self, Containerd, ContainerdConfig};
use crate::images;
use crate::network;

pub mod proxy;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("running `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the lab state {path}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the lab state {path}: {message}")]
    StateFormat { path: PathBuf, message: String },
    #[error("{binary} not found beside {beside}; build it (cargo build --bins)")]
    BinaryMissing { binary: String, beside: PathBuf },
    #[error("the lab subnet {0} is too small for the host and {1} nodes")]
    SubnetTooSmall(Ipv4Network, usize),
    #[error(
        "the lab subnet {subnet} is already on link {link} (a lab left behind? `ip link del {link}`)"
    )]
    SubnetInUse { subnet: Ipv4Network, link: String },
    #[error("DNS upstream {0} is outside the lab subnet {1}: lab traffic stays on the machine")]
    UpstreamOutsideLab(Ipv4Addr, Ipv4Network),
    #[error("skiff-server did not write {path} within {timeout:?}; its log:\n{log}")]
    ServerNotReady { path: PathBuf, timeout: Duration, log: String },
    #[error("the nodes were not Ready within {timeout:?}: {detail}")]
    NodesNotReady { timeout: Duration, detail: String },
    #[error("CNI plugins")]
    Network(#[from] network::Error),
    #[error("containerd of {node}")]
    Containerd {
        node: String,
        #[source]
        source: containerd::Error,
    },
    #[error("test images")]
    Images(#[from] images::Error),
    #[error("bpffs on the host (what systemd mounts on a real node)")]
    Bpffs(#[from] skiff_proxy::loader::Error),
    #[error("the proxy DaemonSet was not rolled out within {timeout:?}: {detail}")]
    ProxyNotReady { timeout: Duration, detail: String },
}

/// Where the lab's data plane runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyMode {
    /// Inside each agent (the default).
    #[default]
    InProcess,
    /// The `deploy/proxy` DaemonSet, applied with kubectl once the nodes are Ready.
    Daemonset,
}

/// What [`up`] builds. See the module docs for the layout.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Short name: prefixes namespaces, links, cgroups and pins (keep it <= 8 characters).
    pub name: String,
    /// Number of nodes.
    pub nodes: usize,
    /// State directory (node dirs, logs, lab.json).
    pub dir: PathBuf,
    /// skiff-server's data dir (its admin.kubeconfig is written there).
    pub server_data_dir: PathBuf,
    /// The lab segment: the host takes the first address, node `i` the `10 + i`-th.
    pub subnet: Ipv4Network,
    /// Pod network of the cluster (the server's node IPAM cuts /24s out of it).
    pub cluster_cidr: Ipv4Network,
    /// Service network.
    pub service_cidr: Ipv4Network,
    /// Directory of skiff-server, skiff-agent and skiff-cni (default: the running
    /// executable's directory).
    pub bin_dir: Option<PathBuf>,
    /// How long to wait for the nodes to be Ready.
    pub ready_timeout: Duration,
    /// `RUST_LOG` of the server and agents.
    pub log_filter: String,
    /// Upstream resolvers of the nodes' cluster DNS (the `nameserver` lines of the resolv.conf
    /// the agents read). Empty by default: names outside the cluster are REFUSED, nothing
    /// leaves the machine. Tests point it at a resolver they run on the lab segment.
    pub dns_upstreams: Vec<Ipv4Addr>,
    /// skiff-server's `--metric-resolution` (`None`: its default, 15 s).
    pub metric_resolution: Option<Duration>,
    /// More arguments for skiff-server (`skiff-bench lab-load` turns the audit log on).
    pub server_args: Vec<String>,
    /// Where the data plane runs.
    pub proxy: ProxyMode,
    /// The project's `deploy/` (default: beside the agent crate's sources).
    pub deploy_dir: Option<PathBuf>,
    /// How the agents get their identity: `false` (the default), the server's admin
    /// kubeconfig; `true`, as on real machines: each joins with its own bootstrap token
    /// (`--server https://<lab address>:6443 --token T`) and holds a node certificate.
    pub join: bool,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            name: "skiff".into(),
            nodes: 1,
            dir: "/var/lib/skiff/lab".into(),
            server_data_dir: "/var/lib/skiff/server".into(),
            subnet: Ipv4Network::new(Ipv4Addr::new(10, 250, 0, 0), 24)
                .unwrap_or_else(|_| unreachable!("a /24 is a valid prefix")),
            cluster_cidr: Ipv4Network::new(Ipv4Addr::new(10, 244, 0, 0), 16)
                .unwrap_or_else(|_| unreachable!("a /16 is a valid prefix")),
            service_cidr: Ipv4Network::new(Ipv4Addr::new(10, 96, 0, 0), 12)
                .unwrap_or_else(|_| unreachable!("a /12 is a valid prefix")),
            bin_dir: None,
            ready_timeout: Duration::from_secs(120),
            log_filter: "info".into(),
            dns_upstreams: Vec::new(),
            metric_resolution: None,
            server_args: Vec::new(),
            proxy: ProxyMode::InProcess,
            deploy_dir: None,
            join: false,
        }
    }
}

/// A background process of the lab.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proc {
    pub pid: u32,
    /// A string its command line contains (checked before it is signalled: pids recycle).
    pub marker: String,
    pub log: PathBuf,
}

/// One node of the lab.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    pub containerd_dir: PathBuf,
    pub cgroup_parent: String,
    pub pin_dir: PathBuf,
    pub containerd: Option<Proc>,
    pub agent: Option<Proc>,
    /// The node's join token ([`LabConfig::join`]): the agent joins with it once and keeps
    /// the node kubeconfig it got under its root dir.
    #[serde(default)]
    pub token: Option<String>,
}

/// What a lab is made of (`<dir>/lab.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub dir: PathBuf,
    pub lab_netns: String,
    pub subnet: Ipv4Network,
    pub host_link: Option<String>,
    pub host_ip: Ipv4Addr,
    /// A client namespace on the segment ("outside" the nodes: NodePorts from elsewhere),
    /// address the subnet's 250th.
    pub outside_netns: Option<String>,
    pub outside_ip: Ipv4Addr,
    pub server_data_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: Option<Proc>,
    pub nodes: Vec<NodeState>,
    pub bin_dir: PathBuf,
    pub log_filter: String,
    /// skiff-server's `--metric-resolution` in milliseconds (`None`: its default).
    #[serde(default)]
    pub metric_resolution_ms: Option<u64>,
    /// [`LabConfig::server_args`].
    #[serde(default)]
    pub server_args: Vec<String>,
    /// [`LabConfig::proxy`]: with `Daemonset`, the agents run with `--no-proxy`.
    #[serde(default)]
    pub proxy: ProxyMode,
    /// Whether `up` mounted the host's bpffs at [`BPFFS`] (the proxy pods need the host's:
    /// one of their own would go with them); `down` unmounts it when nothing is left in it.
    #[serde(default)]
    pub mounted_bpffs: bool,
    /// [`LabConfig::join`].
    #[serde(default)]
    pub join: bool,
}

/// Where a node has its bpffs (systemd mounts it there at boot).
pub const BPFFS: &str = "/sys/fs/bpf";

/// The name of a node's CNI node file in its directory ([`NodeState::cni_node_config`]).
pub const CNI_NODE_FILE: &str = "cni-node.json";

impl NodeState {
    /// The node's agent log (appended to across restarts).
    pub fn agent_log(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    /// The node file skiff-cni reads the pod CIDR from (the agent writes it; the proxy
    /// DaemonSet's conflist names it). Nodes sharing the machine need one each.
    pub fn cni_node_config(&self) -> PathBuf {
        self.dir.join(CNI_NODE_FILE)
    }
}

impl LabState {
    fn path(dir: &Path) -> PathBuf {
        dir.join("lab.json")
    }

    /// skiff-server's log (appended to across restarts).
    pub fn server_log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// Reads `<dir>/lab.json`; `None` when there is no lab there.
    pub fn load(dir: &Path) -> Result<Option<LabState>> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::StateFormat { path, message: e.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::State { path, source }),
        }
    }

    fn save(&self) -> Result<()> {
        let path = Self::path(&self.dir);
        let tmp = self.dir.join(".lab.json.tmp");
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, body).map_err(|source| Error::Write { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &path).map_err(|source| Error::Write { path, source })
    }

    /// Whether every process of the lab is alive.
    pub fn running(&self) -> bool {
        let procs = self
            .nodes
            .iter()
            .flat_map(|n| [&n.containerd, &n.agent])
            .chain([&self.server])
            .collect::<Vec<_>>();
        procs.iter().all(|p| p.as_ref().is_some_and(alive))
    }

    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// A command run in the outside client's namespace.
    pub fn outside_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.outside_netns.as_deref().unwrap_or("")))
            .args(args);
        c
    }

    /// A command run as a process of the node itself: in its network namespace and in its
    /// `host` cgroup, beside the pods' under the node's cgroup. On a real node every process
    /// is under the cgroup v2 root, where the proxy attaches its socket-LB hooks, so node
    /// processes reach ClusterIPs as with kube-proxy; in the lab the node's cgroup plays the
    /// root, and this puts node processes under it.
    pub fn node_command(&self, node: &str, args: &[&str]) -> Option<Command> {
        let n = self.node(node)?;
        let cg = cgroup2_dir(&n.cgroup_parent).join("host");
        if let Err(e) = std::fs::create_dir_all(&cg) {
            tracing::warn!(cgroup = %cg.display(), error = %e, "the node's host cgroup");
        }
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"cg=$1; ns=$2; shift 2; echo $$ > "$cg/cgroup.procs" && exec nsenter --net="$ns" "$@""#)
            .arg("sh")
            .arg(&cg)
            .arg(format!("/run/netns/{}", n.netns))
            .args(args);
        Some(c)
    }

    /// The apiserver's URL on the lab segment.
    pub fn server_url(&self) -> String {
        format!("https://{}:6443", self.host_ip)
    }

    /// The agent command line of a node (also used to restart an agent).
    pub fn agent_command(&self, node: &NodeState) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", node.netns)).arg(self.bin_dir.join("skiff-agent"));
        match &node.token {
            // As on a real machine: the server only by its lab address, TLS verified with
            // the CA that cluster-info's signature vouches for.
            Some(token) => c.args(["--server", &self.server_url(), "--token", token]),
            None => c.arg("--kubeconfig").arg(&self.kubeconfig),
        };
        c.args(["--node-name", &node.name, "--node-ip", &node.ip.to_string()])
            .arg("--containerd-socket")
            .arg(ContainerdConfig::under(&node.containerd_dir).socket)
            .arg("--root-dir")
            .arg(node.dir.join("agent"))
            .arg("--cni-conf-dir")
            .arg(ContainerdConfig::under(&node.containerd_dir).cni_conf_dir)
            .arg("--cni-bin-dir")
            .arg(ContainerdConfig::under(&node.containerd_dir).cni_bin_dir)
            .arg("--cni-data-dir")
            .arg(node.dir.join("ipam"))
            .arg("--cni-node-config")
            .arg(node.cni_node_config())
            .args(["--cgroup-parent", &node.cgroup_parent]);
        match self.proxy {
            ProxyMode::InProcess => {
                c.arg("--proxy-pin-dir")
                    .arg(&node.pin_dir)
                    .arg("--proxy-cgroup")
                    .arg(cgroup2_dir(&node.cgroup_parent))
                    .args(["--proxy-xdp-interface", "lab0", "--proxy-tc-interface", "lab0"]);
            }
            // The data plane, skiff-cni and its conflist come from the DaemonSet.
            ProxyMode::Daemonset => {
                c.args(["--no-proxy", "--no-install-cni"]);
            }
        }
        // The nodes share the host's disk, which the build under test fills: a share of
        // it (the kubelet's nodefs.available<10%) would taint every node with
        // disk-pressure on a busy build machine. An amount says what a lab needs.
        c.args([
            "--eviction-hard",
            "memory.available<100Mi,nodefs.available<1Gi,pid.available<10%",
        ])
        // The lab's own resolv.conf: no upstream resolvers unless the lab was given some
        // on its segment (names outside the cluster are REFUSED, nothing leaves the machine).
        .arg("--resolv-conf")
        .arg(self.dir.join("resolv.conf"))
        .env("RUST_LOG", &self.log_filter);
        c
    }

    /// Starts a node's agent in the background (logs appended to `<node dir>/agent.log`).
    pub fn start_agent(&mut self, node: &str) -> Result<()> {
        let Some(i) = self.nodes.iter().position(|n| n.name == node) else { return Ok(()) };
        let n = self.nodes[i].clone();
        // The pods' cgroup v2 directory must exist for the proxy's socket-LB hooks (the
        // first pod would make it); it goes with the node's cgroups in [`down`].
        let cg = cgroup2_dir(&n.cgroup_parent);
        std::fs::create_dir_all(&cg).map_err(|source| Error::Write { path: cg, source })?;
        let log = n.agent_log();
        let marker = n.dir.join("agent").to_string_lossy().into_owned();
        let proc = spawn_background(self.agent_command(&n), &log, &marker)?;
        self.nodes[i].agent = Some(proc);
        self.save()
    }

    /// Stops a node's agent (SIGKILL when `kill`, else SIGTERM); pods keep running.
    pub fn stop_agent(&mut self, node: &str, kill: bool) -> Result<()> {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node)
            && let Some(p) = n.agent.take()
        {
            stop(&p, if kill { Duration::ZERO } else { Duration::from_secs(10) });
        }
        self.save()
    }

    /// Kills a node's containerd (SIGKILL; its pods' processes stay until [`down`]).
    pub fn kill_containerd(&mut self, node: &str) -> Result<()> {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node)
            && let Some(p) = n.containerd.take()
        {
            stop(&p, Duration::ZERO);
        }
        self.save()
    }

    /// Starts a node's containerd again (after [`LabState::kill_containerd`]): it recovers
    /// its running pods' shims.
    pub async fn start_containerd(&mut self, node: &str) -> Result<()> {
        let Some(i) = self.nodes.iter().position(|n| n.name == node) else { return Ok(()) };
        let n = self.nodes[i].clone();
        let mut cc = ContainerdConfig::under(&n.containerd_dir);
        cc.log_file = n.dir.join("containerd.log");
        cc.cgroup_parent = n.cgroup_parent.clone();
        let c = Containerd::start(&cc, Some(&n.netns))
            .await
            .map_err(|source| Error::Containerd { node: n.name.clone(), source })?;
        self.nodes[i].containerd = c.pid().map(|pid| Proc {
            pid,
            marker: cc.config_file.to_string_lossy().into_owned(),
            log: cc.log_file.clone(),
        });
        std::mem::forget(c);
        self.save()
    }

    /// Kills skiff-server with SIGKILL.
    pub fn kill_server(&mut self) -> Result<()> {
        if let Some(p) = self.server.take() {
            stop(&p, Duration::ZERO);
        }
        self.save()
    }

    /// Starts skiff-server again (same data dir, same address).
    pub fn start_server(&mut self) -> Result<()> {
        let log = self.server_log();
        let mut cmd = Command::new(self.bin_dir.join("skiff-server"));
        cmd.arg("--data-dir")
            .arg(&self.server_data_dir)
            .args(["--listen", &format!("{}:6443", self.host_ip)])
            // The nodes share this machine: their local-path volumes go with the lab.
            .arg("--local-path-root")
            .arg(self.dir.join("storage"))
            // Imported on every node, with the `rm` the teardown helper runs.
            .args(["--local-path-helper-image", images::TOOLS_IMAGE])
            .env("RUST_LOG", &self.log_filter);
        if let Some(ms) = self.metric_resolution_ms {
            cmd.arg(format!("--metric-resolution={ms}ms"));
        }
        cmd.args(&self.server_args);
        let marker = self.server_data_dir.to_string_lossy().into_owned();
        self.server = Some(spawn_background(cmd, &log, &marker)?);
        self.save()
    }
}

/// Brings a lab up (see the module docs) and waits until its nodes are Ready. A lab
/// already running in `config.dir` is kept as it is; a broken one is taken down first.
/// On failure everything made so far is removed.
pub async fn up(config: &LabConfig) -> Result<LabState> {
    if let Some(state) = LabState::load(&config.dir)? {
        if state.running() && state.nodes.len() == config.nodes && state.proxy == config.proxy {
            tracing::info!(dir = %config.dir.display(), "lab already running");
            return Ok(state);
        }
        down(&config.dir).await?;
    }
    let bin_dir = match &config.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default(),
    };
    for b in ["skiff-server", "skiff-agent", "skiff-cni"] {
        if !bin_dir.join(b).is_file() {
            return Err(Error::BinaryMissing { binary: b.into(), beside: bin_dir });
        }
    }
    if config.subnet.size() < 16 + config.nodes as u32 {
        return Err(Error::SubnetTooSmall(config.subnet, config.nodes));
    }
    if let Some(ns) = config.dns_upstreams.iter().find(|ns| !config.subnet.contains(**ns)) {
        return Err(Error::UpstreamOutsideLab(*ns, config.subnet));
    }
    if let Some(link) = link_in(config.subnet)? {
        return Err(Error::SubnetInUse { subnet: config.subnet, link });
    }
    std::fs::create_dir_all(&config.dir)
        .map_err(|source| Error::Write { path: config.dir.clone(), source })?;
    let host_ip = config.subnet.nth(1).unwrap_or(config.subnet.ip());
    let nodes = (1..=config.nodes)
        .map(|i| {
            let name = format!("node-{i}");
            let dir = config.dir.join(&name);
            NodeState {
                netns: format!("{}-{name}", config.name),
                ip: config.subnet.nth(10 + i as u32).unwrap_or(host_ip),
                containerd_dir: dir.join("containerd"),
                cgroup_parent: format!("/skiff-{}-{name}", config.name),
                pin_dir: PathBuf::from(format!("/sys/fs/bpf/skiff-{}-{name}", config.name)),
                dir,
                name,
                containerd: None,
                agent: None,
                token: None,
            }
        })
        .collect();
    let mut state = LabState {
        name: config.name.clone(),
        dir: config.dir.clone(),
        lab_netns: format!("{}-lab", config.name),
        subnet: config.subnet,
        host_link: None,
        host_ip,
        outside_netns: None,
        outside_ip: config.subnet.nth(250).unwrap_or(host_ip),
        server_data_dir: config.server_data_dir.clone(),
        kubeconfig: config.server_data_dir.join("admin.kubeconfig"),
        server: None,
        nodes,
        bin_dir,
        log_filter: config.log_filter.clone(),
        metric_resolution_ms: config.metric_resolution.map(|d| d.as_millis() as u64),
        server_args: config.server_args.clone(),
        proxy: config.proxy,
        mounted_bpffs: false,
        join: config.join,
    };
    state.save()?;
    match build(&mut state, config).await {
        Ok(()) => Ok(state),
        Err(e) => {
            tracing::error!(error = %e, "lab up failed; taking it down");
            let _ = down(&config.dir).await;
            Err(e)
        }
    }
}

async fn build(state: &mut LabState, config: &LabConfig) -> Result<()> {
    // The segment, and the host's leg on it.
    let lab_netns = state.lab_netns.clone();
    run(Command::new("ip").args(["netns", "add", &lab_netns]))?;
    add_bridge(&lab_netns)?;
    let host_link = format!("{}-h", state.name);
    let host_addr = format!("{}/{}", state.host_ip, state.subnet.prefix());
    connect_host(&lab_netns, &host_link, "h0", &host_addr, || {
        state.host_link = Some(host_link.clone());
        state.save()
    })?;

    // The outside client.
    let out = format!("{}-out", state.name);
    run(Command::new("ip").args(["netns", "add", &out]))?;
    state.outside_netns = Some(out.clone());
    state.save()?;
    let out_ns = format!("--net=/run/netns/{out}");
    add_bridge_port(&lab_netns, "o0", "eth0", &out)?;
    run(Command::new("nsenter").args([
        &out_ns,
        "ip",
        "addr",
        "add",
        &format!("{}/{}", state.outside_ip, state.subnet.prefix()),
        "dev",
        "eth0",
    ]))?;
    run(Command::new("nsenter").args([&out_ns, "ip", "link", "set", "eth0", "up"]))?;
    run(Command::new("nsenter").args([&out_ns, "ip", "link", "set", "lo", "up"]))?;

    // Native XDP on veths: frames the nodes' XDP sends back out of lab0 (NodePort to a
    // remote backend, replies, RSTs) are received by the bridge ports only with NAPI on
    // (GRO); and the links XDP rewrites packets from must carry full checksums (no
    // CHECKSUM_PARTIAL left for a later stage that an XDP frame no longer has).
    ethtool_set(Some(&out), "eth0", ETHTOOL_STXCSUM, 0)?;
    ethtool_set(None, &host_link, ETHTOOL_STXCSUM, 0)?;
    for port in ["h0", "o0"] {
        ethtool_set(Some(&state.lab_netns), port, ETHTOOL_SGRO, 1)?;
    }

    // The server, on the host's lab address.
    let _ = std::fs::remove_file(&state.kubeconfig);
    state.start_server()?;

    // Nodes: namespace, lab0, CNI plugins, containerd, images.
    let mut archives = images::build_test_images(&state.dir.join("images"))?;
    if state.proxy == ProxyMode::Daemonset {
        let bpffs = Path::new(BPFFS);
        if !skiff_proxy::loader::bpffs_mounted(bpffs)? {
            skiff_proxy::loader::ensure_bpffs(bpffs)?;
            state.mounted_bpffs = true;
            state.save()?;
        }
        // The image users install, from the binaries under test.
        archives.extend(images::build_component_images(
            &state.bin_dir,
            &state.dir.join("images"),
            env!("CARGO_PKG_VERSION"),
            &["proxy".to_string()],
        )?);
    }
    let skiff_cni = state.bin_dir.join("skiff-cni");
    for i in 0..state.nodes.len() {
        let n = state.nodes[i].clone();
        std::fs::create_dir_all(&n.dir)
            .map_err(|source| Error::Write { path: n.dir.clone(), source })?;
        run(Command::new("ip").args(["netns", "add", &n.netns]))?;
        let ns = format!("--net=/run/netns/{}", n.netns);
        let (port, peer) = (format!("p{}", i + 1), format!("q{}", i + 1));
        add_bridge_port(&lab_netns, &port, &peer, &n.netns)?;
        run(Command::new("nsenter").args([&ns, "ip", "link", "set", &peer, "name", "lab0"]))?;
        run(Command::new("nsenter").args([
            &ns,
            "ip",
            "addr",
            "add",
            &format!("{}/{}", n.ip, state.subnet.prefix()),
            "dev",
            "lab0",
        ]))?;
        run(Command::new("nsenter").args([&ns, "ip", "link", "set", "lab0", "up"]))?;
        run(Command::new("nsenter").args([&ns, "ip", "link", "set", "lo", "up"]))?;
        ethtool_set(Some(&n.netns), "lab0", ETHTOOL_STXCSUM, 0)?;
        ethtool_set(Some(&state.lab_netns), &port, ETHTOOL_SGRO, 1)?;

        let mut cc = ContainerdConfig::under(&n.containerd_dir);
        cc.log_file = n.dir.join("containerd.log");
        cc.cgroup_parent = n.cgroup_parent.clone();
        match state.proxy {
            ProxyMode::InProcess => network::install_cni_from(&cc.cni_bin_dir, &skiff_cni)?,
            // skiff-cni comes from the proxy DaemonSet's init container.
            ProxyMode::Daemonset => network::install_loopback(&cc.cni_bin_dir)?,
        }
        std::fs::create_dir_all(&cc.cni_conf_dir)
            .map_err(|source| Error::Write { path: cc.cni_conf_dir.clone(), source })?;
        let c = Containerd::start(&cc, Some(&n.netns))
            .await
            .map_err(|source| Error::Containerd { node: n.name.clone(), source })?;
        state.nodes[i].containerd = c.pid().map(|pid| Proc {
            pid,
            marker: cc.config_file.to_string_lossy().into_owned(),
            log: cc.log_file.clone(),
        });
        // containerd runs on after this process (`Containerd` would stop it on drop): the
        // record in lab.json owns it now.
        std::mem::forget(c);
        state.save()?;
        for a in &archives {
            images::import(&cc.socket, a).await?;
        }
    }

    // Server up (kubeconfig written), then the agents.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !state.kubeconfig.exists() {
        if Instant::now() > deadline || !state.server.as_ref().is_some_and(alive) {
            let log = state
                .server
                .as_ref()
                .and_then(|p| std::fs::read_to_string(&p.log).ok())
                .unwrap_or_default();
            return Err(Error::ServerNotReady {
                path: state.kubeconfig.clone(),
                timeout: Duration::from_secs(30),
                log,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resolv = state.dir.join("resolv.conf");
    let mut text = String::from(
        "# skiff lab: upstreams on the lab segment only (nothing leaves the machine)\n",
    );
    for ns in &config.dns_upstreams {
        text.push_str(&format!("nameserver {ns}\n"));
    }
    std::fs::write(&resolv, text).map_err(|source| Error::Write { path: resolv, source })?;
    if state.join {
        for i in 0..state.nodes.len() {
            // The admin kubeconfig is written as the server starts serving: a few tries.
            let mut tries = 0;
            let token = loop {
                match skiff_core::join::create_token(&state.kubeconfig, Duration::from_secs(3600))
                    .await
                {
                    Ok(t) => break t,
                    Err(e) if tries >= 20 => {
                        return Err(Error::Command {
                            command: "creating a join token".into(),
                            stderr: format!("{:#}", anyhow::Error::from(e)),
                        });
                    }
                    Err(_) => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            };
            state.nodes[i].token = Some(token);
            state.save()?;
        }
    }
    let names: Vec<String> = state.nodes.iter().map(|n| n.name.clone()).collect();
    for name in &names {
        state.start_agent(name)?;
    }
    wait_ready(state, config.ready_timeout).await?;
    if state.proxy == ProxyMode::Daemonset {
        let deploy = config.deploy_dir.clone().unwrap_or_else(proxy::default_deploy_dir);
        proxy::install(state, &deploy, config.ready_timeout.max(Duration::from_secs(120))).await?;
    }
    Ok(())
}

/// Waits until every node of the lab is Ready (through kubectl-free API calls).
pub async fn wait_ready(state: &LabState, timeout: Duration) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let deadline = Instant::now() + timeout;
    let mut detail = String::from("no answer from the apiserver");
    loop {
        if let Ok(client) = client(&state.kubeconfig).await {
            let api: kube::Api<Node> = kube::Api::all(client);
            match api.list(&Default::default()).await {
                Ok(list) => {
                    let ready: Vec<String> = list
                        .items
                        .iter()
                        .filter(|n| {
                            n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(
                                |cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
                            )
                        })
                        .filter_map(|n| n.metadata.name.clone())
                        .collect();
                    if state.nodes.iter().all(|n| ready.contains(&n.name)) {
                        return Ok(());
                    }
                    detail = format!("ready: {ready:?}");
                }
                Err(e) => detail = e.to_string(),
            }
        }
        for n in &state.nodes {
            if let Some(a) = &n.agent
                && !alive(a)
            {
                let tail = log_tail(&a.log, 20);
                return Err(Error::NodesNotReady {
                    timeout,
                    detail: format!("the agent of {} exited; its log ends:\n{tail}", n.name),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NodesNotReady { timeout, detail });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The host link that already has an address in `subnet`, if one does: a second lab on
/// the same subnet would route the host's half of both to one of them.
fn link_in(subnet: Ipv4Network) -> Result<Option<String>> {
    let out = run(Command::new("ip").args(["-o", "-4", "addr", "show"]))?;
    Ok(links_in(&out, subnet))
}

/// Parses `ip -o -4 addr show` ("47: name    inet 10.0.0.1/24 brd ... scope global name").
fn links_in(ip_output: &str, subnet: Ipv4Network) -> Option<String> {
    ip_output.lines().find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let link = fields.next()?.split('@').next()?;
        let addr: Ipv4Network = fields.nth(1)?.parse().ok()?;
        subnet.overlaps(addr).then(|| link.to_string())
    })
}

/// Takes down each lab among `dirs` whose processes are not all alive: what a killed run
/// (a test runner stopped half-way) left behind. Returns the directories it cleaned.
pub async fn down_stale(dirs: impl IntoIterator<Item = PathBuf>) -> Result<Vec<PathBuf>> {
    let mut cleaned = Vec::new();
    for dir in dirs {
        if LabState::load(&dir)?.is_some_and(|s| !s.running()) {
            tracing::warn!(dir = %dir.display(), "taking down a lab left behind");
            down(&dir).await?;
            cleaned.push(dir);
        }
    }
    Ok(cleaned)
}

/// An API client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, kube::Error> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| kube::Error::Service(e.to_string().into()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| kube::Error::Service(e.to_string().into()))?;
    kube::Client::try_from(cfg)
}

/// Takes down the lab recorded in `dir` and removes every trace of it (processes, pods and
/// shims, mounts, cgroups, bpffs pins, namespaces, links, the server's data dir and `dir`).
/// Nothing there: nothing to do.
pub async fn down(dir: &Path) -> Result<()> {
    let Some(mut state) = LabState::load(dir)? else {
        return Ok(());
    };
    for n in &mut state.nodes {
        if let Some(p) = n.agent.take() {
            stop(&p, Duration::from_secs(5));
        }
    }
    if let Some(p) = state.server.take() {
        stop(&p, Duration::from_secs(5));
    }
    for n in &mut state.nodes {
        // Pods through CRI first: their network goes through CNI DEL, and containerd knows
        // them wherever their cgroups are.
        if n.containerd.as_ref().is_some_and(alive) {
            let socket = ContainerdConfig::under(&n.containerd_dir).socket;
            let removed = tokio::time::timeout(Duration::from_secs(60), remove_pods(&socket)).await;
            if !matches!(removed, Ok(Ok(()))) {
                tracing::warn!(node = %n.name, "removing the pods through CRI failed");
            }
        }
        if let Some(p) = n.containerd.take() {
            stop(&p, Duration::from_secs(5));
        }
        let mut cc = ContainerdConfig::under(&n.containerd_dir);
        cc.cgroup_parent = n.cgroup_parent.clone();
        if let Err(e) = containerd::cleanup(&cc) {
            tracing::warn!(node = %n.name, error = %e, "containerd cleanup");
        }
        unmount_under(&n.dir);
        // Pods' network namespaces containerd made (its state dir is gone by now) and the
        // socket-LB cgroup of the node (cgroup v2).
        let _ = std::fs::remove_dir_all(&n.pin_dir);
        let _ = Command::new("ip").args(["netns", "del", &n.netns]).stderr(Stdio::null()).status();
    }
    if let Some(link) = &state.host_link {
        let _ = Command::new("ip").args(["link", "del", link]).stderr(Stdio::null()).status();
    }
    if let Some(out) = &state.outside_netns {
        let _ = Command::new("ip").args(["netns", "del", out]).stderr(Stdio::null()).status();
    }
    let _ =
        Command::new("ip").args(["netns", "del", &state.lab_netns]).stderr(Stdio::null()).status();
    let _ = std::fs::remove_dir_all(&state.server_data_dir);
    // Empty but for what the kernel's bpf_preload puts in every bpffs.
    let empty = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries
                .flatten()
                .all(|e| matches!(e.file_name().to_str(), Some("maps.debug" | "progs.debug")))
        })
    };
    if state.mounted_bpffs && empty(Path::new(BPFFS)) {
        let _ = Command::new("umount").arg(BPFFS).stderr(Stdio::null()).status();
    }
    std::fs::remove_dir_all(dir).map_err(|source| Error::Write { path: dir.to_path_buf(), source })
}

async fn remove_pods(socket: &Path) -> Result<(), crate::runtime::Error> {
    use crate::runtime::Runtime;
    let cri = crate::runtime::cri::CriRuntime::connect(socket)
        .await?
        .with_request_timeout(Duration::from_secs(20));
    for sb in cri.list_pod_sandboxes(&Default::default()).await? {
        let _ = cri.stop_pod_sandbox(&sb.id).await;
        let _ = cri.remove_pod_sandbox(&sb.id).await;
    }
    Ok(())
}

const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_SGRO: u32 = 0x2c;

/// An ethtool "set value" command (`ETHTOOL_STXCSUM`, `ETHTOOL_SGRO`) on `iface` in the
/// namespace `/run/netns/<netns>` (the caller's when `None`); ethtool(8) is not needed.
fn ethtool_set(netns: Option<&str>, iface: &str, cmd: u32, data: u32) -> Result<()> {
    use nix::libc;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let call = || -> std::io::Result<()> {
        let mut val = EthtoolValue { cmd, data };
        // SAFETY: a zeroed ifreq is valid; the name is copied within its bounds (15 bytes
        // and the zero); ifru_data points at `val`, which outlives the ioctl; the socket is
        // closed right after.
        unsafe {
            let mut ifr: libc::ifreq = std::mem::zeroed();
            for (d, s) in ifr.ifr_name.iter_mut().zip(iface.bytes().take(15)) {
                *d = s as libc::c_char;
            }
            ifr.ifr_ifru.ifru_data = (&mut val as *mut EthtoolValue).cast();
            let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let rc = libc::ioctl(fd, 0x8946 /* SIOCETHTOOL */, &mut ifr);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if rc != 0 {
                return Err(err);
            }
        }
        Ok(())
    };
    let command = format!("ethtool cmd {cmd:#x}={data} on {iface} in {netns:?}");
    let result = match netns {
        None => call(),
        Some(ns) => {
            let ns = skiff_cni::netns::NetNs::open(format!("/run/netns/{ns}"))
                .map_err(|e| Error::Command { command: command.clone(), stderr: e.to_string() })?;
            skiff_cni::netns::run_in(&ns, call)
                .map_err(|e| Error::Command { command: command.clone(), stderr: e.to_string() })?
        }
    };
    result.map_err(|e| Error::Command { command, stderr: e.to_string() })
}

/// The cgroup v2 directory of a cgroup parent (the unified hierarchy's mount point from
/// mountinfo: `/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on a hybrid one).
pub fn cgroup2_dir(parent: &str) -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root = info
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ").then(|| pre.split(' ').nth(4).map(PathBuf::from))?
        })
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
    root.join(parent.trim_start_matches('/'))
}

/// Unmounts whatever is mounted below `dir` (deepest first; pod volumes of the agent).
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", &p]).stderr(Stdio::null()).status();
    }
}

/// The last `lines` lines of a process's log, in order and without the ANSI colour
/// sequences (`ESC [ ... m`) its logger writes; the read error in their place if unreadable.
/// How many lines of a panic's message [`log_tail`] keeps when the tail starts after it.
const PANIC_MESSAGE_LINES: usize = 4;

/// The last `lines` lines of `log`, colours stripped; a panic's message is kept too.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("({}: {e})", log.display()));
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    // A panic's message (or an error's, `Error: ...` then `Caused by:`) comes before its
    // backtrace, which alone can fill the tail.
    let panic =
        all[..start].iter().rposition(|l| l.contains("panicked at") || l.starts_with("Error: "));
    let tail = match panic {
        Some(at) => {
            let message = &all[at..(at + PANIC_MESSAGE_LINES).min(start)];
            format!("{}\n...\n{}", message.join("\n"), all[start..].join("\n"))
        }
        None => all[start..].join("\n"),
    };
    let mut out = String::with_capacity(tail.len());
    let mut chars = tail.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

fn alive(p: &Proc) -> bool {
    std::fs::read(format!("/proc/{}/cmdline", p.pid))
        .map(|c| {
            let cmdline = String::from_utf8_lossy(&c).replace('\0', " ");
            cmdline.contains(&p.marker)
        })
        .unwrap_or(false)
}

/// SIGTERM, SIGKILL after `grace` (at once for a zero grace); only if it is still ours.
fn stop(p: &Proc, grace: Duration) {
    if !alive(p) {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(p.pid as i32);
    let sig = if grace.is_zero() {
        nix::sys::signal::Signal::SIGKILL
    } else {
        nix::sys::signal::Signal::SIGTERM
    };
    let _ = nix::sys::signal::kill(pid, sig);
    let deadline = Instant::now() + grace.max(Duration::from_secs(2));
    while alive(p) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(p) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(p) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Spawns `cmd` in its own process group with stdout/stderr appended to `log`.
fn spawn_background(mut cmd: Command, log: &Path, marker: &str) -> Result<Proc> {
    use std::os::unix::process::CommandExt;
    let command = format!("{cmd:?}");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| Error::Write { path: log.to_path_buf(), source })?;
    let file2 =
        file.try_clone().map_err(|source| Error::Write { path: log.to_path_buf(), source })?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(file2))
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn { command, source })?;
    let pid = child.id();
    // Reaped by init once this process exits; the lab record owns it.
    std::mem::forget(child);
    Ok(Proc { pid, marker: marker.to_string(), log: log.to_path_buf() })
}

/// Creates the segment's bridge `br0`, up, in the namespace `netns`.
pub(crate) fn add_bridge(netns: &str) -> Result<()> {
    let ns = format!("--net=/run/netns/{netns}");
    run(Command::new("nsenter").args([&ns, "ip", "link", "add", "br0", "type", "bridge"]))?;
    run(Command::new("nsenter").args([&ns, "ip", "link", "set", "br0", "up"]))?;
    Ok(())
}

/// Gives the host's own namespace a leg on the segment in `lab_netns`: the veth `host_end`
/// (host) — `lab_end` (a port of `br0`), `host_addr` (address/prefix) on the host end, up.
/// `created` runs as soon as the host end exists, to record it for cleanup.
pub(crate) fn connect_host(
    lab_netns: &str,
    host_end: &str,
    lab_end: &str,
    host_addr: &str,
    created: impl FnOnce() -> Result<()>,
) -> Result<()> {
    run(
        Command::new("ip").args(["link", "add", host_end, "type", "veth", "peer", "name", lab_end])
    )?;
    created()?;
    run(Command::new("ip").args(["link", "set", lab_end, "netns", lab_netns]))?;
    let ns = format!("--net=/run/netns/{lab_netns}");
    run(Command::new("nsenter").args([&ns, "ip", "link", "set", lab_end, "master", "br0", "up"]))?;
    run(Command::new("ip").args(["addr", "add", host_addr, "dev", host_end]))?;
    run(Command::new("ip").args(["link", "set", host_end, "up"]))?;
    Ok(())
}

/// Connects the namespace `netns` to the segment in `lab_netns`: the veth `port` (a port of
/// `br0`, up) — `peer` (moved into `netns`, left down).
pub(crate) fn add_bridge_port(lab_netns: &str, port: &str, peer: &str, netns: &str) -> Result<()> {
    let lab_ns = format!("--net=/run/netns/{lab_netns}");
    run(Command::new("nsenter")
        .args([&lab_ns, "ip", "link", "add", port, "type", "veth", "peer", "name", peer]))?;
    run(Command::new("nsenter").args([
        &lab_ns,
        "ip",
        "link",
        "set",
        peer,
        "netns",
        &format!("/run/netns/{netns}"),
    ]))?;
    run(Command::new("nsenter").args([&lab_ns, "ip", "link", "set", port, "master", "br0", "up"]))?;
    Ok(())
}

/// Runs `cmd` to completion, stdin closed: its stdout, or its stderr in the error.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn { command: command.clone(), source })?;
    if !out.status.success() {
        return Err(Error::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `skiff-lab ...`.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Bring a lab up (server, N nodes with containerd and agents) and wait until Ready.
    Up {
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        #[arg(long, default_value = "skiff")]
        name: String,
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
        #[arg(long, default_value = "/var/lib/skiff/server")]
        server_data_dir: PathBuf,
        #[arg(long, default_value = "10.250.0.0/24")]
        subnet: Ipv4Network,
        /// Directory of skiff-server/skiff-agent/skiff-cni (default: this binary's).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value = "info")]
        log_filter: String,
        /// One more argument for skiff-server (repeat for more), e.g.
        /// `--server-arg=--audit-level=Metadata`.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// Where the data plane runs: in each agent, or the deploy/proxy DaemonSet.
        #[arg(long, value_enum, default_value = "in-process")]
        proxy: ProxyMode,
        /// Each agent joins with its own bootstrap token and runs as its node (a node
        /// certificate, rotated), as on real machines; default: the admin kubeconfig.
        #[arg(long)]
        join: bool,
    },
    /// Take the lab in DIR down and remove every trace of it.
    Down {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
    },
    /// Print the lab record (JSON) and whether every process runs.
    Status {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
    },
    /// Stop (or kill -9) one node's agent.
    StopAgent {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
        node: String,
        #[arg(long)]
        kill: bool,
    },
    /// Start one node's agent again.
    StartAgent {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
        node: String,
    },
    /// kill -9 a node's containerd.
    KillContainerd {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
        node: String,
    },
    /// Start a node's containerd again.
    StartContainerd {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
        node: String,
    },
    /// kill -9 skiff-server.
    KillServer {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
    },
    /// Start skiff-server again.
    StartServer {
        #[arg(long, default_value = "/var/lib/skiff/lab")]
        dir: PathBuf,
    },
}

fn loaded(dir: &Path) -> anyhow::Result<LabState> {
    LabState::load(dir)?.ok_or_else(|| anyhow::anyhow!("no lab in {}", dir.display()))
}

/// Runs a `lab` subcommand.
pub async fn run_command(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Up {
            nodes,
            name,
            dir,
            server_data_dir,
            subnet,
            bin_dir,
            log_filter,
            server_args,
            proxy,
            join,
        } => {
            let config = LabConfig {
                name,
                nodes,
                dir,
                server_data_dir,
                subnet,
                bin_dir,
                log_filter,
                server_args,
                proxy,
                join,
                ..Default::default()
            };
            let state = up(&config).await?;
            println!("{}", state.kubeconfig.display());
        }
        LabCommand::Down { dir } => down(&dir).await?,
        LabCommand::Status { dir } => {
            let state = loaded(&dir)?;
            println!("{}", serde_json::to_string_pretty(&state)?);
            println!("running: {}", state.running());
        }
        LabCommand::StopAgent { dir, node, kill } => loaded(&dir)?.stop_agent(&node, kill)?,
        LabCommand::StartAgent { dir, node } => loaded(&dir)?.start_agent(&node)?,
        LabCommand::KillContainerd { dir, node } => loaded(&dir)?.kill_containerd(&node)?,
        LabCommand::StartContainerd { dir, node } => loaded(&dir)?.start_containerd(&node).await?,
        LabCommand::KillServer { dir } => loaded(&dir)?.kill_server()?,
        LabCommand::StartServer { dir } => loaded(&dir)?.start_server()?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines_in_order_without_colours() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("agent.log");
        std::fs::write(&log, "one\n\u{1b}[2mtwo\u{1b}[0m x\n\u{1b}[32m INFO\u{1b}[0m three\n")
            .expect("write log");
        assert_eq!(log_tail(&log, 2), "two x\n INFO three");
        assert_eq!(log_tail(&log, 10), "one\ntwo x\n INFO three");
        assert!(log_tail(&dir.path().join("missing.log"), 5).contains("missing.log"));

        let backtrace: String = (0..30).map(|i| format!("  {i}: frame\n")).collect();
        std::fs::write(
            &log,
            format!("start\nthread 'main' panicked at a.rs:1:1:\nboom\n{backtrace}"),
        )
        .expect("write log");
        let tail = log_tail(&log, 3);
        assert!(tail.starts_with("thread 'main' panicked at a.rs:1:1:\nboom\n"), "{tail}");
        assert!(tail.ends_with("  27: frame\n  28: frame\n  29: frame"), "{tail}");
        assert!(!tail.contains("start"), "{tail}");
    }

    #[test]
    fn links_in_finds_the_link_holding_an_address_of_the_subnet() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   2: eth0    inet 192.168.5.2/24 brd 192.168.5.255 scope global eth0\n\
                   47: e28743-h    inet 10.253.0.1/24 brd 10.253.0.255 scope global e28743-h\n";
        let subnet = |s: &str| s.parse::<Ipv4Network>().expect("subnet");
        assert_eq!(links_in(out, subnet("10.253.0.0/24")).as_deref(), Some("e28743-h"));
        assert_eq!(links_in(out, subnet("10.253.0.128/25")).as_deref(), Some("e28743-h"));
        assert_eq!(links_in(out, subnet("10.250.0.0/24")), None);
    }
}
