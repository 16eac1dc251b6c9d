//! managedFields and server-side apply (stub until the apply module lands).

use serde_json::Value;

use super::schema::FieldSchema;

#[derive(Debug, Clone)]
pub struct Conflict {
    pub manager: String,
    pub field_path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("conflicts")]
    Conflicts(Vec<Conflict>),
    #[error("invalid apply configuration: {0}")]
    Invalid(String),
}

pub fn track_update(
    _old: Option<&Value>,
    _new: &mut Value,
    _manager: &str,
    _subresource: Option<&str>,
    _api_version: &str,
    _now: &str,
) {
}

pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    _manager: &str,
    _force: bool,
    _api_version: &str,
    _schema: FieldSchema,
    _now: &str,
) -> Result<Value, ApplyError> {
    let mut out = live.cloned().unwrap_or(Value::Null);
    json_patch::merge(&mut out, applied);
    Ok(out)
}
