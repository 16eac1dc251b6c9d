//! Exec: CRI `Exec` gives a one-time URL on the runtime's stream server (containerd's, on
//! loopback); the client's upgrade request (SPDY/3.1 or WebSocket) is replayed there and the
//! two upgraded connections are spliced.
//!
//! containerd's stream server speaks SPDY (`v1`..`v4.channel.k8s.io`) and the WebSocket
//! channel protocols up to `v4.channel.k8s.io`. kubectl ≥ 1.30 asks for WebSocket
//! `v5.channel.k8s.io` only: v5 frames are v4's (a channel byte, then data; 3 carries the
//! Status, 4 resize) plus a CLOSE signal (channel 255) that v4 servers ignore. So a v5 request
//! without stdin goes upstream as v4 and the answer's protocol is named v5 again. With stdin
//! the CLOSE signal matters (a command reading stdin to its end must see EOF), and v4 cannot
//! carry it: such a request is refused with 400, on which kubectl falls back to SPDY/3.1,
//! where stdin's end is the stream's FIN.

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::{Body, find_containers, logs::parse_bool, text};
use crate::runtime::{Runtime, api};

pub const V4_CHANNEL: &str = "v4.channel.k8s.io";
pub const V5_CHANNEL: &str = "v5.channel.k8s.io";

/// Headers of an upgrade request that the runtime's stream server needs.
const FORWARDED_REQUEST: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "origin",
];

/// Headers of the upgrade response that go back to the client.
const FORWARDED_RESPONSE: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-accept",
    "sec-websocket-protocol",
];

/// The exec options of a request's query.
fn exec_request(
    container_id: &str,
    query: &[(String, String)],
) -> Result<api::ExecRequest, String> {
    let flag = |name: &str| -> Result<bool, String> {
        match query.iter().rev().find(|(k, _)| k == name) {
            Some((_, v)) => parse_bool(v).ok_or_else(|| format!("invalid {name}={v}")),
            None => Ok(false),
        }
    };
    let cmd: Vec<String> =
        query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    if cmd.is_empty() {
        return Err("you must specify at least one command for the container".into());
    }
    let req = api::ExecRequest {
        container_id: container_id.to_string(),
        cmd,
        tty: flag("tty")?,
        stdin: flag("stdin")?,
        stdout: flag("stdout")?,
        stderr: flag("stderr")?,
    };
    if !(req.stdin || req.stdout || req.stderr) {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(req)
}

pub(super) async fn exec<R: Runtime>(
    runtime: &R,
    netns: Option<&Path>,
    req: Request<Incoming>,
    ns: &str,
    pod: &str,
    container: &str,
    query: &[(String, String)],
) -> Response<Body> {
    let containers = match find_containers(runtime, ns, pod, container).await {
        Ok(c) => c,
        Err(e) => {
            return text(StatusCode::INTERNAL_SERVER_ERROR, format!("listing containers: {e}"));
        }
    };
    let Some(running) =
        containers.iter().find(|c| c.state == api::ContainerState::ContainerRunning as i32)
    else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container \"{container}\" in pod \"{pod}\" is not running"),
        );
    };
    let exec = match exec_request(&running.id, query) {
        Ok(e) => e,
        Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
    };
    if exec.stdin && v5_only(req.headers()) {
        // kubectl ≥ 1.30 falls back to SPDY on any non-101 answer.
        return text(
            StatusCode::BAD_REQUEST,
            "exec with stdin over WebSocket needs v5.channel.k8s.io's CLOSE signal, which the \
             runtime's stream server lacks: use SPDY/3.1",
        );
    }
    let url = match runtime.exec(exec).await {
        Ok(u) => u,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("preparing exec: {e}")),
    };
    let Some((addr, path)) = split_url(&url) else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime gave an unusable streaming URL {url}"),
        );
    };
    proxy_upgrade(req, addr, &path, netns).await
}

/// `http://127.0.0.1:PORT/exec/TOKEN` → the address and the path.
fn split_url(url: &str) -> Option<(SocketAddr, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = authority.parse().ok()?;
    // The stream server is the runtime's, on this machine: never dial anything else.
    addr.ip().is_loopback().then(|| (addr, path.to_string()))
}

/// A WebSocket upgrade offering v5 and not v4: the CLOSE signal (stdin's end) cannot be
/// passed on to a v4 server.
fn v5_only(headers: &HeaderMap) -> bool {
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim))
        .collect();
    websocket && offered.contains(&V5_CHANNEL) && !offered.contains(&V4_CHANNEL)
}

/// The WebSocket subprotocols to ask upstream for, and whether v5 was renamed to v4.
fn upstream_protocols(offered: &str) -> (String, bool) {
    let list: Vec<&str> = offered.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    let has_v4 = list.contains(&V4_CHANNEL);
    let mut renamed = false;
    let out: Vec<&str> = list
        .into_iter()
        .filter_map(|p| match p {
            V5_CHANNEL if has_v4 => None,
            V5_CHANNEL => {
                renamed = true;
                Some(V4_CHANNEL)
            }
            other => Some(other),
        })
        .collect();
    (out.join(", "), renamed)
}

/// A TCP connection to `addr`, from inside `netns` when given (the socket is made on a
/// thread that entered the namespace, then used from here).
async fn connect(addr: SocketAddr, netns: Option<&Path>) -> std::io::Result<tokio::net::TcpStream> {
    let Some(netns) = netns else { return tokio::net::TcpStream::connect(addr).await };
    let netns = netns.to_path_buf();
    let std_stream = tokio::task::spawn_blocking(move || {
        let ns = skiff_cni::netns::NetNs::open(&netns).map_err(std::io::Error::other)?;
        skiff_cni::netns::run_in(&ns, || {
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(10))
        })
        .map_err(std::io::Error::other)?
    })
    .await
    .map_err(std::io::Error::other)??;
    std_stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(std_stream)
}

/// Replay an upgrade request to `addr` (dialled from `netns` when given) and splice the
/// upgraded connections.
pub async fn proxy_upgrade(
    mut req: Request<Incoming>,
    addr: SocketAddr,
    path: &str,
    netns: Option<&Path>,
) -> Response<Body> {
    tracing::debug!(
        upgrade = ?req.headers().get(header::UPGRADE),
        protocols = ?req.headers().get(header::SEC_WEBSOCKET_PROTOCOL),
        %addr,
        "proxying an exec upgrade to the stream server"
    );
    let client_upgrade = hyper::upgrade::on(&mut req);
    let tcp = match connect(addr, netns).await {
        Ok(t) => t,
        Err(e) => {
            return text(StatusCode::BAD_GATEWAY, format!("connecting to the stream server: {e}"));
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(c) => c,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("the stream server: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "stream server connection ended");
        }
    });
    let mut upstream = Request::builder().method(req.method().clone()).uri(path);
    let mut renamed = false;
    if let Some(h) = upstream.headers_mut() {
        copy_headers(req.headers(), h, FORWARDED_REQUEST);
        if let Some(offered) = h.get(header::SEC_WEBSOCKET_PROTOCOL).and_then(|v| v.to_str().ok()) {
            let (protocols, r) = upstream_protocols(offered);
            renamed = r;
            if let Ok(v) = HeaderValue::from_str(&protocols) {
                h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
        }
        if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
            h.insert(header::HOST, v);
        }
    }
    let upstream = match upstream.body(Empty::<Bytes>::new()) {
        Ok(r) => r,
        Err(e) => {
            return text(StatusCode::BAD_REQUEST, format!("building the upstream request: {e}"));
        }
    };
    let mut resp = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("the stream server: {e}")),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        let body = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => Bytes::from(format!("reading the stream server's answer: {e}")),
        };
        return text(status, String::from_utf8_lossy(&body).into_owned());
    }
    let mut out = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    copy_headers(resp.headers(), out.headers_mut(), FORWARDED_RESPONSE);
    if renamed
        && resp.headers().get(header::SEC_WEBSOCKET_PROTOCOL).is_some_and(|v| v == V4_CHANNEL)
    {
        out.headers_mut()
            .insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(V5_CHANNEL));
    }
    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (client, upstream) = match tokio::join!(client_upgrade, upstream_upgrade) {
            (Ok(c), Ok(u)) => (c, u),
            (c, u) => {
                tracing::debug!(client = ?c.err(), upstream = ?u.err(), "exec upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "exec stream ended");
        }
    });
    out
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, names: &[&'static str]) {
    for name in names {
        let name = HeaderName::from_static(name);
        for v in from.get_all(&name) {
            to.append(name.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_goes_upstream_as_v4() {
        assert_eq!(upstream_protocols("v5.channel.k8s.io"), ("v4.channel.k8s.io".into(), true));
        assert_eq!(
            upstream_protocols("v5.channel.k8s.io, v4.channel.k8s.io"),
            ("v4.channel.k8s.io".into(), false)
        );
        assert_eq!(upstream_protocols("channel.k8s.io"), ("channel.k8s.io".into(), false));
    }

    #[test]
    fn only_loopback_stream_servers() {
        assert_eq!(
            split_url("http://127.0.0.1:4321/exec/abc"),
            Some(("127.0.0.1:4321".parse().unwrap(), "/exec/abc".into()))
        );
        assert_eq!(split_url("http://10.0.0.1:4321/exec/abc"), None);
        assert_eq!(split_url("https://127.0.0.1:4321/exec/abc"), None);
    }

    #[test]
    fn exec_options() {
        let q = |s: &[(&str, &str)]| -> Vec<(String, String)> {
            s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
        };
        let r = exec_request(
            "c1",
            &q(&[("command", "echo"), ("command", "hi"), ("stdout", "true"), ("tty", "1")]),
        )
        .unwrap();
        assert_eq!(r.cmd, vec!["echo", "hi"]);
        assert!(r.stdout && r.tty && !r.stdin && !r.stderr);
        assert!(exec_request("c1", &q(&[("stdout", "true")])).is_err());
        assert!(exec_request("c1", &q(&[("command", "x")])).is_err());
    }
}
