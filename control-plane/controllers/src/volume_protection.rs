//! The storage object in-use protection controllers (upstream's `pvc-protection-controller`
//! and `pv-protection-controller`): a deleted PersistentVolumeClaim keeps its
//! `kubernetes.io/pvc-protection` finalizer while a scheduled pod uses it, and a deleted
//! PersistentVolume keeps `kubernetes.io/pv-protection` while it is Bound. Objects created
//! without the finalizer (before the admission plugin added it) get it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::volume::Error;
use crate::context::Context;
use skiff_core::names::{PV_PROTECTION, PVC_PROTECTION};

/// Run both controllers until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    tokio::join!(run_claims(ctx.clone()), run_volumes(ctx));
}

async fn run_claims(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    // A pod (its deletion above all) wakes the claims it names.
    let controller = controller(&ctx.informers.all::<PersistentVolumeClaim>())
        .await
        .watches_stream(ctx.informers.all::<Pod>().touched(), |pod| {
            let ns = pod.namespace().unwrap_or_default();
            claims_of(&pod).map(|c| ObjectRef::new(c).within(&ns)).collect::<Vec<_>>()
        });
    run_controller(controller, Ctx::new(client, "pvc-protection-controller"), reconcile_claim)
        .await;
}

async fn run_volumes(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller = controller(&ctx.informers.all::<PersistentVolume>()).await;
    run_controller(controller, Ctx::new(client, "pv-protection-controller"), reconcile_volume)
        .await;
}

/// The claims a pod's volumes name.
fn claims_of(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()))
}

/// Upstream's `podUsesPVC`: a scheduled pod naming the claim. A pod not yet on a node does
/// not hold it: the kubelet refuses to start a pod whose claim is being deleted.
fn uses(pod: &Pod, claim: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())
        && claims_of(pod).any(|c| c == claim)
}

fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds or removes `finalizer`, guarded by the resourceVersion read so that a finalizer
/// someone else changed meanwhile is not lost (409: reconciled again from the newer object).
async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> Result<Action, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut list: Vec<&str> =
        obj.finalizers().iter().map(String::as_str).filter(|f| *f != finalizer).collect();
    if present {
        list.push(finalizer);
    }
    let patch =
        json!({"metadata": {"finalizers": list, "resourceVersion": obj.resource_version()}});
    let name = obj.name_any();
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Action::requeue(Duration::from_secs(1))),
        Err(source) => Err(Error::Api {
            action: if present { "adding the finalizer to" } else { "removing the finalizer of" },
            what: name,
            source,
        }),
    }
}

async fn reconcile_claim(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = pvc.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let protected = has_finalizer(pvc.as_ref(), PVC_PROTECTION);
    match (pvc.metadata.deletion_timestamp.is_some(), protected) {
        (false, false) => set_finalizer(&claims, pvc.as_ref(), PVC_PROTECTION, true).await,
        (true, true) => {
            // Read live, not from a cache: a pod created a moment ago must be seen.
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            let list = pods.list(&ListParams::default()).await.map_err(|source| Error::Api {
                action: "listing pods in",
                what: ns.clone(),
                source,
            })?;
            let name = pvc.name_any();
            if list.items.iter().any(|p| uses(p, &name)) {
                // The pods' watch wakes the claim when they go.
                return Ok(Action::await_change());
            }
            set_finalizer(&claims, pvc.as_ref(), PVC_PROTECTION, false).await
        }
        _ => Ok(Action::await_change()),
    }
}

async fn reconcile_volume(pv: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let protected = has_finalizer(pv.as_ref(), PV_PROTECTION);
    let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    match (pv.metadata.deletion_timestamp.is_some(), protected) {
        (false, false) => set_finalizer(&volumes, pv.as_ref(), PV_PROTECTION, true).await,
        // The binder moves the volume on (Released, Failed) once its claim is gone.
        (true, true) if !bound => set_finalizer(&volumes, pv.as_ref(), PV_PROTECTION, false).await,
        _ => Ok(Action::await_change()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_scheduled_pod_naming_the_claim_uses_it() {
        let pod = |node: Option<&str>, claim: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p"},
                "spec": {"nodeName": node, "containers": [{"name": "c"}],
                         "volumes": [{"name": "v", "emptyDir": {}},
                                     {"name": "d", "persistentVolumeClaim": {"claimName": claim}}]}
            }))
            .unwrap()
        };
        assert!(uses(&pod(Some("n1"), "data"), "data"));
        assert!(!uses(&pod(Some("n1"), "other"), "data"));
        assert!(!uses(&pod(None, "data"), "data"));
        assert!(!uses(&pod(Some(""), "data"), "data"));
        assert_eq!(claims_of(&pod(None, "data")).collect::<Vec<_>>(), ["data"]);
    }
}
