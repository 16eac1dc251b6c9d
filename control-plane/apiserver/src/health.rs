//! `/healthz`, `/livez` and `/readyz` as upstream's `healthz` package serves them.
//! - Named checks: `ping` and `log` (the server answers), `etcd` (the store can serve; for
//!   the embedded store, that it is not poisoned by a failed write), and one
//!   `controller-<name>` per supervised component running in this server (each controller,
//!   the scheduler), failing while it recently stopped or panicked.
//! - `?verbose` lists one line per check; `?exclude=NAME` (repeatable) skips one.
//! - `/<endpoint>/<check>` runs one check alone: `ok`, or 500 with the reason.
//! - A failing check makes the endpoint answer 500 with every check listed, reasons withheld
//!   (the endpoints are public); the reason goes to the log.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

use super::admission::webhook::chain;
use super::request::decode;
use super::status::ApiError;
use crate::server::ApiServer;

const CHECKS: [&str; 3] = ["ping", "log", "etcd"];

/// How long the store may take to answer the `etcd` check (upstream's default 2 s).
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// The response for a health path, or `None` if `path` is not one.
pub async fn serve(server: &ApiServer, path: &str, query: Option<&str>) -> Option<Response> {
    let path = path.trim_start_matches('/');
    let (endpoint, check) = match path.split_once('/') {
        Some((endpoint, check)) => (endpoint, Some(check)),
        None => (path, None),
    };
    if !matches!(endpoint, "healthz" | "livez" | "readyz") {
        return None;
    }
    Some(match check {
        None | Some("") => all(server, endpoint, query).await,
        Some(name) if check_names(server, endpoint).iter().any(|c| c == name) => {
            match run(server, name).await {
                Ok(()) => text(StatusCode::OK, "ok".into()),
                Err(reason) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("internal server error: {reason}\n"),
                ),
            }
        }
        Some(_) => ApiError::path_not_found().into_response(),
    })
}

/// The prefix of a supervised component's check.
const COMPONENT_CHECK: &str = "controller-";

/// Every check of `endpoint`, in the order they are listed. The components' checks are
/// not liveness checks: restarting the server would not mend a controller.
fn check_names(server: &ApiServer, endpoint: &str) -> Vec<String> {
    let mut names: Vec<String> = CHECKS.iter().map(|c| c.to_string()).collect();
    if endpoint == "livez" {
        return names;
    }
    names.extend(
        server.components.statuses().iter().map(|c| format!("{COMPONENT_CHECK}{}", c.name)),
    );
    names
}

async fn run(server: &ApiServer, name: &str) -> Result<(), String> {
    if let Some(component) = name.strip_prefix(COMPONENT_CHECK) {
        return match server.components.statuses().into_iter().find(|c| c.name == component) {
            Some(c) => match c.failing {
                Some(reason) => Err(reason),
                None => Ok(()),
            },
            None => Ok(()),
        };
    }
    if name != "etcd" {
        return Ok(());
    }
    store_health(server).await
}

/// The `etcd` check: the store answers a health check within [`STORE_TIMEOUT`].
pub(super) async fn store_health(server: &ApiServer) -> Result<(), String> {
    match tokio::time::timeout(STORE_TIMEOUT, server.store.check_health()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(chain(&e)),
        Err(_) => Err(format!("the store did not answer within {STORE_TIMEOUT:?}")),
    }
}

async fn all(server: &ApiServer, endpoint: &str, query: Option<&str>) -> Response {
    let (verbose, mut excluded) = options(query);
    let mut lines = String::new();
    let mut failed = Vec::new();
    for name in check_names(server, endpoint) {
        let name = name.as_str();
        if excluded.remove(name) {
            lines.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match run(server, name).await {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(reason) => {
                lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
                tracing::warn!(check = name, %reason, "{endpoint} check failed");
                failed.push(name.to_string());
            }
        }
    }
    if !excluded.is_empty() {
        let names: Vec<String> = excluded.iter().map(|n| format!("{n:?}")).collect();
        lines.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            names.join(",")
        ));
    }
    if !failed.is_empty() {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{lines}{endpoint} check failed\n"),
        );
    }
    if !verbose {
        return text(StatusCode::OK, "ok".into());
    }
    text(StatusCode::OK, format!("{lines}{endpoint} check passed\n"))
}

/// `verbose` (present with any value) and the `exclude` names (every occurrence).
fn options(query: Option<&str>) -> (bool, BTreeSet<String>) {
    let mut verbose = false;
    let mut excluded = BTreeSet::new();
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match decode(key).as_str() {
            "verbose" => verbose = true,
            "exclude" => {
                excluded.insert(decode(value));
            }
            _ => {}
        }
    }
    (verbose, excluded)
}

fn text(code: StatusCode, body: String) -> Response {
    let mut r = (code, body).into_response();
    let headers = r.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use skiff_store::memory::MemoryStore;

    async fn body(r: Response) -> (u16, String) {
        let code = r.status().as_u16();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
        (code, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn a_failing_component_fails_healthz_and_readyz_not_livez() {
        let server = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("apiserver");
        server.components.register("job", &Default::default());
        let (code, text) =
            body(serve(&server, "/readyz", Some("verbose")).await.expect("readyz")).await;
        assert_eq!(code, 200);
        assert!(text.contains("[+]controller-job ok"), "{text}");
        server.components.reconcile_panicked("job", "reconcile of ns/j panicked: overflow".into());
        for endpoint in ["/healthz", "/readyz"] {
            let (code, text) = body(serve(&server, endpoint, None).await.expect("served")).await;
            assert_eq!(code, 500, "{endpoint}: {text}");
            assert!(text.contains("[-]controller-job failed: reason withheld"), "{text}");
        }
        let (code, text) =
            body(serve(&server, "/healthz/controller-job", None).await.expect("one check")).await;
        assert_eq!(code, 500);
        assert!(text.contains("overflow"), "the single check says why: {text}");
        let (code, _) = body(serve(&server, "/livez", None).await.expect("livez")).await;
        assert_eq!(code, 200, "a controller's failure is not the server's");
        let metrics = server.metrics.render(&server);
        let (_, text) = body(metrics).await;
        assert!(text.contains("skiff_component_failing{component=\"job\"} 1"), "{text}");
        assert!(text.contains("skiff_component_reconcile_panics{component=\"job\"} 1"), "{text}");
    }
}
