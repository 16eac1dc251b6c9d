//! batch/v1 Job: `SetDefaults_Job`, the job strategy's generated selector and labels, and
//! `ValidateJob`/`ValidateJobUpdate`.

use k8s_openapi::api::batch::v1::Job;
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, go_string_map, json_value};
use super::meta::{self, FIELD_IMMUTABLE, nonnegative};
use super::names;
use super::pod;
use super::value::{self, Obj, default_ptr, ensure};
use super::{Gvk, typed, validate_meta};

const JOB: Gvk<'static> = Gvk::new("batch", "v1", "Job");
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
const LEGACY_JOB_NAME_LABEL: &str = "job-name";

pub fn default_job(o: &mut Obj) {
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    if !value::is_set(spec, "completions") && !value::is_set(spec, "parallelism") {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    default_ptr(spec, "parallelism", 1);
    let backoff = if value::is_set(spec, "backoffLimitPerIndex") { i64::from(i32::MAX) } else { 6 };
    default_ptr(spec, "backoffLimit", backoff);
    default_ptr(spec, "completionMode", "NonIndexed");
    default_ptr(spec, "suspend", false);
    let replacement =
        if value::is_set(spec, "podFailurePolicy") { "Failed" } else { "TerminatingOrFailed" };
    default_ptr(spec, "podReplacementPolicy", replacement);
    default_ptr(spec, "manualSelector", false);
    if let Some(t) = value::child(spec, "template")
        && let Some(ps) = ensure(t, "spec")
    {
        pod::default_pod_spec(ps, false);
    }
    copy_template_labels(o);
}

/// `SetDefaults_Job`: a job without labels takes its template's.
fn copy_template_labels(o: &mut Obj) {
    let tlabels = o
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.is_object())
        .cloned();
    if let Some(tl) = tlabels
        && let Some(m) = ensure(o, "metadata")
    {
        let empty = m.get("labels").and_then(Value::as_object).is_none_or(|l| l.is_empty());
        if empty {
            m.insert("labels".into(), tl);
        }
    }
}

/// The job strategy's `PrepareForCreate`: generated selector and template labels (unless
/// `manualSelector`), status emptied. Needs `metadata.uid` and `metadata.name`.
pub fn prepare_job_create(o: &mut Obj) {
    let meta = o.get("metadata");
    let name =
        meta.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
    let uid =
        meta.and_then(|m| m.get("uid")).and_then(Value::as_str).unwrap_or_default().to_string();
    o.insert("status".into(), json!({}));
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    if let Some(labels) = ensure(spec, "template")
        .and_then(|t| ensure(t, "metadata"))
        .and_then(|m| ensure(m, "labels"))
    {
        for key in [LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL] {
            labels.entry(key).or_insert_with(|| name.clone().into());
        }
        for key in [LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL] {
            labels.entry(key).or_insert_with(|| uid.clone().into());
        }
    }
    if let Some(ml) = ensure(spec, "selector").and_then(|s| ensure(s, "matchLabels")) {
        ml.entry(CONTROLLER_UID_LABEL).or_insert_with(|| uid.clone().into());
    }
    copy_template_labels(o);
}

pub fn validate_job(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let job: Job = match typed(new) {
        Ok(j) => j,
        Err(e) => return e,
    };
    let old_job: Option<Job> = match old.map(typed).transpose() {
        Ok(j) => j,
        Err(e) => return e,
    };
    let mut errs = validate_meta(JOB, &job.metadata, old_job.as_ref().map(|j| &j.metadata));
    if sub == Some("status") {
        let sp = Path::root("status");
        if let Some(st) = new.get("status").and_then(Value::as_object) {
            for (k, v) in st {
                if let Some(i) = v.as_i64() {
                    nonnegative(&mut errs, Some(i), &sp.child(k));
                }
            }
        }
        return errs;
    }
    let spec = job.spec.clone().unwrap_or_default();
    let sp = Path::root("spec");
    if spec.manual_selector != Some(true) {
        // New jobs must carry the prefixed labels; old ones only if they already had them.
        let require_prefixed = old_job.as_ref().is_none_or(|o| {
            let l = o
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.labels.as_ref());
            l.is_some_and(|l| {
                l.contains_key(JOB_NAME_LABEL) && l.contains_key(CONTROLLER_UID_LABEL)
            })
        });
        validate_generated_selector(&job, require_prefixed, &mut errs);
    }
    for (v, name) in [
        (spec.parallelism, "parallelism"),
        (spec.completions, "completions"),
        (spec.backoff_limit, "backoffLimit"),
        (spec.ttl_seconds_after_finished, "ttlSecondsAfterFinished"),
        (spec.backoff_limit_per_index, "backoffLimitPerIndex"),
        (spec.max_failed_indexes, "maxFailedIndexes"),
    ] {
        nonnegative(&mut errs, v.map(i64::from), &sp.child(name));
    }
    nonnegative(&mut errs, spec.active_deadline_seconds, &sp.child("activeDeadlineSeconds"));
    let mode = spec.completion_mode.as_deref();
    if let Some(m) = mode {
        if !matches!(m, "NonIndexed" | "Indexed") {
            errs.push(FieldError::not_supported(
                &sp.child("completionMode"),
                m,
                &["NonIndexed", "Indexed"],
            ));
        }
        if m == "Indexed" && spec.completions.is_none() {
            errs.push(FieldError::required(
                &sp.child("completions"),
                "when completion mode is Indexed",
            ));
        }
    }
    if spec.max_failed_indexes.is_some() && spec.backoff_limit_per_index.is_none() {
        errs.push(FieldError::required(
            &sp.child("backoffLimitPerIndex"),
            "when maxFailedIndexes is specified",
        ));
    }
    if mode.is_none_or(|m| m == "NonIndexed") {
        for (v, name) in [
            (spec.backoff_limit_per_index, "backoffLimitPerIndex"),
            (spec.max_failed_indexes, "maxFailedIndexes"),
        ] {
            if let Some(v) = v {
                errs.push(FieldError::invalid(
                    &sp.child(name),
                    i64::from(v),
                    "requires indexed completion mode",
                ));
            }
        }
    }
    if let Some(p) = spec.pod_replacement_policy.as_deref() {
        if spec.pod_failure_policy.is_some() {
            if p != "Failed" {
                errs.push(FieldError::not_supported(
                    &sp.child("podReplacementPolicy"),
                    p,
                    &["Failed"],
                ));
            }
        } else if !matches!(p, "TerminatingOrFailed" | "Failed") {
            errs.push(FieldError::not_supported(
                &sp.child("podReplacementPolicy"),
                p,
                &["Failed", "TerminatingOrFailed"],
            ));
        }
    }
    let tlabels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    match &spec.selector {
        None => errs.push(FieldError::required(&sp.child("selector"), "")),
        Some(sel) => {
            errs.extend(meta::validate_label_selector(sel, &sp.child("selector")));
            let empty = Default::default();
            if !meta::selector_matches(sel, tlabels.unwrap_or(&empty)) {
                errs.push(FieldError::invalid(
                    &sp.child("template").child("metadata").child("labels"),
                    go_string_map(tlabels),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    let tp = sp.child("template");
    errs.extend(pod::validate_pod_template(Some(&spec.template), &tp));
    let rp =
        spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or_default();
    if rp == "Always" || rp.is_empty() {
        // The template default (Always) is what most users hit: upstream says Required.
        errs.push(FieldError::required(
            &tp.child("spec").child("restartPolicy"),
            "valid values: \"OnFailure\", \"Never\"",
        ));
    } else if rp != "OnFailure" && rp != "Never" {
        errs.push(FieldError::not_supported(
            &tp.child("spec").child("restartPolicy"),
            rp,
            &["OnFailure", "Never"],
        ));
    } else if rp == "OnFailure" && spec.pod_failure_policy.is_some() {
        errs.push(FieldError::invalid(
            &tp.child("spec").child("restartPolicy"),
            rp,
            "only \"Never\" is supported when podFailurePolicy is specified",
        ));
    }
    if mode == Some("Indexed")
        && let Some(c) = spec.completions.filter(|c| *c > 0)
    {
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let host = format!("{name}-{}", c - 1);
        if !names::is_dns1123_label(&host).is_empty() {
            errs.push(FieldError::invalid(
                &Path::root("metadata").child("name"),
                name,
                format!("will not able to create pod with invalid DNS label: {host}"),
            ));
        }
    }
    if let Some(old_spec) = old_job.as_ref().and_then(|j| j.spec.as_ref()) {
        if spec.selector != old_spec.selector {
            errs.push(FieldError::invalid(
                &sp.child("selector"),
                json_value(&spec.selector),
                FIELD_IMMUTABLE,
            ));
        }
        if spec.template != old_spec.template {
            errs.push(FieldError::invalid(&tp, json_value(&spec.template), FIELD_IMMUTABLE));
        }
        if spec.completions != old_spec.completions {
            errs.push(FieldError::invalid(
                &sp.child("completions"),
                json_value(&spec.completions),
                FIELD_IMMUTABLE,
            ));
        }
        for (n, o, name) in [(&spec.completion_mode, &old_spec.completion_mode, "completionMode")] {
            if n != o {
                errs.push(FieldError::invalid(&sp.child(name), json_value(n), FIELD_IMMUTABLE));
            }
        }
        if spec.pod_failure_policy != old_spec.pod_failure_policy {
            errs.push(FieldError::invalid(
                &sp.child("podFailurePolicy"),
                json_value(&spec.pod_failure_policy),
                FIELD_IMMUTABLE,
            ));
        }
    }
    errs
}

/// Upstream `validateGeneratedSelector`: the generated labels are on the template with the
/// job's uid and name, and the selector selects them.
fn validate_generated_selector(job: &Job, require_prefixed: bool, errs: &mut ErrorList) {
    let Some(spec) = &job.spec else { return };
    let Some(sel) = &spec.selector else { return };
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    if uid.is_empty() {
        errs.push(FieldError::required(&Path::root("metadata").child("uid"), ""));
    }
    let mp = Path::root("spec").child("template").child("metadata");
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    let mut expected = std::collections::BTreeMap::new();
    let mut wanted = vec![(LEGACY_CONTROLLER_UID_LABEL, uid), (LEGACY_JOB_NAME_LABEL, name)];
    if require_prefixed {
        wanted.extend([(CONTROLLER_UID_LABEL, uid), (JOB_NAME_LABEL, name)]);
    }
    for (key, want) in wanted {
        expected.insert(key.to_string(), want.to_string());
        let lp = mp.child("labels").key(key);
        match labels.and_then(|l| l.get(key)) {
            None => errs.push(FieldError::required(&lp, format!("must be '{want}'"))),
            Some(v) if v != want => errs.push(FieldError::invalid(
                &lp,
                go_string_map(labels),
                format!("must be '{want}'"),
            )),
            Some(_) => {}
        }
    }
    if !meta::selector_matches(sel, &expected) {
        errs.push(FieldError::invalid(
            &Path::root("spec").child("selector"),
            json_value(sel),
            "`selector` not auto-generated",
        ));
    }
}
