//! The event recorder ([`skiff_core::events`]) against the apiserver in memory.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use skiff_core::events::*;

use crate::testutil::{api, pod, wait_for};

#[tokio::test(start_paused = true)]
async fn recorder_writes_one_event_with_a_count() {
    let (_api, client) = api().await;
    let p = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod("p", "a", None))
        .await
        .expect("pod");
    let r = EventRecorder::new(client.clone(), "default-scheduler");
    for _ in 0..30 {
        r.record(&p, EventType::Warning, "FailedScheduling", "0/3 nodes are available").await;
    }
    let events: Api<Event> = Api::namespaced(client, "default");
    let list = || async { events.list(&ListParams::default()).await.expect("events").items };
    wait_for("the count to reach 25", || async {
        list().await.first().and_then(|e| e.count) == Some(25)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = list().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].count, Some(25), "the spam filter stops at the burst");
    assert_eq!(events[0].message.as_deref(), Some("0/3 nodes are available"));
}
