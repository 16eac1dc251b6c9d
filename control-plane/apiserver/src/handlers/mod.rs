//! The resource verbs: get, list, create, update, patch, delete, deletecollection and the
//! status/scale/binding/eviction subresources, one module per verb. Reads of single objects
//! go to the store (read your writes); lists are served from the watch cache once it has
//! caught up; a read-modify-write starts from the cache's copy and reads the store only when
//! that copy proves stale. List and watch options live in `list_options`, rendering in
//! `render`, request metrics in `metrics`.

mod admit;
mod create;
mod decode;
mod delete;
mod eviction;
mod patch;
mod quota;
mod read;
mod subresources;
mod update;
mod verb;

pub use create::create;
use std::sync::Arc;
pub use verb::Target;

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use self::create::create_rendered;
use self::delete::{delete, delete_collection};
use self::patch::patch;
use self::read::{component_statuses, get_object, list};
use self::subresources::{bind, scale, scale_of};
use self::update::update;
use self::verb::Answer;
use crate::negotiate;
use crate::render::json_response;
use crate::render::{render_object, render_scale, with_warnings};
use crate::request::Input;
use crate::request::{Query, RequestInfo, Verb};
use crate::server::ApiServer;
use crate::status::{ApiError, ApiResult};
use crate::{metrics_api, watch};

pub async fn resource(
    server: &Arc<ApiServer>,
    info: RequestInfo,
    query: Query,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let served = server
        .registry
        .lookup(&info.group, &info.version, &info.resource)
        .ok_or_else(ApiError::path_not_found)?;
    let answer = serve(server, &served, info, query, headers, body).await;
    // A deprecated custom resource version warns on every request, as upstream.
    match (answer, served.custom.as_ref().and_then(|c| c.deprecation.as_ref())) {
        (Ok(resp), Some(warning)) => {
            let code = resp.status();
            Ok(with_warnings(resp, code, std::slice::from_ref(warning)))
        }
        (answer, _) => answer,
    }
}

async fn serve(
    server: &Arc<ApiServer>,
    rt: &crate::registry::ResourceType,
    info: RequestInfo,
    query: Query,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
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
    let t = Target { server, rt, ns };
    let output = negotiate::output(&headers);
    if rt.kind() == "ComponentStatus" && rt.group().is_empty() {
        return component_statuses(server, rt, info.verb, name, output).await;
    }
    if rt.group() == metrics_api::GROUP {
        return metrics_api::serve(server, &server.resource_metrics, rt, &info, &query, output);
    }
    match (info.verb, name, info.subresource.as_deref()) {
        (Verb::Get, Some(name), None | Some("status") | Some("approval")) => {
            let (mut obj, _) = get_object(t, name).await?;
            crate::conversion::for_request(&server.state, rt, &mut obj).await?;
            Ok(render_object(rt, obj, output))
        }
        (Verb::Get, Some(name), Some("scale")) => {
            let (obj, _) = get_object(t, name).await?;
            Ok(render_scale(scale_of(rt, &obj), output))
        }
        (Verb::List, None, None) => list(t, &query, output).await,
        (Verb::Watch, _, None) => watch::serve(&server.state, rt, ns, name, &query, output).await,
        (Verb::Create, None, None) => {
            let answer = Answer::for_output(output);
            let (created, code, warnings) =
                create_rendered(t, Input { query: &query, headers: &headers, body: &body }, answer)
                    .await?;
            Ok(with_warnings(created.respond(&server.state, rt, output).await?, code, &warnings))
        }
        (Verb::Create, Some(name), Some("binding")) => {
            let obj =
                bind(t, name, Input { query: &query, headers: &headers, body: &body }).await?;
            Ok(json_response(StatusCode::CREATED, &obj))
        }
        (Verb::Create, Some(name), Some("eviction")) => {
            let obj =
                eviction::evict(t, name, Input { query: &query, headers: &headers, body: &body })
                    .await?;
            Ok(json_response(StatusCode::CREATED, &obj))
        }
        (
            Verb::Update,
            Some(name),
            sub @ (None | Some("status") | Some("finalize") | Some("approval")),
        ) => {
            let answer = Answer::for_output(output);
            let (written, code, warnings) = update(
                t,
                name,
                sub,
                Input { query: &query, headers: &headers, body: &body },
                answer,
            )
            .await?;
            Ok(with_warnings(written.respond(&server.state, rt, output).await?, code, &warnings))
        }
        (Verb::Update | Verb::Patch, Some(name), Some("scale")) => {
            let obj =
                scale(t, name, info.verb, Input { query: &query, headers: &headers, body: &body })
                    .await?;
            Ok(render_scale(obj, output))
        }
        (Verb::Patch, Some(name), sub @ (None | Some("status") | Some("approval"))) => {
            let answer = Answer::for_output(output);
            let (written, code, warnings) = patch(
                t,
                name,
                sub,
                Input { query: &query, headers: &headers, body: &body },
                answer,
            )
            .await?;
            Ok(with_warnings(written.respond(&server.state, rt, output).await?, code, &warnings))
        }
        (Verb::Delete, Some(name), None) => {
            let options = negotiate::decode_delete_options(&headers, &body)?;
            let (obj, code) = delete(t, name, &query, &options, true).await?;
            Ok(json_response(code, &obj))
        }
        (Verb::DeleteCollection, None, None) => {
            delete_collection(t, Input { query: &query, headers: &headers, body: &body }).await
        }
        (verb, _, _) => Err(ApiError::method_not_allowed(verb.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;

    /// Writes through the apiserver are indexed from what the request knew (no second
    /// parse), and index exactly what parsing the stored value gives; a write that fails
    /// leaves nothing expected.
    #[tokio::test]
    async fn writes_are_indexed_from_the_request() {
        use http::{Method, StatusCode};

        use crate::cache::cached_object;
        use crate::testing;
        use skiff_store::memory::MemoryStore;
        use std::collections::BTreeMap;

        let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("apiserver");
        let call = |method: Method, uri: &str, ct: &str, body: Value| {
            let api = api.clone();
            let uri = uri.to_string();
            let ct = ct.to_string();
            async move { testing::call(&api, None, method, &uri, &ct, body).await.0 }
        };
        let rt = api.registry.find("", "v1", "pods").expect("pods");
        let pods = api.cache.resource(rt).clone();
        let uri = "/api/v1/namespaces/default/pods";
        let pod = serde_json::json!({
            "metadata": {"name": "p", "labels": {"app": "a", "tier": "t"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        });
        assert_eq!(
            call(Method::POST, uri, "application/json", pod.clone()).await,
            StatusCode::CREATED
        );
        let patch = serde_json::json!({"metadata": {"labels": {"tier": null, "new": "1"}}});
        let patched =
            call(Method::PATCH, &format!("{uri}/p"), "application/merge-patch+json", patch).await;
        assert_eq!(patched, StatusCode::OK);
        // Refused by the store (the name is taken): withdrawn, not left behind.
        assert_eq!(call(Method::POST, uri, "application/json", pod).await, StatusCode::CONFLICT);
        let rev = api.store.current_revision().await.unwrap();
        assert!(api.cache.wait_for(rev, Duration::from_secs(5)).await);

        assert_eq!(pods.expected_hits(), 2, "the create and the patch were not parsed again");
        assert_eq!(pods.expectations_left(), 0, "an expectation was left behind");
        let cached = pods.get(&rt.key(Some("default"), "p")).expect("cached pod");
        let stored = api.store.get(&cached.key).await.unwrap().expect("stored pod");
        let parsed = cached_object(rt, &stored, cached.rv).expect("parsed");
        assert_eq!(cached.labels, parsed.labels);
        assert_eq!(cached.fields, parsed.fields);
        assert_eq!(cached.json, parsed.json);
        assert_eq!((cached.name.as_str(), cached.namespace.as_str()), ("p", "default"));
        assert_eq!(
            cached.labels.to_map(),
            BTreeMap::from([("app".into(), "a".into()), ("new".into(), "1".into())])
        );
        assert!(cached.fields.contains(&("spec.nodeName", "n1".into())));
    }
}
