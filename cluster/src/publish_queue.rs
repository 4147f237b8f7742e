//! A partition's publish queue (docs/cluster.md, "Write path" and "Streams"): the owner's
//! commits go to the partition's log subject in commit order, with one fenced publish in
//! flight; the commits queued behind it go out together in the next, as one frame. A commit
//! is replicated once JetStream has acknowledged the publish holding it: on a quorum of the R3
//! stream, each server fsynced (`sync_interval: always`).
//!
//! Every publish expects the stream sequence of the partition's previous message
//! (`Nats-Expected-Last-Subject-Sequence`) and carries a message id, so that a publish sent again
//! after a lost acknowledgement is stored once. A refused expectation is told apart by reading
//! the subject's last message from the stream leader: this very publish (stored after all), the
//! queue's own previous message (JetStream's error 10164 while that one is still being applied:
//! sent again), or another owner's (fenced: the partition fails, and every commit not yet
//! acknowledged fails with it).

use std::{
    collections::VecDeque,
    future::IntoFuture,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use async_nats::jetstream::{
    self, Context,
    context::PublishErrorKind,
    message::PublishMessage,
    stream::{self, LastRawMessageErrorKind, Stream},
};
use bytes::Bytes;
use mayfly_engine::{
    engine::ShardSnapshot,
    model::CollectionUid,
    storage::{DurableFuture, LogRecord, Lsn, Storage, StorageError},
};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use crate::{
    copy_state::{self, Kept},
    epochs::Epochs,
    follower::Followed,
    log_message::{LogMessage, MessageKind, Remembered, decode_frame, encode_frame, link},
    snapshot,
};

/// Log streams: partition `p` is in stream `p % LOG_STREAMS`, so that the streams' Raft leaders
/// spread over three NATS servers.
pub const LOG_STREAMS: u32 = 3;

/// A frame stops growing past this many bytes (one commit may exceed it alone).
pub const MAX_FRAME_BYTES: usize = 512 * 1024;

/// How long one publish waits for its acknowledgement before it is sent again.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a frame is sent again (a NATS server lost, a Raft leader moving) before the
/// requests waiting on its commits are answered that their outcome is unknown. The publisher
/// goes on sending it: it is stored once NATS answers, or refused if another owner took over.
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

/// How many times a publish refused while the queue's own previous message is last is sent
/// again at once (see the module's note); after that, every 50 ms until [`GIVE_UP_AFTER`].
const CONFLICT_RETRIES: u32 = 10;

/// The stream holding partition `partition`'s log.
pub fn stream_name(partition: u32) -> String {
    format!("MAYFLY_LOG_{}", partition % LOG_STREAMS)
}

/// Partition `partition`'s log subject.
pub fn subject(partition: u32) -> String {
    format!("mayfly.log.{}.{partition}", partition % LOG_STREAMS)
}

/// Creates the log streams where missing: R3 (or `replicas`), file storage. Returns them, by
/// index.
pub async fn log_streams(js: &Context, replicas: usize) -> Result<Vec<Stream>, StorageError> {
    let mut out = Vec::new();
    for g in 0..LOG_STREAMS {
        let config = stream::Config {
            name: format!("MAYFLY_LOG_{g}"),
            subjects: vec![format!("mayfly.log.{g}.*")],
            num_replicas: replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let stream = js
            .get_or_create_stream(config)
            .await
            .map_err(|e| StorageError::unavailable(format!("log stream MAYFLY_LOG_{g}: {e}")))?;
        out.push(stream);
    }
    Ok(out)
}

/// A commit as the owner made it, waiting for its publish.
#[derive(Debug, Clone)]
pub struct Commit {
    /// Where local storage applied it.
    pub lsn: Lsn,
    /// The position of its first record, the others following it; `None` for a commit without
    /// records (it remembered requests, or kept the version floor).
    pub first: Option<u64>,
    /// Its change log records, by collection.
    pub records: Vec<(CollectionUid, LogRecord)>,
    /// Requests it remembered by their idempotency keys.
    pub remembered: Vec<Remembered>,
    /// Every version handed out is below this.
    pub versions_below: u64,
}

/// What waits in a publish queue: commits in commit order, and snapshots among them.
#[derive(Debug)]
enum Item {
    Commit(Commit),
    /// The shard's snapshot at the position the commits before it end at: split into parts
    /// by the publisher.
    Snapshot(Box<ShardSnapshot>),
    /// One part of a snapshot at position `at`.
    Part {
        at: u64,
        part: u32,
        parts: u32,
        bytes: Bytes,
    },
}

impl Item {
    /// About how many bytes it takes in a frame.
    fn size(&self) -> usize {
        match self {
            Item::Commit(c) => c.records.iter().map(|(_, r)| r.len() + 12).sum(),
            Item::Snapshot(_) => 0,
            Item::Part { bytes, .. } => bytes.len() + 64,
        }
    }
}

/// A snapshot of the partition this queue published whole: the stream sequence of its first
/// part. The log may be purged below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Published {
    at: u64,
    first_seq: u64,
}

/// Where a partition's log ends: what the next publish follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogPosition {
    /// The stream sequence of the partition's last message (0: none), which the next publish
    /// expects.
    pub subject_seq: u64,
    /// The partition's last record position.
    pub last: u64,
    /// The chain's link after its last message.
    pub link: u64,
    /// The epoch of the owner that wrote its last message.
    pub epoch: u64,
}

/// Why a node could not take a partition's log over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeoverError {
    /// The log holds records this node has not applied (or lacks records it has): it must
    /// catch up from the log first.
    NotCaughtUp { log_last: u64, local_last: u64 },
    /// Another owner published meanwhile.
    Raced,
    /// The log's last message is of a later owner than this node's lease.
    Superseded { log_epoch: u64, epoch: u64 },
    /// The log's last message (at stream sequence `subject_seq`) is not one this version
    /// reads.
    Unreadable { subject_seq: u64, why: String },
    /// NATS did not answer.
    Unavailable(String),
}

impl std::fmt::Display for TakeoverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeoverError::NotCaughtUp {
                log_last,
                local_last,
            } => write!(
                f,
                "the log ends at position {log_last} and this node's copy at {local_last}"
            ),
            TakeoverError::Raced => f.write_str("another owner published to the log meanwhile"),
            TakeoverError::Superseded { log_epoch, epoch } => write!(
                f,
                "the log's last message is of owner epoch {log_epoch}, later than this node's lease ({epoch})"
            ),
            TakeoverError::Unreadable { subject_seq, why } => {
                write!(
                    f,
                    "the log's last message (stream sequence {subject_seq}): {why}"
                )
            }
            TakeoverError::Unavailable(e) => write!(f, "NATS: {e}"),
        }
    }
}

impl std::error::Error for TakeoverError {}

/// Where partition `partition`'s log ends, read from the stream leader.
pub async fn log_end(stream: &Stream, partition: u32) -> Result<LogPosition, TakeoverError> {
    let message = match stream
        .get_last_raw_message_by_subject(&subject(partition))
        .await
    {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
            return Ok(LogPosition::default());
        }
        Err(e) => return Err(TakeoverError::Unavailable(e.to_string())),
    };
    let unreadable = |why: String| TakeoverError::Unreadable {
        subject_seq: message.sequence,
        why,
    };
    let parts = decode_frame(&message.payload).map_err(|e| unreadable(e.to_string()))?;
    let last = parts.last().expect("a frame holds a message");
    let decoded = LogMessage::decode(last).map_err(|e| unreadable(e.to_string()))?;
    if decoded.partition != partition {
        return Err(unreadable(format!(
            "it is partition {}'s",
            decoded.partition
        )));
    }
    Ok(LogPosition {
        subject_seq: message.sequence,
        last: decoded.last(),
        link: link(decoded.previous_link, last),
        epoch: decoded.epoch,
    })
}

/// Takes partition `partition`'s log over at `epoch` (this node's lease's; refused if the log
/// names a later one), for a node whose copy ends at position `local_last`: publishes a
/// `takeover` message at the log's end, so that any earlier owner's next publish is refused
/// (docs/cluster.md, "Leases and fencing"). It carries `watermark`, the time the new owner's
/// shard starts from. Returns where the log ends after it.
pub async fn take_over(
    js: &Context,
    stream: &Stream,
    partition: u32,
    (epoch, watermark): (u64, u64),
    local_last: u64,
) -> Result<LogPosition, TakeoverError> {
    let end = log_end(stream, partition).await?;
    if end.last != local_last {
        return Err(TakeoverError::NotCaughtUp {
            log_last: end.last,
            local_last,
        });
    }
    // This epoch's takeover is already the log's last message (an earlier try was stored and
    // its acknowledgement lost, and the catch-up applied it): the log is taken over.
    if end.epoch == epoch {
        return Ok(end);
    }
    // The log names a later owner: this node's lease is older than the log's, and it must not
    // fence that owner.
    if end.epoch > epoch {
        return Err(TakeoverError::Superseded {
            log_epoch: end.epoch,
            epoch,
        });
    }
    let message = LogMessage {
        kind: MessageKind::Takeover,
        partition,
        epoch,
        after: end.last,
        previous_link: end.link,
        watermark,
        catalog_seq: 0,
        versions_below: 0,
        records: Vec::new(),
        remembered: Vec::new(),
    }
    .encode();
    let frame = Bytes::from(encode_frame(&[&message]));
    let publish = PublishMessage::build()
        .payload(frame)
        .expected_last_subject_sequence(end.subject_seq)
        .message_id(format!("{partition}:{epoch}:takeover:{}", end.subject_seq));
    let ack = js
        .send_publish(subject(partition), publish)
        .await
        .map_err(|e| TakeoverError::Unavailable(e.to_string()))?;
    match tokio::time::timeout(ACK_TIMEOUT, ack.into_future()).await {
        Ok(Ok(ack)) => Ok(LogPosition {
            subject_seq: ack.sequence,
            last: end.last,
            link: link(end.link, &message),
            epoch,
        }),
        Ok(Err(e)) if refused_expectation(&e) => Err(TakeoverError::Raced),
        Ok(Err(e)) => Err(TakeoverError::Unavailable(e.to_string())),
        Err(_) => Err(TakeoverError::Unavailable(
            "no acknowledgement of the takeover".into(),
        )),
    }
}

/// One partition's queue of commits waiting for their publish.
#[derive(Debug)]
pub struct PublishQueue {
    partition: u32,
    subject: String,
    queue: Mutex<Queue>,
    /// Wakes the publisher when a commit is queued.
    wake: Notify,
    /// Changed whenever commits are acknowledged or the queue fails.
    progress: watch::Sender<()>,
    /// Where the owner keeps its replicated mark (the node's storage): where the log ended
    /// after the last frame acknowledged, written before its commits are (see
    /// [`crate::copy_state`]).
    marks: std::sync::OnceLock<Arc<dyn Storage>>,
}

#[derive(Debug)]
struct Queue {
    /// Commits (and snapshots) not yet sent, in commit order.
    waiting: VecDeque<Item>,
    /// Where every commit sent or waiting, not yet acknowledged, was applied locally: in
    /// order, since the shard lock orders both.
    unacked: VecDeque<Lsn>,
    /// The position the next commit's first record must have; `None` while this node follows
    /// the partition (its commits are not sent).
    next: Option<u64>,
    /// Why the partition's log refuses this node's commits (fenced, or the node stopped
    /// publishing): every commit not acknowledged before fails, and every commit after.
    failed: Option<StorageError>,
    /// Why NATS has not acknowledged the frame being sent for longer than [`GIVE_UP_AFTER`]:
    /// while it is set, waits on commits not acknowledged answer that their outcome is
    /// unknown. Cleared by the next acknowledgement.
    stalled: Option<StorageError>,
    /// The publisher has stopped.
    closed: bool,
    /// The latest watermark logged: messages carry the wall clock at their publish, never
    /// below the time the shard started from at takeover (an earlier owner's), so the log's
    /// last watermark is at or above every time this owner acted on before its lease's end.
    watermark: u64,
    /// Where the log ended after the last message this node's publisher had acknowledged
    /// (or its takeover): where it follows on from if it stops owning the partition cleanly.
    position: Option<LogPosition>,
    /// One more at each start and stop: a publisher of an earlier ownership stops.
    generation: u64,
    /// The first part of the snapshot being published, once acknowledged.
    snapshot_started: Option<Published>,
    /// The last two snapshots this ownership published whole, oldest first.
    snapshots: VecDeque<Published>,
    /// The log ended before this owner's last acknowledged message: NATS lost it.
    log_lost: bool,
    /// The partition's owner epochs up to this ownership's, which its snapshots carry.
    epochs: Epochs,
}

impl PublishQueue {
    /// A queue for partition `partition`, which this node follows until [`PublishQueue::start`]:
    /// meanwhile its shard's writes are the owner's commits being applied, and are not sent.
    pub fn new(partition: u32) -> Arc<Self> {
        Arc::new(PublishQueue {
            partition,
            subject: subject(partition),
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                unacked: VecDeque::new(),
                next: None,
                failed: None,
                stalled: None,
                closed: false,
                watermark: 0,
                position: None,
                generation: 0,
                snapshot_started: None,
                snapshots: VecDeque::new(),
                log_lost: false,
                epochs: Epochs::default(),
            }),
            wake: Notify::new(),
            progress: watch::Sender::new(()),
            marks: std::sync::OnceLock::new(),
        })
    }

    /// This node owns the partition from here, its log ending at `position` (from
    /// [`take_over`], which logged `watermark`): its shard's commits are queued from now on,
    /// and [`PublishQueue::publish`] sends them. `epochs`: the log's owner epochs, this
    /// ownership's included, which its snapshots carry.
    ///
    /// Returns the publisher's generation, for [`PublishQueue::publish`].
    pub fn start(&self, position: &LogPosition, watermark: u64, epochs: Epochs) -> u64 {
        let mut q = self.queue.lock();
        q.epochs = epochs;
        q.next = Some(position.last + 1);
        q.watermark = q.watermark.max(watermark);
        q.position = Some(*position);
        q.stalled = None;
        // An earlier ownership's failure failed its own commits; this one starts afresh (a
        // re-base after the log lost messages restarts a failed queue).
        q.failed = None;
        q.generation += 1;
        q.snapshot_started = None;
        q.snapshots.clear();
        q.log_lost = false;
        q.generation
    }

    /// This node stops owning the partition (its shard follows again: nothing more is
    /// queued), and its publisher stops. If every commit it queued was acknowledged, where the
    /// log ends after them: this node's copy is the log up to there, and it may follow on and
    /// own the partition again. `None`: commits were not acknowledged (they fail, their
    /// outcome unknown), or the queue had failed; this copy may hold what the log does not.
    pub fn stop(&self) -> Option<LogPosition> {
        let mut q = self.queue.lock();
        q.generation += 1;
        q.next = None;
        // A snapshot not published yet is dropped: it holds nothing the log lacks.
        q.waiting.retain(|item| matches!(item, Item::Commit(_)));
        let clean = q.failed.is_none() && q.unacked.is_empty() && q.waiting.is_empty();
        let position = if clean {
            q.position.take()
        } else {
            if q.failed.is_none() {
                let error = StorageError::outcome_unknown(format!(
                    "partition {}: this node stopped owning it before NATS acknowledged the commit",
                    self.partition
                ));
                Self::fail(&mut q, error);
            }
            None
        };
        drop(q);
        self.progress.send_replace(());
        // The publisher waiting now is this ownership's: it wakes and stops, and no later
        // commit's wake-up goes to it.
        self.wake.notify_waiters();
        position
    }

    /// Waits until every commit queued so far is acknowledged (`true`), the queue fails, or
    /// `timeout` passes (`false`).
    pub async fn drained(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = self.progress.subscribe();
        loop {
            {
                let q = self.queue.lock();
                if q.failed.is_some() {
                    return false;
                }
                // Commits only: a snapshot waiting holds nothing the log lacks.
                if q.unacked.is_empty() && !q.waiting.iter().any(|i| matches!(i, Item::Commit(_))) {
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Why the partition's log refuses this node's commits, if it does: a write should be
    /// refused before it is applied.
    pub fn refusal(&self) -> Option<StorageError> {
        let q = self.queue.lock();
        if let Some(failed) = &q.failed {
            return Some(failed.clone());
        }
        // NATS has not acknowledged for a while: a write is refused before it is applied
        // rather than queued behind a frame that may never go (nothing changed; retry later).
        q.stalled.as_ref().map(|_| {
            StorageError::unavailable(format!(
                "partition {}: NATS has not acknowledged its log for over {} s; nothing was changed",
                self.partition,
                GIVE_UP_AFTER.as_secs()
            ))
        })
    }

    /// Commits queued that the log has not acknowledged yet.
    pub fn backlog(&self) -> usize {
        self.queue.lock().unacked.len()
    }

    /// Whether this node owns the partition's log ([`PublishQueue::start`] was called).
    pub fn owns(&self) -> bool {
        self.queue.lock().next.is_some()
    }

    /// Queues a commit (called under the shard lock, in commit order) once this node owns the
    /// partition. Its records must follow the previous commit's without a gap; a commit queued
    /// after the queue failed fails too.
    pub fn enqueue(&self, commit: Commit) {
        let mut q = self.queue.lock();
        let Some(next) = q.next else {
            // Following: the commit is the owner's, applied here.
            return;
        };
        if q.failed.is_some() {
            return;
        }
        if commit.first.is_some_and(|first| first != next) {
            let error = StorageError::new(format!(
                "partition {}: a commit at log position {:?} where {next} was next; positions must follow each other",
                self.partition, commit.first
            ));
            Self::fail(&mut q, error);
            drop(q);
            self.progress.send_replace(());
            return;
        }
        q.next = Some(next + commit.records.len() as u64);
        q.unacked.push_back(commit.lsn);
        q.waiting.push_back(Item::Commit(commit));
        drop(q);
        self.wake.notify_one();
    }

    /// Queues the shard's snapshot (called under the shard lock, as its commits are) while
    /// this node owns the partition: its parts go to the log after the commits queued before
    /// it. `false`: not queued (the node does not own the partition, the queue failed, or the
    /// snapshot is not at the position the queued commits end at).
    pub fn enqueue_snapshot(&self, snapshot: ShardSnapshot) -> bool {
        let mut q = self.queue.lock();
        if !Self::takes_snapshot(&q) || q.next != Some(snapshot.seq + 1) {
            return false;
        }
        q.waiting.push_back(Item::Snapshot(Box::new(snapshot)));
        drop(q);
        self.wake.notify_one();
        true
    }

    /// Whether a snapshot would be queued now: the node owns the partition, the queue has not
    /// failed, and no earlier snapshot is still being published (one at a time, so that
    /// snapshots never pile up behind a slow log).
    pub fn takes_snapshot_now(&self) -> bool {
        Self::takes_snapshot(&self.queue.lock())
    }

    fn takes_snapshot(q: &Queue) -> bool {
        q.next.is_some()
            && q.failed.is_none()
            && q.snapshot_started.is_none()
            && !q
                .waiting
                .iter()
                .any(|i| matches!(i, Item::Snapshot(_) | Item::Part { .. }))
    }

    /// Whether a publish found the log ending before this owner's last acknowledged message
    /// (NATS lost it): the queue failed, and the owner's copy holds what the log lost.
    pub fn log_lost(&self) -> bool {
        self.queue.lock().log_lost
    }

    /// The stream sequence below which the partition's log may be purged: the first part of
    /// the older of the last two snapshots this ownership published whole (the log then still
    /// holds a snapshot interval's commits for a standby reading behind). `None`: fewer.
    pub fn purge_below(&self) -> Option<u64> {
        let q = self.queue.lock();
        (q.snapshots.len() >= 2).then(|| q.snapshots[0].first_seq)
    }

    /// Keeps this queue's replicated mark in `storage` from now on (see
    /// [`crate::copy_state`]), if it keeps a node's state; a client's write waits for the
    /// mark's durability too.
    pub fn keep_marks_in(&self, storage: Arc<dyn Storage>) {
        if storage.keeps_node_state() {
            let _ = self.marks.set(storage);
        }
    }

    /// The log's owner epochs as this ownership began them ([`PublishQueue::start`]).
    pub fn epochs(&self) -> Epochs {
        self.queue.lock().epochs.clone()
    }

    /// `None` if every commit this queue took at or before `lsn` is acknowledged; else a
    /// future that resolves once they are, or fails with the queue.
    pub fn wait(self: &Arc<Self>, lsn: Lsn) -> Option<DurableFuture> {
        // Reflecting nothing (a refusal, say), it waits for nothing: not even on a failed queue.
        if lsn == Lsn::ZERO {
            return None;
        }
        match self.settled(lsn) {
            Some(Ok(())) => None,
            Some(Err(e)) => Some(Box::pin(std::future::ready(Err(e)))),
            None => {
                let me = self.clone();
                Some(Box::pin(async move {
                    // Subscribed before looking: a change after the look wakes it.
                    let mut changed = me.progress.subscribe();
                    loop {
                        if let Some(settled) = me.settled(lsn) {
                            return settled;
                        }
                        // The sender lives in `me`: it cannot be dropped while waited on.
                        let _ = changed.changed().await;
                    }
                }))
            }
        }
    }

    fn settled(&self, lsn: Lsn) -> Option<Result<(), StorageError>> {
        let q = self.queue.lock();
        if let Some(e) = &q.failed {
            return Some(Err(e.clone()));
        }
        match q.unacked.front() {
            Some(&first) if first <= lsn => q.stalled.clone().map(Err),
            _ => Some(Ok(())),
        }
    }

    /// Stops the publisher after what it is sending; commits not yet acknowledged fail.
    pub fn close(&self) {
        let mut q = self.queue.lock();
        q.closed = true;
        if q.failed.is_none() {
            let error = StorageError::outcome_unknown(format!(
                "partition {}: this node stopped publishing its log",
                self.partition
            ));
            Self::fail(&mut q, error);
        }
        drop(q);
        self.progress.send_replace(());
        self.wake.notify_one();
    }

    fn fail(q: &mut Queue, error: StorageError) {
        q.failed = Some(error);
        q.waiting.clear();
        q.unacked.clear();
    }

    /// Publishes queued commits until the queue fails or closes, starting where the log ends
    /// (`position`, from [`take_over`]). Spawn it on the runtime that runs NATS's client.
    /// `generation`: [`PublishQueue::start`]'s; the publisher stops when the queue stops.
    pub async fn publish(
        self: Arc<Self>,
        js: Context,
        stream: Stream,
        (mut position, generation): (LogPosition, u64),
    ) {
        loop {
            // A snapshot is split into parts outside the lock, and goes on at the front.
            let snap = {
                let mut q = self.queue.lock();
                if q.failed.is_some() || q.closed || q.generation != generation {
                    return;
                }
                match q.waiting.front() {
                    Some(Item::Snapshot(_)) => match q.waiting.pop_front() {
                        Some(Item::Snapshot(snap)) => Some(snap),
                        _ => unreachable!("looked at"),
                    },
                    _ => None,
                }
            };
            if let Some(snap) = snap {
                let at = snap.seq;
                let epochs = self.queue.lock().epochs.clone();
                let parts = match tokio::task::spawn_blocking(move || {
                    snapshot::split(snapshot::encode(&snap, &epochs))
                })
                .await
                {
                    Ok(parts) => parts,
                    Err(e) => {
                        tracing::error!(partition = self.partition, error = %e, "a snapshot was not encoded");
                        continue;
                    }
                };
                let mut q = self.queue.lock();
                if q.generation != generation {
                    return;
                }
                let n = parts.len() as u32;
                for (i, bytes) in parts.into_iter().enumerate().rev() {
                    q.waiting.push_front(Item::Part {
                        at,
                        part: i as u32,
                        parts: n,
                        bytes,
                    });
                }
                continue;
            }
            let batch = {
                let mut q = self.queue.lock();
                if q.failed.is_some() || q.closed || q.generation != generation {
                    return;
                }
                let mut bytes = 0;
                let mut batch = Vec::new();
                while let Some(item) = q.waiting.front() {
                    let size = item.size();
                    if !batch.is_empty() && bytes + size > MAX_FRAME_BYTES {
                        break;
                    }
                    // A snapshot starts a frame: the log may be purged below that frame.
                    if !batch.is_empty()
                        && matches!(item, Item::Part { part: 0, .. } | Item::Snapshot(_))
                    {
                        break;
                    }
                    bytes += size;
                    batch.push(q.waiting.pop_front().expect("looked at"));
                }
                batch
            };
            if batch.is_empty() {
                // A commit queued since the look left a permit: this returns at once.
                self.wake.notified().await;
                continue;
            }
            let (frame, after) = self.frame(&batch, &position);
            // One id per log position (the subject sequence it expects) and owner: the same
            // for every resend of this frame, never shared with another frame (a frame of
            // commits without records does not move the record position, so that cannot be
            // the id: JetStream would drop it as a duplicate of the previous frame).
            let id = format!(
                "{}:{}:{}",
                self.partition, position.epoch, position.subject_seq
            );
            match self
                .send(&js, &stream, frame, (&id, generation), position.subject_seq)
                .await
            {
                Ok(subject_seq) => {
                    position = LogPosition {
                        subject_seq,
                        ..after
                    };
                    // The replicated mark before the commits count as acknowledged: a client
                    // told so waits for everything applied by then to be durable, the mark
                    // included, so a restarted node knows the log held these commits.
                    if let Some(storage) = self.marks.get() {
                        let epochs = {
                            let q = self.queue.lock();
                            if q.generation != generation {
                                return;
                            }
                            q.epochs.clone()
                        };
                        let mark = Followed::at(self.partition, &position, epochs);
                        copy_state::save(&**storage, self.partition, Kept::At, &mark);
                    }
                    let mut q = self.queue.lock();
                    if q.generation != generation {
                        // Stopped meanwhile: these commits already failed.
                        return;
                    }
                    for item in &batch {
                        match item {
                            Item::Commit(_) => {
                                q.unacked.pop_front();
                            }
                            Item::Part {
                                at, part, parts, ..
                            } => {
                                if *part == 0 {
                                    q.snapshot_started = Some(Published {
                                        at: *at,
                                        first_seq: subject_seq,
                                    });
                                }
                                if *part + 1 == *parts
                                    && let Some(done) = q.snapshot_started.take()
                                {
                                    q.snapshots.push_back(done);
                                    if q.snapshots.len() > 2 {
                                        q.snapshots.pop_front();
                                    }
                                }
                            }
                            Item::Snapshot(_) => {}
                        }
                    }
                    q.stalled = None;
                    q.position = Some(position);
                    drop(q);
                    self.progress.send_replace(());
                }
                Err(error) => {
                    let mut q = self.queue.lock();
                    // A queue stopped meanwhile failed what it had not acknowledged itself,
                    // and may have started again.
                    if q.generation == generation {
                        Self::fail(&mut q, error);
                    }
                    drop(q);
                    self.progress.send_replace(());
                    return;
                }
            }
        }
    }

    /// The frame of `batch`, following `position`, and where the log ends after it.
    fn frame(&self, batch: &[Item], position: &LogPosition) -> (Bytes, LogPosition) {
        let mut after = *position;
        let watermark = {
            let mut q = self.queue.lock();
            q.watermark = q.watermark.max(wall_ms());
            q.watermark
        };
        let messages: Vec<Vec<u8>> = batch
            .iter()
            .filter_map(|item| {
                let (kind, records, remembered, versions_below) = match item {
                    Item::Commit(commit) => (
                        MessageKind::Commit,
                        commit
                            .records
                            .iter()
                            .map(|(c, r)| (*c, r.to_bytes()))
                            .collect(),
                        commit.remembered.clone(),
                        commit.versions_below,
                    ),
                    Item::Part {
                        part, parts, bytes, ..
                    } => (
                        MessageKind::Snapshot {
                            part: *part,
                            parts: *parts,
                            bytes: bytes.clone(),
                        },
                        Vec::new(),
                        Vec::new(),
                        0,
                    ),
                    // Split before it is batched.
                    Item::Snapshot(_) => return None,
                };
                let moved = records.len() as u64;
                let message = LogMessage {
                    kind,
                    partition: self.partition,
                    epoch: after.epoch,
                    after: after.last,
                    previous_link: after.link,
                    watermark,
                    catalog_seq: 0,
                    versions_below,
                    records,
                    remembered,
                }
                .encode();
                after.last += moved;
                after.link = link(after.link, &message);
                Some(message)
            })
            .collect();
        (Bytes::from(encode_frame(&messages)), after)
    }

    /// Publishes one frame, expecting the subject's last message at `expected`, until it is
    /// stored (its stream sequence), refused for good or the queue closes (why its commits
    /// fail). A frame never stored while another owner may have taken over is refused by
    /// its expectation, so sending it on is safe however long NATS is away.
    async fn send(
        &self,
        js: &Context,
        stream: &Stream,
        frame: Bytes,
        (id, generation): (&str, u64),
        expected: u64,
    ) -> Result<u64, StorageError> {
        let started = Instant::now();
        let mut conflicts = 0;
        loop {
            let publish = PublishMessage::build()
                .payload(frame.clone())
                .expected_last_subject_sequence(expected)
                .message_id(id);
            let answer = match js.send_publish(self.subject.clone(), publish).await {
                Ok(ack) => tokio::time::timeout(ACK_TIMEOUT, ack.into_future())
                    .await
                    .unwrap_or_else(|_| {
                        Err(jetstream::context::PublishError::new(
                            PublishErrorKind::TimedOut,
                        ))
                    }),
                Err(e) => Err(e),
            };
            let why = match answer {
                Ok(ack) => return Ok(ack.sequence),
                Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    return Err(StorageError::unavailable(format!(
                        "partition {}: a commit is larger than the NATS servers take in one message ({e}); raise their max_payload",
                        self.partition
                    )));
                }
                Err(e) if refused_expectation(&e) => {
                    // Whose message is last? Asked of the stream leader, not a replica.
                    match stream.get_last_raw_message_by_subject(&self.subject).await {
                        Ok(last) if message_id(&last) == Some(id) => return Ok(last.sequence),
                        // Still this queue's previous message: a conflict with it being
                        // applied (10164, common while a Raft leader moves), not a fence. Sent
                        // again, soon at first, then every 50 ms until the give-up below.
                        Ok(last) if last.sequence == expected => {
                            conflicts += 1;
                            if conflicts < CONFLICT_RETRIES {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                continue;
                            }
                            "the subject's last message is still this node's".to_string()
                        }
                        // The subject ends before the message this publish follows, which was
                        // acknowledged: the log lost it (a purge never takes the last one).
                        Ok(last) if last.sequence < expected => {
                            return Err(self.lost(expected, last.sequence));
                        }
                        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                            return Err(self.lost(expected, 0));
                        }
                        Ok(last) => {
                            return Err(StorageError::unavailable(format!(
                                "partition {}: another owner has taken over its log (its last message, at stream sequence {}, is not this node's); this node no longer serves it",
                                self.partition, last.sequence
                            )));
                        }
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            };
            let stalls = {
                let mut q = self.queue.lock();
                if q.closed || q.failed.is_some() || q.generation != generation {
                    return Err(q.failed.clone().unwrap_or_else(|| {
                        StorageError::outcome_unknown("the node stopped publishing")
                    }));
                }
                let stalls = q.stalled.is_none() && started.elapsed() > GIVE_UP_AFTER;
                if stalls {
                    q.stalled = Some(StorageError::outcome_unknown(format!(
                        "partition {}: NATS did not acknowledge a publish of its log within {} s ({why}); the commit may or may not be in the log",
                        self.partition,
                        GIVE_UP_AFTER.as_secs()
                    )));
                }
                stalls
            };
            if stalls {
                self.progress.send_replace(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl PublishQueue {
    /// The partition's log lost this owner's acknowledged message at stream sequence
    /// `expected` (it ends at `end`): marked, and the error its waiting commits fail with.
    fn lost(&self, expected: u64, end: u64) -> StorageError {
        self.queue.lock().log_lost = true;
        StorageError::outcome_unknown(format!(
            "partition {}: its log on NATS ends at stream sequence {end}, before this owner's acknowledged message at {expected}; the partition stops until its log is repaired",
            self.partition
        ))
    }
}

/// Publishes `snapshot` (this owner's copy of `partition`, at epoch `epoch`) at the end of
/// the partition's log, whatever the log's last message is, and returns where the log ends
/// after it and the stream sequence of its first part: the re-base of a log that lost or
/// damaged acknowledged messages onto the owner's copy (docs/cluster.md, "Repair"). The caller
/// purges the log below that part, so that every node loads the snapshot. Fenced like any
/// publish: refused if another message lands first.
pub async fn rebase(
    js: &Context,
    stream: &Stream,
    (partition, epoch, watermark): (u32, u64, u64),
    (snapshot, epochs): (&ShardSnapshot, &Epochs),
) -> Result<(LogPosition, u64), TakeoverError> {
    // The log's end as it is, a damaged message included (its link is not known: the
    // snapshot does not continue it, and every node loads it as the log's start).
    let (mut subject_seq, mut previous) = match log_end(stream, partition).await {
        // A later owner wrote: this owner's lease is gone, and its copy is not the history.
        Ok(end) if end.epoch > epoch => {
            return Err(TakeoverError::Superseded {
                log_epoch: end.epoch,
                epoch,
            });
        }
        Ok(end) => (end.subject_seq, end.link),
        Err(TakeoverError::Unreadable { subject_seq, .. }) => (subject_seq, 0),
        Err(e) => return Err(e),
    };
    let (encoded, epochs) = (snapshot.clone(), epochs.clone());
    let parts =
        tokio::task::spawn_blocking(move || snapshot::split(snapshot::encode(&encoded, &epochs)))
            .await
            .map_err(|e| {
                TakeoverError::Unavailable(format!("the snapshot was not encoded: {e}"))
            })?;
    let n = parts.len() as u32;
    let mut first = None;
    for (i, bytes) in parts.into_iter().enumerate() {
        let message = LogMessage {
            kind: MessageKind::Snapshot {
                part: i as u32,
                parts: n,
                bytes,
            },
            partition,
            epoch,
            after: snapshot.seq,
            previous_link: previous,
            watermark,
            catalog_seq: 0,
            versions_below: snapshot.versions_below,
            records: Vec::new(),
            remembered: Vec::new(),
        }
        .encode();
        let publish = PublishMessage::build()
            .payload(Bytes::from(encode_frame(&[&message])))
            .expected_last_subject_sequence(subject_seq)
            .message_id(format!("{partition}:{epoch}:rebase:{subject_seq}"));
        let ack = js
            .send_publish(subject(partition), publish)
            .await
            .map_err(|e| TakeoverError::Unavailable(e.to_string()))?;
        let ack = match tokio::time::timeout(ACK_TIMEOUT, ack.into_future()).await {
            Ok(Ok(ack)) => ack,
            Ok(Err(e)) if refused_expectation(&e) => return Err(TakeoverError::Raced),
            Ok(Err(e)) => return Err(TakeoverError::Unavailable(e.to_string())),
            Err(_) => {
                return Err(TakeoverError::Unavailable(
                    "no acknowledgement of the re-base".into(),
                ));
            }
        };
        subject_seq = ack.sequence;
        first.get_or_insert(subject_seq);
        previous = link(previous, &message);
    }
    Ok((
        LogPosition {
            subject_seq,
            last: snapshot.seq,
            link: previous,
            epoch,
        },
        first.expect("a snapshot has a part"),
    ))
}

/// Whether a publish was refused for its expected sequence: error 10071, or 10164, which
/// async-nats reports as another error (see `docs/cluster.md`, "Streams").
fn refused_expectation(e: &jetstream::context::PublishError) -> bool {
    e.kind() == PublishErrorKind::WrongLastSequence || format!("{e:?}").contains("10164")
}

fn message_id(message: &jetstream::message::StreamMessage) -> Option<&str> {
    message
        .headers
        .get(async_nats::header::NATS_MESSAGE_ID)
        .map(|v| v.as_str())
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
