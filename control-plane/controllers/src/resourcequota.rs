//! The resource quota controller (upstream's `pkg/controller/resourcequota`): each
//! ResourceQuota's `status.hard` is its `spec.hard`, and `status.used` what the objects of
//! its namespace charge (counted by `machinery::quota`, as the apiserver's quota admission
//! charges them). The apiserver adds each create to `used` as it admits it; this controller
//! gives back what is no longer held. As upstream, a quota is recounted:
//! - when it is new or its `spec.hard` changed (its own status writes do not count: a
//!   recount then could drop charges of creates admitted but not yet stored);
//! - when an object of a kind it may count leaves its namespace, or a pod there turns
//!   terminal or starts terminating (replenishment);
//! - every five minutes, and on start.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::mpsc;

use super::pods;
use crate::context::Context;
use skiff_core::informers::{Informer, Kind};
use skiff_core::quantity::Quantity;
use skiff_core::quota::{self, Usage};

/// Upstream's full resync period of quotas.
const RESYNC: Duration = Duration::from_secs(300);
/// How long a failed recount waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing {resource} in namespace {namespace}")]
    List {
        resource: String,
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the status of resourcequota {namespace}/{name}")]
    Status {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// What to recount: one quota, or every quota of a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Work {
    Quota { namespace: String, name: String },
    Namespace(String),
}

/// Run the resource quota controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<Work>();
    let shared = ctx.informers.all::<ResourceQuota>();
    let store = shared.ready_store().await;
    let mut tasks = tokio::task::JoinSet::new();
    let quotas = shared.subscribe();
    let to = tx.clone();
    tasks.spawn(quotas.for_each(move |event| {
        // Listed (start, re-list) or with a spec its status does not reflect yet.
        let work = match event {
            Ok(watcher::Event::InitApply(q)) => Some(q),
            Ok(watcher::Event::Apply(q)) if !reflects_spec(&q) => Some(q),
            _ => None,
        };
        if let Some(q) = work {
            let _ = to.send(Work::Quota {
                namespace: q.namespace().unwrap_or_default(),
                name: q.name_any(),
            });
        }
        futures::future::ready(())
    }));
    tasks.spawn(replenish(ctx.informers.all::<Pod>(), tx.clone(), pod_released));
    tasks.spawn(replenish(ctx.informers.all::<Service>(), tx.clone(), |_| false));
    tasks.spawn(replenish(ctx.informers.all::<ConfigMap>(), tx.clone(), |_| false));
    tasks.spawn(replenish(ctx.informers.all::<Secret>(), tx.clone(), |_| false));
    tasks.spawn(replenish(ctx.informers.all::<PersistentVolumeClaim>(), tx.clone(), |_| false));
    tasks.spawn(replenish(ctx.informers.all::<ReplicationController>(), tx.clone(), |_| false));
    let resync = (store.clone(), tx.clone());
    tasks.spawn(async move {
        let (store, tx) = resync;
        let mut tick = tokio::time::interval(RESYNC);
        tick.tick().await;
        loop {
            tick.tick().await;
            for q in store.state() {
                let _ = tx.send(Work::Quota {
                    namespace: q.namespace().unwrap_or_default(),
                    name: q.name_any(),
                });
            }
        }
    });
    let served = Served::default();
    while let Some(first) = rx.recv().await {
        // Everything queued meanwhile, once each.
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let mut seen = HashSet::new();
        for work in batch {
            for rq in quotas_of(&store, &work) {
                let key = (rq.namespace().unwrap_or_default(), rq.name_any());
                if !seen.insert(key.clone()) {
                    continue;
                }
                if let Err(error) = recount(&client, &served, &rq).await {
                    tracing::warn!(quota = %format!("{}/{}", key.0, key.1), error = %error, "recounting quota failed");
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY).await;
                        let _ = tx.send(Work::Quota { namespace: key.0, name: key.1 });
                    });
                }
            }
        }
    }
}

/// Whether a quota's status already shows its spec's hard limits.
fn reflects_spec(rq: &ResourceQuota) -> bool {
    let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
    let status = rq.status.as_ref().and_then(|s| s.hard.as_ref());
    spec.filter(|h| !h.is_empty()) == status.filter(|h| !h.is_empty())
        && rq.status.as_ref().is_some_and(|s| s.used.is_some() || spec.is_none_or(|h| h.is_empty()))
}

/// A pod that stops charging its quota without being deleted yet: terminal or terminating.
fn pod_released(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Queue the namespace of every deleted object of kind `K` (and of those `released` says
/// stopped charging) for a recount.
async fn replenish<K: Kind>(
    shared: Arc<Informer<K>>,
    tx: mpsc::UnboundedSender<Work>,
    released: fn(&K) -> bool,
) {
    shared
        .subscribe()
        .for_each(|event| {
            let ns = match &event {
                Ok(watcher::Event::Delete(o)) => o.namespace(),
                Ok(watcher::Event::Apply(o)) if released(o) => o.namespace(),
                _ => None,
            };
            if let Some(ns) = ns {
                let _ = tx.send(Work::Namespace(ns));
            }
            futures::future::ready(())
        })
        .await;
}

fn quotas_of(store: &Store<ResourceQuota>, work: &Work) -> Vec<Arc<ResourceQuota>> {
    store
        .state()
        .into_iter()
        .filter(|q| match work {
            Work::Quota { namespace, name } => {
                q.namespace().as_deref() == Some(namespace.as_str()) && &q.name_any() == name
            }
            Work::Namespace(ns) => q.namespace().as_deref() == Some(ns.as_str()),
        })
        .collect()
}

/// Count what the quota's namespace holds and write it as the quota's status.
async fn recount(client: &kube::Client, served: &Served, rq: &ResourceQuota) -> Result<(), Error> {
    let ns = rq.namespace().unwrap_or_default();
    let name = rq.name_any();
    let spec = serde_json::to_value(rq.spec.clone().unwrap_or_default()).unwrap_or_default();
    let hard = quota::parse_usage(spec.get("hard"));
    let mut used: Usage = hard.keys().map(|k| (k.clone(), Quantity::ZERO)).collect();
    let kinds: BTreeSet<(&str, &str)> = hard.keys().filter_map(|k| quota::counted_by(k)).collect();
    let now = pods::now().to_string();
    for (group, resource) in &kinds {
        for obj in list(client, served, &ns, group, resource).await? {
            if !quota::scopes_match(&spec, group, resource, &obj) {
                continue;
            }
            for (k, v) in quota::usage(group, resource, &obj, &now) {
                if let Some(total) = used.get_mut(&k) {
                    *total = total.saturating_add(v);
                }
            }
        }
    }
    let status = serde_json::json!({
        "hard": spec.get("hard").cloned().unwrap_or_else(|| serde_json::json!({})),
        "used": quota::usage_value(&used),
    });
    if serde_json::to_value(&rq.status).unwrap_or_default() == status {
        return Ok(());
    }
    let mut next = rq.clone();
    next.status = serde_json::from_value(status).ok();
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    api.replace_status(&name, &PostParams::default(), &next)
        .await
        .map_err(|source| Error::Status { namespace: ns.clone(), name: name.clone(), source })?;
    Ok(())
}

/// The namespaced resources the apiserver serves, by (group, plural), as discovery found
/// them; a resource not found yet is looked up again (a CRD may have come since).
#[derive(Default)]
struct Served(Mutex<HashMap<(String, String), ApiResource>>);

impl Served {
    async fn find(&self, client: &kube::Client, group: &str, plural: &str) -> Option<ApiResource> {
        let key = (group.to_string(), plural.to_string());
        if let Some(ar) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Some(ar.clone());
        }
        let found = kube::discovery::oneshot::group(client, group).await.ok()?;
        let (ar, caps) =
            found.recommended_resources().into_iter().find(|(ar, _)| ar.plural == plural)?;
        if caps.scope != kube::discovery::Scope::Namespaced {
            return None;
        }
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key, ar.clone());
        Some(ar)
    }
}

/// The objects of `group`/`resource` in `ns`, as JSON; none for a resource not served (or
/// not namespaced).
async fn list(
    client: &kube::Client,
    served: &Served,
    ns: &str,
    group: &str,
    resource: &str,
) -> Result<Vec<Value>, Error> {
    let Some(ar) = served.find(client, group, resource).await else {
        return Ok(Vec::new());
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let list = api.list(&ListParams::default()).await.map_err(|source| Error::List {
        resource: if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        },
        namespace: ns.to_string(),
        source,
    })?;
    Ok(list.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(v: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(v).unwrap()
    }

    /// Only a quota whose status does not show its spec yet is recounted on its own
    /// change: the charges admission writes into `used` trigger nothing.
    #[test]
    fn a_quota_is_recounted_on_its_own_change_only_when_its_spec_is_new() {
        let fresh = quota(serde_json::json!({"spec": {"hard": {"pods": "2"}}}));
        assert!(!reflects_spec(&fresh));
        let charged = quota(serde_json::json!({"spec": {"hard": {"pods": "2"}},
            "status": {"hard": {"pods": "2"}, "used": {"pods": "1"}}}));
        assert!(reflects_spec(&charged));
        let raised = quota(serde_json::json!({"spec": {"hard": {"pods": "3"}},
            "status": {"hard": {"pods": "2"}, "used": {"pods": "1"}}}));
        assert!(!reflects_spec(&raised));
        let terminal: Pod =
            serde_json::from_value(serde_json::json!({"status": {"phase": "Failed"}})).unwrap();
        assert!(pod_released(&terminal));
        assert!(!pod_released(&Pod::default()));
    }
}
