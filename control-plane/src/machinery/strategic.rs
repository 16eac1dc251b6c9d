//! Strategic merge patch (stub until the strategic module lands).

use serde_json::Value;

use super::schema::FieldSchema;

#[derive(Debug, thiserror::Error)]
#[error("invalid strategic merge patch: {0}")]
pub struct Error(String);

pub fn apply_patch(original: &Value, patch: &Value, _schema: FieldSchema) -> Result<Value, Error> {
    let mut out = original.clone();
    json_patch::merge(&mut out, patch);
    Ok(out)
}
