//! A node of a Mayfly cluster (docs/cluster.md): it joins through NATS JetStream, applies the
//! catalog log, contends for the partitions' leases and serves the partitions it holds.
//!
//! What this version does and does not do yet (the note's build order): a node keeps its
//! partitions in memory and rebuilds each from its log when it takes the partition over (the
//! log, on a quorum of fsyncing NATS servers, is what persists; the node's own fjall copy comes
//! later); a request for a partition another node owns is forwarded there, once (unary
//! document calls; `grpc/forward.rs`); a node that loses a partition's lease does not take it again
//! until it restarts (its copy may hold commits the log refused).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, Context, stream::Stream};
use futures_util::StreamExt;
use mayfly_cluster::{
    Apply, CatalogLog, CatchUpError, Clocks, Followed, Held, LeaseTiming, Leases, PublishQueue,
    ReplicatedStorage, SystemClocks, Watch, assign, become_owner,
    lease_store::renew_interval,
    publish_queue::{LOG_STREAMS, log_streams},
};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::{
    ServeError,
    engine::{Engine, EngineConfig, LeaseClock, SystemClock},
    grpc::{CatalogChange, CatalogRoute, catalog_change::CatalogLogAnswer, forward::Owners},
    storage::MemoryStorage,
};

/// How a node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The NATS servers' client URLs.
    pub urls: Vec<String>,
    /// This node's id, unique in the cluster.
    pub node_id: String,
    /// The cluster's partitions: fixed when the cluster is made, the same on every node.
    pub partitions: usize,
    /// Replicas of the cluster's streams and buckets: 3 (1 for a single NATS server).
    pub replicas: usize,
    /// Where the other nodes reach this one (`host:port`); `None`: the address it listens on.
    pub advertise: Option<String>,
}

/// How long joining waits for NATS JetStream to take the cluster's streams and buckets (a
/// NATS cluster starting at the same time elects its leaders first).
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a joining node waits, once in the node directory, before it contends: nodes
/// started together see each other.
const NODE_SETTLE: Duration = Duration::from_secs(1);

/// The clock partition leases are timed by, for the engine to read lease ends against.
#[derive(Debug)]
struct BootClock;

impl LeaseClock for BootClock {
    fn now_ms(&self) -> u64 {
        SystemClocks.monotonic_ms()
    }
}

/// A node's work in the background: its partitions' leases and the catalog log. Stops when
/// dropped.
#[derive(Debug)]
pub struct ClusterNode {
    tasks: Vec<JoinHandle<()>>,
    /// The partitions' publish queues: closed with the node, which stops their publishers.
    queues: Vec<Arc<PublishQueue>>,
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        // The partition tasks end their renewals as they are dropped (see `Partition::serve`).
        for task in &self.tasks {
            task.abort();
        }
        for queue in &self.queues {
            queue.close();
        }
    }
}

/// Aborts a task when dropped: a partition task's renewals end with it.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> ServeError {
    ServeError::Config(format!("cluster: {what}: {e}"))
}

/// Retries `attempt` until it succeeds or [`JOIN_TIMEOUT`] has passed.
async fn patiently<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Result<T, ServeError> {
    let deadline = Instant::now() + JOIN_TIMEOUT;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "cluster: {what}: not yet; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(failed(what, e)),
        }
    }
}

/// Joins the cluster: an engine whose shards are the partitions, each following until this
/// node wins its lease; the catalog applied up to the log's end; a task per partition
/// contending for its lease and serving it while held.
pub async fn join(
    config: &ClusterConfig,
    mut engine_config: EngineConfig,
    advertise: &str,
) -> Result<(Engine, CatalogRoute, Arc<dyn Owners>, ClusterNode), ServeError> {
    let client = async_nats::connect(config.urls.clone())
        .await
        .map_err(|e| failed(&format!("connecting to {}", config.urls.join(",")), e))?;
    let js = jetstream::new(client.clone());
    // Joining asks often and briefly while a NATS cluster that starts at the same time elects
    // its leaders (each step is retried; see `patiently`).
    let mut impatient = js.clone();
    impatient.set_timeout(Duration::from_secs(2));
    let js_join = &impatient;
    agree_on_partitions(js_join, config).await?;
    let streams = patiently("creating the log streams", || {
        log_streams(js_join, config.replicas)
    })
    .await?;
    let partitions = config.partitions;
    let queues: Vec<_> = (0..partitions)
        .map(|p| PublishQueue::new(p as u32))
        .collect();
    let storage = ReplicatedStorage::new(
        Arc::new(MemoryStorage::new()),
        queues.clone(),
        client.server_info().max_payload,
    );
    engine_config.shards = partitions;
    engine_config.log_every_commit = true;
    engine_config.lease_clock = Some(Arc::new(BootClock));
    let engine = Engine::new(engine_config, Arc::new(storage), Arc::new(SystemClock));
    for p in 0..partitions {
        engine.set_following(p, true);
    }

    let catalog = patiently("opening the catalog log", || {
        CatalogLog::<CatalogLogAnswer>::open(&js, config.replicas, &config.node_id, 0)
    })
    .await?;
    let mut tasks = vec![follow_catalog(&catalog, &engine)];
    let end = patiently("reading the catalog log's end", || catalog.end()).await?;
    tokio::time::timeout(JOIN_TIMEOUT, catalog.applied_to(end))
        .await
        .map_err(|_| {
            failed(
                "applying the catalog log",
                "it did not reach its end in time",
            )
        })?;

    let leases = Arc::new(
        patiently("opening the partition leases", || {
            Leases::open(&js, config.replicas, LeaseTiming::DEFAULT)
        })
        .await?,
    );
    let nodes = patiently("opening the node directory", || {
        bucket(js_join, "mayfly-nodes", config.replicas)
    })
    .await?;
    patiently("registering in the node directory", || {
        nodes.put(&config.node_id, advertise.to_string().into())
    })
    .await?;
    // Nodes starting together split the partitions: each contends at once for those the
    // assignment over the nodes it sees gives it, and for the rest only once they have gone
    // unowned a while (their node is absent, or gone).
    tokio::time::sleep(NODE_SETTLE).await;
    let members = node_ids(&nodes).await?;
    let preferred = assign(None, partitions, &members, 0);
    for (p, queue) in queues.iter().cloned().enumerate() {
        let partition = Partition {
            preferred: preferred.partitions[p].owner == config.node_id,
            p: p as u32,
            node: config.node_id.clone(),
            engine: engine.clone(),
            js: js.clone(),
            stream: streams[p % LOG_STREAMS as usize].clone(),
            leases: leases.clone(),
            queue,
        };
        tasks.push(tokio::spawn(partition.serve()));
    }
    let owners = Directory {
        node: config.node_id.clone(),
        leases,
        nodes,
    };
    tracing::info!(
        node = %config.node_id,
        address = advertise,
        partitions,
        catalog_entries = end,
        "joined the cluster"
    );
    Ok((
        engine,
        CatalogRoute::Log(catalog),
        Arc::new(owners),
        ClusterNode { tasks, queues },
    ))
}

/// A KV bucket of the cluster's (made where missing): one value per key, replicated, on disk.
async fn bucket(
    js: &Context,
    name: &str,
    replicas: usize,
) -> Result<jetstream::kv::Store, jetstream::context::CreateKeyValueError> {
    js.create_key_value(jetstream::kv::Config {
        bucket: name.to_string(),
        history: 1,
        num_replicas: replicas,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
}

/// Every node must place documents over the same number of partitions: the first node to
/// join records it, and a node that says otherwise is refused.
async fn agree_on_partitions(js: &Context, config: &ClusterConfig) -> Result<(), ServeError> {
    let kv = patiently("opening the cluster's settings", || {
        bucket(js, "mayfly-cluster", config.replicas)
    })
    .await?;
    let ours = config.partitions.to_string();
    // Whoever creates the key first decides; everyone else reads it. Retried while the
    // bucket's stream elects its leader (reads find no responder until then).
    let stored = patiently("reading the cluster's partition count", || async {
        let _ = kv.create("partitions", ours.clone().into()).await;
        match kv.get("partitions").await {
            Ok(Some(stored)) => Ok(String::from_utf8_lossy(&stored).to_string()),
            Ok(None) => Err("it is missing".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    if stored != ours {
        return Err(failed(
            "joining",
            format!(
                "the cluster has {stored} partitions and this node was started with --partitions {ours}; start it with --partitions {stored}"
            ),
        ));
    }
    Ok(())
}

/// Applies the catalog log on this node, for as long as it runs.
fn follow_catalog(catalog: &Arc<CatalogLog<CatalogLogAnswer>>, engine: &Engine) -> JoinHandle<()> {
    let applier = engine.clone();
    let apply: Apply<CatalogLogAnswer> = Arc::new(move |_seq, entry| {
        let engine = applier.clone();
        Box::pin(async move {
            let (change, at) = CatalogChange::decode(&entry)?;
            match tokio::task::spawn_blocking(move || change.apply(&engine, Some(at))).await {
                Ok(answer) => answer,
                Err(e) => Err(Status::internal(format!("catalog task failed: {e}"))),
            }
        })
    });
    let log = catalog.clone();
    tokio::spawn(log.follow(apply))
}

/// Where partitions are served: their leases' owners, and the nodes' addresses.
struct Directory {
    node: String,
    leases: Arc<Leases>,
    nodes: jetstream::kv::Store,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl Owners for Directory {
    fn node(&self) -> &str {
        &self.node
    }

    async fn nodes(&self) -> Result<Vec<(String, String)>, Status> {
        let unavailable = |e: &dyn std::fmt::Display| {
            Status::unavailable(format!("the cluster's node directory: {e}"))
        };
        let mut out = Vec::new();
        for id in node_ids(&self.nodes).await.map_err(|e| unavailable(&e))? {
            let address = self.nodes.get(&id).await.map_err(|e| unavailable(&e))?;
            let address = address.map(|a| String::from_utf8_lossy(&a).to_string());
            out.push((id, address.unwrap_or_default()));
        }
        Ok(out)
    }

    async fn leases(&self, partitions: u32) -> Result<Vec<(String, u64)>, Status> {
        let mut out = Vec::new();
        for p in 0..partitions {
            let lease = self
                .leases
                .read(p)
                .await
                .map_err(|e| Status::unavailable(format!("the lease of partition {p}: {e}")))?;
            out.push(lease.map_or((String::new(), 0), |(l, _)| (l.owner, l.epoch)));
        }
        Ok(out)
    }

    async fn owner_address(&self, partition: u32) -> Option<String> {
        let (lease, _) = self.leases.read(partition).await.ok()??;
        if lease.owner == self.node {
            return None;
        }
        let address = self.nodes.get(&lease.owner).await.ok()??;
        String::from_utf8(address.to_vec()).ok()
    }
}

/// The nodes in the directory, in order.
async fn node_ids(nodes: &jetstream::kv::Store) -> Result<Vec<String>, ServeError> {
    let mut keys = nodes
        .keys()
        .await
        .map_err(|e| failed("reading the node directory", e))?;
    let mut out = Vec::new();
    while let Some(key) = keys.next().await {
        out.push(key.map_err(|e| failed("reading the node directory", e))?);
    }
    out.sort();
    Ok(out)
}

/// One partition, as this node contends for it and serves it.
struct Partition {
    p: u32,
    /// The assignment at join gave it to this node: it contends at once.
    preferred: bool,
    node: String,
    engine: Engine,
    js: Context,
    stream: Stream,
    leases: Arc<Leases>,
    queue: Arc<PublishQueue>,
}

impl Partition {
    /// Waits for the partition's lease, takes the partition over and serves it while the
    /// lease is renewed.
    async fn serve(self) {
        let clocks = SystemClocks;
        let interval = renew_interval(&LeaseTiming::DEFAULT);
        let mut watch = Watch::default();
        // A free partition goes first to the node the assignment gives it; one with an owner
        // goes to whoever finds its lease lapsed first.
        let free = matches!(self.leases.read(self.p).await, Ok(None));
        if !self.preferred && free {
            tokio::time::sleep(Duration::from_millis(2 * LeaseTiming::DEFAULT.length_ms)).await;
        }
        let held = loop {
            match self
                .leases
                .try_acquire(self.p, &self.node, &mut watch, &clocks)
                .await
            {
                Ok(Some(held)) => break held,
                Ok(None) => {}
                Err(e) => tracing::debug!(partition = self.p, error = %e, "lease not read"),
            }
            tokio::time::sleep(interval).await;
        };
        // Served only within the lease from here; renewed while the node catches up.
        self.lease_end(&held);
        let (epoch, floor) = (held.epoch, held.replaced_until());
        let lost = Arc::new(AtomicBool::new(false));
        let mut renewing = AbortOnDrop(tokio::spawn(self.renew(held, lost.clone())));
        let still_held = || !lost.load(Ordering::SeqCst);
        let mut followed = Followed::new(self.p);
        let mut refusals = 0;
        loop {
            match become_owner(
                &self.js,
                &self.stream,
                &self.engine,
                (&self.queue, self.p, epoch, floor),
                (&mut followed, &still_held),
            )
            .await
            {
                Ok(position) => {
                    tracing::info!(
                        partition = self.p,
                        epoch = position.epoch,
                        log_end = position.last,
                        "serving the partition"
                    );
                    break;
                }
                Err(CatchUpError::Takeover(e)) if still_held() => {
                    tracing::info!(partition = self.p, error = %e, "taking the partition over: retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // A commit naming a collection this node's catalog has not reached yet: the
                // catalog log catches up meanwhile. Given up after about 10 s (the lease then
                // lapses, and another node tries).
                Err(CatchUpError::Refused(e)) if still_held() && refusals < 40 => {
                    refusals += 1;
                    tracing::info!(partition = self.p, error = %e, "a commit was refused: retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => {
                    // Unrenewed, the lease lapses and another node takes the partition.
                    tracing::error!(partition = self.p, error = %e, "cannot serve the partition");
                    renewing.0.abort();
                    self.engine.set_following(self.p as usize, true);
                    return;
                }
            }
        }
        let _ = (&mut renewing.0).await;
    }

    fn lease_end(&self, held: &Held) {
        self.engine.serve_until(
            self.p as usize,
            held.serves_until().unwrap_or(0),
            held.time_cap(),
        );
    }

    /// Renews the lease every quarter lease; on losing it, stops serving the partition and
    /// raises `lost`.
    fn renew(
        &self,
        mut held: Held,
        lost: Arc<AtomicBool>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (leases, engine, queue, node, p) = (
            self.leases.clone(),
            self.engine.clone(),
            self.queue.clone(),
            self.node.clone(),
            self.p,
        );
        async move {
            let clocks = SystemClocks;
            let interval = renew_interval(&LeaseTiming::DEFAULT);
            loop {
                tokio::time::sleep(interval).await;
                match leases.renew(&mut held, &node, &clocks).await {
                    Ok(true) => {
                        engine.serve_until(
                            p as usize,
                            held.serves_until().unwrap_or(0),
                            held.time_cap(),
                        );
                        continue;
                    }
                    Ok(false) => {}
                    // NATS away (a server lost, a Raft leader moving): the engine stops serving
                    // at the lease's end by itself, and renewals go on. One that succeeds
                    // later, however late, proves no other node took the key meanwhile (it
                    // changes only by compare-and-set), and serving resumes.
                    Err(e) => {
                        tracing::warn!(
                            partition = p,
                            serving = held.serves(&clocks),
                            error = %e,
                            "lease not renewed; retrying"
                        );
                        continue;
                    }
                }
                tracing::warn!(
                    partition = p,
                    "lost the partition's lease: another node serves it now; this node takes it again only after a restart"
                );
                lost.store(true, Ordering::SeqCst);
                engine.set_following(p as usize, true);
                queue.close();
                return;
            }
        }
    }
}
