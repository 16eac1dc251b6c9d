//! [`Runtime`](super::Runtime) over containerd's CRI gRPC socket: tonic, with the messages
//! and clients of [`api`](super::api).
//!
//! A thin pass-through: every method is one CRI RPC, errors keep their gRPC status (so
//! [`Error::is_not_found`](super::Error::is_not_found) sees containerd's NotFound). Each
//! call carries a deadline ([`CriRuntime::request_timeout`], the kubelet's
//! `--runtime-request-timeout` default of 2 min; ExecSync adds its own timeout to it), so a
//! wedged runtime turns into an error instead of a hung pod worker.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};

use super::api::{ImageServiceClient, RuntimeServiceClient};
use super::{Error, Result, Runtime, api};

/// The kubelet's default `--runtime-request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A CRI client over a Unix socket. Cheap to clone (one HTTP/2 channel, reconnected by
/// tonic when the runtime restarts).
#[derive(Debug, Clone)]
pub struct CriRuntime {
    endpoint: String,
    runtime: RuntimeServiceClient,
    images: ImageServiceClient,
    request_timeout: Duration,
}

impl CriRuntime {
    /// Connects to the CRI socket (containerd's `[grpc] address`). Fails when nothing
    /// listens on it.
    pub async fn connect(socket: &Path) -> Result<CriRuntime> {
        let endpoint = socket.display().to_string();
        let path: PathBuf = socket.to_path_buf();
        // The URI is a placeholder: the connector ignores it and dials the socket.
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .map_err(|source| Error::Connect { endpoint: endpoint.clone(), source })?;
        Ok(CriRuntime {
            endpoint,
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20),
            images: ImageServiceClient::new(channel).max_decoding_message_size(16 << 20),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Sets the deadline of every call (default [`DEFAULT_REQUEST_TIMEOUT`]).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The deadline of every call.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The socket this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.request_timeout);
        r
    }
}

impl Runtime for CriRuntime {
    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn version(&self) -> Result<api::VersionResponse> {
        let req = self.request(api::VersionRequest { version: "v1".into() });
        Ok(self.runtime.clone().version(req).await?.into_inner())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let req = self.request(api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.to_string(), ..Default::default() }),
            verbose: false,
        });
        Ok(self.images.clone().image_status(req).await?.into_inner().image)
    }

    #[tracing::instrument(level = "debug", skip(self, auth, sandbox), err)]
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<String> {
        let req = self.request(api::PullImageRequest {
            image: Some(api::ImageSpec { image: image.to_string(), ..Default::default() }),
            auth,
            sandbox_config: sandbox.cloned(),
        });
        Ok(self.images.clone().pull_image(req).await?.into_inner().image_ref)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let req = self.request(api::ListImagesRequest { filter: None });
        Ok(self.images.clone().list_images(req).await?.into_inner().images)
    }

    #[tracing::instrument(level = "debug", skip_all, err,
        fields(pod = ?config.metadata.as_ref().map(|m| (&m.namespace, &m.name))))]
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> Result<String> {
        let req = self.request(api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        });
        Ok(self.runtime.clone().run_pod_sandbox(req).await?.into_inner().pod_sandbox_id)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = self.request(api::StopPodSandboxRequest { pod_sandbox_id: id.to_string() });
        self.runtime.clone().stop_pod_sandbox(req).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = self.request(api::RemovePodSandboxRequest { pod_sandbox_id: id.to_string() });
        self.runtime.clone().remove_pod_sandbox(req).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus> {
        let req = self.request(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        });
        self.runtime
            .clone()
            .pod_sandbox_status(req)
            .await?
            .into_inner()
            .status
            .ok_or_else(|| Error::not_found("sandbox", id))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn list_pod_sandboxes(
        &self,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<api::PodSandbox>> {
        let req = self.request(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: labels.clone(),
                ..Default::default()
            }),
        });
        Ok(self.runtime.clone().list_pod_sandbox(req).await?.into_inner().items)
    }

    #[tracing::instrument(level = "debug", skip(self, config, sandbox_config), err,
        fields(container = ?config.metadata.as_ref().map(|m| &m.name)))]
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String> {
        let req = self.request(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        });
        Ok(self.runtime.clone().create_container(req).await?.into_inner().container_id)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn start_container(&self, id: &str) -> Result<()> {
        let req = self.request(api::StartContainerRequest { container_id: id.to_string() });
        self.runtime.clone().start_container(req).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut req = tonic::Request::new(api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: timeout_secs,
        });
        req.set_timeout(self.request_timeout + Duration::from_secs(timeout_secs.max(0) as u64));
        self.runtime.clone().stop_container(req).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn remove_container(&self, id: &str) -> Result<()> {
        let req = self.request(api::RemoveContainerRequest { container_id: id.to_string() });
        self.runtime.clone().remove_container(req).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn list_containers(
        &self,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<api::Container>> {
        let req = self.request(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: labels.clone(),
                ..Default::default()
            }),
        });
        Ok(self.runtime.clone().list_containers(req).await?.into_inner().containers)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn list_container_stats(&self) -> Result<Vec<api::ContainerStats>> {
        let req = self.request(api::ListContainerStatsRequest { filter: None });
        Ok(self.runtime.clone().list_container_stats(req).await?.into_inner().stats)
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        let req = self
            .request(api::ContainerStatusRequest { container_id: id.to_string(), verbose: false });
        self.runtime
            .clone()
            .container_status(req)
            .await?
            .into_inner()
            .status
            .ok_or_else(|| Error::not_found("container", id))
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> Result<api::ExecSyncResponse> {
        let mut req = tonic::Request::new(api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: timeout_secs,
        });
        req.set_timeout(self.request_timeout + Duration::from_secs(timeout_secs.max(0) as u64));
        Ok(self.runtime.clone().exec_sync(req).await?.into_inner())
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn exec(&self, request: api::ExecRequest) -> Result<String> {
        let req = self.request(request);
        Ok(self.runtime.clone().exec(req).await?.into_inner().url)
    }
}
