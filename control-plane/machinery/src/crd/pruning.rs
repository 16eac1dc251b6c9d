//! Pruning of unknown fields and defaulting of custom resources (upstream
//! `pkg/apiserver/schema/pruning/algorithm.go`, `pkg/apiserver/schema/defaulting/algorithm.go`
//! and `prunenulls.go`).

use serde_json::Value;

use super::schema::{AdditionalProperties, Structural};

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Removes the fields of `obj` that `schema` does not specify, as upstream prunes a custom
/// resource (`PruneWithOptions` with `isResourceRoot`): `apiVersion`, `kind` and
/// `metadata` of the object and of every `x-kubernetes-embedded-resource` are kept as they
/// are; below `x-kubernetes-preserve-unknown-fields: true` unknown fields are kept (but the
/// fields of nested `properties`/`additionalProperties` schemas are pruned again);
/// `additionalProperties` keeps every key (and prunes the values by its schema;
/// `additionalProperties: true`/`false` keeps the key and prunes everything below it).
///
/// Returns the paths of the removed fields, sorted (byte order, like Go's `sort.Strings`),
/// as upstream's "unknown field" warnings and strict field validation errors name them:
/// `spec.foo`, `spec.items[0].bar`.
pub fn prune(schema: &Structural, obj: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_tree(obj, Some(schema), true, Some(&mut pruned));
    pruned.sort();
    pruned
}

/// Upstream `PruneWithOptions`; `track` collects the removed fields' paths (unsorted).
pub(crate) fn prune_tree(
    x: &mut Value,
    s: Option<&Structural>,
    is_resource_root: bool,
    track: Option<&mut Vec<String>>,
) {
    let mut path = String::new();
    let mut sink = Vec::new();
    let (out, tracking) = match track {
        Some(t) => (t, true),
        None => (&mut sink, false),
    };
    let mut p = Pruner { path: &mut path, out, tracking };
    p.prune(x, s, is_resource_root);
}

struct Pruner<'a> {
    /// The parent path being built (only when tracking, as upstream).
    path: &'a mut String,
    out: &'a mut Vec<String>,
    tracking: bool,
}

impl Pruner<'_> {
    fn push_key(&mut self, k: &str) -> usize {
        let len = self.path.len();
        if self.tracking {
            if !self.path.is_empty() {
                self.path.push('.');
            }
            self.path.push_str(k);
        }
        len
    }

    fn push_index(&mut self, i: usize) -> usize {
        let len = self.path.len();
        if self.tracking {
            self.path.push('[');
            self.path.push_str(itoa::Buffer::new().format(i));
            self.path.push(']');
        }
        len
    }

    fn record(&mut self, k: &str) {
        if self.tracking {
            let len = self.push_key(k);
            self.out.push(self.path.clone());
            self.path.truncate(len);
        }
    }

    /// `embedded` overrides the node's own `x-kubernetes-embedded-resource` (the resource
    /// root).
    fn prune(&mut self, x: &mut Value, s: Option<&Structural>, embedded: bool) {
        if let Some(s) = s
            && s.x_preserve_unknown_fields
        {
            self.skip_prune(x, s, embedded);
            return;
        }
        match x {
            Value::Object(m) => {
                let Some(s) = s else {
                    let keys: Vec<String> = m.keys().cloned().collect();
                    for k in keys {
                        self.record(&k);
                    }
                    m.clear();
                    return;
                };
                let embedded = embedded || s.x_embedded_resource;
                let mut unknown = Vec::new();
                for (k, v) in m.iter_mut() {
                    if embedded && META_FIELDS.contains(&k.as_str()) {
                        continue;
                    }
                    if let Some(prop) = s.properties.get(k) {
                        let len = self.push_key(k);
                        self.prune(v, Some(prop), false);
                        self.path.truncate(len);
                    } else if let Some(ap) = &s.additional_properties {
                        let len = self.push_key(k);
                        self.prune(v, ap.schema(), false);
                        self.path.truncate(len);
                    } else {
                        unknown.push(k.clone());
                    }
                }
                for k in unknown {
                    // Unknown TypeMeta/ObjectMeta names at the very top are dropped silently.
                    if !META_FIELDS.contains(&k.as_str()) || !self.path.is_empty() {
                        self.record(&k);
                    }
                    m.remove(&k);
                }
            }
            Value::Array(a) => {
                let items = s.and_then(|s| s.items.as_deref());
                for (i, v) in a.iter_mut().enumerate() {
                    let len = self.push_index(i);
                    self.prune(v, items, false);
                    self.path.truncate(len);
                }
            }
            _ => {}
        }
    }

    fn skip_prune(&mut self, x: &mut Value, s: &Structural, embedded: bool) {
        match x {
            Value::Object(m) => {
                let embedded = embedded || s.x_embedded_resource;
                for (k, v) in m.iter_mut() {
                    if embedded && META_FIELDS.contains(&k.as_str()) {
                        continue;
                    }
                    let sub = match (s.properties.get(k), &s.additional_properties) {
                        (Some(prop), _) => Some(prop),
                        (None, Some(ap)) => ap.schema(),
                        (None, None) => continue,
                    };
                    let len = self.push_key(k);
                    self.prune(v, sub, false);
                    self.path.truncate(len);
                }
            }
            Value::Array(a) => {
                let Some(items) = s.items.as_deref() else { return };
                for (i, v) in a.iter_mut().enumerate() {
                    let len = self.push_index(i);
                    self.skip_prune(v, items, false);
                    self.path.truncate(len);
                }
            }
            _ => {}
        }
    }
}

fn is_non_nullable_null(x: &Value, s: Option<&Structural>) -> bool {
    x.is_null() && s.is_some_and(|s| !s.nullable)
}

/// Upstream defaulting (`defaulting.Default`): in every object the schema describes, each
/// property with a `default` that is absent, or `null` while not `nullable`, is set to a
/// copy of the default; then objects (properties and `additionalProperties` values) and
/// array items are defaulted recursively, including values that were just defaulted. A
/// `null` map value or list item whose schema is not nullable is replaced by that schema's
/// default (or stays `null` without one). Absent parents are not created (unless they have
/// a default of their own).
///
/// The apiserver runs [`prune_non_nullable_nulls`] first, so that non-nullable nulls without
/// a default are gone and those with one get it here.
pub fn apply_defaults(schema: &Structural, obj: &mut Value) {
    default(obj, Some(schema));
}

fn default(x: &mut Value, s: Option<&Structural>) {
    let Some(s) = s else { return };
    match x {
        Value::Object(m) => {
            for (k, prop) in &s.properties {
                let Some(d) = &prop.default else { continue };
                let missing = m.get(k).is_none_or(|v| is_non_nullable_null(v, Some(prop)));
                if missing {
                    m.insert(k.clone(), d.clone());
                }
            }
            let ap = s.additional_properties.as_ref().map(AdditionalProperties::schema);
            for (k, v) in m.iter_mut() {
                if let Some(prop) = s.properties.get(k) {
                    default(v, Some(prop));
                } else if let Some(ap) = ap {
                    if is_non_nullable_null(v, ap) {
                        *v = ap.and_then(|a| a.default.clone()).unwrap_or(Value::Null);
                    }
                    default(v, ap);
                }
            }
        }
        Value::Array(a) => {
            let items = s.items.as_deref();
            for v in a.iter_mut() {
                if is_non_nullable_null(v, items) {
                    *v = items.and_then(|i| i.default.clone()).unwrap_or(Value::Null);
                }
                default(v, items);
            }
        }
        _ => {}
    }
}

/// Upstream `PruneNonNullableNullsWithoutDefaults`, run before [`apply_defaults`]: removes
/// object fields whose value is `null` while their schema (property or
/// `additionalProperties`) is not nullable and has no default. List items are left alone.
pub fn prune_non_nullable_nulls(schema: &Structural, obj: &mut Value) {
    prune_nulls(obj, Some(schema));
}

fn field_schema<'a>(s: Option<&'a Structural>, k: &str) -> Option<&'a Structural> {
    let s = s?;
    s.properties
        .get(k)
        .or_else(|| s.additional_properties.as_ref().and_then(AdditionalProperties::schema))
}

fn prune_nulls(x: &mut Value, s: Option<&Structural>) {
    match x {
        Value::Object(m) => {
            m.retain(|k, v| {
                let fs = field_schema(s, k);
                let drop = v.is_null() && fs.is_some_and(|f| !f.nullable && f.default.is_none());
                if !drop {
                    prune_nulls(v, fs);
                }
                !drop
            });
        }
        Value::Array(a) => {
            let items = s.and_then(|s| s.items.as_deref());
            for v in a.iter_mut() {
                prune_nulls(v, items);
            }
        }
        _ => {}
    }
}
