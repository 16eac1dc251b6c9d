//! `cargo xtask bench dns`: the cluster DNS at 10,000 Services (1 in 10 headless with a
//! 3-endpoint slice) created through the in-process apiserver. Measures, over loopback UDP
//! from a bounded number of concurrent clients: queries/s and latency percentiles for a
//! cluster-name mix (A 70 %, SRV 10 %, PTR 10 %, search-path NXDOMAIN 10 %), against a bare
//! UDP echo on the same rig and load generator (the ceiling of the path); the initial sync
//! time; add→answer and delete→NXDOMAIN latency at that size; and RSS (the process also
//! holds the apiserver: the DNS share is the growth from before the server started).
//!
//! `SKIFF_BENCH_SERVICES=2000` and `SKIFF_BENCH_SECONDS=2` shorten a run.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use skiff_agent::dns::{self, DnsConfig};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;
use tokio::net::UdpSocket;

const CLIENTS: usize = 32;
const NAMESPACES: usize = 100;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Wire form of a query (the ID is patched per send).
fn query(name: &str, qtype: RecordType) -> Result<Vec<u8>> {
    let mut msg = Message::query();
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(Name::from_ascii(name)?, qtype));
    Ok(msg.to_vec()?)
}

#[derive(Debug, Default, Clone)]
struct LoadResult {
    queries: usize,
    timeouts: usize,
    errors: usize,
    qps: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
}

/// `CLIENTS` tasks, each with its own socket, one query outstanding at a time, for `secs`.
async fn load(
    server: SocketAddr,
    queries: Arc<Vec<Vec<u8>>>,
    secs: u64,
    check: bool,
) -> Result<LoadResult> {
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let queries = queries.clone();
        tasks.push(tokio::spawn(async move {
            let sock = UdpSocket::bind("127.0.0.1:0").await?;
            sock.connect(server).await?;
            let mut buf = vec![0u8; 4096];
            let (mut lat, mut timeouts, mut errors) = (Vec::with_capacity(1 << 16), 0usize, 0usize);
            let mut i = c * 7919;
            let mut id: u16 = (c as u16).wrapping_mul(2053);
            while Instant::now() < until {
                let mut q = queries[i % queries.len()].clone();
                i += 1;
                id = id.wrapping_add(1);
                q[..2].copy_from_slice(&id.to_be_bytes());
                let t = Instant::now();
                sock.send(&q).await?;
                let got = tokio::time::timeout(Duration::from_millis(500), async {
                    loop {
                        let n = sock.recv(&mut buf).await?;
                        if n >= 2 && buf[..2] == id.to_be_bytes() {
                            return Ok::<usize, std::io::Error>(n);
                        }
                    }
                })
                .await;
                match got {
                    Ok(Ok(n)) => {
                        lat.push(t.elapsed().as_micros() as u64);
                        if check {
                            let ok = Message::from_vec(&buf[..n]).is_ok_and(|m| {
                                matches!(
                                    m.metadata.response_code,
                                    ResponseCode::NoError | ResponseCode::NXDomain
                                )
                            });
                            if !ok {
                                errors += 1;
                            }
                        }
                    }
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => timeouts += 1,
                }
            }
            Ok::<_, anyhow::Error>((lat, timeouts, errors))
        }));
    }
    let mut all = Vec::new();
    let mut res = LoadResult::default();
    for t in tasks {
        let (lat, timeouts, errors) = t.await??;
        all.extend(lat);
        res.timeouts += timeouts;
        res.errors += errors;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    res.queries = all.len();
    res.qps = all.len() as f64 / elapsed;
    res.p50_us = pct(0.50);
    res.p99_us = pct(0.99);
    res.p999_us = pct(0.999);
    Ok(res)
}

/// The baseline: a UDP echo that only flips the QR bit (no parsing, no lookup).
async fn echo_server() -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    let addr = sock.local_addr()?;
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else { continue };
            if n > 2 {
                buf[2] |= 0x80;
            }
            let _ = sock.send_to(&buf[..n], peer).await;
        }
    });
    Ok((addr, task))
}

/// Polls `name` every millisecond until `done(rcode, answers)`.
async fn wait_for(
    server: SocketAddr,
    name: &str,
    done: impl Fn(ResponseCode, usize) -> bool,
) -> Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    sock.connect(server).await?;
    let q = query(name, RecordType::A)?;
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    loop {
        ensure!(start.elapsed() < Duration::from_secs(30), "{name}: no change within 30 s");
        sock.send(&q).await?;
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(200), sock.recv(&mut buf)).await
            && let Ok(m) = Message::from_vec(&buf[..n])
            && done(m.metadata.response_code, m.answers.len())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let services = env_usize("SKIFF_BENCH_SERVICES", 10_000);
    let secs = env_usize("SKIFF_BENCH_SECONDS", 5) as u64;
    let per_ns = services.div_ceil(NAMESPACES);
    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await?;
    let client = api.client();

    // The objects, through the API.
    let t = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for i in 0..NAMESPACES {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("ns-{i}")}}))?;
        namespaces.create(&PostParams::default(), &ns).await?;
    }
    let created: Vec<(usize, Option<IpAddr>)> = futures::stream::iter(0..services)
        .map(|k| {
            let client = client.clone();
            async move {
                let (ns, name) = (format!("ns-{}", k / per_ns), format!("svc-{}", k % per_ns));
                let headless = k % 10 == 9;
                let mut spec = json!({"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
                if headless {
                    spec["clusterIP"] = json!("None");
                }
                let svc: Service = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
                let svc = Api::<Service>::namespaced(client.clone(), &ns).create(&PostParams::default(), &svc).await?;
                if headless {
                    let eps: Vec<_> = (0..3)
                        .map(|e| json!({"addresses": [format!("10.200.{}.{}", k / 250 % 250, (k % 250) + e)],
                                        "conditions": {"ready": true}}))
                        .collect();
                    let slice: EndpointSlice = serde_json::from_value(json!({
                        "metadata": {"name": format!("{name}-x"), "labels": {"kubernetes.io/service-name": name}},
                        "addressType": "IPv4",
                        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                        "endpoints": eps}))?;
                    Api::<EndpointSlice>::namespaced(client, &ns).create(&PostParams::default(), &slice).await?;
                }
                let ip = svc.spec.and_then(|s| s.cluster_ip).and_then(|ip| ip.parse().ok());
                Ok::<_, anyhow::Error>((k, ip))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    let create_s = t.elapsed().as_secs_f64();
    eprintln!("created {services} services in {create_s:.1} s");

    // The DNS server over them: initial sync.
    let rss_before = rss_mb();
    let t = Instant::now();
    let config = DnsConfig::default().with_listen(["127.0.0.1:0".parse()?]).with_upstreams([]);
    let server = dns::serve(client.clone(), config).await?;
    tokio::time::timeout(Duration::from_secs(120), server.wait_synced())
        .await
        .context("sync within 120 s")?;
    let sync_ms = t.elapsed().as_secs_f64() * 1000.0;
    let addr = server.local_addrs()[0];
    let rss_synced = rss_mb();

    // The query mix.
    let mut queries = Vec::new();
    for (k, ip) in &created {
        let (ns, name) = (format!("ns-{}", k / per_ns), format!("svc-{}", k % per_ns));
        let fqdn = format!("{name}.{ns}.svc.cluster.local.");
        match k % 10 {
            0 => queries.push(query(&format!("_http._tcp.{fqdn}"), RecordType::SRV)?),
            1 => match ip {
                Some(IpAddr::V4(v4)) => {
                    let o = v4.octets();
                    queries.push(query(
                        &format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0]),
                        RecordType::PTR,
                    )?)
                }
                _ => queries.push(query(&fqdn, RecordType::A)?),
            },
            2 => queries
                .push(query(&format!("www.example.com.{ns}.svc.cluster.local."), RecordType::A)?),
            _ => queries.push(query(&fqdn, RecordType::A)?),
        }
    }
    let queries = Arc::new(queries);
    let dns_load = load(addr, queries.clone(), secs, true).await?;
    let rss_loaded = rss_mb();
    let (echo_addr, echo) = echo_server().await?;
    let echo_load = load(echo_addr, queries.clone(), secs, false).await?;
    echo.abort();

    // Update latency at this size.
    let svcs: Api<Service> = Api::namespaced(client.clone(), "ns-0");
    let fresh: Service = serde_json::from_value(
        json!({"metadata": {"name": "fresh"}, "spec": {"ports": [{"port": 80}]}}),
    )?;
    let name = "fresh.ns-0.svc.cluster.local.";
    let t = Instant::now();
    svcs.create(&PostParams::default(), &fresh).await?;
    wait_for(addr, name, |rc, n| rc == ResponseCode::NoError && n > 0).await?;
    let add = t.elapsed();
    let t = Instant::now();
    svcs.delete("fresh", &DeleteParams::default()).await?;
    wait_for(addr, name, |rc, _| rc == ResponseCode::NXDomain).await?;
    let del = t.elapsed();
    let stats = server.stats();
    server.shutdown().await;

    println!();
    println!(
        "dns bench: {services} services ({} headless x3 endpoints), {CLIENTS} concurrent UDP clients, {secs} s per target",
        services / 10
    );
    println!(
        "{:<24} {:>11} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "target", "queries/s", "p50 us", "p99 us", "p99.9 us", "timeouts", "errors"
    );
    for (label, r) in [("skiff dns (cluster mix)", &dns_load), ("udp echo (baseline)", &echo_load)]
    {
        println!(
            "{:<24} {:>11.0} {:>8} {:>8} {:>9} {:>9} {:>7}",
            label, r.qps, r.p50_us, r.p99_us, r.p999_us, r.timeouts, r.errors
        );
    }
    let ratio = dns_load.qps / echo_load.qps.max(1.0);
    println!("ratio skiff/echo queries/s: {ratio:.2}");
    println!(
        "initial sync: {sync_ms:.0} ms; create→answer: {:.1} ms; delete→NXDOMAIN: {:.1} ms",
        add.as_secs_f64() * 1000.0,
        del.as_secs_f64() * 1000.0
    );
    println!(
        "RSS: {rss_before:.1} MB before DNS (apiserver + objects), {rss_synced:.1} MB synced, {rss_loaded:.1} MB after load (DNS ≈ +{:.1} MB)",
        rss_loaded - rss_before
    );
    println!("server counters: {stats:?}");

    let row = |r: &LoadResult| {
        json!({"queries": r.queries, "qps": r.qps, "p50_us": r.p50_us, "p99_us": r.p99_us,
               "p999_us": r.p999_us, "timeouts": r.timeouts, "errors": r.errors})
    };
    let out = json!({
        "bench": "dns", "services": services, "headless": services / 10, "clients": CLIENTS, "seconds": secs,
        "create_services_s": create_s, "initial_sync_ms": sync_ms,
        "create_to_answer_ms": add.as_secs_f64() * 1000.0, "delete_to_nxdomain_ms": del.as_secs_f64() * 1000.0,
        "skiff": row(&dns_load), "echo_baseline": row(&echo_load), "ratio_qps": ratio,
        "rss_mb": {"before_dns": rss_before, "synced": rss_synced, "after_load": rss_loaded},
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("dns.json"), serde_json::to_string_pretty(&out)? + "\n")?;
    println!("wrote {}", dir.join("dns.json").display());
    ensure!(dns_load.errors == 0, "{} answers were neither NOERROR nor NXDOMAIN", dns_load.errors);
    Ok(())
}
