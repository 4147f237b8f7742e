//! Must-live rules: in a collection mixing lifetimes, a document of a kind that must never
//! expire is refused by every write that would store it without `"ttl": -1`, and the refusal
//! changes nothing.

use super::*;
use crate::engine::{idempotency::RequestKey, shard::after_each_read};

/// Collection "shop" in the fixture's database: default TTL one hour, documents with
/// `/type` "order" or "invoice" must live.
fn shop(f: &Fixture) -> CollectionPath {
    let settings =
        CollectionSettings::new(default_ttl(Some(3600)), IndexingMode::Consistent).expect("valid");
    let rules = types(&[json!("order"), json!("invoice")]);
    let info = f
        .engine
        .create_collection_with(
            &f.path.database,
            id("shop"),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
            rules,
        )
        .expect("collection");
    CollectionPath {
        database: f.path.database.clone(),
        collection: info.id.clone(),
    }
}

/// Rules keeping documents whose `/type` is one of `values`.
fn types(values: &[Value]) -> Arc<MustLive> {
    Arc::new(
        MustLive::new(vec![MustLiveRule::new("/type", values).expect("valid")]).expect("valid"),
    )
}

/// Replaces the settings of `path`: default TTL `default`, and `must_live` (`None` keeps them).
fn set_rules(
    engine: &Engine,
    path: &CollectionPath,
    default: DefaultTtl,
    must_live: Option<Arc<MustLive>>,
) -> Arc<CollectionInfo> {
    let change = SettingsChange {
        default_ttl: default,
        indexing_mode: None,
        index_paths: None,
        must_live,
        change_feed_retention: None,
    };
    engine.replace_collection(path, change).expect("replaced")
}

/// A cart, "c1" in partition "p", which may expire.
fn cart(f: &Fixture, shop: &CollectionPath) -> DocumentView {
    let cart = body(json!({"id": "c1", "pk": "p", "type": "cart"}));
    f.engine
        .create_document(shop, cart, None)
        .result
        .expect("a cart may expire")
}

fn must_live_refusal(err: &Error) -> bool {
    match err {
        Error::Invalid(InvalidInput::MustLive { .. }) => true,
        Error::BatchOperation { source, .. } => must_live_refusal(source),
        _ => false,
    }
}

fn refused<T: std::fmt::Debug>(outcome: Outcome<T>) -> Error {
    let err = outcome.result.expect_err("refused");
    assert!(must_live_refusal(&err), "{err:?}");
    err
}

fn read(f: &Fixture, shop: &CollectionPath, doc: &str) -> Option<DocumentView> {
    match f.engine.read_document(shop, &key("p", doc)).result {
        Ok(view) => Some(view),
        Err(Error::DocumentNotFound { .. }) => None,
        Err(e) => panic!("unexpected {e}"),
    }
}

#[test]
fn creates_upserts_and_replaces_of_an_order_must_say_ttl_minus_one() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    let order = json!({"id": "o1", "pk": "p", "type": "order"});
    let err = refused(f.engine.create_document(&shop, body(order.clone()), None));
    assert_eq!(
        err.to_string(),
        "collection 'shop' keeps documents whose /type is \"order\" forever (a must-live rule), and this one has no \"ttl\": -1, so it would inherit the collection's default TTL; give it \"ttl\": -1 (DocumentTtl::Never in the Rust client), or change the rule with ReplaceCollection"
    );
    let with_ttl = json!({"id": "o1", "pk": "p", "type": "invoice", "ttl": 60});
    refused(
        f.engine
            .create_document(&shop, body(with_ttl.clone()), None),
    );
    refused(
        f.engine
            .upsert_document(&shop, body(order.clone()), None, None),
    );
    assert!(read(&f, &shop, "o1").is_none(), "nothing was written");

    let mut kept = order.clone();
    kept["ttl"] = json!(-1);
    f.engine
        .create_document(&shop, body(kept.clone()), None)
        .result
        .expect("says it lives");
    // Replacing it with a body that forgets the ttl is refused; the stored one stays.
    refused(
        f.engine
            .replace_document(&shop, key("p", "o1"), body(order.clone()), None),
    );
    refused(f.engine.upsert_document(&shop, body(with_ttl), None, None));
    let stored = read(&f, &shop, "o1").expect("kept");
    assert_eq!(stored.body_map()["ttl"], json!(-1));

    // Other kinds follow the collection's default and expire.
    cart(&f, &shop);
    f.advance(3600 * SEC);
    assert!(read(&f, &shop, "c1").is_none(), "the cart expired");
    assert!(read(&f, &shop, "o1").is_some(), "the order lives");
}

#[test]
fn a_patch_is_judged_by_the_document_it_leaves() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    let cart = cart(&f, &shop);
    let order = json!({"id": "o1", "pk": "p", "type": "order", "ttl": -1});
    let order = f
        .engine
        .create_document(&shop, body(order), None)
        .result
        .expect("says it lives");
    let patch = |doc: &str, ops: &[PatchOp], options: &PatchOptions| {
        f.engine
            .patch_document_with(&shop, &key("p", doc), (ops, None), None, options)
    };
    let set = |path: &str, value: Value| PatchOp::Set {
        path: path.into(),
        value,
    };
    let plain = PatchOptions::default();
    // A cart turned into an order without a ttl, an order given one: both refused.
    refused(patch("c1", &[set("/type", json!("order"))], &plain));
    refused(patch("o1", &[set("/ttl", json!(30))], &plain));
    refused(patch(
        "o1",
        &[PatchOp::Remove {
            path: "/ttl".into(),
        }],
        &plain,
    ));
    assert_eq!(
        read(&f, &shop, "c1").expect("live").etag,
        cart.etag,
        "unchanged"
    );
    assert_eq!(
        read(&f, &shop, "o1").expect("live").etag,
        order.etag,
        "unchanged"
    );
    // Turned into an order that says it lives: accepted.
    patch(
        "c1",
        &[set("/type", json!("order")), set("/ttl", json!(-1))],
        &plain,
    )
    .result
    .expect("says it lives");

    // A patch that creates: what it stores is judged, not the initial body alone.
    let creating = |initial: Value| PatchOptions {
        create_if_missing: Some(body(initial)),
        create_parents: false,
    };
    let initial = json!({"id": "o2", "pk": "p", "type": "order"});
    refused(patch(
        "o2",
        &[set("/n", json!(1))],
        &creating(initial.clone()),
    ));
    assert!(read(&f, &shop, "o2").is_none());
    let (view, created) = patch("o2", &[set("/ttl", json!(-1))], &creating(initial))
        .result
        .expect("the operations make it live");
    assert!(created);
    assert_eq!(view.ttl, Some(DocumentTtl::Never));
}

#[test]
fn a_batch_with_one_refused_write_changes_nothing() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    cart(&f, &shop);
    let cart_item = || BatchOp::Upsert {
        body: body(json!({"id": "i1", "pk": "p", "type": "item"})),
        if_match: None,
    };
    for bad in [
        BatchOp::Create {
            body: body(json!({"id": "o1", "pk": "p", "type": "order"})),
        },
        // Checkout turning the cart into an order, forgetting the ttl.
        BatchOp::Patch {
            id: id("c1"),
            ops: vec![PatchOp::Set {
                path: "/type".into(),
                value: json!("order"),
            }],
            condition: None,
            if_match: None,
            options: Default::default(),
        },
    ] {
        let err = refused(f.engine.execute_batch(&shop, pk("p"), &[cart_item(), bad]));
        assert!(
            matches!(err, Error::BatchOperation { index: 1, .. }),
            "{err:?}"
        );
        assert!(read(&f, &shop, "i1").is_none(), "the batch changed nothing");
    }
    assert_eq!(
        read(&f, &shop, "c1").expect("live").body_map()["type"],
        json!("cart")
    );
}

#[test]
fn replacing_settings_keeps_changes_or_removes_the_rules() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    let order = || body(json!({"id": "o1", "pk": "p", "type": "order"}));
    let minute = default_ttl(Some(60));
    // Absent: kept.
    let info = set_rules(&f.engine, &shop, minute, None);
    assert_eq!(info.must_live.rules().len(), 1);
    refused(f.engine.create_document(&shop, order(), None));
    // Another rule: the old one no longer applies.
    set_rules(&f.engine, &shop, minute, Some(types(&[json!("invoice")])));
    f.engine
        .create_document(&shop, order(), None)
        .result
        .expect("orders may expire now");
    refused(f.engine.create_document(
        &shop,
        body(json!({"id": "v1", "pk": "p", "type": "invoice"})),
        None,
    ));
    // Empty: none.
    let info = set_rules(&f.engine, &shop, minute, Some(Arc::default()));
    assert!(info.must_live.is_empty());
    f.engine
        .create_document(
            &shop,
            body(json!({"id": "v1", "pk": "p", "type": "invoice"})),
            None,
        )
        .result
        .expect("no rules");
}

#[test]
fn rules_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    {
        let (engine, _) = disk_engine(dir.path(), clock.clone());
        create_db_and_c(&engine, DefaultTtl::NoDefault);
        let rules = MustLive::new(vec![
            MustLiveRule::new("/kind", &[json!("order"), json!(7)]).expect("valid"),
        ])
        .expect("valid");
        let c = CollectionPath {
            database: id("db"),
            collection: id("c"),
        };
        set_rules(&engine, &c, DefaultTtl::NoDefault, Some(Arc::new(rules)));
    }
    let (engine, path) = disk_engine(dir.path(), clock);
    let info = engine.get_collection(&path).expect("collection");
    assert_eq!(info.must_live.rules()[0].path(), "/kind");
    assert_eq!(
        info.must_live.rules()[0].values(),
        [json!("order"), json!(7.0)]
    );
    let err = engine
        .create_document(&path, body(json!({"id": "a", "pk": "p", "kind": 7})), None)
        .result
        .expect_err("refused after the restart");
    assert!(must_live_refusal(&err), "{err:?}");
}

/// Rules set while a write is between its reads and its commit judge it: the commit checks
/// the body under the lock against the rules in force then.
#[test]
fn rules_set_while_a_write_is_in_flight_judge_it() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    cart(&f, &shop);
    // After the write read what it needs, quotes become must-live.
    let hook_on = |engine: Engine, shop: CollectionPath| {
        after_each_read(move || {
            let hour = default_ttl(Some(3600));
            set_rules(&engine, &shop, hour, Some(types(&[json!("quote")])));
        })
    };
    let to_quote = || PatchOp::Set {
        path: "/type".into(),
        value: json!("quote"),
    };
    let hook = hook_on(f.engine.clone(), shop.clone());
    refused(
        f.engine
            .patch_document(&shop, &key("p", "c1"), &[to_quote()], None, None),
    );
    drop(hook);
    assert_eq!(
        read(&f, &shop, "c1").expect("live").body_map()["type"],
        json!("cart")
    );

    let hook = hook_on(f.engine.clone(), shop.clone());
    let batch = [
        BatchOp::Create {
            body: body(json!({"id": "q2", "pk": "p", "type": "quote"})),
        },
        BatchOp::Patch {
            id: id("c1"),
            ops: vec![to_quote()],
            condition: None,
            if_match: None,
            options: Default::default(),
        },
    ];
    refused(f.engine.execute_batch(&shop, pk("p"), &batch));
    drop(hook);
    assert!(read(&f, &shop, "q2").is_none(), "the batch changed nothing");
}

/// A keyed write applied before a rule was set gets its first answer when sent again, not
/// a refusal saying nothing was written.
#[test]
fn a_keyed_write_applied_before_a_rule_replays() {
    let f = Fixture::new(None);
    let shop = shop(&f);
    let request = RequestKey {
        key: ResourceId::parse(IdKind::IdempotencyKey, "k1").expect("valid"),
        fingerprint: [7; 16],
    };
    let quote = || body(json!({"id": "q1", "pk": "p", "type": "quote"}));
    let first = f
        .engine
        .keyed(Some(&request))
        .create_document(&shop, quote(), None)
        .result
        .expect("no rule for quotes yet");
    let hour = default_ttl(Some(3600));
    set_rules(&f.engine, &shop, hour, Some(types(&[json!("quote")])));
    let again = f
        .engine
        .keyed(Some(&request))
        .create_document(&shop, quote(), None)
        .result
        .expect("the first answer");
    assert!(again.replayed);
    assert_eq!(again.value.etag, first.value.etag);
    // Unkeyed, the same write is judged by the rule.
    refused(f.engine.upsert_document(&shop, quote(), None, None));
}
