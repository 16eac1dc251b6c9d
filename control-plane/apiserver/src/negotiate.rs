//! Content negotiation: what the client sends (Content-Type) and wants back (Accept).

use http::HeaderMap;
use serde_json::{Value, json};

use super::status::{ApiError, ApiResult};
use skiff_machinery::protobuf;

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

/// The deepest nesting a body may have: serde_json's own recursion limit (128), so nothing
/// it would accept is refused; the YAML decoder is given the same.
pub const MAX_DEPTH: usize = 128;

pub fn decode_yaml(body: &[u8]) -> ApiResult<Value> {
    // JSON is YAML; try the strict and fast path first.
    match serde_json::from_slice(body) {
        Ok(v) => return Ok(v),
        // Too deep as JSON is too deep as YAML: don't hand it to the YAML parser.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            return Err(ApiError::bad_request(format!("error decoding request body: {e}")));
        }
        Err(_) => {}
    }
    // The YAML scanner's cost per token grows with the flow nesting around it (quadratic in
    // the depth: 200 KB of `{a: ` took 14 s): refuse deep flow nesting first, in one pass.
    if yaml_flow_depth_exceeds(body, MAX_DEPTH) {
        return Err(ApiError::bad_request(format!(
            "error decoding request body as YAML: flow collections nested deeper than {MAX_DEPTH}"
        )));
    }
    serde_saphyr::from_slice_with_options(body, yaml_options())
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as YAML: {e}")))
}

/// serde-saphyr's limits with the depth raised to [`MAX_DEPTH`] (its default, 64, would
/// refuse bodies JSON accepts); its other budgets (nodes, aliases, scalar bytes) bound a
/// request far above what MAX_BODY lets in.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Whether the YAML text nests flow collections (`[...]`, `{...}`) deeper than `limit`, by
/// one pass over its bytes that follows YAML's lexical rules closely enough for real
/// manifests: brackets inside quoted scalars, comments, block scalars (`|`, `>`) and block
/// plain scalars (`key: a[0]`) are content, not structure.
fn yaml_flow_depth_exceeds(text: &[u8], limit: usize) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        /// Before a token: indicators, a collection, a scalar may start here.
        Token,
        /// Inside a plain scalar.
        Plain,
        Double,
        Single,
        Comment,
    }
    let blank = |c: u8| matches!(c, b' ' | b'\t' | b'\r' | b'\n');
    let mut depth = 0usize;
    let mut mode = Mode::Token;
    // Block scalar content: lines indented deeper than this are skipped.
    let mut block_scalar: Option<usize> = None;
    let mut line_indent = 0usize;
    let mut at_line_start = true;
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        let next = text.get(i + 1).copied().unwrap_or(b'\n');
        if at_line_start {
            let indent = text[i..].iter().take_while(|&&b| b == b' ').count();
            let rest = text.get(i + indent).copied().unwrap_or(b'\n');
            if let Some(parent) = block_scalar {
                if indent > parent || rest == b'\n' || rest == b'\r' {
                    // Skip the line.
                    i += text[i..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(text.len() - i, |p| p + 1);
                    continue;
                }
                block_scalar = None;
            }
            line_indent = indent;
            at_line_start = false;
            if depth == 0 && matches!(mode, Mode::Plain | Mode::Comment) {
                mode = Mode::Token;
            }
            i += indent;
            continue;
        }
        if c == b'\n' {
            at_line_start = true;
            if mode == Mode::Comment {
                mode = Mode::Token;
            }
            i += 1;
            continue;
        }
        match mode {
            Mode::Comment => {}
            Mode::Double => match c {
                b'\\' => i += 1,
                b'"' => mode = Mode::Plain,
                _ => {}
            },
            Mode::Single => {
                if c == b'\'' {
                    if next == b'\'' {
                        i += 1;
                    } else {
                        mode = Mode::Plain;
                    }
                }
            }
            Mode::Token | Mode::Plain => {
                let flow = depth > 0;
                let token = mode == Mode::Token;
                match c {
                    b'#' if token || (i > 0 && blank(text[i - 1])) => mode = Mode::Comment,
                    b'[' | b'{' if token || flow => {
                        depth += 1;
                        if depth > limit {
                            return true;
                        }
                        mode = Mode::Token;
                    }
                    b']' | b'}' if flow => {
                        depth -= 1;
                        mode = Mode::Plain;
                    }
                    b',' if flow => mode = Mode::Token,
                    b':' if blank(next)
                        || (flow && matches!(next, b',' | b'[' | b']' | b'{' | b'}')) =>
                    {
                        mode = Mode::Token
                    }
                    b'"' if token => mode = Mode::Double,
                    b'\'' if token => mode = Mode::Single,
                    b'|' | b'>' if token && !flow => {
                        block_scalar = Some(line_indent);
                        mode = Mode::Comment;
                    }
                    b'-' | b'?' if token && blank(next) => {}
                    b'&' | b'*' | b'!' if token => {
                        // An anchor, alias or tag: up to the next blank.
                        while i + 1 < text.len()
                            && !blank(text[i + 1])
                            && !(flow && matches!(text[i + 1], b',' | b'[' | b']' | b'{' | b'}'))
                        {
                            i += 1;
                        }
                    }
                    _ if blank(c) => {}
                    _ => mode = Mode::Plain,
                }
            }
        }
        i += 1;
    }
    false
}

/// An object as `PartialObjectMetadata` of meta.k8s.io/`version` (the `as=PartialObjectMetadata`
/// output): kind, apiVersion and its metadata.
pub fn partial_metadata(obj: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A request body in JSON, or in protobuf (kubectl's clientset sends built-in types so):
/// the review and TokenRequest kinds are decoded with their k8s-pb types.
pub fn decode_review(body: &[u8], kind: &str) -> ApiResult<Value> {
    if skiff_machinery::protobuf::is_protobuf(body) {
        return decode_protobuf(body)
            .map_err(|e| ApiError::bad_request(format!("decoding the {kind}: {e}")));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("decoding the {kind}: {e}")))
}

fn decode_protobuf(body: &[u8]) -> Result<Value, String> {
    use k8s_pb::api::{authentication::v1 as authn, authorization::v1 as authz};
    use prost::Message;
    let payload = body.get(4..).ok_or("short body")?;
    let unknown =
        k8s_pb::apimachinery::pkg::runtime::Unknown::decode(payload).map_err(|e| e.to_string())?;
    let kind = unknown.type_meta.and_then(|t| t.kind).unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let res = |r: Option<authz::ResourceAttributes>| {
        r.map(|r| {
            json!({"namespace": r.namespace, "verb": r.verb, "group": r.group, "version": r.version,
                   "resource": r.resource, "subresource": r.subresource, "name": r.name})
        })
    };
    let non = |r: Option<authz::NonResourceAttributes>| {
        r.map(|r| json!({"path": r.path, "verb": r.verb}))
    };
    let err = |e: prost::DecodeError| e.to_string();
    let mut spec = match kind.as_str() {
        "SelfSubjectAccessReview" => {
            let spec = authz::SelfSubjectAccessReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            json!({"resourceAttributes": res(spec.resource_attributes), "nonResourceAttributes": non(spec.non_resource_attributes)})
        }
        "SubjectAccessReview" => {
            let spec = authz::SubjectAccessReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            let extra: serde_json::Map<String, Value> =
                spec.extra.into_iter().map(|(k, v)| (k, json!(v.items))).collect();
            json!({"resourceAttributes": res(spec.resource_attributes), "nonResourceAttributes": non(spec.non_resource_attributes),
                   "user": spec.user, "groups": spec.groups, "uid": spec.uid, "extra": extra})
        }
        "SelfSubjectRulesReview" => {
            let spec = authz::SelfSubjectRulesReview::decode(raw.as_slice())
                .map_err(err)?
                .spec
                .unwrap_or_default();
            json!({"namespace": spec.namespace})
        }
        "TokenRequest" => {
            let spec =
                authn::TokenRequest::decode(raw.as_slice()).map_err(err)?.spec.unwrap_or_default();
            let bound = spec.bound_object_ref.map(|b| {
                json!({"kind": b.kind, "apiVersion": b.api_version, "name": b.name, "uid": b.u_id})
            });
            json!({"audiences": spec.audiences, "expirationSeconds": spec.expiration_seconds, "boundObjectRef": bound})
        }
        other => return Err(format!("unsupported protobuf kind {other:?}")),
    };
    if let Value::Object(m) = &mut spec {
        m.retain(|_, v| !v.is_null());
    }
    Ok(json!({"kind": kind, "spec": spec}))
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
    fn deep_flow_nesting_is_refused_before_parsing() {
        let deep =
            |open: &str, close: &str, n: usize| format!("{}{}", open.repeat(n), close.repeat(n));
        for body in [
            deep("[", "]", 100_000),
            deep("{a: ", "}", 40_000),
            format!("a: {}", deep("[", "]", 40_000)),
        ] {
            let started = std::time::Instant::now();
            let e = decode_yaml(body.as_bytes()).unwrap_err();
            assert_eq!(e.code, 400, "{}", e.message);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(2),
                "{:?}",
                started.elapsed()
            );
        }
        // At the limit it is the parser's to decide; brackets that are content do not count.
        assert!(!yaml_flow_depth_exceeds(deep("[", "]", MAX_DEPTH).as_bytes(), MAX_DEPTH));
        assert!(yaml_flow_depth_exceeds(deep("[", "]", MAX_DEPTH + 1).as_bytes(), MAX_DEPTH));
        let content = format!(
            "a: x[0]{}\nb: \"{}\"\nc: '{}'\n# {}\nd: |\n  {}\n  {}\ne: [1, {{f: \"]]]\"}}, 'it''s']\n",
            "[".repeat(200),
            "[".repeat(200),
            "{".repeat(200),
            "[".repeat(200),
            "{".repeat(200),
            "[".repeat(200),
        );
        assert!(
            !yaml_flow_depth_exceeds(content.as_bytes(), MAX_DEPTH),
            "content is not structure"
        );
        let v = decode_yaml(content.as_bytes()).expect("decodes");
        assert_eq!(v["e"][2], "it's");
        // A string cannot close what it did not open.
        let sneaky = format!("{}\"{}\"{}", "[".repeat(100), "]".repeat(100), "[".repeat(100));
        assert!(yaml_flow_depth_exceeds(sneaky.as_bytes(), MAX_DEPTH));
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
