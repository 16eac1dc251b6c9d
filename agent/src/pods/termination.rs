//! Graceful termination: preStop hooks (exec or HTTP GET), SIGTERM through StopContainer with
//! what is left of the grace period (the runtime sends SIGKILL when it runs out), sandbox
//! teardown, volume cleanup, then the final delete of the pod object (gracePeriodSeconds=0
//! with a uid precondition, so a new pod of the same name is never deleted).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio::time::Instant;

use super::context::{PodContext, key};
use super::error::{Error, Result};
use super::probes::http_get;
use super::state::{Step, WorkerState, observe};
use super::status::is_running;
use super::volumes;
use crate::runtime::{POD_UID_LABEL, Runtime};

/// The grace period of a deletion: deletionGracePeriodSeconds, else the pod's
/// terminationGracePeriodSeconds, else 30 s.
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30)
        .max(0)
}

/// Whole seconds of `d`, rounded up: what is left of a grace period is never cut short
/// (3.9 s left is a 4 s StopContainer timeout, not 3).
fn ceil_secs(d: Duration) -> i64 {
    d.as_millis().div_ceil(1000) as i64
}

/// Runs the preStop hook of `c` (bounded by `budget`).
async fn pre_stop<R: Runtime>(
    ctx: &PodContext<R>,
    pod: &Pod,
    c: &Container,
    id: &str,
    budget: Duration,
) {
    let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else { return };
    if budget.is_zero() {
        return;
    }
    if let Some(exec) = &hook.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let run = ctx.runtime.exec_sync(id, cmd, budget.as_secs().max(1) as i64);
        match tokio::time::timeout(budget, run).await {
            Ok(Ok(r)) if r.exit_code != 0 => {
                tracing::info!(pod = %key(pod), container = %c.name, code = r.exit_code, "preStop hook failed")
            }
            Ok(Err(e)) => {
                tracing::info!(pod = %key(pod), container = %c.name, error = %e, "preStop hook")
            }
            _ => {}
        }
    } else if let Some(h) = &hook.http_get {
        let ip = h.host.as_deref().filter(|h| !h.is_empty()).and_then(|h| h.parse().ok()).or_else(
            || pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok()),
        );
        let port = match &h.port {
            IntOrString::Int(p) => u16::try_from(*p).ok(),
            IntOrString::String(n) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(n.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok()),
        };
        if let (Some(ip), Some(port)) = (ip, port) {
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let _ =
                http_get(SocketAddr::new(ip, port), &format!("{ip}:{port}"), &path, budget).await;
        }
    } else if let Some(s) = &hook.sleep {
        tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64).min(budget)).await;
    }
}

/// preStop, then StopContainer with the rest of `grace` seconds.
pub async fn stop_container<R: Runtime>(
    ctx: &PodContext<R>,
    pod: &Pod,
    c: &Container,
    id: &str,
    grace: i64,
) {
    let start = Instant::now();
    let budget = Duration::from_secs(grace.max(0) as u64);
    pre_stop(ctx, pod, c, id, budget).await;
    let left = ceil_secs(budget.saturating_sub(start.elapsed())).max(if grace > 0 { 2 } else { 0 });
    if let Err(e) = ctx.runtime.stop_container(id, left).await
        && !e.is_not_found()
    {
        tracing::warn!(pod = %key(pod), container = %c.name, error = %e, "stopping container");
    }
}

/// Stops the sandbox and removes it with its containers.
pub async fn remove_sandbox<R: Runtime>(runtime: &R, id: &str, uid: &str) -> Result<()> {
    let err = |call| move |source| Error::Runtime { call, pod: uid.to_string(), source };
    match runtime.stop_pod_sandbox(id).await {
        Err(e) if !e.is_not_found() => return Err(err("StopPodSandbox")(e)),
        _ => {}
    }
    match runtime.remove_pod_sandbox(id).await {
        Err(e) if !e.is_not_found() => Err(err("RemovePodSandbox")(e)),
        _ => Ok(()),
    }
}

/// Stops what still runs of a finished pod (its sandbox stays for logs until deletion).
pub async fn stop_all<R: Runtime>(ctx: &PodContext<R>, pod: &Pod, uid: &str) -> Result<()> {
    let obs = observe(&ctx.runtime, uid).await?;
    let spec = pod.spec.clone().unwrap_or_default();
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        if let Some(l) = obs.latest(&c.name).filter(|l| is_running(l)) {
            stop_container(ctx, pod, c, &l.id, grace).await;
        }
    }
    if let Some(sb) = obs.sandbox.filter(|s| s.ready)
        && let Err(e) = ctx.runtime.stop_pod_sandbox(&sb.id).await
    {
        tracing::warn!(pod = %key(pod), error = %e, "stopping the sandbox of a finished pod");
    }
    Ok(())
}

/// The deletion of a pod: stop everything within the grace period, remove it from the
/// runtime, then delete the object for good.
pub async fn terminate<R: Runtime>(
    ctx: &PodContext<R>,
    pod: &Pod,
    st: &mut WorkerState,
) -> Result<Step> {
    let uid = pod.uid().unwrap_or_default();
    let st_events = st.deleting_since.is_none();
    let since = *st.deleting_since.get_or_insert_with(Instant::now);
    let grace = grace_period(pod);
    let left = ceil_secs(Duration::from_secs(grace as u64).saturating_sub(since.elapsed()));
    let obs = observe(&ctx.runtime, &uid).await?;
    let spec = pod.spec.clone().unwrap_or_default();
    let stops = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| obs.latest(&c.name).filter(|l| is_running(l)).map(|l| (c, l.id.clone())))
        .map(|(c, id)| async move {
            if st_events {
                ctx.events.normal(pod, "Killing", format!("Stopping container {}", c.name));
            }
            stop_container(ctx, pod, c, &id, left).await
        });
    futures::future::join_all(stops).await;
    tracing::info!(pod = %key(pod), "pod terminated");
    remove_pod(ctx, &uid, 0).await;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(Step::Done),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Step::Done),
        Err(source) => Err(Error::DeletePod { pod: key(pod), source }),
    }
}

/// Removes every sandbox and container of pod `uid` from the runtime (containers stopped
/// with `grace` seconds) and its volumes.
pub async fn remove_pod<R: Runtime>(ctx: &PodContext<R>, uid: &str, grace: i64) {
    let labels = std::collections::HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    if let Ok(containers) = ctx.runtime.list_containers(&labels).await {
        for c in containers {
            if c.state == crate::runtime::api::ContainerState::ContainerRunning as i32 {
                let _ = ctx.runtime.stop_container(&c.id, grace).await;
            }
            let _ = ctx.runtime.remove_container(&c.id).await;
        }
    }
    match ctx.runtime.list_pod_sandboxes(&labels).await {
        Ok(sandboxes) => {
            for sb in sandboxes {
                if let Err(e) = remove_sandbox(&ctx.runtime, &sb.id, uid).await {
                    tracing::warn!(uid, error = %e, "removing a sandbox");
                }
            }
        }
        Err(e) => tracing::warn!(uid, error = %e, "listing the sandboxes of a removed pod"),
    }
    volumes::cleanup(&ctx.config, uid);
    remove_pod_cgroups(&ctx.config, uid);
}

/// Removes pod `uid`'s cgroup directory (`<parent>/pod<uid>`) from every cgroup hierarchy:
/// runc removes its containers' own directories, never the parent it created for them.
/// Best effort (a directory still holding processes stays); returns how many went.
pub fn remove_pod_cgroups(config: &crate::config::AgentConfig, uid: &str) -> usize {
    let dir = super::sandbox::pod_cgroup_parent(config, uid);
    if dir.is_empty() {
        return 0;
    }
    match crate::cgroups::remove_cgroup_dirs(&dir) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(uid, error = %e, "removing the pod's cgroup directories");
            0
        }
    }
}
