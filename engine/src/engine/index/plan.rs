//! The query planner: which index entries can stand in for a scan.
//!
//! A plan reads the entries of one path in term ranges and fetches only their documents; the
//! query still evaluates its whole `WHERE` on each, so a plan need only find a superset of the
//! matching documents. Ranges marked inexact (long strings, known only by a prefix) may hold
//! documents that do not match; exact ranges hold exactly the documents whose value at the
//! path satisfies the predicate, which lets a `COUNT` count entries without reading documents.
//!
//! Used: `=` and `IN` with constants, `< <= > >=` and `BETWEEN` on numbers or strings,
//! `STARTSWITH` (case-sensitive), `IS_DEFINED`, each on a path of the `FROM` alias that the
//! policy indexes; and `ORDER BY` on one such path. Equality is preferred, then an index
//! order for `ORDER BY`, then the other predicates; anything else scans.

use mayfly_query::ast::{BinaryOp, Expr, Query, Select};
use serde_json::{Map, Value};

use super::terms::{self, TAG_NUMBER, TAG_STRING, path_prefix, push_string_prefix, push_value};
use crate::model::IndexPaths;
use crate::storage::prefix_end;

/// Entries of one path between two byte bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TermRange {
    pub(crate) low: Vec<u8>,
    /// Exclusive.
    pub(crate) high: Vec<u8>,
    /// Whether every entry in it satisfies the predicate.
    pub(crate) exact: bool,
    /// Whether its entries all have one term (`low`): they are then in partition key order,
    /// so one partition's are a narrower range.
    pub(crate) one_term: bool,
}

/// How a query reads a collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexPlan {
    /// The path, as a policy path (`/status/?`), for the query metrics.
    pub(crate) name: String,
    /// The encoded path: the prefix of its terms.
    pub(crate) path: Vec<u8>,
    /// Ranges to read, ascending and disjoint.
    pub(crate) ranges: Vec<TermRange>,
    /// `Some(descending)`: the entries are read in the query's `ORDER BY` order, which holds
    /// only if every document has an orderable entry at the path (checked per shard).
    pub(crate) ordered: Option<bool>,
    /// The `WHERE` is exactly this predicate (or absent): an exact range's entries are its
    /// matching documents.
    pub(crate) whole_filter: bool,
}

impl IndexPlan {
    /// Whether a `COUNT` may count entries instead of documents.
    pub(crate) fn counts_exactly(&self) -> bool {
        self.whole_filter && self.ranges.iter().all(|r| r.exact)
    }
}

/// `SELECT VALUE COUNT(<constant>) FROM c [WHERE ...]` and nothing else: the number of
/// documents (rows) passing the filter.
pub(crate) fn is_plain_count(query: &Query) -> bool {
    let counts_constant = matches!(
        &query.select,
        Select::Value(Expr::Aggregate(mayfly_query::ast::Aggregate::Count, arg))
            if matches!(**arg, Expr::Literal(Some(_)))
    );
    counts_constant
        && query.from.is_some()
        && !query.distinct
        && query.top.is_none()
        && query.offset_limit.is_none()
        && query.joins.is_empty()
        && query.group_by.is_empty()
        && query.order_by.is_empty()
        && query
            .from
            .as_ref()
            .is_none_or(|f| f.path.is_empty() && !f.iterate)
}

/// A plan for `query`, or `None` to scan.
pub(crate) fn plan(
    query: &Query,
    params: &Map<String, Value>,
    paths: &IndexPaths,
) -> Option<IndexPlan> {
    let from = query.from.as_ref()?;
    if !from.path.is_empty() || from.iterate {
        return None;
    }
    let root = from.slot;
    let conjuncts = match &query.filter {
        None => Vec::new(),
        Some(filter) => {
            let mut out = Vec::new();
            flatten_and(filter, &mut out);
            out
        }
    };
    let single = conjuncts.len() == 1;
    let candidates: Vec<(u8, IndexPlan)> = conjuncts
        .iter()
        .filter_map(|c| predicate(c, root, params, paths))
        .map(|(rank, mut p)| {
            p.whole_filter = single;
            (rank, p)
        })
        .collect();
    let best = |max_rank: u8| {
        candidates
            .iter()
            .filter(|(rank, _)| *rank <= max_rank)
            .min_by_key(|(rank, p)| (*rank, p.ranges.len()))
            .map(|(_, p)| p.clone())
    };
    if let Some(eq) = best(0) {
        return Some(eq);
    }
    if let Some(ordered) = order_plan(query, root, paths, query.filter.is_none()) {
        return Some(ordered);
    }
    best(u8::MAX)
}

fn flatten_and<'q>(e: &'q Expr, out: &mut Vec<&'q Expr>) {
    match e {
        Expr::Binary(BinaryOp::And, a, b) => {
            flatten_and(a, out);
            flatten_and(b, out);
        }
        Expr::Chain(first, rest) if rest.iter().all(|(op, _)| *op == BinaryOp::And) => {
            flatten_and(first, out);
            for (_, e) in rest {
                flatten_and(e, out);
            }
        }
        e => out.push(e),
    }
}

/// The property names of `e` below the root alias (`c.a["b"]` is `[a, b]`).
fn alias_path(e: &Expr, root: usize) -> Option<Vec<String>> {
    match e {
        Expr::Property(inner, name) => {
            let mut path = alias_path(inner, root)?;
            path.push(name.clone());
            Some(path)
        }
        Expr::Alias(slot) if *slot == root => Some(Vec::new()),
        _ => None,
    }
}

/// A constant's value: a literal or a parameter.
fn constant<'a>(e: &'a Expr, params: &'a Map<String, Value>) -> Option<&'a Value> {
    match e {
        Expr::Literal(Some(v)) => Some(v),
        Expr::Param(name) => params.get(&format!("@{name}")),
        _ => None,
    }
}

/// A path the index can answer for: indexed by the policy, short enough to have terms.
fn indexed_path(e: &Expr, root: usize, paths: &IndexPaths) -> Option<(String, Vec<u8>)> {
    let path = alias_path(e, root)?;
    // System properties are added to documents as queries read them, never stored: no entry
    // holds them.
    if path.is_empty() || matches!(path[0].as_str(), "_ts" | "_etag") {
        return None;
    }
    let refs: Vec<&str> = path.iter().map(String::as_str).collect();
    if !paths.includes(&refs) {
        return None;
    }
    let encoded = path_prefix(&path)?;
    let name: String = path
        .iter()
        .map(|s| {
            if s.contains('/') || s.starts_with('"') {
                format!("/\"{s}\"")
            } else {
                format!("/{s}")
            }
        })
        .collect();
    let name = format!("{name}/?");
    Some((name, encoded))
}

/// The entries holding exactly `value` at `path` (`None` for arrays and objects).
fn equal_range(path: &[u8], value: &Value) -> Option<TermRange> {
    match value {
        Value::Array(_) | Value::Object(_) => None,
        // -0 and 0 are equal, and adjacent in term order.
        Value::Number(n) if n.as_f64() == Some(0.0) => {
            let mut low = path.to_vec();
            low.push(TAG_NUMBER);
            low.extend_from_slice(&terms::number_bytes(-0.0));
            let mut high = path.to_vec();
            high.push(TAG_NUMBER);
            high.extend_from_slice(&terms::number_bytes(0.0));
            Some(TermRange {
                low,
                high: prefix_end(&high)?,
                exact: true,
                one_term: true,
            })
        }
        v => {
            let mut term = path.to_vec();
            push_value(v, &mut term);
            let exact = !matches!(v, Value::String(s) if s.len() > terms::MAX_STRING_TERM);
            Some(TermRange {
                high: prefix_end(&term)?,
                low: term,
                exact,
                one_term: true,
            })
        }
    }
}

/// The entries of one tag at `path`.
fn tag_range(path: &[u8], tag: u8, exact: bool) -> TermRange {
    let mut low = path.to_vec();
    low.push(tag);
    let mut high = path.to_vec();
    high.push(tag + 1);
    TermRange {
        low,
        high,
        exact,
        one_term: false,
    }
}

/// The ranges holding values of `value`'s type between `low` and `high` (inclusive flags);
/// numbers and strings only (other types compare as undefined or are not worth an index).
fn compare_ranges(
    path: &[u8],
    low: Option<(&Value, bool)>,
    high: Option<(&Value, bool)>,
) -> Option<Vec<TermRange>> {
    let kind = |v: &Value| match v {
        Value::Number(_) => Some(TAG_NUMBER),
        Value::String(_) => Some(TAG_STRING),
        _ => None,
    };
    let tag = match (low, high) {
        (Some((l, _)), Some((h, _))) if kind(l)? == kind(h)? => kind(l)?,
        (Some((v, _)), None) | (None, Some((v, _))) => kind(v)?,
        _ => return None,
    };
    // Strings known only by a prefix sort among the others by it, so a range between short
    // bounds holds exactly the strings between them; one bounded by a long string also holds
    // those sharing its prefix, which the query decides on.
    let long = |v: &Value| matches!(v, Value::String(s) if s.len() > terms::MAX_STRING_TERM);
    let exact = low.is_none_or(|(v, _)| !long(v)) && high.is_none_or(|(v, _)| !long(v));
    let mut range = tag_range(path, tag, exact);
    narrow(&mut range, path, low, high)?;
    Some(vec![range])
}

/// Narrows a tag's range to the bounds.
fn narrow(
    range: &mut TermRange,
    path: &[u8],
    low: Option<(&Value, bool)>,
    high: Option<(&Value, bool)>,
) -> Option<()> {
    // A long string bound includes the strings sharing its prefix (its term's): any of them
    // may be on either side of it.
    let term = |v: &Value, inclusive: bool| {
        let mut t = path.to_vec();
        push_value(v, &mut t);
        let long = matches!(v, Value::String(s) if s.len() > terms::MAX_STRING_TERM);
        (t, inclusive || long)
    };
    if let Some((v, inclusive)) = low {
        let (t, inclusive) = term(v, inclusive);
        let bound = if inclusive { t } else { prefix_end(&t)? };
        range.low = range.low.clone().max(bound);
    }
    if let Some((v, inclusive)) = high {
        let (t, inclusive) = term(v, inclusive);
        let bound = if inclusive { prefix_end(&t)? } else { t };
        range.high = range.high.clone().min(bound);
    }
    Some(())
}

/// A plan for one conjunct, with its rank (0: equality, 2: others).
fn predicate(
    e: &Expr,
    root: usize,
    params: &Map<String, Value>,
    paths: &IndexPaths,
) -> Option<(u8, IndexPlan)> {
    let make = |(name, path): (String, Vec<u8>), ranges: Vec<TermRange>| IndexPlan {
        name,
        path,
        ranges,
        ordered: None,
        whole_filter: false,
    };
    match e {
        Expr::Binary(op, a, b) => {
            // `path op constant`, or `constant op path` turned around.
            let (p, v, op) = match (indexed_path(a, root, paths), constant(b, params)) {
                (Some(p), Some(v)) => (p, v, *op),
                _ => (
                    indexed_path(b, root, paths)?,
                    constant(a, params)?,
                    flip(*op)?,
                ),
            };
            let ranges = match op {
                BinaryOp::Eq => vec![equal_range(&p.1, v)?],
                BinaryOp::Lt => compare_ranges(&p.1, None, Some((v, false)))?,
                BinaryOp::Le => compare_ranges(&p.1, None, Some((v, true)))?,
                BinaryOp::Gt => compare_ranges(&p.1, Some((v, false)), None)?,
                BinaryOp::Ge => compare_ranges(&p.1, Some((v, true)), None)?,
                _ => return None,
            };
            let rank = if op == BinaryOp::Eq { 0 } else { 2 };
            Some((rank, make(p, ranges)))
        }
        Expr::In {
            expr,
            list,
            negated: false,
        } => {
            if list.is_empty() {
                return None;
            }
            let p = indexed_path(expr, root, paths)?;
            let mut ranges = list
                .iter()
                .map(|item| equal_range(&p.1, constant(item, params)?))
                .collect::<Option<Vec<_>>>()?;
            ranges.sort_by(|a, b| a.low.cmp(&b.low));
            ranges.dedup_by(|a, b| a.low == b.low);
            Some((0, make(p, ranges)))
        }
        Expr::Between {
            expr,
            low,
            high,
            negated: false,
        } => {
            let p = indexed_path(expr, root, paths)?;
            let (l, h) = (constant(low, params)?, constant(high, params)?);
            let ranges = compare_ranges(&p.1, Some((l, true)), Some((h, true)))?;
            Some((2, make(p, ranges)))
        }
        Expr::Call(f, args) if f.name.eq_ignore_ascii_case("STARTSWITH") => {
            if let Some(flag) = args.get(2)
                && constant(flag, params) != Some(&Value::Bool(false))
            {
                return None;
            }
            let p = indexed_path(args.first()?, root, paths)?;
            let Value::String(prefix) = constant(args.get(1)?, params)? else {
                return None;
            };
            // Long strings sort by their first bytes among the short ones, so one range
            // holds every string the prefix starts (exactly, unless the prefix is longer than
            // what terms hold).
            let mut low = p.1.clone();
            push_string_prefix(prefix, &mut low);
            let ranges = vec![TermRange {
                high: prefix_end(&low)?,
                low,
                exact: prefix.len() <= terms::MAX_STRING_TERM,
                one_term: false,
            }];
            Some((2, make(p, ranges)))
        }
        Expr::Call(f, args) if f.name.eq_ignore_ascii_case("IS_DEFINED") && args.len() == 1 => {
            let p = indexed_path(&args[0], root, paths)?;
            let range = TermRange {
                low: p.1.clone(),
                high: prefix_end(&p.1)?,
                exact: true,
                one_term: false,
            };
            Some((3, make(p, vec![range])))
        }
        _ => None,
    }
}

/// `a op b` as `b op' a`.
fn flip(op: BinaryOp) -> Option<BinaryOp> {
    Some(match op {
        BinaryOp::Eq => BinaryOp::Eq,
        BinaryOp::Lt => BinaryOp::Gt,
        BinaryOp::Le => BinaryOp::Ge,
        BinaryOp::Gt => BinaryOp::Lt,
        BinaryOp::Ge => BinaryOp::Le,
        _ => return None,
    })
}

/// Reading one path's entries in `ORDER BY` order.
fn order_plan(
    query: &Query,
    root: usize,
    paths: &IndexPaths,
    no_filter: bool,
) -> Option<IndexPlan> {
    let [key] = &query.order_by[..] else {
        return None;
    };
    if query.distinct || query.aggregates || !query.group_by.is_empty() {
        return None;
    }
    let (name, path) = indexed_path(&key.expr, root, paths)?;
    Some(IndexPlan {
        name,
        ranges: vec![TermRange {
            low: path.clone(),
            high: prefix_end(&path)?,
            exact: true,
            one_term: false,
        }],
        path,
        ordered: Some(key.descending),
        whole_filter: no_filter,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan_of(text: &str, params: Value) -> Option<IndexPlan> {
        let query = mayfly_query::parse(text).expect("parses");
        let Value::Object(params) = params else {
            unreachable!()
        };
        plan(&query, &params, &IndexPaths::default())
    }

    fn term(path: &str, v: Value) -> Vec<u8> {
        let mut t = path_prefix(&[path]).expect("short");
        push_value(&v, &mut t);
        t
    }

    fn covers(p: &IndexPlan, path: &str, v: Value) -> bool {
        let t = term(path, v);
        p.ranges.iter().any(|r| t >= r.low && t < r.high)
    }

    #[test]
    fn equality_and_in_read_exactly_their_values() {
        let p = plan_of("SELECT * FROM c WHERE c.s = 'x'", json!({})).expect("planned");
        assert_eq!(p.name, "/s/?");
        assert!(p.counts_exactly());
        assert!(covers(&p, "s", json!("x")));
        assert!(!covers(&p, "s", json!("xy")) && !covers(&p, "s", json!("w")));

        let p = plan_of("SELECT * FROM c WHERE 0 = c.n AND c.t > 1", json!({})).expect("planned");
        assert!(covers(&p, "n", json!(0)) && covers(&p, "n", json!(-0.0)));
        assert!(!p.counts_exactly(), "the filter has another conjunct");

        let p = plan_of(
            "SELECT * FROM c WHERE c.k IN (@a, 2, 'z')",
            json!({"@a": true}),
        )
        .expect("planned");
        assert_eq!(p.ranges.len(), 3);
        for v in [json!(true), json!(2), json!("z")] {
            assert!(covers(&p, "k", v));
        }
        assert!(!covers(&p, "k", json!(false)));
    }

    #[test]
    fn ranges_stay_within_their_type() {
        let p = plan_of("SELECT * FROM c WHERE c.n > 5", json!({})).expect("planned");
        assert!(covers(&p, "n", json!(5.5)) && covers(&p, "n", json!(1e300)));
        assert!(
            !covers(&p, "n", json!(5))
                && !covers(&p, "n", json!("6"))
                && !covers(&p, "n", json!(true))
        );
        let p = plan_of("SELECT * FROM c WHERE c.n BETWEEN 1 AND 3", json!({})).expect("planned");
        assert!(
            covers(&p, "n", json!(1)) && covers(&p, "n", json!(3)) && !covers(&p, "n", json!(3.01))
        );
        let p = plan_of("SELECT * FROM c WHERE c.s < 'm'", json!({})).expect("planned");
        assert!(covers(&p, "s", json!("a")) && !covers(&p, "s", json!("n")));
        assert!(
            covers(&p, "s", json!("a".repeat(300))) && !covers(&p, "s", json!("m".repeat(300))),
            "long strings sort by their prefix"
        );
        assert!(p.counts_exactly());
        let long = format!("a{}", "z".repeat(300));
        let p = plan_of("SELECT * FROM c WHERE c.s > @l", json!({"@l": long})).expect("planned");
        assert!(
            covers(&p, "s", json!("b")),
            "a short string above a long bound"
        );
        assert!(
            covers(&p, "s", json!(format!("{long}a"))) && covers(&p, "s", json!(long[..299])),
            "long strings sharing the bound's prefix are read and checked"
        );
        assert!(!covers(&p, "s", json!("a")) && !p.counts_exactly());
        let p = plan_of("SELECT * FROM c WHERE c.s < @l", json!({"@l": long})).expect("planned");
        assert!(covers(&p, "s", json!("a")) && covers(&p, "s", json!("az")));
        assert!(covers(&p, "s", json!(format!("{long}a"))) && !covers(&p, "s", json!("b")));
        assert!(plan_of("SELECT * FROM c WHERE c.n > true", json!({})).is_none());
    }

    #[test]
    fn startswith_is_defined_and_order_by() {
        let p = plan_of("SELECT * FROM c WHERE STARTSWITH(c.s, 'ab')", json!({})).expect("planned");
        assert!(covers(&p, "s", json!("ab")) && covers(&p, "s", json!("abc")));
        assert!(covers(&p, "s", json!(format!("ab{}", "z".repeat(300)))));
        assert!(!covers(&p, "s", json!("a")) && !covers(&p, "s", json!("b")));
        assert!(p.counts_exactly());
        assert!(
            plan_of(
                "SELECT * FROM c WHERE STARTSWITH(c.s, 'ab', true)",
                json!({})
            )
            .is_none()
        );

        let p = plan_of("SELECT * FROM c WHERE IS_DEFINED(c.s)", json!({})).expect("planned");
        assert!(covers(&p, "s", json!(null)) && covers(&p, "s", json!({"a": 1})));

        let p = plan_of("SELECT TOP 10 * FROM c ORDER BY c.n DESC", json!({})).expect("planned");
        assert_eq!(p.ordered, Some(true));
        let p =
            plan_of("SELECT * FROM c WHERE c.s = 'x' ORDER BY c.n", json!({})).expect("planned");
        assert_eq!(
            (p.name.as_str(), p.ordered),
            ("/s/?", None),
            "equality first"
        );
        assert!(plan_of("SELECT * FROM c ORDER BY c.a, c.b", json!({})).is_none());
    }

    #[test]
    fn what_the_index_cannot_answer_scans() {
        for q in [
            "SELECT * FROM c",
            "SELECT * FROM c WHERE c.a = 1 OR c.b = 2",
            "SELECT * FROM c WHERE c.a != 1",
            "SELECT * FROM c WHERE c.arr[0] = 1",
            "SELECT * FROM c WHERE c._etag = 'x'",
            "SELECT * FROM c WHERE c.a = [1]",
            "SELECT * FROM c WHERE NOT (c.a = 1)",
            "SELECT * FROM c.child x WHERE x.a = 1",
            "SELECT * FROM c WHERE c.a = c.b",
            "SELECT * FROM c WHERE c._ts > 5",
            "SELECT * FROM c WHERE c.a IN ()",
        ] {
            assert!(plan_of(q, json!({})).is_none(), "{q}");
        }
        assert!(is_plain_count(
            &mayfly_query::parse("SELECT VALUE COUNT(1) FROM c").expect("parses")
        ));
        assert!(!is_plain_count(
            &mayfly_query::parse("SELECT VALUE COUNT(c.a) FROM c").expect("parses")
        ));
        assert!(!is_plain_count(
            &mayfly_query::parse("SELECT VALUE COUNT(1) FROM c JOIN t IN c.tags").expect("parses")
        ));
    }
}
