//! Documents as storage holds them.

use bytes::Bytes;

use super::{
    Millis, collection::CollectionUid, ids::DocumentId, partition_key::PartitionKeyValue,
    ttl::DocumentTtl,
};

/// A document's address within its collection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocKey {
    /// The partition key value.
    pub partition_key: PartitionKeyValue,
    /// The id, unique within the partition.
    pub id: DocumentId,
}

/// Everything stored for one document version: enough to rebuild the engine's index and
/// expiry state from storage.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDocument {
    /// Collection the document belongs to.
    pub collection: CollectionUid,
    /// Its address.
    pub key: DocKey,
    /// The body, as the `google.protobuf.Struct` encoding of the JSON object.
    pub body: Bytes,
    /// Last write, Unix epoch ms.
    pub last_write: Millis,
    /// Version, unique per write; the etag is derived from it.
    pub version: u64,
    /// The document's own TTL (`None` = inherits).
    pub ttl: Option<DocumentTtl>,
}
