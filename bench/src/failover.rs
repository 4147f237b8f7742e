//! `failover`: how long a cluster's partitions are out when their owner is killed (issue 28).
//! Against NATS servers already running (`--nats`; `scripts/cluster.sh nats` starts three),
//! each round starts a new node beside the node that owns every partition, writes
//! `--round-writes` documents through the new node (forwarded to the owner), kills the owner
//! with SIGKILL and times from the kill to the first write that succeeds through the new node:
//! the lease's lapse, the catch-up of the partition (the new node is its standby, so only the
//! tail since its last catch-up; with `--standbys 0` on the nodes, the whole log: no snapshots
//! yet), the takeover. The new node owns everything after it.
//! Start from fresh NATS servers (`scripts/cluster.sh clean` first): "logged writes" counts
//! this run's only.

use std::time::{Duration, Instant};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        CreateCollectionRequest, CreateDatabaseRequest, CreateDocumentRequest,
        client::{CollectionsClient, DatabasesClient, DocumentsClient},
    },
};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use crate::{Args, recovery};

/// A node this workload started: killed when dropped, so that no error leaves one running.
pub(crate) struct Node(pub(crate) recovery::Server);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// Starts `bin` as cluster node `node` on the NATS servers `nats`, in memory, on `data`, with
/// `extra` flags; the node and a lazy connection to it whose requests time out after `timeout`.
pub(crate) fn start_node(
    bin: &std::path::Path,
    data: &std::path::Path,
    (nats, node): (&str, &str),
    extra: &[&str],
    timeout: Duration,
) -> Result<(Node, Channel), Box<dyn std::error::Error>> {
    let mut args = vec!["--storage", "memory", "--cluster", nats, "--node-id", node];
    args.extend(extra);
    let server = recovery::start(bin, data, 64, &args)?;
    let channel = Endpoint::from_shared(format!("http://{}", server.addr))?
        .timeout(timeout)
        .connect_lazy();
    Ok((Node(server), channel))
}

/// A write of document `id` in partition `pk` through `channel`.
async fn write(channel: &Channel, id: &str, pk: &str) -> Result<(), tonic::Status> {
    let serde_json::Value::Object(body) = json!({"id": id, "pk": pk, "v": "x".repeat(200)}) else {
        unreachable!()
    };
    DocumentsClient::new(channel.clone())
        .create_document(CreateDocumentRequest {
            database: "failover".into(),
            collection: "c".into(),
            body: Some(JsonObject::new(body)),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// Retries a write until it succeeds; how long it took.
async fn until_written(channel: &Channel, id: &str, pk: &str) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        match write(channel, id, pk).await {
            Ok(()) => return Ok(started.elapsed()),
            // An earlier try was applied, its answer lost (the owner died): written.
            Err(e) if e.code() == tonic::Code::AlreadyExists => return Ok(started.elapsed()),
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(format!("no write of {id} within 60 s: {e}")),
        }
    }
}

pub(crate) async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.rounds == 0 {
        return Err("failover needs --rounds of at least 1".into());
    }
    let bin = args
        .server_bin
        .clone()
        .ok_or("failover needs --server-bin (the mayfly binary)")?;
    let nats = args
        .nats
        .clone()
        .ok_or("failover needs --nats (the NATS servers' URLs, comma-separated)")?;
    let partitions = args.partitions.to_string();
    let dir = tempfile::tempdir()?;
    let start = |node: String| {
        start_node(
            &bin,
            &dir.path().join(&node),
            (&nats, &node),
            &["--partitions", &partitions, "--shards", &partitions],
            Duration::from_secs(5),
        )
    };
    let run_id = std::process::id();
    let (mut owner, owner_channel) = start(format!("f{run_id}-0"))?;
    let _ = DatabasesClient::new(owner_channel.clone())
        .create_database(CreateDatabaseRequest {
            id: "failover".into(),
            ..Default::default()
        })
        .await;
    let _ = CollectionsClient::new(owner_channel.clone())
        .create_collection(CreateCollectionRequest {
            database: "failover".into(),
            id: "c".into(),
            partition_key_path: "/pk".into(),
            ..Default::default()
        })
        .await;
    until_written(&owner_channel, &format!("probe-{run_id}"), "p0").await?;
    println!("round\tlogged writes\tkill -9 to first write (ms)");
    let mut times = Vec::new();
    let mut logged = 1u64;
    for round in 1..=args.rounds {
        let (next, channel) = start(format!("f{run_id}-{round}"))?;
        // Writes through the new node, forwarded to the owner, 64 at a time.
        let mut n = 0;
        while n < args.round_writes {
            let batch: Vec<_> = (n..(n + 64).min(args.round_writes))
                .map(|i| {
                    let channel = channel.clone();
                    async move {
                        let (id, pk) = (format!("{run_id}-r{round}-{i}"), format!("p{}", i % 97));
                        until_written(&channel, &id, &pk).await
                    }
                })
                .collect();
            for written in futures_util::future::join_all(batch).await {
                written?;
            }
            n = (n + 64).min(args.round_writes);
        }
        logged += args.round_writes;
        let killed = Instant::now();
        owner.0.child.kill()?;
        owner.0.child.wait()?;
        let _ = until_written(
            &channel,
            &format!("{run_id}-after-{round}"),
            &format!("p{round}"),
        )
        .await?;
        let took = killed.elapsed();
        logged += 1;
        println!("{round}\t{logged}\t{}", took.as_millis());
        times.push(took);
        owner = next;
    }
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    println!(
        "failover over {} kills: p50 {} ms, p99 {} ms, max {} ms (lease {} s; the new node is every partition's standby)",
        times.len(),
        at(0.5).as_millis(),
        at(0.99).as_millis(),
        times.last().map_or(0, |t| t.as_millis()),
        2
    );
    Ok(())
}
