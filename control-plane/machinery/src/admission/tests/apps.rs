use serde_json::{Value, json};

use super::*;

const DEPLOY: Gvk<'static> = Gvk::new("apps", "v1", "Deployment");
const RS: Gvk<'static> = Gvk::new("apps", "v1", "ReplicaSet");
const DS: Gvk<'static> = Gvk::new("apps", "v1", "DaemonSet");
const STS: Gvk<'static> = Gvk::new("apps", "v1", "StatefulSet");
const SCALE: Gvk<'static> = Gvk::new("autoscaling", "v1", "Scale");

fn workload(kind: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]}
            }
        }
    })
}

#[test]
fn deployment_defaults() {
    let d = admitted(DEPLOY, workload("Deployment"));
    let spec = &d["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
    );
    assert_eq!(spec["revisionHistoryLimit"], 10);
    assert_eq!(spec["progressDeadlineSeconds"], 600);
    assert_eq!(
        spec["template"]["spec"],
        json!({
            "containers": [{"name": "app", "image": "nginx:1.25", "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "resources": {}}],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "securityContext": {},
            "terminationGracePeriodSeconds": 30, "schedulerName": "default-scheduler"
        }),
        "templates get PodSpec defaults but none of the pod-only ones"
    );
    assert_eq!(d["status"], json!({}));
    assert_eq!(d["metadata"]["generation"], 1);
}

#[test]
fn deployment_rejections() {
    let base = workload("Deployment");
    let cases: &[Case] = &[
        (
            "negative replicas",
            &|d| {
                d["spec"]["replicas"] = json!(-1);
            },
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "selector mismatch",
            &|d| {
                d["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
            },
            "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`",
            "FieldValueInvalid",
        ),
        (
            "missing selector",
            &|d| {
                d["spec"].as_object_mut().unwrap().remove("selector");
            },
            "spec.selector: Required value",
            "FieldValueRequired",
        ),
        (
            "restart policy",
            &|d| {
                d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
            },
            "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            "FieldValueNotSupported",
        ),
        (
            "both zero",
            &|d| {
                d["spec"]["strategy"] =
                    json!({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}});
            },
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
            "FieldValueInvalid",
        ),
        (
            "bad percent",
            &|d| {
                d["spec"]["strategy"] = json!({"rollingUpdate": {"maxSurge": "abc"}});
            },
            "spec.strategy.rollingUpdate.maxSurge: Invalid value: \"abc\": a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            "FieldValueInvalid",
        ),
        (
            "over 100%",
            &|d| {
                d["spec"]["strategy"] = json!({"rollingUpdate": {"maxUnavailable": "150%"}});
            },
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"150%\": must not be greater than 100%",
            "FieldValueInvalid",
        ),
        (
            "recreate with rolling",
            &|d| {
                d["spec"]["strategy"] = json!({"type": "Recreate", "rollingUpdate": {}});
            },
            "spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'",
            "FieldValueForbidden",
        ),
        (
            "strategy type",
            &|d| {
                d["spec"]["strategy"] = json!({"type": "Blue"});
            },
            "spec.strategy: Unsupported value: \"Blue\": supported values: \"Recreate\", \"RollingUpdate\"",
            "FieldValueNotSupported",
        ),
        (
            "history",
            &|d| {
                d["spec"]["revisionHistoryLimit"] = json!(-2);
            },
            "spec.revisionHistoryLimit: Invalid value: -2: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "deadline",
            &|d| {
                d["spec"]["minReadySeconds"] = json!(700);
            },
            "spec.progressDeadlineSeconds: Invalid value: 600: must be greater than minReadySeconds",
            "FieldValueInvalid",
        ),
        (
            "template container",
            &|d| {
                d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("");
            },
            "spec.template.spec.containers[0].image: Required value",
            "FieldValueRequired",
        ),
        (
            "template label",
            &|d| {
                d["spec"]["template"]["metadata"]["labels"]["x"] = json!("a b");
            },
            "spec.template.labels: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            "FieldValueInvalid",
        ),
        (
            "empty selector",
            &|d| {
                d["spec"]["selector"] = json!({});
            },
            "spec.selector: Invalid value: {}: empty selector is invalid for deployment",
            "FieldValueInvalid",
        ),
        (
            "namespace missing",
            &|d| {
                d["metadata"].as_object_mut().unwrap().remove("namespace");
            },
            "metadata.namespace: Required value",
            "FieldValueRequired",
        ),
    ];
    rejects(DEPLOY, &base, cases);
    let mut d = base.clone();
    d["spec"]["replicas"] = json!(-1);
    let (_, errs) = create(DEPLOY, d);
    assert_eq!(
        invalid_message("Deployment", "apps", "web", &errs),
        "Deployment.apps \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    );
}

#[test]
fn deployment_updates() {
    let old = admitted(DEPLOY, workload("Deployment"));
    let mut old_with_status = old.clone();
    old_with_status["status"] = json!({"replicas": 1, "observedGeneration": 1});
    // A spec change bumps the generation and keeps the stored status.
    let mut new = old.clone();
    new["spec"]["replicas"] = json!(3);
    new["status"] = json!({"replicas": 99});
    let (obj, errs, prepared) = update(DEPLOY, None, &old_with_status, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(prepared.spec_changed);
    assert_eq!(obj["metadata"]["generation"], 2);
    assert_eq!(obj["status"], json!({"replicas": 1, "observedGeneration": 1}));
    // A label-only change does not.
    let mut new = old.clone();
    new["metadata"]["labels"] = json!({"team": "a"});
    let (obj, _, prepared) = update(DEPLOY, None, &old, new);
    assert!(!prepared.spec_changed);
    assert_eq!(obj["metadata"]["generation"], 1);
    // Annotations do for Deployments.
    let mut new = old.clone();
    new["metadata"]["annotations"] = json!({"a": "b"});
    let (obj, _, prepared) = update(DEPLOY, None, &old, new);
    assert!(prepared.spec_changed);
    assert_eq!(obj["metadata"]["generation"], 2);
    // The selector is immutable.
    let mut new = old.clone();
    new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "v": "2"}});
    new["spec"]["template"]["metadata"]["labels"]["v"] = json!("2");
    let (_, errs, _) = update(DEPLOY, None, &old, new);
    assert_eq!(errs.len(), 1, "{:?}", strings(&errs));
    assert_eq!(errs[0].field, "spec.selector");
    assert!(errs[0].to_string().ends_with(": field is immutable"));
    // A status write changes only the status.
    let mut new = old.clone();
    new["spec"]["replicas"] = json!(5);
    new["status"] = json!({"replicas": 1, "readyReplicas": 1});
    let (obj, errs, prepared) = update(DEPLOY, Some("status"), &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(!prepared.spec_changed);
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(obj["status"]["readyReplicas"], 1);
    let mut bad = old.clone();
    bad["status"] = json!({"replicas": -1});
    let (_, errs, _) = update(DEPLOY, Some("status"), &old, bad);
    assert_has(
        &errs,
        "status.replicas: Invalid value: -1: must be greater than or equal to 0",
        "FieldValueInvalid",
    );
}

#[test]
fn replica_set_defaults_and_rules() {
    let rs = admitted(RS, workload("ReplicaSet"));
    assert_eq!(rs["spec"]["replicas"], 1);
    let mut bad = workload("ReplicaSet");
    bad["spec"]["template"]["spec"]["activeDeadlineSeconds"] = json!(5);
    let (_, errs) = create(RS, bad);
    assert_has(
        &errs,
        "spec.template.spec.activeDeadlineSeconds: Forbidden: activeDeadlineSeconds in ReplicaSet is not Supported",
        "FieldValueForbidden",
    );
}

#[test]
fn daemon_set_defaults_and_rules() {
    let ds = admitted(DS, workload("DaemonSet"));
    assert_eq!(
        ds["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"], "1");
    // A template change bumps the template generation.
    let mut new = ds.clone();
    new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let (obj, errs, _) = update(DS, None, &ds, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert_eq!(obj["metadata"]["annotations"]["deprecated.daemonset.template.generation"], "2");
    assert_eq!(obj["metadata"]["generation"], 2);
    let base = workload("DaemonSet");
    let cases: &[Case] = &[
        (
            "both zero",
            &|d| {
                d["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}});
            },
            "spec.updateStrategy.rollingUpdate.maxUnavailable: Required value: cannot be 0 when maxSurge is 0",
            "FieldValueRequired",
        ),
        (
            "both set",
            &|d| {
                d["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}});
            },
            "spec.updateStrategy.rollingUpdate.maxSurge: Invalid value: 1: may not be set when maxUnavailable is non-zero",
            "FieldValueInvalid",
        ),
        (
            "mismatch",
            &|d| {
                d["spec"]["selector"] = json!({"matchLabels": {"app": "x"}});
            },
            "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"web\"}: `selector` does not match template `labels`",
            "FieldValueInvalid",
        ),
        (
            "strategy type",
            &|d| {
                d["spec"]["updateStrategy"] = json!({"type": "Fast"});
            },
            "spec.updateStrategy: Unsupported value: \"Fast\": supported values: \"RollingUpdate\", \"OnDelete\"",
            "FieldValueNotSupported",
        ),
    ];
    rejects(DS, &base, cases);
}

#[test]
fn stateful_set_defaults_and_rules() {
    let mut s = workload("StatefulSet");
    s["spec"]["serviceName"] = json!("web");
    s["spec"]["volumeClaimTemplates"] =
        json!([{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]);
    s["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "data", "mountPath": "/d"}]);
    let sts = admitted(STS, s);
    let spec = &sts["spec"];
    assert_eq!(spec["podManagementPolicy"], "OrderedReady");
    assert_eq!(
        spec["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    );
    assert_eq!(
        spec["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["revisionHistoryLimit"], 10);
    assert_eq!(spec["volumeClaimTemplates"][0]["spec"]["volumeMode"], "Filesystem");
    assert_eq!(spec["volumeClaimTemplates"][0]["status"]["phase"], "Pending");
    // Scaling and template changes are allowed; other spec fields are not.
    let mut new = sts.clone();
    new["spec"]["replicas"] = json!(3);
    let (_, errs, _) = update(STS, None, &sts, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    let mut new = sts.clone();
    new["spec"]["serviceName"] = json!("other");
    let (_, errs, _) = update(STS, None, &sts, new);
    assert_has(
        &errs,
        "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
        "FieldValueForbidden",
    );
    let base = workload("StatefulSet");
    let cases: &[Case] = &[
        (
            "policy",
            &|s| {
                s["spec"]["podManagementPolicy"] = json!("Random");
            },
            "spec.podManagementPolicy: Invalid value: \"Random\": must be 'OrderedReady' or 'Parallel'",
            "FieldValueInvalid",
        ),
        (
            "partition",
            &|s| {
                s["spec"]["updateStrategy"] =
                    json!({"type": "RollingUpdate", "rollingUpdate": {"partition": -1}});
            },
            "spec.updateStrategy.rollingUpdate.partition: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "empty selector",
            &|s| {
                s["spec"]["selector"] = json!({});
            },
            "spec.selector: Invalid value: {}: empty selector is invalid for statefulset",
            "FieldValueInvalid",
        ),
    ];
    rejects(STS, &base, cases);
}

#[test]
fn scale_subresource() {
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": -1}});
    let errs = validate(SCALE, Operation::Update, None, &scale, None);
    assert_eq!(
        strings(&errs),
        vec!["spec.replicas: Invalid value: -1: must be greater than or equal to 0"]
    );
    let errs = validate(DEPLOY, Operation::Update, Some("scale"), &scale, None);
    assert_eq!(errs.len(), 1);
    let mut ok = scale.clone();
    ok["spec"]["replicas"] = json!(3);
    assert!(validate(SCALE, Operation::Update, None, &ok, None).is_empty());
}

#[test]
fn host_network_templates_keep_host_port_unset() {
    let mut ds = workload("DaemonSet");
    ds["spec"]["template"]["spec"]["hostNetwork"] = json!(true);
    ds["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 9100}]);
    let ds = admitted(DS, ds);
    let port = &ds["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert!(port.get("hostPort").is_none(), "{port}");
}
