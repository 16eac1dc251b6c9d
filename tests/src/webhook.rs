//! An HTTPS webhook server on a loopback port for the tests (admission and CRD conversion
//! webhooks): its own CA (the `caBundle` a configuration trusts), a serving certificate
//! for 127.0.0.1, and a handler from (path, JSON review) to the JSON answer. Served by its
//! own runtime until dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// What a webhook answers: the path asked and the review posted.
pub type Handler = fn(&str, &Value) -> Value;

pub struct Webhook {
    pub addr: SocketAddr,
    /// The CA that signed the serving certificate, PEM.
    pub ca_pem: String,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Webhook {
    pub fn start(handler: Handler) -> Webhook {
        let (ca_pem, cert_pem, key_pem) = certs();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = vec![rustls::pki_types::CertificateDer::from(pem_der(&cert_pem))];
        let key = rustls::pki_types::PrivateKeyDer::try_from(pem_der(&key_pem)).expect("key der");
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| handle(handler, req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Webhook { addr, ca_pem, rt: Some(rt) }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA as a configuration's `caBundle` (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

async fn handle(
    handler: Handler,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let out = handler(&path, &review);
    let mut resp = hyper::Response::new(Full::new(Bytes::from(out.to_string())));
    resp.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// A CA, and a serving certificate and key for 127.0.0.1 signed by it (PEM).
pub fn certs() -> (String, String, String) {
    certs_for(&[])
}

/// [`certs`] with DNS names besides 127.0.0.1 in the serving certificate.
pub fn certs_for(dns_names: &[&str]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "webhook-test-ca");
    let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("serving key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    for name in dns_names {
        let name = (*name).to_string().try_into().expect("a DNS name");
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    let cert = params.signed_by(&key, &issuer).expect("serving cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// The DER bytes of the first PEM block.
fn pem_der(pem: &str) -> Vec<u8> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(b64).expect("PEM base64")
}
