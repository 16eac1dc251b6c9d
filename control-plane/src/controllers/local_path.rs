//! skiff's local-path provisioner (after k3s's local-path-provisioner, run in the
//! controller manager): a claim of a StorageClass whose provisioner is
//! `skiff.dev/local-path` gets a hostPath volume on the node the scheduler chose for its
//! first pod (`volume.kubernetes.io/selected-node`), in `<root>/pvc-<uid>_<namespace>_<name>`
//! (created by the agent when it mounts it), pinned to that node by node affinity and
//! pre-bound to the claim, which the binder then binds. A provisioned volume released with
//! reclaim policy Delete is deleted; its directory stays on the node.
//!
//! At start it creates the StorageClass `local-path` (WaitForFirstConsumer, Delete; the
//! cluster default unless another class is) unless a class of that name exists. A claim
//! whose selected node is gone loses the selection, so that its next pod picks again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use super::Context;
use super::events::EventType;
use super::informer::{WorkloadCtx as Ctx, run_controller};
use super::volume::{Error, api_err};

/// The provisioner name classes name to be served here.
pub const PROVISIONER: &str = "skiff.dev/local-path";
/// The node the scheduler chose for a claim's first pod.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Who provisioned a volume (upstream's annotation; the binder leaves the deletion of such
/// volumes to their provisioner).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The StorageClass created at start.
pub const DEFAULT_CLASS: &str = "local-path";

struct Provisioner {
    root: PathBuf,
    ctx: Arc<Ctx>,
}

/// Run the provisioner, its volumes under `root` on every node, until the future is
/// dropped.
pub async fn run(ctx: Arc<Context>, root: PathBuf) {
    let client = ctx.client.clone();
    if let Err(e) = ensure_default_class(&client).await {
        tracing::warn!(error = %e, "creating the local-path StorageClass");
    }
    let me = Arc::new(Provisioner { root, ctx: Ctx::new(client.clone(), PROVISIONER) });
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    );
    let volumes =
        Controller::new(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default());
    let (a, b) = (me.clone(), me);
    tokio::join!(
        run_controller(claims, a.ctx.clone(), move |pvc, _| {
            let p = a.clone();
            async move { p.reconcile_claim(pvc).await }
        }),
        run_controller(volumes, b.ctx.clone(), move |pv, _| {
            let p = b.clone();
            async move { p.reconcile_volume(pv).await }
        }),
    );
}

/// Creates the `local-path` class unless it exists; the cluster default unless another
/// class already is.
async fn ensure_default_class(client: &kube::Client) -> Result<(), kube::Error> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let existing = classes.list(&Default::default()).await?.items;
    if existing.iter().any(|c| c.name_any() == DEFAULT_CLASS) {
        return Ok(());
    }
    let is_default = |c: &StorageClass| {
        [
            "storageclass.kubernetes.io/is-default-class",
            "storageclass.beta.kubernetes.io/is-default-class",
        ]
        .iter()
        .any(|a| c.annotations().get(*a).is_some_and(|v| v == "true"))
    };
    let default = (!existing.iter().any(is_default)).to_string();
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": DEFAULT_CLASS,
                     "annotations": {"storageclass.kubernetes.io/is-default-class": default}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .map_err(kube::Error::SerdeError)?;
    match classes.create(&PostParams::default(), &sc).await {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        r => r.map(|_| ()),
    }
}

/// The volume provisioned for a claim: named after the claim's uid, as upstream names
/// provisioned volumes.
pub fn volume_name(pvc: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", pvc.uid().unwrap_or_default())
}

/// The volume for `pvc` of class `sc` on `node`, its directory under `root`.
fn volume_for(
    root: &Path,
    pvc: &PersistentVolumeClaim,
    sc: &StorageClass,
    node: &str,
) -> serde_json::Value {
    let ns = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    let uid = pvc.uid().unwrap_or_default();
    let spec = pvc.spec.clone().unwrap_or_default();
    let request = spec.resources.and_then(|r| r.requests).and_then(|r| r.get("storage").cloned());
    let path = root.join(format!("pvc-{uid}_{ns}_{name}"));
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume_name(pvc), "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": request},
            "accessModes": spec.access_modes,
            "volumeMode": "Filesystem",
            "storageClassName": sc.name_any(),
            "persistentVolumeReclaimPolicy": sc.reclaim_policy.as_deref().unwrap_or("Delete"),
            "mountOptions": sc.mount_options,
            "hostPath": {"path": path.to_string_lossy(), "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                         "namespace": ns, "name": name, "uid": uid},
        },
    })
}

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

impl Provisioner {
    async fn reconcile_claim(&self, pvc: Arc<PersistentVolumeClaim>) -> Result<Action, Error> {
        let bound =
            pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty());
        if bound || pvc.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let class =
            pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        if class.is_empty() {
            return Ok(Action::await_change());
        }
        let classes: Api<StorageClass> = Api::all(self.ctx.client.clone());
        let Some(sc) =
            classes.get_opt(&class).await.map_err(api_err("getting storageclass", &class))?
        else {
            return Ok(Action::await_change());
        };
        if sc.provisioner != PROVISIONER {
            return Ok(Action::await_change());
        }
        let record = |reason: &'static str, message: String| {
            let pvc = pvc.clone();
            async move {
                let kind = if reason == "ProvisioningFailed" {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                self.ctx.recorder.record(pvc.as_ref(), kind, reason, &message).await;
            }
        };
        if let Some(why) = unsupported(&pvc) {
            record("ProvisioningFailed", why).await;
            return Ok(Action::await_change());
        }
        let Some(node) = pvc.annotations().get(SELECTED_NODE).cloned() else {
            if sc.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
                record(
                    "ProvisioningFailed",
                    "skiff.dev/local-path needs volumeBindingMode WaitForFirstConsumer: no node was selected".into(),
                )
                .await;
            }
            return Ok(Action::await_change());
        };
        // A node gone since it was selected: the selection is dropped so that the
        // scheduler picks again (upstream's provisioner reschedules the same way).
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        if nodes.get_opt(&node).await.map_err(api_err("getting node", &node))?.is_none() {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.ctx.client.clone(), &pvc.namespace().unwrap_or_default());
            let patch = json!({"metadata": {"resourceVersion": pvc.resource_version(),
                                            "annotations": {SELECTED_NODE: null}}});
            return match claims
                .patch(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(Action::await_change()),
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                    Ok(Action::requeue(std::time::Duration::from_secs(1)))
                }
                Err(source) => Err(Error::Api {
                    action: "unselecting the node of",
                    what: pvc.name_any(),
                    source,
                }),
            };
        }
        let volumes: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        let name = volume_name(&pvc);
        let pv: PersistentVolume = serde_json::from_value(volume_for(&self.root, &pvc, &sc, &node))
            .map_err(|e| api_err("building", &name)(kube::Error::SerdeError(e)))?;
        match volumes.create(&PostParams::default(), &pv).await {
            Ok(_) => {
                record("ProvisioningSucceeded", format!("Successfully provisioned volume {name}"))
                    .await;
                Ok(Action::await_change())
            }
            // Made already: the binder binds it.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Action::await_change()),
            Err(source) => {
                record("ProvisioningFailed", format!("failed to provision volume: {source}")).await;
                Err(Error::Api { action: "creating", what: name, source })
            }
        }
    }

    /// A volume it provisioned, released, with reclaim policy Delete: deleted.
    async fn reconcile_volume(&self, pv: Arc<PersistentVolume>) -> Result<Action, Error> {
        let ours = pv.annotations().get(PROVISIONED_BY).is_some_and(|p| p == PROVISIONER);
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        if !(ours && released && delete) || pv.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let volumes: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        let name = pv.name_any();
        match volumes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(Action::await_change()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
            Err(source) => Err(Error::Api { action: "deleting", what: name, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_is_pinned_to_the_node_and_prebound() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "db", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "local-path"}, "provisioner": PROVISIONER, "reclaimPolicy": "Retain"
        }))
        .unwrap();
        let v = volume_for(Path::new("/var/lib/skiff/storage"), &pvc, &sc, "n2");
        assert_eq!(v["metadata"]["name"], "pvc-u1");
        assert_eq!(v["spec"]["hostPath"]["path"], "/var/lib/skiff/storage/pvc-u1_db_data");
        assert_eq!(v["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(
            v["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["n2"])
        );
        assert_eq!(v["spec"]["claimRef"]["uid"], "u1");
        let pv: PersistentVolume = serde_json::from_value(v).expect("a PersistentVolume");
        assert_eq!(pv.spec.and_then(|s| s.storage_class_name).as_deref(), Some("local-path"));

        let mut rwx = pvc.clone();
        rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
        assert!(unsupported(&rwx).is_some_and(|m| m.contains("ReadWriteMany")));
        assert_eq!(unsupported(&pvc), None);
    }
}
