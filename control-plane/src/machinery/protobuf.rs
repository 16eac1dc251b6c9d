//! Kubernetes protobuf request bodies (stub until the protobuf module lands).

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("protobuf bodies are not supported yet")]
    Unsupported,
}

pub fn decode(_body: &[u8]) -> Result<Value, Error> {
    Err(Error::Unsupported)
}
