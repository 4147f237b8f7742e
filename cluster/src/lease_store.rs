//! Partition leases in a JetStream KV bucket (`docs/cluster.md`, "Leases and fencing"): one key
//! per partition holding its owner, epoch and `lease_until` (the owner's wall clock at renewal
//! plus a lease: the largest clock reading it may serve by). Compare-and-set on the key's
//! revision is the only way to change it; [`LeaseTiming`] decides when an owner stops serving
//! and when a contender may take over.

use std::{fmt, time::Duration};

use async_nats::jetstream::{
    self,
    kv::{self, CreateErrorKind, UpdateErrorKind},
    stream::LastRawMessageErrorKind,
};
use bytes::Bytes;

use crate::{
    assignment::NodeId,
    lease::{LeaseTiming, OwnerLease},
};

/// The bucket's name.
pub const BUCKET: &str = "mayfly-partitions";

/// What a partition's key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub owner: NodeId,
    /// The lease's generation: one more at each change of owner.
    pub epoch: u64,
    /// The owner's wall clock at its last renewal plus a lease (Unix ms).
    pub lease_until: u64,
    /// Handed over by the previous owner, which has stopped serving, and not taken yet: the
    /// node it names takes it at once, without waiting for a lapse.
    pub handed: bool,
}

impl LeaseRecord {
    fn encode(&self) -> Bytes {
        let handed = if self.handed { " handed" } else { "" };
        format!("{} {} {}{handed}", self.epoch, self.lease_until, self.owner).into()
    }

    fn decode(bytes: &[u8]) -> Result<Self, LeaseError> {
        let bad = || LeaseError::Corrupt(String::from_utf8_lossy(bytes).into_owned());
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let mut parts = text.split(' ');
        let epoch = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let lease_until = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let owner = parts.next().filter(|o| !o.is_empty()).ok_or_else(bad)?;
        let handed = match parts.next() {
            None => false,
            Some("handed") => true,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(LeaseRecord {
            owner: owner.to_string(),
            epoch,
            lease_until,
            handed,
        })
    }
}

/// Why a lease operation did not answer.
#[derive(Debug)]
pub enum LeaseError {
    /// NATS did not answer, or answered with an error: the outcome of a write is unknown.
    Nats(String),
    /// A key holds something that is not a lease record.
    Corrupt(String),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Nats(e) => write!(f, "the lease store did not answer: {e}"),
            LeaseError::Corrupt(v) => write!(f, "a partition key holds no lease record: {v:?}"),
        }
    }
}

impl std::error::Error for LeaseError {}

fn nats(e: impl fmt::Display) -> LeaseError {
    LeaseError::Nats(e.to_string())
}

/// Clocks a node reads: monotonic for lease timing, wall for `lease_until`.
pub trait Clocks: Send + Sync {
    /// Milliseconds on a clock that never goes back and keeps counting while the process is
    /// stopped.
    fn monotonic_ms(&self) -> u64;
    /// Unix milliseconds.
    fn wall_ms(&self) -> u64;
}

/// The system's clocks: `CLOCK_BOOTTIME` for lease timing (monotonic, and unlike
/// `CLOCK_MONOTONIC` it counts on while the machine is suspended, so an owner that resumes
/// knows its lease ran out), and the wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClocks;

impl Clocks for SystemClocks {
    fn monotonic_ms(&self) -> u64 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        t.tv_sec as u64 * 1_000 + t.tv_nsec as u64 / 1_000_000
    }

    fn wall_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A lease this node holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub partition: u32,
    pub epoch: u64,
    revision: u64,
    lease: OwnerLease,
    /// The `lease_until` of the record this node's last confirmed write put in the key: the
    /// latest wall clock reading it may act on (a later, unconfirmed write may only raise it).
    lease_until: u64,
    /// The `lease_until` of the record the acquiring write replaced (0: the key was free).
    replaced_until: u64,
    /// Its previous owner handed it to this node (rather than letting it lapse).
    handed: bool,
}

impl Held {
    /// The largest wall clock reading (Unix ms) the partition's shard may act on: what the
    /// next owner will start its time from.
    pub fn time_cap(&self) -> u64 {
        self.lease_until
    }

    /// The previous owner's last `lease_until`: the latest wall clock reading it could have
    /// acted on, where this owner's time starts.
    pub fn replaced_until(&self) -> u64 {
        self.replaced_until
    }

    /// Whether the previous owner handed the lease to this node.
    pub fn was_handed(&self) -> bool {
        self.handed
    }

    /// Until when (monotonic ms, exclusive) the partition may be served; `None`: no longer.
    pub fn serves_until(&self) -> Option<u64> {
        self.lease.serves_until()
    }

    /// Whether the partition may be served now.
    pub fn serves(&self, clocks: &dyn Clocks) -> bool {
        self.lease.serves(clocks.monotonic_ms())
    }
}

/// What a contender has seen of a partition's key: its revision, and when (monotonic) it was
/// first seen at that revision.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    seen: Option<(u64, u64)>,
    /// How much longer than a lease this contender waits: a node that is not the partition's
    /// first standby lets the standby, whose copy is caught up, take it first.
    patience_ms: u64,
}

impl Watch {
    /// Waits `extra_ms` longer than a lease before taking a lapsed partition.
    pub fn set_patience(&mut self, extra_ms: u64) {
        self.patience_ms = extra_ms;
    }
}

/// The partitions' leases.
#[derive(Clone)]
pub struct Leases {
    kv: kv::Store,
    timing: LeaseTiming,
}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases")
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// Opens (or creates) the bucket, replicated on `replicas` servers.
    pub async fn open(
        js: &jetstream::Context,
        replicas: usize,
        timing: LeaseTiming,
    ) -> Result<Self, LeaseError> {
        let kv = js
            .create_key_value(kv::Config {
                bucket: BUCKET.to_string(),
                history: 1,
                num_replicas: replicas,
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(nats)?;
        Ok(Leases { kv, timing })
    }

    fn key(partition: u32) -> String {
        format!("p.{partition}")
    }

    /// The record of a partition's lease and its revision, if any, as the bucket's stream
    /// leader has it: a KV read may be answered by any replica, one that lags included, which
    /// must not tell an owner that a key another node has taken is still its own.
    pub async fn read(&self, partition: u32) -> Result<Option<(LeaseRecord, u64)>, LeaseError> {
        let subject = format!("$KV.{BUCKET}.{}", Self::key(partition));
        match self
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => {
                // A delete or purge marker: no lease.
                if message.headers.get("KV-Operation").is_some() {
                    return Ok(None);
                }
                Ok(Some((
                    LeaseRecord::decode(&message.payload)?,
                    message.sequence,
                )))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(nats(e)),
        }
    }

    /// Takes `partition` for `node` if nobody holds it, or if its holder has not renewed it for
    /// a whole lease since `watch` first saw its current revision. `None`: not now (it is held,
    /// or another contender was faster).
    pub async fn try_acquire(
        &self,
        partition: u32,
        node: &str,
        watch: &mut Watch,
        clocks: &dyn Clocks,
    ) -> Result<Option<Held>, LeaseError> {
        let current = self.read(partition).await?;
        let mut lease = OwnerLease::new(self.timing);
        let record = |epoch| LeaseRecord {
            owner: node.to_string(),
            epoch,
            lease_until: clocks.wall_ms() + self.timing.length_ms,
            handed: false,
        };
        let Some((held_by, revision)) = current else {
            lease.sending(clocks.monotonic_ms());
            let record = record(1);
            return match self.kv.create(Self::key(partition), record.encode()).await {
                Ok(revision) => {
                    lease.confirmed();
                    Ok(Some(Held {
                        partition,
                        epoch: 1,
                        revision,
                        lease,
                        lease_until: record.lease_until,
                        replaced_until: 0,
                        handed: false,
                    }))
                }
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists || wrong_revision(&e) => {
                    Ok(None)
                }
                Err(e) => Err(nats(e)),
            };
        };
        let now = clocks.monotonic_ms();
        let first_seen = match watch.seen {
            Some((seen, at)) if seen == revision => at,
            _ => {
                watch.seen = Some((revision, now));
                now
            }
        };
        // Handed to this node: its previous owner stopped serving before it wrote the key, so
        // it is taken at once, at the epoch the handover gave it.
        let handed_here = held_by.handed && held_by.owner == node;
        if !handed_here && now < self.timing.lapsed_at(first_seen) + watch.patience_ms {
            return Ok(None);
        }
        let epoch = if handed_here {
            held_by.epoch
        } else {
            held_by.epoch + 1
        };
        lease.sending(clocks.monotonic_ms());
        let mut record = record(epoch);
        // Never below the replaced one's: the cap on this owner's time starts above the
        // floor it takes over.
        record.lease_until = record.lease_until.max(held_by.lease_until);
        match self
            .kv
            .update(Self::key(partition), record.encode(), revision)
            .await
        {
            Ok(revision) => {
                lease.confirmed();
                Ok(Some(Held {
                    partition,
                    epoch,
                    revision,
                    lease,
                    lease_until: record.lease_until,
                    replaced_until: held_by.lease_until,
                    handed: handed_here,
                }))
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || wrong_revision(&e) => {
                Ok(None)
            }
            Err(e) => Err(nats(e)),
        }
    }

    /// Renews a held lease. `false`: another node holds it now (the partition must not be
    /// served any more). An error leaves the lease to lapse by itself if renewals keep failing.
    pub async fn renew(
        &self,
        held: &mut Held,
        node: &str,
        clocks: &dyn Clocks,
    ) -> Result<bool, LeaseError> {
        // The monotonic reading first: the lease counts from before the wall reading it sends.
        held.lease.sending(clocks.monotonic_ms());
        let record = LeaseRecord {
            owner: node.to_string(),
            epoch: held.epoch,
            // Never below a value written before, though the wall clock step back: the shard
            // may have acted on times up to it.
            lease_until: (clocks.wall_ms() + self.timing.length_ms).max(held.lease_until),
            handed: false,
        };
        match self
            .kv
            .update(Self::key(held.partition), record.encode(), held.revision)
            .await
        {
            Ok(revision) => {
                held.revision = revision;
                held.lease.confirmed();
                held.lease_until = record.lease_until;
                Ok(true)
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || wrong_revision(&e) => {
                // A refusal, or the server's conflict with a write of the key still being
                // applied (error 10164 says both). Still ours only if the leader holds this
                // node at this epoch at a later revision than the last one confirmed: an
                // earlier try whose answer was lost was applied.
                match self.read(held.partition).await? {
                    Some((r, revision))
                        if r.owner == node && r.epoch == held.epoch && revision > held.revision =>
                    {
                        held.revision = revision;
                        held.lease.confirmed();
                        held.lease_until = held.lease_until.max(r.lease_until);
                        Ok(true)
                    }
                    _ => {
                        held.lease.lost();
                        Ok(false)
                    }
                }
            }
            Err(e) => Err(nats(e)),
        }
    }
}

impl Leases {
    /// Hands a held lease to `to` (a planned handover, docs/cluster.md "Leases and fencing"):
    /// the caller has stopped serving the partition and stopped renewing, and every commit it
    /// made is on the log. The key names `to` at the next epoch, marked handed, so that `to`
    /// takes it at once; its `lease_until` stays, the time the next owner starts from.
    /// `false`: the key is not this node's at this epoch any more (it lapsed and was taken).
    pub async fn hand_over(&self, held: &Held, node: &str, to: &str) -> Result<bool, LeaseError> {
        let record = LeaseRecord {
            owner: to.to_string(),
            epoch: held.epoch + 1,
            lease_until: held.lease_until,
            handed: true,
        };
        // The revision this node last wrote, or a later one of its own (a renewal whose answer
        // was lost).
        let revision = match self.read(held.partition).await? {
            Some((r, revision)) if r.owner == node && r.epoch == held.epoch && !r.handed => {
                revision
            }
            _ => return Ok(false),
        };
        match self
            .kv
            .update(Self::key(held.partition), record.encode(), revision)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || wrong_revision(&e) => {
                // Applied after all (an answer lost), or taken by another node.
                Ok(matches!(
                    self.read(held.partition).await?,
                    Some((r, _)) if r == record
                ))
            }
            Err(e) => Err(nats(e)),
        }
    }
}

impl Leases {
    /// Every partition's lease as it is now, then each change as it happens: (partition, its
    /// record; `None` once deleted). A watch can lag: what it says is a hint for routing, and
    /// decisions that need the truth read the key from the stream leader ([`Leases::read`]).
    pub async fn watch(
        &self,
    ) -> Result<
        impl futures_util::Stream<Item = Result<(u32, Option<LeaseRecord>), LeaseError>> + use<>,
        LeaseError,
    > {
        use futures_util::StreamExt;
        let watch = self.kv.watch_with_history(">").await.map_err(nats)?;
        Ok(watch.map(|entry| {
            let entry = entry.map_err(nats)?;
            let partition = entry
                .key
                .strip_prefix("p.")
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| LeaseError::Corrupt(entry.key.clone()))?;
            let record = match entry.operation {
                kv::Operation::Put => Some(LeaseRecord::decode(&entry.value)?),
                kv::Operation::Delete | kv::Operation::Purge => None,
            };
            Ok((partition, record))
        }))
    }
}

/// How often an owner renews: four times a lease.
pub fn renew_interval(timing: &LeaseTiming) -> Duration {
    Duration::from_millis(timing.length_ms / 4)
}

/// Whether a refused write is JetStream's per-subject "wrong last sequence" without the
/// sequence (error 10164), which async-nats reports as another error: a replicated stream's
/// answer to a lost compare-and-set, or to a write of the key still being applied.
fn wrong_revision(e: &impl fmt::Debug) -> bool {
    format!("{e:?}").contains("10164")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_junk_is_refused() {
        let mut r = LeaseRecord {
            owner: "node-a".into(),
            epoch: 7,
            lease_until: 1_764_000_000_000,
            handed: false,
        };
        assert_eq!(LeaseRecord::decode(&r.encode()).expect("decodes"), r);
        r.handed = true;
        assert_eq!(r.encode(), "7 1764000000000 node-a handed");
        assert_eq!(LeaseRecord::decode(&r.encode()).expect("decodes"), r);
        for junk in [
            "",
            "7",
            "7 8",
            "7 8 ",
            "x 8 a",
            "7 y a",
            "7 8 a b",
            "7 8 a handed x",
        ] {
            assert!(LeaseRecord::decode(junk.as_bytes()).is_err(), "{junk:?}");
        }
    }
}
