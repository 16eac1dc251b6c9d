//! One pod attachment on the wire: the veth pair, the pod's address, routes and gateway
//! neighbour, the node's host route; and their removal (DEL, rollback, GC) and verification
//! (CHECK). Netlink only (rtnetlink), namespaces entered on dedicated threads ([`netns`]).

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::Path;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::packet_route::link::{
    InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, State,
};
use rtnetlink::packet_route::neighbour::NeighbourState;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteScope};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::config::{Attachment, PluginConfig};
use crate::ipam::{self, IpamStore};
use crate::netns::{self, NetNs};

/// The pods' gateway: link-local, owned by no interface; the pod resolves it through a
/// permanent neighbour entry to its host veth's MAC (Calico uses the same address).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Prefix of host-side veth names (`sk` + 12 hex digits).
pub const HOST_PREFIX: &str = "sk";

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netns(#[from] netns::Error),
    #[error(transparent)]
    Ipam(#[from] ipam::Error),
    #[error("netlink: {step}")]
    Netlink {
        step: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("interface {ifname} already exists in the pod's namespace")]
    PodInterfaceExists { ifname: String },
    #[error("interface {name} not found after creating it")]
    LinkVanished { name: String },
    #[error("enabling IPv4 forwarding")]
    Forwarding(#[source] io::Error),
    #[error("check failed: {0}")]
    Check(String),
    #[error("failure injected after step {0} (SKIFF_CNI_TEST_FAIL_AFTER)")]
    Injected(&'static str),
}

/// Fault injection for the crash and rollback tests: `SKIFF_CNI_TEST_FAIL_AFTER=<step>`
/// fails the ADD after that step, `SKIFF_CNI_TEST_HANG_AFTER=<step>` stalls it there (until
/// killed). Steps: `allocate`, `veth`, `pod`. Unset in production, where it costs one
/// environment lookup per step.
fn fault_point(step: &'static str) -> Result<()> {
    if std::env::var("SKIFF_CNI_TEST_HANG_AFTER").is_ok_and(|s| s == step) {
        std::thread::sleep(std::time::Duration::from_secs(600));
    }
    if std::env::var("SKIFF_CNI_TEST_FAIL_AFTER").is_ok_and(|s| s == step) {
        return Err(Error::Injected(step));
    }
    Ok(())
}

fn nl(step: &'static str) -> impl FnOnce(rtnetlink::Error) -> Error {
    move |source| Error::Netlink { step, source }
}

/// FNV-1a 64, stable across releases (the host veth name must not change between an ADD
/// and the DEL of a later plugin version).
fn fnv1a(data: &[u8]) -> u64 {
    data.iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

fn hashed_name(prefix: &str, container_id: &str, ifname: &str) -> String {
    let h = fnv1a(format!("{container_id}\0{ifname}").as_bytes());
    format!("{prefix}{:012x}", h & 0xffff_ffff_ffff)
}

/// The host-side veth name of (container id, ifname).
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    hashed_name(HOST_PREFIX, container_id, ifname)
}

fn is_host_ifname(name: &str) -> bool {
    name.len() == HOST_PREFIX.len() + 12
        && name.starts_with(HOST_PREFIX)
        && name[HOST_PREFIX.len()..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// What an ADD set up (the data of the CNI result).
#[derive(Debug, Clone)]
pub struct Attached {
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub host_ifname: String,
    pub host_mac: Vec<u8>,
    pub pod_ifname: String,
    pub pod_mac: Vec<u8>,
}

fn is_not_found(err: &rtnetlink::Error) -> bool {
    matches!(err, rtnetlink::Error::NetlinkError(m) if matches!(-m.raw_code(), libc::ENODEV | libc::ENOENT | libc::ESRCH))
}

fn link_name(msg: &LinkMessage) -> Option<&str> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

fn link_mac(msg: &LinkMessage) -> Vec<u8> {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(m) => Some(m.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn is_veth(msg: &LinkMessage) -> bool {
    msg.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::LinkInfo(infos) if infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth))))
    })
}

/// The link called `name`, if it exists.
pub async fn get_link(h: &Handle, name: &str) -> Result<Option<LinkMessage>> {
    match h.link().get().match_name(name.to_owned()).execute().try_next().await {
        Ok(m) => Ok(m),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(source) => Err(Error::Netlink { step: "looking up a link", source }),
    }
}

/// Deletes the link called `name`; a missing link is success. Returns whether it existed.
pub async fn delete_link(h: &Handle, name: &str) -> Result<bool> {
    let Some(link) = get_link(h, name).await? else {
        return Ok(false);
    };
    match h.link().del(link.header.index).execute().await {
        Ok(()) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(source) => Err(Error::Netlink { step: "deleting a link", source }),
    }
}

fn enable_forwarding() -> Result<()> {
    let path = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(path).map(|s| s.trim() == "1").unwrap_or(false) {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(Error::Forwarding)
}

/// Undoes a half-done ADD when dropped armed: deletes the host veth (its peer goes with it)
/// and releases the address if this ADD allocated it. Synchronous, so it also runs on
/// unwinding; netlink work happens on its own thread with its own runtime.
struct AddRollback {
    store: IpamStore,
    container_id: String,
    ifname: String,
    host_ifname: String,
    release_ip: bool,
    armed: bool,
}

impl Drop for AddRollback {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let name = self.host_ifname.clone();
        let deleted = std::thread::spawn(move || -> Result<bool> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Netns(netns::Error::Spawn(e)))?;
            rt.block_on(async {
                let h = netns::netlink_here()?;
                delete_link(&h, &name).await
            })
        })
        .join();
        if !matches!(deleted, Ok(Ok(_))) {
            eprintln!("skiff-cni: rollback could not delete {}; GC will", self.host_ifname);
        }
        if self.release_ip
            && let Err(e) = self.store.release(&self.container_id, &self.ifname)
        {
            eprintln!("skiff-cni: rollback could not release the address: {e}; GC will");
        }
    }
}

/// How long ADD waits for both veth ends to be operationally up.
const OPER_UP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

fn oper_up(msg: &LinkMessage) -> bool {
    msg.attributes.iter().any(|a| matches!(a, LinkAttribute::OperState(State::Up)))
}

/// Waits until both ends are operationally up: until the kernel's link watcher has run for
/// a new veth, its queueing discipline is still `noop` and the pod's first packets would be
/// dropped. Normally immediate; bounded, and a timeout is not an error (the kernel gets
/// there on its own).
async fn wait_oper_up(host: &Handle, host_if: &str, pod: &Handle, ifname: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + OPER_UP_TIMEOUT;
    loop {
        let host_up = get_link(host, host_if).await?.is_some_and(|l| oper_up(&l));
        let pod_up = get_link(pod, ifname).await?.is_some_and(|l| oper_up(&l));
        if host_up && pod_up {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(host_if, ifname, "veth not operationally up after {OPER_UP_TIMEOUT:?}");
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// ADD: allocate, create the veth pair, configure both ends. All or nothing: on any error
/// the rollback guard removes the links and the allocation this call made.
#[tracing::instrument(skip(cfg), fields(network = %cfg.name))]
pub async fn add(
    cfg: &PluginConfig,
    container_id: &str,
    ifname: &str,
    netns_path: &Path,
) -> Result<Attached> {
    let ns = NetNs::open(netns_path)?;
    let store = IpamStore::new(cfg.network_dir(), cfg.pod_cidr);
    let host_if = host_ifname(container_id, ifname);
    let host = netns::netlink_here()?;
    let pod = netns::netlink_in(&ns)?;

    let existing = store.get(container_id, ifname)?;
    if let Some(link) = get_link(&pod, ifname).await? {
        // A repeated ADD of an attachment that is already complete returns it unchanged.
        if let (Some(ip), Some(h)) = (existing, get_link(&host, &host_if).await?) {
            return Ok(Attached {
                ip,
                prefix_len: 32,
                host_ifname: host_if,
                host_mac: link_mac(&h),
                pod_ifname: ifname.to_owned(),
                pod_mac: link_mac(&link),
            });
        }
        return Err(Error::PodInterfaceExists { ifname: ifname.to_owned() });
    }

    let ip = store.allocate(container_id, ifname)?;
    let mut rollback = AddRollback {
        store: store.clone(),
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
        host_ifname: host_if.clone(),
        release_ip: existing.is_none(),
        armed: true,
    };
    fault_point("allocate")?;

    // Leftovers of an interrupted ADD of this same attachment go first.
    delete_link(&host, &host_if).await?;

    // The pair is created with its pod end already in the pod's namespace under its final
    // name (as the reference plugins do): moving a device between namespaces afterwards
    // costs an RCU grace period per ADD.
    let peer =
        LinkUnspec::new_with_name(ifname).setns_by_fd(ns.file().as_raw_fd()).mtu(cfg.mtu).build();
    host.link()
        .add(
            LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
                .name(host_if.clone())
                .mtu(cfg.mtu)
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .build(),
        )
        .execute()
        .await
        .map_err(nl("creating the veth pair"))?;
    fault_point("veth")?;

    // Pod side.
    let pod_link = get_link(&pod, ifname)
        .await?
        .ok_or_else(|| Error::LinkVanished { name: ifname.to_owned() })?;
    let pod_idx = pod_link.header.index;
    pod.link()
        .set(LinkUnspec::new_with_index(pod_idx).up().build())
        .execute()
        .await
        .map_err(nl("setting the pod end up"))?;
    if let Some(lo) = get_link(&pod, "lo").await? {
        pod.link()
            .set(LinkUnspec::new_with_index(lo.header.index).up().build())
            .execute()
            .await
            .map_err(nl("setting the pod's loopback up"))?;
    }
    pod.address()
        .add(pod_idx, IpAddr::V4(ip), 32)
        .execute()
        .await
        .map_err(nl("adding the pod address"))?;
    let host_link = get_link(&host, &host_if)
        .await?
        .ok_or_else(|| Error::LinkVanished { name: host_if.clone() })?;
    let host_mac = link_mac(&host_link);
    pod.neighbours()
        .add(pod_idx, IpAddr::V4(GATEWAY))
        .link_layer_address(&host_mac)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .map_err(nl("adding the gateway neighbour"))?;
    pod.route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(GATEWAY, 32)
                .output_interface(pod_idx)
                .scope(RouteScope::Link)
                .build(),
        )
        .replace()
        .execute()
        .await
        .map_err(nl("adding the pod's gateway route"))?;
    pod.route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
                .gateway(GATEWAY)
                .output_interface(pod_idx)
                .build(),
        )
        .replace()
        .execute()
        .await
        .map_err(nl("adding the pod's default route"))?;

    fault_point("pod")?;

    // Host side.
    let host_idx = host_link.header.index;
    host.link()
        .set(LinkUnspec::new_with_index(host_idx).up().build())
        .execute()
        .await
        .map_err(nl("setting the host end up"))?;
    host.route()
        .add(
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(ip, 32)
                .output_interface(host_idx)
                .scope(RouteScope::Link)
                .build(),
        )
        .replace()
        .execute()
        .await
        .map_err(nl("adding the host route to the pod"))?;
    enable_forwarding()?;
    wait_oper_up(&host, &host_if, &pod, ifname).await?;

    let pod_mac = link_mac(&pod_link);
    rollback.armed = false;
    Ok(Attached {
        ip,
        prefix_len: 32,
        host_ifname: host_if,
        host_mac,
        pod_ifname: ifname.to_owned(),
        pod_mac,
    })
}

/// DEL: remove the host veth (the pod end and the host route go with it) and release the
/// address. Missing netns, link or allocation are all success.
#[tracing::instrument(skip(cfg), fields(network = %cfg.name))]
pub async fn del(cfg: &PluginConfig, container_id: &str, ifname: &str) -> Result<()> {
    let host = netns::netlink_here()?;
    delete_link(&host, &host_ifname(container_id, ifname)).await?;
    IpamStore::new(cfg.network_dir(), cfg.pod_cidr).release(container_id, ifname)?;
    Ok(())
}

async fn has_route(
    h: &Handle,
    dst: Ipv4Addr,
    prefix: u8,
    oif: u32,
    gw: Option<Ipv4Addr>,
) -> Result<bool> {
    let routes: Vec<_> = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing routes"))?;
    Ok(routes.iter().any(|r| {
        let a = &r.attributes;
        let dst_ok = r.header.destination_prefix_length == prefix
            && (prefix == 0 || a.contains(&RouteAttribute::Destination(RouteAddress::Inet(dst))));
        let oif_ok = a.contains(&RouteAttribute::Oif(oif));
        let gw_ok = gw.is_none_or(|g| a.contains(&RouteAttribute::Gateway(RouteAddress::Inet(g))));
        dst_ok && oif_ok && gw_ok
    }))
}

/// CHECK: the allocation, both veth ends, the pod address and routes, and the host route
/// are as ADD left them for `ip`.
#[tracing::instrument(skip(cfg), fields(network = %cfg.name))]
pub async fn check(
    cfg: &PluginConfig,
    container_id: &str,
    ifname: &str,
    netns_path: &Path,
    ip: Ipv4Addr,
) -> Result<()> {
    let fail = |m: String| Err(Error::Check(m));
    let store = IpamStore::new(cfg.network_dir(), cfg.pod_cidr);
    match store.get(container_id, ifname)? {
        Some(a) if a == ip => {}
        other => return fail(format!("allocation is {other:?}, prevResult says {ip}")),
    }
    let ns = NetNs::open(netns_path)?;
    let host = netns::netlink_here()?;
    let pod = netns::netlink_in(&ns)?;
    let host_if = host_ifname(container_id, ifname);
    let Some(hl) = get_link(&host, &host_if).await? else {
        return fail(format!("host veth {host_if} missing"));
    };
    if !hl.header.flags.contains(LinkFlags::Up) {
        return fail(format!("host veth {host_if} is down"));
    }
    if !has_route(&host, ip, 32, hl.header.index, None).await? {
        return fail(format!("host route {ip}/32 dev {host_if} missing"));
    }
    let Some(pl) = get_link(&pod, ifname).await? else {
        return fail(format!("pod interface {ifname} missing"));
    };
    if !pl.header.flags.contains(LinkFlags::Up) {
        return fail(format!("pod interface {ifname} is down"));
    }
    let addrs: Vec<_> = pod
        .address()
        .get()
        .set_link_index_filter(pl.header.index)
        .execute()
        .try_collect()
        .await
        .map_err(nl("listing pod addresses"))?;
    let has_ip = addrs.iter().any(|a| {
        a.header.prefix_len == 32
            && a.attributes.contains(&AddressAttribute::Address(IpAddr::V4(ip)))
    });
    if !has_ip {
        return fail(format!("pod interface {ifname} lacks {ip}/32"));
    }
    if !has_route(&pod, Ipv4Addr::UNSPECIFIED, 0, pl.header.index, Some(GATEWAY)).await? {
        return fail(format!("pod default route via {GATEWAY} missing"));
    }
    Ok(())
}

/// GC: release every allocation not in `valid` and delete its host veth, and delete host
/// veths (`sk…`) that belong to no valid attachment and no remaining allocation (left by an
/// ADD killed after creating the link). Returns the released allocations.
#[tracing::instrument(skip_all, fields(network = %cfg.name, valid = valid.len()))]
pub async fn gc(cfg: &PluginConfig, valid: &[Attachment]) -> Result<Vec<ipam::Allocation>> {
    let store = IpamStore::new(cfg.network_dir(), cfg.pod_cidr);
    let valid_set: HashSet<Attachment> = valid.iter().cloned().collect();
    let removed = store.gc(&valid_set)?;
    let host = netns::netlink_here()?;
    let mut keep: HashSet<String> =
        valid.iter().map(|a| host_ifname(&a.container_id, &a.ifname)).collect();
    keep.extend(store.list()?.iter().map(|a| host_ifname(&a.container_id, &a.ifname)));
    let links: Vec<LinkMessage> =
        host.link().get().execute().try_collect().await.map_err(nl("listing links"))?;
    for link in links {
        let Some(name) = link_name(&link) else { continue };
        if is_host_ifname(name) && !keep.contains(name) && is_veth(&link) {
            match host.link().del(link.header.index).execute().await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(Error::Netlink { step: "deleting a stale veth", source });
                }
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_stable_short_and_recognised() {
        let n = host_ifname("abc", "eth0");
        assert_eq!(n, host_ifname("abc", "eth0"));
        assert_ne!(n, host_ifname("abc", "eth1"));
        assert!(n.len() <= 15);
        assert!(is_host_ifname(&n));
        assert!(!is_host_ifname("sk-cni-1-2"));
    }
}
