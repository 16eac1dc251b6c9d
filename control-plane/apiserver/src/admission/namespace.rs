//! NamespaceLifecycle: nothing is created in a namespace that does not exist or is being
//! terminated (upstream `plugin/pkg/admission/namespace/lifecycle`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource};
use crate::cache::{CachedObject, set_resource_version};
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use skiff_core::json::ValueAt;
use skiff_store::Revision;

/// How long creates in a namespace deleted through this apiserver look it up in the store
/// instead of the watch cache (upstream's `forceLiveLookupTTL`).
const LIVE_LOOKUP_TTL: Duration = Duration::from_secs(30);

/// Upstream's plugin: the watch cache answers for namespaces that exist and are active; a
/// namespace the cache does not hold (created a moment ago, or never) and one deleted
/// through this apiserver in the last [`LIVE_LOOKUP_TTL`] are read from the store. Creates
/// never wait for the cache to catch up with concurrent writes.
#[derive(Default)]
pub struct NamespaceLifecycle {
    /// Namespaces whose deletion this apiserver admitted, and when.
    deleted: Mutex<HashMap<String, Instant>>,
    /// Whether each namespace's cached object (at the revision noted) is terminating: every
    /// create in a namespace asks, and the object changes rarely.
    terminating: Mutex<HashMap<String, (Revision, bool)>>,
}

impl NamespaceLifecycle {
    fn recently_deleted(&self, ns: &str) -> bool {
        let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
        deleted.retain(|_, at| at.elapsed() < LIVE_LOOKUP_TTL);
        deleted.contains_key(ns)
    }

    /// [`cached_terminating`] of `obj`, the cached object of namespace `ns`, decided once per
    /// revision of it.
    fn terminating_in_cache(&self, ns: &str, obj: &CachedObject) -> bool {
        let mut known = self.terminating.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(rv, terminating)) = known.get(ns)
            && rv == obj.rv
        {
            return terminating;
        }
        let terminating = cached_terminating(&obj.json);
        known.insert(ns.to_string(), (obj.rv, terminating));
        terminating
    }

    fn note_deleted(&self, ns: &str) {
        let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
        deleted.insert(ns.to_string(), Instant::now());
    }
}

fn terminating(o: &Value) -> bool {
    o.at(&["status", "phase"]).and_then(Value::as_str) == Some("Terminating")
        || o.at(&["metadata", "deletionTimestamp"])
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
}

/// The two fields of a namespace this plugin reads, decoded without building the whole
/// object (every create in the namespace asks).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Lifecycle {
    metadata: LifecycleMeta,
    status: LifecycleStatus,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LifecycleMeta {
    deletion_timestamp: Option<String>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct LifecycleStatus {
    phase: Option<String>,
}

/// Whether cached namespace JSON says the namespace is terminating (undecodable: treated
/// as terminating, so the store is asked).
fn cached_terminating(json: &[u8]) -> bool {
    match serde_json::from_slice::<Lifecycle>(json) {
        Ok(l) => {
            l.status.phase.as_deref() == Some("Terminating")
                || l.metadata.deletion_timestamp.is_some_and(|s| !s.is_empty())
        }
        Err(_) => true,
    }
}

#[async_trait]
impl MutatingPlugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        match operation {
            Operation::Create => resource.subresource.is_none(),
            Operation::Delete => resource.is_core("namespaces") && resource.subresource.is_none(),
            _ => false,
        }
    }

    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        if req.operation == Operation::Delete {
            if !req.dry_run {
                self.note_deleted(&req.name);
            }
            return Ok(());
        }
        let Some(ns) = req.namespace.as_deref().filter(|_| req.namespaced) else { return Ok(()) };
        let nsr = state.registry.namespaces();
        let key = nsr.key(None, ns);
        let active_in_cache = match state.cache.resource(nsr).get(&key) {
            Some(o) => !self.terminating_in_cache(ns, &o),
            None => {
                self.terminating.lock().unwrap_or_else(|e| e.into_inner()).remove(ns);
                false
            }
        };
        if active_in_cache && !self.recently_deleted(ns) {
            return Ok(());
        }
        // Not in the cache, terminating there, or deleted here a moment ago: the store has
        // the last word.
        let obj = match state.store.get(&key).await? {
            Some(kv) => {
                let mut v: Value = serde_json::from_slice(&kv.value).map_err(|e| {
                    ApiError::internal(format!("decoding stored object {}: {e}", kv.key))
                })?;
                set_resource_version(&mut v, kv.mod_revision);
                Some(v)
            }
            None => None,
        };
        match obj {
            None => Err(ApiError::not_found("namespaces", ns).with_details("", "namespaces", ns)),
            Some(o) if terminating(&o) => {
                let qualified = if req.group.is_empty() {
                    req.resource.to_string()
                } else {
                    format!("{}.{}", req.resource, req.group)
                };
                // Upstream's NewForbidden names the object being created (empty under
                // generateName: the name comes later).
                let name = &req.name;
                Err(ApiError::forbidden(format!(
                    "{qualified} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated"
                ))
                .with_details(req.group, req.resource, name))
            }
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_namespaces_are_terminating_by_phase_or_deletion_timestamp() {
        let active = br#"{"metadata":{"name":"a","labels":{"x":"y"}},"status":{"phase":"Active"}}"#;
        assert!(!cached_terminating(active));
        assert!(!cached_terminating(br#"{"metadata":{"name":"new"}}"#), "no status yet");
        assert!(cached_terminating(
            br#"{"metadata":{"name":"t"},"status":{"phase":"Terminating"}}"#
        ));
        assert!(cached_terminating(
            br#"{"metadata":{"name":"d","deletionTimestamp":"2026-01-01T00:00:00Z"},"status":{"phase":"Active"}}"#
        ));
        assert!(
            !cached_terminating(br#"{"metadata":{"name":"e","deletionTimestamp":""}}"#),
            "an empty deletionTimestamp is no deletion"
        );
        // Undecodable: the store is asked instead of trusting the cache.
        assert!(cached_terminating(b"{not json"));
    }

    #[test]
    fn verdicts_are_kept_per_revision_of_the_namespace() {
        let plugin = NamespaceLifecycle::default();
        let at = |rv: Revision, json: &'static str| CachedObject {
            key: "/registry/core/namespaces/n".into(),
            namespace: String::new(),
            name: "n".into(),
            rv,
            json: bytes::Bytes::from_static(json.as_bytes()),
            labels: Default::default(),
            fields: Vec::new(),
        };
        let active = r#"{"metadata":{"name":"n"},"status":{"phase":"Active"}}"#;
        let terminating = r#"{"metadata":{"name":"n"},"status":{"phase":"Terminating"}}"#;
        assert!(!plugin.terminating_in_cache("n", &at(5, active)));
        // The same revision is not decided again (a different body proves it was not read).
        assert!(!plugin.terminating_in_cache("n", &at(5, terminating)));
        // A new revision is.
        assert!(plugin.terminating_in_cache("n", &at(6, terminating)));
    }

    #[test]
    fn namespaces_deleted_here_are_remembered_for_the_live_lookup_ttl() {
        let plugin = NamespaceLifecycle::default();
        plugin.note_deleted("gone");
        assert!(plugin.recently_deleted("gone"));
        assert!(!plugin.recently_deleted("other"));
        // Past the TTL the entry is dropped and the cache answers again.
        plugin
            .deleted
            .lock()
            .expect("lock")
            .insert("old".into(), Instant::now().checked_sub(LIVE_LOOKUP_TTL * 2).expect("uptime"));
        assert!(!plugin.recently_deleted("old"));
        assert_eq!(plugin.deleted.lock().expect("lock").len(), 1, "expired entries pruned");
    }
}
