//! The StatefulSet controller: pods with stable ordinal names `<sts>-<n>` (hostname and
//! subdomain set for the governing Service), OrderedReady (pod n is created only once
//! 0..n-1 are Running and Ready; scale down removes the highest ordinal first, one at a
//! time) or Parallel management, RollingUpdate in reverse ordinal order down to `partition`
//! (or OnDelete), and status.
//!
//! Each template is recorded as a ControllerRevision `<sts>-<hash>` ([`history`]), which
//! is the pods' `controller-revision-hash` and `status.currentRevision`/`updateRevision`;
//! pods (re)created below the partition get the current revision's template.
//!
//! Simplified against upstream: `volumeClaimTemplates` are ignored (no
//! PersistentVolumeClaims are created), as are `ordinals.start`, `maxUnavailable` and the
//! PVC retention policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use super::Context;
use super::events::EventType;
use super::hash::{self, CONTROLLER_REVISION_HASH};
use super::history;
use super::informer::{WorkloadCtx as Ctx, run_controller};
use super::pods::{self, PodName};

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// Errors of one StatefulSet reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("managing the pods of statefulset {sts}")]
    Pods {
        sts: String,
        #[source]
        source: pods::Error,
    },
    #[error("recording the revisions of statefulset {sts}")]
    History {
        sts: String,
        #[source]
        source: history::Error,
    },
    #[error("updating the status of statefulset {sts}")]
    Status {
        sts: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the StatefulSet controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let cctx = Ctx::new(client.clone(), "statefulset-controller");
    let controller =
        Controller::new(Api::<StatefulSet>::all(client.clone()), watcher::Config::default())
            .owns(Api::<Pod>::all(client), watcher::Config::default());
    run_controller(controller, cctx, reconcile).await;
}

/// The ordinal of a pod named `<sts>-<n>`.
pub fn ordinal(sts: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(sts)?.strip_prefix('-')?.parse().ok().filter(|n: &i32| *n >= 0)
}

fn running_and_ready(pod: &Pod) -> bool {
    pods::phase(pod) == "Running" && pods::is_ready(pod) && !pods::is_terminating(pod)
}

/// One step the controller takes this round.
enum Step<'a> {
    Create(i32),
    Delete(&'a Pod, &'static str),
}

async fn reconcile(sts: Arc<StatefulSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = sts.namespace().unwrap_or_default();
    let name = sts.name_any();
    let perr = |source| Error::Pods { sts: name.clone(), source };
    let spec = sts.spec.clone().unwrap_or_default();
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let all = pods::list_pods(&pod_api, &ns).await.map_err(perr)?;
    let owned =
        pods::claim(&pod_api, sts.as_ref(), Some(&spec.selector), all).await.map_err(perr)?;
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
    let collision = sts.status.as_ref().and_then(|s| s.collision_count);
    let hash = hash::compute_hash(&spec.template, collision);
    let update_revision = format!("{name}-{hash}");
    let revisions = if sts.metadata.deletion_timestamp.is_none() {
        history::record(&ctx.client, sts.as_ref(), &spec.selector, &spec.template, &hash)
            .await
            .map_err(|source| Error::History { sts: name.clone(), source })?
    } else {
        Vec::new()
    };
    let mut by_ordinal: BTreeMap<i32, &Pod> = BTreeMap::new();
    for p in &owned {
        if let Some(o) = ordinal(&name, &p.name_any()) {
            by_ordinal.insert(o, p);
        }
    }
    let revision = |p: &Pod| p.labels().get(CONTROLLER_REVISION_HASH).cloned().unwrap_or_default();

    let strategy = spec.update_strategy.as_ref();
    let rolling =
        strategy.and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate") == "RollingUpdate";
    let partition =
        strategy.and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0);
    // Below the partition pods keep the current revision (upstream's
    // `newVersionedStatefulSetPod`), when it is recorded.
    let current = sts
        .status
        .as_ref()
        .and_then(|s| s.current_revision.as_deref())
        .filter(|c| *c != update_revision)
        .and_then(|c| revisions.iter().find(|r| r.metadata.name.as_deref() == Some(c)))
        .and_then(|r| Some((r.name_any(), history::template_of(r)?)));
    let mut steps: Vec<Step<'_>> = Vec::new();
    'plan: {
        if sts.metadata.deletion_timestamp.is_some() {
            break 'plan;
        }
        // Replicas, lowest ordinal first.
        for o in 0..replicas {
            match by_ordinal.get(&o) {
                None => {
                    steps.push(Step::Create(o));
                    if !parallel {
                        break 'plan;
                    }
                }
                Some(p)
                    if matches!(pods::phase(p), "Failed" | "Succeeded")
                        && !pods::is_terminating(p) =>
                {
                    steps.push(Step::Delete(p, "RecreatingFailedPod"));
                    if !parallel {
                        break 'plan;
                    }
                }
                Some(p) if !parallel && !running_and_ready(p) => break 'plan,
                Some(_) => {}
            }
        }
        // Condemned pods, highest ordinal first.
        let condemned: Vec<&Pod> = by_ordinal.range(replicas..).rev().map(|(_, p)| *p).collect();
        for p in condemned {
            if pods::is_terminating(p) {
                if parallel {
                    continue;
                }
                break 'plan;
            }
            steps.push(Step::Delete(p, "SuccessfulDelete"));
            if !parallel {
                break 'plan;
            }
        }
        // Rolling update: highest ordinal first, one pod at a time, down to the partition.
        if !rolling {
            break 'plan;
        }
        for o in (partition.max(0)..replicas).rev() {
            let Some(p) = by_ordinal.get(&o) else { break 'plan };
            if revision(p) != update_revision && !pods::is_terminating(p) {
                steps.push(Step::Delete(p, "SuccessfulDelete"));
                break 'plan;
            }
            if !running_and_ready(p) {
                break 'plan;
            }
        }
    }

    for step in steps {
        match step {
            Step::Create(o) => {
                let pod_name = format!("{name}-{o}");
                let index = o.to_string();
                let (revision, template) = match &current {
                    Some((revision, template)) if rolling && o < partition => (revision, template),
                    _ => (&update_revision, &spec.template),
                };
                let labels = [
                    (CONTROLLER_REVISION_HASH, revision.as_str()),
                    (POD_NAME_LABEL, pod_name.as_str()),
                    (POD_INDEX_LABEL, index.as_str()),
                ];
                let mut pod = pods::pod_from_template(
                    sts.as_ref(),
                    template,
                    PodName::Fixed(&pod_name),
                    &labels,
                );
                if let Some(ps) = pod.spec.as_mut() {
                    ps.hostname = Some(pod_name.clone());
                    ps.subdomain = spec.service_name.clone().filter(|s| !s.is_empty());
                }
                if pods::create_pod(&pod_api, &name, &pod).await.map_err(perr)?.is_some() {
                    let msg = format!("create Pod {pod_name} in StatefulSet {name} successful");
                    ctx.recorder
                        .record(sts.as_ref(), EventType::Normal, "SuccessfulCreate", &msg)
                        .await;
                }
            }
            Step::Delete(p, reason) => {
                pods::delete_pod(&pod_api, p).await.map_err(perr)?;
                let msg = format!("delete Pod {} in StatefulSet {name} successful", p.name_any());
                ctx.recorder.record(sts.as_ref(), EventType::Normal, reason, &msg).await;
            }
        }
    }

    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let now = pods::now();
    let live: Vec<&Pod> =
        by_ordinal.values().copied().filter(|p| !pods::is_terminating(p)).collect();
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(live.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let updated = count(&|p| revision(p) == update_revision);
    let old_current = sts.status.as_ref().and_then(|s| s.current_revision.clone());
    let current_revision = match old_current {
        Some(c) if updated < replicas || count(&|_| true) != replicas => c,
        _ => update_revision.clone(),
    };
    let mut keep: std::collections::HashSet<String> = live.iter().map(|p| revision(p)).collect();
    keep.extend([current_revision.clone(), update_revision.clone()]);
    let limit = spec.revision_history_limit.unwrap_or(history::DEFAULT_LIMIT);
    history::truncate(&ctx.client, &ns, &revisions, &keep, limit)
        .await
        .map_err(|source| Error::History { sts: name.clone(), source })?;
    let status = StatefulSetStatus {
        observed_generation: sts.metadata.generation,
        replicas: count(&|_| true),
        ready_replicas: super::omit_zero(count(&pods::is_ready)),
        available_replicas: Some(count(&|p| pods::is_available(p, min_ready, now))),
        current_replicas: super::omit_zero(count(&|p| revision(p) == current_revision)),
        updated_replicas: super::omit_zero(updated),
        current_revision: Some(current_revision),
        update_revision: Some(update_revision),
        collision_count: collision,
        conditions: sts.status.as_ref().and_then(|s| s.conditions.clone()),
    };
    if sts.status.as_ref() != Some(&status) {
        let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = super::status_patch(&status, "apps", "StatefulSet");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { sts: name, source }),
        }
    }
    let next = live.iter().filter_map(|p| pods::until_available(p, min_ready, now)).min();
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals() {
        assert_eq!(ordinal("web", "web-0"), Some(0));
        assert_eq!(ordinal("web", "web-12"), Some(12));
        assert_eq!(ordinal("web", "web-x"), None);
        assert_eq!(ordinal("web", "webby-1"), None);
        assert_eq!(ordinal("web", "web--1"), None);
    }
}
