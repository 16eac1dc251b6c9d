//! The etcd v3 backend (for HA control planes): the [`Store`] contract mapped onto etcd's
//! KV, Txn, Watch and Compact RPCs through the `etcd-client` crate.
//!
//! Mapping:
//! - every key lives under `prefix` (`prefix + key` in etcd); keys must be UTF-8;
//! - `Create` compares `create_revision == 0`; `Update` compares `version > 0` and
//!   `mod_revision == expected`; `Delete` compares `version > 0` (and `mod_revision == expected`
//!   when given); puts and deletes ask for `prev_kv`. The failure branch reads every key of the
//!   transaction, so the failing precondition is reported without a second round trip;
//! - `list` pages through the range at the revision of its first page, so the result is one
//!   consistent snapshot however large;
//! - `watch(after)` is an etcd watch with `start_revision = after + 1`, `prev_kv` and progress
//!   notifications. If the stream breaks (member died, leader lost: the client sets
//!   `require_leader`), it is re-established on the remaining members from the last delivered
//!   revision (advanced by progress notifications), so consumers see neither a gap nor a
//!   duplicate. Only when no member answers within [`EtcdConfig::watch_retry_for`] does the
//!   stream end with [`Error::Backend`]; consumers resume from the last revision they saw;
//! - a transaction that fails in transport (for instance on a member that just died) is
//!   returned as [`Error::Backend`] and is *not* retried: it may or may not have been applied;
//! - etcd's "required revision has been compacted" becomes [`Error::Compacted`], and "future
//!   revision" becomes [`Error::FutureRevision`]. `compacted_revision` asks etcd (a watch from
//!   revision 1 is answered with the compaction revision).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType,
    GetOptions, KvClient, PutOptions, TxnOpResponse, WatchClient, WatchOptions,
};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    Error, Event, EventKind, KeyValue, ListResult, Result, Revision, Store, TxnOp, TxnResult,
};

/// Connection and paging settings of the etcd backend.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// TCP connect timeout per member. Default 5 s (etcd's clientv3 DialTimeout in the
    /// Kubernetes apiserver is 20 s; on a LAN 5 s is plenty and fails over sooner).
    pub connect_timeout: Duration,
    /// Deadline of one unary request, and how long a read (or a write that never left this
    /// process) is retried while no member can serve it. Default 10 s (above etcd's default
    /// election timeout of 1 s times a few retries, so a leader change does not fail reads).
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive ping interval and timeout: detects a dead member under an idle watch.
    /// Default 10 s / 5 s (the apiserver's etcd keep-alive is 30 s / 10 s; shorter here so a
    /// watch fails over quickly).
    pub keep_alive: (Duration, Duration),
    /// Keys per page of a `list`. Default 500 (Kubernetes' apiserver pages etcd by its
    /// request limit; 500 is kubectl's default chunk size).
    pub list_page: i64,
    /// Largest gRPC response accepted. Default 64 MiB (a page of large objects; etcd's own
    /// request limit is 1.5 MiB per value).
    pub max_message: usize,
    /// How long a broken watch keeps trying to re-establish itself before ending with an
    /// error. Default 30 s.
    pub watch_retry_for: Duration,
    /// Consumer-side buffer of a watch stream, in events. Default 1024.
    pub watch_buffer: usize,
    /// TLS towards etcd (`--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`); `None`:
    /// plain HTTP/2.
    pub tls: Option<EtcdTls>,
}

/// TLS towards etcd: the CA that signed the members' serving certificates and, when etcd
/// asks for one (`--client-cert-auth`), this client's certificate and key. PEM.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").field("client_cert", &self.client.is_some()).finish()
    }
}

impl EtcdTls {
    /// Reads the PEM files (upstream's `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<EtcdTls> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| Error::backend(format!("reading {}", p.display()), e))
        };
        let client = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(Error::backend(
                    "etcd TLS",
                    std::io::Error::other("--etcd-certfile and --etcd-keyfile go together"),
                ));
            }
        };
        Ok(EtcdTls { ca_pem: read(ca)?, client })
    }

    /// The client's TLS settings for etcd-client.
    pub fn tls_options(&self) -> etcd_client::TlsOptions {
        let mut o = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.client {
            o = o.identity(etcd_client::Identity::from_pem(cert, key));
        }
        o
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            keep_alive: (Duration::from_secs(10), Duration::from_secs(5)),
            list_page: 500,
            max_message: 64 << 20,
            watch_retry_for: Duration::from_secs(30),
            watch_buffer: 1024,
            tls: None,
        }
    }
}

/// The etcd backend. Cheap to share behind an `Arc`; one gRPC channel balanced over all
/// endpoints.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    kv: KvClient,
    watch: WatchClient,
    prefix: String,
    config: EtcdConfig,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("prefix", &self.prefix).finish()
    }
}

impl EtcdStore {
    /// Connect to the etcd cluster at `endpoints` (`http://host:port`; a bare `host:port` is
    /// taken as http) storing every key under `prefix`, with the default [`EtcdConfig`].
    /// Fails unless some member answers.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdStore> {
        Self::connect_with(endpoints, prefix, EtcdConfig::default()).await
    }

    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        config: EtcdConfig,
    ) -> Result<EtcdStore> {
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| if e.contains("://") { e.clone() } else { format!("{scheme}://{e}") })
            .collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(config.keep_alive.0, config.keep_alive.1)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls.tls_options());
        }
        let client = Client::connect(&endpoints, Some(options))
            .await
            .map_err(|e| Error::backend(format!("connect to etcd {endpoints:?}"), e))?;
        let kv = client
            .kv_client()
            .max_decoding_message_size(config.max_message)
            .max_encoding_message_size(config.max_message);
        let watch = client.watch_client().max_decoding_message_size(config.max_message);
        let store = EtcdStore { client, kv, watch, prefix: prefix.to_owned(), config };
        store.current_revision().await?;
        tracing::info!(?endpoints, prefix, "connected to etcd");
        Ok(store)
    }

    /// The underlying client (for health checks and maintenance).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn full(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(self.prefix.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue> {
        Ok(KeyValue {
            key: self.strip(kv.key())?,
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
    }

    fn strip(&self, full: &[u8]) -> Result<String> {
        let key = full.strip_prefix(self.prefix.as_bytes()).ok_or_else(|| {
            Error::backend(
                "decode etcd key",
                format!(
                    "key {:?} is outside prefix {}",
                    String::from_utf8_lossy(full),
                    self.prefix
                ),
            )
        })?;
        String::from_utf8(key.to_vec()).map_err(|e| Error::backend("decode etcd key", e))
    }

    async fn get_current(&self) -> Result<Revision> {
        let key = self.full("");
        let response = with_retry(is_unavailable, self.config.request_timeout, || {
            let (mut kv, key) = (self.kv.clone(), key.clone());
            async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
        })
        .await
        .map_err(|e| map_error("read current revision", e))?;
        header_revision(response.header())
    }
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision> {
    header
        .map(|h| h.revision())
        .ok_or_else(|| Error::backend("read etcd response", "response without header"))
}

/// The first key after every key starting with `prefix` (etcd's `GetPrefixRangeEnd`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff (or the prefix is empty): to the end of the keyspace.
    vec![0]
}

fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("required revision has been compacted"))
}

fn is_future(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("required revision is a future revision"))
}

/// Unavailable: the member could not be reached or is not serving (safe to retry a read).
fn is_unavailable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.code() == tonic::Code::Unavailable,
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// The request never left this process (connection refused): safe to retry even a write.
fn is_unsent(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unavailable && s.message().contains("tcp connect error"))
}

/// First pause before a retry; it doubles up to [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF: Duration = Duration::from_millis(25);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Run `call` again while it fails with an error `retry` accepts, with a growing backoff, for
/// at most `retry_for` (a request routed to a dead member fails until the channel knows that
/// member is down; a member without a leader answers "no leader" until an election ends).
/// Bounded by time rather than attempts, like clientv3's retry interceptor, so a leader
/// election under load is waited out instead of failing the request.
async fn with_retry<T, F, Fut>(
    retry: fn(&etcd_client::Error) -> bool,
    retry_for: Duration,
    mut call: F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + retry_for;
    let (mut attempt, mut backoff) = (1u32, RETRY_BACKOFF);
    loop {
        match call().await {
            Err(e) if retry(&e) && tokio::time::Instant::now() + backoff < deadline => {
                tracing::debug!(attempt, error = %e, "etcd request failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                attempt += 1;
            }
            result => return result,
        }
    }
}

fn map_error(context: &str, e: etcd_client::Error) -> Error {
    Error::backend(context.to_owned(), e)
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let full = self.full(key);
        let response = with_retry(is_unavailable, self.config.request_timeout, || {
            let (mut kv, key) = (self.kv.clone(), full.clone());
            async move { kv.get(key, None).await }
        })
        .await
        .map_err(|e| map_error("etcd get", e))?;
        response.kvs().first().map(|kv| self.key_value(kv)).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let full = self.full(prefix);
        let end = prefix_end(&full);
        let mut start = full;
        let mut revision = 0;
        let mut kvs = Vec::new();
        loop {
            let mut options =
                GetOptions::new().with_range(end.clone()).with_limit(self.config.list_page);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let response = with_retry(is_unavailable, self.config.request_timeout, || {
                let (mut kv, key, options) = (self.kv.clone(), start.clone(), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await;
            let response = match response {
                Ok(response) => response,
                Err(e) if is_compacted(&e) => {
                    // Compacted between two pages of this list.
                    let compacted = self.compacted_revision().await?;
                    return Err(Error::Compacted { requested: revision, compacted });
                }
                Err(e) => return Err(map_error("etcd list", e)),
            };
            if revision == 0 {
                revision = header_revision(response.header())?;
            }
            for kv in response.kvs() {
                kvs.push(self.key_value(kv)?);
            }
            match response.kvs().last() {
                Some(last) if response.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(ListResult { kvs, revision })
    }

    async fn txn(&self, ops: Vec<TxnOp>) -> Result<Vec<TxnResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        super::check_distinct_keys(&ops)?;
        let mut compares = Vec::with_capacity(ops.len() * 2);
        let mut then = Vec::with_capacity(ops.len());
        let mut otherwise = Vec::with_capacity(ops.len());
        for op in &ops {
            match op {
                TxnOp::Create { key, value } => {
                    let full = self.full(key);
                    compares.push(Compare::create_revision(full.clone(), CompareOp::Equal, 0));
                    then.push(etcd_client::TxnOp::put(
                        full.clone(),
                        value.to_vec(),
                        Some(PutOptions::new().with_prev_key()),
                    ));
                    otherwise.push(etcd_client::TxnOp::get(full, None));
                }
                TxnOp::Update { key, value, expected } => {
                    let full = self.full(key);
                    compares.push(Compare::version(full.clone(), CompareOp::Greater, 0));
                    compares.push(Compare::mod_revision(full.clone(), CompareOp::Equal, *expected));
                    then.push(etcd_client::TxnOp::put(
                        full.clone(),
                        value.to_vec(),
                        Some(PutOptions::new().with_prev_key()),
                    ));
                    otherwise.push(etcd_client::TxnOp::get(full, None));
                }
                TxnOp::Delete { key, expected } => {
                    let full = self.full(key);
                    compares.push(Compare::version(full.clone(), CompareOp::Greater, 0));
                    if let Some(expected) = expected {
                        compares.push(Compare::mod_revision(
                            full.clone(),
                            CompareOp::Equal,
                            *expected,
                        ));
                    }
                    then.push(etcd_client::TxnOp::delete(
                        full.clone(),
                        Some(DeleteOptions::new().with_prev_key()),
                    ));
                    otherwise.push(etcd_client::TxnOp::get(full, None));
                }
            }
        }
        let txn = etcd_client::Txn::new().when(compares).and_then(then).or_else(otherwise);
        // Retried only if it certainly never reached a member: otherwise it may have been
        // applied, and the caller must decide (a retried create could report AlreadyExists).
        let response = with_retry(is_unsent, self.config.request_timeout, || {
            let (mut kv, txn) = (self.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|e| match e {
            // etcd's ErrGRPCRequestTooLarge (its --max-request-bytes).
            etcd_client::Error::GRpcStatus(s) if s.message().contains("request is too large") => {
                let size = ops.iter().map(|op| op.key().len() + op.value_len()).sum();
                Error::TooLarge { size, limit: super::MAX_REQUEST_BYTES }
            }
            e => map_error("etcd txn", e),
        })?;
        let revision = header_revision(response.header())?;
        let responses = response.op_responses();
        if responses.len() != ops.len() {
            return Err(Error::backend(
                "etcd txn",
                format!("{} responses for {} operations", responses.len(), ops.len()),
            ));
        }
        if !response.succeeded() {
            return Err(self.failed_precondition(&ops, &responses));
        }
        let mut results = Vec::with_capacity(ops.len());
        for (op, response) in ops.into_iter().zip(responses) {
            match (op, response) {
                (
                    TxnOp::Create { key, value } | TxnOp::Update { key, value, .. },
                    TxnOpResponse::Put(put),
                ) => {
                    let create_revision = match put.prev_key() {
                        Some(prev) => prev.create_revision(),
                        None => revision,
                    };
                    results.push(TxnResult::Put(KeyValue {
                        key,
                        value,
                        create_revision,
                        mod_revision: revision,
                    }));
                }
                (TxnOp::Delete { key, .. }, TxnOpResponse::Delete(delete)) => {
                    let prev = delete.prev_kvs().first().ok_or_else(|| {
                        Error::backend(
                            "etcd txn",
                            format!("delete of {key} returned no previous value"),
                        )
                    })?;
                    results.push(TxnResult::Deleted(self.key_value(prev)?));
                }
                (op, response) => {
                    return Err(Error::backend(
                        "etcd txn",
                        format!("unexpected response {response:?} to {op:?}"),
                    ));
                }
            }
        }
        Ok(results)
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.get_current().await
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let after = after.max(0);
        // A read at revision `after` fails exactly when our contract says the watch must:
        // below the compaction (etcd would still start a watch at compacted + 1) or in the
        // future.
        if let Some(error) = self.check_revision(after).await? {
            return Ok(stream::once(async move { Err(error) }).boxed());
        }
        let (tx, rx) = mpsc::channel(self.config.watch_buffer.max(1));
        let watcher =
            EtcdWatcher { store: self.clone(), full_prefix: self.full(prefix), last: after, tx };
        tokio::spawn(watcher.run());
        Ok(ReceiverStream::new(rx).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let result =
            self.kv.clone().compact(revision, Some(CompactionOptions::new().with_physical())).await;
        match result {
            Ok(_) => Ok(()),
            // Already compacted at or past `revision`: nothing to do (same as embedded).
            Err(e) if is_compacted(&e) => Ok(()),
            Err(e) if is_future(&e) => Err(Error::FutureRevision {
                requested: revision,
                current: self.get_current().await?,
            }),
            Err(e) => Err(map_error("etcd compact", e)),
        }
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        // etcd does not report its compaction revision directly. A read at revision 1 succeeds
        // unless history has been compacted past 1; if it has, a watch from revision 1 is
        // cancelled with the compaction revision.
        match self.read_at(1).await {
            Ok(()) => return Ok(0),
            Err(e) if is_compacted(&e) => {}
            Err(e) => return Err(map_error("etcd compaction probe", e)),
        }
        let key = self.full("\u{0}compaction-probe");
        let options = WatchOptions::new().with_start_revision(1);
        let probe = async {
            let mut stream = self
                .watch
                .clone()
                .watch(key, Some(options))
                .await
                .map_err(|e| map_error("etcd compaction probe", e))?;
            loop {
                match stream.message().await.map_err(|e| map_error("etcd compaction probe", e))? {
                    Some(r) if r.compact_revision() > 0 => return Ok(r.compact_revision()),
                    Some(r) if r.canceled() => {
                        return Err(Error::backend(
                            "etcd compaction probe",
                            format!("watch cancelled: {}", r.cancel_reason()),
                        ));
                    }
                    // Created, or progress: keep waiting for the compaction notice.
                    Some(_) => {}
                    None => return Err(Error::backend("etcd compaction probe", "watch closed")),
                }
            }
        };
        tokio::time::timeout(self.config.request_timeout, probe)
            .await
            .map_err(|e| Error::backend("etcd compaction probe", e))?
    }
}

impl EtcdStore {
    /// A count-only read at `revision`.
    async fn read_at(&self, revision: Revision) -> std::result::Result<(), etcd_client::Error> {
        let key = self.full("");
        let options = GetOptions::new().with_count_only().with_revision(revision);
        with_retry(is_unavailable, self.config.request_timeout, || {
            let (mut kv, key, options) = (self.kv.clone(), key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
        .map(|_| ())
    }

    /// `Some(error)` if `revision` is compacted or in the future (0 is always valid).
    async fn check_revision(&self, revision: Revision) -> Result<Option<Error>> {
        if revision == 0 {
            return Ok(None);
        }
        match self.read_at(revision).await {
            Ok(_) => Ok(None),
            Err(e) if is_future(&e) => Ok(Some(Error::FutureRevision {
                requested: revision,
                current: self.get_current().await?,
            })),
            Err(e) if is_compacted(&e) => {
                let compacted = self.compacted_revision().await?;
                Ok(Some(Error::Compacted { requested: revision, compacted }))
            }
            Err(e) => Err(map_error("etcd read at revision", e)),
        }
    }

    /// The error of the first operation whose precondition failed, from the failure branch's
    /// reads (which saw the same state the compares did).
    fn failed_precondition(&self, ops: &[TxnOp], responses: &[TxnOpResponse]) -> Error {
        for (op, response) in ops.iter().zip(responses) {
            let TxnOpResponse::Get(get) = response else { continue };
            let current = get.kvs().first();
            match (op, current) {
                (TxnOp::Create { key, .. }, Some(_)) => {
                    return Error::AlreadyExists { key: key.clone() };
                }
                (TxnOp::Update { key, .. } | TxnOp::Delete { key, .. }, None) => {
                    return Error::NotFound { key: key.clone() };
                }
                (TxnOp::Update { key, expected, .. }, Some(kv))
                | (TxnOp::Delete { key, expected: Some(expected) }, Some(kv))
                    if kv.mod_revision() != *expected =>
                {
                    return Error::Conflict {
                        key: key.clone(),
                        expected: *expected,
                        actual: kv.mod_revision(),
                    };
                }
                _ => {}
            }
        }
        Error::backend("etcd txn", "transaction failed but every precondition holds")
    }
}

/// The task behind one watch stream: follows etcd, re-establishing the watch after failures.
struct EtcdWatcher {
    store: EtcdStore,
    full_prefix: Vec<u8>,
    /// Every change up to this revision has been delivered.
    last: Revision,
    tx: mpsc::Sender<Result<Event>>,
}

/// Why one etcd watch stream ended.
enum StreamEnd {
    /// The consumer dropped the stream.
    Dropped,
    /// Final error for the consumer.
    Fatal(Error),
    /// Broken stream: re-establish it.
    Broken(String),
}

impl EtcdWatcher {
    async fn run(mut self) {
        let mut broken_since: Option<tokio::time::Instant> = None;
        let mut backoff = Duration::from_millis(50);
        loop {
            let last_before = self.last;
            let consumer = self.tx.clone();
            let end = tokio::select! {
                _ = consumer.closed() => StreamEnd::Dropped,
                end = self.follow() => end,
            };
            match end {
                StreamEnd::Dropped => return,
                StreamEnd::Fatal(error) => {
                    let _ = self.tx.send(Err(error)).await;
                    return;
                }
                StreamEnd::Broken(reason) => {
                    if self.last > last_before {
                        broken_since = None;
                        backoff = Duration::from_millis(50);
                    }
                    let since = *broken_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > self.store.config.watch_retry_for {
                        let _ = self
                            .tx
                            .send(Err(Error::backend(
                                format!("etcd watch after revision {}", self.last),
                                reason,
                            )))
                            .await;
                        return;
                    }
                    tracing::debug!(last = self.last, %reason, "etcd watch broken; re-establishing");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    async fn follow(&mut self) -> StreamEnd {
        let options = WatchOptions::new()
            .with_range(prefix_end(&self.full_prefix))
            .with_start_revision(self.last + 1)
            .with_prev_key()
            .with_progress_notify();
        let mut stream =
            match self.store.watch.clone().watch(self.full_prefix.clone(), Some(options)).await {
                Ok(stream) => stream,
                Err(e) => return StreamEnd::Broken(format!("open watch: {e}")),
            };
        loop {
            let response = match stream.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return StreamEnd::Broken("watch stream closed by etcd".into()),
                Err(e) => return StreamEnd::Broken(format!("watch stream: {e}")),
            };
            if response.compact_revision() > 0 {
                return StreamEnd::Fatal(Error::Compacted {
                    requested: self.last,
                    compacted: response.compact_revision(),
                });
            }
            if response.canceled() {
                // E.g. "no leader" on a member cut off from the quorum: try another.
                return StreamEnd::Broken(format!("watch cancelled: {}", response.cancel_reason()));
            }
            if response.created() {
                continue;
            }
            if response.events().is_empty() {
                // Progress notification: everything up to the header revision has been sent.
                if let Some(header) = response.header() {
                    self.last = self.last.max(header.revision());
                }
                continue;
            }
            // All events of one revision arrive in one response (etcd batches whole
            // revisions), so `last` advances per response.
            let floor = self.last;
            for event in response.events() {
                let event = match self.map_event(event) {
                    Ok(event) => event,
                    Err(error) => return StreamEnd::Fatal(error),
                };
                if event.revision <= floor {
                    // Already delivered before a reconnect.
                    continue;
                }
                let revision = event.revision;
                if self.tx.send(Ok(event)).await.is_err() {
                    return StreamEnd::Dropped;
                }
                self.last = self.last.max(revision);
            }
        }
    }

    fn map_event(&self, event: &etcd_client::Event) -> Result<Event> {
        let kv = event
            .kv()
            .ok_or_else(|| Error::backend("decode etcd event", "event without key-value"))?;
        let revision = kv.mod_revision();
        match event.event_type() {
            EventType::Put => Ok(Event {
                kind: EventKind::Put,
                revision,
                kv: self.store.key_value(kv)?,
                prev: event.prev_kv().map(|p| self.store.key_value(p)).transpose()?,
            }),
            EventType::Delete => {
                let last = match event.prev_kv() {
                    Some(prev) => self.store.key_value(prev)?,
                    None => {
                        tracing::warn!(revision, "etcd delete event without its previous value");
                        KeyValue {
                            key: self.store.strip(kv.key())?,
                            value: Bytes::new(),
                            create_revision: 0,
                            mod_revision: 0,
                        }
                    }
                };
                Ok(Event { kind: EventKind::Delete, revision, kv: last, prev: None })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"/a"), b"/b".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
