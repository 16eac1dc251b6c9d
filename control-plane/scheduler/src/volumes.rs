//! Upstream's VolumeBinding plugin for statically bound claims: a pod whose
//! PersistentVolumeClaim is missing or not yet bound is unschedulable (PreFilter), and a
//! node must satisfy the required node affinity of every volume the pod's claims are bound
//! to (a local volume lives on one node). Claims, volumes and StorageClasses come from
//! their own watches.
//!
//! A claim of a WaitForFirstConsumer class that skiff's local-path provisioner serves is
//! the exception: it does not hold the pod back. The node chosen for its first pod is
//! written on the claim (`volume.kubernetes.io/selected-node`, upstream's PreBind) before
//! the pod is bound, the provisioner makes the volume there, and later pods follow it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use skiff_core::volumes::{PROVISIONER, SELECTED_NODE, required_terms, unsupported};

use super::cache::PodInfo;

/// The claims and volumes the scheduler has seen.
#[derive(Debug, Default)]
pub struct VolumeCache {
    /// `<namespace>/<name>` of each claim → what scheduling needs of it.
    claims: HashMap<String, Claim>,
    /// Each volume's required node affinity (empty: any node).
    affinity: HashMap<String, Vec<NodeSelectorTerm>>,
    /// The StorageClasses whose claims the local-path provisioner serves once a node is
    /// selected (its classes in WaitForFirstConsumer mode).
    provisioned: std::collections::HashSet<String>,
    /// The kinds (claims, volumes, classes) whose watch has listed everything once: until
    /// all three have, a pod's claims cannot be judged.
    synced: std::collections::HashSet<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Claim {
    /// The volume it is bound to ("" while unbound).
    volume: String,
    deleting: bool,
    class: String,
    selected_node: Option<String>,
    resource_version: String,
    /// Why the local-path provisioner could not serve it, if it could not.
    unprovisionable: Option<String>,
}

/// What the pod's claims ask of scheduling.
#[derive(Debug, Default, PartialEq)]
pub struct VolumePlan {
    /// The node affinity terms a node must satisfy, one list per volume.
    pub terms: Vec<Vec<NodeSelectorTerm>>,
    /// Claims (name, resourceVersion seen) to mark with the chosen node before the pod is
    /// bound.
    pub select: Vec<(String, String)>,
    /// Claims still unbound (provisioning): the pod is bound only once they all are.
    pub wait: Vec<String>,
}

/// Where a claim the pod waits on stands.
#[derive(Debug, PartialEq)]
pub enum Binding {
    Bound,
    Pending,
    /// Gone or being deleted: the pod goes back to the queue.
    Lost(String),
}

/// A term that only the node named `node` satisfies.
fn on_node(node: &str) -> Vec<NodeSelectorTerm> {
    vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "kubernetes.io/hostname".into(),
            operator: "In".into(),
            values: Some(vec![node.to_string()]),
        }]),
        match_fields: None,
    }]
}

fn claim_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl VolumeCache {
    pub fn upsert_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let spec = pvc.spec.as_ref();
        let claim = Claim {
            volume: spec.and_then(|s| s.volume_name.clone()).unwrap_or_default(),
            deleting: pvc.metadata.deletion_timestamp.is_some(),
            class: pvc
                .annotations()
                .get("volume.beta.kubernetes.io/storage-class")
                .cloned()
                .or_else(|| spec.and_then(|s| s.storage_class_name.clone()))
                .unwrap_or_default(),
            selected_node: pvc.annotations().get(SELECTED_NODE).cloned(),
            resource_version: pvc.resource_version().unwrap_or_default(),
            unprovisionable: unsupported(pvc),
        };
        let key = claim_key(&pvc.namespace().unwrap_or_default(), &pvc.name_any());
        self.claims.insert(key, claim);
    }

    pub fn upsert_class(&mut self, sc: &StorageClass) {
        let delayed = sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        if delayed && sc.provisioner == PROVISIONER {
            self.provisioned.insert(sc.name_any());
        } else {
            self.provisioned.remove(&sc.name_any());
        }
    }

    pub fn remove_class(&mut self, sc: &StorageClass) {
        self.provisioned.remove(&sc.name_any());
    }

    pub fn retain_classes(&mut self, keep: impl Fn(&str) -> bool) {
        self.provisioned.retain(|k| keep(k));
    }

    /// The watch of `kind` has listed everything once.
    pub fn mark_synced(&mut self, kind: &str) {
        self.synced.insert(kind.to_string());
    }

    /// Whether claims, volumes and StorageClasses have all been listed.
    pub fn synced(&self) -> bool {
        self.synced.len() == 3
    }

    pub fn remove_claim(&mut self, pvc: &PersistentVolumeClaim) {
        self.claims.remove(&claim_key(&pvc.namespace().unwrap_or_default(), &pvc.name_any()));
    }

    pub fn upsert_volume(&mut self, pv: &PersistentVolume) {
        self.affinity.insert(pv.name_any(), required_terms(pv).to_vec());
    }

    pub fn remove_volume(&mut self, pv: &PersistentVolume) {
        self.affinity.remove(&pv.name_any());
    }

    /// Forget what a relist did not show again.
    pub fn retain_claims(&mut self, keep: impl Fn(&str) -> bool) {
        self.claims.retain(|k, _| keep(k));
    }

    pub fn retain_volumes(&mut self, keep: impl Fn(&str) -> bool) {
        self.affinity.retain(|k, _| keep(k));
    }

    /// The claim `ns/name`, or upstream's words for why a pod cannot use it: missing or
    /// being deleted.
    fn usable_claim(&self, ns: &str, name: &str) -> Result<&Claim, String> {
        let claim = self
            .claims
            .get(&claim_key(ns, name))
            .ok_or_else(|| format!("persistentvolumeclaim \"{name}\" not found"))?;
        if claim.deleting {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        Ok(claim)
    }

    /// Upstream's PreBind wait (`checkBindings`): whether the claim `ns/name`, which a pod
    /// assumed on `node` waits for, is bound yet. `written` is the resourceVersion of the
    /// scheduler's own write of the selected node, if it wrote it: an older view of the
    /// claim is waited out rather than judged.
    pub fn binding(&self, ns: &str, name: &str, node: &str, written: Option<&str>) -> Binding {
        let c = match self.usable_claim(ns, name) {
            Ok(c) => c,
            Err(why) => return Binding::Lost(why),
        };
        let rv = |v: &str| v.parse::<u64>().ok();
        if let (Some(seen), Some(wrote)) = (rv(&c.resource_version), written.and_then(rv))
            && seen < wrote
        {
            return Binding::Pending;
        }
        match &c.selected_node {
            Some(other) if other != node => {
                return Binding::Lost(format!(
                    "selectedNode annotation value \"{other}\" not set to scheduled node \"{node}\""
                ));
            }
            // The provisioner dropped the selection (its node went away).
            None if c.volume.is_empty() => {
                return Binding::Lost(format!("selectedNode annotation reset for PVC \"{name}\""));
            }
            _ => {}
        }
        if c.volume.is_empty() { Binding::Pending } else { Binding::Bound }
    }

    /// PreFilter: the node affinity terms of the volumes the pod's claims are bound to (or
    /// of the node selected for a claim still being provisioned), and the claims to
    /// provision on the chosen node; or upstream's message for a claim that is missing,
    /// being deleted or unbound.
    pub fn prefilter(&self, pod: &PodInfo) -> Result<VolumePlan, String> {
        let mut plan = VolumePlan::default();
        let volumes = pod.pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
        for v in volumes {
            let Some(c) = &v.persistent_volume_claim else { continue };
            let claim = self.usable_claim(&pod.namespace, &c.claim_name)?;
            // A node selected for the claim holds its pods, bound or not.
            if let Some(node) = &claim.selected_node {
                plan.terms.push(on_node(node));
            }
            if claim.volume.is_empty() {
                if !self.provisioned.contains(&claim.class) {
                    return Err("pod has unbound immediate PersistentVolumeClaims".to_string());
                }
                if let Some(why) = &claim.unprovisionable {
                    return Err(format!("persistentvolumeclaim \"{}\": {why}", c.claim_name));
                }
                let pending = (c.claim_name.clone(), claim.resource_version.clone());
                if claim.selected_node.is_none() && !plan.select.contains(&pending) {
                    plan.select.push(pending);
                }
                if !plan.wait.contains(&c.claim_name) {
                    plan.wait.push(c.claim_name.clone());
                }
                continue;
            }
            // Bound to a volume not seen yet: its node affinity is unknown (upstream's
            // VolumeBinding fails PreFilter the same way); the volume's watch retries it.
            let Some(terms) = self.affinity.get(&claim.volume) else {
                return Err(format!(
                    "persistentvolume \"{}\" bound to persistentvolumeclaim \"{}\" not found",
                    claim.volume, c.claim_name
                ));
            };
            if !terms.is_empty() {
                plan.terms.push(terms.clone());
            }
        }
        Ok(plan)
    }
}

/// Upstream's message when PreFilter rejects the pod: no node was looked at and
/// preemption cannot help.
pub fn prefilter_message(total_nodes: usize, why: &str) -> String {
    if total_nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    format!(
        "0/{total_nodes} nodes are available: {why}. preemption: 0/{total_nodes} nodes are available: {total_nodes} Preemption is not helpful for scheduling."
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn pod_with_claim(claim: &str) -> Arc<PodInfo> {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        }))
        .unwrap();
        Arc::new(PodInfo::new(pod))
    }

    #[test]
    fn claims_must_exist_and_be_bound() {
        let mut cache = VolumeCache::default();
        let pod = pod_with_claim("data");
        assert_eq!(
            cache.prefilter(&pod),
            Err("persistentvolumeclaim \"data\" not found".to_string())
        );
        let mut pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default"}, "spec": {}
        }))
        .unwrap();
        cache.upsert_claim(&pvc);
        assert_eq!(
            cache.prefilter(&pod),
            Err("pod has unbound immediate PersistentVolumeClaims".to_string())
        );
        pvc.spec.as_mut().unwrap().volume_name = Some("local-1".into());
        cache.upsert_claim(&pvc);
        assert_eq!(
            cache.prefilter(&pod),
            Err("persistentvolume \"local-1\" bound to persistentvolumeclaim \"data\" not found"
                .to_string()),
            "a volume not seen yet"
        );
        let anywhere: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "local-1"}, "spec": {}})).unwrap();
        cache.upsert_volume(&anywhere);
        assert_eq!(cache.prefilter(&pod), Ok(VolumePlan::default()));
        let mut deleting = pvc.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        cache.upsert_claim(&deleting);
        assert_eq!(
            cache.prefilter(&pod),
            Err("persistentvolumeclaim \"data\" is being deleted".to_string())
        );
        cache.upsert_claim(&pvc);
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "local-1"},
            "spec": {"local": {"path": "/mnt/disk"}, "nodeAffinity": {"required": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}}
        }))
        .unwrap();
        cache.upsert_volume(&pv);
        let terms = cache.prefilter(&pod).unwrap().terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(
            prefilter_message(3, "x"),
            "0/3 nodes are available: x. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn claims_the_local_path_provisioner_serves_pick_the_node() {
        let mut cache = VolumeCache::default();
        let pod = pod_with_claim("data");
        let mut pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default", "resourceVersion": "7"},
            "spec": {"storageClassName": "local-path"}
        }))
        .unwrap();
        cache.upsert_claim(&pvc);
        // Until the class is known to be the provisioner's WaitForFirstConsumer class.
        assert!(cache.prefilter(&pod).is_err());
        let mut sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "local-path"}, "provisioner": PROVISIONER,
            "volumeBindingMode": "Immediate"
        }))
        .unwrap();
        cache.upsert_class(&sc);
        assert!(cache.prefilter(&pod).is_err(), "Immediate: nothing to wait for");
        sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
        cache.upsert_class(&sc);
        assert_eq!(
            cache.prefilter(&pod),
            Ok(VolumePlan {
                terms: vec![],
                select: vec![("data".into(), "7".into())],
                wait: vec!["data".into()]
            })
        );
        assert_eq!(
            cache.binding("default", "data", "n2", None),
            Binding::Lost("selectedNode annotation reset for PVC \"data\"".into())
        );
        // Right after the scheduler's own write: the cache's older view is waited out.
        assert_eq!(cache.binding("default", "data", "n2", Some("8")), Binding::Pending);
        // Once a node is selected, every pod of the claim goes there, bound or not, and is
        // bound itself only once the claim is.
        pvc.metadata.annotations = Some([(SELECTED_NODE.to_string(), "n2".to_string())].into());
        cache.upsert_claim(&pvc);
        let on_n2 =
            VolumePlan { terms: vec![on_node("n2")], select: vec![], wait: vec!["data".into()] };
        assert_eq!(cache.prefilter(&pod), Ok(on_n2));
        assert_eq!(cache.binding("default", "data", "n2", None), Binding::Pending);
        assert_eq!(
            cache.binding("default", "data", "n1", None),
            Binding::Lost(
                "selectedNode annotation value \"n2\" not set to scheduled node \"n1\"".into()
            )
        );
        pvc.spec.as_mut().unwrap().volume_name = Some("pvc-1".into());
        cache.upsert_claim(&pvc);
        assert_eq!(cache.binding("default", "data", "n2", None), Binding::Bound);
        let pv: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pvc-1"}, "spec": {}})).unwrap();
        cache.upsert_volume(&pv);
        let on_n2 = VolumePlan { terms: vec![on_node("n2")], select: vec![], wait: vec![] };
        assert_eq!(cache.prefilter(&pod), Ok(on_n2));
        assert_eq!(
            cache.binding("default", "other", "n2", None),
            Binding::Lost("persistentvolumeclaim \"other\" not found".into())
        );
        // A claim the provisioner cannot serve keeps its pods pending.
        let mut rwx: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"storageClassName": "local-path", "accessModes": ["ReadWriteMany"]}
        }))
        .unwrap();
        cache.upsert_claim(&rwx);
        let err = cache.prefilter(&pod).expect_err("ReadWriteMany");
        assert!(err.contains("ReadWriteMany"), "{err}");
        rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOnce".into()]);
        cache.upsert_claim(&rwx);
        assert!(cache.prefilter(&pod).is_ok());
        // Without the class, an unbound claim is an unbound immediate claim again.
        pvc.spec.as_mut().unwrap().volume_name = None;
        pvc.metadata.annotations = None;
        cache.upsert_claim(&pvc);
        cache.remove_class(&sc);
        assert!(cache.prefilter(&pod).is_err());
    }
}
