//! Where records live. The engine keeps its own in-memory index and expiry bookkeeping and
//! hands every durable change to a backend through these traits: the embedded disk backend
//! (the default), the in-memory one (caches, tests), a distributed one later.

#[cfg(test)]
mod change_log_tests;
mod disk;
mod index_keys;
mod memory;

use std::{fmt, future::Future, pin::Pin, sync::Arc};

use bytes::Bytes;

pub use disk::{
    BUFFERED_SYNC_INTERVAL, DEFAULT_READ_CACHE_BYTES, DiskOptions, DiskStorage, Durability,
    FORMAT_VERSION, OpenError,
};
pub use index_keys::{TERMS_LAYOUT, prefix_end};
pub use memory::{DEFAULT_FEED_MEMORY_BYTES, MemoryStorage};

use crate::model::{
    CollectionInfo, CollectionUid, DatabaseId, DatabaseUid, DocumentId, DocumentTtl, Millis,
    PartitionKeyValue, Throughput,
};
pub use crate::model::{DocKey, StoredDocument};

/// Shards when none are asked for (and none are stored): one per available core.
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// An index term: a document path and the value there, encoded by the engine so that byte
/// order is query order. Opaque to storage, which keeps one entry per term and document.
pub type Term = Vec<u8>;

/// A change to a document's index entries, made with the change to the document.
#[derive(Debug, Clone, Copy)]
pub struct IndexUpdate<'a> {
    /// The terms stored for the document now (its terms record; empty if it has none).
    pub old: &'a [Term],
    /// Its terms from now on (empty: it has no entries and no terms record).
    pub new: &'a [Term],
}

/// One change to a shard's documents. Borrowed: the engine already holds every key, and a
/// purge batch should not allocate a copy of each one just to name it.
#[derive(Debug, Clone, Copy)]
pub enum DocumentWrite<'a> {
    /// Insert or overwrite; with `index`, replace its index entries and terms record too.
    /// `seq`: the position of the change log record describing it (0: none), kept with the
    /// document so that its next record can name it after a restart.
    Put {
        doc: &'a Arc<StoredDocument>,
        index: Option<IndexUpdate<'a>>,
        seq: u64,
    },
    /// A stored document's expiry has its change log record, at `seq`: after a restart it is
    /// expired (final) and its record is not logged again. Its other fields are the stored
    /// version's, unchanged.
    ExpiryLogged {
        collection: CollectionUid,
        key: &'a DocKey,
        version: u64,
        last_write: Millis,
        ttl: Option<DocumentTtl>,
        seq: u64,
    },
    /// Replace a stored document's index entries and terms record only (the background
    /// indexer's write): `version` is the document version the new terms were computed from.
    Index {
        collection: CollectionUid,
        key: &'a DocKey,
        version: u64,
        update: IndexUpdate<'a>,
    },
    /// Remove (absent is not an error), with the index entries of `terms` and its terms record.
    Delete {
        collection: CollectionUid,
        key: &'a DocKey,
        terms: &'a [Term],
    },
    /// Remember a request by its idempotency key: `key.id` is the key, in the partition the
    /// request wrote to (see the engine's `idempotency` module). Written in the batch of the
    /// write it applied.
    Remember {
        collection: CollectionUid,
        key: &'a DocKey,
        record: RequestRecord,
    },
    /// Forget a remembered request (absent is not an error).
    Forget {
        collection: CollectionUid,
        key: &'a DocKey,
    },
    /// Append a record to a collection's change log in this shard at position `seq`, above
    /// every position the shard has appended at (see `docs/changefeed.md`). The engine encodes
    /// the record; storage keeps its bytes, in the batch of the change it describes.
    Append {
        collection: CollectionUid,
        seq: u64,
        record: &'a LogRecord,
    },
}

/// A change log record's bytes, in two parts: what the engine encoded, then the body of the
/// version it wrote (empty for none). The record is `head` then `body`; they are kept apart so
/// that a backend holding documents in memory shares the body with the document instead of
/// holding a second copy of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogRecord {
    pub head: Bytes,
    pub body: Bytes,
}

impl LogRecord {
    /// A record given whole.
    pub fn whole(bytes: impl Into<Bytes>) -> Self {
        LogRecord {
            head: bytes.into(),
            body: Bytes::new(),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes in one piece (a copy unless one part is empty).
    pub fn to_bytes(&self) -> Bytes {
        if self.body.is_empty() {
            return self.head.clone();
        }
        if self.head.is_empty() {
            return self.body.clone();
        }
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&self.body);
        out.into()
    }
}

/// What storage keeps of a request remembered by its idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// A digest of the request without its key.
    pub fingerprint: [u8; 16],
    /// When the write it applied was made (Unix epoch ms).
    pub applied_at: Millis,
    /// When the key is forgotten (Unix epoch ms).
    pub forget_at: Millis,
}

/// The terms recorded for a document: what its index entries are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTerms {
    /// The document version they were computed from.
    pub version: u64,
    /// Sorted, without duplicates.
    pub terms: Vec<Term>,
}

/// One index entry: a term and the document it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub term: Term,
    pub key: DocKey,
}

/// Which index entries a scan visits: those whose `term | document key` bytes lie between
/// `low` and `high` (the engine passes bounds that select whole terms or term prefixes),
/// ascending or descending, after `after` if given (in the scan's direction).
#[derive(Debug, Clone, Copy)]
pub struct IndexRange<'a> {
    pub low: &'a [u8],
    /// Exclusive; `None`: up to the end of the collection's entries.
    pub high: Option<&'a [u8]>,
    pub descending: bool,
    pub after: Option<&'a IndexEntry>,
}

/// Which documents a scan visits, in key order.
#[derive(Debug, Clone, Copy)]
pub enum ScanRange<'a> {
    /// A whole collection, after `after` if given.
    Collection { after: Option<&'a DocKey> },
    /// One partition, after id `after` if given.
    Partition {
        partition_key: &'a PartitionKeyValue,
        after: Option<&'a DocumentId>,
    },
}

/// One atomic write to a shard's documents.
#[derive(Debug, Clone, Copy)]
pub struct WriteBatch<'a> {
    /// The changes, applied all or none.
    pub writes: &'a [DocumentWrite<'a>],
    /// Every version the engine has handed out is below this. A backend that forgets deleted
    /// documents keeps it, so that versions (etags) are never reused after a restart.
    pub versions_below: u64,
    /// Versions were handed out for documents this batch does not store (a transactional
    /// batch created and deleted them): `versions_below` must be kept even if nothing is
    /// deleted.
    pub keep_floor: bool,
    /// The batch applies an owner's commit from its partition's log (cluster mode): storage
    /// that replicates commits does not send it again.
    pub replicated: bool,
}

/// What a backend keeps of a document in memory at start: everything but the body.
#[derive(Debug, Clone)]
pub struct StoredMeta {
    /// Collection the document belongs to.
    pub collection: CollectionUid,
    /// Its address.
    pub key: DocKey,
    /// Last write, Unix epoch ms: with `ttl`, the absolute expiry instant.
    pub last_write: Millis,
    /// Version of the last write.
    pub version: u64,
    /// The document's own TTL (`None` = inherits).
    pub ttl: Option<DocumentTtl>,
    /// The position of its latest change log record (0: none).
    pub seq: u64,
    /// Its expiry has been logged (see [`DocumentWrite::ExpiryLogged`]): it is expired.
    pub expiry_logged: bool,
}

impl StoredMeta {
    /// What a backend that holds whole documents hands recovery of `doc`.
    pub fn of(doc: &StoredDocument) -> Self {
        StoredMeta {
            collection: doc.collection,
            key: doc.key.clone(),
            last_write: doc.last_write,
            version: doc.version,
            ttl: doc.ttl,
            seq: 0,
            expiry_logged: false,
        }
    }
}

/// The catalog as a backend recovered it.
#[derive(Debug, Clone, Default)]
pub struct StoredCatalog {
    /// Every database.
    pub databases: StoredDatabases,
    /// Every collection.
    pub collections: Vec<CollectionInfo>,
    /// Highest uid ever handed out, of a collection or a database (uids are never reused).
    pub last_uid: u64,
    /// Every document version handed out before is below this.
    pub versions_below: u64,
    /// The throughput each database that shares one shares among its collections (from a
    /// backend that keeps it: see [`Storage::put_database`]).
    pub database_throughputs: Vec<(DatabaseId, Throughput)>,
}

/// The databases a backend recovered, each with the uid it was created with; `None` from a
/// backend that keeps no uids (see [`Storage::put_database`]): the engine gives such a
/// database a new uid each time it loads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredDatabases(pub Vec<(DatabaseId, Option<DatabaseUid>)>);

impl StoredDatabases {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Databases without their uids, from a backend that keeps none.
impl FromIterator<DatabaseId> for StoredDatabases {
    fn from_iter<I: IntoIterator<Item = DatabaseId>>(ids: I) -> Self {
        StoredDatabases(ids.into_iter().map(|id| (id, None)).collect())
    }
}

impl FromIterator<(DatabaseId, DatabaseUid)> for StoredDatabases {
    fn from_iter<I: IntoIterator<Item = (DatabaseId, DatabaseUid)>>(databases: I) -> Self {
        StoredDatabases(
            databases
                .into_iter()
                .map(|(id, uid)| (id, Some(uid)))
                .collect(),
        )
    }
}

impl IntoIterator for StoredDatabases {
    type Item = (DatabaseId, Option<DatabaseUid>);
    type IntoIter = std::vec::IntoIter<Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Resolves when the writes it was created after are durable.
pub type DurableFuture = Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>>;

/// A position in a backend's log of applied writes. Every write returns the position it was
/// applied at; once a position is durable, every write at or before it is. Positions are
/// ordered across the whole backend (every shard, and the catalog).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Before any write: always durable.
    pub const ZERO: Lsn = Lsn(0);
}

/// Some of a backend's shards, for a durability wait that concerns only their writes (see
/// [`Storage::durable_in`]). Shard `i` is bit `i % 64`: a set stands for every shard congruent
/// to a member, so it may name more shards than asked, never fewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardSet(u64);

impl ShardSet {
    /// Every shard: the wait for a result that may reflect any of them.
    pub const ALL: ShardSet = ShardSet(u64::MAX);

    /// No shard: a result that reflects no document state.
    pub const NONE: ShardSet = ShardSet(0);

    /// Shard `index` (and those congruent to it).
    pub fn one(index: usize) -> Self {
        ShardSet(1 << (index % 64))
    }

    /// The shards of either set.
    pub fn union(self, other: ShardSet) -> Self {
        ShardSet(self.0 | other.0)
    }

    /// Whether the set stands for shard `index`.
    pub fn contains(self, index: usize) -> bool {
        self.0 & (1 << (index % 64)) != 0
    }
}

#[cfg(test)]
#[test]
fn a_shard_set_names_its_shards_and_their_kin_never_fewer() {
    let set = ShardSet::one(3).union(ShardSet::one(70));
    assert!(set.contains(3) && set.contains(70) && set.contains(6) && set.contains(67));
    assert!(!set.contains(4) && !set.contains(0));
    assert!((0..200).all(|i| ShardSet::ALL.contains(i) && !ShardSet::NONE.contains(i)));
}

/// A change to databases and collections.
#[derive(Debug, Clone, Copy)]
pub enum CatalogChange<'a> {
    /// A database was created (without its uid: the engine records databases with
    /// [`Storage::put_database`]).
    PutDatabase(&'a DatabaseId),
    /// A database was deleted with all of its collections, in one atomic change.
    /// `versions_below` bounds every document version handed out so far: the versions of the
    /// documents deleted with it must not be handed out again after a restart.
    DeleteDatabase {
        database: &'a DatabaseId,
        collections: &'a [Arc<CollectionInfo>],
        versions_below: u64,
    },
    /// A collection was created or its settings replaced.
    PutCollection(&'a CollectionInfo),
    /// A collection was deleted.
    DeleteCollection {
        info: &'a CollectionInfo,
        versions_below: u64,
    },
}

/// A backend failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError {
    message: String,
    kind: StorageErrorKind,
}

/// What kind of failure a [`StorageError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageErrorKind {
    /// A fault in storage or in what it holds (corruption, a bug).
    Failed,
    /// Storage cannot make writes durable now (an fsync failed, the disk is full, it is
    /// closed); a client may retry later, on this server or after its restart.
    Unavailable,
    /// The storage engine failed partway through a write, which may or may not survive a
    /// restart; storage refuses writes from then on (it has failed).
    OutcomeUnknown,
}

impl StorageError {
    /// A fault, with a message for the operator.
    pub fn new(message: impl Into<String>) -> Self {
        StorageError {
            message: message.into(),
            kind: StorageErrorKind::Failed,
        }
    }

    /// Storage cannot make writes durable now, with a message for the operator.
    pub fn unavailable(message: impl Into<String>) -> Self {
        StorageError {
            message: message.into(),
            kind: StorageErrorKind::Unavailable,
        }
    }

    /// A write that may or may not have been applied, with a message for the operator.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        StorageError {
            message: message.into(),
            kind: StorageErrorKind::OutcomeUnknown,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StorageError {}

/// A storage backend.
pub trait Storage: Send + Sync + fmt::Debug {
    /// The document store for engine shard `index`. The engine calls it while holding that
    /// shard's lock, so a backend needs no locking of its own for documents of one shard.
    fn shard(&self, index: usize) -> Arc<dyn ShardStore>;

    /// Applies a catalog change atomically and returns its position; it is durable once
    /// [`Storage::durable`] says so for that position. Never blocks on the disk.
    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError>;

    /// Records that database `database` was created with `uid`, as [`Storage::write_catalog`]
    /// records other changes; its uid comes back from [`Storage::load_catalog`], and is
    /// counted in [`StoredCatalog::last_uid`], with the `throughput` its collections share
    /// ([`StoredCatalog::database_throughputs`]); called again for the same database and uid,
    /// it replaces the throughput. A backend that keeps no uids leaves the default,
    /// [`CatalogChange::PutDatabase`] without uid or throughput; a backend wrapping another
    /// forwards it.
    fn put_database(
        &self,
        database: &DatabaseId,
        uid: DatabaseUid,
        throughput: Option<Throughput>,
    ) -> Result<Lsn, StorageError> {
        let _ = (uid, throughput);
        self.write_catalog(CatalogChange::PutDatabase(database))
    }

    /// The catalog as stored (empty for a new store).
    fn load_catalog(&self) -> Result<StoredCatalog, StorageError>;

    /// `None` if every write at or before `lsn` is durable (or the backend does not make
    /// anyone wait); otherwise a future that resolves once they are. Writers share the flush
    /// that makes them durable.
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture>;

    /// [`Storage::durable`] for a result that reflects writes of `shards` only (and catalog
    /// changes): a backend that makes each shard durable on its own log (cluster mode, which
    /// replicates each partition's commits through its own publish queue) waits for those
    /// shards' writes at or before `lsn`, so that one slow or failed shard holds back only its
    /// own results. A backend with one log for everything waits for it: the default.
    fn durable_in(&self, lsn: Lsn, shards: ShardSet) -> Option<DurableFuture> {
        let _ = shards;
        self.durable(lsn)
    }

    /// The position of the latest write applied.
    fn last_applied(&self) -> Lsn;

    /// Why writes can no longer be made durable, once that has happened (an fsync or a
    /// journal write failed): from then on every write is refused, and the server reports
    /// itself not serving until it reopens the storage (see [`Storage::reopen_ready`]).
    fn failure(&self) -> Option<StorageError>;

    /// Once storage has failed: whether its cause looks gone (the data directory takes a
    /// durable write again), so that reopening it is worth trying. Blocks on the disk.
    /// Storage that cannot tell says yes: reopening fails or fails again, and is retried.
    fn reopen_ready(&self) -> Result<(), StorageError> {
        Ok(())
    }

    /// Whether a read may wait on a disk or a network. A query on such storage gets a smaller
    /// inline attempt on the async worker (`engine::INLINE_READS_MAY_BLOCK` reads, against
    /// `engine::INLINE_READS`) before it runs on a blocking thread, where many wait at once.
    fn reads_may_block(&self) -> bool {
        true
    }

    /// How documents are spread over shards: fixed for the life of what the storage holds
    /// (a data directory's format decides it; see `engine::Placement`). No default: a storage
    /// that wraps another must pass its answer on.
    fn placement(&self) -> crate::engine::Placement;

    /// A value the node keeps beside its documents under `key` (cluster mode: how far the
    /// catalog and each partition's copy have applied their logs). `None`: never written, or
    /// kept nowhere (memory storage keeps nothing across a restart: the default).
    fn node_state(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        let _ = key;
        Ok(None)
    }

    /// Whether values written with [`Storage::put_node_state`] are kept across a restart
    /// (memory storage keeps none: the default).
    fn keeps_node_state(&self) -> bool {
        false
    }

    /// Writes `value` under `key` (see [`Storage::node_state`]). It lands after every write
    /// applied before it: a value that survives a crash finds those writes there too. Not
    /// waited for: durable with the next write that is.
    fn put_node_state(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        let _ = (key, value);
        Ok(())
    }
}

/// The documents of one engine shard.
///
/// The engine calls `write` under its shard lock, so writes to one shard never race; reads
/// (`get`, `scan`) and `drop_collection` come without it and may run alongside writes.
pub trait ShardStore: Send + Sync + fmt::Debug {
    /// Applies a batch atomically: all of it or, on error, none of it, and returns its
    /// position. Applied means visible to `get` and `scan`, and durable once
    /// [`Storage::durable`] says so for that position. Never blocks on the disk.
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError>;

    /// The same as [`Storage::durable`].
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture>;

    /// Calls `each` with every stored document of this shard, without its body.
    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError>;

    /// Calls `each` with every terms record of this shard.
    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError>;

    /// Calls `each` with every remembered request of this shard. A backend that keeps nothing
    /// across restarts has none.
    fn load_requests(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, RequestRecord),
    ) -> Result<(), StorageError> {
        let _ = each;
        Ok(())
    }

    /// A document's terms record, if it has one.
    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError>;

    /// Up to `limit` index entries of a collection in `range`, in its order.
    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError>;

    /// The stored version of a document, if any (expired or not: the engine decides).
    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError>;

    /// Up to `limit` documents of `range`, in key order.
    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError>;

    /// Removes every document, index entry, terms record and log record of a collection (one
    /// the engine no longer writes to).
    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError>;

    /// This shard's change log, for reads and retention (its records are appended by `write`).
    fn change_log(&self) -> &dyn ChangeLog;

    /// Removes everything this shard holds (documents, index, remembered requests, change log
    /// and its position), before the engine loads it: a cluster node's copy of a partition
    /// that does not match where it stands in the partition's log, rebuilt from the log. A
    /// backend that keeps nothing across a restart has nothing to remove.
    fn clear(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

/// A shard's change log outside the commit path: reading it from a position, and trimming it.
pub trait ChangeLog {
    /// Up to `limit` records of a collection's change log in this shard, at positions `from`
    /// and after, in order (a backend that keeps a record's body apart returns it apart, shared
    /// rather than copied).
    fn read_log(
        &self,
        collection: CollectionUid,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogRecord)>, StorageError>;

    /// The highest position this shard has appended a log record at, in any collection, even
    /// if the record has been trimmed since (0: none): positions are never reused.
    fn last_log_seq(&self) -> Result<u64, StorageError>;

    /// One past the highest position of the collection's records [`ChangeLog::trim_log`] has
    /// removed (0: none removed): a reader whose next position is below it missed records.
    fn log_floor(&self, collection: CollectionUid) -> Result<u64, StorageError>;

    /// Removes up to `limit` of a collection's log records below position `below`, oldest
    /// first, and returns how many it removed (retention: fewer than `limit` means done).
    fn trim_log(
        &self,
        collection: CollectionUid,
        below: u64,
        limit: usize,
    ) -> Result<usize, StorageError>;
}
