//! policy/v1 PodDisruptionBudget: validation as upstream's `pkg/apis/policy/validation`.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;

use super::apps::positive_int_or_percent;
use super::field::{ErrorList, FieldError, Path, json_value};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::{self, nonnegative};

/// `unhealthyPodEvictionPolicy` values.
const UNHEALTHY_POD_EVICTION_POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

/// `ValidatePodDisruptionBudget` (spec) and, through `/status`,
/// `ValidatePodDisruptionBudgetStatusUpdate` (non-negative counts).
pub fn validate_pdb(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("policy", "v1", "PodDisruptionBudget");
    let (n, o) = match typed_pair::<PodDisruptionBudget>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    if sub == Some("status") {
        let st = n.status.unwrap_or_default();
        let sp = Path::root("status");
        for (field, v) in [
            ("disruptionsAllowed", st.disruptions_allowed),
            ("currentHealthy", st.current_healthy),
            ("desiredHealthy", st.desired_healthy),
            ("expectedPods", st.expected_pods),
        ] {
            nonnegative(&mut errs, Some(i64::from(v)), &sp.child(field));
        }
        return errs;
    }
    let spec = n.spec.unwrap_or_default();
    let sp = Path::root("spec");
    if spec.min_available.is_some() && spec.max_unavailable.is_some() {
        errs.push(FieldError::invalid(
            &sp,
            json_value(&spec),
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    if let Some(v) = &spec.min_available {
        positive_int_or_percent(v, &sp.child("minAvailable"), true, &mut errs);
    }
    if let Some(v) = &spec.max_unavailable {
        positive_int_or_percent(v, &sp.child("maxUnavailable"), true, &mut errs);
    }
    if let Some(sel) = &spec.selector {
        errs.extend(meta::validate_label_selector(sel, &sp.child("selector")));
    }
    if let Some(p) = spec.unhealthy_pod_eviction_policy.as_deref()
        && !UNHEALTHY_POD_EVICTION_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported(
            &sp.child("unhealthyPodEvictionPolicy"),
            p,
            UNHEALTHY_POD_EVICTION_POLICIES,
        ));
    }
    errs
}
