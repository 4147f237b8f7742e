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
//! Besides single writes, sequences patch (conditions, steps that cannot apply), run
//! transactional batches on one partition (all or nothing: a failing operation leaves nothing
//! of those before it), change the indexing policy and run the background indexer; after every
//! crash, equality and `ORDER BY` queries must return exactly the documents the model holds,
//! through the index once it is complete.
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
    storage::{Crash, Mutation, PowerLossStorage},
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
/// The failure of a query whose results are not the model's.
const INDEXED_QUERY: &str = "a query disagrees with the documents";
/// The failure a change feed out of step with the durable state reports.
const FEED_HISTORY: &str = "the change feed is not the history of the durable state";

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

/// Index entries are not made durable with their documents: after a power cut, indexed
/// queries miss documents a read by key finds.
#[test]
fn power_loss_model_catches_index_entries_lost_in_a_power_cut() {
    assert_caught(Mutation::IndexNotDurable, INDEXED_QUERY);
}

/// Change log records are not made durable with their changes: after a power cut, documents
/// are stored whose events are gone.
#[test]
fn power_loss_model_catches_change_events_lost_in_a_power_cut() {
    assert_caught(Mutation::LogNotDurable, FEED_HISTORY);
}

/// Found by the batch operations of the model: a batch that creates a document and deletes it
/// again stores nothing for it, yet its response carries the created version's etag; nothing
/// durable recorded that the version was handed out, so after a restart the engine handed the
/// same etag out again, and a client's `if_match` with it could match another incarnation of
/// the document. The batch now has storage keep the version floor (`Change::KeepFloor`).
#[test]
fn power_loss_batch_versions_of_a_document_never_stored_are_not_reused() {
    let clock = Arc::new(ManualClock::new(T0));
    let open = |storage: &PowerLossStorage| {
        Engine::open(
            EngineConfig::new(SHARDS),
            Arc::new(storage.clone()),
            clock.clone(),
        )
        .expect("opens")
        .0
    };
    let storage = PowerLossStorage::new(Mutation::None);
    let engine = open(&storage);
    let path = CollectionPath {
        database: ResourceId::parse(IdKind::Database, "db").expect("valid id"),
        collection: ResourceId::parse(IdKind::Collection, "c").expect("valid id"),
    };
    engine
        .create_database(path.database.clone())
        .expect("database");
    engine
        .create_collection(
            &path.database,
            path.collection.clone(),
            PartitionKeyPath::parse("/pk").expect("valid path"),
            CollectionSettings::new(DefaultTtl::Off, IndexingMode::Consistent).expect("valid"),
            Default::default(),
        )
        .expect("collection");
    let (body, _) = ops::body(0, None, None, 1);
    let ops = [
        BatchOp::Upsert {
            body,
            if_match: None,
        },
        BatchOp::Delete {
            id: ops::doc_key(0).id,
            if_match: None,
        },
    ];
    let pk = ops::doc_key(0).partition_key;
    let outputs = engine
        .execute_batch(&path, pk, &ops)
        .result
        .expect("the batch commits");
    let BatchOutput::Upserted(_, created) = &outputs[0] else {
        panic!("an upsert's output: {outputs:?}");
    };
    // Everything kept, as a clean restart keeps it.
    drop(engine);
    let engine = open(&storage.crash(Crash::ProcessKill).0);
    let (body, _) = ops::body(0, None, None, 2);
    let again = engine
        .create_document(&path, body, None)
        .result
        .expect("created");
    assert_ne!(
        again.etag, created.etag,
        "an etag handed out before the restart was handed out again"
    );
}
