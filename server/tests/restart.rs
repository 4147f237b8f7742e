//! Restarts of the real `mayfly` binary on the same data directory: what was acknowledged is
//! there afterwards (catalog, settings, documents with their etags and instants), what expired
//! while the server was down is gone from the first request on, etags are never handed out
//! twice, and a data directory the server must not use is refused with a clear message,
//! untouched.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        Collection, CreateCollectionRequest, CreateDatabaseRequest, CreateDocumentRequest,
        DeleteCollectionRequest, DeleteDatabaseRequest, DeleteDocumentRequest, Document,
        GetCollectionRequest, GetDatabaseRequest, IndexingMode, ListCollectionsRequest,
        ListDatabasesRequest, ReadDocumentRequest, ReadFeedRequest, ReplaceCollectionRequest,
        TouchDocumentRequest, oneofs::DefaultTtlState,
    },
};
use mayfly_server::storage::FORMAT_VERSION;
use serde_json::{Map, Value, json};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

mod support;

use support::clients::{Clients, connect, string_pk};
use support::{Failed, Mayfly};

// ---------------------------------------------------------------------------------------------
// Helpers
//
// The async tests run on a multi-threaded runtime: `Mayfly::terminate`, `kill9` and `start`
// block their thread, and on a single-threaded runtime the client's connection could not
// answer the server's GOAWAY and PING during a graceful shutdown, which then never ends.

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not a JSON object: {other}"),
    }
}

impl Clients {
    async fn create_database(&mut self, id: &str) {
        self.databases
            .create_database(CreateDatabaseRequest {
                id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create database {id}: {e:?}"));
    }

    async fn create_collection(
        &mut self,
        database: &str,
        id: &str,
        partition_key_path: &str,
        default_ttl: Option<i64>,
        indexing_mode: IndexingMode,
    ) -> Collection {
        self.collections
            .create_collection(CreateCollectionRequest {
                database: database.into(),
                id: id.into(),
                partition_key_path: partition_key_path.into(),
                default_ttl,
                indexing_mode: indexing_mode.into(),
                indexing_paths: None,
                must_live: None,
                change_feed_retention: None,
                throughput: None,
            })
            .await
            .unwrap_or_else(|e| panic!("create collection {database}/{id}: {e:?}"))
            .into_inner()
    }

    async fn replace_default_ttl(
        &mut self,
        database: &str,
        id: &str,
        state: DefaultTtlState,
    ) -> Collection {
        self.collections
            .replace_collection(ReplaceCollectionRequest {
                database: database.into(),
                id: id.into(),
                default_ttl: Some(mayfly_proto::v1::DefaultTtl { state: Some(state) }),
                indexing_mode: 0,
                indexing_paths: None,
                must_live: None,
                change_feed_retention: None,
            })
            .await
            .unwrap_or_else(|e| panic!("replace collection {database}/{id}: {e:?}"))
            .into_inner()
    }

    async fn get_collection(&mut self, database: &str, id: &str) -> Result<Collection, Status> {
        self.collections
            .get_collection(GetCollectionRequest {
                database: database.into(),
                id: id.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn list_collections(&mut self, database: &str) -> Vec<Collection> {
        self.collections
            .list_collections(ListCollectionsRequest {
                database: database.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("list collections of {database}: {e:?}"))
            .into_inner()
            .collections
    }

    async fn list_databases(&mut self) -> Vec<String> {
        self.databases
            .list_databases(ListDatabasesRequest {})
            .await
            .expect("list databases")
            .into_inner()
            .databases
            .into_iter()
            .map(|d| d.id)
            .collect()
    }

    async fn create(
        &mut self,
        database: &str,
        collection: &str,
        body: Value,
        ttl: Option<i64>,
    ) -> Document {
        self.documents
            .create_document(CreateDocumentRequest {
                database: database.into(),
                collection: collection.into(),
                body: Some(JsonObject::new(object(body.clone()))),
                partition_key: None,
                ttl,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create {body} in {database}/{collection}: {e:?}"))
            .into_inner()
    }

    async fn read(
        &mut self,
        database: &str,
        collection: &str,
        id: &str,
        pk: &str,
    ) -> Result<Document, Status> {
        self.documents
            .read_document(ReadDocumentRequest {
                database: database.into(),
                collection: collection.into(),
                id: id.into(),
                partition_key: Some(string_pk(pk)),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn touch(&mut self, database: &str, collection: &str, id: &str, pk: &str) -> Document {
        self.documents
            .touch_document(TouchDocumentRequest {
                database: database.into(),
                collection: collection.into(),
                id: id.into(),
                partition_key: Some(string_pk(pk)),
                if_match: String::new(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("touch {id}: {e:?}"))
            .into_inner()
    }

    async fn delete(&mut self, database: &str, collection: &str, id: &str, pk: &str) {
        self.documents
            .delete_document(DeleteDocumentRequest {
                database: database.into(),
                collection: collection.into(),
                id: id.into(),
                partition_key: Some(string_pk(pk)),
                if_match: String::new(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("delete {id}: {e:?}"));
    }

    /// Ids of every live document of a collection, through the read feed.
    async fn feed_ids(&mut self, database: &str, collection: &str) -> Vec<String> {
        let mut stream = self
            .documents
            .read_feed(ReadFeedRequest {
                database: database.into(),
                collection: collection.into(),
                partition_key: None,
                page_size: 0,
                continuation: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("read feed of {database}/{collection}: {e:?}"))
            .into_inner();
        let mut ids = Vec::new();
        for _ in 0..1000 {
            match stream.message().await.expect("feed page") {
                Some(page) => ids.extend(page.documents.into_iter().map(|d| d.id)),
                None => return ids,
            }
        }
        panic!("the feed of {database}/{collection} did not end within 1000 pages");
    }
}

/// Asserts that a read failed with NOT_FOUND because the document does not exist (not because
/// its collection or database is missing).
fn assert_document_not_found(result: Result<Document, Status>, what: &str) {
    let status = match result {
        Ok(doc) => panic!("{what}: expected NOT_FOUND, read {doc:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::NotFound, "{what}: {status:?}");
    let reason = status.get_details_error_info().map(|info| info.reason);
    assert_eq!(
        reason.as_deref(),
        Some("DOCUMENT_NOT_FOUND"),
        "{what}: {status:?}"
    );
}

fn instant(ts: &prost_types::Timestamp) -> SystemTime {
    let secs = u64::try_from(ts.seconds).expect("timestamp after 1970");
    let nanos = u32::try_from(ts.nanos).expect("nanos in range");
    UNIX_EPOCH + Duration::new(secs, nanos)
}

fn expires_at(doc: &Document) -> SystemTime {
    instant(
        doc.expires_at
            .as_ref()
            .unwrap_or_else(|| panic!("{} has an expiry: {doc:?}", doc.id)),
    )
}

fn modified_at(doc: &Document) -> SystemTime {
    instant(doc.modified_at.as_ref().expect("modified_at is always set"))
}

/// From the last write to the expiry instant.
fn lifetime(doc: &Document) -> Duration {
    expires_at(doc)
        .duration_since(modified_at(doc))
        .expect("expires after its last write")
}

/// What a restart must keep of a document: everything but `expires_in` (measured when read).
fn assert_same_document(after: &Document, before: &Document) {
    let strip = |doc: &Document| Document {
        expires_in: None,
        body: doc.body.clone().map(|b| JsonObject::new(b.into_map())),
        ..doc.clone()
    };
    assert_eq!(
        strip(after),
        strip(before),
        "document {} changed across the restart",
        before.id
    );
}

/// Sleeps until `at` (at once if it has passed); refuses waits longer than `max`.
async fn sleep_until(at: SystemTime, max: Duration) {
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        assert!(wait <= max, "would wait {wait:?}, more than {max:?}");
        tokio::time::sleep(wait).await;
    }
}

/// Reads `doc` repeatedly around its expiry instant. A read that certainly ended before the
/// instant must find it (unchanged); a read that certainly started at or after it must say
/// NOT_FOUND. Both kinds must be observed.
async fn observe_expiry(
    c: &mut Clients,
    database: &str,
    collection: &str,
    pk: &str,
    doc: &Document,
) {
    let due = expires_at(doc);
    sleep_until(due - Duration::from_millis(1500), Duration::from_secs(15)).await;
    let mut found_before = 0;
    let mut gone_after = 0;
    let give_up = SystemTime::now() + Duration::from_secs(10);
    loop {
        let before = SystemTime::now();
        let result = c.read(database, collection, &doc.id, pk).await;
        let after = SystemTime::now();
        match result {
            Ok(read) => {
                assert!(
                    before < due,
                    "{} still readable {:?} after its expiry instant",
                    doc.id,
                    before.duration_since(due).unwrap_or_default()
                );
                assert_same_document(&read, doc);
                if after < due {
                    found_before += 1;
                }
            }
            Err(status) => {
                assert!(
                    after >= due,
                    "{} gone {:?} before its expiry instant: {status:?}",
                    doc.id,
                    due.duration_since(after).unwrap_or_default()
                );
                assert_document_not_found(Err(status), &doc.id);
                if before >= due {
                    gone_after += 1;
                }
            }
        }
        if gone_after >= 3 && before >= due + Duration::from_millis(200) {
            break;
        }
        assert!(
            SystemTime::now() < give_up,
            "{}: no conclusive reads around its expiry (found before: {found_before}, gone after: {gone_after})",
            doc.id
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        found_before > 0,
        "{}: no read certainly before its expiry instant found it",
        doc.id
    );
}

/// Every file and directory under `root`: relative path → contents (`None` for a directory).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        for entry in fs::read_dir(dir).expect("list directory") {
            let path = entry.expect("directory entry").path();
            let relative = path.strip_prefix(root).expect("under root").to_path_buf();
            if path.is_dir() {
                out.insert(relative, None);
                walk(root, &path, out);
            } else {
                out.insert(relative, Some(fs::read(&path).expect("read file")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The directory is as it was, but for an empty `LOCK` file mayfly may have added (it takes
/// the lock before it looks at the directory's contents).
fn assert_untouched_but_for_lock(dir: &Path, before: &BTreeMap<PathBuf, Option<Vec<u8>>>) {
    let mut after = snapshot(dir);
    if !before.contains_key(Path::new("LOCK"))
        && let Some(lock) = after.remove(Path::new("LOCK"))
    {
        assert_eq!(lock, Some(Vec::new()), "an added LOCK file is empty");
    }
    assert_eq!(&after, before, "{} was changed", dir.display());
}

/// Starts mayfly expecting it to refuse; returns how it failed.
fn expect_refusal(data_dir: &Path, extra: &[&str]) -> Failed {
    let failed = match Mayfly::try_start(data_dir, extra) {
        Ok(server) => panic!(
            "mayfly started on {} (listening on {})",
            data_dir.display(),
            server.addr
        ),
        Err(failed) => failed,
    };
    assert!(!failed.status.success(), "exits non-zero: {failed:?}");
    assert_eq!(failed.status.code(), Some(1), "exit status: {failed:?}");
    failed
}

fn assert_stderr(failed: &Failed, expected: &str) {
    assert!(
        failed.stderr.contains(expected),
        "stderr should contain {expected:?}:\n{}",
        failed.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Expiry across restarts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_that_expires_while_down_is_not_found_on_the_first_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "events", "/pk", Some(2), IndexingMode::Unspecified)
        .await;
    let short = c
        .create("app", "events", json!({"id": "short", "pk": "p"}), Some(2))
        .await;
    let inherits = c
        .create("app", "events", json!({"id": "inherits", "pk": "q"}), None)
        .await;
    let long = c
        .create(
            "app",
            "events",
            json!({"id": "long", "pk": "p"}),
            Some(3600),
        )
        .await;
    assert_eq!(short.ttl, Some(2));
    assert_eq!(inherits.ttl, None);
    let read = c
        .read("app", "events", "short", "p")
        .await
        .expect("found before its ttl");
    assert_same_document(&read, &short);

    assert!(server.terminate().success(), "SIGTERM exits 0");
    let gone_by = expires_at(&short).max(expires_at(&inherits));
    assert!(expires_at(&long) > gone_by + Duration::from_secs(3000));
    sleep_until(gone_by + Duration::from_millis(100), Duration::from_secs(5)).await;

    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    // The very first request: judged by the stored instant, not by a rebuilt timer.
    assert_document_not_found(
        c.read("app", "events", "short", "p").await,
        "own ttl, expired while down",
    );
    assert_document_not_found(
        c.read("app", "events", "inherits", "q").await,
        "inherited ttl, expired while down",
    );
    let long_after = c
        .read("app", "events", "long", "p")
        .await
        .expect("the document with an hour to live survives the restart");
    assert_same_document(&long_after, &long);
    assert_eq!(c.feed_ids("app", "events").await, ["long"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_keeps_its_expiry_instant_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection(
        "app",
        "sessions",
        "/user",
        Some(6),
        IndexingMode::Unspecified,
    )
    .await;
    let own = c
        .create(
            "app",
            "sessions",
            json!({"id": "own", "user": "ann"}),
            Some(10),
        )
        .await;
    let inherits = c
        .create(
            "app",
            "sessions",
            json!({"id": "inherits", "user": "bob"}),
            None,
        )
        .await;
    assert_eq!(lifetime(&own), Duration::from_secs(10));
    assert_eq!(lifetime(&inherits), Duration::from_secs(6));

    server.kill9();
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    for (doc, pk) in [(&own, "ann"), (&inherits, "bob")] {
        let read = c
            .read("app", "sessions", &doc.id, pk)
            .await
            .unwrap_or_else(|e| panic!("{} survives kill -9: {e:?}", doc.id));
        // Same etag, _ts, modified_at and expires_at (exact Timestamp equality), same body.
        assert_same_document(&read, doc);
        assert!(
            SystemTime::now() + Duration::from_secs(3) < expires_at(doc),
            "the restart took too long for this test to mean anything"
        );
    }
    // Then each goes at exactly its instant: the inheriting one (6 s), then its own-ttl one.
    observe_expiry(&mut c, "app", "sessions", "bob", &inherits).await;
    observe_expiry(&mut c, "app", "sessions", "ann", &own).await;
    assert_eq!(c.feed_ids("app", "sessions").await, Vec::<String>::new());
}

/// Restarts on `data` in this process exactly as `mayfly` loads a data directory (catalog and
/// document metadata), but runs neither the expiry rebuild nor the purge: every document that
/// expired while the server was down is still stored and not marked by anything but the
/// rules. Turns TTL off in `collections` of `database` first, then reports, for each of
/// `documents` (collection, id, partition key), whether a read finds it and whether storage
/// still holds it; and how many documents are held.
fn turn_ttl_off_before_any_purge(
    data: &Path,
    database: &str,
    collections: &[&str],
    documents: &[(&str, &str, &str)],
) -> (Vec<(bool, bool)>, u64) {
    use mayfly_server::{
        engine::{
            CollectionPath, DefaultTtl, Engine, EngineConfig, Error, IdKind, PartitionKeyValue,
            ResourceId, SettingsChange, SystemClock,
        },
        storage::{DiskOptions, DiskStorage, DocKey, Durability, Storage},
    };
    use std::sync::Arc;

    let storage = Arc::new(
        DiskStorage::open(&DiskOptions {
            path: data.to_path_buf(),
            durability: Durability::Fsync,
            shards: None,
            cache_bytes: 1 << 20,
            read_cache_bytes: 1 << 20,
            open_files: None,
        })
        .expect("opens the data directory"),
    );
    let shards = storage.shard_count();
    let (engine, _) = Engine::open(
        EngineConfig::new(shards),
        storage.clone(),
        Arc::new(SystemClock),
    )
    .expect("loads the data directory");
    let id = |kind, raw: &str| ResourceId::parse(kind, raw).expect("valid id");
    let path = |collection: &str| CollectionPath {
        database: id(IdKind::Database, database),
        collection: id(IdKind::Collection, collection),
    };
    for &collection in collections {
        engine
            .replace_collection(
                &path(collection),
                SettingsChange {
                    default_ttl: DefaultTtl::Off,
                    indexing_mode: None,
                    index_paths: None,
                    must_live: None,
                    change_feed_retention: None,
                },
            )
            .expect("turn TTL off");
    }
    let seen = documents
        .iter()
        .map(|&(collection, doc, pk)| {
            let path = path(collection);
            let key = DocKey {
                partition_key: PartitionKeyValue::String(pk.into()),
                id: id(IdKind::Document, doc),
            };
            let found = match engine.read_document(&path, &key).result {
                Ok(_) => true,
                Err(Error::DocumentNotFound { .. }) => false,
                Err(e) => panic!("read {collection}/{doc}: {e}"),
            };
            let uid = engine.get_collection(&path).expect("collection").uid;
            let stored = (0..shards).any(|i| {
                storage
                    .shard(i)
                    .get(uid, &key)
                    .expect("storage read")
                    .is_some()
            });
            (found, stored)
        })
        .collect();
    (seen, engine.expiry_stats().documents)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_while_down_stays_expired_when_ttl_is_turned_off_right_after_the_restart() {
    // Expired is final: turning TTL off (which makes own ttls ignored and defaults absent) must
    // not revive documents that expired while the server was down and are not purged yet.
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "own", "/pk", Some(-1), IndexingMode::Unspecified)
        .await;
    c.create_collection("app", "inherit", "/pk", Some(1), IndexingMode::Unspecified)
        .await;
    let own = c
        .create("app", "own", json!({"id": "a", "pk": "p"}), Some(1))
        .await;
    let inherits = c
        .create("app", "inherit", json!({"id": "a", "pk": "p"}), None)
        .await;
    let kept = c
        .create("app", "own", json!({"id": "kept", "pk": "p"}), Some(3600))
        .await;
    server.kill9();
    let gone_by = expires_at(&own).max(expires_at(&inherits));
    sleep_until(gone_by + Duration::from_millis(100), Duration::from_secs(5)).await;

    // Restarted with nothing that could purge or mark them, TTL is turned off first: the
    // expired documents are still in storage when they are read, so only the rules recorded
    // by the settings change can keep them expired.
    let data_dir = data.clone();
    let (seen, held) = tokio::task::spawn_blocking(move || {
        turn_ttl_off_before_any_purge(
            &data_dir,
            "app",
            &["own", "inherit"],
            &[
                ("own", "a", "p"),
                ("inherit", "a", "p"),
                ("own", "kept", "p"),
            ],
        )
    })
    .await
    .expect("in-process restart");
    assert_eq!(
        seen,
        [(false, true), (false, true), (true, true)],
        "(found, stored) for own/a (own ttl, expired while down), inherit/a (inherited ttl, \
         expired while down) and own/kept, TTL then turned off"
    );
    assert_eq!(held, 3, "nothing was purged");

    // The real server on the same directory afterwards: the decision was durable, and the
    // server judges the same way (its purge may now delete them).
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    for collection in ["own", "inherit"] {
        let read = c
            .get_collection("app", collection)
            .await
            .expect("collection survives");
        assert_eq!(read.default_ttl, None, "TTL off survives the restart");
    }
    assert_document_not_found(
        c.read("app", "own", "a", "p").await,
        "own ttl, expired while down, TTL then turned off",
    );
    assert_document_not_found(
        c.read("app", "inherit", "a", "p").await,
        "inherited ttl, expired while down, TTL then turned off",
    );
    let read = c
        .read("app", "own", "kept", "p")
        .await
        .expect("unexpired document survives");
    assert_eq!(read.etag, kept.etag);
    assert_eq!(read.expires_at, None, "TTL off: its own ttl is ignored");
    assert_eq!(c.feed_ids("app", "own").await, ["kept"]);
    assert_eq!(c.feed_ids("app", "inherit").await, Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Catalog across restarts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_and_collections_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    for db in ["app", "audit", "dropped"] {
        c.create_database(db).await;
    }
    let sessions = c
        .create_collection(
            "app",
            "sessions",
            "/user",
            Some(1800),
            IndexingMode::Unspecified,
        )
        .await;
    let events = c
        .create_collection("app", "events", "/device/id", None, IndexingMode::Lazy)
        .await;
    let cache = c
        .create_collection("app", "cache", "/k", Some(-1), IndexingMode::Consistent)
        .await;
    c.create_collection("app", "changed", "/k", Some(60), IndexingMode::Unspecified)
        .await;
    let changed = c
        .replace_default_ttl("app", "changed", DefaultTtlState::Seconds(120))
        .await;
    c.create_collection(
        "app",
        "switched_off",
        "/k",
        Some(60),
        IndexingMode::Unspecified,
    )
    .await;
    let switched_off = c
        .replace_default_ttl("app", "switched_off", DefaultTtlState::Off(()))
        .await;
    c.create_collection("app", "gone", "/k", Some(-1), IndexingMode::Unspecified)
        .await;
    c.create_collection("audit", "log", "/pk", None, IndexingMode::Unspecified)
        .await;
    c.create_collection("dropped", "c", "/k", None, IndexingMode::Unspecified)
        .await;

    let session = c
        .create("app", "sessions", json!({"id": "s1", "user": "ann"}), None)
        .await;
    let inherits_changed = c
        .create("app", "changed", json!({"id": "d1", "k": "x"}), None)
        .await;
    c.create("app", "gone", json!({"id": "old", "k": "x"}), None)
        .await;
    c.create("dropped", "c", json!({"id": "old", "k": "x"}), None)
        .await;
    c.collections
        .delete_collection(DeleteCollectionRequest {
            database: "app".into(),
            id: "gone".into(),
        })
        .await
        .expect("delete collection");
    c.databases
        .delete_database(DeleteDatabaseRequest {
            id: "dropped".into(),
        })
        .await
        .expect("delete database");
    let app_before = c.list_collections("app").await;
    let audit_before = c.list_collections("audit").await;

    server.kill9();
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;

    assert_eq!(c.list_databases().await, ["app", "audit"]);
    let app_after = c.list_collections("app").await;
    assert_eq!(app_after, app_before);
    assert_eq!(c.list_collections("audit").await, audit_before);
    let ids: Vec<&str> = app_after.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        ["cache", "changed", "events", "sessions", "switched_off"]
    );
    // Each setting, explicitly (not only "as before").
    let get = |id: &str| {
        app_after
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("{id} listed"))
            .clone()
    };
    assert_eq!(get("sessions"), sessions);
    assert_eq!(sessions.default_ttl, Some(1800));
    assert_eq!(sessions.partition_key_path, "/user");
    assert_eq!(get("events"), events);
    assert_eq!(events.default_ttl, None);
    assert_eq!(events.partition_key_path, "/device/id");
    assert_eq!(events.indexing_mode, i32::from(IndexingMode::Lazy));
    assert_eq!(get("cache"), cache);
    assert_eq!(cache.default_ttl, Some(-1));
    assert_eq!(get("changed"), changed);
    assert_eq!(changed.default_ttl, Some(120), "the replaced default");
    assert_eq!(get("switched_off"), switched_off);
    assert_eq!(switched_off.default_ttl, None, "TTL turned off");
    assert_eq!(
        c.get_collection("app", "changed").await.expect("get"),
        changed
    );

    // Documents keep their instants, computed from the surviving settings.
    let read = c
        .read("app", "sessions", "s1", "ann")
        .await
        .expect("session survives");
    assert_same_document(&read, &session);
    assert_eq!(lifetime(&read), Duration::from_secs(1800));
    let read = c
        .read("app", "changed", "d1", "x")
        .await
        .expect("document survives");
    assert_same_document(&read, &inherits_changed);
    assert_eq!(
        lifetime(&read),
        Duration::from_secs(120),
        "inherits the replaced default after the restart"
    );

    // The deleted collection and database stay deleted, and so do their documents.
    let status = c
        .get_collection("app", "gone")
        .await
        .expect_err("deleted collection stays deleted");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = c
        .databases
        .get_database(GetDatabaseRequest {
            id: "dropped".into(),
        })
        .await
        .expect_err("deleted database stays deleted");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    c.create_collection("app", "gone", "/k", Some(-1), IndexingMode::Unspecified)
        .await;
    assert_document_not_found(
        c.read("app", "gone", "old", "x").await,
        "document of a collection deleted before the restart",
    );
    assert_eq!(c.feed_ids("app", "gone").await, Vec::<String>::new());
    c.create_database("dropped").await;
    c.create_collection("dropped", "c", "/k", None, IndexingMode::Unspecified)
        .await;
    assert_document_not_found(
        c.read("dropped", "c", "old", "x").await,
        "document of a database deleted before the restart",
    );
    assert_eq!(c.feed_ids("dropped", "c").await, Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Etags across restarts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_are_not_reused_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "docs", "/pk", None, IndexingMode::Unspecified)
        .await;
    // The only document ever written, deleted: nothing left in storage carries its versions.
    let mut seen = BTreeSet::new();
    seen.insert(
        c.create("app", "docs", json!({"id": "a", "pk": "p"}), None)
            .await
            .etag,
    );
    seen.insert(c.touch("app", "docs", "a", "p").await.etag);
    c.delete("app", "docs", "a", "p").await;
    assert_eq!(seen.len(), 2);

    server.kill9();
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    assert_document_not_found(
        c.read("app", "docs", "a", "p").await,
        "deleted stays deleted",
    );
    let again = c
        .create("app", "docs", json!({"id": "a", "pk": "p"}), None)
        .await;
    assert!(
        !seen.contains(&again.etag),
        "etag {} was handed out before the restart ({seen:?})",
        again.etag
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_are_not_reused_after_a_restart_when_their_collection_was_deleted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "docs", "/pk", None, IndexingMode::Unspecified)
        .await;
    let old_a = c
        .create("app", "docs", json!({"id": "a", "pk": "p"}), None)
        .await;
    let old_b = c
        .create("app", "docs", json!({"id": "b", "pk": "p"}), None)
        .await;
    let seen = BTreeSet::from([old_a.etag.clone(), old_b.etag]);
    c.collections
        .delete_collection(DeleteCollectionRequest {
            database: "app".into(),
            id: "docs".into(),
        })
        .await
        .expect("delete collection");

    server.kill9();
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_collection("app", "docs", "/pk", None, IndexingMode::Unspecified)
        .await;
    for id in ["a", "b"] {
        let again = c
            .create("app", "docs", json!({"id": id, "pk": "p"}), None)
            .await;
        if id == "a" {
            // What a reused etag breaks: a client still holding the old document's etag must
            // not be able to delete the new document conditionally.
            let conditional = c
                .documents
                .delete_document(DeleteDocumentRequest {
                    database: "app".into(),
                    collection: "docs".into(),
                    id: "a".into(),
                    partition_key: Some(string_pk("p")),
                    if_match: old_a.etag.clone(),
                    ..Default::default()
                })
                .await;
            assert_eq!(
                conditional.as_ref().err().map(Status::code),
                Some(Code::FailedPrecondition),
                "a delete with if_match {} (the etag of the document deleted with its \
                 collection before the restart) must fail on the new document, whose etag is {}: {conditional:?}",
                old_a.etag,
                again.etag
            );
        }
        assert!(
            !seen.contains(&again.etag),
            "etag {} of {id} was handed out before the restart ({seen:?})",
            again.etag
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_are_not_reused_after_a_restart_when_their_database_was_deleted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "docs", "/pk", None, IndexingMode::Unspecified)
        .await;
    let first = c
        .create("app", "docs", json!({"id": "a", "pk": "p"}), None)
        .await;
    c.databases
        .delete_database(DeleteDatabaseRequest { id: "app".into() })
        .await
        .expect("delete database");

    assert!(server.terminate().success(), "SIGTERM exits 0");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    c.create_collection("app", "docs", "/pk", None, IndexingMode::Unspecified)
        .await;
    let again = c
        .create("app", "docs", json!({"id": "a", "pk": "p"}), None)
        .await;
    assert_ne!(
        again.etag, first.etag,
        "etag handed out again after the restart"
    );
}

// ---------------------------------------------------------------------------------------------
// Data directories mayfly must refuse

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_held_by_another_server_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let first = Mayfly::start(&data, &[]);
    let mut c = connect(&first).await;
    c.create_database("app").await;
    c.create_collection("app", "docs", "/pk", Some(-1), IndexingMode::Unspecified)
        .await;
    let doc = c
        .create("app", "docs", json!({"id": "a", "pk": "p"}), None)
        .await;

    let failed = expect_refusal(&data, &[]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: data directory {} is in use by another mayfly process (it holds {}/LOCK)",
            data.display(),
            data.display()
        ),
    );

    // The first server is unharmed: it reads and writes as before.
    let read = c
        .read("app", "docs", "a", "p")
        .await
        .expect("still served by the first server");
    assert_same_document(&read, &doc);
    let second = c
        .create("app", "docs", json!({"id": "b", "pk": "p"}), None)
        .await;

    assert!(first.terminate().success(), "SIGTERM exits 0");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    for (doc, id) in [(&doc, "a"), (&second, "b")] {
        let read = c
            .read("app", "docs", id, "p")
            .await
            .unwrap_or_else(|e| panic!("{id} survives: {e:?}"));
        assert_same_document(&read, doc);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_keeps_its_shard_count() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    c.create_database("app").await;
    server.kill9();

    let failed = expect_refusal(&data, &["--shards", "3"]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: data directory {} was created with 2 shards but --shards 3 was given",
            data.display()
        ),
    );
    let server = Mayfly::start(&data, &[]);
    let mut c = connect(&server).await;
    assert_eq!(c.list_databases().await, ["app"]);
}

#[test]
fn a_data_dir_from_a_newer_format_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    fs::create_dir_all(data.join("db")).expect("mkdir");
    fs::write(data.join("FORMAT"), "mayfly-data-format 99\n").expect("write FORMAT");
    fs::write(data.join("db/journal-0001"), b"\x00\x01future bytes\xff").expect("write");
    fs::write(data.join("NOTES"), "written by mayfly 9\n").expect("write");
    let before = snapshot(&data);

    let failed = expect_refusal(&data, &[]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: data directory {} has data format 99, written by a newer Mayfly; this build reads formats 1 to {FORMAT_VERSION}. Nothing was changed",
            data.display()
        ),
    );
    assert_untouched_but_for_lock(&data, &before);
}

#[test]
fn an_unwritable_data_dir_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = tempfile::tempdir().expect("temp dir");
    // A path that cannot be a directory: its parent is a regular file.
    let file = dir.path().join("a-file");
    fs::write(&file, "not a directory\n").expect("write");
    let data = file.join("data");
    let failed = expect_refusal(&data, &[]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: cannot create the data directory {}: ",
            data.display()
        ),
    );
    assert_eq!(
        fs::read_to_string(&file).expect("still a file"),
        "not a directory\n"
    );

    // Permission bits: only meaningful without privileges (root ignores them).
    let read_only = dir.path().join("read-only");
    fs::create_dir(&read_only).expect("mkdir");
    fs::set_permissions(&read_only, fs::Permissions::from_mode(0o555)).expect("chmod");
    let probe = read_only.join("probe");
    if fs::write(&probe, "").is_ok() {
        eprintln!(
            "skipping the permission-bits case: this process could write into a 0o555 \
             directory, so it is privileged (root or CAP_DAC_OVERRIDE) and mayfly would be too"
        );
        fs::remove_file(&probe).expect("remove probe");
    } else {
        let inside = read_only.join("data");
        let failed = expect_refusal(&inside, &[]);
        assert_stderr(
            &failed,
            &format!(
                "mayfly: cannot start: cannot create the data directory {}: ",
                inside.display()
            ),
        );
        let failed = expect_refusal(&read_only, &[]);
        assert_stderr(
            &failed,
            &format!(
                "mayfly: cannot start: cannot create the lock file in {}: ",
                read_only.display()
            ),
        );
        assert_eq!(
            fs::read_dir(&read_only).expect("list").count(),
            0,
            "nothing created"
        );
    }
    fs::set_permissions(&read_only, fs::Permissions::from_mode(0o755)).expect("chmod back");
}

#[test]
fn a_non_mayfly_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Someone else's files, no FORMAT.
    let data = dir.path().join("photos");
    fs::create_dir_all(data.join("2026")).expect("mkdir");
    fs::write(data.join("2026/beach.jpg"), b"\xff\xd8\xff\xe0 not really").expect("write");
    fs::write(data.join("README"), "my photos\n").expect("write");
    let before = snapshot(&data);
    let failed = expect_refusal(&data, &[]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: {} is not empty and is not a Mayfly data directory",
            data.display()
        ),
    );
    assert_untouched_but_for_lock(&data, &before);

    // A FORMAT file that is not Mayfly's.
    let other = dir.path().join("other");
    fs::create_dir(&other).expect("mkdir");
    fs::write(other.join("FORMAT"), "ext4 is a file system\n").expect("write");
    let before = snapshot(&other);
    let failed = expect_refusal(&other, &[]);
    assert_stderr(
        &failed,
        &format!(
            "mayfly: cannot start: {} is not empty and is not a Mayfly data directory",
            other.display()
        ),
    );
    assert_untouched_but_for_lock(&other, &before);
}
