//! The pods' streaming subresources: `pods/log` and `pods/exec`, proxied to the agent of the
//! pod's node (its HTTPS endpoint at the Node's InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`, authenticated with the apiserver's client
//! certificate, as upstream's apiserver talks to kubelets).
//!
//! Logs stream back as the agent writes them (chunked; `follow` holds the response open).
//! Exec is an HTTP/1.1 upgrade (SPDY/3.1 or WebSocket): the request is replayed to the agent,
//! whose answer (101 or an error) goes back to the client, and on 101 the two upgraded
//! connections are spliced. The agent itself talks to the runtime's stream server.

use axum::response::Response;
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::Value;

use super::registry::str_at;
use super::request::{Query, RequestInfo};
use super::status::{ApiError, ApiResult};
use crate::kubelet;
use crate::state::State;

/// Log options passed through to the agent.
const LOG_PARAMS: &[&str] =
    &["follow", "previous", "timestamps", "tailLines", "sinceSeconds", "sinceTime", "limitBytes"];

/// Upstream's `ValidatePodLogOptions`: integers in range (tailLines >= 0, limitBytes and
/// sinceSeconds > 0), at most one of sinceSeconds and sinceTime.
fn validate_log_options(query: &Query, name: &str) -> ApiResult<()> {
    use crate::status::Cause;
    let mut causes = Vec::new();
    let mut check = |field: &str, min: i64, msg: &str| -> ApiResult<()> {
        if let Some(v) = query.int(field)?
            && v < min
        {
            causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                message: format!("Invalid value: {v}: {msg}"),
                field: field.into(),
            });
        }
        Ok(())
    };
    check("tailLines", 0, "must be greater than or equal to 0")?;
    check("limitBytes", 1, "must be greater than 0")?;
    check("sinceSeconds", 1, "must be greater than 0")?;
    if query.has("sinceSeconds") && query.has("sinceTime") {
        causes.push(Cause {
            reason: "FieldValueForbidden".into(),
            message: "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
                .into(),
            field: String::new(),
        });
    }
    if causes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = causes
        .iter()
        .map(|c| {
            if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            }
        })
        .collect();
    let msg = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
    Err(ApiError::invalid(format!("PodLogOptions \"{name}\" is invalid: {msg}"), causes)
        .with_details("", "PodLogOptions", name))
}

/// Exec options passed through to the agent.
const EXEC_PARAMS: &[&str] = &["command", "stdin", "stdout", "stderr", "tty"];

/// Is this one of the subresources served here?
pub fn handles(info: &RequestInfo) -> bool {
    info.group.is_empty()
        && info.resource == "pods"
        && info.name.is_some()
        && matches!(info.subresource.as_deref(), Some("log" | "exec" | "attach" | "portforward"))
}

pub async fn serve(
    server: &State,
    info: RequestInfo,
    query: Query,
    mut parts: http::request::Parts,
) -> ApiResult<Response> {
    let (Some(ns), Some(name)) = (info.namespace.as_deref(), info.name.as_deref()) else {
        return Err(ApiError::path_not_found());
    };
    let sub = info.subresource.as_deref().unwrap_or("");
    match (sub, &parts.method) {
        ("log", &Method::GET) => {}
        ("exec", &Method::GET | &Method::POST) => {}
        ("attach" | "portforward", &Method::GET | &Method::POST) => {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "NotImplemented",
                format!("pods/{sub} is not supported by skiff (pods/exec and pods/log are)"),
            ));
        }
        _ => return Err(ApiError::method_not_allowed(parts.method.as_str())),
    }
    if sub == "log" {
        validate_log_options(&query, name)?;
    }
    let Some(client) = server.config.kubelet_client.clone() else {
        return Err(ApiError::service_unavailable(
            "this apiserver has no client certificate for the agents' streaming endpoints",
        ));
    };
    let pod = get(server, "pods", Some(ns), name).await?;
    let container = container_name(&pod, name, query.get("container"))?;
    let node_name = str_at(&pod, &["spec", "nodeName"]);
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!("pod {name} does not have a host assigned")));
    }
    let node = get(server, "nodes", None, &node_name).await?;
    let addr = kubelet::node_address(&node).ok_or_else(|| {
        ApiError::bad_request(format!("node {node_name} has no InternalIP or ExternalIP address"))
    })?;
    let (kind, params) =
        if sub == "log" { ("containerLogs", LOG_PARAMS) } else { ("exec", EXEC_PARAMS) };
    let mut path = format!("/{kind}/{}/{}/{}", encode(ns), encode(name), encode(&container));
    // Repeated parameters (exec's `command`) survive: the raw query, not `Query`'s map.
    let qs = {
        let mut ser = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            if params.contains(&k.as_ref()) {
                ser.append_pair(&k, &v);
            }
        }
        ser.finish()
    };
    if !qs.is_empty() {
        path.push('?');
        path.push_str(&qs);
    }
    if sub == "log" {
        kubelet::logs(&client, addr, &path).await
    } else {
        if !is_upgrade(&parts.headers) {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(ApiError::bad_request(
                "this connection cannot be upgraded (exec needs HTTP/1.1)",
            ));
        };
        kubelet::upgrade(&client, addr, &parts.method, &path, &parts.headers, on_upgrade).await
    }
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
    }) && headers.contains_key(header::UPGRADE)
}

async fn get(server: &State, plural: &str, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    let rt = server.registry.find("", "v1", plural).ok_or_else(ApiError::path_not_found)?;
    let kv = server
        .store
        .get(&rt.key(ns, name))
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found(plural, name))?;
    serde_json::from_slice(&kv.value).map_err(ApiError::internal)
}

/// The container a request is for: the named one if the pod has it, else the only one.
fn container_name(pod: &Value, pod_name: &str, asked: Option<&str>) -> ApiResult<String> {
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    match asked {
        Some(c) if !c.is_empty() => {
            let known = containers
                .iter()
                .chain(&names("initContainers"))
                .chain(&names("ephemeralContainers"))
                .any(|n| n == c);
            if known {
                Ok(c.to_string())
            } else {
                Err(ApiError::bad_request(format!("container {c} is not valid for pod {pod_name}")))
            }
        }
        _ if containers.len() == 1 => Ok(containers[0].clone()),
        _ => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_the_container() {
        let pod =
            json!({"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}});
        assert_eq!(container_name(&pod, "p", None).unwrap(), "a");
        assert_eq!(container_name(&pod, "p", Some("i")).unwrap(), "i");
        assert!(container_name(&pod, "p", Some("x")).is_err());
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let e = container_name(&two, "p", None).unwrap_err();
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
    }
}
