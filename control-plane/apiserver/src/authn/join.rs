//! Joining agents: a bootstrap token holder posts a CertificateSigningRequest
//! (certificates.k8s.io/v1, signer `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `CN=system:node:<name>`) and gets it back approved and signed by the cluster CA in the
//! same response. The bootstrap token's Secret is deleted in the same step, so a join token
//! is good for exactly one node certificate and nothing else.

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::auth::Auth;
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::names;
use skiff_store::StoreExt;

use skiff_core::join::KUBELET_CLIENT_SIGNER;
/// Validity of node client certificates (upstream's default signing duration: one year).
const VALID_DAYS: i64 = 365;

fn forbidden(user: &UserInfo, why: &str) -> ApiError {
    ApiError::forbidden(format!(
        "certificatesigningrequests.certificates.k8s.io is forbidden: User {:?} cannot create a node client certificate: {why}",
        user.name
    ))
    .with_details("certificates.k8s.io", "certificatesigningrequests", "")
}

/// The subject CN of a PEM CSR.
fn csr_common_name(pem: &str) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    let der =
        rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).ok()?;
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .ok()?;
    let cn = csr.certification_request_info.subject.iter_common_name().next()?;
    cn.as_str().ok().map(String::from)
}

use x509_parser::prelude::FromDer;

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// `POST /apis/certificates.k8s.io/v1/certificatesigningrequests` from a bootstrapper
/// (or a system:masters member issuing a node certificate by hand).
pub async fn sign_node_csr(
    state: &State,
    auth: &Auth,
    user: &UserInfo,
    body: &Bytes,
) -> ApiResult<Value> {
    let bootstrap_id =
        user.name.strip_prefix("system:bootstrap:").filter(|_| user.in_group(names::BOOTSTRAPPERS));
    if bootstrap_id.is_none() && !user.in_group(names::MASTERS) {
        return Err(forbidden(user, "only bootstrap tokens may request node client certificates"));
    }
    let mut csr: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("decoding the CertificateSigningRequest: {e}"))
    })?;
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or_default();
    if signer != KUBELET_CLIENT_SIGNER {
        return Err(forbidden(
            user,
            &format!("signer {signer:?} is not {KUBELET_CLIENT_SIGNER:?}"),
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
    let cn = csr_common_name(&pem)
        .ok_or_else(|| ApiError::bad_request("spec.request is not a valid certificate request"))?;
    let node = cn
        .strip_prefix(names::NODE_PREFIX)
        .filter(|n| valid_node_name(n))
        .ok_or_else(|| forbidden(user, &format!("subject {cn:?} is not system:node:<node name>")))?
        .to_string();
    // Consume the token before signing: the delete is conditional on the Secret's revision,
    // so of two concurrent requests with one token only one gets a certificate.
    if let Some(id) = bootstrap_id {
        let rt = state
            .registry
            .find("", "v1", "secrets")
            .ok_or_else(|| ApiError::internal("secrets are not served"))?;
        let key = rt.key(
            Some("kube-system"),
            &format!("{}{id}", skiff_core::join::BOOTSTRAP_SECRET_PREFIX),
        );
        let cached = state.cache.resource(rt).get(&key).ok_or_else(super::unauthorized)?;
        state.store.delete(&key, Some(cached.rv)).await.map_err(|_| super::unauthorized())?;
    }
    let cert = crate::pki::sign_client_csr(
        &auth.config.ca_cert_pem,
        &auth.config.ca_key_pem,
        &pem,
        &cn,
        &[names::NODES],
        VALID_DAYS,
    )
    .map_err(|e| ApiError::bad_request(format!("signing the certificate request: {e}")))?;
    let now = skiff_core::time::now_rfc3339();
    csr["apiVersion"] = json!("certificates.k8s.io/v1");
    csr["kind"] = json!("CertificateSigningRequest");
    if csr.pointer("/metadata/name").is_none() {
        csr["metadata"] = json!({"name": format!("node-csr-{node}")});
    }
    csr["metadata"]["creationTimestamp"] = json!(now);
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
    tracing::info!(node = %node, requester = %user.name, "signed a node client certificate");
    Ok(csr)
}
