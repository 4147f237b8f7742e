//! Hierarchical timer wheel for per-document expiry deadlines.
//!
//! Eight levels of 64 slots at 1 ms resolution cover 2^48 ms, far beyond the longest TTL
//! (2^31 s). Level `l` slots are 64^l ms wide; a timer sits in the lowest level whose slot
//! range separates it from `elapsed`, and moves down ("cascades") when its slot comes up, so
//! each timer is touched at most eight times however far out it is.
//!
//! Timers are nodes in one slab; every slot is a circular doubly linked list through the slab
//! with its own sentinel node, so scheduling and cancelling are O(1) index updates, never raw
//! pointers. A [`TimerHandle`] carries the node's generation: a handle kept after its timer
//! fired or was cancelled no longer matches and is ignored (the ABA hazard of plain indices).
//!
//! Memory is what the issue budgets most tightly, so a node holds no deadline: 4 bytes payload
//! (a document slot; its top bit flags the ready list) + 4 + 4 links + 4 generation = 16 bytes.
//! The owner supplies a payload's deadline when the node must be re-placed, and it must not
//! change while the timer is scheduled. Nodes live in fixed chunks rather than a doubling
//! vector, and free nodes chain through their links: with the 8-byte handle the document keeps,
//! a scheduled document costs 24 bytes plus at most one partly used chunk per shard.

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
/// Set in `Node::payload` while the node is in the ready list.
const READY_FLAG: u32 = 1 << 31;
/// Largest payload: the top bit is the ready flag.
pub(crate) const MAX_PAYLOAD: u32 = READY_FLAG - 1;
const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Identifies one scheduled timer; stale once it fired or was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimerHandle {
    index: u32,
    generation: u32,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    /// What the timer is for (a document slot), with [`READY_FLAG`] while in the ready list.
    payload: u32,
    prev: u32,
    /// Next in the slot list; for a free node, the next free node.
    next: u32,
    /// Bumped when the node is allocated and when it is freed.
    generation: u32,
}

const EMPTY: Node = Node {
    payload: NIL,
    prev: NIL,
    next: NIL,
    generation: 0,
};

/// The wheel. Not thread-safe on its own: a shard owns one behind its lock.
#[derive(Debug)]
pub(crate) struct TimerWheel {
    chunks: Vec<Box<[Node; CHUNK]>>,
    /// Nodes ever handed out (sentinels included); beyond it the last chunk is unused.
    high_water: u32,
    free_head: u32,
    /// Per level, bit `s` is set if slot `s` may be non-empty (cleared lazily when found empty).
    occupied: [u64; LEVELS],
    /// Every timer due at or before this instant is in the ready or cascade list.
    elapsed: u64,
    len: usize,
    ready_len: usize,
}

impl TimerWheel {
    pub(crate) fn new(now: u64) -> Self {
        let mut wheel = TimerWheel {
            chunks: Vec::new(),
            high_water: 0,
            free_head: NIL,
            occupied: [0; LEVELS],
            elapsed: now,
            len: 0,
            ready_len: 0,
        };
        for i in 0..SENTINELS {
            let index = wheel.grow();
            debug_assert_eq!(index, i);
            *wheel.node_mut(i) = Node {
                payload: NIL,
                prev: i,
                next: i,
                generation: 0,
            };
        }
        wheel
    }

    /// Number of scheduled timers (including due ones not yet polled).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Timers known to be due and waiting to be polled.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready_len
    }

    /// Bytes held by timer nodes, counting unused room in the last chunk, sentinels excluded.
    pub(crate) fn allocated_bytes(&self) -> usize {
        (self.chunks.len() * CHUNK - SENTINELS as usize) * size_of::<Node>()
    }

    fn node(&self, index: u32) -> &Node {
        &self.chunks[(index >> CHUNK_BITS) as usize][index as usize & (CHUNK - 1)]
    }

    fn node_mut(&mut self, index: u32) -> &mut Node {
        &mut self.chunks[(index >> CHUNK_BITS) as usize][index as usize & (CHUNK - 1)]
    }

    /// A never used node, adding a chunk when the last one is full.
    fn grow(&mut self) -> u32 {
        if self.high_water as usize == self.chunks.len() * CHUNK {
            self.chunks.push(Box::new([EMPTY; CHUNK]));
        }
        self.high_water += 1;
        self.high_water - 1
    }

    /// Schedules `payload` (at most [`MAX_PAYLOAD`]) at `deadline` (ms). O(1).
    pub(crate) fn schedule(&mut self, deadline: u64, payload: u32) -> TimerHandle {
        assert!(payload <= MAX_PAYLOAD, "timer payloads fit in 31 bits");
        let index = match self.free_head {
            NIL => {
                assert!(self.high_water < NIL, "fewer than 2^32 timers per shard");
                self.grow()
            }
            head => {
                self.free_head = self.node(head).next;
                head
            }
        };
        let node = self.node_mut(index);
        node.payload = payload;
        node.generation = node.generation.wrapping_add(1);
        let generation = node.generation;
        self.len += 1;
        self.place(index, deadline.min(MAX_DEADLINE));
        TimerHandle { index, generation }
    }

    /// Cancels a timer; returns false if the handle was stale. O(1).
    pub(crate) fn cancel(&mut self, handle: TimerHandle) -> bool {
        if !self.is_live(handle) {
            return false;
        }
        if self.node(handle.index).payload & READY_FLAG != 0 {
            self.ready_len -= 1;
        }
        self.unlink(handle.index);
        self.release(handle.index);
        true
    }

    /// Whether a handle still names a scheduled timer.
    pub(crate) fn is_live(&self, handle: TimerHandle) -> bool {
        handle.index >= SENTINELS
            && handle.index < self.high_water
            && self.node(handle.index).generation == handle.generation
            && self.node(handle.index).prev != NIL
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

    /// Pops up to `budget` payloads due at or before `now` into `out`. `deadline_of` gives the
    /// deadline a payload was scheduled with. Work is bounded by `budget` node moves, however
    /// many timers are due.
    pub(crate) fn poll(
        &mut self,
        now: u64,
        budget: usize,
        out: &mut Vec<u32>,
        deadline_of: impl Fn(u32) -> u64,
    ) {
        let mut moves = 0;
        while moves < budget {
            // 1. Hand out what is already known to be due.
            let first = self.node(READY).next;
            if first != READY {
                out.push(self.node(first).payload & !READY_FLAG);
                self.ready_len -= 1;
                self.unlink(first);
                self.release(first);
                moves += 1;
                continue;
            }
            // 2. Re-place timers of a slot that came up.
            let first = self.node(CASCADE).next;
            if first != CASCADE {
                self.unlink(first);
                let deadline = deadline_of(self.node(first).payload).min(MAX_DEADLINE);
                self.place(first, deadline);
                moves += 1;
                continue;
            }
            // 3. Advance to the next occupied slot, if it has started. Even level-0 slots (all
            // due) go through the cascade list, one node per move, so that a slot holding a
            // million timers is still bounded work.
            match self.next_slot() {
                Some((level, slot, start)) if start <= now => {
                    self.elapsed = self.elapsed.max(start);
                    self.splice_to_cascade(level, slot);
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

    /// Puts node `index` into the ready list or the slot matching `deadline`.
    fn place(&mut self, index: u32, deadline: u64) {
        if deadline <= self.elapsed {
            self.node_mut(index).payload |= READY_FLAG;
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
        self.node(sentinel).next == sentinel
    }

    fn push_back(&mut self, sentinel: u32, index: u32) {
        let tail = self.node(sentinel).prev;
        let node = self.node_mut(index);
        node.prev = tail;
        node.next = sentinel;
        self.node_mut(tail).next = index;
        self.node_mut(sentinel).prev = index;
    }

    fn unlink(&mut self, index: u32) {
        let Node { prev, next, .. } = *self.node(index);
        self.node_mut(prev).next = next;
        self.node_mut(next).prev = prev;
        let node = self.node_mut(index);
        node.prev = NIL;
        node.next = NIL;
    }

    /// Moves a whole slot list to the end of the cascade list: O(1), by relinking its ends.
    fn splice_to_cascade(&mut self, level: usize, slot: usize) {
        let sentinel = (level * SLOTS + slot) as u32;
        self.occupied[level] &= !(1 << slot);
        let first = self.node(sentinel).next;
        let last = self.node(sentinel).prev;
        if first == sentinel {
            return;
        }
        let tail = self.node(CASCADE).prev;
        self.node_mut(tail).next = first;
        self.node_mut(first).prev = tail;
        self.node_mut(last).next = CASCADE;
        self.node_mut(CASCADE).prev = last;
        let s = self.node_mut(sentinel);
        s.next = sentinel;
        s.prev = sentinel;
    }

    /// Frees an unlinked node onto the free chain.
    fn release(&mut self, index: u32) {
        let free_head = self.free_head;
        let node = self.node_mut(index);
        node.generation = node.generation.wrapping_add(1);
        node.payload = NIL;
        node.next = free_head;
        self.free_head = index;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;

    use super::*;

    const START: u64 = 1_790_000_000_000; // an epoch-ms instant in 2026

    /// Polls everything due at `now`, in small budgets, resolving deadlines from `deadlines`.
    fn drain(wheel: &mut TimerWheel, now: u64, deadlines: &HashMap<u32, u64>) -> Vec<u32> {
        let mut out = Vec::new();
        loop {
            let before = out.len();
            wheel.poll(now, 64, &mut out, |p| deadlines[&p]);
            if out.len() == before && wheel.next_due().is_none_or(|d| d > now) {
                return out;
            }
        }
    }

    #[test]
    fn a_node_is_16_bytes() {
        assert_eq!(size_of::<Node>(), 16);
        assert_eq!(size_of::<TimerHandle>(), 8);
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut wheel = TimerWheel::new(START);
        let deadlines = HashMap::from([(7, START + 1_000)]);
        wheel.schedule(START + 1_000, 7);
        assert!(drain(&mut wheel, START + 999, &deadlines).is_empty());
        assert_eq!(drain(&mut wheel, START + 1_000, &deadlines), [7]);
        assert_eq!(wheel.len(), 0);
        assert_eq!(wheel.next_due(), None);
    }

    #[test]
    fn longest_ttl_fits_and_cascades_down() {
        let mut wheel = TimerWheel::new(START);
        let far = START + i32::MAX as u64 * 1_000;
        let deadlines = HashMap::from([(1, far), (2, START + 86_400_000)]);
        wheel.schedule(far, 1);
        wheel.schedule(START + 86_400_000, 2);
        assert!(wheel.next_due().is_some_and(|d| d <= far));
        assert_eq!(drain(&mut wheel, far - 1, &deadlines), [2]);
        assert_eq!(drain(&mut wheel, far, &deadlines), [1]);
    }

    #[test]
    fn stale_handles_do_not_cancel_reused_nodes() {
        let mut wheel = TimerWheel::new(START);
        let deadlines = HashMap::from([(2, START + 20)]);
        let old = wheel.schedule(START + 10, 1);
        assert!(wheel.cancel(old));
        let new = wheel.schedule(START + 20, 2); // reuses the node
        assert!(!wheel.cancel(old), "stale handle must not match");
        assert!(wheel.is_live(new));
        assert_eq!(drain(&mut wheel, START + 20, &deadlines), [2]);
        assert!(!wheel.is_live(new), "fired");
    }

    #[test]
    fn poll_work_is_bounded_by_budget() {
        let mut wheel = TimerWheel::new(START);
        let deadlines: HashMap<u32, u64> = (0..10_000).map(|i| (i, START + 5_000)).collect();
        for i in 0..10_000 {
            wheel.schedule(START + 5_000, i);
        }
        let mut out = Vec::new();
        wheel.poll(START + 5_000, 100, &mut out, |p| deadlines[&p]);
        assert!(out.len() <= 100);
        assert_eq!(
            drain(&mut wheel, START + 5_000, &deadlines).len() + out.len(),
            10_000
        );
    }

    #[test]
    fn memory_per_timer_stays_near_16_bytes() {
        let mut wheel = TimerWheel::new(START);
        for i in 0..100_000 {
            wheel.schedule(START + u64::from(i), i);
        }
        let per_timer = wheel.allocated_bytes() as f64 / 100_000.0;
        assert!(per_timer < 16.2, "{per_timer} bytes per timer");
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
            // The model: payload -> (deadline, handle), plus every handle that went stale.
            let mut model: BTreeMap<u32, (u64, TimerHandle)> = BTreeMap::new();
            let mut stale: Vec<TimerHandle> = Vec::new();
            for op in ops {
                match op {
                    Op::Schedule(d) => {
                        let h = wheel.schedule(now + d, next_payload);
                        model.insert(next_payload, (now + d, h));
                        next_payload += 1;
                    }
                    Op::Cancel(_) | Op::Reschedule(..) if model.is_empty() => {}
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
                        let deadlines: HashMap<u32, u64> = model.iter().map(|(p, (d, _))| (*p, *d)).collect();
                        let mut out = Vec::new();
                        wheel.poll(now, budget, &mut out, |p| deadlines[&p]);
                        prop_assert!(out.len() <= budget);
                        out.extend(drain(&mut wheel, now, &deadlines));
                        for payload in out {
                            let (deadline, h) = model.remove(&payload).expect("fired timer was scheduled");
                            prop_assert!(deadline <= now, "fired early");
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
                    prop_assert!(!wheel.is_live(*h), "a stale handle still matches");
                }
            }
        }
    }
}
