//! Simulated nodes: N Nodes registered through the API that heartbeat their Leases, report
//! Ready, mark the pods bound to them Running and Ready (without containers) and finish
//! their graceful deletion — the kubelet's API-facing duties, for tests and scale
//! benchmarks (kubemark's hollow nodes in one task set).
//!
//! Built to scale to thousands of nodes and tens of thousands of pods: one watch of all
//! scheduled pods, one of nodes, one heartbeat loop renewing every live Lease concurrently,
//! and a bounded pool of concurrent status writers — no per-node tasks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The label every simulated node carries (so tests and benchmarks can select them).
pub const SIMULATED_LABEL: &str = "node.skiff.dev/simulated";
const LEASE_NAMESPACE: &str = "kube-node-lease";
const FIELD_MANAGER: &str = "skiff-simnodes";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("registering node {name}")]
    RegisterNode {
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
    #[error("node {name} is not one of the simulated nodes")]
    UnknownNode { name: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the simulated nodes look like and how often they report.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes registered at start.
    pub count: usize,
    /// Node names are `{prefix}-{index}`.
    pub prefix: String,
    /// Capacity and allocatable cpu (a quantity, e.g. "4").
    pub cpu: String,
    /// Capacity and allocatable memory (e.g. "16Gi").
    pub memory: String,
    /// Capacity and allocatable pods (kubelet default 110).
    pub pods: u32,
    /// Lease renewal period (kubelet: 10 s, a quarter of the 40 s lease duration).
    pub heartbeat: Duration,
    /// Period of the node status (Ready condition) report; the kubelet reports at least
    /// every 5 minutes when nothing changes (`nodeStatusReportFrequency`), and at once when
    /// the node lifecycle controller changed Ready behind its back.
    pub status_report: Duration,
    /// Zones assigned round robin as `topology.kubernetes.io/zone` (none when empty).
    pub zones: Vec<String>,
    /// Extra labels on every node.
    pub labels: BTreeMap<String, String>,
    /// Concurrent API writes (node registration, lease renewals, pod status updates).
    pub concurrency: usize,
    /// Fake pod addresses: node `i` uses the `i`-th /22 of this /10 (never routed).
    pub pod_network: Ipv4Addr,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            count: 3,
            prefix: "sim-node".into(),
            cpu: "4".into(),
            memory: "16Gi".into(),
            pods: 110,
            heartbeat: Duration::from_secs(10),
            status_report: Duration::from_secs(300),
            zones: Vec::new(),
            labels: BTreeMap::new(),
            concurrency: 64,
            pod_network: Ipv4Addr::new(100, 64, 0, 0),
        }
    }
}

impl SimConfig {
    pub fn with_count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    pub fn with_heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }
    pub fn with_zones(mut self, zones: &[&str]) -> Self {
        self.zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }
    pub fn with_resources(mut self, cpu: &str, memory: &str, pods: u32) -> Self {
        self.cpu = cpu.into();
        self.memory = memory.into();
        self.pods = pods;
        self
    }
}

struct SimNode {
    index: u32,
    live: bool,
    next_ip: u32,
}

struct State {
    nodes: HashMap<String, SimNode>,
    next_index: u32,
}

struct Inner {
    client: Client,
    config: SimConfig,
    state: Mutex<State>,
    /// Pods to (re)examine: (namespace, name).
    work: mpsc::UnboundedSender<Work>,
    /// Keys already queued and not yet handled (de-duplication).
    queued: Mutex<HashSet<(String, String)>>,
}

enum Work {
    Pod(Box<Pod>),
    NodeStatus(String),
}

/// Running simulated nodes; dropping the handle stops them (the Node objects stay).
pub struct SimulatedNodes {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for SimulatedNodes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl SimulatedNodes {
    /// Register `config.count` nodes (reusing existing ones of the same name) and start
    /// heartbeating and serving their pods.
    pub async fn start(client: Client, config: SimConfig) -> Result<SimulatedNodes> {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            client,
            config,
            state: Mutex::new(State { nodes: HashMap::new(), next_index: 0 }),
            work: tx,
            queued: Mutex::new(HashSet::new()),
        });
        let names: Vec<String> =
            (0..inner.config.count).map(|i| format!("{}-{i}", inner.config.prefix)).collect();
        futures::stream::iter(names.into_iter().map(|n| inner.clone().register(n)))
            .buffer_unordered(inner.config.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        let tasks = vec![
            tokio::spawn(inner.clone().heartbeat_loop()),
            tokio::spawn(inner.clone().status_loop()),
            tokio::spawn(inner.clone().watch_pods()),
            tokio::spawn(inner.clone().watch_nodes()),
            tokio::spawn(inner.clone().work_loop(rx)),
        ];
        Ok(SimulatedNodes { inner, tasks })
    }

    /// Register one more node with the next index; returns its name.
    pub async fn add_node(&self) -> Result<String> {
        let name = {
            let st = lock(&self.inner.state);
            format!("{}-{}", self.inner.config.prefix, st.next_index)
        };
        self.inner.clone().register(name.clone()).await?;
        Ok(name)
    }

    /// Node loss: stop renewing the node's Lease, reporting its status and serving its
    /// pods (their graceful deletions stay pending, as on a dead kubelet).
    pub fn stop_node(&self, name: &str) -> Result<()> {
        self.set_live(name, false)
    }

    /// The node comes back: heartbeats resume at once, Ready is reported and its pods are
    /// re-examined.
    pub async fn resume_node(&self, name: &str) -> Result<()> {
        self.set_live(name, true)?;
        let inner = &self.inner;
        renew_lease(&inner.client, name).await;
        let _ = inner.work.send(Work::NodeStatus(name.to_string()));
        let pods: Api<Pod> = Api::all(inner.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={name}"));
        if let Ok(list) = pods.list(&lp).await {
            for p in list.items {
                inner.enqueue(p);
            }
        }
        Ok(())
    }

    /// Names of all simulated nodes, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let st = lock(&self.inner.state);
        let mut v: Vec<String> = st.nodes.keys().cloned().collect();
        v.sort_by_key(|n| st.nodes.get(n).map(|s| s.index));
        v
    }

    fn set_live(&self, name: &str, live: bool) -> Result<()> {
        let mut st = lock(&self.inner.state);
        let node =
            st.nodes.get_mut(name).ok_or_else(|| Error::UnknownNode { name: name.to_string() })?;
        node.live = live;
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn renew_lease(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let patch = json!({"spec": {"renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    if let Err(e) = leases.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        tracing::debug!(node = name, error = %e, "renewing the node lease");
    }
}

impl Inner {
    fn is_live(&self, node: &str) -> bool {
        lock(&self.state).nodes.get(node).is_some_and(|n| n.live)
    }

    fn live_nodes(&self) -> Vec<String> {
        lock(&self.state).nodes.iter().filter(|(_, n)| n.live).map(|(k, _)| k.clone()).collect()
    }

    fn enqueue(&self, pod: Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if lock(&self.queued).insert(key) {
            let _ = self.work.send(Work::Pod(Box::new(pod)));
        }
    }

    fn node_object(&self, name: &str, index: u32) -> Node {
        let c = &self.config;
        let mut labels = c.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), name.into());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        labels.insert(SIMULATED_LABEL.into(), "true".into());
        if !c.zones.is_empty() {
            let zone = &c.zones[index as usize % c.zones.len()];
            labels.insert("topology.kubernetes.io/zone".into(), zone.clone());
        }
        let resources = json!({"cpu": c.cpu, "memory": c.memory, "pods": c.pods.to_string(),
                               "ephemeral-storage": "100Gi"});
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {},
            "status": {
                "capacity": resources, "allocatable": resources,
                "addresses": [{"type": "InternalIP", "address": node_ip(index).to_string()},
                              {"type": "Hostname", "address": name}],
                "conditions": ready_conditions(),
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                             "kubeletVersion": "v1.33.0-skiff-sim", "kubeProxyVersion": "",
                             "containerRuntimeVersion": "sim://0", "kernelVersion": "",
                             "osImage": "simulated", "machineID": "", "systemUUID": "",
                             "bootID": ""},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
            }
        });
        serde_json::from_value(node).unwrap_or_default()
    }

    async fn register(self: Arc<Self>, name: String) -> Result<()> {
        let index = {
            let mut st = lock(&self.state);
            let index = match name.rsplit('-').next().and_then(|i| i.parse::<u32>().ok()) {
                Some(i) => i,
                None => st.next_index,
            };
            st.next_index = st.next_index.max(index + 1);
            st.nodes.insert(name.clone(), SimNode { index, live: true, next_ip: 2 });
            index
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self.node_object(&name, index);
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let created = match nodes.create(&pp, &node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 409 => nodes
                .get(&name)
                .await
                .map_err(|source| Error::RegisterNode { name: name.clone(), source })?,
            Err(source) => return Err(Error::RegisterNode { name, source }),
        };
        // The create drops status (it is a subresource): report it.
        let status = json!({"status": node.status});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|source| Error::RegisterNode { name: name.clone(), source })?;
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                              "uid": created.uid().unwrap_or_default()}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}
        }))
        .unwrap_or_default();
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        match leases.create(&pp, &lease).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => renew_lease(&self.client, &name).await,
            Err(source) => return Err(Error::CreateLease { name, source }),
        }
        Ok(())
    }

    async fn heartbeat_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let live = self.live_nodes();
            futures::stream::iter(live)
                .for_each_concurrent(self.config.concurrency.max(1), |n| {
                    let client = self.client.clone();
                    async move { renew_lease(&client, &n).await }
                })
                .await;
        }
    }

    async fn status_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.status_report);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            for n in self.live_nodes() {
                let _ = self.work.send(Work::NodeStatus(n));
            }
        }
    }

    /// Nodes whose Ready condition was changed by someone else (the node lifecycle
    /// controller) while they are live get their status reported again at once.
    async fn watch_nodes(self: Arc<Self>) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().labels(&format!("{SIMULATED_LABEL}=true"));
        let mut stream = watcher(nodes, cfg).applied_objects().boxed();
        loop {
            match stream.next().await {
                Some(Ok(node)) => {
                    let name = node.name_any();
                    if self.is_live(&name) && !node_ready(&node) {
                        let _ = self.work.send(Work::NodeStatus(name));
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "simulated nodes: node watch");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => return,
            }
        }
    }

    async fn watch_pods(self: Arc<Self>) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields("spec.nodeName!=");
        let mut stream = watcher(pods, cfg).applied_objects().boxed();
        loop {
            match stream.next().await {
                Some(Ok(pod)) => {
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                    if node.is_some_and(|n| self.is_live(n.as_str())) && pod_needs_work(&pod) {
                        self.enqueue(pod);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "simulated nodes: pod watch");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => return,
            }
        }
    }

    async fn work_loop(self: Arc<Self>, rx: mpsc::UnboundedReceiver<Work>) {
        let concurrency = self.config.concurrency.max(1);
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
            .for_each_concurrent(concurrency, |w| {
                let me = self.clone();
                async move {
                    match w {
                        Work::Pod(pod) => me.handle_pod(*pod).await,
                        Work::NodeStatus(n) => me.report_node(&n).await,
                    }
                }
            })
            .await;
    }

    async fn report_node(&self, name: &str) {
        if !self.is_live(name) {
            return;
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"status": {"conditions": ready_conditions()}});
        if let Err(e) =
            nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await
        {
            tracing::debug!(node = name, error = %e, "reporting node status");
        }
    }

    async fn handle_pod(&self, pod: Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        lock(&self.queued).remove(&key);
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return };
        if !self.is_live(&node) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        if pod.metadata.deletion_timestamp.is_some() {
            // The containers "stopped": finish the graceful deletion.
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }),
                ..Default::default()
            };
            match api.delete(&key.1, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => tracing::debug!(pod = %key.1, error = %e, "finishing pod deletion"),
            }
            return;
        }
        if !pod_needs_work(&pod) {
            return;
        }
        let existing_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        let (pod_ip, host_ip) = {
            let mut st = lock(&self.state);
            let Some(n) = st.nodes.get_mut(&node) else { return };
            let ip = match existing_ip {
                Some(ip) => ip,
                None => {
                    let off = n.next_ip;
                    n.next_ip = if n.next_ip >= 1021 { 2 } else { n.next_ip + 1 };
                    let base = u32::from(self.config.pod_network) + n.index * 1024;
                    Ipv4Addr::from(base + off).to_string()
                }
            };
            (ip, node_ip(n.index).to_string())
        };
        let status = running_status(&pod, &pod_ip, &host_ip);
        let patch = json!({"status": status});
        match api.patch_status(&key.1, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::debug!(pod = %key.1, error = %e, "reporting pod status"),
        }
    }
}

/// The fake InternalIP of node `index` (in 172.30.0.0/15, never routed).
fn node_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 30, 0, 1)) + index)
}

fn ready_conditions() -> serde_json::Value {
    let now = now_time();
    let cond = |t: &str, s: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": msg,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ])
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// A scheduled pod needs the node's attention when it is being deleted, or not yet
/// reported Running and Ready.
pub fn pod_needs_work(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let Some(status) = &pod.status else { return true };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    let ready = status
        .conditions
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    status.phase.as_deref() != Some("Running") || !ready || status.pod_ip.is_none()
}

/// The status a kubelet reports for a pod whose containers all run and are ready.
fn running_status(pod: &Pod, pod_ip: &str, host_ip: &str) -> serde_json::Value {
    let now = now_time();
    let start = pod.status.as_ref().and_then(|s| s.start_time.clone()).unwrap_or(now.clone());
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let containers: Vec<serde_json::Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({"name": c.name, "image": c.image.clone().unwrap_or_default(),
                   "imageID": "", "containerID": format!("sim://{}-{}", pod.uid().unwrap_or_default(), c.name),
                   "ready": true, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": start}}})
        })
        .collect();
    json!({
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                       cond("ContainersReady"), cond("PodScheduled")],
        "containerStatuses": containers,
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "startTime": start,
        "qosClass": pod.status.as_ref().and_then(|s| s.qos_class.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::ApiServer;
    use crate::store::memory::MemoryStore;

    async fn api() -> (Arc<ApiServer>, Client) {
        let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("apiserver");
        let client = api.client();
        (api, client)
    }

    fn pod(name: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod")
    }

    async fn wait_for<F: Fn() -> Fut, Fut: std::future::Future<Output = bool>>(what: &str, f: F) {
        for _ in 0..600 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn registers_nodes_with_leases_and_runs_pods() {
        let (_api, client) = api().await;
        let sim = SimulatedNodes::start(
            client.clone(),
            SimConfig::default().with_count(3).with_zones(&["a", "b"]),
        )
        .await
        .expect("sim");
        assert_eq!(sim.node_names(), vec!["sim-node-0", "sim-node-1", "sim-node-2"]);
        let nodes: Api<Node> = Api::all(client.clone());
        let n1 = nodes.get("sim-node-1").await.expect("node");
        assert!(node_ready(&n1), "node reports Ready");
        assert_eq!(n1.labels()["topology.kubernetes.io/zone"], "b");
        assert_eq!(n1.labels()["kubernetes.io/hostname"], "sim-node-1");
        let alloc = n1.status.as_ref().and_then(|s| s.allocatable.clone()).expect("allocatable");
        assert_eq!(alloc["pods"].0, "110");
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let lease = leases.get("sim-node-1").await.expect("lease");
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("sim-node-1"));

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        pods.create(&PostParams::default(), &pod("p1", Some("sim-node-1"))).await.expect("pod");
        pods.create(&PostParams::default(), &pod("unscheduled", None)).await.expect("pod");
        wait_for("p1 running", || async {
            let p = pods.get("p1").await.expect("get");
            !pod_needs_work(&p)
        })
        .await;
        let p = pods.get("p1").await.expect("get");
        let st = p.status.expect("status");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.host_ip.as_deref(), Some("172.30.0.2"));
        assert!(st.pod_ip.as_deref().is_some_and(|ip| ip.starts_with("100.64.4.")), "{st:?}");
        assert_eq!(st.container_statuses.map(|c| c.len()), Some(1));
        let u = pods.get("unscheduled").await.expect("get");
        assert_ne!(u.status.and_then(|s| s.phase).as_deref(), Some("Running"));

        // Graceful deletion is finished by the node.
        pods.delete("p1", &DeleteParams::default()).await.expect("delete");
        wait_for("p1 gone", || async { pods.get_opt("p1").await.expect("get").is_none() }).await;
    }

    #[tokio::test]
    async fn stopped_node_stops_heartbeating_and_serving() {
        let (_api, client) = api().await;
        let sim = SimulatedNodes::start(
            client.clone(),
            SimConfig::default().with_count(2).with_heartbeat(Duration::from_millis(50)),
        )
        .await
        .expect("sim");
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let renew = |n: &'static str| {
            let leases = leases.clone();
            async move { leases.get(n).await.expect("lease").spec.and_then(|s| s.renew_time) }
        };
        let before = renew("sim-node-0").await;
        wait_for("lease renewed", || async { renew("sim-node-0").await != before }).await;
        sim.stop_node("sim-node-0").expect("stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = renew("sim-node-0").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(renew("sim-node-0").await, stopped, "a stopped node does not heartbeat");

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        pods.create(&PostParams::default(), &pod("p", Some("sim-node-0"))).await.expect("pod");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = pods.get("p").await.expect("get");
        assert!(pod_needs_work(&p), "a stopped node does not run pods");
        sim.resume_node("sim-node-0").await.expect("resume");
        wait_for("p running after resume", || async {
            !pod_needs_work(&pods.get("p").await.expect("get"))
        })
        .await;
        assert!(sim.stop_node("nope").is_err());
        let added = sim.add_node().await.expect("add");
        assert_eq!(added, "sim-node-2");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scales_to_hundreds_of_nodes_and_thousands_of_pods() {
        let (_api, client) = api().await;
        let t = std::time::Instant::now();
        let sim = SimulatedNodes::start(client.clone(), SimConfig::default().with_count(200))
            .await
            .expect("sim");
        let registered = t.elapsed();
        assert_eq!(sim.node_names().len(), 200);
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        futures::stream::iter(0..2000)
            .for_each_concurrent(64, |i| {
                let pods = pods.clone();
                async move {
                    let node = format!("sim-node-{}", i % 200);
                    pods.create(&PostParams::default(), &pod(&format!("p{i}"), Some(&node)))
                        .await
                        .expect("create");
                }
            })
            .await;
        wait_for("2000 pods running", || async {
            let list = pods.list(&ListParams::default().fields("status.phase=Running")).await;
            list.expect("list").items.len() == 2000
        })
        .await;
        eprintln!("200 nodes registered in {registered:?}; 2000 pods running in {:?}", t.elapsed());
    }
}
