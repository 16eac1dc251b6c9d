//! Joining agents: a bootstrap token holder posts a CertificateSigningRequest
//! (certificates.k8s.io/v1, signer `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `CN=system:node:<name>`, `O=system:nodes`) and gets it back approved and signed by the
//! cluster CA in the same response; the request is stored as any other (`kubectl get csr`).
//! The bootstrap token's Secret is deleted in the same step, so a join token is good for
//! exactly one node certificate and nothing else. Every other request (a node renewing its
//! certificate, a user) is stored pending and left to the approving and signing
//! controllers, as upstream.

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::auth::Auth;
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::certificates as certs;
use skiff_core::names;
use skiff_store::StoreExt;

/// Upstream's default signing duration (`--cluster-signing-duration`): one year.
pub const DEFAULT_SIGNING_DURATION: std::time::Duration =
    std::time::Duration::from_secs(365 * 86_400);

fn forbidden(user: &UserInfo, why: &str) -> ApiError {
    ApiError::forbidden(format!(
        "certificatesigningrequests.certificates.k8s.io is forbidden: User {:?} cannot create a node client certificate: {why}",
        user.name
    ))
    .with_details("certificates.k8s.io", "certificatesigningrequests", "")
}

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// `POST /apis/certificates.k8s.io/v1/certificatesigningrequests` from a bootstrapper.
pub async fn sign_node_csr(
    state: &State,
    auth: &Auth,
    user: &UserInfo,
    body: &Bytes,
) -> ApiResult<Value> {
    let Some(bootstrap_id) =
        user.name.strip_prefix("system:bootstrap:").filter(|_| user.in_group(names::BOOTSTRAPPERS))
    else {
        return Err(forbidden(user, "only bootstrap tokens join"));
    };
    let mut csr: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("decoding the CertificateSigningRequest: {e}"))
    })?;
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or_default();
    if signer != certs::KUBE_APISERVER_CLIENT_KUBELET {
        return Err(forbidden(
            user,
            &format!("signer {signer:?} is not {:?}", certs::KUBE_APISERVER_CLIENT_KUBELET),
        ));
    }
    let request = csr.pointer("/spec/request").and_then(Value::as_str).unwrap_or_default();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(request)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            ApiError::bad_request("spec.request is not a base64 PEM certificate request")
        })?;
    let parsed = certs::parse_request(pem.as_bytes())
        .map_err(|e| ApiError::bad_request(format!("spec.request: {e}")))?;
    let usages: Vec<String> = csr
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| u.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let node = certs::check_node_client(&parsed, &usages)
        .map_err(|why| forbidden(user, &why))?
        .to_string();
    if !valid_node_name(&node) {
        return Err(forbidden(user, &format!("{node:?} is not a valid node name")));
    }
    let csr_rt = state
        .registry
        .find("certificates.k8s.io", "v1", "certificatesigningrequests")
        .ok_or_else(|| ApiError::internal("certificatesigningrequests are not served"))?;
    let name = match csr.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            let prefix = csr
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .unwrap_or("node-csr-");
            // Five characters, as the apiserver's generateName suffixes.
            format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..5])
        }
    };
    let key = csr_rt.key(None, &name);
    if state.cache.resource(csr_rt).get(&key).is_some() {
        return Err(ApiError::already_exists(&csr_rt.qualified(), &name).with_details(
            csr_rt.group(),
            csr_rt.plural(),
            &name,
        ));
    }
    // Consume the token before signing: the delete is conditional on the Secret's revision,
    // so of two concurrent requests with one token only one gets a certificate.
    let secrets = state
        .registry
        .find("", "v1", "secrets")
        .ok_or_else(|| ApiError::internal("secrets are not served"))?;
    let secret_key = secrets.key(
        Some("kube-system"),
        &format!("{}{bootstrap_id}", skiff_core::join::BOOTSTRAP_SECRET_PREFIX),
    );
    let cached = state.cache.resource(secrets).get(&secret_key).ok_or_else(super::unauthorized)?;
    state.store.delete(&secret_key, Some(cached.rv)).await.map_err(|_| super::unauthorized())?;
    let duration = if auth.config.signing_duration.is_zero() {
        DEFAULT_SIGNING_DURATION
    } else {
        auth.config.signing_duration
    };
    let duration = match csr.pointer("/spec/expirationSeconds").and_then(Value::as_u64) {
        Some(secs) if secs >= 600 => duration.min(std::time::Duration::from_secs(secs)),
        _ => duration,
    };
    let profile = certs::Profile { usages: &usages, duration };
    let cert = certs::sign(&auth.config.ca_cert_pem, &auth.config.ca_key_pem, &pem, &profile)
        .map_err(|e| ApiError::bad_request(format!("signing the certificate request: {e}")))?;
    let now = skiff_core::time::now_rfc3339();
    csr["apiVersion"] = json!("certificates.k8s.io/v1");
    csr["kind"] = json!("CertificateSigningRequest");
    csr["metadata"] = json!({
        "name": name,
        "uid": uuid::Uuid::new_v4().to_string(),
        "creationTimestamp": now,
    });
    csr["spec"]["username"] = json!(user.name);
    csr["spec"]["groups"] = json!(user.groups);
    csr["status"] = json!({
        "conditions": [{
            "type": "Approved", "status": "True", "reason": "AutoApproved",
            "message": "Auto approving node client certificate after bootstrap token authentication",
            "lastUpdateTime": now, "lastTransitionTime": now,
        }],
        "certificate": base64::engine::general_purpose::STANDARD.encode(cert.as_bytes()),
    });
    let stored = state
        .store
        .create(&key, Bytes::from(serde_json::to_vec(&csr).unwrap_or_default()))
        .await
        .map_err(|e| ApiError::internal(format!("storing the certificate request: {e}")))?;
    csr["metadata"]["resourceVersion"] = json!(stored.mod_revision.to_string());
    tracing::info!(node = %node, requester = %user.name, csr = %name, "signed a node client certificate");
    Ok(csr)
}
