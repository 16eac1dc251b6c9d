//! skiff-agent: joins a cluster and runs its node's pods.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser};
use kube::config::{KubeConfigOptions, Kubeconfig};
use skiff_agent::agent;
use skiff_agent::config::{self, AgentConfig};
use skiff_agent::credentials;
use skiff_agent::runtime::cri::CriRuntime;

#[derive(Debug, Parser)]
#[command(
    name = "skiff-agent",
    version,
    about = "skiff's node agent: joins a cluster and runs its node's pods"
)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
    /// Log lines as `text` or `json`.
    #[arg(long, default_value = "text")]
    log_format: skiff_core::logging::LogFormat,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// kubeconfig of the agent's identity.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// apiserver URL, with --token: join the cluster with a bootstrap token.
    #[arg(long)]
    server: Option<String>,
    /// Join token minted by skiff-server.
    #[arg(long)]
    token: Option<String>,
    /// Node name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// The node's InternalIP (default: the source address of the default route).
    #[arg(long)]
    node_ip: Option<IpAddr>,
    /// State directory (pod volumes, logs).
    #[arg(long, default_value = config::DEFAULT_ROOT_DIR)]
    root_dir: PathBuf,
    /// containerd's CRI socket.
    #[arg(long, default_value = config::DEFAULT_CONTAINERD_SOCKET)]
    containerd_socket: PathBuf,
    /// Cluster domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Nameserver of ClusterFirst pods (repeatable).
    #[arg(long)]
    cluster_dns: Vec<IpAddr>,
    /// Sandbox (pause) image.
    #[arg(long, default_value = config::DEFAULT_SANDBOX_IMAGE)]
    sandbox_image: String,
    /// Directory of static pod manifests.
    #[arg(long)]
    static_pod_dir: Option<PathBuf>,
    /// Pods capacity.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Lease renewal period in seconds.
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// containerd's CNI conf dir (skiff-cni's conflist is written there).
    #[arg(long, default_value = "/etc/skiff/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// containerd's CNI bin dir (skiff-cni and loopback are installed there).
    #[arg(long, default_value = "/var/lib/skiff/cni/bin")]
    cni_bin_dir: PathBuf,
    /// The cluster's pod network (an unreachable route covers it).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: ipnetwork::Ipv4Network,
    /// The service network (an unreachable route covers it).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cidr: ipnetwork::Ipv4Network,
    /// skiff-cni's IPAM store directory (default: skiff-cni's own, /var/lib/cni/skiff).
    #[arg(long)]
    cni_data_dir: Option<PathBuf>,
    /// cgroup parent of the pods (default: the runtime's).
    #[arg(long, default_value = "")]
    cgroup_parent: String,
    /// Leave CNI config, plugins and routes to someone else.
    #[arg(long)]
    no_network: bool,
    /// Do not install skiff-cni and loopback into the CNI bin dir nor write the conflist
    /// (something else does: the proxy DaemonSet's init container, whose conflist reads the
    /// pod CIDR from --cni-node-config); the node file and routes stay the agent's.
    #[arg(long)]
    no_install_cni: bool,
    /// The node file (pod CIDR, MTU) a conflist written before the node had a podCIDR reads
    /// at each plugin call; written once the node has one.
    #[arg(long, default_value = skiff_cni::config::DEFAULT_NODE_CONFIG)]
    cni_node_config: PathBuf,
    /// Port of the logs/exec endpoint (published as the Node's kubelet endpoint).
    #[arg(long, default_value_t = 10250)]
    streaming_port: u16,
    /// PEM CA of the apiserver's client certificate (default: the kubeconfig's CA).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Do not serve logs/exec.
    #[arg(long)]
    no_streaming: bool,
    /// Do not serve the node-local cluster DNS.
    #[arg(long)]
    no_dns: bool,
    /// The node's resolv.conf (upstreams of the cluster DNS for other names).
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// Address of the agent's /healthz and /metrics (the kubelet's healthz address; empty:
    /// not served).
    #[arg(long, default_value = "127.0.0.1:10248")]
    healthz_bind_address: String,
    /// Renew the node's client certificate before it expires, through a
    /// CertificateSigningRequest (the kubelet's flag; on by default, as kubeadm sets it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    rotate_certificates: bool,
    /// Do not run the eBPF service proxy in process.
    #[arg(long)]
    no_proxy: bool,
    /// bpffs directory of the proxy's pinned maps and links.
    #[arg(long, default_value = "/sys/fs/bpf/skiff")]
    proxy_pin_dir: PathBuf,
    /// cgroup v2 directory of the proxy's socket-LB hooks (default: the cgroup v2 root).
    #[arg(long)]
    proxy_cgroup: Option<PathBuf>,
    /// Hard eviction thresholds, as the kubelet's: below them the node reports memory, disk
    /// or PID pressure ("" disables them all).
    #[arg(long, default_value = "memory.available<100Mi,nodefs.available<10%,pid.available<10%")]
    eviction_hard: skiff_agent::config::Thresholds,
    /// Node-facing interfaces for the proxy's XDP NodePort path (repeatable).
    #[arg(long = "proxy-xdp-interface")]
    proxy_xdp_interfaces: Vec<String>,
    /// Interfaces for the proxy's tc per-packet path, e.g. reverse translation of NodePort
    /// replies leaving the node (repeatable).
    #[arg(long = "proxy-tc-interface")]
    proxy_tc_interfaces: Vec<String>,
    /// CIDRs of the node's addresses that serve NodePorts besides the node address
    /// (skiff-proxy's and kube-proxy's `--nodeport-addresses`; default `primary`).
    #[arg(long = "proxy-nodeport-addresses", value_delimiter = ',')]
    proxy_nodeport_addresses: Vec<String>,
}

/// The in-process proxy's config (None: --no-proxy, or an IPv6 node address).
fn proxy_config(
    args: &RunArgs,
    config: &AgentConfig,
) -> anyhow::Result<Option<skiff_proxy::daemon::ProxyConfig>> {
    let std::net::IpAddr::V4(node_ip) = config.effective_node_ip() else { return Ok(None) };
    let nodeport_addresses =
        skiff_proxy::config::parse_nodeport_addresses(&args.proxy_nodeport_addresses)
            .map_err(|e| anyhow::anyhow!("--proxy-nodeport-addresses: {e}"))?;
    // The agent's --cluster-cidr is the pod range the proxy tells off-cluster sources by.
    let cluster_cidrs =
        skiff_core::cidr::Cidr::parse(&args.cluster_cidr.to_string()).into_iter().collect();
    Ok((!args.no_proxy).then(|| skiff_proxy::daemon::ProxyConfig {
        nodeport_addresses,
        cluster_cidrs,
        node_name: config.node_name.clone(),
        node_ip,
        pin_dir: args.proxy_pin_dir.clone(),
        cgroup: args.proxy_cgroup.clone(),
        xdp_interfaces: args.proxy_xdp_interfaces.clone(),
        tc_interfaces: args.proxy_tc_interfaces.clone(),
        ..Default::default()
    }))
}

/// The API client, its config, and the node identity that rotation renews (a node client
/// certificate from a kubeconfig; not a ServiceAccount).
type Connected = (kube::Client, kube::Config, Option<Arc<credentials::Identity>>);

async fn client(args: &RunArgs) -> anyhow::Result<Connected> {
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => config::host_name().context("no --node-name and no host name")?,
    };
    // Joining with a bootstrap token: once, then the node's own kubeconfig (the token is
    // single-use) under the root dir is what later starts use, its certificate rotated.
    let joined;
    let path: &Path = match (&args.kubeconfig, &args.server, &args.token) {
        (Some(p), None, None) => p,
        (None, Some(server), Some(token)) => {
            let dir = args.root_dir.join("pki");
            joined = dir.join("kubelet.kubeconfig");
            if !joined.exists() {
                skiff_core::join::bootstrap(server, token, &node_name, &dir)
                    .await
                    .with_context(|| format!("joining {server} with the bootstrap token"))?;
                tracing::info!(kubeconfig = %joined.display(), "joined the cluster");
            }
            &joined
        }
        // A pod (the agent as a DaemonSet): its ServiceAccount, as any in-cluster client.
        (None, None, None) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            let cfg = kube::Config::incluster().context(
                "in a pod (KUBERNETES_SERVICE_HOST is set) but its ServiceAccount token or CA \
                 is unreadable under /var/run/secrets/kubernetes.io/serviceaccount",
            )?;
            tracing::info!(server = %cfg.cluster_url, "in-cluster: the pod's ServiceAccount");
            let client = kube::Client::try_from(cfg.clone()).context("building the API client")?;
            return Ok((client, cfg, None));
        }
        (None, None, None) => {
            bail!(
                "--kubeconfig FILE, or --server URL --token TOKEN, is required (or run in a pod \
                 with a ServiceAccount)"
            )
        }
        _ => bail!("use either --kubeconfig FILE or --server URL --token TOKEN (both together)"),
    };
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    // A node certificate: refused at once when expired, else rotated before it expires.
    if credentials::check_node_certificate(&cfg, path, &node_name)?.is_some()
        && args.rotate_certificates
    {
        let (client, identity) = credentials::client(cfg.clone(), path, &node_name)
            .context("building the API client")?;
        return Ok((client, cfg, Some(identity)));
    }
    let client = kube::Client::try_from(cfg.clone()).context("building the API client")?;
    Ok((client, cfg, None))
}

fn agent_config(args: &RunArgs, kube_config: &kube::Config) -> anyhow::Result<AgentConfig> {
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => config::host_name().context("no --node-name and no host name")?,
    };
    let mut c = AgentConfig::new(node_name).with_root_dir(&args.root_dir);
    c.node_ip = args.node_ip;
    c.containerd_socket = args.containerd_socket.clone();
    c.cluster_domain = args.cluster_domain.clone();
    if !args.cluster_dns.is_empty() {
        c.cluster_dns = args.cluster_dns.clone();
    }
    c.sandbox_image = args.sandbox_image.clone();
    c.static_pod_dir = args.static_pod_dir.clone();
    c.max_pods = args.max_pods;
    c.eviction_hard = args.eviction_hard;
    c.cgroup_parent = args.cgroup_parent.clone();
    c.heartbeat = Duration::from_secs(args.heartbeat_seconds.max(1));
    if !args.no_network {
        let mut glue = config::NetworkGlue::new(&c.node_name);
        glue.cni_conf_dir = args.cni_conf_dir.clone();
        glue.cni_bin_dir = args.cni_bin_dir.clone();
        glue.cni_data_dir = args.cni_data_dir.clone();
        glue.install_plugins = !args.no_install_cni;
        glue.cni_node_config = args.cni_node_config.clone();
        if let Some(r) = glue.routes.as_mut() {
            r.cluster_cidr = args.cluster_cidr;
            r.service_cidr = args.service_cidr;
        }
        c.network = Some(glue);
    }
    if !args.no_streaming {
        let ca = match &args.client_ca_file {
            Some(path) => {
                let pem = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                skiff_agent::streaming::StreamingConfig::ca_from_pem(&pem)?
            }
            None => kube_config.root_cert.clone().context(
                "the kubeconfig has no CA for the streaming endpoint: pass --client-ca-file",
            )?,
        };
        let mut s = skiff_agent::streaming::StreamingConfig::new(ca);
        s.listen = std::net::SocketAddr::from(([0, 0, 0, 0], args.streaming_port));
        s.root_dir = c.root_dir.clone();
        s.serving_names = vec![c.node_name.clone(), c.effective_node_ip().to_string()];
        c.streaming = Some(s);
    }
    if !args.no_dns {
        let listen = c.cluster_dns.iter().map(|ip| std::net::SocketAddr::new(*ip, 53));
        let d = skiff_agent::dns::DnsConfig::default()
            .with_listen(listen)
            .with_cluster_domain(c.cluster_domain.clone());
        let d = match d.clone().with_resolv_conf(&args.resolv_conf) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "no upstream resolvers: names outside the cluster get REFUSED");
                d
            }
        };
        c.dns = Some(d);
        c.dns_link = true;
    }
    Ok(c)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    skiff_core::logging::init(cli.log_format, skiff_core::logging::LogStream::Stdout);
    let (client, kube_config, identity) = client(&cli.run).await?;
    let _rotation = identity
        .map(|id| skiff_core::supervisor::AbortOnDrop(tokio::spawn(id.rotate(client.clone()))));
    let config = agent_config(&cli.run, &kube_config)?;
    let runtime = CriRuntime::connect(&config.containerd_socket).await.with_context(|| {
        format!("connecting to containerd at {}", config.containerd_socket.display())
    })?;
    // One watch of each kind for the whole process: the proxy, the DNS, the routes and the
    // Node heartbeat read the same informers.
    let informers = skiff_core::informers::Informers::new(client.clone());
    let proxy = proxy_config(&cli.run, &config)?.map(|pc| {
        let informers = informers.clone();
        tokio::spawn(async move {
            loop {
                match skiff_proxy::daemon::run_with(&informers, pc.clone()).await {
                    Ok(()) => tracing::warn!("proxy ended; restarting"),
                    Err(e) => tracing::error!(error = ?e, "proxy"),
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    });
    let _proxy = proxy.map(|h| h.abort_handle());
    let _metrics = match cli.run.healthz_bind_address.as_str() {
        "" => None,
        a => {
            let addr: std::net::SocketAddr =
                a.parse().with_context(|| format!("--healthz-bind-address {a:?}"))?;
            let task = tokio::spawn(async move {
                if let Err(e) = skiff_agent::metrics::serve(addr).await {
                    tracing::error!(%addr, error = %e, "/healthz and /metrics not served");
                }
            });
            Some(skiff_core::supervisor::AbortOnDrop(task))
        }
    };
    tokio::select! {
        r = agent::run_with(informers, config, runtime) => r.context("skiff-agent")?,
        signal = skiff_core::logging::shutdown_signal() => {
            let name = signal.context("waiting for SIGTERM or SIGINT")?;
            tracing::info!(signal = name, "stopping (pods keep running)")
        }
    }
    Ok(())
}
