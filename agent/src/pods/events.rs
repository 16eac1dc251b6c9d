//! Kubernetes Events (core/v1) about pods, for `kubectl describe`: Pulling, Pulled, Created,
//! Started, Killing, BackOff, Unhealthy, Failed, rejections. Written in the background (a
//! pod worker never waits for them); repeats of the same event bump `count` and
//! `lastTimestamp` of the existing Event, as client-go's recorder does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};

/// (namespace, involved uid, reason, message).
type Key = (String, String, String, String);

/// The agent's event recorder (component `kubelet`, source host the node). Cheap to clone.
#[derive(Clone)]
pub struct Events {
    client: Client,
    host: String,
    seen: Arc<Mutex<HashMap<Key, (String, i32)>>>,
}

impl Events {
    pub fn new(client: Client, host: impl Into<String>) -> Self {
        Events { client, host: host.into(), seen: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// A Normal event about `pod`.
    pub fn normal(&self, pod: &Pod, reason: &str, message: impl Into<String>) {
        self.record(pod, "Normal", reason, message.into());
    }

    /// A Warning event about `pod`.
    pub fn warning(&self, pod: &Pod, reason: &str, message: impl Into<String>) {
        self.record(pod, "Warning", reason, message.into());
    }

    fn record(&self, pod: &Pod, kind: &'static str, reason: &str, message: String) {
        let me = self.clone();
        let reference = pod.object_ref(&());
        let reason = reason.to_string();
        tokio::spawn(async move { me.write(reference, kind, reason, message).await });
    }

    async fn write(&self, reference: ObjectReference, kind: &str, reason: String, message: String) {
        let ns = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let key = (
            ns.clone(),
            reference.uid.clone().unwrap_or_default(),
            reason.clone(),
            message.clone(),
        );
        let now = Time(k8s_openapi::jiff::Timestamp::now());
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
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!("{}.{nanos:x}", reference.name.clone().unwrap_or_else(|| "pod".into()));
        let event = Event {
            metadata: ObjectMeta { name: Some(name), namespace: Some(ns), ..Default::default() },
            involved_object: reference,
            reason: Some(reason.clone()),
            message: Some(message),
            type_: Some(kind.into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.host.clone()),
            }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.host.clone()),
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
            Err(e) => tracing::debug!(error = %e, %reason, "recording an event"),
        }
    }
}
