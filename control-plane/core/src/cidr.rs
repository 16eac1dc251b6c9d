//! IPv4 networks in CIDR notation: the service and cluster ranges, and their addresses.

use std::net::Ipv4Addr;

/// An IPv4 CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, len) = s.split_once('/')?;
        let base: Ipv4Addr = ip.parse().ok()?;
        let prefix: u8 = len.parse().ok()?;
        if prefix > 32 {
            return None;
        }
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Some(Cidr { base: Ipv4Addr::from(u32::from(base) & mask), prefix })
    }

    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix) };
        u32::from(ip) & mask == u32::from(self.base)
    }

    pub fn nth(&self, n: u64) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base).wrapping_add(n as u32))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}
