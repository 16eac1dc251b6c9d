//! Record synthesis, pure: the DNS records of one Service (with its EndpointSlices and the
//! pods they point at) or one Pod, as the Kubernetes DNS specification
//! (kubernetes/dns `docs/specification.md`) lays them out. No I/O, no clock, no TTLs.
//!
//! The Kubernetes objects are first reduced to the few fields DNS needs ([`ServiceInfo`],
//! [`SliceInfo`], [`PodInfo`]): the watch cache keeps only these, which bounds its memory.

use std::collections::HashSet;
use std::net::IpAddr;

use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SRV};
use hickory_proto::rr::{Name, RData};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label an EndpointSlice carries naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One synthesized record: owner name and data (the TTL is the server's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rr {
    pub name: Name,
    pub data: RData,
}

/// A Service port as DNS needs it (only named ports get SRV records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub name: String,
    /// Lower case: `tcp`, `udp`, `sctp`.
    pub protocol: String,
    pub port: u16,
}

impl PortInfo {
    /// A Service's or a slice's port, `None` unless it is named and its number fits; the
    /// protocol defaults to TCP, as in the API.
    fn named(name: Option<&str>, protocol: Option<&str>, port: Option<i32>) -> Option<Self> {
        Some(PortInfo {
            name: name.filter(|n| !n.is_empty())?.to_string(),
            protocol: protocol.unwrap_or("TCP").to_ascii_lowercase(),
            port: u16::try_from(port?).ok()?,
        })
    }
}

/// What DNS needs from a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    /// `spec.clusterIPs` (or `clusterIP`); empty when headless or ExternalName.
    pub cluster_ips: Vec<IpAddr>,
    /// `clusterIP: None`: names resolve to the ready endpoints.
    pub headless: bool,
    /// `type: ExternalName`: the name is a CNAME to this.
    pub external_name: Option<String>,
    pub ports: Vec<PortInfo>,
}

impl ServiceInfo {
    pub fn from_service(svc: &Service) -> Option<Self> {
        let namespace = svc.metadata.namespace.clone()?;
        let name = svc.metadata.name.clone()?;
        let spec = svc.spec.as_ref()?;
        let external_name = match spec.type_.as_deref() {
            Some("ExternalName") => spec.external_name.clone().filter(|n| !n.is_empty()),
            _ => None,
        };
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let mut cluster_ips: Vec<IpAddr> = Vec::new();
        if external_name.is_none() && !headless {
            let ips = spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter());
            for ip in ips.filter_map(|s| s.parse::<IpAddr>().ok()) {
                if !cluster_ips.contains(&ip) {
                    cluster_ips.push(ip);
                }
            }
        }
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| PortInfo::named(p.name.as_deref(), p.protocol.as_deref(), Some(p.port)))
            .collect();
        Some(ServiceInfo { namespace, name, cluster_ips, headless, external_name, ports })
    }
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    pub addresses: Vec<IpAddr>,
    /// `endpoint.hostname` as the endpoints controller set it.
    pub hostname: Option<String>,
    /// `conditions.ready`; unset means ready (the API's documented reading).
    pub ready: bool,
    /// Name of the Pod in `targetRef` (same namespace), for hostname/subdomain lookups.
    pub pod: Option<String>,
}

/// What DNS needs from an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub namespace: String,
    pub name: String,
    /// The Service this slice belongs to (label `kubernetes.io/service-name`).
    pub service: String,
    /// Named ports of the slice (the endpoint's port numbers, not the Service's).
    pub ports: Vec<PortInfo>,
    pub endpoints: Vec<EndpointInfo>,
}

impl SliceInfo {
    /// `None` for slices without a service-name label and for FQDN slices.
    pub fn from_slice(slice: &EndpointSlice) -> Option<Self> {
        let namespace = slice.metadata.namespace.clone()?;
        let name = slice.metadata.name.clone()?;
        let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            return None;
        }
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| PortInfo::named(p.name.as_deref(), p.protocol.as_deref(), p.port))
            .collect();
        let endpoints = slice
            .endpoints
            .iter()
            .map(|ep| EndpointInfo {
                addresses: ep.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                hostname: ep.hostname.clone().filter(|h| !h.is_empty()),
                ready: ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                pod: ep
                    .target_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .filter(|r| r.namespace.as_deref().is_none_or(|ns| ns == namespace))
                    .and_then(|r| r.name.clone()),
            })
            .collect();
        Some(SliceInfo { namespace, name, service, ports, endpoints })
    }
}

/// What DNS needs from a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// Pod IPs while the pod holds them: empty for host-network pods (their IP is the
    /// node's) and for finished pods (their IP is released).
    pub ips: Vec<IpAddr>,
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let namespace = pod.metadata.namespace.clone()?;
        let name = pod.metadata.name.clone()?;
        let spec = pod.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let status = pod.status.as_ref();
        let finished =
            matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"));
        let mut ips: Vec<IpAddr> = Vec::new();
        if !host_network && !finished {
            let all = status.into_iter().flat_map(|s| {
                s.pod_ips.iter().flatten().map(|p| p.ip.as_str()).chain(s.pod_ip.as_deref())
            });
            for ip in all.filter_map(|s| s.parse::<IpAddr>().ok()) {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        Some(PodInfo {
            namespace,
            name,
            hostname: spec.and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty()),
            subdomain: spec.and_then(|s| s.subdomain.clone()).filter(|h| !h.is_empty()),
            ips,
        })
    }
}

/// `a.b.c.d` → `a-b-c-d`; IPv6 `fd00::1` → `fd00--1` (the spec's and CoreDNS's form).
pub fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The reverse-lookup name of `ip` (`d.c.b.a.in-addr.arpa.`, nibbles in `ip6.arpa.`).
pub fn reverse_name(ip: IpAddr) -> Name {
    let text = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", byte & 0xf, byte >> 4));
            }
            s.push_str("ip6.arpa.");
            s
        }
    };
    // Built from digits and fixed labels only: always a valid name.
    Name::from_ascii(text).unwrap_or_else(|_| Name::root())
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// Prepends `labels` (leftmost first) to `base`; `None` when a label is not a valid DNS
/// label (objects are validated by the apiserver, so only odd data gets here).
fn child(base: &Name, labels: &[&str]) -> Option<Name> {
    let mut name = base.clone();
    for label in labels.iter().rev() {
        name = name.prepend_label(*label).ok()?;
    }
    Some(name)
}

/// `<svc>.<ns>.svc.<zone>.`
pub fn service_name(zone: &Name, namespace: &str, service: &str) -> Option<Name> {
    child(zone, &[service, namespace, "svc"])
}

/// `<dashed-ip>.<ns>.pod.<zone>.`
pub fn pod_name(zone: &Name, namespace: &str, ip: IpAddr) -> Option<Name> {
    child(zone, &[&dashed(ip), namespace, "pod"])
}

/// The records of one Service: A/AAAA (ClusterIPs, or each ready endpoint when headless),
/// per-endpoint A/AAAA under the service name for headless services (the endpoint's
/// hostname, else the pod's hostname when its subdomain is this service, else the dashed
/// IP), SRV for named ports, PTR for ClusterIPs and headless endpoint IPs, CNAME for
/// ExternalName.
pub fn service_records<'p>(
    zone: &Name,
    svc: &ServiceInfo,
    slices: &[&SliceInfo],
    pod: &dyn Fn(&str) -> Option<&'p PodInfo>,
) -> Vec<Rr> {
    let mut out = Vec::new();
    let Some(fqdn) = service_name(zone, &svc.namespace, &svc.name) else {
        return out;
    };
    if let Some(external) = &svc.external_name {
        if let Ok(mut target) = Name::from_ascii(external) {
            target.set_fqdn(true);
            out.push(Rr { name: fqdn, data: RData::CNAME(CNAME(target)) });
        }
        return out;
    }
    if !svc.headless {
        for ip in &svc.cluster_ips {
            out.push(Rr { name: fqdn.clone(), data: address(*ip) });
            out.push(Rr { name: reverse_name(*ip), data: RData::PTR(PTR(fqdn.clone())) });
        }
        for port in &svc.ports {
            if let Some(srv) =
                child(&fqdn, &[&format!("_{}", port.name), &format!("_{}", port.protocol)])
            {
                out.push(Rr {
                    name: srv,
                    data: RData::SRV(SRV::new(0, 100, port.port, fqdn.clone())),
                });
            }
        }
        return out;
    }
    // Headless: one name per ready endpoint address, deduplicated across slices.
    let mut seen: HashSet<IpAddr> = HashSet::new();
    let mut srv_hosts: HashSet<String> = HashSet::new();
    for slice in slices.iter().filter(|s| s.namespace == svc.namespace && s.service == svc.name) {
        for ep in slice.endpoints.iter().filter(|e| e.ready) {
            let hostname = ep.hostname.clone().or_else(|| {
                let p = pod(ep.pod.as_deref()?)?;
                (p.subdomain.as_deref() == Some(svc.name.as_str())).then(|| p.hostname.clone())?
            });
            for ip in &ep.addresses {
                if !seen.insert(*ip) {
                    continue;
                }
                let label = hostname.clone().unwrap_or_else(|| dashed(*ip));
                let Some(host) = child(&fqdn, &[&label]) else { continue };
                out.push(Rr { name: fqdn.clone(), data: address(*ip) });
                out.push(Rr { name: host.clone(), data: address(*ip) });
                out.push(Rr { name: reverse_name(*ip), data: RData::PTR(PTR(host.clone())) });
                // A dual-stack endpoint is one SRV target per port, not one per address.
                if !srv_hosts.insert(label) {
                    continue;
                }
                for port in &slice.ports {
                    let Some(srv) =
                        child(&fqdn, &[&format!("_{}", port.name), &format!("_{}", port.protocol)])
                    else {
                        continue;
                    };
                    out.push(Rr {
                        name: srv,
                        data: RData::SRV(SRV::new(0, 100, port.port, host.clone())),
                    });
                }
            }
        }
    }
    out
}

/// The records of one Pod: `<dashed-ip>.<ns>.pod.<zone>` A/AAAA and the reverse PTR to it.
pub fn pod_records(zone: &Name, pod: &PodInfo) -> Vec<Rr> {
    let mut out = Vec::new();
    for ip in &pod.ips {
        let Some(name) = pod_name(zone, &pod.namespace, *ip) else { continue };
        out.push(Rr { name: name.clone(), data: address(*ip) });
        out.push(Rr { name: reverse_name(*ip), data: RData::PTR(PTR(name)) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus, ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn zone() -> Name {
        Name::from_ascii("cluster.local.").unwrap()
    }

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta { namespace: Some(ns.into()), name: Some(name.into()), ..Default::default() }
    }

    fn svc(cluster_ip: &str, ports: &[(&str, &str, i32)]) -> Service {
        Service {
            metadata: meta("shop", "web"),
            spec: Some(ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                cluster_ips: (cluster_ip != "None").then(|| vec![cluster_ip.into()]),
                ports: Some(
                    ports
                        .iter()
                        .map(|(name, proto, port)| ServicePort {
                            name: Some(name.to_string()),
                            protocol: Some(proto.to_string()),
                            port: *port,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(eps: Vec<Endpoint>) -> EndpointSlice {
        let mut m = meta("shop", "web-abc");
        m.labels = Some(BTreeMap::from([(SERVICE_NAME_LABEL.into(), "web".into())]));
        EndpointSlice {
            metadata: m,
            address_type: "IPv4".into(),
            endpoints: eps,
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(8080),
                app_protocol: None,
            }]),
        }
    }

    fn ep(ip: &str, ready: Option<bool>, hostname: Option<&str>, pod: Option<&str>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions { ready, ..Default::default() }),
            hostname: hostname.map(Into::into),
            target_ref: pod.map(|p| k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("shop".into()),
                name: Some(p.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn no_pods(_: &str) -> Option<&'static PodInfo> {
        None
    }

    fn has(records: &[Rr], name: &str, data: RData) -> bool {
        records.iter().any(|r| r.name == n(name) && r.data == data)
    }

    #[test]
    fn cluster_ip_service_gets_a_srv_and_ptr() {
        let info =
            ServiceInfo::from_service(&svc("10.96.0.10", &[("http", "TCP", 80), ("", "UDP", 53)]))
                .unwrap();
        let rs = service_records(&zone(), &info, &[], &no_pods);
        let fqdn = n("web.shop.svc.cluster.local.");
        assert!(has(
            &rs,
            "web.shop.svc.cluster.local.",
            RData::A(A("10.96.0.10".parse().unwrap()))
        ));
        assert!(has(&rs, "10.0.96.10.in-addr.arpa.", RData::PTR(PTR(fqdn.clone())),));
        assert!(has(
            &rs,
            "_http._tcp.web.shop.svc.cluster.local.",
            RData::SRV(SRV::new(0, 100, 80, fqdn))
        ));
        // The unnamed port gets no SRV record.
        assert_eq!(rs.iter().filter(|r| matches!(r.data, RData::SRV(_))).count(), 1, "{rs:?}");
        assert_eq!(rs.len(), 3, "{rs:?}");
    }

    #[test]
    fn dual_stack_service_gets_aaaa_and_ip6_ptr() {
        let mut s = svc("10.96.0.10", &[]);
        s.spec.as_mut().unwrap().cluster_ips = Some(vec!["10.96.0.10".into(), "fd00::a".into()]);
        let info = ServiceInfo::from_service(&s).unwrap();
        let rs = service_records(&zone(), &info, &[], &no_pods);
        assert!(has(
            &rs,
            "web.shop.svc.cluster.local.",
            RData::AAAA(AAAA("fd00::a".parse().unwrap()))
        ));
        let rev = reverse_name("fd00::a".parse().unwrap());
        assert_eq!(
            rev.to_ascii(),
            "a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa."
        );
        assert!(rs.iter().any(|r| r.name == rev));
    }

    #[test]
    fn headless_service_lists_ready_endpoints_with_hostnames_and_srv_targets() {
        let info = ServiceInfo::from_service(&svc("None", &[("http", "TCP", 80)])).unwrap();
        let sl = SliceInfo::from_slice(&slice(vec![
            ep("10.244.1.5", Some(true), Some("web-0"), None),
            ep("10.244.1.6", None, None, None),
            ep("10.244.1.7", Some(false), None, None),
        ]))
        .unwrap();
        let rs = service_records(&zone(), &info, &[&sl], &no_pods);
        let a = |ip: &str| RData::A(A(ip.parse().unwrap()));
        assert!(has(&rs, "web.shop.svc.cluster.local.", a("10.244.1.5")));
        assert!(has(&rs, "web.shop.svc.cluster.local.", a("10.244.1.6")));
        assert!(
            !rs.iter().any(|r| r.data == a("10.244.1.7")),
            "not-ready endpoint published: {rs:?}"
        );
        assert!(has(&rs, "web-0.web.shop.svc.cluster.local.", a("10.244.1.5")));
        assert!(has(&rs, "10-244-1-6.web.shop.svc.cluster.local.", a("10.244.1.6")));
        let srv = |target: &str| RData::SRV(SRV::new(0, 100, 8080, n(target)));
        assert!(has(
            &rs,
            "_http._tcp.web.shop.svc.cluster.local.",
            srv("web-0.web.shop.svc.cluster.local.")
        ));
        assert!(has(
            &rs,
            "_http._tcp.web.shop.svc.cluster.local.",
            srv("10-244-1-6.web.shop.svc.cluster.local.")
        ));
        assert!(has(
            &rs,
            "5.1.244.10.in-addr.arpa.",
            RData::PTR(PTR(n("web-0.web.shop.svc.cluster.local.")))
        ));
    }

    #[test]
    fn pod_hostname_and_subdomain_name_the_endpoint() {
        let info = ServiceInfo::from_service(&svc("None", &[])).unwrap();
        let sl = SliceInfo::from_slice(&slice(vec![
            ep("10.244.2.9", Some(true), None, Some("db-pod")),
            ep("10.244.2.10", Some(true), None, Some("other-pod")),
        ]))
        .unwrap();
        let pod = PodInfo::from_pod(&Pod {
            metadata: meta("shop", "db-pod"),
            spec: Some(PodSpec {
                hostname: Some("primary".into()),
                subdomain: Some("web".into()),
                ..Default::default()
            }),
            status: Some(PodStatus { pod_ip: Some("10.244.2.9".into()), ..Default::default() }),
        })
        .unwrap();
        let other = PodInfo {
            name: "other-pod".into(),
            subdomain: Some("elsewhere".into()),
            hostname: Some("x".into()),
            ..pod.clone()
        };
        let lookup = |name: &str| [&pod, &other].into_iter().find(|p| p.name == name);
        let rs = service_records(&zone(), &info, &[&sl], &lookup);
        assert!(has(
            &rs,
            "primary.web.shop.svc.cluster.local.",
            RData::A(A("10.244.2.9".parse().unwrap()))
        ));
        // A pod whose subdomain names another service keeps the dashed name here.
        assert!(has(
            &rs,
            "10-244-2-10.web.shop.svc.cluster.local.",
            RData::A(A("10.244.2.10".parse().unwrap()))
        ));
        assert!(!rs.iter().any(|r| r.name == n("x.web.shop.svc.cluster.local.")));
    }

    #[test]
    fn external_name_is_a_cname() {
        let mut s = svc("", &[]);
        let spec = s.spec.as_mut().unwrap();
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("db.example.org".into());
        spec.cluster_ip = None;
        spec.cluster_ips = None;
        let info = ServiceInfo::from_service(&s).unwrap();
        let rs = service_records(&zone(), &info, &[], &no_pods);
        assert_eq!(
            rs,
            vec![Rr {
                name: n("web.shop.svc.cluster.local."),
                data: RData::CNAME(CNAME(n("db.example.org.")))
            }]
        );
    }

    #[test]
    fn pods_get_dashed_a_and_ptr_but_not_host_network_or_finished_ones() {
        let mut pod = Pod {
            metadata: meta("shop", "p"),
            spec: Some(PodSpec::default()),
            status: Some(PodStatus { pod_ip: Some("10.244.3.4".into()), ..Default::default() }),
        };
        let rs = pod_records(&zone(), &PodInfo::from_pod(&pod).unwrap());
        assert!(has(
            &rs,
            "10-244-3-4.shop.pod.cluster.local.",
            RData::A(A("10.244.3.4".parse().unwrap()))
        ));
        assert!(has(
            &rs,
            "4.3.244.10.in-addr.arpa.",
            RData::PTR(PTR(n("10-244-3-4.shop.pod.cluster.local.")))
        ));
        pod.spec.as_mut().unwrap().host_network = Some(true);
        assert!(pod_records(&zone(), &PodInfo::from_pod(&pod).unwrap()).is_empty());
        pod.spec.as_mut().unwrap().host_network = None;
        pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(pod_records(&zone(), &PodInfo::from_pod(&pod).unwrap()).is_empty());
    }

    #[test]
    fn slices_without_service_label_or_with_fqdn_addresses_are_ignored() {
        let mut s = slice(vec![]);
        s.address_type = "FQDN".into();
        assert!(SliceInfo::from_slice(&s).is_none());
        let mut s = slice(vec![]);
        s.metadata.labels = None;
        assert!(SliceInfo::from_slice(&s).is_none());
    }
}
