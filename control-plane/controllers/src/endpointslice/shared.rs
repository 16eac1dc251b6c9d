//! What the EndpointSlice and Endpoints controllers share, below both: their labels and
//! errors, and which pods a Service's endpoints list and on which ports.

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing the EndpointSlices of {service}")]
    ListSlices {
        service: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing EndpointSlice {name}")]
    WriteSlice {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting EndpointSlice {name}")]
    DeleteSlice {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing Endpoints {name}")]
    WriteEndpoints {
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Upstream `ShouldPodBeInEndpoints`: an address, not finished, and (unless terminating
/// pods are wanted) not terminating.
pub(crate) fn pod_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let Some(status) = &pod.status else { return false };
    if status.pod_ip.as_deref().unwrap_or("").is_empty() {
        return false;
    }
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    include_terminating || pod.metadata.deletion_timestamp.is_none()
}

/// The pod's port for a Service port: a number, or a named container port of the same
/// protocol; `None` when the name is not found in the pod.
pub fn resolve_target_port(sp: &ServicePort, pod: &Pod) -> Option<i32> {
    let proto = sp.protocol.as_deref().unwrap_or("TCP");
    match &sp.target_port {
        None => Some(sp.port),
        Some(IntOrString::Int(p)) => Some(*p),
        Some(IntOrString::String(name)) => {
            if let Ok(p) = name.parse::<i32>() {
                return Some(p);
            }
            pod.spec.as_ref()?.containers.iter().flat_map(|c| c.ports.iter().flatten()).find_map(
                |cp| {
                    (cp.name.as_deref() == Some(name.as_str())
                        && cp.protocol.as_deref().unwrap_or("TCP") == proto)
                        .then_some(cp.container_port)
                },
            )
        }
    }
}

/// The resolved ports of one pod, in Service port order.
pub fn pod_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|sp| {
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                port: Some(resolve_target_port(sp, pod)?),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}
