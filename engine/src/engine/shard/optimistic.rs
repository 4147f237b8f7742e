//! One optimistic commit for every client write on a shard: put (create, upsert, replace),
//! touch, delete, patch and transactional batch. Each is a [`Optimistic`] write that the one
//! loop, [`Shard::commit_optimistic`], runs: **look** under the shard lock (judge the request
//! against what the shard holds, note what its reads depend on), **read** outside it (old
//! index terms, the current body, a patch applied, a batch evaluated), then look again under
//! the lock and, if what the reads depend on is unchanged, **commit** in that same hold of the
//! lock, through the one commit path ([`ShardState::commit`]). A write that needs no reads
//! commits at its first look, holding the lock once.
//!
//! # The retry rule
//!
//! A look that finds the shard changed since the reads were made (another write committed in
//! between) sends the write back to read again. Every write gets
//! [`OPTIMISTIC_ATTEMPTS`] reads made outside the lock; a write stale after all of them is
//! contended, and the rule's one parameter, a [`Fallback`], says what it does then:
//!
//! - [`Fallback::UnderLock`] (put, touch, delete, patch: one document): one last attempt
//!   whose reads, and the work on them, are made while holding the lock, so it cannot go stale
//!   and the write never fails for contention alone. That work is bounded by one document (a
//!   storage read of its body or terms; for a patch, its condition within one document's
//!   evaluation budget, at most ten operations applied to at most 2 MiB, and its index terms),
//!   the order of what a put already does under the lock when the policy changed under it;
//!   and it is reached only by a document rewritten during each of the attempts before.
//!   Concurrent patches (an `incr` from many clients) thus all count.
//! - [`Fallback::Contended`] (batch): [`Error::Contended`], nothing applied. A batch's reads
//!   and work span up to a hundred documents (8 MiB read, 16 MiB of terms): held under the
//!   lock they would stall the shard, so it is refused instead, which clients may retry (the
//!   error says so, and the client's retry policy treats it as nothing applied).
//!
//! Eight: a retry means another write to the same document landed in the window of a few
//! microseconds between two looks, so eight stale reads in a row take a document written
//! continuously by several clients; fewer would hold the lock through storage reads more
//! often, more would spend more reads (and, for a batch, evaluations of up to 8 MiB) on a
//! write that is losing anyway.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use crate::engine::{
    PartitionKeyValue,
    idempotency::{Answer, Answered, Found, RequestKey},
};

/// Reads a write makes outside the shard lock before it is contended (see the module's rule).
/// Point reads follow the same rule ([`Shard::read`]).
pub(in crate::engine) const OPTIMISTIC_ATTEMPTS: usize = 8;

/// What a write does once every optimistic read of it went stale: the rule's one parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fallback {
    /// One last attempt with its reads made while holding the lock: for writes whose reads
    /// and work are bounded by one document.
    UnderLock,
    /// Fail with [`Error::Contended`]: for writes whose work would stall the shard.
    Contended,
}

/// What a look under the lock decided.
pub(super) enum Look<W: Optimistic> {
    /// Nothing to read: commit now, in this hold of the lock.
    Commit(W::Seen, W::Read),
    /// Read first; the reads stay good for as long as the shard shows the same basis.
    Read(W::Seen, W::Basis),
}

/// Why reads did not give what a commit needs.
#[derive(Debug)]
pub(super) enum Stop {
    /// The shard no longer holds what they were made for: look again.
    Stale,
    /// The write fails with this; it settles where [`Optimistic::reflects`] says.
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

impl From<StorageError> for Stop {
    fn from(e: StorageError) -> Self {
        Stop::Failed(e.into())
    }
}

/// One write, as the optimistic loop runs it.
pub(super) trait Optimistic: Sized {
    /// What a look found: what the reads and the commit need.
    type Seen;
    /// What the reads depend on: two looks that find it equal find them still current.
    type Basis: PartialEq;
    /// What the reads gave (and what was made from it).
    type Read;
    type Output;

    /// Under the lock, at the shard's reading `now`: judges the request against what the
    /// shard holds (a refusal is the answer, with the position it settles at) and decides
    /// what to read.
    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)>;

    /// Makes the reads `seen` needs, and the work on them: without the lock, but while
    /// holding it on a [`Fallback::UnderLock`] write's last attempt.
    fn read(&self, shard: &Shard, seen: &Self::Seen) -> Result<Self::Read, Stop>;

    /// Where a failure of reads made for `seen` settles: the state they reflect. Storage
    /// failures reflect none.
    fn reflects(_seen: &Self::Seen) -> Lsn {
        Lsn::ZERO
    }

    /// Commits the write through the commit path.
    fn commit(self, shard: &Shard, ready: Ready<'_, Self>) -> Outcome<Self::Output>;
}

/// What a commit is given: the lock, and reads current for what the look made in this hold
/// of it found.
pub(super) struct Ready<'s, W: Optimistic> {
    pub(super) state: MutexGuard<'s, ShardState>,
    pub(super) seen: W::Seen,
    pub(super) read: W::Read,
    /// The shard's reading at that look.
    pub(super) now: Millis,
    /// For a keyed request: the change that remembers it, for the commit to make with its own.
    pub(super) remember: Option<Change>,
}

/// A write request's idempotency key, and the collection and partition it writes to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keyed<'a> {
    pub(crate) collection: CollectionUid,
    pub(crate) partition_key: &'a PartitionKeyValue,
    pub(crate) request: &'a RequestKey,
}

/// How long a copy of a request waits for the answer of its twin that has just committed
/// (microseconds away, normally) before it is told the request was applied instead.
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Shard {
    /// Runs `write` by the module's rule, `fallback` its parameter: look, read, look again and
    /// commit, until a look finds the reads current or the write is contended.
    ///
    /// With `keyed`, every look first asks the shard's request table (see
    /// [`crate::engine::idempotency`]), in the same hold of the lock as the commit: a request
    /// remembered there is answered from it, and a new one is remembered by its commit.
    pub(super) fn commit_optimistic<W: Optimistic>(
        &self,
        write: W,
        fallback: Fallback,
        clock: &dyn Clock,
        keyed: Option<Keyed<'_>>,
    ) -> Outcome<Answered<W::Output>>
    where
        W::Output: Answer,
    {
        // Whatever it answers reflects this shard's writes only.
        self.optimistic(write, fallback, clock, keyed)
            .within(self.set)
    }

    fn optimistic<W: Optimistic>(
        &self,
        write: W,
        fallback: Fallback,
        clock: &dyn Clock,
        keyed: Option<Keyed<'_>>,
    ) -> Outcome<Answered<W::Output>>
    where
        W::Output: Answer,
    {
        let scope = keyed.map(|k| DocKey {
            partition_key: k.partition_key.clone(),
            id: k.request.key.clone(),
        });
        let mut made: Option<(W::Basis, W::Read)> = None;
        let mut reads = 0;
        let mut waiting: Option<std::time::Instant> = None;
        let (state, seen, read, now, remember) = loop {
            let mut state = self.lock();
            if let Some(refused) = self.not_serving(&state) {
                return Outcome::failed(refused);
            }
            let now = state.now(clock);
            let remember = match (keyed, &scope) {
                (Some(k), Some(scope)) => {
                    match state
                        .requests
                        .look::<W::Output>(k.collection, scope, k.request, now)
                    {
                        Ok(Found::New(record)) => Some(Change::Remember {
                            collection: k.collection,
                            scope: scope.clone(),
                            record,
                        }),
                        Ok(Found::Replay(value, lsn)) => {
                            let replayed = Answered {
                                value,
                                replayed: true,
                            };
                            return Outcome::new(Ok(replayed), lsn);
                        }
                        Ok(Found::Pending) => {
                            drop(state);
                            let since = *waiting.get_or_insert_with(std::time::Instant::now);
                            if since.elapsed() > PENDING_WAIT {
                                return Outcome::failed(Error::RequestApplied {
                                    key: k.request.key.to_string(),
                                    applied_at: now,
                                });
                            }
                            std::thread::yield_now();
                            continue;
                        }
                        Err(e) => return Outcome::failed(e),
                    }
                }
                _ => None,
            };
            let (seen, basis) = match write.look(&state, now) {
                Ok(Look::Commit(seen, read)) => break (state, seen, read, now, remember),
                Ok(Look::Read(seen, basis)) => (seen, basis),
                Err((e, at)) => return Outcome::new(Err(e), at),
            };
            let read = match made.take() {
                Some((was, read)) if was == basis => read,
                _ if reads < OPTIMISTIC_ATTEMPTS => {
                    drop(state);
                    reads += 1;
                    match write.read(self, &seen) {
                        Ok(read) => made = Some((basis, read)),
                        Err(Stop::Stale) => {}
                        Err(Stop::Failed(e)) => return Outcome::new(Err(e), W::reflects(&seen)),
                    }
                    #[cfg(test)]
                    tests::after_read();
                    continue;
                }
                _ if fallback == Fallback::Contended => {
                    return Outcome::failed(Error::Contended { attempts: reads });
                }
                // Rewritten during every attempt so far: read while holding the lock, once.
                _ => match write.read(self, &seen) {
                    Ok(read) => read,
                    Err(Stop::Stale) => return Outcome::failed(unheld_version()),
                    Err(Stop::Failed(e)) => return Outcome::new(Err(e), W::reflects(&seen)),
                },
            };
            break (state, seen, read, now, remember);
        };
        let outcome = write.commit(
            self,
            Ready {
                state,
                seen,
                read,
                now,
                remember,
            },
        );
        // A keyed write that committed remembered its key, its answer pending: keep it.
        if let (Some(k), Some(scope), Ok(value)) = (keyed, &scope, &outcome.result) {
            self.lock().requests.answer(k.collection, scope, value);
        }
        outcome.map(|value| Answered {
            value,
            replayed: false,
        })
    }

    /// A document's stored index terms (none if it has no terms record).
    pub(super) fn stored_terms(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
    ) -> Result<Vec<Term>, Stop> {
        Ok(self
            .store
            .get_terms(info.uid, key)?
            .map(|t| t.terms)
            .unwrap_or_default())
    }
}

/// Reads made under the lock found storage without the version the shard holds.
fn unheld_version() -> Error {
    Error::Storage(StorageError::new(
        "storage does not hold the document version its shard holds",
    ))
}

/// What tests use to put a write of their own between an optimistic read and the next look.
#[cfg(test)]
pub(in crate::engine) mod tests {
    use std::cell::RefCell;

    thread_local! {
        static AFTER_READ: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    }

    /// Runs `hook` after each optimistic read this thread makes, outside the lock, until the
    /// returned guard is dropped; writes the hook makes run without it.
    pub(in crate::engine) fn after_each_read(hook: impl FnMut() + 'static) -> HookGuard {
        AFTER_READ.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
        HookGuard
    }

    /// Removes the hook when dropped.
    pub(in crate::engine) struct HookGuard;

    impl Drop for HookGuard {
        fn drop(&mut self) {
            AFTER_READ.with(|h| h.borrow_mut().take());
        }
    }

    pub(super) fn after_read() {
        // Taken while it runs: the writes it makes do not run it again.
        let Some(mut hook) = AFTER_READ.with(|h| h.borrow_mut().take()) else {
            return;
        };
        hook();
        AFTER_READ.with(|h| {
            h.borrow_mut().get_or_insert(hook);
        });
    }
}
