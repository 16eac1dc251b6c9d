//! `cargo xtask bench dataplane`. Part 1 (+ map programming of part 3): ns/packet of the tc
//! and XDP programs through BPF_PROG_TEST_RUN for a hit and a miss at 10, 1k, 10k and 30k
//! services, and the time to program the maps (full sync, one service added). Part 2: new
//! TCP connections/s and connect p99 through a ClusterIP at 10, 1k, 10k services: skiff's
//! socket LB vs kube-proxy-style iptables rules (target service last) vs a direct connection,
//! each in fresh namespaces of the same run. Runs as root; maps live in a bpffs mounted on a
//! temp dir; all traffic stays in namespaces the benchmark creates and deletes.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use aya::{TestRun, TestRunOptions};
use skiff_ebpf_common::{PROTO_TCP, svc_flags};
use skiff_proxy::desired::{BackendAddr, BackendSpec, DesiredState, Frontend, FrontendSpec};
use skiff_proxy::loader::Dataplane;
use skiff_proxy::maps::ServiceMaps;
use skiff_proxy::sync::ServiceMapSync;

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const RUNS: usize = 20_000;
const ENDPOINTS: usize = 10;

struct Bpffs(tempfile::TempDir);
impl Drop for Bpffs {
    fn drop(&mut self) {
        // A busy mount (programs still being released) gets retried, then lazily detached:
        // the temp dir must never stay mounted.
        for _ in 0..10 {
            if Command::new("umount").arg(self.0.path()).status().is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i as u32)
}

fn desired(n: usize) -> DesiredState {
    let mut d = DesiredState::default();
    for i in 0..n {
        let backends = (0..ENDPOINTS)
            .map(|j| BackendSpec {
                addr: BackendAddr {
                    ip: Ipv4Addr::from(
                        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * ENDPOINTS + j) as u32,
                    ),
                    port: 8080,
                    proto: PROTO_TCP,
                },
                terminating: false,
                local: true,
            })
            .collect();
        let spec = FrontendSpec {
            service: format!("default/s{i}:http"),
            flags: svc_flags::CLUSTER_IP,
            affinity_timeout_s: 0,
            source_ranges: Vec::new(),
            backends,
        };
        d.frontends.insert(Frontend { ip: vip(i), port: 80, proto: PROTO_TCP }, spec.clone());
        if i == n / 2 {
            let np = FrontendSpec { flags: svc_flags::NODE_PORT, ..spec };
            d.frontends
                .insert(Frontend { ip: Ipv4Addr::UNSPECIFIED, port: 30080, proto: PROTO_TCP }, np);
        }
    }
    d
}

/// Eth + IPv4 + TCP (ACK) with valid checksums.
fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut p = vec![0u8; 54];
    p[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    p[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    p[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    p[14] = 0x45;
    p[16..18].copy_from_slice(&40u16.to_be_bytes());
    p[22] = 64;
    p[23] = PROTO_TCP;
    p[26..30].copy_from_slice(&src.octets());
    p[30..34].copy_from_slice(&dst.octets());
    let c = csum(&p[14..34], 0);
    p[24..26].copy_from_slice(&c.to_be_bytes());
    p[34..36].copy_from_slice(&sport.to_be_bytes());
    p[36..38].copy_from_slice(&dport.to_be_bytes());
    p[46] = 5 << 4;
    p[47] = 0x10;
    let mut s = 0u32;
    for w in p[26..34].chunks(2) {
        s += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    s += PROTO_TCP as u32 + 20;
    let c = csum(&p[34..54], s);
    p[50..52].copy_from_slice(&c.to_be_bytes());
    p
}

fn csum(d: &[u8], mut s: u32) -> u16 {
    for w in d.chunks(2) {
        s += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Median program run time over RUNS single runs (the kernel times only the program).
fn measure(mut run: impl FnMut(&[u8], &mut [u8]) -> Result<Duration>, pkt: &[u8]) -> Result<f64> {
    let mut out = vec![0u8; 256];
    let mut ns: Vec<u128> = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        ns.push(run(pkt, &mut out)?.as_nanos());
    }
    ns.sort_unstable();
    Ok(ns[RUNS / 2] as f64)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--client") {
        return connect_client(&args[2..]);
    }
    // SKIFF_BENCH_PART=1 or 2 runs one part only.
    let part = std::env::var("SKIFF_BENCH_PART").unwrap_or_default();
    if part != "2" {
        part1()?;
    }
    if part != "1" {
        part2()?;
    }
    Ok(())
}

fn part1() -> Result<()> {
    let mut rows = Vec::new();
    // SKIFF_BENCH_SIZES=10,10000 measures only those service counts.
    let sizes: Vec<usize> = match std::env::var("SKIFF_BENCH_SIZES") {
        Ok(v) => v.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?,
        Err(_) => vec![10, 1_000, 10_000, 30_000],
    };
    for n in sizes {
        let dir = tempfile::tempdir()?;
        let st = Command::new("mount").args(["-t", "bpf", "bpf"]).arg(dir.path()).status()?;
        ensure!(st.success(), "mounting bpffs (the benchmark needs root)");
        let bpffs = Bpffs(dir);
        let pin = bpffs.0.path().join("skiff");
        let t = Instant::now();
        let mut dp = Dataplane::load(&pin, NODE).context("loading the data plane")?;
        eprintln!("n={n}: load (maps created, programs loaded) {:?}", t.elapsed());
        let mut maps = ServiceMaps::open_pinned(&pin)?;
        let d = desired(n);
        let mut state = ServiceMapSync::new();
        let t = Instant::now();
        let plan = state.plan(&d);
        let plan_full = t.elapsed();
        state.apply(&mut maps, plan)?;
        let full_sync = t.elapsed();
        let mut d1 = d.clone();
        d1.frontends.insert(
            Frontend { ip: vip(n + 1), port: 80, proto: PROTO_TCP },
            d.frontends.values().next().cloned().context("non-empty")?,
        );
        let t = Instant::now();
        let plan = state.plan(&d1);
        let plan_time = t.elapsed();
        let n_ops = plan.ops.len();
        state.apply(&mut maps, plan)?;
        let add_one = t.elapsed();
        eprintln!(
            "n={n}: full sync: plan {plan_full:?}, apply {:?}; add one service: plan {plan_time:?}, {n_ops} map ops, total {add_one:?}",
            full_sync - plan_full
        );
        // The same services as kube-proxy's iptables mode would write them, loaded by
        // iptables-restore into a fresh namespace (30k x 10 would take minutes: skipped).
        // (SKIFF_BENCH_IPTABLES=0 skips it.)
        let ipt_restore =
            if n <= 10_000 && std::env::var("SKIFF_BENCH_IPTABLES").as_deref() != Ok("0") {
                let ns = Netns::new(&format!("skb-r-{}-{n}", std::process::id()))?;
                let rules = kube_proxy_rules(n);
                let t = Instant::now();
                ns.run(&["iptables-restore"], Some(&rules))?;
                Some(t.elapsed())
            } else {
                None
            };

        let target = vip(n / 2);
        let hit = tcp(CLIENT, 40000, target, 80);
        let miss = tcp(CLIENT, 40000, Ipv4Addr::new(10, 200, 0, 1), 80);
        let np_hit = tcp(CLIENT, 40001, NODE, 30080);
        let np_miss = tcp(CLIENT, 40001, NODE, 22);
        let mut tc = |pkt: &[u8], out: &mut [u8]| -> Result<Duration> {
            let prog = dp.tc_program()?;
            Ok(prog
                .test_run(TestRunOptions {
                    data_in: Some(pkt),
                    data_out: Some(out),
                    ..Default::default()
                })?
                .duration)
        };
        let tc_hit = measure(&mut tc, &hit)?;
        let tc_miss = measure(&mut tc, &miss)?;
        let mut xdp = |pkt: &[u8], out: &mut [u8]| -> Result<Duration> {
            let prog = dp.xdp_program()?;
            Ok(prog
                .test_run(TestRunOptions {
                    data_in: Some(pkt),
                    data_out: Some(out),
                    ..Default::default()
                })?
                .duration)
        };
        let xdp_hit = measure(&mut xdp, &np_hit)?;
        let xdp_miss = measure(&mut xdp, &np_miss)?;
        // Amortised over `repeat` runs of one packet (no per-call timer overhead). A packet
        // is rewritten in place across repeats, so the hit uses a ping-pong pair of
        // frontends, each the other's only backend (different ports): every run is an
        // established-flow hit with a real rewrite of address, port and both checksums.
        let (ping, pong) = (Ipv4Addr::new(10, 250, 0, 1), Ipv4Addr::new(10, 250, 0, 2));
        let mut d2 = d1.clone();
        for (ip, port, to, to_port) in [(ping, 80, pong, 81), (pong, 81, ping, 80)] {
            d2.frontends.insert(
                Frontend { ip, port, proto: PROTO_TCP },
                FrontendSpec {
                    service: format!("default/pingpong-{port}:http"),
                    flags: svc_flags::CLUSTER_IP | svc_flags::EXTERNAL_IP,
                    affinity_timeout_s: 0,
                    source_ranges: Vec::new(),
                    backends: vec![BackendSpec {
                        addr: BackendAddr { ip: to, port: to_port, proto: PROTO_TCP },
                        terminating: false,
                        local: true,
                    }],
                },
            );
        }
        state.sync(&mut maps, &d2)?;
        let ping_pkt = tcp(CLIENT, 40002, ping, 80);
        // The floor: an ICMP packet is parsed and passed (no map lookup).
        let mut icmp = tcp(CLIENT, 40003, ping, 80);
        icmp[23] = 1;
        let rep = |dp: &mut Dataplane, xdp: bool, pkt: &[u8]| -> Result<f64> {
            let mut out = vec![0u8; 256];
            let opts = TestRunOptions {
                data_in: Some(pkt),
                data_out: Some(&mut out),
                repeat: 100_000,
                ..Default::default()
            };
            let d = if xdp {
                dp.xdp_program()?.test_run(opts)?.duration
            } else {
                dp.tc_program()?.test_run(opts)?.duration
            };
            Ok(d.as_nanos() as f64)
        };
        let tc_hit_rep = rep(&mut dp, false, &ping_pkt)?;
        let tc_miss_rep = rep(&mut dp, false, &miss)?;
        let tc_floor_rep = rep(&mut dp, false, &icmp)?;
        let xdp_floor_rep = rep(&mut dp, true, &icmp)?;
        let xdp_hit_rep = rep(&mut dp, true, &ping_pkt)?;
        let xdp_miss_rep = rep(&mut dp, true, &np_miss)?;
        // SKIFF_BENCH_PROFILE=tc|xdp: keep running that hit for ~5 s so a sampling profiler
        // (`perf record -a -e cpu-clock`) can attribute the time to the program, its helpers
        // and the map code.
        if let Ok(which) = std::env::var("SKIFF_BENCH_PROFILE") {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                rep(&mut dp, which == "xdp", &ping_pkt)?;
            }
        }
        let mut row = BTreeMap::new();
        row.insert("services", n as f64);
        row.insert("tc_hit_ns", tc_hit);
        row.insert("tc_miss_ns", tc_miss);
        row.insert("xdp_hit_ns", xdp_hit);
        row.insert("xdp_miss_ns", xdp_miss);
        row.insert("tc_hit_rep_ns", tc_hit_rep);
        row.insert("tc_miss_rep_ns", tc_miss_rep);
        row.insert("xdp_hit_rep_ns", xdp_hit_rep);
        row.insert("xdp_miss_rep_ns", xdp_miss_rep);
        row.insert("tc_floor_rep_ns", tc_floor_rep);
        row.insert("xdp_floor_rep_ns", xdp_floor_rep);
        row.insert("full_sync_ms", full_sync.as_secs_f64() * 1e3);
        row.insert("add_one_ms", add_one.as_secs_f64() * 1e3);
        row.insert("plan_ms", plan_full.as_secs_f64() * 1e3);
        row.insert("iptables_restore_ms", ipt_restore.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3));
        rows.push(row);
        drop(maps);
        drop(dp);
    }
    println!(
        "dataplane: BPF_PROG_TEST_RUN ns/packet, single runs: median of {RUNS} (includes the kernel's per-call timer); map programming with {ENDPOINTS} endpoints/service"
    );
    println!(
        "{:>9} {:>8} {:>8} {:>8} {:>8} {:>11} {:>9} {:>10} {:>13} {:>10}",
        "services",
        "tc hit",
        "tc miss",
        "xdp hit",
        "xdp miss",
        "full sync",
        "(plan)",
        "add one",
        "ipt-restore",
        "ipt/skiff"
    );
    for r in &rows {
        println!(
            "{:>9} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.1} ms {:>6.1} ms {:>7.3} ms {:>10.1} ms {:>9.1}x",
            r["services"],
            r["tc_hit_ns"],
            r["tc_miss_ns"],
            r["xdp_hit_ns"],
            r["xdp_miss_ns"],
            r["full_sync_ms"],
            r["plan_ms"],
            r["add_one_ms"],
            r["iptables_restore_ms"],
            r["iptables_restore_ms"] / r["full_sync_ms"]
        );
    }
    println!(
        "(full sync and ipt-restore: {ENDPOINTS} endpoints per service; ipt-restore = kube-proxy-style rules into a fresh netns, not run at 30k)"
    );
    println!(
        "repeat=100000 (amortised, no per-call timer; hit = established flow with a full rewrite, tc ClusterIP / xdp ExternalIP; floor = ICMP, parsed and passed):"
    );
    println!(
        "{:>9} {:>10} {:>11} {:>10} {:>10} {:>11} {:>10}",
        "services", "tc hit", "tc miss", "tc floor", "xdp hit", "xdp miss", "xdp floor"
    );
    for r in &rows {
        println!(
            "{:>9} {:>10.0} {:>11.0} {:>10.0} {:>10.0} {:>11.0} {:>10.0}",
            r["services"],
            r["tc_hit_rep_ns"],
            r["tc_miss_rep_ns"],
            r["tc_floor_rep_ns"],
            r["xdp_hit_rep_ns"],
            r["xdp_miss_rep_ns"],
            r["xdp_floor_rep_ns"]
        );
    }
    let first = &rows[0];
    let last = &rows[rows.len() - 1];
    println!(
        "ratio 30k/10 services: tc hit {:.2}x, xdp hit {:.2}x (flat = 1.0)",
        last["tc_hit_ns"] / first["tc_hit_ns"],
        last["xdp_hit_ns"] / first["xdp_hit_ns"]
    );
    let out_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{{}}}",
                r.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    std::fs::write(out_dir.join("dataplane.json"), format!("[{}]\n", json.join(",")))?;
    Ok(())
}

// ---- part 2: new TCP connections/s and connect p99 through a ClusterIP --------------------

const CONNS: usize = 2_000;
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 1);

/// `--client IP PORT COUNT`: COUNT sequential connects; prints `conns_per_s p99_us`.
fn connect_client(args: &[String]) -> Result<()> {
    let ip: Ipv4Addr = args[0].parse()?;
    let port: u16 = args[1].parse()?;
    let count: usize = args[2].parse()?;
    let mut lat = Vec::with_capacity(count);
    let start = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect((ip, port))?;
        lat.push(t.elapsed());
        // The server closes first: no TIME_WAIT here, ports stay available.
        let mut b = [0u8; 1];
        let _ = std::io::Read::read(&mut s, &mut b);
    }
    let total = start.elapsed();
    lat.sort_unstable();
    let p99 = lat[(count * 99 / 100).min(count - 1)];
    println!("{:.0} {:.1}", count as f64 / total.as_secs_f64(), p99.as_secs_f64() * 1e6);
    Ok(())
}

struct Netns(String);
impl Netns {
    fn new(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ensure!(
            Command::new("ip").args(["netns", "add", name]).status()?.success(),
            "ip netns add"
        );
        Ok(Self(name.into()))
    }
    fn path(&self) -> std::path::PathBuf {
        std::path::Path::new("/run/netns").join(&self.0)
    }
    fn ip(&self, args: &[&str]) -> Result<()> {
        ensure!(
            Command::new("ip").arg("-n").arg(&self.0).args(args).status()?.success(),
            "ip {args:?}"
        );
        Ok(())
    }
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write;
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.path().display()))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        if let Some(input) = stdin {
            child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "{args:?} failed");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn enter(path: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    // SAFETY: setns on a valid namespace fd, on a dedicated thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(rc == 0, "setns: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Runs the client (this binary with `--client`) in `ns`, optionally inside `cgroup`.
fn run_client(
    ns: &Netns,
    cgroup: Option<&std::path::Path>,
    ip: Ipv4Addr,
    port: u16,
) -> Result<(f64, f64)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ns_file = std::fs::File::open(ns.path())?;
    let ns_fd = ns_file.as_raw_fd();
    let procs = cgroup
        .map(|c| {
            std::ffi::CString::new(c.join("cgroup.procs").as_os_str().as_encoded_bytes().to_vec())
        })
        .transpose()?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--client", &ip.to_string(), &port.to_string(), &CONNS.to_string()]);
    // SAFETY: only raw syscalls on values prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output()?;
    drop(ns_file);
    ensure!(out.status.success(), "client: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>());
    Ok((it.next().context("rate")??, it.next().context("p99")??))
}

/// The rules kube-proxy's iptables mode writes for `n` services of `ENDPOINTS` endpoints
/// each (the endpoints of `desired(n)`): KUBE-SERVICES → KUBE-SVC-* (statistic) →
/// KUBE-SEP-* (masquerade mark for hairpin, DNAT).
fn kube_proxy_rules(n: usize) -> String {
    use std::fmt::Write;
    let mut r = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for i in 0..n {
        let _ = writeln!(r, ":KUBE-SVC-{i} - [0:0]");
        for j in 0..ENDPOINTS {
            let _ = writeln!(r, ":KUBE-SEP-{i}-{j} - [0:0]");
        }
    }
    r += "-A OUTPUT -j KUBE-SERVICES\n-A PREROUTING -j KUBE-SERVICES\n";
    r += "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n";
    for i in 0..n {
        let _ = writeln!(
            r,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"default/s{i}:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-{i}",
            vip(i)
        );
        for j in 0..ENDPOINTS {
            let ep = Ipv4Addr::from(
                u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * ENDPOINTS + j) as u32,
            );
            if j + 1 < ENDPOINTS {
                let _ = writeln!(
                    r,
                    "-A KUBE-SVC-{i} -m comment --comment \"default/s{i}:http\" -m statistic --mode random --probability {:.11} -j KUBE-SEP-{i}-{j}",
                    1.0 / (ENDPOINTS - j) as f64
                );
            } else {
                let _ = writeln!(
                    r,
                    "-A KUBE-SVC-{i} -m comment --comment \"default/s{i}:http\" -j KUBE-SEP-{i}-{j}"
                );
            }
            let _ = writeln!(r, "-A KUBE-SEP-{i}-{j} -s {ep}/32 -j KUBE-MARK-MASQ");
            let _ =
                writeln!(r, "-A KUBE-SEP-{i}-{j} -p tcp -m tcp -j DNAT --to-destination {ep}:8080");
        }
    }
    r += "COMMIT\n";
    r
}

/// kube-proxy-style rules: KUBE-SERVICES → KUBE-SVC-* → KUBE-SEP-* DNAT, target last.
fn iptables_rules(n: usize) -> String {
    let mut r = String::from("*nat\n:KUBE-SERVICES - [0:0]\n");
    for i in 0..n {
        r += &format!(":KUBE-SVC-{i} - [0:0]\n:KUBE-SEP-{i} - [0:0]\n");
    }
    r += "-A OUTPUT -j KUBE-SERVICES\n";
    for i in 0..n {
        r += &format!(
            "-A KUBE-SERVICES -d {}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-{i}\n",
            vip(i)
        );
        r += &format!(
            "-A KUBE-SVC-{i} -m statistic --mode random --probability 1.0 -j KUBE-SEP-{i}\n"
        );
        r += &format!("-A KUBE-SEP-{i} -p tcp -m tcp -j DNAT --to-destination {BACKEND}:8080\n");
    }
    r += "COMMIT\n";
    r
}

/// A fresh client/backend namespace pair with an accept-and-close server: every
/// measurement gets its own, so conntrack and TIME_WAIT state never leak between modes.
struct ConnectRig {
    client: Netns,
    _backend: Netns,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    server: Option<std::thread::JoinHandle<Result<()>>>,
}

impl ConnectRig {
    fn new(tag: &str) -> Result<Self> {
        let client = Netns::new(&format!("skb-c-{tag}"))?;
        let backend = Netns::new(&format!("skb-b-{tag}"))?;
        client.ip(&[
            "link", "add", "c0", "type", "veth", "peer", "name", "b0", "netns", &backend.0,
        ])?;
        client.ip(&["addr", "add", "10.202.0.2/24", "dev", "c0"])?;
        client.ip(&["link", "set", "c0", "up"])?;
        client.ip(&["link", "set", "lo", "up"])?;
        // Service addresses route to the backend side (only reached untranslated by mistake).
        client.ip(&["route", "add", "10.96.0.0/16", "via", "10.202.0.1"])?;
        backend.ip(&["addr", "add", "10.202.0.1/24", "dev", "b0"])?;
        backend.ip(&["link", "set", "b0", "up"])?;
        backend.ip(&["link", "set", "lo", "up"])?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let path = backend.path();
        let flag = stop.clone();
        let server = std::thread::spawn(move || -> Result<()> {
            enter(&path)?;
            let l = std::net::TcpListener::bind((BACKEND, 8080))?;
            l.set_nonblocking(true)?;
            tx.send(())?;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => drop(s),
                    Err(_) => std::thread::sleep(Duration::from_micros(20)),
                }
            }
            Ok(())
        });
        rx.recv()?;
        Ok(Self { client, _backend: backend, stop, server: Some(server) })
    }
}

impl Drop for ConnectRig {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

fn part2() -> Result<()> {
    let tag = std::process::id();
    let cg_root = skiff_proxy::loader::cgroup2_root()?;
    let cg = cg_root.join(format!("skiff-bench-{tag}"));
    std::fs::create_dir_all(&cg)?;
    let mut rows = Vec::new();
    let result = (|| -> Result<()> {
        for n in [10usize, 1_000, 10_000] {
            let target = vip(n - 1);
            let direct = {
                let rig = ConnectRig::new(&format!("{tag}-{n}-d"))?;
                run_client(&rig.client, None, BACKEND, 8080)?
            };
            let ipt = {
                let rig = ConnectRig::new(&format!("{tag}-{n}-i"))?;
                rig.client.run(&["iptables-restore"], Some(&iptables_rules(n)))?;
                run_client(&rig.client, None, target, 80)?
            };
            let dir = tempfile::tempdir()?;
            let st = Command::new("mount").args(["-t", "bpf", "bpf"]).arg(dir.path()).status()?;
            ensure!(st.success(), "mount bpffs");
            let bpffs = Bpffs(dir);
            let pin = bpffs.0.path().join("skiff");
            let mut dp = Dataplane::load(&pin, NODE)?;
            let mut maps = ServiceMaps::open_pinned(&pin)?;
            let mut d = DesiredState::default();
            for i in 0..n {
                d.frontends.insert(
                    Frontend { ip: vip(i), port: 80, proto: PROTO_TCP },
                    FrontendSpec {
                        service: format!("default/s{i}:http"),
                        flags: svc_flags::CLUSTER_IP,
                        affinity_timeout_s: 0,
                        source_ranges: Vec::new(),
                        backends: vec![BackendSpec {
                            addr: BackendAddr { ip: BACKEND, port: 8080, proto: PROTO_TCP },
                            terminating: false,
                            local: true,
                        }],
                    },
                );
            }
            ServiceMapSync::new().sync(&mut maps, &d)?;
            let att = dp.attach_sock_lb(&cg)?;
            let skiff = {
                let rig = ConnectRig::new(&format!("{tag}-{n}-s"))?;
                run_client(&rig.client, Some(&cg), target, 80)?
            };
            drop(att);
            drop(maps);
            drop(dp);
            rows.push((n, direct, ipt, skiff));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir(&cg);
    result?;
    println!();
    println!(
        "part 2: new TCP connections/s and connect p99 through a ClusterIP ({CONNS} sequential connects; same run, same rig)"
    );
    println!(
        "{:>9} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>13} {:>13}",
        "services",
        "direct c/s",
        "iptables c/s",
        "skiff c/s",
        "dir p99",
        "ipt p99",
        "skf p99",
        "iptables/dir",
        "skiff/dir"
    );
    let mut json = Vec::new();
    for (n, d, i, s) in &rows {
        println!(
            "{n:>9} {:>12.0} {:>12.0} {:>12.0} {:>7.0}us {:>7.0}us {:>7.0}us {:>12.2}x {:>12.2}x",
            d.0,
            i.0,
            s.0,
            d.1,
            i.1,
            s.1,
            d.0 / i.0,
            d.0 / s.0
        );
        json.push(format!(
            "{{\"services\":{n},\"direct_cps\":{:.0},\"iptables_cps\":{:.0},\"skiff_cps\":{:.0},\"direct_p99_us\":{:.1},\"iptables_p99_us\":{:.1},\"skiff_p99_us\":{:.1}}}",
            d.0, i.0, s.0, d.1, i.1, s.1
        ));
    }
    println!("(ratios are slowdowns against the direct connection: 1.00x = the floor)");
    let out_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("dataplane-connect.json"), format!("[{}]\n", json.join(",")))?;
    Ok(())
}
