//! `takeover`: how long a cluster takes to serve a large partition set again after its owner is
//! killed, with and without standbys (issue 28). Against NATS servers already running
//! (`--nats`; `scripts/cluster.sh clean; scripts/cluster.sh nats` starts three fresh ones), it
//! starts nodes a and b with `--standbys`, writes `--documents` documents (transactional
//! batches of 100, 16 in flight, through b), waits until the partitions are split between the
//! nodes (and, with standbys, until each standby's copy has caught up with the log), kills a
//! with SIGKILL and times until b serves every partition. It prints b's catch-up of a's
//! partitions from b's own log lines (positions gone through, those from snapshots loaded where
//! `--snapshot-records` let the owner purge the log below one, and how long the slowest
//! partition took), and checks that b counts every document afterwards.

use std::time::{Duration, Instant};

use mayfly_proto::{
    json::{JsonObject, JsonValue},
    v1::{
        BatchCreate, BatchOperation, CreateCollectionRequest, CreateDatabaseRequest,
        ExecuteBatchRequest, GetPartitionMapRequest, PartitionKey, PartitionMap, QueryRequest,
        client::{AdminClient, CollectionsClient, DatabasesClient, DocumentsClient},
        oneofs::{BatchOp, PartitionKeyKind},
    },
};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::{Args, failover::start_node};

const DATABASE: &str = "takeover";

async fn map(channel: &Channel) -> Result<PartitionMap, tonic::Status> {
    AdminClient::new(channel.clone())
        .get_partition_map(GetPartitionMapRequest {})
        .await
        .map(tonic::Response::into_inner)
}

/// Polls `channel`'s partition map until `done` holds, for up to `limit`.
async fn map_until(
    channel: &Channel,
    limit: Duration,
    what: &str,
    done: impl Fn(&PartitionMap) -> bool,
) -> Result<PartitionMap, String> {
    let started = Instant::now();
    loop {
        if let Ok(m) = map(channel).await
            && done(&m)
        {
            return Ok(m);
        }
        if started.elapsed() > limit {
            return Err(format!("{what}: not within {} s", limit.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes batch `b` (100 documents under partition key `k<b>`), retrying while the partition
/// moves.
async fn write_batch(
    channel: &Channel,
    b: u64,
    count: u64,
    doc_bytes: usize,
) -> Result<(), String> {
    let pk = format!("k{b}");
    let operations: Vec<BatchOperation> = (0..count)
        .map(|i| {
            let Value::Object(body) =
                json!({"id": format!("d{b}-{i}"), "pk": pk, "v": "x".repeat(doc_bytes)})
            else {
                unreachable!()
            };
            BatchOperation {
                op: Some(BatchOp::Create(BatchCreate {
                    body: Some(JsonObject::new(body)),
                    ttl: None,
                })),
            }
        })
        .collect();
    let request = ExecuteBatchRequest {
        database: DATABASE.into(),
        collection: "c".into(),
        partition_key: Some(PartitionKey {
            kind: Some(PartitionKeyKind::Value(JsonValue::new(Value::String(
                pk.clone(),
            )))),
        }),
        operations,
        idempotency_key: format!("batch-{b}"),
    };
    let started = Instant::now();
    loop {
        match DocumentsClient::new(channel.clone())
            .execute_batch(request.clone())
            .await
        {
            Ok(_) => return Ok(()),
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("batch {b}: {e}")),
        }
    }
}

pub(crate) async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let bin = args
        .server_bin
        .clone()
        .ok_or("takeover needs --server-bin (the mayfly binary)")?;
    let nats = args
        .nats
        .clone()
        .ok_or("takeover needs --nats (the NATS servers' URLs, comma-separated)")?;
    let partitions = args.partitions.to_string();
    let standbys = args.standbys.to_string();
    let snapshot_records = args.snapshot_records.to_string();
    let dir = tempfile::tempdir()?;
    let run_id = std::process::id();
    let start = |node: &str| {
        start_node(
            &bin,
            &dir.path().join(node),
            (&nats, node),
            &[
                "--partitions",
                &partitions,
                "--standbys",
                &standbys,
                "--snapshot-records",
                &snapshot_records,
            ],
            Duration::from_secs(30),
        )
    };
    let (a_id, b_id) = (format!("t{run_id}-a"), format!("t{run_id}-b"));
    let (a, on_a) = start(&a_id)?;
    DatabasesClient::new(on_a.clone())
        .create_database(CreateDatabaseRequest {
            id: DATABASE.into(),
            ..Default::default()
        })
        .await?;
    CollectionsClient::new(on_a.clone())
        .create_collection(CreateCollectionRequest {
            database: DATABASE.into(),
            id: "c".into(),
            partition_key_path: "/pk".into(),
            ..Default::default()
        })
        .await?;
    let (b, on_b) = start(&b_id)?;
    let split = |m: &PartitionMap| {
        let count = |n: &str| m.owners.iter().filter(|o| o.owner == n).count();
        count(&a_id) + count(&b_id) == m.owners.len() && count(&a_id).abs_diff(count(&b_id)) <= 1
    };
    map_until(
        &on_b,
        Duration::from_secs(60),
        "the partitions split",
        split,
    )
    .await?;

    let written = Instant::now();
    let batches = args.documents.div_ceil(100);
    let mut next = 0u64;
    while next < batches {
        let round: Vec<_> = (next..(next + 16).min(batches))
            .map(|b| {
                let count = (args.documents - b * 100).min(100);
                write_batch(&on_b, b, count, args.doc_bytes)
            })
            .collect();
        for done in futures_util::future::join_all(round).await {
            done?;
        }
        next = (next + 16).min(batches);
    }
    let took = written.elapsed();
    println!(
        "wrote {} documents of ~{} bytes in {:.1} s ({:.0} documents/s)",
        args.documents,
        args.doc_bytes,
        took.as_secs_f64(),
        args.documents as f64 / took.as_secs_f64()
    );
    let waited = Instant::now();
    let before = map_until(&on_b, Duration::from_secs(600), "standbys caught up", |m| {
        let reported = m
            .nodes
            .iter()
            .all(|n| n.serves as usize == m.owners.iter().filter(|o| o.owner == n.id).count());
        split(m)
            && reported
            && m.owners.iter().all(|o| {
                o.standbys.len() == args.standbys as usize
                    && o.standbys.iter().all(|s| s.behind == 0)
            })
    })
    .await?;
    if args.standbys > 0 {
        println!(
            "standbys caught up {:.1} s after the last write",
            waited.elapsed().as_secs_f64()
        );
    }
    let moving: Vec<u32> = before
        .owners
        .iter()
        .filter(|o| o.owner == a_id)
        .map(|o| o.partition)
        .collect();
    // Drain b's log lines so far: only the takeovers after the kill count.
    while b.0.logs.try_recv().is_ok() {}

    let killed = Instant::now();
    let mut a = a;
    a.0.child.kill()?;
    a.0.child.wait()?;
    drop(a);
    map_until(
        &on_b,
        Duration::from_secs(600),
        "b serving every partition",
        |m| m.owners.iter().all(|o| o.owner == b_id && o.served_here),
    )
    .await?;
    let serving = killed.elapsed();
    // b's own account of each takeover: records replayed and how long it took.
    let (mut replayed, mut slowest, mut seen) = (0u64, 0u64, 0usize);
    // Positions covered by snapshots loaded (the logs were purged below them) and documents.
    let (mut loaded, mut loaded_documents) = (0u64, 0u64);
    let show = std::env::var_os("MAYFLY_BENCH_LOGS").is_some();
    while let Ok(line) = b.0.logs.try_recv() {
        if show {
            eprintln!("b: {line}");
        }
        let field = |name: &str| -> u64 {
            line.split_once(&format!("{name}="))
                .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        if line.contains("loaded the partition's snapshot") {
            loaded += field("at");
            loaded_documents += field("documents");
            continue;
        }
        if !line.contains("serving the partition") {
            continue;
        }
        replayed += field("replayed");
        slowest = slowest.max(field("took_ms"));
        seen += 1;
    }
    let mut count = 0u64;
    let mut pages = DocumentsClient::new(on_b.clone())
        .query(QueryRequest {
            database: DATABASE.into(),
            collection: "c".into(),
            query: "SELECT VALUE COUNT(1) FROM c".into(),
            enable_scan: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    while let Some(page) = pages.message().await? {
        for v in page.results {
            count += v.as_u64().unwrap_or(0);
        }
    }
    println!(
        "standbys {}, snapshots every {} records: kill -9 of a (owning {} of {} partitions) -> b serving all of them: {} ms; b's takeovers ({seen}) went {replayed} positions (of which {loaded} from snapshots holding {loaded_documents} documents, the rest replayed), the slowest in {slowest} ms ({:.0} positions/s); b counts {count} of {} documents",
        args.standbys,
        args.snapshot_records,
        moving.len(),
        before.owners.len(),
        serving.as_millis(),
        if slowest > 0 {
            replayed as f64 * 1000.0 / slowest as f64
        } else {
            0.0
        },
        args.documents
    );
    if count != args.documents {
        return Err(format!("b counts {count} documents, not {}", args.documents).into());
    }
    drop(b);
    Ok(())
}
