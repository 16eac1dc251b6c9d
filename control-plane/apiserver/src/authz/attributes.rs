//! What a request asks to do ([`Attributes`], from its method, path and query) and what an
//! authorizer answers ([`Decision`]): the vocabulary below the authorizers.

use http::Method;

use crate::request::{self, Query, Route};
use crate::status::ApiResult;
use crate::user::UserInfo;

/// The API group of Roles, ClusterRoles and their bindings.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

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
