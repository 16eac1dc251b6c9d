//! IPv4 networks in CIDR notation: the service and cluster ranges, and their addresses.
//!
//! Over ipnetwork's `Ipv4Network`, the IP-network type the whole workspace uses (skiff-cni
//! and the agent through the CNI plugin library's types), with the network address
//! normalized on parse (`10.244.1.5/16` is `10.244.0.0/16`).

use std::net::Ipv4Addr;

use ipnetwork::Ipv4Network;

/// An IPv4 CIDR: its network address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(Ipv4Network);

impl Cidr {
    /// `a.b.c.d/n`, its host bits cleared; None if it is not one.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, len) = s.split_once('/')?;
        let ip: Ipv4Addr = ip.parse().ok()?;
        let prefix: u8 = len.parse().ok()?;
        let net = Ipv4Network::new(ip, prefix).ok()?;
        Ipv4Network::new(net.network(), prefix).ok().map(Cidr)
    }

    /// The network address.
    pub fn base(&self) -> Ipv4Addr {
        self.0.network()
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.0.prefix()
    }

    /// How many addresses it spans (2^32 for /0).
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix())
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.contains(ip)
    }

    /// The `n`th address from the network address (wrapping past the end).
    pub fn nth(&self, n: u64) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base()).wrapping_add(n as u32))
    }

    /// As ipnetwork's type.
    pub fn network(&self) -> Ipv4Network {
        self.0
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base(), self.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_normalizes_and_measures() {
        let c = Cidr::parse("10.244.1.5/16").expect("cidr");
        assert_eq!(c.to_string(), "10.244.0.0/16");
        assert_eq!(c.size(), 65_536);
        assert!(c.contains(Ipv4Addr::new(10, 244, 255, 1)));
        assert!(!c.contains(Ipv4Addr::new(10, 245, 0, 1)));
        assert_eq!(c.nth(10), Ipv4Addr::new(10, 244, 0, 10));
        assert_eq!(Cidr::parse("0.0.0.0/0").expect("all").size(), 1 << 32);
        for bad in ["10.0.0.0", "10.0.0.0/33", "10.0.0/8", "x/8", "10.0.0.0/-1"] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }
}
