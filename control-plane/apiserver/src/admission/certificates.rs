//! CertificateSigningRequests: the requester stamped into `spec` on create (upstream's
//! strategy: `username`, `uid`, `groups`, `extra` are the authenticated user's, whatever the
//! body said), and upstream's three admission plugins:
//! - CertificateApproval: adding an Approved or Denied condition (`/approval`) needs the
//!   `approve` verb on `signers` named by the request's signer (or `<domain>/*`);
//! - CertificateSigning: setting `status.certificate` (`/status`) needs `sign` on it;
//! - CertificateSubjectRestriction: the `kube-apiserver-client` signer never gets a request
//!   in `system:masters`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin};
use crate::authz::{Attributes, AuthorizationMode, Authorizer, Decision};
use crate::state::State;
use crate::status::ApiResult;
use skiff_core::certificates as certs;
use skiff_core::json::ValueAt;
use skiff_core::names;

const GROUP: &str = "certificates.k8s.io";

fn is_csr(resource: Resource<'_>) -> bool {
    resource.group == GROUP && resource.resource == "certificatesigningrequests"
}

/// Stamps the requester into a new request.
pub struct CsrRequester;

#[async_trait]
impl MutatingPlugin for CsrRequester {
    fn name(&self) -> &'static str {
        "CertificateSigningRequestRequester"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && is_csr(resource) && resource.subresource.is_none()
    }

    async fn admit(&self, _state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        let user = req.user.clone();
        let Some(obj) = req.object.as_mut() else { return Ok(()) };
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = &mut obj["spec"];
        spec["username"] = json!(user.name);
        let set = |spec: &mut Value, key: &str, v: Value, empty: bool| {
            if let Some(m) = spec.as_object_mut() {
                if empty {
                    m.remove(key);
                } else {
                    m.insert(key.into(), v);
                }
            }
        };
        set(spec, "uid", json!(user.uid), user.uid.is_empty());
        set(spec, "groups", json!(user.groups), user.groups.is_empty());
        set(spec, "extra", json!(user.extra), user.extra.is_empty());
        Ok(())
    }
}

/// CertificateApproval, CertificateSigning and CertificateSubjectRestriction.
pub struct CsrAuthority {
    pub authz: Arc<Authorizer>,
}

fn condition_types(obj: Option<&Value>) -> Vec<String> {
    obj.and_then(|o| o.at(&["status", "conditions"]))
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| c["status"] == "True")
                .filter_map(|c| c["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
impl ValidatingPlugin for CsrAuthority {
    fn name(&self) -> &'static str {
        "CertificateApproval"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        matches!(operation, Operation::Create | Operation::Update) && is_csr(resource)
    }

    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        let Some(obj) = req.object.as_ref() else { return Ok(()) };
        let signer = obj.at(&["spec", "signerName"]).and_then(Value::as_str).unwrap_or_default();
        match (req.operation, req.subresource.as_deref()) {
            (Operation::Create, None) if signer == certs::KUBE_APISERVER_CLIENT => {
                let pem = obj.at(&["spec", "request"]).and_then(Value::as_str).unwrap_or_default();
                use base64::Engine;
                let decoded =
                    base64::engine::general_purpose::STANDARD.decode(pem).unwrap_or_default();
                if let Ok(r) = certs::parse_request(&decoded)
                    && r.organizations.iter().any(|o| o == names::MASTERS)
                {
                    return Err(req.forbidden(format!(
                        "use of {signer} signer with system:masters group is not allowed"
                    )));
                }
                Ok(())
            }
            (Operation::Update, Some("approval")) => {
                let (new, old) =
                    (condition_types(Some(obj)), condition_types(req.old_object.as_ref()));
                let added = ["Approved", "Denied"]
                    .iter()
                    .any(|t| new.iter().any(|n| n == t) && !old.iter().any(|o| o == t));
                if added && !self.may(state, req, "approve", signer) {
                    return Err(req.forbidden(format!(
                        "user not permitted to approve requests with signerName {signer:?}"
                    )));
                }
                Ok(())
            }
            (Operation::Update, Some("status")) => {
                let cert = |o: Option<&Value>| {
                    o.and_then(|o| o.at(&["status", "certificate"])).cloned().unwrap_or_default()
                };
                if cert(Some(obj)) != cert(req.old_object.as_ref())
                    && !self.may(state, req, "sign", signer)
                {
                    return Err(req.forbidden(format!(
                        "user not permitted to sign requests with signerName {signer:?}"
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl CsrAuthority {
    /// Upstream's `IsAuthorizedForSignerName`: `verb` on `signers` named `signer`, or on
    /// the wildcard `<domain>/*`.
    fn may(&self, state: &State, req: &AdmissionRequest, verb: &str, signer: &str) -> bool {
        if self.authz.mode == AuthorizationMode::AlwaysAllow {
            return true;
        }
        let wildcard = signer.split_once('/').map(|(d, _)| format!("{d}/*"));
        std::iter::once(signer.to_string()).chain(wildcard).any(|name| {
            let a = Attributes {
                user: (*req.user).clone(),
                verb: verb.into(),
                resource_request: true,
                namespace: String::new(),
                group: GROUP.into(),
                version: String::new(),
                resource: "signers".into(),
                subresource: String::new(),
                name,
                path: String::new(),
                field_selector: String::new(),
            };
            self.authz.decide(state, &a) == Decision::Allow
        })
    }
}
