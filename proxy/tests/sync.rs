//! The proxy library against real pinned maps: a sync programs the maps the programs read,
//! a restart resumes from the pins without flushing, endpoint removal purges conntrack, and
//! pinned socket-LB links outlive the process that attached them.

mod common;

use std::net::Ipv4Addr;

use common::netns::*;
use common::*;
use skiff_proxy::desired::{DesiredState, NodeContext, compute};
use skiff_proxy::loader::{Dataplane, cgroup2_root, unpin_links, unpin_stale_maps};
use skiff_proxy::maps::ServiceMaps;
use skiff_proxy::sync::ServiceMapSync;

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn desired(proto: &str, addrs: &[&str]) -> DesiredState {
    let s = service("web", "10.96.0.10", "p", proto);
    let e = endpoint_slice("web", "p", proto, addrs);
    compute([&s], [&e], &NodeContext::default())
}

fn tc_run(dp: &mut Dataplane, pkt: &[u8]) -> (u32, Vec<u8>) {
    test_run(dp.tc_program().unwrap(), "tc", pkt)
}

#[test]
fn sync_programs_the_maps_and_a_restart_resumes_without_flushing() {
    let bpffs = BpffsDir::new();
    let want = desired("TCP", &["10.0.1.1", "10.0.1.2"]);
    {
        let _dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
        let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
        let mut state = ServiceMapSync::new();
        let ops = state.sync(&mut maps, &want).unwrap();
        assert_eq!(ops, 6, "2 backends + rev-nat + 2 slots + frontend");
        assert_eq!(maps.services().unwrap().len(), 3);
        assert_eq!(maps.backends().unwrap().len(), 2);
    } // the "proxy" exits: programs unloaded, maps stay pinned.

    let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
    let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
    let mut state = ServiceMapSync::resume(&maps).unwrap();
    assert!(state.plan(&want).ops.is_empty(), "resumed state equals the pinned maps");
    // The reloaded programs serve the service from the reused maps.
    let (rc, out) =
        tc_run(&mut dp, &Pkt::tcp(CLIENT, 40000, Ipv4Addr::new(10, 96, 0, 10), 80).build());
    assert_eq!(rc, 0);
    let p = parse_and_verify(&out);
    assert!(p.dst == Ipv4Addr::new(10, 0, 1, 1) || p.dst == Ipv4Addr::new(10, 0, 1, 2));
    assert_eq!(p.dport, 8080);
    // A later change is incremental on top of the resumed state.
    let ops =
        state.sync(&mut maps, &desired("TCP", &["10.0.1.1", "10.0.1.2", "10.0.1.3"])).unwrap();
    assert_eq!(ops, 3, "one backend, one slot, the frontend count");

    // A rev-nat map recreated empty (an upgrade changed its definition) is refilled by the
    // first sync after the resume, though no frontend changed.
    let (id, entry) = maps.rev_nats().unwrap()[0];
    maps.remove_rev_nat(id).unwrap();
    let mut state = ServiceMapSync::resume(&maps).unwrap();
    let want = desired("TCP", &["10.0.1.1", "10.0.1.2", "10.0.1.3"]);
    assert_eq!(state.sync(&mut maps, &want).unwrap(), 1, "only the missing rev-nat entry");
    assert_eq!(maps.rev_nats().unwrap(), vec![(id, entry)]);
    assert!(state.plan(&want).ops.is_empty());
}

#[test]
fn a_pinned_map_with_an_older_definition_is_recreated_on_load() {
    let bpffs = BpffsDir::new();
    let dir = bpffs.path();
    drop(Dataplane::load(&dir, NODE).unwrap());
    assert!(unpin_stale_maps(&dir).unwrap().is_empty(), "maps of the same object are reused");
    // Stand in for a pin left by an older proxy whose backends map was a hash: another
    // map (the counters' spill hash) pinned under the backends name.
    let backends = dir.join("SKIFF_BACKENDS");
    std::fs::remove_file(&backends).unwrap();
    std::fs::hard_link(dir.join("SKIFF_STATS"), &backends).unwrap();
    assert!(ServiceMaps::open_pinned(&dir).is_err(), "a hash where the array belongs");
    let mut dp = Dataplane::load(&dir, NODE).unwrap();
    let mut maps = ServiceMaps::open_pinned(&dir).unwrap();
    let want = desired("TCP", &["10.0.1.1"]);
    ServiceMapSync::resume(&maps).unwrap().sync(&mut maps, &want).unwrap();
    let (rc, out) =
        tc_run(&mut dp, &Pkt::tcp(CLIENT, 40000, Ipv4Addr::new(10, 96, 0, 10), 80).build());
    assert_eq!(rc, 0);
    assert_eq!(parse_and_verify(&out).dst, Ipv4Addr::new(10, 0, 1, 1));
}

#[test]
fn removing_an_endpoint_purges_its_udp_flows() {
    let bpffs = BpffsDir::new();
    let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
    let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
    let mut state = ServiceMapSync::new();
    state.sync(&mut maps, &desired("UDP", &["10.0.1.1", "10.0.1.2"])).unwrap();

    // Open flows until both backends have some.
    let mut used = std::collections::BTreeMap::new();
    for port in 5000..5040u16 {
        let (rc, out) =
            tc_run(&mut dp, &Pkt::udp(CLIENT, port, Ipv4Addr::new(10, 96, 0, 10), 80).build());
        assert_eq!(rc, 0);
        used.insert(port, parse_and_verify(&out).dst);
    }
    let gone = Ipv4Addr::new(10, 0, 1, 1);
    assert!(used.values().any(|d| *d == gone), "some flows went to {gone}");

    state.sync(&mut maps, &desired("UDP", &["10.0.1.2"])).unwrap();
    let ct = maps.conntrack().unwrap();
    assert!(
        ct.iter().all(|(_, v)| v.nat_addr_be != be32(gone) && v.backend_id != 1),
        "no conntrack entry left for the removed backend"
    );
    // Every flow, old ones included, now reaches the remaining backend.
    for port in 5000..5040u16 {
        let (_, out) =
            tc_run(&mut dp, &Pkt::udp(CLIENT, port, Ipv4Addr::new(10, 96, 0, 10), 80).build());
        assert_eq!(parse_and_verify(&out).dst, Ipv4Addr::new(10, 0, 1, 2), "flow from port {port}");
    }
}

/// Flows cached by the programs (several packets each, on one CPU) stop reaching a removed
/// backend at once: the purge bumps the conntrack generation, which empties the caches.
#[test]
fn removing_an_endpoint_stops_its_cached_flows() {
    pin_to_this_cpu();
    let bpffs = BpffsDir::new();
    let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
    let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
    let mut state = ServiceMapSync::new();
    state.sync(&mut maps, &desired("TCP", &["10.0.1.1", "10.0.1.2"])).unwrap();
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let gone = Ipv4Addr::new(10, 0, 1, 1);

    // Three packets per flow: opened, copied into the cache, served from it.
    let mut to_gone = Vec::new();
    for port in 6000..6040u16 {
        let mut dsts = Vec::new();
        for _ in 0..3 {
            let (rc, out) = tc_run(&mut dp, &Pkt::tcp(CLIENT, port, vip, 80).build());
            assert_eq!(rc, 0);
            dsts.push(parse_and_verify(&out).dst);
        }
        assert!(dsts.iter().all(|d| *d == dsts[0]), "flow from port {port} kept its backend");
        if dsts[0] == gone {
            to_gone.push(port);
        }
    }
    assert!(!to_gone.is_empty(), "some flows went to {gone}");

    let generation = maps.ct_generation().unwrap();
    state.sync(&mut maps, &desired("TCP", &["10.0.1.2"])).unwrap();
    assert!(maps.ct_generation().unwrap() != generation, "the purge bumped the generation");
    for port in to_gone {
        let (_, out) = tc_run(&mut dp, &Pkt::tcp(CLIENT, port, vip, 80).build());
        assert_eq!(parse_and_verify(&out).dst, Ipv4Addr::new(10, 0, 1, 2), "flow from port {port}");
    }
}

#[test]
fn pinned_socket_lb_links_outlive_the_loader() {
    let rig = Rig::new();
    let _servers = EchoServers::start(&rig.backend);
    let bpffs = BpffsDir::new();
    let cg = TestCgroup::new(&cgroup2_root().unwrap());
    let links = bpffs.path().join("links");
    let want = {
        let s = service("web", "10.96.0.10", "p", "TCP");
        let e = endpoint_slice("web", "p", "TCP", &["10.201.1.2"]);
        compute([&s], [&e], &NodeContext::default())
    };
    {
        let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
        assert_eq!(dp.attach_sock_lb_pinned(&cg.path, &links).unwrap(), 4);
        let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
        ServiceMapSync::new().sync(&mut maps, &want).unwrap();
    } // loader gone (as if skiff-proxy was killed)

    let out =
        run_client_in(&rig.client, &cg.path, CLIENT_PY, &["tcp", "10.96.0.10", "80", "still"]);
    assert!(out.contains("peer 10.96.0.10 80"), "service works with no proxy process: {out}");
    assert!(out.contains("10.201.1.2|10.201.0.2|still"), "{out}");

    // A restarted proxy keeps the pinned links instead of attaching twice.
    {
        let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
        assert_eq!(dp.attach_sock_lb_pinned(&cg.path, &links).unwrap(), 0);
    }
    assert_eq!(unpin_links(&links).unwrap(), 4, "uninstall detaches all four hooks");
}

#[test]
fn maps_command_prints_the_pinned_maps_without_a_daemon() {
    let bpffs = BpffsDir::new();
    {
        let _dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
        let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
        ServiceMapSync::new().sync(&mut maps, &desired("TCP", &["10.0.1.1"])).unwrap();
    }
    let run = |what: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_skiff-proxy"))
            .arg("--pin-dir")
            .arg(bpffs.path())
            .args(["maps", what])
            .output()
            .expect("run skiff-proxy");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let services = run("services");
    assert!(services.contains("10.96.0.10:80"), "{services}");
    let backends = run("backends");
    assert!(backends.contains("10.0.1.1:8080"), "{backends}");
    assert!(run("stats").contains("drops:"));
    assert!(run("conntrack").contains("PROTO"));
}

#[test]
fn restarting_the_proxy_under_load_loses_nothing() {
    let rig = Rig::new();
    let _servers = EchoServers::start(&rig.backend);
    let bpffs = BpffsDir::new();
    let cg = TestCgroup::new(&cgroup2_root().unwrap());
    let pin = bpffs.path();
    let links = pin.join("links");
    let links_for_restart = links.clone();
    let want = {
        let s = service("web", "10.96.0.10", "p", "TCP");
        let e = endpoint_slice("web", "p", "TCP", &["10.201.1.2", "10.201.1.3"]);
        compute([&s], [&e], &NodeContext::default())
    };
    let mut dp = Dataplane::load(&pin, NODE).unwrap();
    dp.attach_sock_lb_pinned(&cg.path, &links).unwrap();
    let mut maps = ServiceMaps::open_pinned(&pin).unwrap();
    ServiceMapSync::new().sync(&mut maps, &want).unwrap();

    let long = spawn_client_in(
        &rig.client,
        &cg.path,
        CLIENT_PY,
        &["tcp-long", "10.96.0.10", "80", "0123456789"],
    );
    let cg_path = cg.path.clone();
    // The "proxy" is killed (everything it held is closed) and restarted while clients run.
    let restart = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(maps);
        drop(dp);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut dp = Dataplane::load(&pin, NODE).unwrap();
        let newly = dp.attach_sock_lb_pinned(&cg_path, &links_for_restart).unwrap();
        let mut maps = ServiceMaps::open_pinned(&pin).unwrap();
        let mut state = ServiceMapSync::resume(&maps).unwrap();
        let ops = state.sync(&mut maps, &want).unwrap();
        (newly, ops, dp)
    });
    let mut failures = 0;
    for i in 0..25 {
        let out = run_client_in(
            &rig.client,
            &cg.path,
            CLIENT_PY,
            &["tcp", "10.96.0.10", "80", &format!("n{i}")],
        );
        if !out.contains("peer 10.96.0.10 80") || !out.contains(&format!("|10.201.0.2|n{i}")) {
            failures += 1;
            eprintln!("connection {i} failed: {out}");
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    let (newly, ops, _dp) = restart.join().expect("restart thread");
    assert_eq!(newly, 0, "the restarted proxy reuses the pinned links");
    assert_eq!(ops, 0, "resync after restart changes nothing");
    assert_eq!(failures, 0, "new connections during the restart");
    let out = client_output(long);
    let sent: usize = out.lines().find_map(|l| l.strip_prefix("sent ")).unwrap().parse().unwrap();
    let echoed: usize =
        out.lines().find_map(|l| l.strip_prefix("echoed ")).unwrap().parse().unwrap();
    assert!(sent > 0 && echoed == sent, "long transfer intact across the restart: {out}");
    assert_eq!(unpin_links(&links).unwrap(), 4);
}

#[test]
fn maglev_picks_the_same_backend_on_every_node() {
    use skiff_ebpf_common::{MAGLEV_M, PROTO_TCP, flow_hash, svc_flags};
    use skiff_proxy::desired::{BackendAddr, BackendSpec, Frontend, FrontendSpec};
    let backends: Vec<BackendSpec> = (1..=4)
        .map(|i| BackendSpec {
            addr: BackendAddr { ip: Ipv4Addr::new(10, 0, 1, i), port: 8080, proto: PROTO_TCP },
            terminating: false,
            local: true,
        })
        .collect();
    let mut want = DesiredState::default();
    want.frontends.insert(
        Frontend { ip: Ipv4Addr::UNSPECIFIED, port: 30080, proto: PROTO_TCP },
        FrontendSpec {
            service: "default/web:http".into(),
            flags: svc_flags::NODE_PORT | svc_flags::MAGLEV,
            affinity_timeout_s: 0,
            source_ranges: Vec::new(),
            backends: backends.clone(),
        },
    );
    // Two "nodes": separate maps and programs; the second learns its backends in another
    // order (ids differ), yet both must agree on addresses.
    let mut reversed = want.clone();
    reversed.frontends.values_mut().for_each(|f| f.backends.reverse());
    let mut picks = Vec::new();
    for d in [&want, &reversed] {
        let bpffs = BpffsDir::new();
        let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
        let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
        let mut state = ServiceMapSync::new();
        // Ids are allocated in desired order: give the second node different ids.
        if std::ptr::eq(d, &reversed) {
            let mut dummy = DesiredState::default();
            let mut f = want.frontends.values().next().unwrap().clone();
            f.backends = vec![BackendSpec {
                addr: BackendAddr { ip: Ipv4Addr::new(10, 9, 9, 9), port: 1, proto: PROTO_TCP },
                terminating: false,
                local: true,
            }];
            dummy
                .frontends
                .insert(Frontend { ip: Ipv4Addr::new(10, 96, 9, 9), port: 1, proto: PROTO_TCP }, f);
            state.sync(&mut maps, &dummy).unwrap();
        }
        state.sync(&mut maps, d).unwrap();
        let mut node_picks = Vec::new();
        for port in 50000..50050u16 {
            let pkt = Pkt::tcp(CLIENT, port, NODE, 30080).build();
            let (rc, out) = test_run(dp.xdp_program().unwrap(), "xdp", &pkt);
            assert_eq!(rc, 2, "XDP_PASS to a local backend");
            node_picks.push(parse_and_verify(&out).dst);
        }
        picks.push(node_picks);
    }
    assert_eq!(picks[0], picks[1], "both nodes choose the same backend for every flow");
    let distinct: std::collections::BTreeSet<_> = picks[0].iter().collect();
    assert!(distinct.len() >= 3, "flows spread over the backends: {distinct:?}");
    // And the choice is the table entry user space computed for the flow hash.
    let names: Vec<(String, u32)> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| (format!("{}:{}", b.addr.ip, b.addr.port), i as u32 + 1))
        .collect();
    let t = skiff_proxy::maglev::table(&names);
    let h = flow_hash(be32(CLIENT), be32(NODE), 50000u16.to_be(), 30080u16.to_be(), PROTO_TCP);
    let id = t.backend_ids[h as usize % MAGLEV_M];
    assert_eq!(picks[0][0], Ipv4Addr::new(10, 0, 1, id as u8));
}

#[test]
fn load_balancer_source_ranges_filter_external_clients() {
    use skiff_ebpf_common::{PROTO_TCP, drop_reason, svc_flags};
    use skiff_proxy::desired::{BackendAddr, BackendSpec, Frontend, FrontendSpec};
    let lb = Ipv4Addr::new(198, 51, 100, 7);
    let spec = |ranges: Vec<(Ipv4Addr, u8)>| {
        let mut d = DesiredState::default();
        let flags =
            svc_flags::LOAD_BALANCER | if ranges.is_empty() { 0 } else { svc_flags::SOURCE_RANGES };
        d.frontends.insert(
            Frontend { ip: lb, port: 80, proto: PROTO_TCP },
            FrontendSpec {
                service: "default/web:http".into(),
                flags,
                affinity_timeout_s: 0,
                source_ranges: ranges,
                backends: vec![BackendSpec {
                    addr: BackendAddr {
                        ip: Ipv4Addr::new(10, 0, 1, 1),
                        port: 8080,
                        proto: PROTO_TCP,
                    },
                    terminating: false,
                    local: true,
                }],
            },
        );
        d
    };
    let bpffs = BpffsDir::new();
    let mut dp = Dataplane::load(&bpffs.path(), NODE).unwrap();
    let mut maps = ServiceMaps::open_pinned(&bpffs.path()).unwrap();
    let mut state = ServiceMapSync::new();
    state.sync(&mut maps, &spec(vec![(Ipv4Addr::new(10, 0, 0, 0), 24)])).unwrap();
    let mut xdp = |src: Ipv4Addr| {
        let pkt = Pkt::tcp(src, 40000, lb, 80).build();
        test_run(dp.xdp_program().unwrap(), "xdp", &pkt).0
    };
    assert_eq!(xdp(Ipv4Addr::new(10, 0, 0, 2)), 2, "inside the range: passed to the backend");
    assert_eq!(xdp(Ipv4Addr::new(10, 9, 0, 2)), 1, "outside the range: dropped");
    assert_eq!(maps.drop_count(drop_reason::SOURCE_RANGE).unwrap(), 1);
    state.sync(&mut maps, &spec(vec![])).unwrap();
    assert_eq!(xdp(Ipv4Addr::new(10, 9, 0, 3)), 2, "ranges removed: everyone allowed");
}
