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

use super::{Change, GivenLog, IndexChange, RemoveCause, Shard, ShardState, detach};
use crate::engine::{
    CollectionUid,
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
    /// the engine's lease clock on, until a renewal moves it.
    pub(crate) fn serve_until(&self, until: u64) {
        self.lock().serve_until = Some(until);
    }

    /// Why this shard answers no client now, if it does not: it follows an owner elsewhere, or
    /// its lease has ended. Read under the lock, in the hold that answers.
    pub(super) fn not_serving(&self, st: &ShardState) -> Option<Error> {
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

    /// Applies an owner's commit; the position local storage applied it at. Refuses, changing
    /// nothing, a commit that does not start at this shard's log end, names a collection this
    /// node does not have, or does not fit the documents held (a diverged history).
    pub(crate) fn apply_replicated(&self, commit: ReplicatedCommit<'_>) -> Result<Lsn, Error> {
        let mut state = self.lock();
        let st = &mut *state;
        if commit.after != st.log_seq {
            return Err(diverged(format!(
                "a commit after log position {} where this copy ends at {}",
                commit.after, st.log_seq
            )));
        }
        let mut changes = Vec::with_capacity(commit.records.len());
        let mut given = GivenLog {
            records: Vec::with_capacity(commit.records.len()),
            seqs: Vec::new(),
            expired: Vec::new(),
        };
        for (i, (collection, bytes)) in commit.records.iter().enumerate() {
            let seq = commit.after + 1 + i as u64;
            let record = ChangeRecord::decode_log(bytes).map_err(Error::Storage)?;
            let change = self.change_of(st, *collection, &record, seq)?;
            if let Change::Expire { slot, .. } = change {
                given.expired.push((slot, seq));
            }
            changes.push(change);
            given.seqs.push(seq);
            given.records.push((*collection, seq, bytes.clone()));
        }
        for (collection, key, record) in commit.remembered {
            if !st.collections.contains_key(collection) {
                return Err(unknown_collection(*collection));
            }
            changes.push(Change::Remember {
                collection: *collection,
                scope: key.clone(),
                record: *record,
            });
            given.seqs.push(0);
        }
        // Versions are the owner's: none of them is handed out here again after a promotion.
        self.versions
            .fetch_max(commit.versions_below, Ordering::SeqCst);
        let expired = given.expired.clone();
        let (_, lsn) = st
            .commit_logged(
                &*self.store,
                &changes,
                Some(given),
                (&self.metrics, &self.versions),
            )
            .map_err(Error::Storage)?;
        st.client_lsn = lsn;
        // A logged expiry is final: dead at once, deleted by the purge once promoted. Unless
        // the same commit wrote the document again (its position moved on).
        for (slot, seq) in expired {
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
            st.pending.push_back((r, meta_expiry(&changes, slot)));
        }
        Ok(lsn)
    }

    /// The change that wrote `record` at position `seq`. A commit holds each document once, but
    /// for an expiry logged before the write that re-creates it, which finds the expired
    /// version's slot as the owner did.
    fn change_of(
        &self,
        st: &ShardState,
        collection: CollectionUid,
        record: &ChangeRecord,
        seq: u64,
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
                self.versions
                    .fetch_max(record.version + 1, Ordering::SeqCst);
                let index = if cs.lazy && cs.policy.is_some() {
                    IndexChange::Owed
                } else {
                    let old = match slot {
                        Some(s) if st.docs.get(s).indexed => {
                            self.stored_terms_of(collection, &record.key)?
                        }
                        _ => Vec::new(),
                    };
                    let new = match &cs.policy {
                        Some(policy) => {
                            bounded_document_terms(&mayfly_json::decode(&body), policy)?
                        }
                        None => Vec::new(),
                    };
                    IndexChange::Replace(old, new)
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

    fn stored_terms_of(&self, collection: CollectionUid, key: &DocKey) -> Result<Vec<Term>, Error> {
        Ok(self
            .store
            .get_terms(collection, key)
            .map_err(Error::Storage)?
            .map(|t| t.terms)
            .unwrap_or_default())
    }
}

/// The instant the commit's expiry of `slot` names.
fn meta_expiry(changes: &[Change], slot: u32) -> u64 {
    changes
        .iter()
        .find_map(|c| match *c {
            Change::Expire { slot: s, at } if s == slot => Some(at),
            _ => None,
        })
        .unwrap_or_default()
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
