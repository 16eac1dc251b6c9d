//! A minimal SPDY/3.1 client codec, enough to drive a Kubernetes remote-command stream
//! server (containerd's): client-initiated streams (SYN_STREAM with a `streamtype` header),
//! DATA with FIN for half-closes, PING answered, everything else read and skipped.
//!
//! Header blocks must be a zlib stream (SPDY/3 compresses them with a preset dictionary).
//! A zlib stream made of *stored* deflate blocks, each frame's ending in a sync flush (an
//! empty stored block), is valid for any inflater and needs no compressor: the dictionary is only a back-reference source, and
//! stored blocks never refer back. Received header blocks (SYN_REPLY) are skipped unread.

use tokio::io::{AsyncRead, AsyncReadExt};

pub const VERSION: u16 = 3;
const CONTROL: u8 = 0x80;
pub const FLAG_FIN: u8 = 0x01;

pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;

/// Frames larger than this are refused (containerd's are at most 32 KiB of data).
const MAX_FRAME: usize = 16 << 20;

/// One frame as read from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// A control frame: its type, flags and raw payload.
    Control {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
}

impl Frame {
    /// The stream id a control frame names (SYN_REPLY, RST_STREAM), if any.
    pub fn control_stream(&self) -> Option<u32> {
        match self {
            Frame::Control { kind: SYN_REPLY | RST_STREAM, payload, .. } if payload.len() >= 4 => {
                Some(
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                        & 0x7fff_ffff,
                )
            }
            _ => None,
        }
    }
}

/// Read one frame; `Ok(None)` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("SPDY frame of {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    if head[0] & CONTROL != 0 {
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("SPDY version {version}"),
            ));
        }
        Ok(Some(Frame::Control { kind: u16::from_be_bytes([head[2], head[3]]), flags, payload }))
    } else {
        let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
        Ok(Some(Frame::Data { stream, fin: flags & FLAG_FIN != 0, data: payload }))
    }
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    out
}

/// A DATA frame (`fin` half-closes the stream).
pub fn data(stream: u32, fin: bool, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + data.len());
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.push(if fin { FLAG_FIN } else { 0 });
    out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(data);
    out
}

/// A PING frame (the answer to a server's ping echoes its payload).
pub fn ping(payload: &[u8]) -> Vec<u8> {
    control(PING, 0, payload)
}

/// GOAWAY naming the last stream seen from the server (none: 0), status OK.
pub fn goaway() -> Vec<u8> {
    control(GOAWAY, 0, &[0, 0, 0, 0, 0, 0, 0, 0])
}

/// Encodes header blocks as one zlib stream of stored blocks (see the module docs).
#[derive(Debug, Default)]
pub struct HeaderEncoder {
    started: bool,
}

impl HeaderEncoder {
    /// The (zlib-framed) header block for these name/value pairs; names must be lowercase.
    pub fn encode(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            raw.extend_from_slice(&(name.len() as u32).to_be_bytes());
            raw.extend_from_slice(name.as_bytes());
            raw.extend_from_slice(&(value.len() as u32).to_be_bytes());
            raw.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.started {
            // CMF: deflate, 32 KiB window; FLG: no preset dictionary, check bits.
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        for chunk in raw.chunks(0xffff) {
            let len = chunk.len() as u16;
            // BFINAL=0, BTYPE=00 (stored), then LEN and its complement, little endian.
            out.push(0x00);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // A sync flush: an empty stored block. Inflaters (Go's) hand out what they have
        // when they reach it, instead of reading past the frame for the next block header.
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        out
    }

    /// A SYN_STREAM opening client stream `stream` with these headers.
    pub fn syn_stream(&mut self, stream: u32, headers: &[(&str, &str)], fin: bool) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes()); // associated stream
        payload.push(0); // priority 0 (highest), unused bits
        payload.push(0); // slot
        payload.extend_from_slice(&self.encode(headers));
        control(SYN_STREAM, if fin { FLAG_FIN } else { 0 }, &payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inflate a zlib stream made only of stored blocks (what the encoder writes).
    fn inflate_stored(mut z: &[u8], header: bool) -> Vec<u8> {
        if header {
            assert_eq!(((z[0] as u16) << 8 | z[1] as u16) % 31, 0, "zlib header check bits");
            assert_eq!(z[0] & 0x0f, 8, "deflate");
            z = &z[2..];
        }
        let mut out = Vec::new();
        assert!(z.ends_with(&[0, 0, 0, 0xff, 0xff]), "a sync flush ends each block");
        while !z.is_empty() {
            assert_eq!(z[0], 0, "a stored, non-final block");
            let len = u16::from_le_bytes([z[1], z[2]]);
            assert_eq!(!len, u16::from_le_bytes([z[3], z[4]]));
            out.extend_from_slice(&z[5..5 + len as usize]);
            z = &z[5 + len as usize..];
        }
        out
    }

    #[test]
    fn header_blocks() {
        let mut enc = HeaderEncoder::default();
        let first = enc.encode(&[("streamtype", "error")]);
        let raw = inflate_stored(&first, true);
        let mut want = vec![0, 0, 0, 1, 0, 0, 0, 10];
        want.extend_from_slice(b"streamtype");
        want.extend_from_slice(&[0, 0, 0, 5]);
        want.extend_from_slice(b"error");
        assert_eq!(raw, want);
        // Later blocks continue the same stream: no second zlib header.
        let second = enc.encode(&[("streamtype", "stdout")]);
        assert_eq!(inflate_stored(&second, false).len(), 4 + 4 + 10 + 4 + 6);
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let mut enc = HeaderEncoder::default();
        let mut wire = enc.syn_stream(3, &[("streamtype", "stdin")], false);
        wire.extend(data(3, true, b"abc"));
        wire.extend(ping(&[0, 0, 0, 2]));
        let mut r = &wire[..];
        match read_frame(&mut r).await.unwrap().unwrap() {
            Frame::Control { kind: SYN_STREAM, flags: 0, payload } => {
                assert_eq!(&payload[..4], &[0, 0, 0, 3]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read_frame(&mut r).await.unwrap().unwrap(),
            Frame::Data { stream: 3, fin: true, data: b"abc".to_vec() }
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap().unwrap(),
            Frame::Control { kind: PING, flags: 0, payload: vec![0, 0, 0, 2] }
        );
        assert_eq!(read_frame(&mut r).await.unwrap(), None);
        let reply = control(SYN_REPLY, 0, &[0, 0, 0, 5, 1, 2]);
        let f = read_frame(&mut &reply[..]).await.unwrap().unwrap();
        assert_eq!(f.control_stream(), Some(5));
    }
}
