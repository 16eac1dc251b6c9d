//! The watch cache: every object of every resource in memory, fed by one store watch.
//! Lists are served from it, and each change is serialized once and fanned out to all
//! watchers of its resource through a broadcast channel.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use super::registry::{Registry, ResourceType};
use super::selectors::Labels;
use skiff_core::json::MemberName;
use skiff_core::json::ValueAt;
use skiff_store::{self as store, DynStore, EventKind, KeyValue, Revision};

/// Live events buffered per watcher before it is cut off as too slow (and sent a 410 that
/// makes it list again), for the resources written in bursts: every pod of a rollout or a
/// scale-up writes several of these (a quota's status is charged by every create it
/// limits).
const BROADCAST_CAPACITY: usize = 8_192;
/// The same for every other resource. The buffer is allocated in full up front (32 bytes a
/// slot): at 8,192 slots for each of the ~30 resources it was 8 MB of the server's memory.
const BROADCAST_CAPACITY_QUIET: usize = 1_024;

/// The live-event buffer of a resource's watchers (see [`BROADCAST_CAPACITY`]).
fn broadcast_capacity(rt: &ResourceType) -> usize {
    let bursty = matches!(
        (rt.group(), rt.plural()),
        ("", "pods" | "events" | "endpoints" | "nodes" | "resourcequotas")
            | ("events.k8s.io", "events")
            | ("discovery.k8s.io", "endpointslices")
            | ("coordination.k8s.io", "leases")
            | ("apps", "replicasets")
            | ("batch", "jobs")
    );
    if bursty { BROADCAST_CAPACITY } else { BROADCAST_CAPACITY_QUIET }
}

/// An object as stored in the cache: its JSON (with resourceVersion set) and the parts
/// selectors look at.
#[derive(Debug)]
pub struct CachedObject {
    pub key: String,
    pub namespace: String,
    pub name: String,
    pub rv: Revision,
    pub json: Bytes,
    pub labels: Labels,
    pub fields: Vec<(&'static str, String)>,
}

impl CachedObject {
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
pub struct CacheEvent {
    pub rv: Revision,
    pub kind: EventType,
    /// The object after the change (for a delete: its last state with the delete's rv).
    pub obj: Arc<CachedObject>,
    /// The object before the change (for selector transitions).
    pub prev: Option<Arc<CachedObject>>,
}

/// One resource's objects, recent history and live fan-out.
pub struct ResourceCache {
    state: RwLock<ResourceState>,
    tx: broadcast::Sender<Arc<CacheEvent>>,
    /// Events kept for watches that resume from a past resourceVersion.
    history_limit: usize,
    /// Values a request of this server is writing, by the address of their bytes, with what
    /// the cache indexes of them (see [`ResourceCache::expect`]).
    expected: Mutex<HashMap<usize, Expected>>,
    /// Events indexed from an expectation rather than by parsing their value.
    expected_hits: AtomicU64,
    /// Whether the store's events carry the written allocations (else nothing is expected).
    expecting: bool,
}

/// A value about to be written under `key`, and the index parts of the object it encodes.
struct Expected {
    key: String,
    value: Bytes,
    parts: IndexParts,
}

/// What selectors read of an object: its labels and the kind's field values (name and
/// namespace first).
struct IndexParts {
    labels: Labels,
    fields: Vec<(&'static str, String)>,
}

impl IndexParts {
    fn of(rt: &ResourceType, obj: &Value) -> IndexParts {
        let labels = obj
            .at(&["metadata", "labels"])
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        IndexParts { labels, fields: rt.field_values(obj) }
    }
}

/// Outstanding expectations per resource beyond which they are all dropped: each is taken by
/// its event or withdrawn by its failed write, so only cancelled requests leave any behind.
const MAX_EXPECTED: usize = 1024;

struct ResourceState {
    objects: BTreeMap<String, Arc<CachedObject>>,
    history: VecDeque<Arc<CacheEvent>>,
    /// Every event with rv > `history_floor` is in `history`.
    history_floor: Revision,
}

/// What a new watcher gets: the events it missed and a receiver for what follows.
pub struct Subscription {
    pub backlog: Vec<Arc<CacheEvent>>,
    pub rx: broadcast::Receiver<Arc<CacheEvent>>,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchStartError {
    #[error("too old resource version: {requested} ({oldest})")]
    TooOld { requested: Revision, oldest: Revision },
}

impl ResourceCache {
    fn new(floor: Revision, history_limit: usize, expecting: bool, capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity);
        ResourceCache {
            history_limit,
            expected: Mutex::new(HashMap::new()),
            expected_hits: AtomicU64::new(0),
            expecting,
            state: RwLock::new(ResourceState {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_floor: floor,
            }),
            tx,
        }
    }

    /// Objects whose key starts with `prefix`, from key `after` (exclusive) on.
    pub fn list(&self, prefix: &str, after: Option<&str>) -> Vec<Arc<CachedObject>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let start = match after {
            Some(k) => std::ops::Bound::Excluded(k.to_string()),
            None => std::ops::Bound::Included(prefix.to_string()),
        };
        state
            .objects
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The objects whose key starts with `prefix` as they were at revision `rv`, from key
    /// `after` (exclusive) on: the current objects with the later events of the history
    /// window undone. `TooOld` when the window no longer reaches back to `rv`.
    pub fn list_at(
        &self,
        prefix: &str,
        after: Option<&str>,
        rv: Revision,
    ) -> Result<Vec<Arc<CachedObject>>, WatchStartError> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        if rv < state.history_floor {
            return Err(WatchStartError::TooOld { requested: rv, oldest: state.history_floor });
        }
        let in_range = |key: &str| key.starts_with(prefix) && after.is_none_or(|a| key > a);
        // Each key changed since `rv` as it was then: what its first later event replaced.
        let mut then: BTreeMap<&str, Option<&Arc<CachedObject>>> = BTreeMap::new();
        let start = state.history.partition_point(|e| e.rv <= rv);
        for event in state.history.range(start..) {
            if in_range(&event.obj.key) {
                let before = match event.kind {
                    EventType::Added => None,
                    EventType::Modified | EventType::Deleted => event.prev.as_ref(),
                };
                then.entry(event.obj.key.as_str()).or_insert(before);
            }
        }
        let start = match after {
            Some(k) => std::ops::Bound::Excluded(k.to_string()),
            None => std::ops::Bound::Included(prefix.to_string()),
        };
        let now = state
            .objects
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix));
        if then.is_empty() {
            return Ok(now.map(|(_, o)| o.clone()).collect());
        }
        // Merge the two key-ordered sequences; a changed key takes its earlier state.
        let mut out = Vec::new();
        let mut changed = then.into_iter().peekable();
        for (key, obj) in now {
            // Keys before this one that were there at `rv` and are gone now.
            while let Some((_, before)) = changed.next_if(|(k, _)| *k < key.as_str()) {
                out.extend(before.cloned());
            }
            match changed.next_if(|(k, _)| *k == key.as_str()) {
                Some((_, before)) => out.extend(before.cloned()),
                None => out.push(obj.clone()),
            }
        }
        out.extend(changed.filter_map(|(_, before)| before.cloned()));
        Ok(out)
    }

    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).objects.get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.state.read().unwrap_or_else(|e| e.into_inner()).objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The revision of this resource's last change and its object count, read together:
    /// it changes whenever the objects do, which is what indexes derived from them (the
    /// RBAC authorizer's, Priority admission's classes) compare to know they are current.
    pub fn fingerprint(&self) -> (Revision, usize) {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        (state.history.back().map_or(state.history_floor, |e| e.rv), state.objects.len())
    }

    /// The objects under `prefix` decoded as `T`; one that does not decode is left out.
    pub fn decode_all<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        self.list(prefix, None)
            .iter()
            .filter_map(|o| serde_json::from_slice(&o.json).ok())
            .collect()
    }

    /// Subscribe from `from` (events with rv > from), or with `None` get a snapshot of all
    /// current objects as ADDED events first.
    pub fn subscribe(
        &self,
        from: Option<Revision>,
        prefix: &str,
    ) -> Result<Subscription, WatchStartError> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let rx = self.tx.subscribe();
        let backlog = match from {
            None => state
                .objects
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, o)| {
                    Arc::new(CacheEvent {
                        rv: o.rv,
                        kind: EventType::Added,
                        obj: o.clone(),
                        prev: None,
                    })
                })
                .collect(),
            Some(rv) => {
                if rv < state.history_floor {
                    return Err(WatchStartError::TooOld {
                        requested: rv,
                        oldest: state.history_floor,
                    });
                }
                let start = state.history.partition_point(|e| e.rv <= rv);
                state.history.range(start..).cloned().collect()
            }
        };
        Ok(Subscription { backlog, rx })
    }

    /// A request is about to store `value`, the encoding of `obj`, under `key`: when the
    /// store's event for it arrives, the cache takes `obj`'s index parts from here instead of
    /// parsing `value` again. Expectations are found by the value's allocation, so the event
    /// must carry this very `Bytes` (what the embedded store passes through; a value read back
    /// from disk or over the network is parsed as usual). The expectation holds the
    /// allocation, so no other value can be mistaken for it.
    pub fn expect(&self, rt: &ResourceType, key: &str, value: &Bytes, obj: &Value) {
        if !self.expecting {
            return;
        }
        let parts = IndexParts::of(rt, obj);
        let mut expected = self.expected.lock().unwrap_or_else(|e| e.into_inner());
        if expected.len() >= MAX_EXPECTED {
            expected.clear();
        }
        expected.insert(
            value.as_ptr() as usize,
            Expected { key: key.to_string(), value: value.clone(), parts },
        );
    }

    /// Withdraw the expectation of `value` (its write failed).
    pub fn unexpect(&self, value: &Bytes) {
        if self.expecting {
            self.take(value);
        }
    }

    fn take(&self, value: &Bytes) -> Option<Expected> {
        let mut expected = self.expected.lock().unwrap_or_else(|e| e.into_inner());
        let found = expected.remove(&(value.as_ptr() as usize))?;
        (found.value.len() == value.len()).then_some(found)
    }

    /// The index parts expected for `value` under `key`, if it is an expected allocation.
    fn take_expected(&self, key: &str, value: &Bytes) -> Option<IndexParts> {
        if !self.expecting {
            return None;
        }
        let found = self.take(value).filter(|e| e.key == key)?;
        self.expected_hits.fetch_add(1, Ordering::Relaxed);
        Some(found.parts)
    }

    /// Events so far indexed from an expectation.
    /// Expectations registered by writes and not yet met or withdrawn.
    #[cfg(test)]
    pub(crate) fn expectations_left(&self) -> usize {
        self.expected.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn expected_hits(&self) -> u64 {
        self.expected_hits.load(Ordering::Relaxed)
    }

    fn apply(&self, event: Arc<CacheEvent>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event.kind {
            EventType::Deleted => {
                state.objects.remove(&event.obj.key);
            }
            _ => {
                state.objects.insert(event.obj.key.clone(), event.obj.clone());
            }
        }
        state.history.push_back(event.clone());
        while state.history.len() > self.history_limit {
            if let Some(old) = state.history.pop_front() {
                state.history_floor = old.rv;
            }
        }
        // No receivers is fine: nobody watches this resource.
        let _ = self.tx.send(event);
    }

    fn reset(&self, objects: BTreeMap<String, Arc<CachedObject>>, floor: Revision) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        state.objects = objects;
        state.history.clear();
        state.history_floor = floor;
    }
}

/// All resources' caches and the revision they have caught up to.
pub struct WatchCache {
    registry: Arc<Registry>,
    /// Store key prefix of each resource, in registry order.
    prefixes: Vec<String>,
    caches: Vec<Arc<ResourceCache>>,
    /// Custom resources' caches by store prefix (`/registry/<group>/<plural>/`), made for
    /// any such key: a CRD's objects are cached from the start, whether or not the CRD is
    /// served yet (see [`crate::custom`]).
    custom: std::sync::RwLock<HashMap<String, Arc<ResourceCache>>>,
    history_limit: usize,
    expecting: bool,
    rev: AtomicI64,
    rev_tx: watch::Sender<Revision>,
}

impl WatchCache {
    /// Load everything from the store and start following it.
    pub async fn start(
        store: DynStore,
        registry: Arc<Registry>,
        history_limit: usize,
    ) -> store::Result<Arc<WatchCache>> {
        let (rev_tx, _) = watch::channel(0);
        let expecting = store.events_share_written_values();
        let caches = registry
            .all()
            .iter()
            .map(|rt| {
                Arc::new(ResourceCache::new(0, history_limit, expecting, broadcast_capacity(rt)))
            })
            .collect();
        let prefixes = registry.all().iter().map(ResourceType::prefix).collect();
        let cache = Arc::new(WatchCache {
            registry,
            prefixes,
            caches,
            custom: Default::default(),
            history_limit,
            expecting,
            rev: AtomicI64::new(0),
            rev_tx,
        });
        let rev = cache.load(&store).await?;
        let follower = cache.clone();
        tokio::spawn(async move { follower.follow(store, rev).await });
        Ok(cache)
    }

    async fn load(&self, store: &DynStore) -> store::Result<Revision> {
        let listed = store.list("/registry/").await?;
        let mut per: Vec<BTreeMap<String, Arc<CachedObject>>> =
            self.caches.iter().map(|_| BTreeMap::new()).collect();
        let mut custom: HashMap<String, BTreeMap<String, Arc<CachedObject>>> = HashMap::new();
        for kv in &listed.kvs {
            match self.resource_of(&kv.key) {
                Some(Owner::Builtin(idx, rt)) => {
                    if let Some(obj) = cached_object(rt, kv, kv.mod_revision) {
                        per[idx].insert(kv.key.clone(), Arc::new(obj));
                    }
                }
                Some(Owner::Custom(prefix)) => {
                    if let Some(obj) =
                        cached_object(crate::custom::index_type(), kv, kv.mod_revision)
                    {
                        custom
                            .entry(prefix.to_string())
                            .or_default()
                            .insert(kv.key.clone(), Arc::new(obj));
                    }
                }
                None => {}
            }
        }
        for (cache, objects) in self.caches.iter().zip(per) {
            cache.reset(objects, listed.revision);
        }
        // Every known custom prefix is reset, those whose objects are all gone included.
        let known: Vec<String> =
            self.custom.read().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
        for prefix in known.into_iter().chain(custom.keys().cloned().collect::<Vec<_>>()) {
            let objects = custom.remove(&prefix).unwrap_or_default();
            self.custom_cache(&prefix).reset(objects, listed.revision);
        }
        self.set_rev(listed.revision);
        Ok(listed.revision)
    }

    async fn follow(self: Arc<Self>, store: DynStore, mut rev: Revision) {
        loop {
            match store.watch("/registry/", rev).await {
                Ok(mut events) => {
                    'stream: while let Some(mut item) = events.next().await {
                        // Apply every event already delivered, then publish the revision
                        // once: each publish wakes every request waiting in `wait_for`.
                        loop {
                            match item {
                                Ok(event) => {
                                    rev = event.revision;
                                    self.dispatch(event);
                                }
                                Err(e) => {
                                    self.set_rev(rev);
                                    tracing::warn!(error = %e, "store watch failed; resuming");
                                    break 'stream;
                                }
                            }
                            match events.next().now_or_never() {
                                Some(Some(next)) => item = next,
                                _ => break,
                            }
                        }
                        self.set_rev(rev);
                    }
                }
                Err(store::Error::Compacted { .. }) => {
                    tracing::warn!("store history compacted under the watch cache; reloading");
                    match self.load(&store).await {
                        Ok(r) => rev = r,
                        Err(e) => tracing::error!(error = %e, "reloading the watch cache"),
                    }
                }
                Err(store::Error::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "starting the store watch"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn dispatch(&self, event: store::Event) {
        let (cache, rt) = match self.resource_of(&event.kv.key) {
            Some(Owner::Builtin(idx, rt)) => (self.caches[idx].clone(), rt),
            Some(Owner::Custom(prefix)) => (self.custom_cache(prefix), crate::custom::index_type()),
            None => return,
        };
        let prev = cache.get(&event.kv.key);
        let (kind, obj) = match event.kind {
            EventKind::Put => {
                let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
                let obj = match cache.take_expected(&event.kv.key, &event.kv.value) {
                    Some(parts) => cached_from_parts(&event.kv, event.kv.mod_revision, parts),
                    None => cached_object(rt, &event.kv, event.kv.mod_revision),
                };
                (kind, obj)
            }
            EventKind::Delete => (EventType::Deleted, cached_object(rt, &event.kv, event.revision)),
        };
        let Some(obj) = obj else {
            tracing::error!(key = %event.kv.key, "undecodable object in the store; skipped");
            return;
        };
        cache.apply(Arc::new(CacheEvent { rv: event.revision, kind, obj: Arc::new(obj), prev }));
    }

    fn set_rev(&self, rev: Revision) {
        self.rev.store(rev, Ordering::Release);
        self.rev_tx.send_replace(rev);
    }

    fn resource_of<'k>(&self, key: &'k str) -> Option<Owner<'_, 'k>> {
        match self.prefixes.iter().position(|p| key.starts_with(p.as_str())) {
            Some(idx) => Some(Owner::Builtin(idx, &self.registry.all()[idx])),
            None => crate::custom::custom_prefix(key, |g| self.registry.is_builtin_group(g))
                .map(Owner::Custom),
        }
    }

    /// The cache of a custom resource's prefix, made empty (at the current revision) the
    /// first time.
    fn custom_cache(&self, prefix: &str) -> Arc<ResourceCache> {
        if let Some(c) = self.custom.read().unwrap_or_else(|e| e.into_inner()).get(prefix) {
            return c.clone();
        }
        let mut map = self.custom.write().unwrap_or_else(|e| e.into_inner());
        map.entry(prefix.to_string())
            .or_insert_with(|| {
                Arc::new(ResourceCache::new(
                    self.revision(),
                    self.history_limit,
                    self.expecting,
                    BROADCAST_CAPACITY,
                ))
            })
            .clone()
    }

    /// The revision every cache has caught up to.
    pub fn revision(&self) -> Revision {
        self.rev.load(Ordering::Acquire)
    }

    /// Wait until the cache has seen revision `rev` (false on timeout).
    pub async fn wait_for(&self, rev: Revision, timeout: Duration) -> bool {
        if self.revision() >= rev {
            return true;
        }
        let mut rx = self.rev_tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r >= rev)).await.is_ok_and(|r| r.is_ok())
    }

    pub fn resource(&self, rt: &ResourceType) -> Arc<ResourceCache> {
        if rt.custom.is_some() {
            return self.custom_cache(&rt.prefix());
        }
        let idx = match self.registry.all().iter().position(|t| std::ptr::eq(t, rt)) {
            Some(idx) => idx,
            None => {
                let prefix = rt.prefix();
                self.prefixes.iter().position(|p| *p == prefix).unwrap_or(0)
            }
        };
        self.caches[idx].clone()
    }
}

/// Whose cache a store key goes to.
enum Owner<'r, 'k> {
    Builtin(usize, &'r ResourceType),
    Custom(&'k str),
}

/// Decode a stored value into a cached object with `rv` as its resourceVersion.
pub fn cached_object(rt: &ResourceType, kv: &KeyValue, rv: Revision) -> Option<CachedObject> {
    // Only the members selectors look at are built; the rest is checked and skipped.
    let value = indexed_parts(rt, &kv.value)?;
    cached_from_parts(kv, rv, IndexParts::of(rt, &value))
}

/// The cached object of `kv` at `rv`, with `parts` its index parts.
fn cached_from_parts(kv: &KeyValue, rv: Revision, parts: IndexParts) -> Option<CachedObject> {
    let IndexParts { labels, fields } = parts;
    // Stored objects carry no resourceVersion: splice it into the bytes rather than
    // serializing the whole object again.
    let json = match with_resource_version(&kv.value, rv) {
        Some(bytes) => bytes,
        None => {
            let mut value: Value = serde_json::from_slice(&kv.value).ok()?;
            set_resource_version(&mut value, rv);
            Bytes::from(serde_json::to_vec(&value).ok()?)
        }
    };
    Some(CachedObject {
        key: kv.key.clone(),
        namespace: fields[1].1.clone(),
        name: fields[0].1.clone(),
        rv,
        json,
        labels,
        fields,
    })
}

/// The members of a stored object the cache indexes (name, namespace, labels and the
/// kind's selectable fields), as a JSON value holding only those paths. Parsing skips
/// everything else without building it (but still rejects malformed JSON).
fn indexed_parts(rt: &ResourceType, json: &[u8]) -> Option<Value> {
    use serde::de::DeserializeSeed;
    let split: Vec<Vec<&str>> = rt
        .fields
        .iter()
        .map(|f| super::registry::selectable_field(f).0.split('.').collect())
        .collect();
    let mut paths: Vec<&[&str]> =
        vec![&["metadata", "name"], &["metadata", "namespace"], &["metadata", "labels"]];
    paths.extend(split.iter().map(Vec::as_slice));
    let mut de = serde_json::Deserializer::from_slice(json);
    let value = Sparse(&paths).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// A JSON value reduced to `.0`'s member paths: an object keeps the members some path
/// names (whole when a path ends there), anything else becomes null.
struct Sparse<'p>(&'p [&'p [&'p str]]);

impl<'de> serde::de::DeserializeSeed<'de> for Sparse<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Sparse<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<MemberName<'de>>()? {
            let key = key.as_str();
            let below: Vec<&[&str]> =
                self.0.iter().filter(|p| p.first() == Some(&key)).map(|p| &p[1..]).collect();
            if below.is_empty() {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if below.iter().any(|p| p.is_empty()) {
                out.insert(key.to_string(), map.next_value::<Value>()?);
            } else {
                out.insert(key.to_string(), map.next_value_seed(Sparse(&below))?);
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// `json` (an object without metadata.resourceVersion) with `"resourceVersion":"<rv>"` as the
/// first member of its top-level `metadata` object. `None` when there is no such object.
pub fn with_resource_version(json: &[u8], rv: Revision) -> Option<Bytes> {
    let open = top_level_member_start(json, b"metadata")?;
    if json.get(open) != Some(&b'{') {
        return None;
    }
    let empty = json[open + 1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(json.len() + 44);
    out.extend_from_slice(&json[..=open]);
    // Written into the output, not `format!`ed into a string first (every write answers
    // with it).
    use std::io::Write as _;
    let _ = write!(out, "\"resourceVersion\":\"{rv}\"{}", if empty { "" } else { "," });
    out.extend_from_slice(&json[open + 1..]);
    Some(Bytes::from(out))
}

/// The offset of the value of member `name` of the top-level JSON object.
fn top_level_member_start(json: &[u8], name: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < json.len() {
        match json[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    if json[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                let key = json.get(start..i)?;
                if depth == 1 && key == name {
                    // A key is followed by ':'; a string value is not.
                    let mut j = i + 1;
                    while json.get(j).is_some_and(u8::is_ascii_whitespace) {
                        j += 1;
                    }
                    if json.get(j) == Some(&b':') {
                        j += 1;
                        while json.get(j).is_some_and(u8::is_ascii_whitespace) {
                            j += 1;
                        }
                        return Some(j);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

pub fn set_resource_version(obj: &mut Value, rv: Revision) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_parts_keep_exactly_what_selectors_read() {
        let registry = Registry::new();
        let rt = registry.find("", "v1", "pods").unwrap();
        let json = br#"{"kind":"Pod","metadata":{"name":"p","namespace":"n","labels":{"a":"b"},"annotations":{"x":"y"}},"spec":{"nodeName":"n1","containers":[{"name":"c"}]},"status":{"phase":"Running","conditions":[]}}"#;
        let full: Value = serde_json::from_slice(json).unwrap();
        let sparse = indexed_parts(rt, json).unwrap();
        assert_eq!(rt.field_values(&sparse), rt.field_values(&full));
        assert_eq!(sparse["metadata"]["labels"], full["metadata"]["labels"]);
        assert!(sparse["metadata"].get("annotations").is_none());
        assert!(sparse["spec"].get("containers").is_none());
        let escaped = br#"{"metadata":{"na\u006de":"q","labels":{"k":"v"}}}"#;
        assert_eq!(indexed_parts(rt, escaped).unwrap()["metadata"]["name"], "q");
        assert!(indexed_parts(rt, br#"{"metadata":{"name":"p"}"#).is_none());
        assert!(indexed_parts(rt, br#"{"metadata":{"name":"p"}} x"#).is_none());
    }

    /// A list at a past revision sees every key as it was then, from any page start, for
    /// every revision the history window reaches; older ones are refused.
    #[test]
    fn lists_at_a_revision_undo_the_later_changes() {
        let cache = ResourceCache::new(0, 40, false, BROADCAST_CAPACITY);
        let object = |key: &str, rv: Revision| {
            Arc::new(CachedObject {
                key: key.to_string(),
                namespace: String::new(),
                name: key.to_string(),
                rv,
                json: Bytes::from(rv.to_string()),
                labels: Default::default(),
                fields: Vec::new(),
            })
        };
        let mut states: Vec<BTreeMap<String, Revision>> = vec![BTreeMap::new()];
        // A fixed pseudo-random walk of creates, updates and deletes over eight keys.
        let mut seed = 7u64;
        for rv in 1..=60 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = format!("/r/{}", (seed >> 33) % 8);
            let mut state = states.last().unwrap().clone();
            let prev = cache.get(&key);
            let event = match (&prev, (seed >> 40) % 3) {
                (Some(p), 0) => {
                    state.remove(&key);
                    CacheEvent { rv, kind: EventType::Deleted, obj: object(&p.key, rv), prev }
                }
                _ => {
                    state.insert(key.clone(), rv);
                    let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
                    CacheEvent { rv, kind, obj: object(&key, rv), prev }
                }
            };
            cache.apply(Arc::new(event));
            states.push(state);
        }
        let floor = cache.state.read().unwrap().history_floor;
        assert_eq!(floor, 20, "the window holds the last 40 events");
        for rv in floor..=60 {
            for after in [None, Some("/r/2"), Some("/r/5"), Some("/r/7")] {
                let listed: Vec<(String, Revision)> = cache
                    .list_at("/r/", after, rv)
                    .unwrap()
                    .iter()
                    .map(|o| (o.key.clone(), o.rv))
                    .collect();
                let expected: Vec<(String, Revision)> = states[rv as usize]
                    .iter()
                    .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                assert_eq!(listed, expected, "at {rv} after {after:?}");
            }
        }
        assert!(cache.list_at("/other/", None, floor).unwrap().is_empty());
        assert!(matches!(
            cache.list_at("/r/", None, floor - 1),
            Err(WatchStartError::TooOld { requested: 19, oldest: 20 })
        ));
    }

    /// Selectors whose value upstream formats from a typed field: read from their real path,
    /// with the zero value of the type when unset, from a full and a sparse parse alike.
    #[test]
    fn selectors_read_upstream_paths_and_zero_values() {
        let registry = Registry::new();
        let value_of = |resource: &str, group: &str, json: &[u8], field: &str| {
            let rt = registry.find(group, "v1", resource).unwrap();
            let full: Value = serde_json::from_slice(json).unwrap();
            let sparse = indexed_parts(rt, json).unwrap();
            let value = |v: &Value| {
                rt.field_values(v).into_iter().find(|(f, _)| *f == field).map(|(_, v)| v)
            };
            assert_eq!(value(&sparse), value(&full), "{resource} {field}");
            value(&full).unwrap()
        };
        let job = br#"{"metadata":{"name":"j"},"status":{"succeeded":2}}"#;
        assert_eq!(value_of("jobs", "batch", job, "status.successful"), "2");
        let job = br#"{"metadata":{"name":"j"},"status":{}}"#;
        assert_eq!(value_of("jobs", "batch", job, "status.successful"), "0");
        let event = br#"{"metadata":{"name":"e"},"source":{"component":"default-scheduler"}}"#;
        assert_eq!(value_of("events", "", event, "source"), "default-scheduler");
        let node = br#"{"metadata":{"name":"n"},"spec":{}}"#;
        assert_eq!(value_of("nodes", "", node, "spec.unschedulable"), "false");
        let node = br#"{"metadata":{"name":"n"},"spec":{"unschedulable":true}}"#;
        assert_eq!(value_of("nodes", "", node, "spec.unschedulable"), "true");
        let pod = br#"{"metadata":{"name":"p"},"spec":{"containers":[]}}"#;
        assert_eq!(value_of("pods", "", pod, "spec.hostNetwork"), "false");
        let rs = br#"{"metadata":{"name":"r"},"status":{}}"#;
        assert_eq!(value_of("replicasets", "apps", rs, "status.replicas"), "0");
    }

    #[test]
    fn splices_the_resource_version_into_top_level_metadata() {
        let json = br#"{"apiVersion":"v1","data":{"metadata":"x"},"kind":"ConfigMap","metadata":{"name":"a"},"spec":{"template":{"metadata":{}}}}"#;
        let out = with_resource_version(json, 42).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["metadata"]["name"], "a");
        assert!(v["spec"]["template"]["metadata"].get("resourceVersion").is_none());
        let empty = with_resource_version(br#"{"kind":"X","metadata":{}}"#, 7).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&empty).unwrap()["metadata"]["resourceVersion"],
            "7"
        );
        assert!(with_resource_version(br#"{"kind":"X"}"#, 7).is_none());
        let escaped = br#"{"a":"q\"metadata\":{","metadata":{"name":"b"}}"#;
        let v: Value = serde_json::from_slice(&with_resource_version(escaped, 3).unwrap()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "3");
    }
}
