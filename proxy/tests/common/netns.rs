//! A three-namespace rig (client — node — backend on veths) created by the test and deleted
//! on drop, helpers to run code inside a namespace on a dedicated thread, echo servers, and a
//! cgroup guard for the socket-LB hooks.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
pub const NODE_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
pub const NODE_BACKEND_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);
pub const BACKEND_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 201, 1, 2), Ipv4Addr::new(10, 201, 1, 3)];
pub const BACKEND_PORT: u16 = 8080;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A named network namespace (/run/netns/NAME), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: String) -> Self {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(Command::new("ip").args(["netns", "add", &name]));
        Self { name }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `ip -n NAME args...`.
    pub fn ip(&self, args: &[&str]) {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args));
    }

    /// Creates the veth pair `name` (here) — `peer` (in `peer_ns`).
    pub fn add_veth(&self, name: &str, peer: &str, peer_ns: &Netns) {
        self.ip(&[
            "link",
            "add",
            name,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            &peer_ns.name,
        ]);
    }

    /// Runs a command in this namespace (host mount namespace kept).
    pub fn nsenter(&self, args: &[&str]) {
        run(Command::new("nsenter").arg(format!("--net={}", self.path().display())).args(args));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Enters the namespace at `path` on the current thread (only ever call on a dedicated one).
pub fn enter(path: &Path) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: setns on a valid namespace fd; affects only the calling thread, which is a
    // dedicated thread owned by the test.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {}: {}", path.display(), std::io::Error::last_os_error());
}

/// Runs `f` on a new thread inside the namespace and returns its result.
pub fn in_netns<T: Send, F: FnOnce() -> T + Send>(ns: &Netns, f: F) -> T {
    let path = ns.path();
    std::thread::scope(|s| {
        s.spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .expect("netns thread panicked")
    })
}

/// Turns off TX checksum offload of `iface` in the current thread's namespace, so frames
/// carry complete L4 checksums as they would arriving from a physical NIC (XDP sees raw
/// frames; a veth peer with offload leaves only a partial pseudo-header sum).
pub fn disable_tx_csum(iface: &str) {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_STXCSUM: u32 = 0x17;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    let mut val = EthtoolValue { cmd: ETHTOOL_STXCSUM, data: 0 };
    // SAFETY: a zeroed ifreq is valid; the name is copied within its bounds; ifru_data points
    // at `val`, which outlives the ioctl; the socket is closed right after.
    unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(iface.bytes().take(15)) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = (&mut val as *mut EthtoolValue).cast();
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let rc = libc::ioctl(fd, SIOCETHTOOL, &mut ifr);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(rc, 0, "ETHTOOL_STXCSUM off on {iface}: {err}");
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// client (10.201.0.2) — node (10.201.0.1 | 10.201.1.1, forwarding) — backend (10.201.1.2
/// and .3). Nothing is connected to the host's interfaces.
pub struct Rig {
    pub client: Netns,
    pub node: Netns,
    pub backend: Netns,
}

impl Rig {
    pub fn new() -> Self {
        let tag = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
        let client = Netns::new(format!("skf-c-{tag}"));
        let node = Netns::new(format!("skf-n-{tag}"));
        let backend = Netns::new(format!("skf-b-{tag}"));
        node.add_veth("n0", "c0", &client);
        node.add_veth("n1", "b0", &backend);
        for ns in [&client, &node, &backend] {
            ns.ip(&["link", "set", "lo", "up"]);
        }
        client.ip(&["addr", "add", "10.201.0.2/24", "dev", "c0"]);
        client.ip(&["link", "set", "c0", "up"]);
        client.ip(&["route", "add", "default", "via", "10.201.0.1"]);
        node.ip(&["addr", "add", "10.201.0.1/24", "dev", "n0"]);
        node.ip(&["addr", "add", "10.201.1.1/24", "dev", "n1"]);
        node.ip(&["link", "set", "n0", "up"]);
        node.ip(&["link", "set", "n1", "up"]);
        node.nsenter(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        backend.ip(&["addr", "add", "10.201.1.2/24", "dev", "b0"]);
        backend.ip(&["addr", "add", "10.201.1.3/24", "dev", "b0"]);
        backend.ip(&["link", "set", "b0", "up"]);
        backend.ip(&["route", "add", "default", "via", "10.201.1.1"]);
        Self { client, node, backend }
    }
}

/// TCP and UDP echo servers on 0.0.0.0:8080 in a namespace. Each reply is
/// `LOCAL_IP|PEER_IP|DATA`, so tests see which backend answered and whether the client
/// address survived. Stopped and joined on drop.
pub struct EchoServers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServers {
    pub fn start(ns: &Netns) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let path = ns.path();
        let mut threads = Vec::new();
        {
            let stop = stop.clone();
            let path = path.clone();
            let tx = tx.clone();
            threads.push(std::thread::spawn(move || {
                enter(&path);
                let l = TcpListener::bind(("0.0.0.0", BACKEND_PORT)).expect("bind tcp echo");
                l.set_nonblocking(true).unwrap();
                tx.send(()).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((mut s, peer)) => {
                            s.set_nonblocking(false).unwrap();
                            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                            let local = s.local_addr().unwrap();
                            let mut data = Vec::new();
                            let _ = s.read_to_end(&mut data);
                            let reply = format!(
                                "{}|{}|{}",
                                local.ip(),
                                peer.ip(),
                                String::from_utf8_lossy(&data)
                            );
                            let _ = s.write_all(reply.as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }));
        }
        {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                enter(&path);
                // One socket per address so replies leave from the address that was asked.
                let socks: Vec<UdpSocket> = BACKEND_IPS
                    .iter()
                    .map(|ip| {
                        let s = UdpSocket::bind((*ip, BACKEND_PORT)).expect("bind udp echo");
                        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
                        s
                    })
                    .collect();
                tx.send(()).unwrap();
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::SeqCst) {
                    for s in &socks {
                        if let Ok((n, peer)) = s.recv_from(&mut buf) {
                            let local = s.local_addr().unwrap();
                            let reply = format!(
                                "{}|{}|{}",
                                local.ip(),
                                peer.ip(),
                                String::from_utf8_lossy(&buf[..n])
                            );
                            let _ = s.send_to(reply.as_bytes(), peer);
                        }
                    }
                }
            }));
        }
        rx.recv().unwrap();
        rx.recv().unwrap();
        Self { stop, threads }
    }
}

impl Drop for EchoServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A cgroup v2 directory created under the root for one test; removed on drop.
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    pub fn new(root: &Path) -> Self {
        let path = root.join(format!(
            "skiff-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Spawns `/usr/bin/python3 -c SCRIPT args` inside `ns` and inside `cgroup` (joined before
/// exec, so its very first connect() is seen by the hooks), stdout piped.
pub fn spawn_client_in(
    ns: &Netns,
    cgroup: &Path,
    script: &str,
    args: &[&str],
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "/usr/bin/python3 is required by the netns tests (apt-get install python3)"
    );
    let ns_file = std::fs::File::open(ns.path()).expect("open netns");
    let procs =
        std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes().to_vec())
            .unwrap();
    let ns_fd = ns_file.as_raw_fd();
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: the closure only makes raw syscalls (open/write/close/setns) on values prepared
    // before fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn python client");
    drop(ns_file);
    child
}

/// Waits for a client spawned by `spawn_client_in`, asserts success, returns stdout.
pub fn client_output(child: std::process::Child) -> String {
    let out = child.wait_with_output().expect("wait for python client");
    assert!(
        out.status.success(),
        "client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the python client to completion; see `spawn_client_in`.
pub fn run_client_in(ns: &Netns, cgroup: &Path, script: &str, args: &[&str]) -> String {
    client_output(spawn_client_in(ns, cgroup, script, args))
}

/// The python client: `tcp|udp|tcp-long VIP PORT MSG`; prints `peer IP PORT` and
/// `data ...`, or `refused` when connect()/sendto() is refused. `tcp-long` streams MSG
/// every 10 ms for 2 s before reading the echo, and prints the echoed length.
pub const CLIENT_PY: &str = r#"
import socket, sys, time
proto, vip, port, msg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    if proto == "tcp-long":
        s = socket.create_connection((vip, port), timeout=5)
        peer = s.getpeername()
        sent = 0
        end = time.time() + 2.0
        while time.time() < end:
            s.sendall(msg.encode()); sent += len(msg)
            time.sleep(0.01)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            d = s.recv(65536)
            if not d: break
            data += d
        print("peer", peer[0], peer[1])
        print("sent", sent)
        print("data", data.decode()[:64])
        print("echoed", len(data.decode().split("|", 2)[2]))
        sys.exit(0)
    if proto == "tcp":
        s = socket.create_connection((vip, port), timeout=5)
        peer = s.getpeername()
        s.sendall(msg.encode()); s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            d = s.recv(4096)
            if not d: break
            data += d
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
        s.sendto(msg.encode(), (vip, port))
        data, peer = s.recvfrom(4096)
    print("peer", peer[0], peer[1])
    print("data", data.decode())
except ConnectionRefusedError:
    print("refused")
"#;

pub fn sockaddr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}
