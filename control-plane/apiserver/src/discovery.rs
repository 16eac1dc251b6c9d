//! Discovery: legacy (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`) and aggregated
//! (`apidiscovery.k8s.io` v2 and v2beta1, chosen by the Accept header).

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
        groups(state).into_iter().map(|(g, versions)| group_json(g, &versions)).collect();
    json_response(
        StatusCode::OK,
        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
    )
}

pub fn group(state: &State, group: &str) -> ApiResult<Response> {
    let found = groups(state)
        .into_iter()
        .find(|(g, _)| *g == group)
        .ok_or_else(ApiError::path_not_found)?;
    let mut body = group_json(found.0, &found.1);
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

fn groups(state: &State) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for (g, v) in group_versions(&state.registry.served_descs()) {
        if g.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(og, _)| *og == g) {
            Some((_, vs)) => vs.push(v),
            None => out.push((g, vec![v])),
        }
    }
    out
}

fn group_json(group: &str, versions: &[&str]) -> Value {
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
    for &(g, _) in &gvs {
        if g.is_empty() == legacy && !group_names.contains(&g) {
            group_names.push(g);
        }
    }
    for g in group_names {
        let mut versions = Vec::new();
        for &(gg, v) in &gvs {
            if gg != g {
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
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

#[allow(dead_code)]
fn _bytes(_: Bytes) {}
