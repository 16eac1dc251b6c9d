//! The proxy's HTTP endpoints: `/metrics` (Prometheus text from the pinned maps) and the
//! healthCheckNodePort listeners of externalTrafficPolicy Local load balancers (200 with
//! local endpoints, 503 without, as kube-proxy answers).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use skiff_ebpf_common::{Backend, Counters, RevNat, drop_reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::desired::HealthCheck;
use crate::maps::{self, ServiceMaps};
use crate::status::ProxyStatus;

/// Errors of the HTTP endpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the maps for /metrics")]
    Maps(#[from] maps::Error),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn addr(be: u32, port_be: u16) -> String {
    format!("{}:{}", Ipv4Addr::from(u32::from_be(be)), u16::from_be(port_be))
}

/// Renders the counters in the Prometheus text format.
pub fn render_metrics(
    drops: &[(u32, u64)],
    services: &[(u32, Counters)],
    backends: &[(u32, Counters)],
    rev_nats: &[(u32, RevNat)],
    backend_addrs: &[(u32, Backend)],
) -> String {
    let mut out = String::new();
    let fe: BTreeMap<u32, String> =
        rev_nats.iter().map(|(id, r)| (*id, addr(r.vip_be, r.port_be))).collect();
    let be: BTreeMap<u32, String> =
        backend_addrs.iter().map(|(id, b)| (*id, addr(b.ip_be, b.port_be))).collect();
    let _ = writeln!(out, "# HELP skiff_drops_total Packets and connects refused, by reason.");
    let _ = writeln!(out, "# TYPE skiff_drops_total counter");
    for (reason, n) in drops {
        let _ = writeln!(out, "skiff_drops_total{{reason=\"{}\"}} {n}", drop_reason::name(*reason));
    }
    for (what, rows, names, label) in
        [("service", services, &fe, "frontend"), ("backend", backends, &be, "backend")]
    {
        for (metric, help) in [
            ("packets", "Packets (or translated connects) through"),
            ("bytes", "Bytes through"),
            ("new_connections", "New connections to"),
        ] {
            let name = format!("skiff_{what}_{metric}_total");
            let _ = writeln!(out, "# HELP {name} {help} each {what}.");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (id, c) in rows.iter() {
                let v = match metric {
                    "packets" => c.packets,
                    "bytes" => c.bytes,
                    _ => c.new_conns,
                };
                let l = names.get(id).map(String::as_str).unwrap_or("");
                let _ = writeln!(out, "{name}{{id=\"{id}\",{label}=\"{l}\"}} {v}");
            }
        }
    }
    out
}

/// The status line and body a healthCheckNodePort answers.
pub fn health_response(hc: &HealthCheck) -> (u16, String) {
    let (ns, name) = hc.service.split_once('/').unwrap_or(("", hc.service.as_str()));
    let body = format!(
        "{{\"service\":{{\"namespace\":\"{ns}\",\"name\":\"{name}\"}},\"localEndpoints\":{}}}",
        hc.local_endpoints
    );
    (if hc.local_endpoints > 0 { 200 } else { 503 }, body)
}

async fn respond(stream: &mut tokio::net::TcpStream, status: u16, ctype: &str, body: &str) {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
}

async fn read_path(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        let r = stream.read(&mut buf[n..]).await.ok()?;
        if r == 0 {
            break;
        }
        n += r;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let line = String::from_utf8_lossy(&buf[..n]).lines().next()?.to_string();
    line.split_whitespace().nth(1).map(str::to_string)
}

/// Binds `addr`, waiting (up to 30 s) while another process holds it: during a DaemonSet
/// update the previous proxy pod (host network, same ports) may still be on its way out
/// when the next one starts. Other errors, or a port still taken after that (a kube-proxy
/// left running?), return the bind error.
async fn bind_when_free(addr: SocketAddr) -> Result<TcpListener> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut warned = false;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                if !warned {
                    warn!(%addr, "address in use (the previous proxy still exiting, or a kube-proxy left running?); waiting up to 30 s");
                    warned = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(source) => return Err(Error::Bind { addr, source }),
        }
    }
}

/// Serves `/metrics` on `addr` (kube-proxy's sync metrics, then the counters of the maps
/// pinned in `pin_dir`) until the task is dropped.
pub async fn serve_metrics(
    addr: SocketAddr,
    pin_dir: PathBuf,
    status: Arc<ProxyStatus>,
) -> Result<()> {
    let listener = bind_when_free(addr).await?;
    let maps = ServiceMaps::open_pinned(&pin_dir)?;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let path = read_path(&mut stream).await;
        if path.as_deref() != Some("/metrics") {
            respond(&mut stream, 404, "text/plain", "not found\n").await;
            continue;
        }
        let text = (|| -> Result<String> {
            Ok(status.metrics.render()
                + &render_metrics(
                    &maps.drops()?,
                    &maps.service_stats()?,
                    &maps.backend_stats()?,
                    &maps.rev_nats()?,
                    &maps.backends()?,
                ))
        })();
        match text {
            Ok(t) => {
                respond(&mut stream, 200, "text/plain; version=0.0.4; charset=utf-8", &t).await
            }
            Err(e) => {
                warn!(error = %e, "metrics");
                respond(&mut stream, 500, "text/plain", "maps unreadable\n").await
            }
        }
    }
}

/// Serves kube-proxy's `/healthz` and `/livez` (and skiff's `/readyz`) on `addr` (kube-proxy's
/// `--healthz-bind-address`, default `0.0.0.0:10256`) until the task is dropped.
pub async fn serve_health(addr: SocketAddr, status: Arc<ProxyStatus>) -> Result<()> {
    let listener = bind_when_free(addr).await?;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let status = status.clone();
        tokio::spawn(async move {
            let path = read_path(&mut stream).await.unwrap_or_default();
            let path = path.split('?').next().unwrap_or_default();
            let now = std::time::SystemTime::now();
            let answer = match path {
                "/healthz" => {
                    let a = status.health.healthz(now);
                    count(&status.metrics.healthz, a.code);
                    a
                }
                "/livez" => {
                    let a = status.health.livez(now);
                    count(&status.metrics.livez, a.code);
                    a
                }
                "/readyz" => status.health.readyz(now),
                _ => {
                    respond(&mut stream, 404, "text/plain", "not found\n").await;
                    return;
                }
            };
            respond(&mut stream, answer.code, "application/json", &answer.body).await;
        });
    }
}

fn count(
    family: &prometheus_client::metrics::family::Family<
        Vec<(String, String)>,
        prometheus_client::metrics::counter::Counter,
    >,
    code: u16,
) {
    family.get_or_create(&vec![("code".to_string(), code.to_string())]).inc();
}

/// The healthCheckNodePort listeners, reconciled with the desired set.
#[derive(Default)]
pub struct HealthCheckServers {
    state: Arc<RwLock<BTreeMap<u16, HealthCheck>>>,
    listeners: BTreeMap<u16, JoinHandle<()>>,
}

impl HealthCheckServers {
    /// Opens listeners for new ports, closes removed ones, updates what all report.
    pub async fn reconcile(&mut self, desired: &BTreeMap<u16, HealthCheck>) {
        if let Ok(mut s) = self.state.write() {
            *s = desired.clone();
        }
        self.listeners.retain(|port, task| {
            let keep = desired.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for port in desired.keys() {
            if self.listeners.contains_key(port) {
                continue;
            }
            let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port));
            let listener = match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    warn!(port, error = %e, "healthCheckNodePort bind failed");
                    continue;
                }
            };
            let state = self.state.clone();
            let port = *port;
            self.listeners.insert(
                port,
                tokio::spawn(async move {
                    loop {
                        let Ok((mut stream, _)) = listener.accept().await else { continue };
                        let _ = read_path(&mut stream).await;
                        let hc = state.read().ok().and_then(|s| s.get(&port).cloned());
                        match hc {
                            Some(hc) => {
                                let (status, body) = health_response(&hc);
                                respond(&mut stream, status, "application/json", &body).await
                            }
                            None => respond(&mut stream, 404, "text/plain", "").await,
                        }
                    }
                }),
            );
        }
    }

    /// Ports currently served.
    pub fn ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }
}

impl Drop for HealthCheckServers {
    fn drop(&mut self) {
        for t in self.listeners.values() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_names_frontends_and_reasons() {
        let c = Counters { packets: 3, bytes: 180, new_conns: 1 };
        let rev = RevNat {
            vip_be: u32::from(Ipv4Addr::new(10, 96, 0, 10)).to_be(),
            port_be: 80u16.to_be(),
            _pad: 0,
        };
        let t = render_metrics(&[(drop_reason::NO_BACKEND, 2)], &[(7, c)], &[], &[(7, rev)], &[]);
        assert!(t.contains("skiff_drops_total{reason=\"no-backend\"} 2"), "{t}");
        assert!(
            t.contains("skiff_service_packets_total{id=\"7\",frontend=\"10.96.0.10:80\"} 3"),
            "{t}"
        );
        assert!(t.contains(
            "skiff_service_new_connections_total{id=\"7\",frontend=\"10.96.0.10:80\"} 1"
        ));
    }

    #[test]
    fn health_check_answers_like_kube_proxy() {
        let up = HealthCheck { service: "default/web".into(), local_endpoints: 2 };
        let (status, body) = health_response(&up);
        assert_eq!(status, 200);
        assert!(body.contains("\"localEndpoints\":2") && body.contains("\"name\":\"web\""));
        let down = HealthCheck { local_endpoints: 0, ..up };
        assert_eq!(health_response(&down).0, 503);
    }

    #[tokio::test]
    async fn health_check_listeners_follow_the_desired_set() {
        let mut servers = HealthCheckServers::default();
        // Port 0 would be random; pick a free port first.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut want = BTreeMap::new();
        want.insert(port, HealthCheck { service: "default/web".into(), local_endpoints: 1 });
        servers.reconcile(&want).await;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        servers.reconcile(&BTreeMap::new()).await;
        assert!(servers.ports().is_empty());
    }
}
