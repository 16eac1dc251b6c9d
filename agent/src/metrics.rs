//! The agent's own metrics, with the kubelet's names where the meaning is the same, and its
//! `/healthz` and `/metrics` endpoint (the kubelet's healthz port, 10248, on loopback).
//!
//! - `kubelet_runtime_operations_total`, `kubelet_runtime_operations_errors_total` and
//!   `kubelet_runtime_operations_duration_seconds` by `operation_type` (the CRI method):
//!   every CRI call, measured where every call goes through ([`runtime_operation`]), named
//!   as the kubelet names them (`run_podsandbox`, `create_container`, `pull_image`, ...).
//! - `kubelet_pod_start_duration_seconds`: from the agent first seeing a pod to the pod
//!   running ([`pod_started`]).
//! - `skiff_dns_requests_total` by `result` (local, forwarded, formerr, dropped, overloaded,
//!   tcp_refused) and `skiff_dns_queries_total`: the node-local cluster DNS, read off its
//!   counters at each scrape ([`set_dns_source`]).
//!
//! The registry is process-wide, as the kubelet's: one agent per process.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::dns::DnsStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    operation_type: String,
}

type DnsSource = Arc<dyn Fn() -> DnsStats + Send + Sync>;

struct Metrics {
    registry: Registry,
    operations: Family<Operation, Counter>,
    errors: Family<Operation, Counter>,
    durations: Family<Operation, Histogram>,
    pod_start: Histogram,
}

/// The node DNS's counters, read at scrape time.
#[derive(Default)]
struct DnsCollector {
    source: Mutex<Option<DnsSource>>,
}

impl std::fmt::Debug for DnsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DnsCollector")
    }
}

impl prometheus_client::collector::Collector for DnsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(source) = source else { return Ok(()) };
        let s = source();
        let queries = encoder.encode_descriptor(
            "skiff_dns_queries",
            "Queries the node-local cluster DNS received.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.queries).encode(queries)?;
        let mut requests = encoder.encode_descriptor(
            "skiff_dns_requests",
            "Queries of the node-local cluster DNS by what became of them.",
            None,
            MetricType::Counter,
        )?;
        for (result, v) in [
            ("local", s.local),
            ("forwarded", s.forwarded),
            ("formerr", s.formerr),
            ("dropped", s.dropped),
            ("overloaded", s.overloaded),
            ("tcp_refused", s.tcp_refused),
        ] {
            let labels = [("result", result)];
            ConstCounter::new(v).encode(requests.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

static DNS: LazyLock<Arc<DnsCollector>> = LazyLock::new(Default::default);

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::default();
    let operations = Family::<Operation, Counter>::default();
    registry.register(
        "kubelet_runtime_operations",
        "Cumulative number of runtime operations by operation type.",
        operations.clone(),
    );
    let errors = Family::<Operation, Counter>::default();
    registry.register(
        "kubelet_runtime_operations_errors",
        "Cumulative number of runtime operation errors by operation type.",
        errors.clone(),
    );
    // The kubelet's buckets: from 5 ms, by 2.5 each.
    let durations = Family::<Operation, Histogram>::new_with_constructor(|| {
        Histogram::new(exponential_buckets(0.005, 2.5, 14))
    });
    registry.register(
        "kubelet_runtime_operations_duration_seconds",
        "Duration in seconds of runtime operations by operation type.",
        durations.clone(),
    );
    let pod_start = Histogram::new([
        0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
        900.0, 1200.0, 1800.0, 2700.0, 3600.0,
    ]);
    registry.register(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from the agent seeing a pod for the first time to the pod running.",
        pod_start.clone(),
    );
    registry.register_collector(Box::new(DNS.clone()));
    Metrics { registry, operations, errors, durations, pod_start }
});

/// Records one CRI call (`operation` is its method, `run_pod_sandbox`, ...).
pub fn runtime_operation(operation: &str, took: Duration, ok: bool) {
    let m = &*METRICS;
    let op = Operation { operation_type: operation.to_string() };
    m.operations.get_or_create(&op).inc();
    if !ok {
        m.errors.get_or_create(&op).inc();
    }
    m.durations.get_or_create(&op).observe(took.as_secs_f64());
}

/// Records a pod's start: `took` from first seeing it to it running.
pub fn pod_started(took: Duration) {
    METRICS.pod_start.observe(took.as_secs_f64());
}

/// Where the DNS counters come from (the node DNS, once it serves).
pub fn set_dns_source(source: impl Fn() -> DnsStats + Send + Sync + 'static) {
    *DNS.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(source));
}

/// The metrics in the Prometheus text format.
pub fn encode() -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &METRICS.registry).is_err() {
        out.clear();
    }
    out
}

/// Serves `/healthz` ("ok") and `/metrics` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or_default();
            let path = path.split('?').next().unwrap_or_default();
            let (code, kind, body) = match path {
                "/healthz" => (200, "text/plain", "ok".to_string()),
                "/metrics" => (200, "text/plain; version=0.0.4; charset=utf-8", encode()),
                _ => (404, "text/plain", "not found\n".to_string()),
            };
            let reason = if code == 200 { "OK" } else { "Not Found" };
            let reply = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn healthz_and_the_kubelets_metric_names() {
        runtime_operation("run_podsandbox", Duration::from_millis(30), true);
        runtime_operation("pull_image", Duration::from_millis(5), false);
        pod_started(Duration::from_millis(1500));
        set_dns_source(|| DnsStats { queries: 7, local: 5, forwarded: 2, ..Default::default() });
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let server = tokio::spawn(serve(addr));
        let get = |path: &'static str| async move {
            for _ in 0..50 {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                        .await
                        .unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).await.unwrap();
                    return out;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("no server");
        };
        let health = get("/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok"), "{health}");
        let text = get("/metrics").await;
        for want in [
            "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"pull_image\"} 1",
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"pull_image\"} 1",
            "kubelet_pod_start_duration_seconds_count 1",
            "skiff_dns_queries_total 7",
            "skiff_dns_requests_total{result=\"forwarded\"} 2",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
