//! The embedded default backend: one redb file, a group-committing writer thread, and watches
//! served from a history table with an in-memory fan-out of live changes.
//!
//! # Why redb (and not SQLite in WAL mode)
//! Both give ACID transactions with an fsync per commit. redb is pure Rust (no C toolchain,
//! no `unsafe` FFI boundary, no SQL text to build and parse on the hot path), stores typed
//! B-trees directly (the keys here are byte-ordered strings and integer revisions, exactly
//! what a B-tree range scan needs), commits with a single `fdatasync` (checksummed one-phase
//! commit: a torn commit is detected by its checksum and rolled back to the previous one on
//! open), and holds its page cache in a bounded user-space cache we size ourselves. SQLite
//! WAL would need its checkpointer tuned and a second fsync at checkpoint time; it buys
//! nothing here since the apiserver never queries anything but key ranges.
//!
//! # Data directory layout
//! `DIR/wal.log` and `DIR/wal.1.log`, the write-ahead log (see `store::wal`), and
//! `DIR/store.redb`, one redb database with four tables, which hold everything up to the
//! last checkpoint:
//! - `keys`: key (`&str`) → `create_revision: i64 LE | mod_revision: i64 LE`, every key's
//!   current state without its value;
//! - `history`: revision (`i64`) → the events of a run of revisions, values inline, stored
//!   under the last of them (see `codec::encode_run_into`); together they hold every revision
//!   contiguously from at most the compacted revision + 1 to the checkpoint;
//! - `values`: (revision, key) → the value `key` was given at `revision`, for the current
//!   values whose revision is compacted;
//! - `meta`: `"revision"` → the checkpoint's revision, `"compacted"` → compacted revision,
//!   `"checkpoint"` → the same revision (informational).
//!
//! A value is written once, in its revision's history record, and read from there while its
//! key is current: a key's entry names its mod revision, the record holding that revision is
//! the first one stored under it or after. Compaction copies the values still current out of
//! the revisions it drops into `values`. This is etcd's layout (values stored by revision, a
//! key index), with history records packing up to 64 KiB of revisions each: a checkpoint
//! appends its values in revision order, and what it rewrites in key order is the small `keys`
//! table, about sixty keys to a page. (A `kv` table of entries with their values, as earlier
//! versions kept, gave each pod a page of its own: every create rewrote a random page, read
//! back first when out of cache.) Reads of many keys (a list) read their values in revision
//! order, each record once. Stores written by earlier versions (values in a `kv` table,
//! history referring to them and to the displaced ones kept in `superseded`) are converted
//! when opened; their history keeps those references, resolved from `values`.

//! # Writes: group commit to a log, checkpoints to redb
//! [`Store::txn`] sends the transaction to one writer thread over a bounded channel. The writer
//! takes everything pending (up to [`EmbeddedConfig::max_batch`]) and applies the transactions
//! in arrival order to the *memtable*, the in-memory state of every key written since the
//! last checkpoint and the events of every revision since then (each successful transaction
//! gets its own revision; preconditions see the effects of earlier transactions of the same
//! batch; a failed precondition fails only that transaction and consumes no revision). It
//! appends the batch's events to the log, makes them durable with one `fdatasync`, publishes
//! the events, and only then answers every caller; what arrives meanwhile is the next batch.
//! Readers never return what is not durable yet: a read that sees a batch between its apply
//! and its fsync waits for that fsync, and watch catch-up reads history only up to the
//! durable revision.
//!
//! The fsync runs on the writer thread. An earlier design handed each batch to a syncer
//! thread and applied the next one while the fsync ran; on two cores, at 64 clients, the
//! hand-off cost more than the overlap gained: every batch woke two threads instead of one.
//! Doing both on one thread took the server's context switches per create from 1.3 to 0.75
//! and its futex calls from 0.66 to 0.2, with fewer fsyncs (larger batches: the callers
//! queue while the fsync runs), and the same rate at 1 and 4 clients.
//!
//! Every [`EmbeddedConfig::checkpoint_bytes`] of log (or [`EmbeddedConfig::checkpoint_interval`])
//! the writer freezes the memtable's active layer, starts the log's other file, and hands the
//! frozen layer to a checkpointer thread, which writes it to redb in one write transaction
//! committed with [`Durability::Immediate`] and then drops it; the writer goes on meanwhile
//! (one checkpoint at a time: a layer frozen while another is written would need a third log
//! file). Open replays whatever the log holds beyond redb's checkpoint. This is etcd's WAL +
//! bbolt split, except that etcd writes bbolt every 100 ms without an fsync, and this store
//! keeps the changes in memory until the checkpoint. Writing redb in every batch (even
//! without an fsync) kept the writer busy about twice as long per transaction, and each
//! batch's latency is what 64 waiting clients see; in two runs of 20 alternating pairs of
//! 20,000 pod creates (`skiff-bench compare`) this design gave 2% and 9% more creates/s.
//!
//! Reads merge the memtable's layers over a redb snapshot taken while the memtable is locked:
//! a checkpoint commits to redb before it drops its layer, so either snapshot a reader can
//! get, with the layers it sees, holds the same data.
//!
//! If the batch cannot be made durable, every transaction of it fails with
//! [`Error::Backend`] and no reader gets anything of it (the store then refuses all writes,
//! and every read that would include it, until it is reopened, since the memtable may hold
//! what the log does not). A compaction is durable at the next checkpoint; one lost in a
//! crash is simply redone later.
//!
//! # Watches
//! A watcher subscribes to the live fan-out (a tokio broadcast of committed batches) *before*
//! reading history, reads history (redb's, then the memtable's) from `after + 1` up to the
//! durable revision, then follows the live batches, skipping revisions it has already
//! delivered. Anything made durable after that read is broadcast after the subscription, so
//! there is no gap; the skip removes the overlap, so there is no duplicate. Each watcher runs
//! in its own task and hands events to its stream through a bounded channel: a slow consumer
//! only stalls its own task. Writers never wait for watchers: when a watcher falls more than
//! [`EmbeddedConfig::live_buffer`] batches behind the broadcast, it re-subscribes and re-reads
//! the missed revisions from history (the same catch-up as at start). Only if those have been
//! compacted in the meantime does the stream end, with [`Error::Compacted`]; the caller resumes
//! with a fresh list. When the store shuts down, open streams end with [`Error::Closed`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use super::wal::{Wal, WalTxn};
use super::{
    Error, Event, EventKind, KeyValue, ListResult, Result, Revision, Store, TxnOp, TxnResult,
};

/// The database file inside the data directory.
pub const DB_FILE: &str = "store.redb";
/// The write-ahead log's files inside the data directory.
pub use super::wal::WAL_FILES;

const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
const VALUES: TableDefinition<(i64, &str), &[u8]> = TableDefinition::new("values");
const HISTORY: TableDefinition<i64, &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// Earlier versions' tables, converted at open: `kv` held each key's entry with its value
/// (`create_revision | mod_revision | value`), `superseded` the displaced values `history`
/// refers to, under the same keys as `values`.
const LEGACY_KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const LEGACY_SUPERSEDED: TableDefinition<(i64, &str), &[u8]> = TableDefinition::new("superseded");
/// An empty table under `superseded`'s name and of another type: an earlier version opening
/// this store fails on it ("table type mismatch") before it replays the log into a `kv`
/// table it would believe empty.
const DOWNGRADE_GUARD: TableDefinition<u64, ()> = TableDefinition::new("superseded");
const META_REVISION: &str = "revision";
/// How long [`EmbeddedStore::close`] waits for the watch tasks of dropped streams to let go.
const RELEASE_WAIT: Duration = Duration::from_secs(2);
const META_COMPACTED: &str = "compacted";
/// The revision of the last checkpoint (informational).
const META_CHECKPOINT: &str = "checkpoint";

/// Tuning of the embedded store. Every default is chosen for one apiserver process on a small
/// node (the target is < 100 MB RSS for the whole server at 10k pods).
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// redb's page cache. Default 32 MiB: the apiserver keeps its own watch cache and serves
    /// most reads from it, so the store cache only needs the hot B-tree pages (redb's own
    /// default of 1 GiB would dominate the RSS budget).
    pub cache_size: usize,
    /// Most transactions committed by one fsync. Default 1024: large enough that the fsync
    /// (~3 ms on the CI VMs) is shared by every concurrent caller, small enough that a batch's
    /// log record stays a few MB.
    pub max_batch: usize,
    /// Transactions queued for the writer before `txn` callers wait (backpressure). Default
    /// 4096 (4 full batches).
    pub queue_depth: usize,
    /// Committed batches buffered for live watchers before a slow one must re-read history.
    /// Default 1024 batches. Values are released as soon as every watcher has seen them.
    pub live_buffer: usize,
    /// Events buffered between a watcher's task and its stream. Default 1024.
    pub watch_buffer: usize,
    /// Revisions read from history per read transaction while a watcher catches up (whole
    /// group commits, so up to `max_batch` more). Default 512: bounds the memory of a catch-up
    /// and keeps read snapshots short.
    pub history_chunk: usize,
    /// How long the writer waits for more transactions before committing, when the previous
    /// commit carried several (concurrent callers). Default 200 µs: about the time the callers
    /// of the previous batch need to send their next transaction; it lifts the batch size (and
    /// throughput) under load and costs nothing to a lone caller, whose batches are of one.
    pub linger: std::time::Duration,
    /// Log bytes after which the writer checkpoints (a durable redb commit). Default 8 MiB: the
    /// replay at open stays well under a second, and the memtable (which holds the same
    /// events, plus the keys' latest values, shared with the callers) stays that small.
    pub checkpoint_bytes: u64,
    /// Longest time between checkpoints while writes come in. Default 1 s (etcd's bbolt batch
    /// interval is 100 ms; a longer one writes each hot B-tree page less often).
    pub checkpoint_interval: std::time::Duration,
    /// Size each of the log's two files is preallocated to. Default 16 MiB (twice
    /// `checkpoint_bytes`, for the writes that go on while a checkpoint runs), so appends
    /// do not change the file size and an fsync writes no metadata.
    pub wal_prealloc: u64,
    /// Verify every page checksum when opening (redb `check_integrity_on_open`). Default true:
    /// a damaged file then fails to open with an error instead of panicking later; the cost is
    /// one sequential read of the file at start.
    pub verify_on_open: bool,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            cache_size: 32 << 20,
            max_batch: 1024,
            queue_depth: 4096,
            live_buffer: 1024,
            watch_buffer: 1024,
            history_chunk: 512,
            linger: std::time::Duration::from_micros(200),
            checkpoint_bytes: 8 << 20,
            checkpoint_interval: std::time::Duration::from_secs(1),
            wal_prealloc: 16 << 20,
            verify_on_open: true,
        }
    }
}

impl EmbeddedConfig {
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = bytes;
        self
    }
    pub fn max_batch(mut self, txns: usize) -> Self {
        self.max_batch = txns.max(1);
        self
    }
    pub fn queue_depth(mut self, txns: usize) -> Self {
        self.queue_depth = txns.max(1);
        self
    }
    pub fn live_buffer(mut self, batches: usize) -> Self {
        self.live_buffer = batches.max(1);
        self
    }
    pub fn watch_buffer(mut self, events: usize) -> Self {
        self.watch_buffer = events.max(1);
        self
    }
    pub fn history_chunk(mut self, revisions: usize) -> Self {
        self.history_chunk = revisions.max(1);
        self
    }
    pub fn linger(mut self, linger: std::time::Duration) -> Self {
        self.linger = linger;
        self
    }
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.checkpoint_bytes = bytes;
        self
    }
    pub fn checkpoint_interval(mut self, interval: std::time::Duration) -> Self {
        self.checkpoint_interval = interval;
        self
    }
    pub fn wal_prealloc(mut self, bytes: u64) -> Self {
        self.wal_prealloc = bytes;
        self
    }
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.verify_on_open = verify;
        self
    }
}

/// One committed transaction as fanned out to live watchers.
#[derive(Debug)]
struct CommittedTxn {
    revision: Revision,
    events: Vec<Event>,
}

/// All transactions of one commit, in revision order.
type LiveBatch = Arc<Vec<CommittedTxn>>;

/// What readers, watchers and the writer share.
struct Shared {
    db: Database,
    /// What redb does not hold yet (see [`Memtable`]).
    memtable: RwLock<Memtable>,
    /// Last durable revision (updated after the fsync, before callers are answered). The
    /// memtable holds a batch from its apply on, before its fsync: readers never return more
    /// than this (see [`Shared::wait_durable`]).
    revision: AtomicI64,
    compacted: AtomicI64,
    /// Why writes fail until the store is reopened, and whether the writer has stopped; the
    /// condvar wakes readers waiting for a revision to become durable.
    sync_state: Mutex<SyncState>,
    durable: Condvar,
    /// The live fan-out; `None` once the writer has stopped.
    live: Mutex<Option<broadcast::Sender<LiveBatch>>>,
    config: EmbeddedConfig,
    /// Successful commits (= fsyncs) and the transactions they carried.
    commits: AtomicU64,
    committed_txns: AtomicU64,
    /// Nanoseconds spent applying batches, and making them durable (see [`EmbeddedStats`]).
    apply_nanos: AtomicU64,
    commit_nanos: AtomicU64,
    checkpoints: AtomicU64,
}

/// Everything the writer applied since the last checkpoint. redb holds the revisions up to
/// `checkpoint`; the memtable holds the ones after it (also in the log, durable or about to
/// be), in two layers: the `frozen` one the checkpointer thread is writing to redb (while a
/// checkpoint runs) and the `active` one the writer applies new batches to.
///
/// Readers take a redb snapshot while they hold the lock, and the checkpointer drops the
/// frozen layer (under the write lock) only after its redb commit: any snapshot a reader can
/// get is either the one the layers' changes are relative to, or already has the frozen ones.
#[derive(Debug, Default)]
struct Memtable {
    active: Layer,
    frozen: Option<Arc<Layer>>,
    /// The revision redb holds everything up to.
    checkpoint: Revision,
    /// The last revision applied (may be ahead of the durable one, `Shared::revision`).
    revision: Revision,
    compacted: Revision,
}

/// The changes of a run of revisions.
#[derive(Debug, Default)]
struct Layer {
    /// The state of every key written (`None`: deleted).
    kv: BTreeMap<String, Option<Stored>>,
    /// The batches committed, in order (a compaction drops those wholly at or below it), as
    /// they were fanned out: the values are the callers' `Bytes`.
    history: Vec<LiveBatch>,
    /// Once frozen: the last revision and the compacted revision when it was frozen.
    revision: Revision,
    compacted: Revision,
}

impl Memtable {
    /// A key's state if written since the checkpoint (`Some(None)`: deleted).
    fn lookup(&self, key: &str) -> Option<&Option<Stored>> {
        self.active.kv.get(key).or_else(|| self.frozen.as_ref()?.kv.get(key))
    }

    /// The keys under `prefix` written since the checkpoint, in order, with their state.
    fn recent(&self, prefix: &str) -> Vec<(String, Option<Stored>)> {
        let under = |layer: &Layer| {
            layer
                .kv
                .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, state)| (key.clone(), state.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        let mut recent = self.frozen.as_deref().map(under).unwrap_or_default();
        recent.extend(under(&self.active));
        recent.into_iter().collect()
    }

    /// The batches committed since the checkpoint, in order.
    fn batches(&self) -> impl Iterator<Item = &LiveBatch> {
        let frozen = self.frozen.iter().flat_map(|layer| layer.history.iter());
        frozen.chain(self.active.history.iter())
    }
}

/// A key's state in the memtable.
#[derive(Debug, Clone)]
struct Stored {
    create_revision: Revision,
    mod_revision: Revision,
    value: Bytes,
}

impl Stored {
    /// Create revision, mod revision and value, as [`set_key`] takes them.
    fn state(&self) -> (Revision, Revision, &[u8]) {
        (self.create_revision, self.mod_revision, &self.value)
    }

    fn with_key(&self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: self.value.clone(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

#[derive(Default)]
struct SyncState {
    /// Set when the log and redb may disagree (a failed log write, fsync or commit in WAL
    /// mode): every later write fails until the store is reopened (which replays the log).
    poisoned: Option<String>,
    stopped: bool,
}

/// Counters of the writer since open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmbeddedStats {
    /// Group commits, each one fsync of the log.
    pub commits: u64,
    /// Checkpoints: durable redb commits of the memtable (one more fsync each).
    pub checkpoints: u64,
    /// Transactions committed (each got a revision).
    pub txns: u64,
    /// Time the writer spent applying batches to the memtable.
    pub apply: std::time::Duration,
    /// Time spent making batches durable (log append and fsync).
    pub commit: std::time::Duration,
}

impl Shared {
    fn subscribe(&self) -> Option<broadcast::Receiver<LiveBatch>> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.as_ref().map(broadcast::Sender::subscribe)
    }

    fn publish(&self, batch: LiveBatch) {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = live.as_ref() {
            // No receiver is not an error: nobody is watching.
            let _ = tx.send(batch);
        }
    }

    fn close_live(&self) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn sync_state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.sync_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn poisoned(&self) -> Option<String> {
        self.sync_state().poisoned.clone()
    }

    /// From now on every write fails (the first reason stays).
    fn poison(&self, reason: String) {
        let mut state = self.sync_state();
        if state.poisoned.is_none() {
            tracing::error!(%reason, "store poisoned: writes fail until it is reopened");
            state.poisoned = Some(reason);
        }
        self.durable.notify_all();
    }

    /// `revision` is durable: wake the readers waiting for it.
    fn made_durable(&self, revision: Revision) {
        let _state = self.sync_state();
        self.revision.store(revision, Ordering::Release);
        self.durable.notify_all();
    }

    /// Wait until everything up to `revision` is durable. A read snapshot can hold the batch
    /// whose log fsync is still running (the writer applies a batch before it syncs the log);
    /// what a reader returns must survive a crash, so it waits for that fsync (about one disk
    /// flush), and fails if the store is poisoned or stopped before.
    fn wait_durable(&self, revision: Revision) -> Result<()> {
        if self.revision.load(Ordering::Acquire) >= revision {
            return Ok(());
        }
        let mut state = self.sync_state();
        loop {
            if self.revision.load(Ordering::Acquire) >= revision {
                return Ok(());
            }
            if let Some(reason) = &state.poisoned {
                return Err(Error::backend("read", reason.clone()));
            }
            if state.stopped {
                return Err(Error::Closed);
            }
            state = match self.durable.wait_timeout(state, Duration::from_secs(1)) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    fn memtable(&self) -> RwLockReadGuard<'_, Memtable> {
        self.memtable.read().unwrap_or_else(|e| e.into_inner())
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction> {
        self.db.begin_read().map_err(|e| Error::backend("begin read", e))
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let memtable = self.memtable();
        let revision = memtable.revision;
        let found = match memtable.lookup(key) {
            Some(state) => state.as_ref().map(|stored| stored.with_key(key)),
            None => {
                let rtxn = self.begin_read()?;
                drop(memtable);
                Snapshot::open(&rtxn)?.get(key)?
            }
        };
        self.wait_durable(revision)?;
        Ok(found)
    }

    fn list(&self, prefix: &str) -> Result<ListResult> {
        let memtable = self.memtable();
        let revision = memtable.revision;
        let mut recent = memtable.recent(prefix).into_iter().peekable();
        let rtxn = self.begin_read()?;
        drop(memtable);
        let snapshot = Snapshot::open(&rtxn)?;
        let mut kvs = Vec::new();
        // The entries read from redb, whose values are read once all are known.
        let mut stored = Vec::new();
        fn take_recent(kvs: &mut Vec<KeyValue>, (key, state): (String, Option<Stored>)) {
            if let Some(stored) = state {
                kvs.push(stored.with_key(&key));
            }
        }
        let range = snapshot
            .keys
            .range(prefix..)
            .map_err(|e| Error::backend(format!("list {prefix}"), e))?;
        for entry in range {
            let (key, raw) = entry.map_err(|e| Error::backend(format!("list {prefix}"), e))?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            // Keys written since the checkpoint, in order, in place of redb's.
            while let Some(newer) = recent.next_if(|(recent, _)| recent.as_str() < key) {
                take_recent(&mut kvs, newer);
            }
            match recent.next_if(|(recent, _)| recent == key) {
                Some(newer) => take_recent(&mut kvs, newer),
                None => {
                    let (create_revision, mod_revision) = codec::decode_key(key, raw.value())?;
                    let value = Bytes::new(); // filled in below, in revision order
                    stored.push(kvs.len());
                    kvs.push(KeyValue {
                        key: key.to_owned(),
                        value,
                        create_revision,
                        mod_revision,
                    });
                }
            }
        }
        for newer in recent {
            take_recent(&mut kvs, newer);
        }
        snapshot.fill_values(&mut kvs, stored)?;
        self.wait_durable(revision)?;
        Ok(ListResult { kvs, revision })
    }

    /// Read durable revisions after `after` from one snapshot, until at least `history_chunk`
    /// revisions (or all there are): from redb's history up to its checkpoint, or else from the
    /// memtable.
    fn read_history(&self, prefix: &str, after: Revision) -> Result<HistoryChunk> {
        let memtable = self.memtable();
        // Only durable revisions: the rest come through the live fan-out once synced (the
        // watcher subscribed before this read, so it misses none of them).
        let current = memtable.revision.min(self.revision.load(Ordering::Acquire));
        let compacted = memtable.compacted;
        if after < compacted {
            return Err(Error::Compacted { requested: after, compacted });
        }
        if after > current {
            return Err(Error::FutureRevision { requested: after, current });
        }
        let chunk = self.config.history_chunk as Revision;
        if after >= memtable.checkpoint {
            let mut read = HistoryRead::new(prefix, after, current, chunk);
            let batches = memtable.batches();
            let batches =
                batches.skip_while(|batch| batch.last().is_none_or(|txn| txn.revision <= after));
            'batches: for batch in batches {
                for txn in batch.iter() {
                    let matching = |prefix: &str, out: &mut Vec<Event>| {
                        out.extend(
                            txn.events.iter().filter(|e| e.kv.key.starts_with(prefix)).cloned(),
                        );
                        Ok(())
                    };
                    if !read.take(txn.revision, matching)? {
                        break 'batches;
                    }
                }
            }
            return read.finish(current);
        }
        let rtxn = self.begin_read()?;
        drop(memtable);
        // redb's checkpoint can be past the memtable's seen above (a checkpoint committed in
        // between), and past the durable revision (it may hold a batch still being synced).
        let end = read_meta(&rtxn, META_REVISION)?.min(current);
        let mut read = HistoryRead::new(prefix, after, end, chunk);
        let history =
            rtxn.open_table(HISTORY).map_err(|e| Error::backend("open history table", e))?;
        let values = rtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?;
        // Records are stored under their last revision: the first one from `after + 1` on
        // holds `after + 1` (and may hold revisions up to `after`, skipped).
        let range = history.range((after + 1)..).map_err(|e| Error::backend("read history", e))?;
        'records: for entry in range {
            if read.full() {
                break;
            }
            let (record_last, raw) = entry.map_err(|e| Error::backend("read history", e))?;
            let record = Bytes::copy_from_slice(raw.value());
            for (revision, raw) in codec::split_batch(record_last.value(), record)? {
                let decode = |prefix: &str, out: &mut Vec<Event>| {
                    let mut stored = |key: &str| stored_value(&values, key, revision);
                    codec::decode_events_with(revision, raw, prefix, out, &mut stored)
                };
                if !read.take(revision, decode)? {
                    break 'records;
                }
            }
        }
        read.finish(current)
    }
}

/// The value `key` was given at `revision`, kept in `values`.
fn stored_value(
    values: &impl ReadableTable<(i64, &'static str), &'static [u8]>,
    key: &str,
    revision: Revision,
) -> Result<Bytes> {
    match values.get((revision, key)).map_err(|e| Error::backend("read values", e))? {
        Some(value) => Ok(Bytes::copy_from_slice(value.value())),
        None => Err(missing_value(key, revision)),
    }
}

fn missing_value(key: &str, revision: Revision) -> Error {
    Error::backend("read value", format!("the value of {key} at revision {revision} is missing"))
}

/// redb's keys as of one read transaction, with their values: a value written after the
/// compacted revision is read from its revision's history record, one at or below it (kept
/// because it is still current) from `values`.
struct Snapshot {
    keys: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    values: redb::ReadOnlyTable<(i64, &'static str), &'static [u8]>,
    history: redb::ReadOnlyTable<i64, &'static [u8]>,
    compacted: Revision,
}

impl Snapshot {
    fn open(rtxn: &redb::ReadTransaction) -> Result<Snapshot> {
        Ok(Snapshot {
            keys: rtxn.open_table(KEYS).map_err(|e| Error::backend("open keys table", e))?,
            values: rtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?,
            history: rtxn
                .open_table(HISTORY)
                .map_err(|e| Error::backend("open history table", e))?,
            compacted: read_meta(rtxn, META_COMPACTED)?,
        })
    }

    /// Whether `key` exists (without reading its value).
    fn contains(&self, key: &str) -> Result<bool> {
        let found = self.keys.get(key).map_err(|e| Error::backend(format!("get {key}"), e))?;
        Ok(found.is_some())
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let found = self.keys.get(key).map_err(|e| Error::backend(format!("get {key}"), e))?;
        let Some(entry) = found else { return Ok(None) };
        let (create_revision, mod_revision) = codec::decode_key(key, entry.value())?;
        let value = self.value(key, mod_revision)?;
        Ok(Some(KeyValue { key: key.to_owned(), value, create_revision, mod_revision }))
    }

    /// Fill in the values of the entries `read` of `kvs` (current states read from `keys`), in
    /// revision order: each history record is read from disk once (then from redb's cache).
    fn fill_values(&self, kvs: &mut [KeyValue], mut read: Vec<usize>) -> Result<()> {
        read.sort_unstable_by_key(|&i| kvs[i].mod_revision);
        for i in read {
            kvs[i].value = self.value(&kvs[i].key, kvs[i].mod_revision)?;
        }
        Ok(())
    }

    /// The value `key` was given at `revision`, its current one.
    fn value(&self, key: &str, revision: Revision) -> Result<Bytes> {
        if revision <= self.compacted {
            return stored_value(&self.values, key, revision);
        }
        // The record holding `revision` is the first one stored under it or after; only that
        // revision's events are copied out of it.
        let read = |e| Error::backend("read history", e);
        let found = self.history.range(revision..).map_err(read)?.next();
        let Some(found) = found else { return Err(missing_value(key, revision)) };
        let (last, record) = found.map_err(read)?;
        let record = record.value();
        let ranges = codec::batch_ranges(last.value(), record)?;
        let at = ranges.into_iter().find(|(r, _)| *r == revision);
        let Some((_, range)) = at else { return Err(missing_value(key, revision)) };
        let raw = Bytes::copy_from_slice(&record[range]);
        let mut events = Vec::new();
        let mut stored = |key: &str| stored_value(&self.values, key, revision);
        codec::decode_events_with(revision, raw, key, &mut events, &mut stored)?;
        let put = events.into_iter().find(|e| e.kind == EventKind::Put && e.kv.key == key);
        // A copy: a slice would keep the revision's other values (its prevs) in memory.
        put.map(|e| Bytes::copy_from_slice(&e.kv.value)).ok_or_else(|| missing_value(key, revision))
    }
}

/// One history read: the revisions after `after` up to `end`, contiguous, about `chunk` of
/// them at most, whether they come from redb's records or the memtable's batches.
struct HistoryRead<'p> {
    prefix: &'p str,
    after: Revision,
    end: Revision,
    chunk: Revision,
    /// The last revision taken.
    last: Revision,
    events: Vec<Event>,
}

impl<'p> HistoryRead<'p> {
    fn new(prefix: &'p str, after: Revision, end: Revision, chunk: Revision) -> Self {
        HistoryRead { prefix, after, end, chunk, last: after, events: Vec::new() }
    }

    /// Whether the read has what it can return.
    fn full(&self) -> bool {
        self.last >= self.end || self.last - self.after >= self.chunk
    }

    /// Take `revision`'s events (those under the prefix, appended by `events`) if it is the
    /// next one; revisions already taken are skipped. `false`: the read is full.
    fn take(
        &mut self,
        revision: Revision,
        events: impl FnOnce(&str, &mut Vec<Event>) -> Result<()>,
    ) -> Result<bool> {
        if revision <= self.last {
            return Ok(true);
        }
        if self.full() {
            return Ok(false);
        }
        if revision != self.last + 1 {
            return Err(Error::backend(
                "read history",
                format!("history has a gap: revision {revision} follows {}", self.last),
            ));
        }
        events(self.prefix, &mut self.events)?;
        self.last = revision;
        Ok(true)
    }

    /// The chunk read; a history that ended before the read was full has a gap.
    fn finish(self, current: Revision) -> Result<HistoryChunk> {
        if !self.full() {
            return Err(Error::backend(
                "read history",
                format!("history has a gap: revision {} is missing", self.last + 1),
            ));
        }
        Ok(HistoryChunk { events: self.events, last: self.last, caught_up: self.last == current })
    }
}

struct HistoryChunk {
    events: Vec<Event>,
    last: Revision,
    caught_up: bool,
}

/// Apply the logged transactions beyond redb's revision, in one durable commit. Returns how
/// many were applied.
fn replay(db: &Database, txns: &[WalTxn]) -> Result<usize> {
    let mut wtxn = db.begin_write().map_err(|e| Error::backend("begin replay", e))?;
    wtxn.set_durability(Durability::Immediate).map_err(|e| Error::backend("set durability", e))?;
    let mut applied = 0;
    {
        let mut keys = wtxn.open_table(KEYS).map_err(|e| Error::backend("open keys table", e))?;
        let mut values =
            wtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?;
        let mut history =
            wtxn.open_table(HISTORY).map_err(|e| Error::backend("open history table", e))?;
        let mut meta = wtxn.open_table(META).map_err(|e| Error::backend("open meta table", e))?;
        let mut revision = meta
            .get(META_REVISION)
            .map_err(|e| Error::backend("read meta revision", e))?
            .map(|v| v.value())
            .unwrap_or(0);
        let compacted = meta
            .get(META_COMPACTED)
            .map_err(|e| Error::backend("read meta compacted", e))?
            .map_or(0, |v| v.value());
        for txn in txns {
            if txn.revision <= revision {
                continue; // already in redb (logged before the last checkpoint)
            }
            if txn.revision != revision + 1 {
                // Records after a gap were never acknowledged: a batch is answered only once
                // it and every one before it are durable. (A batch logged to one file can
                // reach the disk while an earlier one in the other file did not.)
                tracing::warn!(
                    revision = txn.revision,
                    after = revision,
                    "write-ahead log has a gap; dropping the unacknowledged records after it"
                );
                break;
            }
            let mut events = Vec::new();
            codec::decode_events(txn.revision, txn.events.clone(), "", &mut events)?;
            for event in &events {
                let key = event.kv.key.as_str();
                let kv = &event.kv;
                let new = match event.kind {
                    EventKind::Put => Some((kv.create_revision, kv.mod_revision, &kv.value[..])),
                    EventKind::Delete => None,
                };
                set_key(&mut keys, &mut values, key, new, compacted)
                    .map_err(|e| Error::backend(format!("replay {key}"), e))?;
            }
            history
                .insert(txn.revision, &txn.events[..])
                .map_err(|e| Error::backend("replay history", e))?;
            revision = txn.revision;
            applied += 1;
        }
        meta.insert(META_REVISION, revision).map_err(|e| Error::backend("write meta", e))?;
    }
    wtxn.commit().map_err(|e| Error::backend("commit replay", e))?;
    Ok(applied)
}

fn read_meta(rtxn: &redb::ReadTransaction, name: &str) -> Result<Revision> {
    let meta = rtxn.open_table(META).map_err(|e| Error::backend("open meta table", e))?;
    let value = meta.get(name).map_err(|e| Error::backend(format!("read meta {name}"), e))?;
    Ok(value.map(|v| v.value()).unwrap_or(0))
}

enum Request {
    Txn { ops: Vec<TxnOp>, reply: oneshot::Sender<Result<Vec<TxnResult>>> },
    Compact { revision: Revision, reply: oneshot::Sender<Result<()>> },
}

/// The embedded store. Dropping it (or calling [`EmbeddedStore::close`]) stops the writer
/// after the queued transactions; open watch streams then end with [`Error::Closed`].
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
    writer: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .field("revision", &self.shared.revision.load(Ordering::Acquire))
            .finish()
    }
}

impl EmbeddedStore {
    /// Open (creating if needed) the store in `dir` with the default [`EmbeddedConfig`].
    pub fn open(dir: &Path) -> Result<EmbeddedStore> {
        Self::open_with(dir, EmbeddedConfig::default())
    }

    /// Open (creating if needed) the store in `dir`. Recovers from a crash: a commit that was
    /// not completely written is rolled back, so exactly the acknowledged writes remain.
    pub fn open_with(dir: &Path, config: EmbeddedConfig) -> Result<EmbeddedStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::backend(format!("create data dir {}", dir.display()), e))?;
        let path = dir.join(DB_FILE);
        let _span = tracing::info_span!("store.open", path = %path.display()).entered();
        let mut builder = redb::Builder::new();
        builder.set_cache_size(config.cache_size);
        builder.set_check_integrity_on_open(config.verify_on_open);
        let db = builder
            .create(&path)
            .map_err(|e| Error::backend(format!("open {}", path.display()), e))?;

        // Make sure the tables exist.
        let mut wtxn = db.begin_write().map_err(|e| Error::backend("begin write", e))?;
        wtxn.set_durability(Durability::Immediate)
            .map_err(|e| Error::backend("set durability", e))?;
        {
            wtxn.open_table(META).map_err(|e| Error::backend("open meta table", e))?;
            wtxn.open_table(KEYS).map_err(|e| Error::backend("open keys table", e))?;
            wtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?;
            wtxn.open_table(HISTORY).map_err(|e| Error::backend("open history table", e))?;
        }
        convert_legacy_tables(&wtxn)?;
        wtxn.commit().map_err(|e| Error::backend("commit table creation", e))?;

        // Replay what the write-ahead log holds beyond redb's last durable commit.
        let (mut wal, txns) = Wal::open(dir, config.wal_prealloc)?;
        let replayed = replay(&db, &txns)?;
        wal.clear()?;
        if replayed > 0 {
            tracing::info!(replayed, "replayed write-ahead log");
        }

        // Read where we are, and check the tables agree.
        let rtxn = db.begin_read().map_err(|e| Error::backend("begin read", e))?;
        let (revision, compacted) = {
            let meta = rtxn.open_table(META).map_err(|e| Error::backend("open meta table", e))?;
            let history =
                rtxn.open_table(HISTORY).map_err(|e| Error::backend("open history table", e))?;
            let get = |name: &str| -> Result<Revision> {
                let value =
                    meta.get(name).map_err(|e| Error::backend(format!("read meta {name}"), e))?;
                Ok(value.map(|v| v.value()).unwrap_or(0))
            };
            let (revision, compacted) = (get(META_REVISION)?, get(META_COMPACTED)?);
            let last = history
                .last()
                .map_err(|e| Error::backend("read history", e))?
                .map(|(rev, _)| rev.value());
            let consistent = match last {
                Some(last) => last == revision && compacted < revision,
                None => compacted == revision,
            };
            if !consistent || compacted > revision || revision < 0 {
                return Err(Error::backend(
                    "verify store",
                    format!(
                        "inconsistent store: revision {revision}, compacted {compacted}, last history \
                         entry {last:?}"
                    ),
                ));
            }
            (revision, compacted)
        };
        drop(rtxn);
        tracing::info!(revision, compacted, "store opened");

        let (live, _) = broadcast::channel(config.live_buffer.max(1));
        let shared = Arc::new(Shared {
            db,
            memtable: RwLock::new(Memtable {
                checkpoint: revision,
                revision,
                compacted,
                ..Memtable::default()
            }),
            revision: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            live: Mutex::new(Some(live)),
            sync_state: Mutex::new(SyncState::default()),
            durable: Condvar::new(),
            config: config.clone(),
            commits: AtomicU64::new(0),
            committed_txns: AtomicU64::new(0),
            apply_nanos: AtomicU64::new(0),
            commit_nanos: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
        });
        let (requests, rx) = mpsc::channel(config.queue_depth.max(1));
        let (to_checkpointer, layers) = std::sync::mpsc::channel();
        let checkpointer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("skiff-store-ckpt".into())
                .spawn(move || run_checkpointer(shared, layers))
                .map_err(|e| Error::backend("spawn checkpointer thread", e))?
        };
        let writer = Writer {
            shared: shared.clone(),
            requests: rx,
            to_checkpointer: Some(to_checkpointer),
            checkpointer: Some(checkpointer),
            revision,
            compacted,
            frozen_compaction: compacted,
            snapshot: None,
            max_batch: config.max_batch.max(1),
            linger: config.linger,
            wal,
            checkpoint_bytes: config.checkpoint_bytes,
            checkpoint_interval: config.checkpoint_interval,
            last_checkpoint: Instant::now(),
        };
        let writer = std::thread::Builder::new()
            .name("skiff-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| Error::backend("spawn writer thread", e))?;
        Ok(EmbeddedStore { shared, requests, writer: Some(writer), path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writer counters since open (commits are fsyncs).
    pub fn stats(&self) -> EmbeddedStats {
        EmbeddedStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            txns: self.shared.committed_txns.load(Ordering::Relaxed),
            checkpoints: self.shared.checkpoints.load(Ordering::Relaxed),
            apply: std::time::Duration::from_nanos(self.shared.apply_nanos.load(Ordering::Relaxed)),
            commit: std::time::Duration::from_nanos(
                self.shared.commit_nanos.load(Ordering::Relaxed),
            ),
        }
    }

    /// Stop the writer after the queued transactions and wait for it. The file is released once
    /// the last watch stream of this store has ended too: the streams end once drained, since
    /// the writer closes the live fan-out, and `close` waits up to [`RELEASE_WAIT`] for that
    /// (a stream still held and not read keeps the file open until it is dropped).
    pub async fn close(mut self) -> Result<()> {
        let writer = self.writer.take();
        let shared = self.shared.clone();
        drop(self);
        if let Some(writer) = writer {
            tokio::task::spawn_blocking(move || writer.join())
                .await
                .map_err(|e| Error::backend("join writer thread", e))?
                .map_err(|_| Error::backend("join writer thread", "writer thread panicked"))?;
        }
        // Watch tasks (and their history reads) let go of the store when they next run.
        let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
        while Arc::strong_count(&shared) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Dropped here when this is the last holder, so the file is closed when `close`
        // returns: redb writes its allocator state as it closes, which takes a moment.
        tokio::task::spawn_blocking(move || drop(shared))
            .await
            .map_err(|e| Error::backend("close the database", e))?;
        Ok(())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| Error::backend("read task", e))?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    /// Live events hand on the transaction's `Bytes` (history read back from disk does not).
    fn events_share_written_values(&self) -> bool {
        true
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_owned();
        self.blocking(move |s| s.get(&key)).await
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let prefix = prefix.to_owned();
        self.blocking(move |s| s.list(&prefix)).await
    }

    async fn txn(&self, ops: Vec<TxnOp>) -> Result<Vec<TxnResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        super::check_distinct_keys(&ops)?;
        super::check_request_size(&ops)?;
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request::Txn { ops, reply }).await.map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.shared.revision.load(Ordering::Acquire))
    }

    fn needs_reopen(&self) -> Option<String> {
        self.shared.poisoned()
    }

    /// Unhealthy once poisoned (writes fail until the store is reopened) or closed.
    async fn check_health(&self) -> Result<()> {
        if let Some(reason) = self.shared.poisoned() {
            return Err(Error::backend("the embedded store is poisoned", reason));
        }
        if self.requests.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let after = after.max(0);
        let current = self.shared.revision.load(Ordering::Acquire);
        let compacted = self.shared.compacted.load(Ordering::Acquire);
        if after > current {
            return Ok(fail(Error::FutureRevision { requested: after, current }));
        }
        if after < compacted {
            return Ok(fail(Error::Compacted { requested: after, compacted }));
        }
        // Subscribe before the history is read: see the module docs.
        let Some(live) = self.shared.subscribe() else {
            return Ok(fail(Error::Closed));
        };
        let (tx, rx) = mpsc::channel(self.shared.config.watch_buffer.max(1));
        let watcher =
            Watcher { shared: self.shared.clone(), prefix: prefix.to_owned(), last: after, tx };
        tokio::spawn(watcher.run(live));
        Ok(ReceiverStream::new(rx).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Compact { revision, reply })
            .await
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.shared.compacted.load(Ordering::Acquire))
    }
}

fn fail(error: Error) -> BoxStream<'static, Result<Event>> {
    stream::once(async move { Err(error) }).boxed()
}

/// One watch stream's task.
struct Watcher {
    shared: Arc<Shared>,
    prefix: String,
    /// The last revision delivered (or known to have nothing under `prefix`).
    last: Revision,
    tx: mpsc::Sender<Result<Event>>,
}

/// Why a watcher stops following the live fan-out.
enum LiveEnd {
    /// The stream was dropped.
    Dropped,
    /// Fell behind (or saw a revision gap): catch up from history again.
    Resync,
}

impl Watcher {
    async fn run(mut self, mut live: broadcast::Receiver<LiveBatch>) {
        loop {
            if let Err(error) = self.catch_up().await {
                if let Some(error) = error {
                    let _ = self.tx.send(Err(error)).await;
                }
                return;
            }
            match self.follow(&mut live).await {
                Ok(LiveEnd::Dropped) => return,
                Ok(LiveEnd::Resync) => {
                    // Subscribe again before re-reading history (no gap).
                    match self.shared.subscribe() {
                        Some(fresh) => live = fresh,
                        None => {
                            let _ = self.tx.send(Err(Error::Closed)).await;
                            return;
                        }
                    }
                }
                Err(error) => {
                    let _ = self.tx.send(Err(error)).await;
                    return;
                }
            }
        }
    }

    /// Deliver history after `self.last` up to a recent snapshot. `Err(None)`: stream dropped.
    async fn catch_up(&mut self) -> Result<(), Option<Error>> {
        loop {
            let shared = self.shared.clone();
            let (prefix, after) = (self.prefix.clone(), self.last);
            let chunk = tokio::task::spawn_blocking(move || shared.read_history(&prefix, after))
                .await
                .map_err(|e| Some(Error::backend("history read task", e)))?
                .map_err(Some)?;
            for event in chunk.events {
                self.tx.send(Ok(event)).await.map_err(|_| None)?;
            }
            self.last = chunk.last;
            if chunk.caught_up {
                return Ok(());
            }
        }
    }

    async fn follow(&mut self, live: &mut broadcast::Receiver<LiveBatch>) -> Result<LiveEnd> {
        loop {
            let batch = tokio::select! {
                _ = self.tx.closed() => return Ok(LiveEnd::Dropped),
                batch = live.recv() => batch,
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(prefix = %self.prefix, missed, last = self.last,
                        "watcher lagged behind the live fan-out; re-reading history");
                    return Ok(LiveEnd::Resync);
                }
                Err(broadcast::error::RecvError::Closed) => return Err(Error::Closed),
            };
            for txn in batch.iter() {
                if txn.revision <= self.last {
                    continue;
                }
                if txn.revision != self.last + 1 {
                    tracing::warn!(
                        revision = txn.revision,
                        last = self.last,
                        "watcher saw a revision gap in the live fan-out; re-reading history"
                    );
                    return Ok(LiveEnd::Resync);
                }
                for event in txn.events.iter().filter(|e| e.kv.key.starts_with(&self.prefix)) {
                    if self.tx.send(Ok(event.clone())).await.is_err() {
                        return Ok(LiveEnd::Dropped);
                    }
                }
                self.last = txn.revision;
            }
        }
    }
}

/// Most revisions in one `history` record written by a checkpoint (a watcher catching up from
/// redb reads whole records).
const CHECKPOINT_RECORD_REVISIONS: usize = 256;

/// The size a checkpoint fills each `history` record up to (unless one revision alone is
/// bigger). redb stores a value bigger than a page in a power-of-two run of pages and writes
/// all of it, so records just under 64 KiB (the margin is for redb's leaf header) fill their
/// pages. A fixed 64 revisions of pods (~150 KB) took 256 KiB runs: the history written at
/// checkpoints was 1.8 times its events.
const CHECKPOINT_RECORD_BYTES: usize = (64 << 10) - 512;

/// Cut `txns` into the runs a checkpoint stores one `history` record each: as many revisions
/// as fit [`CHECKPOINT_RECORD_BYTES`], at most [`CHECKPOINT_RECORD_REVISIONS`], at least one.
fn record_runs<'t>(txns: &'t [&'t CommittedTxn]) -> Vec<&'t [&'t CommittedTxn]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, codec::RUN_HEADER_LEN);
    for (i, txn) in txns.iter().enumerate() {
        let len = codec::run_entry_len(txn);
        let full =
            bytes + len > CHECKPOINT_RECORD_BYTES || i - start == CHECKPOINT_RECORD_REVISIONS;
        if i > start && full {
            runs.push(&txns[start..i]);
            (start, bytes) = (i, codec::RUN_HEADER_LEN);
        }
        bytes += len;
    }
    if start < txns.len() {
        runs.push(&txns[start..]);
    }
    runs
}

/// The writer thread: the only place that writes to the memtable and the log. It applies a
/// batch to the memtable, writes its log record, fsyncs the log, and answers the batch's
/// callers; the transactions sent meanwhile wait in the channel and make the next batch.
/// When a checkpoint is due it freezes the memtable's active layer for the checkpointer
/// thread, which writes it to redb while the writer goes on.
struct Writer {
    shared: Arc<Shared>,
    requests: mpsc::Receiver<Request>,
    to_checkpointer: Option<std::sync::mpsc::Sender<Arc<Layer>>>,
    checkpointer: Option<std::thread::JoinHandle<()>>,
    /// The last revision applied (may be ahead of the durable `shared.revision`).
    revision: Revision,
    compacted: Revision,
    /// The compacted revision when the memtable was last frozen.
    frozen_compaction: Revision,
    /// redb's keys and values as of checkpoint `.0`, for the keys the memtable does not hold
    /// (opened on first use after each checkpoint).
    snapshot: Option<(Revision, Snapshot)>,
    max_batch: usize,
    linger: std::time::Duration,
    wal: Wal,
    checkpoint_bytes: u64,
    checkpoint_interval: std::time::Duration,
    last_checkpoint: Instant,
}

/// Answer every request of `batch` with the failure `reason`.
fn fail_batch(batch: Vec<Request>, reason: &str) {
    for request in batch {
        let error = || Error::backend("commit batch", reason.to_string());
        match request {
            Request::Txn { reply, .. } => {
                let _ = reply.send(Err(error()));
            }
            Request::Compact { reply, .. } => {
                let _ = reply.send(Err(error()));
            }
        }
    }
}

enum Outcome {
    Txn(Result<Vec<TxnResult>>),
    Compact(Result<()>),
}

/// A batch applied to the memtable: what its callers are answered, and its events.
struct Staged {
    outcomes: Vec<Outcome>,
    committed: LiveBatch,
    revision: Revision,
    compacted: Revision,
}

impl Writer {
    fn run(mut self) {
        let _span = tracing::info_span!("store.writer").entered();
        let mut last_batch = 1;
        while let Some(first) = self.requests.blocking_recv() {
            let mut batch = Vec::with_capacity(last_batch.max(64));
            batch.push(first);
            self.gather(&mut batch, last_batch);
            last_batch = batch.len();
            self.commit_batch(batch);
        }
        // The running checkpoint ends, then the rest is checkpointed here.
        drop(self.to_checkpointer.take());
        if let Some(checkpointer) = self.checkpointer.take()
            && checkpointer.join().is_err()
        {
            tracing::error!("store checkpointer thread panicked");
        }
        if self.dirty() && self.shared.poisoned().is_none() {
            let layer = self.freeze();
            if let Err(error) = checkpoint(&self.shared, &layer) {
                tracing::warn!(%error, "final checkpoint failed; the log is replayed at next open");
            }
        }
        self.shared.sync_state().stopped = true;
        self.shared.durable.notify_all();
        self.shared.close_live();
        tracing::info!(revision = self.revision, "store writer stopped");
    }

    /// Whether the memtable's active layer holds anything redb does not.
    fn dirty(&self) -> bool {
        self.wal.len() > 0 || self.compacted != self.frozen_compaction
    }

    /// Hand the active layer to the checkpointer when due and no checkpoint is running (else
    /// the layer grows until the running one ends).
    fn maybe_checkpoint(&mut self) {
        let due = self.wal.len() >= self.checkpoint_bytes
            || (self.dirty() && self.last_checkpoint.elapsed() >= self.checkpoint_interval);
        if !due || self.shared.memtable().frozen.is_some() {
            return;
        }
        let layer = self.freeze();
        self.last_checkpoint = Instant::now();
        let sent = match self.to_checkpointer.as_ref() {
            Some(tx) => tx.send(layer).is_ok(),
            None => false,
        };
        if !sent {
            // Only if the checkpointer thread died: the frozen layer would stay for good.
            self.shared.poison("the store checkpointer thread stopped".into());
        }
    }

    /// Make the active layer the frozen one (no checkpoint may be running) and start the
    /// other log file: the frozen layer's records stay intact in this one until its
    /// checkpoint has committed, and the other one's were all covered by the last checkpoint.
    fn freeze(&mut self) -> Arc<Layer> {
        self.wal.switch();
        self.frozen_compaction = self.compacted;
        let mut memtable = self.shared.memtable.write().unwrap_or_else(|e| e.into_inner());
        debug_assert!(memtable.frozen.is_none(), "one checkpoint at a time");
        let mut layer = std::mem::take(&mut memtable.active);
        layer.revision = memtable.revision;
        layer.compacted = memtable.compacted;
        let layer = Arc::new(layer);
        memtable.frozen = Some(layer.clone());
        layer
    }

    /// Take what is pending. Under concurrency (the previous batch had several transactions),
    /// wait up to `linger` for as many as last time: the callers just answered are about to
    /// send their next transaction, and one larger commit is cheaper than two.
    fn gather(&mut self, batch: &mut Vec<Request>, last_batch: usize) {
        let deadline = Instant::now() + self.linger;
        let linger = last_batch > 1 && !self.linger.is_zero();
        while batch.len() < self.max_batch {
            match self.requests.try_recv() {
                Ok(request) => batch.push(request),
                Err(mpsc::error::TryRecvError::Empty)
                    if linger && batch.len() < last_batch && Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                Err(_) => break,
            }
        }
    }

    fn commit_batch(&mut self, batch: Vec<Request>) {
        let span = tracing::debug_span!(
            "store.commit",
            txns = batch.len(),
            first_revision = self.revision + 1,
            last_revision = tracing::field::Empty,
        );
        let _entered = span.enter();
        let started = Instant::now();
        let outcome = match self.shared.poisoned() {
            Some(reason) => Err(Error::backend("store writer", reason)),
            None => self.apply_and_log(&batch),
        };
        match outcome {
            Ok(staged) => {
                span.record("last_revision", staged.revision);
                tracing::trace!(elapsed_us = started.elapsed().as_micros() as u64, "committed");
                self.revision = staged.revision;
                self.compacted = staged.compacted;
                self.finish(batch, staged);
                self.maybe_checkpoint();
            }
            Err(error) => {
                tracing::error!(error = %error, "store commit failed; failing the whole batch");
                fail_batch(batch, &error.to_string());
            }
        }
    }

    /// Apply `batch` to the memtable, append it to the log and fsync the log. A failure
    /// part-way leaves the memtable holding what no durable log record has: it poisons the
    /// store.
    fn apply_and_log(&mut self, batch: &[Request]) -> Result<Staged> {
        let started = Instant::now();
        let mut staged = Staged {
            outcomes: Vec::with_capacity(batch.len()),
            committed: LiveBatch::default(),
            revision: self.revision,
            compacted: self.compacted,
        };
        if let Err(error) = self.apply(batch, &mut staged) {
            self.shared.poison(format!("applying a batch failed: {error}"));
            return Err(error);
        }
        let applied = Instant::now();
        if !staged.committed.is_empty() {
            let encode = |txn: &CommittedTxn, out: &mut Vec<u8>| {
                codec::encode_events_into(out, &txn.events);
                txn.revision
            };
            self.wal.write(&staged.committed, encode).inspect_err(|error| {
                self.shared.poison(format!("write-ahead log append failed: {error}"));
            })?;
            self.wal.sync().inspect_err(|error| {
                self.shared.poison(format!("write-ahead log fsync failed: {error}"));
            })?;
        }
        self.shared.apply_nanos.fetch_add((applied - started).as_nanos() as u64, Ordering::Relaxed);
        self.shared.commit_nanos.fetch_add(applied.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(staged)
    }

    /// `staged` is durable: publish its events, then answer its callers.
    fn finish(&self, batch: Vec<Request>, staged: Staged) {
        // Visible to readers of the atomics before any caller hears of its write.
        self.shared.compacted.store(staged.compacted, Ordering::Release);
        self.shared.made_durable(staged.revision);
        self.shared.committed_txns.fetch_add(staged.committed.len() as u64, Ordering::Relaxed);
        if !staged.committed.is_empty() {
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
            self.shared.publish(staged.committed);
        }
        for (request, outcome) in batch.into_iter().zip(staged.outcomes) {
            match (request, outcome) {
                (Request::Txn { reply, .. }, Outcome::Txn(result)) => {
                    let _ = reply.send(result);
                }
                (Request::Compact { reply, .. }, Outcome::Compact(result)) => {
                    let _ = reply.send(result);
                }
                _ => unreachable!("outcomes are built in request order"),
            }
        }
    }

    fn apply(&mut self, batch: &[Request], staged: &mut Staged) -> Result<()> {
        let shared = self.shared.clone();
        let mut memtable = shared.memtable.write().unwrap_or_else(|e| e.into_inner());
        // A snapshot from before the last checkpoint misses what the frozen layer held.
        if self.snapshot.as_ref().is_none_or(|(at, _)| *at != memtable.checkpoint) {
            self.snapshot = None;
            let rtxn = self.shared.begin_read()?;
            self.snapshot = Some((memtable.checkpoint, Snapshot::open(&rtxn)?));
        }
        let (_, snapshot) = self.snapshot.as_ref().expect("opened above");
        let mut committed = Vec::new();
        for request in batch {
            match request {
                Request::Txn { ops, .. } => {
                    let revision = staged.revision + 1;
                    match apply_txn(&mut memtable, snapshot, revision, ops)? {
                        Ok((results, events)) => {
                            memtable.revision = revision;
                            staged.revision = revision;
                            committed.push(CommittedTxn { revision, events });
                            staged.outcomes.push(Outcome::Txn(Ok(results)));
                        }
                        Err(failed) => staged.outcomes.push(Outcome::Txn(Err(failed))),
                    }
                }
                Request::Compact { revision, .. } => {
                    let target = *revision;
                    let outcome = if target > staged.revision {
                        Err(Error::FutureRevision { requested: target, current: staged.revision })
                    } else if target <= staged.compacted {
                        Ok(())
                    } else {
                        // The frozen layer's history goes when its checkpoint ends; redb's is
                        // trimmed at the next checkpoint.
                        let history = &mut memtable.active.history;
                        let gone = history.partition_point(|batch| {
                            batch.last().is_none_or(|txn| txn.revision <= target)
                        });
                        history.drain(..gone);
                        memtable.compacted = target;
                        staged.compacted = target;
                        tracing::info!(revision = target, "compacted history");
                        Ok(())
                    };
                    staged.outcomes.push(Outcome::Compact(outcome));
                }
            }
        }
        if !committed.is_empty() {
            staged.committed = Arc::new(committed);
            memtable.active.history.push(staged.committed.clone());
        }
        Ok(())
    }
}

/// Write `key`'s new state (`None`: deleted; else create revision, mod revision and value)
/// to `keys`. Its value is in the history record of its revision, written with it, unless
/// that revision is compacted already (its put went with the memtable's history): then it
/// is kept in `values`. The value it displaces leaves `values` if its revision is compacted
/// (else compaction drops it later: an earlier version's history may refer to it).
fn set_key(
    keys: &mut redb::Table<&str, &[u8]>,
    values: &mut redb::Table<(i64, &str), &[u8]>,
    key: &str,
    new: Option<(Revision, Revision, &[u8])>,
    compacted: Revision,
) -> Result<()> {
    let old = match new {
        Some((create_revision, mod_revision, _)) => {
            keys.insert(key, &codec::encode_key(create_revision, mod_revision)[..])
        }
        None => keys.remove(key),
    }
    .map_err(|e| Error::backend("write keys", e))?
    .map(|old| codec::decode_key(key, old.value()))
    .transpose()?;
    if let Some((_, mod_revision, value)) = new
        && mod_revision <= compacted
    {
        values.insert((mod_revision, key), value).map_err(|e| Error::backend("write value", e))?;
    }
    if let Some((_, displaced)) = old
        && displaced <= compacted
        && new.is_none_or(|(_, mod_revision, _)| mod_revision != displaced)
    {
        values.remove((displaced, key)).map_err(|e| Error::backend("drop value", e))?;
    }
    Ok(())
}

/// Copy into `values` the values history holds inline for the revisions after `from` up to
/// `to` that are still their keys' current ones: compaction is about to drop those revisions.
fn keep_current_values(
    history: &redb::Table<i64, &[u8]>,
    keys: &redb::Table<&str, &[u8]>,
    values: &mut redb::Table<(i64, &str), &[u8]>,
    from: Revision,
    to: Revision,
) -> Result<()> {
    let read = |e| Error::backend("read history", e);
    for entry in history.range((from + 1)..).map_err(read)? {
        let (last, raw) = entry.map_err(read)?;
        let record = Bytes::copy_from_slice(raw.value());
        for (revision, raw) in codec::split_batch(last.value(), record)? {
            if revision <= from {
                continue;
            }
            if revision > to {
                return Ok(());
            }
            // A put an earlier version stored by reference has its value in `values` already.
            let mut by_reference = Vec::new();
            let mut events = Vec::new();
            codec::decode_events_with(revision, raw, "", &mut events, &mut |key| {
                by_reference.push(key.to_owned());
                Ok(Bytes::new())
            })?;
            for event in events.iter().filter(|e| e.kind == EventKind::Put) {
                let key = event.kv.key.as_str();
                if by_reference.iter().any(|k| k == key) {
                    continue;
                }
                let current = keys.get(key).map_err(|e| Error::backend(format!("get {key}"), e))?;
                let current = current.map(|raw| codec::decode_key(key, raw.value())).transpose()?;
                if current.is_some_and(|(_, at)| at == revision) {
                    values
                        .insert((revision, key), &event.kv.value[..])
                        .map_err(|e| Error::backend("keep a current value", e))?;
                }
            }
        }
    }
    Ok(())
}

/// Convert the tables of a store written by an earlier version (each value inline in its
/// `kv` entry, displaced ones in `superseded`) into `keys` and `values`, and drop them; then
/// make sure the [`DOWNGRADE_GUARD`] is there.
fn convert_legacy_tables(wtxn: &redb::WriteTransaction) -> Result<()> {
    let tables: Vec<String> = wtxn
        .list_tables()
        .map_err(|e| Error::backend("list tables", e))?
        .map(|table| table.name().to_string())
        .collect();
    let has = |definition: &dyn TableHandle| tables.iter().any(|name| name == definition.name());
    let has_kv = has(&LEGACY_KV);
    // Under that name is either an earlier version's table or this version's guard.
    let has_superseded = has(&LEGACY_SUPERSEDED)
        && match wtxn.open_table(LEGACY_SUPERSEDED) {
            Ok(_) => true,
            Err(redb::TableError::TableTypeMismatch { .. }) => false,
            Err(e) => return Err(Error::backend("open the superseded table", e)),
        };
    if !has_kv && !has_superseded {
        wtxn.open_table(DOWNGRADE_GUARD).map_err(|e| Error::backend("open the guard table", e))?;
        return Ok(());
    }
    let mut converted = 0usize;
    {
        let mut keys = wtxn.open_table(KEYS).map_err(|e| Error::backend("open keys table", e))?;
        let mut values =
            wtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?;
        let convert = |e: redb::StorageError| Error::backend("convert the kv table", e);
        if has_kv {
            let kv =
                wtxn.open_table(LEGACY_KV).map_err(|e| Error::backend("open the kv table", e))?;
            for entry in kv.iter().map_err(convert)? {
                let (key, raw) = entry.map_err(convert)?;
                let (key, raw) = (key.value(), raw.value());
                let (mod_revision, value) = codec::kv_value(key, raw)?;
                let create_revision = i64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
                keys.insert(key, &codec::encode_key(create_revision, mod_revision)[..])
                    .map_err(convert)?;
                values.insert((mod_revision, key), value).map_err(convert)?;
                converted += 1;
            }
        }
        if has_superseded {
            let convert = |e: redb::StorageError| Error::backend("convert the superseded table", e);
            let superseded = wtxn
                .open_table(LEGACY_SUPERSEDED)
                .map_err(|e| Error::backend("open the superseded table", e))?;
            for entry in superseded.iter().map_err(convert)? {
                let (at, value) = entry.map_err(convert)?;
                values.insert(at.value(), value.value()).map_err(convert)?;
            }
        }
    }
    let dropped = |e| Error::backend("drop the converted tables", e);
    wtxn.delete_table(LEGACY_KV).map_err(dropped)?;
    if has_superseded {
        wtxn.delete_table(LEGACY_SUPERSEDED).map_err(dropped)?;
    }
    wtxn.open_table(DOWNGRADE_GUARD).map_err(|e| Error::backend("open the guard table", e))?;
    tracing::info!(keys = converted, "converted the store's tables to keys and values");
    Ok(())
}

/// The checkpointer thread: writes each frozen layer to redb, then drops it from the memtable.
/// A failed checkpoint poisons the store (the layer stays in memory and the log until the
/// store is reopened, which replays the log).
fn run_checkpointer(shared: Arc<Shared>, layers: std::sync::mpsc::Receiver<Arc<Layer>>) {
    let _span = tracing::info_span!("store.checkpointer").entered();
    for layer in layers {
        if let Err(error) = checkpoint(&shared, &layer) {
            shared.poison(format!("checkpoint failed: {error}"));
        }
    }
}

/// Write `layer` (the frozen one) to redb in one durable commit, then drop it from the
/// memtable.
fn checkpoint(shared: &Shared, layer: &Layer) -> Result<()> {
    let started = Instant::now();
    let mut wtxn = shared.db.begin_write().map_err(|e| Error::backend("begin checkpoint", e))?;
    wtxn.set_durability(Durability::Immediate).map_err(|e| Error::backend("set durability", e))?;
    {
        let mut meta = wtxn.open_table(META).map_err(|e| Error::backend("open meta table", e))?;
        let compacted_before = meta
            .get(META_COMPACTED)
            .map_err(|e| Error::backend("read meta", e))?
            .map_or(0, |v| v.value());
        let compacted = compacted_before.max(layer.compacted);
        let mut keys = wtxn.open_table(KEYS).map_err(|e| Error::backend("open keys table", e))?;
        let mut values =
            wtxn.open_table(VALUES).map_err(|e| Error::backend("open values table", e))?;
        for (key, state) in &layer.kv {
            let new = state.as_ref().map(Stored::state);
            set_key(&mut keys, &mut values, key, new, compacted)
                .map_err(|e| Error::backend(format!("checkpoint {key}"), e))?;
        }
        let mut history =
            wtxn.open_table(HISTORY).map_err(|e| Error::backend("open history table", e))?;
        if compacted > compacted_before {
            keep_current_values(&history, &keys, &mut values, compacted_before, compacted)?;
            history
                .retain_in(..=compacted, |_, _| false)
                .map_err(|e| Error::backend("compact history", e))?;
            // The values of the revisions compacted now that are no longer current (those
            // displaced at or below the compacted revision went when displaced).
            let mut unreadable = None;
            values
                .retain_in((compacted_before + 1, "")..(compacted + 1, ""), |(revision, key), _| {
                    let current = keys
                        .get(key)
                        .map_err(|e| Error::backend(format!("get {key}"), e))
                        .and_then(|entry| {
                            entry.map(|raw| codec::decode_key(key, raw.value())).transpose()
                        });
                    match current {
                        Ok(current) => current.is_some_and(|(_, at)| at == revision),
                        Err(error) => {
                            unreadable.get_or_insert(error);
                            true
                        }
                    }
                })
                .map_err(|e| Error::backend("compact values", e))?;
            if let Some(error) = unreadable {
                return Err(error);
            }
        }
        // Every value goes into history inline: that is where reads find it.
        let txns: Vec<&CommittedTxn> = layer.history.iter().flat_map(|b| b.iter()).collect();
        let mut record = Vec::new();
        for run in record_runs(&txns) {
            let last = run[run.len() - 1].revision;
            codec::encode_run_into(&mut record, run);
            history
                .insert(last, record.as_slice())
                .map_err(|e| Error::backend("write history", e))?;
        }
        for (name, value) in [
            (META_REVISION, layer.revision),
            (META_COMPACTED, compacted),
            (META_CHECKPOINT, layer.revision),
        ] {
            meta.insert(name, value).map_err(|e| Error::backend("write meta", e))?;
        }
    }
    wtxn.commit().map_err(|e| Error::backend("commit checkpoint", e))?;
    // redb has it all now: readers from here on read it there.
    {
        let mut memtable = shared.memtable.write().unwrap_or_else(|e| e.into_inner());
        memtable.checkpoint = layer.revision;
        memtable.frozen = None;
    }
    tracing::debug!(
        revision = layer.revision,
        keys = layer.kv.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "checkpoint"
    );
    shared.checkpoints.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Apply one transaction at `revision` to the memtable's keys (`snapshot`: redb's, for the
/// keys the memtable does not hold). The outer `Result` is a storage failure; the inner one a
/// failed precondition (nothing of this transaction was written).
#[allow(clippy::type_complexity)]
fn apply_txn(
    memtable: &mut Memtable,
    snapshot: &Snapshot,
    revision: Revision,
    ops: &[TxnOp],
) -> Result<Result<(Vec<TxnResult>, Vec<Event>)>> {
    // The transaction's own view: keys it has written so far (`None`: deleted).
    let mut overlay: HashMap<&str, Option<KeyValue>> = HashMap::with_capacity(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    let mut events = Vec::with_capacity(ops.len());
    for op in ops {
        let key = op.key();
        let current = match (overlay.get(key), memtable.lookup(key)) {
            (Some(state), _) => state.clone(),
            (None, Some(state)) => state.as_ref().map(|stored| stored.with_key(key)),
            // A create only asks whether the key exists: no value is read for it.
            (None, None) if matches!(op, TxnOp::Create { .. }) => {
                if snapshot.contains(key)? {
                    return Ok(Err(Error::AlreadyExists { key: key.to_owned() }));
                }
                None
            }
            (None, None) => snapshot.get(key)?,
        };
        match (op, current) {
            (TxnOp::Create { .. }, Some(_)) => {
                return Ok(Err(Error::AlreadyExists { key: key.to_owned() }));
            }
            (TxnOp::Create { value, .. }, None) => {
                let kv = KeyValue {
                    key: key.to_owned(),
                    value: value.clone(),
                    create_revision: revision,
                    mod_revision: revision,
                };
                events.push(Event { kind: EventKind::Put, revision, kv: kv.clone(), prev: None });
                results.push(TxnResult::Put(kv.clone()));
                overlay.insert(key, Some(kv));
            }
            (TxnOp::Update { .. } | TxnOp::Delete { .. }, None) => {
                return Ok(Err(Error::NotFound { key: key.to_owned() }));
            }
            (TxnOp::Update { expected, .. }, Some(cur)) if cur.mod_revision != *expected => {
                return Ok(Err(Error::Conflict {
                    key: key.to_owned(),
                    expected: *expected,
                    actual: cur.mod_revision,
                }));
            }
            (TxnOp::Update { value, .. }, Some(cur)) => {
                let kv = KeyValue {
                    key: key.to_owned(),
                    value: value.clone(),
                    create_revision: cur.create_revision,
                    mod_revision: revision,
                };
                events.push(Event {
                    kind: EventKind::Put,
                    revision,
                    kv: kv.clone(),
                    prev: Some(cur),
                });
                results.push(TxnResult::Put(kv.clone()));
                overlay.insert(key, Some(kv));
            }
            (TxnOp::Delete { expected: Some(expected), .. }, Some(cur))
                if cur.mod_revision != *expected =>
            {
                return Ok(Err(Error::Conflict {
                    key: key.to_owned(),
                    expected: *expected,
                    actual: cur.mod_revision,
                }));
            }
            (TxnOp::Delete { .. }, Some(cur)) => {
                events.push(Event {
                    kind: EventKind::Delete,
                    revision,
                    kv: cur.clone(),
                    prev: None,
                });
                results.push(TxnResult::Deleted(cur));
                overlay.insert(key, None);
            }
        }
    }
    // Every precondition held: write the transaction's view.
    for (key, state) in overlay {
        let state = state.map(|kv| Stored {
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            value: kv.value,
        });
        match memtable.active.kv.get_mut(key) {
            Some(slot) => *slot = state,
            None => {
                memtable.active.kv.insert(key.to_owned(), state);
            }
        }
    }
    Ok(Ok((results, events)))
}

/// The on-disk encodings of the `kv` and `history` values. Decoding never panics: damaged
/// records are reported as [`Error::Backend`] with a [`codec::CorruptRecord`] source.
pub(crate) mod codec {
    use bytes::Bytes;

    use super::super::{Error, Event, EventKind, KeyValue, Result, Revision};
    use super::CommittedTxn;

    const EVENTS_FORMAT: u8 = 1;
    const BATCH_FORMAT: u8 = 2;
    const KIND_PUT: u8 = 0;
    const KIND_DELETE: u8 = 1;
    /// A put stored without its value (`value_len` 0): the value is in `values` under the
    /// revision and key. Checkpoints of earlier versions wrote it to `history` (this one
    /// writes every value inline, and reads it in their records).
    const KIND_PUT_BY_REFERENCE: u8 = 2;

    #[derive(Debug, thiserror::Error)]
    pub enum CorruptRecord {
        #[error("record truncated: needed {needed} bytes at offset {offset}, have {len}")]
        Truncated { offset: usize, needed: usize, len: usize },
        #[error("unknown history record format {0}")]
        Format(u8),
        #[error("unknown event kind {0}")]
        Kind(u8),
        #[error("key is not UTF-8")]
        KeyNotUtf8(#[source] std::str::Utf8Error),
        #[error("{0} trailing bytes after the record")]
        Trailing(usize),
        #[error("a put stored by reference carries a value")]
        ValueInReference,
    }

    fn corrupt(what: String, cause: CorruptRecord) -> Error {
        Error::backend(what, cause)
    }

    /// An earlier version's `kv` entry: `create_revision | mod_revision | value`.
    #[cfg(test)]
    pub fn encode_kv(create_revision: Revision, mod_revision: Revision, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + value.len());
        out.extend_from_slice(&create_revision.to_le_bytes());
        out.extend_from_slice(&mod_revision.to_le_bytes());
        out.extend_from_slice(value);
        out
    }

    /// A `keys` entry: `create_revision i64 LE | mod_revision i64 LE`.
    pub fn encode_key(create_revision: Revision, mod_revision: Revision) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&create_revision.to_le_bytes());
        out[8..].copy_from_slice(&mod_revision.to_le_bytes());
        out
    }

    /// The create and mod revisions of a `keys` entry.
    pub fn decode_key(key: &str, raw: &[u8]) -> Result<(Revision, Revision)> {
        let revisions: Option<[u8; 16]> = raw.try_into().ok();
        match revisions {
            Some(r) => Ok((
                i64::from_le_bytes(r[..8].try_into().unwrap_or_default()),
                i64::from_le_bytes(r[8..].try_into().unwrap_or_default()),
            )),
            None => Err(corrupt(
                format!("decode key {key}"),
                CorruptRecord::Truncated { offset: 0, needed: 16, len: raw.len() },
            )),
        }
    }

    #[cfg(test)]
    pub fn decode_kv(key: &str, raw: &[u8]) -> Result<KeyValue> {
        let (mod_revision, value) = kv_value(key, raw)?;
        Ok(KeyValue {
            key: key.to_owned(),
            value: Bytes::copy_from_slice(value),
            create_revision: i64::from_le_bytes(raw[..8].try_into().unwrap_or_default()),
            mod_revision,
        })
    }

    /// The mod revision and value of an earlier version's `kv` entry, without copying it.
    pub fn kv_value<'r>(key: &str, raw: &'r [u8]) -> Result<(Revision, &'r [u8])> {
        match raw.get(8..16) {
            Some(modr) => Ok((i64::from_le_bytes(modr.try_into().unwrap_or_default()), &raw[16..])),
            None => Err(corrupt(
                format!("decode key {key}"),
                CorruptRecord::Truncated { offset: 0, needed: 16, len: raw.len() },
            )),
        }
    }

    fn put_kv(out: &mut Vec<u8>, kv: &KeyValue) {
        out.extend_from_slice(&kv.create_revision.to_le_bytes());
        out.extend_from_slice(&kv.mod_revision.to_le_bytes());
        out.extend_from_slice(&(kv.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&kv.value);
    }

    /// `format u8 | count u32 | count × (kind u8 | key_len u32 | key | kv | has_prev u8 | prev?)`
    /// with `kv = create i64 | mod i64 | value_len u32 | value` (all little endian).
    #[cfg(test)]
    pub fn encode_events(events: &[Event]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_events_into(&mut out, events);
        out
    }

    /// Whether `event` is stored by reference when `by_ref` picks the values left out: only a
    /// put's can be.
    fn by_reference(event: &Event, by_ref: &dyn Fn(&Event) -> bool) -> bool {
        event.kind == EventKind::Put && by_ref(event)
    }

    /// The length of what [`encode_events_into_with`] writes for `events`.
    fn events_len(events: &[Event], by_ref: &dyn Fn(&Event) -> bool) -> usize {
        let kv_len = |kv: &KeyValue| 20 + kv.value.len();
        let event_len = |e: &Event| {
            let value = if by_reference(e, by_ref) { 20 } else { kv_len(&e.kv) };
            6 + e.kv.key.len() + value + e.prev.as_ref().map_or(0, kv_len)
        };
        5 + events.iter().map(event_len).sum::<usize>()
    }

    /// [`encode_events`], appended to `out`.
    pub fn encode_events_into(out: &mut Vec<u8>, events: &[Event]) {
        encode_events_into_with(out, events, &|_| false)
    }

    /// [`encode_events_into`], with the values of the puts `by_ref` picks left out
    /// ([`KIND_PUT_BY_REFERENCE`]).
    fn encode_events_into_with(
        out: &mut Vec<u8>,
        events: &[Event],
        by_ref: &dyn Fn(&Event) -> bool,
    ) {
        out.reserve(events_len(events, by_ref));
        out.push(EVENTS_FORMAT);
        out.extend_from_slice(&(events.len() as u32).to_le_bytes());
        for event in events {
            let by_reference = by_reference(event, by_ref);
            out.push(match event.kind {
                EventKind::Put if by_reference => KIND_PUT_BY_REFERENCE,
                EventKind::Put => KIND_PUT,
                EventKind::Delete => KIND_DELETE,
            });
            out.extend_from_slice(&(event.kv.key.len() as u32).to_le_bytes());
            out.extend_from_slice(event.kv.key.as_bytes());
            if by_reference {
                out.extend_from_slice(&event.kv.create_revision.to_le_bytes());
                out.extend_from_slice(&event.kv.mod_revision.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
            } else {
                put_kv(out, &event.kv);
            }
            match &event.prev {
                Some(prev) => {
                    out.push(1);
                    put_kv(out, prev);
                }
                None => out.push(0),
            }
        }
    }

    struct Reader {
        buf: Bytes,
        pos: usize,
    }

    /// The `n` bytes at `pos` of a record of `len`, if it has them.
    fn span(pos: usize, n: usize, len: usize) -> Result<std::ops::Range<usize>, CorruptRecord> {
        match pos.checked_add(n) {
            Some(end) if end <= len => Ok(pos..end),
            _ => Err(CorruptRecord::Truncated { offset: pos, needed: n, len }),
        }
    }

    impl Reader {
        fn take(&mut self, n: usize) -> Result<Bytes, CorruptRecord> {
            let span = span(self.pos, n, self.buf.len())?;
            self.pos = span.end;
            Ok(self.buf.slice(span))
        }
        fn u8(&mut self) -> Result<u8, CorruptRecord> {
            Ok(self.take(1)?[0])
        }
        fn u32(&mut self) -> Result<u32, CorruptRecord> {
            let b = self.take(4)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        fn i64(&mut self) -> Result<i64, CorruptRecord> {
            let b = self.take(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(&b);
            Ok(i64::from_le_bytes(a))
        }
        fn kv(&mut self, key: &str) -> Result<KeyValue, CorruptRecord> {
            let create_revision = self.i64()?;
            let mod_revision = self.i64()?;
            let len = self.u32()? as usize;
            let value = self.take(len)?;
            Ok(KeyValue { key: key.to_owned(), value, create_revision, mod_revision })
        }
    }

    /// A cursor over a borrowed record, for what is only located in it (a [`Reader`] hands
    /// out owned slices).
    struct Cursor<'a> {
        buf: &'a [u8],
        pos: usize,
    }

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], CorruptRecord> {
            let span = span(self.pos, n, self.buf.len())?;
            self.pos = span.end;
            Ok(&self.buf[span])
        }
        fn u32(&mut self) -> Result<u32, CorruptRecord> {
            Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
        }
        fn i64(&mut self) -> Result<i64, CorruptRecord> {
            Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
        }
    }

    /// The length of a run record's header (see [`encode_run_into`]).
    pub(super) const RUN_HEADER_LEN: usize = 5;

    /// The length `txn` adds to a run record.
    pub(super) fn run_entry_len(txn: &CommittedTxn) -> usize {
        12 + events_len(&txn.events, &|_| false)
    }

    /// A `history` record holding a run of revisions, stored under the last of them:
    /// `format u8 (2) | count u32 | count × (revision i64 | len u32 | events)`, each `events` as
    /// [`encode_events`] writes it; written into `out` (cleared first). A checkpoint stores
    /// the runs [`super::record_runs`] cuts, one record each: one B-tree insert per run instead
    /// of one per revision. A format-1 record (what [`encode_events`] writes, and what earlier
    /// versions stored) is the run of its one revision.
    pub(super) fn encode_run_into(out: &mut Vec<u8>, txns: &[&CommittedTxn]) {
        encode_run_with(out, txns, &|_| false)
    }

    /// [`encode_run_into`], with the values of the puts `by_ref` picks left out
    /// ([`KIND_PUT_BY_REFERENCE`]), as earlier versions' checkpoints wrote them (the tests
    /// write such records; this version only reads them).
    pub(super) fn encode_run_with(
        out: &mut Vec<u8>,
        txns: &[&CommittedTxn],
        by_ref: &dyn Fn(&Event) -> bool,
    ) {
        out.clear();
        out.push(BATCH_FORMAT);
        out.extend_from_slice(&(txns.len() as u32).to_le_bytes());
        for txn in txns {
            out.extend_from_slice(&txn.revision.to_le_bytes());
            let at = out.len();
            out.extend_from_slice(&[0; 4]); // length, below
            encode_events_into_with(out, &txn.events, by_ref);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }

    /// Split the `history` record stored under `last` into its revisions, in order: `(revision,
    /// events)` with `events` as [`decode_events`] takes them. The revisions must be
    /// contiguous and end at `last`.
    pub fn split_batch(last: Revision, raw: Bytes) -> Result<Vec<(Revision, Bytes)>> {
        let ranges = batch_ranges(last, &raw)?;
        Ok(ranges.into_iter().map(|(revision, range)| (revision, raw.slice(range))).collect())
    }

    /// [`split_batch`] of a borrowed record: where each revision's events are in it.
    pub fn batch_ranges(
        last: Revision,
        raw: &[u8],
    ) -> Result<Vec<(Revision, std::ops::Range<usize>)>> {
        let what = || format!("decode history record of revision {last}");
        if raw.first() == Some(&EVENTS_FORMAT) {
            return Ok(vec![(last, 0..raw.len())]);
        }
        let mut cursor = Cursor { buf: raw, pos: 0 };
        let mut split = || -> Result<Vec<(Revision, std::ops::Range<usize>)>, CorruptRecord> {
            let format = cursor.take(1)?[0];
            if format != BATCH_FORMAT {
                return Err(CorruptRecord::Format(format));
            }
            let count = cursor.u32()? as usize;
            let mut out = Vec::with_capacity(count.min(raw.len() / 12));
            for _ in 0..count {
                let revision = cursor.i64()?;
                let len = cursor.u32()? as usize;
                let start = cursor.pos;
                cursor.take(len)?;
                out.push((revision, start..cursor.pos));
            }
            if cursor.pos != raw.len() {
                return Err(CorruptRecord::Trailing(raw.len() - cursor.pos));
            }
            Ok(out)
        };
        let out = split().map_err(|cause| corrupt(what(), cause))?;
        let contiguous = out.windows(2).all(|w| w[1].0 == w[0].0 + 1);
        if out.last().map(|(r, _)| *r) != Some(last) || !contiguous {
            return Err(Error::backend(
                what(),
                format!(
                    "revisions {:?}..={:?} in the record of revision {last}",
                    out.first().map(|(r, _)| *r),
                    out.last().map(|(r, _)| *r)
                ),
            ));
        }
        Ok(out)
    }

    /// Decode the events of `revision`, appending those whose key starts with `prefix`. A
    /// put stored by reference is an error: only `history` records hold them (see
    /// [`decode_events_with`]).
    pub fn decode_events(
        revision: Revision,
        raw: Bytes,
        prefix: &str,
        out: &mut Vec<Event>,
    ) -> Result<()> {
        decode_events_with(revision, raw, prefix, out, &mut |key| {
            Err(Error::backend(
                format!("decode events of revision {revision}"),
                format!("the put of {key} is stored by reference outside the history"),
            ))
        })
    }

    /// [`decode_events`], with the value of each put stored by reference (taken) from
    /// `stored(key)`.
    pub fn decode_events_with(
        revision: Revision,
        raw: Bytes,
        prefix: &str,
        out: &mut Vec<Event>,
        stored: &mut dyn FnMut(&str) -> Result<Bytes>,
    ) -> Result<()> {
        let first = out.len();
        let mut by_reference = Vec::new();
        let mut reader = Reader { buf: raw, pos: 0 };
        let what = || format!("decode history of revision {revision}");
        let mut decode = || -> Result<(), CorruptRecord> {
            let format = reader.u8()?;
            if format != EVENTS_FORMAT {
                return Err(CorruptRecord::Format(format));
            }
            let count = reader.u32()?;
            for _ in 0..count {
                let (kind, by_ref) = match reader.u8()? {
                    KIND_PUT => (EventKind::Put, false),
                    KIND_DELETE => (EventKind::Delete, false),
                    KIND_PUT_BY_REFERENCE => (EventKind::Put, true),
                    other => return Err(CorruptRecord::Kind(other)),
                };
                let key_len = reader.u32()? as usize;
                let key = reader.take(key_len)?;
                let key = std::str::from_utf8(&key).map_err(CorruptRecord::KeyNotUtf8)?;
                let kv = reader.kv(key)?;
                let prev = match reader.u8()? {
                    0 => None,
                    _ => Some(reader.kv(key)?),
                };
                if by_ref && !kv.value.is_empty() {
                    return Err(CorruptRecord::ValueInReference);
                }
                if key.starts_with(prefix) {
                    if by_ref {
                        by_reference.push(out.len());
                    }
                    out.push(Event { kind, revision, kv, prev });
                }
            }
            if reader.pos != reader.buf.len() {
                return Err(CorruptRecord::Trailing(reader.buf.len() - reader.pos));
            }
            Ok(())
        };
        if let Err(cause) = decode() {
            out.truncate(first);
            return Err(corrupt(what(), cause));
        }
        for i in by_reference {
            out[i].kv.value = stored(&out[i].kv.key)?;
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn kv(key: &str, value: &'static str, c: i64, m: i64) -> KeyValue {
            KeyValue {
                key: key.into(),
                value: Bytes::from_static(value.as_bytes()),
                create_revision: c,
                mod_revision: m,
            }
        }

        #[test]
        fn events_round_trip_and_filter() {
            let events = vec![
                Event { kind: EventKind::Put, revision: 7, kv: kv("/a/1", "x", 7, 7), prev: None },
                Event {
                    kind: EventKind::Put,
                    revision: 7,
                    kv: kv("/b/1", "y", 3, 7),
                    prev: Some(kv("/b/1", "old", 3, 5)),
                },
                Event {
                    kind: EventKind::Delete,
                    revision: 7,
                    kv: kv("/a/2", "z", 2, 4),
                    prev: None,
                },
            ];
            let raw = Bytes::from(encode_events(&events));
            let mut all = Vec::new();
            decode_events(7, raw.clone(), "", &mut all).unwrap();
            assert_eq!(all, events);
            let mut only_a = Vec::new();
            decode_events(7, raw, "/a/", &mut only_a).unwrap();
            assert_eq!(only_a, vec![events[0].clone(), events[2].clone()]);
        }

        #[test]
        fn damaged_records_are_errors_not_panics() {
            let events = vec![Event {
                kind: EventKind::Put,
                revision: 1,
                kv: kv("/k", "v", 1, 1),
                prev: None,
            }];
            let raw = encode_events(&events);
            // Every truncation, and every single-byte corruption, decodes to Ok or Backend.
            for len in 0..raw.len() {
                let result =
                    decode_events(1, Bytes::copy_from_slice(&raw[..len]), "", &mut Vec::new());
                assert!(matches!(result, Err(Error::Backend { .. })), "truncated to {len}");
            }
            for i in 0..raw.len() {
                for byte in [0u8, 0x7f, 0xff] {
                    let mut damaged = raw.clone();
                    damaged[i] = byte;
                    let result = decode_events(1, Bytes::from(damaged), "", &mut Vec::new());
                    assert!(matches!(result, Ok(()) | Err(Error::Backend { .. })));
                }
            }
            let mut long = raw.clone();
            long.push(0);
            assert!(decode_events(1, Bytes::from(long), "", &mut Vec::new()).is_err());
            assert!(matches!(decode_kv("/k", &[1, 2, 3]), Err(Error::Backend { .. })));
            let good = decode_kv("/k", &encode_kv(3, 4, b"val")).unwrap();
            assert_eq!(good, kv("/k", "val", 3, 4));
        }

        fn put(revision: Revision, key: &str) -> Event {
            Event {
                kind: EventKind::Put,
                revision,
                kv: kv(key, "v", revision, revision),
                prev: None,
            }
        }

        fn run(txns: &[CommittedTxn]) -> Vec<u8> {
            let mut out = vec![0xaa; 3]; // replaced, not appended to
            encode_run_into(&mut out, &txns.iter().collect::<Vec<_>>());
            out
        }

        #[test]
        fn batch_records_split_into_their_revisions() {
            let txns: Vec<CommittedTxn> = (5..=7)
                .map(|r| CommittedTxn { revision: r, events: vec![put(r, &format!("/k/{r}"))] })
                .collect();
            let raw = Bytes::from(run(&txns));
            let split = split_batch(7, raw.clone()).unwrap();
            assert_eq!(split.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![5, 6, 7]);
            for (revision, events) in split {
                let mut out = Vec::new();
                decode_events(revision, events, "", &mut out).unwrap();
                assert_eq!(out, vec![put(revision, &format!("/k/{revision}"))]);
            }
            // A format-1 record is the batch of its own revision.
            let single = Bytes::from(encode_events(&[put(9, "/k/9")]));
            assert_eq!(split_batch(9, single.clone()).unwrap(), vec![(9, single)]);
            // Stored under the wrong revision, or with a hole: an error, not a wrong history.
            assert!(matches!(split_batch(8, raw), Err(Error::Backend { .. })));
            let holed = [&txns[0], &txns[2]];
            let mut raw = Vec::new();
            encode_run_into(&mut raw, &holed);
            assert!(matches!(split_batch(7, Bytes::from(raw)), Err(Error::Backend { .. })));
        }

        #[test]
        fn checkpoint_records_fill_their_pages() {
            use super::super::{CHECKPOINT_RECORD_BYTES, CHECKPOINT_RECORD_REVISIONS, record_runs};
            // Revisions of a pod's size (one over the record size alone), then many small ones.
            let value = |r: Revision| {
                if r == 40 {
                    70_000
                } else if r < 100 {
                    2_300
                } else {
                    40
                }
            };
            let txns: Vec<CommittedTxn> = (1..=1000)
                .map(|r| {
                    let mut event = put(r, &format!("/registry/pods/default/p-{r}"));
                    event.kv.value = Bytes::from(vec![b'x'; value(r)]);
                    CommittedTxn { revision: r, events: vec![event] }
                })
                .collect();
            let all: Vec<&CommittedTxn> = txns.iter().collect();
            let runs = record_runs(&all);
            // Every revision once, in order; each record as long as computed.
            let flat: Vec<Revision> =
                runs.iter().flat_map(|r| r.iter().map(|t| t.revision)).collect();
            assert_eq!(flat, (1..=1000).collect::<Vec<_>>());
            for (i, run) in runs.iter().enumerate() {
                let mut raw = Vec::new();
                encode_run_into(&mut raw, run);
                let computed = RUN_HEADER_LEN + run.iter().map(|t| run_entry_len(t)).sum::<usize>();
                assert_eq!(raw.len(), computed);
                assert!(run.len() <= CHECKPOINT_RECORD_REVISIONS);
                if run.len() > 1 {
                    assert!(
                        raw.len() <= CHECKPOINT_RECORD_BYTES,
                        "record {i}: {} bytes",
                        raw.len()
                    );
                }
                // Not cut early: the next revision would not have fitted.
                if let Some(next) = runs.get(i + 1) {
                    let full = raw.len() + run_entry_len(next[0]) > CHECKPOINT_RECORD_BYTES
                        || run.len() == CHECKPOINT_RECORD_REVISIONS;
                    assert!(full, "record {i} cut at {} bytes, {} revisions", raw.len(), run.len());
                }
            }
            // The oversized revision is a record of its own.
            assert!(runs.iter().any(|r| r.len() == 1 && r[0].revision == 40));
        }

        #[test]
        fn puts_stored_by_reference_take_their_value_from_the_store() {
            let txns: Vec<CommittedTxn> = (1..=3)
                .map(|r| {
                    let mut deleted = put(r, "/b/gone");
                    deleted.kind = EventKind::Delete;
                    let events = vec![put(r, &format!("/a/{r}")), put(r, "/b/x"), deleted];
                    CommittedTxn { revision: r, events }
                })
                .collect();
            // The puts of /a/ keys by reference (a delete never is, whatever the predicate says).
            let by_ref = |e: &Event| e.kv.key.starts_with("/a/") || e.kind == EventKind::Delete;
            let mut raw = Vec::new();
            encode_run_with(&mut raw, &txns.iter().collect::<Vec<_>>(), &by_ref);
            let mut inline = Vec::new();
            encode_run_into(&mut inline, &txns.iter().collect::<Vec<_>>());
            assert_eq!(inline.len() - raw.len(), 3 * "v".len(), "only the /a/ values left out");
            let mut asked = Vec::new();
            for (revision, events) in split_batch(3, Bytes::from(raw)).unwrap() {
                let mut out = Vec::new();
                let mut stored = |key: &str| {
                    asked.push((revision, key.to_string()));
                    Ok(Bytes::from(format!("stored {key}")))
                };
                decode_events_with(revision, events.clone(), "/a/", &mut out, &mut stored).unwrap();
                let mut expected = put(revision, &format!("/a/{revision}"));
                expected.kv.value = Bytes::from(format!("stored /a/{revision}"));
                assert_eq!(out, vec![expected]);
                // Without a store to take it from, the reference is an error.
                let mut none = Vec::new();
                assert!(matches!(
                    decode_events(revision, events, "", &mut none),
                    Err(Error::Backend { .. })
                ));
            }
            // Asked only for the referenced values under the prefix.
            let expected: Vec<(Revision, String)> =
                (1..=3).map(|r| (r, format!("/a/{r}"))).collect();
            assert_eq!(asked, expected);
        }

        #[test]
        fn damaged_batch_records_are_errors_not_panics() {
            let txns: Vec<CommittedTxn> =
                (1..=2).map(|r| CommittedTxn { revision: r, events: vec![put(r, "/k")] }).collect();
            let raw = run(&txns);
            for len in 0..raw.len() {
                let result = split_batch(2, Bytes::copy_from_slice(&raw[..len]));
                assert!(matches!(result, Err(Error::Backend { .. })), "truncated to {len}");
            }
            for i in 0..raw.len() {
                for byte in [0u8, 1, 0x7f, 0xff] {
                    let mut damaged = raw.clone();
                    damaged[i] = byte;
                    let Ok(split) = split_batch(2, Bytes::from(damaged)) else { continue };
                    for (revision, events) in split {
                        let result = decode_events(revision, events, "", &mut Vec::new());
                        assert!(matches!(result, Ok(()) | Err(Error::Backend { .. })));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;
    use crate::{DynStore, StoreExt, bench};

    const CHILD_DIR: &str = "SKIFF_STORE_CRASH_CHILD_DIR";
    const CHILD_ROUND: &str = "SKIFF_STORE_CRASH_CHILD_ROUND";
    const CHILD_TEST: &str = "embedded::tests::crash_writer_child";

    fn crash_value(key: &str) -> Bytes {
        // Values of varying size (a few bytes to ~2 KB) so commits span several pages.
        let pad = key.bytes().map(usize::from).sum::<usize>() % 2000;
        Bytes::from(format!("{key}|{}", "v".repeat(pad)))
    }

    /// Writer mode of [`kill9_loses_no_acknowledged_write`], run as its child process: creates
    /// keys from 8 tasks forever, printing `ACK key revision` after each acknowledgement.
    #[test]
    #[ignore = "child process of kill9_loses_no_acknowledged_write"]
    fn crash_writer_child() {
        let (Some(dir), Some(round)) = (std::env::var_os(CHILD_DIR), std::env::var_os(CHILD_ROUND))
        else {
            eprintln!(
                "crash_writer_child only runs as the child of kill9_loses_no_acknowledged_write"
            );
            return;
        };
        let round = round.to_string_lossy().into_owned();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // Even rounds checkpoint often (so the log is reused from its start while the
            // writes go on), odd rounds keep everything in the memtable and the log.
            let config = if round.parse::<u64>().unwrap() % 2 == 0 {
                EmbeddedConfig::default()
                    .checkpoint_interval(Duration::from_millis(40))
                    .checkpoint_bytes(256 << 10)
            } else {
                EmbeddedConfig::default().checkpoint_interval(Duration::from_secs(3600))
            };
            let store: DynStore =
                Arc::new(EmbeddedStore::open_with(Path::new(&dir), config).unwrap());
            let out = Arc::new(Mutex::new(std::io::stdout()));
            let tasks: Vec<_> = (0..8)
                .map(|task| {
                    let (store, out, round) = (store.clone(), out.clone(), round.clone());
                    tokio::spawn(async move {
                        for i in 0.. {
                            let key = format!("/crash/r{round}/t{task}/{i:06}");
                            let kv = store.create(&key, crash_value(&key)).await.unwrap();
                            let line = format!("ACK {key} {}\n", kv.mod_revision);
                            let mut out = out.lock().unwrap();
                            out.write_all(line.as_bytes()).unwrap();
                            out.flush().unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
    }

    /// Kills the child (SIGKILL) when the test fails half-way.
    struct ChildGuard(std::process::Child);
    impl Drop for ChildGuard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Reopen the store and check it against every acknowledged write: present with its value
    /// and revision, revisions contiguous, and the watch history agreeing with the data.
    async fn verify_after_crash(
        dir: &Path,
        acked: &mut Vec<(String, Revision)>,
        round: u64,
    ) -> Revision {
        let store = EmbeddedStore::open(dir).expect("reopen after kill -9");
        let current = store.current_revision().await.unwrap();
        let listed: BTreeMap<String, KeyValue> =
            store.list("").await.unwrap().kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
        for (key, revision) in acked.iter() {
            let kv = listed.get(key).unwrap_or_else(|| panic!("acknowledged {key} lost"));
            assert_eq!(kv.mod_revision, *revision, "{key}");
            assert_eq!(kv.value, crash_value(key), "{key}");
        }
        // Only creates were made: one key per revision, every revision from 1 to current.
        let mut revisions: Vec<_> = listed.values().map(|kv| kv.mod_revision).collect();
        revisions.sort_unstable();
        assert_eq!(revisions, (1..=current).collect::<Vec<_>>(), "revisions are contiguous");
        // The history replays exactly the stored data.
        let mut watch = store.watch("", 0).await.unwrap();
        for revision in 1..=current {
            let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
                .await
                .expect("history event")
                .expect("stream open")
                .expect("history readable");
            assert_eq!(event.revision, revision);
            assert_eq!(Some(&event.kv), listed.get(&event.kv.key));
        }
        drop(watch);
        // Writes continue after the crash at the next revision.
        let probe = format!("/after-crash/{round}");
        let next = store.create(&probe, crash_value(&probe)).await.unwrap();
        assert_eq!(next.mod_revision, current + 1);
        acked.push((probe, next.mod_revision));
        let current = store.current_revision().await.unwrap();
        store.close().await.unwrap();
        current
    }

    /// kill -9 of a writing process loses no acknowledged write (6 rounds on one data dir,
    /// alternating frequent checkpoints and none).
    #[test]
    fn kill9_loses_no_acknowledged_write() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let mut acked: Vec<(String, Revision)> = Vec::new();
        for round in 0..6 {
            let child = Command::new(&exe)
                .args([CHILD_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                .env(CHILD_DIR, dir.path())
                .env(CHILD_ROUND, round.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut child = ChildGuard(child);
            let stdout = child.0.stdout.take().unwrap();
            let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
            let reader = std::thread::spawn(move || {
                let mut reader = BufReader::new(stdout);
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        // Only complete lines count: a line cut by the kill was not printed.
                        Ok(n) if n > 0 && line.ends_with('\n') => {
                            if lines_tx.send(line).is_err() {
                                return;
                            }
                        }
                        _ => return,
                    }
                }
            });
            let first = lines_rx
                .iter()
                .find(|l| l.starts_with("ACK "))
                .unwrap_or_else(|| panic!("round {round}: the writer acknowledged nothing"));
            std::thread::sleep(Duration::from_millis(300 + 37 * round));
            child.0.kill().unwrap(); // SIGKILL
            child.0.wait().unwrap();
            reader.join().unwrap();
            let mut this_round = 0;
            for line in std::iter::once(first).chain(lines_rx.try_iter()) {
                let mut parts = line.split_whitespace();
                if parts.next() != Some("ACK") {
                    continue;
                }
                let (Some(key), Some(revision)) = (parts.next(), parts.next()) else {
                    panic!("malformed line {line:?}")
                };
                acked.push((key.to_owned(), revision.parse().unwrap()));
                this_round += 1;
            }
            let current = runtime.block_on(verify_after_crash(dir.path(), &mut acked, round));
            eprintln!(
                "round {round}: {this_round} writes acknowledged before kill -9; store at revision {current}"
            );
            assert!(this_round > 10, "round {round}: too few writes to mean anything");
        }
    }

    /// A watcher that does not read while thousands of writes go by never blocks the writers
    /// and, once it reads, gets every event once, in order (it falls behind the live buffer
    /// and re-reads history).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_watcher_catches_up_from_history() {
        let dir = tempfile::tempdir().unwrap();
        let config = EmbeddedConfig::default().live_buffer(2).watch_buffer(4).history_chunk(16);
        let store: DynStore = Arc::new(EmbeddedStore::open_with(dir.path(), config).unwrap());
        let mut stalled = store.watch("/s/", 0).await.unwrap();
        let writes = tokio::time::timeout(
            Duration::from_secs(60),
            bench::creates(store.clone(), "/s/", 16, 40, 64),
        )
        .await
        .expect("writers are not blocked by a stalled watcher")
        .unwrap();
        assert_eq!(writes.creates, 640);
        for revision in 1..=640 {
            let event = tokio::time::timeout(Duration::from_secs(10), stalled.next())
                .await
                .expect("event")
                .expect("open")
                .expect("no error");
            assert_eq!(event.revision, revision);
        }
        store.create("/s/live", Bytes::from_static(b"x")).await.unwrap();
        let live = stalled.next().await.unwrap().unwrap();
        assert_eq!((live.revision, live.kv.key.as_str()), (641, "/s/live"));
    }

    /// The health check (the apiserver's `etcd` check) passes on an open store and fails,
    /// with the reason, once a failed write poisoned it; writes fail with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_fails_once_poisoned() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        store.create("/h/a", Bytes::from_static(b"x")).await.unwrap();
        store.check_health().await.unwrap();
        store.shared.poison("write-ahead log append failed: EIO".into());
        let err = store.check_health().await.unwrap_err();
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("write-ahead log append failed: EIO"), "{err}");
        assert!(store.create("/h/b", Bytes::from_static(b"x")).await.is_err());
    }

    /// Watchers resume across a restart from any revision kept in history.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_resumes_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for i in 0..10 {
            store.create(&format!("/r/{i}"), Bytes::from_static(b"x")).await.unwrap();
        }
        store.compact(3).await.unwrap();
        store.close().await.unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(store.current_revision().await.unwrap(), 10);
        assert_eq!(store.compacted_revision().await.unwrap(), 3);
        let mut watch = store.watch("/r/", 5).await.unwrap();
        for revision in 6..=10 {
            assert_eq!(watch.next().await.unwrap().unwrap().revision, revision);
        }
        let mut old = store.watch("/r/", 2).await.unwrap();
        assert!(matches!(old.next().await, Some(Err(Error::Compacted { compacted: 3, .. }))));
    }

    /// Concurrent writes are group-committed into multi-revision history records; a watch from
    /// any revision, before and after a compaction inside such a record and across a reopen,
    /// replays exactly the revisions after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn history_of_group_commits_replays_from_any_revision() {
        /// The keys of the revisions after `after`, from a watch, checked contiguous.
        async fn keys_after(store: &EmbeddedStore, after: Revision, last: Revision) -> Vec<String> {
            let mut watch = store.watch("/g/", after).await.unwrap();
            let mut keys = Vec::new();
            for expected in after + 1..=last {
                let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
                    .await
                    .expect("history replay stalled")
                    .unwrap()
                    .unwrap();
                assert_eq!(event.revision, expected, "watch from {after}");
                keys.push(event.kv.key);
            }
            keys
        }
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let n: Revision = 400;
        // Sent all at once, so the writer commits them in batches of many.
        let keys: Vec<String> = (0..n).map(|i| format!("/g/{i}")).collect();
        let creates = keys.iter().map(|key| store.create(key, Bytes::from_static(b"v")));
        for created in futures::future::join_all(creates).await {
            created.unwrap();
        }
        let stats = store.stats();
        assert_eq!(store.current_revision().await.unwrap(), n);
        assert!(stats.txns > stats.commits, "some commit held several revisions: {stats:?}");
        let all = keys_after(&store, 0, n).await;
        let mut distinct = all.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), n as usize, "every create once");
        for after in [1, 2, 99, 100, 101, 250, n - 1, n] {
            assert_eq!(keys_after(&store, after, n).await, all[after as usize..]);
        }
        let compacted = n / 2 + 1;
        store.compact(compacted).await.unwrap();
        assert_eq!(keys_after(&store, compacted, n).await, all[compacted as usize..]);
        let mut old = store.watch("/g/", compacted - 1).await.unwrap();
        assert!(matches!(old.next().await, Some(Err(Error::Compacted { .. }))));
        store.close().await.unwrap();

        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), compacted);
        for after in [compacted, compacted + 1, n - 1] {
            assert_eq!(keys_after(&store, after, n).await, all[after as usize..]);
        }
    }

    /// A record logged after a gap (its batch reached the disk, an earlier one in the other
    /// file did not, so it was never acknowledged) is not replayed, and the log is cleared at
    /// open, so it cannot come back later as the record of a new write of the same revision.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replay_stops_at_a_gap_and_clears_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for i in 1..=3 {
            store.create(&format!("/o/{i}"), Bytes::from_static(b"v")).await.unwrap();
        }
        store.close().await.unwrap();
        {
            let (mut wal, _) = Wal::open(dir.path(), 64 << 10).unwrap();
            wal.switch();
            let orphan = Event {
                kind: EventKind::Put,
                revision: 5,
                kv: KeyValue {
                    key: "/o/orphan".into(),
                    value: Bytes::from_static(b"never acknowledged"),
                    create_revision: 5,
                    mod_revision: 5,
                },
                prev: None,
            };
            wal.append(&[(5, &codec::encode_events(&[orphan])[..])]).unwrap();
        }
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(store.current_revision().await.unwrap(), 3);
        assert!(store.get("/o/orphan").await.unwrap().is_none());
        let (_, logged) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert!(logged.is_empty(), "the log is cleared once replayed: {logged:?}");
        let new = store.create("/o/4", Bytes::from_static(b"v")).await.unwrap();
        let fifth = store.create("/o/5", Bytes::from_static(b"v")).await.unwrap();
        assert_eq!((new.mod_revision, fifth.mod_revision), (4, 5));
        store.close().await.unwrap();
    }

    /// Values live in the history records of their revisions, through later checkpoints and
    /// a log replay that displace them; compaction keeps the values still current (in
    /// `values`) and drops the rest with their revisions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn history_holds_the_values_and_compaction_keeps_the_current_ones() {
        let dir = tempfile::tempdir().unwrap();
        let every_commit =
            EmbeddedConfig::default().checkpoint_interval(Duration::ZERO).wal_prealloc(64 << 10);
        let store = EmbeddedStore::open_with(dir.path(), every_commit).unwrap();
        let value = |s: &str| Bytes::from(format!("<{s}>"));
        let mut expected: Vec<(Revision, &str, Option<&str>)> = Vec::new();
        let mut ticks = 0;
        for (key, new) in [
            ("/r/a", Some("a1")),
            ("/r/c", Some("c1")),
            ("/r/a", Some("a2")),
            ("/r/b", Some("b1")),
            ("/r/b", None),
            ("/r/a", Some("a3")),
        ] {
            let revision = match (new, store.get(key).await.unwrap()) {
                (Some(v), None) => store.create(key, value(v)).await.unwrap().mod_revision,
                (Some(v), Some(old)) => {
                    store.update(key, value(v), old.mod_revision).await.unwrap().mod_revision
                }
                (None, _) => {
                    store.delete(key, None).await.unwrap();
                    store.current_revision().await.unwrap()
                }
            };
            expected.push((revision, key, new));
            // Each write checkpointed before the next (a checkpoint starts at a commit when
            // none is running: writes elsewhere start the one that takes it).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while store.shared.memtable().checkpoint < revision {
                assert!(std::time::Instant::now() < deadline, "no checkpoint: {:?}", store.stats());
                ticks += 1;
                store.create(&format!("/z/{ticks}"), value("tick")).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let current = store.current_revision().await.unwrap();
        store.close().await.unwrap();

        // A log replay displaces a checkpointed value too: /r/a's a3, by a4.
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        let next = current + 1;
        let a4 = Event {
            kind: EventKind::Put,
            revision: next,
            kv: KeyValue {
                key: "/r/a".into(),
                value: value("a4"),
                create_revision: 1,
                mod_revision: next,
            },
            prev: Some(KeyValue {
                key: "/r/a".into(),
                value: value("a3"),
                create_revision: 1,
                mod_revision: expected[5].0,
            }),
        };
        let logged = WalTxn { revision: next, events: Bytes::from(codec::encode_events(&[a4])) };
        assert_eq!(replay(&db, &[logged]).unwrap(), 1);
        let kept = |db: &Database| -> Vec<(Revision, String)> {
            let rtxn = db.begin_read().unwrap();
            let values = rtxn.open_table(VALUES).unwrap();
            let all = values.iter().unwrap().map(|e| {
                let (at, _) = e.unwrap();
                let (revision, key) = at.value();
                (revision, key.to_string())
            });
            all.filter(|(_, key)| !key.starts_with("/z/")).collect()
        };
        // Nothing compacted: every value is in history only.
        assert_eq!(kept(&db), vec![]);
        drop(db);
        expected.push((next, "/r/a", Some("a4")));

        let never = EmbeddedConfig::default().checkpoint_interval(Duration::from_secs(3600));
        let history = async |store: &EmbeddedStore, after: Revision| {
            let mut watch = store.watch("/r/", after).await.unwrap();
            let mut events = Vec::new();
            while events.len() < expected.iter().filter(|(r, ..)| *r > after).count() {
                let event = watch.next().await.unwrap().unwrap();
                let value = (event.kind == EventKind::Put).then(|| event.kv.value.clone());
                events.push((event.revision, event.kv.key.clone(), value));
            }
            events
        };
        let want = |after: Revision| -> Vec<(Revision, String, Option<Bytes>)> {
            expected
                .iter()
                .filter(|(r, ..)| *r > after)
                .map(|(r, k, v)| (*r, k.to_string(), v.map(value)))
                .collect()
        };
        let current_values = async |store: &EmbeddedStore| {
            let listed = store.list("/r/").await.unwrap().kvs;
            let got = store.get("/r/c").await.unwrap().unwrap();
            assert_eq!(listed[1], got);
            listed.into_iter().map(|kv| (kv.key, kv.value)).collect::<Vec<_>>()
        };
        let now = vec![("/r/a".to_string(), value("a4")), ("/r/c".to_string(), value("c1"))];
        let store = EmbeddedStore::open_with(dir.path(), never.clone()).unwrap();
        assert_eq!(history(&store, 0).await, want(0));
        assert_eq!(current_values(&store).await, now);
        // Compacting past b1 (at the close's checkpoint) keeps c1, still current, and
        // nothing else of /r/.
        let b1 = expected[3].0;
        store.compact(b1).await.unwrap();
        store.close().await.unwrap();
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        assert_eq!(kept(&db), vec![(expected[1].0, "/r/c".to_string())]);
        drop(db);
        let store = EmbeddedStore::open_with(dir.path(), never.clone()).unwrap();
        assert_eq!(history(&store, b1).await, want(b1));
        assert_eq!(current_values(&store).await, now);
        // Once /r/c is rewritten, its compacted value goes.
        let c1 = store.get("/r/c").await.unwrap().unwrap();
        store.update("/r/c", value("c2"), c1.mod_revision).await.unwrap();
        store.close().await.unwrap();
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        assert_eq!(kept(&db), vec![]);
    }

    /// `close` returns with the file released when the streams of the store's watches were
    /// dropped just before, whether their tasks were following live events or reading history.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn close_releases_the_file_of_dropped_watches() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..50 {
            let store = EmbeddedStore::open_with(dir.path(), EmbeddedConfig::default()).unwrap();
            let base = store.current_revision().await.unwrap();
            for i in 0..8 {
                store.create(&format!("/w/{round}/{i}"), Bytes::from_static(b"v")).await.unwrap();
            }
            let mut watches = Vec::new();
            for after in base..base + 8 {
                let mut watch = store.watch("/w/", after).await.unwrap();
                watch.next().await.unwrap().unwrap();
                watches.push(watch);
            }
            drop(watches);
            store.close().await.unwrap();
            let db = Database::create(dir.path().join(DB_FILE))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            drop(db);
        }
    }

    /// A store written by an earlier version (each value inline in its `kv` entry, history
    /// referring to it and to the displaced ones kept in `superseded`) opens with the same
    /// keys, values and history, converted, and keeps its values through a compaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn converts_the_tables_of_earlier_versions() {
        let dir = tempfile::tempdir().unwrap();
        let every_commit =
            EmbeddedConfig::default().checkpoint_interval(Duration::ZERO).wal_prealloc(64 << 10);
        let store = EmbeddedStore::open_with(dir.path(), every_commit).unwrap();
        for i in 0..40 {
            let key = format!("/c/{:02}", i % 12);
            let value = Bytes::from(format!("v{i}"));
            match store.get(&key).await.unwrap() {
                None => drop(store.create(&key, value).await.unwrap()),
                Some(_) if i % 7 == 0 => drop(store.delete(&key, None).await.unwrap()),
                Some(old) => drop(store.update(&key, value, old.mod_revision).await.unwrap()),
            }
        }
        let before = store.list("/c/").await.unwrap();
        let history = async |store: &EmbeddedStore, count: usize| {
            let mut watch = store.watch("/c/", 0).await.unwrap();
            let mut events = Vec::new();
            while events.len() < count {
                let e = watch.next().await.unwrap().unwrap();
                events.push((e.revision, e.kind, e.kv.key, e.kv.value));
            }
            events
        };
        let events = history(&store, 40).await;
        // (Closing checkpoints whatever the last checkpoint left.)
        store.close().await.unwrap();

        // Rewrite the tables as an earlier version kept them: every put in history by
        // reference, to the value in `kv` if current, else in `superseded`.
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        let wtxn = db.begin_write().unwrap();
        assert!(wtxn.delete_table(DOWNGRADE_GUARD).unwrap(), "this version's store has the guard");
        {
            let mut history = wtxn.open_table(HISTORY).unwrap();
            let mut kv = wtxn.open_table(LEGACY_KV).unwrap();
            let mut superseded = wtxn.open_table(LEGACY_SUPERSEDED).unwrap();
            for e in &before.kvs {
                let entry = codec::encode_kv(e.create_revision, e.mod_revision, &e.value);
                kv.insert(e.key.as_str(), &entry[..]).unwrap();
            }
            let current = |revision: Revision, key: &str| {
                before.kvs.iter().any(|e| e.key == key && e.mod_revision == revision)
            };
            let records: Vec<(Revision, Bytes)> = history
                .iter()
                .unwrap()
                .map(|e| {
                    let (last, raw) = e.unwrap();
                    (last.value(), Bytes::copy_from_slice(raw.value()))
                })
                .collect();
            for (last, record) in records {
                let mut txns = Vec::new();
                for (revision, raw) in codec::split_batch(last, record).unwrap() {
                    let mut events = Vec::new();
                    codec::decode_events(revision, raw, "", &mut events).unwrap();
                    for e in events.iter().filter(|e| e.kind == EventKind::Put) {
                        if !current(revision, &e.kv.key) {
                            superseded
                                .insert((revision, e.kv.key.as_str()), &e.kv.value[..])
                                .unwrap();
                        }
                    }
                    txns.push(CommittedTxn { revision, events });
                }
                let mut raw = Vec::new();
                let run: Vec<&CommittedTxn> = txns.iter().collect();
                codec::encode_run_with(&mut raw, &run, &|e: &Event| e.kind == EventKind::Put);
                history.insert(last, raw.as_slice()).unwrap();
            }
            assert!(!redb::ReadableTableMetadata::is_empty(&superseded).unwrap(), "none displaced");
        }
        wtxn.delete_table(KEYS).unwrap();
        wtxn.delete_table(VALUES).unwrap();
        wtxn.commit().unwrap();
        drop(db);

        let store = EmbeddedStore::open_with(dir.path(), EmbeddedConfig::default()).unwrap();
        let after = store.list("/c/").await.unwrap();
        assert_eq!((&after.kvs, after.revision), (&before.kvs, before.revision));
        assert_eq!(history(&store, 40).await, events);
        store.compact(before.revision).await.unwrap();
        store.close().await.unwrap();
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        let tables: Vec<String> =
            db.begin_read().unwrap().list_tables().unwrap().map(|t| t.name().to_string()).collect();
        assert!(!tables.iter().any(|t| t == "kv"), "{tables:?}");
        // What an earlier version opens first fails, before it touches the log.
        let wtxn = db.begin_write().unwrap();
        assert!(matches!(
            wtxn.open_table(LEGACY_SUPERSEDED),
            Err(redb::TableError::TableTypeMismatch { .. })
        ));
        drop(wtxn);
        drop(db);
        let store = EmbeddedStore::open_with(dir.path(), EmbeddedConfig::default()).unwrap();
        assert_eq!(store.list("/c/").await.unwrap().kvs, before.kvs);
        store.close().await.unwrap();
    }

    /// Checkpoints happen and the log is reused; reads, updates, deletes and watches see the
    /// same data whether it sits in the memtable, in redb, or both, before and after a reopen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checkpoints_keep_data_and_history() {
        let dir = tempfile::tempdir().unwrap();
        let every_commit =
            EmbeddedConfig::default().checkpoint_interval(Duration::ZERO).wal_prealloc(64 << 10);
        let store = EmbeddedStore::open_with(dir.path(), every_commit).unwrap();
        for round in 0..5 {
            let before = store.stats().checkpoints;
            for i in round * 8..round * 8 + 8 {
                store.create(&format!("/m/{i:02}"), crash_value(&format!("/m/{i}"))).await.unwrap();
            }
            // A commit starts a checkpoint unless one is running (which then ends): one more
            // has ended by the time the round's writes are all in, or soon after on a loaded
            // machine.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while store.stats().checkpoints == before {
                assert!(std::time::Instant::now() < deadline, "no checkpoint: {:?}", store.stats());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let stats = store.stats();
        assert!(stats.checkpoints >= 5, "checkpoints while the writes went on: {stats:?}");
        store.close().await.unwrap();

        // Now nothing is checkpointed until close: the changes sit in the memtable, over redb.
        let never = EmbeddedConfig::default().checkpoint_interval(Duration::from_secs(3600));
        let store = EmbeddedStore::open_with(dir.path(), never.clone()).unwrap();
        store.update("/m/00", Bytes::from_static(b"new"), 1).await.unwrap();
        store.delete("/m/01", None).await.unwrap();
        store.create("/m/40", Bytes::from_static(b"40")).await.unwrap();
        store.create("/m/0", Bytes::from_static(b"first")).await.unwrap();
        assert_eq!(store.stats().checkpoints, 0);
        let check = |listed: ListResult| {
            let keys: Vec<&str> = listed.kvs.iter().map(|kv| kv.key.as_str()).collect();
            assert_eq!(keys.len(), 41);
            assert_eq!(keys[..3], ["/m/0", "/m/00", "/m/02"]);
            assert_eq!(keys[40], "/m/40");
            assert_eq!(listed.revision, 44);
            assert_eq!(listed.kvs[1].value, Bytes::from_static(b"new"));
            assert_eq!((listed.kvs[1].create_revision, listed.kvs[1].mod_revision), (1, 41));
            assert_eq!(listed.kvs[39].value, crash_value("/m/39"));
        };
        check(store.list("/m/").await.unwrap());
        assert!(store.get("/m/01").await.unwrap().is_none());
        assert_eq!(store.get("/m/05").await.unwrap().unwrap().mod_revision, 6);
        assert_eq!(store.get("/m/0").await.unwrap().unwrap().mod_revision, 44);
        // A watch from before the memtable reads redb's history, then the memtable's.
        let mut watch = store.watch("/m/", 38).await.unwrap();
        for (revision, key) in [(39, "/m/38"), (40, "/m/39"), (41, "/m/00"), (42, "/m/01")] {
            let event = watch.next().await.unwrap().unwrap();
            assert_eq!((event.revision, event.kv.key.as_str()), (revision, key));
        }
        store.compact(42).await.unwrap();
        let mut old = store.watch("/m/", 41).await.unwrap();
        assert!(matches!(old.next().await, Some(Err(Error::Compacted { compacted: 42, .. }))));
        drop((watch, old)); // they hold the file open
        store.close().await.unwrap();

        // Close checkpointed the memtable and the compaction.
        let store = EmbeddedStore::open_with(dir.path(), never).unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), 42);
        check(store.list("/m/").await.unwrap());
        let mut watch = store.watch("/m/", 42).await.unwrap();
        assert_eq!(watch.next().await.unwrap().unwrap().kv.key, "/m/40");
        drop(watch);
        store.compact(43).await.unwrap();
        store.close().await.unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), 43);
        check(store.list("/m/").await.unwrap());
        store.close().await.unwrap();
    }

    /// Store files that are not redb databases fail to open with an error, not a panic.
    #[test]
    fn garbage_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), vec![0xa5u8; 64 * 1024]).unwrap();
        match EmbeddedStore::open(dir.path()) {
            Err(Error::Backend { .. }) => {}
            other => panic!("expected a backend error, got {other:?}"),
        }
    }

    /// A store file damaged on disk (bytes overwritten anywhere) opens with an error or, if
    /// the damage hit unused space, opens and serves reads; it never panics.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn damaged_file_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = EmbeddedStore::open(dir.path()).unwrap();
            for i in 0..300 {
                store.create(&format!("/d/{i:04}"), crash_value(&format!("/d/{i}"))).await.unwrap();
            }
            store.close().await.unwrap();
        }
        let pristine = std::fs::read(dir.path().join(DB_FILE)).unwrap();
        let (mut opened, mut refused) = (0, 0);
        for step in 0..48 {
            let damaged_dir = tempfile::tempdir().unwrap();
            let mut bytes = pristine.clone();
            let at = (step * 7919 * 4096 / 48 + step * 131) % bytes.len();
            for b in &mut bytes[at..(at + 64).min(pristine.len())] {
                *b ^= 0x5a;
            }
            std::fs::write(damaged_dir.path().join(DB_FILE), &bytes).unwrap();
            let path = damaged_dir.path().to_owned();
            let outcome = tokio::task::spawn_blocking(move || {
                let store = EmbeddedStore::open(&path)?;
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let listed = runtime.block_on(store.list("/d/"));
                drop(store);
                listed.map(|l| l.kvs.len())
            })
            .await;
            match outcome {
                Ok(Ok(_)) => opened += 1,
                Ok(Err(Error::Backend { .. })) => refused += 1,
                Ok(Err(other)) => panic!("unexpected error kind at byte {at}: {other}"),
                Err(panic) => panic!("damage at byte {at} made the store panic: {panic}"),
            }
        }
        eprintln!("damaged copies: {opened} opened, {refused} refused with an error");
    }

    /// Throughput of single-key creates (run with `--ignored --nocapture`; figures for the
    /// issue note come from a release build).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: prints figures"]
    async fn bench_embedded_creates() {
        for (callers, per_caller) in [(1usize, 1000usize), (64, 500)] {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
            let dyn_store: DynStore = store.clone();
            let result =
                bench::creates(dyn_store, "/bench/", callers, per_caller, 512).await.unwrap();
            let stats = store.stats();
            eprintln!(
                "embedded creates, {callers} callers: {:.0}/s ({} creates in {:?}; {} commits = {:.0} fsyncs/s, {:.1} txns per commit, {} checkpoints; writer busy applying {:?}, syncing {:?})",
                result.per_second(),
                result.creates,
                result.elapsed,
                stats.commits,
                stats.commits as f64 / result.elapsed.as_secs_f64(),
                stats.txns as f64 / stats.commits.max(1) as f64,
                stats.checkpoints,
                stats.apply,
                stats.commit,
            );
        }
        let rss = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("VmRSS"))
            .map(str::to_owned)
            .unwrap();
        eprintln!("test process after the runs: {rss}");
    }
}
