//! When and how soon a failed request is sent again.

use std::{
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use crate::{client::Call, error::Error};

/// How the client sends a failed request again: only for errors where that is safe
/// ([`Error::is_retryable`]: the server could not be reached, was unavailable, or throttled
/// the request), after an exponential backoff with jitter (attempt *n* waits a random time
/// between half and all of `base_delay × 2ⁿ⁻¹`, at most `max_delay`).
///
/// Which requests are sent again:
///
/// | failure | reads, and `touch`/`delete` without `if_match` | create, upsert, replace without `if_match` | patch, batches that write, writes with `if_match` (`update`'s too) |
/// | --- | --- | --- | --- |
/// | nothing was applied ([`Error::is_retryable`]: never sent, storage refusing writes, throttled, a contended batch) | yes | yes | yes |
/// | it may have been applied (the connection broke, `OUTCOME_UNKNOWN`) | yes | only with [`RetryPolicy::retry_writes`] | never: an `incr` would count twice, an `if_match` write report its own first try as a conflict |
/// | [`Error::Timeout`] | no | no | no |
///
/// A write sent with an idempotency key (`.idempotency_key(..)` on any write, patch or batch)
/// is sent again after every failure of the first two rows and after [`Error::Timeout`]: the
/// server applies it at most once, and answers a copy of an applied request as the first time.
///
/// The next page of a feed or query is not sent again: a broken stream is resumed from its
/// continuation by the caller.
///
/// Defaults: 3 attempts, 100 ms base delay, 2 s longest delay, writes not retried.
///
/// ```
/// use std::time::Duration;
/// use mayfly_client::RetryPolicy;
/// let patient = RetryPolicy::default()
///     .max_attempts(6)
///     .base_delay(Duration::from_millis(50))
///     .max_delay(Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    retry_writes: bool,
    throttle_retries: u32,
    throttle_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            retry_writes: false,
            throttle_retries: 9,
            throttle_wait: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Every request is sent once.
    ///
    /// ```
    /// use mayfly_client::RetryPolicy;
    /// assert_eq!(RetryPolicy::none(), RetryPolicy::default().max_attempts(1));
    /// ```
    pub fn none() -> Self {
        RetryPolicy::default().max_attempts(1)
    }

    /// Attempts in all, the first included (at least 1).
    ///
    /// ```
    /// use mayfly_client::RetryPolicy;
    /// let policy = RetryPolicy::default().max_attempts(5);
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The backoff before the first retry, doubled for each next one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mayfly_client::RetryPolicy;
    /// let policy = RetryPolicy::default().base_delay(Duration::from_millis(10));
    /// ```
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The longest backoff.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mayfly_client::RetryPolicy;
    /// let policy = RetryPolicy::default().max_delay(Duration::from_secs(1));
    /// ```
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Also sends creates, upserts and replaces without `if_match` again after a failure that
    /// may have come after the server applied them (the connection broke, `OUTCOME_UNKNOWN`):
    /// a create may then fail with [`Error::Conflict`] on its own document, and an upsert or
    /// replace apply twice. Off by default. Never for patches, batches that write, writes with
    /// `if_match` or [`update`](crate::Collection::update)'s write: sent twice, an `incr` would
    /// count twice, and an `if_match` write would report its own first try as a conflict.
    ///
    /// ```
    /// use mayfly_client::RetryPolicy;
    /// let policy = RetryPolicy::default().retry_writes(true);
    /// ```
    pub fn retry_writes(mut self, retry: bool) -> Self {
        self.retry_writes = retry;
        self
    }

    /// How often a request throttled by its collection's provisioned throughput
    /// ([`Reason::RequestRateTooLarge`](crate::Reason::RequestRateTooLarge): nothing was
    /// applied) is sent again, each after the delay the server gave, within `max_wait` of
    /// waiting in all (Cosmos DB's defaults: 9 and 30 s). These retries come on top of
    /// [`max_attempts`](Self::max_attempts), and apply to every request, writes included: a
    /// throttled write was not applied. `throttle_retries(0, ..)` hands every throttled
    /// request to the caller.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mayfly_client::RetryPolicy;
    /// let patient = RetryPolicy::default().throttle_retries(20, Duration::from_secs(60));
    /// let mine = RetryPolicy::default().throttle_retries(0, Duration::ZERO);
    /// ```
    pub fn throttle_retries(mut self, retries: u32, max_wait: Duration) -> Self {
        self.throttle_retries = retries;
        self.throttle_wait = max_wait;
        self
    }

    /// The wait before throttled request `error` is sent again, after `retried` throttled
    /// retries that waited `waited` in all; `None` once the policy's retries or wait are
    /// spent, or when `error` is not a throttled request.
    pub(crate) fn throttled_delay(
        &self,
        error: &Error,
        retried: u32,
        waited: Duration,
    ) -> Option<Duration> {
        let Error::ResourceExhausted(details) = error else {
            return None;
        };
        if details.reason() != Some(&crate::Reason::RequestRateTooLarge) {
            return None;
        }
        let delay = details.retry_after().unwrap_or(self.base_delay);
        (retried < self.throttle_retries && waited + delay <= self.throttle_wait).then_some(delay)
    }

    /// Whether attempt number `attempt` (from 1), which failed with `error`, is followed by
    /// another.
    pub(crate) fn may_retry(&self, call: Call, error: &Error, attempt: u32) -> bool {
        // A broken connection or OUTCOME_UNKNOWN: the request may have been applied.
        let maybe_applied = matches!(error, Error::Unavailable(_));
        attempt < self.max_attempts
            && (error.is_retryable()
                || call == Call::Keyed && error.may_have_applied()
                || maybe_applied
                    && match call {
                        Call::Idempotent | Call::Keyed => true,
                        Call::Write => self.retry_writes,
                        Call::Once => false,
                    })
    }

    /// The backoff after attempt number `attempt` (from 1).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let doubled = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let ceiling = doubled.min(self.max_delay);
        ceiling / 2 + jitter(ceiling / 2)
    }
}

/// A new idempotency key: 32 hex digits, random (from std's per-hasher random keys, seeded by
/// the operating system), so that two writes never share one by chance. Make one per logical
/// write and send every try of that write with it.
///
/// ```
/// let key = mayfly_client::new_idempotency_key();
/// assert_eq!(key.len(), 32);
/// assert_ne!(key, mayfly_client::new_idempotency_key());
/// ```
pub fn new_idempotency_key() -> String {
    let now = std::time::SystemTime::now();
    let high = RandomState::new().hash_one(now);
    let low = RandomState::new().hash_one((now, high));
    format!("{high:016x}{low:016x}")
}

/// A random duration from zero to `max`: spreads the retries of clients that failed together.
/// The randomness comes from std's per-hasher random keys (no dependency needed).
pub(crate) fn jitter(max: Duration) -> Duration {
    let random = RandomState::new().hash_one(std::time::Instant::now());
    max.mul_f64(random as f64 / u64::MAX as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_ceiling() {
        let policy = RetryPolicy::default();
        for _ in 0..100 {
            let first = policy.delay(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = policy.delay(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            assert!(policy.delay(30) <= Duration::from_secs(2));
        }
        let spread: std::collections::HashSet<_> = (0..20).map(|_| policy.delay(1)).collect();
        assert!(spread.len() > 1, "jittered");
    }

    #[test]
    fn writes_are_retried_only_when_never_sent_or_on_request() {
        let unavailable = Error::from_status(tonic::Status::unavailable("draining"), "here");
        let refused = Error::connect(
            "here",
            &std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        let timeout = Error::timeout(Duration::from_secs(1));
        let refusing = Error::Unavailable(crate::ErrorDetails::new(
            tonic::Code::Unavailable,
            "storage cannot make writes durable now",
            Some(crate::Reason::StorageUnavailable),
        ));
        let policy = RetryPolicy::default();
        assert!(
            policy.may_retry(Call::Once, &refusing, 1),
            "nothing applied: even a patch"
        );
        assert!(policy.may_retry(Call::Idempotent, &unavailable, 1));
        assert!(policy.may_retry(Call::Idempotent, &unavailable, 2));
        assert!(
            !policy.may_retry(Call::Idempotent, &unavailable, 3),
            "3 attempts"
        );
        assert!(!policy.may_retry(Call::Write, &unavailable, 1));
        assert!(policy.may_retry(Call::Write, &refused, 1), "never sent");
        assert!(!policy.may_retry(Call::Idempotent, &timeout, 1));
        let writes = policy.retry_writes(true);
        assert!(writes.may_retry(Call::Write, &unavailable, 1));
        assert!(!writes.may_retry(Call::Write, &timeout, 1));
        assert!(
            !writes.may_retry(Call::Once, &unavailable, 1),
            "a patch or if_match write never, once it may have applied"
        );
        assert!(writes.may_retry(Call::Once, &refused, 1), "never sent");
        assert!(!RetryPolicy::none().may_retry(Call::Idempotent, &refused, 1));
    }

    #[test]
    fn keyed_writes_are_retried_whenever_they_may_have_applied() {
        let unavailable = Error::from_status(tonic::Status::unavailable("draining"), "here");
        let timeout = Error::timeout(Duration::from_secs(1));
        let conflict = Error::from_status(tonic::Status::already_exists("exists"), "here");
        let policy = RetryPolicy::default();
        assert_eq!(Call::Once.keyed(&Some("k".into())), Call::Keyed);
        assert_eq!(Call::Once.keyed(&None), Call::Once);
        for error in [&unavailable, &timeout] {
            assert!(policy.may_retry(Call::Keyed, error, 1), "{error}");
            assert!(!policy.may_retry(Call::Once, error, 1), "{error}");
            assert!(!policy.may_retry(Call::Keyed, error, 3), "3 attempts");
        }
        assert!(
            !policy.may_retry(Call::Keyed, &conflict, 1),
            "the server's answer"
        );
    }

    #[test]
    fn new_idempotency_keys_are_valid_and_distinct() {
        let keys: std::collections::HashSet<String> =
            (0..1000).map(|_| new_idempotency_key()).collect();
        assert_eq!(keys.len(), 1000);
        assert!(
            keys.iter()
                .all(|k| k.len() == 32 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }
}
