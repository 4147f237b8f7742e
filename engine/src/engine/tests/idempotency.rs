//! Idempotency keys: a keyed write applies at most once while its key is remembered, a copy
//! gets the first answer (replayed), another request under the key is refused, keys are
//! forgotten after the window, bounded in number, and survive a restart with the writes they
//! applied.

use super::*;

fn request(key: &str, fingerprint: u8) -> RequestKey {
    RequestKey {
        key: ResourceId::parse(IdKind::IdempotencyKey, key).expect("valid key"),
        fingerprint: [fingerprint; 16],
    }
}

fn incr(path: &str, by: i64) -> PatchOp {
    PatchOp::Incr {
        path: path.into(),
        by: by.into(),
    }
}

/// Increments `/n` of document `id` (partition "p") under `key`.
fn keyed_incr(
    f: &Fixture,
    id: &str,
    key: Option<&RequestKey>,
) -> Result<Answered<(DocumentView, bool)>, Error> {
    f.engine
        .keyed(key)
        .patch_document_with(
            &f.path,
            &super::key("p", id),
            (&[incr("/n", 1)], None),
            None,
            &PatchOptions::default(),
        )
        .result
}

/// Document "a" of partition "p", with a counter `/n` at 0.
fn counter_doc(f: &Fixture) {
    f.engine
        .create_document(&f.path, body(json!({"id": "a", "pk": "p", "n": 0})), None)
        .result
        .expect("create");
}

fn counter(f: &Fixture, id: &str) -> i64 {
    let view = f.read(id).expect("live");
    view.body_map()["n"].as_i64().expect("a number")
}

#[test]
fn a_copy_of_an_applied_write_gets_the_first_answer_and_applies_nothing() {
    let f = Fixture::new(None);
    counter_doc(&f);
    let key = request("k1", 1);
    let first = keyed_incr(&f, "a", Some(&key)).expect("applied");
    assert!(!first.replayed);
    f.clock.advance(SEC);
    let again = keyed_incr(&f, "a", Some(&key)).expect("replayed");
    assert!(again.replayed);
    assert_eq!(
        again.value, first.value,
        "the first answer, etag and _ts included"
    );
    assert_eq!(counter(&f, "a"), 1, "applied once");
    // Another key is another request.
    keyed_incr(&f, "a", Some(&request("k2", 1))).expect("applied");
    keyed_incr(&f, "a", None).expect("applied");
    assert_eq!(counter(&f, "a"), 3);
}

#[test]
fn a_keyed_create_retried_is_not_a_conflict() {
    let f = Fixture::new(None);
    let key = request("create-1", 7);
    let create = || {
        f.engine
            .keyed(Some(&key))
            .create_document(&f.path, doc("a", None), None)
            .result
    };
    let first = create().expect("created");
    let again = create().expect("the first answer, not DocumentExists");
    assert!(again.replayed);
    assert_eq!(again.value.etag, first.value.etag);
    // Without the key the create conflicts, as it should.
    let plain = f
        .engine
        .create_document(&f.path, doc("a", None), None)
        .result;
    assert!(
        matches!(plain, Err(Error::DocumentExists { .. })),
        "{plain:?}"
    );
}

#[test]
fn the_same_key_with_another_request_is_refused_and_changes_nothing() {
    let f = Fixture::new(None);
    counter_doc(&f);
    keyed_incr(&f, "a", Some(&request("k", 1))).expect("applied");
    let reused = keyed_incr(&f, "a", Some(&request("k", 2)));
    assert!(
        matches!(&reused, Err(Error::KeyReused { key, .. }) if key == "k"),
        "{reused:?}"
    );
    assert_eq!(counter(&f, "a"), 1);
    // The message names the key and says what to do.
    let message = reused.expect_err("refused").to_string();
    assert!(
        message.contains("'k'") && message.contains("new key"),
        "{message}"
    );
}

#[test]
fn keys_are_scoped_to_their_partition() {
    let f = Fixture::new(None);
    let key = request("k", 1);
    for partition in ["p", "q"] {
        let answer = f
            .engine
            .keyed(Some(&key))
            .create_document(&f.path, body(json!({"id": "a", "pk": partition})), None)
            .result
            .expect("created");
        assert!(!answer.replayed, "partition {partition}");
    }
}

#[test]
fn a_failed_request_is_not_remembered() {
    let f = Fixture::new(None);
    let key = request("k", 1);
    // The document is missing: the patch fails, changing nothing, so its key stays free.
    let missing = keyed_incr(&f, "a", Some(&key));
    assert!(
        matches!(missing, Err(Error::DocumentNotFound { .. })),
        "{missing:?}"
    );
    counter_doc(&f);
    let applied = keyed_incr(&f, "a", Some(&key)).expect("applied now");
    assert!(!applied.replayed);
    assert_eq!(counter(&f, "a"), 1);
}

#[test]
fn a_key_is_forgotten_after_the_window() {
    let f = Fixture::new(None);
    counter_doc(&f);
    let key = request("k", 1);
    keyed_incr(&f, "a", Some(&key)).expect("applied");
    f.clock.advance(DEFAULT_WINDOW_MS - 1);
    assert!(keyed_incr(&f, "a", Some(&key)).expect("replayed").replayed);
    f.clock.advance(1);
    assert!(
        !keyed_incr(&f, "a", Some(&key)).expect("applied").replayed,
        "past the window the key names a new request"
    );
    assert_eq!(counter(&f, "a"), 2);
}

/// A fixture (TTL off) with one shard and these idempotency bounds.
fn bounded(idempotency: IdempotencyConfig) -> Fixture {
    let mut config = EngineConfig::new(1);
    config.idempotency = idempotency;
    Fixture::with_config(None, Arc::new(MemoryStorage::new()), config)
}

#[test]
fn a_full_table_refuses_new_keys_until_the_oldest_is_forgotten() {
    let f = bounded(IdempotencyConfig {
        window: 10 * SEC,
        max_keys: 2,
        answer_bytes: 1 << 20,
    });
    let create = |name: &str, key: &RequestKey| {
        f.engine
            .keyed(Some(key))
            .create_document(&f.path, doc(name, None), None)
            .result
    };
    create("a", &request("k1", 1)).expect("remembered");
    f.clock.advance(SEC);
    create("b", &request("k2", 1)).expect("remembered");
    let full = create("c", &request("k3", 1));
    assert!(
        matches!(
            full,
            Err(Error::KeysFull {
                max: 2,
                retry_after_ms: 9000
            })
        ),
        "{full:?}"
    );
    assert!(!f.visible("c"), "nothing applied");
    // Unkeyed writes go on, and copies of remembered requests are still answered.
    create("a", &request("k1", 1)).expect("replayed");
    f.engine
        .create_document(&f.path, doc("d", None), None)
        .result
        .expect("unkeyed");
    f.clock.advance(9 * SEC);
    create("c", &request("k3", 1)).expect("k1 is past its window");
}

#[test]
fn forgotten_keys_leave_no_bookkeeping_behind() {
    let f = bounded(IdempotencyConfig {
        window: SEC,
        max_keys: 1000,
        answer_bytes: 1 << 20,
    });
    for round in 0..50 {
        let key = request(&format!("k{round}"), 1);
        f.engine
            .keyed(Some(&key))
            .create_document(&f.path, doc(&format!("d{round}"), None), None)
            .result
            .expect("created");
        f.clock.advance(SEC);
    }
    let queued = f.engine.inner.shards[0].lock().requests.queued_answers();
    assert!(
        queued <= 2,
        "answers of forgotten keys are dropped: {queued} queued"
    );
}

#[test]
fn an_answer_past_the_budget_is_not_kept_and_its_copy_is_told_it_applied() {
    let f = bounded(IdempotencyConfig {
        window: 10 * SEC,
        max_keys: 100,
        answer_bytes: 0,
    });
    counter_doc(&f);
    let key = request("k", 1);
    keyed_incr(&f, "a", Some(&key)).expect("applied");
    let again = keyed_incr(&f, "a", Some(&key));
    assert!(
        matches!(&again, Err(Error::RequestApplied { key, .. }) if key == "k"),
        "{again:?}"
    );
    assert_eq!(counter(&f, "a"), 1);
}

#[test]
fn concurrent_copies_of_one_request_apply_once() {
    let f = Arc::new(Fixture::new(None));
    counter_doc(&f);
    let key = Arc::new(request("k", 1));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (f, key) = (f.clone(), key.clone());
            std::thread::spawn(move || keyed_incr(&f, "a", Some(&key)).expect("answered"))
        })
        .collect();
    let answers: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("no panic"))
        .collect();
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 1);
    assert!(answers.iter().all(|a| a.value == answers[0].value));
    assert_eq!(counter(&f, "a"), 1);
}

#[test]
fn a_keyed_batch_and_delete_replay() {
    let f = Fixture::new(None);
    let batch_key = request("b", 1);
    let ops = [
        BatchOp::Create {
            body: doc("x", None),
        },
        BatchOp::Create {
            body: doc("y", None),
        },
    ];
    let batch = || {
        f.engine
            .keyed(Some(&batch_key))
            .execute_batch(&f.path, pk("p"), &ops)
            .result
    };
    let first = batch().expect("applied");
    let again = batch().expect("replayed, not a conflict");
    assert!(again.replayed && again.value == first.value);
    let delete_key = request("d", 1);
    let delete = || {
        f.engine
            .keyed(Some(&delete_key))
            .delete_document(&f.path, &key("p", "x"), None)
            .result
    };
    delete().expect("deleted");
    assert!(delete().expect("replayed, not NotFound").replayed);
}

#[tokio::test]
async fn remembered_keys_survive_a_restart_with_their_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let key = request("k", 1);
    {
        let (engine, path) = disk_engine(dir.path(), clock.clone());
        create_db_and_c(&engine, DefaultTtl::Off);
        let written = engine
            .keyed(Some(&key))
            .create_document(&path, doc("a", None), None);
        engine.settle(written).await.expect("durable");
    }
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    let again = engine
        .keyed(Some(&key))
        .create_document(&path, doc("a", None), None)
        .result;
    assert!(
        matches!(&again, Err(Error::RequestApplied { key, .. }) if key == "k"),
        "applied before the restart, its answer gone: {again:?}"
    );
    let reused = engine
        .keyed(Some(&request("k", 2)))
        .create_document(&path, doc("b", None), None)
        .result;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");
    // Past the window the key is forgotten, on disk too: a later restart does not bring it back.
    clock.advance(DEFAULT_WINDOW_MS);
    engine
        .keyed(Some(&request("other", 1)))
        .create_document(&path, doc("c", None), None)
        .result
        .expect("applied; forgets the expired key in its batch");
    engine.durable().await.expect("durable");
    drop(engine);
    let (engine, path) = disk_engine(dir.path(), clock.clone());
    let fresh = engine
        .keyed(Some(&request("k", 2)))
        .create_document(&path, doc("b", None), None)
        .result
        .expect("the key was forgotten");
    assert!(!fresh.replayed);
}
