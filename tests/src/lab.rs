//! The end-to-end tests' side of the lab (`skiff_agent::lab`, the code behind
//! `cargo xtask up`): a lab taken down on drop (also when the test fails, after printing
//! what kubectl sees and the end of every log), and kubectl helpers for pods in one
//! namespace.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_agent::lab::{self, LabConfig, LabState};

use crate::Kubectl;

/// How much of each process's log a failed run prints.
const FAILURE_LOG_LINES: usize = 80;

/// The binaries' directory (`target/<profile>`) of a test binary in `target/<profile>/deps`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().and_then(|p| p.parent()).expect("target dir").to_path_buf()
}

/// A lab, taken down on drop.
pub struct Lab {
    pub state: LabState,
    pub dir: PathBuf,
    pub rt: tokio::runtime::Runtime,
}

impl Lab {
    /// Brings up a lab named `<prefix><pid>` in `/run/skiff-<name>` from `config` (name,
    /// dir, server dir and bin dir are set here), first taking down labs a killed run of the
    /// same test left behind (`/run/skiff-<prefix>*`).
    pub fn start(prefix: &str, mut config: LabConfig) -> Lab {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let name = format!("{prefix}{}", std::process::id() % 100_000);
        let dir = PathBuf::from(format!("/run/skiff-{name}"));
        config.name = name;
        config.dir = dir.clone();
        config.server_data_dir = dir.join("server");
        config.bin_dir = Some(bin_dir());
        let stale_prefix = format!("skiff-{prefix}");
        let stale = std::fs::read_dir("/run")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stale_prefix))
            .map(|e| e.path());
        match rt.block_on(lab::down_stale(stale)) {
            Ok(cleaned) if !cleaned.is_empty() => {
                eprintln!("lab: took down stale labs {cleaned:?}")
            }
            Ok(_) => {}
            Err(e) => eprintln!("lab: taking down stale labs: {e}"),
        }
        let state = match rt.block_on(lab::up(&config)) {
            Ok(s) => s,
            Err(e) => {
                let _ = rt.block_on(lab::down(&dir));
                panic!("lab up failed: {e:?}");
            }
        };
        Lab { state, dir, rt }
    }

    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(33, &self.state.kubeconfig)
    }

    /// On a failed run, before the lab (and its logs) go: the cluster's objects as kubectl
    /// sees them and the end of the server's and every agent's log.
    pub fn report_failure(&self) {
        let k = self.kubectl();
        for what in [&["get", "nodes,pods", "-A", "-o", "wide"][..], &["get", "events", "-A"]] {
            let out = k.run(&[&["--request-timeout=10s"], what].concat(), None);
            eprintln!(
                "lab: kubectl {}:\n{}{}",
                what.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if self.state.proxy == lab::ProxyMode::Daemonset {
            let out = k.run(
                &[
                    "--request-timeout=10s",
                    "-n",
                    "kube-system",
                    "logs",
                    "-l",
                    "k8s-app=skiff-proxy",
                    "--all-containers",
                    "--prefix",
                    "--tail=40",
                ],
                None,
            );
            eprintln!(
                "lab: the proxy pods' logs:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let logs = std::iter::once(("skiff-server".to_string(), self.state.server_log()))
            .chain(self.state.nodes.iter().map(|n| (n.name.clone(), n.agent_log())));
        for (name, log) in logs {
            let tail = lab::log_tail(&log, FAILURE_LOG_LINES);
            eprintln!("lab: the end of {name}'s log:\n{tail}");
        }
    }

    /// `wget -q -O- url` from the outside namespace (3 s bound); the body, or None.
    pub fn outside_get(&self, url: &str) -> Option<String> {
        let out = self
            .state
            .outside_command(&["timeout", "3", "/bin/busybox", "wget", "-q", "-O-", url])
            .stdin(Stdio::null())
            .output()
            .expect("outside wget");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.report_failure();
        }
        if let Err(e) = self.rt.block_on(lab::down(&self.dir)) {
            eprintln!("lab: taking the lab down: {e}");
        }
    }
}

/// What the tests need of a pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub name: String,
    pub node: String,
    pub ip: String,
    pub ready: bool,
    pub phase: String,
    pub restarts: i64,
    pub uid: String,
    /// The first container's image.
    pub image: String,
}

/// The pods of `ns` matching `selector` that are not being deleted.
pub fn pods(k: &Kubectl, ns: &str, selector: &str) -> Vec<PodInfo> {
    let out = k.run(&["-n", ns, "get", "pods", "-l", selector, "-o", "json"], None);
    if !out.status.success() {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| PodInfo {
            name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
            uid: p["metadata"]["uid"].as_str().unwrap_or_default().into(),
            node: p["spec"]["nodeName"].as_str().unwrap_or_default().into(),
            ip: p["status"]["podIP"].as_str().unwrap_or_default().into(),
            phase: p["status"]["phase"].as_str().unwrap_or_default().into(),
            image: p["spec"]["containers"][0]["image"].as_str().unwrap_or_default().into(),
            ready: p["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")),
            restarts: p["status"]["containerStatuses"]
                .as_array()
                .map(|cs| cs.iter().map(|c| c["restartCount"].as_i64().unwrap_or(0)).sum())
                .unwrap_or(0),
        })
        .collect()
}

/// Polls `check` every 200 ms until it gives a value; panics after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (90 s) for exactly `n` Running and Ready pods matching `selector`.
pub fn ready_pods(k: &Kubectl, ns: &str, selector: &str, n: usize) -> Vec<PodInfo> {
    wait_for(&format!("{n} ready pods {selector}"), Duration::from_secs(90), || {
        let p = pods(k, ns, selector);
        (p.len() == n && p.iter().all(|p| p.ready && p.phase == "Running")).then_some(p)
    })
}

/// Runs `script` in `pod` through `kubectl exec` (bounded); its output.
pub fn exec(k: &Kubectl, ns: &str, pod: &str, script: &str) -> String {
    let out = Command::new("timeout")
        .arg("60")
        .arg(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["-n", ns, "exec", pod, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("kubectl exec");
    assert!(
        out.status.success(),
        "kubectl exec {pod} {script:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `n` GETs of `url` from `pod`; the bodies (FAIL for a failed request).
pub fn hits(k: &Kubectl, ns: &str, pod: &str, url: &str, n: usize) -> Vec<String> {
    let script = format!(
        "i=0; while [ $i -lt {n} ]; do timeout 3 wget -q -O- {url} || echo FAIL; i=$((i+1)); done"
    );
    exec(k, ns, pod, &script).lines().map(str::to_string).collect()
}

/// GETs of `url` from `pod` in a loop for `secs` seconds, in the background; the join gives
/// (ok, failed).
pub fn load(
    k: &Kubectl,
    ns: &str,
    pod: &str,
    url: &str,
    secs: u32,
) -> std::thread::JoinHandle<(u64, u64)> {
    let script = format!(
        "end=$(( $(date +%s) + {secs} )); ok=0; fail=0; while [ $(date +%s) -lt $end ]; do \
         if timeout 3 wget -q -O /dev/null {url}; then ok=$((ok+1)); else fail=$((fail+1)); fi; \
         done; echo $ok $fail"
    );
    let mut cmd = Command::new("timeout");
    cmd.arg(format!("{}", secs + 60))
        .arg(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["-n", ns, "exec", pod, "--", "sh", "-c", &script])
        .stdin(Stdio::null());
    std::thread::spawn(move || {
        let out = cmd.output().expect("kubectl exec (load)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut f = text.split_whitespace().map(|n| n.parse::<u64>().unwrap_or(0));
        assert!(out.status.success(), "load exec failed: {}", String::from_utf8_lossy(&out.stderr));
        (f.next().unwrap_or(0), f.next().unwrap_or(u64::MAX))
    })
}
