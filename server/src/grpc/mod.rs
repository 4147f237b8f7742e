//! The gRPC edge: request validation and proto ↔ domain conversion around the engine, with
//! one error → status mapping. It knows nothing of locks or shards.

mod admin;
mod batch;
mod collections;
pub(crate) mod convert;
mod databases;
mod documents;
mod patch;
mod query;
mod status;
mod stream;
#[cfg(test)]
mod tests;

pub use admin::AdminService;
pub use collections::CollectionsService;
pub use databases::DatabasesService;
pub use documents::DocumentsService;

use tonic::{Request, Status};

use self::status::to_status;

use crate::{
    auth::{Authenticator, Principal, authenticate_headers},
    engine::Error,
};

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
