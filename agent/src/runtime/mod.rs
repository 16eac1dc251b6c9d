//! The container runtime seam: the subset of CRI (RuntimeService + ImageService) the pod
//! sync needs, in CRI's own vocabulary (the prost messages of [`api`]), behind one trait.
//!
//! Two implementations: [`cri::CriRuntime`] talks to containerd's CRI socket over tonic,
//! [`memory::MemoryRuntime`] keeps sandboxes and containers in memory (unit tests, and the
//! hollow nodes of `skiff-lab simulate`). [`fake_cri`] serves any [`Runtime`] as a CRI
//! gRPC server, so the CRI client path is tested without containerd.
//!
//! The trait uses CRI types on purpose: the real implementation stays a thin pass-through,
//! and every state the in-memory runtime reports is one containerd could report.

use std::future::Future;

pub mod api;
pub mod cri;
#[cfg(any(test, feature = "testing"))]
pub mod fake_cri;
#[cfg(any(test, feature = "testing"))]
pub mod memory;

/// Label the agent puts on every sandbox and container: the pod's UID (adoption after a
/// restart finds its pods' sandboxes by it, as the kubelet does).
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sandbox, container or image does not exist.
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    /// The runtime answered with an error status (gRPC code and message kept).
    #[error("runtime: {0}")]
    Status(#[from] tonic::Status),
    /// The runtime's socket could not be reached.
    #[error("connecting to the runtime at {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The runtime refused the request for a reason of its own.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Error::NotFound { kind, id: id.into() }
    }

    /// True for "no such object": from the in-memory runtime, or a gRPC NotFound.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::NotFound { .. } => true,
            Error::Status(s) => s.code() == tonic::Code::NotFound,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A container runtime, as the agent sees it. Methods mirror the CRI RPCs of the same names.
pub trait Runtime: Send + Sync + 'static {
    /// Runtime name and version (`RuntimeService.Version`).
    fn version(&self) -> impl Future<Output = Result<api::VersionResponse>> + Send;

    /// The image if present locally (`ImageService.ImageStatus`), `None` when absent.
    fn image_status(&self, image: &str) -> impl Future<Output = Result<Option<api::Image>>> + Send;

    /// Pulls an image; returns the image reference (`ImageService.PullImage`).
    fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> impl Future<Output = Result<String>> + Send;

    /// Every image present locally.
    fn list_images(&self) -> impl Future<Output = Result<Vec<api::Image>>> + Send;

    /// Creates and starts a sandbox (its network namespace wired by CNI); returns its id.
    fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
    ) -> impl Future<Output = Result<String>> + Send;

    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;

    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;

    fn pod_sandbox_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::PodSandboxStatus>> + Send;

    /// Sandboxes whose labels include every pair of `labels` (all when empty).
    fn list_pod_sandboxes(
        &self,
        labels: &std::collections::HashMap<String, String>,
    ) -> impl Future<Output = Result<Vec<api::PodSandbox>>> + Send;

    /// Creates a container in a sandbox; returns its id.
    fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> impl Future<Output = Result<String>> + Send;

    fn start_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Stops a container: SIGTERM, then SIGKILL after `timeout_secs` (0 kills at once).
    fn stop_container(
        &self,
        id: &str,
        timeout_secs: i64,
    ) -> impl Future<Output = Result<()>> + Send;

    fn remove_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Containers whose labels include every pair of `labels` (all when empty).
    fn list_containers(
        &self,
        labels: &std::collections::HashMap<String, String>,
    ) -> impl Future<Output = Result<Vec<api::Container>>> + Send;

    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::ContainerStatus>> + Send;

    /// Resource usage of every container (`RuntimeService.ListContainerStats`): cumulative
    /// CPU time and working set, what the node's resource metrics report.
    fn list_container_stats(&self)
    -> impl Future<Output = Result<Vec<api::ContainerStats>>> + Send;

    /// Runs a command in a container and waits for it (exec probes, preStop hooks).
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> impl Future<Output = Result<api::ExecSyncResponse>> + Send;

    /// Prepares a streaming exec; returns the runtime's streaming URL (`RuntimeService.Exec`).
    fn exec(&self, request: api::ExecRequest) -> impl Future<Output = Result<String>> + Send;
}
