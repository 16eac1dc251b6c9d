//! Objects exactly as `kubectl 1.33 create ... --dry-run=client -o json` sends them are
//! admitted (the apiserver adds namespace and uid first), with upstream's defaults.

use serde_json::{Value, json};

use super::*;

fn apiserver_fills(mut obj: Value, namespaced: bool) -> Value {
    if namespaced {
        obj["metadata"]["namespace"] = json!("default");
    }
    obj["metadata"]["uid"] = json!("5b7d6a1e-0000-4000-8000-000000000001");
    obj
}

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).expect("fixture is JSON")
}

#[test]
fn kubectl_created_objects_are_admitted() {
    let cases: &[(&str, Gvk, bool)] = &[
        (include_str!("kubectl/deployment.json"), Gvk::new("apps", "v1", "Deployment"), true),
        (include_str!("kubectl/job.json"), Gvk::new("batch", "v1", "Job"), true),
        (include_str!("kubectl/svc-clusterip.json"), Gvk::new("", "v1", "Service"), true),
        (include_str!("kubectl/svc-nodeport.json"), Gvk::new("", "v1", "Service"), true),
        (include_str!("kubectl/svc-lb.json"), Gvk::new("", "v1", "Service"), true),
        (include_str!("kubectl/svc-ext.json"), Gvk::new("", "v1", "Service"), true),
        (include_str!("kubectl/cm.json"), Gvk::new("", "v1", "ConfigMap"), true),
        (include_str!("kubectl/secret.json"), Gvk::new("", "v1", "Secret"), true),
        (include_str!("kubectl/secret-docker.json"), Gvk::new("", "v1", "Secret"), true),
        (include_str!("kubectl/sa.json"), Gvk::new("", "v1", "ServiceAccount"), true),
        (
            include_str!("kubectl/role.json"),
            Gvk::new("rbac.authorization.k8s.io", "v1", "Role"),
            true,
        ),
        (
            include_str!("kubectl/rb.json"),
            Gvk::new("rbac.authorization.k8s.io", "v1", "RoleBinding"),
            true,
        ),
        (
            include_str!("kubectl/cr.json"),
            Gvk::new("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            false,
        ),
        (
            include_str!("kubectl/crb.json"),
            Gvk::new("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
            false,
        ),
        (include_str!("kubectl/ns.json"), Gvk::new("", "v1", "Namespace"), false),
        (include_str!("kubectl/pod.json"), POD, true),
    ];
    for (text, gvk, namespaced) in cases {
        let obj = apiserver_fills(fixture(text), *namespaced);
        let (_, errs) = create(*gvk, obj);
        assert!(errs.is_empty(), "{} rejected: {}", gvk.kind, strings(&errs).join("; "));
    }
}

#[test]
fn kubectl_deployment_and_job_defaults() {
    let d = admitted(
        Gvk::new("apps", "v1", "Deployment"),
        apiserver_fills(fixture(include_str!("kubectl/deployment.json")), true),
    );
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
    let j = admitted(
        Gvk::new("batch", "v1", "Job"),
        apiserver_fills(fixture(include_str!("kubectl/job.json")), true),
    );
    assert_eq!(
        j["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
        "5b7d6a1e-0000-4000-8000-000000000001"
    );
    assert_eq!(j["metadata"]["labels"]["job-name"], "pi");
    let lb = admitted(
        Gvk::new("", "v1", "Service"),
        apiserver_fills(fixture(include_str!("kubectl/svc-lb.json")), true),
    );
    assert_eq!(lb["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
}
