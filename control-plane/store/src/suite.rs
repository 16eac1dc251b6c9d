//! The storage test suite shared by both backends: every case is an async function over a
//! [`DynStore`], and `store_suite!` turns the list of cases into `#[tokio::test]`s for one
//! backend. Run on the embedded store (temp dir; in both sync modes), a single-member etcd, and (with one member
//! SIGKILLed while writes continue) a 3-member etcd cluster.
//!
//! Revisions are asserted relative to the store's revision at the start of a case (etcd starts
//! at 1, the embedded store at 0).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::embedded::{EmbeddedConfig, EmbeddedStore};
use super::etcd::EtcdStore;
use super::testing::EtcdCluster;
use super::{
    DynStore, Error, Event, EventKind, KeyValue, Result, Revision, Store, StoreExt, TxnOp,
    TxnResult,
};

const WAIT: Duration = Duration::from_secs(20);

/// A backend under test plus whatever must live as long as it (temp dir, etcd processes).
pub(crate) struct Harness {
    pub store: DynStore,
    _guard: Box<dyn std::any::Any + Send>,
}

pub(crate) async fn embedded() -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(dir.path()).expect("open embedded store");
    Harness { store: Arc::new(store), _guard: Box::new(dir) }
}

/// Checkpointing whenever none is running (after almost every commit): most reads come from
/// redb and the frozen layer, not the active one.
pub(crate) async fn embedded_checkpointing() -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = EmbeddedConfig::default().checkpoint_interval(Duration::ZERO);
    let store = EmbeddedStore::open_with(dir.path(), config).expect("open embedded store");
    Harness { store: Arc::new(store), _guard: Box::new(dir) }
}

pub(crate) async fn etcd() -> Harness {
    let cluster = EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("start etcd: {e}"));
    let store = EtcdStore::connect(&cluster.endpoints(), "/skiff-test")
        .await
        .unwrap_or_else(|e| panic!("connect to etcd: {e}"));
    Harness { store: Arc::new(store), _guard: Box::new(cluster) }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// The next `n` events of `stream`, failing the test on an error item or a timeout.
async fn next_events(stream: &mut BoxStream<'static, Result<Event>>, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(WAIT, stream.next()).await {
            Ok(Some(Ok(event))) => out.push(event),
            Ok(Some(Err(e))) => panic!("watch failed after {} events: {e}", out.len()),
            Ok(None) => panic!("watch ended after {} of {n} events", out.len()),
            Err(_) => panic!("timed out after {} of {n} events", out.len()),
        }
    }
    out
}

/// Nothing more arrives within a short while (no duplicate, no stray event).
async fn assert_quiet(stream: &mut BoxStream<'static, Result<Event>>) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
        panic!("expected no more events, got {item:?}");
    }
}

/// The error a watch from `after` fails with (returned by `watch` or as its first item).
async fn watch_error(store: &dyn Store, prefix: &str, after: Revision) -> Error {
    let mut stream = match store.watch(prefix, after).await {
        Err(e) => return e,
        Ok(stream) => stream,
    };
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Err(e))) => e,
        other => panic!("watch from {after} should fail, got {other:?}"),
    }
}

pub(crate) async fn create_get_list(store: DynStore) {
    let base = store.current_revision().await.unwrap();
    let a = store.create("/pods/ns/b", b("B")).await.unwrap();
    assert_eq!((a.create_revision, a.mod_revision), (base + 1, base + 1));
    assert_eq!(a.value, b("B"));
    store.create("/pods/ns/a", b("A")).await.unwrap();
    store.create("/pods/other/c", b("C")).await.unwrap();
    store.create("/services/ns/s", b("S")).await.unwrap();
    assert_eq!(store.current_revision().await.unwrap(), base + 4);

    let got = store.get("/pods/ns/b").await.unwrap().expect("present");
    assert_eq!(got, a);
    assert_eq!(store.get("/pods/ns/zzz").await.unwrap(), None);
    assert_eq!(store.get("/pods/ns").await.unwrap(), None, "a prefix is not a key");

    let pods = store.list("/pods/").await.unwrap();
    let keys: Vec<_> = pods.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/pods/ns/a", "/pods/ns/b", "/pods/other/c"], "sorted, prefix only");
    assert_eq!(pods.revision, base + 4);
    assert_eq!(pods.kvs[0].value, b("A"));
    assert_eq!(pods.kvs[0].mod_revision, base + 2);
    let ns = store.list("/pods/ns/").await.unwrap();
    assert_eq!(ns.kvs.len(), 2);
    assert!(store.list("/nothing/").await.unwrap().kvs.is_empty());
    let all = store.list("").await.unwrap();
    assert_eq!(all.kvs.len(), 4);
}

pub(crate) async fn list_many_keys_pages(store: DynStore) {
    // More than one etcd page (500), read at one revision.
    let ops: Vec<_> =
        (0..1200).map(|i| TxnOp::Create { key: format!("/many/{i:05}"), value: b("v") }).collect();
    for chunk in ops.chunks(100) {
        store.txn(chunk.to_vec()).await.unwrap();
    }
    let listed = store.list("/many/").await.unwrap();
    assert_eq!(listed.kvs.len(), 1200);
    assert!(listed.kvs.windows(2).all(|w| w[0].key < w[1].key));
    assert_eq!(listed.revision, store.current_revision().await.unwrap());
}

pub(crate) async fn create_existing_fails(store: DynStore) {
    store.create("/k", b("1")).await.unwrap();
    let rev = store.current_revision().await.unwrap();
    match store.create("/k", b("2")).await {
        Err(Error::AlreadyExists { key }) => assert_eq!(key, "/k"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(store.current_revision().await.unwrap(), rev, "a failed txn takes no revision");
    assert_eq!(store.get("/k").await.unwrap().unwrap().value, b("1"));
}

pub(crate) async fn update_is_compare_and_swap(store: DynStore) {
    let created = store.create("/k", b("1")).await.unwrap();
    let updated = store.update("/k", b("2"), created.mod_revision).await.unwrap();
    assert_eq!(updated.create_revision, created.create_revision);
    assert_eq!(updated.mod_revision, created.mod_revision + 1);
    assert_eq!(updated.value, b("2"));
    match store.update("/k", b("3"), created.mod_revision).await {
        Err(Error::Conflict { key, expected, actual }) => {
            assert_eq!(
                (key.as_str(), expected, actual),
                ("/k", created.mod_revision, updated.mod_revision)
            );
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get("/k").await.unwrap().unwrap(), updated);
    match store.update("/missing", b("x"), 0).await {
        Err(Error::NotFound { key }) => assert_eq!(key, "/missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match store.update("/missing", b("x"), updated.mod_revision).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_eq!(store.get("/missing").await.unwrap(), None);
}

pub(crate) async fn delete_with_and_without_precondition(store: DynStore) {
    let a = store.create("/a", b("A")).await.unwrap();
    let c = store.create("/c", b("C")).await.unwrap();
    match store.delete("/a", Some(a.mod_revision + 100)).await {
        Err(Error::Conflict { actual, .. }) => assert_eq!(actual, a.mod_revision),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(store.get("/a").await.unwrap().is_some());
    let deleted = store.delete("/a", Some(a.mod_revision)).await.unwrap();
    assert_eq!(deleted, a, "delete returns the value it removed");
    assert_eq!(store.get("/a").await.unwrap(), None);
    let deleted = store.delete("/c", None).await.unwrap();
    assert_eq!(deleted, c);
    match store.delete("/c", None).await {
        Err(Error::NotFound { key }) => assert_eq!(key, "/c"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // Re-creating a deleted key starts a new life (new create revision).
    let again = store.create("/a", b("A2")).await.unwrap();
    assert!(again.create_revision > a.create_revision);
}

pub(crate) async fn txn_is_atomic(store: DynStore) {
    let x = store.create("/x", b("x")).await.unwrap();
    let y = store.create("/y", b("y")).await.unwrap();
    let rev = store.current_revision().await.unwrap();

    // One failing precondition: nothing applied, the failure reported, no revision taken.
    let failing = vec![
        TxnOp::Create { key: "/new".into(), value: b("n") },
        TxnOp::Update { key: "/x".into(), value: b("x2"), expected: x.mod_revision },
        TxnOp::Delete { key: "/y".into(), expected: Some(y.mod_revision + 7) },
    ];
    match store.txn(failing).await {
        Err(Error::Conflict { key, .. }) => assert_eq!(key, "/y"),
        other => panic!("expected Conflict on /y, got {other:?}"),
    }
    assert_eq!(store.current_revision().await.unwrap(), rev);
    assert_eq!(store.get("/new").await.unwrap(), None);
    assert_eq!(store.get("/x").await.unwrap().unwrap(), x);
    assert_eq!(store.get("/y").await.unwrap().unwrap(), y);

    // All preconditions hold: everything applied at one shared revision, results in op order.
    let ok = vec![
        TxnOp::Create { key: "/new".into(), value: b("n") },
        TxnOp::Update { key: "/x".into(), value: b("x2"), expected: x.mod_revision },
        TxnOp::Delete { key: "/y".into(), expected: Some(y.mod_revision) },
    ];
    let results = store.txn(ok).await.unwrap();
    let revision = rev + 1;
    assert_eq!(store.current_revision().await.unwrap(), revision);
    assert_eq!(
        results,
        vec![
            TxnResult::Put(KeyValue {
                key: "/new".into(),
                value: b("n"),
                create_revision: revision,
                mod_revision: revision
            }),
            TxnResult::Put(KeyValue {
                key: "/x".into(),
                value: b("x2"),
                create_revision: x.create_revision,
                mod_revision: revision
            }),
            TxnResult::Deleted(y.clone()),
        ]
    );
    assert_eq!(store.get("/y").await.unwrap(), None);

    // The empty transaction is a no-op.
    assert!(store.txn(vec![]).await.unwrap().is_empty());
    assert_eq!(store.current_revision().await.unwrap(), revision);

    // One key twice is refused by both backends.
    let twice = vec![
        TxnOp::Create { key: "/dup".into(), value: b("1") },
        TxnOp::Delete { key: "/dup".into(), expected: None },
    ];
    assert!(matches!(store.txn(twice).await, Err(Error::InvalidTxn { .. })));
    assert_eq!(store.current_revision().await.unwrap(), revision);

    // The watch sees the multi-op transaction as events sharing its revision, in op order.
    let mut watch = store.watch("/", rev).await.unwrap();
    let events = next_events(&mut watch, 3).await;
    assert!(events.iter().all(|e| e.revision == revision));
    assert_eq!(
        events.iter().map(|e| (e.kind, e.kv.key.as_str())).collect::<Vec<_>>(),
        [(EventKind::Put, "/new"), (EventKind::Put, "/x"), (EventKind::Delete, "/y")]
    );
    assert_quiet(&mut watch).await;
}

/// Writes a fixed history and returns the events it must produce.
/// A write over [`super::MAX_REQUEST_BYTES`] is refused whole, as etcd refuses it, and
/// takes no revision; one just under it is stored.
pub(crate) async fn oversized_writes_are_refused(store: DynStore) {
    let rev = store.current_revision().await.unwrap();
    let big = Bytes::from(vec![b'x'; super::MAX_REQUEST_BYTES + 1]);
    match store.create("/big", big.clone()).await {
        Err(Error::TooLarge { limit, .. }) => assert_eq!(limit, super::MAX_REQUEST_BYTES),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let small = store.create("/small", b("s")).await.unwrap();
    match store.update("/small", big, small.mod_revision).await {
        Err(Error::TooLarge { .. }) => {}
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(store.current_revision().await.unwrap(), rev + 1, "only /small took a revision");
    assert_eq!(store.get("/big").await.unwrap(), None);
    // Under the limit with room for etcd's own framing of the request.
    let fits = Bytes::from(vec![b'y'; super::MAX_REQUEST_BYTES - 4096]);
    store.update("/small", fits.clone(), small.mod_revision).await.unwrap();
    assert_eq!(store.get("/small").await.unwrap().unwrap().value, fits);
}

async fn write_history(
    store: &dyn Store,
) -> (Revision, Vec<(EventKind, Revision, String, String, Option<String>)>) {
    let base = store.current_revision().await.unwrap();
    let a = store.create("/w/a", b("a1")).await.unwrap();
    let bb = store.create("/w/b", b("b1")).await.unwrap();
    let a2 = store.update("/w/a", b("a2"), a.mod_revision).await.unwrap();
    store.create("/other/o", b("o1")).await.unwrap();
    store.delete("/w/b", Some(bb.mod_revision)).await.unwrap();
    store.update("/w/a", b("a3"), a2.mod_revision).await.unwrap();
    let expected = vec![
        (EventKind::Put, base + 1, "/w/a".into(), "a1".into(), None),
        (EventKind::Put, base + 2, "/w/b".into(), "b1".into(), None),
        (EventKind::Put, base + 3, "/w/a".into(), "a2".into(), Some("a1".into())),
        (EventKind::Put, base + 4, "/other/o".into(), "o1".into(), None),
        // A delete carries the last value of the key.
        (EventKind::Delete, base + 5, "/w/b".into(), "b1".into(), None),
        (EventKind::Put, base + 6, "/w/a".into(), "a3".into(), Some("a2".into())),
    ];
    (base, expected)
}

fn shape(events: &[Event]) -> Vec<(EventKind, Revision, String, String, Option<String>)> {
    events
        .iter()
        .map(|e| {
            let text = |v: &Bytes| String::from_utf8_lossy(v).into_owned();
            (
                e.kind,
                e.revision,
                e.kv.key.clone(),
                text(&e.kv.value),
                e.prev.as_ref().map(|p| text(&p.value)),
            )
        })
        .collect()
}

pub(crate) async fn watch_replays_history_then_live(store: DynStore) {
    let (base, expected) = write_history(&*store).await;

    // From the start of this case: everything, in order, with previous values.
    let mut from_base = store.watch("", base).await.unwrap();
    let events = next_events(&mut from_base, expected.len()).await;
    assert_eq!(shape(&events), expected);
    let delete = &events[4];
    assert_eq!(
        delete.kv.mod_revision,
        base + 2,
        "a delete event carries the deleted value's revisions"
    );
    let update = &events[2];
    assert_eq!(update.prev.as_ref().unwrap().mod_revision, base + 1);
    assert_eq!(update.kv.create_revision, base + 1);

    // From a mid revision: only what came after it.
    let mut from_mid = store.watch("", base + 3).await.unwrap();
    let events = next_events(&mut from_mid, 3).await;
    assert_eq!(shape(&events), expected[3..].to_vec());

    // From now: nothing until the next write, then exactly that write, on every stream.
    let now = store.current_revision().await.unwrap();
    let mut live = store.watch("", now).await.unwrap();
    assert_quiet(&mut live).await;
    store.create("/w/live", b("l")).await.unwrap();
    for stream in [&mut from_base, &mut from_mid, &mut live] {
        let events = next_events(stream, 1).await;
        assert_eq!((events[0].revision, events[0].kv.key.as_str()), (now + 1, "/w/live"));
        assert_quiet(stream).await;
    }
}

pub(crate) async fn watch_filters_by_prefix(store: DynStore) {
    let (base, expected) = write_history(&*store).await;
    let mut w = store.watch("/w/", base).await.unwrap();
    let want: Vec<_> = expected.into_iter().filter(|e| e.2.starts_with("/w/")).collect();
    assert_eq!(shape(&next_events(&mut w, want.len()).await), want);
    store.create("/other/live", b("x")).await.unwrap();
    store.create("/w/live", b("y")).await.unwrap();
    let events = next_events(&mut w, 1).await;
    assert_eq!(events[0].kv.key, "/w/live");
    assert_quiet(&mut w).await;
    // "/w" as a prefix also matches "/wx" (a plain byte prefix, like etcd).
    let now = store.current_revision().await.unwrap();
    let mut w2 = store.watch("/w", now).await.unwrap();
    store.create("/wx", b("z")).await.unwrap();
    assert_eq!(next_events(&mut w2, 1).await[0].kv.key, "/wx");
}

pub(crate) async fn watch_from_future_revision_fails(store: DynStore) {
    store.create("/f", b("f")).await.unwrap();
    let now = store.current_revision().await.unwrap();
    match watch_error(&*store, "", now + 10).await {
        Error::FutureRevision { requested, current } => {
            assert_eq!((requested, current), (now + 10, now))
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
    // The current revision itself is fine (live only).
    let mut w = store.watch("", now).await.unwrap();
    assert_quiet(&mut w).await;
}

pub(crate) async fn compaction_forgets_history(store: DynStore) {
    let (base, expected) = write_history(&*store).await;
    assert_eq!(store.compacted_revision().await.unwrap(), 0);
    let at = base + 3;
    store.compact(at).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), at);

    match watch_error(&*store, "", base).await {
        Error::Compacted { compacted, .. } => assert_eq!(compacted, at),
        other => panic!("expected Compacted, got {other:?}"),
    }
    match watch_error(&*store, "/w/", at - 1).await {
        Error::Compacted { compacted, .. } => assert_eq!(compacted, at),
        other => panic!("expected Compacted, got {other:?}"),
    }
    // From the compacted revision itself, everything after it is still there.
    let mut w = store.watch("", at).await.unwrap();
    assert_eq!(shape(&next_events(&mut w, 3).await), expected[3..].to_vec());

    // Compaction keeps the current values.
    assert_eq!(store.get("/w/a").await.unwrap().unwrap().value, b("a3"));
    assert_eq!(store.list("/").await.unwrap().kvs.len(), 2);

    // Compacting again at or below is a no-op; beyond the current revision is an error.
    store.compact(at - 1).await.unwrap();
    store.compact(at).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), at);
    let now = store.current_revision().await.unwrap();
    match store.compact(now + 5).await {
        Err(Error::FutureRevision { requested, .. }) => assert_eq!(requested, now + 5),
        other => panic!("expected FutureRevision, got {other:?}"),
    }
    // Up to the current revision: watches from now still work and see new writes.
    store.compact(now).await.unwrap();
    let mut w = store.watch("", now).await.unwrap();
    store.create("/after", b("x")).await.unwrap();
    assert_eq!(next_events(&mut w, 1).await[0].revision, now + 1);
}

/// 64 writers × 50 creates: revisions unique and contiguous, every acknowledged write visible,
/// and a watch started before (and one started in the middle) sees each exactly once in order.
pub(crate) async fn concurrent_writers(store: DynStore) {
    const WRITERS: usize = 64;
    const EACH: usize = 50;
    let base = store.current_revision().await.unwrap();
    let mut early = store.watch("/c/", base).await.unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut acked = Vec::with_capacity(EACH);
                for i in 0..EACH {
                    let key = format!("/c/{w:02}/{i:02}");
                    let kv = store.create(&key, b(&format!("{w}-{i}"))).await.unwrap();
                    acked.push(kv);
                }
                acked
            })
        })
        .collect();
    // A watcher joining mid-way switches from history to live while writes go on.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mid_from = store.current_revision().await.unwrap();
    let mut mid = store.watch("/c/", mid_from).await.unwrap();

    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    let total = WRITERS * EACH;
    let mut revisions: Vec<_> = acked.iter().map(|kv| kv.mod_revision).collect();
    revisions.sort_unstable();
    assert_eq!(revisions, ((base + 1)..=(base + total as Revision)).collect::<Vec<_>>());
    assert_eq!(store.current_revision().await.unwrap(), base + total as Revision);
    let listed: BTreeMap<_, _> =
        store.list("/c/").await.unwrap().kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    for kv in &acked {
        assert_eq!(listed.get(&kv.key), Some(kv), "acknowledged write {} visible", kv.key);
    }

    let events = next_events(&mut early, total).await;
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        ((base + 1)..=(base + total as Revision)).collect::<Vec<_>>(),
        "the early watcher sees every revision once, in order"
    );
    let by_rev: HashSet<_> = acked.iter().map(|kv| (kv.mod_revision, kv.key.clone())).collect();
    assert!(events.iter().all(|e| by_rev.contains(&(e.revision, e.kv.key.clone()))));
    let remaining = (base + total as Revision - mid_from) as usize;
    let events = next_events(&mut mid, remaining).await;
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        ((mid_from + 1)..=(base + total as Revision)).collect::<Vec<_>>(),
        "the mid-way watcher has no gap and no duplicate"
    );
    assert_quiet(&mut early).await;
    assert_quiet(&mut mid).await;
}

/// Generates one `#[tokio::test]` per suite case for a backend.
macro_rules! store_suite {
    ($backend:ident, $harness:path) => {
        mod $backend {
            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        let harness = $harness().await;
                        super::$name(harness.store.clone()).await;
                    }
                };
            }
            case!(create_get_list);
            case!(list_many_keys_pages);
            case!(create_existing_fails);
            case!(update_is_compare_and_swap);
            case!(delete_with_and_without_precondition);
            case!(txn_is_atomic);
            case!(oversized_writes_are_refused);
            case!(watch_replays_history_then_live);
            case!(watch_filters_by_prefix);
            case!(watch_from_future_revision_fails);
            case!(compaction_forgets_history);
            case!(concurrent_writers);
        }
    };
}

store_suite!(embedded_backend, super::embedded);
store_suite!(embedded_checkpointing_backend, super::embedded_checkpointing);
store_suite!(etcd_backend, super::etcd);

/// A 3-member etcd cluster loses its leader (SIGKILL) while 16 writers keep creating: writes
/// keep succeeding through the remaining quorum, nothing acknowledged is lost, and a watch
/// opened before the kill delivers every acknowledged write exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_survives_a_killed_member() {
    let mut cluster =
        EtcdCluster::start(3).await.unwrap_or_else(|e| panic!("start etcd cluster: {e}"));
    let store: DynStore = Arc::new(
        EtcdStore::connect(&cluster.endpoints(), "/skiff-ha")
            .await
            .unwrap_or_else(|e| panic!("connect: {e}")),
    );
    let base = store.current_revision().await.unwrap();
    // Several watch streams, so that some are (very likely) served by the member killed below
    // and must fail over without a gap or a duplicate.
    let mut watches = Vec::new();
    for _ in 0..6 {
        watches.push(store.watch("/ha/", base).await.unwrap());
    }

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut acked, mut failed) = (Vec::new(), 0usize);
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("/ha/{w:02}/{i:05}");
                    i += 1;
                    match store.create(&key, b(&key)).await {
                        Ok(kv) => acked.push(kv),
                        // A transport error on the dead member: the write may or may not
                        // have happened; move on to the next key.
                        Err(Error::Backend { .. }) => {
                            failed += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                (acked, failed)
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(700)).await;
    let before_kill = store.current_revision().await.unwrap();
    // The hardest member to lose: the leader (an election happens under load).
    let leader = cluster.leader().await.expect("the cluster has a leader");
    cluster.kill(leader);
    // Proposals in flight at the followers when the leader died may wait for etcd's request
    // timeout (~6 s); after that, writes must flow again through the two survivors.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_kill_rev = store.current_revision().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.current_revision().await.unwrap() < after_kill_rev + 200 {
        assert!(tokio::time::Instant::now() < deadline, "writes resume after the leader is killed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut acked, mut failed) = (Vec::new(), 0);
    for writer in writers {
        let (a, f) = writer.await.unwrap();
        acked.extend(a);
        failed += f;
    }
    let acked_after_kill = acked.iter().filter(|kv| kv.mod_revision > before_kill).count();
    eprintln!(
        "killed leader m{leader} at revision {before_kill}; {} acknowledged creates, {failed} failed in transport, {acked_after_kill} after the kill",
        acked.len()
    );
    assert!(
        acked.iter().any(|kv| kv.mod_revision > after_kill_rev),
        "writes succeed well after the kill (quorum of 2)"
    );

    let listed: BTreeMap<_, _> =
        store.list("/ha/").await.unwrap().kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    for kv in &acked {
        assert_eq!(listed.get(&kv.key), Some(kv), "acknowledged {} survives", kv.key);
    }
    // Every watch opened before the kill saw every stored key once, in revision order.
    for watch in &mut watches {
        let events = next_events(watch, listed.len()).await;
        assert!(events.windows(2).all(|w| w[0].revision < w[1].revision), "ordered, no duplicate");
        let seen: HashSet<_> = events.iter().map(|e| e.kv.key.clone()).collect();
        assert_eq!(seen.len(), listed.len());
        assert!(listed.keys().all(|k| seen.contains(k)));
        assert_quiet(watch).await;
    }
}

/// Creates/s on a single-member etcd through [`EtcdStore`], for comparison with the embedded
/// store (run with `--ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn bench_etcd_creates() {
    let harness = etcd().await;
    for (callers, per_caller) in [(1usize, 300usize), (64, 100)] {
        let prefix = format!("/bench/{callers}/");
        let result =
            super::bench::creates(harness.store.clone(), &prefix, callers, per_caller, 512)
                .await
                .unwrap();
        eprintln!(
            "etcd creates, {callers} callers: {:.0}/s ({} creates in {:?})",
            result.per_second(),
            result.creates,
            result.elapsed
        );
    }
}
