//! A power-loss model of durability, in the spirit of redb's and FoundationDB's crash tests.
//!
//! [`storage::PowerLossStorage`] keeps every write (document batches and catalog changes
//! alike) in one ordered log, each at its own position, and applies it to a volatile image at
//! once. The test decides when the log is synced, and only a sync makes a durable wait
//! resolve. A crash keeps a prefix of the log: the synced one after a power cut, all of it
//! after a process is killed (the page cache survives). The engine is reopened over what is
//! kept with [`Engine::open`].
//!
//! A random sequence of document operations, clock advances, settings changes, purges, syncs
//! and crashes runs against a reference model of the TTL rules (SPEC §2-4). The model records,
//! per document, every write with the log position the storage gave it, and whether it was
//! acknowledged (its outcome settled). After a crash each document must hold exactly the last
//! write the kept prefix holds, judged by the TTL model; acknowledged writes must survive; an
//! expired version is never read again; no etag a client may have seen is handed out again.
//!
//! Mutation checks run the same property over storage with a planted bug and require the
//! failure it must cause: each shows the model can see that kind of bug.

mod model;
mod ops;
mod run;
mod storage;

use std::{
    collections::BTreeSet,
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use proptest::{
    prelude::*,
    test_runner::{RngSeed, TestCaseError, TestError, TestRunner},
};

use self::{
    ops::{default_ttl, ops},
    run::{Run, check},
    storage::Mutation,
};
use super::*;

const T0: Millis = 1_790_000_000_000;
const SHARDS: usize = 4;
/// Document ids per partition.
const IDS: usize = 3;
/// Every id of a partition lands on one shard: several partitions spread the keys over
/// several shards (checked by `power_loss_partitions_span_shards`).
const PARTITIONS: [&str; 5] = ["a", "b", "c", "d", "e"];
/// Every document address the test uses: `IDS` ids in each partition.
const KEYS: usize = IDS * PARTITIONS.len();
/// A settle whose position is synced completes at once; this only turns a hang into a failure.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The failure a lost acknowledged write reports; the mutation checks look for it.
const LOST_ACK: &str = "an acknowledged write was lost";
/// The failure an expired version read again reports.
const EXPIRED_IS_FINAL: &str = "expired is final";

fn raw_ttl(ttl: Option<DocumentTtl>) -> Option<i64> {
    ttl.map(|t| i64::from(t.to_raw()))
}

/// Polls a future once: its output if it completes without waiting.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

/// `error` with what was being done in front of its message.
fn context(error: TestCaseError, what: impl std::fmt::Display) -> TestCaseError {
    match error {
        TestCaseError::Fail(reason) => fail(format!("{what}: {}", reason.message())),
        reject => reject,
    }
}

/// 256 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    ProptestConfig {
        // A failure is reported with its shrunk sequence; no regression file in the tree.
        failure_persistence: None,
        max_shrink_iters: 2_048,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// After every crash each document holds exactly what the kept log holds, acknowledged
    /// writes survive, expired is final, etags never repeat.
    #[test]
    fn power_loss_acknowledged_writes_survive(default in default_ttl(), ops in ops()) {
        check(default, &ops, Mutation::None)?;
    }
}

/// The keys must exercise more than one shard, or cross-shard log order goes untested.
#[test]
fn power_loss_partitions_span_shards() {
    let shards: BTreeSet<usize> = Run::shards_of_partitions();
    assert!(
        shards.len() >= 2,
        "every partition lands on shards {shards:?}: pick other partition key values"
    );
}

/// Runs the property over storage with `mutation` planted, from a fixed seed so that a miss
/// is reproducible, and requires a failure whose message contains `expected`.
fn assert_caught(mutation: Mutation, expected: &str) {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x6d61_7966_6c79),
        // Shrinking only shortens the report; the first failure already proves the point.
        max_shrink_iters: 256,
        ..config()
    });
    let result = runner.run(&(default_ttl(), ops()), |(default, ops)| {
        check(default, &ops, mutation)
    });
    match result {
        Err(TestError::Fail(reason, (default, ops))) => {
            assert!(
                reason.message().contains(expected),
                "{mutation:?} failed for another reason than {expected:?}: {reason}"
            );
            eprintln!("{mutation:?} caught, default {default:?}, shrunk to {ops:?}: {reason}");
        }
        other => panic!("{mutation:?} went unnoticed: {other:?}"),
    }
}

/// Durable waits for document writes resolve before the sync: the engine acknowledges writes
/// a power cut takes back.
#[test]
fn power_loss_model_catches_acknowledging_before_the_sync() {
    assert_caught(Mutation::AcknowledgeEarly, LOST_ACK);
}

/// A shard write reports a position one before its own: the engine settles too early.
#[test]
fn power_loss_model_catches_a_position_reported_too_low() {
    assert_caught(Mutation::PositionOneLow, LOST_ACK);
}

/// The catalog loads without the marks earlier defaults left: a restart revives documents
/// that had expired.
#[test]
fn power_loss_model_catches_forgotten_expired_marks() {
    assert_caught(Mutation::ForgetExpiredMarks, EXPIRED_IS_FINAL);
}
