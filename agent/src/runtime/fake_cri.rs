//! A CRI gRPC server backed by any [`Runtime`](super::Runtime), for tests of the CRI client.
//!
//! [`serve`] exposes a runtime (usually [`MemoryRuntime`](super::memory::MemoryRuntime))
//! as `runtime.v1.RuntimeService` + `runtime.v1.ImageService` on a Unix socket, so
//! [`CriRuntime`](super::cri::CriRuntime) and anything speaking CRI can be driven without
//! containerd. RPCs the [`Runtime`] trait has no counterpart for answer `Unimplemented`.
//! The returned [`FakeCriServer`] stops the server when dropped.
//!
//! The server side is the `k8s-cri` crate's generated code (`wire`), not the agent's own
//! messages ([`api`](super::api)): every message crossing the seam is re-encoded from one
//! to the other ([`recode`]), so the tests that drive [`CriRuntime`](super::cri::CriRuntime)
//! against this server also check the agent's field numbers against an independent reading
//! of the proto.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use k8s_cri::v1 as wire;
use wire::image_service_server::{ImageService, ImageServiceServer};
use wire::runtime_service_server::{RuntimeService, RuntimeServiceServer};

use super::Runtime;

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

/// `message` as the other side's type of the same CRI message: encoded by one, decoded by
/// the other (a field the two number differently shows up as a test failure).
fn recode<A: prost::Message, B: prost::Message + Default>(message: &A) -> B {
    B::decode(message.encode_to_vec().as_slice()).expect("a CRI message re-encodes")
}

fn recode_all<A: prost::Message, B: prost::Message + Default>(messages: &[A]) -> Vec<B> {
    messages.iter().map(recode).collect()
}

fn unimplemented<T>(rpc: &str) -> Rpc<T> {
    Err(Status::unimplemented(format!("fake CRI: {rpc} is not implemented")))
}

fn image_name(spec: Option<wire::ImageSpec>) -> Result<String, Status> {
    spec.map(|s| s.image)
        .filter(|i| !i.is_empty())
        .ok_or_else(|| Status::invalid_argument("image spec missing"))
}

#[tonic::async_trait]
impl<R: Runtime> RuntimeService for Service<R> {
    async fn version(&self, _: Request<wire::VersionRequest>) -> Rpc<wire::VersionResponse> {
        Ok(Response::new(recode(&self.runtime.version().await.map_err(status)?)))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<wire::RunPodSandboxRequest>,
    ) -> Rpc<wire::RunPodSandboxResponse> {
        let config = request
            .into_inner()
            .config
            .ok_or_else(|| Status::invalid_argument("sandbox config missing"))?;
        let pod_sandbox_id = self.runtime.run_pod_sandbox(recode(&config)).await.map_err(status)?;
        Ok(Response::new(wire::RunPodSandboxResponse { pod_sandbox_id }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<wire::StopPodSandboxRequest>,
    ) -> Rpc<wire::StopPodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.runtime.stop_pod_sandbox(&id).await.map_err(status)?;
        Ok(Response::new(wire::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<wire::RemovePodSandboxRequest>,
    ) -> Rpc<wire::RemovePodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        self.runtime.remove_pod_sandbox(&id).await.map_err(status)?;
        Ok(Response::new(wire::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<wire::PodSandboxStatusRequest>,
    ) -> Rpc<wire::PodSandboxStatusResponse> {
        let id = request.into_inner().pod_sandbox_id;
        let s = self.runtime.pod_sandbox_status(&id).await.map_err(status)?;
        Ok(Response::new(wire::PodSandboxStatusResponse {
            status: Some(recode(&s)),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<wire::ListPodSandboxRequest>,
    ) -> Rpc<wire::ListPodSandboxResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let items = self
            .runtime
            .list_pod_sandboxes(&filter.label_selector)
            .await
            .map_err(status)?
            .iter()
            .map(recode::<_, wire::PodSandbox>)
            .filter(|s| filter.id.is_empty() || s.id == filter.id)
            .filter(|s| filter.state.as_ref().is_none_or(|v| v.state == s.state))
            .collect();
        Ok(Response::new(wire::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<wire::CreateContainerRequest>,
    ) -> Rpc<wire::CreateContainerResponse> {
        let r = request.into_inner();
        let config =
            r.config.ok_or_else(|| Status::invalid_argument("container config missing"))?;
        let sandbox_config = r.sandbox_config.unwrap_or_default();
        let container_id = self
            .runtime
            .create_container(&r.pod_sandbox_id, recode(&config), &recode(&sandbox_config))
            .await
            .map_err(status)?;
        Ok(Response::new(wire::CreateContainerResponse { container_id }))
    }

    async fn start_container(
        &self,
        request: Request<wire::StartContainerRequest>,
    ) -> Rpc<wire::StartContainerResponse> {
        let id = request.into_inner().container_id;
        self.runtime.start_container(&id).await.map_err(status)?;
        Ok(Response::new(wire::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<wire::StopContainerRequest>,
    ) -> Rpc<wire::StopContainerResponse> {
        let r = request.into_inner();
        self.runtime.stop_container(&r.container_id, r.timeout).await.map_err(status)?;
        Ok(Response::new(wire::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<wire::RemoveContainerRequest>,
    ) -> Rpc<wire::RemoveContainerResponse> {
        let id = request.into_inner().container_id;
        self.runtime.remove_container(&id).await.map_err(status)?;
        Ok(Response::new(wire::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<wire::ListContainersRequest>,
    ) -> Rpc<wire::ListContainersResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let containers = self
            .runtime
            .list_containers(&filter.label_selector)
            .await
            .map_err(status)?
            .iter()
            .map(recode::<_, wire::Container>)
            .filter(|c| filter.id.is_empty() || c.id == filter.id)
            .filter(|c| {
                filter.pod_sandbox_id.is_empty() || c.pod_sandbox_id == filter.pod_sandbox_id
            })
            .filter(|c| filter.state.as_ref().is_none_or(|v| v.state == c.state))
            .collect();
        Ok(Response::new(wire::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<wire::ContainerStatusRequest>,
    ) -> Rpc<wire::ContainerStatusResponse> {
        let id = request.into_inner().container_id;
        let s = self.runtime.container_status(&id).await.map_err(status)?;
        Ok(Response::new(wire::ContainerStatusResponse {
            status: Some(recode(&s)),
            ..Default::default()
        }))
    }

    async fn update_container_resources(
        &self,
        _: Request<wire::UpdateContainerResourcesRequest>,
    ) -> Rpc<wire::UpdateContainerResourcesResponse> {
        unimplemented("UpdateContainerResources")
    }

    async fn reopen_container_log(
        &self,
        _: Request<wire::ReopenContainerLogRequest>,
    ) -> Rpc<wire::ReopenContainerLogResponse> {
        unimplemented("ReopenContainerLog")
    }

    async fn exec_sync(
        &self,
        request: Request<wire::ExecSyncRequest>,
    ) -> Rpc<wire::ExecSyncResponse> {
        let r = request.into_inner();
        let resp =
            self.runtime.exec_sync(&r.container_id, r.cmd, r.timeout).await.map_err(status)?;
        Ok(Response::new(recode(&resp)))
    }

    async fn exec(&self, request: Request<wire::ExecRequest>) -> Rpc<wire::ExecResponse> {
        let url = self.runtime.exec(recode(&request.into_inner())).await.map_err(status)?;
        Ok(Response::new(wire::ExecResponse { url }))
    }

    async fn attach(&self, _: Request<wire::AttachRequest>) -> Rpc<wire::AttachResponse> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _: Request<wire::PortForwardRequest>,
    ) -> Rpc<wire::PortForwardResponse> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        _: Request<wire::ContainerStatsRequest>,
    ) -> Rpc<wire::ContainerStatsResponse> {
        unimplemented("ContainerStats")
    }

    async fn list_container_stats(
        &self,
        _: Request<wire::ListContainerStatsRequest>,
    ) -> Rpc<wire::ListContainerStatsResponse> {
        let stats = self.runtime.list_container_stats().await.map_err(status)?;
        Ok(Response::new(wire::ListContainerStatsResponse { stats: recode_all(&stats) }))
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<wire::PodSandboxStatsRequest>,
    ) -> Rpc<wire::PodSandboxStatsResponse> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<wire::ListPodSandboxStatsRequest>,
    ) -> Rpc<wire::ListPodSandboxStatsResponse> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _: Request<wire::UpdateRuntimeConfigRequest>,
    ) -> Rpc<wire::UpdateRuntimeConfigResponse> {
        unimplemented("UpdateRuntimeConfig")
    }

    async fn status(&self, _: Request<wire::StatusRequest>) -> Rpc<wire::StatusResponse> {
        unimplemented("Status")
    }

    async fn checkpoint_container(
        &self,
        _: Request<wire::CheckpointContainerRequest>,
    ) -> Rpc<wire::CheckpointContainerResponse> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream =
        Pin<Box<dyn futures::Stream<Item = Result<wire::ContainerEventResponse, Status>> + Send>>;

    async fn get_container_events(
        &self,
        _: Request<wire::GetEventsRequest>,
    ) -> Rpc<Self::GetContainerEventsStream> {
        unimplemented("GetContainerEvents")
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<wire::ListMetricDescriptorsRequest>,
    ) -> Rpc<wire::ListMetricDescriptorsResponse> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<wire::ListPodSandboxMetricsRequest>,
    ) -> Rpc<wire::ListPodSandboxMetricsResponse> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<wire::RuntimeConfigRequest>,
    ) -> Rpc<wire::RuntimeConfigResponse> {
        unimplemented("RuntimeConfig")
    }
}

#[tonic::async_trait]
impl<R: Runtime> ImageService for Service<R> {
    async fn list_images(
        &self,
        _: Request<wire::ListImagesRequest>,
    ) -> Rpc<wire::ListImagesResponse> {
        let images = self.runtime.list_images().await.map_err(status)?;
        Ok(Response::new(wire::ListImagesResponse { images: recode_all(&images) }))
    }

    async fn image_status(
        &self,
        request: Request<wire::ImageStatusRequest>,
    ) -> Rpc<wire::ImageStatusResponse> {
        let name = image_name(request.into_inner().image)?;
        let image = self.runtime.image_status(&name).await.map_err(status)?;
        Ok(Response::new(wire::ImageStatusResponse {
            image: image.as_ref().map(recode),
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        request: Request<wire::PullImageRequest>,
    ) -> Rpc<wire::PullImageResponse> {
        let r = request.into_inner();
        let name = image_name(r.image)?;
        let image_ref = self
            .runtime
            .pull_image(
                &name,
                r.auth.as_ref().map(recode),
                r.sandbox_config.as_ref().map(recode).as_ref(),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(wire::PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        _: Request<wire::RemoveImageRequest>,
    ) -> Rpc<wire::RemoveImageResponse> {
        unimplemented("RemoveImage")
    }

    async fn image_fs_info(
        &self,
        _: Request<wire::ImageFsInfoRequest>,
    ) -> Rpc<wire::ImageFsInfoResponse> {
        unimplemented("ImageFsInfo")
    }
}

#[cfg(test)]
// One literal serves both vocabularies; `..Default::default()` fills the bindings' Windows
// fields, which the agent's messages leave out.
#[allow(clippy::needless_update)]
mod tests {
    //! The agent's hand-kept CRI messages against the bindings crate's generated ones: the
    //! same message written once in each vocabulary, every field a distinct value, must be
    //! equal after crossing from one to the other. A field numbered or typed differently
    //! lands elsewhere (or nowhere) and breaks the equality.

    use super::{recode, wire};
    use crate::runtime::api;

    macro_rules! kv {
        ($m:ident, $k:literal, $v:literal) => {
            $m::KeyValue { key: $k.into(), value: $v.into() }
        };
    }

    macro_rules! sandbox_config {
        ($m:ident) => {
            $m::PodSandboxConfig {
                metadata: Some($m::PodSandboxMetadata {
                    name: "web".into(),
                    uid: "uid-1".into(),
                    namespace: "ns".into(),
                    attempt: 3,
                }),
                hostname: "web-host".into(),
                log_directory: "/var/log/pods/x".into(),
                dns_config: Some($m::DnsConfig {
                    servers: vec!["10.96.0.10".into()],
                    searches: vec!["ns.svc.cluster.local".into()],
                    options: vec!["ndots:5".into()],
                }),
                port_mappings: vec![$m::PortMapping {
                    protocol: $m::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into(),
                }],
                labels: [("app".to_string(), "web".to_string())].into(),
                annotations: [("a".to_string(), "b".to_string())].into(),
                linux: Some($m::LinuxPodSandboxConfig {
                    cgroup_parent: "/kubepods/burstable".into(),
                    security_context: Some($m::LinuxSandboxSecurityContext {
                        namespace_options: Some($m::NamespaceOption {
                            network: $m::NamespaceMode::Node as i32,
                            pid: $m::NamespaceMode::Container as i32,
                            ipc: $m::NamespaceMode::Pod as i32,
                            target_id: "t".into(),
                            ..Default::default()
                        }),
                        run_as_user: Some($m::Int64Value { value: 1000 }),
                        run_as_group: Some($m::Int64Value { value: 2000 }),
                        readonly_rootfs: true,
                        supplemental_groups: vec![3000, 3001],
                        privileged: true,
                        ..Default::default()
                    }),
                    sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
                    overhead: None,
                    resources: Some($m::LinuxContainerResources {
                        cpu_period: 100_000,
                        cpu_quota: 50_000,
                        cpu_shares: 512,
                        memory_limit_in_bytes: 1 << 30,
                        oom_score_adj: -997,
                        cpuset_cpus: "0-1".into(),
                        cpuset_mems: "0".into(),
                        memory_swap_limit_in_bytes: 2 << 30,
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }
        };
    }

    macro_rules! container_config {
        ($m:ident) => {
            $m::ContainerConfig {
                metadata: Some($m::ContainerMetadata { name: "app".into(), attempt: 2 }),
                image: Some($m::ImageSpec { image: "busybox:1".into(), ..Default::default() }),
                command: vec!["/bin/sh".into()],
                args: vec!["-c".into(), "sleep 1".into()],
                working_dir: "/work".into(),
                envs: vec![kv!($m, "A", "1"), kv!($m, "B", "2")],
                mounts: vec![$m::Mount {
                    container_path: "/data".into(),
                    host_path: "/var/lib/x".into(),
                    readonly: true,
                    selinux_relabel: true,
                    propagation: $m::MountPropagation::PropagationHostToContainer as i32,
                    recursive_read_only: true,
                    ..Default::default()
                }],
                labels: [("io.kubernetes.container.name".to_string(), "app".to_string())].into(),
                annotations: [("io.kubernetes.container.restartCount".to_string(), "2".into())]
                    .into(),
                log_path: "app/2.log".into(),
                stdin: true,
                stdin_once: true,
                tty: true,
                linux: Some($m::LinuxContainerConfig {
                    resources: Some($m::LinuxContainerResources {
                        cpu_period: 100_000,
                        cpu_quota: 20_000,
                        cpu_shares: 204,
                        memory_limit_in_bytes: 64 << 20,
                        oom_score_adj: 999,
                        ..Default::default()
                    }),
                    security_context: Some($m::LinuxContainerSecurityContext {
                        capabilities: Some($m::Capability {
                            add_capabilities: vec!["NET_ADMIN".into()],
                            drop_capabilities: vec!["ALL".into()],
                            add_ambient_capabilities: vec!["NET_RAW".into()],
                        }),
                        privileged: true,
                        run_as_user: Some($m::Int64Value { value: 1001 }),
                        run_as_group: Some($m::Int64Value { value: 1002 }),
                        run_as_username: "nobody".into(),
                        readonly_rootfs: true,
                        supplemental_groups: vec![5, 6],
                        no_new_privs: true,
                        masked_paths: vec!["/proc/kcore".into()],
                        readonly_paths: vec!["/proc/sys".into()],
                        seccomp: Some($m::SecurityProfile {
                            profile_type: $m::security_profile::ProfileType::Localhost as i32,
                            localhost_ref: "profiles/p.json".into(),
                        }),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }
        };
    }

    macro_rules! container_status {
        ($m:ident) => {
            $m::ContainerStatus {
                id: "c1".into(),
                metadata: Some($m::ContainerMetadata { name: "app".into(), attempt: 1 }),
                state: $m::ContainerState::ContainerExited as i32,
                created_at: 11,
                started_at: 12,
                finished_at: 13,
                exit_code: 137,
                image: Some($m::ImageSpec { image: "busybox:1".into(), ..Default::default() }),
                image_ref: "sha256:abc".into(),
                reason: "OOMKilled".into(),
                message: "killed".into(),
                labels: [("l".to_string(), "1".to_string())].into(),
                annotations: [("a".to_string(), "2".to_string())].into(),
                log_path: "/var/log/c1.log".into(),
                image_id: "sha256:def".into(),
                ..Default::default()
            }
        };
    }

    macro_rules! sandbox_status {
        ($m:ident) => {
            $m::PodSandboxStatus {
                id: "s1".into(),
                metadata: Some($m::PodSandboxMetadata {
                    name: "web".into(),
                    uid: "u".into(),
                    namespace: "ns".into(),
                    attempt: 1,
                }),
                state: $m::PodSandboxState::SandboxNotready as i32,
                created_at: 21,
                network: Some($m::PodSandboxNetworkStatus {
                    ip: "10.244.0.5".into(),
                    additional_ips: vec![$m::PodIp { ip: "fd00::5".into() }],
                }),
                labels: [("l".to_string(), "1".to_string())].into(),
                annotations: [("a".to_string(), "2".to_string())].into(),
                runtime_handler: "runc".into(),
                ..Default::default()
            }
        };
    }

    macro_rules! stats {
        ($m:ident) => {
            $m::ContainerStats {
                attributes: Some($m::ContainerAttributes {
                    id: "c1".into(),
                    metadata: Some($m::ContainerMetadata { name: "app".into(), attempt: 0 }),
                    labels: [("l".to_string(), "1".to_string())].into(),
                    annotations: [("a".to_string(), "2".to_string())].into(),
                }),
                cpu: Some($m::CpuUsage {
                    timestamp: 31,
                    usage_core_nano_seconds: Some($m::UInt64Value { value: 32 }),
                    usage_nano_cores: Some($m::UInt64Value { value: 33 }),
                }),
                memory: Some($m::MemoryUsage {
                    timestamp: 41,
                    working_set_bytes: Some($m::UInt64Value { value: 42 }),
                    available_bytes: Some($m::UInt64Value { value: 43 }),
                    usage_bytes: Some($m::UInt64Value { value: 44 }),
                    rss_bytes: Some($m::UInt64Value { value: 45 }),
                    page_faults: Some($m::UInt64Value { value: 46 }),
                    major_page_faults: Some($m::UInt64Value { value: 47 }),
                }),
                ..Default::default()
            }
        };
    }

    /// `from`, re-encoded as `B`, equals `to`.
    fn crosses<B>(from: &impl prost::Message, to: &B)
    where
        B: prost::Message + Default + PartialEq + std::fmt::Debug,
    {
        assert_eq!(&recode::<_, B>(from), to);
    }

    macro_rules! agree {
        ($name:ident, $build:ident) => {
            #[test]
            fn $name() {
                let ours = $build!(api);
                let theirs = $build!(wire);
                crosses(&ours, &theirs);
                crosses(&theirs, &ours);
            }
        };
    }

    agree!(sandbox_config_agrees, sandbox_config);
    agree!(container_config_agrees, container_config);
    agree!(container_status_agrees, container_status);
    agree!(sandbox_status_agrees, sandbox_status);
    agree!(container_stats_agree, stats);

    #[test]
    fn requests_agree() {
        let ours =
            api::ExecSyncRequest { container_id: "c".into(), cmd: vec!["ls".into()], timeout: 7 };
        let theirs =
            wire::ExecSyncRequest { container_id: "c".into(), cmd: vec!["ls".into()], timeout: 7 };
        crosses(&ours, &theirs);
        let ours = api::StopContainerRequest { container_id: "c".into(), timeout: 30 };
        let theirs = wire::StopContainerRequest { container_id: "c".into(), timeout: 30 };
        crosses(&ours, &theirs);
        let ours = api::ExecSyncResponse {
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
            exit_code: 3,
        };
        let theirs = wire::ExecSyncResponse {
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
            exit_code: 3,
        };
        crosses(&ours, &theirs);
    }
}
