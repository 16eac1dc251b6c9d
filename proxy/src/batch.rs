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
