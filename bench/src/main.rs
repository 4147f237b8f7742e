//! `mayfly-bench`: load generator for a running Mayfly server.
//!
//! Workloads `write` (create with a ttl), `read` (point reads of preloaded documents) and
//! `mixed` run `--concurrency` requests at a time for `--duration` seconds and print throughput
//! and latency percentiles. `expiry` loads `--documents` documents whose expiry instants fall in
//! one window, then reads from the server's metrics how fast the purge removed them and with
//! what lag. Every run prints the command that reproduces it.
//!
//! The `etcd-*` workloads run the same shapes against etcd (`--etcd-addr`) for comparison; see
//! the `etcd` module; the `redis-*` ones against Redis (`--redis-addr`), see `redis`. Every
//! timed phase also prints the server's CPU per operation (see the `cpu` module).
//!
//! It drives the generated gRPC client with prebuilt bodies (not the higher-level `mayfly-client`
//! wrapper) so that, sharing a machine with the server, it spends as little CPU as it can.

mod changefeed;
mod counter;
mod cpu;
mod etcd;
mod failover;
mod metrics;
mod payload;
mod query;
mod recovery;
mod redis;
mod soak;
mod takeover;
mod throttle;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use hdrhistogram::Histogram;
use mayfly_proto::{
    json::JsonObject,
    v1::{
        self, CreateCollectionRequest, CreateDatabaseRequest, CreateDocumentRequest,
        DeleteDatabaseRequest, ReadDocumentRequest,
        client::{CollectionsClient, DatabasesClient, DocumentsClient},
        oneofs::PartitionKeyKind,
    },
};
use payload::Payloads;
use serde_json::{Map, Value, json};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Create documents, each with its own ttl.
    Write,
    /// Point-read preloaded documents.
    Read,
    /// `grpc.health.v1.Health/Check` on the same server: the transport's own cost per call,
    /// what a point read is compared with.
    Health,
    /// Reads and writes-with-ttl mixed by --read-percent.
    Mixed,
    /// Load --documents expiring within --window-secs, then measure the purge.
    Expiry,
    /// Load --documents into a new --data-dir, SIGKILL, restart: measure recovery.
    Recovery,
    /// Cluster mode: kill the node owning every partition --rounds times beside a new node;
    /// time from the kill to the first write through the new node (needs --nats and
    /// --server-bin).
    Failover,
    /// Write --documents over two nodes a and b (run with --standbys), kill a, and time until
    /// b serves every partition; b's catch-up rate from its log lines.
    Takeover,
    /// Preload, then run each query shape (indexed equality, ORDER BY TOP 10, COUNT, a
    /// full-scan filter) at --concurrency and at 1 in flight.
    Query,
    /// Preload, then each indexed query shape (one document by a unique `n`, 10 documents by
    /// a group `g`, ORDER BY TOP 10) between runs of point reads, each for --duration seconds
    /// at --concurrency: prints each query's throughput as a ratio of the point reads' around
    /// it (issue 24, item 5).
    Ratios,
    /// Issue 29's acceptance figures for provisioned throughput: a collection provisioned
    /// --throughput RU/s (default 1,000) offered 5x its budget in small writes (--doc-bytes
    /// default 200) for --duration s: RU/s consumed, throttles and their retry-after-ms, and
    /// that no throttled write changed anything; a neighbour collection's point-read p99 alone
    /// and beside that flood; the purge lag of --documents (default 100,000) expiring in a
    /// collection provisioned by ReplaceThroughput and flooded, against one never throttled.
    /// Needs --metrics.
    Throttle,
    /// Increment counters: patch incr versus read-modify-write, on one hot document and on
    /// --counters documents.
    Counter,
    /// --subscribers change feed consumers while writes come at --rate/s for --duration s
    /// (--expire-percent of them with a 1 s ttl): delivery latency of write and expiry events.
    Changefeed,
    /// Write --documents, then read the change feed from the beginning: catch-up events/s.
    ChangefeedCatchUp,
    /// Start --server-bin on a new --data-dir and run mixed load with expiry storms and
    /// stalled clients for --duration seconds, printing the server's RSS every minute.
    Soak,
    /// etcd: plain puts of --doc-bytes values under unique keys.
    EtcdPut,
    /// etcd: LeaseGrant(--ttl) then a put with that lease; the pair counts as one leased put.
    EtcdLeasePut,
    /// etcd: --documents leased keys whose leases run out within --window-secs; measure expiry.
    EtcdExpiry,
    /// Redis: SET of --doc-bytes values under fresh keys, each with EX --ttl.
    RedisSet,
    /// Redis: GET of --preload keys set first.
    RedisGet,
}

/// Load generator for Mayfly.
#[derive(Debug, Clone, Parser)]
#[command(version)]
struct Args {
    /// What to run.
    #[arg(value_enum)]
    workload: Workload,
    /// Server gRPC address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    addr: SocketAddr,
    /// etcd client address (the etcd-* workloads).
    #[arg(long, default_value = "127.0.0.1:2379")]
    etcd_addr: SocketAddr,
    /// Redis address (the redis-* workloads).
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis_addr: SocketAddr,
    /// Server metrics address (needed by `expiry`; elsewhere the source of the server's CPU
    /// time, `mayfly_process_cpu_seconds_total`).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// PID of the local server process (Mayfly, etcd or Redis): its CPU time is read from
    /// /proc/PID/stat, in place of what the server reports.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the requests are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Seconds each timed workload runs.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Approximate JSON size of each document, in bytes (`throttle`: 200 unless given).
    #[arg(long, default_value_t = 1024)]
    doc_bytes: usize,
    /// TTL in seconds of documents written by write and mixed, and of etcd-lease-put's leases.
    #[arg(long, default_value_t = 3600)]
    ttl: i64,
    /// Documents preloaded for read and mixed.
    #[arg(long, default_value_t = 100_000)]
    preload: u64,
    /// `ratios`: run each query shape once for --duration seconds before it is measured, so
    /// that what it reads is in the server's caches (as the point reads' documents are, read
    /// while the preload settles), as in a service that has run a while.
    #[arg(long)]
    warm_up: bool,
    /// Percentage of reads in mixed.
    #[arg(long, default_value_t = 80)]
    read_percent: u8,
    /// Counters the `counter` workload spreads its increments over (besides one hot one).
    #[arg(long, default_value_t = 10_000)]
    counters: u64,
    /// Documents loaded by expiry (leased keys, for etcd-expiry); `throttle`: 100,000 unless
    /// given.
    #[arg(long, default_value_t = 500_000)]
    documents: u64,
    /// Expiry spreads the documents' expiry instants over this many seconds.
    #[arg(long, default_value_t = 1)]
    window_secs: u64,
    /// Seconds from the start of loading to the first expiry: must exceed the load time.
    #[arg(long, default_value_t = 45)]
    lead_secs: u64,
    /// The collection's indexing mode: consistent, lazy or none (none turns collection TTL
    /// off, since Cosmos DB refuses TTL without an index: documents' ttls are then ignored).
    #[arg(long, default_value = "consistent")]
    indexing: String,
    /// The collection's change feed retention in seconds (0: no feed; the server's default,
    /// a day, if not given): what the feed costs a write is this at 0 against the default.
    #[arg(long)]
    feed_retention: Option<i64>,
    /// The collection's provisioned throughput in RU/s (manual; unlimited if not given): what
    /// charging and enforcing a budget costs a request is this, set far above what the run
    /// spends, against none. `throttle`: the budget it floods (1,000 if not given).
    #[arg(long)]
    throughput: Option<u32>,
    /// Change feed consumers (`changefeed`).
    #[arg(long, default_value_t = 10)]
    subscribers: usize,
    /// Change feed consumers following `expiry`'s storm: how soon each expiry reaches them.
    #[arg(long, default_value_t = 0)]
    feed_subscribers: usize,
    /// Change feed consumers that open their stream and never read it (`changefeed`): what a
    /// stalled consumer costs the server.
    #[arg(long, default_value_t = 0)]
    idle_subscribers: usize,
    /// The local address the never-reading consumers connect from (`changefeed`): another
    /// loopback address is another client as the server counts them. Empty: the system's
    /// choice, as for every other connection.
    #[arg(long, default_value = "127.0.0.2")]
    idle_from: String,
    /// Never-reading consumers per connection (`changefeed`).
    #[arg(long, default_value_t = 20)]
    idle_per_connection: usize,
    /// The HTTP/2 receive windows of the never-reading consumers' connections, in KiB: what
    /// each connection lets the server send before it stalls (default: tonic's, 5 MiB per
    /// connection and 2 MiB per stream). Applied to both the connection and each stream.
    #[arg(long)]
    idle_window_kb: Option<u32>,
    /// Writes offered per second (`changefeed`).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Percentage of `changefeed`'s writes with a 1 s ttl, whose expiry events come back
    /// during the run.
    #[arg(long, default_value_t = 50)]
    expire_percent: u8,
    /// Properties per document (at least 5: id, pk, payload, n, g; the rest small scalars).
    #[arg(long, default_value_t = 5)]
    properties: usize,
    /// The `mayfly` binary that recovery starts.
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// A new data directory for recovery.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// `failover`: the NATS servers' URLs, comma-separated.
    #[arg(long)]
    nats: Option<String>,
    /// `failover`: how many times the owner is killed.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// `failover`: documents written before each kill.
    #[arg(long, default_value_t = 1000)]
    round_writes: u64,
    /// `takeover`: standbys per partition on the nodes it starts.
    #[arg(long, default_value_t = 1)]
    standbys: u8,
    /// `takeover`: the nodes' `--snapshot-records` (an owner snapshots each partition into its
    /// log after this many records and purges the log below the snapshot before).
    #[arg(long, default_value_t = 100_000)]
    snapshot_records: u64,
    /// `failover`: the cluster's partitions.
    #[arg(long, default_value_t = 8)]
    partitions: u16,
    /// Key sent as `authorization: Bearer <key>` (a disk server's is in its data directory,
    /// `keys/primary`).
    #[arg(long, env = "MAYFLY_KEY", hide_env_values = true)]
    key: Option<String>,
}

/// Adds the `--key` to every request.
#[derive(Clone, Debug)]
struct KeyHeader(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl KeyHeader {
    fn of(args: &Args) -> Self {
        KeyHeader(args.key.as_ref().map(|key| {
            format!("Bearer {key}")
                .parse()
                .expect("--key is printable ASCII")
        }))
    }
}

impl tonic::service::Interceptor for KeyHeader {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A channel sending the `--key`.
type Authorized = tonic::service::interceptor::InterceptedService<Channel, KeyHeader>;

/// Each request to a peer (etcd, Redis) fails after this long, so no loop can hang on a
/// stalled server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const DATABASE: &str = "bench";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if args.workload == Workload::Throttle {
        throttle::defaults(&mut args, &matches);
    }
    println!("# {}", std::env::args().collect::<Vec<_>>().join(" "));
    println!(
        "# {} cores, concurrency {}, connections {}, ~{} B documents",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.concurrency,
        args.connections,
        args.doc_bytes
    );
    if matches!(
        args.workload,
        Workload::EtcdPut | Workload::EtcdLeasePut | Workload::EtcdExpiry
    ) {
        return etcd::run(args).await;
    }
    if matches!(args.workload, Workload::RedisSet | Workload::RedisGet) {
        return redis::run(args).await;
    }
    if args.workload == Workload::Recovery {
        return recovery::run(args).await;
    }
    if args.workload == Workload::Failover {
        return failover::run(args).await;
    }
    if args.workload == Workload::Takeover {
        return takeover::run(args).await;
    }
    if args.workload == Workload::Soak {
        return soak::run(args).await;
    }
    let bench = Arc::new(Bench::start(args).await?);
    match bench.args.workload {
        Workload::Write => {
            bench.timed(0).await?;
        }
        Workload::Read => {
            bench.preload().await?;
            bench.timed(100).await?;
        }
        Workload::Health => {
            bench.timed(100).await?;
        }
        Workload::Mixed => {
            bench.preload().await?;
            bench.timed(bench.args.read_percent).await?;
        }
        Workload::Expiry => bench.expiry().await?,
        Workload::Counter => bench.counters().await?,
        Workload::Throttle => bench.throttle().await?,
        Workload::Changefeed => bench.changefeed().await?,
        Workload::ChangefeedCatchUp => bench.changefeed_catch_up().await?,
        Workload::Query => {
            bench.preload().await?;
            bench.queries().await?
        }
        Workload::Ratios => {
            bench.preload().await?;
            bench.ratios().await?
        }
        Workload::EtcdPut
        | Workload::EtcdLeasePut
        | Workload::EtcdExpiry
        | Workload::RedisSet
        | Workload::RedisGet
        | Workload::Recovery
        | Workload::Failover
        | Workload::Takeover
        | Workload::Soak => {
            unreachable!(
                "etcd, redis, recovery, failover and soak workloads return before connecting"
            )
        }
    }
    // Leave the server as it was.
    DatabasesClient::with_interceptor(bench.channels[0].clone(), KeyHeader::of(&bench.args))
        .delete_database(DeleteDatabaseRequest {
            id: DATABASE.into(),
        })
        .await?;
    Ok(())
}

async fn connect(args: &Args) -> Result<Vec<Channel>, tonic::transport::Error> {
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(
            Endpoint::from_shared(format!("http://{}", args.addr))?
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    Ok(channels)
}

/// A fresh database with one collection whose TTL is on (-1): documents expire by their own ttl.
async fn setup(channel: &Channel, args: &Args) -> Result<String, tonic::Status> {
    let mut databases = DatabasesClient::with_interceptor(channel.clone(), KeyHeader::of(args));
    let _ = databases
        .delete_database(DeleteDatabaseRequest {
            id: DATABASE.into(),
        })
        .await;
    databases
        .create_database(CreateDatabaseRequest {
            id: DATABASE.into(),
            ..Default::default()
        })
        .await?;
    let collection = format!("{:?}", args.workload).to_lowercase();
    let (indexing_mode, default_ttl) = match args.indexing.as_str() {
        "consistent" => (v1::IndexingMode::Consistent, Some(-1)),
        "lazy" => (v1::IndexingMode::Lazy, Some(-1)),
        "none" => (v1::IndexingMode::None, None),
        other => {
            return Err(tonic::Status::invalid_argument(format!(
                "--indexing {other}: expected consistent, lazy or none"
            )));
        }
    };
    CollectionsClient::with_interceptor(channel.clone(), KeyHeader::of(args))
        .create_collection(CreateCollectionRequest {
            database: DATABASE.into(),
            id: collection.clone(),
            partition_key_path: "/pk".into(),
            default_ttl,
            indexing_mode: indexing_mode as i32,
            indexing_paths: None,
            must_live: None,
            change_feed_retention: args.feed_retention,
            throughput: args.throughput.map(|ru| mayfly_proto::v1::Throughput {
                manual: Some(f64::from(ru)),
                autoscale_max: None,
            }),
        })
        .await?;
    Ok(collection)
}

struct Bench {
    channels: Vec<Channel>,
    collection: String,
    payloads: Payloads,
    args: Args,
}

/// Groups of 10 documents among `preload` (field `g`).
fn group_count(preload: u64) -> u64 {
    (preload / 10).max(1)
}

fn partition(n: u64) -> String {
    format!("p{}", n % 1024)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A load task's own pseudo-random numbers (xorshift64), seeded from its number: cheap, and
/// the same sequence on every run.
pub(crate) struct WorkerRng(u64);

impl WorkerRng {
    pub(crate) fn new(seed: u64) -> Self {
        WorkerRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Splits 0..n into `parts` contiguous ranges.
fn split(n: u64, parts: usize) -> impl Iterator<Item = (usize, std::ops::Range<u64>)> {
    let parts = parts.max(1) as u64;
    (0..parts).map(move |p| (p as usize, n * p / parts..n * (p + 1) / parts))
}

impl Bench {
    /// Connects to `args.addr` and makes a fresh database and collection (see [`setup`]).
    async fn start(args: Args) -> Result<Self, Box<dyn std::error::Error>> {
        let channels = connect(&args).await?;
        let collection = setup(&channels[0], &args).await?;
        Ok(Bench {
            channels,
            collection,
            payloads: Payloads::new(args.doc_bytes.saturating_sub(80)),
            args,
        })
    }

    /// Where the server's CPU time is read ([`cpu::Source::of`]).
    fn cpu(&self) -> cpu::Source {
        cpu::Source::of(&self.args, cpu::Server::Mayfly)
    }

    fn documents(&self, worker: usize) -> DocumentsClient<Authorized> {
        DocumentsClient::with_interceptor(
            self.channels[worker % self.channels.len()].clone(),
            KeyHeader::of(&self.args),
        )
    }

    fn create_request(&self, n: u64, ttl: i64) -> CreateDocumentRequest {
        let mut body = Map::new();
        body.insert("id".into(), Value::String(format!("d{n}")));
        body.insert("pk".into(), Value::String(partition(n)));
        body.insert(
            "payload".into(),
            Value::String(self.payloads.get(n).to_owned()),
        );
        body.insert("n".into(), json!(n));
        body.insert("g".into(), json!(n % group_count(self.args.preload)));
        for i in 5..self.args.properties {
            let value = if i % 2 == 0 {
                json!(n.wrapping_mul(i as u64) % 1000)
            } else {
                json!(format!("v{}", n % 97))
            };
            body.insert(format!("f{i}"), value);
        }
        CreateDocumentRequest {
            database: DATABASE.into(),
            collection: self.collection.clone(),
            body: Some(JsonObject::new(body)),
            partition_key: None,
            ttl: Some(ttl),
            ..Default::default()
        }
    }

    fn read_request(&self, n: u64) -> ReadDocumentRequest {
        ReadDocumentRequest {
            database: DATABASE.into(),
            collection: self.collection.clone(),
            id: format!("d{n}"),
            partition_key: Some(v1::PartitionKey {
                kind: Some(PartitionKeyKind::Value(mayfly_proto::json::JsonValue::new(
                    Value::String(partition(n)),
                ))),
            }),
        }
    }

    /// Writes documents 0..preload with a long ttl, `concurrency` at a time.
    async fn preload(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let started = Instant::now();
        self.load(self.args.preload, Arc::new(|_| 86_400)).await?;
        println!(
            "# preloaded {} documents in {:.1} s",
            self.args.preload,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Creates documents 0..count, `concurrency` at a time; `ttl_of(n)` gives each one's ttl.
    /// Loads `count` documents whose expiry instants fall within `--window-secs` from
    /// `first_expiry` (Unix ms). Document n targets second (n mod window) of the window. A ttl
    /// is whole seconds, so expiry = write instant + ttl lands in [target, target + 1 s) at a
    /// sub-second offset set by when the write happened: over many documents, an even spread
    /// across the window.
    async fn load_expiring(
        self: &Arc<Self>,
        count: u64,
        first_expiry: u64,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let window_secs = self.args.window_secs.max(1);
        self.load(
            count,
            Arc::new(move |n| {
                let target = first_expiry + (n % window_secs) * 1_000;
                target.saturating_sub(now_ms()).div_ceil(1_000).max(1) as i64
            }),
        )
        .await
    }

    async fn load(
        self: &Arc<Self>,
        count: u64,
        ttl_of: Arc<dyn Fn(u64) -> i64 + Send + Sync>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tasks: Vec<_> = split(count, self.args.concurrency)
            .map(|(worker, range)| {
                let (bench, ttl_of) = (self.clone(), ttl_of.clone());
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    for n in range {
                        client
                            .create_document(bench.create_request(n, ttl_of(n)))
                            .await?;
                    }
                    Ok::<_, tonic::Status>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        Ok(())
    }

    /// Runs reads (`read_percent` of requests) and writes-with-ttl for the configured duration;
    /// returns the reads' throughput (per second).
    async fn timed(self: &Arc<Self>, read_percent: u8) -> Result<f64, Box<dyn std::error::Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let next_write = Arc::new(AtomicU64::new(self.args.preload));
        let errors = Arc::new(AtomicU64::new(0));
        let cpu = self.cpu().start().await;
        let deadline = Instant::now() + Duration::from_secs(self.args.duration);
        let started = Instant::now();
        let tasks: Vec<_> = (0..self.args.concurrency)
            .map(|worker| {
                let (bench, stop, next_write, errors) = (
                    self.clone(),
                    stop.clone(),
                    next_write.clone(),
                    errors.clone(),
                );
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    let mut health = (bench.args.workload == Workload::Health).then(|| {
                        HealthClient::new(bench.channels[worker % bench.channels.len()].clone())
                    });
                    let mut reads = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut writes = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut rng = WorkerRng::new(worker as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        let r = rng.next();
                        let read = (r % 100) < u64::from(read_percent);
                        let started = Instant::now();
                        let ok = if let Some(health) = &mut health {
                            health.check(HealthCheckRequest::default()).await.is_ok()
                        } else if read {
                            client
                                .read_document(bench.read_request(r % bench.args.preload.max(1)))
                                .await
                                .is_ok()
                        } else {
                            let n = next_write.fetch_add(1, Ordering::Relaxed);
                            client
                                .create_document(bench.create_request(n, bench.args.ttl))
                                .await
                                .is_ok()
                        };
                        let micros = started.elapsed().as_micros() as u64;
                        if !ok {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = if read {
                            reads.record(micros)
                        } else {
                            writes.record(micros)
                        };
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    (reads, writes)
                })
            })
            .collect();
        let mut reads = Histogram::<u64>::new(3)?;
        let mut writes = Histogram::<u64>::new(3)?;
        for task in tasks {
            let (r, w) = task.await?;
            reads.add(r)?;
            writes.add(w)?;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let read_name = match self.args.workload {
            Workload::Health => "health-check",
            _ => "read",
        };
        report(read_name, &reads, elapsed);
        report("write-with-ttl", &writes, elapsed);
        cpu.report("operation", reads.len() + writes.len()).await;
        println!("errors: {}", errors.load(Ordering::Relaxed));
        Ok(reads.len() as f64 / elapsed)
    }

    /// Loads documents whose expiry instants fall in [first, first + window), then follows the
    /// purge through the server's metrics.
    async fn expiry(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let metrics_addr = self
            .args
            .metrics
            .ok_or("expiry needs --metrics (the server's --metrics-listen)")?;
        let k = self.args.documents;
        let window_ms = self.args.window_secs.max(1) * 1_000;
        let before_load = metrics::scrape(metrics_addr).await?;
        let first_expiry = now_ms() + self.args.lead_secs * 1_000;
        let started = Instant::now();
        let load_cpu = self.cpu().start().await;
        let window_secs = self.args.window_secs.max(1);
        self.load_expiring(k, first_expiry).await?;
        let load_secs = started.elapsed().as_secs_f64();
        println!(
            "# loaded {k} documents in {load_secs:.1} s ({:.0} writes/s)",
            k as f64 / load_secs
        );
        load_cpu.report("write-with-ttl (loading)", k).await;
        if now_ms() >= first_expiry {
            return Err(format!(
                "loading took longer than --lead-secs {}: expiries overlapped the load; rerun with a larger lead",
                self.args.lead_secs
            )
            .into());
        }
        let loaded = metrics::scrape(metrics_addr).await?;
        let tracked = loaded.value("mayfly_expiry_tracked_documents")
            - before_load.value("mayfly_expiry_tracked_documents");
        let bookkeeping = loaded.value("mayfly_expiry_bookkeeping_bytes")
            - before_load.value("mayfly_expiry_bookkeeping_bytes");
        let rss = loaded.value("mayfly_process_resident_memory_bytes")
            - before_load.value("mayfly_process_resident_memory_bytes");
        println!(
            "expiry bookkeeping: {:.1} bytes/document ({bookkeeping:.0} B allocated for {tracked:.0} timed documents); \
             whole process RSS grew {:.0} B/document",
            bookkeeping / tracked.max(1.0),
            rss / k as f64
        );

        let subscribers = match self.args.feed_subscribers {
            0 => None,
            n => Some(self.subscribe(n).await?),
        };
        // Follow the purge from the first expiry until all k are gone.
        let baseline = metrics::scrape(metrics_addr).await?;
        tokio::time::sleep(Duration::from_millis(first_expiry.saturating_sub(now_ms()))).await;
        let purge_cpu = self.cpu().start().await;
        let give_up = Instant::now() + Duration::from_millis(window_ms) + Duration::from_secs(120);
        let mut last = baseline.clone();
        let mut done_at = None;
        while Instant::now() < give_up {
            last = metrics::scrape(metrics_addr).await?;
            if last.value("mayfly_documents_purged_total")
                - baseline.value("mayfly_documents_purged_total")
                >= k as f64
            {
                done_at = Some(now_ms());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let purged = last.value("mayfly_documents_purged_total")
            - baseline.value("mayfly_documents_purged_total");
        let Some(done_at) = done_at else {
            return Err(
                format!("only {purged} of {k} documents purged within the window + 120 s").into(),
            );
        };
        // From the first expiry until the last is purged: the purge's CPU (and the idle
        // server's, which is all but nothing).
        purge_cpu.report("purged document", purged as u64).await;
        let busy_secs = (done_at - first_expiry) as f64 / 1_000.0;
        println!(
            "expiry rate offered: {:.0} documents/s ({k} expiring over {window_secs} s)",
            k as f64 / window_secs as f64
        );
        println!(
            "purge: {purged:.0} documents in {busy_secs:.2} s after the first expiry = {:.0} documents/s",
            purged / busy_secs
        );
        let lag = last.histogram_delta("mayfly_purge_lag_seconds", &baseline);
        for q in [0.5, 0.99, 0.999] {
            let (estimate, bound) = metrics::quantile(&lag, q);
            // No document waited longer than from the first expiry to the last purge, which
            // a wide bucket's interpolation can overshoot.
            let (shown, capped) = if estimate > busy_secs {
                (
                    busy_secs,
                    format!(
                        "; capped at the {busy_secs:.2} s from the first expiry to the last purge"
                    ),
                )
            } else {
                (estimate, String::new())
            };
            println!(
                "purge lag p{}: {:.1} ms (interpolated; bucket bound {:.0} ms{capped})",
                q * 100.0,
                shown * 1_000.0,
                bound * 1_000.0
            );
        }
        if let Some(subscribers) = subscribers {
            subscribers.report().await?;
        }
        println!(
            "expiry run took {:.1} s in all",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

fn report(name: &str, h: &Histogram<u64>, elapsed: f64) {
    if h.is_empty() {
        return;
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
    println!(
        "{name}: {:.0} ops/s ({} in {elapsed:.1} s), latency p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms",
        h.len() as f64 / elapsed,
        h.len(),
        ms(0.5),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1_000.0
    );
}
