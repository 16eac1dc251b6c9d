//! Custom resources: the resource types the Established CustomResourceDefinitions define,
//! served by the same generic handlers as the built-in kinds.
//!
//! The registry keeps a snapshot of them ([`CustomTypes`]), rebuilt from the CRDs in the
//! watch cache whenever one changes ([`follow_crds`]). A CRD's names are served as its
//! `status.acceptedNames` say (what the naming controller accepted), and only once its
//! `Established` condition is True, as upstream's apiextensions-apiserver does. Objects live
//! under `/registry/<group>/<plural>/`, whatever version wrote them.
//!
//! `ResourceDesc` names are `&'static str`: a custom resource's are interned (one leaked
//! copy per distinct string ever served, so re-creating the same CRD costs nothing more).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use serde::Deserialize;
use serde_json::Value;

use skiff_machinery::{ResourceDesc, SubresourceDesc};

use crate::registry::{Normalizer, ResourceType};

/// What a CRD says of one served version of its resource, beyond the `ResourceDesc`.
#[derive(Debug, Clone)]
pub struct CustomInfo {
    /// The CRD's name (`<plural>.<group>`).
    pub crd: String,
    /// The version objects are stored at.
    pub storage_version: String,
    /// `additionalPrinterColumns` of this version.
    pub columns: Vec<Value>,
    /// `schema.openAPIV3Schema` of this version.
    pub schema: Option<Value>,
    /// The same, parsed: what custom objects are pruned, defaulted and validated with
    /// (`None` when it does not parse, which the CRD's validation refuses).
    pub structural: Option<Arc<skiff_machinery::crd::Structural>>,
    /// The same with `metadata` as ObjectMeta (a `$ref` into the built-in schemas) and
    /// `apiVersion`/`kind` strings: the schema server-side apply, strategic merge and
    /// managed fields walk (list and map types, list-map keys), as upstream builds it.
    pub apply_schema: Option<Value>,
    /// Whether the schema has any `default` (objects read from storage are defaulted then,
    /// as upstream does, so a default added later shows on old objects).
    pub has_defaults: bool,
    /// `subresources.scale` of this version.
    pub scale: Option<Value>,
    /// The warning of a `deprecated` version.
    pub deprecation: Option<String>,
    /// The CRD is being deleted (its `Terminating` condition is True): creates are refused
    /// while the finalizer deletes the objects, as upstream.
    pub terminating: bool,
    /// `spec.conversion.webhook` when the strategy is `Webhook` (else conversion only
    /// rewrites `apiVersion`).
    pub webhook: Option<Arc<ConversionWebhook>>,
    /// `selectableFields` of this version, as field selector names (the JSONPath without
    /// its leading dot), beside `metadata.name` and `metadata.namespace`.
    pub selectable: &'static [&'static str],
}

/// A CRD's `spec.conversion.webhook`: where the reviews go, and the review version
/// (`v1` when the CRD accepts it, else `v1beta1`).
#[derive(Debug)]
pub struct ConversionWebhook {
    pub client: k8s_openapi::api::admissionregistration::v1::WebhookClientConfig,
    pub review_version: &'static str,
}

impl ConversionWebhook {
    /// The webhook of a CRD whose conversion strategy is `Webhook` (`None` otherwise, or
    /// when its clientConfig does not decode, which the CRD's validation refuses).
    pub fn of_crd(crd: &Value) -> Option<Arc<ConversionWebhook>> {
        let conversion = crd.pointer("/spec/conversion")?;
        if conversion["strategy"] != "Webhook" {
            return None;
        }
        let webhook = conversion.get("webhook")?;
        let client = serde_json::from_value(webhook.get("clientConfig")?.clone()).ok()?;
        let versions = webhook["conversionReviewVersions"].as_array();
        let v1 = versions.is_none_or(|v| v.iter().any(|v| v == "v1"));
        Some(Arc::new(ConversionWebhook {
            client,
            review_version: if v1 { "v1" } else { "v1beta1" },
        }))
    }
}

/// The custom resources served at one moment.
#[derive(Default)]
pub struct CustomTypes {
    types: Vec<Arc<ResourceType>>,
}

impl CustomTypes {
    /// The served versions of every Established CRD among `crds` (whose group is not a
    /// built-in one: `builtin_group`).
    pub fn from_crds<'a>(
        crds: impl IntoIterator<Item = &'a Value>,
        builtin_group: impl Fn(&str) -> bool,
    ) -> Self {
        let mut types = Vec::new();
        for crd in crds {
            types.extend(served_types(crd, &builtin_group));
        }
        CustomTypes { types }
    }

    pub fn all(&self) -> &[Arc<ResourceType>] {
        &self.types
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.desc.plural == plural && t.desc.group == group && t.desc.version == version)
            .cloned()
    }

    /// The storage version's type of (group, kind), else the first served version's.
    pub fn find_kind(&self, group: &str, kind: &str) -> Option<Arc<ResourceType>> {
        let mut of_kind =
            self.types.iter().filter(|t| t.desc.kind == kind && t.desc.group == group);
        let first = of_kind.next()?;
        std::iter::once(first)
            .chain(of_kind)
            .find(|t| t.custom.as_ref().is_some_and(|c| c.storage_version == t.desc.version))
            .or(Some(first))
            .cloned()
    }
}

/// The resource types one CRD serves now (none unless Established and of a group that is
/// not a built-in one).
fn served_types(crd: &Value, builtin_group: impl Fn(&str) -> bool) -> Vec<Arc<ResourceType>> {
    if !established(crd) {
        return Vec::new();
    }
    let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
    if group.is_empty() || builtin_group(group) {
        return Vec::new();
    }
    types_of(crd).into_iter().map(Arc::new).collect()
}

/// Whether stored JSON is certainly at the version `rt` serves: it begins with that
/// `apiVersion` (stored objects are encoded with their members in order, `apiVersion`
/// first unless the schema has members that sort before it; those are parsed instead).
pub fn at_version(rt: &ResourceType, json: &[u8]) -> bool {
    let Some(rest) = json.strip_prefix(b"{\"apiVersion\":\"") else { return false };
    let (group, version) = (rt.desc.group.as_bytes(), rt.desc.version.as_bytes());
    rest.strip_prefix(group)
        .and_then(|r| r.strip_prefix(b"/"))
        .and_then(|r| r.strip_prefix(version))
        .is_some_and(|r| r.starts_with(b"\""))
}

/// The request version's defaults on an object read from storage (upstream defaults on
/// reads too, so a default added later shows on old objects).
pub fn apply_read_defaults(rt: &ResourceType, obj: &mut Value) {
    if let Some(info) = &rt.custom
        && info.has_defaults
        && let Some(schema) = &info.structural
    {
        skiff_machinery::crd::apply_defaults(schema, obj);
    }
}

/// A CRD version's schema as the managed-fields walk reads it: ObjectMeta for `metadata`,
/// strings for `apiVersion` and `kind`.
fn apply_schema(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(m) = s.as_object_mut() {
        let props = m.entry("properties").or_insert_with(|| Value::Object(Default::default()));
        if let Some(props) = props.as_object_mut() {
            let meta = format!(
                "{}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                skiff_machinery::schema::REF_PREFIX
            );
            props.insert("metadata".into(), serde_json::json!({"$ref": meta}));
            for field in ["apiVersion", "kind"] {
                props.insert(field.into(), serde_json::json!({"type": "string"}));
            }
        }
    }
    s
}

fn has_default(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m.contains_key("default") || m.values().any(has_default),
        Value::Array(a) => a.iter().any(has_default),
        _ => false,
    }
}

/// Whether the CRD's `Established` condition is True.
pub fn established(crd: &Value) -> bool {
    condition_true(crd, "Established")
}

pub fn condition_true(crd: &Value, kind: &str) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The resource types of a CRD's served versions, under its accepted names.
fn types_of(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let names = &crd["status"]["acceptedNames"];
    let (Some(group), Some(plural), Some(kind)) = (
        spec["group"].as_str(),
        names["plural"].as_str().filter(|p| !p.is_empty()),
        names["kind"].as_str().filter(|k| !k.is_empty()),
    ) else {
        return Vec::new();
    };
    let singular = names["singular"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let namespaced = spec["scope"] != "Cluster";
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default()
        .to_string();
    let crd_name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let terminating = condition_true(crd, "Terminating");
    let webhook = ConversionWebhook::of_crd(crd);
    let mut out = Vec::new();
    for v in versions.iter().filter(|v| v["served"] == true) {
        let Some(version) = v["name"].as_str() else { continue };
        let status = v.pointer("/subresources/status").is_some_and(Value::is_object);
        let scale = v.pointer("/subresources/scale").filter(|s| s.is_object()).cloned();
        let subresources: &'static [SubresourceDesc] = match (status, scale.is_some()) {
            (false, false) => &[],
            (true, false) => &[crate::registry::STATUS],
            (false, true) => &[crate::registry::SCALE],
            (true, true) => &[crate::registry::STATUS, crate::registry::SCALE],
        };
        let deprecation = (v["deprecated"] == true).then(|| {
            v["deprecationWarning"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{group}/{version} {kind} is deprecated"))
        });
        let desc = ResourceDesc {
            group: intern(group),
            version: intern(version),
            kind: intern(kind),
            plural: intern(plural),
            singular: intern(&singular),
            namespaced,
            verbs: crate::registry::RW,
            short_names: intern_list(&strs(names.get("shortNames"))),
            categories: intern_list(&strs(names.get("categories"))),
            subresources,
        };
        let selectable = intern_list(
            &v["selectableFields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["jsonPath"].as_str())
                .map(|p| p.strip_prefix('.').unwrap_or(p))
                .collect::<Vec<_>>(),
        );
        out.push(ResourceType {
            desc,
            normalize: NORMALIZE,
            fields: selectable,
            tracks_generation: true,
            has_status: status,
            custom: Some(Arc::new(CustomInfo {
                crd: crd_name.to_string(),
                storage_version: storage_version.clone(),
                columns: v["additionalPrinterColumns"].as_array().cloned().unwrap_or_default(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                has_defaults: v.pointer("/schema/openAPIV3Schema").is_some_and(has_default),
                apply_schema: v.pointer("/schema/openAPIV3Schema").map(apply_schema),
                structural: v
                    .pointer("/schema/openAPIV3Schema")
                    .and_then(|s| skiff_machinery::crd::Structural::from_value(s).ok())
                    .map(Arc::new),
                scale,
                deprecation,
                terminating,
                webhook: webhook.clone(),
                selectable,
            })),
        });
    }
    out
}

/// A custom object's round trip: an object, its metadata as ObjectMeta (unknown metadata
/// fields dropped, wrong types refused); the rest is the schema's (validation and pruning
/// happen against the CRD's schema when it is decoded).
const NORMALIZE: Normalizer =
    Normalizer { owned: normalize_owned, borrowed: normalize_borrowed, clean_json: |_| None };

fn normalize_owned(mut v: Value) -> Result<Value, serde_json::Error> {
    use serde::de::Error;
    let Value::Object(m) = &mut v else {
        return Err(serde_json::Error::custom("a custom resource must be a JSON object"));
    };
    if let Some(meta) = m.get("metadata") {
        let typed = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::deserialize(meta)?;
        m.insert("metadata".into(), serde_json::to_value(typed)?);
    }
    Ok(v)
}

fn normalize_borrowed(v: &Value) -> Result<Value, serde_json::Error> {
    normalize_owned(v.clone())
}

/// The resource type custom objects are indexed with in the watch cache (the index
/// needs no more than names, namespaces and labels).
pub fn index_type() -> &'static ResourceType {
    static T: OnceLock<ResourceType> = OnceLock::new();
    T.get_or_init(|| ResourceType {
        desc: ResourceDesc {
            group: "",
            version: "",
            kind: "",
            plural: "",
            singular: "",
            namespaced: true,
            verbs: crate::registry::RW,
            short_names: &[],
            categories: &[],
            subresources: &[],
        },
        normalize: NORMALIZE,
        fields: &[],
        tracks_generation: true,
        has_status: false,
        custom: None,
    })
}

/// The store prefix (`/registry/<group>/<plural>/`) a custom object's key is under: a
/// group with a dot (every CRD's), not a built-in one.
pub fn custom_prefix(key: &str, builtin_group: impl Fn(&str) -> bool) -> Option<&str> {
    let rest = key.strip_prefix("/registry/")?;
    let (group, rest) = rest.split_once('/')?;
    let (plural, _) = rest.split_once('/')?;
    if !group.contains('.') || plural.is_empty() || builtin_group(group) {
        return None;
    }
    Some(&key[.."/registry/".len() + group.len() + 1 + plural.len() + 1])
}

fn intern(s: &str) -> &'static str {
    static SET: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = SET.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = set.get(s) {
        return s;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

fn intern_list(items: &[&str]) -> &'static [&'static str] {
    static SET: OnceLock<Mutex<HashSet<&'static [&'static str]>>> = OnceLock::new();
    if items.is_empty() {
        return &[];
    }
    let interned: Vec<&'static str> = items.iter().map(|s| intern(s)).collect();
    let mut set = SET.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = set.get(interned.as_slice()) {
        return s;
    }
    let leaked: &'static [&'static str] = Box::leak(interned.into_boxed_slice());
    set.insert(leaked);
    leaked
}

/// Keeps the registry's custom resources in step with the CRDs in the watch cache: rebuilt
/// at start and after every CRD event (a burst of them, once).
pub async fn follow_crds(state: Arc<crate::state::State>) {
    let Some(crds) = state.registry.find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return;
    };
    let cache = state.cache.resource(crds);
    // Each CRD's types by its name, kept while its resourceVersion is the same: a change
    // to one CRD parses only that one's schemas again.
    let mut built: std::collections::HashMap<String, (i64, Vec<Arc<ResourceType>>)> =
        Default::default();
    loop {
        // Subscribe before reading, so no change falls between the two.
        let sub = cache.subscribe(Some(state.cache.revision()), &crds.prefix());
        let listed = cache.list(&crds.prefix(), None);
        let mut next = std::collections::HashMap::with_capacity(listed.len());
        let mut types = Vec::new();
        for o in &listed {
            let entry = match built.remove(&o.name) {
                Some((rv, t)) if rv == o.rv => (rv, t),
                _ => (o.rv, served_types(&o.value(), |g| state.registry.is_builtin_group(g))),
            };
            types.extend(entry.1.iter().cloned());
            next.insert(o.name.clone(), entry);
        }
        built = next;
        state.registry.set_custom(CustomTypes { types });
        let Ok(mut sub) = sub else {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        };
        if sub.backlog.is_empty() {
            match sub.rx.recv().await {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
        // Drain what else is queued: one rebuild for a burst.
        while sub.rx.try_recv().is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(established: bool) -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false, "deprecated": true},
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.r", "statusReplicasPath": ".status.r"}}},
                    {"name": "v0", "served": false, "storage": false},
                ]},
            "status": {
                "acceptedNames": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wg"], "categories": ["all"]},
                "conditions": [{"type": "Established", "status": if established { "True" } else { "False" }}],
            },
        })
    }

    #[test]
    fn established_crds_serve_their_served_versions_under_the_accepted_names() {
        let crds = [crd(true)];
        let t = CustomTypes::from_crds(&crds, |g| g == "apps");
        assert_eq!(t.all().len(), 2, "v0 is not served");
        let v1 = t.find("example.com", "v1", "widgets").expect("v1");
        assert!(v1.has_status && v1.has_subresource("scale"));
        assert_eq!(v1.desc.short_names, &["wg"]);
        assert_eq!(v1.key(Some("ns"), "a"), "/registry/example.com/widgets/ns/a");
        let beta = t.find("example.com", "v1beta1", "widgets").expect("v1beta1");
        assert_eq!(beta.custom.as_ref().unwrap().storage_version, "v1");
        assert!(beta.custom.as_ref().unwrap().deprecation.is_some());
        assert_eq!(t.find_kind("example.com", "Widget").unwrap().desc.version, "v1");
        assert!(CustomTypes::from_crds(&[crd(false)], |_| false).all().is_empty());
        let mut apps = crd(true);
        apps["spec"]["group"] = json!("apps");
        assert!(CustomTypes::from_crds(&[apps], |g| g == "apps").all().is_empty());
    }

    #[test]
    fn custom_prefixes_and_interning() {
        let builtin = |g: &str| g == "networking.k8s.io";
        assert_eq!(
            custom_prefix("/registry/example.com/widgets/ns/a", builtin),
            Some("/registry/example.com/widgets/")
        );
        assert_eq!(custom_prefix("/registry/networking.k8s.io/x/a", builtin), None);
        assert_eq!(custom_prefix("/registry/core/pods/ns/a", builtin), None);
        assert!(std::ptr::eq(intern("abc"), intern(&String::from("abc"))));
        assert!(std::ptr::eq(intern_list(&["a", "b"]), intern_list(&["a", "b"])));
    }
}
