//! What a shard's lock guards: its collections' parts, document slots, timers and queues,
//! and the commit path every change goes through.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use super::{log_appends::LogAppends, purge_batch::mark_due};
use crate::engine::{
    change_feed::ChangeOp,
    feed::FeedScope,
    request_charge::{RequestCharge, changed_terms},
};
use std::collections::HashSet;

#[derive(Debug)]
pub(crate) struct ShardState {
    pub(super) collections: HashMap<CollectionUid, CollectionShard>,
    pub(super) docs: DocSlab,
    pub(super) wheel: TimerWheel,
    /// Documents known to be expired (marked dead) and waiting to be purged, with their expiry
    /// instants. Entries go stale when the document is written again.
    pub(super) pending: VecDeque<(SlotRef, Millis)>,
    /// Slots of documents the background indexer owes an update ([`DocMeta::stale`]); a slot
    /// whose document is no longer stale is skipped.
    pub(super) unindexed: VecDeque<u32>,
    /// When each collection's inherit queue is next due: the purge serves the earliest first.
    pub(super) heads: QueueHeads,
    /// The position of the latest client write to this shard: an answer that something is
    /// absent (or differs) settles there, since it may reflect a delete not yet durable.
    pub(super) client_lsn: Lsn,
    /// The latest clock reading this shard acted on; see [`ShardState::now`].
    last_now: Millis,
    /// Requests remembered by idempotency key (see [`crate::engine::idempotency`]).
    pub(in crate::engine) requests: RequestTable,
    /// The last change log position this shard appended at (see [`LogAppends`]).
    pub(super) log_seq: u64,
    /// It follows an owner elsewhere (cluster mode): its purge does not run, and nothing is
    /// decided by its clock (see `replicated.rs`).
    pub(super) following: bool,
    /// Its partition's log does not continue the history the cluster acknowledged (cluster
    /// mode): why. It serves nothing until an operator acts (docs/cluster.md, "Repair").
    pub(super) diverged: Option<std::sync::Arc<str>>,
    /// While diverged: its owner may be re-basing the log on its copy (the request is
    /// answered as retryable), rather than waiting for an operator.
    pub(super) repairing: bool,
    /// Its partition lease ends at this reading of the engine's lease clock (cluster mode);
    /// `None`: no lease bounds it.
    pub(super) serve_until: Option<u64>,
    /// The largest wall clock reading its lease lets it act on (cluster mode: the
    /// `lease_until` its owner last wrote, which the next owner starts its time from, so that
    /// nothing this owner judged expired is alive there). `None`: no cap; with one, shard time
    /// never follows the wall clock back either.
    pub(super) time_cap: Option<Millis>,
    /// Where the latest commit that appended to the change log is in storage.
    pub(super) log_lsn: Lsn,
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
    /// The paths writes index under (`None`: the collection does not index). Replaced with
    /// the rules, at the same instant.
    pub(super) policy: Option<Arc<IndexPaths>>,
    /// What the stored index holds per path (see [`PathStats`]).
    pub(super) paths: PathStats,
    /// Writes leave index entries to the background indexer (`lazy` mode).
    pub(super) lazy: bool,
    /// Kinds of documents that must say `"ttl": -1`. Writes are judged by this copy under the
    /// lock, in the hold that commits them, so that none stores what rules set before its
    /// commit refuse; replaced with the rules, at the same instant.
    pub(super) must_live: Arc<MustLive>,
    /// Documents with index entries.
    pub(super) indexed_docs: u64,
    /// Documents marked [`DocMeta::stale`].
    pub(super) stale_docs: u64,
    /// A rebuild's walk over the slots: the next slot whose document (of this collection) it
    /// marks stale. `None`: not rebuilding, or the walk is done.
    pub(super) rebuild_from: Option<u32>,
    /// Documents the purge deleted whose delete is not durable yet (still in `index`).
    pub(super) purged_docs: u64,
    /// This collection's entry in [`ShardState::heads`].
    pub(super) head_due: Option<Millis>,
    /// Its changes are logged: for its change feed, or because every commit is (cluster
    /// mode). Replaced with the rules, at the same instant.
    pub(super) feed: bool,
    /// Tells the collection's feed readers (in every shard) that records were appended.
    pub(super) feed_signal: Arc<tokio::sync::watch::Sender<()>>,
    /// The last position this shard appended a record of this collection at, and where
    /// that commit is in storage: readers of a quiet collection do not wake for others'.
    pub(super) log_tip: (u64, Lsn),
}

impl CollectionShard {
    /// The document slots of a collection detached from its shard, for
    /// [`Shard::free_detached`](super::Shard::free_detached) to free in batches.
    pub(in crate::engine) fn into_slots(self) -> std::collections::hash_map::IntoIter<DocKey, u32> {
        self.index.into_iter()
    }

    /// When an inheritor written at `written` expires under these rules (`None`: never).
    pub(in crate::engine) fn inheritor_due(&self, written: Millis) -> Option<Millis> {
        if self.rules.expired.covers(written, None) {
            return Some(self.rules_changed_at);
        }
        match self.rules.default_ttl {
            DefaultTtl::After(n) => {
                Some((written + n.millis()).max(self.rules.expired.default_since))
            }
            DefaultTtl::Off | DefaultTtl::NoDefault => None,
        }
    }

    /// Records in `heads` when this collection's inherit queue is next due. Its head may be a
    /// stale entry: the recorded instant is then early, never late.
    pub(in crate::engine) fn refresh_head(&mut self, heads: &mut QueueHeads) {
        let due = self
            .inherit
            .front()
            .and_then(|(written, _)| self.inheritor_due(written));
        heads.update(self.uid, &mut self.head_due, due);
    }
}

/// What a new version of a document does to its index entries.
#[derive(Debug)]
pub(in crate::engine) enum IndexChange {
    /// They stay (the same body, or a collection that does not index).
    Unchanged,
    /// They change from the first terms to the second, in the same batch.
    Replace(Vec<Term>, Vec<Term>),
    /// They stay, and the background indexer owes the document an update (`lazy` mode).
    Owed,
}

/// A change to one document, as the commit path sees it.
#[derive(Debug)]
pub(in crate::engine) enum Change {
    /// Store this version; `slot` is the slot of the previous version, live or expired.
    /// `patch`: a patch made it (its change log record says so).
    Put {
        slot: Option<u32>,
        record: Arc<StoredDocument>,
        index: IndexChange,
        patch: bool,
    },
    /// Log the expiry, at instant `at`, of the document in `slot` (dead already): the purge's
    /// record of what it found due, appended before the slower delete.
    Expire { slot: u32, at: Millis },
    /// Replace the index entries of the document in `slot` (its current version) from the
    /// first terms to the second: the background indexer's write.
    Index {
        slot: u32,
        old: Vec<Term>,
        new: Vec<Term>,
    },
    /// Remove the document in `slot`, with the index entries of `terms` (its stored terms).
    Remove {
        slot: u32,
        cause: RemoveCause,
        terms: Vec<Term>,
    },
    /// Versions were handed out for documents nothing stores (a batch created and deleted
    /// them): storage keeps the version floor, so that none is handed out again after a
    /// restart.
    KeepFloor,
    /// Remember the request that made the other changes, by its idempotency key (`scope.id`).
    Remember {
        collection: CollectionUid,
        scope: DocKey,
        record: RequestRecord,
    },
}

impl Change {
    /// What this change costs the client whose request made it (see [`RequestCharge`]): a
    /// touch (same body, same entries) less than a rewrite; a lazy collection's write without
    /// the terms its indexer writes later; the purge's and the indexer's changes nothing.
    pub(in crate::engine) fn charge(&self) -> RequestCharge {
        match self {
            Change::Put { record, index, .. } => {
                let bytes = record.body.len();
                match index {
                    IndexChange::Unchanged => RequestCharge::touch(bytes),
                    IndexChange::Owed => RequestCharge::write(bytes, 0),
                    IndexChange::Replace(old, new) => {
                        RequestCharge::write(bytes, changed_terms(old, new))
                    }
                }
            }
            Change::Remove {
                cause: RemoveCause::Deleted,
                terms,
                ..
            } => RequestCharge::delete(terms.len()),
            Change::Remove {
                cause: RemoveCause::Expired { .. },
                ..
            }
            | Change::Expire { .. }
            | Change::Index { .. }
            | Change::KeepFloor
            | Change::Remember { .. } => RequestCharge::ZERO,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) enum RemoveCause {
    /// A client deleted it.
    Deleted,
    /// The purge removed it after it expired, at instant `at`.
    Expired { at: Millis },
}

/// An owner's change log records for a follower's commit (see [`ShardState::commit_logged`]).
#[derive(Debug)]
pub(in crate::engine) struct GivenLog {
    /// The commit's last position (records of deleted collections are passed over: the last
    /// record given may be before it).
    pub(in crate::engine) last: u64,
    /// The records, by collection, at their positions, in order.
    pub(in crate::engine) records: Vec<(CollectionUid, u64, LogRecord)>,
    /// Each change's record position (0: none), as [`ShardState::log_change`] would give.
    pub(in crate::engine) seqs: Vec<u64>,
    /// The documents whose expiry the records log (slot, position).
    pub(in crate::engine) expired: Vec<(u32, u64)>,
}

/// Expiries a commit logs before its own changes, at most (see [`ShardState::drain_due`]).
const DRAIN_BUDGET: usize = 256;

/// What a settings change installs in each shard, at one instant.
#[derive(Debug, Clone)]
pub(crate) struct ShardRules {
    pub(crate) rules: Rules,
    pub(crate) index: IndexSettings,
    pub(crate) must_live: Arc<MustLive>,
    /// The collection has a change feed.
    pub(crate) feed: bool,
}

impl ShardState {
    pub(super) fn new(now: Millis, idempotency: IdempotencyConfig) -> Self {
        ShardState {
            requests: RequestTable::new(idempotency),
            collections: HashMap::new(),
            unindexed: VecDeque::new(),
            docs: DocSlab::default(),
            wheel: TimerWheel::new(now),
            pending: VecDeque::new(),
            heads: QueueHeads::default(),
            client_lsn: Lsn::ZERO,
            last_now: now,
            log_seq: 0,
            following: false,
            diverged: None,
            repairing: false,
            serve_until: None,
            time_cap: None,
            log_lsn: Lsn::ZERO,
        }
    }

    /// The shard's reading of the clock, taken under its lock. Under the lock: a request that
    /// waited for it cannot act on a document that expired while it waited. It holds through
    /// small steps of the wall clock back (up to [`MAX_CLOCK_STEP_BACK`]), so such a step
    /// cannot revive a document that just expired; further behind, the shard follows the wall
    /// clock, so a single reading (or a stored write) from far in the future cannot freeze
    /// shard time. By then the purge has made what expired in the gap final, up to its lag.
    pub(in crate::engine) fn now(&mut self, clock: &dyn Clock) -> Millis {
        let wall = clock.now().min(self.time_cap.unwrap_or(Millis::MAX));
        if wall >= self.last_now {
            self.last_now = wall;
        } else if self.time_cap.is_none() && self.last_now - wall > MAX_CLOCK_STEP_BACK {
            tracing::warn!(
                behind_ms = self.last_now - wall,
                "the wall clock is far behind the latest time this shard acted on; following it back"
            );
            self.last_now = wall;
        }
        self.last_now
    }

    /// Moves shard time forward to at least `at`.
    pub(in crate::engine) fn advance_to(&mut self, at: Millis) {
        self.last_now = self.last_now.max(at);
    }

    /// Installs a collection's new rules as of `at` (no earlier than this shard's time).
    /// Nothing is marked document by document: the rules' expired marks already hold what the
    /// old default made final. Returns whether TTL was just turned on, in which case own-ttl
    /// documents need timers ([`Shard::time_own_ttls`]).
    pub(in crate::engine) fn set_rules(
        &mut self,
        uid: CollectionUid,
        new: &ShardRules,
        at: Millis,
        lsn: Lsn,
    ) -> bool {
        self.advance_to(at);
        let Some(cs) = self.collections.get_mut(&uid) else {
            return false;
        };
        let ShardRules {
            rules,
            index,
            must_live,
            feed,
        } = new;
        let turned_on = !cs.rules.default_ttl.is_on() && rules.default_ttl.is_on();
        cs.rules = *rules;
        cs.policy = index.paths.clone();
        cs.lazy = index.lazy;
        cs.must_live = must_live.clone();
        cs.feed = *feed;
        if index.rebuild {
            cs.rebuild_from = Some(0);
        }
        cs.rules_changed_at = at;
        cs.settings_lsn = lsn;
        cs.refresh_head(&mut self.heads);
        turned_on
    }

    /// The one path every document change takes, client writes and purge alike: storage first
    /// (one batch, with the change log records of the changes), then the index and expiry
    /// bookkeeping, so a storage failure changes nothing. Request charges belong here when they
    /// arrive. Returns the earliest new expiry deadline, for waking the purge.
    ///
    /// Client writes are acknowledged once their position is durable, by their caller.
    /// Documents the purge removes stay in the index, dead, until [`ShardState::forget_purged`]
    /// is told the delete is durable: the engine never drops what storage could still bring back.
    pub(in crate::engine) fn commit(
        &mut self,
        store: &dyn ShardStore,
        changes: &[Change],
        metrics: &EngineMetrics,
        versions: &AtomicU64,
    ) -> Result<(Option<Millis>, Lsn), StorageError> {
        self.commit_logged(store, changes, None, (metrics, versions))
    }

    /// [`ShardState::commit`], with the change log records `given` (an owner's, applied by a
    /// follower: see `replicated.rs`) instead of records made from the changes, and no drain
    /// of what is due by this shard's clock (only an owner decides expiries).
    pub(in crate::engine) fn commit_logged(
        &mut self,
        store: &dyn ShardStore,
        changes: &[Change],
        given: Option<GivenLog>,
        (metrics, versions): (&EngineMetrics, &AtomicU64),
    ) -> Result<(Option<Millis>, Lsn), StorageError> {
        let applying = given.is_some();
        // Only an owner decides what is due by its clock; a follower applies what it decided.
        let drained = match given {
            None if !self.following => self.drain_due(),
            _ => Vec::new(),
        };
        if changes.is_empty() && drained.is_empty() {
            return Ok((None, Lsn::ZERO));
        }
        let keep_floor = changes.iter().any(|c| matches!(c, Change::KeepFloor));
        // A remembering commit also forgets a few keys past their window, in the same batch.
        let forgotten = match changes.iter().find_map(|c| match c {
            Change::Remember { record, .. } => Some(record.applied_at),
            _ => None,
        }) {
            Some(now) => self.requests.due(now),
            None => Vec::new(),
        };
        // Each change's record position (0: none).
        let (log, seqs) = match given {
            Some(given) => (
                LogAppends::given(given.last, given.records, given.expired),
                given.seqs,
            ),
            None => {
                let mut log = LogAppends::after(self.log_seq, self.last_now);
                for &(slot, at) in &drained {
                    let meta = self.docs.get(slot);
                    if self
                        .collections
                        .get(&meta.collection)
                        .is_some_and(|c| c.feed)
                    {
                        log.expire(slot, meta, at);
                    }
                }
                let seqs = changes
                    .iter()
                    .map(|c| self.log_change(c, &mut log))
                    .collect();
                (log, seqs)
            }
        };
        let mut writes: Vec<DocumentWrite<'_>> = changes
            .iter()
            .zip(&seqs)
            .filter_map(|(change, &seq)| {
                Some(match change {
                    Change::Put { record, index, .. } => DocumentWrite::Put {
                        doc: record,
                        index: match index {
                            IndexChange::Replace(old, new) => Some(IndexUpdate { old, new }),
                            IndexChange::Unchanged | IndexChange::Owed => None,
                        },
                        seq,
                    },
                    Change::Index { slot, old, new } => {
                        let meta = self.docs.get(*slot);
                        DocumentWrite::Index {
                            collection: meta.collection,
                            key: &meta.key,
                            version: meta.version,
                            update: IndexUpdate { old, new },
                        }
                    }
                    Change::Remove { slot, terms, .. } => {
                        let meta = self.docs.get(*slot);
                        DocumentWrite::Delete {
                            collection: meta.collection,
                            key: &meta.key,
                            terms,
                        }
                    }
                    Change::Remember {
                        collection,
                        scope,
                        record,
                    } => DocumentWrite::Remember {
                        collection: *collection,
                        key: scope,
                        record: *record,
                    },
                    Change::KeepFloor | Change::Expire { .. } => return None,
                })
            })
            .collect();
        writes.extend(log.writes());
        // A logged expiry is kept with the document, unless this commit rewrites or removes it.
        // Built only when there are any: a plain write (the common commit) allocates nothing.
        let replaced: HashSet<u32> = if log.expired().is_empty() {
            HashSet::new()
        } else {
            changes
                .iter()
                .filter_map(|c| match c {
                    Change::Put { slot, .. } => *slot,
                    Change::Remove { slot, .. } => Some(*slot),
                    _ => None,
                })
                .collect()
        };
        for &(slot, seq) in log.expired() {
            if !replaced.contains(&slot) {
                let meta = self.docs.get(slot);
                writes.push(DocumentWrite::ExpiryLogged {
                    collection: meta.collection,
                    key: &meta.key,
                    version: meta.version,
                    last_write: meta.last_write,
                    ttl: meta.ttl,
                    seq,
                });
            }
        }
        writes.extend(
            forgotten
                .iter()
                .map(|(collection, key)| DocumentWrite::Forget {
                    collection: *collection,
                    key,
                }),
        );
        let lsn = store.write(WriteBatch {
            writes: &writes,
            versions_below: versions.load(Ordering::SeqCst),
            keep_floor,
            replicated: applying,
        })?;
        drop(writes);
        self.requests.forget(&forgotten);
        if log.last() != self.log_seq {
            self.log_seq = log.last();
            self.log_lsn = lsn;
            for (uid, last) in log.collections() {
                if let Some(cs) = self.collections.get_mut(&uid) {
                    cs.log_tip = (last, lsn);
                    cs.feed_signal.send_replace(());
                }
            }
        }
        for &(slot, seq) in log.expired() {
            let meta = self.docs.get_mut(slot);
            meta.expiry_logged = true;
            meta.seq = seq;
        }

        // Documents the drain made dead wait for the purge.
        let mut earliest: Option<Millis> = (!drained.is_empty()).then_some(self.last_now);
        for (change, &seq) in changes.iter().zip(&seqs) {
            match change {
                Change::Put {
                    slot,
                    record,
                    index,
                    ..
                } => {
                    let cs = self
                        .collections
                        .get_mut(&record.collection)
                        .expect("callers hold a collection shard");
                    let bits = match index {
                        IndexChange::Replace(old, new) => cs.paths.update(old, new),
                        IndexChange::Unchanged | IndexChange::Owed => BitChange::default(),
                    };
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
                            meta.seq = seq;
                            meta.expiry_logged = false;
                            meta.path_bits = bits.apply(meta.path_bits);
                            if mem::take(&mut meta.purged) {
                                cs.purged_docs -= 1;
                            }
                            if let IndexChange::Replace(_, new) = index {
                                let was = mem::replace(&mut meta.indexed, !new.is_empty());
                                cs.indexed_docs =
                                    cs.indexed_docs + u64::from(meta.indexed) - u64::from(was);
                            }
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
                                indexed: matches!(index, IndexChange::Replace(_, new) if !new.is_empty()),
                                purged: false,
                                stale: false,
                                index_epoch: 0,
                                path_bits: bits.apply(0),
                                seq,
                                expiry_logged: false,
                            });
                            cs.indexed_docs += u64::from(self.docs.get(r.slot).indexed);
                            cs.index.insert(record.key.clone(), r.slot);
                            r
                        }
                    };
                    match index {
                        IndexChange::Replace(..) => unstale(&mut self.docs, cs, doc.slot),
                        IndexChange::Owed => {
                            mark_stale(&mut self.docs, &mut self.unindexed, cs, doc.slot)
                        }
                        IndexChange::Unchanged => {}
                    }
                    if let Some(deadline) =
                        attach(&mut self.docs, &mut self.wheel, &mut self.heads, cs, doc)
                    {
                        earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
                    }
                }
                Change::Index { slot, old, new } => {
                    let cs = self
                        .collections
                        .get_mut(&self.docs.get(*slot).collection)
                        .expect("the indexer names attached collections");
                    let bits = cs.paths.update(old, new);
                    let meta = self.docs.get_mut(*slot);
                    meta.path_bits = bits.apply(meta.path_bits);
                    let was = mem::replace(&mut meta.indexed, !new.is_empty());
                    meta.index_epoch = meta.index_epoch.wrapping_add(1);
                    cs.indexed_docs = cs.indexed_docs + u64::from(meta.indexed) - u64::from(was);
                    unstale(&mut self.docs, cs, *slot);
                }
                Change::KeepFloor | Change::Expire { .. } => {}
                Change::Remember {
                    collection,
                    scope,
                    record,
                } => {
                    if applying {
                        // The owner's answer is not shipped: a retry here is refused as applied.
                        self.requests
                            .remember_applied(*collection, scope.clone(), *record, lsn);
                    } else {
                        self.requests
                            .remember(*collection, scope.clone(), *record, lsn);
                    }
                }
                Change::Remove { slot, cause, terms } => {
                    let collection = self.docs.get(*slot).collection;
                    // Documents of a collection being deleted belong to its cleanup, which
                    // frees their slots; nothing else removes them.
                    let cs = self
                        .collections
                        .get_mut(&collection)
                        .expect("removals name live collections");
                    detach(&mut self.docs, &mut self.wheel, cs, *slot);
                    let bits = cs.paths.update(terms, &[]);
                    unstale(&mut self.docs, cs, *slot);
                    let meta = self.docs.get_mut(*slot);
                    meta.path_bits = bits.apply(meta.path_bits);
                    if mem::take(&mut meta.indexed) {
                        cs.indexed_docs -= 1;
                    }
                    if matches!(cause, RemoveCause::Expired { .. })
                        && !mem::replace(&mut meta.purged, true)
                    {
                        cs.purged_docs += 1;
                    }
                    if *cause == RemoveCause::Deleted {
                        if mem::take(&mut self.docs.get_mut(*slot).purged) {
                            cs.purged_docs -= 1;
                        }
                        cs.index.remove(&self.docs.get(*slot).key);
                        self.docs.remove(*slot);
                    }
                }
            }
        }
        Ok((earliest, lsn))
    }

    /// Marks the documents due by shard time dead, at most [`DRAIN_BUDGET`] of them, and hands
    /// them to the purge: a commit logs their expiries before its own changes, so that in a
    /// feed an expiry comes before every write committed after its instant. Only shards with a
    /// collection that has a feed drain; under an expiry storm beyond the budget, the purge
    /// logs the rest as it reaches them (a document's own writes still come after its expiry:
    /// see [`ShardState::log_change`]).
    fn drain_due(&mut self) -> Vec<(u32, Millis)> {
        let now = self.last_now;
        let due = self.wheel.next_due().is_some_and(|d| d <= now)
            || self.heads.first().is_some_and(|(d, _)| d <= now);
        if !due || !self.collections.values().any(|c| c.feed) {
            return Vec::new();
        }
        let mut drained = Vec::new();
        mark_due(self, now, DRAIN_BUDGET, &mut drained);
        for &(slot, at) in &drained {
            let r = self.docs.current_ref(slot);
            self.pending.push_back((r, at));
        }
        drained
    }

    /// Adds the change log record of `change` to `log`, if its collection has a feed; returns
    /// its position (0: none). A write over a version that expired without a record logs that
    /// expiry first, so a document's expiry always precedes the write that re-creates it.
    fn log_change(&self, change: &Change, log: &mut LogAppends) -> u64 {
        let feed = |uid: &CollectionUid| self.collections.get(uid).filter(|c| c.feed);
        match change {
            Change::Put {
                slot,
                record,
                patch,
                ..
            } => {
                let Some(cs) = feed(&record.collection) else {
                    return 0;
                };
                let (op, previous) = match *slot {
                    None => (ChangeOp::Create, 0),
                    Some(slot) => {
                        let old = self.docs.get(slot);
                        if old.is_visible(&cs.rules, record.last_write) {
                            let op = if *patch {
                                ChangeOp::Patch
                            } else {
                                ChangeOp::Replace
                            };
                            (op, old.seq)
                        } else if old.expiry_logged {
                            (ChangeOp::Create, old.seq)
                        } else {
                            let at = expiry_instant(old, cs, record.last_write);
                            (ChangeOp::Create, log.expire(slot, old, at))
                        }
                    }
                };
                log.write(record, op, previous)
            }
            Change::Remove {
                slot,
                cause: RemoveCause::Deleted,
                ..
            } => {
                let meta = self.docs.get(*slot);
                match feed(&meta.collection) {
                    Some(_) => log.delete(meta, self.last_now),
                    None => 0,
                }
            }
            Change::Remove {
                slot,
                cause: RemoveCause::Expired { at },
                ..
            }
            | Change::Expire { slot, at } => {
                let meta = self.docs.get(*slot);
                match feed(&meta.collection) {
                    Some(_) if !meta.expiry_logged => log.expire(*slot, meta, *at),
                    _ => 0,
                }
            }
            Change::Index { .. } | Change::KeepFloor | Change::Remember { .. } => 0,
        }
    }

    /// Forgets documents the purge deleted, now that the delete is durable, unless their slot
    /// has moved on (every write or free of a slot bumps its generation: an overwrite since, or
    /// their collection's deletion, has taken them over). Records the purge lag at `now`.
    pub(in crate::engine) fn forget_purged(
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
            if self.docs.get(r.slot).purged {
                cs.purged_docs -= 1;
            }
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
    pub(in crate::engine) fn bookkeeping_bytes(&self) -> usize {
        let queues: usize = self
            .collections
            .values()
            .map(|c| c.inherit.allocated_bytes())
            .sum();
        self.wheel.allocated_bytes() + queues + self.wheel.len() * mem::size_of::<TimerHandle>()
    }

    /// Documents whose expiry is tracked (timer or inherit queue).
    pub(in crate::engine) fn tracked_documents(&self) -> usize {
        self.wheel.len()
            + self
                .collections
                .values()
                .map(|c| c.inherit.live())
                .sum::<usize>()
    }

    /// Whether every document of the collection that a query could see has an orderable
    /// index entry at `path`: then its entries, read in order, are the `ORDER BY` order.
    pub(in crate::engine) fn order_support(
        &self,
        uid: CollectionUid,
        path: &[u8],
    ) -> Option<OrderSupport> {
        let cs = self.collections.get(&uid)?;
        // Documents owed an update (`lazy`) are read by their old entries and bits, and left
        // out where their body no longer agrees, as lazy queries may.
        let count = cs.paths.get(path)?;
        let documents = cs.index.len() as u64 - cs.purged_docs;
        let undefined = documents.saturating_sub(count.documents);
        if undefined > 0 && count.bit.is_none() {
            return None;
        }
        Some(OrderSupport {
            bit: count.bit,
            undefined,
        })
    }

    /// Up to `limit` keys of a collection's documents in `scope` without `bit` (undefined at
    /// its path), the first in key order after `after` (or, `descending`, the last before
    /// it), among the slots from `from`; returns where the next call goes on (`None`: every
    /// slot seen). Slots are visited [`UNDEFINED_SLOTS_PER_LOCK`] at a time, so one call holds
    /// the lock briefly; other partitions' documents are left out here, so that a partition's
    /// walk costs one visit of the slots, not one per batch of the shard's undefined keys.
    #[allow(
        clippy::too_many_arguments,
        reason = "one search's inputs, each distinct"
    )]
    pub(in crate::engine) fn undefined_keys(
        &self,
        uid: CollectionUid,
        bit: u8,
        after: Option<&DocKey>,
        descending: bool,
        from: u32,
        limit: usize,
        found: &mut std::collections::BinaryHeap<UndefinedKey>,
        scope: &FeedScope,
    ) -> Option<u32> {
        let end = (from as usize + UNDEFINED_SLOTS_PER_LOCK).min(self.docs.slot_count());
        for slot in from..end as u32 {
            let Some(meta) = self.docs.try_get(slot) else {
                continue;
            };
            if meta.collection != uid || meta.purged || meta.path_bits & (1 << bit) != 0 {
                continue;
            }
            if let FeedScope::Partition(pk) = scope
                && meta.key.partition_key != *pk
            {
                continue;
            }
            let past = after.is_none_or(|a| {
                if descending {
                    meta.key < *a
                } else {
                    meta.key > *a
                }
            });
            if !past {
                continue;
            }
            // Compared before it is cloned: most keys of a large shard are not kept.
            let kept = found.len() < limit
                || found.peek().is_some_and(|worst| {
                    let o = meta.key.cmp(&worst.key);
                    if descending { o.is_gt() } else { o.is_lt() }
                });
            if !kept {
                continue;
            }
            if found.len() >= limit {
                found.pop();
            }
            found.push(UndefinedKey {
                key: meta.key.clone(),
                descending,
            });
        }
        (end < self.docs.slot_count()).then_some(end as u32)
    }

    /// A collection's index bookkeeping in this shard: documents owed an update, documents
    /// with entries, documents, and documents with an entry at `path`.
    #[cfg(test)]
    pub(in crate::engine) fn index_census(&self, uid: CollectionUid, path: &[u8]) -> [u64; 4] {
        let cs = &self.collections[&uid];
        let at_path = cs.paths.get(path).map_or(0, |c| c.documents);
        [
            cs.stale_docs,
            cs.indexed_docs,
            cs.index.len() as u64,
            at_path,
        ]
    }

    /// Everything the purge could act on, counted entry by entry (tests check the counters
    /// against it).
    #[cfg(test)]
    pub(in crate::engine) fn census(&self) -> Census {
        let mut census = Census {
            documents: self.docs.len(),
            timers: self.wheel.len(),
            pending: self.pending.len(),
            ..Census::default()
        };
        for cs in self.collections.values() {
            census.queued += cs.inherit.iter().count();
            census.queued_live += cs.inherit.live();
            census.queue_bytes += cs.inherit.allocated_bytes();
        }
        census
    }
}

/// How a collection's shards index, installed with its rules.
#[derive(Debug, Clone)]
pub(crate) struct IndexSettings {
    /// The paths writes index under (`None`: it does not index).
    pub(in crate::engine) paths: Option<Arc<IndexPaths>>,
    /// Writes leave their entries to the background indexer.
    pub(in crate::engine) lazy: bool,
    /// Every document's entries must be made again (the paths changed, indexing was turned
    /// on or off, or TTL was switched on or off in `lazy` mode).
    pub(in crate::engine) rebuild: bool,
}

/// Marks a document as owed an index update, queueing it unless it already is.
pub(in crate::engine) fn mark_stale(
    docs: &mut DocSlab,
    unindexed: &mut VecDeque<u32>,
    cs: &mut CollectionShard,
    slot: u32,
) {
    let meta = docs.get_mut(slot);
    if !mem::replace(&mut meta.stale, true) {
        cs.stale_docs += 1;
        unindexed.push_back(slot);
    }
}

/// When a document found expired by a write at `written` expired: its deadline, or when the
/// rules made it final, and never after the write.
fn expiry_instant(meta: &DocMeta, cs: &CollectionShard, written: Millis) -> Millis {
    let due = match meta.ttl {
        Some(DocumentTtl::After(_)) => meta.own_ttl_due(&cs.rules),
        None => cs.inheritor_due(meta.last_write),
        Some(DocumentTtl::Never) => None,
    };
    due.unwrap_or(cs.rules_changed_at).min(written)
}

/// A document's entries are its current version's now (or it is gone).
fn unstale(docs: &mut DocSlab, cs: &mut CollectionShard, slot: u32) {
    if mem::take(&mut docs.get_mut(slot).stale) {
        cs.stale_docs -= 1;
    }
}

/// See [`ShardState::census`].
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct Census {
    /// Document slots held.
    pub(in crate::engine) documents: usize,
    /// Timers in the wheel.
    pub(in crate::engine) timers: usize,
    /// Inherit-queue entries, stale ones included.
    pub(in crate::engine) queued: usize,
    /// Inherit-queue entries still current.
    pub(in crate::engine) queued_live: usize,
    /// Bytes the inherit queues hold, spare capacity included.
    pub(in crate::engine) queue_bytes: usize,
    /// Documents marked dead and waiting for the purge, stale entries included.
    pub(in crate::engine) pending: usize,
}

/// Slots [`ShardState::undefined_keys`] looks at per hold of the lock.
pub(in crate::engine) const UNDEFINED_SLOTS_PER_LOCK: usize = 16 * 1024;

/// A key in the order an `ORDER BY` returns undefined documents in: key order, reversed if
/// descending; a max-heap of these keeps the first ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UndefinedKey {
    pub(crate) key: DocKey,
    pub(crate) descending: bool,
}

impl Ord for UndefinedKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let o = self.key.cmp(&other.key);
        if self.descending { o.reverse() } else { o }
    }
}

impl PartialOrd for UndefinedKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
