//! A node of a Mayfly cluster (docs/cluster.md): it joins through NATS JetStream, applies the
//! catalog log, contends for the partitions' leases and serves the partitions it holds.
//!
//! What this version does and does not do yet (the note's build order): a node keeps its
//! partitions in its own fjall (or in memory, `--storage memory`, rebuilding each from its log
//! when it follows or takes it over), resumes them after a restart and rebuilds from the log
//! those not known to be the log's ([`open_copies`]; docs/cluster.md, "A node's own copy"); a
//! request for a partition another node owns is forwarded there, once (unary document calls;
//! `grpc/forward.rs`); owners hand partitions over to even out the assignment over the members
//! present ([`rebalance`]); a node that stops owning a partition with commits NATS had not
//! acknowledged does not take it again until it restarts (its copy may hold commits the log
//! refused; the restart rebuilds it).

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, Context, stream::Stream};
use bytes::Bytes;
use futures_util::StreamExt;
use mayfly_cluster::{
    Apply, Assignment, CatalogLog, CatchUpError, Clocks, Followed, Held, LeaseTiming, Leases,
    LogPosition, PublishQueue, Replicas, ReplicatedStorage, SystemClocks, TakeoverError, Watch,
    assign, become_owner, catch_up,
    copy_state::{self, Kept},
    lease_store::renew_interval,
    publish_queue::{self, LOG_STREAMS, log_streams, subject},
    ranked_standbys,
};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    task::JoinHandle,
};
use tonic::Status;

use crate::{
    ServeError,
    auth::KeyRing,
    cluster_directory::Directory,
    cluster_keys,
    cluster_metrics::{ClusterMetrics, clock_skew_ms},
    cluster_report::{self, PartitionCopy},
    cluster_seal::ClusterSeal,
    engine::{Engine, EngineConfig, LeaseClock, Placement, SystemClock, TokenKey},
    engine_load::load_engine,
    grpc::{CatalogChange, CatalogRoute, catalog_change::CatalogLogAnswer, forward::Owners},
    storage::{DiskOptions, DiskStorage, MemoryStorage, Storage, StorageError},
};

/// How a node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The NATS servers' client URLs.
    pub urls: Vec<String>,
    /// The NATS servers' monitoring endpoints (`http://HOST:PORT`): the node refuses to start
    /// if one runs JetStream without `sync_interval: always` (empty: it cannot tell, and
    /// warns; `nats_sync_check.rs`).
    pub nats_monitors: Vec<String>,
    /// This node's id, unique in the cluster.
    pub node_id: String,
    /// The cluster's partitions: fixed when the cluster is made, the same on every node.
    pub partitions: usize,
    /// Replicas of the cluster's streams and buckets: 3 (1 for a single NATS server).
    pub replicas: usize,
    /// Where the other nodes reach this one (`host:port`); `None`: the address it listens on.
    pub advertise: Option<String>,
    /// How many other nodes keep each partition's copy caught up with its log, ready to take
    /// it over within a lease when its owner dies (fewer while there are fewer nodes).
    pub standbys: usize,
    /// An owner snapshots a partition into its log after this many records (or 10 minutes
    /// with any), and purges the log below the snapshot before (docs/cluster.md,
    /// "Snapshots and retention").
    pub snapshot_records: u64,
    /// When this node serves TLS, the CA (PEM) that issued the other nodes' certificates: it
    /// checks them by it when it forwards (`None`: the `--tls-client-ca`, which then must be
    /// given).
    pub peer_ca: Option<PathBuf>,
    /// How the node proves itself to the NATS servers and checks them.
    pub nats: NatsAuth,
    /// The cluster key (64 hex digits) every node is given: the cluster's secrets are sealed
    /// with it on the NATS servers (`None`: kept in clear; see `cluster_seal.rs`).
    pub key_file: Option<PathBuf>,
}

/// How a node proves itself to the NATS servers and checks them (docs/cluster.md, "Security").
#[derive(Debug, Clone, Default)]
pub struct NatsAuth {
    /// NATS credentials: a `.creds` file (a user JWT and its nkey seed, for servers run in
    /// operator mode) or a file holding a bare user nkey seed (`SU…`, for a server whose
    /// `authorization` lists the user's public nkey).
    pub credentials: Option<PathBuf>,
    /// Connect over TLS only, checking the servers' certificates against this CA (PEM).
    pub tls_ca: Option<PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify their clients.
    pub tls_identity: Option<(PathBuf, PathBuf)>,
}

impl NatsAuth {
    /// The options to connect with, or why they cannot be made.
    async fn options(&self) -> Result<async_nats::ConnectOptions, ServeError> {
        let mut options = match &self.credentials {
            None => async_nats::ConnectOptions::new(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ServeError::Config(format!("--cluster-creds {}: {e}", path.display()))
                })?;
                if text.contains("BEGIN NATS USER JWT") {
                    async_nats::ConnectOptions::new()
                        .credentials_file(path)
                        .await
                        .map_err(|e| {
                            ServeError::Config(format!("--cluster-creds {}: {e}", path.display()))
                        })?
                } else if text.trim().starts_with("SU") {
                    async_nats::ConnectOptions::with_nkey(text.trim().to_string())
                } else {
                    return Err(ServeError::Config(format!(
                        "--cluster-creds {}: neither a NATS credentials file (a user JWT and seed) nor a user nkey seed (SU…)",
                        path.display()
                    )));
                }
            }
        };
        if let Some(ca) = &self.tls_ca {
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls_identity {
            options = options
                .require_tls(true)
                .add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options)
    }
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
pub struct ClusterNode {
    tasks: Vec<JoinHandle<()>>,
    /// The partitions' publish queues: closed with the node, which stops their publishers.
    queues: Vec<Arc<PublishQueue>>,
    /// Raised by [`ClusterNode::leave`].
    leaving: watch::Sender<bool>,
    /// The partitions this node serves now.
    owned: Arc<AtomicUsize>,
    node: String,
    members: jetstream::kv::Store,
    metrics: Arc<ClusterMetrics>,
    /// The cluster's keys, where the node accepts them.
    keys: Option<Arc<KeyRing>>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("node", &self.node)
            .field("owned", &self.owned.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// The cluster's keys, where the node accepts them.
    pub(crate) fn keys(&self) -> Option<Arc<KeyRing>> {
        self.keys.clone()
    }

    /// Its metrics, for `GET /metrics`.
    pub(crate) fn metrics(&self) -> Arc<ClusterMetrics> {
        self.metrics.clone()
    }

    /// Leaves the cluster gracefully (before a shutdown): leaves the member list, so that the
    /// assignment gives this node's partitions to the others, hands each over as soon as its
    /// new owner is ready (all at once, not one at a time), and contends for none again.
    /// Returns how many partitions it still served when `timeout` passed (0: all handed
    /// over); those lapse to the others, as after a kill.
    pub async fn leave(&self, timeout: Duration) -> usize {
        let _ = self.leaving.send(true);
        let deadline = Instant::now() + timeout;
        let mut deleted_at = None;
        loop {
            let owned = self.owned.load(Ordering::SeqCst);
            if owned == 0 || Instant::now() >= deadline {
                return owned;
            }
            // Deleted again every second: a heartbeat sent just before the node started
            // leaving may land after the first delete.
            if deleted_at.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(1)) {
                if let Err(e) = self.members.delete(&self.node).await {
                    tracing::warn!(error = %e, "could not leave the member list; the others see this node gone once its entry expires");
                }
                deleted_at = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
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
/// With `keys`, the node accepts the cluster's keys (see `cluster_keys`), copying them to the
/// directory `keys` names if it names one.
pub async fn join(
    config: &ClusterConfig,
    (mut engine_config, disk): (EngineConfig, Option<&DiskOptions>),
    advertise: &str,
    keys: Option<Option<std::path::PathBuf>>,
) -> Result<(Engine, CatalogRoute, Arc<dyn Owners>, ClusterNode), ServeError> {
    let nats_fsync_confirmed = crate::nats_sync_check::check(&config.nats_monitors, &config.urls)
        .await
        .map_err(ServeError::Config)?;
    let client = config
        .nats
        .options()
        .await?
        .connect(config.urls.clone())
        .await
        .map_err(|e| failed(&format!("connecting to {}", config.urls.join(",")), e))?;
    let js = jetstream::new(client.clone());
    // Joining asks often and briefly while a NATS cluster that starts at the same time elects
    // its leaders (each step is retried; see `patiently`).
    let mut impatient = js.clone();
    impatient.set_timeout(Duration::from_secs(2));
    let js_join = &impatient;
    let seal = Arc::new(match &config.key_file {
        Some(path) => ClusterSeal::from_file(path).map_err(ServeError::Config)?,
        None => ClusterSeal::clear(),
    });
    let (token_key, cluster_id) = agree_on_settings(js_join, config, &seal).await?;
    engine_config.token_key = token_key;
    let keys = match keys {
        None => None,
        Some(copy_to) => {
            let bucket = patiently("opening the cluster's keys", || {
                bucket(js_join, cluster_keys::BUCKET, config.replicas)
            })
            .await?;
            Some(
                patiently("reading the cluster's keys", || {
                    cluster_keys::open(bucket.clone(), copy_to.clone(), seal.clone())
                })
                .await?,
            )
        }
    };
    let streams = patiently("creating the log streams", || {
        log_streams(js_join, config.replicas)
    })
    .await?;
    let partitions = config.partitions;
    let queues: Vec<_> = (0..partitions)
        .map(|p| PublishQueue::new(p as u32))
        .collect();
    let (inner, copies, catalog_applied) = open_copies(disk, partitions, &cluster_id).await?;
    let replicated =
        ReplicatedStorage::new(inner, queues.clone(), client.server_info().max_payload);
    engine_config.shards = partitions;
    engine_config.log_every_commit = true;
    engine_config.lease_clock = Some(Arc::new(BootClock));
    let engine = if disk.is_none() {
        // Nothing to load, and uids from the catalog log alone (memory storage's own start at
        // a random point, which would differ from node to node).
        Engine::new(engine_config, Arc::new(replicated), Arc::new(SystemClock))
    } else {
        let replicated: Arc<dyn Storage> = Arc::new(replicated);
        tokio::task::spawn_blocking(move || load_engine(replicated, engine_config, Arc::default()))
            .await
            .map_err(|e| ServeError::Io(std::io::Error::other(e)))??
    };
    for (p, copy) in copies.iter().enumerate() {
        engine.set_following(p, true);
        // Positions the owner's commits took with nothing for this copy to keep are not in
        // its storage's log position.
        engine.pass_log_to(p, copy.chain.last);
    }
    let mut copies = copies.into_iter();

    let catalog = patiently("opening the catalog log", || {
        CatalogLog::<CatalogLogAnswer>::open(&js, config.replicas, &config.node_id, catalog_applied)
    })
    .await?;
    let mut tasks = vec![follow_catalog(&catalog, &engine)];
    let (keys, confirming) = keys.unzip();
    tasks.extend(confirming);
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
    let members = patiently("opening the member list", || {
        expiring_bucket(js_join, "mayfly-members", config.replicas, MEMBER_TTL)
    })
    .await?;
    let (directory, watching) = Directory::start(
        config.node_id.clone(),
        leases.clone(),
        nodes,
        members.clone(),
    );
    tasks.extend(watching);
    patiently("joining the member list", || {
        members.put(&config.node_id, Bytes::new())
    })
    .await?;
    let (leaving_tx, leaving) = watch::channel(false);
    let metrics = Arc::new(ClusterMetrics::new(queues.clone()));
    metrics.set_nats_fsync_confirmed(nats_fsync_confirmed);
    // Measured before this node contends for anything.
    if let Some(skew) = sample_clock(&members, &config.node_id, Bytes::new()).await
        && !metrics.record_clock_skew(skew)
    {
        metrics.set_clock_ok(false);
        tracing::error!(
            skew_ms = skew,
            "this node's clock is more than 1 s from the NATS servers' time: it owns no partition until that is mended"
        );
    }
    tasks.push(tokio::spawn(heartbeat(
        (members.clone(), leaving.clone()),
        config.node_id.clone(),
        (metrics.clone(), engine.clone()),
    )));
    // Nodes starting together split the partitions: each contends at once for those the
    // assignment over the nodes it sees gives it, and for the rest only once they have gone
    // unowned a while (their node is absent, or gone). From then on the assignment follows
    // the members present, and owners hand partitions over to even it out.
    tokio::time::sleep(NODE_SETTLE).await;
    let live = node_ids(&members).await?;
    let preferred = Arc::new(assign(None, partitions, &live, config.standbys));
    let (desired_tx, desired) = watch::channel(preferred.clone());
    let owned = Arc::new(AtomicUsize::new(0));
    let members_store = members.clone();
    tasks.push(tokio::spawn(rebalance(
        (members, leaving.clone()),
        directory.clone(),
        (config.node_id.clone(), partitions, config.standbys),
        desired_tx,
    )));
    let alarms = patiently("opening the alarms bucket", || {
        bucket(js_join, ALARMS, config.replicas)
    })
    .await?;
    tasks.push(tokio::spawn(watch_alarms(
        alarms.clone(),
        engine.clone(),
        metrics.clone(),
    )));
    tasks.push(tokio::spawn(judge_repairs(engine.clone(), leases.clone())));
    let handing_over = Arc::new(Semaphore::new(1));
    let ready = patiently("opening the readiness bucket", || {
        expiring_bucket(js_join, "mayfly-ready", config.replicas, READY_TTL)
    })
    .await?;
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
            desired: desired.clone(),
            handing_over: handing_over.clone(),
            ready: ready.clone(),
            next_handover: Instant::now(),
            desired_since: None,
            leaving: leaving.clone(),
            owned: owned.clone(),
            metrics: metrics.clone(),
            alarms: alarms.clone(),
            snapshot_records: config.snapshot_records,
            copy: copies.next().expect("one per partition"),
        };
        tasks.push(tokio::spawn(partition.serve()));
    }
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
        directory,
        ClusterNode {
            tasks,
            queues,
            leaving: leaving_tx,
            owned,
            node: config.node_id.clone(),
            members: members_store,
            metrics,
            keys,
        },
    ))
}

/// How long a node stays in the member list after its last heartbeat: a node gone that long
/// is left out of the assignment (its partitions lapse to others within a lease anyway).
const MEMBER_TTL: Duration = Duration::from_secs(10);

/// How often a node renews its membership, and recomputes the assignment.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// Keeps this node in the member list (`mayfly-members`, whose keys expire [`MEMBER_TTL`]
/// after their last write), and measures its clock against the NATS servers' by the time
/// they stamp on each heartbeat: beyond a second off
/// ([`crate::cluster_metrics::MAX_CLOCK_SKEW_MS`]) the node owns nothing.
async fn heartbeat(
    (members, leaving): (jetstream::kv::Store, watch::Receiver<bool>),
    node: String,
    (metrics, engine): (Arc<ClusterMetrics>, Engine),
) {
    let mut last_within = metrics.clock_ok();
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        if *leaving.borrow() {
            // Left the member list: not back on it.
            return;
        }
        let report = copies_report(&metrics, &engine);
        match sample_clock(&members, &node, report.into()).await {
            // Two samples in a row decide: one may be a replica's answer gone stale.
            Some(skew) => {
                let within = metrics.record_clock_skew(skew);
                if within == last_within && within != metrics.clock_ok() {
                    metrics.set_clock_ok(within);
                    if within {
                        tracing::info!(
                            skew_ms = skew,
                            "this node's clock agrees with the NATS servers' again"
                        );
                    } else {
                        tracing::error!(
                            skew_ms = skew,
                            "this node's clock is more than 1 s from the NATS servers' time: it owns no partition until that is mended"
                        );
                    }
                }
                last_within = within;
            }
            None => continue,
        }
    }
}

/// What this node's heartbeat says of its copies (see [`crate::cluster_report`]).
fn copies_report(metrics: &ClusterMetrics, engine: &Engine) -> String {
    let now = SystemClocks.wall_ms();
    let copies: Vec<PartitionCopy> = (0..metrics.partitions.len())
        .filter_map(|p| {
            let m = &metrics.partitions[p];
            let partition = p as u32;
            if m.served.load(Ordering::Relaxed) {
                Some(PartitionCopy::Serves {
                    partition,
                    log_end: engine.log_end(p),
                })
            } else {
                m.apply_lag_ms(now).map(|lag_ms| PartitionCopy::Follows {
                    partition,
                    applied: m.applied.load(Ordering::Relaxed),
                    lag_ms,
                })
            }
        })
        .collect();
    cluster_report::encode(&copies)
}

/// Renews this node's membership and measures its clock by it: this node's wall clock minus
/// the time the NATS server stamped on the write. `None`: not written, or the entry read back
/// is not this write (a replica behind).
async fn sample_clock(members: &jetstream::kv::Store, node: &str, report: Bytes) -> Option<i64> {
    let before = SystemClocks.wall_ms();
    let revision = match members.put(node, report).await {
        Ok(revision) => revision,
        Err(e) => {
            tracing::warn!(error = %e, "membership not renewed; retrying");
            return None;
        }
    };
    let entry = members.entry(node).await.ok()??;
    let after = SystemClocks.wall_ms();
    if entry.revision != revision {
        return None;
    }
    let server = (entry.created.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
    Some(clock_skew_ms(before, server, after))
}

/// Recomputes the assignment the cluster moves to, every [`HEARTBEAT`]: from each
/// partition's current owner (as the directory's watch has it), over the members present
/// (`assign` keeps what it can and evens ownership out). Every node computes it from the same
/// state, give or take a watch's lag; only a partition's owner acts on it, by handing the
/// partition over to a node that says it is ready.
async fn rebalance(
    (members, mut leaving): (jetstream::kv::Store, watch::Receiver<bool>),
    directory: Arc<Directory>,
    (node, partitions, standbys): (String, usize, usize),
    desired: watch::Sender<Arc<Assignment>>,
) {
    loop {
        // At once when the node starts leaving.
        if let Ok(Err(_)) = tokio::time::timeout(HEARTBEAT, leaving.changed()).await {
            // The node is gone.
            return;
        }
        let leaving = *leaving.borrow();
        let live = match live_members(&members, &node).await {
            // Leaving: the others, even if this node's entry has not gone yet.
            Ok(mut live) if leaving => {
                live.retain(|n| *n != node);
                live
            }
            // A list without this node is one its heartbeats have not reached (NATS away):
            // nothing is moved on it, or the node would hand everything away and back.
            Ok(live) if live.contains(&node) => live,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "member list not read");
                continue;
            }
        };
        let mut current = Vec::with_capacity(partitions);
        // Every node computes the same assignment from the same leases and members (a node
        // hands a partition over only to one that agrees it is to have it), so the standbys
        // are a function of them too: ranked by rendezvous hashing, they stay put while the
        // owner and the members do.
        for p in 0..partitions {
            match directory.owner(p as u32).await {
                Ok(owner) => current.push(Replicas {
                    standbys: ranked_standbys(p, &owner, &live, standbys),
                    owner,
                }),
                Err(e) => {
                    tracing::debug!(partition = p, error = %e, "lease not read");
                    break;
                }
            }
        }
        // Nobody left to assign to (the last node leaving), or a lease not read.
        if live.is_empty() || current.len() < partitions {
            continue;
        }
        let next = assign(
            Some(&Assignment {
                partitions: current,
            }),
            partitions,
            &live,
            standbys,
        );
        desired.send_if_modified(|d| {
            let changed = **d != next;
            if changed {
                *d = Arc::new(next);
            }
            changed
        });
    }
}

/// A KV bucket of the cluster's (made where missing): one value per key, replicated, on disk.
async fn bucket(
    js: &Context,
    name: &str,
    replicas: usize,
) -> Result<jetstream::kv::Store, jetstream::context::CreateKeyValueError> {
    // A maximum age of zero: kept until changed.
    expiring_bucket(js, name, replicas, Duration::ZERO).await
}

/// A bucket of the cluster's whose keys expire `max_age` after they were last written.
async fn expiring_bucket(
    js: &Context,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<jetstream::kv::Store, jetstream::context::CreateKeyValueError> {
    js.create_key_value(jetstream::kv::Config {
        bucket: name.to_string(),
        history: 1,
        num_replicas: replicas,
        max_age,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
}

/// Every node must place documents over the same number of partitions: the first node to
/// join records it, and a node that says otherwise is refused. Returns the key the cluster's
/// continuation tokens are sealed with, drawn likewise by the first node.
async fn agree_on_settings(
    js: &Context,
    config: &ClusterConfig,
    seal: &ClusterSeal,
) -> Result<(TokenKey, String), ServeError> {
    let kv = patiently("opening the cluster's settings", || {
        bucket(js, "mayfly-cluster", config.replicas)
    })
    .await?;
    let ours = config.partitions.to_string();
    let stored = agree(&kv, "partitions", ours.clone().into(), "partition count").await?;
    let stored = String::from_utf8_lossy(&stored).to_string();
    if stored != ours {
        return Err(failed(
            "joining",
            format!(
                "the cluster has {stored} partitions and this node was started with --partitions {ours}; start it with --partitions {stored}"
            ),
        ));
    }
    // Continuation tokens are sealed with one key cluster-wide: a client resumes a query or a
    // feed at whichever node it calls next.
    let drawn = TokenKey::random();
    let sealed = seal.seal("continuation-key", &drawn.to_bytes()).into();
    let stored = agree(&kv, "continuation-key", sealed, "continuation key").await?;
    // Not retried: a node given the wrong key file (or none) fails at once, saying so.
    let opened = seal
        .open("continuation-key", &stored)
        .map_err(ServeError::Config)?;
    let stored = <[u8; 32]>::try_from(&opened[..]).map_err(|_| {
        ServeError::Config(format!(
            "the cluster's continuation key is {} bytes, not 32",
            opened.len()
        ))
    })?;
    // The cluster's identity, drawn by whoever asks first: a node's data directory is bound
    // to it (a directory of another cluster holds positions in other logs).
    let drawn: String = TokenKey::random().to_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let id = agree(&kv, "id", drawn.into(), "identity").await?;
    Ok((
        TokenKey::from_bytes(stored),
        String::from_utf8_lossy(&id).to_string(),
    ))
}

/// The value of the cluster's setting `key`: `proposed`, if this node is the first to ask,
/// else what the first stored (create, then read). Retried while the bucket's stream elects
/// its leader (reads find no responder until then).
async fn agree(
    kv: &jetstream::kv::Store,
    key: &str,
    proposed: Bytes,
    what: &str,
) -> Result<Bytes, ServeError> {
    patiently(&format!("reading the cluster's {what}"), || async {
        let _ = kv.create(key, proposed.clone()).await;
        match kv.get(key).await {
            Ok(Some(stored)) => Ok(stored),
            Ok(None) => Err("it is missing".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// Where the node keeps the identity of the cluster its data directory belongs to.
const CLUSTER_STATE: &str = "cluster";

/// Where the node keeps its applied position in the catalog log.
const CATALOG_STATE: &str = "catalog";

/// Opens the node's own storage and what it holds of each partition (docs/cluster.md, "A
/// node's own copy"): a copy whose kept state says where it stands in its partition's log
/// resumes from there; any other (none kept, holding more than its state says, or cut off
/// while loading a snapshot) is emptied, and rebuilt from the log. Also the catalog log's
/// position applied. Without a data directory (memory storage) every copy starts empty.
async fn open_copies(
    disk: Option<&DiskOptions>,
    partitions: usize,
    cluster_id: &str,
) -> Result<(Arc<dyn Storage>, Vec<Followed>, u64), ServeError> {
    let (disk, cluster_id) = (disk.cloned(), cluster_id.to_string());
    let empty = |p: usize| Followed::new(p as u32);
    tokio::task::spawn_blocking(move || {
        let Some(options) = disk else {
            let memory: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
            return Ok((memory, (0..partitions).map(empty).collect(), 0));
        };
        let path = options.path.display().to_string();
        let disk = DiskStorage::open(&DiskOptions {
            shards: Some(partitions),
            ..options
        })
        .map_err(ServeError::Storage)?;
        if disk.placement() != Placement::Xxh3 {
            return Err(ServeError::Config(format!(
                "the data directory {path} places documents by an older format than cluster mode's: give a new --data-dir"
            )));
        }
        let inner: Arc<dyn Storage> = Arc::new(disk);
        let unreadable = |e: StorageError| {
            ServeError::Config(format!("the data directory {path}: {e}"))
        };
        let catalog = match inner.node_state(CATALOG_STATE).map_err(unreadable)? {
            Some(bytes) => u64::from_be_bytes(bytes.as_ref().try_into().map_err(|_| {
                ServeError::Config(format!(
                    "the data directory {path}: its catalog log position is unreadable"
                ))
            })?),
            None => 0,
        };
        match inner.node_state(CLUSTER_STATE).map_err(unreadable)? {
            Some(stored) if stored.as_ref() != cluster_id.as_bytes() => {
                return Err(ServeError::Config(format!(
                    "the data directory {path} belongs to another cluster ({}; this one is {cluster_id}): give this node an empty --data-dir",
                    String::from_utf8_lossy(&stored)
                )));
            }
            Some(_) => {}
            None => inner
                .put_node_state(CLUSTER_STATE, cluster_id.as_bytes())
                .map_err(unreadable)?,
        }
        let stated = inner.node_state(CATALOG_STATE).map_err(unreadable)?.is_some();
        if !stated {
            if !inner.load_catalog().map_err(unreadable)?.databases.is_empty() {
                return Err(ServeError::Config(format!(
                    "the data directory {path} holds databases but not where it stands in the cluster's catalog log (a single node's directory): give an empty --data-dir"
                )));
            }
            // Said before any entry is applied: a crash after the first leaves it applied
            // again, refused as a repeat, rather than a directory refused at start.
            inner
                .put_node_state(CATALOG_STATE, &0u64.to_be_bytes())
                .map_err(unreadable)?;
        }
        let mut copies = Vec::with_capacity(partitions);
        let (mut resumed, mut rebuilt) = (0, 0);
        for p in 0..partitions {
            let shard = inner.shard(p);
            let held = shard.change_log().last_log_seq().map_err(unreadable)?;
            let stored = copy_state::load(&*inner, p as u32).map_err(|e| {
                ServeError::Config(format!(
                    "the data directory {path}: {e}; move it aside to rebuild this node from the cluster"
                ))
            })?;
            match stored {
                copy_state::Stored::At(f) if held <= f.chain.last => {
                    tracing::info!(
                        partition = p,
                        at = f.chain.last,
                        epoch = f.chain.epoch,
                        stream_seq = f.subject_seq,
                        "resuming this node's copy where it stood in the partition's log"
                    );
                    resumed += 1;
                    copies.push(*f);
                }
                copy_state::Stored::Unknown => {
                    // Nothing known of it (none, unless its first state was lost).
                    shard.clear().map_err(unreadable)?;
                    copies.push(empty(p));
                }
                copy_state::Stored::At(known) | copy_state::Stored::Loading(known) => {
                    tracing::info!(
                        partition = p,
                        held,
                        at = known.chain.last,
                        stream_seq = known.subject_seq,
                        "this node's copy holds what the log may not: rebuilding it from the log, which must still hold what the copy knew"
                    );
                    rebuilt += 1;
                    // Marked first: a crash while emptying it leaves it marked, with what the
                    // log must still hold.
                    copy_state::save(&*inner, p as u32, Kept::Loading, &known);
                    shard.clear().map_err(unreadable)?;
                    copies.push(Followed::rebuilt(&known));
                }
            }
        }
        tracing::info!(
            data_dir = path,
            resumed,
            rebuilt,
            catalog_entries = catalog,
            "opened this node's copies"
        );
        Ok((inner, copies, catalog))
    })
    .await
    .map_err(|e| ServeError::Io(std::io::Error::other(e)))?
}

/// Applies the catalog log on this node, for as long as it runs.
fn follow_catalog(catalog: &Arc<CatalogLog<CatalogLogAnswer>>, engine: &Engine) -> JoinHandle<()> {
    let applier = engine.clone();
    let apply: Apply<CatalogLogAnswer> = Arc::new(move |seq, entry| {
        let engine = applier.clone();
        Box::pin(async move {
            let (change, at) = CatalogChange::decode(&entry)?;
            let applied = tokio::task::spawn_blocking(move || {
                let answer = change.apply(&engine, Some(at));
                // After the change: a restart applies the log on from here (an entry applied
                // again, its state lost in a crash, is refused as a repeat and changes nothing).
                if let Err(e) = engine.put_node_state(CATALOG_STATE, &seq.to_be_bytes()) {
                    tracing::warn!(error = %e, "the catalog log's position was not kept");
                }
                answer
            })
            .await;
            match applied {
                Ok(answer) => answer,
                Err(e) => Err(Status::internal(format!("catalog task failed: {e}"))),
            }
        })
    });
    let log = catalog.clone();
    tokio::spawn(log.follow(apply))
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

/// How recent a member's last heartbeat must be for the assignment to count it: two
/// heartbeats and a second of clock skew. Its key stays [`MEMBER_TTL`]; a node killed just
/// now would otherwise stay a partition's first standby, and the nodes behind it would wait an
/// extra lease to take the partition.
const HEARTBEAT_FRESH: Duration = Duration::from_secs(5);

/// The members whose last heartbeat is fresh ([`HEARTBEAT_FRESH`], by the time NATS stamped on
/// it against this node's clock, within a second of each other), and `node` itself while its
/// key is there; in order.
async fn live_members(
    members: &jetstream::kv::Store,
    node: &str,
) -> Result<Vec<String>, ServeError> {
    let now_ms = SystemClocks.wall_ms() as i128;
    let (mut live, mut stale) = (Vec::new(), Vec::new());
    for id in node_ids(members).await? {
        let entry = members
            .entry(&id)
            .await
            .map_err(|e| failed("reading the member list", e))?;
        let Some(entry) = entry else { continue };
        let age_ms = now_ms - entry.created.unix_timestamp_nanos() / 1_000_000;
        if id == node || age_ms <= HEARTBEAT_FRESH.as_millis() as i128 {
            live.push(id);
        } else {
            stale.push(id);
        }
    }
    // Every other member stale at once is NATS slow to take heartbeats (or this node's view
    // of them behind), not every other node dead: counted as they are, or this node would
    // take every partition as its own.
    if live.len() == 1 && !stale.is_empty() {
        live.append(&mut stale);
        live.sort();
    }
    Ok(live)
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
    /// The assignment the cluster is moving to (see [`rebalance`]).
    desired: watch::Receiver<Arc<Assignment>>,
    /// One handover at a time on this node: requests to a partition being handed over wait
    /// for it, and the cluster moves one partition at a time per node.
    handing_over: Arc<Semaphore>,
    /// Which node is caught up with each partition's log and ready to take it (keys expire
    /// [`READY_TTL`] after they are written): a partition is handed only to a node that says
    /// so, never to one that died or cannot serve it.
    ready: jetstream::kv::Store,
    /// No handover is tried before this instant (one was given up just before).
    next_handover: Instant,
    /// The other node the assignment has given the partition to, and since when: a handover
    /// waits until the assignment has held [`ASSIGNMENT_SETTLE`] (while nodes start together
    /// and leases move, it changes from one recomputation to the next).
    desired_since: Option<(String, Instant)>,
    /// The node is leaving the cluster: it hands its partitions over without waiting its turn,
    /// and contends for none.
    leaving: watch::Receiver<bool>,
    /// The partitions this node serves, counted for [`ClusterNode::leave`].
    owned: Arc<AtomicUsize>,
    metrics: Arc<ClusterMetrics>,
    /// The cluster's alarms: a partition whose log diverged is stopped on every node.
    alarms: jetstream::kv::Store,
    /// The owner snapshots the partition into its log after this many records.
    snapshot_records: u64,
    /// This node's copy of the partition as it started: where it stands in the log.
    copy: Followed,
}

/// An owner's snapshots of its partition, and its purges of the log below them.
struct Snapshots {
    /// The log position of the last snapshot queued (or where the ownership began).
    at: u64,
    since: Instant,
    /// The stream sequence the log was last purged below.
    purged_below: u64,
}

/// Records after which an owner snapshots a partition, unless told otherwise
/// ([`ClusterConfig::snapshot_records`]).
pub const DEFAULT_SNAPSHOT_RECORDS: u64 = 100_000;

/// How often an owner looks whether a snapshot is due.
const SNAPSHOT_CHECK: Duration = Duration::from_secs(1);

/// An owner snapshots a partition with any records since the last after this long.
const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(600);

/// The bucket of the cluster's alarms: key `diverged.<partition>`, whose value says where a
/// node found the partition's log not continuing the history it applied. While it is there no
/// node serves or takes the partition; an operator clears it (`nats kv del mayfly-alarms
/// diverged.<partition>`) once the log is restored (docs/cluster.md, "Repair").
const ALARMS: &str = "mayfly-alarms";

/// Keeps every shard's diverged mark as the alarms bucket has it: a partition whose log one
/// node found diverged answers `LOG_DIVERGED` on every node.
async fn watch_alarms(alarms: jetstream::kv::Store, engine: Engine, metrics: Arc<ClusterMetrics>) {
    loop {
        match alarms.watch_with_history("diverged.>").await {
            Ok(mut watch) => {
                while let Some(entry) = watch.next().await {
                    let Ok(entry) = entry else { break };
                    let Some(p) = entry
                        .key
                        .strip_prefix("diverged.")
                        .and_then(|p| p.parse::<usize>().ok())
                        .filter(|p| *p < metrics.partitions.len())
                    else {
                        continue;
                    };
                    let why = match entry.operation {
                        jetstream::kv::Operation::Put => {
                            Some(String::from_utf8_lossy(&entry.value).to_string())
                        }
                        jetstream::kv::Operation::Delete | jetstream::kv::Operation::Purge => None,
                    };
                    match &why {
                        Some(why) => {
                            tracing::error!(partition = p, why = %why, "the partition's log diverged: it serves nothing until an operator restores the log and clears the alarm")
                        }
                        None => tracing::warn!(
                            partition = p,
                            "the partition's divergence alarm was cleared"
                        ),
                    }
                    engine.set_diverged(p, why.as_deref());
                    metrics.partitions[p]
                        .diverged
                        .store(why.is_some(), Ordering::Relaxed);
                }
            }
            Err(e) => tracing::debug!(error = %e, "alarms watch not made"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What a divergence alarm says: where the history of the node that found it ended, and why.
struct Alarm {
    /// The owner epoch of the last message that node applied.
    epoch: u64,
}

impl Alarm {
    /// The alarm's text: `at position <last> of owner epoch <epoch>: <why>`.
    fn text(applied: &mayfly_cluster::Chain, why: &str) -> String {
        format!(
            "at position {} of owner epoch {}: {why}",
            applied.last, applied.epoch
        )
    }

    /// Whether alarm `standing` stays rather than `new`: it names an epoch no later, or is
    /// not one this version reads (an operator's, or an older node's).
    fn stands_before(standing: &str, new: &str) -> bool {
        match (Alarm::parse(standing), Alarm::parse(new)) {
            (Some(old), Some(new)) => old.epoch <= new.epoch,
            _ => true,
        }
    }

    fn parse(text: &str) -> Option<Alarm> {
        let (_, rest) = text
            .strip_prefix("at position ")?
            .split_once(" of owner epoch ")?;
        let (epoch, _) = rest.split_once(": ")?;
        Some(Alarm {
            epoch: epoch.parse().ok()?,
        })
    }
}

/// Says, every second, for each partition whose log diverged, whether its owner may be
/// re-basing it ([`Partition::rebase`]): the lease is held, unlapsed, at the epoch the alarm
/// names (the finder's history ends in that owner's epoch). Such a partition answers
/// `LOG_REPAIRING` (retryable); any other `LOG_DIVERGED` (an operator must act).
async fn judge_repairs(engine: Engine, leases: Arc<Leases>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for p in 0..engine.shard_count() {
            let Some(why) = engine.diverged(p) else {
                continue;
            };
            let Some(alarm) = Alarm::parse(&why) else {
                engine.set_log_repairing(p, false);
                continue;
            };
            let repairing = match leases.read(p as u32).await {
                Ok(Some((lease, _))) => {
                    lease.epoch == alarm.epoch && lease.lease_until > SystemClocks.wall_ms()
                }
                Ok(None) => false,
                // NATS not answering: judged again next time.
                Err(_) => continue,
            };
            engine.set_log_repairing(p, repairing);
        }
    }
}

/// What the assignment gives a node of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// It is to own it: it keeps its copy caught up and says when it is ready for a handover.
    Owner,
    /// It keeps its copy caught up, and contends in this rank when the owner's lease lapses.
    Standby(usize),
    /// Nothing: it contends only after the standbys had their chance.
    None,
}

/// How often a standby catches its copy up with the log. Each catch-up reads the log through a
/// new consumer, so a few seconds' commits at a time cost less than a few hundred ms' (on this
/// machine, with a standby per partition, cluster writes ran at 2,725/s with 500 ms); a tail of
/// 2 s replays in tens of ms at takeover (about 250,000 records/s). The node a partition is to
/// be handed to catches up every lease quarter, so that it is ready at once.
const STANDBY_FOLLOW: Duration = Duration::from_secs(2);

/// How long a node's word that it is ready to take a partition holds.
const READY_TTL: Duration = Duration::from_secs(3);

/// How long a handover waits for the partition's commits to be acknowledged before it gives
/// up (the owner then serves on).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the assignment must have given a partition to another node before its owner hands
/// it over (two recomputations).
const ASSIGNMENT_SETTLE: Duration = Duration::from_secs(4);

/// How long an owner waits after a handover it gave up before it tries again.
const HANDOVER_BACKOFF: Duration = Duration::from_secs(10);

impl Partition {
    /// Contends for the partition's lease, takes the partition over and serves it while the
    /// lease is renewed; after losing it or handing it over, contends again, following on from
    /// the log's end as this node left it, for as long as its copy is the log's.
    async fn serve(mut self) {
        let mut followed = std::mem::replace(&mut self.copy, Followed::new(self.p));
        let mut first = true;
        loop {
            let held = self.contend(first, &mut followed).await;
            first = false;
            if !self.own(held, &mut followed).await {
                return;
            }
        }
    }

    /// Waits until this node holds the partition's lease. While the assignment gives the
    /// partition to this node, it keeps its copy caught up with the log meanwhile, so that
    /// a handover finds it ready.
    async fn contend(&self, first: bool, followed: &mut Followed) -> Held {
        let clocks = SystemClocks;
        let interval = renew_interval(&LeaseTiming::DEFAULT);
        let mut watch = Watch::default();
        // None: a standby catches up at once.
        let mut last_followed: Option<Instant> = None;
        // A free partition goes first to the node the assignment gives it; one with an owner
        // goes to whoever finds its lease lapsed first.
        let free = matches!(self.leases.read(self.p).await, Ok(None));
        if first && !self.preferred && free {
            tokio::time::sleep(Duration::from_millis(2 * LeaseTiming::DEFAULT.length_ms)).await;
        }
        loop {
            if *self.leaving.borrow() {
                // Leaving: this node takes no partition again.
                std::future::pending::<()>().await;
            }
            // Not while its log is known to have diverged (on any node), nor by a clock off,
            // nor with storage that cannot make writes durable.
            if !self.metrics.clock_ok()
                || self.engine.diverged(self.p as usize).is_some()
                || self.engine.storage_failure().is_some()
            {
                tokio::time::sleep(interval).await;
                continue;
            }
            let role = self.role();
            // On a lapse the first standby, whose copy is caught up, goes first; the rest wait
            // one more lease, and catch up from the log only if it did not take the partition.
            watch.set_patience(match role {
                Role::Owner | Role::Standby(0) => 0,
                Role::Standby(_) => LeaseTiming::DEFAULT.length_ms,
                Role::None if self.has_standby() => LeaseTiming::DEFAULT.length_ms,
                Role::None => 0,
            });
            match self
                .leases
                .try_acquire(self.p, &self.node, &mut watch, &clocks)
                .await
            {
                Ok(Some(held)) => return held,
                Ok(None) => {}
                Err(e) => tracing::debug!(partition = self.p, error = %e, "lease not read"),
            }
            let metrics = &self.metrics.partitions[self.p as usize];
            if role == Role::None {
                metrics.following.store(false, Ordering::Relaxed);
            } else if role == Role::Owner
                || last_followed.is_none_or(|at| at.elapsed() >= STANDBY_FOLLOW)
            {
                last_followed = Some(Instant::now());
                let since = clocks.wall_ms();
                match catch_up(&self.stream, &self.engine, self.p, followed).await {
                    Ok(()) => {
                        metrics.caught_up(followed.chain.last, since);
                        if role == Role::Owner {
                            let key = format!("p.{}", self.p);
                            if let Err(e) = self.ready.put(key, self.node.clone().into()).await {
                                tracing::debug!(partition = self.p, error = %e, "readiness not said");
                            }
                        }
                    }
                    Err(CatchUpError::Diverged(d)) => {
                        self.raise_alarm(&d.to_string(), &followed.known_chain())
                            .await
                    }
                    Err(e) => tracing::debug!(partition = self.p, error = %e, "not caught up yet"),
                }
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Stops the partition on every node: its log does not continue the history this node
    /// applied (`why`), which ends at `applied`. Set locally at once, and in the alarms bucket
    /// for the others (tried until written: a node that cannot say it keeps the partition
    /// stopped here meanwhile). The alarm says where the finder's history ended: an owner
    /// whose history it is a prefix of re-bases the log on its copy ([`Partition::rebase`]).
    async fn raise_alarm(&self, why: &str, applied: &mayfly_cluster::Chain) {
        let p = self.p as usize;
        let why = &Alarm::text(applied, why);
        tracing::error!(
            partition = p,
            why,
            "the partition's log diverged: raising the alarm"
        );
        self.engine.set_diverged(p, Some(why));
        self.metrics.partitions[p]
            .diverged
            .store(true, Ordering::Relaxed);
        let key = format!("diverged.{p}");
        // The alarm naming the earliest epoch stands: a history an earlier owner wrote may hold
        // writes the current owner never saw, and then no re-base may go ahead (a later finder
        // must not write over that evidence).
        loop {
            match self.write_alarm(&key, why).await {
                Ok(standing) => {
                    self.engine.set_diverged(p, Some(&standing));
                    return;
                }
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "the divergence alarm not written yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Writes alarm `why` at `key` unless one naming an epoch no later (or one not read as an
    /// alarm of this version's) is there; the alarm that stands.
    async fn write_alarm(&self, key: &str, why: &str) -> Result<String, String> {
        let fail = |e: &dyn std::fmt::Display| e.to_string();
        match self.alarms.entry(key).await.map_err(|e| fail(&e))? {
            Some(entry) if entry.operation == jetstream::kv::Operation::Put => {
                let standing = String::from_utf8_lossy(&entry.value).to_string();
                if Alarm::stands_before(&standing, why) {
                    return Ok(standing);
                }
                self.alarms
                    .update(key, why.to_string().into(), entry.revision)
                    .await
                    .map_err(|e| fail(&e))?;
            }
            _ => {
                self.alarms
                    .create(key, why.to_string().into())
                    .await
                    .map_err(|e| fail(&e))?;
            }
        }
        Ok(why.to_string())
    }

    /// What the assignment gives this node of the partition.
    fn role(&self) -> Role {
        let desired = self.desired.borrow();
        match desired.partitions.get(self.p as usize) {
            Some(r) if r.owner == self.node => Role::Owner,
            Some(r) => r
                .standbys
                .iter()
                .position(|s| *s == self.node)
                .map_or(Role::None, Role::Standby),
            None => Role::None,
        }
    }

    /// Whether the assignment names a standby for the partition.
    fn has_standby(&self) -> bool {
        let desired = self.desired.borrow();
        desired
            .partitions
            .get(self.p as usize)
            .is_some_and(|r| !r.standbys.is_empty())
    }

    /// The node the assignment gives the partition to.
    fn desired_owner(&self) -> Option<String> {
        let desired = self.desired.borrow();
        desired
            .partitions
            .get(self.p as usize)
            .map(|r| r.owner.clone())
            .filter(|o| !o.is_empty())
    }

    /// Takes the partition over with `held` and serves it until the lease is lost or the
    /// partition handed over; then `followed` is where this node's copy stands in the log.
    /// `false`: it cannot serve the partition again (its copy may hold what the log does not,
    /// or the log diverged).
    async fn own(&mut self, held: Held, followed: &mut Followed) -> bool {
        // Following until taken over; served only within the lease from then on, renewed while
        // the node catches up.
        self.engine.set_following(self.p as usize, true);
        self.lease_end(&held);
        let (epoch, floor, handed) = (held.epoch, held.replaced_until(), held.was_handed());
        let lost = Arc::new(AtomicBool::new(false));
        let (stop_renewing, stop) = watch::channel(false);
        let mut renewing = AbortOnDrop(tokio::spawn(self.renew(held, lost.clone(), stop)));
        let still_held = || !lost.load(Ordering::SeqCst);
        let mut refusals = 0;
        // How much of the log the takeover replays (a standby's copy is nearly there).
        let (from, began) = (followed.chain.last, Instant::now());
        loop {
            match become_owner(
                &self.js,
                &self.stream,
                &self.engine,
                (&self.queue, self.p, epoch, floor),
                (followed, &still_held),
            )
            .await
            {
                Ok(position) => {
                    tracing::info!(
                        partition = self.p,
                        epoch = position.epoch,
                        log_end = position.last,
                        handed,
                        replayed = position.last.saturating_sub(from),
                        took_ms = began.elapsed().as_millis() as u64,
                        "serving the partition"
                    );
                    let m = &self.metrics.partitions[self.p as usize];
                    let count = if handed { &m.handovers } else { &m.failovers };
                    count.fetch_add(1, Ordering::Relaxed);
                    m.served.store(true, Ordering::Relaxed);
                    break;
                }
                // NATS not answering: again, while the lease holds.
                Err(CatchUpError::Takeover(e @ TakeoverError::Unavailable(_))) if still_held() => {
                    tracing::info!(partition = self.p, error = %e, "taking the partition over: retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // A later owner's message ends the log: this lease is stale. Let it go.
                Err(CatchUpError::Takeover(e @ TakeoverError::Superseded { .. })) => {
                    tracing::info!(partition = self.p, error = %e, "a later owner has the partition");
                    let _ = stop_renewing.send(true);
                    let _ = (&mut renewing.0).await;
                    return true;
                }
                // A commit naming a collection this node's catalog has not reached yet: the
                // catalog log catches up meanwhile. Given up after about 10 s (the lease then
                // lapses, and another node tries).
                Err(CatchUpError::Refused(e)) if still_held() && refusals < 40 => {
                    refusals += 1;
                    tracing::info!(partition = self.p, error = %e, "a commit was refused: retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // Lost before the takeover: nothing was published, and `followed` is still
                // where this copy stands in the log.
                Err(
                    CatchUpError::LeaseLost | CatchUpError::Takeover(_) | CatchUpError::Refused(_),
                ) if !still_held() => {
                    tracing::info!(
                        partition = self.p,
                        "lost the lease while taking the partition over"
                    );
                    let _ = (&mut renewing.0).await;
                    return true;
                }
                Err(e) => {
                    // Unrenewed, the lease lapses and another node takes the partition.
                    tracing::error!(partition = self.p, error = %e, "cannot serve the partition");
                    let diverged = matches!(e, CatchUpError::Diverged(_));
                    if let CatchUpError::Diverged(d) = &e {
                        self.raise_alarm(&d.to_string(), &followed.known_chain())
                            .await;
                    }
                    renewing.0.abort();
                    self.engine.set_following(self.p as usize, true);
                    // After a divergence it follows again once the log is repaired (the
                    // alarm cleared): its copy is what it applied of the log.
                    return diverged;
                }
            }
        }
        self.owned.fetch_add(1, Ordering::SeqCst);
        self.metrics.partitions[self.p as usize]
            .following
            .store(false, Ordering::Relaxed);
        let mut snapshots = Snapshots {
            at: self.engine.log_end(self.p as usize),
            since: Instant::now(),
            purged_below: 0,
        };
        let position = loop {
            tokio::select! {
                // Lost: the renewals stopped serving the partition.
                _ = &mut renewing.0 => break self.queue.stop(),
                () = tokio::time::sleep(SNAPSHOT_CHECK) => {
                    if !self.tend(epoch, &mut snapshots).await {
                        // A re-base begun and not finished, the alarm gone meanwhile (the log
                        // is not this node's to publish to), or storage failed: the lease
                        // lapses to another.
                        tracing::warn!(partition = self.p, "giving the partition up");
                        break self.queue.stop();
                    }
                }
                wanted = self.handover_wanted() => {
                    if let Some(position) =
                        self.hand_over(wanted, &stop_renewing, &mut renewing).await
                    {
                        break position;
                    }
                }
            }
        };
        // Whatever happened in between, the shard follows from here.
        self.engine.set_following(self.p as usize, true);
        self.owned.fetch_sub(1, Ordering::SeqCst);
        self.metrics.partitions[self.p as usize]
            .served
            .store(false, Ordering::Relaxed);
        match position {
            Some(position) => {
                // This copy is the log up to there: it follows on from it (no other owner
                // wrote meanwhile: its epochs are as they were).
                let epochs = std::mem::take(&mut followed.epochs);
                *followed = Followed::at(self.p, &position, epochs);
                copy_state::save(&self.engine, self.p, Kept::At, followed);
                true
            }
            None => {
                tracing::warn!(
                    partition = self.p,
                    "stopped owning the partition with commits NATS had not acknowledged: this node's copy may hold what the log does not, and it takes the partition again only after a restart"
                );
                false
            }
        }
    }

    /// An owner's periodic care of its partition's log: a log that lost this owner's
    /// acknowledged messages raises the alarm; a diverged log is re-based on this owner's copy
    /// where it can be; otherwise snapshots and purges.
    /// `false`: this node must give the partition up (its publisher stopped for a re-base
    /// that did not finish, and no alarm is left to finish it for).
    async fn tend(&self, epoch: u64, snapshots: &mut Snapshots) -> bool {
        let p = self.p as usize;
        // Writes can no longer be made durable here: the partition goes to another node.
        if let Some(e) = self.engine.storage_failure() {
            tracing::error!(partition = p, error = %e, "giving the partition up: this node's storage failed");
            return false;
        }
        if self.queue.log_lost() && self.engine.diverged(p).is_none() {
            let applied = mayfly_cluster::Chain {
                partition: self.p,
                last: self.engine.log_end(p),
                link: 0,
                epoch,
            };
            self.raise_alarm(
                "the log lost messages this owner published and NATS acknowledged",
                &applied,
            )
            .await;
        }
        if self.engine.diverged(p).is_some() {
            if self.rebase(epoch).await {
                *snapshots = Snapshots {
                    at: self.engine.log_end(p),
                    since: Instant::now(),
                    purged_below: 0,
                };
            }
            return true;
        }
        if !self.queue.owns() {
            return false;
        }
        self.snapshot_and_purge(snapshots).await;
        true
    }

    /// Whether this node holds the partition's lease at `epoch`, as the stream leader has it,
    /// with at least half a lease to run: checked before a re-base writes to the log.
    async fn holds_lease(&self, epoch: u64) -> bool {
        match self.leases.read(self.p).await {
            Ok(Some((lease, _))) => {
                lease.owner == self.node
                    && lease.epoch == epoch
                    && lease.lease_until
                        > SystemClocks.wall_ms() + LeaseTiming::DEFAULT.length_ms / 2
            }
            _ => false,
        }
    }

    /// Re-bases the diverged log on this owner's copy (docs/cluster.md, "Repair"), if the node
    /// that found the divergence had applied a history that ends in a message of this
    /// ownership's epoch: that history is then a prefix of this owner's (the takeover that
    /// began the epoch continued it, and only this owner writes at its epoch), so this copy
    /// holds every acknowledged write the finder had, and every one this owner published.
    /// Publishes the copy's snapshot at the log's end, purges the log below it (every node then
    /// loads it), publishes on after it and clears the alarm. `false`: not re-based (not this
    /// owner's history, or NATS refused; tried again at the next tick).
    async fn rebase(&self, epoch: u64) -> bool {
        let p = self.p as usize;
        let Some(why) = self.engine.diverged(p) else {
            return false;
        };
        match Alarm::parse(&why) {
            Some(alarm) if alarm.epoch == epoch => {}
            // Found in a history this owner may not hold whole: an operator decides.
            _ => return false,
        }
        tracing::warn!(partition = p, why = %why, "re-basing the partition's log on this node's copy");
        // Nothing more is committed (the diverged shard takes no request, and its purge is
        // stopped while it follows); what was queued goes first, or fails with the queue.
        self.engine.set_following(p, true);
        let _ = self.queue.drained(DRAIN_TIMEOUT).await;
        let _ = self.queue.stop();
        let engine = self.engine.clone();
        let snapshot =
            match tokio::task::spawn_blocking(move || engine.snapshot_shard(p, |s| s)).await {
                Ok(Ok(snapshot)) => snapshot,
                Ok(Err(e)) => {
                    tracing::error!(partition = p, error = %e, "no snapshot to re-base on");
                    return false;
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "the snapshot task failed");
                    return false;
                }
            };
        let watermark = self.engine.shard_time(p);
        if !self.holds_lease(epoch).await {
            tracing::warn!(
                partition = p,
                "not re-basing: the lease is not surely this node's"
            );
            return false;
        }
        // The epochs this ownership began with: the re-base is at its own epoch.
        let epochs = self.queue.epochs();
        let (position, first) = match publish_queue::rebase(
            &self.js,
            &self.stream,
            (self.p, epoch, watermark),
            (&snapshot, &epochs),
        )
        .await
        {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "the re-base was not published; retrying");
                return false;
            }
        };
        // The log starts with the re-base: every node's catch-up loads it, whatever it holds.
        // Only while the lease holds: a later owner's acknowledged commits may follow it.
        if !self.holds_lease(epoch).await {
            tracing::warn!(
                partition = p,
                "the re-base is published, but the lease is not surely this node's: not purging"
            );
            return false;
        }
        if let Err(e) = self
            .stream
            .purge()
            .filter(subject(self.p))
            .sequence(first)
            .await
        {
            tracing::warn!(partition = p, error = %e, "the log below the re-base was not purged; retrying");
            return false;
        }
        let generation = self.queue.start(&position, watermark, epochs);
        tokio::spawn(self.queue.clone().publish(
            self.js.clone(),
            self.stream.clone(),
            (position, generation),
        ));
        self.engine.set_following(p, false);
        // Cleared last: the nodes catch up from the log only once it is.
        let key = format!("diverged.{p}");
        while let Err(e) = self.alarms.delete(&key).await {
            tracing::warn!(partition = p, error = %e, "the divergence alarm not cleared yet");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tracing::warn!(
            partition = p,
            at = snapshot.seq,
            documents = snapshot.documents.len(),
            "re-based the partition's log on this node's copy; the alarm is cleared"
        );
        true
    }

    /// Queues the partition's snapshot once [`Partition::snapshot_records`] records (or
    /// [`SNAPSHOT_INTERVAL`] with any) followed the last, and purges the log below the older
    /// of the last two snapshots published whole (docs/cluster.md, "Snapshots and retention").
    async fn snapshot_and_purge(&self, s: &mut Snapshots) {
        let p = self.p as usize;
        let records = self.engine.log_end(p).saturating_sub(s.at);
        if (records >= self.snapshot_records
            || (records > 0 && s.since.elapsed() >= SNAPSHOT_INTERVAL))
            && self.queue.takes_snapshot_now()
        {
            let (engine, queue) = (self.engine.clone(), self.queue.clone());
            // Under the shard lock: it reads every document's metadata and body there.
            let taken = tokio::task::spawn_blocking(move || {
                engine.snapshot_shard(p, |snap| {
                    let (at, documents) = (snap.seq, snap.documents.len());
                    (queue.enqueue_snapshot(snap), at, documents)
                })
            })
            .await;
            match taken {
                Ok(Ok((true, at, documents))) => {
                    s.at = at;
                    s.since = Instant::now();
                    tracing::info!(
                        partition = p,
                        at,
                        documents,
                        "snapshot queued to the partition's log"
                    );
                }
                Ok(Ok((false, ..))) => {}
                Ok(Err(e)) => tracing::warn!(partition = p, error = %e, "snapshot not taken"),
                Err(e) => tracing::warn!(partition = p, error = %e, "snapshot task failed"),
            }
        }
        if let Some(below) = self.queue.purge_below()
            && below > s.purged_below
        {
            match self
                .stream
                .purge()
                .filter(subject(self.p))
                .sequence(below)
                .await
            {
                Ok(purged) => {
                    s.purged_below = below;
                    tracing::info!(
                        partition = p,
                        below,
                        purged = purged.purged,
                        "purged the partition's log below a snapshot"
                    );
                }
                Err(e) => tracing::warn!(partition = p, error = %e, "log not purged; retrying"),
            }
        }
    }

    /// Resolves once the assignment gives the partition to another node, that node says it
    /// is ready for it, and this node may hand one over (it holds the node's handover
    /// permit): that node, and the permit.
    async fn handover_wanted(&mut self) -> (String, Option<OwnedSemaphorePermit>) {
        loop {
            let leaving = *self.leaving.borrow();
            let desired = self.desired_owner().filter(|o| *o != self.node);
            let settled = match (&desired, &self.desired_since) {
                (Some(to), Some((since_to, since))) if since_to == to => {
                    since.elapsed() >= ASSIGNMENT_SETTLE
                }
                (Some(to), _) => {
                    self.desired_since = Some((to.clone(), Instant::now()));
                    false
                }
                (None, _) => {
                    self.desired_since = None;
                    false
                }
            };
            if Instant::now() >= self.next_handover
                && (settled || leaving)
                && let Some(to) = desired
                && let Ok(Some(ready)) = self.ready.get(format!("p.{}", self.p)).await
                && ready.as_ref() == to.as_bytes()
            {
                // Leaving: every partition at once. Else one at a time on this node.
                if leaving {
                    return (to, None);
                }
                if let Ok(permit) = self.handing_over.clone().try_acquire_owned() {
                    return (to, Some(permit));
                }
            }
            // Checked again soon: readiness is not watched.
            let wait = Duration::from_millis(500);
            if let Ok(Err(_)) = tokio::time::timeout(wait, self.desired.changed()).await {
                // No more assignments (the node is stopping): nothing to hand over.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Hands the partition to `to` (docs/cluster.md, "Leases and fencing", planned handover):
    /// stops taking requests for it, waits until its commits are on the log, stops renewing
    /// and writes the lease over to `to` at the next epoch. `Some`: this node no longer owns
    /// the partition, and where the log ends after its commits if they all made it. `None`:
    /// the commits were not acknowledged in time, and the node serves on (it tries again
    /// later).
    async fn hand_over(
        &mut self,
        (to, _permit): (String, Option<OwnedSemaphorePermit>),
        stop_renewing: &watch::Sender<bool>,
        renewing: &mut AbortOnDrop<Option<Held>>,
    ) -> Option<Option<LogPosition>> {
        tracing::info!(partition = self.p, to = %to, "handing the partition over");
        // Requests for it are refused from here (clients retry, and find the new owner).
        self.engine.set_following(self.p as usize, true);
        if !self.queue.drained(DRAIN_TIMEOUT).await {
            if self.queue.refusal().is_none() {
                // NATS is slow: serve on, and try again later. (A lease lost meanwhile keeps
                // the shard refusing: its renewals ended its service.)
                tracing::warn!(
                    partition = self.p,
                    "the partition's commits were not acknowledged in time: not handed over now"
                );
                self.next_handover = Instant::now() + HANDOVER_BACKOFF;
                self.engine.set_following(self.p as usize, false);
                return None;
            }
            // The log refused this node's commits: it lapses to another node.
            let _ = stop_renewing.send(true);
            let _ = (&mut renewing.0).await;
            return Some(self.queue.stop());
        }
        let _ = stop_renewing.send(true);
        let held = match (&mut renewing.0).await {
            Ok(Some(held)) => held,
            // The lease was lost meanwhile: another node took the partition.
            _ => return Some(self.queue.stop()),
        };
        let position = self.queue.stop();
        if position.is_none() {
            return Some(None);
        }
        match self.leases.hand_over(&held, &self.node, &to).await {
            Ok(true) => tracing::info!(partition = self.p, to = %to, "handed the partition over"),
            Ok(false) => tracing::info!(
                partition = self.p,
                "the lease had moved on before the handover"
            ),
            // Unknown: if it was not written, the lease lapses and is taken as after a kill.
            Err(e) => tracing::warn!(partition = self.p, error = %e, "handover not confirmed"),
        }
        Some(position)
    }

    fn lease_end(&self, held: &Held) {
        set_serving_bounds(&self.engine, self.p, held);
    }

    /// Renews the lease every quarter lease until told to stop (returning the lease) or it
    /// is lost (raising `lost`, stopping the partition's service; `None`).
    fn renew(
        &self,
        mut held: Held,
        lost: Arc<AtomicBool>,
        mut stop: watch::Receiver<bool>,
    ) -> impl Future<Output = Option<Held>> + Send + 'static {
        let (leases, engine, node, p, metrics) = (
            self.leases.clone(),
            self.engine.clone(),
            self.node.clone(),
            self.p,
            self.metrics.clone(),
        );
        async move {
            let clocks = SystemClocks;
            let interval = renew_interval(&LeaseTiming::DEFAULT);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    _ = stop.changed() => return Some(held),
                }
                let renewed = if metrics.clock_ok() {
                    leases.renew(&mut held, &node, &clocks).await
                } else {
                    // A clock this far off must not decide expiry: the lease is let go
                    // (unrenewed, it lapses to another node).
                    tracing::error!(partition = p, "clock skewed: giving the partition up");
                    Ok(false)
                };
                match renewed {
                    Ok(true) => {
                        set_serving_bounds(&engine, p, &held);
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
                    "lost the partition's lease: another node serves it now"
                );
                lost.store(true, Ordering::SeqCst);
                // Lapsed as well as following: a promotion racing this cannot serve.
                engine.serve_until(p as usize, 0, held.time_cap());
                engine.set_following(p as usize, true);
                return None;
            }
        }
    }
}

/// Bounds what `engine` serves of partition `p` by `held`: its end by the lease clock, and
/// the largest wall clock reading it may act on.
fn set_serving_bounds(engine: &Engine, p: u32, held: &Held) {
    engine.serve_until(
        p as usize,
        held.serves_until().unwrap_or(0),
        held.time_cap(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alarm_names_the_epoch_its_finders_history_ends_in() {
        let applied = mayfly_cluster::Chain {
            partition: 3,
            last: 41,
            link: 7,
            epoch: 5,
        };
        let text = Alarm::text(&applied, "the log went back: a: b");
        assert_eq!(
            text,
            "at position 41 of owner epoch 5: the log went back: a: b"
        );
        assert_eq!(Alarm::parse(&text).map(|a| a.epoch), Some(5));
        // An operator's or an older version's text: no re-base on it.
        assert!(Alarm::parse("messages were lost").is_none());
        assert!(Alarm::parse("at position 1 of owner epoch x: y").is_none());
        // The earliest epoch's alarm stands: a later finder does not write over it.
        let later = "at position 90 of owner epoch 6: a gap";
        assert!(Alarm::stands_before(&text, later));
        assert!(!Alarm::stands_before(later, &text));
        assert!(Alarm::stands_before("restored by hand", &text));
    }
}
