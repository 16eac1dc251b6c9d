//! CustomResourceDefinitions end to end with real kubectl (1.33 and 1.27): a CRD applied,
//! named and Established by the controllers, its resource in discovery and served with
//! every verb like a built-in one, bad CRDs refused with their causes, names in conflict
//! not accepted, and deleting the CRD deleting its objects first.

use std::time::Duration;

use serde_json::Value;
use skiff_tests::{Kubectl, TestServer};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wg]
    categories: [all]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Ready, type: boolean, jsonPath: .status.ready}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, minimum: 0}
              color: {type: string, default: grey}
              replicas: {type: integer}
          status:
            type: object
            properties:
              ready: {type: boolean}
              replicas: {type: integer}
              selector: {type: string}
  - name: v1beta1
    served: true
    storage: false
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

fn json(k: &Kubectl, args: &[&str]) -> Value {
    serde_json::from_str(&k.ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    skiff_tests::wait_until(what, Duration::from_secs(20), f);
}

fn wait_for_long(what: &str, f: impl FnMut() -> bool) {
    skiff_tests::wait_until(what, Duration::from_secs(60), f);
}

#[test]
fn a_crd_is_established_and_its_resources_are_served_like_built_ins() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    k.ok_stdin(&["apply", "-f", "-"], Some(CRD));
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s"]);
    let crd = json(&k, &["get", "crd", "widgets.example.com", "-o", "json"]);
    let status = &crd["status"];
    assert_eq!(status["acceptedNames"]["kind"], "Widget");
    assert_eq!(status["acceptedNames"]["listKind"], "WidgetList");
    assert_eq!(status["storedVersions"], serde_json::json!(["v1"]));
    let names = status["conditions"].as_array().unwrap();
    assert!(
        names.iter().any(|c| c["type"] == "NamesAccepted" && c["status"] == "True"),
        "{status}"
    );
    assert_eq!(
        crd["metadata"]["finalizers"],
        serde_json::json!(["customresourcecleanup.apiextensions.k8s.io"])
    );

    let table = k.ok(&["get", "crds"]);
    assert!(
        table.starts_with("NAME") && table.contains("CREATED AT"),
        "upstream's columns: {table}"
    );

    // Discovery: kubectl finds it by plural, short name and category.
    wait_for("widgets in discovery", || {
        k.ok(&["api-resources", "--api-group=example.com"]).contains("widgets")
    });
    let resources = k.ok(&["api-resources", "--api-group=example.com", "-o", "wide"]);
    assert!(resources.contains("wg") && resources.contains("Widget"), "{resources}");

    // The verbs.
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {size: 3, color: red}\n"),
    );
    let w = json(&k, &["get", "wg", "w1", "-o", "json"]);
    assert_eq!(w["spec"]["size"], 3);
    assert_eq!(w["metadata"]["generation"], 1);
    assert!(w["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    // The CRD's printer columns.
    let table = k.ok(&["get", "widgets"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "READY", "AGE"], "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    // No status yet: the Ready cell is null, which kubectl prints empty.
    assert_eq!((row.len(), &row[..2]), (3, &["w1", "3"][..]), "{table}");
    k.ok(&["patch", "widget", "w1", "--type=merge", "-p", r#"{"spec":{"size":4}}"#]);
    let w = json(&k, &["get", "widget", "w1", "-o", "json"]);
    assert_eq!(
        (w["spec"]["size"].clone(), w["metadata"]["generation"].clone()),
        (4.into(), 2.into())
    );
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/color","value":"blue"}]"#,
    ]);
    assert_eq!(json(&k, &["get", "widget", "w1", "-o", "json"])["spec"]["color"], "blue");
    // No patch strategies for custom resources: 415 as upstream.
    let err =
        k.fails(&["patch", "widget", "w1", "--type=strategic", "-p", r#"{"spec":{"size":5}}"#]);
    assert!(
        err.contains("UnsupportedMediaType")
            || err.contains("415")
            || err.contains("not supported"),
        "{err}"
    );
    // The main resource ignores status; the status subresource writes it.
    k.ok(&["patch", "widget", "w1", "--type=merge", "-p", r#"{"status":{"ready":true}}"#]);
    assert!(json(&k, &["get", "widget", "w1", "-o", "json"]).get("status").is_none());
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ]);
    let w = json(&k, &["get", "widget", "w1", "-o", "json"]);
    assert_eq!(w["status"]["ready"], true);
    assert_eq!(
        w["metadata"]["generation"], 3,
        "spec.color changed once more, status did not count"
    );
    // The schema: type and bounds checked with upstream's messages, unknown fields refused
    // (kubectl asks for fieldValidation=Strict) or pruned (Ignore), defaults applied.
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad, namespace: default}\nspec: {size: big}\n"),
    );
    assert!(err.contains("spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""), "{err}");
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad, namespace: default}\nspec: {size: -1}\n"),
    );
    assert!(
        err.contains(
            "spec.size: Invalid value: -1: spec.size in body should be greater than or equal to 0"
        ),
        "{err}"
    );
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: extra, namespace: default}\nspec: {size: 1, shape: round}\n"),
    );
    assert!(err.contains("unknown field \"spec.shape\""), "{err}");
    k.ok_stdin(
        &["apply", "--validate=false", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: extra, namespace: default}\nspec: {size: 1, shape: round}\n"),
    );
    let extra = json(&k, &["get", "widget", "extra", "-o", "json"]);
    assert_eq!(
        extra["spec"],
        serde_json::json!({"size": 1, "color": "grey"}),
        "pruned and defaulted"
    );
    k.ok(&["delete", "widget", "extra"]);

    // Another served version (conversion None): the same objects, apiVersion rewritten;
    // writes through it are stored at the storage version.
    let beta = json(&k, &["get", "widgets.v1beta1.example.com", "w1", "-o", "json"]);
    assert_eq!(beta["apiVersion"], "example.com/v1beta1");
    assert_eq!(beta["spec"]["size"], 4);
    k.ok(&[
        "patch",
        "widgets.v1beta1.example.com",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"color":"green"}}"#,
    ]);
    let v1 = json(&k, &["get", "widgets.v1.example.com", "w1", "-o", "json"]);
    assert_eq!(
        (v1["apiVersion"].clone(), v1["spec"]["color"].clone()),
        ("example.com/v1".into(), "green".into())
    );
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1beta1\nkind: Widget\nmetadata: {name: w4, namespace: default}\nspec: {size: 9}\n"),
    );
    let listed = json(&k, &["get", "widgets.v1beta1.example.com", "-o", "json"]);
    let versions: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["apiVersion"].as_str().unwrap())
        .collect();
    assert!(
        versions.len() >= 2 && versions.iter().all(|v| *v == "example.com/v1beta1"),
        "{versions:?}"
    );
    let w4 = json(&k, &["get", "widget", "w4", "-o", "json"]);
    assert_eq!(
        (w4["apiVersion"].clone(), w4["spec"]["color"].clone()),
        ("example.com/v1".into(), "grey".into()),
        "stored at v1, v1's defaults on read"
    );
    k.ok(&["delete", "widgets.v1beta1.example.com", "w4"]);

    // The scale subresource at the CRD's paths: kubectl scale and the Scale it reads.
    k.ok(&["scale", "widget", "w1", "--replicas=5"]);
    assert_eq!(json(&k, &["get", "widget", "w1", "-o", "json"])["spec"]["replicas"], 5);
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":4,"selector":"app=w"}}"#,
    ]);
    let scale = json(&k, &["get", "widget", "w1", "--subresource=scale", "-o", "json"]);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(
        (scale["spec"]["replicas"].clone(), scale["status"]["replicas"].clone()),
        (5.into(), 4.into())
    );
    assert_eq!(scale["status"]["selector"], "app=w");

    // Server-side apply, labels, list and watch.
    k.ok_stdin(
        &["apply", "--server-side", "--field-manager=tester", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2, namespace: default, labels: {tier: a}}\nspec: {size: 1}\n"),
    );
    let listed = json(&k, &["get", "widgets", "-l", "tier=a", "-o", "json"]);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["metadata"]["name"], "w2");
    assert_eq!(listed["kind"], "List");
    let all = k.ok(&["get", "all", "-n", "default"]);
    assert!(all.contains("widget.example.com/w1"), "the 'all' category: {all}");
    // Bad names are refused with their cause.
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: Bad_Name, namespace: default}\n"),
    );
    assert!(err.contains("metadata.name: Invalid value: \"Bad_Name\""), "{err}");
    // RBAC on custom resources, through the aggregated roles charts rely on: a ClusterRole
    // labelled aggregate-to-view extends `view`.
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: widgets-view\n  labels: {rbac.authorization.k8s.io/aggregate-to-view: \"true\"}\nrules:\n- {apiGroups: [example.com], resources: [widgets], verbs: [get, list, watch]}\n"),
    );
    k.ok(&[
        "create",
        "rolebinding",
        "bob-view",
        "--clusterrole=view",
        "--user=bob",
        "-n",
        "default",
    ]);
    let bob = Kubectl::new(33, &server.cert_kubeconfig("bob.kubeconfig", "bob", &[]));
    wait_for("view aggregating widgets", || {
        bob.run(&["get", "widgets", "-n", "default"], None).status.success()
    });
    let err = bob.fails(&["delete", "widget", "w1", "-n", "default"]);
    assert!(
        err.contains("Forbidden") && err.contains("widgets.example.com \"w1\" is forbidden"),
        "{err}"
    );

    // kubectl 1.27 too.
    let old = server.kubectl(27);
    assert!(old.ok(&["get", "wg", "-n", "default"]).contains("w2"));

    // Garbage collection across custom and built-in kinds: a ConfigMap owned by a Widget,
    // a Widget owned by a ConfigMap; and a namespace's deletion deleting its Widgets.
    let uid = |kind: &str, name: &str| {
        json(&k, &["get", kind, name, "-n", "default", "-o", "json"])["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let w2 = uid("widget", "w2");
    k.ok_stdin(&["apply", "-f", "-"], Some(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned-by-widget\n  namespace: default\n  ownerReferences:\n  - {{apiVersion: example.com/v1, kind: Widget, name: w2, uid: {w2}}}\n"
    )));
    k.ok(&["create", "configmap", "owner", "-n", "default"]);
    let owner = uid("configmap", "owner");
    k.ok_stdin(&["apply", "-f", "-"], Some(&format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: owned-by-cm\n  namespace: default\n  ownerReferences:\n  - {{apiVersion: v1, kind: ConfigMap, name: owner, uid: {owner}}}\n"
    )));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        k.run(&["get", "configmap", "owned-by-widget", "-n", "default"], None).status.success(),
        "kept while its owner lives"
    );
    k.ok(&["delete", "widget", "w2", "-n", "default"]);
    k.ok(&["delete", "configmap", "owner", "-n", "default"]);
    let gone = |kind: &str, name: &str| {
        let out = k.run(&["get", kind, name, "-n", "default"], None);
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
    };
    wait_for_long("the Widget's ConfigMap collected", || gone("configmap", "owned-by-widget"));
    wait_for_long("the ConfigMap's Widget collected", || gone("widget", "owned-by-cm"));
    k.ok(&["create", "namespace", "doomed"]);
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w3, namespace: doomed}\n"),
    );
    k.ok(&["delete", "namespace", "doomed", "--timeout=60s"]);
    assert!(k.fails(&["get", "namespace", "doomed"]).contains("NotFound"));

    // A deprecated version warns on every request.
    let old_things = CRD
        .replace("name: widgets.example.com", "name: oldthings.example.com")
        .replace("plural: widgets", "plural: oldthings")
        .replace("singular: widget", "singular: oldthing")
        .replace("kind: Widget", "kind: OldThing")
        .replace("shortNames: [wg]", "shortNames: [ot]")
        .replace("  - name: v1\n    served: true\n", "  - name: v1alpha1\n    deprecated: true\n    deprecationWarning: oldthings are going away\n    served: true\n");
    k.ok_stdin(&["apply", "-f", "-"], Some(&old_things));
    k.ok(&["wait", "--for=condition=Established", "crd/oldthings.example.com", "--timeout=20s"]);
    // (v1beta1 is the preferred version: the deprecated one is asked for by name.)
    let deprecated = ["get", "oldthings.v1alpha1.example.com"];
    wait_for("oldthings served", || k.run(&deprecated, None).status.success());
    let out = k.run(&deprecated, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Warning: oldthings are going away"), "{stderr}");

    // A bad CRD: 422 with the causes.
    let bad = CRD
        .replace("name: widgets.example.com", "name: gadgets.example.com")
        .replace("storage: true", "storage: false");
    let err = k.fails_stdin(&["apply", "-f", "-"], Some(&bad));
    assert!(err.contains("metadata.name: Invalid value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group"), "{err}");
    assert!(err.contains("must have exactly one version marked as storage version"), "{err}");

    // A schema that is not structural.
    let unstructural = CRD
        .replace("name: widgets.example.com", "name: things.example.com")
        .replace("plural: widgets", "plural: things")
        .replace("singular: widget", "singular: thing")
        .replace("kind: Widget", "kind: Thing")
        .replace("shortNames: [wg]", "shortNames: [th]")
        .replace("size: {type: integer, minimum: 0}", "size: {minimum: 0}");
    let err = k.fails_stdin(&["apply", "-f", "-"], Some(&unstructural));
    assert!(err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value: must not be empty for specified object fields"), "{err}");

    // Names another CRD of the group accepted are not accepted; the CRD is not served.
    let clash = CRD
        .replace("name: widgets.example.com", "name: gizmos.example.com")
        .replace("plural: widgets", "plural: gizmos")
        .replace("singular: widget", "singular: gizmo")
        .replace("kind: Widget", "kind: Gizmo");
    k.ok_stdin(&["apply", "-f", "-"], Some(&clash));
    wait_for("the short-name conflict", || {
        let c = json(&k, &["get", "crd", "gizmos.example.com", "-o", "json"]);
        c["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| c["type"] == "NamesAccepted" && c["reason"] == "ShortNamesConflict")
        })
    });
    let err = k.fails(&["get", "gizmos.example.com"]);
    assert!(err.contains("the server doesn't have a resource type"), "{err}");

    // Deleting the CRD deletes its objects, then the CRD; the resource leaves discovery.
    k.ok(&["delete", "crd", "widgets.example.com", "--timeout=30s"]);
    let err = k.fails(&["get", "crd", "widgets.example.com"]);
    assert!(err.contains("NotFound"), "{err}");
    wait_for("widgets out of discovery", || {
        !k.ok(&["api-resources", "--api-group=example.com"]).contains("widgets")
    });
    // The names it held are free now: the other CRD of the group gets them.
    k.ok(&["wait", "--for=condition=Established", "crd/gizmos.example.com", "--timeout=20s"]);
    k.ok(&["delete", "crd", "gizmos.example.com", "--timeout=30s"]);
    // Re-created, it starts empty.
    k.ok_stdin(&["apply", "-f", "-"], Some(CRD));
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s"]);
    wait_for("widgets served again", || k.run(&["get", "widgets", "-A"], None).status.success());
    let listed = json(&k, &["get", "widgets", "-A", "-o", "json"]);
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(0), "{listed}");
}

const GADGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    selectableFields:
    - jsonPath: .spec.color
    - jsonPath: .spec.size
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              color: {type: string}
              size: {type: integer}
"#;

/// The CRD's spec defaults (singular, listKind, conversion None), field selectors on its
/// `selectableFields` for list and watch, and creates refused while it is terminating.
#[test]
fn selectable_fields_spec_defaults_and_a_terminating_crd() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    k.ok_stdin(&["apply", "-f", "-"], Some(GADGETS));
    k.ok(&["wait", "--for=condition=Established", "crd/gadgets.example.com", "--timeout=20s"]);
    let crd = json(&k, &["get", "crd", "gadgets.example.com", "-o", "json"]);
    assert_eq!(crd["spec"]["names"]["singular"], "gadget", "{crd}");
    assert_eq!(crd["spec"]["names"]["listKind"], "GadgetList");
    assert_eq!(crd["spec"]["conversion"], serde_json::json!({"strategy": "None"}));
    wait_for("gadgets in discovery", || {
        k.ok(&["api-resources", "--api-group=example.com"]).contains("gadgets")
    });

    for (name, color, size) in [("g1", "red", 1), ("g2", "blue", 2), ("g3", "blue", 3)] {
        k.ok_stdin(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {{name: {name}, namespace: default}}\nspec: {{color: {color}, size: {size}}}\n"
            )),
        );
    }
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g4, namespace: default}\nspec: {}\n"),
    );
    let names = |sel: &str| -> Vec<String> {
        let list = json(&k, &["get", "gadgets", "--field-selector", sel, "-o", "json"]);
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names("spec.color=blue"), ["g2", "g3"]);
    assert_eq!(names("spec.color!=blue"), ["g1", "g4"]);
    assert_eq!(names("spec.color=blue,spec.size=3"), ["g3"]);
    assert_eq!(names("spec.color="), ["g4"], "an unset field selects as empty");
    assert_eq!(names("metadata.name=g1"), ["g1"]);
    let err = k.fails(&["get", "gadgets", "--field-selector", "spec.shape=round"]);
    assert!(err.contains("field label not supported: spec.shape"), "{err}");

    // A watch with the selector sees only the matching changes.
    let list = json(&k, &["get", "--raw", "/apis/example.com/v1/namespaces/default/gadgets"]);
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    k.ok(&["patch", "gadget", "g1", "--type=merge", "-p", r#"{"spec":{"size":7}}"#]);
    k.ok(&["patch", "gadget", "g2", "--type=merge", "-p", r#"{"spec":{"size":5}}"#]);
    let events = k.ok(&[
        "get",
        "--raw",
        &format!(
            "/apis/example.com/v1/namespaces/default/gadgets?watch=1&resourceVersion={rv}&fieldSelector=spec.color%3Dblue&timeoutSeconds=1"
        ),
    ]);
    let seen: Vec<(String, String)> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["object"]["metadata"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(seen, [("MODIFIED".to_string(), "g2".to_string())], "{events}");

    // Terminating: an object whose finalizer holds the CRD's deletion.
    k.ok(&[
        "patch",
        "gadget",
        "g1",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ]);
    k.ok(&["delete", "crd", "gadgets.example.com", "--wait=false"]);
    wait_for("the CRD terminating", || {
        let crd = json(&k, &["get", "crd", "gadgets.example.com", "-o", "json"]);
        crd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Terminating" && c["status"] == "True")
    });
    let err = k.fails_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g9, namespace: default}\nspec: {}\n"),
    );
    assert!(
        err.contains("create not allowed while custom resource definition is terminating"),
        "{err}"
    );
    k.ok(&["patch", "gadget", "g1", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    wait_for("the CRD gone", || {
        let out = k.run(&["get", "crd", "gadgets.example.com"], None);
        String::from_utf8_lossy(&out.stderr).contains("NotFound")
    });
}

const ROUTES: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: routes.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: routes, kind: Route}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              rules:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    weight: {type: integer}
              tags:
                type: array
                x-kubernetes-list-type: set
                items: {type: string}
              hosts:
                type: array
                items: {type: string}
              selector:
                type: object
                x-kubernetes-map-type: atomic
                additionalProperties: {type: string}
"#;

fn route(spec: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {{name: r, namespace: default}}\nspec: {spec}\n"
    )
}

/// Server-side apply merges a custom object by its CRD's schema: list-map items by key
/// and sets by value are owned each by the manager that applied them, atomic lists and
/// maps as a whole, and a change to another manager's field is a conflict.
#[test]
fn server_side_apply_merges_custom_objects_by_their_schema() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    k.ok_stdin(&["apply", "-f", "-"], Some(ROUTES));
    k.ok(&["wait", "--for=condition=Established", "crd/routes.example.com", "--timeout=20s"]);
    wait_for("routes in discovery", || {
        k.ok(&["api-resources", "--api-group=example.com"]).contains("routes")
    });
    let apply = |manager: &str, spec: &str| {
        k.run(
            &["apply", "--server-side", "--field-manager", manager, "-f", "-"],
            Some(&route(spec)),
        )
    };
    let ok = |manager: &str, spec: &str| {
        let out = apply(manager, spec);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    ok("a", "{rules: [{name: one, weight: 1}], tags: [t1], hosts: [h1], selector: {app: a}}");
    ok("b", "{rules: [{name: two, weight: 2}], tags: [t2]}");
    let r = json(&k, &["get", "route", "r", "-o", "json"]);
    assert_eq!(
        r["spec"]["rules"],
        serde_json::json!([{"name": "one", "weight": 1}, {"name": "two", "weight": 2}]),
        "list-map items merged by key: {r}"
    );
    assert_eq!(r["spec"]["tags"], serde_json::json!(["t1", "t2"]), "set items merged");
    let r = json(&k, &["get", "route", "r", "-o", "json", "--show-managed-fields"]);
    let managed = r["metadata"]["managedFields"].as_array().unwrap();
    let b = managed.iter().find(|m| m["manager"] == "b").unwrap();
    let fields = b["fieldsV1"].to_string();
    assert!(
        fields.contains(r#"k:{\"name\":\"two\"}"#) && fields.contains(r#"v:\"t2\""#),
        "{fields}"
    );
    // Another manager's item: a conflict, unless forced.
    let out = apply("b", "{rules: [{name: one, weight: 5}, {name: two, weight: 2}], tags: [t2]}");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conflict") && err.contains(r#".spec.rules[name="one"].weight"#), "{err}");
    // Dropping an item from one's own apply removes only that manager's item.
    ok("b", "{tags: [t2]}");
    let r = json(&k, &["get", "route", "r", "-o", "json"]);
    assert_eq!(r["spec"]["rules"], serde_json::json!([{"name": "one", "weight": 1}]), "{r}");
    // Atomic list and map: replaced whole by the manager who forces them.
    let out = apply("b", "{tags: [t2], hosts: [h2]}");
    assert!(!out.status.success(), "the atomic list belongs to a");
    let out = k.run(
        &["apply", "--server-side", "--force-conflicts", "--field-manager", "b", "-f", "-"],
        Some(&route("{tags: [t2], hosts: [h2], selector: {tier: b}}")),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = json(&k, &["get", "route", "r", "-o", "json"]);
    assert_eq!(r["spec"]["hosts"], serde_json::json!(["h2"]));
    assert_eq!(
        r["spec"]["selector"],
        serde_json::json!({"tier": "b"}),
        "atomic map replaced whole"
    );
}

const POLICIES: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: policies.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: policies, singular: policy, kind: Policy}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer}}}
          status: {type: object, properties: {replicas: {type: integer}, selector: {type: string}}}
"#;

/// A HorizontalPodAutoscaler scales a custom resource through its scale subresource
/// (the target's plural found by discovery, as upstream's REST mapper): below its
/// minimum, the object is raised to it without metrics. Its plural is not the kind's
/// lower case plus "s".
#[test]
fn an_hpa_scales_a_custom_resource() {
    use skiff_control_plane::server::ServerConfig;
    use skiff_controllers::ControllerConfig;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        controllers: Some(ControllerConfig {
            hpa_sync_period: Duration::from_secs(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let server = TestServer::start_with(dir, config);
    let k = server.kubectl(33);
    k.ok_stdin(&["apply", "-f", "-"], Some(POLICIES));
    k.ok(&["wait", "--for=condition=Established", "crd/policies.example.com", "--timeout=20s"]);
    wait_for("policies in discovery", || {
        k.ok(&["api-resources", "--api-group=example.com"]).contains("policies")
    });
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Policy\nmetadata: {name: w1, namespace: default}\nspec: {replicas: 1}\n"),
    );
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: w1, namespace: default}\nspec:\n  scaleTargetRef: {apiVersion: example.com/v1, kind: Policy, name: w1}\n  minReplicas: 3\n  maxReplicas: 5\n  metrics:\n  - type: Resource\n    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}\n",
        ),
    );
    wait_for("the HPA to scale the policy", || {
        json(&k, &["get", "policy", "w1", "-o", "json"])["spec"]["replicas"] == 3
    });
    let scale = json(&k, &["get", "policy", "w1", "--subresource=scale", "-o", "json"]);
    assert_eq!(scale["spec"]["replicas"], 3, "{scale}");
    let events = k.ok(&["get", "events", "--field-selector", "involvedObject.name=w1"]);
    assert!(events.contains("SuccessfulRescale") && events.contains("New size: 3"), "{events}");
}
