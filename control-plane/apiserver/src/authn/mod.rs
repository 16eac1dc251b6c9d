//! Authentication: who is calling. Client certificates verified by the TLS listener against
//! the cluster CA (CN = user, O = groups), bearer tokens (static token file, ServiceAccount
//! JWTs, bootstrap join tokens), anonymous otherwise; then impersonation and authorization
//! run in [`layer`], which leaves the final [`UserInfo`] in the request's extensions.

mod auth;
pub mod join;
pub mod serviceaccount;
pub mod tokens;

use http::StatusCode;

pub use self::auth::{Auth, Error, Keys};
use super::status::ApiError;
use super::user::UserInfo;
pub use crate::config::{AuthConfig, DEFAULT_ISSUER};
use crate::state::State;
use skiff_core::names;

/// The verified client certificate's user, put in each request's extensions by the TLS
/// listener for the connection (`None`: no certificate was presented).
#[derive(Debug, Clone, Default)]
pub struct PeerCert(pub Option<UserInfo>);

/// The identity of in-process callers (`ApiServer::client()`), inserted by a tower layer
/// around the in-memory service. Requests from the network never carry it: extensions are
/// not part of the wire format and the listener inserts only [`PeerCert`].
#[derive(Debug, Clone)]
pub struct InProcess(pub UserInfo);

impl InProcess {
    pub fn apiserver() -> Self {
        InProcess(UserInfo::new(names::APISERVER, &[names::MASTERS, names::AUTHENTICATED]))
    }
}

/// The user named by a DER client certificate's subject (CN = user, O = groups).
pub fn user_from_cert(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    if name.is_empty() {
        return None;
    }
    let groups =
        subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect();
    Some(UserInfo { name, groups, ..Default::default() })
}

/// Paths anonymous clients may read (upstream's system:public-info-viewer).
pub fn is_public_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
        || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}

/// The one object anonymous clients may read besides the health and version paths.
pub const CLUSTER_INFO_PATH: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";

pub fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

/// Authenticate the request's credentials. `Ok(None)`: no credentials (anonymous).
pub fn authenticate(
    state: &State,
    auth: &Auth,
    headers: &http::HeaderMap,
    cert: Option<&UserInfo>,
) -> Result<Option<UserInfo>, ApiError> {
    if let Some(user) = cert {
        return Ok(Some(user.clone()));
    }
    let Some(value) = headers.get(http::header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| unauthorized())?;
    let Some(token) = value.strip_prefix("Bearer ").map(str::trim) else {
        return Err(unauthorized());
    };
    if token.is_empty() {
        return Err(unauthorized());
    }
    if let Some(user) = auth.static_tokens.get(token) {
        return Ok(Some(user.clone()));
    }
    if let Some((id, secret)) = skiff_core::join::parse_bootstrap(token) {
        return tokens::authenticate_bootstrap(state, id, secret)
            .map(Some)
            .ok_or_else(unauthorized);
    }
    if token.matches('.').count() == 2 {
        return serviceaccount::authenticate(state, auth, token).map(Some).map_err(|e| {
            tracing::debug!(error = %e, "service account token refused");
            unauthorized()
        });
    }
    Err(unauthorized())
}

/// Upstream adds system:authenticated to every authenticated user.
pub(crate) fn with_authenticated(mut user: UserInfo) -> UserInfo {
    if !user.in_group(names::AUTHENTICATED) && user.name != names::ANONYMOUS {
        user.groups.push(names::AUTHENTICATED.to_string());
    }
    user
}
