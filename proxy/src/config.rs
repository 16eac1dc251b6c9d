//! `skiff-proxy run --config FILE`: the daemon's settings as a file (what the DaemonSet's
//! ConfigMap holds), after kube-proxy's `--config` with its KubeProxyConfiguration.
//!
//! Two kinds are read:
//! - `proxy.skiff.dev/v1alpha1` `ProxyConfiguration`: every setting of `skiff-proxy run`,
//!   decoded strictly (an unknown or misspelt field is an error naming it).
//! - `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration`, so a kube-proxy ConfigMap
//!   can be reused: the fields with the same meaning (`hostnameOverride`,
//!   `healthzBindAddress`, `metricsBindAddress`, `clientConnection.kubeconfig`) are taken,
//!   the rest (modes, iptables, ipvs, conntrack tuning) mean nothing here and are listed in
//!   [`FileConfig::ignored`] for a log line.
//!
//! Flags given on the command line win over the file (kube-proxy instead ignores most flags
//! once `--config` is given); the `--no-*` flags can only turn a setting off.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// `apiVersion` of skiff's own kind.
pub const API_VERSION: &str = "proxy.skiff.dev/v1alpha1";
/// skiff's own kind.
pub const KIND: &str = "ProxyConfiguration";
const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
const KUBE_PROXY_KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "{path}: apiVersion {api_version:?} kind {kind:?} is not a proxy configuration \
         ({API_VERSION} {KIND}, or {KUBE_PROXY_API_VERSION} {KUBE_PROXY_KIND})"
    )]
    Kind { path: PathBuf, api_version: String, kind: String },
}

/// `nodePortMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodePortMode {
    Snat,
    Dsr,
}

/// kube-proxy's `clientConnection`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConnection {
    pub kubeconfig: Option<PathBuf>,
}

/// The settings a file gives (every field optional: unset ones keep the flag or default).
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    /// The node's name (kube-proxy's field).
    pub hostname_override: Option<String>,
    /// The node's address (default: the Node's InternalIP).
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<Ipv4Addr>,
    /// kube-proxy's field and default (0.0.0.0:10256).
    pub healthz_bind_address: Option<SocketAddr>,
    /// kube-proxy's field and default (127.0.0.1:10249).
    pub metrics_bind_address: Option<SocketAddr>,
    pub client_connection: Option<ClientConnection>,
    /// bpffs directory of the pinned maps and links (default /sys/fs/bpf/skiff).
    pub pin_dir: Option<PathBuf>,
    /// cgroup v2 directory of the socket-LB hooks (default: the cgroup v2 root).
    pub cgroup_path: Option<PathBuf>,
    /// Mount a bpffs at the pin dir's parent when there is none (default true; false in a
    /// pod, where the host must have mounted it).
    #[serde(rename = "mountBPFFS")]
    pub mount_bpffs: Option<bool>,
    /// Attach the socket-LB hooks (default true).
    #[serde(rename = "socketLB")]
    pub socket_lb: Option<bool>,
    /// Interfaces of the per-packet tc path.
    pub tc_interfaces: Option<Vec<String>>,
    /// Node-facing interfaces of the XDP NodePort path.
    pub xdp_interfaces: Option<Vec<String>>,
    pub node_port_mode: Option<NodePortMode>,
    /// kube-proxy's field: CIDRs of the node's addresses that serve NodePorts besides the
    /// node address, or `["primary"]` (the default: the node address only).
    pub node_port_addresses: Option<Vec<String>>,
    /// kube-proxy's field: the pod ranges, comma-separated (see `--cluster-cidr`).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    /// Log lines as `text` or `json`.
    pub log_format: Option<String>,
    /// Fields of a KubeProxyConfiguration that mean nothing to skiff (not decoded).
    #[serde(skip)]
    pub ignored: Vec<String>,
}

/// kube-proxy's `--nodeport-addresses`/`nodePortAddresses`: CIDRs, or `primary` (also
/// empty: the node address alone). The CIDRs, empty for `primary`.
pub fn parse_nodeport_addresses(list: &[String]) -> Result<Vec<skiff_core::cidr::Cidr>, String> {
    let items: Vec<&str> =
        list.iter().flat_map(|s| s.split(',')).map(str::trim).filter(|s| !s.is_empty()).collect();
    if items == ["primary"] || items.is_empty() {
        return Ok(Vec::new());
    }
    items
        .iter()
        .map(|s| {
            skiff_core::cidr::Cidr::parse(s)
                .ok_or_else(|| format!("{s:?} is not an IPv4 CIDR (or \"primary\" alone)"))
        })
        .collect()
}

/// kube-proxy's `--cluster-cidr`/`clusterCIDR`: comma-separated CIDRs (the IPv6 one of a
/// dual-stack pair is skipped: the data plane is IPv4).
pub fn parse_cluster_cidrs(text: &str) -> Result<Vec<skiff_core::cidr::Cidr>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && !s.contains(':'))
        .map(|s| skiff_core::cidr::Cidr::parse(s).ok_or_else(|| format!("{s:?} is not a CIDR")))
        .collect()
}

/// Reads and checks a configuration file.
pub fn load(path: &Path) -> Result<FileConfig, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
    parse(&text).map_err(|e| match e {
        ParseError::Message(message) => Error::Parse { path: path.to_path_buf(), message },
        ParseError::Kind { api_version, kind } => {
            Error::Kind { path: path.to_path_buf(), api_version, kind }
        }
    })
}

#[derive(Debug)]
enum ParseError {
    Message(String),
    Kind { api_version: String, kind: String },
}

fn parse(text: &str) -> Result<FileConfig, ParseError> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| ParseError::Message(e.to_string()))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(ParseError::Message("the file is not a mapping".into()));
    };
    let text_of = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_str).unwrap_or_default().to_string()
    };
    let api_version = text_of(fields.get("apiVersion"));
    let kind = text_of(fields.get("kind"));
    let mut ignored = Vec::new();
    match (api_version.as_str(), kind.as_str()) {
        (API_VERSION, KIND) => {}
        (KUBE_PROXY_API_VERSION, KUBE_PROXY_KIND) => {
            const SHARED: &[&str] = &[
                "apiVersion",
                "kind",
                "hostnameOverride",
                "healthzBindAddress",
                "metricsBindAddress",
                "clientConnection",
                "nodePortAddresses",
                "clusterCIDR",
            ];
            fields.retain(|k, _| {
                let keep = SHARED.contains(&k.as_str());
                if !keep {
                    ignored.push(k.clone());
                }
                keep
            });
            // Only the kubeconfig of clientConnection (qps, burst, contentType are client
            // tuning skiff leaves to kube-rs).
            if let Some(serde_json::Value::Object(cc)) = fields.get_mut("clientConnection") {
                cc.retain(|k, _| {
                    let keep = k == "kubeconfig";
                    if !keep {
                        ignored.push(format!("clientConnection.{k}"));
                    }
                    keep
                });
                if cc.get("kubeconfig").and_then(serde_json::Value::as_str) == Some("") {
                    cc.remove("kubeconfig");
                }
            }
            // kube-proxy writes empty strings for unset fields.
            fields.retain(|_, v| v.as_str() != Some(""));
        }
        _ => return Err(ParseError::Kind { api_version, kind }),
    }
    let mut config: FileConfig = serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| ParseError::Message(e.to_string()))?;
    if let Some(f) = &config.log_format
        && !matches!(f.as_str(), "text" | "json")
    {
        return Err(ParseError::Message(format!("logFormat {f:?}: expected \"text\" or \"json\"")));
    }
    if let Some(list) = &config.node_port_addresses {
        parse_nodeport_addresses(list)
            .map_err(|e| ParseError::Message(format!("nodePortAddresses: {e}")))?;
    }
    if let Some(c) = &config.cluster_cidr {
        parse_cluster_cidrs(c).map_err(|e| ParseError::Message(format!("clusterCIDR: {e}")))?;
    }
    config.ignored = ignored;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skiffs_kind_gives_every_setting() {
        let c = parse(
            "apiVersion: proxy.skiff.dev/v1alpha1\nkind: ProxyConfiguration\n\
             hostnameOverride: node-1\nnodeIP: 10.0.0.5\nhealthzBindAddress: 0.0.0.0:10256\n\
             metricsBindAddress: 0.0.0.0:10249\npinDir: /sys/fs/bpf/x\ncgroupPath: /sys/fs/cgroup/k\n\
             socketLB: false\nmountBPFFS: false\ntcInterfaces: [eth0]\nxdpInterfaces: [eth0, eth1]\n\
             nodePortMode: dsr\nlogFormat: json\n",
        )
        .unwrap();
        assert_eq!(c.hostname_override.as_deref(), Some("node-1"));
        assert_eq!(c.node_ip, Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(c.metrics_bind_address, Some("0.0.0.0:10249".parse().unwrap()));
        assert_eq!(c.pin_dir, Some(PathBuf::from("/sys/fs/bpf/x")));
        assert_eq!(c.socket_lb, Some(false));
        assert_eq!(c.mount_bpffs, Some(false));
        assert_eq!(c.xdp_interfaces, Some(vec!["eth0".into(), "eth1".into()]));
        assert_eq!(c.node_port_mode, Some(NodePortMode::Dsr));
        assert!(c.ignored.is_empty());
    }

    #[test]
    fn a_kube_proxy_configuration_gives_the_shared_fields() {
        // The shape kubeadm writes into kube-proxy's ConfigMap.
        let c = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             bindAddress: 0.0.0.0\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n  qps: 5\n\
             clusterCIDR: 10.244.0.0/16\nhealthzBindAddress: 0.0.0.0:10256\nhostnameOverride: \"\"\n\
             iptables:\n  masqueradeAll: false\nmetricsBindAddress: 127.0.0.1:10249\nmode: iptables\n\
             nodePortAddresses:\n- 10.0.0.0/8\n- 192.168.0.0/16\n",
        )
        .unwrap();
        assert_eq!(c.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert_eq!(parse_cluster_cidrs("10.244.0.0/16,fd00::/48").unwrap().len(), 1);
        assert!(parse_cluster_cidrs("10.244.0.0/33").is_err());
        let cidrs = parse_nodeport_addresses(c.node_port_addresses.as_deref().unwrap()).unwrap();
        assert_eq!(cidrs.len(), 2);
        assert!(cidrs[1].contains(Ipv4Addr::new(192, 168, 3, 4)));
        // kubeadm writes null; `primary` and empty mean the node address alone.
        let null = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             nodePortAddresses: null\n",
        )
        .unwrap();
        assert_eq!(null.node_port_addresses, None);
        assert!(parse_nodeport_addresses(&["primary".into()]).unwrap().is_empty());
        assert!(parse_nodeport_addresses(&["10.1.0.0/16,10.2.0.0/16".into()]).unwrap().len() == 2);
        assert_eq!(c.hostname_override, None, "empty means unset");
        assert_eq!(
            c.client_connection.and_then(|cc| cc.kubeconfig),
            Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
        );
        assert_eq!(c.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        let mut ignored = c.ignored.clone();
        ignored.sort();
        assert_eq!(ignored, ["bindAddress", "clientConnection.qps", "iptables", "mode"]);
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let err =
            parse("apiVersion: proxy.skiff.dev/v1alpha1\nkind: ProxyConfiguration\npinDri: /x\n")
                .unwrap_err();
        assert!(format!("{err:?}").contains("pinDri"), "{err:?}");
        let err = parse("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert!(matches!(err, ParseError::Kind { .. }), "{err:?}");
        let err =
            parse("apiVersion: proxy.skiff.dev/v1alpha1\nkind: ProxyConfiguration\nnodeIP: nope\n")
                .unwrap_err();
        assert!(format!("{err:?}").contains("invalid"), "{err:?}");
        let err = parse(
            "apiVersion: proxy.skiff.dev/v1alpha1\nkind: ProxyConfiguration\nnodePortMode: nat\n",
        )
        .unwrap_err();
        assert!(format!("{err:?}").contains("nat"), "{err:?}");
        let err = parse(
            "apiVersion: proxy.skiff.dev/v1alpha1\nkind: ProxyConfiguration\n\
             nodePortAddresses: [10.0.0.0/8, 10.0.0.0/33]\n",
        )
        .unwrap_err();
        assert!(format!("{err:?}").contains("10.0.0.0/33"), "{err:?}");
        let err = parse("- a\n- b\n").unwrap_err();
        assert!(format!("{err:?}").contains("mapping"), "{err:?}");
        let dir = tempfile::tempdir().unwrap();
        let err = load(&dir.path().join("missing.yaml")).unwrap_err();
        assert!(err.to_string().contains("missing.yaml"), "{err}");
    }
}
