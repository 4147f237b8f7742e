//! The `query` workload: preloads `--preload` documents (each with a unique `n` and a group
//! `g` shared by 10 documents), then runs each query shape for `--duration` seconds with
//! `--concurrency` queries in flight, and prints latency percentiles with the metrics the
//! server reported (documents and index entries examined, the index used); then reads the
//! collection's feed to its end the same way.

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
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "ORDER BY indexed path, TOP 10",
        text: "SELECT TOP 10 * FROM c ORDER BY c.n DESC",
        grouped: false,
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "SELECT VALUE COUNT(1) FROM c",
        text: "SELECT VALUE COUNT(1) FROM c",
        grouped: false,
        concurrent: true,
        feed: false,
    },
    Shape {
        name: "full-scan filter (no index can answer it)",
        text: "SELECT VALUE c.n FROM c WHERE CONTAINS(c.payload, 'zzzzzz')",
        grouped: false,
        concurrent: false,
        feed: false,
    },
    Shape {
        name: "read feed (the whole collection, pages of 1,000)",
        text: "",
        grouped: false,
        concurrent: true,
        feed: true,
    },
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

    async fn run_shape(
        self: &Arc<Self>,
        shape: &'static Shape,
        concurrency: usize,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
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
                        let group = r % group_count(bench.args.preload);
                        let began = Instant::now();
                        match bench.query(&mut client, shape, group).await {
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
        Ok(())
    }

    /// Runs one query to its last page.
    async fn query(
        &self,
        client: &mut DocumentsClient<crate::Authorized>,
        shape: &Shape,
        group: u64,
    ) -> Result<(Seen, String), tonic::Status> {
        if shape.feed {
            return self.feed(client).await;
        }
        let mut parameters = std::collections::HashMap::new();
        if shape.grouped {
            parameters.insert(
                "@g".to_owned(),
                mayfly_proto::json::JsonValue::new(serde_json::json!(group)),
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
