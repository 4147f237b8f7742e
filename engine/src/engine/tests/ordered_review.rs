//! Review of the ordered walk (commits 9b7c464..dac73ce): the defects it found, each
//! reproduced, and what it checked.

use super::*;

/// Pages `text` `page_size` results at a time over `scope`, running `between(page)` after
/// each page but the last.
fn paged_with(
    f: &Fixture,
    text: &str,
    scope: &FeedScope,
    page_size: usize,
    mut between: impl FnMut(usize),
) -> Vec<Value> {
    let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("valid");
    let (mut results, mut token, mut pages) = (Vec::new(), None, 0);
    loop {
        let cursor = f
            .engine
            .query_cursor(&f.path, &spec, scope, token.as_deref())
            .expect("a cursor");
        assert!(
            matches!(cursor, QueryCursor::Ordered { .. }),
            "an ordered walk"
        );
        let page = f
            .engine
            .query_stream_page(
                &f.path,
                &spec,
                scope,
                page_size,
                cursor,
                f.engine.query_reading(),
                QueryReads::unlimited(),
            )
            .result
            .expect("a page");
        results.extend(page.results);
        pages += 1;
        match page.continuation {
            Some(t) => token = Some(t),
            None => return results,
        }
        between(pages);
    }
}

fn put(f: &Fixture, doc: Value) {
    f.engine
        .upsert_document(&f.path, body(doc), None, None)
        .result
        .expect("upsert");
}

/// Three documents whose values (arrays) share one index term: a tie group.
fn group_of_three(f: &Fixture) {
    for (name, v) in [("g1", json!([1])), ("g2", json!([2])), ("g3", json!([3]))] {
        put(f, json!({"id": name, "pk": "p", "n": v}));
    }
}

/// A page ending inside a tie group once resumed by a count into the group, which the group
/// read again on the next page no longer agreed with once one of its documents was deleted:
/// g2, never changed, was skipped. It resumes after the last document's (value, key) now.
#[test]
fn a_tie_group_member_deleted_between_pages_skips_no_other() {
    for descending in [false, true] {
        let f = Fixture::new(None);
        group_of_three(&f);
        let text = format!(
            "SELECT VALUE c.id FROM c ORDER BY c.n{}",
            if descending { " DESC" } else { "" }
        );
        let first = if descending { "g3" } else { "g1" };
        let rows = paged_with(&f, &text, &FeedScope::Collection, 1, |page| {
            if page == 1 {
                f.engine
                    .delete_document(&f.path, &key("p", first), None)
                    .result
                    .expect("deleted");
            }
        });
        let mut expected = vec!["g1", "g2", "g3"];
        if descending {
            expected.reverse();
        }
        assert_eq!(rows, expected, "{text}");
    }
}

/// The same count, once a document sorting before the position joined the group: the last
/// document returned is returned again.
#[test]
fn a_tie_group_member_added_before_the_position_repeats_nothing() {
    let f = Fixture::new(None);
    group_of_three(&f);
    let rows = paged_with(
        &f,
        "SELECT VALUE c.id FROM c ORDER BY c.n",
        &FeedScope::Collection,
        1,
        |page| {
            if page == 1 {
                put(&f, json!({"id": "g0", "pk": "p", "n": [0]}));
            }
        },
    );
    assert_eq!(rows, ["g1", "g2", "g3"]);
}

/// A partition-scoped `ORDER BY` finds its undefined documents among every key of the
/// shard, 16, 32, ... 4096 at a time, each batch a visit of every slot, and drops the other
/// partitions' after: here 3 documents cost thousands of keys (on a shard of a million
/// documents, the query ran its whole 30 s limit and failed). Filtering by the scope while
/// visiting the slots makes it one visit for a small partition.
#[test]
fn a_partition_scoped_order_by_reads_about_its_own_undefined_documents() {
    let f = Fixture::new(None);
    put(&f, json!({"id": "has-n", "pk": "target", "n": 1}));
    for i in 0..3 {
        put(&f, json!({"id": format!("t{i}"), "pk": "target"}));
    }
    let info = f.engine.get_collection(&f.path).expect("collection");
    let target = f.engine.shard_index(&info, &pk("target"));
    // Other partitions' undefined documents, in the target's shard.
    let (mut i, mut placed) = (0, 0);
    while placed < 3000 {
        let partition = format!("o{i}");
        i += 1;
        if f.engine.shard_index(&info, &pk(&partition)) != target {
            continue;
        }
        for j in 0..10 {
            put(&f, json!({"id": format!("d{j}"), "pk": partition}));
        }
        placed += 10;
    }
    let spec = QuerySpec::parse(
        "SELECT VALUE c.id FROM c ORDER BY c.n",
        serde_json::Map::new(),
    )
    .expect("valid");
    let scope = FeedScope::Partition(pk("target"));
    let cursor = f
        .engine
        .query_cursor(&f.path, &spec, &scope, None)
        .expect("a cursor");
    let page = f
        .engine
        .query_stream_page(
            &f.path,
            &spec,
            &scope,
            10,
            cursor,
            f.engine.query_reading(),
            // An inline run's reads, without its 2 ms: what is tested is how many documents
            // the page reads, not how fast a loaded machine reads them.
            QueryReads::inline_within(INLINE_READS, std::time::Duration::from_secs(60)),
        )
        .result
        .expect("within an inline run's reads: 4 documents, 1 entry");
    assert_eq!(
        page.results,
        [json!("t0"), json!("t1"), json!("t2"), json!("has-n")]
    );
}

/// Values of every type, with ties (equal scalars, long strings sharing their first 256
/// bytes, arrays, objects) and documents without the path, by id.
fn mixed_values() -> Vec<(String, Option<Value>)> {
    let long = |tail: &str| json!(format!("{}{tail}", "s".repeat(300)));
    let mut values: Vec<(&str, Option<Value>)> = vec![
        ("u1", None),
        ("u2", None),
        ("u3", None),
        ("null1", Some(json!(null))),
        ("null2", Some(json!(null))),
        ("false", Some(json!(false))),
        ("true", Some(json!(true))),
        ("neg", Some(json!(-3.5))),
        ("two", Some(json!(2))),
        ("two-b", Some(json!(2))),
        ("a", Some(json!("a"))),
        ("long-b", Some(long("b"))),
        ("long-a", Some(long("a"))),
        ("long-c", Some(long("c"))),
        ("s-256", Some(json!("s".repeat(256)))),
        ("t", Some(json!("t"))),
        ("arr-05", Some(json!([0, 5]))),
        ("arr-1", Some(json!([1]))),
        ("arr-0", Some(json!([0]))),
        ("obj-b", Some(json!({"a": 2}))),
        ("obj-a", Some(json!({"a": 1}))),
    ];
    let numbers: Vec<String> = (0..6).map(|i| format!("x{i}")).collect();
    for (i, name) in numbers.iter().enumerate() {
        values.push((name, Some(json!(i))));
    }
    values
        .into_iter()
        .map(|(name, v)| (name.to_string(), v))
        .collect()
}

/// An ordered walk returns what the query engine's own sort does, in pages of 1, 2 and 3,
/// ascending and descending, over the collection and over each partition (whose pages hold
/// that partition's documents only, undefined ones included).
#[test]
fn an_ordered_walk_pages_mixed_types_as_the_sort_does_in_any_scope() {
    let f = Fixture::new(None);
    let partitions = 3;
    let mut partition_of = std::collections::HashMap::new();
    for (i, (name, value)) in mixed_values().into_iter().enumerate() {
        let partition = format!("p{}", i % partitions);
        let mut doc = json!({"id": name, "pk": partition});
        if let Some(v) = value {
            doc["n"] = v;
        }
        put(&f, doc);
        partition_of.insert(json!(name), partition);
    }
    for descending in [false, true] {
        let text = format!(
            "SELECT VALUE c.id FROM c ORDER BY c.n{}",
            if descending { " DESC" } else { "" }
        );
        // OFFSET/LIMIT: the whole scope read and sorted in memory.
        let (sorted, _) = query_on(
            &f.engine,
            &f.path,
            &format!("{text} OFFSET 0 LIMIT 1000"),
            false,
            1000,
        )
        .expect("runs");
        assert_eq!(sorted.len(), partition_of.len());
        for page_size in [1, 2, 3] {
            let rows = paged_with(&f, &text, &FeedScope::Collection, page_size, |_| {});
            assert_eq!(rows, sorted, "{text}, pages of {page_size}");
            for p in 0..partitions {
                let partition = format!("p{p}");
                let scope = FeedScope::Partition(pk(&partition));
                let rows = paged_with(&f, &text, &scope, page_size, |_| {});
                let expected: Vec<Value> = sorted
                    .iter()
                    .filter(|id| partition_of[*id] == partition)
                    .cloned()
                    .collect();
                assert_eq!(
                    rows, expected,
                    "{text} in {partition}, pages of {page_size}"
                );
            }
        }
    }
}

/// A tied value too large to carry in a continuation is found again by its document's key; if
/// that document is gone, the query says so instead of guessing where it was.
#[test]
fn a_tie_group_of_large_values_resumes_by_key_or_says_it_cannot() {
    let f = Fixture::new(None);
    let big = |tail: &str| format!("{}{tail}", "v".repeat(5000));
    for (name, tail) in [("b1", "a"), ("b2", "b"), ("b3", "c")] {
        put(&f, json!({"id": name, "pk": "p", "n": big(tail)}));
    }
    let text = "SELECT VALUE c.id FROM c ORDER BY c.n";
    let rows = paged_with(&f, text, &FeedScope::Collection, 1, |_| {});
    assert_eq!(rows, [json!("b1"), json!("b2"), json!("b3")]);
    let spec = QuerySpec::parse(text, serde_json::Map::new()).expect("valid");
    let scope = FeedScope::Collection;
    let page = |token: Option<&str>| {
        let cursor = f
            .engine
            .query_cursor(&f.path, &spec, &scope, token)
            .expect("a cursor");
        f.engine
            .query_stream_page(
                &f.path,
                &spec,
                &scope,
                1,
                cursor,
                f.engine.query_reading(),
                QueryReads::unlimited(),
            )
            .result
    };
    let first = page(None).expect("a page");
    assert_eq!(first.results, [json!("b1")]);
    f.engine
        .delete_document(&f.path, &key("p", "b1"), None)
        .result
        .expect("deleted");
    let next = page(first.continuation.as_deref());
    assert!(
        matches!(next, Err(Error::ContinuationStale { .. })),
        "{next:?}"
    );
}

/// Review finding 5: a partition's walk passes whole batches of other partitions' entries;
/// it reports them as passed, so a page may end among them, and resumes exactly there.
#[test]
fn a_partition_walk_passes_other_partitions_entries_and_resumes_after_them() {
    let f = Fixture::new(None);
    for i in 0..1500 {
        put(
            &f,
            json!({"id": format!("o{i}"), "pk": format!("q{}", i % 7), "n": i}),
        );
    }
    for i in 0..5 {
        put(
            &f,
            json!({"id": format!("m{i}"), "pk": "mine", "n": 2000 + i}),
        );
    }
    let scope = FeedScope::Partition(pk("mine"));
    for (text, expected) in [
        (
            "SELECT VALUE c.n FROM c ORDER BY c.n",
            vec![2000, 2001, 2002, 2003, 2004],
        ),
        (
            "SELECT VALUE c.n FROM c ORDER BY c.n DESC",
            vec![2004, 2003, 2002, 2001, 2000],
        ),
    ] {
        let rows = paged_with(&f, text, &scope, 2, |_| {});
        assert_eq!(
            rows,
            expected.iter().map(|n| json!(n)).collect::<Vec<_>>(),
            "{text}"
        );
    }
}
