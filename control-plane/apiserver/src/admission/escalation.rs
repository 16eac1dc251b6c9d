//! RBAC escalation prevention, as upstream's policy-based storage of the four RBAC kinds
//! (`pkg/registry/rbac/{role,clusterrole,rolebinding,clusterrolebinding}/policybased`):
//! - a Role or ClusterRole may be created or updated only with rules its author already
//!   holds where it applies, unless the author may `escalate` that role;
//! - setting or changing a ClusterRole's `aggregationRule` (which can gather anything)
//!   needs every permission (cluster-admin);
//! - a RoleBinding or ClusterRoleBinding may be created or updated only to a role whose
//!   rules its author holds, unless the author may `bind` that role.
//!
//! `system:masters` and an AlwaysAllow server skip the checks (upstream's
//! `EscalationAllowed`); so does an update that only changes what the garbage collector
//! writes (owner references, finalizers).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef};
use serde_json::Value;

use super::{AdmissionRequest, Operation, Resource, ValidatingPlugin};
use crate::authz::{Attributes, AuthorizationMode, Authorizer, Decision, RBAC_GROUP};
use crate::state::State;
use crate::status::{ApiError, ApiResult};
use crate::user::UserInfo;
use skiff_core::json::ValueAt;
use skiff_core::names;

/// The validating step that refuses escalating RBAC writes; it asks the apiserver's
/// authorizers (shared with it) whether the user may escalate or bind.
pub struct RbacEscalation {
    pub authz: Arc<Authorizer>,
}

#[async_trait]
impl ValidatingPlugin for RbacEscalation {
    fn name(&self) -> &'static str {
        "RBACEscalation"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
            && resource.group == RBAC_GROUP
            && resource.subresource.is_none()
            && matches!(
                resource.resource,
                "roles" | "clusterroles" | "rolebindings" | "clusterrolebindings"
            )
    }

    fn active(&self, _state: &State, user: &UserInfo) -> bool {
        self.authz.mode != AuthorizationMode::AlwaysAllow && !user.in_group(names::MASTERS)
    }

    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        let Some(obj) = req.object.as_ref() else { return Ok(()) };
        if let Some(old) = req.old_object.as_ref()
            && only_gc_fields_differ(obj, old)
        {
            return Ok(());
        }
        let ns = req.namespace.as_deref().unwrap_or_default();
        match req.resource {
            "roles" | "clusterroles" => check_role(&self.authz, state, req, ns, obj),
            _ => check_binding(&self.authz, state, req, ns, obj),
        }
    }
}

/// Upstream's `IsOnlyMutatingGCFields`: the two objects are the same but for owner
/// references and finalizers (and what the server itself maintains on every write).
fn only_gc_fields_differ(new: &Value, old: &Value) -> bool {
    const IGNORED: [&str; 4] =
        ["ownerReferences", "finalizers", "managedFields", "resourceVersion"];
    let (Some(new), Some(old)) = (new.as_object(), old.as_object()) else { return false };
    let meta = |m: Option<&Value>| -> Vec<(String, Value)> {
        m.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !IGNORED.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let rest = |o: &serde_json::Map<String, Value>| -> Vec<(String, Value)> {
        o.iter().filter(|(k, _)| *k != "metadata").map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    meta(new.get("metadata")) == meta(old.get("metadata")) && rest(new) == rest(old)
}

fn rules_of(obj: &Value) -> ApiResult<Vec<PolicyRule>> {
    match obj.get("rules") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(r) => serde_json::from_value(r.clone())
            .map_err(|e| ApiError::bad_request(format!("decoding the rules: {e}"))),
    }
}

/// Whether the request's user may `verb` the role `name` (of `plural`) in `ns`, by any
/// authorizer of the chain (upstream `RoleEscalationAuthorized` / `BindingAuthorized`).
fn authorized(
    authz: &Authorizer,
    state: &State,
    user: &UserInfo,
    verb: &str,
    plural: &str,
    ns: &str,
    name: &str,
) -> bool {
    let a = Attributes {
        user: user.clone(),
        verb: verb.into(),
        resource_request: true,
        namespace: ns.into(),
        group: RBAC_GROUP.into(),
        version: String::new(),
        resource: plural.into(),
        subresource: String::new(),
        name: name.into(),
        path: String::new(),
        field_selector: String::new(),
    };
    authz.decide(state, &a) == Decision::Allow
}

fn check_role(
    authz: &Authorizer,
    state: &State,
    req: &AdmissionRequest,
    ns: &str,
    obj: &Value,
) -> ApiResult<()> {
    if authorized(authz, state, &req.user, "escalate", req.resource, ns, &req.name) {
        return Ok(());
    }
    confirm_no_escalation(authz, state, req, ns, &rules_of(obj)?)?;
    if req.resource == "clusterroles"
        && (has_aggregation_rule(obj) || req.old_object.as_ref().is_some_and(has_aggregation_rule))
        && confirm_no_escalation(authz, state, req, ns, &[full_authority()]).is_err()
    {
        return Err(req.forbidden("must have cluster-admin privileges to use the aggregationRule"));
    }
    Ok(())
}

fn check_binding(
    authz: &Authorizer,
    state: &State,
    req: &AdmissionRequest,
    ns: &str,
    obj: &Value,
) -> ApiResult<()> {
    let role_ref: RoleRef = obj
        .get("roleRef")
        .cloned()
        .and_then(|r| serde_json::from_value(r).ok())
        .ok_or_else(|| ApiError::bad_request("the binding has no roleRef"))?;
    let plural = match role_ref.kind.as_str() {
        "Role" => "roles",
        "ClusterRole" => "clusterroles",
        other => {
            return Err(ApiError::bad_request(format!("unknown roleRef kind {other:?}")));
        }
    };
    if authorized(authz, state, &req.user, "bind", plural, ns, &role_ref.name) {
        return Ok(());
    }
    let role_ns = if plural == "roles" { ns } else { "" };
    let Some(rules) = authz.rbac.role_rules(state, role_ns, plural, &role_ref.name) else {
        return Err(ApiError::not_found(&format!("{plural}.{RBAC_GROUP}"), &role_ref.name)
            .with_details(RBAC_GROUP, plural, &role_ref.name));
    };
    confirm_no_escalation(authz, state, req, ns, &rules)
}

/// `*` on everything, resources and URLs: what only cluster-admin holds.
fn full_authority() -> PolicyRule {
    PolicyRule {
        verbs: vec!["*".into()],
        api_groups: Some(vec!["*".into()]),
        resources: Some(vec!["*".into()]),
        resource_names: None,
        non_resource_urls: None,
    }
}

/// Upstream's `ConfirmNoEscalation`: the user's rules in `ns` (its ClusterRoleBindings and,
/// in a namespace, its RoleBindings there) must cover `rules`.
fn confirm_no_escalation(
    authz: &Authorizer,
    state: &State,
    req: &AdmissionRequest,
    ns: &str,
    rules: &[PolicyRule],
) -> ApiResult<()> {
    let owner = authz.rbac.rules_of(state, &req.user, ns);
    let missing = uncovered(&owner, rules);
    if missing.is_empty() {
        return Ok(());
    }
    let mut lines: Vec<String> = compact(missing).iter().map(compact_string).collect();
    lines.sort();
    lines.dedup();
    Err(req.forbidden(format!(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        go_quote(&req.user.name),
        go_quote_list(&req.user.groups),
        lines.join("\n")
    )))
}

/// One verb on one group/resource (and at most one name), or one verb on one URL: the
/// simple rules a rule breaks down into (upstream `BreakdownRule`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Simple {
    verb: String,
    group: Option<String>,
    resource: Option<String>,
    name: Option<String>,
    url: Option<String>,
}

fn breakdown(rule: &PolicyRule) -> Vec<Simple> {
    let mut out = Vec::new();
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    let resources = rule.resources.as_deref().unwrap_or_default();
    let names = rule.resource_names.as_deref().unwrap_or_default();
    for group in groups {
        for resource in resources {
            for verb in &rule.verbs {
                let simple = |name: Option<&String>| Simple {
                    verb: verb.clone(),
                    group: Some(group.clone()),
                    resource: Some(resource.clone()),
                    name: name.cloned(),
                    url: None,
                };
                if names.is_empty() {
                    out.push(simple(None));
                } else {
                    out.extend(names.iter().map(|n| simple(Some(n))));
                }
            }
        }
    }
    for url in rule.non_resource_urls.as_deref().unwrap_or_default() {
        for verb in &rule.verbs {
            out.push(Simple {
                verb: verb.clone(),
                group: None,
                resource: None,
                name: None,
                url: Some(url.clone()),
            });
        }
    }
    out
}

/// The simple rules of `servant` that no rule of `owner` covers (upstream `Covers`).
fn uncovered(owner: &[PolicyRule], servant: &[PolicyRule]) -> Vec<Simple> {
    servant.iter().flat_map(breakdown).filter(|s| !owner.iter().any(|o| covers(o, s))).collect()
}

fn has(set: &[String], want: &str) -> bool {
    set.iter().any(|s| s == want)
}

/// Upstream's `ruleCovers` for one simple rule.
fn covers(owner: &PolicyRule, s: &Simple) -> bool {
    if !(has(&owner.verbs, "*") || has(&owner.verbs, &s.verb)) {
        return false;
    }
    let groups = owner.api_groups.as_deref().unwrap_or_default();
    let resources = owner.resources.as_deref().unwrap_or_default();
    let urls = owner.non_resource_urls.as_deref().unwrap_or_default();
    if let Some(g) = &s.group
        && !(has(groups, "*") || has(groups, g))
    {
        return false;
    }
    if let Some(r) = &s.resource
        && !resource_covers(resources, r)
    {
        return false;
    }
    if let Some(u) = &s.url
        && !urls.iter().any(|o| url_covers(o, u))
    {
        return false;
    }
    let owner_names = owner.resource_names.as_deref().unwrap_or_default();
    match &s.name {
        None => owner_names.is_empty(),
        Some(n) => owner_names.is_empty() || has(owner_names, n),
    }
}

/// `*`, the resource itself, or `*/<sub>` for a subresource (upstream `resourceCoversAll`).
fn resource_covers(owner: &[String], resource: &str) -> bool {
    if has(owner, "*") || has(owner, resource) {
        return true;
    }
    match resource.split_once('/') {
        Some((_, sub)) => has(owner, &format!("*/{sub}")),
        None => false,
    }
}

fn url_covers(owner: &str, url: &str) -> bool {
    owner == url || owner.strip_suffix('*').is_some_and(|prefix| url.starts_with(prefix))
}

/// The missing rules as upstream lists them (`CompactRules`): simple resource rules that
/// differ only in their verb are one rule with the verbs in order.
fn compact(missing: Vec<Simple>) -> Vec<PolicyRule> {
    /// Group, resource and name of a resource rule (`None`: a URL rule, never merged).
    type Key = Option<(String, String, Option<String>)>;
    let mut out: Vec<(Key, PolicyRule)> = Vec::new();
    for s in missing {
        let key = match (&s.group, &s.resource) {
            (Some(g), Some(r)) => Some((g.clone(), r.clone(), s.name.clone())),
            _ => None,
        };
        if let Some(k) = &key
            && let Some((_, rule)) = out.iter_mut().find(|(kk, _)| kk.as_ref() == Some(k))
        {
            if !has(&rule.verbs, &s.verb) {
                rule.verbs.push(s.verb);
            }
            continue;
        }
        let rule = PolicyRule {
            verbs: vec![s.verb],
            api_groups: s.group.map(|g| vec![g]),
            resources: s.resource.map(|r| vec![r]),
            resource_names: s.name.map(|n| vec![n]),
            non_resource_urls: s.url.map(|u| vec![u]),
        };
        out.push((key, rule));
    }
    out.into_iter().map(|(_, r)| r).collect()
}

/// Go's `%q` of a string (the characters RBAC names use need no escapes but `"` and `\`).
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quote_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| go_quote(s)).collect();
    format!("[{}]", quoted.join(" "))
}

/// Upstream's `CompactString` of a rule: `{APIGroups:["apps"], Resources:["pods"], Verbs:["get"]}`.
fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    let mut field = |label: &str, v: Option<&Vec<String>>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            parts.push(format!("{label}:{}", go_quote_list(v)));
        }
    };
    field("APIGroups", r.api_groups.as_ref());
    field("Resources", r.resources.as_ref());
    field("NonResourceURLs", r.non_resource_urls.as_ref());
    field("ResourceNames", r.resource_names.as_ref());
    field("Verbs", Some(&r.verbs));
    format!("{{{}}}", parts.join(", "))
}

/// Whether `obj` (a ClusterRole) has an aggregation rule.
fn has_aggregation_rule(obj: &Value) -> bool {
    obj.at(&["aggregationRule"]).is_some_and(|a| !a.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::rbac::tests::rule;

    fn urls(verbs: &[&str], urls: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule { verbs: v(verbs), non_resource_urls: Some(v(urls)), ..Default::default() }
    }

    #[test]
    fn covers_as_upstream() {
        let admin = vec![
            rule(&["get", "list", "create"], &["", "apps"], &["pods", "deployments"], &[]),
            rule(&["*"], &["batch"], &["*/status"], &[]),
            rule(&["get"], &[""], &["secrets"], &["a", "b"]),
            urls(&["get"], &["/healthz", "/apis/*"]),
        ];
        let ok = |r: PolicyRule| uncovered(&admin, &[r]).is_empty();
        assert!(ok(rule(&["get", "create"], &["apps"], &["deployments"], &[])));
        assert!(ok(rule(&["update"], &["batch"], &["jobs/status"], &[])));
        assert!(!ok(rule(&["update"], &["batch"], &["jobs"], &[])));
        assert!(!ok(rule(&["delete"], &[""], &["pods"], &[])));
        // `*` in a servant rule must be held as `*`.
        assert!(!ok(rule(&["*"], &[""], &["pods"], &[])));
        assert!(!ok(rule(&["get"], &["*"], &["pods"], &[])));
        assert!(!ok(rule(&["get"], &[""], &["*"], &[])));
        // Names: a named grant covers only those names; an unnamed rule is not covered by
        // a named one.
        assert!(ok(rule(&["get"], &[""], &["secrets"], &["a"])));
        assert!(!ok(rule(&["get"], &[""], &["secrets"], &["c"])));
        assert!(!ok(rule(&["get"], &[""], &["secrets"], &[])));
        assert!(ok(rule(&["get"], &[""], &["pods"], &["x"])));
        assert!(ok(urls(&["get"], &["/apis/apps/v1"])));
        assert!(!ok(urls(&["get"], &["/metrics"])));
        assert!(!ok(urls(&["post"], &["/healthz"])));
    }

    #[test]
    fn missing_rules_read_as_upstream() {
        let missing = uncovered(
            &[rule(&["get"], &[""], &["pods"], &[])],
            &[
                rule(&["get", "list", "watch"], &["", "apps"], &["pods"], &[]),
                urls(&["get"], &["/x"]),
            ],
        );
        let lines: Vec<String> = compact(missing).iter().map(compact_string).collect();
        assert_eq!(
            lines,
            vec![
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["list" "watch"]}"#,
                r#"{APIGroups:["apps"], Resources:["pods"], Verbs:["get" "list" "watch"]}"#,
                r#"{NonResourceURLs:["/x"], Verbs:["get"]}"#,
            ]
        );
        assert_eq!(go_quote_list(&["a".into(), "b".into()]), r#"["a" "b"]"#);
    }

    #[test]
    fn gc_only_updates_are_recognized() {
        let old =
            serde_json::json!({"metadata": {"name": "r", "resourceVersion": "1"}, "rules": []});
        let mut new = old.clone();
        new["metadata"]["ownerReferences"] = serde_json::json!([{"name": "o"}]);
        new["metadata"]["finalizers"] = serde_json::json!(["f"]);
        new["metadata"]["resourceVersion"] = serde_json::json!("2");
        assert!(only_gc_fields_differ(&new, &old));
        new["metadata"]["labels"] = serde_json::json!({"a": "b"});
        assert!(!only_gc_fields_differ(&new, &old));
        let mut new = old.clone();
        new["rules"] = serde_json::json!([{"verbs": ["*"]}]);
        assert!(!only_gc_fields_differ(&new, &old));
    }
}
