//! A transactional batch on one shard, as one optimistic commit (see [`super::optimistic`]).
//! The shard's state for the batch's documents is noted under the lock; bodies and index
//! terms are fetched, operations evaluated in order over a staged copy, and new terms
//! computed, all outside it; the lock is taken again to check that nothing the batch saw has
//! changed and to commit every change as one write. Should a document change in between, the
//! batch is evaluated again; once contended it fails ([`Fallback::Contended`]): unlike a
//! single write, it never works under the lock, where its work (a hundred bodies,
//! conditions, terms) would stall the shard.

use super::optimistic::{Fallback, Keyed, Look, Optimistic, Ready, Stop};
#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use crate::engine::{
    DocumentBody, DocumentId, Engine, InvalidInput, PartitionKeyValue, UpsertOutcome,
    batch::{BatchOp, BatchOutput, MAX_BATCH_BYTES},
    idempotency::Answered,
    index::terms::bounded_document_terms,
    patch,
    request_charge::RequestCharge,
};
use serde_json::{Map, Value};

/// Most bytes of index terms (old and new) a batch may hold and write: what one batch's index
/// changes cost in memory and in its storage write.
const MAX_BATCH_TERM_BYTES: usize = 16 * 1024 * 1024;

/// A document as the batch's staged state has it.
#[derive(Debug)]
struct Staged {
    /// Stored form of the body.
    body: Bytes,
    ttl: Option<DocumentTtl>,
    version: u64,
    /// Its last write if the batch did not write it; `None`: the batch's commit writes it.
    written: Option<Millis>,
}

/// What the shard held at a key when the batch looked.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    slot: Option<u32>,
    version: u64,
    live: bool,
    /// The flags a purge changes without a new version: a batch that saw them before the
    /// purge must not commit after it (it would remove the same index entries twice).
    indexed: bool,
    dead: bool,
    purged: bool,
    terms: Option<TermsRef>,
}

/// One document the batch names.
#[derive(Debug, Clone)]
struct KeyPlan {
    key: DocKey,
    seen: Seen,
    /// The document as the operations so far left it (`None`: absent); for a live document
    /// not yet fetched, `Fetch`.
    current: Current,
    /// The last operation that gave it a new body, with that body; `None`: its body is the
    /// one stored (a touch at most).
    new_body: Option<(usize, Arc<Map<String, Value>>)>,
    /// Whether any operation wrote or deleted it.
    changed: bool,
}

#[derive(Debug, Clone)]
enum Current {
    /// Live and stored; its body not fetched yet.
    Fetch,
    Live(Arc<Staged>),
    Absent,
}

/// One operation's result before the commit fixes the write instant.
#[derive(Debug)]
enum Pending {
    Document(usize, Arc<Staged>),
    Upserted(UpsertOutcome, usize, Arc<Staged>),
    /// A patch that created its document.
    Created(usize, Arc<Staged>),
    Deleted,
}

/// A batch evaluated, ready to commit if the shard still holds what it saw.
#[derive(Debug)]
struct Evaluated {
    pending: Vec<Pending>,
    /// Per key: its terms before and after, where its index entries change.
    terms: Vec<Option<(Vec<Term>, Vec<Term>)>>,
}

/// A batch as an optimistic write.
struct Batch<'a> {
    info: &'a CollectionInfo,
    partition_key: &'a PartitionKeyValue,
    ops: &'a [BatchOp],
    /// The documents it names, each once, in the order first named.
    ids: Vec<&'a DocumentId>,
}

/// What the batch's look found.
struct Looked {
    keys: Vec<KeyPlan>,
    policy: Option<Arc<IndexPaths>>,
    lazy: bool,
    default_ttl: DefaultTtl,
    /// The must-live rules the bodies are judged by: part of the basis, so that the commit
    /// is made under the rules that judged them.
    must_live: Arc<MustLive>,
    now: Millis,
    /// Where what it saw settles.
    seen_at: Lsn,
}

impl Shard {
    /// Runs a batch whose bodies were checked to belong to `partition_key` (see
    /// [`Engine::execute_batch`]).
    pub(crate) fn batch(
        &self,
        info: &CollectionInfo,
        partition_key: &PartitionKeyValue,
        ops: &[BatchOp],
        clock: &dyn Clock,
        keyed: Option<Keyed<'_>>,
    ) -> Outcome<Answered<Vec<BatchOutput>>> {
        let mut ids: Vec<&DocumentId> = Vec::new();
        for op in ops {
            if !ids.contains(&op.id()) {
                ids.push(op.id());
            }
        }
        let batch = Batch {
            info,
            partition_key,
            ops,
            ids,
        };
        self.commit_optimistic(batch, Fallback::Contended, clock, keyed)
    }

    /// Evaluates every operation in order over the staged documents, fetching stored bodies
    /// and terms as needed, and computes the new index terms.
    fn evaluate(
        &self,
        info: &CollectionInfo,
        ops: &[BatchOp],
        keys: &mut [KeyPlan],
        (policy, lazy, default_ttl, must_live): (
            &Option<Arc<IndexPaths>>,
            bool,
            DefaultTtl,
            &MustLive,
        ),
        now: Millis,
    ) -> Result<Evaluated, Stop> {
        let mut fetched = 0;
        let mut returned = 0;
        let mut pending = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let k = keys
                .iter()
                .position(|k| &k.key.id == op.id())
                .expect("every operation's id has a plan");
            let plan = &mut keys[k];
            let failed = |e: Error| Stop::Failed(op.failed(index, e));
            if let Current::Fetch = plan.current
                && matches!(
                    op,
                    BatchOp::Read { .. } | BatchOp::Patch { .. } | BatchOp::Touch { .. }
                )
            {
                let record = self.stored_version(info, &plan.key, plan.seen.version)?;
                fetched += record.body.len();
                over_limit(op, index, fetched, "reads")?;
                plan.current = Current::Live(Arc::new(Staged {
                    body: record.body.clone(),
                    ttl: record.ttl,
                    version: record.version,
                    written: Some(record.last_write),
                }));
            }
            let live = !matches!(plan.current, Current::Absent);
            let version = match &plan.current {
                Current::Fetch => plan.seen.version,
                Current::Live(staged) => staged.version,
                Current::Absent => 0,
            };
            // Existence and etag, as a single write judges them.
            let not_found = || Error::DocumentNotFound {
                id: plan.key.id.to_string(),
                partition_key: plan.key.partition_key.clone(),
            };
            match op {
                BatchOp::Create { .. } if live => {
                    return Err(failed(Error::DocumentExists {
                        id: plan.key.id.to_string(),
                        partition_key: plan.key.partition_key.clone(),
                    }));
                }
                BatchOp::Create { .. } | BatchOp::Upsert { .. } => {}
                // Not live: created from its initial body (which comes without an if_match).
                BatchOp::Patch { options, .. } if options.create_if_missing.is_some() => {}
                _ if !live => return Err(failed(not_found())),
                _ => {}
            }
            let if_match = match op {
                BatchOp::Upsert { if_match, .. }
                | BatchOp::Replace { if_match, .. }
                | BatchOp::Delete { if_match, .. }
                | BatchOp::Patch { if_match, .. }
                | BatchOp::Touch { if_match, .. } => if_match.as_deref(),
                BatchOp::Create { .. } | BatchOp::Read { .. } => None,
            };
            if let Some(sent) = if_match
                && !(live && Etag(version).matches(sent))
            {
                return Err(failed(Error::PreconditionFailed {
                    id: plan.key.id.to_string(),
                    if_match: sent.to_owned(),
                }));
            }
            let next = || self.versions.fetch_add(1, Ordering::Relaxed);
            // A new body, kept by the must-live rules.
            let written = |body: &DocumentBody| {
                must_live
                    .check(info.id.as_str(), body.map(), body.ttl())
                    .map_err(|e| failed(e.into()))?;
                let (stored, ttl) = body.clone().into_stored();
                Ok::<_, Stop>(Arc::new(Staged {
                    body: stored,
                    ttl,
                    version: next(),
                    written: None,
                }))
            };
            let result = match op {
                BatchOp::Create { body } | BatchOp::Replace { body, .. } => {
                    let staged = written(body)?;
                    plan.new_body = Some((index, body.map().clone()));
                    plan.current = Current::Live(staged.clone());
                    Pending::Document(k, staged)
                }
                BatchOp::Upsert { body, .. } => {
                    let staged = written(body)?;
                    plan.new_body = Some((index, body.map().clone()));
                    plan.current = Current::Live(staged.clone());
                    let outcome = if live {
                        UpsertOutcome::Replaced
                    } else {
                        UpsertOutcome::Created
                    };
                    Pending::Upserted(outcome, k, staged)
                }
                BatchOp::Delete { .. } => {
                    plan.current = Current::Absent;
                    plan.new_body = None;
                    Pending::Deleted
                }
                BatchOp::Patch {
                    ops,
                    condition,
                    options,
                    ..
                } => {
                    let (mut map, created) = match (&plan.current, &options.create_if_missing) {
                        (Current::Live(staged), _) => {
                            let view = staged_view(&plan.key, staged, now, now, Some(default_ttl));
                            if let Some(condition) = condition {
                                condition.check(&view).map_err(failed)?;
                            }
                            (view.body_map(), false)
                        }
                        // Created: the caller's body is not checked against the condition.
                        (Current::Absent, Some(initial)) => ((**initial.map()).clone(), true),
                        _ => unreachable!("fetched above, or refused as absent"),
                    };
                    patch::apply(&mut map, ops, options.create_parents)
                        .map_err(|e| failed(e.into()))?;
                    let body =
                        DocumentBody::parse(Arc::new(map), None).map_err(|e| failed(e.into()))?;
                    Engine::key_for(info, &body, Some(plan.key.partition_key.clone()))
                        .map_err(|e| failed(e.into()))?;
                    let staged = written(&body)?;
                    plan.new_body = Some((index, body.map().clone()));
                    plan.current = Current::Live(staged.clone());
                    match created {
                        true => Pending::Created(k, staged),
                        false => Pending::Document(k, staged),
                    }
                }
                BatchOp::Read { .. } | BatchOp::Touch { .. } => {
                    let Current::Live(staged) = plan.current.clone() else {
                        unreachable!("fetched above");
                    };
                    match op {
                        BatchOp::Read { .. } => Pending::Document(k, staged),
                        _ => {
                            let touched = Arc::new(Staged {
                                body: staged.body.clone(),
                                ttl: staged.ttl,
                                version: next(),
                                written: None,
                            });
                            plan.current = Current::Live(touched.clone());
                            Pending::Document(k, touched)
                        }
                    }
                }
            };
            if !matches!(op, BatchOp::Read { .. }) {
                plan.changed = true;
            }
            if let Pending::Document(_, s) | Pending::Upserted(_, _, s) | Pending::Created(_, s) =
                &result
            {
                returned += s.body.len();
                over_limit(op, index, returned, "returns")?;
            }
            pending.push(result);
        }
        // Index entries: old terms fetched and new ones computed here, outside the lock.
        let mut terms = Vec::with_capacity(keys.len());
        let mut term_bytes = 0;
        for plan in keys.iter() {
            let ends_live = !matches!(plan.current, Current::Absent);
            let entries_change = plan.changed
                && if ends_live {
                    // A new body, unless left to the background indexer.
                    plan.new_body.is_some() && !(lazy && policy.is_some())
                } else {
                    // A delete of what was stored.
                    plan.seen.live
                };
            if !entries_change {
                terms.push(None);
                continue;
            }
            let old = if plan.seen.slot.is_some() && plan.seen.indexed {
                self.stored_terms(info, &plan.key)?
            } else {
                Vec::new()
            };
            let new = match (&plan.new_body, policy) {
                (Some((index, map)), Some(p)) if ends_live => bounded_document_terms(map, p)
                    .map_err(|e| Stop::Failed(ops[*index].failed(*index, e)))?,
                _ => Vec::new(),
            };
            term_bytes += old.iter().chain(&new).map(Vec::len).sum::<usize>();
            if term_bytes > MAX_BATCH_TERM_BYTES {
                // Charged to the last operation that wrote the document.
                let index = plan
                    .new_body
                    .as_ref()
                    .map_or_else(|| last_write_of(ops, &plan.key.id), |(index, _)| *index);
                return Err(Stop::Failed(ops[index].failed(
                    index,
                    InvalidInput::BatchTooLarge {
                        what: "indexes",
                        limit: MAX_BATCH_TERM_BYTES,
                    },
                )));
            }
            terms.push(Some((old, new)));
        }
        Ok(Evaluated { pending, terms })
    }

    /// Commits an evaluated batch as one write and views its results as of `at`.
    fn commit_batch(
        &self,
        mut state: MutexGuard<'_, ShardState>,
        info: &CollectionInfo,
        keys: &[KeyPlan],
        evaluated: Evaluated,
        (at, seen_at): (Millis, Lsn),
        remember: Option<Change>,
    ) -> Outcome<Vec<BatchOutput>> {
        let st = &mut *state;
        let cs = &st.collections[&info.uid];
        let owed = cs.lazy && cs.policy.is_some();
        let mut changes = Vec::new();
        for (plan, terms) in keys.iter().zip(evaluated.terms) {
            if !plan.changed {
                continue;
            }
            match (&plan.current, terms) {
                (Current::Live(staged), terms) => {
                    let index = match terms {
                        Some((old, new)) => IndexChange::Replace(old, new),
                        None if plan.new_body.is_some() && owed => IndexChange::Owed,
                        // Touched only: the same body keeps its entries.
                        None => IndexChange::Unchanged,
                    };
                    changes.push(Change::Put {
                        slot: plan.seen.slot,
                        record: Arc::new(StoredDocument {
                            collection: info.uid,
                            key: plan.key.clone(),
                            body: staged.body.clone(),
                            last_write: at,
                            version: staged.version,
                            ttl: staged.ttl,
                        }),
                        index,
                        // A batch's operations on one document commit as one version.
                        patch: false,
                    });
                }
                // A stored document deleted (evaluate gives every such one its terms).
                (Current::Absent, Some((old, _))) => changes.push(Change::Remove {
                    slot: plan.seen.slot.expect("a live document has a slot"),
                    cause: RemoveCause::Deleted,
                    terms: old,
                }),
                // Created and deleted by the batch: nothing is stored, but the versions it
                // was handed must stay handed out.
                (Current::Absent, None) => {
                    if !changes.iter().any(|c| matches!(c, Change::KeepFloor)) {
                        changes.push(Change::KeepFloor);
                    }
                }
                (Current::Fetch, _) => unreachable!("a changed document was fetched or replaced"),
            }
        }
        // A keyed batch is remembered even if it changed nothing (only reads): the same key
        // with another request is then refused, as for any other.
        let charge: RequestCharge = changes.iter().map(Change::charge).sum();
        changes.extend(remember);
        let (deadline, settle_at) = if changes.is_empty() {
            (None, seen_at)
        } else {
            match st.commit(&*self.store, &changes, &self.metrics, &self.versions) {
                Ok((deadline, lsn)) => {
                    st.client_lsn = lsn;
                    (deadline, lsn.max(seen_at))
                }
                Err(e) => return Outcome::failed(e),
            }
        };
        let cs = &st.collections[&info.uid];
        let default_ttl = cs.rules.default_ttl;
        let settle_at = settle_at.max(cs.settings_lsn);
        drop(state);
        self.wake_purge_for(deadline);
        if owed && keys.iter().any(|k| k.changed && k.new_body.is_some()) {
            self.indexer_wake.notify_one();
        }
        let outputs = evaluated
            .pending
            .into_iter()
            .map(|p| match p {
                Pending::Document(k, s) => {
                    BatchOutput::Document(staged_view(&keys[k].key, &s, at, at, Some(default_ttl)))
                }
                Pending::Upserted(outcome, k, s) => BatchOutput::Upserted(
                    outcome,
                    staged_view(&keys[k].key, &s, at, at, Some(default_ttl)),
                ),
                Pending::Created(k, s) => {
                    BatchOutput::Created(staged_view(&keys[k].key, &s, at, at, Some(default_ttl)))
                }
                Pending::Deleted => BatchOutput::Deleted,
            })
            .collect();
        Outcome::new(Ok(outputs), settle_at).charged(charge)
    }
}

impl Optimistic for Batch<'_> {
    type Seen = Looked;
    /// The policy, the mode, and each document as the batch saw it.
    type Basis = (Option<Arc<IndexPaths>>, bool, Arc<MustLive>, Vec<Seen>);
    /// The documents as the operations left them, and what the commit writes.
    type Read = (Vec<KeyPlan>, Evaluated);
    type Output = Vec<BatchOutput>;

    /// What the shard holds at each key, now.
    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)> {
        let Some(cs) = st.collections.get(&self.info.uid) else {
            return Err((collection_gone(self.info), Lsn::ZERO));
        };
        let mut seen_at = observed(st, cs);
        let keys: Vec<KeyPlan> = self
            .ids
            .iter()
            .map(|&id| {
                let key = DocKey {
                    partition_key: self.partition_key.clone(),
                    id: id.clone(),
                };
                let slot = cs.index.get(&key).copied();
                let meta = slot.map(|s| st.docs.get(s));
                let live = meta.is_some_and(|m| m.is_visible(&cs.rules, now));
                if let Some(m) = meta {
                    seen_at = seen_at.max(m.lsn);
                }
                KeyPlan {
                    seen: Seen {
                        slot,
                        version: meta.map_or(0, |m| m.version),
                        live,
                        indexed: meta.is_some_and(|m| m.indexed),
                        dead: meta.is_some_and(|m| m.dead),
                        purged: meta.is_some_and(|m| m.purged),
                        terms: slot.map(|s| st.docs.terms_ref(s)),
                    },
                    key,
                    current: if live {
                        Current::Fetch
                    } else {
                        Current::Absent
                    },
                    new_body: None,
                    changed: false,
                }
            })
            .collect();
        let basis = (
            cs.policy.clone(),
            cs.lazy,
            cs.must_live.clone(),
            keys.iter().map(|k| k.seen).collect(),
        );
        let looked = Looked {
            keys,
            policy: cs.policy.clone(),
            lazy: cs.lazy,
            default_ttl: cs.rules.default_ttl,
            must_live: cs.must_live.clone(),
            now,
            seen_at,
        };
        Ok(Look::Read(looked, basis))
    }

    fn read(&self, shard: &Shard, seen: &Looked) -> Result<Self::Read, Stop> {
        let mut keys = seen.keys.clone();
        let rules = (&seen.policy, seen.lazy, seen.default_ttl, &*seen.must_live);
        let evaluated = shard.evaluate(self.info, self.ops, &mut keys, rules, seen.now)?;
        Ok((keys, evaluated))
    }

    fn reflects(seen: &Looked) -> Lsn {
        seen.seen_at
    }

    fn commit(self, shard: &Shard, ready: Ready<'_, Self>) -> Outcome<Vec<BatchOutput>> {
        let (keys, evaluated) = ready.read;
        let seen_at = ready.seen.seen_at;
        let when = (ready.now, seen_at);
        let outcome = shard.commit_batch(
            ready.state,
            self.info,
            &keys,
            evaluated,
            when,
            ready.remember,
        );
        // The writes' charge is the commit's; each read costs a point read of what it read.
        let reads: RequestCharge = match &outcome.result {
            Ok(outputs) => self
                .ops
                .iter()
                .zip(outputs)
                .filter(|(op, _)| !op.writes())
                .map(|(_, output)| match output {
                    BatchOutput::Document(view) => RequestCharge::point_read(view.body.len()),
                    _ => RequestCharge::LOOKUP,
                })
                .sum(),
            Err(_) => RequestCharge::ZERO,
        };
        let charge = outcome.charge + reads;
        outcome.charged(charge)
    }
}

/// Fails the batch at `op` (number `index`) once it `what`s more than [`MAX_BATCH_BYTES`].
fn over_limit(op: &BatchOp, index: usize, bytes: usize, what: &'static str) -> Result<(), Stop> {
    if bytes > MAX_BATCH_BYTES {
        return Err(Stop::Failed(op.failed(
            index,
            InvalidInput::BatchTooLarge {
                what,
                limit: MAX_BATCH_BYTES,
            },
        )));
    }
    Ok(())
}

/// The last operation writing document `id` (there is one: its entries change).
fn last_write_of(ops: &[BatchOp], id: &DocumentId) -> usize {
    ops.iter()
        .rposition(|op| op.writes() && op.id() == id)
        .unwrap_or_default()
}

/// A staged document as a client sees it: written at `commit` if the batch wrote it, judged at
/// `read_at`; without the collection's default TTL, no expiry instant (a condition's view).
fn staged_view(
    key: &DocKey,
    staged: &Staged,
    commit: Millis,
    read_at: Millis,
    default_ttl: Option<DefaultTtl>,
) -> DocumentView {
    let last_write = staged.written.unwrap_or(commit);
    DocumentView {
        key: key.clone(),
        body: staged.body.clone(),
        last_write,
        etag: Etag(staged.version),
        ttl: staged.ttl,
        expires_at: default_ttl.and_then(|d| ttl::expires_at(last_write, staged.ttl, d)),
        read_at,
    }
}
