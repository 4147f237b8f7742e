//! Provisioned throughput, enforced (README, "Request units"): a bucket of request units per
//! collection with a throughput of its own, or per database whose collections share one. It
//! refills at the provisioned rate and holds at most [`BURST`] of it (a small burst
//! allowance); a request is admitted while the bucket holds credit, and charged what it cost
//! once it is done, which may leave the bucket in debt: the debt throttles what follows, as
//! Cosmos DB's does.
//!
//! Written here rather than taken from `governor`: its GCRA decides on a cost known before
//! the request runs, and a query learns what it cost while running. Charging after the fact
//! needs a level that may go below zero, which is these few lines.
//!
//! Admission is decided at the edge, before a request takes a shard lock, an fsync slot or a
//! blocking thread, so a throttled flood holds none of them. Expiry never draws on a bucket.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, RwLock};

use crate::engine::RequestCharge;
use crate::model::Throughput;

/// How much of a second's budget a bucket holds at most: what an idle collection may spend at
/// once before the rate applies.
const BURST: Duration = Duration::from_millis(200);

/// One budget: its level in hundredths of a request unit, brought up to date at `at_ms`.
#[derive(Debug)]
pub(crate) struct Bucket {
    throughput: Throughput,
    level: i64,
    at_ms: u64,
    /// Hundredths spent in the second that began at `window_ms`, and in the second before.
    window_ms: u64,
    spent_now: u64,
    spent_before: u64,
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub(crate) fn new(throughput: Throughput, now_ms: u64) -> Self {
        Bucket {
            throughput,
            level: capacity(throughput),
            at_ms: now_ms,
            window_ms: now_ms,
            spent_now: 0,
            spent_before: 0,
        }
    }

    /// Admits a request at `now_ms` if the bucket holds credit; otherwise says how long until
    /// it does.
    pub(crate) fn admit(&mut self, now_ms: u64) -> Result<(), Duration> {
        self.refill(now_ms);
        if self.level > 0 {
            return Ok(());
        }
        // Hundredths refilled per millisecond: rate × 100 / 1000.
        let per_ms = (i64::from(self.throughput.limit()) / 10).max(1);
        let wait_ms = (-self.level) / per_ms + 1;
        Err(Duration::from_millis(wait_ms as u64))
    }

    /// Charges what a request (admitted earlier) cost, at `now_ms`.
    pub(crate) fn charge(&mut self, now_ms: u64, charge: RequestCharge) {
        self.refill(now_ms);
        let hundredths = charge.hundredths();
        self.level = self
            .level
            .saturating_sub(i64::try_from(hundredths).unwrap_or(i64::MAX));
        self.spent_now = self.spent_now.saturating_add(hundredths);
    }

    /// Whether it is full at `now_ms`: it then holds nothing a new bucket would not.
    fn full(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        self.level >= capacity(self.throughput)
    }

    /// A new throughput from `now_ms` on; the credit held (or the debt) stays, within the new
    /// burst.
    pub(crate) fn set_throughput(&mut self, throughput: Throughput, now_ms: u64) {
        self.refill(now_ms);
        self.throughput = throughput;
        self.level = self.level.min(capacity(throughput));
    }

    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by ReadThroughput and the metrics, the next step of issue 29"
        )
    )]
    /// What autoscale provisions now (RU/s): what was spent in the last whole second, between
    /// a tenth of the maximum and the maximum; a manual throughput as it is.
    pub(crate) fn provisioned(&mut self, now_ms: u64) -> u32 {
        self.refill(now_ms);
        let used = u32::try_from(self.spent_before.div_ceil(100)).unwrap_or(u32::MAX);
        used.clamp(self.throughput.floor(), self.throughput.limit())
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        if elapsed > 0 {
            let per_ms = i64::from(self.throughput.limit()) / 10;
            let refill = per_ms.saturating_mul(i64::try_from(elapsed).unwrap_or(i64::MAX));
            self.level = self
                .level
                .saturating_add(refill)
                .min(capacity(self.throughput));
            self.at_ms = now_ms;
        }
        let seconds = now_ms.saturating_sub(self.window_ms) / 1_000;
        if seconds > 0 {
            self.spent_before = if seconds == 1 { self.spent_now } else { 0 };
            self.spent_now = 0;
            self.window_ms += seconds * 1_000;
        }
    }
}

/// What a bucket holds at most, in hundredths.
fn capacity(throughput: Throughput) -> i64 {
    i64::from(throughput.limit()) * 100 * BURST.as_millis() as i64 / 1_000
}

/// Every bucket of the server, by whose budget it is (`K`: a collection's uid, or a
/// database's whose collections share one).
#[derive(Debug)]
pub(crate) struct Limiter<K> {
    /// The buckets, and how many there may be before full ones are forgotten.
    buckets: RwLock<(Buckets<K>, usize)>,
    started: Instant,
}

type Buckets<K> = HashMap<K, Arc<Mutex<Bucket>>>;

/// How many buckets a limiter holds before it forgets the full ones (a full bucket is made
/// again, full, when next used: nothing is lost), and again each time they have doubled since.
const PRUNE_AT: usize = 1_024;

/// An admitted request's bucket, to charge once it is done.
#[derive(Debug)]
pub(crate) struct Admitted {
    bucket: Arc<Mutex<Bucket>>,
    /// The limiter's clock.
    started: Instant,
}

impl Admitted {
    /// Charges what the request cost, at `now_ms`.
    pub(crate) fn charge(&self, now_ms: u64, charge: RequestCharge) {
        self.bucket.lock().charge(now_ms, charge);
    }

    /// Charges what the request cost, now.
    pub(crate) fn charge_now(&self, charge: RequestCharge) {
        self.charge(self.started.elapsed().as_millis() as u64, charge);
    }
}

impl<K> Default for Limiter<K> {
    fn default() -> Self {
        Limiter {
            buckets: RwLock::new((HashMap::new(), PRUNE_AT)),
            started: Instant::now(),
        }
    }
}

impl<K: Copy + Eq + std::hash::Hash> Limiter<K> {
    /// Milliseconds since the limiter started: the buckets' clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Admits a request drawing on `scope`'s budget, provisioned `throughput`, at `now_ms`; or
    /// how long until it would be. A bucket is made full on first use, and takes a changed
    /// throughput from the request that first sees it.
    pub(crate) fn admit(
        &self,
        scope: K,
        throughput: Throughput,
        now_ms: u64,
    ) -> Result<Admitted, Duration> {
        let found = self.buckets.read().0.get(&scope).cloned();
        let bucket = match found {
            Some(bucket) => bucket,
            None => {
                let mut guard = self.buckets.write();
                let (buckets, prune_at) = &mut *guard;
                // Collections come and go: without this, every one that ever had a
                // throughput would keep its bucket.
                if buckets.len() >= *prune_at {
                    buckets.retain(|_, b| !b.lock().full(now_ms));
                    *prune_at = (buckets.len() * 2).max(PRUNE_AT);
                }
                buckets
                    .entry(scope)
                    .or_insert_with(|| Arc::new(Mutex::new(Bucket::new(throughput, now_ms))))
                    .clone()
            }
        };
        {
            let mut b = bucket.lock();
            if b.throughput != throughput {
                b.set_throughput(throughput, now_ms);
            }
            b.admit(now_ms)?;
        }
        Ok(Admitted {
            bucket,
            started: self.started,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CollectionUid, DatabaseUid};

    const MANUAL_1000: Throughput = Throughput::Manual {
        ru_per_second: 1_000,
    };

    fn ru(units: u64) -> RequestCharge {
        RequestCharge::from_hundredths(units * 100)
    }

    /// Offers `per_ms` requests of `cost` RU every millisecond for `ms` from `start`, each
    /// charged at once when admitted; returns the RU admitted and the delays of the refused.
    fn offer(
        admit: &mut dyn FnMut(u64) -> Result<Admitted, Duration>,
        (start, ms, per_ms, cost): (u64, u64, u64, u64),
    ) -> (u64, Vec<Duration>) {
        let (mut spent, mut delays) = (0, Vec::new());
        for t in start..start + ms {
            for _ in 0..per_ms {
                match admit(t) {
                    Ok(admitted) => {
                        admitted.charge(t, ru(cost));
                        spent += cost;
                    }
                    Err(delay) => delays.push(delay),
                }
            }
        }
        (spent, delays)
    }

    #[test]
    fn a_bucket_holds_its_rate_under_five_times_the_load() {
        let limiter = Limiter::default();
        let scope = CollectionUid(1);
        // 5,000 RU/s offered (5 requests of 1 RU a millisecond) for 10 s.
        let (spent, delays) = offer(
            &mut |t| limiter.admit(scope, MANUAL_1000, t),
            (0, 10_000, 5, 1),
        );
        // The rate for 10 s, plus the burst held at the start: 1,000 ± 5 % RU/s.
        assert!((10_000..=10_250).contains(&spent), "{spent}");
        assert!(!delays.is_empty());
        assert!(
            delays
                .iter()
                .all(|d| *d > Duration::ZERO && *d <= Duration::from_millis(2))
        );
    }

    #[test]
    fn an_idle_bucket_allows_a_burst_of_a_fifth_of_a_second() {
        let mut bucket = Bucket::new(MANUAL_1000, 0);
        for _ in 0..20 {
            bucket.admit(0).expect("within the burst");
            bucket.charge(0, ru(10));
        }
        assert_eq!(bucket.admit(0), Err(Duration::from_millis(1)));
        // Idle for a minute: the burst again, not a minute's worth.
        let mut admitted = 0;
        while bucket.admit(60_000).is_ok() {
            bucket.charge(60_000, ru(10));
            admitted += 1;
        }
        assert_eq!(admitted, 20);
    }

    #[test]
    fn a_charge_past_the_credit_is_a_debt_that_throttles_what_follows() {
        let mut bucket = Bucket::new(MANUAL_1000, 0);
        bucket.admit(0).expect("credit");
        // A query that turned out to cost 700 RU: 500 RU of debt, half a second at 1,000 RU/s.
        bucket.charge(0, ru(700));
        assert_eq!(bucket.admit(0), Err(Duration::from_millis(501)));
        assert!(bucket.admit(500).is_err());
        assert!(bucket.admit(501).is_ok());
    }

    #[test]
    fn autoscale_provisions_what_is_used_between_a_tenth_and_its_maximum() {
        let auto = Throughput::Autoscale {
            max_ru_per_second: 10_000,
        };
        let mut bucket = Bucket::new(auto, 0);
        assert_eq!(bucket.provisioned(1_500), 1_000, "idle: a tenth");
        // 3,000 RU in the second from 2,000 ms: it provisioned 3,000 RU/s.
        for t in 2_000..3_000 {
            bucket.admit(t).expect("under the maximum");
            bucket.charge(t, ru(3));
        }
        assert_eq!(bucket.provisioned(3_100), 3_000);
        // Offered twice the maximum: it provisions the maximum, and admits no more.
        for t in 4_000..5_000 {
            if bucket.admit(t).is_ok() {
                bucket.charge(t, ru(20));
            }
        }
        assert_eq!(bucket.provisioned(5_000), 10_000);
        // Idle again: back to a tenth after a second.
        assert_eq!(bucket.provisioned(7_000), 1_000);
    }

    #[test]
    fn a_databases_collections_share_its_throughput() {
        let limiter = Limiter::default();
        let shared = DatabaseUid(7);
        // Two collections, each offering 2,500 RU/s to the database's 1,000 RU/s, their
        // requests interleaved.
        let (mut first, mut second) = (0, 0);
        for t in 0..10_000 {
            for _ in 0..5 {
                for spent in [&mut first, &mut second] {
                    if let Ok(admitted) = limiter.admit(shared, MANUAL_1000, t) {
                        admitted.charge(t, RequestCharge::from_hundredths(50));
                        *spent += 50;
                    }
                }
            }
        }
        let total = (first + second) / 100;
        assert!(
            (10_000..=10_250).contains(&total),
            "one budget between them: {total}"
        );
        assert!(
            first / 100 > 4_000 && second / 100 > 4_000,
            "{first} {second}"
        );
        // Another budget is not drawn on by theirs.
        assert!(limiter.admit(DatabaseUid(8), MANUAL_1000, 9_999).is_ok());
    }

    #[test]
    fn full_buckets_are_forgotten_and_busy_ones_kept() {
        let limiter = Limiter::default();
        // A busy budget: in debt.
        let busy = CollectionUid(0);
        limiter
            .admit(busy, MANUAL_1000, 0)
            .expect("full")
            .charge(0, ru(50_000));
        // Thousands of budgets used once and idle since (as collections made and deleted).
        for uid in 1..5_000 {
            limiter
                .admit(CollectionUid(uid), MANUAL_1000, uid)
                .expect("full");
        }
        let (len, _) = {
            let guard = limiter.buckets.read();
            (guard.0.len(), guard.1)
        };
        assert!(len <= PRUNE_AT + 1, "{len} buckets kept");
        assert!(
            limiter.buckets.read().0.contains_key(&busy),
            "its debt is kept"
        );
        assert!(
            limiter.admit(busy, MANUAL_1000, 5_000).is_err(),
            "and still owed"
        );
    }

    #[test]
    fn a_lowered_throughput_applies_at_once() {
        let limiter = Limiter::default();
        let scope = CollectionUid(1);
        let low = Throughput::Manual { ru_per_second: 400 };
        limiter.admit(scope, MANUAL_1000, 0).expect("full");
        let (spent, _) = offer(&mut |t| limiter.admit(scope, low, t), (1, 10_000, 5, 1));
        assert!((4_000..=4_200).contains(&spent), "{spent}");
    }
}
