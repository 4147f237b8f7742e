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
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use parking_lot::{Mutex, RwLock};

use crate::cluster_metrics::ClusterMetrics;
use crate::engine::{Budget, RequestCharge};
use crate::model::{CollectionUid, Throughput};

/// How much of a second's budget a bucket holds at most: what an idle collection may spend at
/// once before the rate applies.
const BURST: Duration = Duration::from_millis(200);

/// A bucket's level is counted in hundred-thousandths of a request unit: a rate of R RU/s
/// refills exactly R × 100 of them a millisecond, so no fraction is lost between refills (a
/// cluster node's share of a budget may be any whole number of RU/s, 7 as well as 400).
const UNITS_PER_HUNDREDTH: i64 = 1_000;

/// One budget: its level in units ([`UNITS_PER_HUNDREDTH`]), brought up to date at `at_ms`.
#[derive(Debug)]
pub(crate) struct Bucket {
    throughput: Throughput,
    level: i64,
    at_ms: u64,
    /// Hundredths spent in the second that began at `window_ms`, and in the second before.
    window_ms: u64,
    spent_now: u64,
    spent_before: u64,
    /// When the last request refused was told to come back: the next one refused is told to
    /// come back a typical request's refill later, so that requests refused together come
    /// back one after another rather than all at once, to find credit for one of them.
    next_slot_ms: u64,
    /// What a request here typically costs (a moving average, in units).
    typical: i64,
}

/// How far past the moment the bucket has credit again the refused are spread at most:
/// requests refused and never sent again (a caller that does not wait) must not push the
/// delay told to the others without bound.
const MAX_SPREAD_MS: u64 = 1_000;

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
            next_slot_ms: now_ms,
            typical: 100 * UNITS_PER_HUNDREDTH,
        }
    }

    /// Admits a request at `now_ms` if the bucket holds credit; otherwise says how long until
    /// it does.
    pub(crate) fn admit(&mut self, now_ms: u64) -> Result<(), Duration> {
        self.refill(now_ms);
        if self.level > 0 {
            return Ok(());
        }
        let per_ms = per_ms(self.throughput);
        let credit_at = now_ms.saturating_add((self.level.saturating_neg() / per_ms + 1) as u64);
        // Those refused before this one are told to come back first.
        let slot = self
            .next_slot_ms
            .clamp(credit_at, credit_at.saturating_add(MAX_SPREAD_MS));
        self.next_slot_ms = slot.saturating_add((self.typical / per_ms).max(1) as u64);
        Err(Duration::from_millis(slot - now_ms))
    }

    /// Charges what a request (admitted earlier) cost, at `now_ms`.
    pub(crate) fn charge(&mut self, now_ms: u64, charge: RequestCharge) {
        self.refill(now_ms);
        let hundredths = charge.hundredths();
        let cost = i64::try_from(hundredths)
            .unwrap_or(i64::MAX)
            .saturating_mul(UNITS_PER_HUNDREDTH);
        self.level = self.level.saturating_sub(cost);
        self.spent_now = self.spent_now.saturating_add(hundredths);
        self.typical = (self.typical.saturating_mul(7).saturating_add(cost) / 8).max(1);
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
        // The places handed out were spaced at the old rate.
        self.next_slot_ms = now_ms;
    }

    /// What `throughput` provisions now (RU/s) by this bucket's use: for autoscale, what was
    /// spent in the last whole second, between a tenth of the maximum and the maximum; a
    /// manual throughput as it is. (`throughput` is the budget's whole throughput: in a
    /// cluster, the bucket holds this node's share of it.)
    pub(crate) fn provisioned(&mut self, now_ms: u64, throughput: Throughput) -> u32 {
        self.refill(now_ms);
        let used = u32::try_from(self.spent_before.div_ceil(100)).unwrap_or(u32::MAX);
        used.clamp(throughput.floor(), throughput.limit())
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        if elapsed > 0 {
            let refill =
                per_ms(self.throughput).saturating_mul(i64::try_from(elapsed).unwrap_or(i64::MAX));
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

/// What a bucket holds at most, in units.
fn capacity(throughput: Throughput) -> i64 {
    per_ms(throughput) * BURST.as_millis() as i64
}

/// Units refilled per millisecond: rate × 100 hundredths × 1,000 units / 1,000 ms.
fn per_ms(throughput: Throughput) -> i64 {
    (i64::from(throughput.limit()) * 100).max(1)
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

/// An admitted request's bucket (if its collection has a budget) and its collection's usage,
/// to charge once it is done.
#[derive(Debug)]
pub(crate) struct Admitted {
    bucket: Option<Arc<Mutex<Bucket>>>,
    usage: Option<Arc<Usage>>,
    /// The limiter's clock.
    started: Instant,
}

impl Admitted {
    /// Charges what the request cost, at `now_ms`.
    pub(crate) fn charge(&self, now_ms: u64, charge: RequestCharge) {
        if let Some(bucket) = &self.bucket {
            bucket.lock().charge(now_ms, charge);
        }
        if let Some(usage) = &self.usage {
            usage
                .consumed
                .fetch_add(charge.hundredths(), Ordering::Relaxed);
        }
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
            bucket: Some(bucket),
            usage: None,
            started: self.started,
        })
    }

    /// What `scope`'s budget, provisioned `throughput`, provisions now (see
    /// [`Bucket::provisioned`]); a budget not used lately, its least.
    pub(crate) fn provisioned(&self, scope: K, throughput: Throughput) -> u32 {
        let bucket = self.buckets.read().0.get(&scope).cloned();
        match bucket {
            Some(bucket) => bucket.lock().provisioned(self.now_ms(), throughput),
            None => throughput.floor(),
        }
    }
}

/// What one collection spent (hundredths of a request unit) and how many of its requests
/// were refused, since this server started: its metrics.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    consumed: AtomicU64,
    throttled: AtomicU64,
}

impl Usage {
    /// Request units consumed.
    pub(crate) fn consumed(&self) -> f64 {
        self.consumed.load(Ordering::Relaxed) as f64 / 100.0
    }

    /// Requests refused REQUEST_RATE_TOO_LARGE.
    pub(crate) fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }
}

/// The server's provisioned throughput: a budget per collection or database that has one, and
/// every collection's usage.
#[derive(Debug)]
pub(crate) struct Provisioned {
    limiter: Limiter<Budget>,
    /// By collection, and how many there may be before those of deleted ones are forgotten.
    usage: RwLock<(HashMap<CollectionUid, Arc<Usage>>, usize)>,
    /// In a cluster, the partitions and which this node serves: it holds each budget to its
    /// share, the partitions it serves of all of them (as Cosmos DB divides a container's
    /// throughput among its physical partitions), so that the nodes together spend the
    /// budget, not each of them all of it.
    partitions: Option<Arc<ClusterMetrics>>,
}

impl Default for Provisioned {
    fn default() -> Self {
        Provisioned {
            limiter: Limiter::default(),
            usage: RwLock::new((HashMap::new(), PRUNE_AT)),
            partitions: None,
        }
    }
}

/// `throughput`'s share for a node serving `served` of `total` partitions (at least one:
/// a node asked to admit a request serves its partition, or did a moment ago), rounded up.
fn share(throughput: Throughput, served: usize, total: usize) -> Throughput {
    if total == 0 || served >= total {
        return throughput;
    }
    let part = |ru: u32| {
        let scaled = u64::from(ru) * served.max(1) as u64;
        u32::try_from(scaled.div_ceil(total as u64)).unwrap_or(ru)
    };
    match throughput {
        Throughput::Manual { ru_per_second } => Throughput::Manual {
            ru_per_second: part(ru_per_second),
        },
        Throughput::Autoscale { max_ru_per_second } => Throughput::Autoscale {
            max_ru_per_second: part(max_ru_per_second),
        },
    }
}

impl Provisioned {
    /// A cluster node's: each budget held to the share of the partitions `partitions` says
    /// it serves.
    pub(crate) fn in_cluster(partitions: Arc<ClusterMetrics>) -> Self {
        Provisioned {
            partitions: Some(partitions),
            ..Provisioned::default()
        }
    }

    /// What this node holds a budget of `throughput` to.
    fn held_to(&self, throughput: Throughput) -> Throughput {
        match &self.partitions {
            None => throughput,
            Some(cluster) => {
                let served = cluster
                    .partitions
                    .iter()
                    .filter(|p| p.served.load(Ordering::Relaxed))
                    .count();
                share(throughput, served, cluster.partitions.len())
            }
        }
    }

    /// Admits a request on collection `collection`, drawing on `budget` (`None`: unlimited,
    /// always admitted); or how long until it would be. `live` names the collections that
    /// still exist, asked for only now and then, to forget the usage of deleted ones.
    pub(crate) fn admit(
        &self,
        collection: CollectionUid,
        budget: Option<(Budget, Throughput)>,
        live: impl FnOnce() -> HashSet<CollectionUid>,
    ) -> Result<Admitted, Duration> {
        let usage = self.usage_of(collection, live);
        let Some((scope, throughput)) = budget else {
            return Ok(Admitted {
                bucket: None,
                usage: Some(usage),
                started: self.limiter.started,
            });
        };
        let held_to = self.held_to(throughput);
        match self.limiter.admit(scope, held_to, self.limiter.now_ms()) {
            Ok(admitted) => Ok(Admitted {
                usage: Some(usage),
                ..admitted
            }),
            Err(wait) => {
                usage.throttled.fetch_add(1, Ordering::Relaxed);
                Err(wait)
            }
        }
    }

    /// Collection `collection`'s usage, made on first use.
    fn usage_of(
        &self,
        collection: CollectionUid,
        live: impl FnOnce() -> HashSet<CollectionUid>,
    ) -> Arc<Usage> {
        let prune = {
            let guard = self.usage.read();
            if let Some(usage) = guard.0.get(&collection) {
                return usage.clone();
            }
            guard.0.len() >= guard.1
        };
        // Which collections live is asked before the lock is taken: the catalog walk holds
        // up no request.
        let live = prune.then(live);
        let mut guard = self.usage.write();
        let (usage, prune_at) = &mut *guard;
        if let Some(live) = live {
            usage.retain(|uid, _| live.contains(uid));
            *prune_at = (usage.len() * 2).max(PRUNE_AT);
        }
        usage.entry(collection).or_default().clone()
    }

    /// Collection `collection`'s usage so far, if it was used.
    pub(crate) fn usage(&self, collection: CollectionUid) -> Option<Arc<Usage>> {
        self.usage.read().0.get(&collection).cloned()
    }

    /// What `budget` provisions now, in RU/s (see [`Bucket::provisioned`]).
    pub(crate) fn provisioned(&self, budget: Budget, throughput: Throughput) -> u32 {
        self.limiter.provisioned(budget, throughput)
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
        // Refused requests that never come back are spread a second past the credit at most.
        assert!(
            delays
                .iter()
                .all(|d| *d > Duration::ZERO && *d <= Duration::from_millis(1_002)),
            "{:?}",
            delays.iter().max()
        );
    }

    /// Requests refused together are told to come back one after another, a typical
    /// request's refill apart: each that comes back when told finds credit (nearly always at
    /// once), where one delay for all brought them back together to find credit for one.
    #[test]
    fn the_refused_are_told_to_come_back_one_after_another() {
        let mut bucket = Bucket::new(Throughput::Manual { ru_per_second: 400 }, 0);
        // Ten writers of 5 RU each, each sending its next write as soon as one is admitted
        // and coming back when told after a refusal: 300 writes.
        let mut due = [0u64; 10];
        let (mut done, mut refusals, mut t) = (0, 0, 0);
        while done < 300 && t < 60_000 {
            for at in due.iter_mut().filter(|at| **at == t) {
                match bucket.admit(t) {
                    Ok(()) => {
                        bucket.charge(t, ru(5));
                        done += 1;
                        *at = t + 1;
                    }
                    Err(wait) => {
                        refusals += 1;
                        *at = t + wait.as_millis() as u64;
                    }
                }
            }
            t += 1;
        }
        assert_eq!(done, 300, "by {t} ms");
        // At 400 RU/s, 1,500 RU take 3.75 s (less the 80 RU burst).
        assert!((3_400..=4_000).contains(&t), "{t} ms");
        assert!(refusals < 2 * 300, "{refusals} refusals for 300 writes");
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
        assert_eq!(bucket.provisioned(1_500, auto), 1_000, "idle: a tenth");
        // 3,000 RU in the second from 2,000 ms: it provisioned 3,000 RU/s.
        for t in 2_000..3_000 {
            bucket.admit(t).expect("under the maximum");
            bucket.charge(t, ru(3));
        }
        assert_eq!(bucket.provisioned(3_100, auto), 3_000);
        // Offered twice the maximum: it provisions the maximum, and admits no more.
        for t in 4_000..5_000 {
            if bucket.admit(t).is_ok() {
                bucket.charge(t, ru(20));
            }
        }
        assert_eq!(bucket.provisioned(5_000, auto), 10_000);
        // Idle again: back to a tenth after a second.
        assert_eq!(bucket.provisioned(7_000, auto), 1_000);
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

    /// Every collection's requests are counted, budget or not: what they were charged, and
    /// how many were refused; a database's collections are counted apart though they share
    /// one budget. The usage of deleted collections is forgotten once there are many.
    #[test]
    fn usage_is_counted_per_collection_and_forgotten_with_it() {
        let provisioned = Provisioned::default();
        let shared = Some((Budget::Database(DatabaseUid(1)), MANUAL_1000));
        let (a, b, free) = (CollectionUid(2), CollectionUid(3), CollectionUid(4));
        let none = || -> HashSet<CollectionUid> { unreachable!("nothing to forget yet") };
        let (mut admitted, mut refused) = (0, 0);
        for i in 0..400 {
            let collection = if i % 2 == 0 { a } else { b };
            match provisioned.admit(collection, shared, none) {
                Ok(ok) => {
                    ok.charge_now(ru(5));
                    admitted += 1;
                }
                Err(wait) => {
                    assert!(wait > Duration::ZERO);
                    refused += 1;
                }
            }
        }
        provisioned
            .admit(free, None, none)
            .expect("unlimited")
            .charge_now(ru(7));
        let (ua, ub) = (
            provisioned.usage(a).expect("used"),
            provisioned.usage(b).expect("used"),
        );
        // The 200 RU burst between them, spent 5 RU at a time (within the few ms the loop
        // takes, the refill adds little).
        assert!((40..=60).contains(&admitted), "{admitted}");
        assert_eq!(ua.consumed() + ub.consumed(), f64::from(admitted * 5));
        assert_eq!(ua.throttled() + ub.throttled(), refused);
        assert!(ua.throttled() > 0 && ub.throttled() > 0);
        let unlimited = provisioned.usage(free).expect("used");
        assert_eq!((unlimited.consumed(), unlimited.throttled()), (7.0, 0));
        assert!(provisioned.usage(CollectionUid(99)).is_none());

        // Collections made and deleted: only the live ones' usage stays.
        for uid in 100..100 + PRUNE_AT as u64 {
            provisioned
                .admit(CollectionUid(uid), None, || HashSet::from([a]))
                .expect("unlimited");
        }
        assert!(provisioned.usage(a).is_some(), "live");
        assert!(provisioned.usage(b).is_none(), "deleted, forgotten");
        assert!(provisioned.usage.read().0.len() < PRUNE_AT);
    }

    /// In a cluster each node holds a budget to its share: the partitions it serves of all of
    /// them, rounded up, so that the nodes together spend the budget.
    #[test]
    fn a_node_holds_its_share_of_each_budget() {
        let manual = Throughput::Manual {
            ru_per_second: 1_000,
        };
        assert_eq!(share(manual, 64, 64), manual);
        assert_eq!(share(manual, 16, 64).limit(), 250);
        assert_eq!(share(manual, 1, 3).limit(), 334);
        assert_eq!(share(manual, 0, 64).limit(), 16, "as if it served one");
        let auto = Throughput::Autoscale {
            max_ru_per_second: 4_000,
        };
        assert_eq!(
            share(auto, 32, 64),
            Throughput::Autoscale {
                max_ru_per_second: 2_000
            }
        );
        // Three nodes with a third each spend the budget between them.
        let total: u32 = (0..3).map(|_| share(manual, 22, 64).limit()).sum();
        assert!((1_000..=1_035).contains(&total), "{total}");
    }

    /// A rate of any whole number of RU/s (a node's share: 7 of 400 RU/s) refills exactly,
    /// however often the bucket is looked at: no fraction is lost between refills.
    #[test]
    fn a_small_share_refills_exactly_when_asked_every_millisecond() {
        let limiter = Limiter::default();
        let seven = Throughput::Manual { ru_per_second: 7 };
        // 10 requests of 0.01 RU offered every millisecond for 10 s: 1,000 RU/s offered.
        let mut spent = 0;
        for t in 0..10_000 {
            for _ in 0..10 {
                if let Ok(admitted) = limiter.admit(CollectionUid(1), seven, t) {
                    admitted.charge(t, RequestCharge::from_hundredths(1));
                    spent += 1;
                }
            }
        }
        // 70 RU in 10 s, and the 1.4 RU burst held at the start, in hundredths.
        assert!((7_000..=7_200).contains(&spent), "{spent}");
    }
}
