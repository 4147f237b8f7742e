//! The domain types the engine and storage share: ids, partition key values, TTLs,
//! collections and stored documents. They validate themselves and know nothing of locks,
//! shards, gRPC or disks; storage depends on this module, never on the engine.

mod collection;
mod document;
mod echo;
mod ids;
mod index_paths;
mod invalid;
mod must_live;
pub(crate) mod partition_key;
mod throughput;
pub(crate) mod ttl;

pub use collection::{
    CollectionInfo, CollectionSettings, CollectionUid, DatabaseUid, FeedRetention, IndexingMode,
    SettingsChange,
};
pub use document::{DocKey, StoredDocument};
pub use echo::{ECHO_CHARS, Echo};
pub use ids::{CollectionId, DatabaseId, DocumentId, IdKind, IdProblem, MAX_ID_CHARS, ResourceId};
pub use index_paths::{IndexPath, IndexPaths, MAX_INDEX_PATH_BYTES, MAX_INDEX_PATHS};
pub use invalid::InvalidInput;
pub use must_live::{
    MAX_MUST_LIVE_BYTES, MAX_MUST_LIVE_RULES, MAX_MUST_LIVE_VALUES, MustLive, MustLiveRule,
};
pub use partition_key::{MAX_PARTITION_KEY_BYTES, PartitionKeyPath, PartitionKeyValue};
pub use throughput::{
    MAX_THROUGHPUT, MIN_AUTOSCALE_MAX_THROUGHPUT, MIN_MANUAL_THROUGHPUT, Throughput,
};
pub use ttl::{DefaultTtl, DocumentTtl, ExpiredThrough, MAX_TTL_SECONDS, Rules, TtlSeconds};

/// Unix epoch milliseconds.
pub type Millis = u64;
