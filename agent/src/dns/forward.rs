//! Forwarding of names outside the cluster zone to upstream resolvers (the node's
//! resolv.conf nameservers, or configured ones), with a bounded answer cache.
//!
//! Each forwarded query leaves from a fresh UDP socket (random source port) with a random
//! ID, and only a reply from that upstream with the same ID and question is accepted; a
//! truncated reply is retried over TCP. Upstreams are tried in order until one answers
//! with anything but SERVFAIL/REFUSED.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tracing::debug;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading upstream resolvers from {path}")]
    ReadResolvConf {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("socket I/O with upstream {upstream}")]
    Io {
        upstream: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer from upstream {upstream} within {timeout:?}")]
    Timeout { upstream: SocketAddr, timeout: Duration },
    #[error("encoding the query for {upstream}")]
    Encode {
        upstream: SocketAddr,
        #[source]
        source: hickory_proto::ProtoError,
    },
    #[error("decoding the TCP answer of {upstream}")]
    Decode {
        upstream: SocketAddr,
        #[source]
        source: hickory_proto::serialize::binary::DecodeError,
    },
    #[error("upstream {upstream} answered another question over TCP")]
    Mismatch { upstream: SocketAddr },
}

/// The `nameserver` lines of a resolv.conf (port 53), in order.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then_some(())?;
            // `fe80::1%eth0`: the zone index is not part of the address.
            let addr = words.next()?.split('%').next()?;
            Some(SocketAddr::new(addr.parse::<IpAddr>().ok()?, 53))
        })
        .collect()
}

/// The nameservers of the resolv.conf at `path` (the node's `/etc/resolv.conf`).
pub fn upstreams_from_resolv_conf(path: &Path) -> Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::ReadResolvConf { path: path.into(), source })?;
    Ok(parse_resolv_conf(&text))
}

/// UDP payload we offer upstreams (the DNS flag day 2020 value).
const UPSTREAM_PAYLOAD: u16 = 1232;

type CacheKey = (Name, RecordType, DNSClass);

struct Cached {
    response: Message,
    stored: Instant,
    ttl: u32,
}

/// Answers by question, at most `capacity` of them; an insert into a full cache drops
/// expired entries, then the soonest-expiring of a few sampled ones.
struct AnswerCache {
    map: HashMap<CacheKey, Cached>,
    capacity: usize,
}

impl AnswerCache {
    fn get(&mut self, key: &CacheKey, now: Instant) -> Option<Message> {
        let entry = self.map.get(key)?;
        let age = u32::try_from(now.duration_since(entry.stored).as_secs()).unwrap_or(u32::MAX);
        if age >= entry.ttl {
            self.map.remove(key);
            return None;
        }
        let mut msg = entry.response.clone();
        for r in msg
            .answers
            .iter_mut()
            .chain(msg.authorities.iter_mut())
            .chain(msg.additionals.iter_mut())
        {
            r.decrement_ttl(age);
        }
        Some(msg)
    }

    fn insert(&mut self, key: CacheKey, response: Message, ttl: u32, now: Instant) {
        if self.capacity == 0 || ttl == 0 {
            return;
        }
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            self.map.retain(|_, c| now.duration_since(c.stored).as_secs() < u64::from(c.ttl));
            if self.map.len() >= self.capacity {
                let victim = self
                    .map
                    .iter()
                    .take(8)
                    .min_by_key(|(_, c)| c.stored + Duration::from_secs(c.ttl.into()))
                    .map(|(k, _)| k.clone());
                if let Some(k) = victim {
                    self.map.remove(&k);
                }
            }
        }
        self.map.insert(key, Cached { response, stored: now, ttl });
    }
}

/// How long a response may be cached: the smallest answer TTL, or for NXDOMAIN/NODATA the
/// SOA's negative TTL (RFC 2308); never longer than `cap`; 0 (not cached) for failures.
fn cache_ttl(msg: &Message, cap: u32) -> u32 {
    let ttl = match msg.metadata.response_code {
        ResponseCode::NoError if !msg.answers.is_empty() => msg.answers.iter().map(|r| r.ttl).min(),
        ResponseCode::NoError | ResponseCode::NXDomain => {
            msg.authorities.iter().find_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
        }
        _ => None,
    };
    if msg.metadata.truncation {
        return 0;
    }
    ttl.unwrap_or(0).min(cap)
}

/// Forwards questions to upstream resolvers, with a bounded cache.
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    max_ttl: u32,
    cache: Mutex<AnswerCache>,
}

impl Forwarder {
    pub fn new(
        upstreams: Vec<SocketAddr>,
        timeout: Duration,
        cache_entries: usize,
        max_ttl: Duration,
    ) -> Self {
        Forwarder {
            upstreams,
            timeout,
            max_ttl: u32::try_from(max_ttl.as_secs()).unwrap_or(u32::MAX),
            cache: Mutex::new(AnswerCache { map: HashMap::new(), capacity: cache_entries }),
        }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Entries in the answer cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }

    /// The upstream answer to `query` (ID and EDNS are the caller's to set): from the cache,
    /// else from the first upstream that answers; REFUSED when there is no upstream,
    /// SERVFAIL when none answered.
    pub async fn resolve(&self, query: &Query) -> Message {
        let key = (query.name().to_lowercase(), query.query_type(), query.query_class());
        if let Some(hit) =
            self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key, Instant::now())
        {
            return hit;
        }
        if self.upstreams.is_empty() {
            return failure(query, ResponseCode::Refused);
        }
        let mut last: Option<Message> = None;
        for &upstream in &self.upstreams {
            match self.exchange(upstream, query).await {
                Ok(msg)
                    if matches!(
                        msg.metadata.response_code,
                        ResponseCode::ServFail | ResponseCode::Refused
                    ) =>
                {
                    debug!(%upstream, rcode = ?msg.metadata.response_code, "upstream failed the query");
                    last = Some(msg);
                }
                Ok(msg) => {
                    let ttl = cache_ttl(&msg, self.max_ttl);
                    self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        key,
                        msg.clone(),
                        ttl,
                        Instant::now(),
                    );
                    return msg;
                }
                Err(e) => debug!(error = %e, "forwarding failed"),
            }
        }
        last.unwrap_or_else(|| failure(query, ResponseCode::ServFail))
    }

    async fn exchange(&self, upstream: SocketAddr, query: &Query) -> Result<Message> {
        let mut msg = Message::query();
        msg.metadata.recursion_desired = true;
        msg.add_query(query.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(UPSTREAM_PAYLOAD);
        msg.set_edns(edns);
        let bytes = msg.to_vec().map_err(|source| Error::Encode { upstream, source })?;
        let id = msg.metadata.id;
        let udp = tokio::time::timeout(self.timeout, exchange_udp(upstream, &bytes, id, query))
            .await
            .map_err(|_| Error::Timeout { upstream, timeout: self.timeout })??;
        if !udp.metadata.truncation {
            return Ok(udp);
        }
        tokio::time::timeout(self.timeout, exchange_tcp(upstream, &bytes, id, query))
            .await
            .map_err(|_| Error::Timeout { upstream, timeout: self.timeout })?
    }
}

fn failure(query: &Query, code: ResponseCode) -> Message {
    let mut msg = Message::error_msg(0, OpCode::Query, code);
    msg.add_query(query.clone());
    msg
}

fn io(upstream: SocketAddr) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { upstream, source }
}

fn matches(msg: &Message, id: u16, query: &Query) -> bool {
    msg.metadata.id == id
        && msg.metadata.message_type == MessageType::Response
        && msg.queries.len() == 1
        && msg.queries[0] == *query
}

async fn exchange_udp(
    upstream: SocketAddr,
    bytes: &[u8],
    id: u16,
    query: &Query,
) -> Result<Message> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(local).await.map_err(io(upstream))?;
    sock.connect(upstream).await.map_err(io(upstream))?;
    sock.send(bytes).await.map_err(io(upstream))?;
    let mut buf = vec![0u8; usize::from(UPSTREAM_PAYLOAD).max(4096)];
    loop {
        let n = sock.recv(&mut buf).await.map_err(io(upstream))?;
        // Anything else arriving on this port (stale, spoofed, garbled) is ignored.
        if let Ok(msg) = Message::from_vec(&buf[..n])
            && matches(&msg, id, query)
        {
            return Ok(msg);
        }
    }
}

async fn exchange_tcp(
    upstream: SocketAddr,
    bytes: &[u8],
    id: u16,
    query: &Query,
) -> Result<Message> {
    let mut stream = TcpStream::connect(upstream).await.map_err(io(upstream))?;
    let len = u16::try_from(bytes.len()).map_err(|_| Error::Mismatch { upstream })?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await.map_err(io(upstream))?;
    let len = stream.read_u16().await.map_err(io(upstream))?;
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await.map_err(io(upstream))?;
    let msg = Message::from_vec(&buf).map_err(|source| Error::Decode { upstream, source })?;
    if !matches(&msg, id, query) {
        return Err(Error::Mismatch { upstream });
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Record;
    use hickory_proto::rr::rdata::{A, SOA};

    #[test]
    fn resolv_conf_nameservers() {
        let text = "# generated\nsearch example.org\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\n\
                    nameserver bogus\noptions ndots:2\n";
        assert_eq!(
            parse_resolv_conf(text),
            vec!["10.0.0.2:53".parse::<SocketAddr>().unwrap(), "[fe80::1]:53".parse().unwrap()]
        );
    }

    fn answer(ttl: u32) -> Message {
        let mut m = Message::response(1, OpCode::Query);
        m.add_answer(Record::from_rdata(
            Name::from_ascii("a.example.").unwrap(),
            ttl,
            RData::A(A::new(192, 0, 2, 1)),
        ));
        m
    }

    #[test]
    fn cache_ttls_follow_answers_and_soa() {
        assert_eq!(cache_ttl(&answer(300), 30), 30);
        assert_eq!(cache_ttl(&answer(7), 30), 7);
        let mut nx = Message::error_msg(1, OpCode::Query, ResponseCode::NXDomain);
        assert_eq!(cache_ttl(&nx, 30), 0, "no SOA: not cached");
        let soa = SOA::new(Name::root(), Name::root(), 1, 1, 1, 1, 4);
        nx.add_authority(Record::from_rdata(Name::root(), 60, RData::SOA(soa)));
        assert_eq!(cache_ttl(&nx, 30), 4);
        let fail = Message::error_msg(1, OpCode::Query, ResponseCode::ServFail);
        assert_eq!(cache_ttl(&fail, 30), 0);
    }

    #[test]
    fn cache_is_bounded_and_expires() {
        let mut c = AnswerCache { map: HashMap::new(), capacity: 3 };
        let t0 = Instant::now();
        let key = |i: u32| {
            (Name::from_ascii(format!("n{i}.example.")).unwrap(), RecordType::A, DNSClass::IN)
        };
        for i in 0..10 {
            c.insert(key(i), answer(10), 10 + i, t0);
            assert!(c.map.len() <= 3);
        }
        assert!(c.get(&key(9), t0).is_some());
        let later = c.get(&key(9), t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(later.answers[0].ttl, 5, "TTL counts down");
        assert!(c.get(&key(9), t0 + Duration::from_secs(30)).is_none());
    }
}
