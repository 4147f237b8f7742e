//! The edge's stream driver, through the services' own handlers, over an engine on a manual
//! clock: every page is authorized again, read at its own time, and reserves its memory
//! before it is built.

use std::sync::Arc;

use mayfly_proto::v1::{QueryPage, QueryRequest, ReadFeedPage, ReadFeedRequest, server::Documents};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::{Code, Request, Status};

use super::DocumentsService;
use crate::{
    CurrentEngine,
    auth::{Authenticator, KeyRing, KeySlot, ResourceToken},
    engine::{
        CollectionPath, CollectionSettings, DefaultTtl, DocumentBody, Engine, EngineConfig, IdKind,
        IndexingMode, ManualClock, Millis, PartitionKeyPath, ResourceId,
    },
    net::ResponseBudget,
    storage::MemoryStorage,
};

const T0: Millis = 1_700_000_000_000;
const PRIMARY: &str = "primary-key-for-the-edge-tests";

struct Edge {
    engine: Engine,
    clock: Arc<ManualClock>,
    documents: DocumentsService,
}

fn id(kind: IdKind, s: &str) -> ResourceId {
    ResourceId::parse(kind, s).expect("valid id")
}

/// An engine with database `db`, collection `c` (partition key `/pk`, TTL on without a
/// default), served with keys, its streams reserving in `budget`.
fn edge(budget: ResponseBudget) -> Edge {
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::new(
        EngineConfig::new(1),
        Arc::new(MemoryStorage::new()),
        clock.clone(),
    );
    engine
        .create_database(id(IdKind::Database, "db"))
        .expect("database");
    let settings = CollectionSettings::new(
        DefaultTtl::from_raw(Some(-1)).expect("valid"),
        IndexingMode::Consistent,
    )
    .expect("valid");
    engine
        .create_collection(
            &id(IdKind::Database, "db"),
            id(IdKind::Collection, "c"),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
        )
        .expect("collection");
    let keys = KeyRing::given([Some(PRIMARY.to_owned()), None, None, None]);
    let documents = DocumentsService::new(
        CurrentEngine::new(engine.clone()),
        Authenticator::with_keys(keys, clock.clone()),
    )
    .with_budget(budget);
    Edge {
        engine,
        clock,
        documents,
    }
}

fn path() -> CollectionPath {
    CollectionPath {
        database: id(IdKind::Database, "db"),
        collection: id(IdKind::Collection, "c"),
    }
}

impl Edge {
    fn write(&self, doc: Value) {
        let Value::Object(map) = doc else {
            panic!("an object")
        };
        let body = DocumentBody::parse(Arc::new(map), None).expect("valid body");
        self.engine
            .upsert_document(&path(), body, None, None)
            .result
            .expect("upsert");
    }

    async fn feed(
        &self,
        credential: &str,
        page_size: u32,
    ) -> Result<super::stream::PageStream<ReadFeedPage>, Status> {
        let mut request = Request::new(ReadFeedRequest {
            database: "db".into(),
            collection: "c".into(),
            page_size,
            ..Default::default()
        });
        authorize(&mut request, credential);
        Ok(self.documents.read_feed(request).await?.into_inner())
    }

    async fn query(
        &self,
        credential: &str,
        text: &str,
        page_size: u32,
    ) -> Result<super::stream::PageStream<QueryPage>, Status> {
        let mut request = Request::new(QueryRequest {
            database: "db".into(),
            collection: "c".into(),
            query: text.into(),
            page_size,
            ..Default::default()
        });
        authorize(&mut request, credential);
        Ok(self.documents.query(request).await?.into_inner())
    }
}

fn authorize<T>(request: &mut Request<T>, credential: &str) {
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {credential}").parse().expect("ascii"),
    );
}

/// A token reading collection `db/c` of `engine` until `expires_at`.
fn read_token(engine: &Engine, expires_at: Millis) -> String {
    let path = path();
    ResourceToken {
        minted_by: KeySlot::Primary,
        database: "db".into(),
        database_uid: engine.get_database(&path.database).expect("database"),
        collection: Some("c".into()),
        collection_uid: Some(engine.get_collection(&path).expect("collection").uid),
        partition_key: None,
        write: false,
        expires_at,
    }
    .mint(PRIMARY)
}

fn big_budget() -> ResponseBudget {
    ResponseBudget::new(256 << 20, 256 << 20)
}

#[tokio::test]
async fn a_stream_ends_at_its_next_page_once_its_token_expires() {
    let e = edge(big_budget());
    for i in 0..5 {
        e.write(json!({"id": format!("d{i}"), "pk": "p"}));
    }
    let token = read_token(&e.engine, T0 + 2_000);
    let mut feed = e.feed(&token, 1).await.expect("a valid token");
    let mut query = e
        .query(&token, "SELECT * FROM c", 1)
        .await
        .expect("a valid token");
    assert!(feed.next().await.expect("a page").is_ok());
    assert!(query.next().await.expect("a page").is_ok());
    e.clock.advance(3_000);
    for status in [
        feed.next().await.expect("an answer").expect_err("expired"),
        query.next().await.expect("an answer").expect_err("expired"),
    ] {
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }
    assert!(feed.next().await.is_none(), "the stream has ended");
}

/// A token is bound to the collection it was minted for: once that is deleted, a stream it
/// opened ends at its next page, even though a collection of the same name is there again.
#[tokio::test]
async fn a_stream_ends_at_its_next_page_once_its_collection_is_replaced() {
    let e = edge(big_budget());
    for i in 0..5 {
        e.write(json!({"id": format!("d{i}"), "pk": "p"}));
    }
    let token = read_token(&e.engine, T0 + 3_600_000);
    let mut feed = e.feed(&token, 1).await.expect("a valid token");
    let mut query = e
        .query(&token, "SELECT * FROM c", 1)
        .await
        .expect("a valid token");
    assert!(feed.next().await.expect("a page").is_ok());
    assert!(query.next().await.expect("a page").is_ok());
    let old = e.engine.get_collection(&path()).expect("collection");
    e.engine.delete_collection(&path()).expect("deleted");
    e.engine
        .create_collection(
            &old.database,
            old.id.clone(),
            old.partition_key_path.clone(),
            old.settings,
            old.index_paths.clone(),
        )
        .expect("created again");
    for i in 0..5 {
        e.write(json!({"id": format!("d{i}"), "pk": "p"}));
    }
    for status in [
        feed.next().await.expect("an answer").expect_err("replaced"),
        query
            .next()
            .await
            .expect("an answer")
            .expect_err("replaced"),
    ] {
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains("collection 'db/c'")
                && status.message().contains("deleted since"),
            "{}",
            status.message()
        );
    }
    assert!(feed.next().await.is_none(), "the stream has ended");
    let refused = e.feed(&token, 1).await.err().expect("refused");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
}

#[tokio::test]
async fn each_streaming_query_page_is_read_at_its_own_time() {
    let e = edge(big_budget());
    // d0..d2 never expire; d3..d5 expire 5 s after they are written. The purge never runs
    // here: only each page's own clock reading keeps expired documents out.
    for text in [
        "SELECT VALUE c.id FROM c",
        "SELECT VALUE c.id FROM c WHERE c.n >= 0",
    ] {
        for i in 0..6 {
            let mut doc = json!({"id": format!("d{i}"), "pk": "p", "n": i});
            if i >= 3 {
                doc["ttl"] = json!(5);
            }
            e.write(doc);
        }
        let mut pages = e.query(PRIMARY, text, 2).await.expect("runs");
        let first = pages.next().await.expect("a page").expect("ok");
        assert_eq!(first.results, [json!("d0"), json!("d1")], "{text}");
        e.clock.advance(10_000);
        let mut rest = Vec::new();
        while let Some(page) = pages.next().await {
            rest.extend(page.expect("ok").results);
        }
        assert_eq!(
            rest,
            [json!("d2")],
            "{text}: nothing expired at a page's reading"
        );
    }
    let mut feed = e.feed(PRIMARY, 2).await.expect("runs");
    let mut all = Vec::new();
    while let Some(page) = feed.next().await {
        all.extend(page.expect("ok").documents);
    }
    assert_eq!(all.len(), 3);
}

#[tokio::test]
async fn a_page_is_refused_before_it_is_built_when_the_budget_is_full() {
    // 1 MiB in all; documents of about 100 KB: a page of 30 would take 3 MB, twice that as
    // values. The budget stops the page where its reservation ends.
    let e = edge(ResponseBudget::new(1 << 20, 1 << 20));
    let pad = "x".repeat(100_000);
    for i in 0..30 {
        e.write(json!({"id": format!("d{i:02}"), "pk": "p", "pad": pad}));
    }
    let mut first = e.feed(PRIMARY, 100).await.expect("fits");
    // Not taken yet: the page holds its reservation, at most the budget.
    let mut second = e.query(PRIMARY, "SELECT * FROM c", 100).await;
    let refused = second
        .as_mut()
        .err()
        .expect("the budget is held by the first page");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let page = first.next().await.expect("a page").expect("ok");
    assert!(
        !page.documents.is_empty() && page.documents.len() < 10,
        "ended at the reservation: {} documents",
        page.documents.len()
    );
    assert!(!page.continuation.is_empty());
    // Taken: the next page reserves again, and the feed goes on to the end.
    let mut seen = page.documents.len();
    while let Some(page) = first.next().await {
        seen += page.expect("ok").documents.len();
    }
    assert_eq!(seen, 30);
}

#[test]
fn a_stale_continuation_is_a_failed_precondition() {
    let status =
        super::status::to_status(crate::engine::Error::ContinuationStale { reason: "test" });
    assert_eq!(status.code(), Code::FailedPrecondition);
}
