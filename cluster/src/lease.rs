//! Lease timing (`docs/cluster.md`, "Leases and fencing"): an owner serves a partition only
//! while its last confirmed renewal is fresh by its own monotonic clock, and a contender takes
//! over only once the lease has gone unrenewed for a whole lease length by its own clock. Both
//! count from moments that bracket the renewal (the owner from before it sent it, the contender
//! from after it saw it applied), so with clock rates within `drift` of real time the owner has
//! stopped before the contender starts, whatever the delays, provided the margin is at least
//! `drift × length × (1 − drift) / (1 + drift)` ([`LeaseTiming::is_safe`]).

/// A lease's length and the allowances the timing argument needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseTiming {
    /// How long a renewal keeps a lease, by the contender's clock (ms).
    pub length_ms: u64,
    /// The largest relative error of any node's monotonic clock rate (0.01: 1 %).
    pub drift: f64,
    /// How much earlier than `length × (1 − drift)` the owner stops (ms).
    pub margin_ms: u64,
}

impl LeaseTiming {
    /// The design's figures: 2 s leases, 1 % drift, 50 ms margin.
    pub const DEFAULT: LeaseTiming = LeaseTiming {
        length_ms: 2_000,
        drift: 0.01,
        margin_ms: 50,
    };

    /// Whether the margin covers the worst drift: the owner's clock slow, the contender's fast.
    pub fn is_safe(&self) -> bool {
        let length = self.length_ms as f64;
        self.margin_ms as f64 >= self.drift * length * (1.0 - self.drift) / (1.0 + self.drift)
    }

    /// Until when, by the owner's monotonic clock, a lease renewed by a request sent at
    /// `sent_ms` may serve (exclusive).
    pub fn serves_until(&self, sent_ms: u64) -> u64 {
        let usable = (self.length_ms as f64 * (1.0 - self.drift)).floor() as u64;
        sent_ms + usable.saturating_sub(self.margin_ms)
    }

    /// When, by the contender's monotonic clock, a lease last seen renewed at `observed_ms`
    /// has lapsed and may be taken. One more millisecond: the reading was truncated, so the
    /// renewal may have been seen up to a millisecond later than it says.
    pub fn lapsed_at(&self, observed_ms: u64) -> u64 {
        observed_ms + self.length_ms + 1
    }
}

/// The owner's side of one partition's lease.
#[derive(Debug, Clone)]
pub struct OwnerLease {
    timing: LeaseTiming,
    /// The earliest send of the renewals whose outcome is not known yet: one that timed out
    /// may still have been applied, so validity counts from the earliest.
    pending_since: Option<u64>,
    /// Serving stops at this monotonic time (exclusive); `None`: not held.
    serves_until: Option<u64>,
}

impl OwnerLease {
    /// A lease not held yet.
    pub fn new(timing: LeaseTiming) -> Self {
        OwnerLease {
            timing,
            pending_since: None,
            serves_until: None,
        }
    }

    /// A renewal (or the acquiring write) is about to be sent; `now_ms` is read before it is.
    pub fn sending(&mut self, now_ms: u64) {
        self.pending_since = Some(self.pending_since.map_or(now_ms, |p| p.min(now_ms)));
    }

    /// The store confirmed the renewal (or found, on reading the key back after a refusal,
    /// that an earlier attempt of this owner was applied).
    pub fn confirmed(&mut self) {
        if let Some(sent) = self.pending_since.take() {
            let until = self.timing.serves_until(sent);
            self.serves_until = Some(self.serves_until.map_or(until, |u| u.max(until)));
        }
    }

    /// Another owner holds the key now: stop at once.
    pub fn lost(&mut self) {
        self.pending_since = None;
        self.serves_until = None;
    }

    /// Until when (monotonic, exclusive) the partition may be served; `None`: not held.
    pub fn serves_until(&self) -> Option<u64> {
        self.serves_until
    }

    /// Whether the partition may be served at monotonic time `now_ms`.
    pub fn serves(&self, now_ms: u64) -> bool {
        self.serves_until.is_some_and(|until| now_ms < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_is_safe_and_a_thin_margin_is_not() {
        assert!(LeaseTiming::DEFAULT.is_safe());
        let thin = LeaseTiming {
            margin_ms: 19,
            ..LeaseTiming::DEFAULT
        };
        assert!(!thin.is_safe(), "1 % of 2 s needs about 19.6 ms");
        assert_eq!(LeaseTiming::DEFAULT.serves_until(1_000), 1_000 + 1_980 - 50);
    }

    #[test]
    fn an_owner_serves_from_its_earliest_uncertain_send() {
        let mut lease = OwnerLease::new(LeaseTiming::DEFAULT);
        assert!(!lease.serves(0));
        // The first try timed out (it may have been applied); the second was confirmed.
        lease.sending(100);
        lease.sending(600);
        lease.confirmed();
        assert!(lease.serves(100 + 1_929));
        assert!(!lease.serves(100 + 1_930), "counted from 100, not 600");
        // A later renewal extends it; losing the key ends it at once.
        lease.sending(1_000);
        lease.confirmed();
        assert!(lease.serves(2_500));
        lease.lost();
        assert!(!lease.serves(2_500));
    }

    /// Real time `t` (ms) on a clock running at `rate` from `offset`.
    fn clock(offset: f64, rate: f64, t: f64) -> f64 {
        offset + rate * t
    }

    /// The last real instant the owner serves after a renewal it sent at real time `sent`, and
    /// the first the contender, which saw the renewal applied at `seen` ≥ `sent`, may take over.
    fn handover(
        timing: &LeaseTiming,
        (owner_offset, owner_rate): (f64, f64),
        (contender_offset, contender_rate): (f64, f64),
        sent: f64,
        seen: f64,
    ) -> (f64, f64) {
        // Monotonic readings are whole milliseconds, read after the instant (floor).
        let sent_mono = clock(owner_offset, owner_rate, sent).floor() as u64;
        let until = timing.serves_until(sent_mono) as f64;
        // The owner's clock reads below `until` strictly before this real instant.
        let owner_stops = (until - owner_offset) / owner_rate;
        let seen_mono = clock(contender_offset, contender_rate, seen).floor() as u64;
        let lapsed = timing.lapsed_at(seen_mono) as f64;
        let contender_starts = (lapsed - contender_offset) / contender_rate;
        (owner_stops, contender_starts)
    }

    /// A clock's rate error as a fraction of the drift: often the worst, else anything.
    fn extreme_or_any() -> impl Strategy<Value = f64> {
        prop_oneof![Just(-1.0), Just(1.0), -1.0f64..1.0]
    }

    proptest! {
        /// With a safe margin, the owner has stopped serving before the contender may take
        /// over, for any clock offsets, rates within the drift, and delays.
        #[test]
        fn a_safe_lease_never_overlaps(
            length_ms in 500u64..10_000,
            drift_pct in 0u32..5,
            owner in (0.0f64..1e9, extreme_or_any()),
            contender in (0.0f64..1e9, extreme_or_any()),
            sent in 0.0f64..1e6,
            delay in prop_oneof![Just(0.0), 0.0f64..5_000.0],
        ) {
            let drift = f64::from(drift_pct) / 100.0;
            let bound = drift * length_ms as f64 * (1.0 - drift) / (1.0 + drift);
            let timing = LeaseTiming { length_ms, drift, margin_ms: bound.ceil() as u64 };
            prop_assert!(timing.is_safe());
            let rate = |r: f64| 1.0 + r * drift;
            let (stops, starts) = handover(
                &timing,
                (owner.0, rate(owner.1)),
                (contender.0, rate(contender.1)),
                sent,
                sent + delay,
            );
            prop_assert!(stops <= starts, "owner serves until {stops}, contender starts at {starts}");
        }
    }

    /// And the bound is needed: with no margin, a slow owner clock and a fast contender clock
    /// overlap.
    #[test]
    fn without_the_margin_the_worst_drift_overlaps() {
        let timing = LeaseTiming {
            length_ms: 2_000,
            drift: 0.01,
            margin_ms: 0,
        };
        let (stops, starts) = handover(&timing, (0.0, 0.99), (0.0, 1.01), 1_000.0, 1_000.0);
        assert!(stops > starts, "{stops} vs {starts}");
    }
}
