//! Typed user-space access to the pinned data-plane maps: writes of service/backend entries,
//! conntrack purges, and the reads behind `skiff-proxy maps ...`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, IterableMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use skiff_ebpf_common::{
    AffinityKey, AffinityValue, Backend, Config, Counters, CtKey, CtValue, FlowEvent, MaglevTable,
    RevNat, STATS_ANY, ServiceKey, ServiceValue, SockRevKey, SourceRangeKey, StatsKey, drop_reason,
    map_names,
};

/// Errors of map access.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening pinned map {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("map {name}: {step}")]
    Access {
        name: &'static str,
        step: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("counting the possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("map {name}: batched access")]
    Batch {
        name: &'static str,
        #[source]
        source: crate::batch::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn access(name: &'static str, step: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |e| Error::Access { name, step, source: Box::new(e) }
}

fn open(dir: &Path, name: &'static str) -> Result<Map> {
    let path = dir.join(name);
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::Open { path: path.clone(), source: Box::new(e) })?;
    Map::from_map_data(data).map_err(|e| Error::Open { path, source: Box::new(e) })
}

/// The data-plane maps, opened from their pins.
pub struct ServiceMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: Array<MapData, Backend>,
    rev_nat: Array<MapData, RevNat>,
    conntrack: HashMap<MapData, CtKey, CtValue>,
    ct_generation: Array<MapData, u32>,
    sock_rev: HashMap<MapData, SockRevKey, RevNat>,
    affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    maglev: HashMap<MapData, u32, MaglevTable>,
    source_ranges: LpmTrie<MapData, SourceRangeKey, u32>,
    drops: PerCpuArray<MapData, u64>,
    svc_stats: Array<MapData, Counters>,
    be_stats: Array<MapData, Counters>,
    stats_spill: PerCpuHashMap<MapData, StatsKey, Counters>,
    node_addrs: HashMap<MapData, u32, u32>,
}

macro_rules! typed {
    ($dir:expr, $name:expr) => {
        open($dir, $name)?.try_into().map_err(access($name, "type"))?
    };
}

impl ServiceMaps {
    /// Opens every map pinned in `dir` (by the loader, or by a previous proxy run).
    pub fn open_pinned(dir: &Path) -> Result<Self> {
        Ok(Self {
            services: typed!(dir, map_names::SERVICES),
            backends: typed!(dir, map_names::BACKENDS),
            rev_nat: typed!(dir, map_names::REV_NAT),
            conntrack: typed!(dir, map_names::CONNTRACK),
            ct_generation: typed!(dir, map_names::CT_GENERATION),
            sock_rev: typed!(dir, map_names::SOCK_REV),
            affinity: typed!(dir, map_names::AFFINITY),
            maglev: typed!(dir, map_names::MAGLEV),
            source_ranges: typed!(dir, map_names::SOURCE_RANGES),
            drops: typed!(dir, map_names::DROPS),
            svc_stats: typed!(dir, map_names::SVC_STATS),
            be_stats: typed!(dir, map_names::BE_STATS),
            stats_spill: typed!(dir, map_names::STATS),
            node_addrs: typed!(dir, map_names::NODE_ADDRS),
        })
    }

    /// `--cluster-cidr`: the pod ranges (see `CLUSTER_OUTSIDE`), replacing those set
    /// before; empty: no source is outside.
    pub fn set_cluster_cidrs(&mut self, cidrs: &[(std::net::Ipv4Addr, u8)]) -> Result<()> {
        use skiff_ebpf_common::{CLUSTER_INSIDE, CLUSTER_OUTSIDE};
        let name = map_names::SOURCE_RANGES;
        let mut want: Vec<(LpmKey<SourceRangeKey>, u32)> =
            cidrs.iter().map(|(a, l)| (Self::range_key(0, *a, *l), CLUSTER_INSIDE)).collect();
        if !want.is_empty() {
            want.push((Self::range_key(0, std::net::Ipv4Addr::UNSPECIFIED, 0), CLUSTER_OUTSIDE));
        }
        let have: Vec<LpmKey<SourceRangeKey>> = self
            .source_ranges
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| k.data().rev_nat_id_be == 0)
            .collect();
        for k in &have {
            let kept =
                want.iter().any(|(w, _)| w.prefix_len() == k.prefix_len() && w.data() == k.data());
            if !kept {
                ignore_missing(self.source_ranges.remove(k)).map_err(access(name, "remove"))?;
            }
        }
        for (k, v) in &want {
            self.source_ranges.insert(k, v, 0).map_err(access(name, "insert"))?;
        }
        Ok(())
    }

    /// The further node addresses that serve NodePorts (`--nodeport-addresses`), replacing
    /// those set before. At most `MAX_NODE_ADDRS`.
    pub fn set_node_addresses(&mut self, addrs: &[std::net::Ipv4Addr]) -> Result<()> {
        let name = map_names::NODE_ADDRS;
        let want: Vec<u32> = addrs.iter().map(|a| u32::from(*a).to_be()).collect();
        let have: Vec<u32> = self
            .node_addrs
            .keys()
            .collect::<std::result::Result<_, _>>()
            .map_err(access(name, "keys"))?;
        for k in have.iter().filter(|k| !want.contains(k)) {
            ignore_missing(self.node_addrs.remove(k)).map_err(access(name, "remove"))?;
        }
        for k in want.iter().filter(|k| !have.contains(k)) {
            self.node_addrs.insert(k, 1, 0).map_err(access(name, "insert"))?;
        }
        Ok(())
    }

    /// The further node addresses that serve NodePorts.
    pub fn node_addresses(&self) -> Result<Vec<std::net::Ipv4Addr>> {
        let keys: Vec<u32> = self
            .node_addrs
            .keys()
            .collect::<std::result::Result<_, _>>()
            .map_err(access(map_names::NODE_ADDRS, "keys"))?;
        Ok(keys.into_iter().map(|k| std::net::Ipv4Addr::from(u32::from_be(k))).collect())
    }

    /// Writes a backend (the array entry of its id).
    pub fn put_backend(&mut self, id: u32, b: Backend) -> Result<()> {
        self.backends.set(id, b, 0).map_err(access(map_names::BACKENDS, "set"))
    }

    /// Writes backends in one batched syscall (element by element where the kernel has no
    /// batch support).
    pub fn put_backends(&mut self, entries: &[(u32, Backend)]) -> Result<()> {
        let name = map_names::BACKENDS;
        let (keys, values): (Vec<u32>, Vec<Backend>) = entries.iter().copied().unzip();
        match crate::batch::update(self.backends.map().fd().as_fd(), &keys, &values) {
            Ok(()) => Ok(()),
            Err(e) if e.unsupported() => {
                entries.iter().try_for_each(|(id, b)| self.put_backend(*id, *b))
            }
            Err(source) => Err(Error::Batch { name, source }),
        }
    }

    /// Removes a backend: zeroes its array entry, which frees the id (absent is fine), and
    /// its counters.
    pub fn remove_backend(&mut self, id: u32) -> Result<()> {
        self.put_backend(id, Backend::default())?;
        self.clear_backend_stats(id)
    }

    /// Writes a service slot.
    pub fn put_service(&mut self, k: ServiceKey, v: ServiceValue) -> Result<()> {
        self.services.insert(k, v, 0).map_err(access(map_names::SERVICES, "insert"))
    }

    /// Writes service slots in one batched syscall, in order (element by element where the
    /// kernel has no batch support).
    pub fn put_services(&mut self, entries: &[(ServiceKey, ServiceValue)]) -> Result<()> {
        let name = map_names::SERVICES;
        let (keys, values): (Vec<ServiceKey>, Vec<ServiceValue>) = entries.iter().copied().unzip();
        match crate::batch::update(self.services.map().fd().as_fd(), &keys, &values) {
            Ok(()) => Ok(()),
            Err(e) if e.unsupported() => {
                entries.iter().try_for_each(|(k, v)| self.put_service(*k, *v))
            }
            Err(source) => Err(Error::Batch { name, source }),
        }
    }

    /// Removes a service slot (absent is fine).
    pub fn remove_service(&mut self, k: ServiceKey) -> Result<()> {
        ignore_missing(self.services.remove(&k)).map_err(access(map_names::SERVICES, "remove"))
    }

    /// Writes a rev-nat entry.
    pub fn put_rev_nat(&mut self, id: u32, v: RevNat) -> Result<()> {
        self.rev_nat.set(id, v, 0).map_err(access(map_names::REV_NAT, "set"))
    }

    /// Writes rev-nat entries in one batched syscall.
    pub fn put_rev_nats(&mut self, entries: &[(u32, RevNat)]) -> Result<()> {
        let name = map_names::REV_NAT;
        let (keys, values): (Vec<u32>, Vec<RevNat>) = entries.iter().copied().unzip();
        match crate::batch::update(self.rev_nat.map().fd().as_fd(), &keys, &values) {
            Ok(()) => Ok(()),
            Err(e) if e.unsupported() => {
                entries.iter().try_for_each(|(id, v)| self.put_rev_nat(*id, *v))
            }
            Err(source) => Err(Error::Batch { name, source }),
        }
    }

    /// Removes a rev-nat entry: zeroes its array entry, which frees the id, and the
    /// frontend's counters.
    pub fn remove_rev_nat(&mut self, id: u32) -> Result<()> {
        self.put_rev_nat(id, RevNat::default())?;
        self.clear_service_stats(id)
    }

    /// Writes a frontend's Maglev table.
    pub fn put_maglev(&mut self, rev_nat_id: u32, t: &MaglevTable) -> Result<()> {
        self.maglev.insert(rev_nat_id, t, 0).map_err(access(map_names::MAGLEV, "insert"))
    }

    /// Removes a frontend's Maglev table (absent is fine).
    pub fn remove_maglev(&mut self, rev_nat_id: u32) -> Result<()> {
        ignore_missing(self.maglev.remove(&rev_nat_id)).map_err(access(map_names::MAGLEV, "remove"))
    }

    fn range_key(rev_nat_id: u32, addr: std::net::Ipv4Addr, len: u8) -> LpmKey<SourceRangeKey> {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
        let addr_be = (u32::from(addr) & mask).to_be();
        LpmKey::new(
            32 + u32::from(len.min(32)),
            SourceRangeKey { rev_nat_id_be: rev_nat_id.to_be(), addr_be },
        )
    }

    /// Allows a source range for a frontend.
    pub fn put_source_range(
        &mut self,
        rev_nat_id: u32,
        addr: std::net::Ipv4Addr,
        len: u8,
    ) -> Result<()> {
        self.source_ranges
            .insert(&Self::range_key(rev_nat_id, addr, len), 1, 0)
            .map_err(access(map_names::SOURCE_RANGES, "insert"))
    }

    /// Removes a source range of a frontend (absent is fine).
    pub fn remove_source_range(
        &mut self,
        rev_nat_id: u32,
        addr: std::net::Ipv4Addr,
        len: u8,
    ) -> Result<()> {
        ignore_missing(self.source_ranges.remove(&Self::range_key(rev_nat_id, addr, len)))
            .map_err(access(map_names::SOURCE_RANGES, "remove"))
    }

    /// All service slots.
    pub fn services(&self) -> Result<Vec<(ServiceKey, ServiceValue)>> {
        self.services.iter().collect::<Result<_, _>>().map_err(access(map_names::SERVICES, "iter"))
    }

    /// All backends (the array entries that are not free).
    pub fn backends(&self) -> Result<Vec<(u32, Backend)>> {
        let name = map_names::BACKENDS;
        let fd = self.backends.map().fd().as_fd();
        let all = crate::batch::lookup_array::<Backend>(fd, self.backends.len())
            .map_err(|source| Error::Batch { name, source })?;
        Ok(all.into_iter().filter(|(_, b)| !b.is_free()).collect())
    }

    /// All rev-nat entries.
    pub fn rev_nats(&self) -> Result<Vec<(u32, RevNat)>> {
        let name = map_names::REV_NAT;
        let fd = self.rev_nat.map().fd().as_fd();
        let all = crate::batch::lookup_array::<RevNat>(fd, self.rev_nat.len())
            .map_err(|source| Error::Batch { name, source })?;
        Ok(all.into_iter().filter(|(_, v)| !v.is_free()).collect())
    }

    /// All conntrack entries.
    pub fn conntrack(&self) -> Result<Vec<(CtKey, CtValue)>> {
        self.conntrack
            .iter()
            .collect::<Result<_, _>>()
            .map_err(access(map_names::CONNTRACK, "iter"))
    }

    /// Deletes conntrack entries of removed flows: those of a (rev-nat id, backend id) pair
    /// in `pairs`, or of any backend in `backend_ids`; and socket-reverse entries pointing at
    /// a `removed` backend address. TCP and UDP alike: no stale flows to removed backends.
    /// Bumps the conntrack generation after the conntrack deletions, so the programs' flow
    /// caches forget them too. Returns how many entries went.
    pub fn purge_flows(
        &mut self,
        pairs: &[(u32, u32)],
        backend_ids: &[u32],
        removed: &[Backend],
    ) -> Result<usize> {
        let stale: Vec<CtKey> = self
            .conntrack()?
            .into_iter()
            .filter(|(_, v)| {
                backend_ids.contains(&v.backend_id) || pairs.contains(&(v.rev_nat_id, v.backend_id))
            })
            .map(|(k, _)| k)
            .collect();
        let removed_ct = stale.iter().try_for_each(|k| {
            ignore_missing(self.conntrack.remove(k)).map_err(access(map_names::CONNTRACK, "remove"))
        });
        // After the deletions (even a partial batch): the programs' flow caches drop their
        // copies of the deleted entries.
        self.bump_ct_generation()?;
        removed_ct?;
        let socks: Vec<SockRevKey> = if removed.is_empty() {
            Vec::new()
        } else {
            self.sock_rev
                .keys()
                .filter_map(|k| k.ok())
                .filter(|k| {
                    removed
                        .iter()
                        .any(|b| b.ip_be == k.backend_ip_be && b.port_be == k.backend_port_be)
                })
                .collect()
        };
        for k in &socks {
            ignore_missing(self.sock_rev.remove(k))
                .map_err(access(map_names::SOCK_REV, "remove"))?;
        }
        let sticky: Vec<AffinityKey> = self
            .affinity
            .iter()
            .filter_map(|kv| kv.ok())
            .filter(|(k, v)| {
                backend_ids.contains(&v.backend_id) || pairs.contains(&(k.rev_nat_id, v.backend_id))
            })
            .map(|(k, _)| k)
            .collect();
        for k in &sticky {
            ignore_missing(self.affinity.remove(k))
                .map_err(access(map_names::AFFINITY, "remove"))?;
        }
        Ok(stale.len() + socks.len() + sticky.len())
    }

    /// The conntrack generation (`map_names::CT_GENERATION`).
    pub fn ct_generation(&self) -> Result<u32> {
        self.ct_generation.get(&0, 0).map_err(access(map_names::CT_GENERATION, "get"))
    }

    /// Bumps the conntrack generation: the programs' flow caches stop using every copy of
    /// a conntrack entry made before (call it after deleting conntrack entries). This
    /// process is the generation's only writer.
    pub fn bump_ct_generation(&mut self) -> Result<u32> {
        let next = self.ct_generation()?.wrapping_add(1);
        self.ct_generation.set(0, next, 0).map_err(access(map_names::CT_GENERATION, "set"))?;
        Ok(next)
    }

    /// Drop counts summed over CPUs, by reason index.
    pub fn drops(&self) -> Result<Vec<(u32, u64)>> {
        let mut out = Vec::new();
        for reason in 0..drop_reason::COUNT {
            let per_cpu = self.drops.get(&reason, 0).map_err(access(map_names::DROPS, "get"))?;
            out.push((reason, per_cpu.iter().sum()));
        }
        Ok(out)
    }

    /// Drop count of one reason, summed over CPUs.
    pub fn drop_count(&self, reason: u32) -> Result<u64> {
        let per_cpu = self.drops.get(&reason, 0).map_err(access(map_names::DROPS, "get"))?;
        Ok(per_cpu.iter().sum())
    }

    /// Per-service counters (by rev-nat id) with any traffic, summed over CPUs.
    pub fn service_stats(&self) -> Result<Vec<(u32, Counters)>> {
        let mut sums = sum_array(&self.svc_stats, map_names::SVC_STATS)?;
        sum_spill(&self.stats_spill, &mut sums, |k| {
            (k.backend_id == STATS_ANY).then_some(k.rev_nat_id)
        })?;
        Ok(sums.into_iter().collect())
    }

    /// Per-backend counters (by backend id) with any traffic, summed over CPUs.
    pub fn backend_stats(&self) -> Result<Vec<(u32, Counters)>> {
        let mut sums = sum_array(&self.be_stats, map_names::BE_STATS)?;
        sum_spill(&self.stats_spill, &mut sums, |k| {
            (k.rev_nat_id == STATS_ANY).then_some(k.backend_id)
        })?;
        Ok(sums.into_iter().collect())
    }

    /// Zeroes the counters of a freed rev-nat id (so a frontend that gets the id later
    /// starts from zero).
    pub fn clear_service_stats(&mut self, rev_nat_id: u32) -> Result<()> {
        if clear_counters(&mut self.svc_stats, map_names::SVC_STATS, rev_nat_id)? {
            return Ok(());
        }
        let key = StatsKey { rev_nat_id, backend_id: STATS_ANY };
        ignore_missing(self.stats_spill.remove(&key)).map_err(access(map_names::STATS, "remove"))
    }

    /// Zeroes the counters of a freed backend id.
    pub fn clear_backend_stats(&mut self, backend_id: u32) -> Result<()> {
        if clear_counters(&mut self.be_stats, map_names::BE_STATS, backend_id)? {
            return Ok(());
        }
        let key = StatsKey { rev_nat_id: STATS_ANY, backend_id };
        ignore_missing(self.stats_spill.remove(&key)).map_err(access(map_names::STATS, "remove"))
    }
}

/// Switches the programs' debug output (`Config::debug`: new flows and drops printed to the
/// kernel trace buffer) in the maps pinned in `dir`, at run time; off by default.
pub fn set_debug(dir: &Path, on: bool) -> Result<()> {
    let name = map_names::CONFIG;
    let mut config: Array<MapData, Config> = typed!(dir, name);
    let mut c = config.get(&0, 0).map_err(access(name, "get"))?;
    c.debug = u32::from(on);
    config.set(0, c, 0).map_err(access(name, "set"))
}

/// Whether the programs' debug output is on (`Config::debug` in the maps pinned in `dir`).
pub fn debug_enabled(dir: &Path) -> Result<bool> {
    let name = map_names::CONFIG;
    let config: Array<MapData, Config> = typed!(dir, name);
    Ok(config.get(&0, 0).map_err(access(name, "get"))?.debug != 0)
}

/// Reader of the new-flow ring buffer (`skiff-proxy flows`). One reader at a time: the
/// kernel ring buffer has a single consumer position.
pub struct FlowReader {
    ring: RingBuf<MapData>,
}

impl FlowReader {
    /// Opens the ring buffer pinned in `dir`.
    pub fn open_pinned(dir: &Path) -> Result<Self> {
        Ok(Self { ring: typed!(dir, map_names::FLOWS) })
    }

    /// The next pending event, if any (never blocks).
    pub fn next_event(&mut self) -> Option<FlowEvent> {
        let item = self.ring.next()?;
        if item.len() < std::mem::size_of::<FlowEvent>() {
            return None;
        }
        // SAFETY: the item holds at least size_of::<FlowEvent>() bytes written by the kernel
        // program as a FlowEvent (repr(C), valid for any bit pattern); read unaligned.
        Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<FlowEvent>()) })
    }
}

/// Ids per CPU region of a counters array (its entries are `cpu * ids + id`).
fn ids_per_cpu(map: &Array<MapData, Counters>) -> Result<u32> {
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| Error::Cpus(source))?.max(1);
    Ok(map.len() / cpus as u32)
}

/// Zeroes `id`'s counters in every CPU region of a counters array, in one batched write;
/// false when the id lies beyond the array (its counters are in the spill map).
fn clear_counters(map: &mut Array<MapData, Counters>, name: &'static str, id: u32) -> Result<bool> {
    let ids = ids_per_cpu(map)?;
    if id >= ids {
        return Ok(false);
    }
    let keys: Vec<u32> = (0..map.len() / ids).map(|cpu| cpu * ids + id).collect();
    let zeros = vec![Counters::default(); keys.len()];
    match crate::batch::update(map.map().fd().as_fd(), &keys, &zeros) {
        Ok(()) => Ok(true),
        Err(e) if e.unsupported() => {
            for k in keys {
                map.set(k, Counters::default(), 0).map_err(access(name, "set"))?;
            }
            Ok(true)
        }
        Err(source) => Err(Error::Batch { name, source }),
    }
}

type Sums = std::collections::BTreeMap<u32, Counters>;

fn add_into(c: &mut Counters, v: &Counters) {
    c.packets += v.packets;
    c.bytes += v.bytes;
    c.new_conns += v.new_conns;
}

/// The non-zero counters of a counters array, summed over its CPU regions: one batched
/// read of the whole array (hundreds of thousands of entries: one syscall each would take
/// seconds).
fn sum_array(map: &Array<MapData, Counters>, name: &'static str) -> Result<Sums> {
    let ids = ids_per_cpu(map)?.max(1);
    let rows = crate::batch::lookup_array::<Counters>(map.map().fd().as_fd(), map.len())
        .map_err(|source| Error::Batch { name, source })?;
    let mut sums = Sums::new();
    for (index, c) in rows {
        if c != Counters::default() {
            add_into(sums.entry(index % ids).or_default(), &c);
        }
    }
    Ok(sums)
}

/// Adds the spilled counters that `id_of` attributes to an id.
fn sum_spill(
    map: &PerCpuHashMap<MapData, StatsKey, Counters>,
    sums: &mut Sums,
    id_of: impl Fn(&StatsKey) -> Option<u32>,
) -> Result<()> {
    for item in map.iter() {
        let (k, per_cpu) = item.map_err(access(map_names::STATS, "iter"))?;
        if let Some(id) = id_of(&k) {
            let c = sums.entry(id).or_default();
            per_cpu.iter().for_each(|v| add_into(c, v));
        }
    }
    Ok(())
}

fn ignore_missing(r: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match r {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}
