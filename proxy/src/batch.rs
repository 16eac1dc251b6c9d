//! Batched map writes through the bpf(2) syscall (`BPF_MAP_UPDATE_BATCH`): aya 0.14 has no
//! batch API, and one syscall per element is what made a full sync of 10k services slow.
//! A small safe wrapper: typed slices in, the kernel's count of applied elements out.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `enum bpf_cmd` value of `BPF_MAP_UPDATE_BATCH` (uapi/linux/bpf.h, stable ABI).
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The kernel-internal ENOTSUPP (524) that bpf(2) returns for map types without batch ops.
const ENOTSUPP: i32 = 524;

/// The `batch` member of `union bpf_attr` (uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Errors of a batched update.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{keys} keys but {values} values")]
    Mismatch { keys: usize, values: usize },
    #[error("BPF_MAP_LOOKUP_BATCH read {read} of {total} elements")]
    Lookup {
        read: usize,
        total: usize,
        #[source]
        source: io::Error,
    },
    #[error("BPF_MAP_UPDATE_BATCH applied {applied} of {total} elements")]
    Update {
        applied: usize,
        total: usize,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether the kernel or the map type does not support batched updates (then callers
    /// write element by element).
    pub fn unsupported(&self) -> bool {
        matches!(self, Error::Update { applied: 0, source, .. }
            if matches!(source.raw_os_error(), Some(libc::EINVAL | ENOTSUPP | libc::EOPNOTSUPP)))
    }
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Writes `keys[i] → values[i]` for every i in one syscall per `CHUNK` elements, in order.
/// `K` and `V` must be the map's exact key and value types (`aya::Pod`: `repr(C)`, no
/// implicit padding), and the map must not be per-CPU (its values would be arrays).
pub fn update<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<()> {
    /// Elements per syscall: bounds the kernel's work per call (it copies each element in).
    const CHUNK: usize = 16_384;
    if keys.len() != values.len() {
        return Err(Error::Mismatch { keys: keys.len(), values: values.len() });
    }
    let total = keys.len();
    let mut done = 0;
    for (ks, vs) in keys.chunks(CHUNK).zip(values.chunks(CHUNK)) {
        let mut attr = BatchAttr {
            keys: ks.as_ptr() as u64,
            values: vs.as_ptr() as u64,
            count: ks.len() as u32,
            map_fd: map.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr is a valid `bpf_attr.batch` that lives across the call; `keys` and
        // `values` point at `count` contiguous elements of the map's key and value types
        // (the caller's contract above), which the kernel only reads; the kernel writes
        // back only `count` inside attr.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        if rc < 0 {
            let source = io::Error::last_os_error();
            return Err(Error::Update { applied: done + attr.count as usize, total, source });
        }
        done += ks.len();
    }
    Ok(())
}

/// `enum bpf_cmd` value of `BPF_MAP_LOOKUP_BATCH`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Reads every entry of an array map of `len` entries of `V` in one syscall per `CHUNK`
/// entries (`BPF_MAP_LOOKUP_BATCH`, kernel 5.6+) as `(index, value)`. The map must be a
/// plain (not per-CPU) array whose value type is exactly `V`.
pub fn lookup_array<V: aya::Pod + Default>(map: BorrowedFd<'_>, len: u32) -> Result<Vec<(u32, V)>> {
    const CHUNK: u32 = 16_384;
    let mut out: Vec<(u32, V)> = Vec::with_capacity(len as usize);
    let mut keys = vec![0u32; CHUNK as usize];
    let mut values = vec![V::default(); CHUNK as usize];
    let (mut in_batch, mut out_batch) = (0u32, 0u32);
    let mut first = true;
    while (out.len() as u32) < len {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &in_batch as *const u32 as u64 },
            out_batch: &mut out_batch as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK,
            map_fd: map.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr is a valid `bpf_attr.batch` living across the call; `keys` and
        // `values` hold `count` elements of the array's key (u32) and value (`V`, the
        // caller's contract) types, in_batch/out_batch point at u32 batch tokens; the kernel
        // writes at most `count` elements into each, and `count` back into attr.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let got = (attr.count.min(CHUNK)) as usize;
        out.extend(keys[..got].iter().copied().zip(values[..got].iter().copied()));
        match err {
            None => {}
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Some(source) => {
                return Err(Error::Lookup { read: out.len(), total: len as usize, source });
            }
        }
        first = false;
        in_batch = out_batch;
        if got == 0 {
            break;
        }
    }
    Ok(out)
}
