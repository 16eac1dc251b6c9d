//! The server side of WebSocket framing (RFC 6455) after the HTTP upgrade: reads the
//! client's masked frames into messages, writes unmasked frames. No extensions.

use tokio::io::{AsyncRead, AsyncReadExt};

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xa;

/// Messages larger than this end the connection.
const MAX_MESSAGE: usize = 16 << 20;

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    use base64::Engine;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key.trim().as_bytes());
    ctx.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref())
}

/// A whole message (data frames joined) or a control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub opcode: u8,
    pub data: Vec<u8>,
}

/// Reads messages, joining fragments; control frames come out as they arrive.
#[derive(Debug, Default)]
pub struct Reader {
    partial: Option<Message>,
}

fn invalid(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

impl Reader {
    /// The next message; `Ok(None)` at the end of the connection.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
    ) -> std::io::Result<Option<Message>> {
        loop {
            let mut head = [0u8; 2];
            match r.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e),
            }
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    r.read_exact(&mut b).await?;
                    u16::from_be_bytes(b) as u64
                }
                127 => {
                    let mut b = [0u8; 8];
                    r.read_exact(&mut b).await?;
                    u64::from_be_bytes(b)
                }
                n => n as u64,
            };
            if len > MAX_MESSAGE as u64 {
                return Err(invalid("WebSocket frame too large"));
            }
            let mut mask = [0u8; 4];
            if masked {
                r.read_exact(&mut mask).await?;
            }
            let mut data = vec![0u8; len as usize];
            r.read_exact(&mut data).await?;
            if masked {
                for (i, b) in data.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            match opcode {
                OP_CLOSE | OP_PING | OP_PONG => return Ok(Some(Message { opcode, data })),
                OP_TEXT | OP_BINARY => {
                    if fin {
                        return Ok(Some(Message { opcode, data }));
                    }
                    self.partial = Some(Message { opcode, data });
                }
                OP_CONTINUATION => {
                    let Some(mut m) = self.partial.take() else {
                        return Err(invalid("WebSocket continuation without a message"));
                    };
                    if m.data.len() + data.len() > MAX_MESSAGE {
                        return Err(invalid("WebSocket message too large"));
                    }
                    m.data.extend_from_slice(&data);
                    if fin {
                        return Ok(Some(m));
                    }
                    self.partial = Some(m);
                }
                _ => return Err(invalid("unknown WebSocket opcode")),
            }
        }
    }
}

/// One unmasked frame with FIN set.
pub fn frame(opcode: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 10);
    out.push(0x80 | opcode);
    match data.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(data);
    out
}

/// A close frame with a status code.
pub fn close(code: u16) -> Vec<u8> {
    frame(OP_CLOSE, &code.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(first: u8, data: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![first, 0x80 | data.len() as u8];
        out.extend_from_slice(&mask);
        out.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn accept_key_of_the_rfc() {
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[tokio::test]
    async fn reads_fragmented_and_control_frames() {
        let mut wire = masked(OP_BINARY, b"\x00he"); // not FIN
        wire.extend(masked(0x80 | OP_PING, b"p"));
        wire.extend(masked(0x80 | OP_CONTINUATION, b"llo"));
        let mut r = &wire[..];
        let mut reader = Reader::default();
        assert_eq!(
            reader.next(&mut r).await.unwrap(),
            Some(Message { opcode: OP_PING, data: b"p".to_vec() })
        );
        assert_eq!(
            reader.next(&mut r).await.unwrap(),
            Some(Message { opcode: OP_BINARY, data: b"\x00hello".to_vec() })
        );
        assert_eq!(reader.next(&mut r).await.unwrap(), None);
    }

    #[tokio::test]
    async fn writes_lengths() {
        for n in [0usize, 125, 126, 65535, 65536] {
            let f = frame(OP_BINARY, &vec![7u8; n]);
            let m = Reader::default().next(&mut &f[..]).await.unwrap().unwrap();
            assert_eq!(m.data.len(), n);
        }
    }
}
