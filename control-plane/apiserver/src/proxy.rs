//! The pods' streaming subresources: `pods/log` and `pods/exec`, proxied to the agent of the
//! pod's node (its HTTPS endpoint at the Node's InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`, authenticated with the apiserver's client
//! certificate, as upstream's apiserver talks to kubelets).
//!
//! Logs stream back as the agent writes them (chunked; `follow` holds the response open).
//! Exec is an HTTP/1.1 upgrade (SPDY/3.1 or WebSocket): the request is replayed to the agent,
//! whose answer (101 or an error) goes back to the client, and on 101 the two upgraded
//! connections are spliced. The agent itself talks to the runtime's stream server.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::registry::str_at;
use super::request::{Query, RequestInfo};
use super::status::{ApiError, ApiResult};
use crate::ApiServer;
use skiff_core::streaming::{FORWARDED_REQUEST, FORWARDED_RESPONSE, copy_headers, splice_upgrades};

/// The kubelet's default port, when a Node does not advertise one.
const DEFAULT_KUBELET_PORT: u16 = 10250;

/// The most a fetched answer may hold (a node's resource metrics are a few hundred bytes
/// per container).
const FETCH_LIMIT: usize = 16 << 20;

/// How long reaching an agent (TCP and TLS) may take.
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Log options passed through to the agent.
const LOG_PARAMS: &[&str] =
    &["follow", "previous", "timestamps", "tailLines", "sinceSeconds", "sinceTime", "limitBytes"];

/// Upstream's `ValidatePodLogOptions`: integers in range (tailLines >= 0, limitBytes and
/// sinceSeconds > 0), at most one of sinceSeconds and sinceTime.
fn validate_log_options(query: &Query, name: &str) -> ApiResult<()> {
    use crate::status::Cause;
    let mut causes = Vec::new();
    let mut check = |field: &str, min: i64, msg: &str| -> ApiResult<()> {
        if let Some(v) = query.int(field)?
            && v < min
        {
            causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                message: format!("Invalid value: {v}: {msg}"),
                field: field.into(),
            });
        }
        Ok(())
    };
    check("tailLines", 0, "must be greater than or equal to 0")?;
    check("limitBytes", 1, "must be greater than 0")?;
    check("sinceSeconds", 1, "must be greater than 0")?;
    if query.has("sinceSeconds") && query.has("sinceTime") {
        causes.push(Cause {
            reason: "FieldValueForbidden".into(),
            message: "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
                .into(),
            field: String::new(),
        });
    }
    if causes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = causes
        .iter()
        .map(|c| {
            if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            }
        })
        .collect();
    let msg = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
    Err(ApiError::invalid(format!("PodLogOptions \"{name}\" is invalid: {msg}"), causes)
        .with_details("", "PodLogOptions", name))
}

/// Exec options passed through to the agent.
const EXEC_PARAMS: &[&str] = &["command", "stdin", "stdout", "stderr", "tty"];

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

/// Is this one of the subresources served here?
pub fn handles(info: &RequestInfo) -> bool {
    info.group.is_empty()
        && info.resource == "pods"
        && info.name.is_some()
        && matches!(info.subresource.as_deref(), Some("log" | "exec" | "attach" | "portforward"))
}

pub async fn serve(
    server: &Arc<ApiServer>,
    info: RequestInfo,
    query: Query,
    mut parts: http::request::Parts,
) -> ApiResult<Response> {
    let (Some(ns), Some(name)) = (info.namespace.as_deref(), info.name.as_deref()) else {
        return Err(ApiError::path_not_found());
    };
    let sub = info.subresource.as_deref().unwrap_or("");
    match (sub, &parts.method) {
        ("log", &Method::GET) => {}
        ("exec", &Method::GET | &Method::POST) => {}
        ("attach" | "portforward", &Method::GET | &Method::POST) => {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "NotImplemented",
                format!("pods/{sub} is not supported by skiff (pods/exec and pods/log are)"),
            ));
        }
        _ => return Err(ApiError::method_not_allowed(parts.method.as_str())),
    }
    if sub == "log" {
        validate_log_options(&query, name)?;
    }
    let Some(client) = server.config.kubelet_client.clone() else {
        return Err(ApiError::service_unavailable(
            "this apiserver has no client certificate for the agents' streaming endpoints",
        ));
    };
    let pod = get(server, "pods", Some(ns), name).await?;
    let container = container_name(&pod, name, query.get("container"))?;
    let node_name = str_at(&pod, &["spec", "nodeName"]);
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!("pod {name} does not have a host assigned")));
    }
    let node = get(server, "nodes", None, &node_name).await?;
    let addr = node_address(&node).ok_or_else(|| {
        ApiError::bad_request(format!("node {node_name} has no InternalIP or ExternalIP address"))
    })?;
    let (kind, params) =
        if sub == "log" { ("containerLogs", LOG_PARAMS) } else { ("exec", EXEC_PARAMS) };
    let mut path = format!("/{kind}/{}/{}/{}", encode(ns), encode(name), encode(&container));
    // Repeated parameters (exec's `command`) survive: the raw query, not `Query`'s map.
    let qs = {
        let mut ser = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            if params.contains(&k.as_ref()) {
                ser.append_pair(&k, &v);
            }
        }
        ser.finish()
    };
    if !qs.is_empty() {
        path.push('?');
        path.push_str(&qs);
    }
    if sub == "log" {
        logs(&client, addr, &path).await
    } else {
        if !is_upgrade(&parts.headers) {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(ApiError::bad_request(
                "this connection cannot be upgraded (exec needs HTTP/1.1)",
            ));
        };
        upgrade(&client, addr, &parts.method, &path, &parts.headers, on_upgrade).await
    }
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
    }) && headers.contains_key(header::UPGRADE)
}

async fn get(server: &ApiServer, plural: &str, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    let rt = server.registry.find("", "v1", plural).ok_or_else(ApiError::path_not_found)?;
    let kv = server
        .store
        .get(&rt.key(ns, name))
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found(plural, name))?;
    serde_json::from_slice(&kv.value).map_err(ApiError::internal)
}

/// The container a request is for: the named one if the pod has it, else the only one.
fn container_name(pod: &Value, pod_name: &str, asked: Option<&str>) -> ApiResult<String> {
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    match asked {
        Some(c) if !c.is_empty() => {
            let known = containers
                .iter()
                .chain(&names("initContainers"))
                .chain(&names("ephemeralContainers"))
                .any(|n| n == c);
            if known {
                Ok(c.to_string())
            } else {
                Err(ApiError::bad_request(format!("container {c} is not valid for pod {pod_name}")))
            }
        }
        _ if containers.len() == 1 => Ok(containers[0].clone()),
        _ => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// The endpoint a node's agent advertises, only if it advertises one (a non-zero
/// `kubeletEndpoint` port): what is dialed without a user asking (the resource metrics
/// scrape). A simulated node advertises none, and its made-up address is never dialed.
pub(crate) fn advertised_agent(node: &Value) -> Option<SocketAddr> {
    node.pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)?;
    node_address(node)
}

/// The node's agent endpoint: InternalIP (else ExternalIP) and the advertised port.
fn node_address(node: &Value) -> Option<SocketAddr> {
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

async fn logs(client: &KubeletClient, addr: SocketAddr, path: &str) -> ApiResult<Response> {
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
pub(crate) async fn fetch(
    client: &KubeletClient,
    addr: SocketAddr,
    path: &str,
) -> ApiResult<Bytes> {
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

async fn upgrade(
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
    fn picks_the_container() {
        let pod =
            json!({"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}});
        assert_eq!(container_name(&pod, "p", None).unwrap(), "a");
        assert_eq!(container_name(&pod, "p", Some("i")).unwrap(), "i");
        assert!(container_name(&pod, "p", Some("x")).is_err());
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let e = container_name(&two, "p", None).unwrap_err();
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
    }

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
