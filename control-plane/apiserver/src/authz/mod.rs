//! Authorization: request attributes as upstream's `authorizer.Attributes`, the chain
//! (system:masters, Node, RBAC), upstream's Forbidden message, impersonation, and the
//! endpoints owned by auth (access reviews, TokenRequest, the node join exchange).

mod attributes;
pub mod defaults;
pub mod node;
pub mod rbac;

use std::collections::BTreeMap;

use http::HeaderMap;

pub use self::attributes::{Attributes, Decision, RBAC_GROUP};
use super::request;
use super::status::{ApiError, ApiResult};
use super::user::UserInfo;
pub use crate::config::AuthorizationMode;
use crate::state::State;
use skiff_core::names;

/// The authorizers in upstream's `Node,RBAC` order, after system:masters; RBAC reads its
/// roles and bindings through [`rbac::RbacCache`].
pub struct Authorizer {
    pub mode: AuthorizationMode,
    pub rbac: rbac::RbacCache,
}

impl Authorizer {
    pub fn new(mode: AuthorizationMode) -> Self {
        Authorizer { mode, rbac: Default::default() }
    }

    /// Run the chain: system:masters, Node, RBAC.
    pub fn decide(&self, state: &State, a: &Attributes) -> Decision {
        if self.mode == AuthorizationMode::AlwaysAllow || a.user.in_group(names::MASTERS) {
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
            match node::authorize(state, a) {
                Decision::NoOpinion(_) => {}
                d => return d,
            }
        }
        self.rbac.authorize(state, a)
    }

    /// Allow, or the 403 Status upstream answers.
    pub fn authorize(&self, state: &State, a: &Attributes) -> ApiResult<()> {
        match self.decide(state, a) {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) | Decision::NoOpinion(reason) => Err(forbidden(a, &reason)),
        }
    }

    /// Apply `Impersonate-*` headers when `user` may impersonate (upstream's impersonation
    /// filter: every requested user, group, uid and extra value is authorized separately).
    pub fn impersonate(
        &self,
        state: &State,
        user: UserInfo,
        headers: &HeaderMap,
    ) -> ApiResult<UserInfo> {
        let as_user = header_values(headers, "impersonate-user");
        let as_groups = header_values(headers, "impersonate-group");
        let as_uid = header_values(headers, "impersonate-uid");
        let extra_keys: Vec<String> = headers
            .keys()
            .filter_map(|k| k.as_str().strip_prefix("impersonate-extra-").map(String::from))
            .collect();
        if as_user.is_empty() && as_groups.is_empty() && as_uid.is_empty() && extra_keys.is_empty()
        {
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
            self.impersonate_check(state, &user, "", "serviceaccounts", ns, sa_name)?;
            target.groups =
                vec![names::SERVICE_ACCOUNTS.into(), format!("{}:{ns}", names::SERVICE_ACCOUNTS)];
        } else {
            self.impersonate_check(state, &user, "", "users", "", &name)?;
        }
        for g in &as_groups {
            self.impersonate_check(state, &user, "", "groups", "", g)?;
            if !target.groups.contains(g) {
                target.groups.push(g.clone());
            }
        }
        if let Some(uid) = as_uid.first() {
            self.impersonate_check(state, &user, "authentication.k8s.io", "uids", "", uid)?;
            target.uid = uid.clone();
        }
        let mut extra = BTreeMap::new();
        for key in extra_keys {
            let values = header_values(headers, &format!("impersonate-extra-{key}"));
            let decoded = request::decode(&key);
            for v in &values {
                self.impersonate_check(
                    state,
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

    fn impersonate_check(
        &self,
        state: &State,
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
        self.authorize(state, &a)
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

#[cfg(test)]
mod tests {
    use http::Method;

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
