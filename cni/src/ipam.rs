//! IP address management: a pure allocator over the node's pod CIDR, and its on-disk store
//! (one file per address, `flock`-serialised, idempotent per container id and ifname).
//!
//! Store layout (host-local's, so it is easy to inspect): `<dir>/<ip>` holds
//! `"<container id>\n<ifname>\n"`, `<dir>/last_reserved_ip` the last address handed out
//! (allocation continues round-robin after it, so a released address is not reused at
//! once), and `<dir>/lock` is the file every operation holds an exclusive `flock` on.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ipnetwork::Ipv4Network;

use crate::config::Attachment;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating the IPAM directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("locking the IPAM store {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the IPAM store {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the IPAM record {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing the IPAM record {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no free address left in {range}")]
    Exhausted { range: Ipv4Network },
}

/// The pure allocator: which addresses of a range may be handed out, and which is next.
#[derive(Debug, Clone, Copy)]
pub struct Allocator {
    range: Ipv4Network,
}

impl Allocator {
    pub fn new(range: Ipv4Network) -> Self {
        Self { range }
    }

    /// First and last assignable address: the network and broadcast addresses are skipped
    /// (pods are /32s here, but keeping them free avoids surprising anyone who routes the
    /// CIDR as a subnet; the route library gives the network address to the VXLAN device).
    pub fn bounds(&self) -> (u32, u32) {
        let net = u32::from(self.range.network());
        let bcast = u32::from(self.range.broadcast());
        (net + 1, bcast - 1)
    }

    /// How many addresses this range hands out.
    pub fn capacity(&self) -> u32 {
        let (lo, hi) = self.bounds();
        hi - lo + 1
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let (lo, hi) = self.bounds();
        (lo..=hi).contains(&u32::from(ip))
    }

    /// The next free address after `last` (round robin, wrapping), or `None` when every
    /// assignable address is in `used`.
    pub fn next_free(&self, used: &BTreeSet<Ipv4Addr>, last: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        let (lo, hi) = self.bounds();
        let start = match last.map(u32::from) {
            Some(l) if (lo..hi).contains(&l) => l + 1,
            _ => lo,
        };
        (start..=hi).chain(lo..start).map(Ipv4Addr::from).find(|ip| !used.contains(ip))
    }
}

/// One allocation record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub ifname: String,
}

/// The on-disk store of one network's allocations.
#[derive(Debug, Clone)]
pub struct IpamStore {
    dir: PathBuf,
    allocator: Allocator,
}

/// An exclusive `flock` on the store, released on drop (closing the file releases it).
struct StoreLock {
    _file: File,
}

impl IpamStore {
    pub fn new(dir: impl Into<PathBuf>, range: Ipv4Network) -> Self {
        Self { dir: dir.into(), allocator: Allocator::new(range) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    fn lock(&self) -> Result<StoreLock> {
        fs::create_dir_all(&self.dir)
            .map_err(|source| Error::CreateDir { path: self.dir.clone(), source })?;
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Lock { path: path.clone(), source })?;
        loop {
            // SAFETY: flock on a file descriptor we own; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(Error::Lock { path, source: err });
            }
        }
        Ok(StoreLock { _file: file })
    }

    /// Every record in the store (records that do not parse are reported with empty owner
    /// fields, so GC removes them).
    fn scan(&self) -> Result<BTreeMap<Ipv4Addr, Allocation>> {
        let mut out = BTreeMap::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(source) => return Err(Error::Read { path: self.dir.clone(), source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| Error::Read { path: self.dir.clone(), source })?;
            let name = entry.file_name();
            let Some(ip) = name.to_str().and_then(|n| n.parse::<Ipv4Addr>().ok()) else {
                continue;
            };
            let path = entry.path();
            let text = match fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(Error::Read { path, source }),
            };
            let mut lines = text.lines();
            let container_id = lines.next().unwrap_or_default().trim().to_owned();
            let ifname = lines.next().unwrap_or_default().trim().to_owned();
            out.insert(ip, Allocation { ip, container_id, ifname });
        }
        Ok(out)
    }

    fn last_reserved(&self) -> Option<Ipv4Addr> {
        fs::read_to_string(self.dir.join("last_reserved_ip")).ok()?.trim().parse().ok()
    }

    /// Allocates an address for (container id, ifname), or returns the one it already has.
    pub fn allocate(&self, container_id: &str, ifname: &str) -> Result<Ipv4Addr> {
        let _lock = self.lock()?;
        let records = self.scan()?;
        if let Some(a) =
            records.values().find(|a| a.container_id == container_id && a.ifname == ifname)
        {
            return Ok(a.ip);
        }
        let used: BTreeSet<Ipv4Addr> = records.keys().copied().collect();
        let ip = self
            .allocator
            .next_free(&used, self.last_reserved())
            .ok_or(Error::Exhausted { range: self.allocator.range })?;
        let path = self.dir.join(ip.to_string());
        // No fsync (as host-local): the records only matter while the node runs; after a
        // crash of the machine its pods and veths are gone too and GC reconciles.
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
            f.write_all(format!("{container_id}\n{ifname}\n").as_bytes())
        };
        write().map_err(|source| Error::Write { path: path.clone(), source })?;
        let last = self.dir.join("last_reserved_ip");
        fs::write(&last, ip.to_string()).map_err(|source| Error::Write { path: last, source })?;
        Ok(ip)
    }

    /// The address held by (container id, ifname), if any.
    pub fn get(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>> {
        let _lock = self.lock()?;
        Ok(self
            .scan()?
            .into_values()
            .find(|a| a.container_id == container_id && a.ifname == ifname)
            .map(|a| a.ip))
    }

    /// Releases what (container id, ifname) holds; releasing nothing is not an error.
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>> {
        let _lock = self.lock()?;
        let mut released = None;
        for a in self.scan()?.into_values() {
            if a.container_id == container_id && a.ifname == ifname {
                self.remove_record(a.ip)?;
                released = Some(a.ip);
            }
        }
        Ok(released)
    }

    fn remove_record(&self, ip: Ipv4Addr) -> Result<()> {
        let path = self.dir.join(ip.to_string());
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Remove { path, source }),
        }
    }

    /// All allocations.
    pub fn list(&self) -> Result<Vec<Allocation>> {
        let _lock = self.lock()?;
        Ok(self.scan()?.into_values().collect())
    }

    /// Removes every allocation whose (container id, ifname) is not in `valid`; returns
    /// what it removed.
    pub fn gc(&self, valid: &HashSet<Attachment>) -> Result<Vec<Allocation>> {
        let _lock = self.lock()?;
        let mut removed = Vec::new();
        for a in self.scan()?.into_values() {
            let key = Attachment { container_id: a.container_id.clone(), ifname: a.ifname.clone() };
            if !valid.contains(&key) {
                self.remove_record(a.ip)?;
                removed.push(a);
            }
        }
        Ok(removed)
    }

    /// Whether at least one address is free (for STATUS).
    pub fn has_free(&self) -> Result<bool> {
        let _lock = self.lock()?;
        let used: BTreeSet<Ipv4Addr> = self.scan()?.into_keys().collect();
        Ok(self.allocator.next_free(&used, None).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    #[test]
    fn allocator_skips_network_and_broadcast_and_wraps() {
        let a = Allocator::new(net("10.0.0.0/30"));
        assert_eq!(a.capacity(), 2);
        let mut used = BTreeSet::new();
        assert_eq!(a.next_free(&used, None), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(
            a.next_free(&used, Some("10.0.0.1".parse().unwrap())),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            a.next_free(&used, Some("10.0.0.2".parse().unwrap())),
            Some("10.0.0.1".parse().unwrap())
        );
        used.insert("10.0.0.1".parse().unwrap());
        assert_eq!(
            a.next_free(&used, Some("10.0.0.2".parse().unwrap())),
            Some("10.0.0.2".parse().unwrap())
        );
        used.insert("10.0.0.2".parse().unwrap());
        assert_eq!(a.next_free(&used, None), None);
        assert!(!a.contains("10.0.0.0".parse().unwrap()));
        assert!(!a.contains("10.0.0.3".parse().unwrap()));
    }

    #[test]
    fn store_is_idempotent_releases_and_collects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::new(dir.path().join("net"), net("10.0.0.0/29"));
        let a = s.allocate("c1", "eth0").unwrap();
        assert_eq!(s.allocate("c1", "eth0").unwrap(), a, "same attachment, same address");
        let b = s.allocate("c1", "eth1").unwrap();
        let c = s.allocate("c2", "eth0").unwrap();
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_eq!(s.release("c1", "eth1").unwrap(), Some(b));
        assert_eq!(s.release("c1", "eth1").unwrap(), None);
        // Round robin: the released address is not handed out next.
        let d = s.allocate("c3", "eth0").unwrap();
        assert_ne!(d, b);
        let valid: HashSet<Attachment> =
            [Attachment { container_id: "c1".into(), ifname: "eth0".into() }].into();
        let removed: BTreeSet<Ipv4Addr> = s.gc(&valid).unwrap().into_iter().map(|a| a.ip).collect();
        assert_eq!(removed, [c, d].into());
        assert_eq!(s.list().unwrap().len(), 1);
    }

    #[test]
    fn store_exhausts() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::new(dir.path(), net("10.0.0.0/30"));
        s.allocate("a", "eth0").unwrap();
        s.allocate("b", "eth0").unwrap();
        assert!(!s.has_free().unwrap());
        assert!(matches!(s.allocate("c", "eth0"), Err(Error::Exhausted { .. })));
    }

    #[test]
    fn parallel_allocations_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::new(dir.path(), net("10.0.0.0/24"));
        let ips: Vec<Ipv4Addr> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..64)
                .map(|i| {
                    let s = s.clone();
                    sc.spawn(move || s.allocate(&format!("c{i}"), "eth0").unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let set: BTreeSet<_> = ips.iter().collect();
        assert_eq!(set.len(), 64);
    }
}
