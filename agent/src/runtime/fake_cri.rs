//! A CRI gRPC server backed by any [`Runtime`](super::Runtime), for tests of the CRI client.
//!
//! [`serve`] exposes a runtime (usually [`MemoryRuntime`](super::memory::MemoryRuntime))
//! as `runtime.v1.RuntimeService` + `runtime.v1.ImageService` on a Unix socket, so
//! [`CriRuntime`](super::cri::CriRuntime) and anything speaking CRI can be driven without
//! containerd. RPCs the [`Runtime`] trait has no counterpart for answer `Unimplemented`.
//! The returned [`FakeCriServer`] stops the server when dropped.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::api::image_service_server::{ImageService, ImageServiceServer};
use super::api::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use super::{Runtime, api};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the fake CRI socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A running fake CRI server; stops (and removes its socket) on drop.
#[derive(Debug)]
pub struct FakeCriServer {
    socket: PathBuf,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeCriServer {
    /// The socket the server listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the server and waits for it to finish.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for FakeCriServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves `runtime` over CRI on the Unix socket `socket` (a stale socket file is replaced).
/// Must be called inside a tokio runtime; the server runs as a task of it.
pub async fn serve<R: Runtime>(runtime: R, socket: &Path) -> Result<FakeCriServer, Error> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(|source| Error::Bind { path: socket.to_path_buf(), source })?;
    let incoming = futures::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(stream, _)| stream);
        Some((conn, l))
    });
    let service = Service { runtime: Arc::new(runtime) };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(service.clone()))
            .add_service(ImageServiceServer::new(service))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "fake CRI server stopped");
        }
    });
    Ok(FakeCriServer { socket: socket.to_path_buf(), shutdown: Some(tx), task })
}

struct Service<R> {
    runtime: Arc<R>,
}

impl<R> Clone for Service<R> {
    fn clone(&self) -> Self {
        Service { runtime: self.runtime.clone() }
    }
}

/// A runtime error as the gRPC status containerd would answer with.
fn status(e: super::Error) -> Status {
    match e {
        super::Error::NotFound { .. } => Status::not_found(e.to_string()),
        super::Error::Status(s) => s,
        super::Error::Connect { .. } => Status::unavailable(e.to_string()),
        super::Error::Failed(msg) => Status::unknown(msg),
    }
}

type Rpc<T> = Result<Response<T>, Status>;

fn unimplemented<T>(rpc: &str) -> Rpc<T> {
    Err(Status::unimplemented(format!("fake CRI: {rpc} is not implemented")))
}

fn image_name(spec: Option<api::ImageSpec>) -> Result<String, Status> {
    spec.map(|s| s.image)
        .filter(|i| !i.is_empty())
        .ok_or_else(|| Status::invalid_argument("image spec missing"))
}

#[tonic::async_trait]
impl<R: Runtime> RuntimeService for Service<R> {
    async fn version(&self, _: Request<api::VersionRequest>) -> Rpc<api::VersionResponse> {
        Ok(Response::new(self.runtime.version().await.map_err(status)?))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<api::RunPodSandboxRequest>,
    ) -> Rpc<api::RunPodSandboxResponse> {
        let config = request
            .into_inner()
            .config
            .ok_or_else(|| Status::invalid_argument("sandbox config missing"))?;
        let pod_sandbox_id = self.runtime.run_pod_sandbox(config).await.map_err(status)?;
        Ok(Response::new(api::RunPodSandboxResponse { pod_sandbox_id }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<api::StopPodSandboxRequest>,
    ) -> Rpc<api::StopPodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.runtime.stop_pod_sandbox(&id).await.map_err(status)?;
        Ok(Response::new(api::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<api::RemovePodSandboxRequest>,
    ) -> Rpc<api::RemovePodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.runtime.remove_pod_sandbox(&id).await.map_err(status)?;
        Ok(Response::new(api::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<api::PodSandboxStatusRequest>,
    ) -> Rpc<api::PodSandboxStatusResponse> {
        let id = request.into_inner().pod_sandbox_id;
        let s = self.runtime.pod_sandbox_status(&id).await.map_err(status)?;
        Ok(Response::new(api::PodSandboxStatusResponse { status: Some(s), ..Default::default() }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<api::ListPodSandboxRequest>,
    ) -> Rpc<api::ListPodSandboxResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let items = self
            .runtime
            .list_pod_sandboxes(&filter.label_selector)
            .await
            .map_err(status)?
            .into_iter()
            .filter(|s| filter.id.is_empty() || s.id == filter.id)
            .filter(|s| filter.state.as_ref().is_none_or(|v| v.state == s.state))
            .collect();
        Ok(Response::new(api::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<api::CreateContainerRequest>,
    ) -> Rpc<api::CreateContainerResponse> {
        let r = request.into_inner();
        let config =
            r.config.ok_or_else(|| Status::invalid_argument("container config missing"))?;
        let sandbox_config = r.sandbox_config.unwrap_or_default();
        let container_id = self
            .runtime
            .create_container(&r.pod_sandbox_id, config, &sandbox_config)
            .await
            .map_err(status)?;
        Ok(Response::new(api::CreateContainerResponse { container_id }))
    }

    async fn start_container(
        &self,
        request: Request<api::StartContainerRequest>,
    ) -> Rpc<api::StartContainerResponse> {
        let id = request.into_inner().container_id;
        self.runtime.start_container(&id).await.map_err(status)?;
        Ok(Response::new(api::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<api::StopContainerRequest>,
    ) -> Rpc<api::StopContainerResponse> {
        let r = request.into_inner();
        self.runtime.stop_container(&r.container_id, r.timeout).await.map_err(status)?;
        Ok(Response::new(api::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<api::RemoveContainerRequest>,
    ) -> Rpc<api::RemoveContainerResponse> {
        let id = request.into_inner().container_id;
        self.runtime.remove_container(&id).await.map_err(status)?;
        Ok(Response::new(api::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<api::ListContainersRequest>,
    ) -> Rpc<api::ListContainersResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let containers = self
            .runtime
            .list_containers(&filter.label_selector)
            .await
            .map_err(status)?
            .into_iter()
            .filter(|c| filter.id.is_empty() || c.id == filter.id)
            .filter(|c| {
                filter.pod_sandbox_id.is_empty() || c.pod_sandbox_id == filter.pod_sandbox_id
            })
            .filter(|c| filter.state.as_ref().is_none_or(|v| v.state == c.state))
            .collect();
        Ok(Response::new(api::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<api::ContainerStatusRequest>,
    ) -> Rpc<api::ContainerStatusResponse> {
        let id = request.into_inner().container_id;
        let s = self.runtime.container_status(&id).await.map_err(status)?;
        Ok(Response::new(api::ContainerStatusResponse { status: Some(s), ..Default::default() }))
    }

    async fn update_container_resources(
        &self,
        _: Request<api::UpdateContainerResourcesRequest>,
    ) -> Rpc<api::UpdateContainerResourcesResponse> {
        unimplemented("UpdateContainerResources")
    }

    async fn reopen_container_log(
        &self,
        _: Request<api::ReopenContainerLogRequest>,
    ) -> Rpc<api::ReopenContainerLogResponse> {
        unimplemented("ReopenContainerLog")
    }

    async fn exec_sync(
        &self,
        request: Request<api::ExecSyncRequest>,
    ) -> Rpc<api::ExecSyncResponse> {
        let r = request.into_inner();
        let resp =
            self.runtime.exec_sync(&r.container_id, r.cmd, r.timeout).await.map_err(status)?;
        Ok(Response::new(resp))
    }

    async fn exec(&self, request: Request<api::ExecRequest>) -> Rpc<api::ExecResponse> {
        let url = self.runtime.exec(request.into_inner()).await.map_err(status)?;
        Ok(Response::new(api::ExecResponse { url }))
    }

    async fn attach(&self, _: Request<api::AttachRequest>) -> Rpc<api::AttachResponse> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _: Request<api::PortForwardRequest>,
    ) -> Rpc<api::PortForwardResponse> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        _: Request<api::ContainerStatsRequest>,
    ) -> Rpc<api::ContainerStatsResponse> {
        unimplemented("ContainerStats")
    }

    async fn list_container_stats(
        &self,
        _: Request<api::ListContainerStatsRequest>,
    ) -> Rpc<api::ListContainerStatsResponse> {
        let stats = self.runtime.list_container_stats().await.map_err(status)?;
        Ok(Response::new(api::ListContainerStatsResponse { stats }))
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<api::PodSandboxStatsRequest>,
    ) -> Rpc<api::PodSandboxStatsResponse> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<api::ListPodSandboxStatsRequest>,
    ) -> Rpc<api::ListPodSandboxStatsResponse> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Rpc<api::UpdateRuntimeConfigResponse> {
        unimplemented("UpdateRuntimeConfig")
    }

    async fn status(&self, _: Request<api::StatusRequest>) -> Rpc<api::StatusResponse> {
        unimplemented("Status")
    }

    async fn checkpoint_container(
        &self,
        _: Request<api::CheckpointContainerRequest>,
    ) -> Rpc<api::CheckpointContainerResponse> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream =
        Pin<Box<dyn futures::Stream<Item = Result<api::ContainerEventResponse, Status>> + Send>>;

    async fn get_container_events(
        &self,
        _: Request<api::GetEventsRequest>,
    ) -> Rpc<Self::GetContainerEventsStream> {
        unimplemented("GetContainerEvents")
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<api::ListMetricDescriptorsRequest>,
    ) -> Rpc<api::ListMetricDescriptorsResponse> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<api::ListPodSandboxMetricsRequest>,
    ) -> Rpc<api::ListPodSandboxMetricsResponse> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<api::RuntimeConfigRequest>,
    ) -> Rpc<api::RuntimeConfigResponse> {
        unimplemented("RuntimeConfig")
    }
}

#[tonic::async_trait]
impl<R: Runtime> ImageService for Service<R> {
    async fn list_images(
        &self,
        _: Request<api::ListImagesRequest>,
    ) -> Rpc<api::ListImagesResponse> {
        let images = self.runtime.list_images().await.map_err(status)?;
        Ok(Response::new(api::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<api::ImageStatusRequest>,
    ) -> Rpc<api::ImageStatusResponse> {
        let name = image_name(request.into_inner().image)?;
        let image = self.runtime.image_status(&name).await.map_err(status)?;
        Ok(Response::new(api::ImageStatusResponse { image, ..Default::default() }))
    }

    async fn pull_image(
        &self,
        request: Request<api::PullImageRequest>,
    ) -> Rpc<api::PullImageResponse> {
        let r = request.into_inner();
        let name = image_name(r.image)?;
        let image_ref = self
            .runtime
            .pull_image(&name, r.auth, r.sandbox_config.as_ref())
            .await
            .map_err(status)?;
        Ok(Response::new(api::PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        _: Request<api::RemoveImageRequest>,
    ) -> Rpc<api::RemoveImageResponse> {
        unimplemented("RemoveImage")
    }

    async fn image_fs_info(
        &self,
        _: Request<api::ImageFsInfoRequest>,
    ) -> Rpc<api::ImageFsInfoResponse> {
        unimplemented("ImageFsInfo")
    }
}
