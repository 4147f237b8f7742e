//! A shard's part of recovery: loading stored metadata, and rebuilding expiry tracking.

use std::{
    collections::{HashMap, HashSet},
    mem,
};

use crate::engine::recovery::{ExpiryRebuild, ShardLoad};
use crate::engine::{
    CollectionUid,
    clock::{Clock, Millis},
    expiry::inherit_queue::SlotRef,
    shard::{DocMeta, Shard, Tracking, state::mark_stale, time_own_ttl},
    ttl::DocumentTtl,
};
use crate::storage::{Lsn, StorageError, StoredMeta};

/// Slots the expiry rebuild goes through per hold of a shard lock.
pub(in crate::engine) const REBUILD_CHUNK: usize = 8192;

impl Shard {
    /// Loads this shard's documents from its store, untracked.
    pub(in crate::engine) fn load(
        &self,
        known: &HashSet<CollectionUid>,
    ) -> Result<ShardLoad, StorageError> {
        let mut out = ShardLoad::default();
        let mut state = self.lock();
        let st = &mut *state;
        let mut latest: Millis = 0;
        self.store.load(&mut |doc: StoredMeta| {
            // Deleted documents' versions count too: none is handed out again.
            out.max_version = out.max_version.max(doc.version);
            let Some(cs) = st.collections.get_mut(&doc.collection) else {
                if !known.contains(&doc.collection) {
                    out.orphans.insert(doc.collection);
                }
                return;
            };
            out.documents += 1;
            latest = latest.max(doc.last_write);
            let r = st.docs.insert(DocMeta {
                collection: doc.collection,
                key: doc.key.clone(),
                last_write: doc.last_write,
                version: doc.version,
                // Storage syncs what it recovered before serving it.
                lsn: Lsn::ZERO,
                ttl: doc.ttl,
                tracking: Tracking::Unscheduled,
                // Its expiry is in the change log: expired, and final.
                dead: doc.expiry_logged,
                indexed: false,
                purged: false,
                stale: false,
                index_epoch: 0,
                path_bits: 0,
                seq: doc.seq,
                expiry_logged: doc.expiry_logged,
            });
            cs.index.insert(doc.key, r.slot);
            // In a `lazy` collection a document is owed its entries unless its terms record
            // (below) is of its version: a crash may have come before the indexer's write.
            // Marked here without queueing; those still marked after the terms are queued.
            if cs.lazy && cs.policy.is_some() {
                st.docs.get_mut(r.slot).stale = true;
            }
        })?;
        // Index entries are stored, not rebuilt: recovery only learns which documents have
        // them and counts their paths.
        self.store.load_terms(&mut |collection, key, stored| {
            let Some(cs) = st.collections.get_mut(&collection) else {
                return;
            };
            if let Some(&slot) = cs.index.get(&key) {
                let meta = st.docs.get_mut(slot);
                meta.indexed = true;
                if meta.version == stored.version {
                    meta.stale = false;
                }
                cs.indexed_docs += 1;
                meta.path_bits = cs.paths.update(&[], &stored.terms).apply(0);
            }
        })?;
        // Remembered requests, in the order they are forgotten.
        let mut requests = Vec::new();
        self.store.load_requests(&mut |collection, key, record| {
            if st.collections.contains_key(&collection) {
                requests.push((collection, key, record));
            }
        })?;
        requests.sort_by_key(|(_, _, record)| record.forget_at);
        for (collection, key, record) in requests {
            st.requests.recover(collection, key, record);
        }
        for slot in 0..st.docs.slot_count() as u32 {
            let Some(meta) = st.docs.try_get_mut(slot) else {
                continue;
            };
            if mem::take(&mut meta.stale) {
                let cs = st
                    .collections
                    .get_mut(&meta.collection)
                    .expect("only attached collections' documents are loaded");
                mark_stale(&mut st.docs, &mut st.unindexed, cs, slot);
            }
        }
        st.log_seq = self.store.change_log().last_log_seq()?;
        // What storage holds is durable; readers look for each collection's records up to
        // the shard's last position once.
        for cs in st.collections.values_mut() {
            cs.log_tip = (st.log_seq, Lsn::ZERO);
        }
        // Shard time never runs behind a stored write, even if the wall clock stepped back
        // across the restart: nothing stored can come back to life.
        st.advance_to(latest);
        Ok(out)
    }

    pub(in crate::engine) fn rebuild_expiry(&self, clock: &dyn Clock, report: &mut ExpiryRebuild) {
        let mut inheritors: HashMap<CollectionUid, Vec<(Millis, SlotRef)>> = HashMap::new();
        let mut next = 0;
        loop {
            let earliest = {
                let mut state = self.lock();
                let st = &mut *state;
                let now = st.now(clock);
                let end = (next + REBUILD_CHUNK).min(st.docs.slot_count());
                if next >= end {
                    break;
                }
                let mut earliest: Option<Millis> = None;
                for slot in next..end {
                    let r = st.docs.current_ref(slot as u32);
                    let Some(meta) = st.docs.try_get_mut(slot as u32) else {
                        continue;
                    };
                    if meta.tracking != Tracking::Unscheduled {
                        continue;
                    }
                    let Some(cs) = st.collections.get(&meta.collection) else {
                        continue;
                    };
                    if meta.dead {
                        meta.tracking = Tracking::None;
                        st.pending.push_back((r, now));
                        report.past_due += 1;
                        earliest = Some(now);
                        continue;
                    }
                    match meta.ttl {
                        // Queued at the end, all at once and in write order.
                        None => {
                            inheritors
                                .entry(meta.collection)
                                .or_default()
                                .push((meta.last_write, r));
                            continue;
                        }
                        Some(DocumentTtl::Never) => meta.tracking = Tracking::None,
                        Some(DocumentTtl::After(_)) => {
                            meta.tracking = Tracking::None;
                            match meta.own_ttl_due(&cs.rules) {
                                // TTL is off: untimed, like any own-ttl document while it is.
                                None => {}
                                Some(due) if due <= now => {
                                    meta.dead = true;
                                    st.pending.push_back((r, due));
                                    report.past_due += 1;
                                    earliest = Some(now);
                                }
                                Some(due) => {
                                    time_own_ttl(&mut st.wheel, meta, slot as u32, &cs.rules);
                                    report.timers += 1;
                                    earliest = Some(earliest.map_or(due, |e| e.min(due)));
                                }
                            }
                        }
                    }
                }
                next = end;
                earliest
            };
            self.wake_purge_for(earliest);
        }
        for (uid, mut entries) in inheritors {
            entries.sort_unstable_by_key(|&(written, _)| written);
            let mut state = self.lock();
            let st = &mut *state;
            let Some(cs) = st.collections.get_mut(&uid) else {
                continue;
            };
            // Rewritten or removed since the pass above: those have their own tracking now.
            entries.retain(|&(_, r)| {
                st.docs.is_current(r) && st.docs.get(r.slot).tracking == Tracking::Unscheduled
            });
            for &(_, r) in &entries {
                st.docs.get_mut(r.slot).tracking = Tracking::Queue;
            }
            report.queued += entries.len();
            cs.inherit.prepend_sorted(&entries);
            cs.refresh_head(&mut st.heads);
        }
        self.purge_wake.notify_one();
    }
}
