//! Joining a node with a bootstrap token, client side (what `skiff-agent --server URL
//! --token TOKEN` calls), and creating join tokens (`skiff-server token create`).
//!
//! Trust in the server is established as kubeadm does: the agent reads the public
//! `kube-public/cluster-info` ConfigMap without verifying TLS, and accepts the CA it contains
//! only if its `jws-kubeconfig-<token id>` signature (HS256 keyed with the token) verifies.
//! It then posts a CertificateSigningRequest for `system:node:<name>` with the token and
//! writes a kubeconfig with the signed client certificate. The token is consumed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a bootstrap token (<6 chars>.<16 chars>, lowercase alphanumerics)")]
    TokenFormat(String),
    #[error("loading the kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building a client for {0}")]
    Client(String, #[source] kube::Error),
    #[error("calling the apiserver: {step}")]
    Api {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("cluster-info has no signature for this token (unknown, expired or used token)")]
    NoSignature,
    #[error("cluster-info's signature does not verify with this token: refusing its CA")]
    BadSignature,
    #[error("cluster-info: {0}")]
    ClusterInfo(String),
    #[error("generating the node key and certificate request")]
    Key(#[source] rcgen::Error),
    #[error("the apiserver returned no certificate")]
    NoCertificate,
    #[error("CertificateSigningRequest {name} was {outcome}: {message}")]
    NotIssued { name: String, outcome: &'static str, message: String },
    #[error("CertificateSigningRequest {0} was neither approved and signed nor denied in time")]
    Pending(String),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub const CLUSTER_INFO: &str = "cluster-info";
const JWS_PREFIX: &str = "jws-kubeconfig-";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

fn b64url(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// The detached JWS (`header..signature`, HS256 keyed with the full token) of `payload`.
pub fn detached_jws(token: &str, token_id: &str, payload: &str) -> String {
    let header = b64url(format!(r#"{{"alg":"HS256","kid":"{token_id}"}}"#).as_bytes());
    let signing_input = format!("{header}.{}", b64url(payload.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    let sig = ring::hmac::sign(&key, signing_input.as_bytes());
    format!("{header}..{}", b64url(sig.as_ref()))
}

fn verify_jws(token: &str, token_id: &str, payload: &str, jws: &str) -> bool {
    let Some((header, sig)) = jws.split_once("..") else { return false };
    let Ok(sig) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig) else {
        return false;
    };
    let expected_header = b64url(format!(r#"{{"alg":"HS256","kid":"{token_id}"}}"#).as_bytes());
    if header != expected_header {
        return false;
    }
    let signing_input = format!("{header}.{}", b64url(payload.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    ring::hmac::verify(&key, signing_input.as_bytes(), &sig).is_ok()
}

async fn client_from(path: &Path) -> Result<(kube::Client, String), Error> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|source| Error::Kubeconfig { path: path.to_path_buf(), source })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|source| Error::Kubeconfig { path: path.to_path_buf(), source })?;
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| Error::Client(url.clone(), e))?;
    Ok((client, url))
}

/// Create a join token valid for `ttl` through the admin kubeconfig, and sign cluster-info
/// with it. Returns the token (`<id>.<secret>`).
pub async fn create_token(admin_kubeconfig: &Path, ttl: Duration) -> Result<String, Error> {
    let (client, _) = client_from(admin_kubeconfig).await?;
    let kc = kube::config::Kubeconfig::read_from(admin_kubeconfig)
        .map_err(|source| Error::Kubeconfig { path: admin_kubeconfig.to_path_buf(), source })?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| Error::ClusterInfo("the admin kubeconfig names no cluster".into()))?;
    let server = cluster.server.clone().unwrap_or_default();
    let ca = cluster.certificate_authority_data.clone().unwrap_or_default();
    let (token, secret) = new_bootstrap_token(ttl);
    let (id, _) = parse_bootstrap(&token).ok_or_else(|| Error::TokenFormat(token.clone()))?;
    let secret: Secret = serde_json::from_value(secret)
        .map_err(|e| Error::ClusterInfo(format!("building the token Secret: {e}")))?;
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|source| Error::Api { step: "creating the token Secret", source })?;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts: []\nusers: []\n"
    );
    let jws = detached_jws(&token, id, &kubeconfig);
    let patch = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_INFO, "namespace": "kube-public"},
        "data": {"kubeconfig": kubeconfig, format!("{JWS_PREFIX}{id}"): jws},
    });
    // One field manager per token: an apply owns its signature, and the next token's apply
    // (which does not name it) leaves it in place.
    let manager = format!("skiff-token-{id}");
    Api::<ConfigMap>::namespaced(client, "kube-public")
        .patch(CLUSTER_INFO, &PatchParams::apply(&manager).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::Api { step: "signing cluster-info", source })?;
    Ok(token)
}

/// Join: trust the server's CA through cluster-info, exchange `token` for a node client
/// certificate (`system:node:<node_name>`), and write `<dir>/kubelet.kubeconfig` (and
/// `<dir>/ca.crt`). Returns the kubeconfig's path. The token cannot be used again.
pub async fn bootstrap(
    server_url: &str,
    token: &str,
    node_name: &str,
    dir: &Path,
) -> Result<PathBuf, Error> {
    let (id, _) = parse_bootstrap(token).ok_or_else(|| Error::TokenFormat(token.into()))?;
    let url: http::Uri =
        server_url.parse().map_err(|e| Error::ClusterInfo(format!("server URL: {e}")))?;
    // 1. cluster-info, anonymously and without TLS verification: the JWS authenticates it.
    let mut anon = kube::Config::new(url.clone());
    anon.accept_invalid_certs = true;
    let anon = kube::Client::try_from(anon).map_err(|e| Error::Client(server_url.into(), e))?;
    let info = Api::<ConfigMap>::namespaced(anon, "kube-public")
        .get(CLUSTER_INFO)
        .await
        .map_err(|source| Error::Api { step: "reading kube-public/cluster-info", source })?;
    let data = info.data.unwrap_or_default();
    let kubeconfig =
        data.get("kubeconfig").ok_or_else(|| Error::ClusterInfo("no kubeconfig".into()))?;
    let jws = data.get(&format!("{JWS_PREFIX}{id}")).ok_or(Error::NoSignature)?;
    if !verify_jws(token, id, kubeconfig, jws) {
        return Err(Error::BadSignature);
    }
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| Error::ClusterInfo(format!("parsing its kubeconfig: {e}")))?;
    let ca_b64 = parsed
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
        .ok_or_else(|| Error::ClusterInfo("no certificate-authority-data".into()))?;
    // 2. A key and a CSR for system:node:<name>.
    let key = rcgen::KeyPair::generate().map_err(Error::Key)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(Error::Key)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("system:node:{node_name}"));
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr_pem = params.serialize_request(&key).map_err(Error::Key)?.pem().map_err(Error::Key)?;
    // 3. The exchange, authenticated by the token, TLS verified with the CA.
    let token_kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca_b64}\ncontexts:\n- name: bootstrap\n  context:\n    cluster: skiff\n    user: bootstrap\ncurrent-context: bootstrap\nusers:\n- name: bootstrap\n  user:\n    token: {token}\n"
    );
    let kc = kube::config::Kubeconfig::from_yaml(&token_kubeconfig)
        .map_err(|source| Error::Kubeconfig { path: PathBuf::from("<bootstrap>"), source })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|source| Error::Kubeconfig { path: PathBuf::from("<bootstrap>"), source })?;
    let client = kube::Client::try_from(config).map_err(|e| Error::Client(server_url.into(), e))?;
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {"request": b64(&csr_pem), "signerName": KUBELET_CLIENT_SIGNER,
                 "usages": ["digital signature", "client auth"]},
    });
    let req = http::Request::post("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&csr).unwrap_or_default())
        .map_err(|e| Error::ClusterInfo(format!("building the request: {e}")))?;
    let signed: Value = client
        .request(req)
        .await
        .map_err(|source| Error::Api { step: "requesting the node certificate", source })?;
    let cert_b64 = signed
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .ok_or(Error::NoCertificate)?;
    // 4. The node's kubeconfig.
    std::fs::create_dir_all(dir).map_err(|source| Error::Write { path: dir.into(), source })?;
    let path = dir.join("kubelet.kubeconfig");
    let cert_pem = base64::engine::general_purpose::STANDARD
        .decode(cert_b64)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or(Error::NoCertificate)?;
    let cfg = node_kubeconfig(server_url, &ca_b64, node_name, &cert_pem, &key.serialize_pem());
    replace_private(&path, &cfg)?;
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(&ca_b64)
        .map_err(|e| Error::ClusterInfo(format!("CA data: {e}")))?;
    std::fs::write(dir.join("ca.crt"), ca_pem)
        .map_err(|source| Error::Write { path: dir.join("ca.crt"), source })?;
    Ok(path)
}

/// A new node client certificate through a stored CertificateSigningRequest, asked as the
/// node itself (rotation): the request is created and, for up to `wait`, polled until the
/// approving and signing controllers (or an administrator: `kubectl certificate approve`)
/// issued it. Returns the certificate and its new key (PEM).
pub async fn request_node_certificate(
    client: &kube::Client,
    node_name: &str,
    wait: Duration,
) -> Result<(String, String), Error> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let (csr_pem, key_pem) = crate::certificates::new_request(
        &format!("{}{node_name}", crate::certificates::NODE_PREFIX),
        crate::certificates::NODES_GROUP,
        &[],
        &[],
    )
    .map_err(Error::Key)?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {"request": b64(&csr_pem), "signerName": KUBELET_CLIENT_SIGNER,
                 "usages": ["digital signature", "client auth"]},
    }))
    .map_err(|e| Error::ClusterInfo(format!("building the request: {e}")))?;
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|source| Error::Api { step: "requesting a new node certificate", source })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "requested a new node client certificate");
    let deadline = tokio::time::Instant::now() + wait;
    let mut last_log = tokio::time::Instant::now();
    loop {
        let current = api
            .get(&name)
            .await
            .map_err(|source| Error::Api { step: "reading the certificate request", source })?;
        let status = current.status.unwrap_or_default();
        for c in status.conditions.iter().flatten() {
            let outcome = match c.type_.as_str() {
                "Denied" => "denied",
                "Failed" => "not signed",
                _ => continue,
            };
            return Err(Error::NotIssued {
                name,
                outcome,
                message: c.message.clone().unwrap_or_default(),
            });
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            let cert = String::from_utf8(cert.0).map_err(|_| Error::NoCertificate)?;
            return Ok((cert, key_pem));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Pending(name));
        }
        if last_log.elapsed() >= Duration::from_secs(30) {
            tracing::info!(csr = %name, "waiting for the certificate request to be approved and signed");
            last_log = tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The node kubeconfig of [`bootstrap`]: the server, its CA and the node's client
/// certificate and key, embedded.
pub fn node_kubeconfig(
    server_url: &str,
    ca_b64: &str,
    node_name: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    let user = format!("system:node:{node_name}");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca_b64}\ncontexts:\n- name: {user}@skiff\n  context:\n    cluster: skiff\n    user: {user}\ncurrent-context: {user}@skiff\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n",
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

/// Writes `content` to `path` (mode 0600) through a temporary file and a rename, so a crash
/// leaves the old or the new file, never half of one.
pub fn replace_private(path: &Path, content: &str) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    write_private(&tmp, content)?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Write { path: path.to_path_buf(), source })
}

fn write_private(path: &Path, content: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| Error::Write { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(content.as_bytes()).map_err(err)
}

/// The signer of node client certificates (upstream's name).
pub const KUBELET_CLIENT_SIGNER: &str = crate::certificates::KUBE_APISERVER_CLIENT_KUBELET;

/// `<6 [a-z0-9]>.<16 [a-z0-9]>`: a bootstrap token's id and secret.
pub fn parse_bootstrap(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

pub const BOOTSTRAP_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const BOOTSTRAP_SECRET_PREFIX: &str = "bootstrap-token-";

/// A fresh random bootstrap token and the Secret that makes it valid for `ttl`.
pub fn new_bootstrap_token(ttl: std::time::Duration) -> (String, Value) {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let rng = ring::rand::SystemRandom::new();
    let mut buf = [0u8; 22];
    // SystemRandom only fails when the OS has no entropy source at all.
    if rng.fill(&mut buf).is_err() {
        buf.iter_mut().enumerate().for_each(|(i, b)| *b = uuid::Uuid::new_v4().as_bytes()[i % 16]);
    }
    let s: String = buf.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect();
    let (id, secret) = s.split_at(6);
    let expiration =
        crate::time::rfc3339_seconds(crate::time::add_std(jiff::Timestamp::now(), ttl));
    let obj = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{BOOTSTRAP_SECRET_PREFIX}{id}"), "namespace": "kube-system"},
        "type": BOOTSTRAP_SECRET_TYPE,
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "description": "skiff join token (single use: node client certificate)",
        }
    });
    (format!("{id}.{secret}"), obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jws_round_trip() {
        let token = "abcdef.0123456789abcdef";
        let jws = detached_jws(token, "abcdef", "payload");
        assert!(verify_jws(token, "abcdef", "payload", &jws));
        assert!(!verify_jws(token, "abcdef", "other", &jws));
        assert!(!verify_jws("abcdef.0123456789abcdee", "abcdef", "payload", &jws));
    }
}
