//! The DNS listeners (UDP and TCP) and query handling: parse → answer from the cluster
//! zone, or forward → encode within the transport's size limit.
//!
//! A small loop on hickory-proto's wire types rather than hickory-server's `ServerFuture`:
//! the bounds this server must keep (forwarded queries in flight, TCP connections, idle
//! TCP time), its malformed-query policy (FORMERR when a header could be read, silent drop
//! otherwise and for anything that is not a query) and its two answer paths (in-line from
//! memory for cluster names, spawned for forwarded ones) are each a few lines here, and
//! would be fought against through hickory-server's authority/catalog abstractions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{
    Edns, Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode,
};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::debug;

use super::forward::Forwarder;
use super::zone::{Lookup, Zone};

/// The UDP payload size we advertise and answer within (DNS flag day 2020).
pub const UDP_PAYLOAD: u16 = 1232;
/// Largest datagram read; longer ones are cut by the kernel and then fail to parse.
const RECV_BUFFER: usize = 4096;
/// CNAME hops followed inside the cluster zone.
const MAX_CNAME_HOPS: usize = 8;

/// Counters of the server's work (monotonic, since start).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DnsStats {
    /// Queries received (UDP datagrams and TCP messages).
    pub queries: u64,
    /// Answered from the cluster zone (including NXDOMAIN/NODATA).
    pub local: u64,
    /// Handed to the forwarder.
    pub forwarded: u64,
    /// Answered FORMERR.
    pub formerr: u64,
    /// Dropped unanswered: unreadable datagrams, responses sent to us.
    pub dropped: u64,
    /// Dropped because the forwarded-query bound was reached.
    pub overloaded: u64,
    /// TCP connections refused because the connection bound was reached.
    pub tcp_refused: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    queries: AtomicU64,
    local: AtomicU64,
    forwarded: AtomicU64,
    formerr: AtomicU64,
    dropped: AtomicU64,
    overloaded: AtomicU64,
    tcp_refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> DnsStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DnsStats {
            queries: l(&self.queries),
            local: l(&self.local),
            forwarded: l(&self.forwarded),
            formerr: l(&self.formerr),
            dropped: l(&self.dropped),
            overloaded: l(&self.overloaded),
            tcp_refused: l(&self.tcp_refused),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// A question to forward, with what the answer must carry back.
pub(crate) struct Forward {
    request: Metadata,
    edns: bool,
    /// Largest answer the client takes over its transport.
    limit: usize,
    question: Query,
    /// The question actually sent upstream (a CNAME target's, when chasing one).
    upstream: Query,
    /// Records answered before the forward (the CNAME chain from the cluster zone).
    prefix: Vec<Record>,
}

pub(crate) enum Step {
    Reply(Vec<u8>),
    Forward(Box<Forward>),
    Drop,
}

/// Everything a query needs: the zone, the forwarder, the counters.
pub(crate) struct Handler {
    /// The cluster zone's apex (`cluster.local.`).
    pub(crate) apex: Name,
    pub(crate) zone: Arc<RwLock<Zone>>,
    pub(crate) synced: watch::Receiver<bool>,
    pub(crate) forwarder: Forwarder,
    pub(crate) ttl: u32,
    pub(crate) soa: Record,
    pub(crate) counters: Counters,
}

/// The zone's SOA (carried in negative answers so clients cache them for `ttl`).
pub(crate) fn soa_record(apex: &Name, ttl: u32) -> Record {
    let child = |l: &str| apex.prepend_label(l).unwrap_or_else(|_| apex.clone());
    let mname = child("dns").prepend_label("ns").unwrap_or_else(|_| apex.clone());
    let soa = SOA::new(mname, child("hostmaster"), 1, 7200, 1800, 86400, ttl);
    Record::from_rdata(apex.clone(), ttl, RData::SOA(soa))
}

fn response_for(request: &Metadata, edns: bool, question: &Query) -> Message {
    let mut msg = Message::response(request.id, request.op_code);
    msg.metadata = Metadata::response_from_request(request);
    msg.metadata.recursion_available = true;
    msg.add_query(question.clone());
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(UDP_PAYLOAD);
        msg.set_edns(e);
    }
    msg
}

impl Handler {
    /// Parses one query and answers it from the cluster zone, or says to forward or drop it.
    pub(crate) fn classify(&self, bytes: &[u8], transport: Transport) -> Step {
        bump(&self.counters.queries);
        let Ok(header) = Header::read(&mut BinDecoder::new(bytes)) else {
            bump(&self.counters.dropped);
            return Step::Drop;
        };
        // Never answer answers: that is how reflection loops start.
        if header.metadata.message_type != MessageType::Query {
            bump(&self.counters.dropped);
            return Step::Drop;
        }
        let request = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(e) => {
                debug!(error = %e, "malformed query");
                bump(&self.counters.formerr);
                let mut msg = Message::error_msg(
                    header.metadata.id,
                    header.metadata.op_code,
                    ResponseCode::FormErr,
                );
                msg.metadata.recursion_desired = header.metadata.recursion_desired;
                return self.reply(msg, 512);
            }
        };
        let limit = match transport {
            Transport::Udp => usize::from(request.max_payload().min(UDP_PAYLOAD)),
            Transport::Tcp => usize::from(u16::MAX),
        };
        if request.metadata.op_code != OpCode::Query {
            bump(&self.counters.local);
            let msg = Message::error_msg(
                request.metadata.id,
                request.metadata.op_code,
                ResponseCode::NotImp,
            );
            return self.reply(msg, limit);
        }
        let [question] = request.queries.as_slice() else {
            bump(&self.counters.formerr);
            let msg = Message::error_msg(
                request.metadata.id,
                request.metadata.op_code,
                ResponseCode::FormErr,
            );
            return self.reply(msg, limit);
        };
        let edns = request.edns.is_some();
        let mut msg = response_for(&request.metadata, edns, question);
        let name = question.name();
        let in_zone = self.apex.zone_of(name);
        if in_zone {
            bump(&self.counters.local);
            msg.metadata.authoritative = true;
            if question.query_class() != DNSClass::IN {
                msg.metadata.response_code = ResponseCode::Refused;
                return self.reply(msg, limit);
            }
            if !*self.synced.borrow() {
                // Not listed yet: a NXDOMAIN now would be cached by the client.
                msg.metadata.authoritative = false;
                msg.metadata.response_code = ResponseCode::ServFail;
                return self.reply(msg, limit);
            }
            if matches!(question.query_type(), RecordType::AXFR | RecordType::IXFR) {
                msg.metadata.response_code = ResponseCode::Refused;
                return self.reply(msg, limit);
            }
        }
        let zone = self.zone_read();
        match zone.lookup(name, question.query_type()) {
            Lookup::NotOurs => {
                drop(zone);
                bump(&self.counters.forwarded);
                Step::Forward(Box::new(Forward {
                    request: request.metadata,
                    edns,
                    limit,
                    question: question.clone(),
                    upstream: question.clone(),
                    prefix: Vec::new(),
                }))
            }
            Lookup::NoData => {
                msg.add_authority(self.soa.clone());
                drop(zone);
                self.reply(msg, limit)
            }
            Lookup::NxDomain => {
                msg.metadata.response_code = ResponseCode::NXDomain;
                msg.add_authority(self.soa.clone());
                drop(zone);
                self.reply(msg, limit)
            }
            Lookup::Records(records) => {
                if !in_zone {
                    bump(&self.counters.local);
                }
                msg.metadata.authoritative = true;
                let qtype = question.query_type();
                let mut answers: Vec<Record> =
                    records.into_iter().map(|(n, d)| Record::from_rdata(n, self.ttl, d)).collect();
                // Chase a CNAME (an ExternalName service) as a recursive server does.
                let mut target = None;
                for _ in 0..MAX_CNAME_HOPS {
                    let Some(RData::CNAME(cname)) = answers.last().map(|r| &r.data) else { break };
                    if qtype == RecordType::CNAME {
                        break;
                    }
                    let next = cname.0.clone();
                    match zone.lookup(&next, qtype) {
                        Lookup::Records(more) => answers.extend(
                            more.into_iter().map(|(n, d)| Record::from_rdata(n, self.ttl, d)),
                        ),
                        Lookup::NotOurs => {
                            target = Some(next);
                            break;
                        }
                        Lookup::NoData | Lookup::NxDomain => break,
                    }
                }
                if qtype == RecordType::SRV {
                    for srv in answers.iter().filter_map(|r| match &r.data {
                        RData::SRV(s) => Some(s.target.clone()),
                        _ => None,
                    }) {
                        for t in [RecordType::A, RecordType::AAAA] {
                            if let Lookup::Records(extra) = zone.lookup(&srv, t) {
                                msg.add_additionals(
                                    extra
                                        .into_iter()
                                        .map(|(n, d)| Record::from_rdata(n, self.ttl, d)),
                                );
                            }
                        }
                    }
                }
                drop(zone);
                if let Some(target) = target {
                    let mut upstream = Query::query(target, qtype);
                    upstream.set_query_class(question.query_class());
                    bump(&self.counters.forwarded);
                    return Step::Forward(Box::new(Forward {
                        request: request.metadata,
                        edns,
                        limit,
                        question: question.clone(),
                        upstream,
                        prefix: answers,
                    }));
                }
                msg.insert_answers(answers);
                self.reply(msg, limit)
            }
        }
    }

    /// Answers a forwarded question (never fails: SERVFAIL/REFUSED when upstreams do).
    pub(crate) async fn forward(&self, fwd: &Forward) -> Option<Vec<u8>> {
        let upstream = self.forwarder.resolve(&fwd.upstream).await;
        let mut msg = response_for(&fwd.request, fwd.edns, &fwd.question);
        msg.metadata.response_code = upstream.metadata.response_code;
        let mut answers = fwd.prefix.clone();
        answers.extend(upstream.answers);
        msg.insert_answers(answers);
        msg.insert_authorities(upstream.authorities);
        msg.insert_additionals(upstream.additionals);
        match self.reply(msg, fwd.limit) {
            Step::Reply(bytes) => Some(bytes),
            _ => None,
        }
    }

    fn zone_read(&self) -> std::sync::RwLockReadGuard<'_, Zone> {
        self.zone.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Encodes `msg`; over `limit` bytes, the truncated form (TC set, no records).
    fn reply(&self, msg: Message, limit: usize) -> Step {
        match msg.to_vec() {
            Ok(bytes) if bytes.len() <= limit => Step::Reply(bytes),
            Ok(_) => match msg.truncate().to_vec() {
                Ok(bytes) => Step::Reply(bytes),
                Err(_) => Step::Drop,
            },
            Err(e) => {
                debug!(error = %e, "encoding an answer");
                let mut fail = Message::error_msg(
                    msg.metadata.id,
                    msg.metadata.op_code,
                    ResponseCode::ServFail,
                );
                fail.queries = msg.queries;
                fail.to_vec().map_or(Step::Drop, Step::Reply)
            }
        }
    }
}

/// Receives datagrams on `sock`: cluster names are answered in line, forwarded questions
/// run as tasks holding a permit of `inflight` (none left: the datagram is dropped, and
/// the client retries).
pub(crate) async fn udp_loop(
    sock: Arc<UdpSocket>,
    handler: Arc<Handler>,
    inflight: Arc<Semaphore>,
) {
    let mut buf = vec![0u8; RECV_BUFFER];
    let mut forwards = JoinSet::new();
    loop {
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(v) => v,
            Err(e) => {
                debug!(error = %e, "UDP receive");
                continue;
            }
        };
        while forwards.try_join_next().is_some() {}
        match handler.classify(&buf[..n], Transport::Udp) {
            Step::Drop => {}
            Step::Reply(bytes) => {
                if let Err(e) = sock.send_to(&bytes, peer).await {
                    debug!(error = %e, %peer, "UDP send");
                }
            }
            Step::Forward(fwd) => match inflight.clone().try_acquire_owned() {
                Ok(permit) => {
                    let (sock, handler) = (sock.clone(), handler.clone());
                    forwards.spawn(async move {
                        if let Some(bytes) = handler.forward(&fwd).await {
                            let _ = sock.send_to(&bytes, peer).await;
                        }
                        drop(permit);
                    });
                }
                Err(_) => bump(&handler.counters.overloaded),
            },
        }
    }
}

/// Accepts TCP connections, at most `connections` at once (more are closed at once).
pub(crate) async fn tcp_loop(
    listener: TcpListener,
    handler: Arc<Handler>,
    connections: Arc<Semaphore>,
    idle: Duration,
) {
    let mut conns = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                debug!(error = %e, "TCP accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            bump(&handler.counters.tcp_refused);
            continue;
        };
        let handler = handler.clone();
        conns.spawn(async move {
            tcp_connection(stream, &handler, idle).await;
            drop(permit);
        });
    }
}

/// Length-prefixed queries in sequence until the client closes or idles for `idle`.
async fn tcp_connection(mut stream: TcpStream, handler: &Handler, idle: Duration) {
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(idle, stream.read_u16()).await else { return };
        let mut buf = vec![0u8; usize::from(len)];
        let Ok(Ok(_)) = tokio::time::timeout(idle, stream.read_exact(&mut buf)).await else {
            return;
        };
        let bytes = match handler.classify(&buf, Transport::Tcp) {
            Step::Drop => return,
            Step::Reply(bytes) => bytes,
            Step::Forward(fwd) => match handler.forward(&fwd).await {
                Some(bytes) => bytes,
                None => return,
            },
        };
        let Ok(len) = u16::try_from(bytes.len()) else { return };
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&bytes);
        match tokio::time::timeout(idle, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}
