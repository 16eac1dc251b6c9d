//! The desired data-plane state computed from Service and EndpointSlice objects, with
//! kube-proxy's semantics: ready endpoints only (terminating-but-serving ones only when no
//! ready one exists), ports matched by name (so named target ports work, resolved by the
//! EndpointSlice controller), multiple ports per service, ClusterIP / NodePort / ExternalIP /
//! LoadBalancer frontends, externalTrafficPolicy and internalTrafficPolicy Local.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skiff_ebpf_common::{PROTO_TCP, PROTO_UDP, svc_flags};

/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A frontend: address (0.0.0.0 for NodePort), port, protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub proto: u8,
}

/// A backend's identity: address, port, protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub proto: u8,
}

/// A backend with its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendSpec {
    pub addr: BackendAddr,
    /// Used only because no ready endpoint exists.
    pub terminating: bool,
    /// Runs on this node.
    pub local: bool,
}

/// What one frontend should look like in the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendSpec {
    /// `namespace/name:port-name`, for people.
    pub service: String,
    /// `svc_flags::*`.
    pub flags: u16,
    /// sessionAffinity ClientIP timeout in seconds (with `svc_flags::AFFINITY`), else 0.
    pub affinity_timeout_s: u32,
    /// loadBalancerSourceRanges (address, prefix length), sorted; empty = everyone.
    pub source_ranges: Vec<(Ipv4Addr, u8)>,
    /// Backends, sorted and de-duplicated (stable slot order).
    pub backends: Vec<BackendSpec>,
}

/// A healthCheckNodePort to serve (externalTrafficPolicy Local load balancers): external
/// load balancers send traffic only to nodes answering 200.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `namespace/name`.
    pub service: String,
    /// Ready endpoints of the service on this node.
    pub local_endpoints: usize,
}

/// Everything the node should serve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub frontends: BTreeMap<Frontend, FrontendSpec>,
    /// healthCheckNodePort → what it reports.
    pub health_checks: BTreeMap<u16, HealthCheck>,
}

/// Which node this proxy runs on (for locality and traffic policies).
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    pub node_name: String,
}

fn proto_of(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(PROTO_TCP),
        "UDP" => Some(PROTO_UDP),
        _ => None, // SCTP is not served by this data plane.
    }
}

fn ipv4(s: &str) -> Option<Ipv4Addr> {
    s.parse().ok()
}

/// Computes the desired state from all Services and EndpointSlices.
pub fn compute<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &NodeContext,
) -> DesiredState {
    // (namespace, service name) → slices
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        if s.address_type != "IPv4" {
            continue;
        }
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let Some(name) = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
            continue;
        };
        by_service.entry((ns, name.clone())).or_default().push(s);
    }
    let mut out = DesiredState::default();
    for svc in services {
        add_service(&mut out, svc, &by_service, node);
    }
    out
}

fn add_service(
    out: &mut DesiredState,
    svc: &Service,
    by_service: &BTreeMap<(String, String), Vec<&EndpointSlice>>,
    node: &NodeContext,
) {
    let Some(spec) = svc.spec.as_ref() else { return };
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if ty == "ExternalName" {
        return;
    }
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let slices = by_service.get(&(ns.clone(), name.clone()));
    let etp_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let itp_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    // kube-proxy's default ClientIP timeout: 10800 s (3 h).
    let affinity_timeout_s = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(10_800)
    });
    let affinity_flag = if affinity_timeout_s.is_some() { svc_flags::AFFINITY } else { 0 };
    let source_ranges: Vec<(Ipv4Addr, u8)> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|r| {
            let (a, l) = r.trim().split_once('/').unwrap_or((r.trim(), "32"));
            let len: u8 = l.parse().ok().filter(|l| *l <= 32)?;
            Some((ipv4(a)?, len))
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let affinity_timeout_s = affinity_timeout_s.unwrap_or(0);

    let mut cluster_ips: BTreeSet<Ipv4Addr> = BTreeSet::new();
    if let Some(ip) = spec.cluster_ip.as_deref().and_then(ipv4) {
        cluster_ips.insert(ip);
    }
    for ip in spec.cluster_ips.iter().flatten().filter_map(|s| ipv4(s)) {
        cluster_ips.insert(ip);
    }
    let external: BTreeSet<Ipv4Addr> =
        spec.external_ips.iter().flatten().filter_map(|s| ipv4(s)).collect();
    let lb: BTreeSet<Ipv4Addr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(ipv4))
        .collect();

    let mut local_endpoints = 0;
    for port in spec.ports.iter().flatten() {
        let Some(proto) = proto_of(port.protocol.as_deref()) else { continue };
        let Ok(svc_port) = u16::try_from(port.port) else { continue };
        let port_name = port.name.clone().unwrap_or_default();
        let backends = backends_for(slices, &port_name, proto, node);
        local_endpoints = local_endpoints.max(backends.iter().filter(|b| b.local).count());
        let label = format!("{ns}/{name}:{port_name}");
        let local_only = |b: &[BackendSpec]| b.iter().copied().filter(|b| b.local).collect();
        let internal: Vec<BackendSpec> =
            if itp_local { local_only(&backends) } else { backends.clone() };
        let external_backends: Vec<BackendSpec> =
            if etp_local { local_only(&backends) } else { backends.clone() };
        // External traffic is spread with Maglev: every node picks the same backend for a
        // flow (consistent across nodes and resilient to backend changes).
        let ext_flag = svc_flags::MAGLEV | if etp_local { svc_flags::ETP_LOCAL } else { 0 };
        let mut put = |ip: Ipv4Addr, port: u16, flags: u16, b: &Vec<BackendSpec>| {
            // kube-proxy applies loadBalancerSourceRanges to the load balancer IPs.
            let ranges = if flags & svc_flags::LOAD_BALANCER != 0 {
                source_ranges.clone()
            } else {
                Vec::new()
            };
            let range_flag = if ranges.is_empty() { 0 } else { svc_flags::SOURCE_RANGES };
            out.frontends.insert(
                Frontend { ip, port, proto },
                FrontendSpec {
                    service: label.clone(),
                    flags: flags | affinity_flag | range_flag,
                    affinity_timeout_s,
                    source_ranges: ranges,
                    backends: b.clone(),
                },
            );
        };
        for ip in &cluster_ips {
            put(*ip, svc_port, svc_flags::CLUSTER_IP, &internal);
        }
        for ip in &external {
            put(*ip, svc_port, svc_flags::EXTERNAL_IP | ext_flag, &external_backends);
        }
        for ip in &lb {
            put(*ip, svc_port, svc_flags::LOAD_BALANCER | ext_flag, &external_backends);
        }
        if matches!(ty, "NodePort" | "LoadBalancer")
            && let Some(np) = port.node_port.and_then(|p| u16::try_from(p).ok())
        {
            put(Ipv4Addr::UNSPECIFIED, np, svc_flags::NODE_PORT | ext_flag, &external_backends);
        }
    }
    if etp_local
        && ty == "LoadBalancer"
        && let Some(hc) = spec.health_check_node_port.and_then(|p| u16::try_from(p).ok())
    {
        out.health_checks
            .insert(hc, HealthCheck { service: format!("{ns}/{name}"), local_endpoints });
    }
}

/// Backends of one service port: ready endpoints, or terminating-but-serving ones when no
/// endpoint is ready (kube-proxy's graceful termination).
fn backends_for(
    slices: Option<&Vec<&EndpointSlice>>,
    port_name: &str,
    proto: u8,
    node: &NodeContext,
) -> Vec<BackendSpec> {
    let mut ready = BTreeSet::new();
    let mut terminating = BTreeSet::new();
    for slice in slices.into_iter().flatten() {
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && proto_of(p.protocol.as_deref()) == Some(proto)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else { continue };
        for ep in &slice.endpoints {
            let c = ep.conditions.as_ref();
            // A nil "ready" means ready (API docs: "should be interpreted as true").
            let is_ready = c.and_then(|c| c.ready).unwrap_or(true);
            let is_serving = c.and_then(|c| c.serving).unwrap_or(is_ready);
            let is_terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let local = !node.node_name.is_empty()
                && ep.node_name.as_deref() == Some(node.node_name.as_str());
            for ip in ep.addresses.iter().filter_map(|a| ipv4(a)) {
                let addr = BackendAddr { ip, port, proto };
                if is_ready && !is_terminating {
                    ready.insert(BackendSpec { addr, terminating: false, local });
                } else if is_serving && is_terminating {
                    terminating.insert(BackendSpec { addr, terminating: true, local });
                }
            }
        }
    }
    if ready.is_empty() { terminating.into_iter().collect() } else { ready.into_iter().collect() }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub fn service(name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: (!n.is_empty()).then(|| n.to_string()),
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// (address, ready, serving, terminating, node)
    pub type Ep<'a> = (&'a str, Option<bool>, Option<bool>, Option<bool>, &'a str);

    pub fn slice(svc: &str, name: &str, ports: &[(&str, i32, &str)], eps: &[Ep]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
                ..Default::default()
            },
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| EndpointPort {
                        name: Some(n.to_string()),
                        port: Some(*p),
                        protocol: Some(proto.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            endpoints: eps
                .iter()
                .map(|(a, r, s, t, n)| Endpoint {
                    addresses: vec![a.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: *r,
                        serving: *s,
                        terminating: *t,
                    }),
                    node_name: (!n.is_empty()).then(|| n.to_string()),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn fe(ip: &str, port: u16, proto: u8) -> Frontend {
        Frontend { ip: ip.parse().unwrap(), port, proto }
    }

    fn ips(s: &FrontendSpec) -> Vec<String> {
        s.backends.iter().map(|b| format!("{}:{}", b.addr.ip, b.addr.port)).collect()
    }

    const R: Option<bool> = Some(true);
    const N: Option<bool> = Some(false);

    #[test]
    fn ready_endpoints_only_and_named_ports() {
        let svc = service("web", "10.96.0.10", &[("http", 80, "TCP"), ("dns", 53, "UDP")]);
        let sl = slice(
            "web",
            "web-1",
            &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
            &[
                ("10.0.1.1", R, R, N, "n1"),
                ("10.0.1.2", N, N, N, "n1"),          // not ready
                ("10.0.1.3", None, None, None, "n2"), // nil conditions = ready
            ],
        );
        let d = compute([&svc], [&sl], &NodeContext { node_name: "n1".into() });
        assert_eq!(d.frontends.len(), 2);
        let http = &d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)];
        assert_eq!(ips(http), ["10.0.1.1:8080", "10.0.1.3:8080"]);
        assert!(http.backends[0].local && !http.backends[1].local);
        assert_eq!(http.flags, svc_flags::CLUSTER_IP);
        let dns = &d.frontends[&fe("10.96.0.10", 53, PROTO_UDP)];
        assert_eq!(ips(dns), ["10.0.1.1:5353", "10.0.1.3:5353"]);
    }

    #[test]
    fn terminating_endpoints_only_without_ready_ones() {
        let svc = service("web", "10.96.0.10", &[("", 80, "TCP")]);
        let eps = [("10.0.1.1", N, R, R, ""), ("10.0.1.2", N, N, R, "")];
        let sl = slice("web", "web-1", &[("", 8080, "TCP")], &eps);
        let d = compute([&svc], [&sl], &NodeContext::default());
        let f = &d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)];
        assert_eq!(ips(f), ["10.0.1.1:8080"], "serving terminating endpoint used as fallback");
        assert!(f.backends[0].terminating);
        // With a ready endpoint in another slice, the terminating one is not used.
        let sl2 = slice("web", "web-2", &[("", 8080, "TCP")], &[("10.0.2.1", R, R, N, "")]);
        let d = compute([&svc], [&sl, &sl2], &NodeContext::default());
        assert_eq!(ips(&d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)]), ["10.0.2.1:8080"]);
    }

    #[test]
    fn no_endpoints_keeps_the_frontend_with_zero_backends() {
        let svc = service("web", "10.96.0.10", &[("", 80, "TCP")]);
        let d = compute([&svc], [], &NodeContext::default());
        assert!(d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)].backends.is_empty());
    }

    #[test]
    fn headless_external_name_and_foreign_slices_are_ignored() {
        let mut headless = service("h", "None", &[("", 80, "TCP")]);
        let mut ext = service("e", "10.96.0.9", &[("", 80, "TCP")]);
        ext.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        headless.metadata.name = Some("h".into());
        let other = slice("someone-else", "x", &[("", 8080, "TCP")], &[("10.0.0.1", R, R, N, "")]);
        let d = compute([&headless, &ext], [&other], &NodeContext::default());
        assert!(d.frontends.is_empty());
    }

    #[test]
    fn nodeport_loadbalancer_external_ips_and_etp_local() {
        let mut svc = service("web", "10.96.0.10", &[("", 80, "TCP")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.type_ = Some("LoadBalancer".into());
        spec.ports.as_mut().unwrap()[0].node_port = Some(30080);
        spec.external_ips = Some(vec!["192.0.2.10".into()]);
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into(), "bogus".into()]);
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("198.51.100.7".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        let eps = [("10.0.1.1", R, R, N, "n1"), ("10.0.2.1", R, R, N, "n2")];
        let sl = slice("web", "web-1", &[("", 8080, "TCP")], &eps);
        let d = compute([&svc], [&sl], &NodeContext { node_name: "n1".into() });
        assert_eq!(d.frontends.len(), 4);
        let cluster = &d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)];
        assert_eq!(cluster.backends.len(), 2, "eTP does not restrict in-cluster traffic");
        for f in [
            fe("0.0.0.0", 30080, PROTO_TCP),
            fe("192.0.2.10", 80, PROTO_TCP),
            fe("198.51.100.7", 80, PROTO_TCP),
        ] {
            let s = &d.frontends[&f];
            assert_eq!(ips(s), ["10.0.1.1:8080"], "eTP Local keeps only local backends for {f:?}");
            assert_ne!(s.flags & svc_flags::ETP_LOCAL, 0);
        }
        let lbf = &d.frontends[&fe("198.51.100.7", 80, PROTO_TCP)];
        assert_eq!(lbf.source_ranges, [("203.0.113.0".parse().unwrap(), 24)]);
        assert_ne!(lbf.flags & svc_flags::SOURCE_RANGES, 0);
        assert!(d.frontends[&fe("0.0.0.0", 30080, PROTO_TCP)].source_ranges.is_empty());
        let hc = &d.health_checks[&32000];
        assert_eq!((hc.service.as_str(), hc.local_endpoints), ("default/web", 1));
    }

    #[test]
    fn session_affinity_client_ip_with_timeout() {
        use k8s_openapi::api::core::v1::{ClientIPConfig, SessionAffinityConfig};
        let mut svc = service("web", "10.96.0.10", &[("", 80, "TCP")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        let d = compute([&svc], [], &NodeContext::default());
        let f = &d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)];
        assert_ne!(f.flags & svc_flags::AFFINITY, 0);
        assert_eq!(f.affinity_timeout_s, 10_800, "kube-proxy's default");
        svc.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig { timeout_seconds: Some(60) }),
        });
        let d = compute([&svc], [], &NodeContext::default());
        assert_eq!(d.frontends[&fe("10.96.0.10", 80, PROTO_TCP)].affinity_timeout_s, 60);
    }
}
