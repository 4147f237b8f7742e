//! The gRPC edge: request validation and proto ↔ domain conversion around the engine, with
//! one error → status mapping. It knows nothing of locks or shards.

mod collections;
mod convert;
mod databases;
mod documents;
mod query;
mod status;

pub use collections::CollectionsService;
pub use databases::DatabasesService;
pub use documents::DocumentsService;

use tonic::Status;

use crate::engine::Error;

/// Runs catalog changes off the async worker threads: each waits for its change to be durable,
/// and deleting a collection frees every document.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(Status::from),
        Err(e) => Err(Status::internal(format!("catalog task failed: {e}"))),
    }
}
