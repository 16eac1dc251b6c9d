//! The disruption controller: the status of each PodDisruptionBudget, as upstream's
//! `pkg/controller/disruption`. From the pods its selector matches and, for a
//! `maxUnavailable` or a percentage, the scale of their controllers it computes the pods
//! expected, healthy (ready, not terminating, not being evicted) and desired healthy, and
//! so `disruptionsAllowed` and the `DisruptionAllowed` condition. Evictions (the
//! apiserver's pods/eviction) charge the budget and note the pod in `disruptedPods`; an
//! entry is dropped once its pod is gone or was not deleted within [`DELETION_TIMEOUT`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods;
use crate::context::Context;
use skiff_core::events::EventType;

/// Upstream's `DeletionTimeout`: how long an evicted pod may take to be deleted before the
/// budget counts it again.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of one budget's reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing the pods of poddisruptionbudget {pdb}")]
    Pods {
        pdb: String,
        #[source]
        source: pods::Error,
    },
    #[error("updating the status of poddisruptionbudget {pdb}")]
    Status {
        pdb: String,
        #[source]
        source: kube::Error,
    },
}

/// Why the expected pods could not be counted (the budget then allows no disruption).
#[derive(Debug, thiserror::Error)]
enum CountError {
    #[error("found no controllers for pod {0:?}")]
    NoController(String),
    #[error("reading {kind} {name}")]
    Controller {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("invalid value for IntOrString: invalid value {0:?}")]
    Percent(String),
}

/// Run the disruption controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller = controller(&ctx.informers.all::<PodDisruptionBudget>()).await;
    let store = controller.store();
    // Upstream's disruption controller records its events as "controllermanager".
    let cctx = Ctx::new(client, "controllermanager");
    let pods = ctx.informers.all::<Pod>().touched();
    let controller = controller.watches_stream(pods, move |pod: Pod| {
        store
            .state()
            .iter()
            .filter(|pdb| pdb.namespace() == pod.namespace())
            .filter(|pdb| selects(pdb, &pod))
            .map(|pdb| ObjectRef::from_obj(pdb.as_ref()))
            .collect::<Vec<_>>()
    });
    run_controller(controller, cctx, reconcile).await;
}

/// A budget's selector: missing matches nothing, empty matches every pod (policy/v1).
fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    pods::selector_matches(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()), pod.labels())
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = pdb.namespace().unwrap_or_default();
    let name = pdb.name_any();
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let all = pods::list_pods(&pod_api, &ns)
        .await
        .map_err(|source| Error::Pods { pdb: name.clone(), source })?;
    let pods: Vec<Pod> = all.into_iter().filter(|p| selects(&pdb, p)).collect();
    if pods.is_empty() {
        ctx.recorder
            .record(pdb.as_ref(), EventType::Normal, "NoPods", "No matching pods found")
            .await;
    }
    let now = pods::now();
    let mut recheck = None;
    let status = match expected_pods(&ctx.client, &pdb, &pods).await {
        Ok(count) => {
            if !count.unmanaged.is_empty() {
                let selector = pdb
                    .spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .map(|s| serde_json::to_string(s).unwrap_or_default())
                    .unwrap_or_default();
                let msg = format!(
                    "Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."
                );
                ctx.recorder.record(pdb.as_ref(), EventType::Warning, "UnmanagedPods", &msg).await;
            }
            let (disrupted, next) = disrupted_pods(&pdb, &pods, now);
            recheck = next;
            let healthy = count_healthy(&pods, &disrupted, now);
            computed_status(&pdb, count.expected, count.desired_healthy, healthy, disrupted, now)
        }
        Err(e) => {
            let msg = format!("Failed to calculate the number of expected pods: {e}");
            ctx.recorder
                .record(pdb.as_ref(), EventType::Warning, "CalculateExpectedPodCountFailed", &msg)
                .await;
            fail_safe(&pdb, &e.to_string(), now)
        }
    };
    if pdb.status.as_ref() != Some(&status) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        let mut next = pdb.as_ref().clone();
        next.status = Some(status);
        // A replace at the revision read: an eviction charging the budget meanwhile wins.
        match api.replace_status(&name, &PostParams::default(), &next).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { pdb: name, source }),
        }
    }
    let after = recheck.map(|at| {
        Duration::try_from(at.duration_since(now)).unwrap_or_default() + Duration::from_secs(1)
    });
    Ok(after.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// What `getExpectedPodCount` found.
#[derive(Debug, Default, PartialEq)]
struct Count {
    expected: i32,
    desired_healthy: i32,
    /// Pods without a controller (not counted in a controller-based expectation).
    unmanaged: Vec<String>,
}

/// Upstream's `getExpectedPodCount`: an integer `minAvailable` expects the pods found; a
/// percentage or a `maxUnavailable` expects the sum of their controllers' scale.
async fn expected_pods(
    client: &kube::Client,
    pdb: &PodDisruptionBudget,
    pods: &[Pod],
) -> Result<Count, CountError> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let mut count = Count::default();
    match (&spec.max_unavailable, &spec.min_available) {
        (Some(max), _) => {
            let (expected, unmanaged) = expected_scale(client, pods).await?;
            let max = scaled(max, expected)?;
            count = Count { expected, desired_healthy: (expected - max).max(0), unmanaged };
        }
        (None, Some(IntOrString::Int(min))) => {
            count.expected = i32::try_from(pods.len()).unwrap_or(i32::MAX);
            count.desired_healthy = *min;
        }
        (None, Some(min @ IntOrString::String(_))) => {
            let (expected, unmanaged) = expected_scale(client, pods).await?;
            count = Count { expected, desired_healthy: scaled(min, expected)?, unmanaged };
        }
        (None, None) => {}
    }
    Ok(count)
}

/// `GetScaledValueFromIntOrPercent(v, total, roundUp=true)`.
fn scaled(v: &IntOrString, total: i32) -> Result<i32, CountError> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| CountError::Percent(s.clone()))?;
            let value = (percent * i64::from(total) + 99).div_euclid(100);
            Ok(i32::try_from(value).unwrap_or(i32::MAX))
        }
    }
}

/// Upstream's `getExpectedScale`: the sum of the scales of the pods' controllers, each
/// counted once (a ReplicaSet of a Deployment counts as the Deployment); pods without a
/// controller are returned apart. A controller of a kind without a scale is an error.
async fn expected_scale(
    client: &kube::Client,
    pods: &[Pod],
) -> Result<(i32, Vec<String>), CountError> {
    // Each pod's controller, found once: the uid its scale is counted under, and the scale.
    let mut found: HashMap<String, (String, i32)> = HashMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let Some(owner) = pods::controller_ref(&pod.metadata) else {
            unmanaged.push(pod.name_any());
            continue;
        };
        if found.contains_key(&owner.uid) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        match controller_scale(client, &ns, owner).await? {
            Some(scale) => found.insert(owner.uid.clone(), scale),
            None => return Err(CountError::NoController(pod.name_any())),
        };
    }
    // The ReplicaSets of one Deployment count as the Deployment, once.
    let roots: HashMap<&str, i32> = found.values().map(|(uid, n)| (uid.as_str(), *n)).collect();
    Ok((roots.values().fold(0, |total, n| total.saturating_add(*n)), unmanaged))
}

/// The finders of upstream's disruption controller: a pod's controller and its scale.
/// Returns the uid the scale belongs to (a Deployment's for a ReplicaSet it owns).
async fn controller_scale(
    client: &kube::Client,
    ns: &str,
    owner: &OwnerReference,
) -> Result<Option<(String, i32)>, CountError> {
    let group = owner.api_version.split_once('/').map_or("", |(g, _)| g);
    let err = |kind: &str, name: &str| {
        let (kind, name) = (kind.to_string(), name.to_string());
        move |source| CountError::Controller { kind, name, source }
    };
    match (group, owner.kind.as_str()) {
        ("apps", "ReplicaSet") => {
            let api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
            let Some(rs) =
                api.get_opt(&owner.name).await.map_err(err("replicaset", &owner.name))?
            else {
                return Ok(None);
            };
            if rs.uid().as_deref() != Some(owner.uid.as_str()) {
                return Ok(None);
            }
            if let Some(dep_ref) =
                pods::controller_ref(&rs.metadata).filter(|r| r.kind == "Deployment")
            {
                let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
                let dep = api
                    .get_opt(&dep_ref.name)
                    .await
                    .map_err(err("deployment", &dep_ref.name))?
                    .filter(|d| d.uid().as_deref() == Some(dep_ref.uid.as_str()));
                // Without its Deployment the ReplicaSet's own scale counts (upstream's
                // fallback to the scale subresource).
                if let Some(d) = dep {
                    let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                    return Ok(Some((dep_ref.uid.clone(), replicas)));
                }
            }
            Ok(Some((owner.uid.clone(), rs.spec.and_then(|s| s.replicas).unwrap_or(1))))
        }
        ("apps", "StatefulSet") => {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
            let sts = api
                .get_opt(&owner.name)
                .await
                .map_err(err("statefulset", &owner.name))?
                .filter(|s| s.uid().as_deref() == Some(owner.uid.as_str()));
            Ok(sts.map(|s| (owner.uid.clone(), s.spec.and_then(|s| s.replicas).unwrap_or(1))))
        }
        ("", "ReplicationController") => {
            let api: Api<ReplicationController> = Api::namespaced(client.clone(), ns);
            let rc = api
                .get_opt(&owner.name)
                .await
                .map_err(err("replicationcontroller", &owner.name))?
                .filter(|r| r.uid().as_deref() == Some(owner.uid.as_str()));
            Ok(rc.map(|r| (owner.uid.clone(), r.spec.and_then(|s| s.replicas).unwrap_or(1))))
        }
        _ => Ok(None),
    }
}

/// Upstream's `buildDisruptedPodMap`: the evictions still pending (pod present, not
/// terminating, noted less than [`DELETION_TIMEOUT`] ago) and when the oldest expires.
fn disrupted_pods(
    pdb: &PodDisruptionBudget,
    pods: &[Pod],
    now: Timestamp,
) -> (BTreeMap<String, Time>, Option<Timestamp>) {
    let noted = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
    let mut pending = BTreeMap::new();
    let mut recheck: Option<Timestamp> = None;
    let Some(noted) = noted else { return (pending, recheck) };
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.name_any();
        let Some(at) = noted.get(&name) else { continue };
        let expires = at.0.checked_add(timeout).unwrap_or(at.0);
        if expires > now {
            recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
            pending.insert(name, at.clone());
        }
    }
    (pending, recheck)
}

/// Upstream's `countHealthyPods`: ready pods neither terminating nor being evicted.
fn count_healthy(pods: &[Pod], disrupted: &BTreeMap<String, Time>, now: Timestamp) -> i32 {
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    let n = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            disrupted
                .get(&p.name_any())
                .is_none_or(|at| at.0.checked_add(timeout).is_ok_and(|e| e <= now))
        })
        .filter(|p| pods::is_ready(p))
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Upstream's `updatePdbStatus`: no disruption while nothing is expected (a budget whose
/// first pods just appeared stays safe until counted).
fn computed_status(
    pdb: &PodDisruptionBudget,
    expected: i32,
    desired_healthy: i32,
    current_healthy: i32,
    disrupted: BTreeMap<String, Time>,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let allowed = if expected <= 0 { 0 } else { (current_healthy - desired_healthy).max(0) };
    let generation = pdb.metadata.generation;
    let old = pdb.status.clone().unwrap_or_default();
    let mut status = PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: generation,
        conditions: old.conditions,
    };
    let (value, reason) =
        if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
    set_condition(&mut status, value, reason, "", now);
    status
}

/// Upstream's `failSafe`: no disruption allowed, the condition says why (`SyncFailed`);
/// the counts and observedGeneration stay as they were.
fn fail_safe(pdb: &PodDisruptionBudget, why: &str, now: Timestamp) -> PodDisruptionBudgetStatus {
    // observedGeneration stays: evictions keep answering "still being processed".
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    set_condition(&mut status, "False", "SyncFailed", why, now);
    status
}

/// `meta.SetStatusCondition` of `DisruptionAllowed`: the transition time moves only with
/// the status.
fn set_condition(
    status: &mut PodDisruptionBudgetStatus,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let observed = status.observed_generation;
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let since = conditions
        .iter()
        .find(|c| c.type_ == "DisruptionAllowed" && c.status == value)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now)));
    let fresh = Condition {
        type_: "DisruptionAllowed".into(),
        status: value.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: observed,
        last_transition_time: since,
    };
    match conditions.iter_mut().find(|c| c.type_ == "DisruptionAllowed") {
        Some(c) => *c = fresh,
        None => conditions.push(fresh),
    }
}
