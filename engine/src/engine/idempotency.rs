//! Idempotency keys: a write sent with a key is applied at most once while its key is
//! remembered, so a client that lost the answer (a timeout, a broken connection: the outcome
//! is unknown) can send it again safely.
//!
//! A key is remembered per collection and partition key value, in the shard that owns the
//! partition, as a record written **in the same storage batch as the write it applied**: a
//! crash keeps both or neither, so a retry after a restart is still recognised. The check is
//! made under the shard lock in the same hold as the commit, so two copies of one request
//! racing each other apply once. A retry of an applied request gets the first answer again
//! (kept in memory, within [`IdempotencyConfig::answer_bytes`]), marked as replayed; once the
//! answer is no longer kept (the server restarted since, or newer answers filled the budget)
//! it gets [`Error::RequestApplied`], which says the write was applied and changes nothing.
//! The same key with a different request is refused ([`Error::KeyReused`]). Requests that
//! fail are not remembered: they changed nothing, and a retry runs again.
//!
//! A key is forgotten [`IdempotencyConfig::window`] after the write it applied (ten minutes
//! by default, as DynamoDB's `ClientRequestToken`). A shard remembers at most its share of
//! [`IdempotencyConfig::max_keys`]: a keyed write beyond that is refused ([`Error::KeysFull`],
//! with the time until the oldest key is forgotten) rather than allowed to forget a key
//! early, which would break the promise silently.

use std::{
    any::Any,
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use super::{BatchOutput, DocumentView, clock::Millis, error::Error};
use crate::model::{CollectionUid, DocumentId};
use crate::storage::RequestRecord;
use crate::storage::{DocKey, Lsn};

/// How long keys are remembered when no window is configured: ten minutes.
pub const DEFAULT_WINDOW_MS: Millis = 10 * 60 * 1000;
/// Keys remembered at once, across the shards, when no bound is configured.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// Bytes of answers kept for replay, across the shards, when no budget is configured.
pub const DEFAULT_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Expired keys a keyed commit forgets (in its own storage batch) besides remembering its own:
/// more than one, so forgetting keeps up with remembering.
const FORGET_PER_COMMIT: usize = 16;

/// How long keys are remembered, and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// From the write a key applied until it is forgotten, in milliseconds.
    pub window: Millis,
    /// Keys remembered at once across the engine (each shard takes its share).
    pub max_keys: usize,
    /// Bytes of first answers kept for replay across the engine (each shard takes its share).
    pub answer_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            window: DEFAULT_WINDOW_MS,
            max_keys: DEFAULT_MAX_KEYS,
            answer_bytes: DEFAULT_ANSWER_BYTES,
        }
    }
}

impl IdempotencyConfig {
    /// One shard's share of the bounds.
    pub(crate) fn per_shard(self, shards: usize) -> Self {
        let shards = shards.max(1);
        IdempotencyConfig {
            window: self.window,
            max_keys: self.max_keys.div_ceil(shards).max(1),
            answer_bytes: self.answer_bytes / shards,
        }
    }
}

/// A write request's idempotency key, with a digest of the rest of the request: the same key
/// with another digest is another request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKey {
    /// Chosen by the client; the rules of a document id (see [`crate::model::ResourceId`]).
    pub key: DocumentId,
    /// A digest of the request without its key (the edge computes it).
    pub fingerprint: [u8; 16],
}

/// An answer that can be kept for replay: cloned out to each retry, its size counted against
/// the answer budget.
pub(crate) trait Answer: Clone + Send + Sync + 'static {
    /// Roughly the bytes it holds.
    fn bytes(&self) -> usize;
}

impl Answer for () {
    fn bytes(&self) -> usize {
        0
    }
}

impl Answer for DocumentView {
    fn bytes(&self) -> usize {
        self.body.len() + self.key.id.as_str().len() + 64
    }
}

impl Answer for (DocumentView, bool) {
    fn bytes(&self) -> usize {
        self.0.bytes()
    }
}

impl Answer for Vec<BatchOutput> {
    fn bytes(&self) -> usize {
        self.iter()
            .map(|o| match o {
                BatchOutput::Document(d)
                | BatchOutput::Upserted(_, d)
                | BatchOutput::Created(d) => d.bytes(),
                BatchOutput::Deleted => 8,
            })
            .sum()
    }
}

/// A value, and whether it is the replayed answer of an earlier, identical request.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered<T> {
    pub value: T,
    pub replayed: bool,
}

impl<T> Answered<T> {
    /// The same answer with its value transformed.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Answered<U> {
        Answered {
            value: f(self.value),
            replayed: self.replayed,
        }
    }
}

/// A remembered key's answer.
#[derive(Debug, Clone)]
enum Kept {
    /// Its write committed a moment ago; the answer is on its way into the table.
    Pending,
    /// The first answer, for replay, and its size.
    Answer(Arc<dyn Any + Send + Sync>, usize),
    /// Not kept (recovered from storage, or dropped for the budget).
    Gone,
}

#[derive(Debug)]
struct Remembered {
    record: RequestRecord,
    /// Where its write is in the storage log: a replay settles there.
    lsn: Lsn,
    kept: Kept,
}

/// A remembered key's scope: the collection and partition its request wrote to, and the key
/// (as the id).
type Scope = (CollectionUid, DocKey);

/// What a look at the table found for a request.
pub(crate) enum Found<T> {
    /// Not remembered: run the request, and remember it in the commit with this record.
    New(RequestRecord),
    /// Remembered: this is the answer (settling at this position).
    Replay(T, Lsn),
    /// Remembered a moment ago; its answer is not in the table yet: look again shortly.
    Pending,
}

/// The keys one shard remembers (in its state, under its lock).
#[derive(Debug)]
pub(crate) struct RequestTable {
    config: IdempotencyConfig,
    keys: HashMap<Scope, Remembered>,
    /// Keys in the order they are forgotten (the window is the same for all).
    order: VecDeque<(Millis, Scope)>,
    /// Keys whose answers are kept, oldest first (entries whose answer went are skipped).
    answers: VecDeque<Scope>,
    answer_bytes: usize,
}

impl RequestTable {
    pub(crate) fn new(config: IdempotencyConfig) -> Self {
        RequestTable {
            config,
            keys: HashMap::new(),
            order: VecDeque::new(),
            answers: VecDeque::new(),
            answer_bytes: 0,
        }
    }

    /// What the table says of `request` at `now` (a key past its window is not remembered,
    /// whether or not it was forgotten yet).
    pub(crate) fn look<T: Answer>(
        &self,
        collection: CollectionUid,
        scope: &DocKey,
        request: &RequestKey,
        now: Millis,
    ) -> Result<Found<T>, Error> {
        let key = (collection, scope.clone());
        let remembered = self.keys.get(&key).filter(|r| r.record.forget_at > now);
        let Some(r) = remembered else {
            if self.keys.len() >= self.config.max_keys && !self.has_expired(now) {
                let oldest = self.order.front().map_or(now, |(at, _)| *at);
                return Err(Error::KeysFull {
                    max: self.config.max_keys,
                    retry_after_ms: oldest.saturating_sub(now).max(1),
                });
            }
            return Ok(Found::New(RequestRecord {
                fingerprint: request.fingerprint,
                applied_at: now,
                forget_at: now.saturating_add(self.config.window),
            }));
        };
        let reused = || Error::KeyReused {
            key: request.key.to_string(),
            applied_at: r.record.applied_at,
        };
        if r.record.fingerprint != request.fingerprint {
            return Err(reused());
        }
        match &r.kept {
            Kept::Pending => Ok(Found::Pending),
            Kept::Answer(answer, _) => match answer.downcast_ref::<T>() {
                Some(answer) => Ok(Found::Replay(answer.clone(), r.lsn)),
                // Another kind of request with the same key and digest: a digest collision.
                None => Err(reused()),
            },
            Kept::Gone => Err(Error::RequestApplied {
                key: request.key.to_string(),
                applied_at: r.record.applied_at,
            }),
        }
    }

    fn has_expired(&self, now: Millis) -> bool {
        self.order.front().is_some_and(|(at, _)| *at <= now)
    }

    /// Remembers a key whose write committed at `lsn` (the commit path calls this once the
    /// record is stored), its answer pending.
    pub(crate) fn remember(
        &mut self,
        collection: CollectionUid,
        scope: DocKey,
        record: RequestRecord,
        lsn: Lsn,
    ) {
        self.insert((collection, scope), record, lsn, Kept::Pending);
    }

    /// A key an owner remembered elsewhere, applied here from its partition's log (cluster
    /// mode): remembered, its answer not shipped.
    pub(crate) fn remember_applied(
        &mut self,
        collection: CollectionUid,
        scope: DocKey,
        record: RequestRecord,
        lsn: Lsn,
    ) {
        self.insert((collection, scope), record, lsn, Kept::Gone);
    }

    /// Every key remembered and not past its window at `now`, with its record: what a
    /// snapshot of the shard carries (cluster mode).
    pub(crate) fn live(&self, now: Millis) -> Vec<(CollectionUid, DocKey, RequestRecord)> {
        let mut out: Vec<_> = self
            .keys
            .iter()
            .filter(|(_, r)| r.record.forget_at > now)
            .map(|((c, k), r)| (*c, k.clone(), r.record))
            .collect();
        out.sort_by_key(|(_, _, r)| r.forget_at);
        out
    }

    /// A key recovered from storage: remembered, its answer gone.
    pub(crate) fn recover(
        &mut self,
        collection: CollectionUid,
        scope: DocKey,
        record: RequestRecord,
    ) {
        self.insert((collection, scope), record, Lsn::ZERO, Kept::Gone);
    }

    fn insert(&mut self, key: Scope, record: RequestRecord, lsn: Lsn, kept: Kept) {
        let new = Remembered { record, lsn, kept };
        // A key past its window remembered again: its old entry in `order` is skipped later.
        if let Some(old) = self.keys.insert(key.clone(), new)
            && let Kept::Answer(_, bytes) = old.kept
        {
            self.answer_bytes -= bytes;
        }
        self.order.push_back((record.forget_at, key));
    }

    /// Keeps the answer of the pending key `scope` for replay, within the answer budget (the
    /// oldest kept answers go first).
    pub(crate) fn answer<T: Answer>(
        &mut self,
        collection: CollectionUid,
        scope: &DocKey,
        answer: &T,
    ) {
        let key = (collection, scope.clone());
        let Some(r) = self.keys.get_mut(&key) else {
            return;
        };
        if !matches!(r.kept, Kept::Pending) {
            return;
        }
        let bytes = answer.bytes();
        if bytes > self.config.answer_bytes {
            r.kept = Kept::Gone;
            return;
        }
        r.kept = Kept::Answer(Arc::new(answer.clone()), bytes);
        self.answer_bytes += bytes;
        self.answers.push_back(key);
        while self.answer_bytes > self.config.answer_bytes {
            let Some(oldest) = self.answers.pop_front() else {
                break;
            };
            if let Some(r) = self.keys.get_mut(&oldest)
                && let Kept::Answer(_, bytes) = r.kept
            {
                r.kept = Kept::Gone;
                self.answer_bytes -= bytes;
            }
        }
    }

    /// Up to [`FORGET_PER_COMMIT`] keys past their window at `now`, taken out of the order
    /// (not yet out of the table: [`RequestTable::forget`] does that once storage has them
    /// deleted).
    pub(crate) fn due(&mut self, now: Millis) -> Vec<Scope> {
        let mut due = Vec::new();
        while due.len() < FORGET_PER_COMMIT {
            match self.order.front() {
                Some((at, _)) if *at <= now => {
                    let (at, key) = self.order.pop_front().expect("front exists");
                    // Skip an entry left by a key remembered again since.
                    if self
                        .keys
                        .get(&key)
                        .is_some_and(|r| r.record.forget_at == at)
                    {
                        due.push(key);
                    }
                }
                _ => break,
            }
        }
        due
    }

    /// Forgets keys whose records storage deleted.
    pub(crate) fn forget(&mut self, keys: &[Scope]) {
        for key in keys {
            if let Some(r) = self.keys.remove(key)
                && let Kept::Answer(_, bytes) = r.kept
            {
                self.answer_bytes -= bytes;
            }
        }
        // Keys are forgotten oldest first, as answers are kept: the queue of kept answers
        // sheds the forgotten ones from its front, so it holds no more than the table.
        while self.answers.front().is_some_and(
            |key| !matches!(self.keys.get(key), Some(r) if matches!(r.kept, Kept::Answer(..))),
        ) {
            self.answers.pop_front();
        }
    }

    /// Kept answers queued (at least the answers kept; forgotten ones leave from the front).
    #[cfg(test)]
    pub(crate) fn queued_answers(&self) -> usize {
        self.answers.len()
    }
}
