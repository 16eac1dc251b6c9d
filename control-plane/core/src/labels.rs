//! Selector matching shared by every component: label selectors (matchLabels and
//! matchExpressions), node selector terms (matchExpressions incl. Gt/Lt, matchFields on
//! metadata.name) and taint tolerations, as upstream's `labels`, `nodeaffinity` and
//! `v1helper` packages.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub type Labels = BTreeMap<String, String>;

static EMPTY: Labels = BTreeMap::new();

pub fn labels_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &Labels {
    meta.labels.as_ref().unwrap_or(&EMPTY)
}

/// Whether a label selector selects the given labels, as `metav1.LabelSelectorAsSelector`
/// (matchLabels and matchExpressions; an empty selector selects everything).
pub fn label_selector_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    let ml_ok = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    ml_ok
        && sel.match_expressions.iter().flatten().all(|req| {
            let values = req.values.as_deref().unwrap_or_default();
            let have = labels.get(&req.key);
            match req.operator.as_str() {
                "In" => have.is_some_and(|h| values.contains(h)),
                "NotIn" => have.is_none_or(|h| !values.contains(h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
}

/// Whether a selector has no requirements at all.
pub fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty())
}

/// A metav1 LabelSelector against labels. An empty selector matches everything; as in
/// upstream's pod affinity, `None` matches nothing.
pub fn selector_matches(selector: Option<&LabelSelector>, labels: &Labels) -> bool {
    selector.is_some_and(|sel| label_selector_matches(sel, labels))
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value, values.first()) else { return false };
            let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else { return false };
            if req.operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// One node selector term: all its requirements hold. An empty term matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, node_name: &str, labels: &Labels) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let name = node_name.to_string();
    exprs.iter().all(|r| requirement_matches(r, labels.get(&r.key)))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&name)))
}

/// Node selector terms are ORed.
pub fn terms_match(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = labels_of(&node.metadata);
    terms.iter().any(|t| term_matches(t, name, labels))
}

/// Whether a toleration tolerates a taint (upstream `Toleration.ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
                && !key.is_empty()
        }
        _ => false,
    }
}

pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selectors() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]
        }))
        .unwrap();
        assert!(selector_matches(Some(&sel), &labels(&[("app", "web")])));
        assert!(!selector_matches(Some(&sel), &labels(&[("app", "web"), ("tier", "db")])));
        assert!(!selector_matches(Some(&sel), &labels(&[("app", "db")])));
        assert!(selector_matches(Some(&LabelSelector::default()), &labels(&[])));
        assert!(!selector_matches(None, &labels(&[])));
    }

    #[test]
    fn node_selector_terms() {
        let term: NodeSelectorTerm = serde_json::from_value(json!({
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "cores", "operator": "Gt", "values": ["4"]}
            ]
        }))
        .unwrap();
        assert!(term_matches(&term, "n", &labels(&[("zone", "a"), ("cores", "8")])));
        assert!(!term_matches(&term, "n", &labels(&[("zone", "a"), ("cores", "4")])));
        assert!(!term_matches(&term, "n", &labels(&[("zone", "c"), ("cores", "8")])));
        let by_name: NodeSelectorTerm = serde_json::from_value(json!({
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
        }))
        .unwrap();
        assert!(term_matches(&by_name, "n1", &labels(&[])));
        assert!(!term_matches(&by_name, "n2", &labels(&[])));
        assert!(!term_matches(&NodeSelectorTerm::default(), "n1", &labels(&[])));
    }

    #[test]
    fn tolerations() {
        let taint = Taint {
            key: "gpu".into(),
            value: Some("yes".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let eq: Toleration =
            serde_json::from_value(json!({"key": "gpu", "value": "yes", "effect": "NoSchedule"}))
                .unwrap();
        let exists: Toleration = serde_json::from_value(json!({"operator": "Exists"})).unwrap();
        let wrong_effect: Toleration = serde_json::from_value(
            json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}),
        )
        .unwrap();
        let wrong_value: Toleration =
            serde_json::from_value(json!({"key": "gpu", "value": "no"})).unwrap();
        assert!(tolerates(&eq, &taint));
        assert!(tolerates(&exists, &taint));
        assert!(!tolerates(&wrong_effect, &taint));
        assert!(!tolerates(&wrong_value, &taint));
    }
}
