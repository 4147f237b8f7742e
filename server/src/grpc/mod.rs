//! The gRPC edge: request validation and proto ↔ domain conversion around the engine, with
//! one error → status mapping. It knows nothing of locks or shards.

mod admin;
mod batch;
pub mod catalog_change;
mod change_feed;
mod cluster_feed;
mod cluster_reads;
mod collections;
pub(crate) mod convert;
mod databases;
mod documents;
pub mod forward;
mod idempotency;
mod patch;
mod query;
mod relay;
mod request_charge;
mod status;
mod stream;
#[cfg(test)]
mod tests;
mod throughput;

pub use admin::AdminService;
pub use catalog_change::{CatalogAnswer, CatalogChange, CatalogRoute};
pub use cluster_reads::ClusterService;
pub use collections::CollectionsService;
pub use databases::DatabasesService;

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;

use tonic::{Request, Status};

use self::status::to_status;

use crate::{
    auth::{Authenticator, Principal, authenticate_headers},
    current_engine::CurrentEngine,
    engine::{self, Error},
    net::{Limits, ResponseBudget},
};

// `mayfly.v1.Documents` is served from several files (documents, batch, patch, query,
// stream), each adding to this service: its state lives here, above them.
/// Serves documents from the engine.
#[derive(Debug, Clone)]
pub struct DocumentsService {
    pub(super) engine: CurrentEngine,
    pub(super) auth: Authenticator,
    /// What streams reserve their pages in, and query results held between pages are
    /// charged to.
    pub(super) budget: ResponseBudget,
    /// Raised when the server shuts down: every stream's work stops.
    pub(super) stop: engine::Cancel,
    /// Query texts parsed before.
    pub(super) queries: Arc<engine::QueryCache>,
    /// Change feed streams open now (`mayfly_change_feed_streams`).
    pub(super) feed_streams: Gauge,
    /// Change feed pages computed on blocking threads at once (see [`blocking_pages`]).
    pub(super) blocking_pages: Arc<tokio::sync::Semaphore>,
    /// In a cluster: sends requests for other nodes' partitions on to them.
    pub(super) forwarder: Option<forward::Forwarder>,
    /// In a cluster, the catalog log: a request naming a collection not applied here yet
    /// waits for it (see [`catalog_change::CatalogRoute::caught_up`]).
    pub(super) catalog: catalog_change::CatalogRoute,
    /// The collections' and databases' provisioned throughput budgets.
    pub(super) limiter: Arc<crate::throughput_limit::Provisioned>,
}

/// How many change feed pages run on blocking threads at once: enough to keep the cores and
/// the disk busy. Without a bound, a thousand subscribers woken by one write each took a thread
/// of their own (300 threads), and the memory their pages had allocated stayed with each idle
/// thread's allocator heap: 1.5 GB of RSS for 256 MiB of budgeted pages.
pub(super) fn blocking_pages() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from) * 4
}

impl DocumentsService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        let limits = Limits::default();
        DocumentsService {
            engine,
            auth,
            budget: ResponseBudget::new(
                limits.response_budget_bytes,
                limits.response_budget_per_ip_bytes,
            ),
            stop: engine::Cancel::default(),
            queries: Arc::default(),
            feed_streams: Gauge::default(),
            blocking_pages: Arc::new(tokio::sync::Semaphore::new(blocking_pages())),
            forwarder: None,
            catalog: catalog_change::CatalogRoute::Local,
            limiter: Arc::default(),
        }
    }

    /// The service forwarding requests for partitions other nodes own (cluster mode), on a
    /// cluster whose catalog log is `catalog`.
    pub fn forwarding(
        mut self,
        forwarder: forward::Forwarder,
        catalog: catalog_change::CatalogRoute,
    ) -> Self {
        self.forwarder = Some(forwarder);
        self.catalog = catalog;
        self
    }

    /// The service enforcing (and recording usage in) `provisioned`'s budgets, which
    /// `ReadThroughput` and the metrics read too.
    pub(crate) fn with_provisioned(
        mut self,
        provisioned: Arc<crate::throughput_limit::Provisioned>,
    ) -> Self {
        self.limiter = provisioned;
        self
    }

    /// Whether it serves as a node of a cluster.
    pub fn in_cluster(&self) -> bool {
        self.forwarder.is_some()
    }

    /// The service counting its open change feed streams in `gauge`.
    pub fn counting_feed_streams(mut self, gauge: Gauge) -> Self {
        self.feed_streams = gauge;
        self
    }

    /// What stops every stream's work when the server shuts down (see [`engine::Cancel`]).
    pub fn stop_signal(&self) -> engine::Cancel {
        self.stop.clone()
    }

    /// The service charging the results a query holds between its pages to `budget`, the
    /// one its responses are charged to.
    pub fn with_budget(mut self, budget: ResponseBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The engine in service.
    pub(super) fn engine(&self) -> Result<engine::Engine, Status> {
        self.engine.get().map_err(to_status)
    }
}

/// Who sent `request`: UNAUTHENTICATED unless its `authorization` metadata names a key or a
/// valid token (or the server runs without keys). The server's edge checks it before the
/// request message is read too (see [`authenticate_headers`]).
fn caller<T>(auth: &Authenticator, request: &Request<T>) -> Result<Principal, Status> {
    // Again, though the edge checked before the message arrived: a key regenerated meanwhile
    // must not serve a call whose message came after.
    Ok(authenticate_headers(auth, request.metadata().as_ref())?)
}

/// Runs catalog changes off the async worker threads: each waits for its change to be durable,
/// and deleting a collection frees every document.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(to_status),
        Err(e) => Err(Status::internal(format!("catalog task failed: {e}"))),
    }
}
