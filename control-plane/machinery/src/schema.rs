//! The OpenAPI v3 component schemas of every built-in type, in upstream's shape
//! (`kubernetes/api/openapi-spec/v3`): properties, `items`, `additionalProperties`,
//! references as `$ref` or `allOf: [{$ref}]`, and the `x-kubernetes-*` extensions that
//! strategic merge patch and server-side apply read (`x-kubernetes-patch-merge-key`,
//! `x-kubernetes-patch-strategy`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`, `x-kubernetes-group-version-kind`).
//!
//! Patch, apply, field validation and the OpenAPI documents all read this one source.

mod builtin;
mod patch_meta;

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use serde_json::{Map, Value};

pub use self::builtin::REF_PREFIX;

/// Component schemas by name ("io.k8s.api.apps.v1.Deployment").
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    components: BTreeMap<String, Value>,
    /// (group, version, kind) → component name, from `x-kubernetes-group-version-kind`
    /// (looked up on every write, so indexed once).
    /// Keyed by kind, then searched by group and version, so that a lookup by borrowed
    /// names allocates nothing.
    kinds: HashMap<String, Vec<(String, String, String)>>,
}

impl Schemas {
    pub fn from_components(components: BTreeMap<String, Value>) -> Self {
        let mut kinds = HashMap::new();
        for (name, schema) in &components {
            let Some(gvks) =
                schema.get("x-kubernetes-group-version-kind").and_then(Value::as_array)
            else {
                continue;
            };
            for gvk in gvks {
                let part =
                    |k: &str| gvk.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                let entries: &mut Vec<_> = kinds.entry(part("kind")).or_default();
                let (group, version) = (part("group"), part("version"));
                if !entries.iter().any(|(g, v, _)| *g == group && *v == version) {
                    entries.push((group, version, name.clone()));
                }
            }
        }
        Schemas { components, kinds }
    }

    /// The schemas of every served built-in kind (and the meta/v1 types around them),
    /// generated once from k8s-openapi's types plus upstream's list/patch metadata.
    pub fn builtin() -> &'static Schemas {
        static BUILTIN: OnceLock<Schemas> = OnceLock::new();
        BUILTIN.get_or_init(|| Schemas::from_components(builtin::build()))
    }

    /// Paths of the fields of `value` that `schema` does not declare, as upstream's strict
    /// field validation reports them: `.spec.replicass`, `.spec.template.spec.containers[0].imagee`.
    /// Maps (`additionalProperties`) and preserve-unknown-fields nodes accept any key.
    /// Format a path for a message with [`unknown_field_message`].
    pub fn unknown_fields(&self, schema: FieldSchema<'_>, value: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let mut path = String::new();
        collect_unknown(schema, value, &mut path, &mut out);
        out
    }

    pub fn components(&self) -> &BTreeMap<String, Value> {
        &self.components
    }

    pub fn component(&self, name: &str) -> Option<&Value> {
        self.components.get(name)
    }

    /// The component schema of a kind, found through `x-kubernetes-group-version-kind`.
    pub fn for_kind(&self, group: &str, version: &str, kind: &str) -> Option<&Value> {
        self.component_name_for_kind(group, version, kind)
            .and_then(|name| self.components.get(name))
    }

    /// The component name ("io.k8s.api.apps.v1.Deployment") of a kind, found through
    /// `x-kubernetes-group-version-kind`.
    pub fn component_name_for_kind(&self, group: &str, version: &str, kind: &str) -> Option<&str> {
        self.kinds
            .get(kind)?
            .iter()
            .find(|(g, v, _)| g == group && v == version)
            .map(|(_, _, name)| name.as_str())
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
        match self.builtin_facts(schema) {
            Some(facts) => FieldSchema {
                schemas: self,
                raw: schema,
                resolved: facts.resolved,
                facts: Some(facts),
            },
            None => FieldSchema {
                schemas: self,
                raw: schema,
                resolved: self.resolve(schema),
                facts: None,
            },
        }
    }

    /// The [`Facts`] of a node of the built-in schemas, looked up by the node's address: the
    /// walks of patches, apply and managed fields ask the same questions of the same nodes on
    /// every write, and each answer is a search (a reference, among hundreds of long
    /// component names). `None` for other schemas (custom resources) and for nodes not in
    /// the table.
    fn builtin_facts(&self, schema: &Value) -> Option<&'static Facts> {
        type ByAddress = HashMap<usize, Facts, foldhash::fast::FixedState>;
        static FACTS: OnceLock<ByAddress> = OnceLock::new();
        let builtin = Schemas::builtin();
        if !std::ptr::eq(self, builtin) {
            return None;
        }
        let table = FACTS.get_or_init(|| {
            fn visit(schemas: &'static Schemas, v: &'static Value, table: &mut ByAddress) {
                match v {
                    Value::Object(members) => {
                        let field = FieldSchema {
                            schemas,
                            raw: v,
                            resolved: schemas.resolve(v),
                            facts: None,
                        };
                        table.insert(v as *const Value as usize, Facts::of(field));
                        members.values().for_each(|m| visit(schemas, m, table));
                    }
                    Value::Array(items) => items.iter().for_each(|i| visit(schemas, i, table)),
                    _ => {}
                }
            }
            let mut table = ByAddress::default();
            builtin.components.values().for_each(|c| visit(builtin, c, &mut table));
            table
        });
        table.get(&(schema as *const Value as usize))
    }
}

/// What is asked of a schema node on every walk over a value, answered once (for the
/// built-in schemas, whose nodes live as long as the process).
#[derive(Debug)]
struct Facts {
    resolved: &'static Value,
    properties: Option<&'static Map<String, Value>>,
    map_type: &'static str,
    is_map: bool,
    preserves_unknown: bool,
}

impl Facts {
    fn of(field: FieldSchema<'static>) -> Facts {
        Facts {
            resolved: field.resolved,
            properties: field.resolved.get("properties").and_then(Value::as_object),
            map_type: field.map_type(),
            is_map: field.is_map(),
            preserves_unknown: field.preserves_unknown(),
        }
    }
}

/// A schema node as the field that holds it sees it: the raw node (which carries the
/// field-level extensions) and the resolved type.
#[derive(Debug, Clone, Copy)]
pub struct FieldSchema<'a> {
    schemas: &'a Schemas,
    raw: &'a Value,
    resolved: &'a Value,
    facts: Option<&'a Facts>,
}

impl<'a> FieldSchema<'a> {
    fn ext(&self, name: &str) -> Option<&'a Value> {
        self.raw.get(name).or_else(|| self.resolved.get(name))
    }

    /// The declared properties of an object type.
    pub fn properties(&self) -> Option<&'a Map<String, Value>> {
        match self.facts {
            Some(facts) => facts.properties,
            None => self.resolved.get("properties").and_then(Value::as_object),
        }
    }

    /// The schema of property `name` of an object type.
    pub fn property(&self, name: &str) -> Option<FieldSchema<'a>> {
        self.properties()?.get(name).map(|s| self.schemas.field(s))
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
        if let Some(facts) = self.facts {
            return facts.is_map;
        }
        self.resolved.get("additionalProperties").is_some()
            && self.resolved.get("properties").is_none()
    }

    /// True when unknown fields are kept (`x-kubernetes-preserve-unknown-fields`) or the
    /// node has no type information at all (e.g. RawExtension, JSON).
    pub fn preserves_unknown(&self) -> bool {
        if let Some(facts) = self.facts {
            return facts.preserves_unknown;
        }
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
        if let Some(facts) = self.facts {
            return facts.map_type;
        }
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

/// Upstream's wording for one unknown field: `unknown field "spec.replicass"`.
pub fn unknown_field_message(path: &str) -> String {
    format!("unknown field \"{}\"", path.strip_prefix('.').unwrap_or(path))
}

fn collect_unknown(
    schema: FieldSchema<'_>,
    value: &Value,
    path: &mut String,
    out: &mut Vec<String>,
) {
    if schema.preserves_unknown() {
        return;
    }
    match value {
        Value::Object(fields) => {
            if let Some(props) = schema.properties() {
                for (name, field) in fields {
                    let len = path.len();
                    path.push('.');
                    path.push_str(name);
                    match props.get(name) {
                        Some(sub) => collect_unknown(schema.schemas().field(sub), field, path, out),
                        None => out.push(path.clone()),
                    }
                    path.truncate(len);
                }
            } else if let Some(values) = schema.map_values() {
                for (name, field) in fields {
                    let len = path.len();
                    path.push('.');
                    path.push_str(name);
                    collect_unknown(values, field, path, out);
                    path.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.items() {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    collect_unknown(item_schema, item, path, out);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment() -> FieldSchema<'static> {
        let schemas = Schemas::builtin();
        schemas.field(schemas.for_kind("apps", "v1", "Deployment").expect("Deployment schema"))
    }

    #[test]
    fn builtin_nodes_answer_from_their_facts_as_from_the_schema() {
        let s = Schemas::builtin();
        fn check(s: &Schemas, v: &Value, seen: &mut usize) {
            match v {
                Value::Object(members) => {
                    let fast = s.field(v);
                    let slow =
                        FieldSchema { schemas: s, raw: v, resolved: s.resolve(v), facts: None };
                    assert!(fast.facts.is_some(), "{v}");
                    assert!(std::ptr::eq(fast.resolved(), slow.resolved()), "{v}");
                    assert!(
                        fast.properties().map(|p| p as *const _)
                            == slow.properties().map(|p| p as *const _)
                    );
                    assert_eq!(fast.map_type(), slow.map_type());
                    assert_eq!(fast.is_map(), slow.is_map());
                    assert_eq!(fast.preserves_unknown(), slow.preserves_unknown());
                    *seen += 1;
                    members.values().for_each(|m| check(s, m, seen));
                }
                Value::Array(items) => items.iter().for_each(|i| check(s, i, seen)),
                _ => {}
            }
        }
        let mut seen = 0;
        s.components().values().for_each(|c| check(s, c, &mut seen));
        assert!(seen > 1000, "{seen} nodes");
        // A node that is not part of the built-in schemas is resolved by its reference.
        let foreign = json!({"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"});
        let field = s.field(&foreign);
        assert!(std::ptr::eq(field.resolved(), s.component("io.k8s.api.core.v1.PodSpec").unwrap()));
        assert!(field.property("containers").is_some());
    }

    #[test]
    fn kinds_carry_gvk_and_lists_exist() {
        let s = Schemas::builtin();
        for (g, v, k) in [
            ("", "v1", "Pod"),
            ("", "v1", "PodList"),
            ("", "v1", "Binding"),
            ("apps", "v1", "Deployment"),
            ("apps", "v1", "StatefulSetList"),
            ("autoscaling", "v1", "Scale"),
            ("batch", "v1", "Job"),
            ("discovery.k8s.io", "v1", "EndpointSlice"),
            ("coordination.k8s.io", "v1", "Lease"),
            ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
            ("", "v1", "Status"),
            ("apps", "v1", "DeleteOptions"),
        ] {
            assert!(s.for_kind(g, v, k).is_some(), "no schema for {g}/{v} {k}");
        }
    }

    #[test]
    fn upstream_shape_of_references_and_defaults() {
        let s = Schemas::builtin();
        let d = s.component("io.k8s.api.apps.v1.Deployment").unwrap();
        assert_eq!(
            d["properties"]["metadata"]["allOf"],
            json!([{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}])
        );
        assert_eq!(d["properties"]["metadata"]["default"], json!({}));
        let c = s.component("io.k8s.api.core.v1.Container").unwrap();
        assert_eq!(c["properties"]["name"]["default"], json!(""));
        let spec = s.component("io.k8s.api.core.v1.PodSpec").unwrap();
        assert_eq!(spec["properties"]["containers"]["items"]["default"], json!({}));
        let ios = s.component("io.k8s.apimachinery.pkg.util.intstr.IntOrString").unwrap();
        assert_eq!(ios["format"], "int-or-string");
        let time = s.component("io.k8s.apimachinery.pkg.apis.meta.v1.Time").unwrap();
        assert_eq!(time["format"], "date-time");
    }

    #[test]
    fn list_and_patch_metadata() {
        let spec = deployment()
            .property("spec")
            .unwrap()
            .property("template")
            .unwrap()
            .property("spec")
            .unwrap();
        let containers = spec.property("containers").unwrap();
        assert_eq!(containers.list_type(), "map");
        assert_eq!(containers.list_map_keys(), vec!["name"]);
        assert_eq!(containers.patch_merge_key(), Some("name"));
        assert_eq!(containers.patch_strategies(), vec!["merge"]);
        let ports = containers.items().unwrap().property("ports").unwrap();
        assert_eq!(ports.list_map_keys(), vec!["containerPort", "protocol"]);
        assert_eq!(ports.patch_merge_key(), Some("containerPort"));
        let volumes = spec.property("volumes").unwrap();
        assert_eq!(volumes.patch_strategies(), vec!["merge", "retainKeys"]);
        assert_eq!(spec.property("tolerations").unwrap().list_type(), "atomic");
        let meta = deployment().property("metadata").unwrap();
        assert_eq!(meta.property("finalizers").unwrap().list_type(), "set");
        assert_eq!(meta.property("ownerReferences").unwrap().patch_merge_key(), Some("uid"));
        assert_eq!(meta.property("labels").unwrap().map_type(), "granular");
        assert_eq!(
            deployment().property("spec").unwrap().property("selector").unwrap().map_type(),
            "atomic"
        );
        assert_eq!(spec.property("nodeSelector").unwrap().map_type(), "atomic");
        assert!(meta.property("labels").unwrap().is_map());
    }

    #[test]
    fn every_patch_meta_entry_names_a_real_list_field() {
        let s = Schemas::builtin();
        for m in patch_meta::FIELD_META {
            let comp =
                s.component(m.component).unwrap_or_else(|| panic!("no component {}", m.component));
            let prop = &comp["properties"][m.field];
            assert!(prop.is_object(), "{}.{} missing", m.component, m.field);
            if m.list_type.is_some() {
                assert_eq!(prop["type"], "array", "{}.{} is not a list", m.component, m.field);
            }
            if let Some(keys) = m.list_map_keys {
                let item = s.field(&prop["items"]);
                for k in keys {
                    assert!(
                        item.property(k).is_some(),
                        "{}.{} key {k} is not an item field",
                        m.component,
                        m.field
                    );
                }
            }
        }
        for name in patch_meta::STRUCT_ATOMIC {
            assert!(s.component(name).is_some(), "no component {name}");
        }
    }

    #[test]
    fn unknown_fields_reports_paths() {
        let s = Schemas::builtin();
        let obj = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "x", "labels": {"anything": "goes"}, "bogus": 1},
            "spec": {
                "replicass": 2,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"spec": {"containers": [{"name": "c", "image": "i", "imagee": "j",
                    "resources": {"limits": {"cpu": "1"}}}]}}
            }
        });
        let found = s.unknown_fields(deployment(), &obj);
        assert_eq!(
            found,
            vec![".metadata.bogus", ".spec.replicass", ".spec.template.spec.containers[0].imagee"]
        );
        assert_eq!(unknown_field_message(&found[1]), "unknown field \"spec.replicass\"");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}, "binaryData": {"b": "AA=="}});
        let schema = s.field(s.for_kind("", "v1", "ConfigMap").unwrap());
        assert!(s.unknown_fields(schema, &cm).is_empty());
    }
}
