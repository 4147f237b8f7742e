//! Per-document metadata in slots, and what tracks each document's expiry.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;

/// What keeps track of a document's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) enum Tracking {
    /// Nothing: it never expires, its TTL is ignored (collection TTL off), or it is pending purge.
    None,
    /// A live entry in its collection's inherit queue.
    Queue,
    /// A timer-wheel entry (a document with its own ttl).
    Timer(TimerHandle),
    /// Loaded from storage at start and not yet given a timer or queue entry; reads judge it
    /// by the rules meanwhile, and the expiry rebuild gives it its tracking.
    Unscheduled,
}

/// What the engine keeps in memory per document.
#[derive(Debug)]
pub(in crate::engine) struct DocMeta {
    pub(in crate::engine) collection: CollectionUid,
    pub(in crate::engine) key: DocKey,
    pub(in crate::engine) last_write: Millis,
    pub(in crate::engine) version: u64,
    /// Where this version's write is in the storage log: a read of it settles there.
    pub(in crate::engine) lsn: Lsn,
    pub(in crate::engine) ttl: Option<DocumentTtl>,
    pub(in crate::engine) tracking: Tracking,
    /// Expired and final: a later settings change must not bring it back.
    pub(in crate::engine) dead: bool,
    /// It has a terms record (and index entries) in storage: changing or removing it must
    /// remove them, so their terms are read first.
    pub(in crate::engine) indexed: bool,
    /// The purge deleted it from storage; it stays until the delete is durable.
    pub(in crate::engine) purged: bool,
    /// Its index entries (if any) are not this version's under the collection's policy: the
    /// background indexer owes it an update (a lazy write, or a rebuild). Every such document
    /// is in its shard's `unindexed` queue.
    pub(in crate::engine) stale: bool,
    /// Counts the background indexer's writes of its terms record, which leave the slot's
    /// generation alone (its expiry tracking holds that): with the generation, it tells a
    /// writer whether the terms it read outside the lock are still the stored ones.
    pub(in crate::engine) index_epoch: u32,
    /// The paths with bits (see [`PathStats`]) it has index entries at: the documents an
    /// `ORDER BY` finds undefined are those without its path's bit.
    pub(in crate::engine) path_bits: PathBits,
    /// The position of its latest change log record (0: none).
    pub(in crate::engine) seq: u64,
    /// Its expiry has its change log record: it is dead, and nothing logs it again.
    pub(in crate::engine) expiry_logged: bool,
}

impl DocMeta {
    pub(in crate::engine) fn expires_at(&self, default_ttl: DefaultTtl) -> Option<Millis> {
        ttl::expires_at(self.last_write, self.ttl, default_ttl)
    }

    /// The deadline of this document's timer: its own ttl after its last write. Stable while
    /// the timer is scheduled (any write cancels the timer first).
    pub(in crate::engine) fn timer_deadline(&self) -> Millis {
        ttl::expires_at(self.last_write, self.ttl, DefaultTtl::NoDefault)
            .expect("only own-ttl documents are timed")
    }

    pub(in crate::engine) fn is_visible(&self, rules: &Rules, now: Millis) -> bool {
        !self.dead && rules.is_visible(self.last_write, self.ttl, now)
    }

    /// When an own-ttl document's timer must fire under `rules`: its expiry, or, if an earlier
    /// default made it final, its own deadline whatever the current default says. `None`
    /// while TTL is off (it waits untimed until TTL is turned on again).
    pub(in crate::engine) fn own_ttl_due(&self, rules: &Rules) -> Option<Millis> {
        if rules.expired.covers(self.last_write, self.ttl) {
            Some(self.timer_deadline())
        } else {
            self.expires_at(rules.default_ttl)
        }
    }
}

/// Where a document's stored terms stand: equal readings mean the terms record is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) struct TermsRef {
    at: SlotRef,
    epoch: u32,
}

/// Slots for document metadata, addressed by index. Every write and every free bumps a slot's
/// generation, so a `SlotRef` taken earlier can tell that its document changed.
#[derive(Debug, Default)]
pub(in crate::engine) struct DocSlab {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    doc: Option<DocMeta>,
}

impl DocSlab {
    /// See [`TermsRef`].
    pub(in crate::engine) fn terms_ref(&self, slot: u32) -> TermsRef {
        TermsRef {
            at: self.current_ref(slot),
            epoch: self.get(slot).index_epoch,
        }
    }

    pub(in crate::engine) fn insert(&mut self, doc: DocMeta) -> SlotRef {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    doc: None,
                });
                let slot = u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX);
                // Slots are timer payloads, which have 31 bits.
                assert!(slot <= MAX_PAYLOAD, "fewer than 2^31 documents per shard");
                slot
            }
        };
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        s.doc = Some(doc);
        SlotRef {
            slot,
            generation: s.generation,
        }
    }

    /// Marks the document in `slot` as rewritten.
    pub(super) fn bump(&mut self, slot: u32) -> SlotRef {
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        SlotRef {
            slot,
            generation: s.generation,
        }
    }

    pub(in crate::engine) fn remove(&mut self, slot: u32) -> Option<DocMeta> {
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        let doc = s.doc.take();
        self.free.push(slot);
        doc
    }

    pub(in crate::engine) fn get(&self, slot: u32) -> &DocMeta {
        self.slots[slot as usize]
            .doc
            .as_ref()
            .expect("indexed slots hold a document")
    }

    pub(in crate::engine) fn get_mut(&mut self, slot: u32) -> &mut DocMeta {
        self.slots[slot as usize]
            .doc
            .as_mut()
            .expect("indexed slots hold a document")
    }

    /// The document in `slot`, if the slot holds one.
    pub(in crate::engine) fn try_get(&self, slot: u32) -> Option<&DocMeta> {
        self.slots.get(slot as usize)?.doc.as_ref()
    }

    pub(in crate::engine) fn try_get_mut(&mut self, slot: u32) -> Option<&mut DocMeta> {
        self.slots.get_mut(slot as usize)?.doc.as_mut()
    }

    /// A reference to the current version of the document in `slot`.
    pub(in crate::engine) fn current_ref(&self, slot: u32) -> SlotRef {
        SlotRef {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Whether `r` still names the document version it was taken for.
    pub(in crate::engine) fn is_current(&self, r: SlotRef) -> bool {
        self.slots
            .get(r.slot as usize)
            .is_some_and(|s| s.generation == r.generation && s.doc.is_some())
    }

    pub(in crate::engine) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Slots allocated, free ones included: valid slot numbers are below this.
    pub(in crate::engine) fn slot_count(&self) -> usize {
        self.slots.len()
    }
}
