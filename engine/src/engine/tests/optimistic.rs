//! The optimistic commit's retry rule: a write of one document rewritten during each of its
//! optimistic reads still lands (its last attempt reads under the lock); a batch is contended.

use std::{cell::Cell, rc::Rc};

use super::*;
use crate::engine::shard::{HookGuard, OPTIMISTIC_ATTEMPTS, after_each_read};

/// A fixture with document `d` (indexed, so writes read its terms) and, after each
/// optimistic read the test thread makes, `rewrite` run on its engine (until the guard is
/// dropped), with how many times it ran so far.
fn contended(
    rewrite: impl Fn(&Engine, &CollectionPath) + 'static,
) -> (Fixture, Rc<Cell<usize>>, HookGuard) {
    let f = Fixture::new(Some(-1));
    f.engine
        .create_document(&f.path, body(json!({"id": "d", "pk": "p", "n": 0})), None)
        .result
        .expect("created");
    let runs = Rc::new(Cell::new(0));
    let (engine, path, counted) = (f.engine.clone(), f.path.clone(), runs.clone());
    let hook = after_each_read(move || {
        counted.set(counted.get() + 1);
        rewrite(&engine, &path);
    });
    (f, runs, hook)
}

/// Another write to `d`: a touch (new version, same body).
fn touch_d(engine: &Engine, path: &CollectionPath) {
    engine
        .touch_document(path, &key("p", "d"), None)
        .result
        .expect("touched");
}

fn incr_n(engine: &Engine, path: &CollectionPath, if_match: Option<&str>) -> Outcome<DocumentView> {
    let ops = [PatchOp::Incr {
        path: "/n".into(),
        by: 1.into(),
    }];
    engine.patch_document(path, &key("p", "d"), &ops, None, if_match)
}

fn n_of(f: &Fixture) -> Value {
    f.read("d").expect("read").body_map()["n"].clone()
}

#[test]
fn a_put_rewritten_during_every_optimistic_read_still_lands() {
    let (f, runs, _hook) = contended(touch_d);
    let (outcome, view) = f
        .engine
        .upsert_document(
            &f.path,
            body(json!({"id": "d", "pk": "p", "n": 7})),
            None,
            None,
        )
        .result
        .expect("upserted");
    assert_eq!(outcome, UpsertOutcome::Replaced);
    assert_eq!(
        runs.get(),
        OPTIMISTIC_ATTEMPTS,
        "every optimistic read went stale"
    );
    assert_eq!(n_of(&f), json!(7));
    assert_eq!(f.read("d").expect("read").etag, view.etag);
    // Its entries are the new body's: the old terms read under the lock were current.
    assert_eq!(
        query(&f, "SELECT VALUE c.id FROM c WHERE c.n = 7"),
        [json!("d")]
    );
    assert!(query(&f, "SELECT VALUE c.id FROM c WHERE c.n = 0").is_empty());
}

#[test]
fn a_touch_rewritten_during_every_optimistic_read_writes_the_newest_body() {
    let (f, runs, _hook) = contended(|engine, path| {
        incr_n(engine, path, None).result.expect("patched");
    });
    let view = f
        .engine
        .touch_document(&f.path, &key("p", "d"), None)
        .result
        .expect("touched");
    assert_eq!(runs.get(), OPTIMISTIC_ATTEMPTS);
    let n = json!(OPTIMISTIC_ATTEMPTS);
    assert_eq!(
        view.body_map()["n"],
        n,
        "the body of the version it replaced"
    );
    assert_eq!(n_of(&f), n);
}

#[test]
fn a_delete_rewritten_during_every_optimistic_read_still_deletes() {
    let (f, runs, _hook) = contended(touch_d);
    f.engine
        .delete_document(&f.path, &key("p", "d"), None)
        .result
        .expect("deleted");
    assert_eq!(runs.get(), OPTIMISTIC_ATTEMPTS);
    assert!(!f.visible("d"));
    assert!(query(&f, "SELECT VALUE c.id FROM c WHERE c.n = 0").is_empty());
}

/// Concurrent patches all count, however hot the document: the last attempt patches under
/// the lock the version there.
#[test]
fn a_patch_rewritten_during_every_optimistic_read_still_counts() {
    let (f, runs, _hook) = contended(|engine, path| {
        incr_n(engine, path, None).result.expect("patched");
    });
    let view = incr_n(&f.engine, &f.path, None).result.expect("patched");
    assert_eq!(runs.get(), OPTIMISTIC_ATTEMPTS);
    let n = json!(OPTIMISTIC_ATTEMPTS + 1);
    assert_eq!(view.body_map()["n"], n, "every increment counted");
    assert_eq!(n_of(&f), n);
    let text = format!("SELECT VALUE c.id FROM c WHERE c.n = {n}");
    assert_eq!(query(&f, &text), [json!("d")], "indexed as written");
}

/// With `if_match`, a patch is of that version only: rewritten after its read, it fails
/// rather than patching the newer one.
#[test]
fn a_patch_with_if_match_is_not_applied_again() {
    let (f, runs, _hook) = contended(touch_d);
    let etag = f.read("d").expect("read").etag.to_string();
    let err = incr_n(&f.engine, &f.path, Some(&etag))
        .result
        .expect_err("refused");
    assert!(matches!(err, Error::PreconditionFailed { .. }), "{err:?}");
    assert_eq!(runs.get(), 1);
    assert_eq!(n_of(&f), json!(0));
}

/// A batch's work is too large to hold the lock through: rewritten during each evaluation,
/// it is contended, and nothing of it applied.
#[test]
fn a_batch_rewritten_during_every_evaluation_is_contended() {
    let (f, runs, _hook) = contended(touch_d);
    let ops = [
        BatchOp::Patch {
            id: id("d"),
            ops: vec![PatchOp::Incr {
                path: "/n".into(),
                by: 1.into(),
            }],
            condition: None,
            if_match: None,
            options: Default::default(),
        },
        BatchOp::Create {
            body: doc("e", None),
        },
    ];
    let err = f.engine.execute_batch(&f.path, pk("p"), &ops).result;
    assert!(
        matches!(err, Err(Error::Contended { attempts }) if attempts == OPTIMISTIC_ATTEMPTS),
        "{err:?}"
    );
    assert_eq!(runs.get(), OPTIMISTIC_ATTEMPTS);
    assert_eq!(n_of(&f), json!(0));
    assert!(!f.visible("e"));
}

/// Without contention a write reads once, or not at all where it needs nothing read.
#[test]
fn an_uncontended_write_reads_at_most_once() {
    let (f, runs, _hook) = contended(|_, _| {});
    let reads = |write: &dyn Fn()| {
        let before = runs.get();
        write();
        runs.get() - before
    };
    let create = || {
        f.create("e", None);
    };
    assert_eq!(reads(&create), 0, "nothing stored before it");
    let upsert = || {
        let body = body(json!({"id": "d", "pk": "p", "n": 1}));
        let written = f.engine.upsert_document(&f.path, body, None, None);
        written.result.expect("upserted");
    };
    assert_eq!(reads(&upsert), 1, "the old version's terms");
    let patch = || {
        incr_n(&f.engine, &f.path, None).result.expect("patched");
    };
    assert_eq!(reads(&patch), 1);
    let batch = || {
        let ops = [BatchOp::Touch {
            id: id("d"),
            if_match: None,
        }];
        let done = f.engine.execute_batch(&f.path, pk("p"), &ops);
        done.result.expect("committed");
    };
    assert_eq!(reads(&batch), 1);
    assert_eq!(n_of(&f), json!(2));
}
