//! The `throttle` workload: issue 29's acceptance figures for provisioned throughput, against
//! a running server (`--addr`, with its metrics at `--metrics`).
//!
//! 1. **Rate held.** The workload's collection, provisioned `--throughput` RU/s (manual,
//!    default 1,000), is offered 5× its budget for `--duration` seconds: small document
//!    writes (`--doc-bytes`, default 200 here) from `--concurrency` tasks paced so that the
//!    offered RU/s is 5 × the budget (the per-write cost is read from a first write's
//!    `x-request-charge`). Prints the RU consumed per second (the charges of the admitted
//!    writes over the elapsed time) and its ratio to the budget, the writes admitted and
//!    throttled (`RESOURCE_EXHAUSTED` / `REQUEST_RATE_TOO_LARGE`), the throttled answers
//!    without a `retry-after-ms` > 0, and, reading back every throttled id (NOT_FOUND
//!    expected), the throttled writes that changed something.
//! 2. **Neighbour unharmed.** A second collection without throughput, `--preload` documents:
//!    point reads at `--concurrency` for `--duration` seconds alone (after as long again to
//!    let the preload settle), then again while (1)'s flood runs beside them, then alone
//!    again (the runs' own drift). Prints the p99s and their ratios.
//! 3. **Expiry on time while throttled.** `--documents` documents expiring within
//!    `--window-secs`, `--lead-secs` after the load began (as `expiry`), loaded into a
//!    collection without throughput, which `Databases/ReplaceThroughput` then provisions
//!    `--throughput`, flooded at 5× with writes of other documents (a day's ttl) until the
//!    purge is done; then the same in a collection never throttled while the same flood goes
//!    to another collection provisioned the same (the same load on the machine: only whose
//!    budget is spent differs). Prints both purge lags (the server's
//!    `mayfly_purge_lag_seconds`) side by side.
//!
//! Every load loop stops at a deadline and after a bounded number of requests.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use clap::{ArgMatches, parser::ValueSource};
use hdrhistogram::Histogram;
use mayfly_proto::v1::{
    self, CreateCollectionRequest, ReplaceThroughputRequest,
    client::{CollectionsClient, DatabasesClient},
};
use tonic::{Code, Status, metadata::MetadataMap};
use tonic_types::StatusExt as _;

use crate::{Args, Bench, DATABASE, KeyHeader, WorkerRng, metrics, now_ms, report};

/// Offered load as a multiple of the budget.
const OVERLOAD: f64 = 5.0;
/// The budget when `--throughput` is not given.
const DEFAULT_THROUGHPUT: u32 = 1_000;
/// `--doc-bytes` when not given: small writes, about 5 RU each.
const DEFAULT_DOC_BYTES: usize = 200;
/// `--documents` when not given.
const DEFAULT_DOCUMENTS: u64 = 100_000;
/// The flood's document ids start here, far above any preloaded one.
const FLOOD_IDS: u64 = 1_000_000_000;
/// The ttl of the flood's writes: none expires during the run.
const LONG_TTL: i64 = 86_400;
/// Each request of the flood and of the read-back gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The point reads' cap per task and second of `--duration` (far above what a task does).
const MAX_READS_PER_TASK_SECOND: u64 = 1_000_000;
/// The budget a collection is raised to before its throttled writes are read back once its
/// figures are taken (`Databases/ReplaceThroughput`'s maximum).
const VERIFY_THROUGHPUT: u32 = 1_000_000;
/// Admitted writes read back as a control of the read-back, per flood (at most).
const CONTROL_SAMPLE: usize = 200;
/// The metrics series of the server's per-collection figures.
const CONSUMED: &str = "mayfly_request_units_consumed_total";
const THROTTLED: &str = "mayfly_requests_throttled_total";
const PROVISIONED: &str = "mayfly_provisioned_request_units_per_second";

/// `throttle`'s own defaults, where the command line gave none: `--throughput` 1,000,
/// `--doc-bytes` 200 and `--documents` 100,000.
pub(crate) fn defaults(args: &mut Args, matches: &ArgMatches) {
    let defaulted = |id: &str| matches.value_source(id) != Some(ValueSource::CommandLine);
    args.throughput.get_or_insert(DEFAULT_THROUGHPUT);
    if defaulted("doc_bytes") {
        args.doc_bytes = DEFAULT_DOC_BYTES;
    }
    if defaulted("documents") {
        args.documents = DEFAULT_DOCUMENTS;
    }
}

/// The `ErrorInfo` reason of `status`, if it carries one.
fn reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
}

/// `x-request-charge`, in RU.
fn charge(metadata: &MetadataMap) -> Option<f64> {
    metadata
        .get("x-request-charge")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// `retry-after-ms`, if it is there and a number.
fn retry_after_ms(metadata: &MetadataMap) -> Option<u64> {
    metadata.get("retry-after-ms")?.to_str().ok()?.parse().ok()
}

/// Whether `status` is a throttle: `RESOURCE_EXHAUSTED` / `REQUEST_RATE_TOO_LARGE`.
fn throttled(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted
        && reason(status).as_deref() == Some("REQUEST_RATE_TOO_LARGE")
}

/// What one flood (or one of its tasks) saw.
#[derive(Debug)]
struct Flood {
    /// Requests sent, answered or not.
    sent: u64,
    admitted: u64,
    throttled: u64,
    /// Throttled answers without a `retry-after-ms` > 0.
    no_retry_after: u64,
    /// Admitted answers without a readable `x-request-charge`.
    no_charge: u64,
    /// Other failures (timeouts included), and the first one's text.
    errors: u64,
    first_error: Option<String>,
    /// RU charged to the admitted writes, in all and in each second from the start.
    consumed: f64,
    per_second: Vec<f64>,
    /// Ids of the throttled writes, and of the admitted ones.
    throttled_ids: Vec<u64>,
    admitted_ids: Vec<u64>,
    /// Latency of the admitted and of the throttled answers, in µs.
    admitted_latency: Histogram<u64>,
    throttled_latency: Histogram<u64>,
    elapsed: f64,
}

impl Flood {
    fn new() -> Self {
        Flood {
            sent: 0,
            admitted: 0,
            throttled: 0,
            no_retry_after: 0,
            no_charge: 0,
            errors: 0,
            first_error: None,
            consumed: 0.0,
            per_second: Vec::new(),
            throttled_ids: Vec::new(),
            admitted_ids: Vec::new(),
            admitted_latency: Histogram::new(3).expect("valid histogram"),
            throttled_latency: Histogram::new(3).expect("valid histogram"),
            elapsed: 0.0,
        }
    }

    fn add(&mut self, other: Flood) {
        self.sent += other.sent;
        self.admitted += other.admitted;
        self.throttled += other.throttled;
        self.no_retry_after += other.no_retry_after;
        self.no_charge += other.no_charge;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.consumed += other.consumed;
        if self.per_second.len() < other.per_second.len() {
            self.per_second.resize(other.per_second.len(), 0.0);
        }
        for (mine, theirs) in self.per_second.iter_mut().zip(&other.per_second) {
            *mine += theirs;
        }
        self.throttled_ids.extend(other.throttled_ids);
        self.admitted_ids.extend(other.admitted_ids);
        let _ = self.admitted_latency.add(&other.admitted_latency);
        let _ = self.throttled_latency.add(&other.throttled_latency);
    }

    fn consumed_per_second(&self) -> f64 {
        self.consumed / self.elapsed.max(1e-9)
    }

    /// Prints what the flood saw, against `budget` RU/s offered `offered` RU/s.
    fn print(&self, label: &str, budget: u32, offered: f64) {
        let elapsed = self.elapsed.max(1e-9);
        println!(
            "{label}: offered {offered:.0} RU/s ({:.0} writes/s sent, {} in {elapsed:.1} s); \
             admitted {} ({:.0}/s), throttled {} ({:.0}/s), other errors {}",
            self.sent as f64 / elapsed,
            self.sent,
            self.admitted,
            self.admitted as f64 / elapsed,
            self.throttled,
            self.throttled as f64 / elapsed,
            self.errors
        );
        if let Some(error) = &self.first_error {
            println!("{label}: first other error: {error}");
        }
        let consumed = self.consumed_per_second();
        println!(
            "{label}: consumed {consumed:.1} RU/s ({:.1} RU in {elapsed:.1} s) = {:.3} x the {budget} RU/s provisioned (target 1.00 +/- 0.05)",
            self.consumed,
            consumed / f64::from(budget)
        );
        // The bucket starts full (a fifth of a second of budget): past the first second the
        // rate is the steady one.
        if self.per_second.len() > 2 {
            let full = &self.per_second[1..self.per_second.len() - 1];
            let steady = full.iter().sum::<f64>() / full.len() as f64;
            let min = full.iter().copied().fold(f64::INFINITY, f64::min);
            let max = full.iter().copied().fold(0.0, f64::max);
            println!(
                "{label}: per whole second after the first: mean {steady:.1} RU/s = {:.3} x budget, \
                 min {min:.1}, max {max:.1}; first second {:.1} RU (the bucket starts with a fifth of a second's budget)",
                steady / f64::from(budget),
                self.per_second[0]
            );
        }
        println!(
            "{label}: throttled answers without retry-after-ms > 0: {} of {} (target 0); admitted answers without x-request-charge: {}",
            self.no_retry_after, self.throttled, self.no_charge
        );
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
        if !self.admitted_latency.is_empty() {
            println!(
                "{label}: latency admitted p50 {:.2} ms p99 {:.2} ms; throttled p50 {:.2} ms p99 {:.2} ms",
                ms(&self.admitted_latency, 0.5),
                ms(&self.admitted_latency, 0.99),
                ms(&self.throttled_latency, 0.5),
                ms(&self.throttled_latency, 0.99)
            );
        }
    }
}

/// The read-back of throttled writes.
#[derive(Debug, Default)]
struct Verified {
    /// Ids read back NOT_FOUND.
    absent: u64,
    /// Ids found (for throttled writes: violations, writes that were applied).
    found: u64,
    /// Ids not settled (other errors, or the read-back ran out of time), and the first error.
    unsettled: u64,
    first_error: Option<String>,
    /// Of the control sample of admitted writes, those not read back (the read-back would
    /// miss a violation too).
    control_missing: u64,
}

/// A purge followed through the server's metrics.
struct Purge {
    purged: f64,
    /// From the first expiry instant to the last document purged.
    busy_secs: f64,
    /// (quantile, interpolated lag in s, its bucket's bound in s, capped at `busy_secs`).
    lags: Vec<(f64, f64, f64, bool)>,
}

/// The point reads of one phase.
struct Reads {
    histogram: Histogram<u64>,
    elapsed: f64,
    errors: u64,
}

impl Reads {
    fn p(&self, q: f64) -> f64 {
        self.histogram.value_at_quantile(q) as f64 / 1_000.0
    }
}

impl Bench {
    /// Runs the three parts and prints the figures.
    pub(crate) async fn throttle(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let metrics_addr = self
            .args
            .metrics
            .ok_or("throttle needs --metrics (the server's --metrics-listen)")?;
        let budget = self.args.throughput.unwrap_or(DEFAULT_THROUGHPUT);
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        println!(
            "# throttle: budget {budget} RU/s, offered {OVERLOAD}x, --duration {} s, --concurrency {}, \
             --preload {} (neighbour), --documents {} expiring within {} s, {} s after their load began",
            self.args.duration,
            self.args.concurrency,
            self.args.preload,
            self.args.documents,
            self.args.window_secs.max(1),
            self.args.lead_secs
        );

        // What one write costs: a first write, admitted by the full bucket.
        let probe = self
            .documents(0)
            .create_document(self.create_request(FLOOD_IDS - 1, LONG_TTL))
            .await?;
        let cost = charge(probe.metadata()).ok_or("a write's answer has no x-request-charge")?;
        let offered = OVERLOAD * f64::from(budget);
        let rate = offered / cost;
        println!(
            "# one write of ~{} B costs {cost} RU: offering {rate:.0} writes/s = {offered:.0} RU/s",
            self.args.doc_bytes
        );
        // Let the bucket refill after the probe.
        tokio::time::sleep(Duration::from_millis(500)).await;

        // 1. Rate held.
        println!(
            "## 1. rate held: collection {} at {budget} RU/s",
            self.collection
        );
        let duration = Duration::from_secs(self.args.duration);
        let before = metrics::scrape(metrics_addr).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flood, next_id) = self.flood(rate, duration, FLOOD_IDS, stop).await;
        let after = metrics::scrape(metrics_addr).await?;
        flood.print("flood", budget, offered);
        self.print_server_side(&before, &after, &self.collection, flood.elapsed);
        let verified = self.check_flood("flood", &flood, budget).await;
        let rate_held = flood.consumed_per_second() / f64::from(budget);
        let mut violations = verified.found;
        let mut unsettled = verified.unsettled + verified.control_missing;
        let mut no_retry_after = flood.no_retry_after;

        // 2. Neighbour unharmed.
        let neighbour = self.on("neighbour");
        neighbour.create_collection(None).await?;
        println!(
            "## 2. neighbour: collection {} without throughput, {} documents",
            neighbour.collection, self.args.preload
        );
        neighbour.preload().await?;
        // The storage settles after the preload (flushes, compactions) while the documents are
        // read once into the caches, as `ratios` does: not compared.
        let settling = neighbour.point_reads().await;
        report(
            "neighbour point read, settling after the preload (not compared)",
            &settling.histogram,
            settling.elapsed,
        );
        let cpu = self.cpu().start().await;
        let alone = neighbour.point_reads().await;
        report(
            "neighbour point read, alone",
            &alone.histogram,
            alone.elapsed,
        );
        cpu.report("point read (alone)", alone.histogram.len())
            .await;
        println!("neighbour errors, alone: {}", alone.errors);
        let cpu = self.cpu().start().await;
        let stop = Arc::new(AtomicBool::new(false));
        let flooding = {
            let bench = self.clone();
            tokio::spawn(async move { bench.flood(rate, duration, next_id, stop).await })
        };
        let beside = neighbour.point_reads().await;
        let (flood, _) = flooding.await?;
        report(
            "neighbour point read, beside the flood",
            &beside.histogram,
            beside.elapsed,
        );
        cpu.report(
            "point read (beside the flood, its writes not counted)",
            beside.histogram.len(),
        )
        .await;
        println!("neighbour errors, beside the flood: {}", beside.errors);
        // Alone again: how far the neighbour's own figures drift from one run to the next.
        let again = neighbour.point_reads().await;
        report(
            "neighbour point read, alone again (the drift between runs)",
            &again.histogram,
            again.elapsed,
        );
        flood.print("flood beside the neighbour", budget, offered);
        let verified = self
            .check_flood("flood beside the neighbour", &flood, budget)
            .await;
        violations += verified.found;
        unsettled += verified.unsettled + verified.control_missing;
        no_retry_after += flood.no_retry_after;
        let p99_ratio = beside.p(0.99) / alone.p(0.99);
        println!(
            "neighbour p99: alone {:.2} ms, beside the flood {:.2} ms, ratio {p99_ratio:.2} (target <= 1.20); \
             p50 {:.2} -> {:.2} ms; ops/s {:.0} -> {:.0}",
            alone.p(0.99),
            beside.p(0.99),
            alone.p(0.5),
            beside.p(0.5),
            alone.histogram.len() as f64 / alone.elapsed,
            beside.histogram.len() as f64 / beside.elapsed
        );
        println!(
            "neighbour p99 alone again {:.2} ms: beside the flood / alone again {:.2}, alone again / alone {:.2} (the runs' own noise)",
            again.p(0.99),
            beside.p(0.99) / again.p(0.99),
            again.p(0.99) / alone.p(0.99)
        );

        // 3. Expiry on time while throttled.
        println!(
            "## 3. expiry while throttled: {} documents each, in a collection provisioned {budget} RU/s \
             (by ReplaceThroughput, after the load) and flooded at {OVERLOAD}x, then in one never throttled \
             while another collection provisioned the same gets the same flood",
            self.args.documents
        );
        let throttled_expiry = self.on("expiry-throttled");
        throttled_expiry.create_collection(None).await?;
        let (flooded, flood) = throttled_expiry
            .expiry_phase(metrics_addr, Some((budget, rate)), None)
            .await?;
        if let Some(flood) = &flood {
            flood.print("flood during the purge", budget, offered);
            // Its figures taken, the collection is raised so that the read-back is quick.
            throttled_expiry
                .replace_throughput(VERIFY_THROUGHPUT)
                .await?;
            let verified = throttled_expiry
                .check_flood("flood during the purge", flood, VERIFY_THROUGHPUT)
                .await;
            violations += verified.found;
            unsettled += verified.unsettled + verified.control_missing;
            no_retry_after += flood.no_retry_after;
        }
        // The control: the same flood, on another collection, beside the purge of one never
        // throttled. What differs from the above is only whose budget is spent: the purge's
        // own collection's, or another's.
        let free_expiry = self.on("expiry-free");
        free_expiry.create_collection(None).await?;
        let elsewhere = self.on("expiry-flood-elsewhere");
        elsewhere.create_collection(None).await?;
        let (free, _) = free_expiry
            .expiry_phase(metrics_addr, Some((budget, rate)), Some(elsewhere))
            .await?;

        println!("## summary (issue 29 acceptance); reproduce: {command}");
        println!(
            "1. rate held: {:.1} RU/s consumed of {budget} provisioned, ratio {rate_held:.3} (target 1.00 +/- 0.05): {}",
            rate_held * f64::from(budget),
            verdict((rate_held - 1.0).abs() <= 0.05)
        );
        println!(
            "1. throttled answers without retry-after-ms > 0: {no_retry_after} (target 0): {}",
            verdict(no_retry_after == 0)
        );
        println!(
            "1. throttled writes that changed something: {violations} (target 0; {unsettled} not settled or control misses): {}",
            verdict(violations == 0 && unsettled == 0)
        );
        println!(
            "2. neighbour point-read p99 {:.2} ms alone, {:.2} ms beside the flood: ratio {p99_ratio:.2} (target <= 1.20): {}",
            alone.p(0.99),
            beside.p(0.99),
            verdict(p99_ratio <= 1.20)
        );
        println!(
            "3. purge of {} documents            throttled + flooded   never throttled (another flooded)",
            self.args.documents
        );
        println!(
            "   first expiry to last purge       {:>10.2} s          {:>10.2} s",
            flooded.busy_secs, free.busy_secs
        );
        for (a, b) in flooded.lags.iter().zip(&free.lags) {
            println!(
                "   purge lag p{:<5}                 {:>10.1} ms         {:>10.1} ms   (bucket bounds {:.0} / {:.0} ms{})",
                a.0 * 100.0,
                a.1 * 1_000.0,
                b.1 * 1_000.0,
                a.2 * 1_000.0,
                b.2 * 1_000.0,
                if a.3 || b.3 { "; capped" } else { "" }
            );
        }
        Ok(())
    }

    /// This bench's connections and settings, on another collection of its database.
    fn on(self: &Arc<Self>, collection: &str) -> Arc<Bench> {
        Arc::new(Bench {
            channels: self.channels.clone(),
            collection: collection.to_owned(),
            payloads: self.payloads.clone(),
            args: self.args.clone(),
        })
    }

    /// Creates this bench's collection as `setup` does the workload's (TTL on, -1), with
    /// `throughput` RU/s if given.
    async fn create_collection(&self, throughput: Option<u32>) -> Result<(), Status> {
        CollectionsClient::with_interceptor(self.channels[0].clone(), KeyHeader::of(&self.args))
            .create_collection(CreateCollectionRequest {
                database: DATABASE.into(),
                id: self.collection.clone(),
                partition_key_path: "/pk".into(),
                default_ttl: Some(-1),
                indexing_mode: v1::IndexingMode::Consistent as i32,
                indexing_paths: None,
                must_live: None,
                change_feed_retention: self.args.feed_retention,
                throughput: throughput.map(|ru| v1::Throughput {
                    manual: Some(f64::from(ru)),
                    autoscale_max: None,
                }),
            })
            .await?;
        Ok(())
    }

    /// Provisions this bench's collection `ru` RU/s (manual), by `Databases/ReplaceThroughput`.
    async fn replace_throughput(&self, ru: u32) -> Result<v1::ThroughputProperties, Status> {
        Ok(
            DatabasesClient::with_interceptor(self.channels[0].clone(), KeyHeader::of(&self.args))
                .replace_throughput(ReplaceThroughputRequest {
                    database: DATABASE.into(),
                    collection: self.collection.clone(),
                    throughput: Some(v1::Throughput {
                        manual: Some(f64::from(ru)),
                        autoscale_max: None,
                    }),
                })
                .await?
                .into_inner(),
        )
    }

    /// Writes new documents (ids from `first_id`, a day's ttl) at `rate` per second, paced
    /// over `--concurrency` tasks, for `max` or until `stop`; returns what it saw and the
    /// first id it did not use.
    async fn flood(
        self: &Arc<Self>,
        rate: f64,
        max: Duration,
        first_id: u64,
        stop: Arc<AtomicBool>,
    ) -> (Flood, u64) {
        let tasks_n = self.args.concurrency.max(1) as u64;
        // Task w sends the flood's requests w, w + tasks_n, w + 2 tasks_n, ..., request j at
        // j / rate seconds from the start: an even stream at `rate`.
        let period = Duration::from_secs_f64(tasks_n as f64 / rate);
        let per_task = (rate * max.as_secs_f64() / tasks_n as f64).ceil() as u64 + 1;
        let started = Instant::now();
        let deadline = started + max;
        let tasks: Vec<_> = (0..tasks_n)
            .map(|w| {
                let (bench, stop) = (self.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut client = bench.documents(w as usize);
                    let mut seen = Flood::new();
                    let offset = period.mul_f64(w as f64 / tasks_n as f64);
                    for i in 0..per_task {
                        let at = started + offset + period.mul_f64(i as f64);
                        if at >= deadline || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        tokio::time::sleep_until(at.into()).await;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let n = first_id + i * tasks_n + w;
                        let sent = Instant::now();
                        seen.sent += 1;
                        let answer = tokio::time::timeout(
                            REQUEST_TIMEOUT,
                            client.create_document(bench.create_request(n, LONG_TTL)),
                        )
                        .await;
                        let micros = sent.elapsed().as_micros() as u64;
                        match answer {
                            Ok(Ok(response)) => {
                                seen.admitted += 1;
                                seen.admitted_ids.push(n);
                                let _ = seen.admitted_latency.record(micros);
                                match charge(response.metadata()) {
                                    Some(ru) => {
                                        seen.consumed += ru;
                                        let second = started.elapsed().as_secs() as usize;
                                        if seen.per_second.len() <= second {
                                            seen.per_second.resize(second + 1, 0.0);
                                        }
                                        seen.per_second[second] += ru;
                                    }
                                    None => seen.no_charge += 1,
                                }
                            }
                            Ok(Err(status)) if throttled(&status) => {
                                seen.throttled += 1;
                                let _ = seen.throttled_latency.record(micros);
                                seen.throttled_ids.push(n);
                                if retry_after_ms(status.metadata()).is_none_or(|ms| ms == 0) {
                                    seen.no_retry_after += 1;
                                }
                            }
                            Ok(Err(status)) => {
                                seen.errors += 1;
                                seen.first_error.get_or_insert_with(|| {
                                    format!(
                                        "{:?} {:?}: {}",
                                        status.code(),
                                        reason(&status),
                                        status.message()
                                    )
                                });
                            }
                            Err(_) => {
                                seen.errors += 1;
                                seen.first_error.get_or_insert_with(|| {
                                    format!("no answer within {REQUEST_TIMEOUT:?}")
                                });
                            }
                        }
                    }
                    seen
                })
            })
            .collect();
        let mut all = Flood::new();
        for task in tasks {
            match task.await {
                Ok(seen) => all.add(seen),
                Err(e) => {
                    all.errors += 1;
                    all.first_error
                        .get_or_insert_with(|| format!("a flood task failed: {e}"));
                }
            }
        }
        all.elapsed = started.elapsed().as_secs_f64();
        (all, first_id + per_task * tasks_n)
    }

    /// Reads back each id in `ids` (NOT_FOUND expected), `--concurrency` at a time, waiting out
    /// the collection's budget (`budget` RU/s) where the read is throttled.
    async fn verify(self: &Arc<Self>, ids: &[u64], budget: u32) -> Verified {
        let started = Instant::now();
        // A read of a missing document costs 1 RU: the budget reads about `budget` a second.
        let deadline = started
            + Duration::from_secs(30)
            + Duration::from_secs_f64(2.0 * ids.len() as f64 / f64::from(budget.max(1)));
        let tasks_n = self.args.concurrency.max(1);
        let tasks: Vec<_> = (0..tasks_n)
            .map(|w| {
                let bench = self.clone();
                let mine: Vec<u64> = ids.iter().skip(w).step_by(tasks_n).copied().collect();
                tokio::spawn(async move {
                    let mut client = bench.documents(w);
                    let mut verified = Verified::default();
                    'ids: for n in mine {
                        // Bounded: a throttled read waits its retry-after-ms (at most 1 s) and
                        // tries again, until the deadline.
                        loop {
                            if Instant::now() >= deadline {
                                verified.unsettled += 1;
                                verified
                                    .first_error
                                    .get_or_insert_with(|| "the read-back ran out of time".into());
                                continue 'ids;
                            }
                            let answer = tokio::time::timeout(
                                REQUEST_TIMEOUT,
                                client.read_document(bench.read_request(n)),
                            )
                            .await;
                            match answer {
                                Ok(Ok(_)) => verified.found += 1,
                                Ok(Err(status)) if status.code() == Code::NotFound => {
                                    verified.absent += 1
                                }
                                Ok(Err(status)) if throttled(&status) => {
                                    let ms = retry_after_ms(status.metadata()).unwrap_or(10);
                                    tokio::time::sleep(Duration::from_millis(ms.clamp(1, 1_000)))
                                        .await;
                                    continue;
                                }
                                Ok(Err(status)) => {
                                    verified.unsettled += 1;
                                    verified.first_error.get_or_insert_with(|| {
                                        format!("{:?}: {}", status.code(), status.message())
                                    });
                                }
                                Err(_) => {
                                    verified.unsettled += 1;
                                    verified.first_error.get_or_insert_with(|| {
                                        format!("no answer within {REQUEST_TIMEOUT:?}")
                                    });
                                }
                            }
                            continue 'ids;
                        }
                    }
                    verified
                })
            })
            .collect();
        let mut all = Verified::default();
        for task in tasks {
            match task.await {
                Ok(v) => {
                    all.absent += v.absent;
                    all.found += v.found;
                    all.unsettled += v.unsettled;
                    if all.first_error.is_none() {
                        all.first_error = v.first_error;
                    }
                }
                Err(e) => {
                    all.unsettled += 1;
                    all.first_error
                        .get_or_insert_with(|| format!("a read-back task failed: {e}"));
                }
            }
        }
        println!(
            "# read back {} ids in {:.1} s",
            ids.len(),
            started.elapsed().as_secs_f64()
        );
        all
    }

    /// Point reads of the preloaded documents, `--concurrency` at a time, for `--duration`
    /// seconds.
    async fn point_reads(self: &Arc<Self>) -> Reads {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(self.args.duration);
        let cap = self.args.duration.max(1) * MAX_READS_PER_TASK_SECOND;
        let tasks: Vec<_> = (0..self.args.concurrency.max(1))
            .map(|worker| {
                let bench = self.clone();
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    let mut histogram = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut errors = 0;
                    let mut rng = WorkerRng::new(worker as u64 + 1);
                    for _ in 0..cap {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let n = rng.next() % bench.args.preload.max(1);
                        let sent = Instant::now();
                        if client.read_document(bench.read_request(n)).await.is_err() {
                            errors += 1;
                        }
                        let _ = histogram.record(sent.elapsed().as_micros() as u64);
                    }
                    (histogram, errors)
                })
            })
            .collect();
        let mut reads = Reads {
            histogram: Histogram::new(3).expect("valid histogram"),
            elapsed: 0.0,
            errors: 0,
        };
        for task in tasks {
            match task.await {
                Ok((histogram, errors)) => {
                    let _ = reads.histogram.add(&histogram);
                    reads.errors += errors;
                }
                Err(_) => reads.errors += 1,
            }
        }
        reads.elapsed = started.elapsed().as_secs_f64();
        reads
    }

    /// Loads `--documents` documents expiring within `--window-secs`, `--lead-secs` after the
    /// load began, into this bench's collection (as `expiry` does); with `flood` = (budget,
    /// writes/s), provisions the collection that budget and floods it at that rate until the
    /// purge is done. Follows the purge through the server's metrics.
    async fn expiry_phase(
        self: &Arc<Self>,
        metrics_addr: SocketAddr,
        flood: Option<(u32, f64)>,
        elsewhere: Option<Arc<Bench>>,
    ) -> Result<(Purge, Option<Flood>), Box<dyn std::error::Error>> {
        let k = self.args.documents;
        let window_secs = self.args.window_secs.max(1);
        let first_expiry = now_ms() + self.args.lead_secs * 1_000;
        let started = Instant::now();
        self.load_expiring(k, first_expiry).await?;
        let load_secs = started.elapsed().as_secs_f64();
        println!(
            "# {}: loaded {k} documents in {load_secs:.1} s ({:.0} writes/s)",
            self.collection,
            k as f64 / load_secs
        );
        let stop = Arc::new(AtomicBool::new(false));
        let flooded_elsewhere = elsewhere.is_some();
        let flooding = match flood {
            Some((budget, rate)) => {
                // The flood goes to this collection, provisioned now, or to another one
                // provisioned before (the control: the same load on the machine, this
                // collection's purge beside it).
                let target = elsewhere.unwrap_or_else(|| self.clone());
                let properties = target.replace_throughput(budget).await?;
                let scrape = metrics::scrape(metrics_addr).await?;
                println!(
                    "# {}: ReplaceThroughput {budget} RU/s answered provisioned {:?}; the server's {PROVISIONED} says {}",
                    target.collection,
                    properties.provisioned,
                    scrape.labelled(
                        PROVISIONED,
                        &[("database", DATABASE), ("collection", &target.collection)]
                    )
                );
                // Bounded: until the purge is done, at most until it gives up (below).
                let max = Duration::from_millis(first_expiry.saturating_sub(now_ms()))
                    + Duration::from_secs(window_secs + 130);
                let (bench, stop) = (target, stop.clone());
                Some(tokio::spawn(async move {
                    bench.flood(rate, max, FLOOD_IDS, stop).await.0
                }))
            }
            None => None,
        };
        let purge = self.follow_purge(metrics_addr, k, first_expiry).await;
        stop.store(true, Ordering::Relaxed);
        let flood = match flooding {
            Some(task) => Some(task.await?),
            None => None,
        };
        let purge = purge?;
        println!(
            "# {}: purged {:.0} documents in {:.2} s after the first expiry{}",
            self.collection,
            purge.purged,
            purge.busy_secs,
            match &flood {
                Some(_) if flooded_elsewhere => ", another collection flooded",
                Some(_) => ", flooded",
                None => ", not flooded",
            }
        );
        for &(q, shown, bound, capped) in &purge.lags {
            println!(
                "{}: purge lag p{}: {:.1} ms (interpolated; bucket bound {:.0} ms{})",
                self.collection,
                q * 100.0,
                shown * 1_000.0,
                bound * 1_000.0,
                if capped {
                    format!(
                        "; capped at the {:.2} s from the first expiry to the last purge",
                        purge.busy_secs
                    )
                } else {
                    String::new()
                }
            );
        }
        Ok((purge, flood))
    }

    /// Waits for the first expiry, then for `k` documents purged (as `expiry` does, at most
    /// the window + 120 s); the lag from the server's `mayfly_purge_lag_seconds`.
    async fn follow_purge(
        &self,
        metrics_addr: SocketAddr,
        k: u64,
        first_expiry: u64,
    ) -> Result<Purge, Box<dyn std::error::Error>> {
        if now_ms() >= first_expiry {
            return Err(format!(
                "loading took longer than --lead-secs {}: expiries overlapped the load; rerun with a larger lead",
                self.args.lead_secs
            )
            .into());
        }
        let baseline = metrics::scrape(metrics_addr).await?;
        tokio::time::sleep(Duration::from_millis(first_expiry.saturating_sub(now_ms()))).await;
        let window_ms = self.args.window_secs.max(1) * 1_000;
        let give_up = Instant::now() + Duration::from_millis(window_ms) + Duration::from_secs(120);
        let purged_of = |scrape: &metrics::Scrape| {
            scrape.value("mayfly_documents_purged_total")
                - baseline.value("mayfly_documents_purged_total")
        };
        let mut last = baseline.clone();
        let mut done_at = None;
        while Instant::now() < give_up {
            last = metrics::scrape(metrics_addr).await?;
            if purged_of(&last) >= k as f64 {
                done_at = Some(now_ms());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let purged = purged_of(&last);
        let Some(done_at) = done_at else {
            return Err(
                format!("only {purged} of {k} documents purged within the window + 120 s").into(),
            );
        };
        let busy_secs = (done_at - first_expiry) as f64 / 1_000.0;
        let lag = last.histogram_delta("mayfly_purge_lag_seconds", &baseline);
        let lags = [0.5, 0.99, 0.999]
            .into_iter()
            .map(|q| {
                let (estimate, bound) = metrics::quantile(&lag, q);
                // No document waited longer than from the first expiry to the last purge.
                if estimate > busy_secs {
                    (q, busy_secs, bound, true)
                } else {
                    (q, estimate, bound, false)
                }
            })
            .collect();
        Ok(Purge {
            purged,
            busy_secs,
            lags,
        })
    }

    /// The server's own count of a flood on `collection` between two scrapes.
    fn print_server_side(
        &self,
        before: &metrics::Scrape,
        after: &metrics::Scrape,
        collection: &str,
        elapsed: f64,
    ) {
        let labels = [("database", DATABASE), ("collection", collection)];
        let consumed = after.labelled(CONSUMED, &labels) - before.labelled(CONSUMED, &labels);
        let throttled = after.labelled(THROTTLED, &labels) - before.labelled(THROTTLED, &labels);
        println!(
            "server's metrics: {CONSUMED} +{consumed:.1} RU ({:.1} RU/s over the flood's {elapsed:.1} s, scrapes a little wider), \
             {THROTTLED} +{throttled:.0}, {PROVISIONED} {}",
            consumed / elapsed.max(1e-9),
            after.labelled(PROVISIONED, &labels)
        );
    }
}

impl Bench {
    /// Reads back every throttled write of `flood` (NOT_FOUND expected), and as a control a
    /// sample of its admitted ones (found expected), the collection at `budget` RU/s.
    async fn check_flood(self: &Arc<Self>, label: &str, flood: &Flood, budget: u32) -> Verified {
        let mut verified = self.verify(&flood.throttled_ids, budget).await;
        print_verified(label, flood, &verified);
        let step = flood.admitted_ids.len().div_ceil(CONTROL_SAMPLE).max(1);
        let sample: Vec<u64> = flood.admitted_ids.iter().step_by(step).copied().collect();
        let control = self.verify(&sample, budget).await;
        println!(
            "{label}: control, {} admitted writes read back: {} found (expected all), {} NOT_FOUND, {} not settled",
            sample.len(),
            control.found,
            control.absent,
            control.unsettled
        );
        verified.control_missing = sample.len() as u64 - control.found;
        verified
    }
}

fn print_verified(label: &str, flood: &Flood, verified: &Verified) {
    println!(
        "{label}: throttled writes read back: {} NOT_FOUND, {} found (violations, target 0), {} not settled{}",
        verified.absent,
        verified.found,
        verified.unsettled,
        verified
            .first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    if verified.absent + verified.found + verified.unsettled != flood.throttled_ids.len() as u64 {
        println!(
            "{label}: read back {} of {} throttled ids (a read-back task failed)",
            verified.absent + verified.found + verified.unsettled,
            flood.throttled_ids.len()
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}
