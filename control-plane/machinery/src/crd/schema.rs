//! Structural schemas: the parsed tree ([`Structural`]), the checks a CRD's
//! `openAPIV3Schema` must pass ([`check_structural`]), and re-exports of the algorithms
//! that run on custom resources ([`validate`], [`prune`], [`apply_defaults`],
//! [`prune_non_nullable_nulls`]).
//!
//! Upstream: `k8s.io/apiextensions-apiserver` `pkg/apiserver/schema` (`structural.go`,
//! `convert.go`, `validation.go`, `complete.go`), `pkg/apiserver/schema/defaulting`
//! (`validation.go`) and `pkg/apis/apiextensions/validation` (the part of
//! `ValidateCustomResourceDefinitionOpenAPISchema` that does not compile CEL), with the
//! options a new `apiextensions.k8s.io/v1` CRD is validated with (structural schema,
//! valid property types, atomic set items, map-list key rules and pruned defaults all
//! required).

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;
use serde_json::{Map, Value};

use super::{cel, formats, gofmt, pruning, validation};
use crate::admission::{FieldError, Path, aggregate};

pub use super::pruning::{apply_defaults, prune, prune_non_nullable_nulls};
pub use super::validation::validate;

/// One node of a structural schema (upstream `schema.Structural`), with the value
/// validation, the Kubernetes extensions and the generic fields of the JSONSchemaProps it
/// came from.
///
/// Logic junctors (`allOf`, `anyOf`, `oneOf`, `not`) hold nodes of the same type; in a
/// schema accepted by [`check_structural`] they only carry value validation (and the
/// `x-kubernetes-int-or-string` `anyOf: [{type: integer}, {type: string}]` pattern).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Structural {
    /// `type`: `object`, `array`, `string`, `integer`, `number`, `boolean`; empty when
    /// unspecified (allowed with `x-kubernetes-int-or-string` or
    /// `x-kubernetes-preserve-unknown-fields`).
    pub ty: String,
    /// `format`, as written (validation ignores formats upstream does not support).
    pub format: String,
    pub description: String,
    pub title: String,
    /// `nullable`: `null` is a valid value (and survives [`prune_non_nullable_nulls`]).
    pub nullable: bool,
    /// `default` (a JSON `null` default counts as none).
    pub default: Option<Value>,
    pub example: Option<Value>,
    /// `externalDocs`, kept as written.
    pub external_docs: Option<Value>,
    /// `properties`, ordered by name.
    pub properties: BTreeMap<String, Structural>,
    /// `additionalProperties`: a schema, or `true`/`false`.
    pub additional_properties: Option<AdditionalProperties>,
    /// `items` (a single schema; arrays of schemas are rejected by [`check_structural`]).
    pub items: Option<Box<Structural>>,
    /// `x-kubernetes-preserve-unknown-fields: true`: pruning keeps fields the schema does not
    /// specify (below this node, until a node with `properties` or `additionalProperties`).
    pub x_preserve_unknown_fields: bool,
    /// `x-kubernetes-embedded-resource`: the value is a whole object with `apiVersion`,
    /// `kind` and `metadata`.
    pub x_embedded_resource: bool,
    /// `x-kubernetes-int-or-string`: an integer or a string.
    pub x_int_or_string: bool,
    /// `x-kubernetes-list-type` as written (`atomic`, `set` or `map`).
    pub x_list_type: Option<String>,
    /// `x-kubernetes-list-map-keys`.
    pub x_list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type` as written (`granular` or `atomic`).
    pub x_map_type: Option<String>,
    /// `x-kubernetes-validations`, the raw rules.
    pub x_validations: Vec<Value>,
    /// The rules compiled (once, when the schema is parsed with [`Structural::from_value`]),
    /// and whether nodes below have rules.
    pub rules: cel::Rules,
    /// The value validation keywords.
    pub validation: ValueValidation,
}

/// `additionalProperties`: upstream's `StructuralOrBool`.
#[derive(Debug, Clone, PartialEq)]
pub enum AdditionalProperties {
    Bool(bool),
    Schema(Box<Structural>),
}

impl AdditionalProperties {
    /// The schema of the map's values, if one is given.
    pub fn schema(&self) -> Option<&Structural> {
        match self {
            Self::Schema(s) => Some(s),
            Self::Bool(_) => None,
        }
    }
}

/// The value validation of a node (upstream `schema.ValueValidation`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueValidation {
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    /// In Unicode code points, as upstream counts.
    pub max_length: Option<i64>,
    pub min_length: Option<i64>,
    pub pattern: Option<Pattern>,
    pub max_items: Option<i64>,
    pub min_items: Option<i64>,
    pub unique_items: bool,
    pub multiple_of: Option<f64>,
    /// `enum` (empty: no restriction).
    pub enum_values: Vec<Value>,
    pub max_properties: Option<i64>,
    pub min_properties: Option<i64>,
    pub required: Vec<String>,
    pub all_of: Vec<Structural>,
    pub any_of: Vec<Structural>,
    pub one_of: Vec<Structural>,
    pub not: Option<Box<Structural>>,
}

/// A `pattern`, compiled with Go's regular expression semantics (RE2, unanchored).
#[derive(Clone)]
pub struct Pattern {
    source: String,
    compiled: Result<Regex, String>,
}

impl Pattern {
    /// Compiles `source`; an invalid expression is kept with its error (which
    /// [`check_structural`] reports).
    pub fn new(source: &str) -> Self {
        Self { source: source.to_string(), compiled: formats::compile_go_regex(source) }
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The compile error, if the expression is invalid.
    pub fn error(&self) -> Option<&str> {
        self.compiled.as_ref().err().map(String::as_str)
    }

    /// Whether the expression matches somewhere in `s` (`None` if it does not compile).
    pub fn is_match(&self, s: &str) -> Option<bool> {
        self.compiled.as_ref().ok().map(|re| re.is_match(s))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pattern").field(&self.source).finish()
    }
}

/// `x-kubernetes-list-type`, as server-side apply reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Replaced as a whole (the default).
    Atomic,
    /// Unique scalar (or atomic) items.
    Set,
    /// Items identified by `x-kubernetes-list-map-keys`.
    Map,
}

/// `x-kubernetes-map-type`, as server-side apply reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapType {
    /// Fields owned separately (the default).
    Granular,
    /// Replaced as a whole.
    Atomic,
}

impl Structural {
    /// Parses and checks a CRD version's `openAPIV3Schema` (the JSONSchemaProps JSON): the
    /// errors of [`check_structural`] under the path `openAPIV3Schema`, or the tree.
    pub fn from_value(schema: &Value) -> Result<Self, Vec<FieldError>> {
        let (errs, parsed) = analyze(schema, &Path::root("openAPIV3Schema"));
        match parsed {
            Some(s) if errs.is_empty() => Ok(s),
            _ => Err(errs),
        }
    }

    /// The schema of a field of this object: its property, else the `additionalProperties`
    /// schema.
    pub fn child(&self, field: &str) -> Option<&Structural> {
        self.properties
            .get(field)
            .or_else(|| self.additional_properties.as_ref().and_then(AdditionalProperties::schema))
    }

    /// The schema of this array's items.
    pub fn items(&self) -> Option<&Structural> {
        self.items.as_deref()
    }

    /// `x-kubernetes-list-type`; atomic when unset (or not one of the three).
    pub fn list_type(&self) -> ListType {
        match self.x_list_type.as_deref() {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map,
            _ => ListType::Atomic,
        }
    }

    /// `x-kubernetes-list-map-keys` (meaningful for [`ListType::Map`]).
    pub fn list_map_keys(&self) -> &[String] {
        &self.x_list_map_keys
    }

    /// `x-kubernetes-map-type`; granular when unset.
    pub fn map_type(&self) -> MapType {
        match self.x_map_type.as_deref() {
            Some("atomic") => MapType::Atomic,
            _ => MapType::Granular,
        }
    }
}

/// Checks a CRD version's `openAPIV3Schema` (`schema`, the JSONSchemaProps JSON) as the
/// apiserver does for a new `apiextensions.k8s.io/v1` CRD, with field paths under `path`
/// (`spec.versions[0].schema.openAPIV3Schema`). Returns every error, in upstream's order:
///
/// 1. `nullable` at the root.
/// 2. The structural-schema rules (upstream `ValidateStructural`, sorted like upstream):
///    non-empty `type` except with `x-kubernetes-int-or-string` or
///    `x-kubernetes-preserve-unknown-fields`; `items` for arrays; `type: object` and no
///    `additionalProperties` at the root; `x-kubernetes-embedded-resource` needing
///    `type: object` and `properties` or `x-kubernetes-preserve-unknown-fields`; root
///    `metadata` restricted to `type: object` and `properties` `name`/`generateName`;
///    `kind`/`apiVersion` of type string; logic junctors (`allOf`/`anyOf`/`oneOf`/`not`)
///    without `type`, `default`, `additionalProperties`, `nullable`, `title`,
///    `description`, `x-kubernetes-*` or `metadata`, except the int-or-string patterns;
///    every field and `items` named in the root's junctors also in the structural part
///    (upstream checks this completeness for the junctors of the root node only, and so
///    does this); `pattern` a valid regular expression.
///    When these pass: every `default` valid against its schema (upstream
///    `ValidateDefaults`): pruned (no unknown fields), a valid embedded object where it is
///    one, and defaults under an embedded resource's `apiVersion`/`kind`/`metadata`
///    resulting in valid metadata. Defaults under `additionalProperties` and in junctors
///    are not checked, as upstream.
/// 3. The CRD-schema rules (upstream `ValidateCustomResourceDefinitionOpenAPISchema`):
///    the six types; no `type: null`; no `id`, `$ref`, `definitions`, `dependencies`,
///    `additionalItems`, `patternProperties`, `uniqueItems: true`, `items` arrays;
///    `properties` and `additionalProperties` mutually exclusive; `default` forbidden in
///    top-level `apiVersion`/`kind`/`metadata` and in `additionalProperties` under
///    resource metadata; no embedded resources inside resource metadata;
///    `x-kubernetes-preserve-unknown-fields` true or absent; `x-kubernetes-map-type`
///    (`atomic`/`granular`) only on objects; `x-kubernetes-list-type`
///    (`atomic`/`set`/`map`) only on arrays, `set` items atomic, `map` with
///    `x-kubernetes-list-map-keys` naming scalar, required-or-defaulted, non-nullable
///    properties of object items, set/map items not nullable; the non-CEL checks of
///    `x-kubernetes-validations` rules (`rule`, `message`, `messageExpression`, `reason`,
///    `fieldPath`).
/// 4. If nothing else was found, the fields upstream's structural conversion refuses
///    (`$schema` is the one not reported above).
///
/// Keywords of the wrong JSON type (`"type": 5`) are reported alone (upstream rejects such
/// a CRD when decoding it, with a 400, before any of this).
pub fn check_structural(schema: &Value, path: &Path) -> Vec<FieldError> {
    analyze(schema, path).0
}

/// The checks of [`check_structural`], and the parsed tree when the JSON types were right.
fn analyze(raw: &Value, path: &Path) -> (Vec<FieldError>, Option<Structural>) {
    let mut errs = Vec::new();
    decode_errors(raw, path, &mut errs);
    if !errs.is_empty() {
        return (errs, None);
    }
    let Some(m) = raw.as_object() else {
        return (errs, None);
    };
    if m.get("nullable").and_then(Value::as_bool) == Some(true) {
        errs.push(FieldError::forbidden(
            &path.child("nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let s = parse(raw);
    let unsupported = unsupported_field(raw);
    if unsupported.is_none() {
        let mut structural = Vec::new();
        invariants(&s, Level::Root, path, &mut structural);
        completeness(&s.validation, Some(&s), path, path, &mut structural);
        structural.sort_by_cached_key(ToString::to_string);
        if structural.is_empty() {
            defaults(&s, path, &s, true, &[], false, &mut errs);
        } else {
            errs.extend(structural);
        }
    }
    openapi_errors(m, path, &Ssv::default(), true, &mut errs);
    if errs.is_empty()
        && let Some(msg) = unsupported
    {
        errs.push(FieldError::invalid(path, "", msg));
    }
    let mut s = s;
    if errs.is_empty() {
        // Upstream compiles the rules only where the schema is otherwise valid.
        cel::compile_tree(&mut s);
        errs.extend(cel::rule_errors(&s, path));
    }
    (errs, Some(s))
}

// ---------------------------------------------------------------------------------------
// JSON types of the keywords

#[derive(Clone, Copy)]
enum Kind {
    String,
    Bool,
    Number,
    Integer,
    Any,
    Array,
    Strings,
    Schema,
    Schemas,
    SchemaMap,
    SchemaOrBool,
    SchemaOrArray,
    Dependencies,
    ExternalDocs,
    Rules,
}

fn keyword_kind(k: &str) -> Option<Kind> {
    Some(match k {
        "id"
        | "$schema"
        | "$ref"
        | "description"
        | "type"
        | "format"
        | "title"
        | "pattern"
        | "x-kubernetes-list-type"
        | "x-kubernetes-map-type" => Kind::String,
        "exclusiveMaximum"
        | "exclusiveMinimum"
        | "uniqueItems"
        | "nullable"
        | "x-kubernetes-preserve-unknown-fields"
        | "x-kubernetes-embedded-resource"
        | "x-kubernetes-int-or-string" => Kind::Bool,
        "maximum" | "minimum" | "multipleOf" => Kind::Number,
        "maxLength" | "minLength" | "maxItems" | "minItems" | "maxProperties" | "minProperties" => {
            Kind::Integer
        }
        "default" | "example" => Kind::Any,
        "enum" => Kind::Array,
        "required" | "x-kubernetes-list-map-keys" => Kind::Strings,
        "not" => Kind::Schema,
        "allOf" | "anyOf" | "oneOf" => Kind::Schemas,
        "properties" | "definitions" | "patternProperties" => Kind::SchemaMap,
        "additionalProperties" | "additionalItems" => Kind::SchemaOrBool,
        "items" => Kind::SchemaOrArray,
        "dependencies" => Kind::Dependencies,
        "externalDocs" => Kind::ExternalDocs,
        "x-kubernetes-validations" => Kind::Rules,
        _ => return None,
    })
}

fn wrong(errs: &mut Vec<FieldError>, path: &Path, v: &Value, what: &str) {
    errs.push(FieldError::invalid(path, v, format!("must be {what}")));
}

fn decode_strings(v: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    match v.as_array() {
        Some(a) => {
            for (i, x) in a.iter().enumerate() {
                if !x.is_string() {
                    wrong(errs, &path.index(i), x, "a string");
                }
            }
        }
        None => wrong(errs, path, v, "an array of strings"),
    }
}

/// Keywords of the wrong JSON type, where decoding into upstream's JSONSchemaProps fails.
/// Unknown keywords are not errors here (strict field validation of the CRD is the
/// decoder's business).
fn decode_errors(v: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(m) = v.as_object() else {
        wrong(errs, path, v, "an object");
        return;
    };
    for (k, x) in m {
        let Some(kind) = keyword_kind(k) else { continue };
        if x.is_null() {
            continue;
        }
        let p = path.child(k);
        match kind {
            Kind::String if !x.is_string() => wrong(errs, &p, x, "a string"),
            Kind::Bool if !x.is_boolean() => wrong(errs, &p, x, "a boolean"),
            Kind::Number if !x.is_number() => wrong(errs, &p, x, "a number"),
            Kind::Integer if x.as_i64().is_none() => wrong(errs, &p, x, "an integer"),
            Kind::Array if !x.is_array() => wrong(errs, &p, x, "an array"),
            Kind::Strings => decode_strings(x, &p, errs),
            Kind::Schema => decode_errors(x, &p, errs),
            Kind::Schemas => match x.as_array() {
                Some(a) => {
                    for (i, s) in a.iter().enumerate() {
                        decode_errors(s, &p.index(i), errs);
                    }
                }
                None => wrong(errs, &p, x, "an array"),
            },
            Kind::SchemaMap => match x.as_object() {
                Some(props) => {
                    for (name, s) in props {
                        decode_errors(s, &p.key(name), errs);
                    }
                }
                None => wrong(errs, &p, x, "an object"),
            },
            Kind::SchemaOrBool if !x.is_boolean() => {
                if x.is_object() {
                    decode_errors(x, &p, errs);
                } else {
                    wrong(errs, &p, x, "an object or a boolean");
                }
            }
            Kind::SchemaOrArray => match x {
                Value::Object(_) => decode_errors(x, &p, errs),
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        decode_errors(s, &p.index(i), errs);
                    }
                }
                _ => wrong(errs, &p, x, "an object or an array"),
            },
            Kind::Dependencies => match x.as_object() {
                Some(deps) => {
                    for (name, d) in deps {
                        if d.is_array() {
                            decode_strings(d, &p.key(name), errs);
                        } else {
                            decode_errors(d, &p.key(name), errs);
                        }
                    }
                }
                None => wrong(errs, &p, x, "an object"),
            },
            Kind::ExternalDocs => match x.as_object() {
                Some(d) => {
                    for f in ["description", "url"] {
                        if let Some(s) = d.get(f).filter(|s| !s.is_null() && !s.is_string()) {
                            wrong(errs, &p.child(f), s, "a string");
                        }
                    }
                }
                None => wrong(errs, &p, x, "an object"),
            },
            Kind::Rules => match x.as_array() {
                Some(rules) => {
                    for (i, r) in rules.iter().enumerate() {
                        let rp = p.index(i);
                        let Some(r) = r.as_object() else {
                            wrong(errs, &rp, r, "an object");
                            continue;
                        };
                        for (f, fv) in r {
                            if fv.is_null() {
                                continue;
                            }
                            match f.as_str() {
                                "rule" | "message" | "messageExpression" | "reason"
                                | "fieldPath"
                                    if !fv.is_string() =>
                                {
                                    wrong(errs, &rp.child(f), fv, "a string");
                                }
                                "optionalOldSelf" if !fv.is_boolean() => {
                                    wrong(errs, &rp.child(f), fv, "a boolean");
                                }
                                _ => {}
                            }
                        }
                    }
                }
                None => wrong(errs, &p, x, "an array"),
            },
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// Parsing (of JSON already checked by `decode_errors`)

fn present<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    m.get(k).filter(|v| !v.is_null())
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

/// Upstream `NewStructural` (lenient: forbidden constructs are dropped; the checks report
/// them).
pub(crate) fn parse(v: &Value) -> Structural {
    let Some(m) = v.as_object() else {
        return Structural::default();
    };
    let string = |k: &str| present(m, k).and_then(Value::as_str).unwrap_or_default().to_string();
    let flag = |k: &str| present(m, k).and_then(Value::as_bool).unwrap_or(false);
    let float = |k: &str| present(m, k).and_then(Value::as_f64);
    let int = |k: &str| present(m, k).and_then(Value::as_i64);
    let schemas = |k: &str| -> Vec<Structural> {
        present(m, k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(parse).collect())
            .unwrap_or_default()
    };
    let schema = |k: &str| present(m, k).filter(|v| v.is_object()).map(|v| Box::new(parse(v)));
    Structural {
        ty: string("type"),
        format: string("format"),
        description: string("description"),
        title: string("title"),
        nullable: flag("nullable"),
        default: present(m, "default").cloned(),
        example: present(m, "example").cloned(),
        external_docs: present(m, "externalDocs").cloned(),
        properties: present(m, "properties")
            .and_then(Value::as_object)
            .map(|p| p.iter().map(|(k, v)| (k.clone(), parse(v))).collect())
            .unwrap_or_default(),
        additional_properties: match present(m, "additionalProperties") {
            Some(Value::Bool(b)) => Some(AdditionalProperties::Bool(*b)),
            Some(o @ Value::Object(_)) => Some(AdditionalProperties::Schema(Box::new(parse(o)))),
            _ => None,
        },
        items: schema("items"),
        x_preserve_unknown_fields: flag("x-kubernetes-preserve-unknown-fields"),
        x_embedded_resource: flag("x-kubernetes-embedded-resource"),
        x_int_or_string: flag("x-kubernetes-int-or-string"),
        x_list_type: present(m, "x-kubernetes-list-type").and_then(Value::as_str).map(String::from),
        x_list_map_keys: strings(present(m, "x-kubernetes-list-map-keys")),
        x_map_type: present(m, "x-kubernetes-map-type").and_then(Value::as_str).map(String::from),
        x_validations: present(m, "x-kubernetes-validations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        rules: cel::Rules::default(),
        validation: ValueValidation {
            maximum: float("maximum"),
            exclusive_maximum: flag("exclusiveMaximum"),
            minimum: float("minimum"),
            exclusive_minimum: flag("exclusiveMinimum"),
            max_length: int("maxLength"),
            min_length: int("minLength"),
            pattern: present(m, "pattern")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .map(Pattern::new),
            max_items: int("maxItems"),
            min_items: int("minItems"),
            unique_items: flag("uniqueItems"),
            multiple_of: float("multipleOf"),
            enum_values: present(m, "enum").and_then(Value::as_array).cloned().unwrap_or_default(),
            max_properties: int("maxProperties"),
            min_properties: int("minProperties"),
            required: strings(present(m, "required")),
            all_of: schemas("allOf"),
            any_of: schemas("anyOf"),
            one_of: schemas("oneOf"),
            not: schema("not"),
        },
    }
}

/// The first field upstream's `NewStructural` refuses (its error text), in its order.
fn unsupported_field(v: &Value) -> Option<String> {
    let m = v.as_object()?;
    let set = |k: &str| match present(m, k) {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
        None => false,
    };
    for (key, name) in [
        ("id", "id"),
        ("$schema", "schema"),
        ("$ref", "$ref"),
        ("patternProperties", "patternProperties"),
        ("dependencies", "dependencies"),
        ("additionalItems", "additionalItems"),
        ("definitions", "definitions"),
    ] {
        if set(key) {
            return Some(format!("OpenAPIV3Schema '{name}' is not supported"));
        }
    }
    let nested = |k: &str| -> Option<String> {
        present(m, k).and_then(Value::as_array)?.iter().find_map(unsupported_field)
    };
    if let Some(e) = present(m, "not").and_then(unsupported_field) {
        return Some(e);
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        if let Some(e) = nested(k) {
            return Some(e);
        }
    }
    if present(m, "x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(false) {
        return Some(
            "internal error: 'x-kubernetes-preserve-unknown-fields' must be true or undefined"
                .into(),
        );
    }
    match present(m, "items") {
        Some(Value::Array(a)) if !a.is_empty() => {
            return Some("OpenAPIV3Schema 'items' must be a schema, but is an array".into());
        }
        Some(i) => {
            if let Some(e) = unsupported_field(i) {
                return Some(e);
            }
        }
        None => {}
    }
    if let Some(props) = present(m, "properties").and_then(Value::as_object)
        && let Some(e) = props.values().find_map(unsupported_field)
    {
        return Some(e);
    }
    present(m, "additionalProperties").filter(|a| a.is_object()).and_then(unsupported_field)
}

// ---------------------------------------------------------------------------------------
// Structural invariants (upstream `validateStructuralInvariants`)

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

fn is_only_type(s: &Structural, ty: &str) -> bool {
    *s == Structural { ty: ty.to_string(), ..Structural::default() }
}

/// `anyOf: [{type: integer}, {type: string}]` exactly.
fn is_int_or_string_any_of(any_of: &[Structural]) -> bool {
    any_of.len() == 2 && is_only_type(&any_of[0], "integer") && is_only_type(&any_of[1], "string")
}

fn invariants(s: &Structural, lvl: Level, path: &Path, errs: &mut Vec<FieldError>) {
    if s.ty == "array" && s.items.is_none() {
        errs.push(FieldError::required(&path.child("items"), "must be specified"));
    }
    if let Some(items) = &s.items {
        invariants(items, Level::Item, &path.child("items"), errs);
    }
    for (k, v) in &s.properties {
        invariants(v, Level::Field, &path.child("properties").key(k), errs);
    }
    if let Some(ap) = &s.additional_properties {
        if lvl == Level::Root {
            errs.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "must not be used at the root",
            ));
        }
        if let AdditionalProperties::Schema(sub) = ap {
            invariants(sub, Level::Field, &path.child("additionalProperties"), errs);
        }
    }

    if s.x_int_or_string && s.x_preserve_unknown_fields {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if s.x_int_or_string && s.x_embedded_resource {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-embedded-resource"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }

    let skip_any_of = is_int_or_string_any_of(&s.validation.any_of);
    let skip_first_all_of_any_of =
        s.validation.all_of.first().is_some_and(|a| is_int_or_string_any_of(&a.validation.any_of));
    value_validation_invariants(
        &s.validation,
        skip_any_of,
        skip_first_all_of_any_of,
        lvl,
        path,
        errs,
    );

    let check_metadata = lvl == Level::Root || s.x_embedded_resource;
    let type_path = path.child("type");
    if s.x_embedded_resource && s.ty != "object" {
        let detail = "must be object if x-kubernetes-embedded-resource is true";
        if s.ty.is_empty() {
            errs.push(FieldError::required(&type_path, detail));
        } else {
            errs.push(FieldError::invalid(&type_path, &s.ty, detail));
        }
    } else if s.ty.is_empty() && !s.x_int_or_string && !s.x_preserve_unknown_fields {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required(&type_path, detail));
    }
    if s.x_embedded_resource && s.additional_properties.is_some() {
        errs.push(FieldError::forbidden(
            &path.child("additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !s.ty.is_empty() && s.ty != "object" {
        errs.push(FieldError::invalid(&type_path, &s.ty, "must be object at the root"));
    }
    if check_metadata {
        for field in ["kind", "apiVersion"] {
            if let Some(p) = s.properties.get(field)
                && p.ty != "string"
            {
                errs.push(FieldError::invalid(
                    &path.child("properties").key(field).child("type"),
                    &p.ty,
                    "must be string",
                ));
            }
        }
    }
    if let Some(meta) = s.properties.get("metadata") {
        let mp = path.child("properties").key("metadata");
        if check_metadata && meta.ty != "object" {
            errs.push(FieldError::invalid(&mp.child("type"), &meta.ty, "must be object"));
        }
        if lvl == Level::Root {
            // Only `type` and the `name`/`generateName` properties may be given (their own
            // schemas are checked like any other field's).
            let mut rest = meta.clone();
            let name = rest.properties.contains_key("name");
            let generate_name = rest.properties.contains_key("generateName");
            let n = rest.properties.len();
            if (name && generate_name && n == 2) || ((name || generate_name) && n == 1) {
                rest.properties.clear();
            }
            rest.ty.clear();
            rest.default = None;
            if rest != Structural::default() {
                errs.push(FieldError::forbidden(
                    &mp,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if s.x_embedded_resource && !s.x_preserve_unknown_fields && s.properties.is_empty() {
        errs.push(FieldError::required(
            &path.child("properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

fn value_validation_invariants(
    v: &ValueValidation,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    lvl: Level,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    if !skip_any_of {
        for (i, x) in v.any_of.iter().enumerate() {
            nested_invariants(x, false, lvl, &path.child("anyOf").index(i), errs);
        }
    }
    for (i, x) in v.all_of.iter().enumerate() {
        let skip = skip_first_all_of_any_of && i == 0;
        nested_invariants(x, skip, lvl, &path.child("allOf").index(i), errs);
    }
    for (i, x) in v.one_of.iter().enumerate() {
        nested_invariants(x, false, lvl, &path.child("oneOf").index(i), errs);
    }
    if let Some(x) = &v.not {
        nested_invariants(x, false, lvl, &path.child("not"), errs);
    }
    if let Some(p) = &v.pattern
        && let Some(e) = p.error()
    {
        errs.push(FieldError::invalid(
            &path.child("pattern"),
            p.as_str(),
            format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
}

/// Upstream `validateNestedValueValidation`: a node under a logic junctor.
fn nested_invariants(
    s: &Structural,
    skip_any_of: bool,
    lvl: Level,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    value_validation_invariants(&s.validation, skip_any_of, false, lvl, path, errs);
    if let Some(items) = &s.items {
        nested_invariants(items, false, lvl, &path.child("items"), errs);
    }
    for (k, v) in &s.properties {
        nested_invariants(v, false, Level::Field, &path.child("properties").key(k), errs);
    }
    let forbid = |errs: &mut Vec<FieldError>, field: &str, detail: &str| {
        errs.push(FieldError::forbidden(&path.child(field), detail));
    };
    if !s.ty.is_empty() {
        forbid(errs, "type", "must be empty to be structural");
    }
    // `additionalProperties: false` under a junctor is dropped by upstream's conversion.
    if matches!(
        s.additional_properties,
        Some(AdditionalProperties::Schema(_) | AdditionalProperties::Bool(true))
    ) {
        forbid(errs, "additionalProperties", "must be undefined to be structural");
    }
    if s.default.is_some() {
        forbid(errs, "default", "must be undefined to be structural");
    }
    if !s.title.is_empty() {
        forbid(errs, "title", "must be empty to be structural");
    }
    if !s.description.is_empty() {
        forbid(errs, "description", "must be empty to be structural");
    }
    if s.nullable {
        forbid(errs, "nullable", "must be false to be structural");
    }
    if s.x_preserve_unknown_fields {
        forbid(errs, "x-kubernetes-preserve-unknown-fields", "must be false to be structural");
    }
    if s.x_embedded_resource {
        forbid(errs, "x-kubernetes-embedded-resource", "must be false to be structural");
    }
    if s.x_int_or_string {
        forbid(errs, "x-kubernetes-int-or-string", "must be false to be structural");
    }
    if !s.x_list_map_keys.is_empty() {
        forbid(errs, "x-kubernetes-list-map-keys", "must be empty to be structural");
    }
    if s.x_list_type.is_some() {
        forbid(errs, "x-kubernetes-list-type", "must be undefined to be structural");
    }
    if s.x_map_type.is_some() {
        forbid(errs, "x-kubernetes-map-type", "must be undefined to be structural");
    }
    if !s.x_validations.is_empty() {
        forbid(errs, "x-kubernetes-validations", "must be empty to be structural");
    }
    if s.properties.contains_key("metadata") {
        errs.push(FieldError::forbidden(
            &path.child("properties").key("metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// Upstream `validateStructuralCompleteness`: properties and items named in the junctors of
/// `s` must be specified in `s` itself.
fn completeness(
    v: &ValueValidation,
    s: Option<&Structural>,
    s_path: &Path,
    v_path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let Some(s) = s else {
        errs.push(FieldError::required(s_path, format!("because it is defined in {v_path}")));
        return;
    };
    if let Some(n) = &v.not {
        nested_completeness(n, s, s_path, &v_path.child("not"), errs);
    }
    for (name, list) in [("allOf", &v.all_of), ("anyOf", &v.any_of), ("oneOf", &v.one_of)] {
        for (i, x) in list.iter().enumerate() {
            nested_completeness(x, s, s_path, &v_path.child(name).index(i), errs);
        }
    }
}

fn nested_completeness(
    v: &Structural,
    s: &Structural,
    s_path: &Path,
    v_path: &Path,
    errs: &mut Vec<FieldError>,
) {
    completeness(&v.validation, Some(s), s_path, v_path, errs);
    if let Some(vi) = &v.items {
        let (sp, vp) = (s_path.child("items"), v_path.child("items"));
        match &s.items {
            Some(si) => nested_completeness(vi, si, &sp, &vp, errs),
            None => completeness(&vi.validation, None, &sp, &vp, errs),
        }
    }
    for (k, vf) in &v.properties {
        let sp = s_path.child("properties").key(k);
        let vp = v_path.child("properties").key(k);
        match s.properties.get(k) {
            Some(sf) => nested_completeness(vf, sf, &sp, &vp, errs),
            None => errs.push(FieldError::required(&sp, format!("because it is defined in {vp}"))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Defaults (upstream `defaulting.ValidateDefaults`)

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

#[derive(Clone, Copy)]
enum Seg<'a> {
    Child(&'a str),
    Index,
}

/// Checks the defaults at and below `s`. `root` is the schema of the nearest enclosing
/// resource (for defaults inside its metadata), `forced_embedded` whether `s` is the
/// resource root (treated as an embedded resource), `segs` the way from `root` to `s`.
fn defaults<'a>(
    s: &'a Structural,
    path: &Path,
    root: &'a Structural,
    forced_embedded: bool,
    segs: &[Seg<'a>],
    inside_meta: bool,
    errs: &mut Vec<FieldError>,
) {
    let embedded = s.x_embedded_resource || forced_embedded;
    let (root, segs, inside_meta) =
        if embedded { (s, &[][..], false) } else { (root, segs, inside_meta) };
    if let Some(def) = &s.default {
        let dp = path.child("default");
        if inside_meta {
            // The default inside the object it would be set in, with TypeMeta filled in.
            let mut obj = def.clone();
            for seg in segs.iter().rev() {
                obj = match seg {
                    Seg::Child(k) => Value::Object(Map::from_iter([(k.to_string(), obj)])),
                    Seg::Index => Value::Array(vec![obj]),
                };
            }
            if let Value::Object(o) = &mut obj {
                o.entry("kind").or_insert_with(|| Value::from("Validation"));
                o.entry("apiVersion").or_insert_with(|| Value::from("validation/v1"));
            }
            let mut meta_errs = Vec::new();
            validation::embedded_errors(&Path::root(""), &obj, root, true, &mut meta_errs);
            if meta_errs.is_empty() {
                errs.extend(validation::openapi_errors(s, def, &dp, false));
            } else {
                errs.push(gofmt::invalid(
                    &dp,
                    gofmt::value(def),
                    format!("must result in valid metadata: {}", aggregate(&meta_errs)),
                ));
            }
        } else {
            let mut pruned = def.clone();
            pruning::prune_tree(&mut pruned, Some(s), embedded, None);
            if pruned != *def {
                errs.push(gofmt::invalid(&dp, gofmt::value(def), "must not have unknown fields"));
            }
            let mut embedded_errs = Vec::new();
            validation::embedded_errors(&dp, def, s, embedded, &mut embedded_errs);
            if embedded_errs.is_empty() {
                errs.extend(validation::openapi_errors(s, def, &dp, false));
            } else {
                errs.extend(embedded_errs);
            }
        }
    }
    // Not into additionalProperties, as upstream.
    if let Some(items) = &s.items {
        let mut child = segs.to_vec();
        child.push(Seg::Index);
        defaults(items, &path.child("items"), root, false, &child, inside_meta, errs);
    }
    for (k, sub) in &s.properties {
        let mut child = segs.to_vec();
        child.push(Seg::Child(k));
        let sub_inside = inside_meta || (embedded && META_FIELDS.contains(&k.as_str()));
        defaults(sub, &path.child("properties").key(k), root, false, &child, sub_inside, errs);
    }
}

// ---------------------------------------------------------------------------------------
// CRD schema rules (upstream `ValidateCustomResourceDefinitionOpenAPISchema`)

/// Upstream's `specStandardValidatorV3` state.
#[derive(Clone, Default)]
struct Ssv {
    /// Defaults are forbidden here, for this reason.
    forbid_defaults: Option<String>,
    inside_resource_meta: bool,
}

impl Ssv {
    fn with_forbidden_defaults(&self, reason: &str) -> Self {
        Self { forbid_defaults: Some(reason.to_string()), ..self.clone() }
    }

    fn with_inside_resource_meta(&self) -> Self {
        Self { inside_resource_meta: true, ..self.clone() }
    }
}

const OPENAPI_TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];
const VALIDATION_REASONS: [&str; 4] =
    ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

fn str_at<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    present(m, k).and_then(Value::as_str)
}

fn has_newlines(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

/// The keys of the CRD-side schema checks that look at one node (upstream
/// `specStandardValidatorV3.validate`).
fn standard_errors(m: &Map<String, Value>, path: &Path, ssv: &Ssv, errs: &mut Vec<FieldError>) {
    let ty = str_at(m, "type").unwrap_or_default();
    if !ty.is_empty() && !OPENAPI_TYPES.contains(&ty) {
        errs.push(FieldError::not_supported(&path.child("type"), ty, &OPENAPI_TYPES));
    }
    if present(m, "default").is_some()
        && let Some(reason) = &ssv.forbid_defaults
    {
        let detail = if reason.is_empty() {
            "must not be set".to_string()
        } else {
            format!("must not be set {reason}")
        };
        errs.push(FieldError::forbidden(&path.child("default"), detail));
    }
    if str_at(m, "id").is_some_and(|s| !s.is_empty()) {
        errs.push(FieldError::forbidden(&path.child("id"), "id is not supported"));
    }
    if present(m, "additionalItems").is_some() {
        errs.push(FieldError::forbidden(
            &path.child("additionalItems"),
            "additionalItems is not supported",
        ));
    }
    if present(m, "patternProperties").and_then(Value::as_object).is_some_and(|p| !p.is_empty()) {
        errs.push(FieldError::forbidden(
            &path.child("patternProperties"),
            "patternProperties is not supported",
        ));
    }
    if present(m, "definitions").and_then(Value::as_object).is_some_and(|p| !p.is_empty()) {
        errs.push(FieldError::forbidden(
            &path.child("definitions"),
            "definitions is not supported",
        ));
    }
    if present(m, "dependencies").is_some() {
        errs.push(FieldError::forbidden(
            &path.child("dependencies"),
            "dependencies is not supported",
        ));
    }
    if present(m, "$ref").is_some() {
        errs.push(FieldError::forbidden(&path.child("$ref"), "$ref is not supported"));
    }
    if ty == "null" {
        errs.push(FieldError::forbidden(
            &path.child("type"),
            "type cannot be set to null, use nullable as an alternative",
        ));
    }
    if present(m, "items").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        errs.push(FieldError::forbidden(
            &path.child("items"),
            "items must be a schema object and not an array",
        ));
    }
    if ssv.inside_resource_meta
        && present(m, "x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
    {
        errs.push(FieldError::forbidden(
            &path.child("x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }
}

fn openapi_errors(
    m: &Map<String, Value>,
    path: &Path,
    ssv: &Ssv,
    is_root: bool,
    errs: &mut Vec<FieldError>,
) {
    standard_errors(m, path, ssv, errs);
    let ty = str_at(m, "type").unwrap_or_default();
    let embedded = present(m, "x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
    let properties = present(m, "properties").and_then(Value::as_object);

    if present(m, "uniqueItems") == Some(&Value::Bool(true)) {
        errs.push(FieldError::forbidden(
            &path.child("uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }

    if let Some(ap) = present(m, "additionalProperties") {
        if properties.is_some_and(|p| !p.is_empty()) && ap != &Value::Bool(true) {
            errs.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        let sub = if ssv.inside_resource_meta {
            ssv.with_forbidden_defaults("inside additionalProperties applying to object metadata")
        } else {
            ssv.clone()
        };
        if let Some(apm) = ap.as_object() {
            openapi_errors(apm, &path.child("additionalProperties"), &sub, false, errs);
        }
    }

    if let Some(props) = properties {
        for (name, sub) in props {
            let Some(sm) = sub.as_object() else { continue };
            let mut sub_ssv = ssv.clone();
            if (is_root || embedded) && META_FIELDS.contains(&name.as_str()) {
                sub_ssv = sub_ssv.with_inside_resource_meta();
                if is_root {
                    sub_ssv = sub_ssv.with_forbidden_defaults(&format!("in top-level {name}"));
                }
            }
            openapi_errors(sm, &path.child("properties").key(name), &sub_ssv, false, errs);
        }
    }

    if let Some(n) = present(m, "not").and_then(Value::as_object) {
        openapi_errors(n, &path.child("not"), ssv, false, errs);
    }
    for junctor in ["allOf", "oneOf", "anyOf"] {
        if let Some(list) = present(m, junctor).and_then(Value::as_array) {
            for (i, x) in list.iter().enumerate() {
                if let Some(xm) = x.as_object() {
                    openapi_errors(xm, &path.child(junctor).index(i), ssv, false, errs);
                }
            }
        }
    }

    let items = present(m, "items");
    match items {
        Some(Value::Object(im)) => openapi_errors(im, &path.child("items"), ssv, false, errs),
        Some(Value::Array(list)) => {
            for (i, x) in list.iter().enumerate() {
                if let Some(xm) = x.as_object() {
                    openapi_errors(xm, &path.child("items").index(i), ssv, false, errs);
                }
            }
        }
        _ => {}
    }
    let item_schema = items.and_then(Value::as_object);

    if present(m, "x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        errs.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            false,
            "must be true or undefined",
        ));
    }

    let map_type = str_at(m, "x-kubernetes-map-type");
    if let Some(mt) = map_type {
        if ty != "object" {
            let detail = "must be object if x-kubernetes-map-type is specified";
            if ty.is_empty() {
                errs.push(FieldError::required(&path.child("type"), detail));
            } else {
                errs.push(FieldError::invalid(&path.child("type"), ty, detail));
            }
        }
        if mt != "atomic" && mt != "granular" {
            errs.push(FieldError::not_supported(
                &path.child("x-kubernetes-map-type"),
                mt,
                &["atomic", "granular"],
            ));
        }
    }

    let list_type = str_at(m, "x-kubernetes-list-type");
    if list_type.is_some() && ty != "array" {
        let detail = "must be array if x-kubernetes-list-type is specified";
        if ty.is_empty() {
            errs.push(FieldError::required(&path.child("type"), detail));
        } else {
            errs.push(FieldError::invalid(&path.child("type"), ty, detail));
        }
    } else if list_type == Some("set")
        && let Some(im) = item_schema
    {
        let detail = "must be atomic as item of a list with x-kubernetes-list-type=set";
        let item_list_type = str_at(im, "x-kubernetes-list-type");
        match str_at(im, "type").unwrap_or_default() {
            "array" => {
                if let Some(lt) = item_list_type.filter(|lt| *lt != "atomic") {
                    errs.push(FieldError::invalid(
                        &path.child("items").child("x-kubernetes-list-type"),
                        lt,
                        detail,
                    ));
                }
            }
            "object" if str_at(im, "x-kubernetes-map-type") != Some("atomic") => {
                // Upstream prints the items' list type here (usually unset: null).
                let shown = item_list_type.map_or_else(|| "null".to_string(), gofmt::quote);
                errs.push(gofmt::invalid(
                    &path.child("items").child("x-kubernetes-map-type"),
                    shown,
                    detail,
                ));
            }
            _ => {}
        }
    }
    if let Some(lt) = list_type
        && !matches!(lt, "atomic" | "set" | "map")
    {
        errs.push(FieldError::not_supported(
            &path.child("x-kubernetes-list-type"),
            lt,
            &["atomic", "set", "map"],
        ));
    }

    let keys = strings(present(m, "x-kubernetes-list-map-keys"));
    if !keys.is_empty() {
        let detail = "must be map if x-kubernetes-list-map-keys is non-empty";
        match list_type {
            None => errs.push(FieldError::required(&path.child("x-kubernetes-list-type"), detail)),
            Some(lt) if lt != "map" => {
                errs.push(FieldError::invalid(&path.child("x-kubernetes-list-type"), lt, detail));
            }
            _ => {}
        }
    }

    if list_type == Some("map") {
        if keys.is_empty() {
            errs.push(FieldError::required(
                &path.child("x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match items {
            None => errs.push(FieldError::required(
                &path.child("items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(Value::Array(_)) => errs.push(FieldError::invalid(
                &path.child("items"),
                items.unwrap_or(&Value::Null),
                "must only have a single schema if x-kubernetes-list-type is map",
            )),
            _ => {}
        }
        if let Some(im) = item_schema {
            let item_ty = str_at(im, "type").unwrap_or_default();
            if item_ty != "object" {
                errs.push(FieldError::invalid(
                    &path.child("items").child("type"),
                    item_ty,
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
            } else {
                let item_props = present(im, "properties").and_then(Value::as_object);
                let keys_shown = gofmt::string_slice(&keys);
                let keys_error = |detail: &str| {
                    gofmt::invalid(
                        &path.child("x-kubernetes-list-map-keys"),
                        keys_shown.clone(),
                        detail,
                    )
                };
                let mut seen: Vec<&str> = Vec::new();
                for k in &keys {
                    match item_props.and_then(|p| p.get(k)).and_then(Value::as_object) {
                        Some(km) => {
                            let kt = str_at(km, "type").unwrap_or_default();
                            if kt == "array" || kt == "object" {
                                // Upstream prints the item type here.
                                errs.push(FieldError::invalid(
                                    &path.child("items").child("properties").key(k).child("type"),
                                    item_ty,
                                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                                ));
                            }
                        }
                        None => {
                            errs.push(keys_error("entries must all be names of item properties"))
                        }
                    }
                    if seen.contains(&k.as_str()) {
                        errs.push(keys_error("must not contain duplicate entries"));
                    }
                    seen.push(k);
                }
            }
        }
    }

    // Upstream `validateMapListKeysMapSet`.
    if let Some(im) = item_schema
        && let Some(lt @ ("set" | "map")) = list_type
    {
        if present(im, "nullable") == Some(&Value::Bool(true)) {
            errs.push(FieldError::forbidden(
                &path.child("items").child("nullable"),
                format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
            ));
        }
        if lt == "map" {
            let required = strings(present(im, "required"));
            let item_props = present(im, "properties").and_then(Value::as_object);
            for k in &keys {
                let Some(km) = item_props.and_then(|p| p.get(k)).and_then(Value::as_object) else {
                    continue;
                };
                let kp = path.child("items").child("properties").key(k);
                if !required.contains(k) && present(km, "default").is_none() {
                    errs.push(FieldError::required(
                        &kp.child("default"),
                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                    ));
                }
                if present(km, "nullable") == Some(&Value::Bool(true)) {
                    errs.push(FieldError::forbidden(
                        &kp.child("nullable"),
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    ));
                }
            }
        }
    }

    if let Some(rules) = present(m, "x-kubernetes-validations").and_then(Value::as_array) {
        for (i, r) in rules.iter().enumerate() {
            let Some(r) = r.as_object() else { continue };
            rule_errors(r, &path.child("x-kubernetes-validations").index(i), errs);
        }
    }
}

/// The checks of one `x-kubernetes-validations` rule that do not need CEL.
fn rule_errors(r: &Map<String, Value>, rp: &Path, errs: &mut Vec<FieldError>) {
    let rule = str_at(r, "rule").unwrap_or_default();
    let message = str_at(r, "message").unwrap_or_default();
    let message_expression = str_at(r, "messageExpression").unwrap_or_default();
    let (trimmed_rule, trimmed_msg) = (rule.trim(), message.trim());
    if trimmed_rule.is_empty() {
        errs.push(FieldError::required(&rp.child("rule"), "rule is not specified"));
    } else if !message.is_empty() && trimmed_msg.is_empty() {
        errs.push(FieldError::invalid(
            &rp.child("message"),
            message,
            "must be non-empty if specified",
        ));
    } else if has_newlines(trimmed_msg) {
        errs.push(FieldError::invalid(
            &rp.child("message"),
            message,
            "must not contain line breaks",
        ));
    } else if has_newlines(trimmed_rule) && trimmed_msg.is_empty() {
        errs.push(FieldError::required(
            &rp.child("message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if !message_expression.is_empty() && message_expression.trim().is_empty() {
        errs.push(FieldError::required(
            &rp.child("messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
    }
    if let Some(reason) = str_at(r, "reason")
        && !VALIDATION_REASONS.contains(&reason)
    {
        errs.push(FieldError::not_supported(&rp.child("reason"), reason, &VALIDATION_REASONS));
    }
    let field_path = str_at(r, "fieldPath").unwrap_or_default();
    if !field_path.is_empty() && field_path.trim().is_empty() {
        errs.push(FieldError::invalid(
            &rp.child("fieldPath"),
            field_path,
            "must be non-empty if specified",
        ));
    }
    if has_newlines(field_path) {
        errs.push(FieldError::invalid(
            &rp.child("fieldPath"),
            field_path,
            "must not contain line breaks",
        ));
    }
}
