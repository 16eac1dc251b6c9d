//! One informer per kind (and selection) per process, handed to every consumer, as
//! client-go's `SharedInformerFactory` does: a single watch feeds a single reflector store,
//! and every consumer subscribes to the informer's events instead of opening its own watch.
//!
//! kube-runtime's own shared streams (`store_shared`, `Controller::for_shared_stream`) pass
//! on applied objects only, never deletions, which the controllers' mappers need (a deleted
//! pod must wake its ReplicaSet, its Service's EndpointSlices). So the fan-out here passes
//! every watcher event, and a consumer turns them into what kube-runtime expects with
//! `WatchStreamExt` (`applied_objects()` for a controller's own kind, `touched_objects()`
//! for the kinds it owns or watches, as `Controller::new`/`owns`/`watches` do).
//!
//! A consumer may subscribe at any time (a supervised controller restarts and subscribes
//! again): once the informer has listed, a new subscriber is first sent the store's objects
//! as an initial list (`Init`, `InitApply`s, `InitDone`), then the live events. A subscriber
//! that joins during a (re)list gets its initial list when that list completes. Events are
//! queued per subscriber without bound: consumers here are controllers and the agent's
//! loops, which keep reading; a dropped subscription is forgotten at the next event.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

/// The kinds an informer can be made of: a typed resource of k8s-openapi or kube-derive.
pub trait Kind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Kind for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// The process's informers, created on first use, one per kind and field selector.
pub struct Informers {
    client: Client,
    made: Mutex<HashMap<(TypeId, String), Arc<dyn Any + Send + Sync>>>,
    /// The watches opened, in order: kind and field selector ("" for all objects).
    opened: Mutex<Vec<(String, String)>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Informers {
    pub fn new(client: Client) -> Arc<Informers> {
        Arc::new(Informers {
            client,
            made: Mutex::default(),
            opened: Mutex::default(),
            tasks: Mutex::default(),
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The informer of every `K` of the cluster.
    pub fn all<K: Kind>(&self) -> Arc<Informer<K>> {
        self.selected("")
    }

    /// The informer of the `K`s that field selector `fields` selects (`spec.nodeName=n1`).
    /// Consumers of the same selection share it; another selection is another watch.
    pub fn selected<K: Kind>(&self, fields: &str) -> Arc<Informer<K>> {
        let key = (TypeId::of::<K>(), fields.to_string());
        let mut made = lock(&self.made);
        if let Some(found) = made.get(&key).and_then(|a| a.clone().downcast::<Informer<K>>().ok()) {
            return found;
        }
        let (store, writer) = reflector::store::<K>();
        let informer = Arc::new(Informer {
            store,
            subscribers: Mutex::new(Subscribers { listed: false, subs: Vec::new() }),
            ready: tokio::sync::watch::Sender::new(false),
        });
        let mut cfg = watcher::Config::default();
        if !fields.is_empty() {
            cfg = cfg.fields(fields);
        }
        let api: Api<K> = Api::all(self.client.clone());
        let task = tokio::spawn(
            informer
                .clone()
                .feed(reflector::reflector(writer, watcher(api, cfg).default_backoff())),
        );
        lock(&self.tasks).push(task);
        let kind = K::kind(&()).to_string();
        tracing::debug!(%kind, fields, "shared informer started");
        lock(&self.opened).push((kind, fields.to_string()));
        made.insert(key, informer.clone());
        informer
    }

    /// The watches this process's informers opened: kind and field selector.
    pub fn opened(&self) -> Vec<(String, String)> {
        lock(&self.opened).clone()
    }
}

impl Drop for Informers {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

/// One kind's informer: its store and its subscribers.
pub struct Informer<K: Kind> {
    store: Store<K>,
    subscribers: Mutex<Subscribers<K>>,
    /// True once the store holds its first complete list. Consumers wait on this, not on
    /// the store's own `wait_until_ready`: that wakes one waiter only (kube-runtime's
    /// `DelayedInit` keeps the last poller's waker), so a second consumer waiting on the
    /// same store at the same time would wait forever.
    ready: tokio::sync::watch::Sender<bool>,
}

struct Subscribers<K> {
    /// Whether the store holds a complete list (false during a relist).
    listed: bool,
    subs: Vec<Subscriber<K>>,
}

struct Subscriber<K> {
    tx: mpsc::UnboundedSender<watcher::Event<K>>,
    /// Whether it was sent an initial list; until then it waits for the next `InitDone`.
    listed: bool,
}

/// A subscription: the informer's watcher events, as a `watcher()` stream would yield them.
pub type Events<K> = futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

impl<K: Kind> Informer<K> {
    /// The shared store, once it holds the first complete list. (Its own
    /// `wait_until_ready` then returns at once, for any number of callers.)
    pub async fn ready_store(&self) -> Store<K> {
        let mut ready = self.ready.subscribe();
        // Err: the informer's task ended (the process is stopping): the store as it is.
        let _ = ready.wait_for(|r| *r).await;
        // Marks kube's own readiness as seen, so later waits on it do not block.
        let _ = self.store.wait_until_ready().await;
        self.store.clone()
    }

    /// The informer's events from now on, after an initial list of what it holds.
    pub fn subscribe(&self) -> Events<K> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut subs = lock(&self.subscribers);
        let mut sub = Subscriber { tx, listed: false };
        if subs.listed {
            sub.listed = initial_list(&sub.tx, &self.store);
        }
        subs.subs.push(sub);
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|ev| ev.map(Ok))).boxed()
    }

    /// The objects added, changed or deleted (kube's `touched_objects`): what a controller's
    /// `owns_stream`/`watches_stream` takes.
    pub fn touched(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.subscribe().touched_objects()
    }

    /// The objects added or changed (kube's `applied_objects`): what `Controller::for_stream`
    /// takes for the controller's own kind.
    pub fn applied(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.subscribe().applied_objects()
    }

    /// Hand each event of the reflector (already applied to the store) to the subscribers.
    async fn feed(
        self: Arc<Self>,
        stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    ) {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::debug!(error = %e, kind = %K::kind(&()), "shared informer watch");
                    continue;
                }
            };
            let mut guard = lock(&self.subscribers);
            let subs = &mut *guard;
            match &ev {
                watcher::Event::Init => subs.listed = false,
                watcher::Event::InitDone => {
                    subs.listed = true;
                    self.ready.send_replace(true);
                }
                _ => {}
            }
            subs.subs.retain_mut(|sub| {
                if sub.listed {
                    return sub.tx.send(ev.clone()).is_ok();
                }
                if matches!(ev, watcher::Event::InitDone) {
                    sub.listed = initial_list(&sub.tx, &self.store);
                    return sub.listed;
                }
                !sub.tx.is_closed()
            });
        }
    }
}

/// Send `tx` the store's objects as an initial list; false when the receiver is gone.
fn initial_list<K: Kind>(tx: &mpsc::UnboundedSender<watcher::Event<K>>, store: &Store<K>) -> bool {
    let objects = store.state();
    tx.send(watcher::Event::Init).is_ok()
        && objects.iter().all(|o| tx.send(watcher::Event::InitApply(K::clone(o))).is_ok())
        && tx.send(watcher::Event::InitDone).is_ok()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
