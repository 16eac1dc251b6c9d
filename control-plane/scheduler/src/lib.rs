//! The scheduler: pods without a node → filter → score → bind through pods/binding, over a
//! kube-rs `Client` (in memory inside skiff-server). Watches keep a [`cache::Cache`] of
//! nodes and assigned pods and a [`queue::SchedulingQueue`] of pending pods; one loop takes
//! the next pod, filters nodes (round-robin, stopping after upstream's
//! `percentageOfNodesToScore` feasible ones), scores them, assumes the pod on the best node
//! and binds it concurrently (bounded). Pods that fit nowhere may preempt lower-priority
//! pods, get `PodScheduled=False` and a `FailedScheduling` event, and wait for a cluster
//! event in the queue.
//!
//! It depends on kube-rs and the core crate only: it sees the apiserver through the API,
//! never by calling its modules.

pub mod cache;
pub mod filters;
pub mod preemption;
pub mod queue;
pub mod resources;
pub mod scores;
pub mod volumes;
mod watched;

use std::collections::{HashMap, HashSet};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info_span, warn};

use cache::{Cache, PodInfo, PodKey};
use filters::{PodState, Reason, filter, fit_error_message};
use queue::SchedulingQueue;
use resources::Resources;
use skiff_core::events::{EventRecorder, EventType, WriteOptions};
use volumes::VolumeCache;
use watched::WatchedPod;

/// Scheduler settings; defaults match kube-scheduler's.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Pods whose spec.schedulerName is this are ours (upstream "default-scheduler").
    pub scheduler_name: String,
    /// Initial and maximum backoff of unschedulable pods (upstream 1 s and 10 s).
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Bindings in flight at once (upstream binds asynchronously, one goroutine per pod,
    /// with no bound but the client's rate limit). Default 256: the apiserver's group commit
    /// then takes about four times as many bindings per fsync as the 64 it used to, and its
    /// request handling overlaps the previous batch's commit (about +18% pods/s in
    /// `cargo xtask bench scheduler`; 1,024 gained nothing more).
    pub parallel_binds: usize,
    /// How long a pod's binding waits for its claims to be provisioned and bound
    /// (upstream VolumeBinding's `bindTimeoutSeconds`, 600 s) before the pod goes back to
    /// the queue.
    pub bind_timeout: Duration,
    /// `percentageOfNodesToScore`; 0 means upstream's adaptive default (50 % minus 1 % per
    /// 125 nodes, at least 5 %, at least 100 nodes).
    pub percentage_of_nodes_to_score: u32,
    /// Record a `Scheduled` Event per bound pod (upstream does; one more API write per pod).
    pub scheduled_events: bool,
    /// How the scheduler's events are written. Default: one write at a time (client-go's
    /// sink writes sequentially too), so during a burst the bindings keep nearly all of
    /// the apiserver and the Scheduled events follow; up to 100,000 wait (client-go keeps
    /// 1,000 and drops the rest).
    pub events: WriteOptions,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: "default-scheduler".into(),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            parallel_binds: 256,
            bind_timeout: Duration::from_secs(600),
            percentage_of_nodes_to_score: 0,
            scheduled_events: true,
            events: WriteOptions { writers: 1, queue_len: 100_000 },
        }
    }
}

/// Failures of the scheduler's API calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding pod {pod} to node {node}")]
    Bind {
        pod: String,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the status of pod {pod}")]
    Status {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("selecting the node of claim {claim}")]
    SelectNode {
        claim: String,
        #[source]
        source: kube::Error,
    },
    /// Upstream's PreBind failure: a claim the pod waited on was lost or never bound.
    #[error("running PreBind plugin \"VolumeBinding\": binding volumes: {0}")]
    VolumeBinding(String),
    /// The pod was deleted while its binding waited.
    #[error("pod {0} was deleted")]
    Deleted(String),
    #[error("evicting pod {pod}")]
    Evict {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

struct State {
    cache: Cache,
    volumes: VolumeCache,
    queue: SchedulingQueue,
    /// Preemptors and the node freed for them: (node, requests, priority).
    nominations: HashMap<PodKey, (String, Resources, i32)>,
    /// The PodScheduled=False message (and nominated node) last written per pending pod:
    /// the status is written again only when it changes.
    reported: HashMap<PodKey, (String, Option<String>)>,
    next_start: usize,
    rng: u64,
    nodes_synced: bool,
    pods_synced: bool,
}

struct Shared {
    client: Client,
    config: SchedulerConfig,
    state: Mutex<State>,
    wake: Notify,
    /// Claims changed or a pod went away: what a binding waiting on claims looks at.
    prebind: Notify,
    binds: Arc<Semaphore>,
    recorder: EventRecorder,
}

impl State {
    /// The pod is no longer pending here (bound, deleted, not ours).
    fn forget(&mut self, key: &str) {
        self.queue.remove(key);
        self.nominations.remove(key);
        self.reported.remove(key);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough data: keep scheduling.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Aborts the watch tasks when the scheduler future is dropped (e.g. leadership lost).
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Run the scheduler until the future is dropped.
pub async fn run(client: Client, config: SchedulerConfig) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9)
        | 1;
    let shared = Arc::new(Shared {
        recorder: EventRecorder::with_options(
            client.clone(),
            config.scheduler_name.clone(),
            config.events,
        ),
        binds: Arc::new(Semaphore::new(config.parallel_binds.max(1))),
        state: Mutex::new(State {
            cache: Cache::default(),
            volumes: VolumeCache::default(),
            queue: SchedulingQueue::new(config.initial_backoff, config.max_backoff),
            nominations: HashMap::new(),
            reported: HashMap::new(),
            next_start: 0,
            rng: seed,
            nodes_synced: false,
            pods_synced: false,
        }),
        wake: Notify::new(),
        prebind: Notify::new(),
        client,
        config,
    });
    let _watches = AbortOnDrop(vec![
        tokio::spawn(watch_nodes(shared.clone())),
        tokio::spawn(watch_pods(shared.clone())),
        tokio::spawn(watch_volume_objects::<PersistentVolumeClaim>(shared.clone())),
        tokio::spawn(watch_volume_objects::<PersistentVolume>(shared.clone())),
        tokio::spawn(watch_volume_objects::<StorageClass>(shared.clone())),
    ]);
    schedule_loop(shared).await;
}

async fn watch_nodes(shared: Arc<Shared>) {
    let api: Api<Node> = Api::all(shared.client.clone());
    let mut stream = pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listed = HashSet::new();
    while let Some(event) = stream.next().await {
        let mut state = shared.lock();
        let moved = match event {
            Ok(watcher::Event::Apply(node)) => state.cache.upsert_node(node),
            Ok(watcher::Event::InitApply(node)) => {
                listed.insert(node.name_any());
                state.cache.upsert_node(node);
                false
            }
            Ok(watcher::Event::Delete(node)) => {
                state.cache.remove_node(&node.name_any());
                false
            }
            Ok(watcher::Event::Init) => {
                listed.clear();
                false
            }
            Ok(watcher::Event::InitDone) => {
                for name in state.cache.node_names() {
                    if !listed.contains(&name) {
                        state.cache.remove_node(&name);
                    }
                }
                state.nodes_synced = true;
                true
            }
            Err(e) => {
                warn!(error = %e, "scheduler node watch");
                false
            }
        };
        if moved {
            state.queue.move_all_unschedulable();
            drop(state);
            shared.wake.notify_one();
        }
    }
}

/// A claim or a volume, as the [`VolumeCache`] keeps it.
trait VolumeObject:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    fn upsert(&self, cache: &mut VolumeCache);
    fn remove(&self, cache: &mut VolumeCache);
    fn retain(cache: &mut VolumeCache, listed: &HashSet<String>);
    fn key(&self) -> String;
}

impl VolumeObject for PersistentVolumeClaim {
    fn upsert(&self, cache: &mut VolumeCache) {
        cache.upsert_claim(self);
    }
    fn remove(&self, cache: &mut VolumeCache) {
        cache.remove_claim(self);
    }
    fn retain(cache: &mut VolumeCache, listed: &HashSet<String>) {
        cache.retain_claims(|k| listed.contains(k));
    }
    fn key(&self) -> String {
        format!("{}/{}", self.namespace().unwrap_or_default(), self.name_any())
    }
}

impl VolumeObject for PersistentVolume {
    fn upsert(&self, cache: &mut VolumeCache) {
        cache.upsert_volume(self);
    }
    fn remove(&self, cache: &mut VolumeCache) {
        cache.remove_volume(self);
    }
    fn retain(cache: &mut VolumeCache, listed: &HashSet<String>) {
        cache.retain_volumes(|k| listed.contains(k));
    }
    fn key(&self) -> String {
        self.name_any()
    }
}

impl VolumeObject for StorageClass {
    fn upsert(&self, cache: &mut VolumeCache) {
        cache.upsert_class(self);
    }
    fn remove(&self, cache: &mut VolumeCache) {
        cache.remove_class(self);
    }
    fn retain(cache: &mut VolumeCache, listed: &HashSet<String>) {
        cache.retain_classes(|k| listed.contains(k));
    }
    fn key(&self) -> String {
        self.name_any()
    }
}

/// Claims or volumes into the [`VolumeCache`]; any change may make a waiting pod
/// schedulable (upstream's PVC/PV cluster events), so unschedulable pods move.
async fn watch_volume_objects<K: VolumeObject>(shared: Arc<Shared>) {
    let api: Api<K> = Api::all(shared.client.clone());
    let mut stream = pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listed = HashSet::new();
    while let Some(event) = stream.next().await {
        let mut state = shared.lock();
        let moved = match event {
            Ok(watcher::Event::Apply(o)) => {
                o.upsert(&mut state.volumes);
                true
            }
            Ok(watcher::Event::InitApply(o)) => {
                listed.insert(o.key());
                o.upsert(&mut state.volumes);
                false
            }
            Ok(watcher::Event::Delete(o)) => {
                o.remove(&mut state.volumes);
                true
            }
            Ok(watcher::Event::Init) => {
                listed.clear();
                false
            }
            Ok(watcher::Event::InitDone) => {
                K::retain(&mut state.volumes, &listed);
                state.volumes.mark_synced(&K::kind(&()));
                true
            }
            Err(e) => {
                warn!(error = %e, kind = %K::kind(&()), "scheduler watch");
                false
            }
        };
        if moved {
            state.queue.move_all_unschedulable();
            drop(state);
            shared.wake.notify_one();
            shared.prebind.notify_waiters();
        }
    }
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Apply one pod from the watch; whether an assigned pod went away (may free room).
fn apply_pod(shared: &Shared, state: &mut State, pod: Pod) -> bool {
    let key = cache::pod_key(&pod);
    if is_terminal(&pod) {
        state.forget(&key);
        return state.cache.remove_pod(&key).is_some();
    }
    let info = Arc::new(PodInfo::new(pod));
    if state.cache.is_assumed(&key) && !state.cache.is_assumed_uid(&key, &info.uid) {
        // The assumed pod is gone (deleted during a watch gap) and another of its name is
        // here: its assumption goes, and a binding waiting for it ends.
        state.cache.remove_pod(&key);
        shared.prebind.notify_waiters();
    }
    if info.node_name().is_some() {
        state.forget(&key);
        state.cache.add_pod(info);
        return false;
    }
    let ours = info
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler")
        == shared.config.scheduler_name;
    if !ours || info.terminating {
        state.forget(&key);
        if info.terminating && state.cache.is_assumed(&key) {
            // Deleted while its binding waits for claims (a finalizer keeps it): the wait
            // ends now rather than at the timeout.
            state.cache.remove_pod(&key);
            shared.prebind.notify_waiters();
        }
    } else if !state.cache.is_assumed(&key) {
        state.queue.add(info);
        shared.wake.notify_one();
    }
    false
}

async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<WatchedPod> = Api::all(shared.client.clone());
    let mut stream = pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listed = HashSet::new();
    while let Some(event) = stream.next().await {
        let mut state = shared.lock();
        let moved = match event {
            Ok(watcher::Event::Apply(WatchedPod(pod))) => apply_pod(&shared, &mut state, pod),
            Ok(watcher::Event::InitApply(WatchedPod(pod))) => {
                listed.insert(cache::pod_key(&pod));
                apply_pod(&shared, &mut state, pod);
                false
            }
            Ok(watcher::Event::Delete(WatchedPod(pod))) => {
                let key = cache::pod_key(&pod);
                state.forget(&key);
                let assumed = state.cache.is_assumed(&key);
                let removed = state.cache.remove_pod(&key).is_some();
                if assumed {
                    // Its binding may be waiting on claims: let it see the pod is gone.
                    shared.prebind.notify_waiters();
                }
                removed
            }
            Ok(watcher::Event::Init) => {
                listed.clear();
                false
            }
            Ok(watcher::Event::InitDone) => {
                for key in state.cache.pod_keys() {
                    if !listed.contains(&key) && !state.cache.is_assumed(&key) {
                        state.cache.remove_pod(&key);
                    }
                }
                let stale: Vec<PodKey> = state
                    .queue
                    .pending()
                    .map(|p| p.key.clone())
                    .filter(|k| !listed.contains(k))
                    .collect();
                for key in stale {
                    state.forget(&key);
                }
                state.pods_synced = true;
                true
            }
            Err(e) => {
                warn!(error = %e, "scheduler pod watch");
                false
            }
        };
        if moved {
            state.queue.move_all_unschedulable();
            drop(state);
            shared.wake.notify_one();
        }
    }
}

async fn schedule_loop(shared: Arc<Shared>) {
    loop {
        let mut notified = pin!(shared.wake.notified());
        notified.as_mut().enable();
        let next = {
            let mut state = shared.lock();
            if state.nodes_synced && state.pods_synced && state.volumes.synced() {
                state.queue.pop()
            } else {
                Err(None)
            }
        };
        match next {
            Ok(pod) => schedule_one(&shared, pod).await,
            Err(Some(deadline)) => {
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
            Err(None) => notified.await,
        }
    }
}

/// Upstream `numFeasibleNodesToFind`.
pub fn feasible_nodes_to_find(all: usize, percentage: u32) -> usize {
    const MIN: usize = 100;
    if all < MIN {
        return all;
    }
    let pct = if percentage == 0 {
        (50 - (all / 125) as i64).max(5) as usize
    } else {
        percentage.min(100) as usize
    };
    (all * pct / 100).max(MIN)
}

/// What one scheduling attempt decided.
enum Decision {
    /// Bind to the node, after marking the claims (name, resourceVersion) to provision there
    /// and waiting for the unbound claims (names) to be bound.
    Bind {
        node: String,
        select: Vec<(String, String)>,
        wait: Vec<String>,
    },
    Unschedulable {
        message: String,
        preempt: Option<preemption::Candidate>,
    },
}

fn decide(shared: &Shared, state: &mut State, pod: &Arc<PodInfo>) -> Decision {
    let nominated: HashMap<String, Resources> = {
        let mut m: HashMap<String, Resources> = HashMap::new();
        for (key, (node, req, prio)) in &state.nominations {
            if *key != pod.key && *prio >= pod.priority {
                m.entry(node.clone()).or_default().add(req);
            }
        }
        m
    };
    let cache = &state.cache;
    let volumes::VolumePlan { terms: volume_affinity, select, wait } =
        match state.volumes.prefilter(pod) {
            Ok(plan) => plan,
            Err(why) => {
                let message = volumes::prefilter_message(cache.node_count(), &why);
                return Decision::Unschedulable { message, preempt: None };
            }
        };
    let mut pstate = PodState::new(cache, pod, nominated);
    pstate.volume_affinity = volume_affinity;
    let nodes = cache.nodes();
    let total = nodes.len();
    let to_find =
        feasible_nodes_to_find(cache.node_count(), shared.config.percentage_of_nodes_to_score);
    let mut feasible = Vec::new();
    let mut reasons: HashMap<Reason, usize> = HashMap::new();
    let mut node_reasons: HashMap<String, Vec<Reason>> = HashMap::new();
    let start = if total == 0 { 0 } else { state.next_start % total };
    let mut processed = 0;
    for i in 0..total {
        let node = &nodes[(start + i) % total];
        if node.node.is_none() {
            continue;
        }
        processed = i + 1;
        match filter(&pstate, node) {
            Ok(()) => {
                feasible.push(node);
                if feasible.len() >= to_find {
                    break;
                }
            }
            Err(rs) => {
                for r in &rs {
                    *reasons.entry(r.clone()).or_default() += 1;
                }
                node_reasons.insert(node.name.clone(), rs);
            }
        }
    }
    let next_start = if total == 0 { 0 } else { (start + processed) % total };
    if feasible.is_empty() {
        let message = fit_error_message(cache.node_count(), &reasons);
        let nominated_node = pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref());
        let nominated_node =
            state.nominations.get(&pod.key).map(|(n, _, _)| n.as_str()).or(nominated_node);
        let preempt = if preemption::eligible(cache, pod, nominated_node) {
            preemption::find_candidate(cache, &pstate, &node_reasons)
        } else {
            None
        };
        state.next_start = next_start;
        return Decision::Unschedulable { message, preempt };
    }
    let chosen = if feasible.len() == 1 {
        feasible[0].name.clone()
    } else {
        let scores = scores::score(cache, &pstate, &feasible);
        let mut best = 0;
        let mut ties = 0u64;
        let mut rng = state.rng;
        for (i, s) in scores.iter().enumerate() {
            if *s > scores[best] {
                best = i;
                ties = 1;
            } else if *s == scores[best] {
                ties += 1;
                // Reservoir sampling among equal scores (upstream selectHost).
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if i != best && rng.is_multiple_of(ties) {
                    best = i;
                }
            }
        }
        state.rng = rng;
        feasible[best].name.clone()
    };
    state.next_start = next_start;
    Decision::Bind { node: chosen, select, wait }
}

async fn schedule_one(shared: &Arc<Shared>, pod: Arc<PodInfo>) {
    let span = info_span!("schedule", pod = %pod.key);
    let _enter = span.enter();
    let decision = {
        let mut state = shared.lock();
        let decision = decide(shared, &mut state, &pod);
        match &decision {
            Decision::Bind { node, .. } => state.cache.assume(pod.clone(), node),
            Decision::Unschedulable { preempt, .. } => {
                if let Some(c) = preempt {
                    state
                        .nominations
                        .insert(pod.key.clone(), (c.node.clone(), pod.requests, pod.priority));
                }
                state.queue.unschedulable(&pod.key);
            }
        }
        decision
    };
    drop(_enter);
    match decision {
        Decision::Bind { node, select, wait } => {
            let Ok(permit) = shared.binds.clone().acquire_owned().await else { return };
            let shared = shared.clone();
            tokio::spawn(async move {
                let result = prebind_and_bind(&shared, &pod, &node, &select, &wait, permit).await;
                match result {
                    Ok(()) => {
                        shared.lock().forget(&pod.key);
                        if !shared.config.scheduled_events {
                            return;
                        }
                        let msg = format!("Successfully assigned {} to {node}", pod.key);
                        shared
                            .recorder
                            .record(&pod.pod, EventType::Normal, "Scheduled", &msg)
                            .await;
                    }
                    Err(e) => {
                        debug!(error = %e, pod = %pod.key, "binding failed");
                        let deleted = matches!(&e, Error::Deleted(_));
                        let gone = matches!(&e, Error::Bind { source: kube::Error::Api(s), .. } if s.code == 404 || s.code == 409);
                        {
                            let mut state = shared.lock();
                            state.cache.forget(&pod.key, &pod.uid);
                            if deleted {
                                // The pod's watch event (or its successor's) has done the rest.
                            } else if gone {
                                // Deleted or bound elsewhere: the watch brings the truth.
                                state.forget(&pod.key);
                            } else {
                                state.queue.retry(&pod.key);
                            }
                        }
                        shared.wake.notify_one();
                        let msg = match &e {
                            Error::Deleted(_) => return,
                            Error::VolumeBinding(_) => e.to_string(),
                            _ => format!("Binding rejected: {e}"),
                        };
                        shared
                            .recorder
                            .record(&pod.pod, EventType::Warning, "FailedScheduling", &msg)
                            .await;
                    }
                }
            });
        }
        Decision::Unschedulable { message, preempt } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                let nominated = preempt.as_ref().map(|c| c.node.clone());
                if let Some(c) = preempt {
                    for v in &c.victims {
                        if let Err(e) = evict(&shared, v, &pod, &c.node).await {
                            warn!(error = %e, "preemption");
                        }
                    }
                }
                let report = (message.clone(), nominated.clone());
                let changed = {
                    let mut state = shared.lock();
                    // Only while still pending: a bind or delete may have come meanwhile.
                    state.queue.contains(&pod.key)
                        && state.reported.insert(pod.key.clone(), report.clone()).as_ref()
                            != Some(&report)
                };
                if changed
                    && let Err(e) =
                        set_unschedulable(&shared.client, &pod, &message, nominated.as_deref())
                            .await
                {
                    debug!(error = %e, "pod status");
                    shared.lock().reported.remove(&pod.key);
                }
                shared
                    .recorder
                    .record(&pod.pod, EventType::Warning, "FailedScheduling", &message)
                    .await;
            });
        }
    }
}

/// The binding cycle: PreBind (select the node of claims to provision, then wait for the
/// pod's unbound claims to be bound, holding no bind slot meanwhile), then the binding.
async fn prebind_and_bind(
    shared: &Shared,
    pod: &PodInfo,
    node: &str,
    select: &[(String, String)],
    wait: &[String],
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<()> {
    let written = select_node(&shared.client, pod, node, select).await?;
    let permit = if wait.is_empty() {
        permit
    } else {
        drop(permit);
        wait_for_claims(shared, pod, node, wait, &written).await?;
        let Ok(permit) = shared.binds.clone().acquire_owned().await else {
            return Err(Error::Deleted(pod.key.clone()));
        };
        permit
    };
    let result = bind(&shared.client, pod, node).await;
    drop(permit);
    result
}

/// Upstream's VolumeBinding PreBind wait: until every claim in `claims` is bound (the
/// provisioner made its volume and the binder bound it), for at most `bind_timeout`. A
/// claim deleted meanwhile or sent to another node, or the pod gone, ends the wait.
/// `written`: the claims whose node this binding selected, with the resourceVersion of
/// that write.
async fn wait_for_claims(
    shared: &Shared,
    pod: &PodInfo,
    node: &str,
    claims: &[String],
    written: &[(String, String)],
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + shared.config.bind_timeout;
    loop {
        let mut changed = pin!(shared.prebind.notified());
        changed.as_mut().enable();
        {
            let state = shared.lock();
            if !state.cache.is_assumed_uid(&pod.key, &pod.uid) {
                return Err(Error::Deleted(pod.key.clone()));
            }
            let mut pending = false;
            for claim in claims {
                let wrote = written.iter().find(|(c, _)| c == claim).map(|(_, rv)| rv.as_str());
                match state.volumes.binding(&pod.namespace, claim, node, wrote) {
                    volumes::Binding::Bound => {}
                    volumes::Binding::Pending => pending = true,
                    volumes::Binding::Lost(why) => return Err(Error::VolumeBinding(why)),
                }
            }
            if !pending {
                return Ok(());
            }
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return Err(Error::VolumeBinding("context deadline exceeded".into()));
        }
    }
}

/// Upstream's VolumeBinding PreBind for claims to provision: each gets the chosen node in
/// `volume.kubernetes.io/selected-node`, under the resourceVersion the decision saw, so
/// that two pods of one claim cannot send it to two nodes (409: the pod is retried, and
/// then follows the node the other selected).
async fn select_node(
    client: &Client,
    pod: &PodInfo,
    node: &str,
    claims: &[(String, String)],
) -> Result<Vec<(String, String)>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &pod.namespace);
    let mut written = Vec::with_capacity(claims.len());
    for (claim, rv) in claims {
        let patch = json!({"metadata": {"resourceVersion": rv,
            "annotations": {skiff_core::volumes::SELECTED_NODE: node}}});
        let patched = api.patch(claim, &PatchParams::default(), &Patch::Merge(&patch)).await;
        let patched = patched.map_err(|source| Error::SelectNode {
            claim: format!("{}/{claim}", pod.namespace),
            source,
        })?;
        written.push((claim.clone(), patched.resource_version().unwrap_or_default()));
    }
    Ok(written)
}

async fn bind(client: &Client, pod: &PodInfo, node: &str) -> Result<()> {
    let name = pod.pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: pod.pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    api.create_subresource::<_, serde_json::Value>(
        "binding",
        &name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Bind { pod: pod.key.clone(), node: node.to_string(), source })
}

async fn evict(shared: &Shared, victim: &PodInfo, preemptor: &PodInfo, node: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &victim.namespace);
    match api.delete(&victim.pod.name_any(), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(source) => return Err(Error::Evict { pod: victim.key.clone(), source }),
    }
    let msg = format!("Preempted by pod {} on node {node}", preemptor.uid);
    shared.recorder.record(&victim.pod, EventType::Normal, "Preempted", &msg).await;
    Ok(())
}

/// `PodScheduled=False` (reason Unschedulable) and the nominated node, via pods/status;
/// skipped when the pod already says exactly that.
async fn set_unschedulable(
    client: &Client,
    pod: &PodInfo,
    message: &str,
    nominated: Option<&str>,
) -> Result<()> {
    let status = pod.pod.status.as_ref();
    let current = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    let same = current.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
            && c.message.as_deref() == Some(message)
    });
    let nominated_same =
        nominated.is_none() || status.and_then(|s| s.nominated_node_name.as_deref()) == nominated;
    if same && nominated_same {
        return Ok(());
    }
    // The transition time moves only when the status does (upstream UpdatePodCondition).
    let now =
        current
            .filter(|c| c.status == "False")
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| {
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                )
            });
    let mut patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastProbeTime": null, "lastTransitionTime": now
    }]}});
    if let Some(n) = nominated {
        patch["status"]["nominatedNodeName"] = json!(n);
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    match api
        .patch_status(&pod.pod.name_any(), &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Status { pod: pod.key.clone(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feasible_nodes_follow_upstream() {
        assert_eq!(feasible_nodes_to_find(50, 0), 50);
        assert_eq!(feasible_nodes_to_find(100, 0), 100);
        assert_eq!(feasible_nodes_to_find(1000, 0), 420);
        assert_eq!(feasible_nodes_to_find(5000, 0), 500);
        assert_eq!(feasible_nodes_to_find(1000, 100), 1000);
    }
}
