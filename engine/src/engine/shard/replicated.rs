//! A follower's side of cluster mode (docs/cluster.md, "Standbys and catch-up"): an owner's
//! commit, applied to this shard as the owner made it. Each change log record becomes the change
//! that wrote it (the same version, write instant, ttl and body, at the same log position), so
//! the follower's documents, index entries, expiry tracking and change log are the owner's,
//! and a follower promoted to owner serves and logs on from the same place.
//!
//! A following shard decides nothing by its own clock: its commits drain nothing that is due,
//! and its purge does not run until it is promoted (documents whose expiry a record logged are
//! dead at once, and deleted by the purge after promotion).

use std::sync::{Arc, atomic::Ordering};

use std::collections::HashMap;

use super::{
    Change, CollectionShard, GivenLog, IndexChange, IndexPaths, RemoveCause, Shard, ShardState,
    detach, documents::same_policy,
};
use crate::engine::{
    CollectionUid, Millis,
    change_feed::{ChangeOp, ChangeRecord},
    error::Error,
    index::terms::bounded_document_terms,
};
use crate::storage::{DocKey, LogRecord, Lsn, RequestRecord, StorageError, StoredDocument, Term};

/// One commit of an owner, as its partition's log carries it.
#[derive(Debug, Clone, Copy)]
pub struct ReplicatedCommit<'a> {
    /// The shard's last log position before the commit's records.
    pub after: u64,
    /// Its change log records, by collection, at positions `after + 1` on.
    pub records: &'a [(CollectionUid, LogRecord)],
    /// The requests it remembered by their idempotency keys (`key.id` is the key).
    pub remembered: &'a [(CollectionUid, DocKey, RequestRecord)],
    /// Every version the owner had handed out is below this.
    pub versions_below: u64,
}

impl Shard {
    /// Whether this shard follows an owner elsewhere (see the module's note).
    pub(crate) fn set_following(&self, following: bool) {
        self.lock().following = following;
        if !following {
            // Promoted: what became due while it followed is its purge's now.
            self.wake_purge();
        }
    }

    /// Bounds what this shard serves by its partition lease: nothing from reading `until` of
    /// the engine's lease clock on, and no time past `time_cap`, until a renewal moves them.
    pub(crate) fn serve_until(&self, until: u64, time_cap: Millis) {
        let mut st = self.lock();
        let lapsed = self.not_serving(&st).is_some();
        st.serve_until = Some(until);
        st.time_cap = Some(time_cap);
        let serves = self.not_serving(&st).is_none();
        drop(st);
        if lapsed && serves {
            // Serving again after a lapse: what became due meanwhile is its purge's now.
            self.wake_purge();
        }
    }

    /// Moves this shard's log end forward to `seq` (see `Engine::pass_log_to`).
    pub(crate) fn pass_log_to(&self, seq: u64) {
        let mut st = self.lock();
        st.log_seq = st.log_seq.max(seq);
    }

    /// Moves this shard's time forward to at least `floor` (an earlier owner's time).
    pub(crate) fn raise_time(&self, floor: Millis) {
        self.lock().advance_to(floor);
    }

    /// Marks this shard's partition log as diverged (`Some`: why), or clears the mark.
    /// Newly marked, it is taken to be repairing until [`Shard::set_repairing`] says not.
    pub(crate) fn set_diverged(&self, why: Option<&str>) {
        let mut st = self.lock();
        if st.diverged.is_none() {
            st.repairing = true;
        }
        st.diverged = why.map(std::sync::Arc::from);
    }

    /// Whether its owner may be re-basing its diverged log (see [`Error::LogRepairing`]).
    pub(crate) fn set_repairing(&self, repairing: bool) {
        self.lock().repairing = repairing;
    }

    /// Why its partition's log is marked diverged, if it is.
    pub(crate) fn diverged(&self) -> Option<std::sync::Arc<str>> {
        self.lock().diverged.clone()
    }

    /// Why this shard answers no client now, if it does not: its partition's log diverged, it
    /// follows an owner elsewhere, or its lease has ended. Read under the lock, in the hold
    /// that answers.
    pub(super) fn not_serving(&self, st: &ShardState) -> Option<Error> {
        if let Some(why) = &st.diverged {
            let (partition, why) = (self.index, why.to_string());
            return Some(if st.repairing {
                Error::LogRepairing { partition, why }
            } else {
                Error::LogDiverged { partition, why }
            });
        }
        let lapsed = match (st.serve_until, &self.lease_clock) {
            (None, _) => false,
            (Some(until), Some(clock)) => clock.now_ms() >= until,
            // A lease end without a clock to read it by: nothing can be shown to be in time.
            (Some(_), None) => true,
        };
        (st.following || lapsed).then_some(Error::NotOwner {
            partition: self.index,
        })
    }

    /// [`Shard::not_serving`], taking the lock for it.
    pub(crate) fn check_serving(&self) -> Result<(), Error> {
        match self.not_serving(&self.lock()) {
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// Applies an owner's commit; the position local storage applied it at. Refuses, changing
    /// nothing, a commit that does not start at this shard's log end, names a collection this
    /// node does not have, or does not fit the documents held (a diverged history). Records
    /// are decoded and their index terms computed before the lock is taken.
    /// `handed_out`: the highest uid the catalog has handed out; a record of a collection at
    /// or below it that this shard does not have is of a deleted collection, and passed over.
    pub(crate) fn apply_replicated(
        &self,
        commit: ReplicatedCommit<'_>,
        handed_out: u64,
    ) -> Result<Lsn, Error> {
        let decoded = decode(&commit)?;
        let policies = self.policies(&decoded);
        let terms = new_terms(&decoded, &policies)?;
        let mut state = self.lock();
        let st = &mut *state;
        if commit.after != st.log_seq {
            return Err(diverged(format!(
                "a commit after log position {} where this copy ends at {}",
                commit.after, st.log_seq
            )));
        }
        let mut changes = Vec::with_capacity(decoded.len() + commit.remembered.len());
        let last = commit.after + decoded.len() as u64;
        let mut given = GivenLog {
            last,
            records: Vec::with_capacity(decoded.len()),
            seqs: Vec::new(),
            expired: Vec::new(),
        };
        let mut expiries = Vec::new();
        for (i, ((collection, record), terms)) in decoded.iter().zip(terms).enumerate() {
            let seq = commit.after + 1 + i as u64;
            let Some(cs) = st.collections.get(collection) else {
                if collection.0 <= handed_out {
                    // Deleted since: nothing of it is kept, its position is passed.
                    continue;
                }
                return Err(unknown_collection(*collection));
            };
            // Computed under another policy (a settings change came between): again, here.
            let now = Indexing::of(cs);
            let terms = match policies.get(collection) {
                Some(used) if used.same(&now) => terms,
                _ => now.terms(record)?,
            };
            let change = self.change_of(st, *collection, record, seq, terms)?;
            if let Change::Expire { slot, at } = change {
                given.expired.push((slot, seq));
                expiries.push((slot, seq, at));
            }
            changes.push(change);
            given.seqs.push(seq);
            given
                .records
                .push((*collection, seq, commit.records[i].1.clone()));
        }
        for change in remembered(st, commit.remembered, handed_out)? {
            changes.push(change);
            given.seqs.push(0);
        }
        // Versions are the owner's: none of them is handed out here again after a promotion.
        let floor = decoded
            .iter()
            .map(|(_, r)| r.version.saturating_add(1))
            .fold(commit.versions_below, u64::max);
        self.versions.fetch_max(floor, Ordering::SeqCst);
        // Every record of a deleted collection: the positions are passed, nothing written.
        let lsn = self.commit_given(st, &changes, given)?;
        // A logged expiry is final: dead at once, deleted by the purge once promoted. Unless
        // the same commit wrote the document again (its position moved on).
        for (slot, seq, at) in expiries {
            let r = st.docs.current_ref(slot);
            let meta = st.docs.get(slot);
            if meta.seq != seq || meta.dead {
                continue;
            }
            let cs = st
                .collections
                .get_mut(&meta.collection)
                .expect("checked above");
            detach(&mut st.docs, &mut st.wheel, cs, slot);
            st.docs.get_mut(slot).dead = true;
            st.pending.push_back((r, at));
        }
        Ok(lsn)
    }

    /// Commits `changes` as an owner made them, ending the shard's log at `given.last` (with
    /// no change, only the position moves); where storage applied them.
    pub(super) fn commit_given(
        &self,
        st: &mut ShardState,
        changes: &[Change],
        given: GivenLog,
    ) -> Result<Lsn, Error> {
        let last = given.last;
        if changes.is_empty() {
            st.log_seq = last;
            return Ok(Lsn::ZERO);
        }
        let (_, lsn) = st
            .commit_logged(
                &*self.store,
                changes,
                Some(given),
                (&self.metrics, &self.versions),
            )
            .map_err(Error::Storage)?;
        st.client_lsn = lsn;
        st.log_seq = last;
        Ok(lsn)
    }

    /// How each collection of `decoded` is indexed now.
    fn policies(
        &self,
        decoded: &[(CollectionUid, ChangeRecord)],
    ) -> HashMap<CollectionUid, Indexing> {
        let st = self.lock();
        decoded
            .iter()
            .filter_map(|(c, _)| Some((*c, Indexing::of(st.collections.get(c)?))))
            .collect()
    }

    /// The change that wrote `record` at position `seq`, with `terms` its new index terms
    /// (`None`: the indexer owes them). A commit holds each document once, but for an expiry
    /// logged before the write that re-creates it, which finds the expired version's slot as
    /// the owner did.
    pub(super) fn change_of(
        &self,
        st: &ShardState,
        collection: CollectionUid,
        record: &ChangeRecord,
        seq: u64,
        terms: Option<Vec<Term>>,
    ) -> Result<Change, Error> {
        let cs = st
            .collections
            .get(&collection)
            .ok_or_else(|| unknown_collection(collection))?;
        let slot = cs.index.get(&record.key).copied();
        let held = |slot: Option<u32>| {
            slot.ok_or_else(|| {
                diverged(format!(
                    "position {seq} names document {:?}, which this copy does not hold",
                    record.key.id.as_str()
                ))
            })
        };
        Ok(match record.op {
            ChangeOp::Create | ChangeOp::Replace | ChangeOp::Patch => {
                let body = record
                    .body
                    .clone()
                    .ok_or_else(|| diverged(format!("the write at position {seq} has no body")))?;
                let index = match terms {
                    None => IndexChange::Owed,
                    new => {
                        let old = match slot {
                            Some(s) if st.docs.get(s).indexed => {
                                self.stored_terms_of(collection, &record.key)?
                            }
                            _ => Vec::new(),
                        };
                        IndexChange::Replace(old, new.unwrap_or_default())
                    }
                };
                Change::Put {
                    slot,
                    record: Arc::new(StoredDocument {
                        collection,
                        key: record.key.clone(),
                        body,
                        last_write: record.crts,
                        version: record.version,
                        ttl: record.ttl,
                    }),
                    index,
                    patch: record.op == ChangeOp::Patch,
                }
            }
            ChangeOp::Delete => {
                let slot = held(slot)?;
                let terms = if st.docs.get(slot).indexed {
                    self.stored_terms_of(collection, &record.key)?
                } else {
                    Vec::new()
                };
                Change::Remove {
                    slot,
                    cause: RemoveCause::Deleted,
                    terms,
                }
            }
            ChangeOp::Expire => Change::Expire {
                slot: held(slot)?,
                at: record.crts,
            },
        })
    }

    pub(super) fn stored_terms_of(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Vec<Term>, Error> {
        Ok(self
            .store
            .get_terms(collection, key)
            .map_err(Error::Storage)?
            .map(|t| t.terms)
            .unwrap_or_default())
    }
}

/// The commit's records, decoded. Refuses bytes that are not records, and a document named
/// twice but for an expiry followed by the write that re-creates it (what an owner's commit
/// can hold): applying those would free a slot and then use it.
fn decode(commit: &ReplicatedCommit<'_>) -> Result<Vec<(CollectionUid, ChangeRecord)>, Error> {
    let mut seen: HashMap<(CollectionUid, &DocKey), ChangeOp> = HashMap::new();
    let decoded: Vec<(CollectionUid, ChangeRecord)> = commit
        .records
        .iter()
        .map(|(c, bytes)| Ok((*c, ChangeRecord::decode_log(bytes).map_err(Error::Storage)?)))
        .collect::<Result<_, Error>>()?;
    for (i, (collection, record)) in decoded.iter().enumerate() {
        if record.op.is_write() && record.body.is_none() {
            return Err(diverged(format!(
                "the write at position {} has no body",
                commit.after + 1 + i as u64
            )));
        }
        match seen.insert((*collection, &record.key), record.op) {
            None => {}
            Some(ChangeOp::Expire) if record.op.is_write() => {}
            Some(_) => {
                return Err(diverged(format!(
                    "one commit names document {:?} twice",
                    record.key.id.as_str()
                )));
            }
        }
    }
    Ok(decoded)
}

/// How a collection's writes get their index entries.
#[derive(Debug, Clone)]
pub(super) enum Indexing {
    /// The background indexer owes them (a lazy collection with a policy).
    Owed,
    /// With the write, under this policy (`None`: no entries).
    Eager(Option<Arc<IndexPaths>>),
}

impl Indexing {
    pub(super) fn of(cs: &CollectionShard) -> Self {
        match &cs.policy {
            Some(_) if cs.lazy => Indexing::Owed,
            policy => Indexing::Eager(policy.clone()),
        }
    }

    pub(super) fn same(&self, other: &Indexing) -> bool {
        match (self, other) {
            (Indexing::Owed, Indexing::Owed) => true,
            (Indexing::Eager(a), Indexing::Eager(b)) => same_policy(a.as_ref(), b.as_ref()),
            _ => false,
        }
    }

    /// A record's new terms (`None`: owed, or not a write).
    pub(super) fn terms(&self, record: &ChangeRecord) -> Result<Option<Vec<Term>>, Error> {
        let (Indexing::Eager(policy), Some(body)) = (self, &record.body) else {
            return Ok(None);
        };
        if !record.op.is_write() {
            return Ok(None);
        }
        Ok(Some(match policy {
            Some(policy) => bounded_document_terms(&mayfly_json::decode(body), policy)?,
            None => Vec::new(),
        }))
    }
}

/// The new index terms of each record under `policies` (`None`: owed, or not a write).
fn new_terms(
    decoded: &[(CollectionUid, ChangeRecord)],
    policies: &HashMap<CollectionUid, Indexing>,
) -> Result<Vec<Option<Vec<Term>>>, Error> {
    decoded
        .iter()
        .map(|(c, record)| match policies.get(c) {
            Some(indexing) => indexing.terms(record),
            // Unknown here: refused under the lock.
            None => Ok(None),
        })
        .collect()
}

/// The changes that remember an owner's requests by their idempotency keys; those of a
/// collection deleted since (its uid at or below `handed_out`) are passed over, and one this
/// node does not know yet is refused.
pub(super) fn remembered(
    st: &ShardState,
    requests: &[(CollectionUid, DocKey, RequestRecord)],
    handed_out: u64,
) -> Result<Vec<Change>, Error> {
    let mut out = Vec::with_capacity(requests.len());
    for (collection, key, record) in requests {
        if !st.collections.contains_key(collection) {
            if collection.0 <= handed_out {
                continue;
            }
            return Err(unknown_collection(*collection));
        }
        out.push(Change::Remember {
            collection: *collection,
            scope: key.clone(),
            record: *record,
        });
    }
    Ok(out)
}

fn diverged(what: String) -> Error {
    Error::Storage(StorageError::new(format!(
        "the partition's log does not fit this node's copy: {what}"
    )))
}

fn unknown_collection(uid: CollectionUid) -> Error {
    Error::Storage(StorageError::new(format!(
        "the partition's log names collection uid {}, which this node does not have (its catalog is behind)",
        uid.0
    )))
}
