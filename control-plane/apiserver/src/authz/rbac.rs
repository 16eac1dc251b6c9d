//! RBAC as upstream: Roles, ClusterRoles, RoleBindings and ClusterRoleBindings from the
//! watch cache, indexed by subject and rebuilt only when one of the four resources changed,
//! and upstream's rule matching (verbs, apiGroups, resources with subresources,
//! resourceNames, nonResourceURLs).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::{Value, json};

use super::attributes::{Attributes, Decision, RBAC_GROUP as RBAC};
use crate::state::State;
use crate::user::UserInfo;
use skiff_core::names;
use skiff_store::Revision;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    User(String),
    Group(String),
}

#[derive(Debug, Clone)]
struct Binding {
    /// `None` for ClusterRoleBindings.
    namespace: Option<String>,
    cluster_role: bool,
    role: String,
}

/// The RBAC objects, parsed and indexed.
#[derive(Default)]
struct Snapshot {
    fingerprint: [(Revision, usize); 4],
    cluster_roles: HashMap<String, Arc<Vec<PolicyRule>>>,
    roles: HashMap<(String, String), Arc<Vec<PolicyRule>>>,
    by_subject: HashMap<Subject, Vec<Binding>>,
}

/// The authorizer's index, refreshed lazily from the watch cache.
#[derive(Default)]
pub struct RbacCache {
    snapshot: RwLock<Option<Arc<Snapshot>>>,
}

fn resource_names() -> [&'static str; 4] {
    ["clusterroles", "roles", "clusterrolebindings", "rolebindings"]
}

fn fingerprint(state: &State) -> [(Revision, usize); 4] {
    let mut out = [(0, 0); 4];
    for (i, plural) in resource_names().iter().enumerate() {
        if let Some(rt) = state.registry.find(RBAC, "v1", plural) {
            out[i] = state.cache.resource(rt).fingerprint();
        }
    }
    out
}

fn objects<T: serde::de::DeserializeOwned>(state: &State, plural: &str) -> Vec<T> {
    let Some(rt) = state.registry.find(RBAC, "v1", plural) else { return Vec::new() };
    state.cache.resource(rt).decode_all(&rt.prefix())
}

fn subject_key(
    s: &k8s_openapi::api::rbac::v1::Subject,
    binding_ns: Option<&str>,
) -> Option<Subject> {
    match s.kind.as_str() {
        "User" => Some(Subject::User(s.name.clone())),
        "Group" => Some(Subject::Group(s.name.clone())),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().filter(|n| !n.is_empty()).or(binding_ns)?;
            Some(Subject::User(format!("{}{ns}:{}", names::SERVICE_ACCOUNT_PREFIX, s.name)))
        }
        _ => None,
    }
}

fn build(state: &State, fingerprint: [(Revision, usize); 4]) -> Snapshot {
    let mut snap = Snapshot { fingerprint, ..Default::default() };
    for cr in objects::<ClusterRole>(state, "clusterroles") {
        let name = cr.metadata.name.unwrap_or_default();
        snap.cluster_roles.insert(name, Arc::new(cr.rules.unwrap_or_default()));
    }
    for r in objects::<Role>(state, "roles") {
        let key = (r.metadata.namespace.unwrap_or_default(), r.metadata.name.unwrap_or_default());
        snap.roles.insert(key, Arc::new(r.rules.unwrap_or_default()));
    }
    for b in objects::<ClusterRoleBinding>(state, "clusterrolebindings") {
        if b.role_ref.kind != "ClusterRole" {
            continue;
        }
        for s in b.subjects.iter().flatten() {
            if let Some(k) = subject_key(s, None) {
                snap.by_subject.entry(k).or_default().push(Binding {
                    namespace: None,
                    cluster_role: true,
                    role: b.role_ref.name.clone(),
                });
            }
        }
    }
    for b in objects::<RoleBinding>(state, "rolebindings") {
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        for s in b.subjects.iter().flatten() {
            if let Some(k) = subject_key(s, Some(&ns)) {
                snap.by_subject.entry(k).or_default().push(Binding {
                    namespace: Some(ns.clone()),
                    cluster_role: b.role_ref.kind == "ClusterRole",
                    role: b.role_ref.name.clone(),
                });
            }
        }
    }
    snap
}

impl RbacCache {
    fn current(&self, state: &State) -> Arc<Snapshot> {
        let fp = fingerprint(state);
        if let Some(s) = self.snapshot.read().unwrap_or_else(|e| e.into_inner()).as_ref()
            && s.fingerprint == fp
        {
            return s.clone();
        }
        let mut guard = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = guard.as_ref()
            && s.fingerprint == fp
        {
            return s.clone();
        }
        let snap = Arc::new(build(state, fp));
        *guard = Some(snap.clone());
        snap
    }

    /// The rule lists that apply to `user` for a request in `namespace` ("" = cluster scope).
    fn applicable(snap: &Snapshot, user: &UserInfo, namespace: &str) -> Vec<Arc<Vec<PolicyRule>>> {
        let mut keys = vec![Subject::User(user.name.clone())];
        keys.extend(user.groups.iter().map(|g| Subject::Group(g.clone())));
        let mut out = Vec::new();
        for k in &keys {
            for b in snap.by_subject.get(k).into_iter().flatten() {
                match &b.namespace {
                    Some(ns) if ns != namespace => continue,
                    _ => {}
                }
                let rules = if b.cluster_role {
                    snap.cluster_roles.get(&b.role)
                } else {
                    b.namespace
                        .as_ref()
                        .and_then(|ns| snap.roles.get(&(ns.clone(), b.role.clone())))
                };
                if let Some(r) = rules {
                    out.push(r.clone());
                }
            }
        }
        out
    }

    /// Every rule that applies to `user` in `namespace` ("": its cluster-wide rules), as
    /// upstream's `RulesFor` (what escalation checks compare against).
    pub fn rules_of(&self, state: &State, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        let snap = self.current(state);
        Self::applicable(&snap, user, namespace).iter().flat_map(|r| r.iter().cloned()).collect()
    }

    /// The rules of the role `name` (`plural` "roles" in `namespace`, or "clusterroles");
    /// `None` when it does not exist (upstream `GetRoleReferenceRules`).
    pub fn role_rules(
        &self,
        state: &State,
        namespace: &str,
        plural: &str,
        name: &str,
    ) -> Option<Vec<PolicyRule>> {
        let snap = self.current(state);
        let rules = match plural {
            "roles" => snap.roles.get(&(namespace.to_string(), name.to_string())),
            _ => snap.cluster_roles.get(name),
        };
        rules.map(|r| r.as_ref().clone())
    }

    pub fn authorize(&self, state: &State, a: &Attributes) -> Decision {
        let snap = self.current(state);
        let ns = if a.resource_request { a.namespace.as_str() } else { "" };
        for rules in Self::applicable(&snap, &a.user, ns) {
            if rules.iter().any(|r| rule_allows(r, a)) {
                return Decision::Allow;
            }
        }
        Decision::NoOpinion(String::new())
    }

    /// SelfSubjectRulesReview: the caller's resource and non-resource rules in `namespace`.
    pub fn rules_for(
        &self,
        state: &State,
        user: &UserInfo,
        namespace: &str,
    ) -> (Vec<Value>, Vec<Value>) {
        let snap = self.current(state);
        let mut res = Vec::new();
        let mut non = Vec::new();
        for rules in Self::applicable(&snap, user, namespace) {
            for r in rules.iter() {
                if let Some(urls) = &r.non_resource_urls
                    && !urls.is_empty()
                {
                    non.push(json!({"verbs": r.verbs, "nonResourceURLs": urls}));
                } else {
                    let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups.clone().unwrap_or_default(),
                        "resources": r.resources.clone().unwrap_or_default()});
                    if let Some(n) = &r.resource_names {
                        v["resourceNames"] = json!(n);
                    }
                    res.push(v);
                }
            }
        }
        (res, non)
    }
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Upstream's `RuleAllows`.
pub fn rule_allows(r: &PolicyRule, a: &Attributes) -> bool {
    if !has(&r.verbs, &a.verb) {
        return false;
    }
    if a.resource_request {
        let groups = r.api_groups.as_deref().unwrap_or_default();
        if !has(groups, &a.group) {
            return false;
        }
        let combined = a.combined_resource();
        let resources = r.resources.as_deref().unwrap_or_default();
        let res_ok = resources.iter().any(|x| {
            x == "*"
                || *x == combined
                || (!a.subresource.is_empty()
                    && x.strip_prefix("*/").is_some_and(|sub| sub == a.subresource))
        });
        if !res_ok {
            return false;
        }
        match r.resource_names.as_deref() {
            None | Some([]) => true,
            Some(names) => !a.name.is_empty() && names.contains(&a.name),
        }
    } else {
        let urls = r.non_resource_urls.as_deref().unwrap_or_default();
        urls.iter().any(|u| {
            u == "*"
                || *u == a.path
                || u.strip_suffix('*').is_some_and(|prefix| a.path.starts_with(prefix))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            user: UserInfo::new("u", &[]),
            verb: verb.into(),
            resource_request: true,
            namespace: "ns".into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            path: String::new(),
            field_selector: String::new(),
        }
    }

    /// A resource rule (also the escalation tests').
    pub(crate) fn rule(
        verbs: &[&str],
        groups: &[&str],
        resources: &[&str],
        names: &[&str],
    ) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule {
            verbs: v(verbs),
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            resource_names: (!names.is_empty()).then(|| v(names)),
            non_resource_urls: None,
        }
    }

    #[test]
    fn matches_rules_as_upstream() {
        let r = rule(&["get", "list"], &[""], &["pods", "pods/log"], &[]);
        assert!(rule_allows(&r, &attrs("get", "", "pods", "", "p")));
        assert!(rule_allows(&r, &attrs("get", "", "pods", "log", "p")));
        assert!(!rule_allows(&r, &attrs("get", "", "pods", "exec", "p")));
        assert!(!rule_allows(&r, &attrs("delete", "", "pods", "", "p")));
        assert!(!rule_allows(&r, &attrs("get", "apps", "pods", "", "p")));
        let r = rule(&["*"], &["*"], &["*/status"], &[]);
        assert!(rule_allows(&r, &attrs("update", "apps", "deployments", "status", "d")));
        assert!(!rule_allows(&r, &attrs("update", "apps", "deployments", "", "d")));
        let r = rule(&["get"], &[""], &["configmaps"], &["a"]);
        assert!(rule_allows(&r, &attrs("get", "", "configmaps", "", "a")));
        assert!(!rule_allows(&r, &attrs("get", "", "configmaps", "", "b")));
        assert!(!rule_allows(&r, &attrs("get", "", "configmaps", "", "")));
        let nr = PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(vec!["/apis/*".into(), "/version".into()]),
            ..Default::default()
        };
        let mut a = attrs("get", "", "", "", "");
        a.resource_request = false;
        a.path = "/apis/apps/v1".into();
        assert!(rule_allows(&nr, &a));
        a.path = "/metrics".into();
        assert!(!rule_allows(&nr, &a));
    }
}
