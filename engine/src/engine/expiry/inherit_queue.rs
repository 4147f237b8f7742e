//! Documents that inherit their collection's default TTL, in last-write order.
//!
//! All of them expire `default` seconds after their last write, so their expiry order is
//! their write order, whatever the default is: changing it (or turning it on) re-times the
//! whole queue without touching a single entry. Only documents with their own `ttl` need
//! timer-wheel entries.
//!
//! A rewrite appends a new entry and leaves the old one behind as stale; an entry is recognised
//! as stale by the document slot's generation, which every write bumps. When stale entries
//! outnumber live ones the queue is compacted, so it holds at most two entries (32 bytes) per
//! inheriting document.

use std::{collections::VecDeque, mem};

/// A document slot and the generation it had when the entry was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRef {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    written_at: u64,
    doc: SlotRef,
}

/// Below this many stale entries, compaction is not worth a pass.
const MIN_COMPACT: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct InheritQueue {
    entries: VecDeque<Entry>,
    /// Entries whose document still inherits and has not been rewritten since.
    live: usize,
}

impl InheritQueue {
    /// Adds a document written at `written_at`. Writes normally arrive in order and are
    /// appended; one stamped earlier than the last (shard time followed the wall clock back) is
    /// inserted in order, so the head is always the earliest to expire.
    pub(crate) fn push(&mut self, written_at: u64, doc: SlotRef) {
        let entry = Entry { written_at, doc };
        if self
            .entries
            .back()
            .is_none_or(|e| e.written_at <= written_at)
        {
            self.entries.push_back(entry);
        } else {
            let at = self.entries.partition_point(|e| e.written_at <= written_at);
            self.entries.insert(at, entry);
        }
        self.live += 1;
    }

    /// Adds live entries sorted by write instant (documents restored from storage, queued after
    /// the writes that arrived since the start). They normally all precede the entries here and
    /// go in front; if the wall clock stepped back across a restart, the two are merged.
    pub(crate) fn prepend_sorted(&mut self, entries: &[(u64, SlotRef)]) {
        debug_assert!(entries.is_sorted_by_key(|&(written, _)| written));
        let in_front = entries
            .last()
            .zip(self.entries.front())
            .is_none_or(|((last, _), first)| *last <= first.written_at);
        if in_front {
            for &(written_at, doc) in entries.iter().rev() {
                self.entries.push_front(Entry { written_at, doc });
            }
        } else {
            let here = mem::take(&mut self.entries);
            let mut restored = entries
                .iter()
                .map(|&(written_at, doc)| Entry { written_at, doc })
                .peekable();
            let mut merged = VecDeque::with_capacity(here.len() + entries.len());
            for entry in here {
                while let Some(r) = restored.next_if(|r| r.written_at <= entry.written_at) {
                    merged.push_back(r);
                }
                merged.push_back(entry);
            }
            merged.extend(restored);
            self.entries = merged;
        }
        self.live += entries.len();
    }

    /// Records that one live entry went stale (its document was rewritten, deleted or purged).
    /// `is_live` tells compaction which entries to keep.
    pub(crate) fn forget_one(&mut self, is_live: impl Fn(SlotRef) -> bool) {
        self.live -= 1;
        let stale = self.entries.len() - self.live;
        if stale > self.live && stale >= MIN_COMPACT {
            self.entries.retain(|e| is_live(e.doc));
            debug_assert_eq!(self.entries.len(), self.live);
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }

    /// Entries whose document still inherits and was not rewritten since.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The oldest entry's write instant and document (possibly stale).
    pub(crate) fn front(&self) -> Option<(u64, SlotRef)> {
        self.entries.front().map(|e| (e.written_at, e.doc))
    }

    /// Removes the oldest entry. The caller has checked whether it was live; a live entry
    /// popped here is one fewer live entry.
    pub(crate) fn pop_front(&mut self, was_live: bool) {
        if self.entries.pop_front().is_some() && was_live {
            self.live -= 1;
        }
    }

    /// Entries written at or before `cutoff` (stale ones included): the inherit part of the purge
    /// backlog once `cutoff = now - default`.
    pub(crate) fn count_written_by(&self, cutoff: u64) -> usize {
        self.entries.partition_point(|e| e.written_at <= cutoff)
    }

    /// Iterates entries from the oldest.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, SlotRef)> + '_ {
        self.entries.iter().map(|e| (e.written_at, e.doc))
    }

    pub(crate) fn allocated_bytes(&self) -> usize {
        self.entries.capacity() * mem::size_of::<Entry>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn compaction_keeps_live_entries_in_order_and_bounds_memory() {
        let mut q = InheritQueue::default();
        // slot -> current generation; one document per slot, rewritten over and over.
        let mut generation: HashMap<u32, u32> = HashMap::new();
        let mut t = 0;
        for slot in 0..100 {
            generation.insert(slot, 0);
            q.push(
                t,
                SlotRef {
                    slot,
                    generation: 0,
                },
            );
            t += 1;
        }
        for round in 1..=200u32 {
            for slot in 0..100 {
                let g = generation.get_mut(&slot).expect("known slot");
                *g = round;
                let current = generation.clone();
                q.forget_one(|r| current[&r.slot] == r.generation);
                q.push(
                    t,
                    SlotRef {
                        slot,
                        generation: round,
                    },
                );
                t += 1;
            }
        }
        assert_eq!(q.live, 100);
        assert!(
            q.entries.len() <= 2 * 100 + MIN_COMPACT,
            "len {}",
            q.entries.len()
        );
        let times: Vec<u64> = q.iter().map(|(w, _)| w).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "order kept");
        let live: Vec<u32> = q
            .iter()
            .filter(|(_, r)| generation[&r.slot] == r.generation)
            .map(|(_, r)| r.slot)
            .collect();
        assert_eq!(live, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn counts_entries_written_by_a_cutoff() {
        let mut q = InheritQueue::default();
        for t in [10, 20, 20, 30] {
            q.push(
                t,
                SlotRef {
                    slot: 0,
                    generation: 0,
                },
            );
        }
        assert_eq!(q.count_written_by(9), 0);
        assert_eq!(q.count_written_by(20), 3);
        assert_eq!(q.count_written_by(99), 4);
    }

    #[test]
    fn out_of_order_writes_and_restored_entries_keep_write_order() {
        let r = |slot| SlotRef {
            slot,
            generation: 0,
        };
        let mut q = InheritQueue::default();
        for (t, slot) in [(10, 0), (50, 1), (20, 2), (5, 3), (50, 4)] {
            q.push(t, r(slot));
        }
        q.prepend_sorted(&[(1, r(5)), (30, r(6)), (60, r(7))]);
        let order: Vec<(u64, u32)> = q.iter().map(|(t, d)| (t, d.slot)).collect();
        assert_eq!(
            order,
            [
                (1, 5),
                (5, 3),
                (10, 0),
                (20, 2),
                (30, 6),
                (50, 1),
                (50, 4),
                (60, 7)
            ]
        );
        assert_eq!(q.live(), 8);
    }
}
