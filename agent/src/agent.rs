//! The agent process: wires node registration, pod sync, streaming, DNS and network glue.
//!
//! [`start`] registers the Node and starts the heartbeat and the pod sync over the given
//! runtime, and the network glue when configured (CNI plugins and conflist once the node has
//! a podCIDR, cross-node routes); [`run`] does the same and runs until the pod sync fails.
//! When configured, it also serves the logs/exec endpoint (its port published on the Node)
//! and the node-local cluster DNS. The in-process eBPF proxy is composed by the binary.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use skiff_core::informers::{Informer, Informers};
use tokio::task::JoinHandle;

use crate::config::{AgentConfig, NetworkGlue};
use crate::node::NodeAgent;
use crate::pods::{PodContext, PodSync};
use crate::runtime::Runtime;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the agent needs a node name")]
    NoNodeName,
    #[error("asking the runtime for its version")]
    RuntimeVersion(#[source] crate::runtime::Error),
    #[error("registering the node")]
    Node(#[source] crate::node::Error),
    #[error("pod sync")]
    Pods(#[source] crate::pods::Error),
    #[error("an agent task panicked or was cancelled")]
    Task(#[source] tokio::task::JoinError),
    #[error("putting the DNS address on its link")]
    DnsLink(#[source] crate::dns::link::Error),
    #[error("starting the cluster DNS")]
    Dns(#[source] crate::dns::Error),
    #[error("starting the streaming endpoint")]
    Streaming(#[source] crate::streaming::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A running agent; dropping it stops the agent's tasks (pods keep running in the runtime).
pub struct AgentHandle {
    node_name: String,
    heartbeat: JoinHandle<()>,
    pods: JoinHandle<crate::pods::Result<()>>,
    static_pods: Option<JoinHandle<()>>,
    network: Option<JoinHandle<()>>,
    dns: Option<crate::dns::DnsServer>,
    streaming: Option<crate::streaming::StreamingServer>,
}

impl AgentHandle {
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The cluster DNS, when this agent serves it.
    pub fn dns(&self) -> Option<&crate::dns::DnsServer> {
        self.dns.as_ref()
    }

    /// The address of the logs/exec endpoint, when this agent serves it.
    pub fn streaming_addr(&self) -> Option<std::net::SocketAddr> {
        self.streaming.as_ref().map(|s| s.addr())
    }

    /// Waits until the pod sync ends (it only ends on an error).
    pub async fn wait(mut self) -> Result<()> {
        match (&mut self.pods).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Pods(e)),
            Err(e) => Err(Error::Task(e)),
        }
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.pods.abort();
        for t in [&self.static_pods, &self.network].into_iter().flatten() {
            t.abort();
        }
    }
}

/// Registers the node and starts heartbeating and syncing its pods over `runtime`.
pub async fn start<R: Runtime + Clone>(
    client: Client,
    config: AgentConfig,
    runtime: R,
) -> Result<AgentHandle> {
    start_with(Informers::new(client), config, runtime).await
}

/// [`start`] over the process's shared informers (the binary hands the same ones to the
/// proxy): one watch of each kind for the node's DNS, routes, Node and proxy.
pub async fn start_with<R: Runtime + Clone>(
    informers: Arc<Informers>,
    config: AgentConfig,
    runtime: R,
) -> Result<AgentHandle> {
    let client = informers.client().clone();
    if config.node_name.is_empty() {
        return Err(Error::NoNodeName);
    }
    let mut config = config;
    let version = runtime.version().await.map_err(Error::RuntimeVersion)?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    // Streaming first: the Node publishes the port it is bound to.
    let streaming = match config.streaming.clone() {
        Some(s) => {
            let server =
                crate::streaming::serve(runtime.clone(), s).await.map_err(Error::Streaming)?;
            config.streaming_port = server.addr().port();
            Some(server)
        }
        // No endpoint: the Node advertises none (port 0), so nothing dials it (the
        // apiserver's resource metrics scraper skips such nodes).
        None => {
            config.streaming_port = 0;
            None
        }
    };
    let dns = match config.dns.clone() {
        Some(d) => {
            if config.dns_link {
                for addr in d.listen.iter().map(|a| a.ip()) {
                    if !addr.is_loopback() && !addr.is_unspecified() {
                        crate::dns::link::ensure_listen_address(addr)
                            .await
                            .map_err(Error::DnsLink)?;
                    }
                }
            }
            let server = crate::dns::serve_with(informers.clone(), d).await.map_err(Error::Dns)?;
            crate::metrics::set_dns_source(server.stats_reader());
            Some(server)
        }
        None => None,
    };
    let config = Arc::new(config);
    let node = NodeAgent::register(client.clone(), config.clone(), &runtime_version)
        .await
        .map_err(Error::Node)?
        .sharing(informers.clone(), routes_all_nodes(&config));
    let allocatable = node.allocatable();
    let ctx = Arc::new(PodContext {
        client: client.clone(),
        runtime,
        host_ip: config.effective_node_ip().to_string(),
        runtime_name: version.runtime_name.clone(),
        events: crate::pods::events::Events::new(client.clone(), config.node_name.clone()),
        cache: if config.pod_cache {
            crate::pods::relist::RuntimeCache::new()
        } else {
            crate::pods::relist::RuntimeCache::disabled()
        },
        config: config.clone(),
    });
    let heartbeat = tokio::spawn(node.run());
    let static_pods = config.static_pod_dir.clone().map(|dir| {
        tokio::spawn(crate::pods::static_pods::run(client.clone(), config.clone(), dir))
    });
    let network = config
        .network
        .clone()
        .map(|glue| tokio::spawn(network_glue(informers.clone(), config.node_name.clone(), glue)));
    let pods = tokio::spawn(PodSync::new(ctx, allocatable).run());
    Ok(AgentHandle {
        node_name: config.node_name.clone(),
        heartbeat,
        pods,
        static_pods,
        network,
        dns,
        streaming,
    })
}

/// Whether the process watches every Node (for the routes to other nodes' pods).
fn routes_all_nodes(config: &AgentConfig) -> bool {
    config.network.as_ref().is_some_and(|glue| glue.routes.is_some())
}

/// The node's network glue: plugins installed, the node file and conflist written once the
/// node has a podCIDR (node IPAM assigns it after registration), then the route sync.
async fn network_glue(informers: Arc<Informers>, node_name: String, glue: NetworkGlue) {
    let all_nodes = glue.routes.is_some();
    let nodes = crate::node::node_informer(&informers, &node_name, all_nodes);
    if glue.install_plugins
        && let Err(e) = crate::network::install_cni(&glue.cni_bin_dir)
    {
        tracing::error!(error = %e, "installing the CNI plugins");
    }
    let cidr = wait_for_pod_cidr(&nodes, &node_name).await;
    let settings = match &glue.cni_data_dir {
        Some(dir) => crate::network::CniSettings::new(cidr).data_dir(dir),
        None => crate::network::CniSettings::new(cidr),
    };
    // The node file first: a conflist naming it works from then on.
    match crate::network::write_node_config(&glue.cni_node_config, &settings) {
        Ok(()) => {
            tracing::info!(path = %glue.cni_node_config.display(), %cidr, "CNI node file written")
        }
        Err(e) => tracing::error!(error = %e, "writing the CNI node file"),
    }
    if glue.install_plugins {
        match crate::network::write_cni_config(&glue.cni_conf_dir, &settings) {
            Ok(path) => tracing::info!(path = %path.display(), %cidr, "CNI config written"),
            Err(e) => tracing::error!(error = %e, "writing the CNI config"),
        }
    }
    if let Some(routes) = glue.routes {
        loop {
            match crate::network::run_routes_shared(&nodes, &node_name, routes.clone()).await {
                Ok(()) => tracing::warn!("route sync ended; restarting"),
                Err(e) => tracing::error!(error = %e, "route sync"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        }
    }
}

/// Waits until the Node has a (valid IPv4) podCIDR.
async fn wait_for_pod_cidr(nodes: &Informer<Node>, node_name: &str) -> ipnetwork::Ipv4Network {
    let mut stream = nodes.applied();
    loop {
        match stream.next().await {
            Some(Ok(node)) if node.metadata.name.as_deref() == Some(node_name) => {
                let cidr = node.spec.and_then(|s| s.pod_cidr).and_then(|c| c.parse().ok());
                if let Some(cidr) = cidr {
                    return cidr;
                }
            }
            Some(_) => {}
            // The shared informer's task ended (the process is stopping).
            None => futures::future::pending::<()>().await,
        }
    }
}

/// Runs the agent until its pod sync fails.
pub async fn run<R: Runtime + Clone>(
    client: Client,
    config: AgentConfig,
    runtime: R,
) -> Result<()> {
    start(client, config, runtime).await?.wait().await
}

/// [`run`] over shared informers.
pub async fn run_with<R: Runtime + Clone>(
    informers: Arc<Informers>,
    config: AgentConfig,
    runtime: R,
) -> Result<()> {
    start_with(informers, config, runtime).await?.wait().await
}
