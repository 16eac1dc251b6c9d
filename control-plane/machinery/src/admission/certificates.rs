//! certificates.k8s.io/v1 CertificateSigningRequest: upstream's strategies (create clears
//! status; an update of the object keeps spec and status; `/status` keeps the Approved and
//! Denied conditions; `/approval` keeps the certificate and the other conditions) and
//! `pkg/apis/certificates/validation` (the request, signer name, usages, expiration,
//! conditions, the certificate).

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use serde_json::Value;

use super::field::{ErrorList, FieldError, Path, Raw};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::names;
use super::value::Obj;
use skiff_core::certificates as certs;

const APPROVAL_TYPES: [&str; 2] = ["Approved", "Denied"];

pub(super) fn prepare_create(o: &mut Obj) {
    o.remove("status");
}

fn conditions(status: Option<&Value>) -> Vec<Value> {
    status.and_then(|s| s.get("conditions")).and_then(Value::as_array).cloned().unwrap_or_default()
}

fn is_approval(c: &Value) -> bool {
    c.get("type").and_then(Value::as_str).is_some_and(|t| APPROVAL_TYPES.contains(&t))
}

/// After the generic reset of an update: the main resource keeps the spec too; `/status`
/// cannot add or drop Approved/Denied; `/approval` changes only those two and never the
/// certificate. Condition timestamps are filled in as upstream's
/// `populateConditionTimestamps`.
pub(super) fn prepare_update(sub: Option<&str>, n: &mut Obj, o: &Obj) {
    match sub {
        None => match o.get("spec") {
            Some(s) => {
                n.insert("spec".into(), s.clone());
            }
            None => {
                n.remove("spec");
            }
        },
        Some("status") | Some("approval") => {
            let (new_c, old_c) = (conditions(n.get("status")), conditions(o.get("status")));
            let approval = sub == Some("approval");
            let mut merged: Vec<Value> =
                old_c.iter().filter(|c| is_approval(c) != approval).cloned().collect();
            merged.extend(new_c.into_iter().filter(|c| is_approval(c) == approval));
            let now = skiff_core::time::now_rfc3339();
            for c in &mut merged {
                let Some(m) = c.as_object_mut() else { continue };
                let same = old_c.iter().find(|p| p.get("type") == m.get("type"));
                if !m.get("lastUpdateTime").is_some_and(|v| v.is_string()) {
                    m.insert("lastUpdateTime".into(), now.clone().into());
                }
                if !m.get("lastTransitionTime").is_some_and(|v| v.is_string()) {
                    let kept = same
                        .filter(|p| p.get("status") == m.get("status"))
                        .and_then(|p| p.get("lastTransitionTime"))
                        .cloned();
                    m.insert(
                        "lastTransitionTime".into(),
                        kept.unwrap_or_else(|| now.clone().into()),
                    );
                }
            }
            if !n.get("status").is_some_and(Value::is_object) {
                n.insert("status".into(), Value::Object(Default::default()));
            }
            if let Some(status) = n.get_mut("status").and_then(Value::as_object_mut) {
                if merged.is_empty() {
                    status.remove("conditions");
                } else {
                    status.insert("conditions".into(), Value::Array(merged));
                }
                if approval {
                    match o.get("status").and_then(|s| s.get("certificate")) {
                        Some(c) => status.insert("certificate".into(), c.clone()),
                        None => status.remove("certificate"),
                    };
                }
            }
        }
        _ => {}
    }
}

fn has_true(conds: &[CertificateSigningRequestCondition], ty: &str) -> bool {
    conds.iter().any(|c| c.type_ == ty && c.status == "True")
}

pub(super) fn validate(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("certificates.k8s.io", "v1", "CertificateSigningRequest");
    let (n, o) = match typed_pair::<CertificateSigningRequest>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    let sp = Path::root("spec");
    let spec = &n.spec;
    // The request (what create checks; updates cannot change the spec).
    if let Err(e) = certs::parse_request(&spec.request.0) {
        errs.push(FieldError::invalid(&sp.child("request"), Raw(go_bytes(&spec.request.0)), e));
    }
    if spec.signer_name.is_empty() {
        errs.push(FieldError::required(&sp.child("signerName"), ""));
    } else {
        for msg in signer_name_errors(&spec.signer_name) {
            errs.push(FieldError::invalid(&sp.child("signerName"), spec.signer_name.as_str(), msg));
        }
    }
    if spec.usages.as_deref().unwrap_or_default().is_empty() {
        errs.push(FieldError::required(&sp.child("usages"), "usages must be provided"));
    }
    let mut seen = Vec::new();
    for (i, u) in spec.usages.iter().flatten().enumerate() {
        let p = sp.child("usages").index(i);
        if !certs::KNOWN_USAGES.contains(&u.as_str()) {
            errs.push(FieldError::not_supported(&p, u.as_str(), certs::KNOWN_USAGES));
        } else if seen.contains(&u) {
            errs.push(FieldError::duplicate(&p, u.as_str()));
        }
        seen.push(u);
    }
    if let Some(secs) = spec.expiration_seconds
        && secs < 600
    {
        errs.push(FieldError::invalid(
            &sp.child("expirationSeconds"),
            secs,
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    // Status: conditions and the certificate.
    let st = Path::root("status");
    let status = n.status.clone().unwrap_or_default();
    let conds = status.conditions.clone().unwrap_or_default();
    let mut types: Vec<&str> = Vec::new();
    for (i, c) in conds.iter().enumerate() {
        let p = st.child("conditions").index(i);
        if c.type_.is_empty() {
            errs.push(FieldError::required(&p.child("type"), ""));
        }
        if c.status.is_empty() {
            errs.push(FieldError::required(&p.child("status"), ""));
        } else if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            errs.push(FieldError::not_supported(
                &p.child("status"),
                c.status.as_str(),
                &["False", "True", "Unknown"],
            ));
        }
        if matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed") {
            if c.status != "True" && !c.status.is_empty() {
                errs.push(FieldError::not_supported(
                    &p.child("status"),
                    c.status.as_str(),
                    &["True"],
                ));
            }
            if types.contains(&c.type_.as_str()) {
                errs.push(FieldError::duplicate(&p.child("type"), c.type_.as_str()));
            }
        }
        types.push(&c.type_);
    }
    let (approved, denied) = (has_true(&conds, "Approved"), has_true(&conds, "Denied"));
    if approved && denied {
        errs.push(FieldError::invalid(
            &st.child("conditions"),
            Raw("...".into()),
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    let old_status = o.as_ref().and_then(|o| o.status.clone()).unwrap_or_default();
    let old_conds = old_status.conditions.unwrap_or_default();
    if sub == Some("approval") {
        for ty in APPROVAL_TYPES {
            if has_true(&old_conds, ty) && !has_true(&conds, ty) {
                errs.push(FieldError::forbidden(
                    &st.child("conditions"),
                    format!("updates may not remove a condition of type {ty:?}"),
                ));
            }
        }
    }
    let cert = status.certificate.as_ref().map(|c| c.0.as_slice()).unwrap_or_default();
    let old_cert = old_status.certificate.as_ref().map(|c| c.0.as_slice()).unwrap_or_default();
    let cp = st.child("certificate");
    if !cert.is_empty() {
        if !certs::valid_certificates(cert) {
            errs.push(FieldError::invalid(
                &cp,
                Raw("\"<certificate data>\"".into()),
                "must contain at least one valid PEM certificate block",
            ));
        }
        if !approved {
            errs.push(FieldError::invalid(
                &cp,
                Raw("\"<certificate data>\"".into()),
                "certificate may only be set if the Approved condition is true",
            ));
        }
        if has_true(&conds, "Failed") || denied {
            errs.push(FieldError::invalid(
                &cp,
                Raw("\"<certificate data>\"".into()),
                "certificate may not be set if the Denied or Failed condition is true",
            ));
        }
    }
    if o.is_some() && !old_cert.is_empty() && cert != old_cert {
        errs.push(FieldError::forbidden(
            &cp,
            "updates may not modify existing certificate content",
        ));
    }
    errs
}

/// Go's `%#v` of a short byte slice, as upstream prints a bad request; long ones elided.
fn go_bytes(b: &[u8]) -> String {
    let shown: Vec<String> = b.iter().take(16).map(|x| format!("0x{x:x}")).collect();
    let more = if b.len() > 16 { ", ..." } else { "" };
    format!("[]byte{{{}{more}}}", shown.join(", "))
}

/// Upstream's `ValidateSignerName`: `<domain>/<path>`, the domain a DNS subdomain, the path
/// a qualified-name-like segment, 571 characters at most.
fn signer_name_errors(name: &str) -> Vec<String> {
    let Some((domain, path)) = name.split_once('/') else {
        return vec![
            "must be a fully qualified domain and path of the form 'example.com/signer-name'"
                .into(),
        ];
    };
    let mut out = Vec::new();
    if path.is_empty() {
        out.push("validating path: must not be empty".into());
    }
    out.extend(
        names::is_dns1123_subdomain(domain).into_iter().map(|m| format!("validating domain: {m}")),
    );
    if domain.split('.').count() < 2 {
        out.push("should be a domain with at least two segments separated by dots".into());
    }
    if name.len() > 571 {
        out.push(names::max_len_error(571));
    }
    out
}
