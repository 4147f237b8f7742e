//! One shard of the engine: the documents of the partitions that hash to it, their expiry
//! bookkeeping and the single path through which every change to them is made.
//!
//! A shard's lock makes check-and-write atomic (existence, etag, expiry). Document operations
//! and the purge take one shard lock at a time; only a settings change holds them all, in
//! index order. Writes are applied to storage under the lock (an append, never a wait for the
//! disk), so one shard's writes never race; durability is awaited after it is released.

mod batch;
mod documents;
mod feed_log;
mod feed_scan;
mod index_batch;
mod log_appends;
mod optimistic;
pub(super) mod purge_batch;
mod rebuild;
mod replicated;
mod slab;
mod snapshot;

pub use replicated::ReplicatedCommit;
pub use snapshot::ShardSnapshot;
mod state;
mod tracking;

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
    CollectionInfo, CollectionUid, IndexPaths, IndexingMode, MustLive, Outcome,
    clock::{Clock, LeaseClock, Millis},
    document::{DocumentView, Etag, WriteMode},
    error::Error,
    expiry::{
        inherit_queue::{InheritQueue, SlotRef},
        queue_heads::QueueHeads,
        wheel::{MAX_PAYLOAD, TimerHandle, TimerWheel},
    },
    idempotency::{IdempotencyConfig, RequestTable},
    index::path_stats::{BitChange, OrderSupport, PathBits, PathStats},
    metrics::{EngineMetrics, ExpiryStats},
    ttl::{self, DefaultTtl, DocumentTtl, Rules},
};
use crate::storage::{
    DocKey, DocumentWrite, IndexUpdate, LogRecord, Lsn, RequestRecord, ShardSet, ShardStore,
    StorageError, StoredDocument, Term, WriteBatch,
};

#[cfg(test)]
pub(super) use self::optimistic::{
    OPTIMISTIC_ATTEMPTS,
    tests::{HookGuard, after_each_read},
};
#[cfg(test)]
pub(super) use self::state::Census;
pub(super) use self::{
    documents::{collection_gone, observed, view},
    feed_scan::Reading,
    optimistic::Keyed,
    slab::{DocMeta, DocSlab, TermsRef, Tracking},
    state::{
        Change, CollectionShard, GivenLog, IndexChange, IndexSettings, RemoveCause, ShardRules,
        ShardState,
    },
    tracking::{attach, detach, time_own_ttl},
};

/// How far the wall clock may step back while shard time holds still (see [`ShardState::now`]).
pub(crate) const MAX_CLOCK_STEP_BACK: Millis = 5_000;

/// A shard: state behind a lock, and the signal its purge task sleeps on.
#[derive(Debug)]
pub(crate) struct Shard {
    state: Mutex<ShardState>,
    store: Arc<dyn ShardStore>,
    metrics: Arc<EngineMetrics>,
    /// Wakes the purge task when an earlier deadline appears.
    purge_wake: Notify,
    /// The instant the purge task sleeps until (`u64::MAX`: no deadline).
    purge_sleeps_until: AtomicU64,
    /// Due entries the last purge pass left behind.
    backlog: AtomicU64,
    /// The engine's version counter: every version handed out is below its value.
    versions: Arc<AtomicU64>,
    /// Wakes the engine's background indexer (shared by every shard).
    indexer_wake: Arc<Notify>,
    /// Every change log position up to this one is durable (as far as a reader has seen).
    durable_log: AtomicU64,
    /// Its index among the engine's shards (in cluster mode, its partition).
    index: usize,
    /// What its lease end is read against (cluster mode).
    lease_clock: Option<Arc<dyn LeaseClock>>,
    /// This shard, for the durability wait of what it answers (see [`crate::storage::Storage::durable_in`]).
    set: ShardSet,
    /// Its change log holds nothing below this position: a snapshot was loaded there
    /// (cluster mode), and the records before it are not this copy's.
    history_from: AtomicU64,
}

impl Shard {
    pub(crate) fn new(
        (index, store, lease_clock): (usize, Arc<dyn ShardStore>, Option<Arc<dyn LeaseClock>>),
        metrics: Arc<EngineMetrics>,
        versions: Arc<AtomicU64>,
        indexer_wake: Arc<Notify>,
        (now, idempotency): (Millis, IdempotencyConfig),
    ) -> Self {
        Shard {
            state: Mutex::new(ShardState::new(now, idempotency)),
            store,
            metrics,
            purge_wake: Notify::new(),
            purge_sleeps_until: AtomicU64::new(u64::MAX),
            backlog: AtomicU64::new(0),
            versions,
            indexer_wake,
            durable_log: AtomicU64::new(0),
            index,
            lease_clock,
            set: ShardSet::one(index),
            history_from: AtomicU64::new(0),
        }
    }

    /// The shard's state. Engine code outside this module goes through `Shard`'s methods;
    /// only the engine's tests lock it themselves, to inspect the bookkeeping.
    pub(super) fn lock(&self) -> MutexGuard<'_, ShardState> {
        self.state.lock()
    }

    /// Wakes the purge task: anything may be due now.
    /// The shard's time now: the clock's reading, never behind one the shard acted on.
    pub(crate) fn reading(&self, clock: &dyn Clock) -> Millis {
        self.lock().now(clock)
    }

    pub(crate) fn wake_purge(&self) {
        self.purge_wake.notify_one();
    }

    /// Removes every stored document of a collection the engine no longer writes to.
    pub(crate) fn drop_stored_collection(&self, uid: CollectionUid) -> Result<(), StorageError> {
        self.store.drop_collection(uid)
    }

    /// Adds this shard's expiry bookkeeping to `stats` (the lock held briefly).
    pub(crate) fn add_expiry_stats(&self, stats: &mut ExpiryStats) {
        stats.purge_backlog += self.backlog.load(Ordering::Relaxed);
        let state = self.lock();
        stats.documents += state.docs.len() as u64;
        stats.tracked_documents += state.tracked_documents() as u64;
        stats.bookkeeping_bytes += state.bookkeeping_bytes() as u64;
    }

    /// Switches a collection's expiry rules in every shard at one instant, under all the shard
    /// locks at once (taken in index order; only catalog changes, which the engine serialises,
    /// hold more than one), so that no shard judges by the old rules after another switched.
    /// `change` is given that instant and returns what it decided, what the shards install,
    /// and the position of its durable record; the hold is a few assignments per shard and
    /// whatever `change` does. Returns its decision and, per shard, whether TTL was turned on.
    pub(crate) fn switch_rules<T, E>(
        shards: &[Arc<Shard>],
        (clock, given): (&dyn Clock, Option<Millis>),
        uid: CollectionUid,
        change: impl FnOnce(Millis) -> Result<(T, ShardRules, Lsn), E>,
    ) -> Result<(T, Vec<bool>), E> {
        let mut states: Vec<_> = shards.iter().map(|s| s.lock()).collect();
        let now = states
            .iter_mut()
            .map(|st| st.now(clock))
            .max()
            .unwrap_or_default();
        // An instant given (a cluster's catalog log) is every node's: the same on each.
        let at = given.unwrap_or(now);
        let (decided, new, lsn) = change(at)?;
        let turned_on = states
            .iter_mut()
            .map(|st| st.set_rules(uid, &new, at, lsn))
            .collect();
        Ok((decided, turned_on))
    }

    /// Wakes the purge task if `deadline` is earlier than what it sleeps until. Called after
    /// the shard lock is released, so the woken task does not wait for it.
    pub(super) fn wake_purge_for(&self, deadline: Option<Millis>) {
        if deadline.is_some_and(|d| d < self.purge_sleeps_until.load(Ordering::Acquire)) {
            self.purge_wake.notify_one();
        }
    }

    pub(crate) fn add_collection(
        &self,
        info: &CollectionInfo,
        clock: &dyn Clock,
        (logged, feed_signal): (bool, &Arc<tokio::sync::watch::Sender<()>>),
    ) {
        let mut state = self.lock();
        let now = state.now(clock);
        let uid = info.uid;
        state.collections.insert(
            uid,
            CollectionShard {
                uid,
                rules: info.rules(),
                policy: info.indexed_paths_arc(),
                lazy: info.settings.indexing_mode() == IndexingMode::Lazy,
                must_live: info.must_live.clone(),
                paths: PathStats::default(),
                indexed_docs: 0,
                stale_docs: 0,
                // A collection loaded with an incomplete index resumes its rebuild.
                rebuild_from: (!info.index_complete).then_some(0),
                purged_docs: 0,
                rules_changed_at: now,
                settings_lsn: Lsn::ZERO,
                index: HashMap::new(),
                inherit: InheritQueue::default(),
                head_due: None,
                feed: logged,
                feed_signal: feed_signal.clone(),
                log_tip: (0, Lsn::ZERO),
            },
        );
    }
}
