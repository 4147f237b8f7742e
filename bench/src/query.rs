//! The `query` workload: preloads `--preload` documents (each with a unique `n` and a group
//! `g` shared by 10 documents), then runs each query shape for `--duration` seconds with
//! `--concurrency` queries in flight, and prints latency percentiles with the metrics the
//! server reported (documents and index entries examined, the index used); then reads the
//! collection's feed to its end the same way.
//!
//! The `ratios` workload measures, in one run against one server, each indexed query shape's
//! throughput as a ratio of point reads of the same preloaded documents at the same
//! concurrency (issue 24, item 5): point reads before and after each shape, each ratio taken
//! against the mean of the two point-read runs around it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use mayfly_proto::v1::{self, client::DocumentsClient};

use crate::{Bench, group_count};

/// One query shape.
struct Shape {
    name: &'static str,
    text: &'static str,
    /// Takes `@g`, a random group.
    grouped: bool,
    /// Takes `@n`, a random preloaded document's unique number.
    numbered: bool,
    /// Also run at --concurrency (a full scan is measured one at a time: its figure is
    /// documents read per second).
    concurrent: bool,
    /// Not a query: the collection's read feed, every page.
    feed: bool,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "indexed equality (10 documents)",
        text: "SELECT * FROM c WHERE c.g = @g",
        grouped: true,
        numbered: false,
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "ORDER BY indexed path, TOP 10",
        text: "SELECT TOP 10 * FROM c ORDER BY c.n DESC",
        grouped: false,
        numbered: false,
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "SELECT VALUE COUNT(1) FROM c",
        text: "SELECT VALUE COUNT(1) FROM c",
        grouped: false,
        numbered: false,
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "full-scan filter (no index can answer it)",
        text: "SELECT VALUE c.n FROM c WHERE CONTAINS(c.payload, 'zzzzzz')",
        grouped: false,
        numbered: false,
        concurrent: false,
        feed: false,
    },
    Shape {
        name: "read feed (the whole collection, pages of 1,000)",
        text: "",
        grouped: false,
        numbered: false,
        concurrent: true,
        feed: true,
    },
];

/// The `ratios` workload's shapes, each with the least ratio of point-read throughput that
/// issue 24 item 5 asks of it; the last, a query that reads nothing, has none: it measures
/// what the query call itself costs (request, parse, plan, a streamed response).
const RATIO_SHAPES: &[(Shape, Option<f64>)] = &[
    (
        Shape {
            name: "indexed equality (1 document)",
            text: "SELECT * FROM c WHERE c.n = @n",
            grouped: false,
            numbered: true,
            concurrent: true,
            feed: false,
        },
        Some(0.5),
    ),
    (
        Shape {
            name: "indexed equality (10 documents)",
            text: "SELECT * FROM c WHERE c.g = @g",
            grouped: true,
            numbered: false,
            concurrent: true,
            feed: false,
        },
        Some(0.25),
    ),
    (
        Shape {
            name: "ORDER BY indexed path, TOP 10",
            text: "SELECT TOP 10 * FROM c ORDER BY c.n DESC",
            grouped: false,
            numbered: false,
            concurrent: true,
            feed: false,
        },
        Some(0.25),
    ),
    (
        Shape {
            name: "a query that reads nothing (SELECT VALUE 1)",
            text: "SELECT VALUE 1",
            grouped: false,
            numbered: false,
            concurrent: true,
            feed: false,
        },
        None,
    ),
];

/// What one query call returned, summed over its pages.
#[derive(Default, Clone, Copy)]
struct Seen {
    results: u64,
    documents: u64,
    entries: u64,
}

impl Bench {
    pub(crate) async fn queries(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        for shape in SHAPES {
            if shape.concurrent {
                self.run_shape(shape, self.args.concurrency).await?;
            }
            self.run_shape(shape, 1).await?;
        }
        Ok(())
    }

    /// Point reads before and after each of [`RATIO_SHAPES`], all at --concurrency; prints
    /// one `ratio` line per shape, against the mean of the point reads run just before and
    /// just after it. A first round of point reads is not counted: the preload leaves the
    /// storage flushing and compacting for a while, and reads measured then would be compared
    /// with queries measured once it is done.
    pub(crate) async fn ratios(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let concurrency = self.args.concurrency;
        let settling = self.timed(100).await?;
        println!("point reads while the preload settles (not counted): {settling:.0}/s");
        let mut reads = vec![self.timed(100).await?];
        let mut measured = Vec::new();
        for (shape, target) in RATIO_SHAPES {
            if self.args.warm_up {
                let warm = self.run_shape(shape, concurrency).await?;
                println!("warm-up {} (not counted): {warm:.0}/s", shape.name);
            }
            measured.push((shape, *target, self.run_shape(shape, concurrency).await?));
            reads.push(self.timed(100).await?);
        }
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        for (i, (shape, target, per_second)) in measured.into_iter().enumerate() {
            let (before, after) = (reads[i], reads[i + 1]);
            let around = (before + after) / 2.0;
            let ratio = per_second / around.max(f64::MIN_POSITIVE);
            let verdict = match target {
                Some(t) if ratio >= t => format!("target >= {t}x: met"),
                Some(t) => format!("target >= {t}x: NOT met"),
                None => "no target: the query call's own cost".to_owned(),
            };
            println!(
                "ratio {} [{concurrency} in flight]: {per_second:.0} queries/s / {around:.0} reads/s \
                 (point reads {before:.0}/s before, {after:.0}/s after) = {ratio:.3}x \
                 ({verdict}); reproduce: {command}",
                shape.name,
            );
        }
        Ok(())
    }

    /// Runs one shape for --duration seconds; returns its throughput (queries per second).
    async fn run_shape(
        self: &Arc<Self>,
        shape: &'static Shape,
        concurrency: usize,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
        let cpu = self.cpu().start().await;
        let deadline = Instant::now() + Duration::from_secs(self.args.duration);
        let started = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|worker| {
                let (bench, stop, errors) = (self.clone(), stop.clone(), errors.clone());
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    let mut latency = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut total = Seen::default();
                    let mut index = String::new();
                    let mut rng = crate::WorkerRng::new(worker as u64 + 7);
                    while !stop.load(Ordering::Relaxed) {
                        let r = rng.next();
                        let began = Instant::now();
                        match bench.query(&mut client, shape, r).await {
                            Ok((seen, used)) => {
                                let _ = latency.record(began.elapsed().as_micros() as u64);
                                total.results += seen.results;
                                total.documents += seen.documents;
                                total.entries += seen.entries;
                                index = used;
                            }
                            Err(status) => {
                                if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                    eprintln!("{}: {status}", shape.name);
                                }
                            }
                        }
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    (latency, total, index)
                })
            })
            .collect();
        let mut latency = Histogram::<u64>::new(3)?;
        let mut total = Seen::default();
        let mut index = String::new();
        for task in tasks {
            let (h, seen, used) = task.await?;
            latency.add(h)?;
            total.results += seen.results;
            total.documents += seen.documents;
            total.entries += seen.entries;
            if !used.is_empty() {
                index = used;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let calls = latency.len().max(1) as f64;
        let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1_000.0;
        println!(
            "{} [{concurrency} in flight]: {:.0} queries/s ({} in {elapsed:.1} s), p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
             per query: {:.1} results, {:.0} documents and {:.0} index entries examined; index {}; \
             documents examined/s {:.0}; errors {}",
            shape.name,
            latency.len() as f64 / elapsed,
            latency.len(),
            ms(0.5),
            ms(0.99),
            latency.max() as f64 / 1_000.0,
            total.results as f64 / calls,
            total.documents as f64 / calls,
            total.entries as f64 / calls,
            if index.is_empty() {
                "none (scan)"
            } else {
                &index
            },
            total.documents as f64 / elapsed,
            errors.load(Ordering::Relaxed)
        );
        cpu.report("query", latency.len()).await;
        Ok(latency.len() as f64 / elapsed)
    }

    /// Runs one query to its last page.
    async fn query(
        &self,
        client: &mut DocumentsClient<crate::Authorized>,
        shape: &Shape,
        random: u64,
    ) -> Result<(Seen, String), tonic::Status> {
        if shape.feed {
            return self.feed(client).await;
        }
        let mut parameters = std::collections::HashMap::new();
        if shape.grouped {
            parameters.insert(
                "@g".to_owned(),
                mayfly_proto::json::JsonValue::new(serde_json::json!(
                    random % group_count(self.args.preload)
                )),
            );
        }
        if shape.numbered {
            parameters.insert(
                "@n".to_owned(),
                mayfly_proto::json::JsonValue::new(serde_json::json!(
                    random % self.args.preload.max(1)
                )),
            );
        }
        let mut stream = client
            .query(v1::QueryRequest {
                database: crate::DATABASE.into(),
                collection: self.collection.clone(),
                query: shape.text.into(),
                parameters,
                partition_key: None,
                page_size: 1000,
                continuation: String::new(),
                enable_scan: true,
            })
            .await?
            .into_inner();
        let mut seen = Seen::default();
        let mut index = String::new();
        while let Some(page) = stream.message().await? {
            seen.results += page.results.len() as u64;
            if let Some(m) = page.metrics {
                seen.documents += m.documents_examined;
                seen.entries += m.index_entries_examined;
                if m.index_used {
                    index = m.index;
                }
            }
        }
        Ok((seen, index))
    }

    /// Reads the collection's feed to its last page.
    async fn feed(
        &self,
        client: &mut DocumentsClient<crate::Authorized>,
    ) -> Result<(Seen, String), tonic::Status> {
        let mut stream = client
            .read_feed(v1::ReadFeedRequest {
                database: crate::DATABASE.into(),
                collection: self.collection.clone(),
                page_size: 1000,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut seen = Seen::default();
        while let Some(page) = stream.message().await? {
            seen.results += page.documents.len() as u64;
            seen.documents += page.documents.len() as u64;
        }
        Ok((seen, String::new()))
    }
}
