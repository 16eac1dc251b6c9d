//! skiff's local-path provisioner (after k3s's local-path-provisioner, run in the
//! controller manager): a claim of a StorageClass whose provisioner is
//! `skiff.dev/local-path` gets a hostPath volume on the node the scheduler chose for its
//! first pod (`volume.kubernetes.io/selected-node`), in `<root>/pvc-<uid>_<namespace>_<name>`
//! (created by the agent when it mounts it), pinned to that node by node affinity and
//! pre-bound to the claim, which the binder then binds. A provisioned volume released with
//! reclaim policy Delete is deleted once a helper pod on its node (`helper-pod-delete-<pv>`
//! in kube-system, as k3s's teardown helper) has removed its directory.
//!
//! At start it creates the StorageClass `local-path` (WaitForFirstConsumer, Delete; the
//! cluster default unless another class is) unless a class of that name exists. A claim
//! whose selected node is gone loses the selection, so that its next pod picks again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::volume::{Error, api_err};
use crate::context::Context;
use skiff_core::events::EventType;
use skiff_core::volumes::{PROVISIONED_BY, PROVISIONER, SELECTED_NODE, unsupported};

/// The StorageClass created at start.
pub const DEFAULT_CLASS: &str = "local-path";
/// Where the teardown helper pods run.
pub const HELPER_NAMESPACE: &str = "kube-system";
/// The label of the teardown helper pods (value: the volume's name).
pub const HELPER_LABEL: &str = "skiff.dev/local-path-teardown";
/// How long after a failed teardown the next helper pod is tried.
const TEARDOWN_RETRY: Duration = Duration::from_secs(30);
/// How often a running helper pod is looked at.
const TEARDOWN_POLL: Duration = Duration::from_secs(1);
/// How long a helper pod may take (k3s's helper timeout): one still not done by then
/// (its image cannot be pulled, its node is down) is deleted and tried again later.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(120);

struct Provisioner {
    root: PathBuf,
    helper_image: String,
    ctx: Arc<Ctx>,
}

/// Where the removal of a released volume's directory stands.
#[derive(Debug, PartialEq)]
enum Teardown {
    /// Removed, or nothing to remove here: the volume can go.
    Done,
    /// The helper pod has not finished.
    Running,
    /// The helper pod failed (why); another is tried later.
    Failed(String),
}

/// Run the provisioner, its volumes under `root` on every node, until the future is
/// dropped.
pub async fn run(ctx: Arc<Context>, root: PathBuf) {
    let client = ctx.client.clone();
    if let Err(e) = ensure_default_class(&client).await {
        tracing::warn!(error = %e, "creating the local-path StorageClass");
    }
    let me = Arc::new(Provisioner {
        root,
        helper_image: ctx.config.local_path_helper_image.clone(),
        ctx: Ctx::new(client.clone(), PROVISIONER),
    });
    let claims = controller(&ctx.informers.all::<PersistentVolumeClaim>()).await;
    let volumes = controller(&ctx.informers.all::<PersistentVolume>()).await;
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
    let path = root.join(dir_name(&volume_name(pvc), &ns, &name));
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
        if !self.node_exists(&node).await? {
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

    /// A volume it provisioned, released, with reclaim policy Delete: its directory removed
    /// on its node, then the volume deleted.
    async fn reconcile_volume(&self, pv: Arc<PersistentVolume>) -> Result<Action, Error> {
        let ours = pv.annotations().get(PROVISIONED_BY).is_some_and(|p| p == PROVISIONER);
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        if !(ours && released && delete) || pv.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        match self.teardown(&pv).await? {
            Teardown::Done => {}
            Teardown::Running => return Ok(Action::requeue(TEARDOWN_POLL)),
            Teardown::Failed(why) => {
                let msg = format!("failed to delete volume {}: {why}", pv.name_any());
                self.ctx
                    .recorder
                    .record(pv.as_ref(), EventType::Warning, "VolumeFailedDelete", &msg)
                    .await;
                return Ok(Action::requeue(TEARDOWN_RETRY));
            }
        }
        let volumes: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        delete_if_present(&volumes, &pv.name_any(), &DeleteParams::default()).await?;
        Ok(Action::await_change())
    }

    async fn node_exists(&self, node: &str) -> Result<bool, Error> {
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        Ok(nodes.get_opt(node).await.map_err(api_err("getting node", node))?.is_some())
    }

    /// Removes the directory of a released volume with a helper pod on its node. A volume
    /// whose node is gone, or whose directory is not one this provisioner made under its
    /// root, has nothing to remove here.
    async fn teardown(&self, pv: &PersistentVolume) -> Result<Teardown, Error> {
        let name = pv.name_any();
        let (Some(dir), Some(node)) = (directory(&self.root, pv), pinned_node(pv)) else {
            tracing::info!(volume = %name, root = %self.root.display(), "not a directory of this provisioner: left in place");
            return Ok(Teardown::Done);
        };
        if !self.node_exists(&node).await? {
            return Ok(Teardown::Done);
        }
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), HELPER_NAMESPACE);
        let helper_name = helper_name(&name);
        let Some(helper) =
            pods.get_opt(&helper_name).await.map_err(api_err("getting pod", &helper_name))?
        else {
            let pod = helper_pod(pv, &self.root, &dir, &node, &self.helper_image);
            let pod: Pod = serde_json::from_value(pod)
                .map_err(|e| api_err("building", &helper_name)(kube::Error::SerdeError(e)))?;
            return match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Ok(Teardown::Running),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Teardown::Running),
                Err(source) => Err(Error::Api { action: "creating", what: helper_name, source }),
            };
        };
        let phase = helper.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
        let age = helper
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.duration_until(super::pods::now()));
        let overdue = age.is_some_and(|a| a.as_secs() >= TEARDOWN_TIMEOUT.as_secs() as i64);
        let outcome = match phase {
            // Still terminating that long: its node is not there to finish it.
            _ if helper.metadata.deletion_timestamp.is_some() && overdue => {
                let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                delete_if_present(&pods, &helper_name, &now).await?;
                return Ok(Teardown::Running);
            }
            _ if helper.metadata.deletion_timestamp.is_some() => return Ok(Teardown::Running),
            "Succeeded" => Teardown::Done,
            "Failed" => Teardown::Failed(helper_failure(&helper)),
            _ if overdue => Teardown::Failed(format!(
                "helper pod {helper_name} did not finish within {}s (phase {phase:?})",
                TEARDOWN_TIMEOUT.as_secs()
            )),
            _ => return Ok(Teardown::Running),
        };
        delete_if_present(&pods, &helper_name, &DeleteParams::default()).await?;
        Ok(outcome)
    }
}

/// The directory (under the root) of volume `volume` made for claim `ns/claim`.
fn dir_name(volume: &str, ns: &str, claim: &str) -> String {
    format!("{volume}_{ns}_{claim}")
}

/// Deletes `name`; gone already is as good.
async fn delete_if_present<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Api { action: "deleting", what: name.to_string(), source }),
    }
}

fn helper_name(volume: &str) -> String {
    format!("helper-pod-delete-{volume}")
}

/// The directory name (under the root) of a volume this provisioner made with `root`:
/// `pvc-<uid>_<namespace>_<claim>`, from the volume's own name and claim.
fn directory(root: &Path, pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    let claim = spec.claim_ref.as_ref()?;
    let want = dir_name(&pv.name_any(), claim.namespace.as_deref()?, claim.name.as_deref()?);
    let path = Path::new(&spec.host_path.as_ref()?.path);
    (path.parent() == Some(root) && path.file_name() == Some(want.as_ref())).then_some(want)
}

/// The node a provisioned volume's affinity pins it to.
fn pinned_node(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let expr = terms.first()?.match_expressions.as_ref()?.first()?;
    (expr.key == "kubernetes.io/hostname" && expr.operator == "In")
        .then(|| expr.values.as_ref()?.first().cloned())
        .flatten()
}

/// The teardown helper: on the volume's node, with the provisioner's root mounted, it
/// removes the volume's directory (k3s's `teardown` script). Owned by the volume, so that
/// it goes with it.
fn helper_pod(
    pv: &PersistentVolume,
    root: &Path,
    dir: &str,
    node: &str,
    image: &str,
) -> serde_json::Value {
    let name = pv.name_any();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": helper_name(&name),
            "namespace": HELPER_NAMESPACE,
            "labels": {HELPER_LABEL: name},
            "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolume", "name": name,
                                 "uid": pv.uid().unwrap_or_default()}],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "teardown",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["rm", "-rf", "--", format!("/data/{dir}")],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "hostPath": {
                "path": root.to_string_lossy(), "type": "DirectoryOrCreate"}}],
        },
    })
}

/// Why a helper pod failed: its container's exit, or the pod's message.
fn helper_failure(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let exited = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref());
    match exited {
        Some(t) => format!(
            "helper pod {} exited with code {}{}",
            pod.name_any(),
            t.exit_code,
            t.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        ),
        None => format!(
            "helper pod {} failed: {}",
            pod.name_any(),
            status.and_then(|s| s.message.as_deref()).unwrap_or("no reason given")
        ),
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

    #[test]
    fn teardown_removes_only_directories_it_made() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "db", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "local-path"}, "provisioner": PROVISIONER
        }))
        .unwrap();
        let root = Path::new("/var/lib/skiff/storage");
        let mut v = volume_for(root, &pvc, &sc, "n2");
        v["metadata"]["uid"] = json!("pv-uid");
        let pv: PersistentVolume = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(directory(root, &pv).as_deref(), Some("pvc-u1_db_data"));
        assert_eq!(pinned_node(&pv).as_deref(), Some("n2"));
        // Another root (the flag changed), or a path edited to point elsewhere: not ours.
        assert_eq!(directory(Path::new("/srv"), &pv), None);
        for path in [
            "/var/lib/skiff/storage/pvc-u1_db_data/..",
            "/",
            "/var/lib/skiff/storage",
            "/var/lib/skiff/storage/pvc-u2_db_data",
            "/etc/pvc-u1_db_data",
        ] {
            let mut edited = v.clone();
            edited["spec"]["hostPath"]["path"] = json!(path);
            let edited: PersistentVolume = serde_json::from_value(edited).unwrap();
            assert_eq!(directory(root, &edited), None, "{path}");
        }

        let helper = helper_pod(&pv, root, "pvc-u1_db_data", "n2", "busybox");
        assert_eq!(helper["metadata"]["name"], "helper-pod-delete-pvc-u1");
        assert_eq!(helper["metadata"]["ownerReferences"][0]["uid"], "pv-uid");
        assert_eq!(helper["spec"]["nodeName"], "n2");
        assert_eq!(
            helper["spec"]["containers"][0]["command"],
            json!(["rm", "-rf", "--", "/data/pvc-u1_db_data"])
        );
        assert_eq!(helper["spec"]["volumes"][0]["hostPath"]["path"], "/var/lib/skiff/storage");
        let pod: Pod = serde_json::from_value(helper).expect("a Pod");

        let mut failed = pod.clone();
        failed.status = serde_json::from_value(json!({"phase": "Failed", "containerStatuses": [
            {"name": "teardown", "image": "busybox", "imageID": "", "ready": false,
             "restartCount": 0, "state": {"terminated": {"exitCode": 1, "message": "rm: busy"}}}]}))
        .unwrap();
        assert_eq!(
            helper_failure(&failed),
            "helper pod helper-pod-delete-pvc-u1 exited with code 1: rm: busy"
        );
    }
}
