//! What the verbs share: the [`Target`] they act on, how a write answers ([`Answer`],
//! [`Written`]), the name and namespace checks, store errors as `Status` objects, and the
//! bounds on retries and on waiting for the watch cache. Below every verb; the dispatch in
//! `mod.rs` is above them all.

use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value, json};

use crate::cache::{set_resource_version, with_resource_version};
use crate::negotiate::Output;
use crate::registry::ResourceType;
use crate::render::{bytes_response, render_object};
use crate::server::ApiServer;
use crate::status::invalid_of;
use crate::status::{ApiError, ApiResult};
use skiff_machinery::admission::{self, Gvk};
use skiff_store::{self as store, Revision};

/// What a verb acts on: the server, the resource type and the request's namespace (`None`
/// for a cluster-scoped resource, or a list across namespaces).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub server: &'a ApiServer,
    pub rt: &'a ResourceType,
    pub ns: Option<&'a str>,
}

/// How long a consistent list waits for the watch cache to catch up with the store.
pub(super) const CACHE_WAIT: Duration = Duration::from_secs(3);

/// How many times a write retries after losing a compare-and-swap race.
pub(super) const MAX_RETRIES: usize = 16;

pub(super) fn gvk(rt: &ResourceType) -> Gvk<'static> {
    Gvk { group: rt.desc.group, version: rt.desc.version, kind: rt.desc.kind }
}

pub(super) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata was just made an object")
}

pub(super) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str().filter(|s| !s.is_empty())
}

pub(super) fn invalid(rt: &ResourceType, name: &str, errs: Vec<admission::FieldError>) -> ApiError {
    invalid_of(rt.kind(), rt.group(), name, errs)
}

/// The stored form of an object: without resourceVersion (the store's revision is).
pub(super) fn encode(obj: &Value) -> Bytes {
    Bytes::from(crate::json::to_vec_without_metadata(obj, &["resourceVersion", "selfLink"]))
}

pub(super) fn store_error(rt: &ResourceType, name: &str, e: store::Error) -> ApiError {
    match e {
        store::Error::AlreadyExists { .. } => ApiError::already_exists(&rt.qualified(), name)
            .with_details(rt.group(), rt.plural(), name),
        store::Error::NotFound { .. } => {
            ApiError::not_found(&rt.qualified(), name).with_details(rt.group(), rt.plural(), name)
        }
        store::Error::Conflict { .. } => {
            ApiError::modified(&rt.qualified(), name).with_details(rt.group(), rt.plural(), name)
        }
        other => other.into(),
    }
}

/// What a write (create, update, patch) hands back to its caller.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// The written object.
    Object,
    /// Its JSON as stored, when it was stored (not on a dry run, nor when nothing changed).
    /// The object is then dropped as soon as it is encoded, before the store's write is
    /// awaited: freed on the thread that built it, while its memory is still in cache
    /// (freeing it after the await, maybe on the other worker, was ~7% of a create's CPU).
    Json,
}

impl Answer {
    /// A JSON response is the stored JSON; a Table or metadata needs the object.
    pub(super) fn for_output(output: Output) -> Self {
        match output {
            Output::Json => Answer::Json,
            _ => Answer::Object,
        }
    }
}

/// What a write answers with: the object ([`Answer::Object`], a dry run, nothing written),
/// or its JSON as stored with the resourceVersion spliced in (the response body without
/// serializing the object a second time).
pub(super) enum Written {
    Object(Value),
    Json(Bytes),
}

impl Written {
    pub(super) fn object(self) -> Value {
        match self {
            Written::Object(obj) => obj,
            // Not reached for `Answer::Object`; the stored JSON always decodes.
            Written::Json(json) => serde_json::from_slice(&json).unwrap_or_default(),
        }
    }

    /// The answer at the request's version (a custom object is stored at the storage
    /// version).
    pub(super) async fn respond(
        self,
        state: &crate::state::State,
        rt: &ResourceType,
        output: Output,
    ) -> ApiResult<Response> {
        Ok(match (self, output) {
            (Written::Json(json), Output::Json) => {
                let json =
                    crate::conversion::json_for_request(state, rt, &json).await?.unwrap_or(json);
                bytes_response(StatusCode::OK, "application/json", json)
            }
            (written, output) => {
                let mut obj = written.object();
                crate::conversion::for_request(state, rt, &mut obj).await?;
                render_object(rt, obj, output)
            }
        })
    }
}

/// What a write answers once `stored` is stored at `rv`: the object kept over the write, or
/// else the stored JSON.
pub(super) fn written(kept: Option<Value>, stored: &[u8], rv: Revision) -> ApiResult<Written> {
    let mut obj = match kept {
        Some(obj) => obj,
        None => match with_resource_version(stored, rv) {
            Some(json) => return Ok(Written::Json(json)),
            // Not reached (a written object has metadata); the caller still gets it.
            None => serde_json::from_slice(stored)
                .map_err(|e| ApiError::internal(format!("decoding the written object: {e}")))?,
        },
    };
    set_resource_version(&mut obj, rv);
    Ok(Written::Object(obj))
}

/// The namespace of a created or updated object must agree with the URL: set when the body
/// has none, cleared for a cluster-scoped resource, else a 400 (upstream's
/// `EnsureObjectNamespaceMatchesRequestNamespace`).
pub(super) fn ensure_namespace(ns: Option<&str>, obj: &mut Value) -> ApiResult<()> {
    match (ns, meta_str(obj, "namespace")) {
        (Some(url), Some(body)) if url != body => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (Some(url), _) => {
            meta_mut(obj).insert("namespace".into(), json!(url));
            Ok(())
        }
        (None, _) => {
            meta_mut(obj).remove("namespace");
            Ok(())
        }
    }
}

/// Upstream's `checkName`: the object an update or patch writes may not be renamed, nor
/// moved out of `ns` when one is given.
pub(super) fn check_name(obj: &Value, name: &str, ns: Option<&str>) -> ApiResult<()> {
    if let Some(other) = meta_str(obj, "name").filter(|n| *n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({other}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(ns), Some(other)) = (ns, meta_str(obj, "namespace"))
        && other != ns
    {
        return Err(ApiError::bad_request(format!(
            "the namespace of the object ({other}) does not match the namespace on the URL ({ns})"
        )));
    }
    Ok(())
}

pub(super) fn release_on_delete(server: &ApiServer, rt: &ResourceType, obj: &Value) {
    if rt.kind() == "Service" && rt.group().is_empty() {
        server.alloc.release_service(obj, None);
    }
}
