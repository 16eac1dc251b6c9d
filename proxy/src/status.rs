//! What the proxy reports about itself, in kube-proxy's terms: the health of its syncs
//! (`/healthz` and `/livez` on 10256, kube-proxy's answers and JSON) and the sync metrics
//! kube-proxy's dashboards and alerts read (`kubeproxy_*` on `/metrics`), beside skiff's own
//! counters from the maps.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The sync's health as kube-proxy's `ProxyHealthServer` judges it: healthy while no change
/// waits, or the oldest waiting change is younger than the timeout; `/healthz` also needs
/// the node to be eligible (not being deleted, not tainted for deletion by the cluster
/// autoscaler).
#[derive(Debug)]
pub struct SyncHealth {
    timeout: Duration,
    inner: Mutex<HealthState>,
}

#[derive(Debug, Clone, Copy)]
struct HealthState {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<SystemTime>,
    node_eligible: bool,
    synced: bool,
}

/// An answer of the health endpoints: status code and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthAnswer {
    pub code: u16,
    pub body: String,
}

impl SyncHealth {
    /// `timeout`: how long a change may wait for a sync before the proxy counts as unhealthy
    /// (kube-proxy uses twice its sync period).
    pub fn new(timeout: Duration) -> SyncHealth {
        SyncHealth {
            timeout,
            inner: Mutex::new(HealthState {
                last_updated: None,
                oldest_pending: None,
                node_eligible: true,
                synced: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A change arrived that a sync has yet to program.
    pub fn queued(&self, now: SystemTime) {
        let mut s = self.state();
        s.oldest_pending.get_or_insert(now);
    }

    /// A sync programmed everything queued until now.
    pub fn updated(&self, now: SystemTime) {
        let mut s = self.state();
        s.oldest_pending = None;
        s.last_updated = Some(now);
        s.synced = true;
    }

    /// Whether this node may receive traffic from outside (its Node object is neither being
    /// deleted nor tainted `ToBeDeletedByClusterAutoscaler`).
    pub fn set_node_eligible(&self, eligible: bool) {
        self.state().node_eligible = eligible;
    }

    fn healthy(&self, s: &HealthState, now: SystemTime) -> bool {
        match s.oldest_pending {
            None => true,
            Some(t) => now.duration_since(t).unwrap_or_default() < self.timeout,
        }
    }

    fn body(s: &HealthState, now: SystemTime, eligible: Option<bool>) -> String {
        let time = |t: Option<SystemTime>| t.map(skiff_core::time::rfc3339_precise);
        let mut body = serde_json::json!({
            "lastUpdated": time(s.last_updated).unwrap_or_default(),
            "currentTime": time(Some(now)).unwrap_or_default(),
        });
        if let Some(e) = eligible {
            body["nodeEligible"] = e.into();
        }
        body.to_string()
    }

    /// `/healthz`: 200 when the syncs keep up and the node is eligible, else 503.
    pub fn healthz(&self, now: SystemTime) -> HealthAnswer {
        let s = *self.state();
        let ok = self.healthy(&s, now) && s.node_eligible;
        HealthAnswer {
            code: if ok { 200 } else { 503 },
            body: Self::body(&s, now, Some(s.node_eligible)),
        }
    }

    /// `/livez`: 200 when the syncs keep up, whatever the node's state.
    pub fn livez(&self, now: SystemTime) -> HealthAnswer {
        let s = *self.state();
        HealthAnswer {
            code: if self.healthy(&s, now) { 200 } else { 503 },
            body: Self::body(&s, now, None),
        }
    }

    /// `/readyz` (skiff's own): 200 once the first full sync has programmed the maps, so a
    /// DaemonSet pod turns Ready only when its node forwards.
    pub fn readyz(&self, now: SystemTime) -> HealthAnswer {
        let s = *self.state();
        HealthAnswer { code: if s.synced { 200 } else { 503 }, body: Self::body(&s, now, None) }
    }
}

/// kube-proxy's metrics of the sync, kept by the daemon and rendered on `/metrics`.
#[derive(Debug)]
pub struct SyncMetrics {
    pub sync_duration: Histogram,
    pub programming: Histogram,
    pub last_sync: Gauge<f64, AtomicU64>,
    pub last_queued: Gauge<f64, AtomicU64>,
    pub failures: Counter,
    pub service_changes: Counter,
    pub endpoint_changes: Counter,
    pub healthz: Family<Vec<(String, String)>, Counter>,
    pub livez: Family<Vec<(String, String)>, Counter>,
}

/// kube-proxy's network programming buckets: quarter seconds up to half a second, then
/// seconds up to a minute, then coarser up to five minutes.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..60).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

impl Default for SyncMetrics {
    fn default() -> Self {
        SyncMetrics {
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            programming: Histogram::new(programming_buckets()),
            last_sync: Gauge::default(),
            last_queued: Gauge::default(),
            failures: Counter::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            healthz: Family::default(),
            livez: Family::default(),
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

impl SyncMetrics {
    /// A sync that took `took` and ended at `now`.
    pub fn synced(&self, took: Duration, now: SystemTime) {
        self.sync_duration.observe(took.as_secs_f64());
        self.last_sync.set(unix_seconds(now));
    }

    /// A change queued at `now`.
    pub fn queued(&self, now: SystemTime) {
        self.last_queued.set(unix_seconds(now));
    }

    /// The metrics in the Prometheus text format (without the OpenMetrics `# EOF`, so the
    /// map counters can follow).
    pub fn render(&self) -> String {
        let mut r = Registry::default();
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds (one sync of the eBPF maps)",
            self.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "In-cluster network programming latency in seconds: from an EndpointSlice's last-change-trigger-time to its change being in the maps",
            self.programming.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time the maps were successfully synced",
            self.last_sync.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync was queued",
            self.last_queued.clone(),
        );
        // kube-proxy's name for failed syncs, which its alerts watch; here a failed map sync.
        r.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Failed syncs of the maps (kube-proxy's name for failed rule syncs)",
            self.failures.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative Service changes seen",
            self.service_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative EndpointSlice changes seen",
            self.endpoint_changes.clone(),
        );
        r.register("kubeproxy_proxy_healthz", "/healthz answers by code", self.healthz.clone());
        r.register("kubeproxy_proxy_livez", "/livez answers by code", self.livez.clone());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out.strip_suffix("# EOF\n").map(str::to_string).unwrap_or(out)
    }
}

/// The health and the metrics, shared by the sync loop and the HTTP endpoints.
#[derive(Debug)]
pub struct ProxyStatus {
    pub health: SyncHealth,
    pub metrics: SyncMetrics,
    /// Changes are counted against the time the process started: older trigger times (of
    /// slices listed at start) are not this process's programming latency.
    pub started: SystemTime,
}

impl ProxyStatus {
    pub fn new(health_timeout: Duration) -> ProxyStatus {
        ProxyStatus {
            health: SyncHealth::new(health_timeout),
            metrics: SyncMetrics::default(),
            started: SystemTime::now(),
        }
    }

    /// A watch event of `kind` arrived.
    pub fn changed(&self, kind: &str) {
        let now = SystemTime::now();
        self.health.queued(now);
        self.metrics.queued(now);
        match kind {
            "Service" => self.metrics.service_changes.inc(),
            _ => self.metrics.endpoint_changes.inc(),
        };
    }

    /// A sync succeeded.
    pub fn synced(&self, took: Duration) {
        let now = SystemTime::now();
        self.health.updated(now);
        self.metrics.synced(took, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn health_follows_kube_proxy() {
        let h = SyncHealth::new(Duration::from_secs(60));
        // Nothing queued yet: healthy (kube-proxy answers 200 before its first sync), but
        // not ready.
        assert_eq!(h.healthz(at(0)).code, 200);
        assert_eq!(h.readyz(at(0)).code, 503);
        h.queued(at(1));
        assert_eq!(h.healthz(at(30)).code, 200, "a change waits, younger than the timeout");
        h.queued(at(40)); // the oldest one counts
        assert_eq!(h.healthz(at(61)).code, 503);
        assert_eq!(h.livez(at(61)).code, 503);
        h.updated(at(62));
        let a = h.healthz(at(63));
        assert_eq!(a.code, 200);
        let body: serde_json::Value = serde_json::from_str(&a.body).expect("json");
        assert_eq!(body["nodeEligible"], true);
        assert!(
            body["lastUpdated"].as_str().expect("lastUpdated").starts_with("2027-01-15T08:01:02")
        );
        assert!(
            body["currentTime"].as_str().expect("currentTime").starts_with("2027-01-15T08:01:03")
        );
        assert_eq!(h.readyz(at(63)).code, 200);
        // A node being deleted: /healthz fails (load balancers drain it), /livez does not.
        h.set_node_eligible(false);
        let a = h.healthz(at(64));
        assert_eq!(a.code, 503);
        assert!(a.body.contains("\"nodeEligible\":false"), "{}", a.body);
        let l = h.livez(at(64));
        assert_eq!(l.code, 200);
        assert!(!l.body.contains("nodeEligible"), "{}", l.body);
    }

    #[test]
    fn metrics_carry_kube_proxy_names() {
        let s = ProxyStatus::new(Duration::from_secs(60));
        s.changed("Service");
        s.changed("EndpointSlice");
        s.synced(Duration::from_millis(3));
        s.metrics.programming.observe(0.4);
        let text = s.metrics.render();
        for want in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_count 1",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\"} 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds ",
            "kubeproxy_sync_proxy_rules_service_changes_total 1",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total 0",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
    }
}
