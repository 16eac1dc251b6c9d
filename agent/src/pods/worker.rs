//! The worker of one pod UID: its loop (a pass, then wait for a new object, the runtime
//! cache's wake-up or the pass's own timer) and what it remembers between passes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::watch;
use tokio::time::Instant;

use super::backoff::Backoff;
use super::images::PullBackoff;
use super::probes::ProbeTracker;
use super::status::{Knowledge, Observed};
use super::sync::sync_pod;
use super::{PodContext, Result, key, termination};
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
}

/// The outcome of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run again after this long (or earlier, on a new object).
    Wait(Duration),
    /// The pod is gone: the worker ends.
    Done,
}

/// The worker of one pod UID: passes until the pod is gone.
pub async fn worker<R: Runtime + Clone>(
    ctx: Arc<PodContext<R>>,
    uid: String,
    mut rx: watch::Receiver<Option<Arc<Pod>>>,
) {
    let mut st = WorkerState::default();
    let woken = ctx.cache.subscribe(&uid);
    let _forget = Forget(&ctx.cache, &uid);
    loop {
        let pod = rx.borrow_and_update().clone();
        let Some(pod) = pod else {
            termination::remove_pod(&ctx, &uid, 0).await;
            return;
        };
        let span = tracing::debug_span!("pod_sync", pod = %key(&pod), uid = %uid);
        let _enter = span.enter();
        drop(_enter);
        let wait = match sync_pod(&ctx, &pod, &mut st).await {
            Ok(Step::Done) => return,
            Ok(Step::Wait(d)) => d,
            Err(e) => {
                tracing::warn!(pod = %key(&pod), error = %e, "pod sync");
                // What the cache says may be what failed: the next pass asks the runtime.
                ctx.cache.invalidate(&uid);
                ctx.config.pod_relist.max(Duration::from_millis(100))
            }
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = woken.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Drops the worker's pod from the runtime cache when the worker ends (or is aborted).
struct Forget<'a>(&'a super::relist::RuntimeCache, &'a str);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

/// What the runtime has for pod `uid`, asked directly (workers go through the cache).
pub async fn observe<R: Runtime>(runtime: &R, uid: &str) -> Result<Observed> {
    super::relist::observe_direct(runtime, uid).await
}
