//! Hierarchical timer wheel for per-document expiry deadlines.
//!
//! Eight levels of 64 slots at 1 ms resolution cover 2^48 ms, far beyond the longest TTL
//! (2^31 s). Level `l` slots are 64^l ms wide; a timer sits in the lowest level whose slot
//! range separates it from `elapsed`, and moves down ("cascades") when its slot comes up, so
//! each timer is touched at most eight times however far out it is.
//!
//! Timers live in one slab (`Vec<Node>`); every slot is a circular doubly linked list through
//! the slab with its own sentinel node, so scheduling and cancelling are O(1) pointer updates
//! on indices, never raw pointers. A [`TimerHandle`] carries the node's generation: a handle
//! kept after its timer fired or was cancelled no longer matches and is ignored (the ABA
//! hazard of plain indices).
//!
//! Per node: 8 bytes deadline (its top bit flags membership of the ready list) + 4 payload +
//! 4 + 4 links + 4 generation = 24 bytes, plus the 8-byte handle the document keeps: 32 bytes
//! of bookkeeping per scheduled document.

use std::mem;

const LEVELS: usize = 8;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const SLOT_MASK: u64 = SLOTS as u64 - 1;
/// Sentinels: one per slot, then the ready list, then the cascade list.
const READY: u32 = (LEVELS * SLOTS) as u32;
const CASCADE: u32 = READY + 1;
const SENTINELS: u32 = CASCADE + 1;
const NIL: u32 = u32::MAX;
/// Deadlines are kept below 2^48 ms (year 10889) so that every timer fits the eight levels.
const MAX_DEADLINE: u64 = (1 << (LEVELS as u32 * SLOT_BITS)) - 1;
/// Set in `Node::deadline` while the node is in the ready list.
const READY_FLAG: u64 = 1 << 63;

/// Identifies one scheduled timer; stale once it fired or was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimerHandle {
    index: u32,
    generation: u32,
}

#[derive(Clone, Debug)]
struct Node {
    /// Deadline in ms, with [`READY_FLAG`] set while in the ready list.
    deadline: u64,
    payload: u32,
    prev: u32,
    next: u32,
    /// Bumped when the node is freed; odd while in use, even while free.
    generation: u32,
}

/// A fired timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fired {
    pub(crate) deadline: u64,
    pub(crate) payload: u32,
}

/// The wheel. Not thread-safe on its own: a shard owns one behind its lock.
#[derive(Debug)]
pub(crate) struct TimerWheel {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Per level, bit `s` is set if slot `s` may be non-empty (cleared lazily when found empty).
    occupied: [u64; LEVELS],
    /// Every timer due at or before this instant is in the ready or cascade list.
    elapsed: u64,
    len: usize,
    ready_len: usize,
}

impl TimerWheel {
    pub(crate) fn new(now: u64) -> Self {
        let nodes = (0..SENTINELS)
            .map(|i| Node { deadline: 0, payload: NIL, prev: i, next: i, generation: 0 })
            .collect();
        TimerWheel { nodes, free: Vec::new(), occupied: [0; LEVELS], elapsed: now, len: 0, ready_len: 0 }
    }

    /// Number of scheduled timers (including due ones not yet polled).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Timers known to be due and waiting to be polled.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready_len
    }

    /// Bytes held by timer nodes, counting spare capacity (sentinels excluded).
    pub(crate) fn allocated_bytes(&self) -> usize {
        (self.nodes.capacity() - SENTINELS as usize) * mem::size_of::<Node>()
            + self.free.capacity() * mem::size_of::<u32>()
    }

    /// Schedules `payload` at `deadline` (ms). O(1).
    pub(crate) fn schedule(&mut self, deadline: u64, payload: u32) -> TimerHandle {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.nodes.len()).expect("fewer than 2^32 timers per shard");
                self.nodes.push(Node { deadline: 0, payload: NIL, prev: NIL, next: NIL, generation: 0 });
                index
            }
        };
        let node = &mut self.nodes[index as usize];
        node.deadline = deadline.min(MAX_DEADLINE);
        node.payload = payload;
        node.generation = node.generation.wrapping_add(1);
        debug_assert!(node.generation % 2 == 1, "in-use nodes have odd generations");
        let generation = node.generation;
        self.len += 1;
        self.place(index);
        TimerHandle { index, generation }
    }

    /// Cancels a timer; returns false if the handle was stale. O(1).
    pub(crate) fn cancel(&mut self, handle: TimerHandle) -> bool {
        if !self.is_live(handle) {
            return false;
        }
        if self.nodes[handle.index as usize].deadline & READY_FLAG != 0 {
            self.ready_len -= 1;
        }
        self.unlink(handle.index);
        self.release(handle.index);
        true
    }

    /// The deadline of a live timer.
    #[cfg(test)]
    pub(crate) fn deadline(&self, handle: TimerHandle) -> Option<u64> {
        self.is_live(handle).then(|| self.nodes[handle.index as usize].deadline & !READY_FLAG)
    }

    /// The instant at which `poll` will next have work: `Some(elapsed)` or earlier if timers
    /// are already due, else the start of the earliest occupied slot. A slot on a higher level
    /// may wake the caller before its first timer is due; polling then cascades it.
    pub(crate) fn next_due(&mut self) -> Option<u64> {
        if !self.list_is_empty(READY) || !self.list_is_empty(CASCADE) {
            return Some(self.elapsed);
        }
        self.next_slot().map(|(_, _, start)| start)
    }

    /// Pops up to `budget` timers due at or before `now`, in (millisecond) deadline order
    /// except that timers cascading in the same batch may interleave. Work done is bounded by
    /// `budget` node moves, however many timers are due.
    pub(crate) fn poll(&mut self, now: u64, budget: usize, out: &mut Vec<Fired>) {
        let mut moves = 0;
        while moves < budget {
            // 1. Hand out what is already known to be due.
            let first = self.nodes[READY as usize].next;
            if first != READY {
                let node = &self.nodes[first as usize];
                out.push(Fired { deadline: node.deadline & !READY_FLAG, payload: node.payload });
                self.ready_len -= 1;
                self.unlink(first);
                self.release(first);
                moves += 1;
                continue;
            }
            // 2. Re-place timers of a slot that came up on a higher level.
            let first = self.nodes[CASCADE as usize].next;
            if first != CASCADE {
                self.unlink(first);
                self.place(first);
                moves += 1;
                continue;
            }
            // 3. Advance to the next occupied slot, if it has started.
            match self.next_slot() {
                Some((level, slot, start)) if start <= now => {
                    // Even level-0 slots (all due) go through the cascade list, one node per
                    // move, so that a slot holding a million timers is still bounded work.
                    self.elapsed = self.elapsed.max(start);
                    self.splice_slot(level, slot);
                    moves += 1;
                }
                _ => {
                    // Nothing more is due at `now`: everything left is later, so positions
                    // relative to `now` stay valid (see `place`).
                    self.elapsed = self.elapsed.max(now);
                    return;
                }
            }
        }
    }

    fn is_live(&self, handle: TimerHandle) -> bool {
        handle.index >= SENTINELS
            && self.nodes.get(handle.index as usize).is_some_and(|n| n.generation == handle.generation)
    }

    /// Puts node `index` into the ready list or the slot matching its deadline.
    fn place(&mut self, index: u32) {
        let deadline = self.nodes[index as usize].deadline;
        if deadline <= self.elapsed {
            self.nodes[index as usize].deadline |= READY_FLAG;
            self.ready_len += 1;
            self.push_back(READY, index);
            return;
        }
        // The lowest level whose slot width separates deadline from elapsed: the highest bit
        // where they differ, in 6-bit groups. Since elapsed <= now <= deadline, that bit only
        // moves down as elapsed advances, so a placed timer never sits too low.
        let masked = (self.elapsed ^ deadline) | SLOT_MASK;
        let significant = 63 - masked.leading_zeros();
        let level = ((significant / SLOT_BITS) as usize).min(LEVELS - 1);
        let slot = ((deadline >> (level as u32 * SLOT_BITS)) & SLOT_MASK) as usize;
        self.occupied[level] |= 1 << slot;
        self.push_back((level * SLOTS + slot) as u32, index);
    }

    /// The earliest occupied slot: (level, slot, start instant).
    fn next_slot(&mut self) -> Option<(usize, usize, u64)> {
        let mut best: Option<(usize, usize, u64)> = None;
        for level in 0..LEVELS {
            while self.occupied[level] != 0 {
                let shift = level as u32 * SLOT_BITS;
                let slot_range = 1u64 << shift;
                let level_range = slot_range << SLOT_BITS;
                let now_slot = (self.elapsed >> shift) & SLOT_MASK;
                let rotated = self.occupied[level].rotate_right(now_slot as u32);
                let slot = ((u64::from(rotated.trailing_zeros()) + now_slot) & SLOT_MASK) as usize;
                let sentinel = (level * SLOTS + slot) as u32;
                if self.list_is_empty(sentinel) {
                    // Cancelled timers leave bits behind; clear them here rather than on cancel.
                    self.occupied[level] &= !(1 << slot);
                    continue;
                }
                let level_start = self.elapsed & !(level_range - 1);
                let mut start = level_start + slot as u64 * slot_range;
                if start + slot_range <= self.elapsed {
                    // The slot wrapped around: it belongs to the next turn of this level.
                    start += level_range;
                }
                let start = start.max(self.elapsed);
                if best.is_none_or(|(_, _, s)| start < s) {
                    best = Some((level, slot, start));
                }
                break;
            }
        }
        best
    }

    fn list_is_empty(&self, sentinel: u32) -> bool {
        self.nodes[sentinel as usize].next == sentinel
    }

    fn push_back(&mut self, sentinel: u32, index: u32) {
        let tail = self.nodes[sentinel as usize].prev;
        self.nodes[index as usize].prev = tail;
        self.nodes[index as usize].next = sentinel;
        self.nodes[tail as usize].next = index;
        self.nodes[sentinel as usize].prev = index;
    }

    fn unlink(&mut self, index: u32) {
        let Node { prev, next, .. } = self.nodes[index as usize];
        self.nodes[prev as usize].next = next;
        self.nodes[next as usize].prev = prev;
        self.nodes[index as usize].prev = NIL;
        self.nodes[index as usize].next = NIL;
    }

    /// Moves a whole slot list to the end of the cascade list: O(1), by relinking its ends.
    fn splice_slot(&mut self, level: usize, slot: usize) {
        let sentinel = (level * SLOTS + slot) as u32;
        self.occupied[level] &= !(1 << slot);
        let first = self.nodes[sentinel as usize].next;
        let last = self.nodes[sentinel as usize].prev;
        if first == sentinel {
            return;
        }
        let tail = self.nodes[CASCADE as usize].prev;
        self.nodes[tail as usize].next = first;
        self.nodes[first as usize].prev = tail;
        self.nodes[last as usize].next = CASCADE;
        self.nodes[CASCADE as usize].prev = last;
        self.nodes[sentinel as usize].next = sentinel;
        self.nodes[sentinel as usize].prev = sentinel;
    }

    fn release(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.generation = node.generation.wrapping_add(1);
        node.deadline = 0;
        node.payload = NIL;
        self.free.push(index);
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    const START: u64 = 1_790_000_000_000; // an epoch-ms instant in 2026

    fn drain(wheel: &mut TimerWheel, now: u64) -> Vec<Fired> {
        let mut out = Vec::new();
        loop {
            let before = out.len();
            wheel.poll(now, 64, &mut out);
            if out.len() == before && wheel.next_due().is_none_or(|d| d > now) {
                return out;
            }
        }
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut wheel = TimerWheel::new(START);
        wheel.schedule(START + 1_000, 7);
        assert!(drain(&mut wheel, START + 999).is_empty());
        assert_eq!(drain(&mut wheel, START + 1_000), [Fired { deadline: START + 1_000, payload: 7 }]);
        assert_eq!(wheel.len(), 0);
        assert_eq!(wheel.next_due(), None);
    }

    #[test]
    fn longest_ttl_fits_and_cascades_down() {
        let mut wheel = TimerWheel::new(START);
        let far = START + i32::MAX as u64 * 1_000;
        wheel.schedule(far, 1);
        wheel.schedule(START + 86_400_000, 2);
        assert!(wheel.next_due().is_some_and(|d| d <= far));
        assert!(drain(&mut wheel, far - 1).iter().all(|f| f.payload == 2));
        assert_eq!(drain(&mut wheel, far), [Fired { deadline: far, payload: 1 }]);
    }

    #[test]
    fn stale_handles_do_not_cancel_reused_nodes() {
        let mut wheel = TimerWheel::new(START);
        let old = wheel.schedule(START + 10, 1);
        assert!(wheel.cancel(old));
        let new = wheel.schedule(START + 20, 2); // reuses the node
        assert!(!wheel.cancel(old), "stale handle must not match");
        assert_eq!(wheel.deadline(new), Some(START + 20));
        assert_eq!(drain(&mut wheel, START + 20), [Fired { deadline: START + 20, payload: 2 }]);
    }

    #[test]
    fn poll_work_is_bounded_by_budget() {
        let mut wheel = TimerWheel::new(START);
        for i in 0..10_000 {
            wheel.schedule(START + 5_000, i);
        }
        let mut out = Vec::new();
        wheel.poll(START + 5_000, 100, &mut out);
        assert!(out.len() <= 100);
        assert_eq!(drain(&mut wheel, START + 5_000).len() + out.len(), 10_000);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Schedule(u64),
        Cancel(usize),
        Reschedule(usize, u64),
        Advance(u64, usize),
    }

    fn delay() -> impl Strategy<Value = u64> {
        prop_oneof![0..70u64, 0..5_000u64, 0..300_000u64, 0..100_000_000u64]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => delay().prop_map(Op::Schedule),
            1 => any::<usize>().prop_map(Op::Cancel),
            1 => (any::<usize>(), delay()).prop_map(|(i, d)| Op::Reschedule(i, d)),
            2 => (delay(), 1..200usize).prop_map(|(d, b)| Op::Advance(d, b)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn matches_an_ordered_map_model(ops in proptest::collection::vec(op(), 1..300)) {
            let mut wheel = TimerWheel::new(START);
            let mut now = START;
            let mut next_payload = 0u32;
            // payload -> (deadline, handle); the model also keeps every cancelled handle.
            let mut model: BTreeMap<u32, (u64, TimerHandle)> = BTreeMap::new();
            let mut stale: Vec<TimerHandle> = Vec::new();
            for op in ops {
                match op {
                    Op::Schedule(d) => {
                        let h = wheel.schedule(now + d, next_payload);
                        model.insert(next_payload, (now + d, h));
                        next_payload += 1;
                    }
                    Op::Cancel(i) | Op::Reschedule(i, _) if model.is_empty() => {
                        let _ = i;
                    }
                    Op::Cancel(i) => {
                        let key = *model.keys().nth(i % model.len()).expect("non-empty");
                        let (_, h) = model.remove(&key).expect("present");
                        prop_assert!(wheel.cancel(h));
                        stale.push(h);
                    }
                    Op::Reschedule(i, d) => {
                        let key = *model.keys().nth(i % model.len()).expect("non-empty");
                        let (_, h) = model[&key];
                        prop_assert!(wheel.cancel(h));
                        stale.push(h);
                        let h = wheel.schedule(now + d, key);
                        model.insert(key, (now + d, h));
                    }
                    Op::Advance(d, budget) => {
                        now += d;
                        let mut out = Vec::new();
                        wheel.poll(now, budget, &mut out);
                        prop_assert!(out.len() <= budget);
                        for f in out.iter().chain(drain(&mut wheel, now).iter()) {
                            let (deadline, h) = model.remove(&f.payload).expect("fired timer was scheduled");
                            prop_assert_eq!(deadline, f.deadline);
                            prop_assert!(f.deadline <= now, "fired early");
                            stale.push(h);
                        }
                        prop_assert!(model.values().all(|(d, _)| *d > now), "a due timer did not fire");
                    }
                }
                prop_assert_eq!(wheel.len(), model.len());
                let earliest = model.values().map(|(d, _)| *d).min();
                match (wheel.next_due(), earliest) {
                    (None, None) => {}
                    (Some(due), Some(e)) => prop_assert!(due <= e, "would sleep past a deadline"),
                    (due, e) => prop_assert!(false, "next_due {:?} vs earliest {:?}", due, e),
                }
                for h in &stale {
                    prop_assert_eq!(wheel.deadline(*h), None);
                }
            }
        }
    }
}
