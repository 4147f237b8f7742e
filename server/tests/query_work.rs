//! The work a query may make the server do: bounded per document whatever the pattern or the
//! projection (a 511-character `LIKE` took 16.9 s of CPU per 2 MiB document; a 128 MB result
//! was built, then could not be sent), and stopped when nobody waits for it: a query whose
//! client gave up, and every query when the server is asked to stop (abandoned queries burned
//! CPU for minutes, SIGTERM took 72 s). Each test prints what it measured (`--nocapture`).

mod support;

use std::time::{Duration, Instant};

use mayfly_proto::v1::QueryRequest;
use support::{
    Mayfly,
    clients::{Clients, connect, create_all, database_and_collection},
};
use tonic::{Code, Request};

/// A query doing about 90,000 rows of work per document (a JOIN of a 300-element array with
/// itself) over 40 documents: many seconds of CPU, each document well inside its budget.
const HEAVY: &str = "SELECT VALUE COUNT(1) FROM c JOIN a IN c.arr JOIN b IN c.arr \
                     WHERE a + b >= 0 AND a * b >= 0";

/// A memory server with `d/c` holding `bodies`.
async fn server_with(
    dir: &std::path::Path,
    bodies: impl IntoIterator<Item = serde_json::Value>,
) -> (Mayfly, Clients) {
    let server = Mayfly::start(dir, &["--storage", "memory"]);
    let mut c = connect(&server).await;
    database_and_collection(&mut c).await;
    create_all(&mut c, bodies).await;
    (server, c)
}

/// Documents for [`HEAVY`]: 40, each with a 300-element array.
async fn seeded_server(dir: &std::path::Path) -> (Mayfly, Clients) {
    let arr: Vec<u32> = (0..300).collect();
    server_with(
        dir,
        (0..40).map(|i| serde_json::json!({"id": format!("d{i}"), "pk": "p", "arr": arr})),
    )
    .await
}

fn heavy_query() -> QueryRequest {
    QueryRequest {
        database: "d".into(),
        collection: "c".into(),
        query: HEAVY.into(),
        ..Default::default()
    }
}

/// CPU time the process has used (user and system).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name, which ends at the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split(' ')
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // Linux reports in USER_HZ, 100 per second on every platform it runs on.
    Duration::from_millis(ticks * 10)
}

/// The server's CPU in the second from 300 ms after `query` gave up on its 500 ms deadline.
async fn cpu_after_leaving(server: &Mayfly, c: &mut Clients, query: &str) -> Duration {
    let mut request = Request::new(QueryRequest {
        query: query.into(),
        ..heavy_query()
    });
    request.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let status = c
        .documents
        .query(request)
        .await
        .expect_err("not done in 500 ms");
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // Within ~100 ms the work has stopped: the server then idles.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = server.child.id();
    let before = cpu_time(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    cpu_time(pid) - before
}

#[tokio::test]
async fn a_query_stops_soon_after_its_client_leaves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut c) = seeded_server(dir.path()).await;
    // One that reads its whole scope before answering (a count), and a streaming one whose
    // first page finds nothing for its whole 2 s.
    for query in [
        HEAVY,
        "SELECT VALUE a FROM c JOIN a IN c.arr JOIN b IN c.arr WHERE a * b < 0",
    ] {
        let spent = cpu_after_leaving(&server, &mut c, query).await;
        println!("server CPU in the second after the client left `{query}`: {spent:?}");
        assert!(
            spent < Duration::from_millis(300),
            "the abandoned query went on: {spent:?} of CPU in 1 s"
        );
    }
}

#[tokio::test]
async fn sigterm_stops_running_queries_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, c) = seeded_server(dir.path()).await;
    let mut documents = c.documents.clone();
    let query = tokio::spawn(async move { documents.query(heavy_query()).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("joins");
    let took = asked.elapsed();
    println!("exited {took:?} after SIGTERM with a query running");
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let answer = query.await.expect("joins");
    let status = answer.expect_err("the query was stopped");
    // SHUTTING_DOWN, or the connection closing under it.
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown),
        "{status:?}"
    );
}

/// A memory server with `d/c` and `count` documents holding `s`, a string of `len` bytes.
async fn big_strings(dir: &std::path::Path, count: usize, len: usize) -> (Mayfly, Clients) {
    let text = "a".repeat(len);
    server_with(
        dir,
        (0..count).map(|i| serde_json::json!({"id": format!("d{i}"), "pk": "p", "s": text})),
    )
    .await
}

fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// Resident memory of a process.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

#[tokio::test]
async fn a_hostile_like_pattern_is_stopped_by_the_document_budget() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Ten documents of 2 MB strings; a 511-character pattern that every position nearly
    // matches: about 500 comparisons at each of 2 million places per document.
    let (_server, mut c) = big_strings(dir.path(), 10, 2_000_000).await;
    let pattern = format!("%{}b", "_".repeat(509));
    for query in [
        format!("SELECT VALUE COUNT(1) FROM c WHERE c.s LIKE '{pattern}'"),
        format!("SELECT c.id FROM c WHERE c.s LIKE '{pattern}'"),
    ] {
        let started = Instant::now();
        let status = c
            .documents
            .query(QueryRequest {
                query: query.clone(),
                ..heavy_query()
            })
            .await
            .expect_err("stopped");
        let took = started.elapsed();
        println!(
            "511-character LIKE over 2 MB documents ({}): {} after {took:?}",
            &query[..query.find(" FROM").unwrap_or(query.len())],
            reason(&status)
        );
        assert_eq!(reason(&status), "QUERY_LIMIT", "{status:?}");
        assert!(status.message().contains("evaluat"), "{status:?}");
    }
}

#[tokio::test]
async fn a_result_too_large_to_send_is_refused_while_it_is_built() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut c) = big_strings(dir.path(), 1, 1_500_000).await;
    let pid = server.child.id();
    // Twelve copies of a 1.5 MB string: an 18 MB result, past the 16 MiB message limit.
    let copies = ["c.s"; 12].join(", ");
    let query = format!("SELECT VALUE [{copies}] FROM c");
    let before = rss(pid);
    let mut running = Vec::new();
    for _ in 0..16 {
        let mut documents = c.documents.clone();
        let request = QueryRequest {
            query: query.clone(),
            ..heavy_query()
        };
        running.push(tokio::spawn(async move {
            let started = Instant::now();
            let status = documents.query(request).await.expect_err("refused");
            (status, started.elapsed())
        }));
    }
    let mut peak = 0;
    let mut statuses = Vec::new();
    for task in running {
        peak = peak.max(rss(pid).saturating_sub(before));
        statuses.push(task.await.expect("joins"));
    }
    let slowest = statuses
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "16 queries each building an 18 MB result: all {} within {slowest:?}, server RSS peak +{:.0} MiB",
        reason(&statuses[0].0),
        peak as f64 / (1024.0 * 1024.0)
    );
    for (status, _) in &statuses {
        assert_eq!(reason(status), "QUERY_LIMIT", "{status:?}");
        assert!(status.message().contains("larger than"), "{status:?}");
    }
    // The server serves on.
    c.documents
        .query(QueryRequest {
            query: "SELECT VALUE c.id FROM c".into(),
            ..heavy_query()
        })
        .await
        .expect("served");
}
