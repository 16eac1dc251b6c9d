//! What a pod worker remembers between passes, and what a pass decides: the state the
//! worker loop ([`super::worker`]), a pass ([`super::sync`]) and termination share.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodStatus;
use tokio::time::Instant;

use super::backoff::Backoff;
use super::error::Result;
use super::images::PullBackoff;
use super::probes::ProbeTracker;
use super::status::{Knowledge, Observed};
use crate::runtime::Runtime;

/// What a worker remembers about its pod between passes (lost on agent restart, which only
/// resets back-offs and probe counters).
#[derive(Debug, Default)]
pub struct WorkerState {
    pub(super) crash: HashMap<String, Backoff>,
    /// Exits already counted into the back-off (container ids).
    pub(super) counted: HashSet<String>,
    pub(super) pulls: PullBackoff,
    pub(super) probes: HashMap<String, ProbeTracker>,
    pub(super) know: Knowledge,
    pub(super) last_written: Option<PodStatus>,
    /// When the deletion of the pod was first seen (the grace period counts from here).
    pub(super) deleting_since: Option<Instant>,
    /// When the pod's projected ServiceAccount tokens are written again.
    pub(super) token_refresh_at: Option<Instant>,
    /// Whether this worker decided yet about tokens written before it started (an agent
    /// restart): those are refreshed at once, their age is unknown.
    pub(super) tokens_checked: bool,
    /// When this worker first saw the pod (`kubelet_pod_start_duration_seconds`).
    pub(super) first_seen: Option<Instant>,
    /// Whether the pod's start was measured (or it ran before this worker saw it).
    pub(super) start_measured: bool,
}

/// The outcome of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run again after this long (or earlier, on a new object).
    Wait(Duration),
    /// The pod is gone: the worker ends.
    Done,
}

/// What the runtime has for pod `uid`, asked directly (workers go through the cache).
pub async fn observe<R: Runtime>(runtime: &R, uid: &str) -> Result<Observed> {
    super::relist::observe_direct(runtime, uid).await
}
