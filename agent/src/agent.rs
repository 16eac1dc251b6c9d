//! The agent process: wires node registration, pod sync, streaming, DNS and network glue.
//!
//! [`start`] registers the Node and starts the heartbeat and the pod sync over the given
//! runtime; [`run`] does the same and runs until the pod sync fails. Streaming (logs/exec),
//! cluster DNS and the network glue (CNI config, routes, proxy) are composed here by the
//! binary once their modules land (see AGENT.md); they take the same client and config.

use std::sync::Arc;

use kube::Client;
use tokio::task::JoinHandle;

use crate::config::AgentConfig;
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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A running agent; dropping it stops the agent's tasks (pods keep running in the runtime).
pub struct AgentHandle {
    node_name: String,
    heartbeat: JoinHandle<()>,
    pods: JoinHandle<crate::pods::Result<()>>,
    static_pods: Option<JoinHandle<()>>,
}

impl AgentHandle {
    pub fn node_name(&self) -> &str {
        &self.node_name
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
        if let Some(s) = &self.static_pods {
            s.abort();
        }
    }
}

/// Registers the node and starts heartbeating and syncing its pods over `runtime`.
pub async fn start<R: Runtime + Clone>(
    client: Client,
    config: AgentConfig,
    runtime: R,
) -> Result<AgentHandle> {
    if config.node_name.is_empty() {
        return Err(Error::NoNodeName);
    }
    let version = runtime.version().await.map_err(Error::RuntimeVersion)?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    let config = Arc::new(config);
    let node = NodeAgent::register(client.clone(), config.clone(), &runtime_version)
        .await
        .map_err(Error::Node)?;
    let allocatable = node.allocatable();
    let ctx = Arc::new(PodContext {
        client: client.clone(),
        runtime,
        host_ip: config.effective_node_ip().to_string(),
        runtime_name: version.runtime_name.clone(),
        config: config.clone(),
    });
    let heartbeat = tokio::spawn(node.run());
    let static_pods = config.static_pod_dir.clone().map(|dir| {
        tokio::spawn(crate::pods::static_pods::run(client.clone(), config.clone(), dir))
    });
    let pods = tokio::spawn(PodSync::new(ctx, allocatable).run());
    Ok(AgentHandle { node_name: config.node_name.clone(), heartbeat, pods, static_pods })
}

/// Runs the agent until its pod sync fails.
pub async fn run<R: Runtime + Clone>(
    client: Client,
    config: AgentConfig,
    runtime: R,
) -> Result<()> {
    start(client, config, runtime).await?.wait().await
}
