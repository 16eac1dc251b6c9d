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

/// The verified client certificate's user and the end of its validity, put in each
/// request's extensions by the TLS listener for the connection (`None`: no certificate was
/// presented). The handshake checked the validity once; every request checks the end again,
/// as upstream's x509 authenticator verifies per request: a connection outliving its
/// certificate is no longer authenticated by it.
#[derive(Debug, Clone, Default)]
pub struct PeerCert(pub Option<UserInfo>, pub Option<std::time::SystemTime>);

impl PeerCert {
    /// From a verified DER leaf certificate.
    pub fn from_der(der: &[u8]) -> PeerCert {
        let not_after = x509_parser::parse_x509_certificate(der).ok().and_then(|(_, c)| {
            let secs = c.validity().not_after.timestamp();
            (secs >= 0).then(|| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64))
        });
        PeerCert(user_from_cert(der), not_after)
    }

    /// The user, unless the certificate expired since the handshake (an error then).
    pub fn user(&self) -> Result<Option<&UserInfo>, ApiError> {
        match (&self.0, self.1) {
            (Some(_), Some(end)) if end < std::time::SystemTime::now() => Err(unauthorized()),
            (user, _) => Ok(user.as_ref()),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::{PeerCert, UserInfo};

    #[test]
    fn a_certificate_past_its_end_no_longer_authenticates_its_connection() {
        let user = UserInfo::new("system:node:n1", &["system:nodes"]);
        let valid = PeerCert(Some(user.clone()), Some(SystemTime::now() + Duration::from_secs(60)));
        assert_eq!(valid.user().unwrap().map(|u| u.name.as_str()), Some("system:node:n1"));
        let expired = PeerCert(Some(user), Some(SystemTime::now() - Duration::from_secs(1)));
        assert_eq!(expired.user().unwrap_err().code, 401);
        assert!(PeerCert::default().user().unwrap().is_none());
        // From a real certificate: its subject and its end.
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "alice");
        params.not_after = (SystemTime::now() - Duration::from_secs(10)).into();
        let cert = params.self_signed(&key).unwrap();
        let peer = PeerCert::from_der(cert.der());
        assert_eq!(peer.0.as_ref().map(|u| u.name.as_str()), Some("alice"));
        assert!(peer.user().is_err(), "expired ten seconds ago");
    }
}
