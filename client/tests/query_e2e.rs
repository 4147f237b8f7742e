//! Queries end to end with the real clock: documents with 1 s TTLs leave every query path at
//! their expiry (and with 3 s TTLs on a three-node cluster), and hostile queries get
//! INVALID_ARGUMENT while the server keeps serving.

use std::time::{Duration, Instant};

use mayfly_client::{
    Client, Collection, CollectionSettings, Database, DefaultTtl, Error, IndexingMode,
    IndexingPaths,
};
use mayfly_server::RunningServer;
use serde_json::{Value, json};

#[path = "support/cluster.rs"]
mod cluster;

/// A server on 127.0.0.1:0 and its database "db".
async fn server_with_database() -> (RunningServer, Database) {
    let server = RunningServer::start(Default::default())
        .await
        .expect("server");
    let client = Client::connect(server.local_addr().to_string())
        .await
        .expect("client");
    let db = client.create_database("db").await.expect("db");
    (server, db)
}

async fn setup(ttl: DefaultTtl) -> (RunningServer, Collection) {
    let (server, db) = server_with_database().await;
    let c = db
        .create_collection("events", "/pk")
        .default_ttl(ttl)
        .await
        .expect("collection");
    (server, c)
}

async fn results(c: &Collection, text: &str) -> Vec<Value> {
    c.query::<Value>(text)
        .page_size(2)
        .await
        .expect("query runs")
        .collect_all()
        .await
        .expect("pages")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_leave_every_query_path_when_their_ttl_runs_out() {
    let (_server, c) = setup(DefaultTtl::NoDefault).await;
    leave_every_query_path(&c, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_leave_every_query_path_of_a_three_node_cluster_when_their_ttl_runs_out() {
    let (_cluster, client) = cluster::three_nodes().await;
    let db = client.create_database("db").await.expect("db");
    let c = db
        .create_collection("events", "/pk")
        .default_ttl(DefaultTtl::NoDefault)
        .await
        .expect("collection");
    // Queries through one node read the others' partitions: the first round takes longer
    // than on one node, so the documents live longer.
    leave_every_query_path(&c, 3).await;
}

/// Half of six documents, with a TTL of `ttl` seconds, leave every query path at their expiry.
async fn leave_every_query_path(c: &Collection, ttl: i64) {
    for i in 0..6 {
        let mut doc =
            json!({"id": format!("d{i}"), "pk": format!("p{}", i % 3), "n": i, "tags": ["x", "y"]});
        if i % 2 == 0 {
            doc["ttl"] = json!(ttl);
        }
        c.create(&doc).await.expect("create");
    }
    let written = Instant::now();
    let life = Duration::from_secs(ttl as u64);
    let paths = [
        "SELECT VALUE c.id FROM c",
        "SELECT VALUE c.id FROM c WHERE c.n >= 0",
        "SELECT VALUE c.id FROM c ORDER BY c.n",
        "SELECT VALUE t FROM c JOIN t IN c.tags",
        "SELECT DISTINCT VALUE c.n FROM c",
        "SELECT c.pk, COUNT(1) AS n FROM c GROUP BY c.pk",
    ];
    let before: Vec<usize> = {
        let mut counts = Vec::new();
        for text in paths {
            counts.push(results(c, text).await.len());
        }
        counts
    };
    let count_before = results(c, "SELECT VALUE COUNT(1) FROM c").await;
    // The whole first round must have run before any document expired.
    assert!(
        written.elapsed() < life - Duration::from_millis(100),
        "too slow to observe the expiry"
    );
    assert_eq!(before, [6, 6, 6, 12, 6, 3]);
    assert_eq!(count_before, [json!(6)]);

    tokio::time::sleep((life + Duration::from_millis(100)).saturating_sub(written.elapsed())).await;
    let mut after = Vec::new();
    for text in paths {
        after.push(results(c, text).await.len());
    }
    assert_eq!(
        after,
        [3, 3, 3, 6, 3, 3],
        "the three short-lived documents are gone from every path"
    );
    assert_eq!(results(c, "SELECT VALUE COUNT(1) FROM c").await, [json!(3)]);
    let odd: Vec<Value> = results(c, "SELECT VALUE c.n FROM c ORDER BY c.n DESC").await;
    assert_eq!(odd, [json!(5), json!(3), json!(1)]);
}

async fn refused(c: &Collection, text: &str, params: &[(&str, Value)]) -> String {
    let mut q = c.query::<Value>(text);
    for (k, v) in params {
        q = q.param(k, v);
    }
    let outcome = match q.await {
        Ok(r) => r.collect_all().await,
        Err(e) => Err(e),
    };
    match outcome {
        Err(Error::InvalidArgument(details)) => details.message().to_owned(),
        other => panic!(
            "{}: expected INVALID_ARGUMENT, got {other:?}",
            &text[..text.len().min(80)]
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_are_refused_and_the_server_keeps_serving() {
    let (_server, c) = setup(DefaultTtl::Off).await;
    let big: Vec<u32> = (0..1000).collect();
    c.create(&json!({"id": "big", "pk": "p", "a": big, "b": big, "c": big}))
        .await
        .expect("create");
    let message = refused(&c, "SELECT * FROM c WHERE", &[]).await;
    assert!(
        message.contains("line 1, column 22") && message.contains("syntax error"),
        "{message}"
    );
    let message = refused(&c, "SELECT VALUE NO_SUCH(c.a) FROM c", &[]).await;
    assert!(message.contains("unknown function 'NO_SUCH'"), "{message}");
    let message = refused(&c, "SELECT TOP @n * FROM c", &[("@n", json!("ten"))]).await;
    assert!(
        message.contains("TOP takes a non-negative integer"),
        "{message}"
    );
    let message = refused(&c, "SELECT VALUE c.id FROM c WHERE c.id = @missing", &[]).await;
    assert!(message.contains("@missing"), "{message}");
    let huge = format!("SELECT VALUE '{}' FROM c", "x".repeat(1 << 20));
    let message = refused(&c, &huge, &[]).await;
    assert!(message.contains("at most 262144"), "{message}");
    let nested = format!(
        "SELECT VALUE {}1{} FROM c",
        "(".repeat(10_000),
        ")".repeat(10_000)
    );
    let message = refused(&c, &nested, &[]).await;
    assert!(message.contains("nests deeper than"), "{message}");
    let started = Instant::now();
    let message = refused(
        &c,
        "SELECT VALUE 1 FROM c JOIN x IN c.a JOIN y IN c.b JOIN z IN c.c",
        &[],
    )
    .await;
    assert!(message.contains("more than 100000 rows"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the cross join stops early"
    );
    // Still serving.
    assert_eq!(
        results(&c, "SELECT VALUE ARRAY_LENGTH(c.a) FROM c").await,
        [json!(1000)]
    );
}

/// Polls until `done` holds (every 20 ms, at most 10 s): the background indexer's progress.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut done: impl FnMut() -> F,
) {
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what} did not happen within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server runs the background indexer: a `lazy` collection's writes reach its index, and
/// a path change is rebuilt and recorded complete, after which queries read the index again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_indexer_catches_up_and_rebuilds() {
    let (_server, db) = server_with_database().await;
    let lazy = db
        .create_collection("lazy", "/pk")
        .indexing_mode(IndexingMode::Lazy)
        .await
        .expect("collection");
    for i in 0..50 {
        lazy.create(&json!({"id": format!("d{i}"), "pk": "p", "k": "x"}))
            .await
            .expect("create");
    }
    let count = "SELECT VALUE COUNT(1) FROM c WHERE c.k = 'x'";
    eventually("the lazy catch-up", || async {
        results(&lazy, count).await == [json!(50)]
    })
    .await;

    let c = db
        .create_collection("c", "/pk")
        .indexing_paths(IndexingPaths::new(["/*"], ["/k/?"]))
        .await
        .expect("collection");
    for i in 0..50 {
        c.create(&json!({"id": format!("d{i}"), "pk": "p", "k": "x"}))
            .await
            .expect("create");
    }
    let info = c
        .replace_settings(
            CollectionSettings::new(DefaultTtl::Off)
                .indexing_paths(IndexingPaths::new(["/*"], [] as [&str; 0])),
        )
        .await
        .expect("settings");
    assert!(!info.index_complete);
    eventually("the rebuild", || async {
        c.info().await.expect("info").index_complete
    })
    .await;
    let mut pages = c.query::<Value>(count).await.expect("query runs");
    let page = pages.next_page().await.expect("page").expect("one page");
    assert_eq!(page.results, [json!(50)]);
    assert_eq!(page.metrics.index.as_deref(), Some("/k/?"));
    assert_eq!(page.metrics.documents_examined, 0);
}
