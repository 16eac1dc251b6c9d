use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::endpoints;
use super::*;
use crate::context::ControllerConfig;
use crate::testutil::{api, pod, ready_nodes, report_running, wait_for};

fn svc(target: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "uid": "svc-uid", "labels": {"team": "a"}},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": target}]}
    }))
    .expect("service")
}

/// A pod with an IP; `ready` sets the Ready condition, `terminating` a deletionTimestamp.
fn running(name: &str, ip: &str, port: i32, ready: bool, terminating: bool) -> Arc<Pod> {
    let mut p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                 "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
    .expect("pod");
    if terminating {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    Arc::new(p)
}

fn no_zone(_: &str) -> Option<String> {
    Some("z1".into())
}

#[test]
fn named_target_ports_resolve_per_pod() {
    let s = svc(json!("http"));
    let pods = vec![
        running("a", "10.0.0.1", 8080, true, false),
        running("b", "10.0.0.2", 9090, true, false),
        running("c", "10.0.0.3", 8080, true, false),
    ];
    let groups = desired_endpoints(&s, &pods, &no_zone);
    assert_eq!(groups.len(), 2, "two distinct resolved port sets");
    let ports: Vec<i32> = groups.iter().map(|(p, _)| p[0].port.unwrap_or(0)).collect();
    assert_eq!(ports, vec![8080, 9090]);
    assert_eq!(groups[0].1.len(), 2);
    assert_eq!(groups[0].0[0].name.as_deref(), Some("http"));
    assert_eq!(groups[0].0[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(groups[0].1[0].zone.as_deref(), Some("z1"));
    assert_eq!(groups[0].1[0].node_name.as_deref(), Some("n1"));
    // A name no container has: the pod is listed without ports.
    let s = svc(json!("nope"));
    let groups = desired_endpoints(&s, &pods, &no_zone);
    assert_eq!(groups.len(), 1);
    assert!(groups[0].0.is_empty());
    // Numeric target port.
    let s = svc(json!(7000));
    let groups = desired_endpoints(&s, &pods, &no_zone);
    assert_eq!(groups[0].0[0].port, Some(7000));
}

#[test]
fn terminating_and_not_ready_conditions_follow_upstream() {
    let s = svc(json!("http"));
    let pods = vec![
        running("ready", "10.0.0.1", 8080, true, false),
        running("unready", "10.0.0.2", 8080, false, false),
        running("term-ready", "10.0.0.3", 8080, true, true),
        running("term-unready", "10.0.0.4", 8080, false, true),
    ];
    let groups = desired_endpoints(&s, &pods, &no_zone);
    let conds: Vec<(bool, bool, bool)> = groups[0]
        .1
        .iter()
        .map(|e| {
            let c = e.conditions.clone().expect("conditions");
            (c.ready.expect("ready"), c.serving.expect("serving"), c.terminating.expect("term"))
        })
        .collect();
    assert_eq!(
        conds,
        vec![(true, true, false), (false, false, false), (false, true, true), (false, false, true)]
    );
    // Legacy Endpoints: terminating pods left out, unready ones in notReadyAddresses.
    let subsets = endpoints::desired_subsets(&s, &pods);
    assert_eq!(subsets.len(), 1);
    let ips = |l: &Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| -> Vec<String> {
        l.iter().flatten().map(|a| a.ip.clone()).collect()
    };
    assert_eq!(ips(&subsets[0].addresses), vec!["10.0.0.1"]);
    assert_eq!(ips(&subsets[0].not_ready_addresses), vec!["10.0.0.2"]);
    // publishNotReadyAddresses: everything ready, terminating included.
    let mut s2 = s.clone();
    s2.spec.as_mut().expect("spec").publish_not_ready_addresses = Some(true);
    let groups = desired_endpoints(&s2, &pods, &no_zone);
    assert!(groups[0].1.iter().all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true)));
    assert_eq!(ips(&endpoints::desired_subsets(&s2, &pods)[0].addresses).len(), 4);
    // Finished pods and pods without an IP are not endpoints.
    let mut done = (*running("done", "10.0.0.9", 8080, false, false)).clone();
    done.status.as_mut().expect("status").phase = Some("Succeeded".into());
    let mut noip = (*running("noip", "10.0.0.8", 8080, true, false)).clone();
    noip.status.as_mut().expect("status").pod_ip = None;
    assert!(desired_endpoints(&s, &[Arc::new(done), Arc::new(noip)], &no_zone).is_empty());
}

#[test]
fn slices_split_at_100_and_churn_is_minimal() {
    let s = svc(json!("http"));
    let pods: Vec<Arc<Pod>> = (0..250)
        .map(|i| {
            running(&format!("p{i}"), &format!("10.1.{}.{}", i / 200, i % 200), 8080, true, false)
        })
        .collect();
    let groups = desired_endpoints(&s, &pods, &no_zone);
    let plan = plan_slices(&s, Vec::new(), groups, MAX_ENDPOINTS_PER_SLICE);
    let sizes: Vec<usize> = plan.create.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    let first = &plan.create[0];
    assert_eq!(first.labels()[MANAGED_BY_LABEL], CONTROLLER_NAME);
    assert_eq!(first.labels()[SERVICE_NAME_LABEL], "web");
    assert_eq!(first.labels()["team"], "a");
    let owner = &first.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Service", "svc-uid"));
    assert_eq!(first.address_type, "IPv4");

    // Now they exist; one pod in the first slice goes away and a new one appears: only the
    // first slice changes (the newcomer takes the freed place).
    let existing: Vec<EndpointSlice> = plan
        .create
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.metadata.name = Some(format!("web-{i}"));
            s
        })
        .collect();
    let mut pods2 = pods.clone();
    pods2.remove(3);
    pods2.push(running("new", "10.9.9.9", 8080, true, false));
    let groups = desired_endpoints(&s, &pods2, &no_zone);
    let plan = plan_slices(&s, existing.clone(), groups, MAX_ENDPOINTS_PER_SLICE);
    assert!(plan.create.is_empty() && plan.delete.is_empty(), "{plan:?}");
    assert_eq!(plan.update.len(), 1);
    assert_eq!(plan.update[0].name_any(), "web-0");
    assert_eq!(plan.update[0].endpoints.len(), 100);
    assert!(plan.update[0].endpoints.iter().any(|e| e.addresses[0] == "10.9.9.9"));
    // Nothing changed: nothing written.
    let groups = desired_endpoints(&s, &pods, &no_zone);
    let plan = plan_slices(&s, existing.clone(), groups, MAX_ENDPOINTS_PER_SLICE);
    assert!(plan.create.is_empty() && plan.update.is_empty() && plan.delete.is_empty());
    // No pods: one empty placeholder slice remains.
    let plan = plan_slices(&s, existing, Vec::new(), MAX_ENDPOINTS_PER_SLICE);
    assert_eq!(plan.delete.len(), 2);
    assert_eq!(plan.update.len(), 1);
    assert!(plan.update[0].endpoints.is_empty());
}

async fn slices_of(client: &kube::Client, svc: &str) -> Vec<EndpointSlice> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={svc}")))
        .await
        .expect("list slices")
        .items
}

fn ready_count(slices: &[EndpointSlice]) -> usize {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_pods_through_the_api() {
    let (_api, client) = api().await;
    let nodes = [("node-0", Some("za")), ("node-1", Some("zb")), ("node-2", Some("za"))];
    ready_nodes(&client, &nodes).await;
    let config = ControllerConfig {
        apiserver_endpoint: Some(("192.0.2.10".into(), 6443)),
        ..Default::default()
    };
    let ctx = Context::new(client.clone(), config);
    let ctl = tokio::spawn(run(ctx));
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut s = svc(json!("http"));
    s.metadata.uid = None;
    services.create(&PostParams::default(), &s).await.expect("service");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..150 {
        let (name, node) = (format!("web-{i}"), format!("node-{}", i % 3));
        pods.create(&PostParams::default(), &pod(&name, "web", Some(&node))).await.expect("pod");
        report_running(&client, "default", &name, &format!("10.244.{}.{}", i % 3, 2 + i / 3)).await;
    }
    pods.create(&PostParams::default(), &pod("other", "other", Some("node-0"))).await.expect("pod");
    report_running(&client, "default", "other", "10.244.0.200").await;
    wait_for("150 ready endpoints", || async {
        ready_count(&slices_of(&client, "web").await) == 150
    })
    .await;
    let slices = slices_of(&client, "web").await;
    let mut sizes: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
    sizes.sort();
    assert_eq!(sizes, vec![50, 100], "split at 100 endpoints");
    let ep = &slices[0].endpoints[0];
    let node = ep.node_name.clone().expect("nodeName");
    let want_zone = if node == "node-1" { "zb" } else { "za" };
    assert_eq!(ep.zone.as_deref(), Some(want_zone));
    assert_eq!(slices[0].ports.as_ref().expect("ports")[0].port, Some(8080), "named port resolved");
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    wait_for("legacy endpoints", || async {
        eps.get_opt("web").await.expect("get").is_some_and(|e| {
            e.subsets.iter().flatten().flat_map(|s| s.addresses.iter().flatten()).count() == 150
        })
    })
    .await;
    let e = eps.get("web").await.expect("endpoints");
    assert!(e.annotations().contains_key(TRIGGER_TIME_ANNOTATION));

    // A pod deleted (at once, as its node's agent would finish it): the endpoint goes away.
    pods.delete("web-7", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    wait_for("149 endpoints", || async {
        let s = slices_of(&client, "web").await;
        s.iter().flat_map(|s| s.endpoints.iter()).count() == 149
    })
    .await;
    // Selector changed to match nothing: an empty placeholder slice and no addresses.
    let patch = json!({"spec": {"selector": {"app": "none"}}});
    services
        .patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("patch");
    wait_for("placeholder", || async {
        let s = slices_of(&client, "web").await;
        s.len() == 1 && s[0].endpoints.is_empty()
    })
    .await;
    // The kubernetes Service names the apiserver.
    wait_for("kubernetes endpoints", || async {
        eps.get_opt("kubernetes").await.expect("get").is_some_and(|e| {
            let s = &e.subsets.unwrap_or_default();
            s.len() == 1
                && s[0].addresses.as_ref().is_some_and(|a| a[0].ip == "192.0.2.10")
                && s[0].ports.as_ref().is_some_and(|p| p[0].port == 6443)
        })
    })
    .await;
    // Deleting the Service removes its Endpoints and slices.
    services.delete("web", &Default::default()).await.expect("delete svc");
    wait_for("cleanup", || async {
        eps.get_opt("web").await.expect("get").is_none()
            && slices_of(&client, "web").await.is_empty()
    })
    .await;
    ctl.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
}
