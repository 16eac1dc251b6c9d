//! The front proxy: a request under `/apis/<group>/<version>` of an APIService that names a
//! Service goes to that extension apiserver over HTTPS, as upstream's aggregator proxies
//! it. The request was authenticated and authorized here already; the extension learns who
//! asked from the request headers (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`),
//! which it trusts because the connection presents the front proxy's client certificate,
//! signed by the request-header CA published in `kube-system/extension-apiserver-
//! authentication`. Whatever the client sent under those names, and its credentials, are
//! dropped first.
//!
//! The extension's serving certificate is checked against the APIService's `caBundle` for
//! the name `<service>.<namespace>.svc` (or not at all with `insecureSkipTLSVerify`). The
//! response streams back as the extension writes it, so watches stay open. Each request
//! opens its own connection (HTTP/1.1); upgrades (exec, port-forward) are not proxied.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::remotes::Remote;
use super::resolve::{self, Unresolved};
use crate::config::FrontProxy;
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;

/// The request headers an extension apiserver reads the user from (upstream's
/// `--requestheader-username-headers`, `-group-headers`, `-extra-headers-prefix`).
pub const USER_HEADER: &str = "X-Remote-User";
pub const GROUP_HEADER: &str = "X-Remote-Group";
pub const EXTRA_PREFIX: &str = "X-Remote-Extra-";

/// How long dialing and the TLS handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Resolve(Unresolved),
    #[error("reading caBundle")]
    CaBundle(#[source] rustls::pki_types::pem::Error),
    #[error("caBundle holds no usable certificate")]
    NoCertificates,
    #[error("loading the front proxy's client certificate")]
    ClientCert(#[source] rustls::pki_types::pem::Error),
    #[error("building the TLS client")]
    Tls(#[source] rustls::Error),
    #[error("invalid service name {0:?}")]
    ServerName(String),
    #[error("dial tcp {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("dial tcp {addr}: i/o timeout")]
    Timeout { addr: SocketAddr },
    #[error("TLS handshake with {addr}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange with {addr}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}

/// The error with its causes, as one line (`dial tcp 127.0.0.1:1: connection refused`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Proxy one request to the APIService's extension apiserver.
pub async fn serve(
    state: &State,
    remote: &Remote,
    mut parts: http::request::Parts,
    body: Body,
) -> ApiResult<Response> {
    if !remote.available {
        return Err(ApiError::service_unavailable("service unavailable"));
    }
    if parts.headers.contains_key(header::UPGRADE) {
        return Err(ApiError::new(
            http::StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "upgrade requests to extension apiservers are not supported by skiff",
        ));
    }
    let user = parts.extensions.get::<UserInfo>().cloned().unwrap_or_else(UserInfo::anonymous);
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = path.parse().map_err(|_| ApiError::bad_request("invalid request path"))?;
    *request.headers_mut() = forwarded_headers(&std::mem::take(&mut parts.headers), &user);
    let response = send(state, remote, request).await.map_err(|e| {
        tracing::info!(apiservice = %remote.name, error = %chain(&e), "proxying to an extension apiserver");
        ApiError::service_unavailable(format!("Error trying to reach service: '{}'", chain(&e)))
    })?;
    let (mut head, incoming) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    Ok(Response::from_parts(head, Body::new(incoming)))
}

/// Send a request (path and headers already set, apart from Host) to the extension
/// apiserver of `remote`, returning as soon as the response head arrives.
pub async fn send<B>(
    state: &State,
    remote: &Remote,
    mut request: http::Request<B>,
) -> Result<http::Response<Incoming>, Error>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = resolve::endpoint(state, &remote.service).map_err(Error::Resolve)?;
    let dns = format!("{}.{}.svc", remote.service.name, remote.service.namespace);
    let server_name =
        ServerName::try_from(dns.clone()).map_err(|_| Error::ServerName(dns.clone()))?;
    let cfg = tls_config(state.config.front_proxy.as_ref(), remote)?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| Error::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(server_name, tcp)
            .await
            .map_err(|source| Error::Handshake { addr, source })
    };
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| Error::Timeout { addr })??;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|source| Error::Http { addr, source })?;
    // The connection lives as long as the response body is read (a watch: its whole
    // life); it ends when both sides are done with it.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let host = format!("{dns}:{}", remote.service.port);
    if let Ok(v) = HeaderValue::from_str(&host) {
        request.headers_mut().insert(header::HOST, v);
    }
    sender.send_request(request).await.map_err(|source| Error::Http { addr, source })
}

/// The TLS client towards one extension: its CA (or none), the front proxy's certificate.
fn tls_config(
    front_proxy: Option<&FrontProxy>,
    remote: &Remote,
) -> Result<rustls::ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?;
    let builder = if remote.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::pki::UnverifiedServer(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&remote.ca_bundle) {
            let _ = roots.add(cert.map_err(Error::CaBundle)?);
        }
        if roots.is_empty() {
            return Err(Error::NoCertificates);
        }
        builder.with_root_certificates(roots)
    };
    let mut cfg = match front_proxy {
        Some(fp) => {
            let certs = CertificateDer::pem_slice_iter(fp.client_cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(Error::ClientCert)?;
            let key = PrivateKeyDer::from_pem_slice(fp.client_key_pem.as_bytes())
                .map_err(Error::ClientCert)?;
            builder.with_client_auth_cert(certs, key).map_err(Error::Tls)?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The headers sent on: the client's, without its credentials, impersonation, the
/// request-header names it might have forged and hop-by-hop headers, then the
/// authenticated user's name, groups and extra as upstream's auth proxy round tripper
/// sets them (an extra's key percent-encoded, its values as they are).
pub fn forwarded_headers(incoming: &HeaderMap, user: &UserInfo) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(incoming.len() + 2 + user.groups.len());
    for (name, value) in incoming {
        let n = name.as_str();
        let dropped = n == "authorization"
            || n.starts_with("impersonate-")
            || n.starts_with("x-remote-")
            || n == "host"
            || is_hop_by_hop(n);
        if !dropped {
            out.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&user.name) {
        out.insert(HeaderName::from_static("x-remote-user"), v);
    }
    for group in &user.groups {
        if let Ok(v) = HeaderValue::from_str(group) {
            out.append(HeaderName::from_static("x-remote-group"), v);
        }
    }
    for (key, values) in &user.extra {
        let Ok(name) = HeaderName::try_from(format!("x-remote-extra-{}", escape_key(key))) else {
            continue;
        };
        for value in values {
            if let Ok(v) = HeaderValue::from_str(value) {
                out.append(name.clone(), v);
            }
        }
    }
    out
}

/// An extra's key as a header name: characters outside an HTTP token percent-encoded
/// (upstream's `headerKeyEscape`), so `example.org/scopes` stays readable and a key with
/// a space or `%` round-trips.
fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        let token = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        if token {
            out.push(b.to_ascii_lowercase() as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> =
        headers.keys().filter(|n| is_hop_by_hop(n.as_str())).cloned().collect();
    for n in names {
        headers.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_user_replaces_whatever_identity_the_client_sent() {
        let mut incoming = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("impersonate-user", "root"),
            ("x-remote-user", "forged"),
            ("X-Remote-Group", "system:masters"),
            ("x-remote-extra-scopes", "all"),
            ("connection", "keep-alive"),
            ("host", "client.example"),
            ("accept", "application/json"),
            ("user-agent", "kubectl/v1.33.0"),
        ] {
            incoming.append(HeaderName::try_from(k).unwrap(), HeaderValue::from_static(v));
        }
        let user = UserInfo {
            name: "jane".into(),
            uid: String::new(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra: BTreeMap::from([(
                "example.org/Scopes Key".into(),
                vec!["a".into(), "b".into()],
            )]),
        };
        let out = forwarded_headers(&incoming, &user);
        let all =
            |n: &str| -> Vec<&str> { out.get_all(n).iter().map(|v| v.to_str().unwrap()).collect() };
        assert_eq!(all("x-remote-user"), ["jane"]);
        assert_eq!(all("x-remote-group"), ["dev", "system:authenticated"]);
        assert_eq!(all("x-remote-extra-example.org%2Fscopes%20key"), ["a", "b"]);
        assert!(all("x-remote-extra-scopes").is_empty(), "a forged extra is dropped");
        for gone in ["authorization", "impersonate-user", "connection", "host"] {
            assert!(out.get(gone).is_none(), "{gone} is not forwarded");
        }
        assert_eq!(all("accept"), ["application/json"]);
        assert_eq!(all("user-agent"), ["kubectl/v1.33.0"]);
    }
}
