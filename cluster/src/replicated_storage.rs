//! An owner's storage in cluster mode: the node's own storage (its fjall, or memory), with each
//! shard's commits also sent to the shard's partition log (docs/cluster.md, "Write path"). A
//! commit is applied locally first, under the shard lock, and queued for its publish in the
//! same hold; it is durable, for the engine and so for any client, once the local write is
//! durable **and** JetStream has acknowledged the publish holding it. The waits are per shard:
//! one partition's slow or refused publish holds back only what reflects that partition.
//!
//! What a commit ships is what it logs: its change log records (the engine logs every commit
//! in cluster mode: `EngineConfig::log_every_commit`), the requests it remembered and the
//! version floor. Index entries, terms and the purge's deletes are derived: every replica
//! recomputes them from the records.

use std::{fmt, sync::Arc};

use bytes::Bytes;

use mayfly_engine::{
    engine::Placement,
    model::{CollectionUid, DatabaseId, DatabaseUid, DocKey, Throughput},
    storage::{
        CatalogChange, ChangeLog, DocumentWrite, DurableFuture, IndexEntry, IndexRange, Lsn,
        RequestRecord, ScanRange, ShardSet, ShardStore, Storage, StorageError, StoredCatalog,
        StoredDocument, StoredMeta, StoredTerms, WriteBatch,
    },
};

use crate::{
    log_message::Remembered as Remember,
    publish_queue::{Commit, PublishQueue},
};

/// A node's storage whose shards replicate through their partitions' publish queues.
///
/// Its positions are its own, one counter over every write (a backend that is durable at once
/// may give every write position 0, and a publish queue tells its commits apart by position):
/// a position is durable once every local write applied before it was made is (asked of the
/// inner storage at its latest position, which may wait for a little more) and the
/// partitions' publishes up to it are acknowledged.
pub struct ReplicatedStorage {
    inner: Arc<dyn Storage>,
    shards: Box<[Arc<ReplicatedShard>]>,
    positions: Arc<Positions>,
}

/// The positions a [`ReplicatedStorage`] hands out.
#[derive(Debug, Default)]
struct Positions {
    /// The last position handed out.
    last: std::sync::atomic::AtomicU64,
}

impl Positions {
    /// The next position, for a write the inner storage just applied.
    fn next(&self) -> Lsn {
        Lsn(self.last.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
    }

    fn last(&self) -> Lsn {
        Lsn(self.last.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// The inner storage's wait for a write at this storage's position `lsn`: everything the
/// inner storage applied by now, which covers it (`None` for nothing to wait for).
fn local_wait(inner: &dyn Storage, lsn: Lsn) -> Option<DurableFuture> {
    if lsn == Lsn::ZERO {
        return None;
    }
    inner.durable(inner.last_applied())
}

impl fmt::Debug for ReplicatedStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicatedStorage")
            .field("inner", &self.inner)
            .field("partitions", &self.shards.len())
            .finish()
    }
}

impl ReplicatedStorage {
    /// `inner`'s shards, shard `i` publishing through `queues[i]` (partition `i`), to NATS
    /// servers that take messages of up to `max_message_bytes` (their `max_payload`).
    pub fn new(
        inner: Arc<dyn Storage>,
        queues: Vec<Arc<PublishQueue>>,
        max_message_bytes: usize,
    ) -> Self {
        let positions = Arc::new(Positions::default());
        for queue in &queues {
            queue.keep_marks_in(inner.clone());
        }
        let shards = queues
            .into_iter()
            .enumerate()
            .map(|(i, queue)| {
                Arc::new(ReplicatedShard {
                    inner: inner.shard(i),
                    storage: inner.clone(),
                    queue,
                    max_message_bytes,
                    positions: positions.clone(),
                })
            })
            .collect();
        ReplicatedStorage {
            inner,
            shards,
            positions,
        }
    }

    /// Waits for the local writes up to `lsn` and for the publishes of the shards in `shards`.
    fn wait(&self, lsn: Lsn, shards: ShardSet) -> Option<DurableFuture> {
        let mut waits: Vec<DurableFuture> = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            if !shards.contains(i) {
                continue;
            }
            if let Some(published) = shard.queue.wait(lsn) {
                // Then the replicated mark the publisher wrote before it told of the
                // acknowledgement: durable with everything applied by then.
                let inner = self.inner.clone();
                waits.push(Box::pin(async move {
                    published.await?;
                    match inner.durable(inner.last_applied()) {
                        Some(marked) => marked.await,
                        None => Ok(()),
                    }
                }));
            }
        }
        // Asked after the publishes: a commit already acknowledged had its mark written
        // before, which this wait then covers.
        waits.extend(local_wait(&*self.inner, lsn));
        all(waits)
    }
}

/// One future for every wait in `waits`, which proceed together (a local flush and a publish
/// overlap); the first failure fails it.
fn all(mut waits: Vec<DurableFuture>) -> Option<DurableFuture> {
    match waits.len() {
        0 => None,
        1 => waits.pop(),
        _ => Some(Box::pin(async move {
            futures_util::future::try_join_all(waits).await?;
            Ok(())
        })),
    }
}

impl Storage for ReplicatedStorage {
    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        self.shards[index].clone()
    }

    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.inner.write_catalog(change)?;
        Ok(self.positions.next())
    }

    fn put_database(
        &self,
        database: &DatabaseId,
        uid: DatabaseUid,
        throughput: Option<Throughput>,
    ) -> Result<Lsn, StorageError> {
        self.inner.put_database(database, uid, throughput)?;
        Ok(self.positions.next())
    }

    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        self.inner.load_catalog()
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.wait(lsn, ShardSet::ALL)
    }

    fn durable_in(&self, lsn: Lsn, shards: ShardSet) -> Option<DurableFuture> {
        self.wait(lsn, shards)
    }

    fn last_applied(&self) -> Lsn {
        self.positions.last()
    }

    fn failure(&self) -> Option<StorageError> {
        self.inner.failure()
    }

    fn reopen_ready(&self) -> Result<(), StorageError> {
        self.inner.reopen_ready()
    }

    fn reads_may_block(&self) -> bool {
        self.inner.reads_may_block()
    }

    fn placement(&self) -> Placement {
        self.inner.placement()
    }

    fn node_state(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        self.inner.node_state(key)
    }

    fn keeps_node_state(&self) -> bool {
        self.inner.keeps_node_state()
    }

    fn put_node_state(&self, key: &str, value: &[u8]) -> Result<(), StorageError> {
        self.inner.put_node_state(key, value)
    }
}

/// A shard whose commits are queued for their partition's log.
struct ReplicatedShard {
    inner: Arc<dyn ShardStore>,
    /// The inner storage, for its durability waits.
    storage: Arc<dyn Storage>,
    /// The positions handed out, shared by every shard.
    positions: Arc<Positions>,
    queue: Arc<PublishQueue>,
    /// The largest message the NATS servers take.
    max_message_bytes: usize,
}

impl fmt::Debug for ReplicatedShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicatedShard")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// What a storage batch ships: its records, the requests it remembered, its version floor.
/// `None` for a batch that ships nothing: derived writes (index entries, the purge's deletes),
/// and an owner's commit applied here from the log.
fn commit_of(lsn: Lsn, batch: &WriteBatch<'_>) -> Option<Commit> {
    if batch.replicated {
        return None;
    }
    let mut first = None;
    let mut records = Vec::new();
    let mut remembered = Vec::new();
    for write in batch.writes {
        match *write {
            DocumentWrite::Append {
                collection,
                seq,
                record,
            } => {
                first.get_or_insert(seq);
                records.push((collection, record.clone()));
            }
            DocumentWrite::Remember {
                collection,
                key,
                record,
            } => remembered.push(Remember {
                collection,
                key: key.clone(),
                record,
            }),
            _ => {}
        }
    }
    // A commit without records still ships the keys it remembered (a keyed batch that only
    // read) and a raised version floor (a batch that created and deleted its documents).
    if records.is_empty() && remembered.is_empty() && !batch.keep_floor {
        return None;
    }
    Some(Commit {
        lsn,
        first,
        records,
        remembered,
        versions_below: batch.versions_below,
    })
}

/// Bytes a commit takes in its log message, about: what must fit a NATS message.
fn commit_bytes(batch: &WriteBatch<'_>) -> usize {
    batch
        .writes
        .iter()
        .map(|w| match w {
            DocumentWrite::Append { record, .. } => record.len() + 12,
            DocumentWrite::Remember { key, .. } => key.id.as_str().len() + 64,
            _ => 0,
        })
        .sum::<usize>()
        + 128
}

impl ShardStore for ReplicatedShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        if !batch.replicated {
            // A partition this node does not own, or may no longer own, takes nothing of its
            // own: every write it makes must reach the log.
            if let Some(refusal) = self.queue.refusal() {
                return Err(refusal);
            }
            if !self.queue.owns() && commit_of(Lsn::ZERO, &batch).is_some() {
                return Err(StorageError::unavailable(
                    "this node does not own the partition; retry through its owner",
                ));
            }
            // Refused before it is applied: a commit the log cannot take would leave this copy
            // ahead of the log.
            if commit_bytes(&batch) > self.max_message_bytes {
                return Err(StorageError::unavailable(format!(
                    "the commit takes about {} bytes in its log message, more than the NATS servers take ({} bytes, their max_payload); raise max_payload or write less at once",
                    commit_bytes(&batch),
                    self.max_message_bytes
                )));
            }
        }
        self.inner.write(batch)?;
        // Handed out under the shard lock: a queue's commits are in position order.
        let lsn = self.positions.next();
        if let Some(commit) = commit_of(lsn, &batch) {
            self.queue.enqueue(commit);
        }
        Ok(lsn)
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        let local = local_wait(&*self.storage, lsn);
        all(local.into_iter().chain(self.queue.wait(lsn)).collect())
    }

    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        self.inner.load(each)
    }

    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        self.inner.load_terms(each)
    }

    fn load_requests(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, RequestRecord),
    ) -> Result<(), StorageError> {
        self.inner.load_requests(each)
    }

    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        self.inner.get_terms(collection, key)
    }

    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        self.inner.scan_index(collection, range, limit)
    }

    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        self.inner.get(collection, key)
    }

    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        self.inner.scan(collection, range, limit)
    }

    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        self.inner.drop_collection(collection)
    }

    fn change_log(&self) -> &dyn ChangeLog {
        self.inner.change_log()
    }

    fn clear(&self) -> Result<(), StorageError> {
        self.inner.clear()
    }
}
