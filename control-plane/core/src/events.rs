//! Kubernetes Events (core/v1) for what users should see in `kubectl describe`, written by
//! every component through the API, through client-go's event correlator:
//! - repeats of the same event (same object, type, reason and message) bump `count` and
//!   `lastTimestamp` of the existing Event instead of creating a new one;
//! - more than 10 different messages for the same object, type and reason within 10 minutes
//!   are aggregated into one Event "(combined from similar events): <latest message>";
//! - a spam filter per (component, object): a token bucket of 25 events refilled with one
//!   every 5 minutes; events beyond it are dropped.
//!
//! Writing is asynchronous, as client-go's broadcaster: `record` decides at once and queues
//! the write (at most [`QUEUE_LEN`] waiting, beyond that events are dropped and counted);
//! a background task writes with [`WRITERS`] requests in flight, so recording never waits
//! for the API. (Measured with `cargo xtask bench scheduler`: this alone does not raise the
//! scheduler's throughput; each Event still costs the apiserver about as much as a binding.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Client, Resource};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Event type: "Normal" or "Warning".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// client-go's defaults (`record.CorrelatorOptions`).
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// Entries kept per cache before pruning (client-go's LRU size).
const CACHE_SIZE: usize = 4096;
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";
/// Events waiting to be written before new ones are dropped (client-go keeps 1000).
pub const QUEUE_LEN: usize = 10_000;
/// Event writes in flight (client-go writes one at a time per sink).
pub const WRITERS: usize = 4;

/// What the correlator decided for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Dropped by the spam filter.
    Skip,
    /// Create a new Event with this name, message and count.
    Create { name: String, message: String },
    /// Bump the existing Event `name` to `count` (with this message).
    Bump { name: String, message: String, count: i32 },
}

/// A token bucket (client-go's spam filter uses `flowcontrol.NewTokenBucketRateLimiter`).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        self.tokens = (self.tokens + earned).min(SPAM_BURST);
        self.at = now;
    }
}

/// (namespace, object uid or name, component): whose events one spam bucket limits.
type SpamKey = (String, String, String);
/// (namespace, object, type, reason): events that aggregate when messages differ.
type AggregateKey = (String, String, EventType, String);

#[derive(Debug)]
struct Aggregate {
    messages: HashSet<String>,
    last: Instant,
}

#[derive(Debug, Clone)]
struct Observed {
    name: String,
    count: i32,
}

/// client-go's `EventCorrelator` (aggregator → dedup logger → spam filter), on tokio's
/// clock so paused-time tests can step over the windows.
#[derive(Debug, Default)]
pub struct Correlator {
    spam: HashMap<SpamKey, Bucket>,
    aggregates: HashMap<AggregateKey, Aggregate>,
    /// Aggregate key plus the message (or `None` for the combined event) → the Event.
    observed: HashMap<(AggregateKey, Option<String>), Observed>,
    seq: u64,
}

/// Who reports an event, about which object: the correlator's keys.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The reporting component (`scheduler`, `kubelet`).
    pub component: &'a str,
    pub namespace: &'a str,
    /// The object's uid, or its kind/name when it has none.
    pub object: &'a str,
    /// What a created Event is named after (the object's name).
    pub base: &'a str,
}

impl Correlator {
    /// Decide what to write for an event about `subject`.
    pub fn correlate(
        &mut self,
        subject: Subject<'_>,
        kind: EventType,
        reason: &str,
        message: &str,
        now: Instant,
    ) -> Outcome {
        let Subject { component, namespace, object, base } = subject;
        self.prune(now);
        // Aggregation: the 10th distinct message within the window switches to the
        // combined event.
        let agg_key: AggregateKey =
            (namespace.to_string(), object.to_string(), kind, reason.to_string());
        let agg = self
            .aggregates
            .entry(agg_key.clone())
            .or_insert_with(|| Aggregate { messages: HashSet::new(), last: now });
        if now.duration_since(agg.last) > AGGREGATE_WINDOW {
            agg.messages.clear();
        }
        agg.last = now;
        agg.messages.insert(message.to_string());
        let (local, message) = if agg.messages.len() < AGGREGATE_MAX_EVENTS {
            (Some(message.to_string()), message.to_string())
        } else {
            (None, format!("{AGGREGATE_PREFIX}{message}"))
        };
        // Spam filter: every event, new or repeated, takes a token.
        let bucket = self
            .spam
            .entry((namespace.to_string(), object.to_string(), component.to_string()))
            .or_insert(Bucket { tokens: SPAM_BURST, at: now });
        bucket.refill(now);
        if bucket.tokens < 1.0 {
            return Outcome::Skip;
        }
        bucket.tokens -= 1.0;
        // Dedup: the same event again bumps the count of the one written before.
        match self.observed.get_mut(&(agg_key.clone(), local.clone())) {
            Some(o) => {
                o.count = o.count.saturating_add(1);
                Outcome::Bump { name: o.name.clone(), message, count: o.count }
            }
            None => {
                self.seq += 1;
                let name = event_name(base, self.seq);
                self.observed.insert((agg_key, local), Observed { name: name.clone(), count: 1 });
                Outcome::Create { name, message }
            }
        }
    }

    /// The Event `name` is gone (expired): the next repeat creates a new one.
    fn forget(&mut self, name: &str) {
        self.observed.retain(|_, o| o.name != name);
    }

    /// Keep the caches bounded: drop what no longer changes a decision (full buckets,
    /// aggregates past their window), then, if still too big, start over.
    fn prune(&mut self, now: Instant) {
        if self.spam.len() > CACHE_SIZE {
            self.spam.retain(|_, b| {
                let mut b2 = *b;
                b2.refill(now);
                b2.tokens < SPAM_BURST
            });
            if self.spam.len() > CACHE_SIZE {
                self.spam.clear();
            }
        }
        if self.aggregates.len() > CACHE_SIZE {
            self.aggregates.retain(|_, a| now.duration_since(a.last) <= AGGREGATE_WINDOW);
            if self.aggregates.len() > CACHE_SIZE {
                self.aggregates.clear();
            }
        }
        if self.observed.len() > CACHE_SIZE {
            self.observed.clear();
        }
    }
}

/// `<object>.<unique hex>`, as client-go names Events.
fn event_name(base: &str, seq: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    format!("{base}.{:x}", nanos.wrapping_add(seq))
}

/// One queued Event write.
struct Write {
    reference: ObjectReference,
    namespace: String,
    kind: EventType,
    reason: String,
    outcome: Outcome,
    at: Time,
}

/// How a recorder writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Event writes in flight.
    pub writers: usize,
    /// Events waiting to be written before new ones are dropped.
    pub queue_len: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { writers: WRITERS, queue_len: QUEUE_LEN }
    }
}

/// What the writer task shares with the recorder.
struct Sink {
    client: Client,
    component: String,
    host: Option<String>,
    options: WriteOptions,
    correlator: Mutex<Correlator>,
    dropped: AtomicU64,
}

/// Records Events for one component ("default-scheduler", "deployment-controller", ...).
/// Must be created inside a tokio runtime (it spawns its writer task, which ends once the
/// recorder is dropped and its queue is written).
pub struct EventRecorder {
    sink: Arc<Sink>,
    tx: mpsc::Sender<Write>,
}

impl EventRecorder {
    pub fn new(client: Client, component: impl Into<String>) -> Self {
        Self::build(client, component.into(), None, WriteOptions::default())
    }

    /// A recorder with its own write concurrency and queue length (the scheduler writes
    /// one event at a time, as client-go's sink does, so its Scheduled events never take
    /// request slots from its bindings during a burst; they catch up after it).
    pub fn with_options(
        client: Client,
        component: impl Into<String>,
        options: WriteOptions,
    ) -> Self {
        Self::build(client, component.into(), None, options)
    }

    fn build(
        client: Client,
        component: String,
        host: Option<String>,
        options: WriteOptions,
    ) -> Self {
        let sink = Arc::new(Sink {
            client,
            component,
            host,
            options,
            correlator: Mutex::new(Correlator::default()),
            dropped: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel::<Write>(options.queue_len.max(1));
        let writer = sink.clone();
        tokio::spawn(async move {
            tokio_stream::wrappers::ReceiverStream::new(rx)
                .for_each_concurrent(options.writers.max(1), |w| {
                    let sink = writer.clone();
                    async move { sink.write(w).await }
                })
                .await;
        });
        EventRecorder { sink, tx }
    }

    /// Events from a node agent carry the node as `source.host`.
    pub fn with_host(self, host: impl Into<String>) -> Self {
        Self::build(
            self.sink.client.clone(),
            self.sink.component.clone(),
            Some(host.into()),
            self.sink.options,
        )
    }

    /// Events dropped because the write queue was full.
    pub fn dropped(&self) -> u64 {
        self.sink.dropped.load(Ordering::Relaxed)
    }

    /// Record an event about `obj`. Failures are logged, never returned: events are best
    /// effort and must not fail the reconcile that emits them.
    pub async fn record<K>(&self, obj: &K, kind: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = obj.object_ref(&());
        self.record_ref(reference, kind, reason, message).await;
    }

    pub async fn record_ref(
        &self,
        reference: ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        let namespace = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let base = reference.name.clone().unwrap_or_else(|| "object".into());
        let object = reference
            .uid
            .clone()
            .unwrap_or_else(|| format!("{}/{base}", reference.kind.as_deref().unwrap_or_default()));
        let outcome = {
            let mut c = self.sink.correlator.lock().unwrap_or_else(|e| e.into_inner());
            let subject = Subject {
                component: &self.sink.component,
                namespace: &namespace,
                object: &object,
                base: &base,
            };
            c.correlate(subject, kind, reason, message, Instant::now())
        };
        if outcome == Outcome::Skip {
            return;
        }
        let at = Time(k8s_openapi::jiff::Timestamp::now());
        let w = Write { reference, namespace, kind, reason: reason.to_string(), outcome, at };
        if self.tx.try_send(w).is_err() {
            let n = self.sink.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(component = %self.sink.component, dropped = n,
                    "event queue full: events dropped");
            }
        }
    }
}

impl Sink {
    /// One request, its response body read and dropped: the writer needs only the status
    /// code (parsing the returned Event into a typed object cost as much as building it).
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        ct: &str,
        body: Vec<u8>,
    ) -> kube::Result<()> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, ct)
            .body(body)
            .map_err(kube::Error::HttpError)?;
        self.client.request_text(req).await.map(drop)
    }

    async fn write(&self, w: Write) {
        let Write { reference, namespace, kind, reason, outcome, at } = w;
        let (name, message, count) = match outcome {
            Outcome::Skip => return,
            Outcome::Create { name, message } => (name, message, 1),
            Outcome::Bump { name, message, count } => {
                let patch = serde_json::json!({"count": count, "lastTimestamp": at,
                                               "message": message});
                let path = format!("/api/v1/namespaces/{namespace}/events/{name}");
                let body = serde_json::to_vec(&patch).unwrap_or_default();
                match self
                    .send(http::Method::PATCH, &path, "application/merge-patch+json", body)
                    .await
                {
                    Ok(()) => return,
                    // Expired (or not created yet): write it anew under the same name.
                    Err(kube::Error::Api(e)) if e.code == 404 => (name, message, count),
                    Err(e) => {
                        tracing::debug!(error = %e, reason, "updating an event");
                        return;
                    }
                }
            }
        };
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: reference,
            reason: Some(reason.clone()),
            message: Some(message),
            type_: Some(kind.as_str().into()),
            count: Some(count),
            first_timestamp: Some(at.clone()),
            last_timestamp: Some(at),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: self.host.clone(),
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: self.host.clone().or_else(|| Some(self.component.clone())),
            ..Default::default()
        };
        // k8s-openapi writes apiVersion and kind.
        let body = match serde_json::to_vec(&event) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, reason, "encoding an event");
                return;
            }
        };
        let path = format!("/api/v1/namespaces/{namespace}/events");
        match self.send(http::Method::POST, &path, "application/json", body).await {
            Ok(()) => {}
            // A concurrent write of the same event created it first: it is counted.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                tracing::debug!(error = %e, reason, "recording an event");
                self.correlator.lock().unwrap_or_else(|e| e.into_inner()).forget(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(c: &mut Correlator, object: &str, reason: &str, message: &str, now: Instant) -> Outcome {
        let subject = Subject { component: "sched", namespace: "ns", object, base: "p" };
        c.correlate(subject, EventType::Warning, reason, message, now)
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_bump_the_count() {
        let mut c = Correlator::default();
        let t = Instant::now();
        let Outcome::Create { name, message } = rec(&mut c, "u1", "FailedScheduling", "m", t)
        else {
            panic!("first is created")
        };
        assert_eq!(message, "m");
        assert_eq!(
            rec(&mut c, "u1", "FailedScheduling", "m", t),
            Outcome::Bump { name: name.clone(), message: "m".into(), count: 2 }
        );
        assert!(matches!(rec(&mut c, "u2", "FailedScheduling", "m", t), Outcome::Create { .. }));
        assert!(matches!(rec(&mut c, "u1", "Other", "m", t), Outcome::Create { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn spam_filter_allows_a_burst_of_25_then_one_per_5_minutes() {
        let mut c = Correlator::default();
        let t = Instant::now();
        let written = (0..100)
            .filter(|_| rec(&mut c, "u1", "FailedScheduling", "m", t) != Outcome::Skip)
            .count();
        assert_eq!(written, 25);
        // Other objects have their own bucket.
        assert_ne!(rec(&mut c, "u2", "FailedScheduling", "m", t), Outcome::Skip);
        let later = t + Duration::from_secs(301);
        assert!(matches!(
            rec(&mut c, "u1", "FailedScheduling", "m", later),
            Outcome::Bump { count: 26, .. }
        ));
        assert_eq!(rec(&mut c, "u1", "FailedScheduling", "m", later), Outcome::Skip);
    }

    #[tokio::test(start_paused = true)]
    async fn ten_distinct_messages_aggregate() {
        let mut c = Correlator::default();
        let t = Instant::now();
        for i in 0..9 {
            let out = rec(&mut c, "u1", "FailedScheduling", &format!("m{i}"), t);
            assert!(matches!(out, Outcome::Create { .. }), "{i}: {out:?}");
        }
        let Outcome::Create { name, message } = rec(&mut c, "u1", "FailedScheduling", "m9", t)
        else {
            panic!("the combined event is created")
        };
        assert_eq!(message, format!("{AGGREGATE_PREFIX}m9"));
        assert_eq!(
            rec(&mut c, "u1", "FailedScheduling", "m10", t),
            Outcome::Bump { name, message: format!("{AGGREGATE_PREFIX}m10"), count: 2 }
        );
        // After the window, messages are counted afresh.
        let later = t + Duration::from_secs(601);
        let out = rec(&mut c, "u1", "FailedScheduling", "m11", later);
        assert!(matches!(&out, Outcome::Create { message, .. } if message == "m11"), "{out:?}");
    }
}
