//! A shard's part of the purge: batches of due timers and queue heads, removed through the
//! commit path, and the bookkeeping a collection's settings or deletion changes.

use std::{
    collections::hash_map,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use crate::engine::{
    CollectionUid,
    clock::{Clock, Millis},
    expiry::inherit_queue::SlotRef,
    shard::{
        Change, CollectionShard, DocSlab, RemoveCause, Shard, ShardState, Tracking, time_own_ttl,
    },
    ttl::{DefaultTtl, DocumentTtl, Rules},
};
use crate::storage::{DocKey, DurableFuture, Term};

/// Documents removed per batch: bounds how long the purge holds a shard lock.
pub(crate) const PURGE_BATCH: usize = 512;
/// How long the purge waits before retrying after a storage failure.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Slots [`Shard::time_own_ttls`] goes through per hold of the shard lock.
const TIMING_CHUNK: usize = 4096;

/// What one purge batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PurgeReport {
    /// The shard's clock reading the batch worked at.
    pub(crate) now: Millis,
    /// Documents deleted from storage.
    pub(crate) purged: usize,
    /// The earliest instant more work is due (`<= now`: call again at once).
    pub(crate) next_due: Option<Millis>,
    /// The storage write failed; the documents stay dead and pending.
    pub(crate) failed: bool,
}

/// Documents a purge batch deleted whose delete is not durable yet: they stay in memory, dead,
/// until [`Shard::finish_purge`] has awaited `durable`.
pub(crate) struct Undurable {
    durable: DurableFuture,
    purged: Vec<(SlotRef, Millis)>,
}

impl Shard {
    /// Removes expired documents: first those already marked dead, then due timers, then the
    /// due heads of inherit queues. `budget` bounds the entries examined, stale ones included,
    /// which bounds how long the shard lock is held.
    pub(crate) fn purge_batch(
        &self,
        clock: &dyn Clock,
        budget: usize,
    ) -> (PurgeReport, Option<Undurable>) {
        let mut state = self.lock();
        if self.not_serving(&state).is_some() {
            // Only an owner purges, within its lease (a commit after its end could follow
            // another owner's takeover); promotion and a renewal after a lapse wake the purge
            // again.
            let now = state.now(clock);
            let report = PurgeReport {
                now,
                purged: 0,
                next_due: None,
                failed: false,
            };
            return (report, None);
        }
        let (now, mut candidates) = gather(&mut state, clock, budget);
        // Expiries are logged as soon as they are found, before the slower delete below (which
        // releases the lock to read terms): a write committed meanwhile comes after them.
        let unlogged: Vec<Change> = candidates
            .iter()
            .filter(|&&(slot, _)| {
                let meta = state.docs.get(slot);
                !meta.expiry_logged
                    && state
                        .collections
                        .get(&meta.collection)
                        .is_some_and(|c| c.feed)
            })
            .map(|&(slot, at)| Change::Expire { slot, at })
            .collect();
        if !unlogged.is_empty() {
            let st = &mut *state;
            if let Err(e) = st.commit(&*self.store, &unlogged, &self.metrics, &self.versions) {
                tracing::warn!(error = %e, "could not log expiries; the purge's delete will");
            }
        }
        // Documents with index entries lose them in the same batch; their terms are read
        // outside the lock (the documents are dead meanwhile, invisible to every read), and
        // each is removed only if it is still the version whose terms were read.
        let mut terms: Vec<Vec<Term>> = vec![Vec::new(); candidates.len()];
        let refs: Vec<SlotRef> = candidates
            .iter()
            .map(|&(slot, _)| state.docs.current_ref(slot))
            .collect();
        let wanted: Vec<(usize, SlotRef, CollectionUid, DocKey)> = candidates
            .iter()
            .enumerate()
            .filter(|(_, (slot, _))| state.docs.get(*slot).indexed)
            .map(|(i, &(slot, _))| {
                let meta = state.docs.get(slot);
                (
                    i,
                    state.docs.current_ref(slot),
                    meta.collection,
                    meta.key.clone(),
                )
            })
            .collect();
        if !wanted.is_empty() {
            drop(state);
            let fetched: Result<Vec<_>, _> = wanted
                .iter()
                .map(|(_, _, uid, key)| self.store.get_terms(*uid, key))
                .collect();
            state = self.lock();
            let st = &mut *state;
            let mut keep = vec![true; candidates.len()];
            match fetched {
                Ok(fetched) => {
                    for ((i, r, _, _), stored) in wanted.iter().zip(fetched) {
                        keep[*i] = st.docs.is_current(*r);
                        terms[*i] = stored.map(|t| t.terms).unwrap_or_default();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purge could not read index terms; will retry");
                    for (i, r, _, _) in &wanted {
                        keep[*i] = false;
                        if st.docs.is_current(*r) {
                            st.pending.push_back((*r, candidates[*i].1));
                        }
                    }
                }
            }
            // Every candidate, indexed or not, may have been rewritten (or its collection
            // deleted and its slot freed) while the lock was released: only documents still
            // the same version, dead, in an attached collection are removed.
            for (i, r) in refs.iter().enumerate() {
                keep[i] = keep[i]
                    && st.docs.is_current(*r)
                    && st
                        .docs
                        .try_get(r.slot)
                        .is_some_and(|m| m.dead && st.collections.contains_key(&m.collection));
            }
            let kept: Vec<_> = candidates
                .into_iter()
                .zip(std::mem::take(&mut terms))
                .zip(keep)
                .filter_map(|(item, k)| k.then_some(item))
                .collect();
            (candidates, terms) = kept.into_iter().unzip();
        }
        let st = &mut *state;
        let changes: Vec<Change> = candidates
            .iter()
            .zip(terms)
            .map(|(&(slot, at), terms)| Change::Remove {
                slot,
                cause: RemoveCause::Expired { at },
                terms,
            })
            .collect();
        let mut undurable = None;
        let failed = match st.commit(&*self.store, &changes, &self.metrics, &self.versions) {
            Ok((_, lsn)) => {
                let purged: Vec<_> = candidates
                    .iter()
                    .map(|&(slot, expired_at)| (st.docs.current_ref(slot), expired_at))
                    .collect();
                match self.store.durable(lsn) {
                    Some(durable) if !purged.is_empty() => {
                        undurable = Some(Undurable { durable, purged });
                    }
                    _ => {
                        st.forget_purged(&purged, now, &self.metrics);
                    }
                }
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, documents = candidates.len(), "purge could not delete expired documents; will retry");
                for &(slot, expired_at) in &candidates {
                    // Marked dead above: they stay invisible until a retry succeeds.
                    st.pending
                        .push_back((st.docs.current_ref(slot), expired_at));
                }
                true
            }
        };

        let next_due = next_due(st, now);
        let backlog = backlog(st, now);
        drop(state);

        self.backlog.store(backlog as u64, Ordering::Relaxed);
        let report = PurgeReport {
            now,
            purged: if failed { 0 } else { candidates.len() },
            next_due,
            failed,
        };
        (report, undurable)
    }

    /// Waits, without holding the shard lock, until a batch's delete is durable, then forgets
    /// its documents. If it never becomes durable they go back to the backlog, still dead, and
    /// this returns false.
    pub(crate) async fn finish_purge(&self, undurable: Undurable, clock: &dyn Clock) -> bool {
        let Undurable { durable, purged } = undurable;
        let result = durable.await;
        let mut state = self.lock();
        let st = &mut *state;
        match result {
            Ok(()) => {
                let now = st.now(clock);
                st.forget_purged(&purged, now, &self.metrics);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, documents = purged.len(), "purge could not make its deletes durable; will retry");
                for (r, expired_at) in purged {
                    if st.docs.is_current(r) {
                        st.pending.push_back((r, expired_at));
                    }
                }
                false
            }
        }
    }

    /// Gives timers to the untimed own-ttl documents of a collection whose TTL was just turned
    /// on, going through the shard's slots in chunks, each under one short hold of the lock.
    /// Visibility never waits for this: reads judge every document by the rules.
    pub(crate) fn time_own_ttls(&self, uid: CollectionUid) {
        let mut next = 0;
        loop {
            let earliest = {
                let mut state = self.lock();
                let st = &mut *state;
                let end = (next + TIMING_CHUNK).min(st.docs.slot_count());
                if next >= end {
                    break;
                }
                let Some(rules) = st.collections.get(&uid).map(|c| c.rules) else {
                    return;
                };
                let mut earliest: Option<Millis> = None;
                for slot in next as u32..end as u32 {
                    let Some(meta) = st.docs.try_get_mut(slot) else {
                        continue;
                    };
                    if meta.collection != uid
                        || meta.tracking != Tracking::None
                        || meta.dead
                        || !matches!(meta.ttl, Some(DocumentTtl::After(_)))
                    {
                        continue;
                    }
                    let Some(deadline) = time_own_ttl(&mut st.wheel, meta, slot, &rules) else {
                        return; // TTL is off again: nothing to time.
                    };
                    earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
                }
                next = end;
                earliest
            };
            self.wake_purge_for(earliest);
        }
    }

    /// Detaches a collection's part of this shard: from now on lookups in it fail. Its
    /// documents still occupy slots until [`Shard::free_detached`] releases them.
    pub(crate) fn detach_collection(&self, uid: CollectionUid) -> Option<CollectionShard> {
        let mut state = self.lock();
        let st = &mut *state;
        let mut part = st.collections.remove(&uid)?;
        st.heads.update(uid, &mut part.head_due, None);
        Some(part)
    }

    /// Releases up to `budget` slots of a detached collection; true when none are left.
    pub(crate) fn free_detached(
        &self,
        docs: &mut hash_map::IntoIter<DocKey, u32>,
        budget: usize,
    ) -> bool {
        let mut state = self.lock();
        let st = &mut *state;
        for (_, slot) in docs.by_ref().take(budget) {
            if let Tracking::Timer(handle) = st.docs.get(slot).tracking {
                st.wheel.cancel(handle);
            }
            st.docs.remove(slot);
        }
        docs.len() == 0
    }
}

/// What the head of an inherit queue was.
enum QueueHead {
    /// An entry of a document rewritten or removed since: dropped.
    Stale,
    /// A document expired under default `n`: popped, marked dead, its expiry instant returned.
    Due(SlotRef, Millis),
    /// Empty, or the head expires after `now`: nothing taken.
    NotDue,
}

/// Takes one step at the head of an inherit queue: the purge marks expired inheritors dead
/// through here.
fn take_queue_head(cs: &mut CollectionShard, docs: &mut DocSlab, now: Millis) -> QueueHead {
    let Some((written, r)) = cs.inherit.front() else {
        return QueueHead::NotDue;
    };
    if !(docs.is_current(r) && docs.get(r.slot).tracking == Tracking::Queue) {
        cs.inherit.pop_front(false);
        return QueueHead::Stale;
    }
    let Some(expired_at) = cs.inheritor_due(written).filter(|&due| due <= now) else {
        return QueueHead::NotDue;
    };
    cs.inherit.pop_front(true);
    let meta = docs.get_mut(r.slot);
    meta.tracking = Tracking::None;
    meta.dead = true;
    QueueHead::Due(r, expired_at)
}

/// Handles a fired timer: marks the document dead and returns its expiry instant if it is
/// expired under the current rules; otherwise leaves it untimed (TTL off) or re-times it.
fn on_timer_fired(st: &mut ShardState, slot: u32, now: Millis) -> Option<Millis> {
    let meta = st.docs.get_mut(slot);
    meta.tracking = Tracking::None;
    // A collection being deleted: its cleanup frees the document.
    let cs = st.collections.get(&meta.collection)?;
    match meta.own_ttl_due(&cs.rules) {
        // TTL was turned off: untimed until it is turned on again.
        None => None,
        Some(expired_at) if expired_at <= now => {
            meta.dead = true;
            Some(expired_at)
        }
        // The default grew since the timer was set.
        Some(_) => {
            time_own_ttl(&mut st.wheel, meta, slot, &cs.rules);
            None
        }
    }
}

fn next_due(st: &mut ShardState, now: Millis) -> Option<Millis> {
    if !st.pending.is_empty() {
        return Some(now);
    }
    let queues = st.heads.first().map(|(due, _)| due);
    match (st.wheel.next_due(), queues) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Entries known to be due and not yet processed: dead documents, ready timers and due queue
/// entries (stale queue entries included: each still costs the purge a step).
fn backlog(st: &ShardState, now: Millis) -> usize {
    let queued: usize = st
        .heads
        .due_by(now)
        .filter_map(|uid| st.collections.get(&uid))
        .map(|cs| queue_backlog(cs, now))
        .sum();
    st.pending.len() + st.wheel.ready_len() + queued
}

/// Entries of a queue due at `now`: written by the later of the two cutoffs (the default's and
/// the expired marks').
fn queue_backlog(cs: &CollectionShard, now: Millis) -> usize {
    let Rules {
        default_ttl,
        expired,
    } = cs.rules;
    let by_default = match default_ttl {
        DefaultTtl::After(n) => now.checked_sub(n.millis()),
        _ => None,
    };
    let by_marks = (cs.rules_changed_at <= now && expired.inherited_written_by > 0)
        .then_some(expired.inherited_written_by);
    by_default
        .max(by_marks)
        .map_or(0, |cutoff| cs.inherit.count_written_by(cutoff))
}

impl Shard {
    /// One shard's purge loop: a batch, then a yield while more is due, else sleep until the
    /// earliest deadline or until a write schedules an earlier one.
    pub(crate) async fn run_purge(self: Arc<Self>, clock: Arc<dyn Clock>) {
        let shard = self;
        loop {
            // While awake, every new deadline notifies (it is earlier than u64::MAX), so a deadline
            // scheduled after the batch computed `next_due` leaves a wake-up permit behind.
            shard.purge_sleeps_until.store(u64::MAX, Ordering::Release);
            let (report, undurable) = shard.purge_batch(&*clock, PURGE_BATCH);
            let durable = match undurable {
                Some(undurable) => shard.finish_purge(undurable, &*clock).await,
                None => true,
            };
            if report.failed || !durable {
                tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                continue;
            }
            match report.next_due {
                Some(due) if due <= report.now => tokio::task::yield_now().await,
                Some(due) => {
                    shard.purge_sleeps_until.store(due, Ordering::Release);
                    let wait = Duration::from_millis(due.saturating_sub(clock.now()));
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = shard.purge_wake.notified() => {}
                    }
                }
                None => shard.purge_wake.notified().await,
            }
        }
    }
}

/// Picks the documents a purge batch removes (marking them dead), examining at most `budget`
/// entries: first those already marked dead, then due timers, then due inherit-queue heads.
fn gather(st: &mut ShardState, clock: &dyn Clock, budget: usize) -> (Millis, Vec<(u32, Millis)>) {
    let now = st.now(clock);
    let mut candidates: Vec<(u32, Millis)> = Vec::new();
    let mut work = 0;

    while work < budget {
        let Some((r, expired_at)) = st.pending.pop_front() else {
            break;
        };
        work += 1;
        // Documents of a collection being deleted belong to its cleanup, which frees them.
        if st.docs.is_current(r)
            && st.docs.get(r.slot).dead
            && st.collections.contains_key(&st.docs.get(r.slot).collection)
        {
            candidates.push((r.slot, expired_at));
        }
    }

    mark_due(st, now, budget - work, &mut candidates);
    (now, candidates)
}

/// Marks documents due by `now` dead, examining at most `budget` entries: due timers, then due
/// inherit-queue heads. Adds each to `out` with its expiry instant; returns the work done.
pub(super) fn mark_due(
    st: &mut ShardState,
    now: Millis,
    budget: usize,
    out: &mut Vec<(u32, Millis)>,
) -> usize {
    let candidates = out;
    let mut work = 0;
    let mut fired = Vec::new();
    let docs = &st.docs;
    st.wheel.poll(now, budget, &mut fired, |slot| {
        docs.get(slot).timer_deadline()
    });
    work += fired.len();
    for slot in fired {
        if let Some(expired_at) = on_timer_fired(st, slot, now) {
            candidates.push((slot, expired_at));
        }
    }

    // Inherit queues, earliest due head first: each is served until its head is due after
    // the next queue's, so no collection waits behind another's backlog.
    while work < budget {
        let Some((due, uid)) = st.heads.first() else {
            break;
        };
        if due > now {
            break;
        }
        let until = st.heads.second_due().map_or(now, |next| next.min(now));
        let cs = st
            .collections
            .get_mut(&uid)
            .expect("queue heads name attached collections");
        loop {
            work += 1;
            match take_queue_head(cs, &mut st.docs, now) {
                QueueHead::Stale => {}
                QueueHead::Due(r, expired_at) => candidates.push((r.slot, expired_at)),
                QueueHead::NotDue => break,
            }
            let next = cs.inherit.front().and_then(|(w, _)| cs.inheritor_due(w));
            if work >= budget || next.is_none_or(|d| d > until) {
                break;
            }
        }
        cs.refresh_head(&mut st.heads);
    }
    work
}
