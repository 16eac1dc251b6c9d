//! Dynamic admission: admissionregistration.k8s.io/v1 Mutating- and
//! ValidatingWebhookConfigurations select requests (rules, scope, namespaceSelector,
//! objectSelector) and send them as AdmissionReview v1 over HTTPS (trusting only the
//! webhook's caBundle); a mutating webhook's JSONPatch is applied to the object. A call
//! that fails or times out (timeoutSeconds, default 10) denies the request under
//! failurePolicy Fail (the default) and is skipped under Ignore. Webhooks are called one
//! after another (upstream calls validating webhooks in parallel); reinvocation is not done.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1 as reg;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin, labels_of};
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::labels::label_selector_matches as selector_matches;
use skiff_machinery::jsonpatch;

/// Largest AdmissionReview response read (upstream caps webhook responses similarly).
const MAX_RESPONSE: usize = 3 * 1024 * 1024;
const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("webhook URL {url:?} is not a valid https URL")]
    BadUrl { url: String },
    #[error("service {namespace}/{name} of the webhook not found or has no cluster IP")]
    ServiceNotFound { namespace: String, name: String },
    #[error("webhook has neither url nor service")]
    NoClientConfig,
    #[error("reading caBundle")]
    CaBundle(#[source] rustls::pki_types::pem::Error),
    #[error("caBundle holds no usable certificate")]
    NoCertificates(#[source] Option<rustls::Error>),
    #[error("building the TLS client")]
    Tls(#[source] rustls::Error),
    #[error("dial tcp {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr}")]
    Handshake {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange with {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("building the HTTP request")]
    Request(#[source] http::Error),
    #[error("reading the response body")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("webhook answered HTTP {status}")]
    Status { status: u16 },
    #[error("decoding the AdmissionReview response")]
    Decode(#[source] serde_json::Error),
    #[error("the AdmissionReview response has no response or a wrong uid")]
    BadResponse,
    #[error("decoding the JSONPatch")]
    Patch(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("context deadline exceeded (timeout {seconds}s)")]
    Timeout { seconds: i32 },
}

/// Failure modes of one webhook call (every one but a denial honours failurePolicy).
enum CallError {
    Denied(ApiError),
    Failed(Error),
}

/// One webhook of either kind with its configuration's name.
struct Hook {
    name: String,
    client: reg::WebhookClientConfig,
    rules: Vec<reg::RuleWithOperations>,
    failure_policy_ignore: bool,
    namespace_selector: Option<LabelSelector>,
    object_selector: Option<LabelSelector>,
    side_effects: String,
    timeout_seconds: i32,
}

fn mutating_hooks(state: &State) -> Vec<Hook> {
    configs::<reg::MutatingWebhookConfiguration>(state, "mutatingwebhookconfigurations")
        .into_iter()
        .flat_map(|c| c.webhooks.unwrap_or_default())
        .map(|w| Hook {
            name: w.name,
            client: w.client_config,
            rules: w.rules.unwrap_or_default(),
            failure_policy_ignore: w.failure_policy.as_deref() == Some("Ignore"),
            namespace_selector: w.namespace_selector,
            object_selector: w.object_selector,
            side_effects: w.side_effects,
            timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        })
        .collect()
}

fn validating_hooks(state: &State) -> Vec<Hook> {
    configs::<reg::ValidatingWebhookConfiguration>(state, "validatingwebhookconfigurations")
        .into_iter()
        .flat_map(|c| c.webhooks.unwrap_or_default())
        .map(|w| Hook {
            name: w.name,
            client: w.client_config,
            rules: w.rules.unwrap_or_default(),
            failure_policy_ignore: w.failure_policy.as_deref() == Some("Ignore"),
            namespace_selector: w.namespace_selector,
            object_selector: w.object_selector,
            side_effects: w.side_effects,
            timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        })
        .collect()
}

/// Whether any configuration of this kind exists.
fn configured(state: &State, plural: &str) -> bool {
    state
        .registry
        .find("admissionregistration.k8s.io", "v1", plural)
        .is_some_and(|rt| !state.cache.resource(rt).is_empty())
}

/// The configurations in the watch cache, sorted by name (upstream's order).
fn configs<T: serde::de::DeserializeOwned>(state: &State, plural: &str) -> Vec<T> {
    let Some(rt) = state.registry.find("admissionregistration.k8s.io", "v1", plural) else {
        return Vec::new();
    };
    let cache = state.cache.resource(rt);
    if cache.is_empty() {
        return Vec::new();
    }
    cache
        .list(&rt.prefix(), None)
        .iter()
        .filter_map(|o| match serde_json::from_slice(&o.json) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(name = %o.name, error = %e, "skipping an undecodable webhook configuration");
                None
            }
        })
        .collect()
}

/// Calls the mutating webhooks (in the mutating phase, last).
#[derive(Default)]
pub struct MutatingWebhooks;

/// Calls the validating webhooks (in the validating phase, last).
#[derive(Default)]
pub struct ValidatingWebhooks;

/// Webhooks never see requests on the webhook configurations themselves (upstream skips
/// them so a broken webhook cannot lock itself in).
fn webhook_eligible(resource: Resource<'_>) -> bool {
    resource.group != "admissionregistration.k8s.io"
}

#[async_trait]
impl MutatingPlugin for MutatingWebhooks {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    fn active(&self, state: &State, _user: &UserInfo) -> bool {
        configured(state, "mutatingwebhookconfigurations")
    }

    fn handles(&self, _operation: Operation, resource: Resource<'_>) -> bool {
        webhook_eligible(resource)
    }

    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        let hooks = mutating_hooks(state);
        for hook in &hooks {
            if !matches(state, hook, req) {
                continue;
            }
            match call(state, hook, req).await {
                Ok(response) => apply_patch(hook, req, &response)?,
                Err(e) => handle_failure(hook, e)?,
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ValidatingPlugin for ValidatingWebhooks {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
    }

    fn active(&self, state: &State, _user: &UserInfo) -> bool {
        configured(state, "validatingwebhookconfigurations")
    }

    fn handles(&self, _operation: Operation, resource: Resource<'_>) -> bool {
        webhook_eligible(resource)
    }

    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        let hooks = validating_hooks(state);
        for hook in hooks.iter().filter(|h| matches(state, h, req)) {
            if let Err(e) = call(state, hook, req).await {
                handle_failure(hook, e)?;
            }
        }
        Ok(())
    }
}

fn handle_failure(hook: &Hook, e: CallError) -> ApiResult<()> {
    match e {
        CallError::Denied(err) => Err(err),
        CallError::Failed(e) if hook.failure_policy_ignore => {
            tracing::warn!(webhook = %hook.name, error = %chain(&e), "failed calling webhook, failing open (failurePolicy Ignore)");
            Ok(())
        }
        CallError::Failed(e) => Err(ApiError::internal(format!(
            "failed calling webhook \"{}\": {}",
            hook.name,
            chain(&e)
        ))),
    }
}

/// An error with its causes, "a: b: c".
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

// ---------------------------------------------------------------------------------------
// matching

fn matches(state: &State, hook: &Hook, req: &AdmissionRequest) -> bool {
    hook.rules.iter().any(|r| rule_matches(r, req))
        && namespace_selected(state, hook.namespace_selector.as_ref(), req)
        && object_selected(hook.object_selector.as_ref(), req)
}

/// Whether one rule selects the request (upstream `webhook/predicates/rules`).
pub fn rule_matches(rule: &reg::RuleWithOperations, req: &AdmissionRequest) -> bool {
    let has = |list: &Option<Vec<String>>, v: &str| {
        list.as_ref().is_some_and(|l| l.iter().any(|x| x == "*" || x == v))
    };
    if !has(&rule.operations, req.operation.as_str())
        || !has(&rule.api_groups, req.group)
        || !has(&rule.api_versions, req.version)
    {
        return false;
    }
    let resources = rule.resources.as_deref().unwrap_or_default();
    let resource_ok = resources.iter().any(|r| {
        let (res, sub) = match r.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (r.as_str(), None),
        };
        let res_ok = res == "*" || res == req.resource;
        let sub_ok = match (sub, req.subresource.as_deref()) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some("*"), _) => true,
            (Some(want), Some(have)) => want == have,
            (Some(_), None) => false,
        };
        res_ok && sub_ok
    });
    let scope_ok = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => !req.namespaced,
        "Namespaced" => req.namespaced,
        _ => true,
    };
    resource_ok && scope_ok
}

fn selector_selects(
    sel: Option<&LabelSelector>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    sel.is_none_or(|s| selector_matches(s, labels))
}

fn namespace_selected(state: &State, sel: Option<&LabelSelector>, req: &AdmissionRequest) -> bool {
    let Some(sel) = sel else { return true };
    // A Namespace itself is matched by its own labels; other cluster-scoped objects always.
    if req.group.is_empty() && req.resource == "namespaces" {
        return selector_selects(Some(sel), &labels_of(req.subject()));
    }
    let Some(ns) = req.namespace.as_deref().filter(|_| req.namespaced) else { return true };
    let nsr = state.registry.namespaces();
    let labels = state
        .cache
        .resource(nsr)
        .get(&nsr.key(None, ns))
        .map(|o| o.labels.to_map())
        .unwrap_or_default();
    selector_selects(Some(sel), &labels)
}

fn object_selected(sel: Option<&LabelSelector>, req: &AdmissionRequest) -> bool {
    let Some(sel) = sel else { return true };
    selector_selects(Some(sel), &labels_of(req.object.as_ref()))
        || selector_selects(Some(sel), &labels_of(req.old_object.as_ref()))
}

// ---------------------------------------------------------------------------------------
// the call

/// The AdmissionReview v1 request of `req`.
pub fn review(req: &AdmissionRequest) -> Value {
    let mut r = json!({
        "uid": req.uid,
        "kind": {"group": req.group, "version": req.version, "kind": req.kind},
        "resource": {"group": req.group, "version": req.version, "resource": req.resource},
        "requestKind": {"group": req.group, "version": req.version, "kind": req.kind},
        "requestResource": {"group": req.group, "version": req.version, "resource": req.resource},
        "name": req.name,
        "operation": req.operation.as_str(),
        "userInfo": {
            "username": req.user.name,
            "uid": req.user.uid,
            "groups": req.user.groups,
            "extra": req.user.extra,
        },
        "object": req.object,
        "oldObject": req.old_object,
        "dryRun": req.dry_run,
        "options": match req.operation {
            Operation::Create => json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
            Operation::Update => json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
            Operation::Delete => json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}),
            Operation::Connect => Value::Null,
        },
    });
    if let Some(ns) = req.namespace.as_deref().filter(|_| req.namespaced) {
        r["namespace"] = json!(ns);
    }
    if let Some(sub) = &req.subresource {
        r["subResource"] = json!(sub);
        r["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r})
}

async fn call(state: &State, hook: &Hook, req: &AdmissionRequest) -> Result<Value, CallError> {
    if req.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
        return Err(CallError::Denied(ApiError::bad_request(format!(
            "admission webhook \"{}\" does not support dry run",
            hook.name
        ))));
    }
    let seconds = hook.timeout_seconds.clamp(1, 30);
    let body = serde_json::to_vec(&review(req)).map_err(|e| CallError::Failed(Error::Decode(e)))?;
    let exchange = post(state, &hook.client, Bytes::from(body));
    let raw = match tokio::time::timeout(Duration::from_secs(seconds as u64), exchange).await {
        Ok(r) => r.map_err(CallError::Failed)?,
        Err(_) => return Err(CallError::Failed(Error::Timeout { seconds })),
    };
    let v: Value = serde_json::from_slice(&raw).map_err(|e| CallError::Failed(Error::Decode(e)))?;
    let response = v.get("response").cloned().ok_or(CallError::Failed(Error::BadResponse))?;
    if response.get("uid").and_then(Value::as_str) != Some(req.uid.as_str()) {
        return Err(CallError::Failed(Error::BadResponse));
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        return Err(CallError::Denied(denial(&hook.name, response.get("status"))));
    }
    Ok(response)
}

/// upstream `webhookerrors.ToStatusErr`: at least 400, message prefixed by who denied.
fn denial(webhook: &str, status: Option<&Value>) -> ApiError {
    let get = |k: &str| status.and_then(|s| s.get(k)).and_then(Value::as_str).unwrap_or_default();
    let code = status.and_then(|s| s.get("code")).and_then(Value::as_u64).unwrap_or(0);
    let code = StatusCode::from_u16(code.clamp(400, 599) as u16).unwrap_or(StatusCode::BAD_REQUEST);
    let denied_by = format!("admission webhook \"{webhook}\" denied the request");
    let message = match (get("message"), get("reason")) {
        (m, _) if !m.is_empty() => format!("{denied_by}: {m}"),
        (_, r) if !r.is_empty() => format!("{denied_by}: {r}"),
        _ => format!("{denied_by} without explanation"),
    };
    let reason = match get("reason") {
        "Forbidden" => "Forbidden",
        "BadRequest" => "BadRequest",
        "Invalid" => "Invalid",
        "NotFound" => "NotFound",
        "Conflict" => "Conflict",
        "AlreadyExists" => "AlreadyExists",
        "Unauthorized" => "Unauthorized",
        "TooManyRequests" => "TooManyRequests",
        "InternalError" => "InternalError",
        _ => "",
    };
    ApiError::new(code, reason, message)
}

fn apply_patch(hook: &Hook, req: &mut AdmissionRequest, response: &Value) -> ApiResult<()> {
    let Some(patch) = response.get("patch").and_then(Value::as_str) else { return Ok(()) };
    let fail = |e: Error| {
        ApiError::internal(format!("failed calling webhook \"{}\": {}", hook.name, chain(&e)))
    };
    if let Some(t) = response.get("patchType").and_then(Value::as_str)
        && t != "JSONPatch"
    {
        return Err(fail(Error::Patch(format!("unsupported patchType {t:?}").into())));
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| fail(Error::Patch(Box::new(e))))?;
    let ops: Value = serde_json::from_slice(&raw).map_err(|e| fail(Error::Patch(Box::new(e))))?;
    let ops = jsonpatch::decode(&ops).map_err(|e| fail(Error::Patch(Box::new(e))))?;
    let Some(obj) = req.object.as_mut() else { return Ok(()) };
    let mut patched = obj.clone();
    jsonpatch::apply(&mut patched, &ops).map_err(|e| fail(Error::Patch(Box::new(e))))?;
    *obj = patched;
    req.patched = true;
    Ok(())
}

/// Where to send the review: the address to dial, the TLS server name, the HTTP path.
struct Target {
    addr: String,
    server_name: rustls::pki_types::ServerName<'static>,
    host_header: String,
    path: String,
}

fn target(state: &State, cc: &reg::WebhookClientConfig) -> Result<Target, Error> {
    if let Some(url) = &cc.url {
        let bad = || Error::BadUrl { url: url.clone() };
        let uri: Uri = url.parse().map_err(|_| bad())?;
        if uri.scheme_str() != Some("https") {
            return Err(bad());
        }
        let host =
            uri.host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']').to_string();
        let port = uri.port_u16().unwrap_or(443);
        let server_name = server_name(&host).ok_or_else(bad)?;
        let addr = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        let path =
            uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
        return Ok(Target {
            addr,
            server_name,
            host_header: uri.authority().map(|a| a.to_string()).unwrap_or(host),
            path,
        });
    }
    let svc = cc.service.as_ref().ok_or(Error::NoClientConfig)?;
    let not_found =
        || Error::ServiceNotFound { namespace: svc.namespace.clone(), name: svc.name.clone() };
    let rt = state.registry.find("", "v1", "services").ok_or_else(not_found)?;
    let obj = state
        .cache
        .resource(rt)
        .get(&rt.key(Some(&svc.namespace), &svc.name))
        .ok_or_else(not_found)?
        .value();
    let ip = obj
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .ok_or_else(not_found)?
        .to_string();
    let port = svc.port.unwrap_or(443);
    let dns = format!("{}.{}.svc", svc.name, svc.namespace);
    let server_name = server_name(&dns).ok_or_else(not_found)?;
    Ok(Target {
        addr: format!("{ip}:{port}"),
        server_name,
        host_header: format!("{dns}:{port}"),
        path: svc.path.clone().unwrap_or_else(|| "/".into()),
    })
}

fn server_name(host: &str) -> Option<rustls::pki_types::ServerName<'static>> {
    match host.parse::<IpAddr>() {
        Ok(ip) => Some(rustls::pki_types::ServerName::IpAddress(ip.into())),
        Err(_) => rustls::pki_types::ServerName::try_from(host.to_string()).ok(),
    }
}

fn tls_config(ca_bundle: Option<&[u8]>) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let mut last_err = None;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_bundle.unwrap_or_default()) {
        let cert = cert.map_err(Error::CaBundle)?;
        if let Err(e) = roots.add(cert) {
            last_err = Some(e);
        }
    }
    if roots.is_empty() {
        return Err(Error::NoCertificates(last_err));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}

/// POST a review to a webhook (admission or CRD conversion) and return the response body
/// (HTTP/1.1 over TLS).
pub(crate) async fn post(
    state: &State,
    cc: &reg::WebhookClientConfig,
    body: Bytes,
) -> Result<Bytes, Error> {
    let t = target(state, cc)?;
    let cfg = tls_config(cc.ca_bundle.as_ref().map(|b| b.0.as_slice()))?;
    let tcp = tokio::net::TcpStream::connect(&t.addr)
        .await
        .map_err(|source| Error::Connect { addr: t.addr.clone(), source })?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(t.server_name.clone(), tcp)
        .await
        .map_err(|source| Error::Handshake { addr: t.addr.clone(), source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|source| Error::Http { addr: t.addr.clone(), source })?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = http::Request::post(&t.path)
        .header(http::header::HOST, &t.host_header)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(Error::Request)?;
    let result = async {
        let resp = sender
            .send_request(request)
            .await
            .map_err(|source| Error::Http { addr: t.addr.clone(), source })?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(Error::Body)?
            .to_bytes();
        if !status.is_success() {
            return Err(Error::Status { status: status.as_u16() });
        }
        Ok(bytes)
    }
    .await;
    driver.abort();
    result
}
