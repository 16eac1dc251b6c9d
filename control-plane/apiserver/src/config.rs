//! The apiserver's settings ([`ApiConfig`]), authentication and authorization among them.
//! Plain data: what `skiff-server`'s flags and the in-process tests set, read by every layer
//! above.

use std::time::Duration;

use crate::audit;
use crate::kubelet::KubeletClient;
use crate::user::UserInfo;
use skiff_core::cidr::Cidr;

/// Apiserver settings; defaults match upstream's.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// `--service-cluster-ip-range` (upstream default 10.0.0.0/24; kubeadm's 10.96.0.0/12).
    pub service_cidr: Cidr,
    /// `--service-node-port-range` (upstream default 30000-32767).
    pub node_ports: (u16, u16),
    /// How often idle watches get a bookmark (kube-rs treats silence > timeout+5 s as dead).
    pub bookmark_interval: Duration,
    /// Watch timeout when the client gives none (upstream: min-request-timeout 1800 s, jittered).
    pub default_watch_timeout: Duration,
    /// Events kept per resource for watches resuming from an older resourceVersion; older
    /// ones get 410 Expired (upstream's watch cache keeps 100 to 100k, adaptively).
    pub watch_history: usize,
    /// How often store history is compacted to the revision seen one period earlier
    /// (upstream's --etcd-compaction-interval, 5 minutes).
    pub compaction_interval: Duration,
    /// How often the system namespaces and the `kubernetes` Service are re-created if
    /// deleted (upstream's kubernetes-service controller, 10 s).
    pub bootstrap_repair_interval: Duration,
    /// How pods/log and pods/exec reach the agents (the apiserver's client certificate);
    /// without it those subresources answer 503.
    pub kubelet_client: Option<KubeletClient>,
    /// How often the nodes' resource metrics are scraped for `metrics.k8s.io`
    /// (metrics-server's `--metric-resolution`, 15 s).
    pub metric_resolution: Duration,
    /// `--audit-log-path` / `--audit-level` (no path: no audit log).
    pub audit: audit::AuditConfig,
    /// Authentication and authorization (off by default in the library; skiff-server on).
    pub auth: AuthConfig,
    /// The identity requests proxied to extension apiservers carry (upstream's
    /// `--requestheader-client-ca-file` and `--proxy-client-cert-file`); without it they
    /// are proxied without a client certificate, which extension apiservers refuse.
    pub front_proxy: Option<FrontProxy>,
    /// How often every APIService's availability is checked besides on changes (upstream's
    /// availability controller: 30 s; a little faster, so that a dead extension apiserver
    /// leaves aggregated discovery sooner).
    pub apiservice_check_interval: Duration,
}

/// The front proxy's CA and client certificate (PEM), from the cluster PKI.
#[derive(Clone)]
pub struct FrontProxy {
    /// The request-header CA: published in `kube-system/extension-apiserver-authentication`
    /// as `requestheader-client-ca-file`, for extension apiservers to trust.
    pub ca_cert_pem: String,
    /// The client certificate (CN `front-proxy-client`) and its key.
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy").finish_non_exhaustive()
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            service_cidr: Cidr::parse("10.96.0.0/12").expect("valid default CIDR"),
            node_ports: (30000, 32767),
            bookmark_interval: Duration::from_secs(5),
            default_watch_timeout: Duration::from_secs(1800),
            watch_history: 10_000,
            compaction_interval: Duration::from_secs(300),
            bootstrap_repair_interval: Duration::from_secs(10),
            kubelet_client: None,
            metric_resolution: Duration::from_secs(15),
            audit: audit::AuditConfig::default(),
            auth: AuthConfig::default(),
            front_proxy: None,
            apiservice_check_interval: Duration::from_secs(10),
        }
    }
}

/// Authentication and authorization settings of the apiserver.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// Off (the library default, for in-process tests): every request runs as a member of
    /// system:masters. `skiff-server` turns it on.
    pub enabled: bool,
    pub authorization: AuthorizationMode,
    /// `--token-auth-file` entries.
    pub static_tokens: Vec<StaticToken>,
    /// PEM of the ServiceAccount token signing key (PKCS#8 EC P-256) and its public key.
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
    /// The cluster CA, which signs node client certificates for joining agents.
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    /// Lifetime of the node client certificates signed at join (kube-controller-manager's
    /// `--cluster-signing-duration`; zero: its one year).
    pub signing_duration: std::time::Duration,
    /// Token issuer and the audiences the apiserver accepts (upstream defaults).
    pub issuer: String,
    pub audiences: Vec<String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("enabled", &self.enabled)
            .field("authorization", &self.authorization)
            .field("static_tokens", &self.static_tokens.len())
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Which authorizers decide (upstream `--authorization-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthorizationMode {
    /// Node, then RBAC (upstream's recommended `Node,RBAC`).
    #[default]
    NodeRbac,
    /// Every authenticated request is allowed (benchmarks, development).
    AlwaysAllow,
}

/// One line of the token file: `token,user,uid[,"group1,group2"]`.
#[derive(Debug, Clone)]
pub struct StaticToken {
    pub token: String,
    pub user: UserInfo,
}
