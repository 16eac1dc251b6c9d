//! apiextensions.k8s.io/v1 CustomResourceDefinitions: upstream's validation of the CRD
//! object itself (`apiextensions/validation`: names, group, scope, versions, exactly one
//! storage version, schemas required and structural, subresources, printer columns,
//! conversion) and the metadata rules of the custom resources a CRD defines.

use serde_json::Value;

use super::field::{FieldError, Path};
use super::names;

pub const GROUP: &str = "apiextensions.k8s.io";

/// The printer column types upstream accepts.
const COLUMN_TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn label_errors(
    errs: &mut Vec<FieldError>,
    path: &Path,
    value: &str,
    what: fn(&str) -> Vec<String>,
) {
    for e in what(value) {
        errs.push(FieldError::invalid(path, value, e));
    }
}

/// Validation of a CRD on create (`old` None) and update.
pub fn validate_crd(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let spec = new.get("spec").unwrap_or(&Value::Null);
    let sp = Path::root("spec");
    let group = spec.get("group").and_then(Value::as_str).unwrap_or_default();
    let names_v = spec.get("names").unwrap_or(&Value::Null);
    let np = sp.child("names");
    let plural = names_v.get("plural").and_then(Value::as_str).unwrap_or_default();

    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            &Path::root("metadata").child("name"),
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required(&sp.child("group"), ""));
    } else {
        label_errors(&mut errs, &sp.child("group"), group, names::is_dns1123_subdomain);
        if group.split('.').count() < 2 {
            errs.push(FieldError::invalid(
                &sp.child("group"),
                group,
                "should be a domain with at least one dot",
            ));
        }
    }
    let scope = spec.get("scope").and_then(Value::as_str).unwrap_or_default();
    match scope {
        "Namespaced" | "Cluster" => {}
        "" => errs.push(FieldError::required(&sp.child("scope"), "")),
        s => {
            errs.push(FieldError::not_supported(&sp.child("scope"), s, &["Cluster", "Namespaced"]))
        }
    }
    validate_names(names_v, &np, &mut errs);

    if spec.get("preserveUnknownFields").and_then(Value::as_bool) == Some(true) {
        errs.push(FieldError::invalid(
            &sp.child("preserveUnknownFields"),
            true,
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        ));
    }

    let versions = spec.get("versions").and_then(Value::as_array).cloned().unwrap_or_default();
    let vp = sp.child("versions");
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            &vp,
            &Value::Array(Vec::new()),
            "must have exactly one version marked as storage version",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut storage = 0;
    for (i, v) in versions.iter().enumerate() {
        let p = vp.index(i);
        let vname = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if vname.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else {
            label_errors(&mut errs, &p.child("name"), vname, names::is_dns1035_label);
            if !seen.insert(vname) {
                errs.push(FieldError::invalid(&vp, vname, "must contain unique version names"));
            }
        }
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage += 1;
        }
        match v.pointer("/schema/openAPIV3Schema") {
            Some(schema) if schema.is_object() => {
                errs.extend(crate::crd::check_structural(
                    schema,
                    &p.child("schema").child("openAPIV3Schema"),
                ));
            }
            _ => errs.push(FieldError::required(
                &p.child("schema").child("openAPIV3Schema"),
                "schemas are required",
            )),
        }
        validate_subresources(v.get("subresources"), &p.child("subresources"), &mut errs);
        validate_columns(
            v.get("additionalPrinterColumns"),
            &p.child("additionalPrinterColumns"),
            &mut errs,
        );
        for (j, f) in
            v.get("selectableFields").and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            let fp = p.child("selectableFields").index(j).child("jsonPath");
            match f.get("jsonPath").and_then(Value::as_str) {
                None | Some("") => errs.push(FieldError::required(&fp, "")),
                Some(path) if !path.starts_with('.') => errs.push(FieldError::invalid(
                    &fp,
                    path,
                    "must be a simple json path starting with .",
                )),
                Some(_) => {}
            }
        }
    }
    if !versions.is_empty() && storage != 1 {
        errs.push(FieldError::invalid(
            &vp,
            &Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    validate_conversion(spec.get("conversion"), &sp.child("conversion"), &mut errs);

    if let Some(old) = old {
        let old_scope = old.pointer("/spec/scope").and_then(Value::as_str).unwrap_or_default();
        if old_scope != scope {
            errs.push(FieldError::invalid(&sp.child("scope"), scope, "field is immutable"));
        }
        let old_group = old.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        if old_group != group {
            errs.push(FieldError::invalid(&sp.child("group"), group, "field is immutable"));
        }
        let old_plural =
            old.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
        if old_plural != plural
            && old.pointer("/status/acceptedNames/plural").and_then(Value::as_str)
                == Some(old_plural)
        {
            errs.push(FieldError::invalid(&np.child("plural"), plural, "field is immutable"));
        }
    }
    // Every stored version must still be defined (status.storedVersions).
    let defined: Vec<&str> = versions.iter().filter_map(|v| v.get("name")?.as_str()).collect();
    let stored = strs(new.pointer("/status/storedVersions"));
    for (i, s) in stored.iter().enumerate() {
        if !defined.contains(s) {
            errs.push(FieldError::invalid(
                &Path::root("status").child("storedVersions").index(i),
                *s,
                "must appear in spec.versions",
            ));
        }
    }
    errs
}

fn validate_names(names_v: &Value, np: &Path, errs: &mut Vec<FieldError>) {
    let get = |k: &str| names_v.get(k).and_then(Value::as_str).unwrap_or_default();
    let plural = get("plural");
    if plural.is_empty() {
        errs.push(FieldError::required(&np.child("plural"), ""));
    } else {
        label_errors(errs, &np.child("plural"), plural, names::is_dns1035_label);
    }
    let singular = get("singular");
    if !singular.is_empty() {
        label_errors(errs, &np.child("singular"), singular, names::is_dns1035_label);
    }
    let kind = get("kind");
    if kind.is_empty() {
        errs.push(FieldError::required(&np.child("kind"), ""));
    } else {
        for e in names::is_dns1035_label(&kind.to_lowercase()) {
            errs.push(FieldError::invalid(&np.child("kind"), kind, e));
        }
    }
    let list_kind = get("listKind");
    if !list_kind.is_empty() {
        for e in names::is_dns1035_label(&list_kind.to_lowercase()) {
            errs.push(FieldError::invalid(&np.child("listKind"), list_kind, e));
        }
        if list_kind == kind {
            errs.push(FieldError::invalid(
                &np.child("listKind"),
                list_kind,
                "kind and listKind may not be the same",
            ));
        }
    }
    for (i, s) in strs(names_v.get("shortNames")).iter().enumerate() {
        label_errors(errs, &np.child("shortNames").index(i), s, names::is_dns1035_label);
    }
    for (i, s) in strs(names_v.get("categories")).iter().enumerate() {
        label_errors(errs, &np.child("categories").index(i), s, names::is_dns1035_label);
    }
}

fn validate_subresources(sub: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let Some(scale) = sub.and_then(|s| s.get("scale")) else { return };
    let sp = p.child("scale");
    match scale.get("specReplicasPath").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(&sp.child("specReplicasPath"), "")),
        Some(path) if !path.starts_with(".spec.") => errs.push(FieldError::invalid(
            &sp.child("specReplicasPath"),
            path,
            "should be a json path under .spec",
        )),
        Some(_) => {}
    }
    match scale.get("statusReplicasPath").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(&sp.child("statusReplicasPath"), "")),
        Some(path) if !path.starts_with(".status.") => errs.push(FieldError::invalid(
            &sp.child("statusReplicasPath"),
            path,
            "should be a json path under .status",
        )),
        Some(_) => {}
    }
    if let Some(path) = scale.get("labelSelectorPath").and_then(Value::as_str)
        && !(path.starts_with(".spec.") || path.starts_with(".status."))
    {
        errs.push(FieldError::invalid(
            &sp.child("labelSelectorPath"),
            path,
            "should be a json path under either .spec or .status",
        ));
    }
}

fn validate_columns(cols: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    for (i, c) in cols.and_then(Value::as_array).into_iter().flatten().enumerate() {
        let cp = p.index(i);
        if c.get("name").and_then(Value::as_str).unwrap_or_default().is_empty() {
            errs.push(FieldError::required(&cp.child("name"), ""));
        }
        match c.get("type").and_then(Value::as_str).unwrap_or_default() {
            "" => errs.push(FieldError::required(&cp.child("type"), "")),
            t if !COLUMN_TYPES.contains(&t) => {
                errs.push(FieldError::not_supported(&cp.child("type"), t, COLUMN_TYPES))
            }
            _ => {}
        }
        if c.get("jsonPath").and_then(Value::as_str).unwrap_or_default().is_empty() {
            errs.push(FieldError::required(&cp.child("jsonPath"), ""));
        }
    }
}

fn validate_conversion(conv: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let Some(conv) = conv else { return };
    match conv.get("strategy").and_then(Value::as_str).unwrap_or("None") {
        "None" => {
            if conv.get("webhook").is_some_and(|w| !w.is_null()) {
                errs.push(FieldError::forbidden(
                    &p.child("webhook"),
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        "Webhook" => {
            let wp = p.child("webhook");
            if conv.pointer("/webhook/clientConfig").is_none_or(Value::is_null) {
                errs.push(FieldError::required(
                    &wp.child("clientConfig"),
                    "required when strategy is set to Webhook",
                ));
            }
            let versions = strs(conv.pointer("/webhook/conversionReviewVersions"));
            if versions.is_empty() {
                errs.push(FieldError::required(
                    &wp.child("conversionReviewVersions"),
                    "must include at least one of v1, v1beta1",
                ));
            } else if !versions.iter().any(|v| matches!(*v, "v1" | "v1beta1")) {
                errs.push(FieldError::invalid(
                    &wp.child("conversionReviewVersions"),
                    super::field::go_string_list(
                        &versions.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                    ),
                    "must include at least one of v1, v1beta1",
                ));
            }
        }
        s => errs.push(FieldError::not_supported(&p.child("strategy"), s, &["None", "Webhook"])),
    }
}

/// Upstream's `SetDefaults_CustomResourceDefinitionSpec` (v1): the singular name is the
/// kind in lower case, the list kind `<Kind>List`, conversion `None`, and a conversion
/// webhook's service port 443 (`SetDefaults_ServiceReference`).
pub(crate) fn default_crd(obj: &mut serde_json::Map<String, Value>) {
    use super::value::{default_ptr, ensure};
    let Some(spec) = ensure(obj, "spec") else { return };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        let empty = |v: &Value| v.as_str().is_none_or(str::is_empty);
        if !kind.is_empty() && names.get("singular").is_none_or(empty) {
            names.insert("singular".into(), kind.to_lowercase().into());
        }
        if !kind.is_empty() && names.get("listKind").is_none_or(empty) {
            names.insert("listKind".into(), format!("{kind}List").into());
        }
    }
    let Some(conversion) = ensure(spec, "conversion") else { return };
    default_ptr(conversion, "strategy", "None");
    if let Some(service) = conversion
        .get_mut("webhook")
        .and_then(|w| w.get_mut("clientConfig"))
        .and_then(|c| c.get_mut("service"))
        .and_then(Value::as_object_mut)
    {
        default_ptr(service, "port", 443);
    }
}

/// The finalizer a CRD is created with: its objects are deleted before it goes.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Create: the status is the server's (upstream's strategy clears it), and the CRD gets
/// the cleanup finalizer.
pub(crate) fn prepare_crd_create(obj: &mut serde_json::Map<String, Value>) {
    obj.insert("status".into(), serde_json::json!({}));
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let finalizers = meta.entry("finalizers").or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = finalizers.as_array_mut()
            && !list.iter().any(|f| f == CLEANUP_FINALIZER)
        {
            list.push(CLEANUP_FINALIZER.into());
        }
    }
}

/// A custom resource decoded from a request: the fields its schema does not know pruned
/// (their paths returned, for fieldValidation's warnings or errors), then nulls where the
/// schema allows none dropped and the defaults applied, as upstream's decoder does.
pub fn decode_custom(schema: &crate::crd::Structural, obj: &mut Value) -> Vec<String> {
    let pruned = crate::crd::prune(schema, obj);
    crate::crd::prune_non_nullable_nulls(schema, obj);
    crate::crd::apply_defaults(schema, obj);
    pruned
}

/// The schema's validation of a custom resource (after the metadata checks), then its
/// `x-kubernetes-validations` rules with `old` (the stored object, on update) for the
/// transition rules. As upstream, the rules are not run when the schema found a value of
/// the wrong type (they would see a value their schema does not describe): one error says
/// so instead.
pub fn validate_custom(
    schema: &crate::crd::Structural,
    obj: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    let mut errs = crate::crd::validate(schema, obj, &Path::root(""));
    if !schema.rules.below && schema.rules.compiled.is_empty() {
        return errs;
    }
    if errs.iter().any(|e| e.detail.contains(" must be of type ")) {
        errs.push(FieldError::invalid(
            &Path::root(""),
            "null",
            "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ));
    } else {
        crate::crd::validate_rules(schema, obj, old, &mut errs);
    }
    errs
}

/// The metadata rules of a custom resource (upstream validates custom objects' names as
/// DNS subdomains, as most built-in kinds).
pub fn validate_custom_meta(namespaced: bool, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let meta = |v: &Value| -> Result<ObjectMeta, Vec<FieldError>> {
        super::kind::typed(v.get("metadata").unwrap_or(&Value::Null))
    };
    let (new_meta, old_meta) = match (meta(new), old.map(meta).transpose()) {
        (Ok(n), Ok(o)) => (n, o),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let path = Path::root("metadata");
    let mut errs = super::meta::validate_object_meta(
        &new_meta,
        namespaced,
        super::meta::NameRule::Subdomain,
        &path,
    );
    if let Some(old) = &old_meta {
        errs.extend(super::meta::validate_object_meta_update(&new_meta, old, &path));
    }
    errs
}

/// Update of a custom resource: `metadata.generation` + 1 when anything but metadata (and
/// status, with a status subresource) changed, as upstream's custom resource strategy.
pub fn bump_custom_generation(has_status: bool, new: &mut Value, old: &Value) {
    let differs = |k: &str| new.get(k) != old.get(k);
    let changed = match (new.as_object(), old.as_object()) {
        (Some(n), Some(o)) => n
            .keys()
            .chain(o.keys())
            .filter(|k| *k != "metadata" && !(has_status && *k == "status"))
            .any(|k| differs(k)),
        _ => false,
    };
    let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
    if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("generation".into(), (if changed { generation + 1 } else { generation }).into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}],
            },
        })
    }

    fn fields(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| format!("{}: {}", e.field, e.detail)).collect()
    }

    #[test]
    fn spec_defaults_as_upstream() {
        let mut c = crd();
        c["spec"]["names"] = json!({"plural": "widgets", "kind": "Widget"});
        default_crd(c.as_object_mut().unwrap());
        assert_eq!(c["spec"]["names"]["singular"], "widget");
        assert_eq!(c["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(c["spec"]["conversion"], json!({"strategy": "None"}));
        c["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "ns", "name": "conv"}}}});
        default_crd(c.as_object_mut().unwrap());
        assert_eq!(c["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["port"], 443);
        assert_eq!(c["spec"]["conversion"]["strategy"], "Webhook");
        assert_eq!(fields(&validate_crd(&c, None)), Vec::<String>::new());
    }

    #[test]
    fn a_valid_crd_passes() {
        assert_eq!(fields(&validate_crd(&crd(), None)), Vec::<String>::new());
    }

    #[test]
    fn names_group_versions_and_storage_are_checked() {
        let mut c = crd();
        c["metadata"]["name"] = json!("gadgets.example.com");
        c["spec"]["group"] = json!("example");
        c["spec"]["scope"] = json!("Global");
        c["spec"]["names"]["plural"] = json!("Widgets");
        c["spec"]["versions"] = json!([
            {"name": "v1", "served": true, "storage": true},
            {"name": "v1", "served": true, "storage": true,
             "schema": {"openAPIV3Schema": {"type": "object"}}},
        ]);
        let got = fields(&validate_crd(&c, None));
        for want in [
            "metadata.name: must be spec.names.plural+\".\"+spec.group",
            "spec.group: should be a domain with at least one dot",
            "spec.scope: supported values: \"Cluster\", \"Namespaced\"",
            "spec.versions[0].schema.openAPIV3Schema: schemas are required",
            "spec.versions: must contain unique version names",
            "spec.versions: must have exactly one version marked as storage version",
        ] {
            assert!(
                got.iter().any(|g| g.starts_with(want.split(':').next().unwrap())
                    && g.contains(want.split(": ").nth(1).unwrap())),
                "{want} not in {got:#?}"
            );
        }
        assert!(got.iter().any(|g| g.starts_with("spec.names.plural:")), "{got:#?}");
    }

    #[test]
    fn scope_is_immutable_and_stored_versions_must_exist() {
        let old = crd();
        let mut new = crd();
        new["spec"]["scope"] = json!("Cluster");
        new["status"] = json!({"storedVersions": ["v1beta1"]});
        let got = fields(&validate_crd(&new, Some(&old)));
        assert!(got.contains(&"spec.scope: field is immutable".to_string()), "{got:#?}");
        assert!(
            got.contains(&"status.storedVersions[0]: must appear in spec.versions".to_string()),
            "{got:#?}"
        );
    }

    #[test]
    fn custom_generation_follows_non_metadata_changes() {
        let old = json!({"metadata": {"name": "a", "generation": 3}, "spec": {"a": 1}, "status": {"x": 1}});
        let mut same = old.clone();
        same["status"]["x"] = json!(2);
        bump_custom_generation(true, &mut same, &old);
        assert_eq!(same["metadata"]["generation"], 3, "a status change with a status subresource");
        let mut status = old.clone();
        status["status"]["x"] = json!(2);
        bump_custom_generation(false, &mut status, &old);
        assert_eq!(
            status["metadata"]["generation"], 4,
            "status is content without the subresource"
        );
        let mut spec = old.clone();
        spec["spec"]["a"] = json!(2);
        bump_custom_generation(true, &mut spec, &old);
        assert_eq!(spec["metadata"]["generation"], 4);
    }
}
