//! What a document operation hands back: its result, and the log position that must be
//! durable before any client may be told of it.

use super::{error::Error, request_charge::RequestCharge};
use crate::storage::{Lsn, ShardSet};

/// A document operation's result, not yet shown to anyone. It may reflect writes that are
/// applied but not yet durable: its own, or the version it read. [`super::Engine::settle`]
/// waits for exactly those, so no client is told of a change a crash could take back, and no
/// response waits for unrelated writes.
#[derive(Debug)]
#[must_use = "settle it before showing the result to a client"]
pub struct Outcome<T> {
    /// What the operation returned.
    pub result: Result<T, Error>,
    /// Every write the result reflects is at or before this position.
    pub settle_at: Lsn,
    /// Every write the result reflects is in these shards (or the catalog).
    pub shards: ShardSet,
    /// What the operation cost (see [`RequestCharge`]); zero until the operation says.
    pub charge: RequestCharge,
}

impl<T> Outcome<T> {
    /// A result that reflects writes up to `settle_at`.
    /// It may reflect any shard, until [`Outcome::within`] says which.
    pub(crate) fn new(result: Result<T, Error>, settle_at: Lsn) -> Self {
        Outcome {
            result,
            settle_at,
            shards: ShardSet::ALL,
            charge: RequestCharge::ZERO,
        }
    }

    /// The same outcome, known to reflect writes of `shards` only.
    pub(crate) fn within(self, shards: ShardSet) -> Self {
        Outcome { shards, ..self }
    }

    /// A value that reflects no document state: nothing to wait for.
    pub fn done(value: T) -> Self {
        Outcome {
            result: Ok(value),
            settle_at: Lsn::ZERO,
            shards: ShardSet::NONE,
            charge: RequestCharge::ZERO,
        }
    }

    /// A failure that reflects no document state (bad input, a missing collection, storage
    /// refusing the write): nothing to wait for.
    pub fn failed(error: impl Into<Error>) -> Self {
        Outcome {
            result: Err(error.into()),
            settle_at: Lsn::ZERO,
            shards: ShardSet::NONE,
            charge: RequestCharge::ZERO,
        }
    }

    /// The same outcome, costing `charge`.
    pub fn charged(self, charge: RequestCharge) -> Self {
        Outcome { charge, ..self }
    }

    /// The same outcome with its value transformed.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        Outcome {
            result: self.result.map(f),
            settle_at: self.settle_at,
            shards: self.shards,
            charge: self.charge,
        }
    }
}
