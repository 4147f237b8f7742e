//! Time as the engine sees it: Unix epoch milliseconds from an injectable clock.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

pub use crate::model::Millis;

/// Source of the current time. Every request reads it once and judges visibility with that
/// single reading.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now, in Unix epoch milliseconds.
    fn now(&self) -> Millis;
}

/// The clock a cluster node times its partition leases by (monotonic milliseconds, from any
/// origin): a shard whose lease ends serves nothing more (see [`super::Engine::serve_until`]).
pub trait LeaseClock: Send + Sync + fmt::Debug {
    /// Now, in the clock's milliseconds.
    fn now_ms(&self) -> u64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        // A clock before 1970 would be a broken machine; treat it as the epoch.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Millis)
    }
}

/// A clock that moves only when told to: TTL rules are tested with it.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock stopped at `now`.
    pub fn new(now: Millis) -> Self {
        ManualClock(AtomicU64::new(now))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: Millis) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock (it may go backwards, as wall clocks do).
    pub fn set(&self, now: Millis) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}
