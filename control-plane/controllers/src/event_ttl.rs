//! Event expiry: core/v1 Events older than `event_ttl` (upstream `--event-ttl`, 1 h; the
//! apiserver gives them an etcd lease there) are deleted by a periodic sweep.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use crate::context::Context;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing events")]
    List(#[source] kube::Error),
    #[error("deleting event {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// When the Event last happened: lastTimestamp, eventTime, firstTimestamp or creation.
fn last_seen(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Whether the Event is older than `ttl` at `now`.
pub fn expired(e: &Event, now: k8s_openapi::jiff::Timestamp, ttl: Duration) -> bool {
    let Some(seen) = last_seen(e) else { return false };
    now.duration_since(seen).unsigned_abs() > ttl && now > seen
}

/// One sweep: delete expired Events; returns how many were deleted.
pub async fn sweep(client: &Client, ttl: Duration) -> Result<usize, Error> {
    let api: Api<Event> = Api::all(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now();
    let list = api.list(&ListParams::default()).await.map_err(Error::List)?;
    let mut deleted = 0;
    for e in list.items.iter().filter(|e| expired(e, now, ttl)) {
        let ns = e.namespace().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        match api.delete(&e.name_any(), &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::Delete { name: format!("{ns}/{}", e.name_any()), source });
            }
        }
    }
    Ok(deleted)
}

/// Sweep every `event_ttl / 60` (at least 1 s, at most 5 min) until dropped.
pub async fn run(ctx: Arc<Context>) {
    let ttl = ctx.config.event_ttl;
    let period = (ttl / 60).clamp(Duration::from_secs(1), Duration::from_secs(300));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&ctx.client, ttl).await {
            tracing::warn!(error = %e, "expiring events");
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::api::PostParams;
    use serde_json::json;

    use super::*;
    use crate::testutil::api;

    fn event(name: &str, last: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Test", "message": "m", "type": "Normal",
            "firstTimestamp": last, "lastTimestamp": last, "count": 1
        }))
        .expect("event")
    }

    #[tokio::test]
    async fn events_older_than_the_ttl_are_deleted() {
        let (_s, client) = api().await;
        let api: Api<Event> = Api::namespaced(client.clone(), "default");
        let now = jiff::Timestamp::now();
        let old = skiff_core::time::rfc3339_seconds(skiff_core::time::sub_secs(now, 7200));
        let fresh = skiff_core::time::rfc3339_seconds(now);
        api.create(&PostParams::default(), &event("old", &old)).await.expect("old");
        api.create(&PostParams::default(), &event("fresh", &fresh)).await.expect("fresh");
        let n = sweep(&client, Duration::from_secs(3600)).await.expect("sweep");
        assert_eq!(n, 1);
        assert!(api.get_opt("old").await.expect("get").is_none());
        assert!(api.get_opt("fresh").await.expect("get").is_some());
    }
}
