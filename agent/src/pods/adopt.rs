//! Restart safety: after the first complete pod list, sandboxes and containers whose pod no
//! longer exists are removed. Those of existing pods are left alone: their workers observe
//! them through the pod-uid label and carry on without restarting anything. Pod cgroup
//! directories (`<parent>/pod<uid>`) of pods that no longer exist go too: containerd
//! leaves them behind when a pod was removed while no agent ran.

use std::collections::{HashMap, HashSet};

use super::context::PodContext;
use super::error::{Error, Result};
use super::termination;
use crate::runtime::{POD_UID_LABEL, Runtime};

/// Removes what belongs to pods not in `live` (pod UIDs); returns the removed UIDs.
pub async fn remove_orphans<R: Runtime>(
    ctx: &PodContext<R>,
    live: &HashSet<String>,
) -> Result<Vec<String>> {
    let all = HashMap::new();
    let err = |call| move |source| Error::Runtime { call, pod: "*".into(), source };
    let sandboxes = ctx.runtime.list_pod_sandboxes(&all).await.map_err(err("ListPodSandbox"))?;
    let containers = ctx.runtime.list_containers(&all).await.map_err(err("ListContainers"))?;
    let mut orphans: Vec<String> = sandboxes
        .iter()
        .filter_map(|s| s.labels.get(POD_UID_LABEL))
        .chain(containers.iter().filter_map(|c| c.labels.get(POD_UID_LABEL)))
        .filter(|uid| !live.contains(*uid))
        .cloned()
        .collect();
    orphans.sort();
    orphans.dedup();
    for uid in &orphans {
        tracing::info!(uid, "removing the sandbox of a pod that no longer exists");
        termination::remove_pod(ctx, uid, 0).await;
    }
    let stale = remove_orphan_cgroups(&ctx.config, live);
    if stale > 0 {
        tracing::info!(count = stale, "removed cgroup directories of pods that no longer exist");
    }
    Ok(orphans)
}

/// Removes `pod<uid>` directories under the node's cgroup parent, in every hierarchy, whose
/// uid is not in `live`; returns how many directories went. Nothing without a parent.
pub fn remove_orphan_cgroups(config: &crate::config::AgentConfig, live: &HashSet<String>) -> usize {
    let parent = config.cgroup_parent.trim_matches('/');
    if parent.is_empty() {
        return 0;
    }
    let mounts = match crate::cgroups::cgroup_mounts() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "listing cgroup hierarchies");
            return 0;
        }
    };
    let mut uids: HashSet<String> = HashSet::new();
    for m in mounts {
        let Ok(entries) = std::fs::read_dir(m.join(parent)) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(uid) = name.strip_prefix("pod")
                && e.file_type().is_ok_and(|t| t.is_dir())
                && !live.contains(uid)
            {
                uids.insert(uid.to_string());
            }
        }
    }
    uids.iter().map(|uid| termination::remove_pod_cgroups(config, uid)).sum()
}
