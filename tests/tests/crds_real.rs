//! The CustomResourceDefinitions of widely used public projects (cert-manager, the Gateway
//! API's standard channel, prometheus-operator; unmodified, see
//! tests/fixtures/crds/README.md), installed with real kubectl as their users do: every CRD
//! Established and in discovery, realistic objects of a few kinds created and read back
//! with their schema's defaults applied, objects that break the schema refused with
//! upstream's causes, the printer columns in `kubectl get`, and the CRDs deleted at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skiff_tests::{Kubectl, TestServer, workspace_root};

fn fixtures(project: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/crds").join(project)
}

fn fixture(project: &str, file: &str) -> String {
    fixtures(project).join(file).to_str().expect("utf-8 path").to_string()
}

/// The CRDs of each fixture folder, by plural and group.
const CRDS: &[(&str, &[&str], &str)] = &[
    ("cert-manager", &["challenges", "orders"], "acme.cert-manager.io"),
    (
        "cert-manager",
        &["certificaterequests", "certificates", "clusterissuers", "issuers"],
        "cert-manager.io",
    ),
    (
        "gateway-api",
        &[
            "backendtlspolicies",
            "gatewayclasses",
            "gateways",
            "grpcroutes",
            "httproutes",
            "listenersets",
            "referencegrants",
            "tcproutes",
            "tlsroutes",
            "udproutes",
        ],
        "gateway.networking.k8s.io",
    ),
    (
        "prometheus-operator",
        &[
            "alertmanagers",
            "podmonitors",
            "probes",
            "prometheuses",
            "prometheusrules",
            "servicemonitors",
        ],
        "monitoring.coreos.com",
    ),
];

fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    serde_json::from_str(&k.ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The first line of `kubectl get <args>`, split into its column names.
fn header(k: &Kubectl, args: &[&str]) -> Vec<String> {
    let table = k.ok(args);
    table.lines().next().unwrap_or_default().split_whitespace().map(str::to_string).collect()
}

/// `kubectl create -f -` of `yaml` fails with a 422 Invalid; its stderr has each of
/// `causes`.
fn refused(k: &Kubectl, yaml: &str, causes: &[&str]) {
    let err = k.fails_stdin(&["create", "-v=6", "-f", "-"], Some(yaml));
    assert!(
        err.contains(r#"verb="POST""#) && err.contains(r#"status="422 Unprocessable Entity""#),
        "not a 422: {err}"
    );
    assert!(err.contains("\" is invalid: "), "not an Invalid status: {err}");
    for cause in causes {
        assert!(err.contains(cause), "missing cause {cause:?} in:\n{err}");
    }
}

const CERT_MANAGER: &str = r#"
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: selfsigned
  namespace: default
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: ca-issuer
  namespace: default
spec:
  ca:
    secretName: root-ca
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: example-com
  namespace: default
spec:
  secretName: example-com-tls
  duration: 2160h
  renewBefore: 360h
  commonName: example.com
  dnsNames:
  - example.com
  - www.example.com
  subject:
    organizations: [Example Inc.]
  privateKey:
    algorithm: ECDSA
    size: 256
    rotationPolicy: Always
  usages:
  - server auth
  - client auth
  issuerRef:
    name: ca-issuer
    kind: Issuer
    group: cert-manager.io
"#;

const GATEWAY_API: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: skiff
spec:
  controllerName: example.com/gateway-controller
  description: A test class
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
  namespace: default
spec:
  gatewayClassName: skiff
  listeners:
  - name: http
    protocol: HTTP
    port: 80
  - name: https
    protocol: HTTPS
    port: 443
    hostname: "*.example.com"
    tls:
      certificateRefs:
      - name: example-com-tls
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web
  namespace: default
spec:
  parentRefs:
  - name: web
    sectionName: https
  hostnames:
  - www.example.com
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /api
      headers:
      - name: x-canary
        value: "true"
    backendRefs:
    - name: api
      port: 8080
  - backendRefs:
    - name: frontend
      port: 80
      weight: 90
    - name: frontend-next
      port: 80
"#;

const PROMETHEUS_OPERATOR: &str = r#"
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: api
  namespace: default
  labels:
    release: prometheus
spec:
  selector:
    matchLabels:
      app: api
  namespaceSelector:
    matchNames: [default]
  endpoints:
  - port: metrics
    path: /metrics
    interval: 30s
    scrapeTimeout: 10s
    bearerTokenSecret:
      key: token
    relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    metricRelabelings:
    - sourceLabels: [__name__]
      regex: go_gc_.*
      action: drop
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: api
  namespace: default
spec:
  groups:
  - name: api.rules
    interval: 1m
    rules:
    - alert: HighErrorRate
      expr: sum(rate(http_requests_total{code=~"5.."}[5m])) / sum(rate(http_requests_total[5m])) > 0.05
      for: 10m
      labels:
        severity: critical
      annotations:
        summary: More than 5% of the API's requests fail
    - record: job:http_requests:rate5m
      expr: sum by (job) (rate(http_requests_total[5m]))
---
apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata:
  name: main
  namespace: default
spec:
  replicas: 2
  version: v3.5.0
  serviceAccountName: prometheus
  serviceMonitorSelector:
    matchLabels:
      release: prometheus
  ruleSelector: {}
  retention: 15d
  resources:
    requests:
      memory: 400Mi
      cpu: 500m
  storage:
    volumeClaimTemplate:
      spec:
        storageClassName: standard
        resources:
          requests:
            storage: 40Gi
  alerting:
    alertmanagers:
    - namespace: default
      name: alertmanager-main
      port: web
---
apiVersion: monitoring.coreos.com/v1
kind: Alertmanager
metadata:
  name: main
  namespace: default
spec:
  replicas: 3
"#;

#[test]
fn the_crds_of_public_projects_install_and_serve_their_objects() {
    let started = Instant::now();
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);

    // Installing, as the projects document it: each directory server-side. One CRD is
    // applied client-side first, its last-applied annotation fitting; the server-side
    // apply of its directory then takes it over from kubectl-client-side-apply. (Its
    // schema has minimum/maximum bounds: a typed round trip writes them as floats, `0.0`
    // for `0`, which managed fields compare by value, as upstream.)
    let projects = ["cert-manager", "gateway-api", "prometheus-operator"];
    let out = k.ok(&[
        "apply",
        "-f",
        &fixture("prometheus-operator", "monitoring.coreos.com_servicemonitors.yaml"),
    ]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/servicemonitors.monitoring.coreos.com created"
    );
    for project in ["cert-manager", "gateway-api"] {
        let out = k.ok(&["apply", "--server-side", "-f", fixtures(project).to_str().unwrap()]);
        assert_eq!(out.matches(" serverside-applied\n").count(), out.lines().count(), "{out}");
    }
    let out =
        k.ok(&["apply", "--server-side", "-f", fixtures("prometheus-operator").to_str().unwrap()]);
    assert_eq!(out.matches(" serverside-applied\n").count(), 6, "{out}");
    // kubectl moved the client-side apply's fields to its server-side manager.
    let rules = json_of(
        &k,
        &[
            "get",
            "crd",
            "servicemonitors.monitoring.coreos.com",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    );
    let mut managers: Vec<String> = rules["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{} {}", m["manager"].as_str().unwrap(), m["operation"].as_str().unwrap()))
        .collect();
    managers.sort();
    assert_eq!(
        managers,
        ["apiextensions-controller Update", "kubectl Apply", "kubectl-last-applied Apply"],
        "{rules}"
    );
    // Applying the same directory again (an upgrade to the same release) writes nothing
    // (once the controllers have written the CRDs' status).
    k.ok(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
    let rv = |name: &str| k.ok(&["get", "crd", name, "-o", "jsonpath={.metadata.resourceVersion}"]);
    let before = rv("prometheuses.monitoring.coreos.com");
    k.ok(&["apply", "--server-side", "-f", fixtures("prometheus-operator").to_str().unwrap()]);
    assert_eq!(rv("prometheuses.monitoring.coreos.com"), before);
    // Client-side apply of a CRD too large for its annotation fails as upstream.
    let err = k.fails(&[
        "apply",
        "-f",
        &fixture("prometheus-operator", "monitoring.coreos.com_prometheuses.yaml"),
    ]);
    assert!(err.contains("Too long: may not be more than 262144 bytes"), "{err}");

    let all: Vec<(String, &str)> = CRDS
        .iter()
        .flat_map(|(_, plurals, group)| {
            plurals.iter().map(move |p| (format!("{p}.{group}"), *group))
        })
        .collect();
    // Every CRD of the fixtures is in the list (and no other).
    let files: usize = projects
        .iter()
        .map(|p| {
            std::fs::read_dir(fixtures(p))
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "yaml"))
                .count()
        })
        .sum();
    assert_eq!((all.len(), files), (6 + 10 + 6, 6 + 10 + 6));
    k.ok(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
    let listed = json_of(&k, &["get", "crd", "-o", "json"]);
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    for (name, _) in &all {
        assert!(names.contains(&name.as_str()), "{name} not listed: {names:?}");
        let crd = json_of(&k, &["get", "crd", name, "-o", "json"]);
        let conditions = crd["status"]["conditions"].as_array().cloned().unwrap_or_default();
        for kind in ["NamesAccepted", "Established"] {
            assert!(
                conditions.iter().any(|c| c["type"] == kind && c["status"] == "True"),
                "{name}: {conditions:?}"
            );
        }
        // The stored version is the one marked storage.
        let storage: Vec<&Value> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["storage"] == true)
            .map(|v| &v["name"])
            .collect();
        assert_eq!(crd["status"]["storedVersions"], json!(storage), "{name}");
    }
    // Server-side apply kept the big schemas whole: the prometheuses CRD's schema has
    // its deepest fields.
    let prom = json_of(&k, &["get", "crd", "prometheuses.monitoring.coreos.com", "-o", "json"]);
    let spec_props = &prom["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    assert!(
        spec_props["containers"]["items"]["properties"]["livenessProbe"]["properties"]["grpc"]["properties"]
            ["port"]["format"]
            == "int32",
        "prometheuses schema truncated"
    );

    // Discovery: each group has each of its resources.
    for (_, plurals, group) in CRDS {
        wait_for(&format!("{group} in discovery"), || {
            let out = k.ok(&["api-resources", "--api-group", group, "-o", "name"]);
            plurals.iter().all(|p| out.lines().any(|l| l == format!("{p}.{group}")))
        });
    }
    let gw = k.ok(&["api-resources", "--api-group=gateway.networking.k8s.io", "-o", "wide"]);
    let row = gw.lines().find(|l| l.starts_with("gateways ")).unwrap_or_default();
    assert!(
        row.contains("gtw")
            && row.contains("gateway.networking.k8s.io/v1 ")
            && row.contains("true")
            && row.contains("Gateway"),
        "{gw}"
    );
    let cm = k.ok(&["api-resources", "--api-group=cert-manager.io"]);
    assert!(cm.lines().any(|l| l.starts_with("clusterissuers ") && l.contains("false")), "{cm}");
    assert!(k.ok(&["api-versions"]).contains("gateway.networking.k8s.io/v1beta1"));

    // cert-manager: Issuers and a Certificate; no defaults in its schemas, so what is
    // read back is what was written.
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(CERT_MANAGER));
    assert!(out.contains("certificate.cert-manager.io/example-com created"), "{out}");
    let iss = json_of(&k, &["get", "issuer", "selfsigned", "-o", "json"]);
    assert_eq!(iss["spec"], json!({"selfSigned": {}}));
    let cert = json_of(&k, &["get", "certificate", "example-com", "-o", "json"]);
    assert_eq!(cert["apiVersion"], "cert-manager.io/v1");
    assert_eq!(
        cert["spec"]["privateKey"],
        json!({"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"})
    );
    assert_eq!(cert["spec"]["dnsNames"], json!(["example.com", "www.example.com"]));
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"name": "ca-issuer", "kind": "Issuer", "group": "cert-manager.io"})
    );
    assert_eq!(header(&k, &["get", "certificates"]), ["NAME", "READY", "SECRET", "AGE"]);
    assert_eq!(header(&k, &["get", "issuers"]), ["NAME", "READY", "AGE"]);
    // `-o wide` adds the priority-1 column.
    assert_eq!(header(&k, &["get", "issuers", "-o", "wide"]), ["NAME", "READY", "STATUS", "AGE"]);
    assert!(k.ok(&["get", "cert-manager"]).contains("certificate.cert-manager.io/example-com"));
    let row = k.ok(&["get", "certificate", "example-com", "--no-headers"]);
    assert!(
        row.split_whitespace().collect::<Vec<_>>()[..2] == ["example-com", "example-com-tls"],
        "{row}"
    );
    refused(
        &k,
        "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: bad, namespace: default}\nspec:\n  issuerRef: {name: ca-issuer}\n  dnsNames: [example.com]\n",
        &["spec.secretName: Required value"],
    );
    refused(
        &k,
        "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: bad, namespace: default}\nspec:\n  secretName: s\n  issuerRef: {name: ca-issuer}\n  privateKey: {algorithm: DSA, size: big}\n",
        &[
            r#"spec.privateKey.algorithm: Unsupported value: "DSA": supported values: "RSA", "ECDSA", "Ed25519""#,
            r#"spec.privateKey.size: Invalid value: "string": spec.privateKey.size in body must be of type integer: "string""#,
        ],
    );
    refused(
        &k,
        "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: bad, namespace: default}\nspec:\n  ca: {}\n",
        &["spec.ca.secretName: Required value"],
    );
    assert!(k.fails(&["get", "certificate", "bad"]).contains("NotFound"));

    // The Gateway API: a GatewayClass, a Gateway and an HTTPRoute, with their defaults:
    // in spec, and the "Waiting for controller" status a new object shows (the create
    // drops the status, reading from storage defaults it again, as upstream).
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(GATEWAY_API));
    assert!(out.contains("httproute.gateway.networking.k8s.io/web created"), "{out}");
    let class = json_of(&k, &["get", "gatewayclass", "skiff", "-o", "json"]);
    assert_eq!(class["spec"]["controllerName"], "example.com/gateway-controller");
    assert_eq!(
        class["status"],
        json!({"conditions": [{"lastTransitionTime": "1970-01-01T00:00:00Z", "message": "Waiting for controller", "reason": "Pending", "status": "Unknown", "type": "Accepted"}]}),
        "{class}"
    );
    let gateway = json_of(&k, &["get", "gateway", "web", "-o", "json"]);
    let listeners = &gateway["spec"]["listeners"];
    assert_eq!(
        listeners[0],
        json!({"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "Same"}}})
    );
    assert_eq!(
        listeners[1],
        json!({
            "name": "https", "protocol": "HTTPS", "port": 443, "hostname": "*.example.com",
            "allowedRoutes": {"namespaces": {"from": "Same"}},
            "tls": {"mode": "Terminate", "certificateRefs": [{"group": "", "kind": "Secret", "name": "example-com-tls"}]},
        })
    );
    let gw_conditions: Vec<(&Value, &Value)> = gateway["status"]["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no defaulted status: {gateway}"))
        .iter()
        .map(|c| (&c["type"], &c["status"]))
        .collect();
    assert_eq!(
        gw_conditions,
        [(&json!("Accepted"), &json!("Unknown")), (&json!("Programmed"), &json!("Unknown"))]
    );
    let route = json_of(&k, &["get", "httproute", "web", "-o", "json"]);
    assert_eq!(
        route["spec"]["parentRefs"],
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "web", "sectionName": "https"}])
    );
    let rules = &route["spec"]["rules"];
    assert_eq!(
        rules[0]["matches"],
        json!([{"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "x-canary", "value": "true", "type": "Exact"}]}])
    );
    assert_eq!(
        rules[0]["backendRefs"],
        json!([{"group": "", "kind": "Service", "name": "api", "port": 8080, "weight": 1}])
    );
    // A rule without matches matches every path.
    assert_eq!(rules[1]["matches"], json!([{"path": {"type": "PathPrefix", "value": "/"}}]));
    assert_eq!(rules[1]["backendRefs"][0]["weight"], 90);
    assert_eq!(rules[1]["backendRefs"][1]["weight"], 1);
    // Read back at the other served version: same object, stored at v1.
    let beta =
        json_of(&k, &["get", "httproutes.v1beta1.gateway.networking.k8s.io", "web", "-o", "json"]);
    assert_eq!(beta["spec"], route["spec"]);
    assert_eq!(header(&k, &["get", "gatewayclasses"]), ["NAME", "CONTROLLER", "ACCEPTED", "AGE"]);
    let row = k.ok(&["get", "gatewayclass", "skiff", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        (cells.len(), &cells[..3]),
        (4, &["skiff", "example.com/gateway-controller", "Unknown"][..]),
        "{row}"
    );
    assert_eq!(header(&k, &["get", "gateways"]), ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"]);
    let row = k.ok(&["get", "gtw", "web", "--no-headers"]);
    // No address yet: that cell is empty; Programmed is the defaulted Unknown.
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells.len(), &cells[..3]), (4, &["web", "skiff", "Unknown"][..]), "{row}");
    assert_eq!(header(&k, &["get", "httproutes"]), ["NAME", "HOSTNAMES", "AGE"]);
    let row = k.ok(&["get", "httproute", "web", "--no-headers"]);
    assert!(row.contains(r#"["www.example.com"]"#), "{row}");
    refused(
        &k,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: bad, namespace: default}\nspec:\n  listeners:\n  - {name: http, protocol: HTTP, port: eighty}\n  - {name: Bad_Name, protocol: HTTP, port: 0}\n",
        &[
            "spec.gatewayClassName: Required value",
            r#"spec.listeners[0].port: Invalid value: "string": spec.listeners[0].port in body must be of type integer: "string""#,
            "spec.listeners[1].port: Invalid value: 0: spec.listeners[1].port in body should be greater than or equal to 1",
            r#"spec.listeners[1].name: Invalid value: "Bad_Name": spec.listeners[1].name in body should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'"#,
        ],
    );
    refused(
        &k,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: bad, namespace: default}\nspec:\n  rules:\n  - matches:\n    - path: {type: Prefix, value: /}\n      method: FETCH\n",
        &[
            r#"spec.rules[0].matches[0].path.type: Unsupported value: "Prefix": supported values: "Exact", "PathPrefix", "RegularExpression""#,
            r#"spec.rules[0].matches[0].method: Unsupported value: "FETCH": supported values: "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH""#,
        ],
    );
    refused(
        &k,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: bad}\nspec: {}\n",
        &["spec.controllerName: Required value"],
    );
    // Listeners are a map keyed by name: two of the same name are refused.
    refused(
        &k,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: bad, namespace: default}\nspec:\n  gatewayClassName: skiff\n  listeners:\n  - {name: http, protocol: HTTP, port: 80}\n  - {name: http, protocol: HTTP, port: 8080}\n",
        &[r#"spec.listeners[1]: Duplicate value: map[string]interface {}{"name":"http"}"#],
    );

    // prometheus-operator: a ServiceMonitor, a PrometheusRule, and objects of the two
    // large CRDs, with their defaults.
    let out = k.ok_stdin(&["apply", "--server-side", "-f", "-"], Some(PROMETHEUS_OPERATOR));
    assert!(out.contains("prometheus.monitoring.coreos.com/main serverside-applied"), "{out}");
    let sm = json_of(&k, &["get", "servicemonitor", "api", "-o", "json"]);
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(
        endpoint["relabelings"],
        json!([{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}])
    );
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    assert_eq!(endpoint["bearerTokenSecret"], json!({"key": "token", "name": ""}));
    assert_eq!(endpoint["interval"], "30s");
    let rule = json_of(&k, &["get", "prometheusrule", "api", "-o", "json"]);
    assert_eq!(rule["spec"]["groups"][0]["rules"][0]["for"], "10m");
    assert_eq!(rule["spec"]["groups"][0]["rules"][1]["record"], "job:http_requests:rate5m");
    let prometheus = json_of(&k, &["get", "prometheus", "main", "-o", "json"]);
    let spec = &prometheus["spec"];
    assert_eq!(
        (&spec["portName"], &spec["scrapeInterval"], &spec["evaluationInterval"], &spec["shards"]),
        (&json!("web"), &json!("30s"), &json!("30s"), &json!(1)),
        "{spec}"
    );
    assert_eq!(spec["resources"]["requests"], json!({"memory": "400Mi", "cpu": "500m"}));
    assert_eq!(
        spec["storage"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"],
        "40Gi"
    );
    let am = json_of(&k, &["get", "alertmanager", "main", "-o", "json"]);
    assert_eq!(am["spec"], json!({"replicas": 3, "portName": "web", "retention": "120h"}));
    // No printer columns: NAME and AGE.
    assert_eq!(header(&k, &["get", "servicemonitors"]), ["NAME", "AGE"]);
    assert_eq!(header(&k, &["get", "prometheusrules"]), ["NAME", "AGE"]);
    assert_eq!(
        header(&k, &["get", "prometheuses"]),
        ["NAME", "VERSION", "DESIRED", "READY", "RECONCILED", "AVAILABLE", "AGE"]
    );
    assert_eq!(
        header(&k, &["get", "alertmanagers"]),
        ["NAME", "VERSION", "REPLICAS", "READY", "RECONCILED", "AVAILABLE", "AGE"]
    );
    let cells = k.ok(&["get", "alertmanager", "main", "--no-headers"]);
    let cells: Vec<&str> = cells.split_whitespace().collect();
    assert_eq!((cells.len(), &cells[..2]), (3, &["main", "3"][..]), "{cells:?}");
    let row = k.ok(&["get", "prometheus", "main", "--no-headers"]);
    assert_eq!(
        row.split_whitespace().take(3).collect::<Vec<_>>(),
        ["main", "v3.5.0", "2"],
        "{row}"
    );
    refused(
        &k,
        "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: bad, namespace: default}\nspec:\n  groups:\n  - name: g\n    rules:\n    - alert: NoExpr\n  - rules: []\n",
        &["spec.groups[0].rules[0].expr: Required value", "spec.groups[1].name: Required value"],
    );
    refused(
        &k,
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {}\n  endpoints:\n  - port: metrics\n    interval: 30 seconds\n    scheme: ftp\n    relabelings:\n    - action: rename\n",
        &[
            r#"spec.endpoints[0].scheme: Unsupported value: "ftp": supported values: "http", "https", "HTTP", "HTTPS""#,
            r#"spec.endpoints[0].relabelings[0].action: Unsupported value: "rename": supported values: "replace", "Replace", "keep""#,
            r#"spec.endpoints[0].interval: Invalid value: "30 seconds": spec.endpoints[0].interval in body should match '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'"#,
        ],
    );
    refused(
        &k,
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {}\n",
        &["spec.endpoints: Required value"],
    );
    refused(
        &k,
        "apiVersion: monitoring.coreos.com/v1\nkind: Prometheus\nmetadata: {name: bad, namespace: default}\nspec:\n  replicas: two\n",
        &[
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#,
        ],
    );
    // Unknown fields: kubectl asks for strict validation.
    let err = k.fails_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {}\n  endpoints: [{port: metrics, intervall: 30s}]\n"),
    );
    assert!(err.contains(r#"unknown field "spec.endpoints[0].intervall""#), "{err}");

    // Deleting the CRDs deletes their objects, then the CRDs; they leave discovery.
    for project in projects {
        k.ok(&["delete", "--timeout=60s", "-f", fixtures(project).to_str().unwrap()]);
    }
    for (name, _) in &all {
        let err = k.fails(&["get", "crd", name]);
        assert!(err.contains("NotFound"), "{name}: {err}");
    }
    assert_eq!(k.ok(&["get", "crd", "-o", "name"]).trim(), "");
    wait_for("the groups out of discovery", || {
        let groups = k.ok(&["api-versions"]);
        !groups.contains("cert-manager.io")
            && !groups.contains("gateway.networking.k8s.io")
            && !groups.contains("monitoring.coreos.com")
    });
    let err = k.fails(&["get", "certificates", "-A"]);
    assert!(err.contains("the server doesn't have a resource type"), "{err}");
    eprintln!("crds_real: {:.1}s", started.elapsed().as_secs_f64());
}
