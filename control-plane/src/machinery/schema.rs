//! The OpenAPI v3 component schemas of every built-in type, in upstream's shape
//! (`kubernetes/api/openapi-spec/v3`): properties, `items`, `additionalProperties`,
//! references as `$ref` or `allOf: [{$ref}]`, and the `x-kubernetes-*` extensions that
//! strategic merge patch and server-side apply read (`x-kubernetes-patch-merge-key`,
//! `x-kubernetes-patch-strategy`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`, `x-kubernetes-group-version-kind`).
//!
//! Patch, apply, field validation and the OpenAPI documents all read this one source.

use std::collections::BTreeMap;

use serde_json::Value;

const REF_PREFIX: &str = "#/components/schemas/";

/// Component schemas by name ("io.k8s.api.apps.v1.Deployment").
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    components: BTreeMap<String, Value>,
}

impl Schemas {
    pub fn from_components(components: BTreeMap<String, Value>) -> Self {
        Schemas { components }
    }

    pub fn components(&self) -> &BTreeMap<String, Value> {
        &self.components
    }

    pub fn component(&self, name: &str) -> Option<&Value> {
        self.components.get(name)
    }

    /// The component schema of a kind, found through `x-kubernetes-group-version-kind`.
    pub fn for_kind(&self, group: &str, version: &str, kind: &str) -> Option<&Value> {
        self.components.values().find(|schema| {
            schema.get("x-kubernetes-group-version-kind").and_then(Value::as_array).is_some_and(
                |gvks| {
                    gvks.iter().any(|gvk| {
                        gvk["group"].as_str() == Some(group)
                            && gvk["version"].as_str() == Some(version)
                            && gvk["kind"].as_str() == Some(kind)
                    })
                },
            )
        })
    }

    /// Follow `$ref` and single-element `allOf: [{$ref}]` to the referenced component.
    /// Extensions on the referring schema (list type, merge key) must be read from the
    /// referring schema itself before resolving: see [`FieldSchema`].
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        let mut current = schema;
        for _ in 0..16 {
            let target = if let Some(r) = current.get("$ref").and_then(Value::as_str) {
                r
            } else if let Some([one]) =
                current.get("allOf").and_then(Value::as_array).map(Vec::as_slice)
            {
                match one.get("$ref").and_then(Value::as_str) {
                    Some(r) => r,
                    None => return current,
                }
            } else {
                return current;
            };
            match target.strip_prefix(REF_PREFIX).and_then(|name| self.components.get(name)) {
                Some(next) => current = next,
                None => return current,
            }
        }
        current
    }

    /// A navigable view of a schema.
    pub fn field<'a>(&'a self, schema: &'a Value) -> FieldSchema<'a> {
        FieldSchema { schemas: self, raw: schema, resolved: self.resolve(schema) }
    }
}

/// A schema node as the field that holds it sees it: the raw node (which carries the
/// field-level extensions) and the resolved type.
#[derive(Debug, Clone, Copy)]
pub struct FieldSchema<'a> {
    schemas: &'a Schemas,
    raw: &'a Value,
    resolved: &'a Value,
}

impl<'a> FieldSchema<'a> {
    fn ext(&self, name: &str) -> Option<&'a Value> {
        self.raw.get(name).or_else(|| self.resolved.get(name))
    }

    /// The schema of property `name` of an object type.
    pub fn property(&self, name: &str) -> Option<FieldSchema<'a>> {
        self.resolved.get("properties")?.get(name).map(|s| self.schemas.field(s))
    }

    /// The element schema of an array.
    pub fn items(&self) -> Option<FieldSchema<'a>> {
        self.resolved.get("items").map(|s| self.schemas.field(s))
    }

    /// The value schema of a map (`additionalProperties`).
    pub fn map_values(&self) -> Option<FieldSchema<'a>> {
        match self.resolved.get("additionalProperties") {
            Some(Value::Bool(_)) | None => None,
            Some(s) => Some(self.schemas.field(s)),
        }
    }

    pub fn type_name(&self) -> Option<&'a str> {
        self.resolved.get("type").and_then(Value::as_str)
    }

    pub fn format(&self) -> Option<&'a str> {
        self.resolved.get("format").and_then(Value::as_str)
    }

    pub fn is_array(&self) -> bool {
        self.type_name() == Some("array")
    }

    /// An object whose keys are free (a map), as opposed to a struct with properties.
    pub fn is_map(&self) -> bool {
        self.resolved.get("additionalProperties").is_some()
            && self.resolved.get("properties").is_none()
    }

    /// True when unknown fields are kept (`x-kubernetes-preserve-unknown-fields`) or the
    /// node has no type information at all (e.g. RawExtension, JSON).
    pub fn preserves_unknown(&self) -> bool {
        self.ext("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
            || (self.resolved.get("type").is_none()
                && self.resolved.get("properties").is_none()
                && self.resolved.get("items").is_none()
                && self.resolved.get("additionalProperties").is_none())
    }

    pub fn patch_merge_key(&self) -> Option<&'a str> {
        self.ext("x-kubernetes-patch-merge-key").and_then(Value::as_str)
    }

    /// The strategies of `x-kubernetes-patch-strategy` ("merge", "retainKeys", "replace").
    pub fn patch_strategies(&self) -> Vec<&'a str> {
        self.ext("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    }

    /// `x-kubernetes-list-type`: "atomic" (the default for arrays), "set" or "map".
    pub fn list_type(&self) -> &'a str {
        self.ext("x-kubernetes-list-type").and_then(Value::as_str).unwrap_or("atomic")
    }

    pub fn list_map_keys(&self) -> Vec<&'a str> {
        self.ext("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|keys| keys.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// `x-kubernetes-map-type`: "granular" (default) or "atomic".
    pub fn map_type(&self) -> &'a str {
        self.ext("x-kubernetes-map-type").and_then(Value::as_str).unwrap_or("granular")
    }

    pub fn raw(&self) -> &'a Value {
        self.raw
    }

    pub fn resolved(&self) -> &'a Value {
        self.resolved
    }

    pub fn schemas(&self) -> &'a Schemas {
        self.schemas
    }
}

/// The built-in schemas (stub until the schema builder lands).
pub fn builtin() -> &'static Schemas {
    static EMPTY: std::sync::OnceLock<Schemas> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Schemas::default)
}

impl Schemas {
    /// Paths of fields in `value` the schema does not know (stub until the builder lands).
    pub fn unknown_fields(&self, _schema: FieldSchema, _value: &Value) -> Vec<String> {
        Vec::new()
    }
}
