//! Resource arithmetic of the scheduler: quantities parsed once into integers (cpu in
//! millicores, memory in bytes), pod requests (containers summed, init containers maxed,
//! overhead added, as upstream's `resource.PodRequests`) and node allocatable.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Requests used for scoring a container that requests nothing (upstream
/// `DefaultMilliCPURequest` 100m and `DefaultMemoryRequest` 200 MiB), so that pods without
/// requests still spread.
pub const DEFAULT_MILLI_CPU: i64 = 100;
pub const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// The resources the scheduler accounts: cpu (millicores), memory (bytes), pod count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

impl Resources {
    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.pods += other.pods;
    }

    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.pods -= other.pods;
    }

    fn max(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
    }
}

/// Parse a Kubernetes quantity ("100m", "1.5", "128Mi", "1G", "2e3") scaled by `scale`
/// (1000 for millicores, 1 for bytes), rounding up as upstream's `MilliValue`/`Value` do.
pub fn parse_quantity(q: &str, scale: i64) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let scaled = value * mult * scale as f64;
    // Guard float noise ("0.1" * 1000 = 100.00000000000001) before rounding up.
    Some((scaled - 1e-9).ceil() as i64)
}

fn from_map(map: Option<&BTreeMap<String, Quantity>>) -> Resources {
    let mut r = Resources::default();
    if let Some(map) = map {
        if let Some(q) = map.get("cpu") {
            r.milli_cpu = parse_quantity(&q.0, 1000).unwrap_or(0);
        }
        if let Some(q) = map.get("memory") {
            r.memory = parse_quantity(&q.0, 1).unwrap_or(0);
        }
        if let Some(q) = map.get("pods") {
            r.pods = parse_quantity(&q.0, 1).unwrap_or(0);
        }
    }
    r
}

/// What a pod requests (`pods` is 1), and the same with upstream's non-zero defaults for
/// containers that request no cpu or memory (used by the scores only).
pub fn pod_requests(pod: &Pod) -> (Resources, Resources) {
    let mut sum = Resources::default();
    let mut nonzero = Resources::default();
    let Some(spec) = pod.spec.as_ref() else {
        return (Resources { pods: 1, ..Default::default() }, nonzero);
    };
    for c in &spec.containers {
        let r = from_map(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
        sum.add(&r);
        nonzero.milli_cpu += if r.milli_cpu == 0 { DEFAULT_MILLI_CPU } else { r.milli_cpu };
        nonzero.memory += if r.memory == 0 { DEFAULT_MEMORY } else { r.memory };
    }
    for c in spec.init_containers.iter().flatten() {
        let r = from_map(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
        sum.max(&r);
        nonzero.max(&r);
    }
    let overhead = from_map(spec.overhead.as_ref());
    sum.add(&overhead);
    nonzero.add(&overhead);
    sum.pods = 1;
    nonzero.pods = 1;
    (sum, nonzero)
}

/// A node's allocatable (capacity when allocatable is absent).
pub fn node_allocatable(node: &Node) -> Resources {
    let status = node.status.as_ref();
    let map =
        status.and_then(|s| s.allocatable.as_ref()).or(status.and_then(|s| s.capacity.as_ref()));
    from_map(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100m", 1000), Some(100));
        assert_eq!(parse_quantity("1", 1000), Some(1000));
        assert_eq!(parse_quantity("0.1", 1000), Some(100));
        assert_eq!(parse_quantity("1.5", 1000), Some(1500));
        assert_eq!(parse_quantity("128Mi", 1), Some(128 * 1024 * 1024));
        assert_eq!(parse_quantity("1G", 1), Some(1_000_000_000));
        assert_eq!(parse_quantity("2e3", 1), Some(2000));
        assert_eq!(parse_quantity("110", 1), Some(110));
        assert_eq!(parse_quantity("1x", 1), None);
    }

    #[test]
    fn pod_requests_sum_containers_max_init() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}}},
                    {"name": "b"}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]
            }
        }))
        .unwrap();
        let (req, nonzero) = pod_requests(&pod);
        assert_eq!(req, Resources { milli_cpu: 2000, memory: 1 << 30, pods: 1 });
        assert_eq!(nonzero.milli_cpu, 2000);
        assert_eq!(nonzero.memory, (1 << 30) + DEFAULT_MEMORY);
    }
}
