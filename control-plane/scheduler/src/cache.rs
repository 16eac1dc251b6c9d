//! The scheduler cache: every node with the pods assigned to it and their summed requests,
//! host ports and owner counts, kept from watch events, plus pods *assumed* on a node the
//! moment the scheduler chose it (before the watch shows the binding), so two pods never
//! overbook a node; an assumed pod is forgotten again when its binding fails.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod, Taint};

use super::resources::{Resources, node_allocatable, pod_requests};
use skiff_core::labels::{Labels, labels_of};

/// `namespace/name`.
pub type PodKey = String;

pub fn pod_key(pod: &Pod) -> PodKey {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A host port a pod uses: (protocol, host IP, port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub protocol: String,
    pub ip: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let wildcard = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || wildcard(&self.ip) || wildcard(&other.ip))
    }
}

/// A controller owner's uid with its hash computed once: default spreading looks the
/// incoming pod's owner up in every feasible node's counts, so that lookup must not hash
/// the 36-byte uid again each time. The uid is interned: the pods of one owner share one
/// allocation, so a lookup's equality check is a pointer comparison, not a `memcmp`.
#[derive(Debug, Clone)]
pub struct OwnerKey {
    hash: u64,
    uid: Arc<str>,
}

/// Interned owner uids, held weakly: an owner whose last pod is gone is dropped at the
/// next sweep (when the table has doubled since the previous one).
#[derive(Default)]
struct Interned {
    uids: HashMap<Arc<str>, std::sync::Weak<str>>,
    sweep_at: usize,
}

impl OwnerKey {
    pub fn new(uid: &str) -> OwnerKey {
        static STATE: OnceLock<RandomState> = OnceLock::new();
        static INTERNED: OnceLock<std::sync::Mutex<Interned>> = OnceLock::new();
        let hash = STATE.get_or_init(RandomState::new).hash_one(uid);
        let mut interned =
            INTERNED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(uid) = interned.uids.get(uid).and_then(std::sync::Weak::upgrade) {
            return OwnerKey { hash, uid };
        }
        if interned.uids.len() >= interned.sweep_at {
            interned.uids.retain(|_, weak| weak.strong_count() > 0);
            interned.sweep_at = (interned.uids.len() * 2).max(1024);
        }
        let shared: Arc<str> = uid.into();
        interned.uids.insert(Arc::from(uid), Arc::downgrade(&shared));
        OwnerKey { hash, uid: shared }
    }

    pub fn uid(&self) -> &str {
        &self.uid
    }
}

impl PartialEq for OwnerKey {
    fn eq(&self, other: &OwnerKey) -> bool {
        self.hash == other.hash && (Arc::ptr_eq(&self.uid, &other.uid) || self.uid == other.uid)
    }
}

impl Eq for OwnerKey {}

impl Hash for OwnerKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Passes an [`OwnerKey`]'s precomputed hash through.
#[derive(Default)]
pub struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than OwnerKey: fold the bytes (FNV-1a).
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Pods per controller owner on one node.
pub type OwnerCounts = HashMap<OwnerKey, u32, BuildHasherDefault<PrehashedHasher>>;

/// A pod with what the scheduler needs from it computed once.
#[derive(Debug)]
pub struct PodInfo {
    pub pod: Pod,
    pub key: PodKey,
    pub uid: String,
    pub namespace: String,
    pub requests: Resources,
    pub nonzero: Resources,
    pub host_ports: Vec<HostPort>,
    pub priority: i32,
    /// uid of the controller owner (ReplicaSet, StatefulSet, ...), for default spreading.
    pub owner: Option<OwnerKey>,
    pub terminating: bool,
}

impl PodInfo {
    pub fn new(pod: Pod) -> PodInfo {
        let (requests, nonzero) = pod_requests(&pod);
        let host_ports = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = p.host_port.filter(|p| *p > 0)?;
                Some(HostPort {
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ip: p.host_ip.clone().unwrap_or_default(),
                    port,
                })
            })
            .collect();
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| OwnerKey::new(&o.uid));
        PodInfo {
            key: pod_key(&pod),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            requests,
            nonzero,
            host_ports,
            priority,
            owner,
            pod,
        }
    }

    pub fn labels(&self) -> &Labels {
        labels_of(&self.pod.metadata)
    }

    pub fn node_name(&self) -> Option<&str> {
        self.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
    }

    pub fn has_required_anti_affinity(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .is_some_and(|t| !t.is_empty())
    }
}

/// One node and what is assigned to it.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub name: String,
    /// `None` while pods are known on a node the watch has not shown (yet).
    pub node: Option<Arc<Node>>,
    pub labels: Labels,
    pub allocatable: Resources,
    pub ready: bool,
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
    pub requested: Resources,
    pub nonzero_requested: Resources,
    pub pods: HashMap<PodKey, Arc<PodInfo>>,
    pub used_ports: Vec<HostPort>,
    /// Pods per controller owner uid (default topology spreading).
    pub owner_counts: OwnerCounts,
}

impl NodeInfo {
    pub fn new(name: &str) -> NodeInfo {
        NodeInfo { name: name.to_string(), ..Default::default() }
    }

    pub fn set_node(&mut self, node: Node) {
        self.labels = labels_of(&node.metadata).clone();
        self.allocatable = node_allocatable(&node);
        let status = node.status.as_ref();
        self.ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let spec = node.spec.as_ref();
        self.unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        self.taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        self.node = Some(Arc::new(node));
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.nonzero_requested.add(&pod.nonzero);
        self.used_ports.extend(pod.host_ports.iter().cloned());
        if let Some(owner) = &pod.owner {
            *self.owner_counts.entry(owner.clone()).or_default() += 1;
        }
        if let Some(old) = self.pods.insert(pod.key.clone(), pod) {
            self.account_removed(&old);
        }
    }

    pub fn remove_pod(&mut self, key: &str) -> Option<Arc<PodInfo>> {
        let old = self.pods.remove(key)?;
        self.account_removed(&old);
        Some(old)
    }

    fn account_removed(&mut self, old: &PodInfo) {
        self.requested.sub(&old.requests);
        self.nonzero_requested.sub(&old.nonzero);
        for p in &old.host_ports {
            if let Some(i) = self.used_ports.iter().position(|u| u == p) {
                self.used_ports.swap_remove(i);
            }
        }
        if let Some(owner) = &old.owner
            && let Some(c) = self.owner_counts.get_mut(owner)
        {
            *c -= 1;
            if *c == 0 {
                self.owner_counts.remove(owner);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Placement {
    node: String,
    assumed: bool,
    /// The pod's uid: a pod of the same name created later is another pod.
    uid: String,
}

/// All nodes (in a stable order for round-robin filtering) and where every pod is.
#[derive(Debug, Default)]
pub struct Cache {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    placements: HashMap<PodKey, Placement>,
    /// Pods with required anti-affinity terms: checked against every incoming pod.
    anti_affinity_pods: HashMap<PodKey, Arc<PodInfo>>,
}

impl Cache {
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    /// Nodes the watch has shown (not placeholders).
    pub fn node_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.node.is_some()).count()
    }

    pub fn anti_affinity_pods(&self) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.anti_affinity_pods.values()
    }

    fn node_mut(&mut self, name: &str) -> &mut NodeInfo {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.nodes.push(NodeInfo::new(name));
                self.index.insert(name.to_string(), self.nodes.len() - 1);
                self.nodes.len() - 1
            }
        };
        &mut self.nodes[i]
    }

    /// Add or update a node; whether anything scheduling looks at changed (so heartbeats
    /// do not requeue every unschedulable pod).
    pub fn upsert_node(&mut self, node: Node) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let n = self.node_mut(&name);
        let key = |n: &NodeInfo| {
            (
                n.node.is_some(),
                n.labels.clone(),
                n.allocatable,
                n.ready,
                n.unschedulable,
                n.taints.clone(),
            )
        };
        let before = key(n);
        n.set_node(node);
        before != key(n)
    }

    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.get(name).copied() else { return };
        if !self.nodes[i].pods.is_empty() {
            // Keep its pods accounted until they are deleted; only the node is gone.
            self.nodes[i].node = None;
            return;
        }
        self.nodes.swap_remove(i);
        self.index.remove(name);
        if i < self.nodes.len() {
            let moved = self.nodes[i].name.clone();
            self.index.insert(moved, i);
        }
    }

    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().filter(|n| n.node.is_some()).map(|n| n.name.clone()).collect()
    }

    /// An assigned pod seen by the watch (confirms an assumed one).
    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        let Some(node) = pod.node_name().map(str::to_string) else { return };
        if let Some(old) = self.placements.get(&pod.key).cloned()
            && old.node != node
        {
            self.remove_pod(&pod.key);
        }
        self.place(pod, &node, false);
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str, assumed: bool) {
        if pod.has_required_anti_affinity() {
            self.anti_affinity_pods.insert(pod.key.clone(), pod.clone());
        }
        let placement = Placement { node: node.to_string(), assumed, uid: pod.uid.clone() };
        self.placements.insert(pod.key.clone(), placement);
        self.node_mut(node).add_pod(pod);
    }

    /// Count `pod` on `node` now, before its binding is visible.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.place(pod, node, true);
    }

    pub fn is_assumed(&self, key: &str) -> bool {
        self.placements.get(key).is_some_and(|p| p.assumed)
    }

    /// Whether this very pod (by uid) is assumed, not only one of its name.
    pub fn is_assumed_uid(&self, key: &str, uid: &str) -> bool {
        self.placements.get(key).is_some_and(|p| p.assumed && p.uid == uid)
    }

    /// Undo the assumption of this very pod after a failed binding (no-op once the watch
    /// confirmed it; a later pod of the same name keeps its own assumption).
    pub fn forget(&mut self, key: &str, uid: &str) {
        if self.is_assumed_uid(key, uid) {
            self.remove_pod(key);
        }
    }

    pub fn remove_pod(&mut self, key: &str) -> Option<Arc<PodInfo>> {
        let placement = self.placements.remove(key)?;
        self.anti_affinity_pods.remove(key);
        let i = *self.index.get(&placement.node)?;
        let removed = self.nodes[i].remove_pod(key);
        if self.nodes[i].node.is_none() && self.nodes[i].pods.is_empty() {
            self.remove_node(&placement.node);
        }
        removed
    }

    pub fn pod_keys(&self) -> Vec<PodKey> {
        self.placements.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn pod(name: &str, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}},
                                      "ports": [{"containerPort": 80, "hostPort": 8080}]}]}
        }))
        .unwrap()
    }

    #[test]
    fn owner_keys_of_one_uid_share_it() {
        let uid = "8d6f0c51-owner-keys-of-one-uid-share-it";
        let (a, b) = (OwnerKey::new(uid), OwnerKey::new(uid));
        assert!(Arc::ptr_eq(&a.uid, &b.uid));
        assert_eq!(a, b);
        let other = OwnerKey::new("8d6f0c51-another-owner");
        assert_ne!(a, other);
        assert_eq!(other.uid(), "8d6f0c51-another-owner");
        // Once every key of an owner is gone, a new one starts a fresh allocation.
        drop((a, b));
        assert_eq!(OwnerKey::new(uid).uid(), uid);
    }

    #[test]
    fn assume_confirm_forget() {
        let mut cache = Cache::default();
        cache.upsert_node(serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap());
        let p = Arc::new(PodInfo::new(pod("a", "500m")));
        cache.assume(p.clone(), "n1");
        assert_eq!(cache.node("n1").unwrap().requested.milli_cpu, 500);
        assert_eq!(cache.node("n1").unwrap().used_ports.len(), 1);
        cache.forget("default/a", &p.uid);
        assert_eq!(cache.node("n1").unwrap().requested, Resources::default());
        assert!(cache.node("n1").unwrap().used_ports.is_empty());

        // Assumed, then confirmed by the watch: counted once, no longer forgettable.
        cache.assume(p.clone(), "n1");
        let mut bound = pod("a", "500m");
        bound.spec.as_mut().unwrap().node_name = Some("n1".into());
        cache.add_pod(Arc::new(PodInfo::new(bound)));
        assert_eq!(cache.node("n1").unwrap().requested.milli_cpu, 500);
        cache.forget("default/a", &p.uid);
        assert_eq!(cache.node("n1").unwrap().requested.milli_cpu, 500);
        cache.remove_pod("default/a");
        assert_eq!(cache.node("n1").unwrap().requested.milli_cpu, 0);
    }

    #[test]
    fn pods_on_unknown_nodes_are_kept_until_deleted() {
        let mut cache = Cache::default();
        let mut bound = pod("a", "1");
        bound.spec.as_mut().unwrap().node_name = Some("ghost".into());
        cache.add_pod(Arc::new(PodInfo::new(bound)));
        assert_eq!(cache.node_count(), 0);
        assert_eq!(cache.node("ghost").unwrap().requested.milli_cpu, 1000);
        cache.remove_pod("default/a");
        assert!(cache.node("ghost").is_none());
    }
}
