//! What a query run has read from storage: the log position its results reflect, and, for a
//! run tried on an async worker, how many more reads it may make there.

use std::time::{Duration, Instant};

use super::Error;
use crate::storage::Lsn;

/// Storage reads (index entries and documents) a query may make on an async worker, on
/// storage whose reads never wait (memory; on the disk, queries always run on blocking
/// threads, where many reads can wait at once). A query this small (an equality returning
/// ten documents, a `TOP 10` from an index) is answered there, sparing the two thread
/// hand-offs of a blocking task, which cost more than the query itself on a small machine. A
/// query that needs more stops at the first read past it and is run again, from its start, on
/// a blocking thread: the work lost is this many reads and at most one batch of index entries.
pub const INLINE_READS: u64 = 64;

/// How long a query may run on an async worker before it is moved off it (checked before each
/// read and each document evaluated: one document's evaluation, bounded by the language's
/// per-document budget, may run past it).
pub(crate) const INLINE_TIME: Duration = Duration::from_millis(2);

/// A query run's reads so far.
#[derive(Debug)]
pub struct QueryReads {
    /// Every write the results reflect is at or before this position.
    pub(crate) settle_at: Lsn,
    /// Reads the run may still make, and when it must stop; `None`: no limit.
    inline: Option<(u64, Instant)>,
}

impl QueryReads {
    /// A run on a blocking thread: its own page and time limits bound it.
    pub fn unlimited() -> Self {
        QueryReads {
            settle_at: Lsn::ZERO,
            inline: None,
        }
    }

    /// A run on an async worker: at most [`INLINE_READS`] reads within [`INLINE_TIME`],
    /// else [`Error::ReadBudgetSpent`].
    pub fn inline() -> Self {
        QueryReads {
            settle_at: Lsn::ZERO,
            inline: Some((INLINE_READS, Instant::now() + INLINE_TIME)),
        }
    }

    /// Starts `query`'s execution; an inline run's stops (as [`Error::ReadBudgetSpent`]) when
    /// its time is up, even inside one document's evaluation.
    pub(crate) fn execution<'q, 'p>(
        &self,
        query: &'q mayfly_query::ast::Query,
        params: &'p serde_json::Map<String, serde_json::Value>,
        context: mayfly_query::Context,
    ) -> Result<mayfly_query::Execution<'q, 'p>, Error> {
        let run = mayfly_query::Execution::new(query, params, context)?;
        Ok(match self.inline {
            Some((_, until)) => run.interrupt_at(until),
            None => run,
        })
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

    /// Refuses to go on past the time an inline run has (before evaluating a document).
    pub(crate) fn check_time(&self) -> Result<(), Error> {
        match self.inline {
            Some((_, until)) if Instant::now() > until => Err(Error::ReadBudgetSpent),
            _ => Ok(()),
        }
    }

    /// Refuses a read whose size is not known before it is made (counting every live document
    /// of a collection) unless the run has no limit.
    pub(crate) fn unbounded(&self) -> Result<(), Error> {
        match self.inline {
            None => Ok(()),
            Some(_) => Err(Error::ReadBudgetSpent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_run_stops_past_its_budget_and_an_unlimited_one_never_does() {
        // A deadline far off: the test is about reads, whatever the machine's load.
        let mut inline = QueryReads {
            settle_at: Lsn::ZERO,
            inline: Some((INLINE_READS, Instant::now() + Duration::from_secs(3600))),
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
            settle_at: Lsn::ZERO,
            inline: Some((INLINE_READS, Instant::now() - Duration::from_millis(1))),
        };
        assert!(matches!(late.check_time(), Err(Error::ReadBudgetSpent)));
        unlimited.reflect(Lsn(7));
        unlimited.reflect(Lsn(3));
        assert_eq!(unlimited.settle_at, Lsn(7));
    }
}
