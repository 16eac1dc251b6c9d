//! The namespace controller: a Namespace being deleted (deletionTimestamp set, phase
//! Terminating, `spec.finalizers: [kubernetes]`) has all its namespaced content deleted —
//! every namespaced resource the API serves, found through discovery — and once nothing is
//! left its `kubernetes` finalizer is removed through `namespaces/finalize`, upon which the
//! apiserver deletes it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use super::Context;
use super::informer::{Change, informer, run_applier};

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
    let store =
        informer(Api::<Namespace>::all(ctx.client.clone()), watcher::Config::default(), tx, |c| {
            match c {
                Change::Applied(ns) if ns.metadata.deletion_timestamp.is_some() => {
                    vec![ObjectRef::from_obj(ns)]
                }
                _ => Vec::new(),
            }
        });
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
    let remaining = delete_content(&ctx.client, &name).await?;
    if remaining > 0 {
        tracing::debug!(namespace = %name, remaining, "namespace content still terminating");
        return Ok(Action::requeue(RECHECK));
    }
    finalize(&ctx.client, ns).await?;
    Ok(Action::await_change())
}

/// Delete everything in the namespace; returns how many objects are still there.
pub async fn delete_content(client: &Client, namespace: &str) -> Result<usize> {
    let mut remaining = 0;
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
        remaining += left.items.len();
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
    use crate::controllers::ControllerConfig;
    use crate::controllers::testutil::{api, pod, report_running, wait_for};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespace_deletion_cascades_then_removes_the_namespace() {
        let (_api, client) = api().await;
        let ctx = Arc::new(Context { client: client.clone(), config: ControllerConfig::default() });
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
