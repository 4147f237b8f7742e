//! A query or read feed over shards some of which this node does not serve (cluster mode): a
//! streaming page hands off where the served shards end, a whole-scope run refuses rather than
//! answer short, and gathering each shard's documents then running over them answers as one
//! node.

use super::*;

/// Forty documents `d0`.. over partitions `p0`.. (every shard gets some), and the shard each
/// document is in.
fn spread(f: &Fixture) -> Vec<usize> {
    (0..40)
        .map(|i| {
            let key = format!("p{i}");
            f.engine
                .upsert_document(
                    &f.path,
                    body(json!({"id": format!("d{i}"), "pk": key, "n": i})),
                    None,
                    None,
                )
                .result
                .expect("upsert");
            f.engine
                .scope_shard(&f.path, &FeedScope::Partition(pk(&key)))
                .expect("collection")
                .expect("one shard")
        })
        .collect()
}

#[test]
fn a_streaming_page_hands_off_where_the_served_shards_end() {
    let f = Fixture::new(None);
    let shards = spread(&f);
    assert!((0..4).all(|s| shards.contains(&s)), "{shards:?}");
    f.engine.set_following(2, true);
    let spec = QuerySpec::parse("SELECT VALUE c.n FROM c", serde_json::Map::new()).expect("ok");
    let all = FeedScope::Collection;
    let cursor = f
        .engine
        .query_cursor(&f.path, &spec, &all, None)
        .expect("start");
    let page = crate::testing::same_inline(|reads| {
        let at = f.engine.query_reading();
        f.engine
            .query_stream_page(&f.path, &spec, &all, 100, cursor.clone(), at, reads)
            .result
    })
    .expect("shards 0 and 1 are served");
    assert!(page.handoff);
    let mut served: Vec<Value> = (0..40)
        .filter(|&i| shards[i] < 2)
        .map(|i| json!(i))
        .collect();
    let mut got = page.results.clone();
    got.sort_by_key(|v| v.as_i64());
    served.sort_by_key(|v| v.as_i64());
    assert_eq!(got, served);
    let token = page.continuation.expect("goes on at shard 2");
    let next = f
        .engine
        .query_cursor(&f.path, &spec, &all, Some(&token))
        .expect("token");
    assert_eq!(next.shard(), Some(2));
    let refused = crate::testing::same_inline(|reads| {
        let at = f.engine.query_reading();
        f.engine
            .query_stream_page(&f.path, &spec, &all, 100, next.clone(), at, reads)
            .result
    });
    assert!(
        matches!(refused, Err(Error::NotOwner { partition: 2 })),
        "{refused:?}"
    );
}

#[test]
fn a_whole_scope_query_refuses_unserved_shards_and_a_gather_answers_it() {
    let f = Fixture::new(None);
    spread(&f);
    let text = "SELECT VALUE c.n FROM c ORDER BY c.n DESC";
    let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("ok");
    let all = FeedScope::Collection;
    let whole = |f: &Fixture| {
        crate::testing::same_inline(|reads| {
            let at = f.engine.query_reading();
            f.engine.query_all(&f.path, &spec, &all, at, reads).result
        })
    };
    let expected = whole(&f).expect("every shard served").0;
    assert_eq!(expected.len(), 40);
    f.engine.set_following(1, true);
    assert!(
        matches!(whole(&f), Err(Error::NotOwner { partition: 1 })),
        "never an answer short of a shard"
    );
    let gather = |shard| {
        crate::testing::same_inline(|reads| {
            f.engine
                .gather_documents(&f.path, &spec, shard, reads)
                .result
        })
    };
    assert!(matches!(gather(1), Err(Error::NotOwner { partition: 1 })));
    f.engine.set_following(1, false);
    let docs: Vec<Value> = (0..4).flat_map(|s| gather(s).expect("served")).collect();
    assert_eq!(docs.len(), 40);
    for text in [
        text,
        "SELECT VALUE COUNT(1) FROM c",
        "SELECT DISTINCT VALUE c.n % 3 FROM c",
    ] {
        let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("ok");
        let at = f.engine.query_reading();
        let (gathered, _) = f
            .engine
            .query_gathered(&spec, docs.clone(), at, QueryReads::unlimited())
            .expect("runs");
        let local = crate::testing::same_inline(|reads| {
            f.engine.query_all(&f.path, &spec, &all, at, reads).result
        })
        .expect("runs")
        .0;
        assert_eq!(gathered, local, "{text}");
    }
}

#[test]
fn a_read_feed_page_hands_off_where_the_served_shards_end() {
    let f = Fixture::new(None);
    let shards = spread(&f);
    f.engine.set_following(1, true);
    let all = FeedScope::Collection;
    assert_eq!(f.engine.feed_shard(&f.path, &all, None).expect("start"), 0);
    let page = crate::testing::same_inline(|reads| {
        f.engine
            .read_feed_page(&f.path, &all, 1000, None, reads)
            .result
    })
    .expect("shard 0 is served");
    assert!(page.handoff);
    assert_eq!(
        page.documents.len(),
        shards.iter().filter(|&&s| s == 0).count()
    );
    let token = page.continuation.expect("goes on at shard 1");
    assert_eq!(
        f.engine
            .feed_shard(&f.path, &all, Some(&token))
            .expect("token"),
        1
    );
    let refused = crate::testing::same_inline(|reads| {
        f.engine
            .read_feed_page(&f.path, &all, 1000, Some(&token), reads)
            .result
    });
    assert!(
        matches!(refused, Err(Error::NotOwner { partition: 1 })),
        "{refused:?}"
    );
    f.engine.set_following(1, false);
    let rest = crate::testing::same_inline(|reads| {
        f.engine
            .read_feed_page(&f.path, &all, 1000, Some(&token), reads)
            .result
    })
    .expect("served again");
    assert!(!rest.handoff && rest.continuation.is_none());
    assert_eq!(page.documents.len() + rest.documents.len(), 40);
}
