//! batch/v1 Job: `SetDefaults_Job`, the job strategy's generated selector and labels, and
//! `ValidateJob`/`ValidateJobUpdate`.

use k8s_openapi::api::batch::v1::{CronJob, Job, JobSpec, PodFailurePolicy, SuccessPolicyRule};
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, Raw, go_string_map, json_value};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::{self, FIELD_IMMUTABLE, nonnegative};
use super::names;
use super::pod;
use super::value::{self, Obj, default_ptr, ensure};

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
    // A pod condition pattern matches a True condition unless it says otherwise.
    let rules = value::child(spec, "podFailurePolicy")
        .and_then(|p| p.get_mut("rules"))
        .and_then(Value::as_array_mut);
    for rule in rules.into_iter().flatten() {
        let patterns = rule.get_mut("onPodConditions").and_then(Value::as_array_mut);
        // Upstream defaults the empty string too (typed clients send `"status": ""`).
        for pattern in patterns.into_iter().flatten().filter_map(Value::as_object_mut) {
            if pattern.get("status").and_then(Value::as_str).is_none_or(str::is_empty) {
                pattern.insert("status".into(), json!("True"));
            }
        }
    }
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
    let (job, old_job) = match typed_pair::<Job>(new, old) {
        Ok(pair) => pair,
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
    validate_job_spec(&spec, &sp, true, &mut errs);
    let mode = spec.completion_mode.as_deref();
    let tp = sp.child("template");
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
    if let Some(old) = old_job.as_ref().and_then(|j| j.spec.as_ref()) {
        immutable(&mut errs, &sp.child("selector"), &spec.selector, &old.selector);
        immutable(&mut errs, &tp, &spec.template, &old.template);
        immutable(&mut errs, &sp.child("completions"), &spec.completions, &old.completions);
        immutable(
            &mut errs,
            &sp.child("completionMode"),
            &spec.completion_mode,
            &old.completion_mode,
        );
        let policy = &sp.child("podFailurePolicy");
        immutable(&mut errs, policy, &spec.pod_failure_policy, &old.pod_failure_policy);
        let per_index = &sp.child("backoffLimitPerIndex");
        immutable(
            &mut errs,
            per_index,
            &spec.backoff_limit_per_index,
            &old.backoff_limit_per_index,
        );
        immutable(&mut errs, &sp.child("successPolicy"), &spec.success_policy, &old.success_policy);
    }
    errs
}

/// Upstream's `validateJobSpec` (counts, completion mode, replacement policy, the template
/// and its restartPolicy), with `ValidateJobSpec`'s selector checks when `with_selector` (a
/// CronJob's job template has none: it is generated).
fn validate_job_spec(spec: &JobSpec, sp: &Path, with_selector: bool, errs: &mut ErrorList) {
    for (v, name) in [
        (spec.parallelism, "parallelism"),
        (spec.completions, "completions"),
        (spec.backoff_limit, "backoffLimit"),
        (spec.ttl_seconds_after_finished, "ttlSecondsAfterFinished"),
        (spec.backoff_limit_per_index, "backoffLimitPerIndex"),
        (spec.max_failed_indexes, "maxFailedIndexes"),
    ] {
        nonnegative(errs, v.map(i64::from), &sp.child(name));
    }
    nonnegative(errs, spec.active_deadline_seconds, &sp.child("activeDeadlineSeconds"));
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
    if spec.backoff_limit_per_index.is_some() && mode == Some("Indexed") {
        if let Some(max) = spec.max_failed_indexes {
            if spec.completions.is_some_and(|c| max > c) {
                errs.push(FieldError::invalid(
                    &sp.child("maxFailedIndexes"),
                    i64::from(max),
                    "must be less than or equal to completions",
                ));
            }
            if max > INDEX_LIMIT {
                errs.push(FieldError::invalid(
                    &sp.child("maxFailedIndexes"),
                    i64::from(max),
                    format!("must be less than or equal to {INDEX_LIMIT}"),
                ));
            }
        }
        if let Some(c) = spec.completions.filter(|c| *c > INDEX_LIMIT) {
            errs.push(FieldError::invalid(
                &sp.child("completions"),
                i64::from(c),
                format!("must be less than or equal to {INDEX_LIMIT} when backoffLimitPerIndex is specified"),
            ));
        }
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
    if let Some(policy) = &spec.pod_failure_policy {
        validate_pod_failure_policy(spec, policy, &sp.child("podFailurePolicy"), errs);
    }
    validate_success_policy(spec, &sp.child("successPolicy"), errs);
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
        _ if !with_selector => {}
        None => errs.push(FieldError::required(&sp.child("selector"), "")),
        Some(sel) => {
            errs.extend(meta::validate_label_selector(sel, &sp.child("selector")));
            let empty = Default::default();
            if !skiff_core::labels::label_selector_matches(sel, tlabels.unwrap_or(&empty)) {
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
}

/// `field is immutable` when `new` differs from `old`.
fn immutable<T: PartialEq + serde::Serialize>(errs: &mut ErrorList, path: &Path, new: &T, old: &T) {
    if new != old {
        errs.push(FieldError::invalid(path, json_value(new), FIELD_IMMUTABLE));
    }
}

/// Upstream's limits with backoffLimitPerIndex: completions and maxFailedIndexes.
const INDEX_LIMIT: i32 = 100_000;
/// Upstream's `maxSuccessPolicyRule` and the length limit of a rule's succeededIndexes.
const MAX_SUCCESS_RULES: usize = 20;
const MAX_SUCCEEDED_INDEXES_LEN: usize = 64 * 1024;

/// Upstream's `validateSuccessPolicy`: Indexed Jobs only (else that is the one error), 1 to 20 rules, each with
/// succeededIndexes (well-formed, below completions) and/or a succeededCount it can reach.
fn validate_success_policy(spec: &JobSpec, path: &Path, errs: &mut ErrorList) {
    let Some(policy) = &spec.success_policy else { return };
    if spec.completion_mode.as_deref() != Some("Indexed") {
        errs.push(FieldError::invalid(
            path,
            json_value(policy),
            "requires indexed completion mode",
        ));
        return;
    }
    let rules = path.child("rules");
    if policy.rules.is_empty() {
        errs.push(FieldError::required(
            &rules,
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if policy.rules.len() > MAX_SUCCESS_RULES {
        errs.push(FieldError::too_many(&rules, policy.rules.len(), MAX_SUCCESS_RULES));
    }
    let completions = spec.completions.unwrap_or(0);
    for (i, rule) in policy.rules.iter().enumerate() {
        validate_success_rule(rule, completions, &rules.index(i), errs);
    }
}

fn validate_success_rule(
    rule: &SuccessPolicyRule,
    completions: i32,
    path: &Path,
    errs: &mut ErrorList,
) {
    if rule.succeeded_count.is_none() && rule.succeeded_indexes.is_none() {
        errs.push(FieldError::required(
            path,
            "at least one of succeededCount or succeededIndexes must be specified",
        ));
    }
    let mut total = 0;
    if let Some(indexes) = &rule.succeeded_indexes {
        let ip = path.child("succeededIndexes");
        if indexes.len() > MAX_SUCCEEDED_INDEXES_LEN {
            errs.push(FieldError::too_long(&ip, MAX_SUCCEEDED_INDEXES_LEN));
        }
        match count_indexes(indexes, completions) {
            Ok(n) => total = n,
            Err(e) => errs.push(FieldError::invalid(
                &ip,
                indexes.as_str(),
                format!("error parsing succeededIndexes: {e}"),
            )),
        }
    }
    if let Some(count) = rule.succeeded_count {
        let cp = path.child("succeededCount");
        nonnegative(errs, Some(i64::from(count)), &cp);
        if count > completions {
            errs.push(FieldError::invalid(
                &cp,
                i64::from(count),
                format!("must be less than or equal to {completions} (the number of specified completions)"),
            ));
        }
        if rule.succeeded_indexes.is_some() && count > total {
            errs.push(FieldError::invalid(
                &cp,
                i64::from(count),
                format!("must be less than or equal to {total} (the number of indexes in the specified succeededIndexes field)"),
            ));
        }
    }
}

/// Upstream's `validateIndexesFormat`: "a,b-c,..." in increasing order below `completions`;
/// the number of indexes.
fn count_indexes(s: &str, completions: i32) -> Result<i32, String> {
    if s.is_empty() {
        return Ok(0);
    }
    let mut last: Option<i64> = None;
    let mut total = 0i64;
    for interval in s.split(',') {
        let limits: Vec<&str> = interval.split('-').collect();
        if limits.len() > 2 {
            return Err(format!(
                "the fragment {interval:?} violates the requirement that an index interval can have at most two parts separated by '-'"
            ));
        }
        let mut bounds = Vec::with_capacity(2);
        for l in &limits {
            let x: i64 = l
                .parse()
                .map_err(|_| format!("cannot convert string to integer for index: {l:?}"))?;
            if x >= i64::from(completions) {
                return Err(format!("too large index: {l:?}"));
            }
            if let Some(prev) = last
                && prev >= x
            {
                return Err(format!("non-increasing order, previous: {prev}, current: {x}"));
            }
            last = Some(x);
            bounds.push(x);
        }
        total += match bounds[..] {
            [a, b] => b - a + 1,
            _ => 1,
        };
    }
    Ok(i32::try_from(total).unwrap_or(i32::MAX))
}

/// Upstream's `validatePodFailurePolicy`.
fn validate_pod_failure_policy(
    spec: &JobSpec,
    policy: &PodFailurePolicy,
    fp: &Path,
    errs: &mut ErrorList,
) {
    const MAX_RULES: usize = 20;
    const MAX_VALUES: usize = 255;
    const MAX_PATTERNS: usize = 20;
    let rp = fp.child("rules");
    if policy.rules.len() > MAX_RULES {
        errs.push(FieldError::too_many(&rp, policy.rules.len(), MAX_RULES));
    }
    let ps = spec.template.spec.as_ref();
    let containers =
        ps.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    let names: Vec<&str> = containers.map(|c| c.name.as_str()).collect();
    for (i, rule) in policy.rules.iter().enumerate() {
        let path = rp.index(i);
        let action = rule.action.as_str();
        if action.is_empty() {
            errs.push(FieldError::required(
                &path.child("action"),
                r#"valid values: ["Count" "FailIndex" "FailJob" "Ignore"]"#,
            ));
        } else if action == "FailIndex" {
            if spec.backoff_limit_per_index.is_none() {
                errs.push(FieldError::invalid(
                    &path.child("action"),
                    action,
                    "requires the backoffLimitPerIndex to be set",
                ));
            }
        } else if !matches!(action, "Count" | "FailJob" | "Ignore") {
            errs.push(FieldError::not_supported(
                &path.child("action"),
                action,
                &["Count", "FailIndex", "FailJob", "Ignore"],
            ));
        }
        if let Some(codes) = &rule.on_exit_codes {
            let cp = path.child("onExitCodes");
            let op = codes.operator.as_str();
            if op.is_empty() {
                errs.push(FieldError::required(
                    &cp.child("operator"),
                    r#"valid values: ["In" "NotIn"]"#,
                ));
            } else if !matches!(op, "In" | "NotIn") {
                errs.push(FieldError::not_supported(&cp.child("operator"), op, &["In", "NotIn"]));
            }
            if let Some(c) = &codes.container_name
                && !names.contains(&c.as_str())
            {
                errs.push(FieldError::invalid(
                    &cp.child("containerName"),
                    c,
                    "must be one of the container or initContainer names in the pod template",
                ));
            }
            let vp = cp.child("values");
            let values = &codes.values;
            // Go's %#v of the []int32 (nil when empty: the field was left out).
            let rendered = || {
                let items: Vec<String> = values.iter().map(i32::to_string).collect();
                Raw(if items.is_empty() {
                    "[]int32(nil)".to_string()
                } else {
                    format!("[]int32{{{}}}", items.join(", "))
                })
            };
            if values.is_empty() {
                errs.push(FieldError::invalid(&vp, rendered(), "at least one value is required"));
            } else if values.len() > MAX_VALUES {
                errs.push(FieldError::too_many(&vp, values.len(), MAX_VALUES));
            } else {
                for (j, v) in values.iter().enumerate() {
                    if op == "In" && *v == 0 {
                        errs.push(FieldError::invalid(
                            &vp.index(j),
                            *v,
                            "must not be 0 for the In operator",
                        ));
                    }
                    if values[..j].contains(v) {
                        errs.push(FieldError::duplicate(&vp.index(j), *v));
                    }
                }
                if values.windows(2).any(|w| w[0] > w[1]) {
                    errs.push(FieldError::invalid(&vp, rendered(), "must be ordered"));
                }
            }
        }
        let patterns = rule.on_pod_conditions.as_deref().unwrap_or_default();
        let cp = path.child("onPodConditions");
        if patterns.len() > MAX_PATTERNS {
            errs.push(FieldError::too_many(&cp, patterns.len(), MAX_PATTERNS));
        }
        for (j, pattern) in patterns.iter().enumerate() {
            let pp = cp.index(j);
            for m in names::is_qualified_name(&pattern.type_) {
                errs.push(FieldError::invalid(&pp.child("type"), &pattern.type_, m));
            }
            let status = pattern.status.as_str();
            if status.is_empty() {
                errs.push(FieldError::required(
                    &pp.child("status"),
                    r#"valid values: ["False" "True" "Unknown"]"#,
                ));
            } else if !matches!(status, "True" | "False" | "Unknown") {
                errs.push(FieldError::not_supported(
                    &pp.child("status"),
                    status,
                    &["False", "True", "Unknown"],
                ));
            }
        }
        match (rule.on_exit_codes.is_some(), !patterns.is_empty()) {
            (true, true) => errs.push(FieldError::invalid_without_value(
                &path,
                "specifying both OnExitCodes and OnPodConditions is not supported",
            )),
            (false, false) => errs.push(FieldError::invalid_without_value(
                &path,
                "specifying one of OnExitCodes and OnPodConditions is required",
            )),
            _ => {}
        }
    }
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
    if !skiff_core::labels::label_selector_matches(sel, &expected) {
        errs.push(FieldError::invalid(
            &Path::root("spec").child("selector"),
            json_value(sel),
            "`selector` not auto-generated",
        ));
    }
}

const CRON_JOB: Gvk<'static> = Gvk::new("batch", "v1", "CronJob");

/// `SetDefaults_CronJob`, and the pod defaults of its job template.
pub fn default_cronjob(o: &mut Obj) {
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    let empty = spec.get("concurrencyPolicy").and_then(Value::as_str).is_none_or(str::is_empty);
    if empty {
        spec.insert("concurrencyPolicy".into(), json!("Allow"));
    }
    default_ptr(spec, "suspend", false);
    default_ptr(spec, "successfulJobsHistoryLimit", 3);
    default_ptr(spec, "failedJobsHistoryLimit", 1);
    if let Some(ps) = value::child(spec, "jobTemplate")
        .and_then(|jt| value::child(jt, "spec"))
        .and_then(|js| value::child(js, "template"))
        .and_then(|t| ensure(t, "spec"))
    {
        pod::default_pod_spec(ps, false);
    }
}

/// `ValidateCronJobCreate`/`...Update` (and non-negative counts through `/status`).
pub fn validate_cronjob(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let (cj, old_cj) = match typed_pair::<CronJob>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(CRON_JOB, &cj.metadata, old_cj.as_ref().map(|c| &c.metadata));
    if sub == Some("status") {
        return errs;
    }
    let name = cj.metadata.name.as_deref().unwrap_or_default();
    // The controller appends `-<minutes since the epoch>` (11 characters) for its jobs.
    if old_cj.is_none() && name.len() > 52 {
        errs.push(FieldError::invalid(
            &Path::root("metadata").child("name"),
            name,
            "must be no more than 52 characters",
        ));
    }
    let spec = cj.spec.unwrap_or_default();
    let old_spec = old_cj.and_then(|c| c.spec);
    let sp = Path::root("spec");
    if spec.schedule.is_empty() {
        errs.push(FieldError::required(&sp.child("schedule"), ""));
    } else {
        if let Err(e) = skiff_core::cron::Schedule::parse(&spec.schedule) {
            errs.push(FieldError::invalid(&sp.child("schedule"), spec.schedule.as_str(), e));
        }
        // Schedules stored with TZ before the timeZone field keep it.
        let allow_tz = old_spec.as_ref().is_some_and(|o| o.schedule.contains("TZ"));
        if allow_tz && spec.schedule.contains("TZ") && spec.time_zone.is_some() {
            errs.push(FieldError::invalid(
                &sp.child("schedule"),
                spec.schedule.as_str(),
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        } else if !allow_tz && spec.schedule.contains("TZ") {
            errs.push(FieldError::invalid(
                &sp.child("schedule"),
                spec.schedule.as_str(),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    nonnegative(&mut errs, spec.starting_deadline_seconds, &sp.child("startingDeadlineSeconds"));
    if old_spec.as_ref().is_none_or(|o| o.time_zone != spec.time_zone)
        && let Some(tz) = &spec.time_zone
        && let Some(why) = invalid_time_zone(tz)
    {
        errs.push(FieldError::invalid(&sp.child("timeZone"), tz.as_str(), why));
    }
    let policy = spec.concurrency_policy.as_deref().unwrap_or_default();
    match policy {
        "Allow" | "Forbid" | "Replace" => {}
        "" => errs.push(FieldError::required(&sp.child("concurrencyPolicy"), "")),
        p => errs.push(FieldError::not_supported(
            &sp.child("concurrencyPolicy"),
            p,
            &["Allow", "Forbid", "Replace"],
        )),
    }
    let jp = sp.child("jobTemplate").child("spec");
    let job_spec = spec.job_template.spec.unwrap_or_default();
    validate_job_spec(&job_spec, &jp, false, &mut errs);
    if let Some(sel) = &job_spec.selector {
        errs.push(FieldError::invalid(
            &jp.child("selector"),
            json_value(sel),
            "`selector` will be auto-generated",
        ));
    }
    if job_spec.manual_selector == Some(true) {
        errs.push(FieldError::not_supported(&jp.child("manualSelector"), true, &["nil", "false"]));
    }
    for (v, field) in [
        (spec.successful_jobs_history_limit, "successfulJobsHistoryLimit"),
        (spec.failed_jobs_history_limit, "failedJobsHistoryLimit"),
    ] {
        nonnegative(&mut errs, v.map(i64::from), &sp.child(field));
    }
    errs
}

/// Upstream's `validateTimeZone`: an IANA name the tz database knows.
fn invalid_time_zone(tz: &str) -> Option<String> {
    if tz.is_empty() {
        return Some("timeZone must be nil or non-empty string".into());
    }
    let part_ok = |p: &str| {
        p != "."
            && p != ".."
            && !p.starts_with('-')
            && !p.is_empty()
            && p.len() <= 14
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
    };
    if !tz.split('/').all(part_ok) {
        return Some(format!("unknown time zone {tz}"));
    }
    if tz.eq_ignore_ascii_case("Local") {
        return Some(
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"
                .into(),
        );
    }
    // jiff finds names whatever their case; Go's LoadLocation opens the file by its name.
    match jiff::tz::TimeZone::get(tz) {
        Ok(zone) if zone.iana_name() == Some(tz) => None,
        _ => Some(format!("unknown time zone {tz}")),
    }
}
