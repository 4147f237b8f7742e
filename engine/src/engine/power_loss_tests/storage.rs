//! The storage model: one ordered log of every write, the image of all of it (what reads see)
//! and the image of its synced prefix (what a power cut keeps). Index entries and terms
//! records are kept with the documents they belong to, in the same log entry, so that indexed
//! queries after a crash read what the kept prefix holds.
//!
//! The test never calls `ShardStore::scan` or `ShardStore::drop_collection` (no feed reads,
//! no collection deletion) nor makes the catalog deletes: they are modelled so that the
//! storage is whole, not exercised.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    ops::Bound,
    sync::Arc,
};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::*;
use crate::storage::{
    ChangeLog, DocumentWrite, DurableFuture, IndexEntry, IndexRange, IndexUpdate, LogRecord,
    ScanRange, ShardStore, StorageError, StoredCatalog, StoredDocument, StoredMeta, StoredTerms,
    Term, WriteBatch,
};

/// A bug planted in the storage, for a mutation check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mutation {
    /// None: the storage as it should be.
    None,
    /// Durable waits for document writes resolve at once, unsynced.
    AcknowledgeEarly,
    /// A shard write reports the position before its own.
    PositionOneLow,
    /// The catalog loads every collection without the marks earlier defaults left.
    ForgetExpiredMarks,
    /// Index entries and terms records are applied to what reads see but never made
    /// durable: a power cut keeps documents without their entries.
    IndexNotDurable,
    /// Change log records are applied to what reads see but never made durable: a power cut
    /// keeps changes without their events.
    LogNotDurable,
}

/// What a crash keeps of the log.
#[derive(Debug, Clone, Copy)]
pub(super) enum Crash {
    /// A power cut: the synced prefix.
    PowerCut,
    /// The process is killed and the page cache survives: every applied write.
    ProcessKill,
}

/// One logged write, owned: what a power cut keeps or loses as a whole.
#[derive(Debug, Clone)]
enum Entry {
    Documents {
        shard: usize,
        writes: Vec<LoggedWrite>,
        versions_below: u64,
        keep_floor: bool,
    },
    DropCollection {
        shard: usize,
        collection: CollectionUid,
    },
    /// Change log records removed by retention: exactly these positions.
    TrimLog {
        shard: usize,
        collection: CollectionUid,
        seqs: Vec<u64>,
    },
    Catalog(LoggedChange),
}

#[derive(Debug, Clone)]
enum LoggedWrite {
    /// A document, with the change to its index entries if the write makes one, and the
    /// position of its change log record.
    Put(Arc<StoredDocument>, Option<LoggedIndex>, u64),
    /// A document's expiry logged at a position.
    ExpiryLogged(CollectionUid, DocKey, u64),
    /// A document's index entries alone (the background indexer's write).
    Index {
        collection: CollectionUid,
        key: DocKey,
        change: LoggedIndex,
    },
    /// A document removed, with the entries of these terms.
    Delete(CollectionUid, DocKey, Vec<Term>),
    /// A change log record at a position.
    Append(CollectionUid, u64, Bytes),
}

/// An [`IndexUpdate`], owned, with the document version its new terms were computed from.
#[derive(Debug, Clone)]
struct LoggedIndex {
    version: u64,
    old: Vec<Term>,
    new: Vec<Term>,
}

impl LoggedIndex {
    fn new(version: u64, update: IndexUpdate<'_>) -> Self {
        LoggedIndex {
            version,
            old: update.old.to_vec(),
            new: update.new.to_vec(),
        }
    }
}

#[derive(Debug, Clone)]
enum LoggedChange {
    PutDatabase(DatabaseId),
    DeleteDatabase {
        database: DatabaseId,
        versions_below: u64,
    },
    PutCollection(CollectionInfo),
    DeleteCollection {
        uid: CollectionUid,
        versions_below: u64,
    },
}

/// Every document of one shard, in key order within each collection.
type Documents = BTreeMap<(CollectionUid, DocKey), Arc<StoredDocument>>;

/// One shard's part of a store.
#[derive(Debug, Clone, Default)]
struct ShardImage {
    docs: Documents,
    terms: BTreeMap<(CollectionUid, DocKey), StoredTerms>,
    /// Each collection's index entries by the bytes scans order them by: `term | document
    /// key`, the layout the engine's scan bounds are written against.
    entries: BTreeMap<CollectionUid, BTreeMap<Vec<u8>, IndexEntry>>,
    /// Each collection's change log records by position.
    log: BTreeMap<(CollectionUid, u64), Bytes>,
    /// The highest position appended, trimmed or not.
    last_log_seq: u64,
    /// One past the highest position trimmed, per collection.
    log_floors: BTreeMap<CollectionUid, u64>,
    /// Each stored document's latest log position, and whether its expiry is logged.
    positions: BTreeMap<(CollectionUid, DocKey), (u64, bool)>,
}

/// The bytes an index entry sorts by: its term, then the document key in the documents' own
/// order-preserving encoding.
fn entry_bytes(term: &[u8], key: &DocKey) -> Vec<u8> {
    let mut out = term.to_vec();
    key.partition_key.encode_ordered(&mut out);
    out.extend_from_slice(key.id.as_str().as_bytes());
    out
}

impl ShardImage {
    /// Replaces a document's index entries and its terms record, as both backends do.
    fn write_index(&mut self, collection: CollectionUid, key: &DocKey, change: &LoggedIndex) {
        let entries = self.entries.entry(collection).or_default();
        for term in change.old.iter().filter(|t| !change.new.contains(t)) {
            entries.remove(&entry_bytes(term, key));
        }
        for term in change.new.iter().filter(|t| !change.old.contains(t)) {
            let entry = IndexEntry {
                term: term.clone(),
                key: key.clone(),
            };
            entries.insert(entry_bytes(term, key), entry);
        }
        if change.new.is_empty() {
            self.terms.remove(&(collection, key.clone()));
        } else {
            let terms = StoredTerms {
                version: change.version,
                terms: change.new.clone(),
            };
            self.terms.insert((collection, key.clone()), terms);
        }
    }
}

/// The contents of a store after some prefix of the log.
#[derive(Debug, Clone, Default)]
struct Image {
    shards: BTreeMap<usize, ShardImage>,
    databases: BTreeSet<DatabaseId>,
    collections: BTreeMap<CollectionUid, CollectionInfo>,
    last_uid: u64,
    /// The highest version floor recorded: versions handed out before it are below it,
    /// deleted documents' included, so none is reused after a crash.
    versions_below: u64,
}

impl Image {
    /// Applies `entry`; without `index`, its index changes are left out, and without `log`
    /// its change log records.
    fn apply(&mut self, entry: &Entry, index: bool, log: bool) {
        match entry {
            Entry::Documents {
                shard,
                writes,
                versions_below,
                keep_floor,
            } => {
                // As the disk does: only a batch that deletes, or that was handed versions it
                // does not store, records the floor. Versions that stay stored need none,
                // recovery takes the highest stored one.
                if *keep_floor || writes.iter().any(|w| matches!(w, LoggedWrite::Delete(..))) {
                    self.versions_below = self.versions_below.max(*versions_below);
                }
                let image = self.shards.entry(*shard).or_default();
                for write in writes {
                    match write {
                        LoggedWrite::Put(doc, change, seq) => {
                            image
                                .docs
                                .insert((doc.collection, doc.key.clone()), doc.clone());
                            image
                                .positions
                                .insert((doc.collection, doc.key.clone()), (*seq, false));
                            if let Some(change) = change.as_ref().filter(|_| index) {
                                image.write_index(doc.collection, &doc.key, change);
                            }
                        }
                        LoggedWrite::Index {
                            collection,
                            key,
                            change,
                        } => {
                            if index {
                                image.write_index(*collection, key, change);
                            }
                        }
                        LoggedWrite::ExpiryLogged(collection, key, seq) => {
                            image
                                .positions
                                .insert((*collection, key.clone()), (*seq, true));
                        }
                        LoggedWrite::Delete(collection, key, terms) => {
                            image.docs.remove(&(*collection, key.clone()));
                            image.positions.remove(&(*collection, key.clone()));
                            if index {
                                let entries = image.entries.entry(*collection).or_default();
                                for term in terms {
                                    entries.remove(&entry_bytes(term, key));
                                }
                                image.terms.remove(&(*collection, key.clone()));
                            }
                        }
                        LoggedWrite::Append(collection, seq, record) => {
                            if log {
                                image.log.insert((*collection, *seq), record.clone());
                                image.last_log_seq = image.last_log_seq.max(*seq);
                            }
                        }
                    }
                }
            }
            Entry::DropCollection { shard, collection } => {
                if let Some(image) = self.shards.get_mut(shard) {
                    image.docs.retain(|(c, _), _| c != collection);
                    image.terms.retain(|(c, _), _| c != collection);
                    image.entries.remove(collection);
                    image.log.retain(|(c, _), _| c != collection);
                    image.positions.retain(|(c, _), _| c != collection);
                }
            }
            Entry::TrimLog {
                shard,
                collection,
                seqs,
            } => {
                if let Some(image) = self.shards.get_mut(shard) {
                    for seq in seqs {
                        image.log.remove(&(*collection, *seq));
                    }
                    if let Some(&last) = seqs.iter().max() {
                        let floor = image.log_floors.entry(*collection).or_default();
                        *floor = (*floor).max(last + 1);
                    }
                }
            }
            Entry::Catalog(change) => match change {
                LoggedChange::PutDatabase(database) => {
                    self.databases.insert(database.clone());
                }
                LoggedChange::DeleteDatabase {
                    database,
                    versions_below,
                } => {
                    self.databases.remove(database);
                    self.collections
                        .retain(|_, info| info.database != *database);
                    self.versions_below = self.versions_below.max(*versions_below);
                }
                LoggedChange::PutCollection(info) => {
                    self.last_uid = self.last_uid.max(info.uid.0);
                    self.collections.insert(info.uid, info.clone());
                }
                LoggedChange::DeleteCollection {
                    uid,
                    versions_below,
                } => {
                    self.collections.remove(uid);
                    self.versions_below = self.versions_below.max(*versions_below);
                }
            },
        }
    }
}

/// The log: what is synced (`durable`), what is applied (`volatile`) and the entries between.
#[derive(Debug)]
struct Log {
    durable: Image,
    volatile: Image,
    /// Entries after `synced`, in position order.
    unsynced: VecDeque<(u64, Entry)>,
    /// Position of the latest write.
    last: u64,
    /// Every write at or before this position is durable.
    synced: u64,
    /// Whether index changes become durable (not under [`Mutation::IndexNotDurable`]).
    durable_index: bool,
    /// Whether change log records become durable (not under [`Mutation::LogNotDurable`]).
    durable_log: bool,
}

impl Log {
    fn append(&mut self, entry: Entry) -> Lsn {
        self.last += 1;
        self.volatile.apply(&entry, true, true);
        self.unsynced.push_back((self.last, entry));
        Lsn(self.last)
    }

    fn sync_to(&mut self, lsn: u64) {
        let to = lsn.min(self.last);
        while let Some((at, _)) = self.unsynced.front()
            && *at <= to
        {
            if let Some((_, entry)) = self.unsynced.pop_front() {
                self.durable
                    .apply(&entry, self.durable_index, self.durable_log);
            }
        }
        self.synced = self.synced.max(to);
    }
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Log>,
    /// Publishes the synced position, for durable waits to watch.
    synced_tx: watch::Sender<u64>,
    mutation: Mutation,
}

impl Shared {
    fn append(&self, entry: Entry) -> Lsn {
        self.log.lock().append(entry)
    }

    fn sync_to(&self, lsn: u64) {
        let synced = {
            let mut log = self.log.lock();
            log.sync_to(lsn);
            log.synced
        };
        self.synced_tx.send_replace(synced);
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        let catalog = {
            let log = self.log.lock();
            if lsn.0 <= log.synced {
                return None;
            }
            log.unsynced
                .iter()
                .any(|(at, entry)| *at == lsn.0 && matches!(entry, Entry::Catalog(_)))
        };
        if catalog {
            // Catalog changes wait on a blocking `block_on` with nobody to sync for them: they
            // sync the log up to themselves at once, as a group commit would.
            self.sync_to(lsn.0);
            return None;
        }
        if self.mutation == Mutation::AcknowledgeEarly {
            return None;
        }
        let mut synced = self.synced_tx.subscribe();
        Some(Box::pin(async move {
            synced
                .wait_for(|&at| at >= lsn.0)
                .await
                .map(|_| ())
                .map_err(|_| StorageError::new("the power went before this write was synced"))
        }))
    }
}

/// A store whose durability the test controls, and which a crash can take back to a prefix of
/// its log. Clones share the store.
#[derive(Debug, Clone)]
pub(super) struct PowerLossStorage {
    shared: Arc<Shared>,
}

impl PowerLossStorage {
    /// An empty store, with `mutation` planted.
    pub(super) fn new(mutation: Mutation) -> Self {
        Self::holding(Image::default(), mutation)
    }

    /// A store holding `image`, all of it durable, its positions counted from 0 as the disk's
    /// are at each open. Nothing compares a position from before a crash with one after it:
    /// the engine is new, and the model's histories restart at the crash.
    fn holding(image: Image, mutation: Mutation) -> Self {
        PowerLossStorage {
            shared: Arc::new(Shared {
                log: Mutex::new(Log {
                    durable: image.clone(),
                    volatile: image,
                    unsynced: VecDeque::new(),
                    last: 0,
                    synced: 0,
                    durable_index: mutation != Mutation::IndexNotDurable,
                    durable_log: mutation != Mutation::LogNotDurable,
                }),
                synced_tx: watch::Sender::new(0),
                mutation,
            }),
        }
    }

    /// Makes every write at or before `lsn` durable.
    pub(super) fn sync_to(&self, lsn: Lsn) {
        self.shared.sync_to(lsn.0);
    }

    pub(super) fn synced(&self) -> Lsn {
        Lsn(self.shared.log.lock().synced)
    }

    /// The store after a crash, and the last position of the log it keeps.
    pub(super) fn crash(&self, crash: Crash) -> (PowerLossStorage, Lsn) {
        let log = self.shared.log.lock();
        let (image, kept) = match crash {
            Crash::PowerCut => (&log.durable, log.synced),
            Crash::ProcessKill => (&log.volatile, log.last),
        };
        (
            Self::holding(image.clone(), self.shared.mutation),
            Lsn(kept),
        )
    }
}

impl Storage for PowerLossStorage {
    fn placement(&self) -> crate::engine::Placement {
        crate::engine::Placement::Xxh3
    }

    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        Arc::new(PowerLossShard {
            shared: self.shared.clone(),
            index,
        })
    }

    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        let logged = match change {
            CatalogChange::PutDatabase(database) => LoggedChange::PutDatabase(database.clone()),
            CatalogChange::DeleteDatabase {
                database,
                versions_below,
                ..
            } => LoggedChange::DeleteDatabase {
                database: database.clone(),
                versions_below,
            },
            CatalogChange::PutCollection(info) => LoggedChange::PutCollection(info.clone()),
            CatalogChange::DeleteCollection {
                info,
                versions_below,
            } => LoggedChange::DeleteCollection {
                uid: info.uid,
                versions_below,
            },
        };
        Ok(self.shared.append(Entry::Catalog(logged)))
    }

    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        let log = self.shared.log.lock();
        let image = &log.volatile;
        let forget_marks = self.shared.mutation == Mutation::ForgetExpiredMarks;
        Ok(StoredCatalog {
            databases: image.databases.iter().cloned().collect(),
            collections: image
                .collections
                .values()
                .map(|info| CollectionInfo {
                    expired: if forget_marks {
                        ExpiredThrough::default()
                    } else {
                        info.expired
                    },
                    ..info.clone()
                })
                .collect(),
            last_uid: image.last_uid,
            versions_below: image.versions_below,
            // Keeps no database records beyond their ids (the trait's default).
            database_throughputs: Vec::new(),
        })
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.shared.durable(lsn)
    }

    fn last_applied(&self) -> Lsn {
        Lsn(self.shared.log.lock().last)
    }

    /// The model never fails: a crash is the only fault it knows.
    fn failure(&self) -> Option<StorageError> {
        None
    }
}

#[derive(Debug)]
struct PowerLossShard {
    shared: Arc<Shared>,
    index: usize,
}

impl PowerLossShard {
    /// `read` of this shard's part of what is applied (the empty part if nothing is).
    fn applied<T>(&self, read: impl FnOnce(&ShardImage) -> T) -> T {
        let log = self.shared.log.lock();
        match log.volatile.shards.get(&self.index) {
            Some(image) => read(image),
            None => read(&ShardImage::default()),
        }
    }
}

impl ShardStore for PowerLossShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        let writes = batch
            .writes
            .iter()
            .filter_map(|write| {
                Some(match *write {
                    DocumentWrite::Put { doc, index, seq } => LoggedWrite::Put(
                        doc.clone(),
                        index.map(|update| LoggedIndex::new(doc.version, update)),
                        seq,
                    ),
                    DocumentWrite::ExpiryLogged {
                        collection,
                        key,
                        seq,
                        ..
                    } => LoggedWrite::ExpiryLogged(collection, key.clone(), seq),
                    DocumentWrite::Index {
                        collection,
                        key,
                        version,
                        update,
                    } => LoggedWrite::Index {
                        collection,
                        key: key.clone(),
                        change: LoggedIndex::new(version, update),
                    },
                    DocumentWrite::Delete {
                        collection,
                        key,
                        terms,
                    } => LoggedWrite::Delete(collection, key.clone(), terms.to_vec()),
                    DocumentWrite::Append {
                        collection,
                        seq,
                        record,
                    } => LoggedWrite::Append(collection, seq, record.to_bytes()),
                    // The model checks documents and their index; remembered requests ride in
                    // the same batches and are tested against the disk backend.
                    DocumentWrite::Remember { .. } | DocumentWrite::Forget { .. } => return None,
                })
            })
            .collect();
        let lsn = self.shared.append(Entry::Documents {
            shard: self.index,
            writes,
            versions_below: batch.versions_below,
            keep_floor: batch.keep_floor,
        });
        Ok(match self.shared.mutation {
            Mutation::PositionOneLow => Lsn(lsn.0 - 1),
            _ => lsn,
        })
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.shared.durable(lsn)
    }

    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        let terms: Vec<((CollectionUid, DocKey), StoredTerms)> = self.applied(|image| {
            image
                .terms
                .iter()
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect()
        });
        for ((collection, key), stored) in terms {
            each(collection, key, stored);
        }
        Ok(())
    }

    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        Ok(self.applied(|image| image.terms.get(&(collection, key.clone())).cloned()))
    }

    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        let log = self.shared.log.lock();
        let Some(entries) = log
            .volatile
            .shards
            .get(&self.index)
            .and_then(|image| image.entries.get(&collection))
        else {
            return Ok(Vec::new());
        };
        let high = match range.high {
            Some(high) if high <= range.low => return Ok(Vec::new()),
            Some(high) => Bound::Excluded(high.to_vec()),
            None => Bound::Unbounded,
        };
        let within = entries.range((Bound::Included(range.low.to_vec()), high));
        let after = range.after.map(|a| entry_bytes(&a.term, &a.key));
        let past_after = |k: &Vec<u8>, descending: bool| match &after {
            None => true,
            Some(a) if descending => k < a,
            Some(a) => k > a,
        };
        let found: Vec<IndexEntry> = if range.descending {
            within
                .rev()
                .filter(|(k, _)| past_after(k, true))
                .take(limit)
                .map(|(_, e)| e.clone())
                .collect()
        } else {
            within
                .filter(|(k, _)| past_after(k, false))
                .take(limit)
                .map(|(_, e)| e.clone())
                .collect()
        };
        Ok(found)
    }

    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        let docs: Vec<StoredMeta> = self.applied(|image| {
            image
                .docs
                .iter()
                .map(|(at, doc)| {
                    let (seq, expiry_logged) = image.positions.get(at).copied().unwrap_or_default();
                    StoredMeta {
                        seq,
                        expiry_logged,
                        ..StoredMeta::of(doc)
                    }
                })
                .collect()
        });
        for doc in docs {
            each(doc);
        }
        Ok(())
    }

    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        Ok(self.applied(|image| image.docs.get(&(collection, key.clone())).cloned()))
    }

    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        let log = self.shared.log.lock();
        let Some(docs) = log
            .volatile
            .shards
            .get(&self.index)
            .map(|image| &image.docs)
        else {
            return Ok(Vec::new());
        };
        let in_range = |key: &DocKey| match range {
            ScanRange::Collection { after } => after.is_none_or(|a| key > a),
            ScanRange::Partition {
                partition_key,
                after,
            } => key.partition_key == *partition_key && after.is_none_or(|a| key.id > *a),
        };
        Ok(docs
            .iter()
            .filter(|((c, key), _)| *c == collection && in_range(key))
            .take(limit)
            .map(|(_, doc)| doc.clone())
            .collect())
    }

    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        self.shared.append(Entry::DropCollection {
            shard: self.index,
            collection,
        });
        Ok(())
    }

    fn change_log(&self) -> &dyn ChangeLog {
        self
    }
}

impl ChangeLog for PowerLossShard {
    fn read_log(
        &self,
        collection: CollectionUid,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogRecord)>, StorageError> {
        Ok(self.applied(|image| {
            image
                .log
                .range((collection, from)..=(collection, u64::MAX))
                .take(limit)
                .map(|(&(_, seq), record)| (seq, LogRecord::whole(record.clone())))
                .collect()
        }))
    }

    fn last_log_seq(&self) -> Result<u64, StorageError> {
        Ok(self.applied(|image| image.last_log_seq))
    }

    fn log_floor(&self, collection: CollectionUid) -> Result<u64, StorageError> {
        Ok(self.applied(|image| image.log_floors.get(&collection).copied().unwrap_or(0)))
    }

    fn trim_log(
        &self,
        collection: CollectionUid,
        below: u64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let seqs: Vec<u64> = self.applied(|image| {
            image
                .log
                .range((collection, 0)..(collection, below))
                .take(limit)
                .map(|(&(_, seq), _)| seq)
                .collect()
        });
        let n = seqs.len();
        if n > 0 {
            self.shared.append(Entry::TrimLog {
                shard: self.index,
                collection,
                seqs,
            });
        }
        Ok(n)
    }
}
