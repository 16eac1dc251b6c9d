//! The ResourceQuota admission's rules (the write path in `update` charges them; upstream's
//! `ResourceQuota` plugin, the last validating
//! step of a create, and of an update of a Service or a claim, charged what it adds):
//! every quota of the namespace that charges the new object is checked
//! and charged in its status before the object is stored, through a compare-and-swap on the
//! quota, so concurrent creates cannot both take its last unit. As upstream, a quota
//! restricts the resources its `status.hard` names: one the controller has not filled in
//! yet restricts nothing. The resource quota controller gives back what deleted objects
//! held (and, at its periodic recount, what failed creates were charged).

use serde_json::Value;

use crate::status::{ApiError, ApiResult};
use skiff_core::json::ValueAt;
use skiff_core::quantity::Quantity;
use skiff_core::quota::{self, Usage};

/// The field manager of the quota charges the write path makes.
pub(super) const MANAGER: &str = "kube-apiserver";

/// The object being created, and what it charges.
pub(super) struct Subject<'a> {
    pub(super) group: &'a str,
    pub(super) resource: &'a str,
    pub(super) name: &'a str,
    pub(super) obj: &'a Value,
    pub(super) usage: &'a Usage,
}

impl Subject<'_> {
    /// The quota with this object charged; `None` when the quota does not charge it; an
    /// error when the quota refuses it.
    pub(super) fn charged(&self, quota: &Value) -> ApiResult<Option<Value>> {
        let spec = quota.get("spec").unwrap_or(&Value::Null);
        if !quota::scopes_match(spec, self.group, self.resource, self.obj) {
            return Ok(None);
        }
        // Upstream restricts what the status's hard limits name: a quota the controller has
        // not filled in yet restricts nothing.
        let hard_status = quota.at(&["status", "hard"]).and_then(Value::as_object);
        let mut names = quota::charged_names(
            hard_status.into_iter().flat_map(|m| m.keys()),
            self.group,
            self.resource,
        );
        names.sort();
        if names.is_empty() {
            return Ok(None);
        }
        let quota_name =
            quota.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default();
        if self.group.is_empty() && self.resource == "pods" {
            let missing = quota::missing_compute(&names, self.obj);
            if !missing.is_empty() {
                return Err(self.forbidden(format!(
                    "failed quota: {quota_name}: must specify {}",
                    missing.join(",")
                )));
            }
        }
        let hard = quota::parse_usage(quota.at(&["status", "hard"]));
        let mut used = quota::parse_usage(quota.at(&["status", "used"]));
        if names.iter().any(|n| !used.contains_key(n.as_str())) {
            let all: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            return Err(self.forbidden(format!(
                "status unknown for quota: {quota_name}, resources: {}",
                all.join(",")
            )));
        }
        let mut exceeded = Vec::new();
        for name in &names {
            let Some(&delta) = self.usage.get(name.as_str()) else { continue };
            let (Some(&limit), Some(&was)) = (hard.get(name.as_str()), used.get(name.as_str()))
            else {
                continue;
            };
            let now = was.saturating_add(delta);
            if now > limit {
                exceeded.push((name.as_str(), delta, was, limit));
            }
            used.insert(name.to_string(), now);
        }
        if !exceeded.is_empty() {
            let list = |f: fn(&(&str, Quantity, Quantity, Quantity)) -> Quantity| {
                exceeded
                    .iter()
                    .map(|e| format!("{}={}", e.0, quota::format(e.0, f(e))))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(self.forbidden(format!(
                "exceeded quota: {quota_name}, requested: {}, used: {}, limited: {}",
                list(|e| e.1),
                list(|e| e.2),
                list(|e| e.3)
            )));
        }
        let mut next = quota.clone();
        next["status"]["used"] = quota::usage_value(&used);
        Ok(Some(next))
    }

    fn forbidden(&self, why: String) -> ApiError {
        crate::admission::forbidden(self.group, self.resource, self.name, why)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}})
    }

    fn check(quota: &Value, obj: &Value) -> ApiResult<Option<Value>> {
        let usage = quota::usage("", "pods", obj, "2026-11-28T10:00:00Z");
        Subject { group: "", resource: "pods", name: "p", obj, usage: &usage }.charged(quota)
    }

    #[test]
    fn a_pod_within_the_quota_is_charged() {
        let q = json!({"metadata": {"name": "q"},
            "spec": {"hard": {"pods": "2", "requests.cpu": "1", "services": "1"}},
            "status": {"hard": {"pods": "2", "requests.cpu": "1", "services": "1"},
                "used": {"pods": "1", "requests.cpu": "0", "services": "0"}}});
        let next = check(&q, &pod("p")).unwrap().unwrap();
        assert_eq!(
            next["status"]["used"],
            json!({"pods": "2", "requests.cpu": "500m", "services": "0"})
        );
        let err = check(&next, &pod("p")).unwrap_err();
        assert_eq!(err.code, http::StatusCode::FORBIDDEN);
        assert_eq!(
            err.message,
            "pods \"p\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"
        );
    }

    #[test]
    fn unknown_status_missing_requests_and_other_scopes() {
        // Not filled in by the controller yet: restricts nothing, as upstream.
        let q = json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "2"}}});
        assert_eq!(check(&q, &pod("p")).unwrap(), None);
        let q = json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "2", "requests.cpu": "1"}},
            "status": {"hard": {"pods": "2", "requests.cpu": "1"}, "used": {"pods": "0"}}});
        assert_eq!(
            check(&q, &pod("p")).unwrap_err().message,
            "pods \"p\" is forbidden: status unknown for quota: q, resources: pods,requests.cpu"
        );
        let q = json!({"metadata": {"name": "q"}, "spec": {"hard": {"limits.cpu": "2"}},
            "status": {"hard": {"limits.cpu": "2"}, "used": {"limits.cpu": "0"}}});
        assert_eq!(
            check(&q, &pod("p")).unwrap_err().message,
            "pods \"p\" is forbidden: failed quota: q: must specify limits.cpu"
        );
        let q = json!({"metadata": {"name": "q"},
            "spec": {"hard": {"pods": "0"}, "scopes": ["BestEffort"]},
            "status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}});
        assert_eq!(check(&q, &pod("p")).unwrap(), None);
    }
}
