//! Test rig: network namespaces with RAII cleanup, the plugin run exactly as libcni runs it
//! (CNI_* variables, config on stdin, result on stdout), and reachability probes. All
//! traffic stays inside namespaces created here.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use skiff_cni::netns::{NetNs, run_in};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A unique, short name: `skc<pid>-<n>` (netns names and link names never collide between
/// parallel tests or with leftovers of other runs).
pub fn unique(tag: &str) -> String {
    format!(
        "skc{}{}-{}",
        std::process::id() % 100_000,
        tag,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn sh(cmd: &mut Command) -> Output {
    let out =
        cmd.output().unwrap_or_else(|e| panic!("spawning {cmd:?}: {e} (is the binary installed?)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A named network namespace (`/run/netns/NAME`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        sh(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    pub fn open(&self) -> NetNs {
        NetNs::open(self.path()).unwrap()
    }

    /// Runs a command inside this namespace (host mount namespace: nsenter, not `ip netns exec`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display())).args(args);
        c
    }

    pub fn exec(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&sh(&mut self.command(args)).stdout).into_owned()
    }

    pub fn try_exec(&self, args: &[&str]) -> bool {
        self.command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    pub fn ping(&self, ip: Ipv4Addr) -> bool {
        self.try_exec(&["busybox", "ping", "-c", "1", "-W", "2", &ip.to_string()])
    }

    /// Names of the links in this namespace.
    pub fn links(&self) -> Vec<String> {
        self.exec(&["ip", "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            .collect()
    }

    pub fn exists_link(&self, name: &str) -> bool {
        self.links().iter().any(|l| l == name)
    }

    /// `ip -4 route show` lines (main table).
    pub fn routes(&self) -> Vec<String> {
        self.exec(&["ip", "-4", "route", "show"]).lines().map(str::to_owned).collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ =
            Command::new("ip").args(["netns", "del", &self.name]).stderr(Stdio::null()).status();
    }
}

/// A node: a namespace whose loopback holds `node_ip`, a data dir, a podCIDR.
pub struct Node {
    pub ns: Netns,
    pub data_dir: tempfile::TempDir,
    pub pod_cidr: String,
}

impl Node {
    pub fn new(pod_cidr: &str, node_ip: &str) -> Self {
        let node = Self::bare(pod_cidr);
        node.ns.exec(&["ip", "addr", "add", &format!("{node_ip}/32"), "dev", "lo"]);
        node
    }

    /// A node without any address (the caller wires it, e.g. to a [`Lab`]).
    pub fn bare(pod_cidr: &str) -> Self {
        Self {
            ns: Netns::new("n"),
            data_dir: tempfile::tempdir().unwrap(),
            pod_cidr: pod_cidr.to_owned(),
        }
    }

    pub fn config(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "skiff",
            "type": "skiff-cni",
            "podCIDR": self.pod_cidr,
            "dataDir": self.data_dir.path(),
            "mtu": 1500,
            "someUnknownField": {"ignored": true},
        })
    }

    /// The IPAM record files (one per allocated address).
    pub fn allocations(&self) -> Vec<String> {
        let dir = self.data_dir.path().join("networks/skiff");
        let Ok(rd) = std::fs::read_dir(dir) else { return vec![] };
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.parse::<Ipv4Addr>().is_ok())
            .collect();
        v.sort();
        v
    }

    /// Host-side veths of skiff-cni in the node.
    pub fn pod_links(&self) -> Vec<String> {
        self.ns.links().into_iter().filter(|l| l.starts_with("sk") || l.starts_with("sp")).collect()
    }

    pub fn plugin(&self) -> Plugin<'_> {
        Plugin { node: self }
    }
}

pub struct Plugin<'a> {
    node: &'a Node,
}

/// One plugin invocation's outcome.
#[derive(Debug)]
pub struct Reply {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl Reply {
    pub fn ok(&self) -> &Value {
        assert_eq!(self.code, 0, "plugin failed: {} {}", self.json, self.stderr);
        &self.json
    }

    pub fn err_code(&self) -> u64 {
        assert_ne!(self.code, 0, "plugin unexpectedly succeeded: {}", self.json);
        self.json["code"].as_u64().unwrap_or_else(|| panic!("error without code: {}", self.json))
    }
}

pub fn plugin_bin() -> &'static str {
    env!("CARGO_BIN_EXE_skiff-cni")
}

/// The plugin's command line, as libcni would run it from a runtime in the node namespace.
pub fn plugin_command(
    node: &Netns,
    cmd: &str,
    cid: &str,
    ifname: &str,
    netns: Option<&Path>,
) -> Command {
    let mut c = node.command(&[plugin_bin()]);
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", cmd)
        .env("CNI_PATH", Path::new(plugin_bin()).parent().unwrap());
    if !cid.is_empty() {
        c.env("CNI_CONTAINERID", cid);
    }
    if !ifname.is_empty() {
        c.env("CNI_IFNAME", ifname);
    }
    if let Some(n) = netns {
        c.env("CNI_NETNS", n);
    }
    c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

pub fn finish(mut child: std::process::Child, stdin: &[u8]) -> Reply {
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"))
    };
    Reply {
        code: out.status.code().unwrap_or(-1),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Plugin<'_> {
    pub fn raw(
        &self,
        cmd: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&Path>,
        stdin: &[u8],
    ) -> Reply {
        let child = plugin_command(&self.node.ns, cmd, cid, ifname, netns).spawn().unwrap();
        finish(child, stdin)
    }

    pub fn call(
        &self,
        cmd: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&Path>,
        config: &Value,
    ) -> Reply {
        self.raw(cmd, cid, ifname, netns, config.to_string().as_bytes())
    }

    pub fn add(&self, version: &str, cid: &str, pod: &Netns) -> Reply {
        self.call("ADD", cid, "eth0", Some(&pod.path()), &self.node.config(version))
    }

    pub fn del(&self, version: &str, cid: &str, netns: Option<&Path>) -> Reply {
        self.call("DEL", cid, "eth0", netns, &self.node.config(version))
    }

    pub fn check(&self, version: &str, cid: &str, pod: &Netns, prev: &Value) -> Reply {
        let mut cfg = self.node.config(version);
        cfg["prevResult"] = prev.clone();
        self.call("CHECK", cid, "eth0", Some(&pod.path()), &cfg)
    }

    pub fn gc(&self, valid: &[(&str, &str)]) -> Reply {
        let mut cfg = self.node.config("1.1.0");
        cfg["cni.dev/valid-attachments"] =
            valid.iter().map(|(c, i)| json!({"containerID": c, "ifname": i})).collect();
        self.call("GC", "", "", None, &cfg)
    }
}

/// The pod address of an ADD result.
pub fn result_ip(result: &Value) -> Ipv4Addr {
    let addr =
        result["ips"][0]["address"].as_str().unwrap_or_else(|| panic!("no address in {result}"));
    addr.split('/').next().unwrap().parse().unwrap()
}

/// Opens a TCP listener in `server`, connects from `client`, exchanges a line; returns the
/// client address the server saw.
pub fn tcp_roundtrip(
    server: &NetNs,
    server_ip: Ipv4Addr,
    client: &NetNs,
) -> Result<SocketAddr, String> {
    let listener = run_in(server, || TcpListener::bind((server_ip, 0)))
        .unwrap()
        .map_err(|e| format!("bind: {e}"))?;
    let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    let accept = std::thread::spawn(move || -> std::io::Result<(String, SocketAddr)> {
        let (mut s, peer) = listener.accept()?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        s.write_all(b"pong!")?;
        Ok((String::from_utf8_lossy(&buf).into_owned(), peer))
    });
    let mut stream = run_in(client, || TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
        .unwrap()
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    stream.write_all(b"ping!").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
    let (got, peer) =
        accept.join().map_err(|_| "accept panicked".to_owned())?.map_err(|e| e.to_string())?;
    if &buf == b"pong!" && got == "ping!" {
        Ok(peer)
    } else {
        Err(format!("bad exchange {buf:?} {got}"))
    }
}

/// A lab L2 segment: a bridge in its own namespace, connected to nothing but the nodes
/// plugged into it.
pub struct Lab {
    pub ns: Netns,
    ports: usize,
}

impl Lab {
    pub fn new() -> Self {
        let ns = Netns::new("l");
        ns.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
        ns.exec(&["ip", "link", "set", "br0", "up"]);
        Self { ns, ports: 0 }
    }

    /// Plugs `node` into the bridge as its `lab0` with `addr` (CIDR notation).
    pub fn plug(&mut self, node: &Netns, addr: &str) {
        self.ports += 1;
        let (a, b) = (format!("la{}", self.ports), format!("lb{}", self.ports));
        self.ns.exec(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
        self.ns.exec(&["ip", "link", "set", &b, "netns", node.path().to_str().unwrap()]);
        self.ns.exec(&["ip", "link", "set", &a, "master", "br0", "up"]);
        node.exec(&["ip", "link", "set", &b, "name", "lab0"]);
        node.exec(&["ip", "addr", "add", addr, "dev", "lab0"]);
        node.exec(&["ip", "link", "set", "lab0", "up"]);
    }
}
