//! Patch and transactional batch over gRPC: the wire form of their failures, and a crash test
//! (SIGKILL while batches are in flight) checking that each batch is there whole or not at all.

mod support;

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        BatchCreate, BatchOperation, BatchPatch, BatchRead, CreateDocumentRequest,
        ExecuteBatchRequest, PatchDocumentRequest, PatchOperation, PatchValue, ReadFeedRequest,
        client::DocumentsClient,
        oneofs::{BatchOp, PatchOp},
    },
};
use serde_json::{Map, Value, json};
use support::clients::{channel, clients, database_and_collection, string_pk};
use support::patch_ops::incr;
use tonic::{Code, Status, transport::Channel};
use tonic_types::StatusExt;

const OPS_PER_BATCH: usize = 100;

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => JsonObject::new(map),
        other => panic!("object expected, got {other}"),
    }
}

fn op(op: BatchOp) -> BatchOperation {
    BatchOperation { op: Some(op) }
}

fn create(id: &str, pk: &str) -> BatchOperation {
    op(BatchOp::Create(BatchCreate {
        body: Some(object(json!({"id": id, "pk": pk}))),
        ttl: None,
    }))
}

fn patch_counter(by: i64) -> BatchOperation {
    op(BatchOp::Patch(BatchPatch {
        id: "counter".into(),
        operations: vec![incr("/count", by)],
        ..Default::default()
    }))
}

/// ErrorInfo reason and metadata of a status.
fn reason(status: &Status) -> (String, HashMap<String, String>) {
    let details = status.get_error_details();
    let info = details.error_info().expect("error info");
    (info.reason.clone(), info.metadata.clone())
}

async fn create_counter(docs: &mut DocumentsClient<Channel>, pk: &str) {
    docs.create_document(CreateDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        body: Some(object(json!({"id": "counter", "pk": pk, "count": 0}))),
        ..Default::default()
    })
    .await
    .expect("counter");
}

fn batch(pk: &str, operations: Vec<BatchOperation>) -> ExecuteBatchRequest {
    ExecuteBatchRequest {
        database: "d".into(),
        collection: "c".into(),
        partition_key: Some(string_pk(pk)),
        operations,
        ..Default::default()
    }
}

/// Every live document of a partition, by id.
async fn partition(
    docs: &mut DocumentsClient<Channel>,
    pk: &str,
) -> HashMap<String, Map<String, Value>> {
    let mut found = HashMap::new();
    let mut continuation = String::new();
    loop {
        let mut pages = docs
            .read_feed(ReadFeedRequest {
                database: "d".into(),
                collection: "c".into(),
                partition_key: Some(string_pk(pk)),
                page_size: 1000,
                continuation: continuation.clone(),
            })
            .await
            .expect("feed")
            .into_inner();
        continuation.clear();
        while let Some(page) = pages.message().await.expect("page") {
            for doc in page.documents {
                found.insert(doc.id.clone(), doc.body.expect("body").into_map());
            }
            continuation = page.continuation;
        }
        if continuation.is_empty() {
            return found;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_and_batch_failures_name_their_operation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(dir.path(), &[]);
    let channel = channel(&server.url()).await;
    database_and_collection(&mut clients(channel.clone())).await;
    let mut docs = DocumentsClient::new(channel);
    create_counter(&mut docs, "p").await;
    let patch = |operations: Vec<PatchOperation>, condition: &str| PatchDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: "counter".into(),
        partition_key: Some(string_pk("p")),
        operations,
        condition: condition.into(),
        ..Default::default()
    };

    let patched = docs
        .patch_document(patch(
            vec![
                incr("/count", 5),
                PatchOperation {
                    op: Some(PatchOp::Set(PatchValue {
                        path: "/status".into(),
                        value: Some(mayfly_proto::json::JsonValue::new(json!("open"))),
                    })),
                },
            ],
            "FROM c WHERE c.count = 0",
        ))
        .await
        .expect("patched")
        .into_inner();
    let body = patched.body.expect("body").into_map();
    assert_eq!(
        (body["count"].clone(), body["status"].clone()),
        (json!(5), json!("open"))
    );

    let not_met = docs
        .patch_document(patch(vec![incr("/count", 1)], "FROM c WHERE c.count = 0"))
        .await
        .expect_err("condition false");
    assert_eq!(not_met.code(), Code::FailedPrecondition);
    assert_eq!(reason(&not_met).0, "CONDITION_NOT_MET");

    let bad = docs
        .patch_document(patch(vec![incr("/count", 1), incr("/status", 1)], ""))
        .await
        .expect_err("not a number");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(reason(&bad).0, "INVALID_PATCH");
    assert!(
        bad.message().contains("patch operation 1 (incr /status)"),
        "{}",
        bad.message()
    );

    let bad_condition = docs
        .patch_document(patch(vec![incr("/count", 1)], "SELECT * FROM c"))
        .await
        .expect_err("not a filter");
    assert_eq!(reason(&bad_condition).0, "INVALID_PATCH_CONDITION");

    // The 57th of 100 operations fails: its status, its index, nothing applied.
    let mut ops: Vec<BatchOperation> = (0..56).map(|i| create(&format!("n{i}"), "p")).collect();
    ops.push(op(BatchOp::Read(BatchRead {
        id: "missing".into(),
    })));
    ops.extend((57..OPS_PER_BATCH).map(|_| patch_counter(1)));
    let failed = docs
        .execute_batch(batch("p", ops))
        .await
        .expect_err("57th fails");
    assert_eq!(failed.code(), Code::NotFound);
    let (why, metadata) = reason(&failed);
    assert_eq!(why, "DOCUMENT_NOT_FOUND");
    assert_eq!(
        metadata.get("operation_index").map(String::as_str),
        Some("56")
    );
    assert!(
        failed
            .message()
            .starts_with("batch operation 56 (read) failed"),
        "{}",
        failed.message()
    );
    let stored = partition(&mut docs, "p").await;
    assert_eq!(stored.len(), 1, "only the counter: {:?}", stored.keys());
    assert_eq!(stored["counter"]["count"], json!(5));

    // A body of another partition fails at the edge the same way.
    let other = docs
        .execute_batch(batch("p", vec![create("a", "p"), create("b", "q")]))
        .await
        .expect_err("wrong partition");
    assert_eq!(other.code(), Code::InvalidArgument);
    assert_eq!(
        reason(&other),
        (
            "PARTITION_KEY_MISMATCH".to_owned(),
            HashMap::from([("operation_index".to_owned(), "1".to_owned())])
        )
    );
    let too_many = docs
        .execute_batch(batch(
            "p",
            (0..101).map(|i| create(&format!("x{i}"), "p")).collect(),
        ))
        .await
        .expect_err("101 operations");
    assert_eq!(reason(&too_many).0, "INVALID_BATCH");

    let done = docs
        .execute_batch(batch("p", vec![create("a", "p"), patch_counter(2)]))
        .await
        .expect("committed")
        .into_inner();
    assert_eq!(done.results.len(), 2);
    let counter = done.results[1].document.clone().expect("document");
    assert_eq!(counter.body.expect("body").into_map()["count"], json!(7));
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Sends batches to partition `pk` until the server dies: each increments the counter and
/// creates 99 documents `n{batch}-{i}`. Returns how many were acknowledged. A batch refused
/// with nothing applied (contended, no memory free) is sent again; any other failure but the
/// server going away fails the test rather than ending the load early.
async fn batch_writer(channel: Channel, pk: String) -> u64 {
    let mut docs = DocumentsClient::new(channel);
    let mut acked = 0;
    loop {
        let mut ops = vec![patch_counter(1)];
        ops.extend((1..OPS_PER_BATCH).map(|i| create(&format!("n{acked}-{i}"), &pk)));
        match docs.execute_batch(batch(&pk, ops)).await {
            Ok(_) => acked += 1,
            Err(s) if matches!(s.code(), Code::Aborted | Code::ResourceExhausted) => {}
            // Killed under the request (its outcome unknown), or gone.
            Err(s)
                if matches!(
                    s.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                ) =>
            {
                return acked;
            }
            Err(s) => panic!("{pk}: batch {acked} failed: {s:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_flight_at_sigkill_is_all_there_or_not_at_all() {
    const WRITERS: usize = 6;
    const ROUNDS: usize = 3;
    let seed = now_ms();
    eprintln!("batch crash test seed {seed}");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    // (partition, acknowledged batches)
    let mut ledger: Vec<(String, u64)> = Vec::new();
    let (mut whole, mut in_flight_applied) = (0, 0);
    for round in 0..=ROUNDS {
        let server = support::Mayfly::start(&data, &[]);
        let channel = channel(&server.url()).await;
        if round == 0 {
            database_and_collection(&mut clients(channel.clone())).await;
        }
        let mut docs = DocumentsClient::new(channel.clone());
        for (pk, acked) in &ledger {
            let stored = partition(&mut docs, pk).await;
            let count = stored["counter"]["count"].as_u64().expect("count");
            assert!(
                count == *acked || count == acked + 1,
                "{pk}: counter {count}, {acked} batches acknowledged (seed {seed})"
            );
            if round == ROUNDS {
                in_flight_applied += count - acked;
                whole += count;
            }
            for b in 0..=*acked {
                let present = (1..OPS_PER_BATCH)
                    .filter(|i| stored.contains_key(&format!("n{b}-{i}")))
                    .count();
                let expected = if b < count { OPS_PER_BATCH - 1 } else { 0 };
                assert_eq!(
                    present, expected,
                    "{pk}: batch {b} partly applied (seed {seed})"
                );
            }
            assert_eq!(
                stored.len() as u64,
                1 + count * (OPS_PER_BATCH as u64 - 1),
                "{pk}"
            );
        }
        if round == ROUNDS {
            break;
        }
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let pk = format!("r{round}-w{w}");
            create_counter(&mut docs, &pk).await;
            writers.push((pk.clone(), tokio::spawn(batch_writer(channel.clone(), pk))));
        }
        tokio::time::sleep(Duration::from_millis(
            300 + (seed + round as u64 * 7919) % 900,
        ))
        .await;
        server.kill9();
        for (pk, writer) in writers {
            let acked = tokio::time::timeout(Duration::from_secs(30), writer)
                .await
                .expect("writers notice the kill")
                .expect("writer task");
            ledger.push((pk, acked));
        }
    }
    let acked: u64 = ledger.iter().map(|(_, a)| a).sum();
    eprintln!(
        "batch crash test: {ROUNDS} SIGKILL rounds, {acked} batches of {OPS_PER_BATCH} acknowledged, \
         after the last restart {whole} found whole ({in_flight_applied} of them in flight at a kill), none partial"
    );
    assert!(acked > 0, "the load must have committed batches");
}
