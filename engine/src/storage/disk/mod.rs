//! The embedded disk backend, on fjall (a log-structured merge tree in pure Rust).
//!
//! Seven keyspaces share one journal, so a batch across them is atomic: `documents` (key →
//! header and body), `meta` (key → header only: what recovery reads, a few dozen bytes per
//! document whatever the body size), `terms` (key → the document's index terms), `index`
//! (one entry per term and document, see [`super::index_keys`]), `requests` (requests
//! remembered by idempotency key, written with the writes they applied), `log` (each
//! collection's change log: `shard | collection uid | position` → record) and `catalog`. Every write goes to the journal; the group
//! commit (see [`group_commit`]) makes it durable with an fsync shared by concurrent writers,
//! or, with `Durability::Buffered`, each write reaches the OS at once and survives a crash of
//! the process, with an fsync every 100 ms for the machine.

mod catalog;
mod codec;
mod data_dir;
mod group_commit;
mod key_ordered_batch;
mod read_cache;

use std::{
    fmt, io,
    ops::Bound,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

pub use data_dir::FORMAT_VERSION;
pub use group_commit::{BUFFERED_SYNC_INTERVAL, Durability};

use self::{
    codec::Header,
    data_dir::DataDir,
    group_commit::GroupCommit,
    key_ordered_batch::KeyOrderedBatch,
    read_cache::{Changed, MAX_CACHED_ENTRIES, ReadCache, ShardCache, Written},
};
use super::{
    CatalogChange, ChangeLog, DocKey, DocumentWrite, DurableFuture, IndexEntry, IndexRange,
    IndexUpdate, LogRecord, Lsn, RequestRecord, ScanRange, ShardStore, Storage, StorageError,
    StoredCatalog, StoredDocument, StoredMeta, StoredTerms, Term, WriteBatch, index_keys,
};
use crate::model::{CollectionUid, DatabaseId, DatabaseUid, Throughput};

/// Keys deleted per batch when a collection's documents are freed.
const DROP_BATCH: usize = 4096;

/// Journal kept before fjall flushes the memtables it holds (its default is 512 MiB). After a
/// crash the journal is replayed into memtables, one skip-list insert per key, before anything
/// is served: with every property indexed a document is nine keys, and 512 MiB took 5–9 s to
/// replay here; 128 MiB bounds it near a second, and the smaller memtables cost writes nothing
/// measurable (README, "Durable storage").
const MAX_JOURNAL_BYTES: u64 = 128 << 20;

/// How to open a data directory.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// The data directory (created if missing).
    pub path: PathBuf,
    /// When writes are acknowledged.
    pub durability: Durability,
    /// Shards for a new directory; an existing one keeps its own, and must match if given.
    pub shards: Option<usize>,
    /// Block cache size in bytes.
    pub cache_bytes: u64,
    /// Documents and index entries kept decoded after a read, in bytes (0: none); see
    /// [`DEFAULT_READ_CACHE_BYTES`].
    pub read_cache_bytes: u64,
    /// Files kept open at most (`None`: the storage engine's default, 900): each is a
    /// descriptor that connections cannot have.
    pub open_files: Option<usize>,
}

/// Why a data directory could not be opened. Nothing in it was changed.
#[derive(Debug)]
pub enum OpenError {
    /// A filesystem operation failed.
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// Another process holds the directory.
    Locked { path: PathBuf },
    /// Written by a newer Mayfly.
    NewerFormat { path: PathBuf, found: u32 },
    /// Not empty and not a Mayfly data directory.
    NotMayfly { path: PathBuf },
    /// `--shards` disagrees with the directory.
    ShardMismatch {
        path: PathBuf,
        stored: usize,
        requested: usize,
    },
    /// The storage engine refused the directory.
    Engine { path: PathBuf, message: String },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io {
                path,
                action,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
            OpenError::Locked { path } => write!(
                f,
                "data directory {} is in use by another mayfly process (it holds {}/LOCK); stop that server or pass another --data-dir",
                path.display(),
                path.display()
            ),
            OpenError::NewerFormat { path, found } => write!(
                f,
                "data directory {} has data format {found}, written by a newer Mayfly; this build reads formats 1 to {FORMAT_VERSION}. Nothing was changed: open it with the newer mayfly",
                path.display()
            ),
            OpenError::NotMayfly { path } => write!(
                f,
                "{} is not empty and is not a Mayfly data directory (no valid FORMAT file); pass a new or empty directory as --data-dir",
                path.display()
            ),
            OpenError::ShardMismatch {
                path,
                stored,
                requested,
            } => write!(
                f,
                "data directory {} was created with {stored} shards but --shards {requested} was given; resharding is not supported: omit --shards",
                path.display()
            ),
            OpenError::Engine { path, message } => write!(
                f,
                "cannot open the storage engine in {}: {message}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for OpenError {}

fn storage_error(e: fjall::Error) -> StorageError {
    StorageError::new(format!("storage engine: {e}"))
}

/// Gives every database recorded before databases had uids (an empty record) a new one,
/// durably, in key order from `last_uid` up; returns the highest uid handed out. A directory
/// written since has none to give: this changes nothing there.
fn give_databases_uids(db: &Database, catalog: &Keyspace, last_uid: u64) -> fjall::Result<u64> {
    let mut last = last_uid;
    let mut batch = db.batch().durability(Some(PersistMode::SyncAll));
    for item in catalog.prefix(catalog::DATABASE_PREFIX) {
        let (key, value) = item.into_inner()?;
        if value.is_empty() {
            last += 1;
            batch.insert(
                catalog,
                key,
                catalog::encode_database(DatabaseUid(last), None),
            );
        }
    }
    if last != last_uid {
        batch.insert(catalog, catalog::LAST_UID, last.to_be_bytes());
        batch.commit()?;
    }
    Ok(last)
}

/// Documents and catalog in a data directory. Dropping it flushes and releases the directory.
pub struct DiskStorage {
    // Field order is drop order: the syncer stops before the database closes, the lock goes last.
    group: Arc<GroupCommit>,
    shards: Vec<Arc<DiskShard>>,
    catalog: Keyspace,
    db: Database,
    last_uid: AtomicU64,
    dir: DataDir,
}

impl fmt::Debug for DiskStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskStorage")
            .field("path", &self.dir.path())
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// The read cache's size unless one is asked for: enough for the hot documents of a small
/// service, a quarter of the default block cache.
pub const DEFAULT_READ_CACHE_BYTES: u64 = 64 * 1024 * 1024;

impl DiskStorage {
    /// Opens (or creates) a data directory, holding it until dropped.
    pub fn open(options: &DiskOptions) -> Result<Self, OpenError> {
        let dir = DataDir::open(&options.path)?;
        let engine = |e: fjall::Error| match e {
            fjall::Error::Locked => OpenError::Locked {
                path: options.path.clone(),
            },
            e => OpenError::Engine {
                path: options.path.clone(),
                message: e.to_string(),
            },
        };
        let mut builder = Database::builder(dir.db_path())
            .cache_size(options.cache_bytes)
            .max_journaling_size(MAX_JOURNAL_BYTES);
        if let Some(files) = options.open_files {
            // fjall panics below 10.
            builder = builder.max_cached_files(Some(files.max(16)));
        }
        let db = builder.open().map_err(engine)?;
        // What fjall recovered may have survived a crash of the process in the page cache
        // only: make it durable before anyone reads it.
        db.persist(PersistMode::SyncAll).map_err(engine)?;
        let keyspace = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default);
        let docs = keyspace("documents").map_err(engine)?;
        let meta = keyspace("meta").map_err(engine)?;
        let terms = keyspace("terms").map_err(engine)?;
        let index = keyspace("index").map_err(engine)?;
        let catalog = keyspace("catalog").map_err(engine)?;
        let requests = keyspace("requests").map_err(engine)?;
        let log = keyspace("log").map_err(engine)?;

        let stored = catalog.get(catalog::SHARDS).map_err(engine)?;
        let shard_count = match stored {
            Some(value) => {
                let stored =
                    catalog::decode_u64(&value, "shard count").map_err(|e| OpenError::Engine {
                        path: options.path.clone(),
                        message: e.to_string(),
                    })? as usize;
                if let Some(requested) = options.shards
                    && requested != stored
                {
                    return Err(OpenError::ShardMismatch {
                        path: options.path.clone(),
                        stored,
                        requested,
                    });
                }
                stored
            }
            None => {
                let shards = options
                    .shards
                    .unwrap_or_else(super::default_shards)
                    .clamp(1, usize::from(u16::MAX));
                let mut batch = db.batch().durability(Some(PersistMode::SyncAll));
                batch.insert(&catalog, catalog::SHARDS, (shards as u64).to_be_bytes());
                batch.commit().map_err(engine)?;
                shards
            }
        };
        let last_uid = match catalog.get(catalog::LAST_UID).map_err(engine)? {
            Some(value) => catalog::decode_u64(&value, "last collection uid").map_err(|e| {
                OpenError::Engine {
                    path: options.path.clone(),
                    message: e.to_string(),
                }
            })?,
            None => 0,
        };
        let last_uid = give_databases_uids(&db, &catalog, last_uid).map_err(engine)?;
        let group = Arc::new(
            GroupCommit::start(db.clone(), dir.db_path(), options.durability).map_err(
                |source| OpenError::Io {
                    path: options.path.clone(),
                    action: "start the fsync thread for",
                    source,
                },
            )?,
        );
        let cache = ReadCache::new(options.read_cache_bytes);
        let shards = (0..shard_count)
            .map(|i| {
                Arc::new(DiskShard {
                    cache: cache.clone().map(ShardCache::new),
                    index: i as u16,
                    db: db.clone(),
                    docs: docs.clone(),
                    meta: meta.clone(),
                    terms: terms.clone(),
                    entries: index.clone(),
                    requests: requests.clone(),
                    log: log.clone(),
                    catalog: catalog.clone(),
                    group: group.clone(),
                })
            })
            .collect();
        Ok(DiskStorage {
            group,
            shards,
            catalog,
            db,
            last_uid: AtomicU64::new(last_uid),
            dir,
        })
    }

    /// Shards the directory was created with.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Makes the next fsync fail, as a failing disk would.
    #[cfg(any(test, feature = "fault-injection"))]
    #[doc(hidden)]
    pub fn fail_next_sync(&self) {
        self.group.fail_next_sync();
    }

    /// Bytes the storage engine occupies on disk (tables and journals).
    pub fn disk_space(&self) -> u64 {
        self.db.disk_space().unwrap_or(0)
    }
}

impl Storage for DiskStorage {
    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        self.shards[index].clone()
    }

    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.group.check()?;
        // Made durable by the group commit like any write: an fsync here would hold fjall's
        // journal lock, and with it every writer, for its whole duration.
        let mut batch = self.db.batch().durability(self.group.batch_persist());
        let c = &self.catalog;
        match change {
            // Without its uid: one is given when the directory is next opened.
            CatalogChange::PutDatabase(id) => batch.insert(c, catalog::database_key(id), b""),
            CatalogChange::DeleteDatabase {
                database,
                collections,
                versions_below,
            } => {
                batch.remove(c, catalog::database_key(database));
                for info in collections {
                    batch.remove(c, catalog::collection_key(info.uid));
                }
                batch.insert(c, catalog::CATALOG_VERSIONS, versions_below.to_be_bytes());
            }
            CatalogChange::PutCollection(info) => {
                batch.insert(
                    c,
                    catalog::collection_key(info.uid),
                    catalog::encode_collection(info),
                );
                let last = self.last_uid.fetch_max(info.uid.0, Ordering::SeqCst);
                batch.insert(c, catalog::LAST_UID, last.max(info.uid.0).to_be_bytes());
            }
            CatalogChange::DeleteCollection {
                info,
                versions_below,
            } => {
                batch.remove(c, catalog::collection_key(info.uid));
                batch.insert(c, catalog::CATALOG_VERSIONS, versions_below.to_be_bytes());
            }
        }
        batch
            .commit()
            .map_err(|e| self.group.write_failed("a catalog change", &e))?;
        Ok(self.group.applied())
    }

    fn put_database(
        &self,
        database: &DatabaseId,
        uid: DatabaseUid,
        throughput: Option<Throughput>,
    ) -> Result<Lsn, StorageError> {
        self.group.check()?;
        let mut batch = self.db.batch().durability(self.group.batch_persist());
        let c = &self.catalog;
        batch.insert(
            c,
            catalog::database_key(database),
            catalog::encode_database(uid, throughput),
        );
        let last = self.last_uid.fetch_max(uid.0, Ordering::SeqCst);
        batch.insert(c, catalog::LAST_UID, last.max(uid.0).to_be_bytes());
        batch
            .commit()
            .map_err(|e| self.group.write_failed("a catalog change", &e))?;
        Ok(self.group.applied())
    }

    fn node_state(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        Ok(self
            .catalog
            .get(catalog::node_state_key(key))
            .map_err(storage_error)?
            .map(|v| Bytes::copy_from_slice(&v)))
    }

    fn keeps_node_state(&self) -> bool {
        true
    }

    fn put_node_state(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        self.group.check()?;
        // Journaled after every write before it, so it never survives one of them.
        let mut batch = self.db.batch().durability(self.group.batch_persist());
        batch.insert(&self.catalog, catalog::node_state_key(key), value);
        batch
            .commit()
            .map_err(|e| self.group.write_failed("the node's state", &e))?;
        self.group.applied();
        Ok(())
    }

    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        let mut out = StoredCatalog {
            last_uid: self.last_uid.load(Ordering::SeqCst),
            ..StoredCatalog::default()
        };
        for item in self.catalog.prefix(catalog::DATABASE_PREFIX) {
            let (key, value) = item.into_inner().map_err(storage_error)?;
            let (id, uid, throughput) = catalog::decode_database(&key, &value)?;
            if let Some(throughput) = throughput {
                out.database_throughputs.push((id.clone(), throughput));
            }
            out.databases.0.push((id, uid));
        }
        for item in self.catalog.prefix(catalog::COLLECTION_PREFIX) {
            let (_, value) = item.into_inner().map_err(storage_error)?;
            out.collections.push(catalog::decode_collection(&value)?);
        }
        for item in self.catalog.prefix(catalog::VERSIONS_PREFIX) {
            let (_, value) = item.into_inner().map_err(storage_error)?;
            let floor = catalog::decode_u64(&value, "version floor")?;
            out.versions_below = out.versions_below.max(floor);
        }
        Ok(out)
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.group.durable(lsn)
    }

    fn last_applied(&self) -> Lsn {
        self.group.last_applied()
    }

    fn failure(&self) -> Option<StorageError> {
        self.group.failure()
    }

    fn reopen_ready(&self) -> Result<(), StorageError> {
        self.dir.probe().map_err(StorageError::unavailable)
    }

    fn placement(&self) -> crate::engine::Placement {
        match self.dir.format() {
            1 => crate::engine::Placement::Format1,
            _ => crate::engine::Placement::Xxh3,
        }
    }
}

/// One engine shard's documents: a key range (the shard number is the key prefix).
struct DiskShard {
    index: u16,
    db: Database,
    docs: Keyspace,
    meta: Keyspace,
    terms: Keyspace,
    entries: Keyspace,
    requests: Keyspace,
    log: Keyspace,
    catalog: Keyspace,
    group: Arc<GroupCommit>,
    /// Recently read documents and index entries (`None`: no cache).
    cache: Option<ShardCache>,
}

impl fmt::Debug for DiskShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskShard")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl DiskShard {
    /// A batch whose commit makes it "applied" in the sense of [`ShardStore::write`]: ready
    /// for the group commit to make durable (see [`GroupCommit::batch_persist`]).
    fn applied_batch(&self) -> fjall::OwnedWriteBatch {
        self.db.batch().durability(self.group.batch_persist())
    }

    /// A document from its address and its documents-keyspace value.
    fn record(
        collection: CollectionUid,
        key: DocKey,
        value: &[u8],
    ) -> Result<StoredDocument, StorageError> {
        let (header, body) = Header::decode(value)?;
        Ok(StoredDocument {
            collection,
            key,
            body: Bytes::copy_from_slice(body),
            last_write: header.last_write,
            version: header.version,
            ttl: header.ttl,
        })
    }

    fn scan_from(
        &self,
        collection: CollectionUid,
        prefix: &[u8],
        start: Bound<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        let mut out = Vec::new();
        for item in self.docs.range((start, Bound::Unbounded)) {
            if out.len() == limit {
                break;
            }
            let (key, value) = item.into_inner().map_err(storage_error)?;
            if !key.starts_with(prefix) {
                break;
            }
            let (uid, key) = codec::decode_document_key(&key)?;
            debug_assert_eq!(uid, collection);
            out.push(Arc::new(Self::record(collection, key, &value)?));
        }
        Ok(out)
    }

    /// Replaces a document's index entries (`update.old` → `update.new`) and its terms record.
    #[allow(
        clippy::too_many_arguments,
        reason = "one index update's inputs, each distinct"
    )]
    fn write_index<'a>(
        &'a self,
        batch: &mut KeyOrderedBatch<'a>,
        changed: &mut Changed<'_>,
        collection: CollectionUid,
        key: &DocKey,
        version: u64,
        update: IndexUpdate<'_>,
    ) {
        let (removed, added) = index_keys::changed_terms(update.old, update.new);
        self.remove_entries(batch, changed, collection, &removed, key);
        let prefix = codec::collection_prefix(self.index, collection);
        for term in added {
            let entry = index_keys::entry_key(&prefix, term, key);
            if self.cache.is_some() {
                changed
                    .terms
                    .push(entry[..prefix.len() + term.len()].to_vec());
            }
            batch.insert(&self.entries, entry, index_keys::entry_value(term).to_vec());
        }
        let record = codec::document_key(self.index, collection, key);
        if update.new.is_empty() {
            batch.remove(&self.terms, record);
        } else {
            batch.insert(
                &self.terms,
                record,
                index_keys::encode_terms(version, update.new),
            );
        }
    }

    fn remove_entries<'a>(
        &'a self,
        batch: &mut KeyOrderedBatch<'a>,
        changed: &mut Changed<'_>,
        collection: CollectionUid,
        terms: &[&Term],
        key: &DocKey,
    ) {
        let prefix = codec::collection_prefix(self.index, collection);
        for term in terms {
            let entry = index_keys::entry_key(&prefix, term, key);
            if self.cache.is_some() {
                changed
                    .terms
                    .push(entry[..prefix.len() + term.len()].to_vec());
            }
            batch.remove(&self.entries, entry);
        }
    }

    /// Every record of this shard in a keyspace keyed by document, decoded.
    fn each_record<T>(
        &self,
        keyspace: &Keyspace,
        decode: impl Fn(&[u8]) -> Result<T, StorageError>,
        each: &mut dyn FnMut(CollectionUid, DocKey, T),
    ) -> Result<(), StorageError> {
        for item in keyspace.prefix(codec::shard_prefix(self.index)) {
            let (key, value) = item.into_inner().map_err(storage_error)?;
            let (collection, key) = codec::decode_document_key(&key)?;
            each(collection, key, decode(&value)?);
        }
        Ok(())
    }

    /// Deletes every key of `keyspace` under `prefix`, in batches.
    fn drop_prefix(&self, keyspace: &Keyspace, prefix: &[u8]) -> Result<(), StorageError> {
        loop {
            let keys: Vec<_> = keyspace
                .prefix(prefix)
                .take(DROP_BATCH)
                .map(|item| item.key().map_err(storage_error))
                .collect::<Result<_, _>>()?;
            if keys.is_empty() {
                return Ok(());
            }
            let mut batch = self.applied_batch();
            for key in keys {
                batch.remove(keyspace, key);
            }
            batch.commit().map_err(storage_error)?;
            self.group.applied();
        }
    }
}

impl ShardStore for DiskShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        self.group.check()?;
        let mut out = KeyOrderedBatch::new();
        let mut deletes = false;
        let mut last_log_seq = None;
        // What the batch changes, for the cache once fjall has it.
        let mut changed = Changed::default();
        for write in batch.writes {
            match *write {
                DocumentWrite::Put { doc, index, seq } => {
                    let key = codec::document_key(self.index, doc.collection, &doc.key);
                    if key.len() > codec::MAX_KEY_BYTES {
                        // The edge bounds ids and partition keys far below this; a key that
                        // still gets here is refused rather than allowed to panic fjall.
                        return Err(StorageError::new(format!(
                            "document key of {} bytes exceeds the storage limit of {} bytes",
                            key.len(),
                            codec::MAX_KEY_BYTES
                        )));
                    }
                    let header = Header {
                        version: doc.version,
                        last_write: doc.last_write,
                        ttl: doc.ttl,
                    };
                    if let Some(update) = index {
                        self.write_index(
                            &mut out,
                            &mut changed,
                            doc.collection,
                            &doc.key,
                            doc.version,
                            update,
                        );
                    }
                    out.insert(
                        &self.meta,
                        key.clone(),
                        codec::encode_meta(&header, seq, false),
                    );
                    if self.cache.is_some() {
                        changed.documents.push((key.clone(), Written::Put(doc)));
                    }
                    out.insert(&self.docs, key, header.encode(&doc.body));
                }
                DocumentWrite::Index {
                    collection,
                    key,
                    version,
                    update,
                } => self.write_index(&mut out, &mut changed, collection, key, version, update),
                DocumentWrite::Delete {
                    collection,
                    key: doc_key,
                    terms,
                } => {
                    let key = codec::document_key(self.index, collection, doc_key);
                    let terms: Vec<&Term> = terms.iter().collect();
                    self.remove_entries(&mut out, &mut changed, collection, &terms, doc_key);
                    out.remove(&self.terms, key.clone());
                    out.remove(&self.meta, key.clone());
                    if self.cache.is_some() {
                        changed.documents.push((key.clone(), Written::Deleted));
                    }
                    out.remove(&self.docs, key);
                    deletes = true;
                }
                DocumentWrite::ExpiryLogged {
                    collection,
                    key,
                    version,
                    last_write,
                    ttl,
                    seq,
                } => {
                    let header = Header {
                        version,
                        last_write,
                        ttl,
                    };
                    out.insert(
                        &self.meta,
                        codec::document_key(self.index, collection, key),
                        codec::encode_meta(&header, seq, true),
                    );
                }
                DocumentWrite::Remember {
                    collection,
                    key,
                    record,
                } => {
                    let key = codec::document_key(self.index, collection, key);
                    out.insert(&self.requests, key, codec::encode_request(&record).to_vec());
                }
                DocumentWrite::Forget { collection, key } => {
                    out.remove(
                        &self.requests,
                        codec::document_key(self.index, collection, key),
                    );
                }
                DocumentWrite::Append {
                    collection,
                    seq,
                    record,
                } => {
                    let mut key = codec::collection_prefix(self.index, collection);
                    key.extend_from_slice(&seq.to_be_bytes());
                    let mut value = Vec::with_capacity(record.len());
                    value.extend_from_slice(&record.head);
                    value.extend_from_slice(&record.body);
                    out.insert(&self.log, key, value);
                    last_log_seq = last_log_seq.max(Some(seq));
                }
            }
        }
        if let Some(seq) = last_log_seq {
            out.insert(
                &self.catalog,
                catalog::log_seq_key(self.index),
                seq.to_be_bytes().to_vec(),
            );
        }
        if deletes || batch.keep_floor {
            // A deleted (or never stored) document's version must not be handed out again
            // after a restart.
            out.insert(
                &self.catalog,
                catalog::versions_key(self.index),
                batch.versions_below.to_be_bytes().to_vec(),
            );
        }
        let mut fjall_batch = self.applied_batch();
        out.apply_to(&mut fjall_batch);
        fjall_batch
            .commit()
            .map_err(|e| self.group.write_failed("a document write", &e))?;
        if let Some(cache) = &self.cache {
            cache.wrote(&changed);
        }
        Ok(self.group.applied())
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.group.durable(lsn)
    }

    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        for item in self.meta.prefix(codec::shard_prefix(self.index)) {
            let (key, value) = item.into_inner().map_err(storage_error)?;
            let (collection, key) = codec::decode_document_key(&key)?;
            let (header, seq, expiry_logged) = codec::decode_meta(&value)?;
            each(StoredMeta {
                collection,
                key,
                last_write: header.last_write,
                version: header.version,
                ttl: header.ttl,
                seq,
                expiry_logged,
            });
        }
        Ok(())
    }

    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        self.each_record(&self.terms, index_keys::decode_terms, each)
    }

    fn load_requests(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, RequestRecord),
    ) -> Result<(), StorageError> {
        self.each_record(&self.requests, codec::decode_request, each)
    }

    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        let raw = codec::document_key(self.index, collection, key);
        self.terms
            .get(&raw)
            .map_err(storage_error)?
            .map(|value| index_keys::decode_terms(&value))
            .transpose()
    }

    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        let prefix = codec::collection_prefix(self.index, collection);
        let bounds = index_keys::scan_bounds(&prefix, &range);
        if index_keys::is_empty(&bounds) || limit == 0 {
            return Ok(Vec::new());
        }
        // One whole term's entries (an equality's read) may come from the cache.
        let one_term = self.cache.as_ref().filter(|_| {
            range.after.is_none()
                && range
                    .high
                    .is_some_and(|h| index_keys::prefix_end(range.low).as_deref() == Some(h))
        });
        let term_key = || [&prefix[..], range.low].concat();
        let mark = match one_term {
            Some(cache) => match cache.entries(&term_key()) {
                Some(all) => {
                    return Ok(if range.descending {
                        all.iter().rev().take(limit).cloned().collect()
                    } else {
                        all.iter().take(limit).cloned().collect()
                    });
                }
                None => Some(cache.mark()),
            },
            None => None,
        };
        let decode = |item: fjall::Guard| {
            let (key, value) = item.into_inner().map_err(storage_error)?;
            index_keys::decode_entry(prefix.len(), &key, &value)
        };
        let entries = self.entries.range(bounds);
        let read: Vec<IndexEntry> = if range.descending {
            entries
                .rev()
                .take(limit)
                .map(decode)
                .collect::<Result<_, _>>()?
        } else {
            entries.take(limit).map(decode).collect::<Result<_, _>>()?
        };
        // Kept only when complete and of the one term `low` (a bound that is a term's prefix
        // rather than a whole term would span several, which a write to one of them could not
        // find to drop).
        if let (Some(cache), Some(mark)) = (one_term, mark)
            && !read.is_empty()
            && read.len() < limit
            && read.len() <= MAX_CACHED_ENTRIES
            && read.iter().all(|e| e.term == range.low)
        {
            let mut all = read.clone();
            if range.descending {
                all.reverse();
            }
            cache.fill_entries(mark, term_key(), all.into());
        }
        Ok(read)
    }

    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        let raw = codec::document_key(self.index, collection, key);
        let mark = match &self.cache {
            Some(cache) => match cache.document(&raw) {
                Some(doc) => return Ok(Some(doc)),
                None => Some(cache.mark()),
            },
            None => None,
        };
        let Some(value) = self.docs.get(&raw).map_err(storage_error)? else {
            return Ok(None);
        };
        let doc = Arc::new(Self::record(collection, key.clone(), &value)?);
        if let (Some(cache), Some(mark)) = (&self.cache, mark) {
            cache.fill_document(mark, raw, doc.clone());
        }
        Ok(Some(doc))
    }

    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        match range {
            ScanRange::Collection { after } => {
                let prefix = codec::collection_prefix(self.index, collection);
                let start = match after {
                    Some(key) => Bound::Excluded(codec::document_key(self.index, collection, key)),
                    None => Bound::Included(prefix.clone()),
                };
                self.scan_from(collection, &prefix, start, limit)
            }
            ScanRange::Partition {
                partition_key,
                after,
            } => {
                let prefix = codec::partition_prefix(self.index, collection, partition_key);
                let start = match after {
                    Some(id) => Bound::Excluded([&prefix[..], id.as_str().as_bytes()].concat()),
                    None => Bound::Included(prefix.clone()),
                };
                self.scan_from(collection, &prefix, start, limit)
            }
        }
    }

    fn clear(&self) -> Result<(), StorageError> {
        let prefix = codec::shard_prefix(self.index);
        for keyspace in [
            &self.log,
            &self.requests,
            &self.entries,
            &self.terms,
            &self.docs,
            &self.meta,
        ] {
            self.drop_prefix(keyspace, &prefix)?;
        }
        if let Some(cache) = &self.cache {
            cache.dropped(&prefix);
        }
        // The change log's position and floors go with it; the version floor stays (versions
        // are never handed out twice).
        let floors = [catalog::LOG_FLOOR_PREFIX, &self.index.to_be_bytes()].concat();
        self.drop_prefix(&self.catalog, &floors)?;
        let mut batch = self.applied_batch();
        batch.remove(&self.catalog, catalog::log_seq_key(self.index));
        batch.commit().map_err(storage_error)?;
        self.group.applied();
        Ok(())
    }

    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        let prefix = codec::collection_prefix(self.index, collection);
        self.drop_prefix(&self.log, &prefix)?;
        self.drop_prefix(&self.requests, &prefix)?;
        self.drop_prefix(&self.entries, &prefix)?;
        self.drop_prefix(&self.terms, &prefix)?;
        loop {
            // Keys from the small keyspace; each round deletes what the last one listed.
            let keys: Vec<_> = self
                .meta
                .prefix(&prefix)
                .take(DROP_BATCH)
                .map(|item| item.key().map_err(storage_error))
                .collect::<Result<_, _>>()?;
            if keys.is_empty() {
                if let Some(cache) = &self.cache {
                    cache.dropped(&prefix);
                }
                return Ok(());
            }
            let mut batch = self.applied_batch();
            for key in keys {
                batch.remove(&self.docs, key.clone());
                batch.remove(&self.meta, key);
            }
            batch.commit().map_err(storage_error)?;
            self.group.applied();
        }
    }

    fn change_log(&self) -> &dyn ChangeLog {
        self
    }
}

impl ChangeLog for DiskShard {
    fn read_log(
        &self,
        collection: CollectionUid,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogRecord)>, StorageError> {
        let prefix = codec::collection_prefix(self.index, collection);
        let start = Bound::Included([&prefix[..], &from.to_be_bytes()].concat());
        let end = index_keys::prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded);
        self.log
            .range((start, end))
            .take(limit)
            .map(|item| {
                let (key, value) = item.into_inner().map_err(storage_error)?;
                let seq = key
                    .get(prefix.len()..)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| StorageError::new("corrupt change log key"))?;
                Ok((seq, LogRecord::whole(Bytes::copy_from_slice(&value))))
            })
            .collect()
    }

    fn last_log_seq(&self) -> Result<u64, StorageError> {
        match self
            .catalog
            .get(catalog::log_seq_key(self.index))
            .map_err(storage_error)?
        {
            Some(value) => catalog::decode_u64(&value, "change log position"),
            None => Ok(0),
        }
    }

    fn trim_log(
        &self,
        collection: CollectionUid,
        below: u64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let prefix = codec::collection_prefix(self.index, collection);
        let end = [&prefix[..], &below.to_be_bytes()].concat();
        let keys: Vec<_> = self
            .log
            .range(prefix.clone()..end)
            .take(limit)
            .map(|item| item.key().map_err(storage_error))
            .collect::<Result<_, _>>()?;
        if keys.is_empty() {
            return Ok(0);
        }
        let last = keys
            .last()
            .and_then(|k| k.get(prefix.len()..))
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| StorageError::new("corrupt change log key"))?;
        let mut batch = self.applied_batch();
        for key in &keys {
            batch.remove(&self.log, key.clone());
        }
        // Kept with the removal, so that a reader behind it learns what it missed after a
        // restart too.
        batch.insert(
            &self.catalog,
            catalog::log_floor_key(self.index, collection),
            (last + 1).to_be_bytes().to_vec(),
        );
        batch.commit().map_err(storage_error)?;
        self.group.applied();
        Ok(keys.len())
    }

    fn log_floor(&self, collection: CollectionUid) -> Result<u64, StorageError> {
        match self
            .catalog
            .get(catalog::log_floor_key(self.index, collection))
            .map_err(storage_error)?
        {
            Some(value) => catalog::decode_u64(&value, "change log floor"),
            None => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DocumentId, DocumentTtl, IdKind, PartitionKeyValue, TtlSeconds};
    use crate::storage::StorageErrorKind;

    fn options(path: &Path) -> DiskOptions {
        DiskOptions {
            path: path.to_path_buf(),
            durability: Durability::Fsync,
            shards: Some(2),
            cache_bytes: 1 << 20,
            read_cache_bytes: 1 << 20,
            open_files: None,
        }
    }

    fn doc(id: &str, version: u64) -> Arc<StoredDocument> {
        Arc::new(StoredDocument {
            collection: CollectionUid(1),
            key: DocKey {
                partition_key: PartitionKeyValue::String("p".into()),
                id: DocumentId::parse(IdKind::Document, id).expect("valid"),
            },
            body: Bytes::from_static(b"body"),
            last_write: 1_000 + version,
            version,
            ttl: Some(DocumentTtl::After(TtlSeconds::new(60).expect("valid"))),
        })
    }

    async fn wait_durable(shard: &dyn ShardStore, lsn: Lsn) {
        if let Some(durable) = shard.durable(lsn) {
            durable.await.expect("durable");
        }
    }

    #[tokio::test]
    async fn documents_survive_reopening_and_deletes_raise_the_version_floor() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let storage = DiskStorage::open(&options(dir.path())).expect("opens");
            let shard = storage.shard(1);
            let (a, b) = (doc("a", 7), doc("b", 8));
            shard
                .write(WriteBatch {
                    writes: &[
                        DocumentWrite::Put {
                            seq: 0,
                            doc: &a,
                            index: None,
                        },
                        DocumentWrite::Put {
                            seq: 0,
                            doc: &b,
                            index: None,
                        },
                    ],
                    versions_below: 9,
                    keep_floor: false,
                    replicated: false,
                })
                .expect("writes");
            let deleted = shard
                .write(WriteBatch {
                    writes: &[DocumentWrite::Delete {
                        collection: CollectionUid(1),
                        key: &b.key,
                        terms: &[],
                    }],
                    versions_below: 20,
                    keep_floor: false,
                    replicated: false,
                })
                .expect("deletes");
            wait_durable(&*shard, deleted).await;
        }
        let storage = DiskStorage::open(&options(dir.path())).expect("reopens");
        let shard = storage.shard(1);
        let a = doc("a", 7);
        assert_eq!(
            shard
                .get(CollectionUid(1), &a.key)
                .expect("reads")
                .as_deref(),
            Some(&*a)
        );
        let mut loaded = Vec::new();
        shard.load(&mut |m| loaded.push(m.key)).expect("loads");
        assert_eq!(loaded, vec![a.key.clone()]);
        let mut other = Vec::new();
        storage
            .shard(0)
            .load(&mut |m| other.push(m.key))
            .expect("loads");
        assert!(other.is_empty(), "shards are separate key ranges");
        assert_eq!(storage.load_catalog().expect("catalog").versions_below, 20);
        // A batch handed versions it stores nothing for keeps the floor too.
        let kept = shard
            .write(WriteBatch {
                writes: &[],
                versions_below: 30,
                keep_floor: true,
                replicated: false,
            })
            .expect("writes");
        wait_durable(&*shard, kept).await;
        drop((shard, storage));
        let storage = DiskStorage::open(&options(dir.path())).expect("reopens");
        assert_eq!(storage.load_catalog().expect("catalog").versions_below, 30);
    }

    /// Regression: after a failed fsync, buffered mode kept acknowledging writes (its syncer
    /// had exited) and fsync mode answered INTERNAL; now every mode refuses every later write
    /// as unavailable, naming the data directory.
    #[tokio::test]
    async fn after_a_failed_fsync_every_write_is_refused_in_both_modes() {
        for durability in [Durability::Fsync, Durability::Buffered] {
            let dir = tempfile::tempdir().expect("temp dir");
            let storage = DiskStorage::open(&DiskOptions {
                durability,
                ..options(dir.path())
            })
            .expect("opens");
            let shard = storage.shard(0);
            let first = shard
                .write(WriteBatch {
                    writes: &[DocumentWrite::Put {
                        seq: 0,
                        doc: &doc("a", 1),
                        index: None,
                    }],
                    versions_below: 2,
                    keep_floor: false,
                    replicated: false,
                })
                .expect("writes");
            wait_durable(&*shard, first).await;
            assert!(storage.failure().is_none());

            storage.fail_next_sync();
            let second = shard
                .write(WriteBatch {
                    writes: &[DocumentWrite::Put {
                        seq: 0,
                        doc: &doc("b", 2),
                        index: None,
                    }],
                    versions_below: 3,
                    keep_floor: false,
                    replicated: false,
                })
                .expect("applied before the sync fails");
            if durability == Durability::Fsync {
                let err = shard
                    .durable(second)
                    .expect("not durable yet")
                    .await
                    .expect_err("its fsync failed");
                assert_eq!(err.kind(), StorageErrorKind::Unavailable, "{err}");
            } else {
                // The background sync fails within its interval.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while storage.failure().is_none() {
                    assert!(std::time::Instant::now() < deadline, "sync never failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                let err = shard
                    .durable(second)
                    .expect("buffered mode refuses once a sync failed")
                    .await
                    .expect_err("failed");
                assert_eq!(err.kind(), StorageErrorKind::Unavailable);
            }
            let failure = storage.failure().expect("reported");
            assert!(
                failure
                    .to_string()
                    .contains(&dir.path().display().to_string())
                    && failure.to_string().contains("injected fsync failure"),
                "{failure}"
            );
            let refused = shard
                .write(WriteBatch {
                    writes: &[DocumentWrite::Put {
                        seq: 0,
                        doc: &doc("c", 3),
                        index: None,
                    }],
                    versions_below: 4,
                    keep_floor: false,
                    replicated: false,
                })
                .expect_err("refused");
            assert_eq!(refused.kind(), StorageErrorKind::Unavailable);
            let info = crate::model::CollectionInfo {
                database: DocumentId::parse(IdKind::Database, "d").expect("valid"),
                id: DocumentId::parse(IdKind::Collection, "c").expect("valid"),
                uid: CollectionUid(9),
                partition_key_path: crate::model::PartitionKeyPath::parse("/pk").expect("valid"),
                settings: Default::default(),
                expired: Default::default(),
                index_paths: Default::default(),
                index_complete: true,
                must_live: Default::default(),
            };
            assert!(
                storage
                    .write_catalog(CatalogChange::PutCollection(&info))
                    .is_err(),
                "catalog changes are refused too"
            );
        }
    }

    /// A directory written before databases had uids (a `db/` record with an empty value, as
    /// `PutDatabase` writes it) opens: each such database is given a uid above every uid
    /// handed out before, once and durably; databases recorded since keep theirs.
    #[tokio::test]
    async fn databases_recorded_without_uids_are_given_one_when_opened() {
        let dir = tempfile::tempdir().expect("temp dir");
        let id = |s: &str| DatabaseId::parse(IdKind::Database, s).expect("valid");
        {
            let storage = DiskStorage::open(&options(dir.path())).expect("opens");
            let collection = crate::model::CollectionInfo {
                database: id("old"),
                id: DocumentId::parse(IdKind::Collection, "c").expect("valid"),
                uid: CollectionUid(5),
                partition_key_path: crate::model::PartitionKeyPath::parse("/pk").expect("valid"),
                settings: Default::default(),
                expired: Default::default(),
                index_paths: Default::default(),
                index_complete: true,
                must_live: Default::default(),
            };
            for change in [
                CatalogChange::PutDatabase(&id("old")),
                CatalogChange::PutDatabase(&id("older")),
                CatalogChange::PutCollection(&collection),
            ] {
                storage.write_catalog(change).expect("written");
            }
            let lsn = storage.last_applied();
            if let Some(durable) = storage.durable(lsn) {
                durable.await.expect("durable");
            }
            let catalog = storage.load_catalog().expect("loads");
            assert_eq!(
                catalog.databases.0,
                vec![(id("old"), None), (id("older"), None)],
                "the old format, as an earlier build wrote it"
            );
        }
        let given = {
            let storage = DiskStorage::open(&options(dir.path())).expect("reopens");
            let catalog = storage.load_catalog().expect("loads");
            assert_eq!(
                catalog.databases.0,
                vec![
                    (id("old"), Some(DatabaseUid(6))),
                    (id("older"), Some(DatabaseUid(7)))
                ]
            );
            assert_eq!(catalog.last_uid, 7);
            let lsn = storage
                .put_database(&id("new"), DatabaseUid(8), None)
                .expect("written");
            if let Some(durable) = storage.durable(lsn) {
                durable.await.expect("durable");
            }
            catalog.databases
        };
        let storage = DiskStorage::open(&options(dir.path())).expect("reopens");
        let catalog = storage.load_catalog().expect("loads");
        assert_eq!(catalog.databases.0[0], (id("new"), Some(DatabaseUid(8))));
        assert_eq!(catalog.databases.0[1..], given.0[..], "given once, kept");
        assert_eq!(catalog.last_uid, 8);
    }

    #[test]
    fn a_second_open_of_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let _first = DiskStorage::open(&options(dir.path())).expect("opens");
        let err = DiskStorage::open(&options(dir.path())).expect_err("locked");
        assert!(matches!(err, OpenError::Locked { .. }), "{err}");
    }

    /// The group commit fsyncs the journal file fjall appends to (see `group_commit`): this
    /// pins that layout to the fjall version in use.
    #[tokio::test]
    async fn the_active_journal_is_the_file_fjall_appends_to() {
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = DiskStorage::open(&options(dir.path())).expect("opens");
        let db_path = dir.path().join("db");
        let n = group_commit::active_journal(&db_path)
            .expect("lists")
            .expect("a journal exists");
        let journal = db_path.join(format!("{n}.jnl"));
        let marker = b"the-journal-marker-0123456789";
        let mut a = (*doc("a", 1)).clone();
        a.body = Bytes::from_static(marker);
        let a = Arc::new(a);
        let written = storage
            .shard(0)
            .write(WriteBatch {
                writes: &[DocumentWrite::Put {
                    seq: 0,
                    doc: &a,
                    index: None,
                }],
                versions_below: 2,
                keep_floor: false,
                replicated: false,
            })
            .expect("writes");
        wait_durable(&*storage.shard(0), written).await;
        // Written out by the syncer, in that file (which fjall preallocates, so its length says
        // nothing).
        let bytes = std::fs::read(&journal).expect("journal");
        assert!(
            bytes.windows(marker.len()).any(|w| w == marker),
            "the write is not in {}",
            journal.display()
        );
        assert_eq!(
            group_commit::active_journal(&db_path).expect("lists"),
            Some(n)
        );
    }

    fn write(shard: &dyn ShardStore, writes: &[DocumentWrite<'_>]) {
        shard
            .write(WriteBatch {
                writes,
                versions_below: 100,
                keep_floor: false,
                replicated: false,
            })
            .expect("writes");
    }

    fn with_body(id: &str, version: u64, body: &'static [u8]) -> Arc<StoredDocument> {
        let mut d = Arc::unwrap_or_clone(doc(id, version));
        d.body = Bytes::from_static(body);
        Arc::new(d)
    }

    fn one_term(shard: &dyn ShardStore, term: &[u8]) -> Vec<(Vec<u8>, String)> {
        let high = index_keys::prefix_end(term).expect("a term has an end");
        shard
            .scan_index(
                CollectionUid(1),
                IndexRange {
                    low: term,
                    high: Some(&high),
                    descending: false,
                    after: None,
                },
                256,
            )
            .expect("scans")
            .into_iter()
            .map(|e| (e.term, e.key.id.as_str().to_owned()))
            .collect()
    }

    /// A new data directory opened with a read cache of `read_cache_bytes` (0: none).
    fn open_with_read_cache(read_cache_bytes: u64) -> (tempfile::TempDir, DiskStorage) {
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = DiskStorage::open(&DiskOptions {
            read_cache_bytes,
            ..options(dir.path())
        })
        .expect("opens");
        (dir, storage)
    }

    /// The change log as both backends keep it; on disk its records and highest position
    /// also survive a restart.
    #[tokio::test]
    async fn change_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let storage = DiskStorage::open(&options(dir.path())).expect("opens");
            crate::storage::change_log_tests::check_change_log(&*storage.shard(0));
            assert_eq!(
                storage.shard(1).change_log().last_log_seq().expect("reads"),
                0
            );
        }
        let storage = DiskStorage::open(&options(dir.path())).expect("reopens");
        let shard = storage.shard(0);
        assert_eq!(shard.change_log().last_log_seq().expect("reads"), 4);
        assert_eq!(
            shard
                .change_log()
                .read_log(CollectionUid(1), 0, 10)
                .expect("reads"),
            vec![(4, LogRecord::whole(Bytes::from_static(b"a4")))]
        );
    }

    /// A batch reaches fjall sorted by key (see `key_ordered_batch`), yet two changes of one
    /// key in one batch still apply in the order they were made: the later one stands.
    #[tokio::test]
    async fn changes_of_one_key_in_a_batch_keep_their_order() {
        for read_cache_bytes in [1 << 20, 0] {
            let (_dir, storage) = open_with_read_cache(read_cache_bytes);
            let shard = &*storage.shard(0);
            let (a, b) = (with_body("a", 1, b"one"), with_body("b", 2, b"two"));
            let t: Term = b"t\0".to_vec();
            let terms = [t.clone()];
            let put = |doc| DocumentWrite::Put {
                seq: 0,
                doc,
                index: Some(IndexUpdate {
                    old: &[],
                    new: &terms,
                }),
            };
            let delete = |key| DocumentWrite::Delete {
                collection: CollectionUid(1),
                key,
                terms: &terms,
            };
            // Written then deleted; deleted (while absent) then written.
            write(shard, &[put(&a), delete(&a.key), delete(&b.key), put(&b)]);
            let get = |d: &Arc<StoredDocument>| {
                shard
                    .get(CollectionUid(1), &d.key)
                    .expect("reads")
                    .map(|d| d.body.clone())
            };
            assert_eq!(get(&a), None);
            assert_eq!(get(&b), Some(Bytes::from_static(b"two")));
            assert_eq!(one_term(shard, &t), vec![(t.clone(), "b".to_owned())]);
            assert_eq!(
                shard.get_terms(CollectionUid(1), &a.key).expect("reads"),
                None
            );
        }
    }

    /// What a read caches is replaced or dropped by every later write of it: a read after
    /// an overwrite, a delete, an index change or a dropped collection sees what fjall holds,
    /// with the cache on, as with it off.
    #[tokio::test]
    async fn cached_reads_follow_every_write() {
        for read_cache_bytes in [1 << 20, 0] {
            let (_dir, storage) = open_with_read_cache(read_cache_bytes);
            let shard = &*storage.shard(0);
            let get = |d: &Arc<StoredDocument>| {
                shard
                    .get(CollectionUid(1), &d.key)
                    .expect("reads")
                    .map(|d| (d.version, d.body.clone()))
            };
            let (t1, t2): (Term, Term) = (b"t1\0".to_vec(), b"t2\0".to_vec());
            let a1 = with_body("a", 1, b"one");
            let terms1 = [t1.clone()];
            write(
                shard,
                &[DocumentWrite::Put {
                    seq: 0,
                    doc: &a1,
                    index: Some(IndexUpdate {
                        old: &[],
                        new: &terms1,
                    }),
                }],
            );
            // Read twice: the second from the cache, when there is one.
            for _ in 0..2 {
                assert_eq!(get(&a1), Some((1, Bytes::from_static(b"one"))));
                assert_eq!(one_term(shard, &t1), vec![(t1.clone(), "a".to_owned())]);
            }
            // Another document joins the term; a's body and term change.
            let b1 = with_body("b", 2, b"bee");
            let a3 = with_body("a", 3, b"three");
            let terms2 = [t2.clone()];
            write(
                shard,
                &[
                    DocumentWrite::Put {
                        seq: 0,
                        doc: &b1,
                        index: Some(IndexUpdate {
                            old: &[],
                            new: &terms1,
                        }),
                    },
                    DocumentWrite::Put {
                        seq: 0,
                        doc: &a3,
                        index: Some(IndexUpdate {
                            old: &terms1,
                            new: &terms2,
                        }),
                    },
                ],
            );
            for _ in 0..2 {
                assert_eq!(get(&a1), Some((3, Bytes::from_static(b"three"))));
                assert_eq!(one_term(shard, &t1), vec![(t1.clone(), "b".to_owned())]);
                assert_eq!(one_term(shard, &t2), vec![(t2.clone(), "a".to_owned())]);
            }
            write(
                shard,
                &[DocumentWrite::Delete {
                    collection: CollectionUid(1),
                    key: &b1.key,
                    terms: &terms1,
                }],
            );
            assert_eq!(get(&b1), None);
            assert_eq!(one_term(shard, &t1), vec![]);
            // The background indexer's write moves a's entry back.
            write(
                shard,
                &[DocumentWrite::Index {
                    collection: CollectionUid(1),
                    key: &a3.key,
                    version: 3,
                    update: IndexUpdate {
                        old: &terms2,
                        new: &terms1,
                    },
                }],
            );
            assert_eq!(one_term(shard, &t1), vec![(t1.clone(), "a".to_owned())]);
            assert_eq!(one_term(shard, &t2), vec![]);
            shard.drop_collection(CollectionUid(1)).expect("drops");
            assert_eq!(get(&a1), None);
            assert_eq!(one_term(shard, &t1), vec![]);
        }
    }
}
