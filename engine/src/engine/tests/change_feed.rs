//! The change feed with a manual clock: every change in commit order, each expiry at its
//! instant (timers, inherit queues, settings changes), expired is final, resuming from any
//! continuation exactly once, scopes and ranges, and a restart with documents that expired
//! while the server was down.

use std::time::Duration;

use super::*;
use crate::engine::{
    ChangeEvent, ChangeFeedCursor, ChangeFeedMode, ChangeFeedScope, ChangeFeedStart, ChangeOp,
};

/// Every durable event past `cursor`, read `per_page` at a time.
async fn drain(
    engine: &Engine,
    cursor: &mut ChangeFeedCursor,
    per_page: usize,
) -> Vec<ChangeEvent> {
    let mut out = Vec::new();
    loop {
        engine
            .wait_for_changes(cursor, Duration::ZERO)
            .await
            .expect("waits");
        let page = engine
            .read_changes(cursor, per_page, usize::MAX, &mut QueryReads::unlimited())
            .expect("reads");
        // Empty only once every shard is read to its durable end.
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

fn open(engine: &Engine, path: &CollectionPath, mode: ChangeFeedMode) -> ChangeFeedCursor {
    engine
        .open_change_feed(path, None, Some(mode), ChangeFeedStart::Beginning)
        .expect("opens")
}

/// The whole feed, every version and delete, from the beginning.
async fn history(engine: &Engine, path: &CollectionPath) -> Vec<ChangeEvent> {
    let mut cursor = open(engine, path, ChangeFeedMode::AllVersionsAndDeletes);
    drain(engine, &mut cursor, 1000).await
}

/// (operation, id, crts) of each event.
fn summary(events: &[ChangeEvent]) -> Vec<(ChangeOp, String, Millis)> {
    events
        .iter()
        .map(|e| {
            (
                e.record.op,
                e.record.key.id.as_str().to_owned(),
                e.record.crts,
            )
        })
        .collect()
}

#[tokio::test]
async fn every_change_is_logged_in_commit_order_with_its_operation() {
    let f = Fixture::new(Some(-1));
    let a = key("p", "a");
    f.create("a", None);
    f.advance(1);
    f.engine
        .replace_document(
            &f.path,
            a.clone(),
            body(json!({"id": "a", "pk": "p", "n": 1})),
            None,
        )
        .result
        .expect("replace");
    f.advance(1);
    f.engine
        .patch_document(
            &f.path,
            &a,
            &[PatchOp::Incr {
                path: "/n".into(),
                by: 2.into(),
            }],
            None,
            None,
        )
        .result
        .expect("patch");
    f.advance(1);
    f.engine
        .upsert_document(&f.path, doc("b", Some(60)), None, None)
        .result
        .expect("upsert");
    f.advance(1);
    f.engine
        .delete_document(&f.path, &a, None)
        .result
        .expect("delete");
    f.advance(1);
    f.engine
        .touch_document(&f.path, &key("p", "b"), None)
        .result
        .expect("touch");

    let events = history(&f.engine, &f.path).await;
    assert_eq!(
        summary(&events),
        [
            (ChangeOp::Create, "a".into(), T0),
            (ChangeOp::Replace, "a".into(), T0 + 1),
            (ChangeOp::Patch, "a".into(), T0 + 2),
            (ChangeOp::Create, "b".into(), T0 + 3),
            (ChangeOp::Delete, "a".into(), T0 + 4),
            (ChangeOp::Replace, "b".into(), T0 + 5),
        ]
    );
    // One partition, one shard: positions increase, and each names the document's previous.
    assert!(
        events
            .windows(2)
            .all(|w| w[0].lsn < w[1].lsn && w[0].shard == w[1].shard)
    );
    assert_eq!(events[0].record.previous, 0);
    assert_eq!(events[1].record.previous, events[0].lsn);
    assert_eq!(events[2].record.previous, events[1].lsn);
    assert_eq!(events[4].record.previous, events[2].lsn);
    assert_eq!(events[5].record.previous, events[3].lsn);
    // Writes carry the new version's body; deletes none.
    let patched = mayfly_json::decode(events[2].record.body.as_ref().expect("body"));
    assert_eq!(patched["n"], json!(3));
    assert_eq!(events[4].record.body, None);
    assert_eq!(
        events[3].record.ttl,
        Some(DocumentTtl::After(TtlSeconds::new(60).expect("valid")))
    );

    // latest_version: the writes only.
    let mut latest = open(&f.engine, &f.path, ChangeFeedMode::LatestVersion);
    let ops: Vec<ChangeOp> = drain(&f.engine, &mut latest, 1000)
        .await
        .iter()
        .map(|e| e.record.op)
        .collect();
    assert_eq!(
        ops,
        [
            ChangeOp::Create,
            ChangeOp::Replace,
            ChangeOp::Patch,
            ChangeOp::Create,
            ChangeOp::Replace
        ]
    );
}

#[tokio::test]
async fn expiries_are_logged_at_their_instant_from_timers_and_inherit_queues() {
    let f = Fixture::new(Some(10));
    f.create("inherits", None);
    f.create("own", Some(5));
    f.create("never", Some(-1));
    f.advance(5 * SEC - 1);
    f.engine.purge_now();
    assert_eq!(
        history(&f.engine, &f.path).await.len(),
        3,
        "nothing due yet"
    );
    f.advance(1);
    f.engine.purge_now();
    f.advance(5 * SEC);
    f.engine.purge_now();
    let events = history(&f.engine, &f.path).await;
    assert_eq!(
        summary(&events[3..]),
        [
            (ChangeOp::Expire, "own".into(), T0 + 5 * SEC),
            (ChangeOp::Expire, "inherits".into(), T0 + 10 * SEC),
        ]
    );
    assert_eq!(events[3].record.previous, events[1].lsn);
    // Expired is final: nothing logs them again, whatever runs next.
    f.advance(3600 * SEC);
    f.engine.purge_now();
    f.set_default(Some(-1));
    f.engine.purge_now();
    assert_eq!(history(&f.engine, &f.path).await.len(), 5);
}

#[tokio::test]
async fn a_write_after_the_instant_comes_after_the_expiry_even_before_the_purge_runs() {
    let f = Fixture::new(Some(-1));
    f.create("z", Some(1));
    f.create("other", Some(1));
    f.create("bystander", None);
    f.advance(SEC + 250);
    // No purge has run: the write itself logs what was due before it.
    f.engine
        .replace_document(&f.path, key("p", "bystander"), doc("bystander", None), None)
        .result
        .expect("replace");
    f.create("z", None);
    let events = history(&f.engine, &f.path).await;
    let tail = summary(&events[3..]);
    assert_eq!(tail.len(), 4, "{tail:?}");
    assert!(tail[..2].contains(&(ChangeOp::Expire, "z".into(), T0 + SEC)));
    assert!(tail[..2].contains(&(ChangeOp::Expire, "other".into(), T0 + SEC)));
    assert_eq!(
        tail[2],
        (ChangeOp::Replace, "bystander".into(), T0 + SEC + 250)
    );
    assert_eq!(
        tail[3],
        (ChangeOp::Create, "z".into(), T0 + SEC + 250),
        "re-created, not replaced"
    );
    let expire_z = events
        .iter()
        .find(|e| e.record.op == ChangeOp::Expire && e.record.key.id.as_str() == "z")
        .expect("logged");
    assert_eq!(events[6].record.previous, expire_z.lsn);
    // The purge then frees them and logs nothing more.
    assert_eq!(f.engine.purge_now(), 1, "\"other\"; \"z\" lives again");
    assert_eq!(history(&f.engine, &f.path).await.len(), 7);
}

#[tokio::test]
async fn a_lower_default_logs_what_it_expires_at_the_change() {
    let f = Fixture::new(Some(3600));
    f.create("old", None);
    f.advance(100 * SEC);
    f.create("young", None);
    f.advance(10 * SEC);
    f.set_default(Some(50));
    f.engine.purge_now();
    let events = history(&f.engine, &f.path).await;
    assert_eq!(
        summary(&events[2..]),
        [(ChangeOp::Expire, "old".into(), T0 + 110 * SEC)],
        "at the instant the settings changed, not at last write + 50 s"
    );
    f.advance(40 * SEC);
    f.engine.purge_now();
    assert_eq!(
        summary(&history(&f.engine, &f.path).await[3..]),
        [(ChangeOp::Expire, "young".into(), T0 + 150 * SEC)]
    );
}

#[tokio::test]
async fn a_continuation_resumes_exactly_once_from_every_position() {
    let f = Fixture::new(Some(-1));
    for i in 0..40 {
        let partition = format!("p{}", i % 7);
        let ttl = if i % 3 == 0 { json!(1) } else { json!(-1) };
        f.engine
            .create_document(
                &f.path,
                body(json!({"id": format!("d{i}"), "pk": partition, "ttl": ttl})),
                None,
            )
            .result
            .expect("create");
    }
    f.advance(SEC);
    f.engine.purge_now();
    let all = history(&f.engine, &f.path).await;
    assert_eq!(all.len(), 40 + 14);
    // Page by page, one event at a time: the tokens after each resume at the next event.
    let mut cursor = open(&f.engine, &f.path, ChangeFeedMode::AllVersionsAndDeletes);
    let mut tokens = vec![f.engine.change_feed_token(&cursor)];
    let mut seen = Vec::new();
    loop {
        f.engine
            .wait_for_changes(&cursor, Duration::ZERO)
            .await
            .expect("waits");
        let page = f
            .engine
            .read_changes(&mut cursor, 1, usize::MAX, &mut QueryReads::unlimited())
            .expect("reads");
        if page.is_empty() {
            break;
        }
        seen.extend(page);
        tokens.push(f.engine.change_feed_token(&cursor));
    }
    let key_of = |e: &ChangeEvent| (e.shard, e.lsn);
    let mut expected: Vec<_> = all.iter().map(key_of).collect();
    expected.sort_unstable();
    let mut got: Vec<_> = seen.iter().map(key_of).collect();
    got.sort_unstable();
    assert_eq!(got, expected, "each event once");
    for (i, token) in tokens.iter().enumerate() {
        let mut resumed = f
            .engine
            .open_change_feed(
                &f.path,
                None,
                None,
                ChangeFeedStart::Continuation(token.clone()),
            )
            .expect("resumes");
        let rest: Vec<_> = drain(&f.engine, &mut resumed, 1000)
            .await
            .iter()
            .map(key_of)
            .collect();
        let mut rest_sorted = rest.clone();
        rest_sorted.sort_unstable();
        let mut want: Vec<_> = seen[i..].iter().map(key_of).collect();
        want.sort_unstable();
        assert_eq!(rest_sorted, want, "resumed after {i} events");
    }
    // A token is bound to its collection and its mode.
    let err = f
        .engine
        .open_change_feed(
            &f.path,
            None,
            Some(ChangeFeedMode::LatestVersion),
            ChangeFeedStart::Continuation(tokens[3].clone()),
        )
        .expect_err("another mode");
    assert!(
        matches!(err, Error::Invalid(InvalidInput::Continuation { .. })),
        "{err}"
    );
    let mut forged = tokens[3].clone();
    forged.replace_range(2..3, if &forged[2..3] == "A" { "B" } else { "A" });
    assert!(
        f.engine
            .open_change_feed(&f.path, None, None, ChangeFeedStart::Continuation(forged))
            .is_err()
    );
}

#[tokio::test]
async fn partitions_and_feed_ranges_see_their_own_events_and_ranges_share_all() {
    let f = Fixture::new(Some(-1));
    for i in 0..60 {
        f.engine
            .create_document(
                &f.path,
                body(json!({"id": format!("d{i}"), "pk": format!("p{}", i % 13)})),
                None,
            )
            .result
            .expect("create");
    }
    let all = history(&f.engine, &f.path).await;
    let mut one = f
        .engine
        .open_change_feed(
            &f.path,
            Some(ChangeFeedScope::Partition(pk("p3"))),
            None,
            ChangeFeedStart::Beginning,
        )
        .expect("opens");
    let p3 = drain(&f.engine, &mut one, 7).await;
    assert_eq!(
        p3.len(),
        all.iter()
            .filter(|e| e.record.key.partition_key == pk("p3"))
            .count()
    );
    assert!(p3.iter().all(|e| e.record.key.partition_key == pk("p3")));
    for n in [1, 3, 4, 9] {
        let mut union = Vec::new();
        for range in f.engine.feed_ranges(&f.path, n).expect("ranges") {
            let parsed = f
                .engine
                .parse_feed_range(&range.to_string())
                .expect("parses");
            let mut cursor = f
                .engine
                .open_change_feed(
                    &f.path,
                    Some(ChangeFeedScope::Range(parsed)),
                    None,
                    ChangeFeedStart::Beginning,
                )
                .expect("opens");
            union.extend(
                drain(&f.engine, &mut cursor, 5)
                    .await
                    .into_iter()
                    .map(|e| (e.shard, e.lsn)),
            );
        }
        union.sort_unstable();
        let mut want: Vec<_> = all.iter().map(|e| (e.shard, e.lsn)).collect();
        want.sort_unstable();
        assert_eq!(union, want, "{n} ranges");
    }
}

#[tokio::test]
async fn now_starts_after_every_committed_change_and_time_at_an_instant() {
    let f = Fixture::new(Some(-1));
    f.create("before", None);
    let mut now = f
        .engine
        .open_change_feed(&f.path, None, None, ChangeFeedStart::Now)
        .expect("opens");
    f.advance(10 * SEC);
    f.create("after", None);
    let seen = drain(&f.engine, &mut now, 10).await;
    assert_eq!(
        summary(&seen),
        [(ChangeOp::Create, "after".into(), T0 + 10 * SEC)]
    );
    let mut at = f
        .engine
        .open_change_feed(&f.path, None, None, ChangeFeedStart::Time(T0 + 5 * SEC))
        .expect("opens");
    assert_eq!(
        summary(&drain(&f.engine, &mut at, 10).await),
        summary(&seen)
    );
}

/// Turns the feed off (default TTL 1 s), writes a document that expires and is purged, and
/// checks that the feed refuses readers; returns the positions appended over every shard.
fn feed_off_write_and_expire(f: &Fixture) -> u64 {
    f.engine
        .replace_collection(
            &f.path,
            SettingsChange {
                default_ttl: default_ttl(Some(1)),
                indexing_mode: None,
                index_paths: None,
                must_live: None,
                change_feed_retention: Some(FeedRetention::OFF),
            },
        )
        .expect("feed off");
    f.create("a", None);
    f.advance(SEC);
    assert_eq!(f.engine.purge_now(), 1);
    let err = f
        .engine
        .open_change_feed(&f.path, None, None, ChangeFeedStart::Beginning)
        .expect_err("no feed");
    assert!(matches!(err, Error::NoChangeFeed { .. }), "{err}");
    f.engine.shards().iter().map(|s| s.log_tip().seq).sum()
}

#[tokio::test]
async fn a_collection_without_a_feed_logs_nothing_and_refuses_readers() {
    let f = Fixture::new(Some(1));
    assert_eq!(feed_off_write_and_expire(&f), 0, "nothing appended");
}

#[tokio::test]
async fn with_every_commit_logged_a_collection_without_a_feed_logs_all_the_same() {
    // Cluster mode replicates a partition by its log: a commit without records would replicate
    // nothing. The feed stays off for readers.
    let config = EngineConfig {
        log_every_commit: true,
        ..EngineConfig::new(4)
    };
    let f = Fixture::with_config(Some(1), Arc::new(MemoryStorage::new()), config);
    assert_eq!(
        feed_off_write_and_expire(&f),
        2,
        "the create and the expiry are logged"
    );
}

/// Documents that expired while the server was down get their expiry events after the
/// restart, once; one whose expiry was logged before the crash is not logged again.
#[tokio::test]
async fn a_restart_logs_what_expired_while_down_and_nothing_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    {
        let (engine, path) = disk_engine(dir.path(), clock.clone());
        create_db_and_c(&engine, default_ttl(Some(60)));
        engine
            .create_document(&path, doc("early", Some(5)), None)
            .result
            .expect("create");
        engine
            .create_document(&path, doc("late", None), None)
            .result
            .expect("create");
        clock.advance(10 * SEC);
        // This write logs "early"'s expiry first; no purge runs before the crash.
        engine
            .create_document(&path, doc("writer", Some(-1)), None)
            .result
            .expect("create");
        engine.durable().await.expect("durable");
        let events = history(&engine, &path).await;
        assert_eq!(events.len(), 4);
        assert_eq!(events[2].record.op, ChangeOp::Expire);
    }
    clock.advance(100 * SEC);
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    for shard in engine.shards() {
        let (_, undurable) = shard.purge_batch(&*clock, purge::PURGE_BATCH);
        if let Some(undurable) = undurable {
            assert!(shard.finish_purge(undurable, &*clock).await);
        }
    }
    let events = history(&engine, &path).await;
    assert_eq!(
        summary(&events),
        [
            (ChangeOp::Create, "early".into(), T0),
            (ChangeOp::Create, "late".into(), T0),
            (ChangeOp::Expire, "early".into(), T0 + 5 * SEC),
            (ChangeOp::Create, "writer".into(), T0 + 10 * SEC),
            (ChangeOp::Expire, "late".into(), T0 + 60 * SEC),
        ]
    );
    assert!(
        events
            .windows(2)
            .all(|w| w[0].shard != w[1].shard || w[0].lsn < w[1].lsn)
    );
    assert!(
        engine
            .read_document(&path, &key("p", "early"))
            .result
            .is_err()
    );
}

fn set_retention(f: &Fixture, secs: i64) {
    f.engine
        .replace_collection(
            &f.path,
            SettingsChange {
                default_ttl: default_ttl(Some(-1)),
                indexing_mode: None,
                index_paths: None,
                must_live: None,
                change_feed_retention: Some(FeedRetention::from_secs(secs).expect("valid")),
            },
        )
        .expect("retention");
}

#[tokio::test]
async fn retention_removes_old_events_and_a_reader_behind_it_is_told() {
    let f = Fixture::new(Some(-1));
    set_retention(&f, 60);
    let from_start = f.engine.change_feed_token(&open(
        &f.engine,
        &f.path,
        ChangeFeedMode::AllVersionsAndDeletes,
    ));
    for i in 0..3 {
        f.create(&format!("old{i}"), None);
    }
    f.advance(90 * SEC);
    f.create("recent", None);
    f.advance(10 * SEC);
    assert_eq!(
        f.engine.trim_change_feeds().expect("trims"),
        3,
        "older than 60 s"
    );
    assert_eq!(f.engine.trim_change_feeds().expect("trims"), 0);
    let kept = history(&f.engine, &f.path).await;
    assert_eq!(
        summary(&kept),
        [(ChangeOp::Create, "recent".into(), T0 + 90 * SEC)]
    );
    let err = f
        .engine
        .open_change_feed(
            &f.path,
            None,
            None,
            ChangeFeedStart::Continuation(from_start),
        )
        .expect_err("behind retention");
    match err {
        Error::ChangesTrimmed { oldest, at, .. } => {
            assert_eq!(oldest, kept[0].lsn);
            assert_eq!(at, Some(T0 + 90 * SEC));
        }
        e => panic!("unexpected {e}"),
    }
    // A feed turned off keeps nothing.
    set_retention(&f, 0);
    assert_eq!(f.engine.trim_change_feeds().expect("trims"), 1);
    set_retention(&f, 3600);
    assert!(history(&f.engine, &f.path).await.is_empty());
}

#[tokio::test]
async fn memory_storage_keeps_at_most_its_cap_of_events() {
    // Five records of partition "p" (ids d0..d7 encode to the same size).
    let record = {
        let mut bytes = Vec::new();
        ChangeRecord {
            op: ChangeOp::Create,
            crts: T0,
            logged_at: T0,
            version: 1,
            previous: 0,
            ttl: None,
            key: key("p", "d0"),
            body: Some(doc("d0", None).into_stored().0),
        }
        .encode(&mut bytes);
        bytes.len() + 48
    };
    let storage = Arc::new(MemoryStorage::new().with_feed_cap(5 * record + record / 2));
    let f = Fixture::with_storage(Some(-1), storage);
    let start = f.engine.change_feed_token(&open(
        &f.engine,
        &f.path,
        ChangeFeedMode::AllVersionsAndDeletes,
    ));
    for i in 0..8 {
        f.create(&format!("d{i}"), None);
    }
    let kept: Vec<String> = history(&f.engine, &f.path)
        .await
        .iter()
        .map(|e| e.record.key.id.as_str().to_owned())
        .collect();
    assert_eq!(
        kept,
        ["d3", "d4", "d5", "d6", "d7"],
        "the oldest went first"
    );
    let err = f
        .engine
        .open_change_feed(&f.path, None, None, ChangeFeedStart::Continuation(start))
        .expect_err("behind the cap");
    assert!(matches!(err, Error::ChangesTrimmed { .. }), "{err}");
}

#[tokio::test]
async fn a_continuation_from_before_the_feed_was_turned_off_and_on_is_refused() {
    let f = Fixture::new(Some(-1));
    f.create("a", None);
    let mut cursor = open(&f.engine, &f.path, ChangeFeedMode::AllVersionsAndDeletes);
    assert_eq!(drain(&f.engine, &mut cursor, 10).await.len(), 1);
    let token = f.engine.change_feed_token(&cursor);
    set_retention(&f, 0);
    f.create("unlogged", None);
    f.advance(SEC);
    set_retention(&f, 3600);
    f.create("b", None);
    let err = f
        .engine
        .open_change_feed(&f.path, None, None, ChangeFeedStart::Continuation(token))
        .expect_err("the feed has a gap");
    assert!(
        matches!(err, Error::FeedRestarted { since } if since == T0 + SEC),
        "{err}"
    );
    // A stream open across the change ends at its next page.
    let next = f
        .engine
        .change_feed_page(&f.path, &cursor, 10, QueryReads::unlimited());
    assert!(
        matches!(next.result, Err(Error::FeedRestarted { .. })),
        "{:?}",
        next.result.map(|p| p.events.len())
    );
    // From the beginning: what was logged, nothing of the gap.
    let ids: Vec<String> = history(&f.engine, &f.path)
        .await
        .iter()
        .map(|e| e.record.key.id.as_str().to_owned())
        .collect();
    assert_eq!(ids, ["a", "b"]);
}
