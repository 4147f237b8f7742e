//! A node catching up with a partition's log, and becoming its owner (docs/cluster.md,
//! "Standbys and catch-up", "Leases and fencing"): every message after the node's copy is read
//! from the stream in order, checked against the chain of those before it, and applied through
//! the engine; then the node publishes its `takeover` at the log's end, and its shard serves.
//!
//! A node whose copy is behind the log's first message (the owner purged the log below a
//! snapshot) loads the snapshot the log starts with, then applies what follows it.

use std::time::Duration;

use async_nats::jetstream::{
    Context,
    consumer::{DeliverPolicy, pull::OrderedConfig},
    stream::Stream,
};
use futures_util::StreamExt;
use mayfly_engine::{
    engine::{Engine, ReplicatedCommit},
    storage::LogRecord,
};

use crate::{
    chain::{Chain, Divergence},
    copy_state::{self, Kept},
    epochs::Epochs,
    log_message::{LogMessage, MessageKind, decode_frame},
    publish_queue::{LogPosition, PublishQueue, TakeoverError, log_end, subject, take_over},
    snapshot::Assembly,
};

/// How long a log must keep ending below what a copy applied from it before the copy calls it
/// shortened (see [`catch_up`]).
const SHORTENED_FOR: Duration = Duration::from_secs(10);

/// How long a catch-up waits for the next message before asking where the log ends again.
const QUIET: Duration = Duration::from_secs(2);

/// Why a node could not catch up with a partition's log or take it over.
#[derive(Debug)]
pub enum CatchUpError {
    /// The log does not continue the history before it (see [`Divergence`]): the partition
    /// must not be served from it.
    Diverged(Divergence),
    /// The engine refused a commit (its copy does not fit the log, or its catalog is behind).
    Refused(String),
    /// NATS did not answer, or the log moved on while the node took over.
    Takeover(TakeoverError),
    /// The node's lease on the partition ended before it took the partition over.
    LeaseLost,
}

impl std::fmt::Display for CatchUpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatchUpError::Diverged(d) => write!(f, "the log diverged: {d}"),
            CatchUpError::Refused(e) => write!(f, "the engine refused a commit: {e}"),
            CatchUpError::Takeover(e) => write!(f, "{e}"),
            CatchUpError::LeaseLost => f.write_str("the partition's lease ended first"),
        }
    }
}

impl std::error::Error for CatchUpError {}

impl From<TakeoverError> for CatchUpError {
    fn from(e: TakeoverError) -> Self {
        CatchUpError::Takeover(e)
    }
}

/// A partition's log as a node has applied it: the chain of its messages, and the stream
/// sequence of the last one.
#[derive(Debug, Clone)]
pub struct Followed {
    pub chain: Chain,
    /// The owner epochs of the history applied, and where each began.
    pub epochs: Epochs,
    /// The stream sequence of the last message applied whole.
    pub subject_seq: u64,
    /// A message applied part-way (a commit in it refused): its stream sequence, and how many
    /// of its commits were applied.
    partial: Option<(u64, usize)>,
    /// A snapshot being read because the log starts with it, past this copy's end (loaded
    /// once its last part is in), and the stream sequence read up to before it.
    assembly: Option<(Assembly, u64)>,
    /// Where this node knew the log to stand before it rebuilt its copy (its copy's state, or
    /// an owner's replicated mark, kept before a restart): the log must still pass through
    /// it, at that stream sequence, or start with a snapshot that holds it. Cleared once
    /// passed.
    witness: Option<(Chain, u64)>,
}

impl Followed {
    /// Nothing applied yet.
    pub fn new(partition: u32) -> Self {
        Followed {
            chain: Chain::new(partition),
            epochs: Epochs::default(),
            subject_seq: 0,
            partial: None,
            assembly: None,
            witness: None,
        }
    }

    /// A copy that is the log up to `chain`, which ends at stream sequence `subject_seq`: a
    /// node's own copy after a restart ([`crate::copy_state`]).
    pub fn resumed(chain: Chain, subject_seq: u64, epochs: Epochs) -> Self {
        Followed {
            chain,
            epochs,
            subject_seq,
            partial: None,
            assembly: None,
            witness: None,
        }
    }

    /// An empty copy, rebuilt from the log, which must still hold what `known` (this node's
    /// earlier copy, whose state it kept) held of it.
    pub fn rebuilt(known: &Followed) -> Self {
        Followed {
            witness: Some((known.chain, known.subject_seq)),
            ..Followed::new(known.chain.partition)
        }
    }

    /// The chain position and stream sequence this copy must still find in the log.
    pub fn witness(&self) -> Option<(Chain, u64)> {
        self.witness
    }

    /// The history this node knows the log held: what the copy applied, or, while a rebuilt
    /// copy has not yet passed it, what the node knew before. A divergence is found in it.
    pub fn known_chain(&self) -> Chain {
        self.witness.map_or(self.chain, |(known, _)| known)
    }

    /// A copy that is the log up to `position`, whose owner epochs are `epochs`: an owner's
    /// that stopped with every commit acknowledged ([`PublishQueue::stop`]).
    pub fn at(partition: u32, position: &LogPosition, epochs: Epochs) -> Self {
        Followed {
            chain: Chain {
                partition,
                last: position.last,
                link: position.link,
                epoch: position.epoch,
            },
            epochs,
            subject_seq: position.subject_seq,
            partial: None,
            assembly: None,
            witness: None,
        }
    }
}

/// Applies to `engine`'s shard `partition` (following it) every message of the partition's
/// log after `followed`, up to where the log ended when asked.
pub async fn catch_up(
    stream: &Stream,
    engine: &Engine,
    partition: u32,
    followed: &mut Followed,
) -> Result<(), CatchUpError> {
    // Committed messages do not go away (no snapshots purge the log yet): a log ending
    // before what this copy applied from it lost them. Believed only once it has held for
    // [`SHORTENED_FOR`]: a stream leader just elected may answer before it has applied its
    // log, and one cut off from the others may answer until it steps down; a false alarm
    // would stop the partition everywhere until an operator acts.
    // A snapshot read whole whose load was refused (the catalog behind): again.
    load_if_complete(engine, partition, followed).await?;
    // What the log must reach: what this copy applied, or what a copy before it knew.
    let known = followed
        .subject_seq
        .max(followed.witness.map_or(0, |(_, seq)| seq));
    let mut end_seq = read_end(stream, partition).await?;
    let first_short = std::time::Instant::now();
    while end_seq < known && first_short.elapsed() < SHORTENED_FOR {
        tokio::time::sleep(Duration::from_secs(1)).await;
        end_seq = read_end(stream, partition).await?;
    }
    if end_seq < known {
        return Err(CatchUpError::Diverged(Divergence::Shortened {
            applied: known,
            end: end_seq,
        }));
    }
    if end_seq == followed.subject_seq {
        return Ok(());
    }
    let config = OrderedConfig {
        filter_subject: subject(partition),
        deliver_policy: match followed.subject_seq {
            0 => DeliverPolicy::All,
            seq => DeliverPolicy::ByStartSequence {
                start_sequence: seq + 1,
            },
        },
        ..Default::default()
    };
    let unavailable = |e: &dyn std::fmt::Display| TakeoverError::Unavailable(e.to_string());
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(|e| unavailable(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
    while followed.subject_seq < end_seq {
        let message = match tokio::time::timeout(QUIET, messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(e))) => return Err(unavailable(&e).into()),
            Ok(None) | Err(_) => {
                return Err(TakeoverError::Unavailable(format!(
                    "the log of partition {partition} stopped at stream sequence {} before its end at {}",
                    followed.subject_seq, end_seq
                ))
                .into());
            }
        };
        let seq = message.info().map_err(|e| unavailable(&e))?.stream_sequence;
        // Applied already: an ordered consumer recreated before it delivered anything starts
        // again from the stream's first message (async-nats 0.51), not from where it was
        // asked to.
        if seq <= followed.subject_seq {
            continue;
        }
        let parts = decode_frame(&message.payload)
            .map_err(|e| CatchUpError::Diverged(Divergence::Corrupt(e)))?;
        // A frame delivered again after a refusal part-way: its applied messages are skipped.
        let done = match followed.partial {
            Some((at, done)) if at == seq => done,
            _ => 0,
        };
        for (i, part) in parts.into_iter().enumerate().skip(done) {
            if let Some((assembly, _)) = &mut followed.assembly {
                if let Err(d) = assembly.add(&part, seq) {
                    let first = assembly.first_seq;
                    // Purged again while it was read: read again from the log's new start.
                    if log_first(stream, partition).await? > first {
                        let (_, resume_from) = followed.assembly.take().expect("read");
                        followed.subject_seq = resume_from;
                        followed.partial = None;
                        return Err(TakeoverError::Unavailable(format!(
                            "the log of partition {partition} was purged past the snapshot being read; reading the newer one"
                        ))
                        .into());
                    }
                    return Err(CatchUpError::Diverged(d));
                }
                // Marked taken before the load, which a catalog behind may refuse for now.
                followed.partial = Some((seq, i + 1));
                load_if_complete(engine, partition, followed).await?;
                continue;
            }
            let mut next = followed.chain;
            let m = match next.accept(&part) {
                Ok(m) => m,
                // The log starts past this copy with a snapshot: the owner purged what came
                // before it (a snapshot's first part always starts a frame). Anything else
                // that does not continue the history is a divergence.
                Err(d @ (Divergence::Gap { .. } | Divergence::Forked { .. })) if i == 0 => {
                    match Assembly::start(partition, &part, seq) {
                        Some(assembly) if log_first(stream, partition).await? >= seq => {
                            tracing::info!(
                                partition,
                                at = assembly.chain.last,
                                from = followed.chain.last,
                                "the log starts with a snapshot past this copy: loading it"
                            );
                            followed.assembly = Some((assembly, followed.subject_seq));
                            followed.partial = Some((seq, i + 1));
                            load_if_complete(engine, partition, followed).await?;
                            continue;
                        }
                        _ => return Err(CatchUpError::Diverged(d)),
                    }
                }
                Err(d) => return Err(CatchUpError::Diverged(d)),
            };
            // Every time an owner acted on is at or below a watermark it logged since (or
            // its lease's end): this copy's time starts there if it is promoted.
            engine.raise_time(partition as usize, m.watermark);
            let (epoch, after) = (m.epoch, m.after);
            match m.kind {
                MessageKind::Commit => apply(engine, partition, m).await?,
                // A snapshot at this copy's end: it holds what this copy holds.
                MessageKind::Takeover | MessageKind::Snapshot { .. } => {}
            }
            followed.chain = next;
            followed.epochs.note(epoch, after);
            followed.partial = Some((seq, i + 1));
        }
        followed.partial = None;
        followed.subject_seq = seq;
        // Whole frames only, and not while a snapshot is read (the copy is then the log up to
        // its start, or being loaded).
        if followed.assembly.is_none() {
            pass_witness(followed, seq)?;
            // Until a rebuilt copy has passed what the node knew, the state kept is that.
            if followed.witness.is_none() {
                copy_state::save(engine, partition, Kept::At, followed);
            }
        }
    }
    // What was applied, and the state saying so, made durable together (a node killed later
    // resumes from there, and finds a log that lost any of it).
    engine
        .flush_shard(partition as usize)
        .await
        .map_err(|e| CatchUpError::Refused(e.to_string()))?;
    Ok(())
}

/// Checks a rebuilt copy against what the node knew of the log before (see
/// [`Followed::witness`]) once it has applied the frame at stream sequence `seq`: the frame at
/// the witness's sequence must end the chain where the witness did, and must not be missing.
fn pass_witness(followed: &mut Followed, seq: u64) -> Result<(), CatchUpError> {
    let Some((known, known_seq)) = followed.witness else {
        return Ok(());
    };
    if seq < known_seq {
        return Ok(());
    }
    // Kept on a divergence: the alarm names the history the node knew.
    if seq > known_seq {
        return Err(CatchUpError::Diverged(Divergence::Missing {
            subject_seq: known_seq,
            last: known.last,
        }));
    }
    if (followed.chain.last, followed.chain.link) != (known.last, known.link) {
        return Err(CatchUpError::Diverged(Divergence::Forked {
            at: known.last,
        }));
    }
    followed.witness = None;
    Ok(())
}

/// The stream sequence of the partition's first message (`u64::MAX`: none): below it, the
/// owner purged the log. Asked of the stream leader.
async fn log_first(stream: &Stream, partition: u32) -> Result<u64, CatchUpError> {
    match stream
        .get_first_raw_message_by_subject(subject(partition), 1)
        .await
    {
        Ok(first) => Ok(first.sequence),
        Err(e)
            if e.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
        {
            Ok(u64::MAX)
        }
        Err(e) => Err(TakeoverError::Unavailable(e.to_string()).into()),
    }
}

/// Loads the snapshot `followed` has read whole, if it has, into the engine; this copy is the
/// log up to the snapshot's last part from then on.
async fn load_if_complete(
    engine: &Engine,
    partition: u32,
    followed: &mut Followed,
) -> Result<(), CatchUpError> {
    let Some((assembly, _)) = followed.assembly.as_mut().filter(|(a, _)| a.complete()) else {
        return Ok(());
    };
    let (snapshot, epochs) = assembly.snapshot().map_err(CatchUpError::Diverged)?;
    // A copy behind the log's start must be a prefix of the log's history, which the
    // snapshot's epoch table describes: a copy ending in an epoch that the history ended
    // earlier holds writes the log lost (found as a rewind had the log not been purged).
    let mut checked = epochs.check_prefix(followed.chain.last, followed.chain.epoch);
    // What the node knew of the log before it rebuilt this copy: a snapshot at or past its
    // stream sequence must hold it (the log before it is purged); one before it is loaded, and
    // the log after it must pass through it.
    let mut passed = false;
    if let (Ok(()), Some((known, known_seq))) = (&checked, followed.witness)
        && assembly.subject_seq >= known_seq
    {
        checked = if snapshot.seq < known.last {
            Err(Divergence::Shortened {
                applied: known.last,
                end: snapshot.seq,
            })
        } else {
            epochs.check_prefix(known.last, known.epoch)
        };
        passed = true;
    }
    if let Err(d) = checked {
        assembly.keep((snapshot, epochs));
        return Err(CatchUpError::Diverged(d));
    }
    let (documents, at) = (snapshot.documents.len(), snapshot.seq);
    // Until the frame that ends the snapshot is applied: the copy is a mix if cut off.
    let known = match followed.witness {
        Some((chain, seq)) => Followed::resumed(chain, seq, Epochs::default()),
        None => Followed::resumed(
            followed.chain,
            followed.subject_seq,
            followed.epochs.clone(),
        ),
    };
    copy_state::save(engine, partition, Kept::Loading, &known);
    let loader = engine.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        loader.raise_time(partition as usize, snapshot.time);
        let loaded = loader.load_snapshot(partition as usize, &snapshot);
        (loaded, snapshot)
    })
    .await;
    match loaded {
        Ok((Ok(()), _)) => {}
        Ok((Err(e), snapshot)) => {
            assembly.keep((snapshot, epochs));
            return Err(CatchUpError::Refused(e.to_string()));
        }
        Err(e) => {
            // The assembly's bytes went with the task: read the snapshot again.
            let (_, resume_from) = followed.assembly.take().expect("read");
            followed.subject_seq = resume_from;
            followed.partial = None;
            return Err(CatchUpError::Refused(format!("the load task failed: {e}")));
        }
    }
    tracing::info!(partition, at, documents, "loaded the partition's snapshot");
    followed.chain = assembly.chain;
    followed.epochs = epochs;
    followed.assembly = None;
    if passed {
        followed.witness = None;
    }
    Ok(())
}

/// The stream sequence of the partition's last message. A damaged last message still counts:
/// the catch-up reads up to it, and the chain's check says how the log diverged.
async fn read_end(stream: &Stream, partition: u32) -> Result<u64, CatchUpError> {
    match log_end(stream, partition).await {
        Ok(end) => Ok(end.subject_seq),
        Err(TakeoverError::Unreadable { subject_seq, .. }) => Ok(subject_seq),
        Err(e) => Err(e.into()),
    }
}

/// Applies one commit to the engine, off the async workers (it writes storage).
async fn apply(engine: &Engine, partition: u32, m: LogMessage) -> Result<(), CatchUpError> {
    let engine = engine.clone();
    let applied = tokio::task::spawn_blocking(move || {
        let records: Vec<_> = m
            .records
            .iter()
            .map(|(c, bytes)| (*c, LogRecord::whole(bytes.clone())))
            .collect();
        let remembered: Vec<_> = m
            .remembered
            .iter()
            .map(|r| (r.collection, r.key.clone(), r.record))
            .collect();
        engine.apply_replicated(
            partition as usize,
            ReplicatedCommit {
                after: m.after,
                records: &records,
                remembered: &remembered,
                versions_below: m.versions_below,
            },
        )
    })
    .await;
    match applied {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(CatchUpError::Refused(e.to_string())),
        Err(e) => Err(CatchUpError::Refused(format!("the apply task failed: {e}"))),
    }
}

/// Makes this node the owner of `engine`'s shard `partition` at `epoch` (or above the log's
/// last): catches up with the log, publishes the `takeover` at its end, starts `queue`'s
/// publisher and promotes the shard. Returns where the log ends.
///
/// `floor`: the `lease_until` of the lease this node's replaced (0 if none), the latest wall
/// clock reading the previous owner could have acted on. The shard's time starts at least
/// there, and at the log's last watermark, and the takeover logs it as its watermark, so that
/// a document any earlier owner may have reported expired is expired here too, even with this
/// node's clock behind theirs (docs/cluster.md, "Expiry across owners").
pub async fn become_owner(
    js: &Context,
    stream: &Stream,
    engine: &Engine,
    (queue, partition, epoch, floor): (&std::sync::Arc<PublishQueue>, u32, u64, u64),
    (followed, held): (&mut Followed, &(dyn Fn() -> bool + Sync)),
) -> Result<LogPosition, CatchUpError> {
    engine.set_following(partition as usize, true);
    loop {
        catch_up(stream, engine, partition, followed).await?;
        // A lease lost during the catch-up: no takeover, which would fence the new owner.
        if !held() {
            return Err(CatchUpError::LeaseLost);
        }
        engine.raise_time(partition as usize, floor);
        let watermark = engine.shard_time(partition as usize);
        match take_over(
            js,
            stream,
            partition,
            (epoch, watermark),
            engine.log_end(partition as usize),
        )
        .await
        {
            Ok(position) => {
                // This epoch begins at the takeover (a no-op for one stored already).
                followed.epochs.note(position.epoch, position.last);
                // The copy is the log up to the takeover; its commits from here on are ahead
                // of this state until it stops owning cleanly.
                copy_state::save(
                    engine,
                    partition,
                    Kept::At,
                    &Followed::at(partition, &position, followed.epochs.clone()),
                );
                let generation = queue.start(&position, watermark, followed.epochs.clone());
                tokio::spawn(queue.clone().publish(
                    js.clone(),
                    stream.clone(),
                    (position, generation),
                ));
                // Serving is bounded by the lease end the engine was given; promoted only
                // while the lease is still this node's.
                if held() {
                    engine.set_following(partition as usize, false);
                }
                return Ok(position);
            }
            // The old owner wrote meanwhile: read on, and try again.
            Err(TakeoverError::Raced) => continue,
            Err(TakeoverError::NotCaughtUp {
                log_last,
                local_last,
            }) if log_last > local_last => continue,
            // This copy holds commits the log does not: never acknowledged to anyone, but
            // cutting them off is not built yet (docs/cluster.md, "Write path", 5).
            Err(e) => return Err(e.into()),
        }
    }
}
