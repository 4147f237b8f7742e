//! The engine: databases, collections and documents with Cosmos DB's TTL rules, over sharded
//! in-memory state and a pluggable storage backend. It knows nothing of gRPC.
//!
//! Every document request takes one clock reading and judges visibility by it, so an expired
//! document is gone at its expiry instant whatever the background purge is doing.

mod batch;
mod block_on;
mod body;
mod catalog;
mod change_feed;
mod clock;
mod condition;
mod cursor;
mod document;
mod error;
mod expiry;
mod feed;
mod idempotency;
mod index;
mod indexer;
mod keyed_writes;
mod metrics;
mod outcome;
mod patch;
mod placement;
mod provisioned;
mod purge;
mod query;
mod query_gather;
mod query_reads;
mod recovery;
mod replication;
mod request_charge;
mod shard;
mod token_seal;
mod walk;

#[cfg(test)]
mod power_loss_tests;
#[cfg(test)]
mod tests;

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use parking_lot::{Mutex, RwLock};

pub use batch::{BatchOp, BatchOutput, MAX_BATCH_BYTES, MAX_BATCH_OPERATIONS};
pub use body::{DocumentBody, MAX_DEPTH, MAX_DOCUMENT_BYTES};
pub use change_feed::{
    ChangeEvent, ChangeFeedCursor, ChangeFeedMode, ChangeFeedPage, ChangeFeedScope,
    ChangeFeedStart, ChangeOp, ChangeRecord, FeedRange, MAX_FEED_RANGES, RetentionGuard,
    partition_hash,
};
pub use clock::{Clock, LeaseClock, ManualClock, Millis, SystemClock};
pub use condition::{MAX_CONDITION_BYTES, PatchCondition};
pub use cursor::QueryCursor;
pub use document::{DocumentView, Etag, UpsertOutcome};
pub use error::Error;
pub use feed::{DEFAULT_PAGE_SIZE, FeedPage, FeedScope, MAX_PAGE_BYTES, MAX_PAGE_SIZE, page_size};
pub use idempotency::{
    Answered, DEFAULT_ANSWER_BYTES, DEFAULT_MAX_KEYS, DEFAULT_WINDOW_MS, IdempotencyConfig,
    RequestKey,
};
pub use indexer::IndexerGuard;
pub use keyed_writes::KeyedWrites;
pub use metrics::{EngineMetrics, ExpiryStats, register as register_metrics};
pub use outcome::Outcome;
pub use patch::{MAX_PATCH_OPERATIONS, MAX_PATCH_PATH_BYTES, PatchOp, PatchOptions};
pub use placement::{Placement, placement_key, xxh3_partition};
pub use provisioned::{Budget, SharedThroughput};
pub use purge::PurgeGuard;
pub use query::{QueryCache, QuerySpec};
pub use query_gather::{MAX_GATHERED_BYTES, gathered_too_much};
pub use query_reads::{
    Cancel, INLINE_READS, INLINE_READS_MAY_BLOCK, PageMemory, QUERY_TIME_LIMIT, QueryReads,
};
pub use recovery::{ExpiryRebuild, Recovery};
pub use request_charge::RequestCharge;
pub use shard::{ReplicatedCommit, ShardSnapshot};
pub use token_seal::TokenKey;
pub use walk::{MAX_EXAMINED_PER_PAGE, MAX_RESULT_BYTES, PAGE_TIME_LIMIT, QueryMetrics, QueryPage};
// The domain types, where the engine's callers have always found them.
pub use crate::model::{
    CollectionId, CollectionInfo, CollectionSettings, CollectionUid, DatabaseId, DatabaseUid,
    DefaultTtl, DocumentId, DocumentTtl, ExpiredThrough, FeedRetention, IdKind, IndexPath,
    IndexPaths, IndexingMode, InvalidInput, MAX_ID_CHARS, MAX_MUST_LIVE_RULES,
    MAX_MUST_LIVE_VALUES, MAX_PARTITION_KEY_BYTES, MAX_TTL_SECONDS, MustLive, MustLiveRule,
    PartitionKeyPath, PartitionKeyValue, ResourceId, Rules, SettingsChange, Throughput, TtlSeconds,
};
// Submodules reach the shared modules by their old names.
use crate::model::{partition_key, ttl};

use self::{block_on::block_on, catalog::Catalog, feed::Cursor, shard::Shard};
use crate::storage::{CatalogChange, DocKey, Lsn, ShardSet, Storage};

/// Documents a collection deletion frees per hold of a shard lock.
const FREE_BATCH: usize = 4096;

/// A collection's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CollectionPath {
    /// The database.
    pub database: DatabaseId,
    /// The collection within it.
    pub collection: CollectionId,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Number of shards (at least 1).
    pub shards: usize,
    /// Seals the continuation tokens the engine hands out.
    pub token_key: TokenKey,
    /// Where a feed or query page ends in bytes (it always holds at least one result): what
    /// a reader that stops reading can hold in memory per stream.
    pub page_bytes: usize,
    /// How long idempotency keys are remembered, and how many (see [`IdempotencyConfig`]).
    pub idempotency: IdempotencyConfig,
    /// Every commit logs its change log records, whatever its collection's change feed
    /// setting: cluster mode replicates a partition by its log, and a commit without records
    /// would replicate nothing (docs/cluster.md, "What is replicated"). A collection's feed
    /// retention then says only what its feed serves.
    pub log_every_commit: bool,
    /// What partition leases are timed by, in cluster mode: a shard given a lease end
    /// ([`Engine::serve_until`]) refuses every request from that reading on. `None`: no shard
    /// has a lease (single node).
    pub lease_clock: Option<Arc<dyn LeaseClock>>,
}

impl EngineConfig {
    /// `shards` shards, tokens sealed with a key of this process's own.
    pub fn new(shards: usize) -> Self {
        EngineConfig {
            shards,
            token_key: TokenKey::random(),
            page_bytes: MAX_PAGE_BYTES,
            idempotency: IdempotencyConfig::default(),
            log_every_commit: false,
            lease_clock: None,
        }
    }
}

/// The engine. Cheap to clone: clones share state.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    catalog: RwLock<Catalog>,
    /// Serialises catalog changes (they may take a while); document operations never take it.
    ddl: Mutex<()>,
    shards: Box<[Arc<Shard>]>,
    clock: Arc<dyn Clock>,
    storage: Arc<dyn Storage>,
    /// Which shard holds a partition (the storage's: see [`Storage::placement`]).
    placement: Placement,
    /// Next document version; etags are versions, unique across the engine and its restarts.
    versions: Arc<AtomicU64>,
    metrics: Arc<EngineMetrics>,
    /// Wakes the background indexer (see [`Engine::spawn_indexer`]).
    indexer_wake: Arc<tokio::sync::Notify>,
    /// Seals continuation tokens.
    token_key: TokenKey,
    page_bytes: usize,
    /// Every commit logs its records (see [`EngineConfig::log_every_commit`]).
    log_every_commit: bool,
}

impl Engine {
    /// An empty engine over `storage`, telling time by `clock`.
    pub fn new(config: EngineConfig, storage: Arc<dyn Storage>, clock: Arc<dyn Clock>) -> Self {
        Engine::with_metrics(config, storage, clock, Arc::default())
    }

    /// An empty engine that counts into `metrics` (an engine replacing another keeps its
    /// counters going).
    fn with_metrics(
        config: EngineConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
        metrics: Arc<EngineMetrics>,
    ) -> Self {
        let versions = Arc::new(AtomicU64::new(1));
        let now = clock.now();
        let indexer_wake = Arc::new(tokio::sync::Notify::new());
        let idempotency = config.idempotency.per_shard(config.shards);
        let shards = (0..config.shards.max(1))
            .map(|i| {
                Arc::new(Shard::new(
                    (i, storage.shard(i), config.lease_clock.clone()),
                    metrics.clone(),
                    versions.clone(),
                    indexer_wake.clone(),
                    (now, idempotency),
                ))
            })
            .collect();
        Engine {
            inner: Arc::new(Inner {
                catalog: RwLock::new(Catalog::default()),
                ddl: Mutex::new(()),
                shards,
                clock,
                placement: storage.placement(),
                storage,
                versions,
                metrics,
                indexer_wake,
                token_key: config.token_key,
                page_bytes: config.page_bytes.max(1),
                log_every_commit: config.log_every_commit,
            }),
        }
    }

    /// The result of a document operation, once every write it reflects is durable (at once
    /// if they already are, or if the storage does not wait). Responses are sent after it, so
    /// that no client is told of a change, or sees one, that a crash could take back; writes
    /// waiting together share one fsync.
    pub async fn settle<T>(&self, outcome: Outcome<T>) -> Result<T, Error> {
        self.durable_at(outcome.settle_at, outcome.shards).await?;
        outcome.result
    }

    /// The durability wait, in one place: resolves once every write of `shards` (and of the
    /// catalog) at or before `lsn` is durable, failing with [`Error::NotDurable`] if storage
    /// cannot confirm it.
    async fn durable_at(&self, lsn: Lsn, shards: ShardSet) -> Result<(), Error> {
        match self.inner.storage.durable_in(lsn, shards) {
            None => Ok(()),
            Some(wait) => wait.await.map_err(Error::NotDurable),
        }
    }

    /// Resolves once every write applied so far is durable (tests that stop without a purge).
    #[cfg(test)]
    pub(crate) async fn durable(&self) -> Result<(), Error> {
        self.durable_at(self.inner.storage.last_applied(), ShardSet::ALL)
            .await
    }

    /// Why storage can no longer make writes durable, once that has happened.
    pub fn storage_failure(&self) -> Option<crate::storage::StorageError> {
        self.inner.storage.failure()
    }

    /// Once storage has failed: whether its cause looks gone, so that reopening it is worth
    /// trying (see [`Storage::reopen_ready`]). Blocks on the disk.
    pub fn storage_reopen_ready(&self) -> Result<(), crate::storage::StorageError> {
        self.inner.storage.reopen_ready()
    }

    /// Blocks until a catalog change is durable. Catalog changes are synchronous: the gRPC edge
    /// runs them on a blocking thread.
    /// A catalog change reflects no shard's writes: storage that makes shards durable on logs
    /// of their own (cluster mode) waits for none of them.
    fn catalog_durable(&self, lsn: Lsn) -> Result<(), Error> {
        block_on(self.durable_at(lsn, ShardSet::NONE))
    }

    /// A handle on the engine's storage that does not keep it open: it is gone once every
    /// engine (and task) using the storage has let it go, its data directory unlocked then.
    pub fn storage_handle(&self) -> std::sync::Weak<dyn Storage> {
        Arc::downgrade(&self.inner.storage)
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Counters and histograms the engine updates.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.inner.metrics
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// Where a feed or query page ends in bytes (see [`EngineConfig::page_bytes`]).
    pub fn page_bytes(&self) -> usize {
        self.inner.page_bytes
    }

    fn shards(&self) -> &[Arc<Shard>] {
        &self.inner.shards
    }

    /// Starts the background purge, one task per shard, on the current tokio runtime.
    pub fn spawn_purge(&self) -> PurgeGuard {
        PurgeGuard::spawn(self.shards(), &self.inner.clock)
    }

    /// Purges everything due now, synchronously, and returns how many documents it removed.
    /// For tests, on storage whose writes are durable at once (memory); servers run
    /// [`Engine::spawn_purge`].
    #[cfg(test)]
    pub(crate) fn purge_now(&self) -> usize {
        let mut purged = 0;
        for shard in self.shards() {
            loop {
                let (report, undurable) = shard.purge_batch(&*self.inner.clock, purge::PURGE_BATCH);
                assert!(
                    undurable.is_none(),
                    "purge_now needs storage durable once written"
                );
                purged += report.purged;
                if report.failed || report.next_due.is_none_or(|d| d > report.now) {
                    break;
                }
            }
        }
        purged
    }

    fn next_version(&self) -> u64 {
        self.inner.versions.fetch_add(1, Ordering::Relaxed)
    }

    /// The shard that holds a partition, by the storage's placement.
    fn shard_index(&self, info: &CollectionInfo, partition_key: &PartitionKeyValue) -> usize {
        self.inner
            .placement
            .shard(info, partition_key, self.inner.shards.len())
    }

    /// Whether a collection's commits log their records: for its change feed, or for all.
    fn logs_changes(&self, info: &CollectionInfo) -> bool {
        self.inner.log_every_commit || info.settings.change_feed_retention().is_on()
    }

    fn shard_for(&self, info: &CollectionInfo, partition_key: &PartitionKeyValue) -> &Shard {
        &self.inner.shards[self.shard_index(info, partition_key)]
    }

    // ---- databases ----

    /// Creates a database, with a uid never handed out before.
    pub fn create_database(&self, id: DatabaseId) -> Result<DatabaseUid, Error> {
        self.create_database_with(id, None)
    }

    /// Creates a database whose collections without a throughput of their own share
    /// `throughput` (`None`: they have none unless given their own).
    pub fn create_database_with(
        &self,
        id: DatabaseId,
        throughput: Option<Throughput>,
    ) -> Result<DatabaseUid, Error> {
        let _ddl = self.inner.ddl.lock();
        let uid = {
            let mut catalog = self.inner.catalog.write();
            if catalog.has_database(&id) {
                return Err(Error::DatabaseExists {
                    database: id.to_string(),
                });
            }
            catalog.next_database_uid()
        };
        let lsn = self.inner.storage.put_database(&id, uid, throughput)?;
        self.catalog_durable(lsn)?;
        self.inner.catalog.write().add_database(id, uid, throughput);
        Ok(uid)
    }

    /// The uid of a database: which database of that name it is.
    pub fn get_database(&self, id: &DatabaseId) -> Result<DatabaseUid, Error> {
        self.inner
            .catalog
            .read()
            .database_uid(id)
            .ok_or_else(|| Error::DatabaseNotFound {
                database: id.to_string(),
            })
    }

    /// Every database, ordered by id.
    pub fn list_databases(&self) -> Vec<DatabaseId> {
        self.inner.catalog.read().databases().cloned().collect()
    }

    /// Deletes a database with its collections and their documents, atomically: after a
    /// crash, all of it is there or none of it.
    pub fn delete_database(&self, id: &DatabaseId) -> Result<(), Error> {
        let _ddl = self.inner.ddl.lock();
        let collections: Vec<Arc<CollectionInfo>> = self
            .inner
            .catalog
            .read()
            .collections(id)?
            .cloned()
            .collect();
        let lsn = self
            .inner
            .storage
            .write_catalog(CatalogChange::DeleteDatabase {
                database: id,
                collections: &collections,
                versions_below: self.inner.versions.load(Ordering::SeqCst),
            })?;
        self.catalog_durable(lsn)?;
        self.inner.catalog.write().remove_database(id);
        for info in &collections {
            self.free_collection(info);
        }
        Ok(())
    }

    // ---- collections ----

    /// Creates a collection without must-live rules.
    pub fn create_collection(
        &self,
        database: &DatabaseId,
        id: CollectionId,
        partition_key_path: PartitionKeyPath,
        settings: CollectionSettings,
        index_paths: Arc<IndexPaths>,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let rules = Arc::default();
        self.create_collection_with(
            database,
            id,
            partition_key_path,
            settings,
            index_paths,
            rules,
        )
    }

    /// Creates a collection with `must_live` rules: a write storing a document one of them
    /// matches, without `"ttl": -1`, is refused (see [`MustLive`]).
    pub fn create_collection_with(
        &self,
        database: &DatabaseId,
        id: CollectionId,
        partition_key_path: PartitionKeyPath,
        settings: CollectionSettings,
        index_paths: Arc<IndexPaths>,
        must_live: Arc<MustLive>,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let _ddl = self.inner.ddl.lock();
        let uid = {
            let mut catalog = self.inner.catalog.write();
            match catalog.collection(database, &id) {
                Ok(_) => {
                    return Err(Error::CollectionExists {
                        database: database.to_string(),
                        collection: id.to_string(),
                    });
                }
                Err(Error::CollectionNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            catalog.next_uid()
        };
        let info = Arc::new(CollectionInfo {
            database: database.clone(),
            id,
            uid,
            partition_key_path,
            settings,
            expired: ExpiredThrough::default(),
            index_paths,
            index_complete: true,
            must_live,
        });
        let lsn = self
            .inner
            .storage
            .write_catalog(CatalogChange::PutCollection(&info))?;
        self.catalog_durable(lsn)?;
        self.attach_collection(&info);
        self.inner.catalog.write().put_collection(info.clone());
        Ok(info)
    }

    /// Reads a collection.
    pub fn get_collection(&self, path: &CollectionPath) -> Result<Arc<CollectionInfo>, Error> {
        self.inner
            .catalog
            .read()
            .collection(&path.database, &path.collection)
    }

    /// The collections of a database, ordered by id.
    pub fn list_collections(
        &self,
        database: &DatabaseId,
    ) -> Result<Vec<Arc<CollectionInfo>>, Error> {
        Ok(self
            .inner
            .catalog
            .read()
            .collections(database)?
            .cloned()
            .collect())
    }

    /// Replaces a collection's settings. The new default TTL applies at once to every document
    /// that inherits it; documents already expired stay expired, across a crash too: the
    /// record that holds the new settings also holds what the old default made final.
    pub fn replace_collection(
        &self,
        path: &CollectionPath,
        change: SettingsChange,
    ) -> Result<Arc<CollectionInfo>, Error> {
        self.replace_collection_at(path, change, None)
    }

    /// [`Engine::replace_collection`], switching at instant `at` if given rather than at the
    /// shards' time: a cluster's nodes apply a settings change from the catalog log at the
    /// instant its proposer gave it, whenever each applies it (a node joining hours later
    /// included), so that every node judges the same documents expired.
    pub fn replace_collection_at(
        &self,
        path: &CollectionPath,
        change: SettingsChange,
        at: Option<Millis>,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let _ddl = self.inner.ddl.lock();
        let current = self.get_collection(path)?;
        let mode = change
            .indexing_mode
            .unwrap_or(current.settings.indexing_mode());
        let settings = CollectionSettings::new(change.default_ttl, mode)?
            .with_change_feed_retention(
                change
                    .change_feed_retention
                    .unwrap_or(current.settings.change_feed_retention()),
            )
            // A settings replace keeps the throughput (replaced on its own).
            .with_throughput(current.settings.throughput());
        let index_paths = change
            .index_paths
            .unwrap_or_else(|| current.index_paths.clone());
        let must_live = change
            .must_live
            .unwrap_or_else(|| current.must_live.clone());
        // Documents written under another policy need their entries made again (a rebuild by
        // the background indexer); so do all in a `lazy` collection whose TTL is switched on
        // or off, as in Cosmos DB. Until it is done, or while a `lazy` collection's owed
        // updates remain on the way to `consistent`, the index is incomplete: `consistent`
        // queries read documents instead.
        let new_paths = (mode != IndexingMode::None).then(|| index_paths.clone());
        let paths_changed = match (current.indexed_paths(), new_paths.as_deref()) {
            (None, None) => false,
            (Some(a), Some(b)) => a != b,
            _ => true,
        };
        let ttl_switched = current.settings.default_ttl().is_on() != settings.default_ttl().is_on();
        let rebuild = paths_changed || (mode == IndexingMode::Lazy && ttl_switched);
        let leaves_lazy = current.settings.indexing_mode() == IndexingMode::Lazy
            && mode == IndexingMode::Consistent;
        let index_complete = current.index_complete && !rebuild && !leaves_lazy;
        let index = shard::IndexSettings {
            paths: new_paths,
            lazy: mode == IndexingMode::Lazy,
            rebuild,
        };
        // Every shard switches at one instant, so the marks below cover everything the old
        // default expired up to that instant.
        let ((info, lsn), turned_on) =
            Shard::switch_rules(self.shards(), (&*self.inner.clock, at), current.uid, |at| {
                let was_on = current.settings.change_feed_retention().is_on();
                let since = if !was_on && settings.change_feed_retention().is_on() {
                    at
                } else {
                    current.settings.change_feed_since()
                };
                let settings = settings.with_change_feed_since(since);
                let old = current.settings.default_ttl();
                let expired = if old == settings.default_ttl() {
                    current.expired
                } else {
                    current.expired.after_change(old, at)
                };
                let info = Arc::new(CollectionInfo {
                    settings,
                    expired,
                    index_paths,
                    index_complete,
                    must_live,
                    ..(*current).clone()
                });
                let lsn = self
                    .inner
                    .storage
                    .write_catalog(CatalogChange::PutCollection(&info))?;
                let new = shard::ShardRules {
                    rules: info.rules(),
                    index,
                    must_live: info.must_live.clone(),
                    feed: self.logs_changes(&info),
                };
                Ok::<_, Error>(((info, lsn), new, lsn))
            })?;
        self.inner.catalog.write().put_collection(info.clone());
        self.inner.indexer_wake.notify_one();
        for (shard, turned_on) in self.shards().iter().zip(turned_on) {
            // Anything may be due now: inheritors under a lower default, or marked ones.
            shard.wake_purge();
            if turned_on {
                shard.time_own_ttls(info.uid);
            }
        }
        // Requests may see the new rules before this returns; their responses wait for the
        // change to be durable like any write they reflect.
        self.catalog_durable(lsn)?;
        Ok(info)
    }

    /// Gives every shard its part of a collection.
    fn attach_collection(&self, info: &CollectionInfo) {
        let feed_signal = Arc::new(tokio::sync::watch::Sender::new(()));
        for shard in self.shards() {
            shard.add_collection(
                info,
                &*self.inner.clock,
                (self.logs_changes(info), &feed_signal),
            );
        }
    }

    /// Deletes a collection with its documents.
    pub fn delete_collection(&self, path: &CollectionPath) -> Result<(), Error> {
        let _ddl = self.inner.ddl.lock();
        let info = self.get_collection(path)?;
        self.drop_collection(&info)
    }

    /// Deletes a collection: one durable catalog change makes it gone (after a crash too);
    /// freeing its documents follows, and a restart finishes it if a crash interrupts it.
    fn drop_collection(&self, info: &CollectionInfo) -> Result<(), Error> {
        let lsn = self
            .inner
            .storage
            .write_catalog(CatalogChange::DeleteCollection {
                info,
                versions_below: self.inner.versions.load(Ordering::SeqCst),
            })?;
        self.catalog_durable(lsn)?;
        self.inner
            .catalog
            .write()
            .remove_collection(&info.database, &info.id);
        self.free_collection(info);
        Ok(())
    }

    /// Frees the memory and storage of a collection the catalog no longer names.
    fn free_collection(&self, info: &CollectionInfo) {
        for shard in self.shards() {
            if let Some(part) = shard.detach_collection(info.uid) {
                let mut slots = part.into_slots();
                while !shard.free_detached(&mut slots, FREE_BATCH) {}
            }
            if let Err(e) = shard.drop_stored_collection(info.uid) {
                // The catalog no longer names it; what is left is unreachable garbage.
                tracing::warn!(error = %e, collection = %info.id, "could not free a deleted collection's storage; a restart retries");
            }
        }
    }

    // ---- documents ----

    fn key_for(
        info: &CollectionInfo,
        body: &DocumentBody,
        requested: Option<PartitionKeyValue>,
    ) -> Result<DocKey, InvalidInput> {
        let partition_key = info.partition_key_path.extract(body.map())?;
        if let Some(requested) = requested
            && requested != partition_key
        {
            return Err(InvalidInput::PartitionKeyMismatch {
                request: requested,
                body: partition_key,
                path: info.partition_key_path.to_string(),
            });
        }
        Ok(DocKey {
            partition_key,
            id: body.id().clone(),
        })
    }

    /// Creates a document; `DocumentExists` if a live one has its id in its partition. The
    /// partition key comes from the body; `partition_key`, if given, must agree with it.
    pub fn create_document(
        &self,
        path: &CollectionPath,
        body: DocumentBody,
        partition_key: Option<PartitionKeyValue>,
    ) -> Outcome<DocumentView> {
        let created = self.keyed(None).create_document(path, body, partition_key);
        created.map(|a| a.value)
    }

    /// Creates or replaces a document.
    pub fn upsert_document(
        &self,
        path: &CollectionPath,
        body: DocumentBody,
        partition_key: Option<PartitionKeyValue>,
        if_match: Option<&str>,
    ) -> Outcome<(UpsertOutcome, DocumentView)> {
        self.keyed(None)
            .upsert_document(path, body, partition_key, if_match)
            .map(|a| a.value)
    }

    /// Replaces a live document; its id and partition key must match the body's.
    pub fn replace_document(
        &self,
        path: &CollectionPath,
        key: DocKey,
        body: DocumentBody,
        if_match: Option<&str>,
    ) -> Outcome<DocumentView> {
        self.keyed(None)
            .replace_document(path, key, body, if_match)
            .map(|a| a.value)
    }

    /// Applies `ops` to a live document as one write (new `_ts` and etag; `/ttl` may be set or
    /// removed, checked as in any body). The patch applies to the version it read: should
    /// another write land in between, it is applied again to the new version, so concurrent
    /// patches (an `incr` from many clients) all count (the shard's optimistic commit: it
    /// never fails for contention). With `if_match`, only that version is patched; with a
    /// `condition`, only a version it holds for ([`Error::ConditionNotMet`]). Blocks on
    /// storage: call it off the async runtime.
    pub fn patch_document(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        ops: &[PatchOp],
        condition: Option<&PatchCondition>,
        if_match: Option<&str>,
    ) -> Outcome<DocumentView> {
        let options = PatchOptions::default();
        self.patch_document_with(path, key, (ops, condition), if_match, &options)
            .map(|(view, _)| view)
    }

    /// [`Engine::patch_document`] with [`PatchOptions`]: with a `create_if_missing` body, a
    /// document that is not live (absent, deleted or expired) is created from it with `ops`
    /// applied, as one write (one new version), and the answer's flag is true; a live one is
    /// patched as without it (flag false), `condition` checked against it. Whether the
    /// document is live is judged under the shard lock in the same hold as the commit (the
    /// optimistic commit's look), so a creation racing another never loses a write: the
    /// loser of the race patches the winner's document. The body's id and partition key must
    /// be `key`'s, and an `if_match` is refused with it ([`InvalidInput::CreateIfMissing`],
    /// [`InvalidInput::IfMatchWithCreate`]). Blocks on storage: call it off the async runtime.
    pub fn patch_document_with(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        patch: (&[PatchOp], Option<&PatchCondition>),
        if_match: Option<&str>,
        options: &PatchOptions,
    ) -> Outcome<(DocumentView, bool)> {
        self.keyed(None)
            .patch_document_with(path, key, patch, if_match, options)
            .map(|a| a.value)
    }

    /// A patch's `create_if_missing` body is the document at `key`'s, and comes without an
    /// `if_match`.
    fn check_initial_body(
        info: &CollectionInfo,
        key: &DocKey,
        initial: &DocumentBody,
        if_match: Option<&str>,
    ) -> Result<(), InvalidInput> {
        if if_match.is_some() {
            return Err(InvalidInput::IfMatchWithCreate);
        }
        let named = |e| InvalidInput::CreateIfMissing(Box::new(e));
        if initial.id() != &key.id {
            return Err(named(InvalidInput::IdMismatch {
                request: key.id.to_string(),
                body: initial.id().to_string(),
            }));
        }
        Self::key_for(info, initial, Some(key.partition_key.clone())).map_err(named)?;
        Ok(())
    }

    /// Reads a live document.
    pub fn read_document(&self, path: &CollectionPath, key: &DocKey) -> Outcome<DocumentView> {
        match self.get_collection(path) {
            Ok(info) => {
                self.shard_for(&info, &key.partition_key)
                    .read(&info, key, &*self.inner.clock)
            }
            Err(e) => Outcome::failed(e),
        }
    }

    /// Deletes a live document.
    pub fn delete_document(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        if_match: Option<&str>,
    ) -> Outcome<()> {
        self.keyed(None)
            .delete_document(path, key, if_match)
            .map(|a| a.value)
    }

    /// Restarts a live document's TTL clock: a write with its current body (new `_ts`, new etag).
    pub fn touch_document(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        if_match: Option<&str>,
    ) -> Outcome<DocumentView> {
        self.keyed(None)
            .touch_document(path, key, if_match)
            .map(|a| a.value)
    }

    /// One page of a read feed, within `reads` (see [`QueryReads`]: an inline run that needs
    /// more fails with [`Error::ReadBudgetSpent`]). `page_size` comes from [`page_size`].
    /// Blocks on storage: unless inline, call it off the async runtime.
    pub fn read_feed_page(
        &self,
        path: &CollectionPath,
        scope: &FeedScope,
        page_size: usize,
        continuation: Option<&str>,
        mut reads: QueryReads,
    ) -> Outcome<FeedPage> {
        let result = self.feed_page(path, scope, page_size, continuation, &mut reads);
        Outcome::new(result.map_err(|e| reads.explain(e)), reads.settle_at)
    }

    fn feed_page(
        &self,
        path: &CollectionPath,
        scope: &FeedScope,
        page_size: usize,
        continuation: Option<&str>,
        reads: &mut QueryReads,
    ) -> Result<FeedPage, Error> {
        let info = self.get_collection(path)?;
        let shards = self.shard_count();
        let (first, last) = match scope {
            FeedScope::Collection => (0, shards - 1),
            FeedScope::Partition(pk) => {
                let i = self.shard_index(&info, pk);
                (i, i)
            }
        };
        let mut cursor = match continuation {
            Some(token) => match self.open_cursor(token, &info, scope, None)? {
                cursor::Resume::Feed(cursor) => cursor,
                cursor::Resume::Query(_) => unreachable!("a feed's binding opens feed tokens"),
            },
            None => Cursor {
                shard: first,
                after: None,
            },
        };
        if cursor.shard < first || cursor.shard > last {
            return Err(InvalidInput::Continuation {
                reason: "it does not belong to this feed",
            }
            .into());
        }
        let mut documents = Vec::new();
        let mut bytes = 0;
        let mut handoff = false;
        loop {
            let want = page_size - documents.len();
            reads.spend(want)?;
            // Each document's memory is reserved before the page keeps it, so that a page
            // holds what the response budget had free, never more; the page's first document
            // is kept whatever its size (a page holds one at least), if memory has room.
            let (base, page_bytes, first_of_page) =
                (bytes, self.inner.page_bytes, documents.is_empty());
            let reserving = &*reads;
            let page = self.inner.shards[cursor.shard].scan_page(
                &info,
                scope,
                cursor.after.as_ref(),
                want,
                &mut |total, first| {
                    (first_of_page && first || base + total <= page_bytes)
                        && reserving.hold(base + total)
                },
                shard::Reading::Clock(&*self.inner.clock),
            )?;
            reads.reflect(page.settle_at);
            if first_of_page && page.documents.is_empty() && page.next_size.is_some() {
                return Err(Error::NoMemory);
            }
            bytes += page.bytes;
            documents.extend(page.documents);
            if !page.exhausted {
                cursor.after = page.last;
                break;
            }
            if cursor.shard == last {
                return Ok(FeedPage {
                    documents,
                    continuation: None,
                    handoff: false,
                });
            }
            cursor = Cursor {
                shard: cursor.shard + 1,
                after: None,
            };
            if !self.serves(cursor.shard) {
                handoff = true;
                break;
            }
            if documents.len() == page_size {
                break;
            }
        }
        Ok(FeedPage {
            documents,
            continuation: Some(self.seal_cursor(&info, scope, None, &cursor::Resume::Feed(cursor))),
            handoff,
        })
    }

    /// The shard the read feed page at `continuation` (its first page: `None`) starts in.
    pub fn feed_shard(
        &self,
        path: &CollectionPath,
        scope: &FeedScope,
        continuation: Option<&str>,
    ) -> Result<usize, Error> {
        let info = self.get_collection(path)?;
        let (first, last) = match scope {
            FeedScope::Collection => (0, self.shard_count() - 1),
            FeedScope::Partition(pk) => {
                let i = self.shard_index(&info, pk);
                (i, i)
            }
        };
        let shard = match continuation {
            None => first,
            Some(token) => match self.open_cursor(token, &info, scope, None)? {
                cursor::Resume::Feed(cursor) => cursor.shard,
                cursor::Resume::Query(_) => unreachable!("a feed's binding opens feed tokens"),
            },
        };
        if shard < first || shard > last {
            return Err(InvalidInput::Continuation {
                reason: "it does not belong to this feed",
            }
            .into());
        }
        Ok(shard)
    }
}
