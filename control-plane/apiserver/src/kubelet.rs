//! How the apiserver reaches the node agents: HTTPS to the endpoint a Node advertises (its
//! InternalIP, else ExternalIP, and `status.daemonEndpoints.kubeletEndpoint.Port`), with
//! the apiserver's client certificate, as upstream's apiserver talks to kubelets. Used by
//! the streaming subresources ([`crate::proxy`]) and the resource metrics scrape.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::status::{ApiError, ApiResult};
use skiff_core::streaming::{FORWARDED_REQUEST, FORWARDED_RESPONSE, copy_headers, splice_upgrades};

/// The kubelet's default port, when a Node does not advertise one.
const DEFAULT_KUBELET_PORT: u16 = 10250;

/// The most a fetched answer may hold (a node's resource metrics are a few hundred bytes
/// per container).
const FETCH_LIMIT: usize = 16 << 20;

/// How long reaching an agent (TCP and TLS) may take.
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How the apiserver reaches agents: TLS with its client certificate.
#[derive(Clone)]
pub struct KubeletClient {
    tls: Arc<rustls::ClientConfig>,
}

impl KubeletClient {
    /// From [`crate::pki::Pki::kubelet_client_config`].
    pub fn new(tls: rustls::ClientConfig) -> Self {
        KubeletClient { tls: Arc::new(tls) }
    }
}

impl std::fmt::Debug for KubeletClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeletClient { .. }")
    }
}

/// The endpoint a node's agent advertises, only if it advertises one (a non-zero
/// `kubeletEndpoint` port): what is dialed without a user asking (the resource metrics
/// scrape). A simulated node advertises none, and its made-up address is never dialed.
pub fn advertised_agent(node: &Value) -> Option<SocketAddr> {
    node.pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)?;
    node_address(node)
}

/// The node's agent endpoint: InternalIP (else ExternalIP) and the advertised port.
pub(crate) fn node_address(node: &Value) -> Option<SocketAddr> {
    let addresses = node.pointer("/status/addresses").and_then(Value::as_array)?;
    let ip = ["InternalIP", "ExternalIP"].iter().find_map(|kind| {
        addresses.iter().find_map(|a| {
            (a.get("type").and_then(Value::as_str) == Some(kind))
                .then(|| a.get("address").and_then(Value::as_str)?.parse::<IpAddr>().ok())
                .flatten()
        })
    })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Some(SocketAddr::new(ip, port))
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// The agent could not be reached or failed mid-request: 500 without Retry-After, as
/// upstream's "error dialing backend" (a 503 would make clients retry for 10 s).
fn backend_error(message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
}

/// An HTTP/1.1 connection to the agent at `addr`, over TLS with the client certificate.
async fn connect(client: &KubeletClient, addr: SocketAddr, upgrades: bool) -> ApiResult<Sender> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        backend_error(format!("{what} the node's agent at {addr}: {e}"))
    };
    let dial = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| unavailable("connecting to", &e))?;
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(client.tls.clone());
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        connector.connect(name, tcp).await.map_err(|e| unavailable("TLS with", &e))
    };
    let tls = tokio::time::timeout(DIAL_TIMEOUT, dial)
        .await
        .map_err(|_| unavailable("timed out reaching", &format!("{DIAL_TIMEOUT:?}")))??;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| unavailable("HTTP with", &e))?;
    tokio::spawn(async move {
        let result = if upgrades { conn.with_upgrades().await } else { conn.await };
        if let Err(e) = result {
            tracing::debug!(%addr, error = %e, "agent connection ended");
        }
    });
    Ok(sender)
}

fn request(method: &Method, addr: SocketAddr, path: &str) -> http::request::Builder {
    let mut b = http::Request::builder().method(method.clone()).uri(path);
    if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
        b = b.header(header::HOST, host);
    }
    b
}

/// An error answer of the agent as a Status with the agent's code and message.
async fn agent_error(resp: http::Response<hyper::body::Incoming>) -> ApiError {
    let status = resp.status();
    let body = match resp.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(e) => format!("reading the agent's answer: {e}"),
    };
    let reason = match status {
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        _ => "InternalError",
    };
    ApiError::new(status, reason, body)
}

pub(crate) async fn logs(
    client: &KubeletClient,
    addr: SocketAddr,
    path: &str,
) -> ApiResult<Response> {
    let mut sender = connect(client, addr, false).await?;
    let req = request(&Method::GET, addr, path).body(Empty::new()).map_err(ApiError::internal)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| backend_error(format!("asking the node's agent at {addr} for logs: {e}")))?;
    if resp.status() != StatusCode::OK {
        return Err(agent_error(resp).await);
    }
    let mut out = Response::new(Body::new(resp.into_body()));
    out.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(out)
}

/// GET `path` from the agent at `addr` and read the whole answer (the resource metrics
/// scrape); an answer other than 200 is an error with the agent's message.
pub async fn fetch(client: &KubeletClient, addr: SocketAddr, path: &str) -> ApiResult<Bytes> {
    let mut sender = connect(client, addr, false).await?;
    let req = request(&Method::GET, addr, path).body(Empty::new()).map_err(ApiError::internal)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| backend_error(format!("GET {path} from the node's agent at {addr}: {e}")))?;
    if resp.status() != StatusCode::OK {
        return Err(agent_error(resp).await);
    }
    let body = http_body_util::Limited::new(resp.into_body(), FETCH_LIMIT);
    let body = body.collect().await.map_err(|e| {
        backend_error(format!("reading {path} from the node's agent at {addr}: {e}"))
    })?;
    Ok(body.to_bytes())
}

pub(crate) async fn upgrade(
    client: &KubeletClient,
    addr: SocketAddr,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    on_upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response> {
    let mut sender = connect(client, addr, true).await?;
    let mut req = request(method, addr, path).body(Empty::new()).map_err(ApiError::internal)?;
    copy_headers(headers, req.headers_mut(), FORWARDED_REQUEST);
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| backend_error(format!("exec through the node's agent at {addr}: {e}")))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(agent_error(resp).await);
    }
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    copy_headers(resp.headers(), out.headers_mut(), FORWARDED_RESPONSE);
    splice_upgrades(on_upgrade, hyper::upgrade::on(&mut resp));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_agent() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.1.2.3"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 11250}}}});
        assert_eq!(node_address(&node), Some("10.1.2.3:11250".parse().unwrap()));
        let node =
            json!({"status": {"addresses": [{"type": "ExternalIP", "address": "192.0.2.1"}]}});
        assert_eq!(node_address(&node), Some("192.0.2.1:10250".parse().unwrap()));
        assert_eq!(node_address(&json!({"status": {}})), None);
        // Only an advertised endpoint is dialed unasked.
        assert_eq!(advertised_agent(&node), None);
        let silent = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": "172.30.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}}});
        assert_eq!(advertised_agent(&silent), None);
        let node = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 11250}}}});
        assert_eq!(advertised_agent(&node), Some("127.0.0.1:11250".parse().unwrap()));
    }
}
