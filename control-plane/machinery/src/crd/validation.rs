//! Validation of custom resources against their structural schema: kube-openapi's schema
//! validator as the apiextensions-apiserver configures it (`pkg/apiserver/validation`,
//! `k8s.io/kube-openapi/pkg/validation/validate` at Kubernetes v1.33), the checks of
//! embedded resources (`pkg/apiserver/schema/objectmeta/validation.go`) and of
//! `x-kubernetes-list-type` sets and maps (`pkg/apiserver/schema/listtype`).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::formats;
use super::gofmt::{self, Num};
use super::schema::{AdditionalProperties, Structural};
use crate::admission::{FieldError, Path};

/// Validates `obj` (a custom resource, or a part of one described by `schema`) as the
/// apiserver does on create and update, with field paths under `path` (empty for a whole
/// custom resource, whose errors upstream reports under a nil path; an error at that empty
/// path prints as `<nil>` like upstream's).
///
/// In upstream's order:
/// 1. The schema (kube-openapi): `type` (`integer` accepts integral numbers such as `1.0`,
///    `number` accepts integers, `x-kubernetes-int-or-string` is `integer,string`, `null`
///    only where `nullable`), `format` (the formats upstream supports in CRDs; others are
///    ignored), `enum`, `pattern`, `minLength`/`maxLength` (code points),
///    `minimum`/`maximum` (and exclusive), `multipleOf`, `minItems`/`maxItems`,
///    `uniqueItems`, `minProperties`/`maxProperties`, `required`, `additionalProperties`,
///    `allOf`/`anyOf`/`oneOf`/`not`. Messages are kube-openapi's
///    (`spec.replicas in body must be of type integer: "string"`).
/// 2. Embedded resources (`x-kubernetes-embedded-resource`): `apiVersion` and `kind`
///    required and well-formed, `metadata` decodable as ObjectMeta with a valid name,
///    generateName, namespace, labels and annotations.
/// 3. `x-kubernetes-list-type: set` without duplicate items and `map` without two items
///    with the same key fields (`Duplicate value`).
///
/// The root object's `metadata` is only checked against what the schema says of it (the
/// apiserver validates ObjectMeta itself); unknown fields are not errors (see
/// [`prune`](super::schema::prune)).
pub fn validate(schema: &Structural, obj: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = openapi_errors(schema, obj, path, true);
    embedded_errors(path, obj, schema, false, &mut errs);
    list_errors(path, schema, obj, &mut errs);
    errs
}

/// The schema part of validation. `crd` selects how the CRD's schema is converted for
/// custom resources (unsupported formats dropped, int-or-string typed `integer,string`);
/// without it the node is used as it is, as upstream validates `default`s.
pub(crate) fn openapi_errors(
    s: &Structural,
    data: &Value,
    prefix: &Path,
    crd: bool,
) -> Vec<FieldError> {
    let v = Validator { prefix, crd };
    v.node(s, data, "").errs.into_iter().map(|(_, e)| e).collect()
}

/// A kube-openapi result: errors (with the message they are deduplicated by) and the
/// `MatchCount` that picks which failing `anyOf`/`oneOf` branch is reported.
#[derive(Default)]
struct Res {
    errs: Vec<(String, FieldError)>,
    count: u64,
}

impl Res {
    fn add(&mut self, msg: String, e: FieldError) {
        if !self.errs.iter().any(|(m, _)| *m == msg) {
            self.errs.push((msg, e));
        }
    }

    fn merge(&mut self, other: Res) {
        for (m, e) in other.errs {
            self.add(m, e);
        }
        self.count += other.count;
    }

    fn valid(&self) -> bool {
        self.errs.is_empty()
    }
}

struct Validator<'a> {
    prefix: &'a Path,
    crd: bool,
}

/// swag's `IsFloat64AJSONInteger`: integral (or within 1e-9 relative error of it) and
/// within ±(2^53-1).
fn is_json_integer(f: f64) -> bool {
    const MAX: f64 = 9_007_199_254_740_991.0;
    if !f.is_finite() || !(-MAX..=MAX).contains(&f) {
        return false;
    }
    let fa = f.abs();
    let g = fa.trunc();
    let diff = fa - g;
    if diff == 0.0 {
        return true;
    }
    if g == 0.0 {
        return false;
    }
    diff / (fa + g) < 1e-9
}

/// Go's `reflect.DeepEqual` of decoded JSON (an `int64` never equals a `float64`).
fn deep_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (Num::of(x), Num::of(y)) {
            (Num::Int(i), Num::Int(j)) => i == j,
            (Num::Float(f), Num::Float(g)) => f == g,
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| deep_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| deep_equal(p, q)))
        }
        _ => a == b,
    }
}

/// kube-openapi's enum membership: deep equality, else the value converted to the enum
/// value's Go type (`2.5` matches `2`, `2` matches `2.0`, and an integer matches the string
/// of the character with that code point, as Go's conversions do).
fn enum_matches(data: &Value, e: &Value) -> bool {
    if deep_equal(data, e) {
        return true;
    }
    match (data, e) {
        (Value::Number(d), Value::Number(n)) => match (Num::of(d), Num::of(n)) {
            (Num::Int(i), Num::Float(f)) => i as f64 == f,
            (Num::Float(x), Num::Int(j)) => x as i64 == j,
            _ => false,
        },
        (Value::Number(d), Value::String(s)) => match Num::of(d) {
            Num::Int(i) => {
                let c = u32::try_from(i).ok().and_then(char::from_u32).unwrap_or('\u{FFFD}');
                s.chars().eq(std::iter::once(c))
            }
            Num::Float(_) => false,
        },
        _ => false,
    }
}

/// The JSON type and Go format kube-openapi infers for a decoded value.
fn type_info(data: &Value) -> (&'static str, &'static str) {
    match data {
        Value::Null => ("null", ""),
        Value::Bool(_) => ("boolean", ""),
        Value::String(_) => ("string", ""),
        Value::Number(n) => match Num::of(n) {
            Num::Int(_) => ("integer", "int64"),
            Num::Float(_) => ("number", "float64"),
        },
        Value::Array(_) => ("array", ""),
        Value::Object(_) => ("object", ""),
    }
}

fn child_name(name: &str, k: &str) -> String {
    if name.is_empty() { k.to_string() } else { format!("{name}.{k}") }
}

impl Validator<'_> {
    /// Where a kube-openapi error named `name` lands: the prefix, then the name without a
    /// leading dot.
    fn err_path(&self, name: &str) -> Path {
        match name.strip_prefix('.').unwrap_or(name) {
            "" => self.prefix.clone(),
            n => self.prefix.child(n),
        }
    }

    fn invalid(&self, r: &mut Res, name: &str, value: String, msg: String) {
        let e = gofmt::invalid(&self.err_path(name), value, msg.clone());
        r.add(msg, e);
    }

    /// An error that is not a field validation (the junctors'): reported at the prefix with
    /// an empty value.
    fn composite(&self, r: &mut Res, msg: String) {
        let e = gofmt::invalid(self.prefix, "\"\"".to_string(), msg.clone());
        r.add(msg, e);
    }

    fn node(&self, s: &Structural, data: &Value, name: &str) -> Res {
        let mut r = Res::default();
        let types: Vec<&str> = if self.crd && s.x_int_or_string {
            vec!["integer", "string"]
        } else if s.ty.is_empty() {
            Vec::new()
        } else {
            vec![s.ty.as_str()]
        };
        let single = if types.len() == 1 { types[0] } else { "" };
        let format =
            if self.crd { formats::crd_format(single, &s.format) } else { s.format.as_str() };
        let type_applies = !types.is_empty() || !format.is_empty();

        if data.is_null() {
            if type_applies {
                r.merge(self.type_check(&types, s.nullable, format, data, name));
            }
            r.merge(self.enum_check(s, data, name));
            return r;
        }
        if type_applies {
            r.merge(self.type_check(&types, s.nullable, format, data, name));
            r.count += 1;
        }
        r.merge(self.junctors(s, data, name));
        r.count += 1;
        if let Value::String(st) = data {
            r.merge(self.string_check(s, st, name));
            r.count += 1;
            if !format.is_empty() && formats::in_registry(format) {
                if !formats::check(format, st) {
                    let msg =
                        format!("{name} in body must be of type {format}: {}", gofmt::quote(st));
                    self.invalid(&mut r, name, gofmt::quote(st), msg);
                }
                r.count += 1;
            }
        }
        if let Value::Number(n) = data {
            r.merge(self.number_check(s, Num::of(n), name));
            r.count += 1;
        }
        if let Value::Array(a) = data {
            r.merge(self.slice_check(s, a, name));
            r.count += 1;
        }
        r.merge(self.enum_check(s, data, name));
        r.count += 1;
        if let Value::Object(m) = data {
            r.merge(self.object_check(s, m, name));
            r.count += 1;
        }
        r.count += 1;
        r
    }

    fn type_error(&self, name: &str, type_name: &str, value: &str) -> Res {
        let mut r = Res::default();
        let msg = format!("{name} in body must be of type {type_name}: {}", gofmt::quote(value));
        self.invalid(&mut r, name, gofmt::quote(value), msg);
        r
    }

    /// kube-openapi's `typeValidator`.
    fn type_check(
        &self,
        types: &[&str],
        nullable: bool,
        format: &str,
        data: &Value,
        name: &str,
    ) -> Res {
        let ok = Res { errs: Vec::new(), count: 1 };
        if data.is_null() {
            if !types.is_empty() && !nullable {
                return self.type_error(name, &types.join(","), "null");
            }
            return ok;
        }
        let (sch, fmt) = type_info(data);
        let has = |t: &str| types.contains(&t);
        let is_float_int = matches!(data, Value::Number(n) if matches!(Num::of(n), Num::Float(f) if is_json_integer(f)))
            && has("integer");
        let is_int_float = sch == "integer" && has("number");
        let string_or_slice = data.is_string() || data.is_array();
        let has_format = !format.is_empty();
        let type_fits = has(sch) || is_float_int || is_int_float;
        // A format on a number, boolean or object must fit the type or be the value's own.
        let format_fits = type_fits || fmt == format;
        if has_format && !string_or_slice && !format_fits {
            return self.type_error(name, format, fmt);
        }
        // A string or array with a format passes unless the type is numeric.
        let numeric = has("number") || has("integer");
        if has_format && string_or_slice && !numeric {
            return ok;
        }
        if !type_fits {
            return self.type_error(name, &types.join(","), sch);
        }
        ok
    }

    /// kube-openapi's `schemaPropsValidator`.
    fn junctors(&self, s: &Structural, data: &Value, name: &str) -> Res {
        let vv = &s.validation;
        let mut main = Res::default();
        let quoted = gofmt::quote(name);

        if !vv.any_of.is_empty() {
            let mut best: Option<Res> = None;
            let mut success: Option<Res> = None;
            for sub in &vv.any_of {
                let r = self.node(sub, data, name);
                if r.valid() {
                    best = None;
                    success = Some(r);
                    break;
                }
                if best.as_ref().is_none_or(|b| r.count > b.count) {
                    best = Some(r);
                }
            }
            if success.is_none() {
                self.composite(
                    &mut main,
                    format!("{quoted} must validate at least one schema (anyOf)"),
                );
            }
            if let Some(b) = best.or(success) {
                main.merge(b);
            }
        }

        if !vv.one_of.is_empty() {
            let mut best: Option<Res> = None;
            let mut success: Option<Res> = None;
            let mut validated = 0;
            for sub in &vv.one_of {
                let r = self.node(sub, data, name);
                if r.valid() {
                    validated += 1;
                    best = None;
                    if success.is_none() {
                        success = Some(r);
                    }
                    continue;
                }
                if validated == 0 && best.as_ref().is_none_or(|b| r.count > b.count) {
                    best = Some(r);
                }
            }
            if validated != 1 {
                let more = if validated == 0 {
                    "Found none valid".to_string()
                } else {
                    format!("Found {validated} valid alternatives")
                };
                self.composite(
                    &mut main,
                    format!("{quoted} must validate one and only one schema (oneOf). {more}"),
                );
                if let Some(b) = best {
                    main.merge(b);
                }
            } else if let Some(ok) = success {
                main.merge(ok);
            }
        }

        if !vv.all_of.is_empty() {
            let mut validated = 0;
            for sub in &vv.all_of {
                let r = self.node(sub, data, name);
                if r.valid() {
                    validated += 1;
                }
                main.merge(r);
            }
            if validated != vv.all_of.len() {
                let more = if validated == 0 { ". None validated" } else { "" };
                self.composite(
                    &mut main,
                    format!("{quoted} must validate all the schemas (allOf){more}"),
                );
            }
        }

        if let Some(not) = &vv.not
            && self.node(not, data, name).valid()
        {
            self.composite(&mut main, format!("{quoted} must not validate the schema (not)"));
        }

        main.count += 1;
        main
    }

    /// kube-openapi's `stringValidator`: the first failing check only.
    fn string_check(&self, s: &Structural, st: &str, name: &str) -> Res {
        let vv = &s.validation;
        let mut r = Res::default();
        let len = st.chars().count() as i64;
        if let Some(max) = vv.max_length
            && len > max
        {
            let msg = format!("{name} in body should be at most {max} chars long");
            r.add(msg, gofmt::too_long(&self.err_path(name), max));
            return r;
        }
        if let Some(min) = vv.min_length
            && len < min
        {
            let msg = format!("{name} in body should be at least {min} chars long");
            self.invalid(&mut r, name, gofmt::quote(st), msg);
            return r;
        }
        if let Some(p) = &vv.pattern {
            match p.is_match(st) {
                Some(true) => {}
                Some(false) => {
                    let msg = format!("{name} in body should match '{}'", p.as_str());
                    self.invalid(&mut r, name, gofmt::quote(st), msg);
                }
                None => {
                    let msg = format!(
                        "{name} in body should match '{}, but pattern is invalid: {}'",
                        p.as_str(),
                        p.error().unwrap_or_default()
                    );
                    self.invalid(&mut r, name, gofmt::quote(st), msg);
                }
            }
        }
        r
    }

    /// kube-openapi's `numberValidator` (v1.33: integers compared as `int64` with the bound
    /// truncated, floats as `float64`).
    fn number_check(&self, s: &Structural, n: Num, name: &str) -> Res {
        let vv = &s.validation;
        let mut r = Res::default();
        let shown = match n {
            Num::Int(i) => i.to_string(),
            Num::Float(f) => gofmt::float(f),
        };
        if let Some(factor) = vv.multiple_of {
            let (positive, factor_shown, multiple) = match n {
                Num::Int(i) => {
                    let fi = factor as i64;
                    (fi > 0, fi.to_string(), fi > 0 && i % fi == 0)
                }
                Num::Float(x) => {
                    let mult = if factor < 1.0 { 1.0 / factor * x } else { x / factor };
                    (factor > 0.0, gofmt::float(factor), is_json_integer(mult))
                }
            };
            if !positive {
                let msg = format!(
                    "factor MultipleOf declared for {name} must be positive: {factor_shown}"
                );
                self.invalid(&mut r, name, factor_shown, msg);
            } else if !multiple {
                let msg = format!("{name} in body should be a multiple of {factor_shown}");
                self.invalid(&mut r, name, shown.clone(), msg);
            }
        }
        let bound = |b: f64, below: bool, exclusive: bool| -> Option<String> {
            let (fails, b_shown) = match n {
                Num::Int(i) => {
                    let bi = b as i64;
                    let fails = if below {
                        if exclusive { i <= bi } else { i < bi }
                    } else if exclusive {
                        i >= bi
                    } else {
                        i > bi
                    };
                    (fails, bi.to_string())
                }
                Num::Float(x) => {
                    let fails = if below {
                        if exclusive { x <= b } else { x < b }
                    } else if exclusive {
                        x >= b
                    } else {
                        x > b
                    };
                    (fails, gofmt::float(b))
                }
            };
            fails.then(|| {
                let what = match (below, exclusive) {
                    (true, false) => "greater than or equal to",
                    (true, true) => "greater than",
                    (false, false) => "less than or equal to",
                    (false, true) => "less than",
                };
                format!("{name} in body should be {what} {b_shown}")
            })
        };
        if let Some(min) = vv.minimum
            && let Some(msg) = bound(min, true, vv.exclusive_minimum)
        {
            self.invalid(&mut r, name, shown.clone(), msg);
        }
        if let Some(max) = vv.maximum
            && let Some(msg) = bound(max, false, vv.exclusive_maximum)
        {
            self.invalid(&mut r, name, shown, msg);
        }
        r.count += 1;
        r
    }

    /// kube-openapi's `schemaSliceValidator`.
    fn slice_check(&self, s: &Structural, a: &[Value], name: &str) -> Res {
        let vv = &s.validation;
        let mut r = Res::default();
        if let Some(items) = &s.items {
            for (i, x) in a.iter().enumerate() {
                r.merge(self.node(items, x, &format!("{name}[{i}]")));
            }
        }
        let size = a.len() as i64;
        if let Some(min) = vv.min_items
            && size < min
        {
            let msg = format!("{name} in body should have at least {min} items");
            self.invalid(&mut r, name, size.to_string(), msg);
        }
        if let Some(max) = vv.max_items
            && size > max
        {
            let msg = format!("{name} in body should have at most {max} items");
            r.add(msg, gofmt::too_many(&self.err_path(name), size, max));
        }
        if vv.unique_items
            && a.iter().enumerate().any(|(i, x)| a[..i].iter().any(|y| deep_equal(x, y)))
        {
            let msg = format!("{name} in body shouldn't contain duplicates");
            self.invalid(&mut r, name, "\"\"".to_string(), msg);
        }
        r.count += 1;
        r
    }

    /// kube-openapi's `basicCommonValidator` (`enum`; a `null` never matches).
    fn enum_check(&self, s: &Structural, data: &Value, name: &str) -> Res {
        let mut r = Res::default();
        let values = &s.validation.enum_values;
        if values.is_empty() || (!data.is_null() && values.iter().any(|e| enum_matches(data, e))) {
            return r;
        }
        let supported: Vec<String> = values
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => gofmt::json(other),
            })
            .collect();
        let msg = format!(
            "{name} in body should be one of {}",
            gofmt::json(&Value::Array(values.clone()))
        );
        r.add(msg, gofmt::not_supported(&self.err_path(name), gofmt::value(data), &supported));
        r
    }

    /// kube-openapi's `objectValidator`.
    fn object_check(&self, s: &Structural, m: &Map<String, Value>, name: &str) -> Res {
        let vv = &s.validation;
        let mut r = Res::default();
        let n = m.len() as i64;
        if let Some(min) = vv.min_properties
            && n < min
        {
            let msg = format!("{name} in body should have at least {min} properties");
            self.invalid(&mut r, name, n.to_string(), msg);
        }
        if let Some(max) = vv.max_properties
            && n > max
        {
            let msg = format!("{name} in body should have at most {max} properties");
            r.add(msg, gofmt::too_many(&self.err_path(name), n, max));
        }
        match &s.additional_properties {
            Some(AdditionalProperties::Bool(false)) => {
                for k in m.keys().filter(|k| !s.properties.contains_key(*k)) {
                    let msg = format!("{name}.{k} in body is a forbidden property");
                    self.invalid(&mut r, name, gofmt::quote(k), msg);
                }
            }
            Some(AdditionalProperties::Schema(ap)) => {
                for (k, v) in m.iter().filter(|(k, _)| !s.properties.contains_key(*k)) {
                    r.merge(self.node(ap, v, &format!("{name}.{k}")));
                }
            }
            _ => {}
        }
        for (k, ps) in &s.properties {
            if let Some(v) = m.get(k) {
                r.merge(self.node(ps, v, &child_name(name, k)));
            }
        }
        for k in &vv.required {
            if !m.contains_key(k) {
                let field = format!("{name}.{k}");
                let msg = format!("{field} in body is required");
                r.add(msg, gofmt::required(&self.err_path(&field), ""));
            }
        }
        r
    }
}

// ---------------------------------------------------------------------------------------
// Embedded resources (upstream `objectmeta.Validate`)

/// The checks of embedded resources in `x` (and of `x` itself if `is_resource_root`), with
/// paths built like upstream's (`.child` for properties, `[key]` for additionalProperties,
/// `[i]` for items).
pub(crate) fn embedded_errors(
    path: &Path,
    x: &Value,
    s: &Structural,
    is_resource_root: bool,
    errs: &mut Vec<FieldError>,
) {
    embedded_walk(path, x, Some(s), is_resource_root, errs);
}

fn embedded_walk(
    path: &Path,
    x: &Value,
    s: Option<&Structural>,
    force: bool,
    errs: &mut Vec<FieldError>,
) {
    let Some(s) = s else { return };
    match x {
        Value::Object(m) => {
            if s.x_embedded_resource || force {
                embedded_resource(path, m, errs);
            }
            for (k, v) in m {
                if let Some(p) = s.properties.get(k) {
                    embedded_walk(&path.child(k), v, Some(p), false, errs);
                } else if let Some(ap) = &s.additional_properties {
                    embedded_walk(&path.key(k), v, ap.schema(), false, errs);
                }
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                embedded_walk(&path.index(i), v, s.items.as_deref(), false, errs);
            }
        }
        _ => {}
    }
}

/// Upstream `RegexError` texts of apimachinery's `util/validation`.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let quoted: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!("{msg} (e.g. {}regex used for validation is '{fmt}')", quoted.join(" or "))
}

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_EXAMPLES: [&str; 3] = ["MyName", "my.name", "123-abc"];
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Upstream `IsQualifiedName` (label and annotation keys).
fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                if !prefix.split('.').all(|l| label_chars_ok(l, false)) {
                    errs.push(format!(
                        "prefix part {}",
                        regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"])
                    ));
                }
            }
            name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &QUALIFIED_NAME_EXAMPLES)
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !is_qualified_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &QUALIFIED_NAME_EXAMPLES)
        ));
    }
    errs
}

/// Upstream `IsValidLabelValue`.
fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !is_qualified_part(s) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Upstream's limit on the total size of an object's annotations.
const TOTAL_ANNOTATION_SIZE_LIMIT: i64 = 256 * 1024;

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn label_chars_ok(s: &str, first_alpha: bool) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && (if first_alpha { b[0].is_ascii_lowercase() } else { alnum(b[0]) })
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn label_errors(s: &str, first_alpha: bool, msg: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !label_chars_ok(s, first_alpha) {
        errs.push(msg.to_string());
    }
    errs
}

/// Upstream `IsPathSegmentPrefix` / `IsPathSegmentName`.
fn path_segment_errors(s: &str, prefix: bool) -> Vec<String> {
    if !prefix && (s == "." || s == "..") {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| s.contains(**bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn embedded_resource(path: &Path, m: &Map<String, Value>, errs: &mut Vec<FieldError>) {
    for field in ["apiVersion", "kind"] {
        if !m.contains_key(field) {
            errs.push(FieldError::required(&path.child(field), ""));
        }
    }
    for (k, v) in m {
        let p = path.child(k);
        match k.as_str() {
            "apiVersion" => match v {
                Value::String(s) if s.is_empty() => {
                    errs.push(FieldError::invalid(&p, "", "must not be empty"));
                }
                Value::String(s) if s.matches('/').count() > 1 => {
                    errs.push(FieldError::invalid(
                        &p,
                        s,
                        format!("unexpected GroupVersion string: {s}"),
                    ));
                }
                Value::String(_) => {}
                other => errs.push(gofmt::invalid(&p, gofmt::value(other), "must be a string")),
            },
            "kind" => match v {
                Value::String(s) if s.is_empty() => {
                    errs.push(FieldError::invalid(&p, "", "must not be empty"));
                }
                Value::String(s) => {
                    let e = label_errors(&s.to_lowercase(), true, DNS1035_MSG);
                    if !e.is_empty() {
                        errs.push(FieldError::invalid(
                            &p,
                            s,
                            format!(
                                "may have mixed case, but should otherwise match: {}",
                                e.join(",")
                            ),
                        ));
                    }
                }
                other => errs.push(gofmt::invalid(&p, gofmt::value(other), "must be a string")),
            },
            "metadata" => metadata_errors(&p, v, errs),
            _ => {}
        }
    }
}

/// Why `metadata` does not decode into ObjectMeta (Go's `encoding/json` message).
fn metadata_decode_error(v: &Value) -> Option<String> {
    let Some(m) = v.as_object() else {
        return Some(format!(
            "json: cannot unmarshal {} into Go value of type v1.ObjectMeta",
            json_kind(v)
        ));
    };
    let field_err = |field: &str, x: &Value, ty: &str| {
        format!(
            "json: cannot unmarshal {} into Go struct field ObjectMeta.{field} of type {ty}",
            json_kind(x)
        )
    };
    for (k, x) in m {
        if x.is_null() {
            continue;
        }
        match k.as_str() {
            "name" | "generateName" | "namespace" | "selfLink" | "uid" | "resourceVersion"
                if !x.is_string() =>
            {
                return Some(field_err(k, x, "string"));
            }
            "generation" | "deletionGracePeriodSeconds" if x.as_i64().is_none() => {
                return Some(field_err(k, x, "int64"));
            }
            "labels" | "annotations" => match x.as_object() {
                Some(o) => {
                    if let Some(bad) = o.values().find(|s| !s.is_string() && !s.is_null()) {
                        return Some(field_err(k, bad, "string"));
                    }
                }
                None => return Some(field_err(k, x, "map[string]string")),
            },
            "finalizers" => match x.as_array() {
                Some(a) => {
                    if let Some(bad) = a.iter().find(|s| !s.is_string() && !s.is_null()) {
                        return Some(field_err(k, bad, "string"));
                    }
                }
                None => return Some(field_err(k, x, "[]string")),
            },
            _ => {}
        }
    }
    None
}

/// An embedded resource's `metadata`: decodable, then upstream's ObjectMeta rules for the
/// name, generateName, namespace, labels and annotations (a missing name is fine; owner
/// references and finalizers are not checked).
fn metadata_errors(path: &Path, v: &Value, errs: &mut Vec<FieldError>) {
    if let Some(e) = metadata_decode_error(v) {
        errs.push(gofmt::invalid(path, gofmt::value(v), e));
        return;
    }
    let get = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
    let generate_name = get("generateName");
    if !generate_name.is_empty() {
        for e in path_segment_errors(generate_name, true) {
            errs.push(FieldError::invalid(&path.child("generateName"), generate_name, e));
        }
    }
    let name = get("name");
    if !name.is_empty() {
        for e in path_segment_errors(name, false) {
            errs.push(FieldError::invalid(&path.child("name"), name, e));
        }
    }
    let namespace = get("namespace");
    if !namespace.is_empty() {
        for e in label_errors(namespace, false, DNS1123_LABEL_MSG) {
            errs.push(FieldError::invalid(&path.child("namespace"), namespace, e));
        }
    }
    if let Some(labels) = v.get("labels").and_then(Value::as_object) {
        let lp = path.child("labels");
        for (k, val) in labels {
            for e in qualified_name_errors(k) {
                errs.push(FieldError::invalid(&lp, k, e));
            }
            let val = val.as_str().unwrap_or_default();
            for e in label_value_errors(val) {
                errs.push(FieldError::invalid(&lp, val, e));
            }
        }
    }
    if let Some(annotations) = v.get("annotations").and_then(Value::as_object) {
        let ap = path.child("annotations");
        let mut total = 0i64;
        for (k, val) in annotations {
            total += (k.len() + val.as_str().map_or(0, str::len)) as i64;
            for e in qualified_name_errors(&k.to_lowercase()) {
                errs.push(FieldError::invalid(&ap, k, e));
            }
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            errs.push(gofmt::too_long(&ap, TOTAL_ANNOTATION_SIZE_LIMIT));
        }
    }
}

// ---------------------------------------------------------------------------------------
// List sets and maps (upstream `listtype.ValidateListSetsAndMaps`)

fn list_errors(path: &Path, s: &Structural, x: &Value, errs: &mut Vec<FieldError>) {
    match x {
        Value::Array(a) => list_array(path, s, a, errs),
        Value::Object(m) => {
            if let Some(AdditionalProperties::Schema(ap)) = &s.additional_properties {
                for (k, v) in m {
                    list_errors(&path.key(k), ap, v, errs);
                }
            }
            for (k, v) in m {
                if let Some(sub) = s.properties.get(k) {
                    list_errors(&path.child(k), sub, v, errs);
                }
            }
        }
        _ => {}
    }
}

/// A key under which upstream's set check sees two items as equal: scalars by Go's `==`
/// (an `int64` differs from a `float64`), compounds by their JSON.
fn set_key(v: &Value) -> String {
    match v {
        Value::Null => "n".into(),
        Value::Bool(b) => format!("b{b}"),
        Value::String(s) => format!("s{s}"),
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => format!("i{i}"),
            // -0 and 0 are the same map key in Go (JSON has no NaN).
            Num::Float(f) => format!("f{}", if f == 0.0 { 0.0 } else { f }),
        },
        Value::Array(_) | Value::Object(_) => format!("c{}", gofmt::json(v)),
    }
}

/// The indices where an item repeats an earlier one for the first time.
fn non_unique(keys: &[String]) -> Vec<usize> {
    let mut seen: HashMap<&str, u32> = HashMap::with_capacity(keys.len());
    let mut out = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let times = seen.entry(k.as_str()).or_insert(0);
        *times += 1;
        if *times == 2 {
            out.push(i);
        }
    }
    out
}

fn list_array(path: &Path, s: &Structural, a: &[Value], errs: &mut Vec<FieldError>) {
    match s.x_list_type.as_deref() {
        Some("set") if a.len() > 1 => {
            let keys: Vec<String> = a.iter().map(set_key).collect();
            for i in non_unique(&keys) {
                errs.push(gofmt::duplicate(&path.index(i), gofmt::value(&a[i])));
            }
        }
        Some("map") => list_map(path, s, a, errs),
        _ => {}
    }
    if let Some(items) = &s.items {
        for (i, x) in a.iter().enumerate() {
            list_errors(&path.index(i), items, x, errs);
        }
    }
}

fn list_map(path: &Path, s: &Structural, a: &[Value], errs: &mut Vec<FieldError>) {
    if let Some((i, x)) = a.iter().enumerate().find(|(_, x)| !x.is_null() && !x.is_object()) {
        errs.push(gofmt::invalid(
            &path.index(i),
            gofmt::value(x),
            "must be an object for an array of list-type map",
        ));
        return;
    }
    if a.len() <= 1 {
        return;
    }
    if let [key_field] = s.x_list_map_keys.as_slice() {
        let keys: Vec<Option<&Value>> = a.iter().map(|x| x.get(key_field.as_str())).collect();
        let canon: Vec<String> =
            keys.iter().map(|k| k.map_or_else(|| "u".to_string(), set_key)).collect();
        for i in non_unique(&canon) {
            let shown = match keys[i] {
                None => "map[string]interface {}{}".to_string(),
                Some(k) => {
                    gofmt::sharp_v(&Value::Object(Map::from_iter([(key_field.clone(), k.clone())])))
                }
            };
            errs.push(gofmt::duplicate(&path.index(i), shown));
        }
        return;
    }
    let keys: Vec<Value> = a
        .iter()
        .map(|x| {
            let mut key = Map::new();
            for f in &s.x_list_map_keys {
                if let Some(v) = x.get(f.as_str()) {
                    key.insert(f.clone(), v.clone());
                }
            }
            Value::Object(key)
        })
        .collect();
    let canon: Vec<String> = keys.iter().map(set_key).collect();
    for i in non_unique(&canon) {
        errs.push(gofmt::duplicate(&path.index(i), gofmt::sharp_v(&keys[i])));
    }
}
