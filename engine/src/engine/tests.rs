//! The TTL contract (SPEC §1-5) exercised through the engine with a manual clock.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use serde_json::{Value, json};

use super::shard::Census;
use super::*;
use crate::storage::{
    CatalogChange, ChangeLog, DurableFuture, Lsn, MemoryStorage, ScanRange, ShardStore,
    StorageError, StoredCatalog, StoredDocument, StoredMeta, WriteBatch,
};

const T0: Millis = 1_790_000_000_000;
const SEC: Millis = 1_000;

struct Fixture {
    engine: Engine,
    clock: Arc<ManualClock>,
    path: CollectionPath,
}

fn id(s: &str) -> ResourceId {
    ResourceId::parse(IdKind::Document, s).expect("valid id")
}

fn pk(s: &str) -> PartitionKeyValue {
    PartitionKeyValue::String(s.into())
}

fn key(partition: &str, doc: &str) -> DocKey {
    DocKey {
        partition_key: pk(partition),
        id: id(doc),
    }
}

fn body(v: Value) -> DocumentBody {
    match v {
        Value::Object(m) => DocumentBody::parse(Arc::new(m), None).expect("valid body"),
        _ => panic!("object expected"),
    }
}

/// A document in partition "p" with an optional own ttl.
fn doc(doc_id: &str, ttl: Option<i64>) -> DocumentBody {
    match ttl {
        Some(t) => body(json!({"id": doc_id, "pk": "p", "ttl": t})),
        None => body(json!({"id": doc_id, "pk": "p"})),
    }
}

fn default_ttl(raw: Option<i64>) -> DefaultTtl {
    DefaultTtl::from_raw(raw).expect("valid default")
}

impl Fixture {
    /// Another collection in the fixture's database, partitioned on `/pk`, TTL off.
    fn collection(
        &self,
        name: &str,
        mode: IndexingMode,
        paths: IndexPaths,
    ) -> (Arc<CollectionInfo>, CollectionPath) {
        let settings = CollectionSettings::new(DefaultTtl::Off, mode).expect("valid");
        let info = self
            .engine
            .create_collection(
                &self.path.database,
                id(name),
                PartitionKeyPath::parse("/pk").expect("path"),
                settings,
                Arc::new(paths),
            )
            .expect("collection");
        let path = CollectionPath {
            database: self.path.database.clone(),
            collection: info.id.clone(),
        };
        (info, path)
    }

    fn new(default: Option<i64>) -> Self {
        Self::with_storage(default, Arc::new(MemoryStorage::new()))
    }

    fn with_storage(default: Option<i64>, storage: Arc<dyn Storage>) -> Self {
        Self::with_config(default, storage, EngineConfig::new(4))
    }

    fn with_config(default: Option<i64>, storage: Arc<dyn Storage>, config: EngineConfig) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::new(config, storage, clock.clone());
        let db = id("db");
        engine.create_database(db.clone()).expect("database");
        let settings = CollectionSettings::new(default_ttl(default), IndexingMode::Consistent)
            .expect("settings");
        engine
            .create_collection(
                &db,
                id("c"),
                PartitionKeyPath::parse("/pk").expect("path"),
                settings,
                Default::default(),
            )
            .expect("collection");
        Fixture {
            engine,
            clock,
            path: CollectionPath {
                database: db,
                collection: id("c"),
            },
        }
    }

    fn create(&self, doc_id: &str, ttl: Option<i64>) -> DocumentView {
        self.engine
            .create_document(&self.path, doc(doc_id, ttl), None)
            .result
            .expect("create")
    }

    fn read(&self, doc_id: &str) -> Result<DocumentView, Error> {
        self.engine
            .read_document(&self.path, &key("p", doc_id))
            .result
    }

    fn visible(&self, doc_id: &str) -> bool {
        match self.read(doc_id) {
            Ok(_) => true,
            Err(Error::DocumentNotFound { .. }) => false,
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    fn advance(&self, ms: Millis) {
        self.clock.advance(ms);
    }

    fn set_default(&self, raw: Option<i64>) {
        self.engine
            .replace_collection(
                &self.path,
                SettingsChange {
                    default_ttl: default_ttl(raw),
                    indexing_mode: None,
                    index_paths: None,
                    must_live: None,
                    change_feed_retention: None,
                },
            )
            .expect("replace settings");
    }
}

// ---- SPEC §3: the matrix, row by row ----

#[test]
fn matrix_document_without_ttl() {
    // collection Off: never expires
    let f = Fixture::new(None);
    f.create("a", None);
    f.advance(10 * 365 * 86_400 * SEC);
    assert!(f.visible("a"));
    // collection -1: never expires
    let f = Fixture::new(Some(-1));
    f.create("a", None);
    f.advance(10 * 365 * 86_400 * SEC);
    assert!(f.visible("a"));
    // collection n: expires n s after last write
    let f = Fixture::new(Some(10));
    f.create("a", None);
    f.advance(10 * SEC - 1);
    assert!(f.visible("a"));
    f.advance(1);
    assert!(!f.visible("a"));
}

#[test]
fn matrix_document_ttl_minus_one_never_expires() {
    for default in [None, Some(-1), Some(10)] {
        let f = Fixture::new(default);
        f.create("a", Some(-1));
        f.advance(10 * 365 * 86_400 * SEC);
        assert!(f.visible("a"), "default {default:?}");
    }
}

#[test]
fn matrix_document_ttl_m() {
    // collection Off: kept but ignored
    let f = Fixture::new(None);
    let created = f.create("a", Some(5));
    assert_eq!(
        created.ttl,
        Some(DocumentTtl::After(TtlSeconds::new(5).expect("valid")))
    );
    assert_eq!(created.expires_at, None);
    f.advance(3600 * SEC);
    assert!(f.visible("a"));
    assert_eq!(
        f.read("a").expect("visible").body_map()["ttl"],
        json!(5),
        "the stored value is kept"
    );
    // collection -1 and collection n (longer or shorter than m): expires m s after last write
    for default in [Some(-1), Some(10), Some(2)] {
        let f = Fixture::new(default);
        f.create("a", Some(5));
        f.advance(5 * SEC - 1);
        assert!(f.visible("a"), "default {default:?}");
        f.advance(1);
        assert!(!f.visible("a"), "default {default:?}");
    }
}

// ---- SPEC §4: instants and boundaries ----

#[test]
fn visible_for_its_full_ttl_to_the_millisecond() {
    let f = Fixture::new(Some(-1));
    f.advance(999); // a write late in a second: Cosmos's whole-second compare would cut it short
    let created = f.create("a", Some(1));
    assert_eq!(created.expires_at, Some(T0 + 999 + SEC));
    f.advance(SEC - 1);
    let read = f.read("a").expect("visible at last_write + ttl - 1 ms");
    assert_eq!(read.expires_at, Some(T0 + 999 + SEC));
    f.advance(1);
    assert!(!f.visible("a"), "gone at last_write + ttl");
}

#[test]
fn an_expired_document_does_not_exist_for_any_operation() {
    let f = Fixture::new(Some(-1));
    let old = f.create("a", Some(1));
    f.advance(SEC);
    let k = key("p", "a");
    let old_etag = old.etag.to_string();
    assert!(matches!(f.read("a"), Err(Error::DocumentNotFound { .. })));
    assert!(matches!(
        f.engine
            .replace_document(&f.path, k.clone(), doc("a", None), None)
            .result,
        Err(Error::DocumentNotFound { .. })
    ));
    assert!(matches!(
        f.engine.delete_document(&f.path, &k, None).result,
        Err(Error::DocumentNotFound { .. })
    ));
    assert!(matches!(
        f.engine.touch_document(&f.path, &k, None).result,
        Err(Error::DocumentNotFound { .. })
    ));
    assert!(matches!(
        f.engine
            .upsert_document(&f.path, doc("a", None), None, Some(&old_etag))
            .result,
        Err(Error::PreconditionFailed { .. })
    ));
    let page = f
        .engine
        .read_feed_page(
            &f.path,
            &FeedScope::Collection,
            100,
            None,
            crate::engine::QueryReads::unlimited(),
        )
        .result
        .expect("feed");
    assert!(page.documents.is_empty(), "feeds omit expired documents");
    // Upsert creates, and create of the same id makes a brand new document.
    let (outcome, _) = f
        .engine
        .upsert_document(&f.path, doc("a", Some(1)), None, None)
        .result
        .expect("upsert");
    assert_eq!(outcome, UpsertOutcome::Created);
    f.advance(SEC);
    let new = f.create("a", None);
    assert_ne!(new.etag, old.etag);
    assert_eq!(new.ttl, None);
    assert!(f.visible("a"));
}

#[test]
fn every_write_resets_the_clock() {
    let f = Fixture::new(Some(10));
    let k = key("p", "a");
    f.create("a", None);
    f.advance(9 * SEC);
    let replaced = f
        .engine
        .replace_document(&f.path, k.clone(), doc("a", None), None)
        .result
        .expect("replace");
    assert_eq!(replaced.last_write, T0 + 9 * SEC);
    f.advance(9 * SEC);
    let (outcome, upserted) = f
        .engine
        .upsert_document(&f.path, doc("a", None), None, None)
        .result
        .expect("upsert");
    assert_eq!(outcome, UpsertOutcome::Replaced);
    assert_eq!(upserted.last_write, T0 + 18 * SEC);
    f.advance(9 * SEC);
    let touched = f
        .engine
        .touch_document(&f.path, &k, None)
        .result
        .expect("touch");
    assert_eq!(touched.last_write, T0 + 27 * SEC);
    assert_eq!(touched.body, upserted.body, "touch keeps the body");
    assert_ne!(touched.etag, upserted.etag, "touch is a write: new etag");
    assert_eq!(touched.expires_at, Some(T0 + 37 * SEC));
    f.advance(10 * SEC - 1);
    assert!(
        f.visible("a"),
        "27 s after create, still alive thanks to the writes"
    );
    f.advance(1);
    assert!(!f.visible("a"));
}

#[test]
fn touch_restarts_an_own_ttl_too() {
    let f = Fixture::new(Some(-1));
    f.create("a", Some(2));
    f.advance(2 * SEC - 1);
    f.engine
        .touch_document(&f.path, &key("p", "a"), None)
        .result
        .expect("touch");
    f.advance(2 * SEC - 1);
    assert!(f.visible("a"));
    f.advance(1);
    assert!(!f.visible("a"));
}

#[test]
fn a_rejected_write_changes_nothing() {
    let f = Fixture::new(Some(10));
    let created = f.create("a", None);
    f.advance(5 * SEC);
    let k = key("p", "a");
    let stale = Etag(created.etag.0 + 1_000).to_string();
    assert!(matches!(
        f.engine
            .replace_document(&f.path, k.clone(), doc("a", Some(100)), Some(&stale))
            .result,
        Err(Error::PreconditionFailed { .. })
    ));
    assert!(matches!(
        f.engine.touch_document(&f.path, &k, Some(&stale)).result,
        Err(Error::PreconditionFailed { .. })
    ));
    assert!(matches!(
        f.engine.delete_document(&f.path, &k, Some(&stale)).result,
        Err(Error::PreconditionFailed { .. })
    ));
    assert!(matches!(
        f.engine
            .create_document(&f.path, doc("a", Some(100)), None)
            .result,
        Err(Error::DocumentExists { .. })
    ));
    let read = f.read("a").expect("still there");
    assert_eq!(read.last_write, created.last_write, "_ts unchanged");
    assert_eq!(read.etag, created.etag);
    assert_eq!(read.body, created.body);
    f.advance(5 * SEC);
    assert!(
        !f.visible("a"),
        "its clock was not reset by the rejected writes"
    );
}

#[test]
fn removing_ttl_inherits_again_and_minus_one_never_expires() {
    let f = Fixture::new(Some(10));
    let k = key("p", "a");
    f.create("a", Some(2));
    f.advance(SEC);
    f.engine
        .replace_document(&f.path, k.clone(), doc("a", None), None)
        .result
        .expect("replace without ttl");
    f.advance(5 * SEC);
    assert!(f.visible("a"), "inherits 10 s now, not 2 s");
    f.engine
        .replace_document(&f.path, k, doc("a", Some(-1)), None)
        .result
        .expect("replace with -1");
    f.advance(3600 * SEC);
    assert!(f.visible("a"));
}

// ---- Changing the collection default ----

#[test]
fn lowering_the_default_expires_older_inheritors_at_once() {
    let f = Fixture::new(Some(7200));
    f.create("old", None);
    f.advance(3600 * SEC + SEC);
    f.create("young", None);
    f.create("own", Some(7200));
    f.set_default(Some(3600));
    assert!(
        !f.visible("old"),
        "2 h 1 s... 1 h 1 s old: gone as soon as the default drops to 1 h"
    );
    assert!(f.visible("young"));
    assert!(f.visible("own"), "an own ttl does not follow the default");
    f.advance(3600 * SEC - 1);
    assert!(f.visible("young"));
    f.advance(1);
    assert!(!f.visible("young"));
}

#[test]
fn raising_the_default_extends_inheritors_that_have_not_expired() {
    let f = Fixture::new(Some(10));
    f.create("a", None);
    f.advance(9 * SEC);
    f.set_default(Some(20));
    f.advance(10 * SEC);
    assert!(f.visible("a"), "19 s old under a 20 s default");
    f.advance(SEC);
    assert!(!f.visible("a"));
}

#[test]
fn turning_ttl_off_and_on() {
    let f = Fixture::new(Some(10));
    f.create("inherits", None);
    f.create("own", Some(5));
    f.advance(4 * SEC);
    f.set_default(None);
    f.advance(3600 * SEC);
    assert!(f.visible("inherits"), "off: nothing expires");
    assert!(
        f.visible("own"),
        "off: not even documents with their own ttl"
    );
    f.set_default(Some(-1));
    assert!(f.visible("inherits"), "-1: inheritors never expire");
    assert!(
        !f.visible("own"),
        "-1: the own ttl is honoured again, and it is long past"
    );
    f.set_default(Some(100_000));
    assert!(f.visible("inherits"));
}

#[test]
fn expired_is_final_whatever_the_settings_do_next() {
    let f = Fixture::new(Some(10));
    f.create("inherits", None);
    f.create("own", Some(5));
    f.advance(11 * SEC);
    assert!(!f.visible("inherits"));
    assert!(!f.visible("own"));
    // Cosmos users report such documents coming back when TTL is switched off before the
    // purge ran. Here they do not, under any later setting.
    for raw in [None, Some(-1), Some(100_000), None] {
        f.set_default(raw);
        assert!(!f.visible("inherits"), "after setting {raw:?}");
        assert!(!f.visible("own"), "after setting {raw:?}");
    }
    assert!(
        f.engine
            .read_feed_page(
                &f.path,
                &FeedScope::Collection,
                10,
                None,
                crate::engine::QueryReads::unlimited()
            )
            .result
            .expect("feed")
            .documents
            .is_empty()
    );
    assert_eq!(f.engine.purge_now(), 2);
}

#[test]
fn a_lowered_default_then_raised_back_does_not_revive() {
    let f = Fixture::new(Some(7200));
    f.create("a", None);
    f.advance(3600 * SEC);
    f.set_default(Some(60));
    assert!(!f.visible("a"));
    f.set_default(Some(7200));
    assert!(
        !f.visible("a"),
        "it expired under the 60 s default; raising it again must not revive it"
    );
}

// ---- SPEC §5 and resource rules ----

#[test]
fn ttl_and_indexing_none_are_rejected_both_ways() {
    let f = Fixture::new(None);
    let db = f.path.database.clone();
    let path = PartitionKeyPath::parse("/pk").expect("path");
    assert_eq!(
        CollectionSettings::new(default_ttl(Some(-1)), IndexingMode::None),
        Err(InvalidInput::TtlWithoutIndex)
    );
    let none =
        CollectionSettings::new(DefaultTtl::Off, IndexingMode::None).expect("no ttl, no index");
    f.engine
        .create_collection(&db, id("plain"), path, none, Default::default())
        .expect("create");
    let plain = CollectionPath {
        database: db,
        collection: id("plain"),
    };
    // Turning TTL on for an unindexed collection:
    let err = f
        .engine
        .replace_collection(
            &plain,
            SettingsChange {
                default_ttl: default_ttl(Some(60)),
                indexing_mode: None,
                index_paths: None,
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect_err("rejected");
    assert_eq!(err, Error::Invalid(InvalidInput::TtlWithoutIndex));
    // Switching a TTL collection to none:
    f.set_default(Some(60));
    let err = f
        .engine
        .replace_collection(
            &f.path,
            SettingsChange {
                default_ttl: default_ttl(Some(60)),
                indexing_mode: Some(IndexingMode::None),
                index_paths: None,
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect_err("rejected");
    assert_eq!(err, Error::Invalid(InvalidInput::TtlWithoutIndex));
    assert_eq!(
        f.engine
            .get_collection(&f.path)
            .expect("exists")
            .settings
            .indexing_mode(),
        IndexingMode::Consistent
    );
}

#[test]
fn uniqueness_is_per_partition_key_and_id() {
    let f = Fixture::new(None);
    f.engine
        .create_document(&f.path, body(json!({"id": "same", "pk": "x"})), None)
        .result
        .expect("in x");
    f.engine
        .create_document(&f.path, body(json!({"id": "same", "pk": "y"})), None)
        .result
        .expect("same id in y");
    f.engine
        .create_document(&f.path, body(json!({"id": "same"})), None)
        .result
        .expect("same id, undefined partition");
    let err = f
        .engine
        .create_document(&f.path, body(json!({"id": "same", "pk": "x"})), None)
        .result
        .expect_err("dup");
    assert!(matches!(err, Error::DocumentExists { .. }));
    let undefined = DocKey {
        partition_key: PartitionKeyValue::Undefined,
        id: id("same"),
    };
    assert!(f.engine.read_document(&f.path, &undefined).result.is_ok());
    f.engine
        .delete_document(&f.path, &key("x", "same"), None)
        .result
        .expect("delete in x");
    assert!(
        f.engine
            .read_document(&f.path, &key("y", "same"))
            .result
            .is_ok(),
        "y untouched"
    );
}

#[test]
fn partition_key_in_the_request_must_match_the_body() {
    let f = Fixture::new(None);
    let err = f
        .engine
        .create_document(&f.path, doc("a", None), Some(pk("other")))
        .result
        .expect_err("mismatch");
    assert!(
        matches!(
            err,
            Error::Invalid(InvalidInput::PartitionKeyMismatch { .. })
        ),
        "{err}"
    );
    f.create("a", None);
    let err = f
        .engine
        .replace_document(
            &f.path,
            key("p", "a"),
            body(json!({"id": "a", "pk": "q"})),
            None,
        )
        .result
        .expect_err("replace moving partitions");
    assert!(
        matches!(
            err,
            Error::Invalid(InvalidInput::PartitionKeyMismatch { .. })
        ),
        "{err}"
    );
    let err = f
        .engine
        .replace_document(&f.path, key("p", "a"), doc("b", None), None)
        .result
        .expect_err("id");
    assert!(
        matches!(err, Error::Invalid(InvalidInput::IdMismatch { .. })),
        "{err}"
    );
}

#[test]
fn etags_guard_writes() {
    let f = Fixture::new(None);
    let k = key("p", "a");
    let v1 = f.create("a", None);
    let v2 = f
        .engine
        .replace_document(
            &f.path,
            k.clone(),
            doc("a", None),
            Some(&v1.etag.to_string()),
        )
        .result
        .expect("matching etag");
    assert!(matches!(
        f.engine
            .replace_document(
                &f.path,
                k.clone(),
                doc("a", None),
                Some(&v1.etag.to_string())
            )
            .result,
        Err(Error::PreconditionFailed { .. })
    ));
    f.engine
        .delete_document(&f.path, &k, Some(&v2.etag.to_string()))
        .result
        .expect("delete with etag");
    assert!(matches!(
        f.engine
            .upsert_document(&f.path, doc("a", None), None, Some(&v2.etag.to_string()))
            .result,
        Err(Error::PreconditionFailed { .. })
    ));
}

// ---- Purge ----

#[test]
fn purge_frees_due_documents_and_nothing_early() {
    let f = Fixture::new(Some(10));
    for i in 0..100 {
        f.create(&format!("inherit-{i}"), None);
        f.create(&format!("own-{i}"), Some(5));
        f.create(&format!("never-{i}"), Some(-1));
    }
    assert_eq!(f.engine.expiry_stats().tracked_documents, 200);
    f.advance(5 * SEC - 1);
    assert_eq!(f.engine.purge_now(), 0);
    f.advance(1);
    assert_eq!(f.engine.purge_now(), 100);
    f.advance(5 * SEC);
    assert_eq!(f.engine.purge_now(), 100);
    let stats = f.engine.expiry_stats();
    assert_eq!(stats.documents, 100);
    assert_eq!(stats.tracked_documents, 0);
    assert_eq!(f.engine.metrics().purged.get(), 200);
}

#[test]
fn purge_respects_rewrites_and_settings() {
    let f = Fixture::new(Some(10));
    f.create("rewritten", None);
    f.create("off-later", Some(9));
    f.advance(8 * SEC);
    f.engine
        .touch_document(&f.path, &key("p", "rewritten"), None)
        .result
        .expect("touch");
    f.set_default(None);
    f.advance(100 * SEC);
    assert_eq!(f.engine.purge_now(), 0, "TTL off: nothing is purged");
    assert!(f.visible("rewritten") && f.visible("off-later"));
    f.set_default(Some(10));
    assert_eq!(
        f.engine.purge_now(),
        2,
        "on again: both long past their TTL"
    );
}

#[test]
fn bookkeeping_stays_bounded_under_rewrites() {
    // Every rewrite of an inheriting document leaves its old queue entry behind, stale; only
    // compaction removes those before the purge reaches them (here: never, nothing is due).
    // It runs once stale entries outnumber live ones and reach `MIN_COMPACT`, so a queue holds
    // at most `live + max(live, MIN_COMPACT)` entries of 16 bytes, twice that in capacity.
    const MIN_COMPACT: usize = 1024; // expiry::inherit_queue::MIN_COMPACT
    const ENTRY_BYTES: usize = 16;
    const DOCS: usize = 200;
    const ROUNDS: usize = 51;
    let f = Fixture::new(Some(3600));
    // Inheriting and own-ttl versions alternate, ending inheriting: 26 × 200 queue entries
    // and 25 × 200 timers made, one document's worth of each still live.
    for round in 0..ROUNDS {
        let ttl = if round % 2 == 0 { None } else { Some(600) };
        for i in 0..DOCS {
            f.engine
                .upsert_document(&f.path, doc(&format!("d{i}"), ttl), None, None)
                .result
                .expect("upsert");
        }
        f.advance(SEC);
    }
    let stats = f.engine.expiry_stats();
    assert_eq!(stats.documents, DOCS as u64);
    assert_eq!(stats.tracked_documents, DOCS as u64);

    let Census {
        queued: entries,
        queued_live: live,
        queue_bytes,
        timers,
        ..
    } = census(&f);
    assert_eq!(live, DOCS, "every document inherits, once each");
    assert_eq!(
        timers, 0,
        "every timer was cancelled by the rewrite after it"
    );
    let written = DOCS * ROUNDS.div_ceil(2);
    let bound = live + live.max(MIN_COMPACT);
    assert!(written > 4 * bound, "enough rewrites to need compaction");
    assert!(
        entries <= bound,
        "{entries} inherit-queue entries for {live} inheriting documents after {written} \
         writes (at most {bound}): stale entries are not compacted away"
    );
    assert!(
        queue_bytes <= 2 * bound * ENTRY_BYTES,
        "{queue_bytes} bytes of inherit queues for {live} inheriting documents (at most {})",
        2 * bound * ENTRY_BYTES
    );
}

/// Memory storage with injected faults: every document write fails while `failing` is set;
/// with a `gate`, writes become durable only once the test opens it (never while it fails).
#[derive(Debug)]
struct FlakyStorage {
    inner: MemoryStorage,
    failing: Arc<AtomicBool>,
    gate: Option<tokio::sync::watch::Sender<Gate>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Closed,
    Open,
    Failing,
}

#[derive(Debug)]
struct FlakyShard {
    inner: Arc<dyn ShardStore>,
    failing: Arc<AtomicBool>,
    gate: Option<tokio::sync::watch::Sender<Gate>>,
}

impl Storage for FlakyStorage {
    fn placement(&self) -> crate::engine::Placement {
        self.inner.placement()
    }

    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        Arc::new(FlakyShard {
            inner: self.inner.shard(index),
            failing: self.failing.clone(),
            gate: self.gate.clone(),
        })
    }
    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.inner.write_catalog(change)
    }
    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        self.inner.load_catalog()
    }
    /// Catalog changes are durable at once here: the gate holds back document writes only.
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn last_applied(&self) -> Lsn {
        self.inner.last_applied()
    }
    fn failure(&self) -> Option<StorageError> {
        None
    }
}

impl ShardStore for FlakyShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StorageError::new("injected failure"));
        }
        self.inner.write(batch)
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        let Some(gate) = &self.gate else {
            return self.inner.durable(lsn);
        };
        let mut gate = gate.subscribe();
        Some(Box::pin(async move {
            let state = *gate
                .wait_for(|g| *g != Gate::Closed)
                .await
                .expect("gate kept by the test");
            match state {
                Gate::Failing => Err(StorageError::new("injected fsync failure")),
                _ => Ok(()),
            }
        }))
    }
    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        self.inner.load(each)
    }
    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, crate::storage::StoredTerms),
    ) -> Result<(), StorageError> {
        self.inner.load_terms(each)
    }
    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<crate::storage::StoredTerms>, StorageError> {
        self.inner.get_terms(collection, key)
    }
    fn scan_index(
        &self,
        collection: CollectionUid,
        range: crate::storage::IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<crate::storage::IndexEntry>, StorageError> {
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
}

#[test]
fn a_storage_failure_changes_nothing_and_the_purge_retries() {
    let failing = Arc::new(AtomicBool::new(false));
    let f = Fixture::with_storage(
        Some(10),
        Arc::new(FlakyStorage {
            inner: MemoryStorage::new(),
            failing: failing.clone(),
            gate: None,
        }),
    );
    let v1 = f.create("a", None);
    failing.store(true, Ordering::SeqCst);
    f.advance(SEC);
    let err = f
        .engine
        .upsert_document(&f.path, doc("a", Some(100)), None, None)
        .result
        .expect_err("storage down");
    assert!(matches!(err, Error::Storage(_)));
    let err = f
        .engine
        .create_document(&f.path, doc("b", None), None)
        .result
        .expect_err("storage down");
    assert!(matches!(err, Error::Storage(_)));
    assert_eq!(
        f.read("a").expect("unchanged"),
        DocumentView {
            read_at: T0 + SEC,
            ..v1.clone()
        }
    );
    assert!(!f.visible("b"));
    f.advance(9 * SEC);
    assert_eq!(f.engine.purge_now(), 0, "delete failed");
    assert!(!f.visible("a"), "still invisible: it expired");
    failing.store(false, Ordering::SeqCst);
    f.set_default(None);
    assert!(
        !f.visible("a"),
        "and final, even with TTL turned off before the retry"
    );
    assert_eq!(f.engine.purge_now(), 1, "the retry purges it");
}

fn gated() -> (Fixture, tokio::sync::watch::Sender<Gate>) {
    let gate = tokio::sync::watch::Sender::new(Gate::Closed);
    let storage = FlakyStorage {
        inner: MemoryStorage::new(),
        failing: Arc::default(),
        gate: Some(gate.clone()),
    };
    (Fixture::with_storage(Some(-1), Arc::new(storage)), gate)
}

/// Runs one purge batch on every shard; returns the batches waiting for durability.
fn purge_batches(f: &Fixture) -> Vec<(Arc<Shard>, purge::Undurable)> {
    let mut waiting = Vec::new();
    for shard in f.engine.shards() {
        let (report, undurable) = shard.purge_batch(&*f.clock, purge::PURGE_BATCH);
        assert!(!report.failed);
        waiting.extend(undurable.map(|u| (shard.clone(), u)));
    }
    waiting
}

fn documents_in_memory(f: &Fixture) -> usize {
    census(f).documents
}

#[tokio::test]
async fn the_purge_forgets_a_document_only_once_its_delete_is_durable() {
    let (f, gate) = gated();
    f.create("a", Some(1));
    f.create("b", Some(1));
    f.advance(2 * SEC);
    let waiting = purge_batches(&f);
    assert_eq!(waiting.len(), 1, "one shard holds partition p");
    assert!(!f.visible("a") && !f.visible("b"));
    assert_eq!(
        documents_in_memory(&f),
        2,
        "deleted in storage, still held in memory"
    );
    assert_eq!(f.engine.metrics().purged.get(), 0);

    // Written again before the delete is durable: the new version must survive the forget.
    let again = f.create("a", None);
    gate.send_replace(Gate::Open);
    for (shard, undurable) in waiting {
        assert!(shard.finish_purge(undurable, &*f.clock).await);
    }
    assert_eq!(f.read("a").expect("kept").etag, again.etag);
    assert!(!f.visible("b"));
    assert_eq!(documents_in_memory(&f), 1);
    assert_eq!(f.engine.metrics().purged.get(), 1);
    assert_eq!(
        f.engine.metrics().expired.get(),
        2,
        "b purged, a overwritten"
    );
}

#[tokio::test]
async fn purged_documents_whose_delete_never_became_durable_are_purged_again() {
    let (f, gate) = gated();
    f.create("a", Some(1));
    f.advance(2 * SEC);
    gate.send_replace(Gate::Failing);
    for (shard, undurable) in purge_batches(&f) {
        assert!(!shard.finish_purge(undurable, &*f.clock).await);
    }
    assert!(!f.visible("a"), "expired is final");
    assert_eq!(documents_in_memory(&f), 1, "kept while storage may hold it");

    gate.send_replace(Gate::Open);
    let waiting = purge_batches(&f);
    assert_eq!(waiting.len(), 1, "back in the backlog");
    for (shard, undurable) in waiting {
        assert!(shard.finish_purge(undurable, &*f.clock).await);
    }
    assert_eq!(documents_in_memory(&f), 0);
    assert_eq!(f.engine.metrics().purged.get(), 1);
}

// ---- Feed and collections ----

#[test]
fn read_feed_pages_through_every_live_document_once() {
    let f = Fixture::new(Some(-1));
    for i in 0..250 {
        let ttl = if i % 5 == 0 { Some(1) } else { None };
        f.engine
            .create_document(&f.path, body(json!({"id": format!("d{i:03}"), "pk": format!("p{}", i % 7), "ttl": ttl.unwrap_or(-1)})), None).result
            .expect("create");
    }
    f.advance(SEC);
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = f
            .engine
            .read_feed_page(
                &f.path,
                &FeedScope::Collection,
                30,
                token.as_deref(),
                crate::engine::QueryReads::unlimited(),
            )
            .result
            .expect("page");
        assert!(page.documents.len() <= 30);
        seen.extend(page.documents.iter().map(|d| d.key.id.to_string()));
        match page.continuation {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    seen.sort();
    let expected: Vec<String> = (0..250)
        .filter(|i| i % 5 != 0)
        .map(|i| format!("d{i:03}"))
        .collect();
    assert_eq!(seen, expected);

    let partition = FeedScope::Partition(pk("p3"));
    let page = f
        .engine
        .read_feed_page(
            &f.path,
            &partition,
            1000,
            None,
            crate::engine::QueryReads::unlimited(),
        )
        .result
        .expect("partition page");
    assert!(page.continuation.is_none());
    assert!(
        page.documents
            .iter()
            .all(|d| d.key.partition_key == pk("p3"))
    );
    assert_eq!(
        page.documents.len(),
        (0..250).filter(|i| i % 7 == 3 && i % 5 != 0).count()
    );
}

/// Every shard's [`Census`], summed.
fn census(f: &Fixture) -> Census {
    let mut sum = Census::default();
    for shard in f.engine.shards() {
        let one = shard.lock().census();
        sum.documents += one.documents;
        sum.timers += one.timers;
        sum.queued += one.queued;
        sum.queued_live += one.queued_live;
        sum.queue_bytes += one.queue_bytes;
        sum.pending += one.pending;
    }
    sum
}

/// Timers, queue entries and backlog of every shard, summed: what the purge would act on.
fn expiry_entries(f: &Fixture) -> (usize, usize, usize) {
    let c = census(f);
    (c.timers, c.queued, c.pending)
}

#[test]
fn a_recreated_collection_starts_empty() {
    let f = Fixture::new(Some(30));
    for i in 0..10 {
        f.create(&format!("d{i}"), Some(20)); // timers due at T0 + 20 s
        f.create(&format!("q{i}"), None); // queued, due at T0 + 30 s
    }
    assert_eq!(expiry_entries(&f), (10, 10, 0));
    f.engine.delete_collection(&f.path).expect("delete");
    assert!(matches!(
        f.read("d0"),
        Err(Error::CollectionNotFound { .. })
    ));
    assert_eq!(
        expiry_entries(&f),
        (0, 0, 0),
        "the deleted collection's timers are cancelled and its queues dropped"
    );

    // Recreated under the same name (a new uid), with new documents of the same ids in the
    // slots the old ones left: the old timers, had they survived, would fire on these.
    f.advance(10 * SEC);
    let settings =
        CollectionSettings::new(default_ttl(Some(60)), IndexingMode::Consistent).expect("valid");
    f.engine
        .create_collection(
            &f.path.database,
            id("c"),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
        )
        .expect("recreate");
    assert!(!f.visible("d0"), "the recreated collection starts empty");
    assert_eq!(f.engine.expiry_stats().documents, 0);
    for i in 0..10 {
        f.create(&format!("d{i}"), Some(50)); // due at T0 + 60 s
        f.create(&format!("q{i}"), None); // due at T0 + 70 s
    }
    f.advance(50 * SEC - 1); // long past everything the deleted collection had scheduled
    assert_eq!(
        f.engine.purge_now(),
        0,
        "nothing of the deleted collection purges a new document early"
    );
    assert_eq!(expiry_entries(&f), (10, 10, 0));
    assert_eq!(f.engine.expiry_stats().tracked_documents, 20);
    for i in 0..10 {
        assert!(f.visible(&format!("d{i}")) && f.visible(&format!("q{i}")));
    }
    f.advance(1);
    assert_eq!(f.engine.purge_now(), 10, "own ttls, due at T0 + 60 s");
    f.advance(10 * SEC);
    assert_eq!(f.engine.purge_now(), 10, "inheritors, due at T0 + 70 s");
    assert_eq!(f.engine.expiry_stats().documents, 0);
    assert_eq!(expiry_entries(&f), (0, 0, 0));
}

#[test]
fn deleting_a_database_deletes_its_collections() {
    let f = Fixture::new(None);
    f.create("a", None);
    f.engine.delete_database(&f.path.database).expect("delete");
    assert!(matches!(f.read("a"), Err(Error::DatabaseNotFound { .. })));
    assert!(f.engine.list_databases().is_empty());
    assert_eq!(f.engine.expiry_stats().documents, 0);
}

// Regression: the purge panicked on a dead document of a collection being deleted (the
// review found it: pending entries were not checked against detached collections).
#[test]
fn purging_dead_documents_of_a_collection_being_deleted_does_not_panic() {
    let failing = Arc::new(AtomicBool::new(false));
    let f = Fixture::with_storage(
        Some(10),
        Arc::new(FlakyStorage {
            inner: MemoryStorage::new(),
            failing: failing.clone(),
            gate: None,
        }),
    );
    for i in 0..50 {
        f.create(&format!("d{i}"), None);
    }
    f.advance(11 * SEC);
    // A purge whose delete fails leaves all 50 marked dead and pending: the backlog a
    // deletion can find.
    failing.store(true, Ordering::SeqCst);
    assert_eq!(f.engine.purge_now(), 0, "delete failed");
    failing.store(false, Ordering::SeqCst);
    assert_eq!(expiry_entries(&f), (0, 0, 50));
    let uid = f.engine.get_collection(&f.path).expect("exists").uid;
    let mut parts = Vec::new();
    for shard in f.engine.shards() {
        parts.push((shard.clone(), shard.detach_collection(uid)));
    }
    // The purge runs between detaching and freeing, as it can in a real deletion.
    assert_eq!(
        f.engine.purge_now(),
        0,
        "the cleanup, not the purge, frees them"
    );
    assert_eq!(
        expiry_entries(&f),
        (0, 0, 0),
        "the purge dropped the detached collection's backlog"
    );
    assert_eq!(f.engine.metrics().purged.get(), 0);
    assert_eq!(
        f.engine.expiry_stats().documents,
        50,
        "still held, for the cleanup"
    );
    for (shard, part) in parts {
        if let Some(part) = part {
            let mut slots = part.into_slots();
            while !shard.free_detached(&mut slots, 7) {}
        }
    }
    assert_eq!(f.engine.expiry_stats().documents, 0);
}

// Regression: visibility read the wall clock as is, so a clock stepping back revived
// documents that had expired but were not purged yet.
#[test]
fn a_clock_stepping_back_does_not_revive_expired_documents() {
    let f = Fixture::new(Some(-1));
    f.create("a", Some(1));
    f.advance(2 * SEC);
    assert!(!f.visible("a"));
    f.clock.set(T0);
    assert!(
        !f.visible("a"),
        "expired stays expired when the wall clock steps back"
    );
    let b = f.create("b", Some(5));
    assert!(
        b.last_write >= T0 + 2 * SEC,
        "shard time does not go backwards"
    );
    assert_eq!(f.engine.purge_now(), 1);
}

/// Regression: shard time never went back, so one write stamped far in the future (a wall
/// clock stepping forward a year and back) froze the shard's clock for that year: every later
/// write was stamped a year ahead and every TTL judged by that frozen instant.
#[test]
fn a_far_future_reading_does_not_freeze_shard_time() {
    let f = Fixture::new(Some(3600));
    let year = 365 * 86_400 * SEC;
    f.clock.set(T0 + year);
    let future = f.create("future", None);
    assert_eq!(future.last_write, T0 + year);
    // A small step back holds shard time still...
    f.clock.set(T0 + year - shard::MAX_CLOCK_STEP_BACK);
    assert_eq!(f.create("held", None).last_write, T0 + year);
    // ...a large one is followed.
    f.clock.set(T0);
    let a = f.create("a", Some(10));
    assert_eq!(a.last_write, T0);
    assert_eq!(a.expires_at, Some(T0 + 10 * SEC));
    let b = f.create("b", None);
    assert_eq!(b.expires_at, Some(T0 + 3600 * SEC));
    f.advance(10 * SEC);
    assert!(!f.visible("a"));
    assert!(f.visible("b") && f.visible("future") && f.visible("held"));
    assert_eq!(f.engine.purge_now(), 1, "a is purged at its instant");
    f.advance(3590 * SEC);
    assert!(!f.visible("b"));
    assert!(
        f.visible("future"),
        "written a year ahead, it expires a year ahead"
    );
    assert_eq!(
        f.engine.purge_now(),
        1,
        "b, queued behind later-stamped writes, is purged at its instant"
    );
}

#[test]
fn turning_ttl_on_times_every_own_ttl_document() {
    // More documents than one timing chunk, so the chunked path is taken.
    let f = Fixture::new(None);
    for i in 0..10_000 {
        f.create(&format!("d{i}"), Some(5));
    }
    f.create("inherits", None);
    assert_eq!(
        f.engine.expiry_stats().tracked_documents,
        1,
        "no timers while TTL is off"
    );
    f.set_default(Some(-1));
    assert_eq!(f.engine.expiry_stats().tracked_documents, 10_001);
    f.advance(5 * SEC);
    assert_eq!(f.engine.purge_now(), 10_000);
    assert!(f.visible("inherits"));
}

// ---- Regressions from the foundation review ----

/// Regression: the purge gave each collection with a numeric default one unit of budget per
/// batch, in stable map order; with more such collections than the budget, the same ones were
/// skipped every batch forever while the purge task spun. Inherit queues are now served by
/// earliest due head.
#[test]
fn the_purge_serves_every_collection_however_many_there_are() {
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::new(
        EngineConfig::new(1),
        Arc::new(MemoryStorage::new()),
        clock.clone(),
    );
    let db = id("db");
    engine.create_database(db.clone()).expect("database");
    let settings =
        CollectionSettings::new(default_ttl(Some(10)), IndexingMode::Consistent).expect("valid");
    let collections = 3 * purge::PURGE_BATCH;
    for i in 0..collections {
        let path = CollectionPath {
            database: db.clone(),
            collection: id(&format!("c{i}")),
        };
        engine
            .create_collection(
                &db,
                path.collection.clone(),
                PartitionKeyPath::parse("/pk").expect("path"),
                settings,
                Default::default(),
            )
            .expect("collection");
        engine
            .create_document(&path, doc("a", None), None)
            .result
            .expect("create");
    }
    clock.advance(10 * SEC);
    let shard = &engine.shards()[0];
    let mut purged = 0;
    // Each batch examines at most PURGE_BATCH entries, one per due document here.
    for _ in 0..3 {
        let (report, undurable) = shard.purge_batch(&*clock, purge::PURGE_BATCH);
        assert!(undurable.is_none(), "memory storage is durable at once");
        purged += report.purged;
    }
    assert_eq!(
        purged, collections,
        "every collection's document was purged"
    );
    let (report, _) = shard.purge_batch(&*clock, purge::PURGE_BATCH);
    assert_eq!(report.purged, 0);
    assert!(
        report.next_due.is_none(),
        "nothing left due: the purge sleeps instead of spinning"
    );
}

/// An engine over a data directory with a manual clock and no purge running, as if the
/// process were killed before the purge reached anything.
fn disk_engine(dir: &std::path::Path, clock: Arc<ManualClock>) -> (Engine, CollectionPath) {
    let storage = crate::storage::DiskStorage::open(&crate::storage::DiskOptions {
        path: dir.to_path_buf(),
        durability: crate::storage::Durability::Fsync,
        shards: Some(2),
        cache_bytes: 1 << 20,
        read_cache_bytes: 1 << 20,
        open_files: None,
    })
    .expect("opens");
    let (engine, _) = Engine::open(EngineConfig::new(2), Arc::new(storage), clock).expect("loads");
    engine.rebuild_expiry();
    let path = CollectionPath {
        database: id("db"),
        collection: id("c"),
    };
    (engine, path)
}

/// Database "db" and its collection "c" (partition key `/pk`, default TTL `default`,
/// consistent indexing of everything) on a new engine.
fn create_db_and_c(engine: &Engine, default: DefaultTtl) {
    engine.create_database(id("db")).expect("database");
    let settings = CollectionSettings::new(default, IndexingMode::Consistent).expect("valid");
    engine
        .create_collection(
            &id("db"),
            id("c"),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
        )
        .expect("collection");
}

/// Regression: a settings change marked the documents the old default had expired dead in
/// memory only, so a crash before the purge deleted them brought them back (lower the default
/// so a backlog expires, switch TTL off, kill). The decision is now part of the durable
/// record of the new settings.
#[tokio::test]
async fn expired_is_final_across_a_crash_before_the_purge() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    {
        let (engine, path) = disk_engine(dir.path(), clock.clone());
        create_db_and_c(&engine, default_ttl(Some(3600)));
        for (name, ttl) in [("inherits", None), ("own", Some(60)), ("never", Some(-1))] {
            engine
                .create_document(&path, doc(name, ttl), None)
                .result
                .expect("create");
        }
        clock.advance(120 * SEC);
        engine
            .create_document(&path, doc("young", None), None)
            .result
            .expect("create");
        clock.advance(SEC);
        engine.durable().await.expect("durable");
        // Lower the default so "inherits" expires (and "own" already has), then switch off.
        for ttl in [Some(100), None] {
            engine
                .replace_collection(
                    &path,
                    SettingsChange {
                        default_ttl: default_ttl(ttl),
                        indexing_mode: None,
                        index_paths: None,
                        must_live: None,
                        change_feed_retention: None,
                    },
                )
                .expect("settings");
        }
        let visible = |name: &str| engine.read_document(&path, &key("p", name)).result.is_ok();
        assert!(!visible("inherits") && !visible("own"));
        assert!(visible("never") && visible("young"));
        // Dropped without a purge: nothing was deleted from storage.
    }
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    let visible = |name: &str| engine.read_document(&path, &key("p", name)).result.is_ok();
    assert!(
        !visible("inherits"),
        "expired by the lowered default, final after a crash"
    );
    assert!(
        !visible("own"),
        "expired by its own ttl, final after a crash"
    );
    assert!(visible("never") && visible("young"));
    // Turning TTL back on does not bring them back either, and the purge finds them.
    engine
        .replace_collection(
            &path,
            SettingsChange {
                default_ttl: default_ttl(Some(-1)),
                indexing_mode: None,
                index_paths: None,
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect("settings");
    assert!(!visible("inherits") && !visible("own"));
    let mut purged = 0;
    for shard in engine.shards() {
        let (report, undurable) = shard.purge_batch(&*clock, purge::PURGE_BATCH);
        if let Some(undurable) = undurable {
            assert!(shard.finish_purge(undurable, &*clock).await);
        }
        purged += report.purged;
    }
    assert_eq!(purged, 2);
}

/// Results of `text` at the clock's current reading, through the engine's query paths: a
/// streaming query page by page (page size 2), any other query in one run.
fn query(f: &Fixture, text: &str) -> Vec<Value> {
    run_query(f, text).0
}

/// A query's results, with its metrics summed over its pages of 2.
fn run_query(f: &Fixture, text: &str) -> (Vec<Value>, QueryMetrics) {
    query_on(&f.engine, &f.path, text, false, 2).expect("runs")
}

#[test]
fn every_query_path_omits_a_document_from_the_instant_it_expires() {
    // Default 10 s; "short" documents live 5 s. The purge never runs in this fixture, so the
    // expired documents stay stored: only the query's clock reading keeps them out.
    let f = Fixture::new(Some(10));
    for i in 0..6 {
        let ttl = if i % 2 == 0 { Some(5) } else { None };
        let mut value = json!({"id": format!("d{i}"), "pk": "p", "n": i, "kind": if i % 2 == 0 { "short" } else { "long" }, "tags": ["a", "b"]});
        if let Some(t) = ttl {
            value["ttl"] = json!(t);
        }
        f.engine
            .upsert_document(&f.path, body(value), None, None)
            .result
            .expect("upsert");
    }
    // (query, results before, results after, the index it reads).
    let paths = [
        ("SELECT VALUE c.id FROM c", 6, 3, None),
        (
            "SELECT VALUE c.id FROM c WHERE c.kind = 'short'",
            3,
            0,
            Some("/kind/?"),
        ),
        (
            "SELECT VALUE c.id FROM c WHERE c.kind IN ('short', 'x')",
            3,
            0,
            Some("/kind/?"),
        ),
        (
            "SELECT VALUE c.id FROM c WHERE c.n >= 0",
            6,
            3,
            Some("/n/?"),
        ),
        (
            "SELECT VALUE c.id FROM c WHERE c.n BETWEEN 0 AND 2",
            3,
            1,
            Some("/n/?"),
        ),
        (
            "SELECT VALUE c.id FROM c WHERE STARTSWITH(c.kind, 'sh')",
            3,
            0,
            Some("/kind/?"),
        ),
        (
            "SELECT VALUE c.id FROM c WHERE IS_DEFINED(c.n)",
            6,
            3,
            Some("/n/?"),
        ),
        (
            "SELECT VALUE c.id FROM c ORDER BY c.n DESC",
            6,
            3,
            Some("/n/?"),
        ),
        (
            "SELECT TOP 2 VALUE c.id FROM c ORDER BY c.n",
            2,
            2,
            Some("/n/?"),
        ),
        (
            "SELECT VALUE c.n FROM c WHERE c.kind = 'short' ORDER BY c.n",
            3,
            0,
            Some("/kind/?"),
        ),
        (
            "SELECT VALUE COUNT(1) FROM c WHERE c.kind = 'short'",
            1,
            1,
            Some("/kind/?"),
        ),
        (
            "SELECT VALUE t FROM c JOIN t IN c.tags WHERE c.kind = 'short'",
            6,
            0,
            Some("/kind/?"),
        ),
        ("SELECT VALUE t FROM c JOIN t IN c.tags", 12, 6, None),
        ("SELECT DISTINCT VALUE c.kind FROM c", 2, 1, None),
        (
            "SELECT DISTINCT VALUE c.kind FROM c WHERE c.n > 0",
            2,
            1,
            Some("/n/?"),
        ),
        (
            "SELECT c.kind, COUNT(1) AS n FROM c GROUP BY c.kind",
            2,
            1,
            None,
        ),
        (
            "SELECT c.kind, COUNT(1) AS n FROM c WHERE c.n < 10 GROUP BY c.kind",
            2,
            1,
            Some("/n/?"),
        ),
        ("SELECT TOP 100 VALUE c.id FROM c", 6, 3, None),
        ("SELECT VALUE c.id FROM c OFFSET 0 LIMIT 100", 6, 3, None),
        (
            "SELECT VALUE c.id FROM c WHERE EXISTS(SELECT VALUE t FROM t IN c.tags WHERE t = 'a')",
            6,
            3,
            None,
        ),
    ];
    f.advance(5 * SEC - 1);
    for (text, before, _, index) in paths {
        let (results, metrics) = run_query(&f, text);
        assert_eq!(
            results.len(),
            before,
            "{text}: 1 ms before the short ones expire"
        );
        assert_eq!(metrics.index.as_deref(), index, "{text}: the plan");
    }
    assert_eq!(
        query(&f, "SELECT VALUE COUNT(1) FROM c WHERE c.kind = 'short'"),
        [json!(3)]
    );
    assert_eq!(query(&f, "SELECT VALUE COUNT(1) FROM c"), [json!(6)]);
    assert_eq!(query(&f, "SELECT VALUE SUM(c.n) FROM c"), [json!(15)]);
    f.advance(1);
    for (text, _, after, index) in paths {
        let (results, metrics) = run_query(&f, text);
        assert_eq!(results.len(), after, "{text}: at the instant they expire");
        assert_eq!(metrics.index.as_deref(), index, "{text}: the plan");
    }
    assert_eq!(query(&f, "SELECT VALUE COUNT(1) FROM c"), [json!(3)]);
    let (count, metrics) = run_query(&f, "SELECT VALUE COUNT(1) FROM c WHERE c.kind = 'short'");
    assert_eq!(count, [json!(0)]);
    assert_eq!(
        (metrics.documents_examined, metrics.index_entries_examined),
        (0, 3),
        "counted from the entries, which stay until the purge"
    );
    assert_eq!(
        query(&f, "SELECT VALUE c.n FROM c ORDER BY c.n DESC"),
        [json!(5), json!(3), json!(1)]
    );
    assert_eq!(f.engine.purge_now(), 3);
    let (count, metrics) = run_query(&f, "SELECT VALUE COUNT(1) FROM c WHERE c.kind = 'short'");
    assert_eq!(count, [json!(0)]);
    assert_eq!(
        metrics.index_entries_examined, 0,
        "the purge removed their entries"
    );
    assert_eq!(query(&f, "SELECT VALUE SUM(c.n) FROM c"), [json!(9)]);
    assert_eq!(query(&f, "SELECT VALUE MIN(c.n) FROM c"), [json!(1)]);
    assert_eq!(query(&f, "SELECT VALUE AVG(c.n) FROM c"), [json!(3)]);
    assert!(
        query(&f, "SELECT * FROM c")
            .iter()
            .all(|d| d["_ts"].is_u64() && d["_etag"].is_string()),
        "SELECT * carries the system properties"
    );
    f.advance(5 * SEC);
    assert_eq!(query(&f, "SELECT VALUE COUNT(1) FROM c"), [json!(0)]);
    assert!(query(&f, "SELECT * FROM c").is_empty());
    assert!(query(&f, "SELECT * FROM c WHERE c.kind = 'long'").is_empty());
}

#[test]
fn a_query_token_works_only_for_its_query_collection_and_scope() {
    let f = Fixture::new(None);
    let all = FeedScope::Collection;
    let one = FeedScope::Partition(pk("p"));
    for text in [
        "SELECT VALUE c.id FROM c",
        "SELECT VALUE c.id FROM c ORDER BY c.id",
    ] {
        let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("valid");
        let cursor = f
            .engine
            .query_cursor(&f.path, &spec, &all, None)
            .expect("start");
        let info = f.engine.get_collection(&f.path).expect("collection");
        let token = f.engine.encode_query_cursor(&info, &spec, &all, &cursor);
        assert!(
            f.engine
                .query_cursor(&f.path, &spec, &all, Some(&token))
                .is_ok()
        );
        let other_scope = f.engine.query_cursor(&f.path, &spec, &one, Some(&token));
        assert!(other_scope.is_err(), "{text}: another partition");
        let other =
            QuerySpec::parse("SELECT VALUE c.pk FROM c", serde_json::Map::new()).expect("valid");
        assert!(
            f.engine
                .query_cursor(&f.path, &other, &all, Some(&token))
                .is_err(),
            "{text}: another query"
        );
        assert!(
            f.engine
                .query_cursor(&f.path, &spec, &all, Some("AAAA"))
                .is_err()
        );
    }
}

/// Results and metrics of a query run in one call (any query shape), on `engine`, streaming
/// queries in pages of `page_size`.
fn query_on(
    engine: &Engine,
    path: &CollectionPath,
    text: &str,
    enable_scan: bool,
    page_size: usize,
) -> Result<(Vec<Value>, QueryMetrics), Error> {
    let mut spec = QuerySpec::parse(text, serde_json::Map::new())?;
    spec.enable_scan = enable_scan;
    let scope = FeedScope::Collection;
    let read_at = engine.query_reading();
    // As the gRPC edge does: pages where the engine gives a cursor to page by, else all
    // results in one run.
    if let QueryCursor::Offset(_) = engine.query_cursor(path, &spec, &scope, None)? {
        return crate::testing::same_inline(|reads| {
            engine.query_all(path, &spec, &scope, read_at, reads).result
        });
    }
    let (mut results, mut metrics, mut token) = (Vec::new(), QueryMetrics::default(), None);
    loop {
        let cursor = engine.query_cursor(path, &spec, &scope, token.as_deref())?;
        let page = crate::testing::same_inline(|reads| {
            engine
                .query_stream_page(
                    path,
                    &spec,
                    &scope,
                    page_size,
                    cursor.clone(),
                    read_at,
                    reads,
                )
                .result
        })?;
        assert!(
            page.results.len() <= page_size,
            "a page holds at most its size"
        );
        results.extend(page.results);
        metrics.index = page.metrics.index;
        metrics.documents_examined += page.metrics.documents_examined;
        metrics.index_entries_examined += page.metrics.index_entries_examined;
        match page.continuation {
            Some(t) => token = Some(t),
            None => return Ok((results, metrics)),
        }
    }
}

fn status_doc(name: &str, status: &str, n: i64) -> DocumentBody {
    body(json!({"id": name, "pk": format!("p{n}"), "status": status, "n": n}))
}

/// Upserts documents d0.. d{count - 1}, each "open" with `n` its number.
fn write_open(engine: &Engine, path: &CollectionPath, count: i64) {
    for i in 0..count {
        engine
            .upsert_document(path, status_doc(&format!("d{i}"), "open", i), None, None)
            .result
            .expect("upsert");
    }
}

/// The index is stored, not rebuilt: after a restart the planner uses it at once, and it
/// holds exactly the current versions' entries (an overwrite and a delete left none behind).
#[tokio::test]
async fn an_index_survives_a_restart_with_exactly_the_current_entries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    {
        let (engine, path) = disk_engine(dir.path(), clock.clone());
        create_db_and_c(&engine, default_ttl(Some(-1)));
        for i in 0..20 {
            let status = if i % 2 == 0 { "open" } else { "closed" };
            engine
                .upsert_document(&path, status_doc(&format!("d{i}"), status, i), None, None)
                .result
                .expect("upsert");
        }
        // d0 moves to "closed", d2 is deleted: neither may leave an "open" entry behind.
        engine
            .upsert_document(&path, status_doc("d0", "closed", 0), None, None)
            .result
            .expect("overwrite");
        engine
            .delete_document(&path, &key("p2", "d2"), None)
            .result
            .expect("delete");
        engine.durable().await.expect("durable");
    }
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    let (open, metrics) = query_on(
        &engine,
        &path,
        "SELECT VALUE c.n FROM c WHERE c.status = 'open'",
        false,
        100,
    )
    .expect("runs");
    let mut open: Vec<i64> = open.iter().filter_map(Value::as_i64).collect();
    open.sort_unstable();
    assert_eq!(open, [4, 6, 8, 10, 12, 14, 16, 18]);
    assert_eq!(metrics.index.as_deref(), Some("/status/?"));
    assert_eq!(
        metrics.index_entries_examined, 8,
        "no entry of an old version or a deleted document"
    );
    let (count, metrics) = query_on(
        &engine,
        &path,
        "SELECT VALUE COUNT(1) FROM c WHERE c.status = 'closed'",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(count, [json!(11)]);
    assert_eq!(
        metrics.documents_examined, 0,
        "counted without reading bodies"
    );
    let (top, metrics) = query_on(
        &engine,
        &path,
        "SELECT TOP 3 VALUE c.n FROM c ORDER BY c.n DESC",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(top, [json!(19), json!(18), json!(17)]);
    assert_eq!(metrics.index.as_deref(), Some("/n/?"));
    assert!(metrics.documents_examined <= 4, "{metrics:?}");
}

#[test]
fn mode_none_needs_enable_scan_and_new_paths_read_documents_until_rebuilt() {
    let f = Fixture::new(None);
    let (_, plain) = f.collection("plain", IndexingMode::None, IndexPaths::default());
    write_open(&f.engine, &plain, 4);
    let text = "SELECT VALUE c.n FROM c WHERE c.status = 'open'";
    let err = query_on(&f.engine, &plain, text, false, 100).expect_err("needs enable_scan");
    assert!(
        matches!(err, Error::Invalid(InvalidInput::ScanNotEnabled { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("enable_scan"), "{err}");
    let (rows, metrics) = query_on(&f.engine, &plain, text, true, 100).expect("scans");
    assert_eq!((rows.len(), metrics.index), (4, None));

    // Turning indexing on: documents written without it have no entries, so queries read
    // documents (and stay complete) until a rebuild.
    let info = f
        .engine
        .replace_collection(
            &plain,
            SettingsChange {
                default_ttl: DefaultTtl::Off,
                indexing_mode: Some(IndexingMode::Consistent),
                index_paths: None,
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect("settings");
    assert!(!info.index_complete);
    let (rows, metrics) = query_on(&f.engine, &plain, text, false, 100).expect("runs");
    assert_eq!((rows.len(), metrics.index), (4, None));
    // The background indexer rebuilds it and records it complete: the index is read again.
    f.engine.index_now();
    assert!(
        f.engine
            .get_collection(&plain)
            .expect("exists")
            .index_complete
    );
    let (rows, metrics) = query_on(&f.engine, &plain, text, false, 100).expect("runs");
    assert_eq!(
        (rows.len(), metrics.index.as_deref()),
        (4, Some("/status/?"))
    );
    let (rows, _) = query_on(
        &f.engine,
        &plain,
        "SELECT VALUE COUNT(1) FROM c WHERE c.status = 'open'",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(rows, [json!(4)]);

    // An excluded path is never read from the index; an included one is.
    let paths = IndexPaths::new(&["/*".to_owned()], &["/status/?".to_owned()]).expect("valid");
    let (_, partial) = f.collection("partial", IndexingMode::Consistent, paths);
    write_open(&f.engine, &partial, 4);
    let (rows, metrics) = query_on(&f.engine, &partial, text, false, 100).expect("runs");
    assert_eq!((rows.len(), metrics.index), (4, None));
    let (rows, metrics) = query_on(
        &f.engine,
        &partial,
        "SELECT VALUE c.n FROM c WHERE c.n > 1",
        false,
        100,
    )
    .expect("runs");
    assert_eq!((rows.len(), metrics.index.as_deref()), (2, Some("/n/?")));
}

/// Regressions from review: a COUNT whose filter the index cannot answer counted every
/// document; `_ts` (never stored, so never indexed) was looked up in the index and found
/// nothing; `IN ()` planned zero ranges and panicked.
#[test]
fn filters_the_index_cannot_answer_are_evaluated_on_documents() {
    let f = Fixture::new(None);
    for i in 0..4 {
        let status = if i == 0 { "open" } else { "closed" };
        f.engine
            .upsert_document(&f.path, status_doc(&format!("d{i}"), status, i), None, None)
            .result
            .expect("upsert");
    }
    for (text, expected) in [
        (
            "SELECT VALUE COUNT(1) FROM c WHERE c.status != 'open'",
            json!([3]),
        ),
        (
            "SELECT VALUE COUNT(1) FROM c WHERE c.n = 1 OR c.n = 2",
            json!([2]),
        ),
        ("SELECT VALUE COUNT(1) FROM c WHERE c._ts > 0", json!([4])),
        ("SELECT VALUE COUNT(1) FROM c WHERE c.n IN ()", json!([0])),
    ] {
        let (rows, _) = query_on(&f.engine, &f.path, text, false, 100).expect(text);
        assert_eq!(Value::Array(rows), expected, "{text}");
    }
    let (rows, metrics) = query_on(
        &f.engine,
        &f.path,
        "SELECT VALUE c.id FROM c WHERE c._ts > 0",
        false,
        100,
    )
    .expect("runs");
    assert_eq!((rows.len(), metrics.index), (4, None));
}

/// A collection in `lazy` mode: writes leave their entries to the background indexer, so
/// index-answered queries miss what it has not reached (never returning a document for a value
/// it no longer has), and are complete once it has.
#[test]
fn lazy_writes_are_indexed_in_the_background() {
    let f = Fixture::new(None);
    let (info, path) = f.collection("lazy", IndexingMode::Lazy, IndexPaths::default());
    write_open(&f.engine, &path, 6);
    let open = "SELECT VALUE c.n FROM c WHERE c.status = 'open'";
    let count = "SELECT VALUE COUNT(1) FROM c WHERE c.status = 'open'";
    let (rows, metrics) = query_on(&f.engine, &path, open, false, 100).expect("runs");
    assert_eq!(
        (rows.len(), metrics.index.as_deref()),
        (0, Some("/status/?"))
    );
    f.engine.index_now();
    let (rows, _) = query_on(&f.engine, &path, open, false, 100).expect("runs");
    assert_eq!(rows.len(), 6);

    // d0 moves to "closed", d1 is deleted: until indexed, d0's old entry does not return it.
    f.engine
        .upsert_document(&path, status_doc("d0", "closed", 0), None, None)
        .result
        .expect("overwrite");
    f.engine
        .delete_document(&path, &key("p1", "d1"), None)
        .result
        .expect("delete");
    let (rows, _) = query_on(&f.engine, &path, open, false, 100).expect("runs");
    let mut n: Vec<i64> = rows.iter().filter_map(Value::as_i64).collect();
    n.sort_unstable();
    assert_eq!(n, [2, 3, 4, 5]);
    let (rows, _) = query_on(&f.engine, &path, count, false, 100).expect("runs");
    assert_eq!(
        rows,
        [json!(4)],
        "an owed document is not counted by its old entry"
    );
    let closed = "SELECT VALUE c.n FROM c WHERE c.status = 'closed'";
    let (rows, _) = query_on(&f.engine, &path, closed, false, 100).expect("runs");
    assert!(rows.is_empty(), "not indexed yet: {rows:?}");
    f.engine.index_now();
    let (rows, _) = query_on(&f.engine, &path, closed, false, 100).expect("runs");
    assert_eq!(rows, [json!(0)]);
    let (rows, metrics) = query_on(
        &f.engine,
        &path,
        "SELECT TOP 2 VALUE c.n FROM c ORDER BY c.n DESC",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(rows, [json!(5), json!(4)]);
    assert_eq!(metrics.index.as_deref(), Some("/n/?"));
    // d5 rewritten to n = -1: its entry at 5 no longer names it, so an ordered read skips it
    // there rather than returning -1 out of order.
    f.engine
        .upsert_document(
            &path,
            body(json!({"id": "d5", "pk": "p5", "status": "open", "n": -1})),
            None,
            None,
        )
        .result
        .expect("overwrite");
    let (rows, metrics) = query_on(
        &f.engine,
        &path,
        "SELECT TOP 2 VALUE c.n FROM c ORDER BY c.n DESC",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(rows, [json!(4), json!(3)]);
    assert_eq!(metrics.index.as_deref(), Some("/n/?"));
    f.engine.index_now();
    for shard in f.engine.shards() {
        let [stale, indexed, docs, _] = shard.lock().index_census(info.uid, &[]);
        assert_eq!((stale, indexed), (0, docs));
    }

    // SPEC §5: switching TTL on in a lazy collection rebuilds its index; it stays usable
    // (lazy queries may be incomplete meanwhile) and is recorded complete once rebuilt.
    let info = f
        .engine
        .replace_collection(
            &path,
            SettingsChange {
                default_ttl: default_ttl(Some(-1)),
                indexing_mode: None,
                index_paths: None,
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect("settings");
    assert!(!info.index_complete);
    // One batch of budget 0: the walk marks every document owed an update, takes none.
    let mut owed = 0;
    for shard in f.engine.shards() {
        shard.index_batch(0).expect("walks");
        owed += shard.lock().index_census(info.uid, &[])[0];
    }
    assert_eq!(owed, 5, "every live document is rebuilt");
    let (_, metrics) = query_on(&f.engine, &path, open, false, 100).expect("runs");
    assert_eq!(metrics.index.as_deref(), Some("/status/?"));
    f.engine.index_now();
    assert!(
        f.engine
            .get_collection(&path)
            .expect("exists")
            .index_complete
    );
    let (rows, _) = query_on(&f.engine, &path, open, false, 100).expect("runs");
    assert_eq!(rows.len(), 4);

    // Written, deleted and written again before the indexer came: the slot is reused while
    // still queued, and the document is indexed once (per-path counts stay exact).
    for _ in 0..3 {
        f.engine
            .upsert_document(&path, status_doc("d9", "open", 9), None, None)
            .result
            .expect("upsert");
        f.engine
            .delete_document(&path, &key("p9", "d9"), None)
            .result
            .expect("delete");
    }
    f.engine
        .upsert_document(&path, status_doc("d9", "open", 9), None, None)
        .result
        .expect("upsert");
    f.engine.index_now();
    let n = super::index::terms::path_prefix(&["n"]).expect("short");
    for shard in f.engine.shards() {
        let [stale, indexed, docs, with_n] = shard.lock().index_census(info.uid, &n);
        assert_eq!((stale, indexed, with_n), (0, docs, docs));
    }
}

/// Changing the paths rebuilds the index: `consistent` queries read documents until it is
/// done; entries of paths no longer included are removed, those of new ones written; writes
/// during the rebuild are indexed under the new paths at once.
#[test]
fn a_path_change_rebuilds_the_index() {
    let f = Fixture::new(None);
    write_open(&f.engine, &f.path, 40);
    let only_n = IndexPaths::new(&["/n/?".to_owned()], &["/*".to_owned()]).expect("valid");
    let info = f
        .engine
        .replace_collection(
            &f.path,
            SettingsChange {
                default_ttl: DefaultTtl::Off,
                indexing_mode: None,
                index_paths: Some(Arc::new(only_n)),
                must_live: None,
                change_feed_retention: None,
            },
        )
        .expect("settings");
    assert!(!info.index_complete);
    // One small batch: documents are still owed updates, so the index is not complete.
    f.engine.shards()[0].index_batch(3).expect("indexes");
    f.engine.finish_rebuilds().expect("checks");
    assert!(
        !f.engine
            .get_collection(&f.path)
            .expect("exists")
            .index_complete
    );
    let by_n = "SELECT VALUE c.id FROM c WHERE c.n = 7";
    let (rows, metrics) = query_on(&f.engine, &f.path, by_n, false, 100).expect("runs");
    assert_eq!((rows, metrics.index), (vec![json!("d7")], None));
    // Written during the rebuild: indexed at once under the new paths.
    f.engine
        .upsert_document(&f.path, status_doc("late", "open", 99), None, None)
        .result
        .expect("upsert");
    f.engine.index_now();
    assert!(
        f.engine
            .get_collection(&f.path)
            .expect("exists")
            .index_complete
    );
    let (rows, metrics) = query_on(&f.engine, &f.path, by_n, false, 100).expect("runs");
    assert_eq!(
        (rows, metrics.index.as_deref()),
        (vec![json!("d7")], Some("/n/?"))
    );
    let (rows, metrics) = query_on(
        &f.engine,
        &f.path,
        "SELECT VALUE c.id FROM c WHERE c.status = 'open'",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(
        (rows.len(), metrics.index),
        (41, None),
        "/status/? is excluded now"
    );
    let status = super::index::terms::path_prefix(&["status"]).expect("short");
    for shard in f.engine.shards() {
        let [stale, indexed, docs, with_status] = shard.lock().index_census(info.uid, &status);
        assert_eq!((stale, indexed, with_status), (0, docs, 0));
    }
}

/// A crash in the middle of a lazy catch-up or of a rebuild resumes it: a `lazy` document whose
/// terms record is not of its version is owed again, and an index recorded incomplete is
/// rebuilt.
#[tokio::test]
async fn an_interrupted_catch_up_or_rebuild_resumes_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let lazy_path = CollectionPath {
        database: id("db"),
        collection: id("lazy"),
    };
    {
        let (engine, path) = disk_engine(dir.path(), clock.clone());
        engine.create_database(id("db")).expect("database");
        for (name, mode) in [("c", IndexingMode::None), ("lazy", IndexingMode::Lazy)] {
            engine
                .create_collection(
                    &id("db"),
                    id(name),
                    PartitionKeyPath::parse("/pk").expect("path"),
                    CollectionSettings::new(DefaultTtl::Off, mode).expect("valid"),
                    Default::default(),
                )
                .expect("collection");
        }
        for p in [&path, &lazy_path] {
            write_open(&engine, p, 10);
        }
        // Half of the lazy ones indexed before the "crash", then one rewritten.
        engine.shards()[0].index_batch(1000).expect("indexes");
        engine
            .upsert_document(&lazy_path, status_doc("d3", "closed", 3), None, None)
            .result
            .expect("overwrite");
        let info = engine
            .replace_collection(
                &path,
                SettingsChange {
                    default_ttl: DefaultTtl::Off,
                    indexing_mode: Some(IndexingMode::Consistent),
                    index_paths: None,
                    must_live: None,
                    change_feed_retention: None,
                },
            )
            .expect("settings");
        assert!(!info.index_complete);
        engine.durable().await.expect("durable");
    }
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    assert!(!engine.get_collection(&path).expect("exists").index_complete);
    let lazy_uid = engine.get_collection(&lazy_path).expect("exists").uid;
    let owed = |engine: &Engine| -> u64 {
        engine
            .shards()
            .iter()
            .map(|s| s.lock().index_census(lazy_uid, &[])[0])
            .sum()
    };
    let after_restart = owed(&engine);
    assert!(
        (1..=10).contains(&after_restart),
        "the unindexed and the rewritten ones are owed again: {after_restart}"
    );
    engine.index_now();
    assert_eq!(owed(&engine), 0);
    let (rows, _) = query_on(
        &engine,
        &lazy_path,
        "SELECT VALUE c.n FROM c WHERE c.status = 'closed'",
        false,
        100,
    )
    .expect("runs");
    assert_eq!(
        rows,
        [json!(3)],
        "the rewrite reached the index after the restart"
    );
    assert!(engine.get_collection(&path).expect("exists").index_complete);
    let open = "SELECT VALUE c.n FROM c WHERE c.status = 'open'";
    for (p, expected) in [(&path, 10), (&lazy_path, 9)] {
        let (rows, metrics) = query_on(&engine, p, open, false, 100).expect("runs");
        assert_eq!(
            (rows.len(), metrics.index.as_deref()),
            (expected, Some("/status/?")),
            "{p:?}"
        );
    }
}

/// A write whose index terms would pass the per-document bound is refused and changes
/// nothing, in `lazy` mode too; a collection that does not index takes the same document.
#[test]
fn writes_with_too_many_index_terms_are_refused() {
    let f = Fixture::new(None);
    let mut inner = Value::Object((0..20_000).map(|i| (format!("p{i}"), json!(i))).collect());
    for level in 0..40 {
        inner = json!({ format!("level-{level:013}"): inner });
    }
    inner["id"] = json!("big");
    inner["pk"] = json!("p");
    let (_, lazy) = f.collection("lazy", IndexingMode::Lazy, IndexPaths::default());
    let (_, plain) = f.collection("plain", IndexingMode::None, IndexPaths::default());
    for path in [&f.path, &lazy] {
        let err = f
            .engine
            .upsert_document(path, body(inner.clone()), None, None)
            .result
            .expect_err("refused");
        assert!(
            matches!(err, Error::Invalid(InvalidInput::IndexTermsTooLarge { .. })),
            "{err}"
        );
        assert!(
            f.engine
                .read_document(path, &key("p", "big"))
                .result
                .is_err(),
            "nothing written"
        );
    }
    f.engine
        .upsert_document(&plain, body(inner), None, None)
        .result
        .expect("no index, no terms");
}

// ---- Patch ----

#[test]
fn concurrent_increments_all_count() {
    let f = Arc::new(Fixture::new(Some(-1)));
    f.create("counter", None);
    let threads: Vec<_> = (0..20)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    f.engine
                        .patch_document(
                            &f.path,
                            &key("p", "counter"),
                            &[PatchOp::Incr {
                                path: "/count".into(),
                                by: 1.into(),
                            }],
                            None,
                            None,
                        )
                        .result
                        .expect("patched");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let view = f.read("counter").expect("read");
    assert_eq!(view.body_map()["count"], serde_json::json!(200));
}

/// Regression (issue 23): `incr 1` on 9007199254740992 (2^53) returned a new etag while the
/// stored value, a double, stayed the same; an integer increment is now exact or refused.
#[test]
fn an_integer_increment_is_exact_or_refused_past_2_53() {
    let f = Fixture::new(Some(-1));
    let near = 9_007_199_254_740_990_i64;
    f.engine
        .create_document(
            &f.path,
            body(json!({"id": "big", "pk": "p", "n": near})),
            None,
        )
        .result
        .expect("create");
    let incr = |by: i64| {
        f.engine
            .patch_document(
                &f.path,
                &key("p", "big"),
                &[PatchOp::Incr {
                    path: "/n".into(),
                    by: by.into(),
                }],
                None,
                None,
            )
            .result
    };
    for expected in [near + 1, near + 2] {
        let view = incr(1).expect("exact");
        assert_eq!(view.body_map()["n"], json!(expected));
        assert_eq!(
            f.read("big").expect("read").body_map()["n"],
            json!(expected)
        );
    }
    let before = f.read("big").expect("read");
    for _ in 0..3 {
        let err = incr(1).expect_err("2^53 + 1 is not a double");
        let Error::Invalid(InvalidInput::Patch {
            op: "incr", reason, ..
        }) = &err
        else {
            panic!("{err}")
        };
        assert!(reason.contains("beyond"), "{reason}");
    }
    let after = f.read("big").expect("read");
    assert_eq!(after.etag, before.etag, "nothing was written");
    assert_eq!(after.body_map()["n"], json!(1_i64 << 53));
    // Downwards is exact again.
    let view = incr(-3).expect("exact");
    assert_eq!(view.body_map()["n"], json!(near - 1));
}

#[test]
fn a_patch_is_a_write_and_may_change_the_ttl() {
    let f = Fixture::new(Some(-1));
    let created = f.create("a", Some(10));
    f.advance(5 * SEC);
    let set_ttl = |ttl: i64| PatchOp::Set {
        path: "/ttl".into(),
        value: serde_json::json!(ttl),
    };
    let patched = f
        .engine
        .patch_document(&f.path, &key("p", "a"), &[set_ttl(2)], None, None)
        .result
        .expect("patched");
    assert_ne!(patched.etag, created.etag);
    assert!(patched.last_write > created.last_write, "a write: new _ts");
    f.advance(2 * SEC - 1);
    assert!(f.visible("a"));
    f.advance(1);
    assert!(
        !f.visible("a"),
        "expires by the patched ttl, from the patch"
    );

    // A bad ttl is refused as in a body; an old etag, a missing document too; nothing changes.
    let b = f.create("b", None);
    let refused = f
        .engine
        .patch_document(&f.path, &key("p", "b"), &[set_ttl(0)], None, None)
        .result;
    assert!(matches!(refused, Err(Error::Invalid(_))), "{refused:?}");
    let stale = f
        .engine
        .patch_document(
            &f.path,
            &key("p", "b"),
            &[set_ttl(5)],
            None,
            Some("0000000000000001"),
        )
        .result;
    assert!(
        matches!(stale, Err(Error::PreconditionFailed { .. })),
        "{stale:?}"
    );
    let missing = f
        .engine
        .patch_document(&f.path, &key("p", "zzz"), &[set_ttl(5)], None, None)
        .result;
    assert!(
        matches!(missing, Err(Error::DocumentNotFound { .. })),
        "{missing:?}"
    );
    assert_eq!(f.read("b").expect("b").etag, b.etag);
    // The partition key cannot move.
    let moved = f
        .engine
        .patch_document(
            &f.path,
            &key("p", "b"),
            &[PatchOp::Set {
                path: "/pk".into(),
                value: serde_json::json!("q"),
            }],
            None,
            Some(&b.etag.to_string()),
        )
        .result;
    assert!(matches!(moved, Err(Error::Invalid(_))), "{moved:?}");
}

mod batch;
mod change_feed;
mod idempotency;
mod must_live;

/// A continuation holds a position in one plan's index entries: resumed under another plan
/// (the indexing policy changed between pages) it would skip or repeat rows, so it is refused
/// as stale; under the same plan it resumes exactly where it stopped.
#[test]
fn a_query_continuation_resumes_only_under_the_plan_that_made_it() {
    let f = Fixture::new(None);
    for i in 0..10 {
        let doc = json!({"id": format!("d{i}"), "pk": format!("p{i}"), "n": i, "m": 100 - i});
        f.engine
            .upsert_document(&f.path, body(doc), None, None)
            .result
            .expect("upsert");
    }
    let text = "SELECT VALUE c.n FROM c WHERE c.n >= 0 AND c.m >= 0";
    let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("parses");
    let all = FeedScope::Collection;
    let first_page = |token: Option<&str>| {
        let cursor = f
            .engine
            .query_cursor(&f.path, &spec, &all, token)
            .expect("cursor");
        f.engine
            .query_stream_page(
                &f.path,
                &spec,
                &all,
                4,
                cursor,
                f.engine.query_reading(),
                QueryReads::unlimited(),
            )
            .result
    };
    let rest = |token: String| {
        let mut rows = Vec::new();
        let mut token = Some(token);
        while let Some(t) = token {
            let cursor = f.engine.query_cursor(&f.path, &spec, &all, Some(&t))?;
            let page = f
                .engine
                .query_stream_page(
                    &f.path,
                    &spec,
                    &all,
                    4,
                    cursor,
                    f.engine.query_reading(),
                    QueryReads::unlimited(),
                )
                .result?;
            rows.extend(page.results);
            token = page.continuation;
        }
        Ok::<_, Error>(rows)
    };
    let page = first_page(None).expect("page");
    assert_eq!(page.metrics.index.as_deref(), Some("/n/?"));
    let token = page.continuation.expect("more");
    // A change that leaves the plan as it was: the token resumes exactly.
    let change = |paths: IndexPaths| {
        f.engine
            .replace_collection(
                &f.path,
                SettingsChange {
                    default_ttl: DefaultTtl::Off,
                    indexing_mode: None,
                    index_paths: Some(Arc::new(paths)),
                    must_live: None,
                    change_feed_retention: None,
                },
            )
            .expect("settings");
        f.engine.index_now();
    };
    change(
        IndexPaths::new(&["/n/?".to_owned(), "/m/?".to_owned()], &["/*".to_owned()])
            .expect("valid"),
    );
    let mut rows = page.results.clone();
    rows.extend(rest(token.clone()).expect("same plan"));
    let mut rows: Vec<i64> = rows.iter().filter_map(Value::as_i64).collect();
    rows.sort_unstable();
    assert_eq!(rows, (0..10).collect::<Vec<_>>(), "every row once");
    // /n is no longer indexed: the query now reads /m, where the token's place means nothing.
    change(IndexPaths::new(&["/m/?".to_owned()], &["/*".to_owned()]).expect("valid"));
    let err = rest(token).expect_err("stale");
    assert!(matches!(err, Error::ContinuationStale { .. }), "{err:?}");
    // Started again, the query reads the new index and returns every row once.
    let page = first_page(None).expect("page");
    assert_eq!(page.metrics.index.as_deref(), Some("/m/?"));
    let mut rows = page.results.clone();
    rows.extend(rest(page.continuation.expect("more")).expect("runs"));
    let mut rows: Vec<i64> = rows.iter().filter_map(Value::as_i64).collect();
    rows.sort_unstable();
    assert_eq!(rows, (0..10).collect::<Vec<_>>());
}

/// A run stops soon after its cancel is raised, inside a long evaluation too, and says why.
#[test]
fn a_cancelled_query_stops_within_its_current_document() {
    let f = Fixture::new(None);
    let text = "a".repeat(60_000);
    for i in 0..200 {
        let doc = json!({"id": format!("d{i}"), "pk": "p", "s": text});
        f.engine
            .upsert_document(&f.path, body(doc), None, None)
            .result
            .expect("upsert");
    }
    // About 6 million comparisons per document: far below its evaluation budget, so only a
    // cancel or the query's time limit stops the run.
    let query = format!(
        "SELECT VALUE COUNT(1) FROM c WHERE c.s LIKE '%{}b'",
        "_".repeat(100)
    );
    let spec = QuerySpec::parse(&query, serde_json::Map::new()).expect("parses");
    let cancel = Cancel::default().for_call();
    let raise = cancel.clone();
    let started = std::time::Instant::now();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        raise.cancel();
    });
    let outcome = f.engine.query_all(
        &f.path,
        &spec,
        &FeedScope::Collection,
        f.engine.query_reading(),
        QueryReads::unlimited().cancelled_by(cancel),
    );
    canceller.join().expect("joins");
    assert_eq!(outcome.result, Err(Error::Cancelled));
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

/// Issue 23, defect 3: one document without the `ORDER BY` path, or with an array, object or
/// long string there, once took every caller's `ORDER BY` off the index (a sort of the whole
/// collection, refused past 100k results). The index walk now returns every document in
/// Cosmos DB's type order, undefined first, exactly as the in-memory sort does.
#[test]
fn order_by_walks_the_index_over_undefined_and_non_scalar_values() {
    let f = Fixture::new(None);
    let long = |tail: &str| format!("{}{tail}", "s".repeat(300));
    let values: Vec<(&str, Option<Value>)> = vec![
        ("u1", None),
        ("u2", None),
        ("null", Some(json!(null))),
        ("false", Some(json!(false))),
        ("true", Some(json!(true))),
        ("neg", Some(json!(-3.5))),
        ("two", Some(json!(2))),
        ("a", Some(json!("a"))),
        ("long-b", Some(json!(long("b")))),
        ("long-a", Some(json!(long("a")))),
        ("s-short", Some(json!("s".repeat(300)))),
        ("t", Some(json!("t"))),
        ("arr-05", Some(json!([0, 5]))),
        ("arr-1", Some(json!([1]))),
        ("arr-0", Some(json!([0]))),
        ("obj-b", Some(json!({"a": 2}))),
        ("obj-a", Some(json!({"a": 1}))),
    ];
    for (i, (name, value)) in values.iter().enumerate() {
        let mut doc = json!({"id": name, "pk": format!("p{}", i % 5)});
        if let Some(v) = value {
            doc["n"] = v.clone();
        }
        f.engine
            .upsert_document(&f.path, body(doc), None, None)
            .result
            .expect("upsert");
    }
    let ascending = [
        "u1", "u2", "null", "false", "true", "neg", "two", "a", "long-a", "long-b", "t", "arr-0",
        "arr-05", "arr-1", "obj-a", "obj-b",
    ];
    // "s-short" is exactly 300 s's: a long string equal to the others' prefix, below them.
    let mut ascending: Vec<&str> = ascending.to_vec();
    ascending.insert(8, "s-short");
    for descending in [false, true] {
        let text = format!(
            "SELECT VALUE c.id FROM c ORDER BY c.n{}",
            if descending { " DESC" } else { "" }
        );
        let (rows, metrics) = run_query(&f, &text);
        let mut expected = ascending.clone();
        if descending {
            expected.reverse();
        }
        assert_eq!(rows, expected, "{text}");
        assert_eq!(
            metrics.index.as_deref(),
            Some("/n/?"),
            "{text}: an index walk"
        );
        // The same order as the query engine's own sort.
        let (sorted, metrics) = query_on(
            &f.engine,
            &f.path,
            &format!("{text} OFFSET 0 LIMIT 100"),
            false,
            100,
        )
        .expect("runs");
        assert_eq!(sorted, rows, "{text}");
        assert_eq!(metrics.index.as_deref(), Some("/n/?"));
    }
}

#[test]
fn a_top_order_by_reads_a_few_documents_whatever_some_lack() {
    let f = Fixture::new(None);
    for i in 0..2000 {
        let mut doc = json!({"id": format!("d{i:04}"), "pk": format!("p{}", i % 7), "n": i});
        if i == 1234 {
            doc.as_object_mut().expect("object").remove("n");
        }
        if i == 77 {
            doc["n"] = json!({"nested": true});
        }
        f.engine
            .upsert_document(&f.path, body(doc), None, None)
            .result
            .expect("upsert");
    }
    let (rows, metrics) = run_query(&f, "SELECT TOP 3 VALUE c.id FROM c ORDER BY c.n");
    assert_eq!(rows, ["d1234", "d0000", "d0001"]);
    assert!(
        metrics.documents_examined <= 10 && metrics.index_entries_examined <= 100,
        "{metrics:?}"
    );
    let (rows, metrics) = run_query(&f, "SELECT TOP 3 VALUE c.id FROM c ORDER BY c.n DESC");
    assert_eq!(rows, ["d0077", "d1999", "d1998"]);
    assert!(metrics.documents_examined <= 10, "{metrics:?}");
    // A document written with the path after its key was found undefined is fed once.
    f.engine
        .upsert_document(
            &f.path,
            body(json!({"id": "d1234", "pk": "p2", "n": -1})),
            None,
            None,
        )
        .result
        .expect("upsert");
    let (rows, _) = run_query(&f, "SELECT TOP 2 VALUE c.id FROM c ORDER BY c.n");
    assert_eq!(rows, ["d1234", "d0000"]);
}

/// Issue 23, defect 13: a partition-scoped equality read once walked every entry of its term
/// in the shard (900 entries for a count of 100).
#[test]
fn a_partition_scoped_equality_reads_only_that_partitions_entries() {
    let f = Fixture::new(None);
    for i in 0..2000 {
        let doc = json!({"id": format!("d{i}"), "pk": format!("p{}", i % 20), "status": "open"});
        f.engine
            .upsert_document(&f.path, body(doc), None, None)
            .result
            .expect("upsert");
    }
    let scope = FeedScope::Partition(pk("p3"));
    for text in [
        "SELECT VALUE COUNT(1) FROM c WHERE c.status = 'open'",
        "SELECT VALUE c.id FROM c WHERE c.status = 'open'",
    ] {
        let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("valid");
        let read_at = f.engine.query_reading();
        let (rows, metrics) = crate::testing::same_inline(|reads| {
            f.engine
                .query_all(&f.path, &spec, &scope, read_at, reads)
                .result
        })
        .expect("runs");
        let n = if rows.len() == 1 {
            rows[0].as_u64().expect("a count")
        } else {
            rows.len() as u64
        };
        assert_eq!(n, 100, "{text}");
        assert_eq!(metrics.index_entries_examined, 100, "{text}: {metrics:?}");
    }
}

/// Issue 23, defect 3: an indexed `ORDER BY` streams page by page instead of holding its
/// results, so more than `MAX_HELD_ROWS` of them are returned, not refused.
#[test]
fn an_indexed_order_by_past_the_held_limit_streams() {
    let f = Fixture::new(None);
    let n = mayfly_query::MAX_HELD_ROWS as i64 + 1;
    for i in 0..n {
        f.engine
            .upsert_document(
                &f.path,
                body(json!({"id": format!("d{i}"), "pk": format!("p{}", i % 31), "n": (i * 7919) % n})),
                None,
                None,
            )
            .result
            .expect("upsert");
    }
    let text = "SELECT VALUE c.n FROM c ORDER BY c.n DESC";
    let (rows, metrics) = query_on(&f.engine, &f.path, text, false, 10_000).expect("runs");
    assert_eq!(metrics.index.as_deref(), Some("/n/?"));
    assert_eq!(rows.len() as i64, n);
    assert!(
        rows.iter()
            .zip((0..n).rev())
            .all(|(row, expected)| row.as_i64() == Some(expected)),
        "every value once, in order"
    );
}

/// Issue 24: a query without FROM is evaluated once, whatever the collection holds, reading no
/// document (on a collection that does not index too, without `enable_scan`).
#[test]
fn a_query_without_from_runs_once_and_reads_nothing() {
    let f = Fixture::new(None);
    let (_, unindexed) = f.collection("plain", IndexingMode::None, IndexPaths::default());
    for (path, docs) in [(&f.path, 3), (&unindexed, 0), (&unindexed, 2)] {
        for i in 0..docs {
            f.engine
                .upsert_document(
                    path,
                    body(json!({"id": format!("d{i}"), "pk": "p"})),
                    None,
                    None,
                )
                .result
                .expect("upsert");
        }
        for (text, expected) in [
            ("SELECT VALUE 1", json!([1])),
            ("SELECT ABS(-2) AS a", json!([{"a": 2}])),
            ("SELECT VALUE COUNT(1)", json!([1])),
            ("SELECT VALUE 1 WHERE false", json!([])),
        ] {
            let (rows, metrics) = query_on(&f.engine, path, text, false, 2).expect("runs");
            assert_eq!(Value::Array(rows), expected, "{text}");
            assert_eq!(
                (metrics.documents_examined, metrics.index_entries_examined),
                (0, 0),
                "{text}: reads nothing"
            );
        }
    }
}

mod optimistic;
mod ordered_review;
mod patch_create;
mod placement;
mod query_gather;
mod replicated;
