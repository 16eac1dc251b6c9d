//! The PersistentVolume controller's binder (upstream's `persistentvolume-binder`, static
//! provisioning): a pending claim is bound to the smallest available volume that satisfies
//! it (class, volume mode, access modes, size, selector), or to the volume it names; a
//! volume reports `Available`, `Bound`, `Released` once its claim is gone, and `Failed`
//! when its reclaim policy asks for a deletion no volume plugin here can do. A claim without
//! a class gets the default StorageClass (retroactive default class assignment); a claim
//! of a WaitForFirstConsumer class is bound once a pod uses it. Volumes are provisioned by
//! a provisioner (skiff's own is [`super::local_path`]): a claim no volume satisfies waits,
//! as upstream waits for an external provisioner, and a provisioned volume is bound only to
//! the claim it was made for and left to its provisioner once released.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods;
use crate::context::Context;
use skiff_core::events::EventType;
use skiff_core::quantity::Quantity;

/// How often a pending claim looks for a volume again (upstream's resync period).
const PENDING_RESYNC: Duration = Duration::from_secs(15);
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// An API call of the storage controllers (binder, protection, provisioner) that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {what}")]
    Api {
        action: &'static str,
        what: String,
        #[source]
        source: kube::Error,
    },
}

pub(super) fn api_err(
    action: &'static str,
    what: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { action, what, source }
}

/// Run the claim and volume loops until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    tokio::join!(run_claims(ctx.clone()), run_volumes(ctx));
}

async fn run_claims(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller = controller(&ctx.informers.all::<PersistentVolumeClaim>()).await;
    let store = controller.store();
    // A volume wakes the claim it names, or, when free, every claim still waiting.
    let volumes = ctx.informers.all::<PersistentVolume>().touched();
    let controller = controller.watches_stream(volumes, move |pv| {
        if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            return vec![
                ObjectRef::new(r.name.as_deref().unwrap_or_default())
                    .within(r.namespace.as_deref().unwrap_or_default()),
            ];
        }
        store
            .state()
            .iter()
            .filter(|c| volume_name(c).is_empty())
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect()
    });
    run_controller(controller, Ctx::new(client, "persistentvolume-controller"), reconcile_claim)
        .await;
}

async fn run_volumes(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller = controller(&ctx.informers.all::<PersistentVolume>()).await;
    let store = controller.store();
    // A claim (its deletion too) wakes the volume it is bound to or that names it.
    let claims = ctx.informers.all::<PersistentVolumeClaim>().touched();
    let controller = controller.watches_stream(claims, move |pvc| {
        let bound = volume_name(&pvc).to_string();
        store
            .state()
            .iter()
            .filter(|pv| pv.name_any() == bound || names_claim(pv, &pvc))
            .map(|pv| ObjectRef::from_obj(pv.as_ref()))
            .collect::<Vec<_>>()
    });
    run_controller(controller, Ctx::new(client, "persistentvolume-controller"), reconcile_volume)
        .await;
}

fn volume_name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or_default()
}

fn claim_ref(pv: &PersistentVolume) -> Option<&ObjectReference> {
    pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
}

/// Whether `pv`'s claimRef names `pvc` (by namespace and name; by uid once it has one).
fn names_claim(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    claim_ref(pv).is_some_and(|r| {
        r.namespace == pvc.namespace()
            && r.name.as_deref() == Some(pvc.name_any().as_str())
            && r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == pvc.uid().as_deref())
    })
}

/// `GetPersistentVolumeClaimClass`: the beta annotation, else `spec.storageClassName`.
fn claim_class(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.annotations()
        .get(BETA_CLASS)
        .cloned()
        .or_else(|| pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
}

fn volume_class(pv: &PersistentVolume) -> String {
    pv.annotations()
        .get(BETA_CLASS)
        .cloned()
        .or_else(|| pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .unwrap_or_default()
}

fn storage_bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.and_then(Quantity::of).map_or(0, Quantity::value)
}

fn requested_bytes(pvc: &PersistentVolumeClaim) -> i64 {
    storage_bytes(
        pvc.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
}

fn capacity_bytes(pv: &PersistentVolume) -> i64 {
    storage_bytes(pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")))
}

/// Whether `pv` can serve `pvc` (upstream's `checkVolumeSatisfyClaim` plus the selector):
/// same class and volume mode, every requested access mode, enough space, matching labels.
fn satisfies(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let (Some(vs), Some(cs)) = (pv.spec.as_ref(), pvc.spec.as_ref()) else { return false };
    let mode = |m: Option<&str>| m.unwrap_or("Filesystem").to_string();
    let modes = vs.access_modes.as_deref().unwrap_or_default();
    // A volume pre-bound to the claim is not held to the claim's selector (upstream).
    let selector: Option<&LabelSelector> = cs.selector.as_ref().filter(|_| !names_claim(pv, pvc));
    volume_class(pv) == claim_class(pvc).unwrap_or_default()
        && mode(vs.volume_mode.as_deref()) == mode(cs.volume_mode.as_deref())
        && cs.access_modes.iter().flatten().all(|m| modes.contains(m))
        && capacity_bytes(pv) >= requested_bytes(pvc)
        && selector.is_none_or(|s| pods::selector_matches(Some(s), pv.labels()))
}

/// Upstream's `findMatchingVolume`: a volume pre-bound to the claim if it fits, else the
/// smallest free one that does.
fn find_volume<'a>(
    volumes: &'a [PersistentVolume],
    pvc: &PersistentVolumeClaim,
) -> Option<&'a PersistentVolume> {
    let usable =
        |pv: &&PersistentVolume| pv.metadata.deletion_timestamp.is_none() && satisfies(pv, pvc);
    if let Some(pv) = volumes.iter().filter(usable).find(|pv| names_claim(pv, pvc)) {
        return Some(pv);
    }
    volumes
        .iter()
        .filter(usable)
        .filter(|pv| claim_ref(pv).is_none())
        .min_by_key(|pv| (capacity_bytes(pv), pv.name_any()))
}

async fn reconcile_claim(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = pvc.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let bound_to = volume_name(&pvc).to_string();
    if bound_to.is_empty() {
        return bind_pending(&pvc, &claims, &volumes, &ctx).await;
    }
    // Bound (or pre-bound by its author to a named volume).
    let Some(pv) = volumes.get_opt(&bound_to).await.map_err(api_err("getting", &bound_to))? else {
        if phase(&pvc) == "Bound" {
            set_claim_phase(&claims, &pvc, "Lost", None).await?;
            let msg = "Bound claim has lost its PersistentVolume. Data on the volume is lost!";
            ctx.recorder.record(pvc.as_ref(), EventType::Warning, "ClaimLost", msg).await;
        }
        return Ok(Action::requeue(PENDING_RESYNC));
    };
    match claim_ref(&pv) {
        Some(_) if names_claim(&pv, &pvc) => {
            if claim_ref(&pv).and_then(|r| r.uid.as_deref()).unwrap_or_default().is_empty() {
                claim_volume(&volumes, &pv, &pvc, false).await?;
            }
            finish_claim(&claims, &pvc, &pv, false).await?;
            Ok(Action::await_change())
        }
        Some(_) => {
            let msg = format!("volume \"{bound_to}\" already bound to a different claim.");
            ctx.recorder.record(pvc.as_ref(), EventType::Warning, "FailedBinding", &msg).await;
            Ok(Action::requeue(PENDING_RESYNC))
        }
        None if satisfies(&pv, &pvc) => {
            claim_volume(&volumes, &pv, &pvc, false).await?;
            finish_claim(&claims, &pvc, &pv, false).await?;
            Ok(Action::await_change())
        }
        None => {
            let msg = format!(
                "Cannot bind to requested volume \"{bound_to}\": it does not satisfy the claim"
            );
            ctx.recorder.record(pvc.as_ref(), EventType::Warning, "VolumeMismatch", &msg).await;
            Ok(Action::requeue(PENDING_RESYNC))
        }
    }
}

/// A claim without a volume: the default class when it has none, then the best volume.
async fn bind_pending(
    pvc: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    volumes: &Api<PersistentVolume>,
    ctx: &Ctx,
) -> Result<Action, Error> {
    let name = pvc.name_any();
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let class_list =
        classes.list(&ListParams::default()).await.map_err(api_err("listing", "storageclasses"))?;
    let class = claim_class(pvc);
    if class.is_none()
        && let Some(default) = default_class(&class_list.items)
    {
        // Retroactive default StorageClass assignment; the update wakes this claim again.
        let patch = json!({"metadata": {"resourceVersion": pvc.resource_version()},
                           "spec": {"storageClassName": default}});
        match claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(Action::await_change()),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(source) => {
                return Err(Error::Api { action: "setting the class of", what: name, source });
            }
        }
    }
    let class = class.unwrap_or_default();
    let sc = class_list.items.iter().find(|c| c.name_any() == class);
    // WaitForFirstConsumer: bound once a pod uses the claim (upstream binds in the
    // scheduler, choosing among the volumes reachable from the pod's node; here the
    // scheduler then follows the volume's node affinity).
    let delayed =
        sc.is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let wait = delayed && !has_consumer(pvc, ctx).await?;
    if !wait {
        let all = volumes
            .list(&ListParams::default())
            .await
            .map_err(api_err("listing", "persistentvolumes"))?;
        // The local-path provisioner's claims take the volume it made for them.
        let provisioned = sc.is_some_and(|c| c.provisioner == skiff_core::volumes::PROVISIONER);
        let candidates: Vec<PersistentVolume> = if provisioned {
            all.items.into_iter().filter(|pv| names_claim(pv, pvc)).collect()
        } else {
            all.items
        };
        if let Some(pv) = find_volume(&candidates, pvc) {
            let pv = claim_volume(volumes, pv, pvc, true).await?;
            finish_claim(claims, pvc, &pv, true).await?;
            return Ok(Action::await_change());
        }
    }
    let (kind, reason, msg) = match sc {
        _ if class.is_empty() => (
            EventType::Normal,
            "FailedBinding",
            "no persistent volumes available for this claim and no storage class is set"
                .to_string(),
        ),
        None => (
            EventType::Warning,
            "ProvisioningFailed",
            format!("storageclass.storage.k8s.io \"{class}\" not found"),
        ),
        Some(_) if wait => (
            EventType::Normal,
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding".to_string(),
        ),
        Some(sc) => (
            EventType::Normal,
            "ExternalProvisioning",
            format!(
                "Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
                sc.provisioner
            ),
        ),
    };
    ctx.recorder.record(pvc, kind, reason, &msg).await;
    Ok(Action::requeue(PENDING_RESYNC))
}

/// Whether a pod that is not finished uses the claim.
async fn has_consumer(pvc: &PersistentVolumeClaim, ctx: &Ctx) -> Result<bool, Error> {
    let ns = pvc.namespace().unwrap_or_default();
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let list = api.list(&ListParams::default()).await.map_err(api_err("listing pods in", &ns))?;
    let name = pvc.name_any();
    Ok(list.items.iter().filter(|p| !matches!(pods::phase(p), "Succeeded" | "Failed")).any(|p| {
        p.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name))
    }))
}

/// The default StorageClass: marked by the annotation (or its beta form); of several, the
/// newest, and of those created together the first by name (upstream's choice).
fn default_class(classes: &[StorageClass]) -> Option<String> {
    classes
        .iter()
        .filter(|c| {
            [DEFAULT_CLASS, BETA_DEFAULT_CLASS]
                .iter()
                .any(|a| c.annotations().get(*a).is_some_and(|v| v == "true"))
        })
        .min_by_key(|c| {
            (std::cmp::Reverse(c.metadata.creation_timestamp.clone().map(|t| t.0)), c.name_any())
        })
        .map(|c| c.name_any())
}

/// The volume's half of a binding: its claimRef set to `pvc` (guarded by the volume's
/// resourceVersion) and phase Bound.
async fn claim_volume(
    volumes: &Api<PersistentVolume>,
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
    by_controller: bool,
) -> Result<PersistentVolume, Error> {
    let name = pv.name_any();
    let reference = json!({
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": pvc.namespace(),
        "name": pvc.name_any(),
        "uid": pvc.uid(),
        "resourceVersion": pvc.resource_version(),
    });
    let mut patch = json!({"metadata": {"resourceVersion": pv.resource_version()},
                           "spec": {"claimRef": reference}});
    if by_controller {
        patch["metadata"]["annotations"] = json!({BOUND_BY_CONTROLLER: "yes"});
    }
    volumes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err("binding", &name))?;
    let status = json!({"status": {"phase": "Bound"}});
    volumes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_err("updating the status of", &name))
}

/// The claim's half: `volumeName`, the bind annotations, and status Bound with the
/// volume's access modes and capacity.
async fn finish_claim(
    claims: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    by_controller: bool,
) -> Result<(), Error> {
    let name = pvc.name_any();
    let done = pvc.annotations().get(BIND_COMPLETED).is_some_and(|v| v == "yes");
    if volume_name(pvc) != pv.name_any() || !done {
        let mut annotations = json!({BIND_COMPLETED: "yes"});
        if by_controller {
            annotations[BOUND_BY_CONTROLLER] = json!("yes");
        }
        let patch = json!({"metadata": {"annotations": annotations,
                                        "resourceVersion": pvc.resource_version()},
                           "spec": {"volumeName": pv.name_any()}});
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err("binding", &name))?;
    }
    let spec = pv.spec.clone().unwrap_or_default();
    let capacity = json!(spec.capacity);
    let modes = json!(spec.access_modes);
    let status = pvc.status.as_ref();
    if phase(pvc) != "Bound"
        || status.map(|s| json!(s.capacity)) != Some(capacity.clone())
        || status.map(|s| json!(s.access_modes)) != Some(modes.clone())
    {
        set_claim_phase(claims, pvc, "Bound", Some((capacity, modes))).await?;
    }
    Ok(())
}

fn phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

async fn set_claim_phase(
    claims: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
    phase: &str,
    bound: Option<(serde_json::Value, serde_json::Value)>,
) -> Result<(), Error> {
    let name = pvc.name_any();
    let mut status = json!({"phase": phase});
    if let Some((capacity, modes)) = bound {
        status["capacity"] = capacity;
        status["accessModes"] = modes;
    }
    claims
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .map(|_| ())
        .map_err(api_err("updating the status of", name))
}

async fn reconcile_volume(pv: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // A volume being deleted is still followed: its protection finalizer goes once it is
    // no longer Bound.
    let name = pv.name_any();
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let current = pv.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let (phase, failure) = match claim_ref(&pv) {
        None => ("Available", None),
        Some(r) => {
            let ns = r.namespace.as_deref().unwrap_or_default();
            let claim = r.name.as_deref().unwrap_or_default();
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
            let pvc = claims.get_opt(claim).await.map_err(api_err("getting", claim))?;
            let uid = r.uid.as_deref().unwrap_or_default();
            match pvc {
                // Pre-bound by its author and not yet claimed: the claim loop binds it.
                _ if uid.is_empty() => ("Available", None),
                Some(c) if c.uid().as_deref() == Some(uid) => match volume_name(&c) {
                    v if v == name => ("Bound", None),
                    // Binding in progress: the claim's half follows.
                    "" => (current, None),
                    // The claim ended up bound to another volume (upstream's unbindVolume).
                    _ => return unbind(&volumes, &pv).await,
                },
                // The claim is gone: the volume is released, then reclaimed per its policy.
                _ => released(&pv),
            }
        }
    };
    if phase != current && !phase.is_empty() {
        if let Some((reason, m)) = &failure {
            ctx.recorder.record(pv.as_ref(), EventType::Warning, reason, m).await;
        }
        let message = failure.map(|(_, m)| m);
        // Guarded by the resourceVersion read: a stale view must not overwrite a phase the
        // claim loop has written since (it retries from the newer object).
        let status = json!({"metadata": {"resourceVersion": pv.resource_version()},
                            "status": {"phase": phase, "message": message}});
        match volumes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(source) => {
                return Err(Error::Api { action: "updating the status of", what: name, source });
            }
        }
    }
    Ok(Action::await_change())
}

/// A volume bound to a claim that is bound elsewhere: released from the claim; a volume
/// its author pre-bound keeps naming the claim, without its uid.
async fn unbind(volumes: &Api<PersistentVolume>, pv: &PersistentVolume) -> Result<Action, Error> {
    let name = pv.name_any();
    let by_controller = pv.annotations().get(BOUND_BY_CONTROLLER).is_some_and(|v| v == "yes");
    let patch = if by_controller {
        json!({"metadata": {"resourceVersion": pv.resource_version(),
                            "annotations": {BOUND_BY_CONTROLLER: null}},
               "spec": {"claimRef": null}})
    } else {
        json!({"metadata": {"resourceVersion": pv.resource_version()},
               "spec": {"claimRef": {"uid": null, "resourceVersion": null}}})
    };
    match volumes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(source) => Err(Error::Api { action: "unbinding", what: name, source }),
    }
}

/// A volume whose claim is gone: `Released` when kept (Retain); `Failed`, with the event
/// reason and message upstream gives a volume no plugin can reclaim, for Delete and
/// Recycle (skiff has no plugin that deletes or scrubs storage).
fn released(pv: &PersistentVolume) -> (&'static str, Option<(&'static str, String)>) {
    // A provisioner's volume is its provisioner's to delete (upstream waits for an
    // external provisioner the same way).
    if pv.annotations().contains_key(skiff_core::volumes::PROVISIONED_BY) {
        return ("Released", None);
    }
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    match policy {
        "Retain" => ("Released", None),
        "Recycle" => (
            "Failed",
            Some(("VolumeFailedRecycle", "No recycler plugin found for the volume!".to_string())),
        ),
        _ => (
            "Failed",
            Some((
                "VolumeFailedDelete",
                format!(
                    "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                    pv.name_any()
                ),
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, size: &str, class: &str, modes: &[&str]) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"tier": name}},
            "spec": {"capacity": {"storage": size}, "accessModes": modes,
                     "storageClassName": class, "hostPath": {"path": "/tmp"},
                     "volumeMode": "Filesystem"}
        }))
        .unwrap()
    }

    fn pvc(size: &str, class: Option<&str>, modes: &[&str]) -> PersistentVolumeClaim {
        let mut c = json!({
            "metadata": {"name": "data", "namespace": "default", "uid": "u1"},
            "spec": {"resources": {"requests": {"storage": size}}, "accessModes": modes}
        });
        if let Some(class) = class {
            c["spec"]["storageClassName"] = json!(class);
        }
        serde_json::from_value(c).unwrap()
    }

    #[test]
    fn the_smallest_volume_that_fits_is_chosen() {
        let volumes = vec![
            pv("big", "10Gi", "", &["ReadWriteOnce"]),
            pv("small", "1Gi", "", &["ReadWriteOnce", "ReadOnlyMany"]),
            pv("tiny", "100Mi", "", &["ReadWriteOnce"]),
            pv("other-class", "2Gi", "fast", &["ReadWriteOnce"]),
            pv("rwx", "2Gi", "", &["ReadWriteMany"]),
        ];
        let claim = pvc("500Mi", None, &["ReadWriteOnce"]);
        assert_eq!(find_volume(&volumes, &claim).map(|v| v.name_any()).as_deref(), Some("small"));
        let claim = pvc("500Mi", Some("fast"), &["ReadWriteOnce"]);
        assert_eq!(
            find_volume(&volumes, &claim).map(|v| v.name_any()).as_deref(),
            Some("other-class")
        );
        let claim = pvc("3Gi", Some(""), &["ReadWriteOnce", "ReadOnlyMany"]);
        assert!(find_volume(&volumes, &claim).is_none());
        let mut claim = pvc("1Mi", None, &["ReadWriteOnce"]);
        claim.spec.as_mut().unwrap().selector = Some(LabelSelector {
            match_labels: Some([("tier".to_string(), "big".to_string())].into()),
            match_expressions: None,
        });
        assert_eq!(find_volume(&volumes, &claim).map(|v| v.name_any()).as_deref(), Some("big"));
    }

    #[test]
    fn a_volume_bound_elsewhere_is_skipped_and_one_naming_the_claim_wins() {
        let mut taken = pv("taken", "1Gi", "", &["ReadWriteOnce"]);
        taken.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("other".into()),
            name: Some("x".into()),
            uid: Some("u9".into()),
            ..Default::default()
        });
        let mut reserved = pv("reserved", "5Gi", "", &["ReadWriteOnce"]);
        reserved.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("default".into()),
            name: Some("data".into()),
            ..Default::default()
        });
        let free = pv("free", "1Gi", "", &["ReadWriteOnce"]);
        let claim = pvc("1Gi", None, &["ReadWriteOnce"]);
        let volumes = vec![taken.clone(), free.clone(), reserved];
        assert_eq!(
            find_volume(&volumes, &claim).map(|v| v.name_any()).as_deref(),
            Some("reserved")
        );
        assert_eq!(
            find_volume(&[taken, free], &claim).map(|v| v.name_any()).as_deref(),
            Some("free")
        );
    }

    #[test]
    fn a_released_volume_is_kept_or_fails_per_its_policy() {
        let mut v = pv("v", "1Gi", "", &["ReadWriteOnce"]);
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(released(&v), ("Released", None));
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        let (phase, msg) = released(&v);
        assert_eq!(phase, "Failed");
        let (reason, msg) = msg.unwrap();
        assert_eq!(reason, "VolumeFailedDelete");
        assert!(msg.contains("no deletable volume plugin matched"), "{msg}");
    }
}
