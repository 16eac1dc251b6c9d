//! ClusterRole aggregation (upstream `clusterrole-aggregation` controller's rule): an
//! aggregated ClusterRole's rules are the rules of every other ClusterRole its
//! `aggregationRule` selects, in name order, each rule once. Shared by the controller that
//! keeps them current and by the apiserver's default policy, which is created aggregated.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};

/// The rules `role` aggregates from `all`; `None` when it has no aggregation rule.
pub fn aggregated_rules(role: &ClusterRole, all: &[ClusterRole]) -> Option<Vec<PolicyRule>> {
    let selectors = role.aggregation_rule.as_ref()?.cluster_role_selectors.as_deref()?;
    let name = role.metadata.name.as_deref().unwrap_or_default();
    let no_labels = BTreeMap::new();
    let mut selected: Vec<&ClusterRole> = all
        .iter()
        .filter(|r| r.metadata.name.as_deref().unwrap_or_default() != name)
        .filter(|r| {
            let labels = r.metadata.labels.as_ref().unwrap_or(&no_labels);
            selectors.iter().any(|s| crate::labels::label_selector_matches(s, labels))
        })
        .collect();
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for r in selected {
        for rule in r.rules.iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    Some(rules)
}

/// Aggregate every aggregated role of `roles` until nothing changes (aggregated roles may
/// select each other: `admin` selects `edit`, which selects `view`). Returns whether any
/// role's rules changed.
pub fn aggregate_all(roles: &mut [ClusterRole]) -> bool {
    let mut changed = false;
    // Each round settles at least one more level of a chain; a chain is no longer than the
    // number of roles.
    for _ in 0..=roles.len() {
        let mut round = false;
        for i in 0..roles.len() {
            if let Some(rules) = aggregated_rules(&roles[i], roles)
                && roles[i].rules.as_ref() != Some(&rules)
            {
                roles[i].rules = Some(rules);
                round = true;
            }
        }
        if !round {
            break;
        }
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn role(v: serde_json::Value) -> ClusterRole {
        serde_json::from_value(v).expect("cluster role")
    }

    #[test]
    fn chains_settle_in_name_order_without_duplicates() {
        let sel = |l: &str| json!({"clusterRoleSelectors": [{"matchLabels": {l: "true"}}]});
        let rule = |r: &str| json!({"apiGroups": [""], "resources": [r], "verbs": ["get"]});
        let mut roles = vec![
            role(json!({"metadata": {"name": "admin"}, "aggregationRule": sel("to-admin")})),
            role(json!({"metadata": {"name": "edit", "labels": {"to-admin": "true"}},
                        "aggregationRule": sel("to-edit")})),
            role(json!({"metadata": {"name": "z-extra", "labels": {"to-edit": "true"}},
                        "rules": [rule("secrets"), rule("pods")]})),
            role(json!({"metadata": {"name": "a-extra", "labels": {"to-edit": "true"}},
                        "rules": [rule("pods")]})),
            role(json!({"metadata": {"name": "other"}, "rules": [rule("nodes")]})),
        ];
        assert!(aggregate_all(&mut roles));
        let names = |r: &ClusterRole| -> Vec<String> {
            r.rules.iter().flatten().flat_map(|r| r.resources.clone().unwrap_or_default()).collect()
        };
        assert_eq!(names(&roles[1]), ["pods", "secrets"]);
        assert_eq!(names(&roles[0]), ["pods", "secrets"]);
        assert!(!aggregate_all(&mut roles), "settled");
        assert_eq!(aggregated_rules(&roles[4], &roles), None);
    }
}
