//! Field sets in upstream's `FieldsV1` encoding (sigs.k8s.io/structured-merge-diff
//! `fieldpath.Set`): a tree whose keys are path elements (`f:<field>`,
//! `k:{"key":value,...}`, `v:<json>`, `i:<index>`) and whose nodes are members of the set
//! when they are empty (`{}`) or carry a `"."` entry.
//!
//! The set is kept in that encoding (a JSON object tree) so that reading and writing
//! `metadata.managedFields` costs no conversion.

use serde_json::{Map, Value};

const MEMBER: &str = ".";

/// A set of field paths. The root itself is never a member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSet(pub(crate) Map<String, Value>);

/// One node of a set under construction: whether the path is a member, and its children.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub member: bool,
    pub children: Map<String, Value>,
}

impl Node {
    /// The node in `FieldsV1` form, `None` when it is neither a member nor has children.
    pub fn into_value(self) -> Option<Value> {
        let Node { member, mut children } = self;
        if children.is_empty() {
            return member.then(|| Value::Object(Map::new()));
        }
        if member {
            children.insert(MEMBER.to_string(), Value::Object(Map::new()));
        }
        Some(Value::Object(children))
    }

    pub fn insert_child(&mut self, key: String, child: Node) {
        if let Some(v) = child.into_value() {
            self.children.insert(key, v);
        }
    }
}

fn is_member(node: &Map<String, Value>) -> bool {
    node.is_empty() || node.contains_key(MEMBER)
}

fn node_map(v: &Value) -> Option<&Map<String, Value>> {
    v.as_object()
}

impl FieldSet {
    pub fn new() -> Self {
        FieldSet(Map::new())
    }

    /// Read a `fieldsV1` value; `None` when it is not an object tree of objects.
    pub fn from_fields_v1(v: Value) -> Option<FieldSet> {
        fn valid(m: &Map<String, Value>) -> bool {
            m.iter().all(|(k, v)| match v {
                Value::Object(c) => k == MEMBER && c.is_empty() || k != MEMBER && valid(c),
                _ => false,
            })
        }
        match v {
            Value::Object(m) if valid(&m) => Some(FieldSet(m)),
            _ => None,
        }
    }

    pub fn into_fields_v1(self) -> Value {
        Value::Object(self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// self ∪= other
    pub fn union(&mut self, other: &FieldSet) {
        union_children(&mut self.0, &other.0);
    }

    /// self −= other
    pub fn difference(&mut self, other: &FieldSet) {
        difference_children(&mut self.0, &other.0);
    }

    /// self ∩ other
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(intersection_children(&self.0, &other.0))
    }

    /// Whether the path (a sequence of encoded path elements) is a member.
    pub fn has(&self, path: &[&str]) -> bool {
        let mut children = &self.0;
        for (i, pe) in path.iter().enumerate() {
            let Some(node) = children.get(*pe).and_then(node_map) else { return false };
            if i + 1 == path.len() {
                return is_member(node);
            }
            children = node;
        }
        false
    }

    /// Every member path, depth first in key order.
    pub fn member_paths(&self) -> Vec<Vec<String>> {
        fn walk(
            children: &Map<String, Value>,
            prefix: &mut Vec<String>,
            out: &mut Vec<Vec<String>>,
        ) {
            for (k, v) in children {
                if k == MEMBER {
                    continue;
                }
                let Some(node) = node_map(v) else { continue };
                prefix.push(k.clone());
                if is_member(node) {
                    out.push(prefix.clone());
                }
                walk(node, prefix, out);
                prefix.pop();
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &mut Vec::new(), &mut out);
        out
    }

    /// Make every named field (`f:`) that has children a member too (upstream
    /// `EnsureNamedFieldsAreMembers`, without the schema: map entries are members of
    /// computed sets already).
    pub fn ensure_named_fields_are_members(&mut self) {
        fn walk(children: &mut Map<String, Value>) {
            for (k, v) in children.iter_mut() {
                let Value::Object(node) = v else { continue };
                if k.starts_with("f:") && !node.is_empty() && !node.contains_key(MEMBER) {
                    node.insert(MEMBER.to_string(), Value::Object(Map::new()));
                }
                walk(node);
            }
        }
        walk(&mut self.0);
    }
}

fn union_children(dst: &mut Map<String, Value>, src: &Map<String, Value>) {
    for (k, sv) in src {
        if k == MEMBER {
            continue;
        }
        let Some(s) = node_map(sv) else { continue };
        match dst.get_mut(k) {
            None => {
                dst.insert(k.clone(), sv.clone());
            }
            Some(Value::Object(d)) => {
                let member = is_member(d) || is_member(s);
                d.remove(MEMBER);
                union_children(d, s);
                if member && !d.is_empty() {
                    d.insert(MEMBER.to_string(), Value::Object(Map::new()));
                }
            }
            Some(other) => *other = sv.clone(),
        }
    }
}

fn difference_children(dst: &mut Map<String, Value>, src: &Map<String, Value>) {
    for (k, sv) in src {
        if k == MEMBER {
            continue;
        }
        let Some(s) = node_map(sv) else { continue };
        let Some(Value::Object(d)) = dst.get_mut(k) else { continue };
        let member = is_member(d) && !is_member(s);
        d.remove(MEMBER);
        difference_children(d, s);
        if d.is_empty() {
            if !member {
                dst.remove(k);
            }
        } else if member {
            d.insert(MEMBER.to_string(), Value::Object(Map::new()));
        }
    }
}

fn intersection_children(a: &Map<String, Value>, b: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, av) in a {
        if k == MEMBER {
            continue;
        }
        let (Some(an), Some(bn)) = (node_map(av), b.get(k).and_then(node_map)) else { continue };
        let node = Node {
            member: is_member(an) && is_member(bn),
            children: intersection_children(an, bn),
        };
        if let Some(v) = node.into_value() {
            out.insert(k.clone(), v);
        }
    }
    out
}

/// Render a path of encoded elements as upstream's `fieldpath.Path.String()`:
/// `.spec.template.spec.containers[name="nginx"].image`.
pub fn path_string(path: &[String]) -> String {
    let mut out = String::new();
    for pe in path {
        if let Some(name) = pe.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = pe.strip_prefix("k:") {
            match serde_json::from_str::<Map<String, Value>>(key) {
                Ok(fields) => {
                    out.push('[');
                    for (i, (name, value)) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(name);
                        out.push('=');
                        out.push_str(&value.to_string());
                    }
                    out.push(']');
                }
                Err(_) => {
                    out.push('[');
                    out.push_str(key);
                    out.push(']');
                }
            }
        } else if let Some(value) = pe.strip_prefix("v:") {
            out.push_str("[=");
            out.push_str(value);
            out.push(']');
        } else if let Some(index) = pe.strip_prefix("i:") {
            out.push('[');
            out.push_str(index);
            out.push(']');
        } else {
            out.push_str(pe);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set(v: Value) -> FieldSet {
        FieldSet::from_fields_v1(v).expect("valid set")
    }

    #[test]
    fn union_difference_intersection_keep_membership() {
        let mut a = set(json!({"f:spec": {"f:replicas": {}, "f:paused": {}}}));
        let b = set(
            json!({"f:spec": {"f:replicas": {}, "f:minReadySeconds": {}}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}}),
        );
        a.union(&b);
        assert_eq!(
            a.clone().into_fields_v1(),
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}, "f:minReadySeconds": {}}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}})
        );
        assert!(a.has(&["f:metadata", "f:labels"]));
        assert!(!a.has(&["f:spec"]));
        let i = a.intersection(&set(
            json!({"f:spec": {"f:replicas": {}}, "f:metadata": {"f:labels": {}}}),
        ));
        assert_eq!(
            i.into_fields_v1(),
            json!({"f:spec": {"f:replicas": {}}, "f:metadata": {"f:labels": {}}})
        );
        a.difference(&set(json!({"f:spec": {"f:replicas": {}, "f:paused": {}, "f:minReadySeconds": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})));
        assert_eq!(a.into_fields_v1(), json!({"f:metadata": {"f:labels": {}}}));
    }

    #[test]
    fn invalid_fields_v1_is_rejected() {
        assert!(FieldSet::from_fields_v1(json!({"f:a": 1})).is_none());
        assert!(FieldSet::from_fields_v1(json!([])).is_none());
        assert!(FieldSet::from_fields_v1(json!({"f:a": {".": {"x": {}}}})).is_none());
    }

    #[test]
    fn paths_render_like_upstream() {
        let p: Vec<String> = [
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            r#"k:{"name":"nginx"}"#,
            "f:ports",
            r#"k:{"containerPort":80,"protocol":"TCP"}"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            path_string(&p),
            r#".spec.template.spec.containers[name="nginx"].ports[containerPort=80,protocol="TCP"]"#
        );
        assert_eq!(
            path_string(&["f:metadata".into(), "f:finalizers".into(), r#"v:"a""#.into()]),
            r#".metadata.finalizers[="a"]"#
        );
    }
}
