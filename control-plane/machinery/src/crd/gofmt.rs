//! How upstream's Go code prints values in the texts this module reproduces: `%v` and `%#v`
//! of decoded JSON (`interface{}` holding `int64`, `float64`, `string`, `bool`, `nil`,
//! `[]interface{}` and `map[string]interface{}`), `%q` of strings and `encoding/json`'s
//! number formatting. Also the field-error constructor for errors whose value is already
//! rendered.

use serde_json::{Number, Value};

use crate::admission::{FieldError, FieldErrorKind, Path};

/// A JSON number as apimachinery's JSON decoding hands it to validation: an `int64` when the
/// literal is an integer that fits, a `float64` otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    pub(crate) fn of(n: &Number) -> Self {
        match n.as_i64() {
            Some(i) => Self::Int(i),
            None => Self::Float(n.as_f64().unwrap_or(f64::NAN)),
        }
    }
}

/// Go's `%q` (`strconv.Quote`) of a string: the admission errors' own.
pub(crate) use crate::admission::field::go_quote as quote;

/// The mantissa and decimal exponent of the shortest representation that round-trips.
fn shortest_exp(f: f64) -> (String, i32) {
    let e = format!("{f:e}");
    match e.split_once('e') {
        Some((mant, exp)) => (mant.to_string(), exp.parse().unwrap_or(0)),
        None => (e, 0),
    }
}

/// Go's `%v` of a `float64` (`strconv.FormatFloat(f, 'g', -1, 64)`): `10`, `1.5`,
/// `1e+06`, `1e-05`.
pub(crate) fn float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let (mant, exp) = shortest_exp(f);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// `encoding/json`'s number format for a `float64`: fixed notation between 1e-6 and 1e21,
/// exponent notation (`1e+21`, `1e-7`) outside.
fn json_float(f: f64) -> String {
    let a = f.abs();
    if a != 0.0 && !(1e-6..1e21).contains(&a) {
        let (mant, exp) = shortest_exp(f);
        if exp < 0 { format!("{mant}e-{}", -exp) } else { format!("{mant}e+{exp:02}") }
    } else {
        format!("{f}")
    }
}

fn num_v(n: &Number) -> String {
    match Num::of(n) {
        Num::Int(i) => i.to_string(),
        Num::Float(f) => float(f),
    }
}

/// Go's `%#v` of a decoded JSON value inside a composite:
/// `map[string]interface {}{"a":1, "b":"x"}`, `[]interface {}{1, 2}`, `interface {}(nil)`.
pub(crate) fn sharp_v(v: &Value) -> String {
    let mut out = String::new();
    write_sharp_v(v, &mut out);
    out
}

fn write_sharp_v(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("interface {}(nil)"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&num_v(n)),
        Value::String(s) => out.push_str(&quote(s)),
        Value::Array(a) => {
            out.push_str("[]interface {}{");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_sharp_v(x, out);
            }
            out.push('}');
        }
        Value::Object(m) => {
            out.push_str("map[string]interface {}{");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&quote(k));
                out.push(':');
                write_sharp_v(x, out);
            }
            out.push('}');
        }
    }
}

/// How apimachinery's `field.Error` prints a decoded JSON bad value: strings quoted, numbers
/// and booleans plain, `null`, composites in Go syntax.
pub(crate) fn value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => num_v(n),
        Value::String(s) => quote(s),
        Value::Array(_) | Value::Object(_) => sharp_v(v),
    }
}

/// Go's `%#v` of a `[]string`: `[]string{"a", "b"}`.
pub(crate) fn string_slice(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// `encoding/json.Marshal` of a decoded JSON value: keys sorted, Go's number format (so an
/// integral `float64` prints like the `int64`). Upstream compares compound list items by this
/// text and prints non-string enum values with it.
pub(crate) fn json(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => out.push_str(&i.to_string()),
            Num::Float(f) => out.push_str(&json_float(f)),
        },
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_json(x, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A field error whose bad value is already rendered. An empty field path prints as
/// `<nil>`, as upstream's nil `*field.Path` does (custom resources are validated with a nil
/// root path).
pub(crate) fn error(
    kind: FieldErrorKind,
    field: &Path,
    value: Option<String>,
    detail: impl Into<String>,
) -> FieldError {
    let field = if field.as_str().is_empty() { "<nil>".to_string() } else { field.to_string() };
    FieldError { kind, field, value, detail: detail.into() }
}

/// `Invalid value: <rendered>: <detail>`.
pub(crate) fn invalid(field: &Path, rendered: String, detail: impl Into<String>) -> FieldError {
    error(FieldErrorKind::Invalid, field, Some(rendered), detail)
}

/// `Unsupported value: <rendered>: supported values: "a", "b"` with Go's quoting.
pub(crate) fn not_supported(field: &Path, rendered: String, supported: &[String]) -> FieldError {
    let detail = if supported.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        format!("supported values: {}", quoted.join(", "))
    };
    error(FieldErrorKind::NotSupported, field, Some(rendered), detail)
}

/// `Duplicate value: <rendered>`.
pub(crate) fn duplicate(field: &Path, rendered: String) -> FieldError {
    error(FieldErrorKind::Duplicate, field, Some(rendered), "")
}

/// `Required value[: detail]`.
pub(crate) fn required(field: &Path, detail: impl Into<String>) -> FieldError {
    error(FieldErrorKind::Required, field, None, detail)
}

/// `Too many: <actual>: must have at most N items`.
pub(crate) fn too_many(field: &Path, actual: i64, max: i64) -> FieldError {
    let unit = if max == 1 { "item" } else { "items" };
    error(
        FieldErrorKind::TooMany,
        field,
        Some(actual.to_string()),
        format!("must have at most {max} {unit}"),
    )
}

/// `Too long: may not be more than N bytes` (upstream's wording also for code points).
pub(crate) fn too_long(field: &Path, max: i64) -> FieldError {
    let unit = if max == 1 { "byte" } else { "bytes" };
    error(FieldErrorKind::TooLong, field, None, format!("may not be more than {max} {unit}"))
}
