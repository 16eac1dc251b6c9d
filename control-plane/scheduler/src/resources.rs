//! Resource arithmetic of the scheduler: quantities parsed once into integers (cpu in
//! millicores, memory in bytes, by the one exact parser of `skiff_core::quantity`), pod requests (containers summed, init containers maxed,
//! overhead added, as upstream's `resource.PodRequests`) and node allocatable.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use skiff_core::quantity::Quantity;

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

fn from_map(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Resources {
    let mut r = Resources::default();
    if let Some(map) = map {
        if let Some(q) = map.get("cpu") {
            r.milli_cpu = Quantity::of(q).map_or(0, Quantity::milli_value);
        }
        if let Some(q) = map.get("memory") {
            r.memory = Quantity::of(q).map_or(0, Quantity::value);
        }
        if let Some(q) = map.get("pods") {
            r.pods = Quantity::of(q).map_or(0, Quantity::value);
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
