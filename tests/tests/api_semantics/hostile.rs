//! The requests that broke skiff when it was tried as an attacker with ordinary
//! credentials would: each test sends the request (or the object) that once escalated
//! privileges, exhausted memory or CPU, panicked a handler, stopped the controllers or held
//! file descriptors for ever, and asserts upstream's answer instead.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::{Value, json};
use skiff_tests::{TestServer, client_from, server_binary};

use super::{JSON, call, call_raw, client};

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const JSON_PATCH: &str = "application/json-patch+json";
const MERGE_PATCH: &str = "application/merge-patch+json";

fn binding(name: &str, kind: &str, role: &str, user: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
}

fn role(kind: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
           "metadata": {"name": name}, "rules": rules})
}

fn all_rule() -> Value {
    json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
}

async fn created(c: &Client, path: &str, body: Value) {
    let (code, out) = call(c, "POST", path, JSON, Some(body)).await;
    assert_eq!(code, 201, "POST {path}: {out}");
}

fn assert_escalation_refused(code: u16, status: &Value, what: &str) {
    assert_eq!(code, 403, "{what}: {status}");
    assert_eq!(status["reason"], "Forbidden", "{what}: {status}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is attempting to grant RBAC permissions not currently held"),
        "{what}: {message}"
    );
}

/// Item 1: a namespace admin bound a RoleBinding to cluster-admin and used it, and wrote a
/// Role with `*` on everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_admin_cannot_grant_what_it_does_not_hold() {
    let server = TestServer::start();
    let admin = client(&server).await;
    created(&admin, "/api/v1/namespaces", json!({"metadata": {"name": "team"}})).await;
    let team = format!("{RBAC}/namespaces/team");
    created(
        &admin,
        &format!("{team}/rolebindings"),
        binding("alice-admin", "ClusterRole", "admin", "alice"),
    )
    .await;
    let alice = client_from(&server.cert_kubeconfig("alice.kubeconfig", "alice", &[])).await;

    // The request that broke: a RoleBinding to cluster-admin in her namespace.
    let (code, status) = call(
        &alice,
        "POST",
        &format!("{team}/rolebindings"),
        JSON,
        Some(binding("mine", "ClusterRole", "cluster-admin", "alice")),
    )
    .await;
    assert_escalation_refused(code, &status, "binding cluster-admin");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(r#"rolebindings.rbac.authorization.k8s.io "mine" is forbidden: user "alice" (groups=["system:authenticated"])"#),
        "{message}"
    );
    assert!(message.contains(r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#), "{message}");
    assert!(message.contains(r#"{NonResourceURLs:["*"], Verbs:["*"]}"#), "{message}");
    assert_eq!(status["details"]["kind"], "rolebindings");
    let (code, _) = call(&alice, "GET", "/api/v1/namespaces/kube-system/secrets", JSON, None).await;
    assert_eq!(code, 403, "nothing was granted");

    // A Role with `*` on everything, created or made so by an update.
    let (code, status) = call(
        &alice,
        "POST",
        &format!("{team}/roles"),
        JSON,
        Some(role("Role", "star", all_rule())),
    )
    .await;
    assert_escalation_refused(code, &status, "a * Role");
    let pods_get = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]);
    created(&alice, &format!("{team}/roles"), role("Role", "readers", pods_get)).await;
    let (_, mut readers) = call(&alice, "GET", &format!("{team}/roles/readers"), JSON, None).await;
    readers["rules"] = all_rule();
    let (code, status) =
        call(&alice, "PUT", &format!("{team}/roles/readers"), JSON, Some(readers)).await;
    assert_escalation_refused(code, &status, "an update to *");
    let (code, status) = call(
        &alice,
        "PATCH",
        &format!("{team}/roles/readers"),
        JSON_PATCH,
        Some(json!([{"op": "add", "path": "/rules/-", "value": {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}}])),
    )
    .await;
    assert_escalation_refused(code, &status, "a patch adding nodes");

    // What she holds she may grant: the same roles, a narrower Role, its binding.
    created(
        &alice,
        &format!("{team}/rolebindings"),
        binding("bob-edit", "ClusterRole", "edit", "bob"),
    )
    .await;
    created(
        &alice,
        &format!("{team}/rolebindings"),
        binding("bob-admin", "ClusterRole", "admin", "bob"),
    )
    .await;
    created(&alice, &format!("{team}/rolebindings"), binding("bob-read", "Role", "readers", "bob"))
        .await;
    let (code, status) = call(
        &alice,
        "POST",
        &format!("{team}/rolebindings"),
        JSON,
        Some(binding("ghost", "Role", "no-such-role", "bob")),
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")), "{status}");

    // `bind` on cluster-admin and `escalate` on roles are what let one do so anyway.
    created(
        &admin,
        &format!("{RBAC}/clusterroles"),
        role(
            "ClusterRole",
            "grantor",
            json!([
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
            ]),
        ),
    )
    .await;
    created(
        &admin,
        &format!("{team}/rolebindings"),
        binding("alice-grantor", "ClusterRole", "grantor", "alice"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, out) = call(
            &alice,
            "POST",
            &format!("{team}/rolebindings"),
            JSON,
            Some(binding("mine", "ClusterRole", "cluster-admin", "alice")),
        )
        .await;
        if code == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "bind was never honoured: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Item 1, cluster scope: a writer of ClusterRoles who is not cluster-admin may not set an
/// aggregationRule (it gathers anything); the default roles are aggregated as upstream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregation_rule_needs_cluster_admin() {
    let server = TestServer::start();
    let admin = client(&server).await;
    let writer = json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                         "verbs": ["create", "get", "list", "update", "patch"]}]);
    created(&admin, &format!("{RBAC}/clusterroles"), role("ClusterRole", "role-writer", writer))
        .await;
    let crb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "bob-writes-roles"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "role-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]});
    created(&admin, &format!("{RBAC}/clusterrolebindings"), crb).await;
    let bob = client_from(&server.cert_kubeconfig("bob.kubeconfig", "bob", &[])).await;
    let mut gather = role("ClusterRole", "gather-admin", json!([]));
    gather["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}]});
    let (code, status) =
        call(&bob, "POST", &format!("{RBAC}/clusterroles"), JSON, Some(gather)).await;
    assert_eq!(code, 403, "{status}");
    assert!(
        status["message"].as_str().is_some_and(
            |m| m.ends_with("must have cluster-admin privileges to use the aggregationRule")
        ),
        "{status}"
    );
    let (code, status) = call(
        &bob,
        "POST",
        &format!("{RBAC}/clusterroles"),
        JSON,
        Some(role("ClusterRole", "all", all_rule())),
    )
    .await;
    assert_escalation_refused(code, &status, "a * ClusterRole");
    let (_, admin_role) =
        call(&admin, "GET", &format!("{RBAC}/clusterroles/admin"), JSON, None).await;
    assert_eq!(
        admin_role["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    let grants_rolebindings = admin_role["rules"].as_array().is_some_and(|rules| {
        rules
            .iter()
            .any(|r| r["resources"].as_array().is_some_and(|x| x.contains(&json!("rolebindings"))))
    });
    assert!(grants_rolebindings, "admin's rules are aggregated at bootstrap: {admin_role}");
}

/// The peak resident memory of this process (the in-process server's included), in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Item 2: 21 `copy` operations of 1 KiB, each doubling the document, took over 3 GiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubling_json_patch_is_refused_with_bounded_work() {
    let server = TestServer::start();
    let c = client(&server).await;
    let path = "/api/v1/namespaces/default/configmaps/seed";
    created(
        &c,
        "/api/v1/namespaces/default/configmaps",
        json!({"metadata": {"name": "seed", "annotations": {"a": "x".repeat(1024)}}}),
    )
    .await;
    let before = peak_rss_kib();
    let mut ops = vec![
        json!({"op": "copy", "from": "/metadata/annotations/a", "path": "/metadata/annotations/b"}),
    ];
    for i in 0..20 {
        ops.push(
            json!({"op": "copy", "from": "/metadata", "path": format!("/metadata/labels{i}")}),
        );
    }
    let started = Instant::now();
    let (code, status) = call(&c, "PATCH", path, JSON_PATCH, Some(json!(ops))).await;
    assert_eq!(code, 422, "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("the accumulated size increase of copy")),
        "{status}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 512 * 1024, "the patch took {grown} KiB");
    // Upstream's cap on the number of operations, before any is applied.
    let many = vec![json!({"op": "test", "path": "/metadata/name", "value": "seed"}); 10_001];
    let (code, status) = call(&c, "PATCH", path, JSON_PATCH, Some(json!(many))).await;
    assert_eq!((code, status["reason"].as_str()), (413, Some("RequestEntityTooLarge")), "{status}");
    assert_eq!(
        status["message"],
        "The allowed maximum operations in a JSON patch is 10000, got 10001"
    );
    let (code, _) = call(&c, "GET", path, JSON, None).await;
    assert_eq!(code, 200, "the server is still there");
}

/// Item 3: a 7 KB patch stored a 41 MiB Deployment. Every write path now stops at etcd's
/// 1.5 MiB request limit, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_over_the_store_limit_are_refused_on_every_write_path() {
    let server = TestServer::start();
    let c = client(&server).await;
    let deploys = "/apis/apps/v1/namespaces/default/deployments";
    let path = format!("{deploys}/big");
    let deployment = |args: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big"},
               "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                   "metadata": {"labels": {"a": "b"}},
                   "spec": {"containers": [{"name": "c", "image": "i", "args": args}]}}}})
    };
    created(&c, deploys, deployment(json!(["x".repeat(64 * 1024)]))).await;
    let (_, original) = call(&c, "GET", &path, JSON, None).await;
    let too_large = |code: u16, status: &Value, what: &str| {
        assert_eq!(code, 413, "{what}: {status}");
        assert_eq!(status["reason"], "RequestEntityTooLarge", "{what}: {status}");
        assert_eq!(status["message"], "etcdserver: request is too large", "{what}");
    };
    // The small patch: 30 copies of a 64 KiB argument make a 2 MiB Deployment.
    let arg = "/spec/template/spec/containers/0/args";
    let ops: Vec<Value> = (0..30)
        .map(|_| json!({"op": "copy", "from": format!("{arg}/0"), "path": format!("{arg}/-")}))
        .collect();
    let body = serde_json::to_vec(&ops).expect("json");
    assert!(body.len() < 4096);
    let (code, status) = call_raw(&c, "PATCH", &path, JSON_PATCH, body).await;
    too_large(code, &status, "json patch");
    let big = json!(["y".repeat(2 << 20)]);
    let template_patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "args": big}]}}}});
    let (code, status) = call(&c, "PATCH", &path, MERGE_PATCH, Some(template_patch.clone())).await;
    too_large(code, &status, "merge patch");
    let (code, status) =
        call(&c, "PATCH", &path, "application/strategic-merge-patch+json", Some(template_patch))
            .await;
    too_large(code, &status, "strategic merge patch");
    let mut replaced = original.clone();
    replaced["spec"]["template"]["spec"]["containers"][0]["args"] = big.clone();
    let (code, status) = call(&c, "PUT", &path, JSON, Some(replaced)).await;
    too_large(code, &status, "update");
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=hostile&force=true"),
        "application/apply-patch+yaml",
        Some(deployment(big.clone())),
    )
    .await;
    too_large(code, &status, "apply");
    let mut other = deployment(big.clone());
    other["metadata"]["name"] = json!("huge");
    let (code, status) = call(&c, "POST", deploys, JSON, Some(other)).await;
    too_large(code, &status, "create");
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}/status"),
        MERGE_PATCH,
        Some(json!({"status": {"conditions": [{"type": "Progressing", "status": "True", "message": "z".repeat(2 << 20)}]}})),
    )
    .await;
    too_large(code, &status, "status patch");
    // Nothing of it was stored.
    let (_, now) = call(&c, "GET", &path, JSON, None).await;
    assert_eq!(now["spec"], original["spec"]);
    assert_eq!(now["metadata"]["resourceVersion"], original["metadata"]["resourceVersion"]);
    let (code, _) = call(&c, "GET", &format!("{deploys}/huge"), JSON, None).await;
    assert_eq!(code, 404);
    // Kinds with limits of their own keep upstream's 422s: annotations, ConfigMap data.
    let (code, status) = call(
        &c,
        "PATCH",
        &path,
        MERGE_PATCH,
        Some(json!({"metadata": {"annotations": {"a": "z".repeat(300 * 1024)}}})),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("Too long: may not be more than 262144 bytes")),
        "{status}"
    );
}

async fn readyz_within(c: &Client, limit: Duration) -> Duration {
    let started = Instant::now();
    let (code, _) =
        tokio::time::timeout(limit, call_raw(c, "GET", "/readyz", "text/plain", Vec::new()))
            .await
            .unwrap_or_else(|_| panic!("/readyz did not answer within {limit:?}"));
    assert_eq!(code, 200);
    started.elapsed()
}

/// Item 4: a 200 KB YAML body nested 100k deep took 27 CPU-seconds, and two at once made
/// /readyz fail for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_yaml_is_refused_in_linear_time() {
    let server = TestServer::start();
    let c = client(&server).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let bodies = [
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        format!("{}{}", "{a: ".repeat(40_000), "}".repeat(40_000)),
        format!("metadata: {}{}", "{a: [".repeat(20_000), "]}".repeat(20_000)),
    ];
    for body in &bodies {
        let started = Instant::now();
        let (code, status) =
            call_raw(&c, "POST", cms, "application/yaml", body.clone().into_bytes()).await;
        assert_eq!(code, 400, "{status}");
        assert_eq!(status["kind"], "Status");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
    // Several at once leave the server answering.
    let attacks: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            let body = bodies[i % bodies.len()].clone().into_bytes();
            tokio::spawn(async move { call_raw(&c, "POST", cms, "application/yaml", body).await.0 })
        })
        .collect();
    readyz_within(&c, Duration::from_secs(5)).await;
    for a in attacks {
        assert_eq!(a.await.expect("attack"), 400);
    }
    // Real YAML still decodes.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\ndata:\n  script: |\n    if [ -f x ]; then echo '{'; fi\n  list: \"[[[\"\n";
    let (code, out) = call_raw(&c, "POST", cms, "application/yaml", yaml.as_bytes().to_vec()).await;
    assert_eq!(code, 201, "{out}");
}

/// Item 5: out-of-range integers panicked handlers (the caller saw a dropped connection).
/// Every integer parameter at its extremes gets an HTTP answer with a Status, never a
/// panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_parameters_at_their_extremes_never_panic_a_handler() {
    let server = TestServer::start();
    let c = client(&server).await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}})
    };
    let extremes = [
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
        "10000000000000",
        "-1",
        "0",
        "1.5",
        "x",
    ];
    let mut n = 0;
    for v in extremes {
        // The ones that broke: grace periods on delete, in the query and in the body.
        n += 1;
        let name = format!("q{n}");
        created(&c, pods, pod(&name)).await;
        let (code, out) =
            call(&c, "DELETE", &format!("{pods}/{name}?gracePeriodSeconds={v}"), JSON, None).await;
        assert!(matches!(code, 200 | 400), "gracePeriodSeconds={v}: {code} {out}");
        if code == 200 && v.len() > 12 && !v.starts_with('-') {
            assert_eq!(out["metadata"]["deletionTimestamp"], "9999-12-30T22:00:00Z", "{out}");
        }
        let body = format!(r#"{{"gracePeriodSeconds": {v}}}"#);
        n += 1;
        let name = format!("b{n}");
        created(&c, pods, pod(&name)).await;
        let (code, out) =
            call_raw(&c, "DELETE", &format!("{pods}/{name}"), JSON, body.clone().into_bytes())
                .await;
        assert!(matches!(code, 200 | 400), "body {body}: {code} {out}");
        assert!(out["kind"] == "Pod" || out["kind"] == "Status", "{out}");
        // Eviction with the same DeleteOptions.
        n += 1;
        let name = format!("e{n}");
        created(&c, pods, pod(&name)).await;
        let eviction = format!(
            r#"{{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {{"name": "{name}"}}, "deleteOptions": {body}}}"#
        );
        let (code, out) =
            call_raw(&c, "POST", &format!("{pods}/{name}/eviction"), JSON, eviction.into_bytes())
                .await;
        assert!(matches!(code, 201 | 400 | 422), "eviction {body}: {code} {out}");
        assert_eq!(out["kind"], "Status", "{out}");
        // The query parameters of lists, watches and logs.
        for (path, param) in [
            (format!("{pods}?limit={v}"), "limit"),
            (format!("{pods}?watch=1&timeoutSeconds={v}"), "timeoutSeconds"),
            (
                format!("/api/v1/watch/namespaces/default/configmaps?timeoutSeconds={v}"),
                "timeoutSeconds",
            ),
            (format!("{pods}/b{}/log?tailLines={v}", n - 1), "tailLines"),
            (format!("{pods}/b{}/log?sinceSeconds={v}", n - 1), "sinceSeconds"),
            (format!("{pods}/b{}/log?limitBytes={v}", n - 1), "limitBytes"),
            (format!("{pods}?gracePeriodSeconds={v}"), "gracePeriodSeconds (collection)"),
        ] {
            let method = if param.starts_with("gracePeriodSeconds") { "DELETE" } else { "GET" };
            let req = http::Request::builder()
                .method(method)
                .uri(&path)
                .body(kube::client::Body::empty())
                .expect("request");
            // Only the head: a watch that was accepted streams until its timeout.
            let resp = tokio::time::timeout(Duration::from_secs(10), c.send(req))
                .await
                .unwrap_or_else(|_| panic!("{method} {path}: no answer"))
                .unwrap_or_else(|e| {
                    panic!("{method} {path}: {e} (a panicked handler drops the connection)")
                });
            let code = resp.status().as_u16();
            assert!(code < 500 || code == 503, "{method} {path}: {code}");
        }
    }
    // The server is fine afterwards.
    readyz_within(&c, Duration::from_secs(5)).await;
}

/// Item 6: a Job with `activeDeadlineSeconds: 300000000000`, or a pod condition at year
/// 9999 with `minReadySeconds`, overflowed time arithmetic; the panic stopped every workload
/// controller, health stayed green, and it recurred after restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_at_the_ends_of_time_stop_no_controller() {
    let server = TestServer::start_with_controllers();
    let c = client(&server).await;
    let ns = "/apis/batch/v1/namespaces/default";
    let job = |name: &str, deadline: Option<i64>| {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
               "spec": {"activeDeadlineSeconds": deadline, "template": {"spec": {
                   "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    };
    created(&c, &format!("{ns}/jobs"), job("forever", Some(300_000_000_000))).await;
    let deploys = "/apis/apps/v1/namespaces/default/deployments";
    created(&c, deploys, json!({"metadata": {"name": "slow"}, "spec": {"replicas": 1, "minReadySeconds": 30,
        "selector": {"matchLabels": {"app": "slow"}},
        "template": {"metadata": {"labels": {"app": "slow"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})).await;
    let pods_of = |selector: &'static str| {
        let c = c.clone();
        async move {
            let (_, list) = call(
                &c,
                "GET",
                &format!("/api/v1/namespaces/default/pods?labelSelector={selector}"),
                JSON,
                None,
            )
            .await;
            list["items"].as_array().cloned().unwrap_or_default()
        }
    };
    let wait = |what: &str, ok: bool, started: Instant| {
        assert!(ok || started.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        ok
    };
    let started = Instant::now();
    while !wait("the Deployment's pod", !pods_of("app%3Dslow").await.is_empty(), started) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its pod ready since the end of time.
    let pod = &pods_of("app%3Dslow").await[0];
    let name = pod["metadata"]["name"].as_str().expect("name").to_string();
    let (code, out) = call(
        &c,
        "PATCH",
        &format!("/api/v1/namespaces/default/pods/{name}/status"),
        MERGE_PATCH,
        Some(json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "9999-12-30T00:00:00Z"}]}})),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    // The workload controllers go on: a Job and a scale-up are acted on.
    created(&c, &format!("{ns}/jobs"), job("next", None)).await;
    let (code, out) = call(
        &c,
        "PATCH",
        &format!("{deploys}/slow/scale"),
        MERGE_PATCH,
        Some(json!({"spec": {"replicas": 3}})),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    let started = Instant::now();
    while !wait(
        "the next Job's pod",
        !pods_of("batch.kubernetes.io%2Fjob-name%3Dnext").await.is_empty(),
        started,
    ) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    while !wait("the scale-up", pods_of("app%3Dslow").await.len() == 3, started) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, job) = call(&c, "GET", &format!("{ns}/jobs/forever"), JSON, None).await;
    assert!(job["status"]["startTime"].is_string(), "the Job was reconciled: {job}");
    // Every controller is healthy and listed.
    let (code, _) = call_raw(&c, "GET", "/healthz", "text/plain", Vec::new()).await;
    assert_eq!(code, 200);
    let req = http::Request::get("/readyz?verbose").body(Vec::new()).expect("req");
    let text = c.request_text(req).await.expect("readyz");
    for check in
        ["[+]controller-job ok", "[+]controller-deployment ok", "[+]controller-replicaset ok"]
    {
        assert!(text.contains(check), "{check} missing:\n{text}");
    }
}

/// A skiff-server process of its own, killed when dropped.
struct ServerProcess {
    child: Child,
    dir: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Start the binary on `port` with its data in `data` and its log at `log`, under a soft
/// open-file limit of `soft_nofile` (its hard limit stays).
fn spawn_server(
    data: &Path,
    log: &Path,
    port: u16,
    soft_nofile: u64,
    extra: &[&str],
) -> ServerProcess {
    let child = Command::new("prlimit")
        .arg(format!("--nofile={soft_nofile}:"))
        .arg(server_binary())
        .args(["--no-controllers", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("starting skiff-server under prlimit");
    ServerProcess { child, dir: data.to_path_buf(), log: log.to_path_buf() }
}

async fn wait_for_client(p: &mut ServerProcess) -> Client {
    let kubeconfig = p.dir.join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!(
                "skiff-server exited ({status}): {}",
                std::fs::read_to_string(&p.log).unwrap_or_default()
            );
        }
        if kubeconfig.exists() {
            let c = client_from(&kubeconfig).await;
            if c.apiserver_version().await.is_ok() {
                return c;
            }
        }
        assert!(Instant::now() < deadline, "skiff-server did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Item 7: 1,100 connections that never finished their TLS handshake made /readyz fail
/// (the descriptors ran out). The server raises its open-file limit, drops connections that
/// do not handshake in time, and refuses past its limit with a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_exhaust_file_descriptors() {
    // This process holds the silent connections: it needs the descriptors itself.
    skiff_control_plane::server::raise_open_file_limit();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut server =
        spawn_server(&dir.path().join("data"), &dir.path().join("server.log"), port, 1024, &[]);
    let c = wait_for_client(&mut server).await;
    let mut silent = Vec::new();
    for _ in 0..1100 {
        silent.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect"));
    }
    let fresh = client_from(&server.dir.join("admin.kubeconfig")).await;
    readyz_within(&fresh, Duration::from_secs(10)).await;
    // The silent ones are closed after the handshake timeout (10 s).
    let mut first = silent.pop().expect("one");
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncReadExt::read(&mut first, &mut buf),
    )
    .await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "a silent connection stayed open: {closed:?}"
    );
    drop(silent);
    drop(c);

    // Past an explicit limit, connections are refused and the log says so.
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut limited = spawn_server(
        &dir.path().join("data"),
        &dir.path().join("server.log"),
        port,
        1024,
        &["--max-connections", "20"],
    );
    let _c = wait_for_client(&mut limited).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&limited.log).unwrap_or_default();
        if log.contains("connection limit reached") {
            assert!(log.contains("limit=20"), "{log}");
            break;
        }
        assert!(Instant::now() < deadline, "no log line about the limit:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
    // Once they are gone, clients get in again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fresh = client_from(&limited.dir.join("admin.kubeconfig")).await;
        if fresh.apiserver_version().await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the limit never freed up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount");
        assert!(ok.success(), "mounting a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fill the file system holding `dir` (a file of zeros until ENOSPC).
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 1 << 16];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

/// Also in the issue: after the data disk filled, writes kept failing after space was
/// freed, until the process was restarted. Now the server exits when its store cannot
/// write any more (so its supervisor restarts it), and the restarted one serves everything
/// it had acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_ends_in_a_restart_that_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    let _fs = Tmpfs::mount(&mnt, "64m");
    let port = free_port();
    let data = mnt.join("data");
    let mut server = spawn_server(&data, &dir.path().join("server.log"), port, 4096, &[]);
    let c = wait_for_client(&mut server).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    created(&c, cms, json!({"metadata": {"name": "before"}, "data": {"v": "1"}})).await;
    let filler = fill(&mnt);
    // Writes until the store gives up (a checkpoint or log write hits ENOSPC).
    let mut acknowledged = vec!["before".to_string()];
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "skiff-server kept running on a full disk");
        let name = format!("cm{}", acknowledged.len());
        let body = json!({"metadata": {"name": name}, "data": {"v": "z".repeat(64 * 1024)}});
        let req = http::Request::post(cms)
            .header("content-type", JSON)
            .body(kube::client::Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("req");
        if let Ok(resp) = c.send(req).await
            && resp.status().as_u16() == 201
        {
            acknowledged.push(name);
        }
    };
    assert!(!status.success(), "it exited with a failure status");
    let log = std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(log.contains("exiting so that skiff-server is restarted"), "{log}");
    // Space comes back; the supervisor's restart serves again, with what was acknowledged.
    std::fs::remove_file(filler).expect("free space");
    let mut restarted = spawn_server(&data, &dir.path().join("restarted.log"), port, 4096, &[]);
    let c = wait_for_client(&mut restarted).await;
    for name in &acknowledged {
        let (code, _) = call(&c, "GET", &format!("{cms}/{name}"), JSON, None).await;
        assert_eq!(code, 200, "{name} was acknowledged before the disk filled");
    }
    created(&c, cms, json!({"metadata": {"name": "after"}, "data": {"v": "2"}})).await;
}
