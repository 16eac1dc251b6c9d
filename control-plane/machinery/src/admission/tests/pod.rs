use serde_json::{Value, json};

use super::*;

fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]}
    })
}

#[test]
fn minimal_pod_gets_upstream_defaults() {
    let p = admitted(POD, pod());
    assert_eq!(
        p["spec"],
        json!({
            "containers": [{
                "name": "app", "image": "nginx:1.25",
                "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "resources": {}
            }],
            "dnsPolicy": "ClusterFirst",
            "restartPolicy": "Always",
            "securityContext": {},
            "terminationGracePeriodSeconds": 30,
            "schedulerName": "default-scheduler",
            "enableServiceLinks": true,
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        })
    );
    assert_eq!(p["status"], json!({"phase": "Pending", "qosClass": "BestEffort"}));
    assert_eq!(p["metadata"]["generation"], json!(1));
}

#[test]
fn container_port_probe_volume_defaults() {
    let mut p = pod();
    p["spec"]["containers"][0] = json!({
        "name": "app", "image": "nginx",
        "ports": [{"containerPort": 80}],
        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "livenessProbe": {"httpGet": {"port": 80}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "cfg", "mountPath": "/cfg"}]
    });
    p["spec"]["volumes"] = json!([{"name": "data"}, {"name": "cfg", "configMap": {"name": "c"}}]);
    let p = admitted(POD, p);
    let c = &p["spec"]["containers"][0];
    assert_eq!(c["imagePullPolicy"], "Always", "untagged image means :latest");
    assert_eq!(c["ports"][0]["protocol"], "TCP");
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
    assert_eq!(
        c["livenessProbe"],
        json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
               "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(p["spec"]["volumes"][0], json!({"name": "data", "emptyDir": {}}));
    assert_eq!(p["spec"]["volumes"][1]["configMap"]["defaultMode"], 420);
}

#[test]
fn image_pull_policy_follows_the_tag() {
    for (image, policy) in [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("registry:5000/nginx", "Always"),
        ("registry:5000/nginx:1.2", "IfNotPresent"),
        ("nginx@sha256:abcd", "IfNotPresent"),
        ("nginx:latest@sha256:abcd", "Always"),
    ] {
        let mut p = pod();
        p["spec"]["containers"][0]["image"] = json!(image);
        let p = admitted(POD, p);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], policy, "{image}");
    }
}

#[test]
fn qos_class_and_requests_from_limits() {
    let with_res = |res: Value| {
        let mut p = pod();
        p["spec"]["containers"][0]["resources"] = res;
        admitted(POD, p)
    };
    let g = with_res(json!({"limits": {"cpu": "500m", "memory": "128Mi"}}));
    assert_eq!(g["status"]["qosClass"], "Guaranteed");
    assert_eq!(
        g["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "500m", "memory": "128Mi"})
    );
    let c = with_res(json!({"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"cpu": 1}}));
    assert_eq!(
        c["spec"]["containers"][0]["resources"],
        json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1"}}),
        "quantities are stored in canonical form"
    );
    let b = with_res(json!({"requests": {"cpu": "100m"}}));
    assert_eq!(b["status"]["qosClass"], "Burstable");
    let b2 = with_res(
        json!({"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "0.2", "memory": "1Gi"}}),
    );
    assert_eq!(b2["status"]["qosClass"], "Burstable");
    let g2 = with_res(
        json!({"requests": {"cpu": "0.5", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1024Mi"}}),
    );
    assert_eq!(g2["status"]["qosClass"], "Guaranteed", "equal quantities in different forms");
}

#[test]
fn existing_tolerations_and_priority_class_are_respected() {
    let mut p = pod();
    p["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    p["spec"]["priorityClassName"] = json!("system-node-critical");
    let p = admitted(POD, p);
    assert_eq!(p["spec"]["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(p["spec"]["priority"], 2_000_001_000);
}

#[test]
fn pod_rejections() {
    let base = pod();
    let cases: &[Case] = &[
        (
            "no name",
            &|p| {
                p["metadata"]["name"] = json!("");
            },
            "metadata.name: Required value: name or generateName is required",
            "FieldValueRequired",
        ),
        (
            "bad name",
            &|p| {
                p["metadata"]["name"] = json!("Web_1");
            },
            "metadata.name: Invalid value: \"Web_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            "FieldValueInvalid",
        ),
        (
            "bad generateName",
            &|p| {
                p["metadata"]["name"] = json!("");
                p["metadata"]["generateName"] = json!("Web-");
            },
            "metadata.generateName: Invalid value: \"Web-\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            "FieldValueInvalid",
        ),
        (
            "bad label value",
            &|p| {
                p["metadata"]["labels"] = json!({"app": "a b"});
            },
            "metadata.labels: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            "FieldValueInvalid",
        ),
        (
            "bad label key",
            &|p| {
                p["metadata"]["labels"] = json!({"-app": "x"});
            },
            "metadata.labels: Invalid value: \"-app\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            "FieldValueInvalid",
        ),
        (
            "two controllers",
            &|p| {
                p["metadata"]["ownerReferences"] = json!([
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "1", "controller": true},
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "2", "controller": true}]);
            },
            "",
            "",
        ),
        (
            "owner without uid",
            &|p| {
                p["metadata"]["ownerReferences"] =
                    json!([{"apiVersion": "v1", "kind": "Node", "name": "a", "uid": ""}]);
            },
            "metadata.ownerReferences.uid: Invalid value: \"\": uid must not be empty",
            "FieldValueInvalid",
        ),
        (
            "no containers",
            &|p| {
                p["spec"]["containers"] = json!([]);
            },
            "spec.containers: Required value",
            "FieldValueRequired",
        ),
        (
            "no image",
            &|p| {
                p["spec"]["containers"][0]["image"] = json!("");
            },
            "spec.containers[0].image: Required value",
            "FieldValueRequired",
        ),
        (
            "duplicate container",
            &|p| {
                p["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "app", "image": "x"}));
            },
            "spec.containers[1].name: Duplicate value: \"app\"",
            "FieldValueDuplicate",
        ),
        (
            "container name",
            &|p| {
                p["spec"]["containers"][0]["name"] = json!("App");
            },
            "spec.containers[0].name: Invalid value: \"App\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "FieldValueInvalid",
        ),
        (
            "port range",
            &|p| {
                p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 70000}]);
            },
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "FieldValueInvalid",
        ),
        (
            "port protocol",
            &|p| {
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": 80, "protocol": "XYZ"}]);
            },
            "spec.containers[0].ports[0].protocol: Unsupported value: \"XYZ\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "FieldValueNotSupported",
        ),
        (
            "port names",
            &|p| {
                p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http"}]);
            },
            "spec.containers[0].ports[1].name: Duplicate value: \"http\"",
            "FieldValueDuplicate",
        ),
        (
            "port name format",
            &|p| {
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": 80, "name": "8080"}]);
            },
            "spec.containers[0].ports[0].name: Invalid value: \"8080\": must contain at least one letter (a-z)",
            "FieldValueInvalid",
        ),
        (
            "env name",
            &|p| {
                p["spec"]["containers"][0]["env"] = json!([{"name": "A=B", "value": "x"}]);
            },
            "spec.containers[0].env[0].name: Invalid value: \"A=B\": a valid environment variable name must consist only of printable ASCII characters other than '='",
            "FieldValueInvalid",
        ),
        (
            "mount without volume",
            &|p| {
                p["spec"]["containers"][0]["volumeMounts"] =
                    json!([{"name": "data", "mountPath": "/d"}]);
            },
            "spec.containers[0].volumeMounts[0].name: Not found: \"data\"",
            "FieldValueNotFound",
        ),
        (
            "bidirectional propagation unprivileged",
            &|p| {
                p["spec"]["volumes"] =
                    json!([{"name": "bpf", "hostPath": {"path": "/sys/fs/bpf"}}]);
                p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "bpf",
                    "mountPath": "/sys/fs/bpf", "mountPropagation": "Bidirectional"}]);
            },
            "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers",
            "FieldValueForbidden",
        ),
        (
            "two volume sources",
            &|p| {
                p["spec"]["volumes"] =
                    json!([{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}]);
            },
            "spec.volumes[0].emptyDir: Forbidden: may not specify more than 1 volume type",
            "FieldValueForbidden",
        ),
        (
            "duplicate volume",
            &|p| {
                p["spec"]["volumes"] = json!([{"name": "v"}, {"name": "v"}]);
            },
            "spec.volumes[1].name: Duplicate value: \"v\"",
            "FieldValueDuplicate",
        ),
        (
            "restart policy",
            &|p| {
                p["spec"]["restartPolicy"] = json!("Sometimes");
            },
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
            "FieldValueNotSupported",
        ),
        (
            "dns policy",
            &|p| {
                p["spec"]["dnsPolicy"] = json!("Google");
            },
            "spec.dnsPolicy: Unsupported value: \"Google\": supported values: \"ClusterFirst\", \"ClusterFirstWithHostNet\", \"Default\", \"None\"",
            "FieldValueNotSupported",
        ),
        (
            "dns none without config",
            &|p| {
                p["spec"]["dnsPolicy"] = json!("None");
            },
            "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
            "FieldValueRequired",
        ),
        (
            "requests over limits",
            &|p| {
                p["spec"]["containers"][0]["resources"] =
                    json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}});
            },
            "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            "FieldValueInvalid",
        ),
        (
            "bad quantity",
            &|p| {
                p["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "lots"}});
            },
            "spec.containers[0].resources.limits[memory]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            "FieldValueInvalid",
        ),
        (
            "negative quantity",
            &|p| {
                p["spec"]["containers"][0]["resources"] = json!({"requests": {"memory": "-1"}});
            },
            "spec.containers[0].resources.requests[memory]: Invalid value: \"-1\": must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "unknown resource",
            &|p| {
                p["spec"]["containers"][0]["resources"] = json!({"requests": {"gpu": "1"}});
            },
            "spec.containers[0].resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
            "FieldValueInvalid",
        ),
        (
            "probe without handler",
            &|p| {
                p["spec"]["containers"][0]["readinessProbe"] = json!({"periodSeconds": 5});
            },
            "spec.containers[0].readinessProbe: Required value: must specify a handler type",
            "FieldValueRequired",
        ),
        (
            "liveness success threshold",
            &|p| {
                p["spec"]["containers"][0]["livenessProbe"] =
                    json!({"exec": {"command": ["true"]}, "successThreshold": 2});
            },
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            "FieldValueInvalid",
        ),
        (
            "toleration operator",
            &|p| {
                p["spec"]["tolerations"] = json!([{"key": "a", "operator": "Maybe"}]);
            },
            "spec.tolerations[0].operator: Unsupported value: \"Maybe\": supported values: \"Equal\", \"Exists\"",
            "FieldValueNotSupported",
        ),
        (
            "toleration effect",
            &|p| {
                p["spec"]["tolerations"] =
                    json!([{"key": "a", "operator": "Exists", "effect": "Sometimes"}]);
            },
            "spec.tolerations[0].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
            "FieldValueNotSupported",
        ),
        (
            "node name",
            &|p| {
                p["spec"]["nodeName"] = json!("Node_1");
            },
            "spec.nodeName: Invalid value: \"Node_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            "FieldValueInvalid",
        ),
        (
            "affinity operator",
            &|p| {
                p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near"}]}]}}});
            },
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: Invalid value: \"Near\": not a valid selector operator",
            "FieldValueInvalid",
        ),
        (
            "affinity weight",
            &|p| {
                p["spec"]["affinity"] = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 0, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}});
            },
            "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100",
            "FieldValueInvalid",
        ),
        (
            "affinity topology key",
            &|p| {
                p["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}}]}});
            },
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value: can not be empty",
            "FieldValueRequired",
        ),
        (
            "spread skew",
            &|p| {
                p["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]);
            },
            "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0: must be greater than zero",
            "FieldValueInvalid",
        ),
        (
            "spread action",
            &|p| {
                p["spec"]["topologySpreadConstraints"] =
                    json!([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]);
            },
            "spec.topologySpreadConstraints[0].whenUnsatisfiable: Unsupported value: \"Maybe\": supported values: \"DoNotSchedule\", \"ScheduleAnyway\"",
            "FieldValueNotSupported",
        ),
        (
            "spread node policy",
            &|p| {
                p["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Sometimes"}]);
            },
            "spec.topologySpreadConstraints[0].nodeTaintsPolicy: Unsupported value: \"Sometimes\": supported values: \"Honor\", \"Ignore\"",
            "FieldValueNotSupported",
        ),
        (
            "host network port",
            &|p| {
                p["spec"]["hostNetwork"] = json!(true);
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": 80, "hostPort": 8080}]);
            },
            "spec.containers[0].ports[0].hostPort: Invalid value: 8080: must match `containerPort` when `hostNetwork` is true",
            "FieldValueInvalid",
        ),
        (
            "run as user",
            &|p| {
                p["spec"]["securityContext"] = json!({"runAsUser": -1});
            },
            "spec.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
            "FieldValueInvalid",
        ),
        (
            "volume item path",
            &|p| {
                p["spec"]["volumes"] = json!([{"name": "c", "configMap": {"name": "c", "items": [{"key": "a", "path": "../x"}]}}]);
            },
            "spec.volumes[0].configMap.items[0].path: Invalid value: \"../x\": must not contain '..'",
            "FieldValueInvalid",
        ),
        (
            "active deadline",
            &|p| {
                p["spec"]["activeDeadlineSeconds"] = json!(0);
            },
            "spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive",
            "FieldValueInvalid",
        ),
        (
            "namespace on pod",
            &|p| {
                p["metadata"]["namespace"] = json!("Bad");
            },
            "metadata.namespace: Invalid value: \"Bad\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "FieldValueInvalid",
        ),
    ];
    let (controllers, rest) = cases.split_at(6);
    rejects(POD, &base, &controllers[..5]);
    rejects(POD, &base, rest);
    // Two controller references: the value is the list, the detail names both.
    let mut p = base.clone();
    (controllers[5].1)(&mut p);
    let (_, errs) = create(POD, p);
    let e = errs.iter().find(|e| e.field == "metadata.ownerReferences").expect("controller error");
    assert_eq!(e.reason(), "FieldValueInvalid");
    assert!(e.detail.ends_with(
        "Only one reference can have Controller set to true. Found \"true\" in references for ReplicaSet/a and ReplicaSet/b"
    ));
}

#[test]
fn pod_update_rules() {
    let old = admitted(POD, pod());
    // Image changes are allowed and bump the generation.
    let mut new = old.clone();
    new["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    let (new_obj, errs, prepared) = update(POD, None, &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(prepared.spec_changed);
    assert_eq!(new_obj["metadata"]["generation"], 2);
    // Status written through the main resource is dropped.
    let mut new = old.clone();
    new["status"]["phase"] = json!("Running");
    let (new_obj, errs, prepared) = update(POD, None, &old, new);
    assert!(errs.is_empty());
    assert!(!prepared.spec_changed);
    assert_eq!(new_obj["status"]["phase"], "Pending");
    assert_eq!(new_obj["metadata"]["generation"], 1);
    // Other spec changes are forbidden with upstream's message.
    let mut new = old.clone();
    new["spec"]["restartPolicy"] = json!("Never");
    let (_, errs, _) = update(POD, None, &old, new);
    assert_eq!(errs.len(), 1, "{:?}", strings(&errs));
    assert_eq!(errs[0].field, "spec");
    assert_eq!(errs[0].reason(), "FieldValueForbidden");
    assert!(errs[0].to_string().starts_with(
        "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n"
    ));
    assert!(errs[0].detail.contains("restartPolicy"));
    // Adding a toleration is fine; removing one is not.
    let mut new = old.clone();
    new["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "x", "operator": "Exists"}));
    let (_, errs, _) = update(POD, None, &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    let mut new = old.clone();
    new["spec"]["tolerations"] = json!([]);
    let (_, errs, _) = update(POD, None, &old, new);
    assert_has(
        &errs,
        "spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds",
        "FieldValueForbidden",
    );
    // Containers cannot be added.
    let mut new = old.clone();
    new["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "b", "image": "x"}));
    let (_, errs, _) = update(POD, None, &old, new);
    assert_has(
        &errs,
        "spec.containers: Forbidden: pod updates may not add or remove containers",
        "FieldValueForbidden",
    );
    // Name is immutable.
    let mut new = old.clone();
    new["metadata"]["name"] = json!("other");
    let (_, errs, _) = update(POD, None, &old, new);
    assert_has(
        &errs,
        "metadata.name: Invalid value: \"other\": field is immutable",
        "FieldValueInvalid",
    );
    // activeDeadlineSeconds may only shrink.
    let mut with_ads = old.clone();
    with_ads["spec"]["activeDeadlineSeconds"] = json!(100);
    let mut new = with_ads.clone();
    new["spec"]["activeDeadlineSeconds"] = json!(200);
    let (_, errs, _) = update(POD, None, &with_ads, new);
    assert_has(
        &errs,
        "spec.activeDeadlineSeconds: Invalid value: 200: must be less than or equal to previous value",
        "FieldValueInvalid",
    );
}

#[test]
fn pod_status_update() {
    let old = admitted(POD, pod());
    let mut new = old.clone();
    new["status"] =
        json!({"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]});
    new["spec"]["restartPolicy"] = json!("Never");
    new["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "x"}]);
    let (obj, errs, _) = update(POD, Some("status"), &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert_eq!(obj["status"]["phase"], "Running");
    assert_eq!(obj["status"]["qosClass"], "BestEffort", "backfilled from the stored pod");
    assert!(
        obj["metadata"].get("ownerReferences").is_none(),
        "status writes keep owner references"
    );
    assert_eq!(obj["spec"]["restartPolicy"], "Always", "spec comes from the stored pod");
    let mut bad = old.clone();
    bad["status"]["phase"] = json!("Dancing");
    let (_, errs, _) = update(POD, Some("status"), &old, bad);
    assert_has(
        &errs,
        "status.phase: Unsupported value: \"Dancing\": supported values: \"Failed\", \"Pending\", \"Running\", \"Succeeded\", \"Unknown\"",
        "FieldValueNotSupported",
    );
}

#[test]
fn binding_target() {
    let b = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web", "namespace": "default"},
                   "target": {"kind": "Pod", "name": ""}});
    let errs = validate(Gvk::new("", "v1", "Binding"), Operation::Create, None, &b, None);
    assert_eq!(
        strings(&errs),
        vec![
            "target.kind: Unsupported value: \"Pod\": supported values: \"Node\", \"<empty>\"",
            "target.name: Required value",
        ]
    );
    let ok = json!({"target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}, "metadata": {"name": "web"}});
    assert!(validate(POD, Operation::Create, Some("binding"), &ok, None).is_empty());
}

#[test]
fn invalid_message_and_status() {
    let mut p = pod();
    p["spec"]["containers"][0]["image"] = json!("");
    p["spec"]["restartPolicy"] = json!("Sometimes");
    let (_, errs) = create(POD, p);
    assert_eq!(
        invalid_message("Pod", "", "web", &errs),
        "Pod \"web\" is invalid: [spec.containers[0].image: Required value, spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"]"
    );
    assert_eq!(
        invalid_message("Deployment", "apps", "web", &errs[..1]),
        "Deployment.apps \"web\" is invalid: spec.containers[0].image: Required value"
    );
    let st = invalid_status("Pod", "", "web", &errs);
    assert_eq!(st["code"], 422);
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["details"]["kind"], "Pod");
    assert!(st["details"].get("group").is_none(), "core group is omitted");
    assert_eq!(
        st["details"]["causes"][0],
        json!({"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers[0].image"})
    );
}

#[test]
fn typical_pod_admission_is_fast() {
    let mut p = pod();
    p["metadata"]["labels"] = json!({"app": "web", "tier": "frontend"});
    p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "name": "http"}]);
    p["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}});
    // Warm up, then time a batch (debug build: generous bound, release is ~10x faster).
    let _ = create(POD, p.clone());
    let n = 200;
    let start = std::time::Instant::now();
    for _ in 0..n {
        let (_, errs) = create(POD, p.clone());
        assert!(errs.is_empty());
    }
    let per = start.elapsed() / n;
    eprintln!("default + prepare + validate of a pod: {per:?} (debug build)");
    assert!(per < std::time::Duration::from_millis(2), "admission of a pod took {per:?}");
}

#[test]
fn scheduling_fields_that_are_valid_pass() {
    let mut p = pod();
    p["spec"]["hostNetwork"] = json!(true);
    p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080}]);
    p["spec"]["affinity"] = json!({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}}]}
    });
    p["spec"]["topologySpreadConstraints"] = json!([
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"app": "web"}}}
    ]);
    let p = admitted(POD, p);
    assert_eq!(
        p["spec"]["containers"][0]["ports"][0]["hostPort"], 8080,
        "host network pods get hostPort = containerPort"
    );
}
