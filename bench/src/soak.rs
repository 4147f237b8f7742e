//! `soak`: a long run that should leave the server's memory flat. Starts `--server-bin` on a
//! new `--data-dir` and, for `--duration` seconds, runs at once:
//! - writers creating documents with ttls of 1 to 30 s (`--concurrency` / 2 tasks),
//! - readers of recent documents (many of them already expired) and partition queries,
//! - an expiry storm each minute: 20,000 documents written with the same 5 s ttl, so that they
//!   all expire in the same instant,
//! - stalled clients each minute: 20 feed streams whose reader never reads (held 30 s, then
//!   dropped) and 4 uploads that stop at 15 of 16 MiB (ended by the server's read timeout).
//!
//! Every minute it prints the server's resident memory and what the load did.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::{BufMut, Bytes, BytesMut};
use mayfly_proto::v1::{QueryRequest, ReadFeedRequest, client::DocumentsClient};
use tonic::{Code, transport::Endpoint};

use crate::{
    Args, Bench, KeyHeader,
    recovery::{self, rss_bytes},
};

/// Documents written by each storm, all with the same ttl.
const STORM_DOCUMENTS: u64 = 20_000;
const STORM_TTL: i64 = 5;
/// Stalled clients opened each minute.
const STALLED_FEEDS: usize = 20;
const STALLED_UPLOADS: usize = 4;

#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    reads_found: AtomicU64,
    reads_missing: AtomicU64,
    queries: AtomicU64,
    storm_writes: AtomicU64,
    stalled_feeds: AtomicU64,
    uploads_ended: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn take(&self) -> [u64; 8] {
        [
            &self.writes,
            &self.reads_found,
            &self.reads_missing,
            &self.queries,
            &self.storm_writes,
            &self.stalled_feeds,
            &self.uploads_ended,
            &self.errors,
        ]
        .map(|c| c.swap(0, Ordering::Relaxed))
    }
}

pub(crate) async fn run(mut args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let (bin, data_dir) = recovery::server_and_new_dir(&args, "soak")?;
    let cache_mb = 64;
    let server = recovery::start(
        &bin,
        &data_dir,
        cache_mb,
        &[
            "--request-read-timeout-secs",
            "10",
            "--response-budget-mb",
            "64",
        ],
    )?;
    let pid = server.child.id();
    println!(
        "# server pid {pid}, block cache {cache_mb} MiB, response budget 64 MiB, request read timeout 10 s"
    );
    args.addr = server.addr.parse()?;
    let bench = Arc::new(Bench::start(args).await?);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();

    let writers = (bench.args.concurrency / 2).max(1);
    for worker in 0..writers {
        let (bench, stop, counts, next) =
            (bench.clone(), stop.clone(), counts.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = bench.documents(worker);
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let ttl = 1 + (n % 30) as i64;
                match client.create_document(bench.create_request(n, ttl)).await {
                    Ok(_) => counts.writes.fetch_add(1, Ordering::Relaxed),
                    Err(_) => counts.errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let readers = (bench.args.concurrency / 4).max(1);
    for worker in 0..readers {
        let (bench, stop, counts, next) =
            (bench.clone(), stop.clone(), counts.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = bench.documents(worker);
            let mut i = worker as u64;
            while !stop.load(Ordering::Relaxed) {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let written = next.load(Ordering::Relaxed).max(1);
                // Recent documents: some alive, some already expired.
                let n = written.saturating_sub(1 + (i >> 33) % 50_000);
                if worker % 4 == 0 {
                    let query = QueryRequest {
                        database: crate::DATABASE.into(),
                        collection: bench.collection.clone(),
                        query: "SELECT TOP 20 c.id, c.n FROM c WHERE c.n >= @n".into(),
                        parameters: [(
                            "@n".to_owned(),
                            mayfly_proto::json::JsonValue::new(serde_json::json!(n)),
                        )]
                        .into(),
                        partition_key: bench.read_request(n).partition_key,
                        page_size: 20,
                        ..Default::default()
                    };
                    match client.query(query).await {
                        Ok(stream) => {
                            let mut stream = stream.into_inner();
                            while let Ok(Some(_)) = stream.message().await {}
                            counts.queries.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            counts.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    continue;
                }
                match client.read_document(bench.read_request(n)).await {
                    Ok(_) => counts.reads_found.fetch_add(1, Ordering::Relaxed),
                    Err(s) if s.code() == Code::NotFound => {
                        counts.reads_missing.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(_) => counts.errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    {
        // Each minute: an expiry storm and a round of stalled clients.
        let (bench, stop, counts) = (bench.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut minute = tokio::time::interval(Duration::from_secs(60));
            let mut storm_base = 1u64 << 40;
            while !stop.load(Ordering::Relaxed) {
                minute.tick().await;
                tokio::spawn(stalled_clients(bench.clone(), counts.clone()));
                let storm: Vec<_> = (0..16u64)
                    .map(|w| {
                        let (bench, counts) = (bench.clone(), counts.clone());
                        tokio::spawn(async move {
                            let mut client = bench.documents(w as usize);
                            for n in (storm_base + w..storm_base + STORM_DOCUMENTS).step_by(16) {
                                match client
                                    .create_document(bench.create_request(n, STORM_TTL))
                                    .await
                                {
                                    Ok(_) => counts.storm_writes.fetch_add(1, Ordering::Relaxed),
                                    Err(_) => counts.errors.fetch_add(1, Ordering::Relaxed),
                                };
                            }
                        })
                    })
                    .collect();
                for task in storm {
                    let _ = task.await;
                }
                storm_base += STORM_DOCUMENTS;
            }
        }));
    }

    let started = Instant::now();
    let deadline = started + Duration::from_secs(bench.args.duration);
    let sample = Duration::from_secs(60);
    println!(
        "minute  rss_mib  writes/s  reads_found/s  reads_missing/s  queries/s  storm_writes  stalled_feeds  stalled_uploads_ended  errors"
    );
    let mut rss = Vec::new();
    let mut last = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(sample.min(deadline.saturating_duration_since(Instant::now()))).await;
        let secs = last.elapsed().as_secs_f64().max(1e-9);
        last = Instant::now();
        let [w, rf, rm, q, sw, sf, ue, e] = counts.take();
        let mib = rss_bytes(pid) as f64 / 1_048_576.0;
        rss.push(mib);
        println!(
            "{:>6}  {mib:>7.1}  {:>8.0}  {:>13.0}  {:>15.0}  {:>9.0}  {sw:>12}  {sf:>13}  {ue:>21}  {e:>6}",
            rss.len(),
            w as f64 / secs,
            rf as f64 / secs,
            rm as f64 / secs,
            q as f64 / secs,
        );
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.abort();
    }
    let warm = rss.len() / 3;
    if let (Some(first), Some(last)) = (rss.get(warm), rss.last()) {
        let max = rss[warm..].iter().copied().fold(f64::MIN, f64::max);
        println!(
            "# RSS after warm-up (minute {}): {first:.1} MiB; at the end: {last:.1} MiB; highest since warm-up: {max:.1} MiB ({:+.1} % end vs warm-up)",
            warm + 1,
            (last / first - 1.0) * 100.0
        );
    }
    let recovery::Server { mut child, .. } = server;
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// A round of stalled clients: feed streams that are never read, held 30 s, and uploads that
/// stop short of their announced size until the server ends them.
async fn stalled_clients(bench: Arc<Bench>, counts: Arc<Counts>) {
    let Ok(endpoint) = Endpoint::from_shared(format!("http://{}", bench.args.addr)) else {
        return;
    };
    // A small window: the server meets a reader that stops after 64 KiB.
    let Ok(channel) = endpoint
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
    else {
        counts.errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut held = Vec::new();
    for _ in 0..STALLED_FEEDS {
        let mut client =
            DocumentsClient::with_interceptor(channel.clone(), KeyHeader::of(&bench.args));
        let request = ReadFeedRequest {
            database: crate::DATABASE.into(),
            collection: bench.collection.clone(),
            page_size: 1000,
            ..Default::default()
        };
        if let Ok(stream) = client.read_feed(request).await {
            held.push(stream.into_inner());
            counts.stalled_feeds.fetch_add(1, Ordering::Relaxed);
        }
    }
    let uploads: Vec<_> = (0..STALLED_UPLOADS)
        .map(|_| tokio::spawn(stalled_upload(bench.args.addr)))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    drop(held);
    for upload in uploads {
        if let Ok(true) = upload.await {
            counts.uploads_ended.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An upload announced as 16 MiB that stops after 15: true once the server has ended it.
async fn stalled_upload(addr: std::net::SocketAddr) -> bool {
    let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let Ok((client, connection)) = h2::client::handshake(tcp).await else {
        return false;
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let Ok(mut ready) = client.ready().await else {
        return false;
    };
    let Ok(request) = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/mayfly.v1.Documents/CreateDocument"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
    else {
        return false;
    };
    let Ok((response, mut body)) = ready.send_request(request, false) else {
        return false;
    };
    let mut prefix = BytesMut::new();
    prefix.put_u8(0);
    prefix.put_u32(16 * 1024 * 1024 - 1);
    let sent = body.send_data(prefix.freeze(), false).is_ok()
        && body
            .send_data(Bytes::from(vec![b'x'; 15 * 1024 * 1024]), false)
            .is_ok();
    // The server answers (DEADLINE_EXCEEDED) at its read timeout; bounded here too.
    let answered = tokio::time::timeout(Duration::from_secs(60), response).await;
    drop(body);
    sent && matches!(answered, Ok(Ok(_)))
}
