//! The controllers of the control plane. Each is a kube-runtime loop (watch → reflector →
//! queue → level-triggered `reconcile`) over a kube-rs `Client`; in skiff-server that client
//! talks to the apiserver in memory, out of process it is a normal client. None of them
//! touches the store.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

pub mod daemonset;
pub mod deployment;
pub mod events;
pub mod hash;
pub mod job;
pub mod pods;
pub mod replicaset;
pub mod statefulset;
#[cfg(test)]
mod workload_tests;

use crate::apiserver::alloc::Cidr;

/// Controller settings; each default matches kube-controller-manager's.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `--node-monitor-grace-period`: a node whose Lease is older is NotReady (upstream 40 s).
    pub node_monitor_grace_period: Duration,
    /// Toleration seconds given to pods for not-ready/unreachable taints (upstream 300 s,
    /// DefaultTolerationSeconds admission).
    pub default_toleration: Duration,
    /// `--cluster-cidr` for node IPAM; `None` disables podCIDR allocation.
    pub cluster_cidr: Option<Cidr>,
    /// `--node-cidr-mask-size` (upstream 24).
    pub node_cidr_mask: u8,
    /// How long Events live (upstream `--event-ttl` 1 h).
    pub event_ttl: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            node_monitor_grace_period: Duration::from_secs(40),
            default_toleration: Duration::from_secs(300),
            cluster_cidr: Cidr::parse("10.244.0.0/16"),
            node_cidr_mask: 24,
            event_ttl: Duration::from_secs(3600),
        }
    }
}

/// What every controller gets.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
}

/// Run every controller until the future is dropped.
pub async fn run(client: Client, config: ControllerConfig) {
    let ctx = Arc::new(Context { client, config });
    run_workloads(ctx).await;
}

/// The workload controllers (ReplicaSet, Deployment, DaemonSet, Job, StatefulSet), until
/// the future is dropped.
pub async fn run_workloads(ctx: Arc<Context>) {
    tokio::join!(
        replicaset::run(ctx.clone()),
        deployment::run(ctx.clone()),
        daemonset::run(ctx.clone()),
        job::run(ctx.clone()),
        statefulset::run(ctx.clone()),
    );
}
