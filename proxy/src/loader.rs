//! Loading the embedded eBPF object with its maps pinned in a bpffs directory, and attaching
//! its programs (socket LB on a cgroup, tc on an interface, XDP on an interface) behind RAII
//! guards that detach on drop.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::Array;
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, Program, ProgramError, SchedClassifier, TcAttachType, Xdp,
    XdpMode, cgroup_sock_addr::CgroupSockAddrLink, tc::SchedClassifierLink, xdp::XdpLink,
};
use skiff_ebpf_common::{
    Config, Counters, MAX_BACKENDS, MAX_REV_NAT, map_names, nodeport_mode, prog_names,
};

/// The eBPF object built by `build.rs` (empty when built with `SKIFF_EBPF_STUB=1`).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/skiff-ebpf.o"));

/// Errors of loading and attaching.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("counting the possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("the proxy was built with SKIFF_EBPF_STUB=1: no eBPF object embedded")]
    StubObject,
    #[error("creating pin directory {path}")]
    PinDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no bpffs mounted at {0}: mount it on the host (`mount -t bpf bpf {0}`, as systemd \
         does at boot) and give the proxy the host's {0}; a bpffs of the pod's own would \
         lose the pinned maps and links, and forwarding with them, when the pod goes"
    )]
    NoBpffs(PathBuf),
    #[error("mounting bpffs at {path}")]
    MountBpffs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the eBPF object (maps pinned in {pin_dir})")]
    Load {
        pin_dir: PathBuf,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("program {name} missing from the object")]
    MissingProgram { name: &'static str },
    #[error("map {name} missing from the object")]
    MissingMap { name: &'static str },
    #[error("program {name}: {step}")]
    Program {
        name: &'static str,
        step: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("map {name}: {step}")]
    Map {
        name: &'static str,
        step: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("link for {path} is not an fd link")]
    LinkConvert {
        path: PathBuf,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("pinning link at {path}")]
    PinLink {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("writing sysctl {path}")]
    Sysctl {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening cgroup {path}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the embedded eBPF object's map definitions")]
    ParseObject(#[source] Box<aya_obj::ParseError>),
    #[error("removing stale pinned map {path}")]
    StalePin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    #[error("no cgroup2 mount in /proc/self/mountinfo")]
    NoCgroup2,
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The loaded data plane: programs loaded (not attached) and maps pinned in `pin_dir`.
pub struct Dataplane {
    ebpf: Ebpf,
    pin_dir: PathBuf,
}

/// Kernel memory the per-service and per-backend counter arrays may take together (one
/// region per possible CPU). On a 2-CPU node both cover every id (~27 MiB); on larger ones
/// they cover fewer ids and higher ids spill into a hash map.
pub const STATS_BUDGET_BYTES: u64 = 64 << 20;

/// How NodePort/ExternalIP/LoadBalancer traffic reaches a backend on another node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodePortMode {
    /// SNAT to the node address; replies return through this node (default: like
    /// kube-proxy, works on any network, but the backend sees the node, not the client).
    #[default]
    Snat,
    /// Direct server return over IPIP: the backend sees the client's address and its node
    /// answers the client directly (every node must use it; see `nodeport_mode::DSR`).
    Dsr,
}

impl NodePortMode {
    /// The value of `Config::nodeport_mode`.
    pub fn config_value(self) -> u32 {
        match self {
            NodePortMode::Snat => nodeport_mode::SNAT,
            NodePortMode::Dsr => nodeport_mode::DSR,
        }
    }
}

/// How the data plane is loaded.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// How remote NodePort/ExternalIP/LB backends are reached (default SNAT).
    pub nodeport_mode: NodePortMode,
    /// Ids per CPU of the per-service and per-backend counter arrays. `None` (the default)
    /// sizes them from the possible CPUs within `STATS_BUDGET_BYTES` (1/8 for services,
    /// 7/8 for backends, each at most its id space).
    pub stats_entries: Option<(u32, u32)>,
    /// Whether the tc program updates L4 checksums only through the kernel helpers, as it
    /// does when the kernel's BTF does not say where `sk_buff.ip_summed` is (default false:
    /// it reads `ip_summed` and updates them itself, one helper call fewer per field).
    pub checksum_helpers_only: bool,
}

impl LoadOptions {
    /// Fixed sizes for the counter arrays (services, backends), e.g. tiny ones in tests of
    /// the spill path.
    pub fn stats_entries(mut self, services: u32, backends: u32) -> Self {
        self.stats_entries = Some((services, backends));
        self
    }

    /// Sets `nodeport_mode`.
    pub fn nodeport_mode(mut self, mode: NodePortMode) -> Self {
        self.nodeport_mode = mode;
        self
    }

    /// Sets `checksum_helpers_only`.
    pub fn checksum_helpers_only(mut self, on: bool) -> Self {
        self.checksum_helpers_only = on;
        self
    }

    /// Ids per CPU region of the counter arrays (services, backends), and the number of
    /// regions (possible CPUs).
    pub fn stats_ids(&self) -> Result<(u32, u32, u32)> {
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| Error::Cpus(source))?.max(1);
        let (svc, be) = match self.stats_entries {
            Some(ids) => ids,
            None => {
                let per_id = (std::mem::size_of::<Counters>() * cpus) as u64;
                let fit = |share: u64, max: u32| (share / per_id).clamp(1, max as u64) as u32;
                (
                    fit(STATS_BUDGET_BYTES / 8, MAX_REV_NAT),
                    fit(STATS_BUDGET_BYTES / 8 * 7, MAX_BACKENDS),
                )
            }
        };
        Ok((svc.max(1), be.max(1), cpus as u32))
    }

    /// The `max_entries` the loader sets, by map name.
    pub fn map_sizes(&self) -> Result<Vec<(&'static str, u32)>> {
        let (svc, be, cpus) = self.stats_ids()?;
        Ok(vec![
            (map_names::SVC_STATS, svc.saturating_mul(cpus)),
            (map_names::BE_STATS, be.saturating_mul(cpus)),
        ])
    }
}

impl Dataplane {
    /// Loads the embedded object; maps already pinned in `pin_dir` (a bpffs directory) are
    /// reused, others are created and pinned there. `node_ip` goes into the config map.
    pub fn load(pin_dir: &Path, node_ip: Ipv4Addr) -> Result<Self> {
        Self::load_with(pin_dir, node_ip, &LoadOptions::default())
    }

    /// `load` with options.
    pub fn load_with(pin_dir: &Path, node_ip: Ipv4Addr, options: &LoadOptions) -> Result<Self> {
        if EBPF_OBJECT.is_empty() {
            return Err(Error::StubObject);
        }
        std::fs::create_dir_all(pin_dir)
            .map_err(|source| Error::PinDir { path: pin_dir.into(), source })?;
        let sizes = options.map_sizes()?;
        for name in unpin_stale_maps_sized(pin_dir, &sizes)? {
            tracing::warn!(map = %name, "pinned map had an older definition: recreated empty");
        }
        // The tc program updates L4 checksums itself when it knows where the kernel keeps
        // `skb->ip_summed` (and can reach it through the bpf_cast_to_kern_ctx kfunc);
        // without kernel BTF it uses the kernel helpers.
        let (ip_summed, kfunc) = match crate::kbtf::tc_facts() {
            Ok(f) if options.checksum_helpers_only => (0, Some(f.cast_to_kern_ctx)),
            Ok(f) => (f.ip_summed.encode(), Some(f.cast_to_kern_ctx)),
            Err(e) => {
                tracing::warn!(error = %e, "no kernel BTF facts: tc checksums through helpers");
                (0, None)
            }
        };
        let (object, _) = crate::kbtf::resolve_kfunc_calls(EBPF_OBJECT, kfunc);
        let (svc_ids, be_ids, _) = options.stats_ids()?;
        let mut loader = aya::EbpfLoader::new();
        loader
            .default_map_pin_directory(pin_dir)
            .override_global("SKIFF_SKB_IP_SUMMED", &ip_summed, true)
            .override_global("SKIFF_SVC_STATS_IDS", &svc_ids, true)
            .override_global("SKIFF_BE_STATS_IDS", &be_ids, true);
        for (name, n) in &sizes {
            loader.map_max_entries(name, *n);
        }
        let ebpf = loader
            .load(&object)
            .map_err(|source| Error::Load { pin_dir: pin_dir.into(), source: Box::new(source) })?;
        let mut dp = Self { ebpf, pin_dir: pin_dir.into() };
        dp.set_config(Config {
            node_ip_be: u32::from(node_ip).to_be(),
            debug: 0,
            nodeport_mode: options.nodeport_mode.config_value(),
        })?;
        Ok(dp)
    }

    /// The directory the maps are pinned in.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Writes the node configuration map.
    pub fn set_config(&mut self, config: Config) -> Result<()> {
        let name = map_names::CONFIG;
        let map = self.ebpf.map_mut(name).ok_or(Error::MissingMap { name })?;
        let mut arr: Array<_, Config> =
            Array::try_from(map).map_err(|e| map_err(name, "open", e))?;
        arr.set(0, config, 0).map_err(|e| map_err(name, "set", e))
    }

    /// The underlying aya object (tests use it for `test_run`).
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Loads (once) and returns the tc ingress program.
    pub fn tc_program(&mut self) -> Result<&mut SchedClassifier> {
        self.tc_program_for(TcAttachType::Ingress)
    }

    /// Loads (once) and returns the tc program for a direction.
    pub fn tc_program_for(&mut self, dir: TcAttachType) -> Result<&mut SchedClassifier> {
        let name = match dir {
            TcAttachType::Egress => prog_names::TC_EGRESS,
            _ => prog_names::TC_INGRESS,
        };
        self.loaded(name)
    }

    /// Loads (once) and returns the XDP program.
    pub fn xdp_program(&mut self) -> Result<&mut Xdp> {
        self.loaded(prog_names::XDP_NODEPORT)
    }

    /// Attaches the four socket-LB programs to the cgroup v2 directory `cgroup`.
    pub fn attach_sock_lb(&mut self, cgroup: &Path) -> Result<SockLbAttachment> {
        let file =
            File::open(cgroup).map_err(|source| Error::Cgroup { path: cgroup.into(), source })?;
        let links = SOCK_LB_PROGRAMS
            .into_iter()
            .map(|name| self.attach_sock_lb_program(name, &file))
            .collect::<Result<_>>()?;
        Ok(SockLbAttachment { _links: links })
    }

    /// Loads (once) the socket-LB program `name`, attaches it to the cgroup open as `cgroup`
    /// and takes its link.
    fn attach_sock_lb_program(
        &mut self,
        name: &'static str,
        cgroup: &File,
    ) -> Result<CgroupSockAddrLink> {
        let prog: &mut CgroupSockAddr = self.loaded(name)?;
        let id = prog
            .attach(cgroup, CgroupAttachMode::Single)
            .map_err(|e| prog_err(name, "attach", e))?;
        prog.take_link(id).map_err(|e| prog_err(name, "take link", e))
    }

    /// The program `name` as a `P`, loaded into the kernel on first use.
    fn loaded<P: LoadOnce>(&mut self, name: &'static str) -> Result<&mut P>
    where
        for<'a> &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        let prog: &mut P = self
            .ebpf
            .program_mut(name)
            .ok_or(Error::MissingProgram { name })?
            .try_into()
            .map_err(|e| prog_err(name, "type", e))?;
        prog.load_once().map_err(|e| prog_err(name, "load", e))?;
        Ok(prog)
    }

    /// Attaches the tc program to `iface` in direction `dir` (TCX on kernels >= 6.6).
    pub fn attach_tc(&mut self, iface: &str, dir: TcAttachType) -> Result<TcAttachment> {
        let name = match dir {
            TcAttachType::Egress => prog_names::TC_EGRESS,
            _ => prog_names::TC_INGRESS,
        };
        let prog = self.tc_program_for(dir)?;
        let id = prog.attach(iface, dir).map_err(|e| prog_err(name, "attach", e))?;
        let link = prog.take_link(id).map_err(|e| prog_err(name, "take link", e))?;
        Ok(TcAttachment { _link: link })
    }

    /// Attaches the XDP program to `iface` (native mode first, generic as fallback).
    pub fn attach_xdp(&mut self, iface: &str) -> Result<XdpAttachment> {
        let name = prog_names::XDP_NODEPORT;
        let prog = self.xdp_program()?;
        let id = match prog.attach(iface, XdpMode::Driver) {
            Ok(id) => id,
            Err(_) => prog.attach(iface, XdpMode::Skb).map_err(|e| prog_err(name, "attach", e))?,
        };
        let link = prog.take_link(id).map_err(|e| prog_err(name, "take link", e))?;
        accept_local(iface)?;
        Ok(XdpAttachment { _link: link })
    }

    /// The tc fallback for a node-facing interface where XDP cannot attach: the tc program
    /// on ingress and egress serves NodePort/ExternalIP/LB there (DNAT, SNAT to the node
    /// address and FIB redirect for remote backends, reverse translation of replies).
    pub fn attach_tc_nodeport(&mut self, iface: &str) -> Result<(TcAttachment, TcAttachment)> {
        let ingress = self.attach_tc(iface, TcAttachType::Ingress)?;
        let egress = self.attach_tc(iface, TcAttachType::Egress)?;
        accept_local(iface)?;
        Ok((ingress, egress))
    }
}

/// The socket-LB programs, attached to a cgroup together.
const SOCK_LB_PROGRAMS: [&str; 4] =
    [prog_names::CONNECT4, prog_names::SENDMSG4, prog_names::RECVMSG4, prog_names::GETPEERNAME4];

/// The program types the data plane loads on first use ([`Dataplane::loaded`]).
trait LoadOnce {
    /// Loads the program into the kernel unless it already is.
    fn load_once(&mut self) -> std::result::Result<(), ProgramError>;
}

macro_rules! impl_load_once {
    ($($ty:ty),+) => {$(
        impl LoadOnce for $ty {
            fn load_once(&mut self) -> std::result::Result<(), ProgramError> {
                if self.fd().is_err() {
                    self.load()?;
                }
                Ok(())
            }
        }
    )+};
}

impl_load_once!(SchedClassifier, Xdp, CgroupSockAddr);

/// Remote NodePort flows are SNATed to the node address (in XDP or the tc fallback); when
/// the FIB cannot resolve the next hop yet, the packet goes up the stack with that (local)
/// source, which the stack would drop as martian, and so would it the reverse-translated
/// replies of local backends on the tc fallback. accept_local lets it forward them (and
/// resolve the neighbour for the next ones, which the programs then redirect themselves).
fn accept_local(iface: &str) -> Result<()> {
    let sysctl = PathBuf::from(format!("/proc/sys/net/ipv4/conf/{iface}/accept_local"));
    std::fs::write(&sysctl, "1").map_err(|source| Error::Sysctl { path: sysctl, source })
}

impl Dataplane {
    /// Attaches the socket-LB programs to `cgroup` through links pinned in `link_dir`, so they
    /// stay attached when this process exits (a restart does not interrupt connections).
    /// Links already pinned there by a previous run are kept as they are. Returns how many
    /// links were newly attached. `unpin_links` removes them.
    pub fn attach_sock_lb_pinned(&mut self, cgroup: &Path, link_dir: &Path) -> Result<usize> {
        std::fs::create_dir_all(link_dir)
            .map_err(|source| Error::PinDir { path: link_dir.into(), source })?;
        let file =
            File::open(cgroup).map_err(|source| Error::Cgroup { path: cgroup.into(), source })?;
        let mut attached = 0;
        for name in SOCK_LB_PROGRAMS {
            let pin = link_dir.join(name);
            if PinnedLink::from_pin(&pin).is_ok() {
                continue;
            }
            let link = self.attach_sock_lb_program(name, &file)?;
            let fd_link = FdLink::try_from(link)
                .map_err(|source| Error::LinkConvert { path: pin.clone(), source })?;
            fd_link.pin(&pin).map_err(|source| Error::PinLink { path: pin.clone(), source })?;
            attached += 1;
        }
        Ok(attached)
    }
}

/// Removes the pinned links in `link_dir` (detaching the programs they hold).
pub fn unpin_links(link_dir: &Path) -> Result<usize> {
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(link_dir) else { return Ok(0) };
    for e in entries.flatten() {
        if let Ok(link) = PinnedLink::from_pin(e.path()) {
            link.unpin().map_err(|source| Error::PinDir { path: e.path(), source })?;
            n += 1;
        }
    }
    Ok(n)
}

/// The socket-LB programs attached to a cgroup; detached on drop.
pub struct SockLbAttachment {
    _links: Vec<CgroupSockAddrLink>,
}

/// The tc program attached to one interface and direction; detached on drop.
pub struct TcAttachment {
    _link: SchedClassifierLink,
}

impl TcAttachment {
    /// Pins the link at `path`: it stays attached after this process exits.
    pub fn pin(self, path: &Path) -> Result<()> {
        pin_fd_link(FdLink::try_from(self._link), path)
    }
}

/// The XDP program attached to one interface; detached on drop.
pub struct XdpAttachment {
    _link: XdpLink,
}

impl XdpAttachment {
    /// Pins the link at `path`: it stays attached after this process exits.
    pub fn pin(self, path: &Path) -> Result<()> {
        pin_fd_link(FdLink::try_from(self._link), path)
    }
}

fn pin_fd_link(
    link: std::result::Result<FdLink, aya::programs::links::LinkError>,
    path: &Path,
) -> Result<()> {
    let link = link.map_err(|source| Error::LinkConvert { path: path.into(), source })?;
    link.pin(path).map_err(|source| Error::PinLink { path: path.into(), source })?;
    Ok(())
}

/// Whether a link is pinned (and so attached) at `path`.
pub fn link_pinned(path: &Path) -> bool {
    PinnedLink::from_pin(path).is_ok()
}

fn prog_err(name: &'static str, step: &'static str, e: aya::programs::ProgramError) -> Error {
    Error::Program { name, step, source: Box::new(e) }
}

fn map_err(name: &'static str, step: &'static str, e: aya::maps::MapError) -> Error {
    Error::Map { name, step, source: Box::new(e) }
}

/// The cgroup v2 mount point, from /proc/self/mountinfo (never hard-coded: `/sys/fs/cgroup`
/// on unified hosts, `/sys/fs/cgroup/unified` on hybrid ones).
pub fn cgroup2_root() -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    parse_cgroup2_root(&info).ok_or(Error::NoCgroup2)
}

fn parse_cgroup2_root(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let fstype = post.split_whitespace().next()?;
        (fstype == "cgroup2").then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// Whether `dir` is on a bpffs (the filesystem's magic, so a directory inside a bpffs
/// counts); false when it does not exist.
pub fn on_bpffs(dir: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `path` is NUL-terminated and `st` is a plain struct the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Whether a bpffs is mounted exactly at `dir` (this process's mount namespace).
pub fn bpffs_mounted(dir: &Path) -> Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    Ok(info.lines().any(|l| {
        l.split_once(" - ").is_some_and(|(pre, post)| {
            post.starts_with("bpf ")
                && pre.split_whitespace().nth(4) == Some(&*dir.to_string_lossy())
        })
    }))
}

/// Mounts bpffs at `dir` unless a bpffs is already mounted there.
pub fn ensure_bpffs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::PinDir { path: dir.into(), source })?;
    if bpffs_mounted(dir)? {
        return Ok(());
    }
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default();
    let target = c(dir);
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(c"bpf".as_ptr(), target.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        return Err(Error::MountBpffs {
            path: dir.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Removes the pins of maps in `pin_dir` whose definition (type, key size, value size, max
/// entries, flags) differs from the embedded object's, so that the load creates them anew
/// instead of reusing a map the programs would misread (an upgrade that, e.g., turned the
/// backends hash into an array). Programs still attached keep the old map until they are
/// replaced; the first sync then refills the new one. Returns the names of removed pins.
pub fn unpin_stale_maps(pin_dir: &Path) -> Result<Vec<String>> {
    unpin_stale_maps_sized(pin_dir, &LoadOptions::default().map_sizes()?)
}

/// `unpin_stale_maps` where the loader overrides some maps' `max_entries` (`sizes`).
fn unpin_stale_maps_sized(pin_dir: &Path, sizes: &[(&str, u32)]) -> Result<Vec<String>> {
    let obj = aya_obj::Object::parse(EBPF_OBJECT).map_err(|e| Error::ParseObject(Box::new(e)))?;
    let mut removed = Vec::new();
    for (name, def) in &obj.maps {
        if def.pinning() != aya_obj::maps::PinningType::ByName {
            continue;
        }
        let path = pin_dir.join(name);
        // A pin that cannot be opened is left to the load, which reports it.
        let Ok(info) = aya::maps::MapInfo::from_pin(&path) else { continue };
        let same = info.map_type().is_ok_and(|t| t as u32 == def.map_type())
            && info.key_size() == def.key_size()
            && info.value_size() == def.value_size()
            && info.max_entries()
                == sizes.iter().find(|(n, _)| n == name).map_or(def.max_entries(), |(_, n)| *n)
            && info.map_flags() == def.map_flags();
        if !same {
            std::fs::remove_file(&path).map_err(|source| Error::StalePin { path, source })?;
            removed.push(name.clone());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_mountinfo() {
        let info = "25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro\n\
                    26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(parse_cgroup2_root(info), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(parse_cgroup2_root("1 2 0:1 / / rw - ext4 /dev/x rw\n"), None);
    }
}
