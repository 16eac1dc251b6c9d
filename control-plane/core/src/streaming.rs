//! The plumbing of the pods' streaming subresources shared by the apiserver (which proxies
//! exec and attach to the node's agent) and the agent (which proxies them to the runtime's
//! stream server): the upgrade headers that travel along, and the splice of two upgraded
//! connections.

use http::{HeaderMap, HeaderName};
use hyper_util::rt::TokioIo;

/// Upgrade request headers the agent (and behind it the runtime's stream server) needs;
/// the agent forwards the same to the runtime.
pub const FORWARDED_REQUEST: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "origin",
];

/// Upgrade response headers that go back to the client.
pub const FORWARDED_RESPONSE: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-accept",
    "sec-websocket-protocol",
];

/// Once both the client's and the upstream's connection have switched protocols, splices
/// them on a task of its own until either ends. The agent splices its exec upgrades to the
/// runtime's stream server the same way.
pub fn splice_upgrades(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::join!(client, upstream) {
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
}

/// Copies every value of the headers `names` from `from` to `to`.
pub fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, names: &[&'static str]) {
    for name in names {
        let name = HeaderName::from_static(name);
        for v in from.get_all(&name) {
            to.append(name.clone(), v.clone());
        }
    }
}
