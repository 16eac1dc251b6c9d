use serde_json::json;

use super::*;

const SLICE: Gvk<'static> = Gvk::new("discovery.k8s.io", "v1", "EndpointSlice");
const LEASE: Gvk<'static> = Gvk::new("coordination.k8s.io", "v1", "Lease");
const ROLE: Gvk<'static> = Gvk::new("rbac.authorization.k8s.io", "v1", "Role");
const CROLE: Gvk<'static> = Gvk::new("rbac.authorization.k8s.io", "v1", "ClusterRole");
const RB: Gvk<'static> = Gvk::new("rbac.authorization.k8s.io", "v1", "RoleBinding");
const CRB: Gvk<'static> = Gvk::new("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding");

#[test]
fn endpoint_slice_rules() {
    let base = json!({
        "metadata": {"name": "web-abc", "namespace": "default"},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true}}],
        "ports": [{"port": 80}]
    });
    let s = admitted(SLICE, base.clone());
    assert_eq!(s["ports"][0], json!({"port": 80, "name": "", "protocol": "TCP"}));
    let cases: &[Case] = &[
        (
            "type",
            &|s| {
                s["addressType"] = json!("IPX");
            },
            "addressType: Unsupported value: \"IPX\": supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
            "FieldValueNotSupported",
        ),
        (
            "v6 in v4",
            &|s| {
                s["endpoints"][0]["addresses"] = json!(["fd00::1"]);
            },
            "endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address",
            "FieldValueInvalid",
        ),
        (
            "no addresses",
            &|s| {
                s["endpoints"][0]["addresses"] = json!([]);
            },
            "endpoints[0].addresses: Required value: must contain at least 1 address",
            "FieldValueRequired",
        ),
        (
            "too many addresses",
            &|s| {
                s["endpoints"][0]["addresses"] = json!(
                    (1..=101)
                        .map(|i| format!("10.1.{}.{}", i / 200, i % 200 + 1))
                        .collect::<Vec<_>>()
                );
            },
            "endpoints[0].addresses: Too many: 101: must have at most 100 items",
            "FieldValueTooMany",
        ),
        (
            "duplicate port name",
            &|s| {
                s["ports"] = json!([{"port": 80}, {"port": 81}]);
            },
            "ports[1].name: Duplicate value: \"\"",
            "FieldValueDuplicate",
        ),
    ];
    rejects(SLICE, &base, cases);
    let mut new = s.clone();
    new["addressType"] = json!("IPv6");
    new["endpoints"] = json!([{"addresses": ["fd00::5"]}]);
    let (_, errs, _) = update(SLICE, None, &s, new);
    assert_eq!(strings(&errs), vec!["addressType: Invalid value: \"IPv6\": field is immutable"]);
}

#[test]
fn lease_rules() {
    let base = json!({"metadata": {"name": "node-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40}});
    admitted(LEASE, base.clone());
    let cases: &[Case] = &[
        (
            "duration",
            &|l| {
                l["spec"]["leaseDurationSeconds"] = json!(0);
            },
            "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
            "FieldValueInvalid",
        ),
        (
            "transitions",
            &|l| {
                l["spec"]["leaseTransitions"] = json!(-1);
            },
            "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
    ];
    rejects(LEASE, &base, cases);
}

#[test]
fn rbac_rules() {
    let role = json!({"metadata": {"name": "pod-reader", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]});
    admitted(ROLE, role.clone());
    let cases: &[Case] = &[
        (
            "verbs",
            &|r| {
                r["rules"][0]["verbs"] = json!([]);
            },
            "rules[0].verbs: Required value: verbs must contain at least one value",
            "FieldValueRequired",
        ),
        (
            "resources",
            &|r| {
                r["rules"][0].as_object_mut().unwrap().remove("resources");
            },
            "rules[0].resources: Required value: resource rules must supply at least one resource",
            "FieldValueRequired",
        ),
        (
            "urls in role",
            &|r| {
                r["rules"] = json!([{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]);
            },
            "rules[0].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
            "FieldValueInvalid",
        ),
        (
            "name",
            &|r| {
                r["metadata"]["name"] = json!("a/b");
            },
            "metadata.name: Invalid value: \"a/b\": may not contain '/'",
            "FieldValueInvalid",
        ),
    ];
    rejects(ROLE, &role, cases);
    admitted(
        CROLE,
        json!({"metadata": {"name": "system:health"},
        "rules": [{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]}),
    );

    let rb = json!({"metadata": {"name": "read-pods", "namespace": "default"},
        "roleRef": {"kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "User", "name": "jane"}, {"kind": "ServiceAccount", "name": "default"}]});
    let stored = admitted(RB, rb.clone());
    assert_eq!(stored["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(stored["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(stored["subjects"][1]["apiGroup"], "");
    let cases: &[Case] = &[
        (
            "role kind",
            &|b| {
                b["roleRef"]["kind"] = json!("Pod");
            },
            "roleRef.kind: Unsupported value: \"Pod\": supported values: \"Role\", \"ClusterRole\"",
            "FieldValueNotSupported",
        ),
        (
            "role group",
            &|b| {
                b["roleRef"]["apiGroup"] = json!("apps");
            },
            "roleRef.apiGroup: Unsupported value: \"apps\": supported values: \"rbac.authorization.k8s.io\"",
            "FieldValueNotSupported",
        ),
        (
            "subject kind",
            &|b| {
                b["subjects"][0]["kind"] = json!("Robot");
            },
            "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            "FieldValueNotSupported",
        ),
        (
            "subject name",
            &|b| {
                b["subjects"][0]["name"] = json!("");
            },
            "subjects[0].name: Required value",
            "FieldValueRequired",
        ),
    ];
    rejects(RB, &rb, cases);
    let mut new = stored.clone();
    new["roleRef"]["name"] = json!("other");
    let (_, errs, _) = update(RB, None, &stored, new);
    assert_eq!(errs.len(), 1, "{:?}", strings(&errs));
    assert_eq!(errs[0].field, "roleRef");
    assert!(errs[0].to_string().ends_with(": cannot change roleRef"));

    let crb = json!({"metadata": {"name": "admins"},
        "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default"}]});
    let (_, errs) = create(CRB, crb.clone());
    assert_eq!(strings(&errs), vec!["subjects[0].namespace: Required value"]);
    let mut role_ref = crb.clone();
    role_ref["roleRef"]["kind"] = json!("Role");
    role_ref["subjects"][0]["namespace"] = json!("default");
    let (_, errs) = create(CRB, role_ref);
    assert_eq!(
        strings(&errs),
        vec!["roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\""]
    );
}

#[test]
fn unknown_kinds_pass_through() {
    let gvk = Gvk::new("example.com", "v1", "Widget");
    let mut obj = json!({"metadata": {"name": "BAD NAME"}, "spec": {}});
    let before = obj.clone();
    default_object(gvk, &mut obj).expect("object");
    prepare_for_create(gvk, &mut obj);
    assert_eq!(obj, before);
    assert!(validate(gvk, Operation::Create, None, &obj, None).is_empty());
    assert!(default_object(gvk, &mut json!(3)).is_err());
}
