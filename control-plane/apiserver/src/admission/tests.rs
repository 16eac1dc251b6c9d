//! Unit tests of the admission chain and its built-in plugins.

use serde_json::{Value, json};

use super::noderestriction::admit_node_request;
use super::serviceaccount::{TOKEN_MOUNT_PATH, mount_token};
use super::webhook::{review, rule_matches};
use super::{AdmissionRequest, Operation};
use crate::registry::Registry;
use crate::user::UserInfo;
use skiff_core::names;

fn node_user(name: &str) -> UserInfo {
    UserInfo::new(format!("system:node:{name}"), &[names::NODES, names::AUTHENTICATED])
}

fn request(
    plural: &str,
    group: &str,
    op: Operation,
    ns: Option<&str>,
    name: &str,
) -> AdmissionRequest {
    let registry = Registry::new();
    let rt = registry
        .all()
        .iter()
        .find(|t| t.desc.plural == plural && t.desc.group == group)
        .expect("served");
    let mut req = AdmissionRequest::new(rt, op, ns);
    req.name = name.to_string();
    req
}

fn pod(node: &str) -> Value {
    json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
}

fn denied(r: crate::status::ApiResult<()>) -> String {
    match r {
        Ok(()) => panic!("expected a denial"),
        Err(e) => {
            assert_eq!(e.code.as_u16(), 403, "{}", e.message);
            e.message.clone()
        }
    }
}

#[test]
fn node_may_update_status_of_its_own_pods_only() {
    let mut req = request("pods", "", Operation::Update, Some("default"), "p");
    req.user = node_user("n1").into();
    req.subresource = Some("status".into());
    req.object = Some(pod("n1"));
    req.old_object = Some(pod("n1"));
    admit_node_request(&req).expect("own pod's status");
    req.old_object = Some(pod("n2"));
    req.object = Some(pod("n2"));
    let msg = denied(admit_node_request(&req));
    assert_eq!(
        msg,
        "pods \"p\" is forbidden: node \"n1\" can only update pod status for pods with spec.nodeName set to itself"
    );
    // The pod itself (not its status) is never a node's to update.
    req.subresource = None;
    req.old_object = Some(pod("n1"));
    req.object = Some(pod("n1"));
    assert!(denied(admit_node_request(&req)).contains("can only update pod status"));
}

#[test]
fn node_creates_only_mirror_pods_bound_to_itself() {
    let mut req = request("pods", "", Operation::Create, Some("default"), "p");
    req.user = node_user("n1").into();
    req.object = Some(pod("n1"));
    assert!(denied(admit_node_request(&req)).contains("can only create mirror pods"));
    let mut mirror = pod("n2");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    req.object = Some(mirror.clone());
    assert!(denied(admit_node_request(&req)).contains("spec.nodeName set to itself"));
    mirror["spec"]["nodeName"] = json!("n1");
    req.object = Some(mirror.clone());
    admit_node_request(&req).expect("own mirror pod");
    mirror["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "x"}}]);
    req.object = Some(mirror);
    assert!(denied(admit_node_request(&req)).contains("reference secrets"));
    // Binding is the scheduler's.
    let mut bind = request("pods", "", Operation::Create, Some("default"), "p");
    bind.user = node_user("n1").into();
    bind.subresource = Some("binding".into());
    assert!(denied(admit_node_request(&bind)).contains("unexpected pod subresource"));
    // Deleting: only pods bound to it.
    let mut del = request("pods", "", Operation::Delete, Some("default"), "p");
    del.user = node_user("n1").into();
    del.old_object = Some(pod("n2"));
    assert!(denied(admit_node_request(&del)).contains("can only delete pods"));
    del.old_object = Some(pod("n1"));
    admit_node_request(&del).expect("own pod");
}

#[test]
fn node_modifies_only_its_own_node_without_restricted_labels_or_taints() {
    let node = |name: &str, labels: Value, taints: Value| json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}});
    let mut req = request("nodes", "", Operation::Update, None, "n2");
    req.user = node_user("n1").into();
    req.object = Some(node("n2", json!({}), json!([])));
    req.old_object = req.object.clone();
    assert_eq!(
        denied(admit_node_request(&req)),
        "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
    );
    let mut req = request("nodes", "", Operation::Update, None, "n1");
    req.user = node_user("n1").into();
    req.old_object = Some(node("n1", json!({"a": "1"}), json!([])));
    req.object = Some(node("n1", json!({"a": "2"}), json!([])));
    admit_node_request(&req).expect("ordinary labels are the node's");
    req.object = Some(node("n1", json!({"node-restriction.kubernetes.io/pool": "x"}), json!([])));
    assert!(
        denied(admit_node_request(&req))
            .contains("not allowed to modify labels: node-restriction.kubernetes.io/pool")
    );
    req.object = Some(node("n1", json!({"a": "1"}), json!([{"key": "k", "effect": "NoSchedule"}])));
    assert!(denied(admit_node_request(&req)).contains("not allowed to modify taints"));
    // Status updates of its own node are fine.
    req.subresource = Some("status".into());
    admit_node_request(&req).expect("status");
    let mut create = request("nodes", "", Operation::Create, None, "n1");
    create.user = node_user("n1").into();
    create.object = Some(node("n1", json!({"node-restriction.kubernetes.io/x": "y"}), json!([])));
    assert!(
        denied(admit_node_request(&create)).contains("not allowed to set the following labels")
    );
}

#[test]
fn node_lease_is_its_own_in_kube_node_lease() {
    let mut req =
        request("leases", "coordination.k8s.io", Operation::Update, Some("kube-node-lease"), "n1");
    req.user = node_user("n1").into();
    req.object = Some(json!({"metadata": {"name": "n1"}}));
    admit_node_request(&req).expect("own lease");
    req.name = "n2".into();
    req.object = Some(json!({"metadata": {"name": "n2"}}));
    assert!(denied(admit_node_request(&req)).contains("same name as the requesting node"));
    req.namespace = Some("default".into());
    assert!(denied(admit_node_request(&req)).contains("kube-node-lease"));
}

#[test]
fn non_node_users_are_not_restricted() {
    let mut req = request("nodes", "", Operation::Update, None, "n2");
    req.user = super::admin().into();
    req.object = Some(json!({"metadata": {"name": "n2"}}));
    admit_node_request(&req).expect("admin");
    // In system:nodes but without a node name: refused.
    req.user = UserInfo::new("kubelet", &[names::NODES]).into();
    assert!(denied(admit_node_request(&req)).contains("could not determine node"));
}

#[test]
fn webhook_rules_match_operations_resources_subresources_and_scope() {
    use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
    let rule = |ops: &[&str], res: &[&str], scope: Option<&str>| RuleWithOperations {
        operations: Some(ops.iter().map(|s| s.to_string()).collect()),
        api_groups: Some(vec!["".into()]),
        api_versions: Some(vec!["v1".into()]),
        resources: Some(res.iter().map(|s| s.to_string()).collect()),
        scope: scope.map(str::to_string),
    };
    let mut req = request("pods", "", Operation::Create, Some("default"), "p");
    assert!(rule_matches(&rule(&["CREATE"], &["pods"], None), &req));
    assert!(rule_matches(&rule(&["*"], &["*"], Some("Namespaced")), &req));
    assert!(!rule_matches(&rule(&["UPDATE"], &["pods"], None), &req));
    assert!(!rule_matches(&rule(&["CREATE"], &["pods"], Some("Cluster")), &req));
    assert!(!rule_matches(&rule(&["CREATE"], &["services"], None), &req));
    req.subresource = Some("status".into());
    assert!(!rule_matches(&rule(&["CREATE"], &["pods"], None), &req));
    assert!(!rule_matches(&rule(&["CREATE"], &["*"], None), &req));
    assert!(rule_matches(&rule(&["CREATE"], &["pods/status"], None), &req));
    assert!(rule_matches(&rule(&["CREATE"], &["*/*"], None), &req));
    assert!(rule_matches(&rule(&["CREATE"], &["pods/*"], None), &req));
    let ns = request("namespaces", "", Operation::Create, None, "x");
    assert!(rule_matches(&rule(&["CREATE"], &["namespaces"], Some("Cluster")), &ns));
}

#[test]
fn admission_review_has_upstream_shape() {
    let mut req = request("pods", "", Operation::Update, Some("default"), "p");
    req.subresource = Some("status".into());
    req.object = Some(pod("n1"));
    req.old_object = Some(pod("n1"));
    req.user = node_user("n1").into();
    req.dry_run = true;
    let r = review(&req);
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(r["kind"], "AdmissionReview");
    let q = &r["request"];
    assert_eq!(q["uid"], json!(req.uid));
    assert_eq!(q["kind"], json!({"group": "", "version": "v1", "kind": "Pod"}));
    assert_eq!(q["resource"], json!({"group": "", "version": "v1", "resource": "pods"}));
    assert_eq!(q["subResource"], "status");
    assert_eq!(q["operation"], "UPDATE");
    assert_eq!(q["namespace"], "default");
    assert_eq!(q["userInfo"]["username"], "system:node:n1");
    assert_eq!(q["dryRun"], true);
    assert_eq!(q["options"]["kind"], "UpdateOptions");
    assert_eq!(q["oldObject"]["spec"]["nodeName"], "n1");
}

#[test]
fn service_account_volume_is_projected_and_mounted_everywhere() {
    let mut spec = json!({
        "initContainers": [{"name": "i", "image": "x"}],
        "containers": [
            {"name": "a", "image": "x"},
            {"name": "b", "image": "x", "volumeMounts": [{"name": "own", "mountPath": "/data"}]},
        ],
    });
    let m = spec.as_object_mut().expect("object");
    mount_token(m, "abcde");
    let vols = spec["volumes"].as_array().expect("volumes");
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0]["name"], "kube-api-access-abcde");
    let sources = vols[0]["projected"]["sources"].as_array().expect("sources");
    assert_eq!(
        sources[0]["serviceAccountToken"],
        json!({"expirationSeconds": 3607, "path": "token"})
    );
    assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(
        sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(vols[0]["projected"]["defaultMode"], 420);
    for c in ["initContainers", "containers"] {
        for container in spec[c].as_array().expect("containers") {
            let mounts = container["volumeMounts"].as_array().expect("mounts");
            let m =
                mounts.iter().find(|m| m["mountPath"] == TOKEN_MOUNT_PATH).expect("token mount");
            assert_eq!(m["name"], "kube-api-access-abcde");
            assert_eq!(m["readOnly"], true);
        }
    }
    assert_eq!(spec["containers"][1]["volumeMounts"][0]["name"], "own");
}

// ---------------------------------------------------------------------------------------
// Through the router: the user comes from the request's extensions (authentication's seam).

mod through_router {
    use std::sync::Arc;

    use http::{Method, StatusCode};
    use serde_json::json;

    use crate::server::ApiServer;
    use crate::user::UserInfo;
    use skiff_store::memory::MemoryStore;

    async fn server() -> Arc<ApiServer> {
        ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await.expect("apiserver")
    }

    use crate::testing::call;

    fn node_user(name: &str) -> UserInfo {
        super::node_user(name)
    }

    #[tokio::test]
    async fn a_node_writes_only_its_own_node_and_pod_status() {
        let api = server().await;
        for n in ["n1", "n2"] {
            let (s, _) = call(
                &api,
                None,
                Method::POST,
                "/api/v1/nodes",
                "application/json",
                json!({"metadata": {"name": n}}),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED);
        }
        for (p, n) in [("on-n1", "n1"), ("on-n2", "n2")] {
            let (s, body) = call(&api, None, Method::POST, "/api/v1/namespaces/default/pods", "application/json",
                json!({"metadata": {"name": p}, "spec": {"nodeName": n, "containers": [{"name": "c", "image": "i"}]}})).await;
            assert_eq!(s, StatusCode::CREATED, "{body}");
        }
        let merge = "application/merge-patch+json";
        let (s, body) = call(
            &api,
            Some(node_user("n1")),
            Method::PATCH,
            "/api/v1/nodes/n2",
            merge,
            json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            body["message"],
            "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
        );
        assert_eq!(body["reason"], "Forbidden");
        let (s, body) = call(
            &api,
            Some(node_user("n1")),
            Method::PATCH,
            "/api/v1/nodes/n1",
            merge,
            json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let (s, _) = call(
            &api,
            Some(node_user("n1")),
            Method::PATCH,
            "/api/v1/nodes/n1",
            merge,
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "a"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let status = json!({"status": {"phase": "Running"}});
        let (s, body) = call(
            &api,
            Some(node_user("n1")),
            Method::PATCH,
            "/api/v1/namespaces/default/pods/on-n1/status",
            merge,
            status.clone(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let (s, body) = call(
            &api,
            Some(node_user("n1")),
            Method::PATCH,
            "/api/v1/namespaces/default/pods/on-n2/status",
            merge,
            status,
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        let (s, _) = call(
            &api,
            Some(node_user("n1")),
            Method::DELETE,
            "/api/v1/namespaces/default/pods/on-n2",
            "application/json",
            json!({}),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = call(&api, Some(node_user("n1")), Method::POST, "/api/v1/namespaces/default/pods",
            "application/json", json!({"metadata": {"name": "sneaky"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}})).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // The admin (no user in the request) is not restricted.
        let (s, _) = call(
            &api,
            None,
            Method::PATCH,
            "/api/v1/nodes/n2",
            merge,
            json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }

    #[tokio::test]
    async fn priority_classes_resolve_and_service_accounts_mount() {
        let api = server().await;
        let (s, body) = call(
            &api,
            None,
            Method::POST,
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            "application/json",
            json!({"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        let pod = |name: &str, class: &str, automount: bool| {
            json!({
                "metadata": {"name": name},
                "spec": {"priorityClassName": class, "automountServiceAccountToken": automount,
                         "containers": [{"name": "c", "image": "i"}]},
            })
        };
        let (s, body) = call(
            &api,
            None,
            Method::POST,
            "/api/v1/namespaces/default/pods",
            "application/json",
            pod("hi", "high", true),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        assert_eq!(body["spec"]["priority"], 1000);
        assert_eq!(body["spec"]["preemptionPolicy"], "Never");
        assert_eq!(body["spec"]["serviceAccountName"], "default");
        let vol = body["spec"]["volumes"][0]["name"].as_str().unwrap_or_default();
        assert!(vol.starts_with("kube-api-access-"), "{body}");
        assert_eq!(
            body["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        let (s, body) = call(
            &api,
            None,
            Method::POST,
            "/api/v1/namespaces/default/pods",
            "application/json",
            pod("nomount", "system-node-critical", false),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        assert_eq!(body["spec"]["priority"], 2_000_001_000);
        assert!(body["spec"].get("volumes").is_none(), "{body}");
        let (s, body) = call(
            &api,
            None,
            Method::POST,
            "/api/v1/namespaces/default/pods",
            "application/json",
            pod("lost", "nope", true),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            body["message"],
            "pods \"lost\" is forbidden: no PriorityClass with name nope was found"
        );
        let class = |name: &str, value: i64, default: bool| json!({"metadata": {"name": name}, "value": value, "globalDefault": default});
        let url = "/apis/scheduling.k8s.io/v1/priorityclasses";
        let json_ct = "application/json";
        // The reserved names and the value cap are validation (422), as upstream.
        let (s, body) =
            call(&api, None, Method::POST, url, json_ct, class("system-mine", 1, false)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            body["message"],
            "PriorityClass.scheduling.k8s.io \"system-mine\" is invalid: metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority class"
        );
        let (s, body) =
            call(&api, None, Method::POST, url, json_ct, class("huge", 2_000_000_000, false)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            body["message"],
            "PriorityClass.scheduling.k8s.io \"huge\" is invalid: value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
        );
        // The system classes exist from the start, and stay.
        let (s, body) = call(&api, None, Method::GET, url, json_ct, serde_json::Value::Null).await;
        assert_eq!(s, StatusCode::OK);
        let names: Vec<&str> = body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["high", "system-cluster-critical", "system-node-critical"]);
        assert_eq!(body["items"][2]["value"], 2_000_001_000);
        assert_eq!(body["items"][2]["preemptionPolicy"], "PreemptLowerPriority");
        let system = format!("{url}/system-node-critical");
        let (s, body) =
            call(&api, None, Method::DELETE, &system, json_ct, serde_json::Value::Null).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            body["message"],
            "priorityclasses.scheduling.k8s.io \"system-node-critical\" is forbidden: this is a system priority class and cannot be deleted"
        );
        // value and preemptionPolicy are immutable.
        let (s, mut high) =
            call(&api, None, Method::GET, &format!("{url}/high"), json_ct, serde_json::Value::Null)
                .await;
        assert_eq!(s, StatusCode::OK);
        high["value"] = json!(1001);
        high["preemptionPolicy"] = json!("PreemptLowerPriority");
        let (s, body) = call(&api, None, Method::PUT, &format!("{url}/high"), json_ct, high).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            body["message"],
            "PriorityClass.scheduling.k8s.io \"high\" is invalid: [value: Forbidden: may not be changed in an update., preemptionPolicy: Invalid value: \"PreemptLowerPriority\": field is immutable]"
        );
        let (s, _) =
            call(&api, None, Method::POST, url, json_ct, class("default-a", 5, true)).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, body) =
            call(&api, None, Method::POST, url, json_ct, class("default-b", 6, true)).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let msg = body["message"].as_str().unwrap_or_default();
        assert!(msg.contains("default-a is already marked as default"), "{body}");
        // A pod without a class gets the global default.
        let plain = json!({"metadata": {"name": "dflt"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let (s, body) =
            call(&api, None, Method::POST, "/api/v1/namespaces/default/pods", json_ct, plain).await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        assert_eq!(body["spec"]["priorityClassName"], "default-a");
        assert_eq!(body["spec"]["priority"], 5);
    }
}
