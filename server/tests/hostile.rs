//! What a hostile or broken client can send, against the real binary: each case gets a precise
//! status and leaves the server serving.

mod support;

use mayfly_proto::v1::{CreateDatabaseRequest, QueryRequest, ReadDocumentRequest, ReadFeedRequest};
use tonic::{Code, Status, transport::Channel};
use tonic_types::StatusExt as _;

use support::{
    Mayfly, clients,
    raw::{length_delimited, raw_call},
};

async fn channel(server: &Mayfly) -> Channel {
    Channel::from_shared(server.url())
        .expect("valid uri")
        .connect()
        .await
        .expect("connects")
}

/// Regression: these returned INTERNAL, the code the README reserves for storage failures.
#[tokio::test]
async fn undecodable_requests_are_invalid_argument_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Mayfly::start(dir.path(), &["--storage", "memory"]);
    let channel = channel(&server).await;
    const READ: &str = "/mayfly.v1.Documents/ReadDocument";

    // `database` (field 1, a string) holding bytes that are not UTF-8.
    let bad_utf8 = length_delimited(1, &[0xff, 0xfe, b'x']);
    // A varint of eleven continuation bytes (field 5 of wire type 0): no varint is that long.
    let mut bad_varint = vec![5 << 3];
    bad_varint.extend_from_slice(&[0xff; 11]);
    // partition_key.value nested 100,000 lists deep (ListValue.values inside Value.list_value),
    // built from the inside out.
    let mut nested = Vec::new();
    for _ in 0..100_000 {
        nested = length_delimited(6, &length_delimited(1, &nested));
    }
    let mut deep_key = [
        length_delimited(1, b"d"),
        length_delimited(2, b"c"),
        length_delimited(3, b"x"),
    ]
    .concat();
    deep_key.extend(length_delimited(4, &length_delimited(1, &nested)));
    // A partition key string that is not UTF-8.
    let bad_utf8_key = length_delimited(4, &length_delimited(1, &length_delimited(3, &[0xff])));

    for (what, body, field) in [
        ("invalid UTF-8", bad_utf8, "ReadDocumentRequest.database"),
        ("a bad varint", bad_varint, ""),
        (
            "a partition key that is not UTF-8",
            bad_utf8_key,
            "ReadDocumentRequest.partition_key",
        ),
    ] {
        let status = raw_call(&channel, READ, body).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert_eq!(
            status
                .get_error_details()
                .error_info()
                .map(|i| i.reason.as_str()),
            Some("UNDECODABLE_MESSAGE"),
            "{what}"
        );
        assert!(
            status.message().contains("does not decode") && status.message().contains(field),
            "{what}: {}",
            status.message()
        );
    }

    // Decoded without descending past the depth limit every JSON field has (the stack is
    // never at risk), and refused as too deep, naming the field.
    let status = raw_call(&channel, READ, deep_key)
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status
            .get_error_details()
            .error_info()
            .map(|i| i.reason.as_str()),
        Some("DOCUMENT_TOO_DEEP"),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("partition_key"),
        "{}",
        status.message()
    );

    // Still serving.
    let mut c = clients::connect(&server).await;
    c.databases
        .create_database(CreateDatabaseRequest {
            id: "d".into(),
            ..Default::default()
        })
        .await
        .expect("serves after bad requests");
}

/// Regression: a 10,000-character id made trailers of 24 KB, which gRPC-core clients (Python,
/// C#, ...) receive as RESOURCE_EXHAUSTED instead of the real status.
#[tokio::test]
async fn errors_quoting_long_input_fit_in_small_trailers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Mayfly::start(dir.path(), &["--storage", "memory"]);
    let mut c = clients::connect(&server).await;
    clients::seeded(&mut c, 0, 0).await;
    let read = |id: String, pk: String, collection: &str| ReadDocumentRequest {
        database: "d".into(),
        collection: collection.into(),
        id,
        partition_key: Some(clients::string_pk(&pk)),
    };
    let long = "\u{00e9}".repeat(10_000);
    let longest_key = "k".repeat(mayfly_server::model::MAX_PARTITION_KEY_BYTES);
    for (request, code) in [
        (read(long.clone(), "p".into(), "c"), Code::InvalidArgument),
        (
            read("x".repeat(255), longest_key.clone(), "c"),
            Code::NotFound,
        ),
        (read("x".into(), "p".into(), &long), Code::InvalidArgument),
        (read("x".into(), long.clone(), "c"), Code::InvalidArgument),
    ] {
        let status = c.documents.read_document(request).await.expect_err("fails");
        assert_eq!(status.code(), code, "{}", status.message());
        // What travels in the trailers: the message, percent-encoded, and the details.
        let trailers = status.message().len() * 3 + status.details().len() * 4 / 3;
        assert!(
            trailers < 4096,
            "{} bytes of trailers for: {}",
            trailers,
            status.message()
        );
    }
}

fn feed(page_size: u32, continuation: &str) -> ReadFeedRequest {
    ReadFeedRequest {
        database: "d".into(),
        collection: "c".into(),
        partition_key: None,
        page_size,
        continuation: continuation.into(),
    }
}

/// The first page of a feed: its ids and its continuation.
async fn first_page(
    c: &mut clients::Clients,
    request: ReadFeedRequest,
) -> Result<(Vec<String>, String), Status> {
    let mut pages = c.documents.read_feed(request).await?.into_inner();
    let page = pages.message().await?.expect("a page");
    Ok((
        page.documents.into_iter().map(|d| d.id).collect(),
        page.continuation,
    ))
}

fn assert_invalid_continuation(status: &Status, what: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    let info = status.get_error_details();
    assert_eq!(
        info.error_info().map(|i| i.reason.as_str()),
        Some("INVALID_CONTINUATION"),
        "{what}: {}",
        status.message()
    );
}

/// Regression: tokens carried no integrity check, and about 9 in 120 single-byte changes still
/// parsed and resumed the feed somewhere else.
#[tokio::test]
async fn altered_continuation_tokens_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Mayfly::start(dir.path(), &["--storage", "memory"]);
    let mut c = clients::connect(&server).await;
    clients::seeded(&mut c, 30, 0).await;
    let (_, token) = first_page(&mut c, feed(10, "")).await.expect("first page");
    let mut query_pages = c
        .documents
        .query(QueryRequest {
            database: "d".into(),
            collection: "c".into(),
            query: "SELECT * FROM c WHERE c.n >= 0".into(),
            page_size: 10,
            ..Default::default()
        })
        .await
        .expect("query")
        .into_inner();
    let query_token = query_pages
        .message()
        .await
        .expect("a page")
        .expect("a page")
        .continuation;
    assert!(!token.is_empty() && !query_token.is_empty());
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut tried = 0;
    for (which, original) in [("feed", &token), ("query", &query_token)] {
        for at in 0..original.len() {
            let mut altered = original.clone().into_bytes();
            // Another character of the token's alphabet: still valid base64.
            let i = ALPHABET
                .iter()
                .position(|&b| b == altered[at])
                .expect("base64");
            altered[at] = ALPHABET[(i + 17) % ALPHABET.len()];
            let altered = String::from_utf8(altered).expect("ascii");
            let status = if which == "feed" {
                first_page(&mut c, feed(10, &altered))
                    .await
                    .expect_err("refused")
            } else {
                let mut pages = match c
                    .documents
                    .query(QueryRequest {
                        database: "d".into(),
                        collection: "c".into(),
                        query: "SELECT * FROM c WHERE c.n >= 0".into(),
                        page_size: 10,
                        continuation: altered.clone(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(pages) => pages.into_inner(),
                    Err(status) => {
                        assert_invalid_continuation(&status, &altered);
                        continue;
                    }
                };
                pages.message().await.expect_err("refused")
            };
            assert_invalid_continuation(&status, &format!("{which} token, character {at}"));
            tried += 1;
        }
    }
    assert!(tried > 60, "{tried} tokens tried");
    // The untouched token still resumes.
    let (ids, _) = first_page(&mut c, feed(10, &token)).await.expect("resumes");
    assert_eq!(ids.len(), 10);
}

/// Tokens are sealed with the data directory's secret: a client paging through a feed goes on
/// after the server restarts.
#[tokio::test]
async fn continuation_tokens_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Mayfly::start(dir.path(), &[]);
    let mut c = clients::connect(&server).await;
    clients::seeded(&mut c, 25, 0).await;
    let (first, token) = first_page(&mut c, feed(10, "")).await.expect("first page");
    drop(c);
    assert!(server.terminate().success());
    let server = Mayfly::start(dir.path(), &[]);
    let mut c = clients::connect(&server).await;
    let (second, _) = first_page(&mut c, feed(10, &token))
        .await
        .expect("resumes after a restart");
    assert_eq!(second.len(), 10);
    assert!(
        second.iter().all(|id| !first.contains(id)),
        "{first:?} then {second:?}"
    );
}
