//! The embedded store's write-ahead log: each group commit's transactions are appended to the
//! log and fsynced before they are acknowledged; the memtable holds them until a checkpoint
//! writes them to redb (a durable commit), which makes that part of the log redundant.
//!
//! The log is two files, `DIR/wal.log` and `DIR/wal.1.log`. The writer appends to one; when it
//! freezes the memtable for a checkpoint it switches to the other (whose records the previous
//! checkpoint covered) and starts it over at offset 0, while the checkpoint runs. So the
//! records a running checkpoint has not covered yet are always intact in one file or the
//! other.
//!
//! Record: `magic u32 | payload_len u32 | crc32c(payload) u32 | payload`, with
//! `payload = count u32 | count × (revision i64 | len u32 | events)` and `events` in the
//! history encoding of `embedded::codec`. All little endian.
//!
//! The files are preallocated with zeros (so an append does not change their size and
//! `fdatasync` writes no metadata) and reused from offset 0 without being cleared. Reading a
//! file back therefore stops at the first record that is not intact (zeros, a torn write, a
//! checksum mismatch) or whose revisions do not continue the ones before it: records left
//! from an earlier round have lower revisions than the ones written over them.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{Error, Result, Revision};

/// The log's files inside the data directory (`wal.log` is also what a one-file log of an
/// earlier version left).
pub const WAL_FILES: [&str; 2] = ["wal.log", "wal.1.log"];

const MAGIC: u32 = 0x534b_5741; // "SKWA"
const HEADER: usize = 12;

/// One logged transaction: its revision and its events (history encoding).
#[derive(Debug, Clone)]
pub(crate) struct WalTxn {
    pub revision: Revision,
    pub events: Bytes,
}

struct Segment {
    file: File,
    path: PathBuf,
}

impl Segment {
    fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::backend(format!("fsync {}", self.path.display()), e))
    }
}

pub(crate) struct Wal {
    segments: [Segment; 2],
    /// The file appended to.
    current: usize,
    /// Where the next record goes in it.
    end: u64,
    /// The record being written, kept between writes: a batch's record is often over 100 KB,
    /// and a fresh allocation that large costs a page fault per 4 KiB.
    record: Vec<u8>,
}

impl Wal {
    /// Open (creating and preallocating `prealloc` bytes where absent) the log's files in `dir`
    /// and return the intact records of both, in revision order. Appends go to the first file
    /// from its start: call [`Wal::clear`] once the records returned are durable elsewhere.
    pub fn open(dir: &Path, prealloc: u64) -> Result<(Wal, Vec<WalTxn>)> {
        let mut txns = Vec::new();
        let [first, second] = WAL_FILES.map(|name| open_segment(&dir.join(name), prealloc));
        let segments = [first?, second?];
        for segment in &segments {
            let mut content = Vec::new();
            (&segment.file).read_to_end(&mut content).map_err(|e| {
                Error::backend(format!("read write-ahead log {}", segment.path.display()), e)
            })?;
            txns.extend(parse(&content));
        }
        txns.sort_by_key(|txn| txn.revision);
        Ok((Wal { segments, current: 0, end: 0, record: Vec::new() }, txns))
    }

    /// Everything the log holds is durable elsewhere: make both files read back empty (a
    /// record left in one could otherwise be taken for a later one of the same revision).
    pub fn clear(&mut self) -> Result<()> {
        for segment in &self.segments {
            segment.file.write_all_at(&[0; HEADER], 0).map_err(|e| {
                Error::backend(format!("clear write-ahead log {}", segment.path.display()), e)
            })?;
            segment.sync()?;
        }
        self.current = 0;
        self.end = 0;
        Ok(())
    }

    /// Append one record holding `txns` and wait until it is on disk.
    #[cfg(test)]
    pub fn append(&mut self, txns: &[(Revision, &[u8])]) -> Result<()> {
        self.write(txns, |(revision, events), out| {
            out.extend_from_slice(events);
            *revision
        })?;
        self.sync()
    }

    /// Write one record holding `txns` after the last one, without waiting for the disk: the
    /// record is durable once [`Wal::sync`] returns. `encode` appends a transaction's events
    /// to the record and returns its revision.
    pub fn write<T>(
        &mut self,
        txns: &[T],
        mut encode: impl FnMut(&T, &mut Vec<u8>) -> Revision,
    ) -> Result<()> {
        let record = &mut self.record;
        record.clear();
        record.extend_from_slice(&MAGIC.to_le_bytes());
        record.extend_from_slice(&[0; 8]); // payload length and checksum, below
        record.extend_from_slice(&(txns.len() as u32).to_le_bytes());
        for txn in txns {
            let at = record.len();
            record.extend_from_slice(&[0; 12]); // revision and length, below
            let revision = encode(txn, record);
            let len = (record.len() - at - 12) as u32;
            record[at..at + 8].copy_from_slice(&revision.to_le_bytes());
            record[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
        }
        let payload_len = (record.len() - HEADER) as u32;
        let crc = crc32c(&record[HEADER..]);
        record[4..8].copy_from_slice(&payload_len.to_le_bytes());
        record[8..12].copy_from_slice(&crc.to_le_bytes());
        let segment = &self.segments[self.current];
        segment
            .file
            .write_all_at(record, self.end)
            .map_err(|e| Error::backend(format!("append to {}", segment.path.display()), e))?;
        self.end += record.len() as u64;
        Ok(())
    }

    /// Make every record written to the current file durable (one `fdatasync`).
    pub fn sync(&self) -> Result<()> {
        self.segments[self.current].sync()
    }

    /// Bytes appended to the current file since it was started.
    pub fn len(&self) -> u64 {
        self.end
    }

    /// Append to the other file from its start on. Only once every record in it is durable
    /// elsewhere (the checkpoint that covers them has committed).
    pub fn switch(&mut self) {
        self.current = 1 - self.current;
        self.end = 0;
    }
}

fn open_segment(path: &Path, prealloc: u64) -> Result<Segment> {
    let context = |what: &str| format!("{what} {}", path.display());
    let exists = path.exists();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::backend(context("open write-ahead log"), e))?;
    if !exists {
        preallocate(&mut file, prealloc)
            .map_err(|e| Error::backend(context("preallocate write-ahead log"), e))?;
        // The new file's directory entry must be durable too.
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::backend(context("sync directory of"), e))?;
        }
    }
    Ok(Segment { file, path: path.to_owned() })
}

fn preallocate(file: &mut File, bytes: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut written = 0;
    while written < bytes {
        let n = zeros.len().min((bytes - written) as usize);
        file.write_all(&zeros[..n])?;
        written += n as u64;
    }
    file.sync_all()
}

/// The intact records at the start of `content`, flattened, with revisions strictly
/// increasing by one from the first record on (stale records end the log).
fn parse(content: &[u8]) -> Vec<WalTxn> {
    let mut txns: Vec<WalTxn> = Vec::new();
    let mut offset = 0usize;
    'records: while let Some(header) = content.get(offset..offset + HEADER) {
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        if word(0) != MAGIC {
            break;
        }
        let len = word(4) as usize;
        let Some(payload) = content.get(offset + HEADER..offset + HEADER + len) else { break };
        if crc32c(payload) != word(8) {
            break;
        }
        let Some(record) = parse_payload(payload) else { break };
        for txn in record {
            match txns.last() {
                Some(last) if txn.revision != last.revision + 1 => break 'records,
                _ => txns.push(txn),
            }
        }
        offset += HEADER + len;
    }
    txns
}

fn parse_payload(payload: &[u8]) -> Option<Vec<WalTxn>> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let out = payload.get(at..at.checked_add(n)?)?;
        at += n;
        Some(out)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?);
    let mut txns = Vec::with_capacity(count.min(4096) as usize);
    for _ in 0..count {
        let revision = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let events = Bytes::copy_from_slice(take(len)?);
        txns.push(WalTxn { revision, events });
    }
    (at == payload.len()).then_some(txns)
}

/// CRC-32C (Castagnoli) of everything the log writes, so on the commit path: with the
/// CPU's `crc32` instruction (SSE4.2, eight bytes per instruction) where it has one.
fn crc32c(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { crc32c_sse42(data) };
    }
    crc32c_table(data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc32c_sse42(data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let mut chunks = data.chunks_exact(8);
    let mut crc = u64::from(!0u32);
    for c in &mut chunks {
        crc = _mm_crc32_u64(
            crc,
            u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
        );
    }
    // The instruction leaves the CRC in the low 32 bits.
    let mut crc = crc as u32;
    for &b in chunks.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

/// CRC-32C, slicing by 8: eight table lookups per 8 bytes instead of one per byte.
fn crc32c_table(data: &[u8]) -> u32 {
    const TABLES: [[u32; 256]; 8] = {
        let mut t = [[0u32; 256]; 8];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0x82f6_3b78 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            t[0][i] = c;
            i += 1;
        }
        let mut s = 1;
        while s < 8 {
            let mut i = 0;
            while i < 256 {
                let prev = t[s - 1][i];
                t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
                i += 1;
            }
            s += 1;
        }
        t
    };
    let byte = |crc: u32, b: u8| TABLES[0][((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        crc = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][(hi & 0xff) as usize]
            ^ TABLES[2][((hi >> 8) & 0xff) as usize]
            ^ TABLES[1][((hi >> 16) & 0xff) as usize]
            ^ TABLES[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        crc = byte(crc, b);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_instruction_and_tables_agree() {
        let data: Vec<u8> =
            (0u32..4099).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in (0..64).chain([255, 256, 257, 1024, 4095, 4096, 4099]) {
            for start in [0, 1, 3, 7] {
                let slice = &data[start.min(len)..len];
                assert_eq!(crc32c(slice), crc32c_table(slice), "len {len} start {start}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        assert!(std::arch::is_x86_feature_detected!("sse4.2"), "CI machines have SSE4.2");
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 B.4: 32 bytes of zeros, of 0xff, and ascending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46dd_794e);
    }

    #[test]
    fn records_round_trip_stop_at_damage_and_skip_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WAL_FILES[0]);
        let (mut wal, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert!(txns.is_empty());
        wal.append(&[(1, b"a"), (2, b"bb")]).unwrap();
        wal.append(&[(3, b"ccc")]).unwrap();
        wal.append(&[(4, b"dddd")]).unwrap();
        drop(wal);
        let (mut wal, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert_eq!(txns.iter().map(|t| t.revision).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(&txns[3].events[..], b"dddd");

        // The second file continues the first; both are read back, in revision order.
        wal.switch();
        wal.append(&[(5, b"e"), (6, b"f")]).unwrap();
        drop(wal);
        let (mut wal, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert_eq!(txns.iter().map(|t| t.revision).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);

        // Started over, a new shorter record overwrites the first file's start; what follows
        // it there is stale.
        wal.append(&[(7, b"g")]).unwrap();
        drop(wal);
        let (mut wal, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert_eq!(txns.iter().map(|t| t.revision).collect::<Vec<_>>(), [5, 6, 7]);

        // Cleared, both files read back empty.
        wal.clear().unwrap();
        drop(wal);
        let (mut wal, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert!(txns.is_empty());

        // A damaged byte ends a file at the damaged record.
        wal.append(&[(8, b"h")]).unwrap();
        drop(wal);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 6] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (_, txns) = Wal::open(dir.path(), 64 << 10).unwrap();
        assert!(txns.is_empty());
        assert!(parse(&[0xff; 100]).is_empty());
        assert!(parse(&[]).is_empty());
    }
}
