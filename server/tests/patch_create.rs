//! A patch that creates, over gRPC: `PatchDocumentRequest.create_if_missing` (the
//! "mayfly-created" response header says what happened), `create_parents`, the same in a batch,
//! and many concurrent creating patches of one absent id, none lost and none refused.

mod support;

use std::time::Duration;

use mayfly_proto::{
    json::JsonObject,
    v1::{
        BatchOperation, BatchPatch, CreateCollectionRequest, CreateDocumentRequest,
        ExecuteBatchRequest, PatchDocumentRequest, PatchOperation, ReadDocumentRequest,
        client::DocumentsClient, oneofs::BatchOp,
    },
};
use serde_json::{Map, Value, json};
use support::clients::{connect, database_and_collection, string_pk};
use support::patch_ops::{incr, set};
use tonic::{Code, Response, Status, transport::Channel};
use tonic_types::StatusExt;

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => JsonObject::new(map),
        other => panic!("object expected, got {other}"),
    }
}

/// A patch of `id` in partition `pk` of `d/<collection>`, creating from `initial` if given.
fn upsert_patch(
    collection: &str,
    id: &str,
    pk: &str,
    operations: Vec<PatchOperation>,
    initial: Option<Value>,
) -> PatchDocumentRequest {
    PatchDocumentRequest {
        database: "d".into(),
        collection: collection.into(),
        id: id.into(),
        partition_key: Some(string_pk(pk)),
        operations,
        create_if_missing: initial.map(object),
        ..Default::default()
    }
}

/// The body of a patched document and the "mayfly-created" header of the answer.
fn answer(response: Response<mayfly_proto::v1::Document>) -> (Map<String, Value>, bool) {
    let created = match response
        .metadata()
        .get("mayfly-created")
        .map(|v| v.to_str())
    {
        Some(Ok("true")) => true,
        Some(Ok("false")) => false,
        other => panic!("mayfly-created header: {other:?}"),
    };
    let body = response.into_inner().body.expect("body").into_map();
    (body, created)
}

fn reason(status: &Status) -> String {
    let details = status.get_error_details();
    details.error_info().expect("error info").reason.clone()
}

async fn read(docs: &mut DocumentsClient<Channel>, id: &str) -> Result<Map<String, Value>, Status> {
    docs.read_document(ReadDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: id.into(),
        partition_key: Some(string_pk("p")),
    })
    .await
    .map(|r| r.into_inner().body.expect("body").into_map())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_creates_a_missing_document_in_one_call() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    let mut docs = c.documents.clone();
    let cart = json!({"id": "cart", "pk": "p", "status": "open"});

    // Absent: created from the initial body, the operations applied, `created` true.
    let (body, created) = answer(
        docs.patch_document(PatchDocumentRequest {
            create_parents: true,
            ..upsert_patch(
                "c",
                "cart",
                "p",
                vec![incr("/items/sku1/qty", 2)],
                Some(cart.clone()),
            )
        })
        .await
        .expect("created"),
    );
    assert!(created, "no cart was there");
    assert_eq!(
        Value::Object(body),
        json!({"id": "cart", "pk": "p", "status": "open", "items": {"sku1": {"qty": 2}}})
    );
    assert_eq!(
        read(&mut docs, "cart").await.expect("stored")["items"],
        json!({"sku1": {"qty": 2}})
    );

    // Present: patched, the initial body ignored, `created` false.
    let (body, created) = answer(
        docs.patch_document(upsert_patch(
            "c",
            "cart",
            "p",
            vec![incr("/items/sku1/qty", 1), set("/status", json!("paid"))],
            Some(json!({"id": "cart", "pk": "p", "status": "ignored"})),
        ))
        .await
        .expect("patched"),
    );
    assert!(!created);
    assert_eq!(
        (body["items"].clone(), body["status"].clone()),
        (json!({"sku1": {"qty": 3}}), json!("paid"))
    );

    // A plain patch answers the header too, and a missing document is still NOT_FOUND.
    let (_, created) = answer(
        docs.patch_document(upsert_patch("c", "cart", "p", vec![incr("/n", 1)], None))
            .await
            .expect("patched"),
    );
    assert!(!created);
    let missing = docs
        .patch_document(upsert_patch("c", "none", "p", vec![incr("/n", 1)], None))
        .await
        .expect_err("absent");
    assert_eq!(missing.code(), Code::NotFound);

    // create_parents: `incr /items/sku1/qty` on {}; without it, the missing parent is refused.
    let bare = json!({"id": "bare", "pk": "p"});
    let refused = docs
        .patch_document(upsert_patch(
            "c",
            "bare",
            "p",
            vec![incr("/items/sku1/qty", 1)],
            Some(bare.clone()),
        ))
        .await
        .expect_err("no /items");
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::InvalidArgument, "INVALID_PATCH")
    );
    let (body, created) = answer(
        docs.patch_document(PatchDocumentRequest {
            create_parents: true,
            ..upsert_patch(
                "c",
                "bare",
                "p",
                vec![incr("/items/sku1/qty", 1)],
                Some(bare),
            )
        })
        .await
        .expect("created"),
    );
    assert!(created);
    assert_eq!(
        Value::Object(body),
        json!({"id": "bare", "pk": "p", "items": {"sku1": {"qty": 1}}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_initial_body_or_an_etag_with_it_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    let mut docs = c.documents.clone();
    let ops = || vec![incr("/count", 1)];
    for (initial, expected, named) in [
        (
            json!({"id": "other", "pk": "p"}),
            "ID_MISMATCH",
            "create_if_missing: the request's id 'a'",
        ),
        (
            json!({"id": "a", "pk": "q"}),
            "PARTITION_KEY_MISMATCH",
            "create_if_missing: the request's partition key",
        ),
        (
            json!({"id": "a", "pk": "p", "ttl": 0}),
            "INVALID_TTL",
            "create_if_missing: The input ttl '0'",
        ),
        (
            json!({"pk": "p"}),
            "MISSING_ID",
            "create_if_missing: the document body needs",
        ),
    ] {
        let refused = docs
            .patch_document(upsert_patch("c", "a", "p", ops(), Some(initial.clone())))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{initial}");
        assert_eq!(reason(&refused), expected, "{initial}");
        assert!(
            refused.message().starts_with(named),
            "{}",
            refused.message()
        );
    }
    // An etag names a version that exists: it cannot come with an initial body.
    let refused = docs
        .patch_document(PatchDocumentRequest {
            if_match: "0000000000000001".into(),
            ..upsert_patch("c", "a", "p", ops(), Some(json!({"id": "a", "pk": "p"})))
        })
        .await
        .expect_err("if_match with create_if_missing");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(reason(&refused), "INVALID_PATCH");
    assert!(
        refused.message().contains("if_match cannot be combined"),
        "{}",
        refused.message()
    );
    // Nothing was written.
    let absent = read(&mut docs, "a").await.expect_err("never created");
    assert_eq!(absent.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_document_is_created_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    c.collections
        .create_collection(CreateCollectionRequest {
            database: "d".into(),
            id: "t".into(),
            partition_key_path: "/pk".into(),
            default_ttl: Some(-1),
            ..Default::default()
        })
        .await
        .expect("collection with TTL on");
    let mut docs = c.documents.clone();
    docs.create_document(CreateDocumentRequest {
        database: "d".into(),
        collection: "t".into(),
        body: Some(object(json!({"id": "s", "pk": "p", "count": 41}))),
        ttl: Some(1),
        ..Default::default()
    })
    .await
    .expect("created");
    // Live: patched.
    let (body, created) = answer(
        docs.patch_document(upsert_patch(
            "t",
            "s",
            "p",
            vec![incr("/count", 1)],
            Some(json!({"id": "s", "pk": "p", "count": 0, "ttl": 60})),
        ))
        .await
        .expect("patched"),
    );
    assert_eq!((body["count"].clone(), created), (json!(42), false));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Expired (its own ttl of 1 s, restarted by the patch): created from the initial body.
    let response = docs
        .patch_document(upsert_patch(
            "t",
            "s",
            "p",
            vec![incr("/count", 1)],
            Some(json!({"id": "s", "pk": "p", "count": 0, "ttl": 60})),
        ))
        .await
        .expect("created again");
    let expires_in = response
        .get_ref()
        .expires_in
        .expect("the initial body's ttl");
    let (body, created) = answer(response);
    assert!(created, "an expired document is not there");
    assert_eq!(
        (body["count"].clone(), body["ttl"].clone()),
        (json!(1), json!(60))
    );
    assert!(expires_in.seconds > 50, "{expires_in:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_batch_may_create_with_its_patch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    let mut docs = c.documents.clone();
    let batch = || ExecuteBatchRequest {
        database: "d".into(),
        collection: "c".into(),
        partition_key: Some(string_pk("p")),
        operations: vec![BatchOperation {
            op: Some(BatchOp::Patch(BatchPatch {
                id: "orders".into(),
                operations: vec![incr("/by_sku/sku1", 1)],
                create_if_missing: Some(object(json!({"id": "orders", "pk": "p"}))),
                create_parents: true,
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    for (expected_count, expected_created) in [(1, true), (2, false)] {
        let results = docs
            .execute_batch(batch())
            .await
            .expect("committed")
            .into_inner()
            .results;
        assert_eq!(results[0].created, expected_created);
        let body = results[0]
            .document
            .clone()
            .expect("document")
            .body
            .expect("body");
        assert_eq!(body.into_map()["by_sku"], json!({"sku1": expected_count}));
    }
}

/// Many concurrent creating `incr`s of one absent id: all count, none fails, one creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creating_patches_of_one_absent_id_lose_nothing() {
    const CALLS: usize = 64;
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    // A few connections, each carrying many calls at once.
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(connect(&server).await.documents);
    }
    let tasks: Vec<_> = (0..CALLS)
        .map(|i| {
            let mut docs = channels[i % channels.len()].clone();
            tokio::spawn(async move {
                let response = docs
                    .patch_document(upsert_patch(
                        "c",
                        "counter",
                        "p",
                        vec![incr("/count", 1)],
                        Some(json!({"id": "counter", "pk": "p"})),
                    ))
                    .await
                    .expect("no error, no conflict");
                answer(response).1
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        if task.await.expect("task") {
            created += 1;
        }
    }
    assert_eq!(
        created, 1,
        "one call created the counter, the others patched it"
    );
    let mut docs = c.documents.clone();
    assert_eq!(
        read(&mut docs, "counter").await.expect("counter")["count"],
        json!(CALLS)
    );
}
