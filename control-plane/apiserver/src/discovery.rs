//! Discovery: legacy (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`) and aggregated
//! (`apidiscovery.k8s.io` v2 and v2beta1, chosen by the Accept header).
//!
//! The group/versions of APIServices proxied to extension apiservers are merged in (in
//! their priority order, after the ones served here, and in place of a local one of the
//! same group/version): `/apis` lists every one of them, available or not, as upstream
//! does; aggregated discovery lists their resources from the document each extension last
//! answered its availability check with (`Stale` while it is unavailable). Their
//! `/apis/<g>/<v>` is the extension's own answer, proxied (the crate root routes it).

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::status::{ApiError, ApiResult};
use crate::render::json_response;
use crate::state::State;
use skiff_machinery::ResourceDesc;

/// Which aggregated discovery version the client accepts, if any (first preference wins).
fn aggregated(headers: &HeaderMap) -> Option<&'static str> {
    let accept = headers.get(header::ACCEPT)?.to_str().ok()?;
    for media in accept.split(',') {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let has = |p: &str| params.contains(&p);
        if has("g=apidiscovery.k8s.io") && has("as=APIGroupDiscoveryList") {
            if has("v=v2") {
                return Some("v2");
            }
            if has("v=v2beta1") {
                return Some("v2beta1");
            }
        } else if params.first().is_some_and(|m| *m == "application/json" || *m == "*/*")
            && params.len() == 1
        {
            return None;
        }
    }
    None
}

fn aggregated_response(version: &str, body: Value) -> Response {
    let mut resp = json_response(StatusCode::OK, &body);
    let ct = format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList");
    if let Ok(v) = HeaderValue::from_str(&ct) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp.headers_mut().insert("Vary", HeaderValue::from_static("Accept"));
    resp
}

pub fn legacy_root(state: &State, headers: &HeaderMap) -> Response {
    if let Some(v) = aggregated(headers) {
        return aggregated_response(v, discovery_list(state, v, true));
    }
    json_response(
        StatusCode::OK,
        &json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }),
    )
}

pub fn groups_root(state: &State, headers: &HeaderMap) -> Response {
    if let Some(v) = aggregated(headers) {
        return aggregated_response(v, discovery_list(state, v, false));
    }
    let groups: Vec<Value> =
        groups(state).into_iter().map(|(g, versions)| group_json(&g, &versions)).collect();
    json_response(
        StatusCode::OK,
        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
    )
}

pub fn group(state: &State, group: &str) -> ApiResult<Response> {
    let found =
        groups(state).into_iter().find(|(g, _)| g == group).ok_or_else(ApiError::path_not_found)?;
    let mut body = group_json(&found.0, &found.1);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Ok(json_response(StatusCode::OK, &body))
}

/// (group, version) pairs of every served resource, built-in and custom, in discovery order.
fn group_versions(descs: &[ResourceDesc]) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for d in descs {
        if !out.contains(&(d.group, d.version)) {
            out.push((d.group, d.version));
        }
    }
    out
}

fn groups(state: &State) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |g: &str, v: &str| match out.iter_mut().find(|(og, _)| og == g) {
        Some((_, vs)) => {
            if !vs.iter().any(|ov| ov == v) {
                vs.push(v.to_string())
            }
        }
        None => out.push((g.to_string(), vec![v.to_string()])),
    };
    for (g, v) in group_versions(&state.registry.served_descs()) {
        if !g.is_empty() && state.remotes.find(g, v).is_none() {
            add(g, v);
        }
    }
    for r in state.remotes.all().iter().filter(|r| !r.group.is_empty()) {
        add(&r.group, &r.version);
    }
    out
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub fn resource_list(state: &State, group: &str, version: &str) -> ApiResult<Response> {
    let all = state.registry.served_descs();
    let descs: Vec<&ResourceDesc> =
        all.iter().filter(|d| d.group == group && d.version == version).collect();
    if descs.is_empty() {
        return Err(ApiError::path_not_found());
    }
    let mut resources = Vec::new();
    for d in &descs {
        let mut r = json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": d.verbs,
            "storageVersionHash": storage_hash(d),
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        for s in d.subresources {
            let mut sr = json!({
                "name": format!("{}/{}", d.plural, s.name),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": if s.kind.is_empty() { d.kind } else { s.kind },
                "verbs": s.verbs,
            });
            if !s.group.is_empty() {
                sr["group"] = json!(s.group);
                sr["version"] = json!(s.version);
            }
            resources.push(sr);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let body = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources});
    Ok(json_response(StatusCode::OK, &body))
}

fn storage_hash(d: &ResourceDesc) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (d.group, d.version, d.kind).hash(&mut h);
    let bytes = h.finish().to_be_bytes();
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)[..11].to_string()
}

/// The aggregated discovery document of either the legacy group (`/api`) or all named groups.
fn discovery_list(state: &State, version: &str, legacy: bool) -> Value {
    let mut items: Vec<Value> = Vec::new();
    let mut group_names: Vec<&'static str> = Vec::new();
    let all = state.registry.served_descs();
    let gvs = group_versions(&all);
    for &(g, v) in &gvs {
        if g.is_empty() == legacy && !group_names.contains(&g) && state.remotes.find(g, v).is_none()
        {
            group_names.push(g);
        }
    }
    for g in group_names {
        let mut versions = Vec::new();
        for &(gg, v) in &gvs {
            if gg != g || state.remotes.find(g, v).is_some() {
                continue;
            }
            let resources: Vec<Value> = all
                .iter()
                .filter(|d| d.group == g && d.version == v)
                .map(|d| {
                    let subs: Vec<Value> = d
                        .subresources
                        .iter()
                        .map(|s| {
                            let (sg, sv, sk) = if s.kind.is_empty() {
                                (d.group, d.version, d.kind)
                            } else {
                                (s.group, s.version, s.kind)
                            };
                            json!({"subresource": s.name, "responseKind": {"group": sg, "version": sv, "kind": sk}, "verbs": s.verbs})
                        })
                        .collect();
                    let mut r = json!({
                        "resource": d.plural,
                        "responseKind": {"group": d.group, "version": d.version, "kind": d.kind},
                        "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": d.singular,
                        "verbs": d.verbs,
                    });
                    if !d.short_names.is_empty() {
                        r["shortNames"] = json!(d.short_names);
                    }
                    if !d.categories.is_empty() {
                        r["categories"] = json!(d.categories);
                    }
                    if !subs.is_empty() {
                        r["subresources"] = Value::Array(subs);
                    }
                    r
                })
                .collect();
            versions.push(json!({"version": v, "resources": resources, "freshness": "Current"}));
        }
        items.push(
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions}),
        );
    }
    if !legacy {
        add_remote_groups(state, &mut items);
    }
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// The proxied group/versions whose extension answered a discovery check, each in its
/// group's item (a new one after the local groups, or a built-in group's).
fn add_remote_groups(state: &State, items: &mut Vec<Value>) {
    for r in state.remotes.all().iter().filter(|r| !r.group.is_empty()) {
        let Some(doc) = state.remotes.discovery(&r.name) else { continue };
        let version = remote_version(&r.group, &r.version, &doc, r.available);
        let at = items.iter().position(|i| i["metadata"]["name"] == r.group.as_str());
        let at = at.unwrap_or_else(|| {
            items.push(
                json!({"metadata": {"name": r.group, "creationTimestamp": null}, "versions": []}),
            );
            items.len() - 1
        });
        if let Some(vs) = items[at]["versions"].as_array_mut() {
            vs.push(version);
        }
    }
}

/// An extension's `APIResourceList` as an aggregated discovery version: its resources
/// with their subresources (`widgets/status`) folded in, as upstream converts the
/// discovery of extensions that serve only the legacy format.
fn remote_version(group: &str, version: &str, doc: &Value, fresh: bool) -> Value {
    let listed = doc["resources"].as_array().cloned().unwrap_or_default();
    let mut resources: Vec<Value> = Vec::new();
    for r in listed.iter().filter(|r| !r["name"].as_str().unwrap_or_default().contains('/')) {
        let kind = |r: &Value| {
            json!({
                "group": r["group"].as_str().unwrap_or(group),
                "version": r["version"].as_str().unwrap_or(version),
                "kind": r["kind"],
            })
        };
        let mut out = json!({
            "resource": r["name"],
            "responseKind": kind(r),
            "scope": if r["namespaced"] == true { "Namespaced" } else { "Cluster" },
            "singularResource": r["singularName"],
            "verbs": r["verbs"],
        });
        for key in ["shortNames", "categories"] {
            if r[key].as_array().is_some_and(|a| !a.is_empty()) {
                out[key] = r[key].clone();
            }
        }
        let prefix = format!("{}/", r["name"].as_str().unwrap_or_default());
        let subs: Vec<Value> = listed
            .iter()
            .filter_map(|s| {
                let sub = s["name"].as_str()?.strip_prefix(&prefix)?;
                Some(json!({"subresource": sub, "responseKind": kind(s), "verbs": s["verbs"]}))
            })
            .collect();
        if !subs.is_empty() {
            out["subresources"] = Value::Array(subs);
        }
        resources.push(out);
    }
    json!({"version": version, "resources": resources, "freshness": if fresh { "Current" } else { "Stale" }})
}

#[allow(dead_code)]
fn _bytes(_: Bytes) {}
