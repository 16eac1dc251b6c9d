//! The resource verbs: get, list, create, update, patch, delete, deletecollection and the
//! status/scale/binding subresources. Reads of single objects go to the store (read your
//! writes); lists are served from the watch cache once it has caught up; a read-modify-write
//! starts from the cache's copy and reads the store only when that copy proves stale.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{Map, Value, json};

use super::cache::{CachedObject, WatchStartError, set_resource_version, with_resource_version};
use super::negotiate::{self, BodyType, Output};
use super::registry::ResourceType;
use super::request::{FieldValidation, Query, RequestInfo, Verb};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult, Cause, success_status};
use super::table;
use super::{
    ApiServer, admission as plugins, bytes_response, componentstatus, json_response, metrics_api,
    watch,
};
use skiff_core::json::ValueAt;
use skiff_machinery::admission::{self, Gvk, Operation};
use skiff_machinery::{apply, jsonpatch, schema, strategic};
use skiff_store::{self as store, KeyValue, Revision, StoreExt};

mod eviction;
mod quota;

/// How long a consistent list waits for the watch cache to catch up with the store.
const CACHE_WAIT: Duration = Duration::from_secs(3);
/// How many times a write retries after losing a compare-and-swap race.
const MAX_RETRIES: usize = 16;

pub async fn resource(
    server: &Arc<ApiServer>,
    info: RequestInfo,
    query: Query,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let rt = server
        .registry
        .find(&info.group, &info.version, &info.resource)
        .ok_or_else(ApiError::path_not_found)?;
    if let Some(sub) = info.subresource.as_deref()
        && !rt.has_subresource(sub)
    {
        return Err(ApiError::path_not_found());
    }
    // A namespaced resource addressed without a namespace only supports list/watch.
    let ns = if rt.desc.namespaced { info.namespace.as_deref() } else { None };
    if rt.desc.namespaced && ns.is_none() && !matches!(info.verb, Verb::List | Verb::Watch) {
        return Err(ApiError::path_not_found());
    }
    if !rt.desc.namespaced && info.namespace.is_some() {
        return Err(ApiError::path_not_found());
    }
    let name = info.name.as_deref();
    let output = negotiate::output(&headers);
    if rt.kind() == "ComponentStatus" && rt.group().is_empty() {
        return component_statuses(server, rt, info.verb, name, output).await;
    }
    if rt.group() == metrics_api::GROUP {
        return metrics_api::serve(server, rt, info.verb, ns, name, &query, output);
    }
    match (info.verb, name, info.subresource.as_deref()) {
        (Verb::Get, Some(name), None | Some("status")) => {
            let (obj, _) = get_object(server, rt, ns, name).await?;
            Ok(render_object(rt, obj, output))
        }
        (Verb::Get, Some(name), Some("scale")) => {
            let (obj, _) = get_object(server, rt, ns, name).await?;
            Ok(render_scale(to_scale(&obj), output))
        }
        (Verb::List, None, None) => list(server, rt, ns, &query, output).await,
        (Verb::Watch, _, None) => watch::serve(server, rt, ns, name, &query, output).await,
        (Verb::Create, None, None) => {
            let answer = Answer::for_output(output);
            let (created, code, warnings) =
                create_rendered(server, rt, ns, &query, &headers, &body, answer).await?;
            Ok(with_warnings(created.respond(rt, output), code, &warnings))
        }
        (Verb::Create, Some(name), Some("binding")) => {
            let obj = bind(server, rt, ns, name, &query, &headers, &body).await?;
            Ok(json_response(StatusCode::CREATED, &obj))
        }
        (Verb::Create, Some(name), Some("eviction")) => {
            let obj = eviction::evict(server, rt, ns, name, &query, &headers, &body).await?;
            Ok(json_response(StatusCode::CREATED, &obj))
        }
        (Verb::Update, Some(name), sub @ (None | Some("status") | Some("finalize"))) => {
            let answer = Answer::for_output(output);
            let (written, code, warnings) =
                update(server, rt, ns, name, sub, &query, &headers, &body, answer).await?;
            Ok(with_warnings(written.respond(rt, output), code, &warnings))
        }
        (Verb::Update | Verb::Patch, Some(name), Some("scale")) => {
            let obj = scale(server, rt, ns, name, info.verb, &query, &headers, &body).await?;
            Ok(render_scale(obj, output))
        }
        (Verb::Patch, Some(name), sub @ (None | Some("status"))) => {
            let answer = Answer::for_output(output);
            let (written, code, warnings) =
                patch(server, rt, ns, name, sub, &query, &headers, &body, answer).await?;
            Ok(with_warnings(written.respond(rt, output), code, &warnings))
        }
        (Verb::Delete, Some(name), None) => {
            let options = negotiate::decode_delete_options(&headers, &body)?;
            let (obj, code) = delete(server, rt, ns, name, &query, &options, true).await?;
            Ok(json_response(code, &obj))
        }
        (Verb::DeleteCollection, None, None) => {
            delete_collection(server, rt, ns, &query, &headers, &body).await
        }
        (verb, _, _) => Err(ApiError::method_not_allowed(verb.as_str())),
    }
}

/// `componentstatuses`: get and list only, answered from the components' health now, with
/// upstream's deprecation warning.
async fn component_statuses(
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

fn with_warnings(mut resp: Response, code: StatusCode, warnings: &[String]) -> Response {
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
fn render_scale(scale: Value, output: Output) -> Response {
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

pub fn partial_metadata(obj: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

// ---------------------------------------------------------------------------------------
// reads

/// Read one object from the store with its resourceVersion set.
async fn get_object(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
) -> ApiResult<(Value, Revision)> {
    let kv = server.store.get(&rt.key(ns, name)).await?.ok_or_else(|| {
        ApiError::not_found(&rt.qualified(), name).with_details(rt.group(), rt.plural(), name)
    })?;
    Ok((decode_stored(&kv)?, kv.mod_revision))
}

fn decode_stored(kv: &KeyValue) -> ApiResult<Value> {
    let mut v: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("decoding stored object {}: {e}", kv.key)))?;
    set_resource_version(&mut v, kv.mod_revision);
    Ok(v)
}

/// Upstream's answer to a continue token whose revision has left the history (`Expired`,
/// with a token for the rest of the list at the latest revision).
const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// Upstream's `ValidateListOptions`: which of resourceVersion, resourceVersionMatch,
/// continue and sendInitialEvents a list (or a watch) may combine. A 422 on
/// `ListOptions.meta.k8s.io`.
pub fn validate_list_options(query: &Query, watch: bool) -> ApiResult<()> {
    let path = admission::Path::root("resourceVersionMatch");
    let forbidden = |detail: &str| admission::FieldError::forbidden(&path, detail);
    let matched = query.get("resourceVersionMatch");
    let continued = query.get("continue").is_some();
    let send_initial = query.has("sendInitialEvents");
    let mut errs = Vec::new();
    if watch {
        if send_initial && matched != Some("NotOlderThan") {
            errs.push(forbidden(
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if let Some(m) = matched {
            if !send_initial {
                errs.push(forbidden(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if m != "NotOlderThan" {
                errs.push(admission::FieldError::not_supported(&path, m, &["NotOlderThan"]));
            }
            if continued {
                errs.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
        }
    } else {
        if let Some(m) = matched {
            let rv = query.get("resourceVersion");
            if rv.is_none() {
                errs.push(forbidden(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if continued {
                errs.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(admission::FieldError::not_supported(
                    &path,
                    m,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if m == "Exact" && rv == Some("0") {
                errs.push(forbidden(
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if send_initial {
            errs.push(admission::FieldError::forbidden(
                &admission::Path::root("sendInitialEvents"),
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    if errs.is_empty() {
        return Ok(());
    }
    Err(invalid_of("ListOptions", "meta.k8s.io", "", errs))
}

/// A continue token: the list's revision and the last key returned.
fn encode_continue(rv: Revision, key: &str) -> String {
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.to_string())
}

fn decode_continue(token: &str) -> ApiResult<(Revision, String)> {
    let bad = || ApiError::bad_request("continue key is not valid: ".to_string() + token);
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_i64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?.to_string();
    Ok((rv, start))
}

/// The selectors of a list or watch request.
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub namespace: Option<String>,
}

impl Filter {
    pub fn from_query(rt: &ResourceType, ns: Option<&str>, query: &Query) -> ApiResult<Filter> {
        let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(
            query.get("fieldSelector").unwrap_or(""),
            |f| rt.supports_field(f),
            rt.plural(),
        )?;
        Ok(Filter { labels, fields, namespace: ns.map(str::to_string) })
    }

    pub fn matches(&self, obj: &CachedObject) -> bool {
        self.labels.matches(&obj.labels) && self.fields.matches(&obj.fields)
    }

    /// The narrowest key prefix: a namespace, or one object by metadata.name.
    pub fn prefix(&self, rt: &ResourceType) -> String {
        let ns = self.namespace.as_deref().or_else(|| self.fields.required("metadata.namespace"));
        rt.namespace_prefix(ns)
    }
}

async fn list(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    output: Output,
) -> ApiResult<Response> {
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
            for (i, o) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json);
            }
            out.extend_from_slice(b"]}");
            Ok(bytes_response(StatusCode::OK, "application/json", Bytes::from(out)))
        }
    }
}

fn list_meta(rv: Revision, next: Option<&str>, remaining: usize) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(next) = next {
        meta["continue"] = json!(next);
        meta["remainingItemCount"] = json!(remaining);
    }
    meta
}

// ---------------------------------------------------------------------------------------
// writes

pub fn now() -> String {
    // Formatted once per second, not for every write that stamps a time.
    static LAST: std::sync::Mutex<(i64, String)> = std::sync::Mutex::new((i64::MIN, String::new()));
    let t = chrono::Utc::now();
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.0 != t.timestamp() {
        *last = (t.timestamp(), t.format("%Y-%m-%dT%H:%M:%SZ").to_string());
    }
    last.1.clone()
}

fn gvk(rt: &ResourceType) -> Gvk<'static> {
    Gvk { group: rt.desc.group, version: rt.desc.version, kind: rt.desc.kind }
}

/// The field manager of a write: `fieldManager`, else the user agent's program name.
/// The field manager of a write: `fieldManager`, else the User-Agent up to its first `/`.
/// A bad `fieldManager` is a 422 on the request's options kind (`CreateOptions`, ...).
fn manager(query: &Query, headers: &HeaderMap, options: &str) -> ApiResult<String> {
    if let Some(m) = query.get("fieldManager") {
        let errs = field_manager_errors(m);
        if !errs.is_empty() {
            return Err(invalid_of(options, "meta.k8s.io", "", errs));
        }
        return Ok(m.to_string());
    }
    let ua =
        headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
    Ok(ua.split('/').next().unwrap_or("unknown").chars().take(128).collect())
}

/// What upstream's field manager requires of an apply configuration before it merges it,
/// whatever the `fieldValidation`: the resource's apiVersion and a kind, and only fields
/// its schema declares (the typed conversion of the patch object). Upstream answers the
/// last two with a 500, being fixed upstream to the 400 used here.
fn check_apply_config(rt: &ResourceType, applied: &Value) -> ApiResult<()> {
    let expected = rt.desc.api_version();
    let specified = applied.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if specified != expected {
        return Err(ApiError::bad_request(
            apply::ApplyError::VersionMismatch { specified: specified.into(), expected }
                .to_string(),
        ));
    }
    let kind = applied.get("kind").and_then(Value::as_str).unwrap_or_default();
    let gvk = format!("{}/{}, Kind={kind}", rt.group(), rt.desc.version);
    // Upstream names the configuration as sent (kubectl sets its namespace).
    let object = format!(
        "{}/{}; {gvk}",
        meta_str(applied, "namespace").unwrap_or_default(),
        meta_str(applied, "name").unwrap_or_default()
    );
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({object}): no corresponding type for {gvk}"
        )));
    }
    let schemas = schema::Schemas::builtin();
    let Some(root) = schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) else {
        return Ok(());
    };
    let errors: Vec<String> = schemas
        .unknown_fields(schemas.field(root), applied)
        .iter()
        .map(|path| format!("{path}: field not declared in schema"))
        .collect();
    let detail = match errors.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    Err(ApiError::bad_request(format!("failed to create typed patch object ({object}): {detail}")))
}

/// Upstream's `ValidateFieldManager`: at most 128 bytes, printable characters only.
fn field_manager_errors(m: &str) -> Vec<admission::FieldError> {
    let path = admission::Path::root("fieldManager");
    let mut errs = Vec::new();
    if m.len() > 128 {
        errs.push(admission::FieldError::too_long(&path, 128));
    }
    for (i, c) in m.char_indices() {
        if c.is_control() || (c.is_whitespace() && c != ' ') {
            let detail = format!("invalid character U+{:04X} (at position {i})", c as u32);
            errs.push(admission::FieldError::invalid(&path, m, detail));
        }
    }
    errs
}

/// Upstream's `ValidatePatchOptions`: `force` only for an apply patch, which needs a
/// `fieldManager`. A 422 on `PatchOptions.meta.k8s.io`.
fn validate_patch_options(query: &Query, body_type: BodyType) -> ApiResult<()> {
    let mut errs = Vec::new();
    let apply = body_type == BodyType::ApplyPatch;
    if !apply && query.has("force") {
        errs.push(admission::FieldError::forbidden(
            &admission::Path::root("force"),
            "may not be specified for non-apply patch",
        ));
    }
    match query.get("fieldManager") {
        None if apply => errs.push(admission::FieldError::required(
            &admission::Path::root("fieldManager"),
            "is required for apply patch",
        )),
        None => {}
        Some(m) => errs.extend(field_manager_errors(m)),
    }
    if errs.is_empty() {
        return Ok(());
    }
    Err(invalid_of("PatchOptions", "meta.k8s.io", "", errs))
}

/// Decode a create/update body, check its type meta and apply field validation.
fn decode_for(
    rt: &ResourceType,
    body_type: BodyType,
    body: &[u8],
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<Value> {
    // The common case, a JSON body of known fields only, takes one pass: anything else
    // (errors to report, unknown fields to warn about) takes the full path below.
    if body_type == BodyType::Json
        && body.len() <= negotiate::MAX_BODY
        && let Some(normalized) = (rt.normalize.clean_json)(body)
    {
        return Ok(normalized);
    }
    let mut obj = negotiate::decode_object(body_type, body)?;
    check_type_meta(rt, &mut obj)?;
    // The typed round trip drops exactly the fields the schema does not know (both come from
    // the same types): when it changes nothing, there is no unknown field to look for.
    match (rt.normalize.borrowed)(&obj) {
        Ok(normalized) if normalized == obj => Ok(normalized),
        Ok(normalized) => {
            validate_fields(rt, &obj, validation, warnings)?;
            Ok(normalized)
        }
        Err(e) => {
            // Unknown fields are reported first, as upstream's strict decoder does.
            validate_fields(rt, &obj, validation, warnings)?;
            Err(normalize_error(rt, e))
        }
    }
}

/// kind/apiVersion must name this resource (or be absent); they are filled in.
fn check_type_meta(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    let api_version = rt.desc.api_version();
    let map = obj.as_object_mut().ok_or_else(|| ApiError::bad_request("body must be an object"))?;
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(rt.kind()));
        }
        Some(k) if k == rt.kind() => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({api_version}) or kind {k} does not match {}",
                map.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                rt.kind()
            )));
        }
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(api_version));
        }
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    Ok(())
}

fn validate_fields(
    rt: &ResourceType,
    obj: &Value,
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<()> {
    if validation == FieldValidation::Ignore {
        return Ok(());
    }
    let schemas = schema::Schemas::builtin();
    let Some(root) = schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) else {
        return Ok(());
    };
    let unknown = schemas.unknown_fields(schemas.field(root), obj);
    if unknown.is_empty() {
        return Ok(());
    }
    let msgs: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{}\"", p.trim_start_matches('.')))
        .collect();
    if validation == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!("strict decoding error: {}", msgs.join(", "))));
    }
    warnings.extend(msgs);
    Ok(())
}

/// The schema of a kind's objects (an empty schema for kinds without one).
fn kind_schema(rt: &ResourceType) -> schema::FieldSchema<'static> {
    static EMPTY: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({}));
    let schemas = schema::Schemas::builtin();
    match schemas.for_kind(rt.group(), rt.desc.version, rt.kind()) {
        Some(root) => schemas.field(root),
        None => schemas.field(&EMPTY),
    }
}

fn normalize(rt: &ResourceType, obj: Value) -> ApiResult<Value> {
    (rt.normalize.owned)(obj).map_err(|e| normalize_error(rt, e))
}

fn normalize_error(rt: &ResourceType, e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("error decoding {} {}: {e}", rt.kind(), rt.desc.api_version()))
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata was just made an object")
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str().filter(|s| !s.is_empty())
}

fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let u = uuid::Uuid::new_v4();
    u.as_bytes().iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

fn invalid(rt: &ResourceType, name: &str, errs: Vec<admission::FieldError>) -> ApiError {
    invalid_of(rt.kind(), rt.group(), name, errs)
}

/// Upstream's `NewInvalid` for `kind`.`group` `name`.
fn invalid_of(kind: &str, group: &str, name: &str, errs: Vec<admission::FieldError>) -> ApiError {
    let message = admission::invalid_message(kind, group, name, &errs);
    let causes = errs
        .iter()
        .map(|e| Cause {
            reason: e.reason().to_string(),
            // Upstream's `ErrorBody()`: the field is its own member, and clients (kubectl)
            // print it before the message.
            message: e.body(),
            field: e.field.clone(),
        })
        .collect();
    ApiError::invalid(message, causes).with_details(group, kind, name)
}

/// The stored form of an object: without resourceVersion (the store's revision is).
fn encode(obj: &Value) -> Bytes {
    Bytes::from(super::json::to_vec_without_metadata(obj, &["resourceVersion", "selfLink"]))
}

fn store_error(rt: &ResourceType, name: &str, e: store::Error) -> ApiError {
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

pub async fn create(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<(Value, StatusCode, Vec<String>)> {
    let (created, code, warnings) =
        create_rendered(server, rt, ns, query, headers, body, Answer::Object).await?;
    Ok((created.object(), code, warnings))
}

/// What a write (create, update, patch) hands back to its caller.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
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
    fn for_output(output: Output) -> Self {
        match output {
            Output::Json => Answer::Json,
            _ => Answer::Object,
        }
    }
}

/// What a write answers with: the object ([`Answer::Object`], a dry run, nothing written),
/// or its JSON as stored with the resourceVersion spliced in (the response body without
/// serializing the object a second time).
enum Written {
    Object(Value),
    Json(Bytes),
}

impl Written {
    fn object(self) -> Value {
        match self {
            Written::Object(obj) => obj,
            // Not reached for `Answer::Object`; the stored JSON always decodes.
            Written::Json(json) => serde_json::from_slice(&json).unwrap_or_default(),
        }
    }

    fn respond(self, rt: &ResourceType, output: Output) -> Response {
        match (self, output) {
            (Written::Json(json), Output::Json) => {
                bytes_response(StatusCode::OK, "application/json", json)
            }
            (written, output) => render_object(rt, written.object(), output),
        }
    }
}

/// What a write answers once `stored` is stored at `rv`: the object kept over the write, or
/// else the stored JSON.
fn written(kept: Option<Value>, stored: &[u8], rv: Revision) -> ApiResult<Written> {
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

async fn create_rendered(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    let mut warnings = Vec::new();
    let body_type = negotiate::body_type(headers)?;
    let obj = decode_for(rt, body_type, body, query.field_validation()?, &mut warnings)?;
    let manager = manager(query, headers, "CreateOptions")?;
    let dry_run = query.dry_run()?;
    let created = create_object(server, rt, ns, obj, &manager, dry_run, true, answer).await?;
    Ok((created, StatusCode::CREATED, warnings))
}

/// The namespace of a created or updated object must agree with the URL: set when the body
/// has none, cleared for a cluster-scoped resource, else a 400 (upstream's
/// `EnsureObjectNamespaceMatchesRequestNamespace`).
fn ensure_namespace(ns: Option<&str>, obj: &mut Value) -> ApiResult<()> {
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

/// The create path after decoding, shared by POST and apply-creates (which computed their
/// managed fields already: `track` false).
#[allow(clippy::too_many_arguments)]
async fn create_object(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    mut obj: Value,
    manager: &str,
    dry_run: bool,
    track: bool,
    answer: Answer,
) -> ApiResult<Written> {
    ensure_namespace(ns, &mut obj)?;
    let g = gvk(rt);
    // Upstream's order: decode+default, the field manager, mutating admission, then system
    // metadata, then the strategy, then validate, then validating admission.
    admission::default_object(g, &mut obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let ts = now();
    // The field manager sees the request as decoded and defaulted: the fields admission and
    // the strategy set are nobody's.
    if track {
        meta_mut(&mut obj).remove("managedFields");
        apply::track_update(
            None,
            &mut obj,
            manager,
            None,
            &rt.desc.api_version(),
            kind_schema(rt),
            &ts,
        );
    }
    let mut obj = plugins::admit_create(server, rt, ns, obj, dry_run).await?;
    let generate = meta_str(&obj, "name")
        .is_none()
        .then(|| meta_str(&obj, "generateName").map(str::to_string))
        .flatten();
    {
        let meta = meta_mut(&mut obj);
        if meta.get("resourceVersion").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(ts));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        if rt.tracks_generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
    }

    for attempt in 0..3 {
        // Only a generated name is ever retried: otherwise the object is used up once.
        let mut candidate = if generate.is_some() { obj.clone() } else { std::mem::take(&mut obj) };
        if let Some(prefix) = &generate {
            meta_mut(&mut candidate)
                .insert("name".into(), json!(format!("{prefix}{}", generate_suffix())));
        }
        let name = meta_str(&candidate, "name").unwrap_or_default().to_string();
        admission::prepare_for_create(g, &mut candidate);
        admission::drop_omitted_empties(g, &mut candidate);
        // Validation reads no managed fields: its typed view is built without them (their
        // fieldsV1 trees would be copied into it for nothing).
        let managed = meta_mut(&mut candidate).remove("managedFields");
        let errs = admission::validate(g, Operation::Create, None, &candidate, None);
        if let Some(managed) = managed {
            meta_mut(&mut candidate).insert("managedFields".into(), managed);
        }
        if !errs.is_empty() {
            return Err(invalid(rt, &name, errs));
        }
        if name.is_empty() {
            return Err(ApiError::invalid(
                format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    rt.kind()
                ),
                vec![Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value: name or generateName is required".into(),
                    field: "metadata.name".into(),
                }],
            ));
        }
        plugins::validate_create(server, rt, ns, &mut candidate, dry_run).await?;
        // Charged once: a retry under another generated name is the same object.
        if attempt == 0 {
            quota::charge(server, rt, ns, &candidate, dry_run).await?;
        }
        let reservation = if rt.kind() == "Service" && rt.group().is_empty() {
            Some(server.alloc.allocate(&mut candidate)?)
        } else {
            None
        };
        if dry_run {
            if let Some(r) = &reservation {
                server.alloc.release(r);
            }
            return Ok(Written::Object(candidate));
        }
        let stored = encode(&candidate);
        let key = rt.key(ns, &name);
        let cache = server.cache.resource(rt);
        cache.expect(rt, &key, &stored, &candidate);
        let kept = (answer == Answer::Object).then_some(candidate);
        let result = server.store.create(&key, stored.clone()).await;
        if result.is_err() {
            cache.unexpect(&stored);
        }
        match result {
            Ok(kv) => return written(kept, &stored, kv.mod_revision),
            Err(e) => {
                if let Some(r) = &reservation {
                    server.alloc.release(r);
                }
                if matches!(e, store::Error::AlreadyExists { .. })
                    && generate.is_some()
                    && attempt < 2
                {
                    continue;
                }
                return Err(store_error(rt, &name, e));
            }
        }
    }
    Err(ApiError::internal("could not generate a unique name"))
}

/// Who writes and how: the field manager, the subresource, whether managed fields are
/// tracked here (an apply computed its own), whether admission runs (not for the server's
/// own writes: a binding, an eviction's) and dry run.
#[derive(Clone, Copy)]
struct Writer<'a> {
    manager: &'a str,
    sub: Option<&'a str>,
    track: bool,
    admit: bool,
    dry_run: bool,
}

/// The outcome of computing an update from the current object.
enum Change {
    /// Write this object (compare-and-swap on the revision it was computed from).
    Write(Value),
    /// Remove the object (last finalizer gone from a terminating object).
    Remove,
}

#[allow(clippy::too_many_arguments)]
async fn update(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    let mut warnings = Vec::new();
    let body_type = negotiate::body_type(headers)?;
    let mut new = decode_for(rt, body_type, body, query.field_validation()?, &mut warnings)?;
    ensure_namespace(ns, &mut new)?;
    check_name(&new, name, ns)?;
    let manager = manager(query, headers, "UpdateOptions")?;
    let precondition = meta_str(&new, "resourceVersion").map(str::to_string);
    let written = guaranteed_write(
        server,
        rt,
        ns,
        name,
        Writer { manager: &manager, sub, track: true, admit: true, dry_run: query.dry_run()? },
        precondition,
        |_| Ok(new.clone()),
        answer,
    )
    .await?;
    Ok((written, StatusCode::OK, warnings))
}

/// The watch cache's copy of an object, decoded, with its revision: the first guess of a
/// read-modify-write (it may lag the store, never lead it).
fn cached_current(server: &ApiServer, rt: &ResourceType, key: &str) -> Option<(Value, Revision)> {
    let cached = server.cache.resource(rt).get(key)?;
    let value = serde_json::from_slice(&cached.json).ok()?;
    Some((value, cached.rv))
}

/// Read-modify-write with retries on revision conflicts (upstream's GuaranteedUpdate).
/// `transform` computes the desired object from the current one.
///
/// As upstream's cacher does, the first attempt starts from the watch cache's copy rather
/// than a store read. That copy may be stale: the compare-and-swap on its revision then
/// fails and the next attempt reads the store. Whatever a stale copy would decide without
/// a write (a failed precondition, an error from the transform or admission, no change at
/// all) is decided again on the store's current object before it is answered.
async fn guaranteed_update(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    w: Writer<'_>,
    precondition: Option<String>,
    transform: impl Fn(&Value) -> ApiResult<Value>,
) -> ApiResult<Value> {
    guaranteed_write(server, rt, ns, name, w, precondition, transform, Answer::Object)
        .await
        .map(Written::object)
}

/// [`guaranteed_update`] answering as asked: with [`Answer::Json`], the objects are dropped
/// once the write is encoded, and a stored write answers with its JSON.
#[allow(clippy::too_many_arguments)]
async fn guaranteed_write(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    w: Writer<'_>,
    precondition: Option<String>,
    transform: impl Fn(&Value) -> ApiResult<Value>,
    answer: Answer,
) -> ApiResult<Written> {
    let dry_run = w.dry_run;
    let key = rt.key(ns, name);
    // A dry run reads the store, as upstream's dry-run storage does.
    let mut guess = if dry_run { None } else { cached_current(server, rt, &key) };
    let admitted = w.admit;
    let mut attempt = 0;
    while attempt < MAX_RETRIES {
        let (mut current, rev, fresh) = match guess.take() {
            Some((current, rev)) => (current, rev, false),
            None => {
                attempt += 1;
                let (current, rev) = get_object(server, rt, ns, name).await?;
                (current, rev, true)
            }
        };
        let decided = async {
            if let Some(want) = &precondition
                && want != &rev.to_string()
            {
                return Err(ApiError::modified(&rt.qualified(), name).with_details(
                    rt.group(),
                    rt.plural(),
                    name,
                ));
            }
            let mut desired = transform(&current)?;
            if admitted {
                desired = plugins::admit_update(
                    server,
                    rt,
                    ns,
                    name,
                    w.sub,
                    desired,
                    &mut current,
                    dry_run,
                )
                .await?;
            }
            prepare_update(server, rt, name, w, desired, &current)
        }
        .await;
        // What a stale copy decides without writing is decided again on a store read.
        let change = match decided {
            Err(_) | Ok(None) if !fresh => continue,
            Err(e) => return Err(e),
            Ok(change) => change,
        };
        let unwritten = |obj| Ok(Written::Object(obj));
        match change {
            None => return unwritten(current),
            Some((Change::Remove, _)) => {
                if dry_run {
                    return unwritten(current);
                }
                match server.store.delete(&key, Some(rev)).await {
                    Ok(_) => {
                        release_on_delete(server, rt, &current);
                        return unwritten(current);
                    }
                    Err(store::Error::Conflict { .. }) => continue,
                    Err(e) => return Err(store_error(rt, name, e)),
                }
            }
            Some((Change::Write(mut obj), reservation)) => {
                let admission = if admitted {
                    async {
                        plugins::validate_update(
                            server,
                            rt,
                            ns,
                            name,
                            w.sub,
                            &mut obj,
                            &mut current,
                            dry_run,
                        )
                        .await?;
                        // The quota last, as on create; only the main resource changes usage.
                        // (Boxed: charging writes the quota through this function.)
                        if w.sub.is_none() {
                            Box::pin(quota::charge_update(server, rt, ns, &current, &obj, dry_run))
                                .await?;
                        }
                        Ok::<(), ApiError>(())
                    }
                    .await
                } else {
                    Ok(())
                };
                if let Err(e) = admission {
                    if let Some(r) = &reservation {
                        server.alloc.release(r);
                    }
                    if !fresh {
                        continue;
                    }
                    return Err(e);
                }
                if dry_run {
                    if let Some(r) = &reservation {
                        server.alloc.release(r);
                    }
                    // Upstream's dry-run storage answers with the revision it read.
                    set_resource_version(&mut obj, rev);
                    return unwritten(obj);
                }
                let stored = encode(&obj);
                let cache = server.cache.resource(rt);
                cache.expect(rt, &key, &stored, &obj);
                // Only a Service's write needs the objects afterwards (its allocations).
                let service = rt.kind() == "Service" && rt.group().is_empty();
                let before = service.then_some(current);
                let kept = (service || answer == Answer::Object).then_some(obj);
                let result = server.store.update(&key, stored.clone(), rev).await;
                if result.is_err() {
                    cache.unexpect(&stored);
                }
                match result {
                    Ok(kv) => {
                        if let (Some(current), Some(obj)) = (&before, &kept) {
                            server.alloc.release_service(current, Some(obj));
                        }
                        let kept = kept.filter(|_| answer == Answer::Object);
                        return written(kept, &stored, kv.mod_revision);
                    }
                    Err(store::Error::Conflict { .. } | store::Error::NotFound { .. })
                        if !fresh =>
                    {
                        // The cached copy was stale (or the object is gone): read the store.
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        continue;
                    }
                    Err(store::Error::Conflict { .. }) => {
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        if precondition.is_some() {
                            return Err(ApiError::modified(&rt.qualified(), name).with_details(
                                rt.group(),
                                rt.plural(),
                                name,
                            ));
                        }
                        continue;
                    }
                    Err(e) => {
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        return Err(store_error(rt, name, e));
                    }
                }
            }
        }
    }
    Err(ApiError::conflict(&rt.qualified(), name, "too many concurrent writes; please retry"))
}

/// Admission for an update: keep system-owned metadata, apply the strategy, default,
/// validate, track managed fields. `None` when nothing would change.
fn prepare_update(
    server: &ApiServer,
    rt: &ResourceType,
    name: &str,
    w: Writer<'_>,
    mut new: Value,
    old: &Value,
) -> ApiResult<Option<(Change, Option<super::alloc::Reservation>)>> {
    let Writer { manager, sub, track, .. } = w;
    if sub == Some("finalize") {
        // namespaces/finalize changes `spec.finalizers` and nothing else.
        let finalizers = new.at(&["spec", "finalizers"]).cloned();
        new = old.clone();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            match finalizers {
                Some(f) => spec.insert("finalizers".into(), f),
                None => spec.remove("finalizers"),
            };
        }
    }
    {
        let empty = serde_json::Map::new();
        let old_meta = old.get("metadata").and_then(Value::as_object).unwrap_or(&empty);
        let meta = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    meta.insert(field.into(), v.clone());
                }
                None => {
                    meta.remove(field);
                }
            }
        }
        // Managed fields are the server's, unless the client explicitly rewrites them.
        if !meta.contains_key("managedFields")
            && let Some(mf) = old_meta.get("managedFields")
        {
            meta.insert("managedFields".into(), mf.clone());
        }
        meta.remove("resourceVersion");
        match old_meta.get("generation") {
            Some(g) => meta.insert("generation".into(), g.clone()),
            None => meta.remove("generation"),
        };
        // A status write may change labels, annotations, finalizers and owners as well, as
        // the status strategies of these kinds allow upstream (they do not reset the metadata
        // with `ResetObjectMetaForStatus`); the kind's own restorations are in
        // `prepare_for_update`. The Deployment controller stamps its revision this way.
    }
    let g = gvk(rt);
    // pods/binding is a system write of spec.nodeName and the PodScheduled condition: no
    // pod-update validation (upstream forbids that change through a pod update).
    let binding = sub == Some("binding");
    if !binding {
        admission::default_object(g, &mut new).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if sub == Some("status") {
            match old.get("spec") {
                Some(spec) => new["spec"] = spec.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("spec");
                    }
                }
            }
        } else if rt.has_status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        // Sets metadata.generation (old + 1 when the spec changed).
        admission::prepare_for_update(g, sub, &mut new, old);
        admission::drop_omitted_empties(g, &mut new);
    }
    let reservation = if rt.kind() == "Service" && rt.group().is_empty() && sub.is_none() {
        Some(server.alloc.allocate_update(&mut new, old)?)
    } else {
        None
    };
    let release = |r: &Option<super::alloc::Reservation>| {
        if let Some(r) = r {
            server.alloc.release(r);
        }
    };
    let errs = if binding {
        Vec::new()
    } else {
        admission::validate(g, Operation::Update, sub, &new, Some(old))
    };
    if !errs.is_empty() {
        release(&reservation);
        return Err(invalid(rt, name, errs));
    }
    // Terminating and no finalizers left: the object goes away.
    let finalizers_empty = new.at(&["metadata", "finalizers"]).and_then(Value::as_array).is_none_or(|f| f.is_empty())
            // A Namespace also waits for its `spec.finalizers` (removed through /finalize).
            && (rt.kind() != "Namespace"
                || new.at(&["spec", "finalizers"]).and_then(Value::as_array).is_none_or(|f| f.is_empty()));
    let grace_pending = rt.kind() == "Pod"
        && rt.group().is_empty()
        && new.at(&["metadata", "deletionGracePeriodSeconds"]).and_then(Value::as_i64).unwrap_or(0)
            > 0;
    if meta_str(&new, "deletionTimestamp").is_some() && finalizers_empty && !grace_pending {
        release(&reservation);
        return Ok(Some((Change::Remove, None)));
    }
    let ts = now();
    if track {
        apply::track_update(
            Some(old),
            &mut new,
            manager,
            sub,
            &rt.desc.api_version(),
            kind_schema(rt),
            &ts,
        );
    }
    if same_object(&new, old) {
        release(&reservation);
        return Ok(None);
    }
    Ok(Some((Change::Write(new), reservation)))
}

/// Equal apart from resourceVersion and the timestamps of managed fields (compared in place:
/// every update asks, and most differ early).
fn same_object(a: &Value, b: &Value) -> bool {
    fn same_map(
        a: &serde_json::Map<String, Value>,
        b: &serde_json::Map<String, Value>,
        skip: Option<&str>,
        inner: impl Fn(&str, &Value, &Value) -> bool,
    ) -> bool {
        let mut a = a.iter().filter(|(k, _)| Some(k.as_str()) != skip);
        let mut b = b.iter().filter(|(k, _)| Some(k.as_str()) != skip);
        loop {
            match (a.next(), b.next()) {
                (None, None) => return true,
                (Some((ka, va)), Some((kb, vb))) if ka == kb && inner(ka, va, vb) => {}
                _ => return false,
            }
        }
    }
    let entry = |a: &Value, b: &Value| match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => same_map(a, b, Some("time"), |_, a, b| a == b),
        _ => a == b,
    };
    let managed_fields = |a: &Value, b: &Value| match (a.as_array(), b.as_array()) {
        (Some(a), Some(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| entry(a, b)),
        _ => a == b,
    };
    let metadata = |a: &Value, b: &Value| match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => same_map(a, b, Some("resourceVersion"), |k, a, b| {
            if k == "managedFields" { managed_fields(a, b) } else { a == b }
        }),
        _ => a == b,
    };
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            same_map(a, b, None, |k, a, b| if k == "metadata" { metadata(a, b) } else { a == b })
        }
        _ => a == b,
    }
}

#[allow(clippy::too_many_arguments)]
async fn patch(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    if body.len() > negotiate::MAX_BODY {
        return Err(ApiError::too_large(negotiate::MAX_BODY));
    }
    let body_type = negotiate::patch_type(headers)?;
    validate_patch_options(query, body_type)?;
    let validation = query.field_validation()?;
    let dry_run = query.dry_run()?;
    let warnings = Vec::new();

    if body_type == BodyType::ApplyPatch {
        let manager = query.get("fieldManager").unwrap_or_default();
        let force = query.flag("force");
        let mut applied = negotiate::decode_object(BodyType::ApplyPatch, body)?;
        check_apply_config(rt, &applied)?;
        check_type_meta(rt, &mut applied)?;
        check_name(&applied, name, ns)?;
        if applied.at(&["metadata", "managedFields"]).is_some_and(|m| !m.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        let api_version = rt.desc.api_version();
        let ts = now();
        let apply_to = |live: Option<&Value>| -> ApiResult<Value> {
            let merged = apply::server_side_apply(
                live,
                &applied,
                manager,
                force,
                &api_version,
                kind_schema(rt),
                &ts,
            )
            .map_err(|e| apply_error(rt, name, e))?;
            normalize(rt, merged)
        };
        // Apply creates the object when it does not exist (its Apply entry is computed).
        if server.store.get(&rt.key(ns, name)).await?.is_none() {
            let mut obj = apply_to(None)?;
            if meta_str(&obj, "name").is_none() {
                meta_mut(&mut obj).insert("name".into(), json!(name));
            }
            let created =
                create_object(server, rt, ns, obj, manager, dry_run, false, answer).await?;
            return Ok((created, StatusCode::CREATED, warnings));
        }
        let precondition = meta_str(&applied, "resourceVersion").map(str::to_string);
        let written = guaranteed_write(
            server,
            rt,
            ns,
            name,
            Writer { manager, sub, track: false, admit: true, dry_run },
            precondition,
            |live| apply_to(Some(live)),
            answer,
        )
        .await;
        return written.map(|w| (w, StatusCode::OK, warnings));
    }

    let patch_value = match body_type {
        BodyType::JsonPatch | BodyType::MergePatch | BodyType::StrategicMergePatch => {
            negotiate::decode_json(body)?
        }
        _ => return Err(ApiError::unsupported_media_type(&negotiate::PATCH_MEDIA_TYPES)),
    };
    let manager = manager(query, headers, "PatchOptions")?;
    let precondition = match body_type {
        BodyType::JsonPatch => None,
        _ => patch_value
            .at(&["metadata", "resourceVersion"])
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    // The unknown fields of the attempt that was written (a retry patches anew).
    let unknown = std::sync::Mutex::new(Vec::new());
    let written = guaranteed_write(
        server,
        rt,
        ns,
        name,
        Writer { manager: &manager, sub, track: true, admit: true, dry_run },
        precondition,
        |current| {
            let patched = apply_patch_body(rt, body_type, &patch_value, current)?;
            let mut w = Vec::new();
            validate_fields(rt, &patched, validation, &mut w)?;
            *unknown.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = w;
            let mut obj = normalize(rt, patched)?;
            check_type_meta(rt, &mut obj)?;
            check_name(&obj, name, ns)?;
            Ok(obj)
        },
        answer,
    )
    .await?;
    let warnings = unknown.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok((written, StatusCode::OK, warnings))
}

/// Upstream's `checkName`: the object an update or patch writes may not be renamed, nor
/// moved out of `ns` when one is given.
fn check_name(obj: &Value, name: &str, ns: Option<&str>) -> ApiResult<()> {
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

fn apply_patch_body(
    rt: &ResourceType,
    body_type: BodyType,
    patch: &Value,
    current: &Value,
) -> ApiResult<Value> {
    let mut doc = current.clone();
    match body_type {
        BodyType::JsonPatch => {
            let ops = jsonpatch::decode(patch).map_err(json_patch_error)?;
            jsonpatch::apply(&mut doc, &ops).map_err(json_patch_error)?;
            Ok(doc)
        }
        BodyType::MergePatch => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        BodyType::StrategicMergePatch => strategic::apply_patch(current, patch, kind_schema(rt))
            .map_err(|e| {
                let message =
                    format!("the server rejected our request due to an error in our request: {e}");
                if e.is_bad_request() {
                    ApiError::bad_request(message)
                } else {
                    ApiError::invalid(message, vec![])
                }
            }),
        _ => Err(ApiError::unsupported_media_type(&negotiate::PATCH_MEDIA_TYPES)),
    }
}

/// Upstream's answers to a JSON patch: 413 for too many operations, 400 for one that is
/// not a patch, 422 for one that does not apply or copies too much.
fn json_patch_error(e: jsonpatch::Error) -> ApiError {
    let message = format!("the server rejected our request due to an error in our request: {e}");
    match e {
        jsonpatch::Error::TooManyOperations(_) => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", e.to_string())
        }
        jsonpatch::Error::Decode(_) => ApiError::bad_request(message),
        jsonpatch::Error::CopyTooLarge { .. } | jsonpatch::Error::Apply(_) => {
            ApiError::invalid(message, vec![])
        }
    }
}

fn apply_error(rt: &ResourceType, name: &str, e: apply::ApplyError) -> ApiError {
    let code = StatusCode::from_u16(e.status_code()).unwrap_or(StatusCode::CONFLICT);
    let mut err = match code {
        StatusCode::CONFLICT => ApiError::new(code, "Conflict", e.to_string()),
        StatusCode::BAD_REQUEST => ApiError::bad_request(e.to_string()),
        _ => ApiError::invalid(e.to_string(), vec![]),
    }
    .with_details(rt.group(), rt.plural(), name);
    if let apply::ApplyError::Conflicts(conflicts) = &e {
        err.causes = conflicts
            .iter()
            .map(|c| Cause {
                reason: "FieldManagerConflict".into(),
                message: c.cause_message(),
                field: c.field_path.clone(),
            })
            .collect();
    }
    err
}

// ---------------------------------------------------------------------------------------
// delete

fn release_on_delete(server: &ApiServer, rt: &ResourceType, obj: &Value) {
    if rt.kind() == "Service" && rt.group().is_empty() {
        server.alloc.release_service(obj, None);
    }
}

/// Namespaces that may not be deleted (upstream's NamespaceLifecycle admission).
const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Delete one object with `options` (DeleteOptions). `admit`: run the DELETE admission
/// (false for an eviction, admitted as a `pods/eviction` create instead).
async fn delete(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    query: &Query,
    options: &Value,
    admit: bool,
) -> ApiResult<(Value, StatusCode)> {
    let dry_run = query.dry_run()?
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    // Upstream: a negative grace period is taken as 1 s on the delete path.
    let grace_override = match query.int("gracePeriodSeconds")? {
        Some(g) => Some(g),
        None => grace_in_options(options)?,
    }
    .map(|g| if g < 0 { 1 } else { g });
    let propagation = query
        .get("propagationPolicy")
        .map(str::to_string)
        .or_else(|| options.get("propagationPolicy").and_then(Value::as_str).map(str::to_string))
        .or_else(|| match options.get("orphanDependents").and_then(Value::as_bool) {
            Some(true) => Some("Orphan".into()),
            _ => None,
        });
    if let Some(p) = &propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(ApiError::invalid(
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
            ),
            vec![],
        ));
    }
    if rt.kind() == "Namespace" && rt.group().is_empty() && IMMORTAL_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        ))
        .with_details(rt.group(), rt.plural(), name));
    }
    if rt.kind() == "PriorityClass"
        && admission::SYSTEM_PRIORITY_CLASSES.iter().any(|(system, _, _)| *system == name)
    {
        return Err(ApiError::forbidden(format!(
            "priorityclasses.scheduling.k8s.io \"{name}\" is forbidden: this is a system priority class and cannot be deleted"
        ))
        .with_details(rt.group(), rt.plural(), name));
    }
    let is_pod = rt.kind() == "Pod" && rt.group().is_empty();
    let is_namespace = rt.kind() == "Namespace" && rt.group().is_empty();
    let key = rt.key(ns, name);
    let mut admitted = !admit;
    for _ in 0..MAX_RETRIES {
        let (current, rev) = get_object(server, rt, ns, name).await?;
        if !admitted {
            plugins::admit_delete(server, rt, ns, name, &current, dry_run).await?;
            admitted = true;
        }
        if let Some(pre) = options.get("preconditions") {
            let uid = meta_str(&current, "uid").unwrap_or_default();
            if let Some(want) = pre.get("uid").and_then(Value::as_str)
                && want != uid
            {
                return Err(ApiError::conflict(
                    &rt.qualified(),
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                    ),
                ));
            }
            if let Some(want) = pre.get("resourceVersion").and_then(Value::as_str)
                && want != rev.to_string()
            {
                return Err(ApiError::conflict(
                    &rt.qualified(),
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rev}"
                    ),
                ));
            }
        }
        let mut finalizers: Vec<Value> = current
            .at(&["metadata", "finalizers"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let add_finalizer = match propagation.as_deref() {
            Some("Orphan") => Some("orphan"),
            Some("Foreground") => Some("foregroundDeletion"),
            _ => None,
        };
        if let Some(f) = add_finalizer
            && !finalizers.iter().any(|x| x == f)
        {
            finalizers.push(json!(f));
        }
        let grace = if is_pod {
            let scheduled = meta_str(&current, "deletionTimestamp").is_some()
                || current
                    .at(&["spec", "nodeName"])
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty());
            let finished = matches!(
                current.at(&["status", "phase"]).and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            if !scheduled || finished {
                0
            } else {
                grace_override
                    .or_else(|| {
                        current
                            .at(&["spec", "terminationGracePeriodSeconds"])
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    .max(0)
            }
        } else {
            0
        };
        let namespace_finalizers = is_namespace
            && current
                .at(&["spec", "finalizers"])
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
        if grace > 0 || !finalizers.is_empty() || namespace_finalizers {
            // Graceful: mark the object; its finalizers / the agent finish the deletion.
            let mut marked = current.clone();
            let already = meta_str(&current, "deletionTimestamp").is_some();
            {
                let meta = meta_mut(&mut marked);
                if !already
                    || (is_pod
                        && grace
                            < meta
                                .get("deletionGracePeriodSeconds")
                                .and_then(Value::as_i64)
                                .unwrap_or(i64::MAX))
                {
                    let when = skiff_core::time::chrono_add_secs(chrono::Utc::now(), grace);
                    meta.insert(
                        "deletionTimestamp".into(),
                        json!(when.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
                    );
                    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                if !finalizers.is_empty() {
                    meta.insert("finalizers".into(), Value::Array(finalizers));
                }
                meta.remove("resourceVersion");
            }
            if is_namespace {
                marked["status"] = json!({"phase": "Terminating"});
            }
            if !is_pod && grace == 0 {
                meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if same_object(&marked, &current) || dry_run {
                return Ok((current, StatusCode::OK));
            }
            match server.store.update(&key, encode(&marked), rev).await {
                Ok(kv) => {
                    set_resource_version(&mut marked, kv.mod_revision);
                    return Ok((marked, StatusCode::OK));
                }
                Err(store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(store_error(rt, name, e)),
            }
        }
        if dry_run {
            return Ok((current, StatusCode::OK));
        }
        match server.store.delete(&key, Some(rev)).await {
            Ok(_) => {
                release_on_delete(server, rt, &current);
                let uid = meta_str(&current, "uid").unwrap_or_default();
                let out = if is_pod {
                    current.clone()
                } else {
                    success_status(rt.group(), rt.plural(), name, uid)
                };
                return Ok((out, StatusCode::OK));
            }
            Err(store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(store_error(rt, name, e)),
        }
    }
    Err(ApiError::conflict(&rt.qualified(), name, "too many concurrent writes; please retry"))
}

/// `gracePeriodSeconds` of a DeleteOptions body: an integer, or refused (a float or a
/// number past int64 is not silently dropped).
fn grace_in_options(options: &Value) -> ApiResult<Option<i64>> {
    match options.get("gracePeriodSeconds") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "DeleteOptions.gracePeriodSeconds: invalid value {v}: must be a 64-bit integer"
            ))
        }),
    }
}

async fn delete_collection(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Response> {
    let options = negotiate::decode_delete_options(headers, body)?;
    let filter = Filter::from_query(rt, ns, query)?;
    let current = server.store.current_revision().await?;
    server.cache.wait_for(current, CACHE_WAIT).await;
    let items: Vec<Arc<CachedObject>> = server
        .cache
        .resource(rt)
        .list(&filter.prefix(rt), None)
        .into_iter()
        .filter(|o| filter.matches(o))
        .collect();
    let mut deleted = Vec::new();
    for obj in &items {
        let obj_ns = (!obj.namespace.is_empty()).then_some(obj.namespace.as_str());
        match delete(server, rt, obj_ns, &obj.name, query, &options, true).await {
            Ok((v, _)) => {
                if v.get("kind").and_then(Value::as_str) == Some(rt.kind()) {
                    deleted.push(v);
                } else {
                    deleted.push(obj.value());
                }
            }
            Err(e) if e.reason == "NotFound" => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": rt.list_kind(),
        "apiVersion": rt.desc.api_version(),
        "metadata": {"resourceVersion": server.cache.revision().to_string()},
        "items": deleted,
    });
    Ok(json_response(StatusCode::OK, &list))
}

// ---------------------------------------------------------------------------------------
// subresources

/// autoscaling/v1 Scale of a workload.
fn to_scale(obj: &Value) -> Value {
    // A ReplicationController's selector is a plain label map; the apps kinds' a
    // LabelSelector (matchLabels).
    let labels = match obj.get("kind").and_then(Value::as_str) {
        Some("ReplicationController") => obj.at(&["spec", "selector"]),
        _ => obj.at(&["spec", "selector", "matchLabels"]),
    };
    let selector = labels
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let meta = obj.get("metadata").cloned().unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": {"replicas": obj.at(&["spec", "replicas"]).cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": obj.at(&["status", "replicas"]).cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

#[allow(clippy::too_many_arguments)]
async fn scale(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    verb: Verb,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Value> {
    let body_type = match verb {
        Verb::Update => negotiate::body_type(headers)?,
        _ => negotiate::patch_type(headers)?,
    };
    let manager = match verb {
        Verb::Update => manager(query, headers, "UpdateOptions")?,
        _ => {
            validate_patch_options(query, body_type)?;
            manager(query, headers, "PatchOptions")?
        }
    };
    let dry_run = query.dry_run()?;
    let (scale_body, precondition) = match verb {
        Verb::Update => {
            let v = negotiate::decode_object(body_type, body)?;
            let rv =
                v.at(&["metadata", "resourceVersion"]).and_then(Value::as_str).map(str::to_string);
            (Some(v), rv)
        }
        _ => (None, None),
    };
    let patch_value = match verb {
        Verb::Patch => Some(negotiate::decode_json(body)?),
        _ => None,
    };
    let obj = guaranteed_update(server, rt, ns, name, Writer { manager: &manager, sub: None, track: true, admit: true, dry_run }, precondition.filter(|s| !s.is_empty()), |current| {
        let current_scale = to_scale(current);
        let new_scale = match (&scale_body, &patch_value) {
            (Some(b), _) => b.clone(),
            (None, Some(p)) => {
                let mut doc = current_scale.clone();
                match body_type {
                    BodyType::JsonPatch => {
                        let ops = jsonpatch::decode(p).map_err(json_patch_error)?;
                        jsonpatch::apply(&mut doc, &ops).map_err(json_patch_error)?;
                    }
                    _ => json_patch::merge(&mut doc, p),
                }
                doc
            }
            (None, None) => current_scale,
        };
        let replicas = new_scale.at(&["spec", "replicas"]).and_then(Value::as_i64).unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"),
                vec![Cause { reason: "FieldValueInvalid".into(), message: "must be greater than or equal to 0".into(), field: "spec.replicas".into() }],
            ));
        }
        let mut out = current.clone();
        out["spec"]["replicas"] = json!(replicas);
        Ok(out)
    })
    .await?;
    Ok(to_scale(&obj))
}

/// pods/binding: assign a pod to a node once.
async fn bind(
    server: &ApiServer,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Value> {
    let binding = negotiate::decode_object(negotiate::body_type(headers)?, body)?;
    let node =
        binding.at(&["target", "name"]).and_then(Value::as_str).unwrap_or_default().to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            format!("Binding \"{name}\" is invalid: target.name: Required value"),
            vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "target.name".into(),
            }],
        ));
    }
    let manager = manager(query, headers, "CreateOptions")?;
    let dry_run = query.dry_run()?;
    plugins::admit_subresource_create(server, rt, ns, name, "binding", &binding, dry_run).await?;
    let success = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    // The common case without decoding the pod: the cached copy, if it can be bound, edited
    // as JSON and compare-and-swapped on its revision. Anything else (no copy, a stale one,
    // a pod that is terminating or bound already, a dry run) takes the general path below,
    // which decides on the store's current object.
    let key = rt.key(ns, name);
    if !dry_run
        && let Some(cached) = server.cache.resource(rt).get(&key)
        && let Some(bound) = bound_json(&cached.json, &node, &now())
    {
        match server.store.update(&key, Bytes::from(bound), cached.rv).await {
            Ok(_) => return Ok(success),
            Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_error(rt, name, e)),
        }
    }
    // Upstream assigns the pod straight in storage (`assignPod`), past the field manager: a
    // binding leaves managedFields as they were (no scheduler entry), and skips their diff.
    // Admitted above as a subresource create of its Binding body.
    let w = Writer { manager: &manager, sub: Some("binding"), track: false, admit: false, dry_run };
    guaranteed_update(server, rt, ns, name, w, None, move |current| {
        if meta_str(current, "deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(existing) =
            current.at(&["spec", "nodeName"]).and_then(Value::as_str).filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "pods/binding",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut out = current.clone();
        out["spec"]["nodeName"] = json!(node);
        let status = std::mem::take(&mut out["status"]);
        out["status"] = scheduled_status(status, &now());
        Ok(out)
    })
    .await?;
    Ok(success)
}

/// `status` with its PodScheduled condition replaced by a True one (what a binding writes).
fn scheduled_status(mut status: Value, now: &str) -> Value {
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let mut conditions: Vec<Value> =
        conditions.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
    conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                           "lastTransitionTime": now}));
    status["conditions"] = Value::Array(conditions);
    status
}

/// The stored form of a pod (`cached`: its JSON as the watch cache holds it) bound to
/// `node`, edited member by member: only `status` is decoded, the other members are copied
/// as they are. The bytes are those the general path would store (members in key order,
/// no resourceVersion). `None` when the pod cannot be bound (terminating, assigned
/// already) or the JSON is not the object expected; the caller then decides on a store
/// read.
fn bound_json(cached: &[u8], node: &str, now: &str) -> Option<Vec<u8>> {
    use serde_json::value::{RawValue, to_raw_value};
    use std::collections::BTreeMap;
    type Members<'a> = BTreeMap<String, &'a RawValue>;

    let mut top: Members = serde_json::from_slice(cached).ok()?;
    let mut meta: Members = serde_json::from_str(top.get("metadata")?.get()).ok()?;
    if meta.contains_key("deletionTimestamp") {
        return None;
    }
    meta.remove("resourceVersion");
    meta.remove("selfLink");
    let mut spec: Members = serde_json::from_str(top.get("spec")?.get()).ok()?;
    if spec.get("nodeName").is_some_and(|n| !matches!(n.get(), "\"\"" | "null")) {
        return None;
    }
    let status: Value = match top.get("status") {
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
        None => Value::Null,
    };
    let node = to_raw_value(node).ok()?;
    spec.insert("nodeName".into(), &node);
    let (meta, spec) = (to_raw_value(&meta).ok()?, to_raw_value(&spec).ok()?);
    let status = to_raw_value(&scheduled_status(status, now)).ok()?;
    top.insert("metadata".into(), &meta);
    top.insert("spec".into(), &spec);
    top.insert("status".into(), &status);
    serde_json::to_vec(&top).ok()
}

// ---------------------------------------------------------------------------------------
// metrics

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    code: String,
}

/// Request counters and latency for /metrics (apiserver_request_* as upstream names them).
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            latency: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
        }
    }
}

impl Metrics {
    pub fn observe(&self, method: &Method, code: StatusCode, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: method.as_str().to_string(),
                code: code.as_u16().to_string(),
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    pub fn render(&self, server: &ApiServer) -> Response {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "apiserver_request",
            "Requests by HTTP verb and code",
            self.requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Request latency",
            self.latency.clone(),
        );
        let objects: Family<Vec<(String, String)>, prometheus_client::metrics::gauge::Gauge> =
            Family::default();
        for rt in server.registry.all() {
            objects
                .get_or_create(&vec![("resource".to_string(), rt.qualified())])
                .set(server.cache.resource(rt).len() as i64);
        }
        registry.register("apiserver_storage_objects", "Objects stored per resource", objects);
        type ByComponent = Family<Vec<(String, String)>, prometheus_client::metrics::gauge::Gauge>;
        let (restarts, panics, failing) =
            (ByComponent::default(), ByComponent::default(), ByComponent::default());
        for c in server.components.statuses() {
            let labels = vec![("component".to_string(), c.name.to_string())];
            restarts.get_or_create(&labels).set(c.restarts as i64);
            panics.get_or_create(&labels).set(c.reconcile_panics as i64);
            failing.get_or_create(&labels).set(i64::from(c.failing.is_some()));
        }
        registry.register(
            "skiff_component_restarts",
            "Restarts of a supervised component (controller, scheduler) after it stopped or panicked",
            restarts,
        );
        registry.register(
            "skiff_component_reconcile_panics",
            "Panics caught in one reconcile of a supervised component",
            panics,
        );
        registry.register(
            "skiff_component_failing",
            "1 while a supervised component counts as failing (as its health check reports)",
            failing,
        );
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            return ApiError::internal("encoding metrics").into_response_inner();
        }
        let mut r = Response::new(axum::body::Body::from(out));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        r
    }
}

impl ApiError {
    fn into_response_inner(self) -> Response {
        axum::response::IntoResponse::into_response(self)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::same_object;

    /// Decoding skips the unknown-field walk when the typed round trip changes nothing; that
    /// holds only if every unknown field makes it change something. Checked for every kind,
    /// at the top level and nested in metadata, in every validation mode; and a plain pod
    /// takes the fast path.
    #[test]
    fn unknown_fields_are_found_whether_or_not_the_walk_is_skipped() {
        use super::{BodyType, FieldValidation, decode_for};
        use crate::registry::Registry;

        let registry = Registry::new();
        // Read-only resources (componentstatuses, metrics) never decode a body.
        for rt in registry.all().iter().filter(|rt| rt.desc.verbs.contains(&"create")) {
            let clean = json!({"apiVersion": rt.desc.api_version(), "kind": rt.kind(),
                "metadata": {"name": "x", "labels": {"a": "b"}}});
            let mut top = clean.clone();
            top["bogusTop"] = json!(1);
            let mut nested = clean.clone();
            nested["metadata"]["bogusMeta"] = json!({"deep": true});
            for (obj, field) in [(top, "bogusTop"), (nested, "metadata.bogusMeta")] {
                let body = serde_json::to_vec(&obj).unwrap();
                let mut warnings = Vec::new();
                let strict =
                    decode_for(rt, BodyType::Json, &body, FieldValidation::Strict, &mut warnings);
                let err = strict.expect_err(&format!("{}: {field} passed Strict", rt.kind()));
                assert!(format!("{err:?}").contains(field), "{}: {err:?}", rt.kind());
                let warned =
                    decode_for(rt, BodyType::Json, &body, FieldValidation::Warn, &mut warnings)
                        .unwrap();
                assert!(warnings.iter().any(|w| w.contains(field)), "{}: {warnings:?}", rt.kind());
                let pruned = warned.get("bogusTop").is_none()
                    && warned["metadata"].get("bogusMeta").is_none();
                assert!(pruned, "{}: {field} not pruned", rt.kind());
            }
        }
        let pods = registry.find("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "labels": {"app": "bench"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let normalized = (pods.normalize.borrowed)(&pod).unwrap();
        assert_eq!(normalized, pod, "a plain pod round-trips unchanged (no walk needed)");
    }

    #[test]
    fn same_object_ignores_only_resource_version_and_managed_field_times() {
        let pod = |rv: &str, time: &str, label: &str, manager: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "resourceVersion": rv, "labels": {"app": label},
                    "managedFields": [{"manager": manager, "operation": "Update", "time": time,
                        "fieldsV1": {"f:metadata": {}}}]},
                "spec": {"nodeName": "n1"}})
        };
        let base = pod("1", "2026-01-01T00:00:00Z", "a", "kubectl");
        assert!(same_object(&base, &pod("2", "2026-01-02T00:00:00Z", "a", "kubectl")));
        assert!(!same_object(&base, &pod("1", "2026-01-01T00:00:00Z", "b", "kubectl")));
        assert!(!same_object(&base, &pod("1", "2026-01-01T00:00:00Z", "a", "skiff")));
        let mut extra = base.clone();
        extra["spec"]["hostname"] = json!("h");
        assert!(!same_object(&base, &extra));
        let mut no_rv = base.clone();
        no_rv["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        assert!(same_object(&base, &no_rv) && same_object(&no_rv, &base));
        let mut two_managers = base.clone();
        two_managers["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(json!({"manager": "x", "operation": "Update"}));
        assert!(!same_object(&base, &two_managers));
        // Only the named keys are skipped, an empty one included.
        let (mut x, mut y) = (base.clone(), base.clone());
        x[""] = json!(1);
        y[""] = json!(2);
        assert!(!same_object(&x, &y));
    }

    /// The binding fast path stores exactly what the general path (decode, transform,
    /// encode) would, and declines every pod the general path would refuse.
    #[test]
    fn bound_json_is_the_general_paths_binding() {
        use super::{bound_json, encode, scheduled_status};
        use crate::cache::with_resource_version;

        let stored = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "\u{e9}\"x"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
                "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {}}}}]},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}],
                "nodeName": "", "priority": 0, "terminationGracePeriodSeconds": 30},
            "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                {"type": "Other", "status": "True"}]}});
        let now = "2026-11-22T12:00:00Z";
        let general = |obj: &serde_json::Value| {
            let mut out = obj.clone();
            out["spec"]["nodeName"] = json!("n1");
            let status = std::mem::take(&mut out["status"]);
            out["status"] = scheduled_status(status, now);
            encode(&out).to_vec()
        };
        for obj in [stored.clone(), {
            let mut o = stored.clone();
            o.as_object_mut().unwrap().remove("status");
            o["spec"].as_object_mut().unwrap().remove("nodeName");
            o
        }] {
            let cached = with_resource_version(&serde_json::to_vec(&obj).unwrap(), 42).unwrap();
            let fast = bound_json(&cached, "n1", now).expect("bindable");
            assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(general(&obj)).unwrap());
        }
        let mut bound = stored.clone();
        bound["spec"]["nodeName"] = json!("n2");
        let mut terminating = stored.clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
        for refused in [bound, terminating] {
            assert_eq!(bound_json(&serde_json::to_vec(&refused).unwrap(), "n1", now), None);
        }
        assert_eq!(bound_json(b"[1]", "n1", now), None);
    }

    /// A store that counts its single-key reads.
    struct CountingGets {
        inner: skiff_store::memory::MemoryStore,
        gets: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl skiff_store::Store for CountingGets {
        async fn get(&self, key: &str) -> skiff_store::Result<Option<skiff_store::KeyValue>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get(key).await
        }
        async fn list(&self, prefix: &str) -> skiff_store::Result<skiff_store::ListResult> {
            self.inner.list(prefix).await
        }
        async fn txn(
            &self,
            ops: Vec<skiff_store::TxnOp>,
        ) -> skiff_store::Result<Vec<skiff_store::TxnResult>> {
            self.inner.txn(ops).await
        }
        async fn current_revision(&self) -> skiff_store::Result<skiff_store::Revision> {
            self.inner.current_revision().await
        }
        async fn watch(
            &self,
            prefix: &str,
            after: skiff_store::Revision,
        ) -> skiff_store::Result<
            futures::stream::BoxStream<'static, skiff_store::Result<skiff_store::Event>>,
        > {
            self.inner.watch(prefix, after).await
        }
        async fn compact(&self, revision: skiff_store::Revision) -> skiff_store::Result<()> {
            self.inner.compact(revision).await
        }
        async fn compacted_revision(&self) -> skiff_store::Result<skiff_store::Revision> {
            self.inner.compacted_revision().await
        }
    }

    /// Updates start from the watch cache's copy: with the cache caught up, an update reads
    /// nothing from the store. Made stale on purpose (a write straight to the store the cache
    /// has not seen yet, on this single-threaded runtime), the copy must neither lose that
    /// write nor decide a precondition.
    #[tokio::test]
    async fn updates_from_a_stale_cached_copy_see_the_store() {
        use std::sync::Arc;
        use std::time::Duration;

        use http::{Method, StatusCode};
        use serde_json::Value;

        use crate::{ApiServer, testing};
        use skiff_store::StoreExt;
        use skiff_store::memory::MemoryStore;

        let store = Arc::new(CountingGets { inner: MemoryStore::new(), gets: Default::default() });
        let gets = || store.gets.load(std::sync::atomic::Ordering::SeqCst);
        let api = ApiServer::start(store.clone(), Default::default()).await.expect("apiserver");
        let call = |method: Method, uri: &str, ct: &str, body: Value| {
            let api = api.clone();
            let uri = uri.to_string();
            let ct = ct.to_string();
            async move { testing::call(&api, None, method, &uri, &ct, body).await }
        };
        let uri = "/api/v1/namespaces/default/configmaps";
        let (s, created) = call(
            Method::POST,
            uri,
            "application/json",
            json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{created}");
        let rt = api.registry.find("", "v1", "configmaps").expect("configmaps");
        let key = rt.key(Some("default"), "cm");
        assert!(
            api.cache
                .wait_for(api.store.current_revision().await.unwrap(), Duration::from_secs(5))
                .await
        );

        // A current copy: the update is computed from it, without a store read.
        let before = gets();
        let (s, body) = call(
            Method::PATCH,
            &format!("{uri}/cm"),
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"l": "1"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(gets(), before, "an update from a current cached copy read the store");
        let created = body;
        assert!(
            api.cache
                .wait_for(api.store.current_revision().await.unwrap(), Duration::from_secs(5))
                .await
        );

        // Behind the cache's back: data.b, at a revision the cache does not hold yet.
        let stale_rv = api.cache.resource(rt).get(&key).expect("cached").rv;
        let mut behind = created.clone();
        behind["data"]["b"] = json!("2");
        behind["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        let fresh = api
            .store
            .update(&key, serde_json::to_vec(&behind).unwrap().into(), stale_rv)
            .await
            .expect("direct write");
        assert_eq!(
            api.cache.resource(rt).get(&key).expect("cached").rv,
            stale_rv,
            "cache already caught up"
        );

        // A precondition on the store's revision holds although the cache has another one.
        let mut put = behind.clone();
        put["metadata"]["resourceVersion"] = json!(fresh.mod_revision.to_string());
        put["data"]["c"] = json!("3");
        let before = gets();
        let (s, body) = call(Method::PUT, &format!("{uri}/cm"), "application/json", put).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["data"], json!({"a": "1", "b": "2", "c": "3"}));
        assert!(gets() > before, "the stale copy's precondition was not decided on a store read");

        // A merge patch keeps every earlier write; the cached revision is now a conflict.
        let (s, body) = call(
            Method::PATCH,
            &format!("{uri}/cm"),
            "application/merge-patch+json",
            json!({"data": {"d": "4"}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["data"], json!({"a": "1", "b": "2", "c": "3", "d": "4"}));
        let mut stale = created.clone();
        stale["metadata"]["resourceVersion"] = json!(stale_rv.to_string());
        let (s, body) = call(Method::PUT, &format!("{uri}/cm"), "application/json", stale).await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
    }
}
