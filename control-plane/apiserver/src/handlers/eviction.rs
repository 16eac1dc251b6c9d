//! pods/eviction (policy/v1 Eviction), as upstream's `EvictionREST`: a pod that is already
//! disrupted (terminal, pending, terminating) is deleted at once; any other pod only if the
//! one PodDisruptionBudget selecting it allows a disruption, which the eviction charges to
//! the budget (`disruptionsAllowed - 1`, the pod noted in `disruptedPods` for the
//! disruption controller) before the pod gets the `DisruptionTarget` condition and is
//! deleted with the Eviction's `deleteOptions`.

use http::StatusCode;
use serde_json::{Value, json};

use super::delete::delete;
use super::read::get_object;
use super::update::{Writer, guaranteed_update};
use super::verb::CACHE_WAIT;
use super::verb::Target;
use super::verb::meta_str;
use crate::negotiate;
use crate::registry::ResourceType;
use crate::request::Input;
use crate::request::Query;
use crate::server::ApiServer;
use crate::status::{ApiError, ApiResult, Cause};
use skiff_core::json::ValueAt;
use skiff_store::Revision;

/// Upstream's `EvictionsRetry` steps: how often an eviction reads the pod and its budget
/// again after a conflicting write.
const EVICTION_RETRIES: usize = 20;

/// Upstream's `MaxDisruptedPodSize`: evictions the controller has not confirmed yet.
const MAX_DISRUPTED_PODS: usize = 2000;

/// The field manager of the budget writes an eviction makes (upstream's loopback client).
const MANAGER: &str = "kube-apiserver";

/// Upstream's message when a budget refuses.
const REFUSED: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

/// The `Status` of a successful eviction.
fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

pub(super) async fn evict(t: Target<'_>, name: &str, input: Input<'_>) -> ApiResult<Value> {
    let Target { server, ns, .. } = t;
    let Input { query, headers, body } = input;
    let eviction = negotiate::decode_object(negotiate::body_type(headers)?, body)?;
    if let Some(kind) = eviction.get("kind").and_then(Value::as_str)
        && kind != "Eviction"
    {
        return Err(ApiError::bad_request(format!("not a Eviction object: {kind}")));
    }
    if meta_str(&eviction, "name") != Some(name) {
        return Err(ApiError::bad_request("name in URL does not match name in Eviction object"));
    }
    if let Some(body_ns) = meta_str(&eviction, "namespace").filter(|n| !n.is_empty())
        && Some(body_ns) != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    // Upstream's `propagateDryRun`: the query's dryRun, or the deleteOptions', not both
    // differing.
    let body_dry_run = eviction.at(&["deleteOptions", "dryRun"]).and_then(Value::as_array);
    let dry_run = match (query.dry_run()?, body_dry_run.filter(|d| !d.is_empty())) {
        (query_dry, None) => query_dry,
        (false, Some(d)) if query.get("dryRun").is_none() => d.iter().any(|v| v == "All"),
        (query_dry, Some(d)) => {
            let body_dry = d.iter().any(|v| v == "All");
            if body_dry != query_dry {
                return Err(ApiError::bad_request(format!(
                    "Inconsistent dryRun. Query: {:?}, Eviction: {}",
                    query.get("dryRun").unwrap_or_default(),
                    Value::Array(d.clone())
                )));
            }
            query_dry
        }
    };
    super::admit::admit_subresource_create(t, name, "eviction", &eviction, dry_run).await?;
    let mut options = match eviction.get("deleteOptions") {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        _ => json!({}),
    };
    if dry_run {
        options["dryRun"] = json!(["All"]);
    }
    let user_rv = precondition_rv(&options).is_some();

    // A pod that is already disrupted is deleted without asking a budget; one that is not
    // terminal yet is deleted only at the revision decided on (it might become healthy).
    let mut attempt = 0;
    let (pod, pod_rev) = loop {
        attempt += 1;
        let (pod, rev) = get_object(t, name).await?;
        if !disrupted_already(&pod) {
            break (pod, rev);
        }
        let mut opts = options.clone();
        if !terminal_or_terminating(&pod) && !user_rv {
            set_precondition_rv(&mut opts, rev);
        }
        match mark_and_delete(t, name, query, opts, dry_run).await {
            Err(e) if e.code == StatusCode::CONFLICT && !user_rv && attempt < EVICTION_RETRIES => {}
            done => return done.map(|()| success()),
        }
    };

    let pdb_rt = server
        .registry
        .find("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))?;
    let mut budgets = budgets_of(server, pdb_rt, ns, &pod).await?;
    if budgets.len() > 1 {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    let Some(budget) = budgets.pop() else {
        mark_and_delete(t, name, query, options, dry_run).await?;
        return Ok(success());
    };
    let pdb_name = meta_str(&budget, "name").unwrap_or_default().to_string();

    // A pod that is not ready does not count as healthy: evicting it costs the budget
    // nothing, if the budget's policy allows it.
    if !pod_ready(&pod) {
        let status = |f: &str| budget.at(&["status", f]).and_then(Value::as_i64).unwrap_or(0);
        let always = budget.at(&["spec", "unhealthyPodEvictionPolicy"]).and_then(Value::as_str)
            == Some("AlwaysAllow");
        let (healthy, desired) = (status("currentHealthy"), status("desiredHealthy"));
        if always || (healthy >= desired && desired > 0) {
            let mut opts = options;
            set_precondition_rv(&mut opts, pod_rev);
            return match mark_and_delete(t, name, query, opts, dry_run).await {
                // The pod changed (it may have become ready): the client tries again.
                Err(e) if e.code == StatusCode::CONFLICT && !user_rv => Err(too_many_requests(
                    10,
                    format!(
                        "The disruption budget {pdb_name} is still being processed by the server."
                    ),
                )),
                done => done.map(|()| success()),
            };
        }
    }

    let mut budget = budget;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let rev = budget
            .at(&["metadata", "resourceVersion"])
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let charged = charge(&budget, name, &skiff_core::time::now_rfc3339())?;
        if dry_run {
            break;
        }
        let w =
            Writer { manager: MANAGER, sub: Some("status"), track: true, admit: false, dry_run };
        let written =
            guaranteed_update(Target { rt: pdb_rt, ..t }, &pdb_name, w, Some(rev), |current| {
                let mut next = current.clone();
                next["status"] = charged["status"].clone();
                Ok(next)
            })
            .await;
        match written {
            Ok(_) => break,
            Err(e) if e.code == StatusCode::CONFLICT && attempt < EVICTION_RETRIES => {
                budget = get_object(Target { rt: pdb_rt, ..t }, &pdb_name).await?.0;
            }
            Err(e) => return Err(e),
        }
    }
    mark_and_delete(t, name, query, options, dry_run).await?;
    Ok(success())
}

/// Upstream's `canIgnorePDB`: the pod is terminal, pending or terminating.
fn disrupted_already(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed" | "Pending") || terminal_or_terminating(pod)
}

/// The opposite of upstream's `shouldEnforceResourceVersion`.
fn terminal_or_terminating(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
        || pod.at(&["metadata", "deletionTimestamp"]).is_some_and(|t| !t.is_null())
}

fn phase(pod: &Value) -> &str {
    pod.at(&["status", "phase"]).and_then(Value::as_str).unwrap_or_default()
}

fn pod_ready(pod: &Value) -> bool {
    pod.at(&["status", "conditions"])
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn precondition_rv(options: &Value) -> Option<&str> {
    options
        .at(&["preconditions", "resourceVersion"])
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
}

fn set_precondition_rv(options: &mut Value, rev: Revision) {
    if !options.get("preconditions").is_some_and(Value::is_object) {
        options["preconditions"] = json!({});
    }
    options["preconditions"]["resourceVersion"] = json!(rev.to_string());
}

/// The budgets in the pod's namespace whose selector matches it (a missing selector
/// matches nothing, an empty one every pod: policy/v1), read as a consistent list: from
/// the watch cache once it has caught up with the store.
async fn budgets_of(
    server: &ApiServer,
    pdb_rt: &ResourceType,
    ns: Option<&str>,
    pod: &Value,
) -> ApiResult<Vec<Value>> {
    let current = server.store.current_revision().await?;
    server.cache.wait_for(current, CACHE_WAIT).await;
    let labels: std::collections::BTreeMap<String, String> = pod
        .at(&["metadata", "labels"])
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    Ok(server
        .cache
        .resource(pdb_rt)
        .list(&pdb_rt.namespace_prefix(ns), None)
        .iter()
        .map(|o| o.value())
        .filter(|pdb| {
            let selector = pdb.at(&["spec", "selector"]).filter(|s| !s.is_null());
            selector
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .is_some_and(|s| skiff_core::labels::label_selector_matches(&s, &labels))
        })
        .collect())
}

/// Upstream's `checkAndDecrement`: the budget with one disruption charged for `pod` at
/// `now`, or why it may not be.
fn charge(budget: &Value, pod: &str, now: &str) -> ApiResult<Value> {
    let name = meta_str(budget, "name").unwrap_or_default();
    let int = |path: &[&str]| budget.at(path).and_then(Value::as_i64).unwrap_or(0);
    let generation = int(&["metadata", "generation"]);
    if int(&["status", "observedGeneration"]) < generation {
        return Err(too_many_requests(
            10,
            format!("The disruption budget {name} is still being processed by the server."),
        ));
    }
    let allowed = int(&["status", "disruptionsAllowed"]);
    let forbidden = |why: &str| {
        ApiError::forbidden(format!("poddisruptionbudgets.policy \"{name}\" is forbidden: {why}"))
            .with_details("policy", "poddisruptionbudgets", name)
    };
    if allowed < 0 {
        return Err(forbidden("pdb disruptions allowed is negative"));
    }
    let disrupted =
        budget.at(&["status", "disruptedPods"]).and_then(Value::as_object).map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_PODS {
        return Err(forbidden(
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(too_many_requests(
            0,
            format!(
                "The disruption budget {name} needs {} healthy pods and has {} currently",
                int(&["status", "desiredHealthy"]),
                int(&["status", "currentHealthy"])
            ),
        ));
    }
    let mut next = budget.clone();
    let status = &mut next["status"];
    status["disruptionsAllowed"] = json!(allowed - 1);
    if allowed == 1 {
        disallow_disruptions(status, generation, now);
    }
    if !status.get("disruptedPods").is_some_and(Value::is_object) {
        status["disruptedPods"] = json!({});
    }
    status["disruptedPods"][pod] = json!(now);
    Ok(next)
}

/// Upstream's `UpdateDisruptionAllowedCondition` for a budget charged to zero: the
/// `DisruptionAllowed` condition False (`InsufficientPods`), its transition time moved
/// only when its status changes.
fn disallow_disruptions(status: &mut Value, generation: i64, now: &str) {
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    let conditions = status["conditions"].as_array_mut().expect("conditions was just made a list");
    let fresh = json!({
        "type": "DisruptionAllowed",
        "status": "False",
        "reason": "InsufficientPods",
        "message": "",
        "observedGeneration": generation,
        "lastTransitionTime": now,
    });
    match conditions.iter_mut().find(|c| c["type"] == "DisruptionAllowed") {
        Some(c) => {
            let since =
                if c["status"] == "False" { c["lastTransitionTime"].clone() } else { json!(now) };
            *c = fresh;
            c["lastTransitionTime"] = since;
        }
        None => conditions.push(fresh),
    }
}

/// A 429 whose cause names the budget (`DisruptionBudget`); kubectl drain retries it.
fn too_many_requests(retry_after: u32, cause: String) -> ApiError {
    let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", REFUSED);
    e.retry_after_seconds = (retry_after > 0).then_some(retry_after);
    e.causes =
        vec![Cause { reason: "DisruptionBudget".into(), message: cause, field: String::new() }];
    e
}

/// Upstream's `addConditionAndDeletePod`: the latest pod gets the `DisruptionTarget`
/// condition (not on a dry run), then is deleted with `options`; a resourceVersion
/// precondition is checked against the pod before the condition and moved to the revision
/// the condition wrote.
async fn mark_and_delete(
    t: Target<'_>,
    name: &str,
    query: &Query,
    mut options: Value,
    dry_run: bool,
) -> ApiResult<()> {
    if !dry_run {
        let precondition = precondition_rv(&options).map(str::to_string);
        let stamp = skiff_core::time::now_rfc3339();
        let w = Writer { manager: "", sub: Some("status"), track: false, admit: false, dry_run };
        let marked = guaranteed_update(t, name, w, precondition.clone(), |pod| {
            let mut next = pod.clone();
            add_disruption_target(&mut next, &stamp);
            Ok(next)
        })
        .await?;
        if precondition.is_some()
            && let Some(rv) = marked.at(&["metadata", "resourceVersion"]).and_then(Value::as_str)
        {
            options["preconditions"]["resourceVersion"] = json!(rv);
        }
    }
    delete(t, name, query, &options, false).await.map(|_| ())
}

/// Upstream's `UpdatePodCondition` with `DisruptionTarget=True` (`EvictionByEvictionAPI`):
/// the transition time moves only when the condition's status does.
fn add_disruption_target(pod: &mut Value, now: &str) {
    let fresh = json!({
        "type": "DisruptionTarget",
        "status": "True",
        "lastProbeTime": null,
        "lastTransitionTime": now,
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    });
    if !pod.get("status").is_some_and(Value::is_object) {
        pod["status"] = json!({});
    }
    let status = &mut pod["status"];
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    let conditions = status["conditions"].as_array_mut().expect("conditions was just made a list");
    match conditions.iter_mut().find(|c| c["type"] == "DisruptionTarget") {
        Some(c) if c["status"] == "True" => {
            let since = c["lastTransitionTime"].clone();
            *c = fresh;
            c["lastTransitionTime"] = since;
        }
        Some(c) => *c = fresh,
        None => conditions.push(fresh),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(allowed: i64, generation: i64, observed: i64) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "default", "generation": generation},
            "spec": {"minAvailable": 2},
            "status": {
                "disruptionsAllowed": allowed, "currentHealthy": 3, "desiredHealthy": 2,
                "expectedPods": 3, "observedGeneration": observed,
                "conditions": [{
                    "type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods",
                    "message": "", "observedGeneration": observed,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }],
            },
        })
    }

    #[test]
    fn a_charge_takes_one_disruption_and_notes_the_pod() {
        let b = charge(&budget(2, 1, 1), "web-a", "2026-02-02T00:00:00Z").expect("allowed");
        assert_eq!(b["status"]["disruptionsAllowed"], 1);
        assert_eq!(b["status"]["disruptedPods"], json!({"web-a": "2026-02-02T00:00:00Z"}));
        assert_eq!(b["status"]["conditions"][0]["status"], "True", "still allowed");

        let b = charge(&b, "web-b", "2026-02-02T00:00:01Z").expect("allowed");
        assert_eq!(b["status"]["disruptionsAllowed"], 0);
        assert_eq!(b["status"]["disruptedPods"].as_object().map(|m| m.len()), Some(2));
        let cond = &b["status"]["conditions"][0];
        assert_eq!(
            (&cond["status"], &cond["reason"], &cond["lastTransitionTime"]),
            (&json!("False"), &json!("InsufficientPods"), &json!("2026-02-02T00:00:01Z"))
        );
    }

    #[test]
    fn an_exhausted_or_unprocessed_budget_refuses_with_429_and_a_cause() {
        let e = charge(&budget(0, 1, 1), "web-a", "t").expect_err("exhausted");
        assert_eq!(e.code, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.message, REFUSED);
        assert_eq!(e.causes[0].reason, "DisruptionBudget");
        assert_eq!(
            e.causes[0].message,
            "The disruption budget web needs 2 healthy pods and has 3 currently"
        );
        assert_eq!(e.retry_after_seconds, None);

        let e = charge(&budget(5, 2, 1), "web-a", "t").expect_err("generation not observed");
        assert_eq!(e.code, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after_seconds, Some(10));
        assert!(e.causes[0].message.contains("still being processed"), "{}", e.causes[0].message);

        let e = charge(&budget(-1, 1, 1), "web-a", "t").expect_err("negative");
        assert_eq!(e.code, StatusCode::FORBIDDEN);
    }

    #[test]
    fn only_pods_not_yet_disrupted_consult_a_budget() {
        let pod = |phase: &str, deleting: bool| {
            let mut p = json!({"metadata": {"name": "p"}, "status": {"phase": phase}});
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            p
        };
        for phase in ["Succeeded", "Failed", "Pending"] {
            assert!(disrupted_already(&pod(phase, false)), "{phase}");
        }
        assert!(!disrupted_already(&pod("Running", false)));
        assert!(disrupted_already(&pod("Running", true)));
        assert!(
            !terminal_or_terminating(&pod("Pending", false)),
            "a pending pod is deleted at its revision"
        );
    }

    #[test]
    fn the_disruption_target_condition_keeps_its_transition_time() {
        let mut pod = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        add_disruption_target(&mut pod, "t1");
        add_disruption_target(&mut pod, "t2");
        let conds = pod["status"]["conditions"].as_array().expect("conditions");
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[1]["reason"], "EvictionByEvictionAPI");
        assert_eq!(conds[1]["lastTransitionTime"], "t1");
    }
}
