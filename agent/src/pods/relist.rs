//! The node-wide runtime cache (the kubelet's PLEG and pod cache): one relist —
//! `ListPodSandbox` + `ListContainers` for the whole node — every `pod_relist`, shared by
//! every pod worker, instead of each worker asking the runtime about its own pod.
//!
//! A relist groups sandboxes and containers by the pod-uid label and compares each pod's
//! fingerprint (ids and states of its sandboxes and containers) with the cached one. Only a
//! pod whose fingerprint changed costs more calls (`PodSandboxStatus` of a new sandbox,
//! `ContainerStatus` of the instances whose state changed; unchanged ones are reused), and
//! only its worker is woken. A worker reads its pod from the cache; right after its own
//! runtime calls it observes its pod directly ([`RuntimeCache::observe`] with `fresh`), which
//! updates the cache too. Every entry remembers when its data was read: an older read never
//! replaces a newer one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::error::{Error, Result};
use super::status::{Observed, SandboxView};
use crate::runtime::{CONTAINER_NAME_LABEL, POD_UID_LABEL, Runtime, api};

/// Ids and states of a pod's sandboxes and containers, sorted: equal fingerprints mean
/// nothing the pod status depends on changed (statuses of a given id and state are fixed).
type Fingerprint = Vec<(String, i32)>;

fn fingerprint(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> Fingerprint {
    let mut f: Fingerprint = sandboxes
        .iter()
        .map(|s| (s.id.clone(), s.state))
        .chain(containers.iter().map(|c| (c.id.clone(), c.state)))
        .collect();
    f.sort();
    f
}

struct Entry {
    obs: Observed,
    fingerprint: Fingerprint,
    /// When the runtime was asked (the start of the list calls).
    read_at: Instant,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, Entry>,
    wakers: HashMap<String, Arc<Notify>>,
}

/// Counters (benchmarks, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Completed node-wide relists.
    pub relists: u64,
    /// Direct observations of one pod by its worker.
    pub direct: u64,
    /// Passes served from the cache.
    pub hits: u64,
}

/// The shared cache. See the module docs.
pub struct RuntimeCache {
    state: Mutex<State>,
    stats: Mutex<CacheStats>,
    enabled: bool,
}

impl Default for RuntimeCache {
    fn default() -> Self {
        RuntimeCache { state: Mutex::default(), stats: Mutex::default(), enabled: true }
    }
}

fn uid_labels(uid: &str) -> HashMap<String, String> {
    HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())])
}

fn rt_err<'a>(
    call: &'static str,
    pod: &'a str,
) -> impl FnOnce(crate::runtime::Error) -> Error + 'a {
    move |source| Error::Runtime { call, pod: pod.to_string(), source }
}

/// The observation of one pod from its listed sandboxes and containers: statuses of
/// unchanged instances come from `prev`, the others from the runtime.
async fn build<R: Runtime>(
    runtime: &R,
    uid: &str,
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    prev: Option<&Observed>,
) -> Result<Observed> {
    let newest =
        sandboxes.iter().max_by_key(|s| (s.metadata.as_ref().map(|m| m.attempt), s.created_at));
    let sandbox = match newest {
        Some(sb) => {
            let ready = sb.state == api::PodSandboxState::SandboxReady as i32;
            let known = prev.and_then(|p| p.sandbox.as_ref()).filter(|s| s.id == sb.id);
            let ip = match known {
                // A sandbox keeps its IP; once not ready, the status may no longer say it.
                Some(s) if s.ready == ready || !ready => s.ip.clone(),
                _ => match runtime.pod_sandbox_status(&sb.id).await {
                    Ok(s) => s.network.map(|n| n.ip).unwrap_or_default(),
                    Err(e) if e.is_not_found() => String::new(),
                    Err(e) => return Err(rt_err("PodSandboxStatus", uid)(e)),
                },
            };
            Some(SandboxView {
                id: sb.id.clone(),
                ready,
                ip,
                attempt: sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            })
        }
        None => None,
    };
    let cached: HashMap<&str, &api::ContainerStatus> = prev
        .iter()
        .flat_map(|p| p.containers.values().flatten())
        .map(|s| (s.id.as_str(), s))
        .collect();
    let mut by_name: HashMap<String, Vec<api::ContainerStatus>> = HashMap::new();
    for c in containers {
        let status = match cached.get(c.id.as_str()).filter(|s| s.state == c.state) {
            Some(s) => (*s).clone(),
            None => match runtime.container_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(rt_err("ContainerStatus", uid)(e)),
            },
        };
        let name = c.labels.get(CONTAINER_NAME_LABEL).cloned().unwrap_or_default();
        by_name.entry(name).or_default().push(status);
    }
    for v in by_name.values_mut() {
        v.sort_by_key(|c| {
            std::cmp::Reverse((c.metadata.as_ref().map(|m| m.attempt), c.created_at))
        });
    }
    Ok(Observed { sandbox, containers: by_name })
}

/// What the runtime has for pod `uid`, asked directly (3 + N calls; nothing cached).
pub async fn observe_direct<R: Runtime>(runtime: &R, uid: &str) -> Result<Observed> {
    let labels = uid_labels(uid);
    let sandboxes =
        runtime.list_pod_sandboxes(&labels).await.map_err(rt_err("ListPodSandbox", uid))?;
    let containers =
        runtime.list_containers(&labels).await.map_err(rt_err("ListContainers", uid))?;
    build(runtime, uid, &sandboxes, &containers, None).await
}

impl RuntimeCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that caches nothing: every observation asks the runtime (the behaviour
    /// before the relist cache, for comparisons).
    pub fn disabled() -> Self {
        RuntimeCache { enabled: false, ..Self::default() }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut CacheStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn stats(&self) -> CacheStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The waker of pod `uid`'s worker: notified when a relist sees its pod change.
    pub fn subscribe(&self, uid: &str) -> Arc<Notify> {
        self.state().wakers.entry(uid.to_string()).or_default().clone()
    }

    /// Forgets pod `uid` (its worker ended).
    pub fn forget(&self, uid: &str) {
        let mut st = self.state();
        st.wakers.remove(uid);
        st.pods.remove(uid);
    }

    /// Drops what is cached of pod `uid`: its next observation asks the runtime.
    pub fn invalidate(&self, uid: &str) {
        self.state().pods.remove(uid);
    }

    /// Wakes the worker of `uid` (if any).
    pub fn wake(&self, uid: &str) {
        if let Some(w) = self.state().wakers.get(uid) {
            w.notify_one();
        }
    }

    /// Pod `uid` as the runtime has it: from the cache, unless `fresh` or not cached yet, in
    /// which case the runtime is asked for this pod alone (and the cache updated).
    pub async fn observe<R: Runtime>(
        &self,
        runtime: &R,
        uid: &str,
        fresh: bool,
    ) -> Result<Observed> {
        let prev = {
            let st = self.state();
            match st.pods.get(uid) {
                Some(e) if !fresh && self.enabled => {
                    let obs = e.obs.clone();
                    drop(st);
                    self.count(|s| s.hits += 1);
                    return Ok(obs);
                }
                Some(e) => Some(e.obs.clone()),
                None => None,
            }
        };
        let read_at = Instant::now();
        let labels = uid_labels(uid);
        let sandboxes =
            runtime.list_pod_sandboxes(&labels).await.map_err(rt_err("ListPodSandbox", uid))?;
        let containers =
            runtime.list_containers(&labels).await.map_err(rt_err("ListContainers", uid))?;
        let obs = build(runtime, uid, &sandboxes, &containers, prev.as_ref()).await?;
        let fp = fingerprint(&sandboxes, &containers);
        self.count(|s| s.direct += 1);
        let mut st = self.state();
        if st.pods.get(uid).is_none_or(|e| e.read_at <= read_at) {
            st.pods.insert(uid.to_string(), Entry { obs: obs.clone(), fingerprint: fp, read_at });
        }
        Ok(obs)
    }

    /// One node-wide relist: two list calls, statuses only for what changed, the workers of
    /// changed pods woken. Returns the UIDs that changed.
    pub async fn relist<R: Runtime>(&self, runtime: &R) -> Result<Vec<String>> {
        let read_at = Instant::now();
        let all = HashMap::new();
        let sandboxes =
            runtime.list_pod_sandboxes(&all).await.map_err(rt_err("ListPodSandbox", "*"))?;
        let containers =
            runtime.list_containers(&all).await.map_err(rt_err("ListContainers", "*"))?;
        let mut pods: HashMap<String, (Vec<api::PodSandbox>, Vec<api::Container>)> = HashMap::new();
        for sb in sandboxes {
            if let Some(uid) = sb.labels.get(POD_UID_LABEL).cloned() {
                pods.entry(uid).or_default().0.push(sb);
            }
        }
        for c in containers {
            if let Some(uid) = c.labels.get(POD_UID_LABEL).cloned() {
                pods.entry(uid).or_default().1.push(c);
            }
        }
        let mut changed = Vec::new();
        for (uid, (sbs, cs)) in &pods {
            let fp = fingerprint(sbs, cs);
            let prev = {
                let st = self.state();
                match st.pods.get(uid) {
                    Some(e) if e.fingerprint == fp || e.read_at > read_at => continue,
                    Some(e) => Some(e.obs.clone()),
                    None => None,
                }
            };
            let obs = match build(runtime, uid, sbs, cs, prev.as_ref()).await {
                Ok(o) => o,
                // One pod's failure (its container removed meanwhile) does not stop the rest.
                Err(e) => {
                    tracing::debug!(uid, error = %e, "relist: pod status");
                    continue;
                }
            };
            let mut st = self.state();
            if st.pods.get(uid).is_none_or(|e| e.read_at <= read_at) {
                st.pods.insert(uid.clone(), Entry { obs, fingerprint: fp, read_at });
                if let Some(w) = st.wakers.get(uid) {
                    w.notify_one();
                }
                changed.push(uid.clone());
            }
        }
        // Pods that have nothing left in the runtime.
        {
            let listed: HashSet<&String> = pods.keys().collect();
            let mut st = self.state();
            let gone: Vec<String> = st
                .pods
                .iter()
                .filter(|(uid, e)| !listed.contains(uid) && e.read_at <= read_at)
                .map(|(uid, _)| uid.clone())
                .collect();
            for uid in gone {
                let had_something = st
                    .pods
                    .remove(&uid)
                    .is_some_and(|e| e.obs.sandbox.is_some() || !e.obs.containers.is_empty());
                if had_something {
                    if let Some(w) = st.wakers.get(&uid) {
                        w.notify_one();
                    }
                    changed.push(uid);
                }
            }
        }
        self.count(|s| s.relists += 1);
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::memory::MemoryRuntime;

    fn sandbox(uid: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: format!("p-{uid}"),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: uid_labels(uid),
            ..Default::default()
        }
    }

    fn container(uid: &str, name: &str) -> api::ContainerConfig {
        let mut labels = uid_labels(uid);
        labels.insert(CONTAINER_NAME_LABEL.into(), name.into());
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "busybox:1".into(), ..Default::default() }),
            labels,
            ..Default::default()
        }
    }

    fn status_calls(rt: &MemoryRuntime) -> usize {
        let r = rt.reads();
        r.get("ContainerStatus").copied().unwrap_or(0)
            + r.get("PodSandboxStatus").copied().unwrap_or(0)
    }

    fn reads(rt: &MemoryRuntime) -> usize {
        rt.reads().values().sum()
    }

    #[tokio::test]
    async fn a_relist_costs_two_calls_when_nothing_changed_and_wakes_only_changed_pods() {
        let rt = MemoryRuntime::new();
        rt.add_image("busybox:1");
        let cache = RuntimeCache::new();
        let mut ids = Vec::new();
        for uid in ["u1", "u2", "u3"] {
            let sb = rt.run_pod_sandbox(sandbox(uid)).await.unwrap();
            let id = rt.create_container(&sb, container(uid, "c"), &sandbox(uid)).await.unwrap();
            rt.start_container(&id).await.unwrap();
            ids.push(id);
        }
        let w1 = cache.subscribe("u1");
        let w2 = cache.subscribe("u2");
        let changed = cache.relist(&rt).await.unwrap();
        assert_eq!(changed.len(), 3, "every pod is new to the cache");
        let before = reads(&rt);
        let changed = cache.relist(&rt).await.unwrap();
        assert!(changed.is_empty());
        assert_eq!(reads(&rt) - before, 2, "an idle relist is two list calls");

        // Drain the permits of the first relist, then change u2 only.
        for w in [&w1, &w2] {
            tokio::time::timeout(std::time::Duration::from_millis(10), w.notified()).await.unwrap();
        }
        rt.exit_container(&ids[1], 3).unwrap();
        let statuses = status_calls(&rt);
        let changed = cache.relist(&rt).await.unwrap();
        assert_eq!(changed, vec!["u2".to_string()]);
        assert_eq!(status_calls(&rt) - statuses, 1, "only the changed container's status");
        tokio::time::timeout(std::time::Duration::from_millis(10), w2.notified()).await.unwrap();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(10), w1.notified())
                .await
                .is_err(),
            "u1 did not change"
        );
        let obs = cache.observe(&rt, "u2", false).await.unwrap();
        assert_eq!(obs.latest("c").map(|c| c.exit_code), Some(3));
        assert_eq!(cache.stats().hits, 1);
    }

    #[tokio::test]
    async fn a_fresh_observation_is_not_replaced_by_an_older_relist() {
        let rt = MemoryRuntime::new();
        rt.add_image("busybox:1");
        let cache = RuntimeCache::new();
        let obs = cache.observe(&rt, "u1", false).await.unwrap();
        assert!(obs.sandbox.is_none());
        let sb = rt.run_pod_sandbox(sandbox("u1")).await.unwrap();
        let obs = cache.observe(&rt, "u1", true).await.unwrap();
        assert_eq!(obs.sandbox.as_ref().map(|s| s.id.as_str()), Some(sb.as_str()));
        assert_eq!(cache.stats().direct, 2);
        // Removed from the runtime: the relist drops the entry and reports the change.
        rt.stop_pod_sandbox(&sb).await.unwrap();
        rt.remove_pod_sandbox(&sb).await.unwrap();
        let changed = cache.relist(&rt).await.unwrap();
        assert_eq!(changed, vec!["u1".to_string()]);
        let obs = cache.observe(&rt, "u1", false).await.unwrap();
        assert!(obs.sandbox.is_none());
    }
}
