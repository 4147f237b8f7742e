//! Rules on request input that hold alike for every field, against the real binary: numbers
//! an `incr` cannot keep exact, JSON nested too deep in any field, query parameters, ids,
//! messages over the size limit and messages that do not decode, whatever the service.

mod support;

use std::collections::HashMap;

use mayfly_proto::{
    json::{JsonObject, JsonValue},
    v1::{
        BatchCreate, BatchOperation, BatchPatch, CreateCollectionRequest, CreateDatabaseRequest,
        CreateDocumentRequest, ExecuteBatchRequest, PartitionKey, PatchDocumentRequest,
        PatchOperation, QueryRequest, ReadDocumentRequest,
        oneofs::{BatchOp, PartitionKeyKind},
    },
};
use serde_json::{Map, Value, json};
use support::patch_ops::{incr, set};
use support::{
    Mayfly,
    clients::{self, Clients, database_and_collection, string_pk},
    raw::{RawCodec, length_delimited, raw_call},
};
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_types::StatusExt;

/// The deepest nesting any JSON field takes (a document is level 1, as is a value's
/// outermost list or object).
const MAX_DEPTH: usize = mayfly_proto::json::MAX_DEPTH;

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("object expected, got {other}"),
    }
}

/// `levels` levels of objects (`{"a": {"a": ... 1}}`) or of lists (`[[... 1]]`).
fn nested(levels: usize, lists: bool) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = if lists { json!([v]) } else { json!({ "a": v }) };
    }
    v
}

/// Code, ErrorInfo reason (empty if none) and message.
fn refusal(status: &Status) -> (Code, String, String) {
    let details = status.get_error_details();
    let reason = details
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default();
    (status.code(), reason, status.message().to_owned())
}

fn assert_refused(result: Result<impl std::fmt::Debug, Status>, reason: &str, says: &[&str]) {
    let status = result.expect_err("refused");
    let (code, got, message) = refusal(&status);
    assert_eq!(
        (code, got.as_str()),
        (Code::InvalidArgument, reason),
        "{message}"
    );
    for part in says {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
}

async fn start() -> (tempfile::TempDir, Mayfly, Clients) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Mayfly::start(dir.path(), &["--storage", "memory"]);
    let mut c = clients::connect(&server).await;
    database_and_collection(&mut c).await;
    (dir, server, c)
}

async fn create(c: &mut Clients, body: Value) -> Result<(), Status> {
    c.documents
        .create_document(CreateDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            body: Some(JsonObject::new(object(body))),
            ..Default::default()
        })
        .await
        .map(drop)
}

fn patch(id: &str, operations: Vec<PatchOperation>) -> PatchDocumentRequest {
    PatchDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: id.into(),
        partition_key: Some(string_pk("p")),
        operations,
        ..Default::default()
    }
}

/// The document's body and etag.
async fn read(c: &mut Clients, id: &str) -> (Map<String, Value>, String) {
    let doc = c
        .documents
        .read_document(ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: id.into(),
            partition_key: Some(string_pk("p")),
        })
        .await
        .expect("read")
        .into_inner();
    (doc.body.expect("a body").into_map(), doc.etag)
}

fn batch(operations: Vec<BatchOperation>) -> ExecuteBatchRequest {
    ExecuteBatchRequest {
        database: "d".into(),
        collection: "c".into(),
        partition_key: Some(string_pk("p")),
        operations,
        ..Default::default()
    }
}

/// Regression (issue 23): three `incr 1` on 9007199254740992 answered OK with new etags while
/// the value, stored as a double, did not change. The `integer` path is exact up to ±2^53
/// and refuses what it cannot keep exact, changing nothing.
#[tokio::test]
async fn an_integer_incr_is_exact_end_to_end_or_refused() {
    let (_dir, _server, mut c) = start().await;
    const TWO_53: i64 = 1 << 53;
    create(&mut c, json!({"id": "n", "pk": "p", "count": TWO_53 - 2}))
        .await
        .expect("create");
    for expected in [TWO_53 - 1, TWO_53] {
        let doc = c
            .documents
            .patch_document(patch("n", vec![incr("/count", 1)]))
            .await
            .expect("exact")
            .into_inner();
        assert_eq!(doc.body.expect("body").into_map()["count"], json!(expected));
        assert_eq!(read(&mut c, "n").await.0["count"], json!(expected));
    }
    let (_, etag) = read(&mut c, "n").await;
    for _ in 0..3 {
        assert_refused(
            c.documents
                .patch_document(patch("n", vec![incr("/count", 1)]))
                .await,
            "INVALID_PATCH",
            &["patch operation 0 (incr /count)", "2^53"],
        );
    }
    let (body, unchanged) = read(&mut c, "n").await;
    assert_eq!(
        (body["count"].clone(), unchanged),
        (json!(TWO_53), etag),
        "nothing was written"
    );

    // The increment itself travels as an int64: exact past 2^53 on the wire, so it can be
    // refused rather than rounded, when creating the number too.
    assert_refused(
        c.documents
            .patch_document(patch("n", vec![incr("/fresh", TWO_53 + 1)]))
            .await,
        "INVALID_PATCH",
        &["incr /fresh", "9007199254740993"],
    );
    let doc = c
        .documents
        .patch_document(patch(
            "n",
            vec![incr("/fresh", TWO_53 - 1), incr("/count", -TWO_53)],
        ))
        .await
        .expect("exact")
        .into_inner();
    let body = doc.body.expect("body").into_map();
    assert_eq!(
        (&body["fresh"], &body["count"]),
        (&json!(TWO_53 - 1), &json!(0))
    );

    // In a batch, the same rule, and the batch names the operation.
    assert_refused(
        c.documents
            .execute_batch(batch(vec![BatchOperation {
                op: Some(BatchOp::Patch(BatchPatch {
                    id: "n".into(),
                    operations: vec![incr("/fresh", 2)],
                    ..Default::default()
                })),
            }]))
            .await,
        "INVALID_PATCH",
        &["batch operation 0 (patch)", "2^53"],
    );
}

/// Regression (issue 23): bodies took 128 levels, but patch values, query parameters and
/// partition keys failed to decode at about 32 levels of objects (prost's recursion limit),
/// with no reason. Every JSON field now takes 128 levels and refuses the 129th alike.
#[tokio::test]
async fn every_json_field_takes_the_same_depth_and_refuses_deeper_alike() {
    let (_dir, _server, mut c) = start().await;
    create(&mut c, json!({"id": "doc", "pk": "p"}))
        .await
        .expect("create");
    for lists in [false, true] {
        let fits = nested(MAX_DEPTH, lists);
        let deeper = nested(MAX_DEPTH + 1, lists);

        // Document bodies (the document is level 1).
        let mut body = object(json!({"id": "deep", "pk": "p"}));
        body.insert("x".into(), nested(MAX_DEPTH - 1, lists));
        create(&mut c, Value::Object(body.clone()))
            .await
            .expect("128 levels");
        body.insert("x".into(), fits.clone());
        body.insert("id".into(), json!("deeper"));
        assert_refused(
            create(&mut c, Value::Object(body.clone())).await,
            "DOCUMENT_TOO_DEEP",
            &["nested deeper than 128 levels"],
        );
        // Batch operation bodies.
        assert_refused(
            c.documents
                .execute_batch(batch(vec![BatchOperation {
                    op: Some(BatchOp::Create(BatchCreate {
                        body: Some(JsonObject::new(body)),
                        ttl: None,
                    })),
                }]))
                .await,
            "DOCUMENT_TOO_DEEP",
            &[
                "batch operation 0 (create)",
                "nested deeper than 128 levels",
            ],
        );
        c.documents
            .delete_document(mayfly_proto::v1::DeleteDocumentRequest {
                database: "d".into(),
                collection: "c".into(),
                id: "deep".into(),
                partition_key: Some(string_pk("p")),
                ..Default::default()
            })
            .await
            .expect("delete");

        // Patch values: 128 levels decode (placed at /x they make the document 129 deep,
        // refused as a body is); 129 are refused naming the operation.
        c.documents
            .patch_document(patch("doc", vec![set("/x", nested(MAX_DEPTH - 1, lists))]))
            .await
            .expect("127 levels under /x");
        assert_refused(
            c.documents
                .patch_document(patch("doc", vec![set("/x", fits.clone())]))
                .await,
            "DOCUMENT_TOO_DEEP",
            &["the document is nested deeper than 128 levels"],
        );
        assert_refused(
            c.documents
                .patch_document(patch("doc", vec![set("/x", deeper.clone())]))
                .await,
            "DOCUMENT_TOO_DEEP",
            &["the value of patch operation 0 (set /x)", "128 levels"],
        );
        assert_refused(
            c.documents
                .execute_batch(batch(vec![BatchOperation {
                    op: Some(BatchOp::Patch(BatchPatch {
                        id: "doc".into(),
                        operations: vec![set("/y", deeper.clone())],
                        ..Default::default()
                    })),
                }]))
                .await,
            "DOCUMENT_TOO_DEEP",
            &[
                "batch operation 0 (patch)",
                "patch operation 0 (set /y)",
                "128 levels",
            ],
        );

        // Query parameters.
        let query = |value: Value| QueryRequest {
            database: "d".into(),
            collection: "c".into(),
            query: "SELECT VALUE c.id FROM c WHERE c.x = @p".into(),
            parameters: [("@p".to_owned(), JsonValue::new(value))].into(),
            ..Default::default()
        };
        let mut results = c
            .documents
            .query(query(fits.clone()))
            .await
            .expect("128 levels")
            .into_inner();
        let mut ids = Vec::new();
        while let Some(page) = results.message().await.expect("a page") {
            ids.extend(page.results);
        }
        assert_eq!(ids, Vec::<Value>::new(), "no document holds it");
        let refused = match c.documents.query(query(deeper.clone())).await {
            Ok(stream) => stream.into_inner().message().await.map(drop),
            Err(status) => Err(status),
        };
        assert_refused(
            refused,
            "DOCUMENT_TOO_DEEP",
            &["query parameter @p", "128 levels"],
        );

        // Partition key values: a list or object is the wrong type up to 128 levels, and
        // too deep past them.
        let read = |value: Value| ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: "doc".into(),
            partition_key: Some(PartitionKey {
                kind: Some(PartitionKeyKind::Value(JsonValue::new(value))),
            }),
        };
        assert_refused(
            c.documents.read_document(read(fits.clone())).await,
            "INVALID_PARTITION_KEY",
            &[if lists { "a list" } else { "an object" }],
        );
        assert_refused(
            c.documents.read_document(read(deeper.clone())).await,
            "DOCUMENT_TOO_DEEP",
            &["partition_key", "128 levels"],
        );
    }
}

/// Too many query parameters is a query limit; a bad name a query mistake; only a value JSON
/// cannot hold is INVALID_JSON.
#[tokio::test]
async fn query_parameters_are_refused_with_their_own_reasons() {
    let (_dir, _server, mut c) = start().await;
    let query = |parameters: HashMap<String, JsonValue>| QueryRequest {
        database: "d".into(),
        collection: "c".into(),
        query: "SELECT * FROM c".into(),
        parameters,
        ..Default::default()
    };
    let many = (0..257)
        .map(|i| (format!("@p{i}"), JsonValue::new(json!(i))))
        .collect();
    assert_refused(
        c.documents.query(query(many)).await.map(drop),
        "QUERY_LIMIT",
        &["257 query parameters given; at most 256"],
    );
    let bad_name = [("p".to_owned(), JsonValue::new(json!(1)))].into();
    assert_refused(
        c.documents.query(query(bad_name)).await.map(drop),
        "QUERY_INVALID",
        &["query parameter name 'p'"],
    );
    let nan = prost_types::Value {
        kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
    };
    let not_json = [("@p".to_owned(), JsonValue::from(nan))].into();
    assert_refused(
        c.documents.query(query(not_json)).await.map(drop),
        "INVALID_JSON",
        &["query parameter @p", "NaN"],
    );
}

/// Regression (issue 23): ids could hold NUL, newlines and other control characters, or be
/// only whitespace.
#[tokio::test]
async fn ids_with_control_characters_or_only_whitespace_are_refused() {
    let (_dir, _server, mut c) = start().await;
    for (id, says) in [
        ("a\nb", "U+000A"),
        ("nul\0", "U+0000"),
        ("\u{7f}", "U+007F"),
        (" \t", "U+0009"),
        ("   ", "only whitespace"),
    ] {
        assert_refused(
            c.databases
                .create_database(CreateDatabaseRequest {
                    id: id.into(),
                    ..Default::default()
                })
                .await,
            "INVALID_ID",
            &["invalid database id", says],
        );
        assert_refused(
            c.collections
                .create_collection(CreateCollectionRequest {
                    database: "d".into(),
                    id: id.into(),
                    partition_key_path: "/pk".into(),
                    ..Default::default()
                })
                .await,
            "INVALID_ID",
            &["invalid collection id", says],
        );
        assert_refused(
            create(&mut c, json!({"id": id, "pk": "p"})).await,
            "INVALID_ID",
            &["invalid document id", says],
        );
        // Existing resources are named by the rules they were created under (earlier
        // versions stored such ids): nothing by this id can exist now.
        let missing = c
            .documents
            .read_document(ReadDocumentRequest {
                database: "d".into(),
                collection: "c".into(),
                id: id.into(),
                partition_key: Some(string_pk("p")),
            })
            .await
            .expect_err("nothing by this id");
        assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    }
    // Spaces around visible characters are fine.
    create(&mut c, json!({"id": " spaced out ", "pk": "p"}))
        .await
        .expect("a visible character");
}

/// Code and ErrorInfo reason of a refusal, and its message.
fn refused_as(result: Result<impl std::fmt::Debug, Status>, code: Code, reason: &str) -> String {
    let (got_code, got, message) = refusal(&result.expect_err("refused"));
    assert_eq!((got_code, got.as_str()), (code, reason), "{message}");
    message
}

/// Regression (issue 23, defect 5): a request message over the size limit was OUT_OF_RANGE
/// with tonic's text and no reason, and the management services refused at 4 MiB where the
/// README promises 16 MiB. Now RESOURCE_EXHAUSTED (what gRPC answers a message larger than
/// the receiver takes), reason MESSAGE_TOO_LARGE, saying the limit and what to do.
#[tokio::test]
async fn messages_over_the_size_limit_are_refused_with_a_reason_saying_the_limit() {
    let (_dir, _server, mut c) = start().await;
    let limit = mayfly_server::MAX_MESSAGE_BYTES;
    let too_long = "x".repeat(limit + 1);

    let message = refused_as(
        create(&mut c, json!({"id": "big", "pk": "p", "s": too_long})).await,
        Code::ResourceExhausted,
        "MESSAGE_TOO_LARGE",
    );
    for part in ["16777216 bytes (16 MiB)", "2 MiB", "several"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    // Every keyed service takes the same 16 MiB: a 5 MiB id reaches the id check...
    refused_as(
        c.databases
            .create_database(CreateDatabaseRequest {
                id: "i".repeat(5 << 20),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "INVALID_ID",
    );
    // ...and past 16 MiB the message is refused unread, as for documents.
    refused_as(
        c.databases
            .create_database(CreateDatabaseRequest {
                id: too_long.clone(),
                ..Default::default()
            })
            .await,
        Code::ResourceExhausted,
        "MESSAGE_TOO_LARGE",
    );
    // Health, open to callers without a key, takes 64 KiB.
    let message = refused_as(
        c.health
            .check(HealthCheckRequest {
                service: "s".repeat(65 * 1024),
            })
            .await,
        Code::ResourceExhausted,
        "MESSAGE_TOO_LARGE",
    );
    assert!(message.contains("(64 KiB)"), "{message}");

    // Still serving, on the same connection.
    create(&mut c, json!({"id": "small", "pk": "p"}))
        .await
        .expect("serves after refusing large messages");
}

/// Regression (issue 23, defect 5): a grpc.health.v1.Health request that did not decode was
/// INTERNAL (the code the README keeps for storage failures), with no reason. Now it is
/// INVALID_ARGUMENT with the reason every service gives a message that does not decode.
#[tokio::test]
async fn undecodable_requests_are_invalid_argument_with_one_reason_for_every_service() {
    let (_dir, server, mut c) = start().await;
    let channel = clients::channel(&server.url()).await;
    // Field 1 (`service` of a health request, `database` of a read) not UTF-8.
    let bad_utf8 = length_delimited(1, &[0xff, 0xfe, b'x']);

    let check = raw_call(&channel, "/grpc.health.v1.Health/Check", bad_utf8.clone()).await;
    let message = refused_as(check, Code::InvalidArgument, "UNDECODABLE_MESSAGE");
    assert!(
        message.contains("does not decode") && message.contains("HealthCheckRequest.service"),
        "{message}"
    );
    // The watch, a stream, is refused before it starts, alike.
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let watch = grpc
        .server_streaming(
            tonic::Request::new(bad_utf8.clone()),
            tonic::codegen::http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Watch"),
            RawCodec,
        )
        .await;
    refused_as(watch, Code::InvalidArgument, "UNDECODABLE_MESSAGE");
    // A Mayfly service gives the same reason.
    let read = raw_call(&channel, "/mayfly.v1.Documents/ReadDocument", bad_utf8).await;
    let message = refused_as(read, Code::InvalidArgument, "UNDECODABLE_MESSAGE");
    assert!(
        message.contains("ReadDocumentRequest.database"),
        "{message}"
    );

    // Health is still answered, and an unknown service is NOT_FOUND as before, not
    // mistaken for a request that does not decode.
    let serving = c
        .health
        .check(HealthCheckRequest::default())
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(serving.status(), ServingStatus::Serving);
    let unknown = c
        .health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("not a service");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
}
