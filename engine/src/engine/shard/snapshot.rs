//! A shard's state at one log position, taken by its owner and loaded by a node that lacks the
//! log before it (cluster mode: docs/cluster.md, "Snapshots and retention"). A snapshot holds
//! every document not known dead, each as the record of its latest write (at its own
//! position), and the requests remembered by idempotency key; what is derived (index entries,
//! expiry tracking) is recomputed on load, as a follower recomputes it from the log.
//!
//! Loading makes a following shard's documents the snapshot's: documents it holds at another
//! version are written over, those the snapshot lacks are removed, and its log position moves
//! to the snapshot's. The change log before that position is not carried: a feed reader on
//! this node whose position is below it is told it is behind retention.

use std::sync::atomic::Ordering;

use std::collections::HashSet;

use super::{
    Change, GivenLog, RemoveCause, Shard,
    replicated::{Indexing, remembered},
};
use crate::engine::{
    CollectionUid, Millis,
    change_feed::{ChangeOp, ChangeRecord},
    clock::Clock,
    error::Error,
};
use crate::storage::{DocKey, LogRecord, RequestRecord, StorageError};

/// A shard's documents and remembered requests at log position `seq`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardSnapshot {
    /// The log position it reflects: every record up to it, none after.
    pub seq: u64,
    /// Every version handed out is below this.
    pub versions_below: u64,
    /// The shard's time when it was taken: a shard loading it starts at least there.
    pub time: Millis,
    /// Every document not known dead, as the record of its latest write (at its position,
    /// which later records name as their `previous`), in log order.
    pub documents: Vec<(CollectionUid, LogRecord)>,
    /// Requests remembered by idempotency key (`key.id` is the key), not past their window.
    pub remembered: Vec<(CollectionUid, DocKey, RequestRecord)>,
}

impl Shard {
    /// This shard's snapshot, taken under its lock, and `then` called with it in the same
    /// hold: a publish queue that takes it there orders it among the shard's commits.
    pub(crate) fn snapshot<R>(
        &self,
        clock: &dyn Clock,
        then: impl FnOnce(ShardSnapshot) -> R,
    ) -> Result<R, Error> {
        let mut st = self.lock();
        let time = st.now(clock);
        let mut documents = Vec::with_capacity(st.docs.len());
        for cs in st.collections.values() {
            for &slot in cs.index.values() {
                let meta = st.docs.get(slot);
                if meta.dead || meta.purged {
                    continue;
                }
                let stored = self
                    .store
                    .get(cs.uid, &meta.key)
                    .map_err(Error::Storage)?
                    .ok_or_else(|| {
                        Error::Storage(StorageError::new(format!(
                            "document {:?} is in memory but not in storage",
                            meta.key.id.as_str()
                        )))
                    })?;
                let record = ChangeRecord {
                    op: ChangeOp::Create,
                    crts: meta.last_write,
                    logged_at: meta.last_write,
                    version: meta.version,
                    previous: meta.seq,
                    ttl: meta.ttl,
                    key: meta.key.clone(),
                    body: Some(stored.body.clone()),
                };
                documents.push((meta.seq, cs.uid, record.log_record()));
            }
        }
        // Log order: a collection's inheriting documents go back into its queue in write order.
        documents.sort_by_key(|(seq, _, _)| *seq);
        let snapshot = ShardSnapshot {
            seq: st.log_seq,
            versions_below: self.versions.load(Ordering::SeqCst),
            time,
            documents: documents
                .into_iter()
                .map(|(_, collection, record)| (collection, record))
                .collect(),
            remembered: st.requests.live(time),
        };
        Ok(then(snapshot))
    }

    /// Makes this following shard's documents `snapshot`'s, and its log position the
    /// snapshot's (see the module's note). Refuses, changing nothing, a snapshot behind this
    /// shard's log, or one naming a collection this node does not have (its catalog is
    /// behind). `handed_out`: the highest uid the catalog has handed out (a collection at or
    /// below it that the shard lacks was deleted since: its documents are passed over).
    pub(crate) fn load_snapshot(
        &self,
        snapshot: &ShardSnapshot,
        handed_out: u64,
    ) -> Result<(), Error> {
        let decoded: Vec<(CollectionUid, ChangeRecord)> = snapshot
            .documents
            .iter()
            .map(|(c, r)| Ok((*c, ChangeRecord::decode_log(r).map_err(Error::Storage)?)))
            .collect::<Result<_, Error>>()?;
        if let Some((_, r)) = decoded.iter().find(|(_, r)| r.body.is_none()) {
            return Err(Error::Storage(StorageError::new(format!(
                "the snapshot's document {:?} has no body",
                r.key.id.as_str()
            ))));
        }
        let policies = {
            let st = self.lock();
            decoded
                .iter()
                .filter_map(|(c, _)| Some((*c, Indexing::of(st.collections.get(c)?))))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let mut terms = Vec::with_capacity(decoded.len());
        for (c, record) in &decoded {
            terms.push(match policies.get(c) {
                Some(indexing) => indexing.terms(record)?,
                None => None,
            });
        }
        let mut state = self.lock();
        let st = &mut *state;
        if !st.following {
            return Err(Error::Storage(StorageError::new(
                "a snapshot is loaded only into a shard that follows its owner",
            )));
        }
        if snapshot.seq < st.log_seq {
            return Err(Error::Storage(StorageError::new(format!(
                "a snapshot at log position {} is behind this copy, at {}",
                snapshot.seq, st.log_seq
            ))));
        }
        let mut changes = Vec::new();
        let mut seqs = Vec::new();
        let mut kept: HashSet<(CollectionUid, &DocKey)> = HashSet::new();
        for ((collection, record), terms) in decoded.iter().zip(terms) {
            let Some(cs) = st.collections.get(collection) else {
                if collection.0 <= handed_out {
                    continue;
                }
                return Err(unknown_collection(*collection));
            };
            if !kept.insert((*collection, &record.key)) {
                return Err(Error::Storage(StorageError::new(format!(
                    "the snapshot names document {:?} twice",
                    record.key.id.as_str()
                ))));
            }
            // Held at this very version already: nothing to write.
            if let Some(&slot) = cs.index.get(&record.key) {
                let meta = st.docs.get(slot);
                if !meta.dead && meta.version == record.version {
                    continue;
                }
            }
            let now = Indexing::of(cs);
            let terms = match policies.get(collection) {
                Some(used) if used.same(&now) => terms,
                _ => now.terms(record)?,
            };
            // The document keeps its position: later records name it as their `previous`.
            let seq = record.previous;
            changes.push(self.change_of(st, *collection, record, seq, terms)?);
            seqs.push(seq);
        }
        // What this copy holds and the snapshot does not: gone at the snapshot's position.
        for cs in st.collections.values() {
            for (key, &slot) in &cs.index {
                let meta = st.docs.get(slot);
                if meta.dead || meta.purged || kept.contains(&(cs.uid, key)) {
                    continue;
                }
                let terms = if meta.indexed {
                    self.stored_terms_of(cs.uid, key)?
                } else {
                    Vec::new()
                };
                changes.push(Change::Remove {
                    slot,
                    cause: RemoveCause::Deleted,
                    terms,
                });
                seqs.push(0);
            }
        }
        for change in remembered(st, &snapshot.remembered, handed_out)? {
            changes.push(change);
            seqs.push(0);
        }
        self.versions
            .fetch_max(snapshot.versions_below, Ordering::SeqCst);
        st.advance_to(snapshot.time);
        let given = GivenLog {
            last: snapshot.seq,
            records: Vec::new(),
            seqs,
            expired: Vec::new(),
        };
        self.commit_given(st, &changes, given)?;
        // The change log before the snapshot is not this copy's: readers below it are behind.
        self.history_from
            .fetch_max(snapshot.seq + 1, Ordering::AcqRel);
        drop(state);
        let uids: Vec<_> = self.lock().collections.keys().copied().collect();
        for uid in uids {
            while self
                .store
                .change_log()
                .trim_log(uid, snapshot.seq + 1, 10_000)
                .map_err(Error::Storage)?
                > 0
            {}
        }
        Ok(())
    }
}

fn unknown_collection(uid: CollectionUid) -> Error {
    Error::Storage(StorageError::new(format!(
        "the snapshot names collection uid {}, which this node does not have (its catalog is behind)",
        uid.0
    )))
}
