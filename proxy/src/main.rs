//! `skiff-proxy`: the eBPF service proxy daemon (kube-proxy replacement) and the commands
//! that show its pinned maps to people.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use skiff_ebpf_common::{ct_dir, ct_flags, drop_reason, flow_path};
use skiff_proxy::daemon::{self, ProxyConfig};
use skiff_proxy::loader;
use skiff_proxy::maps::{FlowReader, ServiceMaps};

#[derive(Parser)]
#[command(name = "skiff-proxy", about = "skiff eBPF service proxy")]
struct Cli {
    /// bpffs directory of the pinned maps and links (default /sys/fs/bpf/skiff).
    #[arg(long, global = true)]
    pin_dir: Option<PathBuf>,
    /// Log lines as `text` (default) or `json`.
    #[arg(long, global = true)]
    log_format: Option<skiff_core::logging::LogFormat>,
    #[command(subcommand)]
    command: Cmd,
}

/// `--nodeport-mode`.
#[derive(Clone, Copy, ValueEnum)]
enum NodePortModeArg {
    Snat,
    Dsr,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load and attach the data plane and keep it in sync with the cluster.
    Run(Box<RunArgs>),
    /// Print a pinned map (works whether the daemon runs or not).
    Maps { what: MapsWhat },
    /// Stream new-flow events (one line per new connection/flow) until interrupted.
    Flows,
    /// Detach the pinned socket-LB links (uninstall).
    Unpin,
    /// Switch the programs' debug output (new flows and drops, printed to the kernel trace
    /// buffer: /sys/kernel/tracing/trace_pipe) on or off at run time; no argument shows it.
    Debug { state: Option<DebugState> },
}

/// `skiff-proxy run`: flags win over `--config`, which wins over the defaults.
#[derive(clap::Args)]
struct RunArgs {
    /// A ProxyConfiguration (or kube-proxy's KubeProxyConfiguration) YAML file, as the
    /// DaemonSet's ConfigMap holds (kube-proxy's `--config`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's name (kube-proxy's `--hostname-override`; default: the host name).
    #[arg(long, alias = "hostname-override")]
    node_name: Option<String>,
    /// This node's address (default: the Node's InternalIP).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    /// kubeconfig (default: in-cluster or $KUBECONFIG / ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Do not attach the socket-LB hooks (per-packet tc path only).
    #[arg(long)]
    no_socket_lb: bool,
    /// Do not mount a bpffs where none is: in a pod, the host's must be given (a missing one
    /// is then an error).
    #[arg(long)]
    no_mount_bpffs: bool,
    /// cgroup v2 directory for the socket LB (default: the cgroup v2 root).
    #[arg(long)]
    cgroup: Option<PathBuf>,
    /// Interfaces for the tc per-packet path (repeatable).
    #[arg(long = "tc-iface")]
    tc_interfaces: Vec<String>,
    /// Node-facing interfaces for XDP NodePort/ExternalIP (repeatable).
    #[arg(long = "xdp-iface")]
    xdp_interfaces: Vec<String>,
    /// How remote NodePort/ExternalIP/LB backends are reached: snat (default) or dsr
    /// (direct server return over IPIP; every node must use it).
    #[arg(long, value_enum)]
    nodeport_mode: Option<NodePortModeArg>,
    /// The pod ranges, comma-separated (kube-proxy's flag): traffic to a Service address from
    /// outside them is SNATed to the node for remote backends (default: none).
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// CIDRs of this node's addresses that serve NodePorts besides the node address
    /// (kube-proxy's flag; comma-separated or repeated; default `primary`: the node address
    /// alone).
    #[arg(long = "nodeport-addresses")]
    nodeport_addresses: Vec<String>,
    /// Address of /metrics (kube-proxy's `--metrics-bind-address`; default 127.0.0.1:10249).
    #[arg(long, alias = "metrics-bind-address")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Address of /healthz, /livez and /readyz (kube-proxy's flag; default 0.0.0.0:10256).
    #[arg(long)]
    healthz_bind_address: Option<std::net::SocketAddr>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DebugState {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum MapsWhat {
    Services,
    Backends,
    Conntrack,
    Stats,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let file = match &cli.command {
        Cmd::Run(args) => match &args.config {
            Some(path) => Some((path.clone(), skiff_proxy::config::load(path)?)),
            None => None,
        },
        _ => None,
    };
    let file_format = file.as_ref().and_then(|(_, f)| f.log_format.as_deref());
    let log_format = match (cli.log_format, file_format) {
        (Some(f), _) => f,
        (None, Some("json")) => skiff_core::logging::LogFormat::Json,
        _ => skiff_core::logging::LogFormat::Text,
    };
    skiff_core::logging::init(log_format, skiff_core::logging::LogStream::Stdout);
    let default_pin_dir = PathBuf::from("/sys/fs/bpf/skiff");
    match cli.command {
        Cmd::Run(args) => {
            let mut args = *args;
            let file = match file {
                Some((path, f)) => {
                    if !f.ignored.is_empty() {
                        tracing::warn!(
                            file = %path.display(),
                            fields = ?f.ignored,
                            "fields of the KubeProxyConfiguration that mean nothing to skiff-proxy are ignored"
                        );
                    }
                    f
                }
                None => Default::default(),
            };
            let kubeconfig = args
                .kubeconfig
                .take()
                .or_else(|| file.client_connection.as_ref().and_then(|c| c.kubeconfig.clone()));
            let client = match kubeconfig {
                Some(path) => {
                    let kc = kube::config::Kubeconfig::read_from(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                        .await
                        .context("kubeconfig")?;
                    kube::Client::try_from(cfg)?
                }
                None => kube::Client::try_default().await.context(
                    "no kubeconfig: give --kubeconfig, or run in a pod with \
                     KUBERNETES_SERVICE_HOST/PORT set to the API server's address",
                )?,
            };
            let node_name = match args.node_name.take().or(file.hostname_override.clone()) {
                Some(n) => n,
                None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .context("no --hostname-override and no host name")?
                    .trim()
                    .to_lowercase(),
            };
            let node_ip = match args.node_ip.or(file.node_ip) {
                Some(ip) => ip,
                None => daemon::node_internal_ip(&client, &node_name).await?,
            };
            let nodeport_mode = match args.nodeport_mode {
                Some(NodePortModeArg::Dsr) => loader::NodePortMode::Dsr,
                Some(NodePortModeArg::Snat) => loader::NodePortMode::Snat,
                None => match file.node_port_mode {
                    Some(skiff_proxy::config::NodePortMode::Dsr) => loader::NodePortMode::Dsr,
                    _ => loader::NodePortMode::Snat,
                },
            };
            let or_file = |flag: Vec<String>, file: &Option<Vec<String>>| {
                if flag.is_empty() { file.clone().unwrap_or_default() } else { flag }
            };
            let nodeport_addresses = skiff_proxy::config::parse_nodeport_addresses(&or_file(
                std::mem::take(&mut args.nodeport_addresses),
                &file.node_port_addresses,
            ))
            .map_err(|e| anyhow::anyhow!("--nodeport-addresses: {e}"))?;
            let cluster_cidrs = match args.cluster_cidr.take().or(file.cluster_cidr.clone()) {
                Some(c) => skiff_proxy::config::parse_cluster_cidrs(&c)
                    .map_err(|e| anyhow::anyhow!("--cluster-cidr: {e}"))?,
                None => Vec::new(),
            };
            let defaults = ProxyConfig::default();
            let config = ProxyConfig {
                nodeport_addresses,
                cluster_cidrs,
                node_name,
                node_ip,
                pin_dir: cli.pin_dir.or(file.pin_dir.clone()).unwrap_or(default_pin_dir),
                socket_lb: !args.no_socket_lb && file.socket_lb.unwrap_or(true),
                mount_bpffs: !args.no_mount_bpffs && file.mount_bpffs.unwrap_or(true),
                cgroup: args.cgroup.take().or(file.cgroup_path.clone()),
                tc_interfaces: or_file(args.tc_interfaces, &file.tc_interfaces),
                xdp_interfaces: or_file(args.xdp_interfaces, &file.xdp_interfaces),
                metrics_addr: args
                    .metrics_addr
                    .or(file.metrics_bind_address)
                    .or(defaults.metrics_addr),
                healthz_addr: args
                    .healthz_bind_address
                    .or(file.healthz_bind_address)
                    .or(defaults.healthz_addr),
                nodeport_mode,
                ..defaults
            };
            tracing::info!(
                node = %config.node_name,
                node_ip = %config.node_ip,
                pin_dir = %config.pin_dir.display(),
                "starting"
            );
            tokio::select! {
                r = daemon::run(client, config) => r?,
                signal = skiff_core::logging::shutdown_signal() => {
                    let name = signal.context("waiting for SIGTERM or SIGINT")?;
                    // The maps and links stay pinned: forwarding goes on until the next
                    // skiff-proxy adopts them.
                    tracing::info!(signal = name, "stopping (the data plane stays attached)");
                }
            }
            Ok(())
        }
        Cmd::Maps { what } => print_maps(&cli.pin_dir.unwrap_or(default_pin_dir), what),
        Cmd::Flows => stream_flows(&cli.pin_dir.unwrap_or(default_pin_dir)).await,
        Cmd::Debug { state } => {
            let pin_dir = cli.pin_dir.unwrap_or(default_pin_dir);
            if let Some(state) = state {
                skiff_proxy::maps::set_debug(&pin_dir, matches!(state, DebugState::On))?;
            }
            let on = skiff_proxy::maps::debug_enabled(&pin_dir)?;
            println!("debug output {}", if on { "on" } else { "off" });
            Ok(())
        }
        Cmd::Unpin => {
            let n = loader::unpin_links(&cli.pin_dir.unwrap_or(default_pin_dir).join("links"))?;
            println!("unpinned {n} links");
            Ok(())
        }
    }
}

fn ip(be: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from_be(be))
}

fn proto(p: u8) -> &'static str {
    match p {
        6 => "TCP",
        17 => "UDP",
        _ => "?",
    }
}

fn print_maps(pin_dir: &std::path::Path, what: MapsWhat) -> Result<()> {
    let maps = ServiceMaps::open_pinned(pin_dir)
        .with_context(|| format!("opening maps pinned in {}", pin_dir.display()))?;
    match what {
        MapsWhat::Services => {
            let mut rows = maps.services()?;
            rows.sort_by_key(|(k, _)| {
                (u32::from_be(k.vip_be), u16::from_be(k.port_be), k.proto, k.slot)
            });
            println!(
                "{:<22} {:<5} {:>4}  {:<10} {:>7} {:>5} {:>6}",
                "FRONTEND", "PROTO", "SLOT", "BACKEND", "REV-NAT", "COUNT", "FLAGS"
            );
            for (k, v) in rows {
                let fe = format!("{}:{}", ip(k.vip_be), u16::from_be(k.port_be));
                let be = if k.slot == 0 { "-".to_string() } else { v.backend_id.to_string() };
                println!(
                    "{fe:<22} {:<5} {:>4}  {be:<10} {:>7} {:>5} {:>#6x}",
                    proto(k.proto),
                    k.slot,
                    v.rev_nat_id,
                    v.count,
                    v.flags
                );
            }
        }
        MapsWhat::Backends => {
            let mut rows = maps.backends()?;
            rows.sort_by_key(|(id, _)| *id);
            println!(
                "{:>6}  {:<22} {:<5} {:<11} {:<5}",
                "ID", "ADDRESS", "PROTO", "STATE", "LOCAL"
            );
            for (id, b) in rows {
                let addr = format!("{}:{}", ip(b.ip_be), u16::from_be(b.port_be));
                let state = if b.state == 0 { "active" } else { "terminating" };
                println!(
                    "{id:>6}  {addr:<22} {:<5} {state:<11} {:<5}",
                    proto(b.proto),
                    b.flags & 1 == 1
                );
            }
        }
        MapsWhat::Conntrack => {
            println!(
                "{:<5} {:<6} {:<22} {:<22} {:<22} {:>7} {:<4}",
                "PROTO", "DIR", "SOURCE", "DESTINATION", "NAT", "BACKEND", "MODE"
            );
            for (k, v) in maps.conntrack()? {
                let dir = if k.dir == ct_dir::FORWARD { "fwd" } else { "reply" };
                let mode = if v.flags & ct_flags::DSR != 0 {
                    "dsr"
                } else if v.flags & ct_flags::SNAT != 0 {
                    "snat"
                } else {
                    "-"
                };
                println!(
                    "{:<5} {dir:<6} {:<22} {:<22} {:<22} {:>7} {mode:<4}",
                    proto(k.proto),
                    format!("{}:{}", ip(k.saddr_be), u16::from_be(k.sport_be)),
                    format!("{}:{}", ip(k.daddr_be), u16::from_be(k.dport_be)),
                    format!("{}:{}", ip(v.nat_addr_be), u16::from_be(v.nat_port_be)),
                    v.backend_id
                );
            }
        }
        MapsWhat::Stats => {
            println!("drops:");
            for (reason, n) in maps.drops()? {
                if n > 0 {
                    println!("  {:<16} {n}", drop_reason::name(reason));
                }
            }
            println!("services (rev-nat id: packets bytes new-conns):");
            for (id, c) in maps.service_stats()? {
                println!("  {id:>6}: {} {} {}", c.packets, c.bytes, c.new_conns);
            }
            println!("backends (id: packets bytes new-conns):");
            for (id, c) in maps.backend_stats()? {
                println!("  {id:>6}: {} {} {}", c.packets, c.bytes, c.new_conns);
            }
        }
    }
    Ok(())
}

async fn stream_flows(pin_dir: &std::path::Path) -> Result<()> {
    let mut reader = FlowReader::open_pinned(pin_dir)
        .with_context(|| format!("opening the flow ring buffer in {}", pin_dir.display()))?;
    println!(
        "{:<6} {:<5} {:<22} {:<22} {:<22} {:>7}",
        "PATH", "PROTO", "CLIENT", "FRONTEND", "BACKEND", "BE-ID"
    );
    loop {
        while let Some(ev) = reader.next_event() {
            let path = match ev.path {
                flow_path::SOCKET => "socket",
                flow_path::TC => "tc",
                flow_path::XDP => "xdp",
                _ => "?",
            };
            let client = if ev.client_addr_be == 0 {
                "-".to_string()
            } else {
                format!("{}:{}", ip(ev.client_addr_be), u16::from_be(ev.client_port_be))
            };
            println!(
                "{path:<6} {:<5} {client:<22} {:<22} {:<22} {:>7}",
                proto(ev.proto),
                format!("{}:{}", ip(ev.frontend_addr_be), u16::from_be(ev.frontend_port_be)),
                format!("{}:{}", ip(ev.backend_addr_be), u16::from_be(ev.backend_port_be)),
                ev.backend_id
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
