//! The proxy daemon driven by real kube-rs watch streams from an in-memory fake apiserver
//! (list + watch of Services and EndpointSlices over a tower service): Service and
//! EndpointSlice changes reach the pinned maps.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use skiff_proxy::daemon::{ProxyConfig, sync_forever};
use skiff_proxy::loader::Dataplane;
use skiff_proxy::maps::ServiceMaps;

/// Objects and a change log per collection, with one resourceVersion counter.
#[derive(Default)]
struct FakeApi {
    rv: u64,
    services: Vec<Value>,
    slices: Vec<Value>,
    /// (rv, collection, event type, object)
    log: Vec<(u64, &'static str, &'static str, Value)>,
}

impl FakeApi {
    fn put(&mut self, collection: &'static str, mut obj: Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let name = obj["metadata"]["name"].clone();
        let items = if collection == "services" { &mut self.services } else { &mut self.slices };
        let kind = match items.iter().position(|o| o["metadata"]["name"] == name) {
            Some(i) => {
                items[i] = obj.clone();
                "MODIFIED"
            }
            None => {
                items.push(obj.clone());
                "ADDED"
            }
        };
        self.log.push((self.rv, collection, kind, obj));
    }

    fn delete(&mut self, collection: &'static str, name: &str) {
        self.rv += 1;
        let items = if collection == "services" { &mut self.services } else { &mut self.slices };
        let i = items.iter().position(|o| o["metadata"]["name"] == name).expect("exists");
        let mut obj = items.remove(i);
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.log.push((self.rv, collection, "DELETED", obj));
    }

    fn respond(&self, path: &str, query: &str) -> Option<Vec<u8>> {
        let collection = if path.ends_with("/services") {
            "services"
        } else if path.ends_with("/endpointslices") {
            "endpointslices"
        } else {
            return None;
        };
        let param = |k: &str| {
            query.split('&').find_map(|kv| kv.strip_prefix(&format!("{k}="))).map(str::to_string)
        };
        if param("watch").as_deref() == Some("true") {
            let from: u64 = param("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let mut body = Vec::new();
            for (rv, c, kind, obj) in &self.log {
                if *rv > from && *c == collection {
                    body.extend(serde_json::to_vec(&json!({"type": kind, "object": obj})).ok()?);
                    body.push(b'\n');
                }
            }
            return Some(body);
        }
        let (kind, items) = if collection == "services" {
            ("ServiceList", &self.services)
        } else {
            ("EndpointSliceList", &self.slices)
        };
        serde_json::to_vec(&json!({
            "apiVersion": if collection == "services" { "v1" } else { "discovery.k8s.io/v1" },
            "kind": kind,
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        }))
        .ok()
    }
}

fn client(api: Arc<Mutex<FakeApi>>) -> kube::Client {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let api = api.clone();
        async move {
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or("").to_string();
            let is_watch = query.contains("watch=true");
            let mut body = api.lock().unwrap().respond(&path, &query);
            if is_watch && body.as_ref().is_some_and(|b| b.is_empty()) {
                // An idle watch: wait a little, then end it (the watcher re-watches from
                // its resourceVersion, like after a server-side timeout).
                tokio::time::sleep(Duration::from_millis(20)).await;
                body = api.lock().unwrap().respond(&path, &query);
            }
            let resp = match body {
                Some(b) => http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(b)),
                None => http::Response::builder().status(404).body(kube::client::Body::from(
                    br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
                        .to_vec(),
                )),
            };
            Ok::<_, Infallible>(resp.expect("response"))
        }
    });
    kube::Client::new(svc, "default")
}

fn wait_for(maps: &ServiceMaps, what: &str, ok: impl Fn(&ServiceMaps) -> bool) -> Duration {
    let t = Instant::now();
    while !ok(maps) {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed()
}

#[test]
fn watch_events_drive_the_maps() {
    let bpffs = BpffsDir::new();
    let pin = bpffs.path();
    let _dp = Dataplane::load(&pin, "192.168.77.1".parse().unwrap()).expect("load");
    let api = Arc::new(Mutex::new(FakeApi::default()));
    api.lock().unwrap().put(
        "services",
        serde_json::to_value(service("web", "10.96.0.10", "http", "TCP")).unwrap(),
    );
    api.lock().unwrap().put(
        "endpointslices",
        serde_json::to_value(endpoint_slice("web", "http", "TCP", &["10.0.1.1", "10.0.1.2"]))
            .unwrap(),
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = ProxyConfig { pin_dir: pin.clone(), ..ProxyConfig::default() };
    let daemon_maps = ServiceMaps::open_pinned(&pin).unwrap();
    let client = {
        let _in_runtime = rt.enter();
        client(api.clone())
    };
    let task = rt.spawn(async move {
        let mut maps = daemon_maps;
        sync_forever(client, &config, &mut maps).await
    });

    let maps = ServiceMaps::open_pinned(&pin).unwrap();
    let frontend_count = |m: &ServiceMaps| {
        m.services().unwrap().iter().find(|(k, _)| k.slot == 0).map(|(_, v)| v.count)
    };
    wait_for(&maps, "initial list in the maps", |m| frontend_count(m) == Some(2));
    assert_eq!(maps.backends().unwrap().len(), 2);

    api.lock().unwrap().put(
        "endpointslices",
        serde_json::to_value(endpoint_slice("web", "http", "TCP", &["10.0.1.2"])).unwrap(),
    );
    let took = wait_for(&maps, "endpoint removal", |m| {
        frontend_count(m) == Some(1) && m.backends().unwrap().len() == 1
    });
    eprintln!("endpoint removal reached the maps in {took:?}");

    api.lock().unwrap().delete("services", "web");
    wait_for(&maps, "service deletion", |m| m.services().unwrap().is_empty());
    assert!(maps.rev_nats().unwrap().is_empty());

    task.abort();
    rt.shutdown_timeout(Duration::from_secs(2));
}

/// A free loopback address (bound, then released for the server under test).
fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// GET `path` from `addr`: status code and body, or None while nothing listens.
fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, out.split_once("\r\n\r\n")?.1.to_string()))
}

#[test]
fn healthz_livez_and_kube_proxy_metrics_follow_the_syncs() {
    use skiff_proxy::status::ProxyStatus;
    let bpffs = BpffsDir::new();
    let pin = bpffs.path();
    let _dp = Dataplane::load(&pin, "192.168.77.1".parse().unwrap()).expect("load");
    let api = Arc::new(Mutex::new(FakeApi::default()));
    api.lock().unwrap().put(
        "services",
        serde_json::to_value(service("web", "10.96.0.10", "http", "TCP")).unwrap(),
    );
    let (health_addr, metrics_addr) = (free_addr(), free_addr());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = ProxyConfig { pin_dir: pin.clone(), ..ProxyConfig::default() };
    let status = Arc::new(ProxyStatus::new(config.health_timeout));
    let client = {
        let _in_runtime = rt.enter();
        client(api.clone())
    };
    rt.spawn(skiff_proxy::http::serve_health(health_addr, status.clone()));
    rt.spawn(skiff_proxy::http::serve_metrics(metrics_addr, pin.clone(), status.clone()));
    let daemon_maps = ServiceMaps::open_pinned(&pin).unwrap();
    let task = rt.spawn(async move {
        let informers = skiff_core::informers::Informers::new(client);
        let mut maps = daemon_maps;
        skiff_proxy::daemon::sync_observed(&informers, &config, &mut maps, &status).await
    });
    let maps = ServiceMaps::open_pinned(&pin).unwrap();
    wait_for(&maps, "the service in the maps", |m| !m.services().unwrap().is_empty());
    // Ready once the first sync programmed the maps.
    let t = Instant::now();
    let ready = loop {
        match http_get(health_addr, "/readyz") {
            Some((200, body)) => break body,
            _ if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => panic!("/readyz: {other:?}"),
        }
    };
    assert!(ready.contains("lastUpdated"), "{ready}");
    let (code, body) = http_get(health_addr, "/healthz").expect("/healthz");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("kube-proxy's JSON");
    assert_eq!(v["nodeEligible"], true);
    assert!(v["lastUpdated"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    assert!(v["currentTime"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    let (code, body) = http_get(health_addr, "/livez").expect("/livez");
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("nodeEligible"), "{body}");
    assert_eq!(http_get(health_addr, "/nothing").map(|r| r.0), Some(404));

    let (code, text) = http_get(metrics_addr, "/metrics").expect("/metrics");
    assert_eq!(code, 200);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    assert!(value("kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1.0);
    assert!(value("kubeproxy_sync_proxy_rules_service_changes_total") >= 1.0);
    assert!(value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1.7e9);
    assert_eq!(value("kubeproxy_sync_proxy_rules_iptables_restore_failures_total"), 0.0);
    assert!(value("kubeproxy_proxy_healthz_total{code=\"200\"}") >= 1.0);
    assert!(text.contains("skiff_drops_total"), "the maps' counters follow:\n{text}");
    task.abort();
    rt.shutdown_timeout(Duration::from_secs(2));
}
