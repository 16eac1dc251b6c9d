//! The controllers of the control plane. Each is a kube-runtime loop (watch → reflector →
//! queue → level-triggered `reconcile`) over a kube-rs `Client`; in skiff-server that client
//! talks to the apiserver in memory, out of process it is a normal client. None of them
//! touches the store.
//!
//! It depends on kube-rs and the core crate only: never on the store, the API machinery or
//! the apiserver, which its tests alone use (to run against the apiserver in memory).

use std::future::Future;
use std::sync::Arc;

use kube::Client;

pub use context::{Context, ControllerConfig, DEFAULT_HELPER_IMAGE};

use skiff_core::supervisor::{self, ComponentHealth};

pub mod certificates;
pub mod clusterrole_aggregation;
pub mod context;
pub mod crd;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
#[cfg(test)]
mod event_recorder_tests;
pub mod event_ttl;
pub mod garbage_collector;
pub mod hash;
pub mod history;
pub mod informer;
pub mod job;
pub mod local_path;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod podautoscaler;
pub mod podgc;
pub mod pods;
pub mod replicaset;
pub mod resourcequota;
pub mod serviceaccount;
pub mod statefulset;
#[cfg(test)]
pub(crate) mod testutil;
pub mod volume;
pub mod volume_protection;
#[cfg(test)]
mod workload_tests;

/// Starts each controller as its own supervised component (see [`crate::supervisor`]).
struct Controllers<'a> {
    tasks: tokio::task::JoinSet<()>,
    ctx: &'a Arc<Context>,
    health: &'a Arc<ComponentHealth>,
}

impl Controllers<'_> {
    fn spawn<F, Fut>(&mut self, name: &'static str, run: F)
    where
        F: Fn(Arc<Context>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let ctx = self.ctx.clone();
        let supervision = ctx.config.supervision;
        self.tasks.spawn(supervisor::supervise(
            name,
            self.health.clone(),
            supervision,
            move || run(ctx.clone()),
        ));
    }

    /// The workload controllers (ReplicaSet, ReplicationController, Deployment, DaemonSet,
    /// Job, CronJob, StatefulSet).
    fn spawn_workloads(&mut self) {
        self.spawn("replicaset", replicaset::run);
        self.spawn("replicationcontroller", replicaset::run_replication_controllers);
        self.spawn("deployment", deployment::run);
        self.spawn("daemonset", daemonset::run);
        self.spawn("job", job::run);
        self.spawn("cronjob", cronjob::run);
        self.spawn("statefulset", statefulset::run);
    }

    /// Until the future is dropped (supervised components never end).
    async fn run(mut self) {
        while self.tasks.join_next().await.is_some() {}
        futures::future::pending::<()>().await;
    }
}

/// Run every controller, each supervised, their failures recorded in `health`, until the
/// future is dropped.
pub async fn run(client: Client, config: ControllerConfig, health: Arc<ComponentHealth>) {
    let ctx = Context::new(client, config);
    let mut c = Controllers { tasks: tokio::task::JoinSet::new(), ctx: &ctx, health: &health };
    c.spawn_workloads();
    c.spawn("endpointslice", endpointslice::run);
    c.spawn("node-lifecycle", node_lifecycle::run);
    c.spawn("namespace", namespace::run);
    c.spawn("serviceaccount", serviceaccount::run);
    c.spawn("event-ttl", event_ttl::run);
    c.spawn("podgc", podgc::run);
    c.spawn("disruption", disruption::run);
    c.spawn("resourcequota", resourcequota::run);
    c.spawn("horizontal-pod-autoscaler", podautoscaler::run);
    c.spawn("persistentvolume-binder", volume::run);
    c.spawn("volume-protection", volume_protection::run);
    c.spawn("clusterrole-aggregation", clusterrole_aggregation::run);
    c.spawn("certificatesigningrequests", certificates::run);
    c.spawn("customresourcedefinitions", crd::run);
    if let Some(root) = ctx.config.local_path_root.clone() {
        c.spawn("local-path-provisioner", move |ctx| local_path::run(ctx, root.clone()));
    }
    c.spawn("garbage-collector", |ctx| async move {
        if let Err(e) = garbage_collector::run(ctx).await {
            tracing::error!(error = %e, "garbage collector stopped");
        }
    });
    c.spawn("node-ipam", |ctx| async move {
        if let Err(e) = node_ipam::run(ctx).await {
            tracing::error!(error = %e, "node IPAM controller stopped");
        }
    });
    c.run().await;
}

/// The workload controllers alone, each supervised, until the future is dropped.
pub async fn run_workloads(ctx: Arc<Context>) {
    let health = Arc::new(ComponentHealth::default());
    let mut c = Controllers { tasks: tokio::task::JoinSet::new(), ctx: &ctx, health: &health };
    c.spawn_workloads();
    c.run().await;
}
