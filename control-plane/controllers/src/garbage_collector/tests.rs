use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;

use super::*;
use crate::context::ControllerConfig;
use crate::testutil::{api, wait_for};

fn cm(name: &str, owner: Option<(&ConfigMap, bool)>) -> ConfigMap {
    let mut v = json!({"metadata": {"name": name, "namespace": "default"}, "data": {"k": "v"}});
    if let Some((o, block)) = owner {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": o.name_any(), "uid": o.uid().expect("uid"), "blockOwnerDeletion": block}]);
    }
    serde_json::from_value(v).expect("configmap")
}

async fn start() -> (Arc<skiff_apiserver::ApiServer>, Api<ConfigMap>, tokio::task::JoinHandle<()>) {
    let (server, client) = api().await;
    let ctx = Context::new(client.clone(), ControllerConfig::default());
    let gc = tokio::spawn(async move {
        run(ctx).await.expect("gc");
    });
    (server, Api::namespaced(client, "default"), gc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_deletes_dependents_of_gone_owners() {
    let (_s, cms, gc) = start().await;
    let pp = PostParams::default();
    let owner = cms.create(&pp, &cm("owner", None)).await.expect("owner");
    cms.create(&pp, &cm("dep", Some((&owner, false)))).await.expect("dep");
    let other = cms.create(&pp, &cm("other-owner", None)).await.expect("other");
    // A dependent of two owners loses only the reference to the one that goes.
    let mut two = cm("two-owners", Some((&owner, false)));
    let refs = two.metadata.owner_references.as_mut().expect("refs");
    refs.push(OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "other-owner".into(),
        uid: other.uid().expect("uid"),
        ..Default::default()
    });
    cms.create(&pp, &two).await.expect("two");
    // A dependent whose owner never existed is collected too.
    let mut ghost = cm("ghost-owner", None);
    ghost.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    cms.create(&pp, &cm("orphaned-at-birth", Some((&ghost, false)))).await.expect("dangling");

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(cms.get_opt("dep").await.expect("get").is_some(), "owner alive: dependent kept");
    cms.delete("owner", &DeleteParams::default()).await.expect("delete owner");
    wait_for("dependent collected", || async { cms.get_opt("dep").await.expect("get").is_none() })
        .await;
    wait_for("dangling collected", || async {
        cms.get_opt("orphaned-at-birth").await.expect("get").is_none()
    })
    .await;
    wait_for("reference to the gone owner removed", || async {
        let t = cms.get("two-owners").await.expect("still there");
        t.owner_references().len() == 1 && t.owner_references()[0].name == "other-owner"
    })
    .await;
    gc.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let (_s, cms, gc) = start().await;
    let pp = PostParams::default();
    let owner = cms.create(&pp, &cm("owner", None)).await.expect("owner");
    // The dependent holds its own finalizer, so it lingers while "terminating".
    let mut dep = cm("dep", Some((&owner, true)));
    dep.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&pp, &dep).await.expect("dep");
    cms.create(&pp, &cm("dep2", Some((&owner, true)))).await.expect("dep2");

    cms.delete("owner", &DeleteParams::foreground()).await.expect("delete");
    wait_for("dependents being deleted", || async {
        let d = cms.get("dep").await.expect("dep");
        d.metadata.deletion_timestamp.is_some() && cms.get_opt("dep2").await.expect("get").is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let o = cms.get("owner").await.expect("owner waits for its dependents");
    assert!(o.finalizers().contains(&FOREGROUND.to_string()));
    assert!(o.metadata.deletion_timestamp.is_some());

    let patch = json!({"metadata": {"finalizers": null}});
    cms.patch("dep", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("release");
    wait_for("owner gone after its dependents", || async {
        cms.get_opt("owner").await.expect("get").is_none()
    })
    .await;
    gc.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_keeps_dependents_without_owner_references() {
    let (_s, cms, gc) = start().await;
    let pp = PostParams::default();
    let owner = cms.create(&pp, &cm("owner", None)).await.expect("owner");
    cms.create(&pp, &cm("dep", Some((&owner, true)))).await.expect("dep");
    cms.delete("owner", &DeleteParams::orphan()).await.expect("delete");
    wait_for("owner gone", || async { cms.get_opt("owner").await.expect("get").is_none() }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = cms.get("dep").await.expect("dependent kept");
    assert!(d.owner_references().is_empty(), "{:?}", d.owner_references());
    assert!(d.metadata.deletion_timestamp.is_none());
    gc.abort();
}
