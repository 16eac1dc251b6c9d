//! Admission, audit and encryption at rest against a real skiff-server with real kubectl:
//! a real HTTPS admission webhook on loopback denies one pod and mutates another,
//! failurePolicy Ignore vs Fail with the webhook down, the audit log's lines, and Secrets
//! encrypted in the store yet readable through kubectl.

use std::path::Path;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};
use skiff_apiserver::audit::{AuditConfig, Level};
use skiff_control_plane::server::ServerConfig;
use skiff_store::Store;
use skiff_tests::TestServer;
use skiff_tests::webhook::{Webhook, certs};

const KUBECTL: u32 = 33;

/// `/validate` denies pods named `denied`; `/mutate` labels pods named `mutated`.
fn review_response(path: &str, review: &Value) -> Value {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let name = request["object"]["metadata"]["name"].as_str().unwrap_or_default();
    let response = match (path, name) {
        ("/validate", "denied") => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "message": "pods named denied are not welcome"},
        }),
        ("/mutate", "mutated") => {
            let patch =
                json!([{"op": "add", "path": "/metadata/labels", "value": {"webhook": "mutated"}}]);
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })
        }
        _ => json!({"uid": uid, "allowed": true}),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn webhook_configs(url_base: &str, ca_pem: &str, policy: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: deny-pods
webhooks:
- name: deny.skiff.test
  clientConfig:
    url: "{url_base}/validate"
    caBundle: "{ca}"
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
  failurePolicy: {policy}
  sideEffects: None
  timeoutSeconds: 5
  admissionReviewVersions: ["v1"]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: label-pods
webhooks:
- name: label.skiff.test
  clientConfig:
    url: "{url_base}/mutate"
    caBundle: "{ca}"
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system"]
  failurePolicy: {policy}
  sideEffects: None
  timeoutSeconds: 5
  admissionReviewVersions: ["v1"]
"#
    )
}

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
    )
}

#[test]
fn webhook_denies_one_pod_and_mutates_another() {
    let webhook = Webhook::start(review_response);
    let server = TestServer::start();
    let k = server.kubectl(KUBECTL);
    let configs = webhook_configs(&format!("https://{}", webhook.addr), &webhook.ca_pem, "Fail");
    k.ok_stdin(&["apply", "-f", "-"], Some(&configs));
    let listed = k.ok(&[
        "get",
        "validatingwebhookconfigurations,mutatingwebhookconfigurations",
        "-o",
        "name",
    ]);
    assert!(listed.contains("deny-pods") && listed.contains("label-pods"), "{listed}");

    let out = k.run(&["create", "-f", "-"], Some(&pod("denied")));
    assert!(!out.status.success(), "the denied pod was created");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "admission webhook \"deny.skiff.test\" denied the request: pods named denied are not welcome"
        ),
        "{stderr}"
    );
    let missing = k.fails(&["get", "pod", "denied"]);
    assert!(missing.contains("NotFound") || missing.contains("not found"), "{missing}");

    k.ok_stdin(&["create", "-f", "-"], Some(&pod("mutated")));
    let label = k.ok(&["get", "pod", "mutated", "-o", "jsonpath={.metadata.labels.webhook}"]);
    assert_eq!(label, "mutated");
    // Other pods pass untouched; the ServiceAccount plugin mounted the token volume.
    k.ok_stdin(&["create", "-f", "-"], Some(&pod("plain")));
    let labels = k.ok(&["get", "pod", "plain", "-o", "jsonpath={.metadata.labels}"]);
    assert!(!labels.contains("webhook"), "{labels}");
    let vol = k.ok(&["get", "pod", "plain", "-o", "jsonpath={.spec.volumes[0].name}"]);
    assert!(vol.starts_with("kube-api-access-"), "{vol}");
    // A dry run reaches the webhooks too (sideEffects None).
    let out = k.run(&["create", "--dry-run=server", "-f", "-"], Some(&pod("denied")));
    assert!(!out.status.success(), "a dry-run create of the denied pod passed");
}

#[test]
fn failure_policy_decides_when_the_webhook_is_down() {
    // A port nothing listens on.
    let closed =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let (ca_pem, _, _) = certs();
    let server = TestServer::start();
    let k = server.kubectl(KUBECTL);
    let url = format!("https://{closed}");
    k.ok_stdin(&["apply", "-f", "-"], Some(&webhook_configs(&url, &ca_pem, "Ignore")));
    k.ok_stdin(&["create", "-f", "-"], Some(&pod("ignored")));
    k.ok(&["get", "pod", "ignored"]);

    k.ok_stdin(&["apply", "-f", "-"], Some(&webhook_configs(&url, &ca_pem, "Fail")));
    let out = k.run(&["create", "-f", "-"], Some(&pod("refused")));
    assert!(!out.status.success(), "a pod was created with a failing webhook under Fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed calling webhook \"label.skiff.test\""), "{stderr}");
    // Webhook configurations are exempt, so a broken webhook can be removed.
    k.ok(&["delete", "mutatingwebhookconfiguration", "label-pods"]);
    k.ok(&["delete", "validatingwebhookconfiguration", "deny-pods"]);
    k.ok_stdin(&["create", "-f", "-"], Some(&pod("refused")));
}

#[test]
fn audit_log_records_requests_as_json_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("audit").join("audit.log");
    let mut config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Default::default()
    };
    config.api.audit = AuditConfig { path: Some(log.clone()), level: Level::RequestResponse };
    let server = TestServer::start_with(tempfile::tempdir().expect("temp dir"), config);
    let k = server.kubectl(KUBECTL);
    k.ok(&["create", "configmap", "audited", "--from-literal=a=b"]);
    k.ok(&["get", "configmap", "audited"]);
    k.fails(&["get", "configmap", "nope"]);
    drop(server);

    let text = std::fs::read_to_string(&log).expect("audit log");
    let events: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).expect("each line is JSON")).collect();
    for e in &events {
        assert_eq!(e["kind"], "Event");
        assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(e["level"], "RequestResponse");
        assert!(e["auditID"].as_str().is_some_and(|s| !s.is_empty()));
        assert!(e["requestReceivedTimestamp"].is_string() && e["stageTimestamp"].is_string());
        assert!(e["user"]["username"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
    }
    let create = events
        .iter()
        .find(|e| {
            e["verb"] == "create"
                && e["objectRef"]["resource"] == "configmaps"
                && e["objectRef"]["namespace"] == "default"
        })
        .expect("the create is logged");
    assert_eq!(create["stage"], "ResponseComplete");
    assert_eq!(
        create["requestURI"],
        "/api/v1/namespaces/default/configmaps?fieldManager=kubectl-create&fieldValidation=Strict"
    );
    assert_eq!(create["objectRef"]["namespace"], "default");
    assert_eq!(create["objectRef"]["apiVersion"], "v1");
    assert_eq!(create["responseStatus"]["code"], 201);
    assert_eq!(create["requestObject"]["data"]["a"], "b");
    assert_eq!(create["responseObject"]["metadata"]["name"], "audited");
    assert!(
        create["sourceIPs"].as_array().is_some_and(|a| a.contains(&json!("127.0.0.1"))),
        "{create}"
    );
    assert!(create["userAgent"].as_str().is_some_and(|ua| ua.starts_with("kubectl")));
    let missing = events
        .iter()
        .find(|e| e["verb"] == "get" && e["objectRef"]["name"] == "nope")
        .expect("the failed get is logged");
    assert_eq!(missing["responseStatus"]["code"], 404);
    assert_eq!(missing["responseStatus"]["reason"], "NotFound");
    assert_eq!(missing["responseStatus"]["status"], "Failure");
}

/// The stored bytes of `key` in a stopped server's embedded store (the store is released
/// shortly after the server stops: its writer thread ends when the last handle is gone).
fn raw_value(data_dir: &Path, key: &str) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let store = loop {
        match skiff_store::embedded::EmbeddedStore::open(&data_dir.join("store")) {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("opening the stopped server's store: {e:?}"),
        }
    };
    let kv = rt.block_on(store.get(key)).expect("get").expect("key stored");
    let value = kv.value.to_vec();
    rt.block_on(store.close()).expect("close the store");
    value
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn secrets_are_encrypted_at_rest_and_still_readable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, base64::engine::general_purpose::STANDARD.encode([7u8; 32]))
        .expect("key");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let plain_secret = "written-before-encryption";
    let sealed_secret = "hunter2-at-rest";
    // A Secret stored in plaintext before encryption was configured.
    {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = skiff_store::embedded::EmbeddedStore::open(&data.join("store")).expect("store");
        let old = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "old", "namespace": "default",
                         "uid": "6f0c1d2e-0000-4000-8000-000000000001",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "data": {"p": b64(plain_secret)},
        });
        rt.block_on(skiff_store::StoreExt::create(
            &store,
            "/registry/core/secrets/default/old",
            Bytes::from(old.to_string()),
        ))
        .expect("create");
        rt.block_on(store.close()).expect("close");
    }
    let config = ServerConfig {
        data_dir: data.clone(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        encryption_key_file: Some(key_file.clone()),
        ..Default::default()
    };
    {
        let server = TestServer::start_with(tempfile::tempdir().expect("temp dir"), config);
        let k = server.kubectl(KUBECTL);
        k.ok(&["create", "secret", "generic", "new", &format!("--from-literal=p={sealed_secret}")]);
        assert_eq!(k.ok(&["get", "secret", "new", "-o", "jsonpath={.data.p}"]), b64(sealed_secret));
        // Written in plaintext before the key was configured: still readable.
        assert_eq!(k.ok(&["get", "secret", "old", "-o", "jsonpath={.data.p}"]), b64(plain_secret));
        let listed = k.ok(&["get", "secrets", "-o", "name"]);
        assert!(listed.contains("secret/new") && listed.contains("secret/old"), "{listed}");
        // Other resources stay plaintext.
        k.ok(&["create", "configmap", "open", "--from-literal=v=visible-value"]);
    }
    let sealed = raw_value(&data, "/registry/core/secrets/default/new");
    assert!(sealed.starts_with(b"k8s:enc:aesgcm:v1:key1:"), "{}", String::from_utf8_lossy(&sealed));
    assert!(
        !contains(&sealed, sealed_secret) && !contains(&sealed, &b64(sealed_secret)),
        "plaintext in the store"
    );
    let old = raw_value(&data, "/registry/core/secrets/default/old");
    assert!(!old.starts_with(b"k8s:enc:"), "the old secret was rewritten");
    let cm = raw_value(&data, "/registry/core/configmaps/default/open");
    assert!(contains(&cm, "visible-value"));
}

#[test]
fn webhooks_apply_to_custom_resources() {
    let webhook = Webhook::start(review_response);
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(KUBECTL);
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: widgets, kind: Widget}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n",
        ),
    );
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s"]);
    // The pod configurations, aimed at the custom resource.
    let configs = webhook_configs(&format!("https://{}", webhook.addr), &webhook.ca_pem, "Fail")
        .replace("apiGroups: [\"\"]", "apiGroups: [\"example.com\"]")
        .replace("resources: [\"pods\"]", "resources: [\"widgets\"]");
    k.ok_stdin(&["apply", "-f", "-"], Some(&configs));
    let widget = |name: &str| {
        format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\n"
        )
    };
    let mut served = false;
    for _ in 0..100 {
        if k.run(&["get", "widgets"], None).status.success() {
            served = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(served, "widgets served");
    let err = k.run(&["create", "-f", "-"], Some(&widget("denied")));
    assert!(!err.status.success(), "the denied widget was created");
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        stderr.contains("admission webhook \"deny.skiff.test\" denied the request"),
        "{stderr}"
    );
    k.ok_stdin(&["create", "-f", "-"], Some(&widget("mutated")));
    let label = k.ok(&["get", "widget", "mutated", "-o", "jsonpath={.metadata.labels.webhook}"]);
    assert_eq!(label, "mutated");
}
