//! Defaulting and validation of the built-in kinds (stub until the admission module lands).

use serde_json::Value;

#[derive(Debug, Clone, Copy)]
pub struct Gvk<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Prepared {
    pub spec_changed: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("defaulting failed: {0}")]
pub struct Error(String);

#[derive(Debug, Clone)]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn reason(&self) -> &'static str {
        "FieldValueInvalid"
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

pub fn default_object(_gvk: Gvk, _obj: &mut Value) -> Result<(), Error> {
    Ok(())
}

pub fn prepare_for_create(_gvk: Gvk, _obj: &mut Value) {}

pub fn prepare_for_update(_gvk: Gvk, _sub: Option<&str>, new: &mut Value, old: &Value) -> Prepared {
    Prepared { spec_changed: new.get("spec") != old.get("spec") }
}

pub fn validate(
    _gvk: Gvk,
    _op: Operation,
    _sub: Option<&str>,
    _new: &Value,
    _old: Option<&Value>,
) -> Vec<FieldError> {
    Vec::new()
}

pub fn invalid_message(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> String {
    let what = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
    let list: Vec<String> = errs.iter().map(ToString::to_string).collect();
    if list.len() == 1 {
        format!("{what} \"{name}\" is invalid: {}", list[0])
    } else {
        format!("{what} \"{name}\" is invalid: [{}]", list.join(", "))
    }
}
