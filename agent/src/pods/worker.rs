//! The worker of one pod UID: its loop (a pass, then wait for a new object, the runtime
//! cache's wake-up or the pass's own timer). What it remembers between passes is
//! [`super::state`]'s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::context::{PodContext, key};
use super::state::{Step, WorkerState};
use super::sync::sync_pod;
use super::termination;
use crate::runtime::Runtime;

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
