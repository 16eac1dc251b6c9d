//! Conversion webhooks of CustomResourceDefinitions with real kubectl: a CRD whose v1
//! (stored) and v2 differ in shape, converted by a real HTTPS webhook on loopback
//! (ConversionReview v1, trusted by the CRD's caBundle). Writes at v2 are stored at v1,
//! reads, lists (one review for the page) and watches at v2 are converted, metadata other
//! than labels and annotations stays the apiserver's, and a failing webhook fails the
//! request with upstream's 500.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use skiff_tests::TestServer;
use skiff_tests::webhook::Webhook;

/// Reviews answered, and objects in them.
static REVIEWS: AtomicUsize = AtomicUsize::new(0);
static OBJECTS: AtomicUsize = AtomicUsize::new(0);

/// v1 `spec.size` <-> v2 `spec.dimensions.size`; a label saying where the object went;
/// an attempt to change `metadata.generation` (the apiserver must keep its own). Objects
/// named `bad` fail.
fn convert(_path: &str, review: &Value) -> Value {
    REVIEWS.fetch_add(1, Ordering::SeqCst);
    let request = &review["request"];
    let desired = request["desiredAPIVersion"].as_str().unwrap_or_default().to_string();
    let mut converted = Vec::new();
    let mut failure = None;
    for obj in request["objects"].as_array().into_iter().flatten() {
        OBJECTS.fetch_add(1, Ordering::SeqCst);
        if obj["metadata"]["name"] == "bad" {
            failure = Some("objects named bad cannot be converted");
        }
        let mut out = obj.clone();
        let spec = out["spec"].as_object_mut().cloned().unwrap_or_default();
        out["spec"] = match desired.as_str() {
            "example.com/v2" => {
                json!({"dimensions": {"size": spec.get("size").cloned().unwrap_or(json!(0))}})
            }
            _ => {
                json!({"size": spec.get("dimensions").and_then(|d| d.get("size")).cloned().unwrap_or(json!(0))})
            }
        };
        out["apiVersion"] = json!(desired);
        out["metadata"]["labels"]["converted-to"] = json!(desired.replace('/', "."));
        out["metadata"]["generation"] = json!(99);
        converted.push(out);
    }
    let result = match failure {
        Some(m) => json!({"status": "Failure", "message": m}),
        None => json!({"status": "Success"}),
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": request["uid"], "convertedObjects": converted, "result": result},
    })
}

fn crd(url: &str, ca: &str) -> String {
    format!(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: boxes.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: boxes, singular: box, kind: Box}}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig:
        url: "{url}/convert"
        caBundle: "{ca}"
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {{type: object, properties: {{size: {{type: integer}}}}}}
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              dimensions: {{type: object, properties: {{size: {{type: integer}}}}}}
"#
    )
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    skiff_tests::wait_until(what, Duration::from_secs(20), f);
}

#[test]
fn a_conversion_webhook_converts_between_served_versions() {
    let webhook = Webhook::start(convert);
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    let json = |args: &[&str]| -> Value { serde_json::from_str(&k.ok(args)).unwrap() };
    k.ok_stdin(&["apply", "-f", "-"], Some(&crd(&webhook.url(), &webhook.ca_bundle())));
    k.ok(&["wait", "--for=condition=Established", "crd/boxes.example.com", "--timeout=20s"]);
    wait_for("boxes in discovery", || {
        k.ok(&["api-resources", "--api-group=example.com"]).contains("boxes")
    });

    // Written at v2: stored at v1 (read back at v1 without a review), answered at v2.
    let created = k.ok_stdin(
        &["create", "-o", "json", "-f", "-"],
        Some("apiVersion: example.com/v2\nkind: Box\nmetadata: {name: b1, namespace: default}\nspec: {dimensions: {size: 3}}\n"),
    );
    let created: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(created["apiVersion"], "example.com/v2", "{created}");
    assert_eq!(created["spec"], json!({"dimensions": {"size": 3}}));
    let v1 = json(&["get", "--raw", "/apis/example.com/v1/namespaces/default/boxes/b1"]);
    assert_eq!(v1["apiVersion"], "example.com/v1");
    assert_eq!(v1["spec"], json!({"size": 3}), "stored at v1: {v1}");
    assert_eq!(v1["metadata"]["labels"]["converted-to"], "example.com.v1");
    assert_eq!(v1["metadata"]["generation"], 1, "metadata other than labels is the server's");

    // Read at v2.
    let v2 = json(&["get", "boxes.v2.example.com", "b1", "-o", "json"]);
    assert_eq!(v2["apiVersion"], "example.com/v2");
    assert_eq!(v2["spec"], json!({"dimensions": {"size": 3}}));
    assert_eq!(v2["metadata"]["labels"]["converted-to"], "example.com.v2");
    assert_eq!(v2["metadata"]["uid"], v1["metadata"]["uid"]);

    // A list at v2 converts its page in one review.
    for (name, size) in [("b2", 5), ("b3", 7)] {
        k.ok_stdin(
            &["create", "-f", "-"],
            Some(&format!("apiVersion: example.com/v1\nkind: Box\nmetadata: {{name: {name}, namespace: default}}\nspec: {{size: {size}}}\n")),
        );
    }
    let (reviews, objects) = (REVIEWS.load(Ordering::SeqCst), OBJECTS.load(Ordering::SeqCst));
    let list = json(&["get", "--raw", "/apis/example.com/v2/namespaces/default/boxes"]);
    let sizes: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["spec"]["dimensions"]["size"])
        .collect();
    assert_eq!(sizes, [&json!(3), &json!(5), &json!(7)], "{list}");
    assert_eq!(list["items"][0]["apiVersion"], "example.com/v2");
    assert_eq!(REVIEWS.load(Ordering::SeqCst) - reviews, 1, "one review for the list");
    assert_eq!(OBJECTS.load(Ordering::SeqCst) - objects, 3);

    // Updates at v2 work on the v2 shape and are stored at v1.
    k.ok(&[
        "patch",
        "boxes.v2.example.com",
        "b2",
        "--type=merge",
        "-p",
        r#"{"spec":{"dimensions":{"size":6}}}"#,
    ]);
    let b2 = json(&["get", "--raw", "/apis/example.com/v1/namespaces/default/boxes/b2"]);
    assert_eq!(b2["spec"], json!({"size": 6}), "{b2}");

    // A watch at v2 sees converted objects.
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let events = k.ok(&[
        "get",
        "--raw",
        &format!("/apis/example.com/v2/namespaces/default/boxes?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
    ]);
    let first: Value = serde_json::from_str(events.lines().next().unwrap_or("{}")).unwrap();
    assert_eq!(first["type"], "MODIFIED", "{events}");
    assert_eq!(first["object"]["apiVersion"], "example.com/v2");
    assert_eq!(first["object"]["spec"], json!({"dimensions": {"size": 6}}));

    // A webhook that fails: upstream's 500, with its message.
    k.ok_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Box\nmetadata: {name: bad, namespace: default}\nspec: {size: 1}\n"),
    );
    let err = k.fails(&["get", "boxes.v2.example.com", "bad"]);
    assert!(
        err.contains("conversion webhook for example.com/v2, Kind=Box failed: objects named bad cannot be converted"),
        "{err}"
    );
    let raw = k.fails(&["get", "--raw", "/apis/example.com/v2/namespaces/default/boxes/bad"]);
    assert!(raw.contains("InternalError"), "500 InternalError: {raw}");
    // At the stored version nothing needs converting.
    k.ok(&["get", "boxes.v1.example.com", "bad"]);
}
