//! What the fuzz targets (`fuzz/fuzz_targets/*.rs`) run, and what `tests/fuzz_seeds.rs` replays
//! their seed corpus through: one function per target, taking the fuzzer's bytes.
//!
//! None of them may panic, whatever the input: a panic is a finding. Beyond "does not crash",
//! each asserts what must hold for every input (round trips, a tampered token refused, a
//! client's input answered as INVALID_ARGUMENT and never as a server failure), so that an
//! assertion failure is a finding too.
//!
//! Work is bounded per input: inputs are at most what the fuzz runs allow (64 KiB), the query
//! evaluator has its own per-document budget, and the engine fixture holds a few documents.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use mayfly_engine::testing::same_inline;
use mayfly_proto::{
    json::{self, JsonObject, MAX_DEPTH, MAX_JSON_BYTES},
    v1::{
        self, CreateDocumentRequest, DeleteDocumentRequest, QueryRequest, ReplaceDocumentRequest,
        UpsertDocumentRequest, server::Documents as _,
    },
};
use prost::Message as _;
use serde_json::{Map, Value, json};
use sha2::Sha256;
use tonic::{Code, Request};

use crate::{
    auth::{
        Action, Authenticator, Denied, KeyRing, KeySlot, NoResources, Principal, ResourceToken,
        Resources, Target,
    },
    current_engine::CurrentEngine,
    engine::{
        CollectionPath, CollectionSettings, CollectionUid, DatabaseUid, DefaultTtl, DocumentBody,
        DocumentTtl, Engine, EngineConfig, Error, FeedScope, IdKind, IndexingMode, ManualClock,
        Millis, PartitionKeyPath, PartitionKeyValue, QueryCursor, QueryReads, QuerySpec,
        ResourceId, TokenKey,
    },
    grpc::DocumentsService,
    storage::MemoryStorage,
};

/// A fuzz target's entry function.
pub type Entry = fn(&[u8]);

/// The fuzz targets, by name, with their entry functions.
pub const TARGETS: &[(&str, Entry)] = &[
    ("json_decoder", json_decoder),
    ("document", document),
    ("continuation", continuation),
    ("query", query),
    ("auth", auth),
];

/// The key continuation tokens are sealed with, in the fuzz targets and their seeds.
pub const TOKEN_KEY: [u8; 32] = *b"mayfly fuzz continuation key 32b";

/// The four account keys of the `auth` target (primary, secondary, and their read-only
/// twins), as `--key` flags would give them.
pub const ACCOUNT_KEYS: [&str; 4] = [
    "fuzz-primary-key-0123456789abcdef",
    "fuzz-secondary-key-0123456789abcd",
    "fuzz-primary-readonly-0123456789a",
    "fuzz-secondary-readonly-012345678",
];

/// The clock of every fixture: engine writes, query readings and token expiry.
pub const NOW: Millis = 1_790_000_000_000;

/// Database of the engine fixture.
const DATABASE: &str = "fuzz";
/// Collections of the engine fixture (all partitioned on `/pk`): one the `document` target
/// writes to, one the `json_decoder` target writes to, and one with a few documents that
/// feeds, queries and continuation tokens read.
const DOCUMENT_COLLECTION: &str = "documents";
const WIRE_COLLECTION: &str = "wire";
const READ_COLLECTION: &str = "read";
/// Page size of the fixture's feeds and queries: small, so that tokens are handed out.
const PAGE: usize = 3;

// ---- json_decoder ----

/// The `google.protobuf.Struct` decoder and JSON ↔ proto conversion: `data` decoded as a bare
/// Struct and as each request message that carries a document (as the gRPC codec decodes
/// them: prost, with Mayfly's Struct and Value), and query parameters as `google.protobuf.Value`s.
/// Asserts that an accepted body is within the depth and size limits, encodes and decodes
/// back to itself, converts to `google.protobuf.Value` and back to itself, agrees with
/// prost's own `Struct` decoding on canonical encodings, and that the gRPC edge answers a
/// decoded create/upsert/replace with success or INVALID_ARGUMENT, never a server failure.
pub fn json_decoder(data: &[u8]) {
    if let Ok(object) = JsonObject::decode(data) {
        let accepted = check_received(object);
        if let Some(map) = &accepted {
            agrees_with_prost_struct(data, map);
        }
    }
    if let Ok(mut request) = CreateDocumentRequest::decode(data) {
        if let Some(body) = request.body.clone() {
            check_received(body);
        }
        check_names(&request.database, &request.collection);
        request.database = DATABASE.to_owned();
        request.collection = WIRE_COLLECTION.to_owned();
        edge_create(request, None);
    }
    if let Ok(mut request) = UpsertDocumentRequest::decode(data) {
        if let Some(body) = request.body.clone() {
            check_received(body);
        }
        request.database = DATABASE.to_owned();
        request.collection = WIRE_COLLECTION.to_owned();
        edge_upsert(request);
    }
    if let Ok(mut request) = ReplaceDocumentRequest::decode(data) {
        if let Some(body) = request.body.clone() {
            check_received(body);
        }
        request.database = DATABASE.to_owned();
        request.collection = WIRE_COLLECTION.to_owned();
        edge_replace(request);
    }
    if let Ok(request) = QueryRequest::decode(data) {
        for value in request.parameters.into_values() {
            if let Ok(json) = value.into_checked() {
                assert!(
                    depth(&json) <= MAX_DEPTH,
                    "a parameter deeper than the limit"
                );
                assert_eq!(
                    json::from_proto_value(json::to_proto_value(&json)).as_ref(),
                    Ok(&json),
                    "a parameter converts to proto and back unchanged"
                );
                let sent = json::JsonValue::new(json.clone()).encode_to_vec();
                assert_eq!(
                    json::JsonValue::decode(sent.as_slice())
                        .ok()
                        .map(json::JsonValue::into_checked),
                    Some(Ok(json)),
                    "a parameter re-sent is received unchanged"
                );
            }
        }
    }
}

/// Checks a received body the way the edge does; returns it if accepted.
fn check_received(object: JsonObject) -> Option<Map<String, Value>> {
    let map = Arc::unwrap_or_clone(object.into_checked().ok()?);
    let value = Value::Object(map);
    assert!(depth(&value) <= MAX_DEPTH, "an accepted body is too deep");
    let compact = serde_json::to_vec(&value).expect("a JSON tree serializes");
    assert!(
        compact.len() <= MAX_JSON_BYTES,
        "an accepted body is {} bytes of JSON",
        compact.len()
    );
    let Value::Object(map) = value else {
        unreachable!("built as an object")
    };
    // Stored form: Mayfly's own encoding decodes back to the same object.
    let encoded = json::encode(&map);
    assert_eq!(json::decode(&encoded), map, "encode/decode round trip");
    let again = JsonObject::decode(encoded.as_ref()).expect("our own encoding decodes");
    assert_eq!(
        again.into_checked().as_deref(),
        Ok(&map),
        "a re-sent body is accepted unchanged"
    );
    // As a google.protobuf.Value (query results travel so) and back.
    let value = Value::Object(map);
    assert_eq!(
        json::from_proto_value(json::to_proto_value(&value)).as_ref(),
        Ok(&value),
        "JSON -> proto -> JSON round trip"
    );
    let Value::Object(map) = value else {
        unreachable!("built as an object")
    };
    // Validation as a document must not panic, whatever it decides.
    let _ = DocumentBody::parse(Arc::new(map.clone()), None);
    Some(map)
}

/// Where prost's `google.protobuf.Struct` decodes `data` and `data` is exactly its canonical
/// encoding, Mayfly's decoder must read the same object. (On other encodings protobuf merges
/// repeated message fields where Mayfly's decoder keeps the last: no client sends those.)
fn agrees_with_prost_struct(data: &[u8], accepted: &Map<String, Value>) {
    let Ok(st) = prost_types::Struct::decode(data) else {
        return;
    };
    if st.encode_to_vec() != data {
        return;
    }
    let as_value = prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(st)),
    };
    if let Ok(Value::Object(theirs)) = json::from_proto_value(as_value) {
        assert_eq!(&theirs, accepted, "prost and Mayfly decode a Struct alike");
    }
}

/// Request names are validated as ids; this must not panic.
fn check_names(database: &str, collection: &str) {
    let _ = ResourceId::parse(IdKind::Database, database);
    let _ = ResourceId::parse(IdKind::Collection, collection);
}

// ---- document ----

/// Document validation on JSON: `data` parsed with serde_json (skipped if it is not a JSON
/// object), sent over the wire encoding, checked as a body (id, ttl, depth, size, system
/// properties) with several request `ttl` fields, its partition key extracted at several
/// paths, and created and deleted through the gRPC edge. Asserts that an accepted body has a
/// valid id and ttl (the request's if given), no system property, the limits kept, a stored
/// form that decodes back to it, partition keys that round trip through their encodings, and
/// that the edge accepts exactly what this validation accepts (else INVALID_ARGUMENT).
pub fn document(data: &[u8]) {
    let Ok(Value::Object(sent)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // What the server receives: the object through the Struct wire encoding.
    let wire = JsonObject::new(sent.clone()).encode_to_vec();
    let received = JsonObject::decode(wire.as_slice()).expect("our own encoding decodes");
    let map = match received.into_checked() {
        Ok(map) => map,
        // serde_json refuses deeper than 128 levels and the input is far below 2 MiB.
        Err(defect) => panic!("a JSON object is refused on the wire: {defect}"),
    };
    assert!(
        same_json(&Value::Object((*map).clone()), &Value::Object(sent)),
        "the wire keeps every value (numbers as doubles)"
    );
    let seed = fnv(data);
    let ttl_fields = [
        None,
        match map.get("ttl").and_then(Value::as_i64) {
            Some(t) => Some(t),
            None => Some([-1, 0, 1, 60, -2, i64::from(i32::MAX) + 1][seed as usize % 6]),
        },
    ];
    for ttl_field in ttl_fields {
        let local = DocumentBody::parse(map.clone(), ttl_field);
        if let Ok(body) = &local {
            check_body(body, &map, ttl_field);
        }
        for path in ["/pk", "/id", "/ttl", "/a/b", "/nested/deep/key", "/_ts"] {
            let Ok(path) = PartitionKeyPath::parse(path) else {
                continue;
            };
            if let Ok(body) = &local
                && let Ok(pk) = path.extract(body.map())
            {
                check_partition_key(&pk);
            }
        }
        // The same body through the gRPC edge, into a collection partitioned on `/pk`.
        let requested = match (seed >> 8) % 4 {
            0 => None,
            1 => local
                .as_ref()
                .ok()
                .and_then(|b| pk_path().extract(b.map()).ok()),
            2 => Some(PartitionKeyValue::Undefined),
            _ => Some(PartitionKeyValue::String("p0".into())),
        };
        let expected = local.as_ref().ok().and_then(|body| {
            let pk = pk_path().extract(body.map()).ok()?;
            requested
                .as_ref()
                .is_none_or(|r| *r == pk)
                .then(|| (body.clone(), pk))
        });
        let request = CreateDocumentRequest {
            database: DATABASE.to_owned(),
            collection: DOCUMENT_COLLECTION.to_owned(),
            body: Some(JsonObject::decode(wire.as_slice()).expect("decodes")),
            partition_key: requested
                .as_ref()
                .map(crate::grpc::convert::partition_key_proto),
            ttl: ttl_field,
            idempotency_key: String::new(),
        };
        edge_create(request, Some(expected));
    }
}

/// What an accepted body must be.
fn check_body(body: &DocumentBody, received: &Map<String, Value>, ttl_field: Option<i64>) {
    let map = body.map();
    let id = map.get("id").and_then(Value::as_str).expect("a string id");
    assert_eq!(id, body.id().as_str());
    let chars = id.chars().count();
    assert!((1..=255).contains(&chars), "id of {chars} characters");
    assert!(!id.contains(['/', '\\', '?', '#']), "id {id:?}");
    for system in ["_rid", "_self", "_etag", "_ts", "_attachments"] {
        assert!(!map.contains_key(system), "{system} kept");
    }
    let body_ttl = map
        .get("ttl")
        .map(|t| DocumentTtl::from_json(t).expect("a valid ttl"));
    assert_eq!(body.ttl(), body_ttl);
    if let Some(field) = ttl_field {
        assert_eq!(
            body.ttl(),
            Some(DocumentTtl::from_i64(field).expect("valid"))
        );
    } else {
        assert_eq!(map.get("ttl"), received.get("ttl"));
    }
    let value = Value::Object((**map).clone());
    assert!(depth(&value) <= MAX_DEPTH);
    let len = serde_json::to_vec(&value).expect("serializes").len();
    assert!(len <= MAX_JSON_BYTES, "{len} bytes accepted");
    let (stored, _) = body.clone().into_stored();
    assert_eq!(
        &json::decode(&stored),
        &**map,
        "the stored form decodes back"
    );
}

/// A partition key value keeps its identity through every form it takes.
fn check_partition_key(pk: &PartitionKeyValue) {
    let mut encoded = Vec::new();
    pk.encode_ordered(&mut encoded);
    let (decoded, rest) =
        PartitionKeyValue::decode_ordered(&encoded).expect("its own encoding decodes");
    assert!(rest.is_empty());
    assert_eq!(&decoded, pk, "ordered encoding round trip");
    match pk.to_json() {
        None => assert!(matches!(pk, PartitionKeyValue::Undefined)),
        Some(json) => assert_eq!(
            &PartitionKeyValue::from_json(&json).expect("its own JSON is a key"),
            pk,
            "JSON round trip"
        ),
    }
}

// ---- continuation ----

/// Continuation tokens: `data` (as text) opened with the fixed key, `data` sealed and every
/// single-character change of the sealed token refused, and payloads (`data` itself, what
/// opens, and a base64 token's bytes without its tag) sealed and handed to the fixture
/// engine's feed and query resumption. Asserts that what opens is exactly a sealed token,
/// that sealing round trips, that a forged or altered token never opens, and that any payload
/// resumes a read or is refused as INVALID_ARGUMENT (never a storage failure), with each
/// resumed read ending in a bounded number of pages.
pub fn continuation(data: &[u8]) {
    let key = TokenKey::from_bytes(TOKEN_KEY);
    let text = String::from_utf8_lossy(data);
    let opened = key.open(&text).ok();
    if let Some(payload) = &opened {
        assert_eq!(key.seal(payload), text, "only a sealed token opens");
    }
    let sealed = key.seal(data);
    assert_eq!(
        key.open(&sealed).as_deref(),
        Ok(data),
        "seal/open round trip"
    );
    let mut other = TOKEN_KEY;
    other[0] ^= 1;
    assert!(
        TokenKey::from_bytes(other).open(&sealed).is_err(),
        "another key's token opens"
    );
    // Every single-character change of a short token, a sample of a long one's.
    let chars = sealed.as_bytes();
    let step = (chars.len() / 64).max(1);
    for at in (seed_offset(data, step)..chars.len()).step_by(step) {
        for replacement in [b'A', b'_'] {
            let replacement = if chars[at] == replacement {
                b'-'
            } else {
                replacement
            };
            let mut altered = chars.to_vec();
            altered[at] = replacement;
            let altered = String::from_utf8(altered).expect("base64 is ASCII");
            assert!(
                key.open(&altered).is_err(),
                "a token changed at {at} still opens"
            );
        }
    }
    assert!(key.open(&sealed[..sealed.len() - 1]).is_err());
    assert!(key.open(&format!("{sealed}A")).is_err());

    let mut payloads = vec![data.to_vec()];
    payloads.extend(opened);
    if let Ok(raw) = URL_SAFE_NO_PAD.decode(text.as_bytes())
        && raw.len() >= 16
    {
        payloads.push(raw[..raw.len() - 16].to_vec());
    }
    payloads.dedup();
    let f = fixture();
    resume_feed(f, &text);
    for payload in payloads {
        let token = key.seal(&payload);
        resume_feed(f, &token);
        resume_query(f, &token);
    }
}

fn seed_offset(data: &[u8], step: usize) -> usize {
    (fnv(data) as usize) % step
}

/// Reads the fixture's feed from `token` in several scopes: a page or INVALID_ARGUMENT, and a
/// page's own continuation leads on to the end.
fn resume_feed(f: &Fixture, token: &str) {
    let path = f.path(READ_COLLECTION);
    for scope in scopes() {
        match f
            .engine
            .read_feed_page(
                &path,
                &scope,
                PAGE,
                Some(token),
                crate::engine::QueryReads::unlimited(),
            )
            .result
        {
            Ok(page) => {
                assert!(page.documents.len() <= PAGE);
                for doc in &page.documents {
                    if let FeedScope::Partition(pk) = &scope {
                        assert_eq!(
                            &doc.key.partition_key, pk,
                            "a document of another partition"
                        );
                    }
                }
                let mut next = page.continuation;
                let mut pages = 0;
                while let Some(token) = next {
                    pages += 1;
                    assert!(pages <= READ_DOCS + 4, "the feed does not end");
                    let page = f
                        .engine
                        .read_feed_page(
                            &path,
                            &scope,
                            PAGE,
                            Some(&token),
                            crate::engine::QueryReads::unlimited(),
                        )
                        .result
                        .expect("a token the engine issued resumes");
                    next = page.continuation;
                }
            }
            Err(e) => assert_client_error(&e),
        }
    }
}

/// Resumes the fixture's queries from `token`: a page or INVALID_ARGUMENT, and pages that end.
fn resume_query(f: &Fixture, token: &str) {
    let path = f.path(READ_COLLECTION);
    let read_at = f.engine.query_reading();
    for spec in &f.specs {
        for scope in scopes() {
            let cursor = match f.engine.query_cursor(&path, spec, &scope, Some(token)) {
                Ok(cursor) => cursor,
                Err(e) => {
                    assert_client_error(&e);
                    continue;
                }
            };
            if matches!(cursor, QueryCursor::Offset(_)) {
                continue;
            }
            let mut cursor = Some(cursor);
            let mut pages = 0;
            while let Some(c) = cursor.take() {
                pages += 1;
                assert!(pages <= READ_DOCS + 4, "the query does not end");
                let page = match f
                    .engine
                    .query_stream_page(
                        &path,
                        spec,
                        &scope,
                        PAGE,
                        c,
                        read_at,
                        QueryReads::unlimited(),
                    )
                    .result
                {
                    Ok(page) => page,
                    Err(e) => {
                        assert_client_error(&e);
                        break;
                    }
                };
                if let Some(next) = page.continuation {
                    cursor = Some(
                        f.engine
                            .query_cursor(&path, spec, &scope, Some(&next))
                            .expect("a token the engine issued resumes"),
                    );
                }
            }
        }
    }
}

fn scopes() -> [FeedScope; 3] {
    [
        FeedScope::Collection,
        FeedScope::Partition(PartitionKeyValue::String("p1".into())),
        FeedScope::Partition(PartitionKeyValue::Undefined),
    ]
}

/// A client's input may be refused, never fail the server.
fn assert_client_error(e: &Error) {
    assert!(
        matches!(e, Error::Invalid(_) | Error::Query(_)),
        "client input caused a server-side error: {e:?}"
    );
}

// ---- query ----

/// The query language: `data` as UTF-8 query text parsed; if it parses, it is run (with
/// values for its parameters) over a few fixed documents by the evaluator alone, document by
/// document with resumption as the engine pages, through the server's query checks, and over
/// the fixture engine's collection in small pages (through continuation tokens) and in one.
/// Work is bounded by the evaluator's per-document budget and the fixture's size. Asserts that
/// a streaming query gives the same results run in one go or resumed after each document, and
/// that the engine's results do not depend on the page size.
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = mayfly_query::parse(text) else {
        return;
    };
    let values = [
        json!(1),
        json!("p1"),
        json!([1, "two", null]),
        json!({"x": 1}),
        json!(null),
        json!(2.5),
        json!(true),
    ];
    let params: Map<String, Value> = parsed
        .parameters()
        .iter()
        .enumerate()
        .map(|(i, name)| (format!("@{name}"), values[i % values.len()].clone()))
        .collect();
    let context = || mayfly_query::Context::new(NOW as i64, 7);
    let docs = query_documents();
    let whole = run_query(&parsed, &params, context(), &docs, false);
    // Resumed after each document, as a streaming query's pages are. RAND() draws from a
    // generator seeded per run, so only queries without it give the same results.
    let random = text.to_ascii_lowercase().contains("rand");
    if mayfly_query::is_streaming(&parsed)
        && !random
        && let Ok(whole) = &whole
    {
        let resumed = run_query(&parsed, &params, context(), &docs, true)
            .expect("a query that ran in one go runs resumed");
        assert_eq!(
            &resumed, whole,
            "resuming after each document changes the results"
        );
    }
    // The server's own checks, and the engine: page by page as clients read, and in one
    // page. Paging must not change what a query returns.
    let mut spec = QuerySpec::parse(text, params).expect("parsed, with every parameter given");
    spec.enable_scan = true;
    if random {
        return;
    }
    let f = fixture();
    let read_at = f.engine.query_reading();
    let small = engine_query(f, &spec, PAGE, read_at);
    if let Some(small) = small {
        let large = engine_query(f, &spec, 1000, read_at)
            .expect("a query that ran in small pages runs in one");
        assert_eq!(small, large, "the page size changes the results");
    }
}

/// Every result of `spec` over the fixture's read collection, in pages of `page_size` as the
/// gRPC edge reads them (continuation tokens between pages); `None` if the engine refused
/// it as a client's error.
fn engine_query(
    f: &Fixture,
    spec: &QuerySpec,
    page_size: usize,
    read_at: Millis,
) -> Option<Vec<Value>> {
    let path = f.path(READ_COLLECTION);
    let scope = FeedScope::Collection;
    let mut cursor = match f.engine.query_cursor(&path, spec, &scope, None) {
        Ok(cursor) => cursor,
        Err(e) => {
            assert_client_error(&e);
            return None;
        }
    };
    if let QueryCursor::Offset(_) = cursor {
        let all = same_inline(|reads| {
            f.engine
                .query_all(&path, spec, &scope, read_at, reads)
                .result
        });
        return match all {
            Ok((results, _)) => Some(results),
            Err(e) => {
                assert_client_error(&e);
                None
            }
        };
    }
    let mut results = Vec::new();
    for _ in 0..READ_DOCS + 4 {
        let page = same_inline(|reads| {
            f.engine
                .query_stream_page(
                    &path,
                    spec,
                    &scope,
                    page_size,
                    cursor.clone(),
                    read_at,
                    reads,
                )
                .result
        });
        let page = match page {
            Ok(page) => page,
            Err(e) => {
                assert_client_error(&e);
                return None;
            }
        };
        results.extend(page.results);
        let Some(next) = page.continuation else {
            return Some(results);
        };
        cursor = f
            .engine
            .query_cursor(&path, spec, &scope, Some(&next))
            .expect("a token the engine issued resumes");
    }
    panic!("the query does not end")
}

/// Runs `query` over `docs`; `resumed`: a new run per document, resumed from the counters of
/// the one before, as the engine's streaming pages do.
fn run_query(
    query: &mayfly_query::ast::Query,
    params: &Map<String, Value>,
    context: mayfly_query::Context,
    docs: &[Value],
    resumed: bool,
) -> Result<Vec<Value>, mayfly_query::QueryError> {
    let mut out = Vec::new();
    if !resumed {
        let mut run = mayfly_query::Execution::new(query, params, context)?;
        for doc in docs {
            let flow = run.push(doc)?;
            out.extend(run.take_ready());
            if flow == mayfly_query::Flow::Done {
                break;
            }
        }
        out.extend(run.finish()?);
        return Ok(out);
    }
    let (mut skipped, mut returned) = (0, 0);
    for doc in docs {
        let ctx = mayfly_query::Context::new(context.now_ms, context.rand_state.get());
        let mut run = mayfly_query::Execution::new(query, params, ctx)?.resume(skipped, returned);
        let flow = run.push(doc)?;
        out.extend(run.take_ready());
        (skipped, returned) = run.counters();
        out.extend(run.finish()?);
        if flow == mayfly_query::Flow::Done {
            break;
        }
    }
    Ok(out)
}

/// The documents the `query` target's evaluator-only runs read.
fn query_documents() -> Vec<Value> {
    vec![
        json!({"id": "a", "pk": "p1", "n": 1, "s": "Alpha", "tags": ["x", "y"], "nested": {"arr": [{"y": 1}, {"y": 2}], "x": 1.5}, "_ts": 1790000000}),
        json!({"id": "b", "pk": "p2", "n": -2.5, "s": "beta", "tags": [], "nested": {"arr": []}, "flag": true, "_ts": 1790000001}),
        json!({"id": "c", "n": null, "s": "", "tags": ["x"], "when": "2026-09-22T12:00:00.000Z", "_ts": 1790000002}),
        json!({"id": "d", "pk": 4, "n": 9007199254740993u64, "s": "ünïcödé 😀", "tags": [[1, 2], {"k": "v"}], "_ts": 1790000003}),
    ]
}

// ---- auth ----

/// Authentication: `data` (as text) as an `authorization` value for an authenticator with
/// four known keys, as a credential for resource-token verification, and as the claims of a
/// token signed with a known key (so that the parsing behind the MAC is reached too). Asserts
/// that a caller is a key only if it presented exactly that key, a token only if it presented
/// exactly what the key mints for those claims and before its expiry, that refusals are
/// UNAUTHENTICATED kinds, and that a token verifies again after re-minting.
pub fn auth(data: &[u8]) {
    let f = auth_fixture();
    let text = String::from_utf8_lossy(data);
    let credential = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .map(str::trim);
    match f.auth.authenticate(Some(&text)) {
        Ok(Principal::Key(slot)) => {
            assert_eq!(
                credential,
                Some(ACCOUNT_KEYS[slot_index(slot)]),
                "authenticated as {slot} without its key"
            );
            for action in [Action::Read, Action::Write, Action::Manage] {
                let allowed = Principal::Key(slot)
                    .allow(action, Target::Account, &NoResources)
                    .is_ok();
                assert_eq!(allowed, slot.read_write() || action == Action::Read);
            }
        }
        Ok(Principal::Token(token)) => {
            assert!(token.expires_at > NOW, "an expired token accepted");
            let key = ACCOUNT_KEYS[slot_index(token.minted_by)];
            assert_eq!(
                credential.map(str::to_owned),
                Some(token.mint(key)),
                "a token accepted that its key did not mint"
            );
            check_token_scope(&token);
        }
        Ok(Principal::Open) => panic!("open access with keys configured"),
        Err(denied) => assert!(denied.unauthenticated(), "{denied:?}"),
    }
    assert_eq!(f.auth.authenticate(None), Err(Denied::Missing));
    let raw = text.trim();
    if let Ok(token) = ResourceToken::verify(raw, &f.ring, NOW) {
        assert!(ResourceToken::is_token(raw));
        assert_eq!(token.mint(ACCOUNT_KEYS[slot_index(token.minted_by)]), raw);
    }
    // `data` as the claims of a token the primary key signed: past the MAC, the claims parsing.
    let signed = format!("mft2.p.{}", URL_SAFE_NO_PAD.encode(data));
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(ACCOUNT_KEYS[0].as_bytes())
        .expect("HMAC takes any key length");
    mac.update(b"mayfly resource token v1\n");
    mac.update(signed.as_bytes());
    let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    let minted = format!("{signed}.{tag}");
    if let Ok(token) = ResourceToken::verify(&minted, &f.ring, NOW) {
        assert!(token.expires_at > NOW);
        assert_eq!(token.minted_by, KeySlot::Primary);
        let again = token.mint(ACCOUNT_KEYS[0]);
        assert_eq!(
            ResourceToken::verify(&again, &f.ring, NOW).as_ref(),
            Ok(&token),
            "a re-minted token verifies to the same grant"
        );
        check_token_scope(&token);
    }
    // The same claims under a secondary read-only key's letter, or no key, never verify.
    for letter in ["s", "r", "x"] {
        let other = minted.replacen("mft2.p.", &format!("mft2.{letter}."), 1);
        assert!(ResourceToken::verify(&other, &f.ring, NOW).is_err());
    }
}

/// The resources a token was minted for, still there.
struct MintedFor<'a>(&'a ResourceToken);

impl Resources for MintedFor<'_> {
    fn database_uid(&self, database: &str) -> Option<DatabaseUid> {
        (database == self.0.database).then_some(self.0.database_uid)
    }

    fn collection_uid(&self, database: &str, collection: &str) -> Option<CollectionUid> {
        match &self.0.collection {
            Some(c) if database == self.0.database && c == collection => self.0.collection_uid,
            // Another collection of the token's database (a database-scoped token).
            _ => Some(CollectionUid(u64::MAX)),
        }
    }
}

/// A token may read what it covers while that is what it was minted for, and never manage.
fn check_token_scope(token: &ResourceToken) {
    let principal = Principal::Token(token.clone());
    let current = MintedFor(token);
    assert!(
        principal
            .allow(Action::Manage, Target::Account, &current)
            .is_err()
    );
    let collection = token.collection.as_deref().unwrap_or("c");
    let target = Target::documents(&token.database, collection, token.partition_key.as_ref());
    assert!(
        principal.allow(Action::Read, target, &current).is_ok(),
        "a token cannot read its own scope"
    );
    assert_eq!(
        principal.allow(Action::Write, target, &current).is_ok(),
        token.write
    );
    // Deleted since (or replaced by another of the same name): nothing.
    assert!(matches!(
        principal.allow(Action::Read, target, &NoResources),
        Err(Denied::ResourceDeleted { .. })
    ));
    let _ = principal.allow(Action::Read, Target::Database(&token.database), &current);
    let _ = principal.allow(
        Action::Read,
        Target::documents("other", "c", None),
        &current,
    );
}

fn slot_index(slot: KeySlot) -> usize {
    KeySlot::ALL
        .iter()
        .position(|s| *s == slot)
        .expect("every slot is in ALL")
}

struct AuthFixture {
    auth: Authenticator,
    ring: KeyRing,
}

fn auth_fixture() -> &'static AuthFixture {
    static AUTH: OnceLock<AuthFixture> = OnceLock::new();
    AUTH.get_or_init(|| {
        let ring = || KeyRing::given(ACCOUNT_KEYS.map(|k| Some(k.to_owned())));
        AuthFixture {
            auth: Authenticator::with_keys(ring(), Arc::new(ManualClock::new(NOW))),
            ring: ring(),
        }
    })
}

// ---- the gRPC edge and the engine fixture ----

struct Fixture {
    runtime: tokio::runtime::Runtime,
    engine: Engine,
    documents: DocumentsService,
    /// Queries whose continuations the `continuation` target resumes: a streaming scan, a
    /// streaming index read, and one that reads its whole scope.
    specs: Vec<QuerySpec>,
}

/// Documents in the read collection.
const READ_DOCS: usize = 10;

impl Fixture {
    fn path(&self, collection: &str) -> CollectionPath {
        CollectionPath {
            database: ResourceId::parse(IdKind::Database, DATABASE).expect("valid"),
            collection: ResourceId::parse(IdKind::Collection, collection).expect("valid"),
        }
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

fn pk_path() -> PartitionKeyPath {
    PartitionKeyPath::parse("/pk").expect("valid path")
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let clock = Arc::new(ManualClock::new(NOW));
        let config = EngineConfig {
            token_key: TokenKey::from_bytes(TOKEN_KEY),
            ..EngineConfig::new(4)
        };
        let engine = Engine::new(config, Arc::new(MemoryStorage::new()), clock.clone());
        let database = ResourceId::parse(IdKind::Database, DATABASE).expect("valid");
        engine.create_database(database.clone()).expect("database");
        for (name, ttl) in [
            (DOCUMENT_COLLECTION, Some(-1)),
            (WIRE_COLLECTION, None),
            (READ_COLLECTION, Some(3600)),
        ] {
            let settings = CollectionSettings::new(
                DefaultTtl::from_raw(ttl).expect("valid"),
                IndexingMode::Consistent,
            )
            .expect("valid settings");
            engine
                .create_collection(
                    &database,
                    ResourceId::parse(IdKind::Collection, name).expect("valid"),
                    pk_path(),
                    settings,
                    Default::default(),
                )
                .expect("collection");
        }
        let documents = DocumentsService::new(
            CurrentEngine::new(engine.clone()),
            Authenticator::open(clock),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let f = Fixture {
            runtime,
            engine,
            documents,
            specs: [
                "SELECT * FROM c",
                "SELECT c.id, c.n FROM c WHERE c.n >= 2",
                "SELECT VALUE c.id FROM c ORDER BY c.n DESC",
            ]
            .into_iter()
            .map(|text| {
                let mut spec = QuerySpec::parse(text, Map::new()).expect("a valid query");
                spec.enable_scan = true;
                spec
            })
            .collect(),
        };
        let path = f.path(READ_COLLECTION);
        for i in 0..READ_DOCS {
            let mut body = json!({
                "id": format!("doc-{i}"),
                "n": i,
                "s": format!("text {i}"),
                "tags": ["t", i % 3],
                "nested": {"x": i, "arr": [{"y": i}]},
            });
            match i % 5 {
                0 => {}
                1 => body["pk"] = json!(7.5),
                2 => body["pk"] = json!(null),
                _ => body["pk"] = json!(format!("p{}", i % 3)),
            }
            if i % 4 == 0 {
                body["ttl"] = json!(-1);
            }
            let Value::Object(map) = body else {
                unreachable!("an object")
            };
            let body = DocumentBody::parse(Arc::new(map), None).expect("a valid body");
            f.engine
                .create_document(&path, body, None)
                .result
                .expect("created");
        }
        f
    })
}

/// Sends a create through the gRPC edge. With `expected` (what local validation decided: the
/// body and its partition key, or `None` if refused), the edge must agree; a created document
/// is deleted again so that the fixture stays small.
fn edge_create(
    request: CreateDocumentRequest,
    expected: Option<Option<(DocumentBody, PartitionKeyValue)>>,
) {
    let f = fixture();
    let collection = request.collection.clone();
    let reply = f.block_on(f.documents.create_document(Request::new(request)));
    match reply {
        Ok(response) => {
            let doc = response.into_inner();
            if let Some(expected) = expected {
                let (body, pk) = expected.expect("the edge accepted a body validation refuses");
                assert_eq!(doc.id, body.id().as_str());
                assert_eq!(doc.ttl, body.ttl().map(DocumentTtl::to_raw));
                let stored = doc.body.clone().expect("a body").into_map();
                assert_eq!(&stored, &**body.map(), "the stored body differs");
                assert_eq!(
                    doc.partition_key,
                    Some(crate::grpc::convert::partition_key_proto(&pk))
                );
            }
            delete(f, &collection, doc);
        }
        Err(status) => {
            assert_client_status(&status);
            if let Some(Some((body, _))) = expected {
                // Validation accepted it: only the index may still refuse it (terms too large).
                assert!(
                    status.message().contains("index"),
                    "the edge refused a valid body ({}): {}",
                    body.id(),
                    status.message()
                );
            }
        }
    }
}

fn edge_upsert(request: UpsertDocumentRequest) {
    let f = fixture();
    let collection = request.collection.clone();
    match f.block_on(f.documents.upsert_document(Request::new(request))) {
        Ok(response) => {
            let doc = response.into_inner().document.expect("a document");
            delete(f, &collection, doc);
        }
        Err(status) => assert_client_status(&status),
    }
}

fn edge_replace(request: ReplaceDocumentRequest) {
    let f = fixture();
    match f.block_on(f.documents.replace_document(Request::new(request))) {
        // The collection is empty between inputs: nothing to replace.
        Ok(_) => panic!("replaced a document that does not exist"),
        Err(status) => assert_client_status(&status),
    }
}

fn delete(f: &Fixture, collection: &str, doc: v1::Document) {
    let request = DeleteDocumentRequest {
        database: DATABASE.to_owned(),
        collection: collection.to_owned(),
        id: doc.id,
        partition_key: doc.partition_key,
        if_match: String::new(),
        idempotency_key: String::new(),
    };
    f.block_on(f.documents.delete_document(Request::new(request)))
        .expect("a created document deletes");
}

/// A client's request is answered as its own fault, never as the server's.
fn assert_client_status(status: &tonic::Status) {
    assert!(
        matches!(
            status.code(),
            // Not found: replacing a document that is not there; failed precondition: an
            // if_match naming no live version.
            Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition
        ),
        "client input answered with {:?}: {}",
        status.code(),
        status.message()
    );
    assert!(
        status.message().len() <= 1024,
        "a status message of {} bytes",
        status.message().len()
    );
}

// ---- helpers ----

/// Nesting depth of a value (a scalar is 0, `{}` is 1), without recursion.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(m) => {
                deepest = deepest.max(d);
                stack.extend(m.values().map(|v| (v, d + 1)));
            }
            Value::Array(a) => {
                deepest = deepest.max(d);
                stack.extend(a.iter().map(|v| (v, d + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// Equal JSON, numbers compared as the doubles the wire carries.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// FNV-1a: picks variations from the input, deterministically.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Seed inputs made with the fixture's keys, which no one can write by hand: continuation
/// tokens the fixture engine hands out, and resource tokens minted with [`ACCOUNT_KEYS`].
/// `(target, file name, contents)`; `tests/fuzz_seeds.rs` writes them with `--ignored`.
pub fn generated_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let f = fixture();
    let mut out = Vec::new();
    let path = f.path(READ_COLLECTION);
    for (i, scope) in scopes().into_iter().enumerate() {
        if let Ok(page) = f
            .engine
            .read_feed_page(
                &path,
                &scope,
                2,
                None,
                crate::engine::QueryReads::unlimited(),
            )
            .result
            && let Some(token) = page.continuation
        {
            out.push((
                "continuation",
                format!("feed-token-{i}"),
                token.into_bytes(),
            ));
        }
    }
    let read_at = f.engine.query_reading();
    for (i, spec) in f.specs.iter().enumerate() {
        let token = match f
            .engine
            .query_cursor(&path, spec, &FeedScope::Collection, None)
        {
            Ok(QueryCursor::Offset(_)) => f
                .engine
                .query_offset_token(&path, spec, &FeedScope::Collection, 2)
                .ok(),
            Ok(cursor) => f
                .engine
                .query_stream_page(
                    &path,
                    spec,
                    &FeedScope::Collection,
                    2,
                    cursor,
                    read_at,
                    QueryReads::unlimited(),
                )
                .result
                .ok()
                .and_then(|page| page.continuation),
            Err(_) => None,
        };
        if let Some(token) = token {
            out.push((
                "continuation",
                format!("query-token-{i}"),
                token.into_bytes(),
            ));
        }
    }
    let key = TokenKey::from_bytes(TOKEN_KEY);
    // The payloads as well: the target seals raw bytes too, so the fuzzer can vary them.
    let payloads: Vec<_> = out
        .iter()
        .filter_map(|(_, name, token)| {
            let payload = key.open(std::str::from_utf8(token).ok()?).ok()?;
            Some(("continuation", name.replace("token", "payload"), payload))
        })
        .collect();
    out.extend(payloads);
    out.push((
        "continuation",
        "sealed-empty".into(),
        key.seal(b"").into_bytes(),
    ));
    out.push((
        "continuation",
        "sealed-text".into(),
        key.seal(b"not a cursor").into_bytes(),
    ));
    let grants = [
        (
            "db-read",
            KeySlot::Primary,
            None,
            None,
            false,
            NOW + 3_600_000,
        ),
        (
            "coll-write",
            KeySlot::Secondary,
            Some("c"),
            None,
            true,
            NOW + 60_000,
        ),
        (
            "partition-write",
            KeySlot::Primary,
            Some("c"),
            Some(PartitionKeyValue::String("ü/1".into())),
            true,
            NOW + 1,
        ),
        (
            "number-partition",
            KeySlot::Primary,
            Some("c"),
            Some(PartitionKeyValue::number(-2.5)),
            false,
            NOW + 1_000,
        ),
        ("expired", KeySlot::Primary, Some("c"), None, true, NOW),
    ];
    for (name, slot, collection, partition_key, write, expires_at) in grants {
        let token = ResourceToken {
            minted_by: slot,
            database: "fuzz".into(),
            database_uid: DatabaseUid(7),
            collection: collection.map(str::to_owned),
            collection_uid: collection.map(|_| CollectionUid(8)),
            partition_key,
            write,
            expires_at,
        };
        let text = token.mint(ACCOUNT_KEYS[slot_index(slot)]);
        out.push((
            "auth",
            format!("token-{name}"),
            format!("Bearer {text}").into_bytes(),
        ));
    }
    out
}
