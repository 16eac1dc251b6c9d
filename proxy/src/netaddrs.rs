//! The node's own IPv4 addresses (`getifaddrs`, in the proxy's network namespace): what
//! `--nodeport-addresses` selects from.

use std::net::Ipv4Addr;

/// Every IPv4 address on this namespace's interfaces (loopback included), each once.
pub fn local_ipv4() -> std::io::Result<Vec<Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list this function frees below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cur };
        if !entry.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points to a sockaddr of the family it says.
            let family = unsafe { (*entry.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
        cur = entry.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_listed() {
        let addrs = super::local_ipv4().expect("getifaddrs");
        assert!(addrs.contains(&std::net::Ipv4Addr::LOCALHOST), "{addrs:?}");
    }
}
