//! An in-memory [`Store`] with the same revision semantics: a fake for fast unit tests of
//! the apiserver at the store seam (it keeps nothing across restarts).

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast;

use super::{
    Error, Event, EventKind, KeyValue, ListResult, Result, Revision, Store, TxnOp, TxnResult,
};

pub struct MemoryStore {
    state: Mutex<State>,
    tx: broadcast::Sender<Event>,
}

#[derive(Default)]
struct State {
    rev: Revision,
    compacted: Revision,
    kvs: BTreeMap<String, KeyValue>,
    history: Vec<Event>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(65_536);
        MemoryStore { state: Mutex::new(State::default()), tx }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn events_share_written_values(&self) -> bool {
        true
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.lock().kvs.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let s = self.lock();
        let kvs = s
            .kvs
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        Ok(ListResult { kvs, revision: s.rev })
    }

    async fn txn(&self, ops: Vec<TxnOp>) -> Result<Vec<TxnResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        super::check_request_size(&ops)?;
        let mut s = self.lock();
        // Check every precondition before changing anything.
        for op in &ops {
            match op {
                TxnOp::Create { key, .. } => {
                    if s.kvs.contains_key(key) {
                        return Err(Error::AlreadyExists { key: key.clone() });
                    }
                }
                TxnOp::Update { key, expected, .. }
                | TxnOp::Delete { key, expected: Some(expected) } => {
                    let cur = s.kvs.get(key).ok_or_else(|| Error::NotFound { key: key.clone() })?;
                    if cur.mod_revision != *expected {
                        return Err(Error::Conflict {
                            key: key.clone(),
                            expected: *expected,
                            actual: cur.mod_revision,
                        });
                    }
                }
                TxnOp::Delete { key, expected: None } => {
                    if !s.kvs.contains_key(key) {
                        return Err(Error::NotFound { key: key.clone() });
                    }
                }
            }
        }
        s.rev += 1;
        let rev = s.rev;
        let mut results = Vec::new();
        let mut events = Vec::new();
        for op in ops {
            match op {
                TxnOp::Create { key, value } | TxnOp::Update { key, value, .. } => {
                    let prev = s.kvs.get(&key).cloned();
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                        mod_revision: rev,
                    };
                    s.kvs.insert(key, kv.clone());
                    events.push(Event {
                        kind: EventKind::Put,
                        revision: rev,
                        kv: kv.clone(),
                        prev,
                    });
                    results.push(TxnResult::Put(kv));
                }
                TxnOp::Delete { key, .. } => {
                    let Some(prev) = s.kvs.remove(&key) else { continue };
                    events.push(Event {
                        kind: EventKind::Delete,
                        revision: rev,
                        kv: prev.clone(),
                        prev: None,
                    });
                    results.push(TxnResult::Deleted(prev));
                }
            }
        }
        for e in events {
            s.history.push(e.clone());
            let _ = self.tx.send(e);
        }
        Ok(results)
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.lock().rev)
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let s = self.lock();
        if after < s.compacted {
            return Err(Error::Compacted { requested: after, compacted: s.compacted });
        }
        if after > s.rev {
            return Err(Error::FutureRevision { requested: after, current: s.rev });
        }
        let rx = self.tx.subscribe();
        let backlog: Vec<Result<Event>> = s
            .history
            .iter()
            .filter(|e| e.revision > after && e.kv.key.starts_with(prefix))
            .cloned()
            .map(Ok)
            .collect();
        drop(s);
        let prefix = prefix.to_string();
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |e| {
            let prefix = prefix.clone();
            async move {
                match e {
                    Ok(e) if e.kv.key.starts_with(&prefix) => Some(Ok(e)),
                    Ok(_) => None,
                    Err(_) => Some(Err(Error::backend("memory watch", "watcher lagged"))),
                }
            }
        });
        Ok(futures::stream::iter(backlog).chain(live).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut s = self.lock();
        s.compacted = s.compacted.max(revision);
        let floor = s.compacted;
        s.history.retain(|e| e.revision > floor);
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.lock().compacted)
    }
}
