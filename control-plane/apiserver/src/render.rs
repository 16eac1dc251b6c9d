//! Rendering an object or a server-computed list in the form the client asked for: JSON,
//! a Table, or PartialObjectMetadata; and warnings as `Warning` headers.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::negotiate::{Output, partial_metadata};
use crate::registry::ResourceType;
use crate::table;

/// A list computed by the server, not read from the store (no resourceVersion), in the form
/// the client asked for.
pub(super) fn render_list(rt: &ResourceType, items: Vec<Value>, output: Output) -> Response {
    match output {
        Output::Table(version) => {
            json_response(StatusCode::OK, &table::table(rt, &items, version, None, true))
        }
        Output::Metadata(version) => json_response(
            StatusCode::OK,
            &json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": format!("meta.k8s.io/{version}"),
                "metadata": {},
                "items": items.iter().map(|o| partial_metadata(o, version)).collect::<Vec<_>>(),
            }),
        ),
        Output::Json => json_response(
            StatusCode::OK,
            &json!({"kind": format!("{}List", rt.kind()), "apiVersion": rt.desc.api_version(),
                "metadata": {}, "items": items}),
        ),
    }
}

pub(crate) fn with_warnings(mut resp: Response, code: StatusCode, warnings: &[String]) -> Response {
    *resp.status_mut() = code;
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

pub(super) fn render_object(rt: &ResourceType, obj: Value, output: Output) -> Response {
    match output {
        Output::Table(version) => json_response(
            StatusCode::OK,
            &table::table(rt, std::slice::from_ref(&obj), version, None, true),
        ),
        Output::Metadata(version) => {
            json_response(StatusCode::OK, &partial_metadata(&obj, version))
        }
        Output::Json => json_response(StatusCode::OK, &obj),
    }
}

/// A Scale subresource body, as a Table when asked for one.
pub(crate) fn render_scale(scale: Value, output: Output) -> Response {
    match output {
        Output::Table(version) => json_response(
            StatusCode::OK,
            &table::table_of("Scale", std::slice::from_ref(&scale), version, None, true),
        ),
        Output::Metadata(version) => {
            json_response(StatusCode::OK, &partial_metadata(&scale, version))
        }
        Output::Json => json_response(StatusCode::OK, &scale),
    }
}

pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    bytes_response(code, "application/json", Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

pub(crate) fn bytes_response(
    code: StatusCode,
    content_type: &'static str,
    body: Bytes,
) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
