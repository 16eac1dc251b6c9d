//! The storage layer: a key-value store with MVCC revisions, the only state the apiserver
//! keeps. It knows keys, values and revisions, nothing of Kubernetes objects: it may not
//! import the API machinery, the apiserver or anything above them.
//!
//! Semantics follow etcd v3 so the two backends are interchangeable:
//! - every successful write transaction gets the next store revision; all operations of one
//!   transaction share it, and `resourceVersion` of an object is its `mod_revision`;
//! - `watch(prefix, after)` yields every change with revision > `after`, in revision order,
//!   with no gap and no duplicate, then follows live changes; `after` below the compacted
//!   revision fails with [`Error::Compacted`] (`after == compacted` is fine: everything newer
//!   is kept);
//! - writes are acknowledged only once durable (fsync on the embedded backend, quorum on etcd).
//!
//! Backends: [`embedded::EmbeddedStore`] (the default, one redb file) and [`etcd::EtcdStore`].
//! Revisions are opaque increasing numbers: an empty embedded store is at revision 0, a fresh
//! etcd at 1. [`testing`] starts real etcd clusters for tests; [`bench`] measures creates/s.

pub mod bench;
pub mod embedded;
pub mod encryption;
pub mod etcd;
pub mod memory;
#[cfg(test)]
mod suite;
pub mod testing;
mod wal;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

/// A store revision (etcd's revision; Kubernetes' resourceVersion).
pub type Revision = i64;

/// One stored key with its value and revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the write that created the key (unchanged by later updates).
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
}

/// One operation of a write transaction, with its precondition.
#[derive(Debug, Clone)]
pub enum TxnOp {
    /// Create `key`; fails with [`Error::AlreadyExists`] if it exists.
    Create { key: String, value: Bytes },
    /// Replace `key`; fails with [`Error::NotFound`] if absent and with [`Error::Conflict`]
    /// if its `mod_revision` is not `expected`.
    Update { key: String, value: Bytes, expected: Revision },
    /// Delete `key`; fails with [`Error::NotFound`] if absent and with [`Error::Conflict`]
    /// if `expected` is given and differs from its `mod_revision`.
    Delete { key: String, expected: Option<Revision> },
}

/// What a committed transaction did to one key, in the order of the ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    /// The key after a Create or Update (its `mod_revision` is the transaction's revision).
    Put(KeyValue),
    /// A Delete: the key as it was just before it was deleted.
    Deleted(KeyValue),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change seen by a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// The revision of the change (for a delete, the deleting transaction's revision).
    pub revision: Revision,
    /// For Put: the key after the write. For Delete: the last value before the delete
    /// (with that value's create/mod revisions).
    pub kv: KeyValue,
    /// For Put: the previous value if the key existed. For Delete: `None`.
    pub prev: Option<KeyValue>,
}

/// Result of a list: the matching keys (sorted by key) and the revision they were read at.
#[derive(Debug, Clone, Default)]
pub struct ListResult {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("key {key} not found")]
    NotFound { key: String },
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    #[error("key {key} was modified: expected revision {expected}, found {actual}")]
    Conflict { key: String, expected: Revision, actual: Revision },
    #[error("revision {requested} has been compacted (compacted up to {compacted})")]
    Compacted { requested: Revision, compacted: Revision },
    #[error("revision {requested} is in the future (current {current})")]
    FutureRevision { requested: Revision, current: Revision },
    #[error("store backend failed: {context}")]
    Backend {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("store is closed")]
    Closed,
    /// The transaction itself is malformed (e.g. names one key twice); nothing was applied.
    #[error("invalid transaction: {reason}")]
    InvalidTxn { reason: String },
    /// The transaction writes more than a request may carry ([`MAX_REQUEST_BYTES`], etcd's
    /// `--max-request-bytes`); nothing was applied. etcd's own words.
    #[error("etcdserver: request is too large")]
    TooLarge { size: usize, limit: usize },
}

impl Error {
    pub fn backend(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend { context: context.into(), source: source.into() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl TxnOp {
    /// The bytes of the value it writes (0 for a delete).
    pub fn value_len(&self) -> usize {
        match self {
            TxnOp::Create { value, .. } | TxnOp::Update { value, .. } => value.len(),
            TxnOp::Delete { .. } => 0,
        }
    }

    /// The key this operation writes.
    pub fn key(&self) -> &str {
        match self {
            TxnOp::Create { key, .. } | TxnOp::Update { key, .. } | TxnOp::Delete { key, .. } => {
                key
            }
        }
    }
}

/// The most a transaction may write, keys and values together: etcd's default
/// `--max-request-bytes` (1.5 MiB), which the embedded store enforces too, so an object
/// that one backend stores the other does as well.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// Refuse a transaction writing more than [`MAX_REQUEST_BYTES`] (the embedded store; etcd
/// refuses it itself).
pub(crate) fn check_request_size(ops: &[TxnOp]) -> Result<()> {
    let size: usize = ops.iter().map(|op| op.key().len() + op.value_len()).sum();
    if size > MAX_REQUEST_BYTES {
        return Err(Error::TooLarge { size, limit: MAX_REQUEST_BYTES });
    }
    Ok(())
}

/// Refuse a transaction naming one key twice (both backends, so they behave alike).
pub(crate) fn check_distinct_keys(ops: &[TxnOp]) -> Result<()> {
    let mut keys: Vec<&str> = ops.iter().map(TxnOp::key).collect();
    keys.sort_unstable();
    match keys.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::InvalidTxn { reason: format!("key {} appears twice", w[0]) }),
        None => Ok(()),
    }
}

/// The storage interface. Both backends pass the shared suite in `suite.rs`.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Read one key at the current revision.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// All keys starting with `prefix`, sorted by key, at one consistent revision.
    async fn list(&self, prefix: &str) -> Result<ListResult>;

    /// Apply all ops atomically at one new revision, or none of them (the first failing
    /// precondition is returned). An empty `ops` is an error-free no-op returning no results.
    /// Each key may appear at most once (etcd refuses more): otherwise [`Error::InvalidTxn`].
    async fn txn(&self, ops: Vec<TxnOp>) -> Result<Vec<TxnResult>>;

    /// The latest committed revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Every change under `prefix` with revision > `after`, then live changes, until the
    /// stream is dropped. Fails (as the first and only item) with `Compacted` when `after`
    /// is below the compacted revision, `FutureRevision` when above the current one.
    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>>;

    /// Forget history at or below `revision` (watches from below it fail with `Compacted`).
    /// Current values are kept. At or below the compacted revision it is a no-op; above the
    /// current revision it fails with [`Error::FutureRevision`].
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The revision up to which history has been compacted (0 if never).
    async fn compacted_revision(&self) -> Result<Revision>;

    /// Whether the store can serve requests (the apiserver's `etcd` health check), else
    /// why not. Default: the current revision can be read.
    async fn check_health(&self) -> Result<()> {
        self.current_revision().await.map(|_| ())
    }

    /// `Some(why)` once the store can no longer write until it is reopened (the embedded
    /// store after a failed log write, fsync or checkpoint, a full disk among the causes):
    /// the process should exit so that its supervisor restarts it, which replays the log.
    fn needs_reopen(&self) -> Option<String> {
        None
    }

    /// Whether a live watch event carries the very `Bytes` its write was given (no copy, no
    /// transformation), so a reader of the events can recognise a value it wrote by its
    /// allocation. Default false.
    fn events_share_written_values(&self) -> bool {
        false
    }
}

/// Convenience wrappers over [`Store::txn`] for single-key writes.
#[async_trait]
pub trait StoreExt: Store {
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        match self.txn(vec![TxnOp::Create { key: key.into(), value }]).await?.pop() {
            Some(TxnResult::Put(kv)) => Ok(kv),
            other => unreachable!("create returned {other:?}"),
        }
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        match self.txn(vec![TxnOp::Update { key: key.into(), value, expected }]).await?.pop() {
            Some(TxnResult::Put(kv)) => Ok(kv),
            other => unreachable!("update returned {other:?}"),
        }
    }

    /// Delete `key`; returns the value it had.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue> {
        match self.txn(vec![TxnOp::Delete { key: key.into(), expected }]).await?.pop() {
            Some(TxnResult::Deleted(kv)) => Ok(kv),
            other => unreachable!("delete returned {other:?}"),
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

pub type DynStore = Arc<dyn Store>;
