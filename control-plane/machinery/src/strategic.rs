//! Strategic merge patch, the application side of upstream's
//! `k8s.io/apimachinery/pkg/util/strategicpatch` (`StrategicMergePatch` with
//! `MergeParallelList` and `IgnoreUnmatchedNulls`): merge keys, `$patch` (replace, delete),
//! `$retainKeys`, `$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`, with the
//! patch metadata (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`) read from
//! the OpenAPI schema.
//!
//! Fields the schema does not know are merged like a JSON merge patch: maps recursively,
//! lists and scalars replaced.

use serde_json::{Map, Value};

use super::schema::FieldSchema;

const DIRECTIVE_MARKER: &str = "$patch";
const RETAIN_KEYS_DIRECTIVE: &str = "$retainKeys";
const SET_ELEMENT_ORDER_PREFIX: &str = "$setElementOrder";
const DELETE_FROM_PRIMITIVE_LIST_PREFIX: &str = "$deleteFromPrimitiveList";

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a strategic merge patch could not be applied. Messages follow upstream's
/// `mergepatch` errors; [`Error::is_bad_request`] tells 400 from 422.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid JSON document")]
    BadJsonDoc,
    #[error("lists of lists are not supported")]
    NoListOfLists,
    #[error("invalid patch format of primitive list")]
    BadPatchFormatForPrimitiveList,
    #[error("invalid patch format of retainKeys")]
    BadPatchFormatForRetainKeys,
    #[error("patch content doesn't match retainKeys list")]
    PatchContentNotMatchRetainKeys,
    #[error("invalid patch format of setElementOrder list")]
    BadPatchFormatForSetElementOrderList,
    #[error("The order in patch list:\n{patch}\n doesn't match $setElementOrder list:\n{order}\n")]
    SetElementOrderMismatch { patch: String, order: String },
    #[error("unknown patch type: {directive} in map: {map}")]
    BadPatchType { directive: String, map: String },
    #[error("map: {map} does not contain declared merge key: {key}")]
    NoMergeKey { map: String, key: String },
    #[error("expected a {expected}, but received a {actual}")]
    BadArgType { expected: &'static str, actual: &'static str },
    #[error("cannot merge lists without merge key for field {field:?}")]
    NoMergeKeyInSchema { field: String },
    #[error("merging lists cannot yet be specified in the patch")]
    MergeDirectiveInList,
    #[error("list element types are not identical: {0}")]
    MixedListElements(String),
    #[error("unexpected patch strategies {0:?}")]
    BadPatchStrategies(Vec<String>),
}

impl Error {
    /// True for errors upstream answers with 400 BadRequest (malformed patch documents);
    /// the others are 422 Unprocessable Entity (the patch does not fit the object).
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            Error::BadJsonDoc
                | Error::BadPatchFormatForPrimitiveList
                | Error::BadPatchFormatForRetainKeys
                | Error::BadPatchFormatForSetElementOrderList
        )
    }

    /// The HTTP status code the apiserver answers with.
    pub fn status_code(&self) -> u16 {
        if self.is_bad_request() { 400 } else { 422 }
    }
}

/// Apply a strategic merge patch to `original` (an object) with `schema` the object's
/// type. Neither input is modified.
pub fn apply_patch(original: &Value, patch: &Value, schema: FieldSchema) -> Result<Value> {
    apply_patch_owned(original.clone(), patch.clone(), schema)
}

/// [`apply_patch`] consuming its inputs (no copies).
pub fn apply_patch_owned(original: Value, patch: Value, schema: FieldSchema) -> Result<Value> {
    let Value::Object(patch) = patch else {
        return Err(Error::BadJsonDoc);
    };
    let original = match original {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        other => return Err(bad_arg("map", &other)),
    };
    merge_map(original, patch, Some(schema)).map(Value::Object)
}

type Schema<'a> = Option<FieldSchema<'a>>;

/// The schema of a field of an object type, or of a value of a map type.
fn child_schema<'a>(schema: Schema<'a>, key: &str) -> Schema<'a> {
    let schema = schema?;
    schema.property(key).or_else(|| schema.map_values())
}

/// Patch metadata of one field: the strategy (retainKeys removed) and the merge key.
struct PatchMeta<'a> {
    schema: Schema<'a>,
    strategy: &'a str,
    merge_key: Option<&'a str>,
}

fn patch_meta<'a>(parent: Schema<'a>, key: &str) -> Result<PatchMeta<'a>> {
    let schema = child_schema(parent, key);
    let Some(s) = schema else {
        return Ok(PatchMeta { schema: None, strategy: "", merge_key: None });
    };
    let strategies = s.patch_strategies();
    let strategy = match strategies.as_slice() {
        [] => "",
        ["retainKeys"] => "",
        [one] => one,
        ["retainKeys", other] | [other, "retainKeys"] => other,
        _ => {
            return Err(Error::BadPatchStrategies(
                strategies.iter().map(|s| s.to_string()).collect(),
            ));
        }
    };
    Ok(PatchMeta { schema, strategy, merge_key: s.patch_merge_key() })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "nil",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

fn bad_arg(expected: &'static str, actual: &Value) -> Error {
    Error::BadArgType { expected, actual: type_name(actual) }
}

fn merge_map(
    original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: Schema,
) -> Result<Map<String, Value>> {
    if let Some(directive) = patch.get(DIRECTIVE_MARKER) {
        return handle_directive_in_map(directive.clone(), patch);
    }
    let mut original = original;
    apply_retain_keys(&mut original, &mut patch)?;
    merge_set_element_order_lists(&mut original, &mut patch, schema)?;

    for (key, patch_v) in patch {
        let (key, is_delete_list) = match key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST_PREFIX) {
            Some(rest) => match rest.strip_prefix('/') {
                Some(field) => (field.to_string(), true),
                None => return Err(Error::BadPatchFormatForPrimitiveList),
            },
            None => (key, false),
        };
        if patch_v.is_null() {
            original.remove(&key);
            continue;
        }
        let Some(orig_v) = original.get_mut(&key) else {
            if !is_delete_list {
                insert_patch_value(&mut original, key, patch_v);
            }
            continue;
        };
        match (orig_v, patch_v) {
            (Value::Object(orig_map), Value::Object(patch_map)) => {
                let meta = patch_meta(schema, &key)?;
                let merged = if meta.strategy == "replace" {
                    match remove_directives(Value::Object(patch_map)) {
                        Some(Value::Object(m)) => m,
                        _ => Map::new(),
                    }
                } else {
                    merge_map(std::mem::take(orig_map), patch_map, meta.schema)?
                };
                *orig_map = merged;
            }
            (Value::Array(orig_list), Value::Array(patch_list)) => {
                let meta = patch_meta(schema, &key)?;
                let merged = merge_slice_handler(
                    std::mem::take(orig_list),
                    patch_list,
                    &meta,
                    &key,
                    is_delete_list,
                )?;
                *orig_list = merged;
            }
            (_, patch_v) => {
                if !is_delete_list {
                    insert_patch_value(&mut original, key, patch_v);
                }
            }
        }
    }
    Ok(original)
}

/// Store a patch value that has nothing to merge with: nulls dropped, directives removed.
fn insert_patch_value(original: &mut Map<String, Value>, key: String, mut value: Value) {
    discard_nulls(&mut value);
    match remove_directives(value) {
        Some(v) => {
            original.insert(key, v);
        }
        None => {
            original.remove(&key);
        }
    }
}

fn handle_directive_in_map(
    directive: Value,
    mut patch: Map<String, Value>,
) -> Result<Map<String, Value>> {
    match directive.as_str() {
        Some("replace") => {
            patch.remove(DIRECTIVE_MARKER);
            let mut v = Value::Object(patch);
            discard_nulls(&mut v);
            match remove_directives(v) {
                Some(Value::Object(m)) => Ok(m),
                _ => Ok(Map::new()),
            }
        }
        Some("delete") => Ok(Map::new()),
        _ => Err(Error::BadPatchType {
            directive: directive_string(&directive),
            map: Value::Object(patch).to_string(),
        }),
    }
}

fn directive_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<()> {
    let Some(retain) = patch.remove(RETAIN_KEYS_DIRECTIVE) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(Error::BadPatchFormatForRetainKeys);
    };
    let retained = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    for (k, v) in patch.iter() {
        if v.is_null()
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
            || k.starts_with(SET_ELEMENT_ORDER_PREFIX)
        {
            continue;
        }
        if !retained(k) {
            return Err(Error::PatchContentNotMatchRetainKeys);
        }
    }
    original.retain(|k, _| retained(k));
    Ok(())
}

/// Process `$setElementOrder/<field>` directives together with their lists (upstream's
/// `mergePatchIntoOriginal`); the merged lists are removed from the patch.
fn merge_set_element_order_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    schema: Schema,
) -> Result<()> {
    let keys: Vec<String> =
        patch.keys().filter(|k| k.starts_with(SET_ELEMENT_ORDER_PREFIX)).cloned().collect();
    for key in keys {
        let Some(order) = patch.remove(&key) else { continue };
        let Value::Array(order) = order else {
            return Err(bad_arg("[]interface {}", &order));
        };
        let field = key[SET_ELEMENT_ORDER_PREFIX.len()..]
            .strip_prefix('/')
            .ok_or(Error::BadPatchFormatForSetElementOrderList)?
            .to_string();
        let original_list = match original.remove(&field) {
            Some(Value::Array(l)) => Some(l),
            Some(other) => return Err(bad_arg("[]interface {}", &other)),
            None => None,
        };
        let patch_list = match patch.remove(&field) {
            Some(Value::Array(l)) => Some(l),
            Some(other) => return Err(bad_arg("[]interface {}", &other)),
            None => None,
        };
        let meta = patch_meta(schema, &field)?;
        if let Some(p) = &patch_list {
            validate_patch_with_set_order_list(p, &order, meta.merge_key)?;
        }
        let server_order = original_list.clone().unwrap_or_default();
        let kind = element_kind(&[&server_order, patch_list.as_deref().unwrap_or(&[])])?;
        let merged = match (original_list, patch_list) {
            (Some(o), None) => o,
            (o, Some(p)) => merge_slice_handler(o.unwrap_or_default(), p, &meta, &field, false)?,
            (None, None) => continue,
        };
        let key_of = ItemKey::new(kind, meta.merge_key);
        let order_keys = key_of.keys(&order)?;
        let (patch_items, server_only) = partition(merged, &order_keys, &key_of)?;
        let server_keys = key_of.keys(&server_order)?;
        let normalized =
            normalize_element_order(patch_items, server_only, &order_keys, &server_keys, &key_of)?;
        original.insert(field, Value::Array(normalized));
    }
    Ok(())
}

fn validate_patch_with_set_order_list(
    patch_list: &[Value],
    order: &[Value],
    merge_key: Option<&str>,
) -> Result<()> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let non_delete: Vec<&Value> = match merge_key {
        Some(_) => {
            let mut keep = Vec::with_capacity(patch_list.len());
            for v in patch_list {
                let Value::Object(m) = v else { return Err(bad_arg("map", v)) };
                if m.get(DIRECTIVE_MARKER).and_then(Value::as_str) != Some("delete") {
                    keep.push(v);
                }
            }
            keep
        }
        None => patch_list.iter().collect(),
    };
    let (mut pi, mut oi) = (0, 0);
    while pi < non_delete.len() && oi < order.len() {
        if non_delete[pi].get(DIRECTIVE_MARKER).is_some() {
            pi += 1;
            continue;
        }
        if merge_key_value_equal(non_delete[pi], &order[oi], merge_key)? {
            pi += 1;
        }
        oi += 1;
    }
    if pi < non_delete.len() && oi >= order.len() {
        return Err(Error::SetElementOrderMismatch {
            patch: Value::Array(patch_list.to_vec()).to_string(),
            order: Value::Array(order.to_vec()).to_string(),
        });
    }
    Ok(())
}

fn merge_key_value_equal(left: &Value, right: &Value, merge_key: Option<&str>) -> Result<bool> {
    let Some(key) = merge_key else { return Ok(left == right) };
    let l = merge_key_value(left, key)?;
    let r = merge_key_value(right, key)?;
    Ok(l == r)
}

fn merge_key_value<'v>(item: &'v Value, key: &str) -> Result<&'v Value> {
    let Value::Object(m) = item else { return Err(bad_arg("map", item)) };
    m.get(key).ok_or_else(|| Error::NoMergeKey { map: item.to_string(), key: key.to_string() })
}

fn merge_slice_handler(
    original: Vec<Value>,
    patch: Vec<Value>,
    meta: &PatchMeta,
    field: &str,
    is_delete_list: bool,
) -> Result<Vec<Value>> {
    if meta.strategy == "merge" {
        let items = meta.schema.and_then(|s| s.items());
        merge_slice(original, patch, items, meta.merge_key, field, is_delete_list)
    } else {
        Ok(patch)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Object,
}

/// The one kind of all elements of the given lists (upstream `sliceElementType`).
fn element_kind(lists: &[&[Value]]) -> Result<Option<Kind>> {
    let mut kind = None;
    for list in lists {
        for v in list.iter() {
            let k = match v {
                Value::Null => Kind::Null,
                Value::Bool(_) => Kind::Bool,
                Value::Number(_) => Kind::Number,
                Value::String(_) => Kind::String,
                Value::Object(_) => Kind::Object,
                Value::Array(_) => return Err(Error::NoListOfLists),
            };
            match kind {
                None => kind = Some(k),
                Some(prev) if prev != k => {
                    let all: Vec<Value> = lists.iter().map(|l| Value::Array(l.to_vec())).collect();
                    return Err(Error::MixedListElements(Value::Array(all).to_string()));
                }
                Some(_) => {}
            }
        }
    }
    Ok(kind)
}

/// How list items are identified for ordering: by merge key value for maps, by value for
/// primitives.
struct ItemKey<'a> {
    merge_key: Option<&'a str>,
}

impl<'a> ItemKey<'a> {
    fn new(kind: Option<Kind>, merge_key: Option<&'a str>) -> Self {
        ItemKey { merge_key: if kind == Some(Kind::Object) { merge_key } else { None } }
    }

    fn key<'v>(&self, item: &'v Value) -> Result<&'v Value> {
        match self.merge_key {
            Some(k) => merge_key_value(item, k),
            None => Ok(item),
        }
    }

    fn keys(&self, items: &[Value]) -> Result<Vec<Value>> {
        items.iter().map(|i| self.key(i).cloned()).collect()
    }
}

fn position(order: &[Value], key: &Value) -> Option<usize> {
    order.iter().position(|o| o == key)
}

/// Split `merged` into the items named in `by` (patch items) and the others (server only).
fn partition(
    merged: Vec<Value>,
    by: &[Value],
    key_of: &ItemKey,
) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut in_patch = Vec::with_capacity(merged.len());
    let mut server_only = Vec::with_capacity(merged.len());
    for v in merged {
        if position(by, key_of.key(&v)?).is_some() {
            in_patch.push(v);
        } else {
            server_only.push(v);
        }
    }
    Ok((in_patch, server_only))
}

/// Sort patch items by the patch order and server-only items by the server order, then
/// interleave them keeping the server's relative order where both are known (upstream
/// `normalizeElementOrder` and `mergeSortedSlice`).
fn normalize_element_order(
    patch: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key_of: &ItemKey,
) -> Result<Vec<Value>> {
    let patch = normalize_slice_order(patch, patch_order, key_of)?;
    let server_only = normalize_slice_order(server_only, server_order, key_of)?;
    let mut out = Vec::with_capacity(patch.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch.into_iter().peekable();
    loop {
        match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(left.next()),
            (None, Some(_)) => out.extend(right.next()),
            (Some(l), Some(r)) => {
                let li = position(server_order, key_of.key(l)?);
                let ri = position(server_order, key_of.key(r)?);
                match (li, ri) {
                    (Some(li), Some(ri)) if li < ri => out.extend(left.next()),
                    _ => out.extend(right.next()),
                }
            }
        }
    }
    Ok(out)
}

fn normalize_slice_order(
    items: Vec<Value>,
    order: &[Value],
    key_of: &ItemKey,
) -> Result<Vec<Value>> {
    let mut keyed = Vec::with_capacity(items.len());
    let mut to_delete = Vec::new();
    for v in items {
        if key_of.merge_key.is_some()
            && v.get(DIRECTIVE_MARKER).and_then(Value::as_str) == Some("delete")
        {
            to_delete.push(v);
            continue;
        }
        let pos = position(order, key_of.key(&v)?).unwrap_or(usize::MAX);
        keyed.push((pos, v));
    }
    keyed.sort_by_key(|(pos, _)| *pos);
    let mut out: Vec<Value> = keyed.into_iter().map(|(_, v)| v).collect();
    out.extend(to_delete);
    Ok(out)
}

fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    items: Schema,
    merge_key: Option<&str>,
    field: &str,
    is_delete_list: bool,
) -> Result<Vec<Value>> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let kind = element_kind(&[&original, &patch])?;
    if kind != Some(Kind::Object) {
        if is_delete_list {
            return Ok(original.into_iter().filter(|v| !patch.contains(v)).collect());
        }
        let key_of = ItemKey::new(kind, None);
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch.iter()) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (patch_items, server_only) = partition(merged, &patch, &key_of)?;
        return normalize_element_order(patch_items, server_only, &patch, &original, &key_of);
    }
    let Some(key) = merge_key else {
        return Err(Error::NoMergeKeyInSchema { field: field.to_string() });
    };
    let key_of = ItemKey::new(kind, Some(key));
    let (original, patch) = merge_slice_with_special_elements(original, patch, key)?;
    let patch_keys = key_of.keys(&patch)?;
    let server_keys = key_of.keys(&original)?;
    let merged = merge_slice_without_special_elements(original, patch, key, items)?;
    let (patch_items, server_only) = partition(merged, &patch_keys, &key_of)?;
    normalize_element_order(patch_items, server_only, &patch_keys, &server_keys, &key_of)
}

/// Apply `$patch: delete` / `$patch: replace` list elements; returns the new original and
/// the patch without directive elements.
fn merge_slice_with_special_elements(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    for v in patch {
        let Value::Object(m) = &v else { return Err(bad_arg("map", &v)) };
        match m.get(DIRECTIVE_MARKER) {
            None => plain.push(v),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let target = merge_key_value(&v, merge_key)?;
                    for item in &original {
                        if !item.is_object() {
                            return Err(bad_arg("map", item));
                        }
                    }
                    original.retain(|item| item.get(merge_key) != Some(target));
                }
                Some("replace") => replace = true,
                Some("merge") => return Err(Error::MergeDirectiveInList),
                _ => {
                    return Err(Error::BadPatchType {
                        directive: directive_string(d),
                        map: v.to_string(),
                    });
                }
            },
        }
    }
    if replace { Ok((plain, Vec::new())) } else { Ok((original, plain)) }
}

fn merge_slice_without_special_elements(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
    items: Schema,
) -> Result<Vec<Value>> {
    for v in patch {
        let key_value = merge_key_value(&v, merge_key)?.clone();
        let mut found = None;
        for (i, item) in original.iter().enumerate() {
            let Value::Object(m) = item else { return Err(bad_arg("map", item)) };
            if m.get(merge_key) == Some(&key_value) {
                found = Some(i);
                break;
            }
        }
        let Value::Object(patch_map) = v else { return Err(bad_arg("map", &v)) };
        match found {
            Some(i) => {
                let Value::Object(orig) = std::mem::take(&mut original[i]) else {
                    return Err(Error::BadArgType { expected: "map", actual: "nil" });
                };
                original[i] = Value::Object(merge_map(orig, patch_map, items)?);
            }
            None => {
                let mut v = Value::Object(patch_map);
                discard_nulls(&mut v);
                if let Some(v) = remove_directives(v) {
                    original.push(v);
                }
            }
        }
    }
    Ok(original)
}

/// Drop null map values, recursively.
fn discard_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(discard_nulls);
        }
        Value::Array(l) => l.iter_mut().for_each(discard_nulls),
        _ => {}
    }
}

/// Remove patch directives from a value that is stored as is; `None` when the value
/// itself is a `$patch: delete` map.
fn remove_directives(v: Value) -> Option<Value> {
    match v {
        Value::Object(mut m) => {
            if let Some(d) = m.remove(DIRECTIVE_MARKER)
                && d.as_str() == Some("delete")
            {
                return None;
            }
            m.remove(RETAIN_KEYS_DIRECTIVE);
            m.retain(|k, _| {
                !k.starts_with(SET_ELEMENT_ORDER_PREFIX)
                    && !k.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
            });
            let m =
                m.into_iter().filter_map(|(k, v)| remove_directives(v).map(|v| (k, v))).collect();
            Some(Value::Object(m))
        }
        Value::Array(l) => {
            Some(Value::Array(l.into_iter().filter_map(remove_directives).collect()))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apply::test_schemas::{kind, schemas};

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "default",
                "labels": {"app": "web", "tier": "frontend"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "finalizers": ["a", "b"],
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "nginx",
                                "image": "nginx:1.24",
                                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                                "terminationMessagePath": "/dev/termination-log",
                            },
                            {"name": "sidecar", "image": "busybox", "command": ["sleep", "3600"]},
                        ],
                        "volumes": [{"name": "data", "emptyDir": {}}],
                        "restartPolicy": "Always",
                    },
                },
            },
            "status": {"replicas": 2},
        })
    }

    fn patch(original: &Value, p: Value) -> Result<Value> {
        let s = schemas();
        apply_patch(original, &p, kind(&s, "apps", "Deployment"))
    }

    fn containers(v: &Value) -> &Vec<Value> {
        v["spec"]["template"]["spec"]["containers"].as_array().expect("containers")
    }

    #[test]
    fn kubectl_apply_changes_image_by_merge_key() {
        let d = deployment();
        let out = patch(
            &d,
            json!({
                "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"new\":1}"}},
                "spec": {"template": {"spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}, {"name": "sidecar"}],
                    "containers": [{"image": "nginx:1.25", "name": "nginx"}],
                }}},
            }),
        )
        .expect("patch applies");
        let c = containers(&out);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["image"], "nginx:1.25");
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP"}]),
            "unpatched fields stay"
        );
        assert_eq!(c[0]["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c[1]["name"], "sidecar");
        assert_eq!(
            out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "{\"new\":1}"
        );
        assert_eq!(out["status"], d["status"]);
    }

    #[test]
    fn kubectl_apply_adds_and_removes_containers_in_order() {
        let d = deployment();
        let out = patch(
            &d,
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "init"}, {"name": "nginx"}],
                "containers": [{"name": "init", "image": "alpine"}, {"$patch": "delete", "name": "sidecar"}],
            }}}}),
        )
        .expect("patch applies");
        let names: Vec<&str> =
            containers(&out).iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["init", "nginx"]);
        assert_eq!(containers(&out)[0], json!({"name": "init", "image": "alpine"}));
    }

    #[test]
    fn new_container_without_order_directive_goes_first_like_upstream() {
        // upstream mergeSortedSlice: items unknown to the server order win each comparison.
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "third", "image": "x"}]}}}}),
        )
        .expect("patch applies");
        let names: Vec<&str> =
            containers(&out).iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["third", "nginx", "sidecar"]);
    }

    #[test]
    fn env_and_ports_merge_by_their_keys() {
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "nginx"}, {"name": "sidecar"}],
                "containers": [{
                    "name": "nginx",
                    "$setElementOrder/env": [{"name": "B"}, {"name": "C"}],
                    "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}, {"$patch": "delete", "name": "A"}],
                    "$setElementOrder/ports": [{"containerPort": 80}, {"containerPort": 443}],
                    "ports": [{"containerPort": 443, "protocol": "TCP"}],
                }],
            }}}}),
        )
        .expect("patch applies");
        let c = &containers(&out)[0];
        assert_eq!(c["env"], json!([{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]));
        assert_eq!(
            c["ports"],
            json!([{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443, "protocol": "TCP"}])
        );
    }

    #[test]
    fn labels_null_deletes_and_replicas_change() {
        let out = patch(
            &deployment(),
            json!({"metadata": {"labels": {"tier": null, "app": "web2", "new": "x"}}, "spec": {"replicas": 5}}),
        )
        .expect("patch applies");
        assert_eq!(out["metadata"]["labels"], json!({"app": "web2", "new": "x"}));
        assert_eq!(out["spec"]["replicas"], 5);
    }

    #[test]
    fn retain_keys_on_strategy_clears_rolling_update() {
        let out = patch(
            &deployment(),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"}}}),
        )
        .expect("patch applies");
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn retain_keys_on_volume_switches_source() {
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {"volumes": [
                {"$retainKeys": ["configMap", "name"], "configMap": {"name": "cm"}, "emptyDir": null, "name": "data"}
            ]}}}}),
        )
        .expect("patch applies");
        assert_eq!(
            out["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "data", "configMap": {"name": "cm"}}])
        );
    }

    #[test]
    fn primitive_merge_list_union_delete_and_order() {
        let out = patch(
            &deployment(),
            json!({"metadata": {
                "$setElementOrder/finalizers": ["c", "b"],
                "$deleteFromPrimitiveList/finalizers": ["a"],
                "finalizers": ["c"],
            }}),
        )
        .expect("patch applies");
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "b"]));

        let out =
            patch(&deployment(), json!({"metadata": {"finalizers": ["b", "z"]}})).expect("union");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "z"]));
    }

    #[test]
    fn lists_without_merge_strategy_are_replaced() {
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "command": ["true"]}]}}}}),
        )
        .expect("patch applies");
        assert_eq!(containers(&out)[1]["command"], json!(["true"]));
        assert_eq!(containers(&out)[1]["image"], "busybox");
    }

    #[test]
    fn patch_replace_directives() {
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "x"}, {"$patch": "replace"}]}}}}),
        )
        .expect("list replace");
        assert_eq!(containers(&out), &vec![json!({"name": "only", "image": "x"})]);

        let out = patch(
            &deployment(),
            json!({"spec": {"strategy": {"$patch": "replace", "type": "Recreate"}}}),
        )
        .expect("map replace");
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));

        let out = patch(&deployment(), json!({"spec": {"strategy": {"$patch": "delete"}}}))
            .expect("map delete");
        assert_eq!(out["spec"]["strategy"], json!({}));
    }

    #[test]
    fn unknown_fields_merge_like_json_merge_patch() {
        let mut d = deployment();
        d["spec"]["extra"] = json!({"a": 1, "b": {"c": 2}, "list": [1, 2]});
        let out = patch(&d, json!({"spec": {"extra": {"b": {"d": 3}, "a": null, "list": [3]}}}))
            .expect("patch applies");
        assert_eq!(out["spec"]["extra"], json!({"b": {"c": 2, "d": 3}, "list": [3]}));
    }

    #[test]
    fn new_values_lose_nulls_and_directives() {
        let out = patch(
            &deployment(),
            json!({"spec": {"template": {"spec": {"securityContext": {"runAsUser": 1, "fsGroup": null}}}}}),
        )
        .expect("patch applies");
        assert_eq!(out["spec"]["template"]["spec"]["securityContext"], json!({"runAsUser": 1}));
    }

    #[test]
    fn service_ports_merge_by_port() {
        let s = schemas();
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}], "selector": {"app": "web", "old": "x"}}});
        let out = apply_patch(
            &svc,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}], "selector": {"old": null}}}),
            kind(&s, "", "Service"),
        )
        .expect("patch applies");
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "targetPort": 9090, "protocol": "TCP"}, {"port": 443}])
        );
        assert_eq!(out["spec"]["selector"], json!({"app": "web"}));
    }

    #[test]
    fn bad_patches_are_typed_errors() {
        let d = deployment();
        let e = patch(&d, json!({"spec": {"strategy": {"$patch": "bogus"}}})).unwrap_err();
        assert!(matches!(e, Error::BadPatchType { .. }), "{e}");
        assert_eq!(e.status_code(), 422);

        let e = patch(&d, json!({"spec": {"strategy": {"$retainKeys": "type"}}})).unwrap_err();
        assert!(matches!(e, Error::BadPatchFormatForRetainKeys), "{e}");
        assert_eq!(e.status_code(), 400);

        let e = patch(&d, json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 1}}}}))
            .unwrap_err();
        assert!(matches!(e, Error::PatchContentNotMatchRetainKeys), "{e}");

        let e =
            patch(&d, json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}))
                .unwrap_err();
        assert!(matches!(e, Error::NoMergeKey { .. }), "{e}");

        let e = patch(&d, json!({"metadata": {"finalizers": [["x"]]}})).unwrap_err();
        assert!(matches!(e, Error::NoListOfLists), "{e}");

        let e = patch(&d, json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}))
            .unwrap_err();
        assert!(matches!(e, Error::BadPatchFormatForPrimitiveList), "{e}");

        let e = patch(
            &d,
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "nginx"}],
                "containers": [{"name": "sidecar", "image": "y"}],
            }}}}),
        )
        .unwrap_err();
        assert!(matches!(e, Error::SetElementOrderMismatch { .. }), "{e}");

        let e = patch(&d, json!([1])).unwrap_err();
        assert!(matches!(e, Error::BadJsonDoc));
        assert_eq!(e.status_code(), 400);

        let e = patch(&d, json!({"spec": {"template": {"spec": {"containers": [{"name": "x", "$patch": "merge"}]}}}}))
            .unwrap_err();
        assert!(matches!(e, Error::MergeDirectiveInList), "{e}");
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let mut d = deployment();
        d["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "v1", "kind": "X", "name": "a", "uid": "u1"},
            {"apiVersion": "v1", "kind": "X", "name": "b", "uid": "u2"},
        ]);
        let out = patch(
            &d,
            json!({"metadata": {"ownerReferences": [
                {"uid": "u2", "controller": true},
                {"$patch": "delete", "uid": "u1"},
                {"apiVersion": "v1", "kind": "Y", "name": "c", "uid": "u3"},
            ]}}),
        )
        .expect("patch applies");
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([
                {"apiVersion": "v1", "kind": "X", "name": "b", "uid": "u2", "controller": true},
                {"apiVersion": "v1", "kind": "Y", "name": "c", "uid": "u3"},
            ])
        );
    }

    #[test]
    fn top_level_replace_directive_replaces_object() {
        let out = patch(
            &deployment(),
            json!({"$patch": "replace", "kind": "Deployment", "spec": {"replicas": 1}}),
        )
        .expect("patch applies");
        assert_eq!(out, json!({"kind": "Deployment", "spec": {"replicas": 1}}));
    }

    #[test]
    fn top_level_delete_directive_empties_object() {
        let out = patch(&deployment(), json!({"$patch": "delete"})).expect("patch applies");
        assert_eq!(out, json!({}));
    }
}
