//! The ReplicaSet controller: keeps `spec.replicas` active pods from the template, adopts
//! matching orphans and releases owned pods that no longer match, deletes the pods upstream
//! would delete first (unscheduled, pending, not ready, newest), and reports status
//! (replicas, fullyLabeled, ready, available with minReadySeconds, observedGeneration).
//! The same logic runs for core/v1 ReplicationControllers, whose selector is a label map.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{Pod, ReplicationController, ReplicationControllerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods::{self, PodName};
use crate::context::Context;
use skiff_core::events::EventType;

/// Errors of one ReplicaSet reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("managing the pods of replicaset {rs}")]
    Pods {
        rs: String,
        #[source]
        source: pods::Error,
    },
    #[error("updating the status of replicaset {rs}")]
    Status {
        rs: String,
        #[source]
        source: kube::Error,
    },
}

/// Upstream's `BurstReplicas`: at most this many pods created or deleted per reconcile.
const BURST_REPLICAS: usize = 500;

/// Run the ReplicaSet controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let pods = ctx.informers.all::<Pod>();
    let controller = controller(&ctx.informers.all::<ReplicaSet>()).await;
    let store = controller.store();
    let cctx = Ctx::new(client.clone(), "replicaset-controller");
    let controller = controller
        .owns_stream(pods.touched())
        // Orphans: a pod without a controller wakes the ReplicaSets whose selector matches it.
        .watches_stream(pods.touched(), move |pod: Pod| {
            if pods::controller_ref(&pod.metadata).is_some() {
                return Vec::new();
            }
            store
                .state()
                .iter()
                .filter(|rs| rs.namespace() == pod.namespace())
                .filter(|rs| {
                    pods::selector_matches(rs.spec.as_ref().map(|s| &s.selector), pod.labels())
                })
                .map(|rs| ObjectRef::from_obj(rs.as_ref()))
                .collect::<Vec<_>>()
        });
    run_controller(controller, cctx, reconcile).await;
}

async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = rs.namespace().unwrap_or_default();
    let name = rs.name_any();
    let spec = rs.spec.clone().unwrap_or_default();
    let active = manage_pods(rs.as_ref(), &spec, &ctx).await?;
    let now = pods::now();
    let status = calculate_status(&spec, rs.metadata.generation, &active, now);
    let status = ReplicaSetStatus {
        conditions: rs.status.as_ref().and_then(|s| s.conditions.clone()),
        ..status
    };
    if rs.status.as_ref() != Some(&status) {
        let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = crate::context::status_patch(&status, "apps", "ReplicaSet");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { rs: name, source }),
        }
    }
    Ok(requeue_for_availability(&spec, &active, now))
}

/// What a ReplicaSet and a ReplicationController do alike (upstream runs one manager for
/// both): claim the pods `spec.selector` matches, create or delete pods towards
/// `spec.replicas` unless `owner` is being deleted, and return the active pods it controls.
async fn manage_pods<K: Resource<DynamicType = ()>>(
    owner: &K,
    spec: &ReplicaSetSpec,
    ctx: &Ctx,
) -> Result<Vec<Pod>, Error> {
    let ns = owner.namespace().unwrap_or_default();
    let name = owner.name_any();
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let perr = |source| Error::Pods { rs: name.clone(), source };
    let all = pods::list_pods(&pod_api, &ns).await.map_err(perr)?;
    let owned = pods::claim(&pod_api, owner, Some(&spec.selector), all).await.map_err(perr)?;
    let active: Vec<Pod> = owned.into_iter().filter(pods::is_active).collect();

    if owner.meta().deletion_timestamp.is_none() {
        let desired = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
        if active.len() < desired {
            let want = (desired - active.len()).min(BURST_REPLICAS);
            let template = spec.template.clone().unwrap_or_default();
            let pod = pods::pod_from_template(
                owner,
                &template,
                PodName::Generate(&format!("{name}-")),
                &[],
            );
            let created = slow_start(want, || async {
                match pods::create_pod(&pod_api, &name, &pod).await {
                    Ok(Some(p)) => {
                        let msg = format!("Created pod: {}", p.name_any());
                        ctx.recorder
                            .record(owner, EventType::Normal, "SuccessfulCreate", &msg)
                            .await;
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => {
                        let msg = format!("Error creating: {e}");
                        ctx.recorder.record(owner, EventType::Warning, "FailedCreate", &msg).await;
                        Err(e)
                    }
                }
            })
            .await;
            created.map_err(perr)?;
        } else if active.len() > desired {
            let mut victims: Vec<&Pod> = active.iter().collect();
            victims.sort_by(|a, b| pods::deletion_order(a, b));
            for pod in victims.iter().take((active.len() - desired).min(BURST_REPLICAS)) {
                pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
                let msg = format!("Deleted pod: {}", pod.name_any());
                ctx.recorder.record(owner, EventType::Normal, "SuccessfulDelete", &msg).await;
            }
        }
    }
    Ok(active)
}

/// A ready pod becomes available after minReadySeconds: look again then.
fn requeue_for_availability(
    spec: &ReplicaSetSpec,
    active: &[Pod],
    now: k8s_openapi::jiff::Timestamp,
) -> Action {
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let next = active.iter().filter_map(|p| pods::until_available(p, min_ready, now)).min();
    next.map(Action::requeue).unwrap_or_else(Action::await_change)
}

/// `calculateStatus` from the active pods a ReplicaSet (or ReplicationController) with
/// `spec` controls; conditions are left to the caller.
fn calculate_status(
    spec: &ReplicaSetSpec,
    generation: Option<i64>,
    active: &[Pod],
    now: k8s_openapi::jiff::Timestamp,
) -> ReplicaSetStatus {
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(active.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    ReplicaSetStatus {
        replicas: count(&|_| true),
        fully_labeled_replicas: crate::context::omit_zero(count(&|p| {
            template_labels.iter().all(|(k, v)| p.labels().get(k) == Some(v))
        })),
        ready_replicas: crate::context::omit_zero(count(&pods::is_ready)),
        available_replicas: crate::context::omit_zero(count(&|p| {
            pods::is_available(p, min_ready, now)
        })),
        observed_generation: generation,
        conditions: None,
        terminating_replicas: None,
    }
}

// ---------------------------------------------------------------------------------------
// ReplicationController
// ---------------------------------------------------------------------------------------

/// The ReplicaSet spec a ReplicationController amounts to (upstream's conversion shim):
/// its label map as `matchLabels`.
fn rc_as_replica_set_spec(rc: &ReplicationController) -> ReplicaSetSpec {
    let spec = rc.spec.clone().unwrap_or_default();
    ReplicaSetSpec {
        replicas: spec.replicas,
        min_ready_seconds: spec.min_ready_seconds,
        selector: LabelSelector { match_labels: spec.selector, match_expressions: None },
        template: spec.template,
    }
}

/// Run the ReplicationController controller (the ReplicaSet controller's logic over
/// core/v1 ReplicationControllers) until the future is dropped.
pub async fn run_replication_controllers(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let pods = ctx.informers.all::<Pod>();
    let controller = controller(&ctx.informers.all::<ReplicationController>()).await;
    let store = controller.store();
    let cctx = Ctx::new(client.clone(), "replication-controller");
    let controller =
        controller.owns_stream(pods.touched()).watches_stream(pods.touched(), move |pod: Pod| {
            if pods::controller_ref(&pod.metadata).is_some() {
                return Vec::new();
            }
            store
                .state()
                .iter()
                .filter(|rc| rc.namespace() == pod.namespace())
                .filter(|rc| {
                    let spec = rc_as_replica_set_spec(rc);
                    pods::selector_matches(Some(&spec.selector), pod.labels())
                })
                .map(|rc| ObjectRef::from_obj(rc.as_ref()))
                .collect::<Vec<_>>()
        });
    run_controller(controller, cctx, reconcile_rc).await;
}

async fn reconcile_rc(rc: Arc<ReplicationController>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = rc.namespace().unwrap_or_default();
    let name = rc.name_any();
    let spec = rc_as_replica_set_spec(&rc);
    let active = manage_pods(rc.as_ref(), &spec, &ctx).await?;
    let now = pods::now();
    let s = calculate_status(&spec, rc.metadata.generation, &active, now);
    let status = ReplicationControllerStatus {
        replicas: s.replicas,
        fully_labeled_replicas: s.fully_labeled_replicas,
        ready_replicas: s.ready_replicas,
        available_replicas: s.available_replicas,
        observed_generation: s.observed_generation,
        conditions: rc.status.as_ref().and_then(|s| s.conditions.clone()),
    };
    if rc.status.as_ref() != Some(&status) {
        let api: Api<ReplicationController> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = crate::context::status_patch(&status, "", "ReplicationController");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { rs: name, source }),
        }
    }
    Ok(requeue_for_availability(&spec, &active, now))
}

/// Upstream's `slowStartBatch`: call `f` `count` times in batches of 1, 2, 4, ... and stop
/// at the first batch with a failure (a quota or admission error fails fast).
pub(crate) async fn slow_start<F, Fut>(count: usize, f: F) -> Result<(), pods::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), pods::Error>>,
{
    let mut remaining = count;
    let mut batch = 1;
    while remaining > 0 {
        let n = batch.min(remaining);
        let results = futures::future::join_all((0..n).map(|_| f())).await;
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(e);
        }
        remaining -= n;
        batch *= 2;
    }
    Ok(())
}
