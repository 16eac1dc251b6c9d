//! The ReplicaSet controller: keeps `spec.replicas` active pods from the template, adopts
//! matching orphans and releases owned pods that no longer match, deletes the pods upstream
//! would delete first (unscheduled, pending, not ready, newest), and reports status
//! (replicas, fullyLabeled, ready, available with minReadySeconds, observedGeneration).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::Context;
use super::events::EventType;
use super::informer::{WorkloadCtx as Ctx, run_controller};
use super::pods::{self, PodName};

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
    let rs_api: Api<ReplicaSet> = Api::all(client.clone());
    let pod_api: Api<Pod> = Api::all(client.clone());
    let controller = Controller::new(rs_api, watcher::Config::default());
    let store = controller.store();
    let cctx = Ctx::new(client.clone(), "replicaset-controller");
    let controller = controller
        .owns(pod_api.clone(), watcher::Config::default())
        // Orphans: a pod without a controller wakes the ReplicaSets whose selector matches it.
        .watches(pod_api, watcher::Config::default(), move |pod: Pod| {
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
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let perr = |source| Error::Pods { rs: name.clone(), source };
    let spec = rs.spec.clone().unwrap_or_default();
    let all = pods::list_pods(&pod_api, &ns).await.map_err(perr)?;
    let owned =
        pods::claim(&pod_api, rs.as_ref(), Some(&spec.selector), all).await.map_err(perr)?;
    let active: Vec<&Pod> = owned.iter().filter(|p| pods::is_active(p)).collect();

    if rs.metadata.deletion_timestamp.is_none() {
        let desired = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
        if active.len() < desired {
            let want = (desired - active.len()).min(BURST_REPLICAS);
            let template = spec.template.clone().unwrap_or_default();
            let pod = pods::pod_from_template(
                rs.as_ref(),
                &template,
                PodName::Generate(&format!("{name}-")),
                &[],
            );
            let created = slow_start(want, || async {
                match pods::create_pod(&pod_api, &name, &pod).await {
                    Ok(Some(p)) => {
                        let msg = format!("Created pod: {}", p.name_any());
                        ctx.recorder
                            .record(rs.as_ref(), EventType::Normal, "SuccessfulCreate", &msg)
                            .await;
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => {
                        let msg = format!("Error creating: {e}");
                        ctx.recorder
                            .record(rs.as_ref(), EventType::Warning, "FailedCreate", &msg)
                            .await;
                        Err(e)
                    }
                }
            })
            .await;
            created.map_err(perr)?;
        } else if active.len() > desired {
            let mut victims = active.clone();
            victims.sort_by(|a, b| pods::deletion_order(a, b));
            for pod in victims.iter().take((active.len() - desired).min(BURST_REPLICAS)) {
                pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
                let msg = format!("Deleted pod: {}", pod.name_any());
                ctx.recorder.record(rs.as_ref(), EventType::Normal, "SuccessfulDelete", &msg).await;
            }
        }
    }

    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let now = pods::now();
    let status = calculate_status(&rs, &active, now);
    if rs.status.as_ref() != Some(&status) {
        let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = super::status_patch(&status, "apps", "ReplicaSet");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { rs: name, source }),
        }
    }
    // A ready pod becomes available after minReadySeconds: look again then.
    let next = active.iter().filter_map(|p| pods::until_available(p, min_ready, now)).min();
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// `calculateStatus` from the active pods the ReplicaSet controls.
fn calculate_status(
    rs: &ReplicaSet,
    active: &[&Pod],
    now: k8s_openapi::jiff::Timestamp,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
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
        fully_labeled_replicas: super::omit_zero(count(&|p| {
            template_labels.iter().all(|(k, v)| p.labels().get(k) == Some(v))
        })),
        ready_replicas: super::omit_zero(count(&pods::is_ready)),
        available_replicas: super::omit_zero(count(&|p| pods::is_available(p, min_ready, now))),
        observed_generation: rs.metadata.generation,
        conditions: rs.status.as_ref().and_then(|s| s.conditions.clone()),
        terminating_replicas: None,
    }
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
