//! What one page of a feed or query may do and has done: the log position its results
//! reflect; for a run tried on an async worker, how many more reads it may make there; the
//! time it may run; whether its client left or the server is stopping; and where the memory
//! its results take is reserved before they are built.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::{Error, clock::Millis};
use crate::storage::Lsn;

/// How long a query that reads its whole scope (or one page) may run.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(30);

/// Storage reads (index entries and documents) a query may make on an async worker, on
/// storage whose reads never wait (memory). A query this small (an equality returning ten
/// documents, a `TOP 10` from an index) is answered there, sparing the two thread hand-offs of
/// a blocking task, which cost more than the query itself on a small machine. A query that
/// needs more stops at the first read past it and is run again, from its start, on a blocking
/// thread: the work lost is this many reads and at most one batch of index entries.
pub const INLINE_READS: u64 = 64;

/// The same on storage whose reads may wait on the disk: fewer, so that an async worker waits
/// at most this many reads' worth, as a point read (one document read on the worker) waits for
/// one. With the data cached (the common case), a ten-document equality or a `TOP 10` from an
/// index is answered without a thread hand-off; anything larger runs on a blocking thread, where
/// many reads can wait at once.
pub const INLINE_READS_MAY_BLOCK: u64 = 32;

/// How long a query may run on an async worker before it is moved off it (checked before each
/// read and each document evaluated, and inside a document's evaluation every few hundred
/// steps).
pub(crate) const INLINE_TIME: Duration = Duration::from_millis(2);

/// Tells a run to stop before it is done: its client left, or the server is shutting down.
/// Looked at before each read, each document, and every few hundred evaluation steps.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    call: Arc<AtomicBool>,
    server: Arc<AtomicBool>,
}

impl Cancel {
    /// A signal for one call, raised too when `self` (the server's) is.
    pub fn for_call(&self) -> Self {
        Cancel {
            call: Arc::default(),
            server: self.server.clone(),
        }
    }

    /// The call's client left.
    pub fn cancel(&self) {
        self.call.store(true, Ordering::Relaxed);
    }

    /// The server is shutting down: every call made from this signal stops.
    pub fn shut_down(&self) {
        self.server.store(true, Ordering::Relaxed);
    }

    /// Why the run must stop, if it must.
    pub fn reason(&self) -> Option<Error> {
        if self.server.load(Ordering::Relaxed) {
            Some(Error::ShuttingDown)
        } else if self.call.load(Ordering::Relaxed) {
            Some(Error::Cancelled)
        } else {
            None
        }
    }
}

/// Where a page reserves the memory its results take, before it holds them (the edge charges
/// it to the response budget that streams waiting to be read share).
pub trait PageMemory: Send + Sync {
    /// Makes the page's reservation cover `bytes` in all; `false` if that much is not free.
    fn hold(&self, bytes: usize) -> bool;
}

/// A page's reads so far, and what bounds the rest.
pub struct QueryReads {
    /// Every write the results reflect is at or before this position.
    pub(crate) settle_at: Lsn,
    /// Reads the run may still make on an async worker, and when it must leave it; `None`: a
    /// run on a blocking thread.
    inline: Option<(u64, Instant)>,
    /// When the run stops with `QUERY_LIMIT`, wherever it runs.
    limit: Instant,
    cancel: Cancel,
    memory: Option<Arc<dyn PageMemory>>,
}

impl fmt::Debug for QueryReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryReads")
            .field("settle_at", &self.settle_at)
            .field("inline", &self.inline)
            .field("limit", &self.limit)
            .field("cancel", &self.cancel)
            .finish_non_exhaustive()
    }
}

impl QueryReads {
    /// A run on a blocking thread: its page limits and [`QUERY_TIME_LIMIT`] bound it.
    pub fn unlimited() -> Self {
        QueryReads {
            settle_at: Lsn::ZERO,
            inline: None,
            limit: Instant::now() + QUERY_TIME_LIMIT,
            cancel: Cancel::default(),
            memory: None,
        }
    }

    /// A run on an async worker: at most [`INLINE_READS`] reads within `INLINE_TIME` (2 ms),
    /// else [`Error::ReadBudgetSpent`].
    pub fn inline() -> Self {
        QueryReads::inline_within(INLINE_READS, INLINE_TIME)
    }

    /// A run on an async worker of work that is bounded by other means (a feed page reads at
    /// most its size times a small factor, and evaluates nothing): `reads` reads within
    /// `time`, else [`Error::ReadBudgetSpent`].
    pub fn inline_within(reads: u64, time: Duration) -> Self {
        QueryReads {
            inline: Some((reads, Instant::now() + time)),
            ..QueryReads::unlimited()
        }
    }

    /// An inline run allowed at most `reads` reads (fewer if it had fewer).
    #[must_use]
    pub fn at_most(mut self, reads: u64) -> Self {
        if let Some((left, _)) = &mut self.inline {
            *left = (*left).min(reads);
        }
        self
    }

    /// The run stops once `cancel` is raised.
    #[must_use]
    pub fn cancelled_by(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }

    /// The run reserves its results' memory in `memory` before it holds them.
    #[must_use]
    pub fn reserving_in(mut self, memory: Arc<dyn PageMemory>) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Whether this is a run on an async worker.
    pub fn is_inline(&self) -> bool {
        self.inline.is_some()
    }

    /// Starts `query`'s execution, stopped (as [`Error::ReadBudgetSpent`], see
    /// [`Self::explain`]) when its time is up or it is cancelled, even inside one document's
    /// evaluation.
    pub(crate) fn execution<'q, 'p>(
        &self,
        query: &'q mayfly_query::ast::Query,
        params: &'p serde_json::Map<String, serde_json::Value>,
        context: mayfly_query::Context,
    ) -> Result<mayfly_query::Execution<'q, 'p>, Error> {
        let run = mayfly_query::Execution::new(query, params, context)?;
        let deadline = match self.inline {
            Some((_, until)) => until.min(self.limit),
            None => self.limit,
        };
        let cancel = self.cancel.clone();
        Ok(run
            .interrupt_at(deadline)
            .interrupt_when(move || cancel.reason().is_some()))
    }

    /// What a run that stopped with `error` reports: a stop (see [`Self::execution`]) becomes
    /// the reason for it.
    pub(crate) fn explain(&self, error: Error) -> Error {
        if !matches!(error, Error::ReadBudgetSpent) {
            return error;
        }
        if let Some(reason) = self.cancel.reason() {
            return reason;
        }
        match self.inline {
            Some(_) => Error::ReadBudgetSpent,
            None => Error::Query(mayfly_query::QueryError {
                kind: mayfly_query::ErrorKind::Limit,
                position: None,
                message: format!(
                    "the query ran longer than {} s; filter by partition key or narrow it",
                    QUERY_TIME_LIMIT.as_secs()
                ),
            }),
        }
    }

    /// Notes that the run read state reflecting writes up to `at`.
    pub(crate) fn reflect(&mut self, at: Lsn) {
        self.settle_at = self.settle_at.max(at);
    }

    /// Counts `n` reads, or refuses them if they pass the budget.
    pub(crate) fn spend(&mut self, n: usize) -> Result<(), Error> {
        self.check_time()?;
        if let Some((left, _)) = &mut self.inline {
            *left = left.checked_sub(n as u64).ok_or(Error::ReadBudgetSpent)?;
        }
        Ok(())
    }

    /// Refuses to go on past the run's time or once it is cancelled (before evaluating a
    /// document).
    pub(crate) fn check_time(&self) -> Result<(), Error> {
        let now = Instant::now();
        let late = match self.inline {
            Some((_, until)) => now > until,
            None => false,
        };
        if late || now > self.limit || self.cancel.reason().is_some() {
            return Err(Error::ReadBudgetSpent);
        }
        Ok(())
    }

    /// Refuses a read whose size is not known before it is made (counting every live document
    /// of a collection) unless the run has no limit.
    pub(crate) fn unbounded(&self) -> Result<(), Error> {
        match self.inline {
            None => Ok(()),
            Some(_) => Err(Error::ReadBudgetSpent),
        }
    }

    /// Reserves memory for `bytes` of results in all, before they are built; `false` if
    /// the reservation cannot grow that far (the page then ends, or fails if it is empty).
    pub(crate) fn hold(&self, bytes: usize) -> bool {
        self.memory.as_ref().is_none_or(|m| m.hold(bytes))
    }
}

/// What a query evaluated at `read_at` sees as the time (and its random seed).
pub(crate) fn context(read_at: Millis) -> mayfly_query::Context {
    #[allow(
        clippy::cast_possible_wrap,
        reason = "epoch milliseconds stay below 2^63"
    )]
    let now = read_at as i64;
    mayfly_query::Context::new(now, read_at ^ 0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_run_stops_past_its_budget_and_an_unlimited_one_never_does() {
        // A deadline far off: the test is about reads, whatever the machine's load.
        let mut inline = QueryReads {
            inline: Some((INLINE_READS, Instant::now() + Duration::from_secs(3600))),
            ..QueryReads::unlimited()
        };
        inline.spend(INLINE_READS as usize - 1).expect("within");
        inline.spend(1).expect("exactly at the budget");
        assert!(matches!(inline.spend(1), Err(Error::ReadBudgetSpent)));
        assert!(matches!(
            QueryReads::inline().unbounded(),
            Err(Error::ReadBudgetSpent)
        ));
        let mut unlimited = QueryReads::unlimited();
        unlimited.spend(usize::MAX).expect("no limit");
        unlimited.unbounded().expect("no limit");
        unlimited.check_time().expect("no limit");
        let late = QueryReads {
            inline: Some((INLINE_READS, Instant::now() - Duration::from_millis(1))),
            ..QueryReads::unlimited()
        };
        assert!(matches!(late.check_time(), Err(Error::ReadBudgetSpent)));
        unlimited.reflect(Lsn(7));
        unlimited.reflect(Lsn(3));
        assert_eq!(unlimited.settle_at, Lsn(7));
    }

    #[test]
    fn an_inline_run_on_storage_that_may_block_gets_the_smaller_budget() {
        let far = Instant::now() + Duration::from_secs(3600);
        let mut capped = QueryReads {
            inline: Some((INLINE_READS, far)),
            ..QueryReads::unlimited()
        }
        .at_most(INLINE_READS_MAY_BLOCK);
        capped
            .spend(INLINE_READS_MAY_BLOCK as usize)
            .expect("within the smaller budget");
        assert!(matches!(capped.spend(1), Err(Error::ReadBudgetSpent)));
        // Never raises a budget, and leaves a run off the async worker unlimited.
        let mut small =
            QueryReads::inline_within(2, Duration::from_secs(3600)).at_most(INLINE_READS_MAY_BLOCK);
        small.spend(2).expect("within");
        assert!(matches!(small.spend(1), Err(Error::ReadBudgetSpent)));
        let mut unlimited = QueryReads::unlimited().at_most(1);
        unlimited.spend(usize::MAX).expect("no limit");
    }

    #[test]
    fn a_cancelled_run_stops_and_says_why() {
        let server = Cancel::default();
        let call = server.for_call();
        let reads = QueryReads::unlimited().cancelled_by(call.clone());
        reads.check_time().expect("running");
        call.cancel();
        assert!(matches!(reads.check_time(), Err(Error::ReadBudgetSpent)));
        assert_eq!(reads.explain(Error::ReadBudgetSpent), Error::Cancelled);
        let other = QueryReads::unlimited().cancelled_by(server.for_call());
        other.check_time().expect("another call runs on");
        server.shut_down();
        assert_eq!(
            other.explain(other.check_time().expect_err("stopping")),
            Error::ShuttingDown
        );
        // A run on a blocking thread that ran out of time is past the query's limit.
        let late = QueryReads {
            limit: Instant::now() - Duration::from_millis(1),
            ..QueryReads::unlimited()
        };
        let err = late.explain(late.check_time().expect_err("late"));
        assert!(
            matches!(&err, Error::Query(e) if e.kind == mayfly_query::ErrorKind::Limit),
            "{err:?}"
        );
    }
}
