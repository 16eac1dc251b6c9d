//! A metrics-server-style extension apiserver on a loopback port for the aggregation
//! tests: HTTPS with its own CA and a serving certificate for `test-ext.kube-system.svc`
//! (the name the aggregator checks), client certificates required and verified against
//! the request-header CA skiff publishes, and the group `metrics.test.example/v1beta1`
//! with one cluster-scoped resource, `widgets`. Its list holds `alpha` and `caller`,
//! whose spec echoes the identity headers the request came with; a watch sends `alpha`
//! at once and holds the stream open. Served by its own runtime until dropped.
//!
//! Endpoints may not name a loopback address (upstream's validation), so it listens on
//! one of this machine's own addresses ([`local_address`]): the kernel delivers traffic to
//! a local address over loopback, so nothing leaves the machine.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

pub const GROUP: &str = "metrics.test.example";
pub const VERSION: &str = "v1beta1";

/// What the extension saw of one request.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub path: String,
    /// Every request header, names lower-case, in order.
    pub headers: Vec<(String, String)>,
    /// The common name of the client certificate the connection presented (verified
    /// against the request-header CA, or the handshake fails).
    pub client_cn: String,
}

pub struct Extension {
    pub addr: SocketAddr,
    /// The CA of the serving certificate, PEM (the APIService's caBundle).
    pub ca_pem: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Extension {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Extension {
    /// Serve on `ip`, trusting client certificates signed by `client_ca_pem`.
    pub fn start(ip: std::net::IpAddr, client_ca_pem: &str) -> Extension {
        let (ca_pem, cert_pem, key_pem) = crate::webhook::certs_for(&["test-ext.kube-system.svc"]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
            roots.add(c.expect("client CA PEM")).expect("client CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("client verifier");
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert");
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = rt.block_on(tokio::net::TcpListener::bind((ip, 0))).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, log) = (acceptor.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let cn = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|der| common_name(der.as_ref()))
                        .unwrap_or_default();
                    let service =
                        hyper::service::service_fn(move |req| handle(req, cn.clone(), log.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Extension { addr, ca_pem, seen, rt: Some(rt) }
    }

    /// The last request whose path starts with `prefix`.
    pub fn last(&self, prefix: &str) -> Option<Seen> {
        self.seen.lock().unwrap().iter().rev().find(|s| s.path.starts_with(prefix)).cloned()
    }
}

/// An IPv4 address of this machine that is not loopback (the first `scope global` one
/// `ip` lists), proven local by binding to it: a socket can bind only to a local address,
/// and the kernel delivers what is sent to one over loopback.
pub fn local_address() -> std::net::IpAddr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("running ip addr");
    let text = String::from_utf8_lossy(&out.stdout);
    let ip: std::net::IpAddr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse().ok())
        .expect("a global IPv4 address on this machine");
    std::net::TcpListener::bind((ip, 0)).unwrap_or_else(|e| panic!("{ip} is not local: {e}"));
    ip
}

fn common_name(der: &[u8]) -> Option<String> {
    skiff_apiserver::authn::user_from_cert(der).map(|u| u.name)
}

type Body = BoxBody<Bytes, Infallible>;

fn json_body(status: u16, v: &Value) -> hyper::Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(v.to_string())).boxed();
    let mut resp = hyper::Response::new(body);
    *resp.status_mut() = http::StatusCode::from_u16(status).expect("status");
    resp.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    resp
}

async fn handle(
    req: hyper::Request<Incoming>,
    client_cn: String,
    log: Arc<Mutex<Vec<Seen>>>,
) -> Result<hyper::Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
        .collect();
    let all = |name: &str| -> Vec<String> {
        headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.clone()).collect()
    };
    let user = all("x-remote-user").join(",");
    let groups = all("x-remote-group");
    log.lock().unwrap().push(Seen { path: path.clone(), headers: headers.clone(), client_cn });
    let _ = req.into_body().collect().await;
    let gv = format!("/apis/{GROUP}/{VERSION}");
    let widget = |name: &str, spec: Value| {
        json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Widget",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "1"},
            "spec": spec})
    };
    if path == gv {
        return Ok(json_body(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
                "resources": [{"name": "widgets", "singularName": "widget", "namespaced": false,
                    "kind": "Widget", "verbs": ["get", "list", "watch"], "shortNames": ["wdg"]}]}),
        ));
    }
    let watch = query.split('&').any(|p| p == "watch=true" || p == "watch=1");
    if path == format!("{gv}/widgets") && watch {
        // One event at once, then nothing for a minute: only a streaming proxy passes it on
        // before the stream ends.
        let event = json!({"type": "ADDED", "object": widget("alpha", json!({}))});
        let first = futures::stream::once(async move {
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{event}\n"))))
        });
        let rest = futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(Frame::data(Bytes::new()))
        });
        let body = BodyExt::boxed(StreamBody::new(first.chain(rest)));
        let mut resp = hyper::Response::new(body);
        resp.headers_mut()
            .insert("content-type", http::HeaderValue::from_static("application/json"));
        return Ok(resp);
    }
    if path == format!("{gv}/widgets") {
        let caller = widget(
            "caller",
            json!({"user": user, "groups": groups,
                "sawAuthorization": headers.iter().any(|(k, _)| k == "authorization")}),
        );
        return Ok(json_body(
            200,
            &json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "WidgetList",
                "metadata": {"resourceVersion": "1"}, "items": [widget("alpha", json!({})), caller]}),
        ));
    }
    Ok(json_body(
        404,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": format!("the extension serves no {path}")}),
    ))
}
