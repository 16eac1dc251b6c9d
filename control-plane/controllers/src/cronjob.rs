//! The CronJob controller, as upstream's `cronjob_controllerv2`: at each time the schedule
//! names (on the wall clock of `spec.timeZone`, UTC without one) it creates a Job from
//! `jobTemplate` named `<cronjob>-<minutes since the epoch>` (the name is the lock against
//! creating one twice), honouring `suspend`, `startingDeadlineSeconds` and
//! `concurrencyPolicy` (Allow, Forbid, Replace). Status keeps the active Jobs,
//! `lastScheduleTime` and `lastSuccessfulTime`; finished Jobs past the history limits are
//! deleted, oldest first.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;

use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods;
use crate::context::Context;
use skiff_core::cron::Schedule;
use skiff_core::events::EventType;

/// The annotation a Job gets with the time it was scheduled for (RFC 3339, in the
/// CronJob's time zone).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// Upstream's `nextScheduleDelta`: how long after a scheduled time the CronJob is looked at.
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);

/// More missed start times than this get a `TooManyMissedTimes` warning.
const MANY_MISSED: usize = 100;

/// Errors of one CronJob reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading cronjob {cronjob}")]
    Read {
        cronjob: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the jobs of cronjob {cronjob}")]
    ListJobs {
        cronjob: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating job {job}")]
    CreateJob {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting job {job}")]
    DeleteJob {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the status of cronjob {cronjob}")]
    Status {
        cronjob: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the CronJob controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();

    let controller = controller(&ctx.informers.all::<CronJob>())
        .await
        .owns_stream(ctx.informers.all::<Job>().touched());
    run_controller(controller, Ctx::new(client, "cronjob-controller"), reconcile).await;
}

async fn reconcile(cj: Arc<CronJob>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = cj.namespace().unwrap_or_default();
    let name = cj.name_any();
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = cj.uid().unwrap_or_default();
    let jobs: Vec<Job> = jobs_api
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::ListJobs { cronjob: name.clone(), source })?
        .items
        .into_iter()
        .filter(|j| pods::controller_ref(&j.metadata).is_some_and(|r| r.uid == uid))
        .collect();
    // A Job of ours missing from `active` may be one this controller just created, whose
    // status write the watch has not delivered yet: read the CronJob itself first.
    let cj = if jobs.iter().any(|j| finished_condition(j).is_none() && !listed(&cj, j)) {
        let api: Api<CronJob> = Api::namespaced(ctx.client.clone(), &ns);
        match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Read { cronjob: name, source }),
        }
    } else {
        cj
    };
    let old_status = cj.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    sync_active(&ctx, &cj, &jobs, &mut status).await;

    let now = pods::now();
    let mut started = Ok(());
    let next = match schedule_and_zone(&ctx, &cj).await {
        Some((schedule, tz)) if !suspended(&cj) && cj.metadata.deletion_timestamp.is_none() => {
            started = start_due_job(&ctx, &cj, &jobs_api, &schedule, &tz, now, &mut status).await;
            next_run(&cj, &status, &schedule, &tz, now)
        }
        _ => None,
    };
    if status != old_status {
        let api: Api<CronJob> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({"status": {
            "active": status.active,
            "lastScheduleTime": status.last_schedule_time,
            "lastSuccessfulTime": status.last_successful_time,
        }});
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { cronjob: name, source }),
        }
    }
    // What the active list learned is written even when starting a Job failed.
    started?;
    clean_up_finished(&ctx, &cj, &jobs_api, &jobs).await?;
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Whether `job` is in the CronJob's `status.active`.
fn listed(cj: &CronJob, job: &Job) -> bool {
    let uid = job.uid();
    cj.status
        .as_ref()
        .and_then(|s| s.active.as_ref())
        .is_some_and(|a| a.iter().any(|r| r.uid == uid))
}

fn suspended(cj: &CronJob) -> bool {
    cj.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

/// The parsed schedule and time zone, or `None` with the warning upstream records.
async fn schedule_and_zone(ctx: &Ctx, cj: &CronJob) -> Option<(Schedule, jiff::tz::TimeZone)> {
    let spec = cj.spec.as_ref()?;
    let tz = match spec.time_zone.as_deref() {
        None => jiff::tz::TimeZone::UTC,
        Some(name) => match jiff::tz::TimeZone::get(name) {
            Ok(tz) => tz,
            Err(e) => {
                let msg = format!("invalid timeZone: {name:?}: {e}");
                ctx.recorder.record(cj, EventType::Warning, "UnknownTimeZone", &msg).await;
                return None;
            }
        },
    };
    match Schedule::parse(&spec.schedule) {
        Ok(s) => Some((s, tz)),
        Err(e) => {
            let msg = format!("unparseable schedule: {:?} : {e}", spec.schedule);
            ctx.recorder.record(cj, EventType::Warning, "UnparseableSchedule", &msg).await;
            None
        }
    }
}

/// Upstream's bookkeeping of `status.active`: finished Jobs leave it (`SawCompletedJob`),
/// so do Jobs gone from the API (`MissingJob`); an unfinished Job of ours missing from it
/// is reported (`UnexpectedJob`); the newest completion is `lastSuccessfulTime`.
async fn sync_active(ctx: &Ctx, cj: &CronJob, jobs: &[Job], status: &mut CronJobStatus) {
    let active = status.active.get_or_insert_with(Vec::new);
    for job in jobs {
        let job_uid = job.uid().unwrap_or_default();
        let listed = active.iter().any(|r| r.uid.as_deref() == Some(job_uid.as_str()));
        let finished = finished_condition(job);
        match finished {
            None if !listed => {
                let msg = format!(
                    "Saw a job that the controller did not create or forgot: {}",
                    job.name_any()
                );
                ctx.recorder.record(cj, EventType::Warning, "UnexpectedJob", &msg).await;
            }
            Some(condition) if listed => {
                active.retain(|r| r.uid.as_deref() != Some(job_uid.as_str()));
                let msg = format!("Saw completed job: {}, condition: {condition}", job.name_any());
                ctx.recorder.record(cj, EventType::Normal, "SawCompletedJob", &msg).await;
            }
            _ => {}
        }
        if finished == Some("Complete")
            && let Some(done) = job.status.as_ref().and_then(|s| s.completion_time.clone())
            && status.last_successful_time.as_ref().is_none_or(|t| t.0 < done.0)
        {
            status.last_successful_time = Some(done);
        }
    }
    let present: Vec<String> = jobs.iter().filter_map(|j| j.uid()).collect();
    let mut gone = Vec::new();
    let active = status.active.get_or_insert_with(Vec::new);
    active.retain(|r| {
        let here = r.uid.as_ref().is_some_and(|u| present.contains(u));
        if !here {
            gone.push(r.name.clone().unwrap_or_default());
        }
        here
    });
    for job in gone {
        let msg = format!("Active job went missing: {job}");
        ctx.recorder.record(cj, EventType::Normal, "MissingJob", &msg).await;
    }
    if status.active.as_ref().is_some_and(Vec::is_empty) {
        status.active = None;
    }
}

/// `Complete` or `Failed` when the Job has finished.
fn finished_condition(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    ["Complete", "Failed"]
        .into_iter()
        .find(|t| conditions.iter().any(|c| c.type_ == *t && c.status == "True"))
}

/// The times the schedule fired after the CronJob's last scheduled time (or its creation,
/// or `startingDeadlineSeconds` ago when that is later) up to `now`: the most recent one
/// and how many there were (counted up to [`MANY_MISSED`] + 1).
fn most_recent(
    cj: &CronJob,
    status: &CronJobStatus,
    schedule: &Schedule,
    tz: &jiff::tz::TimeZone,
    now: Timestamp,
    with_deadline: bool,
) -> (Timestamp, Option<Timestamp>, usize) {
    let created = cj.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(now);
    let mut earliest = status.last_schedule_time.as_ref().map(|t| t.0).unwrap_or(created);
    if with_deadline
        && let Some(deadline) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds)
        && let Ok(window_start) = now.checked_sub(jiff::SignedDuration::from_secs(deadline))
        && window_start > earliest
    {
        earliest = window_start;
    }
    let (mut latest, mut missed, mut t) = (None, 0, earliest);
    while let Some(next) = schedule.next_after(t, tz).filter(|n| *n <= now) {
        latest = Some(next);
        missed += 1;
        t = next;
        if missed > MANY_MISSED {
            // Too many to walk one by one: the last one is in the latest window back from
            // `now` that has any (an hour, a day, a month, a year, the five years robfig
            // looks ahead).
            for hours in [1, 24, 24 * 32, 24 * 366, 24 * 366 * 5] {
                let Ok(from) = now.checked_sub(jiff::SignedDuration::from_hours(hours)) else {
                    break;
                };
                let mut u = from.max(next);
                let mut found = None;
                while let Some(n) = schedule.next_after(u, tz).filter(|n| *n <= now) {
                    found = Some(n);
                    u = n;
                }
                if found.is_some() {
                    latest = found;
                    break;
                }
            }
            break;
        }
    }
    (earliest, latest, missed)
}

/// Upstream's `syncCronJob` from its schedule check on: the Job for the most recent
/// unmet scheduled time, if it is not too late and the concurrency policy allows it.
async fn start_due_job(
    ctx: &Ctx,
    cj: &CronJob,
    jobs_api: &Api<Job>,
    schedule: &Schedule,
    tz: &jiff::tz::TimeZone,
    now: Timestamp,
    status: &mut CronJobStatus,
) -> Result<(), Error> {
    let (_, scheduled, missed) = most_recent(cj, status, schedule, tz, now, true);
    let Some(scheduled) = scheduled else { return Ok(()) };
    if missed > MANY_MISSED {
        let msg = "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew";
        ctx.recorder.record(cj, EventType::Warning, "TooManyMissedTimes", msg).await;
    }
    let spec = cj.spec.clone().unwrap_or_default();
    if let Some(deadline) = spec.starting_deadline_seconds
        && scheduled
            .checked_add(jiff::SignedDuration::from_secs(deadline))
            .is_ok_and(|latest_start| latest_start < now)
    {
        let msg = format!(
            "Missed scheduled time to start a job: {}",
            scheduled.strftime("%a, %d %b %Y %H:%M:%S +0000")
        );
        ctx.recorder.record(cj, EventType::Warning, "MissSchedule", &msg).await;
        return Ok(());
    }
    let job_name = job_name(&cj.name_any(), scheduled);
    let active = status.active.get_or_insert_with(Vec::new);
    if active.iter().any(|r| r.name.as_deref() == Some(job_name.as_str()))
        || status.last_schedule_time.as_ref().is_some_and(|t| t.0 == scheduled)
    {
        return Ok(());
    }
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !active.is_empty() => {
            let msg = "Not starting job because prior execution is running and concurrency policy is Forbid";
            ctx.recorder.record(cj, EventType::Normal, "JobAlreadyActive", msg).await;
            return Ok(());
        }
        Some("Replace") => {
            for r in std::mem::take(active) {
                let name = r.name.clone().unwrap_or_default();
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..Default::default()
                };
                match jobs_api.delete(&name, &params).await {
                    Ok(_) => {}
                    Err(e) if pods::is_not_found(&e) => {}
                    Err(source) => {
                        let msg = format!("Deleted job: {source}");
                        ctx.recorder.record(cj, EventType::Warning, "FailedDelete", &msg).await;
                        return Err(Error::DeleteJob { job: name, source });
                    }
                }
                let msg = format!("Deleted job {name}");
                ctx.recorder.record(cj, EventType::Normal, "SuccessfulDelete", &msg).await;
            }
        }
        _ => {}
    }
    let job = job_from_template(cj, &job_name, scheduled, tz);
    let created = match jobs_api.create(&PostParams::default(), &job).await {
        Ok(j) => {
            let msg = format!("Created job {}", j.name_any());
            ctx.recorder.record(cj, EventType::Normal, "SuccessfulCreate", &msg).await;
            j
        }
        // Created before, by us (a restart between the create and the status write).
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = jobs_api
                .get(&job_name)
                .await
                .map_err(|source| Error::CreateJob { job: job_name.clone(), source })?;
            let uid = cj.uid().unwrap_or_default();
            if pods::controller_ref(&existing.metadata).is_none_or(|r| r.uid != uid) {
                // Upstream logs this and waits for a change rather than retrying.
                let msg =
                    format!("Job {job_name} already exists and is not controlled by this CronJob");
                ctx.recorder.record(cj, EventType::Warning, "FailedCreate", &msg).await;
                return Ok(());
            }
            existing
        }
        Err(source) => {
            let msg = format!("Error creating job: {source}");
            ctx.recorder.record(cj, EventType::Warning, "FailedCreate", &msg).await;
            return Err(Error::CreateJob { job: job_name, source });
        }
    };
    let active = status.active.get_or_insert_with(Vec::new);
    active.push(ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: created.metadata.name.clone(),
        namespace: created.metadata.namespace.clone(),
        uid: created.metadata.uid.clone(),
        resource_version: created.metadata.resource_version.clone(),
        ..Default::default()
    });
    status.last_schedule_time = Some(Time(scheduled));
    Ok(())
}

/// Upstream's `getJobName`: the scheduled time in minutes since the epoch.
fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second().div_euclid(60))
}

/// Upstream's `getJobFromTemplate2`: the template's labels, annotations and spec, owned by
/// the CronJob, with the scheduled time annotated.
fn job_from_template(
    cj: &CronJob,
    name: &str,
    scheduled: Timestamp,
    tz: &jiff::tz::TimeZone,
) -> Job {
    let template = cj.spec.as_ref().map(|s| s.job_template.clone()).unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP_ANNOTATION.into(),
        scheduled
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z"),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: cj.namespace(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![pods::owner_ref(cj)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// When to look again: just after the next scheduled time.
fn next_run(
    cj: &CronJob,
    status: &CronJobStatus,
    schedule: &Schedule,
    tz: &jiff::tz::TimeZone,
    now: Timestamp,
) -> Option<Duration> {
    let (earliest, latest, _) = most_recent(cj, status, schedule, tz, now, false);
    let next = schedule
        .next_after(latest.unwrap_or(earliest), tz)
        .filter(|n| *n > now)
        .or_else(|| schedule.next_after(now, tz))?;
    let wait = Duration::try_from(next.duration_since(now)).unwrap_or_default();
    Some(wait + NEXT_SCHEDULE_DELTA)
}

/// Upstream's `cleanupFinishedJobs`: finished Jobs beyond `successfulJobsHistoryLimit` and
/// `failedJobsHistoryLimit` are deleted, oldest (by start time) first.
async fn clean_up_finished(
    ctx: &Ctx,
    cj: &CronJob,
    jobs_api: &Api<Job>,
    jobs: &[Job],
) -> Result<(), Error> {
    let spec = cj.spec.clone().unwrap_or_default();
    for (condition, limit) in [
        ("Complete", spec.successful_jobs_history_limit),
        ("Failed", spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut done: Vec<&Job> =
            jobs.iter().filter(|j| finished_condition(j) == Some(condition)).collect();
        let keep = usize::try_from(limit.max(0)).unwrap_or(0);
        if done.len() <= keep {
            continue;
        }
        // Upstream's `byJobStartTime`: unstarted Jobs last, ties by name.
        done.sort_by_key(|j| {
            let start = j.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            (start.is_none(), start, j.name_any())
        });
        for job in &done[..done.len() - keep] {
            let name = job.name_any();
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            match jobs_api.delete(&name, &params).await {
                Ok(_) => {
                    let msg = format!("Deleted job {name}");
                    ctx.recorder.record(cj, EventType::Normal, "SuccessfulDelete", &msg).await;
                }
                Err(e) if pods::is_not_found(&e) => {}
                Err(source) => return Err(Error::DeleteJob { job: name, source }),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names_count_minutes_since_the_epoch() {
        let t: Timestamp = "2026-03-01T10:15:00Z".parse().expect("time");
        assert_eq!(job_name("backup", t), format!("backup-{}", t.as_second() / 60));
        assert_eq!(job_name("backup", t), "backup-29539335");
    }

    #[test]
    fn the_most_recent_missed_time_is_found_past_many_misses() {
        let cj: CronJob = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "creationTimestamp": "2026-03-01T00:00:00Z"},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {}},
        }))
        .expect("cronjob");
        let s = Schedule::parse("*/5 * * * *").expect("schedule");
        let utc = jiff::tz::TimeZone::UTC;
        let status = CronJobStatus::default();
        let now: Timestamp = "2026-03-01T00:12:00Z".parse().expect("now");
        let (_, latest, missed) = most_recent(&cj, &status, &s, &utc, now, true);
        assert_eq!(
            (latest.map(|t| t.to_string()), missed),
            (Some("2026-03-01T00:10:00Z".into()), 2)
        );

        let now: Timestamp = "2026-03-03T07:31:00Z".parse().expect("now");
        let (_, latest, missed) = most_recent(&cj, &status, &s, &utc, now, true);
        assert_eq!(latest.map(|t| t.to_string()), Some("2026-03-03T07:30:00Z".into()));
        assert!(missed > MANY_MISSED);

        // A deadline moves the window: nothing before now - 60 s is due.
        let mut cj = cj;
        cj.spec.as_mut().expect("spec").starting_deadline_seconds = Some(60);
        let now: Timestamp = "2026-03-01T00:12:00Z".parse().expect("now");
        let (_, latest, _) = most_recent(&cj, &status, &s, &utc, now, true);
        assert_eq!(latest, None);
    }
}
