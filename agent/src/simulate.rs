//! `skiff-lab simulate --nodes N`: N nodes in one process with the real agent code over the in-memory runtime.
//!
//! Every simulated node is a full agent ([`crate::agent::start`]): Node registration, Lease
//! heartbeat, status reports, the pod watch, per-pod workers, admission, probes, graceful
//! deletion; only the runtime is [`MemoryRuntime`] (every image pullable) and the host is
//! synthetic (fixed capacity, no pressure). For scale tests of the control plane (kubemark's
//! hollow nodes) and of the agent's own API traffic.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use kube::Client;

use crate::agent::{self, AgentHandle};
use crate::config::AgentConfig;
use crate::runtime::memory::MemoryRuntime;

/// The label every simulated node carries (tests and benchmarks select them by it).
pub const SIMULATED_LABEL: &str = "node.skiff.dev/simulated";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("starting simulated node {node}")]
    StartNode {
        node: String,
        #[source]
        source: Box<agent::Error>,
    },
    #[error("no simulated node {0}")]
    UnknownNode(String),
    #[error("creating the state directory {path}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the simulated nodes look like.
#[derive(Debug, Clone)]
pub struct SimulateConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Node names are `{prefix}-{index}`.
    pub prefix: String,
    /// CPU (millicores) and memory (bytes) of each node.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// Lease renewal period (kubelet: 10 s).
    pub heartbeat: Duration,
    /// Pod worker relist period (kubelet PLEG: 1 s).
    pub relist: Duration,
    /// State directory (volumes, logs) of all nodes; a per-process temp dir when `None`.
    pub state_dir: Option<PathBuf>,
    /// Zones (`topology.kubernetes.io/zone`) given round-robin to the nodes; none when empty.
    pub zones: Vec<String>,
}

impl Default for SimulateConfig {
    fn default() -> Self {
        SimulateConfig {
            nodes: 3,
            prefix: "sim-node".into(),
            cpu_millis: 4000,
            memory_bytes: 16 << 30,
            heartbeat: Duration::from_secs(10),
            relist: Duration::from_secs(1),
            state_dir: None,
            zones: Vec::new(),
        }
    }
}

impl SimulateConfig {
    pub fn with_nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    pub fn with_relist(mut self, every: Duration) -> Self {
        self.relist = every;
        self
    }
    pub fn with_heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }
    pub fn with_zones(mut self, zones: &[&str]) -> Self {
        self.zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }
}

/// The fake InternalIP of node `index` (in 172.30.0.0/15, never routed).
pub fn node_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 30, 0, 1)) + index as u32))
}

/// The first pod address of node `index`: each node hands out its own /24 of 10.128.0.0/9.
pub fn pod_network(index: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + ((index as u32) << 8))
}

/// A simulated node: its runtime (containers outlive the agent, as on a real node) and its
/// agent while it runs.
pub struct SimulatedNode {
    pub name: String,
    pub runtime: MemoryRuntime,
    pub agent: Option<AgentHandle>,
    client: Client,
    config: AgentConfig,
}

/// Running simulated nodes; dropping stops them (Node objects stay, as with a dead kubelet)
/// and removes a temporary state directory.
pub struct Simulation {
    pub nodes: Vec<SimulatedNode>,
    temp_dir: Option<PathBuf>,
}

impl Drop for Simulation {
    fn drop(&mut self) {
        self.nodes.clear();
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Simulation {
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    fn node(&mut self, name: &str) -> Result<&mut SimulatedNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| Error::UnknownNode(name.into()))
    }

    /// Stops a node's agent as a crash would (no more heartbeats or status); its containers
    /// keep running in the runtime.
    pub fn stop_node(&mut self, name: &str) -> Result<()> {
        self.node(name)?.agent = None;
        Ok(())
    }

    /// Starts a stopped node's agent again over the same runtime (it adopts what runs).
    pub async fn resume_node(&mut self, name: &str) -> Result<()> {
        let node = self.node(name)?;
        if node.agent.is_none() {
            let agent =
                agent::start(node.client.clone(), node.config.clone(), node.runtime.clone())
                    .await
                    .map_err(|e| Error::StartNode { node: name.into(), source: Box::new(e) })?;
            node.agent = Some(agent);
        }
        Ok(())
    }
}

/// Starts `config.nodes` agents over in-memory runtimes.
pub async fn start(client: Client, config: SimulateConfig) -> Result<Simulation> {
    let (state_dir, temp_dir) = match &config.state_dir {
        Some(d) => (d.clone(), None),
        None => {
            let d = std::env::temp_dir().join(format!("skiff-simulate-{}", std::process::id()));
            (d.clone(), Some(d))
        }
    };
    std::fs::create_dir_all(&state_dir)
        .map_err(|source| Error::StateDir { path: state_dir.display().to_string(), source })?;
    let mut sim = Simulation { nodes: Vec::with_capacity(config.nodes), temp_dir };
    for i in 0..config.nodes {
        let name = format!("{}-{i}", config.prefix);
        let runtime = MemoryRuntime::new().with_pod_network(pod_network(i));
        runtime.set_pull_any(true);
        let mut c = AgentConfig::new(name.clone())
            .with_node_ip(node_ip(i))
            .with_root_dir(state_dir.join(&name))
            .with_resources(config.cpu_millis, config.memory_bytes)
            .with_heartbeat(config.heartbeat)
            .with_relist(config.relist);
        c.host_conditions = false;
        c.node_labels.insert(SIMULATED_LABEL.into(), "true".into());
        if !config.zones.is_empty() {
            let zone = config.zones[i % config.zones.len()].clone();
            c.node_labels.insert("topology.kubernetes.io/zone".into(), zone);
        }
        let agent = agent::start(client.clone(), c.clone(), runtime.clone())
            .await
            .map_err(|e| Error::StartNode { node: name.clone(), source: Box::new(e) })?;
        sim.nodes.push(SimulatedNode {
            name,
            runtime,
            agent: Some(agent),
            client: client.clone(),
            config: c,
        });
    }
    Ok(sim)
}
