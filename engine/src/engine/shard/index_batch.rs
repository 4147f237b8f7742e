//! A shard's part of the background indexer: documents owed an index update (written in a
//! `lazy` collection, or marked by a rebuild) get their entries, a batch at a time. Bodies and
//! stored terms are read outside the shard lock; each update is committed under it, through
//! the commit path, only if the document is still the version read and the policy the one its
//! terms were computed under.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use std::collections::HashSet;

use crate::engine::index::terms::document_terms;
use crate::engine::shard::{documents::same_policy, state::mark_stale};

/// Slots a rebuild's walk marks per hold of the shard lock.
const WALK_CHUNK: usize = 4096;
/// Queue entries [`pick`] may examine per document it takes.
const PICK_FACTOR: usize = 8;

/// What one indexer batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IndexReport {
    /// Documents whose entries were written.
    pub(crate) indexed: usize,
    /// More is owed now: call again.
    pub(crate) more: bool,
}

/// A document's stored terms and its terms under the policy.
type TermsChange = (Vec<Term>, Vec<Term>);

/// A document picked for an update, as it was under the lock.
struct Candidate {
    slot: u32,
    at: TermsRef,
    collection: CollectionUid,
    key: DocKey,
    version: u64,
    indexed: bool,
    policy: Option<Arc<IndexPaths>>,
}

impl Shard {
    /// Updates the entries of up to `budget` documents owed one, after advancing any rebuild's
    /// walk by a chunk. A storage failure leaves them owed.
    pub(crate) fn index_batch(&self, budget: usize) -> Result<IndexReport, StorageError> {
        let candidates = {
            let mut state = self.lock();
            let st = &mut *state;
            // A chunk every batch, whatever is queued, so that one collection's backlog cannot
            // hold off another's rebuild; the queue grows by at most a slot per document.
            walk_rebuilds(st);
            pick(st, budget)
        };
        if candidates.is_empty() {
            return Ok(IndexReport {
                indexed: 0,
                more: self.owes_updates(),
            });
        }
        let fetched = candidates
            .iter()
            .map(|c| self.terms_of(c))
            .collect::<Result<Vec<_>, _>>();
        let mut state = self.lock();
        let st = &mut *state;
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(e) => {
                requeue(st, candidates.iter().map(|c| c.slot));
                return Err(e);
            }
        };
        let mut changes = Vec::new();
        let mut retry = Vec::new();
        for (c, terms) in candidates.iter().zip(fetched) {
            let meta = st.docs.try_get(c.slot);
            // An expired document is the purge's, which may be reading its terms right now.
            let still = st.docs.try_get(c.slot).is_some()
                && st.docs.terms_ref(c.slot) == c.at
                && meta.is_some_and(|m| m.stale && m.version == c.version && !m.dead && !m.purged)
                && st
                    .collections
                    .get(&c.collection)
                    .is_some_and(|cs| same_policy(cs.policy.as_ref(), c.policy.as_ref()));
            match terms {
                Some((old, new)) if still => {
                    if old.is_empty() && new.is_empty() {
                        // Nothing stored, nothing to store.
                        let cs = st.collections.get_mut(&c.collection).expect("checked");
                        st.docs.get_mut(c.slot).stale = false;
                        cs.stale_docs -= 1;
                    } else {
                        changes.push(Change::Index {
                            slot: c.slot,
                            old,
                            new,
                        });
                    }
                }
                // Written, deleted or re-ruled since it was read: owed again if still stale.
                _ => retry.push(c.slot),
            }
        }
        requeue(st, retry);
        let indexed = changes.len();
        if let Err(e) = st.commit(&*self.store, &changes, &self.metrics, &self.versions) {
            requeue(
                st,
                changes.iter().filter_map(|c| match c {
                    Change::Index { slot, .. } => Some(*slot),
                    _ => None,
                }),
            );
            return Err(e);
        }
        let more = !st.unindexed.is_empty() || rebuilding(st);
        Ok(IndexReport { indexed, more })
    }

    /// Whether documents are owed updates, or a rebuild's walk is unfinished.
    pub(crate) fn owes_updates(&self) -> bool {
        let st = self.lock();
        !st.unindexed.is_empty() || rebuilding(&st)
    }

    /// Whether this shard's part of a collection's index is caught up with its policy: the
    /// rebuild's walk is done and no document is owed an update. In a `lazy` collection too:
    /// a restart trusts a terms record of the document's version only once the index is
    /// recorded complete, so it must not be recorded so while documents still hold entries
    /// of an older policy (under steady writes, it waits for a moment the indexer is level).
    pub(crate) fn index_caught_up(&self, uid: CollectionUid) -> bool {
        self.lock()
            .collections
            .get(&uid)
            .is_none_or(|cs| cs.rebuild_from.is_none() && cs.stale_docs == 0)
    }

    /// A candidate's stored terms and its terms under the policy, read without the lock;
    /// `None` if the document is no longer the version picked.
    fn terms_of(&self, c: &Candidate) -> Result<Option<TermsChange>, StorageError> {
        let Some(record) = self.store.get(c.collection, &c.key)? else {
            return Ok(None);
        };
        if record.version != c.version {
            return Ok(None);
        }
        let old = if c.indexed {
            self.store
                .get_terms(c.collection, &c.key)?
                .map(|t| t.terms)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let new = match &c.policy {
            Some(paths) => document_terms(&mayfly_json::decode(&record.body), paths),
            None => Vec::new(),
        };
        Ok(Some((old, new)))
    }
}

/// Advances every rebuild's walk by a chunk of slots, marking the collection's documents
/// owed an update (with no policy, only those that have entries to remove).
fn walk_rebuilds(st: &mut ShardState) {
    let walking: Vec<CollectionUid> = st
        .collections
        .values()
        .filter(|cs| cs.rebuild_from.is_some())
        .map(|cs| cs.uid)
        .collect();
    let slots = st.docs.slot_count();
    for uid in walking {
        let cs = st.collections.get_mut(&uid).expect("listed above");
        let from = cs.rebuild_from.expect("listed above") as usize;
        let end = (from + WALK_CHUNK).min(slots);
        for slot in from..end {
            let slot = slot as u32;
            let mark = st.docs.try_get(slot).is_some_and(|m| {
                m.collection == uid && !m.dead && !m.purged && (cs.policy.is_some() || m.indexed)
            });
            if mark {
                mark_stale(&mut st.docs, &mut st.unindexed, cs, slot);
            }
        }
        cs.rebuild_from = (end < slots).then_some(end as u32);
    }
}

/// Takes up to `budget` documents owed an update off the queue, examining at most
/// [`PICK_FACTOR`] entries per document taken (entries no longer owed anything are skipped), so
/// one hold of the lock stays short. Expired ones are no longer owed one: the purge removes
/// their entries with them. A slot may be queued twice (freed and reused while queued); it is
/// taken once.
fn pick(st: &mut ShardState, budget: usize) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut taken = HashSet::new();
    let mut examined = 0;
    while out.len() < budget && examined < budget * PICK_FACTOR {
        let Some(slot) = st.unindexed.pop_front() else {
            break;
        };
        examined += 1;
        let Some(meta) = st.docs.try_get(slot) else {
            continue;
        };
        if !meta.stale || taken.contains(&slot) {
            continue;
        }
        // A detached collection's documents are being freed; nothing is owed them.
        let Some(cs) = st.collections.get_mut(&meta.collection) else {
            continue;
        };
        if meta.dead || meta.purged {
            st.docs.get_mut(slot).stale = false;
            cs.stale_docs -= 1;
            continue;
        }
        taken.insert(slot);
        out.push(Candidate {
            slot,
            at: st.docs.terms_ref(slot),
            collection: meta.collection,
            key: meta.key.clone(),
            version: meta.version,
            indexed: meta.indexed,
            policy: cs.policy.clone(),
        });
    }
    out
}

/// Puts slots back on the queue whose documents are still owed an update.
fn requeue(st: &mut ShardState, slots: impl IntoIterator<Item = u32>) {
    for slot in slots {
        if st.docs.try_get(slot).is_some_and(|m| m.stale) {
            st.unindexed.push_back(slot);
        }
    }
}

fn rebuilding(st: &ShardState) -> bool {
    st.collections.values().any(|cs| cs.rebuild_from.is_some())
}
