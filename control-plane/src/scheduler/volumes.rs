//! Upstream's VolumeBinding plugin for statically bound claims: a pod whose
//! PersistentVolumeClaim is missing or not yet bound is unschedulable (PreFilter), and a
//! node must satisfy the required node affinity of every volume the pod's claims are bound
//! to (a local volume lives on one node). Claims and volumes come from their own watches.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;

use super::cache::PodInfo;

/// The claims and volumes the scheduler has seen.
#[derive(Debug, Default)]
pub struct VolumeCache {
    /// `<namespace>/<name>` of each claim → the volume it is bound to ("" while unbound)
    /// and whether the claim is being deleted.
    claims: HashMap<String, (String, bool)>,
    /// Each volume's required node affinity (empty: any node).
    affinity: HashMap<String, Vec<NodeSelectorTerm>>,
}

fn claim_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl VolumeCache {
    pub fn upsert_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        let key = claim_key(&pvc.namespace().unwrap_or_default(), &pvc.name_any());
        self.claims.insert(key, (volume, pvc.metadata.deletion_timestamp.is_some()));
    }

    pub fn remove_claim(&mut self, pvc: &PersistentVolumeClaim) {
        self.claims.remove(&claim_key(&pvc.namespace().unwrap_or_default(), &pvc.name_any()));
    }

    pub fn upsert_volume(&mut self, pv: &PersistentVolume) {
        let terms = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| r.node_selector_terms.clone())
            .unwrap_or_default();
        self.affinity.insert(pv.name_any(), terms);
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

    /// PreFilter: the node affinity terms of the volumes the pod's claims are bound to, or
    /// upstream's message for a claim that is missing, being deleted or unbound.
    pub fn prefilter(&self, pod: &PodInfo) -> Result<Vec<Vec<NodeSelectorTerm>>, String> {
        let mut terms = Vec::new();
        let volumes = pod.pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
        for v in volumes {
            let Some(c) = &v.persistent_volume_claim else { continue };
            let Some((volume, deleting)) =
                self.claims.get(&claim_key(&pod.namespace, &c.claim_name))
            else {
                return Err(format!("persistentvolumeclaim \"{}\" not found", c.claim_name));
            };
            if *deleting {
                return Err(format!("persistentvolumeclaim \"{}\" is being deleted", c.claim_name));
            }
            if volume.is_empty() {
                return Err("pod has unbound immediate PersistentVolumeClaims".to_string());
            }
            if let Some(t) = self.affinity.get(volume).filter(|t| !t.is_empty()) {
                terms.push(t.clone());
            }
        }
        Ok(terms)
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
        assert_eq!(cache.prefilter(&pod), Ok(vec![]));
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
        let terms = cache.prefilter(&pod).unwrap();
        assert_eq!(terms.len(), 1);
        assert_eq!(
            prefilter_message(3, "x"),
            "0/3 nodes are available: x. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
    }
}
