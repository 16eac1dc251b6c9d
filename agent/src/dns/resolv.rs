//! A pod's resolv.conf as the CRI sandbox `DNSConfig`: its `dnsPolicy` (ClusterFirst,
//! ClusterFirstWithHostNet, Default, None) applied over the cluster DNS and the node's
//! resolv.conf, then its `dnsConfig` merged, with the kubelet's rules and limits
//! (pkg/kubelet/network/dns).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::runtime::api::DnsConfig as SandboxDnsConfig;

/// The node-local DNS address (NodeLocal DNSCache's well-known link-local address).
pub const DEFAULT_DNS_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 20, 10));

/// Nameservers a resolver uses (glibc's MAXNS; the kubelet's limit).
pub const MAX_NAMESERVERS: usize = 3;
/// Search domains kept (the kubelet's MaxDNSSearchPaths).
pub const MAX_SEARCHES: usize = 32;
/// Characters of the search line kept (the kubelet's MaxDNSSearchListChars).
pub const MAX_SEARCH_CHARS: usize = 2048;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the node's resolv.conf {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The node's resolv.conf (the kubelet's `--resolv-conf`), what `dnsPolicy: Default` gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostResolv {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl HostResolv {
    pub fn parse(text: &str) -> Self {
        let mut out = HostResolv::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => out.nameservers.extend(words.next().map(String::from)),
                // The last `search`/`domain` line wins, as in glibc.
                Some("search") | Some("domain") => {
                    out.searches = words.map(|w| w.trim_end_matches('.').to_string()).collect()
                }
                Some("options") => out.options.extend(words.map(String::from)),
                _ => {}
            }
        }
        out
    }

    pub fn read(path: &Path) -> Result<Self> {
        std::fs::read_to_string(path)
            .map(|t| Self::parse(&t))
            .map_err(|source| Error::Read { path: path.into(), source })
    }
}

/// The cluster DNS a pod gets with `dnsPolicy: ClusterFirst` (the kubelet's
/// `--cluster-dns` and `--cluster-domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDns {
    pub servers: Vec<IpAddr>,
    pub domain: String,
}

impl Default for ClusterDns {
    /// The agent's node-local DNS on 169.254.20.10 for `cluster.local`.
    fn default() -> Self {
        ClusterDns { servers: vec![DEFAULT_DNS_ADDRESS], domain: "cluster.local".into() }
    }
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

/// Options by name (`ndots:5`, `edns0`): a later one replaces an earlier one in place.
fn merge_options(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        let name = item.split(':').next().unwrap_or_default().to_string();
        match list.iter_mut().find(|o| o.split(':').next() == Some(name.as_str())) {
            Some(existing) => *existing = item,
            None => list.push(item),
        }
    }
}

/// The sandbox DNS configuration of `pod`.
pub fn sandbox_dns_config(pod: &Pod, cluster: &ClusterDns, host: &HostResolv) -> SandboxDnsConfig {
    let spec = pod.spec.as_ref();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let mut out = SandboxDnsConfig::default();
    if policy == "None" {
        // Only what dnsConfig says.
    } else if cluster_first && !cluster.servers.is_empty() {
        let d = cluster.domain.trim_end_matches('.');
        out.servers = cluster.servers.iter().map(IpAddr::to_string).collect();
        push_unique(
            &mut out.searches,
            [format!("{namespace}.svc.{d}"), format!("svc.{d}"), d.to_string()]
                .into_iter()
                .chain(host.searches.iter().cloned()),
        );
        out.options = vec!["ndots:5".into()];
    } else {
        // Default (and ClusterFirst without a cluster DNS, as the kubelet falls back).
        push_unique(&mut out.servers, host.nameservers.iter().cloned());
        push_unique(&mut out.searches, host.searches.iter().cloned());
        merge_options(&mut out.options, host.options.iter().cloned());
    }
    if let Some(cfg) = spec.and_then(|s| s.dns_config.as_ref()) {
        push_unique(&mut out.servers, cfg.nameservers.iter().flatten().cloned());
        push_unique(&mut out.searches, cfg.searches.iter().flatten().cloned());
        merge_options(
            &mut out.options,
            cfg.options.iter().flatten().filter_map(|o| {
                let name = o.name.clone()?;
                Some(match &o.value {
                    Some(v) => format!("{name}:{v}"),
                    None => name,
                })
            }),
        );
    }
    out.servers.truncate(MAX_NAMESERVERS);
    out.searches.truncate(MAX_SEARCHES);
    let mut chars = 0;
    out.searches.retain(|s| {
        chars += s.len() + 1;
        chars <= MAX_SEARCH_CHARS + 1
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(policy: Option<&str>, host_network: bool, cfg: Option<PodDNSConfig>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                dns_policy: policy.map(Into::into),
                host_network: Some(host_network),
                dns_config: cfg,
                ..Default::default()
            }),
            status: None,
        }
    }

    fn host() -> HostResolv {
        HostResolv::parse(
            "nameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch corp.example.\noptions timeout:1 ndots:2\n",
        )
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn cluster_first_points_at_the_cluster_dns_with_search_path_and_ndots() {
        let c = sandbox_dns_config(&pod(None, false, None), &ClusterDns::default(), &host());
        assert_eq!(c.servers, s(&["169.254.20.10"]));
        assert_eq!(
            c.searches,
            s(&["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"])
        );
        assert_eq!(c.options, s(&["ndots:5"]));
    }

    #[test]
    fn host_network_pods_use_the_node_unless_cluster_first_with_host_net() {
        let c = sandbox_dns_config(
            &pod(Some("ClusterFirst"), true, None),
            &ClusterDns::default(),
            &host(),
        );
        assert_eq!(c.servers, s(&["10.0.0.2", "10.0.0.3"]));
        assert_eq!(c.searches, s(&["corp.example"]));
        assert_eq!(c.options, s(&["timeout:1", "ndots:2"]));
        let c = sandbox_dns_config(
            &pod(Some("ClusterFirstWithHostNet"), true, None),
            &ClusterDns::default(),
            &host(),
        );
        assert_eq!(c.servers, s(&["169.254.20.10"]));
        let c =
            sandbox_dns_config(&pod(Some("Default"), false, None), &ClusterDns::default(), &host());
        assert_eq!(c.servers, s(&["10.0.0.2", "10.0.0.3"]));
    }

    #[test]
    fn none_takes_only_dns_config_and_dns_config_merges() {
        let cfg = PodDNSConfig {
            nameservers: Some(s(&["192.0.2.53", "169.254.20.10"])),
            searches: Some(s(&["extra.example"])),
            options: Some(vec![
                PodDNSConfigOption { name: Some("ndots".into()), value: Some("2".into()) },
                PodDNSConfigOption { name: Some("edns0".into()), value: None },
            ]),
        };
        let c = sandbox_dns_config(
            &pod(Some("None"), false, Some(cfg.clone())),
            &ClusterDns::default(),
            &host(),
        );
        assert_eq!(c.servers, s(&["192.0.2.53", "169.254.20.10"]));
        assert_eq!(c.searches, s(&["extra.example"]));
        assert_eq!(c.options, s(&["ndots:2", "edns0"]));
        let c = sandbox_dns_config(&pod(None, false, Some(cfg)), &ClusterDns::default(), &host());
        assert_eq!(c.servers, s(&["169.254.20.10", "192.0.2.53"]), "merged without duplicates");
        assert_eq!(c.searches.last().map(String::as_str), Some("extra.example"));
        assert_eq!(c.options, s(&["ndots:2", "edns0"]), "pod options override by name");
    }

    #[test]
    fn limits_as_the_kubelet() {
        let cfg = PodDNSConfig {
            nameservers: Some(s(&["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"])),
            searches: Some((0..40).map(|i| format!("d{i}.example")).collect()),
            options: None,
        };
        let c = sandbox_dns_config(
            &pod(Some("None"), false, Some(cfg)),
            &ClusterDns::default(),
            &host(),
        );
        assert_eq!(c.servers.len(), MAX_NAMESERVERS);
        assert_eq!(c.searches.len(), MAX_SEARCHES);
    }
}
