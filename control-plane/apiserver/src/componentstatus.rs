//! `componentstatuses` (core/v1 ComponentStatus, deprecated upstream since 1.19 but still
//! served): what `kubectl get componentstatuses` reads. Nothing is stored; each read
//! reports the health of the control plane's parts as it is now, as upstream's
//! `componentstatus` REST storage does by probing them.
//!
//! skiff's scheduler and controllers run inside whichever skiff-server holds their Lease,
//! so their health is that Lease: held, and renewed within its duration. The store is
//! `etcd-0` (upstream names its etcd servers `etcd-<i>`): healthy when it answers the same
//! check as `/readyz/etcd`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::registry::ResourceType;
use super::status::{ApiError, ApiResult};
use crate::health;
use crate::server::ApiServer;

/// The Warning upstream sends with every ComponentStatus read.
pub const DEPRECATION: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// The components, in upstream's order.
const LEASED: [(&str, &str); 2] =
    [("scheduler", "kube-scheduler"), ("controller-manager", "kube-controller-manager")];
const STORE: &str = "etcd-0";

/// Every component's status, in upstream's order.
pub async fn list(server: &ApiServer) -> Vec<Value> {
    let mut out = Vec::with_capacity(LEASED.len() + 1);
    for (name, _) in LEASED {
        out.push(status(name, leased(server, name).await));
    }
    out.push(status(STORE, health::store_health(server).await));
    out
}

/// One component's status; 404 for a name that is not a component.
pub async fn get(server: &ApiServer, rt: &ResourceType, name: &str) -> ApiResult<Value> {
    let health = if name == STORE {
        health::store_health(server).await
    } else if LEASED.iter().any(|(n, _)| *n == name) {
        leased(server, name).await
    } else {
        return Err(ApiError::not_found(&rt.qualified(), name).with_details(
            rt.group(),
            rt.plural(),
            name,
        ));
    };
    let mut obj = status(name, health);
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), json!("ComponentStatus"));
        o.insert("apiVersion".into(), json!("v1"));
    }
    Ok(obj)
}

/// Upstream's ComponentStatus: one `Healthy` condition, "ok" or the probe's error.
fn status(name: &str, health: Result<(), String>) -> Value {
    let condition = match health {
        Ok(()) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
        Err(error) => json!({"type": "Healthy", "status": "False", "error": error}),
    };
    json!({"metadata": {"name": name}, "conditions": [condition]})
}

/// A component that runs while holding kube-system/<lease>: healthy while the Lease is
/// held and was renewed within its duration.
async fn leased(server: &ApiServer, component: &str) -> Result<(), String> {
    let lease = LEASED.iter().find(|(c, _)| *c == component).map(|(_, l)| *l).unwrap_or_default();
    let rt = server
        .registry
        .find("coordination.k8s.io", "v1", "leases")
        .ok_or_else(|| "leases are not served".to_string())?;
    let kv = server
        .store
        .get(&rt.key(Some("kube-system"), lease))
        .await
        .map_err(|e| format!("reading the kube-system/{lease} Lease: {e}"))?
        .ok_or_else(|| {
            format!("no {lease} is running: the kube-system/{lease} Lease does not exist")
        })?;
    let obj: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| format!("decoding the kube-system/{lease} Lease: {e}"))?;
    lease_health(lease, &obj, Timestamp::now())
}

/// Whether a leader election Lease is held and fresh at `now`.
fn lease_health(lease: &str, obj: &Value, now: Timestamp) -> Result<(), String> {
    let spec = obj.get("spec").unwrap_or(&Value::Null);
    let holder = spec.get("holderIdentity").and_then(Value::as_str).unwrap_or_default();
    if holder.is_empty() {
        return Err(format!("no {lease} is running: the kube-system/{lease} Lease has no holder"));
    }
    let renewed =
        spec.get("renewTime").and_then(Value::as_str).and_then(|t| t.parse::<Timestamp>().ok());
    let duration = spec.get("leaseDurationSeconds").and_then(Value::as_i64).unwrap_or(0);
    match renewed {
        Some(at) if skiff_core::time::api_add_secs(at, duration) >= now => Ok(()),
        Some(at) => Err(format!(
            "{holder} last renewed the kube-system/{lease} Lease at {}, more than {duration}s ago",
            skiff_core::time::rfc3339_seconds(at)
        )),
        None => Err(format!("the kube-system/{lease} Lease held by {holder} was never renewed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_lease_is_healthy_while_held_and_renewed_within_its_duration() {
        let lease = |holder: &str, renewed: Option<&str>| {
            json!({"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                "renewTime": renewed}})
        };
        let fresh = lease("a_1", Some("2026-11-28T10:00:00.000000Z"));
        assert_eq!(lease_health("kube-scheduler", &fresh, at("2026-11-28T10:00:15Z")), Ok(()));
        let stale = lease_health("kube-scheduler", &fresh, at("2026-11-28T10:00:16Z"));
        assert_eq!(
            stale.unwrap_err(),
            "a_1 last renewed the kube-system/kube-scheduler Lease at 2026-11-28T10:00:00Z, \
             more than 15s ago"
        );
        let released = lease("", Some("2026-11-28T10:00:00.000000Z"));
        assert!(
            lease_health("kube-scheduler", &released, at("2026-11-28T10:00:01Z"))
                .unwrap_err()
                .contains("has no holder")
        );
        let never = lease("a_1", None);
        assert!(
            lease_health("kube-scheduler", &never, at("2026-11-28T10:00:01Z"))
                .unwrap_err()
                .contains("never renewed")
        );
    }

    #[test]
    fn statuses_have_upstreams_shape() {
        assert_eq!(
            status("etcd-0", Ok(())),
            json!({"metadata": {"name": "etcd-0"},
                "conditions": [{"type": "Healthy", "status": "True", "message": "ok"}]})
        );
        assert_eq!(
            status("scheduler", Err("down".into()))["conditions"][0],
            json!({"type": "Healthy", "status": "False", "error": "down"})
        );
    }
}
