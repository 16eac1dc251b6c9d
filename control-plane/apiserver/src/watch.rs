//! Watch responses: a chunked stream of one JSON event per line, from the watch cache.
//! The object of each event was serialized once by the cache; a line is that JSON with the
//! event type around it. Bookmarks keep idle watches alive and carry progress.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::cache::{CacheEvent, EventType, WatchStartError};
use super::list_options::Filter;
use super::negotiate::Output;
use super::negotiate::partial_metadata;
use super::registry::ResourceType;
use super::request::Query;
use super::status::{ApiError, ApiResult};
use super::table;
use crate::state::State;
use skiff_store::Revision;

pub async fn serve(
    state: &Arc<State>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: Option<&str>,
    query: &Query,
    output: Output,
) -> ApiResult<Response> {
    super::list_options::validate_list_options(query, true)?;
    let mut filter = Filter::from_query(rt, ns, query)?;
    if let Some(name) = name {
        // The legacy /watch/<resource>/<name> form watches one object.
        let sel = match query.get("fieldSelector") {
            Some(s) => format!("{s},metadata.name={name}"),
            None => format!("metadata.name={name}"),
        };
        filter.fields =
            super::selectors::FieldSelector::parse(&sel, |f| rt.supports_field(f), rt.plural())?;
    }
    let send_initial = query.flag("sendInitialEvents");
    let from: Option<Revision> = match query.get("resourceVersion") {
        None | Some("0") => None,
        Some(rv) => {
            let rv: Revision = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?;
            if send_initial { None } else { Some(rv) }
        }
    };
    let bookmarks = query.flag("allowWatchBookmarks");
    // Any positive timeout is taken (a deadline past the runtime's range is "never").
    let timeout = match query.int("timeoutSeconds")? {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs()),
        _ => state.config.default_watch_timeout,
    };
    // A watch from a revision the cache has not reached yet waits for it.
    if let Some(rv) = from
        && rv > state.cache.revision()
        && !state.cache.wait_for(rv, Duration::from_secs(3)).await
    {
        return Err(ApiError::too_large_resource_version(rv, state.cache.revision()));
    }
    let prefix = filter.prefix(rt);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let encoder = Encoder {
        rt_kind: rt.kind(),
        api_version: rt.desc.api_version(),
        output,
        table_rt: rt.plural(),
    };
    let ctx = WatchTask {
        state: state.clone(),
        rt: match state.registry.all().iter().position(|t| std::ptr::eq(t, rt)) {
            Some(i) => Watched::Builtin(i),
            None => match state.registry.custom().find(rt.group(), rt.desc.version, rt.plural()) {
                Some(custom) => Watched::Custom(custom),
                None => return Err(ApiError::path_not_found()),
            },
        },
        filter,
        prefix: prefix.clone(),
        encoder,
        bookmarks,
        initial_end: send_initial,
        timeout,
        bookmark_interval: state.config.bookmark_interval,
    };
    match state.cache.resource(rt).subscribe(from, &prefix) {
        Ok(sub) => {
            tokio::spawn(ctx.run(sub.backlog, sub.rx, tx));
        }
        Err(WatchStartError::TooOld { requested, oldest }) => {
            // Older than the cache's window (e.g. a watcher resuming across a restart):
            // serve it from the store's history while that still has the revision.
            match state.store.watch(&prefix, requested).await {
                Ok(events) => {
                    tokio::spawn(ctx.run_from_store(events, tx));
                }
                Err(_) => {
                    // Upstream answers 200 and then an ERROR event with a 410 Status.
                    let status =
                        ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
                            .to_status();
                    let line = line("ERROR", &serde_json::to_vec(&status).unwrap_or_default());
                    let _ = tx.try_send(line);
                    drop(tx);
                }
            }
        }
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(resp)
}

/// `now + timeout`, or the far future when that is past what an `Instant` holds.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    // A century is "never" for a watch; tokio's own far future is about 30 years.
    now.checked_add(timeout.min(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now + Duration::from_secs(86_400 * 365))
}

struct Encoder {
    rt_kind: &'static str,
    api_version: String,
    output: Output,
    table_rt: &'static str,
}

fn line(kind: &str, object: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(object.len() + 32);
    b.put_slice(b"{\"type\":\"");
    b.put_slice(kind.as_bytes());
    b.put_slice(b"\",\"object\":");
    b.put_slice(object);
    b.put_slice(b"}\n");
    b.freeze()
}

/// The resource a watch is of: a built-in one (its registry index) or a custom one (from
/// the registry's snapshot when the watch started).
enum Watched {
    Builtin(usize),
    Custom(Arc<ResourceType>),
}

struct WatchTask {
    state: Arc<State>,
    rt: Watched,
    filter: Filter,
    prefix: String,
    encoder: Encoder,
    bookmarks: bool,
    initial_end: bool,
    timeout: Duration,
    bookmark_interval: Duration,
}

impl WatchTask {
    fn rt(&self) -> &ResourceType {
        match &self.rt {
            Watched::Builtin(i) => &self.state.registry.all()[*i],
            Watched::Custom(rt) => rt,
        }
    }

    /// The line for one event as this watcher sees it (selector transitions become
    /// ADDED/DELETED, as upstream's cacher does), or None when it is filtered out.
    async fn encode(&self, ev: &CacheEvent, first: &mut bool) -> Option<Bytes> {
        if !ev.obj.key.starts_with(&self.prefix) {
            return None;
        }
        let now = self.filter.matches(&ev.obj);
        let before = ev.prev.as_ref().is_some_and(|p| self.filter.matches(p));
        let kind = match (ev.kind, before, now) {
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => EventType::Deleted,
            (EventType::Deleted, _, true) => EventType::Deleted,
            _ => return None,
        };
        match self.encoder.output {
            // A custom object the CRD's webhook fails to convert is an ERROR event (the
            // watch goes on, as upstream's watch of a custom resource does).
            Output::Json => {
                match crate::conversion::json_for_request(&self.state, self.rt(), &ev.obj.json)
                    .await
                {
                    Ok(Some(converted)) => Some(line(kind.as_str(), &converted)),
                    Ok(None) => Some(line(kind.as_str(), &ev.obj.json)),
                    Err(e) => Some(line("ERROR", &serde_json::to_vec(&e.to_status()).ok()?)),
                }
            }
            Output::Table(version) => {
                let obj = ev.obj.value();
                let t = table::table(self.rt(), std::slice::from_ref(&obj), version, None, *first);
                *first = false;
                Some(line(kind.as_str(), &serde_json::to_vec(&t).ok()?))
            }
            Output::Metadata(version) => {
                let m = partial_metadata(&ev.obj.value(), version);
                Some(line(kind.as_str(), &serde_json::to_vec(&m).ok()?))
            }
        }
    }

    fn bookmark(&self, rv: Revision, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = match self.encoder.output {
            Output::Json => (self.encoder.rt_kind.to_string(), self.encoder.api_version.clone()),
            Output::Table(v) => ("Table".to_string(), format!("meta.k8s.io/{v}")),
            Output::Metadata(v) => {
                ("PartialObjectMetadata".to_string(), format!("meta.k8s.io/{v}"))
            }
        };
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        line("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
    }

    async fn run(
        self,
        backlog: Vec<Arc<CacheEvent>>,
        mut rx: broadcast::Receiver<Arc<CacheEvent>>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let _ = self.encoder.table_rt;
        let deadline = deadline_after(self.timeout);
        let mut first = true;
        let mut last_rv: Revision = 0;
        for ev in &backlog {
            last_rv = last_rv.max(ev.rv);
            if let Some(b) = self.encode(ev, &mut first).await
                && tx.send(b).await.is_err()
            {
                return;
            }
        }
        if self.initial_end {
            let rv = self.state.cache.revision().max(last_rv);
            if tx.send(self.bookmark(rv, true)).await.is_err() {
                return;
            }
        }
        let mut ticker = tokio::time::interval(self.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
                _ = ticker.tick(), if self.bookmarks => {
                    // Everything up to `rv` was broadcast before `rv` was published: drain it first.
                    let rv = self.state.cache.revision();
                    loop {
                        match rx.try_recv() {
                            Ok(ev) => {
                                if ev.rv < last_rv { continue; }
                                last_rv = ev.rv;
                                if let Some(b) = self.encode(&ev, &mut first).await
                                    && tx.send(b).await.is_err() { return; }
                            }
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(broadcast::error::TryRecvError::Lagged(_)) => { self.expire(&tx).await; return; }
                            Err(broadcast::error::TryRecvError::Closed) => return,
                        }
                    }
                    if rv > last_rv || last_rv == 0 {
                        last_rv = last_rv.max(rv);
                    }
                    if tx.send(self.bookmark(rv.max(last_rv), false)).await.is_err() { return; }
                }
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv < last_rv { continue; }
                        last_rv = ev.rv;
                        if let Some(b) = self.encode(&ev, &mut first).await
                            && tx.send(b).await.is_err() { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => { self.expire(&tx).await; return; }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }

    /// Serve a watch from the store's own history and live stream (for revisions older
    /// than the watch cache holds).
    async fn run_from_store(
        self,
        mut events: futures::stream::BoxStream<'static, skiff_store::Result<skiff_store::Event>>,
        tx: mpsc::Sender<Bytes>,
    ) {
        use futures::StreamExt;
        let deadline = deadline_after(self.timeout);
        let mut first = true;
        let mut last_rv: Revision = 0;
        let mut ticker = tokio::time::interval(self.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
                _ = ticker.tick(), if self.bookmarks && last_rv > 0 => {
                    if tx.send(self.bookmark(last_rv, false)).await.is_err() { return; }
                }
                item = events.next() => match item {
                    Some(Ok(ev)) => {
                        last_rv = ev.revision;
                        let Some(cache_event) = store_event(self.rt(), ev) else { continue };
                        if let Some(b) = self.encode(&cache_event, &mut first).await
                            && tx.send(b).await.is_err() { return; }
                    }
                    Some(Err(_)) | None => { self.expire(&tx).await; return; }
                }
            }
        }
    }

    /// A watcher too slow for the fan-out is told to start over, as upstream's cacher does.
    async fn expire(&self, tx: &mpsc::Sender<Bytes>) {
        let status: Value =
            ApiError::gone("the watch fell behind and was closed; list and watch again")
                .to_status();
        let _ = tx.send(line("ERROR", &serde_json::to_vec(&status).unwrap_or_default())).await;
    }
}

/// A store event as the cache would have recorded it.
fn store_event(rt: &ResourceType, ev: skiff_store::Event) -> Option<CacheEvent> {
    use super::cache::cached_object;
    use skiff_store::EventKind;
    let (kind, obj, prev) = match ev.kind {
        EventKind::Put => {
            let prev =
                ev.prev.as_ref().and_then(|p| cached_object(rt, p, p.mod_revision)).map(Arc::new);
            let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
            (kind, cached_object(rt, &ev.kv, ev.kv.mod_revision)?, prev)
        }
        EventKind::Delete => {
            let obj = cached_object(rt, &ev.kv, ev.revision)?;
            let prev = cached_object(rt, &ev.kv, ev.kv.mod_revision).map(Arc::new);
            (EventType::Deleted, obj, prev)
        }
    };
    Some(CacheEvent { rv: ev.revision, kind, obj: Arc::new(obj), prev })
}
