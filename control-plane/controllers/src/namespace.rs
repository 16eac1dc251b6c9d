//! The namespace controller: a Namespace being deleted (deletionTimestamp set, phase
//! Terminating, `spec.finalizers: [kubernetes]`) has all its namespaced content deleted —
//! every namespaced resource the API serves, found through discovery — and once nothing is
//! left its `kubernetes` finalizer is removed through `namespaces/finalize`, upon which the
//! apiserver deletes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use super::informer::{Change, informer, run_applier};
use crate::context::Context;

const FINALIZER: &str = "kubernetes";
/// How soon a namespace with content still terminating is looked at again.
const RECHECK: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovering the served resources")]
    Discovery(#[source] kube::Error),
    #[error("deleting {resource} in namespace {namespace}")]
    DeleteContent {
        namespace: String,
        resource: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing {resource} in namespace {namespace}")]
    ListContent {
        namespace: String,
        resource: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the deletion conditions of namespace {namespace}")]
    Status {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("removing the kubernetes finalizer of namespace {namespace}")]
    Finalize {
        namespace: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every namespaced resource the apiserver serves that can be listed and deleted.
pub async fn namespaced_resources(client: &Client) -> Result<Vec<(ApiResource, ApiCapabilities)>> {
    let discovery = Discovery::new(client.clone()).run().await.map_err(Error::Discovery)?;
    Ok(discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .filter(|(_, caps)| {
            caps.scope == Scope::Namespaced
                && caps.supports_operation(verbs::LIST)
                && caps.supports_operation(verbs::DELETE)
        })
        .collect())
}

/// Run the namespace controller until dropped.
pub async fn run(ctx: Arc<Context>) {
    let (tx, rx) = mpsc::unbounded_channel::<ObjectRef<Namespace>>();
    let store = informer(&ctx.informers.all::<Namespace>(), tx, |c| match c {
        Change::Applied(ns) if ns.metadata.deletion_timestamp.is_some() => {
            vec![ObjectRef::from_obj(ns)]
        }
        _ => Vec::new(),
    })
    .await;
    run_applier("namespace", store, rx, ctx, |ns, ctx| async move { reconcile(&ns, &ctx).await })
        .await;
}

async fn reconcile(ns: &Namespace, ctx: &Context) -> Result<Action> {
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let has_finalizer = ns
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let outcome = delete_content(&ctx.client, &name).await;
    report(&ctx.client, ns, &outcome).await?;
    let remaining = outcome?;
    if !remaining.is_empty() {
        tracing::debug!(namespace = %name, ?remaining.resources, "namespace content still terminating");
        return Ok(Action::requeue(RECHECK));
    }
    finalize(&ctx.client, ns).await?;
    Ok(Action::await_change())
}

/// What a deletion pass left in a namespace.
#[derive(Debug, Default)]
pub struct Remaining {
    /// Objects left per resource, as upstream names them (`pods.`, `deployments.apps`).
    pub resources: BTreeMap<String, usize>,
    /// Objects left per finalizer they still carry.
    pub finalizers: BTreeMap<String, usize>,
}

impl Remaining {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

/// The deletion conditions upstream's namespace controller keeps on a terminating
/// namespace, in its order, with the reason and message each has when nothing is wrong.
const CONDITIONS: [(&str, &str, &str); 5] = [
    (
        "NamespaceDeletionDiscoveryFailure",
        "ResourcesDiscovered",
        "All resources successfully discovered",
    ),
    (
        "NamespaceDeletionGroupVersionParsingFailure",
        "ParsedGroupVersions",
        "All legacy kube types successfully parsed",
    ),
    (
        "NamespaceDeletionContentFailure",
        "ContentDeleted",
        "All content successfully deleted, may be waiting on finalization",
    ),
    ("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
    (
        "NamespaceFinalizersRemaining",
        "ContentHasNoFinalizers",
        "All content-preserving finalizers finished",
    ),
];

/// The namespace's conditions after a deletion pass with `outcome` (upstream's
/// `namespaceConditionUpdater`): a condition keeps its transition time unless its status,
/// reason or message changed. `None` when nothing changed.
fn conditions(
    current: &[NamespaceCondition],
    outcome: &Result<Remaining>,
    now: &Time,
) -> Option<Vec<NamespaceCondition>> {
    let failing = |kind: &str| -> Option<(String, String)> {
        match (kind, outcome) {
            ("NamespaceDeletionDiscoveryFailure", Err(e @ Error::Discovery(_))) => {
                Some(("DiscoveryFailed".into(), error_chain(e)))
            }
            (
                "NamespaceDeletionContentFailure",
                Err(e @ (Error::DeleteContent { .. } | Error::ListContent { .. })),
            ) => Some((
                "ContentDeletionFailed".into(),
                format!("Failed to delete all resource types, 1 remaining: {}", error_chain(e)),
            )),
            ("NamespaceContentRemaining", Ok(left)) if !left.resources.is_empty() => {
                let each: Vec<String> = left
                    .resources
                    .iter()
                    .map(|(resource, n)| format!("{resource} has {n} resource instances"))
                    .collect();
                Some((
                    "SomeResourcesRemain".into(),
                    format!("Some resources are remaining: {}", each.join(", ")),
                ))
            }
            ("NamespaceFinalizersRemaining", Ok(left)) if !left.finalizers.is_empty() => {
                let each: Vec<String> = left
                    .finalizers
                    .iter()
                    .map(|(finalizer, n)| format!("{finalizer} in {n} resource instances"))
                    .collect();
                Some((
                    "SomeFinalizersRemain".into(),
                    format!(
                        "Some content in the namespace has finalizers remaining: {}",
                        each.join(", ")
                    ),
                ))
            }
            _ => None,
        }
    };
    let mut out = current.to_vec();
    let mut changed = false;
    for (kind, ok_reason, ok_message) in CONDITIONS {
        let (status, reason, message) = match failing(kind) {
            Some((reason, message)) => ("True", reason, message),
            None => ("False", ok_reason.to_string(), ok_message.to_string()),
        };
        match out.iter_mut().find(|c| c.type_ == kind) {
            Some(c)
                if c.status == status
                    && c.reason.as_deref() == Some(reason.as_str())
                    && c.message.as_deref() == Some(message.as_str()) => {}
            Some(c) => {
                c.status = status.into();
                c.reason = Some(reason);
                c.message = Some(message);
                c.last_transition_time = Some(now.clone());
                changed = true;
            }
            None => {
                out.push(NamespaceCondition {
                    type_: kind.into(),
                    status: status.into(),
                    reason: Some(reason),
                    message: Some(message),
                    last_transition_time: Some(now.clone()),
                });
                changed = true;
            }
        }
    }
    changed.then_some(out)
}

fn error_chain(e: &Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

/// Write the deletion conditions of a pass to the namespace's status (what `kubectl describe
/// namespace` shows of a namespace stuck terminating).
async fn report(client: &Client, ns: &Namespace, outcome: &Result<Remaining>) -> Result<()> {
    let current = ns.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let Some(conditions) = conditions(current, outcome, &Time(Timestamp::now())) else {
        return Ok(());
    };
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"status": {"conditions": conditions}});
    match api.patch_status(&ns.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Status { namespace: ns.name_any(), source }),
    }
}

/// Delete everything in the namespace; returns what is still there.
pub async fn delete_content(client: &Client, namespace: &str) -> Result<Remaining> {
    let mut remaining = Remaining::default();
    for (ar, caps) in namespaced_resources(client).await? {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        let resource = ar.plural.clone();
        let list = match api.list_metadata(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 405 => continue,
            Err(source) => {
                return Err(Error::ListContent { namespace: namespace.into(), resource, source });
            }
        };
        if list.items.is_empty() {
            continue;
        }
        let dp = DeleteParams::background();
        if caps.supports_operation(verbs::DELETE_COLLECTION) {
            match api.delete_collection(&dp, &ListParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 405 => {}
                Err(source) => {
                    return Err(Error::DeleteContent {
                        namespace: namespace.into(),
                        resource,
                        source,
                    });
                }
            }
        } else {
            for o in &list.items {
                if o.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match api.delete(&o.name_any(), &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(source) => {
                        return Err(Error::DeleteContent {
                            namespace: namespace.into(),
                            resource,
                            source,
                        });
                    }
                }
            }
        }
        let left = api.list_metadata(&ListParams::default()).await.map_err(|source| {
            Error::ListContent { namespace: namespace.into(), resource: ar.plural.clone(), source }
        })?;
        if !left.items.is_empty() {
            remaining.resources.insert(format!("{}.{}", ar.plural, ar.group), left.items.len());
        }
        for finalizer in left.items.iter().flat_map(|o| o.finalizers()) {
            *remaining.finalizers.entry(finalizer.clone()).or_default() += 1;
        }
    }
    Ok(remaining)
}

async fn finalize(client: &Client, ns: &Namespace) -> Result<()> {
    let name = ns.name_any();
    let mut ns = ns.clone();
    if let Some(f) = ns.spec.as_mut().and_then(|s| s.finalizers.as_mut()) {
        f.retain(|f| f != FINALIZER);
    }
    let api: Api<Namespace> = Api::all(client.clone());
    match api.replace_subresource("finalize", &name, &PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Finalize { namespace: name, source }),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
    use serde_json::json;

    use super::*;
    use crate::context::ControllerConfig;
    use crate::testutil::{api, pod, report_running, wait_for};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespace_deletion_cascades_then_removes_the_namespace() {
        let (_api, client) = api().await;
        let ctx = Context::new(client.clone(), ControllerConfig::default());
        let ctl = tokio::spawn(run(ctx));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "doomed"}})).expect("ns");
        namespaces.create(&PostParams::default(), &ns).await.expect("create ns");
        let pp = PostParams::default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
        let mut running = pod("running", "x", Some("node-0"));
        running.metadata.namespace = Some("doomed".into());
        pods.create(&pp, &running).await.expect("pod");
        report_running(&client, "doomed", "running", "10.244.0.2").await;
        // node-0's agent, as far as this test needs it: it finishes graceful deletions.
        let agent = {
            let pods = pods.clone();
            tokio::spawn(async move {
                loop {
                    for p in pods.list(&ListParams::default()).await.expect("pods").items {
                        if p.metadata.deletion_timestamp.is_some() {
                            let now = DeleteParams::default().grace_period(0);
                            let _ = pods.delete(&p.name_any(), &now).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let mut pending = pod("pending", "x", None);
        pending.metadata.namespace = Some("doomed".into());
        pods.create(&pp, &pending).await.expect("pod");
        let svcs: Api<Service> = Api::namespaced(client.clone(), "doomed");
        let svc = serde_json::from_value(json!({"metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80}]}}))
        .expect("svc");
        svcs.create(&pp, &svc).await.expect("svc");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
        let cm = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}}))
            .expect("cm");
        cms.create(&pp, &cm).await.expect("cm");
        wait_for("pod running", || async {
            pods.get("running").await.expect("pod").status.and_then(|s| s.phase).as_deref()
                == Some("Running")
        })
        .await;

        namespaces.delete("doomed", &DeleteParams::default()).await.expect("delete ns");
        let terminating = namespaces.get("doomed").await.expect("ns still there");
        assert_eq!(terminating.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
        // An unrelated update while terminating does not drop the kubernetes finalizer.
        wait_for("namespace gone", || async {
            namespaces.get_opt("doomed").await.expect("get").is_none()
        })
        .await;
        assert!(pods.list(&ListParams::default()).await.expect("pods").items.is_empty());
        assert!(svcs.list(&ListParams::default()).await.expect("svcs").items.is_empty());
        assert!(cms.list(&ListParams::default()).await.expect("cms").items.is_empty());
        ctl.abort();
        agent.abort();
    }

    /// Content held by a finalizer keeps the namespace terminating, and its status says why
    /// in upstream's conditions; once released, the namespace goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_content_is_reported_in_the_namespace_conditions() {
        let (_api, client) = api().await;
        let ctx = Context::new(client.clone(), ControllerConfig::default());
        let ctl = tokio::spawn(run(ctx));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "held"}})).unwrap();
        namespaces.create(&PostParams::default(), &ns).await.expect("create ns");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "held");
        let cm = serde_json::from_value(
            json!({"metadata": {"name": "c", "finalizers": ["example.com/hold"]}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.expect("cm");
        namespaces.delete("held", &DeleteParams::default()).await.expect("delete ns");

        let condition =
            |ns: &Namespace, kind: &str| {
                let conditions = ns.status.as_ref().and_then(|s| s.conditions.clone());
                conditions.unwrap_or_default().into_iter().find(|c| c.type_ == kind).map(|c| {
                    (c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default())
                })
            };
        wait_for("conditions naming the held content", || async {
            let ns = namespaces.get("held").await.expect("ns");
            condition(&ns, "NamespaceFinalizersRemaining").is_some_and(|c| c.0 == "True")
        })
        .await;
        let ns = namespaces.get("held").await.expect("ns");
        let r = |s: &str| s.to_string();
        assert_eq!(
            condition(&ns, "NamespaceContentRemaining"),
            Some((
                r("True"),
                r("SomeResourcesRemain"),
                r("Some resources are remaining: configmaps. has 1 resource instances")
            ))
        );
        assert_eq!(
            condition(&ns, "NamespaceFinalizersRemaining"),
            Some((
                r("True"),
                r("SomeFinalizersRemain"),
                r(
                    "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
                )
            ))
        );
        assert_eq!(
            condition(&ns, "NamespaceDeletionDiscoveryFailure"),
            Some((
                r("False"),
                r("ResourcesDiscovered"),
                r("All resources successfully discovered")
            ))
        );
        let all = ns.status.and_then(|s| s.conditions).unwrap_or_default();
        assert_eq!(all.len(), 5, "{all:?}");

        let patch = json!({"metadata": {"finalizers": null}});
        cms.patch("c", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("release");
        wait_for("namespace gone", || async {
            namespaces.get_opt("held").await.expect("get").is_none()
        })
        .await;
        ctl.abort();
    }

    /// A pass that changes nothing writes nothing; a change moves only its condition's time.
    #[test]
    fn conditions_change_only_with_their_status_reason_or_message() {
        let earlier = Time(Timestamp::from_second(1_000).unwrap());
        let later = Time(Timestamp::from_second(2_000).unwrap());
        let left = |n: usize| {
            let mut r = Remaining::default();
            if n > 0 {
                r.resources.insert("pods.".into(), n);
            }
            Ok(r)
        };
        let first = conditions(&[], &left(2), &earlier).expect("all five are new");
        assert_eq!(first.len(), 5);
        assert!(conditions(&first, &left(2), &later).is_none());
        let second = conditions(&first, &left(1), &later).expect("the count changed");
        let time = |cs: &[NamespaceCondition], kind: &str| {
            cs.iter().find(|c| c.type_ == kind).and_then(|c| c.last_transition_time.clone())
        };
        assert_eq!(time(&second, "NamespaceContentRemaining"), Some(later));
        assert_eq!(time(&second, "NamespaceDeletionDiscoveryFailure"), Some(earlier));
    }

    #[tokio::test]
    async fn terminating_namespace_keeps_its_finalizer_until_finalize() {
        let (_api, client) = api().await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "t"}})).expect("ns");
        namespaces.create(&PostParams::default(), &ns).await.expect("create");
        namespaces.delete("t", &DeleteParams::default()).await.expect("delete");
        // A plain update (labels) neither removes spec.finalizers nor deletes the namespace.
        let mut cur = namespaces.get("t").await.expect("get");
        cur.labels_mut().insert("x".into(), "y".into());
        cur.spec.as_mut().expect("spec").finalizers = Some(vec![]);
        namespaces.replace("t", &PostParams::default(), &cur).await.expect("update");
        let cur = namespaces.get("t").await.expect("still there");
        assert_eq!(cur.spec.and_then(|s| s.finalizers), Some(vec!["kubernetes".to_string()]));
        // /finalize removes it and the namespace goes away.
        finalize(&client, &namespaces.get("t").await.expect("get")).await.expect("finalize");
        assert!(namespaces.get_opt("t").await.expect("get").is_none());
    }
}
