//! `cargo xtask bench crds`: custom resources against built-ins in one run, against
//! skiff-server as its own process (target/release/skiff-server, as the apiserver bench
//! runs it, with its controllers):
//! - creates/s of a custom resource with a 100-field schema and CEL rules against
//!   creates/s of a ConfigMap of the same size (target >= 0.5x);
//! - CRD create to Established, to served in discovery and to listed in OpenAPI v3, with
//!   50 CRDs installed (target p99 < 1 s);
//! - skiff-server's RSS growth with those 50 CRDs installed, and, on a second server, with
//!   the real CRDs of tests/fixtures/crds (cert-manager, Gateway API, prometheus-operator)
//!   installed and their OpenAPI served (target < 50 MB).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use skiff_tests::process::{ServerProcess, start_server_with};

const FIELDS: usize = 100;
const CREATES: usize = 400;
const CONCURRENCY: usize = 8;
const CRDS: usize = 50;

async fn server() -> ServerProcess {
    let bin = skiff_tests::workspace_root().join("target/release/skiff-server");
    assert!(bin.exists(), "{} is missing: cargo xtask bench crds builds it", bin.display());
    start_server_with(&bin, &[]).await.expect("skiff-server")
}

/// The server's RSS once it has settled (freed memory handed back).
async fn settled_rss_mb(server: &ServerProcess) -> f64 {
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.rss_mb()
}

/// A CRD whose spec has `FIELDS` typed, bounded, patterned fields and a nested list of
/// maps, with CEL rules on the list items and across fields (a Gateway-style object).
fn crd(plural: &str, kind: &str) -> Value {
    let mut props = serde_json::Map::new();
    for i in 0..FIELDS {
        let p = match i % 4 {
            0 => {
                json!({"type": "string", "maxLength": 64, "pattern": "^[a-z0-9-]*$", "description": format!("field {i}")})
            }
            1 => {
                json!({"type": "integer", "minimum": 0, "maximum": 65535, "description": format!("field {i}")})
            }
            2 => json!({"type": "string", "enum": ["a", "b", "c"], "default": "a"}),
            _ => json!({"type": "array", "maxItems": 8, "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "maxLength": 32}, "port": {"type": "integer", "minimum": 1}},
                    "x-kubernetes-validations": [
                        {"rule": "self.name != 'admin' || self.port < 1024", "message": "admin ports are privileged"}]},
                "x-kubernetes-validations": [
                    {"rule": "self.all(p, p.port <= 65535)"},
                    {"rule": "self.map(p, p.name).size() == self.size()"}]}),
        };
        props.insert(format!("f{i}"), p);
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.bench.example.com")},
        "spec": {"group": "bench.example.com", "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": props, "x-kubernetes-validations": [
                        {"rule": "self.f1 <= 65535 && self.f0.startsWith('value')", "messageExpression": "'f0 is ' + self.f0"},
                        {"rule": "!has(self.f2) || self.f2 in ['a', 'b', 'c']"}]},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]},
    })
}

fn spec_values() -> serde_json::Map<String, Value> {
    let mut spec = serde_json::Map::new();
    for i in 0..FIELDS {
        let v = match i % 4 {
            0 => json!(format!("value-{i}")),
            1 => json!(i * 10),
            2 => json!("b"),
            _ => json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        };
        spec.insert(format!("f{i}"), v);
    }
    spec
}

async fn rate<F, Fut>(total: usize, f: F) -> f64
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures::StreamExt;
    let start = Instant::now();
    futures::stream::iter(0..total).for_each_concurrent(CONCURRENCY, &f).await;
    total as f64 / start.elapsed().as_secs_f64()
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1).min(v.len() - 1)]
}

#[test]
#[ignore = "a benchmark: cargo xtask bench crds"]
fn bench_crds() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let server = server().await;
        let client = skiff_tests::client_from(&server.kubeconfig).await;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let established = |name: String| {
            let crds = crds.clone();
            async move {
                loop {
                    let ok = crds.get(&name).await.ok().and_then(|c| c.status).is_some_and(|s| {
                        s.conditions
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                    if ok {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };

        // 1. Creates/s: the custom resource against a ConfigMap of the same size.
        let gadget: CustomResourceDefinition =
            serde_json::from_value(crd("gadgets", "Gadget")).unwrap();
        crds.create(&PostParams::default(), &gadget).await.expect("CRD");
        established("gadgets.bench.example.com".into()).await;
        let ar = ApiResource {
            group: "bench.example.com".into(),
            version: "v1".into(),
            api_version: "bench.example.com/v1".into(),
            kind: "Gadget".into(),
            plural: "gadgets".into(),
        };
        let gadgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
        loop {
            if gadgets.list(&Default::default()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let spec = spec_values();
        let size = serde_json::to_vec(&spec).unwrap().len();
        let data: std::collections::BTreeMap<String, String> =
            spec.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let cm_rate = rate(CREATES, |i| {
            let cms = cms.clone();
            let data = data.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("cm-{i}")}, "data": data}))
                .unwrap();
                cms.create(&PostParams::default(), &cm).await.expect("configmap");
            }
        })
        .await;
        let cr_rate = rate(CREATES, |i| {
            let gadgets = gadgets.clone();
            let spec = spec.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "bench.example.com/v1", "kind": "Gadget",
                    "metadata": {"name": format!("g-{i}")}, "spec": spec}))
                .unwrap();
                gadgets.create(&PostParams::default(), &obj).await.expect("gadget");
            }
        })
        .await;

        // 2. and 3. Fifty CRDs: time to Established, to discovery, to OpenAPI; RSS.
        let before = settled_rss_mb(&server).await;
        let (mut to_established, mut to_discovery, mut to_openapi) = (vec![], vec![], vec![]);
        for i in 0..CRDS {
            let plural = format!("things{i}");
            let c: CustomResourceDefinition =
                serde_json::from_value(crd(&plural, &format!("Thing{i}"))).unwrap();
            let start = Instant::now();
            crds.create(&PostParams::default(), &c).await.expect("CRD");
            established(format!("{plural}.bench.example.com")).await;
            to_established.push(start.elapsed().as_secs_f64());
            loop {
                let req =
                    http::Request::get("/apis/bench.example.com/v1").body(Vec::new()).unwrap();
                let found = client
                    .request_text(req)
                    .await
                    .is_ok_and(|body| body.contains(&format!("\"{plural}\"")));
                if found {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            to_discovery.push(start.elapsed().as_secs_f64());
            while std::env::var_os("SKIFF_BENCH_NO_OPENAPI").is_none() {
                let req = http::Request::get("/openapi/v3/apis/bench.example.com/v1")
                    .body(Vec::new())
                    .unwrap();
                let found = client
                    .request_text(req)
                    .await
                    .is_ok_and(|body| body.contains(&format!("com.example.bench.v1.Thing{i}\"")));
                if found {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            to_openapi.push(start.elapsed().as_secs_f64());
            if std::env::var_os("SKIFF_BENCH_TRACE").is_some() {
                eprintln!(
                    "crd {i}: established {:.3}s rss {:.1} MB",
                    to_established[i],
                    server.rss_mb()
                );
            }
        }
        let growth_mb = settled_rss_mb(&server).await - before;
        drop(server);
        let (real_crds, real_growth_mb, real_rest_mb) = real_crds_rss().await;

        println!("crds benchmark (release skiff-server process, {CONCURRENCY} concurrent clients)");
        println!("  object size {size} B, {FIELDS} schema fields, {CREATES} creates each");
        println!("  ConfigMap creates/s        {cm_rate:>10.1}");
        println!("  custom resource creates/s  {cr_rate:>10.1}");
        println!("  ratio (target >= 0.5)      {:>10.2}", cr_rate / cm_rate);
        println!("  with {CRDS} CRDs, p99 seconds (target < 1):");
        println!("    create -> Established    {:>10.3}", p99(to_established.clone()));
        println!("    create -> discovery      {:>10.3}", p99(to_discovery.clone()));
        println!("    create -> OpenAPI v3     {:>10.3}", p99(to_openapi.clone()));
        println!("  skiff-server RSS growth (target < 50 MB):");
        println!("    with {CRDS} bench CRDs       {growth_mb:>10.1} MB");
        println!("    with {real_crds} real CRDs        {real_growth_mb:>10.1} MB");
        println!("    same, restarted with them  {real_rest_mb:>10.1} MB");
        let report = json!({
            "configmap_creates_per_s": cm_rate, "custom_creates_per_s": cr_rate,
            "ratio": cr_rate / cm_rate,
            "p99_established_s": p99(to_established), "p99_discovery_s": p99(to_discovery),
            "p99_openapi_s": p99(to_openapi), "rss_growth_mb": growth_mb,
            "real_crds": real_crds, "real_crds_rss_growth_mb": real_growth_mb,
            "real_crds_rss_at_rest_mb": real_rest_mb,
        });
        let dir = skiff_tests::workspace_root().join("target/bench");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join("crds.json"), serde_json::to_vec_pretty(&report).unwrap());
    });
}

/// A fresh server's RSS growth with every CRD of tests/fixtures/crds applied (server-side,
/// as the projects install them), Established, and their groups' OpenAPI v3 served; and
/// the same server's growth over that first reading once restarted with them.
async fn real_crds_rss() -> (usize, f64, f64) {
    let server = server().await;
    let client = skiff_tests::client_from(&server.kubeconfig).await;
    let before = settled_rss_mb(&server).await;
    let k = skiff_tests::Kubectl::new(33, &server.kubeconfig);
    let fixtures = skiff_tests::workspace_root().join("tests/fixtures/crds");
    let mut groups = std::collections::BTreeSet::new();
    let mut count = 0;
    for project in ["cert-manager", "gateway-api", "prometheus-operator"] {
        let dir = fixtures.join(project);
        tokio::task::block_in_place(|| {
            k.ok(&["apply", "--server-side", "-f", dir.to_str().unwrap()]);
        });
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for c in crds.list(&Default::default()).await.expect("CRDs").items {
            groups.insert(c.spec.group.clone());
        }
    }
    tokio::task::block_in_place(|| {
        k.ok(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=120s"]);
        count = k.ok(&["get", "crd", "-o", "name"]).lines().count();
    });
    let openapi = |client: kube::Client| {
        let groups = groups.clone();
        async move {
            for group in &groups {
                let req = http::Request::get(format!("/openapi/v3/apis/{group}/v1"))
                    .body(Vec::new())
                    .unwrap();
                let _ = client.request_text(req).await;
            }
        }
    };
    openapi(client).await;
    let installed = settled_rss_mb(&server).await - before;
    // At rest: the same server restarted with the CRDs in its store (what they hold, without
    // what installing them left in the allocator and the watch cache's history).
    let bin = skiff_tests::workspace_root().join("target/release/skiff-server");
    let server = server.restart(&bin, &[]).await.expect("restart");
    let client = skiff_tests::client_from(&server.kubeconfig).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert_eq!(crds.list(&Default::default()).await.expect("CRDs").items.len(), count);
    openapi(client).await;
    (count, installed, settled_rss_mb(&server).await - before)
}
