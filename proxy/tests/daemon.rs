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
