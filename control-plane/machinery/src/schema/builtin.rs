//! Builds the component schemas of the served built-in types from k8s-openapi's `JsonSchema`
//! impls, then reshapes them into upstream's OpenAPI v3 form: `allOf: [{$ref}]` wherever a
//! reference carries siblings, `default` values for value-typed fields, the int-or-string and
//! quantity `oneOf`s, `x-kubernetes-group-version-kind` on kinds, synthesized `<Kind>List`
//! schemas, and the list/map/patch extensions of [`super::patch_meta`].

use std::collections::BTreeMap;

use k8s_openapi::Resource;
use k8s_openapi::api::{
    admissionregistration, apps, autoscaling, batch, certificates, coordination, core, discovery,
    networking, policy, rbac, scheduling, storage,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use super::patch_meta::{FIELD_META, STRUCT_ATOMIC};

/// Prefix of OpenAPI v3 component references.
pub const REF_PREFIX: &str = "#/components/schemas/";

/// One served kind: its component name and group/version/kind.
struct Kind {
    component: String,
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    /// Whether a `<Kind>List` schema is served (false for subresource bodies).
    list: bool,
}

fn kind<T: JsonSchema + Resource>(generator: &mut SchemaGenerator, list: bool) -> Kind {
    generator.subschema_for::<T>();
    Kind {
        component: T::schema_name().into_owned(),
        group: T::GROUP,
        version: T::VERSION,
        kind: T::KIND,
        list,
    }
}

/// Group-versions whose DeleteOptions/WatchEvent GVKs are listed, as upstream lists one per
/// served group-version.
const SERVED_GROUP_VERSIONS: &[(&str, &str)] = &[
    ("", "v1"),
    ("apps", "v1"),
    ("autoscaling", "v1"),
    ("autoscaling", "v2"),
    ("batch", "v1"),
    ("coordination.k8s.io", "v1"),
    ("discovery.k8s.io", "v1"),
    ("rbac.authorization.k8s.io", "v1"),
    ("admissionregistration.k8s.io", "v1"),
    ("scheduling.k8s.io", "v1"),
    ("policy", "v1"),
    ("networking.k8s.io", "v1"),
    ("storage.k8s.io", "v1"),
];

pub(super) fn build() -> BTreeMap<String, Value> {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut generator = SchemaGenerator::new(settings);
    let g = &mut generator;
    let mut kinds = vec![
        kind::<core::v1::Namespace>(g, true),
        kind::<core::v1::Node>(g, true),
        kind::<core::v1::Pod>(g, true),
        kind::<core::v1::Service>(g, true),
        kind::<core::v1::Endpoints>(g, true),
        kind::<core::v1::ConfigMap>(g, true),
        kind::<core::v1::Secret>(g, true),
        kind::<core::v1::ServiceAccount>(g, true),
        kind::<core::v1::Event>(g, true),
        kind::<core::v1::ComponentStatus>(g, true),
        kind::<core::v1::ResourceQuota>(g, true),
        kind::<core::v1::LimitRange>(g, true),
        kind::<core::v1::Binding>(g, false),
        kind::<core::v1::PersistentVolume>(g, true),
        kind::<core::v1::PersistentVolumeClaim>(g, true),
        kind::<core::v1::ReplicationController>(g, true),
        kind::<apps::v1::Deployment>(g, true),
        kind::<apps::v1::ReplicaSet>(g, true),
        kind::<apps::v1::DaemonSet>(g, true),
        kind::<apps::v1::StatefulSet>(g, true),
        kind::<apps::v1::ControllerRevision>(g, true),
        kind::<autoscaling::v1::Scale>(g, false),
        kind::<autoscaling::v2::HorizontalPodAutoscaler>(g, true),
        kind::<policy::v1::Eviction>(g, false),
        kind::<policy::v1::PodDisruptionBudget>(g, true),
        kind::<batch::v1::Job>(g, true),
        kind::<batch::v1::CronJob>(g, true),
        kind::<networking::v1::Ingress>(g, true),
        kind::<networking::v1::IngressClass>(g, true),
        kind::<storage::v1::StorageClass>(g, true),
        kind::<discovery::v1::EndpointSlice>(g, true),
        kind::<coordination::v1::Lease>(g, true),
        kind::<certificates::v1::CertificateSigningRequest>(g, true),
        kind::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(g, true),
        kind::<rbac::v1::Role>(g, true),
        kind::<rbac::v1::ClusterRole>(g, true),
        kind::<rbac::v1::RoleBinding>(g, true),
        kind::<rbac::v1::ClusterRoleBinding>(g, true),
        kind::<admissionregistration::v1::MutatingWebhookConfiguration>(g, true),
        kind::<admissionregistration::v1::ValidatingWebhookConfiguration>(g, true),
        kind::<scheduling::v1::PriorityClass>(g, true),
        kind::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(g, true),
    ];
    g.subschema_for::<meta::Status>();
    g.subschema_for::<meta::DeleteOptions>();
    g.subschema_for::<meta::WatchEvent<()>>();
    g.subschema_for::<meta::APIResourceList>();
    g.subschema_for::<meta::APIGroupList>();
    g.subschema_for::<meta::APIGroup>();
    g.subschema_for::<meta::APIVersions>();
    g.subschema_for::<meta::Patch>();
    g.subschema_for::<meta::ListMeta>();

    let mut components: BTreeMap<String, Value> =
        generator.take_definitions(false).into_iter().collect();
    kinds.extend(metrics_types(&mut components));

    for k in &kinds {
        if k.list {
            let list_name = format!("{}List", k.component);
            components.insert(list_name, list_schema(k));
        }
        if let Some(schema) = components.get_mut(&k.component) {
            set_gvk(schema, &[(k.group, k.version, k.kind)]);
        }
    }
    let meta_kinds: &[(&str, &str)] = &[
        ("io.k8s.apimachinery.pkg.apis.meta.v1.Status", "Status"),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList", "APIResourceList"),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.APIGroupList", "APIGroupList"),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.APIGroup", "APIGroup"),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.APIVersions", "APIVersions"),
    ];
    for (name, kind) in meta_kinds {
        if let Some(schema) = components.get_mut(*name) {
            set_gvk(schema, &[("", "v1", kind)]);
        }
    }
    for (name, kind) in [
        ("io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions", "DeleteOptions"),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent", "WatchEvent"),
    ] {
        if let Some(schema) = components.get_mut(name) {
            let gvks: Vec<_> = SERVED_GROUP_VERSIONS.iter().map(|(g, v)| (*g, *v, kind)).collect();
            set_gvk(schema, &gvks);
        }
    }

    special_types(&mut components);
    let names: Vec<String> = components.keys().cloned().collect();
    let value_structs: BTreeMap<String, bool> = names
        .iter()
        .map(|n| {
            let s = &components[n];
            (
                n.clone(),
                s.get("properties").is_some()
                    && s.get("type").and_then(Value::as_str) == Some("object"),
            )
        })
        .collect();
    for schema in components.values_mut() {
        add_defaults(schema, &value_structs);
        wrap_refs(schema, true);
    }
    apply_patch_meta(&mut components);
    components
}

fn set_gvk(schema: &mut Value, gvks: &[(&str, &str, &str)]) {
    let list: Vec<Value> =
        gvks.iter().map(|(g, v, k)| json!({"group": g, "kind": k, "version": v})).collect();
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-kubernetes-group-version-kind".into(), Value::Array(list));
    }
}

fn list_schema(k: &Kind) -> Value {
    json!({
        "description": format!("{}List is a list of {} objects.", k.kind, k.kind),
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
                "type": "string"
            },
            "items": {
                "description": format!("Items is the list of {} objects.", k.kind),
                "items": {"$ref": format!("{REF_PREFIX}{}", k.component)},
                "type": "array"
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
                "type": "string"
            },
            "metadata": {
                "$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"),
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
            }
        },
        "required": ["items"],
        "type": "object",
        "x-kubernetes-group-version-kind": [{"group": k.group, "kind": format!("{}List", k.kind), "version": k.version}]
    })
}

/// The `metrics.k8s.io/v1beta1` kinds (k8s.io/metrics' types, which k8s-openapi does not
/// carry), as metrics-server publishes them.
fn metrics_types(components: &mut BTreeMap<String, Value>) -> Vec<Kind> {
    const PREFIX: &str = "io.k8s.metrics.pkg.apis.metrics.v1beta1.";
    let meta = |what: &str| {
        json!({
            "$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            "description": format!("Standard object's metadata: the {what}'s name, namespace and labels. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"),
        })
    };
    let usage = json!({
        "additionalProperties": {"$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.api.resource.Quantity")},
        "description": "The memory and CPU usage.",
        "type": "object",
    });
    let common = |what: &str| {
        json!({
            "apiVersion": {"description": "APIVersion defines the versioned schema of this representation of an object.", "type": "string"},
            "kind": {"description": "Kind is a string value representing the REST resource this object represents.", "type": "string"},
            "metadata": meta(what),
            "timestamp": {
                "$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.apis.meta.v1.Time"),
                "description": "The following fields define time interval from which metrics were collected from the interval [Timestamp-Window, Timestamp].",
            },
            "window": {"type": "string"},
        })
    };
    let mut node = common("node");
    node["usage"] = usage.clone();
    let mut pod = common("pod");
    pod["containers"] = json!({
        "description": "Metrics for all containers are collected within the same time window.",
        "items": {"$ref": format!("{REF_PREFIX}{PREFIX}ContainerMetrics")},
        "type": "array",
        "x-kubernetes-list-type": "atomic",
    });
    components.insert(
        format!("{PREFIX}NodeMetrics"),
        json!({"description": "NodeMetrics sets resource usage metrics of a node.",
            "properties": node, "required": ["timestamp", "window", "usage"], "type": "object"}),
    );
    components.insert(
        format!("{PREFIX}PodMetrics"),
        json!({"description": "PodMetrics sets resource usage metrics of a pod.",
            "properties": pod, "required": ["timestamp", "window", "containers"], "type": "object"}),
    );
    components.insert(
        format!("{PREFIX}ContainerMetrics"),
        json!({"description": "ContainerMetrics sets resource usage metrics of a container.",
            "properties": {"name": {"description": "Container name corresponding to the one from pod.spec.containers.", "type": "string"}, "usage": usage},
            "required": ["name", "usage"], "type": "object"}),
    );
    ["NodeMetrics", "PodMetrics"]
        .into_iter()
        .map(|kind| Kind {
            component: format!("{PREFIX}{kind}"),
            group: "metrics.k8s.io",
            version: "v1beta1",
            kind,
            list: true,
        })
        .collect()
}

/// IntOrString and Quantity as upstream's v3 spells them (k8s-openapi marks them only with
/// `x-kubernetes-int-or-string`).
fn special_types(components: &mut BTreeMap<String, Value>) {
    if let Some(Value::Object(o)) =
        components.get_mut("io.k8s.apimachinery.pkg.util.intstr.IntOrString")
    {
        o.remove("x-kubernetes-int-or-string");
        o.insert("format".into(), json!("int-or-string"));
        o.insert("oneOf".into(), json!([{"type": "integer"}, {"type": "string"}]));
    }
    if let Some(Value::Object(o)) =
        components.get_mut("io.k8s.apimachinery.pkg.api.resource.Quantity")
    {
        o.remove("x-kubernetes-int-or-string");
        o.insert("oneOf".into(), json!([{"type": "string"}, {"type": "number"}]));
    }
}

fn ref_target(node: &Value) -> Option<&str> {
    node.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(REF_PREFIX))
}

/// Upstream's `default`s come from Go value types (non-pointer fields), which the schema does
/// not record. Approximation: required scalars default to their zero value; references to
/// struct types default to `{}` when required, when they are `metadata`/`spec`/`status`/
/// `template` (value structs in every served kind) and as array items; string array items and
/// string map values default to `""`.
fn add_defaults(schema: &mut Value, value_structs: &BTreeMap<String, bool>) {
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { return };
    for (name, prop) in props.iter_mut() {
        let is_required = required.iter().any(|r| r == name);
        let is_struct_ref =
            ref_target(prop).is_some_and(|t| value_structs.get(t).copied().unwrap_or(false));
        let default = if is_struct_ref
            && (is_required || matches!(name.as_str(), "metadata" | "spec" | "status" | "template"))
        {
            Some(json!({}))
        } else if is_required {
            match prop.get("type").and_then(Value::as_str) {
                Some("string") if prop.get("format").is_none() => Some(json!("")),
                Some("integer") => Some(json!(0)),
                Some("boolean") => Some(json!(false)),
                _ => None,
            }
        } else {
            None
        };
        if let (Some(d), Some(o)) = (default, prop.as_object_mut()) {
            o.entry("default").or_insert(d);
        }
        if let Some(items) = prop.get_mut("items") {
            item_default(items, value_structs);
        }
        if let Some(values) = prop.get_mut("additionalProperties")
            && values.get("type").and_then(Value::as_str) == Some("string")
            && values.get("format").is_none()
            && let Some(o) = values.as_object_mut()
        {
            o.entry("default").or_insert(json!(""));
        }
    }
}

fn item_default(items: &mut Value, value_structs: &BTreeMap<String, bool>) {
    let default =
        if ref_target(items).is_some_and(|t| value_structs.get(t).copied().unwrap_or(false)) {
            Some(json!({}))
        } else if items.get("type").and_then(Value::as_str) == Some("string")
            && items.get("format").is_none()
        {
            Some(json!(""))
        } else {
            None
        };
    if let (Some(d), Some(o)) = (default, items.as_object_mut()) {
        o.entry("default").or_insert(d);
    }
}

/// `{$ref, description, ...}` becomes `{allOf: [{$ref}], description, ...}` (OpenAPI 3.0
/// ignores siblings of `$ref`); recurse into properties, items and map values.
fn wrap_refs(node: &mut Value, top: bool) {
    let Some(obj) = node.as_object_mut() else { return };
    if !top
        && obj.len() > 1
        && let Some(r) = obj.remove("$ref")
    {
        obj.insert("allOf".into(), json!([{"$ref": r}]));
    }
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for p in props.values_mut() {
            wrap_refs(p, false);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = obj.get_mut(key) {
            wrap_refs(child, false);
        }
    }
}

fn apply_patch_meta(components: &mut BTreeMap<String, Value>) {
    for m in FIELD_META {
        let Some(prop) = components
            .get_mut(m.component)
            .and_then(|c| c.get_mut("properties"))
            .and_then(|p| p.get_mut(m.field))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let mut ext = Map::new();
        if let Some(keys) = m.list_map_keys {
            ext.insert("x-kubernetes-list-map-keys".into(), json!(keys));
        }
        if let Some(t) = m.list_type {
            ext.insert("x-kubernetes-list-type".into(), json!(t));
        }
        if let Some(t) = m.map_type {
            ext.insert("x-kubernetes-map-type".into(), json!(t));
        }
        if let Some(k) = m.merge_key {
            ext.insert("x-kubernetes-patch-merge-key".into(), json!(k));
        }
        if let Some(s) = m.strategy {
            ext.insert("x-kubernetes-patch-strategy".into(), json!(s));
        }
        prop.extend(ext);
    }
    for name in STRUCT_ATOMIC {
        if let Some(Value::Object(o)) = components.get_mut(*name) {
            o.insert("x-kubernetes-map-type".into(), json!("atomic"));
        }
    }
}
