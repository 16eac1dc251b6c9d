//! CertificateSigningRequests (kube-controller-manager's `csrapproving`, `csrsigning` and
//! `csrcleaner`):
//! - approving: a pending node client request (`kube-apiserver-client-kubelet`, upstream's
//!   `IsKubeletClientCSR` shape) is approved when a SubjectAccessReview says its requester
//!   may `create certificatesigningrequests/selfnodeclient` (a node renewing its own
//!   certificate: the requester is the subject) or `.../nodeclient` (any other requester,
//!   such as a bootstrapper); the default policy binds the first to `system:nodes`;
//! - signing: an approved request of `kube-apiserver-client`, `kube-apiserver-client-kubelet`
//!   or `kubelet-serving` without a certificate is signed with the cluster CA for the
//!   signing duration (or the request's `expirationSeconds`, if shorter), or marked Failed
//!   when it does not fit its signer;
//! - cleaning: approved or denied requests go after an hour, pending ones after a day,
//!   issued ones once their certificate expired.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use crate::context::Context;
use crate::informer::{WorkloadCtx, controller, run_controller};
use skiff_core::certificates as certs;

const MANAGER: &str = "certificatesigningrequest-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("asking whether {user} may have {subresource} certificates approved")]
    Review {
        user: String,
        subresource: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("writing CertificateSigningRequest {name}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the approving and signing controllers and the cleaner until dropped.
pub async fn run(ctx: Arc<Context>) {
    let informer = ctx.informers.all::<CertificateSigningRequest>();
    let cleaner = tokio::spawn(clean_periodically(ctx.clone()));
    let _cleaner = skiff_core::supervisor::AbortOnDrop(cleaner);
    let ctl = controller(&informer).await;
    let workload = WorkloadCtx::new(ctx.client.clone(), MANAGER);
    run_controller(ctl, workload, move |csr: Arc<CertificateSigningRequest>, _| {
        let ctx = ctx.clone();
        async move { reconcile(&csr, &ctx).await }
    })
    .await;
}

fn has_condition(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty())
}

async fn reconcile(csr: &CertificateSigningRequest, ctx: &Context) -> Result<Action, Error> {
    if has_condition(csr, "Denied") || has_condition(csr, "Failed") || issued(csr) {
        return Ok(Action::await_change());
    }
    if !has_condition(csr, "Approved") {
        approve(csr, ctx).await?;
        return Ok(Action::await_change());
    }
    sign(csr, ctx).await?;
    Ok(Action::await_change())
}

/// The approving controller's decision for one pending request.
async fn approve(csr: &CertificateSigningRequest, ctx: &Context) -> Result<(), Error> {
    let spec = &csr.spec;
    if spec.signer_name != certs::KUBE_APISERVER_CLIENT_KUBELET {
        return Ok(());
    }
    let Ok(request) = certs::parse_request(&spec.request.0) else { return Ok(()) };
    let usages = spec.usages.clone().unwrap_or_default();
    if certs::check_node_client(&request, &usages).is_err() {
        return Ok(());
    }
    let user = spec.username.clone().unwrap_or_default();
    let (subresource, message) = if user == request.common_name {
        (
            "selfnodeclient",
            "Auto approving self kubelet client certificate after SubjectAccessReview.",
        )
    } else {
        ("nodeclient", "Auto approving kubelet client certificate after SubjectAccessReview.")
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: spec.username.clone(),
            uid: spec.uid.clone(),
            groups: spec.groups.clone(),
            extra: spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                subresource: Some(subresource.into()),
                verb: Some("create".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(ctx.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| Error::Review { user: user.clone(), subresource, source })?;
    if !answer.status.is_some_and(|s| s.allowed) {
        tracing::debug!(csr = %csr.name_any(), %user, subresource, "not approved automatically");
        return Ok(());
    }
    let now = skiff_core::time::now_rfc3339();
    let patch = json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "AutoApproved", "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now,
    }]}});
    let name = csr.name_any();
    Api::<CertificateSigningRequest>::all(ctx.client.clone())
        .patch_approval(&name, &params(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Write { name: name.clone(), source })?;
    tracing::info!(csr = %name, %user, "approved a node client certificate request");
    Ok(())
}

fn params() -> PatchParams {
    PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() }
}

/// The signing controller's work on one approved request.
async fn sign(csr: &CertificateSigningRequest, ctx: &Context) -> Result<(), Error> {
    let Some(ca) = ctx.config.signing_ca.as_ref() else { return Ok(()) };
    let spec = &csr.spec;
    let usages = spec.usages.clone().unwrap_or_default();
    let fits = match spec.signer_name.as_str() {
        certs::KUBE_APISERVER_CLIENT_KUBELET => certs::parse_request(&spec.request.0)
            .and_then(|r| certs::check_node_client(&r, &usages))
            .map(|_| ()),
        certs::KUBELET_SERVING => certs::parse_request(&spec.request.0)
            .and_then(|r| certs::check_kubelet_serving(&r, &usages))
            .map(|_| ()),
        certs::KUBE_APISERVER_CLIENT => {
            if usages.iter().any(|u| u == "client auth") {
                Ok(())
            } else {
                Err("missing required usage \"client auth\"".to_string())
            }
        }
        // Not a signer of this controller's (upstream's leaves them to theirs).
        _ => return Ok(()),
    };
    let duration = match spec.expiration_seconds {
        Some(s) if s >= 600 => {
            ctx.config.cluster_signing_duration.min(Duration::from_secs(s as u64))
        }
        _ => ctx.config.cluster_signing_duration,
    };
    let signed = fits.and_then(|()| {
        let pem = String::from_utf8(spec.request.0.clone())
            .map_err(|_| "the request is not PEM".to_string())?;
        certs::sign(&ca.cert_pem, &ca.key_pem, &pem, &certs::Profile { usages: &usages, duration })
    });
    let name = csr.name_any();
    let api = Api::<CertificateSigningRequest>::all(ctx.client.clone());
    let patch = match signed {
        Ok(cert) => json!({"status": {
            "certificate": base64::engine::general_purpose::STANDARD.encode(cert.as_bytes()),
        }}),
        Err(why) => {
            tracing::warn!(csr = %name, error = %why, "not signed");
            let now = skiff_core::time::now_rfc3339();
            let mut conditions =
                csr.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            conditions.retain(|c| c.type_ != "Failed");
            let mut conditions = serde_json::to_value(conditions).unwrap_or_default();
            if let Some(list) = conditions.as_array_mut() {
                list.push(json!({
                    "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": why, "lastUpdateTime": now, "lastTransitionTime": now,
                }));
            }
            json!({"status": {"conditions": conditions}})
        }
    };
    api.patch_status(&name, &params(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Write { name: name.clone(), source })?;
    tracing::info!(csr = %name, signer = %spec.signer_name, "certificate request handled");
    Ok(())
}

/// Upstream's csrcleaner periods.
const APPROVED_OR_DENIED_TTL: Duration = Duration::from_secs(3600);
const PENDING_TTL: Duration = Duration::from_secs(24 * 3600);

/// Whether the cleaner deletes `csr` at `now`.
pub fn expired(csr: &CertificateSigningRequest, now: SystemTime) -> bool {
    let created = csr
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t.0.as_second().max(0) as u64));
    let age = created.and_then(|c| now.duration_since(c).ok()).unwrap_or_default();
    if issued(csr) {
        let pem = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let cert_expired = certs::validity(&String::from_utf8_lossy(&pem))
            .is_some_and(|(_, not_after)| not_after < now);
        return cert_expired || age > APPROVED_OR_DENIED_TTL;
    }
    if has_condition(csr, "Approved")
        || has_condition(csr, "Denied")
        || has_condition(csr, "Failed")
    {
        return age > APPROVED_OR_DENIED_TTL;
    }
    age > PENDING_TTL
}

async fn clean_periodically(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let api = Api::<CertificateSigningRequest>::all(ctx.client.clone());
    loop {
        tick.tick().await;
        let Ok(list) = api.list(&ListParams::default()).await else { continue };
        let now = SystemTime::now();
        for csr in list.items.iter().filter(|c| expired(c, now)) {
            let name = csr.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(csr = %name, "deleted an old certificate request"),
                Err(e) => {
                    tracing::debug!(csr = %name, error = %e, "deleting an old certificate request")
                }
            }
        }
    }
}
