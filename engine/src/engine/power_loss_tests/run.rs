//! One sequence run against the engine and the model side by side, and the checks after each
//! crash.

use std::{collections::BTreeSet, fmt::Debug, sync::Arc};

use proptest::prelude::*;

use super::*;
use super::{
    model::Model,
    ops::{Ack, Op, Rebuild, body, doc_key},
    storage::{Crash, Mutation, PowerLossStorage},
};

pub(super) struct Run {
    clock: Arc<ManualClock>,
    storage: PowerLossStorage,
    engine: Engine,
    path: CollectionPath,
    model: Model,
    /// Purge batches whose deletes wait for a sync.
    purges: Vec<(Arc<Shard>, purge::Undurable)>,
    /// Makes every body distinct.
    serial: u64,
    /// The engine was reopened and its expiry rebuild has not run yet.
    rebuild_pending: bool,
}

/// The one failure for a version read again after it had expired.
fn expired_is_final(key: usize, etag: u64) -> TestCaseError {
    fail(format!(
        "key {key}: after a crash read etag {etag}, which had expired: {EXPIRED_IS_FINAL}"
    ))
}

impl Run {
    fn start(default: Option<i64>, mutation: Mutation) -> Result<Run, TestCaseError> {
        let clock = Arc::new(ManualClock::new(T0));
        let storage = PowerLossStorage::new(mutation);
        let (engine, _) = Engine::open(
            EngineConfig::new(SHARDS),
            Arc::new(storage.clone()),
            clock.clone(),
        )
        .map_err(|e| fail(format!("open: {e}")))?;
        engine.rebuild_expiry();
        let db = ResourceId::parse(IdKind::Database, "db").expect("valid id");
        let collection = ResourceId::parse(IdKind::Collection, "c").expect("valid id");
        engine
            .create_database(db.clone())
            .map_err(|e| fail(format!("create database: {e}")))?;
        let settings = CollectionSettings::new(
            DefaultTtl::from_raw(default).expect("valid default"),
            IndexingMode::Consistent,
        )
        .expect("valid settings");
        engine
            .create_collection(
                &db,
                collection.clone(),
                PartitionKeyPath::parse("/pk").expect("valid path"),
                settings,
                Default::default(),
            )
            .map_err(|e| fail(format!("create collection: {e}")))?;
        Ok(Run {
            clock,
            storage,
            engine,
            path: CollectionPath {
                database: db,
                collection,
            },
            model: Model::new(default),
            purges: Vec::new(),
            serial: 0,
            rebuild_pending: false,
        })
    }

    /// The engine shards the test's partitions land on.
    pub(super) fn shards_of_partitions() -> BTreeSet<usize> {
        let run = Run::start(None, Mutation::None).expect("start");
        let uid = run
            .engine
            .get_collection(&run.path)
            .expect("collection")
            .uid;
        PARTITIONS
            .iter()
            .map(|&p| {
                run.engine
                    .shard_index(uid, &PartitionKeyValue::String(p.into()))
            })
            .collect()
    }

    /// Tells the client of `outcome` as `ack` says; true if it was told.
    async fn settle<T>(&self, outcome: Outcome<T>, ack: Ack) -> Result<bool, TestCaseError> {
        let settled = match ack {
            Ack::Drop => return Ok(false),
            Ack::TrySettle => match poll_once(self.engine.settle(outcome)) {
                None => return Ok(false),
                Some(result) => result,
            },
            Ack::SyncThenSettle => {
                self.storage.sync_to(outcome.settle_at);
                tokio::time::timeout(SETTLE_TIMEOUT, self.engine.settle(outcome))
                    .await
                    .map_err(|_| fail("settle did not complete although its position was synced"))?
            }
        };
        match settled {
            // The result was checked before settling; only storage errors come from settling.
            Ok(_) | Err(Error::DocumentExists { .. } | Error::DocumentNotFound { .. }) => Ok(true),
            Err(e) => Err(fail(format!("settle failed: {e}"))),
        }
    }

    /// Settles an operation's outcome at `key` as `ack` says, and records it if the client
    /// was told.
    async fn settle_and_record<T>(
        &mut self,
        key: usize,
        outcome: Outcome<T>,
        ack: Ack,
    ) -> Result<(), TestCaseError> {
        if self.settle(outcome, ack).await? {
            self.model.acknowledge(key);
        }
        Ok(())
    }

    /// The position of the write an operation just made, as the storage counts it (what the
    /// engine says it is may be wrong: that is what the model checks).
    fn written_at(&self, before: Lsn) -> Result<u64, TestCaseError> {
        let at = self.storage.last_applied().0;
        prop_assert_eq!(at, before.0 + 1, "a document write is one storage write");
        Ok(at)
    }

    /// An operation refused or a read: it wrote nothing.
    fn wrote_nothing(&self, before: Lsn) -> Result<(), TestCaseError> {
        prop_assert_eq!(
            self.storage.last_applied(),
            before,
            "a refusal or a read wrote"
        );
        Ok(())
    }

    /// The failure for an operation's result that the model does not allow.
    fn mismatch(&self, op: &str, result: &dyn Debug, live: Option<usize>) -> TestCaseError {
        fail(format!(
            "{op}: got {result:?}, the model has {}",
            self.model.describe(live, self.clock.now())
        ))
    }

    fn next_body(&mut self, key: usize, ttl: Option<i64>) -> DocumentBody {
        self.serial += 1;
        body(key, ttl, self.serial)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        let before = self.storage.last_applied();
        match *op {
            Op::Create { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self.engine.create_document(&self.path, body, None);
                match (&outcome.result, live) {
                    (Ok(view), None) => {
                        let at = self.written_at(before)?;
                        self.model.put(key, view, ttl, now, at)?;
                    }
                    (Err(Error::DocumentExists { .. }), Some(_)) => self.wrote_nothing(before)?,
                    (result, live) => return Err(self.mismatch("create", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Upsert { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self.engine.upsert_document(&self.path, body, None, None);
                match &outcome.result {
                    Ok((created, view)) => {
                        let expected = if live.is_some() {
                            UpsertOutcome::Replaced
                        } else {
                            UpsertOutcome::Created
                        };
                        prop_assert_eq!(*created, expected);
                        let at = self.written_at(before)?;
                        self.model.put(key, view, ttl, now, at)?;
                    }
                    result => return Err(self.mismatch("upsert", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Replace { key, ttl, ack } => {
                let live = self.model.live(key, now);
                let body = self.next_body(key, ttl);
                let outcome = self
                    .engine
                    .replace_document(&self.path, doc_key(key), body, None);
                match (&outcome.result, live) {
                    (Ok(view), Some(_)) => {
                        let at = self.written_at(before)?;
                        self.model.put(key, view, ttl, now, at)?;
                    }
                    (Err(Error::DocumentNotFound { .. }), None) => self.wrote_nothing(before)?,
                    (result, live) => return Err(self.mismatch("replace", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Delete { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.delete_document(&self.path, &doc_key(key), None);
                match (&outcome.result, live) {
                    (Ok(()), Some(_)) => {
                        let at = self.written_at(before)?;
                        self.model.delete(key, at)?;
                    }
                    (Err(Error::DocumentNotFound { .. }), None) => self.wrote_nothing(before)?,
                    (result, live) => return Err(self.mismatch("delete", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Touch { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.touch_document(&self.path, &doc_key(key), None);
                match (&outcome.result, live) {
                    (Ok(view), Some(v)) => {
                        let before_touch = self.model.version(v);
                        prop_assert_eq!(&view.body, &before_touch.body, "touch keeps the body");
                        let ttl = before_touch.ttl;
                        let at = self.written_at(before)?;
                        self.model.put(key, view, ttl, now, at)?;
                    }
                    (Err(Error::DocumentNotFound { .. }), None) => self.wrote_nothing(before)?,
                    (result, live) => return Err(self.mismatch("touch", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Read { key, ack } => {
                let live = self.model.live(key, now);
                let outcome = self.engine.read_document(&self.path, &doc_key(key));
                match (&outcome.result, live) {
                    (Ok(view), Some(v)) => self.model.check_view(view, key, v)?,
                    (Err(Error::DocumentNotFound { .. }), None) => {}
                    (result, live) => return Err(self.mismatch("read", result, live)),
                }
                self.wrote_nothing(before)?;
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Advance(ms) => {
                self.clock.advance(ms);
                self.model.judge(self.clock.now());
                Ok(())
            }
            Op::SetDefault(raw) => {
                self.rebuild_expiry();
                let default_ttl = DefaultTtl::from_raw(raw).expect("valid default");
                let info = self
                    .engine
                    .replace_collection(
                        &self.path,
                        SettingsChange {
                            default_ttl,
                            indexing_mode: None,
                            index_paths: None,
                        },
                    )
                    .map_err(|e| fail(format!("replace settings: {e}")))?;
                prop_assert_eq!(info.settings.default_ttl(), default_ttl);
                self.model.set_default(raw, now);
                Ok(())
            }
            Op::Purge => {
                for shard in self.engine.shards() {
                    let (report, undurable) = shard.purge_batch(&*self.clock, purge::PURGE_BATCH);
                    prop_assert!(!report.failed, "purge batch failed");
                    self.purges
                        .extend(undurable.map(|undurable| (shard.clone(), undurable)));
                }
                Ok(())
            }
            Op::Sync { permille } => {
                let from = self.storage.synced().0;
                let last = self.storage.last_applied().0;
                self.storage
                    .sync_to(Lsn(from + (last - from) * permille / 1_000));
                Ok(())
            }
            Op::Crash { crash, rebuild } => self.crash(crash, rebuild),
        }
    }

    /// Finishes the waiting purge batches once the whole log is synced (their waits can then
    /// complete; a batch cannot say which position it waits for).
    async fn finish_purges_if_synced(&mut self) -> Result<(), TestCaseError> {
        if self.storage.synced() < self.storage.last_applied() {
            return Ok(());
        }
        for (shard, undurable) in self.purges.drain(..) {
            let finished =
                tokio::time::timeout(SETTLE_TIMEOUT, shard.finish_purge(undurable, &*self.clock))
                    .await
                    .map_err(|_| fail("a purge batch's durable wait hung after a full sync"))?;
            prop_assert!(finished, "a purge batch's delete did not become durable");
        }
        Ok(())
    }

    /// A crash: a prefix of the log survives. The engine restarts over it, and every address
    /// is read: each must show exactly what that prefix holds.
    fn crash(&mut self, crash: Crash, rebuild: Rebuild) -> Result<(), TestCaseError> {
        self.purges.clear();
        let (storage, kept) = self.storage.crash(crash);
        let (engine, _) = Engine::open(
            EngineConfig::new(SHARDS),
            Arc::new(storage.clone()),
            self.clock.clone(),
        )
        .map_err(|e| fail(format!("reopen after a crash: {e}")))?;
        // The old engine goes with the old store: nothing it held in memory survives.
        self.engine = engine;
        self.storage = storage;
        self.rebuild_pending = true;
        if let Rebuild::First = rebuild {
            self.rebuild_expiry();
        }
        let info = self
            .engine
            .get_collection(&self.path)
            .map_err(|e| fail(format!("collection after a crash: {e}")))?;
        prop_assert_eq!(
            info.settings.default_ttl(),
            DefaultTtl::from_raw(self.model.default()).expect("valid default"),
            "settings changes are durable before they return"
        );
        self.model.clear_run_etags();
        for key in 0..KEYS {
            self.audit(key, kept)?;
        }
        if let Rebuild::AfterReads = rebuild {
            self.rebuild_expiry();
        }
        Ok(())
    }

    /// Runs the expiry rebuild the last restart calls for, if it has not run yet.
    fn rebuild_expiry(&mut self) {
        if self.rebuild_pending {
            self.engine.rebuild_expiry();
            self.rebuild_pending = false;
        }
    }

    /// Reads `key` after a crash that kept the log up to `kept`, and makes the state kept
    /// there the model's new durable base.
    fn audit(&mut self, key: usize, kept: Lsn) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        let model = &self.model;
        let history = model.history(key);
        let outcome = self.engine.read_document(&self.path, &doc_key(key));
        let found = match &outcome.result {
            Ok(view) => {
                let etag = view.etag.0;
                let v = model.find(key, etag).ok_or_else(|| {
                    fail(format!(
                        "key {key}: after a crash read etag {etag}, which it did not hold since the last restart"
                    ))
                })?;
                if !model.visible(v, now) {
                    return Err(expired_is_final(key, etag));
                }
                model.check_view(view, key, v)?;
                Some(v)
            }
            Err(Error::DocumentNotFound { .. }) => None,
            Err(e) => return Err(fail(format!("key {key}: read after a crash: {e}"))),
        };
        // Checked before the exact state, so that a lost acknowledgement says so.
        let (survivors, acknowledged) = history.allowed();
        if acknowledged && !survivors.iter().any(|&s| model.seen(s, now) == found) {
            let allowed: Vec<String> = survivors.iter().map(|&s| model.describe(s, now)).collect();
            return Err(fail(format!(
                "key {key}: {LOST_ACK}: after a crash it holds {}, but the acknowledged writes allow only {allowed:?}",
                model.describe(found, now)
            )));
        }
        // The last model write in the kept log decides. Purge deletes and settings changes share
        // the log but are no model writes: a kept purge delete removed a version the model has
        // expired, which reads as absent either way, and settings are judged by the model.
        let expected = history.kept(kept);
        prop_assert!(
            found == model.seen(expected, now),
            "key {}: after a crash it holds {}, but the log kept up to position {} holds {}",
            key,
            model.describe(found, now),
            kept.0,
            model.describe(expected, now)
        );
        prop_assert!(
            poll_once(self.engine.settle(outcome)).is_some(),
            "a read of recovered data settles at once"
        );
        // The kept state, not what was read: an expired version may still be stored, and a
        // restart that forgot it had expired would serve it again.
        self.model.restart_key(key, expected);
        Ok(())
    }
}

/// Runs one sequence; it always ends with a power cut, so every sequence is checked after one.
pub(super) fn check(
    default: Option<i64>,
    ops: &[Op],
    mutation: Mutation,
) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(format!("runtime: {e}")))?;
    runtime.block_on(async {
        let mut run = Run::start(default, mutation)?;
        for (step, op) in ops.iter().enumerate() {
            run.apply(op)
                .await
                .map_err(|e| context(e, format_args!("step {step} ({op:?})")))?;
            run.finish_purges_if_synced().await?;
        }
        run.crash(Crash::PowerCut, Rebuild::First)
            .map_err(|e| context(e, "final crash"))
    })
}
