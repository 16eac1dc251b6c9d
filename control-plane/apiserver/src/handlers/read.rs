//! Reads: get from the store, list from the watch cache (consistent, exact and continued
//! lists), and componentstatuses.

use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use super::verb::CACHE_WAIT;
use super::verb::Target;
use crate::cache::{CachedObject, WatchStartError, set_resource_version};
use crate::componentstatus;
use crate::list_options::{
    EXPIRED_CONTINUE, Filter, decode_continue, encode_continue, validate_list_options,
};
use crate::negotiate::Output;
use crate::negotiate::partial_metadata;
use crate::registry::ResourceType;
use crate::render::{bytes_response, json_response};
use crate::render::{render_list, render_object, with_warnings};
use crate::request::{Query, Verb};
use crate::server::ApiServer;
use crate::status::{ApiError, ApiResult};
use crate::table;
use skiff_store::{KeyValue, Revision};

/// `componentstatuses`: get and list only, answered from the components' health now, with
/// upstream's deprecation warning.
pub(super) async fn component_statuses(
    server: &ApiServer,
    rt: &ResourceType,
    verb: Verb,
    name: Option<&str>,
    output: Output,
) -> ApiResult<Response> {
    let resp = match (verb, name) {
        (Verb::Get, Some(name)) => {
            render_object(rt, componentstatus::get(server, rt, name).await?, output)
        }
        (Verb::List, None) => render_list(rt, componentstatus::list(server).await, output),
        (verb, _) => return Err(ApiError::method_not_allowed(verb.as_str())),
    };
    Ok(with_warnings(resp, StatusCode::OK, &[componentstatus::DEPRECATION.to_string()]))
}

/// Read one object from the store with its resourceVersion set.
pub(super) async fn get_object(t: Target<'_>, name: &str) -> ApiResult<(Value, Revision)> {
    let Target { server, rt, ns } = t;
    let kv = server.store.get(&rt.key(ns, name)).await?.ok_or_else(|| {
        ApiError::not_found(&rt.qualified(), name).with_details(rt.group(), rt.plural(), name)
    })?;
    Ok((decode_stored(&kv)?, kv.mod_revision))
}

pub(super) fn decode_stored(kv: &KeyValue) -> ApiResult<Value> {
    let mut v: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("decoding stored object {}: {e}", kv.key)))?;
    set_resource_version(&mut v, kv.mod_revision);
    Ok(v)
}

pub(super) async fn list(t: Target<'_>, query: &Query, output: Output) -> ApiResult<Response> {
    let Target { server, rt, ns } = t;
    validate_list_options(query, false)?;
    let filter = Filter::from_query(rt, ns, query)?;
    let limit = query.int("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    let exact = query.get("resourceVersionMatch") == Some("Exact");
    // `pinned`: the list must be served at `list_rv` (a continued snapshot or Exact).
    let (list_rv, after, pinned) = match query.get("continue") {
        Some(token) => {
            if query.get("resourceVersion").is_some_and(|rv| rv != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, key) = decode_continue(token)?;
            // A token of another server of the cluster may be ahead of this one's cache.
            if !server.cache.wait_for(rv, CACHE_WAIT).await {
                return Err(ApiError::too_large_resource_version(rv, server.cache.revision()));
            }
            // -1: the rest of a list whose snapshot expired, at the latest revision.
            match rv {
                ..0 => (server.cache.revision(), Some(key), false),
                _ => (rv, Some(key), true),
            }
        }
        None => {
            let rv = match query.get("resourceVersion") {
                // "0": any revision is fine; serve what the cache has.
                Some("0") => server.cache.revision(),
                Some(rv) => {
                    let rv: Revision = rv.parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid resource version {rv:?}"))
                    })?;
                    if !server.cache.wait_for(rv, CACHE_WAIT).await {
                        return Err(ApiError::too_large_resource_version(
                            rv,
                            server.cache.revision(),
                        ));
                    }
                    if exact { rv } else { server.cache.revision() }
                }
                // Consistent read: wait until the cache holds every committed write.
                None => {
                    let current = server.store.current_revision().await?;
                    if !server.cache.wait_for(current, CACHE_WAIT).await {
                        return Err(ApiError::timeout(
                            "the watch cache did not catch up with the store",
                        ));
                    }
                    server.cache.revision()
                }
            };
            (rv, None, exact)
        }
    };
    let prefix = filter.prefix(rt);
    let cache = server.cache.resource(rt);
    // Every page of a list is read at the revision of its first: later pages undo the
    // changes since from the watch cache's history window.
    let all = match cache.list_at(&prefix, after.as_deref(), list_rv) {
        Ok(all) => all,
        Err(WatchStartError::TooOld { .. }) if pinned && after.is_some() => {
            let after = after.as_deref().unwrap_or_default();
            let mut e = ApiError::gone(EXPIRED_CONTINUE);
            e.continue_token = Some(encode_continue(-1, after));
            return Err(e);
        }
        Err(WatchStartError::TooOld { requested, oldest }) if pinned => {
            return Err(ApiError::gone(format!(
                "too old resource version: {requested} ({oldest})"
            )));
        }
        // A list at the latest revision that the window has passed (just reloaded): the
        // current objects, which are at least that new.
        Err(WatchStartError::TooOld { .. }) => cache.list(&prefix, after.as_deref()),
    };
    let mut items: Vec<Arc<CachedObject>> = Vec::new();
    let mut next = None;
    let mut remaining = 0usize;
    for obj in all {
        if !filter.matches(&obj) {
            continue;
        }
        if let Some(limit) = limit
            && items.len() >= limit
        {
            if next.is_none() {
                next = items.last().map(|o| encode_continue(list_rv, &o.key));
            }
            remaining += 1;
            continue;
        }
        items.push(obj);
    }
    let api_version = rt.desc.api_version();
    match output {
        Output::Table(version) => {
            let values: Vec<Value> = items.iter().map(|o| o.value()).collect();
            let mut t = table::table(rt, &values, version, None, true);
            t["metadata"] = list_meta(list_rv, next.as_deref(), remaining);
            Ok(json_response(StatusCode::OK, &t))
        }
        Output::Metadata(version) => {
            let values: Vec<Value> =
                items.iter().map(|o| partial_metadata(&o.value(), version)).collect();
            let v = json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": format!("meta.k8s.io/{version}"),
                "metadata": list_meta(list_rv, next.as_deref(), remaining),
                "items": values,
            });
            Ok(json_response(StatusCode::OK, &v))
        }
        Output::Json => {
            // Custom objects not at the request's version are converted in one review.
            let jsons: Vec<&[u8]> = items.iter().map(|o| &o.json[..]).collect();
            let converted = crate::conversion::jsons_for_request(&server.state, rt, &jsons).await?;
            // Assemble the list from the cached bytes without re-encoding each item.
            let meta = list_meta(list_rv, next.as_deref(), remaining);
            let mut out =
                Vec::with_capacity(128 + items.iter().map(|o| o.json.len() + 1).sum::<usize>());
            out.extend_from_slice(b"{\"kind\":\"");
            out.extend_from_slice(rt.list_kind().as_bytes());
            out.extend_from_slice(b"\",\"apiVersion\":\"");
            out.extend_from_slice(api_version.as_bytes());
            out.extend_from_slice(b"\",\"metadata\":");
            out.extend_from_slice(meta.to_string().as_bytes());
            out.extend_from_slice(b",\"items\":[");
            for (i, (o, converted)) in items.iter().zip(&converted).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(converted.as_deref().unwrap_or(&o.json));
            }
            out.extend_from_slice(b"]}");
            Ok(bytes_response(StatusCode::OK, "application/json", Bytes::from(out)))
        }
    }
}

pub(super) fn list_meta(rv: Revision, next: Option<&str>, remaining: usize) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(next) = next {
        meta["continue"] = json!(next);
        meta["remainingItemCount"] = json!(remaining);
    }
    meta
}
