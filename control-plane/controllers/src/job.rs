//! The Job controller: runs up to `parallelism` pods until `completions` succeeded (in
//! Indexed mode: until each index 0..completions has a succeeded pod, see [`indexed`]),
//! fails the Job when failures exceed `backoffLimit` or it ran past
//! `activeDeadlineSeconds`, and deletes finished Jobs after `ttlSecondsAfterFinished` (the
//! TTL-after-finished controller's job, done here). Conditions follow 1.33: first
//! `SuccessCriteriaMet`/`FailureTarget`, then — once no pod is left running — `Complete`
//! (with completionTime) or `Failed`.
//!
//! Simplified against upstream: no `batch.kubernetes.io/job-tracking` pod finalizers and no
//! `uncountedTerminatedPods` bookkeeping: the counters are the finished pods present, kept
//! monotonic by taking the maximum with the previous status (the controller itself deletes
//! no finished pod). Failed pods are replaced after upstream's exponential backoff
//! ([`backoff_remaining`]). `podFailurePolicy` rules fail the Job, fail an index, ignore a
//! failure or count it ([`failure_policy`]); `podReplacementPolicy: Failed` (the default
//! with a podFailurePolicy) replaces a terminating pod only once it failed; `suspend`
//! deletes active pods.
//!
//! Indexed Jobs also take `backoffLimitPerIndex` (each pod of an index carries the failures
//! of the index so far in `batch.kubernetes.io/job-index-failure-count`; an index past the
//! limit is failed, listed in `status.failedIndexes` and not retried), `maxFailedIndexes`
//! and a `successPolicy` ([`success_policy`]). With backoffLimitPerIndex the backoff
//! before a replacement is each index's own, from its failures and its last failure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::Action;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods::{self, PodName};
use crate::context::Context;
use skiff_core::events::EventType;

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

/// Indexed completion mode, as upstream's `indexed_job_utils`.
pub mod indexed {
    use std::collections::BTreeSet;

    use k8s_openapi::api::core::v1::{
        EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodTemplateSpec,
    };

    /// The annotation and label that carry a pod's completion index.
    pub const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";
    /// With backoffLimitPerIndex: the failures of the pod's index before the pod.
    pub const FAILURE_COUNT_KEY: &str = "batch.kubernetes.io/job-index-failure-count";
    /// The environment variable every container gets the index in.
    pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

    /// A pod's completion index, from its annotation.
    pub fn index_of(pod: &Pod) -> Option<i32> {
        pod.metadata.annotations.as_ref()?.get(INDEX_KEY)?.parse().ok().filter(|i: &i32| *i >= 0)
    }

    /// The failures of the pod's index before it was created (0 without the annotation).
    pub fn failures_before(pod: &Pod) -> i32 {
        let annotations = pod.metadata.annotations.as_ref();
        let count = annotations.and_then(|a| a.get(FAILURE_COUNT_KEY)?.parse().ok());
        count.filter(|n: &i32| *n >= 0).unwrap_or(0)
    }

    /// The template for index `i` of job `job`: the index annotation and label, hostname
    /// `<job>-<i>`, and `JOB_COMPLETION_INDEX` (from the annotation, through the downward
    /// API) in every container that does not define it.
    pub fn template_for(template: &PodTemplateSpec, job: &str, i: i32) -> PodTemplateSpec {
        let mut t = template.clone();
        let meta = t.metadata.get_or_insert_with(Default::default);
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(INDEX_KEY.into(), i.to_string());
        meta.labels.get_or_insert_with(Default::default).insert(INDEX_KEY.into(), i.to_string());
        let spec = t.spec.get_or_insert_with(Default::default);
        spec.hostname = Some(format!("{job}-{i}"));
        let env = EnvVar {
            name: INDEX_ENV.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: format!("metadata.annotations['{INDEX_KEY}']"),
                }),
                ..Default::default()
            }),
        };
        let init = spec.init_containers.iter_mut().flatten();
        for c in spec.containers.iter_mut().chain(init) {
            let vars = c.env.get_or_insert_with(Vec::new);
            if !vars.iter().any(|v| v.name == INDEX_ENV) {
                vars.push(env.clone());
            }
        }
        t
    }

    /// Parse `status.completedIndexes` ("1,3-5,7"), keeping the indexes below
    /// `completions` (which an elastic Job may have lowered).
    pub fn parse(s: &str, completions: i32) -> BTreeSet<i32> {
        let mut out = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                out.extend(a.max(0)..=b.min(completions - 1));
            }
        }
        out
    }

    /// Format completed indexes as upstream: runs of three or more as `a-b`, two as `a,b`.
    pub fn format(indexes: &BTreeSet<i32>) -> String {
        let mut runs: Vec<(i32, i32)> = Vec::new();
        for &i in indexes {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == i => *last = i,
                _ => runs.push((i, i)),
            }
        }
        let parts: Vec<String> = runs
            .into_iter()
            .map(|(a, b)| match b - a {
                0 => a.to_string(),
                1 => format!("{a},{b}"),
                _ => format!("{a}-{b}"),
            })
            .collect();
        parts.join(",")
    }
}

/// `podFailurePolicy`, as upstream's `matchPodFailurePolicy`: the first rule that matches a
/// failed pod decides what its failure does.
pub mod failure_policy {
    use k8s_openapi::api::batch::v1::{PodFailurePolicy, PodFailurePolicyRule};
    use k8s_openapi::api::core::v1::Pod;

    /// What a failed pod does to its Job.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Verdict {
        /// Fails the Job, with upstream's message.
        FailJob(String),
        /// Not counted against `backoffLimit`.
        Ignore,
        /// Fails the pod's index (with `backoffLimitPerIndex`; counted too).
        FailIndex,
        /// Counted (no rule matched, or a Count rule).
        Count,
    }

    pub fn evaluate(policy: &PodFailurePolicy, pod: &Pod) -> Verdict {
        for (i, rule) in policy.rules.iter().enumerate() {
            if let Some(what) = matches(rule, pod) {
                return match rule.action.as_str() {
                    "FailJob" => {
                        Verdict::FailJob(format!("{what} matching FailJob rule at index {i}"))
                    }
                    "Ignore" => Verdict::Ignore,
                    "FailIndex" => Verdict::FailIndex,
                    _ => Verdict::Count,
                };
            }
        }
        Verdict::Count
    }

    /// How `rule` matches `pod`, in upstream's words, if it does: a container (init
    /// containers after the others) that exited non-zero with a code the operator selects,
    /// or a pod condition of the pattern's type and status.
    fn matches(rule: &PodFailurePolicyRule, pod: &Pod) -> Option<String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let status = pod.status.as_ref()?;
        if let Some(req) = &rule.on_exit_codes {
            let init = status.init_container_statuses.iter().flatten();
            for c in status.container_statuses.iter().flatten().chain(init) {
                if req.container_name.as_ref().is_some_and(|n| *n != c.name) {
                    continue;
                }
                let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                    continue;
                };
                let listed = req.values.contains(&t.exit_code);
                if t.exit_code != 0 && (req.operator == "In") == listed {
                    return Some(format!(
                        "Container {} for pod {ns}/{name} failed with exit code {}",
                        c.name, t.exit_code
                    ));
                }
            }
            return None;
        }
        let conditions = status.conditions.as_deref().unwrap_or_default();
        for pattern in rule.on_pod_conditions.iter().flatten() {
            let want = if pattern.status.is_empty() { "True" } else { pattern.status.as_str() };
            if conditions.iter().any(|c| c.type_ == pattern.type_ && c.status == want) {
                return Some(format!("Pod {ns}/{name} has condition {}", pattern.type_));
            }
        }
        None
    }
}

/// `successPolicy` (Indexed Jobs), as upstream's `matchSuccessPolicy`: the Job succeeds
/// once the succeeded indexes satisfy one rule.
pub mod success_policy {
    use std::collections::BTreeSet;

    use k8s_openapi::api::batch::v1::SuccessPolicy;

    /// The index of the first rule the succeeded indexes satisfy: all of `succeededIndexes`
    /// (or at least `succeededCount` of them), or at least `succeededCount` indexes.
    pub fn matched(
        policy: &SuccessPolicy,
        completions: i32,
        succeeded: &BTreeSet<i32>,
    ) -> Option<usize> {
        policy.rules.iter().position(|rule| {
            let (done, wanted) = match &rule.succeeded_indexes {
                Some(listed) => {
                    let listed = super::indexed::parse(listed, completions);
                    // A rule naming no index (none parses) is skipped, as upstream does.
                    if listed.is_empty() {
                        return false;
                    }
                    (listed.intersection(succeeded).count(), Some(listed.len()))
                }
                None => (succeeded.len(), None),
            };
            match (rule.succeeded_count, wanted) {
                (Some(n), _) => i32::try_from(done).unwrap_or(i32::MAX) >= n,
                (None, Some(wanted)) => done >= wanted,
                (None, None) => false,
            }
        })
    }
}

/// Upstream's pod failure backoff: 10 s after the first failure since the last success,
/// doubling with each further one, at most 10 minutes.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// When a finished pod finished (upstream's `getFinishedTime`): its Ready=False transition,
/// else its last container's finish, else its deletion, else its creation.
fn finish_time(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref();
    let not_ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "False"))
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
    let containers = || {
        status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| {
                c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0)
            })
            .max()
    };
    not_ready
        .or_else(containers)
        .or_else(|| pod.metadata.deletion_timestamp.as_ref().map(|t| t.0))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// How long to wait before creating pods to replace failed ones (upstream's
/// `backoffRecord.getRemainingTime`): zero when no pod failed since the last success.
pub fn backoff_remaining(pods: &[Pod], now: Timestamp) -> Duration {
    fn finished<'a>(all: &'a [Pod], phase: &'static str) -> impl Iterator<Item = Timestamp> + 'a {
        all.iter().filter(move |p| pods::phase(p) == phase).filter_map(finish_time)
    }
    let last_success = finished(pods, "Succeeded").max();
    let failures: Vec<Timestamp> =
        finished(pods, "Failed").filter(|t| last_success.is_none_or(|s| *t > s)).collect();
    let Some(last) = failures.iter().max() else {
        return Duration::ZERO;
    };
    delay_left(failures.len(), *last, now)
}

/// What is left at `now` of the backoff after `failures` failures, the last at `last`.
fn delay_left(failures: usize, last: Timestamp, now: Timestamp) -> Duration {
    let doublings = u32::try_from(failures.saturating_sub(1)).unwrap_or(u32::MAX).min(16);
    let backoff = BACKOFF_BASE.saturating_mul(1 << doublings).min(BACKOFF_MAX);
    let elapsed = Duration::try_from(last.duration_until(now)).unwrap_or(Duration::ZERO);
    backoff.saturating_sub(elapsed)
}

/// Run the Job controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let cctx = Ctx::new(client.clone(), "job-controller");
    let controller = controller(&ctx.informers.all::<Job>())
        .await
        .owns_stream(ctx.informers.all::<Pod>().touched());
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
        let finished_at = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now);
        let at = skiff_core::time::add_secs(finished_at, i64::from(ttl));
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
    let is_indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions.unwrap_or(0);
    // Indexed: the completed indexes (the previous status's too: their pods may be gone).
    let mut completed: BTreeSet<i32> = BTreeSet::new();
    if is_indexed {
        let before = old.completed_indexes.as_deref().unwrap_or_default();
        completed.extend(indexed::parse(before, completions));
        completed.extend(
            owned
                .iter()
                .filter(|p| pods::phase(p) == "Succeeded")
                .filter_map(indexed::index_of)
                .filter(|i| *i < completions),
        );
    }
    // podFailurePolicy: what each failed pod does.
    let verdict = |p: &Pod| match &spec.pod_failure_policy {
        Some(policy) => failure_policy::evaluate(policy, p),
        None => failure_policy::Verdict::Count,
    };
    // backoffLimitPerIndex: the failures of each index (the newest pod of an index carries
    // those before it) and the failed indexes (the previous status's too).
    let per_index = spec.backoff_limit_per_index.filter(|_| is_indexed);
    let mut index_failures: BTreeMap<i32, i32> = BTreeMap::new();
    let mut failed_indexes: BTreeSet<i32> = BTreeSet::new();
    if let Some(limit) = per_index {
        let before = old.failed_indexes.as_deref().unwrap_or_default();
        failed_indexes.extend(indexed::parse(before, completions));
        for p in &owned {
            let Some(i) = indexed::index_of(p).filter(|i| *i < completions) else { continue };
            let mut n = indexed::failures_before(p);
            let mut fail_index = false;
            if pods::phase(p) == "Failed" {
                match verdict(p) {
                    failure_policy::Verdict::Ignore => {}
                    failure_policy::Verdict::FailIndex => (n, fail_index) = (n + 1, true),
                    _ => n += 1,
                }
            }
            let count = index_failures.entry(i).or_default();
            *count = (*count).max(n);
            if fail_index || n > limit {
                failed_indexes.insert(i);
            }
        }
        failed_indexes.retain(|i| !completed.contains(i));
    }
    let mut active: Vec<&Pod> = owned.iter().filter(|p| pods::is_active(p)).collect();
    // Indexed: an active pod without a pending index of its own (none, out of range,
    // completed, failed, or a second pod for it) is deleted.
    let mut surplus: Vec<&Pod> = Vec::new();
    if is_indexed {
        let mut seen = BTreeSet::new();
        active.retain(|p| {
            let keep = indexed::index_of(p).is_some_and(|i| {
                i < completions
                    && !completed.contains(&i)
                    && !failed_indexes.contains(&i)
                    && seen.insert(i)
            });
            if !keep {
                surplus.push(p);
            }
            keep
        });
    }
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
    let succeeded = if is_indexed {
        i32::try_from(completed.len()).unwrap_or(i32::MAX)
    } else {
        count(&|p| pods::phase(p) == "Succeeded").max(old.succeeded.unwrap_or(0))
    };
    // podFailurePolicy: ignored failures do not count; the earliest failure a FailJob rule
    // matches fails the Job.
    let counted =
        |p: &Pod| pods::phase(p) == "Failed" && verdict(p) != failure_policy::Verdict::Ignore;
    let failed_pods = count(&counted).max(old.failed.unwrap_or(0));
    let mut failed_by_policy: Vec<&Pod> =
        owned.iter().filter(|p| pods::phase(p) == "Failed").collect();
    failed_by_policy.sort_by_key(|p| finish_time(p));
    let fail_job = failed_by_policy.into_iter().find_map(|p| match verdict(p) {
        failure_policy::Verdict::FailJob(message) => Some(message),
        _ => None,
    });
    let mut status = JobStatus {
        start_time: old.start_time.clone(),
        succeeded: crate::context::omit_zero(succeeded),
        failed: crate::context::omit_zero(failed_pods),
        conditions: old.conditions.clone(),
        uncounted_terminated_pods: Some(UncountedTerminatedPods::default()),
        completed_indexes: (is_indexed && !completed.is_empty())
            .then(|| indexed::format(&completed)),
        failed_indexes: per_index.map(|_| indexed::format(&failed_indexes)),
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
        .map(|(s, start)| skiff_core::time::add_secs(start, s));
    let deadline_passed = deadline_at.is_some_and(|d| d <= now);

    let target_reached = condition(&status, "FailureTarget").is_some()
        || condition(&status, "SuccessCriteriaMet").is_some();
    let mut want_active: Option<i32> = None;
    let failed_n = i32::try_from(failed_indexes.len()).unwrap_or(i32::MAX);
    let index_failure = match (per_index, spec.max_failed_indexes) {
        (None, _) => None,
        (Some(_), Some(max)) if failed_n > max => Some((
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes",
        )),
        // Every index finished, some of them failed.
        (Some(_), _) if failed_n > 0 && succeeded + failed_n >= completions => {
            Some(("FailedIndexes", "Job has failed indexes"))
        }
        _ => None,
    };
    let policy_success = spec
        .success_policy
        .as_ref()
        .filter(|_| is_indexed)
        .and_then(|p| success_policy::matched(p, completions, &completed));
    if let Some(message) = fail_job.filter(|_| !target_reached) {
        add_condition(&mut status, "FailureTarget", "PodFailurePolicy", &message, now);
        ctx.recorder.record(job.as_ref(), EventType::Warning, "PodFailurePolicy", &message).await;
    } else if let Some((reason, message)) = index_failure.filter(|_| !target_reached) {
        add_condition(&mut status, "FailureTarget", reason, message, now);
        ctx.recorder.record(job.as_ref(), EventType::Warning, reason, message).await;
    } else if !target_reached && !suspended {
        let active_n = i32::try_from(active.len()).unwrap_or(i32::MAX);
        let decision = decide(
            // Failed indexes are not run again.
            spec.completions.map(|c| c - failed_n),
            spec.parallelism.unwrap_or(1),
            spec.backoff_limit.unwrap_or(6),
            deadline_passed,
            active_n,
            succeeded,
            failed_pods + restarts,
        );
        match (decision, policy_success) {
            // Failures first, then the success policy, as upstream.
            (Decision::Fail(reason, msg), _) => {
                add_condition(&mut status, "FailureTarget", reason, msg, now);
                ctx.recorder.record(job.as_ref(), EventType::Warning, reason, msg).await;
            }
            (_, Some(rule)) => {
                let message = format!("Matched rules at index {rule}");
                add_condition(&mut status, "SuccessCriteriaMet", "SuccessPolicy", &message, now);
            }
            (Decision::Succeed, None) => {
                add_condition(
                    &mut status,
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                );
            }
            (Decision::Run(n), None) => want_active = Some(n),
        }
    }
    if suspended {
        want_active = Some(0);
    }
    let target = want_active.unwrap_or(0);
    let active_n = i32::try_from(active.len()).unwrap_or(i32::MAX);
    // podReplacementPolicy Failed: a pod still terminating is replaced only once it failed.
    let held: Vec<&Pod> = if spec.pod_replacement_policy.as_deref() == Some("Failed") {
        owned
            .iter()
            .filter(|p| {
                pods::is_terminating(p) && !matches!(pods::phase(p), "Succeeded" | "Failed")
            })
            .collect()
    } else {
        Vec::new()
    };
    // Replacements for failed pods wait out the backoff: the Job's, or with
    // backoffLimitPerIndex each index's own (its failures so far, from its last failure).
    let backoff = if active_n < target && per_index.is_none() {
        backoff_remaining(&owned, now)
    } else {
        Duration::ZERO
    };
    let index_wait = |i: i32| {
        let failed = owned.iter().filter(|p| pods::phase(p) == "Failed");
        let last = failed.filter(|p| indexed::index_of(p) == Some(i)).filter_map(finish_time).max();
        let failures = usize::try_from(index_failures.get(&i).copied().unwrap_or(0)).unwrap_or(0);
        match last {
            Some(last) if per_index.is_some() => delay_left(failures.max(1), last, now),
            _ => Duration::ZERO,
        }
    };
    // The soonest an index held back by its backoff may run.
    let mut index_backoff: Option<Duration> = None;
    let mut created = 0i32;
    for pod in &surplus {
        pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
        let msg = format!("Deleted pod: {}", pod.name_any());
        ctx.recorder.record(job.as_ref(), EventType::Normal, "SuccessfulDelete", &msg).await;
    }
    if active_n > target {
        let mut victims = active.clone();
        victims.sort_by(|a, b| pods::deletion_order(a, b));
        for pod in victims.iter().take(usize::try_from(active_n - target).unwrap_or(0)) {
            pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
            let msg = format!("Deleted pod: {}", pod.name_any());
            ctx.recorder.record(job.as_ref(), EventType::Normal, "SuccessfulDelete", &msg).await;
        }
    } else if active_n < target && backoff.is_zero() {
        let missing = usize::try_from(target - active_n).unwrap_or(0).saturating_sub(held.len());
        let new_pods: Vec<Pod> = if is_indexed {
            // The lowest pending indexes.
            let running: BTreeSet<i32> =
                active.iter().chain(&held).filter_map(|p| indexed::index_of(p)).collect();
            (0..completions)
                .filter(|i| {
                    !completed.contains(i) && !failed_indexes.contains(i) && !running.contains(i)
                })
                .filter(|i| {
                    let wait = index_wait(*i);
                    if !wait.is_zero() {
                        index_backoff = Some(index_backoff.map_or(wait, |w| w.min(wait)));
                    }
                    wait.is_zero()
                })
                .take(missing)
                .map(|i| {
                    let mut template = indexed::template_for(&spec.template, &name, i);
                    if per_index.is_some() {
                        let failures = index_failures.get(&i).copied().unwrap_or(0);
                        let meta = template.metadata.get_or_insert_with(Default::default);
                        meta.annotations
                            .get_or_insert_with(Default::default)
                            .insert(indexed::FAILURE_COUNT_KEY.into(), failures.to_string());
                    }
                    let prefix = format!("{name}-{i}-");
                    pods::pod_from_template(
                        job.as_ref(),
                        &template,
                        PodName::Generate(&prefix),
                        &[],
                    )
                })
                .collect()
        } else {
            let pod = pods::pod_from_template(
                job.as_ref(),
                &spec.template,
                PodName::Generate(&format!("{name}-")),
                &[],
            );
            vec![pod; missing]
        };
        created = i32::try_from(new_pods.len()).unwrap_or(i32::MAX);
        for pod in &new_pods {
            if let Some(p) = pods::create_pod(&pod_api, &name, pod).await.map_err(perr)? {
                let msg = format!("Created pod: {}", p.name_any());
                ctx.recorder
                    .record(job.as_ref(), EventType::Normal, "SuccessfulCreate", &msg)
                    .await;
            }
        }
    }
    // Pods not finished yet (active, or terminating) hold back the final condition.
    let running = owned.iter().any(|p| !matches!(pods::phase(p), "Succeeded" | "Failed"));
    // Pods running now: the target once deleted down to it, else those active and created.
    let running_now = if active_n > target { target } else { active_n + created };
    status.active = crate::context::omit_zero(if want_active.is_some() { running_now } else { 0 });
    status.ready = Some(count(&|p| pods::is_active(p) && pods::is_ready(p)));
    status.terminating = Some(count(&|p| {
        pods::is_terminating(p) && !matches!(pods::phase(p), "Succeeded" | "Failed")
    }));
    if !running {
        if let Some(c) = condition(&status, "FailureTarget").cloned() {
            let reason = c.reason.unwrap_or_default();
            add_condition(&mut status, "Failed", &reason, c.message.as_deref().unwrap_or(""), now);
        } else if let Some(c) = condition(&status, "SuccessCriteriaMet").cloned() {
            let reason = c.reason.unwrap_or_default();
            add_condition(
                &mut status,
                "Complete",
                &reason,
                c.message.as_deref().unwrap_or(""),
                now,
            );
            status.completion_time = Some(Time(now));
            ctx.recorder
                .record(job.as_ref(), EventType::Normal, "Completed", "Job completed")
                .await;
        }
    }
    if job.status.as_ref() != Some(&status) {
        let patch = crate::context::status_patch(&status, "batch", "Job");
        match job_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { job: name, source }),
        }
    }
    // Wake up for the deadline, or when the backoff is over.
    let deadline = match deadline_at {
        Some(d) if d > now && !target_reached => {
            let wait = u64::try_from(now.duration_until(d).as_secs()).unwrap_or(0) + 1;
            Some(Duration::from_secs(wait))
        }
        _ => None,
    };
    let backoff = (!backoff.is_zero()).then_some(backoff).or(index_backoff);
    match deadline.into_iter().chain(backoff).min() {
        Some(wait) => Ok(Action::requeue(wait)),
        None => Ok(Action::await_change()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_policy_rules_match_in_order() {
        let policy: k8s_openapi::api::batch::v1::SuccessPolicy =
            serde_json::from_value(serde_json::json!({"rules": [
                {"succeededIndexes": "0,3"},
                {"succeededIndexes": "1-4", "succeededCount": 2},
                {"succeededCount": 4}]}))
            .unwrap();
        let done = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
        let matched = |v: &[i32]| success_policy::matched(&policy, 5, &done(v));
        assert_eq!(matched(&[]), None);
        assert_eq!(matched(&[0]), None);
        assert_eq!(matched(&[0, 3]), Some(0), "all listed indexes");
        assert_eq!(matched(&[0, 2]), None, "one of 1-4");
        assert_eq!(matched(&[2, 4]), Some(1), "two of 1-4");
        assert_eq!(matched(&[0, 1, 2, 4]), Some(1), "the first rule that matches");
        let nothing: k8s_openapi::api::batch::v1::SuccessPolicy =
            serde_json::from_value(serde_json::json!({"rules": [{"succeededIndexes": ""}]}))
                .unwrap();
        assert_eq!(success_policy::matched(&nothing, 5, &done(&[])), None, "no index named");
    }

    #[test]
    fn completed_indexes_read_and_print_as_upstream() {
        let set = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
        assert_eq!(indexed::format(&set(&[])), "");
        assert_eq!(indexed::format(&set(&[1])), "1");
        assert_eq!(indexed::format(&set(&[1, 2])), "1,2");
        assert_eq!(indexed::format(&set(&[0, 1, 2, 4, 6, 7, 8, 9])), "0-2,4,6-9");
        assert_eq!(indexed::parse("0-2,4,6-9", 10), set(&[0, 1, 2, 4, 6, 7, 8, 9]));
        assert_eq!(indexed::parse("1,2", 10), set(&[1, 2]));
        assert_eq!(indexed::parse("", 10), set(&[]));
        // Only indexes below completions, however wide the range.
        assert_eq!(indexed::parse("0-2147483646,7", 3), set(&[0, 1, 2]));
        assert_eq!(indexed::parse("x,-1,2-1", 3), set(&[]));
    }

    #[test]
    fn indexed_pods_carry_their_index() {
        let template: k8s_openapi::api::core::v1::PodTemplateSpec = serde_json::from_value(
            serde_json::json!({"spec": {
                "initContainers": [{"name": "i", "env": [{"name": "JOB_COMPLETION_INDEX", "value": "mine"}]}],
                "containers": [{"name": "c"}],
            }}),
        )
        .unwrap();
        let t = indexed::template_for(&template, "train", 4);
        let meta = t.metadata.unwrap();
        assert_eq!(meta.annotations.unwrap()[indexed::INDEX_KEY], "4");
        assert_eq!(meta.labels.unwrap()[indexed::INDEX_KEY], "4");
        let spec = t.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("train-4"));
        let env = &spec.containers[0].env.as_ref().unwrap()[0];
        assert_eq!(env.name, "JOB_COMPLETION_INDEX");
        assert_eq!(
            env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        let init_env = spec.init_containers.unwrap()[0].env.clone().unwrap();
        assert_eq!(init_env.len(), 1, "a container's own JOB_COMPLETION_INDEX is kept");
        assert_eq!(init_env[0].value.as_deref(), Some("mine"));
    }

    #[test]
    fn failed_pods_are_replaced_after_an_exponential_backoff() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |s: i64| t0 + k8s_openapi::jiff::SignedDuration::from_secs(s);
        let pod = |phase: &str, finished: i64| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "creationTimestamp": t0.to_string()},
                "status": {"phase": phase, "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": at(finished).to_string()}]},
            }))
            .unwrap()
        };
        let secs = Duration::from_secs;
        assert_eq!(backoff_remaining(&[], at(0)), Duration::ZERO);
        // One failure: 10 s from when it finished.
        let one = [pod("Failed", 100)];
        assert_eq!(backoff_remaining(&one, at(104)), secs(6));
        assert_eq!(backoff_remaining(&one, at(110)), Duration::ZERO);
        // Three: 40 s after the last.
        let three = [pod("Failed", 100), pod("Failed", 120), pod("Failed", 150)];
        assert_eq!(backoff_remaining(&three, at(150)), secs(40));
        // A success resets the count: only failures after it count.
        let reset = [pod("Failed", 100), pod("Succeeded", 130), pod("Failed", 150)];
        assert_eq!(backoff_remaining(&reset, at(150)), secs(10));
        // At most 10 minutes.
        let many: Vec<Pod> = (0..12).map(|i| pod("Failed", i)).collect();
        assert_eq!(backoff_remaining(&many, at(11)), secs(600));
        // Without a Ready=False transition, the container's finish time counts.
        let mut p = pod("Failed", 0);
        p.status.as_mut().unwrap().conditions = None;
        p.status.as_mut().unwrap().container_statuses = Some(vec![
            serde_json::from_value(serde_json::json!({
                "name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": 1, "finishedAt": at(50).to_string()}},
            }))
            .unwrap(),
        ]);
        assert_eq!(backoff_remaining(&[p], at(55)), secs(5));
    }

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

    #[test]
    fn failure_policy_rules_match_in_order() {
        use super::failure_policy::{Verdict, evaluate};
        let policy: k8s_openapi::api::batch::v1::PodFailurePolicy =
            serde_json::from_value(serde_json::json!({"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}},
                {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [5]}},
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [5]}},
            ]}))
            .unwrap();
        let pod = |code: i32, container: &str, condition: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "status": {
                    "phase": "Failed",
                    "conditions": condition.map(|c| vec![serde_json::json!({"type": c, "status": "True"})]),
                    "containerStatuses": [
                        {"name": "side", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                         "state": {"terminated": {"exitCode": 0}}},
                        {"name": container, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                         "state": {"terminated": {"exitCode": code}}},
                    ],
                },
            }))
            .unwrap()
        };
        assert_eq!(evaluate(&policy, &pod(3, "main", Some("DisruptionTarget"))), Verdict::Ignore);
        assert_eq!(
            evaluate(&policy, &pod(3, "main", None)),
            Verdict::FailJob(
                "Container main for pod ns/p failed with exit code 3 matching FailJob rule at index 1"
                    .into()
            )
        );
        // Code 3 from another container: not rule 1; NotIn [5] counts it (exit code 0 of
        // the side container never matches).
        assert_eq!(evaluate(&policy, &pod(3, "other", None)), Verdict::Count);
        assert!(
            matches!(evaluate(&policy, &pod(5, "other", None)), Verdict::FailJob(m) if m.ends_with("rule at index 3"))
        );
    }
}
