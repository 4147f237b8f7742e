//! What cluster mode relies on JetStream for (docs/cluster.md), checked against three real
//! `nats-server` processes with `sync_interval: always`: replicated streams acknowledge with a
//! quorum, a stale writer is fenced by its expected sequence, and a refused per-subject
//! expectation says so with one of the two error codes the design handles. If a NATS upgrade
//! changes any of this, the design's assumptions fail here first. And the pieces built on it:
//! partition leases in a KV bucket, and an owner's commit path (each partition's publish queue
//! under the engine's storage).

mod support;

use std::time::{Duration, Instant};

use async_nats::{
    HeaderMap,
    jetstream::{self, Context, stream},
};
use bytes::Bytes;
use mayfly_cluster::{
    Apply, CatalogLog, CatchUpError, Chain, Followed, LeaseTiming, Leases, MessageKind,
    PublishQueue, ReplicatedStorage, SystemClocks, Watch, become_owner,
    lease_store::renew_interval,
    log_message::decode_frame,
    publish_queue::{self, log_end, log_streams, take_over},
};
use mayfly_server::{
    engine::{
        ChangeOp, ChangeRecord, CollectionPath, DocumentBody, Engine, EngineConfig, Placement,
        SystemClock,
    },
    model::{
        CollectionSettings, DefaultTtl, DocKey, FeedRetention, IdKind, IndexingMode,
        PartitionKeyPath, PartitionKeyValue, ResourceId,
    },
    storage::{LogRecord, MemoryStorage},
};
use std::sync::Arc;

use support::{
    cluster::{cluster_args, cluster_node, keyed_cluster_node, settled_map},
    nats::NatsCluster,
};

/// The error codes JetStream answers a wrong expected sequence with: 10071 names the sequence
/// it found; 10164 does not (a replicated stream's per-subject check, or a message of the same
/// subject still being applied).
const WRONG_LAST_SEQUENCE: u16 = 10071;
const WRONG_LAST_SEQUENCE_CONSTANT: u16 = 10164;

async fn client(cluster: &NatsCluster) -> Context {
    let client = async_nats::connect(cluster.urls()).await.expect("connects");
    jetstream::new(client)
}

/// Creates an R3 stream, retrying while the cluster's JetStream is still forming.
async fn replicated_stream(js: &Context, name: &str, subjects: &str) -> stream::Stream {
    let deadline = Instant::now() + Duration::from_secs(20);
    // Asked again every half second rather than after the default 5 s timeout.
    let mut impatient = js.clone();
    impatient.set_timeout(Duration::from_millis(500));
    loop {
        let created = impatient
            .create_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![subjects.to_string()],
                num_replicas: 3,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await;
        match created {
            Ok(mut stream) => {
                // Created is not yet writable: its own Raft group elects a leader first
                // (until then a publish finds no stream to answer it).
                while stream
                    .info()
                    .await
                    .ok()
                    .and_then(|i| i.cluster.clone())
                    .and_then(|c| c.leader)
                    .is_none()
                {
                    assert!(
                        Instant::now() < deadline,
                        "the stream elected no leader in 20 s"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return stream;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("stream not created yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no R3 stream within 20 s: {e}"),
        }
    }
}

/// Why a publish was not acknowledged.
#[derive(Debug, PartialEq)]
enum Refused {
    /// Its expectation was wrong: the JetStream error code (see [`WRONG_LAST_SEQUENCE`]).
    WrongSequence(u16),
    /// Nothing answered it in time, or no stream leader took it (while one is elected): it
    /// may be sent again (with the same message id, in case it was stored after all).
    Unanswered(String),
}

/// Publishes `body` on `subject` with one expectation header; the stream sequence it got, or
/// why not.
async fn publish(
    js: &Context,
    subject: &str,
    header: (&str, u64),
    body: &'static [u8],
) -> Result<u64, Refused> {
    publish_once(js, subject, header, None, body).await
}

/// [`publish`], with a message id when given: JetStream stores a message once per id, so a
/// publish whose acknowledgement was lost can be sent again.
async fn publish_once(
    js: &Context,
    subject: &str,
    header: (&str, u64),
    id: Option<&str>,
    body: &'static [u8],
) -> Result<u64, Refused> {
    let mut headers = HeaderMap::new();
    headers.insert(header.0, header.1.to_string().as_str());
    if let Some(id) = id {
        headers.insert("Nats-Msg-Id", id);
    }
    let sent = js
        .publish_with_headers(subject.to_string(), headers, Bytes::from_static(body))
        .await
        .map_err(|e| Refused::Unanswered(e.to_string()))?;
    let e = match tokio::time::timeout(Duration::from_secs(2), sent).await {
        Ok(Ok(ack)) => return Ok(ack.sequence),
        Ok(Err(e)) => e,
        Err(_) => return Err(Refused::Unanswered("no acknowledgement in 2 s".into())),
    };
    let text = format!("{e:?}");
    if !text.contains("wrong last sequence") {
        return Err(Refused::Unanswered(text));
    }
    Err(Refused::WrongSequence(
        [WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT]
            .into_iter()
            .find(|code| text.contains(&code.to_string()))
            .unwrap_or_else(|| panic!("a wrong-sequence refusal with another code: {text}")),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_stream_fences_a_stale_writer() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let stream = replicated_stream(&js, "FENCE", "fence.>").await;
    assert_eq!(stream.cached_info().config.num_replicas, 3);

    // Stream-wide expectations: the first owner writes at 1 and 2, a new owner takes over at
    // the sequence it read, and the old owner's next publish (expecting its own last) fails.
    let expect_last = "Nats-Expected-Last-Sequence";
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 0), b"first").await,
        Ok(1)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 1), b"second").await,
        Ok(2)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 2), b"takeover").await,
        Ok(3)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 2), b"stale").await,
        Err(Refused::WrongSequence(WRONG_LAST_SEQUENCE))
    );

    // Per-subject expectations, as partitions sharing a stream use them: another subject's
    // messages do not disturb p1's, and a stale expectation is refused with one of the two
    // codes (the design then reads the subject's last message to tell a fence from a conflict).
    let expect_subject = "Nats-Expected-Last-Subject-Sequence";
    let p1 = publish(&js, "fence.p1", (expect_subject, 0), b"p1 first").await;
    assert_eq!(p1, Ok(4));
    assert_eq!(
        publish(&js, "fence.p2", (expect_subject, 0), b"p2 first").await,
        Ok(5)
    );
    assert_eq!(
        publish(&js, "fence.p1", (expect_subject, 4), b"p1 takeover").await,
        Ok(6)
    );
    let stale = publish(&js, "fence.p1", (expect_subject, 4), b"p1 stale").await;
    assert!(
        matches!(
            stale,
            Err(Refused::WrongSequence(
                WRONG_LAST_SEQUENCE | WRONG_LAST_SEQUENCE_CONSTANT
            ))
        ),
        "{stale:?}"
    );

    // Nothing refused was stored.
    let mut stream = js.get_stream("FENCE").await.expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_with_one_server_of_three_killed() {
    let mut cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    replicated_stream(&js, "QUORUM", "quorum.>").await;
    let expect = "Nats-Expected-Last-Subject-Sequence";
    let mut last = publish(&js, "quorum.p", (expect, 0), b"before")
        .await
        .expect("acked");
    // Kill a server the client is not necessarily using: two of three are a quorum.
    drop(cluster.servers.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    while acked < 20 {
        // The same id on every try of one message: a try that timed out but was stored is
        // acknowledged as a duplicate, at its sequence, instead of failing its expectation.
        let id = format!("after-{acked}");
        match publish_once(&js, "quorum.p", (expect, last), Some(&id), b"after").await {
            Ok(seq) => {
                last = seq;
                acked += 1;
            }
            Err(Refused::WrongSequence(code)) => {
                panic!("refused with {code} while only this test writes")
            }
            // A stream leader on the killed server is re-elected among the other two.
            Err(Refused::Unanswered(why)) => {
                assert!(
                    Instant::now() < deadline,
                    "no quorum write within 20 s: {why}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(last, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_passes_only_after_its_owner_has_stopped_serving() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    // Created once the cluster takes replicated writes (the stream creation retries until it
    // does).
    replicated_stream(&js, "READY", "ready.>").await;
    // The design's 2 s lease: a replicated, fsynced renewal on a loaded machine can take a
    // good part of a second.
    let timing = LeaseTiming::DEFAULT;
    let leases = Leases::open(&js, 3, timing).await.expect("bucket");
    // Shared by the test's two "nodes": one real clock, so that their lease decisions can be
    // compared on one time line.
    let clocks = SystemClocks;

    // Node a takes partition 0; node b cannot while a renews.
    let mut b_watch = Watch::default();
    let mut a = leases
        .try_acquire(0, "a", &mut Watch::default(), &clocks)
        .await
        .expect("answers")
        .expect("a free partition is taken");
    assert_eq!(a.epoch, 1);
    for _ in 0..4 {
        assert!(leases.renew(&mut a, "a", &clocks).await.expect("answers"));
        assert!(a.serves(&clocks));
        let b = leases.try_acquire(0, "b", &mut b_watch, &clocks).await;
        assert!(b.expect("answers").is_none(), "taken while renewed");
        tokio::time::sleep(renew_interval(&timing)).await;
    }

    // a stops renewing (a pause): b takes over once a whole lease has passed since it saw the
    // last renewal, and by then a has stopped serving by its own clock.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        assert!(Instant::now() < deadline, "b never took the lapsed lease");
        if let Some(b) = leases
            .try_acquire(0, "b", &mut b_watch, &clocks)
            .await
            .expect("answers")
        {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!a.serves(&clocks), "a still served when b took over");
    assert_eq!(b.epoch, 2);
    let (record, _) = leases.read(0).await.expect("answers").expect("held");
    assert_eq!((record.owner.as_str(), record.epoch), ("b", 2));
    // a wakes: its renewal is refused, and it knows it lost the partition.
    assert!(!leases.renew(&mut a, "a", &clocks).await.expect("answers"));
    assert!(!a.serves(&clocks));
}

/// Partitions of the commit-path tests' engine.
const PARTITIONS: u32 = 4;

/// A node owning every partition at `epoch`: an engine logging every commit, over memory
/// storage whose shards publish to their partitions' logs, with the test's collection; it
/// caught up with each partition's log and published its takeover before serving it. And its
/// publish queues.
async fn owner(js: &Context, epoch: u64) -> (Engine, Vec<Arc<PublishQueue>>, CollectionPath) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let streams = loop {
        match log_streams(js, 3).await {
            Ok(streams) => break streams,
            Err(e) if Instant::now() < deadline => {
                eprintln!("log streams not created yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no log streams within 20 s: {e}"),
        }
    };
    let (engine, queues) = logging_engine(js, Arc::new(SystemClock), None);
    // The catalog first (the catalog stream's job in a cluster, made here the same way on
    // every node, so that uids agree), then the partitions.
    let path = collection(&engine);
    for p in 0..PARTITIONS {
        let stream = &streams[(p % publish_queue::LOG_STREAMS) as usize];
        let mut followed = Followed::new(p);
        loop {
            match become_owner(
                js,
                stream,
                &engine,
                (&queues[p as usize], p, epoch, 0),
                (&mut followed, &|| true),
            )
            .await
            {
                Ok(_) => break,
                Err(CatchUpError::Takeover(e)) if Instant::now() < deadline => {
                    eprintln!("partition {p} not taken over yet ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("partition {p} not taken over: {e}"),
            }
        }
    }
    (engine, queues, path)
}

/// An engine over memory storage whose shards publish every commit to their partitions'
/// logs, telling time by `clock` (and leases by `lease_clock`), and its publish queues.
fn logging_engine(
    js: &Context,
    clock: Arc<dyn mayfly_server::engine::Clock>,
    lease_clock: Option<Arc<dyn mayfly_server::engine::LeaseClock>>,
) -> (Engine, Vec<Arc<PublishQueue>>) {
    let queues: Vec<_> = (0..PARTITIONS).map(PublishQueue::new).collect();
    let max_payload = js.client().server_info().max_payload;
    let storage =
        ReplicatedStorage::new(Arc::new(MemoryStorage::new()), queues.clone(), max_payload);
    let config = EngineConfig {
        log_every_commit: true,
        lease_clock,
        ..EngineConfig::new(PARTITIONS as usize)
    };
    (Engine::new(config, Arc::new(storage), clock), queues)
}

/// Database `db`, collection `c` (partitioned on `/pk`) with its change feed off: in cluster
/// mode its commits are logged all the same.
fn collection(engine: &Engine) -> CollectionPath {
    collection_with(engine, DefaultTtl::Off)
}

/// [`collection`] with default TTL `ttl`.
fn collection_with(engine: &Engine, ttl: DefaultTtl) -> CollectionPath {
    let db = ResourceId::parse(IdKind::Database, "db").expect("id");
    engine.create_database(db.clone()).expect("database");
    let settings = CollectionSettings::new(ttl, IndexingMode::Consistent)
        .expect("settings")
        .with_change_feed_retention(FeedRetention::OFF);
    let id = ResourceId::parse(IdKind::Collection, "c").expect("id");
    engine
        .create_collection(
            &db,
            id.clone(),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
        )
        .expect("collection");
    CollectionPath {
        database: db,
        collection: id,
    }
}

fn document(id: &str, pk: &str) -> DocumentBody {
    let json = serde_json::json!({"id": id, "pk": pk, "n": 1});
    let serde_json::Value::Object(map) = json else {
        unreachable!()
    };
    DocumentBody::parse(Arc::new(map), None).expect("body")
}

/// Every partition's log as a follower reads it, each message checked against the chain
/// before it: (partition, operation, document id) of every record, in log order.
async fn read_logs(js: &Context) -> Vec<(u32, ChangeOp, String)> {
    let mut by_partition: Vec<Vec<Bytes>> = vec![Vec::new(); PARTITIONS as usize];
    for g in 0..publish_queue::LOG_STREAMS {
        let mut stream = js
            .get_stream(format!("MAYFLY_LOG_{g}"))
            .await
            .expect("stream");
        let last = stream.info().await.expect("info").state.last_sequence;
        for seq in 1..=last {
            let message = stream.get_raw_message(seq).await.expect("message");
            let p: u32 = message
                .subject
                .rsplit('.')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("a partition subject");
            by_partition[p as usize].push(message.payload);
        }
    }
    let mut out = Vec::new();
    for (p, frames) in by_partition.into_iter().enumerate() {
        let mut chain = Chain::new(p as u32);
        for frame in frames {
            for part in decode_frame(&frame).expect("a frame") {
                let message = chain.accept(&part).expect("the history continues");
                if message.kind == MessageKind::Takeover {
                    assert!(message.records.is_empty());
                }
                for (_, bytes) in message.records {
                    let record =
                        ChangeRecord::decode_log(&LogRecord::whole(bytes)).expect("record");
                    out.push((p as u32, record.op, record.key.id.as_str().to_string()));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_acknowledged_writes_are_on_its_partitions_logs_in_order() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (engine, _queues, path) = owner(&js, 1).await;

    // Writers in parallel, so that commits queue behind each publish and go out together.
    let mut writers = Vec::new();
    for w in 0..8 {
        let (engine, path) = (engine.clone(), path.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..25 {
                let id = format!("w{w}-{i}");
                let created = engine.create_document(&path, document(&id, &format!("t{i}")), None);
                engine.settle(created).await.expect("acknowledged");
                acked.push(id);
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.expect("writer"));
    }
    let key = |id: &str, pk: &str| DocKey {
        partition_key: PartitionKeyValue::String(pk.into()),
        id: ResourceId::parse(IdKind::Document, id).expect("id"),
    };
    let replaced = engine.replace_document(&path, key("w0-0", "t0"), document("w0-0", "t0"), None);
    engine.settle(replaced).await.expect("replaced");
    let deleted = engine.delete_document(&path, &key("w1-1", "t1"), None);
    engine.settle(deleted).await.expect("deleted");

    let logged = read_logs(&js).await;
    let info = engine.get_collection(&path).expect("collection");
    let placement = Placement::Xxh3;
    let mut created: Vec<&str> = Vec::new();
    for (p, op, id) in &logged {
        let pk = format!("t{}", id.rsplit('-').next().expect("an index"));
        let pk = PartitionKeyValue::String(pk.into());
        assert_eq!(
            placement.shard(&info, &pk, PARTITIONS as usize),
            *p as usize,
            "{id} is logged in the partition its key hashes to"
        );
        if *op == ChangeOp::Create {
            created.push(id);
        }
    }
    created.sort();
    acked.sort();
    assert_eq!(created, acked, "every acknowledged create is logged, once");
    // In two partitions: each in its own log.
    let mut others: Vec<_> = logged
        .iter()
        .filter(|(_, op, _)| *op != ChangeOp::Create)
        .map(|(_, op, id)| (id.as_str(), *op))
        .collect();
    others.sort_by_key(|(id, _)| *id);
    assert_eq!(
        others,
        [("w0-0", ChangeOp::Replace), ("w1-1", ChangeOp::Delete)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_partition_fails_its_writes_and_only_its_own() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (engine, queues, path) = owner(&js, 1).await;
    let info = engine.get_collection(&path).expect("collection");
    let partition_of = |pk: &str| {
        Placement::Xxh3.shard(
            &info,
            &PartitionKeyValue::String(pk.into()),
            PARTITIONS as usize,
        )
    };
    let write = |id: String, pk: String| {
        let engine = engine.clone();
        let created = engine.create_document(&path, document(&id, &pk), None);
        async move { engine.settle(created).await }
    };
    for i in 0..8 {
        write(format!("before-{i}"), format!("t{i}"))
            .await
            .expect("acknowledged before the takeover");
    }

    // Another node takes partition 0 over at epoch 2, at the log's end.
    let stream = js
        .get_stream(publish_queue::stream_name(0))
        .await
        .expect("stream");
    let end = log_end(&stream, 0).await.expect("log end");
    let taken = take_over(&js, &stream, 0, (2, 0), end.last)
        .await
        .expect("takes over");
    assert_eq!(taken.epoch, 2);

    // The old owner's next publish to partition 0 is refused: its write fails, and every write
    // to partition 0 after it is refused at once; the other partitions go on.
    let mut fenced = 0;
    for i in 0..40 {
        let pk = format!("k{i}");
        let result = write(format!("after-{i}"), pk.clone()).await;
        match (partition_of(&pk), result) {
            (0, Err(e)) => {
                let text = e.to_string();
                assert!(
                    text.contains("another owner has taken over") || text.contains("partition 0"),
                    "{text}"
                );
                fenced += 1;
            }
            (0, Ok(_)) => panic!("a write to the fenced partition was acknowledged"),
            (p, Err(e)) => panic!("partition {p}'s write failed with partition 0: {e}"),
            (_, Ok(_)) => {}
        }
    }
    assert!(fenced > 0, "no key of 40 fell in partition 0");
    assert!(queues[0].refusal().is_some());
    assert!(queues[1..].iter().all(|q| q.refusal().is_none()));

    // The log holds nothing of the fenced writes: after the takeover, partition 0's history is
    // the new owner's.
    let logged = read_logs(&js).await;
    for (p, _, id) in &logged {
        assert!(
            !(id.starts_with("after-") && *p == 0),
            "{id} reached the fenced partition's log"
        );
    }
    let after = logged.iter().filter(|(_, _, id)| id.starts_with("after-"));
    assert_eq!(after.count(), 40 - fenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_catches_up_from_the_log_and_serves_every_acknowledged_write() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (a, a_queues, path) = owner(&js, 1).await;

    // Writers on node a until it dies under them.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (a, path, stop) = (a.clone(), path.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let (mut acked, mut unknown) = (Vec::new(), 0);
            for i in 0..400 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let id = format!("w{w}-{i}");
                let created = a.create_document(&path, document(&id, &format!("t{i}")), None);
                match a.settle(created).await {
                    Ok(_) => acked.push(id),
                    // Its publish was cut off: it may or may not be in the log.
                    Err(_) => unknown += 1,
                }
            }
            (acked, unknown)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // a dies: its publishers stop where they are, failing what they had not sent.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for q in &a_queues {
        q.close();
    }
    let (mut acked, mut unknown) = (Vec::new(), 0);
    for writer in writers {
        let (ids, n) = writer.await.expect("writer");
        acked.extend(ids);
        unknown += n;
    }
    assert!(
        acked.len() >= 20,
        "only {} writes acknowledged",
        acked.len()
    );

    // b catches up from the log alone (memory storage: it starts empty) and takes over.
    let started = Instant::now();
    let (b, _b_queues, _) = owner(&js, 2).await;
    eprintln!(
        "node b caught up with {} acknowledged writes ({unknown} of unknown outcome) and took 4 partitions over in {:?}",
        acked.len(),
        started.elapsed()
    );
    for id in &acked {
        let i = id.rsplit('-').next().expect("index");
        let key = DocKey {
            partition_key: PartitionKeyValue::String(format!("t{i}").into()),
            id: ResourceId::parse(IdKind::Document, id).expect("id"),
        };
        let read = b.read_document(&path, &key);
        let view = b
            .settle(read)
            .await
            .unwrap_or_else(|e| panic!("{id} lost: {e}"));
        assert_eq!(view.body_map()["id"], serde_json::json!(id));
    }
    // b serves writes; a can no longer acknowledge any.
    let created = b.create_document(&path, document("after", "t0"), None);
    b.settle(created).await.expect("b takes writes");
    let created = a.create_document(&path, document("stale", "t0"), None);
    assert!(
        a.settle(created).await.is_err(),
        "a acknowledged a write after b took over"
    );
}

/// A copy holding an earlier owner's writes that the log lost before a later takeover, which
/// reads the log only once the new owner has purged it below a snapshot, must find the
/// divergence (as it would have found the rewind in the whole log), not load the snapshot over
/// its copy and forget those writes: the snapshot's epoch table says where the earlier owner's
/// epoch ended. An empty copy loads the same snapshot and serves the new owner's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_holding_writes_a_purged_log_lost_finds_the_divergence_in_the_snapshots_epochs() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (a, a_queues, path) = owner(&js, 1).await;
    let p = 0u32;
    let pks = keys_in(p, 12);
    // One message each: every create is acknowledged before the next.
    for pk in &pks[..6] {
        let created = a.create_document(&path, document(&format!("a-{pk}"), pk), None);
        a.settle(created).await.expect("a's write");
    }

    // x follows the partition: its copy holds all of a's writes.
    let (x, _x_queues) = logging_engine(&js, Arc::new(SystemClock), None);
    collection(&x);
    x.set_following(p as usize, true);
    let stream = js
        .get_stream(publish_queue::stream_name(p))
        .await
        .expect("log stream");
    let mut x_followed = Followed::new(p);
    mayfly_cluster::catch_up(&stream, &x, p, &mut x_followed)
        .await
        .expect("x caught up");
    let x_end = x_followed.chain.last;

    // NATS loses a's last acknowledged message; a dies; b takes over from the shortened log.
    lose_last_message(&stream, p).await;
    for q in &a_queues {
        q.close();
    }
    let (b, b_queues, _) = owner(&js, 2).await;
    assert!(b.log_end(p as usize) < x_end, "b took over before x's end");
    for pk in &pks[6..8] {
        let created = b.create_document(&path, document(&format!("b-{pk}"), pk), None);
        b.settle(created).await.expect("b's write");
    }
    // b snapshots the partition into its log and purges the log below the snapshot.
    snapshot_and_purge(&b, &b_queues[p as usize], &stream, p).await;

    // x reads on: the log starts with the snapshot past its copy, whose epochs say a's epoch
    // ended before x's last position.
    match mayfly_cluster::catch_up(&stream, &x, p, &mut x_followed).await {
        Err(CatchUpError::Diverged(d @ mayfly_cluster::Divergence::Outlived { .. })) => {
            eprintln!("x found: {d}")
        }
        other => panic!("x loaded a history that lost a's write: {other:?}"),
    }
    assert_eq!(
        x.log_end(p as usize),
        x_end,
        "x's copy, with the write the log lost, is left as it was"
    );

    // A node with no copy loads the snapshot: it holds b's writes.
    let (z, _z_queues) = logging_engine(&js, Arc::new(SystemClock), None);
    collection(&z);
    z.set_following(p as usize, true);
    let mut z_followed = Followed::new(p);
    mayfly_cluster::catch_up(&stream, &z, p, &mut z_followed)
        .await
        .expect("an empty copy loads the snapshot");
    assert_eq!(z.log_end(p as usize), b.log_end(p as usize));
}

/// Deletes partition `p`'s last message from its log stream, as a NATS server that lost it
/// would serve the log; its stream sequence.
async fn lose_last_message(stream: &stream::Stream, p: u32) -> u64 {
    let last = stream
        .get_last_raw_message_by_subject(&publish_queue::subject(p))
        .await
        .expect("the partition's last message");
    assert!(
        stream.delete_message(last.sequence).await.expect("delete"),
        "the last message of partition {p} deleted"
    );
    last.sequence
}

/// Whether a log message's frame starts a snapshot (its first part).
fn starts_a_snapshot(payload: &[u8]) -> bool {
    decode_frame(&Bytes::copy_from_slice(payload))
        .ok()
        .and_then(|parts| mayfly_cluster::LogMessage::decode(&parts[0]).ok())
        .is_some_and(|m| matches!(m.kind, MessageKind::Snapshot { part: 0, .. }))
}

/// Has `owner` (whose queue for partition `p` is `queue`) snapshot the partition into its log,
/// waits until the snapshot is published, and purges the log below it.
async fn snapshot_and_purge(
    owner: &Engine,
    queue: &Arc<PublishQueue>,
    stream: &stream::Stream,
    p: u32,
) {
    assert!(
        owner
            .snapshot_shard(p as usize, |snap| queue.enqueue_snapshot(snap))
            .expect("snapshot taken"),
        "snapshot queued"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let last = stream
            .get_last_raw_message_by_subject(&publish_queue::subject(p))
            .await
            .expect("last message");
        if starts_a_snapshot(&last.payload) {
            break last.sequence;
        }
        assert!(Instant::now() < deadline, "the snapshot was not published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stream
        .purge()
        .filter(publish_queue::subject(p))
        .sequence(first)
        .await
        .expect("purged below the snapshot");
}

/// `n` partition keys of the commit-path tests' collection (`db/c`) in partition `p`.
fn keys_in(p: u32, n: usize) -> Vec<String> {
    let pks: Vec<String> = (0..1000)
        .map(|i| format!("t{i}"))
        .filter(|pk| {
            mayfly_server::engine::xxh3_partition(
                "db",
                "c",
                &PartitionKeyValue::String(pk.as_str().into()),
                PARTITIONS as usize,
            ) == p as usize
        })
        .take(n)
        .collect();
    assert_eq!(pks.len(), n, "keys for partition {p}");
    pks
}

/// A copy a node rebuilds from the log after a restart (its own held more than its kept state
/// said: an owner's commits that may not have reached the log) must still find in the log what
/// the kept state said the log held: rebuilt from a log that lost it, it finds the divergence,
/// where an empty copy with nothing to go by would take the shorter history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_copy_finds_a_log_that_lost_what_its_node_knew_it_held() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (a, a_queues, path) = owner(&js, 1).await;
    let p = 0u32;
    let stream = js
        .get_stream(publish_queue::stream_name(p))
        .await
        .expect("log stream");
    // The log starts with a snapshot, and goes on after it.
    let pks = keys_in(p, 8);
    for (i, pk) in pks.iter().enumerate() {
        if i == 4 {
            snapshot_and_purge(&a, &a_queues[p as usize], &stream, p).await;
        }
        let created = a.create_document(&path, document(&format!("a-{pk}"), pk), None);
        a.settle(created).await.expect("a's write");
    }
    let copy = || {
        let (engine, queues) = logging_engine(&js, Arc::new(SystemClock), None);
        collection(&engine);
        engine.set_following(p as usize, true);
        (engine, queues)
    };
    // What a node knew: a copy caught up to the log's end.
    let (x, _x_queues) = copy();
    let mut known = Followed::new(p);
    mayfly_cluster::catch_up(&stream, &x, p, &mut known)
        .await
        .expect("caught up");

    // Rebuilt from the log (the snapshot, before what it knew, then what follows): it passes
    // what it knew, and is the log to there.
    let (y, _y_queues) = copy();
    let mut rebuilt = Followed::rebuilt(&known);
    mayfly_cluster::catch_up(&stream, &y, p, &mut rebuilt)
        .await
        .expect("the log holds what the node knew");
    assert!(rebuilt.witness().is_none(), "passed");
    assert_eq!(rebuilt.chain, known.chain);

    // The log loses its last message: rebuilt again, the copy finds it short of what it knew.
    lose_last_message(&stream, p).await;
    let (z, _z_queues) = copy();
    let mut rebuilt = Followed::rebuilt(&known);
    match mayfly_cluster::catch_up(&stream, &z, p, &mut rebuilt).await {
        Err(CatchUpError::Diverged(d @ mayfly_cluster::Divergence::Shortened { .. })) => {
            eprintln!("the rebuilt copy found: {d}")
        }
        other => panic!("a rebuilt copy took a log that lost what its node knew: {other:?}"),
    }
    // With nothing to go by, an empty copy takes the shorter log.
    let (e, _e_queues) = copy();
    let mut empty = Followed::new(p);
    mayfly_cluster::catch_up(&stream, &e, p, &mut empty)
        .await
        .expect("an empty copy with nothing known");
    assert!(empty.chain.last < known.chain.last);
}

/// A node of the catalog test: an engine and its catalog log, applying entries of the test's
/// own format (`db NAME`, `coll DB NAME`), answering each with the uid made or the refusal.
async fn catalog_node(js: &Context, node: &str) -> (Engine, Arc<CatalogLog<Result<u64, String>>>) {
    let engine = Engine::new(
        EngineConfig::new(2),
        Arc::new(MemoryStorage::new()),
        Arc::new(SystemClock),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        match CatalogLog::open(js, 3, node, 0).await {
            Ok(log) => break log,
            Err(e) if Instant::now() < deadline => {
                eprintln!("catalog log not opened yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no catalog log within 20 s: {e}"),
        }
    };
    let applier = engine.clone();
    let apply: Apply<Result<u64, String>> = Arc::new(move |_seq, entry: Bytes| {
        let engine = applier.clone();
        Box::pin(async move {
            let text = String::from_utf8(entry.to_vec()).map_err(|e| e.to_string())?;
            let words: Vec<&str> = text.split(' ').collect();
            let id = |kind, raw: &str| ResourceId::parse(kind, raw).map_err(|e| e.to_string());
            match words.as_slice() {
                ["db", name] => engine
                    .create_database(id(IdKind::Database, name)?)
                    .map(|uid| uid.0)
                    .map_err(|e| e.to_string()),
                ["coll", db, name] => {
                    let settings =
                        CollectionSettings::new(DefaultTtl::Off, IndexingMode::Consistent)
                            .map_err(|e| e.to_string())?;
                    engine
                        .create_collection(
                            &id(IdKind::Database, db)?,
                            id(IdKind::Collection, name)?,
                            PartitionKeyPath::parse("/pk").map_err(|e| e.to_string())?,
                            settings,
                            Default::default(),
                        )
                        .map(|info| info.uid.0)
                        .map_err(|e| e.to_string())
                }
                _ => Err(format!("not an entry: {text}")),
            }
        })
    });
    tokio::spawn(log.clone().follow(apply));
    (engine, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_applies_the_catalog_log_in_one_order_with_one_answer() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let (a, a_log) = catalog_node(&js, "a").await;
    let (b, b_log) = catalog_node(&js, "b").await;

    // Both create database `shop` at once: one is first in the log, on every node.
    let (from_a, from_b) = tokio::join!(
        a_log.propose(Bytes::from_static(b"db shop")),
        b_log.propose(Bytes::from_static(b"db shop"))
    );
    let (from_a, from_b) = (from_a.expect("answered"), from_b.expect("answered"));
    assert!(
        from_a.is_ok() != from_b.is_ok(),
        "exactly one creates it: {from_a:?} {from_b:?}"
    );
    let refused = from_a
        .clone()
        .err()
        .or(from_b.clone().err())
        .expect("one refusal");
    assert!(refused.contains("exists"), "{refused}");

    let (carts, orders) = tokio::join!(
        a_log.propose(Bytes::from_static(b"coll shop carts")),
        b_log.propose(Bytes::from_static(b"coll shop orders"))
    );
    let carts = carts.expect("answered").expect("created");
    let orders = orders.expect("answered").expect("created");
    assert_ne!(carts, orders);
    let bad = a_log
        .propose(Bytes::from_static(b"coll nowhere x"))
        .await
        .expect("answered");
    assert!(bad.is_err(), "a collection in a missing database");

    // Both nodes hold the same catalog, uids included.
    let end = a_log.end().await.expect("end");
    a_log.applied_to(end).await;
    b_log.applied_to(end).await;
    let shop = ResourceId::parse(IdKind::Database, "shop").expect("id");
    for engine in [&a, &b] {
        assert_eq!(engine.list_databases(), vec![shop.clone()]);
        for (name, uid) in [("carts", carts), ("orders", orders)] {
            let path = CollectionPath {
                database: shop.clone(),
                collection: ResourceId::parse(IdKind::Collection, name).expect("id"),
            };
            assert_eq!(engine.get_collection(&path).expect("collection").uid.0, uid);
        }
    }
}

/// Retries `call` while it fails UNAVAILABLE (a partition not served yet, or moving), for up
/// to 45 s (a bound, not an expectation: on a loaded machine a node's takeovers take seconds).
async fn when_served<T, F: std::future::Future<Output = Result<T, tonic::Status>>>(
    what: &str,
    mut call: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("{what}: {s}"),
        }
    }
}

/// Two nodes, a and b, on three fresh NATS servers (fields drop in order: the nodes before
/// the servers).
struct TwoNodes {
    a: support::Mayfly,
    b: support::Mayfly,
    dir: tempfile::TempDir,
    nats: NatsCluster,
}

/// [`TwoNodes`], with `d`/`c` made through a (which joined alone and owned every partition),
/// once ownership has settled over both (a handed b its half): the nodes, clients of a and of
/// b, and the settled partition map as b has it.
async fn two_nodes() -> (
    TwoNodes,
    support::clients::Clients,
    support::clients::Clients,
    mayfly_proto::v1::PartitionMap,
) {
    use support::clients::{connect, database_and_collection};

    let nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cluster_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    let b = cluster_node(&nats, dir.path(), "b");
    let on_b = connect(&b).await;
    let map = settled_map(&on_b.admin, &["a", "b"]).await;
    (TwoNodes { a, b, dir, nats }, on_a, on_b, map)
}

/// The partition of test document partition key `pk` (of `d`/`c`, over 4 partitions).
fn partition_of(pk: &str) -> usize {
    mayfly_server::engine::xxh3_partition("d", "c", &PartitionKeyValue::String(pk.into()), 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_partitions_serve_again_on_another_with_every_acknowledged_write() {
    use mayfly_proto::{
        json::JsonObject,
        v1::{CreateDocumentRequest, ReadDocumentRequest},
    };
    use support::clients::{connect, database_and_collection, string_pk};

    let nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cluster_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    // The catalog goes through the cluster's catalog log: b, joining later, applies it.
    database_and_collection(&mut on_a).await;
    let b = cluster_node(&nats, dir.path(), "b");

    // a won every lease (it came first); writes to every partition are acknowledged by a.
    let mut acked = Vec::new();
    for i in 0..40 {
        let id = format!("doc-{i}");
        let body = serde_json::json!({"id": id, "pk": format!("p{i}")});
        let serde_json::Value::Object(body) = body else {
            unreachable!()
        };
        let request = CreateDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            body: Some(JsonObject::new(body)),
            ..Default::default()
        };
        when_served("write on a", || {
            let (mut documents, request) = (on_a.documents.clone(), request.clone());
            async move { documents.create_document(request).await }
        })
        .await;
        acked.push((id, format!("p{i}")));
    }
    // a hands half the partitions to b; b forwards what it does not own to a, one hop.
    let mut on_b = connect(&b).await;
    settled_map(&on_b.admin, &["a", "b"]).await;
    let read = |id: &str, pk: &str| ReadDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: id.into(),
        partition_key: Some(string_pk(pk)),
    };
    for (id, pk) in &acked {
        let doc = when_served(&format!("{id} through b"), || {
            let (mut documents, request) = (on_b.documents.clone(), read(id, pk));
            async move { documents.read_document(request).await }
        })
        .await;
        assert_eq!(
            doc.into_inner().body.expect("a body").into_map()["id"],
            serde_json::json!(id)
        );
    }
    let body = serde_json::json!({"id": "through-b", "pk": "p0"});
    let serde_json::Value::Object(body) = body else {
        unreachable!()
    };
    let request = CreateDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        body: Some(JsonObject::new(body)),
        ..Default::default()
    };
    when_served("a write through b", || {
        let (mut documents, request) = (on_b.documents.clone(), request.clone());
        async move { documents.create_document(request).await }
    })
    .await;
    acked.push(("through-b".into(), "p0".into()));
    // A query across partitions, through b: answered from a's partitions and b's.
    let (ids, _) = query_pages(&on_b.documents, "SELECT VALUE c.id FROM c", 50, "", None).await;
    for (id, _) in &acked {
        assert!(
            ids.contains(&serde_json::json!(id)),
            "{id} missing from {ids:?}"
        );
    }

    // The partition map, asked of b: a and b own two partitions each; b serves its own.
    let map = on_b
        .admin
        .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
        .await
        .expect("partition map")
        .into_inner();
    assert_eq!((map.node.as_str(), map.partitions), ("b", 4));
    assert_eq!(map.placement, "xxh3-64");
    let ids: Vec<&str> = map.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(
        map.nodes
            .iter()
            .all(|n| n.address.starts_with("http://127.0.0.1:"))
    );
    assert!(
        map.owners
            .iter()
            .all(|o| (o.owner == "a" || o.owner == "b") && o.served_here == (o.owner == "b")),
        "{:?}",
        map.owners
    );
    assert_eq!(map.owners.iter().filter(|o| o.owner == "b").count(), 2);
    // Each node follows the other's partitions as their standby (`--standbys 1`), caught up
    // with the log once the writes stop: the map shows it from the nodes' heartbeats.
    let map = standbys_caught_up(&on_b.admin).await;
    for owner in &map.owners {
        let standby = if owner.owner == "a" { "b" } else { "a" };
        assert_eq!(owner.standbys.len(), 1, "{owner:?}");
        assert_eq!(owner.standbys[0].node, standby, "{owner:?}");
        assert!(owner.standbys[0].applied > 0, "{owner:?}");
    }
    for node in &map.nodes {
        assert!(
            node.live && node.serves == 2 && node.follows == 2,
            "{node:?}"
        );
    }

    // a dies. b takes its partitions once their leases lapse, from its caught-up copies.
    let killed = Instant::now();
    a.kill9();
    let mut first = None;
    for (id, pk) in &acked {
        let doc = when_served("read on b", || {
            let (mut documents, request) = (on_b.documents.clone(), read(id, pk));
            async move { documents.read_document(request).await }
        })
        .await;
        first.get_or_insert_with(|| killed.elapsed());
        let body = doc.into_inner().body.expect("a body").into_map();
        assert_eq!(body["id"], serde_json::json!(id));
    }
    let map = on_b
        .admin
        .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
        .await
        .expect("partition map")
        .into_inner();
    assert!(
        map.owners
            .iter()
            .all(|o| o.owner == "b" && o.epoch >= 2 && o.served_here),
        "a's partitions by a takeover, b's by a handover: {:?}",
        map.owners
    );
    eprintln!(
        "b served its first read {:?} after a was killed; all {} acknowledged writes present",
        first.expect("read"),
        acked.len()
    );
}

/// The partition map, once every partition's owner reported its log end and a standby
/// reported a copy caught up with it (within 45 s: heartbeats come every 2 s).
async fn standbys_caught_up(
    admin: &mayfly_proto::v1::client::AdminClient<tonic::transport::Channel>,
) -> mayfly_proto::v1::PartitionMap {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let map = admin
            .clone()
            .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
            .await
            .expect("partition map")
            .into_inner();
        // Each owner's heartbeat says it serves what its lease says (its log end is then in
        // the standbys' `behind`), and each standby is caught up with it.
        let reported = map
            .nodes
            .iter()
            .all(|n| n.serves as usize == map.owners.iter().filter(|o| o.owner == n.id).count());
        let caught_up = map.owners.iter().all(|o| {
            !o.standbys.is_empty() && o.standbys.iter().all(|s| s.behind == 0 && s.applied > 0)
        });
        if reported && caught_up {
            return map;
        }
        assert!(
            Instant::now() < deadline,
            "standbys never caught up: {:?}",
            map.owners
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates `d/c` document `id` in partition `pk` through `documents`, retrying while the
/// partition is not served (UNAVAILABLE), within [`when_served`]'s bound.
async fn create_through(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    id: &str,
    pk: &str,
) {
    create_in(documents, "c", id, pk).await;
}

/// [`create_through`], in collection `d/<collection>`.
async fn create_in(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    collection: &str,
    id: &str,
    pk: &str,
) {
    create_body(
        documents,
        collection,
        serde_json::json!({"id": id, "pk": pk}),
    )
    .await;
}

/// [`create_through`], of document `body`, in collection `d/<collection>`.
async fn create_body(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    collection: &str,
    body: serde_json::Value,
) {
    let id = body["id"].as_str().unwrap_or_default().to_owned();
    let serde_json::Value::Object(body) = body else {
        unreachable!("a document is an object")
    };
    let request = mayfly_proto::v1::CreateDocumentRequest {
        database: "d".into(),
        collection: collection.into(),
        body: Some(mayfly_proto::json::JsonObject::new(body)),
        ..Default::default()
    };
    when_served(&format!("write {id}"), || {
        let (mut documents, request) = (documents.clone(), request.clone());
        async move {
            match documents.create_document(request).await {
                // An earlier try was applied and its answer lost (a NATS server died).
                Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
                other => other.map(|_| ()),
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_writes_on_with_a_nats_server_killed_which_catches_up_when_restarted() {
    use support::clients::{connect, database_and_collection};

    let mut nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cluster_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    let mut written = Vec::new();
    for phase in ["before", "while-down", "after-restart"] {
        match phase {
            "while-down" => nats.kill9(0),
            "after-restart" => nats.restart(0),
            _ => {}
        }
        for i in 0..10 {
            let (id, pk) = (format!("{phase}-{i}"), format!("p{i}"));
            create_through(&on_a.documents, &id, &pk).await;
            written.push((id, pk));
        }
    }
    // The restarted server catches up: every replica of every log stream is current.
    let js = client(&nats).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for g in 0..publish_queue::LOG_STREAMS {
        let mut stream = js
            .get_stream(format!("MAYFLY_LOG_{g}"))
            .await
            .expect("stream");
        loop {
            let info = stream.info().await.expect("info");
            let replicas = info.cluster.clone().map(|c| c.replicas).unwrap_or_default();
            if replicas.len() == 2 && replicas.iter().all(|r| r.current && !r.offline) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "MAYFLY_LOG_{g} did not catch up in 30 s: {replicas:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_present(&on_a.documents, &written).await;
}

/// Reads each `d/c` document of `written` (id, partition key) through `documents`.
async fn assert_present(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    written: &[(String, String)],
) {
    for (id, pk) in written {
        let request = mayfly_proto::v1::ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: id.clone(),
            partition_key: Some(support::clients::string_pk(pk)),
        };
        let doc = when_served(&format!("read {id}"), || {
            let (mut documents, request) = (documents.clone(), request.clone());
            async move { documents.read_document(request).await }
        })
        .await;
        assert_eq!(
            doc.into_inner().body.expect("a body").into_map()["id"],
            serde_json::json!(id)
        );
    }
}

/// Reads `d/c` document `id` in partition `pk` through `documents`.
async fn read_doc(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    id: &str,
    pk: &str,
) -> Result<tonic::Response<mayfly_proto::v1::Document>, tonic::Status> {
    let request = mayfly_proto::v1::ReadDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: id.into(),
        partition_key: Some(support::clients::string_pk(pk)),
    };
    documents.clone().read_document(request).await
}

/// A damaged message on one partition's log, and another partition's last message gone (as a
/// NATS replica that corrupted or lost data might serve them): the standby following each log
/// finds it does not continue the history it applied and raises the cluster's alarm (every
/// node stops the partition). Each partition's owner holds the history the standby applied (it
/// ends in the owner's own epoch), so the owner re-bases the log on its copy: its snapshot at
/// the log's end, the log purged below it, the alarm cleared; every acknowledged write is
/// served again on both nodes, and writes go on. Then a third partition's log is damaged once
/// its owner is dead: no node holds a history it may re-base on, so the partition answers
/// `LOG_DIVERGED` on the survivor until an operator acts, and every other partition serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_log_is_re_based_on_its_owners_copy_and_without_its_owner_stays_refused() {
    use tonic_types::StatusExt;

    let (nodes, on_a, on_b, _) = two_nodes().await;
    let mut written = Vec::new();
    for i in 0..16 {
        let (id, pk) = (format!("doc-{i}"), format!("p{i}"));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    let map = standbys_caught_up(&on_b.admin).await;
    // Partitions of a node's with documents.
    let owned_by = |node: &str| -> Vec<u32> {
        map.owners
            .iter()
            .filter(|o| {
                o.owner == node
                    && written
                        .iter()
                        .any(|(_, pk)| partition_of(pk) == o.partition as usize)
            })
            .map(|o| o.partition)
            .collect()
    };
    let (of_a, of_b) = (owned_by("a"), owned_by("b"));
    assert!(!of_a.is_empty() && of_b.len() >= 2, "{:?}", map.owners);
    let (damaged, shortened, orphaned) = (of_a[0], of_b[0], of_b[1]);
    let js = client(&nodes.nats).await;
    js.publish(publish_queue::subject(damaged), "not a frame".into())
        .await
        .expect("publish")
        .await
        .expect("acknowledged");
    let stream_of = |p: u32| {
        let js = js.clone();
        async move {
            js.get_stream(publish_queue::stream_name(p))
                .await
                .expect("stream")
        }
    };
    let stream = stream_of(shortened).await;
    lose_last_message(&stream, shortened).await;

    // Found (the standbys catch up every 2 s; a shortened log is believed after 10 s), re-based,
    // served again: every write, through both nodes.
    let deadline = Instant::now() + Duration::from_secs(60);
    for p in [damaged, shortened] {
        loop {
            if log_start(&js, p).await.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "partition {p}'s log was never re-based on a snapshot"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    for documents in [&on_a.documents, &on_b.documents] {
        assert_present(documents, &written).await;
    }
    let pk_in = |p: u32| {
        written
            .iter()
            .find(|(_, pk)| partition_of(pk) == p as usize)
            .map(|(_, pk)| pk.clone())
            .expect("a document in the partition")
    };
    let shortened_pk = pk_in(shortened);
    let after: Vec<_> = [damaged, shortened]
        .map(|p| (format!("after-{p}"), pk_in(p)))
        .to_vec();
    for (id, pk) in after {
        create_through(&on_b.documents, &id, &pk).await;
        written.push((id, pk));
    }
    // The owner finds the loss itself when its next publish expects the lost message: a
    // write then is answered OUTCOME_UNKNOWN (retried: it is there, in the re-based copy).
    lose_last_message(&stream, shortened).await;
    let (id, pk) = ("found-by-owner".to_string(), shortened_pk);
    create_through(&on_b.documents, &id, &pk).await;
    written.push((id, pk));
    for documents in [&on_a.documents, &on_b.documents] {
        assert_present(documents, &written).await;
    }
    let map = standbys_caught_up(&on_b.admin).await;
    assert!(
        map.owners.iter().all(|o| o.log_diverged.is_empty()),
        "{:?}",
        map.owners
    );

    // b dies: a takes b's partitions over from its copies (the re-based one loaded from the
    // snapshot the log now starts with). Then another partition b owned is damaged: nobody
    // holds a history to re-base it on, so it stops, with the reason, while a serves the rest.
    let nodes = {
        let TwoNodes { a, b, dir, nats } = nodes;
        b.kill9();
        (a, dir, nats)
    };
    js.publish(publish_queue::subject(orphaned), "not a frame".into())
        .await
        .expect("publish")
        .await
        .expect("acknowledged");
    let deadline = Instant::now() + Duration::from_secs(45);
    for (id, pk) in &written {
        loop {
            let answer = read_doc(&on_a.documents, id, pk).await;
            let last = format!("{answer:?}");
            if partition_of(pk) as u32 != orphaned {
                match answer {
                    Ok(doc) => {
                        let body = doc.into_inner().body.expect("a body").into_map();
                        assert_eq!(body["id"], serde_json::json!(id));
                        break;
                    }
                    Err(s) if s.code() == tonic::Code::Unavailable => {}
                    Err(s) => panic!("{id}: {s}"),
                }
            } else if let Err(s) = &answer
                && s.code() == tonic::Code::FailedPrecondition
            {
                let reason = s.get_error_details().error_info().map(|i| i.reason.clone());
                assert_eq!(reason.as_deref(), Some("LOG_DIVERGED"), "{s:?}");
                assert!(
                    s.message().contains(&format!("partition {orphaned}'s log")),
                    "{}",
                    s.message()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} (partition {}, orphaned {orphaned}) never answered as expected: {last}",
                partition_of(pk)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let map = on_a
        .admin
        .clone()
        .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
        .await
        .expect("partition map")
        .into_inner();
    for o in &map.owners {
        assert_eq!(
            o.log_diverged.is_empty(),
            o.partition != orphaned,
            "{:?}",
            map.owners
        );
    }
    drop(nodes);
}

/// A CA, and a certificate it issued for 127.0.0.1 (no extended key usage: good for a server
/// and a client alike), written to `dir`: (ca.pem, cert.pem, cert.key).
fn issue_certificates(dir: &std::path::Path) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "cluster CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("signed");
    let mut paths = Vec::new();
    for (name, text) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", cert.pem()),
        ("cert.key", key.serialize_pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        paths.push(path.to_str().expect("utf-8").to_owned());
    }
    (paths[0].clone(), paths[1].clone(), paths[2].clone())
}

/// Node to NATS over TLS (the servers' certificates checked against the cluster's CA, a client
/// certificate shown to servers that verify clients) as a NATS user known by its nkey; node to
/// node over TLS (each node checks the other's certificate when it forwards). A client of b
/// writes and reads documents of every partition, half of them a's; a node without the
/// user's credentials is refused by NATS and does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reach_nats_over_tls_with_credentials_and_each_other_over_tls() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = issue_certificates(dir.path());
    let user = nkeys::KeyPair::new_user();
    let seed = dir.path().join("user.nk");
    std::fs::write(&seed, user.seed().expect("seed")).expect("write the seed");
    let seed = seed.to_str().expect("utf-8").to_owned();
    let nats = NatsCluster::start_with(
        3,
        &format!(
            "tls {{ cert_file: {cert:?}, key_file: {key:?}, ca_file: {ca:?}, verify: true }}\n\
             authorization {{ users: [ {{ nkey: {:?} }} ] }}\n",
            user.public_key()
        ),
    );
    let secured = |node: &str, creds: bool| {
        let mut args = cluster_args(&nats, node);
        args.extend(
            [
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--cluster-peer-ca",
                &ca,
                "--cluster-tls-ca",
                &ca,
                "--cluster-tls-cert",
                &cert,
                "--cluster-tls-key",
                &key,
            ]
            .map(String::from),
        );
        if creds {
            args.extend(["--cluster-creds".to_owned(), seed.clone()]);
        }
        args
    };
    let start = |node: &str| {
        let args = secured(node, true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::Mayfly::start(&dir.path().join(node), &args)
    };
    let a = start("a");
    let b = start("b");
    let channel = Endpoint::from_shared(format!("https://{}", b.addr))
        .expect("uri")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(&ca).expect("ca")))
                .identity(tonic::transport::Identity::from_pem(
                    std::fs::read(&cert).expect("cert"),
                    std::fs::read(&key).expect("key"),
                )),
        )
        .expect("tls")
        .connect()
        .await
        .expect("connects to b over TLS");
    let mut on_b = support::clients::clients(channel);
    support::clients::database_and_collection(&mut on_b).await;
    let map = settled_map(&on_b.admin, &["a", "b"]).await;
    assert!(
        map.nodes.iter().all(|n| n.address.starts_with("https://")),
        "{:?}",
        map.nodes
    );
    let mut written = Vec::new();
    for i in 0..12 {
        let (id, pk) = (format!("tls-{i}"), format!("p{i}"));
        create_through(&on_b.documents, &id, &pk).await;
        written.push((id, pk));
    }
    let owners: std::collections::BTreeSet<&str> = written
        .iter()
        .map(|(_, pk)| map.owners[partition_of(pk)].owner.as_str())
        .collect();
    assert!(owners.contains("a"), "some writes went to a: {owners:?}");
    assert_present(&on_b.documents, &written).await;

    // Without the NATS user's credentials: refused, and the node says why.
    let args = secured("c", false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = support::Mayfly::try_start(&dir.path().join("c"), &args)
        .err()
        .expect("a node without credentials does not start");
    assert!(
        refused.stderr.to_lowercase().contains("authorization"),
        "{}",
        refused.stderr
    );
    drop((a, b));
}

/// A node serving TLS forwards to the other nodes over TLS only: to a node that advertises
/// plaintext (misconfigured, or a forged directory entry) it forwards nothing, since the
/// caller's key would travel in clear; the caller gets `UNAVAILABLE` saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_node_never_forwards_in_clear() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = issue_certificates(dir.path());
    let nats = NatsCluster::start(3);
    let mut args = cluster_args(&nats, "a");
    args.extend(
        [
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--cluster-peer-ca",
            &ca,
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = support::Mayfly::start(&dir.path().join("a"), &args);
    let b = cluster_node(&nats, dir.path(), "b");
    let channel = Endpoint::from_shared(format!("https://{}", a.addr))
        .expect("uri")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(&ca).expect("ca"))),
        )
        .expect("tls")
        .connect()
        .await
        .expect("connects to a over TLS");
    let mut on_a = support::clients::clients(channel);
    support::clients::database_and_collection(&mut on_a).await;
    let map = settled_map(&on_a.admin, &["a", "b"]).await;
    let pk = (0..64)
        .map(|i| format!("p{i}"))
        .find(|pk| map.owners[partition_of(pk)].owner == "b")
        .expect("a key of b's");
    let body = serde_json::json!({"id": "x", "pk": pk});
    let serde_json::Value::Object(body) = body else {
        unreachable!()
    };
    let refused = on_a
        .documents
        .clone()
        .create_document(mayfly_proto::v1::CreateDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            body: Some(mayfly_proto::json::JsonObject::new(body)),
            ..Default::default()
        })
        .await
        .expect_err("not forwarded in clear");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("forwards over TLS only"),
        "{}",
        refused.message()
    );
    drop((a, b));
}

/// With `--cluster-key-file`, the cluster's secrets are sealed on the NATS servers: the buckets
/// hold neither the account keys nor the continuation key in clear, the keys work on a node
/// given the file, and a node without it does not start, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_secrets_are_sealed_on_nats_with_the_cluster_key() {
    let nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, format!("{}\n", "0123456789abcdef".repeat(4))).expect("write");
    let key_file = key_file.to_str().expect("utf-8").to_owned();
    let sealed_args = |node: &str| {
        let mut args = cluster_args(&nats, node);
        args.extend(["--cluster-key-file".to_owned(), key_file.clone()]);
        args
    };
    let args = sealed_args("a");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = support::Mayfly::start_with_keys(&dir.path().join("a"), &args);
    let primary = std::fs::read_to_string(dir.path().join("a/keys/primary")).expect("a's copy");
    let primary = primary.trim();
    let mut on_a = support::clients::connect(&a).await;
    on_a.databases
        .list_databases(support::clients::with(
            Some(primary),
            mayfly_proto::v1::ListDatabasesRequest {},
        ))
        .await
        .expect("the cluster's key works");

    let js = client(&nats).await;
    for (bucket, name) in [
        ("mayfly-keys", "primary"),
        ("mayfly-keys", "secondary"),
        ("mayfly-keys", "primary-readonly"),
        ("mayfly-keys", "secondary-readonly"),
        ("mayfly-cluster", "continuation-key"),
    ] {
        let kv = js.get_key_value(bucket).await.expect("bucket");
        let stored = kv.get(name).await.expect("read").expect("stored");
        assert!(stored.starts_with(b"mfs1:"), "{bucket}/{name} is sealed");
        assert!(
            !stored
                .windows(primary.len())
                .any(|w| w == primary.as_bytes()),
            "{bucket}/{name} does not hold the key in clear"
        );
    }

    // A node without the file, and one with another key, refuse to start.
    let args = cluster_args(&nats, "b");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = support::Mayfly::try_start_with_keys(&dir.path().join("b"), &args)
        .err()
        .expect("a node without the cluster key does not start");
    assert!(
        refused.stderr.contains("--cluster-key-file"),
        "{}",
        refused.stderr
    );
    let other = dir.path().join("other.key");
    std::fs::write(&other, "f".repeat(64)).expect("write");
    let mut args = cluster_args(&nats, "c");
    args.extend([
        "--cluster-key-file".to_owned(),
        other.to_str().expect("utf-8").to_owned(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = support::Mayfly::try_start_with_keys(&dir.path().join("c"), &args)
        .err()
        .expect("a node with another cluster key does not start");
    assert!(
        refused.stderr.contains("does not open"),
        "{}",
        refused.stderr
    );
}

/// The message block files (`.blk`) of the log streams in a NATS server's store.
fn log_blocks(store: &std::path::Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, in_log: bool, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                walk(&path, in_log || name.starts_with("MAYFLY_LOG_"), out);
            } else if in_log && name.ends_with(".blk") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(store, false, &mut out);
    out
}

/// Asks every log stream's Raft leader to step down, so that another replica (perhaps a
/// damaged one) leads it.
async fn step_down_log_leaders(js: &Context) {
    for g in 0..publish_queue::LOG_STREAMS {
        let subject = format!("STREAM.LEADER.STEPDOWN.MAYFLY_LOG_{g}");
        let answer: Result<serde_json::Value, _> =
            js.request(subject, &serde_json::json!({})).await;
        eprintln!("step down MAYFLY_LOG_{g}: {answer:?}");
    }
}

/// Jepsen's finding in NATS 2.12.1 (nats-server #7564): a truncated or bit-flipped `.blk`
/// file on a minority of servers could lose acknowledged writes. Here one server's log stream
/// files are truncated to half while it is down, and in a second round another server's get a
/// bit flipped in each; each is started again under writes, and the log streams' leaders are
/// made to step down so that a damaged replica may lead. Then a new node b catches every
/// partition up from the log and takes them all over (a is killed). Every acknowledged write
/// must read back through b: a history that lost one is never served (`NOT_FOUND` for an
/// acknowledged write fails the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_servers_damaged_stream_files_lose_no_acknowledged_write() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use support::clients::{connect, database_and_collection};

    let mut nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cluster_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    let js = client(&nats).await;
    let mut written = Vec::new();
    let write = async |phase: &str, written: &mut Vec<(String, String)>| {
        for i in 0..12 {
            let (id, pk) = (format!("{phase}-{i}"), format!("p{i}"));
            create_through(&on_a.documents, &id, &pk).await;
            written.push((id, pk));
        }
    };
    write("before", &mut written).await;
    for (round, server) in [("truncated", 2), ("bit-flipped", 1)] {
        nats.kill9(server);
        let blocks = log_blocks(&nats.store(server));
        assert!(
            !blocks.is_empty(),
            "no log stream files in server {server}'s store"
        );
        for block in &blocks {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(block)
                .expect("open a block file");
            let len = file.metadata().expect("metadata").len();
            if round == "truncated" {
                file.set_len(len / 2).expect("truncate");
            } else if len > 0 {
                let at = len / 2;
                let mut byte = [0u8];
                file.seek(SeekFrom::Start(at)).expect("seek");
                file.read_exact(&mut byte).expect("read");
                byte[0] ^= 0x10;
                file.seek(SeekFrom::Start(at)).expect("seek");
                file.write_all(&byte).expect("flip a bit");
            }
            file.sync_all().expect("sync");
        }
        eprintln!("{round}: {} block files of server {server}", blocks.len());
        nats.restart(server);
        write(&format!("{round}-restarted"), &mut written).await;
        step_down_log_leaders(&js).await;
        write(&format!("{round}-stepped-down"), &mut written).await;
    }
    // b catches every partition up from the log as the damaged replicas left it, and takes
    // them all once a dies.
    let b = cluster_node(&nats, dir.path(), "b");
    let on_b = connect(&b).await;
    settled_map(&on_b.admin, &["a", "b"]).await;
    step_down_log_leaders(&js).await;
    a.kill9();
    for (id, pk) in &written {
        let request = mayfly_proto::v1::ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: id.clone(),
            partition_key: Some(support::clients::string_pk(pk)),
        };
        let read = when_served(&format!("read {id}"), || {
            let (mut documents, request) = (on_b.documents.clone(), request.clone());
            async move {
                match documents.read_document(request).await {
                    Ok(doc) => Ok(Ok(doc.into_inner())),
                    // The partition refuses its history: allowed, never a silent loss.
                    Err(s) if s.code() == tonic::Code::FailedPrecondition => Ok(Err(s)),
                    Err(s) => Err(s),
                }
            }
        })
        .await;
        match read {
            Ok(doc) => assert_eq!(
                doc.body.expect("a body").into_map()["id"],
                serde_json::json!(id)
            ),
            Err(s) => eprintln!("{id}: its partition refuses service: {s}"),
        }
    }
    eprintln!("{} acknowledged writes checked through b", written.len());
}

/// A NATS power failure: every server killed (SIGKILL; they fsync every write), then started
/// again on its store. Meanwhile the node acknowledges nothing (its lease cannot be renewed nor
/// its log written); once NATS answers again it serves on, by itself, with every acknowledged
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_on_with_every_write_after_all_nats_servers_are_killed_and_restarted() {
    use support::clients::{connect, database_and_collection};

    let mut nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = cluster_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    let mut written = Vec::new();
    for i in 0..8 {
        let (id, pk) = (format!("before-{i}"), format!("p{i}"));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    for i in 0..3 {
        nats.kill9(i);
    }
    let serde_json::Value::Object(body) = serde_json::json!({"id": "during", "pk": "p1"}) else {
        unreachable!()
    };
    let during = mayfly_proto::v1::CreateDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        body: Some(mayfly_proto::json::JsonObject::new(body)),
        ..Default::default()
    };
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        on_a.documents.clone().create_document(during),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "a write was acknowledged with every NATS server down"
    );
    // Past the lease: the node has stopped serving by its own clock.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..3 {
        nats.restart(i);
    }
    // Applied or not before the outage, it is written once now (ALREADY_EXISTS if it was).
    create_through(&on_a.documents, "during", "p1").await;
    written.push(("during".into(), "p1".into()));
    for i in 0..8 {
        let (id, pk) = (format!("after-{i}"), format!("p{i}"));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    assert_present(&on_a.documents, &written).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_past_its_lease_serves_nothing_stale_when_it_wakes() {
    use mayfly_proto::v1::{ReadDocumentRequest, ReplaceDocumentRequest};
    use support::clients::string_pk;

    let (nodes, mut on_a, on_b, map) = two_nodes().await;
    // Once a has handed half the partitions to b: x goes to one a keeps.
    let pk = (0..100)
        .map(|i| format!("p{i}"))
        .find(|pk| map.owners[partition_of(pk)].owner == "a")
        .expect("a partition key that a owns");
    create_through(&on_a.documents, "x", &pk).await;

    // a stops (SIGSTOP) past its lease; b takes the partition over and writes a new version.
    nodes.a.signal("STOP");
    let body = |v: i64| {
        let serde_json::Value::Object(body) = serde_json::json!({"id": "x", "pk": pk, "v": v})
        else {
            unreachable!()
        };
        Some(mayfly_proto::json::JsonObject::new(body))
    };
    when_served("replace through b", || {
        let mut documents = on_b.documents.clone();
        let request = ReplaceDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: "x".into(),
            body: body(2),
            partition_key: Some(string_pk(&pk)),
            ..Default::default()
        };
        async move { documents.replace_document(request).await.map(|_| ()) }
    })
    .await;

    // a wakes: its lease ended while it was stopped. Whatever it answers at once is the new
    // version, never the one it held (it refuses, or forwards to b), and no write of its
    // own is acknowledged.
    nodes.a.signal("CONT");
    let read = ReadDocumentRequest {
        database: "d".into(),
        collection: "c".into(),
        id: "x".into(),
        partition_key: Some(string_pk(&pk)),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut answers = 0;
    while answers < 20 {
        match on_a.documents.read_document(read.clone()).await {
            Ok(doc) => {
                let v = doc.into_inner().body.expect("a body").into_map()["v"].clone();
                assert_eq!(
                    v,
                    serde_json::json!(2),
                    "a served a stale version after waking"
                );
                answers += 1;
            }
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s}");
                assert!(Instant::now() < deadline, "a answered nothing in 20 s: {s}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // A write through a lands on b's history (forwarded) or is refused; the partition's
    // history is b's either way.
    let through_a = on_a
        .documents
        .replace_document(ReplaceDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: "x".into(),
            body: body(3),
            partition_key: Some(string_pk(&pk)),
            ..Default::default()
        })
        .await;
    let latest = when_served("read through b", || {
        let (mut documents, read) = (on_b.documents.clone(), read.clone());
        async move { documents.read_document(read).await }
    })
    .await
    .into_inner()
    .body
    .expect("a body")
    .into_map()["v"]
        .clone();
    match through_a {
        Ok(_) => assert_eq!(latest, serde_json::json!(3), "an acknowledged write is b's"),
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::Unavailable, "{s}");
            assert_eq!(
                latest,
                serde_json::json!(2),
                "a refused write changed nothing"
            );
        }
    }
}

/// One node's clocks in the skew test: the test's time line, less how far the node's clock is
/// behind; its wall clock, its lease clock and its engine's clock all read it, and they move
/// only when the test moves the line.
#[derive(Debug)]
struct Skewed {
    line: Arc<std::sync::atomic::AtomicU64>,
    behind: u64,
}

impl Skewed {
    fn read(&self) -> u64 {
        self.line.load(std::sync::atomic::Ordering::SeqCst) - self.behind
    }
}

impl mayfly_cluster::Clocks for Skewed {
    fn monotonic_ms(&self) -> u64 {
        self.read()
    }
    fn wall_ms(&self) -> u64 {
        self.read()
    }
}

impl mayfly_server::engine::Clock for Skewed {
    fn now(&self) -> u64 {
        self.read()
    }
}

impl mayfly_server::engine::LeaseClock for Skewed {
    fn now_ms(&self) -> u64 {
        self.read()
    }
}

/// A node of the skew test: an engine on `clock` logging every commit to the partitions' logs,
/// with database `db` and collection `c` (TTL on, no default), following every partition.
async fn skewed_node(
    js: &Context,
    clock: Arc<Skewed>,
) -> (Engine, Vec<Arc<PublishQueue>>, CollectionPath) {
    let (engine, queues) = logging_engine(js, clock.clone(), Some(clock));
    let path = collection_with(&engine, DefaultTtl::NoDefault);
    for p in 0..PARTITIONS {
        engine.set_following(p as usize, true);
    }
    (engine, queues, path)
}

/// Takes partition `p` of `engine` over with lease `held`, as a node's partition task does:
/// served within the lease, time capped by it and raised to the lease it replaced.
async fn own_partition(
    js: &Context,
    engine: &Engine,
    queue: &Arc<PublishQueue>,
    held: &mayfly_cluster::Held,
) {
    let p = held.partition;
    let stream = js
        .get_stream(publish_queue::stream_name(p))
        .await
        .expect("stream");
    engine.serve_until(
        p as usize,
        held.serves_until().expect("held"),
        held.time_cap(),
    );
    let mut followed = Followed::new(p);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match become_owner(
            js,
            &stream,
            engine,
            (queue, p, held.epoch, held.replaced_until()),
            (&mut followed, &|| true),
        )
        .await
        {
            Ok(_) => return,
            Err(CatchUpError::Takeover(e)) if Instant::now() < deadline => {
                eprintln!("partition {p} not taken over yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("partition {p} not taken over: {e}"),
        }
    }
}

/// The issue's test: a document the old owner reported expired is expired on the new owner,
/// whose clock is 500 ms behind. The window is real: the old owner serves until 1,930 ms after
/// its last renewal, the new one from 2,001 ms after it saw that renewal, by then reading 500 ms
/// less, so a document due in between is one the old owner may have reported expired and the
/// new one's clock says is alive. Nothing logged its expiry (reads do not commit, and no purge
/// ran): the lease's `lease_until`, where the new owner's time starts, is what keeps it expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_is_final_across_a_failover_to_a_node_whose_clock_is_500_ms_behind() {
    use mayfly_server::engine::Error as EngineError;

    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    // Created once the cluster takes replicated writes (creation retries until it does).
    replicated_stream(&js, "READY", "ready.>").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = log_streams(&js, 3).await {
        assert!(Instant::now() < deadline, "no log streams within 20 s: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leases = Leases::open(&js, 3, LeaseTiming::DEFAULT)
        .await
        .expect("bucket");
    let t0 = mayfly_server::engine::Clock::now(&SystemClock);
    let line = Arc::new(std::sync::atomic::AtomicU64::new(t0));
    let at = |ms: u64| line.store(t0 + ms, std::sync::atomic::Ordering::SeqCst);
    let a_clock = Arc::new(Skewed {
        line: line.clone(),
        behind: 0,
    });
    let b_clock = Arc::new(Skewed {
        line: line.clone(),
        behind: 500,
    });
    let (a, a_queues, path) = skewed_node(&js, a_clock.clone()).await;
    let (b, b_queues, _) = skewed_node(&js, b_clock.clone()).await;
    let info = a.get_collection(&path).expect("collection");
    let p = Placement::Xxh3.shard(
        &info,
        &PartitionKeyValue::String("k".into()),
        PARTITIONS as usize,
    ) as u32;

    // a takes the partition at 0 and writes x (ttl 2 s: due at 2,300) and y (no ttl) at 300.
    let mut a_lease = leases
        .try_acquire(p, "a", &mut Watch::default(), &*a_clock)
        .await
        .expect("answers")
        .expect("free");
    own_partition(&js, &a, &a_queues[p as usize], &a_lease).await;
    at(300);
    for body in [
        serde_json::json!({"id": "x", "pk": "k", "ttl": 2}),
        serde_json::json!({"id": "y", "pk": "k"}),
    ] {
        let serde_json::Value::Object(map) = body else {
            unreachable!()
        };
        let created = a.create_document(
            &path,
            DocumentBody::parse(Arc::new(map), None).expect("body"),
            None,
        );
        a.settle(created).await.expect("acknowledged");
    }
    // a renews at 500 (serving until 2,430); b sees that renewal at once.
    at(500);
    assert!(
        leases
            .renew(&mut a_lease, "a", &*a_clock)
            .await
            .expect("answers")
    );
    a.serve_until(
        p as usize,
        a_lease.serves_until().expect("held"),
        a_lease.time_cap(),
    );
    let mut b_watch = Watch::default();
    let early = leases.try_acquire(p, "b", &mut b_watch, &*b_clock).await;
    assert!(early.expect("answers").is_none(), "taken while renewed");

    let key = |id: &str| DocKey {
        partition_key: PartitionKeyValue::String("k".into()),
        id: ResourceId::parse(IdKind::Document, id).expect("id"),
    };
    let read = |engine: &Engine, id: &str| {
        let engine = engine.clone();
        let read = engine.read_document(&path, &key(id));
        async move { engine.settle(read).await }
    };
    at(2_290);
    assert!(read(&a, "x").await.is_ok(), "x is alive before 2,300");
    // a reports x expired at 2,310, within its lease; then it dies.
    at(2_310);
    assert!(
        matches!(
            read(&a, "x").await,
            Err(EngineError::DocumentNotFound { .. })
        ),
        "a reports x expired"
    );
    for q in &a_queues {
        q.close();
    }

    // b takes over at 2,501 (its lease clock: 2,001 after it saw a's renewal); its clock reads
    // 2,001, before x's expiry.
    at(2_501);
    let b_lease = leases
        .try_acquire(p, "b", &mut b_watch, &*b_clock)
        .await
        .expect("answers")
        .expect("a's lease has lapsed for b");
    assert_eq!(b_lease.epoch, 2);
    assert!(
        !a_lease.serves(&*a_clock),
        "a still served when b took over"
    );
    assert!(b_clock.read() < t0 + 2_300, "b's own clock says x is alive");
    own_partition(&js, &b, &b_queues[p as usize], &b_lease).await;
    assert!(
        b.shard_time(p as usize) >= t0 + 2_310,
        "b's time starts at a's lease end"
    );
    assert!(read(&b, "y").await.is_ok(), "b caught up with a's writes");
    assert!(
        matches!(
            read(&b, "x").await,
            Err(EngineError::DocumentNotFound { .. })
        ),
        "x, reported expired by a, is alive on b"
    );
}

/// One event of a recorded history: a client thread invoking an operation on a key, or the
/// answer it got. Recorded in the order they happened (an invocation before the request is
/// sent, an answer after it arrived: each operation's interval only widens).
#[derive(Debug, Clone)]
enum Event {
    Invoke(
        u64,
        stateright::semantics::register::RegisterOp<Option<i64>>,
    ),
    Return(
        u64,
        stateright::semantics::register::RegisterRet<Option<i64>>,
    ),
}

/// The issue's linearizability test: clients read and write two documents through both nodes
/// while the owner of every partition is paused (SIGSTOP) past its lease, the other node takes
/// over, and the paused one resumes. Each document's history, as the clients saw it, must be
/// linearizable as a register, checked by stateright's `LinearizabilityTester`. An operation
/// that failed or timed out may or may not have taken effect: it stays in flight (its client
/// thread goes on as a new one), which the checker may place anywhere after its invocation or
/// nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documents_history_is_linearizable_across_a_paused_owner() {
    use mayfly_proto::v1::{ReadDocumentRequest, UpsertDocumentRequest};
    use stateright::semantics::register::{RegisterOp, RegisterRet};
    use support::clients::string_pk;

    // a owned every partition (it joined alone) and handed b half of them. The documents
    // are in two partitions a keeps.
    let (nodes, on_a, on_b, before) = two_nodes().await;
    let mut keys: Vec<String> = Vec::new();
    for i in 0..100 {
        let key = format!("k{i}");
        let p = partition_of(&key);
        if before.owners[p].owner == "a" && keys.iter().all(|k| partition_of(k) != p) {
            keys.push(key);
        }
    }
    assert_eq!(keys.len(), 2, "a owns two partitions");
    for key in &keys {
        // Served before the clock starts, so that the history begins with a served partition.
        let read = ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: key.clone(),
            partition_key: Some(string_pk(key)),
        };
        let _ = when_served("first read", || {
            let (mut documents, read) = (on_a.documents.clone(), read.clone());
            async move {
                match documents.read_document(read).await {
                    Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        })
        .await;
    }

    let history: Arc<std::sync::Mutex<Vec<(usize, Event)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let thread_ids = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        for w in 0..3u64 {
            let nodes = [on_a.documents.clone(), on_b.documents.clone()];
            let (history, stop, thread_ids) = (history.clone(), stop.clone(), thread_ids.clone());
            let key = key.to_string();
            workers.push(tokio::spawn(async move {
                let record = |e: Event| history.lock().expect("history").push((k, e));
                let mut thread = thread_ids.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut n = 0i64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let mut documents = nodes[(n as usize + w as usize) % 2].clone();
                    let write = n % 2 == 0;
                    let value = (w as i64) * 1_000_000 + n;
                    let answer = if write {
                        record(Event::Invoke(thread, RegisterOp::Write(Some(value))));
                        let serde_json::Value::Object(body) =
                            serde_json::json!({"id": key, "pk": key, "v": value})
                        else {
                            unreachable!()
                        };
                        let request = UpsertDocumentRequest {
                            database: "d".into(),
                            collection: "c".into(),
                            body: Some(mayfly_proto::json::JsonObject::new(body)),
                            ..Default::default()
                        };
                        let call = documents.upsert_document(request);
                        match tokio::time::timeout(Duration::from_secs(2), call).await {
                            Ok(Ok(_)) => Some(RegisterRet::WriteOk),
                            _ => None,
                        }
                    } else {
                        record(Event::Invoke(thread, RegisterOp::Read));
                        let request = ReadDocumentRequest {
                            database: "d".into(),
                            collection: "c".into(),
                            id: key.clone(),
                            partition_key: Some(string_pk(&key)),
                        };
                        let call = documents.read_document(request);
                        match tokio::time::timeout(Duration::from_secs(2), call).await {
                            Ok(Ok(doc)) => {
                                let body = doc.into_inner().body.expect("a body").into_map();
                                Some(RegisterRet::ReadOk(body["v"].as_i64()))
                            }
                            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                                Some(RegisterRet::ReadOk(None))
                            }
                            _ => None,
                        }
                    };
                    match answer {
                        Some(ret) => record(Event::Return(thread, ret)),
                        // Its outcome unknown: left in flight, and this client goes on as a
                        // new thread.
                        None => {
                            thread = thread_ids.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    nodes.a.signal("STOP");
    // Past its lease and b's takeover.
    tokio::time::sleep(Duration::from_secs(5)).await;
    nodes.a.signal("CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }

    // b took the documents' partitions over while a was stopped (a may have had them handed
    // back since it woke): the history spans the failover.
    let map = on_b
        .admin
        .clone()
        .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
        .await
        .expect("partition map")
        .into_inner();
    for key in &keys {
        let p = partition_of(key);
        assert!(
            map.owners[p].epoch > before.owners[p].epoch,
            "{key}'s partition did not move: {:?}",
            map.owners
        );
    }
    let history = history.lock().expect("history").clone();
    for (k, key) in keys.iter().enumerate() {
        let events: Vec<_> = history
            .iter()
            .filter(|(of, _)| *of == k)
            .map(|(_, e)| e.clone())
            .collect();
        let checked = check_register(&events);
        eprintln!(
            "{key}: {} operations, {} of unknown outcome, {} reads of a written value",
            checked.operations, checked.in_flight, checked.reads_of_writes
        );
        assert!(
            checked.reads_of_writes > 10,
            "{key}: too few reads saw a write for the check to mean anything"
        );
        assert!(
            checked.linearizable,
            "{key}: the history is not linearizable: {events:?}"
        );
    }
}

/// What [`check_register`] found.
struct Checked {
    linearizable: bool,
    operations: usize,
    in_flight: usize,
    reads_of_writes: usize,
}

/// Whether `events`, one key's history, is linearizable as a register that starts absent.
fn check_register(events: &[Event]) -> Checked {
    use stateright::semantics::{
        ConsistencyTester, LinearizabilityTester,
        register::{Register, RegisterRet},
    };

    let mut tester = LinearizabilityTester::new(Register(None));
    let mut checked = Checked {
        linearizable: false,
        operations: 0,
        in_flight: 0,
        reads_of_writes: 0,
    };
    for event in events {
        match event {
            Event::Invoke(t, op) => {
                checked.operations += 1;
                checked.in_flight += 1;
                tester
                    .on_invoke(*t, op.clone())
                    .expect("a well-formed history");
            }
            Event::Return(t, ret) => {
                checked.in_flight -= 1;
                if matches!(ret, RegisterRet::ReadOk(Some(_))) {
                    checked.reads_of_writes += 1;
                }
                tester
                    .on_return(*t, ret.clone())
                    .expect("a well-formed history");
            }
        }
    }
    checked.linearizable = tester.is_consistent();
    checked
}

/// The checker can fail: a read that returns an overwritten value after the overwrite was
/// acknowledged (a stale read from a deposed owner) is found, and so is a read of a value
/// whose write was refused; a write of unknown outcome may explain a read, or not have
/// happened.
#[test]
fn the_history_checker_finds_a_stale_read() {
    use Event::{Invoke, Return};
    use stateright::semantics::register::{RegisterOp::*, RegisterRet::*};

    let stale = [
        Invoke(0, Write(Some(1))),
        Return(0, WriteOk),
        Invoke(1, Write(Some(2))),
        Return(1, WriteOk),
        Invoke(0, Read),
        Return(0, ReadOk(Some(1))),
    ];
    assert!(!check_register(&stale).linearizable);
    let concurrent = [
        Invoke(0, Write(Some(1))),
        Invoke(1, Write(Some(2))),
        Return(1, WriteOk),
        Invoke(2, Read),
        Return(0, WriteOk),
        Return(2, ReadOk(Some(1))),
    ];
    assert!(
        check_register(&concurrent).linearizable,
        "ordered 2, 1, read"
    );
    // Thread 0's write never answered: it may have happened (the read of 1) ...
    let unknown = [
        Invoke(0, Write(Some(1))),
        Invoke(1, Read),
        Return(1, ReadOk(Some(1))),
        Invoke(2, Read),
        Return(2, ReadOk(None)),
    ];
    assert!(
        !check_register(&unknown).linearizable,
        "1 then absent again"
    );
    assert!(check_register(&unknown[..3]).linearizable);
    assert!(
        check_register(&[
            Invoke(0, Write(Some(1))),
            Invoke(1, Read),
            Return(1, ReadOk(None))
        ])
        .linearizable
    );
}

/// The issue's membership test: under writes through every node, a third node joins (the
/// others hand it its share of the partitions), one is killed (its partitions lapse to the
/// others, which even out once it has left the member list), and another leaves gracefully
/// (it hands its partitions over before it exits). Every write is acknowledged within the
/// client's retries (45 s each, through the next node on a failure), and every acknowledged
/// write is there at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_joining_killed_and_leaving_under_writes_lose_nothing() {
    use mayfly_proto::v1::{CreateDocumentRequest, ReadDocumentRequest};
    use support::clients::{connect, string_pk};

    let (cluster, on_a, on_b, _) = two_nodes().await;

    // Writers, each trying its writes through the nodes in turn.
    let nodes = Arc::new(std::sync::Mutex::new(vec![
        on_a.documents.clone(),
        on_b.documents.clone(),
    ]));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (nodes, stop) = (nodes.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (id, pk) = (format!("w{w}-{i}"), format!("p{i}"));
                let serde_json::Value::Object(body) = serde_json::json!({"id": id, "pk": pk})
                else {
                    unreachable!()
                };
                let request = CreateDocumentRequest {
                    database: "d".into(),
                    collection: "c".into(),
                    body: Some(mayfly_proto::json::JsonObject::new(body)),
                    ..Default::default()
                };
                let deadline = Instant::now() + Duration::from_secs(45);
                let mut attempt = w + i;
                loop {
                    let mut documents = {
                        let nodes = nodes.lock().expect("nodes");
                        nodes[attempt % nodes.len()].clone()
                    };
                    attempt += 1;
                    let call = documents.create_document(request.clone());
                    match tokio::time::timeout(Duration::from_secs(10), call).await {
                        Ok(Ok(_)) => break,
                        // An earlier attempt was applied; its answer was lost.
                        Ok(Err(s)) if s.code() == tonic::Code::AlreadyExists => break,
                        // Refused for what it is (not for where it went, or a node gone).
                        Ok(Err(s))
                            if !matches!(
                                s.code(),
                                tonic::Code::Unavailable
                                    | tonic::Code::Unknown
                                    | tonic::Code::Cancelled
                                    | tonic::Code::DeadlineExceeded
                            ) =>
                        {
                            panic!("{id}: {s}")
                        }
                        failed => {
                            assert!(
                                Instant::now() < deadline,
                                "{id} not acknowledged within the retries: {failed:?}"
                            );
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                acked.push((id, pk));
                i += 1;
            }
            acked
        }));
    }

    // c joins: a and b hand it its share.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = cluster_node(&cluster.nats, cluster.dir.path(), "c");
    let on_c = connect(&c).await;
    nodes.lock().expect("nodes").push(on_c.documents.clone());
    let joined = settled_map(&on_a.admin, &["a", "b", "c"]).await;
    assert_eq!(
        joined.owners.iter().filter(|o| o.owner == "c").count(),
        1,
        "{:?}",
        joined.owners
    );
    // b is killed: the writers' next attempts through it fail over to the next node.
    cluster.b.kill9();
    let left = settled_map(&on_a.admin, &["a", "c"]).await;
    eprintln!(
        "owners after c joined: {:?}; after b left: {:?}",
        joined.owners, left.owners
    );
    // c leaves gracefully (SIGTERM): it hands its partitions to a before it exits, so a owns
    // them the moment c is gone (a lapse would leave them c's for another lease).
    let leaving = Instant::now();
    assert!(c.terminate().success(), "c exits cleanly");
    let leave_took = leaving.elapsed();
    let map = on_a
        .admin
        .clone()
        .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
        .await
        .expect("partition map")
        .into_inner();
    assert!(
        map.owners.iter().all(|o| o.owner == "a"),
        "c exited with partitions not handed over: {:?}",
        map.owners
    );
    eprintln!("c left in {leave_took:?}, handing its partitions to a");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.expect("writer"));
    }
    assert!(acked.len() > 30, "only {} writes", acked.len());
    for (id, pk) in &acked {
        for on in [&on_a] {
            let request = ReadDocumentRequest {
                database: "d".into(),
                collection: "c".into(),
                id: id.clone(),
                partition_key: Some(string_pk(pk)),
            };
            let doc = when_served(&format!("read {id}"), || {
                let (mut documents, request) = (on.documents.clone(), request.clone());
                async move { documents.read_document(request).await }
            })
            .await;
            assert_eq!(
                doc.into_inner().body.expect("a body").into_map()["id"],
                serde_json::json!(id)
            );
        }
    }
    eprintln!("{} acknowledged writes, all present", acked.len());
}

/// Commits without records (a keyed batch that only read, or one keeping the version floor)
/// move no record position: each still reaches the log as its own message, none dropped by
/// JetStream as a duplicate of the one before (their message ids are their log positions), and
/// the log's chain holds over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_without_records_each_reach_the_log() {
    use mayfly_cluster::Commit;
    use mayfly_server::storage::Lsn;

    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let streams = loop {
        match log_streams(&js, 3).await {
            Ok(streams) => break streams,
            Err(e) => {
                assert!(Instant::now() < deadline, "no log streams within 20 s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let stream = &streams[0];
    let position = loop {
        match take_over(&js, stream, 0, (1, 0), 0).await {
            Ok(position) => break position,
            Err(e) => {
                assert!(Instant::now() < deadline, "no takeover within 20 s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let queue = PublishQueue::new(0);
    let generation = queue.start(&position, 0, Default::default());
    tokio::spawn(
        queue
            .clone()
            .publish(js.clone(), stream.clone(), (position, generation)),
    );
    for i in 1..=3 {
        queue.enqueue(Commit {
            lsn: Lsn(i),
            first: None,
            records: Vec::new(),
            remembered: Vec::new(),
            versions_below: 100 + i,
        });
        let wait = queue.wait(Lsn(i)).expect("waits for its publish");
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .expect("published in time")
            .expect("acknowledged");
    }
    // The takeover and three commits, in one chain.
    let mut stream = js
        .get_stream(publish_queue::stream_name(0))
        .await
        .expect("stream");
    let last = stream.info().await.expect("info").state.last_sequence;
    let mut chain = Chain::new(0);
    let mut kinds = Vec::new();
    for seq in 1..=last {
        let message = stream.get_raw_message(seq).await.expect("message");
        if message.subject.as_str() != publish_queue::subject(0) {
            continue;
        }
        for part in decode_frame(&message.payload).expect("a frame") {
            let m = chain.accept(&part).expect("the chain holds");
            kinds.push((m.kind, m.versions_below));
        }
    }
    assert_eq!(
        kinds,
        [
            (MessageKind::Takeover, 0),
            (MessageKind::Commit, 101),
            (MessageKind::Commit, 102),
            (MessageKind::Commit, 103)
        ]
    );
}

/// A cluster node's `GET /metrics`: per partition, whether it serves it, its takeovers and
/// handovers, its log's unacknowledged commits and divergence; and its clock skew against
/// the NATS servers (measured on every heartbeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_nodes_metrics_show_its_partitions_and_clock() {
    use support::{metric, scrape};

    let nats = NatsCluster::start(3);
    let server = mayfly_server::RunningServer::start(mayfly_server::Config {
        metrics_listen: Some("127.0.0.1:0".parse().expect("address")),
        cluster: Some(mayfly_server::ClusterConfig {
            urls: nats.urls(),
            nats_monitors: nats.monitors(),
            node_id: "a".into(),
            partitions: 4,
            replicas: 3,
            advertise: None,
            standbys: 1,
            snapshot_records: mayfly_server::DEFAULT_SNAPSHOT_RECORDS,
            peer_ca: None,
            nats: Default::default(),
            key_file: None,
        }),
        ..Default::default()
    })
    .await
    .expect("a cluster node starts");
    let channel = support::clients::channel(&format!("http://{}", server.local_addr())).await;
    let clients = support::clients::clients(channel);
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let map = clients
            .admin
            .clone()
            .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
            .await
            .expect("partition map")
            .into_inner();
        if map.owners.iter().all(|o| o.served_here) {
            break;
        }
        assert!(Instant::now() < deadline, "not served in 45 s: {map:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A heartbeat has measured the clock.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let text = scrape(server.metrics_addr().expect("metrics served")).await;
    for p in 0..4 {
        let of = |name: &str| metric(&text, &format!("{name}{{partition=\"{p}\"}}"));
        assert_eq!(of("mayfly_cluster_partition_served"), 1.0);
        assert_eq!(of("mayfly_cluster_failovers_total"), 1.0, "taken when free");
        assert_eq!(of("mayfly_cluster_handovers_total"), 0.0);
        assert_eq!(of("mayfly_cluster_log_lag"), 0.0);
        assert_eq!(of("mayfly_cluster_log_divergence"), 0.0);
    }
    assert_eq!(
        metric(&text, "mayfly_cluster_nats_fsync_unconfirmed"),
        0.0,
        "each server's /varz says it runs with sync_interval: always"
    );
    let skew = metric(&text, "mayfly_cluster_clock_skew_seconds");
    assert!(skew.abs() < 1.0, "one machine's clocks agree: {skew}");
}

/// The issue's SDK test: a client of the Rust SDK, with a retry policy patient enough for a
/// failover (12 attempts, backoff 100 ms doubling to 1 s: about 8 s) that also retries
/// idempotent writes (upserts: a second application has the first's effect), upserts and
/// reads through one node while the other, owning half the partitions, is killed. No call
/// fails: the SDK's retries hide the failover; every upsert is read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_retries_hide_a_failover_from_idempotent_calls() {
    use mayfly_client::{Client, RetryPolicy};

    let (nodes, _on_a, on_b, _) = two_nodes().await;

    let client = Client::builder(nodes.b.url())
        .retry(
            RetryPolicy::default()
                .max_attempts(12)
                .base_delay(Duration::from_millis(100))
                .max_delay(Duration::from_secs(1))
                .retry_writes(true),
        )
        .connect()
        .await
        .expect("the SDK connects");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killed_at: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..3 {
        let (client, stop, killed_at) = (client.clone(), stop.clone(), killed_at.clone());
        workers.push(tokio::spawn(async move {
            let collection = client.database("d").collection("c");
            let (mut ops, mut after_kill) = (0, 0);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (id, pk) = (format!("w{w}-{i}"), format!("p{}", i % 20));
                let doc = serde_json::json!({"id": id, "pk": pk, "v": i});
                collection
                    .upsert(&doc)
                    .await
                    .unwrap_or_else(|e| panic!("upsert {id}: {e}"));
                let read = collection
                    .read(&id, pk.as_str())
                    .await
                    .unwrap_or_else(|e| panic!("read {id}: {e}"))
                    .unwrap_or_else(|| panic!("{id} not found after its upsert"));
                assert_eq!(read.id(), id);
                ops += 2;
                if killed_at.get().is_some() {
                    after_kill += 2;
                }
                i += 1;
            }
            (ops, after_kill)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes.a.kill9();
    let _ = killed_at.set(Instant::now());
    // Until b has taken a's partitions over, and a little after.
    settled_map(&on_b.admin, &["b"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut ops, mut after_kill) = (0, 0);
    for worker in workers {
        let (o, k) = worker.await.expect("no call failed");
        ops += o;
        after_kill += k;
    }
    eprintln!(
        "{ops} SDK calls, {after_kill} after the kill ({:?} ago), none failed",
        killed_at.get().expect("killed").elapsed()
    );
    assert!(after_kill > 20, "only {after_kill} calls after the kill");
}

/// Every result of `text` through `documents` (of partition `pk` only, if given), page by page
/// from `continuation`: the results and each page's continuation. Retried whole while a
/// partition is not served.
async fn query_pages(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    text: &str,
    page_size: u32,
    continuation: &str,
    pk: Option<&str>,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let request = mayfly_proto::v1::QueryRequest {
        database: "d".into(),
        collection: "c".into(),
        query: text.into(),
        page_size,
        continuation: continuation.into(),
        partition_key: pk.map(support::clients::string_pk),
        ..Default::default()
    };
    when_served(text, || {
        let (mut documents, request) = (documents.clone(), request.clone());
        async move {
            let mut pages = documents.query(request).await?.into_inner();
            let (mut results, mut tokens) = (Vec::new(), Vec::new());
            while let Some(page) = pages.message().await? {
                assert!(page.results.len() <= page_size as usize, "{text}");
                results.extend(page.results);
                tokens.push(page.continuation);
            }
            Ok((results, tokens))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_and_feeds_across_nodes_answer_as_one_node_would_and_resume_at_any_node() {
    use serde_json::{Value, json};

    let (_nodes, on_a, on_b, map) = two_nodes().await;
    // Sixty documents over twenty partition keys: both nodes serve some.
    let pks: Vec<String> = (0..20).map(|k| format!("k{k}")).collect();
    let owner = |pk: &str| map.owners[partition_of(pk)].owner.clone();
    assert!(pks.iter().any(|pk| owner(pk) == "a") && pks.iter().any(|pk| owner(pk) == "b"));
    for n in 0..60 {
        let doc = json!({"id": format!("doc-{n:02}"), "pk": pks[n % 20], "n": n, "g": n % 4});
        create_body(&on_a.documents, "c", doc).await;
    }
    let all_ids: Vec<Value> = (0..60).map(|n| json!(format!("doc-{n:02}"))).collect();
    let sorted = |mut v: Vec<Value>| {
        v.sort_by_key(|v| v.to_string());
        v
    };
    for (node, documents) in [("a", &on_a.documents), ("b", &on_b.documents)] {
        // Streaming: pages handed from node to node, each id once.
        let (ids, tokens) = query_pages(documents, "SELECT VALUE c.id FROM c", 7, "", None).await;
        assert_eq!(sorted(ids), all_ids, "through {node}");
        assert!(
            tokens.len() >= 60 / 7,
            "through {node}: {} pages",
            tokens.len()
        );
        assert_eq!(
            tokens.last().map(String::as_str),
            Some(""),
            "through {node}"
        );
        let (top, _) = query_pages(documents, "SELECT TOP 5 VALUE c.n FROM c", 2, "", None).await;
        assert_eq!(top.len(), 5, "through {node}: {top:?}");
        // Whole-scope queries: gathered, run once.
        let answer = |text: &'static str| query_pages(documents, text, 100, "", None);
        assert_eq!(answer("SELECT VALUE COUNT(1) FROM c").await.0, [json!(60)]);
        assert_eq!(
            answer("SELECT VALUE AVG(c.n) FROM c").await.0,
            [json!(29.5)]
        );
        let descending: Vec<Value> = (0..60).rev().map(|n| json!(n)).collect();
        assert_eq!(
            answer("SELECT VALUE c.n FROM c ORDER BY c.n DESC").await.0,
            descending,
            "through {node}"
        );
        assert_eq!(
            answer("SELECT VALUE c.n FROM c ORDER BY c.n OFFSET 10 LIMIT 5")
                .await
                .0,
            [json!(10), json!(11), json!(12), json!(13), json!(14)]
        );
        assert_eq!(
            sorted(answer("SELECT DISTINCT VALUE c.g FROM c").await.0),
            [json!(0), json!(1), json!(2), json!(3)]
        );
        let groups = answer("SELECT c.g, COUNT(1) AS n FROM c GROUP BY c.g")
            .await
            .0;
        assert_eq!(groups.len(), 4, "{groups:?}");
        assert!(groups.iter().all(|g| g["n"] == json!(15)), "{groups:?}");
        // One partition, served by the other node: answered there.
        for pk in [&pks[0], &pks[1], &pks[2], &pks[3]] {
            let (ids, _) =
                query_pages(documents, "SELECT VALUE c.n FROM c", 100, "", Some(pk)).await;
            let k: usize = pk[1..].parse().expect("k<n>");
            assert_eq!(
                ids,
                [json!(k), json!(k + 20), json!(k + 40)],
                "{pk} through {node}"
            );
        }
    }
    // The read feed likewise: relayed partition after partition, resumed at either node.
    let feed =
        |documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
         continuation: String,
         pk: Option<&str>| {
            let request = mayfly_proto::v1::ReadFeedRequest {
                database: "d".into(),
                collection: "c".into(),
                page_size: 7,
                continuation,
                partition_key: pk.map(support::clients::string_pk),
            };
            let documents = documents.clone();
            async move {
                when_served("read feed", || {
                    let (mut documents, request) = (documents.clone(), request.clone());
                    async move {
                        let mut pages = documents.read_feed(request).await?.into_inner();
                        let mut read = Vec::new();
                        while let Some(page) = pages.message().await? {
                            assert!(page.documents.len() <= 7);
                            read.push((
                                page.documents
                                    .iter()
                                    .map(|d| json!(d.id))
                                    .collect::<Vec<_>>(),
                                page.continuation,
                            ));
                        }
                        Ok(read)
                    }
                })
                .await
            }
        };
    for (node, documents) in [("a", &on_a.documents), ("b", &on_b.documents)] {
        let pages = feed(documents, String::new(), None).await;
        let ids: Vec<Value> = pages.iter().flat_map(|(ids, _)| ids.clone()).collect();
        assert_eq!(sorted(ids), all_ids, "the read feed through {node}");
        let (first, token) = pages[0].clone();
        let other = if node == "a" {
            &on_b.documents
        } else {
            &on_a.documents
        };
        let rest = feed(other, token, None).await;
        let mut ids = first;
        ids.extend(rest.into_iter().flat_map(|(ids, _)| ids));
        assert_eq!(
            sorted(ids),
            all_ids,
            "resumed at the other node than {node}"
        );
        for pk in [&pks[0], &pks[1], &pks[2], &pks[3]] {
            let ids: Vec<Value> = feed(documents, String::new(), Some(pk))
                .await
                .into_iter()
                .flat_map(|(ids, _)| ids)
                .collect();
            assert_eq!(ids.len(), 3, "{pk} through {node}: {ids:?}");
        }
    }
    // A token from one node resumes at the other, for either kind of query.
    for text in [
        "SELECT VALUE c.id FROM c",
        "SELECT VALUE c.n FROM c ORDER BY c.n",
    ] {
        let first = {
            let mut documents = on_a.documents.clone();
            let mut pages = documents
                .query(mayfly_proto::v1::QueryRequest {
                    database: "d".into(),
                    collection: "c".into(),
                    query: text.into(),
                    page_size: 10,
                    ..Default::default()
                })
                .await
                .expect("query")
                .into_inner();
            pages.message().await.expect("page").expect("a first page")
        };
        assert!(!first.continuation.is_empty(), "{text}");
        let (rest, _) = query_pages(&on_b.documents, text, 10, &first.continuation, None).await;
        let mut whole = first.results.clone();
        whole.extend(rest);
        assert_eq!(whole.len(), 60, "{text}: {whole:?}");
        if text.contains("ORDER BY") {
            assert_eq!(whole, (0..60).map(|n| json!(n)).collect::<Vec<_>>());
        } else {
            assert_eq!(sorted(whole), all_ids);
        }
    }
}

/// `message` with `authorization: Bearer <credential>`.
fn keyed<T>(credential: &str, message: T) -> tonic::Request<T> {
    support::clients::with(Some(credential), message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_keys_work_on_every_node_and_a_regenerated_one_stops_everywhere() {
    use mayfly_proto::v1::{
        CreateCollectionRequest, CreateDatabaseRequest, CreateResourceTokenRequest,
        GetDatabaseRequest, KeyKind, RegenerateKeyRequest, TokenPermission,
    };
    use support::clients::connect;

    let mut nats = NatsCluster::start(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let a = keyed_cluster_node(&nats, dir.path(), "a");
    let b = keyed_cluster_node(&nats, dir.path(), "b");
    let key_of = |node: &str, slot: &str| {
        std::fs::read_to_string(dir.path().join(node).join("keys").join(slot))
            .expect("the node keeps a copy of the cluster's keys")
            .trim()
            .to_owned()
    };
    let primary = key_of("a", "primary");
    assert_eq!(key_of("b", "primary"), primary, "one set of keys");
    assert_ne!(key_of("a", "secondary"), primary);
    let (mut on_a, mut on_b) = (connect(&a).await, connect(&b).await);
    on_a.databases
        .create_database(keyed(
            &primary,
            CreateDatabaseRequest {
                id: "d".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("the key works on a");
    on_a.collections
        .create_collection(keyed(
            &primary,
            CreateCollectionRequest {
                database: "d".into(),
                id: "c".into(),
                partition_key_path: "/pk".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("collection");
    let get = |key: &str| keyed(key, GetDatabaseRequest { id: "d".into() });
    on_b.databases
        .get_database(get(&primary))
        .await
        .expect("and on b");
    let refused = on_b
        .databases
        .get_database(GetDatabaseRequest { id: "d".into() })
        .await
        .expect_err("no key");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    // A token minted on a reads on b.
    let token = on_a
        .admin
        .create_resource_token(keyed(
            &primary,
            CreateResourceTokenRequest {
                database: "d".into(),
                collection: "c".into(),
                permission: TokenPermission::Read as i32,
                ..Default::default()
            },
        ))
        .await
        .expect("token")
        .into_inner()
        .token;
    let count = |credential: &str| {
        keyed(
            credential,
            mayfly_proto::v1::QueryRequest {
                database: "d".into(),
                collection: "c".into(),
                query: "SELECT VALUE COUNT(1) FROM c".into(),
                ..Default::default()
            },
        )
    };
    when_served("a token's query on b", || {
        let (mut documents, request) = (on_b.documents.clone(), count(&token));
        async move { documents.query(request).await.map(drop) }
    })
    .await;

    // Regenerated on a: refused on b within the bound, the new key taken there.
    let new = on_a
        .admin
        .regenerate_key(keyed(
            &primary,
            RegenerateKeyRequest {
                kind: KeyKind::Primary as i32,
            },
        ))
        .await
        .expect("regenerated")
        .into_inner()
        .key;
    let regenerated = Instant::now();
    loop {
        match on_b.databases.get_database(get(&primary)).await {
            Err(s) if s.code() == tonic::Code::Unauthenticated => break,
            Ok(_) => {}
            Err(s) => panic!("the old key on b: {s}"),
        }
        assert!(
            regenerated.elapsed() < Duration::from_millis(2_500),
            "the old key still works on b {:?} after it was regenerated",
            regenerated.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let revoked_after = regenerated.elapsed();
    on_b.databases
        .get_database(get(&new))
        .await
        .expect("the new key works on b once the old one stopped");
    let stale = on_b
        .documents
        .query(count(&token))
        .await
        .expect_err("the old key's token");
    assert_eq!(stale.code(), tonic::Code::Unauthenticated, "{stale}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while key_of("b", "primary") != new {
        assert!(
            Instant::now() < deadline,
            "b's copy of the keys is not updated"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("old key refused on b {revoked_after:?} after its regeneration on a was answered");

    // Without NATS, a node cannot know whether a key was regenerated: it refuses them all.
    for i in 0..3 {
        nats.kill9(i);
    }
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let unconfirmed = on_b
        .databases
        .get_database(get(&new))
        .await
        .expect_err("keys unconfirmed");
    assert_eq!(
        unconfirmed.code(),
        tonic::Code::Unavailable,
        "{unconfirmed}"
    );
    assert!(
        unconfirmed.message().contains("confirm"),
        "{}",
        unconfirmed.message()
    );
    for i in 0..3 {
        nats.restart(i);
    }
    when_served("the key once NATS is back", || {
        let (mut databases, request) = (on_b.databases.clone(), get(&new));
        async move { databases.get_database(request).await.map(drop) }
    })
    .await;
}

/// The ids of the events `stream` sends until `want` have come (each id once, or the test
/// fails), and the continuation of the message carrying the last; bounded by 30 s.
async fn feed_until(
    stream: &mut tonic::Streaming<mayfly_proto::v1::ChangeFeedResponse>,
    want: usize,
) -> (Vec<String>, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut ids, mut token) = (Vec::new(), String::new());
    while ids.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{} of {want} events in 30 s: {ids:?}", ids.len()))
            .expect("the feed goes on")
            .expect("a message");
        for event in message.events {
            assert!(!ids.contains(&event.id), "{} twice", event.id);
            ids.push(event.id);
        }
        token = message.continuation;
    }
    (ids, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_across_nodes_shows_each_event_once_and_resumes_at_any_node() {
    use mayfly_proto::v1::{
        ChangeFeedRequest, CreateCollectionRequest, oneofs::ChangeFeedStart as Start,
    };

    let (_nodes, mut on_a, mut on_b, map) = two_nodes().await;
    on_a.collections
        .create_collection(CreateCollectionRequest {
            database: "d".into(),
            id: "f".into(),
            partition_key_path: "/pk".into(),
            change_feed_retention: Some(3600),
            ..Default::default()
        })
        .await
        .expect("a collection with a change feed");
    let pks: Vec<String> = (0..12).map(|k| format!("k{k}")).collect();
    let on = |pk: &str| map.owners[partition_of(pk)].owner.clone();
    assert!(pks.iter().any(|pk| on(pk) == "a") && pks.iter().any(|pk| on(pk) == "b"));
    let request = |start: Start| ChangeFeedRequest {
        database: "d".into(),
        collection: "f".into(),
        start: Some(start),
        max_events: 5,
        ..Default::default()
    };
    // Opened through b, from now: writes through a to every partition reach it, each once.
    let mut through_b = when_served("a change feed through b", || {
        let mut documents = on_b.documents.clone();
        async move {
            documents
                .change_feed(request(Start::Now(())))
                .await
                .map(tonic::Response::into_inner)
        }
    })
    .await;
    for (i, pk) in pks.iter().enumerate() {
        create_in(&on_a.documents, "f", &format!("one-{i}"), pk).await;
    }
    let (first, token) = feed_until(&mut through_b, pks.len()).await;
    let mut expected: Vec<String> = (0..pks.len()).map(|i| format!("one-{i}")).collect();
    let mut seen = first.clone();
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected);
    drop(through_b);

    // More writes, then the token resumed through a: only the new events, each once.
    for (i, pk) in pks.iter().enumerate() {
        create_in(&on_b.documents, "f", &format!("two-{i}"), pk).await;
    }
    let mut through_a = when_served("the change feed resumed through a", || {
        let mut documents = on_a.documents.clone();
        let token = token.clone();
        async move {
            documents
                .change_feed(request(Start::Continuation(token)))
                .await
                .map(tonic::Response::into_inner)
        }
    })
    .await;
    let (second, _) = feed_until(&mut through_a, pks.len()).await;
    let mut seen = second.clone();
    seen.sort();
    let mut expected: Vec<String> = (0..pks.len()).map(|i| format!("two-{i}")).collect();
    expected.sort();
    assert_eq!(seen, expected, "resumed: the new events only");

    // From the beginning through a: all of them; one partition's feed through the node that
    // does not serve it: that partition's events.
    let mut from_start = on_a
        .documents
        .change_feed(request(Start::Beginning(())))
        .await
        .expect("from the beginning")
        .into_inner();
    let (all, _) = feed_until(&mut from_start, 2 * pks.len()).await;
    assert_eq!(all.len(), 2 * pks.len());
    let elsewhere = pks.iter().find(|pk| on(pk) == "a").expect("a serves some");
    let mut one = on_b
        .documents
        .change_feed(ChangeFeedRequest {
            partition_key: Some(support::clients::string_pk(elsewhere)),
            ..request(Start::Beginning(()))
        })
        .await
        .expect("one partition's feed through b")
        .into_inner();
    let (ids, _) = feed_until(&mut one, 2).await;
    let k = &elsewhere[1..];
    let mut ids = ids;
    ids.sort();
    assert_eq!(ids, [format!("one-{k}"), format!("two-{k}")]);
}

/// Whether partition `p`'s log starts with the first part of a snapshot (the owner purged it
/// below one), and how many messages it holds.
async fn log_start(js: &Context, p: u32) -> (bool, u64) {
    let stream = js
        .get_stream(publish_queue::stream_name(p))
        .await
        .expect("log stream");
    let subject = publish_queue::subject(p);
    let Ok(first) = stream.get_first_raw_message_by_subject(&subject, 1).await else {
        return (false, 0);
    };
    let starts = starts_a_snapshot(&first.payload);
    let mut info = stream.clone();
    let held = info
        .info()
        .await
        .map(|i| i.state.messages)
        .unwrap_or_default();
    (starts, held)
}

/// An owner snapshots each partition into its log every `--snapshot-records` records and
/// purges the log below the older of its last two snapshots: the log stays bounded while
/// writes go on. A node joining after the purge has no log to replay from the start: it loads
/// each partition's snapshot, applies what follows, takes half the partitions over, and, the
/// first node killed, serves every acknowledged write, and none deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_log_starts_with_a_snapshot_that_a_new_node_loads() {
    use support::clients::{connect, database_and_collection, string_pk};

    let nats = NatsCluster::start(3);
    let js = client(&nats).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let args = |node: &str| {
        let mut args = cluster_args(&nats, node);
        args.extend(["--snapshot-records", "30"].map(String::from));
        args
    };
    let start = |node: &str| {
        let args = args(node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::Mayfly::start(&dir.path().join(node), &args)
    };
    let a = start("a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    // Written in rounds until every partition's log starts with a snapshot: its owner took
    // two, then purged below the older (checked each second, at most 60 s).
    let mut written = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for _ in 0..60 {
            let i = written.len();
            let (id, pk) = (format!("doc-{i}"), format!("p{}", i % 24));
            create_through(&on_a.documents, &id, &pk).await;
            written.push((id, pk));
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut starts = Vec::new();
        for p in 0..4 {
            starts.push(log_start(&js, p).await.0);
        }
        if starts.iter().all(|s| *s) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "logs not purged below a snapshot: {starts:?}"
        );
    }
    // A few deleted: a copy made from a snapshot must not bring them back (their deletes are
    // in the log after the snapshot, or the next snapshot lacks them).
    let mut deleted = Vec::new();
    for (id, pk) in written.drain(..12) {
        when_served(&format!("delete {id}"), || {
            let mut documents = on_a.documents.clone();
            let request = mayfly_proto::v1::DeleteDocumentRequest {
                database: "d".into(),
                collection: "c".into(),
                id: id.clone(),
                partition_key: Some(string_pk(&pk)),
                ..Default::default()
            };
            async move { documents.delete_document(request).await }
        })
        .await;
        deleted.push((id, pk));
    }
    let held: u64 = {
        let mut held = 0;
        for g in 0..publish_queue::LOG_STREAMS {
            held = held.max(log_start(&js, g).await.1);
        }
        held
    };
    eprintln!(
        "after {} writes over 4 partitions, the fullest log stream holds {held} messages",
        written.len() + deleted.len() * 2
    );

    // b joins: every log starts past its (empty) copy, with a snapshot.
    let b = start("b");
    let on_b = connect(&b).await;
    settled_map(&on_b.admin, &["a", "b"]).await;
    standbys_caught_up(&on_b.admin).await;
    a.kill9();
    assert_present(&on_b.documents, &written).await;
    for (id, pk) in &deleted {
        let request = mayfly_proto::v1::ReadDocumentRequest {
            database: "d".into(),
            collection: "c".into(),
            id: id.clone(),
            partition_key: Some(string_pk(pk)),
        };
        let read = loop {
            match on_b.documents.clone().read_document(request.clone()).await {
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other,
            }
        };
        assert_eq!(
            read.expect_err("deleted").code(),
            tonic::Code::NotFound,
            "{id}"
        );
    }
    // b owns everything now, and writes on from where the snapshots and logs left off.
    create_through(&on_b.documents, "after", "p1").await;
    let (ids, _) = query_pages(&on_b.documents, "SELECT VALUE c.id FROM c", 100, "", None).await;
    assert_eq!(ids.len(), written.len() + 1);
}

/// `mayfly` of a cluster on `nats` keeping its partitions in its own data directory
/// (`dir/<node>`), its log kept for the test to read (and shown with `MAYFLY_TEST_STDERR=1`).
fn disk_node(
    nats: &NatsCluster,
    dir: &std::path::Path,
    node: &str,
) -> (support::Mayfly, Arc<parking_lot::Mutex<String>>) {
    let args: Vec<String> = cluster_args(nats, node)
        .into_iter()
        .skip(2) // "--storage memory"
        .collect();
    assert!(!args.contains(&"memory".to_string()));
    logged_node(&dir.join(node), &args)
}

/// `mayfly` with `args` on `data_dir`, its log kept for the test to read (and shown with
/// `MAYFLY_TEST_STDERR=1`).
fn logged_node(
    data_dir: &std::path::Path,
    args: &[String],
) -> (support::Mayfly, Arc<parking_lot::Mutex<String>>) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = support::Mayfly::spawn(data_dir, &args, std::process::Stdio::piped())
        .unwrap_or_else(|f| panic!("mayfly did not start: {f:?}"));
    let log = Arc::new(parking_lot::Mutex::new(String::new()));
    let stderr = server.child.stderr.take().expect("stderr piped");
    let kept = log.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let show = std::env::var_os("MAYFLY_TEST_STDERR").is_some();
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if show {
                eprintln!("{line}");
            }
            let mut kept = kept.lock();
            kept.push_str(&line);
            kept.push('\n');
        }
    });
    (server, log)
}

/// The number after `field=` on the first line of `log` saying `what`.
fn logged_count(log: &str, what: &str, field: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(what))?;
    let at = line.find(&format!("{field}="))? + field.len() + 1;
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Each node keeps its partitions in its own fjall (`--data-dir`), with where each copy
/// stands in its partition's log. A node killed and restarted resumes the copies it followed
/// from there (an owner's copy, holding commits past its kept state, is rebuilt from the log),
/// and serves every acknowledged write once its peer dies. Then, both nodes killed, NATS loses
/// the last acknowledged message of a partition one of them followed: restarted, that node finds
/// the log ending before its own copy and refuses the partition (`LOG_DIVERGED`) rather than
/// serve a history without the write; every other partition serves on. (A node keeping its
/// copies in memory would restart empty and serve the shortened history.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_own_copies_resume_after_a_restart_and_catch_a_log_that_lost_what_they_hold() {
    use support::clients::{connect, database_and_collection};

    let nats = NatsCluster::start(3);
    let js = client(&nats).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, _a_log) = disk_node(&nats, dir.path(), "a");
    let mut on_a = connect(&a).await;
    database_and_collection(&mut on_a).await;
    let (b, _) = disk_node(&nats, dir.path(), "b");
    let on_b = connect(&b).await;
    settled_map(&on_b.admin, &["a", "b"]).await;
    let mut written = Vec::new();
    for i in 0..40 {
        let (id, pk) = (format!("doc-{i}"), format!("p{}", i % 12));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    standbys_caught_up(&on_a.admin).await;

    // b killed and restarted on its data directory: the copies it followed resume.
    b.kill9();
    for i in 40..60 {
        let (id, pk) = (format!("doc-{i}"), format!("p{}", i % 12));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    let (b, b_log) = disk_node(&nats, dir.path(), "b");
    let on_b = connect(&b).await;
    let map = settled_map(&on_b.admin, &["a", "b"]).await;
    standbys_caught_up(&on_b.admin).await;
    let opened = "opened this node's copies";
    let resumed = logged_count(&b_log.lock(), opened, "resumed");
    let rebuilt = logged_count(&b_log.lock(), opened, "rebuilt");
    eprintln!("b restarted: {resumed:?} copies resumed, {rebuilt:?} rebuilt");
    assert!(
        resumed.is_some_and(|n| n >= 1),
        "b resumed none of the copies it followed: {}",
        b_log.lock()
    );
    let on_a_partitions: Vec<usize> = (0..4).filter(|&p| map.owners[p].owner == "a").collect();
    assert!(!on_a_partitions.is_empty(), "{:?}", map.owners);

    // a killed: b serves every acknowledged write, from copies it resumed or rebuilt.
    a.kill9();
    assert_present(&on_b.documents, &written).await;
    // a back on its own directory: the partitions even out, and b's are followed by a.
    let (a, _) = disk_node(&nats, dir.path(), "a");
    let on_a = connect(&a).await;
    let map = settled_map(&on_a.admin, &["a", "b"]).await;
    for i in 60..72 {
        let (id, pk) = (format!("doc-{i}"), format!("p{}", i % 12));
        create_through(&on_a.documents, &id, &pk).await;
        written.push((id, pk));
    }
    standbys_caught_up(&on_a.admin).await;

    // Both killed; NATS loses the last acknowledged message of a partition a owns and b
    // followed to its end.
    let p = (0..4)
        .find(|&p| map.owners[p].owner == "a")
        .expect("a owns a partition") as u32;
    // Each create is one position of its partition's log: b's copy holds them all once it
    // applied that many (heartbeats may be older than the last writes).
    let positions = written
        .iter()
        .filter(|(_, pk)| partition_of(pk) == p as usize)
        .count() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let map = on_a
            .admin
            .clone()
            .get_partition_map(mayfly_proto::v1::GetPartitionMapRequest {})
            .await
            .expect("partition map")
            .into_inner();
        let applied = map.owners[p as usize]
            .standbys
            .iter()
            .find(|s| s.node == "b")
            .map(|s| s.applied);
        if applied >= Some(positions) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's copy of partition {p} stayed at {applied:?} of {positions}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Its state is written right after each message it applies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // And one b owns: b's own copy holds commits that may not be in the log, and is rebuilt
    // at its restart, but the replicated mark it kept says what the log acknowledged.
    let q = (0..4)
        .find(|&p| map.owners[p].owner == "b")
        .expect("b owns a partition") as u32;
    a.kill9();
    b.kill9();
    let mut lost = Vec::new();
    for p in [p, q] {
        let stream = js
            .get_stream(publish_queue::stream_name(p))
            .await
            .expect("log stream");
        let deleted = lose_last_message(&stream, p).await;
        eprintln!("partition {p}: its last message (stream sequence {deleted}) deleted");
        let written_to: Vec<_> = written
            .iter()
            .filter(|(_, pk)| partition_of(pk) == p as usize)
            .cloned()
            .collect();
        lost.push((p, written_to.last().expect("written to").clone()));
    }

    // b alone, restarted on its copies: both partitions are refused, never served short.
    let (b, b_log) = disk_node(&nats, dir.path(), "b");
    let on_b = connect(&b).await;
    for (p, (id, pk)) in &lost {
        refused_as_lost(&on_b.documents, *p, id, pk, &b_log).await;
    }
    // The other partitions serve every write.
    let elsewhere: Vec<_> = written
        .iter()
        .filter(|(_, pk)| ![p, q].contains(&(partition_of(pk) as u32)))
        .cloned()
        .collect();
    assert!(!elsewhere.is_empty());
    assert_present(&on_b.documents, &elsewhere).await;

    // b's directory is bound to this cluster: against another one, b does not start.
    b.kill9();
    drop(nats); // one NATS cluster at a time
    let other = NatsCluster::start(3);
    let args: Vec<String> = cluster_args(&other, "b").into_iter().skip(2).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match support::Mayfly::try_start(&dir.path().join("b"), &args) {
        Err(failed) => assert!(
            failed.stderr.contains("belongs to another cluster"),
            "{}",
            failed.stderr
        ),
        Ok(_) => panic!("b started on another cluster's data directory"),
    }
}

/// Waits until reading `id` (in partition `p`) through `documents` is refused because the
/// partition's log lost messages; fails if it is ever answered as absent.
async fn refused_as_lost(
    documents: &mayfly_proto::v1::client::DocumentsClient<tonic::transport::Channel>,
    p: u32,
    id: &str,
    pk: &str,
    log: &parking_lot::Mutex<String>,
) {
    let deadline = Instant::now() + Duration::from_secs(45);
    let b_log = log;
    loop {
        match read_doc(documents, id, pk).await {
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                assert!(
                    s.message().contains("messages were lost"),
                    "{}",
                    s.message()
                );
                break;
            }
            Err(s) if s.code() == tonic::Code::NotFound => {
                panic!(
                    "b served {id} (partition {p}) as absent from a log that lost it\n{}",
                    b_log.lock()
                )
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "partition {p} never refused: {other:?}\n{}",
                    b_log.lock()
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

/// JetStream acknowledges before it fsyncs unless run with `sync_interval: always` (Jepsen lost
/// acknowledged writes that way): a node given the NATS servers' monitoring endpoints refuses
/// to start when one of them does, naming it; a node not given them starts, warning that it cannot
/// tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_nats_servers_that_acknowledge_before_they_fsync() {
    let nats = NatsCluster::start_without_sync_always_on(3, 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = cluster_args(&nats, "a");
    let refused = {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::Mayfly::try_start(&dir.path().join("a"), &args)
            .err()
            .expect("a node refuses a NATS server without sync_interval: always")
    };
    assert!(!refused.status.success());
    assert!(
        refused
            .stderr
            .contains("NATS servers that acknowledge writes before they are on disk: n2 (")
            && refused.stderr.contains("sync_interval: always"),
        "{}",
        refused.stderr
    );

    let monitor = args
        .iter()
        .position(|a| a == "--cluster-nats-monitor")
        .expect("the harness gives the monitoring endpoints");
    args.drain(monitor..monitor + 2);
    let (_node, log) = logged_node(&dir.path().join("b"), &args);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log
        .lock()
        .contains("WARNING: cannot tell whether the NATS servers fsync before they acknowledge")
    {
        assert!(Instant::now() < deadline, "no warning:\n{}", log.lock());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
