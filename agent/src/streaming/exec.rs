//! Exec: CRI `Exec` gives a one-time URL on the runtime's stream server (containerd's, on
//! loopback); the client's upgrade request (SPDY/3.1 or WebSocket) is replayed there and the
//! two upgraded connections are spliced.
//!
//! containerd's stream server speaks SPDY (`v1`..`v4.channel.k8s.io`) and the WebSocket
//! channel protocols up to `v4.channel.k8s.io`, which are spliced through unchanged. kubectl
//! ≥ 1.30 asks for WebSocket `v5.channel.k8s.io` only, which the runtime lacks: as upstream's
//! apiserver does, such a request is translated — the agent answers the WebSocket handshake
//! itself and drives the runtime over SPDY/3.1 ([`super::spdy`]): v5 frames (a channel byte,
//! then data: 0 stdin, 1 stdout, 2 stderr, 3 the Status, 4 resize, 255 CLOSE of a channel)
//! map onto the SPDY streams of the same types, and CLOSE of stdin onto its FIN.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use skiff_core::streaming::{FORWARDED_REQUEST, FORWARDED_RESPONSE, copy_headers, splice_upgrades};

use super::response::{Body, text};
use super::{logs::parse_bool, spdy, websocket};
use crate::runtime::{self, Runtime, api};

pub const V4_CHANNEL: &str = "v4.channel.k8s.io";
pub const V5_CHANNEL: &str = "v5.channel.k8s.io";

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
    let mut req = api::ExecRequest {
        container_id: container_id.to_string(),
        cmd,
        tty: flag("tty")?,
        stdin: flag("stdin")?,
        stdout: flag("stdout")?,
        stderr: flag("stderr")?,
    };
    // With a terminal stderr is merged into stdout (CRI refuses both; the kubelet drops it).
    req.stderr &= !req.tty;
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
    let streams = Streams::of(&exec);
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
    if v5_only(req.headers()) {
        v5_to_spdy(req, addr, &path, netns, streams).await
    } else {
        proxy_upgrade(req, addr, &path, netns).await
    }
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

/// A WebSocket upgrade offering v5 and not v4 (kubectl ≥ 1.30): translated to SPDY.
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
    let mut headers = HeaderMap::new();
    copy_headers(req.headers(), &mut headers, FORWARDED_REQUEST);
    let mut resp = match upgrade_upstream(addr, netns, req.method().clone(), path, headers).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    let mut out = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    copy_headers(resp.headers(), out.headers_mut(), FORWARDED_RESPONSE);
    splice_upgrades(client_upgrade, hyper::upgrade::on(&mut resp));
    out
}

/// Send an upgrade request to the stream server at `addr`; its 101 response (to upgrade), or
/// the answer to give the client when it refuses.
async fn upgrade_upstream(
    addr: SocketAddr,
    netns: Option<&Path>,
    method: http::Method,
    path: &str,
    mut headers: HeaderMap,
) -> Result<Response<Incoming>, Response<Body>> {
    let tcp = connect(addr, netns).await.map_err(|e| {
        text(StatusCode::BAD_GATEWAY, format!("connecting to the stream server: {e}"))
    })?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| text(StatusCode::BAD_GATEWAY, format!("the stream server: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "stream server connection ended");
        }
    });
    if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
        headers.insert(header::HOST, v);
    }
    let mut upstream = Request::builder().method(method).uri(path);
    if let Some(h) = upstream.headers_mut() {
        *h = headers;
    }
    let upstream = upstream.body(Empty::<Bytes>::new()).map_err(|e| {
        text(StatusCode::BAD_REQUEST, format!("building the upstream request: {e}"))
    })?;
    let resp = sender
        .send_request(upstream)
        .await
        .map_err(|e| text(StatusCode::BAD_GATEWAY, format!("the stream server: {e}")))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        let body = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => Bytes::from(format!("reading the stream server's answer: {e}")),
        };
        return Err(text(status, String::from_utf8_lossy(&body).into_owned()));
    }
    Ok(resp)
}

/// Which streams an exec has.
#[derive(Debug, Clone, Copy)]
struct Streams {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl Streams {
    fn of(exec: &api::ExecRequest) -> Streams {
        Streams { stdin: exec.stdin, stdout: exec.stdout, stderr: exec.stderr, tty: exec.tty }
    }
}

// SPDY stream ids of the exec streams (client-initiated: odd), and v5 channels.
const ERROR_STREAM: u32 = 1;
const STDIN_STREAM: u32 = 3;
const STDOUT_STREAM: u32 = 5;
const STDERR_STREAM: u32 = 7;
const RESIZE_STREAM: u32 = 9;
const CH_STDIN: u8 = 0;
const CH_STDOUT: u8 = 1;
const CH_STDERR: u8 = 2;
const CH_ERROR: u8 = 3;
const CH_RESIZE: u8 = 4;
const CH_CLOSE: u8 = 255;

/// Answer a WebSocket v5 exec ourselves and drive the runtime's stream server over SPDY.
async fn v5_to_spdy(
    mut req: Request<Incoming>,
    addr: SocketAddr,
    path: &str,
    netns: Option<&Path>,
    streams: Streams,
) -> Response<Body> {
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).and_then(|v| v.to_str().ok())
    else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let accept = websocket::accept_key(key);
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert("x-stream-protocol-version", HeaderValue::from_static(V4_CHANNEL));
    let mut resp = match upgrade_upstream(addr, netns, http::Method::POST, path, headers).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    let mut out = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = out.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(V5_CHANNEL));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
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
        if let Err(e) = bridge(TokioIo::new(client), TokioIo::new(upstream), streams).await {
            tracing::debug!(error = %e, "WebSocket v5 exec ended");
        }
    });
    out
}

/// Translate between a v5 WebSocket client and a v4 SPDY stream server until either ends.
async fn bridge<C, U>(client: C, upstream: U, s: Streams) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Send + Unpin,
    U: AsyncRead + AsyncWrite + Send + Unpin,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);

    // Open the streams the server waits for (it times out on missing ones).
    let mut enc = spdy::HeaderEncoder::default();
    let mut opening = enc.syn_stream(ERROR_STREAM, &[("streamtype", "error")], false);
    let wanted = [
        (s.stdin, STDIN_STREAM, "stdin"),
        (s.stdout, STDOUT_STREAM, "stdout"),
        (s.stderr, STDERR_STREAM, "stderr"),
        (s.tty, RESIZE_STREAM, "resize"),
    ];
    for (on, id, kind) in wanted {
        if on {
            opening.extend(enc.syn_stream(id, &[("streamtype", kind)], false));
        }
    }
    up_w.write_all(&opening).await?;
    up_w.flush().await?;

    let (ws_tx, mut ws_rx) = mpsc::channel::<Vec<u8>>(64);
    let (spdy_tx, mut spdy_rx) = mpsc::channel::<Vec<u8>>(64);
    let ws_writer = async {
        while let Some(f) = ws_rx.recv().await {
            if client_w.write_all(&f).await.is_err() || client_w.flush().await.is_err() {
                break;
            }
        }
        let _ = client_w.shutdown().await;
    };
    let spdy_writer = async {
        while let Some(f) = spdy_rx.recv().await {
            if up_w.write_all(&f).await.is_err() || up_w.flush().await.is_err() {
                break;
            }
        }
        let _ = up_w.shutdown().await;
    };
    let (ws_tx2, spdy_tx2) = (ws_tx.clone(), spdy_tx.clone());
    let from_client = async move {
        let mut reader = websocket::Reader::default();
        let mut stdin_open = s.stdin;
        loop {
            let msg = match reader.next(&mut client_r).await {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the WebSocket client");
                    return;
                }
            };
            tracing::trace!(?msg, "from the WebSocket client");
            let frame = match msg.opcode {
                websocket::OP_BINARY => match msg.data.split_first() {
                    Some((&CH_STDIN, data)) if stdin_open => {
                        Some((spdy_tx2.clone(), spdy::data(STDIN_STREAM, false, data)))
                    }
                    Some((&CH_RESIZE, data)) if s.tty => {
                        Some((spdy_tx2.clone(), spdy::data(RESIZE_STREAM, false, data)))
                    }
                    Some((&CH_CLOSE, [CH_STDIN, ..])) if stdin_open => {
                        stdin_open = false;
                        Some((spdy_tx2.clone(), spdy::data(STDIN_STREAM, true, &[])))
                    }
                    _ => None,
                },
                websocket::OP_PING => {
                    Some((ws_tx2.clone(), websocket::frame(websocket::OP_PONG, &msg.data)))
                }
                websocket::OP_CLOSE => {
                    let _ = ws_tx2.send(websocket::close(1000)).await;
                    let _ = spdy_tx2.send(spdy::goaway()).await;
                    return;
                }
                _ => None,
            };
            if let Some((tx, f)) = frame
                && tx.send(f).await.is_err()
            {
                return;
            }
        }
    };
    let from_upstream = async move {
        loop {
            let frame = match spdy::read_frame(&mut up_r).await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the stream server");
                    break;
                }
            };
            tracing::trace!(?frame, "from the stream server");
            match frame {
                spdy::Frame::Data { stream, data, .. } => {
                    let ch = match stream {
                        ERROR_STREAM => CH_ERROR,
                        STDOUT_STREAM => CH_STDOUT,
                        STDERR_STREAM => CH_STDERR,
                        _ => continue,
                    };
                    if data.is_empty() {
                        continue;
                    }
                    let mut payload = Vec::with_capacity(data.len() + 1);
                    payload.push(ch);
                    payload.extend_from_slice(&data);
                    if ws_tx.send(websocket::frame(websocket::OP_BINARY, &payload)).await.is_err() {
                        return;
                    }
                }
                spdy::Frame::Control { kind: spdy::PING, payload, .. } => {
                    let _ = spdy_tx.send(spdy::ping(&payload)).await;
                }
                spdy::Frame::Control { kind: spdy::GOAWAY, .. } => break,
                spdy::Frame::Control { .. } => {}
            }
        }
        // The command is done (its Status went out on channel 3): end the WebSocket.
        let _ = ws_tx.send(websocket::close(1000)).await;
    };
    let readers = async {
        tokio::select! {
            _ = from_upstream => {}
            _ = from_client => {}
        }
    };
    tokio::join!(readers, ws_writer, spdy_writer);
    Ok(())
}

/// The pod's containers with this name, newest first.
pub(crate) async fn find_containers<R: Runtime>(
    runtime: &R,
    ns: &str,
    pod: &str,
    container: &str,
) -> runtime::Result<Vec<api::Container>> {
    let labels = HashMap::from([
        (runtime::POD_NAMESPACE_LABEL.to_string(), ns.to_string()),
        (runtime::POD_NAME_LABEL.to_string(), pod.to_string()),
        (runtime::CONTAINER_NAME_LABEL.to_string(), container.to_string()),
    ]);
    let mut found = runtime.list_containers(&labels).await?;
    found.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_only_is_translated() {
        let h = |p: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(p).unwrap());
            h
        };
        assert!(v5_only(&h("v5.channel.k8s.io")));
        assert!(!v5_only(&h("v5.channel.k8s.io, v4.channel.k8s.io")));
        assert!(!v5_only(&h("channel.k8s.io")));
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
