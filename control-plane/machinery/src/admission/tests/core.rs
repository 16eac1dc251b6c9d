use serde_json::json;

use super::*;

const NS: Gvk<'static> = Gvk::new("", "v1", "Namespace");
const NODE: Gvk<'static> = Gvk::new("", "v1", "Node");
const CM: Gvk<'static> = Gvk::new("", "v1", "ConfigMap");
const SECRET: Gvk<'static> = Gvk::new("", "v1", "Secret");
const SA: Gvk<'static> = Gvk::new("", "v1", "ServiceAccount");
const EVENT: Gvk<'static> = Gvk::new("", "v1", "Event");
const EP: Gvk<'static> = Gvk::new("", "v1", "Endpoints");

#[test]
fn namespace_defaults_and_rules() {
    let ns = admitted(
        NS,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
    );
    assert_eq!(ns["metadata"]["labels"], json!({"kubernetes.io/metadata.name": "team-a"}));
    assert_eq!(ns["spec"], json!({"finalizers": ["kubernetes"]}));
    assert_eq!(ns["status"], json!({"phase": "Active"}));
    let base = json!({"metadata": {"name": "team-a"}});
    let cases: &[Case] = &[
        (
            "dots",
            &|n| {
                n["metadata"]["name"] = json!("a.b");
            },
            "metadata.name: Invalid value: \"a.b\": must not contain dots",
            "FieldValueInvalid",
        ),
        (
            "namespace set",
            &|n| {
                n["metadata"]["namespace"] = json!("default");
            },
            "metadata.namespace: Forbidden: not allowed on this type",
            "FieldValueForbidden",
        ),
        (
            "finalizer",
            &|n| {
                n["spec"] = json!({"finalizers": ["custom"]});
            },
            "spec.finalizers: Invalid value: \"custom\": name is neither a standard finalizer name nor is it fully qualified",
            "FieldValueInvalid",
        ),
        (
            "long name",
            &|n| {
                n["metadata"]["name"] = json!("a".repeat(64));
            },
            &format!(
                "metadata.name: Invalid value: \"{}\": must be no more than 63 characters",
                "a".repeat(64)
            ),
            "FieldValueInvalid",
        ),
    ];
    rejects(NS, &base, cases);
    // Finalizers only change through /finalize; status is kept.
    let mut new = ns.clone();
    new["spec"]["finalizers"] = json!([]);
    new["status"]["phase"] = json!("Terminating");
    let (obj, errs, _) = update(NS, None, &ns, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert_eq!(obj["spec"]["finalizers"], json!(["kubernetes"]));
    assert_eq!(obj["status"]["phase"], "Active");
}

#[test]
fn node_rules() {
    let node = admitted(
        NODE,
        json!({"metadata": {"name": "node-1"}, "spec": {"podCIDR": "10.244.1.0/24"}}),
    );
    assert_eq!(node["spec"]["podCIDRs"], json!(["10.244.1.0/24"]));
    let base = json!({"metadata": {"name": "node-1"}});
    let cases: &[Case] = &[
        (
            "cidr",
            &|n| {
                n["spec"] = json!({"podCIDRs": ["10.244.1.0/33"]});
            },
            "spec.podCIDRs[0]: Invalid value: \"10.244.1.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            "FieldValueInvalid",
        ),
        (
            "two v4",
            &|n| {
                n["spec"] = json!({"podCIDRs": ["10.244.1.0/24", "10.244.2.0/24"]});
            },
            "spec.podCIDRs: Invalid value: []string{\"10.244.1.0/24\", \"10.244.2.0/24\"}: may specify no more than one CIDR for each IP family",
            "FieldValueInvalid",
        ),
        (
            "taint effect",
            &|n| {
                n["spec"] = json!({"taints": [{"key": "k", "effect": "Never"}]});
            },
            "metadata.taints[0].effect: Unsupported value: \"Never\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
            "FieldValueNotSupported",
        ),
        (
            "taint without effect",
            &|n| {
                n["spec"] = json!({"taints": [{"key": "k", "effect": ""}]});
            },
            "metadata.taints[0].effect: Required value",
            "FieldValueRequired",
        ),
        (
            "name",
            &|n| {
                n["metadata"]["name"] = json!("Node_1");
            },
            "metadata.name: Invalid value: \"Node_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            "FieldValueInvalid",
        ),
    ];
    rejects(NODE, &base, cases);
    let mut new = node.clone();
    new["spec"]["podCIDRs"] = json!(["10.244.9.0/24"]);
    new["spec"]["podCIDR"] = json!("10.244.9.0/24");
    let (_, errs, _) = update(NODE, None, &node, new);
    assert_has(
        &errs,
        "spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid",
        "FieldValueForbidden",
    );
    // Unschedulable and taints may change.
    let mut new = node.clone();
    new["spec"]["unschedulable"] = json!(true);
    new["spec"]["taints"] =
        json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]);
    let (_, errs, _) = update(NODE, None, &node, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
}

#[test]
fn config_map_rules() {
    let base =
        json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a.conf": "x"}});
    admitted(CM, base.clone());
    let cases: &[Case] = &[
        (
            "key",
            &|c| {
                c["data"] = json!({"a/b": "x"});
            },
            "data[a/b]: Invalid value: \"a/b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
            "FieldValueInvalid",
        ),
        (
            "duplicate across",
            &|c| {
                c["binaryData"] = json!({"a.conf": "eA=="});
            },
            "data[a.conf]: Invalid value: \"a.conf\": duplicate of key present in binaryData",
            "FieldValueInvalid",
        ),
        (
            "too big",
            &|c| {
                c["data"] = json!({"big": "x".repeat(1024 * 1024 + 1)});
            },
            ": Too long: may not be more than 1048576 bytes",
            "FieldValueTooLong",
        ),
    ];
    rejects(CM, &base, cases);
    let mut imm = base.clone();
    imm["immutable"] = json!(true);
    let stored = admitted(CM, imm);
    let mut new = stored.clone();
    new["data"]["a.conf"] = json!("y");
    let (_, errs, _) = update(CM, None, &stored, new);
    assert_eq!(strings(&errs), vec!["data: Forbidden: field is immutable when `immutable` is set"]);
    let mut new = stored.clone();
    new["immutable"] = json!(false);
    let (_, errs, _) = update(CM, None, &stored, new);
    assert_eq!(
        strings(&errs),
        vec!["immutable: Forbidden: field is immutable when `immutable` is set"]
    );
}

#[test]
fn secret_defaults_and_rules() {
    let s = admitted(
        SECRET,
        json!({"metadata": {"name": "s", "namespace": "default"}, "stringData": {"user": "admin"}}),
    );
    assert_eq!(s["type"], "Opaque");
    assert_eq!(s["data"], json!({"user": "YWRtaW4="}));
    assert!(s.get("stringData").is_none());
    let base = json!({"metadata": {"name": "s", "namespace": "default"}});
    let cases: &[Case] = &[
        (
            "tls",
            &|s| {
                s["type"] = json!("kubernetes.io/tls");
                s["data"] = json!({"tls.crt": "eA=="});
            },
            "data[tls.key]: Required value",
            "FieldValueRequired",
        ),
        (
            "dockerconfigjson",
            &|s| {
                s["type"] = json!("kubernetes.io/dockerconfigjson");
            },
            "data[.dockerconfigjson]: Required value",
            "FieldValueRequired",
        ),
        (
            "basic auth",
            &|s| {
                s["type"] = json!("kubernetes.io/basic-auth");
            },
            "data[username]: Required value",
            "FieldValueRequired",
        ),
        (
            "ssh",
            &|s| {
                s["type"] = json!("kubernetes.io/ssh-auth");
            },
            "data[ssh-privatekey]: Required value",
            "FieldValueRequired",
        ),
        (
            "sa token",
            &|s| {
                s["type"] = json!("kubernetes.io/service-account-token");
            },
            "metadata.annotations[kubernetes.io/service-account.name]: Required value",
            "FieldValueRequired",
        ),
        (
            "key",
            &|s| {
                s["data"] = json!({"..x": "eA=="});
            },
            "data[..x]: Invalid value: \"..x\": must not start with '..'",
            "FieldValueInvalid",
        ),
    ];
    rejects(SECRET, &base, cases);
    let mut bad_json = base.clone();
    bad_json["type"] = json!("kubernetes.io/dockerconfigjson");
    bad_json["data"] = json!({".dockerconfigjson": "bm90IGpzb24="});
    let (_, errs) = create(SECRET, bad_json);
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].to_string().starts_with(
            "data[.dockerconfigjson]: Invalid value: \"<secret contents redacted>\": "
        )
    );
    let stored = admitted(SECRET, base.clone());
    let mut new = stored.clone();
    new["type"] = json!("kubernetes.io/tls");
    new["data"] = json!({"tls.crt": "eA==", "tls.key": "eA=="});
    let (_, errs, _) = update(SECRET, None, &stored, new);
    assert_eq!(
        strings(&errs),
        vec!["type: Invalid value: \"kubernetes.io/tls\": field is immutable"]
    );
}

#[test]
fn service_account_and_event() {
    admitted(SA, json!({"metadata": {"name": "builder", "namespace": "default"}}));
    let (_, errs) = create(SA, json!({"metadata": {"name": "Builder", "namespace": "default"}}));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "metadata.name");
    let ev = json!({
        "metadata": {"name": "web.17a", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Scheduled", "message": "ok", "type": "Normal"
    });
    admitted(EVENT, ev.clone());
    let mut other_ns = ev.clone();
    other_ns["involvedObject"]["namespace"] = json!("kube-system");
    let (_, errs) = create(EVENT, other_ns);
    assert_eq!(
        strings(&errs),
        vec![
            "involvedObject.namespace: Invalid value: \"kube-system\": does not match event.namespace"
        ]
    );
    let mut new_style = ev.clone();
    new_style["eventTime"] = json!("2026-01-01T00:00:00.000000Z");
    new_style["reason"] = json!("x".repeat(129));
    let (_, errs) = create(EVENT, new_style);
    assert_has(&errs, "source: Required value", "FieldValueRequired");
    assert_has(
        &errs,
        "reason: Invalid value: \"\": can have at most 128 characters",
        "FieldValueInvalid",
    );
}

#[test]
fn endpoints_rules() {
    let base = json!({
        "metadata": {"name": "web", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "10.1.0.5"}], "ports": [{"port": 80}]}]
    });
    let ep = admitted(EP, base.clone());
    assert_eq!(ep["subsets"][0]["ports"][0]["protocol"], "TCP");
    let cases: &[Case] = &[
        (
            "loopback",
            &|e| {
                e["subsets"][0]["addresses"][0]["ip"] = json!("127.0.0.1");
            },
            "subsets[0].addresses[0].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
            "FieldValueInvalid",
        ),
        (
            "bad ip",
            &|e| {
                e["subsets"][0]["addresses"][0]["ip"] = json!("10.1");
            },
            "subsets[0].addresses[0].ip: Invalid value: \"10.1\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            "FieldValueInvalid",
        ),
        (
            "no addresses",
            &|e| {
                e["subsets"][0]["addresses"] = json!([]);
            },
            "subsets[0]: Required value: must specify `addresses` or `notReadyAddresses`",
            "FieldValueRequired",
        ),
        (
            "port names",
            &|e| {
                e["subsets"][0]["ports"] = json!([{"port": 80}, {"port": 81, "name": "b"}]);
            },
            "subsets[0].ports[0].name: Required value",
            "FieldValueRequired",
        ),
    ];
    rejects(EP, &base, cases);
}

const QUOTA: Gvk<'static> = Gvk::new("", "v1", "ResourceQuota");
const LIMITS: Gvk<'static> = Gvk::new("", "v1", "LimitRange");

#[test]
fn resource_quota_rules() {
    let base = json!({"metadata": {"name": "q", "namespace": "d"},
        "spec": {"hard": {"pods": "10", "requests.cpu": "1500m", "count/deployments.apps": "2",
            "example.com/gpu": "1"}}});
    admitted(QUOTA, base.clone());
    rejects(
        QUOTA,
        &base,
        &[
            (
                "unknown bare name",
                &|o| o["spec"]["hard"]["bogus"] = json!("1"),
                "spec.hard[bogus]: Invalid value: \"bogus\": must be a standard resource for quota",
                "FieldValueInvalid",
            ),
            (
                "negative",
                &|o| o["spec"]["hard"]["pods"] = json!("-1"),
                "spec.hard[pods]: Invalid value: \"-1\": must be greater than or equal to 0",
                "FieldValueInvalid",
            ),
            (
                "malformed amount",
                &|o| o["spec"]["hard"]["requests.cpu"] = json!("lots"),
                "spec.hard[requests.cpu]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                "FieldValueInvalid",
            ),
            (
                "fractional count",
                &|o| o["spec"]["hard"]["pods"] = json!("1500m"),
                "spec.hard[pods]: Invalid value: \"1500m\": must be an integer",
                "FieldValueInvalid",
            ),
            (
                "unknown scope",
                &|o| o["spec"]["scopes"] = json!(["Sometimes"]),
                "spec.scopes: Invalid value: []core.ResourceQuotaScope{\"Sometimes\"}: unsupported scope",
                "FieldValueInvalid",
            ),
            (
                "conflicting scopes",
                &|o| {
                    o["spec"]["hard"] = json!({"pods": "1"});
                    o["spec"]["scopes"] = json!(["BestEffort", "NotBestEffort"]);
                },
                "spec.scopes: Invalid value: []core.ResourceQuotaScope{\"BestEffort\", \"NotBestEffort\"}: conflicting scopes",
                "FieldValueInvalid",
            ),
            (
                "BestEffort limits only pods",
                &|o| o["spec"]["scopes"] = json!(["BestEffort"]),
                "spec.scopes: Invalid value: []core.ResourceQuotaScope{\"BestEffort\"}: unsupported scope applied to resource",
                "FieldValueInvalid",
            ),
        ],
    );
}

#[test]
fn limit_range_defaults_and_rules() {
    let lr = admitted(
        LIMITS,
        json!({"metadata": {"name": "l", "namespace": "d"}, "spec": {"limits": [
            {"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}},
            {"type": "Pod", "max": {"cpu": "4"}},
        ]}}),
    );
    // SetDefaults_LimitRangeItem: default limit from max, default request from the default
    // limit, else from min; Pod items untouched.
    assert_eq!(lr["spec"]["limits"][0]["default"], json!({"cpu": "2"}));
    assert_eq!(lr["spec"]["limits"][0]["defaultRequest"], json!({"cpu": "2", "memory": "64Mi"}));
    assert!(lr["spec"]["limits"][1].get("default").is_none());
    let base = json!({"metadata": {"name": "l", "namespace": "d"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]}});
    rejects(
        LIMITS,
        &base,
        &[
            (
                "unknown type",
                &|o| o["spec"]["limits"][0]["type"] = json!("Node"),
                "spec.limits[0].type: Unsupported value: \"Node\": supported values: \"Container\", \"PersistentVolumeClaim\", \"Pod\"",
                "FieldValueNotSupported",
            ),
            (
                "min over max",
                &|o| o["spec"]["limits"][0]["min"] = json!({"cpu": "3"}),
                "spec.limits[0].min[cpu]: Invalid value: \"3\": min value 3 is greater than max value 2",
                "FieldValueInvalid",
            ),
            (
                "defaults on a Pod item",
                &|o| o["spec"]["limits"][0] = json!({"type": "Pod", "default": {"cpu": "1"}}),
                "spec.limits[0].default: Forbidden: may not be specified when `type` is 'Pod'",
                "FieldValueForbidden",
            ),
        ],
    );
}
