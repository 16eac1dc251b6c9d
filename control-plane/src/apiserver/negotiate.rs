//! Content negotiation: what the client sends (Content-Type) and wants back (Accept).

use http::HeaderMap;
use serde_json::Value;

use super::status::{ApiError, ApiResult};
use crate::machinery::protobuf;

/// Largest accepted request body (upstream's limit is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// The representation the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    /// `as=Table` with the meta.k8s.io version requested ("v1" or "v1beta1").
    Table(&'static str),
    /// `as=PartialObjectMetadata` / `PartialObjectMetadataList`.
    Metadata(&'static str),
}

pub fn output(headers: &HeaderMap) -> Output {
    let Some(accept) = headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Output::Json;
    };
    // Clients list preferences in order; take the first we can serve.
    for media in accept.split(',') {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let base = params.first().copied().unwrap_or_default();
        if !matches!(base, "application/json" | "*/*" | "application/*") {
            continue;
        }
        let param = |name: &str| {
            params.iter().find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let version = match param("v") {
            Some("v1beta1") => "v1beta1",
            _ => "v1",
        };
        match (param("as"), param("g")) {
            (None, _) => return Output::Json,
            (Some("Table"), Some("meta.k8s.io")) => return Output::Table(version),
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Output::Metadata(version);
            }
            _ => continue,
        }
    }
    Output::Json
}

/// How a request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    Json,
    Yaml,
    Protobuf,
    JsonPatch,
    MergePatch,
    StrategicMergePatch,
    ApplyPatch,
}

/// The media types an object body (create, update) may have.
pub const OBJECT_MEDIA_TYPES: [&str; 3] =
    ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"];

/// The media types a patch may have.
pub const PATCH_MEDIA_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// The type of a request body from its Content-Type (JSON when there is none); any other
/// type is a 415 naming the object types.
pub fn body_type(headers: &HeaderMap) -> ApiResult<BodyType> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    Ok(match base.as_str() {
        "" | "application/json" => BodyType::Json,
        "application/yaml" | "application/x-yaml" | "text/yaml" => BodyType::Yaml,
        "application/vnd.kubernetes.protobuf" => BodyType::Protobuf,
        "application/json-patch+json" => BodyType::JsonPatch,
        "application/merge-patch+json" => BodyType::MergePatch,
        "application/strategic-merge-patch+json" => BodyType::StrategicMergePatch,
        "application/apply-patch+yaml" | "application/apply-patch+json" => BodyType::ApplyPatch,
        _ => return Err(ApiError::unsupported_media_type(&OBJECT_MEDIA_TYPES)),
    })
}

/// The type of a patch body: one of [`PATCH_MEDIA_TYPES`], else a 415 naming them.
pub fn patch_type(headers: &HeaderMap) -> ApiResult<BodyType> {
    match body_type(headers) {
        Ok(
            t @ (BodyType::JsonPatch
            | BodyType::MergePatch
            | BodyType::StrategicMergePatch
            | BodyType::ApplyPatch),
        ) => Ok(t),
        _ => Err(ApiError::unsupported_media_type(&PATCH_MEDIA_TYPES)),
    }
}

/// Decode an object body (create/update) into JSON.
pub fn decode_object(kind: BodyType, body: &[u8]) -> ApiResult<Value> {
    if body.len() > MAX_BODY {
        return Err(ApiError::too_large(MAX_BODY));
    }
    let value = match kind {
        BodyType::Json => decode_json(body)?,
        BodyType::Yaml | BodyType::ApplyPatch => decode_yaml(body)?,
        BodyType::Protobuf => protobuf::decode_request(body)
            .map_err(|e| ApiError::bad_request(format!("unable to decode protobuf body: {e}")))?,
        _ => return Err(ApiError::unsupported_media_type(&OBJECT_MEDIA_TYPES)),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    Ok(value)
}

/// Decode a DELETE body: `DeleteOptions` in JSON, YAML or protobuf (client-go's typed
/// clients send protobuf); no body is no options.
pub fn decode_delete_options(headers: &HeaderMap, body: &[u8]) -> ApiResult<Value> {
    let none = || Value::Object(Default::default());
    if body.is_empty() {
        return Ok(none());
    }
    match body_type(headers)? {
        BodyType::Protobuf => decode_object(BodyType::Protobuf, body),
        // `null` decodes to no options, as it does into Go's struct.
        BodyType::Json => decode_json(body).map(|v| if v.is_null() { none() } else { v }),
        BodyType::Yaml => decode_yaml(body).map(|v| if v.is_null() { none() } else { v }),
        _ => Err(ApiError::unsupported_media_type(&OBJECT_MEDIA_TYPES)),
    }
}

pub fn decode_json(body: &[u8]) -> ApiResult<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}")))
}

pub fn decode_yaml(body: &[u8]) -> ApiResult<Value> {
    // JSON is YAML; try the strict and fast path first.
    if let Ok(v) = serde_json::from_slice(body) {
        return Ok(v);
    }
    serde_yaml_ng::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as YAML: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Output {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, v.parse().unwrap());
        output(&h)
    }

    #[test]
    fn picks_tables_and_json() {
        assert_eq!(
            accept(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Output::Table("v1")
        );
        assert_eq!(accept("application/vnd.kubernetes.protobuf,application/json"), Output::Json);
        assert_eq!(accept("application/json, */*"), Output::Json);
        assert_eq!(
            accept("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Output::Metadata("v1")
        );
    }

    #[test]
    fn rejects_garbage_bodies() {
        assert_eq!(decode_object(BodyType::Json, b"{not json").unwrap_err().code, 400);
        assert_eq!(decode_object(BodyType::Json, b"[1]").unwrap_err().code, 400);
        assert!(decode_object(BodyType::Yaml, b"kind: Pod\nmetadata: {name: x}\n").is_ok());
        let big = vec![b' '; MAX_BODY + 1];
        assert_eq!(decode_object(BodyType::Json, &big).unwrap_err().code, 413);
    }
}
