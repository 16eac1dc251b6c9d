//! apps/v1 workloads (Deployment, ReplicaSet, DaemonSet, StatefulSet) and the
//! autoscaling/v1 Scale subresource: `SetDefaults_*`, the strategies' create/update
//! preparation and `pkg/apis/apps/validation`.

use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, DaemonSetUpdateStrategy, Deployment, DeploymentStrategy,
    ReplicaSet, StatefulSet,
};
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::{PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, go_string_map, json_value};
use super::kind::{Gvk, typed, validate_meta};
use super::meta::{self, FIELD_IMMUTABLE, NEGATIVE, nonnegative};
use super::names;
use super::pod;
use super::value::{self, Obj, default, default_ptr, ensure};
use skiff_core::quantity;

// ---------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------

pub fn default_workload(kind: &str, o: &mut Obj) {
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    match kind {
        "Deployment" => {
            default_ptr(spec, "replicas", 1);
            if let Some(strategy) = ensure(spec, "strategy") {
                default(strategy, "type", "RollingUpdate");
                if value::str_of(strategy, "type") == "RollingUpdate"
                    && let Some(ru) = ensure(strategy, "rollingUpdate")
                {
                    default_ptr(ru, "maxUnavailable", "25%");
                    default_ptr(ru, "maxSurge", "25%");
                }
            }
            default_ptr(spec, "revisionHistoryLimit", 10);
            default_ptr(spec, "progressDeadlineSeconds", 600);
        }
        "ReplicaSet" => default_ptr(spec, "replicas", 1),
        "DaemonSet" => {
            if let Some(strategy) = ensure(spec, "updateStrategy") {
                default(strategy, "type", "RollingUpdate");
                if value::str_of(strategy, "type") == "RollingUpdate"
                    && let Some(ru) = ensure(strategy, "rollingUpdate")
                {
                    default_ptr(ru, "maxUnavailable", 1);
                    default_ptr(ru, "maxSurge", 0);
                }
            }
            default_ptr(spec, "revisionHistoryLimit", 10);
        }
        "StatefulSet" => {
            default(spec, "podManagementPolicy", "OrderedReady");
            if let Some(strategy) = ensure(spec, "updateStrategy") {
                if value::str_of(strategy, "type").is_empty() {
                    strategy.insert("type".into(), "RollingUpdate".into());
                    default_ptr(strategy, "rollingUpdate", json!({}));
                }
                if value::str_of(strategy, "type") == "RollingUpdate"
                    && let Some(ru) = value::child(strategy, "rollingUpdate")
                {
                    default_ptr(ru, "partition", 0);
                }
            }
            if let Some(policy) = ensure(spec, "persistentVolumeClaimRetentionPolicy") {
                default(policy, "whenDeleted", "Retain");
                default(policy, "whenScaled", "Retain");
            }
            default_ptr(spec, "replicas", 1);
            default_ptr(spec, "revisionHistoryLimit", 10);
            for pvc in value::each(spec, "volumeClaimTemplates") {
                pvc.entry("apiVersion").or_insert_with(|| "v1".into());
                pvc.entry("kind").or_insert_with(|| "PersistentVolumeClaim".into());
                if let Some(s) = ensure(pvc, "spec") {
                    default(s, "volumeMode", "Filesystem");
                    if let Some(r) = value::child(s, "resources") {
                        quantity::canonicalize_list(r.get_mut("requests"));
                        quantity::canonicalize_list(r.get_mut("limits"));
                    }
                }
                if let Some(st) = ensure(pvc, "status") {
                    default(st, "phase", "Pending");
                }
            }
        }
        _ => return,
    }
    if let Some(t) = value::child(spec, "template")
        && let Some(ps) = ensure(t, "spec")
    {
        pod::default_pod_spec(ps, false);
    }
}

/// `SetDefaults_ReplicationController`: the selector and the labels default to the
/// template's labels, replicas to 1; the template gets the pod defaults.
pub fn default_replication_controller(o: &mut Obj) {
    let template_labels = o
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.as_object().is_some_and(|l| !l.is_empty()))
        .cloned();
    let Some(spec) = ensure(o, "spec") else { return };
    if let Some(labels) = &template_labels
        && spec.get("selector").and_then(Value::as_object).is_none_or(|s| s.is_empty())
    {
        spec.insert("selector".into(), labels.clone());
    }
    default_ptr(spec, "replicas", 1);
    if let Some(t) = value::child(spec, "template")
        && let Some(ps) = ensure(t, "spec")
    {
        pod::default_pod_spec(ps, false);
    }
    if let Some(labels) = template_labels
        && let Some(m) = ensure(o, "metadata")
        && m.get("labels").and_then(Value::as_object).is_none_or(|l| l.is_empty())
    {
        m.insert("labels".into(), labels);
    }
}

/// `ValidateReplicationController` (and its update and status variants): a non-empty
/// selector (mutable, unlike a ReplicaSet's) that matches the template's labels, a
/// template whose pods restart always, non-negative counts.
pub fn validate_replication_controller(
    sub: Option<&str>,
    new: &Value,
    old: Option<&Value>,
) -> ErrorList {
    run::<ReplicationController>(new, old, |n, o| {
        let gvk = Gvk::new("", "v1", "ReplicationController");
        let mut errs = validate_meta(gvk, &n.metadata, o.map(|o| &o.metadata));
        if sub == Some("status") {
            errs.extend(status_nonnegative(new));
            return errs;
        }
        let spec = n.spec.clone().unwrap_or_default();
        let sp = Path::root("spec");
        nonnegative(&mut errs, spec.replicas.map(i64::from), &sp.child("replicas"));
        nonnegative(&mut errs, spec.min_ready_seconds.map(i64::from), &sp.child("minReadySeconds"));
        let selector = spec.selector.clone().unwrap_or_default();
        if selector.is_empty() {
            errs.push(FieldError::required(&sp.child("selector"), ""));
        } else {
            errs.extend(meta::validate_labels(&selector, &sp.child("selector")));
        }
        match &spec.template {
            None => errs.push(FieldError::required(&sp.child("template"), "")),
            Some(t) => {
                let sel = LabelSelector { match_labels: Some(selector), match_expressions: None };
                errs.extend(template_for_replica_set(
                    t,
                    Some(&sel),
                    &sp.child("template"),
                    "ReplicationController",
                ));
            }
        }
        errs
    })
}

/// The DaemonSet's template generation, kept in the annotation upstream's v1 conversion
/// stores it in.
const DS_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

/// Strategies' `PrepareForCreate`: status emptied; DaemonSets start template generation 1.
pub fn prepare_create(kind: &str, o: &mut Obj) {
    o.insert("status".into(), json!({}));
    if kind == "DaemonSet"
        && let Some(ann) = ensure(o, "metadata").and_then(|m| ensure(m, "annotations"))
    {
        ann.insert(DS_TEMPLATE_GENERATION.into(), "1".into());
    }
}

/// DaemonSet `PrepareForUpdate`: a template change bumps the template generation.
pub fn prepare_update(kind: &str, n: &mut Obj, o: &Obj) {
    if kind != "DaemonSet" {
        return;
    }
    let tmpl = |x: &Obj| x.get("spec").and_then(|s| s.get("template")).cloned();
    let old_gen: i64 = o
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(DS_TEMPLATE_GENERATION))
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let new_gen = if tmpl(n) != tmpl(o) { old_gen + 1 } else { old_gen };
    if new_gen > 0
        && let Some(ann) = ensure(n, "metadata").and_then(|m| ensure(m, "annotations"))
    {
        ann.insert(DS_TEMPLATE_GENERATION.into(), new_gen.to_string().into());
    }
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

pub fn validate(kind: &str, sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let status = sub == Some("status");
    match kind {
        "Deployment" => run::<Deployment>(new, old, |n, o| {
            let mut errs = validate_meta(gvk(kind), &n.metadata, o.map(|o| &o.metadata));
            if status {
                errs.extend(status_nonnegative(new));
                return errs;
            }
            let spec = n.spec.clone().unwrap_or_default();
            let sp = Path::root("spec");
            nonnegative(&mut errs, spec.replicas.map(i64::from), &sp.child("replicas"));
            let sel = selector_if_present(new, &spec.selector);
            validate_selector(sel, "deployment", &sp.child("selector"), &mut errs);
            errs.extend(template_for_replica_set(
                &spec.template,
                sel,
                &sp.child("template"),
                "ReplicaSet",
            ));
            validate_deployment_strategy(spec.strategy.as_ref(), &sp.child("strategy"), &mut errs);
            let mrs = spec.min_ready_seconds.unwrap_or(0);
            nonnegative(&mut errs, Some(i64::from(mrs)), &sp.child("minReadySeconds"));
            nonnegative(
                &mut errs,
                spec.revision_history_limit.map(i64::from),
                &sp.child("revisionHistoryLimit"),
            );
            if let Some(pds) = spec.progress_deadline_seconds {
                nonnegative(&mut errs, Some(i64::from(pds)), &sp.child("progressDeadlineSeconds"));
                if pds <= mrs {
                    errs.push(FieldError::invalid(
                        &sp.child("progressDeadlineSeconds"),
                        pds,
                        "must be greater than minReadySeconds",
                    ));
                }
            }
            if let Some(o) = o {
                let old_sel = o.spec.as_ref().map(|s| &s.selector);
                selector_immutable(&spec.selector, old_sel, &mut errs);
            }
            errs
        }),
        "ReplicaSet" => run::<ReplicaSet>(new, old, |n, o| {
            let mut errs = validate_meta(gvk(kind), &n.metadata, o.map(|o| &o.metadata));
            if status {
                errs.extend(status_nonnegative(new));
                return errs;
            }
            let spec = n.spec.clone().unwrap_or_default();
            let sp = Path::root("spec");
            nonnegative(&mut errs, spec.replicas.map(i64::from), &sp.child("replicas"));
            nonnegative(
                &mut errs,
                spec.min_ready_seconds.map(i64::from),
                &sp.child("minReadySeconds"),
            );
            let sel = selector_if_present(new, &spec.selector);
            validate_selector(sel, "deployment", &sp.child("selector"), &mut errs);
            match &spec.template {
                Some(t) => errs.extend(template_for_replica_set(
                    t,
                    sel,
                    &sp.child("template"),
                    "ReplicaSet",
                )),
                None => errs.push(FieldError::required(&sp.child("template"), "")),
            }
            if let Some(o) = o {
                let old_sel = o.spec.as_ref().map(|s| &s.selector);
                selector_immutable(&spec.selector, old_sel, &mut errs);
            }
            errs
        }),
        "DaemonSet" => run::<DaemonSet>(new, old, |n, o| {
            let mut errs = validate_meta(gvk(kind), &n.metadata, o.map(|o| &o.metadata));
            if status {
                errs.extend(status_nonnegative(new));
                return errs;
            }
            let spec = n.spec.clone().unwrap_or_default();
            let sp = Path::root("spec");
            errs.extend(meta::validate_label_selector(&spec.selector, &sp.child("selector")));
            let tlabels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
            let empty_labels = Default::default();
            let sel = selector_if_present(new, &spec.selector);
            if !sel.is_some_and(|s| {
                skiff_core::labels::label_selector_matches(s, tlabels.unwrap_or(&empty_labels))
            }) {
                errs.push(FieldError::invalid(
                    &sp.child("template").child("metadata").child("labels"),
                    go_string_map(tlabels),
                    "`selector` does not match template `labels`",
                ));
            }
            if skiff_core::labels::selector_is_empty(&spec.selector) {
                errs.push(FieldError::invalid(
                    &sp.child("selector"),
                    json_value(&spec.selector),
                    "empty selector is invalid for daemonset",
                ));
            }
            let tp = sp.child("template");
            errs.extend(pod::validate_pod_template(Some(&spec.template), &tp));
            template_restart_always(&spec.template, &tp, &mut errs);
            if let Some(ads) = spec.template.spec.as_ref().and_then(|s| s.active_deadline_seconds) {
                errs.push(FieldError::invalid(
                    &tp.child("spec").child("activeDeadlineSeconds"),
                    ads,
                    "activeDeadlineSeconds in DaemonSet is not Supported",
                ));
            }
            nonnegative(
                &mut errs,
                spec.min_ready_seconds.map(i64::from),
                &sp.child("minReadySeconds"),
            );
            validate_ds_strategy(
                spec.update_strategy.as_ref(),
                &sp.child("updateStrategy"),
                &mut errs,
            );
            nonnegative(
                &mut errs,
                spec.revision_history_limit.map(i64::from),
                &sp.child("revisionHistoryLimit"),
            );
            if let Some(o) = o {
                let old_sel = o.spec.as_ref().map(|s| &s.selector);
                selector_immutable(&spec.selector, old_sel, &mut errs);
            }
            errs
        }),
        "StatefulSet" => run::<StatefulSet>(new, old, |n, o| {
            let mut errs = validate_meta(gvk(kind), &n.metadata, o.map(|o| &o.metadata));
            if status {
                errs.extend(status_nonnegative(new));
                return errs;
            }
            let spec = n.spec.clone().unwrap_or_default();
            validate_sts_spec(&spec, selector_if_present(new, &spec.selector), &mut errs);
            if let Some(old_spec) = o.and_then(|o| o.spec.as_ref()) {
                let mut clone = spec.clone();
                clone.replicas = old_spec.replicas;
                clone.template = old_spec.template.clone();
                clone.update_strategy = old_spec.update_strategy.clone();
                clone.min_ready_seconds = old_spec.min_ready_seconds;
                clone.ordinals = old_spec.ordinals.clone();
                clone.revision_history_limit = old_spec.revision_history_limit;
                clone.persistent_volume_claim_retention_policy =
                    old_spec.persistent_volume_claim_retention_policy.clone();
                if clone != *old_spec {
                    errs.push(FieldError::forbidden(
                        &Path::root("spec"),
                        "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
                    ));
                }
            }
            errs
        }),
        // `ValidateControllerRevisionCreate` / `...Update`.
        "ControllerRevision" => run::<ControllerRevision>(new, old, |n, o| {
            let mut errs = validate_meta(gvk(kind), &n.metadata, o.map(|o| &o.metadata));
            if n.data.is_none() {
                errs.push(FieldError::required(&Path::root("data"), "data is mandatory"));
            }
            nonnegative(&mut errs, Some(n.revision), &Path::root("revision"));
            if let Some(o) = o
                && n.data != o.data
            {
                let data = n.data.as_ref().map(|d| d.0.clone()).unwrap_or_default();
                errs.push(FieldError::invalid(&Path::root("data"), &data, FIELD_IMMUTABLE));
            }
            errs
        }),
        _ => ErrorList::new(),
    }
}

fn gvk(kind: &str) -> Gvk<'_> {
    Gvk::new("apps", "v1", kind)
}

fn run<T: serde::de::DeserializeOwned>(
    new: &Value,
    old: Option<&Value>,
    f: impl FnOnce(&T, Option<&T>) -> ErrorList,
) -> ErrorList {
    let n: T = match typed(new) {
        Ok(n) => n,
        Err(e) => return e,
    };
    match old.map(typed::<T>).transpose() {
        Ok(o) => f(&n, o.as_ref()),
        Err(e) => e,
    }
}

/// The typed selector when the JSON carries one (k8s-openapi defaults a missing one).
fn selector_if_present<'a>(obj: &Value, sel: &'a LabelSelector) -> Option<&'a LabelSelector> {
    obj.get("spec").and_then(|s| s.get("selector")).is_some_and(|s| !s.is_null()).then_some(sel)
}

/// Selector required, valid and non-empty (`empty selector is invalid for <what>`).
fn validate_selector(sel: Option<&LabelSelector>, what: &str, path: &Path, errs: &mut ErrorList) {
    match sel {
        None => errs.push(FieldError::required(path, "")),
        Some(sel) => {
            errs.extend(meta::validate_label_selector(sel, path));
            if skiff_core::labels::selector_is_empty(sel) {
                errs.push(FieldError::invalid(
                    path,
                    json_value(sel),
                    format!("empty selector is invalid for {what}"),
                ));
            }
        }
    }
}

fn selector_immutable(new: &LabelSelector, old: Option<&LabelSelector>, errs: &mut ErrorList) {
    if let Some(old) = old
        && new != old
    {
        errs.push(FieldError::invalid(
            &Path::root("spec").child("selector"),
            json_value(new),
            FIELD_IMMUTABLE,
        ));
    }
}

/// `ValidatePodTemplateSpecForReplicaSet`.
fn template_for_replica_set(
    t: &PodTemplateSpec,
    sel: Option<&LabelSelector>,
    path: &Path,
    what: &str,
) -> ErrorList {
    let mut errs = ErrorList::new();
    let labels = t.metadata.as_ref().and_then(|m| m.labels.as_ref());
    let empty = Default::default();
    // A missing selector selects nothing (upstream `labels.Nothing()`), an empty one all.
    let matches = sel.is_some_and(|s| {
        skiff_core::labels::selector_is_empty(s)
            || skiff_core::labels::label_selector_matches(s, labels.unwrap_or(&empty))
    });
    if !matches {
        errs.push(FieldError::invalid(
            &path.child("metadata").child("labels"),
            go_string_map(labels),
            "`selector` does not match template `labels`",
        ));
    }
    errs.extend(pod::validate_pod_template(Some(t), path));
    template_restart_always(t, path, &mut errs);
    if t.spec.as_ref().is_some_and(|s| s.active_deadline_seconds.is_some()) {
        errs.push(FieldError::forbidden(
            &path.child("spec").child("activeDeadlineSeconds"),
            format!("activeDeadlineSeconds in {what} is not Supported"),
        ));
    }
    errs
}

fn template_restart_always(t: &PodTemplateSpec, path: &Path, errs: &mut ErrorList) {
    let rp = t.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or_default();
    if rp != "Always" {
        errs.push(FieldError::not_supported(
            &path.child("spec").child("restartPolicy"),
            rp,
            &["Always"],
        ));
    }
}

fn int_or_percent_value(v: &IntOrString) -> i64 {
    match v {
        IntOrString::Int(i) => i64::from(*i),
        IntOrString::String(s) => s.strip_suffix('%').and_then(|n| n.parse().ok()).unwrap_or(0),
    }
}

fn render_int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => super::field::go_quote(s),
    }
}

/// `ValidatePositiveIntOrPercent` and `IsNotMoreThan100Percent`.
pub(super) fn positive_int_or_percent(
    v: &IntOrString,
    path: &Path,
    at_most_100: bool,
    errs: &mut ErrorList,
) {
    let shown = super::field::Raw(render_int_or_string(v));
    match v {
        IntOrString::String(s) => {
            for m in names::is_valid_percent(s) {
                errs.push(FieldError::invalid(path, super::field::Raw(shown.0.clone()), m));
            }
        }
        IntOrString::Int(i) if *i < 0 => {
            errs.push(FieldError::invalid(path, i64::from(*i), NEGATIVE));
        }
        IntOrString::Int(_) => {}
    }
    if at_most_100
        && matches!(v, IntOrString::String(s) if names::is_valid_percent(s).is_empty())
        && int_or_percent_value(v) > 100
    {
        errs.push(FieldError::invalid(path, shown, "must not be greater than 100%"));
    }
}

fn validate_deployment_strategy(s: Option<&DeploymentStrategy>, path: &Path, errs: &mut ErrorList) {
    let default = DeploymentStrategy::default();
    let s = s.unwrap_or(&default);
    match s.type_.as_deref().unwrap_or_default() {
        "Recreate" => {
            if s.rolling_update.is_some() {
                errs.push(FieldError::forbidden(
                    &path.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match &s.rolling_update {
            None => errs.push(FieldError::required(
                &path.child("rollingUpdate"),
                "this should be defaulted and never be nil",
            )),
            Some(ru) => {
                let rp = path.child("rollingUpdate");
                let zero = IntOrString::Int(0);
                let mu = ru.max_unavailable.as_ref().unwrap_or(&zero);
                let ms = ru.max_surge.as_ref().unwrap_or(&zero);
                positive_int_or_percent(mu, &rp.child("maxUnavailable"), false, errs);
                positive_int_or_percent(ms, &rp.child("maxSurge"), false, errs);
                if int_or_percent_value(mu) == 0 && int_or_percent_value(ms) == 0 {
                    errs.push(FieldError::invalid(
                        &rp.child("maxUnavailable"),
                        super::field::Raw(render_int_or_string(mu)),
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
                if let IntOrString::String(_) = mu
                    && int_or_percent_value(mu) > 100
                {
                    errs.push(FieldError::invalid(
                        &rp.child("maxUnavailable"),
                        super::field::Raw(render_int_or_string(mu)),
                        "must not be greater than 100%",
                    ));
                }
            }
        },
        other => errs.push(FieldError::not_supported(path, other, &["Recreate", "RollingUpdate"])),
    }
}

fn validate_ds_strategy(s: Option<&DaemonSetUpdateStrategy>, path: &Path, errs: &mut ErrorList) {
    let default = DaemonSetUpdateStrategy::default();
    let s = s.unwrap_or(&default);
    match s.type_.as_deref().unwrap_or_default() {
        "OnDelete" => {}
        "RollingUpdate" => {
            let Some(ru) = &s.rolling_update else {
                errs.push(FieldError::required(&path.child("rollingUpdate"), ""));
                return;
            };
            let rp = path.child("rollingUpdate");
            let mut has_unavailable = false;
            let mut has_surge = false;
            if let Some(mu) = ru.max_unavailable.as_ref().filter(|v| int_or_percent_value(v) != 0) {
                has_unavailable = true;
                positive_int_or_percent(mu, &rp.child("maxUnavailable"), true, errs);
            }
            if let Some(ms) = ru.max_surge.as_ref().filter(|v| int_or_percent_value(v) != 0) {
                has_surge = true;
                positive_int_or_percent(ms, &rp.child("maxSurge"), true, errs);
            }
            if has_unavailable && has_surge {
                let ms = ru.max_surge.as_ref().map(render_int_or_string).unwrap_or_default();
                errs.push(FieldError::invalid(
                    &rp.child("maxSurge"),
                    super::field::Raw(ms),
                    "may not be set when maxUnavailable is non-zero",
                ));
            } else if !has_unavailable && !has_surge {
                errs.push(FieldError::required(
                    &rp.child("maxUnavailable"),
                    "cannot be 0 when maxSurge is 0",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(path, other, &["RollingUpdate", "OnDelete"])),
    }
}

fn validate_sts_spec(
    spec: &k8s_openapi::api::apps::v1::StatefulSetSpec,
    sel: Option<&LabelSelector>,
    errs: &mut ErrorList,
) {
    let sp = Path::root("spec");
    match spec.pod_management_policy.as_deref().unwrap_or_default() {
        "" => errs.push(FieldError::required(&sp.child("podManagementPolicy"), "")),
        "OrderedReady" | "Parallel" => {}
        other => errs.push(FieldError::invalid(
            &sp.child("podManagementPolicy"),
            other,
            "must be 'OrderedReady' or 'Parallel'",
        )),
    }
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let up = sp.child("updateStrategy");
    match strategy.type_.as_deref().unwrap_or_default() {
        "" => errs.push(FieldError::required(&up, "")),
        "OnDelete" => {
            if let Some(ru) = &strategy.rolling_update {
                errs.push(FieldError::invalid(
                    &up.child("rollingUpdate"),
                    json_value(ru),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            if let Some(ru) = &strategy.rolling_update {
                nonnegative(
                    errs,
                    ru.partition.map(i64::from),
                    &up.child("rollingUpdate").child("partition"),
                );
            }
        }
        _ => errs.push(FieldError::invalid(
            &up,
            json_value(&strategy),
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    if let Some(p) = &spec.persistent_volume_claim_retention_policy {
        let pp = sp.child("persistentVolumeClaimRetentionPolicy");
        for (v, name) in [(&p.when_deleted, "whenDeleted"), (&p.when_scaled, "whenScaled")] {
            let v = v.as_deref().unwrap_or_default();
            if !matches!(v, "Retain" | "Delete") {
                errs.push(FieldError::not_supported(&pp.child(name), v, &["Retain", "Delete"]));
            }
        }
    }
    nonnegative(errs, spec.replicas.map(i64::from), &sp.child("replicas"));
    nonnegative(errs, spec.min_ready_seconds.map(i64::from), &sp.child("minReadySeconds"));
    if let Some(o) = &spec.ordinals {
        nonnegative(errs, o.start.map(i64::from), &sp.child("ordinals").child("start"));
    }
    validate_selector(sel, "statefulset", &sp.child("selector"), errs);
    let tp = sp.child("template");
    let t = &spec.template;
    let labels = t.metadata.as_ref().and_then(|m| m.labels.as_ref());
    let empty = Default::default();
    let matches = sel.is_some_and(|s| {
        skiff_core::labels::selector_is_empty(s)
            || skiff_core::labels::label_selector_matches(s, labels.unwrap_or(&empty))
    });
    if !matches {
        errs.push(FieldError::invalid(
            &tp.child("metadata").child("labels"),
            go_string_map(labels),
            "`selector` does not match template `labels`",
        ));
    }
    if let Some(m) = &t.metadata {
        if let Some(l) = &m.labels {
            errs.extend(meta::validate_labels(l, &tp.child("labels")));
        }
        if let Some(a) = &m.annotations {
            errs.extend(meta::validate_annotations(a, &tp.child("annotations")));
        }
    }
    template_restart_always(t, &tp, errs);
    if t.spec.as_ref().is_some_and(|s| s.active_deadline_seconds.is_some()) {
        errs.push(FieldError::forbidden(
            &tp.child("spec").child("activeDeadlineSeconds"),
            "activeDeadlineSeconds in StatefulSet is not Supported",
        ));
    }
}

/// Status writes: every integer count must be >= 0.
fn status_nonnegative(obj: &Value) -> ErrorList {
    let mut errs = ErrorList::new();
    let sp = Path::root("status");
    if let Some(st) = obj.get("status").and_then(Value::as_object) {
        for (k, v) in st {
            if let Some(i) = v.as_i64() {
                nonnegative(&mut errs, Some(i), &sp.child(k));
            }
        }
    }
    errs
}

/// `ValidateScale`: metadata and `spec.replicas >= 0`.
pub fn validate_scale(new: &Value) -> ErrorList {
    let scale: Scale = match typed(new) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut errs = validate_meta(Gvk::new("autoscaling", "v1", "Scale"), &scale.metadata, None);
    if let Some(r) = scale.spec.and_then(|s| s.replicas)
        && r < 0
    {
        errs.push(FieldError::invalid(&Path::root("spec").child("replicas"), r, NEGATIVE));
    }
    errs
}
