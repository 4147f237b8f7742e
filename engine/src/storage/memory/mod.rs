//! The in-memory backend: nothing survives a restart. For caches and tests.

mod entry_key;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ops::Bound,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use parking_lot::Mutex;

use self::entry_key::EntryKey;
use super::{
    CatalogChange, ChangeLog, DocKey, DocumentWrite, DurableFuture, IndexEntry, IndexRange,
    IndexUpdate, LogRecord, Lsn, ShardStore, Storage, StorageError, StoredCatalog, StoredDocument,
    StoredMeta, StoredTerms, Term, WriteBatch, index_keys,
};
use crate::model::{CollectionUid, DocumentId, PartitionKeyValue};

/// Bytes of change log records a memory shard keeps when no other cap is given.
pub const DEFAULT_FEED_MEMORY_BYTES: usize = 256 * 1024 * 1024;
/// What a kept record costs besides its bytes (its position and the queue's slot).
const RECORD_OVERHEAD: usize = 48;

/// Keeps every document in ordered maps, one set per engine shard.
#[derive(Debug)]
pub struct MemoryStorage {
    shards: Mutex<HashMap<usize, Arc<MemoryShard>>>,
    /// Bytes of change log records kept per shard: the oldest go first (see
    /// [`MemoryStorage::with_feed_cap`]).
    feed_cap: usize,
    /// Where uids start (see [`StoredCatalog::last_uid`]): a random point, so that a server
    /// on memory storage, restarted, does not hand out the uids of its earlier run again,
    /// which resource tokens minted then are bound to.
    uids_after: u64,
}

impl Default for MemoryStorage {
    fn default() -> Self {
        let mut seed = [0; 8];
        getrandom::fill(&mut seed).expect("the OS random source works");
        MemoryStorage {
            shards: Mutex::default(),
            feed_cap: DEFAULT_FEED_MEMORY_BYTES,
            // Below 2^62: room for more uids than any run hands out.
            uids_after: u64::from_le_bytes(seed) >> 2,
        }
    }
}

impl MemoryStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same store keeping at most about `bytes` of change log records in each shard (at
    /// least the newest record): past that, the oldest records of the shard go first, as
    /// retention would remove them, and a reader behind them is told so.
    pub fn with_feed_cap(self, bytes: usize) -> Self {
        MemoryStorage {
            feed_cap: bytes,
            ..self
        }
    }
}

impl Storage for MemoryStorage {
    fn placement(&self) -> crate::engine::Placement {
        crate::engine::Placement::Xxh3
    }

    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        self.shards
            .lock()
            .entry(index)
            .or_insert_with(|| {
                Arc::new(MemoryShard {
                    feed_cap: self.feed_cap,
                    ..MemoryShard::default()
                })
            })
            .clone()
    }

    fn write_catalog(&self, _change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        // The engine's catalog is the only copy in memory mode: there is nothing to recover.
        Ok(Lsn::ZERO)
    }

    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        Ok(StoredCatalog {
            last_uid: self.uids_after,
            ..StoredCatalog::default()
        })
    }

    fn durable(&self, _lsn: Lsn) -> Option<DurableFuture> {
        // Nothing here is ever durable, and nothing waits for it to be.
        None
    }

    fn last_applied(&self) -> Lsn {
        Lsn::ZERO
    }

    fn failure(&self) -> Option<StorageError> {
        None
    }

    fn reads_may_block(&self) -> bool {
        false
    }
}

/// One collection's part of a shard: documents, their terms records, and index entries in
/// the byte layout of [`index_keys`] (without a prefix).
#[derive(Debug, Default)]
struct Collection {
    docs: BTreeMap<DocKey, Arc<StoredDocument>>,
    terms: HashMap<DocKey, StoredTerms>,
    entries: BTreeMap<EntryKey, [u8; 2]>,
    /// The change log's records, by position (appended in increasing order). A write's
    /// record shares its body with the document it wrote.
    log: VecDeque<(u64, LogRecord)>,
    /// One past the highest position removed from `log`.
    log_floor: u64,
}

impl Collection {
    /// Removes the `n` oldest log records; returns the bytes they held.
    fn drop_log_front(&mut self, n: usize) -> usize {
        if let Some(&(seq, _)) = n.checked_sub(1).and_then(|last| self.log.get(last)) {
            self.log_floor = self.log_floor.max(seq + 1);
        }
        self.log.drain(..n).map(|(_, r)| record_bytes(&r)).sum()
    }

    /// Bytes its log holds.
    fn log_bytes(&self) -> usize {
        self.log.iter().map(|(_, r)| record_bytes(r)).sum()
    }
}

/// What a kept record costs: its body counted whole, since the record keeps it once the
/// document it shares it with is gone.
fn record_bytes(record: &LogRecord) -> usize {
    record.len() + RECORD_OVERHEAD
}

/// Removes the shard's oldest records (of whichever collection holds the oldest) until its
/// log holds at most `cap` bytes, keeping the newest record.
fn enforce_feed_cap(
    collections: &mut HashMap<CollectionUid, Collection>,
    held: &mut usize,
    cap: usize,
) {
    while *held > cap {
        let oldest = collections
            .iter_mut()
            .filter_map(|(_, c)| Some((c.log.front()?.0, c)))
            .min_by_key(|(seq, _)| *seq);
        match oldest {
            // The newest record stays, whatever its size.
            Some((_, c)) if *held > c.log.front().map_or(0, |(_, r)| record_bytes(r)) => {
                *held -= c.drop_log_front(1);
            }
            _ => break,
        }
    }
}

impl Collection {
    /// Replaces a document's index entries (`update.old` → `update.new`) and its terms record.
    fn write_index(&mut self, key: &DocKey, version: u64, update: IndexUpdate<'_>) {
        let (removed, added) = index_keys::changed_terms(update.old, update.new);
        self.remove_entries(&removed, key);
        for term in added {
            self.entries.insert(
                EntryKey::new(&index_keys::entry_key(&[], term, key)),
                index_keys::entry_value(term),
            );
        }
        if update.new.is_empty() {
            self.terms.remove(key);
        } else {
            self.terms.insert(
                key.clone(),
                StoredTerms {
                    version,
                    terms: update.new.to_vec(),
                },
            );
        }
    }

    fn remove_entries(&mut self, terms: &[&Term], key: &DocKey) {
        for term in terms {
            self.entries
                .remove(&EntryKey::new(&index_keys::entry_key(&[], term, key)));
        }
    }
}

/// The documents of one engine shard. Writes come under that shard's engine lock; reads may
/// come alongside them, so the maps have a lock of their own (held for map operations only).
#[derive(Debug, Default)]
struct MemoryShard {
    collections: Mutex<HashMap<CollectionUid, Collection>>,
    /// The highest log position appended.
    last_log_seq: AtomicU64,
    /// Bytes of log records kept (see [`MemoryStorage::with_feed_cap`]).
    feed_cap: usize,
    /// Bytes of log records held (changed under the `collections` lock).
    log_bytes: AtomicUsize,
}

impl ShardStore for MemoryShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        let mut collections = self.collections.lock();
        for write in batch.writes {
            match *write {
                DocumentWrite::Put { doc, index, .. } => {
                    let c = collections.entry(doc.collection).or_default();
                    c.docs.insert(doc.key.clone(), doc.clone());
                    if let Some(update) = index {
                        c.write_index(&doc.key, doc.version, update);
                    }
                }
                DocumentWrite::Index {
                    collection,
                    key,
                    version,
                    update,
                } => {
                    collections
                        .entry(collection)
                        .or_default()
                        .write_index(key, version, update);
                }
                DocumentWrite::Delete {
                    collection,
                    key,
                    terms,
                } => {
                    if let Some(c) = collections.get_mut(&collection) {
                        c.docs.remove(key);
                        c.terms.remove(key);
                        c.remove_entries(&terms.iter().collect::<Vec<_>>(), key);
                    }
                }
                // Nothing here outlives the process: the engine's tables are the only copy
                // a memory server needs (of remembered requests, and of log positions).
                DocumentWrite::Remember { .. }
                | DocumentWrite::Forget { .. }
                | DocumentWrite::ExpiryLogged { .. } => {}
                DocumentWrite::Append {
                    collection,
                    seq,
                    record,
                } => {
                    let last = self.last_log_seq.fetch_max(seq, Ordering::Relaxed);
                    debug_assert!(seq > last, "log positions increase");
                    let record = record.clone();
                    let mut held = self.log_bytes.load(Ordering::Relaxed) + record_bytes(&record);
                    collections
                        .entry(collection)
                        .or_default()
                        .log
                        .push_back((seq, record));
                    enforce_feed_cap(&mut collections, &mut held, self.feed_cap);
                    self.log_bytes.store(held, Ordering::Relaxed);
                }
            }
        }
        Ok(Lsn::ZERO)
    }

    fn durable(&self, _lsn: Lsn) -> Option<DurableFuture> {
        None
    }

    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        for doc in self
            .collections
            .lock()
            .values()
            .flat_map(|c| c.docs.values())
        {
            each(StoredMeta::of(doc));
        }
        Ok(())
    }

    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        Ok(self
            .collections
            .lock()
            .get(&collection)
            .and_then(|c| c.docs.get(key))
            .cloned())
    }

    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        for (uid, c) in self.collections.lock().iter() {
            for (key, terms) in &c.terms {
                each(*uid, key.clone(), terms.clone());
            }
        }
        Ok(())
    }

    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        Ok(self
            .collections
            .lock()
            .get(&collection)
            .and_then(|c| c.terms.get(key))
            .cloned())
    }

    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        let collections = self.collections.lock();
        let Some(c) = collections.get(&collection) else {
            return Ok(Vec::new());
        };
        let bounds = index_keys::scan_bounds(&[], &range);
        if index_keys::is_empty(&bounds) {
            return Ok(Vec::new());
        }
        let bound = |b: Bound<Vec<u8>>| b.map(|b| EntryKey::new(&b));
        let mut buf = Vec::new();
        let mut decode = |(k, v): (&EntryKey, &[u8; 2])| {
            k.write_to(&mut buf);
            index_keys::decode_entry(0, &buf, v)
        };
        let entries = c.entries.range((bound(bounds.0), bound(bounds.1)));
        if range.descending {
            entries.rev().take(limit).map(&mut decode).collect()
        } else {
            entries.take(limit).map(&mut decode).collect()
        }
    }

    fn scan(
        &self,
        collection: CollectionUid,
        range: super::ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        let collections = self.collections.lock();
        let Some(Collection { docs, .. }) = collections.get(&collection) else {
            return Ok(Vec::new());
        };
        Ok(match range {
            super::ScanRange::Collection { after } => {
                let start = after.map_or(Bound::Unbounded, Bound::Excluded);
                docs.range((start, Bound::Unbounded))
                    .take(limit)
                    .map(|(_, d)| d.clone())
                    .collect()
            }
            super::ScanRange::Partition {
                partition_key,
                after,
            } => {
                let start = partition_start(partition_key, after);
                docs.range((start, Bound::Unbounded))
                    .take_while(|(k, _)| k.partition_key == *partition_key)
                    .take(limit)
                    .map(|(_, d)| d.clone())
                    .collect()
            }
        })
    }

    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        let mut collections = self.collections.lock();
        let dropped = collections.remove(&collection);
        if let Some(c) = &dropped {
            self.log_bytes.fetch_sub(c.log_bytes(), Ordering::Relaxed);
        }
        drop(collections);
        // Free the documents after releasing the lock.
        drop(dropped);
        Ok(())
    }

    fn change_log(&self) -> &dyn ChangeLog {
        self
    }
}

impl ChangeLog for MemoryShard {
    fn read_log(
        &self,
        collection: CollectionUid,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogRecord)>, StorageError> {
        let collections = self.collections.lock();
        let Some(c) = collections.get(&collection) else {
            return Ok(Vec::new());
        };
        let start = c.log.partition_point(|(seq, _)| *seq < from);
        Ok(c.log.range(start..).take(limit).cloned().collect())
    }

    fn last_log_seq(&self) -> Result<u64, StorageError> {
        Ok(self.last_log_seq.load(Ordering::Relaxed))
    }

    fn trim_log(
        &self,
        collection: CollectionUid,
        below: u64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let mut collections = self.collections.lock();
        let Some(c) = collections.get_mut(&collection) else {
            return Ok(0);
        };
        let n = c.log.partition_point(|(seq, _)| *seq < below).min(limit);
        let freed = c.drop_log_front(n);
        self.log_bytes.fetch_sub(freed, Ordering::Relaxed);
        Ok(n)
    }

    fn log_floor(&self, collection: CollectionUid) -> Result<u64, StorageError> {
        Ok(self
            .collections
            .lock()
            .get(&collection)
            .map_or(0, |c| c.log_floor))
    }
}

fn partition_start(partition_key: &PartitionKeyValue, after: Option<&DocumentId>) -> Bound<DocKey> {
    match after {
        Some(id) => Bound::Excluded(DocKey {
            partition_key: partition_key.clone(),
            id: id.clone(),
        }),
        None => Bound::Included(DocKey {
            partition_key: partition_key.clone(),
            id: DocumentId::min_value(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn change_log() {
        crate::storage::change_log_tests::check_change_log(&*MemoryStorage::new().shard(0));
    }

    #[test]
    fn log_records_share_the_body_they_were_given() {
        let shard = MemoryShard {
            feed_cap: DEFAULT_FEED_MEMORY_BYTES,
            ..MemoryShard::default()
        };
        let body = Bytes::from(vec![7; 1000]);
        let record = LogRecord {
            head: Bytes::from_static(b"head"),
            body: body.clone(),
        };
        let uid = CollectionUid(1);
        shard
            .write(WriteBatch {
                writes: &[DocumentWrite::Append {
                    collection: uid,
                    seq: 1,
                    record: &record,
                }],
                versions_below: 1,
                keep_floor: false,
                replicated: false,
            })
            .expect("appends");
        let collections = shard.collections.lock();
        let kept = &collections[&uid].log[0].1;
        assert_eq!(kept.body.as_ptr(), body.as_ptr(), "the body is not copied");
        drop(collections);
        let read = shard.read_log(uid, 1, 10).expect("reads");
        assert_eq!(read, vec![(1, record)]);
        assert_eq!(read[0].1.body.as_ptr(), body.as_ptr(), "nor on reading");
    }
}
