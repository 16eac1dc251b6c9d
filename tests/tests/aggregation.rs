//! API aggregation with real kubectl: the local APIServices skiff registers for what it
//! serves itself (built-in groups and CRDs), upstream's APIService validation, and an
//! extension apiserver on this machine (skiff_tests::extension, metrics-server style)
//! registered through an APIService, a selector-less Service and a manual Endpoints at
//! one of the machine's own addresses: it becomes Available, its resources show in discovery and `kubectl get`,
//! requests reach it with the user in the request headers over the front proxy's client
//! certificate (verified against the published request-header CA), watches stream, and
//! once it is gone the APIService is unavailable (upstream's reasons) and its requests
//! answer 503; deleting the APIService takes the group out of discovery.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skiff_tests::extension::{Extension, GROUP, VERSION};
use skiff_tests::{Kubectl, TestServer};

/// Poll `check` until it gives `Some`, for at most `secs`.
fn wait_for<T>(secs: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `kubectl get apiservices` row of `name`, its columns split.
fn row(k: &Kubectl, name: &str) -> Option<Vec<String>> {
    let out = k.run(&["get", "apiservices", name, "--no-headers"], None);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().next()?;
    let cols: Vec<String> =
        line.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect();
    Some(cols)
}

fn available(k: &Kubectl, name: &str) -> Option<Value> {
    let out = k.run(&["get", "apiservice", name, "-o", "json"], None);
    let obj: Value = serde_json::from_slice(&out.stdout).ok()?;
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")
        .cloned()
}

#[test]
fn local_apiservices_list_what_skiff_serves() {
    // The controllers finalize the CRD deleted below.
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    for name in
        ["v1.", "v1.apps", "v1.apiextensions.k8s.io", "v1.apiregistration.k8s.io", "v2.autoscaling"]
    {
        let cols = wait_for(20, &format!("{name} Available"), || {
            row(&k, name).filter(|c| c.get(2).map(String::as_str) == Some("True"))
        });
        assert_eq!(cols[..3], [name, "Local", "True"], "{cols:?}");
    }
    let header = k.ok(&["get", "apiservices"]);
    let first = header.lines().next().unwrap_or_default();
    let titles: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(titles, ["NAME", "SERVICE", "AVAILABLE", "AGE"]);
    let local = available(&k, "v1.apps").expect("a condition");
    assert_eq!(local["reason"], "Local");
    let obj: Value =
        serde_json::from_str(&k.ok(&["get", "apiservice", "v1.apps", "-o", "json"])).unwrap();
    assert!(obj["spec"].get("service").is_none_or(Value::is_null), "{obj}");
    assert_eq!(obj["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"], "onstart");
    assert_eq!(obj["spec"]["groupPriorityMinimum"], 17800);
    // kubectl 1.27 lists them too.
    let old = server.kubectl(27).ok(&["get", "apiservices"]);
    assert!(
        old.lines().any(|l| l.starts_with("v1.apps ") && l.contains("Local") && l.contains("True")),
        "{old}"
    );

    // A CRD's served versions get theirs, and lose them with the CRD.
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.agg.example"},
        "spec": {"group": "agg.example", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
                {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object"}}}]}}"#;
    k.ok_stdin(&["apply", "-f", "-"], Some(crd));
    for name in ["v1.agg.example", "v1beta1.agg.example"] {
        wait_for(20, name, || row(&k, name).filter(|c| c[1] == "Local" && c[2] == "True"));
    }
    let crd_owned: Value =
        serde_json::from_str(&k.ok(&["get", "apiservice", "v1.agg.example", "-o", "json"]))
            .unwrap();
    assert_eq!(
        crd_owned["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "true"
    );
    assert_eq!(crd_owned["spec"]["groupPriorityMinimum"], 1000);
    k.ok(&["delete", "crd", "gadgets.agg.example"]);
    wait_for(20, "the CRD's APIServices to go", || {
        let out = k.ok(&["get", "apiservices", "-o", "name"]);
        (!out.contains("agg.example")).then_some(())
    });

    // Upstream's validation, with its causes.
    let bad = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.wrong.example"},
        "spec": {"group": "bad.example", "version": "v1", "groupPriorityMinimum": 0, "versionPriority": 10,
            "insecureSkipTLSVerify": true, "caBundle": "YWJj",
            "service": {"namespace": "kube-system", "name": "x", "port": 443}}});
    let err = k.fails_stdin(&["create", "-f", "-"], Some(&bad.to_string()));
    for expected in [
        "metadata.name: Invalid value: \"v1.wrong.example\": must be `spec.version+\".\"+spec.group`: \"v1.bad.example\"",
        "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000",
        "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in {err}");
    }
    let local_with_ca = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.local.example"},
        "spec": {"group": "local.example", "version": "v1", "groupPriorityMinimum": 10, "versionPriority": 10,
            "caBundle": "YWJj"}});
    let err = k.fails_stdin(&["create", "-f", "-"], Some(&local_with_ca.to_string()));
    assert!(
        err.contains(
            "spec.caBundle: Invalid value: \"3 bytes\": local APIServices may not have a caBundle"
        ),
        "{err}"
    );
}

fn extension_objects(ext: &Extension) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(&ext.ca_pem);
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: test-ext, namespace: kube-system}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: test-ext, namespace: kube-system}}
subsets:
- addresses: [{{ip: {ip}}}]
  ports: [{{name: https, port: {port}}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {VERSION}.{GROUP}}}
spec:
  group: {GROUP}
  version: {VERSION}
  service: {{namespace: kube-system, name: test-ext, port: 443}}
  caBundle: {ca}
  groupPriorityMinimum: 100
  versionPriority: 100
"#,
        port = ext.addr.port(),
        ip = ext.addr.ip(),
    )
}

#[test]
fn an_extension_apiserver_serves_its_group_through_skiff() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = skiff_control_plane::server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Default::default()
    };
    config.api.apiservice_check_interval = Duration::from_secs(1);
    let server = TestServer::start_with(dir, config);
    let k = server.kubectl(33);
    let name = format!("{VERSION}.{GROUP}");

    // What extension apiservers read to trust the front proxy.
    let cm: Value = wait_for(20, "extension-apiserver-authentication", || {
        let out = k.run(
            &[
                "get",
                "configmap",
                "-n",
                "kube-system",
                "extension-apiserver-authentication",
                "-o",
                "json",
            ],
            None,
        );
        serde_json::from_slice(&out.stdout).ok()
    });
    let data = &cm["data"];
    assert_eq!(data["requestheader-username-headers"], "[\"X-Remote-User\"]");
    assert_eq!(data["requestheader-group-headers"], "[\"X-Remote-Group\"]");
    assert_eq!(data["requestheader-extra-headers-prefix"], "[\"X-Remote-Extra-\"]");
    assert_eq!(data["requestheader-allowed-names"], "[\"front-proxy-client\"]");
    assert_eq!(data["client-ca-file"].as_str(), Some(server.pki().ca_cert_pem.as_str()));
    let requestheader_ca =
        data["requestheader-client-ca-file"].as_str().expect("the CA").to_string();
    assert_ne!(requestheader_ca, server.pki().ca_cert_pem, "a CA of its own");

    // Endpoints refuse loopback addresses (as upstream's): the extension listens on one of
    // this machine's own addresses, delivered locally.
    let ip = skiff_tests::extension::local_address();
    let ext = Extension::start(ip, &requestheader_ca);
    k.ok_stdin(&["apply", "-f", "-"], Some(&extension_objects(&ext)));
    let cols = wait_for(30, "the extension's APIService Available", || {
        row(&k, &name).filter(|c| c.get(2).map(String::as_str) == Some("True"))
    });
    assert_eq!(cols[..3], [name.as_str(), "kube-system/test-ext", "True"]);
    assert_eq!(available(&k, &name).expect("condition")["reason"], "Passed");

    // Discovery: the legacy group list, the extension's own resource list (proxied), and
    // the aggregated document kubectl reads.
    let groups: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/apis"])).unwrap();
    let group = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == GROUP);
    assert_eq!(group.expect("the group in /apis")["preferredVersion"]["version"], VERSION);
    let list: Value =
        serde_json::from_str(&k.ok(&["get", "--raw", &format!("/apis/{GROUP}/{VERSION}")]))
            .unwrap();
    assert_eq!(list["resources"][0]["name"], "widgets");
    let resources = wait_for(20, "widgets in api-resources", || {
        let out = k.ok(&["api-resources", "--api-group", GROUP]);
        out.contains("widgets").then_some(out)
    });
    assert!(
        resources.lines().any(|l| l.starts_with("widgets")
            && l.contains("wdg")
            && l.contains(&format!("{GROUP}/{VERSION}"))),
        "{resources}"
    );

    // The extension's list, with the caller's identity as it arrived.
    let got: Value =
        serde_json::from_str(&k.ok(&["get", &format!("widgets.{GROUP}"), "-o", "json"])).unwrap();
    let names: Vec<&str> = got["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["alpha", "caller"]);
    let caller = &got["items"][1]["spec"];
    assert_eq!(caller["user"], "kubernetes-admin");
    assert!(caller["groups"].as_array().unwrap().iter().any(|g| g == "system:masters"), "{caller}");
    assert_eq!(caller["sawAuthorization"], false, "credentials are not passed on");
    let table = k.ok(&["get", &format!("widgets.{GROUP}")]);
    assert!(table.contains("alpha") && table.contains("caller"), "{table}");
    let seen = ext.last(&format!("/apis/{GROUP}/{VERSION}/widgets")).expect("a request");
    assert_eq!(seen.client_cn, "front-proxy-client", "the front proxy's certificate");
    // The availability check's own identity.
    let check = ext.last(&format!("/apis/{GROUP}/{VERSION}")).expect("a discovery check");
    assert_eq!(check.client_cn, "front-proxy-client");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = skiff_tests::client_from(&server.kubeconfig).await;
        // Forged identity headers from the client are dropped.
        let req = http::Request::get(format!("/apis/{GROUP}/{VERSION}/widgets"))
            .header("X-Remote-User", "forged")
            .header("X-Remote-Group", "forged-group")
            .header("X-Remote-Extra-Scopes", "all")
            .body(Vec::new())
            .unwrap();
        let text = client.request_text(req).await.expect("a proxied list");
        let list: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(list["items"][1]["spec"]["user"], "kubernetes-admin", "{list}");
        assert!(!list["items"][1]["spec"]["groups"].to_string().contains("forged"), "{list}");
        let seen = ext.last(&format!("/apis/{GROUP}/{VERSION}/widgets")).expect("a request");
        for (k, v) in seen.headers.iter().filter(|(k, _)| k.starts_with("x-remote-")) {
            assert!(!v.contains("forged") && k != "x-remote-extra-scopes", "{k}: {v} passed on");
        }

        // A watch streams: the first event arrives while the extension holds the stream open.
        let req = http::Request::get(format!("/apis/{GROUP}/{VERSION}/widgets?watch=true"))
            .body(Vec::new())
            .unwrap();
        let started = Instant::now();
        let mut lines = Box::pin(client.request_stream(req).await.expect("a watch"));
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            use futures::AsyncBufReadExt;
            let mut line = String::new();
            lines.read_line(&mut line).await.map(|_| line)
        })
        .await
        .expect("the first event within 10 s (a buffered proxy would wait for the end)")
        .expect("reading the watch");
        assert!(started.elapsed() < Duration::from_secs(10));
        let event: Value = serde_json::from_str(first.trim()).unwrap();
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["metadata"]["name"], "alpha");
    });

    // Skiff authorizes first, as upstream's aggregator does: a user without RBAC is refused.
    let nobody = server.cert_kubeconfig("nobody.kubeconfig", "nobody", &[]);
    let out = Kubectl::new(33, &nobody).fails(&["get", &format!("widgets.{GROUP}")]);
    assert!(out.contains("forbidden"), "{out}");

    // No endpoints: unavailable with upstream's reason, and requests answer 503.
    k.ok(&["delete", "endpoints", "-n", "kube-system", "test-ext"]);
    let cond = wait_for(20, "Available=False without endpoints", || {
        available(&k, &name).filter(|c| c["status"] == "False")
    });
    assert_eq!(cond["reason"], "EndpointsNotFound", "{cond}");
    let out = k.ok(&["get", "apiservice", &name]);
    assert!(out.contains("False (EndpointsNotFound)"), "{out}");
    let raw = k.fails(&["get", "--raw", &format!("/apis/{GROUP}/{VERSION}/widgets")]);
    assert!(raw.contains("ServiceUnavailable") || raw.contains("service unavailable"), "{raw}");

    // Back, then the extension dies: the discovery check fails.
    k.ok_stdin(&["apply", "-f", "-"], Some(&extension_objects(&ext)));
    wait_for(20, "Available again", || available(&k, &name).filter(|c| c["status"] == "True"));
    drop(ext);
    let cond = wait_for(20, "Available=False once the extension is gone", || {
        available(&k, &name).filter(|c| c["status"] == "False")
    });
    assert_eq!(cond["reason"], "FailedDiscoveryCheck", "{cond}");
    assert!(
        cond["message"].as_str().unwrap().starts_with("failing or missing response from https://"),
        "{cond}"
    );
    // kubectl sees the group Stale in aggregated discovery and finds no such resource;
    // the request itself answers upstream's 503.
    k.fails(&["get", &format!("widgets.{GROUP}")]);
    let raw = k.fails(&["get", "--raw", &format!("/apis/{GROUP}/{VERSION}/widgets")]);
    assert!(
        raw.contains("the server is currently unable to handle the request")
            || raw.contains("ServiceUnavailable"),
        "{raw}"
    );

    // Deleting the APIService takes the group out of discovery.
    k.ok(&["delete", "apiservice", &name]);
    wait_for(20, "the group to leave /apis", || {
        let groups = k.ok(&["get", "--raw", "/apis"]);
        (!groups.contains(GROUP)).then_some(())
    });
    let resources = k.ok(&["api-resources"]);
    assert!(!resources.contains("widgets"), "{resources}");
}
