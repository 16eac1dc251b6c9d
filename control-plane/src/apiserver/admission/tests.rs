//! Unit tests of the admission chain and its built-in plugins.

use serde_json::{Value, json};

use super::noderestriction::admit_node_request;
use super::serviceaccount::{TOKEN_MOUNT_PATH, mount_token};
use super::webhook::{review, rule_matches};
use super::{AdmissionRequest, Operation};
use crate::apiserver::registry::Registry;
use crate::apiserver::user::{UserInfo, names};

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

fn denied(r: crate::apiserver::status::ApiResult<()>) -> String {
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
    req.user = node_user("n1");
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
    req.user = node_user("n1");
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
    bind.user = node_user("n1");
    bind.subresource = Some("binding".into());
    assert!(denied(admit_node_request(&bind)).contains("unexpected pod subresource"));
    // Deleting: only pods bound to it.
    let mut del = request("pods", "", Operation::Delete, Some("default"), "p");
    del.user = node_user("n1");
    del.old_object = Some(pod("n2"));
    assert!(denied(admit_node_request(&del)).contains("can only delete pods"));
    del.old_object = Some(pod("n1"));
    admit_node_request(&del).expect("own pod");
}

#[test]
fn node_modifies_only_its_own_node_without_restricted_labels_or_taints() {
    let node = |name: &str, labels: Value, taints: Value| json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}});
    let mut req = request("nodes", "", Operation::Update, None, "n2");
    req.user = node_user("n1");
    req.object = Some(node("n2", json!({}), json!([])));
    req.old_object = req.object.clone();
    assert_eq!(
        denied(admit_node_request(&req)),
        "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
    );
    let mut req = request("nodes", "", Operation::Update, None, "n1");
    req.user = node_user("n1");
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
    create.user = node_user("n1");
    create.object = Some(node("n1", json!({"node-restriction.kubernetes.io/x": "y"}), json!([])));
    assert!(
        denied(admit_node_request(&create)).contains("not allowed to set the following labels")
    );
}

#[test]
fn node_lease_is_its_own_in_kube_node_lease() {
    let mut req =
        request("leases", "coordination.k8s.io", Operation::Update, Some("kube-node-lease"), "n1");
    req.user = node_user("n1");
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
    req.user = super::admin();
    req.object = Some(json!({"metadata": {"name": "n2"}}));
    admit_node_request(&req).expect("admin");
    // In system:nodes but without a node name: refused.
    req.user = UserInfo::new("kubelet", &[names::NODES]);
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
    req.user = node_user("n1");
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
