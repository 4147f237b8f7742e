//! The `counter` workload: increments counters with `--concurrency` requests in flight, for
//! `--duration` seconds per run, four runs: patch `incr` on one hot document, patch `incr` over
//! `--counters` documents, and the same two through the read-modify-write loop a client without
//! patch writes (read, add one, replace with `if_match`, start again on an etag conflict).
//! Prints increments per second, latency per increment (retries included), conflicts per
//! increment, and checks that the counters add up to the increments acknowledged.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use mayfly_proto::{
    json::JsonObject,
    v1::{
        self, CreateDocumentRequest, PatchDocumentRequest, PatchIncrement, PatchOperation,
        ReadDocumentRequest, ReplaceDocumentRequest,
        client::DocumentsClient,
        oneofs::{PartitionKeyKind, PatchIncrementBy, PatchOp},
    },
};
use serde_json::{Value, json};
use tonic::Code;

use crate::{Authorized, Bench, DATABASE, partition, report, split};

/// How the counters are incremented.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Patch,
    ReadModifyWrite,
}

fn pk(n: u64) -> Option<v1::PartitionKey> {
    Some(v1::PartitionKey {
        kind: Some(PartitionKeyKind::Value(mayfly_proto::json::JsonValue::new(
            Value::String(partition(n)),
        ))),
    })
}

impl Bench {
    /// Runs the four counter runs.
    pub(crate) async fn counters(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let many = self.args.counters.max(1);
        // Hot counter: document k0; spread counters: k1..=many, created up front.
        let started = Instant::now();
        self.create_counters(0..many + 1).await?;
        println!(
            "# created {} counters in {:.1} s",
            many + 1,
            started.elapsed().as_secs_f64()
        );
        for method in [Method::Patch, Method::ReadModifyWrite] {
            for (label, first, count) in [("1 hot document", 0, 1), ("spread", 1, many)] {
                let name = match method {
                    Method::Patch => "patch incr",
                    Method::ReadModifyWrite => "read-modify-write",
                };
                let label = if count == 1 {
                    label.to_owned()
                } else {
                    format!("{count} documents")
                };
                self.increment(method, first, count, &format!("{name}, {label}"))
                    .await?;
            }
        }
        Ok(())
    }

    async fn create_counters(
        self: &Arc<Self>,
        range: std::ops::Range<u64>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tasks: Vec<_> = split(range.end - range.start, self.args.concurrency)
            .map(|(worker, part)| {
                let bench = self.clone();
                let start = range.start;
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    for n in part {
                        let n = start + n;
                        let mut body = serde_json::Map::new();
                        body.insert("id".into(), Value::String(format!("k{n}")));
                        body.insert("pk".into(), Value::String(partition(n)));
                        body.insert("count".into(), json!(0));
                        client
                            .create_document(CreateDocumentRequest {
                                database: DATABASE.into(),
                                collection: bench.collection.clone(),
                                body: Some(JsonObject::new(body)),
                                partition_key: None,
                                ttl: None,
                                ..Default::default()
                            })
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

    /// Increments counters `first..first + count` (chosen at random) for --duration seconds,
    /// then checks their sum grew by the increments acknowledged.
    async fn increment(
        self: &Arc<Self>,
        method: Method,
        first: u64,
        count: u64,
        name: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let before = self.sum_counters(first, count).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let conflicts = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(self.args.duration);
        let cpu = self.cpu().start().await;
        let started = Instant::now();
        let tasks: Vec<_> = (0..self.args.concurrency)
            .map(|worker| {
                let (bench, stop, conflicts, errors) = (
                    self.clone(),
                    stop.clone(),
                    conflicts.clone(),
                    errors.clone(),
                );
                tokio::spawn(async move {
                    let mut client = bench.documents(worker);
                    let mut latencies = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut rng = crate::WorkerRng::new(worker as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        let r = rng.next();
                        let n = first + r % count;
                        let started = Instant::now();
                        let done = match method {
                            Method::Patch => bench.patch_incr(&mut client, n).await,
                            Method::ReadModifyWrite => {
                                bench.read_modify_write(&mut client, n, &conflicts).await
                            }
                        };
                        match done {
                            Ok(()) => {
                                let _ = latencies.record(started.elapsed().as_micros() as u64);
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies = Histogram::<u64>::new(3)?;
        for task in tasks {
            latencies.add(task.await?)?;
        }
        let elapsed = started.elapsed().as_secs_f64();
        report(name, &latencies, elapsed);
        cpu.report("increment", latencies.len()).await;
        let after = self.sum_counters(first, count).await?;
        let increments = latencies.len();
        println!(
            "  conflicts retried: {} ({:.2} per increment); errors: {}; counters grew by {} for {} increments acknowledged{}",
            conflicts.load(Ordering::Relaxed),
            conflicts.load(Ordering::Relaxed) as f64 / increments.max(1) as f64,
            errors.load(Ordering::Relaxed),
            after - before,
            increments,
            if after - before == increments {
                ""
            } else {
                "  <-- MISMATCH"
            }
        );
        Ok(())
    }

    async fn patch_incr(
        &self,
        client: &mut DocumentsClient<Authorized>,
        n: u64,
    ) -> Result<(), tonic::Status> {
        client
            .patch_document(PatchDocumentRequest {
                database: DATABASE.into(),
                collection: self.collection.clone(),
                id: format!("k{n}"),
                partition_key: pk(n),
                operations: vec![PatchOperation {
                    op: Some(PatchOp::Incr(PatchIncrement {
                        path: "/count".into(),
                        by: Some(PatchIncrementBy::Integer(1)),
                    })),
                }],
                if_match: String::new(),
                condition: String::new(),
                create_if_missing: None,
                create_parents: false,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// Read, add one, replace if unchanged; on a conflict, start again.
    async fn read_modify_write(
        &self,
        client: &mut DocumentsClient<Authorized>,
        n: u64,
        conflicts: &AtomicU64,
    ) -> Result<(), tonic::Status> {
        loop {
            let doc = self.read_counter(client, n).await?;
            let mut body = doc.body.unwrap_or_default().into_map();
            let count = body.get("count").and_then(Value::as_u64).unwrap_or(0);
            body.insert("count".into(), json!(count + 1));
            let replaced = client
                .replace_document(ReplaceDocumentRequest {
                    database: DATABASE.into(),
                    collection: self.collection.clone(),
                    id: format!("k{n}"),
                    partition_key: pk(n),
                    body: Some(JsonObject::new(body)),
                    ttl: None,
                    if_match: doc.etag,
                    ..Default::default()
                })
                .await;
            match replaced {
                Ok(_) => return Ok(()),
                Err(status) if status.code() == Code::FailedPrecondition => {
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Err(status) => return Err(status),
            }
        }
    }

    async fn read_counter(
        &self,
        client: &mut DocumentsClient<Authorized>,
        n: u64,
    ) -> Result<v1::Document, tonic::Status> {
        Ok(client
            .read_document(ReadDocumentRequest {
                database: DATABASE.into(),
                collection: self.collection.clone(),
                id: format!("k{n}"),
                partition_key: pk(n),
            })
            .await?
            .into_inner())
    }

    async fn sum_counters(&self, first: u64, count: u64) -> Result<u64, tonic::Status> {
        let mut client = self.documents(0);
        let mut sum = 0;
        for n in first..first + count {
            let doc = self.read_counter(&mut client, n).await?;
            sum += doc
                .body
                .unwrap_or_default()
                .into_map()
                .get("count")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        Ok(sum)
    }
}
