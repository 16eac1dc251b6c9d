//! Volumes as the scheduler, the local-path provisioner and the node agent all see them:
//! the provisioner's names and limits, and a volume's node affinity.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim};

/// Who provisioned a volume (upstream's annotation; the binder leaves the deletion of such
/// volumes to their provisioner).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The provisioner name classes name to be served here.
pub const PROVISIONER: &str = "skiff.dev/local-path";
/// The node the scheduler chose for a claim's first pod.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Why the provisioner cannot serve `pvc` (its ProvisioningFailed message), if it cannot:
/// it gives single-node access to a directory. The scheduler keeps such a claim's pods
/// pending with the same words.
pub fn unsupported(pvc: &PersistentVolumeClaim) -> Option<String> {
    let spec = pvc.spec.as_ref()?;
    if spec.volume_mode.as_deref() == Some("Block") {
        return Some("skiff.dev/local-path provides Filesystem volumes only".into());
    }
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    modes.iter().find(|m| !matches!(m.as_str(), "ReadWriteOnce" | "ReadWriteOncePod")).map(|m| {
        format!(
            "skiff.dev/local-path does not support access mode {m}: only ReadWriteOnce and ReadWriteOncePod"
        )
    })
}

/// A volume's required node affinity terms (none: any node), as the scheduler and the
/// node agent check them.
pub fn required_terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    let required = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()?.required.as_ref());
    required.map_or(&[], |r| r.node_selector_terms.as_slice())
}
