//! Startup, liveness and readiness probes of a running container: exec through the runtime
//! (`exec_sync`), HTTP GET and TCP from the agent to the pod IP. Timing and thresholds as
//! the API defines them (initialDelaySeconds, periodSeconds 10, timeoutSeconds 1,
//! successThreshold 1, failureThreshold 3).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::runtime::Runtime;

/// The result of one probe run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure(String),
}

fn port_of(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok()),
    }
}

/// HTTP GET `path` at `addr`; 2xx and 3xx are success (as the kubelet).
pub async fn http_get(addr: SocketAddr, host: &str, path: &str, timeout: Duration) -> ProbeResult {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(buf)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => ProbeResult::Failure(format!("Get \"http://{addr}{path}\": timeout")),
        Ok(Err(e)) => ProbeResult::Failure(format!("Get \"http://{addr}{path}\": {e}")),
        Ok(Ok(buf)) => {
            let line = String::from_utf8_lossy(&buf);
            let code = line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok());
            match code {
                Some(c) if (200..400).contains(&c) => ProbeResult::Success,
                Some(c) => ProbeResult::Failure(format!("HTTP probe failed with statuscode: {c}")),
                None => ProbeResult::Failure("HTTP probe: malformed response".into()),
            }
        }
    }
}

/// TCP connect to `addr`.
pub async fn tcp_connect(addr: SocketAddr, timeout: Duration) -> ProbeResult {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(_)) => ProbeResult::Success,
        Ok(Err(e)) => ProbeResult::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => ProbeResult::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Runs `probe` once against the container.
pub async fn run_probe<R: Runtime>(
    runtime: &R,
    probe: &Probe,
    c: &Container,
    container_id: &str,
    pod_ip: &str,
) -> ProbeResult {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match runtime.exec_sync(container_id, cmd, timeout.as_secs() as i64).await {
            Ok(r) if r.exit_code == 0 => ProbeResult::Success,
            Ok(r) => ProbeResult::Failure(format!(
                "command exited with {}: {}",
                r.exit_code,
                String::from_utf8_lossy(&r.stdout).trim()
            )),
            Err(e) => ProbeResult::Failure(format!("exec: {e}")),
        };
    }
    let ip: Option<std::net::IpAddr> = pod_ip.parse().ok();
    if let Some(h) = &probe.http_get {
        let host = h.host.clone().filter(|h| !h.is_empty());
        let target = host.as_deref().and_then(|h| h.parse().ok()).or(ip);
        let (Some(ip), Some(port)) = (target, port_of(&h.port, c)) else {
            return ProbeResult::Failure("HTTP probe: no address".into());
        };
        if h.scheme.as_deref() == Some("HTTPS") {
            return ProbeResult::Failure("HTTPS probes are not supported".into());
        }
        let path = h.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
        let header_host = h
            .http_headers
            .iter()
            .flatten()
            .find(|x| x.name.eq_ignore_ascii_case("host"))
            .map(|x| x.value.clone())
            .unwrap_or_else(|| format!("{ip}:{port}"));
        return http_get(SocketAddr::new(ip, port), &header_host, &path, timeout).await;
    }
    if let Some(t) = &probe.tcp_socket {
        let target = t.host.as_deref().and_then(|h| h.parse().ok()).or(ip);
        let (Some(ip), Some(port)) = (target, port_of(&t.port, c)) else {
            return ProbeResult::Failure("TCP probe: no address".into());
        };
        return tcp_connect(SocketAddr::new(ip, port), timeout).await;
    }
    ProbeResult::Failure("unsupported probe handler".into())
}

#[derive(Debug, Default, Clone)]
struct Counter {
    next: Option<Instant>,
    successes: i32,
    failures: i32,
}

impl Counter {
    fn due(&mut self, probe: &Probe, started: Instant, now: Instant) -> bool {
        let next = *self.next.get_or_insert_with(|| {
            started + Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64)
        });
        next <= now
    }

    fn record(&mut self, probe: &Probe, now: Instant, ok: bool) {
        self.next = Some(now + period(probe));
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
    }
}

fn period(probe: &Probe) -> Duration {
    Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64)
}

/// What the probes of a container decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// The container must be killed and restarted (liveness or startup failed): the message.
    pub kill: Option<String>,
    /// When the next probe is due.
    pub next_in: Option<Duration>,
    /// Failed probe runs of this tick (for Unhealthy events).
    pub unhealthy: Vec<String>,
}

/// Probe state of one container instance.
#[derive(Debug, Clone)]
pub struct ProbeTracker {
    container_id: String,
    started: Instant,
    startup_done: bool,
    ready: bool,
    startup: Counter,
    liveness: Counter,
    readiness: Counter,
}

impl ProbeTracker {
    pub fn new(container_id: &str, c: &Container, started: Instant) -> Self {
        ProbeTracker {
            container_id: container_id.into(),
            started,
            startup_done: c.startup_probe.is_none(),
            ready: false,
            startup: Counter::default(),
            liveness: Counter::default(),
            readiness: Counter::default(),
        }
    }

    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// Started: the startup probe passed (or there is none).
    pub fn started(&self) -> bool {
        self.startup_done
    }

    /// Ready: started and the readiness probe passed (or there is none).
    pub fn ready(&self, c: &Container) -> bool {
        self.startup_done && (c.readiness_probe.is_none() || self.ready)
    }

    /// Carries over what the API last said of this container instance (an agent restart
    /// must not flip a ready pod to unready until its probes run again).
    pub fn seeded(mut self, started: bool, ready: bool) -> Self {
        self.startup_done |= started;
        self.ready = ready;
        self
    }

    /// Runs the probes that are due.
    pub async fn tick<R: Runtime>(
        &mut self,
        runtime: &R,
        c: &Container,
        pod_ip: &str,
    ) -> ProbeOutcome {
        let now = Instant::now();
        let mut out = ProbeOutcome::default();
        let mut next: Option<Instant> = None;
        let mut merge = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if !self.startup_done {
            let Some(p) = &c.startup_probe else { return out };
            if self.startup.due(p, self.started, now) {
                let r = run_probe(runtime, p, c, &self.container_id, pod_ip).await;
                self.startup.record(p, now, r == ProbeResult::Success);
                if let ProbeResult::Failure(m) = &r {
                    out.unhealthy.push(format!("Startup probe failed: {m}"));
                }
                if self.startup.successes >= p.success_threshold.unwrap_or(1).max(1) {
                    self.startup_done = true;
                } else if self.startup.failures >= p.failure_threshold.unwrap_or(3).max(1) {
                    out.kill = out.unhealthy.last().cloned();
                    return out;
                }
            }
            if !self.startup_done {
                merge(self.startup.next);
                out.next_in = next.map(|t| t.saturating_duration_since(now));
                return out;
            }
        }
        if let Some(p) = &c.liveness_probe {
            if self.liveness.due(p, self.started, now) {
                let r = run_probe(runtime, p, c, &self.container_id, pod_ip).await;
                self.liveness.record(p, now, r == ProbeResult::Success);
                if let ProbeResult::Failure(m) = r {
                    let msg = format!("Liveness probe failed: {m}");
                    out.unhealthy.push(msg.clone());
                    if self.liveness.failures >= p.failure_threshold.unwrap_or(3).max(1) {
                        out.kill = Some(msg);
                        return out;
                    }
                }
            }
            merge(self.liveness.next);
        }
        if let Some(p) = &c.readiness_probe {
            if self.readiness.due(p, self.started, now) {
                let r = run_probe(runtime, p, c, &self.container_id, pod_ip).await;
                self.readiness.record(p, now, r == ProbeResult::Success);
                if let ProbeResult::Failure(m) = r {
                    out.unhealthy.push(format!("Readiness probe failed: {m}"));
                }
                if self.readiness.successes >= p.success_threshold.unwrap_or(1).max(1) {
                    self.ready = true;
                } else if self.readiness.failures >= p.failure_threshold.unwrap_or(3).max(1) {
                    self.ready = false;
                }
            }
            merge(self.readiness.next);
        }
        out.next_in = next.map(|t| t.saturating_duration_since(now));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn serve_once(status: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn http_and_tcp_probes_on_loopback() {
        let ok = serve_once("200 OK").await;
        assert_eq!(
            http_get(ok, "x", "/healthz", Duration::from_secs(2)).await,
            ProbeResult::Success
        );
        let bad = serve_once("500 Internal Server Error").await;
        assert!(
            matches!(http_get(bad, "x", "/", Duration::from_secs(2)).await, ProbeResult::Failure(m) if m.contains("500"))
        );
        let open = serve_once("200 OK").await;
        assert_eq!(tcp_connect(open, Duration::from_secs(2)).await, ProbeResult::Success);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        assert!(matches!(
            tcp_connect(closed, Duration::from_secs(2)).await,
            ProbeResult::Failure(_)
        ));
    }

    #[test]
    fn named_ports_resolve() {
        let c: Container = serde_json::from_value(serde_json::json!(
            {"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}))
        .expect("c");
        assert_eq!(port_of(&IntOrString::String("http".into()), &c), Some(8080));
        assert_eq!(port_of(&IntOrString::Int(80), &c), Some(80));
        assert_eq!(port_of(&IntOrString::String("nope".into()), &c), None);
    }
}
