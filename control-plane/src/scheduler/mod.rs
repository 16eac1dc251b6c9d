//! The scheduler: pods without a node → filter → score → bind through pods/binding, over a
//! kube-rs `Client` (in memory inside skiff-server).

use std::time::Duration;

use kube::Client;

/// Scheduler settings; defaults match kube-scheduler's.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Pods whose spec.schedulerName is this are ours (upstream "default-scheduler").
    pub scheduler_name: String,
    /// Initial and maximum backoff of unschedulable pods (upstream 1 s and 10 s).
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: "default-scheduler".into(),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// Run the scheduler until the future is dropped.
pub async fn run(client: Client, config: SchedulerConfig) {
    let _ = (client, config);
    futures::future::pending::<()>().await;
}
