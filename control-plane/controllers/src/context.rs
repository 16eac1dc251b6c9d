//! What every controller gets and shares: the settings ([`ControllerConfig`]), the client and
//! informers ([`Context`]) and the status-patch helpers of the workload controllers. The
//! controllers import it; it imports none of them.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use skiff_core::cidr::Cidr;
use skiff_core::informers::Informers;
use skiff_core::supervisor::Supervision;

/// A count for a status field upstream's Go type leaves out when zero (`omitempty` on a
/// plain integer): `None` for 0, so the status compares equal to what is stored.
pub fn omit_zero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// The merge patch that writes `status` of a `group`/`kind`: its counts left out for being
/// zero ([`omit_zero`]) are sent as null, so a stored count is removed rather than kept.
pub fn status_patch(status: &impl serde::Serialize, group: &str, kind: &str) -> serde_json::Value {
    let mut status = serde_json::to_value(status).unwrap_or_default();
    if let Some(s) = status.as_object_mut() {
        for field in skiff_core::status::omitted_zero_status(group, kind) {
            s.entry(*field).or_insert(serde_json::Value::Null);
        }
    }
    serde_json::json!({ "status": status })
}

/// Controller settings; each default matches kube-controller-manager's.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `--node-monitor-grace-period`: a node whose Lease is older is NotReady (upstream 40 s).
    pub node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period`: how long a node that never posted a status may stay
    /// silent (upstream 1 min).
    pub node_startup_grace_period: Duration,
    /// Toleration seconds given to pods for not-ready/unreachable taints (upstream 300 s,
    /// DefaultTolerationSeconds admission).
    pub default_toleration: Duration,
    /// `--cluster-cidr` for node IPAM; `None` disables podCIDR allocation.
    pub cluster_cidr: Option<Cidr>,
    /// `--node-cidr-mask-size` (upstream 24).
    pub node_cidr_mask: u8,
    /// How long Events live (upstream `--event-ttl` 1 h).
    pub event_ttl: Duration,
    /// The address the apiserver serves on, written into the `kubernetes` Service's
    /// Endpoints/EndpointSlice (upstream `--advertise-address`/`--secure-port`); `None`
    /// leaves them alone.
    pub apiserver_endpoint: Option<(String, u16)>,
    /// The cluster CA (PEM) published as the `kube-root-ca.crt` ConfigMap in every
    /// namespace; `None`: not published.
    pub root_ca_pem: Option<String>,
    /// `--terminated-pod-gc-threshold`: terminated pods kept before the pod GC deletes the
    /// oldest (upstream 12500; 0 disables).
    pub terminated_pod_gc_threshold: usize,
    /// How often the pod GC runs (upstream `gcCheckPeriod` 20 s).
    pub pod_gc_period: Duration,
    /// How long a node must be missing before its pods count as orphaned (upstream 40 s).
    pub pod_gc_quarantine: Duration,
    /// Where on each node the local-path provisioner keeps its volumes; `None`: no
    /// provisioner and no `local-path` StorageClass.
    pub local_path_root: Option<std::path::PathBuf>,
    /// The image of the local-path teardown helper pods (it needs `rm`).
    pub local_path_helper_image: String,
    /// How often the autoscalers run (`--horizontal-pod-autoscaler-sync-period`, 15 s).
    pub hpa_sync_period: Duration,
    /// How long a scale-down waits for the highest recommendation of the window
    /// (`--horizontal-pod-autoscaler-downscale-stabilization`, 5 min).
    pub hpa_downscale_stabilization: Duration,
    /// The CA the signing controller signs approved CertificateSigningRequests with
    /// (kube-controller-manager's `--cluster-signing-cert-file`/`-key-file`); `None`: no
    /// signer runs.
    pub signing_ca: Option<SigningCa>,
    /// `--cluster-signing-duration`: the longest lifetime it signs (upstream one year).
    pub cluster_signing_duration: Duration,
    /// How a stopped or panicking controller is restarted.
    pub supervision: Supervision,
}

/// The cluster CA's certificate and key (PEM).
#[derive(Clone)]
pub struct SigningCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SigningCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningCa").finish_non_exhaustive()
    }
}

/// The local-path teardown helper's image by default (k3s's is a busybox too).
pub const DEFAULT_HELPER_IMAGE: &str = "docker.io/library/busybox:1.36";

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            node_monitor_grace_period: Duration::from_secs(40),
            node_startup_grace_period: Duration::from_secs(60),
            default_toleration: Duration::from_secs(300),
            cluster_cidr: Cidr::parse("10.244.0.0/16"),
            node_cidr_mask: 24,
            event_ttl: Duration::from_secs(3600),
            apiserver_endpoint: None,
            root_ca_pem: None,
            terminated_pod_gc_threshold: 12500,
            pod_gc_period: Duration::from_secs(20),
            pod_gc_quarantine: Duration::from_secs(40),
            local_path_root: None,
            local_path_helper_image: DEFAULT_HELPER_IMAGE.into(),
            hpa_sync_period: Duration::from_secs(15),
            hpa_downscale_stabilization: Duration::from_secs(300),
            signing_ca: None,
            cluster_signing_duration: Duration::from_secs(365 * 86_400),
            supervision: Supervision::default(),
        }
    }
}

/// What every controller gets.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    /// The process's informers: every controller reads its kinds from these, one watch per
    /// kind for all of them.
    pub informers: Arc<Informers>,
}

impl Context {
    pub fn new(client: Client, config: ControllerConfig) -> Arc<Context> {
        let informers = Informers::new(client.clone());
        Arc::new(Context { client, config, informers })
    }
}
