//! One sequence run against the engine and the model side by side, and the checks after each
//! crash.

use std::{collections::BTreeSet, fmt::Debug, sync::Arc, time::Duration};

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::*;
use super::{
    model::Model,
    ops::{
        Ack, BatchKind, BatchStep, Op, POLICIES, Patch, PatchRefusal, Rebuild, VALUES, body,
        doc_key, indexes_value, patch_request, patched,
    },
    storage::{Crash, Mutation, PowerLossStorage},
};
use crate::engine::{ChangeEvent, ChangeFeedMode, ChangeFeedStart, ChangeOp};

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
    /// The indexing policy in force, an index of `POLICIES` (settings changes are durable
    /// before they return).
    policy: usize,
    /// Query checks so far: each looks for the next of `VALUES`.
    checks: usize,
}

/// A batch as sent, and what the model expects of it.
struct BatchRequest {
    ops: Vec<BatchOp>,
    /// What each operation leaves of its document (`None`: absent).
    expected: Vec<Option<Map<String, Value>>>,
    /// The first operation that fails, and why.
    failure: Option<(usize, Refusal)>,
}

/// Why the model expects a batch operation to fail.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    Exists,
    NotFound,
    Patch(PatchRefusal),
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
            policy: 0,
            checks: 0,
        })
    }

    /// The engine shards the test's partitions land on.
    pub(super) fn shards_of_partitions() -> BTreeSet<usize> {
        let run = Run::start(None, Mutation::None).expect("start");
        let info = run.engine.get_collection(&run.path).expect("collection");
        PARTITIONS
            .iter()
            .map(|&p| {
                run.engine
                    .shard_index(&info, &PartitionKeyValue::String(p.into()))
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
            // The result was checked before settling; only the durable wait's failure comes
            // from settling.
            Err(e @ Error::NotDurable(_)) => Err(fail(format!("settle failed: {e}"))),
            Ok(_) | Err(_) => Ok(true),
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

    fn next_body(
        &mut self,
        key: usize,
        ttl: Option<i64>,
        value: Option<i64>,
    ) -> (DocumentBody, Map<String, Value>) {
        self.serial += 1;
        body(key, ttl, value, self.serial)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        let before = self.storage.last_applied();
        match *op {
            Op::Create {
                key,
                ttl,
                value,
                ack,
            } => {
                let live = self.model.live(key, now);
                let (body, doc) = self.next_body(key, ttl, value);
                let outcome = self.engine.create_document(&self.path, body, None);
                match (&outcome.result, live) {
                    (Ok(view), None) => {
                        let at = self.written_at(before)?;
                        self.model.put(key, view, doc, now, at)?;
                    }
                    (Err(Error::DocumentExists { .. }), Some(_)) => self.wrote_nothing(before)?,
                    (result, live) => return Err(self.mismatch("create", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Upsert {
                key,
                ttl,
                value,
                ack,
            } => {
                let live = self.model.live(key, now);
                let (body, doc) = self.next_body(key, ttl, value);
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
                        self.model.put(key, view, doc, now, at)?;
                    }
                    result => return Err(self.mismatch("upsert", result, live)),
                }
                self.settle_and_record(key, outcome, ack).await
            }
            Op::Replace {
                key,
                ttl,
                value,
                ack,
            } => {
                let live = self.model.live(key, now);
                let (body, doc) = self.next_body(key, ttl, value);
                let outcome = self
                    .engine
                    .replace_document(&self.path, doc_key(key), body, None);
                match (&outcome.result, live) {
                    (Ok(view), Some(_)) => {
                        let at = self.written_at(before)?;
                        self.model.put(key, view, doc, now, at)?;
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
                        self.model.record(key, None, at)?;
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
                        let doc = before_touch.doc.clone();
                        let at = self.written_at(before)?;
                        self.model.put(key, view, doc, now, at)?;
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
            Op::Patch {
                key,
                ref patch,
                ack,
            } => self.patch(key, patch, ack, now, before).await,
            Op::Batch {
                partition,
                ref steps,
                ack,
            } => self.batch(partition, steps, ack, now, before).await,
            Op::SetIndexing(policy) => {
                self.rebuild_expiry();
                let (included, excluded) = POLICIES[policy];
                let own = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
                let paths = IndexPaths::new(&own(included), &own(excluded)).expect("valid policy");
                let default_ttl =
                    DefaultTtl::from_raw(self.model.default()).expect("valid default");
                self.engine
                    .replace_collection(
                        &self.path,
                        SettingsChange {
                            default_ttl,
                            indexing_mode: None,
                            index_paths: Some(Arc::new(paths)),
                            must_live: None,
                            change_feed_retention: None,
                        },
                    )
                    .map_err(|e| fail(format!("replace the indexing policy: {e}")))?;
                self.policy = policy;
                Ok(())
            }
            Op::Index => {
                self.engine
                    .index_round()
                    .map_err(|e| fail(format!("an indexer round: {e}")))?;
                Ok(())
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
                            must_live: None,
                            change_feed_retention: None,
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

    /// A patch of `key`; `before` is the log position before it.
    async fn patch(
        &mut self,
        key: usize,
        patch: &Patch,
        ack: Ack,
        now: Millis,
        before: Lsn,
    ) -> Result<(), TestCaseError> {
        let live = self.model.live(key, now);
        let (ops, condition) = patch_request(patch);
        let outcome =
            self.engine
                .patch_document(&self.path, &doc_key(key), &ops, condition.as_ref(), None);
        let expected = live.map(|v| patched(self.model.doc(v), patch));
        // Every outcome reflects the document's state, a refusal too (a step that cannot
        // apply says what the document holds): each settles at or after its last write.
        match (&outcome.result, expected) {
            (Ok(view), Some(Ok(doc))) => {
                let at = self.written_at(before)?;
                self.model.put(key, view, doc, now, at)?;
            }
            (Err(Error::DocumentNotFound { .. }), None)
            | (Err(Error::ConditionNotMet { .. }), Some(Err(PatchRefusal::Condition)))
            | (Err(Error::Invalid(InvalidInput::Patch { .. })), Some(Err(PatchRefusal::Step))) => {
                self.wrote_nothing(before)?;
            }
            (result, _) => return Err(self.mismatch("patch", result, live)),
        }
        self.settle_and_record(key, outcome, ack).await
    }

    /// The engine's operations for a batch's `steps` on `partition`, what the model says each
    /// leaves of its document (`None`: absent), and the first that fails, with why. The model
    /// runs the steps over its own copy of the partition's documents.
    fn batch_request(
        &mut self,
        partition: usize,
        steps: &[BatchStep],
        now: Millis,
    ) -> BatchRequest {
        let key_of = |id: usize| partition * IDS + id;
        let mut staged: Vec<Option<Map<String, Value>>> = (0..IDS)
            .map(|id| {
                self.model
                    .live(key_of(id), now)
                    .map(|v| self.model.doc(v).clone())
            })
            .collect();
        let mut ops = Vec::with_capacity(steps.len());
        let mut expected: Vec<Option<Map<String, Value>>> = Vec::with_capacity(steps.len());
        let mut failure: Option<(usize, Refusal)> = None;
        for (index, step) in steps.iter().enumerate() {
            let key = key_of(step.id);
            let id = doc_key(key).id;
            let current = staged[step.id].clone();
            let (op, result) = match &step.kind {
                BatchKind::Create { ttl, value }
                | BatchKind::Upsert { ttl, value }
                | BatchKind::Replace { ttl, value } => {
                    let (body, doc) = self.next_body(key, *ttl, *value);
                    let (op, result) = match step.kind {
                        BatchKind::Create { .. } => (
                            BatchOp::Create { body },
                            if current.is_some() {
                                Err(Refusal::Exists)
                            } else {
                                Ok(Some(doc))
                            },
                        ),
                        BatchKind::Upsert { .. } => (
                            BatchOp::Upsert {
                                body,
                                if_match: None,
                            },
                            Ok(Some(doc)),
                        ),
                        _ => (
                            BatchOp::Replace {
                                id,
                                body,
                                if_match: None,
                            },
                            current.as_ref().map(|_| Some(doc)).ok_or(Refusal::NotFound),
                        ),
                    };
                    (op, result)
                }
                BatchKind::Delete => (
                    BatchOp::Delete { id, if_match: None },
                    current.as_ref().map(|_| None).ok_or(Refusal::NotFound),
                ),
                BatchKind::Read => (
                    BatchOp::Read { id },
                    current.clone().map(Some).ok_or(Refusal::NotFound),
                ),
                BatchKind::Touch => (
                    BatchOp::Touch { id, if_match: None },
                    current.clone().map(Some).ok_or(Refusal::NotFound),
                ),
                BatchKind::Patch(patch) => {
                    let (patch_ops, condition) = patch_request(patch);
                    let op = BatchOp::Patch {
                        id,
                        ops: patch_ops,
                        condition: condition.map(Arc::new),
                        if_match: None,
                        options: Default::default(),
                    };
                    let result = match current.as_ref().map(|doc| patched(doc, patch)) {
                        None => Err(Refusal::NotFound),
                        Some(Err(refusal)) => Err(Refusal::Patch(refusal)),
                        Some(Ok(doc)) => Ok(Some(doc)),
                    };
                    (op, result)
                }
            };
            ops.push(op);
            match result {
                Ok(doc) => {
                    if !matches!(step.kind, BatchKind::Read) {
                        staged[step.id].clone_from(&doc);
                    }
                    expected.push(doc);
                }
                // The steps after it are sent too: the batch must stop at the first.
                Err(why) => {
                    if failure.is_none() {
                        failure = Some((index, why));
                    }
                    expected.push(None);
                }
            }
        }
        BatchRequest {
            ops,
            expected,
            failure,
        }
    }

    /// A transactional batch on `partition`; `before` is the log position before it. The
    /// first step that cannot apply must fail the batch, changing nothing; else every step's
    /// result must be what the model says and the whole batch one write.
    async fn batch(
        &mut self,
        partition: usize,
        steps: &[BatchStep],
        ack: Ack,
        now: Millis,
        before: Lsn,
    ) -> Result<(), TestCaseError> {
        let key_of = |id: usize| partition * IDS + id;
        let BatchRequest {
            ops,
            expected,
            failure,
        } = self.batch_request(partition, steps, now);
        let pk = PartitionKeyValue::String(PARTITIONS[partition].into());
        let outcome = self.engine.execute_batch(&self.path, pk, &ops);
        let named: BTreeSet<usize> = steps.iter().map(|s| key_of(s.id)).collect();
        let mut intermediate = Vec::new();
        match (&outcome.result, failure) {
            (Err(Error::BatchOperation { index, source, .. }), Some((at, why))) => {
                let kind_matches = matches!(
                    (why, &**source),
                    (Refusal::Exists, Error::DocumentExists { .. })
                        | (Refusal::NotFound, Error::DocumentNotFound { .. })
                        | (
                            Refusal::Patch(PatchRefusal::Condition),
                            Error::ConditionNotMet { .. }
                        )
                        | (
                            Refusal::Patch(PatchRefusal::Step),
                            Error::Invalid(InvalidInput::Patch { .. })
                        )
                );
                prop_assert!(
                    *index == at && kind_matches,
                    "batch: operation {} failed with {}, the model fails operation {} ({:?})",
                    index,
                    source,
                    at,
                    why
                );
                self.wrote_nothing(before)?;
            }
            (Ok(outputs), None) => {
                prop_assert_eq!(outputs.len(), steps.len());
                // The versions the batch leaves at each id it wrote.
                let mut last: Vec<Option<Option<usize>>> = vec![None; IDS];
                let start: Vec<Option<usize>> = (0..IDS)
                    .map(|id| self.model.live(key_of(id), now))
                    .collect();
                let mut current = start.clone();
                for ((step, output), doc) in steps.iter().zip(outputs).zip(expected) {
                    let key = key_of(step.id);
                    let view = match (&step.kind, output) {
                        (BatchKind::Delete, BatchOutput::Deleted) => None,
                        (BatchKind::Upsert { .. }, BatchOutput::Upserted(created, view)) => {
                            let want = if current[step.id].is_some() {
                                UpsertOutcome::Replaced
                            } else {
                                UpsertOutcome::Created
                            };
                            prop_assert_eq!(*created, want, "batch upsert");
                            Some(view)
                        }
                        (
                            BatchKind::Create { .. }
                            | BatchKind::Replace { .. }
                            | BatchKind::Read
                            | BatchKind::Touch
                            | BatchKind::Patch(_),
                            BatchOutput::Document(view),
                        ) => Some(view),
                        (kind, output) => {
                            return Err(fail(format!("batch: {kind:?} returned {output:?}")));
                        }
                    };
                    match (view, doc) {
                        (None, None) => {
                            current[step.id] = None;
                            last[step.id] = Some(None);
                        }
                        (Some(view), Some(_)) if matches!(step.kind, BatchKind::Read) => {
                            let v =
                                current[step.id].ok_or_else(|| fail("batch read of nothing"))?;
                            self.model.check_view(view, key, v)?;
                        }
                        (Some(view), Some(doc)) => {
                            let v = self.model.new_version(key, view, doc, now)?;
                            intermediate.push((step.id, v));
                            current[step.id] = Some(v);
                            last[step.id] = Some(Some(v));
                        }
                        (view, doc) => {
                            return Err(fail(format!(
                                "batch: {:?} returned {view:?}, the model has {doc:?}",
                                step.kind
                            )));
                        }
                    }
                }
                if last.iter().any(Option::is_some) {
                    let at = self.written_at(before)?;
                    for (id, state) in last.into_iter().enumerate() {
                        if let Some(state) = state {
                            self.model.record(key_of(id), state, at)?;
                        }
                    }
                    self.model.judge(now);
                } else {
                    self.wrote_nothing(before)?;
                }
            }
            (result, _) => {
                return Err(fail(format!(
                    "batch: got {result:?}, the model fails at {failure:?}"
                )));
            }
        }
        if self.settle(outcome, ack).await? {
            for key in named {
                self.model.acknowledge(key);
            }
            for (_, v) in intermediate {
                self.model.acknowledge_version(v);
            }
        }
        Ok(())
    }

    /// Runs `text` over the whole collection as one call.
    fn query(&self, text: &str) -> Result<(Vec<Value>, QueryMetrics), TestCaseError> {
        let mut spec = QuerySpec::parse(text, Map::new())
            .map_err(|e| fail(format!("{text}: does not parse: {e}")))?;
        spec.enable_scan = true;
        let read_at = self.engine.query_reading();
        self.engine
            .query_all(
                &self.path,
                &spec,
                &FeedScope::Collection,
                read_at,
                QueryReads::unlimited(),
            )
            .result
            .map_err(|e| fail(format!("{text}: {e}")))
    }

    /// Checks an equality query on `v` (for each of `VALUES` in turn) and `ORDER BY c.n`
    /// against the model's live documents: through the index wherever the policy indexes the
    /// path and the index is complete.
    fn check_queries(&mut self, when: &str) -> Result<(), TestCaseError> {
        let now = self.engine.query_reading();
        prop_assert_eq!(now, self.clock.now(), "queries read at the clock's reading");
        let info = self
            .engine
            .get_collection(&self.path)
            .map_err(|e| fail(format!("collection: {e}")))?;
        self.checks += 1;
        let value = VALUES[self.checks % VALUES.len()];
        // Live documents by `n`: the order `ORDER BY c.n` must return them in.
        let mut live: Vec<(usize, &Map<String, Value>)> = (0..KEYS)
            .filter_map(|key| self.model.live(key, now).map(|v| (key, self.model.doc(v))))
            .collect();
        live.sort_by_key(|(_, doc)| doc.get("n").and_then(Value::as_u64));
        let row = |key: usize| (PARTITIONS[key / IDS].to_owned(), format!("d{}", key % IDS));
        let check = |text: &str, sorted: bool, want: Vec<(String, String)>| {
            let (results, metrics) = self.query(text)?;
            let mut got: Vec<(String, String)> = results
                .iter()
                .map(|r| {
                    let field = |name: &str| r[name].as_str().unwrap_or_default().to_owned();
                    (field("pk"), field("id"))
                })
                .collect();
            if sorted {
                got.sort();
            }
            if got != want {
                return Err(fail(format!(
                    "{when}: {INDEXED_QUERY}: {text} (index {:?}) returned {got:?}, the model has {want:?}",
                    metrics.index
                )));
            }
            Ok(metrics)
        };

        let text = format!("SELECT c.pk, c.id FROM c WHERE c.v = {value}");
        let mut want: Vec<(String, String)> = live
            .iter()
            .filter(|(_, doc)| doc.get("v").and_then(Value::as_i64) == Some(value))
            .map(|&(key, _)| row(key))
            .collect();
        want.sort();
        let metrics = check(&text, true, want)?;
        if info.index_usable() && indexes_value(self.policy) {
            prop_assert!(
                metrics.index.is_some(),
                "{}: {} read documents although the index is complete",
                when,
                text
            );
        }
        let want = live.iter().map(|&(key, _)| row(key)).collect();
        check("SELECT c.pk, c.id FROM c ORDER BY c.n", false, want)?;
        Ok(())
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
        self.check_queries("after a crash")?;
        self.check_feed()?;
        if let Rebuild::AfterReads = rebuild {
            self.rebuild_expiry();
        }
        Ok(())
    }

    /// The change feed after a crash is the history of the durable state: positions increase
    /// and never repeat, each document's events alternate between living and gone, each names
    /// the one before it, and the last of every document is what a read finds now (or a
    /// version that has expired since, whose expiry is logged when the purge or a write gets
    /// to it).
    fn check_feed(&self) -> Result<(), TestCaseError> {
        let mut cursor = self
            .engine
            .open_change_feed(
                &self.path,
                None,
                Some(ChangeFeedMode::AllVersionsAndDeletes),
                ChangeFeedStart::Beginning,
            )
            .map_err(|e| fail(format!("open the feed after a crash: {e}")))?;
        let mut events: Vec<ChangeEvent> = Vec::new();
        loop {
            super::block_on(self.engine.wait_for_changes(&cursor, Duration::ZERO))
                .map_err(|e| fail(format!("wait for the feed after a crash: {e}")))?;
            let page = self
                .engine
                .read_changes(&mut cursor, 1000, usize::MAX, &mut QueryReads::unlimited())
                .map_err(|e| fail(format!("read the feed after a crash: {e}")))?;
            if page.is_empty() {
                break;
            }
            events.extend(page);
        }
        let wrong = |what: String| Err(fail(format!("{FEED_HISTORY}: {what}")));
        let mut last_in_shard = std::collections::HashMap::new();
        for e in &events {
            if let Some(&before) = last_in_shard.get(&e.shard)
                && e.lsn <= before
            {
                return wrong(format!(
                    "shard {} position {} after {before}",
                    e.shard, e.lsn
                ));
            }
            last_in_shard.insert(e.shard, e.lsn);
        }
        let now = self.clock.now();
        let rules = self
            .engine
            .get_collection(&self.path)
            .map_err(|e| fail(format!("collection: {e}")))?
            .rules();
        for key in 0..KEYS {
            let address = doc_key(key);
            let mine: Vec<&ChangeEvent> =
                events.iter().filter(|e| e.record.key == address).collect();
            let (mut alive, mut before) = (false, 0);
            for e in &mine {
                let op = e.record.op;
                if (op == ChangeOp::Create) == alive {
                    let state = if alive { "alive" } else { "gone" };
                    return wrong(format!(
                        "key {key}: {op:?} at {} when it was {state}",
                        e.lsn
                    ));
                }
                let previous = e.record.previous;
                if previous != before && (alive || previous != 0) {
                    return wrong(format!(
                        "key {key}: the event at {} names {previous} as its previous, not {before}",
                        e.lsn
                    ));
                }
                alive = op.is_write();
                before = e.lsn;
            }
            let last = mine.last().map(|e| &e.record);
            match (
                &self.engine.read_document(&self.path, &address).result,
                last,
            ) {
                (Ok(view), Some(r)) if r.op.is_write() && r.version == view.etag.0 => {}
                (Ok(view), last) => {
                    return wrong(format!(
                        "key {key}: reads etag {} but the feed ends with {:?}",
                        view.etag.0,
                        last.map(|r| (r.op, r.version))
                    ));
                }
                (Err(Error::DocumentNotFound { .. }), Some(r))
                    if r.op.is_write() && rules.is_visible(r.crts, r.ttl, now) =>
                {
                    return wrong(format!(
                        "key {key}: the feed ends with {:?} of {}, which is not stored",
                        r.op, r.version
                    ));
                }
                (Err(Error::DocumentNotFound { .. }), _) => {}
                (Err(e), _) => return Err(fail(format!("key {key}: read: {e}"))),
            }
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
