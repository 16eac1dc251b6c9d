//! The Job controller (NonIndexed completion mode): runs up to `parallelism` pods until
//! `completions` succeeded, fails the Job when failures exceed `backoffLimit` or it ran past
//! `activeDeadlineSeconds`, and deletes finished Jobs after `ttlSecondsAfterFinished` (the
//! TTL-after-finished controller's job, done here). Conditions follow 1.33: first
//! `SuccessCriteriaMet`/`FailureTarget`, then — once no pod is left running — `Complete`
//! (with completionTime) or `Failed`.
//!
//! Simplified against upstream: no `batch.kubernetes.io/job-tracking` pod finalizers and no
//! `uncountedTerminatedPods` bookkeeping: the counters are the finished pods present, kept
//! monotonic by taking the maximum with the previous status (the controller itself deletes
//! no finished pod). No exponential delay before recreating failed pods, no Indexed mode,
//! podFailurePolicy, successPolicy or backoffLimitPerIndex; `suspend` deletes active pods.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use super::Context;
use super::events::EventType;
use super::informer::{WorkloadCtx as Ctx, run_controller};
use super::pods::{self, PodName};

/// Errors of one Job reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("managing the pods of job {job}")]
    Pods {
        job: String,
        #[source]
        source: pods::Error,
    },
    #[error("updating the status of job {job}")]
    Status {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting finished job {job} after its TTL")]
    DeleteFinished {
        job: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the Job controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let cctx = Ctx::new(client.clone(), "job-controller");
    let controller = Controller::new(Api::<Job>::all(client.clone()), watcher::Config::default())
        .owns(Api::<Pod>::all(client), watcher::Config::default());
    run_controller(controller, cctx, reconcile).await;
}

fn condition<'a>(s: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
    s.conditions.iter().flatten().find(|c| c.type_ == type_ && c.status == "True")
}

fn add_condition(s: &mut JobStatus, type_: &str, reason: &str, message: &str, now: Timestamp) {
    if condition(s, type_).is_some() {
        return;
    }
    s.conditions.get_or_insert_with(Vec::new).push(JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    });
}

/// What the Job should do next, from its counters (pure, unit-tested).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Fail: (reason, message) of FailureTarget/Failed.
    Fail(&'static str, &'static str),
    /// Success criteria met.
    Succeed,
    /// Keep this many pods active.
    Run(i32),
}

/// Decide from spec and counters: backoff limit, deadline, completions, parallelism.
pub fn decide(
    completions: Option<i32>,
    parallelism: i32,
    backoff_limit: i32,
    deadline_passed: bool,
    active: i32,
    succeeded: i32,
    failed: i32,
) -> Decision {
    if failed > backoff_limit {
        return Decision::Fail(
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        );
    }
    if deadline_passed {
        return Decision::Fail("DeadlineExceeded", "Job was active longer than specified deadline");
    }
    match completions {
        Some(c) if succeeded >= c => Decision::Succeed,
        Some(c) => Decision::Run(parallelism.min(c - succeeded).max(0)),
        // Work-queue jobs: done when one pod succeeded and the rest finished.
        None if succeeded > 0 && active == 0 => Decision::Succeed,
        None if succeeded > 0 => Decision::Run(active.min(parallelism)),
        None => Decision::Run(parallelism),
    }
}

async fn reconcile(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let now = pods::now();
    let perr = |source| Error::Pods { job: name.clone(), source };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let spec = job.spec.clone().unwrap_or_default();
    let old = job.status.clone().unwrap_or_default();
    let job_api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);

    // Finished: only the TTL is left to do.
    let finished = condition(&old, "Complete").or_else(|| condition(&old, "Failed"));
    if let Some(c) = finished {
        let Some(ttl) = spec.ttl_seconds_after_finished else {
            return Ok(Action::await_change());
        };
        let at = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now)
            + SignedDuration::from_secs(i64::from(ttl));
        if at > now {
            let wait = u64::try_from(now.duration_until(at).as_secs()).unwrap_or(0) + 1;
            return Ok(Action::requeue(Duration::from_secs(wait)));
        }
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..Default::default()
        };
        return match job_api.delete(&name, &dp).await {
            Ok(_) => Ok(Action::await_change()),
            Err(e) if pods::is_not_found(&e) => Ok(Action::await_change()),
            Err(source) => Err(Error::DeleteFinished { job: name, source }),
        };
    }

    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let all = pods::list_pods(&pod_api, &ns).await.map_err(perr)?;
    let owned =
        pods::claim(&pod_api, job.as_ref(), spec.selector.as_ref(), all).await.map_err(perr)?;
    let active: Vec<&Pod> = owned.iter().filter(|p| pods::is_active(p)).collect();
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(owned.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let restarts_on_failure =
        spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("OnFailure");
    let restarts: i32 = if restarts_on_failure {
        active
            .iter()
            .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
            .flatten()
            .map(|c| c.restart_count)
            .sum()
    } else {
        0
    };
    let succeeded = count(&|p| pods::phase(p) == "Succeeded").max(old.succeeded.unwrap_or(0));
    let failed_pods = count(&|p| pods::phase(p) == "Failed").max(old.failed.unwrap_or(0));
    let mut status = JobStatus {
        start_time: old.start_time.clone(),
        succeeded: super::omit_zero(succeeded),
        failed: super::omit_zero(failed_pods),
        conditions: old.conditions.clone(),
        uncounted_terminated_pods: Some(UncountedTerminatedPods::default()),
        ..Default::default()
    };
    let suspended = spec.suspend == Some(true);
    if !suspended && status.start_time.is_none() {
        status.start_time = Some(Time(now));
    }
    let start = status.start_time.as_ref().map(|t| t.0);
    let deadline_at = spec
        .active_deadline_seconds
        .zip(start)
        .map(|(s, start)| start + SignedDuration::from_secs(s));
    let deadline_passed = deadline_at.is_some_and(|d| d <= now);

    let target_reached = condition(&status, "FailureTarget").is_some()
        || condition(&status, "SuccessCriteriaMet").is_some();
    let mut want_active: Option<i32> = None;
    if !target_reached && !suspended {
        let active_n = i32::try_from(active.len()).unwrap_or(i32::MAX);
        match decide(
            spec.completions,
            spec.parallelism.unwrap_or(1),
            spec.backoff_limit.unwrap_or(6),
            deadline_passed,
            active_n,
            succeeded,
            failed_pods + restarts,
        ) {
            Decision::Fail(reason, msg) => {
                add_condition(&mut status, "FailureTarget", reason, msg, now);
                ctx.recorder.record(job.as_ref(), EventType::Warning, reason, msg).await;
            }
            Decision::Succeed => {
                add_condition(
                    &mut status,
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                );
            }
            Decision::Run(n) => want_active = Some(n),
        }
    }
    if suspended {
        want_active = Some(0);
    }
    let target = want_active.unwrap_or(0);
    let active_n = i32::try_from(active.len()).unwrap_or(i32::MAX);
    if active_n > target {
        let mut victims = active.clone();
        victims.sort_by(|a, b| pods::deletion_order(a, b));
        for pod in victims.iter().take(usize::try_from(active_n - target).unwrap_or(0)) {
            pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
            let msg = format!("Deleted pod: {}", pod.name_any());
            ctx.recorder.record(job.as_ref(), EventType::Normal, "SuccessfulDelete", &msg).await;
        }
    } else if active_n < target {
        let pod = pods::pod_from_template(
            job.as_ref(),
            &spec.template,
            PodName::Generate(&format!("{name}-")),
            &[],
        );
        for _ in 0..(target - active_n) {
            if let Some(p) = pods::create_pod(&pod_api, &name, &pod).await.map_err(perr)? {
                let msg = format!("Created pod: {}", p.name_any());
                ctx.recorder
                    .record(job.as_ref(), EventType::Normal, "SuccessfulCreate", &msg)
                    .await;
            }
        }
    }
    // Pods not finished yet (active, or terminating) hold back the final condition.
    let running = owned.iter().any(|p| !matches!(pods::phase(p), "Succeeded" | "Failed"));
    status.active = super::omit_zero(if want_active.is_some() { target } else { 0 });
    status.ready = Some(count(&|p| pods::is_active(p) && pods::is_ready(p)));
    status.terminating = Some(count(&|p| {
        pods::is_terminating(p) && !matches!(pods::phase(p), "Succeeded" | "Failed")
    }));
    if !running {
        if let Some(c) = condition(&status, "FailureTarget").cloned() {
            let reason = c.reason.unwrap_or_default();
            add_condition(&mut status, "Failed", &reason, c.message.as_deref().unwrap_or(""), now);
        } else if condition(&status, "SuccessCriteriaMet").is_some() {
            add_condition(
                &mut status,
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
            );
            status.completion_time = Some(Time(now));
            ctx.recorder
                .record(job.as_ref(), EventType::Normal, "Completed", "Job completed")
                .await;
        }
    }
    if job.status.as_ref() != Some(&status) {
        let patch = super::status_patch(&status, "batch", "Job");
        match job_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { job: name, source }),
        }
    }
    // Wake up for the deadline.
    match deadline_at {
        Some(d) if d > now && !target_reached => {
            let wait = u64::try_from(now.duration_until(d).as_secs()).unwrap_or(0) + 1;
            Ok(Action::requeue(Duration::from_secs(wait)))
        }
        _ => Ok(Action::await_change()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        // completions 3, parallelism 2.
        assert_eq!(decide(Some(3), 2, 6, false, 0, 0, 0), Decision::Run(2));
        assert_eq!(decide(Some(3), 2, 6, false, 2, 2, 0), Decision::Run(1));
        assert_eq!(decide(Some(3), 2, 6, false, 0, 3, 0), Decision::Succeed);
        // backoffLimit 2: the third failure fails the job.
        assert_eq!(decide(Some(1), 1, 2, false, 0, 0, 2), Decision::Run(1));
        assert!(matches!(
            decide(Some(1), 1, 2, false, 0, 0, 3),
            Decision::Fail("BackoffLimitExceeded", _)
        ));
        assert!(matches!(
            decide(Some(1), 1, 2, true, 1, 0, 0),
            Decision::Fail("DeadlineExceeded", _)
        ));
        // Work queue.
        assert_eq!(decide(None, 3, 6, false, 0, 0, 0), Decision::Run(3));
        assert_eq!(decide(None, 3, 6, false, 2, 1, 0), Decision::Run(2));
        assert_eq!(decide(None, 3, 6, false, 0, 1, 0), Decision::Succeed);
    }
}
