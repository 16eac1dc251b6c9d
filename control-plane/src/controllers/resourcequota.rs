//! The resource quota controller (upstream's `pkg/controller/resourcequota`): each
//! ResourceQuota's `status.hard` is its `spec.hard`, and `status.used` what the objects of
//! its namespace charge now (counted by `machinery::quota`, as the apiserver's quota
//! admission charges them). The apiserver adds each create to `used` as it admits it; this
//! controller gives back what deletions, terminal pods and failed creates no longer hold.
//! Quotas are recounted when their namespace's pods, Services, ConfigMaps, Secrets, claims
//! or ReplicationControllers change, and every five minutes (for `count/<resource>` of the
//! other kinds, every 30 seconds).

use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::Value;

use super::Context;
use super::informer::{WorkloadCtx as Ctx, run_controller};
use super::pods;
use crate::apiserver::registry::Registry;
use crate::machinery::admission::quantity::Quantity;
use crate::machinery::quota::{self, Usage};

/// Upstream's full resync period of quotas.
const RESYNC: Duration = Duration::from_secs(300);
/// The recount of quotas that count kinds this controller does not watch.
const UNWATCHED_RESYNC: Duration = Duration::from_secs(30);

/// The kinds whose changes recount their namespace's quotas at once.
const WATCHED: [&str; 6] = [
    "pods",
    "services",
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "replicationcontrollers",
];

static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

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

/// Run the resource quota controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller =
        Controller::new(Api::<ResourceQuota>::all(client.clone()), watcher::Config::default());
    let store = controller.store();
    let cfg = watcher::Config::default;
    let controller = controller
        .watches(Api::<Pod>::all(client.clone()), cfg(), in_namespace(&store))
        .watches(Api::<Service>::all(client.clone()), cfg(), in_namespace(&store))
        .watches(Api::<ConfigMap>::all(client.clone()), cfg(), in_namespace(&store))
        .watches(Api::<Secret>::all(client.clone()), cfg(), in_namespace(&store))
        .watches(Api::<PersistentVolumeClaim>::all(client.clone()), cfg(), in_namespace(&store))
        .watches(Api::<ReplicationController>::all(client.clone()), cfg(), in_namespace(&store));
    run_controller(controller, Ctx::new(client, "resourcequota-controller"), reconcile).await;
}

/// Map an object to every quota of its namespace.
fn in_namespace<K: kube::Resource>(
    store: &Store<ResourceQuota>,
) -> impl Fn(K) -> Vec<ObjectRef<ResourceQuota>> + Send + Sync + 'static {
    let store = store.clone();
    move |obj: K| {
        let ns = obj.namespace();
        store
            .state()
            .iter()
            .filter(|q| q.namespace() == ns)
            .map(|q| ObjectRef::from_obj(q.as_ref()))
            .collect()
    }
}

async fn reconcile(rq: Arc<ResourceQuota>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = rq.namespace().unwrap_or_default();
    let name = rq.name_any();
    let spec = serde_json::to_value(rq.spec.clone().unwrap_or_default()).unwrap_or_default();
    let hard = quota::parse_usage(spec.get("hard"));
    let mut used: Usage = hard.keys().map(|k| (k.clone(), Quantity::ZERO)).collect();
    let kinds: BTreeSet<(&str, &str)> = hard.keys().filter_map(|k| quota::counted_by(k)).collect();
    let now = pods::now().to_string();
    for (group, resource) in &kinds {
        for obj in list(&ctx.client, &ns, group, resource).await? {
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
    let current = serde_json::to_value(&rq.status).unwrap_or_default();
    if current != status {
        let mut next = rq.as_ref().clone();
        next.status = serde_json::from_value(status).ok();
        let api: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), &ns);
        api.replace_status(&name, &PostParams::default(), &next).await.map_err(|source| {
            Error::Status { namespace: ns.clone(), name: name.clone(), source }
        })?;
    }
    let unwatched = kinds.iter().any(|(g, r)| !g.is_empty() || !WATCHED.contains(r));
    Ok(Action::requeue(if unwatched { UNWATCHED_RESYNC } else { RESYNC }))
}

/// The objects of `group`/`resource` in `ns`, as JSON; none for a resource not served.
async fn list(
    client: &kube::Client,
    ns: &str,
    group: &str,
    resource: &str,
) -> Result<Vec<Value>, Error> {
    let Some(rt) = REGISTRY.all().iter().find(|t| t.group() == group && t.plural() == resource)
    else {
        return Ok(Vec::new());
    };
    if !rt.desc.namespaced {
        return Ok(Vec::new());
    }
    let ar = ApiResource {
        group: group.to_string(),
        version: rt.desc.version.to_string(),
        api_version: rt.desc.api_version(),
        kind: rt.kind().to_string(),
        plural: resource.to_string(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let list = api.list(&ListParams::default()).await.map_err(|source| Error::List {
        resource: rt.qualified(),
        namespace: ns.to_string(),
        source,
    })?;
    Ok(list.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
}
