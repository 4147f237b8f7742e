//! Assembles the gRPC server: the engine and its purge, the three Mayfly services, health,
//! reflection (v1 and v1alpha, for grpcurl 1.8) and the optional metrics endpoint.

use std::{fmt, future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use mayfly_proto::v1::server::{
    AdminServer, ClusterServer, CollectionsServer, DatabasesServer, DocumentsServer,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::{server::NamedService, service::Routes};
use tonic_health::{ServingStatus, server::HealthReporter};
use tower_layer::Layer as _;

use crate::{
    auth::{Authenticator, KeyRing, SecretsDir, random_secret, secret_bytes},
    cluster_metrics::ClusterMetrics,
    cluster_node::{self, ClusterConfig, ClusterNode},
    current_engine::CurrentEngine,
    engine::{self, Engine, EngineConfig, EngineMetrics, IdempotencyConfig, SystemClock, TokenKey},
    engine_load::{LoadFailed, load_engine},
    grpc::{
        AdminService, CatalogRoute, ClusterService, CollectionsService, DatabasesService,
        DocumentsService,
        forward::{Forwarder, Owners},
    },
    metrics_http,
    net::{
        self, Budgets, Limits, MAX_MESSAGE_BYTES, OPEN_MESSAGE_BYTES, RequestLimitsLayer,
        ServerTls, TlsError, TlsFiles,
    },
    storage::{
        DEFAULT_FEED_MEMORY_BYTES, DiskOptions, DiskStorage, MemoryStorage, OpenError, Storage,
        default_shards,
    },
};

/// How to run a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where documents live.
    pub storage: StorageConfig,
    /// Address for `GET /metrics`; `None` serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// Who may call.
    pub auth: AuthConfig,
    /// TLS for the gRPC listener; `None` serves plaintext.
    pub tls: Option<TlsFiles>,
    /// What clients may hold of the server.
    pub limits: Limits,
    /// Serve reflection (grpcurl's view of the API); it stays open to callers without keys.
    pub reflection: bool,
    /// Join a cluster on NATS JetStream instead of serving alone (docs/cluster.md); the
    /// storage must then be memory (see `cluster_node`).
    pub cluster: Option<ClusterConfig>,
}

/// How the gRPC listener meets its clients.
#[derive(Debug, Clone)]
pub struct Network {
    /// TLS for every connection, if any.
    pub tls: Option<Arc<ServerTls>>,
    /// What clients may hold of the server.
    pub limits: Limits,
    /// Whether the reflection services (what grpcurl reads the API from) are served.
    pub reflection: bool,
}

impl Default for Network {
    /// Plaintext, default limits, reflection on.
    fn default() -> Self {
        Network {
            tls: None,
            limits: Limits::default(),
            reflection: true,
        }
    }
}

/// Who may call a server.
#[derive(Debug, Clone, Default)]
pub enum AuthConfig {
    /// No keys: every caller may do everything (tests, loopback, `--insecure-no-auth`).
    #[default]
    Open,
    /// The four keys in the data directory's `keys/`, generated on first start (disk storage
    /// only).
    DataDir,
    /// Keys given for this run (primary, secondary, primary read-only, secondary read-only; a
    /// slot without one accepts nothing). They cannot be regenerated.
    Given([Option<String>; 4]),
    /// The cluster's keys, kept in its `mayfly-keys` bucket (cluster mode only), with a copy
    /// written to `copy_to`'s `keys/` if given.
    Cluster { copy_to: Option<std::path::PathBuf> },
}

/// Where a server keeps its documents.
#[derive(Debug, Clone)]
pub enum StorageConfig {
    /// In memory only: nothing survives a restart. `shards` defaults to one per core;
    /// `feed_bytes` caps the change feed events each shard keeps (default
    /// [`DEFAULT_FEED_MEMORY_BYTES`]), the oldest going first.
    Memory {
        shards: Option<usize>,
        feed_bytes: Option<usize>,
    },
    /// In a data directory (the directory's shard count applies; see [`DiskOptions`]).
    Disk(DiskOptions),
}

impl Default for Config {
    /// Loopback on a free port, in memory, one shard per core, no metrics: what tests and
    /// examples want.
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            storage: StorageConfig::Memory {
                shards: None,
                feed_bytes: None,
            },
            metrics_listen: None,
            auth: AuthConfig::Open,
            tls: None,
            limits: Limits::default(),
            reflection: true,
            cluster: None,
        }
    }
}

/// Why a server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// Binding or serving a socket failed.
    Io(io::Error),
    /// The reflection service could not load the descriptors.
    Reflection(tonic_reflection::server::Error),
    /// The data directory could not be opened.
    Storage(OpenError),
    /// What the data directory holds could not be loaded.
    Recovery(engine::Error),
    /// The configuration cannot be served (say, keys kept in a data directory without one).
    Config(String),
    /// The TLS certificate, key or client CA could not be loaded.
    Tls(TlsError),
}

impl From<LoadFailed> for ServeError {
    fn from(e: LoadFailed) -> Self {
        match e {
            LoadFailed::Recovery(e) => ServeError::Recovery(e),
            LoadFailed::Thread(e) => ServeError::Io(e),
        }
    }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Io(e) => write!(f, "{e}"),
            ServeError::Reflection(e) => write!(f, "reflection descriptors: {e}"),
            ServeError::Storage(e) => write!(f, "{e}"),
            ServeError::Recovery(e) => write!(f, "cannot load the data directory: {e}"),
            ServeError::Config(e) => f.write_str(e),
            ServeError::Tls(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServeError {}

impl From<io::Error> for ServeError {
    fn from(e: io::Error) -> Self {
        ServeError::Io(e)
    }
}

/// A server running in the background of the current tokio runtime.
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    engine: CurrentEngine,
    tls: Option<Arc<ServerTls>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
    /// A cluster node's background work (leases, the catalog log), stopped with the server.
    cluster: Option<ClusterNode>,
}

impl RunningServer {
    /// Binds the listeners, then serves in a background task. Clients may connect as soon as
    /// this returns.
    pub async fn start(config: Config) -> Result<Self, ServeError> {
        config.limits.check().map_err(ServeError::Config)?;
        let tls_files = config.tls.clone();
        let tls = match config.tls {
            Some(files) => Some(Arc::new(ServerTls::load(files).map_err(ServeError::Tls)?)),
            None => None,
        };
        let listener = TcpListener::bind(config.listen).await?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let local_addr = listener.local_addr()?;
        let (engine, routes, cluster) = match &config.cluster {
            None => (
                open_engine_blocking(&config.storage, (&config.limits).into(), Arc::default())
                    .await?,
                (CatalogRoute::Local, None, None, None),
                None,
            ),
            Some(cluster) => {
                let settings = EngineSettings::from(&config.limits);
                // A node serving TLS is reached, and reaches the others, over TLS.
                let peer_tls = match &tls_files {
                    None => None,
                    Some(files) => Some(
                        crate::net::peer_tls(files, cluster.peer_ca.as_deref())
                            .map_err(ServeError::Config)?,
                    ),
                };
                let scheme = if peer_tls.is_some() { "https" } else { "http" };
                let advertise = match &cluster.advertise {
                    Some(address) => format!("{scheme}://{address}"),
                    None if local_addr.ip().is_unspecified() => {
                        return Err(ServeError::Config(format!(
                            "cluster mode listening on {local_addr}: give --advertise HOST:PORT, the address the other nodes reach this one at"
                        )));
                    }
                    None => format!("{scheme}://{local_addr}"),
                };
                let keys = match &config.auth {
                    AuthConfig::Cluster { copy_to } => Some(copy_to.clone()),
                    _ => None,
                };
                let (engine, catalog, owners, node) = cluster_node::join(
                    cluster,
                    (
                        settings.config(cluster.partitions),
                        match &config.storage {
                            StorageConfig::Disk(options) => Some(options),
                            StorageConfig::Memory { .. } => None,
                        },
                    ),
                    &advertise,
                    keys,
                )
                .await?;
                let forwarder = Some(Forwarder::new(owners.clone(), peer_tls));
                let metrics = node.metrics();
                (
                    engine,
                    (catalog, forwarder, Some(owners), Some(metrics)),
                    Some(node),
                )
            }
        };
        // After the storage: the data directory is created and locked by then.
        let auth = match cluster.as_ref().and_then(ClusterNode::keys) {
            Some(keys) => Authenticator::with_shared_keys(keys, Arc::new(SystemClock)),
            None => authenticator(&config.auth, &config.storage)?,
        };
        let engine = CurrentEngine::new(engine);
        let metrics_addr = metrics_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_routed(
            listener,
            metrics_listener,
            engine.clone(),
            (config.storage, routes),
            auth,
            Network {
                tls: tls.clone(),
                limits: config.limits,
                reflection: config.reflection,
            },
            async {
                // A dropped sender stops the server too.
                let _ = stopped.await;
            },
        ));
        Ok(RunningServer {
            local_addr,
            metrics_addr,
            engine,
            tls,
            stop: Some(stop),
            task,
            cluster,
        })
    }

    /// The gRPC address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics address, if metrics are served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The engine behind the server: a new one each time the server reopens failed storage.
    pub fn engine(&self) -> &CurrentEngine {
        &self.engine
    }

    /// Reads the TLS certificate and key files again (as on SIGHUP): new connections use
    /// them, connections already up are left alone. Without TLS there is nothing to do. On
    /// error the certificate in use stays in use.
    pub fn reload_tls(&self) -> Result<bool, TlsError> {
        match &self.tls {
            Some(tls) => tls.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// A cluster node leaves its cluster gracefully, handing every partition it serves over
    /// to the others before a shutdown (see [`ClusterNode::leave`]); the partitions it still
    /// served when `timeout` passed (they lapse to the others). `None`: not a cluster node.
    pub async fn leave_cluster(&self, timeout: std::time::Duration) -> Option<usize> {
        match &self.cluster {
            Some(cluster) => Some(cluster.leave(timeout).await),
            None => None,
        }
    }

    /// Stops accepting requests, lets in-flight ones finish, and waits for the server to end
    /// and its storage to close: once this returns, a server may be started again on the same
    /// data directory.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(ServeError::Io(io::Error::other(e))),
        };
        // Background tasks (the purge, the indexer, a blocking round of either) let the
        // storage go a moment after they are stopped; the data directory stays locked until
        // the last of them has.
        let storage = self.engine.get().ok().map(|e| e.storage_handle());
        self.engine.take();
        drop(self.cluster.take());
        if let Some(storage) = storage {
            let deadline = tokio::time::Instant::now() + STORAGE_CLOSE_WAIT;
            while storage.strong_count() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if storage.strong_count() > 0 {
                tracing::warn!(
                    "the storage was still in use {STORAGE_CLOSE_WAIT:?} after the server stopped"
                );
            }
        }
        result
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The authenticator `auth` asks for.
fn authenticator(auth: &AuthConfig, storage: &StorageConfig) -> Result<Authenticator, ServeError> {
    let clock = Arc::new(SystemClock);
    match (auth, storage) {
        (AuthConfig::Open, _) => Ok(Authenticator::open(clock)),
        (AuthConfig::Given(keys), _) => Ok(Authenticator::with_keys(
            KeyRing::given(keys.clone()),
            clock,
        )),
        (AuthConfig::DataDir, StorageConfig::Disk(options)) => {
            let keys = KeyRing::kept_in(SecretsDir::open(&options.path)?)?;
            Ok(Authenticator::with_keys(keys, clock))
        }
        (AuthConfig::DataDir, StorageConfig::Memory { .. }) => Err(ServeError::Config(
            "keys kept in the data directory need disk storage: give the keys instead".into(),
        )),
        (AuthConfig::Cluster { .. }, _) => Err(ServeError::Config(
            "keys kept by a cluster need cluster mode (--cluster)".into(),
        )),
    }
}

/// [`open_engine`] on a blocking thread.
async fn open_engine_blocking(
    storage: &StorageConfig,
    settings: EngineSettings,
    metrics: Arc<EngineMetrics>,
) -> Result<Engine, ServeError> {
    let storage = storage.clone();
    tokio::task::spawn_blocking(move || open_engine(&storage, settings, metrics))
        .await
        .map_err(|e| ServeError::Io(io::Error::other(e)))?
}

/// Opens the storage and loads what it holds, then rebuilds expiry tracking on a thread of its
/// own: the engine serves correctly while it runs.
fn open_engine(
    storage: &StorageConfig,
    settings: EngineSettings,
    metrics: Arc<EngineMetrics>,
) -> Result<Engine, ServeError> {
    let (storage, shards): (Arc<dyn Storage>, usize) = match storage {
        StorageConfig::Memory { shards, feed_bytes } => (
            Arc::new(
                MemoryStorage::new().with_feed_cap(feed_bytes.unwrap_or(DEFAULT_FEED_MEMORY_BYTES)),
            ),
            shards.unwrap_or_else(default_shards),
        ),
        StorageConfig::Disk(options) => {
            let disk = DiskStorage::open(options).map_err(ServeError::Storage)?;
            let shards = disk.shard_count();
            let mut config = settings.config(shards);
            config.token_key = continuation_key(&options.path)?;
            return Ok(load_engine(Arc::new(disk), config, metrics)?);
        }
    };
    Ok(load_engine(storage, settings.config(shards), metrics)?)
}

/// What the server's limits set in its engine.
#[derive(Debug, Clone, Copy)]
struct EngineSettings {
    page_bytes: usize,
    idempotency: IdempotencyConfig,
}

impl From<&Limits> for EngineSettings {
    fn from(limits: &Limits) -> Self {
        EngineSettings {
            page_bytes: limits.page_bytes,
            idempotency: limits.idempotency,
        }
    }
}

impl EngineSettings {
    fn config(self, shards: usize) -> EngineConfig {
        let mut config = EngineConfig::new(shards);
        config.page_bytes = self.page_bytes;
        config.idempotency = self.idempotency;
        config
    }
}

/// The data directory's secret for continuation tokens (made on first start), so that a
/// client paging through a feed or query goes on across a restart.
fn continuation_key(data_dir: &std::path::Path) -> Result<TokenKey, ServeError> {
    const NAME: &str = "continuation";
    let secrets = SecretsDir::open(data_dir)?;
    let text = secrets.get_or_create(NAME, || random_secret(32))?;
    let bytes = secret_bytes(&text).ok_or_else(|| {
        io::Error::other(format!(
            "{} is not a secret this server wrote (32 bytes of URL-safe base64); delete it to \
             make a new one (continuation tokens issued so far stop working)",
            secrets.path_of(NAME).display()
        ))
    })?;
    Ok(TokenKey::from_bytes(bytes))
}

/// Serves the engine in `current` on `listener` until `shutdown` completes, then drains
/// in-flight requests. Should its storage fail, the server reopens `storage` once the cause is
/// gone (see `keep_storage_writable` in this module).
pub async fn serve(
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    current: CurrentEngine,
    storage: StorageConfig,
    auth: Authenticator,
    network: Network,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_routed(
        listener,
        metrics_listener,
        current,
        (storage, (CatalogRoute::Local, None, None, None)),
        auth,
        network,
        shutdown,
    )
    .await
}

/// Where a cluster node's calls go: catalog changes, documents of other nodes' partitions,
/// and the partition map (a single server: here, here, its own).
type ClusterRoutes = (
    CatalogRoute,
    Option<Forwarder>,
    Option<Arc<dyn Owners>>,
    Option<Arc<ClusterMetrics>>,
);

/// [`serve`], with catalog changes going `catalog`'s way (a cluster's catalog log).
async fn serve_routed(
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    current: CurrentEngine,
    (storage, (catalog, forwarder, owners, cluster_metrics)): (StorageConfig, ClusterRoutes),
    auth: Authenticator,
    network: Network,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Network {
        tls,
        limits,
        reflection,
    } = network;
    // Shared by every connection; the response budget also by the query results that
    // streaming responses stream from.
    let budgets = Budgets::new(&limits);
    let (health, health_service) = tonic_health::server::health_reporter();
    // Open to callers without a key: their messages are small, and so is what they may send.
    let health_service = health_service.max_decoding_message_size(OPEN_MESSAGE_BYTES);
    set_health(&health, tonic_health::ServingStatus::Serving).await;

    // Storage that can no longer make writes durable turns the server NOT_SERVING, so load
    // balancers and orchestrators move traffic away; reads keep being served meanwhile, and
    // the storage is reopened once it takes writes again. The task owns the purge.
    let storage_watch = tokio::spawn(keep_storage_writable(
        current.clone(),
        (storage, forwarder.is_none()),
        (&limits).into(),
        health.clone(),
    ));

    // The services this server answers, by name: `mayfly.v1.Cluster` is in the descriptors,
    // and served by cluster nodes only.
    let in_cluster = forwarder.is_some();
    let descriptors = |reflection: &str| {
        let mut builder = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(mayfly_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("grpc.health.v1.Health")
            .with_service_name(reflection);
        for service in ["Databases", "Collections", "Documents", "Admin"] {
            builder = builder.with_service_name(format!("mayfly.v1.{service}"));
        }
        if in_cluster {
            builder = builder.with_service_name("mayfly.v1.Cluster");
        }
        builder
    };
    let (reflection_v1, reflection_v1alpha) = if reflection {
        (
            Some(
                descriptors("grpc.reflection.v1.ServerReflection")
                    .build_v1()
                    .map_err(ServeError::Reflection)?
                    .max_decoding_message_size(OPEN_MESSAGE_BYTES),
            ),
            Some(
                descriptors("grpc.reflection.v1alpha.ServerReflection")
                    .build_v1alpha()
                    .map_err(ServeError::Reflection)?
                    .max_decoding_message_size(OPEN_MESSAGE_BYTES),
            ),
        )
    } else {
        (None, None)
    };

    let feed_streams = prometheus_client::metrics::gauge::Gauge::default();
    // The budgets the documents service enforces, which the metrics and ReadThroughput read.
    let provisioned = Arc::new(match &cluster_metrics {
        Some(partitions) => crate::throughput_limit::Provisioned::in_cluster(partitions.clone()),
        None => crate::throughput_limit::Provisioned::default(),
    });
    // Both listeners stop on the same signal.
    let (stop_metrics, metrics_stopped) = oneshot::channel::<()>();
    let metrics_task = metrics_listener.map(|listener| {
        tokio::spawn(metrics_http::serve(
            listener,
            metrics_http::registry(&current, &feed_streams, &provisioned, cluster_metrics),
            async {
                let _ = metrics_stopped.await;
            },
        ))
    });

    let mut documents = DocumentsService::new(current.clone(), auth.clone())
        .with_budget(budgets.responses.clone())
        .counting_feed_streams(feed_streams)
        .with_provisioned(provisioned.clone());
    if let Some(forwarder) = forwarder {
        documents = documents.forwarding(forwarder, catalog.clone());
    }
    // Streams and queries still running stop with the server, not after it.
    let stop_streams = documents.stop_signal();
    let shutdown = async move {
        shutdown.await;
        stop_streams.shut_down();
    };
    let mut routes = Routes::new(health_service);
    if let Some(reflection) = reflection_v1 {
        routes = routes.add_service(reflection);
    }
    if let Some(reflection) = reflection_v1alpha {
        routes = routes.add_service(reflection);
    }
    // Node to node: served by cluster nodes only.
    if documents.in_cluster() {
        routes = routes.add_service(
            ClusterServer::new(ClusterService::new(documents.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        );
    }
    let routes = routes
        // Every keyed service takes messages up to the limit the request layer refuses past
        // (with a reason), so that tonic's own refusal (OUT_OF_RANGE, no reason) never comes
        // first.
        .add_service(
            DatabasesServer::new(
                DatabasesService::new(current.clone(), auth.clone())
                    .with_catalog(catalog.clone())
                    .with_provisioned(provisioned),
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            CollectionsServer::new(
                CollectionsService::new(current.clone(), auth.clone()).with_catalog(catalog),
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            AdminServer::new(match owners {
                Some(owners) => AdminService::new(current.clone(), auth.clone()).in_cluster(owners),
                None => AdminService::new(current.clone(), auth.clone()),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            DocumentsServer::new(documents)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .prepare();
    let service = RequestLimitsLayer::new(&limits, &budgets, auth.clone()).layer(routes);
    net::serve(
        service,
        net::incoming(listener, tls, &limits, &budgets),
        &limits,
        shutdown,
    )
    .await;

    storage_watch.abort();
    let _ = stop_metrics.send(());
    if let Some(task) = metrics_task {
        match task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "metrics endpoint failed"),
            Err(e) => tracing::warn!(error = %e, "metrics endpoint task failed"),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}

/// How long a shutdown waits for the storage to be let go by background work.
const STORAGE_CLOSE_WAIT: Duration = Duration::from_secs(10);

/// How often the server checks whether storage can still make writes durable.
const STORAGE_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// First and longest pause between attempts to find failed storage healthy again and reopen it.
const REOPEN_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// Every Mayfly service and the server as a whole.
async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(
            <DatabasesServer<DatabasesService> as NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(
            <CollectionsServer<CollectionsService> as NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(
            <DocumentsServer<DocumentsService> as NamedService>::NAME,
            status,
        )
        .await;
    health.set_service_status("", status).await;
}

/// Runs the purge and the indexer of the engine in service and watches its storage. Once
/// storage fails, every service reports NOT_SERVING while reads go on; once the data directory
/// takes a durable write again, the engine is taken out of service, the storage closed and opened anew (recovery
/// from the journal decides every write whose outcome was unknown), and SERVING returns.
async fn keep_storage_writable(
    current: CurrentEngine,
    (storage, reopen): (StorageConfig, bool),
    settings: EngineSettings,
    health: HealthReporter,
) {
    let Ok(mut engine) = current.get() else {
        return;
    };
    loop {
        let purge = engine.spawn_purge();
        let indexer = engine.spawn_indexer();
        let retention = engine.spawn_feed_retention();
        let mut tick = tokio::time::interval(STORAGE_HEALTH_INTERVAL);
        let failure = loop {
            tick.tick().await;
            if let Some(failure) = engine.storage_failure() {
                break failure;
            }
        };
        if !reopen {
            // A cluster node's engine is shared with its partitions' tasks and publishes to
            // the logs: it is not swapped for a reopened one. The node gives its partitions
            // up (their leases lapse to the other nodes) and takes none again; restarted, it
            // rebuilds what its directory holds (docs/cluster.md, "A node's own copy").
            tracing::error!(error = %failure, "storage cannot make writes durable; this cluster node reports NOT_SERVING and gives its partitions up: restart it once the data directory takes writes again");
            set_health(&health, ServingStatus::NotServing).await;
            std::future::pending::<()>().await;
        }
        tracing::error!(error = %failure, "storage cannot make writes durable; reporting NOT_SERVING and serving reads until the data directory takes writes again");
        set_health(&health, ServingStatus::NotServing).await;

        let mut backoff = Backoff::new();
        loop {
            let probed = engine.clone();
            match tokio::task::spawn_blocking(move || probed.storage_reopen_ready()).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => backoff.note(&e.to_string()),
                Err(e) => backoff.note(&e.to_string()),
            }
            backoff.wait().await;
        }

        tracing::warn!("the data directory takes durable writes again; reopening it");
        drop(purge);
        drop(indexer);
        drop(retention);
        current.take();
        drop(engine);
        // Requests still running on the old engine hold its storage (and the directory's
        // locks) for a moment: opening is retried until they are done.
        let mut backoff = Backoff::new();
        engine = loop {
            match open_engine_blocking(&storage, settings, current.metrics().clone()).await {
                Ok(engine) => break engine,
                Err(e) => backoff.note(&e.to_string()),
            }
            backoff.wait().await;
        };
        current.put(engine.clone());
        set_health(&health, ServingStatus::Serving).await;
        tracing::info!("data directory reopened; serving writes again");
    }
}

/// Pauses between attempts, doubling up to a bound, logging each new reason once.
struct Backoff {
    pause: Duration,
    last: String,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            pause: REOPEN_BACKOFF.0,
            last: String::new(),
        }
    }

    fn note(&mut self, reason: &str) {
        if reason != self.last {
            tracing::warn!(reason, "storage not ready to reopen yet; retrying");
            reason.clone_into(&mut self.last);
        }
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(REOPEN_BACKOFF.1);
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus as Status, health_server::Health,
    };

    use super::*;
    use crate::{
        engine::{IdKind, ResourceId},
        storage::{DiskOptions, Durability},
    };

    /// Regression: a failed fsync left grpc.health reporting SERVING, and the server refused
    /// writes until a restart.
    #[tokio::test]
    async fn a_failed_fsync_turns_health_not_serving_until_storage_is_reopened() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = DiskOptions {
            path: dir.path().to_path_buf(),
            durability: Durability::Fsync,
            shards: Some(1),
            cache_bytes: 1 << 20,
            read_cache_bytes: 1 << 20,
            open_files: None,
        };
        let storage = Arc::new(DiskStorage::open(&options).expect("opens"));
        let engine = load_engine(storage.clone(), EngineConfig::new(1), Arc::default())
            .expect("loads an empty directory");
        let current = CurrentEngine::new(engine.clone());
        let health = HealthReporter::new();
        let service = tonic_health::server::HealthService::from_health_reporter(health.clone());
        set_health(&health, ServingStatus::Serving).await;
        let mut statuses = service
            .watch(tonic::Request::new(HealthCheckRequest {
                service: "mayfly.v1.Documents".to_owned(),
            }))
            .await
            .expect("known service")
            .into_inner();
        let mut next_status = async || {
            tokio::time::timeout(Duration::from_secs(10), statuses.next())
                .await
                .expect("a status change within 10 s")
                .expect("the watch goes on")
                .expect("a status")
                .status
        };
        assert_eq!(next_status().await, Status::Serving as i32);
        let watch = tokio::spawn(keep_storage_writable(
            current.clone(),
            (StorageConfig::Disk(options), true),
            (&Limits::default()).into(),
            health,
        ));
        let database = |id: &str| ResourceId::parse(IdKind::Database, id).expect("valid");
        engine.create_database(database("kept")).expect("durable");

        storage.fail_next_sync();
        let failed = engine
            .create_database(database("unknown"))
            .expect_err("its fsync fails");
        assert!(matches!(failed, engine::Error::NotDurable(_)), "{failed}");
        let refused = engine
            .create_database(database("refused"))
            .expect_err("storage failed");
        assert!(
            refused.to_string().contains("cannot make writes durable"),
            "{refused}"
        );
        assert!(
            engine.get_database(&database("kept")).is_ok(),
            "reads go on"
        );
        assert_eq!(next_status().await, Status::NotServing as i32);
        // The directory is healthy: the server reopens it once the old storage is released.
        drop((storage, engine));
        assert_eq!(next_status().await, Status::Serving as i32);

        let reopened = current.get().expect("an engine in service");
        assert!(reopened.storage_failure().is_none());
        assert!(reopened.get_database(&database("kept")).is_ok());
        assert!(reopened.get_database(&database("refused")).is_err());
        reopened
            .create_database(database("after"))
            .expect("writes are durable again");
        watch.abort();
    }
}
