//! The CRI v1 messages and the two service clients the agent speaks to containerd with.
//!
//! Written for the agent rather than taken from a bindings crate: those generate tonic's
//! server side too, whose router pulls axum into the node's binary. What is here is the
//! part of `runtime.v1` the agent uses: the request and response messages of the RPCs
//! [`RuntimeServiceClient`] and [`ImageServiceClient`] call, and every message those
//! reference (Windows-only fields left out: decoding skips fields it does not know, and
//! the agent never sets them). Names, field numbers and types follow the CRI proto, with
//! prost's usual Rust spelling (`DNSConfig` is [`DnsConfig`], enum fields are `i32` with
//! typed getters), so the wire format is CRI's. The fake CRI server of the test side is
//! built on the `k8s-cri` bindings and re-encodes between the two, so every field the
//! tests touch is checked against an independent reading of the proto.

use std::collections::HashMap;

use tonic::client::Grpc;
use tonic::transport::Channel;

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthConfig {
    #[prost(string, tag = "1")]
    pub username: String,
    #[prost(string, tag = "2")]
    pub password: String,
    #[prost(string, tag = "3")]
    pub auth: String,
    #[prost(string, tag = "4")]
    pub server_address: String,
    #[prost(string, tag = "5")]
    pub identity_token: String,
    #[prost(string, tag = "6")]
    pub registry_token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Capability {
    #[prost(string, repeated, tag = "1")]
    pub add_capabilities: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub drop_capabilities: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub add_ambient_capabilities: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "4")]
    pub image: Option<ImageSpec>,
    #[prost(string, tag = "5")]
    pub image_ref: String,
    #[prost(enumeration = "ContainerState", tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "8")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "9")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "10")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAttributes {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(map = "string, string", tag = "3")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(string, tag = "5")]
    pub working_dir: String,
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<KeyValue>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "8")]
    pub devices: Vec<Device>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(bool, tag = "12")]
    pub stdin: bool,
    #[prost(bool, tag = "13")]
    pub stdin_once: bool,
    #[prost(bool, tag = "14")]
    pub tty: bool,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
    #[prost(message, repeated, tag = "17")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<ContainerStateValue>,
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
    #[prost(map = "string, string", tag = "4")]
    pub label_selector: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(message, optional, tag = "1")]
    pub linux: Option<LinuxContainerResources>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ContainerState {
    ContainerCreated = 0,
    ContainerRunning = 1,
    ContainerExited = 2,
    ContainerUnknown = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStateValue {
    #[prost(enumeration = "ContainerState", tag = "1")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStats {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<ContainerAttributes>,
    #[prost(message, optional, tag = "2")]
    pub cpu: Option<CpuUsage>,
    #[prost(message, optional, tag = "3")]
    pub memory: Option<MemoryUsage>,
    #[prost(message, optional, tag = "4")]
    pub writable_layer: Option<FilesystemUsage>,
    #[prost(message, optional, tag = "5")]
    pub swap: Option<SwapUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(enumeration = "ContainerState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(int64, tag = "5")]
    pub started_at: i64,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(message, optional, tag = "8")]
    pub image: Option<ImageSpec>,
    #[prost(string, tag = "9")]
    pub image_ref: String,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
    #[prost(map = "string, string", tag = "12")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "13")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "14")]
    pub mounts: Vec<Mount>,
    #[prost(string, tag = "15")]
    pub log_path: String,
    #[prost(message, optional, tag = "16")]
    pub resources: Option<ContainerResources>,
    #[prost(string, tag = "17")]
    pub image_id: String,
    #[prost(message, optional, tag = "18")]
    pub user: Option<ContainerUser>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerUser {
    #[prost(message, optional, tag = "1")]
    pub linux: Option<LinuxContainerUser>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CpuUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub usage_core_nano_seconds: Option<UInt64Value>,
    #[prost(message, optional, tag = "3")]
    pub usage_nano_cores: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DnsConfig {
    #[prost(string, repeated, tag = "1")]
    pub servers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub searches: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub options: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(string, tag = "3")]
    pub permissions: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(bool, tag = "3")]
    pub tty: bool,
    #[prost(bool, tag = "4")]
    pub stdin: bool,
    #[prost(bool, tag = "5")]
    pub stdout: bool,
    #[prost(bool, tag = "6")]
    pub stderr: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecResponse {
    #[prost(string, tag = "1")]
    pub url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(int64, tag = "3")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub stdout: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub stderr: Vec<u8>,
    #[prost(int32, tag = "3")]
    pub exit_code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FilesystemIdentifier {
    #[prost(string, tag = "1")]
    pub mountpoint: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FilesystemUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub fs_id: Option<FilesystemIdentifier>,
    #[prost(message, optional, tag = "3")]
    pub used_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "4")]
    pub inodes_used: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HugepageLimit {
    #[prost(string, tag = "1")]
    pub page_size: String,
    #[prost(uint64, tag = "2")]
    pub limit: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct IdMapping {
    #[prost(uint32, tag = "1")]
    pub host_id: u32,
    #[prost(uint32, tag = "2")]
    pub container_id: u32,
    #[prost(uint32, tag = "3")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub repo_digests: Vec<String>,
    #[prost(uint64, tag = "4")]
    pub size: u64,
    #[prost(message, optional, tag = "5")]
    pub uid: Option<Int64Value>,
    #[prost(string, tag = "6")]
    pub username: String,
    #[prost(message, optional, tag = "7")]
    pub spec: Option<ImageSpec>,
    #[prost(bool, tag = "8")]
    pub pinned: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageFilter {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    #[prost(map = "string, string", tag = "2")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "18")]
    pub user_specified_image: String,
    #[prost(string, tag = "19")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Int64Value {
    #[prost(int64, tag = "1")]
    pub value: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub resources: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerResources {
    #[prost(int64, tag = "1")]
    pub cpu_period: i64,
    #[prost(int64, tag = "2")]
    pub cpu_quota: i64,
    #[prost(int64, tag = "3")]
    pub cpu_shares: i64,
    #[prost(int64, tag = "4")]
    pub memory_limit_in_bytes: i64,
    #[prost(int64, tag = "5")]
    pub oom_score_adj: i64,
    #[prost(string, tag = "6")]
    pub cpuset_cpus: String,
    #[prost(string, tag = "7")]
    pub cpuset_mems: String,
    #[prost(message, repeated, tag = "8")]
    pub hugepage_limits: Vec<HugepageLimit>,
    #[prost(map = "string, string", tag = "9")]
    pub unified: HashMap<String, String>,
    #[prost(int64, tag = "10")]
    pub memory_swap_limit_in_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub capabilities: Option<Capability>,
    #[prost(bool, tag = "2")]
    pub privileged: bool,
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(message, optional, tag = "4")]
    pub selinux_options: Option<SeLinuxOption>,
    #[prost(message, optional, tag = "5")]
    pub run_as_user: Option<Int64Value>,
    #[prost(message, optional, tag = "12")]
    pub run_as_group: Option<Int64Value>,
    #[prost(string, tag = "6")]
    pub run_as_username: String,
    #[prost(bool, tag = "7")]
    pub readonly_rootfs: bool,
    #[prost(int64, repeated, tag = "8")]
    pub supplemental_groups: Vec<i64>,
    #[prost(enumeration = "SupplementalGroupsPolicy", tag = "17")]
    pub supplemental_groups_policy: i32,
    #[prost(bool, tag = "11")]
    pub no_new_privs: bool,
    #[prost(string, repeated, tag = "13")]
    pub masked_paths: Vec<String>,
    #[prost(string, repeated, tag = "14")]
    pub readonly_paths: Vec<String>,
    #[prost(message, optional, tag = "15")]
    pub seccomp: Option<SecurityProfile>,
    #[prost(message, optional, tag = "16")]
    pub apparmor: Option<SecurityProfile>,
    #[prost(string, tag = "9")]
    pub apparmor_profile: String,
    #[prost(string, tag = "10")]
    pub seccomp_profile_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerUser {
    #[prost(int64, tag = "1")]
    pub uid: i64,
    #[prost(int64, tag = "2")]
    pub gid: i64,
    #[prost(int64, repeated, tag = "3")]
    pub supplemental_groups: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
    #[prost(map = "string, string", tag = "3")]
    pub sysctls: HashMap<String, String>,
    #[prost(message, optional, tag = "4")]
    pub overhead: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "5")]
    pub resources: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxStatus {
    #[prost(message, optional, tag = "1")]
    pub namespaces: Option<Namespace>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(message, optional, tag = "2")]
    pub selinux_options: Option<SeLinuxOption>,
    #[prost(message, optional, tag = "3")]
    pub run_as_user: Option<Int64Value>,
    #[prost(message, optional, tag = "8")]
    pub run_as_group: Option<Int64Value>,
    #[prost(bool, tag = "4")]
    pub readonly_rootfs: bool,
    #[prost(int64, repeated, tag = "5")]
    pub supplemental_groups: Vec<i64>,
    #[prost(enumeration = "SupplementalGroupsPolicy", tag = "11")]
    pub supplemental_groups_policy: i32,
    #[prost(bool, tag = "6")]
    pub privileged: bool,
    #[prost(message, optional, tag = "9")]
    pub seccomp: Option<SecurityProfile>,
    #[prost(message, optional, tag = "10")]
    pub apparmor: Option<SecurityProfile>,
    #[prost(string, tag = "7")]
    pub seccomp_profile_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainerStatsRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerStatsFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainerStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub stats: Vec<ContainerStats>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ImageFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListImagesResponse {
    #[prost(message, repeated, tag = "1")]
    pub images: Vec<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MemoryUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub working_set_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "3")]
    pub available_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "4")]
    pub usage_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "5")]
    pub rss_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "6")]
    pub page_faults: Option<UInt64Value>,
    #[prost(message, optional, tag = "7")]
    pub major_page_faults: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
    #[prost(bool, tag = "4")]
    pub selinux_relabel: bool,
    #[prost(enumeration = "MountPropagation", tag = "5")]
    pub propagation: i32,
    #[prost(message, repeated, tag = "6")]
    pub uid_mappings: Vec<IdMapping>,
    #[prost(message, repeated, tag = "7")]
    pub gid_mappings: Vec<IdMapping>,
    #[prost(bool, tag = "8")]
    pub recursive_read_only: bool,
    #[prost(message, optional, tag = "9")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MountPropagation {
    PropagationPrivate = 0,
    PropagationHostToContainer = 1,
    PropagationBidirectional = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Namespace {
    #[prost(message, optional, tag = "2")]
    pub options: Option<NamespaceOption>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NamespaceMode {
    Pod = 0,
    Container = 1,
    Node = 2,
    Target = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    #[prost(enumeration = "NamespaceMode", tag = "1")]
    pub network: i32,
    #[prost(enumeration = "NamespaceMode", tag = "2")]
    pub pid: i32,
    #[prost(enumeration = "NamespaceMode", tag = "3")]
    pub ipc: i32,
    #[prost(string, tag = "4")]
    pub target_id: String,
    #[prost(message, optional, tag = "5")]
    pub userns_options: Option<UserNamespace>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, optional, tag = "4")]
    pub dns_config: Option<DnsConfig>,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<PodSandboxStateValue>,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStateValue {
    #[prost(enumeration = "PodSandboxState", tag = "1")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
    #[prost(message, optional, tag = "6")]
    pub linux: Option<LinuxPodSandboxStatus>,
    #[prost(map = "string, string", tag = "7")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "9")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
    #[prost(message, repeated, tag = "3")]
    pub containers_statuses: Vec<ContainerStatus>,
    #[prost(int64, tag = "4")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PortMapping {
    #[prost(enumeration = "Protocol", tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Protocol {
    Tcp = 0,
    Udp = 1,
    Sctp = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(message, optional, tag = "2")]
    pub auth: Option<AuthConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageResponse {
    #[prost(string, tag = "1")]
    pub image_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SeLinuxOption {
    #[prost(string, tag = "1")]
    pub user: String,
    #[prost(string, tag = "2")]
    pub role: String,
    #[prost(string, tag = "3")]
    pub r#type: String,
    #[prost(string, tag = "4")]
    pub level: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecurityProfile {
    #[prost(enumeration = "security_profile::ProfileType", tag = "1")]
    pub profile_type: i32,
    #[prost(string, tag = "2")]
    pub localhost_ref: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxResponse {}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SupplementalGroupsPolicy {
    Merge = 0,
    Strict = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SwapUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub swap_available_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "3")]
    pub swap_usage_bytes: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UserNamespace {
    #[prost(enumeration = "NamespaceMode", tag = "1")]
    pub mode: i32,
    #[prost(message, repeated, tag = "2")]
    pub uids: Vec<IdMapping>,
    #[prost(message, repeated, tag = "3")]
    pub gids: Vec<IdMapping>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

/// One unary RPC on `grpc`: waits for the channel, sends `request` to `path`, decodes the
/// answer.
/// The kubelet's `operation_type` of a CRI method (`run_pod_sandbox` is its
/// `run_podsandbox`, `list_pod_sandbox` its `list_podsandbox`, ...).
fn operation_type(method: &'static str) -> &'static str {
    match method {
        "run_pod_sandbox" => "run_podsandbox",
        "stop_pod_sandbox" => "stop_podsandbox",
        "remove_pod_sandbox" => "remove_podsandbox",
        "pod_sandbox_status" => "podsandbox_status",
        "list_pod_sandbox" => "list_podsandbox",
        other => other,
    }
}

/// Every call is counted and timed under `operation` (the kubelet's runtime operation
/// metrics, [`crate::metrics::runtime_operation`]).
async fn unary<Req, Resp>(
    grpc: &mut Grpc<Channel>,
    path: &'static str,
    operation: &'static str,
    request: tonic::Request<Req>,
) -> Result<tonic::Response<Resp>, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let started = std::time::Instant::now();
    let r = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("CRI channel not ready: {e}")))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        grpc.unary(request, http::uri::PathAndQuery::from_static(path), codec).await
    }
    .await;
    crate::metrics::runtime_operation(operation, started.elapsed(), r.is_ok());
    r
}

/// Declares a CRI service client: a cheap-to-clone handle on one channel, one method per
/// RPC, named as in tonic's generated clients.
macro_rules! client {
    ($(#[$doc:meta])* $client:ident, $service:literal,
     $($method:ident($req:ident) -> $resp:ident = $rpc:literal;)*) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $client {
            grpc: Grpc<Channel>,
        }

        impl $client {
            pub fn new(channel: Channel) -> Self {
                $client { grpc: Grpc::new(channel) }
            }

            /// Largest answer accepted (tonic's default is 4 MiB).
            pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
                self.grpc = self.grpc.max_decoding_message_size(limit);
                self
            }

            $(
                pub async fn $method(
                    &mut self,
                    request: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    let path = concat!("/", $service, "/", $rpc);
                    unary(&mut self.grpc, path, operation_type(stringify!($method)), request)
                        .await
                }
            )*
        }
    };
}

client! {
    /// `runtime.v1.RuntimeService`: sandboxes, containers, exec, stats.
    RuntimeServiceClient, "runtime.v1.RuntimeService",
    version(VersionRequest) -> VersionResponse = "Version";
    run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse = "RunPodSandbox";
    stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse = "StopPodSandbox";
    remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse = "RemovePodSandbox";
    pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse = "PodSandboxStatus";
    list_pod_sandbox(ListPodSandboxRequest) -> ListPodSandboxResponse = "ListPodSandbox";
    create_container(CreateContainerRequest) -> CreateContainerResponse = "CreateContainer";
    start_container(StartContainerRequest) -> StartContainerResponse = "StartContainer";
    stop_container(StopContainerRequest) -> StopContainerResponse = "StopContainer";
    remove_container(RemoveContainerRequest) -> RemoveContainerResponse = "RemoveContainer";
    list_containers(ListContainersRequest) -> ListContainersResponse = "ListContainers";
    container_status(ContainerStatusRequest) -> ContainerStatusResponse = "ContainerStatus";
    exec_sync(ExecSyncRequest) -> ExecSyncResponse = "ExecSync";
    exec(ExecRequest) -> ExecResponse = "Exec";
    list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse = "ListContainerStats";
}

client! {
    /// `runtime.v1.ImageService`: image presence and pulls.
    ImageServiceClient, "runtime.v1.ImageService",
    list_images(ListImagesRequest) -> ListImagesResponse = "ListImages";
    image_status(ImageStatusRequest) -> ImageStatusResponse = "ImageStatus";
    pull_image(PullImageRequest) -> PullImageResponse = "PullImage";
}

/// The enum nested in [`SecurityProfile`].
pub mod security_profile {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum ProfileType {
        RuntimeDefault = 0,
        Unconfined = 1,
        Localhost = 2,
    }
}
