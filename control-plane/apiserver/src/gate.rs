//! The request gate in front of dispatch: authentication ([`authn`]), impersonation and
//! authorization ([`authz`]) of every request, and the endpoints auth answers itself
//! (TokenRequest, the access and rules reviews, `kubectl auth whoami`, the node join's CSR).
//! It sits above both: authentication does not import authorization's endpoints, nor the
//! other way round.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::authn::{
    self, CLUSTER_INFO_PATH, InProcess, PeerCert, authenticate, is_public_path, unauthorized,
    with_authenticated,
};
use crate::authz::{self, Attributes, Decision};
use crate::negotiate::decode_review;
use crate::server::ApiServer;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::names;

/// The middleware in front of dispatch: authentication, impersonation, authorization, and
/// the auth-owned endpoints (TokenRequest, access reviews, node join).
pub async fn layer(State(server): State<Arc<ApiServer>>, mut req: Request, next: Next) -> Response {
    match admit(&server, &mut req) {
        Ok(None) => next.run(req).await,
        Ok(Some(special)) => special.run(&server, req).await,
        Err(e) => e.into_response(),
    }
}

/// Decide on a request; `Ok(Some(_))` when an auth endpoint answers it.
fn admit(server: &ApiServer, req: &mut Request) -> Result<Option<Special>, ApiError> {
    let user = if let Some(InProcess(user)) = req.extensions().get::<InProcess>() {
        user.clone()
    } else if !server.auth.config.enabled {
        // Auth off (in-process tests): a user already attached by the embedding code (only
        // in-process callers can set extensions) is kept, anyone else is an administrator.
        req.extensions().get::<UserInfo>().cloned().unwrap_or_else(|| {
            UserInfo::new("system:admin", &[names::MASTERS, names::AUTHENTICATED])
        })
    } else {
        let cert = match req.extensions().get::<PeerCert>() {
            Some(p) => p.user()?,
            None => None,
        };
        match authenticate(server, &server.auth, req.headers(), cert)? {
            Some(user) => with_authenticated(user),
            None => UserInfo::anonymous(),
        }
    };
    let path = req.uri().path().to_string();
    if user.name == names::ANONYMOUS
        && !is_public_path(&path)
        && !(req.method() == http::Method::GET && path == CLUSTER_INFO_PATH)
    {
        return Err(unauthorized());
    }
    let user = server.auth.authz.impersonate(server, user, req.headers())?;
    let attrs = authz::Attributes::from_request(&user, req.method(), &path, req.uri().query())?;
    let special = Special::of(&attrs);
    if server.auth.config.enabled {
        server.auth.authz.authorize(server, &attrs)?;
    }
    req.extensions_mut().insert(user);
    Ok(special)
}

/// Requests answered by auth itself rather than the generic resource handlers.
#[derive(Debug, Clone)]
pub enum Special {
    TokenRequest {
        namespace: String,
        name: String,
    },
    SelfSubjectAccessReview,
    SubjectAccessReview,
    SelfSubjectRulesReview,
    /// `kubectl auth whoami` (authentication.k8s.io, any version).
    SelfSubjectReview {
        version: String,
    },
    /// A node's client certificate for a joining agent (bootstrap token holders).
    NodeCsr,
}

impl Special {
    pub fn of(a: &Attributes) -> Option<Special> {
        if !a.resource_request || a.verb != "create" {
            return None;
        }
        match (a.group.as_str(), a.resource.as_str(), a.subresource.as_str()) {
            ("", "serviceaccounts", "token") => {
                Some(Special::TokenRequest { namespace: a.namespace.clone(), name: a.name.clone() })
            }
            ("authorization.k8s.io", "selfsubjectaccessreviews", "") => {
                Some(Special::SelfSubjectAccessReview)
            }
            ("authorization.k8s.io", "subjectaccessreviews", "") => {
                Some(Special::SubjectAccessReview)
            }
            ("authorization.k8s.io", "selfsubjectrulesreviews", "") => {
                Some(Special::SelfSubjectRulesReview)
            }
            ("authentication.k8s.io", "selfsubjectreviews", "") => {
                Some(Special::SelfSubjectReview { version: a.version.clone() })
            }
            // Joining: a bootstrap token's request is signed at once (and the token used up);
            // every other one is stored for the approving and signing controllers.
            ("certificates.k8s.io", "certificatesigningrequests", "")
                if a.user.name.starts_with("system:bootstrap:") =>
            {
                Some(Special::NodeCsr)
            }
            _ => None,
        }
    }

    pub async fn run(self, server: &ApiServer, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let user = parts.extensions.get::<UserInfo>().cloned().unwrap_or_else(UserInfo::anonymous);
        let body = match axum::body::to_bytes(body, crate::negotiate::MAX_BODY).await {
            Ok(b) => b,
            Err(_) => return ApiError::too_large(crate::negotiate::MAX_BODY).into_response(),
        };
        let result = match self {
            Special::TokenRequest { namespace, name } => {
                authn::serviceaccount::token_request(server, &server.auth, &namespace, &name, &body)
            }
            Special::SelfSubjectAccessReview => access_review(server, &user, &body, true),
            Special::SubjectAccessReview => access_review(server, &user, &body, false),
            Special::SelfSubjectRulesReview => rules_review(server, &user, &body),
            Special::SelfSubjectReview { version } => Ok(self_subject_review(&user, &version)),
            Special::NodeCsr => {
                authn::join::sign_node_csr(server, &server.auth, &user, &body).await
            }
        };
        match result {
            Ok(v) => crate::render::json_response(StatusCode::CREATED, &v),
            Err(e) => e.into_response(),
        }
    }
}

fn s(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// SelfSubjectAccessReview (the caller) and SubjectAccessReview (spec.user/groups).
fn access_review(
    server: &ApiServer,
    caller: &UserInfo,
    body: &Bytes,
    own: bool,
) -> ApiResult<Value> {
    let kind = if own { "SelfSubjectAccessReview" } else { "SubjectAccessReview" };
    let mut review = decode_review(body, kind)?;
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let user = if own {
        caller.clone()
    } else {
        let strings = |k: &str| -> Vec<String> {
            spec.get(k)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default()
        };
        let extra = spec
            .get("extra")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let vs = v
                            .as_array()
                            .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                            .unwrap_or_default();
                        (k.clone(), vs)
                    })
                    .collect()
            })
            .unwrap_or_default();
        UserInfo { name: s(&spec, "user"), uid: s(&spec, "uid"), groups: strings("groups"), extra }
    };
    let a = if let Some(r) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        Attributes {
            user,
            verb: s(r, "verb"),
            resource_request: true,
            namespace: s(r, "namespace"),
            group: s(r, "group"),
            version: s(r, "version"),
            resource: s(r, "resource"),
            subresource: s(r, "subresource"),
            name: s(r, "name"),
            path: String::new(),
            field_selector: String::new(),
        }
    } else if let Some(r) = spec.get("nonResourceAttributes").filter(|v| v.is_object()) {
        Attributes {
            user,
            verb: s(r, "verb"),
            resource_request: false,
            namespace: String::new(),
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            name: String::new(),
            path: s(r, "path"),
            field_selector: String::new(),
        }
    } else {
        return Err(ApiError::invalid(
            format!(
                "{kind}.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
            ),
            Vec::new(),
        ));
    };
    let status = match server.auth.authz.decide(server, &a) {
        Decision::Allow => json!({"allowed": true, "reason": ""}),
        Decision::Deny(r) => json!({"allowed": false, "denied": true, "reason": r}),
        Decision::NoOpinion(r) => json!({"allowed": false, "reason": r}),
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind);
    if review.get("metadata").is_none() {
        review["metadata"] = json!({});
    }
    review["status"] = status;
    Ok(review)
}

/// SelfSubjectReview: who the caller is (the request body carries nothing else).
fn self_subject_review(user: &UserInfo, version: &str) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    json!({
        "apiVersion": format!("authentication.k8s.io/{version}"),
        "kind": "SelfSubjectReview",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": info},
    })
}

/// SelfSubjectRulesReview: the RBAC rules that apply to the caller in a namespace.
fn rules_review(server: &ApiServer, caller: &UserInfo, body: &Bytes) -> ApiResult<Value> {
    let mut review = decode_review(body, "SelfSubjectRulesReview")?;
    let ns =
        review.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or_default().to_string();
    let (resource_rules, non_resource_rules) = if caller.in_group(names::MASTERS) {
        (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
        )
    } else {
        server.auth.authz.rbac.rules_for(server, caller, &ns)
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectRulesReview");
    if review.get("metadata").is_none() {
        review["metadata"] = json!({});
    }
    review["status"] = json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    });
    Ok(review)
}
