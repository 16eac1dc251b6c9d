//! Field errors as upstream's `k8s.io/apimachinery/pkg/util/validation/field` prints them:
//! the error type, the field path, the bad value and the 422 message built from a list.

use std::fmt;

/// The kind of a field error; `reason()` is the `StatusCause.reason` upstream sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    NotFound,
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    Internal,
}

impl FieldErrorKind {
    /// `StatusCause.reason` ("FieldValueInvalid", ...).
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotFound => "FieldValueNotFound",
            Self::Required => "FieldValueRequired",
            Self::Duplicate => "FieldValueDuplicate",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::Internal => "InternalError",
        }
    }

    /// The words upstream prints ("Invalid value", ...).
    pub fn words(self) -> &'static str {
        match self {
            Self::NotFound => "Not found",
            Self::Required => "Required value",
            Self::Duplicate => "Duplicate value",
            Self::Invalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
            Self::Internal => "Internal error",
        }
    }

    /// Whether upstream prints the bad value for this kind.
    fn prints_value(self) -> bool {
        !matches!(self, Self::Required | Self::Forbidden | Self::TooLong | Self::Internal)
    }
}

/// One validation failure of one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    /// Field path as upstream prints it: `spec.template.spec.containers[0].name`.
    pub field: String,
    /// The bad value already formatted as upstream prints it (`"XYZ"` quoted for strings,
    /// `-1` for numbers); `None` when upstream omits it.
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    /// `StatusCause.reason`.
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }

    /// `StatusCause.message`: the error without the field path (upstream `ErrorBody`).
    pub fn body(&self) -> String {
        let mut s = String::from(self.kind.words());
        if self.kind.prints_value()
            && let Some(v) = &self.value
        {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    pub fn required(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Required, field, None, detail)
    }

    pub fn forbidden(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Forbidden, field, None, detail)
    }

    pub fn invalid(field: &Path, value: impl BadValue, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, field, Some(value.render()), detail)
    }

    /// `Invalid value: <detail>` without the value (upstream's `field.OmitValueType`).
    pub fn invalid_without_value(field: &Path, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, field, None, detail)
    }

    pub fn duplicate(field: &Path, value: impl BadValue) -> Self {
        Self::new(FieldErrorKind::Duplicate, field, Some(value.render()), "")
    }

    pub fn not_found(field: &Path, value: impl BadValue) -> Self {
        Self::new(FieldErrorKind::NotFound, field, Some(value.render()), "")
    }

    /// `Unsupported value: "X": supported values: "A", "B"` (values printed in the order given,
    /// which callers keep sorted like upstream).
    pub fn not_supported(field: &Path, value: impl BadValue, supported: &[&str]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(FieldErrorKind::NotSupported, field, Some(value.render()), detail)
    }

    /// `Too long: may not be more than N bytes`.
    pub fn too_long(field: &Path, max_len: usize) -> Self {
        let unit = if max_len == 1 { "byte" } else { "bytes" };
        Self::new(
            FieldErrorKind::TooLong,
            field,
            None,
            format!("may not be more than {max_len} {unit}"),
        )
    }

    /// `Too many: N: must have at most M items`.
    pub fn too_many(field: &Path, actual: usize, max: usize) -> Self {
        let unit = if max == 1 { "item" } else { "items" };
        Self::new(
            FieldErrorKind::TooMany,
            field,
            Some(actual.to_string()),
            format!("must have at most {max} {unit}"),
        )
    }

    fn new(
        kind: FieldErrorKind,
        field: &Path,
        value: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self { kind, field: field.0.clone(), value, detail: detail.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// A value as upstream's `%v`/`%q` prints it in a field error.
pub trait BadValue {
    fn render(&self) -> String;
}

impl BadValue for &str {
    fn render(&self) -> String {
        go_quote(self)
    }
}
impl BadValue for &String {
    fn render(&self) -> String {
        go_quote(self)
    }
}
impl BadValue for String {
    fn render(&self) -> String {
        go_quote(self)
    }
}
macro_rules! plain_value {
    ($($t:ty),*) => {$(
        impl BadValue for $t {
            fn render(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
plain_value!(i32, i64, u32, u64, usize, bool, f64);

impl BadValue for &serde_json::Value {
    fn render(&self) -> String {
        match self {
            serde_json::Value::String(s) => go_quote(s),
            serde_json::Value::Null => "null".to_string(),
            other => other.to_string(),
        }
    }
}

/// A value printed verbatim (for lists and structs, where upstream prints Go syntax).
pub struct Raw(pub String);
impl BadValue for Raw {
    fn render(&self) -> String {
        self.0.clone()
    }
}

/// Go's `%q` (`strconv.Quote`) for a string: double quotes, with `"`, `\`, control
/// characters (by their short escapes where Go has one) and C1 controls escaped.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%q` of a `[]string`: `[]string{"a", "b"}`.
pub fn go_string_list(items: &[String]) -> Raw {
    let quoted: Vec<String> = items.iter().map(|s| go_quote(s)).collect();
    Raw(format!("[]string{{{}}}", quoted.join(", ")))
}

/// A field path (`spec.containers[0].name`), built like upstream's `field.Path`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Path(String);

impl Path {
    pub fn root(name: &str) -> Self {
        Self(name.to_string())
    }

    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            return Self(name.to_string());
        }
        let mut s = String::with_capacity(self.0.len() + 1 + name.len());
        s.push_str(&self.0);
        s.push('.');
        s.push_str(name);
        Self(s)
    }

    pub fn index(&self, i: usize) -> Self {
        // Written into a string of the right size, not formatted: validation builds a path
        // for every list item it visits.
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(i);
        let mut s = String::with_capacity(self.0.len() + digits.len() + 2);
        s.push_str(&self.0);
        s.push('[');
        s.push_str(digits);
        s.push(']');
        Self(s)
    }

    pub fn key(&self, k: &str) -> Self {
        Self(format!("{}[{k}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The list of errors a validation step returns.
pub type ErrorList = Vec<FieldError>;

/// Upstream `ErrorList.ToAggregate().Error()`: duplicates dropped, one error bare, several
/// in brackets joined by ", ".
pub fn aggregate(errs: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::with_capacity(errs.len());
    for e in errs {
        let msg = e.to_string();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    if seen.len() == 1 { seen.pop().unwrap_or_default() } else { format!("[{}]", seen.join(", ")) }
}

/// Go's `%#v` of a `map[string]string`: `map[string]string{"a":"b", "c":"d"}`.
pub fn go_string_map(m: Option<&std::collections::BTreeMap<String, String>>) -> Raw {
    let Some(m) = m else {
        return Raw("map[string]string(nil)".into());
    };
    let items: Vec<String> =
        m.iter().map(|(k, v)| format!("{}:{}", go_quote(k), go_quote(v))).collect();
    Raw(format!("map[string]string{{{}}}", items.join(", ")))
}

/// A JSON rendering for struct values (upstream prints Go syntax there).
pub fn json_value<T: serde::Serialize>(v: &T) -> Raw {
    Raw(serde_json::to_string(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::Path;

    #[test]
    fn paths_name_children_indices_and_keys() {
        let spec = Path::root("spec");
        assert_eq!(
            spec.child("containers").index(0).child("image").as_str(),
            "spec.containers[0].image"
        );
        assert_eq!(spec.index(7).as_str(), "spec[7]");
        assert_eq!(spec.index(10).as_str(), "spec[10]");
        assert_eq!(spec.index(usize::MAX).as_str(), format!("spec[{}]", usize::MAX));
        assert_eq!(Path::root("").child("a").as_str(), "a");
        assert_eq!(spec.key("k").as_str(), "spec[k]");
    }
}
