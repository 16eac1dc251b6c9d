//! Custom resources in the OpenAPI documents, end to end with real kubectl: once a CRD is
//! Established, `/openapi/v3` lists its group-version (with a hash) and serves its document,
//! `/openapi/v2` has its kinds, so that `kubectl explain` (1.33 over v3, 1.27 over v3 and
//! over the v2 protobuf) shows the CRD's field descriptions; once it is deleted, they are
//! gone from both and `kubectl explain` fails.

use std::time::{Duration, Instant};

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
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.replicas}
    schema:
      openAPIV3Schema:
        type: object
        description: A Widget is a thing the test factory makes.
        properties:
          spec:
            type: object
            description: WidgetSpec says how the widget is to be built.
            required: [size]
            properties:
              size:
                type: integer
                minimum: 0
                description: The number of cogs in the widget.
              color:
                type: string
                nullable: true
                description: The paint on the widget's shell.
              port:
                x-kubernetes-int-or-string: true
                description: Where the widget listens.
          status:
            type: object
            properties:
              replicas: {type: integer, description: How many widgets there are.}
"#;

const V3_PATH: &str = "apis/example.com/v1";

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out ({timeout:?}) waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn raw(k: &Kubectl, path: &str) -> Value {
    let out = k.ok(&["get", "--raw", path]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `serverRelativeURL` `/openapi/v3` lists for the CRD's group-version.
fn v3_url(k: &Kubectl) -> Option<String> {
    raw(k, "/openapi/v3")["paths"][V3_PATH]["serverRelativeURL"].as_str().map(str::to_string)
}

fn v2_has_widget(k: &Kubectl) -> bool {
    raw(k, "/openapi/v2")["definitions"].get("com.example.v1.Widget").is_some()
}

#[test]
fn crd_schemas_are_published_in_openapi_v3_and_v2_for_kubectl_explain() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    let builtin_root = raw(&k, "/openapi/v3");
    assert!(builtin_root["paths"].get(V3_PATH).is_none(), "{builtin_root}");
    k.ok_stdin(&["apply", "-f", "-"], Some(CRD));
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s"]);

    // Published within two seconds of being Established.
    wait_for("the group-version in /openapi/v3", Duration::from_secs(2), || v3_url(&k).is_some());
    wait_for("Widget in /openapi/v2", Duration::from_secs(2), || v2_has_widget(&k));
    let url = v3_url(&k).unwrap();
    let (path, hash) = url.split_once("?hash=").expect("a hash in the URL");
    assert_eq!(path, format!("/openapi/v3/{V3_PATH}"));
    assert_eq!(hash.len(), 128, "{url}");
    // The built-in group-versions are listed with the same hashes as before.
    let root = raw(&k, "/openapi/v3");
    assert_eq!(root["paths"]["apis/apps/v1"], builtin_root["paths"]["apis/apps/v1"]);

    let doc = raw(&k, &url);
    let schemas = &doc["components"]["schemas"];
    let widget = &schemas["com.example.v1.Widget"];
    assert_eq!(
        widget["x-kubernetes-group-version-kind"],
        serde_json::json!([{"group": "example.com", "kind": "Widget", "version": "v1"}])
    );
    assert_eq!(
        widget["properties"]["metadata"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(widget["properties"]["apiVersion"]["type"], "string");
    assert_eq!(
        widget["properties"]["spec"]["properties"]["size"]["description"],
        "The number of cogs in the widget."
    );
    assert_eq!(widget["properties"]["spec"]["properties"]["color"]["nullable"], true);
    assert!(schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"].is_object());
    assert_eq!(
        schemas["com.example.v1.WidgetList"]["properties"]["items"]["items"]["$ref"],
        "#/components/schemas/com.example.v1.Widget"
    );
    let item = "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}";
    assert_eq!(doc["paths"][item]["patch"]["operationId"], "patchExampleComV1NamespacedWidget");
    assert_eq!(
        doc["paths"][format!("{item}/status")]["get"]["operationId"],
        "readExampleComV1NamespacedWidgetStatus"
    );
    assert_eq!(
        doc["paths"][format!("{item}/scale")]["put"]["x-kubernetes-group-version-kind"]["kind"],
        "Scale"
    );
    assert!(doc["paths"]["/apis/example.com/v1/widgets"]["get"].is_object());

    // v2: without what v2 cannot say (nullable: untyped).
    let v2 = raw(&k, "/openapi/v2");
    let spec = &v2["definitions"]["com.example.v1.Widget"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["color"],
        serde_json::json!({"description": "The paint on the widget's shell."})
    );
    assert_eq!(spec["properties"]["size"]["type"], "integer");
    assert!(v2["paths"][item]["patch"].is_object());
    assert!(v2["definitions"]["io.k8s.api.apps.v1.Deployment"].is_object(), "built-ins kept");

    // kubectl explain over v3 (1.33).
    let explain = k.ok(&["explain", "widgets.spec"]);
    for text in [
        "WidgetSpec says how the widget is to be built.",
        "The number of cogs in the widget.",
        "The paint on the widget's shell.",
        "size\t<integer> -required-",
    ] {
        assert!(explain.contains(text), "{text:?} missing from:\n{explain}");
    }
    let explain = k.ok(&["explain", "widgets"]);
    assert!(explain.contains("A Widget is a thing the test factory makes."), "{explain}");
    assert!(explain.contains("Standard object's metadata."), "{explain}");
    // kubectl 1.27, over v3 and over the v2 protobuf.
    let old = server.kubectl(27);
    let explain = old.ok(&["explain", "widgets"]);
    assert!(explain.contains("A Widget is a thing the test factory makes."), "{explain}");
    let explain = old.ok(&["explain", "widgets", "--output=plaintext-openapiv2"]);
    assert!(explain.contains("A Widget is a thing the test factory makes."), "{explain}");
    assert!(explain.contains("WidgetSpec says how the widget is to be built."), "{explain}");
    let explain = old.ok(&["explain", "widgets.spec", "--output=plaintext-openapiv2"]);
    assert!(explain.contains("The number of cogs in the widget."), "{explain}");
    assert!(explain.contains("Where the widget listens."), "{explain}");

    // Objects are still written as before (server-side field validation).
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {size: 3, port: http}\n"),
    );
    // Applied again: kubectl finds no strategic merge patch among the PATCH operation's
    // media types and sends a merge patch (a strategic one would be refused with 415).
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {size: 5, port: 8080}\n"),
    );
    let w1 = raw(&k, "/apis/example.com/v1/namespaces/default/widgets/w1");
    assert_eq!((w1["spec"]["size"].clone(), w1["spec"]["port"].clone()), (5.into(), 8080.into()));
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2, namespace: default}\nspec: {size: 1, shape: round}\n"),
    );
    assert!(err.contains("unknown field \"spec.shape\""), "{err}");

    // Deleted: gone from both documents, and from kubectl explain.
    k.ok(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    wait_for("the group-version gone from /openapi/v3", Duration::from_secs(10), || {
        v3_url(&k).is_none()
    });
    assert!(!v2_has_widget(&k), "Widget still in /openapi/v2");
    let out = k.run(&["get", "--raw", &format!("/openapi/v3/{V3_PATH}")], None);
    assert!(!out.status.success(), "the group-version document is still served");
    let fresh = server.kubectl(33);
    let err = fresh.fails(&["explain", "widgets"]);
    assert!(err.contains("widgets"), "{err}");
    // kubectl with the discovery it cached while the CRD was there.
    k.fails(&["explain", "widgets"]);
    old.fails(&["explain", "widgets", "--output=plaintext-openapiv2"]);
}
