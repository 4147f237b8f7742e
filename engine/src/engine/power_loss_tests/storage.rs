//! The storage model: one ordered log of every write, the image of all of it (what reads see)
//! and the image of its synced prefix (what a power cut keeps).
//!
//! The test never calls `ShardStore::scan` or `ShardStore::drop_collection` (no feed reads,
//! no collection deletion) nor makes the catalog deletes: they are modelled so that the
//! storage is whole, not exercised.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::Arc,
};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::*;
use crate::storage::{
    DocumentWrite, DurableFuture, ScanRange, ShardStore, StorageError, StoredCatalog,
    StoredDocument, StoredMeta, WriteBatch,
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
    },
    DropCollection {
        shard: usize,
        collection: CollectionUid,
    },
    Catalog(LoggedChange),
}

#[derive(Debug, Clone)]
enum LoggedWrite {
    Put(Arc<StoredDocument>),
    Delete(CollectionUid, DocKey),
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

/// The contents of a store after some prefix of the log.
#[derive(Debug, Clone, Default)]
struct Image {
    shards: BTreeMap<usize, Documents>,
    databases: BTreeSet<DatabaseId>,
    collections: BTreeMap<CollectionUid, CollectionInfo>,
    last_uid: u64,
    /// The highest version floor recorded: versions handed out before it are below it,
    /// deleted documents' included, so none is reused after a crash.
    versions_below: u64,
}

impl Image {
    fn apply(&mut self, entry: &Entry) {
        match entry {
            Entry::Documents {
                shard,
                writes,
                versions_below,
            } => {
                // As the disk does: only a batch that deletes records the floor. Versions that
                // stay stored need none, recovery takes the highest stored one.
                if writes.iter().any(|w| matches!(w, LoggedWrite::Delete(..))) {
                    self.versions_below = self.versions_below.max(*versions_below);
                }
                let docs = self.shards.entry(*shard).or_default();
                for write in writes {
                    match write {
                        LoggedWrite::Put(doc) => {
                            docs.insert((doc.collection, doc.key.clone()), doc.clone());
                        }
                        LoggedWrite::Delete(collection, key) => {
                            docs.remove(&(*collection, key.clone()));
                        }
                    }
                }
            }
            Entry::DropCollection { shard, collection } => {
                if let Some(docs) = self.shards.get_mut(shard) {
                    docs.retain(|(c, _), _| c != collection);
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
}

impl Log {
    fn append(&mut self, entry: Entry) -> Lsn {
        self.last += 1;
        self.volatile.apply(&entry);
        self.unsynced.push_back((self.last, entry));
        Lsn(self.last)
    }

    fn sync_to(&mut self, lsn: u64) {
        let to = lsn.min(self.last);
        while let Some((at, _)) = self.unsynced.front()
            && *at <= to
        {
            if let Some((_, entry)) = self.unsynced.pop_front() {
                self.durable.apply(&entry);
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

impl ShardStore for PowerLossShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        let writes = batch
            .writes
            .iter()
            .filter_map(|write| match *write {
                // The model keeps documents only: index entries are not what it checks.
                DocumentWrite::Put { doc, .. } => Some(LoggedWrite::Put(doc.clone())),
                DocumentWrite::Index { .. } => None,
                DocumentWrite::Delete {
                    collection, key, ..
                } => Some(LoggedWrite::Delete(collection, key.clone())),
            })
            .collect();
        let lsn = self.shared.append(Entry::Documents {
            shard: self.index,
            writes,
            versions_below: batch.versions_below,
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
        _each: &mut dyn FnMut(CollectionUid, DocKey, crate::storage::StoredTerms),
    ) -> Result<(), StorageError> {
        Ok(())
    }

    fn get_terms(
        &self,
        _collection: CollectionUid,
        _key: &DocKey,
    ) -> Result<Option<crate::storage::StoredTerms>, StorageError> {
        Ok(None)
    }

    fn scan_index(
        &self,
        _collection: CollectionUid,
        _range: crate::storage::IndexRange<'_>,
        _limit: usize,
    ) -> Result<Vec<crate::storage::IndexEntry>, StorageError> {
        Ok(Vec::new())
    }

    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        let docs: Vec<Arc<StoredDocument>> = self
            .shared
            .log
            .lock()
            .volatile
            .shards
            .get(&self.index)
            .map(|docs| docs.values().cloned().collect())
            .unwrap_or_default();
        for doc in docs {
            each(StoredMeta {
                collection: doc.collection,
                key: doc.key.clone(),
                last_write: doc.last_write,
                version: doc.version,
                ttl: doc.ttl,
            });
        }
        Ok(())
    }

    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        Ok(self
            .shared
            .log
            .lock()
            .volatile
            .shards
            .get(&self.index)
            .and_then(|docs| docs.get(&(collection, key.clone())))
            .cloned())
    }

    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        let log = self.shared.log.lock();
        let Some(docs) = log.volatile.shards.get(&self.index) else {
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
}
