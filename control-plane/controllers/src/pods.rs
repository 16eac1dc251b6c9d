//! What the workload controllers share about the pods they own: label selector matching,
//! controller ownerReferences (adoption and release, as client-go's `ControllerRefManager`),
//! pod creation from a template, readiness/availability, and upstream's ranking of pods to
//! delete first (`controller.ActivePods`).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::fmt::Debug;

/// Errors of the shared pod helpers; each variant names the API step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing pods in {namespace}")]
    ListPods {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating a pod for {owner}")]
    CreatePod {
        owner: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting pod {pod}")]
    DeletePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("patching the ownerReferences of pod {pod}")]
    PatchOwner {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The current time as the API types carry it (the wall clock).
#[cfg(not(test))]
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// In unit tests: tokio's clock, anchored at the wall clock on first use, so that
/// `tokio::time::pause` moves availability, deadlines and TTLs too.
#[cfg(test)]
pub fn now() -> Timestamp {
    static ANCHOR: std::sync::OnceLock<(Timestamp, std::time::Instant)> =
        std::sync::OnceLock::new();
    let (wall, mono) = *ANCHOR.get_or_init(|| (Timestamp::now(), std::time::Instant::now()));
    let t = tokio::time::Instant::now().into_std();
    match t.checked_duration_since(mono) {
        Some(ahead) => skiff_core::time::add_std(wall, ahead),
        None => skiff_core::time::add(
            wall,
            -k8s_openapi::jiff::SignedDuration::try_from(mono.duration_since(t))
                .unwrap_or_default(),
        ),
    }
}

/// Whether `labels` satisfy `selector` (matchLabels and matchExpressions, as
/// `metav1.LabelSelectorAsSelector`). An empty selector matches everything; a missing one
/// matches nothing.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.is_some_and(|sel| skiff_core::labels::label_selector_matches(sel, labels))
}

/// The controller ownerReference of an object, if any.
pub fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// A controller ownerReference to `owner` (controller and blockOwnerDeletion set, as
/// `metav1.NewControllerRef`).
pub fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether the pod is terminating (has a deletionTimestamp).
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Phase of the pod ("Pending" if unset).
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// Active as `controller.IsPodActive`: not Succeeded/Failed and not terminating.
pub fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && !is_terminating(pod)
}

/// The time the pod's Ready condition became True, if it is True.
pub fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref().map(|t| t.0))
}

/// `podutil.IsPodReady`.
pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// `podutil.IsPodAvailable`: ready for at least `min_ready_seconds`.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    match ready_since(pod) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(None) => false,
        Some(Some(since)) => skiff_core::time::add_secs(since, i64::from(min_ready_seconds)) <= now,
    }
}

/// Seconds until a ready pod becomes available (for the requeue), if it is not yet.
pub fn until_available(
    pod: &Pod,
    min_ready_seconds: i32,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let since = ready_since(pod)??;
    let at = skiff_core::time::add_secs(since, i64::from(min_ready_seconds));
    (at > now).then(|| {
        std::time::Duration::from_secs((now.duration_until(at).as_secs() + 1).max(1) as u64)
    })
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
        .unwrap_or(0)
}

fn node_name(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

/// Upstream's `ActivePods` order: pods earlier in it are deleted first. Unassigned before
/// assigned; Pending before Unknown before Running; not ready before ready; ready for less
/// time before longer; more restarts before fewer; newer before older.
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let assigned = |p: &Pod| !node_name(p).is_empty();
    let phase_rank = |p: &Pod| match phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    };
    assigned(a)
        .cmp(&assigned(b))
        .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
        .then_with(|| is_ready(a).cmp(&is_ready(b)))
        .then_with(|| {
            // Both ready: the one ready more recently goes first.
            match (ready_since(a).flatten(), ready_since(b).flatten()) {
                (Some(x), Some(y)) => y.cmp(&x),
                _ => Ordering::Equal,
            }
        })
        .then_with(|| restarts(b).cmp(&restarts(a)))
        .then_with(|| {
            let ts = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ts(b).cmp(&ts(a))
        })
        .then_with(|| b.name_any().cmp(&a.name_any()))
}

/// All pods of a namespace (consistent list: the apiserver waits for its watch cache to
/// catch up with the store, so what a reconcile created before is always seen — the reason
/// these controllers need no client-go style "expectations").
pub async fn list_pods(api: &Api<Pod>, namespace: &str) -> Result<Vec<Pod>> {
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ListPods { namespace: namespace.to_string(), source })
}

/// `ControllerRefManager.ClaimPods` (and `ClaimReplicaSets`): of `pods`, those controlled by `owner`, after adopting
/// matching orphans and releasing owned pods whose labels no longer match. A terminating
/// owner adopts nothing.
pub async fn claim<K, C>(
    api: &Api<C>,
    owner: &K,
    selector: Option<&LabelSelector>,
    pods: Vec<C>,
) -> Result<Vec<C>>
where
    K: Resource<DynamicType = ()>,
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let uid = owner.uid().unwrap_or_default();
    let owner_deleting = owner.meta().deletion_timestamp.is_some();
    let mut claimed = Vec::new();
    for pod in pods {
        let matches = selector_matches(selector, pod.labels());
        match controller_ref(pod.meta()) {
            Some(r) if r.uid == uid => {
                if matches || owner_deleting {
                    claimed.push(pod);
                } else {
                    release(api, &pod, &uid).await?;
                }
            }
            Some(_) => {}
            None => {
                if matches
                    && !owner_deleting
                    && pod.meta().deletion_timestamp.is_none()
                    && let Some(p) = adopt(api, owner, &pod).await?
                {
                    claimed.push(p);
                }
            }
        }
    }
    Ok(claimed)
}

async fn adopt<K, C>(api: &Api<C>, owner: &K, pod: &C) -> Result<Option<C>>
where
    K: Resource<DynamicType = ()>,
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut refs = pod.meta().owner_references.clone().unwrap_or_default();
    refs.push(owner_ref(owner));
    // The resourceVersion guards against adopting a pod another controller adopted meanwhile.
    let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": pod.resource_version(), "uid": pod.uid()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(p) => Ok(Some(p)),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(None),
        Err(source) => Err(Error::PatchOwner { pod: pod.name_any(), source }),
    }
}

async fn release<C>(api: &Api<C>, pod: &C, uid: &str) -> Result<()>
where
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let refs: Vec<_> =
        pod.meta().owner_references.iter().flatten().filter(|r| r.uid != uid).cloned().collect();
    let patch =
        json!({"metadata": {"ownerReferences": refs, "resourceVersion": pod.resource_version()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::PatchOwner { pod: pod.name_any(), source }),
    }
}

/// A pod from `template` controlled by `owner`: `generate_name` (`<owner>-`) or a fixed
/// `name`, plus `extra_labels` on top of the template's.
pub fn pod_from_template<K: Resource<DynamicType = ()>>(
    owner: &K,
    template: &PodTemplateSpec,
    name: PodName<'_>,
    extra_labels: &[(&str, &str)],
) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    for (k, v) in extra_labels {
        labels.insert((*k).to_string(), (*v).to_string());
    }
    let (name, generate_name) = match name {
        PodName::Generate(prefix) => (None, Some(prefix.to_string())),
        PodName::Fixed(n) => (Some(n.to_string()), None),
    };
    Pod {
        metadata: ObjectMeta {
            name,
            generate_name,
            namespace: owner.namespace(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: Some(vec![owner_ref(owner)]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// How a created pod is named.
#[derive(Debug, Clone, Copy)]
pub enum PodName<'a> {
    /// `metadata.generateName` with this prefix.
    Generate(&'a str),
    /// A fixed name (StatefulSet ordinals).
    Fixed(&'a str),
}

/// Create a pod; an AlreadyExists is not an error (a fixed name created before).
pub async fn create_pod(api: &Api<Pod>, owner: &str, pod: &Pod) -> Result<Option<Pod>> {
    match api.create(&PostParams::default(), pod).await {
        Ok(p) => Ok(Some(p)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(source) => Err(Error::CreatePod { owner: owner.to_string(), source }),
    }
}

/// Delete a pod (graceful, as upstream's controllers do); NotFound is success.
pub async fn delete_pod(api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let dp = DeleteParams {
        preconditions: pod
            .uid()
            .map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::DeletePod { pod: pod.name_any(), source }),
    }
}

/// Whether the error is the API's NotFound (success for a reconcile of a deleted object).
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time};

    fn pod(name: &str, node: &str, phase: &str, ready: Option<i64>, created: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: (!node.is_empty()).then(|| node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: ready.map(|t| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(Timestamp::from_second(t).unwrap())),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn deletion_order_follows_active_pods_ranking() {
        let mut pods = [
            pod("old-ready", "n1", "Running", Some(100), 10),
            pod("new-ready", "n1", "Running", Some(200), 20),
            pod("running-not-ready", "n1", "Running", None, 5),
            pod("pending", "n1", "Pending", None, 1),
            pod("unscheduled", "", "Pending", None, 0),
        ];
        pods.sort_by(deletion_order);
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            ["unscheduled", "pending", "running-not-ready", "new-ready", "old-ready"]
        );
    }

    #[test]
    fn selector_matching() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "a".to_string())].into();
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "a".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
        };
        assert!(selector_matches(Some(&sel), &labels));
        assert!(selector_matches(Some(&LabelSelector::default()), &labels));
        assert!(!selector_matches(None, &labels));
        let mut other = labels.clone();
        other.insert("tier".into(), "x".into());
        assert!(!selector_matches(Some(&sel), &other));
    }

    #[test]
    fn availability_waits_min_ready_seconds() {
        let p = pod("p", "n", "Running", Some(100), 0);
        let t = |s| Timestamp::from_second(s).unwrap();
        assert!(is_available(&p, 0, t(100)));
        assert!(!is_available(&p, 10, t(105)));
        assert!(is_available(&p, 10, t(110)));
        assert_eq!(until_available(&p, 10, t(105)), Some(std::time::Duration::from_secs(6)));
    }
}
