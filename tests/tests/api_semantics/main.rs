//! API semantics over real HTTPS with kube-rs' raw requests: concurrency, selectors,
//! paging, watch ordering/bookmarks/initial events, deletion, dry run, bad input; and in
//! `hostile`, the requests that once broke skiff.

mod hostile;

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use skiff_tests::TestServer;

async fn client(server: &TestServer) -> Client {
    let kc = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Send a request; returns (status, body as JSON).
async fn call(
    client: &Client,
    method: &str,
    path: &str,
    ct: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let bytes = body.map(|b| serde_json::to_vec(&b).expect("json")).unwrap_or_default();
    call_raw(client, method, path, ct, bytes).await
}

async fn call_raw(
    client: &Client,
    method: &str,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = client.send(req).await.expect("send");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

const JSON: &str = "application/json";

fn cm(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_concurrency_and_metadata() {
    let server = TestServer::start();
    let c = client(&server).await;
    let (code, created) =
        call(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON, Some(cm("a", json!({}))))
            .await;
    assert_eq!(code, 201);
    let meta = &created["metadata"];
    assert!(meta["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert!(meta["creationTimestamp"].is_string());
    assert!(meta["managedFields"].is_array());
    let rv = meta["resourceVersion"].as_str().expect("rv").to_string();

    // Update with the current RV works; with a stale one is 409 Conflict.
    let mut next = created.clone();
    next["data"]["k"] = json!("v2");
    let (code, updated) =
        call(&c, "PUT", "/api/v1/namespaces/default/configmaps/a", JSON, Some(next.clone())).await;
    assert_eq!(code, 200, "{updated}");
    assert_ne!(updated["metadata"]["resourceVersion"].as_str(), Some(rv.as_str()));
    let (code, status) =
        call(&c, "PUT", "/api/v1/namespaces/default/configmaps/a", JSON, Some(next)).await;
    assert_eq!(code, 409);
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["code"], 409);

    // generation moves with spec changes only.
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    });
    let (code, d) =
        call(&c, "POST", "/apis/apps/v1/namespaces/default/deployments", JSON, Some(dep)).await;
    assert_eq!(code, 201, "{d}");
    assert_eq!(d["metadata"]["generation"], 1);
    let (_, d) = call(
        &c,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "application/merge-patch+json",
        Some(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await;
    assert_eq!(d["metadata"]["generation"], 1, "label change keeps generation");
    let (_, d) = call(
        &c,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d",
        "application/json-patch+json",
        Some(json!([{"op": "replace", "path": "/spec/replicas", "value": 3}])),
    )
    .await;
    assert_eq!(d["metadata"]["generation"], 2, "spec change bumps generation");
    // A status write does not bump it and does not touch spec.
    let mut st = d.clone();
    st["status"] = json!({"replicas": 3, "observedGeneration": 2});
    st["spec"]["replicas"] = json!(9);
    let (code, s) =
        call(&c, "PUT", "/apis/apps/v1/namespaces/default/deployments/d/status", JSON, Some(st))
            .await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["status"]["replicas"], 3);
    assert_eq!(s["spec"]["replicas"], 3);
    assert_eq!(s["metadata"]["generation"], 2);
    // And a main-resource write cannot change status.
    let mut m = s.clone();
    m["status"]["replicas"] = json!(0);
    let (_, m) =
        call(&c, "PUT", "/apis/apps/v1/namespaces/default/deployments/d", JSON, Some(m)).await;
    assert_eq!(m["status"]["replicas"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_and_paging() {
    let server = TestServer::start();
    let c = client(&server).await;
    for i in 0..7 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        call(
            &c,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            JSON,
            Some(cm(&format!("c{i}"), json!({"tier": tier}))),
        )
        .await;
    }
    let (_, l) = call(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=tier%3Dfront",
        JSON,
        None,
    )
    .await;
    assert_eq!(l["items"].as_array().map(Vec::len), Some(4));
    let (_, l) = call(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=tier+notin+(front)",
        JSON,
        None,
    )
    .await;
    assert_eq!(l["items"].as_array().map(Vec::len), Some(3));
    let (_, l) =
        call(&c, "GET", "/api/v1/configmaps?fieldSelector=metadata.name%3Dc3", JSON, None).await;
    assert_eq!(l["items"][0]["metadata"]["name"], "c3");
    let (code, e) =
        call(&c, "GET", "/api/v1/configmaps?fieldSelector=spec.nope%3D1", JSON, None).await;
    assert_eq!((code, e["reason"].as_str()), (400, Some("BadRequest")));

    // limit/continue walk every item exactly once.
    let mut names = Vec::new();
    let mut path = "/api/v1/namespaces/default/configmaps?limit=3".to_string();
    let mut pages = 0;
    loop {
        let (code, page) = call(&c, "GET", &path, JSON, None).await;
        assert_eq!(code, 200, "{page}");
        pages += 1;
        for item in page["items"].as_array().expect("items") {
            names.push(item["metadata"]["name"].as_str().expect("name").to_string());
        }
        match page["metadata"]["continue"].as_str() {
            Some(token) => {
                path = format!("/api/v1/namespaces/default/configmaps?limit=3&continue={token}")
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());
}

/// Every page of a paginated list shows the collection at the revision of the first page,
/// whatever changed in between; `resourceVersionMatch=Exact` reads that revision too. Once
/// the watch cache's history no longer reaches it, the continue token is refused as
/// upstream does (410 Expired), with a token that goes on at the latest revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_lists_are_one_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = skiff_control_plane::server::ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Default::default()
    };
    config.api.watch_history = 20;
    let server = TestServer::start_with(dir, config);
    let c = client(&server).await;
    let base = "/api/v1/namespaces/default/configmaps";
    let mut created = Vec::new();
    for i in 0..6 {
        let (code, o) = call(&c, "POST", base, JSON, Some(cm(&format!("c{i}"), json!({})))).await;
        assert_eq!(code, 201, "{o}");
        created.push((format!("c{i}"), o["metadata"]["resourceVersion"].clone()));
    }
    let named = |page: &Value| -> Vec<(String, Value)> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    o["metadata"]["resourceVersion"].clone(),
                )
            })
            .collect()
    };
    let (_, first) = call(&c, "GET", &format!("{base}?limit=2"), JSON, None).await;
    assert_eq!(named(&first), created[..2]);
    let rv = first["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    let token = first["metadata"]["continue"].as_str().expect("continue").to_string();

    // Between the pages: one not yet listed changes, one goes, one is added among them.
    let mut c2 = cm("c2", json!({}));
    c2["data"]["k"] = json!("changed");
    let (code, o) = call(&c, "PUT", &format!("{base}/c2"), JSON, Some(c2)).await;
    assert_eq!(code, 200, "{o}");
    let (code, o) = call(&c, "DELETE", &format!("{base}/c4"), JSON, None).await;
    assert_eq!(code, 200, "{o}");
    let (code, o) = call(&c, "POST", base, JSON, Some(cm("c1a", json!({})))).await;
    assert_eq!(code, 201, "{o}");

    let (code, second) =
        call(&c, "GET", &format!("{base}?limit=2&continue={token}"), JSON, None).await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(named(&second), created[2..4]);
    assert_eq!(second["items"][0]["data"]["k"], "v", "c2 as it was");
    assert_eq!(second["metadata"]["resourceVersion"], rv.as_str());
    assert_eq!(second["metadata"]["remainingItemCount"], 2);
    let token2 = second["metadata"]["continue"].as_str().expect("continue").to_string();
    let (_, third) =
        call(&c, "GET", &format!("{base}?limit=2&continue={token2}"), JSON, None).await;
    assert_eq!(named(&third), created[4..]);
    assert!(third["metadata"].get("continue").is_none(), "{third}");

    let exact = format!("{base}?resourceVersion={rv}&resourceVersionMatch=Exact");
    let (code, at) = call(&c, "GET", &exact, JSON, None).await;
    assert_eq!(code, 200, "{at}");
    assert_eq!(named(&at), created);
    assert_eq!(at["metadata"]["resourceVersion"], rv.as_str());
    let (_, now) = call(&c, "GET", base, JSON, None).await;
    let names: Vec<String> = named(&now).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["c0", "c1", "c1a", "c2", "c3", "c5"]);

    // Options upstream refuses (ValidateListOptions).
    for (query, message) in [
        (
            "resourceVersionMatch=Exact",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "sendInitialEvents=true",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
    ] {
        let (code, s) = call(&c, "GET", &format!("{base}?{query}"), JSON, None).await;
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{query}: {s}");
        assert_eq!(
            s["message"],
            format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
            "{s}"
        );
        assert_eq!(s["details"]["kind"], "ListOptions", "{s}");
    }

    // Enough changes that the history of 20 events no longer reaches the first page.
    for i in 0..25 {
        let mut c5 = cm("c5", json!({}));
        c5["data"]["k"] = json!(i.to_string());
        let (code, o) = call(&c, "PUT", &format!("{base}/c5"), JSON, Some(c5)).await;
        assert_eq!(code, 200, "{o}");
    }
    let (code, s) = call(&c, "GET", &format!("{base}?limit=2&continue={token}"), JSON, None).await;
    assert_eq!((code, s["reason"].as_str()), (410, Some("Expired")), "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("The provided continue parameter is too old"),
        "{s}"
    );
    let (code, _) = call(&c, "GET", &exact, JSON, None).await;
    assert_eq!(code, 410);
    // The token in the refusal lists the rest as it is now.
    let rest = s["metadata"]["continue"].as_str().expect("a token to go on with");
    let (code, rest) = call(&c, "GET", &format!("{base}?continue={rest}"), JSON, None).await;
    assert_eq!(code, 200, "{rest}");
    let names: Vec<String> = named(&rest).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["c1a", "c2", "c3", "c5"]);
    assert_eq!(rest["items"][3]["data"]["k"], "24");
}

async fn read_events(c: &Client, path: &str, n: usize) -> Vec<Value> {
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let stream = c.request_stream(req).await.expect("watch");
    let mut lines = stream.lines();
    let mut out = Vec::new();
    while out.len() < n {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next())
            .await
            .unwrap_or_else(|_| panic!("timed out after {} events: {out:?}", out.len()))
            .expect("stream ended")
            .expect("line");
        out.push(serde_json::from_str(&line).expect("one JSON event per line"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_revision_is_complete_and_ordered() {
    let server = TestServer::start();
    let c = client(&server).await;
    let (_, first) =
        call(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON, Some(cm("w0", json!({}))))
            .await;
    let rv0 = first["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    for i in 1..5 {
        call(
            &c,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            JSON,
            Some(cm(&format!("w{i}"), json!({}))),
        )
        .await;
    }
    call(&c, "DELETE", "/api/v1/namespaces/default/configmaps/w1", JSON, None).await;
    // From rv0: exactly the four later creates and the delete, in order, no duplicates.
    let events = read_events(
        &c,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv0}"),
        5,
    )
    .await;
    let got: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_string(),
                e["object"]["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("ADDED".into(), "w1".into()),
            ("ADDED".into(), "w2".into()),
            ("ADDED".into(), "w3".into()),
            ("ADDED".into(), "w4".into()),
            ("DELETED".into(), "w1".into())
        ]
    );
    let rvs: Vec<i64> = events
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"].as_str().unwrap_or("0").parse().unwrap_or(0)
        })
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "strictly increasing: {rvs:?}");

    // Without a resourceVersion: synthetic ADDED for what exists.
    let events = read_events(&c, "/api/v1/namespaces/default/configmaps?watch=true", 4).await;
    assert!(events.iter().all(|e| e["type"] == "ADDED"));

    // sendInitialEvents: the initial state, then a bookmark marking its end.
    let events = read_events(
        &c,
        "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        5,
    )
    .await;
    assert_eq!(events[4]["type"], "BOOKMARK");
    assert_eq!(events[4]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_keep_idle_watches_alive() {
    let server = TestServer::start();
    let c = client(&server).await;
    let (_, l) = call(&c, "GET", "/api/v1/namespaces/default/configmaps", JSON, None).await;
    let rv = l["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    let events = read_events(
        &c,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"),
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(events[0]["object"]["kind"], "ConfigMap");
    assert!(events[0]["object"]["metadata"]["resourceVersion"].as_str().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_dry_run_and_bad_input() {
    let server = TestServer::start();
    let c = client(&server).await;
    // dryRun creates nothing.
    let (code, _) = call(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?dryRun=All",
        JSON,
        Some(cm("dry", json!({}))),
    )
    .await;
    assert_eq!(code, 201);
    let (code, _) = call(&c, "GET", "/api/v1/namespaces/default/configmaps/dry", JSON, None).await;
    assert_eq!(code, 404);

    // Finalizers hold an object in Terminating until they are removed.
    let mut f = cm("fin", json!({}));
    f["metadata"]["finalizers"] = json!(["example.com/hold"]);
    call(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON, Some(f)).await;
    let (code, o) =
        call(&c, "DELETE", "/api/v1/namespaces/default/configmaps/fin", JSON, None).await;
    assert_eq!(code, 200);
    assert!(o["metadata"]["deletionTimestamp"].is_string(), "{o}");
    let (code, _) = call(&c, "GET", "/api/v1/namespaces/default/configmaps/fin", JSON, None).await;
    assert_eq!(code, 200, "still there while the finalizer holds");
    let (code, _) = call(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/fin",
        "application/merge-patch+json",
        Some(json!({"metadata": {"finalizers": null}})),
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = call(&c, "GET", "/api/v1/namespaces/default/configmaps/fin", JSON, None).await;
    assert_eq!(code, 404, "gone once the last finalizer is removed");

    // Pods on a node are deleted gracefully; unscheduled ones at once.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}});
    call(&c, "POST", "/api/v1/namespaces/default/pods", JSON, Some(pod)).await;
    let (code, o) = call(&c, "DELETE", "/api/v1/namespaces/default/pods/p", JSON, None).await;
    assert_eq!(code, 200);
    assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 30, "{o}");
    let (code, _) = call(
        &c,
        "DELETE",
        "/api/v1/namespaces/default/pods/p",
        JSON,
        Some(json!({"gracePeriodSeconds": 0})),
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = call(&c, "GET", "/api/v1/namespaces/default/pods/p", JSON, None).await;
    assert_eq!(code, 404);

    // Malformed bodies are 400 Status; unknown content types 415; nothing stored.
    let (code, s) = call_raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        b"{\"metadata\":".to_vec(),
    )
    .await;
    assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")));
    for ct in ["application/x-nope", "text/plain", "application/merge-patch+json"] {
        let body = br#"{"metadata":{"name":"typed"}}"#.to_vec();
        let (code, s) =
            call_raw(&c, "POST", "/api/v1/namespaces/default/configmaps", ct, body).await;
        assert_eq!((code, s["reason"].as_str()), (415, Some("UnsupportedMediaType")), "{ct}");
        assert_eq!(
            s["message"],
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
    }
    // A PATCH names the patch types.
    let (code, s) =
        call_raw(&c, "PATCH", "/api/v1/namespaces/default/configmaps/u", JSON, b"{}".to_vec())
            .await;
    assert_eq!(code, 415, "{s}");
    assert_eq!(
        s["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
    );
    let (code, s) = call_raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/vnd.kubernetes.protobuf",
        b"k8s\x00garbage".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    let big = vec![b' '; 4 * 1024 * 1024];
    let (code, _) = call_raw(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON, big).await;
    assert_eq!(code, 413);
    let (code, s) = call(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON,
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": 5}}))).await;
    assert_eq!(code, 400, "wrongly typed value: {s}");
    let (_, l) = call(&c, "GET", "/api/v1/namespaces/default/configmaps", JSON, None).await;
    assert_eq!(
        l["items"].as_array().map(Vec::len),
        Some(0),
        "nothing stored from rejected requests: {l}"
    );

    // Strict field validation rejects unknown fields; Warn accepts with a warning.
    let mut unknown = cm("u", json!({}));
    unknown["bogus"] = json!(1);
    let (code, _) = call(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        JSON,
        Some(unknown.clone()),
    )
    .await;
    assert_eq!(code, 400);
    let (code, o) = call(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Warn",
        JSON,
        Some(unknown),
    )
    .await;
    assert_eq!(code, 201);
    assert!(o.get("bogus").is_none(), "unknown fields are dropped");

    // A 422 names the field once: in `field`, not again in the cause's message (kubectl
    // prints "field: message").
    let (code, s) = call(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        JSON,
        Some(cm("badlabel", json!({"bad key": "1"}))),
    )
    .await;
    assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{s}");
    let cause = &s["details"]["causes"][0];
    assert_eq!(cause["field"], "metadata.labels", "{s}");
    let message = cause["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("Invalid value: \"bad key\": "), "{s}");

    // A patch may not rename the object (upstream's checkName); nothing is written.
    let path = "/api/v1/namespaces/default/configmaps/u";
    let (code, s) = call(
        &c,
        "PATCH",
        path,
        "application/merge-patch+json",
        Some(json!({"metadata": {"name": "other"}})),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"], "the name of the object (other) does not match the name on the URL (u)",
        "{s}"
    );
    let (code, _) =
        call(&c, "GET", "/api/v1/namespaces/default/configmaps/other", JSON, None).await;
    assert_eq!(code, 404);

    // A dry-run patch answers with the revision it read.
    let (_, live) = call(&c, "GET", path, JSON, None).await;
    let (code, o) = call(
        &c,
        "PATCH",
        &format!("{path}?dryRun=All"),
        "application/merge-patch+json",
        Some(json!({"data": {"k": "dry"}})),
    )
    .await;
    assert_eq!(code, 200, "{o}");
    assert_eq!(o["data"]["k"], "dry", "{o}");
    assert_eq!(o["metadata"]["resourceVersion"], live["metadata"]["resourceVersion"], "{o}");

    // PatchOptions as upstream validates them, before the body is read.
    let (code, s) = call(
        &c,
        "PATCH",
        &format!("{path}?force=true"),
        "application/merge-patch+json",
        Some(json!({"data": {"k": "forced"}})),
    )
    .await;
    assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{s}");
    assert_eq!(
        s["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );
    let apply = "application/apply-patch+yaml";
    let config = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "u", "namespace": "default"}
    });
    let (code, s) = call(&c, "PATCH", path, apply, Some(config.clone())).await;
    assert_eq!(code, 422, "{s}");
    assert_eq!(
        s["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    // An apply configuration holds only the kind's fields, whatever the fieldValidation, and
    // names its apiVersion and kind (upstream's field manager).
    let mut bogus = config.clone();
    bogus["data"] = json!({"k": "applied"});
    bogus["bogus"] = json!(1);
    let (code, s) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=t&fieldValidation=Ignore"),
        apply,
        Some(bogus),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"],
        "failed to create typed patch object (default/u; /v1, Kind=ConfigMap): .bogus: field not declared in schema"
    );
    let (code, s) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=t"),
        apply,
        Some(json!({"metadata": {"name": "u"}})),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"],
        "Incorrect version specified in apply patch. Specified patch version: , expected: v1"
    );
    let (_, after) = call(&c, "GET", path, JSON, None).await;
    assert_eq!(after["data"], live["data"], "nothing applied");

    // A merge patch with an unknown field under Warn drops it with a warning.
    let req = http::Request::builder()
        .method("PATCH")
        .uri(format!("{path}?fieldValidation=Warn"))
        .header("content-type", "application/merge-patch+json")
        .body(kube::client::Body::from(br#"{"bogus":1}"#.to_vec()))
        .expect("request");
    let resp = c.send(req).await.expect("send");
    assert_eq!(resp.status(), 200);
    let warning = resp.headers().get("warning").and_then(|w| w.to_str().ok()).unwrap_or("");
    assert_eq!(warning, r#"299 - "unknown field \"bogus\"""#);

    // Empty metadata maps and lists are not kept, as upstream's types do not serialize them.
    let mut empty = cm("empties", json!({}));
    empty["metadata"]["annotations"] = json!({});
    empty["metadata"]["finalizers"] = json!([]);
    let (code, o) =
        call(&c, "POST", "/api/v1/namespaces/default/configmaps", JSON, Some(empty)).await;
    assert_eq!(code, 201, "{o}");
    for field in ["labels", "annotations", "finalizers"] {
        assert!(o["metadata"].get(field).is_none(), "{field}: {o}");
    }

    // A PUT may not move the object to another namespace either; nothing is written.
    let mut moved = live.clone();
    moved["metadata"]["namespace"] = json!("kube-system");
    moved["data"] = json!({"k": "moved"});
    let (code, s) = call(&c, "PUT", path, JSON, Some(moved)).await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"],
        "the namespace of the provided object does not match the namespace sent on the request",
        "{s}"
    );
    let (_, after) = call(&c, "GET", path, JSON, None).await;
    assert_eq!(after, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_lifecycle_and_binding() {
    let server = TestServer::start();
    let c = client(&server).await;
    let (code, s) =
        call(&c, "POST", "/api/v1/namespaces/nope/configmaps", JSON, Some(cm("a", json!({}))))
            .await;
    assert_eq!((code, s["reason"].as_str()), (404, Some("NotFound")));
    call(
        &c,
        "POST",
        "/api/v1/namespaces",
        JSON,
        Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})),
    )
    .await;
    let (code, ns) = call(&c, "DELETE", "/api/v1/namespaces/gone", JSON, None).await;
    assert_eq!(code, 200);
    assert_eq!(ns["status"]["phase"], "Terminating", "{ns}");
    let (code, s) =
        call(&c, "POST", "/api/v1/namespaces/gone/configmaps", JSON, Some(cm("a", json!({}))))
            .await;
    assert_eq!((code, s["reason"].as_str()), (403, Some("Forbidden")), "{s}");
    assert_eq!(
        s["message"],
        "configmaps \"a\" is forbidden: unable to create new content in namespace gone because it is being terminated"
    );
    assert_eq!(s["details"], json!({"name": "a", "kind": "configmaps"}));

    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let (_, created) = call(&c, "POST", "/api/v1/namespaces/default/pods", JSON, Some(pod)).await;
    // The field manager saw the request as decoded and defaulted (upstream's create handler):
    // it owns the defaulted container fields, not what admission (the service account token
    // volume, the default tolerations) or the strategy (status) added afterwards.
    let managed = &created["metadata"]["managedFields"];
    assert_eq!(managed.as_array().map(Vec::len), Some(1), "{managed}");
    let spec = &managed[0]["fieldsV1"]["f:spec"];
    assert!(spec["f:containers"]["k:{\"name\":\"c\"}"]["f:imagePullPolicy"].is_object(), "{spec}");
    assert!(spec.get("f:volumes").is_none() && spec.get("f:tolerations").is_none(), "{spec}");
    assert!(managed[0]["fieldsV1"].get("f:status").is_none(), "{managed}");
    assert!(created["spec"]["volumes"].is_array() && created["spec"]["tolerations"].is_array());
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "b"}, "target": {"kind": "Node", "name": "n1"}});
    let (code, _) =
        call(&c, "POST", "/api/v1/namespaces/default/pods/b/binding", JSON, Some(binding.clone()))
            .await;
    assert_eq!(code, 201);
    let (_, p) = call(&c, "GET", "/api/v1/namespaces/default/pods/b", JSON, None).await;
    assert_eq!(p["spec"]["nodeName"], "n1");
    assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled", "{p}");
    // A binding is a storage write past the field manager (upstream's assignPod).
    assert_eq!(&p["metadata"]["managedFields"], managed, "a binding leaves managedFields alone");
    let (code, _) =
        call(&c, "POST", "/api/v1/namespaces/default/pods/b/binding", JSON, Some(binding)).await;
    assert_eq!(code, 409, "a pod is bound once");
    let (_, pods) =
        call(&c, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", JSON, None).await;
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(1));
}

/// A protobuf message field (wire type 2) of `tag`.
fn pb_bytes(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![tag << 3 | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

/// A request body as client-go's protobuf serializer writes it: the magic, then a
/// `runtime.Unknown` naming apiVersion and kind around the encoded object.
fn pb_envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [pb_bytes(1, api_version.as_bytes()), pb_bytes(2, kind.as_bytes())].concat();
    [b"k8s\x00".to_vec(), pb_bytes(1, &type_meta), pb_bytes(2, raw)].concat()
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// pods/eviction (what `kubectl drain` posts): discovered as policy/v1 Eviction, checked
/// against the URL, and a delete with the Eviction's options; DELETE takes protobuf
/// DeleteOptions as client-go's typed clients send them.
#[tokio::test]
async fn evictions_and_protobuf_delete_options() {
    let server = TestServer::start();
    let c = client(&server).await;
    let (_, core) = call(&c, "GET", "/api/v1", JSON, None).await;
    let eviction = core["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == "pods/eviction"))
        .cloned();
    assert_eq!(
        eviction,
        Some(json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}))
    );
    let pods = "/api/v1/namespaces/default/pods";
    for name in ["bound", "unbound", "pb"] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let (code, _) = call(&c, "POST", pods, JSON, Some(pod)).await;
        assert_eq!(code, 201);
    }
    for name in ["bound", "pb"] {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"kind": "Node", "name": "n1"}});
        let (code, _) =
            call(&c, "POST", &format!("{pods}/{name}/binding"), JSON, Some(binding)).await;
        assert_eq!(code, 201);
    }
    let evict = |name: &str, options: Value| {
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"}, "deleteOptions": options})
    };

    let (code, s) =
        call(&c, "POST", &format!("{pods}/bound/eviction"), JSON, Some(evict("other", json!({}))))
            .await;
    assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")), "{s}");
    assert_eq!(s["message"], "name in URL does not match name in Eviction object");
    let (code, s) =
        call(&c, "POST", &format!("{pods}/gone/eviction"), JSON, Some(evict("gone", json!({}))))
            .await;
    assert_eq!((code, s["reason"].as_str()), (404, Some("NotFound")), "{s}");
    let (code, _) = call(
        &c,
        "POST",
        &format!("{pods}/bound/eviction?dryRun=All"),
        JSON,
        Some(evict("bound", json!({}))),
    )
    .await;
    assert_eq!(code, 201);
    let (_, p) = call(&c, "GET", &format!("{pods}/bound"), JSON, None).await;
    assert!(p["metadata"].get("deletionTimestamp").is_none(), "a dry run evicts nothing: {p}");

    // A bound pod terminates with the Eviction's grace period; an unbound one goes at once.
    let (code, s) = call(
        &c,
        "POST",
        &format!("{pods}/bound/eviction"),
        JSON,
        Some(evict("bound", json!({"gracePeriodSeconds": 7}))),
    )
    .await;
    assert_eq!(code, 201, "{s}");
    assert_eq!(
        s,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
    );
    let (_, p) = call(&c, "GET", &format!("{pods}/bound"), JSON, None).await;
    assert!(p["metadata"]["deletionTimestamp"].is_string(), "{p}");
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 7);
    let meta = [pb_bytes(1, b"unbound"), pb_bytes(3, b"default")].concat();
    let body = pb_envelope("policy/v1", "Eviction", &pb_bytes(1, &meta));
    let (code, s) = call_raw(&c, "POST", &format!("{pods}/unbound/eviction"), PROTOBUF, body).await;
    assert_eq!(code, 201, "{s}");
    let (code, _) = call(&c, "GET", &format!("{pods}/unbound"), JSON, None).await;
    assert_eq!(code, 404);

    // DeleteOptions in protobuf: gracePeriodSeconds (tag 1) = 3, and a bad propagationPolicy
    // (tag 4) is refused, so the options were read.
    let bad = pb_envelope("v1", "DeleteOptions", &pb_bytes(4, b"Sideways"));
    let (code, s) = call_raw(&c, "DELETE", &format!("{pods}/pb"), PROTOBUF, bad).await;
    assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{s}");
    let grace = pb_envelope("v1", "DeleteOptions", &[1 << 3, 3]);
    let (code, p) = call_raw(&c, "DELETE", &format!("{pods}/pb"), PROTOBUF, grace).await;
    assert_eq!(code, 200, "{p}");
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 3, "{p}");
}

/// default, kube-system and kube-public may not be deleted (upstream's NamespaceLifecycle);
/// a deleted `kubernetes` Service or kube-node-lease comes back (upstream's
/// kubernetes-service and system-namespaces controllers).
#[tokio::test]
async fn system_namespaces_and_the_kubernetes_service_stay() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = skiff_control_plane::server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        // The namespace controller finishes kube-node-lease's deletion.
        controllers: Some(Default::default()),
        ..Default::default()
    };
    config.api.bootstrap_repair_interval = Duration::from_millis(200);
    let server = TestServer::start_with(dir, config);
    let c = client(&server).await;
    for ns in ["default", "kube-system", "kube-public"] {
        for query in ["", "?dryRun=All"] {
            let path = format!("/api/v1/namespaces/{ns}{query}");
            let (code, s) = call(&c, "DELETE", &path, JSON, None).await;
            assert_eq!((code, s["reason"].as_str()), (403, Some("Forbidden")), "{s}");
            assert_eq!(
                s["message"],
                format!("namespaces \"{ns}\" is forbidden: this namespace may not be deleted")
            );
        }
    }
    let (_, before) =
        call(&c, "GET", "/api/v1/namespaces/default/services/kubernetes", JSON, None).await;
    let (code, _) =
        call(&c, "DELETE", "/api/v1/namespaces/default/services/kubernetes", JSON, None).await;
    assert_eq!(code, 200);
    let (code, _) = call(&c, "DELETE", "/api/v1/namespaces/kube-node-lease", JSON, None).await;
    assert_eq!(code, 200);
    let mut back = Value::Null;
    for _ in 0..100 {
        let (svc, s) =
            call(&c, "GET", "/api/v1/namespaces/default/services/kubernetes", JSON, None).await;
        let (ns, n) = call(&c, "GET", "/api/v1/namespaces/kube-node-lease", JSON, None).await;
        if svc == 200 && ns == 200 && n["status"]["phase"] == "Active" {
            back = s;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back.is_object(), "the kubernetes Service and kube-node-lease never came back");
    assert_ne!(back["metadata"]["uid"], before["metadata"]["uid"], "re-created: {back}");
    assert_eq!(back["spec"]["clusterIP"], before["spec"]["clusterIP"]);
    assert_eq!(back["spec"]["ports"], before["spec"]["ports"]);
}
