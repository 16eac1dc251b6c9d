//! skiff-server: the control-plane binary.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use skiff_apiserver::authz::AuthorizationMode;
use skiff_control_plane::server::{self, AuthOptions, ServerConfig, StoreConfig};
use skiff_controllers::ControllerConfig;
use skiff_core::cidr::Cidr;
use skiff_scheduler::SchedulerConfig;

#[derive(Parser)]
#[command(name = "skiff-server", about = "skiff control plane: a Kubernetes-compatible apiserver")]
struct Args {
    /// Store, PKI and admin.kubeconfig live here.
    #[arg(long, default_value = "/var/lib/skiff/server")]
    data_dir: PathBuf,
    /// HTTPS listen address.
    #[arg(long, default_value = "0.0.0.0:6443")]
    listen: std::net::SocketAddr,
    /// ClusterIP range of Services.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// NodePort range.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Comma-separated etcd endpoints; the embedded store is used when absent.
    #[arg(long)]
    etcd_servers: Option<String>,
    /// CA of the etcd members' serving certificates: etcd over TLS.
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate towards etcd (with --etcd-keyfile), when etcd asks for one.
    #[arg(long, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// Key of --etcd-certfile.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/skiff")]
    etcd_prefix: String,
    /// Pod CIDR of the cluster; nodes get a /24 each (node IPAM).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// Address the `kubernetes` Service's endpoints name (default: the listen address, or
    /// the host's address when listening on all addresses).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// More names or addresses for the serving certificate (repeatable or comma-separated),
    /// besides the host's name and addresses, which it always holds.
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// Lifetime of the certificates the cluster CA signs for CertificateSigningRequests
    /// (kube-controller-manager's flag; a request's `expirationSeconds` may shorten it).
    #[arg(long, default_value = "8760h", value_parser = positive_duration)]
    cluster_signing_duration: std::time::Duration,
    /// Terminated pods kept before the pod GC deletes the oldest (0 disables).
    #[arg(long, default_value_t = 12500)]
    terminated_pod_gc_threshold: usize,
    /// How often the HorizontalPodAutoscalers are evaluated (kube-controller-manager's flag).
    #[arg(long, default_value = "15s", value_parser = positive_duration)]
    horizontal_pod_autoscaler_sync_period: std::time::Duration,
    /// How long an autoscaler waits, before scaling down, for the highest recommendation of
    /// this window (kube-controller-manager's flag).
    #[arg(long, default_value = "5m", value_parser = nonnegative_duration)]
    horizontal_pod_autoscaler_downscale_stabilization: std::time::Duration,
    /// Client connections open at once; more are refused with a log line (default: what the
    /// open-file limit allows, less a reserve).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Serve the API only: no in-process scheduler and controllers.
    #[arg(long)]
    no_controllers: bool,
    /// Where on each node the local-path provisioner (StorageClass `local-path`, the
    /// default) keeps its volumes.
    #[arg(long, default_value = "/var/lib/skiff/storage")]
    local_path_root: PathBuf,
    /// No local-path provisioner and no `local-path` StorageClass.
    #[arg(long)]
    no_local_path: bool,
    /// The image of the pods that remove a deleted local-path volume's directory on its
    /// node (it needs `rm`).
    #[arg(long, default_value = skiff_controllers::DEFAULT_HELPER_IMAGE)]
    local_path_helper_image: String,
    /// Write the audit log (JSON lines, audit.k8s.io/v1 Events) here.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// What the audit log records: None, Metadata, Request or RequestResponse.
    #[arg(long, default_value = "Metadata")]
    audit_level: String,
    /// Encrypt resources at rest as this EncryptionConfiguration says (aesgcm, identity).
    #[arg(long)]
    encryption_provider_config: Option<PathBuf>,
    /// Encrypt Secrets at rest with this AES-GCM key (32 bytes, raw or base64).
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
    /// Static bearer tokens: CSV lines `token,user,uid,"group1,group2"` (upstream format).
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Authorizers: `Node,RBAC` (default) or `AlwaysAllow`.
    #[arg(long, default_value = "Node,RBAC")]
    authorization_mode: String,
    /// How often the nodes' resource metrics are scraped for `metrics.k8s.io` (`kubectl
    /// top`), a Go duration (metrics-server's flag).
    #[arg(long, default_value = "15s", value_parser = positive_duration)]
    metric_resolution: std::time::Duration,
    /// Serve plain HTTP with authentication and authorization off. Local development only.
    #[arg(long)]
    insecure_http: bool,
    /// Log lines as `text` or `json`.
    #[arg(long, default_value = "text")]
    log_format: skiff_core::logging::LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Bootstrap join tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Create a join token (printed on stdout) for `skiff-agent --server URL --token TOKEN`.
    Create {
        /// Admin kubeconfig of the running server (default: <data-dir>/admin.kubeconfig).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Validity in seconds.
        #[arg(long, default_value_t = 86400)]
        ttl: u64,
    },
}

/// mimalloc instead of glibc malloc: the apiserver allocates and frees many small JSON
/// values per request; glibc's malloc/free/consolidate were about a quarter of its CPU.
#[global_allocator]
static GLOBAL: Mimalloc = Mimalloc;

/// mimalloc through its plain `mi_malloc`/`mi_realloc` whenever they already give the
/// alignment asked for (as std's `System` does with `malloc`), its `_aligned` entry points
/// only otherwise. The `mimalloc` crate calls `mi_malloc_aligned` for every allocation,
/// whose extra checks, and whose generic path for every block over 1 KiB, were about a
/// quarter of the allocator's instructions (about 600 allocations per pod create).
struct Mimalloc;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const MI_MAX_ALIGN_SIZE: usize = 16;

fn plain(align: usize, size: usize) -> bool {
    align <= MI_MAX_ALIGN_SIZE && align <= size
}

// SAFETY: every block comes from mimalloc with at least the layout's size and alignment
// (`plain` holds exactly when `mi_malloc`'s guarantee covers it), and goes back through
// `mi_free`/`mi_realloc*`, which accept any mimalloc block.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.align(), layout.size()) {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.align(), layout.size()) {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: see the impl.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.align(), new_size) {
                libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

/// mimalloc's defaults trade memory for speed: arenas committed eagerly and freed pages
/// purged after 10 ms. Eager commit off keeps skiff-server's RSS at 10k pods under 100 MB.
/// Freed pages are purged (returned to the kernel) after 100 ms: purging them at once cost
/// a page fault and a zeroed page every time a freed page was reused moments later, which
/// under a burst of bindings was about 15% of the server's CPU (`cargo xtask bench
/// scheduler`, alternating runs: 3,953 -> 4,432 and 4,692 -> 5,465 pods/s, server CPU per
/// binding 244 -> 212 and 236 -> 190 us) for about 4 MB more RSS at 10k pods. Runs from
/// `.init_array`, before the Rust runtime's first allocation creates an arena. The option
/// numbers are those of mimalloc v3's `mi_option_e` (libmimalloc-sys 0.1.49 builds v3; it
/// exports no constants for these two).
#[used]
#[unsafe(link_section = ".init_array")]
static MIMALLOC_OPTIONS: extern "C" fn() = {
    extern "C" fn set_options() {
        const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
        const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
        // SAFETY: plain option setters of the C library, called before any allocation.
        unsafe {
            libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
            libmimalloc_sys::mi_option_set(PURGE_DELAY, 100);
        }
    }
    set_options
};

/// A Go duration (`0s`, `5m`), not negative.
fn nonnegative_duration(s: &str) -> Result<std::time::Duration, String> {
    match skiff_core::cron::go_duration_nanos(s) {
        Some(0) => Ok(std::time::Duration::ZERO),
        Some(n) if n < 0 => Err(format!("{s:?}: must not be negative")),
        _ => positive_duration(s),
    }
}

/// A Go duration (`15s`, `1m30s`) above zero.
fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match skiff_core::cron::go_duration_nanos(s) {
        Some(n) if n > 0 => {
            Ok(std::time::Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX)))
        }
        Some(_) => Err(format!("{s:?}: must be above zero")),
        None => Err(format!("{s:?} is not a duration (such as 15s or 1m30s)")),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    skiff_core::logging::init(args.log_format, skiff_core::logging::LogStream::Stderr);
    if let Some(Command::Token { command: TokenCommand::Create { kubeconfig, ttl } }) = args.command
    {
        let kubeconfig = kubeconfig.unwrap_or_else(|| args.data_dir.join("admin.kubeconfig"));
        let token =
            skiff_core::join::create_token(&kubeconfig, std::time::Duration::from_secs(ttl))
                .await
                .context("creating a join token")?;
        println!("{token}");
        return Ok(());
    }
    let authorization = match args.authorization_mode.as_str() {
        "Node,RBAC" | "RBAC,Node" | "RBAC" => AuthorizationMode::NodeRbac,
        "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
        other => anyhow::bail!("--authorization-mode {other:?}: expected Node,RBAC or AlwaysAllow"),
    };
    let open_files = server::raise_open_file_limit();
    let mut config = ServerConfig {
        data_dir: args.data_dir,
        listen: args.listen,
        advertise_address: args.advertise_address,
        tls_sans: args.tls_san,
        ..Default::default()
    };
    config.connections.max_connections = args.max_connections;
    tracing::info!(
        open_files,
        max_connections = config.connections.max_connections(),
        "connection limits"
    );
    config.api.service_cidr = Cidr::parse(&args.service_cluster_ip_range).with_context(|| {
        format!("--service-cluster-ip-range {:?}", args.service_cluster_ip_range)
    })?;
    let (lo, hi) = args
        .service_node_port_range
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .with_context(|| format!("--service-node-port-range {:?}", args.service_node_port_range))?;
    config.api.node_ports = (lo, hi);
    config.api.metric_resolution = args.metric_resolution;
    config.api.audit.path = args.audit_log_path;
    config.api.audit.level = args
        .audit_level
        .parse()
        .with_context(|| format!("--audit-level {:?}", args.audit_level))?;
    config.api.auth.signing_duration = args.cluster_signing_duration;
    config.encryption_provider_config = args.encryption_provider_config;
    config.encryption_key_file = args.encryption_key_file;
    if !args.no_controllers {
        let controllers = ControllerConfig {
            cluster_cidr: Some(
                Cidr::parse(&args.cluster_cidr)
                    .with_context(|| format!("--cluster-cidr {:?}", args.cluster_cidr))?,
            ),
            terminated_pod_gc_threshold: args.terminated_pod_gc_threshold,
            local_path_root: (!args.no_local_path).then_some(args.local_path_root),
            local_path_helper_image: args.local_path_helper_image,
            hpa_sync_period: args.horizontal_pod_autoscaler_sync_period,
            hpa_downscale_stabilization: args.horizontal_pod_autoscaler_downscale_stabilization,
            cluster_signing_duration: args.cluster_signing_duration,
            ..Default::default()
        };
        config.controllers = Some(controllers);
        config.scheduler = Some(SchedulerConfig::default());
    }
    config.auth = AuthOptions {
        token_auth_file: args.token_auth_file,
        authorization,
        insecure_http: args.insecure_http,
    };
    if let Some(servers) = args.etcd_servers {
        let tls = match &args.etcd_cafile {
            Some(ca) => Some(
                skiff_store::etcd::EtcdTls::from_files(
                    ca,
                    args.etcd_certfile.as_deref(),
                    args.etcd_keyfile.as_deref(),
                )
                .context("--etcd-cafile/--etcd-certfile/--etcd-keyfile")?,
            ),
            None if args.etcd_certfile.is_some() => {
                anyhow::bail!("--etcd-certfile needs --etcd-cafile (the CA of etcd's certificates)")
            }
            None => None,
        };
        config.store = StoreConfig::Etcd {
            endpoints: servers.split(',').map(str::to_string).collect(),
            prefix: args.etcd_prefix,
            tls,
        };
    }
    let running = server::start(config).await?;
    eprintln!(
        "skiff-server listening on {}; kubeconfig: {}",
        running.addr,
        running.kubeconfig.display()
    );
    tokio::select! {
        signal = skiff_core::logging::shutdown_signal() => {
            let name = signal.context("waiting for SIGTERM or SIGINT")?;
            tracing::info!(signal = name, "shutting down");
            Ok(())
        }
        reason = store_failure(running.api.store.clone()) => {
            // Writes would fail until the store is reopened (a full disk, an I/O error):
            // exit, so that the supervisor (systemd's Restart=always) starts a fresh process,
            // which replays the log and serves again once the disk is usable.
            anyhow::bail!("the store cannot write until it is reopened ({reason}): exiting so that skiff-server is restarted")
        }
    }
}

/// Resolves with the reason once the store needs reopening (checked every second).
async fn store_failure(store: skiff_store::DynStore) -> String {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if let Some(reason) = store.needs_reopen() {
            return reason;
        }
    }
}
