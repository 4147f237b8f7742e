//! Transactional batches: in order, all or nothing, through the same rules as single writes.

use super::*;

fn incr(path: &str) -> PatchOp {
    PatchOp::Incr {
        path: path.into(),
        by: 1.into(),
    }
}

fn run(f: &Fixture, ops: &[BatchOp]) -> Result<Vec<BatchOutput>, Error> {
    f.engine.execute_batch(&f.path, pk("p"), ops).result
}

fn failed_at(result: Result<Vec<BatchOutput>, Error>) -> (usize, Error) {
    match result {
        Err(Error::BatchOperation { index, source, .. }) => (index, *source),
        other => panic!("expected a failed operation, got {other:?}"),
    }
}

/// Documents d0, d1 and d2 of partition "p", each "open".
fn three_open(f: &Fixture, path: &CollectionPath) {
    for i in 0..3 {
        f.engine
            .create_document(
                path,
                body(json!({"id": format!("d{i}"), "pk": "p", "status": "open"})),
                None,
            )
            .result
            .expect("created");
    }
}

/// d0 patched to "closed", d1 deleted: index changes both index tests check.
fn close_d0_delete_d1() -> Vec<BatchOp> {
    vec![
        BatchOp::Patch {
            id: id("d0"),
            ops: vec![PatchOp::Set {
                path: "/status".into(),
                value: json!("closed"),
            }],
            condition: None,
            if_match: None,
            options: Default::default(),
        },
        BatchOp::Delete {
            id: id("d1"),
            if_match: None,
        },
    ]
}

#[test]
fn a_batch_whose_57th_operation_fails_changes_nothing() {
    let f = Fixture::new(Some(-1));
    let kept = f.create("kept", None);
    let mut ops: Vec<BatchOp> = (0..56)
        .map(|i| BatchOp::Create {
            body: doc(&format!("new{i}"), None),
        })
        .collect();
    ops.push(BatchOp::Replace {
        id: id("missing"),
        body: doc("missing", None),
        if_match: None,
    });
    ops.extend((57..99).map(|_| BatchOp::Patch {
        id: id("kept"),
        ops: vec![incr("/n")],
        condition: None,
        if_match: None,
        options: Default::default(),
    }));
    ops.push(BatchOp::Delete {
        id: id("kept"),
        if_match: None,
    });
    assert_eq!(ops.len(), 100);
    let (index, source) = failed_at(run(&f, &ops));
    assert_eq!(index, 56);
    assert!(
        matches!(source, Error::DocumentNotFound { .. }),
        "{source:?}"
    );
    for i in 0..56 {
        assert!(!f.visible(&format!("new{i}")), "new{i} was not created");
    }
    assert_eq!(f.read("kept").expect("kept").etag, kept.etag);

    // Without the failing operation, all of it applies, in order.
    ops.remove(56);
    let outputs = run(&f, &ops).expect("committed");
    assert_eq!(outputs.len(), 99);
    assert!((0..56).all(|i| f.visible(&format!("new{i}"))));
    assert!(!f.visible("kept"), "deleted by the last operation");
    match &outputs[97] {
        BatchOutput::Document(view) => assert_eq!(view.body_map()["n"], json!(42)),
        other => panic!("{other:?}"),
    }
    assert_eq!(outputs[98], BatchOutput::Deleted);
}

#[test]
fn each_operation_sees_the_ones_before_it() {
    let f = Fixture::new(Some(-1));
    f.create("old", Some(100));
    let outputs = run(
        &f,
        &[
            BatchOp::Upsert {
                body: body(json!({"id": "a", "pk": "p", "n": 1})),
                if_match: None,
            },
            BatchOp::Patch {
                id: id("a"),
                ops: vec![incr("/n"), incr("/n")],
                condition: Some(Arc::new(
                    PatchCondition::parse("FROM c WHERE c.n = 1").expect("condition"),
                )),
                if_match: None,
                options: Default::default(),
            },
            BatchOp::Read { id: id("a") },
            BatchOp::Delete {
                id: id("old"),
                if_match: None,
            },
            BatchOp::Create {
                body: doc("old", None),
            },
            BatchOp::Upsert {
                body: doc("old", Some(7)),
                if_match: None,
            },
            BatchOp::Touch {
                id: id("old"),
                if_match: None,
            },
        ],
    )
    .expect("committed");
    let view = |i: usize| match &outputs[i] {
        BatchOutput::Document(v) | BatchOutput::Upserted(_, v) | BatchOutput::Created(v) => {
            v.clone()
        }
        BatchOutput::Deleted => panic!("a document at {i}"),
    };
    assert!(matches!(
        outputs[0],
        BatchOutput::Upserted(UpsertOutcome::Created, _)
    ));
    assert_eq!(view(2).body_map()["n"], json!(3));
    assert_eq!(view(1).etag, view(2).etag, "the read sees the patch");
    assert!(matches!(
        outputs[5],
        BatchOutput::Upserted(UpsertOutcome::Replaced, _)
    ));
    // Every write of the batch happens at one instant; the stored version is the last one.
    let stored = f.read("old").expect("old");
    assert_eq!(stored.etag, view(6).etag);
    assert_eq!(
        stored.ttl,
        Some(DocumentTtl::After(TtlSeconds::new(7).expect("7")))
    );
    assert_eq!(stored.last_write, view(0).last_write);
    assert_eq!(f.read("a").expect("a").body_map()["n"], json!(3));
    f.advance(7 * SEC);
    assert!(!f.visible("old"), "expires by the ttl the batch gave it");
}

#[test]
fn etags_conditions_and_bad_bodies_fail_the_batch() {
    let f = Fixture::new(Some(-1));
    let a = f.create("a", None);
    let stale = "00000000000000ff".to_owned();
    type Expected = fn(&Error) -> bool;
    let cases: Vec<(BatchOp, Expected)> = vec![
        (
            BatchOp::Touch {
                id: id("a"),
                if_match: Some(stale.clone()),
            },
            |e| matches!(e, Error::PreconditionFailed { .. }),
        ),
        (
            BatchOp::Upsert {
                body: doc("zzz", None),
                if_match: Some(stale.clone()),
            },
            |e| matches!(e, Error::PreconditionFailed { .. }),
        ),
        (
            BatchOp::Patch {
                id: id("a"),
                ops: vec![incr("/n")],
                condition: Some(Arc::new(
                    PatchCondition::parse("FROM c WHERE c.n > 5").expect("condition"),
                )),
                if_match: None,
                options: Default::default(),
            },
            |e| matches!(e, Error::ConditionNotMet { .. }),
        ),
        (
            BatchOp::Patch {
                id: id("a"),
                ops: vec![PatchOp::Set {
                    path: "/pk".into(),
                    value: json!("elsewhere"),
                }],
                condition: None,
                if_match: None,
                options: Default::default(),
            },
            |e| matches!(e, Error::Invalid(InvalidInput::PartitionKeyMismatch { .. })),
        ),
        (
            BatchOp::Create {
                body: doc("a", None),
            },
            |e| matches!(e, Error::DocumentExists { .. }),
        ),
        (
            BatchOp::Create {
                body: body(json!({"id": "q", "pk": "another"})),
            },
            |e| matches!(e, Error::Invalid(InvalidInput::PartitionKeyMismatch { .. })),
        ),
        (BatchOp::Read { id: id("nope") }, |e| {
            matches!(e, Error::DocumentNotFound { .. })
        }),
    ];
    for (op, expected) in cases {
        let described = format!("{op:?}");
        let ops = [
            BatchOp::Create {
                body: doc("fresh", None),
            },
            op,
        ];
        let (index, source) = failed_at(run(&f, &ops));
        assert_eq!(index, 1, "{described}");
        assert!(expected(&source), "{described}: {source:?}");
        assert!(!f.visible("fresh"), "{described}");
        assert_eq!(f.read("a").expect("a").etag, a.etag, "{described}");
    }
    let empty = run(&f, &[]);
    assert!(
        matches!(
            empty,
            Err(Error::Invalid(InvalidInput::BatchSize { count: 0, .. }))
        ),
        "{empty:?}"
    );
}

#[test]
fn an_expired_document_does_not_exist_for_a_batch() {
    let f = Fixture::new(Some(-1));
    f.create("short", Some(2));
    f.advance(2 * SEC);
    let (index, source) = failed_at(run(&f, &[BatchOp::Read { id: id("short") }]));
    assert_eq!(index, 0);
    assert!(matches!(source, Error::DocumentNotFound { .. }));
    // Created again over the expired one the purge has not reached.
    run(
        &f,
        &[BatchOp::Create {
            body: doc("short", None),
        }],
    )
    .expect("created");
    assert!(f.visible("short"));
}

#[test]
fn batches_keep_the_index_in_step() {
    let f = Fixture::new(Some(-1));
    three_open(&f, &f.path);
    let mut ops = close_d0_delete_d1();
    ops.push(BatchOp::Upsert {
        body: body(json!({"id": "d3", "pk": "p", "status": "closed"})),
        if_match: None,
    });
    ops.push(BatchOp::Touch {
        id: id("d2"),
        if_match: None,
    });
    run(&f, &ops).expect("committed");
    let (closed, metrics) = run_query(
        &f,
        "SELECT VALUE c.id FROM c WHERE c.status = 'closed' ORDER BY c.id",
    );
    assert_eq!(closed, [json!("d0"), json!("d3")]);
    assert!(metrics.index.is_some(), "{metrics:?}");
    assert_eq!(
        query(&f, "SELECT VALUE c.id FROM c WHERE c.status = 'open'"),
        [json!("d2")]
    );
}

#[test]
fn concurrent_batches_and_patches_all_count() {
    let f = Arc::new(Fixture::new(Some(-1)));
    f.create("counter", None);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    if t % 2 == 0 {
                        let ops = [
                            BatchOp::Patch {
                                id: id("counter"),
                                ops: vec![incr("/count")],
                                condition: None,
                                if_match: None,
                                options: Default::default(),
                            },
                            BatchOp::Upsert {
                                body: doc(&format!("t{t}-{i}"), None),
                                if_match: None,
                            },
                        ];
                        // Contention is a documented outcome: retried, as a client would.
                        loop {
                            match run(&f, &ops) {
                                Ok(_) => break,
                                Err(Error::Contended { .. }) => {}
                                Err(e) => panic!("batch: {e}"),
                            }
                        }
                    } else {
                        f.engine
                            .patch_document(
                                &f.path,
                                &key("p", "counter"),
                                &[incr("/count")],
                                None,
                                None,
                            )
                            .result
                            .expect("patch");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let counter = f.read("counter").expect("counter");
    assert_eq!(counter.body_map()["count"], json!(200));
}

#[test]
fn a_batch_returning_too_much_is_refused() {
    let f = Fixture::new(Some(-1));
    let big = "x".repeat(MAX_DOCUMENT_BYTES - 100);
    f.engine
        .create_document(
            &f.path,
            body(json!({"id": "big", "pk": "p", "s": big})),
            None,
        )
        .result
        .expect("created");
    let reads: Vec<BatchOp> = (0..5).map(|_| BatchOp::Read { id: id("big") }).collect();
    let (index, source) = failed_at(run(&f, &reads));
    assert_eq!(index, 4, "the operation past the limit is named");
    assert!(
        matches!(
            source,
            Error::Invalid(InvalidInput::BatchTooLarge {
                what: "returns",
                ..
            })
        ),
        "{source:?}"
    );
    assert_eq!(run(&f, &reads[..3]).expect("fits").len(), 3);
}

#[test]
fn lazy_batches_leave_their_entries_to_the_indexer() {
    let f = Fixture::new(None);
    let (_, path) = f.collection("lazy", IndexingMode::Lazy, IndexPaths::default());
    three_open(&f, &path);
    f.engine.index_now();
    let mut ops = close_d0_delete_d1();
    ops.push(BatchOp::Touch {
        id: id("d2"),
        if_match: None,
    });
    f.engine
        .execute_batch(&path, pk("p"), &ops)
        .result
        .expect("committed");
    let ids = |status: &str| {
        let text = format!("SELECT VALUE c.id FROM c WHERE c.status = '{status}'");
        query_on(&f.engine, &path, &text, false, 100)
            .expect("runs")
            .0
    };
    assert_eq!(
        ids("open"),
        [json!("d2")],
        "an owed or deleted document is not returned by its old entry"
    );
    f.engine.index_now();
    assert_eq!(ids("closed"), [json!("d0")]);
    assert_eq!(ids("open"), [json!("d2")]);
}
