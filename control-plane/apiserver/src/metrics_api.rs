//! `metrics.k8s.io/v1beta1`: the nodes' and pods' current CPU and memory use, what
//! `kubectl top` and the HorizontalPodAutoscaler read. Upstream serves this group from
//! metrics-server, an aggregated apiserver; skiff-server serves it itself, the same way:
//! - every [`ApiConfig::metric_resolution`] (15 s, metrics-server's default) it scrapes each
//!   node's agent (`GET /metrics/resource` on the kubelet port, with the apiserver's client
//!   certificate), keeping the last two readings of the node and of each container;
//! - CPU is the rate between those two readings (cumulative core-seconds over the time
//!   between their samples, the `window`), memory the latest working set;
//! - reads (get and list of `nodes` and `pods`, with label and field selectors) join those
//!   readings with the Node and Pod objects in the watch cache, whose labels they carry.
//!   Nothing is stored; a node or container seen once has no rate yet and is not listed.
//!
//! [`ApiConfig::metric_resolution`]: crate::config::ApiConfig::metric_resolution

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use axum::response::Response;
use serde_json::{Value, json};

use super::negotiate::Output;
use super::registry::ResourceType;
use super::render::{render_list, render_object};
use super::request::{Query, RequestInfo, Verb};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult};
use crate::kubelet;
use crate::state::State;
use skiff_core::quantity;
use skiff_core::resource_metrics::{self, NodeScrape, Usage};

pub const GROUP: &str = "metrics.k8s.io";

/// How long one node's scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The kubelet's resource metrics path.
const RESOURCE_METRICS_PATH: &str = "/metrics/resource";

/// A container's key: namespace, pod, container.
type ContainerKey = (String, String, String);

/// The last two readings of every node and container, by node.
#[derive(Default)]
pub struct ResourceMetrics {
    nodes: Mutex<HashMap<String, NodePoints>>,
}

#[derive(Default)]
struct NodePoints {
    node: Option<Points>,
    containers: HashMap<ContainerKey, Points>,
}

/// The latest reading and the one before it (when its CPU sample is older).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Points {
    earlier: Option<Usage>,
    latest: Usage,
}

/// Use over a window: what a metrics object reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate {
    cpu_nanocores: u64,
    memory_bytes: u64,
    /// The latest sample's time (ms since the epoch).
    timestamp_ms: i64,
    window_ms: i64,
}

impl Points {
    /// `prev` followed by a new reading. A reading no newer than the latest only refreshes
    /// the memory; an older one (a clock step, a restarted agent) starts over.
    fn then(prev: Option<Points>, new: Usage) -> Points {
        match prev {
            Some(p) if new.cpu_timestamp_ms > p.latest.cpu_timestamp_ms => {
                Points { earlier: Some(p.latest), latest: new }
            }
            Some(p) if new.cpu_timestamp_ms == p.latest.cpu_timestamp_ms => Points {
                earlier: p.earlier,
                latest: Usage {
                    memory_bytes: new.memory_bytes,
                    memory_timestamp_ms: new.memory_timestamp_ms,
                    ..p.latest
                },
            },
            _ => Points { earlier: None, latest: new },
        }
    }

    /// The CPU rate between the two readings; `None` with one reading, or when the counter
    /// went back (the container restarted between them).
    fn rate(&self) -> Option<Rate> {
        let (earlier, latest) = (self.earlier?, self.latest);
        let window_ms = latest.cpu_timestamp_ms - earlier.cpu_timestamp_ms;
        let used = latest.cpu_seconds - earlier.cpu_seconds;
        if window_ms <= 0 || used < 0.0 {
            return None;
        }
        Some(Rate {
            cpu_nanocores: (used / (window_ms as f64 / 1000.0) * 1e9).round() as u64,
            memory_bytes: latest.memory_bytes,
            timestamp_ms: latest.cpu_timestamp_ms,
            window_ms,
        })
    }
}

impl ResourceMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodePoints>> {
        self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A node's new scrape: containers it no longer reports are forgotten.
    fn record(&self, node: &str, scrape: NodeScrape) {
        let mut nodes = self.lock();
        let prev = nodes.remove(node).unwrap_or_default();
        let mut next = NodePoints {
            node: scrape.node.map(|u| Points::then(prev.node, u)),
            containers: HashMap::with_capacity(scrape.containers.len()),
        };
        for c in scrape.containers {
            let key = (c.namespace, c.pod, c.container);
            let points = Points::then(prev.containers.get(&key).copied(), c.usage);
            next.containers.insert(key, points);
        }
        nodes.insert(node.to_string(), next);
    }

    /// Forget a node whose scrape failed, and nodes that are gone.
    fn forget(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|name, _| keep(name));
    }

    fn node(&self, name: &str) -> Option<Rate> {
        self.lock().get(name)?.node?.rate()
    }

    /// The pods every reported container of which has a rate (metrics-server leaves out a
    /// pod with a container just started or restarted), by (namespace, pod); of a pod
    /// reported by two nodes (recreated elsewhere, the old node not yet rescraped), the
    /// newer reading.
    fn pods(&self) -> HashMap<(String, String), BTreeMap<String, Rate>> {
        let mut out: HashMap<(String, String), BTreeMap<String, Rate>> = HashMap::new();
        for points in self.lock().values() {
            let mut by_pod: HashMap<(&str, &str), Option<BTreeMap<String, Rate>>> = HashMap::new();
            for ((ns, pod, container), p) in &points.containers {
                let slot = by_pod.entry((ns, pod)).or_insert_with(|| Some(BTreeMap::new()));
                match (slot.as_mut(), p.rate()) {
                    (Some(containers), Some(rate)) => {
                        containers.insert(container.clone(), rate);
                    }
                    _ => *slot = None,
                }
            }
            for ((ns, pod), containers) in by_pod {
                let Some(containers) = containers else { continue };
                let newest = |c: &BTreeMap<String, Rate>| c.values().map(|r| r.timestamp_ms).max();
                let key = (ns.to_string(), pod.to_string());
                if out.get(&key).is_none_or(|seen| newest(seen) < newest(&containers)) {
                    out.insert(key, containers);
                }
            }
        }
        out
    }
}

/// Scrape every node once: nodes answering are recorded, the others forgotten.
pub(crate) async fn scrape(state: &State, readings: &ResourceMetrics) {
    let Some(client) = state.config.kubelet_client.clone() else { return };
    let Some(nodes_rt) = state.registry.find("", "v1", "nodes") else { return };
    let nodes: Vec<(String, Option<std::net::SocketAddr>)> = state
        .cache
        .resource(nodes_rt)
        .list(&nodes_rt.prefix(), None)
        .iter()
        .map(|o| (o.name.clone(), kubelet::advertised_agent(&o.value())))
        .collect();
    let scrapes = futures::future::join_all(nodes.iter().map(|(name, addr)| {
        let client = client.clone();
        async move {
            let addr = addr.ok_or_else(|| {
                "no agent endpoint advertised (an InternalIP or ExternalIP and a kubelet port)"
                    .to_string()
            })?;
            let body = tokio::time::timeout(
                SCRAPE_TIMEOUT,
                kubelet::fetch(&client, addr, RESOURCE_METRICS_PATH),
            )
            .await
            .map_err(|_| format!("timed out after {SCRAPE_TIMEOUT:?}"))?
            .map_err(|e| e.message.clone())?;
            let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
            resource_metrics::parse(text).map_err(|e| e.to_string()).map(|s| (name, s))
        }
    }))
    .await;
    let mut answered = HashSet::new();
    for (result, (name, _)) in scrapes.into_iter().zip(&nodes) {
        match result {
            Ok((name, scrape)) => {
                readings.record(name, scrape);
                answered.insert(name.as_str());
            }
            Err(error) => {
                tracing::debug!(node = %name, %error, "scraping the node's resource metrics")
            }
        }
    }
    readings.forget(|name| answered.contains(name));
}

/// get and list of `nodes` and `pods`.
pub(crate) fn serve(
    state: &State,
    readings: &ResourceMetrics,
    rt: &ResourceType,
    info: &RequestInfo,
    query: &Query,
    output: Output,
) -> ApiResult<Response> {
    let (verb, ns, name) = (info.verb, info.namespace.as_deref(), info.name.as_deref());
    let nodes = rt.plural() == "nodes";
    let (labels, fields) = match (verb, name) {
        (Verb::Get, Some(_)) => {
            (LabelSelector::parse("")?, FieldSelector::parse("", |_| true, "")?)
        }
        (Verb::List, None) => (
            LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?,
            FieldSelector::parse(
                query.get("fieldSelector").unwrap_or(""),
                |f| f == "metadata.name" || (!nodes && f == "metadata.namespace"),
                rt.plural(),
            )?,
        ),
        (verb, _) => return Err(ApiError::method_not_allowed(verb.as_str())),
    };
    let source_rt = state
        .registry
        .find("", "v1", rt.plural())
        .ok_or_else(|| ApiError::internal(format!("{} are not served", rt.plural())))?;
    let prefix = match name {
        Some(name) => source_rt.key(ns, name),
        None => source_rt.namespace_prefix(ns),
    };
    let objects = state.cache.resource(source_rt).list(&prefix, None);
    let containers = (!nodes).then(|| readings.pods());
    let mut items = Vec::new();
    for o in objects.iter() {
        if name.is_some_and(|n| n != o.name) {
            continue;
        }
        let selectable =
            [("metadata.name", o.name.clone()), ("metadata.namespace", o.namespace.clone())];
        if !labels.matches(&o.labels) || !fields.matches(&selectable) {
            continue;
        }
        let labels = o.labels.to_map();
        let item = match &containers {
            None => readings.node(&o.name).map(|r| node_metrics(&o.name, labels, r)),
            Some(c) => c
                .get(&(o.namespace.clone(), o.name.clone()))
                .map(|containers| pod_metrics(&o.namespace, &o.name, labels, containers)),
        };
        items.extend(item);
    }
    match name {
        Some(name) => {
            // metrics-server's NotFound: `podmetrics.metrics.k8s.io "default/web"`.
            let mut obj = items.pop().ok_or_else(|| {
                let (resource, shown) = match ns {
                    Some(ns) => ("podmetrics.metrics.k8s.io", format!("{ns}/{name}")),
                    None => ("nodemetrics.metrics.k8s.io", name.to_string()),
                };
                ApiError::not_found(resource, &shown).with_details(rt.group(), rt.plural(), name)
            })?;
            if let Some(o) = obj.as_object_mut() {
                o.insert("kind".into(), json!(rt.kind()));
                o.insert("apiVersion".into(), json!(rt.desc.api_version()));
            }
            Ok(render_object(rt, obj, output))
        }
        None => Ok(render_list(rt, items, output)),
    }
}

fn node_metrics(name: &str, labels: BTreeMap<String, String>, rate: Rate) -> Value {
    json!({
        "metadata": {"name": name, "creationTimestamp": skiff_core::time::now_rfc3339(), "labels": labels},
        "timestamp": time(rate.timestamp_ms),
        "window": go_duration(rate.window_ms),
        "usage": usage(rate),
    })
}

fn pod_metrics(
    ns: &str,
    name: &str,
    labels: BTreeMap<String, String>,
    containers: &BTreeMap<String, Rate>,
) -> Value {
    // The pod's time and window are its earliest container's, as metrics-server reports
    // them.
    let earliest = containers.values().min_by_key(|r| r.timestamp_ms).copied();
    let (timestamp, window) = earliest.map_or((0, 0), |r| (r.timestamp_ms, r.window_ms));
    json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": skiff_core::time::now_rfc3339(),
            "labels": labels},
        "timestamp": time(timestamp),
        "window": go_duration(window),
        "containers": containers
            .iter()
            .map(|(name, rate)| json!({"name": name, "usage": usage(*rate)}))
            .collect::<Vec<_>>(),
    })
}

/// CPU in nanocores and memory in bytes, in upstream's canonical quantity form (`12345n`,
/// `5m`, `10240Ki`).
fn usage(rate: Rate) -> Value {
    json!({"cpu": cpu_quantity(rate.cpu_nanocores), "memory": memory_quantity(rate.memory_bytes)})
}

use quantity::{from_bytes as memory_quantity, from_nanocores as cpu_quantity};

fn time(ms: i64) -> String {
    skiff_core::time::rfc3339_seconds(
        jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
    )
}

/// A duration as Go's `time.Duration.String()` writes it (`metav1.Duration`): `15.034s`,
/// `1m0s`, `500ms`.
fn go_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_core::resource_metrics::ContainerUsage;

    fn usage(cpu: f64, memory: u64, ts: i64) -> Usage {
        Usage::sampled_at(cpu, memory, ts)
    }

    fn scrape(node: Usage, containers: &[(&str, Usage)]) -> NodeScrape {
        NodeScrape {
            node: Some(node),
            containers: containers
                .iter()
                .map(|(name, u)| ContainerUsage {
                    namespace: "default".into(),
                    pod: "web".into(),
                    container: name.to_string(),
                    usage: *u,
                })
                .collect(),
            scrape_error: false,
        }
    }

    #[test]
    fn rates_need_two_readings() {
        let m = ResourceMetrics::default();
        m.record("n1", scrape(usage(100.0, 1 << 30, 10_000), &[("app", usage(1.0, 4096, 10_000))]));
        assert_eq!(m.node("n1"), None);
        assert!(m.pods().is_empty());
        // 15 s later: the node used 3 core-seconds (200m), the container 0.15 (10m).
        m.record(
            "n1",
            scrape(usage(103.0, 2 << 30, 25_000), &[("app", usage(1.15, 8192, 25_000))]),
        );
        let node = m.node("n1").unwrap();
        assert_eq!(
            node,
            Rate {
                cpu_nanocores: 200_000_000,
                memory_bytes: 2 << 30,
                timestamp_ms: 25_000,
                window_ms: 15_000
            }
        );
        let pods = m.pods();
        let app = pods[&("default".to_string(), "web".to_string())]["app"];
        assert_eq!((app.cpu_nanocores, app.memory_bytes), (10_000_000, 8192));
        // A restarted container (counter back to near zero) has no rate until its next
        // reading, and its pod is not listed meanwhile, even with another container's rate.
        m.record(
            "n1",
            scrape(
                usage(104.0, 2 << 30, 40_000),
                &[("app", usage(0.1, 8192, 40_000)), ("side", usage(5.0, 4096, 40_000))],
            ),
        );
        m.record(
            "n1",
            scrape(
                usage(104.0, 2 << 30, 41_000),
                &[("app", usage(0.1, 8192, 40_000)), ("side", usage(5.5, 4096, 41_000))],
            ),
        );
        assert!(m.pods().is_empty());
        // A reading with the same sample time refreshes memory only.
        m.record("n1", scrape(usage(104.0, 3 << 30, 41_000), &[]));
        assert_eq!(m.node("n1").unwrap().memory_bytes, 3 << 30);
        assert_eq!(m.node("n1").unwrap().window_ms, 1_000);
        m.forget(|_| false);
        assert_eq!(m.node("n1"), None);
    }

    #[test]
    fn formats_as_metrics_server() {
        assert_eq!(cpu_quantity(2_263_311), "2263311n");
        assert_eq!(cpu_quantity(5_000_000), "5m");
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(memory_quantity(12_345_678), "12345678");
        assert_eq!(memory_quantity(1_237_548 * 1024), "1237548Ki");
        assert_eq!(memory_quantity(64 << 20), "64Mi");
        assert_eq!(go_duration(15_034), "15.034s");
        assert_eq!(go_duration(15_000), "15s");
        assert_eq!(go_duration(60_000), "1m0s");
        assert_eq!(go_duration(90_500), "1m30.5s");
        assert_eq!(go_duration(500), "500ms");
        assert_eq!(time(1_711_222_222_222), "2024-03-23T19:30:22Z");
    }
}
