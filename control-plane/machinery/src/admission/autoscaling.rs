//! autoscaling/v2 HorizontalPodAutoscaler: upstream's `SetDefaults_HorizontalPodAutoscaler`
//! and `ValidateHorizontalPodAutoscaler` (`pkg/apis/autoscaling`).

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, MetricSpec, MetricTarget,
};
use serde_json::{Value, json};
use skiff_core::autoscaling::{default_scale_down, default_scale_up};

use super::field::{ErrorList, FieldError, Path};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::nonnegative;
use super::names::is_valid_path_segment_name;
use super::value::{self, Obj};

/// The CPU utilization an HPA without metrics aims at (`autoscaling.DefaultCPUUtilization`).
pub const DEFAULT_CPU_UTILIZATION: i32 = 80;

const METRIC_TYPES: &[&str] = &["ContainerResource", "External", "Object", "Pods", "Resource"];
const TARGET_TYPES: &[&str] = &["AverageValue", "Utilization", "Value"];
const POLICY_TYPES: &[&str] = &["Percent", "Pods"];
const SELECT_POLICIES: &[&str] = &["Disabled", "Max", "Min"];
/// Longest stabilization window and policy period upstream allows.
const MAX_STABILIZATION_WINDOW: i32 = 3600;
const MAX_PERIOD: i32 = 1800;

/// `SetDefaults_HorizontalPodAutoscaler`: minReplicas 1, an 80% CPU utilization target
/// when no metric is given, and a given `behavior`'s missing rules and fields.
pub fn default_hpa(o: &mut Obj) {
    let Some(spec) = value::child(o, "spec") else { return };
    value::default_ptr(spec, "minReplicas", 1);
    if spec.get("metrics").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]),
        );
    }
    let Some(behavior) = spec.get_mut("behavior").and_then(Value::as_object_mut) else { return };
    for (direction, defaults) in
        [("scaleUp", default_scale_up()), ("scaleDown", default_scale_down())]
    {
        let rules = behavior.entry(direction).or_insert(Value::Null);
        if !rules.is_object() {
            *rules = defaults;
            continue;
        }
        let (Some(rules), Value::Object(defaults)) = (rules.as_object_mut(), defaults) else {
            continue;
        };
        for (field, default) in defaults {
            value::default_ptr(rules, &field, default);
        }
    }
}

/// `ValidateHorizontalPodAutoscaler` (create and update) and, through `/status`,
/// `ValidateHorizontalPodAutoscalerStatusUpdate`.
pub fn validate_hpa(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("autoscaling", "v2", "HorizontalPodAutoscaler");
    let (n, o) = match typed_pair::<HorizontalPodAutoscaler>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    if sub == Some("status") {
        let st = n.status.unwrap_or_default();
        let sp = Path::root("status");
        nonnegative(&mut errs, st.current_replicas.map(i64::from), &sp.child("currentReplicas"));
        nonnegative(&mut errs, Some(i64::from(st.desired_replicas)), &sp.child("desiredReplicas"));
        return errs;
    }
    let spec = n.spec.unwrap_or_default();
    let sp = Path::root("spec");
    let min = spec.min_replicas;
    if let Some(min) = min
        && min < 1
    {
        errs.push(FieldError::invalid(
            &sp.child("minReplicas"),
            min,
            "must be greater than or equal to 1",
        ));
    }
    if spec.max_replicas < 1 {
        errs.push(FieldError::invalid(
            &sp.child("maxReplicas"),
            spec.max_replicas,
            "must be greater than 0",
        ));
    }
    if let Some(min) = min
        && spec.max_replicas < min
    {
        errs.push(FieldError::invalid(
            &sp.child("maxReplicas"),
            spec.max_replicas,
            "must be greater than or equal to `minReplicas`",
        ));
    }
    let rp = sp.child("scaleTargetRef");
    for (field, v) in [("kind", &spec.scale_target_ref.kind), ("name", &spec.scale_target_ref.name)]
    {
        if v.is_empty() {
            errs.push(FieldError::required(&rp.child(field), ""));
        }
        for msg in is_valid_path_segment_name(v) {
            errs.push(FieldError::invalid(&rp.child(field), v.as_str(), msg));
        }
    }
    for (i, m) in spec.metrics.iter().flatten().enumerate() {
        validate_metric(m, &sp.child("metrics").index(i), &mut errs);
    }
    if let Some(b) = &spec.behavior {
        let bp = sp.child("behavior");
        for (field, rules) in [("scaleUp", &b.scale_up), ("scaleDown", &b.scale_down)] {
            if let Some(rules) = rules {
                validate_rules(rules, &bp.child(field), &mut errs);
            }
        }
    }
    errs
}

fn validate_metric(m: &MetricSpec, p: &Path, errs: &mut ErrorList) {
    if m.type_.is_empty() {
        errs.push(FieldError::required(&p.child("type"), "must specify a metric source type"));
        return;
    }
    if !METRIC_TYPES.contains(&m.type_.as_str()) {
        errs.push(FieldError::not_supported(&p.child("type"), m.type_.as_str(), METRIC_TYPES));
        return;
    }
    let sources = [
        ("ContainerResource", "containerResource", m.container_resource.is_some()),
        ("External", "external", m.external.is_some()),
        ("Object", "object", m.object.is_some()),
        ("Pods", "pods", m.pods.is_some()),
        ("Resource", "resource", m.resource.is_some()),
    ];
    let expected = sources.iter().find(|(t, _, _)| *t == m.type_).map(|(_, f, _)| *f);
    for (_, field, set) in &sources {
        if *set && Some(*field) != expected {
            errs.push(FieldError::forbidden(
                &p.child(field),
                "must populate the given metric source only",
            ));
        }
    }
    if let Some((_, field, false)) = sources.iter().find(|(t, _, _)| *t == m.type_) {
        errs.push(FieldError::required(
            &p.child(field),
            "must populate information for the given metric source",
        ));
        return;
    }
    if let Some(r) = &m.resource {
        let rp = p.child("resource");
        if r.name.is_empty() {
            errs.push(FieldError::required(&rp.child("name"), "must specify a resource name"));
        }
        validate_resource_target(&r.target, &rp.child("target"), errs);
    }
    if let Some(r) = &m.container_resource {
        let rp = p.child("containerResource");
        if r.name.is_empty() {
            errs.push(FieldError::required(&rp.child("name"), "must specify a resource name"));
        }
        if r.container.is_empty() {
            errs.push(FieldError::required(&rp.child("container"), "must specify a container"));
        }
        validate_resource_target(&r.target, &rp.child("target"), errs);
    }
    let other = [
        (m.pods.as_ref().map(|s| &s.target), "pods"),
        (m.object.as_ref().map(|s| &s.target), "object"),
        (m.external.as_ref().map(|s| &s.target), "external"),
    ];
    for (target, field) in other {
        if let Some(t) = target {
            validate_target(t, &p.child(field).child("target"), errs);
        }
    }
}

/// A Resource or ContainerResource target: a utilization or an average value, not both.
fn validate_resource_target(t: &MetricTarget, p: &Path, errs: &mut ErrorList) {
    validate_target(t, p, errs);
    match (&t.average_utilization, &t.average_value) {
        (None, None) => errs.push(FieldError::required(
            &p.child("averageUtilization"),
            "must set either a target raw value or a target utilization",
        )),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden(
            &p.child("averageValue"),
            "may not set both a target raw value and a target utilization",
        )),
        _ => {}
    }
}

/// `validateMetricTarget`: a known type, positive amounts.
fn validate_target(t: &MetricTarget, p: &Path, errs: &mut ErrorList) {
    if t.type_.is_empty() {
        errs.push(FieldError::required(&p.child("type"), "must specify a metric target type"));
    } else if !TARGET_TYPES.contains(&t.type_.as_str()) {
        errs.push(FieldError::not_supported(&p.child("type"), t.type_.as_str(), TARGET_TYPES));
    }
    if let Some(u) = t.average_utilization
        && u <= 0
    {
        errs.push(FieldError::invalid(&p.child("averageUtilization"), u, "must be greater than 0"));
    }
    for (field, q) in [("averageValue", &t.average_value), ("value", &t.value)] {
        if let Some(q) = q
            && skiff_core::quantity::Quantity::parse(&q.0).is_none_or(|v| v.0 <= 0)
        {
            errs.push(FieldError::invalid(&p.child(field), q.0.as_str(), "must be positive"));
        }
    }
}

fn validate_rules(r: &HPAScalingRules, p: &Path, errs: &mut ErrorList) {
    if let Some(w) = r.stabilization_window_seconds
        && !(0..=MAX_STABILIZATION_WINDOW).contains(&w)
    {
        let msg = if w < 0 {
            "must be greater than or equal to zero".to_string()
        } else {
            format!("must be less than or equal to {MAX_STABILIZATION_WINDOW}")
        };
        errs.push(FieldError::invalid(&p.child("stabilizationWindowSeconds"), w, msg));
    }
    if let Some(s) = r.select_policy.as_deref()
        && !SELECT_POLICIES.contains(&s)
    {
        errs.push(FieldError::not_supported(&p.child("selectPolicy"), s, SELECT_POLICIES));
    }
    let policies = r.policies.as_deref().unwrap_or_default();
    if policies.is_empty() {
        errs.push(FieldError::required(&p.child("policies"), "must specify at least one Policy"));
    }
    for (i, policy) in policies.iter().enumerate() {
        let pp = p.child("policies").index(i);
        if !POLICY_TYPES.contains(&policy.type_.as_str()) {
            errs.push(FieldError::not_supported(
                &pp.child("type"),
                policy.type_.as_str(),
                POLICY_TYPES,
            ));
        }
        if policy.value <= 0 {
            errs.push(FieldError::invalid(
                &pp.child("value"),
                policy.value,
                "must be greater than zero",
            ));
        }
        if policy.period_seconds <= 0 {
            errs.push(FieldError::invalid(
                &pp.child("periodSeconds"),
                policy.period_seconds,
                "must be greater than zero",
            ));
        } else if policy.period_seconds > MAX_PERIOD {
            errs.push(FieldError::invalid(
                &pp.child("periodSeconds"),
                policy.period_seconds,
                format!("must be less than or equal to {MAX_PERIOD}"),
            ));
        }
    }
}
