//! Supervision of long-running components (each controller, the scheduler): every one runs
//! as its own task; when it stops (a panic, or its future returning) it is restarted with
//! exponential backoff, and one component's failure never stops another. A panic inside
//! one reconcile is caught where the reconcile runs ([`catch_reconcile`]) and fails only
//! that object, which is retried with its own backoff.
//!
//! Failures are recorded in [`ComponentHealth`], which the apiserver's `/healthz`,
//! `/readyz` and `/metrics` read: a component is unhealthy from a failure until it has run
//! [`Supervision::stable_after`] without another.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

/// Restart policy. The defaults follow client-go's workqueue rate limiter in spirit: quick
/// first retries, a five-minute ceiling.
#[derive(Debug, Clone, Copy)]
pub struct Supervision {
    /// Delay before the first restart (1 s), doubled after each failure.
    pub initial_backoff: Duration,
    /// Longest delay between restarts (5 min).
    pub max_backoff: Duration,
    /// How long a restarted component must run without failing before it counts as
    /// healthy again and its backoff starts over (1 min).
    pub stable_after: Duration,
}

impl Default for Supervision {
    fn default() -> Self {
        Supervision {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            stable_after: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Restarts after the component stopped.
    restarts: u64,
    /// Panics caught in one reconcile (the component went on).
    reconcile_panics: u64,
    /// The last failure: when, and what happened.
    last_failure: Option<(Instant, String)>,
    /// How long after a failure the component counts as failing.
    stable_after: Duration,
}

impl State {
    fn new(stable_after: Duration) -> State {
        State { stable_after, ..State::default() }
    }
}

/// Each component's failures, for health checks and metrics.
#[derive(Debug, Default)]
pub struct ComponentHealth {
    components: Mutex<BTreeMap<&'static str, State>>,
}

/// One component as health and metrics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentStatus {
    pub name: &'static str,
    pub restarts: u64,
    pub reconcile_panics: u64,
    /// `Some(reason)` while the component counts as failing.
    pub failing: Option<String>,
}

impl ComponentHealth {
    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<&'static str, State>) -> R) -> R {
        f(&mut self.components.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `name` is supervised (it shows in health and metrics from now on).
    pub fn register(&self, name: &'static str, supervision: &Supervision) {
        self.with(|c| {
            c.entry(name).or_insert_with(|| State::new(supervision.stable_after));
        });
    }

    fn entry<'a>(c: &'a mut BTreeMap<&'static str, State>, name: &'static str) -> &'a mut State {
        c.entry(name).or_insert_with(|| State::new(Supervision::default().stable_after))
    }

    fn stopped(&self, name: &'static str, reason: String) {
        self.with(|c| {
            let s = Self::entry(c, name);
            s.restarts += 1;
            s.last_failure = Some((Instant::now(), reason));
        });
    }

    /// A reconcile of `name` panicked; the component goes on.
    pub fn reconcile_panicked(&self, name: &'static str, reason: String) {
        self.with(|c| {
            let s = Self::entry(c, name);
            s.reconcile_panics += 1;
            s.last_failure = Some((Instant::now(), reason));
        });
    }

    /// Every supervised component, by name.
    pub fn statuses(&self) -> Vec<ComponentStatus> {
        self.with(|c| {
            c.iter()
                .map(|(name, s)| ComponentStatus {
                    name,
                    restarts: s.restarts,
                    reconcile_panics: s.reconcile_panics,
                    failing: s
                        .last_failure
                        .as_ref()
                        .filter(|(at, _)| at.elapsed() < s.stable_after)
                        .map(|(_, reason)| reason.clone()),
                })
                .collect()
        })
    }
}

tokio::task_local! {
    /// The supervised component the current task runs, for [`catch_reconcile`].
    static COMPONENT: (&'static str, Arc<ComponentHealth>);
}

/// Run `start()` as the component `name` until the returned future is dropped, restarting
/// it with backoff whenever it stops.
pub fn supervise<F, Fut>(
    name: &'static str,
    health: Arc<ComponentHealth>,
    supervision: Supervision,
    start: F,
) -> impl Future<Output = ()> + Send + 'static
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    health.register(name, &supervision);
    async move {
        let mut backoff = supervision.initial_backoff;
        loop {
            let started = Instant::now();
            let run = COMPONENT.scope((name, health.clone()), AssertUnwindSafe(start()));
            let reason = match run.catch_unwind().await {
                Ok(()) => "stopped".to_string(),
                Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
            };
            if started.elapsed() >= supervision.stable_after {
                backoff = supervision.initial_backoff;
            }
            tracing::error!(component = name, %reason, restart_in = ?backoff, "component stopped; restarting");
            health.stopped(name, reason);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(supervision.max_backoff);
        }
    }
}

/// Run one reconcile; a panic in it becomes `on_panic(message)` (an error of the object,
/// retried with its backoff) and is recorded against the current component.
pub async fn catch_reconcile<T>(
    fut: impl Future<Output = T>,
    key: &str,
    on_panic: impl FnOnce(String) -> T,
) -> T {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(v) => v,
        Err(payload) => {
            let message =
                format!("reconcile of {key} panicked: {}", panic_message(payload.as_ref()));
            tracing::error!(object = key, %message, "reconcile panicked");
            let _ = COMPONENT
                .try_with(|(name, health)| health.reconcile_panicked(name, message.clone()));
            on_panic(message)
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

/// A reconcile's failure: its own error, or a panic caught by [`catch_reconcile`].
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Failed(E),
    #[error("{0}")]
    Panicked(String),
}

/// A task aborted when this is dropped: a component's helper (an HTTP endpoint, a watch)
/// that must end with the component.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_component_restarts_with_backoff_and_shows_failing() {
        let health = Arc::new(ComponentHealth::default());
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let sup = Supervision::default();
        let task = tokio::spawn(supervise("flaky", health.clone(), sup, move || {
            let r = r.clone();
            async move {
                if r.fetch_add(1, Ordering::SeqCst) < 3 {
                    panic!("overflow in time arithmetic");
                }
                futures::future::pending::<()>().await;
            }
        }));
        let sibling = tokio::spawn(supervise("steady", health.clone(), sup, || {
            futures::future::pending::<()>()
        }));
        // Restarts after 1 s, 2 s, 4 s.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        let statuses = health.statuses();
        let flaky = statuses.iter().find(|s| s.name == "flaky").expect("flaky");
        assert_eq!(flaky.restarts, 3);
        assert!(
            flaky.failing.as_deref().is_some_and(|r| r.contains("overflow in time arithmetic")),
            "{flaky:?}"
        );
        let steady = statuses.iter().find(|s| s.name == "steady").expect("steady");
        assert_eq!((steady.restarts, steady.failing.as_deref()), (0, None));
        // Healthy again once it has run a minute without failing.
        tokio::time::sleep(Duration::from_secs(61)).await;
        let flaky = health.statuses().into_iter().find(|s| s.name == "flaky").expect("flaky");
        assert_eq!(flaky.failing, None);
        task.abort();
        sibling.abort();
    }

    #[tokio::test]
    async fn a_reconcile_panic_fails_only_that_object() {
        let health = Arc::new(ComponentHealth::default());
        let out = COMPONENT
            .scope(("ctl", health.clone()), async {
                let bad = catch_reconcile(async { panic!("boom") }, "ns/bad", Err::<u8, _>).await;
                let good = catch_reconcile(async { Ok::<u8, String>(1) }, "ns/good", Err).await;
                (bad, good)
            })
            .await;
        assert_eq!(out.0, Err("reconcile of ns/bad panicked: boom".to_string()));
        assert_eq!(out.1, Ok(1));
        let s = &health.statuses()[0];
        assert_eq!((s.name, s.reconcile_panics), ("ctl", 1));
        assert!(s.failing.is_some());
    }
}
