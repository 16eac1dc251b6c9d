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
//! metrics need a custom or external metrics API, which skiff does not serve: such a
//! metric is invalid, and (as upstream) an autoscaler with an invalid metric scales up on
//! the others but never down.

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
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};

use crate::context::Context;
use skiff_core::autoscaling::{default_scale_down, default_scale_up};
use skiff_core::cron::go_duration_nanos;
use skiff_core::events::{EventRecorder as Recorder, EventType};
use skiff_core::quantity::{self, Quantity};

/// Utilization changes within this fraction of the target do not rescale
/// (`--horizontal-pod-autoscaler-tolerance`).
pub const TOLERANCE: f64 = 0.1;
/// How long after a pod starts its CPU use is not trusted while it is not ready
/// (`--horizontal-pod-autoscaler-cpu-initialization-period`).
const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);
/// A pod whose Ready condition changed this soon after it started never was ready
/// (`--horizontal-pod-autoscaler-initial-readiness-delay`).
const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);
/// The shortest sync period honoured (a zero period would spin).
const MIN_PERIOD: Duration = Duration::from_millis(100);

/// The component its Events name (upstream's).
const COMPONENT: &str = "horizontal-pod-autoscaler";

/// What a sync reads of one pod: its use and requests of a resource, and whether its
/// reading can be trusted.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    pub name: String,
    /// Sum of the (selected) containers' use, in milli-units (millicores, millibytes);
    /// `None`: the pod has no metrics, or not for every selected container.
    pub usage: Option<i128>,
    /// Sum of the (selected) containers' requests, in milli-units, or which one has none.
    pub request: Result<i128, String>,
    pub state: PodState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Its reading counts (or, without one, it is a pod missing metrics).
    Ready,
    /// Pending, or (for CPU) not ready while starting: its use does not count toward a
    /// scale-up.
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
    if let Target::Utilization(_) = target
        && let Some(Err(e)) = pods.iter().map(|p| p.request.clone()).find(Result::is_err)
    {
        return Err(e);
    }
    if let Target::AverageValue(t) = target
        && t <= 0
    {
        return Err("the target average value is not positive".into());
    }
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
    // (usage, request) of the pods counted, as the ratio sees them.
    let measure = |samples: &[(i128, i128)]| -> Result<(f64, Option<i32>, i128), String> {
        let usage: i128 = samples.iter().map(|s| s.0).sum();
        let average = usage / samples.len().max(1) as i128;
        match target {
            Target::Utilization(t) => {
                let request: i128 = samples.iter().map(|s| s.1).sum();
                if request <= 0 {
                    return Err("no metrics returned matched known pods".into());
                }
                let utilization = i32::try_from(usage * 100 / request).unwrap_or(i32::MAX);
                Ok((f64::from(utilization) / f64::from(t), Some(utilization), average))
            }
            Target::AverageValue(t) => Ok((average as f64 / t as f64, None, average)),
        }
    };
    let request = |p: &PodSample| p.request.clone().unwrap_or(0);
    let measured: Vec<(i128, i128)> =
        with_metrics.iter().map(|p| (p.usage.unwrap_or(0), request(p))).collect();
    let (ratio, utilization, average) = measure(&measured)?;
    let proposal = |replicas: f64| Proposal {
        replicas: replicas.ceil().clamp(0.0, f64::from(i32::MAX)) as i32,
        utilization,
        average,
    };
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok(proposal(f64::from(current)));
        }
        return Ok(proposal(ratio * with_metrics.len() as f64));
    }
    let mut rebalanced = measured;
    if ratio != 1.0 {
        for p in &missing {
            let assumed = match (ratio < 1.0, target) {
                (false, _) => 0,
                // 100% of the request, or the target when that is higher.
                (true, Target::Utilization(t)) => request(p) * i128::from(t.max(100)) / 100,
                (true, Target::AverageValue(t)) => t,
            };
            rebalanced.push((assumed, request(p)));
        }
    }
    if scale_up_with_unready {
        rebalanced.extend(unready.iter().map(|p| (0, request(p))));
    }
    let (new_ratio, _, _) = measure(&rebalanced)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(proposal(f64::from(current)));
    }
    let replicas = proposal(new_ratio * rebalanced.len() as f64);
    if (new_ratio < 1.0 && replicas.replicas > current)
        || (new_ratio > 1.0 && replicas.replicas < current)
    {
        return Ok(proposal(f64::from(current)));
    }
    Ok(replicas)
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
    /// Seeded with the replicas found at the first sync (upstream's
    /// `recordInitialRecommendation`): a new autoscaler, or a restarted controller, does
    /// not scale down before a whole stabilization window has passed.
    pub recommendations: Vec<Timed>,
    /// Replicas added (scale-ups) and removed (scale-downs), positive.
    pub scale_ups: Vec<Timed>,
    pub scale_downs: Vec<Timed>,
    /// The first sync's replicas were recorded.
    pub seeded: bool,
}

/// The outcome of bounding a recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    pub replicas: i32,
    /// AbleToScale while no rescale happens: (reason, message).
    pub able: (&'static str, &'static str),
    /// ScalingLimited: (limited, reason, message).
    pub limited: (bool, &'static str, &'static str),
}

const READY_FOR_NEW_SCALE: (&str, &str) =
    ("ReadyForNewScale", "recommended size matches current size");
const SCALE_UP_STABILIZED: (&str, &str) = (
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const SCALE_DOWN_STABILIZED: (&str, &str) = (
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const TOO_MANY: (bool, &str, &str) =
    (true, "TooManyReplicas", "the desired replica count is more than the maximum replica count");
const TOO_FEW: (bool, &str, &str) =
    (true, "TooFewReplicas", "the desired replica count is less than the minimum replica count");
const SCALE_UP_LIMIT: (bool, &str, &str) = (
    true,
    "ScaleUpLimit",
    "the desired replica count is increasing faster than the maximum scale rate",
);
const SCALE_DOWN_LIMIT: (bool, &str, &str) = (
    true,
    "ScaleDownLimit",
    "the desired replica count is decreasing faster than the maximum scale rate",
);
const WITHIN_RANGE: (bool, &str, &str) =
    (false, "DesiredWithinRange", "the desired count is within the acceptable range");

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

/// Sum of the changes within `period` seconds before `now`.
fn changed_within(events: &[Timed], now: Timestamp, period: i32) -> i32 {
    let since = skiff_core::time::sub_secs(now, i64::from(period));
    events.iter().filter(|e| e.at > since).fold(0i32, |sum, e| sum.saturating_add(e.value))
}

/// The replica count a scaling policy period started from: now's, less what was added and
/// plus what was removed within it.
fn period_start(current: i32, history: &History, now: Timestamp, period: i32) -> i32 {
    current
        .saturating_sub(changed_within(&history.scale_ups, now, period))
        .saturating_add(changed_within(&history.scale_downs, now, period))
}

/// The replica count the rules of one direction allow now (upstream's
/// `calculateScaleUpLimitWithScalingRules` and `calculateScaleDownLimitWithBehaviors`):
/// each policy moves the count its period started from by its pods or percent; `Max`
/// takes the policy allowing the most change, `Min` the least, `Disabled` none.
fn scale_limit(
    current: i32,
    history: &History,
    rules: &HPAScalingRules,
    now: Timestamp,
    up: bool,
) -> i32 {
    let policies = rules.policies.as_deref().unwrap_or_default();
    if rules.select_policy.as_deref() == Some("Disabled") || policies.is_empty() {
        return current;
    }
    let proposals = policies.iter().map(|p| {
        let start = period_start(current, history, now, p.period_seconds);
        match (p.type_.as_str(), up) {
            ("Pods", true) => start.saturating_add(p.value),
            ("Pods", false) => start.saturating_sub(p.value),
            (_, true) => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
            (_, false) => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
        }
    });
    let most_change = rules.select_policy.as_deref() != Some("Min");
    let limit = if most_change == up { proposals.max() } else { proposals.min() };
    limit.unwrap_or(current)
}

/// Upstream's `normalizeDesiredReplicasWithBehaviors` (with the default rules for a
/// direction `behavior` leaves out; scale-downs stabilized over `downscale_window` unless
/// it says otherwise), or `normalizeDesiredReplicas` for an autoscaler without `behavior`:
/// records `proposed`, stabilizes it over the windows, limits the change and bounds it by
/// min and max replicas.
pub fn normalize(
    hpa: &HorizontalPodAutoscaler,
    history: &mut History,
    current: i32,
    proposed: i32,
    downscale_window: Duration,
    now: Timestamp,
) -> Bounded {
    let spec = hpa.spec.clone().unwrap_or_default();
    let (min, max) = (spec.min_replicas.unwrap_or(1), spec.max_replicas);
    let window_secs = i32::try_from(downscale_window.as_secs()).unwrap_or(i32::MAX);
    let Some(behavior) = spec.behavior else {
        // The highest recommendation of the downscale window; at most max(2 × current, 4)
        // at once.
        let (_, stabilized) = window_bounds(history, now, proposed, 0, window_secs);
        let able = if stabilized == proposed { READY_FOR_NEW_SCALE } else { SCALE_DOWN_STABILIZED };
        let scale_up = current.saturating_mul(2).max(4);
        let (allowed, over) =
            if max > scale_up { (scale_up, SCALE_UP_LIMIT) } else { (max, TOO_MANY) };
        let (replicas, limited) = if stabilized < min {
            (min, TOO_FEW)
        } else if stabilized > allowed {
            (allowed, over)
        } else {
            (stabilized, WITHIN_RANGE)
        };
        return Bounded { replicas, able, limited };
    };
    let mut down_defaults = default_scale_down();
    down_defaults["stabilizationWindowSeconds"] = json!(window_secs);
    let up = rules(behavior.scale_up.as_ref(), default_scale_up());
    let down = rules(behavior.scale_down.as_ref(), down_defaults);
    let (up_to, down_to) = window_bounds(
        history,
        now,
        proposed,
        up.stabilization_window_seconds.unwrap_or(0),
        down.stabilization_window_seconds.unwrap_or(window_secs),
    );
    // Up no further than the scale-up window's lowest, down no further than the scale-down
    // window's highest.
    let stabilized = current.max(up_to).min(down_to);
    let able = match (stabilized == proposed, proposed >= current) {
        (true, _) => READY_FOR_NEW_SCALE,
        (false, true) => SCALE_UP_STABILIZED,
        (false, false) => SCALE_DOWN_STABILIZED,
    };
    let (replicas, limited) = if stabilized > current {
        let limit = scale_limit(current, history, &up, now, true).max(current);
        let (allowed, over) = if max > limit { (limit, SCALE_UP_LIMIT) } else { (max, TOO_MANY) };
        if stabilized > allowed { (allowed, over) } else { (stabilized, WITHIN_RANGE) }
    } else if stabilized < current {
        let limit = scale_limit(current, history, &down, now, false).min(current);
        let (allowed, under) = if min < limit { (limit, SCALE_DOWN_LIMIT) } else { (min, TOO_FEW) };
        if stabilized < allowed { (allowed, under) } else { (stabilized, WITHIN_RANGE) }
    } else {
        (current, WITHIN_RANGE)
    };
    // A target outside the bounds is brought inside them, whatever the rules.
    let (replicas, limited) = if replicas > max {
        (max, TOO_MANY)
    } else if replicas < min {
        (min, TOO_FEW)
    } else {
        (replicas, limited)
    };
    Bounded { replicas, able, limited }
}

/// Records `proposed`; returns the lowest recommendation of the last `up` seconds and the
/// highest of the last `down` seconds, `proposed` included in both.
fn window_bounds(
    history: &mut History,
    now: Timestamp,
    proposed: i32,
    up: i32,
    down: i32,
) -> (i32, i32) {
    let longest = i64::from(up.max(down));
    history.recommendations.retain(|r| r.at > skiff_core::time::sub_secs(now, longest));
    let within = |window: i32| {
        let since = skiff_core::time::sub_secs(now, i64::from(window));
        history.recommendations.iter().filter(move |r| r.at > since).map(|r| r.value)
    };
    let up_to = within(up).chain([proposed]).min().unwrap_or(proposed);
    let down_to = within(down).chain([proposed]).max().unwrap_or(proposed);
    history.recommendations.push(Timed { at: now, value: proposed });
    (up_to, down_to)
}

/// Run the autoscalers every `ctx.config.hpa_sync_period` until dropped.
pub async fn run(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(ctx.config.hpa_sync_period.max(MIN_PERIOD));
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
            let history = histories
                .entry(key.clone())
                .or_insert_with(|| History { recommendations: Vec::new(), ..History::default() });
            if let Err(e) = sync(&ctx, &recorder, hpa, history).await {
                tracing::warn!(hpa = %format!("{}/{}", key.0, key.1), error = %e, "autoscaling");
            }
        }
    }
}

/// The target's resource (its plural) from the reference's kind: the built-in scalable
/// kinds by name, any other kind (a custom resource with a scale subresource) through
/// discovery of its group version, as upstream's REST mapper does.
async fn target_resource(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
) -> Result<ApiResource, String> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let builtin = match (group, kind) {
        ("apps", "Deployment") => Some("deployments"),
        ("apps", "ReplicaSet") => Some("replicasets"),
        ("apps", "StatefulSet") => Some("statefulsets"),
        ("", "ReplicationController") => Some("replicationcontrollers"),
        _ => None,
    };
    if let Some(plural) = builtin {
        return Ok(ApiResource::from_gvk_with_plural(&gvk, plural));
    }
    kube::discovery::pinned_kind(client, &gvk)
        .await
        .map(|(ar, _)| ar)
        .map_err(|e| format!("no matches for kind \"{kind}\" in group \"{group}\": {e}"))
}

fn pod_metrics_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"),
        "pods",
    )
}

/// Milli-units of a quantity, rounded up (upstream's `MilliValue`).
fn milli(q: &str) -> Option<i128> {
    Quantity::parse(q).map(Quantity::milli)
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

/// The pods' samples of `resource` (of one container, if given), grouped as upstream's
/// `groupPods`: deleted or failed pods ignored, pending pods unready, pods without metrics
/// missing, and (for CPU) pods whose reading may predate their readiness unready.
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
            let wanted = |c: &str| container.is_none_or(|w| w == c);
            let metric = metrics.get(&name);
            // Every selected container must report the resource (upstream's metrics
            // client drops the pod otherwise).
            let usage = metric.and_then(|m| {
                let containers = m.get("containers")?.as_array()?;
                let selected: Vec<&Value> = containers
                    .iter()
                    .filter(|c| c.get("name").and_then(Value::as_str).is_some_and(wanted))
                    .collect();
                if selected.is_empty() {
                    return None;
                }
                selected.iter().try_fold(0i128, |sum, c| {
                    Some(sum + milli(c.pointer(&format!("/usage/{resource}"))?.as_str()?)?)
                })
            });
            let request = requests(pod, resource, container);
            let state = if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
                PodState::Ignored
            } else if phase == "Pending"
                || (usage.is_some() && resource == "cpu" && cpu_unready(pod, metric, now))
            {
                PodState::Unready
            } else {
                PodState::Ready
            };
            PodSample { name, usage, request, state }
        })
        .collect()
}

/// Upstream's CPU readiness rule: a pod with no Ready condition or start time is unready;
/// while it starts, one not ready or whose reading's window began before it became ready;
/// after that, one not ready that never was.
fn cpu_unready(pod: &Pod, metric: Option<&Value>, now: Timestamp) -> bool {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let (Some(ready), Some(start)) = (ready, status.and_then(|s| s.start_time.as_ref())) else {
        return true;
    };
    let transition = ready.last_transition_time.as_ref().map(|t| t.0).unwrap_or(start.0);
    let after = |d: Duration| skiff_core::time::add_std(start.0, d);
    let starting = after(CPU_INITIALIZATION_PERIOD) > now;
    if starting {
        let window_start = metric.and_then(|m| {
            let at = m.get("timestamp")?.as_str()?.parse::<Timestamp>().ok()?;
            let window = go_duration_nanos(m.get("window")?.as_str()?)?;
            Some(skiff_core::time::add(
                at,
                -SignedDuration::from_nanos(i64::try_from(window).ok()?),
            ))
        });
        ready.status == "False" || window_start.is_some_and(|w| w < transition)
    } else {
        let never_ready = transition < skiff_core::time::add_std(start.0, INITIAL_READINESS_DELAY);
        ready.status == "False" && never_ready
    }
}

/// Upstream's `calculatePodRequests`: the requests of the pod's containers and sidecars
/// (init containers that keep running), or of the one container named.
fn requests(pod: &Pod, resource: &str, container: Option<&str>) -> Result<i128, String> {
    let Some(spec) = pod.spec.as_ref() else { return Ok(0) };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .filter(|c| container.is_none_or(|w| w == c.name))
        .try_fold(0i128, |sum, c| {
            let request = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .and_then(|q| milli(&q.0));
            request.map(|r| sum + r).ok_or_else(|| {
                format!(
                    "missing request for {resource} in container {} of Pod {}",
                    c.name,
                    pod.name_any()
                )
            })
        })
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

/// Upstream's `setCondition` for each new condition: replaced in place (keeping its
/// transition time while its status is unchanged) or appended; others are kept.
fn merge_conditions(
    old: &[HorizontalPodAutoscalerCondition],
    new: Vec<HorizontalPodAutoscalerCondition>,
) -> Vec<HorizontalPodAutoscalerCondition> {
    let mut out = old.to_vec();
    for mut c in new {
        match out.iter_mut().find(|o| o.type_ == c.type_) {
            Some(o) => {
                if o.status == c.status {
                    c.last_transition_time.clone_from(&o.last_transition_time);
                }
                *o = c;
            }
            None => out.push(c),
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("writing the status")]
    Status(#[source] kube::Error),
}

/// One autoscaler's sync (upstream's `reconcileAutoscaler`).
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
    let (min, max) = (spec.min_replicas.unwrap_or(1), spec.max_replicas);
    let now = Timestamp::now();
    let write_status = |status: HorizontalPodAutoscalerStatus,
                        conditions: Vec<HorizontalPodAutoscalerCondition>| {
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
        let name = hpa.name_any();
        let conditions = merge_conditions(&old_conditions, conditions);
        async move {
            let status = HorizontalPodAutoscalerStatus {
                conditions: Some(conditions),
                observed_generation: hpa.metadata.generation,
                ..status
            };
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
    let able =
        |ok: bool, (reason, message): (&str, &str)| condition("AbleToScale", ok, reason, message);

    let ar =
        target_resource(&ctx.client, target.api_version.as_deref().unwrap_or(""), &target.kind)
            .await;
    let scaled = match ar {
        Ok(ar) => {
            let targets: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
            match targets.get_scale(&target.name).await {
                Ok(scale) => Ok((targets, scale)),
                Err(e) => Err(e.to_string()),
            }
        }
        Err(e) => Err(e),
    };
    let (targets, scale) = match scaled {
        Ok(s) => s,
        Err(e) => {
            let message =
                format!("the HPA controller was unable to get the target's current scale: {e}");
            recorder.record(&hpa, EventType::Warning, "FailedGetScale", &message).await;
            let status = HorizontalPodAutoscalerStatus { current_metrics: None, ..old_status };
            return write_status(status, vec![able(false, ("FailedGetScale", &message))]).await;
        }
    };
    let current = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
    let selector = scale.status.and_then(|s| s.selector).unwrap_or_default();
    if !history.seeded {
        history.recommendations.push(Timed { at: now, value: current });
        history.seeded = true;
    }
    let got_scale = able(
        true,
        ("SucceededGetScale", "the HPA controller was able to get the target's current scale"),
    );
    let status = |desired, metrics: Vec<MetricStatus>| HorizontalPodAutoscalerStatus {
        current_replicas: Some(current),
        desired_replicas: desired,
        current_metrics: (!metrics.is_empty()).then_some(metrics),
        last_scale_time: old_status.last_scale_time.clone(),
        ..Default::default()
    };

    // What to scale to, and why (upstream's order: scaling disabled, outside the bounds,
    // then the metrics).
    let mut conditions = Vec::new();
    let mut metric_statuses = Vec::new();
    let (desired, reason) = if current == 0 && min != 0 {
        let message = "scaling is disabled since the replica count of the target is zero";
        conditions.push(got_scale);
        conditions.push(condition("ScalingActive", false, "ScalingDisabled", message));
        return write_status(status(0, Vec::new()), conditions).await;
    } else if current > max {
        conditions.push(condition("ScalingLimited", true, TOO_MANY.1, TOO_MANY.2));
        (max, "Current number of replicas above Spec.MaxReplicas".to_string())
    } else if current < min {
        conditions.push(condition("ScalingLimited", true, TOO_FEW.1, TOO_FEW.2));
        (min, "Current number of replicas below Spec.MinReplicas".to_string())
    } else if selector.is_empty() {
        let message = "the HPA target's scale is missing a selector";
        recorder.record(&hpa, EventType::Warning, "SelectorRequired", message).await;
        conditions.push(got_scale);
        conditions.push(condition("ScalingActive", false, "InvalidSelector", message));
        return write_status(status(old_status.desired_replicas, Vec::new()), conditions).await;
    } else {
        let metrics = spec.metrics.clone().unwrap_or_default();
        let results = measure(ctx, &ns, &metrics, &selector, current, now).await;
        metric_statuses = results
            .iter()
            .map(|r| r.as_ref().map(|(_, s, _)| s.clone()).unwrap_or_default())
            .collect();
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        let best = results.iter().flatten().max_by_key(|(p, _, _)| p.replicas);
        // All metrics invalid, or some invalid and the others would scale down: keep the
        // replicas (upstream's computeReplicasForMetrics).
        match best {
            Some((p, _, reason)) if errors.is_empty() || p.replicas >= current => {
                conditions.push(condition(
                    "ScalingActive",
                    true,
                    "ValidMetricFound",
                    "the HPA was able to successfully calculate a replica count from metrics",
                ));
                let bounded = normalize(
                    &hpa,
                    history,
                    current,
                    p.replicas,
                    ctx.config.hpa_downscale_stabilization,
                    now,
                );
                conditions.insert(0, able(true, bounded.able));
                let (limited, why, message) = bounded.limited;
                conditions.push(condition("ScalingLimited", limited, why, message));
                (bounded.replicas, reason.clone())
            }
            _ => {
                for e in &errors {
                    recorder.record(&hpa, EventType::Warning, "FailedGetResourceMetric", e).await;
                }
                let first = errors.first().map_or("no metrics", |e| e.as_str());
                let message = format!(
                    "invalid metrics ({} invalid out of {}), first error is: {first}",
                    errors.len(),
                    metrics.len()
                );
                recorder
                    .record(&hpa, EventType::Warning, "FailedComputeMetricsReplicas", &message)
                    .await;
                conditions.push(got_scale);
                conditions.push(condition(
                    "ScalingActive",
                    false,
                    "FailedGetResourceMetric",
                    format!("the HPA was unable to compute the replica count: {first}"),
                ));
                return write_status(
                    status(old_status.desired_replicas, metric_statuses),
                    conditions,
                )
                .await;
            }
        }
    };

    let mut last_scale_time = old_status.last_scale_time.clone();
    if desired != current {
        let reason = if desired > current && !reason.is_empty() {
            reason
        } else {
            "All metrics below target".to_string()
        };
        let patch = Patch::Merge(json!({"spec": {"replicas": desired}}));
        match targets.patch_scale(&target.name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                let message = format!("New size: {desired}; reason: {reason}");
                recorder.record(&hpa, EventType::Normal, "SuccessfulRescale", &message).await;
                let change =
                    Timed { at: now, value: desired.abs_diff(current).min(i32::MAX as u32) as i32 };
                if desired > current {
                    history.scale_ups.push(change);
                } else {
                    history.scale_downs.push(change);
                }
                last_scale_time = Some(Time(now));
                let message =
                    format!("the HPA controller was able to update the target scale to {desired}");
                conditions.retain(|c| c.type_ != "AbleToScale");
                conditions.insert(0, condition("AbleToScale", true, "SucceededRescale", message));
            }
            Err(e) => {
                let message =
                    format!("the HPA controller was unable to update the target scale: {e}");
                recorder.record(&hpa, EventType::Warning, "FailedRescale", &message).await;
                conditions.retain(|c| c.type_ != "AbleToScale");
                conditions.insert(0, condition("AbleToScale", false, "FailedUpdateScale", message));
            }
        }
    }
    // Rescales older than the longest policy period are no longer needed.
    let keep = skiff_core::time::sub_secs(now, 1800);
    history.scale_ups.retain(|e| e.at > keep);
    history.scale_downs.retain(|e| e.at > keep);
    let status =
        HorizontalPodAutoscalerStatus { last_scale_time, ..status(desired, metric_statuses) };
    write_status(status, conditions).await
}

/// Each metric's proposal, status and rescale reason, or why it could not be computed; in
/// the order of `metrics`.
async fn measure(
    ctx: &Context,
    ns: &str,
    metrics: &[MetricSpec],
    selector: &str,
    current: i32,
    now: Timestamp,
) -> Vec<Result<(Proposal, MetricStatus, String), String>> {
    let params = ListParams::default().labels(selector);
    let fail_all = |e: String| metrics.iter().map(|_| Err(e.clone())).collect();
    let pods = match Api::<Pod>::namespaced(ctx.client.clone(), ns).list(&params).await {
        Ok(list) => list.items,
        Err(e) => return fail_all(format!("listing the target's pods: {e}")),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), ns, &pod_metrics_resource());
    let pod_metrics: BTreeMap<String, Value> = match api.list(&params).await {
        Ok(list) => list.items.into_iter().map(|m| (m.name_any(), m.data)).collect(),
        Err(e) => return fail_all(format!("unable to get metrics for the pods: {e}")),
    };
    metrics
        .iter()
        .map(|m| {
            let Some((resource, container, target)) = resource_metric(m) else {
                return Err(format!(
                    "{} metrics need a custom or external metrics API, which is not served",
                    m.type_
                ));
            };
            let target =
                target.ok_or_else(|| format!("the {resource} metric has no usable target"))?;
            let pod_samples = samples(&pods, &pod_metrics, resource, container, now);
            let p = replicas_for(current, &pod_samples, target)
                .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
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
            Ok((p, status, reason))
        })
        .collect()
}

/// A milli-unit amount as a canonical quantity.
fn milli_quantity(m: i128) -> KQuantity {
    let text = format!("{m}m");
    KQuantity(quantity::canonical(&text).unwrap_or(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, usage: Option<i128>, request: i128, state: PodState) -> PodSample {
        PodSample { name: name.into(), usage, request: Ok(request), state }
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
        let no_request = PodSample {
            request: Err("missing request for cpu in container c of Pod a".into()),
            ..pod("a", Some(1), 0, PodState::Ready)
        };
        assert!(replicas_for(1, &[no_request], t).unwrap_err().contains("missing request"));
        // A request total of zero is no answer either.
        let pods = [pod("a", Some(10), 0, PodState::Ready)];
        assert!(replicas_for(1, &pods, t).unwrap_err().contains("no metrics returned"));
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
        let b = normalize(&h, &mut history, 8, 2, five_min, at(30));
        assert_eq!((b.replicas, b.able.0), (16, "ScaleDownStabilized"));
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
        // The scale-down window is the controller's flag (the default rules leave it
        // unset): a lower recommendation is held at the window's highest.
        let b = normalize(&h, &mut history, 10, 2, d, at(30));
        assert_eq!((b.replicas, b.able.0), (10, "ScaleDownStabilized"));
        let b = normalize(&h, &mut history, 10, 2, Duration::ZERO, at(31));
        assert_eq!(
            (b.replicas, b.able.0, b.limited.1),
            (2, "ReadyForNewScale", "DesiredWithinRange")
        );
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
                request: Ok(300),
                state: PodState::Ready
            }]
        );
        let app = samples(std::slice::from_ref(&pod), &metrics, "cpu", Some("app"), now);
        assert_eq!((app[0].usage, app[0].request.clone()), (Some(150), Ok(200)));
        let memory = samples(std::slice::from_ref(&pod), &metrics, "memory", None, now);
        assert_eq!(memory[0].usage, Some(11 * 1024 * 1024 * 1000));
        assert_eq!(
            memory[0].request,
            Err("missing request for memory in container app of Pod p".to_string())
        );
        // A pod reporting the resource for only some containers has no reading.
        let partial = BTreeMap::from([(
            "p".to_string(),
            json!({"containers": [{"name": "app", "usage": {"cpu": "150m"}}, {"name": "side", "usage": {}}]}),
        )]);
        assert_eq!(samples(std::slice::from_ref(&pod), &partial, "cpu", None, now)[0].usage, None);
        // Use is rounded up to whole millicores, as upstream's MilliValue.
        assert_eq!(milli("2263311n"), Some(3));
        assert_eq!(milli("500u"), Some(1));
        assert_eq!(milli("2"), Some(2000));
    }
}
