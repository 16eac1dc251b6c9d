//! Restart safety: after the first complete pod list, sandboxes and containers whose pod no
//! longer exists are removed. Those of existing pods are left alone: their workers observe
//! them through the pod-uid label and carry on without restarting anything.

use std::collections::{HashMap, HashSet};

use super::{Error, PodContext, Result, termination};
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
    Ok(orphans)
}
