//! Pod sync: each pod bound to this node has a level-triggered worker driving it over a
//! runtime (not a typed state machine: each pass observes and takes the next steps).
//!
//! [`PodSync`] watches the pods with `spec.nodeName=<node>` (kube-runtime's watcher and
//! reflector), admits new pods against the node's allocatable ([`admit`]), and feeds each
//! pod UID's latest object to its own worker task ([`worker`]). A worker is level-triggered:
//! every pass observes the runtime (sandboxes and containers found by the pod-uid label),
//! takes the steps that move it towards the spec ([`sync`]: sandbox, images, init containers in order,
//! containers, probes, restarts with back-off; [`termination`] once deletion started) and
//! writes the status only when it changed ([`status`]). Workers read the runtime through a
//! node-wide cache ([`relist`], the kubelet's PLEG: two list calls per `pod_relist` for the
//! whole node) and wake on a new object, on their own timers (probes, back-off), when the
//! relist sees their pod change, and at least every `pod_relist`.
//! After the first complete list, sandboxes whose pod no longer exists are removed
//! ([`adopt`]); running ones of known pods are simply observed again, never restarted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{reflector, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::admit::Allocatable;
pub use self::context::{PodContext, is_terminal, key};
pub use self::error::{Error, Result};
use crate::runtime::Runtime;

pub mod admit;
pub mod adopt;
pub mod backoff;
pub mod containers;
mod context;
mod error;
pub mod events;
pub mod images;
pub mod probes;
pub mod relist;
pub mod sandbox;
pub mod state;
pub mod static_pods;
pub mod status;
pub mod sync;
pub mod termination;
pub mod volumes;
pub mod worker;

/// Whether `new` differs from `old` only in what a status write changes: the status, the
/// resourceVersion and the managed fields. Compared in place (every pod update of the node
/// asks); the destructuring names every member, so a new one cannot be left out silently.
fn same_but_status(old: &Pod, new: &Pod) -> bool {
    let ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields: _,
        name,
        namespace,
        owner_references,
        resource_version: _,
        self_link,
        uid,
    } = &old.metadata;
    let n = &new.metadata;
    old.spec == new.spec
        && *annotations == n.annotations
        && *creation_timestamp == n.creation_timestamp
        && *deletion_grace_period_seconds == n.deletion_grace_period_seconds
        && *deletion_timestamp == n.deletion_timestamp
        && *finalizers == n.finalizers
        && *generate_name == n.generate_name
        && *generation == n.generation
        && *labels == n.labels
        && *name == n.name
        && *namespace == n.namespace
        && *owner_references == n.owner_references
        && *self_link == n.self_link
        && *uid == n.uid
}

/// A pod this node already acknowledged (status written by an agent): not admitted again.
fn acknowledged(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.host_ip.is_some() || s.start_time.is_some())
}

struct Worker {
    tx: watch::Sender<Option<Arc<Pod>>>,
    task: JoinHandle<()>,
}

/// The pod sync of one node.
pub struct PodSync<R> {
    ctx: Arc<PodContext<R>>,
    allocatable: Allocatable,
}

impl<R: Runtime + Clone> PodSync<R> {
    pub fn new(ctx: Arc<PodContext<R>>, allocatable: Allocatable) -> Self {
        PodSync { ctx, allocatable }
    }

    /// Watches this node's pods and runs them until the watch ends.
    pub async fn run(self) -> Result<()> {
        let node = self.ctx.config.node_name.clone();
        let api: Api<Pod> = Api::all(self.ctx.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (reader, writer) = reflector::store();
        let mut stream = reflector(writer, watcher(api, cfg)).boxed();
        let mut guard = Workers::default();
        guard.1 = Some(tokio::spawn(relist_loop(self.ctx.clone())));
        let workers = &mut guard.0;
        let mut rejected: HashSet<String> = HashSet::new();
        let mut adopted = false;
        loop {
            let Some(event) = stream.next().await else { return Err(Error::WatchEnded) };
            workers.retain(|_, w| !w.task.is_finished());
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    self.dispatch(workers, &mut rejected, pod).await;
                }
                Ok(watcher::Event::Delete(pod)) => {
                    let uid = pod.uid().unwrap_or_default();
                    rejected.remove(&uid);
                    match workers.get(&uid) {
                        Some(w) => {
                            w.tx.send_replace(None);
                        }
                        None => {
                            let ctx = self.ctx.clone();
                            tokio::spawn(
                                async move { termination::remove_pod(&ctx, &uid, 0).await },
                            );
                        }
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    let live: HashSet<String> =
                        reader.state().iter().filter_map(|p| p.uid()).collect();
                    for (uid, w) in workers.iter() {
                        if !live.contains(uid) {
                            w.tx.send_replace(None);
                        }
                    }
                    if !adopted {
                        adopted = true;
                        if let Err(e) = adopt::remove_orphans(&self.ctx, &live).await {
                            tracing::warn!(error = %e, "removing orphaned sandboxes");
                        }
                    }
                }
                Ok(watcher::Event::Init) => {}
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "pod watch");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    async fn dispatch(
        &self,
        workers: &mut HashMap<String, Worker>,
        rejected: &mut HashSet<String>,
        pod: Pod,
    ) {
        let Some(uid) = pod.uid() else { return };
        if let Some(w) = workers.get(&uid) {
            // The worker always reads the latest object, but only a change it acts on wakes it:
            // not the status it just wrote coming back (the kubelet's pod config, likewise,
            // does not sync a pod on a status-only update). Otherwise every status write
            // bought an immediate second pass, which replaced a just-written ErrImagePull
            // with ImagePullBackOff before anyone could read it.
            let pod = Arc::new(pod);
            w.tx.send_if_modified(|current| {
                let wake = current.as_deref().is_none_or(|old| !same_but_status(old, &pod));
                *current = Some(pod);
                wake
            });
            return;
        }
        if rejected.contains(&uid) {
            return;
        }
        if !acknowledged(&pod) && pod.metadata.deletion_timestamp.is_none() && !is_terminal(&pod) {
            let others: Vec<Arc<Pod>> = workers
                .values()
                .filter_map(|w| w.tx.borrow().clone())
                .filter(|p| !is_terminal(p) && p.metadata.deletion_timestamp.is_none())
                .collect();
            if let Err(r) = admit::admit(&pod, others.iter().map(|p| p.as_ref()), &self.allocatable)
            {
                tracing::info!(pod = %key(&pod), reason = %r.reason, "pod rejected");
                rejected.insert(uid);
                self.ctx.events.warning(&pod, &r.reason, r.message.clone());
                let st = status::rejected(&pod, &r.reason, &r.message, &self.ctx.host_ip);
                if let Err(e) = self.ctx.write_status(&pod, &st).await {
                    tracing::warn!(pod = %key(&pod), error = %e, "writing the rejection");
                }
                return;
            }
        }
        let (tx, rx) = watch::channel(Some(Arc::new(pod)));
        let task = tokio::spawn(worker::worker(self.ctx.clone(), uid.clone(), rx));
        workers.insert(uid, Worker { tx, task });
    }
}

/// The workers and the relist task; aborted when the sync loop ends (their pods stay
/// running in the runtime; a new agent adopts them).
/// Relists every `pod_relist` (the task is aborted with the pod sync).
async fn relist_loop<R: Runtime>(ctx: Arc<PodContext<R>>) {
    if !ctx.cache.enabled() {
        return;
    }
    let every = ctx.config.pod_relist.max(std::time::Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = ctx.cache.relist(&ctx.runtime).await {
            tracing::warn!(error = %e, "relisting the runtime");
        }
    }
}

#[derive(Default)]
struct Workers(HashMap<String, Worker>, Option<JoinHandle<()>>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in self.0.values() {
            w.task.abort();
        }
        if let Some(t) = &self.1 {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use super::*;

    #[test]
    fn only_status_writes_leave_a_worker_asleep() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: Some("n".into()), ..Default::default() }),
            status: None,
        };
        let mut written = pod.clone();
        written.metadata.resource_version = Some("2".into());
        written.status = Some(PodStatus { phase: Some("Pending".into()), ..Default::default() });
        written.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("skiff-agent".into()),
            subresource: Some("status".into()),
            ..Default::default()
        }]);
        assert!(same_but_status(&pod, &written));

        let mut deleted = written.clone();
        deleted.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(!same_but_status(&written, &deleted), "a deletion wakes the worker");
        let mut relabelled = written.clone();
        relabelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(!same_but_status(&written, &relabelled), "a metadata change wakes it");
        let mut respec = written.clone();
        respec.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
        assert!(!same_but_status(&written, &respec), "a spec change wakes it");
    }
}
