//! Assembles the gRPC server: the engine and its purge, the three Mayfly services, health,
//! reflection (v1 and v1alpha, for grpcurl 1.8) and the optional metrics endpoint.

use std::{fmt, future::Future, io, net::SocketAddr, sync::Arc, thread, time::Duration};

use mayfly_proto::v1::server::{CollectionsServer, DatabasesServer, DocumentsServer};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::transport::{Server, server::TcpIncoming};

use crate::{
    engine::{self, Engine, EngineConfig, SystemClock},
    grpc::{CollectionsService, DatabasesService, DocumentsService},
    metrics_http,
    storage::{DiskOptions, DiskStorage, MemoryStorage, OpenError, Storage},
};

/// Largest request or response message: a 2 MiB JSON document can take several times that
/// as a protobuf Struct (every array element carries tags), and must reach the size check.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How to run a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where documents live.
    pub storage: StorageConfig,
    /// Address for `GET /metrics`; `None` serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
}

/// Where a server keeps its documents.
#[derive(Debug, Clone)]
pub enum StorageConfig {
    /// In memory only: nothing survives a restart. `shards` defaults to one per core.
    Memory { shards: Option<usize> },
    /// In a data directory (the directory's shard count applies; see [`DiskOptions`]).
    Disk(DiskOptions),
}

impl Default for Config {
    /// Loopback on a free port, in memory, one shard per core, no metrics: what tests and
    /// examples want.
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            storage: StorageConfig::Memory { shards: None },
            metrics_listen: None,
        }
    }
}

/// One shard per available core.
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Why a server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// Binding or serving a socket failed.
    Io(io::Error),
    /// The gRPC transport failed.
    Transport(tonic::transport::Error),
    /// The reflection service could not load the descriptors.
    Reflection(tonic_reflection::server::Error),
    /// The data directory could not be opened.
    Storage(OpenError),
    /// What the data directory holds could not be loaded.
    Recovery(engine::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Io(e) => write!(f, "{e}"),
            ServeError::Transport(e) => write!(f, "gRPC transport: {e}"),
            ServeError::Reflection(e) => write!(f, "reflection descriptors: {e}"),
            ServeError::Storage(e) => write!(f, "{e}"),
            ServeError::Recovery(e) => write!(f, "cannot load the data directory: {e}"),
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
    engine: Engine,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl RunningServer {
    /// Binds the listeners, then serves in a background task. Clients may connect as soon as
    /// this returns.
    pub async fn start(config: Config) -> Result<Self, ServeError> {
        let listener = TcpListener::bind(config.listen).await?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let storage = config.storage.clone();
        let engine = tokio::task::spawn_blocking(move || open_engine(&storage))
            .await
            .map_err(|e| ServeError::Io(io::Error::other(e)))??;
        let local_addr = listener.local_addr()?;
        let metrics_addr = metrics_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, metrics_listener, engine.clone(), async {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        }));
        Ok(RunningServer {
            local_addr,
            metrics_addr,
            engine,
            stop: Some(stop),
            task,
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

    /// The engine behind the server.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Stops accepting requests, lets in-flight ones finish, and waits for the server to end.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(ServeError::Io(io::Error::other(e))),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Opens the storage and loads what it holds, then rebuilds expiry tracking on a thread of its
/// own: the engine serves correctly while it runs.
fn open_engine(storage: &StorageConfig) -> Result<Engine, ServeError> {
    let (storage, shards): (Arc<dyn Storage>, usize) = match storage {
        StorageConfig::Memory { shards } => (
            Arc::new(MemoryStorage::new()),
            shards.unwrap_or_else(default_shards),
        ),
        StorageConfig::Disk(options) => {
            let disk = DiskStorage::open(options).map_err(ServeError::Storage)?;
            let shards = disk.shard_count();
            (Arc::new(disk), shards)
        }
    };
    let (engine, recovery) = Engine::open(EngineConfig { shards }, storage, Arc::new(SystemClock))
        .map_err(ServeError::Recovery)?;
    if recovery.documents > 0 || recovery.collections > 0 {
        tracing::info!(
            databases = recovery.databases,
            collections = recovery.collections,
            documents = recovery.documents,
            ms = recovery.elapsed.as_millis() as u64,
            "recovered"
        );
    }
    let background = engine.clone();
    thread::Builder::new()
        .name("mayfly-recovery".into())
        .spawn(move || {
            let rebuild = background.rebuild_expiry();
            if rebuild.entries() > 0 {
                let secs = rebuild.elapsed.as_secs_f64().max(1e-9);
                tracing::info!(
                    timers = rebuild.timers,
                    queued = rebuild.queued,
                    past_due = rebuild.past_due,
                    ms = rebuild.elapsed.as_millis() as u64,
                    entries_per_sec = (rebuild.entries() as f64 / secs) as u64,
                    "expiry tracking rebuilt"
                );
            }
            if !recovery.unfinished_deletions.is_empty() {
                match background.free_collections(&recovery.unfinished_deletions) {
                    Ok(()) => tracing::info!(
                        collections = recovery.unfinished_deletions.len(),
                        "finished freeing collections deleted before a crash"
                    ),
                    Err(e) => tracing::warn!(error = %e, "could not free collections deleted before a crash"),
                }
            }
        })
        .map_err(ServeError::Io)?;
    Ok(engine)
}

/// Serves `engine` on `listener` until `shutdown` completes, then drains in-flight requests.
pub async fn serve(
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let _purge = engine.spawn_purge();

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<DatabasesServer<DatabasesService>>()
        .await;
    health
        .set_serving::<CollectionsServer<CollectionsService>>()
        .await;
    health
        .set_serving::<DocumentsServer<DocumentsService>>()
        .await;

    // Storage that can no longer make writes durable turns the server NOT_SERVING, so load
    // balancers and orchestrators move traffic away; reads keep being served meanwhile.
    let storage_watch = tokio::spawn(report_storage_health(engine.clone(), health.clone()));

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(mayfly_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().map_err(ServeError::Reflection)?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(ServeError::Reflection)?;

    // Both listeners stop on the same signal.
    let (stop_metrics, metrics_stopped) = oneshot::channel::<()>();
    let metrics_task = metrics_listener.map(|listener| {
        tokio::spawn(metrics_http::serve(
            listener,
            metrics_http::registry(&engine),
            async {
                let _ = metrics_stopped.await;
            },
        ))
    });

    let result = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(DatabasesServer::new(DatabasesService::new(engine.clone())))
        .add_service(CollectionsServer::new(CollectionsService::new(
            engine.clone(),
        )))
        .add_service(
            DocumentsServer::new(DocumentsService::new(engine.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        // Small request/response exchanges must not wait on Nagle's algorithm.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .map_err(ServeError::Transport);

    storage_watch.abort();
    let _ = stop_metrics.send(());
    if let Some(task) = metrics_task {
        match task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "metrics endpoint failed"),
            Err(e) => tracing::warn!(error = %e, "metrics endpoint task failed"),
            Ok(Ok(())) => {}
        }
    }
    result
}

/// How often the server checks whether storage can still make writes durable.
const STORAGE_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// Sets every Mayfly service and the server as a whole NOT_SERVING once storage reports a
/// failure (which lasts until a restart).
async fn report_storage_health(engine: Engine, health: tonic_health::server::HealthReporter) {
    let mut tick = tokio::time::interval(STORAGE_HEALTH_INTERVAL);
    loop {
        tick.tick().await;
        if let Some(failure) = engine.storage_failure() {
            tracing::error!(error = %failure, "storage cannot make writes durable; reporting NOT_SERVING");
            health
                .set_not_serving::<DatabasesServer<DatabasesService>>()
                .await;
            health
                .set_not_serving::<CollectionsServer<CollectionsService>>()
                .await;
            health
                .set_not_serving::<DocumentsServer<DocumentsService>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_server::Health,
    };

    use super::*;
    use crate::storage::{DiskOptions, Durability};

    /// Regression: a failed fsync left grpc.health reporting SERVING.
    #[tokio::test]
    async fn a_failed_fsync_turns_health_not_serving() {
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = Arc::new(
            DiskStorage::open(&DiskOptions {
                path: dir.path().to_path_buf(),
                durability: Durability::Fsync,
                shards: Some(1),
                cache_bytes: 1 << 20,
            })
            .expect("opens"),
        );
        let engine = Engine::new(
            EngineConfig { shards: 1 },
            storage.clone(),
            Arc::new(SystemClock),
        );
        let health = tonic_health::server::HealthReporter::new();
        let service = tonic_health::server::HealthService::from_health_reporter(health.clone());
        health
            .set_serving::<DocumentsServer<DocumentsService>>()
            .await;
        let service = Arc::new(service);
        let watch = tokio::spawn(report_storage_health(engine.clone(), health));
        let status = |name: &str| {
            let service = service.clone();
            let request = tonic::Request::new(HealthCheckRequest {
                service: name.to_owned(),
            });
            async move {
                service
                    .check(request)
                    .await
                    .expect("known service")
                    .into_inner()
                    .status
            }
        };
        assert_eq!(
            status("mayfly.v1.Documents").await,
            ServingStatus::Serving as i32
        );

        storage.fail_next_sync();
        let lsn = engine
            .create_database(
                crate::engine::ResourceId::parse(crate::engine::IdKind::Database, "db")
                    .expect("valid"),
            )
            .expect_err("its fsync fails");
        assert!(matches!(lsn, engine::Error::NotDurable(_)), "{lsn}");
        watch.await.expect("the watch ends once it has reported");
        assert_eq!(
            status("mayfly.v1.Documents").await,
            ServingStatus::NotServing as i32
        );
        assert_eq!(status("").await, ServingStatus::NotServing as i32);
    }
}
