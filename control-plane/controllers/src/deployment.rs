//! The Deployment controller: one ReplicaSet per pod template (`<deploy>-<pod-template-hash>`),
//! RollingUpdate (maxSurge/maxUnavailable) and Recreate, revisions and history cleanup,
//! paused deployments, and status with the Progressing/Available conditions that
//! `kubectl rollout status` reads. `kubectl rollout undo` (client side since 1.27: it
//! copies an old ReplicaSet's template into the Deployment) makes that ReplicaSet the new one
//! again, with the next revision number.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::hash::{self, POD_TEMPLATE_HASH};
use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods;
use crate::context::Context;
use skiff_core::events::EventType;

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Errors of one Deployment reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing the replicasets of deployment {deployment}")]
    ListReplicaSets {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("claiming the replicasets of deployment {deployment}")]
    Claim {
        deployment: String,
        #[source]
        source: pods::Error,
    },
    #[error("creating replicaset {rs}")]
    CreateReplicaSet {
        rs: String,
        #[source]
        source: kube::Error,
    },
    #[error("replicaset {rs} exists with another template (hash collision); collisionCount bumped")]
    HashCollision { rs: String },
    #[error("updating replicaset {rs}")]
    UpdateReplicaSet {
        rs: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting old replicaset {rs}")]
    DeleteReplicaSet {
        rs: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating deployment {deployment}")]
    UpdateDeployment {
        deployment: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the Deployment controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let cctx = Ctx::new(client.clone(), "deployment-controller");
    let controller = controller(&ctx.informers.all::<Deployment>())
        .await
        .owns_stream(ctx.informers.all::<ReplicaSet>().touched());
    run_controller(controller, cctx, reconcile).await;
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    Reconcile::new(d, ctx).run().await
}

/// Resolve an int-or-percent against `total` (`intstr.GetScaledValueFromIntOrPercent`).
pub fn scaled_value(v: Option<&IntOrString>, total: i32, round_up: bool, default: &str) -> i32 {
    let s = match v {
        Some(IntOrString::Int(i)) => return *i,
        Some(IntOrString::String(s)) => s.as_str(),
        None => default,
    };
    let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
    let x = pct * i64::from(total);
    let r = if round_up { (x + 99).div_euclid(100) } else { x.div_euclid(100) };
    i32::try_from(r).unwrap_or(0)
}

/// `ResolveFenceposts`: (maxSurge, maxUnavailable); both zero means one unavailable.
pub fn fenceposts(d: &Deployment) -> (i32, i32) {
    let spec = d.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let ru = spec.and_then(|s| s.strategy.as_ref()).and_then(|s| s.rolling_update.as_ref());
    let surge = scaled_value(ru.and_then(|r| r.max_surge.as_ref()), replicas, true, "25%");
    let unavailable =
        scaled_value(ru.and_then(|r| r.max_unavailable.as_ref()), replicas, false, "25%");
    if surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) }
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

fn replicas_of(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn available_of(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations().get(REVISION).and_then(|r| r.parse().ok()).unwrap_or(0)
}

fn created(rs: &ReplicaSet) -> (Option<Timestamp>, String) {
    (rs.metadata.creation_timestamp.as_ref().map(|t| t.0), rs.name_any())
}

/// `NewRSNewReplicas` for RollingUpdate: how far the new ReplicaSet may grow now.
pub fn new_rs_replicas(
    replicas: i32,
    max_surge: i32,
    all_rs_replicas: i32,
    new_rs_replicas: i32,
) -> i32 {
    let max_total = replicas + max_surge;
    if all_rs_replicas >= max_total {
        return new_rs_replicas;
    }
    let scale_up = (max_total - all_rs_replicas).min(replicas - new_rs_replicas);
    new_rs_replicas + scale_up.max(0)
}

/// `reconcileOldReplicaSets` of a rolling update: the new `spec.replicas` of each old
/// ReplicaSet (given oldest first as (replicas, available)), first cleaning up unhealthy
/// replicas, then scaling down as far as `minAvailable` allows.
pub fn scale_down_old(
    replicas: i32,
    max_unavailable: i32,
    new_rs: (i32, i32),
    old: &[(i32, i32)],
) -> Vec<i32> {
    let mut out: Vec<i32> = old.iter().map(|(r, _)| *r).collect();
    let old_count: i32 = out.iter().sum();
    if old_count == 0 {
        return out;
    }
    let all = old_count + new_rs.0;
    let min_available = replicas - max_unavailable;
    let new_unavailable = new_rs.0 - new_rs.1;
    let max_scaled_down = all - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return out;
    }
    // cleanupUnhealthyReplicas
    let mut cleaned = 0;
    for (i, (r, avail)) in old.iter().enumerate() {
        if cleaned >= max_scaled_down {
            break;
        }
        if *r == 0 {
            continue;
        }
        let unhealthy = r - avail;
        if unhealthy <= 0 {
            continue;
        }
        let n = (max_scaled_down - cleaned).min(unhealthy);
        out[i] = r - n;
        cleaned += n;
    }
    // scaleDownOldReplicaSetsForRollingUpdate
    let available: i32 =
        new_rs.1 + old.iter().zip(&out).map(|((_, a), r)| (*a).min(*r)).sum::<i32>();
    if available <= min_available {
        return out;
    }
    let total = available - min_available;
    let mut done = 0;
    for r in out.iter_mut() {
        if done >= total {
            break;
        }
        if *r == 0 {
            continue;
        }
        let n = (*r).min(total - done);
        *r -= n;
        done += n;
    }
    out
}

struct Reconcile {
    d: Arc<Deployment>,
    ctx: Arc<Ctx>,
    ns: String,
    name: String,
    rs_api: Api<ReplicaSet>,
}

impl Reconcile {
    fn new(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Self {
        let ns = d.namespace().unwrap_or_default();
        let name = d.name_any();
        let rs_api = Api::namespaced(ctx.client.clone(), &ns);
        Reconcile { d, ctx, ns, name, rs_api }
    }

    async fn run(self) -> Result<Action, Error> {
        let d = self.d.clone();
        let spec = d.spec.clone().unwrap_or_default();
        let all = self
            .rs_api
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::ListReplicaSets { deployment: self.name.clone(), source })?
            .items;
        let mut rss = pods::claim(&self.rs_api, d.as_ref(), Some(&spec.selector), all)
            .await
            .map_err(|source| Error::Claim { deployment: self.name.clone(), source })?;
        rss.sort_by_key(created);
        if d.metadata.deletion_timestamp.is_some() {
            return self.sync_status(&rss, None, false).await;
        }
        let paused = spec.paused == Some(true);
        let new_idx = rss.iter().position(|rs| {
            rs.spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .is_some_and(|t| hash::equal_ignore_hash(t, &spec.template))
        });
        let max_old_revision = rss
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != new_idx)
            .map(|(_, rs)| revision_of(rs))
            .max()
            .unwrap_or(0);
        let mut new_idx = new_idx;
        let mut created_new = false;
        if paused {
            // A paused deployment only reports; it neither creates nor rolls ReplicaSets.
            return self.sync_status(&rss, new_idx, false).await;
        }
        match new_idx {
            Some(i) => self.update_new_revision(&mut rss[i], max_old_revision).await?,
            None => {
                let rs = self.create_new(&rss, max_old_revision).await?;
                rss.push(rs);
                new_idx = Some(rss.len() - 1);
                created_new = true;
            }
        }
        let Some(ni) = new_idx else {
            return self.sync_status(&rss, None, created_new).await;
        };
        self.set_deployment_revision(revision_of(&rss[ni])).await?;
        if is_recreate(&d) {
            self.recreate(&mut rss, ni).await?;
        } else {
            self.rolling(&mut rss, ni).await?;
        }
        let action = self.sync_status(&rss, Some(ni), created_new).await?;
        self.cleanup(&rss, ni).await?;
        Ok(action)
    }

    fn replicas(&self) -> i32 {
        self.d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    /// The ReplicaSet for the current template, named `<deploy>-<hash>`.
    async fn create_new(
        &self,
        rss: &[ReplicaSet],
        max_old_revision: i64,
    ) -> Result<ReplicaSet, Error> {
        let d = &self.d;
        let spec = d.spec.clone().unwrap_or_default();
        let collision = d.status.as_ref().and_then(|s| s.collision_count);
        let h = hash::compute_hash(&spec.template, collision);
        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert(POD_TEMPLATE_HASH.into(), h.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(Default::default)
            .insert(POD_TEMPLATE_HASH.into(), h.clone());
        let replicas = self.replicas();
        let (surge, _) = fenceposts(d);
        let all: i32 = rss.iter().map(replicas_of).sum();
        let old_pods: i32 = rss.iter().map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas)).sum();
        let initial = if is_recreate(d) {
            if all > 0 || old_pods > 0 { 0 } else { replicas }
        } else {
            new_rs_replicas(replicas, surge, all, 0)
        };
        let mut annotations = self.copied_annotations();
        annotations.insert(REVISION.into(), (max_old_revision + 1).to_string());
        annotations.insert(DESIRED_REPLICAS.into(), replicas.to_string());
        annotations.insert(MAX_REPLICAS.into(), (replicas + surge).to_string());
        let rs_name = format!("{}-{h}", self.name);
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(rs_name.clone()),
                namespace: Some(self.ns.clone()),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                annotations: Some(annotations),
                owner_references: Some(vec![pods::owner_ref(d.as_ref())]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(initial),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        match self.rs_api.create(&PostParams::default(), &rs).await {
            Ok(created) => {
                // A ReplicaSet created empty (the surge is used up) is not a scale-up: its
                // event comes when it first grows.
                if initial > 0 {
                    let msg = format!("Scaled up replica set {rs_name} from 0 to {initial}");
                    self.ctx
                        .recorder
                        .record(d.as_ref(), EventType::Normal, "ScalingReplicaSet", &msg)
                        .await;
                }
                Ok(created)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = self
                    .rs_api
                    .get(&rs_name)
                    .await
                    .map_err(|source| Error::CreateReplicaSet { rs: rs_name.clone(), source })?;
                let same = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .is_some_and(|t| hash::equal_ignore_hash(t, &spec.template));
                let ours = pods::controller_ref(&existing.metadata)
                    .is_some_and(|r| Some(&r.uid) == d.metadata.uid.as_ref());
                if same && ours {
                    return Ok(existing);
                }
                let count = collision.unwrap_or(0).saturating_add(1);
                let api: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), &self.ns);
                let patch = json!({"status": {"collisionCount": count}});
                api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| Error::UpdateDeployment {
                        deployment: self.name.clone(),
                        source,
                    })?;
                Err(Error::HashCollision { rs: rs_name })
            }
            Err(source) => Err(Error::CreateReplicaSet { rs: rs_name, source }),
        }
    }

    /// The Deployment's annotations a ReplicaSet carries (`kubernetes.io/change-cause` for
    /// `kubectl rollout history`), minus the ones the controller owns.
    fn copied_annotations(&self) -> std::collections::BTreeMap<String, String> {
        self.d
            .annotations()
            .iter()
            .filter(|(k, _)| {
                ![LAST_APPLIED, REVISION, REVISION_HISTORY, DESIRED_REPLICAS, MAX_REPLICAS]
                    .contains(&k.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// An existing ReplicaSet that became the new one again (a rollback) takes the next
    /// revision; its old number goes to `revision-history`.
    async fn update_new_revision(
        &self,
        rs: &mut ReplicaSet,
        max_old_revision: i64,
    ) -> Result<(), Error> {
        let current = revision_of(rs);
        let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
        let rs_min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds);
        let mut annotations = serde_json::Map::new();
        if current <= max_old_revision {
            annotations.insert(REVISION.into(), json!((max_old_revision + 1).to_string()));
            if current > 0 {
                let mut hist: Vec<String> = rs
                    .annotations()
                    .get(REVISION_HISTORY)
                    .map(|h| h.split(',').map(String::from).collect())
                    .unwrap_or_default();
                hist.push(current.to_string());
                annotations.insert(REVISION_HISTORY.into(), json!(hist.join(",")));
            }
            for (k, v) in self.copied_annotations() {
                annotations.insert(k, json!(v));
            }
        }
        if annotations.is_empty() && min_ready.unwrap_or(0) == rs_min_ready.unwrap_or(0) {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": annotations}, "spec": {"minReadySeconds": min_ready.unwrap_or(0)}});
        *rs = self
            .rs_api
            .patch(&rs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::UpdateReplicaSet { rs: rs.name_any(), source })?;
        Ok(())
    }

    async fn set_deployment_revision(&self, revision: i64) -> Result<(), Error> {
        if self.d.annotations().get(REVISION).map(String::as_str)
            == Some(revision.to_string().as_str())
        {
            return Ok(());
        }
        let api: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        // Through the status subresource, as upstream: its strategy takes annotations but
        // leaves the generation, which a change of the main resource's annotations bumps.
        let patch = json!({"metadata": {"annotations": {REVISION: revision.to_string()}}});
        match api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) if pods::is_not_found(&e) => Ok(()),
            Err(source) => Err(Error::UpdateDeployment { deployment: self.name.clone(), source }),
        }
    }

    /// Scale one ReplicaSet (and stamp desired/max-replicas), recording ScalingReplicaSet.
    async fn scale(&self, rs: &mut ReplicaSet, to: i32) -> Result<(), Error> {
        let from = replicas_of(rs);
        let replicas = self.replicas();
        let (surge, _) = fenceposts(&self.d);
        let desired = replicas.to_string();
        let max = (replicas + surge).to_string();
        let stamps_ok = rs.annotations().get(DESIRED_REPLICAS) == Some(&desired)
            && rs.annotations().get(MAX_REPLICAS) == Some(&max);
        if from == to && stamps_ok {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"annotations": {DESIRED_REPLICAS: desired, MAX_REPLICAS: max}},
            "spec": {"replicas": to},
        });
        let name = rs.name_any();
        *rs = self
            .rs_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::UpdateReplicaSet { rs: name.clone(), source })?;
        if from != to {
            let dir = if to > from { "up" } else { "down" };
            let msg = format!("Scaled {dir} replica set {name} from {from} to {to}");
            self.ctx
                .recorder
                .record(self.d.as_ref(), EventType::Normal, "ScalingReplicaSet", &msg)
                .await;
        }
        Ok(())
    }

    async fn rolling(&self, rss: &mut [ReplicaSet], ni: usize) -> Result<(), Error> {
        let replicas = self.replicas();
        let (surge, unavailable) = fenceposts(&self.d);
        // reconcileNewReplicaSet
        let new_replicas = replicas_of(&rss[ni]);
        let all: i32 = rss.iter().map(replicas_of).sum();
        let target = if new_replicas > replicas {
            replicas
        } else {
            new_rs_replicas(replicas, surge, all, new_replicas)
        };
        self.scale(&mut rss[ni], target).await?;
        // reconcileOldReplicaSets (old ones oldest first: rss is sorted by creation)
        let old: Vec<(i32, i32)> = rss
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != ni)
            .map(|(_, rs)| (replicas_of(rs), available_of(rs)))
            .collect();
        let new_rs = (replicas_of(&rss[ni]), available_of(&rss[ni]));
        let targets = scale_down_old(replicas, unavailable, new_rs, &old);
        let mut t = targets.into_iter();
        for (i, rs) in rss.iter_mut().enumerate() {
            if i == ni {
                continue;
            }
            if let Some(to) = t.next()
                && to != replicas_of(rs)
            {
                self.scale(rs, to).await?;
            }
        }
        Ok(())
    }

    async fn recreate(&self, rss: &mut [ReplicaSet], ni: usize) -> Result<(), Error> {
        for (i, rs) in rss.iter_mut().enumerate() {
            if i != ni && replicas_of(rs) > 0 {
                self.scale(rs, 0).await?;
            }
        }
        // Wait until the old pods are gone (old ReplicaSets report no replicas).
        let old_running = rss
            .iter()
            .enumerate()
            .any(|(i, rs)| i != ni && rs.status.as_ref().is_some_and(|s| s.replicas > 0));
        if !old_running {
            let replicas = self.replicas();
            self.scale(&mut rss[ni], replicas).await?;
        }
        Ok(())
    }

    /// Old ReplicaSets with nothing left beyond `revisionHistoryLimit` are deleted, oldest
    /// first, once the rollout is complete.
    async fn cleanup(&self, rss: &[ReplicaSet], ni: usize) -> Result<(), Error> {
        let limit =
            self.d.spec.as_ref().and_then(|s| s.revision_history_limit).unwrap_or(10).max(0);
        let idle: Vec<&ReplicaSet> = rss
            .iter()
            .enumerate()
            .filter(|(i, rs)| {
                *i != ni
                    && replicas_of(rs) == 0
                    && rs.status.as_ref().is_none_or(|s| s.replicas == 0)
                    && rs.metadata.deletion_timestamp.is_none()
            })
            .map(|(_, rs)| rs)
            .collect();
        let excess = idle.len().saturating_sub(usize::try_from(limit).unwrap_or(0));
        let mut by_revision = idle;
        by_revision.sort_by_key(|rs| revision_of(rs));
        for rs in by_revision.into_iter().take(excess) {
            match self.rs_api.delete(&rs.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if pods::is_not_found(&e) => {}
                Err(source) => return Err(Error::DeleteReplicaSet { rs: rs.name_any(), source }),
            }
        }
        Ok(())
    }

    /// Status and conditions (`syncRolloutStatus`); requeues for the progress deadline.
    async fn sync_status(
        &self,
        rss: &[ReplicaSet],
        ni: Option<usize>,
        created_new: bool,
    ) -> Result<Action, Error> {
        let d = &self.d;
        let spec = d.spec.clone().unwrap_or_default();
        let replicas = self.replicas();
        let sum = |f: &dyn Fn(&ReplicaSet) -> i32| rss.iter().map(f).sum::<i32>();
        let st = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
        let status_replicas = sum(&|rs| st(rs).replicas);
        let updated = ni.map_or(0, |i| st(&rss[i]).replicas);
        let ready = sum(&|rs| st(rs).ready_replicas.unwrap_or(0));
        let available = sum(&|rs| st(rs).available_replicas.unwrap_or(0));
        // Unavailable counts against what the ReplicaSets want (surge included), not against
        // the Deployment's replicas: upstream's `calculateStatus`.
        let wanted = sum(&replicas_of);
        let old = d.status.clone().unwrap_or_default();
        let mut status = DeploymentStatus {
            observed_generation: d.metadata.generation,
            replicas: crate::context::omit_zero(status_replicas),
            updated_replicas: crate::context::omit_zero(updated),
            ready_replicas: crate::context::omit_zero(ready),
            available_replicas: crate::context::omit_zero(available),
            unavailable_replicas: crate::context::omit_zero((wanted - available).max(0)),
            collision_count: old.collision_count,
            conditions: old.conditions.clone(),
            terminating_replicas: None,
        };
        let now = pods::now();
        let (_, max_unavailable) = fenceposts(d);
        let (ok, reason, msg) = if available >= replicas - max_unavailable {
            ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
        } else {
            (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        };
        set_condition(&mut status, "Available", ok, reason, msg, now, false);
        let new_name = ni.map(|i| rss[i].name_any()).unwrap_or_default();
        let paused = spec.paused == Some(true);
        let deadline = spec.progress_deadline_seconds.unwrap_or(600);
        let complete = updated == replicas
            && status_replicas == replicas
            && available == replicas
            && ni.is_some();
        let mut requeue = None;
        if paused {
            set_condition(
                &mut status,
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused",
                now,
                false,
            );
        } else if complete {
            let msg = format!("ReplicaSet \"{new_name}\" has successfully progressed.");
            set_condition(
                &mut status,
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                &msg,
                now,
                false,
            );
        } else if created_new {
            let msg = format!("Created new replica set \"{new_name}\"");
            set_condition(
                &mut status,
                "Progressing",
                "True",
                "NewReplicaSetCreated",
                &msg,
                now,
                true,
            );
        } else if progressed(&old, &status)
            || condition(&old, "Progressing").is_none_or(|c| {
                c.reason.as_deref() == Some("DeploymentPaused")
                    || c.reason.as_deref() == Some("DeploymentResumed")
                    || c.reason.as_deref() == Some("NewReplicaSetAvailable")
            })
        {
            let msg = format!("ReplicaSet \"{new_name}\" is progressing.");
            set_condition(&mut status, "Progressing", "True", "ReplicaSetUpdated", &msg, now, true);
        } else if let Some(c) = condition(&old, "Progressing")
            && c.reason.as_deref() != Some("ProgressDeadlineExceeded")
        {
            let last = c.last_update_time.as_ref().map(|t| t.0).unwrap_or(now);
            let due = skiff_core::time::add_secs(last, i64::from(deadline));
            if due <= now {
                let msg = format!("ReplicaSet \"{new_name}\" has timed out progressing.");
                set_condition(
                    &mut status,
                    "Progressing",
                    "False",
                    "ProgressDeadlineExceeded",
                    &msg,
                    now,
                    true,
                );
                self.ctx
                    .recorder
                    .record(d.as_ref(), EventType::Warning, "ProgressDeadlineExceeded", &msg)
                    .await;
            } else {
                requeue = Some(Duration::from_secs(
                    u64::try_from(now.duration_until(due).as_secs()).unwrap_or(0) + 1,
                ));
            }
        }
        if !paused && !complete && requeue.is_none() {
            requeue = Some(Duration::from_secs(u64::try_from(deadline).unwrap_or(600) + 1));
        }
        if d.status.as_ref() != Some(&status) {
            let api: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            let patch = crate::context::status_patch(&status, "apps", "Deployment");
            match api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await
            {
                Ok(_) => {}
                Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
                Err(source) => {
                    return Err(Error::UpdateDeployment { deployment: self.name.clone(), source });
                }
            }
        }
        Ok(requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
    }
}

fn condition<'a>(s: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    s.conditions.iter().flatten().find(|c| c.type_ == type_)
}

/// `DeploymentProgressing`: did the rollout move since the last status?
fn progressed(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let g = |v: Option<i32>| v.unwrap_or(0);
    let old_old = g(old.replicas) - g(old.updated_replicas);
    let new_old = g(new.replicas) - g(new.updated_replicas);
    g(new.updated_replicas) > g(old.updated_replicas)
        || new_old < old_old
        || g(new.ready_replicas) > g(old.ready_replicas)
        || g(new.available_replicas) > g(old.available_replicas)
}

/// `SetDeploymentCondition`: an unchanged status keeps lastTransitionTime; an unchanged
/// status and reason keeps the condition unless `touch` (progress moves lastUpdateTime).
fn set_condition(
    status: &mut DeploymentStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
    touch: bool,
) {
    let conds = status.conditions.get_or_insert_with(Vec::new);
    let existing = conds.iter().position(|c| c.type_ == type_);
    let mut transition = Some(Time(now));
    if let Some(i) = existing {
        let c = &conds[i];
        if c.status == value {
            if c.reason.as_deref() == Some(reason) && !touch {
                return;
            }
            transition = c.last_transition_time.clone();
        }
        conds.remove(i);
    }
    conds.push(DeploymentCondition {
        type_: type_.into(),
        status: value.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(Time(now)),
        last_transition_time: transition,
    });
    conds.sort_by(|a, b| b.type_.cmp(&a.type_));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_percent_rounding_like_upstream() {
        let p = |s: &str| IntOrString::String(s.into());
        assert_eq!(scaled_value(Some(&p("25%")), 10, true, ""), 3);
        assert_eq!(scaled_value(Some(&p("25%")), 10, false, ""), 2);
        assert_eq!(scaled_value(Some(&IntOrString::Int(4)), 10, false, ""), 4);
        assert_eq!(scaled_value(None, 3, true, "25%"), 1);
        assert_eq!(scaled_value(None, 3, false, "25%"), 0);
    }

    #[test]
    fn new_replicaset_grows_within_surge() {
        // 3 replicas, surge 1, old RS at 3: new may have 1.
        assert_eq!(new_rs_replicas(3, 1, 3, 0), 1);
        // At the cap: no growth.
        assert_eq!(new_rs_replicas(3, 1, 4, 1), 1);
        // Fresh deployment: all at once.
        assert_eq!(new_rs_replicas(3, 1, 0, 0), 3);
    }

    #[test]
    fn old_replicasets_scale_down_keeping_min_available() {
        // 3 replicas, maxUnavailable 1; new RS 1 (0 available), old 3 (3 available):
        // all 4, minAvailable 2, new unavailable 1 → maxScaledDown 1.
        assert_eq!(scale_down_old(3, 1, (1, 0), &[(3, 3)]), vec![2]);
        // New RS 1 available: available 4 > 2 → scale down 2.
        assert_eq!(scale_down_old(3, 1, (1, 1), &[(3, 3)]), vec![1]);
        // Unhealthy old replicas go first, oldest RS first.
        assert_eq!(scale_down_old(3, 0, (3, 3), &[(1, 0), (2, 2)]), vec![0, 0]);
        assert_eq!(scale_down_old(4, 1, (2, 0), &[(2, 0), (2, 2)]), vec![1, 2]);
    }
}
