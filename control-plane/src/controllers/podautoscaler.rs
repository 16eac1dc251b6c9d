//! The HorizontalPodAutoscaler controller (upstream `pkg/controller/podautoscaler`): every
//! sync period (15 s) each autoscaler reads its target's `/scale`, its pods and their
//! `metrics.k8s.io` PodMetrics, computes the replicas each metric asks for, bounds that by
//! the stabilization window and scaling policies, rescales the target and writes its
//! status (current metrics, replicas, the AbleToScale, ScalingActive and ScalingLimited
//! conditions).
//!
//! Resource and ContainerResource metrics (CPU, memory: a utilization of the pods' requests
//! or an average value) are computed as upstream's replica calculator does, pods not ready
//! and pods without metrics included the conservative way. Pods, Object and External
//! metrics need a custom or external metrics API, which skiff does not serve: an
//! autoscaler with only those reports ScalingActive False and keeps the replicas.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus,
    MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};

use super::Context;
use super::events::{EventRecorder as Recorder, EventType};
use crate::machinery::admission::autoscaling::{default_scale_down, default_scale_up};
use crate::machinery::admission::quantity::Quantity;

/// Utilization changes within this fraction of the target do not rescale
/// (`--horizontal-pod-autoscaler-tolerance`).
pub const TOLERANCE: f64 = 0.1;
/// How long after a pod starts its CPU use is not trusted while it is not ready
/// (`--horizontal-pod-autoscaler-cpu-initialization-period`).
const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);

/// The component its Events name (upstream's).
const COMPONENT: &str = "horizontal-pod-autoscaler";

/// What a sync reads of one pod: its use and requests of a resource, and whether its
/// reading can be trusted.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    pub name: String,
    /// Sum of the (selected) containers' use, in milli-units (millicores, millibytes).
    pub usage: Option<i128>,
    /// Sum of the (selected) containers' requests, in milli-units (`None`: a container has
    /// none).
    pub request: Option<i128>,
    pub state: PodState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Ready,
    /// Pending, or (for CPU) not ready within its initialization period: its use does not
    /// count toward a scale-up.
    Unready,
    /// Being deleted or failed: left out.
    Ignored,
}

/// A metric's target: a utilization of the requests (percent) or an average value per pod
/// (milli-units).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    Utilization(i32),
    AverageValue(i128),
}

/// What one metric proposes, and what it measured (for the status).
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub replicas: i32,
    /// Percent of the requests (utilization targets).
    pub utilization: Option<i32>,
    /// Average use per pod, milli-units.
    pub average: i128,
}

/// Upstream's `GetResourceReplicas` / `GetRawResourceReplicas`: the replicas the pods' use
/// asks for, `current` when within tolerance or when pods without metrics (counted at the
/// target's edge: 0 for a scale-up, the request or target for a scale-down) or unready pods
/// (counted at 0 for a scale-up) would turn the direction around.
pub fn replicas_for(current: i32, pods: &[PodSample], target: Target) -> Result<Proposal, String> {
    let counted: Vec<&PodSample> = pods.iter().filter(|p| p.state != PodState::Ignored).collect();
    let with_metrics: Vec<&PodSample> = counted
        .iter()
        .copied()
        .filter(|p| p.state == PodState::Ready && p.usage.is_some())
        .collect();
    if with_metrics.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let missing: Vec<&PodSample> = counted
        .iter()
        .copied()
        .filter(|p| p.state == PodState::Ready && p.usage.is_none())
        .collect();
    let unready: Vec<&PodSample> =
        counted.iter().copied().filter(|p| p.state == PodState::Unready).collect();
    if let Target::Utilization(_) = target
        && let Some(p) = counted.iter().find(|p| p.request.is_none())
    {
        return Err(format!("missing request for the resource in pod {}", p.name));
    }
    // (usage, request) of the pods counted, as the ratio sees them.
    let measure = |samples: &[(i128, i128)]| -> (f64, Option<i32>, i128) {
        let usage: i128 = samples.iter().map(|s| s.0).sum();
        let average = usage / samples.len().max(1) as i128;
        match target {
            Target::Utilization(t) => {
                let request: i128 = samples.iter().map(|s| s.1).sum();
                let utilization = if request > 0 { (usage * 100 / request) as i32 } else { 0 };
                (f64::from(utilization) / f64::from(t), Some(utilization), average)
            }
            Target::AverageValue(t) => (average as f64 / t as f64, None, average),
        }
    };
    let sample = |p: &PodSample, usage: i128| (usage, p.request.unwrap_or(0));
    let measured: Vec<(i128, i128)> =
        with_metrics.iter().map(|p| sample(p, p.usage.unwrap_or(0))).collect();
    let (ratio, utilization, average) = measure(&measured);
    let proposal = |replicas| Proposal { replicas, utilization, average };
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok(proposal(current));
        }
        return Ok(proposal((ratio * with_metrics.len() as f64).ceil() as i32));
    }
    let mut rebalanced = measured;
    for p in &missing {
        let assumed = if ratio < 1.0 {
            match target {
                // 100% of the request, or the target when that is higher.
                Target::Utilization(t) => p.request.unwrap_or(0) * i128::from(t.max(100)) / 100,
                Target::AverageValue(t) => t,
            }
        } else {
            0
        };
        if ratio != 1.0 {
            rebalanced.push(sample(p, assumed));
        }
    }
    if scale_up_with_unready {
        rebalanced.extend(unready.iter().map(|p| sample(p, 0)));
    }
    let (new_ratio, _, _) = measure(&rebalanced);
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(proposal(current));
    }
    let replicas = (new_ratio * rebalanced.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(proposal(current));
    }
    Ok(proposal(replicas))
}

/// A past recommendation or rescale, for the stabilization windows and scaling policies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    pub at: Timestamp,
    pub value: i32,
}

/// What the controller remembers of an autoscaler between syncs.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub recommendations: Vec<Timed>,
    /// Replicas added (scale-ups) and removed (scale-downs), positive.
    pub scale_ups: Vec<Timed>,
    pub scale_downs: Vec<Timed>,
}

/// The outcome of bounding a recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    pub replicas: i32,
    /// ScalingLimited: (limited, reason, message).
    pub limited: (bool, &'static str, String),
}

/// The scaling rules of one direction, defaults filled in.
fn rules(given: Option<&HPAScalingRules>, defaults: Value) -> HPAScalingRules {
    let mut rules: HPAScalingRules = serde_json::from_value(defaults).unwrap_or_default();
    if let Some(g) = given {
        if g.stabilization_window_seconds.is_some() {
            rules.stabilization_window_seconds = g.stabilization_window_seconds;
        }
        if g.select_policy.is_some() {
            rules.select_policy.clone_from(&g.select_policy);
        }
        if g.policies.is_some() {
            rules.policies.clone_from(&g.policies);
        }
    }
    rules
}

/// Sum of the changes within `period` before `now`.
fn changed_within(events: &[Timed], now: Timestamp, period: i32) -> i32 {
    let since = now - jiff::SignedDuration::from_secs(i64::from(period));
    events.iter().filter(|e| e.at > since).map(|e| e.value).sum()
}

/// The most replicas the scale-up rules allow now (upstream
/// `calculateScaleUpLimitWithScalingRules`).
fn scale_up_limit(current: i32, history: &History, rules: &HPAScalingRules, now: Timestamp) -> i32 {
    let policies = rules.policies.as_deref().unwrap_or_default();
    let min_change = rules.select_policy.as_deref() == Some("Min");
    if rules.select_policy.as_deref() == Some("Disabled") || policies.is_empty() {
        return current;
    }
    let proposals = policies.iter().map(|p| {
        let start = current - changed_within(&history.scale_ups, now, p.period_seconds);
        match p.type_.as_str() {
            "Pods" => start + p.value,
            _ => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
        }
    });
    let limit = if min_change { proposals.min() } else { proposals.max() };
    limit.unwrap_or(current)
}

/// The fewest replicas the scale-down rules allow now.
fn scale_down_limit(
    current: i32,
    history: &History,
    rules: &HPAScalingRules,
    now: Timestamp,
) -> i32 {
    let policies = rules.policies.as_deref().unwrap_or_default();
    let min_change = rules.select_policy.as_deref() == Some("Min");
    if rules.select_policy.as_deref() == Some("Disabled") || policies.is_empty() {
        return current;
    }
    let proposals = policies.iter().map(|p| {
        let start = current + changed_within(&history.scale_downs, now, p.period_seconds);
        match p.type_.as_str() {
            "Pods" => start - p.value,
            _ => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
        }
    });
    let limit = if min_change { proposals.max() } else { proposals.min() };
    limit.unwrap_or(current)
}

/// Upstream's `normalizeDesiredReplicasWithBehaviors` (the default behavior when none is
/// given: scale-ups unstabilized up to max(4 pods, 100%) per 15 s, scale-downs stabilized
/// over `downscale_window`): records `proposed`, stabilizes it over the windows, limits the
/// change by the policies and bounds it by min and max replicas.
pub fn normalize(
    hpa: &HorizontalPodAutoscaler,
    history: &mut History,
    current: i32,
    proposed: i32,
    downscale_window: Duration,
    now: Timestamp,
) -> Bounded {
    let spec = hpa.spec.clone().unwrap_or_default();
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;
    let Some(behavior) = spec.behavior else {
        return normalize_without_behavior(
            history,
            current,
            proposed,
            min,
            max,
            downscale_window,
            now,
        );
    };

    let mut down_defaults = default_scale_down();
    down_defaults["stabilizationWindowSeconds"] = json!(downscale_window.as_secs());
    let up = rules(behavior.scale_up.as_ref(), default_scale_up());
    let down = rules(behavior.scale_down.as_ref(), down_defaults);
    let up_window = up.stabilization_window_seconds.unwrap_or(0);
    let down_window = down.stabilization_window_seconds.unwrap_or(300);

    // Stabilization: up to the lowest recommendation of the scale-up window, down to the
    // highest of the scale-down window.
    let longest = i64::from(up_window.max(down_window));
    history.recommendations.retain(|r| r.at > now - jiff::SignedDuration::from_secs(longest));
    let within = |window: i32| {
        let since = now - jiff::SignedDuration::from_secs(i64::from(window));
        history.recommendations.iter().filter(move |r| r.at > since).map(|r| r.value)
    };
    let up_to = within(up_window).chain([proposed]).min().unwrap_or(proposed);
    let down_to = within(down_window).chain([proposed]).max().unwrap_or(proposed);
    history.recommendations.push(Timed { at: now, value: proposed });
    let stabilized = current.max(up_to).min(down_to);

    let (replicas, limited) = if stabilized > current {
        let limit = scale_up_limit(current, history, &up, now).max(current);
        if max < limit {
            (
                stabilized.min(max),
                (
                    stabilized > max,
                    "TooManyReplicas",
                    "the desired replica count is more than the maximum replica count".to_string(),
                ),
            )
        } else {
            (
                stabilized.min(limit),
                (
                    stabilized > limit,
                    "ScaleUpLimit",
                    "the desired replica count is increasing faster than the maximum scale rate"
                        .to_string(),
                ),
            )
        }
    } else if stabilized < current {
        let limit = scale_down_limit(current, history, &down, now).min(current);
        if min > limit {
            (
                stabilized.max(min),
                (
                    stabilized < min,
                    "TooFewReplicas",
                    "the desired replica count is less than the minimum replica count".to_string(),
                ),
            )
        } else {
            (
                stabilized.max(limit),
                (
                    stabilized < limit,
                    "ScaleDownLimit",
                    "the desired replica count is decreasing faster than the maximum scale rate"
                        .to_string(),
                ),
            )
        }
    } else {
        (stabilized.clamp(min.min(max), max), (false, "", String::new()))
    };
    // A target outside the bounds is brought inside them, whatever the rules.
    let (replicas, limited) = if replicas > max {
        (
            max,
            (
                true,
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count".to_string(),
            ),
        )
    } else if replicas < min {
        (
            min,
            (
                true,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count".to_string(),
            ),
        )
    } else if limited.0 {
        (replicas, limited)
    } else {
        (
            replicas,
            (
                false,
                "DesiredWithinRange",
                "the desired count is within the acceptable range".to_string(),
            ),
        )
    };
    Bounded { replicas, limited }
}

/// Upstream's `normalizeDesiredReplicas`, for an autoscaler without `behavior`: the
/// highest recommendation of the downscale stabilization window, at most
/// max(2 × current, 4) and within min and max replicas.
fn normalize_without_behavior(
    history: &mut History,
    current: i32,
    proposed: i32,
    min: i32,
    max: i32,
    window: Duration,
    now: Timestamp,
) -> Bounded {
    let since = now - jiff::SignedDuration::from_secs(window.as_secs() as i64);
    history.recommendations.retain(|r| r.at > since);
    let stabilized =
        history.recommendations.iter().map(|r| r.value).chain([proposed]).max().unwrap_or(proposed);
    history.recommendations.push(Timed { at: now, value: proposed });
    let scale_up_limit = (2 * current).max(4);
    let (allowed, reason, message) = if max > scale_up_limit {
        (
            scale_up_limit,
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate",
        )
    } else {
        (max, "TooManyReplicas", "the desired replica count is more than the maximum replica count")
    };
    let (replicas, limited) = if stabilized < min {
        (
            min,
            (
                true,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            ),
        )
    } else if stabilized > allowed {
        (allowed, (true, reason, message))
    } else {
        (
            stabilized,
            (false, "DesiredWithinRange", "the desired count is within the acceptable range"),
        )
    };
    Bounded { replicas, limited: (limited.0, limited.1, limited.2.to_string()) }
}

/// Run the autoscalers every `ctx.config.hpa_sync_period` until dropped.
pub async fn run(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(ctx.config.hpa_sync_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let recorder = Recorder::new(ctx.client.clone(), COMPONENT);
    let mut histories: HashMap<(String, String), History> = HashMap::new();
    loop {
        tick.tick().await;
        let api: Api<HorizontalPodAutoscaler> = Api::all(ctx.client.clone());
        let hpas = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %e, "listing horizontal pod autoscalers");
                continue;
            }
        };
        let keys: Vec<(String, String)> =
            hpas.iter().map(|h| (h.namespace().unwrap_or_default(), h.name_any())).collect();
        histories.retain(|k, _| keys.contains(k));
        for (hpa, key) in hpas.into_iter().zip(keys) {
            let history = histories.entry(key.clone()).or_default();
            if let Err(e) = sync(&ctx, &recorder, hpa, history).await {
                tracing::warn!(hpa = %format!("{}/{}", key.0, key.1), error = %e, "autoscaling");
            }
        }
    }
}

/// The target's resource (its plural) from the reference's kind.
fn target_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "Deployment" => "deployments".to_string(),
        "ReplicaSet" => "replicasets".to_string(),
        "StatefulSet" => "statefulsets".to_string(),
        "ReplicationController" => "replicationcontrollers".to_string(),
        other => format!("{}s", other.to_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

fn pod_metrics_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"),
        "pods",
    )
}

/// Milli-units of a quantity.
fn milli(q: &str) -> Option<i128> {
    Quantity::parse(q).map(|q| q.0 / 1_000_000)
}

/// The resource and container a metric reads, and its target.
fn resource_metric(m: &MetricSpec) -> Option<(&str, Option<&str>, Option<Target>)> {
    let (name, container, target) = match (&m.resource, &m.container_resource) {
        (Some(r), _) if m.type_ == "Resource" => (r.name.as_str(), None, &r.target),
        (_, Some(r)) if m.type_ == "ContainerResource" => {
            (r.name.as_str(), Some(r.container.as_str()), &r.target)
        }
        _ => return None,
    };
    let target = match (target.average_utilization, &target.average_value) {
        (Some(u), _) => Some(Target::Utilization(u)),
        (None, Some(v)) => milli(&v.0).map(Target::AverageValue),
        _ => None,
    };
    Some((name, container, target))
}

/// The pods' samples of `resource` (of one container, if given).
fn samples(
    pods: &[Pod],
    metrics: &BTreeMap<String, Value>,
    resource: &str,
    container: Option<&str>,
    now: Timestamp,
) -> Vec<PodSample> {
    pods.iter()
        .map(|pod| {
            let name = pod.name_any();
            let status = pod.status.clone().unwrap_or_default();
            let phase = status.phase.as_deref().unwrap_or("Pending");
            let ready_condition = status.conditions.iter().flatten().find(|c| c.type_ == "Ready");
            let started = status.start_time.as_ref().map(|t| t.0);
            // Upstream's groupPods: CPU read while a pod starts is not trusted until it is
            // ready; after the initialization period, only a pod never ready is left out.
            let cpu_unready = match (ready_condition, started) {
                (Some(c), Some(start)) => {
                    let initializing =
                        now.duration_since(start).unsigned_abs() < CPU_INITIALIZATION_PERIOD;
                    let never_ready = c.last_transition_time.as_ref().is_none_or(|t| {
                        t.0.duration_since(start).unsigned_abs() < Duration::from_secs(30)
                    });
                    c.status == "False" && (initializing || never_ready)
                }
                _ => true,
            };
            let state = if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
                PodState::Ignored
            } else if phase == "Pending" || (resource == "cpu" && cpu_unready) {
                PodState::Unready
            } else {
                PodState::Ready
            };
            let wanted = |c: &str| container.is_none_or(|w| w == c);
            let request = pod.spec.as_ref().map_or(Some(0), |spec| {
                spec.containers.iter().filter(|c| wanted(&c.name)).try_fold(0i128, |sum, c| {
                    let q = c.resources.as_ref()?.requests.as_ref()?.get(resource)?;
                    Some(sum + milli(&q.0)?)
                })
            });
            let usage = metrics.get(&name).and_then(|m| {
                let containers = m.get("containers")?.as_array()?;
                let used: Vec<i128> = containers
                    .iter()
                    .filter(|c| c.get("name").and_then(Value::as_str).is_some_and(wanted))
                    .filter_map(|c| milli(c.pointer(&format!("/usage/{resource}"))?.as_str()?))
                    .collect();
                (!used.is_empty()).then(|| used.iter().sum())
            });
            PodSample { name, usage, request, state }
        })
        .collect()
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
) -> HorizontalPodAutoscalerCondition {
    HorizontalPodAutoscalerCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(Time(Timestamp::now())),
    }
}

/// The new conditions, each keeping its transition time while its status is unchanged.
fn merge_conditions(
    old: &[HorizontalPodAutoscalerCondition],
    new: Vec<HorizontalPodAutoscalerCondition>,
) -> Vec<HorizontalPodAutoscalerCondition> {
    new.into_iter()
        .map(|mut c| {
            if let Some(o) = old.iter().find(|o| o.type_ == c.type_ && o.status == c.status) {
                c.last_transition_time.clone_from(&o.last_transition_time);
            }
            c
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("writing the status")]
    Status(#[source] kube::Error),
}

/// One autoscaler's sync.
async fn sync(
    ctx: &Context,
    recorder: &Recorder,
    hpa: HorizontalPodAutoscaler,
    history: &mut History,
) -> Result<(), Error> {
    let ns = hpa.namespace().unwrap_or_default();
    let spec = hpa.spec.clone().unwrap_or_default();
    let old_status = hpa.status.clone().unwrap_or_default();
    let old_conditions = old_status.conditions.clone().unwrap_or_default();
    let target = &spec.scale_target_ref;
    let now = Timestamp::now();
    let write_status = |status: HorizontalPodAutoscalerStatus| {
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
        let name = hpa.name_any();
        async move {
            // Upstream replaces the status: metrics no longer measured are cleared.
            let mut status = serde_json::to_value(status).unwrap_or_default();
            if let Some(s) = status.as_object_mut() {
                s.entry("currentMetrics").or_insert(Value::Null);
            }
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map(drop)
            .map_err(Error::Status)
        }
    };

    let ar = target_resource(target.api_version.as_deref().unwrap_or(""), &target.kind);
    let targets: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    let scale = match targets.get_scale(&target.name).await {
        Ok(s) => s,
        Err(e) => {
            let message =
                format!("the HPA controller was unable to get the target's current scale: {e}");
            recorder.record(&hpa, EventType::Warning, "FailedGetScale", &message).await;
            let conditions = vec![condition("AbleToScale", false, "FailedGetScale", message)];
            return write_status(HorizontalPodAutoscalerStatus {
                conditions: Some(merge_conditions(&old_conditions, conditions)),
                ..old_status
            })
            .await;
        }
    };
    let current = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
    let selector = scale.status.and_then(|s| s.selector).unwrap_or_default();
    if selector.is_empty() {
        let message = "the HPA target's scale is missing a selector";
        recorder.record(&hpa, EventType::Warning, "SelectorRequired", message).await;
        let conditions = vec![
            condition(
                "AbleToScale",
                true,
                "SucceededGetScale",
                "the HPA controller was able to get the target's current scale",
            ),
            condition("ScalingActive", false, "InvalidSelector", message),
        ];
        return write_status(HorizontalPodAutoscalerStatus {
            current_replicas: Some(current),
            conditions: Some(merge_conditions(&old_conditions, conditions)),
            ..old_status
        })
        .await;
    }

    let mut conditions = Vec::new();
    let mut metric_statuses = Vec::new();
    let (desired, reason) = if current == 0 && spec.min_replicas.unwrap_or(1) != 0 {
        conditions.push(condition(
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
        ));
        (0, String::new())
    } else {
        let (proposals, errors) =
            measure(ctx, &ns, &spec.metrics.clone().unwrap_or_default(), &selector, current, now)
                .await;
        metric_statuses = proposals.iter().map(|(_, s, _)| s.clone()).collect();
        match proposals.iter().max_by_key(|(p, _, _)| p.replicas) {
            None => {
                let first = errors.first().cloned().unwrap_or_else(|| "no metrics".into());
                let message = format!("the HPA was unable to compute the replica count: {first}");
                recorder.record(&hpa, EventType::Warning, "FailedGetResourceMetric", &first).await;
                conditions.push(condition(
                    "AbleToScale",
                    true,
                    "SucceededGetScale",
                    "the HPA controller was able to get the target's current scale",
                ));
                conditions.push(condition(
                    "ScalingActive",
                    false,
                    "FailedGetResourceMetric",
                    message,
                ));
                return write_status(HorizontalPodAutoscalerStatus {
                    current_replicas: Some(current),
                    desired_replicas: old_status.desired_replicas,
                    current_metrics: None,
                    conditions: Some(merge_conditions(&old_conditions, conditions)),
                    last_scale_time: old_status.last_scale_time.clone(),
                    observed_generation: hpa.metadata.generation,
                })
                .await;
            }
            Some((p, _, reason)) => {
                conditions.push(condition(
                    "ScalingActive",
                    true,
                    "ValidMetricFound",
                    "the HPA was able to successfully calculate a replica count from metrics",
                ));
                (p.replicas, reason.clone())
            }
        }
    };
    let bounded =
        normalize(&hpa, history, current, desired, ctx.config.hpa_downscale_stabilization, now);
    if conditions.iter().all(|c| c.status == "True") {
        let (limited, why, message) = &bounded.limited;
        conditions.push(condition("ScalingLimited", *limited, why, message.clone()));
    }
    let mut last_scale_time = old_status.last_scale_time.clone();
    let rescale =
        bounded.replicas != current && !(current == 0 && spec.min_replicas.unwrap_or(1) != 0);
    if rescale {
        let reason = if bounded.replicas > current && !reason.is_empty() {
            reason
        } else {
            "All metrics below target".to_string()
        };
        match targets
            .patch_scale(
                &target.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": bounded.replicas}})),
            )
            .await
        {
            Ok(_) => {
                let message = format!("New size: {}; reason: {reason}", bounded.replicas);
                recorder.record(&hpa, EventType::Normal, "SuccessfulRescale", &message).await;
                let change = Timed { at: now, value: (bounded.replicas - current).abs() };
                if bounded.replicas > current {
                    history.scale_ups.push(change)
                } else {
                    history.scale_downs.push(change)
                }
                last_scale_time = Some(Time(now));
                conditions.insert(
                    0,
                    condition(
                        "AbleToScale",
                        true,
                        "SucceededRescale",
                        format!(
                            "the HPA controller was able to update the target scale to {}",
                            bounded.replicas
                        ),
                    ),
                );
            }
            Err(e) => {
                let message =
                    format!("the HPA controller was unable to update the target scale: {e}");
                recorder.record(&hpa, EventType::Warning, "FailedRescale", &message).await;
                conditions.insert(0, condition("AbleToScale", false, "FailedUpdateScale", message));
            }
        }
    } else {
        conditions.insert(
            0,
            condition(
                "AbleToScale",
                true,
                "ReadyForNewScale",
                "recommended size matches current size",
            ),
        );
    }
    // Rescales older than any policy period are no longer needed.
    let keep = now - jiff::SignedDuration::from_secs(1800);
    history.scale_ups.retain(|e| e.at > keep);
    history.scale_downs.retain(|e| e.at > keep);
    write_status(HorizontalPodAutoscalerStatus {
        current_replicas: Some(current),
        desired_replicas: bounded.replicas,
        current_metrics: (!metric_statuses.is_empty()).then_some(metric_statuses),
        conditions: Some(merge_conditions(&old_conditions, conditions)),
        last_scale_time,
        observed_generation: hpa.metadata.generation,
    })
    .await
}

/// Each metric's proposal, status and rescale reason; and the errors of those that could
/// not be computed.
async fn measure(
    ctx: &Context,
    ns: &str,
    metrics: &[MetricSpec],
    selector: &str,
    current: i32,
    now: Timestamp,
) -> (Vec<(Proposal, MetricStatus, String)>, Vec<String>) {
    let mut errors = Vec::new();
    let mut out = Vec::new();
    let params = ListParams::default().labels(selector);
    let pods = match Api::<Pod>::namespaced(ctx.client.clone(), ns).list(&params).await {
        Ok(list) => list.items,
        Err(e) => return (out, vec![format!("listing the target's pods: {e}")]),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), ns, &pod_metrics_resource());
    let pod_metrics: BTreeMap<String, Value> = match api.list(&params).await {
        Ok(list) => list.items.into_iter().map(|m| (m.name_any(), m.data)).collect(),
        Err(e) => return (out, vec![format!("unable to get metrics for the pods: {e}")]),
    };
    for m in metrics {
        let Some((resource, container, target)) = resource_metric(m) else {
            errors.push(format!(
                "{} metrics need a custom or external metrics API, which is not served",
                m.type_
            ));
            continue;
        };
        let Some(target) = target else {
            errors.push(format!("the {resource} metric has no usable target"));
            continue;
        };
        let pod_samples = samples(&pods, &pod_metrics, resource, container, now);
        match replicas_for(current, &pod_samples, target) {
            Ok(p) => {
                let current_value = json!({
                    "averageUtilization": p.utilization,
                    "averageValue": milli_quantity(p.average),
                });
                let current: MetricValueStatus =
                    serde_json::from_value(current_value).unwrap_or_default();
                let status = match container {
                    None => MetricStatus {
                        type_: "Resource".into(),
                        resource: Some(ResourceMetricStatus { name: resource.into(), current }),
                        ..Default::default()
                    },
                    Some(c) => MetricStatus {
                        type_: "ContainerResource".into(),
                        container_resource: Some(ContainerResourceMetricStatus {
                            name: resource.into(),
                            container: c.into(),
                            current,
                        }),
                        ..Default::default()
                    },
                };
                let what = match target {
                    Target::Utilization(_) => "resource utilization (percentage of request)",
                    Target::AverageValue(_) => "resource",
                };
                let reason = match container {
                    None => format!("{resource} {what} above target"),
                    Some(c) => format!("{resource} container {c} {what} above target"),
                };
                out.push((p, status, reason));
            }
            Err(e) => errors.push(format!("failed to get {resource} utilization: {e}")),
        }
    }
    (out, errors)
}

/// A milli-unit amount as a canonical quantity.
fn milli_quantity(m: i128) -> KQuantity {
    let text = format!("{m}m");
    KQuantity(crate::machinery::admission::quantity::canonical(&text).unwrap_or(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, usage: Option<i128>, request: i128, state: PodState) -> PodSample {
        PodSample { name: name.into(), usage, request: Some(request), state }
    }

    #[test]
    fn replicas_follow_utilization_with_tolerance() {
        let t = Target::Utilization(50);
        // 2 pods at 150m of 100m requested: 150% against 50% → 6.
        let pods =
            [pod("a", Some(150), 100, PodState::Ready), pod("b", Some(150), 100, PodState::Ready)];
        let p = replicas_for(2, &pods, t).unwrap();
        assert_eq!((p.replicas, p.utilization, p.average), (6, Some(150), 150));
        // 54% against 50% is within the 10% tolerance.
        let pods = [pod("a", Some(54), 100, PodState::Ready)];
        assert_eq!(replicas_for(3, &pods, t).unwrap().replicas, 3);
        // An average value: 900m over 3 pods against 200m per pod → ceil(4.5 * 3)... of 3 pods.
        let pods = [
            pod("a", Some(300), 0, PodState::Ready),
            pod("b", Some(300), 0, PodState::Ready),
            pod("c", Some(300), 0, PodState::Ready),
        ];
        assert_eq!(replicas_for(3, &pods, Target::AverageValue(200)).unwrap().replicas, 5);
    }

    #[test]
    fn pods_without_metrics_and_unready_pods_are_counted_conservatively() {
        let t = Target::Utilization(50);
        // Scale-up: the pod without metrics counts as idle: (200+0)/200 = 100% → 4 of 2.
        let pods =
            [pod("a", Some(200), 100, PodState::Ready), pod("b", None, 100, PodState::Ready)];
        assert_eq!(replicas_for(2, &pods, t).unwrap().replicas, 4);
        // Scale-down: the pod without metrics counts at its request, and that flips the
        // direction (10% + 100% over two = 55% ≥ 50%): no change.
        let pods = [pod("a", Some(10), 100, PodState::Ready), pod("b", None, 100, PodState::Ready)];
        assert_eq!(replicas_for(2, &pods, t).unwrap().replicas, 2);
        // An unready pod counts as idle for a scale-up: (300 + 0) / 200 = 150% → 6 of 2.
        let pods = [
            pod("a", Some(300), 100, PodState::Ready),
            pod("b", Some(900), 100, PodState::Unready),
        ];
        assert_eq!(replicas_for(2, &pods, t).unwrap().replicas, 6);
        // Ignored pods are left out; with no pod measured there is no answer.
        let pods =
            [pod("a", Some(300), 100, PodState::Ignored), pod("b", None, 100, PodState::Unready)];
        assert!(replicas_for(2, &pods, t).unwrap_err().contains("did not receive metrics"));
        let no_request = PodSample { request: None, ..pod("a", Some(1), 0, PodState::Ready) };
        assert!(replicas_for(1, &[no_request], t).unwrap_err().contains("missing request"));
    }

    fn hpa(spec: Value) -> HorizontalPodAutoscaler {
        serde_json::from_value(json!({"metadata": {"name": "h"}, "spec": spec})).unwrap()
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn without_behavior_scale_up_doubles_and_scale_down_is_stabilized() {
        let h = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 1, "maxReplicas": 100}),
        );
        let mut history = History::default();
        let five_min = Duration::from_secs(300);
        // From 1: at most max(2 * 1, 4) = 4; then from 4 at most 8, at once.
        let b = normalize(&h, &mut history, 1, 20, five_min, at(0));
        assert_eq!((b.replicas, b.limited.0, b.limited.1), (4, true, "ScaleUpLimit"));
        assert_eq!(normalize(&h, &mut history, 4, 20, five_min, at(10)).replicas, 8);
        // A lower recommendation waits for the 5-minute window's highest (20, here still
        // limited to twice the current replicas).
        assert_eq!(normalize(&h, &mut history, 8, 2, five_min, at(30)).replicas, 16);
        let b = normalize(&h, &mut history, 10, 2, five_min, at(400));
        assert_eq!(b.replicas, 2);
        // Bounds.
        let b = normalize(&h, &mut History::default(), 100, 500, five_min, at(0));
        assert_eq!((b.replicas, b.limited.1), (100, "TooManyReplicas"));
        let b = normalize(&h, &mut History::default(), 3, 0, five_min, at(0));
        assert_eq!((b.replicas, b.limited.1), (1, "TooFewReplicas"));
        let b = normalize(&h, &mut History::default(), 1, 1, five_min, at(0));
        assert_eq!((b.replicas, b.limited.0, b.limited.1), (1, false, "DesiredWithinRange"));
    }

    #[test]
    fn default_rules_limit_scale_up_per_period() {
        let h = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 1, "maxReplicas": 100,
            "behavior": {}}),
        );
        let mut history = History::default();
        let d = Duration::from_secs(300);
        // From 1: the larger of +4 pods and +100% per 15 s.
        let b = normalize(&h, &mut history, 1, 20, d, at(0));
        assert_eq!((b.replicas, b.limited.1), (5, "ScaleUpLimit"));
        history.scale_ups.push(Timed { at: at(0), value: 4 });
        assert_eq!(normalize(&h, &mut history, 5, 20, d, at(10)).replicas, 5);
        assert_eq!(normalize(&h, &mut history, 5, 20, d, at(20)).replicas, 10);
    }

    #[test]
    fn given_behavior_rules_apply() {
        let h = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 2, "maxReplicas": 10,
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
                         "scaleUp": {"selectPolicy": "Disabled"}}}),
        );
        let mut history = History::default();
        let d = Duration::from_secs(300);
        assert_eq!(normalize(&h, &mut history, 5, 9, d, at(0)).replicas, 5, "scale-up disabled");
        let b = normalize(&h, &mut history, 5, 1, d, at(1));
        assert_eq!((b.replicas, b.limited.1), (4, "ScaleDownLimit"));
        history.scale_downs.push(Timed { at: at(1), value: 1 });
        assert_eq!(normalize(&h, &mut history, 4, 1, d, at(30)).replicas, 4, "one pod a minute");
        assert_eq!(normalize(&h, &mut history, 4, 1, d, at(70)).replicas, 3);
    }

    #[test]
    fn samples_read_requests_usage_and_readiness() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "app", "image": "i", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "side", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]},
            "status": {"phase": "Running", "startTime": "2020-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:05Z"}]}})).unwrap();
        let metrics = BTreeMap::from([(
            "p".to_string(),
            json!({"containers": [
            {"name": "app", "usage": {"cpu": "150m", "memory": "10Mi"}},
            {"name": "side", "usage": {"cpu": "50000000n", "memory": "1Mi"}}]}),
        )]);
        let now = Timestamp::now();
        let all = samples(std::slice::from_ref(&pod), &metrics, "cpu", None, now);
        assert_eq!(
            all,
            [PodSample {
                name: "p".into(),
                usage: Some(200),
                request: Some(300),
                state: PodState::Ready
            }]
        );
        let app = samples(std::slice::from_ref(&pod), &metrics, "cpu", Some("app"), now);
        assert_eq!((app[0].usage, app[0].request), (Some(150), Some(200)));
        let memory = samples(std::slice::from_ref(&pod), &metrics, "memory", None, now);
        assert_eq!((memory[0].usage, memory[0].request), (Some(11 * 1024 * 1024 * 1000), None));
    }
}
