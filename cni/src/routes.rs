//! Routes between nodes: from the nodes' pod CIDRs and internal IPs, the routes this node
//! needs (host-gw through the other node's IP on a shared L2 segment, a VXLAN overlay
//! otherwise), `unreachable` routes for the cluster and service CIDRs beneath them, and
//! their application with rtnetlink (stale routes removed).
//!
//! The core is pure: [`desired_routes`] turns a [`RouteConfig`] and a list of
//! [`NodeRoute`]s into a [`RoutePlan`]; [`apply`] makes the kernel match it. The agent calls
//! both on every Node watch event (level-triggered: the whole list each time).
//! Kubernetes types stay out of the core; [`NodeRoute::from_node`] is the adapter.
//!
//! Every route skiff installs carries protocol [`ROUTE_PROTOCOL`], which is how `apply`
//! recognises its own routes (and never touches anyone else's).
//!
//! VXLAN layout (flannel's, without its annotations): one device [`VxlanConfig::device`]
//! per node, with a MAC derived from the node IP ([`vtep_mac`]) and the first address of the
//! node's pod CIDR as a /32; for each remote node a route `podCIDR via <its first address>
//! onlink`, a permanent neighbour entry for that address with the remote's derived MAC, and
//! an FDB entry sending that MAC to the remote node IP. No learning, no flooding.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use ipnetwork::Ipv4Network;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType,
};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use crate::pod;

/// Routing protocol number marking skiff's routes (`ip route show proto 83`).
pub const ROUTE_PROTOCOL: u8 = 83;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("netlink: {step}")]
    Netlink {
        step: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("looking up a link")]
    Link(#[source] pod::Error),
    #[error("VXLAN device {0} not found after creating it")]
    VxlanVanished(String),
}

fn nl(step: &'static str) -> impl FnOnce(rtnetlink::Error) -> Error {
    move |source| Error::Netlink { step, source }
}

/// What routing needs to know about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoute {
    pub name: String,
    pub pod_cidr: Ipv4Network,
    pub internal_ip: Ipv4Addr,
}

impl NodeRoute {
    /// Adapter from a Kubernetes Node: `spec.podCIDR` and the `InternalIP` address.
    /// `None` while the node has no (IPv4) pod CIDR or internal IP yet.
    pub fn from_node(node: &k8s_openapi::api::core::v1::Node) -> Option<Self> {
        let name = node.metadata.name.clone()?;
        let pod_cidr = node.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()?;
        let internal_ip = node
            .status
            .as_ref()?
            .addresses
            .as_ref()?
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse().ok())?;
        Some(Self { name, pod_cidr, internal_ip })
    }
}

/// How traffic to other nodes' pods travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Route each pod CIDR via the node's IP (all nodes on one L2 segment).
    HostGw,
    /// Encapsulate to every node.
    Vxlan,
    /// Host-gw for nodes whose internal IP is inside `node_subnet` (the local L2 segment),
    /// VXLAN for the others.
    Auto { node_subnet: Ipv4Network },
}

/// The VXLAN device's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    /// Device name (default `skiff.vxlan`).
    pub device: String,
    /// VNI (default 1, flannel's).
    pub vni: u32,
    /// UDP port (default 8472, the Linux kernel's and flannel's, not IANA's 4789, so it
    /// does not collide with a host's own VXLAN).
    pub port: u16,
    /// Device MTU (default 1450: 1500 minus the 50 bytes of VXLAN over IPv4). The CNI
    /// config's `mtu` must not exceed it in VXLAN mode.
    pub mtu: u32,
}

impl Default for VxlanConfig {
    fn default() -> Self {
        Self { device: "skiff.vxlan".into(), vni: 1, port: 8472, mtu: 1450 }
    }
}

/// Routing configuration of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// This node's name (its own entry gets no route).
    pub local_node: String,
    /// The whole pod network: an `unreachable` route covers it.
    pub cluster_cidr: Ipv4Network,
    /// The service network: an `unreachable` route covers it (the eBPF proxy translates
    /// service addresses before routing; anything left over must not leave the node).
    pub service_cidr: Ipv4Network,
    pub mode: Mode,
    pub vxlan: VxlanConfig,
}

impl RouteConfig {
    /// Host-gw with the kubeadm/kind defaults (cluster 10.244.0.0/16, services 10.96.0.0/12).
    pub fn new(local_node: impl Into<String>) -> Self {
        Self {
            local_node: local_node.into(),
            cluster_cidr: Ipv4Network::new(Ipv4Addr::new(10, 244, 0, 0), 16)
                .unwrap_or_else(|_| Ipv4Network::from(Ipv4Addr::UNSPECIFIED)),
            service_cidr: Ipv4Network::new(Ipv4Addr::new(10, 96, 0, 0), 12)
                .unwrap_or_else(|_| Ipv4Network::from(Ipv4Addr::UNSPECIFIED)),
            mode: Mode::HostGw,
            vxlan: VxlanConfig::default(),
        }
    }

    pub fn cluster_cidr(mut self, cidr: Ipv4Network) -> Self {
        self.cluster_cidr = cidr;
        self
    }

    pub fn service_cidr(mut self, cidr: Ipv4Network) -> Self {
        self.service_cidr = cidr;
        self
    }

    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    pub fn vxlan(mut self, vxlan: VxlanConfig) -> Self {
        self.vxlan = vxlan;
        self
    }
}

/// One route of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteKind {
    /// `dst via gateway` (host-gw).
    Via { gateway: Ipv4Addr },
    /// `dst via gateway dev <vxlan> onlink`, with neighbour `gateway -> vtep_mac` and FDB
    /// `vtep_mac -> remote`.
    Vxlan { gateway: Ipv4Addr, vtep_mac: [u8; 6], remote: Ipv4Addr },
    /// `unreachable dst`.
    Unreachable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredRoute {
    pub dst: Ipv4Network,
    pub kind: RouteKind,
    /// The node this route leads to (empty for `unreachable`).
    pub node: String,
}

/// The local VXLAN device, when any node is reached over VXLAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanDevice {
    pub config: VxlanConfig,
    pub local_ip: Ipv4Addr,
    pub mac: [u8; 6],
    /// The device's own address: the first address of the local pod CIDR.
    pub address: Ipv4Addr,
}

/// Everything [`apply`] makes true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePlan {
    pub routes: Vec<DesiredRoute>,
    pub vxlan: Option<VxlanDevice>,
    /// The VXLAN device's name, to remove it when `vxlan` is `None`.
    pub vxlan_name: String,
}

/// The VTEP MAC of a node: locally administered, unicast, derived from its IP so nodes
/// need not publish it.
pub fn vtep_mac(node_ip: Ipv4Addr) -> [u8; 6] {
    let o = node_ip.octets();
    [0x0e, 0x5c, o[0], o[1], o[2], o[3]]
}

/// The routes this node needs to reach every other node's pods. Nodes without a pod CIDR
/// are left out by the adapter; the local node and nodes whose pod CIDR collides with the
/// local one (a misconfiguration) get no route.
pub fn desired_routes(cfg: &RouteConfig, nodes: &[NodeRoute]) -> RoutePlan {
    let local = nodes.iter().find(|n| n.name == cfg.local_node);
    let mut routes = Vec::new();
    let mut vxlan_needed = false;
    let mut seen = BTreeSet::new();
    let mut sorted: Vec<&NodeRoute> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for n in sorted {
        if n.name == cfg.local_node || local.is_some_and(|l| l.pod_cidr == n.pod_cidr) {
            continue;
        }
        if !seen.insert(n.pod_cidr) {
            continue; // two nodes claim one CIDR: the first by name wins, deterministically
        }
        let vxlan = match &cfg.mode {
            Mode::HostGw => false,
            Mode::Vxlan => true,
            Mode::Auto { node_subnet } => !node_subnet.contains(n.internal_ip),
        };
        let kind = if vxlan {
            vxlan_needed = true;
            RouteKind::Vxlan {
                gateway: n.pod_cidr.network(),
                vtep_mac: vtep_mac(n.internal_ip),
                remote: n.internal_ip,
            }
        } else {
            RouteKind::Via { gateway: n.internal_ip }
        };
        routes.push(DesiredRoute { dst: n.pod_cidr, kind, node: n.name.clone() });
    }
    for dst in [cfg.cluster_cidr, cfg.service_cidr] {
        routes.push(DesiredRoute { dst, kind: RouteKind::Unreachable, node: String::new() });
    }
    let vxlan = match local {
        Some(l) if vxlan_needed => Some(VxlanDevice {
            config: cfg.vxlan.clone(),
            local_ip: l.internal_ip,
            mac: vtep_mac(l.internal_ip),
            address: l.pod_cidr.network(),
        }),
        _ => None,
    };
    if vxlan_needed && vxlan.is_none() {
        // Without the local node's own entry there is no VTEP: leave VXLAN routes out
        // rather than install routes into a device that cannot exist.
        routes.retain(|r| !matches!(r.kind, RouteKind::Vxlan { .. }));
    }
    RoutePlan { routes, vxlan, vxlan_name: cfg.vxlan.device.clone() }
}

/// What [`apply`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub installed: usize,
    pub removed: Vec<Ipv4Network>,
}

fn route_dst(r: &RouteMessage) -> Option<Ipv4Network> {
    let ip = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    });
    let ip = match (ip, r.header.destination_prefix_length) {
        (Some(ip), _) => ip,
        (None, 0) => Ipv4Addr::UNSPECIFIED,
        (None, _) => return None,
    };
    Ipv4Network::new(ip, r.header.destination_prefix_length).ok()
}

async fn our_routes(h: &Handle) -> Result<Vec<RouteMessage>> {
    let all: Vec<RouteMessage> = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing routes"))?;
    Ok(all
        .into_iter()
        .filter(|r| {
            r.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
                && r.header.table == RouteHeader::RT_TABLE_MAIN
        })
        .collect())
}

async fn ensure_vxlan(h: &Handle, dev: &VxlanDevice) -> Result<u32> {
    let c = &dev.config;
    if pod::get_link(h, &c.device).await.map_err(Error::Link)?.is_none() {
        h.link()
            .add(
                LinkVxlan::new(&c.device, c.vni)
                    .local(dev.local_ip)
                    .port(c.port)
                    .learning(false)
                    .mtu(c.mtu)
                    .address(dev.mac.to_vec())
                    .build(),
            )
            .execute()
            .await
            .map_err(nl("creating the VXLAN device"))?;
    }
    let link = pod::get_link(h, &c.device)
        .await
        .map_err(Error::Link)?
        .ok_or_else(|| Error::VxlanVanished(c.device.clone()))?;
    let idx = link.header.index;
    h.link()
        .set(LinkUnspec::new_with_index(idx).up().build())
        .execute()
        .await
        .map_err(nl("setting the VXLAN device up"))?;
    let mut add = h.address().add(idx, IpAddr::V4(dev.address), 32).replace();
    add.message_mut().header.scope = rtnetlink::packet_route::address::AddressScope::Universe;
    add.execute().await.map_err(nl("addressing the VXLAN device"))?;
    Ok(idx)
}

/// Makes the kernel's main table match `plan`: installs (replaces) every planned route,
/// creates the VXLAN device with its neighbour and FDB entries when needed, deletes
/// skiff's routes that are no longer planned, and the VXLAN device when no longer needed.
/// Idempotent.
#[tracing::instrument(skip_all, fields(routes = plan.routes.len(), vxlan = plan.vxlan.is_some()))]
pub async fn apply(h: &Handle, plan: &RoutePlan) -> Result<ApplyReport> {
    let mut report = ApplyReport::default();
    let vxlan_idx = match &plan.vxlan {
        Some(dev) => Some(ensure_vxlan(h, dev).await?),
        None => None,
    };
    for r in &plan.routes {
        let b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(r.dst.network(), r.dst.prefix())
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
        let msg = match (&r.kind, vxlan_idx) {
            (RouteKind::Via { gateway }, _) => b.gateway(*gateway).build(),
            (RouteKind::Unreachable, _) => b.kind(RouteType::Unreachable).build(),
            (RouteKind::Vxlan { gateway, vtep_mac, remote }, Some(idx)) => {
                h.neighbours()
                    .add(idx, IpAddr::V4(*gateway))
                    .link_layer_address(vtep_mac)
                    .state(NeighbourState::Permanent)
                    .replace()
                    .execute()
                    .await
                    .map_err(nl("adding a VTEP neighbour"))?;
                h.neighbours()
                    .add_bridge(idx, vtep_mac)
                    .destination(IpAddr::V4(*remote))
                    .flags(NeighbourFlags::Own)
                    .replace()
                    .execute()
                    .await
                    .map_err(nl("adding a VTEP FDB entry"))?;
                b.gateway(*gateway).output_interface(idx).onlink().build()
            }
            (RouteKind::Vxlan { .. }, None) => continue,
        };
        h.route().add(msg).replace().execute().await.map_err(nl("installing a route"))?;
        report.installed += 1;
    }
    let wanted: BTreeSet<Ipv4Network> = plan.routes.iter().map(|r| r.dst).collect();
    for r in our_routes(h).await? {
        let Some(dst) = route_dst(&r) else { continue };
        if !wanted.contains(&dst) {
            h.route().del(r).execute().await.map_err(nl("removing a stale route"))?;
            report.removed.push(dst);
        }
    }
    if !report.removed.is_empty() {
        tracing::info!(removed = ?report.removed, "removed stale routes");
    }
    if let Some(idx) = vxlan_idx {
        remove_stale_vteps(h, idx, plan).await?;
    } else {
        pod::delete_link(h, &plan.vxlan_name).await.map_err(Error::Link)?;
    }
    Ok(report)
}

/// Deletes neighbour and FDB entries on the VXLAN device for nodes no longer planned.
async fn remove_stale_vteps(h: &Handle, idx: u32, plan: &RoutePlan) -> Result<()> {
    let mut want_neigh = BTreeMap::new();
    let mut want_fdb = BTreeSet::new();
    for r in &plan.routes {
        if let RouteKind::Vxlan { gateway, vtep_mac, .. } = r.kind {
            want_neigh.insert(gateway, vtep_mac);
            want_fdb.insert(vtep_mac.to_vec());
        }
    }
    let neighbours: Vec<_> = h
        .neighbours()
        .get()
        .set_address_family(AddressFamily::Unspec)
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing neighbours"))?;
    for n in neighbours {
        if n.header.ifindex != idx || n.header.state != NeighbourState::Permanent {
            continue;
        }
        let stale = match n.header.family {
            AddressFamily::Inet => n.attributes.iter().any(|a| {
                matches!(a, NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) if !want_neigh.contains_key(ip))
            }),
            AddressFamily::Bridge => n.attributes.iter().any(|a| {
                matches!(a, NeighbourAttribute::LinkLayerAddress(mac) if !want_fdb.contains(mac) && mac.iter().any(|b| *b != 0))
            }),
            _ => false,
        };
        if stale {
            h.neighbours().del(n).execute().await.map_err(nl("removing a stale VTEP entry"))?;
        }
    }
    Ok(())
}

/// [`desired_routes`] then [`apply`]: what the agent calls with the whole node list on
/// every Node watch event.
pub async fn sync(h: &Handle, cfg: &RouteConfig, nodes: &[NodeRoute]) -> Result<ApplyReport> {
    apply(h, &desired_routes(cfg, nodes)).await
}

/// Removes everything [`apply`] installed (routes with [`ROUTE_PROTOCOL`] and the VXLAN
/// device named in `vxlan`).
pub async fn remove_all(h: &Handle, vxlan: &VxlanConfig) -> Result<()> {
    for r in our_routes(h).await? {
        h.route().del(r).execute().await.map_err(nl("removing a route"))?;
    }
    pod::delete_link(h, &vxlan.device).await.map_err(Error::Link)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str, ip: &str) -> NodeRoute {
        NodeRoute {
            name: name.into(),
            pod_cidr: cidr.parse().unwrap(),
            internal_ip: ip.parse().unwrap(),
        }
    }

    fn nodes() -> Vec<NodeRoute> {
        vec![
            node("a", "10.244.1.0/24", "192.168.50.1"),
            node("b", "10.244.2.0/24", "192.168.50.2"),
            node("c", "10.244.3.0/24", "172.16.9.3"),
        ]
    }

    #[test]
    fn host_gw_routes_every_other_node_and_guards_the_cidrs() {
        let plan = desired_routes(&RouteConfig::new("a"), &nodes());
        assert_eq!(plan.vxlan, None);
        let dsts: Vec<String> = plan.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.244.2.0/24", "10.244.3.0/24", "10.244.0.0/16", "10.96.0.0/12"]);
        assert_eq!(
            plan.routes[0].kind,
            RouteKind::Via { gateway: "192.168.50.2".parse().unwrap() }
        );
        assert_eq!(plan.routes[2].kind, RouteKind::Unreachable);
    }

    #[test]
    fn auto_mode_encapsulates_only_off_subnet_nodes() {
        let cfg = RouteConfig::new("a")
            .mode(Mode::Auto { node_subnet: "192.168.50.0/24".parse().unwrap() });
        let plan = desired_routes(&cfg, &nodes());
        assert!(matches!(plan.routes[0].kind, RouteKind::Via { .. }));
        assert_eq!(
            plan.routes[1].kind,
            RouteKind::Vxlan {
                gateway: "10.244.3.0".parse().unwrap(),
                vtep_mac: [0x0e, 0x5c, 172, 16, 9, 3],
                remote: "172.16.9.3".parse().unwrap()
            }
        );
        let dev = plan.vxlan.unwrap();
        assert_eq!(dev.local_ip, "192.168.50.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(dev.address, "10.244.1.0".parse::<Ipv4Addr>().unwrap());
        assert_eq!(dev.mac, vtep_mac("192.168.50.1".parse().unwrap()));
    }

    #[test]
    fn vxlan_needs_the_local_node_and_duplicates_are_dropped() {
        let cfg = RouteConfig::new("zz").mode(Mode::Vxlan);
        let plan = desired_routes(&cfg, &nodes());
        assert!(plan.vxlan.is_none());
        assert!(plan.routes.iter().all(|r| r.kind == RouteKind::Unreachable));
        let mut ns = nodes();
        ns.push(node("d", "10.244.2.0/24", "192.168.50.4"));
        ns.push(node("e", "10.244.1.0/24", "192.168.50.5"));
        let plan = desired_routes(&RouteConfig::new("a"), &ns);
        let to_b: Vec<_> =
            plan.routes.iter().filter(|r| r.dst.to_string() == "10.244.2.0/24").collect();
        assert_eq!(to_b.len(), 1);
        assert_eq!(to_b[0].node, "b");
        assert!(!plan.routes.iter().any(|r| r.node == "e"));
    }

    #[test]
    fn adapter_reads_pod_cidr_and_internal_ip() {
        use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        assert_eq!(NodeRoute::from_node(&n), None);
        n.spec = Some(NodeSpec { pod_cidr: Some("10.244.7.0/24".into()), ..Default::default() });
        n.status = Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress { address: "n1.example".into(), type_: "Hostname".into() },
                NodeAddress { address: "192.168.50.7".into(), type_: "InternalIP".into() },
            ]),
            ..Default::default()
        });
        assert_eq!(NodeRoute::from_node(&n), Some(node("n1", "10.244.7.0/24", "192.168.50.7")));
    }
}
