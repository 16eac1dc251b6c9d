//! The node's client certificate, as the kubelet's certificate manager keeps it: an API
//! client whose TLS identity is replaced while the agent runs, and the rotation that renews
//! the certificate before it expires (at a random 70–90 % of its lifetime) through a stored
//! CertificateSigningRequest, which the control plane's approving and signing controllers
//! answer. The new certificate and key are written back where the kubeconfig keeps them
//! (embedded, or the files it names) before the client switches to them.
//!
//! Every request takes the HTTP client of the moment: after a rotation new requests open
//! new connections with the new certificate, and the old client with its pooled
//! connections goes when its last request (a long watch) ends.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use base64::Engine;
use kube::client::{Body, ConfigExt};
use kube::config::Kubeconfig;
use tower::ServiceExt;
use tower::util::BoxCloneService;

use skiff_core::certificates as certs;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Https = BoxCloneService<http::Request<Body>, http::Response<hyper::body::Incoming>, BoxError>;

/// The HTTP client of the moment.
#[derive(Clone)]
struct Current(Arc<Mutex<Https>>);

impl tower::Service<http::Request<Body>> for Current {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let svc = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(svc.oneshot(req))
    }
}

fn https(config: &kube::Config) -> Result<Https, kube::Error> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let connector = config.rustls_https_connector_with_connector(http)?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Body>(connector);
    Ok(BoxCloneService::new(client.map_err(BoxError::from)))
}

/// The node's identity in use: what rotation replaces.
pub struct Identity {
    config: Mutex<kube::Config>,
    current: Current,
    /// The kubeconfig it came from (rewritten on rotation).
    kubeconfig: PathBuf,
    node_name: String,
}

/// A client for `config` whose client certificate can be rotated, and its identity.
pub fn client(
    config: kube::Config,
    kubeconfig: &Path,
    node_name: &str,
) -> anyhow::Result<(kube::Client, Arc<Identity>)> {
    let current = Current(Arc::new(Mutex::new(https(&config)?)));
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .service(current.clone());
    let client = kube::Client::new(service, config.default_namespace.clone());
    let identity = Arc::new(Identity {
        config: Mutex::new(config),
        current,
        kubeconfig: kubeconfig.to_path_buf(),
        node_name: node_name.to_string(),
    });
    Ok((client, identity))
}

/// The client certificate (PEM) of a kubeconfig user: embedded or from its file.
fn certificate_of(auth: &kube::config::AuthInfo) -> Option<String> {
    match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        (None, Some(path)) => std::fs::read_to_string(path).ok(),
        _ => None,
    }
}

/// Whether `cert_pem` is this node's client certificate (`CN=system:node:<node>`).
fn is_node_certificate(cert_pem: &str, node_name: &str) -> bool {
    certs::common_name(cert_pem)
        .is_some_and(|cn| cn == format!("{}{node_name}", certs::NODE_PREFIX))
}

/// What the node's kubeconfig says about its certificate, checked before the agent
/// starts: `Ok(None)` when it is no node client certificate (an admin's kubeconfig, a
/// token), else its expiry; an expired node certificate is an error saying what to do.
pub fn check_node_certificate(
    config: &kube::Config,
    kubeconfig: &Path,
    node_name: &str,
) -> anyhow::Result<Option<SystemTime>> {
    let Some(cert) = certificate_of(&config.auth_info) else { return Ok(None) };
    if !is_node_certificate(&cert, node_name) {
        return Ok(None);
    }
    let (_, not_after) = certs::validity(&cert)
        .with_context(|| format!("reading the client certificate of {}", kubeconfig.display()))?;
    if not_after <= SystemTime::now() {
        anyhow::bail!(
            "the node's client certificate in {} expired at {}: the apiserver will refuse it. \
             Join again with a new token (skiff-server token create; skiff-agent --server URL \
             --token TOKEN after removing {}), or give a kubeconfig with a valid certificate",
            kubeconfig.display(),
            skiff_core::time::rfc3339_seconds(jiff::Timestamp::try_from(not_after)?),
            kubeconfig.display(),
        );
    }
    Ok(Some(not_after))
}

impl Identity {
    fn certificate(&self) -> Option<String> {
        certificate_of(&self.config.lock().unwrap_or_else(|e| e.into_inner()).auth_info)
    }

    /// Renews the certificate before it expires, for as long as the agent runs: a no-op
    /// for an identity that is no node client certificate.
    pub async fn rotate(self: Arc<Self>, client: kube::Client) {
        let mut failures = 0u32;
        loop {
            let Some(cert) = self.certificate().filter(|c| is_node_certificate(c, &self.node_name))
            else {
                return;
            };
            let Some((not_before, not_after)) = certs::validity(&cert) else { return };
            let lifetime = not_after.duration_since(not_before).unwrap_or_default();
            let at = not_before + lifetime.mul_f64(jitter());
            let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
            if failures == 0 {
                tracing::info!(
                    expires = %fmt_time(not_after),
                    rotation_in_secs = wait.as_secs(),
                    "node client certificate"
                );
                tokio::time::sleep(wait).await;
            }
            match self.renew(&client).await {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures += 1;
                    let backoff = Duration::from_secs(5 * u64::from(failures.min(12)));
                    let expired = not_after <= SystemTime::now();
                    tracing::error!(
                        error = %format!("{e:#}"),
                        expired,
                        retry_in_secs = backoff.as_secs(),
                        "renewing the node client certificate"
                    );
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// One renewal: a new key and certificate, written, then used.
    async fn renew(&self, client: &kube::Client) -> anyhow::Result<()> {
        let (cert, key) = skiff_core::join::request_node_certificate(
            client,
            &self.node_name,
            Duration::from_secs(15 * 60),
        )
        .await?;
        self.store(&cert, &key)?;
        let next = {
            let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
            let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
            config.auth_info.client_certificate_data = Some(b64(&cert));
            config.auth_info.client_key_data = Some(b64(&key).into());
            https(&config)?
        };
        *self.current.0.lock().unwrap_or_else(|e| e.into_inner()) = next;
        let expires = certs::validity(&cert).map(|(_, t)| fmt_time(t)).unwrap_or_default();
        tracing::info!(%expires, "rotated the node client certificate");
        Ok(())
    }

    /// Writes the new certificate where the kubeconfig keeps its current one.
    fn store(&self, cert: &str, key: &str) -> anyhow::Result<()> {
        let path = &self.kubeconfig;
        let mut kc =
            Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
        let context = kc.current_context.clone().unwrap_or_default();
        let user = kc
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.user.clone())
            .unwrap_or_default();
        let auth = kc
            .auth_infos
            .iter_mut()
            .find(|a| Some(&a.name) == user.as_ref())
            .and_then(|a| a.auth_info.as_mut())
            .with_context(|| format!("{}: no user for its current context", path.display()))?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        if auth.client_certificate_data.is_none()
            && let (Some(cert_path), Some(key_path)) = (&auth.client_certificate, &auth.client_key)
        {
            skiff_core::join::replace_private(Path::new(key_path), key)?;
            skiff_core::join::replace_private(Path::new(cert_path), cert)?;
            return Ok(());
        }
        auth.client_certificate_data = Some(b64(cert));
        auth.client_key_data = Some(b64(key).into());
        auth.client_certificate = None;
        auth.client_key = None;
        // JSON is YAML: kubectl and every client read it.
        let text = serde_json::to_string_pretty(&kc).context("encoding the kubeconfig")?;
        skiff_core::join::replace_private(path, &text)?;
        Ok(())
    }
}

/// Upstream's jitter: somewhere in 70–90 % of the lifetime.
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(SystemTime::now()) % 1000;
    0.7 + 0.2 * (r as f64 / 1000.0)
}

fn fmt_time(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map(skiff_core::time::rfc3339_seconds).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_upstreams_window() {
        for _ in 0..200 {
            let j = jitter();
            assert!((0.7..0.9).contains(&j), "{j}");
        }
    }
}
