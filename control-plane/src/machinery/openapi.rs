//! OpenAPI v2/v3 documents (stub until the openapi module lands).

use std::collections::HashMap;

use bytes::Bytes;

use super::ResourceDesc;

#[derive(Debug, thiserror::Error)]
#[error("building OpenAPI documents: {0}")]
pub struct Error(String);

#[derive(Debug, Clone, Default)]
pub struct OpenApiDocs {
    pub root: Bytes,
    /// "api/v1", "apis/apps/v1" → (hash, document)
    pub group_versions: HashMap<String, (String, Bytes)>,
    pub v2_json: Bytes,
    pub v2_protobuf: Bytes,
}

impl OpenApiDocs {
    pub fn build(_resources: &[ResourceDesc]) -> Result<OpenApiDocs, Error> {
        Ok(OpenApiDocs { root: Bytes::from_static(b"{\"paths\":{}}"), ..Default::default() })
    }
}
