//! Idempotency keys over gRPC, on the real binary: a copy of an applied write gets the first
//! answer (`mayfly-replayed: true`) and applies nothing, concurrent copies apply once, another
//! request under a key is refused, a bad key is named, and a key survives `kill -9` with the
//! write it applied.

mod support;

use mayfly_proto::v1::{
    CreateDocumentRequest, Document, PatchDocumentRequest, ReadDocumentRequest,
    client::DocumentsClient,
};
use serde_json::{Value, json};
use support::clients::{connect, database_and_collection, string_pk};
use support::patch_ops::{incr, set};
use tonic::{Code, Response, Status, transport::Channel};
use tonic_types::StatusExt;

fn incr_with_key(key: &str) -> PatchDocumentRequest {
    PatchDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: "a".into(),
        partition_key: Some(string_pk("p")),
        operations: vec![incr("/n", 1)],
        idempotency_key: key.into(),
        ..Default::default()
    }
}

fn replayed(response: &Response<Document>) -> bool {
    match response
        .metadata()
        .get("mayfly-replayed")
        .map(|v| v.to_str())
    {
        Some(Ok("true")) => true,
        Some(Ok("false")) => false,
        other => panic!("mayfly-replayed header: {other:?}"),
    }
}

fn reason(status: &Status) -> String {
    let details = status.get_error_details();
    details.error_info().expect("error info").reason.clone()
}

async fn counter(docs: &mut DocumentsClient<Channel>) -> i64 {
    let doc = docs
        .read_document(ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: "a".into(),
            partition_key: Some(string_pk("p")),
        })
        .await
        .expect("read")
        .into_inner();
    doc.body.expect("body").into_map()["n"]
        .as_i64()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_applies_once_across_copies_and_a_kill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    let mut docs = c.documents.clone();
    let body = json!({"id": "a", "pk": "p", "n": 0});
    docs.create_document(CreateDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        body: Some(match body {
            Value::Object(map) => mayfly_proto::json::JsonObject::new(map),
            _ => unreachable!(),
        }),
        ..Default::default()
    })
    .await
    .expect("created");

    // A copy gets the first answer, etag and all, and applies nothing.
    let first = docs
        .patch_document(incr_with_key("k1"))
        .await
        .expect("applied");
    assert!(!replayed(&first));
    let again = docs
        .patch_document(incr_with_key("k1"))
        .await
        .expect("replayed");
    assert!(replayed(&again));
    assert_eq!(again.into_inner().etag, first.into_inner().etag);
    assert_eq!(counter(&mut docs).await, 1);

    // Sixteen copies at once: one applies.
    let copies: Vec<_> = (0..16)
        .map(|_| {
            let mut docs = docs.clone();
            tokio::spawn(async move { docs.patch_document(incr_with_key("k2")).await })
        })
        .collect();
    let mut applied = 0;
    for copy in copies {
        let response = copy.await.expect("joined").expect("answered");
        applied += usize::from(!replayed(&response));
    }
    assert_eq!(applied, 1);
    assert_eq!(counter(&mut docs).await, 2);

    // The same key with another request: refused, nothing applied.
    let reused = docs
        .patch_document(PatchDocumentRequest {
            operations: vec![set("/n", json!(100))],
            ..incr_with_key("k1")
        })
        .await
        .expect_err("another request");
    assert_eq!(
        (reused.code(), reason(&reused).as_str()),
        (Code::InvalidArgument, "IDEMPOTENCY_KEY_REUSED")
    );
    assert!(reused.message().contains("'k1'"), "{}", reused.message());
    let bad = docs
        .patch_document(incr_with_key("a/b"))
        .await
        .expect_err("a key with a slash");
    assert_eq!(
        (bad.code(), reason(&bad).as_str()),
        (Code::InvalidArgument, "INVALID_ID")
    );
    assert!(
        bad.message().contains("idempotency key"),
        "{}",
        bad.message()
    );
    assert_eq!(counter(&mut docs).await, 2);

    // Killed: the keys come back with the writes they applied; the answers do not.
    server.kill9();
    let server = support::Mayfly::start(dir.path(), &[]);
    let mut docs = connect(&server).await.documents;
    let after = docs
        .patch_document(incr_with_key("k1"))
        .await
        .expect_err("applied before the kill");
    assert_eq!(
        (after.code(), reason(&after).as_str()),
        (Code::AlreadyExists, "REQUEST_ALREADY_APPLIED")
    );
    assert_eq!(counter(&mut docs).await, 2, "nothing applied twice");
    let fresh = docs
        .patch_document(incr_with_key("k3"))
        .await
        .expect("new key");
    assert!(!replayed(&fresh));
    assert_eq!(counter(&mut docs).await, 3);
}
