//! `GET /metrics/resource`: the node's and its containers' CPU time and working set, in the
//! kubelet's resource metrics format
//! ([`skiff_core::resource_metrics`]), which the apiserver scrapes for
//! `metrics.k8s.io` (`kubectl top`).
//!
//! Containers' readings come from the runtime (CRI `ListContainerStats`); the node's from
//! the kernel: the root cgroup's `cpu.stat` (`/proc/stat` without cgroup v2) and
//! `/proc/meminfo`.

use std::collections::BTreeMap;

use skiff_core::resource_metrics::{ContainerUsage, NodeScrape, Usage};

use crate::runtime::{self, Runtime, api};

/// The scrape of this node now.
pub async fn scrape<R: Runtime>(runtime: &R) -> NodeScrape {
    let (containers, scrape_error) = match runtime.list_container_stats().await {
        Ok(stats) => (containers(stats), false),
        Err(e) => {
            tracing::warn!(error = %e, "resource metrics: listing container stats");
            (Vec::new(), true)
        }
    };
    NodeScrape { node: node_usage(), containers, scrape_error }
}

/// The pods' containers with both readings; of a container name seen twice in a pod (a
/// restart whose old instance still reports), the newer reading.
fn containers(stats: Vec<api::ContainerStats>) -> Vec<ContainerUsage> {
    let mut found: BTreeMap<(String, String, String), Usage> = BTreeMap::new();
    for s in stats {
        let Some(attributes) = s.attributes else { continue };
        let label = |name: &str| attributes.labels.get(name).cloned();
        let (Some(namespace), Some(pod)) =
            (label(runtime::POD_NAMESPACE_LABEL), label(runtime::POD_NAME_LABEL))
        else {
            continue;
        };
        let Some(container) = attributes
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| label(runtime::CONTAINER_NAME_LABEL))
        else {
            continue;
        };
        let (Some(cpu), Some(memory)) = (s.cpu, s.memory) else { continue };
        let (Some(cpu_ns), Some(working_set)) =
            (cpu.usage_core_nano_seconds, memory.working_set_bytes)
        else {
            continue;
        };
        let usage = Usage {
            cpu_seconds: cpu_ns.value as f64 / 1e9,
            cpu_timestamp_ms: cpu.timestamp / 1_000_000,
            memory_bytes: working_set.value,
            memory_timestamp_ms: memory.timestamp / 1_000_000,
        };
        let slot = found.entry((namespace, pod, container)).or_insert(usage);
        if usage.cpu_timestamp_ms > slot.cpu_timestamp_ms {
            *slot = usage;
        }
    }
    found
        .into_iter()
        .map(|((namespace, pod, container), usage)| ContainerUsage {
            namespace,
            pod,
            container,
            usage,
        })
        .collect()
}

/// The node's cumulative CPU time and working set now (`None` when unreadable).
fn node_usage() -> Option<Usage> {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
    let cpu_seconds = std::fs::read_to_string("/sys/fs/cgroup/cpu.stat")
        .ok()
        .and_then(|s| cgroup_cpu_seconds(&s))
        .or_else(|| {
            std::fs::read_to_string("/proc/stat").ok().and_then(|s| proc_stat_cpu_seconds(&s))
        })?;
    let memory_bytes =
        std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| working_set(&s))?;
    Some(Usage { cpu_seconds, cpu_timestamp_ms: now, memory_bytes, memory_timestamp_ms: now })
}

/// `usage_usec` of a cgroup v2 `cpu.stat`, in seconds.
fn cgroup_cpu_seconds(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|usec| usec as f64 / 1e6)
}

/// The busy time of `/proc/stat`'s `cpu` line (user, nice, system, irq, softirq: not idle,
/// iowait, or steal, the time the hypervisor gave to others), in seconds (the kernel counts
/// in USER_HZ, 100 per second on Linux).
fn proc_stat_cpu_seconds(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|i| fields.get(*i)).sum();
    Some(busy as f64 / 100.0)
}

/// cAdvisor's working set of the machine: memory in use less the inactive file cache.
fn working_set(meminfo: &str) -> Option<u64> {
    let kib = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
    };
    let used = kib("MemTotal")?.checked_sub(kib("MemFree")?)?;
    Some(used.saturating_sub(kib("Inactive(file)").unwrap_or(0)) * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::memory::MemoryRuntime;

    #[test]
    fn reads_the_kernels_counters() {
        assert_eq!(cgroup_cpu_seconds("usage_usec 2500000\nuser_usec 2000000\n"), Some(2.5));
        let stat = "cpu  100 20 30 4000 50 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(proc_stat_cpu_seconds(stat), Some(1.63));
        let meminfo = "MemTotal:       16000 kB\nMemFree:         4000 kB\nMemAvailable:   9000 kB\nInactive(file):   2000 kB\n";
        assert_eq!(working_set(meminfo), Some(10_000 * 1024));
        assert_eq!(working_set("MemTotal: 1 kB\n"), None);
        // This machine's own files read.
        assert!(node_usage().is_some());
    }

    #[tokio::test]
    async fn reports_the_runtimes_containers() {
        let runtime = MemoryRuntime::new();
        runtime.add_image("app:1");
        let labels = std::collections::HashMap::from([
            (runtime::POD_NAMESPACE_LABEL.to_string(), "default".to_string()),
            (runtime::POD_NAME_LABEL.to_string(), "web".to_string()),
        ]);
        let sandbox = api::PodSandboxConfig { labels: labels.clone(), ..Default::default() };
        let sandbox_id = runtime.run_pod_sandbox(sandbox.clone()).await.unwrap();
        let mut ids = Vec::new();
        for name in ["app", "sidecar"] {
            let config = api::ContainerConfig {
                metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
                image: Some(api::ImageSpec { image: "app:1".into(), ..Default::default() }),
                labels: labels.clone(),
                ..Default::default()
            };
            let id = runtime.create_container(&sandbox_id, config, &sandbox).await.unwrap();
            runtime.start_container(&id).await.unwrap();
            ids.push(id);
        }
        runtime.set_usage(&ids[0], 250_000_000, 4 << 20);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let scrape = scrape(&runtime).await;
        assert!(!scrape.scrape_error);
        assert_eq!(scrape.containers.len(), 2, "{:?}", scrape.containers);
        let app = scrape.containers.iter().find(|c| c.container == "app").unwrap();
        assert_eq!((app.namespace.as_str(), app.pod.as_str()), ("default", "web"));
        assert_eq!(app.usage.memory_bytes, 4 << 20);
        assert!(app.usage.cpu_seconds >= 0.005, "{:?}", app.usage);
        let sidecar = scrape.containers.iter().find(|c| c.container == "sidecar").unwrap();
        assert_eq!(sidecar.usage.cpu_seconds, 0.0);
        assert!(scrape.node.is_some());
    }
}
