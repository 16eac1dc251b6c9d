//! One pass of a pod worker: observe the runtime, take the steps towards the spec (sandbox →
//! images → init containers in order → containers → probes → restarts with back-off), write
//! the status when it changed. The worker's loop and its state between passes are
//! [`super::worker`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use tokio::time::Instant;

use super::backoff::{Backoff, should_restart};
use super::containers::{ConfigError, EnvSources, container_config, mounts, resolve_env};
use super::context::{PodContext, is_terminal, key};
use super::error::{Error, Result};
use super::images::{PullPolicy, ensure_image, pull_policy};
use super::probes::ProbeTracker;
use super::sandbox::sandbox_config;
use super::state::{Step, WorkerState};
use super::status::{self, Observed, is_exited, is_running};
use super::{termination, volumes};
use crate::config::AgentConfig;
use crate::runtime::{Runtime, api};

fn rt_err<'a>(
    call: &'static str,
    pod: &'a str,
) -> impl FnOnce(crate::runtime::Error) -> Error + 'a {
    move |source| Error::Runtime { call, pod: pod.to_string(), source }
}

/// The pod's own context for one pass.
struct Pass<'a, R> {
    ctx: &'a PodContext<R>,
    pod: &'a Pod,
    st: &'a mut WorkerState,
    sandbox_id: String,
    sandbox_config: api::PodSandboxConfig,
    pod_ip: String,
    volume_paths: Option<HashMap<String, PathBuf>>,
    next: Duration,
    /// Something was asked of the runtime: observe again before computing the status.
    acted: bool,
}

impl<R: Runtime> Pass<'_, R> {
    /// Sets the waiting reason of a container; true when it changed (events only then).
    fn set_waiting(&mut self, name: &str, reason: &str, message: &str) -> bool {
        let new = (reason.to_string(), message.to_string());
        self.st.know.waiting.insert(name.to_string(), new.clone()) != Some(new)
    }

    fn wake_within(&mut self, d: Duration) {
        self.next = self.next.min(d.max(Duration::from_millis(10)));
    }

    async fn volumes(
        &mut self,
        sources: &mut EnvSources<'_>,
    ) -> Result<HashMap<String, PathBuf>, ConfigError> {
        if let Some(v) = &self.volume_paths {
            return Ok(v.clone());
        }
        let v = volumes::materialize(
            sources,
            &self.ctx.config,
            self.pod,
            &self.pod_ip,
            &self.ctx.host_ip,
        )
        .await?;
        if sources.token_refresh_at.is_some() {
            self.st.token_refresh_at = sources.token_refresh_at;
        }
        self.volume_paths = Some(v.clone());
        Ok(v)
    }

    /// Writes the projected ServiceAccount tokens again when they are due (80% of their
    /// lifetime, the kubelet's token manager), and wakes the worker for the next time.
    async fn refresh_tokens(&mut self) {
        let now = Instant::now();
        if !self.st.tokens_checked {
            self.st.tokens_checked = true;
            let uid = self.pod.uid().unwrap_or_default();
            let written = self.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                volumes::has_token(v)
                    && volumes::volume_dir(
                        &self.ctx.config,
                        &uid,
                        "kubernetes.io~projected",
                        &v.name,
                    )
                    .is_dir()
            });
            if self.st.token_refresh_at.is_none() && written {
                self.st.token_refresh_at = Some(now);
            }
        }
        let Some(at) = self.st.token_refresh_at else { return };
        if now >= at {
            let client = self.ctx.client.clone();
            let mut sources = EnvSources::new(&client, &self.pod.namespace().unwrap_or_default());
            let refreshed = volumes::refresh_tokens(
                &mut sources,
                &self.ctx.config,
                self.pod,
                &self.pod_ip,
                &self.ctx.host_ip,
            )
            .await;
            match refreshed {
                Ok(n) => {
                    tracing::debug!(pod = %key(self.pod), volumes = n, "ServiceAccount tokens refreshed");
                    self.st.token_refresh_at = sources.token_refresh_at;
                }
                Err(ConfigError(msg)) => {
                    tracing::warn!(pod = %key(self.pod), error = %msg, "refreshing ServiceAccount tokens");
                    self.st.token_refresh_at = Some(now + Duration::from_secs(10));
                }
            }
        }
        if let Some(at) = self.st.token_refresh_at {
            self.wake_within(at.saturating_duration_since(now));
        }
    }

    /// Creates and starts one container instance (image, env, mounts, create, start).
    async fn start(
        &mut self,
        c: &Container,
        attempt: u32,
        older: &[api::ContainerStatus],
    ) -> Result<()> {
        let pod_key = key(self.pod);
        self.acted = true;
        let image = c.image.clone().unwrap_or_default();
        let backoff = self.ctx.config.backoff;
        match ensure_image(
            &self.ctx.runtime,
            &image,
            pull_policy(c),
            &mut self.st.pulls,
            backoff,
            Some(&self.sandbox_config),
        )
        .await
        {
            Ok((_, pulled)) => {
                let msg = if pulled {
                    format!("Successfully pulled image \"{image}\"")
                } else {
                    format!("Container image \"{image}\" already present on machine")
                };
                self.ctx.events.normal(self.pod, "Pulled", msg);
            }
            Err(e) => {
                tracing::info!(pod = %pod_key, container = %c.name, reason = e.reason, "image not available");
                let wait = self.st.pulls.remaining(&image, Instant::now());
                match e.reason {
                    "ImagePullBackOff" => {
                        if self.set_waiting(&c.name, e.reason, &e.message) {
                            self.ctx.events.normal(self.pod, "BackOff", e.message.clone());
                        }
                    }
                    _ => {
                        self.ctx.events.warning(self.pod, "Failed", e.message.clone());
                        self.ctx.events.warning(self.pod, "Failed", format!("Error: {}", e.reason));
                    }
                }
                self.st.know.waiting.insert(c.name.clone(), (e.reason.to_string(), e.message));
                if !wait.is_zero() {
                    self.wake_within(wait);
                }
                return Ok(());
            }
        }
        let client = self.ctx.client.clone();
        let mut sources = EnvSources::new(&client, &self.pod.namespace().unwrap_or_default());
        let prepared = async {
            let env =
                resolve_env(&mut sources, self.pod, c, &self.pod_ip, &self.ctx.host_ip).await?;
            let paths = self.volumes(&mut sources).await?;
            let mut m = mounts(c, &paths)?;
            // A claim mounted readOnly in the pod's volume is read-only in every container.
            let read_only = super::volumes::read_only_volumes(self.pod);
            for (mount, vm) in m.iter_mut().zip(c.volume_mounts.iter().flatten()) {
                mount.readonly |= read_only.contains(&vm.name);
            }
            Ok::<_, ConfigError>((env, m))
        }
        .await;
        let (env, m) = match prepared {
            Ok(x) => x,
            Err(ConfigError(msg)) => {
                if self.set_waiting(&c.name, "CreateContainerConfigError", &msg) {
                    self.ctx.events.warning(self.pod, "Failed", format!("Error: {msg}"));
                }
                return Ok(());
            }
        };
        let log_dir = self.ctx.config.pod_log_dir(
            &self.pod.namespace().unwrap_or_default(),
            &self.pod.name_any(),
            &self.pod.uid().unwrap_or_default(),
        );
        let container_logs = AgentConfig::container_log_dir(&log_dir, &c.name);
        if let Err(e) = std::fs::create_dir_all(&container_logs) {
            tracing::warn!(dir = %container_logs.display(), error = %e, "creating the container log directory");
        }
        let cfg = container_config(self.pod, c, attempt, &env, m);
        let id = match self
            .ctx
            .runtime
            .create_container(&self.sandbox_id, cfg, &self.sandbox_config)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let msg = e.to_string();
                if self.set_waiting(&c.name, "CreateContainerError", &msg) {
                    self.ctx.events.warning(self.pod, "Failed", format!("Error: {msg}"));
                }
                return Ok(());
            }
        };
        self.ctx.events.normal(self.pod, "Created", format!("Created container {}", c.name));
        self.st.know.waiting.remove(&c.name);
        // Keep the newest dead instance as lastState; older ones go.
        for old in older.iter().skip(1) {
            if let Err(e) = self.ctx.runtime.remove_container(&old.id).await
                && !e.is_not_found()
            {
                tracing::warn!(pod = %pod_key, id = %old.id, error = %e, "removing an old container");
            }
        }
        tracing::info!(pod = %pod_key, container = %c.name, id = %id, attempt, "starting container");
        if let Err(e) = self.ctx.runtime.start_container(&id).await {
            // The runtime records the failed start on the container (StartError); the next
            // pass handles it like any exit.
            tracing::info!(pod = %pod_key, container = %c.name, error = %e, "container failed to start");
            self.ctx.events.warning(self.pod, "Failed", format!("Error: {e}"));
            self.wake_within(Duration::ZERO);
        } else {
            self.ctx.events.normal(self.pod, "Started", format!("Started container {}", c.name));
        }
        Ok(())
    }

    /// Restarts an exited container once its crash-loop back-off allows.
    async fn restart(&mut self, c: &Container, instances: &[api::ContainerStatus]) -> Result<()> {
        let Some(latest) = instances.first() else { return Ok(()) };
        let now = Instant::now();
        let cfg = self.ctx.config.backoff;
        let b = self.st.crash.entry(c.name.clone()).or_insert_with(|| Backoff::new(cfg));
        let fresh = self.st.counted.insert(latest.id.clone());
        if fresh {
            let ran = Duration::from_nanos((latest.finished_at - latest.started_at).max(0) as u64);
            b.ran_for(ran);
            b.failed(now);
        }
        let remaining = b.remaining(now);
        if fresh && !remaining.is_zero() {
            let msg =
                format!("Back-off restarting failed container {} in pod {}", c.name, key(self.pod));
            self.ctx.events.warning(self.pod, "BackOff", msg);
        }
        if !remaining.is_zero() {
            let message = format!(
                "back-off {}s restarting failed container={} pod={}",
                b.current().as_secs(),
                c.name,
                key(self.pod)
            );
            self.st.know.waiting.insert(c.name.clone(), ("CrashLoopBackOff".into(), message));
            self.wake_within(remaining);
            return Ok(());
        }
        let attempt = latest.metadata.as_ref().map(|m| m.attempt + 1).unwrap_or(1);
        self.start(c, attempt, instances).await
    }
}

/// A tracker for a container instance first seen by this worker: when the API already
/// reports this very instance (an agent restart), its started/ready state carries over.
fn seeded_tracker(
    pod: &Pod,
    c: &Container,
    id: &str,
    runtime_name: &str,
    started: Instant,
) -> ProbeTracker {
    let tracker = ProbeTracker::new(id, c, started);
    let full_id = format!("{runtime_name}://{id}");
    let known = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|s| s.container_id.as_deref() == Some(full_id.as_str())));
    match known {
        Some(s) => tracker.seeded(s.started.unwrap_or(false), s.ready),
        None => tracker,
    }
}

/// One pass over `pod`.
pub async fn sync_pod<R: Runtime>(
    ctx: &PodContext<R>,
    pod: &Pod,
    st: &mut WorkerState,
) -> Result<Step> {
    if pod.metadata.deletion_timestamp.is_some() {
        return termination::terminate(ctx, pod, st).await;
    }
    let uid = pod.uid().unwrap_or_default();
    let relist = ctx.config.pod_relist;
    if st.first_seen.is_none() {
        st.first_seen = Some(Instant::now());
        // Running before this worker saw it (an agent restart): no start to measure.
        st.start_measured = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    }
    if is_terminal(pod) {
        termination::stop_all(ctx, pod, &uid).await?;
        return Ok(Step::Wait(relist * 10));
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let mut obs = ctx.cache.observe(&ctx.runtime, &uid, false).await?;
    let policy = spec.restart_policy.clone();

    // Sandbox.
    if !obs.sandbox.as_ref().is_some_and(|s| s.ready) {
        let attempt = match &obs.sandbox {
            Some(dead) => {
                tracing::info!(pod = %key(pod), sandbox = %dead.id, "sandbox is not ready; recreating it");
                termination::remove_sandbox(&ctx.runtime, &dead.id, &uid).await?;
                dead.attempt + 1
            }
            None => 0,
        };
        let created = create_sandbox(ctx, pod, st, attempt).await;
        // The runtime changed (or may have): what the cache has is stale either way.
        obs = ctx.cache.observe(&ctx.runtime, &uid, true).await?;
        if let Some(step) = created? {
            return Ok(step);
        }
    }
    let Some(sb) = obs.sandbox.clone() else { return Ok(Step::Wait(relist)) };
    let mut pass = Pass {
        ctx,
        pod,
        st,
        sandbox_id: sb.id.clone(),
        sandbox_config: sandbox_config(pod, &ctx.config, sb.attempt),
        // A host-network pod's IP is the node's (what its status says, what probes and
        // `status.podIP` env vars use), not the sandbox's, which has none.
        pod_ip: if spec.host_network.unwrap_or(false) {
            ctx.host_ip.clone()
        } else {
            sb.ip.clone()
        },
        volume_paths: None,
        next: relist,
        acted: false,
    };

    // Init containers, in order.
    let mut initialized = true;
    for c in spec.init_containers.iter().flatten() {
        let instances = obs.containers.get(&c.name).cloned().unwrap_or_default();
        match instances.first() {
            Some(l) if is_exited(l) && l.exit_code == 0 => {
                pass.st.know.waiting.remove(&c.name);
                continue;
            }
            Some(l) if is_exited(l) => {
                if policy.as_deref() != Some("Never") {
                    pass.restart(c, &instances).await?;
                }
            }
            Some(_) => {}
            None => pass.start(c, 0, &[]).await?,
        }
        initialized = false;
        break;
    }

    // Containers.
    if initialized {
        for c in &spec.containers {
            let instances = obs.containers.get(&c.name).cloned().unwrap_or_default();
            match instances.first() {
                None => pass.start(c, 0, &[]).await?,
                Some(l) if is_running(l) => {
                    pass.st.know.waiting.remove(&c.name);
                    let started = Instant::now();
                    let tracker = pass.st.probes.entry(c.name.clone()).or_insert_with(|| {
                        seeded_tracker(pod, c, &l.id, &ctx.runtime_name, started)
                    });
                    if tracker.container_id() != l.id {
                        *tracker = ProbeTracker::new(&l.id, c, started);
                    }
                    let outcome = tracker.tick(&ctx.runtime, c, &pass.pod_ip).await;
                    for m in &outcome.unhealthy {
                        ctx.events.warning(pod, "Unhealthy", m.clone());
                    }
                    pass.st.know.ready.insert(c.name.clone(), tracker.ready(c));
                    pass.st.know.started.insert(c.name.clone(), tracker.started());
                    if let Some(next) = outcome.next_in {
                        pass.wake_within(next);
                    }
                    if let Some(why) = outcome.kill {
                        tracing::info!(pod = %key(pod), container = %c.name, %why, "killing container");
                        let probe = if why.starts_with("Startup") { "startup" } else { "liveness" };
                        ctx.events.normal(
                            pod,
                            "Killing",
                            format!("Container {} failed {probe} probe, will be restarted", c.name),
                        );
                        let grace = c
                            .liveness_probe
                            .as_ref()
                            .and_then(|p| p.termination_grace_period_seconds)
                            .or(spec.termination_grace_period_seconds)
                            .unwrap_or(30);
                        termination::stop_container(ctx, pod, c, &l.id, grace).await;
                        pass.acted = true;
                        pass.st.know.ready.insert(c.name.clone(), false);
                        pass.wake_within(Duration::ZERO);
                    }
                }
                Some(l) if is_exited(l) => {
                    pass.st.know.ready.insert(c.name.clone(), false);
                    if should_restart(policy.as_deref(), l.exit_code) {
                        pass.restart(c, &instances).await?;
                    } else {
                        pass.st.know.waiting.remove(&c.name);
                    }
                }
                Some(l) => {
                    // Created but never started (the agent died between the two calls).
                    pass.acted = true;
                    if let Err(e) = ctx.runtime.start_container(&l.id).await {
                        tracing::info!(pod = %key(pod), container = %c.name, error = %e, "starting a created container");
                    }
                }
            }
        }
    }
    pass.refresh_tokens().await;
    let next = pass.next;

    // Status.
    let obs = if pass.acted { ctx.cache.observe(&ctx.runtime, &uid, true).await? } else { obs };
    let computed = status::compute(pod, &obs, &st.know, &ctx.host_ip, &ctx.runtime_name);
    if !st.start_measured && computed.phase.as_deref() == Some("Running") {
        if let Some(seen) = st.first_seen {
            crate::metrics::pod_started(seen.elapsed());
        }
        st.start_measured = true;
    }
    let base = st.last_written.as_ref().or(pod.status.as_ref());
    if status::differs(base, &computed) {
        ctx.write_status(pod, &computed).await?;
        tracing::debug!(pod = %key(pod), phase = ?computed.phase, "status written");
        st.last_written = Some(computed);
    }
    Ok(Step::Wait(next))
}

/// Creates the pod's sandbox (volumes first, the sandbox image, then RunPodSandbox).
/// Returns a step when the pass cannot go on.
async fn create_sandbox<R: Runtime>(
    ctx: &PodContext<R>,
    pod: &Pod,
    st: &mut WorkerState,
    attempt: u32,
) -> Result<Option<Step>> {
    let relist = ctx.config.pod_relist;
    let cfg = sandbox_config(pod, &ctx.config, attempt);
    if let Err(e) = std::fs::create_dir_all(&cfg.log_directory) {
        tracing::warn!(dir = %cfg.log_directory, error = %e, "creating the pod log directory");
    }
    let backoff = ctx.config.backoff;
    if let Err(e) = ensure_image(
        &ctx.runtime,
        &ctx.config.sandbox_image,
        PullPolicy::IfNotPresent,
        &mut st.pulls,
        backoff,
        None,
    )
    .await
    {
        tracing::warn!(pod = %key(pod), reason = e.reason, message = %e.message, "sandbox image");
        let computed =
            status::compute(pod, &Observed::default(), &st.know, &ctx.host_ip, &ctx.runtime_name);
        if status::differs(st.last_written.as_ref().or(pod.status.as_ref()), &computed) {
            ctx.write_status(pod, &computed).await?;
            st.last_written = Some(computed);
        }
        return Ok(Some(Step::Wait(
            relist.max(st.pulls.remaining(&ctx.config.sandbox_image, Instant::now())),
        )));
    }
    tracing::info!(pod = %key(pod), attempt, "creating sandbox");
    if let Err(e) = ctx.runtime.run_pod_sandbox(cfg).await {
        ctx.events.warning(
            pod,
            "FailedCreatePodSandBox",
            format!("Failed to create pod sandbox: {e}"),
        );
        return Err(rt_err("RunPodSandbox", &key(pod))(e));
    }
    Ok(None)
}
