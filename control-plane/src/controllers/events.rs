//! Kubernetes Events (core/v1) for what users should see in `kubectl describe`, written by
//! every component through the API. Repeats of the same event within the series window bump
//! `count` and `lastTimestamp` of the existing Event instead of creating a new one, as
//! client-go's EventRecorder does.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};

/// Event type: "Normal" or "Warning".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// (namespace, involved uid, reason, message): what makes two events "the same".
type EventKey = (String, String, String, String);

/// Records Events for one component ("default-scheduler", "deployment-controller", ...).
pub struct EventRecorder {
    client: Client,
    component: String,
    host: Option<String>,
    /// (namespace, involved uid, reason, message) → (event name, count) for aggregation.
    seen: Mutex<HashMap<EventKey, (String, i32)>>,
}

impl EventRecorder {
    pub fn new(client: Client, component: impl Into<String>) -> Self {
        EventRecorder {
            client,
            component: component.into(),
            host: None,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Events from a node agent carry the node as `source.host`.
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Record an event about `obj`. Failures are logged, never returned: events are best
    /// effort and must not fail the reconcile that emits them.
    pub async fn record<K>(&self, obj: &K, kind: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = obj.object_ref(&());
        self.record_ref(reference, kind, reason, message).await;
    }

    pub async fn record_ref(
        &self,
        reference: ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        let ns = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let uid = reference.uid.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let key = (ns.clone(), uid, reason.to_string(), message.to_string());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let existing = self.seen.lock().ok().and_then(|m| m.get(&key).cloned());
        if let Some((name, count)) = existing {
            let patch = serde_json::json!({"count": count + 1, "lastTimestamp": now});
            if api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                if let Ok(mut m) = self.seen.lock() {
                    m.insert(key, (name, count + 1));
                }
                return;
            }
        }
        let base = reference.name.clone().unwrap_or_else(|| "object".into());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!("{base}.{nanos:x}");
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns),
                ..Default::default()
            },
            involved_object: reference,
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(kind.as_str().into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: self.host.clone(),
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: self.host.clone().or_else(|| Some(self.component.clone())),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                if let Ok(mut m) = self.seen.lock() {
                    if m.len() > 4096 {
                        m.clear();
                    }
                    m.insert(key, (created.name_any(), 1));
                }
            }
            Err(e) => tracing::debug!(error = %e, reason, "recording an event"),
        }
    }
}
