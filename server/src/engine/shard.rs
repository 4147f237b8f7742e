//! One shard of the engine: the documents of the partitions that hash to it, their expiry
//! bookkeeping and the single path through which every change to them is made.
//!
//! A shard's lock makes check-and-write atomic (existence, etag, expiry). Document operations
//! and the purge take one shard lock at a time; only a settings change holds them all, in
//! index order. Writes are applied to storage under the lock (an append, never a wait for the
//! disk), so one shard's writes never race; durability is awaited after it is released.

use std::{
    collections::{HashMap, VecDeque},
    mem,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use super::{
    CollectionInfo, CollectionUid, Outcome,
    clock::{Clock, Millis},
    document::{DocumentView, Etag, WriteMode},
    error::Error,
    expiry::{
        inherit_queue::{InheritQueue, SlotRef},
        queue_heads::QueueHeads,
        wheel::{MAX_PAYLOAD, TimerHandle, TimerWheel},
    },
    metrics::EngineMetrics,
    ttl::{self, DefaultTtl, DocumentTtl, Rules},
};
use crate::storage::{
    DocKey, DocumentWrite, Lsn, ShardStore, StorageError, StoredDocument, WriteBatch,
};

/// How far the wall clock may step back while shard time holds still (see [`ShardState::now`]).
pub(crate) const MAX_CLOCK_STEP_BACK: Millis = 5_000;

/// A shard: state behind a lock, and the signal its purge task sleeps on.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(super) state: Mutex<ShardState>,
    pub(super) store: Arc<dyn ShardStore>,
    pub(super) metrics: Arc<EngineMetrics>,
    /// Wakes the purge task when an earlier deadline appears.
    pub(super) purge_wake: Notify,
    /// The instant the purge task sleeps until (`u64::MAX`: no deadline).
    pub(super) purge_sleeps_until: AtomicU64,
    /// Due entries the last purge pass left behind.
    pub(super) backlog: AtomicU64,
    /// The engine's version counter: every version handed out is below its value.
    pub(super) versions: Arc<AtomicU64>,
}

#[derive(Debug)]
pub(crate) struct ShardState {
    pub(super) collections: HashMap<CollectionUid, CollectionShard>,
    pub(super) docs: DocSlab,
    pub(super) wheel: TimerWheel,
    /// Documents known to be expired (marked dead) and waiting to be purged, with their expiry
    /// instants. Entries go stale when the document is written again.
    pub(super) pending: VecDeque<(SlotRef, Millis)>,
    /// When each collection's inherit queue is next due: the purge serves the earliest first.
    pub(super) heads: QueueHeads,
    /// The position of the latest client write to this shard: an answer that something is
    /// absent (or differs) settles there, since it may reflect a delete not yet durable.
    pub(super) client_lsn: Lsn,
    /// The latest clock reading this shard acted on; see [`ShardState::now`].
    last_now: Millis,
}

/// A collection's part of one shard.
#[derive(Debug)]
pub(crate) struct CollectionShard {
    pub(super) uid: CollectionUid,
    /// This shard's copy of the collection's expiry rules; reads judge visibility by it. A
    /// settings change replaces it in every shard at one instant (see `Engine::replace_collection`).
    pub(super) rules: Rules,
    /// When the rules last changed (or the shard loaded them): the expiry instant the purge
    /// reports for documents an earlier default made final.
    pub(super) rules_changed_at: Millis,
    /// Where the catalog change that set the rules is in the storage log: anything judged by
    /// them settles there.
    pub(super) settings_lsn: Lsn,
    pub(super) index: HashMap<DocKey, u32>,
    pub(super) inherit: InheritQueue,
    /// This collection's entry in [`ShardState::heads`].
    pub(super) head_due: Option<Millis>,
}

impl CollectionShard {
    /// When an inheritor written at `written` expires under these rules (`None`: never).
    pub(super) fn inheritor_due(&self, written: Millis) -> Option<Millis> {
        if self.rules.expired.covers(written, None) {
            return Some(self.rules_changed_at);
        }
        match self.rules.default_ttl {
            DefaultTtl::After(n) => Some(written + n.millis()),
            DefaultTtl::Off | DefaultTtl::NoDefault => None,
        }
    }

    /// Records in `heads` when this collection's inherit queue is next due. Its head may be a
    /// stale entry: the recorded instant is then early, never late.
    pub(super) fn refresh_head(&mut self, heads: &mut QueueHeads) {
        let due = self
            .inherit
            .front()
            .and_then(|(written, _)| self.inheritor_due(written));
        heads.update(self.uid, &mut self.head_due, due);
    }
}

/// What keeps track of a document's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tracking {
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
pub(super) struct DocMeta {
    pub(super) collection: CollectionUid,
    pub(super) key: DocKey,
    pub(super) last_write: Millis,
    pub(super) version: u64,
    /// Where this version's write is in the storage log: a read of it settles there.
    pub(super) lsn: Lsn,
    pub(super) ttl: Option<DocumentTtl>,
    pub(super) tracking: Tracking,
    /// Expired and final: a later settings change must not bring it back.
    pub(super) dead: bool,
}

impl DocMeta {
    pub(super) fn expires_at(&self, default_ttl: DefaultTtl) -> Option<Millis> {
        ttl::expires_at(self.last_write, self.ttl, default_ttl)
    }

    /// The deadline of this document's timer: its own ttl after its last write. Stable while
    /// the timer is scheduled (any write cancels the timer first).
    pub(super) fn timer_deadline(&self) -> Millis {
        ttl::expires_at(self.last_write, self.ttl, DefaultTtl::NoDefault)
            .expect("only own-ttl documents are timed")
    }

    pub(super) fn is_visible(&self, rules: &Rules, now: Millis) -> bool {
        !self.dead && rules.is_visible(self.last_write, self.ttl, now)
    }

    /// When an own-ttl document's timer must fire under `rules`: its expiry, or, if an earlier
    /// default made it final, its own deadline whatever the current default says. `None`
    /// while TTL is off (it waits untimed until TTL is turned on again).
    pub(super) fn own_ttl_due(&self, rules: &Rules) -> Option<Millis> {
        if rules.expired.covers(self.last_write, self.ttl) {
            Some(self.timer_deadline())
        } else {
            self.expires_at(rules.default_ttl)
        }
    }
}

/// Gives an own-ttl document in `slot` the timer its collection's rules call for and returns
/// when it fires; `None` leaves it untimed (TTL is off). The one place an own-ttl document is
/// timed: on a write, when TTL is turned on, when a timer fires early, and at recovery.
pub(super) fn time_own_ttl(
    wheel: &mut TimerWheel,
    meta: &mut DocMeta,
    slot: u32,
    rules: &Rules,
) -> Option<Millis> {
    debug_assert!(matches!(meta.ttl, Some(DocumentTtl::After(_))));
    let due = meta.own_ttl_due(rules)?;
    meta.tracking = Tracking::Timer(wheel.schedule(due, slot));
    Some(due)
}

/// Slots for document metadata, addressed by index. Every write and every free bumps a slot's
/// generation, so a `SlotRef` taken earlier can tell that its document changed.
#[derive(Debug, Default)]
pub(super) struct DocSlab {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    doc: Option<DocMeta>,
}

impl DocSlab {
    pub(super) fn insert(&mut self, doc: DocMeta) -> SlotRef {
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
    fn bump(&mut self, slot: u32) -> SlotRef {
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        SlotRef {
            slot,
            generation: s.generation,
        }
    }

    pub(super) fn remove(&mut self, slot: u32) -> Option<DocMeta> {
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        let doc = s.doc.take();
        self.free.push(slot);
        doc
    }

    pub(super) fn get(&self, slot: u32) -> &DocMeta {
        self.slots[slot as usize]
            .doc
            .as_ref()
            .expect("indexed slots hold a document")
    }

    pub(super) fn get_mut(&mut self, slot: u32) -> &mut DocMeta {
        self.slots[slot as usize]
            .doc
            .as_mut()
            .expect("indexed slots hold a document")
    }

    /// The document in `slot`, if the slot holds one.
    pub(super) fn try_get_mut(&mut self, slot: u32) -> Option<&mut DocMeta> {
        self.slots.get_mut(slot as usize)?.doc.as_mut()
    }

    /// A reference to the current version of the document in `slot`.
    pub(super) fn current_ref(&self, slot: u32) -> SlotRef {
        SlotRef {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Whether `r` still names the document version it was taken for.
    pub(super) fn is_current(&self, r: SlotRef) -> bool {
        self.slots
            .get(r.slot as usize)
            .is_some_and(|s| s.generation == r.generation && s.doc.is_some())
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Slots allocated, free ones included: valid slot numbers are below this.
    pub(super) fn slot_count(&self) -> usize {
        self.slots.len()
    }
}

/// A change to one document, as the commit path sees it.
#[derive(Debug)]
pub(super) enum Change {
    /// Store this version; `slot` is the slot of the previous version, live or expired.
    Put {
        slot: Option<u32>,
        record: Arc<StoredDocument>,
    },
    /// Remove the document in `slot`.
    Remove { slot: u32, cause: RemoveCause },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RemoveCause {
    /// A client deleted it.
    Deleted,
    /// The purge removed it after it expired.
    Expired,
}

impl ShardState {
    fn new(now: Millis) -> Self {
        ShardState {
            collections: HashMap::new(),
            docs: DocSlab::default(),
            wheel: TimerWheel::new(now),
            pending: VecDeque::new(),
            heads: QueueHeads::default(),
            client_lsn: Lsn::ZERO,
            last_now: now,
        }
    }

    /// The shard's reading of the clock, taken under its lock. Under the lock: a request that
    /// waited for it cannot act on a document that expired while it waited. It holds through
    /// small steps of the wall clock back (up to [`MAX_CLOCK_STEP_BACK`]), so such a step
    /// cannot revive a document that just expired; further behind, the shard follows the wall
    /// clock, so a single reading (or a stored write) from far in the future cannot freeze
    /// shard time. By then the purge has made what expired in the gap final, up to its lag.
    pub(super) fn now(&mut self, clock: &dyn Clock) -> Millis {
        let wall = clock.now();
        if wall >= self.last_now {
            self.last_now = wall;
        } else if self.last_now - wall > MAX_CLOCK_STEP_BACK {
            tracing::warn!(
                behind_ms = self.last_now - wall,
                "the wall clock is far behind the latest time this shard acted on; following it back"
            );
            self.last_now = wall;
        }
        self.last_now
    }

    /// Moves shard time forward to at least `at`.
    pub(super) fn advance_to(&mut self, at: Millis) {
        self.last_now = self.last_now.max(at);
    }

    /// Installs a collection's new rules as of `at` (no earlier than this shard's time).
    /// Nothing is marked document by document: the rules' expired marks already hold what the
    /// old default made final. Returns whether TTL was just turned on, in which case own-ttl
    /// documents need timers ([`Shard::time_own_ttls`]).
    pub(super) fn set_rules(
        &mut self,
        uid: CollectionUid,
        rules: Rules,
        at: Millis,
        lsn: Lsn,
    ) -> bool {
        self.advance_to(at);
        let Some(cs) = self.collections.get_mut(&uid) else {
            return false;
        };
        let turned_on = !cs.rules.default_ttl.is_on() && rules.default_ttl.is_on();
        cs.rules = rules;
        cs.rules_changed_at = at;
        cs.settings_lsn = lsn;
        cs.refresh_head(&mut self.heads);
        turned_on
    }

    /// The one path every document change takes, client writes and purge alike: storage first
    /// (one batch), then the index and expiry bookkeeping, so a storage failure changes nothing.
    /// Change events and request charges belong here when they arrive. Returns the earliest new
    /// expiry deadline, for waking the purge.
    ///
    /// Client writes are acknowledged once their position is durable, by their caller.
    /// Documents the purge removes stay in the index, dead, until [`ShardState::forget_purged`]
    /// is told the delete is durable: the engine never drops what storage could still bring back.
    pub(super) fn commit(
        &mut self,
        store: &dyn ShardStore,
        changes: &[Change],
        metrics: &EngineMetrics,
        versions: &AtomicU64,
    ) -> Result<(Option<Millis>, Lsn), StorageError> {
        if changes.is_empty() {
            return Ok((None, Lsn::ZERO));
        }
        let writes: Vec<DocumentWrite<'_>> = changes
            .iter()
            .map(|change| match change {
                Change::Put { record, .. } => DocumentWrite::Put(record),
                Change::Remove { slot, .. } => {
                    let meta = self.docs.get(*slot);
                    DocumentWrite::Delete {
                        collection: meta.collection,
                        key: &meta.key,
                    }
                }
            })
            .collect();
        let lsn = store.write(WriteBatch {
            writes: &writes,
            versions_below: versions.load(Ordering::SeqCst),
        })?;
        drop(writes);

        let mut earliest: Option<Millis> = None;
        for change in changes {
            match change {
                Change::Put { slot, record } => {
                    let cs = self
                        .collections
                        .get_mut(&record.collection)
                        .expect("callers hold a collection shard");
                    let doc = match *slot {
                        Some(slot) => {
                            let old = self.docs.get(slot);
                            if !old.is_visible(&cs.rules, record.last_write) {
                                // Overwriting an expired document that the purge had not reached.
                                metrics.expired.inc();
                            }
                            detach(&mut self.docs, &mut self.wheel, cs, slot);
                            let r = self.docs.bump(slot);
                            let meta = self.docs.get_mut(slot);
                            meta.last_write = record.last_write;
                            meta.version = record.version;
                            meta.lsn = lsn;
                            meta.ttl = record.ttl;
                            meta.dead = false;
                            r
                        }
                        None => {
                            let r = self.docs.insert(DocMeta {
                                collection: record.collection,
                                key: record.key.clone(),
                                last_write: record.last_write,
                                version: record.version,
                                lsn,
                                ttl: record.ttl,
                                tracking: Tracking::None,
                                dead: false,
                            });
                            cs.index.insert(record.key.clone(), r.slot);
                            r
                        }
                    };
                    if let Some(deadline) =
                        attach(&mut self.docs, &mut self.wheel, &mut self.heads, cs, doc)
                    {
                        earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
                    }
                }
                Change::Remove { slot, cause } => {
                    let collection = self.docs.get(*slot).collection;
                    // Documents of a collection being deleted belong to its cleanup, which
                    // frees their slots; nothing else removes them.
                    let cs = self
                        .collections
                        .get_mut(&collection)
                        .expect("removals name live collections");
                    detach(&mut self.docs, &mut self.wheel, cs, *slot);
                    if *cause == RemoveCause::Deleted {
                        cs.index.remove(&self.docs.get(*slot).key);
                        self.docs.remove(*slot);
                    }
                }
            }
        }
        Ok((earliest, lsn))
    }

    /// Forgets documents the purge deleted, now that the delete is durable, unless their slot
    /// has moved on (every write or free of a slot bumps its generation: an overwrite since, or
    /// their collection's deletion, has taken them over). Records the purge lag at `now`.
    pub(super) fn forget_purged(
        &mut self,
        purged: &[(SlotRef, Millis)],
        now: Millis,
        metrics: &EngineMetrics,
    ) {
        for &(r, expired_at) in purged {
            if !self.docs.is_current(r) {
                continue;
            }
            let Some(cs) = self.collections.get_mut(&self.docs.get(r.slot).collection) else {
                continue;
            };
            cs.index.remove(&self.docs.get(r.slot).key);
            self.docs.remove(r.slot);
            metrics.purged.inc();
            metrics.expired.inc();
            metrics
                .purge_lag
                .observe(now.saturating_sub(expired_at) as f64 / 1_000.0);
        }
    }

    /// Bytes of expiry bookkeeping: wheel nodes, inherit-queue entries and the timer handles
    /// documents hold, counting spare capacity.
    pub(super) fn bookkeeping_bytes(&self) -> usize {
        let queues: usize = self
            .collections
            .values()
            .map(|c| c.inherit.allocated_bytes())
            .sum();
        self.wheel.allocated_bytes() + queues + self.wheel.len() * mem::size_of::<TimerHandle>()
    }

    /// Documents whose expiry is tracked (timer or inherit queue).
    pub(super) fn tracked_documents(&self) -> usize {
        self.wheel.len()
            + self
                .collections
                .values()
                .map(|c| c.inherit.live())
                .sum::<usize>()
    }
}

/// Starts tracking a document's expiry according to its collection's current rules. Documents
/// that inherit always join the queue (even while TTL is off or -1) so that any later default
/// applies to them in write order; own-ttl documents get a timer only while TTL is on.
pub(super) fn attach(
    docs: &mut DocSlab,
    wheel: &mut TimerWheel,
    heads: &mut QueueHeads,
    cs: &mut CollectionShard,
    r: SlotRef,
) -> Option<Millis> {
    let meta = docs.get_mut(r.slot);
    debug_assert_eq!(meta.tracking, Tracking::None);
    match meta.ttl {
        None => {
            cs.inherit.push(meta.last_write, r);
            meta.tracking = Tracking::Queue;
            let due = cs.inheritor_due(meta.last_write);
            if due.is_some_and(|d| cs.head_due.is_none_or(|h| d < h)) {
                cs.refresh_head(heads);
            }
            due
        }
        Some(DocumentTtl::Never) => None,
        Some(DocumentTtl::After(_)) => time_own_ttl(wheel, meta, r.slot, &cs.rules),
    }
}

/// Stops tracking a document's expiry.
pub(super) fn detach(
    docs: &mut DocSlab,
    wheel: &mut TimerWheel,
    cs: &mut CollectionShard,
    slot: u32,
) {
    let meta = docs.get_mut(slot);
    match mem::replace(&mut meta.tracking, Tracking::None) {
        Tracking::None | Tracking::Unscheduled => {}
        Tracking::Timer(handle) => {
            wheel.cancel(handle);
        }
        Tracking::Queue => {
            let docs = &*docs;
            cs.inherit
                .forget_one(|r| docs.is_current(r) && docs.get(r.slot).tracking == Tracking::Queue);
        }
    }
}

impl Shard {
    pub(crate) fn new(
        store: Arc<dyn ShardStore>,
        metrics: Arc<EngineMetrics>,
        versions: Arc<AtomicU64>,
        now: Millis,
    ) -> Self {
        Shard {
            state: Mutex::new(ShardState::new(now)),
            store,
            metrics,
            purge_wake: Notify::new(),
            purge_sleeps_until: AtomicU64::new(u64::MAX),
            backlog: AtomicU64::new(0),
            versions,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ShardState> {
        self.state.lock()
    }

    /// Wakes the purge task if `deadline` is earlier than what it sleeps until. Called after
    /// the shard lock is released, so the woken task does not wait for it.
    pub(super) fn wake_purge_for(&self, deadline: Option<Millis>) {
        if deadline.is_some_and(|d| d < self.purge_sleeps_until.load(Ordering::Acquire)) {
            self.purge_wake.notify_one();
        }
    }

    pub(crate) fn add_collection(&self, uid: CollectionUid, rules: Rules, clock: &dyn Clock) {
        let mut state = self.lock();
        let now = state.now(clock);
        state.collections.insert(
            uid,
            CollectionShard {
                uid,
                rules,
                rules_changed_at: now,
                settings_lsn: Lsn::ZERO,
                index: HashMap::new(),
                inherit: InheritQueue::default(),
                head_due: None,
            },
        );
    }

    /// Creates, upserts or replaces a document.
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per part of a write request"
    )]
    pub(crate) fn put(
        &self,
        info: &CollectionInfo,
        key: DocKey,
        body: Bytes,
        ttl: Option<DocumentTtl>,
        mode: WriteMode,
        if_match: Option<&str>,
        version: u64,
        clock: &dyn Clock,
    ) -> Outcome<(DocumentView, bool)> {
        let mut state = self.lock();
        let st = &mut *state;
        let now = st.now(clock);
        let Some(cs) = st.collections.get(&info.uid) else {
            return Outcome::failed(collection_gone(info));
        };
        // A refusal reflects what this shard holds: it settles like a read of it.
        let seen = observed(st, cs);
        let slot = cs.index.get(&key).copied();
        let live = slot.filter(|&s| st.docs.get(s).is_visible(&cs.rules, now));
        match (mode, live) {
            (WriteMode::Create, Some(_)) => {
                return Outcome::new(
                    Err(Error::DocumentExists {
                        id: key.id.to_string(),
                        partition_key: key.partition_key,
                    }),
                    seen,
                );
            }
            (WriteMode::Replace, None) => {
                return Outcome::new(
                    Err(Error::DocumentNotFound {
                        id: key.id.to_string(),
                        partition_key: key.partition_key,
                    }),
                    seen,
                );
            }
            _ => {}
        }
        if let Err(e) = check_if_match(if_match, live.map(|s| st.docs.get(s)), &key) {
            return Outcome::new(Err(e), seen);
        }
        let created = live.is_none();
        let record = StoredDocument {
            collection: info.uid,
            key,
            body,
            last_write: now,
            version,
            ttl,
        };
        self.write_version(state, slot, record)
            .map(|view| (view, created))
    }

    /// Stores a new version of a document through the commit path, then views it as of its
    /// write: the common end of put and touch.
    fn write_version(
        &self,
        mut state: MutexGuard<'_, ShardState>,
        slot: Option<u32>,
        record: StoredDocument,
    ) -> Outcome<DocumentView> {
        let st = &mut *state;
        let record = Arc::new(record);
        let change = Change::Put {
            slot,
            record: record.clone(),
        };
        let (deadline, lsn) =
            match st.commit(&*self.store, &[change], &self.metrics, &self.versions) {
                Ok(done) => done,
                Err(e) => return Outcome::failed(e),
            };
        st.client_lsn = lsn;
        let cs = &st.collections[&record.collection];
        let view = view(&record, cs.rules.default_ttl, record.last_write);
        let settle_at = lsn.max(cs.settings_lsn);
        drop(state);
        self.wake_purge_for(deadline);
        Outcome::new(Ok(view), settle_at)
    }

    /// Rewrites a live document with its current body: a write that restarts its TTL clock.
    /// The body is read outside the lock and the write made only if the document is still that
    /// version (else it is read again).
    pub(crate) fn touch(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        version: u64,
        clock: &dyn Clock,
    ) -> Outcome<DocumentView> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let read = if attempt < MAX_OPTIMISTIC_ATTEMPTS {
                match self.read(info, key, clock) {
                    Outcome {
                        result: Ok(view), ..
                    } => Some(view),
                    failed => return failed,
                }
            } else {
                None
            };
            let mut state = self.lock();
            let st = &mut *state;
            let now = st.now(clock);
            let slot = match writable_slot(st, info, key, if_match, now) {
                Ok(slot) => slot,
                Err((e, seen)) => return Outcome::new(Err(e), seen),
            };
            let current = match read {
                Some(view) if view.etag.0 == st.docs.get(slot).version => (view.body, view.ttl),
                // Written since it was read: read it again.
                Some(_) => continue,
                // Rewritten under every attempt so far: fetch while holding the lock, once.
                None => match self.store.get(info.uid, key) {
                    Ok(Some(record)) => (record.body.clone(), record.ttl),
                    Ok(None) => return Outcome::failed(missing_record(key)),
                    Err(e) => return Outcome::failed(e),
                },
            };
            let record = StoredDocument {
                collection: info.uid,
                key: key.clone(),
                body: current.0,
                last_write: now,
                version,
                ttl: current.1,
            };
            return self.write_version(state, Some(slot), record);
        }
    }

    /// Deletes a live document.
    pub(crate) fn delete(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        clock: &dyn Clock,
    ) -> Outcome<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let now = st.now(clock);
        let slot = match writable_slot(st, info, key, if_match, now) {
            Ok(slot) => slot,
            Err((e, seen)) => return Outcome::new(Err(e), seen),
        };
        let change = Change::Remove {
            slot,
            cause: RemoveCause::Deleted,
        };
        match st.commit(&*self.store, &[change], &self.metrics, &self.versions) {
            Ok((_, lsn)) => {
                st.client_lsn = lsn;
                Outcome::new(Ok(()), lsn.max(st.collections[&info.uid].settings_lsn))
            }
            Err(e) => Outcome::failed(e),
        }
    }

    /// Reads a live document. Judged under the lock, its body fetched from storage outside
    /// it, and accepted if it is the version judged (else judged again).
    pub(crate) fn read(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        clock: &dyn Clock,
    ) -> Outcome<DocumentView> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (version, now, default_ttl, settle_at) = {
                let mut state = self.lock();
                let st = &mut *state;
                let now = st.now(clock);
                let slot = match live_slot(st, info, key, now) {
                    Ok(slot) => slot,
                    Err((e, seen)) => return Outcome::new(Err(e), seen),
                };
                let meta = st.docs.get(slot);
                let cs = &st.collections[&info.uid];
                if attempt >= MAX_OPTIMISTIC_ATTEMPTS {
                    // Rewritten under every read so far: fetch while holding the lock, once.
                    let record = match self.store.get(info.uid, key) {
                        Ok(Some(record)) => record,
                        Ok(None) => return Outcome::failed(missing_record(key)),
                        Err(e) => return Outcome::failed(e),
                    };
                    let view = view(&record, cs.rules.default_ttl, now);
                    return Outcome::new(Ok(view), meta.lsn.max(cs.settings_lsn));
                }
                (
                    meta.version,
                    now,
                    cs.rules.default_ttl,
                    meta.lsn.max(cs.settings_lsn),
                )
            };
            match self.store.get(info.uid, key) {
                Ok(Some(record)) if record.version == version => {
                    return Outcome::new(Ok(view(&record, default_ttl, now)), settle_at);
                }
                // Rewritten, deleted or purged since it was judged: judge it again.
                Ok(_) => {}
                Err(e) => return Outcome::failed(e),
            }
        }
    }
}

/// Attempts at an optimistic read (judge under the lock, fetch outside it) before one fetch is
/// made under the lock: only a document rewritten during every attempt gets there.
const MAX_OPTIMISTIC_ATTEMPTS: usize = 4;

/// The position an answer about what a collection's part of this shard holds (absent, a
/// conflict, a stale etag) must wait for: it may reflect a client write or the rules, not yet
/// durable.
pub(super) fn observed(st: &ShardState, cs: &CollectionShard) -> Lsn {
    st.client_lsn.max(cs.settings_lsn)
}

/// The slot of the live document at `key` if `if_match` names its version; else the refusal,
/// with the position it must wait for (touch and delete start here).
fn writable_slot(
    st: &ShardState,
    info: &CollectionInfo,
    key: &DocKey,
    if_match: Option<&str>,
    now: Millis,
) -> Result<u32, (Error, Lsn)> {
    let slot = live_slot(st, info, key, now)?;
    check_if_match(if_match, Some(st.docs.get(slot)), key)
        .map_err(|e| (e, observed(st, &st.collections[&info.uid])))?;
    Ok(slot)
}

/// The slot of the live document at `key`; or NOT_FOUND (or the collection gone) with the
/// position a client told so must wait for.
pub(super) fn live_slot(
    st: &ShardState,
    info: &CollectionInfo,
    key: &DocKey,
    now: Millis,
) -> Result<u32, (Error, Lsn)> {
    let Some(cs) = st.collections.get(&info.uid) else {
        return Err((collection_gone(info), Lsn::ZERO));
    };
    cs.index
        .get(key)
        .copied()
        .filter(|&s| st.docs.get(s).is_visible(&cs.rules, now))
        .ok_or_else(|| {
            let e = Error::DocumentNotFound {
                id: key.id.to_string(),
                partition_key: key.partition_key.clone(),
            };
            (e, observed(st, cs))
        })
}

fn check_if_match(
    if_match: Option<&str>,
    live: Option<&DocMeta>,
    key: &DocKey,
) -> Result<(), Error> {
    match if_match {
        None => Ok(()),
        Some(etag) if live.is_some_and(|m| Etag(m.version).matches(etag)) => Ok(()),
        Some(etag) => Err(Error::PreconditionFailed {
            id: key.id.to_string(),
            if_match: etag.to_owned(),
        }),
    }
}

/// The collection was deleted between the catalog lookup and taking the shard lock.
pub(super) fn collection_gone(info: &CollectionInfo) -> Error {
    Error::CollectionNotFound {
        database: info.database.to_string(),
        collection: info.id.to_string(),
    }
}

fn missing_record(key: &DocKey) -> Error {
    Error::Storage(StorageError::new(format!(
        "the index has document '{}' in partition {} but storage does not",
        key.id, key.partition_key
    )))
}

pub(super) fn view(record: &StoredDocument, default_ttl: DefaultTtl, now: Millis) -> DocumentView {
    DocumentView {
        key: record.key.clone(),
        body: record.body.clone(),
        last_write: record.last_write,
        etag: Etag(record.version),
        ttl: record.ttl,
        expires_at: ttl::expires_at(record.last_write, record.ttl, default_ttl),
        read_at: now,
    }
}
