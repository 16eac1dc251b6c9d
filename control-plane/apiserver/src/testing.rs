//! Test helpers: requests through an apiserver's router, in process.

use std::sync::Arc;

use axum::body::Body;
use http::{Method, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::user::UserInfo;
use crate::server::ApiServer;

/// Send `body` (as `content_type`) to `uri` through `api`'s router, as `user` when given (what
/// authentication puts in the request's extensions); the status and the body (`Null` if it is
/// not JSON).
pub(crate) async fn call(
    api: &Arc<ApiServer>,
    user: Option<UserInfo>,
    method: Method,
    uri: &str,
    content_type: &str,
    body: Value,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(Body::from(body.to_string()))
        .expect("request");
    if let Some(u) = user {
        req.extensions_mut().insert(u);
    }
    let resp = api.router().oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}
