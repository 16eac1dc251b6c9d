//! Custom resources in the OpenAPI documents, as upstream's apiextensions-apiserver
//! publishes a CRD's served versions (`pkg/controller/openapi/builder`):
//! - components `<reversed group>.<version>.<Kind>` (`com.example.v1.Widget`) and
//!   `...<Kind>List`: the version's `openAPIV3Schema` unfolded (int-or-string as
//!   `anyOf: [integer, string]`, embedded resources with `apiVersion`/`kind`/`metadata`),
//!   with the `apiVersion` and `kind` strings, `metadata` referring to ObjectMeta and the
//!   `x-kubernetes-group-version-kind`; the list's `items` referring to the kind and its
//!   `metadata` to ListMeta;
//! - in v2, the schema without what Swagger 2.0 or kubectl cannot take (upstream's
//!   `ToStructuralOpenAPIV2`): no `allOf`/`anyOf`/`oneOf`/`not`, nullable nodes untyped and
//!   without properties or items (and not required), preserve-unknown-fields nodes without
//!   properties or items (and untyped when objects), arrays without items untyped; a root
//!   that preserves unknown fields is a bare `{type: object}`;
//! - every verb's paths, with the status and scale subresources, named like built-ins'
//!   (`patchExampleComV1NamespacedWidget`); patches are JSON, merge or apply patches only.
//!
//! [`OpenApiDocs::with_custom`] builds them on top of the built-in documents: the built-in
//! group-version documents are shared, only the custom group-versions, the root and the v2
//! document are made again, the v2 one without copying the built-in part.

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::*;

/// One served version of a custom resource: its description and its `openAPIV3Schema`.
#[derive(Debug, Clone, Copy)]
pub struct CustomResource<'a> {
    pub desc: &'a ResourceDesc,
    pub schema: Option<&'a Value>,
}

/// The patches custom resources accept (no strategic merge patch).
const CUSTOM_PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const EMBEDDED_API_VERSION_DESCRIPTION: &str = "apiVersion defines the versioned schema of this representation of an object. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const EMBEDDED_KIND_DESCRIPTION: &str = "kind is a string value representing the type of this object. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// Which document a schema is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    V2,
    V3,
}

impl Spec {
    fn reference(self, name: &str) -> String {
        match self {
            Spec::V2 => format!("{V2_REF_PREFIX}{name}"),
            Spec::V3 => format!("{REF_PREFIX}{name}"),
        }
    }
}

/// The component name of a custom kind: the group's labels reversed, then the version and
/// the kind (`example.com`, `v1`, `Widget` → `com.example.v1.Widget`).
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let mut labels: Vec<&str> = group.split('.').collect();
    labels.reverse();
    format!("{}.{version}.{kind}", labels.join("."))
}

impl OpenApiDocs {
    /// These documents' built-in parts with the custom resources `custom` added: their
    /// group-versions' v3 documents (in the root too) and their paths and definitions in
    /// v2. Built on the built-in documents whichever documents `self` are, so custom
    /// resources never accumulate. A custom resource in a built-in group-version is left
    /// out (the registry serves none).
    pub fn with_custom(&self, custom: &[CustomResource<'_>]) -> Result<OpenApiDocs> {
        let schemas = Schemas::builtin();
        let base = &self.base;
        let mut custom: Vec<CustomResource<'_>> = custom
            .iter()
            .filter(|c| !base.group_versions.contains_key(&gv_path(c.desc.group, c.desc.version)))
            .copied()
            .collect();
        custom.sort_by(|a, b| {
            (a.desc.group, a.desc.version, a.desc.plural).cmp(&(
                b.desc.group,
                b.desc.version,
                b.desc.plural,
            ))
        });

        let mut v3_components: BTreeMap<String, Value> = BTreeMap::new();
        let mut v2_definitions: BTreeMap<String, Value> = BTreeMap::new();
        let mut kinds: HashMap<(String, String, String), String> = HashMap::new();
        for c in &custom {
            let d = c.desc;
            let name = definition_name(d.group, d.version, d.kind);
            let list_kind = format!("{}List", d.kind);
            let list_name = definition_name(d.group, d.version, &list_kind);
            for spec in [Spec::V2, Spec::V3] {
                let out = if spec == Spec::V2 { &mut v2_definitions } else { &mut v3_components };
                out.insert(name.clone(), kind_schema(d, c.schema, spec));
                out.insert(list_name.clone(), list_schema(d, &name, spec));
            }
            let key = |k: &str| (d.group.to_string(), d.version.to_string(), k.to_string());
            kinds.insert(key(d.kind), name);
            kinds.insert(key(&list_kind), list_name);
        }
        let names = |g: &str, v: &str, k: &str| {
            kinds
                .get(&(g.to_string(), v.to_string(), k.to_string()))
                .cloned()
                .or_else(|| component_name(schemas, g, v, k))
        };
        let lookup = |name: &str| v3_components.get(name).or_else(|| schemas.component(name));

        let mut by_gv: BTreeMap<String, Vec<Operation>> = BTreeMap::new();
        for c in &custom {
            let d = c.desc;
            let ops = by_gv
                .entry(gv_path(d.group, d.version))
                .or_insert_with(|| vec![api_resources_op(d.group, d.version)]);
            ops.extend(operations(&names, d, CUSTOM_PATCH_TYPES)?);
        }
        let mut group_versions = base.group_versions.clone();
        let mut all_ops = Vec::new();
        for (gv, ops) in by_gv {
            let doc = group_version_doc(&gv, &v3_document(&lookup, &ops))?;
            group_versions.insert(gv, doc);
            all_ops.extend(ops);
        }
        let root = v3_root(&group_versions)?;

        // v2: the custom paths, and the definitions they reach that the built-in document
        // lacks (the custom ones, and built-in ones no built-in path refers to).
        let empty = Map::new();
        let base_paths = base.v2.get("paths").and_then(Value::as_object).unwrap_or(&empty);
        let base_definitions =
            base.v2.get("definitions").and_then(Value::as_object).unwrap_or(&empty);
        let (mut paths, roots) = v2_paths(&all_ops);
        paths.retain(|p, _| !base_paths.contains_key(p));
        let definitions: Map<String, Value> = reachable(&lookup, roots)
            .into_iter()
            .filter_map(|(name, s)| match v2_definitions.get(&name) {
                Some(d) => Some((name, d.clone())),
                None if base_definitions.contains_key(&name) => None,
                None => {
                    let converted = v2_schema(Some(&name), &s);
                    Some((name, converted))
                }
            })
            .collect();
        let merged = MergedV2 { base: &base.v2, paths: &paths, definitions: &definitions };
        let v2_json = serde_json::to_vec(&merged)
            .map_err(|source| Error::Serialize { document: "/openapi/v2".into(), source })?;
        let v2_hash = sha512_hex(&v2_json);
        // Appended to the built-in protobuf, this message's `paths` and `definitions` merge
        // into the built-in ones (their repeated entries are appended).
        let addition = gnostic::document(&json!({ "paths": paths, "definitions": definitions }));
        let mut v2_protobuf = Vec::with_capacity(base.v2_protobuf.len() + 64 * 1024);
        v2_protobuf.extend_from_slice(&base.v2_protobuf);
        prost::Message::encode(&addition, &mut v2_protobuf)
            .expect("a Vec grows to whatever is encoded");
        Ok(OpenApiDocs {
            root,
            group_versions,
            v2_json: Bytes::from(v2_json),
            v2_protobuf: Bytes::from(v2_protobuf),
            v2_hash,
            base: base.clone(),
        })
    }
}

/// The built-in v2 document with more paths and definitions, serialized as one.
struct MergedV2<'a> {
    base: &'a Value,
    paths: &'a Map<String, Value>,
    definitions: &'a Map<String, Value>,
}

impl Serialize for MergedV2<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let empty = Map::new();
        let base = self.base.as_object().unwrap_or(&empty);
        let mut map = serializer.serialize_map(Some(base.len()))?;
        for (k, v) in base {
            let extra = match k.as_str() {
                "paths" => self.paths,
                "definitions" => self.definitions,
                _ => {
                    map.serialize_entry(k, v)?;
                    continue;
                }
            };
            map.serialize_entry(k, &MergedMap(v.as_object().unwrap_or(&empty), extra))?;
        }
        map.end()
    }
}

/// Two maps with no key in common as one, in key order when both are.
struct MergedMap<'a>(&'a Map<String, Value>, &'a Map<String, Value>);

impl Serialize for MergedMap<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len() + self.1.len()))?;
        let (mut a, mut b) = (self.0.iter().peekable(), self.1.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some((ka, _)), Some((kb, _))) => {
                    if ka <= kb {
                        a.next()
                    } else {
                        b.next()
                    }
                }
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            if let Some((k, v)) = next {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

fn gvk_list(group: &str, version: &str, kind: &str) -> Value {
    json!([{"group": group, "kind": kind, "version": version}])
}

fn is_true(o: &Map<String, Value>, key: &str) -> bool {
    o.get(key).and_then(Value::as_bool) == Some(true)
}

/// A custom kind's component schema (upstream's `buildKubeNative`).
fn kind_schema(d: &ResourceDesc, schema: Option<&Value>, spec: Spec) -> Value {
    let preserves_root = |s: &Value| {
        s.as_object().is_some_and(|o| is_true(o, "x-kubernetes-preserve-unknown-fields"))
    };
    let mut out = match schema {
        // kubectl would take the TypeMeta/ObjectMeta properties of a v2 schema that keeps
        // unknown fields for all there is, and refuse any other field.
        Some(s) if s.is_object() && !(spec == Spec::V2 && preserves_root(s)) => {
            let mut s = s.clone();
            unfold(&mut s);
            if spec == Spec::V2 {
                to_v2(&mut s);
            }
            if let Some(o) = s.as_object_mut() {
                let props = o.entry("properties").or_insert_with(|| json!({}));
                if let Some(props) = props.as_object_mut() {
                    props.insert(
                        "metadata".into(),
                        json!({"$ref": spec.reference(OBJECT_META), "description": METADATA_DESCRIPTION}),
                    );
                    props.insert(
                        "apiVersion".into(),
                        json!({"description": API_VERSION_DESCRIPTION, "type": "string"}),
                    );
                    props.insert(
                        "kind".into(),
                        json!({"description": KIND_DESCRIPTION, "type": "string"}),
                    );
                }
            }
            add_embedded_properties(&mut s, spec);
            s
        }
        _ => json!({"type": "object"}),
    };
    if let Some(o) = out.as_object_mut() {
        o.insert("x-kubernetes-group-version-kind".into(), gvk_list(d.group, d.version, d.kind));
    }
    out
}

/// A custom kind's list schema (upstream's `buildListSchema`).
fn list_schema(d: &ResourceDesc, kind_component: &str, spec: Spec) -> Value {
    let list_kind = format!("{}List", d.kind);
    json!({
        "description": format!("{list_kind} is a list of {}", d.kind),
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "items": {
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", d.plural),
                "items": {"$ref": spec.reference(kind_component)},
                "type": "array"
            },
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "metadata": {"$ref": spec.reference(LIST_META), "description": LIST_METADATA_DESCRIPTION}
        },
        "required": ["items"],
        "type": "object",
        "x-kubernetes-group-version-kind": gvk_list(d.group, d.version, &list_kind),
    })
}

/// Calls `f` on the schemas of a node's properties, items and additional properties.
fn children(o: &mut Map<String, Value>, mut f: impl FnMut(&mut Value)) {
    if let Some(props) = o.get_mut("properties").and_then(Value::as_object_mut) {
        props.values_mut().for_each(&mut f);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = o.get_mut(key).filter(|c| c.is_object()) {
            f(child);
        }
    }
}

/// Upstream's `Structural.Unfold` (what the schema says implicitly, spelled out) and
/// what a structural schema does not keep dropped (`example`, `externalDocs`).
fn unfold(s: &mut Value) {
    let Some(o) = s.as_object_mut() else { return };
    o.remove("example");
    o.remove("externalDocs");
    if is_true(o, "x-kubernetes-int-or-string") {
        let int_or_string = json!([{"type": "integer"}, {"type": "string"}]);
        match o.get("anyOf") {
            None => {
                o.insert("anyOf".into(), int_or_string);
            }
            Some(any) if *any == int_or_string => {}
            Some(_) => {
                let mut all = vec![json!({ "anyOf": int_or_string })];
                if let Some(Value::Array(rest)) = o.remove("allOf") {
                    all.extend(rest);
                }
                o.insert("allOf".into(), Value::Array(all));
            }
        }
    }
    if is_true(o, "x-kubernetes-embedded-resource") {
        let props = o.entry("properties").or_insert_with(|| json!({}));
        if let Some(props) = props.as_object_mut() {
            for (name, ty) in [("apiVersion", "string"), ("kind", "string"), ("metadata", "object")]
            {
                props.entry(name).or_insert_with(|| json!({ "type": ty }));
            }
        }
    }
    children(o, unfold);
}

/// Upstream's `ToStructuralOpenAPIV2`, node by node from the root.
fn to_v2(s: &mut Value) {
    let Some(o) = s.as_object_mut() else { return };
    for junctor in ["allOf", "anyOf", "oneOf", "not"] {
        o.remove(junctor);
    }
    // Untyped values break kubectl if they have items or properties.
    if o.remove("nullable").and_then(|n| n.as_bool()) == Some(true) {
        o.remove("type");
        o.remove("items");
        o.remove("properties");
    }
    let preserves = is_true(o, "x-kubernetes-preserve-unknown-fields");
    if preserves {
        o.remove("items");
        o.remove("properties");
    }
    let ty = o.get("type").and_then(Value::as_str);
    if (ty == Some("array") && !o.contains_key("items")) || (preserves && ty == Some("object")) {
        o.remove("type");
    }
    let nullable = |v: &Value| v.get("nullable").and_then(Value::as_bool) == Some(true);
    let nullable_props: Vec<String> = o
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(_, p)| nullable(p))
        .map(|(name, _)| name.clone())
        .collect();
    let nullable_values = o.get("additionalProperties").is_some_and(nullable);
    if let Some(Value::Array(required)) = o.get_mut("required") {
        required.retain(|r| {
            !nullable_values && !r.as_str().is_some_and(|r| nullable_props.iter().any(|p| p == r))
        });
        if required.is_empty() {
            o.remove("required");
        }
    }
    children(o, to_v2);
}

/// Upstream's `addEmbeddedProperties`: the TypeMeta and ObjectMeta of every embedded
/// resource (none in v2 under a node that keeps unknown fields).
fn add_embedded_properties(s: &mut Value, spec: Spec) {
    let Some(o) = s.as_object_mut() else { return };
    children(o, |c| add_embedded_properties(c, spec));
    if spec == Spec::V2 && is_true(o, "x-kubernetes-preserve-unknown-fields") {
        return;
    }
    if !is_true(o, "x-kubernetes-embedded-resource") {
        return;
    }
    let props = o.entry("properties").or_insert_with(|| json!({}));
    if let Some(props) = props.as_object_mut() {
        props.insert(
            "apiVersion".into(),
            json!({"description": EMBEDDED_API_VERSION_DESCRIPTION, "type": "string"}),
        );
        props.insert(
            "kind".into(),
            json!({"description": EMBEDDED_KIND_DESCRIPTION, "type": "string"}),
        );
        props.insert(
            "metadata".into(),
            json!({"$ref": spec.reference(OBJECT_META), "description": METADATA_DESCRIPTION}),
        );
    }
    let required = o.entry("required").or_insert_with(|| json!([]));
    if let Some(required) = required.as_array_mut() {
        for name in ["kind", "apiVersion"] {
            if !required.iter().any(|r| r == name) {
                required.push(json!(name));
            }
        }
    }
}
