//! Benchmarks driven by `cargo xtask bench <name>`. `skiff-bench apiserver <server-binary>`
//! starts a release skiff-server as its own process and measures, in one run:
//! creates/s with 1 and 64 concurrent clients (and as floors the raw embedded store, and the
//! same HTTPS load against a server that does nothing; the 64-client rate is also given as a
//! share of that floor, measured next to each run, which holds across the VM's speed swings),
//! LIST of 10k and 100k pods, watch delivery latency with 1,000 watchers, and server RSS
//! at 10k pods, and the authentication + authorization cost per request (a non-admin user
//! under Node,RBAC with 1,000 bindings vs AlwaysAllow, two servers in the same run). It prints a table and writes JSON to target/bench/apiserver.json.
//! `skiff-bench scheduler <server-binary>`: see `bench_scheduler` (target/bench/scheduler.json).
//! `skiff-bench controllers <server-binary>...`: see `bench_controllers` (watches per
//! component and RSS with the controllers running, at 10k pods).
//! `skiff-bench lab-load <bin-dir>...`: see `bench_lab_load` (watches per process and RSS of
//! skiff-server and skiff-agent in a one-node lab, at 10k pods and 100 Services).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use skiff_store::StoreExt;
use skiff_tests::process::{ServerProcess, free_port, start_server, start_server_with, vm_rss_mb};

#[path = "bench_controllers/mod.rs"]
mod bench_controllers;
#[path = "bench_lab_load/mod.rs"]
mod bench_lab_load;
#[path = "bench_scheduler/mod.rs"]
mod bench_scheduler;

/// skiff-server's allocator: the scheduler under test runs in this process (as it runs inside
/// skiff-server), and the load generators leave the shared CPUs to the server.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.read_timeout = Some(Duration::from_secs(300));
    Ok(Client::try_from(config)?)
}

fn pod(ns: &str, name: &str, extra_annotation: Option<String>) -> Vec<u8> {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "skiff.local/busybox:1"}]},
    });
    if let Some(a) = extra_annotation {
        p["metadata"]["annotations"] = json!({"bench/sent-ns": a});
    }
    serde_json::to_vec(&p).unwrap_or_default()
}

async fn create_ns(client: &Client, ns: &str) -> Result<()> {
    let body = serde_json::to_vec(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )?;
    let req = http::Request::post("/api/v1/namespaces")
        .header("content-type", "application/json")
        .body(body)?;
    client.request_text(req).await?;
    Ok(())
}

/// Create `total` pods in `ns` with `concurrency` workers sharing one kube-rs `Client`
/// (its connection pool, tower stack and JSON bodies built per request); returns creates/s.
async fn creates_kube(client: &Client, ns: &str, total: usize, concurrency: usize) -> Result<f64> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let next = next.clone();
        let ns = ns.to_string();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods"))
                    .header("content-type", "application/json")
                    .body(pod(&ns, &format!("p-{i}"), None))?;
                client.request_text(req).await.with_context(|| format!("creating pod {i}"))?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// The create load's client: each simulated client holds its own keep-alive HTTP/1.1
/// connection over TLS with the admin's client certificate (what kubectl presents), and
/// sends a real `POST .../pods` with a JSON body formatted from a pre-serialized template.
/// The load generator shares the machine's CPUs with the server, so it spends on each
/// request only what the wire protocol demands (no tower stack, no JSON building).
struct RawClient {
    tls: tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
    server_name: rustls::pki_types::ServerName<'static>,
    authority: String,
}

type Conn = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

impl RawClient {
    /// From a skiff-server kubeconfig (its URL) and the PKI in the same data directory.
    fn new(kubeconfig: &Path) -> Result<RawClient> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let kc = Kubeconfig::read_from(kubeconfig)?;
        let url: http::Uri = kc
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .context("server URL in the kubeconfig")?
            .parse()?;
        let authority = url.authority().context("server URL without host")?.to_string();
        let addr: std::net::SocketAddr = authority.parse().context("server address")?;
        let data_dir = kubeconfig.parent().context("data dir")?;
        let pki = skiff_apiserver::pki::Pki::load_or_create(data_dir, &[])?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(pki.ca_cert_pem.as_bytes()) {
            roots.add(ca?)?;
        }
        let certs = CertificateDer::pem_slice_iter(pki.admin_cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(pki.admin_key_pem.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::IpAddress(addr.ip().into());
        Ok(RawClient {
            tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            addr,
            server_name,
            authority,
        })
    }

    async fn connect(&self) -> Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.server_name.clone(), tcp).await?;
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(send)
    }

    /// Send one request of `load`; its status must be the one the load expects.
    async fn send(&self, conn: &mut Conn, load: &Load, path: &str, body: Bytes) -> Result<()> {
        use http_body_util::BodyExt;
        conn.ready().await?;
        let (method, content_type, expect) = match load {
            Load::Create => (http::Method::POST, "application/json", http::StatusCode::CREATED),
            Load::Patch { .. } => {
                (http::Method::PATCH, "application/merge-patch+json", http::StatusCode::OK)
            }
        };
        let req = http::Request::builder()
            .method(&method)
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "skiff-bench/1")
            .body(http_body_util::Full::new(body))?;
        let resp = conn.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if status != expect {
            bail!("{method} {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }
}

/// What a load run sends.
#[derive(Clone, Copy)]
enum Load {
    /// `POST` a new pod `p-<i>`.
    Create,
    /// A JSON merge patch of an annotation of pod `p-<i mod pods>` (the pods exist).
    Patch { pods: usize },
}

/// CPU time (user + system) a process has used so far, from /proc/<pid>/stat.
fn cpu_time(pid: &str) -> Duration {
    Duration::from_secs_f64(bench_scheduler::stat_cpu(&format!("/proc/{pid}/stat")))
}

/// A create run's figures.
struct CreateRun {
    per_sec: f64,
    /// CPU per create (µs) of the load generator and of the server, when its pid is known.
    client_cpu_us: f64,
    server_cpu_us: Option<f64>,
}

impl CreateRun {
    fn note(&self) -> String {
        self.note_per("create")
    }

    /// The CPU figures, per request of the run's kind (`op`).
    fn note_per(&self, op: &str) -> String {
        match self.server_cpu_us {
            Some(s) => format!(
                "CPU/{op}: server {s:.0} us, client {:.0} us ({:.0}% of the run's CPU)",
                self.client_cpu_us,
                self.client_cpu_us / (self.client_cpu_us + s) * 100.0
            ),
            None => format!("client CPU/{op} {:.0} us", self.client_cpu_us),
        }
    }
}

/// Create `total` pods in `ns` with `concurrency` clients over [`RawClient`] connections.
///
/// The load runs on one thread of its own (a current-thread runtime): the server under test
/// shares this machine's two cores with it, and one thread with no work stealing and no
/// cross-thread wakeups takes the least CPU for the same requests.
async fn creates(
    client: &Arc<RawClient>,
    server_pid: Option<u32>,
    ns: &str,
    total: usize,
    concurrency: usize,
) -> Result<CreateRun> {
    run_load(client, server_pid, ns, total, concurrency, Load::Create).await
}

/// `total` requests of `load` in `ns` with `concurrency` clients, as [`creates`] runs them.
async fn run_load(
    client: &Arc<RawClient>,
    server_pid: Option<u32>,
    ns: &str,
    total: usize,
    concurrency: usize,
    load: Load,
) -> Result<CreateRun> {
    let (client, ns) = (client.clone(), ns.to_owned());
    let load = std::thread::Builder::new().name("bench-load".into()).spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(load_on_this_thread(client, server_pid, ns, total, concurrency, load))
    })?;
    tokio::task::spawn_blocking(move || load.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the load thread panicked"))?
}

async fn load_on_this_thread(
    client: Arc<RawClient>,
    server_pid: Option<u32>,
    ns: String,
    total: usize,
    concurrency: usize,
    load: Load,
) -> Result<CreateRun> {
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(client.connect().await?);
    }
    let path = Arc::new(format!("/api/v1/namespaces/{ns}/pods"));
    // Pre-serialized around the name: {"apiVersion":..,"metadata":{"name":"p-<i>",..}..}.
    let (head, tail) = {
        let template = String::from_utf8(pod(&ns, "NAME-SLOT", None))?;
        let (h, t) = template.split_once("NAME-SLOT").context("pod template")?;
        (Arc::new(h.to_string()), Arc::new(t.to_string()))
    };
    let next = Arc::new(AtomicUsize::new(0));
    let server_cpu = server_pid.map(|p| cpu_time(&p.to_string()));
    let client_cpu = cpu_time("self");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (client, next, path) = (client.clone(), next.clone(), path.clone());
        let (head, tail) = (head.clone(), tail.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                match load {
                    Load::Create => {
                        let body = Bytes::from(format!("{head}p-{i}{tail}"));
                        client.send(&mut conn, &load, &path, body).await
                    }
                    Load::Patch { pods } => {
                        let body = format!(
                            r#"{{"metadata":{{"annotations":{{"skiff.dev/bench":"{i}"}}}}}}"#
                        );
                        let pod = format!("{path}/p-{}", i % pods);
                        client.send(&mut conn, &load, &pod, Bytes::from(body)).await
                    }
                }
                .with_context(|| format!("request {i}"))?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let per_create = |d: Duration| d.as_secs_f64() * 1e6 / total as f64;
    Ok(CreateRun {
        per_sec: total as f64 / elapsed.as_secs_f64(),
        client_cpu_us: per_create(cpu_time("self").saturating_sub(client_cpu)),
        server_cpu_us: server_pid
            .zip(server_cpu)
            .map(|(p, before)| per_create(cpu_time(&p.to_string()).saturating_sub(before))),
    })
}

/// The transport's ceiling on this machine: the same load (`creates`, the same clients, TLS
/// with skiff's PKI and client certificates, HTTP/1.1 keep-alive) against a server that does
/// nothing but read the body and answer 201 with a stored pod's bytes. Its server runs on its
/// own 2-thread runtime (as skiff-server's) in this process; the CPU figure is the whole
/// process's (client and server) per request.
async fn transport_floor(total: usize, concurrency: usize) -> Result<CreateRun> {
    use http_body_util::BodyExt;
    let dir = tempfile::tempdir()?;
    let pki = skiff_apiserver::pki::Pki::load_or_create(dir.path(), &[])?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let kubeconfig = dir.path().join("admin.kubeconfig");
    pki.write_admin_kubeconfig(&kubeconfig, &format!("https://{addr}"))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_config()?));
    // What a create answers: the created pod (about 3.4 KB with its managed fields).
    let answer = Bytes::from(vec![b' '; 3400]);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.spawn(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let answer = answer.clone();
                        async move {
                            req.into_body().collect().await?;
                            let mut resp = http::Response::new(http_body_util::Full::new(answer));
                            *resp.status_mut() = http::StatusCode::CREATED;
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let raw = Arc::new(RawClient::new(&kubeconfig)?);
    let run = creates(&raw, None, "floor", total, concurrency).await;
    runtime.shutdown_background();
    run
}

/// Time one full LIST of all pods (bytes read to the end), best of 3.
async fn list_ms(client: &Client, query: &str) -> Result<(f64, usize)> {
    let mut best = f64::MAX;
    let mut size = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let req = http::Request::get(format!("/api/v1/pods{query}")).body(Vec::new())?;
        let body = client.request_text(req).await?;
        best = best.min(started.elapsed().as_secs_f64() * 1000.0);
        size = body.len();
    }
    Ok((best, size))
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// 1,000 watchers on one namespace; `events` pods created at a steady pace; the latency from
/// the create call to each watcher reading the event line.
async fn watch_latency(
    client: &Client,
    watchers: usize,
    events: usize,
) -> Result<(f64, f64, usize)> {
    let ns = "watch-bench";
    create_ns(client, ns).await?;
    let rv: String = {
        let req = http::Request::get(format!("/api/v1/namespaces/{ns}/pods")).body(Vec::new())?;
        let list: Value = serde_json::from_str(&client.request_text(req).await?)?;
        list["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string()
    };
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(watchers * events)));
    let ready = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let client = client.clone();
        let latencies = latencies.clone();
        let ready = ready.clone();
        let rv = rv.clone();
        tasks.push(tokio::spawn(async move {
            let req = http::Request::get(format!(
                "/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion={rv}&timeoutSeconds=120"
            ))
            .body(Vec::new())?;
            let stream = client.request_stream(req).await?;
            ready.fetch_add(1, Ordering::Relaxed);
            let mut lines = stream.lines();
            let mut seen = 0;
            let mut mine = Vec::with_capacity(events);
            while let Some(line) = lines.next().await {
                let line = line?;
                let received = now_ns();
                // Find the sender's timestamp without parsing the whole event.
                if let Some(pos) = line.find("bench/sent-ns\":\"") {
                    let rest = &line[pos + 16..];
                    if let Some(end) = rest.find('"')
                        && let Ok(sent) = rest[..end].parse::<u128>()
                    {
                        mine.push((received.saturating_sub(sent)) as f64 / 1e6);
                    }
                }
                seen += 1;
                if seen >= events {
                    break;
                }
            }
            latencies.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.extend(mine);
            Ok::<(), anyhow::Error>(())
        }));
    }
    while ready.load(Ordering::Relaxed) < watchers {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..events {
        let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods"))
            .header("content-type", "application/json")
            .body(pod(ns, &format!("w-{i}"), Some(now_ns().to_string())))?;
        client.request_text(req).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await???;
    }
    let mut all = latencies.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    all.sort_by(|a, b| a.total_cmp(b));
    Ok((percentile(&all, 0.5), percentile(&all, 0.99), all.len()))
}

/// The floor: single-key creates straight into the embedded store, same concurrency.
async fn store_creates(concurrency: usize, total: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(skiff_store::embedded::EmbeddedStore::open(dir.path())?);
    let value = Bytes::from(pod("default", "x", None));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let store = store.clone();
        let next = next.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                store.create(&format!("/registry/core/pods/default/p-{i}"), value.clone()).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn apiserver(server_bin: &Path, out_dir: &Path) -> Result<()> {
    let mut rows: Vec<(String, f64, String, String)> = Vec::new();
    let mut record = |name: &str, value: f64, unit: &str, note: String| {
        println!("{name:<44} {value:>12.1} {unit:<8} {note}");
        rows.push((name.to_string(), value, unit.to_string(), note));
    };
    println!("{:<44} {:>12} {:<8} note", "measure", "value", "unit");

    let floor1 = store_creates(1, 2_000).await?;
    let floor64 = store_creates(64, 20_000).await?;
    record("store creates/s, 1 writer (floor)", floor1, "ops/s", String::new());
    record("store creates/s, 64 writers (floor)", floor64, "ops/s", String::new());
    let transport = transport_floor(30_000, 64).await?;
    record(
        "HTTPS POSTs/s, 64 clients, no-op server (floor)",
        transport.per_sec,
        "ops/s",
        format!("CPU/request (client and server) {:.0} us", transport.client_cpu_us),
    );

    let server = start_server(server_bin).await?;
    let client = client(&server.kubeconfig).await?;
    let raw = Arc::new(RawClient::new(&server.kubeconfig)?);
    let pid = Some(server.child.id());
    create_ns(&client, "bench1").await?;
    create_ns(&client, "bench64").await?;
    create_ns(&client, "bench-kube").await?;
    let c1 = creates(&raw, pid, "bench1", 2_000, 1).await?;
    record(
        "apiserver creates/s, 1 client",
        c1.per_sec,
        "ops/s",
        format!("{:.2}x of store floor; {}", c1.per_sec / floor1, c1.note()),
    );
    // The target's figure: the median of several runs, each against a fresh server. One run
    // lasts a second or two, and this VM's speed moves by up to 2x between minutes; the spread
    // is printed with it. Each run follows an HTTPS floor run of the same size, so the ratio
    // of the two (the share of the transport's ceiling the server keeps) is taken at one
    // machine speed: it is the figure to compare between runs of this benchmark.
    let mut runs = Vec::with_capacity(HEADLINE_RUNS);
    let mut of_floor = Vec::with_capacity(HEADLINE_RUNS);
    let mut floors = Vec::with_capacity(HEADLINE_RUNS);
    for _ in 0..HEADLINE_RUNS {
        let floor = transport_floor(HEADLINE_CREATES, 64).await?.per_sec;
        let run = fresh_server_creates(server_bin, HEADLINE_CREATES).await?;
        of_floor.push(run.per_sec / floor);
        floors.push(floor);
        runs.push(run);
    }
    runs.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    of_floor.sort_by(f64::total_cmp);
    floors.sort_by(f64::total_cmp);
    let median = &runs[runs.len() / 2];
    record(
        "apiserver creates/s, 64 clients",
        median.per_sec,
        "ops/s",
        format!(
            "median of {HEADLINE_RUNS} runs of {}k on fresh servers (min {:.0}, max {:.0}); {:.2}x of store floor; target >= 20000 ({:.2}x); {}",
            HEADLINE_CREATES / 1000,
            runs[0].per_sec,
            runs[runs.len() - 1].per_sec,
            median.per_sec / floor64,
            median.per_sec / 20_000.0,
            median.note()
        ),
    );
    record(
        "apiserver creates/s, % of HTTPS floor",
        100.0 * of_floor[of_floor.len() / 2],
        "%",
        format!(
            "median of {HEADLINE_RUNS} pairs, each run against the floor run just before it (floors {:.0} to {:.0}/s)",
            floors[0],
            floors[floors.len() - 1],
        ),
    );
    // The same load on the server the next figures are taken on (it brings it to 10k pods).
    let c64 = creates(&raw, pid, "bench64", 7_000, 64).await?;
    record("apiserver creates/s, 64 clients, to 10k", c64.per_sec, "ops/s", c64.note());
    let ck = creates_kube(&client, "bench-kube", 1_000, 64).await?;
    record(
        "apiserver creates/s, 64 tasks on one kube::Client",
        ck,
        "ops/s",
        "kube-rs client (its tower stack) as the load generator".into(),
    );
    let rss10k = server.rss_mb();
    record(
        "server RSS at 10k pods",
        rss10k,
        "MB",
        format!("target < 100 ({:.2}x)", rss10k / 100.0),
    );
    let (l10k, size) = list_ms(&client, "").await?;
    record("LIST 10k pods (consistent)", l10k, "ms", format!("{} MB", size / 1_000_000));
    let (l10k0, _) = list_ms(&client, "?resourceVersion=0").await?;
    record("LIST 10k pods (resourceVersion=0)", l10k0, "ms", String::new());
    let (p50, p99, n) = watch_latency(&client, 1_000, 100).await?;
    record("watch delivery p50, 1000 watchers", p50, "ms", format!("{n} deliveries"));
    record(
        "watch delivery p99, 1000 watchers",
        p99,
        "ms",
        format!("target < 50 ({:.2}x)", p99 / 50.0),
    );
    // Writes to existing objects: an annotation patched on the 7,000 pods of the 10k run.
    let patches = run_load(&raw, pid, "bench64", 20_000, 64, Load::Patch { pods: 7_000 }).await?;
    record(
        "apiserver merge patches/s, 64 clients",
        patches.per_sec,
        "ops/s",
        patches.note_per("patch"),
    );
    create_ns(&client, "bench100k").await?;
    let c = creates(&raw, pid, "bench100k", 90_000, 64).await?;
    record("apiserver creates/s, 64 clients (to 100k)", c.per_sec, "ops/s", c.note());
    let (l100k, size) = list_ms(&client, "").await?;
    record("LIST 100k pods (consistent)", l100k, "ms", format!("{} MB", size / 1_000_000));
    record("server RSS at 100k pods", server.rss_mb(), "MB", String::new());

    drop(client);
    drop(server);
    for (name, value, unit, note) in auth_cost(server_bin).await? {
        record(&name, value, unit, note);
    }

    std::fs::create_dir_all(out_dir)?;
    let json: Vec<Value> = rows
        .iter()
        .map(|(n, v, u, note)| json!({"measure": n, "value": v, "unit": u, "note": note}))
        .collect();
    let path = out_dir.join("apiserver.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

const AUTH_BINDINGS: usize = 1_000;
const AUTH_REQUESTS: usize = 3_000;

async fn post_json(client: &Client, path: &str, body: Value) -> Result<()> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body)?)?;
    client.request_text(req).await?;
    Ok(())
}

/// A server with 1,000 RBAC bindings (none of them the measured user's but one) and a
/// kubeconfig of a non-admin user bound to `view` in namespace `authz`.
async fn auth_fixture(server: &ServerProcess) -> Result<Client> {
    let admin = client(&server.kubeconfig).await?;
    create_ns(&admin, "authz").await?;
    post_json(
        &admin,
        "/api/v1/namespaces/authz/pods",
        serde_json::from_slice(&pod("authz", "p", None))?,
    )
    .await?;
    let rb = |name: String, ns: Option<&str>, kind: &str, subject: String| {
        let mut b = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": if ns.is_some() { "RoleBinding" } else { "ClusterRoleBinding" },
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
        });
        if let Some(ns) = ns {
            b["metadata"]["namespace"] = json!(ns);
        }
        b
    };
    for i in 0..AUTH_BINDINGS / 2 {
        post_json(
            &admin,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            rb(format!("crb-{i}"), None, "User", format!("user-{i}")),
        )
        .await?;
        post_json(
            &admin,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/authz/rolebindings",
            rb(format!("rb-{i}"), Some("authz"), "Group", format!("group-{i}")),
        )
        .await?;
    }
    post_json(
        &admin,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/authz/rolebindings",
        rb("bench-user".into(), Some("authz"), "User", "bench-user".into()),
    )
    .await?;
    let data_dir = server.kubeconfig.parent().context("data dir")?;
    let pki = skiff_apiserver::pki::Pki::load_or_create(data_dir, &[])?;
    let (cert, key) = pki.issue_client("bench-user", &["bench-group"])?;
    let kc = Kubeconfig::read_from(&server.kubeconfig)?;
    let url = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .context("server URL")?;
    let path = data_dir.join("bench-user.kubeconfig");
    std::fs::write(&path, pki.kubeconfig(&url, "bench-user", &cert, &key))?;
    client(&path).await
}

/// Mean latency (µs) of sequential GETs of one pod, after a warm-up.
async fn get_latency_us(client: &Client, n: usize) -> Result<f64> {
    let get = || {
        http::Request::get("/api/v1/namespaces/authz/pods/p")
            .body(Vec::new())
            .map_err(anyhow::Error::from)
    };
    for _ in 0..200 {
        client.request_text(get()?).await?;
    }
    let started = Instant::now();
    for _ in 0..n {
        client.request_text(get()?).await?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Authentication + authorization cost per request: the same non-admin user's GETs against
/// a server authorizing with Node,RBAC over 1,000 bindings and one with AlwaysAllow
/// (authorization disabled), in the same run; interleaved rounds, best of three each.
async fn auth_cost(server_bin: &Path) -> Result<Vec<(String, f64, &'static str, String)>> {
    let rbac_server = start_server(server_bin).await?;
    let allow_server =
        start_server_with(server_bin, &["--no-controllers", "--authorization-mode", "AlwaysAllow"])
            .await?;
    let rbac = auth_fixture(&rbac_server).await?;
    let allow = auth_fixture(&allow_server).await?;
    let (mut best_rbac, mut best_allow) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        best_rbac = best_rbac.min(get_latency_us(&rbac, AUTH_REQUESTS).await?);
        best_allow = best_allow.min(get_latency_us(&allow, AUTH_REQUESTS).await?);
    }
    Ok(vec![
        (
            format!("GET latency, RBAC user ({AUTH_BINDINGS} bindings)"),
            best_rbac,
            "us",
            "client cert authn + Node,RBAC authz".into(),
        ),
        (
            "GET latency, authorization disabled".into(),
            best_allow,
            "us",
            "client cert authn + AlwaysAllow".into(),
        ),
        (
            "authz cost per request (difference)".into(),
            best_rbac - best_allow,
            "us",
            format!("{:.1}% of the request", (best_rbac - best_allow) / best_rbac * 100.0),
        ),
    ])
}

/// Runs of the headline create load in `cargo xtask bench apiserver`, and creates per run.
const HEADLINE_RUNS: usize = 5;
const HEADLINE_CREATES: usize = 20_000;

/// `count` creates with 64 clients against a fresh server (and data directory) of `bin`.
async fn fresh_server_creates(bin: &Path, count: usize) -> Result<CreateRun> {
    fresh_server_run(bin, count, Load::Create).await
}

/// `count` requests of `load` with 64 clients against a fresh server (whose pods a patch
/// load creates first).
async fn fresh_server_run(bin: &Path, count: usize, load: Load) -> Result<CreateRun> {
    let server = start_server(bin).await?;
    let client = client(&server.kubeconfig).await?;
    let raw = Arc::new(RawClient::new(&server.kubeconfig)?);
    create_ns(&client, "creates").await?;
    let pid = Some(server.child.id());
    if let Load::Patch { pods } = load {
        creates(&raw, pid, "creates", pods, 64).await?;
    }
    run_load(&raw, pid, "creates", count, 64, load).await
}

/// Two server builds, `pairs` alternating runs of `count` creates with 64 clients each, a
/// fresh server (and data directory) per run. On a VM whose speed swings between minutes, a
/// single run of each says little; alternating pairs see the same swings, so the number of
/// pairs won and the mean ratio are what to read.
async fn compare(a: &Path, b: &Path, pairs: usize, count: usize, load: Load) -> Result<()> {
    let (mut sum_a, mut sum_b, mut wins, mut ratios) = (0.0, 0.0, 0, Vec::new());
    let op = match load {
        Load::Create => "creates",
        Load::Patch { .. } => "patches",
    };
    println!("{:<6} {:>12} {:>12} {:>8}", "pair", format!("A {op}/s"), format!("B {op}/s"), "B/A");
    for pair in 1..=pairs {
        let (ra, rb) =
            (fresh_server_run(a, count, load).await?, fresh_server_run(b, count, load).await?);
        let ratio = rb.per_sec / ra.per_sec;
        println!("{pair:<6} {:>12.0} {:>12.0} {ratio:>8.3}", ra.per_sec, rb.per_sec);
        sum_a += ra.per_sec;
        sum_b += rb.per_sec;
        wins += usize::from(ratio > 1.0);
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "A mean {:.0}/s, B mean {:.0}/s: B/A {:.3} (median pair {:.3}); B won {wins} of {pairs} pairs",
        sum_a / pairs as f64,
        sum_b / pairs as f64,
        sum_b / sum_a,
        ratios[ratios.len() / 2],
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("apiserver") => {
            let bin = PathBuf::from(
                args.get(2).context("usage: skiff-bench apiserver <skiff-server> <out-dir>")?,
            );
            let out = PathBuf::from(args.get(3).map(String::as_str).unwrap_or("target/bench"));
            apiserver(&bin, &out).await
        }
        // The transport's ceiling: transport-floor <count> <clients>
        Some("transport-floor") => {
            let count: usize = args.get(2).map(String::as_str).unwrap_or("30000").parse()?;
            let clients: usize = args.get(3).map(String::as_str).unwrap_or("64").parse()?;
            let run = transport_floor(count, clients).await?;
            println!(
                "{count} no-op HTTPS POSTs with {clients} clients: {:.0}/s; CPU/request (client and server): {:.0} us",
                run.per_sec, run.client_cpu_us
            );
            Ok(())
        }
        // Load against a running server, for profiling:
        // creates <kubeconfig> <count> <clients> [<server pid>]
        Some("creates") => {
            let kubeconfig = PathBuf::from(
                args.get(2).context("usage: skiff-bench creates <kubeconfig> <count> <clients>")?,
            );
            let count: usize = args.get(3).map(String::as_str).unwrap_or("10000").parse()?;
            let clients: usize = args.get(4).map(String::as_str).unwrap_or("64").parse()?;
            let server_pid: Option<u32> = args.get(5).map(|p| p.parse()).transpose()?;
            let client = client(&kubeconfig).await?;
            let raw = Arc::new(RawClient::new(&kubeconfig)?);
            let ns = format!("load-{}", now_ns() % 1_000_000);
            create_ns(&client, &ns).await?;
            let run = creates(&raw, server_pid, &ns, count, clients).await?;
            println!(
                "{count} creates with {clients} clients: {:.0}/s; {}",
                run.per_sec,
                run.note()
            );
            Ok(())
        }
        // Two builds against each other:
        // compare <server A> <server B> [<pairs>] [<count>] [create|patch]
        Some("compare") => {
            let usage = "usage: skiff-bench compare <skiff-server A> <skiff-server B> [pairs] [count] [create|patch]";
            let a = PathBuf::from(args.get(2).context(usage)?);
            let b = PathBuf::from(args.get(3).context(usage)?);
            let pairs: usize = args.get(4).map(String::as_str).unwrap_or("6").parse()?;
            let count: usize = args.get(5).map(String::as_str).unwrap_or("20000").parse()?;
            if pairs == 0 {
                bail!("{usage}: at least one pair");
            }
            let load = match args.get(6).map(String::as_str).unwrap_or("create") {
                "create" => Load::Create,
                "patch" => Load::Patch { pods: 2_000 },
                other => bail!("{usage}: not a load: {other}"),
            };
            compare(&a, &b, pairs, count, load).await
        }
        Some("scheduler") => {
            let bin = PathBuf::from(
                args.get(2).context("usage: skiff-bench scheduler <skiff-server> <out-dir>")?,
            );
            let out = PathBuf::from(args.get(3).map(String::as_str).unwrap_or("target/bench"));
            bench_scheduler::scheduler_bench(&bin, &out).await
        }
        // controllers <skiff-server> [<skiff-server B> ...] [--pods N]
        Some("controllers") => {
            let mut bins = Vec::new();
            let mut pods = 10_000;
            let mut rest = args.iter().skip(2);
            while let Some(a) = rest.next() {
                match a.as_str() {
                    "--pods" => pods = rest.next().context("--pods N")?.parse()?,
                    bin => bins.push(PathBuf::from(bin)),
                }
            }
            bench_controllers::controllers_bench(&bins, pods).await
        }
        // lab-load <bin-dir> [<bin-dir B> ...] [--pods N]
        Some("lab-load") => {
            let mut dirs = Vec::new();
            let mut pods = 10_000;
            let mut rest = args.iter().skip(2);
            while let Some(a) = rest.next() {
                match a.as_str() {
                    "--pods" => pods = rest.next().context("--pods N")?.parse()?,
                    dir => dirs.push(PathBuf::from(dir)),
                }
            }
            bench_lab_load::lab_load_bench(&dirs, pods).await
        }
        // Only the auth rows of the apiserver benchmark.
        Some("auth") => {
            let bin = PathBuf::from(args.get(2).context("usage: skiff-bench auth <skiff-server>")?);
            println!("{:<44} {:>12} {:<8} note", "measure", "value", "unit");
            for (name, value, unit, note) in auth_cost(&bin).await? {
                println!("{name:<44} {value:>12.1} {unit:<8} {note}");
            }
            Ok(())
        }
        other => bail!(
            "unknown benchmark {other:?} (known: apiserver, auth, compare, controllers, creates, lab-load, scheduler)"
        ),
    }
}
