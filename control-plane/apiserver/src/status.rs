//! API errors as upstream `Status` objects: every failure a client sees has a `reason` and a
//! `code` (kube-rs matches on the reason, kubectl prints the message).

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// A cause inside `Status.details.causes`.
#[derive(Debug, Clone)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// An error answered to the client as a `Status` (boxed: errors travel through many
/// `Result`s on the request path and should stay one pointer wide).
#[derive(Debug, Clone)]
pub struct ApiError(Box<StatusError>);

impl std::ops::Deref for ApiError {
    type Target = StatusError;
    fn deref(&self) -> &StatusError {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut StatusError {
        &mut self.0
    }
}

/// The fields of an [`ApiError`].
#[derive(Debug, Clone)]
pub struct StatusError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    /// `details`: name, group, kind of the object concerned.
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
    /// `metadata.continue`: where an expired paginated list may go on from.
    pub continue_token: Option<String>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError(Box::new(StatusError {
            code,
            reason,
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: Vec::new(),
            retry_after_seconds: None,
            continue_token: None,
        }))
    }

    pub fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.group = Some(group.to_string());
        self.kind = Some(kind.to_string());
        self.name = Some(name.to_string());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// `resource` is the qualified resource as upstream prints it ("deployments.apps").
    pub fn not_found(resource: &str, name: &str) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "NotFound", format!("{resource} \"{name}\" not found"))
    }

    /// Upstream's answer for a path it does not serve, with its empty `details` (which
    /// kubectl debug reads to tell a missing subresource from a missing pod).
    pub fn path_not_found() -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details("", "", "")
    }

    pub fn already_exists(resource: &str, name: &str) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        )
    }

    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        )
    }

    pub fn modified(resource: &str, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(message: impl Into<String>, causes: Vec<Cause>) -> Self {
        let mut e = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
        e.causes = causes;
        e
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    pub fn method_not_allowed(verb: &str) -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({verb})"),
        )
    }

    /// Upstream's `NewUnsupportedMediaTypeError`: the body's type is none of `accepted`.
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::GONE, "Expired", message)
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::GATEWAY_TIMEOUT, "Timeout", message);
        e.retry_after_seconds = Some(1);
        e
    }

    /// Upstream's `NewTooLargeResourceVersionError`: a read or watch from a revision the
    /// server has not reached. client-go's reflector recognizes it by its cause and relists.
    pub fn too_large_resource_version(
        requested: skiff_store::Revision,
        current: skiff_store::Revision,
    ) -> Self {
        let mut e = ApiError::timeout(format!(
            "Timeout: Too large resource version: {requested}, current: {current}"
        ));
        e.causes = vec![Cause {
            reason: "ResourceVersionTooLarge".into(),
            message: "Too large resource version".into(),
            field: String::new(),
        }];
        e
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message);
        e.retry_after_seconds = Some(1);
        e
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(name) = self.name.as_ref().filter(|v| !v.is_empty()) {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = self.group.as_ref().filter(|v| !v.is_empty()) {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = self.kind.as_ref().filter(|v| !v.is_empty()) {
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            details.insert(
                "causes".into(),
                self.causes
                    .iter()
                    .map(|c| {
                        // `field` is omitempty upstream.
                        let mut cause = json!({"reason": c.reason, "message": c.message});
                        if !c.field.is_empty() {
                            cause["field"] = json!(c.field);
                        }
                        cause
                    })
                    .collect(),
            );
        }
        if let Some(s) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(s));
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(token) = &self.continue_token {
            status["metadata"]["continue"] = json!(token);
        }
        // Upstream sets details whenever the error concerns an object, empty or not.
        let concerned = self.name.is_some() || self.group.is_some() || self.kind.is_some();
        if concerned || !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code.as_u16(), self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        let mut resp = (self.code, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(s) = self.retry_after_seconds {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

impl From<skiff_store::Error> for ApiError {
    fn from(e: skiff_store::Error) -> Self {
        use skiff_store::Error as S;
        match e {
            S::Compacted { requested, compacted } => {
                ApiError::gone(format!("too old resource version: {requested} ({compacted})"))
            }
            S::FutureRevision { requested, current } => {
                ApiError::too_large_resource_version(requested, current)
            }
            S::Closed => ApiError::service_unavailable("storage is closed"),
            // Not retriable and the client's doing: a 413 (upstream answers etcd's refusal
            // with a 500, kubernetes#112152), in etcd's words.
            S::TooLarge { .. } => ApiError::new(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                e.to_string(),
            ),
            other => ApiError::internal(other),
        }
    }
}

/// A successful delete answered with a Status (as upstream does for most kinds).
pub fn success_status(group: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": kind, "uid": uid},
    })
}

/// Upstream's `NewInvalid` for `kind`.`group` `name`.
pub(crate) fn invalid_of(
    kind: &str,
    group: &str,
    name: &str,
    errs: Vec<skiff_machinery::admission::FieldError>,
) -> ApiError {
    let message = skiff_machinery::admission::invalid_message(kind, group, name, &errs);
    let causes = errs
        .iter()
        .map(|e| Cause {
            reason: e.reason().to_string(),
            // Upstream's `ErrorBody()`: the field is its own member, and clients (kubectl)
            // print it before the message.
            message: e.body(),
            field: e.field.clone(),
        })
        .collect();
    ApiError::invalid(message, causes).with_details(group, kind, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause client-go's reflector looks for before it relists
    /// (`isTooLargeResourceVersionError`); `field` is omitted when empty, as upstream does.
    #[test]
    fn too_large_resource_version_carries_its_cause() {
        let status = ApiError::too_large_resource_version(9, 5).to_status();
        assert_eq!(status["code"], 504);
        assert_eq!(status["reason"], "Timeout");
        assert_eq!(status["message"], "Timeout: Too large resource version: 9, current: 5");
        assert_eq!(
            status["details"]["causes"],
            json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}])
        );
        assert_eq!(status["details"]["retryAfterSeconds"], 1);
    }

    /// kubectl debug dereferences `details` of a 404 to tell "ephemeral containers are
    /// disabled" from a missing pod: a path not served carries upstream's empty details.
    #[test]
    fn a_path_not_served_has_empty_details() {
        let status = ApiError::path_not_found().to_status();
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["details"], json!({}));
        let plain = ApiError::bad_request("x").to_status();
        assert!(plain.get("details").is_none());
    }
}
