//! The client SDK's behaviour end to end (issue 11): timeouts, connect errors, reasons,
//! `create_*_if_not_exists`, `Item<T>`, `DocumentTtl::Keep`, `update`, typed streams, and the
//! one table of outcomes, patch and transactional batch. Each test runs its own server on
//! 127.0.0.1:0.

#[path = "support/embedded.rs"]
mod embedded;

use embedded::start;

use std::{
    io,
    sync::Arc,
    time::{Duration, Instant},
};

use mayfly_client::StreamExt as _;
use mayfly_client::{
    BatchResult, Client, Collection, DefaultTtl, DeleteOutcome, DocumentTtl, Ensured, Error,
    Lifetime, PartitionKey, PatchOps, PatchOutcome, Reason, ReplaceOutcome, TouchOutcome,
    UpdateOutcome,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[path = "support/cluster.rs"]
mod cluster;

/// The cases above, through one node of a three-node cluster: most partitions they write and
/// read are served by the other two. Each runs as on a fresh server (the cluster's databases
/// deleted before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_pass_through_a_node_of_a_three_node_cluster() {
    let (mut cluster, client) = cluster::three_nodes().await;
    cluster::delete_every_database(&client).await;
    every_server_error_carries_its_reason_on(&client).await;
    cluster::delete_every_database(&client).await;
    page_size_zero_is_refused_before_sending_on(&client).await;
    cluster::delete_every_database(&client).await;
    create_if_not_exists_creates_then_finds_on(&client).await;
    cluster::delete_every_database(&client).await;
    items_carry_value_and_system_properties_in_one_read_on(&client).await;
    cluster::delete_every_database(&client).await;
    keep_keeps_a_documents_own_ttl_across_writes_on(&client).await;
    cluster::delete_every_database(&client).await;
    twenty_tasks_incrementing_through_update_count_to_200_on(&client).await;
    cluster::delete_every_database(&client).await;
    a_missing_document_is_an_outcome_for_every_verb_on(&client).await;
    cluster::delete_every_database(&client).await;
    feeds_and_queries_stream_typed_values_on(&client).await;
    cluster::delete_every_database(&client).await;
    twenty_tasks_incrementing_through_patch_count_to_200_without_conflicts_on(&client).await;
    cluster::delete_every_database(&client).await;
    a_batch_whose_57th_of_100_operations_fails_changes_nothing_on(&client).await;
    cluster::delete_every_database(&client).await;
    batch_and_patch_mistakes_are_refused_naming_the_rule_on(&client).await;
    cluster::delete_every_database(&client).await;
    every_answer_says_what_it_cost_on(&client).await;
    cluster::delete_every_database(&client).await;
    throughput_is_read_and_replaced_on(&client).await;
    cluster::delete_every_database(&client).await;
    the_client_routes_to_each_partitions_owner(&mut cluster, &client).await;
}

/// The client sends each request that names its partition key to the partition's owner, by
/// the map it fetched: with the node it was given stopped, it still reads, patches and writes
/// in batches the partitions the other nodes own, while a client that does not route (the
/// same requests through the stopped node) cannot.
async fn the_client_routes_to_each_partitions_owner(
    cluster: &mut cluster::Cluster,
    client: &Client,
) {
    let docs = collection(client, DefaultTtl::Off).await;
    let keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    for k in &keys {
        docs.create(&json!({"id": k, "pk": k, "n": 0}))
            .await
            .expect("create");
    }
    let plain = Client::builder(&cluster.addr)
        .route_to_owners(false)
        .retry(mayfly_client::RetryPolicy::none())
        .connect()
        .await
        .expect("connects");
    // The map, as the client fetches it in the background after its first routed request.
    let map = mayfly_proto::v1::client::AdminClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addr))
            .expect("uri")
            .connect_lazy(),
    )
    .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
    .await
    .expect("map")
    .into_inner();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let elsewhere: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let p = mayfly_server::engine::xxh3_partition(
                "db",
                docs.id(),
                &mayfly_server::model::PartitionKeyValue::String(k.as_str().into()),
                map.partitions as usize,
            );
            map.owners[p].owner != map.node
        })
        .collect();
    assert!(
        elsewhere.len() >= 8,
        "{} of 24 keys elsewhere",
        elsewhere.len()
    );
    cluster.stop_first().await;
    let plain_docs = plain.database("db").collection(docs.id());
    for k in &elsewhere {
        let read = docs.read(k, k.as_str()).await.expect("read from the owner");
        assert_eq!(read.expect("present").id(), k.as_str());
        let patched = docs
            .patch(k, k.as_str())
            .incr("/n", 1)
            .await
            .expect("patch at the owner");
        assert!(matches!(patched, PatchOutcome::Patched(_)), "{patched:?}");
        docs.batch(k.as_str())
            .upsert(&json!({"id": format!("{k}-b"), "pk": k}))
            .await
            .expect("batch at the owner");
        assert!(
            plain_docs.read(k, k.as_str()).await.is_err(),
            "the stopped node does not answer"
        );
    }
}

async fn collection(client: &Client, ttl: DefaultTtl) -> Collection {
    let db = client
        .create_database_if_not_exists("db")
        .await
        .expect("db")
        .into_inner();
    let name = format!("c{}", db.list_collections().await.expect("list").len());
    db.create_collection(&name, "/pk")
        .default_ttl(ttl)
        .await
        .expect("collection")
}

/// A port nothing listens on: bound, then let go.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    listener.local_addr().expect("address").port()
}

#[tokio::test]
async fn a_server_that_accepts_and_never_answers_times_out() {
    // Accepts connections and holds them, reading and writing nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address").to_string();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let limit = Duration::from_millis(300);
    for lazy in [true, false] {
        let builder = Client::builder(&address)
            .request_timeout(limit)
            .connect_timeout(Duration::from_millis(500));
        let client = if lazy {
            builder.connect_lazy().expect("nothing dialed yet")
        } else {
            match builder.connect().await {
                Ok(client) => client,
                // No HTTP/2 answer within the connect timeout: as good a failure.
                Err(e) => {
                    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
                    continue;
                }
            }
        };
        let began = Instant::now();
        let e = client.list_databases().await.expect_err("nobody answers");
        let took = began.elapsed();
        assert!(matches!(e, Error::Timeout(_)), "{e:?}");
        assert!(!e.is_retryable(), "a timeout is the caller's to judge");
        assert!(took >= limit, "{took:?}");
        assert!(
            took < Duration::from_secs(2),
            "within the timeout: {took:?}"
        );
        eprintln!("lazy={lazy}: {e} after {took:?}");
    }
    // Over TLS the handshake itself never completes: the connect timeout covers it.
    let began = Instant::now();
    let e = Client::builder(&address)
        .tls(mayfly_client::Tls::system_roots())
        .connect_timeout(limit)
        .connect()
        .await
        .expect_err("no TLS handshake");
    let took = began.elapsed();
    assert!(
        matches!(&e, Error::Connect { source, .. } if source.kind() == io::ErrorKind::TimedOut),
        "{e:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "within the connect timeout: {took:?}"
    );
    eprintln!("tls: {e} after {took:?}");
    holder.abort();
}

/// A write whose connection breaks after the server received it is not sent again, and the
/// error says its outcome is unknown.
#[tokio::test]
async fn a_write_cut_off_mid_request_is_not_sent_twice() {
    // Accepts, reads the request, then closes the connection: the write "reached" the server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address").to_string();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let cutter = tokio::spawn(async move {
        use tokio::io::AsyncReadExt as _;
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = vec![0; 65_536];
            let _ = socket.read(&mut buf).await;
            drop(socket);
        }
    });
    let client = Client::builder(&address)
        .request_timeout(Duration::from_secs(5))
        .connect_lazy()
        .expect("lazy");
    let c = client.database("db").collection("c");
    let e = c
        .patch("counter", "p")
        .incr("/n", 1)
        .await
        .expect_err("cut off");
    eprintln!("{e}");
    let Error::Unavailable(details) = &e else {
        panic!("{e:?}");
    };
    assert_eq!(details.reason(), Some(&Reason::OutcomeUnknown), "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains(&address), "names the server: {e}");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one connection, one try: {e}"
    );
    cutter.abort();
}

#[tokio::test]
async fn a_refused_port_names_the_address_and_the_cause() {
    let address = format!("127.0.0.1:{}", closed_port());
    for lazy in [false, true] {
        let e = if lazy {
            let client = Client::builder(&address)
                .connect_lazy()
                .expect("nothing dialed yet");
            client.list_databases().await.expect_err("refused")
        } else {
            Client::connect(&address).await.expect_err("refused")
        };
        let Error::Connect {
            address: named,
            source,
        } = &e
        else {
            panic!("not Connect: {e:?}")
        };
        assert_eq!(named, &address);
        assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused, "{source}");
        let cause = std::error::Error::source(&e).expect("a source");
        assert!(
            cause.to_string().to_lowercase().contains("refused"),
            "{cause}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot connect to {address}: ")),
            "{text}"
        );
        assert!(e.is_retryable());
        eprintln!("{text}");
    }
}

#[tokio::test]
async fn a_bad_port_and_a_stopped_server_are_connect_errors_too() {
    let e = Client::connect("127.0.0.1:99999")
        .await
        .expect_err("no such port");
    match &e {
        // Whether the port is refused as it parses or when dialed, the error says where
        // and why.
        Error::Connect { address, source } => {
            assert_eq!(address, "127.0.0.1:99999");
            assert!(!source.to_string().is_empty());
        }
        other => panic!("not Connect: {other:?}"),
    }
    assert!(std::error::Error::source(&e).is_some());
    eprintln!("{e}");

    let (server, client) = start().await;
    let address = server.local_addr().to_string();
    client.list_databases().await.expect("served");
    server.shutdown().await.expect("stops");
    let e = client.list_databases().await.expect_err("stopped");
    match &e {
        Error::Connect { address: named, .. } => assert_eq!(named, &address),
        other => panic!("not Connect: {other:?}"),
    }
    assert!(e.to_string().contains(&address), "{e}");
    eprintln!("{e}");
}

#[tokio::test]
async fn https_without_tls_configured_is_refused() {
    let e = Client::connect("https://127.0.0.1:1")
        .await
        .expect_err("no TLS configured");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.message().contains(".tls("), "{e}");
    let lazy = Client::builder("https://127.0.0.1:1")
        .connect_lazy()
        .expect_err("no TLS configured");
    assert!(matches!(lazy, Error::InvalidArgument(_)), "{lazy:?}");
}

#[tokio::test]
async fn every_server_error_carries_its_reason() {
    let (_server, client) = start().await;
    every_server_error_carries_its_reason_on(&client).await;
}

async fn every_server_error_carries_its_reason_on(client: &Client) {
    client.create_database("db").await.expect("db");
    let db_exists = client.create_database("db").await.expect_err("exists");
    assert!(matches!(db_exists, Error::Conflict(_)));
    assert_eq!(db_exists.reason(), Some(&Reason::DatabaseExists));
    let c = collection(client, DefaultTtl::NoDefault).await;
    c.create(&json!({"id": "a", "pk": "p"})).await.expect("new");
    let doc_exists = c
        .create(&json!({"id": "a", "pk": "p"}))
        .await
        .expect_err("exists");
    assert!(matches!(doc_exists, Error::Conflict(_)));
    assert_eq!(doc_exists.reason(), Some(&Reason::DocumentExists));
    assert!(
        doc_exists.to_string().ends_with("(DOCUMENT_EXISTS)"),
        "{doc_exists}"
    );

    let bad_ttl = c
        .create(&json!({"id": "b", "pk": "p", "ttl": 0}))
        .await
        .expect_err("ttl 0");
    assert_eq!(bad_ttl.reason(), Some(&Reason::InvalidTtl));
    let mismatch = c
        .create(&json!({"id": "b", "pk": "p"}))
        .partition_key("q")
        .await
        .expect_err("wrong key");
    assert_eq!(mismatch.reason(), Some(&Reason::PartitionKeyMismatch));
    assert!(matches!(
        (&bad_ttl, &mismatch),
        (Error::InvalidArgument(_), Error::InvalidArgument(_))
    ));
    let stale = c
        .replace("a", "p", &json!({"id": "a", "pk": "p"}))
        .if_match("\"stale\"")
        .await
        .expect_err("stale");
    assert_eq!(stale.reason(), Some(&Reason::EtagMismatch));
    let missing = client
        .database("nope")
        .collection("c")
        .read("a", "p")
        .await
        .expect_err("no database");
    assert_eq!(missing.reason(), Some(&Reason::DatabaseNotFound));
    assert_eq!(
        missing.details().map(|d| d.code()),
        Some(mayfly_client::StatusCode::NotFound)
    );
    for e in [&db_exists, &doc_exists, &bad_ttl, &stale, &missing] {
        assert!(!e.is_retryable(), "{e}");
        assert_eq!(e.operation_index(), None);
    }
}

#[tokio::test]
async fn page_size_zero_is_refused_before_sending() {
    let (_server, client) = start().await;
    page_size_zero_is_refused_before_sending_on(&client).await;
}

async fn page_size_zero_is_refused_before_sending_on(client: &Client) {
    let c = collection(client, DefaultTtl::Off).await;
    for size in [0, 1001] {
        let feed = c.read_feed().page_size(size).await.expect_err("refused");
        assert_eq!(feed.reason(), Some(&Reason::InvalidPageSize), "{feed}");
        let query = c
            .query::<serde_json::Value>("SELECT * FROM c")
            .page_size(size)
            .await
            .expect_err("refused");
        assert!(matches!(query, Error::InvalidArgument(_)), "{query:?}");
        assert_eq!(query.reason(), Some(&Reason::InvalidPageSize));
    }
    c.read_feed().page_size(1).await.expect("1 is fine");
    c.read_feed().page_size(1000).await.expect("1000 is fine");
}

#[tokio::test]
async fn create_if_not_exists_creates_then_finds() {
    let (_server, client) = start().await;
    create_if_not_exists_creates_then_finds_on(&client).await;
}

async fn create_if_not_exists_creates_then_finds_on(client: &Client) {
    let db = client
        .create_database_if_not_exists("app")
        .await
        .expect("db");
    assert!(matches!(db, Ensured::Created(_)));
    let db = client
        .create_database_if_not_exists("app")
        .await
        .expect("db");
    assert!(matches!(db, Ensured::Existing(_, ())));
    let db = db.into_inner();

    let ttl = DefaultTtl::After(Duration::from_secs(1800));
    let first = db
        .create_collection_if_not_exists("sessions", "/user")
        .default_ttl(ttl)
        .await
        .expect("created");
    assert!(first.is_created());
    // Other settings on an existing collection are reported, not applied.
    let second = db
        .create_collection_if_not_exists("sessions", "/user")
        .default_ttl(DefaultTtl::Off)
        .await
        .expect("found");
    let Ensured::Existing(sessions, settings) = second else {
        panic!("exists")
    };
    assert_eq!(settings.default_ttl, ttl);
    assert_eq!(settings.partition_key_path, "/user");
    assert_eq!(sessions.info().await.expect("info").default_ttl, ttl);

    let e = db
        .create_collection_if_not_exists("sessions", "/tenant")
        .await
        .expect_err("another partition key path");
    assert!(matches!(e, Error::Conflict(_)), "{e:?}");
    assert_eq!(e.reason(), Some(&Reason::CollectionExists));
    assert!(
        e.message().contains("'/user'") && e.message().contains("'/tenant'"),
        "{e}"
    );

    let e = client
        .database("nope")
        .create_collection_if_not_exists("c", "/k")
        .await
        .expect_err("no database");
    assert!(matches!(e, Error::DatabaseNotFound(_)), "{e:?}");
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Counter {
    id: String,
    pk: String,
    n: u64,
}

#[tokio::test]
async fn items_carry_value_and_system_properties_in_one_read() {
    let (_server, client) = start().await;
    items_carry_value_and_system_properties_in_one_read_on(&client).await;
}

async fn items_carry_value_and_system_properties_in_one_read_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let counter = Counter {
        id: "a".into(),
        pk: "p".into(),
        n: 7,
    };
    let written = c
        .create(&counter)
        .ttl(DocumentTtl::After(Duration::from_secs(60)))
        .await
        .expect("create");
    let item = c
        .read_item::<Counter>("a", "p")
        .await
        .expect("read")
        .expect("there");
    assert_eq!(item.value(), &counter);
    assert_eq!(item.id(), "a");
    assert_eq!(item.partition_key(), &PartitionKey::from("p"));
    assert_eq!(item.etag(), written.etag());
    assert_eq!(item.ts(), written.ts());
    assert_eq!(item.modified_at(), written.modified_at());
    assert_eq!(item.ttl(), DocumentTtl::After(Duration::from_secs(60)));
    assert_eq!(
        item.expires_at(),
        Some(item.modified_at() + Duration::from_secs(60))
    );
    let Lifetime::Remaining(left) = item.lifetime() else {
        panic!("expires")
    };
    assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(50));
    assert_eq!(item.clone().into_value(), counter);

    let typed = written.into_item::<Counter>().expect("typed write");
    assert_eq!(typed.etag(), item.etag());

    c.create(&json!({"id": "forever", "pk": "p"}))
        .await
        .expect("create");
    let forever = c
        .read_item::<serde_json::Value>("forever", "p")
        .await
        .expect("read")
        .expect("there");
    assert_eq!(forever.lifetime(), Lifetime::Never);
    assert_eq!(forever.ttl(), DocumentTtl::Inherit);
    assert!(
        c.read_item::<Counter>("b", "p")
            .await
            .expect("read")
            .is_none()
    );
}

#[tokio::test]
async fn keep_keeps_a_documents_own_ttl_across_writes() {
    let (_server, client) = start().await;
    keep_keeps_a_documents_own_ttl_across_writes_on(&client).await;
}

async fn keep_keeps_a_documents_own_ttl_across_writes_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let sixty = DocumentTtl::After(Duration::from_secs(60));
    let v1 = c
        .create(&json!({"id": "a", "pk": "p", "n": 1}))
        .ttl(sixty)
        .await
        .expect("create");

    let kept = c
        .replace("a", "p", &json!({"id": "a", "pk": "p", "n": 2}))
        .ttl(DocumentTtl::Keep)
        .await
        .expect("replace")
        .into_document()
        .expect("there");
    assert_eq!(kept.ttl(), sixty);
    assert_eq!(kept.body()["n"], 2);

    // Keep with a stale etag is refused like any stale write.
    let stale = c
        .replace("a", "p", &json!({"id": "a", "pk": "p", "n": 3}))
        .ttl(DocumentTtl::Keep)
        .if_match(v1.etag())
        .await
        .expect_err("stale");
    assert_eq!(stale.reason(), Some(&Reason::EtagMismatch));

    // update keeps it too, unless the closure sets another.
    let UpdateOutcome::Updated { item, .. } = c
        .update::<serde_json::Value, _>("a", "p", |doc| doc.value_mut()["n"] = json!(4))
        .await
        .expect("update")
    else {
        panic!("there")
    };
    assert_eq!(item.ttl(), sixty);
    assert_eq!(item.value()["n"], 4);
    let read = c.read("a", "p").await.expect("read").expect("there");
    assert_eq!(read.ttl(), sixty);
    assert!(read.remaining() <= Lifetime::Remaining(Duration::from_secs(60)));

    let UpdateOutcome::Updated { item, .. } = c
        .update::<serde_json::Value, _>("a", "p", |doc| doc.set_ttl(DocumentTtl::Never))
        .await
        .expect("update")
    else {
        panic!("there")
    };
    assert_eq!(item.ttl(), DocumentTtl::Never);

    // Without Keep a replace drops it (the pitfall), so Keep is what to use.
    let dropped = c
        .replace("a", "p", &json!({"id": "a", "pk": "p"}))
        .await
        .expect("replace")
        .into_document()
        .expect("there");
    assert_eq!(dropped.ttl(), DocumentTtl::Inherit);

    let e = c
        .create(&json!({"id": "b", "pk": "p"}))
        .ttl(DocumentTtl::Keep)
        .await
        .expect_err("nothing to keep");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(
        c.replace("gone", "p", &json!({"id": "gone", "pk": "p"}))
            .ttl(DocumentTtl::Keep)
            .await
            .expect("no error")
            == ReplaceOutcome::Missing
    );
}

#[tokio::test]
async fn twenty_tasks_incrementing_through_update_count_to_200() {
    let (_server, client) = start().await;
    twenty_tasks_incrementing_through_update_count_to_200_on(&client).await;
}

async fn twenty_tasks_incrementing_through_update_count_to_200_on(client: &Client) {
    let c = Arc::new(collection(client, DefaultTtl::NoDefault).await);
    c.create(&Counter {
        id: "hits".into(),
        pk: "p".into(),
        n: 0,
    })
    .ttl(DocumentTtl::After(Duration::from_secs(600)))
    .await
    .expect("create");
    let began = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..10 {
                    match c
                        .update::<Counter, _>("hits", "p", |counter| counter.value_mut().n += 1)
                        .await
                        .expect("update")
                    {
                        UpdateOutcome::Updated { conflicts: n, .. } => conflicts += n,
                        UpdateOutcome::Missing => panic!("the counter is there"),
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.expect("task");
    }
    eprintln!(
        "200 increments through update() in {:?}: {conflicts} conflicts retried ({:.2} per increment)",
        began.elapsed(),
        f64::from(conflicts) / 200.0
    );
    assert_counted_to_200(&c).await;
}

/// The counter `hits` is at 200, still with the TTL it was created with.
async fn assert_counted_to_200(c: &Collection) {
    let counter = c
        .read_item::<Counter>("hits", "p")
        .await
        .expect("read")
        .expect("there");
    assert_eq!(counter.value().n, 200, "no increment lost");
    assert_eq!(
        counter.ttl(),
        DocumentTtl::After(Duration::from_secs(600)),
        "TTL kept through 200 writes"
    );
}

#[tokio::test]
async fn a_missing_document_is_an_outcome_for_every_verb() {
    let (_server, client) = start().await;
    a_missing_document_is_an_outcome_for_every_verb_on(&client).await;
}

async fn a_missing_document_is_an_outcome_for_every_verb_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let body = json!({"id": "a", "pk": "p"});
    assert!(c.read("a", "p").await.expect("read").is_none());
    assert!(
        c.read_item::<serde_json::Value>("a", "p")
            .await
            .expect("read")
            .is_none()
    );
    assert_eq!(
        c.replace("a", "p", &body).await.expect("replace"),
        ReplaceOutcome::Missing
    );
    assert_eq!(
        c.touch("a", "p").await.expect("touch"),
        TouchOutcome::Missing
    );
    assert_eq!(
        c.delete_document("a", "p").await.expect("delete"),
        DeleteOutcome::Missing
    );
    assert!(matches!(
        c.update::<serde_json::Value, _>("a", "p", |_| ())
            .await
            .expect("update"),
        UpdateOutcome::Missing
    ));
    assert!(
        c.read("a", "p").await.expect("read").is_none(),
        "nothing written"
    );
}

#[tokio::test]
async fn feeds_and_queries_stream_typed_values() {
    let (_server, client) = start().await;
    feeds_and_queries_stream_typed_values_on(&client).await;
}

async fn feeds_and_queries_stream_typed_values_on(client: &Client) {
    let c = collection(client, DefaultTtl::Off).await;
    for n in 0..25 {
        c.create(&Counter {
            id: format!("c{n:02}"),
            pk: "p".into(),
            n,
        })
        .await
        .expect("create");
    }
    let mut items = c
        .read_feed()
        .page_size(4)
        .await
        .expect("feed")
        .into_stream::<Counter>();
    let mut seen = Vec::new();
    while let Some(item) = items.next().await {
        let item = item.expect("item");
        assert!(!item.etag().is_empty());
        seen.push(item.into_value().n);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..25).collect::<Vec<_>>());

    // A document of another shape is an error of its own; the stream goes on.
    c.create(&json!({"id": "odd", "pk": "p", "n": "not a number"}))
        .await
        .expect("create");
    let results: Vec<_> = c
        .read_feed()
        .page_size(7)
        .await
        .expect("feed")
        .into_stream::<Counter>()
        .collect()
        .await;
    assert_eq!(results.len(), 26);
    assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1);
    assert!(matches!(
        results.iter().find(|r| r.is_err()),
        Some(Err(Error::Serialization(_)))
    ));

    let mut big = c
        .query::<Counter>("SELECT * FROM c WHERE c.n >= @min ORDER BY c.n")
        .param("@min", 20)
        .page_size(2)
        .await
        .expect("query");
    let mut ns = Vec::new();
    while let Some(counter) = big.next().await {
        ns.push(counter.expect("counter").n);
    }
    assert_eq!(ns, [20, 21, 22, 23, 24]);
    let ids: Vec<String> = c
        .query::<String>("SELECT VALUE c.id FROM c WHERE c.n < 3")
        .await
        .expect("query")
        .map(|id| id.expect("id"))
        .collect()
        .await;
    assert_eq!(ids.len(), 3);
}

#[tokio::test]
async fn twenty_tasks_incrementing_through_patch_count_to_200_without_conflicts() {
    let (_server, client) = start().await;
    twenty_tasks_incrementing_through_patch_count_to_200_without_conflicts_on(&client).await;
}

async fn twenty_tasks_incrementing_through_patch_count_to_200_without_conflicts_on(
    client: &Client,
) {
    let c = Arc::new(collection(client, DefaultTtl::NoDefault).await);
    c.create(&json!({"id": "hits", "pk": "p", "n": 0}))
        .ttl(DocumentTtl::After(Duration::from_secs(600)))
        .await
        .expect("create");
    let began = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..10 {
                    // Any error, an etag conflict included, fails the test: there is none to
                    // retry.
                    match c.patch("hits", "p").incr("/n", 1).await.expect("patch") {
                        PatchOutcome::Patched(doc) => {
                            seen.push(doc.body()["n"].as_i64().expect("a number"))
                        }
                        other => panic!("the counter is there: {other:?}"),
                    }
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.expect("task"));
    }
    eprintln!(
        "200 increments through patch().incr() in {:?}, no conflicts",
        began.elapsed()
    );
    // Each increment applied on its own: every count from 1 to 200 was returned once.
    seen.sort_unstable();
    assert_eq!(seen, (1..=200).collect::<Vec<i64>>());
    assert_counted_to_200(&c).await;
}

#[tokio::test]
async fn a_batch_whose_57th_of_100_operations_fails_changes_nothing() {
    let (_server, client) = start().await;
    a_batch_whose_57th_of_100_operations_fails_changes_nothing_on(&client).await;
}

async fn a_batch_whose_57th_of_100_operations_fails_changes_nothing_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let before = c
        .create(&json!({"id": "summary", "pk": "p", "orders": 0}))
        .await
        .expect("create");
    let batch = |failing: bool| {
        let mut batch = c.batch("p");
        for i in 0..99 {
            batch = if i == 56 && failing {
                // An etag the summary does not have.
                batch
                    .patch("summary", PatchOps::new().incr("/orders", 1))
                    .if_match("00000000000000ff")
            } else if i == 56 {
                batch.patch("summary", PatchOps::new().incr("/orders", 1))
            } else {
                batch.create(&json!({"id": format!("o{i}"), "pk": "p"}))
            };
        }
        batch.read("summary")
    };
    let err = batch(true).await.expect_err("the 57th fails");
    assert!(matches!(err, Error::PreconditionFailed(_)), "{err:?}");
    assert_eq!(err.operation_index(), Some(56));
    assert_eq!(err.reason(), Some(&Reason::EtagMismatch));
    assert!(
        err.message().contains("batch operation 56 (patch)"),
        "{err}"
    );
    let summary = c.read("summary", "p").await.expect("read").expect("there");
    assert_eq!(summary.etag(), before.etag(), "untouched");
    for i in [0, 55, 57, 98] {
        assert!(
            c.read(&format!("o{i}"), "p").await.expect("read").is_none(),
            "o{i} was not created"
        );
    }

    let results = batch(false).await.expect("committed");
    assert_eq!(results.len(), 100);
    assert!(matches!(&results[0], BatchResult::Document(d) if d.id() == "o0"));
    let read = results[99].document().expect("read");
    assert_eq!(read.body()["orders"], 1);
    assert_eq!(
        Some(read),
        results[56].document(),
        "the read sees the patch"
    );
    assert!(c.read("o98", "p").await.expect("read").is_some());
}

#[tokio::test]
async fn batch_and_patch_mistakes_are_refused_naming_the_rule() {
    let (_server, client) = start().await;
    batch_and_patch_mistakes_are_refused_naming_the_rule_on(&client).await;
}

async fn batch_and_patch_mistakes_are_refused_naming_the_rule_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let misplaced = c
        .batch("p")
        .read("a")
        .ttl(DocumentTtl::Never)
        .await
        .expect_err("ttl on a read");
    assert_eq!(misplaced.reason(), Some(&Reason::InvalidBatch));
    let empty = c.batch("p").await.expect_err("empty");
    assert_eq!(empty.reason(), Some(&Reason::InvalidBatch));
    let too_many = (0..11).fold(c.patch("a", "p"), |p, i| p.incr(&format!("/n{i}"), 1));
    let refused = too_many.await.expect_err("11 operations");
    assert_eq!(refused.reason(), Some(&Reason::InvalidPatch));
}

#[tokio::test]
async fn throughput_is_read_and_replaced() {
    let (_server, client) = start().await;
    throughput_is_read_and_replaced_on(&client).await;
}

/// A database's shared throughput and a collection's own are read and replaced (in a
/// cluster, through its catalog log); a collection drawing on its database's has none of its
/// own to replace; the replaced budget holds the next requests, wherever their partition is.
async fn throughput_is_read_and_replaced_on(client: &Client) {
    use mayfly_client::{Throughput, ThroughputProperties};
    let db = client
        .create_database_with_throughput("tp", Throughput::Manual(1_000))
        .await
        .expect("db");
    let shared = db.create_collection("shared", "/pk").await.expect("shared");
    let own = db
        .create_collection("own", "/pk")
        .throughput(Throughput::Autoscale { max: 4_000 })
        .await
        .expect("own");
    assert_eq!(
        shared.read_throughput().await.expect("read"),
        ThroughputProperties {
            throughput: None,
            shared: true,
            provisioned: None
        }
    );
    assert_eq!(
        own.read_throughput().await.expect("read"),
        ThroughputProperties {
            throughput: Some(Throughput::Autoscale { max: 4_000 }),
            shared: false,
            provisioned: Some(400),
        },
        "idle autoscale provisions a tenth of its maximum"
    );
    let e = shared
        .replace_throughput(Throughput::Manual(400))
        .await
        .expect_err("no throughput of its own");
    assert_eq!(e.reason(), Some(&Reason::InvalidThroughput), "{e:?}");
    assert!(e.to_string().contains("collection \"shared\""), "{e}");
    assert!(shared.read_throughput().await.expect("read").shared);
    // A database made without shared throughput has none to replace.
    let plain = client.create_database("tp-plain").await.expect("db");
    let e = plain
        .replace_throughput(Throughput::Manual(400))
        .await
        .expect_err("none shared");
    assert_eq!(e.reason(), Some(&Reason::InvalidThroughput), "{e:?}");
    assert!(e.to_string().contains(": throughput: database"), "{e}");
    assert_eq!(
        plain.read_throughput().await.expect("read").throughput,
        None
    );
    let replaced = db
        .replace_throughput(Throughput::Manual(400))
        .await
        .expect("the database's");
    assert_eq!(
        (replaced.throughput, replaced.provisioned),
        (Some(Throughput::Manual(400)), Some(400))
    );
    assert_eq!(
        own.replace_throughput(Throughput::Manual(500))
            .await
            .expect("its own")
            .throughput,
        Some(Throughput::Manual(500))
    );
    assert_eq!(
        own.info().await.expect("info").throughput,
        Some(Throughput::Manual(500))
    );
    // The shared 400 RU/s holds the shared collection's writes, partitions of any node.
    let raw =
        client.with_retry(mayfly_client::RetryPolicy::none().throttle_retries(0, Duration::ZERO));
    let raw_shared = raw.database("tp").collection("shared");
    let mut refused = None;
    for i in 0..2_000 {
        let doc =
            json!({"id": format!("d{i}"), "pk": format!("p{}", i % 16), "blob": "x".repeat(2_000)});
        if let Err(e) = raw_shared.create(&doc).await {
            refused = Some(e);
            break;
        }
    }
    let e = refused.expect("400 RU/s spent within 2,000 writes of 2 KB");
    assert_eq!(e.reason(), Some(&Reason::RequestRateTooLarge), "{e:?}");
    assert!(e.to_string().contains("database tp"), "{e}");
}

#[tokio::test]
async fn every_answer_says_what_it_cost() {
    let (_server, client) = start().await;
    every_answer_says_what_it_cost_on(&client).await;
}

/// Request charges (README, "Request units"), through the client: every document answer,
/// page and error says what it cost; the same operation on the same data costs the same;
/// writes cost more with size and with indexed terms, a touch less than a rewrite; a request
/// refused before it reached the data costs nothing.
async fn every_answer_says_what_it_cost_on(client: &Client) {
    let c = collection(client, DefaultTtl::NoDefault).await;
    let small = |id: &str| json!({"id": id, "pk": "p", "n": 1, "s": "x"});
    let a = c.create(&small("a")).await.expect("create a");
    let b = c.create(&small("b")).await.expect("create b");
    assert_eq!(
        a.request_charge(),
        b.request_charge(),
        "same shape, same cost"
    );
    assert!(a.request_charge() > 4.0, "a write: {}", a.request_charge());
    let wide = c
        .create(&json!({"id": "w", "pk": "p", "n": 1, "s": "x", "m": 2, "t": "y", "u": [1, 2, 3]}))
        .await
        .expect("create wide");
    assert!(
        wide.request_charge() > a.request_charge(),
        "more indexed terms"
    );
    let big = c
        .create(&json!({"id": "big", "pk": "p", "n": 1, "s": "x".repeat(20_000)}))
        .await
        .expect("create big");
    assert!(
        big.request_charge() > a.request_charge() + 15.0,
        "20 KB more written"
    );

    let read = c.read("a", "p").await.expect("read").expect("alive");
    assert_eq!(read.request_charge(), 1.0, "a point read of under 1 KB");
    let read_big = c.read("big", "p").await.expect("read").expect("alive");
    assert!(read_big.request_charge() > 1.0 && read_big.request_charge() < 5.0);
    assert_eq!(
        c.read("big", "p")
            .await
            .expect("read")
            .expect("alive")
            .request_charge(),
        read_big.request_charge(),
        "the same read costs the same"
    );

    let touched = match c.touch("a", "p").await.expect("touch") {
        TouchOutcome::Touched(d) => d,
        TouchOutcome::Missing => panic!("a is alive"),
    };
    assert!(touched.request_charge() > 0.0 && touched.request_charge() < a.request_charge());
    let same = match c.replace("a", "p", &small("a")).await.expect("replace") {
        ReplaceOutcome::Replaced(d) => d,
        ReplaceOutcome::Missing => panic!("a is alive"),
    };
    assert!(
        same.request_charge() < a.request_charge(),
        "a replace writing the same terms writes none: {} vs {}",
        same.request_charge(),
        a.request_charge()
    );

    match c.create(&small("a")).await {
        Err(Error::Conflict(details)) => assert_eq!(details.request_charge(), 1.0, "a lookup"),
        other => panic!("{other:?}"),
    }
    match c.create(&json!({"id": "bad", "pk": "p", "ttl": 0})).await {
        Err(Error::InvalidArgument(details)) => assert_eq!(details.request_charge(), 0.0),
        other => panic!("{other:?}"),
    }

    let page = |q: &'static str| {
        let c = c.clone();
        async move {
            c.query::<serde_json::Value>(q)
                .await
                .expect("query")
                .next_page()
                .await
                .expect("page")
                .expect("a page")
        }
    };
    let all = page("SELECT * FROM c").await;
    assert_eq!(all.results.len(), 4);
    assert!(all.request_charge > 2.5, "{}", all.request_charge);
    assert_eq!(
        page("SELECT * FROM c").await.request_charge,
        all.request_charge
    );
    let one = page("SELECT * FROM c WHERE c.id = 'a'").await;
    assert!(
        one.request_charge < all.request_charge,
        "fewer documents read and returned"
    );

    let mut feed = c.read_feed().await.expect("feed");
    let first = feed.next_page().await.expect("page").expect("a page");
    assert!(first.request_charge > 2.5, "{}", first.request_charge);
}

/// Provisioned throughput (README, "Request units"): a collection created with 400 RU/s
/// admits its burst and then refuses `RESOURCE_EXHAUSTED` / `REQUEST_RATE_TOO_LARGE` with
/// the server's delay, charging nothing and changing nothing; an unlimited collection on the
/// same server is not held back; the client's default policy retries throttled writes after
/// the delay until they are all applied; throughput out of bounds is refused naming its field.
#[tokio::test]
async fn a_collection_is_held_to_its_provisioned_throughput() {
    let (server, client) = start().await;
    let db = client.create_database("db").await.expect("db");
    let limited = db
        .create_collection("limited", "/pk")
        .throughput(mayfly_client::Throughput::Manual(400))
        .await
        .expect("collection");
    let free = db
        .create_collection("free", "/pk")
        .await
        .expect("collection");
    assert_eq!(
        limited.info().await.expect("info").throughput,
        Some(mayfly_client::Throughput::Manual(400))
    );
    assert_eq!(free.info().await.expect("info").throughput, None);

    // A client that hands throttled requests back.
    let raw = Client::builder(server.local_addr().to_string())
        .retry(mayfly_client::RetryPolicy::none().throttle_retries(0, Duration::ZERO))
        .connect()
        .await
        .expect("client");
    let raw_db = raw.database("db");
    let (raw_limited, raw_free) = (raw_db.collection("limited"), raw_db.collection("free"));
    let doc = |id: String| json!({"id": id, "pk": "p", "n": 1});
    let mut refused = None;
    for i in 0..1_000 {
        match raw_limited.create(&doc(format!("d{i}"))).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = refused.expect("400 RU/s is spent within 1,000 writes sent back to back");
    assert!(i >= 10, "the burst (80 RU) admits a few writes first: {i}");
    let Error::ResourceExhausted(details) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(details.reason(), Some(&Reason::RequestRateTooLarge));
    let delay = details.retry_after().expect("a retry delay");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(1),
        "{delay:?}"
    );
    assert_eq!(details.request_charge(), 0.0);
    assert!(details.message().contains("400 request units per second"));
    assert!(
        limited
            .read(&format!("d{i}"), "p")
            .await
            .expect("read")
            .is_none(),
        "a throttled write changed nothing"
    );
    // A write that costs more than the credit left is applied and leaves a debt (about 500 RU
    // for 500 KB): what follows is refused until it is paid, queries and feeds included.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let big = json!({"id": "big", "pk": "p", "blob": "x".repeat(500_000)});
    let cost = raw_limited
        .create(&big)
        .await
        .expect("admitted with credit");
    assert!(cost.request_charge() > 400.0, "{}", cost.request_charge());
    for refused in [
        raw_limited
            .query::<serde_json::Value>("SELECT * FROM c")
            .await
            .map(|_| ()),
        raw_limited.read_feed().await.map(|_| ()),
    ] {
        match refused {
            Err(Error::ResourceExhausted(d)) => {
                assert_eq!(d.reason(), Some(&Reason::RequestRateTooLarge));
                assert!(
                    d.retry_after()
                        .is_some_and(|w| w > Duration::from_millis(500))
                );
            }
            other => panic!("a stream's first page is held to the budget too: {other:?}"),
        }
    }
    // The unlimited collection is not held back by the other's budget.
    for i in 0..50 {
        raw_free
            .create(&doc(format!("f{i}")))
            .await
            .expect("unlimited");
    }

    // The default policy waits out the throttling: every write is applied.
    for i in 0..60 {
        limited
            .create(&doc(format!("r{i}")))
            .await
            .expect("retried until admitted");
    }
    let mut results = limited
        .query::<serde_json::Value>("SELECT VALUE COUNT(1) FROM c WHERE STARTSWITH(c.id, 'r')")
        .await
        .expect("query");
    let page = results.next_page().await.expect("page").expect("a page");
    assert_eq!(page.results, [json!(60)]);
    // A feed over the collection pages on, paced by the budget: every document arrives.
    let mut feed = limited.read_feed().page_size(10).await.expect("feed");
    let mut read = 0;
    while let Some(page) = feed.next_page().await.expect("page") {
        read += page.documents.len();
    }
    assert_eq!(
        read,
        i + 1 + 60,
        "the writes before the refusal, the big one, the retried"
    );

    for (throughput, field) in [
        (mayfly_client::Throughput::Manual(450), "throughput.manual"),
        (mayfly_client::Throughput::Manual(0), "throughput.manual"),
        (
            mayfly_client::Throughput::Autoscale { max: 500 },
            "throughput.autoscale_max",
        ),
    ] {
        match db
            .create_collection("bad", "/pk")
            .throughput(throughput)
            .await
        {
            Err(Error::InvalidArgument(d)) => {
                assert_eq!(d.reason(), Some(&Reason::InvalidThroughput));
                assert!(d.message().contains(field), "{}", d.message());
            }
            other => panic!("{throughput:?}: {other:?}"),
        }
    }
}
