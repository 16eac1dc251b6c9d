//! CEL validation rules (`x-kubernetes-validations`) end to end with real kubectl: a CRD
//! with rules (a transition rule, `messageExpression`, `fieldPath`, `reason`) installed,
//! objects that break them refused with 422 and upstream's causes, valid ones accepted, a
//! CRD whose rule does not compile refused, and a Gateway API HTTPRoute that breaks one
//! of its real rules refused.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use skiff_tests::{Kubectl, TestServer, workspace_root};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pools.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: pools, singular: pool, kind: Pool, listKind: PoolList}
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
              name:
                type: string
                maxLength: 63
                x-kubernetes-validations:
                - rule: self == oldSelf
                  message: name is immutable
              minReplicas: {type: integer}
              maxReplicas: {type: integer}
              mode:
                type: string
                maxLength: 16
              tags:
                type: array
                maxItems: 10
                items: {type: string, maxLength: 32}
                x-kubernetes-validations:
                - rule: self.all(t, t.startsWith('team-'))
                  messageExpression: "'tags must start with team-, got ' + self.filter(t, !t.startsWith('team-')).join(', ')"
            x-kubernetes-validations:
            - rule: self.minReplicas <= self.maxReplicas
              message: minReplicas must not exceed maxReplicas
              fieldPath: .minReplicas
            - rule: "self.mode != 'legacy'"
              message: legacy mode is no longer supported
              reason: FieldValueForbidden
"#;

fn pool(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Pool\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{spec}"
    )
}

/// `kubectl <verb> -f -` of `yaml` fails with a 422 Invalid whose stderr has each of `causes`.
fn refused(k: &Kubectl, verb: &str, yaml: &str, causes: &[&str]) {
    let err = k.fails_stdin(&[verb, "-v=6", "-f", "-"], Some(yaml));
    assert!(err.contains(r#"status="422 Unprocessable Entity""#), "not a 422: {err}");
    assert!(err.contains("\" is invalid: "), "not an Invalid status: {err}");
    for cause in causes {
        assert!(err.contains(cause), "missing cause {cause:?} in:\n{err}");
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn fixture(project: &str, file: &str) -> String {
    let p: PathBuf = workspace_root().join("tests/fixtures/crds").join(project).join(file);
    p.to_str().expect("utf-8 path").to_string()
}

#[test]
fn crd_validation_rules_are_enforced() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    k.ok_stdin(&["apply", "-f", "-"], Some(CRD));
    k.ok(&["wait", "--for=condition=Established", "crd/pools.example.com", "--timeout=20s"]);
    wait_for("pools served", || k.run(&["get", "pools", "-A"], None).status.success());

    // Valid objects are accepted.
    let good = pool(
        "a",
        "  name: first\n  minReplicas: 1\n  maxReplicas: 3\n  mode: fast\n  tags: [team-a, team-b]\n",
    );
    let out = k.ok_stdin(&["create", "-f", "-"], Some(&good));
    assert!(out.contains("pool.example.com/a created"), "{out}");

    // fieldPath and message; messageExpression; reason.
    refused(
        &k,
        "create",
        &pool("b", "  minReplicas: 5\n  maxReplicas: 3\n"),
        &[r#"spec.minReplicas: Invalid value: "object": minReplicas must not exceed maxReplicas"#],
    );
    refused(
        &k,
        "create",
        &pool("b", "  minReplicas: 1\n  maxReplicas: 3\n  tags: [team-a, ops, dev]\n"),
        &[r#"spec.tags: Invalid value: "array": tags must start with team-, got ops, dev"#],
    );
    refused(
        &k,
        "create",
        &pool("b", "  minReplicas: 1\n  maxReplicas: 3\n  mode: legacy\n"),
        &["spec: Forbidden: legacy mode is no longer supported"],
    );
    // The causes of the Status, as clients read them.
    let err = k.fails_stdin(
        &["create", "-f", "-", "-o", "json"],
        Some(&pool("b", "  minReplicas: 9\n  maxReplicas: 3\n  mode: legacy\n")),
    );
    assert!(
        err.contains(
            "spec.minReplicas: Invalid value: \"object\": minReplicas must not exceed maxReplicas"
        ) && err.contains("spec: Forbidden: legacy mode is no longer supported"),
        "{err}"
    );
    assert!(k.fails(&["get", "pool", "b"]).contains("NotFound"));

    // The transition rule: on update only.
    let renamed = good.replace("name: first", "name: second");
    refused(&k, "replace", &renamed, &[r#"spec.name: Invalid value: "string": name is immutable"#]);
    let scaled = good.replace("maxReplicas: 3", "maxReplicas: 5");
    let out = k.ok_stdin(&["replace", "-f", "-"], Some(&scaled));
    assert!(out.contains("pool.example.com/a replaced"), "{out}");

    // A CRD whose rule does not compile is refused.
    let broken = CRD
        .replace("pools.example.com", "brokens.example.com")
        .replace(
            "{plural: pools, singular: pool, kind: Pool, listKind: PoolList}",
            "{plural: brokens, singular: broken, kind: Broken, listKind: BrokenList}",
        )
        .replace("self.mode != 'legacy'", "self.mode !=");
    let err = k.fails_stdin(&["create", "-v=6", "-f", "-"], Some(&broken));
    assert!(err.contains(r#"status="422 Unprocessable Entity""#), "not a 422: {err}");
    assert!(
        err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule: Invalid value: "),
        "{err}"
    );
    assert!(err.contains("compilation failed: ERROR: <input>:1:"), "{err}");
    // And one whose rule references an undeclared field.
    let typo = CRD
        .replace("pools.example.com", "typos.example.com")
        .replace(
            "{plural: pools, singular: pool, kind: Pool, listKind: PoolList}",
            "{plural: typos, singular: typo, kind: Typo, listKind: TypoList}",
        )
        .replace("self.mode != 'legacy'", "self.mood != 'legacy'");
    let err = k.fails_stdin(&["create", "-f", "-"], Some(&typo));
    assert!(err.contains("undefined field 'mood'"), "{err}");
    assert!(k.fails(&["get", "crd", "brokens.example.com"]).contains("NotFound"));
}

#[test]
fn gateway_api_rules_are_enforced() {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(33);
    k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &fixture("gateway-api", "gateway.networking.k8s.io_httproutes.yaml"),
    ]);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/httproutes.gateway.networking.k8s.io",
        "--timeout=30s",
    ]);
    wait_for("httproutes served", || k.run(&["get", "httproutes", "-A"], None).status.success());
    let route = |backend: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: web, namespace: default}}\nspec:\n  parentRefs:\n  - name: gw\n  rules:\n  - backendRefs:\n    - {backend}\n"
        )
    };
    // A Service backend needs a port.
    refused(
        &k,
        "create",
        &route("{name: api}"),
        &[
            r#"spec.rules[0].backendRefs[0]: Invalid value: "object": Must have port for Service reference"#,
        ],
    );
    // Two parentRefs to the same parent need distinct sectionNames (the rule that both or
    // neither have one holds for two without).
    let twice = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: web, namespace: default}\nspec:\n  parentRefs:\n  - name: gw\n  - name: gw\n";
    refused(
        &k,
        "create",
        twice,
        &[
            "spec.parentRefs: Invalid value: \"array\": sectionName must be unique when parentRefs includes 2 or more references to the same parent",
        ],
    );
    let out = k.ok_stdin(&["create", "-f", "-"], Some(&route("{name: api, port: 8080}")));
    assert!(out.contains("httproute.gateway.networking.k8s.io/web created"), "{out}");
}
