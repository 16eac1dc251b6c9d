//! Where an APIService's Service is served: one ready endpoint address of it, as upstream's
//! aggregator resolves with `--enable-aggregator-routing` (skiff always routes to
//! endpoints, never to the ClusterIP: the apiserver runs outside the pod network, where a
//! ClusterIP is not routed). The Service's port named by `spec.service.port` is found
//! first, then an address in its EndpointSlices (or, without any, its Endpoints) that
//! serves that port, by the port's name as the endpoints controller copies it.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use super::remotes::ServiceRef;
use crate::state::State;

/// Why an APIService's Service has no address: the reason and message of the `Available`
/// condition, as upstream's availability controller words them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unresolved {
    pub reason: &'static str,
    pub message: String,
}

/// An address serving `service`.
pub fn endpoint(state: &State, service: &ServiceRef) -> Result<SocketAddr, Unresolved> {
    let svc = get(state, "", "services", &service.namespace, &service.name).ok_or_else(|| {
        Unresolved {
            reason: "ServiceNotFound",
            message: format!("service/{} in {:?} is not present", service.name, service.namespace),
        }
    })?;
    let port = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(u64::from(service.port)))
        .ok_or_else(|| Unresolved {
            reason: "ServicePortError",
            message: format!(
                "service/{} in {:?} is not listening on port {}",
                service.name, service.namespace, service.port
            ),
        })?;
    let port_name = port["name"].as_str().unwrap_or_default();
    let missing = || Unresolved {
        reason: "MissingEndpoints",
        message: format!(
            "endpoints for service/{} in {:?} have no addresses with port name {:?}",
            service.name, service.namespace, port_name
        ),
    };
    let slices = slices_of(state, service);
    let found =
        if slices.is_empty() {
            let endpoints = get(state, "", "endpoints", &service.namespace, &service.name)
                .ok_or_else(|| Unresolved {
                    reason: "EndpointsNotFound",
                    message: format!(
                        "cannot find endpoints for service/{} in {:?}",
                        service.name, service.namespace
                    ),
                })?;
            from_endpoints(&endpoints, port_name)
        } else {
            slices.iter().find_map(|s| from_slice(s, port_name))
        };
    found.ok_or_else(missing)
}

fn get(state: &State, group: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
    let rt = state.registry.find(group, "v1", plural)?;
    Some(state.cache.resource(rt).get(&rt.key(Some(ns), name))?.value())
}

/// The EndpointSlices of a Service (label `kubernetes.io/service-name`).
fn slices_of(state: &State, service: &ServiceRef) -> Vec<Value> {
    let Some(rt) = state.registry.find("discovery.k8s.io", "v1", "endpointslices") else {
        return Vec::new();
    };
    state
        .cache
        .resource(rt)
        .list(&rt.namespace_prefix(Some(&service.namespace)), None)
        .iter()
        .map(|o| o.value())
        .filter(|s| {
            s.pointer("/metadata/labels/kubernetes.io~1service-name").and_then(Value::as_str)
                == Some(service.name.as_str())
        })
        .collect()
}

/// A ready address of an EndpointSlice serving the port named `port_name`.
fn from_slice(slice: &Value, port_name: &str) -> Option<SocketAddr> {
    let port = slice
        .get("ports")
        .and_then(Value::as_array)?
        .iter()
        .find(|p| p["name"].as_str().unwrap_or_default() == port_name)?["port"]
        .as_u64()? as u16;
    let endpoints = slice.get("endpoints").and_then(Value::as_array)?;
    endpoints
        .iter()
        .filter(|e| e.pointer("/conditions/ready").and_then(Value::as_bool) != Some(false))
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(|a| a.as_str()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .next()
}

/// A ready address of an Endpoints object serving the port named `port_name`.
fn from_endpoints(endpoints: &Value, port_name: &str) -> Option<SocketAddr> {
    endpoints.get("subsets").and_then(Value::as_array)?.iter().find_map(|subset| {
        let port = subset["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)?["port"]
            .as_u64()? as u16;
        subset["addresses"]
            .as_array()?
            .iter()
            .filter_map(|a| a["ip"].as_str()?.parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, port))
            .next()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_address_is_taken_from_the_port_of_the_same_name() {
        let slice = json!({"ports": [{"name": "metrics", "port": 9000}, {"name": "https", "port": 8443}],
            "endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": false}},
                          {"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]});
        assert_eq!(from_slice(&slice, "https"), Some("127.0.0.1:8443".parse().unwrap()));
        assert_eq!(from_slice(&slice, "other"), None);
        let endpoints =
            json!({"subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 4443}]}]});
        assert_eq!(from_endpoints(&endpoints, ""), Some("127.0.0.1:4443".parse().unwrap()));
        assert_eq!(from_endpoints(&json!({"subsets": []}), ""), None);
    }
}
