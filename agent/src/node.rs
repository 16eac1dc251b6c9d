//! The Node object and its Lease: registration, heartbeat, conditions true to the host.
//!
//! Registration creates (or adopts) the Node, reports capacity/allocatable, addresses,
//! nodeInfo and conditions through the status subresource, and creates the node's Lease in
//! `kube-node-lease`. [`NodeAgent::run`] then renews the Lease every `heartbeat`, samples the
//! host and reports status when a condition changes, at least every `status_report`, and at
//! once when someone else (the node lifecycle controller) flipped Ready.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use skiff_core::informers::{Informer, Informers};
use skiff_core::supervisor::AbortOnDrop;
use tokio::sync::Notify;

use crate::config::{AgentConfig, NodeResources, Threshold, Thresholds};
use crate::pods::admit::Allocatable;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";
const FIELD_MANAGER: &str = "skiff-agent";
/// Lease duration (kubelet: 40 s).
const LEASE_SECONDS: i32 = 40;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    ReadHost {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("registering node {name}")]
    Register {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reporting the status of node {name}")]
    ReportStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating the lease of node {name}")]
    CreateLease {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("building the Node object")]
    BuildNode(#[source] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A sample of the host: what capacity and the pressure conditions are computed from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostSample {
    pub cpu_millis: u64,
    pub memory_total: u64,
    pub memory_available: u64,
    /// Bytes free / total on the filesystem of the root dir.
    pub disk_available: u64,
    pub disk_total: u64,
    /// Processes running / the kernel's pid_max.
    pub pids: u64,
    pub pid_max: u64,
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
}

/// Parses `/proc/meminfo`: (MemTotal, MemAvailable) in bytes.
pub fn parse_meminfo(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::ReadHost { path: path.into(), source })
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "Linux".into())
}

/// Samples the host: CPUs, /proc/meminfo, statvfs of `root_dir` (or its nearest existing
/// ancestor), pid counts.
pub fn sample_host(root_dir: &Path) -> Result<HostSample> {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1);
    let (memory_total, memory_available) = parse_meminfo(&read("/proc/meminfo")?);
    let mut dir = root_dir;
    while !dir.exists() {
        dir = dir.parent().unwrap_or(Path::new("/"));
    }
    let (disk_available, disk_total) = match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => {
            let f = s.fragment_size();
            (s.blocks_available() * f, s.blocks() * f)
        }
        Err(_) => (0, 0),
    };
    let pids = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
                .count() as u64
        })
        .unwrap_or(0);
    let pid_max = read("/proc/sys/kernel/pid_max")?.trim().parse().unwrap_or(32768);
    Ok(HostSample {
        cpu_millis: cpus * 1000,
        memory_total,
        memory_available,
        disk_available,
        disk_total,
        pids,
        pid_max,
        kernel_version: read("/proc/sys/kernel/osrelease").map(|s| s.trim().into())?,
        os_image: os_image(),
        machine_id: std::fs::read_to_string("/etc/machine-id")
            .map(|s| s.trim().into())
            .unwrap_or_default(),
        boot_id: read("/proc/sys/kernel/random/boot_id").map(|s| s.trim().into())?,
    })
}

/// A healthy synthetic sample with the given resources (simulated nodes).
pub fn synthetic_sample(r: &NodeResources) -> HostSample {
    HostSample {
        cpu_millis: r.cpu_millis,
        memory_total: r.memory_bytes,
        memory_available: r.memory_bytes,
        disk_available: 100 << 30,
        disk_total: 200 << 30,
        pids: 100,
        pid_max: 4_194_304,
        kernel_version: "simulated".into(),
        os_image: "skiff simulated node".into(),
        ..Default::default()
    }
}

/// (type, status, reason, message) of each node condition, computed from a host sample.
pub fn conditions(
    s: &HostSample,
    t: &Thresholds,
) -> Vec<(&'static str, bool, &'static str, &'static str)> {
    let crossed = |t: Option<Threshold>, available: u64, total: u64| {
        t.is_some_and(|t| t.crossed(available, total))
    };
    let memory = crossed(t.memory_available, s.memory_available, s.memory_total);
    let disk = crossed(t.nodefs_available, s.disk_available, s.disk_total);
    let pid = crossed(t.pid_available, s.pid_max.saturating_sub(s.pids), s.pid_max);
    vec![
        if memory {
            (
                "MemoryPressure",
                true,
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            )
        } else {
            (
                "MemoryPressure",
                false,
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            )
        },
        if disk {
            ("DiskPressure", true, "KubeletHasDiskPressure", "kubelet has disk pressure")
        } else {
            ("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
        },
        if pid {
            (
                "PIDPressure",
                true,
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            )
        } else {
            (
                "PIDPressure",
                false,
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            )
        },
        // The agent wires pod networking itself (skiff-cni), so the network is available
        // whenever the agent runs.
        ("NetworkUnavailable", false, "RouteCreated", "skiff-agent configures pod networking"),
        ("Ready", true, "KubeletReady", "kubelet is posting ready status"),
    ]
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The node conditions to report, keeping lastTransitionTime from `previous` where the
/// status did not change.
pub fn node_conditions(
    computed: &[(&'static str, bool, &'static str, &'static str)],
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let t = now();
    computed
        .iter()
        .map(|(ty, status, reason, message)| {
            let status = if *status { "True" } else { "False" }.to_string();
            let transition = previous
                .iter()
                .find(|c| c.type_ == *ty && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| t.clone());
            NodeCondition {
                type_: ty.to_string(),
                status,
                reason: Some(reason.to_string()),
                message: Some(message.to_string()),
                last_heartbeat_time: Some(t.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// Capacity of the node (allocatable = capacity: skiff reserves nothing for system daemons).
pub fn allocatable(config: &AgentConfig, sample: &HostSample) -> Allocatable {
    Allocatable {
        cpu_millis: sample.cpu_millis,
        memory_bytes: sample.memory_total,
        pods: config.max_pods,
    }
}

fn cpu_quantity(millis: u64) -> String {
    if millis.is_multiple_of(1000) { (millis / 1000).to_string() } else { format!("{millis}m") }
}

/// The Node object to register (pure: everything comes from the config and the sample).
pub fn node_object(
    config: &AgentConfig,
    sample: &HostSample,
    runtime_version: &str,
) -> Result<Node> {
    let name = &config.node_name;
    let mut labels: BTreeMap<String, String> = config.node_labels.clone();
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), go_arch().into());
    labels.insert("beta.kubernetes.io/os".into(), "linux".into());
    labels.insert("beta.kubernetes.io/arch".into(), go_arch().into());
    let a = allocatable(config, sample);
    let resources = json!({
        "cpu": cpu_quantity(a.cpu_millis),
        "memory": format!("{}Ki", a.memory_bytes / 1024),
        "pods": a.pods.to_string(),
        "ephemeral-storage": format!("{}Ki", sample.disk_total / 1024),
    });
    let conds = node_conditions(&conditions(sample, &config.eviction_hard), &[]);
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": config.effective_node_ip().to_string()},
                          {"type": "Hostname", "address": name}],
            "conditions": conds,
            "nodeInfo": {"architecture": go_arch(), "operatingSystem": "linux",
                         "kubeletVersion": concat!("v1.33.0-skiff-", env!("CARGO_PKG_VERSION")),
                         "kubeProxyVersion": "", "containerRuntimeVersion": runtime_version,
                         "kernelVersion": sample.kernel_version, "osImage": sample.os_image,
                         "machineID": sample.machine_id, "systemUUID": sample.machine_id,
                         "bootID": sample.boot_id},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": config.streaming_port}}
        }
    });
    serde_json::from_value(node).map_err(Error::BuildNode)
}

/// The GOARCH spelling of this machine's architecture (what Kubernetes labels use).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The registered node: renews its Lease and keeps its status.
pub struct NodeAgent {
    client: Client,
    /// Where the Node is watched from (the process's shared informers).
    informers: Arc<Informers>,
    /// Whether the process watches every Node anyway (the route sync): then the Node is read
    /// from that informer; else from a watch of this Node alone.
    all_nodes: bool,
    config: Arc<AgentConfig>,
    runtime_version: String,
    allocatable: Allocatable,
    pod_cidr: Option<String>,
}

impl NodeAgent {
    /// Registers the Node (creating it, or adopting an existing one of the same name), reports
    /// its status and creates its Lease.
    pub async fn register(
        client: Client,
        config: Arc<AgentConfig>,
        runtime_version: &str,
    ) -> Result<NodeAgent> {
        let sample = Self::sample(&config)?;
        let name = config.node_name.clone();
        let node = node_object(&config, &sample, runtime_version)?;
        let nodes: Api<Node> = Api::all(client.clone());
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let created = match nodes.create(&pp, &node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Re-registration: keep spec (podCIDR, taints), refresh labels.
                let patch = json!({"metadata": {"labels": node.metadata.labels}});
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| Error::Register { name: name.clone(), source })?
            }
            Err(source) => return Err(Error::Register { name, source }),
        };
        let status = json!({"status": node.status});
        let reported = nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|source| Error::ReportStatus { name: name.clone(), source })?;
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                              "uid": created.uid().unwrap_or_default()}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                     "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}
        }))
        .map_err(Error::BuildNode)?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        match leases.create(&pp, &lease).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => renew_lease(&client, &name).await,
            Err(source) => return Err(Error::CreateLease { name, source }),
        }
        tracing::info!(node = %name, "node registered");
        Ok(NodeAgent {
            informers: Informers::new(client.clone()),
            all_nodes: false,
            client,
            allocatable: allocatable(&config, &sample),
            config,
            runtime_version: runtime_version.into(),
            pod_cidr: reported.spec.and_then(|s| s.pod_cidr),
        })
    }

    fn sample(config: &AgentConfig) -> Result<HostSample> {
        match &config.resources {
            Some(r) if !config.host_conditions => Ok(synthetic_sample(r)),
            Some(r) => {
                let mut s = sample_host(&config.root_dir)?;
                s.cpu_millis = r.cpu_millis;
                s.memory_total = r.memory_bytes;
                s.memory_available = s.memory_available.min(r.memory_bytes);
                Ok(s)
            }
            None => sample_host(&config.root_dir),
        }
    }

    /// Watch the Node through `informers` (the agent's shared ones) rather than its own;
    /// through their informer of every Node when `all_nodes` (the process has one).
    pub fn sharing(mut self, informers: Arc<Informers>, all_nodes: bool) -> Self {
        self.informers = informers;
        self.all_nodes = all_nodes;
        self
    }

    /// The node's allocatable resources (pod admission checks against them).
    pub fn allocatable(&self) -> Allocatable {
        self.allocatable
    }

    /// The podCIDR assigned when the node registered (None until node IPAM ran).
    pub fn pod_cidr(&self) -> Option<&str> {
        self.pod_cidr.as_deref()
    }

    /// Heartbeats and status reports, until the task is dropped.
    pub async fn run(self) {
        let wake = Arc::new(Notify::new());
        let watch = tokio::spawn(watch_ready_flips(
            node_informer(&self.informers, &self.config.node_name, self.all_nodes),
            self.config.node_name.clone(),
            wake.clone(),
        ));
        let _abort = AbortOnDrop(watch);
        let name = self.config.node_name.clone();
        let mut tick = tokio::time::interval(self.config.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_report = tokio::time::Instant::now();
        let mut last_conditions = None;
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                _ = wake.notified() => true,
            };
            if !forced {
                renew_lease(&self.client, &name).await;
            }
            let sample = match Self::sample(&self.config) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "sampling the host");
                    continue;
                }
            };
            let computed = conditions(&sample, &self.config.eviction_hard);
            let due = last_report.elapsed() >= self.config.status_report;
            if forced || due || last_conditions.as_ref() != Some(&computed) {
                match self.report(&computed).await {
                    Ok(()) => {
                        last_report = tokio::time::Instant::now();
                        last_conditions = Some(computed);
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "reporting node status"),
                }
            }
        }
    }

    async fn report(
        &self,
        computed: &[(&'static str, bool, &'static str, &'static str)],
    ) -> Result<()> {
        let name = &self.config.node_name;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let previous = nodes
            .get_status(name)
            .await
            .ok()
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default();
        let conds = node_conditions(computed, &previous);
        let patch = json!({"status": {"conditions": conds,
            "nodeInfo": {"containerRuntimeVersion": self.runtime_version}}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ReportStatus { name: name.clone(), source })?;
        Ok(())
    }
}

/// Renews the node's Lease (recreating it if someone deleted it).
pub async fn renew_lease(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let patch = json!({"spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    match leases.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease: Result<Lease, _> = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE}, "spec": patch["spec"]}));
            if let Ok(lease) = lease
                && let Err(e) = leases.create(&PostParams::default(), &lease).await
            {
                tracing::warn!(node = name, error = %e, "recreating the node lease");
            }
        }
        Err(e) => tracing::warn!(node = name, error = %e, "renewing the node lease"),
    }
}

/// Wakes the status loop when the Node's Ready condition is not True (the node lifecycle
/// controller marks a node Unknown when its lease lapsed; a live agent says so at once).
/// The informer the agent reads its own Node from: the informer of every Node when the
/// process has one (`all_nodes`), else one of this Node alone (a simulated node, or an agent
/// without route sync, must not watch the whole cluster's heartbeats).
pub fn node_informer(informers: &Informers, name: &str, all_nodes: bool) -> Arc<Informer<Node>> {
    if all_nodes {
        informers.all::<Node>()
    } else {
        informers.selected::<Node>(&format!("metadata.name={name}"))
    }
}

async fn watch_ready_flips(nodes: Arc<Informer<Node>>, name: String, wake: Arc<Notify>) {
    let mut stream = nodes.applied();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(node) if node.name_any() == name && !node_ready(&node) => wake.notify_one(),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(node = %name, error = %e, "node watch");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let text = "MemTotal:       16318420 kB\nMemFree:  100 kB\nMemAvailable:   8000000 kB\n";
        assert_eq!(parse_meminfo(text), (16318420 * 1024, 8000000 * 1024));
        assert_eq!(parse_meminfo(""), (0, 0));
    }

    #[test]
    fn conditions_follow_the_sample() {
        let r = NodeResources { cpu_millis: 2000, memory_bytes: 4 << 30 };
        let healthy = synthetic_sample(&r);
        let c = conditions(&healthy, &Thresholds::default());
        let status = |c: &[(&str, bool, &str, &str)], t: &str| {
            c.iter().find(|x| x.0 == t).map(|x| x.1).expect("condition")
        };
        assert!(status(&c, "Ready"));
        assert!(!status(&c, "MemoryPressure"));
        assert!(!status(&c, "NetworkUnavailable"));
        let mut low = healthy.clone();
        low.memory_available = 10 << 20;
        low.disk_available = low.disk_total / 20;
        low.pids = low.pid_max - 10;
        let c = conditions(&low, &Thresholds::default());
        assert!(status(&c, "MemoryPressure"));
        assert!(status(&c, "DiskPressure"));
        assert!(status(&c, "PIDPressure"));

        // An absolute disk threshold: 5% of 200 GiB free is well above 1 GiB.
        let t: Thresholds = "memory.available<5Mi, nodefs.available<1Gi".parse().unwrap();
        let c = conditions(&low, &t);
        assert!(!status(&c, "MemoryPressure"));
        assert!(!status(&c, "DiskPressure"));
        assert!(!status(&c, "PIDPressure"), "pid.available was left out: no threshold");
        let none: Thresholds = "".parse().unwrap();
        assert!(conditions(&low, &none).iter().filter(|x| x.0.ends_with("Pressure")).all(|x| !x.1));
    }

    #[test]
    fn eviction_thresholds_parse_as_the_kubelet_flag() {
        let t: Thresholds =
            "memory.available<100Mi,nodefs.available<10%,pid.available<10%".parse().unwrap();
        assert_eq!(t, Thresholds::default());
        let t: Thresholds = "nodefs.available<1.5Gi,pid.available<1000".parse().unwrap();
        assert_eq!(t.nodefs_available, Some(Threshold::Amount(3 << 29)));
        assert_eq!(t.pid_available, Some(Threshold::Amount(1000)));
        assert_eq!(t.memory_available, None);
        for bad in [
            "nodefs.available",
            "nodefs.available<ten",
            "nodefs.available<120%",
            "imagefs.inodesFree<5%",
        ] {
            let e = bad.parse::<Thresholds>().unwrap_err();
            assert!(e.contains(bad.split('<').next().unwrap()), "{bad}: {e}");
        }
    }

    #[test]
    fn node_object_carries_capacity_addresses_and_labels() {
        let config = AgentConfig::new("n1")
            .with_node_ip("10.1.2.3".parse().expect("ip"))
            .with_resources(3500, 8 << 30);
        let node = node_object(
            &config,
            &synthetic_sample(config.resources.as_ref().expect("r")),
            "containerd://2",
        )
        .expect("node");
        let labels = node.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        let st = node.status.expect("status");
        let cap = st.capacity.expect("capacity");
        assert_eq!(cap["cpu"].0, "3500m");
        assert_eq!(cap["memory"].0, format!("{}Ki", 8u64 << 20));
        assert_eq!(cap["pods"].0, "110");
        let addrs = st.addresses.expect("addresses");
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "10.1.2.3");
        assert_eq!(
            st.daemon_endpoints.and_then(|d| d.kubelet_endpoint).map(|e| e.port),
            Some(10250)
        );
        assert_eq!(st.node_info.expect("info").container_runtime_version, "containerd://2");
    }

    #[test]
    fn host_sample_reads_proc() {
        let s = sample_host(Path::new("/nonexistent/dir")).expect("sample");
        assert!(s.cpu_millis >= 1000);
        assert!(s.memory_total > 0 && s.memory_available <= s.memory_total);
        assert!(s.disk_total > 0, "statvfs of / through the nearest existing ancestor");
        assert!(s.pids > 0 && s.pid_max >= s.pids);
    }

    #[tokio::test]
    async fn registers_heartbeats_and_restores_ready() {
        let api = skiff_apiserver::ApiServer::start(
            Arc::new(skiff_store::memory::MemoryStore::new()),
            Default::default(),
        )
        .await
        .expect("apiserver");
        let client = api.client();
        let mut config = AgentConfig::new("n1")
            .with_node_ip("192.0.2.1".parse().expect("ip"))
            .with_resources(2000, 4 << 30)
            .with_heartbeat(Duration::from_millis(50));
        config.host_conditions = false;
        let config = Arc::new(config);
        let agent = NodeAgent::register(client.clone(), config.clone(), "fake://1")
            .await
            .expect("register");
        assert_eq!(
            agent.allocatable(),
            Allocatable { cpu_millis: 2000, memory_bytes: 4 << 30, pods: 110 }
        );
        // Registering again (an agent restart) adopts the existing Node and Lease.
        let agent =
            NodeAgent::register(client.clone(), config.clone(), "fake://1").await.expect("again");
        let task = tokio::spawn(agent.run());
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let renew =
            || async { leases.get("n1").await.expect("lease").spec.and_then(|s| s.renew_time) };
        let first = renew().await;
        let mut renewed = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if renew().await != first {
                renewed = true;
                break;
            }
        }
        assert!(renewed, "the lease is renewed every heartbeat");
        // The node lifecycle controller marks the node Unknown: the agent corrects it at once.
        let nodes: Api<Node> = Api::all(client.clone());
        let mut node = nodes.get_status("n1").await.expect("node");
        let conds = node.status.as_mut().and_then(|s| s.conditions.as_mut()).expect("conditions");
        for c in conds.iter_mut().filter(|c| c.type_ == "Ready") {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
        }
        let patch = json!({"status": {"conditions": conds}});
        nodes
            .patch_status("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("flip");
        let mut restored = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if node_ready(&nodes.get("n1").await.expect("node")) {
                restored = true;
                break;
            }
        }
        task.abort();
        assert!(restored, "Ready restored by the agent");
    }
}
