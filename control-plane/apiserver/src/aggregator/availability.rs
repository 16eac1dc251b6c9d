//! The `Available` condition of every APIService, as upstream's availability controllers
//! set it: a local APIService is always available (`Local`); a proxied one is when its
//! Service exists, listens on the port named, has a ready endpoint address, and the
//! extension apiserver answers its discovery document (`GET /apis/<group>/<version>`, as
//! `system:kube-aggregator` in `system:masters`) with a 2xx within 5 s (`Passed`).
//! Otherwise it is False with upstream's reason: `ServiceNotFound`, `ServicePortError`,
//! `EndpointsNotFound`, `MissingEndpoints` or `FailedDiscoveryCheck`.
//!
//! The document answered is kept for aggregated discovery ([`super::remotes`]). The check
//! runs when an APIService, Service, Endpoints or EndpointSlice changes, and every
//! `apiservice_check_interval`; the status is written only when the condition changes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use serde_json::{Value, json};

use super::remotes::Remote;
use super::{api_services, on_changes, proxy, resolve};
use crate::server::ApiServer;
use crate::state::State;
use crate::user::UserInfo;

/// How long an extension may take to answer its discovery check (upstream: 5 s).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest discovery document read.
const MAX_DISCOVERY: usize = 4 * 1024 * 1024;

/// The `Available` condition's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub available: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    fn unavailable(reason: &'static str, message: String) -> Self {
        Verdict { available: false, reason, message }
    }
}

/// Check every APIService until the server goes.
pub async fn run(server: Weak<ApiServer>) {
    let (wake, every) = {
        let Some(s) = server.upgrade() else { return };
        let wake = on_changes(
            &s.state,
            &[
                (super::GROUP, "apiservices"),
                ("", "services"),
                ("", "endpoints"),
                ("discovery.k8s.io", "endpointslices"),
            ],
        );
        (wake, s.config.apiservice_check_interval)
    };
    loop {
        {
            let Some(s) = server.upgrade() else { return };
            check_all(&s).await;
        }
        let _ = tokio::time::timeout(every, wake.notified()).await;
    }
}

async fn check_all(server: &Arc<ApiServer>) {
    let Some(rt) = api_services(server) else { return };
    let objects: Vec<Value> =
        server.cache.resource(rt).list(&rt.prefix(), None).iter().map(|o| o.value()).collect();
    for obj in objects {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let verdict = match Remote::of(&obj) {
            None => Verdict {
                available: true,
                reason: "Local",
                message: "Local APIServices are always available".into(),
            },
            Some(remote) => check(server, &remote).await,
        };
        if let Err(e) = write(server, name, &obj, &verdict).await {
            tracing::debug!(apiservice = name, error = %e, "writing the Available condition");
        }
    }
}

/// The verdict on one proxied APIService; a passing check stores its discovery document.
pub async fn check(state: &State, remote: &Remote) -> Verdict {
    let addr = match resolve::endpoint(state, &remote.service) {
        Ok(addr) => addr,
        Err(e) => return Verdict::unavailable(e.reason, e.message),
    };
    let path = format!("/apis/{}/{}", remote.group, remote.version);
    let url = format!("https://{addr}{path}");
    let failed = |why: String| {
        Verdict::unavailable(
            "FailedDiscoveryCheck",
            format!("failing or missing response from {url}: {why}"),
        )
    };
    let checker = UserInfo {
        name: "system:kube-aggregator".into(),
        uid: String::new(),
        groups: vec![skiff_core::names::MASTERS.to_string()],
        extra: Default::default(),
    };
    let mut request = http::Request::new(Empty::<bytes::Bytes>::new());
    *request.uri_mut() = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return failed("invalid group or version".into()),
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("application/json"));
    *request.headers_mut() = proxy::forwarded_headers(&headers, &checker);
    let exchange = async {
        let response = proxy::send(state, remote, request).await.map_err(|e| proxy::chain(&e))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_DISCOVERY)
            .collect()
            .await
            .map_err(|e| format!("reading the response: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("bad status from {url}: {}", status.as_u16()));
        }
        Ok(body)
    };
    let body = match tokio::time::timeout(DISCOVERY_TIMEOUT, exchange).await {
        Ok(Ok(body)) => body,
        Ok(Err(why)) => return failed(why),
        Err(_) => return failed("context deadline exceeded".into()),
    };
    if let Ok(doc) = serde_json::from_slice::<Value>(&body)
        && doc.get("resources").is_some_and(Value::is_array)
    {
        state.remotes.set_discovery(&remote.name, doc);
    }
    Verdict { available: true, reason: "Passed", message: "all checks passed".into() }
}

/// Patch the `Available` condition when it differs from the verdict (its
/// lastTransitionTime moves only when its status does).
async fn write(
    server: &Arc<ApiServer>,
    name: &str,
    obj: &Value,
    verdict: &Verdict,
) -> Result<(), kube::Error> {
    let status = if verdict.available { "True" } else { "False" };
    let conditions: Vec<Value> =
        obj.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let current = conditions.iter().find(|c| c["type"] == "Available");
    if let Some(c) = current
        && c["status"] == status
        && c["reason"] == verdict.reason
        && c["message"] == verdict.message.as_str()
    {
        return Ok(());
    }
    let transition = match current {
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => json!(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    };
    let mut conditions: Vec<Value> =
        conditions.into_iter().filter(|c| c["type"] != "Available").collect();
    conditions.push(json!({
        "type": "Available",
        "status": status,
        "lastTransitionTime": transition,
        "reason": verdict.reason,
        "message": verdict.message,
    }));
    let patch = json!({"status": {"conditions": conditions}});
    super::autoregister::client(server)
        .patch_status(name, &Default::default(), &kube::api::Patch::Merge(patch))
        .await?;
    Ok(())
}
