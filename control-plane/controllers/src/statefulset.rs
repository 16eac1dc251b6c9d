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
//! Each of `volumeClaimTemplates` becomes a PersistentVolumeClaim `<template>-<sts>-<n>`
//! per pod, created before the pod and mounted in it as the volume named after the
//! template; claims outlive their pods unless `persistentVolumeClaimRetentionPolicy` says
//! otherwise: `whenDeleted: Delete` makes the StatefulSet their owner, `whenScaled: Delete`
//! makes a pod removed by a scale down the owner of its claims before it goes, so that the
//! garbage collector deletes them after it.
//!
//! Simplified against upstream: `ordinals.start` and `maxUnavailable` are ignored, and a
//! retention policy changed on a live set applies to claims created (or scaled down) after.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::hash::{self, CONTROLLER_REVISION_HASH};
use super::history;
use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods::{self, PodName};
use crate::context::Context;
use skiff_core::events::EventType;

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
    #[error("creating claim {claim} of statefulset {sts}")]
    Claim {
        sts: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("pvc {claim} of statefulset {sts} is being deleted")]
    ClaimDeleting { sts: String, claim: String },
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
    let controller = controller(&ctx.informers.all::<StatefulSet>())
        .await
        .owns_stream(ctx.informers.all::<Pod>().touched());
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
    /// A condemned pod already terminating: with `whenScaled: Delete` its claims go with
    /// it all the same.
    Condemned(&'a Pod),
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
    let observed = sts.status.as_ref().and_then(|s| s.observed_generation);
    let has_claims = spec.volume_claim_templates.as_ref().is_some_and(|t| !t.is_empty());
    if has_claims
        && sts.metadata.deletion_timestamp.is_none()
        && observed != sts.metadata.generation
    {
        let members = by_ordinal.range(..replicas).map(|(o, p)| (*o, *p));
        // A spec change (the retention policy among them): the live members' claims follow
        // the policy. Upstream checks on every sync against its claim cache; here once per
        // generation.
        let live = members.filter(|(_, p)| !pods::is_terminating(p));
        fix_claim_owners(&sts, live, false, &ctx).await?;
    }

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
        // Every condemned pod already terminating, whatever the order below stops at.
        for p in condemned.iter().filter(|p| pods::is_terminating(p)) {
            steps.push(Step::Condemned(p));
        }
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
                create_claims(&sts, o, &pod_name, &ctx).await?;
                mount_claims(&sts, o, &mut pod);
                if pods::create_pod(&pod_api, &name, &pod).await.map_err(perr)?.is_some() {
                    let msg = format!("create Pod {pod_name} in StatefulSet {name} successful");
                    ctx.recorder
                        .record(sts.as_ref(), EventType::Normal, "SuccessfulCreate", &msg)
                        .await;
                }
            }
            Step::Condemned(p) => {
                if retention(&sts, |p| p.when_scaled.as_deref()) {
                    own_claims_by_pod(&sts, p, &ctx).await?;
                }
            }
            Step::Delete(p, reason) => {
                if ordinal(&name, &p.name_any()).is_some_and(|o| o >= replicas)
                    && retention(&sts, |p| p.when_scaled.as_deref())
                {
                    own_claims_by_pod(&sts, p, &ctx).await?;
                }
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
        ready_replicas: crate::context::omit_zero(count(&pods::is_ready)),
        available_replicas: Some(count(&|p| pods::is_available(p, min_ready, now))),
        current_replicas: crate::context::omit_zero(count(&|p| revision(p) == current_revision)),
        updated_replicas: crate::context::omit_zero(updated),
        current_revision: Some(current_revision),
        update_revision: Some(update_revision),
        collision_count: collision,
        conditions: sts.status.as_ref().and_then(|s| s.conditions.clone()),
    };
    if sts.status.as_ref() != Some(&status) {
        let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = crate::context::status_patch(&status, "apps", "StatefulSet");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { sts: name, source }),
        }
    }
    let next = live.iter().filter_map(|p| pods::until_available(p, min_ready, now)).min();
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Upstream's `getPersistentVolumeClaimName`: `<template>-<sts>-<ordinal>`.
fn claim_name(template: &str, sts: &str, ordinal: i32) -> String {
    format!("{template}-{sts}-{ordinal}")
}

/// Upstream's `getPersistentVolumeClaims`: each template's claim for pod `ordinal`, with the
/// StatefulSet's selector labels on top of the template's, owned by the StatefulSet when
/// its retention policy deletes claims with it.
fn claims_for(sts: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let spec = sts.spec.clone().unwrap_or_default();
    let delete_with_set = retention(sts, |p| p.when_deleted.as_deref());
    spec.volume_claim_templates
        .unwrap_or_default()
        .into_iter()
        .map(|mut claim| {
            let template = claim.name_any();
            let meta = &mut claim.metadata;
            meta.name = Some(claim_name(&template, &sts.name_any(), ordinal));
            meta.namespace = sts.namespace();
            meta.generate_name = None;
            meta.resource_version = None;
            meta.uid = None;
            let labels = meta.labels.get_or_insert_with(Default::default);
            for (k, v) in spec.selector.match_labels.iter().flatten() {
                labels.insert(k.clone(), v.clone());
            }
            if delete_with_set {
                let mut owner = pods::owner_ref(sts);
                owner.controller = None;
                meta.owner_references = Some(vec![owner]);
            }
            claim.status = None;
            claim
        })
        .collect()
}

/// Whether the retention policy's field `which` says Delete.
fn retention(
    sts: &StatefulSet,
    which: impl Fn(&StatefulSetPersistentVolumeClaimRetentionPolicy) -> Option<&str>,
) -> bool {
    sts.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref())
        .and_then(which)
        == Some("Delete")
}

/// Whether `r` refers to pod `pod_name` (any incarnation of it).
fn refers_to_pod(r: &OwnerReference, pod_name: &str) -> bool {
    r.api_version == "v1" && r.kind == "Pod" && r.name == pod_name
}

/// `whenScaled: Delete`: the claims of a pod a scale down removes get the pod as their
/// owner (upstream's `updateClaimOwnerRefForSetAndPod` for a condemned pod).
async fn own_claims_by_pod(sts: &StatefulSet, pod: &Pod, ctx: &Ctx) -> Result<(), Error> {
    let Some(o) = ordinal(&sts.name_any(), &pod.name_any()) else { return Ok(()) };
    fix_claim_owners(sts, std::iter::once((o, pod)), true, ctx).await
}

/// Replaces a claim's owner references, with the resourceVersion read.
async fn set_owners(
    api: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    refs: Vec<OwnerReference>,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"ownerReferences": refs,
                                    "resourceVersion": claim.resource_version()}});
    api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// The owners a claim of pod `pod_name` should have under the retention policy, if not
/// the ones it has (upstream's `updateClaimOwnerRefForSetAndPod`); other owners are kept.
/// - `condemned` (whenScaled: Delete): the pod alone. A reference to the set would keep the
///   claim past the pod, as the garbage collector waits for every owner.
/// - A live member: the set when its policy deletes claims with it (`wanted`'s
///   references), never the pod.
fn claim_owners(
    sts: &StatefulSet,
    existing: &PersistentVolumeClaim,
    wanted: &PersistentVolumeClaim,
    pod_name: &str,
    condemned: Option<&Pod>,
) -> Option<Vec<OwnerReference>> {
    let set_uid = sts.uid().unwrap_or_default();
    let refs = existing.owner_references();
    let mut kept: Vec<OwnerReference> =
        refs.iter().filter(|r| !refers_to_pod(r, pod_name) && r.uid != set_uid).cloned().collect();
    match condemned {
        Some(pod) => kept.push(OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..pods::owner_ref(pod)
        }),
        None => kept.extend(wanted.owner_references().iter().cloned()),
    }
    let same = kept.len() == refs.len() && kept.iter().all(|k| refs.iter().any(|r| r.uid == k.uid));
    (!same).then_some(kept)
}

/// Gives the claims of `members` (ordinal, pod) the owners [`claim_owners`] says, guarded
/// by the resourceVersion read; claims missing or being deleted are left alone.
async fn fix_claim_owners<'a>(
    sts: &StatefulSet,
    members: impl Iterator<Item = (i32, &'a Pod)>,
    condemned: bool,
    ctx: &Ctx,
) -> Result<(), Error> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &sts.namespace().unwrap_or_default());
    for (o, pod) in members {
        for wanted in claims_for(sts, o) {
            let name = wanted.name_any();
            let err = |source| Error::Claim { sts: sts.name_any(), claim: name.clone(), source };
            let Some(claim) = api.get_opt(&name).await.map_err(err)? else { continue };
            if claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let by_pod = condemned.then_some(pod);
            if let Some(refs) = claim_owners(sts, &claim, &wanted, &pod.name_any(), by_pod) {
                set_owners(&api, &claim, refs).await.map_err(err)?;
            }
        }
    }
    Ok(())
}

/// Creates the claims pod `ordinal` mounts that do not exist yet.
async fn create_claims(
    sts: &StatefulSet,
    ordinal: i32,
    pod_name: &str,
    ctx: &Ctx,
) -> Result<(), Error> {
    let ns = sts.namespace().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    for claim in claims_for(sts, ordinal) {
        let name = claim.name_any();
        let err = |source| Error::Claim { sts: sts.name_any(), claim: name.clone(), source };
        if let Some(existing) = api.get_opt(&name).await.map_err(err)? {
            // Upstream does not start a pod on a claim on its way out.
            if existing.metadata.deletion_timestamp.is_some() {
                return Err(Error::ClaimDeleting { sts: sts.name_any(), claim: name });
            }
            // Owned by an earlier pod of this name a scale down removed: the claim is the
            // new pod's now, not the garbage collector's, and the set's again when its
            // policy deletes claims with it.
            if let Some(refs) = claim_owners(sts, &existing, &claim, pod_name, None) {
                set_owners(&api, &existing, refs).await.map_err(err)?;
            }
            continue;
        }
        match api.create(&PostParams::default(), &claim).await {
            Ok(_) => {
                let msg = format!(
                    "create Claim {name} Pod {pod_name} in StatefulSet {} success",
                    sts.name_any()
                );
                ctx.recorder.record(sts, EventType::Normal, "SuccessfulCreate", &msg).await;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(source) => {
                let msg = format!(
                    "create Claim {name} for Pod {pod_name} in StatefulSet {} failed error: {source}",
                    sts.name_any()
                );
                ctx.recorder.record(sts, EventType::Warning, "FailedCreate", &msg).await;
                return Err(Error::Claim { sts: sts.name_any(), claim: name, source });
            }
        }
    }
    Ok(())
}

/// Upstream's `updateStorage`: a volume per claim template, named after it and backed by
/// the pod's claim, in place of any template volume of that name.
fn mount_claims(sts: &StatefulSet, ordinal: i32, pod: &mut Pod) {
    let templates = sts.spec.as_ref().and_then(|s| s.volume_claim_templates.as_deref());
    let templates: Vec<String> =
        templates.unwrap_or_default().iter().map(|t| t.name_any()).collect();
    if templates.is_empty() {
        return;
    }
    let Some(ps) = pod.spec.as_mut() else { return };
    let mut volumes: Vec<Volume> = templates
        .iter()
        .map(|t| Volume {
            name: t.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(t, &sts.name_any(), ordinal),
                read_only: None,
            }),
            ..Default::default()
        })
        .collect();
    volumes.extend(
        ps.volumes.take().unwrap_or_default().into_iter().filter(|v| !templates.contains(&v.name)),
    );
    ps.volumes = Some(volumes);
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
