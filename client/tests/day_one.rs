//! The SDK frictions a new user's shopping-cart service ran into (issue 25, "Client SDK"),
//! end to end: system properties the same for reads, feeds and queries; deserialization
//! errors that name the document and the path; unused query parameters refused by name;
//! JSON pointers from user keys; integer partition keys; typed status codes; `MAYFLY_KEY`
//! named when unset; `StreamExt` from the client crate. Each test runs its own server on
//! 127.0.0.1:0.

#[path = "support/embedded.rs"]
mod embedded;

use embedded::start;

use std::{process::Command, time::Duration};

// The point: no `tokio_stream` import.
use mayfly_client::StreamExt as _;
use mayfly_client::{
    BatchResult, Client, Collection, CollectionSettings, DefaultTtl, DocumentTtl, Error, Item,
    MustLiveRule, PatchOps, PatchOutcome, Reason, StatusCode, UpdateOutcome, json_pointer,
};
use mayfly_server::RunningServer;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[path = "support/cluster.rs"]
mod cluster;

/// The cases above, through one node of a three-node cluster: most partitions they write and
/// read are served by the other two. Each runs as on a fresh server (the cluster's databases
/// deleted before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_pass_through_a_node_of_a_three_node_cluster() {
    let (_cluster, client) = cluster::three_nodes().await;
    cluster::delete_every_database(&client).await;
    reads_feeds_writes_and_queries_fill_system_properties_alike_on(&client).await;
    cluster::delete_every_database(&client).await;
    a_document_that_does_not_fit_its_type_is_named_with_the_path_on(&client).await;
    cluster::delete_every_database(&client).await;
    an_unused_query_parameter_is_refused_by_name_on(&client).await;
    cluster::delete_every_database(&client).await;
    json_pointers_from_user_keys_patch_the_right_property_on(&client).await;
    cluster::delete_every_database(&client).await;
    unsigned_and_32_bit_integers_are_partition_keys_on(&client).await;
    cluster::delete_every_database(&client).await;
    error_details_carry_the_typed_status_code_on(&client).await;
    cluster::delete_every_database(&client).await;
    feeds_and_queries_stream_with_the_clients_stream_ext_on(&client).await;
    cluster::delete_every_database(&client).await;
    keyed_writes_sent_again_apply_once_on(&client).await;
    cluster::delete_every_database(&client).await;
    must_live_rules_refuse_an_order_that_could_expire_on(&client).await;
}

async fn collection(client: &Client, partition_key_path: &str) -> Collection {
    client
        .create_database("shop")
        .await
        .expect("db")
        .create_collection("carts", partition_key_path)
        .default_ttl(DefaultTtl::NoDefault)
        .await
        .expect("collection")
}

/// A cart as the trial wrote it: its system properties as fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Cart {
    id: String,
    user: String,
    #[serde(default)]
    lines: Vec<Line>,
    // Sent back by writes too: the server drops system properties it is sent.
    #[serde(rename = "_ts", default)]
    ts: i64,
    #[serde(rename = "_etag", default)]
    etag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
}

fn cart(id: &str) -> Cart {
    Cart {
        id: id.into(),
        user: "ann".into(),
        lines: vec![Line {
            sku: "tea".into(),
            qty: 1,
        }],
        ts: 0,
        etag: String::new(),
        ttl: None,
    }
}

/// The fields of `item`'s value that hold system properties match the item's own.
fn assert_system_properties(item: &Item<Cart>, ttl: Option<i64>) {
    let value = item.value();
    assert!(value.ts > 1_700_000_000, "{value:?}");
    assert_eq!(value.ts, item.ts());
    assert_eq!(value.etag, item.etag());
    assert_eq!(value.ttl, ttl);
}

#[tokio::test]
async fn reads_feeds_writes_and_queries_fill_system_properties_alike() {
    let (_server, client) = start().await;
    reads_feeds_writes_and_queries_fill_system_properties_alike_on(&client).await;
}

async fn reads_feeds_writes_and_queries_fill_system_properties_alike_on(client: &Client) {
    let carts = collection(client, "/user").await;
    let created = carts
        .create(&cart("c1"))
        .ttl(DocumentTtl::After(Duration::from_secs(600)))
        .await
        .expect("create");

    // The typed read: `_ts` was 0 before, `_etag` empty.
    let read = carts
        .read_item::<Cart>("c1", "ann")
        .await
        .expect("read")
        .expect("there");
    assert_system_properties(&read, Some(600));
    assert_eq!(read.etag(), created.etag());

    // The query's `SELECT *`, the reference.
    let queried = carts
        .query::<Cart>("SELECT * FROM c")
        .await
        .expect("query")
        .collect_all()
        .await
        .expect("results");
    assert_eq!(queried, [read.value().clone()]);
    // As JSON, the typed read and `SELECT *` are the same document, property for property.
    let as_json = carts
        .read_item::<Value>("c1", "ann")
        .await
        .expect("read")
        .expect("there")
        .into_value();
    let select_star = carts
        .query::<Value>("SELECT * FROM c")
        .await
        .expect("query")
        .collect_all()
        .await
        .expect("results");
    assert_eq!(select_star, std::slice::from_ref(&as_json));
    assert_eq!(
        carts.get::<Value>("c1", "ann").await.expect("get"),
        Some(as_json)
    );

    // Every other way to a typed document agrees.
    assert_eq!(
        carts.get::<Cart>("c1", "ann").await.expect("get").as_ref(),
        Some(read.value())
    );
    let fed: Vec<Item<Cart>> = carts
        .read_feed()
        .await
        .expect("feed")
        .into_stream::<Cart>()
        .collect::<Result<_, _>>()
        .await
        .expect("typed feed");
    assert_eq!(fed.len(), 1);
    assert_system_properties(&fed[0], Some(600));
    assert_system_properties(&created.into_item().expect("typed"), Some(600));

    let patched = match carts
        .patch("c1", "ann")
        .set("/note", "gift")
        .await
        .expect("patch")
    {
        PatchOutcome::Patched(doc) => doc.into_item::<Cart>().expect("typed"),
        other => panic!("there: {other:?}"),
    };
    assert_system_properties(&patched, Some(600));
    assert_ne!(patched.value().etag, read.value().etag, "a new version");

    // A read-modify-write sends the fields back (the server drops system properties) and
    // sees the new ones.
    let UpdateOutcome::Updated { item: updated, .. } = carts
        .update::<Cart, _>("c1", "ann", |item| item.value_mut().lines[0].qty += 1)
        .await
        .expect("update")
    else {
        panic!("there")
    };
    assert_system_properties(&updated, Some(600));
    assert_eq!(updated.value().lines[0].qty, 2);

    let results = carts.batch("ann").read("c1").await.expect("batch read");
    let Some(BatchResult::Document(doc)) = results.into_iter().next() else {
        panic!("one read")
    };
    let in_batch = doc.into_item::<Cart>().expect("typed");
    assert_system_properties(&in_batch, Some(600));
    assert_eq!(in_batch.value(), updated.value());
}

#[tokio::test]
async fn a_document_that_does_not_fit_its_type_is_named_with_the_path() {
    let (_server, client) = start().await;
    a_document_that_does_not_fit_its_type_is_named_with_the_path_on(&client).await;
}

async fn a_document_that_does_not_fit_its_type_is_named_with_the_path_on(client: &Client) {
    let carts = collection(client, "/user").await;
    carts
        .create(&json!({"id": "c1", "user": "ann", "lines": [
            {"sku": "tea", "qty": 1},
            {"sku": "cup", "qty": "two"},
        ]}))
        .await
        .expect("create");

    let expected = r#"at lines[1].qty: invalid type: string "two", expected u32"#;
    let err = carts
        .read_item::<Cart>("c1", "ann")
        .await
        .expect_err("qty is not a number");
    let Error::Serialization(message) = &err else {
        panic!("{err:?}")
    };
    assert!(
        message.starts_with(r#"document 'c1' (partition key "ann") does not deserialize as "#),
        "{message}"
    );
    assert!(message.ends_with(expected), "{message}");
    assert!(err.to_string().contains(expected), "{err}");

    let err = carts
        .get::<Cart>("c1", "ann")
        .await
        .expect_err("qty is not a number");
    assert!(err.to_string().contains("document 'c1'"), "{err}");
    assert!(err.to_string().contains(expected), "{err}");

    let from_feed = carts
        .read_feed()
        .await
        .expect("feed")
        .into_stream::<Cart>()
        .next()
        .await
        .expect("one document")
        .expect_err("qty is not a number");
    assert!(
        from_feed.to_string().contains("document 'c1'"),
        "{from_feed}"
    );
    assert!(from_feed.to_string().contains(expected), "{from_feed}");

    let from_query = carts
        .query::<Cart>("SELECT * FROM c")
        .await
        .expect("query")
        .next()
        .await
        .expect("one result")
        .expect_err("qty is not a number");
    assert!(
        from_query.to_string().contains("query result 'c1'"),
        "{from_query}"
    );
    assert!(from_query.to_string().contains(expected), "{from_query}");
}

#[tokio::test]
async fn an_unused_query_parameter_is_refused_by_name() {
    let (_server, client) = start().await;
    an_unused_query_parameter_is_refused_by_name_on(&client).await;
}

async fn an_unused_query_parameter_is_refused_by_name_on(client: &Client) {
    let carts = collection(client, "/user").await;
    carts.create(&cart("c1")).await.expect("create");

    // A typo, and a name without its '@': each refused, named, before anything is read.
    for (name, said) in [
        (
            "@usr",
            "query: parameter '@usr' is not used by the query (parameters are named with '@', as in @status)",
        ),
        (
            "user",
            "query: query parameter name 'user' must be '@' followed by letters, digits or '_'",
        ),
    ] {
        let refused = carts
            .query::<Cart>("SELECT * FROM c WHERE c.user = @user")
            .param("@user", "ann")
            .param(name, "ann")
            .await;
        let err = match refused {
            Ok(mut results) => results
                .next_page()
                .await
                .expect_err("refused with the first page"),
            Err(e) => e,
        };
        let Error::InvalidArgument(details) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(details.code(), StatusCode::InvalidArgument);
        assert_eq!(details.message(), said, "the server's words, as they are");
        let reason = details.reason().expect("a reason").as_str();
        assert!(reason.starts_with("QUERY_"), "{reason}");
        assert_eq!(
            err.to_string(),
            format!("invalid argument: {said} ({reason})")
        );
    }
    // The other way round: used, not given.
    let err = carts
        .query::<Cart>("SELECT * FROM c WHERE c.user = @user")
        .await
        .expect_err("refused");
    assert_eq!(
        err.message(),
        "query: parameter @user is used but not given"
    );
}

#[tokio::test]
async fn json_pointers_from_user_keys_patch_the_right_property() {
    let (_server, client) = start().await;
    json_pointers_from_user_keys_patch_the_right_property_on(&client).await;
}

async fn json_pointers_from_user_keys_patch_the_right_property_on(client: &Client) {
    let carts = collection(client, "/user").await;
    // Keys chosen by users, as object keys: '/' and '~' would otherwise split or escape.
    let odd = ["tea/green", "mug~1", "~0/~1"];
    let mut items = serde_json::Map::new();
    for key in odd {
        items.insert(key.into(), json!({"qty": 1}));
    }
    carts
        .create(&json!({"id": "c1", "user": "ann", "items": items}))
        .await
        .expect("create");
    let mut ops = carts.patch("c1", "ann");
    for (n, key) in odd.iter().enumerate() {
        ops = ops.incr(&json_pointer(["items", key, "qty"]), n as i64 + 1);
    }
    ops = ops.set(&json_pointer(["items", "new/one"]), json!({"qty": 7}));
    let PatchOutcome::Patched(doc) = ops.await.expect("patch") else {
        panic!("there")
    };
    let items = &doc.body()["items"];
    assert_eq!(items["tea/green"]["qty"], 2);
    assert_eq!(items["mug~1"]["qty"], 3);
    assert_eq!(items["~0/~1"]["qty"], 4);
    assert_eq!(items["new/one"]["qty"], 7);
    assert_eq!(
        items.as_object().map(|o| o.len()),
        Some(4),
        "nothing patched elsewhere: {items}"
    );
}

#[tokio::test]
async fn unsigned_and_32_bit_integers_are_partition_keys() {
    let (_server, client) = start().await;
    unsigned_and_32_bit_integers_are_partition_keys_on(&client).await;
}

async fn unsigned_and_32_bit_integers_are_partition_keys_on(client: &Client) {
    let c = collection(client, "/store").await;
    c.create(&json!({"id": "a", "store": 42}))
        .await
        .expect("create");
    let store_u32: u32 = 42;
    let store_u64: u64 = 42;
    let store_i32: i32 = 42;
    let store_i64: i64 = 42;
    assert!(c.read("a", store_u32).await.expect("read").is_some());
    assert!(c.read("a", store_u64).await.expect("read").is_some());
    assert!(c.read("a", store_i32).await.expect("read").is_some());
    assert!(c.read("a", store_i64).await.expect("read").is_some());
    assert!(c.read("a", 43_u64).await.expect("read").is_none());
    let counted: Vec<u64> = c
        .query("SELECT VALUE COUNT(1) FROM c")
        .partition_key(store_u64)
        .await
        .expect("query")
        .collect_all()
        .await
        .expect("count");
    assert_eq!(counted, [1]);
}

#[tokio::test]
async fn error_details_carry_the_typed_status_code() {
    let (_server, client) = start().await;
    error_details_carry_the_typed_status_code_on(&client).await;
}

async fn error_details_carry_the_typed_status_code_on(client: &Client) {
    client.create_database("shop").await.expect("db");
    let err = client.create_database("shop").await.expect_err("exists");
    let details = err.details().expect("from the server");
    assert_eq!(details.code(), StatusCode::AlreadyExists);
    assert_eq!(details.code().as_i32(), 6);
    assert_eq!(details.code().as_str(), "ALREADY_EXISTS");
    assert_eq!(details.reason(), Some(&Reason::DatabaseExists));
    assert_eq!(
        details.reason().map(Reason::as_str),
        Some("DATABASE_EXISTS")
    );

    let missing = client
        .database("nope")
        .collection("c")
        .read("a", "p")
        .await
        .expect_err("no database");
    assert_eq!(
        missing.details().map(|d| d.code()),
        Some(StatusCode::NotFound)
    );
}

/// Runs this test binary again, for one test, with `MAYFLY_KEY` as given: the environment of
/// a process is not to be changed while other tests run in it.
fn rerun_with_key(test: &str, key: Option<&str>) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("MAYFLY_DAY_ONE_CHILD", "1");
    match key {
        Some(key) => command.env("MAYFLY_KEY", key),
        None => command.env_remove("MAYFLY_KEY"),
    };
    let output = command.output().expect("test binary runs");
    assert!(
        output.status.success(),
        "{test} with MAYFLY_KEY={key:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

const KEY: &str = "a-key-of-at-least-16-characters";

#[test]
fn key_from_env_names_mayfly_key_when_it_is_unset() {
    if std::env::var_os("MAYFLY_DAY_ONE_CHILD").is_none() {
        rerun_with_key("key_from_env_names_mayfly_key_when_it_is_unset", None);
        rerun_with_key("key_from_env_names_mayfly_key_when_it_is_unset", Some(""));
        return;
    }
    let err = Client::builder("127.0.0.1:7070")
        .key_from_env()
        .expect_err("no key in the environment");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(err.reason(), Some(&Reason::MissingCredentials));
    let text = err.to_string();
    assert!(text.contains("MAYFLY_KEY is not set"), "{text}");
    assert!(
        text.contains("export MAYFLY_KEY="),
        "says what to do: {text}"
    );
    // The lenient form goes on without a key.
    assert!(
        Client::builder("127.0.0.1:7070")
            .key_from_env_if_set()
            .is_ok()
    );
}

#[test]
fn key_from_env_sends_mayfly_key_when_it_is_set() {
    if std::env::var_os("MAYFLY_DAY_ONE_CHILD").is_none() {
        rerun_with_key("key_from_env_sends_mayfly_key_when_it_is_set", Some(KEY));
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = RunningServer::start(mayfly_server::Config {
            auth: mayfly_server::AuthConfig::Given([Some(KEY.to_owned()), None, None, None]),
            ..Default::default()
        })
        .await
        .expect("server starts");
        let address = server.local_addr().to_string();
        for builder in [
            Client::builder(&address).key_from_env(),
            Client::builder(&address).key_from_env_if_set(),
        ] {
            let client = builder
                .expect("MAYFLY_KEY is set")
                .connect()
                .await
                .expect("connects");
            client.list_databases().await.expect("the key is sent");
        }
        let anonymous = Client::connect(&address).await.expect("connects");
        assert!(matches!(
            anonymous.list_databases().await,
            Err(Error::Unauthenticated(_))
        ));
    });
}

#[tokio::test]
async fn feeds_and_queries_stream_with_the_clients_stream_ext() {
    let (_server, client) = start().await;
    feeds_and_queries_stream_with_the_clients_stream_ext_on(&client).await;
}

async fn feeds_and_queries_stream_with_the_clients_stream_ext_on(client: &Client) {
    let carts = collection(client, "/user").await;
    for n in 0..5 {
        carts.create(&cart(&format!("c{n}"))).await.expect("create");
    }
    let ids: Vec<String> = carts
        .query::<String>("SELECT VALUE c.id FROM c ORDER BY c.id")
        .page_size(2)
        .await
        .expect("query")
        .map(|id| id.expect("id"))
        .take(3)
        .collect()
        .await;
    assert_eq!(ids, ["c0", "c1", "c2"]);
    let mut feed = carts
        .read_feed()
        .page_size(2)
        .await
        .expect("feed")
        .into_stream::<Cart>();
    let mut seen = 0;
    while let Some(item) = feed.next().await {
        assert_system_properties(&item.expect("typed"), None);
        seen += 1;
    }
    assert_eq!(seen, 5);
}

#[test]
fn the_client_crate_is_ready_to_publish() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{dir}/Cargo.toml")).expect("manifest");
    for key in [
        "description = ",
        "license.workspace = true",
        "repository.workspace = true",
        "homepage = ",
        "documentation = ",
        "readme = \"README.md\"",
        "keywords = ",
        "categories = ",
    ] {
        assert!(manifest.contains(key), "client/Cargo.toml lacks {key}");
    }
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).expect("client/README.md");
    assert!(readme.contains("cargo add mayfly-client"), "{readme}");
    // Cargo publishes a path dependency only with a version requirement.
    let workspace =
        std::fs::read_to_string(format!("{dir}/../Cargo.toml")).expect("workspace manifest");
    for dependency in ["mayfly-proto", "mayfly-json"] {
        assert!(
            workspace
                .lines()
                .any(|l| l.starts_with(&format!("{dependency} = {{")) && l.contains("version = ")),
            "{dependency} has no version requirement in [workspace.dependencies]"
        );
    }
}

/// Idempotency keys through the SDK: a keyed write sent again is answered as the first time
/// (a create is no conflict, an `incr` counts once, a delete is no "missing"), the same key
/// with another request is refused by reason, and a bad key is named.
#[tokio::test]
async fn keyed_writes_sent_again_apply_once() {
    let (_server, client) = start().await;
    keyed_writes_sent_again_apply_once_on(&client).await;
}

async fn keyed_writes_sent_again_apply_once_on(client: &Client) {
    let carts = collection(client, "/user").await;
    let doc = json!({"id": "c1", "user": "ann", "n": 0});
    let key = mayfly_client::new_idempotency_key();
    let first = carts
        .create(&doc)
        .idempotency_key(&key)
        .await
        .expect("created");
    let again = carts
        .create(&doc)
        .idempotency_key(&key)
        .await
        .expect("the first answer");
    assert_eq!(again.etag(), first.etag());
    let plain = carts.create(&doc).await.expect_err("unkeyed: a conflict");
    assert_eq!(plain.reason(), Some(&Reason::DocumentExists));

    let incr = mayfly_client::new_idempotency_key();
    for _ in 0..3 {
        carts
            .patch("c1", "ann")
            .incr("/n", 5)
            .idempotency_key(&incr)
            .await
            .expect("patched");
    }
    let read = carts.read("c1", "ann").await.expect("read").expect("there");
    assert_eq!(read.body()["n"], 5, "counted once");

    let reused = carts
        .patch("c1", "ann")
        .incr("/n", 6)
        .idempotency_key(&incr)
        .await
        .expect_err("another request under the key");
    assert_eq!(reused.reason(), Some(&Reason::IdempotencyKeyReused));
    assert!(!reused.may_have_applied());

    let batch_key = mayfly_client::new_idempotency_key();
    for _ in 0..2 {
        let results = carts
            .batch("ann")
            .create(&json!({"id": "o1", "user": "ann"}))
            .delete("c1")
            .idempotency_key(&batch_key)
            .await
            .expect("the batch, or its first answer");
        assert_eq!(results.len(), 2);
    }
    let bad = carts
        .delete_document("o1", "ann")
        .idempotency_key("a/b")
        .await
        .expect_err("a key with a slash");
    assert_eq!(bad.reason(), Some(&Reason::InvalidId));
    assert!(
        bad.message().contains("idempotency key"),
        "{}",
        bad.message()
    );
}

#[tokio::test]
async fn must_live_rules_refuse_an_order_that_could_expire() {
    let (_server, client) = start().await;
    must_live_rules_refuse_an_order_that_could_expire_on(&client).await;
}

async fn must_live_rules_refuse_an_order_that_could_expire_on(client: &Client) {
    let shop = client
        .create_database("shop")
        .await
        .expect("db")
        .create_collection("shop", "/user")
        .default_ttl(DefaultTtl::After(Duration::from_secs(3600)))
        .must_live(MustLiveRule::new("/type", ["order"]))
        .await
        .expect("collection");
    let info = shop.info().await.expect("info");
    assert_eq!(info.must_live, [MustLiveRule::new("/type", ["order"])]);

    // The forgotten `.ttl(DocumentTtl::Never)`: refused, naming the rule; nothing written.
    let order = json!({"id": "o1", "user": "ann", "type": "order"});
    let err = shop.create(&order).await.expect_err("refused");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(err.reason(), Some(&Reason::MustLive));
    assert!(
        err.message().contains("/type is \"order\""),
        "{}",
        err.message()
    );
    assert!(err.message().contains("\"ttl\": -1"), "{}", err.message());
    assert!(shop.read("o1", "ann").await.expect("read").is_none());
    shop.create(&order)
        .ttl(DocumentTtl::Never)
        .await
        .expect("says it lives");

    // Checkout as a batch turning the cart into an order, without the ttl: refused whole.
    shop.create(&json!({"id": "c1", "user": "ann", "type": "cart"}))
        .await
        .expect("a cart may expire");
    let checkout = shop
        .batch("ann")
        .create(&json!({"id": "receipt", "user": "ann", "type": "receipt"}))
        .patch("c1", PatchOps::new().set("/type", "order"))
        .await
        .expect_err("refused");
    assert_eq!(checkout.reason(), Some(&Reason::MustLive));
    assert!(shop.read("receipt", "ann").await.expect("read").is_none());
    shop.batch("ann")
        .patch(
            "c1",
            PatchOps::new()
                .set("/type", "order")
                .ttl(DocumentTtl::Never),
        )
        .await
        .expect("with the ttl");
    // An order's ttl cannot be patched away either.
    let err = shop
        .patch("c1", "ann")
        .ttl(DocumentTtl::After(Duration::from_secs(5)))
        .await
        .expect_err("refused");
    assert_eq!(err.reason(), Some(&Reason::MustLive));

    // Bad rules are named; replacing settings with an empty list removes the rules.
    let bad = client
        .database("shop")
        .create_collection("bad", "/user")
        .must_live(MustLiveRule::new("type", ["order"]))
        .await
        .expect_err("no leading slash");
    assert_eq!(bad.reason(), Some(&Reason::InvalidMustLiveRule));
    let info = shop
        .replace_settings(CollectionSettings::new(DefaultTtl::NoDefault).must_live([]))
        .await
        .expect("replaced");
    assert!(info.must_live.is_empty());
    shop.upsert(&json!({"id": "o2", "user": "ann", "type": "order"}))
        .await
        .expect("no rules now");
}
