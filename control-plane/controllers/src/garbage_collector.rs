//! The garbage collector: a graph of ownerReferences over every served resource, built from
//! metadata-only watches (`as=PartialObjectMetadataList`), acting on it as upstream's:
//! - background: a dependent all of whose owners are gone (each absence confirmed by a live
//!   GET by uid) is deleted; owners that are gone are dropped from a dependent that keeps
//!   others;
//! - foreground: an owner with the `foregroundDeletion` finalizer has its dependents deleted
//!   and keeps the finalizer until those with `blockOwnerDeletion` are gone;
//! - orphan: an owner with the `orphan` finalizer has itself removed from its dependents'
//!   ownerReferences, then the finalizer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::core::PartialObjectMeta;
use kube::discovery::{ApiResource, Discovery, Scope, verbs};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::context::Context;

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";
/// Kinds left out of the graph: many, short-lived and never owners or dependents.
const IGNORED: &[(&str, &str)] = &[("", "events"), ("events.k8s.io", "events")];
const WORKERS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovering the served resources")]
    Discovery(#[source] kube::Error),
    #[error("deleting {object}")]
    Delete {
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("patching {object}")]
    Patch {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The owner's kind is not (yet) discovered: the dependent is looked at again later,
    /// never collected for it (upstream's collector retries unresolvable owners too).
    #[error("owner {kind} of {api_version} is not a served kind (yet)")]
    UnknownOwnerKind { api_version: String, kind: String },
    #[error("looking up owner {owner}")]
    GetOwner {
        owner: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
struct Item {
    res: usize,
    namespace: Option<String>,
    name: String,
    owners: Vec<OwnerReference>,
    finalizers: Vec<String>,
    deleting: bool,
    resource_version: Option<String>,
}

#[derive(Default)]
struct Graph {
    items: HashMap<String, Item>,
    /// owner uid → dependent uids.
    dependents: HashMap<String, HashSet<String>>,
}

struct Collector {
    client: Client,
    /// The watched resources (and whether namespaced), append-only: an `Item`'s `res`
    /// indexes it. Discovery is run again every [`REDISCOVER`], so custom resources of
    /// CRDs created later are collected too (upstream's GC resyncs its resources as well).
    resources: std::sync::RwLock<Vec<(ApiResource, bool)>>,
    graph: Mutex<Graph>,
    queue: mpsc::UnboundedSender<String>,
    queued: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often the served resources are discovered again.
const REDISCOVER: Duration = Duration::from_secs(10);

/// The resources the collector watches: every one that supports watch and delete.
async fn discover(client: &Client) -> Result<Vec<(ApiResource, bool)>> {
    let discovery = Discovery::new(client.clone()).run().await.map_err(Error::Discovery)?;
    Ok(discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .filter(|(ar, caps)| {
            caps.supports_operation(verbs::WATCH)
                && caps.supports_operation(verbs::DELETE)
                && !IGNORED.contains(&(ar.group.as_str(), ar.plural.as_str()))
        })
        .map(|(ar, caps)| (ar, caps.scope == Scope::Namespaced))
        .collect())
}

/// Run the garbage collector until dropped.
pub async fn run(ctx: Arc<Context>) -> Result<()> {
    let resources = discover(&ctx.client).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gc = Arc::new(Collector {
        client: ctx.client.clone(),
        resources: std::sync::RwLock::new(resources),
        graph: Mutex::new(Graph::default()),
        queue: tx,
        queued: Mutex::new(HashSet::new()),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for res in 0..gc.resource_count() {
        tasks.spawn(gc.clone().watch(res));
    }
    let rediscover = gc.clone();
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(REDISCOVER).await;
            rediscover.rediscover().await;
        }
    });
    let (work_tx, work_rx) = mpsc::unbounded_channel::<String>();
    tasks.spawn(async move {
        while let Some(uid) = rx.recv().await {
            if work_tx.send(uid).is_err() {
                return;
            }
        }
    });
    let worker = gc.clone();
    tasks.spawn(async move {
        tokio_stream::wrappers::UnboundedReceiverStream::new(work_rx)
            .for_each_concurrent(WORKERS, |uid| {
                let gc = worker.clone();
                async move {
                    lock(&gc.queued).remove(&uid);
                    if let Err(e) = gc.process(&uid).await {
                        // An owner of a kind not discovered yet: a CRD's, created moments
                        // ago, or one that never is; looked at again after a discovery.
                        let later = match e {
                            Error::UnknownOwnerKind { .. } => {
                                tracing::debug!(uid, error = %e, "garbage collector");
                                REDISCOVER
                            }
                            _ => {
                                tracing::warn!(uid, error = %e, "garbage collector");
                                Duration::from_secs(1)
                            }
                        };
                        let gc = gc.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(later).await;
                            gc.enqueue(&uid);
                        });
                    }
                }
            })
            .await;
    });
    while tasks.join_next().await.is_some() {}
    Ok(())
}

impl Collector {
    fn resource_count(&self) -> usize {
        self.resources.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn resource(&self, res: usize) -> (ApiResource, bool) {
        self.resources.read().unwrap_or_else(|e| e.into_inner())[res].clone()
    }

    /// Watches the resources served since the last discovery (a CRD's, say).
    async fn rediscover(self: &Arc<Self>) {
        let found = match discover(&self.client).await {
            Ok(f) => f,
            Err(e) => return tracing::debug!(error = %e, "garbage collector discovery"),
        };
        let mut added = Vec::new();
        {
            let mut resources = self.resources.write().unwrap_or_else(|e| e.into_inner());
            for (ar, namespaced) in found {
                let known =
                    resources.iter().any(|(k, _)| k.group == ar.group && k.plural == ar.plural);
                if !known {
                    tracing::info!(group = %ar.group, resource = %ar.plural, "garbage collector watches a new resource");
                    resources.push((ar, namespaced));
                    added.push(resources.len() - 1);
                }
            }
        }
        for res in added {
            tokio::spawn(self.clone().watch(res));
        }
    }

    fn enqueue(&self, uid: &str) {
        if lock(&self.queued).insert(uid.to_string()) {
            let _ = self.queue.send(uid.to_string());
        }
    }

    fn api(&self, res: usize, namespace: Option<&str>) -> Api<DynamicObject> {
        let (ar, _) = self.resource(res);
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn watch(self: Arc<Self>, res: usize) {
        // `Api<PartialObjectMeta<_>>` lists and watches with `as=PartialObjectMetadata`.
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(self.client.clone(), &self.resource(res).0);
        let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                    self.applied(res, &m)
                }
                Ok(watcher::Event::Delete(m)) => self.deleted(&m),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "garbage collector watch"),
            }
        }
    }

    fn applied(&self, res: usize, m: &PartialObjectMeta<DynamicObject>) {
        let Some(uid) = m.uid() else { return };
        let item = Item {
            res,
            namespace: m.namespace(),
            name: m.name_any(),
            owners: m.owner_references().to_vec(),
            finalizers: m.finalizers().to_vec(),
            deleting: m.metadata.deletion_timestamp.is_some(),
            resource_version: m.resource_version(),
        };
        let mut wake: Vec<String> = Vec::new();
        {
            let mut g = lock(&self.graph);
            if let Some(old) = g.items.get(&uid).cloned() {
                for o in &old.owners {
                    if let Some(d) = g.dependents.get_mut(&o.uid) {
                        d.remove(&uid);
                    }
                    wake.push(o.uid.clone());
                }
            }
            for o in &item.owners {
                g.dependents.entry(o.uid.clone()).or_default().insert(uid.clone());
                wake.push(o.uid.clone());
            }
            let interesting = !item.owners.is_empty()
                || (item.deleting
                    && item.finalizers.iter().any(|f| f == FOREGROUND || f == ORPHAN));
            g.items.insert(uid.clone(), item);
            if interesting {
                wake.push(uid);
            }
        }
        for u in wake {
            self.enqueue(&u);
        }
    }

    fn deleted(&self, m: &PartialObjectMeta<DynamicObject>) {
        let Some(uid) = m.uid() else { return };
        let mut wake = Vec::new();
        {
            let mut g = lock(&self.graph);
            if let Some(old) = g.items.remove(&uid) {
                for o in &old.owners {
                    if let Some(d) = g.dependents.get_mut(&o.uid) {
                        d.remove(&uid);
                    }
                    wake.push(o.uid.clone());
                }
            }
            wake.extend(g.dependents.get(&uid).into_iter().flatten().cloned());
        }
        for u in wake {
            self.enqueue(&u);
        }
    }

    fn describe(&self, item: &Item) -> String {
        let (ar, _) = self.resource(item.res);
        match &item.namespace {
            Some(ns) => format!("{} {ns}/{}", ar.plural, item.name),
            None => format!("{} {}", ar.plural, item.name),
        }
    }

    async fn process(&self, uid: &str) -> Result<()> {
        let (item, dependents) = {
            let g = lock(&self.graph);
            let Some(item) = g.items.get(uid).cloned() else { return Ok(()) };
            let deps: Vec<(String, Item)> = g
                .dependents
                .get(uid)
                .into_iter()
                .flatten()
                .filter_map(|d| g.items.get(d).map(|i| (d.clone(), i.clone())))
                .collect();
            (item, deps)
        };
        if item.deleting && item.finalizers.iter().any(|f| f == ORPHAN) {
            for (_, dep) in &dependents {
                let owners: Vec<&OwnerReference> =
                    dep.owners.iter().filter(|o| o.uid != uid).collect();
                self.patch_owners(dep, &owners).await?;
            }
            return self.remove_finalizer(&item, ORPHAN).await;
        }
        if item.deleting && item.finalizers.iter().any(|f| f == FOREGROUND) {
            let mut blocking = 0;
            for (dep_uid, dep) in &dependents {
                let blocks =
                    dep.owners.iter().any(|o| o.uid == uid && o.block_owner_deletion == Some(true));
                if blocks {
                    blocking += 1;
                }
                if !dep.deleting {
                    let has_own =
                        lock(&self.graph).dependents.get(dep_uid).is_some_and(|d| !d.is_empty());
                    let policy = if has_own {
                        PropagationPolicy::Foreground
                    } else {
                        PropagationPolicy::Background
                    };
                    self.delete(dep, dep_uid, policy).await?;
                }
            }
            if blocking == 0 {
                return self.remove_finalizer(&item, FOREGROUND).await;
            }
            return Ok(());
        }
        if item.deleting || item.owners.is_empty() {
            return Ok(());
        }
        let mut present = Vec::new();
        let mut absent = Vec::new();
        for o in &item.owners {
            if self.owner_exists(&item, o).await? {
                present.push(o);
            } else {
                absent.push(o);
            }
        }
        if present.is_empty() {
            tracing::debug!(object = %self.describe(&item), "deleting: all owners gone");
            return self.delete(&item, uid, PropagationPolicy::Background).await;
        }
        if !absent.is_empty() {
            self.patch_owners(&item, &present).await?;
        }
        Ok(())
    }

    /// The graph first; an owner the graph does not know is confirmed with a live GET by
    /// uid (the graph may lag behind a new owner).
    async fn owner_exists(&self, item: &Item, o: &OwnerReference) -> Result<bool> {
        if lock(&self.graph).items.contains_key(&o.uid) {
            return Ok(true);
        }
        let found = self
            .resources
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .position(|(ar, _)| ar.api_version == o.api_version && ar.kind == o.kind);
        let Some(res) = found else {
            // A kind not discovered (yet): its objects may exist, so the dependent stays
            // and is retried; the next discovery may bring the kind.
            return Err(Error::UnknownOwnerKind {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
            });
        };
        let ns = if self.resource(res).1 { item.namespace.as_deref() } else { None };
        match self.api(res, ns).get_metadata_opt(&o.name).await {
            Ok(Some(m)) => Ok(m.uid().as_deref() == Some(o.uid.as_str())),
            Ok(None) => Ok(false),
            Err(source) => Err(Error::GetOwner { owner: format!("{} {}", o.kind, o.name), source }),
        }
    }

    async fn delete(&self, item: &Item, uid: &str, policy: PropagationPolicy) -> Result<()> {
        let dp = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api(item.res, item.namespace.as_deref()).delete(&item.name, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(source) => Err(Error::Delete { object: self.describe(item), source }),
        }
    }

    async fn patch_owners(&self, item: &Item, owners: &[&OwnerReference]) -> Result<()> {
        let patch = json!({"metadata": {"ownerReferences": owners}});
        self.patch(item, &patch).await
    }

    async fn remove_finalizer(&self, item: &Item, finalizer: &str) -> Result<()> {
        let left: Vec<&String> = item.finalizers.iter().filter(|f| *f != finalizer).collect();
        // With the resourceVersion seen: a finalizer added meanwhile is not lost (409 → retry).
        let patch =
            json!({"metadata": {"finalizers": left, "resourceVersion": item.resource_version}});
        self.patch(item, &patch).await
    }

    async fn patch(&self, item: &Item, patch: &serde_json::Value) -> Result<()> {
        let api = self.api(item.res, item.namespace.as_deref());
        match api.patch(&item.name, &PatchParams::default(), &Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(Error::Patch { object: self.describe(item), source }),
        }
    }
}

#[cfg(test)]
mod tests;
