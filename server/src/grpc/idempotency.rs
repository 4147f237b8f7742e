//! Idempotency keys at the edge: a write request's `idempotency_key` becomes the engine's
//! [`RequestKey`], with a digest of the rest of the request, and a replayed answer is marked
//! in the response's metadata. The engine remembers keys (see its `idempotency` module).

use prost::Message;
use sha2::{Digest, Sha256};
use tonic::{Response, Status, metadata::AsciiMetadataValue};

use super::status::to_status;
use crate::engine::{Answered, IdKind, RequestKey, ResourceId};

/// Response header of a keyed write: `true` if the answer is the replay of the first one
/// (nothing was applied now), `false` if the request was applied now.
pub(super) const REPLAYED_HEADER: &str = "mayfly-replayed";

/// The request key of a keyed write request: `key` (taken out of `request`, which must no
/// longer hold it) and a digest of the method and of the rest of the request, so that the
/// same key sent with another request is told apart. `None` without a key.
pub(super) fn request_key<M: Message>(
    method: &str,
    key: String,
    request: &M,
) -> Result<Option<RequestKey>, Status> {
    if key.is_empty() {
        return Ok(None);
    }
    let key = ResourceId::parse(IdKind::IdempotencyKey, &key).map_err(to_status)?;
    let mut digest = Sha256::new();
    digest.update(method.as_bytes());
    digest.update([0]);
    // prost encodes fields in number order and `Struct`s as ordered maps: the same request
    // always has the same bytes.
    digest.update(request.encode_to_vec());
    let digest = digest.finalize();
    let mut fingerprint = [0; 16];
    fingerprint.copy_from_slice(&digest[..16]);
    Ok(Some(RequestKey { key, fingerprint }))
}

/// `answer`'s value as a response, marked replayed or not if the request had a key.
pub(super) fn response<T, M>(
    keyed: bool,
    answer: Answered<T>,
    message: impl FnOnce(T) -> M,
) -> Response<M> {
    let mut response = Response::new(message(answer.value));
    if keyed {
        let value = if answer.replayed { "true" } else { "false" };
        response
            .metadata_mut()
            .insert(REPLAYED_HEADER, AsciiMetadataValue::from_static(value));
    }
    response
}
