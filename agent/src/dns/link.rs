//! The node-local DNS address: a dummy link `skiff-dns` holding the listen address as a
//! /32 (/128), the way NodeLocal DNSCache holds 169.254.20.10, created and removed over
//! rtnetlink in the caller's network namespace.
//!
//! Kernels built without the dummy driver (CONFIG_DUMMY unset, as on the lab machines)
//! answer EOPNOTSUPP; the link is then a port-less bridge of the same name, which holds a
//! local address just as well (local delivery does not depend on carrier).

use std::net::IpAddr;

use rtnetlink::packet_route::address::AddressScope;
use rtnetlink::{Handle, LinkBridge, LinkDummy, LinkUnspec};
use skiff_cni::pod::{delete_link, get_link};
use tracing::debug;

/// The dummy link carrying the DNS address.
pub const DNS_LINK: &str = "skiff-dns";

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening an rtnetlink connection")]
    Connect(#[source] skiff_cni::netns::Error),
    #[error("looking up or deleting link {DNS_LINK}")]
    Link(#[source] skiff_cni::pod::Error),
    #[error("{step} (link {DNS_LINK})")]
    Netlink {
        step: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("link {DNS_LINK} vanished while being configured")]
    Vanished,
}

fn is_unsupported(err: &rtnetlink::Error) -> bool {
    const EOPNOTSUPP: i32 = 95;
    matches!(err, rtnetlink::Error::NetlinkError(m) if -m.raw_code() == EOPNOTSUPP)
}

fn nl(step: &'static str) -> impl FnOnce(rtnetlink::Error) -> Error {
    move |source| Error::Netlink { step, source }
}

/// Makes sure link `skiff-dns` exists, is up and holds `addr` (idempotent), in the calling
/// thread's network namespace. Needs CAP_NET_ADMIN. Call inside a tokio runtime.
pub async fn ensure_listen_address(addr: IpAddr) -> Result<()> {
    let h = skiff_cni::netns::netlink_here().map_err(Error::Connect)?;
    ensure_listen_address_with(&h, addr).await
}

/// [`ensure_listen_address`] over an existing connection (e.g. one opened in another
/// namespace with `skiff_cni::netns::netlink_in`).
pub async fn ensure_listen_address_with(h: &Handle, addr: IpAddr) -> Result<()> {
    if get_link(h, DNS_LINK).await.map_err(Error::Link)?.is_none() {
        match h.link().add(LinkDummy::new(DNS_LINK).build()).execute().await {
            Ok(()) => {}
            Err(e) if is_unsupported(&e) => {
                debug!("no dummy link driver in this kernel: using a bridge for {DNS_LINK}");
                h.link()
                    .add(LinkBridge::new(DNS_LINK).build())
                    .execute()
                    .await
                    .map_err(nl("creating the bridge link"))?;
            }
            Err(e) => return Err(nl("creating the dummy link")(e)),
        }
    }
    let link = get_link(h, DNS_LINK).await.map_err(Error::Link)?.ok_or(Error::Vanished)?;
    let index = link.header.index;
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl("setting the link up"))?;
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    let mut add = h.address().add(index, addr, prefix).replace();
    add.message_mut().header.scope = AddressScope::Universe;
    add.execute().await.map_err(nl("adding the address"))?;
    Ok(())
}

/// Deletes link `skiff-dns` (and so its address); a missing link is success. Returns
/// whether it existed.
pub async fn remove_listen_address() -> Result<bool> {
    let h = skiff_cni::netns::netlink_here().map_err(Error::Connect)?;
    remove_listen_address_with(&h).await
}

/// [`remove_listen_address`] over an existing connection.
pub async fn remove_listen_address_with(h: &Handle) -> Result<bool> {
    delete_link(h, DNS_LINK).await.map_err(Error::Link)
}
