//! The pod sandbox: its CRI config (hostname, DNS, port mappings, labels with the pod uid,
//! log directory) and the sandbox step of a pod's sync.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::config::AgentConfig;
use crate::runtime::{POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL, api};

/// The labels every sandbox and container of `pod` carries (adoption finds them by these).
pub fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels = HashMap::new();
    labels.insert(POD_UID_LABEL.to_string(), pod.uid().unwrap_or_default());
    labels.insert(POD_NAME_LABEL.to_string(), pod.name_any());
    labels.insert(POD_NAMESPACE_LABEL.to_string(), pod.namespace().unwrap_or_default());
    labels
}

/// The resolv.conf of a pod: (nameservers, searches, options), per dnsPolicy and dnsConfig.
pub fn dns_config(pod: &Pod, config: &AgentConfig) -> Option<api::DnsConfig> {
    let spec = pod.spec.as_ref()?;
    let ns = pod.namespace().unwrap_or_else(|| "default".into());
    let domain = &config.cluster_domain;
    let cluster = || api::DnsConfig {
        servers: config.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
        searches: vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.clone()],
        options: vec!["ndots:5".into()],
    };
    let host_network = spec.host_network.unwrap_or(false);
    let mut dns = match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "None" => api::DnsConfig::default(),
        // Default: the node's resolv.conf (the runtime uses the host's when unset).
        "Default" => return custom(None, spec.dns_config.as_ref()),
        "ClusterFirstWithHostNet" => cluster(),
        // ClusterFirst on the host network falls back to Default, as the kubelet does.
        _ if host_network => return custom(None, spec.dns_config.as_ref()),
        _ => cluster(),
    };
    if let Some(extra) = &spec.dns_config {
        merge(&mut dns, extra);
    }
    Some(dns)
}

fn custom(
    base: Option<api::DnsConfig>,
    extra: Option<&k8s_openapi::api::core::v1::PodDNSConfig>,
) -> Option<api::DnsConfig> {
    let extra = extra?;
    let mut dns = base.unwrap_or_default();
    merge(&mut dns, extra);
    Some(dns)
}

fn merge(dns: &mut api::DnsConfig, extra: &k8s_openapi::api::core::v1::PodDNSConfig) {
    for s in extra.nameservers.iter().flatten() {
        if !dns.servers.contains(s) {
            dns.servers.push(s.clone());
        }
    }
    for s in extra.searches.iter().flatten() {
        if !dns.searches.contains(s) {
            dns.searches.push(s.clone());
        }
    }
    for o in extra.options.iter().flatten() {
        let opt = match &o.value {
            Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
            None => o.name.clone().unwrap_or_default(),
        };
        let key = o.name.clone().unwrap_or_default();
        dns.options.retain(|x| x.split(':').next() != Some(key.as_str()));
        dns.options.push(opt);
    }
}

/// Host port mappings of every container port with a hostPort.
pub fn port_mappings(pod: &Pod) -> Vec<api::PortMapping> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The pod's hostname: spec.hostname, else the pod name (truncated to 63 characters).
pub fn hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return String::new();
    }
    let mut h = spec.and_then(|s| s.hostname.clone()).unwrap_or_else(|| pod.name_any());
    h.truncate(63);
    h.trim_end_matches(['-', '.']).to_string()
}

/// The cgroup parent of pod `uid`'s sandbox and containers: `<node parent>/pod<uid>` (the
/// kubelet's cgroupfs layout), so the agent can remove what the runtime leaves behind
/// ([`crate::pods::termination::remove_pod_cgroups`]); empty (the runtime's default) when
/// the node has no cgroup parent.
pub fn pod_cgroup_parent(config: &AgentConfig, uid: &str) -> String {
    let parent = config.cgroup_parent.trim_end_matches('/');
    if parent.is_empty() || uid.is_empty() {
        return String::new();
    }
    format!("{parent}/pod{uid}")
}

/// Whether any container of `pod` asks for `privileged`.
fn any_privileged(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let privileged = |sc: Option<&k8s_openapi::api::core::v1::SecurityContext>| {
        sc.and_then(|s| s.privileged).unwrap_or(false)
    };
    spec.containers.iter().any(|c| privileged(c.security_context.as_ref()))
        || spec.init_containers.iter().flatten().any(|c| privileged(c.security_context.as_ref()))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| privileged(c.security_context.as_ref()))
}

/// The sandbox config of `pod` (attempt counts sandbox re-creations).
pub fn sandbox_config(pod: &Pod, config: &AgentConfig, attempt: u32) -> api::PodSandboxConfig {
    let uid = pod.uid().unwrap_or_default();
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    let host_pid = pod.spec.as_ref().and_then(|s| s.host_pid).unwrap_or(false);
    let host_ipc = pod.spec.as_ref().and_then(|s| s.host_ipc).unwrap_or(false);
    let mode = |host: bool| {
        if host { api::NamespaceMode::Node as i32 } else { api::NamespaceMode::Pod as i32 }
    };
    let mut labels: HashMap<String, String> = pod.labels().clone().into_iter().collect();
    labels.extend(pod_labels(pod));
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: ns.clone(),
            attempt,
        }),
        hostname: hostname(pod),
        log_directory: config.pod_log_dir(&ns, &name, &uid).to_string_lossy().into_owned(),
        dns_config: dns_config(pod, config),
        port_mappings: port_mappings(pod),
        labels,
        annotations: pod.annotations().clone().into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: pod_cgroup_parent(config, &uid),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: mode(host_network),
                    pid: if host_pid {
                        api::NamespaceMode::Node as i32
                    } else {
                        api::NamespaceMode::Container as i32
                    },
                    ipc: mode(host_ipc),
                    ..Default::default()
                }),
                // The kubelet's rule: the sandbox is privileged when any of its containers
                // (init and ephemeral ones included) is; containerd refuses a privileged
                // container in an unprivileged sandbox.
                privileged: any_privileged(pod),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
            "spec": spec,
        }))
        .expect("pod")
    }

    #[test]
    fn a_privileged_container_makes_a_privileged_sandbox() {
        let config = AgentConfig::new("n");
        let plain = pod(json!({"containers": [{"name": "c"}]}));
        let sc =
            |p: &Pod| sandbox_config(p, &config, 0).linux.and_then(|l| l.security_context).unwrap();
        assert!(!sc(&plain).privileged);
        let init = pod(json!({"containers": [{"name": "c"}],
            "initContainers": [{"name": "i", "securityContext": {"privileged": true}}]}));
        assert!(sc(&init).privileged);
        let main =
            pod(json!({"containers": [{"name": "c", "securityContext": {"privileged": true}}]}));
        assert!(sc(&main).privileged);
    }

    #[test]
    fn cluster_first_dns_with_search_paths_and_ndots() {
        let p = pod(json!({"containers": [{"name": "c"}]}));
        let dns = dns_config(&p, &AgentConfig::new("n")).expect("dns");
        assert_eq!(dns.servers, vec!["169.254.20.10"]);
        assert_eq!(
            dns.searches,
            vec!["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]
        );
        assert_eq!(dns.options, vec!["ndots:5"]);
    }

    #[test]
    fn dns_policy_none_and_default_use_dns_config() {
        let p = pod(json!({"containers": [{"name": "c"}], "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["1.2.3.4"], "searches": ["a.b"],
                          "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
        let dns = dns_config(&p, &AgentConfig::new("n")).expect("dns");
        assert_eq!(dns.servers, vec!["1.2.3.4"]);
        assert_eq!(dns.searches, vec!["a.b"]);
        assert_eq!(dns.options, vec!["ndots:2", "edns0"]);
        let p = pod(json!({"containers": [{"name": "c"}], "dnsPolicy": "Default"}));
        assert_eq!(dns_config(&p, &AgentConfig::new("n")), None, "the host's resolv.conf");
        let p = pod(json!({"containers": [{"name": "c"}],
            "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}));
        let dns = dns_config(&p, &AgentConfig::new("n")).expect("dns");
        assert_eq!(dns.options, vec!["ndots:1"], "dnsConfig options override ndots");
    }

    #[test]
    fn sandbox_config_has_labels_ports_hostname_and_log_dir() {
        let p = pod(json!({"containers": [{"name": "c", "ports": [
            {"containerPort": 80, "hostPort": 8080},
            {"containerPort": 53, "protocol": "UDP"}]}]}));
        let cfg = sandbox_config(&p, &AgentConfig::new("n").with_root_dir("/r"), 1);
        assert_eq!(cfg.hostname, "web");
        assert_eq!(cfg.log_directory, "/r/pods/shop_web_u-1");
        assert_eq!(cfg.labels[POD_UID_LABEL], "u-1");
        assert_eq!(cfg.labels[POD_NAMESPACE_LABEL], "shop");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.port_mappings.len(), 1);
        assert_eq!(cfg.port_mappings[0].host_port, 8080);
        assert_eq!(cfg.metadata.expect("meta").attempt, 1);
    }
}
