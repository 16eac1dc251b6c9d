//! Reads what the data plane needs from the running kernel's BTF (`/sys/kernel/btf/vmlinux`):
//! the position of `struct sk_buff`'s `ip_summed` bit field, which the tc program reads to
//! update L4 checksums itself instead of calling a kernel helper per field, and the BTF id
//! of the `bpf_cast_to_kern_ctx` kfunc it reads it through.
//!
//! A small reader of the BTF wire format (`include/uapi/linux/btf.h`): aya-obj parses BTF
//! but keeps its type accessors private.

use std::path::{Path, PathBuf};

/// The kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Marks a known position in the value handed to the tc program (`SKIFF_SKB_IP_SUMMED`).
pub const IP_SUMMED_KNOWN: u32 = 1 << 31;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("BTF header: {0}")]
    Header(&'static str),
    #[error("BTF type {index}: {what}")]
    Type { index: u32, what: &'static str },
    #[error("no function {0} in this kernel's BTF")]
    FuncMissing(&'static str),
    #[error("struct {strukt} has no member {member} in this kernel's BTF")]
    MemberMissing { strukt: &'static str, member: &'static str },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bit field's place in a struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitPosition {
    /// Offset of the byte holding the field.
    pub byte: u32,
    /// Shift of the field's lowest bit inside that byte (little-endian bit order).
    pub shift: u32,
    /// Width in bits.
    pub bits: u32,
}

impl BitPosition {
    /// The value of the tc program's `SKIFF_SKB_IP_SUMMED` global.
    pub fn encode(self) -> u32 {
        IP_SUMMED_KNOWN | (self.byte & 0xffff) << 8 | (self.shift & 0x7)
    }
}

/// What the tc program needs to know about the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcKernelFacts {
    /// Where `sk_buff.ip_summed` is.
    pub ip_summed: BitPosition,
    /// BTF id of the `bpf_cast_to_kern_ctx` kfunc.
    pub cast_to_kern_ctx: u32,
}

/// The running kernel's facts.
pub fn tc_facts() -> Result<TcKernelFacts> {
    tc_facts_in(Path::new(VMLINUX_BTF))
}

/// The facts according to the BTF file `path`.
pub fn tc_facts_in(path: &Path) -> Result<TcKernelFacts> {
    let data = std::fs::read(path).map_err(|source| Error::Read { path: path.into(), source })?;
    let btf = Btf::parse(&data)?;
    let pos = btf.member_bits("sk_buff", "ip_summed")?;
    if pos.bits == 0 || pos.bits > 8 || (pos.bit % 8) + pos.bits > 8 {
        return Err(Error::MemberMissing { strukt: "sk_buff", member: "ip_summed" });
    }
    let ip_summed = BitPosition { byte: pos.bit / 8, shift: pos.bit % 8, bits: pos.bits };
    let cast_to_kern_ctx = btf.func_id("bpf_cast_to_kern_ctx")?;
    Ok(TcKernelFacts { ip_summed, cast_to_kern_ctx })
}

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One type record: its header and where its trailing data starts.
#[derive(Clone, Copy)]
struct TypeRec {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    extra: usize,
}

impl TypeRec {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
    fn kind_flag(&self) -> bool {
        self.info >> 31 != 0
    }
}

/// A member's absolute bit offset and width (0 = not a bit field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MemberBits {
    bit: u32,
    bits: u32,
}

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Type id (1-based) - 1 → record.
    recs: Vec<TypeRec>,
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self> {
        let magic = data.get(0..2).ok_or(Error::Header("truncated"))?;
        if magic != [0x9f, 0xeb] {
            return Err(Error::Header("not little-endian BTF (bad magic)"));
        }
        let field = |off| u32_at(data, off).ok_or(Error::Header("truncated"));
        let hdr_len = field(4)? as usize;
        let (type_off, type_len) = (field(8)? as usize, field(12)? as usize);
        let (str_off, str_len) = (field(16)? as usize, field(20)? as usize);
        let types = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(Error::Header("type section out of bounds"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(Error::Header("string section out of bounds"))?;
        let mut recs = Vec::new();
        let mut off = 0;
        while off < types.len() {
            let index = recs.len() as u32 + 1;
            let bad = |what| Error::Type { index, what };
            let rec = TypeRec {
                name_off: u32_at(types, off).ok_or(bad("truncated"))?,
                info: u32_at(types, off + 4).ok_or(bad("truncated"))?,
                size_or_type: u32_at(types, off + 8).ok_or(bad("truncated"))?,
                extra: off + 12,
            };
            let extra = match rec.kind() {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => rec.vlen() * 12,
                KIND_ENUM | KIND_FUNC_PROTO => rec.vlen() * 8,
                0..=19 => 0,
                _ => return Err(bad("unknown kind")),
            };
            off = rec.extra + extra;
            if off > types.len() {
                return Err(bad("truncated"));
            }
            recs.push(rec);
        }
        Ok(Self { types, strings, recs })
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    fn rec(&self, id: u32) -> Option<&TypeRec> {
        id.checked_sub(1).and_then(|i| self.recs.get(i as usize))
    }

    /// The struct or union a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<&TypeRec> {
        for _ in 0..16 {
            let r = self.rec(id)?;
            match r.kind() {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_TYPE_TAG => id = r.size_or_type,
                _ => return Some(r),
            }
        }
        None
    }

    /// Finds `member` in `rec` (a struct/union), descending into anonymous members.
    fn find(&self, rec: &TypeRec, member: &[u8], base: u32, depth: u32) -> Option<MemberBits> {
        if depth > 8 {
            return None;
        }
        for i in 0..rec.vlen() {
            let m = rec.extra + i * 12;
            let (name_off, ty, offset) =
                (u32_at(self.types, m)?, u32_at(self.types, m + 4)?, u32_at(self.types, m + 8)?);
            let (bit, bits) =
                if rec.kind_flag() { (offset & 0x00ff_ffff, offset >> 24) } else { (offset, 0) };
            let name = self.name(name_off);
            if name == member {
                return Some(MemberBits { bit: base + bit, bits });
            }
            if name.is_empty()
                && let Some(inner) = self.resolve(ty)
                && matches!(inner.kind(), KIND_STRUCT | KIND_UNION)
                && let Some(found) = self.find(inner, member, base + bit, depth + 1)
            {
                return Some(found);
            }
        }
        None
    }

    /// The type id of function `name`.
    fn func_id(&self, name: &'static str) -> Result<u32> {
        self.recs
            .iter()
            .position(|r| r.kind() == KIND_FUNC && self.name(r.name_off) == name.as_bytes())
            .map(|i| i as u32 + 1)
            .ok_or(Error::FuncMissing(name))
    }

    fn member_bits(&self, strukt: &'static str, member: &'static str) -> Result<MemberBits> {
        self.recs
            .iter()
            .filter(|r| r.kind() == KIND_STRUCT && self.name(r.name_off) == strukt.as_bytes())
            .find_map(|r| self.find(r, member.as_bytes(), 0, 0))
            .ok_or(Error::MemberMissing { strukt, member })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_ip_summed_and_the_kfunc_in_the_running_kernel() {
        let facts = tc_facts().expect("kernel BTF with sk_buff.ip_summed");
        assert!(facts.cast_to_kern_ctx > 0);
        let pos = facts.ip_summed;
        assert_eq!(pos.bits, 2, "ip_summed is a 2-bit field");
        // sk_buff is a few hundred bytes; ip_summed sits in its header flags.
        assert!(pos.byte > 64 && pos.byte < 256, "implausible offset {pos:?}");
        assert_eq!(pos.encode() & IP_SUMMED_KNOWN, IP_SUMMED_KNOWN);
    }

    #[test]
    fn rejects_non_btf() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x");
        std::fs::write(&p, b"not btf at all, just some bytes").expect("write");
        assert!(matches!(tc_facts_in(&p), Err(Error::Header(_))));
    }
}

/// The instruction the tc program emits for its kfunc call (`call`, src_reg
/// BPF_PSEUDO_KFUNC_CALL, imm = `KFUNC_PLACEHOLDER`), as bytes in the object.
fn kfunc_placeholder() -> [u8; 8] {
    let imm = skiff_ebpf_common::KFUNC_PLACEHOLDER.to_le_bytes();
    [0x85, 0x20, 0, 0, imm[0], imm[1], imm[2], imm[3]]
}

/// A copy of the eBPF object `obj` with its kfunc calls resolved: the placeholder id becomes
/// `btf_id`; with `None` (no kernel BTF) each call becomes `r0 = 0` (the program then never
/// takes the path that uses it: its `SKIFF_SKB_IP_SUMMED` is 0). Returns the copy and the
/// number of calls patched.
pub fn resolve_kfunc_calls(obj: &[u8], btf_id: Option<u32>) -> (Vec<u8>, usize) {
    let pattern = kfunc_placeholder();
    let replacement = match btf_id {
        Some(id) => {
            let imm = id.to_le_bytes();
            [0x85, 0x20, 0, 0, imm[0], imm[1], imm[2], imm[3]]
        }
        // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm 0.
        None => [0xb7, 0, 0, 0, 0, 0, 0, 0],
    };
    let mut out = obj.to_vec();
    let mut n = 0;
    let mut i = 0;
    while i + 8 <= out.len() {
        if out[i..i + 8] == pattern {
            out[i..i + 8].copy_from_slice(&replacement);
            n += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    (out, n)
}

#[cfg(test)]
mod patch_tests {
    use super::*;

    #[test]
    fn kfunc_placeholders_are_replaced_and_nothing_else() {
        let mut obj = vec![0x11u8; 5];
        obj.extend(kfunc_placeholder());
        obj.extend([0x85, 0, 0, 0, 1, 0, 0, 0]);
        obj.extend(kfunc_placeholder());
        let (patched, n) = resolve_kfunc_calls(&obj, Some(0x0102_0304));
        assert_eq!(n, 2);
        assert_eq!(&patched[5..13], &[0x85, 0x20, 0, 0, 4, 3, 2, 1]);
        assert_eq!(&patched[13..21], &obj[13..21], "a helper call stays");
        assert_eq!(&patched[21..29], &[0x85, 0x20, 0, 0, 4, 3, 2, 1]);
        let (patched, n) = resolve_kfunc_calls(&obj, None);
        assert_eq!(n, 2);
        assert_eq!(&patched[5..13], &[0xb7, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn the_embedded_object_has_kfunc_calls_to_resolve() {
        let (_, n) = resolve_kfunc_calls(crate::loader::EBPF_OBJECT, Some(1));
        assert!(n > 0, "the tc programs read ip_summed through bpf_cast_to_kern_ctx");
    }
}
