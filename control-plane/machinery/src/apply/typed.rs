//! Schema-guided walks over objects for managed fields (structured-merge-diff's `typed`
//! package): the field set of an object, the comparison of two objects, the merge of an
//! applied configuration into a live object, and the removal of a set of fields.
//!
//! Structure comes from the OpenAPI schema: `x-kubernetes-list-type` map/set/atomic with
//! `x-kubernetes-list-map-keys` (falling back to the patch strategy and merge key like
//! upstream's schema conversion), `x-kubernetes-map-type: atomic`, structs (properties)
//! and maps (additionalProperties). Values without schema are granular maps and atomic
//! lists.

use serde_json::{Map, Value};

use super::fieldpath::{FieldSet, Node};
use crate::schema::FieldSchema;

pub(crate) type Schema<'a> = Option<FieldSchema<'a>>;

/// Where and why a value does not fit its schema; the path is built while unwinding so
/// that successful walks never format it.
#[derive(Debug)]
pub(crate) struct WalkError {
    path: String,
    message: String,
}

impl WalkError {
    fn new(message: String) -> Self {
        WalkError { path: String::new(), message }
    }

    fn under_field(mut self, name: &str) -> Self {
        self.path.insert_str(0, name);
        self.path.insert(0, '.');
        self
    }

    fn under_item(mut self, index: usize) -> Self {
        self.path.insert_str(0, &format!("[{index}]"));
        self
    }
}

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// What a value is, as far as field ownership goes.
#[derive(Clone, Copy)]
enum Shape<'a> {
    /// A scalar or an atomic list/map: one leaf.
    Leaf,
    /// An object with declared properties: entries are named fields.
    Struct(FieldSchema<'a>),
    /// An object with free keys: every entry is a member.
    Map(Schema<'a>),
    /// A list whose items are identified by key fields.
    ListMap(FieldSchema<'a>),
    /// A list whose items are identified by value.
    ListSet,
}

fn explicit_ext<'a>(s: &FieldSchema<'a>, name: &str) -> Option<&'a Value> {
    s.raw().get(name).or_else(|| s.resolved().get(name))
}

fn shape<'a>(schema: Schema<'a>, v: &Value) -> Shape<'a> {
    match v {
        Value::Object(_) => {
            let Some(s) = schema else { return Shape::Map(None) };
            if s.map_type() == "atomic" {
                Shape::Leaf
            } else if s.properties().is_some() {
                Shape::Struct(s)
            } else if s.is_map() {
                Shape::Map(s.map_values())
            } else if s.preserves_unknown() {
                Shape::Map(None)
            } else {
                Shape::Leaf
            }
        }
        Value::Array(_) => {
            let Some(s) = schema else { return Shape::Leaf };
            match explicit_ext(&s, "x-kubernetes-list-type").and_then(Value::as_str) {
                Some("map") if !s.list_map_keys().is_empty() => Shape::ListMap(s),
                Some("set") => Shape::ListSet,
                Some(_) => Shape::Leaf,
                None => {
                    if s.patch_strategies().contains(&"merge") {
                        if s.patch_merge_key().is_some() {
                            Shape::ListMap(s)
                        } else {
                            Shape::ListSet
                        }
                    } else {
                        Shape::Leaf
                    }
                }
            }
        }
        _ => Shape::Leaf,
    }
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Object(_) | Value::Array(_))
}

fn is_empty_container(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(l)) => l.is_empty(),
        Some(_) => false,
    }
}

/// The key fields of a list-map, sorted by name as upstream's `KeyByFields`.
fn list_map_keys<'a>(s: &FieldSchema<'a>) -> Vec<&'a str> {
    let mut keys = s.list_map_keys();
    if keys.is_empty()
        && let Some(k) = s.patch_merge_key()
    {
        keys.push(k);
    }
    keys.sort_unstable();
    keys
}

/// The default of a list-map key field: the schema's `default`, else upstream's `TCP` for
/// the `protocol` keys of ports (which upstream's OpenAPI declares as the default).
fn key_default(item_schema: Schema, name: &str) -> Option<Value> {
    let declared = item_schema
        .and_then(|i| i.property(name))
        .and_then(|p| p.raw().get("default").or_else(|| p.resolved().get("default")));
    match declared {
        Some(d) => Some(d.clone()),
        None if name == "protocol" => Some(Value::String("TCP".into())),
        None => None,
    }
}

/// The path element of a list item (`k:{...}` or `v:...`), or why there is none.
fn item_path_element(list: Shape, item: &Value) -> Result<String, String> {
    match list {
        Shape::ListMap(s) => {
            let Value::Object(fields) = item else {
                return Err("associative list with keys has an element that is not a map".into());
            };
            // `k:` and the key fields as a JSON object, written as serde_json writes a map
            // (names in order, no spaces) without building one.
            let mut keys = list_map_keys(&s);
            keys.dedup();
            let mut out = b"k:{".to_vec();
            for (i, name) in keys.into_iter().enumerate() {
                let default;
                let value = match fields.get(name) {
                    Some(v) if !v.is_null() => v,
                    _ => match key_default(s.items(), name) {
                        Some(d) => {
                            default = d;
                            &default
                        }
                        None => {
                            return Err(format!(
                                "associative list with keys has an element that omits key field {name:?} (and doesn't have default value)"
                            ));
                        }
                    },
                };
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut out, name).expect("writing into a Vec");
                out.push(b':');
                serde_json::to_writer(&mut out, value).expect("writing into a Vec");
            }
            out.push(b'}');
            Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
        }
        Shape::ListSet => match item {
            Value::Object(_) | Value::Array(_) => {
                Err("associative list without keys has an element that is a non-scalar".into())
            }
            scalar => Ok(format!("v:{scalar}")),
        },
        _ => Err("not an associative list".into()),
    }
}

/// Which entries of an object are left out of field sets: upstream's stripped metadata
/// and the reset fields of the main resource (status) or of the status subresource (spec).
#[derive(Clone, Copy)]
pub(crate) enum Filter {
    None,
    Root { status: bool },
    Metadata,
}

const IGNORED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "clusterName",
    "generation",
    "managedFields",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

impl Filter {
    pub fn root(subresource: Option<&str>) -> Self {
        Filter::Root { status: subresource == Some("status") }
    }

    fn skips(self, key: &str) -> bool {
        match self {
            Filter::None => false,
            Filter::Root { status } => {
                key == "apiVersion"
                    || key == "kind"
                    || if status { key == "spec" } else { key == "status" }
            }
            Filter::Metadata => IGNORED_METADATA.contains(&key),
        }
    }

    fn child(self, key: &str) -> Self {
        match self {
            Filter::Root { .. } if key == "metadata" => Filter::Metadata,
            _ => Filter::None,
        }
    }
}

fn child_schema<'a>(s: &FieldSchema<'a>, key: &str) -> (Schema<'a>, bool) {
    match s.property(key) {
        Some(p) => (Some(p), true),
        None => (s.map_values(), false),
    }
}

// ---------------------------------------------------------------------------------------
// Field set of a value (upstream `ToFieldSet`), used for applied configurations.

pub(crate) fn to_field_set(
    v: &Value,
    schema: Schema,
    filter: Filter,
) -> Result<FieldSet, WalkError> {
    let mut root = Node::default();
    fields_of(v, schema, filter, &mut root)?;
    Ok(FieldSet(root.children))
}

fn fields_of(v: &Value, schema: Schema, filter: Filter, node: &mut Node) -> Result<(), WalkError> {
    let sh = shape(schema, v);
    match (sh, v) {
        (Shape::Struct(_) | Shape::Map(_), Value::Object(m)) => {
            for (k, cv) in m {
                if filter.skips(k) {
                    continue;
                }
                if is_scalar(cv) {
                    node.children.insert(field_key(k), Value::Object(Map::new()));
                    continue;
                }
                let (cs, declared) = match sh {
                    Shape::Struct(s) => child_schema(&s, k),
                    Shape::Map(vs) => (vs, false),
                    _ => (None, false),
                };
                let mut child = Node::default();
                fields_of(cv, cs, filter.child(k), &mut child).map_err(|e| e.under_field(k))?;
                let leaf = matches!(shape(cs, cv), Shape::Leaf);
                child.member |=
                    leaf || !declared || (cv.is_object() && is_empty_container(Some(cv)));
                node.insert_child(field_key(k), child);
            }
        }
        (Shape::ListMap(s), Value::Array(items)) => {
            let item_schema = s.items();
            for (i, item) in items.iter().enumerate() {
                let pe = item_path_element(sh, item)
                    .map_err(|e| WalkError::new(format!("element {i}: {e}")))?;
                let mut child = Node { member: true, ..Node::default() };
                fields_of(item, item_schema, Filter::None, &mut child)
                    .map_err(|e| e.under_item(i))?;
                child.member = true;
                node.insert_child(pe, child);
            }
        }
        (Shape::ListSet, Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let pe = item_path_element(sh, item)
                    .map_err(|e| WalkError::new(format!("element {i}: {e}")))?;
                node.insert_child(pe, Node { member: true, ..Node::default() });
            }
        }
        _ => {}
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Comparison of two values (upstream `TypedValue.Compare`).

/// Fields added, modified and removed from `old` to `new`.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

#[derive(Default)]
struct Diff {
    added: Node,
    modified: Node,
    removed: Node,
}

/// Compare `old` with `new`. When `old` is `None` the object is being created: like
/// upstream (which compares against the zero object of the kind) fields that the zero
/// object always carries (non-pointer structs, marked by a schema `default`, and required
/// fields) are not themselves members of the added set, only what is under them.
pub(crate) fn compare(
    old: Option<&Value>,
    new: &Value,
    schema: Schema,
    filter: Filter,
) -> Comparison {
    let Some(old) = old else {
        let added = added_node(new, schema, filter, true);
        return Comparison { added: FieldSet(added.children), ..Comparison::default() };
    };
    let mut diff = Diff::default();
    diff_children(Some(old), Some(new), schema, filter, false, &mut diff);
    Comparison {
        added: FieldSet(diff.added.children),
        modified: FieldSet(diff.modified.children),
        removed: FieldSet(diff.removed.children),
    }
}

fn diff_leaf(l: Option<&Value>, r: Option<&Value>, d: &mut Diff) {
    match (l, r) {
        (None, Some(_)) => d.added.member = true,
        (Some(_), None) => d.removed.member = true,
        (Some(a), Some(b)) if !same_value(a, b) => d.modified.member = true,
        _ => {}
    }
}

/// Equal as values: numbers by value (`0` and `0.0` are the same number, as they are to
/// upstream's comparison of the decoded values; a typed round trip writes a float field's
/// `0` as `0.0`), anything else as JSON.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same_value(a, b)))
        }
        _ => a == b,
    }
}

/// Compare one node; `zero` says the node is part of the kind's zero object on create.
fn diff_node(
    l: Option<&Value>,
    r: Option<&Value>,
    schema: Schema,
    filter: Filter,
    zero: bool,
    d: &mut Diff,
) {
    let l = l.filter(|v| !(zero && v.is_null()));
    if let (None, Some(r)) = (l, r) {
        d.added = added_node(r, schema, filter, zero);
        return;
    }
    if l == r {
        return;
    }
    let probe = r.or(l).unwrap_or(&Value::Null);
    let sh = shape(schema, probe);
    let same_kind = match (l, r) {
        (Some(a), Some(b)) => {
            std::mem::discriminant(a) == std::mem::discriminant(b) || a.is_null() || b.is_null()
        }
        _ => true,
    };
    if matches!(sh, Shape::Leaf) || !same_kind {
        diff_leaf(l, r, d);
        return;
    }
    if is_empty_container(l) && is_empty_container(r) {
        if zero && l.is_none() {
            return;
        }
        diff_leaf(l, r, d);
        return;
    }
    diff_children(l, r, schema, filter, zero, d);
    if !zero {
        match (l, r) {
            (None, Some(_)) => d.added.member = true,
            (Some(_), None) => d.removed.member = true,
            _ => {}
        }
    }
}

fn diff_children(
    l: Option<&Value>,
    r: Option<&Value>,
    schema: Schema,
    filter: Filter,
    create: bool,
    d: &mut Diff,
) {
    let probe = r.or(l).unwrap_or(&Value::Null);
    let sh = shape(schema, probe);
    match sh {
        Shape::Struct(_) | Shape::Map(_) => {
            let empty = Map::new();
            let lm = l.and_then(Value::as_object).unwrap_or(&empty);
            let rm = r.and_then(Value::as_object).unwrap_or(&empty);
            let mut visit = |k: &String, lc: Option<&Value>, rc: Option<&Value>| {
                if filter.skips(k) || lc == rc {
                    return;
                }
                if lc.is_none_or(is_scalar) && rc.is_none_or(is_scalar) {
                    let mut cd = Diff::default();
                    diff_leaf(lc, rc, &mut cd);
                    insert_diff(d, field_key(k), cd);
                    return;
                }
                let (cs, zero) = match sh {
                    Shape::Struct(s) => {
                        let (cs, _) = child_schema(&s, k);
                        let zero = create && cs.is_some_and(|c| in_zero_object(&s, k, &c));
                        (cs, zero)
                    }
                    Shape::Map(vs) => (vs, false),
                    _ => (None, false),
                };
                let mut cd = Diff::default();
                diff_node(lc, rc, cs, filter.child(k), zero, &mut cd);
                insert_diff(d, field_key(k), cd);
            };
            for (k, lc) in lm {
                visit(k, Some(lc), rm.get(k));
            }
            for (k, rc) in rm {
                if !lm.contains_key(k) {
                    visit(k, None, Some(rc));
                }
            }
        }
        Shape::ListMap(s) => {
            let items = s.items();
            let li = index_items(sh, l);
            let ri = index_items(sh, r);
            for (pe, lc) in &li {
                let rc = ri.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
                let mut cd = Diff::default();
                diff_node(Some(lc), rc, items, Filter::None, false, &mut cd);
                insert_diff(d, pe.clone(), cd);
            }
            for (pe, rc) in &ri {
                if li.iter().any(|(p, _)| p == pe) {
                    continue;
                }
                let mut cd = Diff::default();
                diff_node(None, Some(rc), items, Filter::None, false, &mut cd);
                insert_diff(d, pe.clone(), cd);
            }
        }
        Shape::ListSet => {
            let li = index_items(sh, l);
            let ri = index_items(sh, r);
            for (pe, _) in &li {
                if !ri.iter().any(|(p, _)| p == pe) {
                    d.removed.insert_child(pe.clone(), Node { member: true, ..Node::default() });
                }
            }
            for (pe, _) in &ri {
                if !li.iter().any(|(p, _)| p == pe) {
                    d.added.insert_child(pe.clone(), Node { member: true, ..Node::default() });
                }
            }
        }
        Shape::Leaf => {}
    }
}

/// On create, whether struct field `key` is present in the zero object of the kind:
/// non-pointer structs carry `default: {}` in upstream's OpenAPI v3, non-omitempty fields
/// are required.
fn in_zero_object(parent: &FieldSchema, key: &str, child: &FieldSchema) -> bool {
    child.raw().get("default").is_some_and(Value::is_object)
        || parent
            .resolved()
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|k| k.as_str() == Some(key)))
            && !matches!(child.type_name(), Some("string" | "integer" | "number" | "boolean"))
}

fn insert_diff(d: &mut Diff, key: String, cd: Diff) {
    let nodes = [cd.added.into_value(), cd.modified.into_value(), cd.removed.into_value()];
    let mut left = nodes.iter().filter(|n| n.is_some()).count();
    let mut key = Some(key);
    let sets = [&mut d.added, &mut d.modified, &mut d.removed];
    for (set, node) in sets.into_iter().zip(nodes) {
        let Some(node) = node else { continue };
        left -= 1;
        let k = if left == 0 { key.take() } else { key.clone() };
        set.children.insert(k.unwrap_or_default(), node);
    }
}

fn field_key(name: &str) -> String {
    let mut k = String::with_capacity(name.len() + 2);
    k.push_str("f:");
    k.push_str(name);
    k
}

/// The fields of a subtree that is new (absent before): everything in it is added, and
/// containers are members unless they belong to the zero object on create.
fn added_node(v: &Value, schema: Schema, filter: Filter, zero: bool) -> Node {
    let sh = shape(schema, v);
    if matches!(sh, Shape::Leaf) {
        return Node { member: true, children: Map::new() };
    }
    if is_empty_container(Some(v)) {
        return Node { member: !zero, children: Map::new() };
    }
    let mut node = Node { member: !zero, children: Map::new() };
    match (sh, v) {
        (Shape::Struct(_) | Shape::Map(_), Value::Object(m)) => {
            for (k, cv) in m {
                if filter.skips(k) {
                    continue;
                }
                if is_scalar(cv) {
                    // Leaves need no schema: skip resolving it.
                    node.children.insert(field_key(k), Value::Object(Map::new()));
                    continue;
                }
                let (cs, czero) = match sh {
                    Shape::Struct(s) => {
                        let (cs, _) = child_schema(&s, k);
                        (cs, zero && cs.is_some_and(|c| in_zero_object(&s, k, &c)))
                    }
                    Shape::Map(vs) => (vs, false),
                    _ => (None, false),
                };
                let child = added_node(cv, cs, filter.child(k), czero);
                node.insert_child(field_key(k), child);
            }
        }
        (Shape::ListMap(s), Value::Array(items)) => {
            let item_schema = s.items();
            for item in items {
                let Ok(pe) = item_path_element(sh, item) else { continue };
                if node.children.contains_key(&pe) {
                    continue;
                }
                let child = added_node(item, item_schema, Filter::None, false);
                node.insert_child(pe, child);
            }
        }
        (Shape::ListSet, Value::Array(items)) => {
            for item in items {
                if let Ok(pe) = item_path_element(sh, item) {
                    node.insert_child(pe, Node { member: true, children: Map::new() });
                }
            }
        }
        _ => node.member = true,
    }
    node
}

/// List items by path element, first occurrence winning; items without a valid path
/// element are left out.
fn index_items<'v>(list: Shape, v: Option<&'v Value>) -> Vec<(String, &'v Value)> {
    let Some(Value::Array(items)) = v else { return Vec::new() };
    let mut out: Vec<(String, &Value)> = Vec::with_capacity(items.len());
    for item in items {
        if let Ok(pe) = item_path_element(list, item)
            && !out.iter().any(|(p, _)| *p == pe)
        {
            out.push((pe, item));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Merge of an applied configuration into a live object (upstream `TypedValue.Merge`).

/// Merge `config` into `live`: the configuration's leaves win, maps and structs merge by
/// key, list-maps by key fields, sets by value, atomic values are replaced. Nulls in the
/// configuration remove the value.
pub(crate) fn merge(
    live: Option<&Value>,
    config: &Value,
    schema: Schema,
) -> Result<Option<Value>, WalkError> {
    if config.is_null() {
        return Ok(None);
    }
    let sh = shape(schema, config);
    match (sh, live, config) {
        (Shape::Struct(_) | Shape::Map(_), Some(Value::Object(lm)), Value::Object(cm)) => {
            let mut out = lm.clone();
            for (k, cv) in cm {
                let cs = match sh {
                    Shape::Struct(s) => child_schema(&s, k).0,
                    Shape::Map(vs) => vs,
                    _ => None,
                };
                match merge(lm.get(k), cv, cs).map_err(|e| e.under_field(k))? {
                    Some(v) => {
                        out.insert(k.clone(), v);
                    }
                    None => {
                        out.remove(k);
                    }
                }
            }
            Ok(Some(Value::Object(out)))
        }
        (Shape::Struct(_) | Shape::Map(_), _, Value::Object(cm)) => {
            let mut out = Map::new();
            for (k, cv) in cm {
                let cs = match sh {
                    Shape::Struct(s) => child_schema(&s, k).0,
                    Shape::Map(vs) => vs,
                    _ => None,
                };
                if let Some(v) = merge(None, cv, cs).map_err(|e| e.under_field(k))? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Value::Object(out)))
        }
        (Shape::ListMap(_) | Shape::ListSet, _, Value::Array(citems)) => {
            let items_schema = match sh {
                Shape::ListMap(s) => s.items(),
                _ => None,
            };
            let mut rhs: Vec<(String, &Value)> = Vec::with_capacity(citems.len());
            for (i, item) in citems.iter().enumerate() {
                let pe = item_path_element(sh, item)
                    .map_err(|e| WalkError::new(format!("element {i}: {e}")))?;
                if rhs.iter().any(|(p, _)| *p == pe) {
                    return Err(WalkError::new(format!("duplicate entries for key {pe}")));
                }
                rhs.push((pe, item));
            }
            let lhs = match live {
                Some(l @ Value::Array(_)) => index_items(sh, Some(l)),
                _ => Vec::new(),
            };
            let merged = merge_list_order(&lhs, &rhs);
            let mut out = Vec::with_capacity(merged.len());
            for (pe, l, r) in merged {
                let v = match r {
                    Some(r) => merge(l, r, items_schema).map_err(|e| {
                        e.under_item(rhs.iter().position(|(p, _)| *p == pe).unwrap_or_default())
                    })?,
                    None => l.cloned(),
                };
                out.extend(v);
            }
            // Items of the live list that have no path element are kept as they are.
            if let Some(Value::Array(litems)) = live {
                for item in litems {
                    if item_path_element(sh, item).is_err() {
                        out.push(item.clone());
                    }
                }
            }
            Ok(Some(Value::Array(out)))
        }
        _ => {
            let mut v = config.clone();
            drop_nulls(&mut v);
            Ok(Some(v))
        }
    }
}

fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(l) => l.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

type Item<'v> = (String, Option<&'v Value>, Option<&'v Value>);

/// The order of a merged list (upstream's merge walker): items shared by both sides follow
/// the configuration's order, live-only items keep their place, new items come where the
/// configuration puts them.
fn merge_list_order<'v>(lhs: &[(String, &'v Value)], rhs: &[(String, &'v Value)]) -> Vec<Item<'v>> {
    let in_rhs = |pe: &str| rhs.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
    let in_lhs = |pe: &str| lhs.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
    let mut shared = rhs.iter().filter(|(p, _)| in_lhs(p).is_some()).map(|(p, _)| p.as_str());
    let mut next_shared = shared.next();
    let mut emitted: Vec<&str> = Vec::new();
    let mut out = Vec::with_capacity(lhs.len() + rhs.len());
    let (mut li, mut ri) = (0, 0);
    while li < lhs.len() || ri < rhs.len() {
        if li < lhs.len() {
            let pe = lhs[li].0.as_str();
            if emitted.contains(&pe) {
                li += 1;
                continue;
            }
            if ri < rhs.len() {
                if pe == rhs[ri].0 {
                    out.push((pe.to_string(), Some(lhs[li].1), Some(rhs[ri].1)));
                    emitted.push(pe);
                    li += 1;
                    ri += 1;
                    next_shared = shared.next();
                    continue;
                }
                if in_rhs(pe).is_some() && next_shared.is_some_and(|n| n != pe) {
                    li += 1;
                    continue;
                }
            }
            if in_rhs(pe).is_none() {
                out.push((pe.to_string(), Some(lhs[li].1), None));
                li += 1;
                continue;
            }
        }
        if ri < rhs.len() {
            let pe = rhs[ri].0.as_str();
            out.push((pe.to_string(), in_lhs(pe), Some(rhs[ri].1)));
            emitted.push(pe);
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.next();
            }
        } else {
            // Only shared live items that were already emitted can remain.
            li += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Removal of fields (upstream `RemoveItems`), used to prune what an applier dropped.

/// Remove from `v` every member path of `set` (with everything under it).
pub(crate) fn remove_items(v: &mut Value, set: &FieldSet, schema: Schema) {
    remove_children(v, &set.0, schema);
}

fn remove_children(v: &mut Value, set: &Map<String, Value>, schema: Schema) {
    let sh = shape(schema, v);
    match (sh, v) {
        (Shape::Struct(_) | Shape::Map(_), Value::Object(m)) => {
            for (pe, node) in set {
                let Some(name) = pe.strip_prefix("f:") else { continue };
                let Some(node) = node.as_object() else { continue };
                if node.is_empty() || node.contains_key(".") {
                    m.remove(name);
                } else if let Some(child) = m.get_mut(name) {
                    let cs = match sh {
                        Shape::Struct(s) => child_schema(&s, name).0,
                        Shape::Map(vs) => vs,
                        _ => None,
                    };
                    remove_children(child, node, cs);
                }
            }
        }
        (Shape::ListMap(_) | Shape::ListSet, Value::Array(items)) => {
            let items_schema = match sh {
                Shape::ListMap(s) => s.items(),
                _ => None,
            };
            items.retain_mut(|item| {
                let Ok(pe) = item_path_element(sh, item) else { return true };
                match set.get(&pe).and_then(Value::as_object) {
                    Some(node) if node.is_empty() || node.contains_key(".") => false,
                    Some(node) => {
                        remove_children(item, node, items_schema);
                        true
                    }
                    None => true,
                }
            });
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::apply::test_schemas::{kind, schemas};
    use crate::schema::Schemas;

    #[test]
    fn numbers_compare_by_value_at_any_depth() {
        assert!(same_value(&json!(0), &json!(0.0)));
        assert!(same_value(&json!([{"min": 1, "s": "a"}]), &json!([{"min": 1.0, "s": "a"}])));
        assert!(!same_value(&json!([{"min": 1}]), &json!([{"min": 1.5}])));
        assert!(!same_value(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(!same_value(&json!("0"), &json!(0)));
    }

    fn keyed_list_schemas() -> Schemas {
        let mut c = BTreeMap::new();
        c.insert(
            "T".to_string(),
            json!({
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"id": {"type": "string"}, "v": {"type": "integer"}}},
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["id"],
                    },
                },
                "x-kubernetes-group-version-kind": [{"group": "g", "version": "v1", "kind": "T"}],
            }),
        );
        Schemas::from_components(c)
    }

    #[test]
    fn list_map_items_need_their_keys() {
        let s = keyed_list_schemas();
        let t = kind(&s, "g", "T");
        let err = to_field_set(&json!({"items": [{"id": "a"}, {"v": 1}]}), Some(t), Filter::None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            ".items: element 1: associative list with keys has an element that omits key field \"id\" (and doesn't have default value)"
        );
        let err = merge(None, &json!({"items": [{"id": "a"}, {"id": "a"}]}), Some(t)).unwrap_err();
        assert_eq!(err.to_string(), ".items: duplicate entries for key k:{\"id\":\"a\"}");
    }

    #[test]
    fn merge_orders_lists_like_upstream() {
        let s = keyed_list_schemas();
        let t = kind(&s, "g", "T");
        let ids = |v: &Value| -> Vec<String> {
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_string())
                .collect()
        };
        let live = json!({"items": [{"id": "a", "v": 1}, {"id": "b"}, {"id": "c"}]});
        let out =
            merge(Some(&live), &json!({"items": [{"id": "c"}, {"id": "a", "v": 2}]}), Some(t))
                .unwrap()
                .unwrap();
        assert_eq!(ids(&out), ["b", "c", "a"]);
        assert_eq!(out["items"][2]["v"], 2);
        let out = merge(Some(&live), &json!({"items": [{"id": "x"}, {"id": "b"}]}), Some(t))
            .unwrap()
            .unwrap();
        assert_eq!(ids(&out), ["a", "x", "b", "c"]);
    }

    #[test]
    fn compare_marks_new_containers_and_scalars() {
        let s = schemas();
        let d = kind(&s, "apps", "Deployment");
        let old = json!({"spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}});
        let new = json!({"spec": {"replicas": 2, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
            "template": {"spec": {"containers": [{"name": "b", "image": "y"}]}}}});
        let c = compare(Some(&old), &new, Some(d), Filter::root(None));
        assert_eq!(
            c.modified.into_fields_v1(),
            json!({"f:spec": {"f:replicas": {}, "f:strategy": {"f:type": {}}}})
        );
        assert_eq!(
            c.added.into_fields_v1(),
            json!({"f:spec": {
                "f:strategy": {"f:rollingUpdate": {".": {}, "f:maxSurge": {}}},
                "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"b\"}": {".": {}, "f:image": {}, "f:name": {}}}}},
            }})
        );
        assert_eq!(
            c.removed.into_fields_v1(),
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
    }

    #[test]
    fn remove_items_drops_members_with_their_subtrees() {
        let s = schemas();
        let d = kind(&s, "apps", "Deployment");
        let mut v = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
            "spec": {"template": {"spec": {"containers": [{"name": "a"}, {"name": "b", "image": "i"}]}}}});
        let set = FieldSet::from_fields_v1(json!({
            "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"y\"": {}}},
            "f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}}, "k:{\"name\":\"b\"}": {"f:image": {}}}}}},
        }))
        .unwrap();
        remove_items(&mut v, &set, Some(d));
        assert_eq!(
            v,
            json!({"metadata": {"labels": {"b": "2"}, "finalizers": ["x"]},
                "spec": {"template": {"spec": {"containers": [{"name": "b"}]}}}})
        );
    }
}
