//! ServiceAccount tokens: ES256 JWTs with upstream's claims (iss, sub, aud, exp, nbf, iat,
//! jti and `kubernetes.io` {namespace, serviceaccount, pod}), minted by the TokenRequest
//! subresource (`POST .../serviceaccounts/<name>/token`) and verified on every request,
//! including that the ServiceAccount (and the bound Pod) still exist with the same uid.

use bytes::Bytes;
use http::StatusCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::auth::Auth;
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::names;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub nbf: i64,
    pub iat: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("no service account signing key is configured")]
    NoKey,
    #[error("decoding or verifying the token")]
    Verify(#[source] jsonwebtoken::errors::Error),
    #[error("signing the token")]
    Sign(#[source] jsonwebtoken::errors::Error),
    #[error("service account {0} no longer exists or was recreated")]
    ServiceAccountGone(String),
    #[error("pod {0} bound to the token no longer exists or was recreated")]
    PodGone(String),
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Sign `claims` with the cluster's service account key.
pub fn sign(auth: &Auth, claims: &Claims) -> Result<String, TokenError> {
    let keys = auth.sa.as_ref().ok_or(TokenError::NoKey)?;
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(keys.kid.clone());
    jsonwebtoken::encode(&header, claims, &keys.encoding).map_err(TokenError::Sign)
}

/// Sign `claims` with an arbitrary PKCS#8 EC P-256 key (tests craft expired or foreign
/// tokens with it).
pub fn sign_with(private_pem: &str, claims: &Claims) -> Result<String, TokenError> {
    let key = EncodingKey::from_ec_pem(private_pem.as_bytes()).map_err(TokenError::Sign)?;
    jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, &key).map_err(TokenError::Sign)
}

/// Claims for a token of `namespace/name` (uid `uid`), valid `ttl_secs` from now.
pub fn claims(
    auth: &Auth,
    namespace: &str,
    sa: ObjectRef,
    pod: Option<ObjectRef>,
    audiences: Vec<String>,
    ttl_secs: i64,
) -> Claims {
    let t = now();
    Claims {
        iss: auth.issuer().to_string(),
        sub: format!("{}{namespace}:{}", names::SERVICE_ACCOUNT_PREFIX, sa.name),
        aud: audiences,
        exp: t + ttl_secs,
        nbf: t,
        iat: t,
        jti: uuid::Uuid::new_v4().to_string(),
        kubernetes: KubernetesClaims { namespace: namespace.to_string(), serviceaccount: sa, pod },
    }
}

fn cached_uid(state: &State, plural: &str, ns: &str, name: &str) -> Option<String> {
    let rt = state.registry.find("", "v1", plural)?;
    let obj = state.cache.resource(rt).get(&rt.key(Some(ns), name))?.value();
    obj.pointer("/metadata/uid").and_then(Value::as_str).map(String::from)
}

/// Verify a bearer JWT and return its ServiceAccount user.
pub fn authenticate(state: &State, auth: &Auth, token: &str) -> Result<UserInfo, TokenError> {
    let keys = auth.sa.as_ref().ok_or(TokenError::NoKey)?;
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&auth.audiences());
    validation.set_issuer(&[auth.issuer()]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    validation.validate_nbf = true;
    validation.leeway = 0;
    let data = jsonwebtoken::decode::<Claims>(token, &keys.decoding, &validation)
        .map_err(TokenError::Verify)?;
    let c = data.claims;
    let ns = &c.kubernetes.namespace;
    let sa = &c.kubernetes.serviceaccount;
    if cached_uid(state, "serviceaccounts", ns, &sa.name).as_deref() != Some(sa.uid.as_str()) {
        return Err(TokenError::ServiceAccountGone(format!("{ns}/{}", sa.name)));
    }
    let mut extra = std::collections::BTreeMap::new();
    if let Some(pod) = &c.kubernetes.pod {
        if cached_uid(state, "pods", ns, &pod.name).as_deref() != Some(pod.uid.as_str()) {
            return Err(TokenError::PodGone(format!("{ns}/{}", pod.name)));
        }
        extra.insert("authentication.kubernetes.io/pod-name".into(), vec![pod.name.clone()]);
        extra.insert("authentication.kubernetes.io/pod-uid".into(), vec![pod.uid.clone()]);
    }
    extra.insert(
        "authentication.kubernetes.io/credential-id".into(),
        vec![format!("JTI={}", c.jti)],
    );
    Ok(UserInfo {
        name: format!("{}{ns}:{}", names::SERVICE_ACCOUNT_PREFIX, sa.name),
        uid: sa.uid.clone(),
        groups: vec![
            names::SERVICE_ACCOUNTS.to_string(),
            format!("{}:{ns}", names::SERVICE_ACCOUNTS),
        ],
        extra,
    })
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`: a TokenRequest.
pub fn token_request(
    state: &State,
    auth: &Auth,
    ns: &str,
    name: &str,
    body: &Bytes,
) -> ApiResult<Value> {
    let sa_uid = cached_uid(state, "serviceaccounts", ns, name)
        .ok_or_else(|| ApiError::not_found("serviceaccounts", name))?;
    let mut req: Value = if body.is_empty() {
        json!({})
    } else {
        crate::negotiate::decode_review(body, "TokenRequest")?
    };
    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let audiences: Vec<String> = match spec.get("audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a.iter().filter_map(Value::as_str).map(String::from).collect(),
        _ => auth.audiences(),
    };
    let ttl = spec.get("expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    if ttl < 600 {
        return Err(ApiError::invalid(
            format!(
                "TokenRequest.authentication.k8s.io \"{name}\" is invalid: spec.expirationSeconds: Invalid value: {ttl}: may not specify a duration less than 10 minutes"
            ),
            Vec::new(),
        ));
    }
    let ttl = ttl.min(1 << 32);
    let pod = match spec.get("boundObjectRef") {
        Some(r) if !r.is_null() => {
            let kind = r.get("kind").and_then(Value::as_str).unwrap_or_default();
            let pod_name = r.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            if kind != "Pod" {
                return Err(ApiError::bad_request(format!(
                    "cannot bind a token to a {kind}: only Pod is supported"
                )));
            }
            let uid = cached_uid(state, "pods", ns, &pod_name)
                .ok_or_else(|| ApiError::not_found("pods", &pod_name))?;
            if let Some(want) = r.get("uid").and_then(Value::as_str)
                && !want.is_empty()
                && want != uid
            {
                return Err(ApiError::conflict(
                    "pods",
                    &pod_name,
                    "the UID in the bound object reference does not match",
                ));
            }
            Some(ObjectRef { name: pod_name, uid })
        }
        _ => None,
    };
    let c = claims(
        auth,
        ns,
        ObjectRef { name: name.to_string(), uid: sa_uid },
        pod,
        audiences.clone(),
        ttl,
    );
    let token = sign(auth, &c).map_err(ApiError::internal)?;
    let exp = skiff_core::time::rfc3339_seconds(
        jiff::Timestamp::from_second(c.exp).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
    );
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] = json!({"name": name, "namespace": ns,
        "creationTimestamp": skiff_core::time::now_rfc3339()});
    req["spec"]["audiences"] = json!(audiences);
    req["spec"]["expirationSeconds"] = json!(ttl);
    req["status"] = json!({"token": token, "expirationTimestamp": exp});
    Ok(req)
}

/// The HTTP status of a created TokenRequest.
pub const CREATED: StatusCode = StatusCode::CREATED;
