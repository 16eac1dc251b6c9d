//! Watch plumbing shared by the lifecycle controllers: a subscription to a shared informer
//! ([`skiff_core::informers`]) on its own task whose events are turned into reconcile
//! requests by a mapper, and
//! the driver that runs kube-runtime's `applier` over such a request channel with a
//! per-key exponential retry.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Future, StreamExt};
use kube::runtime::controller::{Action, Config as ControllerRunConfig, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tracing::Instrument;

use skiff_core::informers::{Informer, Kind};
use skiff_core::supervisor::{ReconcileError, catch_reconcile};

/// What a watch saw.
pub enum Change<'a, K> {
    Applied(&'a K),
    Deleted(&'a K),
}

/// Subscribe to the shared informer `shared` on a task of its own; each applied/deleted
/// object is handed to `map`, whose requests go to `tx`. Returns the informer's store once
/// it holds the first list.
pub async fn informer<K, R, F>(
    shared: &Informer<K>,
    tx: UnboundedSender<ObjectRef<R>>,
    mut map: F,
) -> Store<K>
where
    K: Kind,
    R: Resource<DynamicType = ()> + 'static,
    F: FnMut(Change<'_, K>) -> Vec<ObjectRef<R>> + Send + 'static,
{
    informer_with_store(shared, tx, move |change, _| map(change)).await
}

/// [`informer`] whose mapper also sees the store (already holding the change).
pub async fn informer_with_store<K, R, F>(
    shared: &Informer<K>,
    tx: UnboundedSender<ObjectRef<R>>,
    mut map: F,
) -> Store<K>
where
    K: Kind,
    R: Resource<DynamicType = ()> + 'static,
    F: FnMut(Change<'_, K>, &Store<K>) -> Vec<ObjectRef<R>> + Send + 'static,
{
    let stream = shared.subscribe();
    let store = shared.ready_store().await;
    let reader = store.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let refs = match &ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    map(Change::Applied(o), &store)
                }
                Ok(watcher::Event::Delete(o)) => map(Change::Deleted(o), &store),
                Ok(_) => Vec::new(),
                Err(e) => {
                    tracing::debug!(error = %e, kind = %K::kind(&()), "watch error");
                    Vec::new()
                }
            };
            for r in refs {
                if tx.send(r).is_err() {
                    return;
                }
            }
        }
    });
    reader
}

/// A kube-runtime `Controller` of `shared`'s kind over the shared informer (its store, and
/// a trigger on every applied object, as `Controller::new` would watch for itself), once
/// the store holds the first list.
pub async fn controller<K: Kind>(shared: &Informer<K>) -> kube::runtime::Controller<K> {
    let store = shared.ready_store().await;
    kube::runtime::Controller::for_stream(shared.applied(), store)
}

/// Per-key exponential retry after failed reconciles (5 ms doubling up to 1000 s, as
/// client-go's default controller rate limiter), reset on success.
#[derive(Default, Debug)]
pub struct Retries {
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    pub fn failed(&self, key: &str) -> Action {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = (*n + 1).min(20);
        let delay = Duration::from_millis(5u64 << *n).min(Duration::from_secs(1000));
        Action::requeue(delay)
    }

    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// How many failures in a row `key` has (0 after a success).
    pub fn failures(&self, key: &str) -> u32 {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// What a workload controller's reconciles share: the client, the controller's event
/// recorder and per-object retries.
pub struct WorkloadCtx {
    pub client: kube::Client,
    pub recorder: skiff_core::events::EventRecorder,
    /// Per-object exponential backoff after failed reconciles.
    pub retries: Retries,
}

impl WorkloadCtx {
    /// A context whose events come from `component` (e.g. `deployment-controller`).
    pub fn new(client: kube::Client, component: &str) -> Arc<WorkloadCtx> {
        Arc::new(WorkloadCtx {
            recorder: skiff_core::events::EventRecorder::new(client.clone(), component),
            retries: Retries::default(),
            client,
        })
    }
}

/// Runs a kube-runtime `Controller` (its `owns`/`watches` already wired) until the future is
/// dropped, with what every workload controller does around `reconcile`: a `reconcile` span
/// naming the object, its retry count reset on success, a warning and exponential backoff
/// ([`Retries`]) on failure, a panic included (it fails that object only).
pub async fn run_controller<K, E, F, Fut>(
    controller: kube::runtime::Controller<K>,
    ctx: Arc<WorkloadCtx>,
    reconcile: F,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
    F: Fn(Arc<K>, Arc<WorkloadCtx>) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let kind = K::kind(&()).to_string();
    controller
        .run(
            move |obj: Arc<K>, ctx: Arc<WorkloadCtx>| {
                let key = object_key(obj.as_ref());
                let span = tracing::info_span!("reconcile", kind = %kind, object = %key);
                let reconciled = reconcile(obj, ctx.clone()).instrument(span);
                async move {
                    let out = catch_reconcile(
                        async { reconciled.await.map_err(ReconcileError::Failed) },
                        &key,
                        |m| Err(ReconcileError::Panicked(m)),
                    )
                    .await;
                    if out.is_ok() {
                        ctx.retries.succeeded(&key);
                    }
                    out
                }
            },
            |obj: Arc<K>, error: &ReconcileError<E>, ctx: Arc<WorkloadCtx>| {
                let key = object_key(obj.as_ref());
                tracing::warn!(object = %key, error = %error, "reconcile failed");
                ctx.retries.failed(&key)
            },
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// `namespace/name` of an object: the key [`Retries`] counts failures under.
pub fn object_key<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Run kube-runtime's applier: requests from `rx` for objects in `store` are reconciled
/// (one at a time per key, de-duplicated); failures are retried with [`Retries`].
pub async fn run_applier<K, Ctx, Fut, E>(
    name: &'static str,
    store: Store<K>,
    rx: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<K>>,
    ctx: Arc<Ctx>,
    reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    let retries = Arc::new(Retries::default());
    let r2 = retries.clone();
    let queue = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok::<_, Infallible>);
    let reconciler = move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let key = object_key(obj.as_ref());
        let fut = reconcile(obj, ctx);
        let retries = r2.clone();
        Box::pin(async move {
            let span = tracing::debug_span!("reconcile", controller = name, object = %key);
            let out = catch_reconcile(
                async { fut.instrument(span).await.map_err(ReconcileError::Failed) },
                &key,
                |m| Err(ReconcileError::Panicked(m)),
            )
            .await;
            if out.is_ok() {
                retries.succeeded(&key);
            }
            out
        })
    };
    let error_policy = move |obj: Arc<K>, err: &ReconcileError<E>, _ctx: Arc<Ctx>| {
        let key = object_key(obj.as_ref());
        tracing::warn!(controller = name, object = %key, error = %err, "reconcile failed");
        retries.failed(&key)
    };
    let _ = store.wait_until_ready().await;
    applier(reconciler, error_policy, ctx, store, queue, ControllerRunConfig::default())
        .for_each(|_| futures::future::ready(()))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_per_key_and_reset_on_success() {
        let r = Retries::default();
        let delays: Vec<Action> = (0..4).map(|_| r.failed("ns/a")).collect();
        let expect: Vec<Action> =
            [10, 20, 40, 80].iter().map(|ms| Action::requeue(Duration::from_millis(*ms))).collect();
        assert_eq!(delays, expect);
        assert_eq!(r.failed("ns/b"), Action::requeue(Duration::from_millis(10)), "per key");
        for _ in 0..40 {
            r.failed("ns/a");
        }
        assert_eq!(r.failed("ns/a"), Action::requeue(Duration::from_secs(1000)), "capped");
        r.succeeded("ns/a");
        assert_eq!(r.failures("ns/a"), 0);
        assert_eq!(r.failed("ns/a"), Action::requeue(Duration::from_millis(10)), "reset");
    }

    /// The next event of a subscription, within 10 s.
    async fn next(
        s: &mut skiff_core::informers::Events<k8s_openapi::api::core::v1::ConfigMap>,
    ) -> watcher::Event<k8s_openapi::api::core::v1::ConfigMap> {
        use futures::StreamExt;
        match tokio::time::timeout(Duration::from_secs(10), s.next()).await {
            Ok(Some(Ok(ev))) => ev,
            other => panic!("no event: {other:?}"),
        }
    }

    /// One watch for every consumer of a kind; consumers waiting for its first list at once
    /// all wake; a subscriber that joins late is first given an initial list of what the
    /// informer holds; deletions reach every subscriber; a dropped subscription does not
    /// stop the others.
    #[tokio::test]
    async fn shared_informers_fan_out_every_event_and_list_late_subscribers() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, DeleteParams, PostParams};
        use serde_json::json;
        use skiff_core::informers::Informers;

        let (_server, client) = crate::testutil::api().await;
        let informers = Informers::new(client.clone());
        let shared = informers.all::<ConfigMap>();
        assert!(Arc::ptr_eq(&shared, &informers.all::<ConfigMap>()), "one informer per kind");
        // Two consumers waiting for the first list at the same time both wake (the store's own
        // wait_until_ready wakes only the last of them).
        let waiters = futures::future::join(shared.ready_store(), shared.ready_store());
        tokio::time::timeout(Duration::from_secs(10), waiters).await.expect("both waiters woke");
        let mut early = shared.subscribe();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let cm = |name: &str| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("configmap")
        };
        api.create(&PostParams::default(), &cm("a")).await.expect("create a");
        // The early subscriber sees the first list (maybe empty), then `a`.
        let mut seen_a = false;
        while !seen_a {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = next(&mut early).await
            {
                seen_a = o.metadata.name.as_deref() == Some("a");
            }
        }
        let store = shared.ready_store().await;
        assert!(store.state().iter().any(|o| o.metadata.name.as_deref() == Some("a")));
        // A late subscriber: an initial list holding `a` (and what the server keeps of its
        // own, kube-system's extension-apiserver-authentication), then live events.
        let mut late = shared.subscribe();
        assert!(matches!(next(&mut late).await, watcher::Event::Init));
        let mut listed = Vec::new();
        loop {
            match next(&mut late).await {
                watcher::Event::InitApply(o) => listed.push(o.metadata.name.unwrap_or_default()),
                watcher::Event::InitDone => break,
                other => panic!("expected the initial list, got {other:?}"),
            }
        }
        assert!(listed.iter().any(|n| n == "a"), "a in the initial list: {listed:?}");
        let dropped = shared.subscribe();
        drop(dropped);
        api.delete("a", &DeleteParams::default()).await.expect("delete a");
        for (who, s) in [("early", &mut early), ("late", &mut late)] {
            loop {
                match next(s).await {
                    watcher::Event::Delete(o) => {
                        assert_eq!(o.metadata.name.as_deref(), Some("a"), "{who}");
                        break;
                    }
                    watcher::Event::Apply(_) => {}
                    other => panic!("{who}: unexpected {other:?}"),
                }
            }
        }
        assert_eq!(informers.opened(), vec![("ConfigMap".to_string(), String::new())]);
    }
}
