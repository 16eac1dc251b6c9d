//! Admission of a pod by the node: the pod must fit in what is left of allocatable (cpu,
//! memory, pods) and its host ports must be free; otherwise it is rejected with phase Failed
//! and the kubelet's reason (`OutOfcpu`, `OutOfmemory`, `OutOfpods`, `NodePorts`).
//! Also the resource quantity parsing the container config uses.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A CPU quantity in millicores, rounded up (upstream's `MilliValue`), by the parser the
/// scheduler uses too; negative or malformed: none.
pub fn cpu_millis(q: &Quantity) -> Option<u64> {
    skiff_core::quantity::Quantity::of(q).and_then(|q| u64::try_from(q.milli_value()).ok())
}

/// A memory quantity in bytes, rounded up (upstream's `Value`); negative or malformed: none.
pub fn bytes(q: &Quantity) -> Option<u64> {
    skiff_core::quantity::Quantity::of(q).and_then(|q| u64::try_from(q.value()).ok())
}

/// A container's (cpu millis, memory bytes) request; a limit stands in for a missing
/// request, as API defaulting does.
pub fn container_requests(c: &Container) -> (u64, u64) {
    let r = c.resources.as_ref();
    let get = |name: &str| {
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(name))
            .or_else(|| r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(name)))
    };
    (get("cpu").and_then(cpu_millis).unwrap_or(0), get("memory").and_then(bytes).unwrap_or(0))
}

/// The pod's effective request: max(sum of containers, largest init container) plus overhead.
pub fn pod_requests(pod: &Pod) -> (u64, u64) {
    let Some(spec) = &pod.spec else { return (0, 0) };
    let (mut cpu, mut mem) =
        spec.containers.iter().map(container_requests).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    for (c, m) in spec.init_containers.iter().flatten().map(container_requests) {
        cpu = cpu.max(c);
        mem = mem.max(m);
    }
    if let Some(o) = &spec.overhead {
        cpu += o.get("cpu").and_then(cpu_millis).unwrap_or(0);
        mem += o.get("memory").and_then(bytes).unwrap_or(0);
    }
    (cpu, mem)
}

/// (protocol, hostIP, hostPort) of every host port the pod asks for.
pub fn host_ports(pod: &Pod) -> HashSet<(String, String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| {
            (
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.host_ip.clone().unwrap_or_else(|| "0.0.0.0".into()),
                p.host_port.unwrap_or_default(),
            )
        })
        .collect()
}

fn ports_conflict(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

/// Why a pod was rejected: the status reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// Decides whether `pod` fits next to the already admitted `others` (pure).
pub fn admit<'a>(
    pod: &Pod,
    others: impl IntoIterator<Item = &'a Pod>,
    allocatable: &Allocatable,
) -> Result<(), Rejection> {
    let (cpu, mem) = pod_requests(pod);
    let ports = host_ports(pod);
    let (mut used_cpu, mut used_mem, mut count) = (0u64, 0u64, 0u32);
    let mut conflict = None;
    for o in others {
        let (c, m) = pod_requests(o);
        used_cpu += c;
        used_mem += m;
        count += 1;
        if conflict.is_none() {
            let theirs = host_ports(o);
            conflict = ports.iter().find(|p| theirs.iter().any(|t| ports_conflict(p, t))).cloned();
        }
    }
    let reject = |resource: &str, requested: u64, used: u64, capacity: u64| Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {resource}, requested: \
             {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    if count + 1 > allocatable.pods {
        return Err(reject("pods", 1, count as u64, allocatable.pods as u64));
    }
    if cpu > 0 && used_cpu + cpu > allocatable.cpu_millis {
        return Err(reject("cpu", cpu, used_cpu, allocatable.cpu_millis));
    }
    if mem > 0 && used_mem + mem > allocatable.memory_bytes {
        return Err(reject("memory", mem, used_mem, allocatable.memory_bytes));
    }
    if let Some((proto, ip, port)) = conflict {
        return Err(Rejection {
            reason: "NodePorts".into(),
            message: format!(
                "Pod was rejected: node didn't have free ports for the requested pod ports \
                 ({proto} {ip}:{port})"
            ),
        });
    }
    Ok(())
}

/// What the scheduler-facing resources of the node are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pods: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    fn pod(cpu: &str, mem: &str, host_port: Option<i32>) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}},
             "ports": host_port.map(|h| vec![json!({"containerPort": 80, "hostPort": h})])}]}}))
        .expect("pod")
    }

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis(&q("250m")), Some(250));
        assert_eq!(cpu_millis(&q("2")), Some(2000));
        assert_eq!(cpu_millis(&q("0.5")), Some(500));
        assert_eq!(bytes(&q("128Mi")), Some(128 << 20));
        assert_eq!(bytes(&q("1G")), Some(1_000_000_000));
        assert_eq!(bytes(&q("1000")), Some(1000));
        assert_eq!(bytes(&q("x")), None);
    }

    #[test]
    fn rejects_what_does_not_fit() {
        let alloc = Allocatable { cpu_millis: 2000, memory_bytes: 1 << 30, pods: 3 };
        let a = pod("1500m", "100Mi", Some(8080));
        assert_eq!(admit(&a, [], &alloc), Ok(()));
        let b = pod("1", "100Mi", None);
        let r = admit(&b, [&a], &alloc).expect_err("cpu");
        assert_eq!(r.reason, "OutOfcpu");
        assert!(r.message.contains("requested: 1000, used: 1500, capacity: 2000"), "{}", r.message);
        let c = pod("100m", "2Gi", None);
        assert_eq!(admit(&c, [&a], &alloc).expect_err("memory").reason, "OutOfmemory");
        let d = pod("100m", "1Mi", Some(8080));
        assert_eq!(admit(&d, [&a], &alloc).expect_err("ports").reason, "NodePorts");
        let e = pod("0", "0", None);
        assert_eq!(admit(&e, [&a, &b, &c], &alloc).expect_err("pods").reason, "OutOfpods");
    }
}
