//! Authorization: request attributes as upstream's `authorizer.Attributes`, the chain
//! (system:masters, Node, RBAC), upstream's Forbidden message, impersonation, and the
//! endpoints owned by auth (access reviews, TokenRequest, the node join exchange).

pub mod defaults;
pub mod escalation;
pub mod node;
pub mod rbac;

/// The API group of Roles, ClusterRoles and their bindings.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

use std::collections::BTreeMap;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use super::ApiServer;
use super::authn::{self, AuthorizationMode};
use super::request::{self, Query, Route};
use super::status::{ApiError, ApiResult};
use super::user::UserInfo;
use skiff_core::names;

/// What a request asks to do (upstream `authorizer.AttributesRecord`).
#[derive(Debug, Clone)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub resource_request: bool,
    pub namespace: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// Non-resource requests: the URL path.
    pub path: String,
    /// `fieldSelector` of list/watch requests (the Node authorizer scopes lists with it).
    pub field_selector: String,
}

impl Attributes {
    pub fn from_request(
        user: &UserInfo,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> ApiResult<Attributes> {
        let q = Query::parse(query);
        let mut a = Attributes {
            user: user.clone(),
            verb: String::new(),
            resource_request: false,
            namespace: String::new(),
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            name: String::new(),
            path: path.to_string(),
            field_selector: q.get("fieldSelector").unwrap_or_default().to_string(),
        };
        // Unparseable API paths are authorized as non-resource requests (then 404).
        if let Ok(Some(Route::Resource(info))) = request::parse(method, path, q.flag("watch")) {
            a.resource_request = true;
            a.verb = info.verb.as_str().to_string();
            a.namespace = info.namespace.unwrap_or_default();
            a.group = info.group;
            a.version = info.version;
            a.resource = info.resource;
            a.subresource = info.subresource.unwrap_or_default();
            a.name = info.name.unwrap_or_default();
            // `/api/v1/namespaces/<ns>` names the namespace object itself.
            if a.resource == "namespaces" && a.namespace.is_empty() {
                a.namespace = a.name.clone();
            }
            // Upstream (AuthorizePodWebsocketUpgradeCreatePermission): exec, attach and
            // port-forward over a websocket GET need `create`, as over POST.
            if a.resource == "pods"
                && matches!(a.subresource.as_str(), "exec" | "attach" | "portforward")
                && a.verb == "get"
            {
                a.verb = "create".into();
            }
        } else {
            a.verb = match *method {
                Method::GET | Method::HEAD => "get",
                Method::POST => "post",
                Method::PUT => "put",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "unknown",
            }
            .to_string();
        }
        Ok(a)
    }

    /// `pods/log`, `pods`: the resource as RBAC rules name it.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// An authorizer's answer (upstream Allow / Deny / NoOpinion, with a reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(String),
    NoOpinion(String),
}

/// Run the chain: system:masters, Node, RBAC.
pub fn decide(server: &ApiServer, a: &Attributes) -> Decision {
    if server.auth.config.authorization == AuthorizationMode::AlwaysAllow
        || a.user.in_group(names::MASTERS)
    {
        return Decision::Allow;
    }
    // kubeadm's `kubeadm:bootstrap-signer-clusterinfo`: anyone may read kube-public/
    // cluster-info (the CA and server URL, signed per join token), how joining agents
    // learn to trust the server.
    if a.resource_request
        && a.verb == "get"
        && a.group.is_empty()
        && a.resource == "configmaps"
        && a.subresource.is_empty()
        && a.namespace == "kube-public"
        && a.name == skiff_core::join::CLUSTER_INFO
    {
        return Decision::Allow;
    }
    if a.user.node_name().is_some() {
        match node::authorize(server, a) {
            Decision::NoOpinion(_) => {}
            d => return d,
        }
    }
    server.auth.rbac.authorize(server, a)
}

/// Allow, or the 403 Status upstream answers.
pub fn authorize(server: &ApiServer, a: &Attributes) -> ApiResult<()> {
    match decide(server, a) {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) | Decision::NoOpinion(reason) => Err(forbidden(a, &reason)),
    }
}

/// Upstream's `responsewriters.Forbidden` message and details.
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let mut msg = if !a.resource_request {
        format!("User {:?} cannot {} path {:?}", a.user.name, a.verb, a.path)
    } else if !a.namespace.is_empty() {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
            a.user.name,
            a.verb,
            a.combined_resource(),
            a.group,
            a.namespace
        )
    } else {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
            a.user.name,
            a.verb,
            a.combined_resource(),
            a.group
        )
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    if !a.resource_request {
        return ApiError::forbidden(format!("forbidden: {msg}"));
    }
    let qualified =
        if a.group.is_empty() { a.resource.clone() } else { format!("{}.{}", a.resource, a.group) };
    let full = if a.name.is_empty() {
        format!("{qualified} is forbidden: {msg}")
    } else {
        format!("{qualified} {:?} is forbidden: {msg}", a.name)
    };
    ApiError::forbidden(full).with_details(&a.group, &a.resource, &a.name)
}

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn impersonate_check(
    server: &ApiServer,
    user: &UserInfo,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> ApiResult<()> {
    let a = Attributes {
        user: user.clone(),
        verb: "impersonate".into(),
        resource_request: true,
        namespace: namespace.into(),
        group: group.into(),
        version: String::new(),
        resource: resource.into(),
        subresource: String::new(),
        name: name.into(),
        path: String::new(),
        field_selector: String::new(),
    };
    authorize(server, &a)
}

/// Apply `Impersonate-*` headers when `user` may impersonate (upstream's impersonation
/// filter: every requested user, group, uid and extra value is authorized separately).
pub fn impersonate(server: &ApiServer, user: UserInfo, headers: &HeaderMap) -> ApiResult<UserInfo> {
    let as_user = header_values(headers, "impersonate-user");
    let as_groups = header_values(headers, "impersonate-group");
    let as_uid = header_values(headers, "impersonate-uid");
    let extra_keys: Vec<String> = headers
        .keys()
        .filter_map(|k| k.as_str().strip_prefix("impersonate-extra-").map(String::from))
        .collect();
    if as_user.is_empty() && as_groups.is_empty() && as_uid.is_empty() && extra_keys.is_empty() {
        return Ok(user);
    }
    let Some(name) = as_user.first().cloned() else {
        return Err(ApiError::bad_request(
            "requested impersonation of groups, uid or extra without impersonating a user",
        ));
    };
    let mut target = UserInfo { name: name.clone(), ..Default::default() };
    if let Some(sa) = name.strip_prefix(names::SERVICE_ACCOUNT_PREFIX) {
        let (ns, sa_name) = sa.split_once(':').unwrap_or(("", sa));
        impersonate_check(server, &user, "", "serviceaccounts", ns, sa_name)?;
        target.groups =
            vec![names::SERVICE_ACCOUNTS.into(), format!("{}:{ns}", names::SERVICE_ACCOUNTS)];
    } else {
        impersonate_check(server, &user, "", "users", "", &name)?;
    }
    for g in &as_groups {
        impersonate_check(server, &user, "", "groups", "", g)?;
        if !target.groups.contains(g) {
            target.groups.push(g.clone());
        }
    }
    if let Some(uid) = as_uid.first() {
        impersonate_check(server, &user, "authentication.k8s.io", "uids", "", uid)?;
        target.uid = uid.clone();
    }
    let mut extra = BTreeMap::new();
    for key in extra_keys {
        let values = header_values(headers, &format!("impersonate-extra-{key}"));
        let decoded = request::decode(&key);
        for v in &values {
            impersonate_check(
                server,
                &user,
                "authentication.k8s.io",
                &format!("userextras/{decoded}"),
                "",
                v,
            )?;
        }
        extra.insert(decoded, values);
    }
    target.extra = extra;
    if target.name != names::ANONYMOUS && !target.in_group(names::AUTHENTICATED) {
        target.groups.push(names::AUTHENTICATED.into());
    }
    Ok(target)
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
            ("certificates.k8s.io", "certificatesigningrequests", "") => Some(Special::NodeCsr),
            _ => None,
        }
    }

    pub async fn run(self, server: &ApiServer, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let user = parts.extensions.get::<UserInfo>().cloned().unwrap_or_else(UserInfo::anonymous);
        let body = match axum::body::to_bytes(body, super::negotiate::MAX_BODY).await {
            Ok(b) => b,
            Err(_) => return ApiError::too_large(super::negotiate::MAX_BODY).into_response(),
        };
        let result = match self {
            Special::TokenRequest { namespace, name } => {
                authn::serviceaccount::token_request(server, &namespace, &name, &body)
            }
            Special::SelfSubjectAccessReview => access_review(server, &user, &body, true),
            Special::SubjectAccessReview => access_review(server, &user, &body, false),
            Special::SelfSubjectRulesReview => rules_review(server, &user, &body),
            Special::SelfSubjectReview { version } => Ok(self_subject_review(&user, &version)),
            Special::NodeCsr => authn::join::sign_node_csr(server, &user, &body).await,
        };
        match result {
            Ok(v) => super::json_response(StatusCode::CREATED, &v),
            Err(e) => e.into_response(),
        }
    }
}

/// A request body in JSON, or in protobuf (kubectl's clientset sends built-in types so):
/// the review and TokenRequest kinds are decoded with their k8s-pb types.
pub fn parse_body(body: &Bytes, kind: &str) -> ApiResult<Value> {
    if skiff_machinery::protobuf::is_protobuf(body) {
        return decode_protobuf(body)
            .map_err(|e| ApiError::bad_request(format!("decoding the {kind}: {e}")));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("decoding the {kind}: {e}")))
}

fn decode_protobuf(body: &[u8]) -> Result<Value, String> {
    use k8s_pb::api::{authentication::v1 as authn, authorization::v1 as authz};
    use prost::Message;
    let payload = body.get(4..).ok_or("short body")?;
    let unknown =
        k8s_pb::apimachinery::pkg::runtime::Unknown::decode(payload).map_err(|e| e.to_string())?;
    let kind = unknown.type_meta.and_then(|t| t.kind).unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let res = |r: Option<authz::ResourceAttributes>| {
        r.map(|r| {
            json!({"namespace": r.namespace, "verb": r.verb, "group": r.group, "version": r.version,
                   "resource": r.resource, "subresource": r.subresource, "name": r.name})
        })
    };
    let non = |r: Option<authz::NonResourceAttributes>| {
        r.map(|r| json!({"path": r.path, "verb": r.verb}))
    };
    let err = |e: prost::DecodeError| e.to_string();
    let mut spec = match kind.as_str() {
        "SelfSubjectAccessReview" => {
            let spec = authz::SelfSubjectAccessReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            json!({"resourceAttributes": res(spec.resource_attributes), "nonResourceAttributes": non(spec.non_resource_attributes)})
        }
        "SubjectAccessReview" => {
            let spec = authz::SubjectAccessReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            let extra: serde_json::Map<String, Value> =
                spec.extra.into_iter().map(|(k, v)| (k, json!(v.items))).collect();
            json!({"resourceAttributes": res(spec.resource_attributes), "nonResourceAttributes": non(spec.non_resource_attributes),
                   "user": spec.user, "groups": spec.groups, "uid": spec.uid, "extra": extra})
        }
        "SelfSubjectRulesReview" => {
            let spec = authz::SelfSubjectRulesReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            json!({"namespace": spec.namespace})
        }
        "TokenRequest" => {
            let spec =
                authn::TokenRequest::decode(raw.as_slice()).map_err(err)?.spec.unwrap_or_default();
            let bound = spec.bound_object_ref.map(|b| {
                json!({"kind": b.kind, "apiVersion": b.api_version, "name": b.name, "uid": b.u_id})
            });
            json!({"audiences": spec.audiences, "expirationSeconds": spec.expiration_seconds, "boundObjectRef": bound})
        }
        other => return Err(format!("unsupported protobuf kind {other:?}")),
    };
    if let Value::Object(m) = &mut spec {
        m.retain(|_, v| !v.is_null());
    }
    Ok(json!({"kind": kind, "spec": spec}))
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
    let mut review = parse_body(body, kind)?;
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
    let status = match decide(server, &a) {
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
    let mut review = parse_body(body, "SelfSubjectRulesReview")?;
    let ns =
        review.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or_default().to_string();
    let (resource_rules, non_resource_rules) = if caller.in_group(names::MASTERS) {
        (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
        )
    } else {
        server.auth.rbac.rules_for(server, caller, &ns)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, path: &str, query: Option<&str>) -> Attributes {
        Attributes::from_request(&UserInfo::new("bob", &[]), &method, path, query).unwrap()
    }

    #[test]
    fn forbidden_messages_match_upstream() {
        let a = attrs(Method::GET, "/api/v1/namespaces/team/pods", None);
        assert_eq!(
            forbidden(&a, "").message,
            r#"pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "team""#
        );
        let a = attrs(Method::DELETE, "/apis/apps/v1/namespaces/team/deployments/web", None);
        let e = forbidden(&a, "");
        assert_eq!(
            e.message,
            r#"deployments.apps "web" is forbidden: User "bob" cannot delete resource "deployments" in API group "apps" in the namespace "team""#
        );
        assert_eq!((e.kind.as_deref(), e.name.as_deref()), (Some("deployments"), Some("web")));
        let a = attrs(Method::GET, "/api/v1/namespaces/team/pods/p/log", None);
        assert_eq!(
            forbidden(&a, "").message,
            r#"pods "p" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the namespace "team""#
        );
        let a = attrs(Method::PATCH, "/api/v1/nodes/n2", None);
        assert_eq!(
            forbidden(&a, "because").message,
            r#"nodes "n2" is forbidden: User "bob" cannot patch resource "nodes" in API group "" at the cluster scope: because"#
        );
        let a = attrs(Method::GET, "/metrics", None);
        assert_eq!(
            forbidden(&a, "").message,
            r#"forbidden: User "bob" cannot get path "/metrics""#
        );
        let a = attrs(Method::GET, "/api/v1/watch/namespaces/x/pods", Some("fieldSelector=a%3Db"));
        assert_eq!((a.verb.as_str(), a.field_selector.as_str()), ("watch", "a=b"));
        let a = attrs(Method::GET, "/api/v1/namespaces/x/pods/p/exec", None);
        assert_eq!(a.verb, "create");
    }
}
