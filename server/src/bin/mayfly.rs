//! `mayfly`: parses flags, starts the server, stops it on SIGINT or SIGTERM.

use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, ValueEnum};
use mayfly_server::{
    AuthConfig, ClusterConfig, Config, NatsAuth, RunningServer, StorageConfig,
    auth::MIN_GIVEN_KEY_CHARS,
    engine::IdempotencyConfig,
    net::{Limits, TlsFiles},
    storage::{DEFAULT_FEED_MEMORY_BYTES, DEFAULT_READ_CACHE_BYTES, DiskOptions, Durability},
};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

// Documents are allocated by request threads and freed by purge threads; glibc's allocator
// spent close to half of the purge's time on that pattern (measured with perf), mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long a cluster node's shutdown waits for its partitions to be handed over.
const LEAVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a shutdown waits for connections to finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Mayfly: a document database served over gRPC that expires data by Cosmos DB's TTL rules.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address for gRPC (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Where documents live: `disk` (in --data-dir) or `memory` (lost at exit: for caches
    /// and tests).
    #[arg(long, value_enum, default_value_t = StorageKind::Disk)]
    storage: StorageKind,
    /// Data directory for `--storage disk` (created if missing; one server at a time); in
    /// cluster mode it holds a copy of the cluster's keys (`keys/`).
    #[arg(long, default_value = "./mayfly-data")]
    data_dir: PathBuf,
    /// When a write is acknowledged: `fsync` (durable on disk, survives power loss) or
    /// `buffered` (handed to the OS: survives a crash of mayfly, but a power loss or OS crash
    /// can lose the last 100 ms of acknowledged writes).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Fsync)]
    durability: DurabilityArg,
    /// Storage engine block cache, in MiB.
    #[arg(long, default_value_t = 256)]
    cache_mb: u64,
    /// Documents and index entries kept decoded after a read, in MiB (0: none): a point read
    /// or an indexed query that finds them there skips the storage engine. Size it to what is
    /// read often.
    #[arg(long, default_value_t = DEFAULT_READ_CACHE_BYTES / (1024 * 1024))]
    read_cache_mb: u64,
    /// Engine shards (default: one per core; a data directory keeps the count it was created
    /// with).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    shards: Option<u16>,
    /// With `--storage memory`: MiB of change feed events each shard keeps, the oldest going
    /// first beyond it (retention applies too). An event takes about its document's size.
    #[arg(long, default_value_t = (DEFAULT_FEED_MEMORY_BYTES / (1024 * 1024)) as u64)]
    feed_memory_mb: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Join a cluster on NATS JetStream: the NATS servers' URLs, comma-separated (each server
    /// run with `sync_interval: always`; see docs/cluster.md). Needs --node-id. On a data
    /// directory (the default storage) the node keeps its partitions there and resumes them
    /// after a restart; --storage memory keeps nothing.
    #[arg(long, value_delimiter = ',', requires = "node_id")]
    cluster: Option<Vec<String>>,
    /// The NATS servers' monitoring endpoints (http://HOST:PORT, each server's `http:`
    /// setting), comma-separated: the node reads each one's /varz and refuses to start if one
    /// runs JetStream without `sync_interval: always`. Without them it cannot tell, and warns.
    #[arg(long, value_delimiter = ',', requires = "cluster")]
    cluster_nats_monitor: Vec<String>,
    /// This node's id in the cluster (unique among its nodes).
    #[arg(long, requires = "cluster")]
    node_id: Option<String>,
    /// The cluster's partitions, fixed when it is made (every node gives the same number; in
    /// cluster mode they are the engine's shards).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    partitions: u16,
    /// Where the other nodes of the cluster reach this one (HOST:PORT; default: --listen, which
    /// must then not be 0.0.0.0 or [::]).
    #[arg(long, requires = "cluster")]
    advertise: Option<String>,
    /// Replicas of the cluster's streams on the NATS servers: 3, or 1 for a single server.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=5))]
    cluster_replicas: u8,
    /// Standbys per partition: other nodes that keep its copy caught up with its log and take
    /// it over within a lease when its owner dies (0: a new owner replays the log instead).
    #[arg(long, default_value_t = 1, requires = "cluster")]
    standbys: u8,
    /// A partition's owner writes its snapshot to the partition's log after this many records
    /// (or after 10 minutes with any), and purges the log below the snapshot before it: the
    /// log stays about two snapshot intervals long, and a node that lacks it loads the
    /// snapshot and replays what follows.
    #[arg(long, default_value_t = mayfly_server::DEFAULT_SNAPSHOT_RECORDS, value_parser = clap::value_parser!(u64).range(1..), requires = "cluster")]
    snapshot_records: u64,
    /// With --tls-cert in cluster mode: the CA (PEM) that issued the other nodes' certificates,
    /// which this node checks when it forwards to them [default: --tls-client-ca].
    #[arg(long, requires = "cluster")]
    cluster_peer_ca: Option<PathBuf>,
    /// The cluster key: a file of 64 hex digits (`openssl rand -hex 32`), the same on every
    /// node from the cluster's start; the cluster's keys and continuation key are sealed with
    /// it on the NATS servers (without it they are kept in clear there).
    #[arg(long, requires = "cluster")]
    cluster_key_file: Option<PathBuf>,
    /// NATS credentials: a `.creds` file (user JWT and seed, for NATS in operator mode) or a
    /// file holding a user nkey seed (`SU…`, for a NATS `authorization` listing its public key).
    #[arg(long, requires = "cluster")]
    cluster_creds: Option<PathBuf>,
    /// Connect to NATS over TLS only, checking the servers' certificates against this CA (PEM).
    #[arg(long, requires = "cluster")]
    cluster_tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for NATS servers that verify their clients.
    #[arg(long, requires_all = ["cluster", "cluster_tls_key"])]
    cluster_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --cluster-tls-cert.
    #[arg(long, requires = "cluster_tls_cert")]
    cluster_tls_key: Option<PathBuf>,
    /// Serve every caller without a key. Without keys a server listens on loopback only,
    /// unless this is given.
    #[arg(long, conflicts_with_all = ["primary_key", "secondary_key", "primary_readonly_key", "secondary_readonly_key"])]
    insecure_no_auth: bool,
    /// Read-write key for this run, instead of the data directory's `keys/` (at least 16
    /// characters; keys given here cannot be regenerated through the Admin service).
    #[arg(long, env = "MAYFLY_PRIMARY_KEY", hide_env_values = true)]
    primary_key: Option<String>,
    /// Second read-write key for this run.
    #[arg(long, env = "MAYFLY_SECONDARY_KEY", hide_env_values = true)]
    secondary_key: Option<String>,
    /// Read-only key for this run.
    #[arg(long, env = "MAYFLY_PRIMARY_READONLY_KEY", hide_env_values = true)]
    primary_readonly_key: Option<String>,
    /// Second read-only key for this run.
    #[arg(long, env = "MAYFLY_SECONDARY_READONLY_KEY", hide_env_values = true)]
    secondary_readonly_key: Option<String>,
    /// Do not serve gRPC reflection (the API description grpcurl reads).
    #[arg(long)]
    no_reflection: bool,
    /// Serve TLS with this certificate chain (PEM, leaf first); reloaded on SIGHUP.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate issued by a CA in this PEM file.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on an address reachable beyond this machine (keys and data travel in
    /// clear). Without TLS a server listens on loopback only, unless this is given.
    #[arg(long, conflicts_with = "tls_cert")]
    insecure_plaintext: bool,
    /// Connections open at once; more are closed as soon as accepted. [default: 4096, or what
    /// the open-file limit leaves once storage has its share]
    #[arg(long)]
    max_connections: Option<usize>,
    /// Connections open at once from one client address (IPv6: one /64 network).
    #[arg(long, default_value_t = Limits::default().max_connections_per_ip)]
    max_connections_per_ip: usize,
    /// Requests in flight on one connection (HTTP/2 concurrent streams).
    #[arg(long, default_value_t = Limits::default().max_streams_per_connection)]
    max_streams_per_connection: u32,
    /// Seconds between HTTP/2 PINGs on a quiet connection.
    #[arg(long, default_value_t = Limits::default().keepalive_interval.as_secs())]
    keepalive_secs: u64,
    /// Seconds a PING's answer may take before the connection is closed.
    #[arg(long, default_value_t = Limits::default().keepalive_timeout.as_secs())]
    keepalive_timeout_secs: u64,
    /// Seconds a connection may go without a request in flight before it is closed.
    #[arg(long, default_value_t = Limits::default().idle_timeout.as_secs())]
    idle_timeout_secs: u64,
    /// Seconds a new connection may take to send its first request before it is closed.
    #[arg(long, default_value_t = Limits::default().first_request_timeout.as_secs())]
    first_request_timeout_secs: u64,
    /// Seconds a request message may take to arrive (a stalled upload is ended after this).
    #[arg(long, default_value_t = Limits::default().request_read_timeout.as_secs())]
    request_read_timeout_secs: u64,
    /// KiB at which a feed or query page ends: what a stream whose reader stalls holds.
    #[arg(long, default_value_t = Limits::default().page_bytes / 1024)]
    page_kib: usize,
    /// MiB of responses held for all clients while they wait to be read; beyond it a
    /// response ends with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = Limits::default().response_budget_bytes / (1024 * 1024))]
    response_budget_mb: usize,
    /// MiB of --response-budget-mb that the clients at one address (IPv6: one /64) may hold.
    #[arg(long, default_value_t = Limits::default().response_budget_per_ip_bytes / (1024 * 1024))]
    response_budget_per_ip_mb: usize,
    /// Seconds a streaming response may wait for its client to take any of it; then the
    /// connection is closed.
    #[arg(long, default_value_t = Limits::default().send_timeout.as_secs())]
    send_timeout_secs: u64,
    /// MiB of request messages on their way in, for all clients; beyond it a request is
    /// answered RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = Limits::default().request_budget_bytes / (1024 * 1024))]
    request_budget_mb: usize,
    /// MiB of --request-budget-mb that the clients at one address (IPv6: one /64) may hold.
    #[arg(long, default_value_t = Limits::default().request_budget_per_ip_bytes / (1024 * 1024))]
    request_budget_per_ip_mb: usize,
    /// Seconds an applied write's idempotency key is remembered: a retry with the same key
    /// within it applies nothing again.
    #[arg(long, default_value_t = Limits::default().idempotency.window / 1000)]
    idempotency_window_secs: u64,
    /// Idempotency keys remembered at once (each ~200 bytes, plus kept answers); a keyed write
    /// beyond it is refused with RESOURCE_EXHAUSTED until the oldest key is forgotten.
    #[arg(long, default_value_t = Limits::default().idempotency.max_keys)]
    idempotency_max_keys: usize,
    /// MiB of first answers kept to replay to retries; beyond it the oldest go, and their
    /// retries are answered REQUEST_ALREADY_APPLIED instead.
    #[arg(long, default_value_t = Limits::default().idempotency.answer_bytes / (1024 * 1024))]
    idempotency_answers_mb: usize,
}

impl Args {
    /// The limits of the flags, with `max_connections` as the descriptor limit allows.
    fn limits(&self, max_connections: usize) -> Limits {
        Limits {
            max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_streams_per_connection: self.max_streams_per_connection,
            keepalive_interval: Duration::from_secs(self.keepalive_secs),
            keepalive_timeout: Duration::from_secs(self.keepalive_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            first_request_timeout: Duration::from_secs(self.first_request_timeout_secs),
            request_read_timeout: Duration::from_secs(self.request_read_timeout_secs),
            page_bytes: self.page_kib.saturating_mul(1024),
            response_budget_bytes: self.response_budget_mb.saturating_mul(1024 * 1024),
            response_budget_per_ip_bytes: self
                .response_budget_per_ip_mb
                .saturating_mul(1024 * 1024),
            send_timeout: Duration::from_secs(self.send_timeout_secs),
            request_budget_bytes: self.request_budget_mb.saturating_mul(1024 * 1024),
            request_budget_per_ip_bytes: self.request_budget_per_ip_mb.saturating_mul(1024 * 1024),
            idempotency: IdempotencyConfig {
                window: self.idempotency_window_secs.saturating_mul(1000),
                max_keys: self.idempotency_max_keys,
                answer_bytes: self.idempotency_answers_mb.saturating_mul(1024 * 1024),
            },
        }
    }

    /// The cluster to join, if any. Its partitions are the engine's shards: `--shards`, if
    /// given, must say the same.
    fn cluster_config(&self) -> Result<Option<ClusterConfig>, String> {
        let (Some(urls), Some(node_id)) = (&self.cluster, &self.node_id) else {
            return Ok(None);
        };
        if self.shards.is_some_and(|s| s != self.partitions) {
            return Err(format!(
                "in cluster mode the shards are the partitions: --shards {} differs from --partitions {}",
                self.shards.unwrap_or_default(),
                self.partitions
            ));
        }
        // A key of the cluster's buckets and part of message ids: kept to what NATS takes.
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if node_id.is_empty() || node_id.len() > 64 || !node_id.chars().all(valid) {
            return Err(format!(
                "--node-id {node_id:?}: 1 to 64 letters, digits, '-' or '_'"
            ));
        }
        Ok(Some(ClusterConfig {
            urls: urls.clone(),
            nats_monitors: self.cluster_nats_monitor.clone(),
            node_id: node_id.clone(),
            partitions: usize::from(self.partitions),
            replicas: usize::from(self.cluster_replicas),
            advertise: self.advertise.clone(),
            standbys: usize::from(self.standbys),
            snapshot_records: self.snapshot_records,
            peer_ca: self.cluster_peer_ca.clone(),
            key_file: self.cluster_key_file.clone(),
            nats: NatsAuth {
                credentials: self.cluster_creds.clone(),
                tls_ca: self.cluster_tls_ca.clone(),
                tls_identity: self
                    .cluster_tls_cert
                    .clone()
                    .zip(self.cluster_tls_key.clone()),
            },
        }))
    }

    fn tls(&self) -> Result<Option<TlsFiles>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })),
            (None, None) if self.listen.ip().is_loopback() || self.insecure_plaintext => Ok(None),
            (None, None) => Err(format!(
                "{} is reachable beyond this machine and keys and documents would travel in \
                 clear: give --tls-cert and --tls-key, or --insecure-plaintext (say, behind a \
                 TLS-terminating proxy)",
                self.listen
            )),
            _ => Err("--tls-cert and --tls-key go together".into()),
        }
    }
}

/// Who may call, from the flags: keys given, `--insecure-no-auth`, the cluster's keys (in
/// cluster mode), the data directory's keys, or (memory storage on loopback only) nobody
/// needs one.
fn auth_config(args: &Args) -> Result<(AuthConfig, &'static str), String> {
    let given = [
        args.primary_key.clone(),
        args.secondary_key.clone(),
        args.primary_readonly_key.clone(),
        args.secondary_readonly_key.clone(),
    ];
    if given.iter().any(Option::is_some) {
        let keys: Vec<&String> = given.iter().flatten().collect();
        if keys.iter().any(|k| k.chars().count() < MIN_GIVEN_KEY_CHARS) {
            return Err(format!(
                "keys must have at least {MIN_GIVEN_KEY_CHARS} characters (a short key is a guessable one)"
            ));
        }
        if keys.iter().enumerate().any(|(i, k)| keys[..i].contains(k)) {
            return Err("each key must differ from the others".into());
        }
        return Ok((
            AuthConfig::Given(given),
            "keys given on the command line or environment",
        ));
    }
    if args.insecure_no_auth {
        return Ok((
            AuthConfig::Open,
            "NO AUTHENTICATION (--insecure-no-auth): anyone who reaches the port may read, write and delete everything",
        ));
    }
    if args.cluster.is_some() {
        return Ok((
            AuthConfig::Cluster {
                copy_to: Some(args.data_dir.clone()),
            },
            "the cluster's keys (NATS bucket mayfly-keys), copied to the data directory's keys/",
        ));
    }
    match args.storage {
        StorageKind::Disk => Ok((AuthConfig::DataDir, "keys in the data directory's keys/")),
        StorageKind::Memory if args.listen.ip().is_loopback() => Ok((
            AuthConfig::Open,
            "no keys (memory storage on loopback): give --primary-key to require one",
        )),
        StorageKind::Memory => Err(format!(
            "--storage memory has no data directory to keep keys in, and {} is reachable beyond this machine: give --primary-key (or MAYFLY_PRIMARY_KEY), or --insecure-no-auth to serve everyone",
            args.listen
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StorageKind {
    Disk,
    Memory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DurabilityArg {
    Fsync,
    Buffered,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Logs go to stderr: stdout carries only the address line that scripts read.
    let stderr = std::io::stderr();
    tracing_subscriber::fmt()
        .with_env_filter(
            // The storage engine's tree logs routine steps ("Finished ingestion writer") at info.
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,lsm_tree=warn")),
        )
        .with_ansi(stderr.is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // Every connection takes a descriptor, and the storage engine keeps files open: the
    // process's limit is raised as far as it may go and shared between them.
    let descriptors = mayfly_server::net::plan_descriptors(
        mayfly_server::net::raise_descriptor_limit(),
        args.storage == StorageKind::Disk,
        args.max_connections,
        Limits::default().max_connections,
    );
    if let Some(warning) = &descriptors.warning {
        tracing::warn!("{warning}");
    }
    let shards = args.shards.map(usize::from);
    let storage = match args.storage {
        StorageKind::Memory => StorageConfig::Memory {
            shards,
            feed_bytes: Some(
                usize::try_from(args.feed_memory_mb.saturating_mul(1024 * 1024))
                    .unwrap_or(usize::MAX),
            ),
        },
        StorageKind::Disk => StorageConfig::Disk(DiskOptions {
            path: args.data_dir.clone(),
            durability: match args.durability {
                DurabilityArg::Fsync => Durability::Fsync,
                DurabilityArg::Buffered => Durability::Buffered,
            },
            shards,
            cache_bytes: args.cache_mb.saturating_mul(1024 * 1024),
            read_cache_bytes: args.read_cache_mb.saturating_mul(1024 * 1024),
            open_files: descriptors.storage_files,
        }),
    };
    let described = match args.storage {
        StorageKind::Memory => "memory storage: data does not survive a restart".to_owned(),
        StorageKind::Disk => format!(
            "data in {}, acknowledged after {}",
            args.data_dir.display(),
            match args.durability {
                DurabilityArg::Fsync => "fsync",
                DurabilityArg::Buffered => "reaching the OS (buffered)",
            }
        ),
    };
    let (auth, auth_described) = match auth_config(&args) {
        Ok(auth) => auth,
        Err(e) => {
            eprintln!("mayfly: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let tls = match args.tls() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("mayfly: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let transport = match &tls {
        Some(files) if files.client_ca.is_some() => "TLS, client certificates required",
        Some(_) => "TLS",
        None => "plaintext",
    };
    let cluster = match args.cluster_config() {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("mayfly: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        listen: args.listen,
        storage,
        metrics_listen: args.metrics_listen,
        auth,
        tls,
        limits: args.limits(descriptors.max_connections),
        reflection: !args.no_reflection,
        cluster,
    };
    // Handlers first: a supervisor may signal as soon as it reads the address line, and a
    // signal arriving before them would kill the process instead of stopping it gracefully.
    let mut signals = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(interrupt), Ok(terminate), Ok(hangup)) => (interrupt, terminate, hangup),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("mayfly: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = match RunningServer::start(config).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("mayfly: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address goes to stdout so that scripts (and tests) can read the port picked for :0.
    println!("mayfly listening on {}", server.local_addr());
    tracing::info!(
        listen = %server.local_addr(),
        shards = server.engine().get().map_or(0, |e| e.shard_count()),
        metrics = ?server.metrics_addr(),
        "serving ({described}; {auth_described}; {transport})"
    );
    loop {
        tokio::select! {
            _ = signals.0.recv() => break,
            _ = signals.1.recv() => break,
            _ = signals.2.recv() => match server.reload_tls() {
                Ok(true) => tracing::info!("SIGHUP: TLS certificate reloaded; new connections use it"),
                Ok(false) => tracing::info!("SIGHUP: no TLS to reload"),
                Err(e) => tracing::error!(error = %e, "SIGHUP: TLS reload failed; the certificate in use stays in use"),
            },
        }
    }
    tracing::info!("shutting down");
    // A cluster node hands its partitions over first, still serving what it forwards.
    match server.leave_cluster(LEAVE_TIMEOUT).await {
        Some(0) => tracing::info!("left the cluster: every partition handed over"),
        Some(left) => tracing::warn!(
            partitions = left,
            "left the cluster with partitions not handed over in time: they lapse to the other nodes"
        ),
        None => {}
    }
    // In-flight requests get a grace period; an idle client that keeps its connection open
    // must not keep the server alive. Every acknowledged write is already durable.
    match tokio::time::timeout(SHUTDOWN_GRACE, server.shutdown()).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("mayfly: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            tracing::warn!(
                grace_secs = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period; exiting"
            );
            ExitCode::SUCCESS
        }
    }
}
