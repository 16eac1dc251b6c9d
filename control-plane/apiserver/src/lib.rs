//! The Kubernetes-compatible HTTP apiserver: routing, discovery, OpenAPI, authentication,
//! authorization and admission, the resource verbs over the store, watches served from the
//! watch cache, and the cluster PKI it serves and signs with.
//!
//! It builds on the store, the API machinery and the core crate, and may not import the
//! scheduler, the controllers or `skiff-server`'s wiring: those reach it only through the
//! API (in one process, over [`ApiServer::client`]).

pub mod admission;
pub mod aggregator;
pub mod alloc;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod cache;
mod componentstatus;
pub mod config;
mod conversion;
pub mod custom;
mod discovery;
mod gate;
mod handlers;
mod health;
mod json;
pub mod kubelet;
mod list_options;
mod metrics;
pub mod metrics_api;
pub mod negotiate;
mod openapi_custom;
pub mod pki;
pub mod proxy;
pub mod registry;
mod render;
pub mod request;
pub mod selectors;
mod server;
pub mod state;
pub mod status;
pub mod table;
#[cfg(test)]
pub(crate) mod testing;
pub mod user;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use self::alloc::Allocators;
use self::cache::WatchCache;
use self::registry::Registry;
use self::render::{bytes_response, json_response};
use self::request::{Query, Route};
use self::status::ApiError;
use skiff_machinery::openapi::OpenApiDocs;
use skiff_store::DynStore;

pub use self::config::ApiConfig;
pub use self::server::ApiServer;

/// The Kubernetes version skiff reports (kubectl's dispatcher picks its binary by the minor).
pub const KUBE_VERSION: (&str, &str) = ("1", "33");
pub const GIT_VERSION: &str = "v1.33.0-skiff";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the watch cache")]
    Cache(#[source] skiff_store::Error),
    #[error("building the OpenAPI documents")]
    OpenApi(#[source] skiff_machinery::openapi::Error),
    #[error("opening the audit log")]
    Audit(#[source] audit::Error),
    #[error("creating system object {name}")]
    Bootstrap {
        name: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error("configuring authentication")]
    Auth(#[source] authn::Error),
}

impl ApiServer {
    /// Load the cache, repair the allocators and create the system namespaces.
    pub async fn start(store: DynStore, config: ApiConfig) -> Result<Arc<ApiServer>, Error> {
        let registry = Arc::new(Registry::new());
        let cache = WatchCache::start(store.clone(), registry.clone(), config.watch_history)
            .await
            .map_err(Error::Cache)?;
        let openapi = OpenApiDocs::build(&registry.descs()).map_err(Error::OpenApi)?;
        let alloc = Allocators::new(config.service_cidr, config.node_ports);
        let audit = audit::AuditLog::open(&config.audit).map_err(Error::Audit)?;
        let auth = authn::Auth::new(config.auth.clone()).map_err(Error::Auth)?;
        let admission = admission::chain::Chain::builtin(auth.authz.clone());
        let server = Arc::new(ApiServer {
            state: Arc::new(state::State {
                registry,
                store,
                cache,
                alloc,
                config,
                components: Arc::default(),
                remotes: Default::default(),
            }),
            openapi,
            openapi_custom: Default::default(),
            metrics: metrics::Metrics::default(),
            resource_metrics: metrics_api::ResourceMetrics::default(),
            admission,
            audit,
            auth,
            heavy: tokio::sync::Semaphore::new(heavy_permits()),
        });
        server.repair_allocations();
        tokio::spawn(custom::follow_crds(server.state.clone()));
        server.bootstrap().await?;
        server.ensure_policy().await?;
        aggregator::spawn(&server);
        Ok(server)
    }

    fn repair_allocations(&self) {
        let Some(rt) = self.registry.find("", "v1", "services") else { return };
        let services: Vec<Value> =
            self.cache.resource(rt).list(&rt.prefix(), None).iter().map(|o| o.value()).collect();
        self.alloc.repair(services.iter());
    }

    /// default, kube-system, kube-public, kube-node-lease, the `kubernetes` Service and the
    /// system PriorityClasses.
    async fn bootstrap(&self) -> Result<(), Error> {
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            self.ensure("", "namespaces", None, ns, obj).await?;
        }
        for (name, value, description) in skiff_machinery::admission::SYSTEM_PRIORITY_CLASSES {
            let obj = json!({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value, "description": description,
            });
            self.ensure("scheduling.k8s.io", "priorityclasses", None, name, obj).await?;
        }
        let ip = self.alloc.kubernetes_ip().to_string();
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
        });
        self.ensure("", "services", Some("default"), "kubernetes", svc).await
    }

    /// The default ClusterRoles and ClusterRoleBindings that do not exist yet.
    async fn ensure_policy(&self) -> Result<(), Error> {
        for obj in authz::defaults::objects() {
            let plural = match obj["kind"].as_str() {
                Some("ClusterRole") => "clusterroles",
                _ => "clusterrolebindings",
            };
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            self.ensure(authz::RBAC_GROUP, plural, None, &name, obj).await?;
        }
        Ok(())
    }

    async fn ensure(
        &self,
        group: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
        obj: Value,
    ) -> Result<(), Error> {
        let rt = self.registry.find(group, "v1", plural).expect("a served v1 resource");
        let exists = self
            .store
            .get(&rt.key(ns, name))
            .await
            .map_err(|e| Error::Bootstrap { name: name.to_string(), source: Box::new(e.into()) })?;
        if exists.is_some() {
            return Ok(());
        }
        let body = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        let mut headers = http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let result = handlers::create(
            handlers::Target { server: self, rt, ns },
            request::Input {
                query: &Query::parse(Some("fieldManager=skiff-server")),
                headers: &headers,
                body: &body,
            },
        )
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.reason == "AlreadyExists" => Ok(()),
            Err(e) => Err(Error::Bootstrap { name: name.to_string(), source: Box::new(e) }),
        }
    }

    /// The router: the HTTP face of the apiserver, also usable in process as a tower service.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .fallback(dispatch)
            .layer(axum::middleware::from_fn_with_state(self.clone(), gate::layer))
            .with_state(self.clone())
    }

    /// A kube-rs client that calls this apiserver in memory through its tower service
    /// (no TCP, no TLS): how the in-process scheduler and controllers talk to the API.
    /// Its requests carry the privileged `system:apiserver` identity (system:masters), which
    /// only in-process callers can hold.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        self.client_as("kube-apiserver")
    }

    /// [`ApiServer::client`] for one component: its name leads the User-Agent, which names
    /// the field manager of its writes that give none (`kube-controller-manager`,
    /// `kube-scheduler`, as upstream's components show in managedFields).
    pub fn client_as(self: &Arc<Self>, component: &str) -> kube::Client {
        let agent = http::HeaderValue::from_str(&format!(
            "{component}/{} (linux/amd64) skiff",
            GIT_VERSION
        ))
        .unwrap_or_else(|_| http::HeaderValue::from_static("skiff-server"));
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut req: http::Request<kube::client::Body>| {
                req.extensions_mut().insert(authn::InProcess::apiserver());
                req.headers_mut().entry(http::header::USER_AGENT).or_insert(agent.clone());
                req
            })
            .service(self.router());
        kube::Client::new(service, "default")
    }

    /// Re-create what [`ApiServer::bootstrap`] creates when it goes missing (someone ran
    /// `kubectl delete all --all`, or deleted kube-node-lease), every `every`: upstream's
    /// kubernetes-service and system-namespaces controllers.
    pub fn spawn_bootstrap_repair(self: &Arc<Self>, every: Duration) {
        let server = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(server) = server.upgrade() else { return };
                if let Err(e) = server.bootstrap().await {
                    tracing::warn!(error = %e, "re-creating the system namespaces and the kubernetes Service");
                }
            }
        });
    }

    /// Scrape the nodes' resource metrics every `every` (from now on) for `metrics.k8s.io`.
    pub fn spawn_metrics_scraper(self: &Arc<Self>, every: Duration) {
        let server = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(server) = server.upgrade() else { return };
                metrics_api::scrape(&server, &server.resource_metrics).await;
                drop(server);
                tokio::time::sleep(every.max(Duration::from_millis(100))).await;
            }
        });
    }

    /// Periodic compaction of store history (upstream: every 5 minutes).
    pub fn spawn_compactor(self: &Arc<Self>, every: Duration) {
        let server = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(server) = server.upgrade() else { return };
                if let Some(rev) = last
                    && let Err(e) = server.store.compact(rev).await
                {
                    tracing::warn!(error = %e, "compacting the store");
                }
                last = server.store.current_revision().await.ok();
            }
        });
    }
}

/// A request body above this size counts as heavy (see [`ApiServer::heavy`]).
const HEAVY_BODY: usize = 64 * 1024;

/// How many heavy requests may run at once: all workers but one.
fn heavy_permits() -> usize {
    let workers =
        tokio::runtime::Handle::try_current().map(|h| h.metrics().num_workers()).unwrap_or(1);
    workers.saturating_sub(1).max(1)
}

async fn dispatch(State(server): State<Arc<ApiServer>>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // Authentication puts the user in the extensions; without it the request is the admin's.
    let user = req.extensions().get::<user::UserInfo>().cloned().unwrap_or_else(admission::admin);
    let mut record = server.audit.as_ref().map(|log| log.begin(&req, &user));
    let req = match &mut record {
        Some(r) => match r.capture_request(req).await {
            Ok(req) => req,
            Err(resp) => return audit_finish(record, resp).await,
        },
        None => req,
    };
    // Boxed: the routed request's future is large (every handler's state), and the
    // router's layers move this one by value; a box keeps that move to a pointer.
    let response = match admission::with_user(user, Box::pin(route(&server, req))).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    };
    let response = audit_finish(record, response).await;
    server.metrics.observe(&method, response.status(), started.elapsed());
    tracing::debug!(%method, %path, status = response.status().as_u16(), "request");
    response
}

async fn audit_finish(record: Option<audit::Record<'_>>, response: Response) -> Response {
    match record {
        Some(r) => r.finish(response).await,
        None => response,
    }
}

async fn route(server: &Arc<ApiServer>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let query = Query::parse(parts.uri.query());
    let path = parts.uri.path();
    if let Some(resp) = health::serve(server, path, parts.uri.query()).await {
        return Ok(resp);
    }
    match path {
        "/version" => return Ok(json_response(StatusCode::OK, &version())),
        "/metrics" => return Ok(server.metrics.render(server)),
        "/openapi/v3" | "/openapi/v3/" => {
            let docs = openapi_custom::docs(server).await;
            return Ok(bytes_response(StatusCode::OK, "application/json", docs.v3_root().clone()));
        }
        "/openapi/v2" | "/swagger.json" => return Ok(openapi_v2(server, &parts.headers).await),
        _ => {}
    }
    if let Some(gv) = path.strip_prefix("/openapi/v3/") {
        return openapi_v3_group_version(server, gv, &query).await;
    }
    // Everything under `/apis/<group>/<version>` of a proxied APIService, its discovery
    // document included, is the extension apiserver's to answer.
    if let Some(remote) = server.remotes.for_path(path) {
        return aggregator::proxy::serve(server, &remote, parts, body).await;
    }
    let watch_param = query.flag("watch");
    match request::parse(&parts.method, path, watch_param)? {
        Some(Route::LegacyRoot) => Ok(discovery::legacy_root(server, &parts.headers)),
        Some(Route::GroupsRoot) => Ok(discovery::groups_root(server, &parts.headers)),
        Some(Route::Group { group }) => discovery::group(server, &group),
        Some(Route::GroupVersion { group, version }) => {
            discovery::resource_list(server, &group, &version)
        }
        Some(Route::Resource(info)) if proxy::handles(&info) => {
            proxy::serve(server, info, query, parts).await
        }
        Some(Route::Resource(info)) => {
            let body = match parts.method {
                Method::GET | Method::HEAD => Bytes::new(),
                _ => read_body(body).await?,
            };
            // A large body costs CPU in proportion (decoding, validation, encoding) without
            // an await between: at most workers - 1 of them run at once, so one worker is
            // always free for everything else (health checks among them). The others wait
            // here without holding a worker, and are dropped unstarted if their client goes.
            let _heavy =
                match body.len() > HEAVY_BODY {
                    true => Some(server.heavy.acquire().await.map_err(|_| {
                        ApiError::service_unavailable("the server is shutting down")
                    })?),
                    false => None,
                };
            handlers::resource(server, info, query, parts.headers, body).await
        }
        None => Err(ApiError::path_not_found()),
    }
}

/// Read a request body up to [`negotiate::MAX_BODY`]. A larger one is read to its end
/// (up to a hard cap) and discarded before answering 413, so the client sees the Status
/// instead of a connection reset in the middle of its upload.
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    const DISCARD_CAP: usize = 64 * 1024 * 1024;
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        seen += chunk.len();
        if seen <= negotiate::MAX_BODY {
            buf.extend_from_slice(&chunk);
        } else if seen > DISCARD_CAP {
            break;
        }
    }
    if seen > negotiate::MAX_BODY {
        return Err(ApiError::too_large(negotiate::MAX_BODY));
    }
    Ok(buf.freeze())
}

/// `/openapi/v3/<group-version>`: immutable when asked for by the hash the root lists.
async fn openapi_v3_group_version(
    server: &ApiServer,
    gv: &str,
    query: &Query,
) -> Result<Response, ApiError> {
    let docs = openapi_custom::docs(server).await;
    let Some(doc) = docs.v3_group_version(gv) else {
        return Err(ApiError::path_not_found());
    };
    let mut resp = bytes_response(StatusCode::OK, "application/json", doc.body.clone());
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", doc.hash)) {
        resp.headers_mut().insert(header::ETAG, etag);
    }
    if query.get("hash").is_some() {
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
    }
    Ok(resp)
}

/// `/openapi/v2`: the gnostic protobuf kubectl 1.27/1.28 ask for, else JSON.
async fn openapi_v2(server: &ApiServer, headers: &http::HeaderMap) -> Response {
    use skiff_machinery::openapi::{V2_PROTOBUF_ACCEPT, V2_PROTOBUF_CONTENT_TYPE};
    let docs = openapi_custom::docs(server).await;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let wants_proto = accept
        .split(',')
        .map(|m| m.split(';').next().unwrap_or("").trim())
        .any(|m| V2_PROTOBUF_ACCEPT.contains(&m));
    let mut resp = if wants_proto {
        bytes_response(StatusCode::OK, V2_PROTOBUF_CONTENT_TYPE, docs.v2_protobuf().clone())
    } else {
        bytes_response(StatusCode::OK, "application/json", docs.v2_json().clone())
    };
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", docs.v2_hash())) {
        resp.headers_mut().insert(header::ETAG, etag);
    }
    resp.headers_mut().insert("Vary", HeaderValue::from_static("Accept"));
    resp
}

fn version() -> Value {
    json!({
        "major": KUBE_VERSION.0,
        "minor": KUBE_VERSION.1,
        "gitVersion": GIT_VERSION,
        "gitCommit": "skiff",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": "linux/amd64",
        "emulationMajor": KUBE_VERSION.0,
        "emulationMinor": KUBE_VERSION.1,
    })
}
