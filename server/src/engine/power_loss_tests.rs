//! A power-loss model of durability, in the spirit of redb's and FoundationDB's crash tests.
//!
//! [`PowerLossStorage`] keeps every write (document batches and catalog changes alike) in one
//! ordered log, each at its own position, and applies it to a volatile image at once. The
//! test decides when the log is synced, and only a sync makes a durable wait resolve.
//! [`PowerLossStorage::crash`] keeps exactly the synced prefix of the log, as a power cut
//! would, and the engine is reopened over it with [`Engine::open`].
//!
//! A random sequence of document operations, clock advances, settings changes, purges, syncs
//! and crashes runs against a reference model of the TTL rules (SPEC §2-4). The model knows,
//! per document, which writes were acknowledged (their outcome settled) and checks that those
//! survive every crash, that an expired version is never read again, and that no etag a client
//! may have seen is ever handed out again. The same property run over a storage that resolves
//! durable waits before syncing must fail: that shows the model sees an early acknowledgement.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet, VecDeque},
    future::Future,
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use parking_lot::Mutex;
use proptest::{
    collection::vec,
    prelude::*,
    sample::select,
    test_runner::{TestCaseError, TestError, TestRunner},
};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::*;
use crate::storage::{
    DocumentWrite, DurableFuture, ScanRange, ShardStore, StorageError, StoredCatalog,
    StoredDocument, StoredMeta, WriteBatch,
};

const T0: Millis = 1_790_000_000_000;
const SHARDS: usize = 4;
/// Document ids per partition.
const IDS: usize = 6;
const PARTITIONS: [&str; 2] = ["a", "b"];
/// Every document address the test uses: `IDS` ids in each partition.
const KEYS: usize = IDS * PARTITIONS.len();
/// A settle whose position is synced completes at once; this only turns a hang into a failure.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

// ---- The storage model ----

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
    /// The highest version floor any applied write or deletion recorded: versions handed out
    /// before are below it, deleted documents' included, so none is reused after a crash.
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
                self.versions_below = self.versions_below.max(*versions_below);
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
    /// The synced position, for durable waits to watch.
    synced: watch::Sender<u64>,
    /// The mutation: durable waits for document writes resolve at once, unsynced.
    acknowledge_early: bool,
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
        self.synced.send_replace(synced);
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
        if self.acknowledge_early {
            return None;
        }
        let mut synced = self.synced.subscribe();
        Some(Box::pin(async move {
            synced
                .wait_for(|&at| at >= lsn.0)
                .await
                .map(|_| ())
                .map_err(|_| StorageError::new("the power went before this write was synced"))
        }))
    }
}

/// A store whose durability the test controls, and which a power cut can take back to its
/// last sync. Clones share the store.
#[derive(Debug, Clone)]
struct PowerLossStorage {
    shared: Arc<Shared>,
}

impl PowerLossStorage {
    /// An empty store. With `acknowledge_early`, a durable wait for document writes resolves
    /// without syncing: the bug the mutation check plants.
    fn new(acknowledge_early: bool) -> Self {
        Self::holding(Image::default(), 0, acknowledge_early)
    }

    /// A store holding `image`, all of it durable, whose next write goes after `last`.
    fn holding(image: Image, last: u64, acknowledge_early: bool) -> Self {
        PowerLossStorage {
            shared: Arc::new(Shared {
                log: Mutex::new(Log {
                    durable: image.clone(),
                    volatile: image,
                    unsynced: VecDeque::new(),
                    last,
                    synced: last,
                }),
                synced: watch::Sender::new(last),
                acknowledge_early,
            }),
        }
    }

    /// Makes every write at or before `lsn` durable.
    fn sync_to(&self, lsn: Lsn) {
        self.shared.sync_to(lsn.0);
    }

    fn synced(&self) -> Lsn {
        Lsn(self.shared.log.lock().synced)
    }

    /// The store after a power cut: the synced prefix of the log, nothing else. Positions
    /// carry on after the last one handed out.
    fn crash(&self) -> PowerLossStorage {
        let log = self.shared.log.lock();
        Self::holding(log.durable.clone(), log.last, self.shared.acknowledge_early)
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
        Ok(StoredCatalog {
            databases: image.databases.iter().cloned().collect(),
            collections: image.collections.values().cloned().collect(),
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

    /// The model never fails: a power cut is the only fault it knows.
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
            .map(|write| match *write {
                DocumentWrite::Put(doc) => LoggedWrite::Put(doc.clone()),
                DocumentWrite::Delete { collection, key } => {
                    LoggedWrite::Delete(collection, key.clone())
                }
            })
            .collect();
        Ok(self.shared.append(Entry::Documents {
            shard: self.index,
            writes,
            versions_below: batch.versions_below,
        }))
    }

    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.shared.durable(lsn)
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

// ---- Operations ----

/// When the expiry rebuild runs after a restart. A server serves while it runs in the
/// background, and settings changes wait for it.
#[derive(Debug, Clone, Copy)]
enum Rebuild {
    /// Before anything is read.
    First,
    /// After every address has been read once.
    AfterReads,
    /// Before the next settings change (as the catalog lock makes it): document operations
    /// and purges run meanwhile.
    Later,
}

/// Whether, and how, the client of an operation is told its outcome.
#[derive(Debug, Clone, Copy)]
enum Ack {
    /// Sync the log up to the outcome's position, then settle: the client is told.
    SyncThenSettle,
    /// Settle only if that completes at once, i.e. the log is already synced far enough.
    TrySettle,
    /// Never settled: the client never hears back (a timeout, a dropped connection).
    Drop,
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Upsert {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Replace {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Delete {
        key: usize,
        ack: Ack,
    },
    Touch {
        key: usize,
        ack: Ack,
    },
    Read {
        key: usize,
        ack: Ack,
    },
    /// Moves the clock forward by this many milliseconds.
    Advance(Millis),
    /// Replaces the collection's default TTL (raw: absent = Off, -1, n).
    SetDefault(Option<i64>),
    /// One purge batch on every shard; its deletes are forgotten once the log is synced.
    Purge,
    /// Syncs this many thousandths of the unsynced log.
    Sync {
        permille: u64,
    },
    /// A power cut, then a restart.
    Crash {
        rebuild: Rebuild,
    },
}

fn ack() -> impl Strategy<Value = Ack> {
    prop_oneof![
        2 => Just(Ack::SyncThenSettle),
        2 => Just(Ack::TrySettle),
        1 => Just(Ack::Drop),
    ]
}

fn own_ttl() -> impl Strategy<Value = Option<i64>> {
    select(vec![None, None, Some(-1), Some(1), Some(2), Some(5)])
}

fn default_ttl() -> impl Strategy<Value = Option<i64>> {
    select(vec![None, Some(-1), Some(1), Some(3), Some(10)])
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Create { key, ttl, ack }),
        4 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Upsert { key, ttl, ack }),
        2 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Replace { key, ttl, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Delete { key, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Touch { key, ack }),
        3 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Read { key, ack }),
        4 => select(vec![1, 500, 999, 1_000, 1_001, 2_000, 5_000]).prop_map(Op::Advance),
        1 => default_ttl().prop_map(Op::SetDefault),
        1 => Just(Op::Purge),
        2 => prop_oneof![Just(1_000), 0..1_000u64].prop_map(|permille| Op::Sync { permille }),
        1 => select(vec![Rebuild::First, Rebuild::AfterReads, Rebuild::Later])
            .prop_map(|rebuild| Op::Crash { rebuild }),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    vec(op(), 20..=80)
}

fn doc_key(key: usize) -> DocKey {
    DocKey {
        partition_key: PartitionKeyValue::String(PARTITIONS[key / IDS].into()),
        id: ResourceId::parse(IdKind::Document, &format!("d{}", key % IDS)).expect("valid id"),
    }
}

/// A body for `key`; `serial` makes every write's body distinct.
fn body(key: usize, ttl: Option<i64>, serial: u64) -> DocumentBody {
    let mut map = Map::new();
    map.insert("id".into(), json!(format!("d{}", key % IDS)));
    map.insert("pk".into(), json!(PARTITIONS[key / IDS]));
    map.insert("n".into(), json!(serial));
    if let Some(ttl) = ttl {
        map.insert("ttl".into(), Value::from(ttl));
    }
    DocumentBody::parse(Arc::new(map), None).expect("valid body")
}

fn raw_ttl(ttl: Option<DocumentTtl>) -> Option<i64> {
    ttl.map(|t| i64::from(t.to_raw()))
}

/// Polls a future once: its output if it completes without waiting.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

/// `error` with what was being done in front of its message.
fn context(error: TestCaseError, what: impl std::fmt::Display) -> TestCaseError {
    match error {
        TestCaseError::Fail(reason) => fail(format!("{what}: {}", reason.message())),
        reject => reject,
    }
}

// ---- The reference model ----

/// When a version expires (SPEC §3), written independently of the engine's rules: `None` =
/// never. Raw TTLs: default absent = Off, -1 = on without a default, n; own -1 = never, m.
fn expiry(last_write: Millis, own: Option<i64>, default: Option<i64>) -> Option<Millis> {
    let seconds = match (default, own) {
        (None, _) | (_, Some(-1)) | (Some(-1), None) => return None,
        (_, Some(m)) => m,
        (Some(n), None) => n,
    };
    Some(last_write + seconds.unsigned_abs() * 1_000)
}

/// One version ever written.
#[derive(Debug)]
struct Version {
    etag: u64,
    last_write: Millis,
    ttl: Option<i64>,
    body: Bytes,
    /// Expired at some instant under the default in force then: final.
    expired: bool,
}

/// What a document address went through since the last restart. States are version indices,
/// `None` = absent.
#[derive(Debug, Default, Clone)]
struct History {
    /// The state at the last restart: durable.
    base: Option<usize>,
    /// Every write since, with the state it left and whether it was acknowledged.
    writes: Vec<(Option<usize>, bool)>,
}

impl History {
    fn current(&self) -> Option<usize> {
        self.writes.last().map_or(self.base, |&(state, _)| state)
    }

    /// The states a crash may leave: from the last acknowledged write on, or anything since
    /// the restart if none was acknowledged.
    fn survivors(&self) -> Vec<Option<usize>> {
        match self.writes.iter().rposition(|&(_, acked)| acked) {
            Some(i) => self.writes[i..].iter().map(|&(state, _)| state).collect(),
            None => std::iter::once(self.base)
                .chain(self.writes.iter().map(|&(state, _)| state))
                .collect(),
        }
    }
}

#[derive(Debug)]
struct Model {
    /// The collection's default TTL, raw.
    default: Option<i64>,
    versions: Vec<Version>,
    keys: Vec<History>,
    /// Etags a client may have seen, or that survived a crash: never to be handed out again.
    acknowledged_etags: HashSet<u64>,
    /// Etags handed out since the last restart.
    run_etags: HashSet<u64>,
}

impl Model {
    fn new(default: Option<i64>) -> Self {
        Model {
            default,
            versions: Vec::new(),
            keys: vec![History::default(); KEYS],
            acknowledged_etags: HashSet::new(),
            run_etags: HashSet::new(),
        }
    }

    /// Marks every version that is expired at `now` under the current default as expired for
    /// good. Time moves only at advances and defaults change only at settings changes, so
    /// judging after each of them (and after each write) misses no instant under any default.
    /// Overwritten versions are judged too: a crash may bring them back.
    fn judge(&mut self, now: Millis) {
        let default = self.default;
        for v in &mut self.versions {
            if !v.expired && expiry(v.last_write, v.ttl, default).is_some_and(|e| now >= e) {
                v.expired = true;
            }
        }
    }

    fn visible(&self, version: usize, now: Millis) -> bool {
        let v = &self.versions[version];
        !v.expired && expiry(v.last_write, v.ttl, self.default).is_none_or(|e| now < e)
    }

    /// The live version at `key`, before any crash: the engine holds every write applied.
    fn live(&self, key: usize, now: Millis) -> Option<usize> {
        self.keys[key].current().filter(|&v| self.visible(v, now))
    }

    /// Checks a view of version `v` at `key` against the model, under the current default.
    fn check_view(&self, view: &DocumentView, key: usize, v: usize) -> Result<(), TestCaseError> {
        let version = &self.versions[v];
        prop_assert_eq!(&view.key, &doc_key(key));
        prop_assert_eq!(view.etag.0, version.etag);
        prop_assert_eq!(&view.body, &version.body);
        prop_assert_eq!(view.last_write, version.last_write);
        prop_assert_eq!(raw_ttl(view.ttl), version.ttl);
        prop_assert_eq!(
            view.expires_at,
            expiry(version.last_write, version.ttl, self.default)
        );
        Ok(())
    }

    /// Records a write of a new version at `key`, checking what the engine returned.
    fn put(
        &mut self,
        key: usize,
        view: &DocumentView,
        ttl: Option<i64>,
        now: Millis,
    ) -> Result<(), TestCaseError> {
        let etag = view.etag.0;
        prop_assert!(
            !self.acknowledged_etags.contains(&etag),
            "etag {} handed out again although it was acknowledged (or survived a crash) before",
            view.etag
        );
        prop_assert!(
            self.run_etags.insert(etag),
            "etag {} handed out twice since the last restart",
            view.etag
        );
        prop_assert_eq!(&view.key, &doc_key(key));
        prop_assert_eq!(view.last_write, now);
        prop_assert_eq!(raw_ttl(view.ttl), ttl);
        prop_assert_eq!(view.expires_at, expiry(now, ttl, self.default));
        self.versions.push(Version {
            etag,
            last_write: now,
            ttl,
            body: view.body.clone(),
            expired: false,
        });
        self.keys[key]
            .writes
            .push((Some(self.versions.len() - 1), false));
        self.judge(now);
        Ok(())
    }

    fn delete(&mut self, key: usize) {
        self.keys[key].writes.push((None, false));
    }

    /// A client was told an outcome at `key`: the state it reflects, the one the latest write
    /// there left, must survive a crash. A write's own outcome, a read of it, and a NOT_FOUND
    /// or EXISTS that reflects it all settle at (or after) that write's position.
    fn acknowledge(&mut self, key: usize) {
        if let Some((state, acked)) = self.keys[key].writes.last_mut() {
            *acked = true;
            if let Some(v) = *state {
                self.acknowledged_etags.insert(self.versions[v].etag);
            }
        }
    }
}

// ---- The run ----

struct Run {
    clock: Arc<ManualClock>,
    storage: PowerLossStorage,
    engine: Engine,
    path: CollectionPath,
    model: Model,
    /// Purge batches whose deletes wait for a sync.
    purges: Vec<(Arc<Shard>, purge::Undurable)>,
    /// Makes every body distinct.
    serial: u64,
    /// The engine was reopened and its expiry rebuild has not run yet.
    rebuild_pending: bool,
}

impl Run {
    async fn start(default: Option<i64>, acknowledge_early: bool) -> Result<Run, TestCaseError> {
        let clock = Arc::new(ManualClock::new(T0));
        let storage = PowerLossStorage::new(acknowledge_early);
        let (engine, _) = Engine::open(
            EngineConfig { shards: SHARDS },
            Arc::new(storage.clone()),
            clock.clone(),
        )
        .map_err(|e| fail(format!("open: {e}")))?;
        engine.rebuild_expiry();
        let db = ResourceId::parse(IdKind::Database, "db").expect("valid id");
        let collection = ResourceId::parse(IdKind::Collection, "c").expect("valid id");
        engine
            .create_database(db.clone())
            .map_err(|e| fail(format!("create database: {e}")))?;
        let settings = CollectionSettings::new(
            DefaultTtl::from_raw(default).expect("valid default"),
            IndexingMode::Consistent,
        )
        .expect("valid settings");
        engine
            .create_collection(
                &db,
                collection.clone(),
                PartitionKeyPath::parse("/pk").expect("valid path"),
                settings,
            )
            .map_err(|e| fail(format!("create collection: {e}")))?;
        Ok(Run {
            clock,
            storage,
            engine,
            path: CollectionPath {
                database: db,
                collection,
            },
            model: Model::new(default),
            purges: Vec::new(),
            serial: 0,
            rebuild_pending: false,
        })
    }

    /// Tells the client of `outcome` as `ack` says; true if it was told.
    async fn settle<T>(&self, outcome: Outcome<T>, ack: Ack) -> Result<bool, TestCaseError> {
        let settled = match ack {
            Ack::Drop => return Ok(false),
            Ack::TrySettle => match poll_once(self.engine.settle(outcome)) {
                None => return Ok(false),
                Some(result) => result,
            },
            Ack::SyncThenSettle => {
                self.storage.sync_to(outcome.settle_at);
                tokio::time::timeout(SETTLE_TIMEOUT, self.engine.settle(outcome))
                    .await
                    .map_err(|_| fail("settle did not complete although its position was synced"))?
            }
        };
        match settled {
            // The result was checked before settling; only storage errors come from settling.
            Ok(_) | Err(Error::DocumentExists { .. } | Error::DocumentNotFound { .. }) => Ok(true),
            Err(e) => Err(fail(format!("settle failed: {e}"))),
        }
    }

    fn next_body(&mut self, key: usize, ttl: Option<i64>) -> DocumentBody {
        self.serial += 1;
        body(key, ttl, self.serial)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        match *op {
            Op::Create { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self.engine.create_document(&self.path, body, None);
                match (&outcome.result, live) {
                    (Ok(view), None) => self.model.put(key, view, ttl, now)?,
                    (Err(Error::DocumentExists { .. }), Some(_)) => {}
                    (result, live) => {
                        return Err(fail(format!(
                            "create: got {result:?}, the model has live version {live:?}"
                        )));
                    }
                }
                self.told(key, outcome, ack).await
            }
            Op::Upsert { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self.engine.upsert_document(&self.path, body, None, None);
                match &outcome.result {
                    Ok((created, view)) => {
                        let expected = if live.is_some() {
                            UpsertOutcome::Replaced
                        } else {
                            UpsertOutcome::Created
                        };
                        prop_assert_eq!(*created, expected);
                        self.model.put(key, view, ttl, now)?;
                    }
                    Err(e) => return Err(fail(format!("upsert: {e}"))),
                }
                self.told(key, outcome, ack).await
            }
            Op::Replace { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self
                    .engine
                    .replace_document(&self.path, doc_key(key), body, None);
                match (&outcome.result, live) {
                    (Ok(view), Some(_)) => self.model.put(key, view, ttl, now)?,
                    (Err(Error::DocumentNotFound { .. }), None) => {}
                    (result, live) => {
                        return Err(fail(format!(
                            "replace: got {result:?}, the model has live version {live:?}"
                        )));
                    }
                }
                self.told(key, outcome, ack).await
            }
            Op::Delete { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.delete_document(&self.path, &doc_key(key), None);
                match (&outcome.result, live) {
                    (Ok(()), Some(_)) => self.model.delete(key),
                    (Err(Error::DocumentNotFound { .. }), None) => {}
                    (result, live) => {
                        return Err(fail(format!(
                            "delete: got {result:?}, the model has live version {live:?}"
                        )));
                    }
                }
                self.told(key, outcome, ack).await
            }
            Op::Touch { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.touch_document(&self.path, &doc_key(key), None);
                match (&outcome.result, live) {
                    (Ok(view), Some(v)) => {
                        let before = &self.model.versions[v];
                        prop_assert_eq!(&view.body, &before.body, "touch keeps the body");
                        let ttl = before.ttl;
                        self.model.put(key, view, ttl, now)?;
                    }
                    (Err(Error::DocumentNotFound { .. }), None) => {}
                    (result, live) => {
                        return Err(fail(format!(
                            "touch: got {result:?}, the model has live version {live:?}"
                        )));
                    }
                }
                self.told(key, outcome, ack).await
            }
            Op::Read { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.read_document(&self.path, &doc_key(key));
                match (&outcome.result, live) {
                    (Ok(view), Some(v)) => self.model.check_view(view, key, v)?,
                    (Err(Error::DocumentNotFound { .. }), None) => {}
                    (result, live) => {
                        return Err(fail(format!(
                            "read: got {result:?}, the model has live version {live:?}"
                        )));
                    }
                }
                self.told(key, outcome, ack).await
            }
            Op::Advance(ms) => {
                self.clock.advance(ms);
                self.model.judge(self.clock.now());
                Ok(())
            }
            Op::SetDefault(raw) => {
                self.rebuild_expiry();
                let default_ttl = DefaultTtl::from_raw(raw).expect("valid default");
                let info = self
                    .engine
                    .replace_collection(
                        &self.path,
                        SettingsChange {
                            default_ttl,
                            indexing_mode: None,
                        },
                    )
                    .map_err(|e| fail(format!("replace settings: {e}")))?;
                prop_assert_eq!(info.settings.default_ttl(), default_ttl);
                self.model.default = raw;
                self.model.judge(now);
                Ok(())
            }
            Op::Purge => {
                for shard in self.engine.shards() {
                    let (report, undurable) = shard.purge_batch(&*self.clock, purge::PURGE_BATCH);
                    prop_assert!(!report.failed, "purge batch failed");
                    self.purges
                        .extend(undurable.map(|undurable| (shard.clone(), undurable)));
                }
                Ok(())
            }
            Op::Sync { permille } => {
                let from = self.storage.synced().0;
                let last = self.storage.last_applied().0;
                self.storage
                    .sync_to(Lsn(from + (last - from) * permille / 1_000));
                Ok(())
            }
            Op::Crash { rebuild } => self.crash(rebuild),
        }
    }

    /// Settles an operation's outcome at `key` as `ack` says, and records it if the client
    /// was told.
    async fn told<T>(
        &mut self,
        key: usize,
        outcome: Outcome<T>,
        ack: Ack,
    ) -> Result<(), TestCaseError> {
        if self.settle(outcome, ack).await? {
            self.model.acknowledge(key);
        }
        Ok(())
    }

    /// Finishes the waiting purge batches once the whole log is synced (their waits can then
    /// complete; a batch cannot say which position it waits for).
    async fn finish_purges_if_synced(&mut self) -> Result<(), TestCaseError> {
        if self.storage.synced() < self.storage.last_applied() {
            return Ok(());
        }
        for (shard, undurable) in self.purges.drain(..) {
            let finished =
                tokio::time::timeout(SETTLE_TIMEOUT, shard.finish_purge(undurable, &*self.clock))
                    .await
                    .map_err(|_| fail("a purge batch's durable wait hung after a full sync"))?;
            prop_assert!(finished, "a purge batch's delete did not become durable");
        }
        Ok(())
    }

    /// A power cut: only the synced prefix of the log survives. The engine restarts over it,
    /// and every address is read: each must show a state the acknowledged writes allow.
    fn crash(&mut self, rebuild: Rebuild) -> Result<(), TestCaseError> {
        self.purges.clear();
        let storage = self.storage.crash();
        let (engine, _) = Engine::open(
            EngineConfig { shards: SHARDS },
            Arc::new(storage.clone()),
            self.clock.clone(),
        )
        .map_err(|e| fail(format!("reopen after a crash: {e}")))?;
        // The old engine goes with the old store: nothing it held in memory survives.
        self.engine = engine;
        self.storage = storage;
        self.rebuild_pending = true;
        if let Rebuild::First = rebuild {
            self.rebuild_expiry();
        }
        let info = self
            .engine
            .get_collection(&self.path)
            .map_err(|e| fail(format!("collection after a crash: {e}")))?;
        prop_assert_eq!(
            info.settings.default_ttl(),
            DefaultTtl::from_raw(self.model.default).expect("valid default"),
            "settings changes are durable before they return"
        );
        self.model.run_etags.clear();
        for key in 0..KEYS {
            self.audit(key)?;
        }
        if let Rebuild::AfterReads = rebuild {
            self.rebuild_expiry();
        }
        Ok(())
    }

    /// Runs the expiry rebuild the last restart calls for, if it has not run yet.
    fn rebuild_expiry(&mut self) {
        if self.rebuild_pending {
            self.engine.rebuild_expiry();
            self.rebuild_pending = false;
        }
    }

    /// Reads `key` after a crash and makes what it finds the model's new durable base.
    fn audit(&mut self, key: usize) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        let model = &self.model;
        let history = &model.keys[key];
        let survivors = history.survivors();
        let acknowledged = history.writes.iter().any(|&(_, acked)| acked);
        let lost = if acknowledged {
            "an acknowledged write was lost"
        } else {
            "it holds neither the state at the last restart nor any write since"
        };
        let allowed: Vec<String> = survivors
            .iter()
            .map(|s| match *s {
                None => "absent".to_owned(),
                Some(v) => format!(
                    "etag {} {}",
                    model.versions[v].etag,
                    if model.visible(v, now) {
                        "(visible)"
                    } else {
                        "(expired)"
                    }
                ),
            })
            .collect();
        let outcome = self.engine.read_document(&self.path, &doc_key(key));
        let found = match &outcome.result {
            Ok(view) => {
                let etag = view.etag.0;
                let Some(v) = survivors
                    .iter()
                    .flatten()
                    .copied()
                    .find(|&v| model.versions[v].etag == etag)
                else {
                    let known = model.versions.iter().find(|v| v.etag == etag);
                    return Err(fail(match known {
                        Some(v) if v.expired => format!(
                            "key {key}: after a crash read etag {etag}, which had expired: expired is final"
                        ),
                        Some(_) => format!(
                            "key {key}: {lost}: after a crash read etag {etag}, but the acknowledged writes allow only {allowed:?}"
                        ),
                        None => format!("key {key}: after a crash read unknown etag {etag}"),
                    }));
                };
                prop_assert!(
                    model.visible(v, now),
                    "key {}: after a crash read etag {}, which had expired: expired is final",
                    key,
                    etag
                );
                model.check_view(view, key, v)?;
                Some(v)
            }
            Err(Error::DocumentNotFound { .. }) => {
                let absent_allowed = survivors
                    .iter()
                    .any(|s| s.is_none_or(|v| !model.visible(v, now)));
                prop_assert!(
                    absent_allowed,
                    "key {}: {}: after a crash it is not found, but the acknowledged writes allow only {:?}",
                    key,
                    lost,
                    allowed
                );
                None
            }
            Err(e) => return Err(fail(format!("key {key}: read after a crash: {e}"))),
        };
        prop_assert!(
            poll_once(self.engine.settle(outcome)).is_some(),
            "a read of recovered data settles at once"
        );
        if let Some(v) = found {
            self.model
                .acknowledged_etags
                .insert(self.model.versions[v].etag);
        }
        self.model.keys[key] = History {
            base: found,
            writes: Vec::new(),
        };
        Ok(())
    }
}

/// Runs one sequence; it always ends with a crash, so every sequence is checked after one.
fn check(default: Option<i64>, ops: &[Op], acknowledge_early: bool) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(format!("runtime: {e}")))?;
    runtime.block_on(async {
        let mut run = Run::start(default, acknowledge_early).await?;
        for (step, op) in ops.iter().enumerate() {
            run.apply(op)
                .await
                .map_err(|e| context(e, format_args!("step {step} ({op:?})")))?;
            run.finish_purges_if_synced().await?;
        }
        run.crash(Rebuild::First)
            .map_err(|e| context(e, "final crash"))
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // A failure is reported with its shrunk sequence; no regression file in the tree.
        failure_persistence: None,
        max_shrink_iters: 2_048,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Acknowledged writes survive every power cut, expired is final, etags never repeat.
    #[test]
    fn power_loss_acknowledged_writes_survive(default in default_ttl(), ops in ops()) {
        check(default, &ops, false)?;
    }
}

/// The mutation check: a storage that resolves durable waits before syncing lets the engine
/// acknowledge writes a power cut takes back, and the property must notice.
#[test]
fn power_loss_model_catches_acknowledging_before_the_sync() {
    let mut runner = TestRunner::new(config());
    let result = runner.run(&(default_ttl(), ops()), |(default, ops)| {
        check(default, &ops, true)
    });
    match result {
        Err(TestError::Fail(reason, (default, ops))) => {
            assert!(
                reason.message().contains("acknowledged"),
                "failed for another reason than a lost acknowledgement: {reason}"
            );
            eprintln!("caught, default {default:?}, shrunk to {ops:?}: {reason}");
        }
        other => panic!("an early acknowledgement went unnoticed: {other:?}"),
    }
}
