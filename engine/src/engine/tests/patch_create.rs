//! A patch that creates (`PatchOptions::create_if_missing`): a document that is not live is
//! created from the initial body with the operations applied, as one write; a live one is
//! patched; a creation racing another write never loses either. And `create_parents`.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::engine::shard::after_each_read;
use crate::storage::{ChangeLog, DocumentWrite, IndexEntry, IndexRange, StoredTerms};

/// Memory storage that records each write batch: the ids it puts and deletes.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryStorage,
    batches: Arc<StdMutex<Vec<Vec<String>>>>,
}

#[derive(Debug)]
struct RecordingShard {
    inner: Arc<dyn ShardStore>,
    batches: Arc<StdMutex<Vec<Vec<String>>>>,
}

impl Storage for Recording {
    fn placement(&self) -> crate::engine::Placement {
        self.inner.placement()
    }

    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        Arc::new(RecordingShard {
            inner: self.inner.shard(index),
            batches: self.batches.clone(),
        })
    }
    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.inner.write_catalog(change)
    }
    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        self.inner.load_catalog()
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn last_applied(&self) -> Lsn {
        self.inner.last_applied()
    }
    fn failure(&self) -> Option<StorageError> {
        None
    }
}

impl ShardStore for RecordingShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        let writes = batch
            .writes
            .iter()
            .map(|w| match w {
                DocumentWrite::Put { doc, .. } => format!("put {}", doc.key.id),
                DocumentWrite::Index { key, .. } => format!("index {}", key.id),
                DocumentWrite::Delete { key, .. } => format!("delete {}", key.id),
                DocumentWrite::Remember { key, .. } => format!("remember {}", key.id),
                DocumentWrite::Forget { key, .. } => format!("forget {}", key.id),
                DocumentWrite::Append { seq, .. } => format!("append {seq}"),
                DocumentWrite::ExpiryLogged { key, .. } => format!("expiry logged {}", key.id),
            })
            .collect();
        self.batches.lock().expect("not poisoned").push(writes);
        self.inner.write(batch)
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        self.inner.load(each)
    }
    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        self.inner.load_terms(each)
    }
    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        self.inner.get_terms(collection, key)
    }
    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        self.inner.scan_index(collection, range, limit)
    }
    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        self.inner.get(collection, key)
    }
    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        self.inner.scan(collection, range, limit)
    }
    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        self.inner.drop_collection(collection)
    }
    fn change_log(&self) -> &dyn ChangeLog {
        self.inner.change_log()
    }
}

/// A fixture (collection default TTL `default`) whose storage writes are recorded.
fn recorded(default: Option<i64>) -> (Fixture, Arc<StdMutex<Vec<Vec<String>>>>) {
    let storage = Recording::default();
    let batches = storage.batches.clone();
    (Fixture::with_storage(default, Arc::new(storage)), batches)
}

/// The write batches recorded since the last call.
fn taken(batches: &StdMutex<Vec<Vec<String>>>) -> Vec<Vec<String>> {
    std::mem::take(&mut *batches.lock().expect("not poisoned"))
}

fn incr(path: &str, by: i64) -> PatchOp {
    PatchOp::Incr {
        path: path.into(),
        by: by.into(),
    }
}

fn set(path: &str, value: Value) -> PatchOp {
    PatchOp::Set {
        path: path.into(),
        value,
    }
}

/// Options creating from `initial` if the document is missing.
fn creating(initial: Value) -> PatchOptions {
    PatchOptions {
        create_if_missing: Some(body(initial)),
        create_parents: false,
    }
}

/// Patches document `id` of partition "p" with `options`.
fn patch_with(
    f: &Fixture,
    id: &str,
    ops: &[PatchOp],
    condition: Option<&PatchCondition>,
    options: &PatchOptions,
) -> Result<(DocumentView, bool), Error> {
    f.engine
        .patch_document_with(&f.path, &key("p", id), (ops, condition), None, options)
        .result
}

fn cart() -> Value {
    json!({"id": "cart", "pk": "p", "items": {}, "status": "open"})
}

#[test]
fn an_absent_document_is_created_from_the_initial_body_with_the_operations_applied_in_one_write() {
    let (f, batches) = recorded(Some(-1));
    taken(&batches);
    let ops = [incr("/items/sku1", 2), set("/touched", json!(true))];
    let (view, created) = patch_with(&f, "cart", &ops, None, &creating(cart())).expect("created");
    assert!(created, "no document was there");
    assert_eq!(
        Value::Object(view.body_map()),
        json!({"id": "cart", "pk": "p", "items": {"sku1": 2}, "status": "open", "touched": true})
    );
    // One write: one batch, one document put (never a create, then a patch), with its change
    // log record.
    assert_eq!(taken(&batches), [["put cart", "append 1"]]);
    let read = f.read("cart").expect("stored");
    assert_eq!(read.etag, view.etag, "one version");
    assert_eq!(read.body_map(), view.body_map());
    assert_eq!(read.last_write, T0);

    // Now live: patched, the initial body ignored.
    f.advance(SEC);
    let (again, created) =
        patch_with(&f, "cart", &ops[..1], None, &creating(cart())).expect("patched");
    assert!(!created, "it was live");
    assert_eq!(again.body_map()["items"], json!({"sku1": 4}));
    assert_eq!(again.body_map()["touched"], json!(true));
    assert_ne!(again.etag, view.etag);
    assert_eq!(again.last_write, T0 + SEC, "a write restarts the clock");
    assert_eq!(taken(&batches), [["put cart", "append 2"]]);
}

#[test]
fn the_initial_body_follows_the_create_rules_for_ttl() {
    let f = Fixture::new(Some(-1));
    let initial = json!({"id": "s", "pk": "p", "ttl": 30});
    let (view, created) =
        patch_with(&f, "s", &[incr("/n", 1)], None, &creating(initial)).expect("created");
    assert!(created);
    assert!(
        matches!(view.ttl, Some(DocumentTtl::After(_))),
        "{:?}",
        view.ttl
    );
    assert_eq!(view.expires_at, Some(T0 + 30 * SEC));
    f.advance(30 * SEC - 1);
    assert!(f.visible("s"));
    f.advance(1);
    assert!(!f.visible("s"), "expires by the initial body's own ttl");
    // The operations may set it, validated as in any body.
    let (view, _) = patch_with(
        &f,
        "s",
        &[set("/ttl", json!(-1))],
        None,
        &creating(json!({"id": "s", "pk": "p", "ttl": 5})),
    )
    .expect("created");
    assert_eq!(view.expires_at, None, "the patched ttl: never");
    let refused = patch_with(
        &f,
        "t",
        &[set("/ttl", json!(0))],
        None,
        &creating(json!({"id": "t", "pk": "p"})),
    )
    .expect_err("ttl 0");
    assert!(
        matches!(refused, Error::Invalid(InvalidInput::DocumentTtl { .. })),
        "{refused}"
    );
    assert!(!f.visible("t"));
}

#[test]
fn a_live_document_is_patched_and_its_condition_checked_a_created_one_skips_it() {
    let f = Fixture::new(Some(-1));
    f.engine
        .create_document(
            &f.path,
            body(json!({"id": "c", "pk": "p", "n": 5, "keep": "x"})),
            None,
        )
        .result
        .expect("created");
    let options = creating(json!({"id": "c", "pk": "p", "n": 100}));
    let (view, created) = patch_with(&f, "c", &[incr("/n", 1)], None, &options).expect("patched");
    assert!(!created);
    assert_eq!(
        Value::Object(view.body_map()),
        json!({"id": "c", "pk": "p", "n": 6, "keep": "x"})
    );
    // The condition is the live document's.
    let high = PatchCondition::parse("FROM c WHERE c.n > 10").expect("condition");
    let refused = patch_with(&f, "c", &[incr("/n", 1)], Some(&high), &options).expect_err("6");
    assert!(
        matches!(refused, Error::ConditionNotMet { .. }),
        "{refused}"
    );
    assert_eq!(f.read("c").expect("c").body_map()["n"], json!(6));
    // A created document is the caller's own body: the condition is not checked.
    let initial = creating(json!({"id": "d", "pk": "p", "n": 0}));
    let (view, created) =
        patch_with(&f, "d", &[incr("/n", 1)], Some(&high), &initial).expect("created");
    assert!(created);
    assert_eq!(view.body_map()["n"], json!(1));
}

#[test]
fn an_expired_or_deleted_document_is_created_again_from_the_initial_body() {
    let (f, batches) = recorded(Some(10));
    f.engine
        .create_document(&f.path, body(json!({"id": "s", "pk": "p", "n": 50})), None)
        .result
        .expect("created");
    let options = creating(json!({"id": "s", "pk": "p", "n": 0}));
    f.advance(10 * SEC);
    assert!(!f.visible("s"), "expired");
    // Without an initial body, an expired document is not found, as for any patch.
    let missing = f
        .engine
        .patch_document(&f.path, &key("p", "s"), &[incr("/n", 1)], None, None)
        .result;
    assert!(
        matches!(missing, Err(Error::DocumentNotFound { .. })),
        "{missing:?}"
    );
    taken(&batches);
    let (view, created) = patch_with(&f, "s", &[incr("/n", 1)], None, &options).expect("created");
    assert!(created, "an expired document is not live");
    assert_eq!(
        view.body_map()["n"],
        json!(1),
        "from the initial body, not the expired one"
    );
    assert_eq!(view.expires_at, Some(T0 + 20 * SEC), "a new TTL clock");
    assert_eq!(
        taken(&batches),
        [["put s", "append 2", "append 3"]],
        "one write over the expired version: its expiry logged first, then the create"
    );
    // Its index entries are the new body's only.
    assert_eq!(
        query(&f, "SELECT VALUE c.n FROM c WHERE c.n >= 0"),
        [json!(1)]
    );
    assert!(query(&f, "SELECT VALUE c.id FROM c WHERE c.n = 50").is_empty());

    // Deleted: created again too.
    f.engine
        .delete_document(&f.path, &key("p", "s"), None)
        .result
        .expect("deleted");
    let (view, created) = patch_with(&f, "s", &[incr("/n", 5)], None, &options).expect("created");
    assert!(created);
    assert_eq!(view.body_map()["n"], json!(5));
}

#[test]
fn an_initial_body_of_another_document_or_with_an_etag_is_refused_and_nothing_written() {
    let (f, batches) = recorded(Some(-1));
    taken(&batches);
    let ops = [incr("/n", 1)];
    let refused = |id: &str, initial: Value, if_match: Option<&str>| {
        let options = creating(initial);
        let result = f
            .engine
            .patch_document_with(&f.path, &key("p", id), (&ops, None), if_match, &options)
            .result;
        match result {
            Err(Error::Invalid(invalid)) => invalid,
            other => panic!("refused expected, got {other:?}"),
        }
    };
    let wrong_id = refused("a", json!({"id": "b", "pk": "p"}), None);
    assert_eq!(
        wrong_id,
        InvalidInput::CreateIfMissing(Box::new(InvalidInput::IdMismatch {
            request: "a".into(),
            body: "b".into(),
        }))
    );
    assert!(
        wrong_id
            .to_string()
            .starts_with("create_if_missing: the request's id 'a'")
    );
    let wrong_pk = refused("a", json!({"id": "a", "pk": "q"}), None);
    assert!(
        matches!(&wrong_pk, InvalidInput::CreateIfMissing(inner)
            if matches!(**inner, InvalidInput::PartitionKeyMismatch { .. })),
        "{wrong_pk}"
    );
    let no_pk = refused("a", json!({"id": "a"}), None);
    assert!(
        matches!(&no_pk, InvalidInput::CreateIfMissing(inner)
            if matches!(**inner, InvalidInput::PartitionKeyMismatch { .. })),
        "{no_pk}"
    );
    let with_etag = refused("a", json!({"id": "a", "pk": "p"}), Some("0000000000000001"));
    assert_eq!(with_etag, InvalidInput::IfMatchWithCreate);
    // Operations that cannot apply to the initial body, or move it to another partition.
    let bad_op = f
        .engine
        .patch_document_with(
            &f.path,
            &key("p", "a"),
            (
                &[PatchOp::Remove {
                    path: "/nope".into(),
                }],
                None,
            ),
            None,
            &creating(json!({"id": "a", "pk": "p"})),
        )
        .result;
    assert!(
        matches!(
            bad_op,
            Err(Error::Invalid(InvalidInput::Patch { index: 0, .. }))
        ),
        "{bad_op:?}"
    );
    let moved = patch_with(
        &f,
        "a",
        &[set("/pk", json!("q"))],
        None,
        &creating(json!({"id": "a", "pk": "p"})),
    );
    assert!(matches!(moved, Err(Error::Invalid(_))), "{moved:?}");
    assert!(!f.visible("a"));
    assert!(taken(&batches).is_empty(), "nothing written");
}

#[test]
fn create_parents_makes_the_objects_an_operation_path_needs() {
    let f = Fixture::new(Some(-1));
    let ops = [incr("/items/sku1/qty", 1)];
    let bare = json!({"id": "cart", "pk": "p"});
    // Without the flag, a missing parent is an error, as before.
    let refused =
        patch_with(&f, "cart", &ops, None, &creating(bare.clone())).expect_err("no /items");
    assert!(
        refused.to_string().contains("/items does not exist"),
        "{refused}"
    );
    let options = PatchOptions {
        create_if_missing: Some(body(bare)),
        create_parents: true,
    };
    let (view, created) = patch_with(&f, "cart", &ops, None, &options).expect("created");
    assert!(created);
    assert_eq!(view.body_map()["items"], json!({"sku1": {"qty": 1}}));
    // On a live document too, and without an initial body.
    let parents = PatchOptions {
        create_if_missing: None,
        create_parents: true,
    };
    let ops = [incr("/items/sku1/qty", 1), incr("/items/sku2/qty", 3)];
    let (view, created) = patch_with(&f, "cart", &ops, None, &parents).expect("patched");
    assert!(!created);
    assert_eq!(
        view.body_map()["items"],
        json!({"sku1": {"qty": 2}, "sku2": {"qty": 3}})
    );
    // Without an initial body a missing document is still not found.
    let missing = patch_with(&f, "other", &ops, None, &parents);
    assert!(
        matches!(missing, Err(Error::DocumentNotFound { .. })),
        "{missing:?}"
    );
}

/// The read of a creating patch went stale: another write landed at its key before its
/// commit. The patch looks again and acts on what is there now, never losing a write.
#[test]
fn a_creation_racing_another_write_loses_neither() {
    let f = Fixture::new(Some(-1));
    let options = creating(json!({"id": "r", "pk": "p", "count": 0}));
    let ops = [incr("/count", 1)];

    // Created by another writer after the patch read its absence: the patch applies to that
    // document instead of creating over it.
    let (engine, path) = (f.engine.clone(), f.path.clone());
    let hook = after_each_read(move || {
        let _ = engine
            .create_document(
                &path,
                body(json!({"id": "r", "pk": "p", "count": 10})),
                None,
            )
            .result;
    });
    let (view, created) = patch_with(&f, "r", &ops, None, &options).expect("patched");
    drop(hook);
    assert!(!created, "the other writer created it");
    assert_eq!(view.body_map()["count"], json!(11), "both writes count");
    assert_eq!(f.read("r").expect("r").etag, view.etag);

    // Deleted by another writer after the patch read it: created from the initial body.
    let (engine, path) = (f.engine.clone(), f.path.clone());
    let hook = after_each_read(move || {
        let _ = engine.delete_document(&path, &key("p", "r"), None).result;
    });
    let (view, created) = patch_with(&f, "r", &ops, None, &options).expect("created");
    drop(hook);
    assert!(created, "it was deleted before the commit");
    assert_eq!(view.body_map()["count"], json!(1));

    // Expired (no write at all) after the patch read it: created, not patched.
    f.engine
        .upsert_document(
            &f.path,
            body(json!({"id": "e", "pk": "p", "count": 7, "ttl": 5})),
            None,
            None,
        )
        .result
        .expect("upserted");
    let clock = f.clock.clone();
    let hook = after_each_read(move || clock.advance(5 * SEC));
    let options = creating(json!({"id": "e", "pk": "p", "count": 0}));
    let (view, created) = patch_with(&f, "e", &ops, None, &options).expect("created");
    drop(hook);
    assert!(created, "expired between the read and the commit");
    assert_eq!(view.body_map()["count"], json!(1));
}

#[test]
fn concurrent_creating_increments_all_count_and_one_creates() {
    let f = Arc::new(Fixture::new(Some(-1)));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                let options = creating(json!({"id": "n", "pk": "p"}));
                (0..10)
                    .filter(|_| {
                        let (_, created) =
                            patch_with(&f, "n", &[incr("/count", 1)], None, &options)
                                .expect("never a conflict");
                        created
                    })
                    .count()
            })
        })
        .collect();
    let created: usize = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    assert_eq!(created, 1, "one call created it, the others patched it");
    assert_eq!(f.read("n").expect("n").body_map()["count"], json!(160));
}

#[test]
fn a_batch_patch_may_create() {
    let f = Fixture::new(Some(-1));
    let patch = |ops: Vec<PatchOp>, create_if_missing: Option<Value>| BatchOp::Patch {
        id: id("cart"),
        ops,
        condition: None,
        if_match: None,
        options: PatchOptions {
            create_if_missing: create_if_missing.map(body),
            create_parents: true,
        },
    };
    let run = |ops: &[BatchOp]| f.engine.execute_batch(&f.path, pk("p"), ops).result;
    let outputs = run(&[
        patch(vec![incr("/items/a/qty", 1)], Some(cart())),
        patch(vec![incr("/items/a/qty", 1)], Some(cart())),
        BatchOp::Read { id: id("cart") },
    ])
    .expect("committed");
    let BatchOutput::Created(first) = &outputs[0] else {
        panic!("created: {outputs:?}")
    };
    assert_eq!(first.body_map()["items"], json!({"a": {"qty": 1}}));
    let BatchOutput::Document(second) = &outputs[1] else {
        panic!("patched: {outputs:?}")
    };
    assert_eq!(second.body_map()["items"], json!({"a": {"qty": 2}}));
    assert_eq!(f.read("cart").expect("cart").etag, second.etag);

    // Deleted earlier in the same batch: created again.
    let outputs = run(&[
        BatchOp::Delete {
            id: id("cart"),
            if_match: None,
        },
        patch(vec![incr("/items/b/qty", 1)], Some(cart())),
    ])
    .expect("committed");
    assert!(matches!(outputs[1], BatchOutput::Created(_)), "{outputs:?}");
    assert_eq!(
        f.read("cart").expect("cart").body_map()["items"],
        json!({"b": {"qty": 1}})
    );

    // Refused as a single patch is, naming the operation; nothing applied.
    let before = f.read("cart").expect("cart");
    let other_id = run(&[
        patch(vec![incr("/n", 1)], None),
        patch(vec![incr("/n", 1)], Some(json!({"id": "x", "pk": "p"}))),
    ]);
    let Err(Error::BatchOperation {
        index: 1, source, ..
    }) = other_id
    else {
        panic!("{other_id:?}")
    };
    assert!(
        matches!(*source, Error::Invalid(InvalidInput::CreateIfMissing(_))),
        "{source}"
    );
    let mut with_etag = patch(vec![incr("/n", 1)], Some(cart()));
    if let BatchOp::Patch { if_match, .. } = &mut with_etag {
        *if_match = Some(before.etag.to_string());
    }
    let refused = run(&[with_etag]);
    let Err(Error::BatchOperation {
        index: 0, source, ..
    }) = refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(*source, Error::Invalid(InvalidInput::IfMatchWithCreate));
    assert_eq!(f.read("cart").expect("cart").etag, before.etag);
}
