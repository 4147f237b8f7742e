//! End to end: the real client against a real server over gRPC on 127.0.0.1:0.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use mayfly_client::{
    Client, Collection, CollectionSettings, DefaultTtl, DeleteOutcome, DocumentTtl, Error,
    IndexingMode, PartitionKey, ReplaceOutcome, TouchOutcome, UpsertOutcome,
};
use mayfly_proto::v1;
use mayfly_server::{
    CurrentEngine, RunningServer,
    engine::{CollectionUid, Engine, EngineConfig, SystemClock},
    storage::{
        CatalogChange, ChangeLog, DocKey, DurableFuture, Lsn, MemoryStorage, ScanRange, ShardStore,
        Storage, StorageError, StoredCatalog, StoredDocument, StoredMeta, WriteBatch,
    },
};
use serde_json::json;
use tokio::sync::watch;

#[path = "support/cluster.rs"]
mod cluster;

const TTL_RULE: &str = "is invalid. Ensure to provide a nonzero positive integer less than or equal to '2147483647', or '-1' which means never expire.";

/// A target the cases run against: one server, or a node of a cluster.
struct Setup {
    /// The server, where it is one in this process (a case may look inside it).
    server: Option<RunningServer>,
    /// The address the client calls.
    addr: String,
    client: Client,
}

async fn start() -> Setup {
    let server = RunningServer::start(Default::default())
        .await
        .expect("server starts");
    let addr = server.local_addr().to_string();
    let client = Client::connect(&addr).await.expect("client connects");
    Setup {
        server: Some(server),
        addr,
        client,
    }
}

impl Setup {
    async fn collection(&self, ttl: DefaultTtl) -> Collection {
        let db = match self.client.create_database("db").await {
            Ok(db) => db,
            Err(Error::Conflict(_)) => self.client.database("db"),
            Err(e) => panic!("{e}"),
        };
        let name = format!("c{}", db.list_collections().await.expect("list").len());
        db.create_collection(&name, "/pk")
            .default_ttl(ttl)
            .await
            .expect("collection")
    }

    fn documents(&self) -> v1::client::DocumentsClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect_lazy();
        v1::client::DocumentsClient::new(channel).max_encoding_message_size(usize::MAX)
    }
}

/// The cases above that look at the server only through the API, through one node of a
/// three-node cluster: most partitions they write and read are served by the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_pass_through_a_node_of_a_three_node_cluster() {
    let (cluster, client) = cluster::three_nodes().await;
    let s = Setup {
        server: None,
        addr: cluster.addr.clone(),
        client,
    };
    // Each case as on a fresh server: the cluster's databases deleted before it.
    cluster::delete_every_database(&s.client).await;
    crud_round_trip_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    partitions_of_every_key_type_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    etags_guard_every_write_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    not_found_and_conflict_statuses_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    invalid_input_is_rejected_precisely_and_changes_nothing_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    requests_the_typed_client_cannot_make_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    documents_expire_on_time_with_real_clocks_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    touch_and_rewrites_extend_life_over_real_time_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    read_feed_streams_pages_and_resumes_on(&s).await;
    cluster::delete_every_database(&s.client).await;
    large_documents_page_under_the_message_limit_on(&s).await;
}

fn invalid(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(details)) => details.message().to_owned(),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[tokio::test]
async fn crud_round_trip() {
    crud_round_trip_on(&start().await).await;
}

async fn crud_round_trip_on(s: &Setup) {
    let c = s.collection(DefaultTtl::Off).await;
    let created = c
        .create(&json!({"id": "a", "pk": "p", "n": 1}))
        .await
        .expect("create");
    assert_eq!(created.id(), "a");
    assert_eq!(created.partition_key(), &PartitionKey::from("p"));
    assert_eq!(
        created.body(),
        json!({"id": "a", "pk": "p", "n": 1})
            .as_object()
            .expect("object")
    );
    assert_eq!(created.ttl(), DocumentTtl::Inherit);
    assert_eq!(created.expires_at(), None);
    assert!(created.ts() > 1_700_000_000);
    let read = c.read("a", "p").await.expect("read").expect("exists");
    assert_eq!(read.etag(), created.etag());
    let replaced = c
        .replace("a", "p", &json!({"id": "a", "pk": "p", "n": 2}))
        .await
        .expect("replace")
        .into_document()
        .expect("was there");
    assert_ne!(replaced.etag(), created.etag());
    let upserted = c
        .upsert(&json!({"id": "a", "pk": "p", "n": 3}))
        .await
        .expect("upsert");
    assert!(matches!(upserted, UpsertOutcome::Replaced(ref d) if d.body()["n"] == 3));
    let TouchOutcome::Touched(touched) = c.touch("a", "p").await.expect("touch") else {
        panic!("missing")
    };
    assert_eq!(touched.body()["n"], 3);
    assert_eq!(
        c.read_feed()
            .await
            .expect("feed")
            .collect_all()
            .await
            .expect("pages")
            .len(),
        1
    );
    assert_eq!(
        c.delete_document("a", "p").await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert!(c.read("a", "p").await.expect("read").is_none());
    assert_eq!(
        c.delete_document("a", "p").await.expect("delete"),
        DeleteOutcome::Missing
    );
    assert_eq!(
        c.touch("a", "p").await.expect("touch"),
        TouchOutcome::Missing
    );
}

#[tokio::test]
async fn partitions_of_every_key_type() {
    partitions_of_every_key_type_on(&start().await).await;
}

async fn partitions_of_every_key_type_on(s: &Setup) {
    let c = s.collection(DefaultTtl::Off).await;
    let bodies = [
        (json!({"id": "x", "pk": "s"}), PartitionKey::from("s")),
        (json!({"id": "x", "pk": 42}), PartitionKey::from(42i64)),
        (json!({"id": "x", "pk": true}), PartitionKey::from(true)),
        (json!({"id": "x", "pk": null}), PartitionKey::Null),
        (json!({"id": "x"}), PartitionKey::Undefined),
    ];
    for (body, pk) in &bodies {
        let doc = c.create(body).await.expect("same id, another partition");
        assert_eq!(doc.partition_key(), pk);
    }
    for (body, pk) in &bodies {
        let doc = c
            .read("x", pk.clone())
            .await
            .expect("read")
            .expect("exists");
        assert_eq!(doc.body(), body.as_object().expect("object"));
    }
    assert!(matches!(
        c.create(&bodies[0].0).await,
        Err(Error::Conflict(_))
    ));
    assert_eq!(
        c.read_feed()
            .partition_key(42i64)
            .await
            .expect("feed")
            .collect_all()
            .await
            .expect("pages")
            .len(),
        1
    );

    let db = s.client.database("db");
    let nested = db
        .create_collection("nested", "/address/zip")
        .await
        .expect("nested path");
    nested
        .create(&json!({"id": "h", "address": {"zip": "98052"}}))
        .await
        .expect("create");
    assert!(nested.read("h", "98052").await.expect("read").is_some());
}

#[tokio::test]
async fn etags_guard_every_write() {
    etags_guard_every_write_on(&start().await).await;
}

async fn etags_guard_every_write_on(s: &Setup) {
    let c = s.collection(DefaultTtl::NoDefault).await;
    let v1 = c
        .create(&json!({"id": "a", "pk": "p"}))
        .await
        .expect("create");
    let v2 = c
        .replace("a", "p", &json!({"id": "a", "pk": "p", "v": 2}))
        .if_match(v1.etag())
        .await
        .expect("fresh etag")
        .into_document()
        .expect("was there");
    let stale = v1.etag();
    let precondition = |r: Result<(), Error>| matches!(r, Err(Error::PreconditionFailed(_)));
    assert!(precondition(
        c.replace("a", "p", &json!({"id": "a", "pk": "p"}))
            .if_match(stale)
            .await
            .map(drop)
    ));
    assert!(precondition(
        c.upsert(&json!({"id": "a", "pk": "p"}))
            .if_match(stale)
            .await
            .map(drop)
    ));
    assert!(precondition(
        c.touch("a", "p").if_match(stale).await.map(drop)
    ));
    assert!(precondition(
        c.delete_document("a", "p").if_match(stale).await.map(drop)
    ));
    let now = c.read("a", "p").await.expect("read").expect("exists");
    assert_eq!(
        now.etag(),
        v2.etag(),
        "failed preconditions changed nothing"
    );
    assert_eq!(
        c.delete_document("a", "p")
            .if_match(v2.etag())
            .await
            .expect("delete"),
        DeleteOutcome::Deleted
    );
}

#[tokio::test]
async fn not_found_and_conflict_statuses() {
    not_found_and_conflict_statuses_on(&start().await).await;
}

async fn not_found_and_conflict_statuses_on(s: &Setup) {
    let db = s.client.create_database("db").await.expect("db");
    assert!(matches!(
        s.client.create_database("db").await,
        Err(Error::Conflict(_))
    ));
    db.create_collection("c", "/pk").await.expect("collection");
    assert!(matches!(
        db.create_collection("c", "/pk").await,
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        s.client.database("nope").list_collections().await,
        Err(Error::DatabaseNotFound(_))
    ));
    assert!(matches!(
        s.client
            .database("nope")
            .create_collection("c", "/pk")
            .await,
        Err(Error::DatabaseNotFound(_))
    ));
    let missing = db.collection("missing");
    assert!(matches!(
        missing.info().await,
        Err(Error::CollectionNotFound(_))
    ));
    // A misspelt collection is an error, not a quiet "no such document".
    assert!(
        matches!(missing.read("a", "p").await, Err(Error::CollectionNotFound(m)) if m.message().contains("collection 'missing'"))
    );
    assert!(matches!(
        missing.touch("a", "p").await,
        Err(Error::CollectionNotFound(_))
    ));
    assert!(matches!(
        missing.delete_document("a", "p").await,
        Err(Error::CollectionNotFound(_))
    ));
    assert!(matches!(
        missing.create(&json!({"id": "a"})).await,
        Err(Error::CollectionNotFound(_))
    ));
    let c = db.collection("c");
    assert!(matches!(
        c.replace("a", "p", &json!({"id": "a", "pk": "p"})).await,
        Ok(ReplaceOutcome::Missing)
    ));
    assert!(matches!(
        s.client.database("nope").delete().await,
        Err(Error::DatabaseNotFound(_))
    ));
}

#[tokio::test]
async fn invalid_input_is_rejected_precisely_and_changes_nothing() {
    invalid_input_is_rejected_precisely_and_changes_nothing_on(&start().await).await;
}

async fn invalid_input_is_rejected_precisely_and_changes_nothing_on(s: &Setup) {
    let db = s.client.create_database("db").await.expect("db");
    // Collection settings.
    for (raw, ttl) in [
        ("0", DefaultTtl::After(Duration::ZERO)),
        (
            "2147483648",
            DefaultTtl::After(Duration::from_secs(2_147_483_648)),
        ),
    ] {
        let message = invalid(db.create_collection("c", "/pk").default_ttl(ttl).await);
        assert_eq!(message, format!("The input defaultTtl '{raw}' {TTL_RULE}"));
    }
    let message = invalid(
        db.create_collection("c", "/pk")
            .indexing_mode(IndexingMode::None)
            .default_ttl(DefaultTtl::NoDefault)
            .await,
    );
    assert_eq!(
        message,
        "Indexing mode value cannot be 'none' when 'defaultTtl' is specified in the collection"
    );
    assert!(invalid(db.create_collection("c", "pk").await).contains("must start with '/'"));
    assert!(invalid(db.create_collection("a/b", "/pk").await).contains("invalid collection id"));
    assert!(invalid(s.client.create_database(&"x".repeat(256)).await).contains("256 characters"));
    assert!(
        db.list_collections().await.expect("list").is_empty(),
        "nothing was created"
    );

    let c = db
        .create_collection("c", "/pk")
        .default_ttl(DefaultTtl::After(Duration::from_secs(3600)))
        .await
        .expect("c");
    let message = invalid(
        c.replace_settings(
            CollectionSettings::new(DefaultTtl::NoDefault).indexing_mode(IndexingMode::None),
        )
        .await,
    );
    assert!(message.starts_with("Indexing mode value cannot be 'none'"));
    assert_eq!(
        c.info().await.expect("info").default_ttl,
        DefaultTtl::After(Duration::from_secs(3600))
    );

    let original = c
        .create(&json!({"id": "a", "pk": "p", "v": 1}))
        .await
        .expect("create");
    // Document TTLs, with the raw value in Cosmos DB's message.
    for (ttl, raw) in [
        (json!(0), "0"),
        (json!(-10), "-10"),
        (json!(null), "null"),
        (json!(1.5), "1.5"),
        (json!("60"), "\"60\""),
        (json!(true), "true"),
        (json!({"s": 1}), "{\"s\":1}"),
        (json!([1]), "[1]"),
        (json!(2_147_483_648i64), "2147483648"),
    ] {
        let body = json!({"id": "a", "pk": "p", "v": 2, "ttl": ttl});
        assert_eq!(
            invalid(c.upsert(&body).await),
            format!("The input ttl '{raw}' {TTL_RULE}")
        );
        assert_eq!(
            invalid(c.replace("a", "p", &body).await),
            format!("The input ttl '{raw}' {TTL_RULE}")
        );
        let new = json!({"id": "new", "pk": "p", "ttl": ttl});
        assert_eq!(
            invalid(c.create(&new).await),
            format!("The input ttl '{raw}' {TTL_RULE}")
        );
    }
    let message = invalid(
        c.create(&json!({"id": "b", "pk": "p"}))
            .ttl(DocumentTtl::After(Duration::ZERO))
            .await,
    );
    assert_eq!(message, format!("The input ttl '0' {TTL_RULE}"));
    // Ids, partition keys, size and depth.
    assert!(invalid(c.create(&json!({"pk": "p"})).await).contains("needs a string \"id\""));
    assert!(invalid(c.create(&json!({"id": 7, "pk": "p"})).await).contains("a number"));
    assert!(
        invalid(c.create(&json!({"id": "a?b", "pk": "p"})).await).contains("invalid document id")
    );
    assert!(invalid(c.create(&json!({"id": "b", "pk": {"o": 1}})).await).contains("an object"));
    assert!(
        invalid(
            c.create(&json!({"id": "b", "pk": "p"}))
                .partition_key("q")
                .await
        )
        .contains("does not match")
    );
    let big = "x".repeat(2 * 1024 * 1024);
    assert!(
        invalid(c.upsert(&json!({"id": "a", "pk": "p", "big": big})).await)
            .contains("the limit is 2097152 bytes")
    );
    let mut deep = json!(1);
    for _ in 0..128 {
        deep = json!({ "d": deep });
    }
    assert!(
        invalid(c.upsert(&json!({"id": "a", "pk": "p", "deep": deep})).await)
            .contains("deeper than 128 levels")
    );
    let mut ok_deep = json!(1);
    for _ in 0..126 {
        ok_deep = json!({ "d": ok_deep });
    }
    c.create(&json!({"id": "deep", "pk": "p", "deep": ok_deep}))
        .await
        .expect("128 levels are accepted");
    // Feed arguments.
    assert!(invalid(c.read_feed().page_size(1001).await.map(drop)).contains("page_size 1001"));
    assert!(
        invalid(c.read_feed().continuation("garbage!").await.map(drop)).contains("continuation")
    );

    let now = c.read("a", "p").await.expect("read").expect("exists");
    assert_eq!(
        now.etag(),
        original.etag(),
        "no rejected write changed the document"
    );
    assert_eq!(now.modified_at(), original.modified_at(), "_ts unchanged");
    assert!(c.read("new", "p").await.expect("read").is_none());
}

#[tokio::test]
async fn requests_the_typed_client_cannot_make() {
    requests_the_typed_client_cannot_make_on(&start().await).await;
}

async fn requests_the_typed_client_cannot_make_on(s: &Setup) {
    let c = s.collection(DefaultTtl::Off).await;
    let mut raw = s.documents();
    let status = raw
        .read_document(v1::ReadDocumentRequest {
            database: "db".into(),
            collection: c.id().into(),
            id: "a".into(),
            partition_key: None,
        })
        .await
        .expect_err("no partition key");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("partition_key"),
        "{}",
        status.message()
    );
    let status = raw
        .create_document(v1::CreateDocumentRequest {
            database: "db".into(),
            collection: c.id().into(),
            body: None,
            partition_key: None,
            ttl: None,
            ..Default::default()
        })
        .await
        .expect_err("no body");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let body = json!({"id": "a", "pk": "p", "ttl": 5});
    let status = raw
        .create_document(v1::CreateDocumentRequest {
            database: "db".into(),
            collection: c.id().into(),
            body: Some(body.as_object().expect("object").clone().into()),
            partition_key: None,
            ttl: Some(6),
            ..Default::default()
        })
        .await
        .expect_err("two different ttls");
    assert!(status.message().contains("differ"), "{}", status.message());

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.addr))
        .expect("uri")
        .connect_lazy();
    let mut collections = v1::client::CollectionsClient::new(channel);
    let status = collections
        .replace_collection(v1::ReplaceCollectionRequest {
            database: "db".into(),
            id: c.id().into(),
            default_ttl: None,
            indexing_mode: 0,
            indexing_paths: None,
            must_live: None,
            change_feed_retention: None,
        })
        .await
        .expect_err("a replace must state the TTL");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("{\"off\": {}}"),
        "{}",
        status.message()
    );
    let status = collections
        .create_collection(v1::CreateCollectionRequest {
            database: "db".into(),
            id: "e".into(),
            partition_key_path: "/pk".into(),
            default_ttl: None,
            indexing_mode: 42,
            indexing_paths: None,
            must_live: None,
            change_feed_retention: None,
            throughput: None,
        })
        .await
        .expect_err("unknown enum value");
    assert!(status.message().contains("42"), "{}", status.message());
}

/// Reads `id` and checks the answer against the clock: visible means the server's reading was
/// before `expires_at`, NOT_FOUND means it was at or after. The server and this test share the
/// machine's clock, so this holds exactly, however loaded the machine is.
async fn probe(c: &Collection, id: &str, expires_at: SystemTime) -> bool {
    let before = SystemTime::now();
    let found = c.read(id, "p").await.expect("read").is_some();
    let after = SystemTime::now();
    if found {
        assert!(before < expires_at, "{id} visible after its expiry instant");
    } else {
        assert!(after >= expires_at, "{id} gone before its expiry instant");
    }
    found
}

/// Probes until the document is gone (at most `limit`), returning whether it was seen alive.
async fn watch_until_gone(
    c: &Collection,
    id: &str,
    expires_at: SystemTime,
    limit: Duration,
) -> bool {
    let start = Instant::now();
    let mut seen_alive = false;
    while probe(c, id, expires_at).await {
        seen_alive = true;
        assert!(start.elapsed() < limit, "{id} outlived {limit:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    seen_alive
}

#[tokio::test]
async fn documents_expire_on_time_with_real_clocks() {
    documents_expire_on_time_with_real_clocks_on(&start().await).await;
}

async fn documents_expire_on_time_with_real_clocks_on(s: &Setup) {
    let c = s
        .collection(DefaultTtl::After(Duration::from_secs(2)))
        .await;
    let own = c
        .create(&json!({"id": "own", "pk": "p"}))
        .ttl(DocumentTtl::After(Duration::from_secs(1)))
        .await
        .expect("create");
    let inherits = c
        .create(&json!({"id": "inherits", "pk": "p"}))
        .await
        .expect("create");
    let never = c
        .create(&json!({"id": "never", "pk": "p"}))
        .ttl(DocumentTtl::Never)
        .await
        .expect("create");
    let own_at = own.expires_at().expect("expires");
    let inherits_at = inherits.expires_at().expect("expires");
    assert_eq!(
        own_at.duration_since(own.modified_at()).expect("after"),
        Duration::from_secs(1)
    );
    assert_eq!(
        inherits_at
            .duration_since(inherits.modified_at())
            .expect("after"),
        Duration::from_secs(2)
    );
    assert_eq!(never.expires_at(), None);
    assert!(watch_until_gone(&c, "own", own_at, Duration::from_secs(10)).await);
    assert!(watch_until_gone(&c, "inherits", inherits_at, Duration::from_secs(10)).await);
    assert!(c.read("never", "p").await.expect("read").is_some());
    // The purge frees storage in the background (looked at inside a server of this process).
    let Some(server) = &s.server else { return };
    let engine = server.engine().get().expect("in service");
    let start = Instant::now();
    while engine.expiry_stats().documents > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "purge did not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn touch_and_rewrites_extend_life_over_real_time() {
    touch_and_rewrites_extend_life_over_real_time_on(&start().await).await;
}

async fn touch_and_rewrites_extend_life_over_real_time_on(s: &Setup) {
    let c = s
        .collection(DefaultTtl::After(Duration::from_secs(2)))
        .await;
    let mut doc = c
        .create(&json!({"id": "s", "pk": "p"}))
        .await
        .expect("create");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        doc = match c.touch("s", "p").await.expect("touch") {
            TouchOutcome::Touched(d) => d,
            TouchOutcome::Missing => panic!("expired despite touches"),
        };
        assert_eq!(
            doc.expires_at()
                .expect("expires")
                .duration_since(doc.modified_at())
                .expect("after"),
            Duration::from_secs(2)
        );
    }
    // 2.1 s after creation, alive thanks to the touches; then gone 2 s after the last one.
    assert!(
        watch_until_gone(
            &c,
            "s",
            doc.expires_at().expect("expires"),
            Duration::from_secs(10)
        )
        .await
    );
    // Expired: a create of the same id makes a new document, an upsert with the old etag fails.
    assert!(matches!(
        c.upsert(&json!({"id": "s", "pk": "p"}))
            .if_match(doc.etag())
            .await,
        Err(Error::PreconditionFailed(_))
    ));
    let new = c
        .create(&json!({"id": "s", "pk": "p", "fresh": true}))
        .await
        .expect("create after expiry");
    assert_ne!(new.etag(), doc.etag());
}

/// Memory storage whose purge deletes become durable only once the test releases them. The
/// purge is the only caller of `ShardStore::durable`, and it waits for a batch's delete to be
/// durable before its next batch: so the first batch that deletes anything leaves its shard's
/// purge waiting, and from then on nothing else in that shard is marked expired or deleted
/// behind the test's back. Every request is served as usual.
#[derive(Debug)]
struct PurgeHeldStorage {
    inner: MemoryStorage,
    hold: Arc<PurgeHold>,
}

#[derive(Debug)]
struct PurgeHold {
    /// Set once a purge waits for its delete to be durable.
    parked: watch::Sender<bool>,
    /// Set by the test: the deletes become durable.
    released: watch::Sender<bool>,
}

#[derive(Debug)]
struct PurgeHeldShard {
    inner: Arc<dyn ShardStore>,
    hold: Arc<PurgeHold>,
}

impl Storage for PurgeHeldStorage {
    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        Arc::new(PurgeHeldShard {
            inner: self.inner.shard(index),
            hold: self.hold.clone(),
        })
    }
    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.inner.write_catalog(change)
    }
    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        self.inner.load_catalog()
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn last_applied(&self) -> Lsn {
        self.inner.last_applied()
    }
    fn failure(&self) -> Option<StorageError> {
        None
    }
    fn placement(&self) -> mayfly_server::engine::Placement {
        self.inner.placement()
    }
}

impl ShardStore for PurgeHeldShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        self.inner.write(batch)
    }
    fn durable(&self, _lsn: Lsn) -> Option<DurableFuture> {
        let hold = self.hold.clone();
        // Runs only when awaited, i.e. for a batch that deleted something.
        Some(Box::pin(async move {
            hold.parked.send_replace(true);
            let mut released = hold.released.subscribe();
            released
                .wait_for(|released| *released)
                .await
                .expect("the hold outlives the engine");
            Ok(())
        }))
    }
    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        self.inner.load(each)
    }
    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, mayfly_server::storage::StoredTerms),
    ) -> Result<(), StorageError> {
        self.inner.load_terms(each)
    }
    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<mayfly_server::storage::StoredTerms>, StorageError> {
        self.inner.get_terms(collection, key)
    }
    fn scan_index(
        &self,
        collection: CollectionUid,
        range: mayfly_server::storage::IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<mayfly_server::storage::IndexEntry>, StorageError> {
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

#[tokio::test]
async fn changing_the_default_applies_at_once_over_grpc() {
    // A server like `start`'s, over storage that can hold its purge back.
    let hold = Arc::new(PurgeHold {
        parked: watch::Sender::new(false),
        released: watch::Sender::new(false),
    });
    let storage = Arc::new(PurgeHeldStorage {
        inner: MemoryStorage::new(),
        hold: hold.clone(),
    });
    let engine = Engine::new(EngineConfig::new(2), storage, Arc::new(SystemClock));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(mayfly_server::serve(
        listener,
        None,
        CurrentEngine::new(engine.clone()),
        mayfly_server::StorageConfig::Memory {
            shards: Some(2),
            feed_bytes: None,
        },
        mayfly_server::auth::Authenticator::open(Arc::new(SystemClock)),
        mayfly_server::Network::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let client = Client::connect(addr.to_string())
        .await
        .expect("client connects");
    let c = client
        .create_database("db")
        .await
        .expect("database")
        .create_collection("c", "/pk")
        .default_ttl(DefaultTtl::After(Duration::from_secs(3600)))
        .await
        .expect("collection");

    let doc = c
        .create(&json!({"id": "a", "pk": "p"}))
        .await
        .expect("create");
    // Same partition, so same shard: its purge, once it has deleted "parker", waits for the
    // test, and cannot mark or delete "a" before the reads below.
    c.create(&json!({"id": "parker", "pk": "p"}))
        .ttl(DocumentTtl::After(Duration::from_secs(1)))
        .await
        .expect("create");
    tokio::time::timeout(
        Duration::from_secs(10),
        hold.parked.subscribe().wait_for(|parked| *parked),
    )
    .await
    .expect("the purge deletes the parker within 10 s")
    .expect("hold kept");
    // "parker" has expired, so "a", written before it, is over 1 s old.
    c.set_default_ttl(DefaultTtl::After(Duration::from_secs(1)))
        .await
        .expect("lower the default");
    assert!(
        c.read("a", "p").await.expect("read").is_none(),
        "over 1 s old under a 1 s default"
    );
    c.set_default_ttl(DefaultTtl::Off)
        .await
        .expect("turn TTL off");
    assert!(
        c.read("a", "p").await.expect("read").is_none(),
        "expired is final"
    );
    assert_eq!(
        engine.expiry_stats().documents,
        2,
        "\"a\" (and \"parker\", awaiting a durable delete) still stored: the purge did not decide the reads"
    );
    let other = c
        .create(&json!({"id": "b", "pk": "p", "ttl": 1}))
        .await
        .expect("create");
    assert_eq!(
        other.expires_at(),
        None,
        "TTL off: an own ttl is kept but not honoured"
    );
    assert_eq!(other.body()["ttl"], 1);
    assert_ne!(doc.etag(), other.etag());

    // Released, the purge deletes "a" too: expired under the lowered default, final with TTL off.
    hold.released.send_replace(true);
    let start = Instant::now();
    while engine.expiry_stats().documents > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the purge did not delete \"a\""
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.read("b", "p").await.expect("read").is_some());
    let _ = stop.send(());
    server.await.expect("server task").expect("server stops");
}

#[tokio::test]
async fn read_feed_streams_pages_and_resumes() {
    read_feed_streams_pages_and_resumes_on(&start().await).await;
}

async fn read_feed_streams_pages_and_resumes_on(s: &Setup) {
    let c = s.collection(DefaultTtl::NoDefault).await;
    for i in 0..120 {
        c.create(&json!({"id": format!("d{i:03}"), "pk": format!("p{}", i % 4)}))
            .await
            .expect("create");
    }
    let mut feed = c.read_feed().page_size(50).await.expect("feed");
    let first = feed.next_page().await.expect("page").expect("a page");
    // Nothing has expired, so every page but the last is full.
    assert_eq!(first.documents.len(), 50);
    let token = first.continuation.clone().expect("more pages");
    drop(feed); // a disconnect
    let rest = c
        .read_feed()
        .page_size(50)
        .continuation(&token)
        .await
        .expect("resume")
        .collect_all()
        .await
        .expect("pages");
    let mut ids: Vec<String> = first
        .documents
        .iter()
        .chain(rest.iter())
        .map(|d| d.id().to_owned())
        .collect();
    // Exactly once across the disconnect: no document missing, none repeated.
    assert_eq!(ids.len(), 120);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120);
    let p1 = c
        .read_feed()
        .partition_key("p1")
        .await
        .expect("feed")
        .collect_all()
        .await
        .expect("pages");
    assert_eq!(p1.len(), 30);
    assert!(p1.iter().all(|d| d.body()["pk"] == "p1"));
}

/// Regression: feed pages were bounded by count only, so 1,000 large documents made one page
/// above the 16 MiB message limit, and the same page failed on every retry.
#[tokio::test]
async fn large_documents_page_under_the_message_limit() {
    large_documents_page_under_the_message_limit_on(&start().await).await;
}

async fn large_documents_page_under_the_message_limit_on(s: &Setup) {
    let c = s.collection(DefaultTtl::Off).await;
    let filler = "x".repeat(900 * 1024);
    for i in 0..24 {
        c.create(&json!({"id": format!("big{i:02}"), "pk": "p", "filler": filler}))
            .await
            .expect("create");
    }
    let mut feed = c.read_feed().page_size(1000).await.expect("feed");
    let mut ids = Vec::new();
    let mut pages = 0;
    while let Some(page) = feed.next_page().await.expect("every page fits a message") {
        pages += 1;
        let bytes: usize = page
            .documents
            .iter()
            .map(|d| d.body()["filler"].as_str().map_or(0, str::len))
            .sum();
        assert!(!page.documents.is_empty());
        assert!(
            bytes <= 4 * 1024 * 1024,
            "a page of {bytes} bytes of filler"
        );
        ids.extend(page.documents.iter().map(|d| d.id().to_owned()));
    }
    assert!(
        pages >= 6,
        "24 documents of 900 KiB need several pages, got {pages}"
    );
    let expected: Vec<String> = (0..24).map(|i| format!("big{i:02}")).collect();
    assert_eq!(ids, expected, "every document once, in order");
}

/// Regression: partition key values of any length were accepted, and on disk a key over
/// 64 KiB panicked inside the storage engine and dropped the connection.
#[tokio::test]
async fn partition_keys_longer_than_2_kib_are_rejected_on_disk_too() {
    let dir = std::env::temp_dir().join(format!(
        "mayfly-pk-limit-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    ));
    let server = RunningServer::start(mayfly_server::Config {
        storage: mayfly_server::StorageConfig::Disk(mayfly_server::storage::DiskOptions {
            path: dir.clone(),
            durability: mayfly_server::storage::Durability::Fsync,
            shards: Some(2),
            cache_bytes: 1 << 20,
            read_cache_bytes: 1 << 20,
            open_files: None,
        }),
        ..Default::default()
    })
    .await
    .expect("server starts");
    let client = Client::connect(server.local_addr().to_string())
        .await
        .expect("client connects");
    let db = client.create_database("db").await.expect("db");
    let c = db.create_collection("c", "/pk").await.expect("collection");
    let at_limit = "k".repeat(2048);
    c.create(&json!({"id": "a", "pk": at_limit}))
        .await
        .expect("2048 bytes are accepted");
    for len in [2049, 70_000] {
        let long = "k".repeat(len);
        let message = invalid(c.create(&json!({"id": "b", "pk": long})).await);
        assert_eq!(
            message,
            format!("the partition key value is {len} bytes of UTF-8; the limit is 2048 bytes")
        );
        let message = invalid(c.read("a", long.as_str()).await);
        assert!(message.contains("the limit is 2048 bytes"), "{message}");
    }
    // Multi-byte characters count in bytes: 683 × 3 = 2049.
    assert!(
        invalid(c.create(&json!({"id": "b", "pk": "€".repeat(683)})).await).contains("2049 bytes")
    );
    assert!(
        c.read("a", at_limit.as_str())
            .await
            .expect("the server still serves")
            .is_some()
    );
    server.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}
