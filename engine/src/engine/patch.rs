//! Partial document update (Cosmos DB's patch): operations on JSON-pointer paths, applied in
//! order to a copy of the document; any that cannot apply fails the whole patch, naming it.

use serde_json::{Map, Number, Value};

use super::{DocumentBody, InvalidInput};
use crate::model::partition_key::SYSTEM_PROPERTIES;

/// Most operations one patch may carry (Cosmos DB's limit).
pub const MAX_PATCH_OPERATIONS: usize = 10;

/// Longest path, in bytes: checked before a path is split, so a long one costs nothing.
pub const MAX_PATCH_PATH_BYTES: usize = 2048;

/// One patch operation. Paths are JSON pointers (`/a/b/0`, `~1` for `/`, `~0` for `~`); `-`
/// as the last segment of `add` or `set` appends to an array.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchOp {
    /// Sets an object member (created or replaced) or inserts into an array at an index.
    Add { path: String, value: Value },
    /// Sets an object member (created or replaced) or replaces an array element.
    Set { path: String, value: Value },
    /// Replaces a value that must exist.
    Replace { path: String, value: Value },
    /// Removes a value that must exist.
    Remove { path: String },
    /// Adds a number to a number (created with it if absent). An integer `by` (the request's
    /// `integer`) is added exactly and keeps an integer an integer; a result beyond ±2^53,
    /// where numbers (doubles, as in Cosmos DB, and so stored) stop holding every integer, is
    /// refused, so a counter never silently stops counting. A float `by` adds as doubles do.
    Incr { path: String, by: Number },
    /// Moves a value that must exist to another path (as `add` there).
    Move { from: String, path: String },
}

/// What a patch may make that is not there: the document itself, and objects on its paths.
#[derive(Debug, Clone, Default)]
pub struct PatchOptions {
    /// The body of the document to create if no live document has the key (absent, deleted
    /// or expired): the operations then apply to it, and the creation and the operations are
    /// one write. Its id and partition key must be the patched document's, and it cannot be
    /// combined with an `if_match` (see [`InvalidInput::IfMatchWithCreate`]); a condition is
    /// not checked against it.
    pub create_if_missing: Option<DocumentBody>,
    /// `add`, `set` and `incr` create the missing objects on their path as empty objects.
    /// Only object members are created: a missing array element, or a member under a value
    /// that holds none, is still an error.
    pub create_parents: bool,
}

impl PatchOp {
    fn name(&self) -> &'static str {
        match self {
            PatchOp::Add { .. } => "add",
            PatchOp::Set { .. } => "set",
            PatchOp::Replace { .. } => "replace",
            PatchOp::Remove { .. } => "remove",
            PatchOp::Incr { .. } => "incr",
            PatchOp::Move { .. } => "move",
        }
    }

    fn path(&self) -> &str {
        match self {
            PatchOp::Add { path, .. }
            | PatchOp::Set { path, .. }
            | PatchOp::Replace { path, .. }
            | PatchOp::Remove { path }
            | PatchOp::Incr { path, .. }
            | PatchOp::Move { path, .. } => path,
        }
    }
}

/// Applies `ops` in order to `doc`. Nothing is applied unless all are: the caller works on a
/// copy. `/id` and system properties cannot be patched; the partition key and the result's
/// validity (TTL, size, depth) are the caller's to check, as for any body. With
/// `create_parents`, `add`, `set` and `incr` create missing objects on their path
/// ([`PatchOptions::create_parents`]).
pub(super) fn apply(
    doc: &mut Map<String, Value>,
    ops: &[PatchOp],
    create_parents: bool,
) -> Result<(), InvalidInput> {
    if ops.is_empty() || ops.len() > MAX_PATCH_OPERATIONS {
        return Err(InvalidInput::PatchSize {
            count: ops.len(),
            max: MAX_PATCH_OPERATIONS,
        });
    }
    for (index, op) in ops.iter().enumerate() {
        let failed = |reason: String| InvalidInput::Patch {
            index,
            op: op.name(),
            path: op.path().to_owned(),
            reason,
        };
        apply_one(doc, op, create_parents).map_err(failed)?;
    }
    Ok(())
}

fn apply_one(doc: &mut Map<String, Value>, op: &PatchOp, parents: bool) -> Result<(), String> {
    match op {
        PatchOp::Add { path, value } => {
            insert(doc, &segments(path)?, value.clone(), (true, parents))
        }
        PatchOp::Set { path, value } => {
            insert(doc, &segments(path)?, value.clone(), (false, parents))
        }
        PatchOp::Replace { path, value } => {
            *existing(doc, &segments(path)?)? = value.clone();
            Ok(())
        }
        PatchOp::Remove { path } => remove(doc, &segments(path)?).map(drop),
        PatchOp::Incr { path, by } => {
            let segments = segments(path)?;
            match lookup(doc, &segments) {
                Some(Value::Number(current)) => {
                    let sum = add(current, by)?;
                    *existing(doc, &segments)? = Value::Number(sum);
                    Ok(())
                }
                Some(other) => Err(format!("the value there is {}, not a number", kind(other))),
                None => {
                    if let Some(b) = integer(by) {
                        exact(b).map_err(|beyond| format!("{by} {beyond}"))?;
                    }
                    insert(doc, &segments, Value::Number(by.clone()), (false, parents))
                }
            }
        }
        PatchOp::Move { from, path } => {
            let (from, to) = (segments(from)?, segments(path)?);
            if to.len() > from.len() && to[..from.len()] == from[..] {
                return Err("a value cannot move into itself".into());
            }
            let value = remove(doc, &from).map_err(|e| format!("from: {e}"))?;
            insert(doc, &to, value, (true, false))
        }
    }
}

/// A JSON pointer's unescaped segments; the root and protected members are refused.
fn segments(path: &str) -> Result<Vec<String>, String> {
    if path.len() > MAX_PATCH_PATH_BYTES {
        return Err(format!(
            "the path is {} bytes; the limit is {MAX_PATCH_PATH_BYTES}",
            path.len()
        ));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err("a path is a JSON pointer starting with '/'".into());
    };
    let segments: Vec<String> = rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let first = segments[0].as_str();
    if first == "id" || SYSTEM_PROPERTIES.contains(&first) {
        return Err(format!("'/{first}' cannot be patched"));
    }
    if first.is_empty() && segments.len() == 1 {
        return Err("the whole document cannot be patched; use replace".into());
    }
    Ok(segments)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn lookup<'a>(doc: &'a Map<String, Value>, segments: &[String]) -> Option<&'a Value> {
    let (first, rest) = segments.split_first()?;
    rest.iter()
        .try_fold(doc.get(first)?, |value, s| match value {
            Value::Object(map) => map.get(s),
            Value::Array(items) => s.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
}

/// The value at `segments`, which must exist.
fn existing<'a>(
    doc: &'a mut Map<String, Value>,
    segments: &[String],
) -> Result<&'a mut Value, String> {
    let (parent, last) = parent(doc, segments, false)?;
    match parent {
        Parent::Object(map) => map.get_mut(last).ok_or_else(|| "nothing is there".into()),
        Parent::Array(items) => {
            let len = items.len();
            index(last)
                .and_then(|i| items.get_mut(i))
                .ok_or_else(|| format!("no element {last} in an array of {len}"))
        }
    }
}

fn remove(doc: &mut Map<String, Value>, segments: &[String]) -> Result<Value, String> {
    let (parent, last) = parent(doc, segments, false)?;
    match parent {
        Parent::Object(map) => map.remove(last).ok_or_else(|| "nothing is there".into()),
        Parent::Array(items) => {
            let len = items.len();
            match index(last) {
                Some(i) if i < len => Ok(items.remove(i)),
                _ => Err(format!("no element {last} in an array of {len}")),
            }
        }
    }
}

/// Puts `value` at `segments`: an object member is created or replaced; in an array, `add`
/// (`inserting`) inserts at the index (or appends for `-` or the length) and `set` replaces
/// the element there (or appends). With `create_parents`, missing objects on the way are
/// created.
fn insert(
    doc: &mut Map<String, Value>,
    segments: &[String],
    value: Value,
    (inserting, create_parents): (bool, bool),
) -> Result<(), String> {
    let (parent, last) = parent(doc, segments, create_parents)?;
    match parent {
        Parent::Object(map) => {
            map.insert(last.to_owned(), value);
            Ok(())
        }
        Parent::Array(items) => {
            let len = items.len();
            let i = if last == "-" {
                len
            } else {
                index(last)
                    .filter(|&i| i <= len)
                    .ok_or_else(|| format!("no position {last} in an array of {len}"))?
            };
            if inserting || i == len {
                items.insert(i, value);
            } else {
                items[i] = value;
            }
            Ok(())
        }
    }
}

enum Parent<'a> {
    Object(&'a mut Map<String, Value>),
    Array(&'a mut Vec<Value>),
}

/// The container holding the last segment, which must exist (or, with `create`, be a
/// missing member of an object on the way, made an empty object), and that segment.
fn parent<'a, 's>(
    doc: &'a mut Map<String, Value>,
    segments: &'s [String],
    create: bool,
) -> Result<(Parent<'a>, &'s str), String> {
    let Some((last, path)) = segments.split_last() else {
        return Err("an empty path".into());
    };
    let mut current = Parent::Object(doc);
    for (depth, s) in path.iter().enumerate() {
        let next = match current {
            Parent::Object(map) if create => Some(
                map.entry(s.as_str())
                    .or_insert_with(|| Value::Object(Map::new())),
            ),
            Parent::Object(map) => map.get_mut(s),
            Parent::Array(items) => index(s).and_then(|i| items.get_mut(i)),
        };
        let shown = || format!("/{}", segments[..=depth].join("/"));
        current = match next {
            Some(Value::Object(map)) => Parent::Object(map),
            Some(Value::Array(items)) => Parent::Array(items),
            Some(other) => {
                return Err(format!(
                    "{} is {}, which holds no members",
                    shown(),
                    kind(other)
                ));
            }
            None => return Err(format!("{} does not exist", shown())),
        };
    }
    Ok((current, last))
}

/// An array index segment: digits without a leading zero.
fn index(segment: &str) -> Option<usize> {
    if segment.len() > 1 && segment.starts_with('0') {
        return None;
    }
    segment.parse().ok()
}

/// Largest integer up to which a double (every number is stored as one) holds every integer.
const MAX_EXACT_INTEGER: i128 = 1 << 53;

/// Magnitude from which a double holds no fraction (2^52).
const FRACTIONS_END: f64 = 4_503_599_627_370_496.0;

/// Why an integer result beyond ±[`MAX_EXACT_INTEGER`] is refused.
fn beyond_exact() -> String {
    format!(
        "is beyond ±{MAX_EXACT_INTEGER} (2^53): numbers are doubles (as in Cosmos DB), which hold every integer only that far, so the result would not be exact; nothing was changed"
    )
}

/// An integer JSON number (i64 or u64), widened so that sums cannot overflow.
fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// `n` as a JSON integer, if it is within ±[`MAX_EXACT_INTEGER`].
fn exact(n: i128) -> Result<Number, String> {
    if n.abs() > MAX_EXACT_INTEGER {
        return Err(beyond_exact());
    }
    // Within ±2^53, so within i64.
    Ok(Number::from(n as i64))
}

/// `current + by`. An integer `by` adds exactly (see [`PatchOp::Incr`]); a float `by` adds
/// as doubles do.
fn add(current: &Number, by: &Number) -> Result<Number, String> {
    let Some(b) = integer(by) else {
        let (Some(a), Some(b)) = (current.as_f64(), by.as_f64()) else {
            return Err("the numbers cannot be added".into());
        };
        return Number::from_f64(a + b).ok_or_else(|| format!("{a} + {b} is not a finite number"));
    };
    let x = current.as_f64().unwrap_or(f64::NAN);
    let a = match integer(current) {
        Some(a) => a,
        // An integral double (as a float `incr` earlier in the patch leaves one): exact in
        // i128.
        None if x.fract() == 0.0 && x.abs() < 2f64.powi(64) => x as i128,
        // A double past 2^64: beyond ±2^53 whatever is added.
        None if x.fract() == 0.0 => return Err(format!("{current} + {by} {}", beyond_exact())),
        // A fractional double (so |x| < 2^52): added as doubles are, where a double still
        // holds a fraction.
        None => {
            let sum = x + b as f64;
            if sum.is_finite() && sum.abs() < FRACTIONS_END && b.abs() <= MAX_EXACT_INTEGER {
                return Number::from_f64(sum)
                    .ok_or_else(|| format!("{current} + {by} is not a number"));
            }
            return Err(format!(
                "{current} + {by} would lose its fraction: doubles (every number is one, as in Cosmos DB) hold none from ±2^52 on; nothing was changed"
            ));
        }
    };
    let sum = a + b;
    if i64::try_from(sum).is_err() {
        return Err(format!("{current} + {by} overflows a 64-bit integer"));
    }
    exact(sum).map_err(|beyond| format!("{current} + {by} = {sum} {beyond}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "id": "a", "pk": "p", "count": 1, "price": 1.5, "tags": ["x", "y"],
            "address": {"city": "Lyon", "a/b": 1, "t~": 2}, "status": "new"
        }) else {
            unreachable!("an object")
        };
        map
    }

    fn patched(ops: Vec<PatchOp>) -> Result<Value, InvalidInput> {
        let mut d = doc();
        apply(&mut d, &ops, false)?;
        Ok(Value::Object(d))
    }

    fn p(s: &str) -> String {
        s.to_owned()
    }

    #[test]
    fn each_operation_does_what_cosmos_does() {
        let mut ops = vec![
            PatchOp::Add {
                path: p("/tags/1"),
                value: json!("new"),
            },
            PatchOp::Add {
                path: p("/tags/-"),
                value: json!("end"),
            },
            PatchOp::Set {
                path: p("/tags/0"),
                value: json!("first"),
            },
            PatchOp::Set {
                path: p("/address/zip"),
                value: json!("69001"),
            },
            PatchOp::Replace {
                path: p("/status"),
                value: json!("shipped"),
            },
            PatchOp::Remove { path: p("/price") },
            PatchOp::Incr {
                path: p("/count"),
                by: Number::from(41),
            },
            PatchOp::Incr {
                path: p("/visits"),
                by: Number::from(1),
            },
            PatchOp::Move {
                from: p("/address/city"),
                path: p("/city"),
            },
            PatchOp::Incr {
                path: p("/address/a~1b"),
                by: Number::from_f64(0.5).expect("finite"),
            },
        ];
        let d = patched(ops.clone()).expect("applies");
        assert_eq!(
            d,
            json!({
                "id": "a", "pk": "p", "count": 42, "visits": 1, "city": "Lyon",
                "tags": ["first", "new", "y", "end"], "status": "shipped",
                "address": {"zip": "69001", "a/b": 1.5, "t~": 2}
            })
        );
        // `~1` in "/address~1city" names a member "address/city", which does not exist.
        ops[8] = PatchOp::Move {
            from: p("/address~1city"),
            path: p("/city"),
        };
        let err = patched(ops).expect_err("no such member");
        assert!(
            matches!(
                &err,
                InvalidInput::Patch {
                    index: 8,
                    op: "move",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_failing_operation_is_named_and_refused() {
        let cases: Vec<(PatchOp, &str)> = vec![
            (
                PatchOp::Replace {
                    path: p("/nope"),
                    value: json!(1),
                },
                "nothing is there",
            ),
            (PatchOp::Remove { path: p("/tags/2") }, "no element 2"),
            (
                PatchOp::Remove {
                    path: "/".repeat(MAX_PATCH_PATH_BYTES + 1),
                },
                "the limit is 2048",
            ),
            (
                PatchOp::Incr {
                    path: p("/status"),
                    by: Number::from(1),
                },
                "not a number",
            ),
            (
                PatchOp::Set {
                    path: p("/missing/x"),
                    value: json!(1),
                },
                "/missing does not exist",
            ),
            (
                PatchOp::Set {
                    path: p("/status/x"),
                    value: json!(1),
                },
                "holds no members",
            ),
            (
                PatchOp::Add {
                    path: p("/tags/5"),
                    value: json!(1),
                },
                "no position 5",
            ),
            (
                PatchOp::Set {
                    path: p("/id"),
                    value: json!("b"),
                },
                "'/id' cannot be patched",
            ),
            (
                PatchOp::Remove { path: p("/_ts") },
                "'/_ts' cannot be patched",
            ),
            (
                PatchOp::Set {
                    path: p("status"),
                    value: json!(1),
                },
                "JSON pointer",
            ),
            (
                PatchOp::Move {
                    from: p("/address"),
                    path: p("/address/inner"),
                },
                "into itself",
            ),
            (
                PatchOp::Incr {
                    path: p("/count"),
                    by: Number::from(i64::MAX),
                },
                "overflows",
            ),
        ];
        for (op, expected) in cases {
            let err = patched(vec![op.clone()]).expect_err("refused");
            let InvalidInput::Patch {
                index: 0, reason, ..
            } = &err
            else {
                panic!("{op:?}: {err}");
            };
            assert!(reason.contains(expected), "{op:?}: {reason}");
        }
        assert!(patched(vec![]).is_err(), "empty");
        let eleven = vec![PatchOp::Remove { path: p("/status") }; 11];
        assert!(patched(eleven).is_err(), "over the limit");
    }

    /// Regression (issue 23): integers past 2^53 were added as doubles, so `incr 1` on
    /// 2^53 changed nothing and reported success.
    #[test]
    fn integer_increments_are_exact_or_refused() {
        const TWO_53: i64 = 1 << 53;
        let float = |x: f64| Value::Number(Number::from_f64(x).expect("finite"));
        let incr = |current: Option<Value>, by: Number| {
            let mut d = doc();
            if let Some(current) = current {
                d.insert("n".into(), current);
            }
            apply(&mut d, &[PatchOp::Incr { path: p("/n"), by }], false).map(|()| d["n"].clone())
        };
        let int = |n: i64| Number::from(n);
        // Exact integer results, up to ±2^53.
        for (current, by, sum) in [
            (json!(TWO_53 - 2), int(1), json!(TWO_53 - 1)),
            (json!(TWO_53 - 1), int(1), json!(TWO_53)),
            (json!(TWO_53), int(-1), json!(TWO_53 - 1)),
            (json!(-TWO_53 + 1), int(-1), json!(-TWO_53)),
            (json!(5), int(TWO_53 - 5), json!(TWO_53)),
            (json!(-3), Number::from(u64::MAX >> 11), json!(TWO_53 - 4)),
            // An integral double (a float increment earlier in the patch leaves one).
            (float(6.0), int(1), json!(7)),
        ] {
            let got = incr(Some(current.clone()), by.clone()).expect("exact");
            assert_eq!(got, sum, "{current} + {by}");
            assert!(
                got.is_i64(),
                "{current} + {by}: an integer stays an integer"
            );
        }
        // A fractional double adds as doubles do, while a double holds a fraction.
        assert_eq!(incr(Some(float(1.5)), int(1)), Ok(json!(2.5)));
        assert_eq!(incr(Some(float(0.1)), int(1)), Ok(json!(1.1)));
        assert_eq!(
            incr(Some(float(0.5)), int(TWO_53 / 2 - 2)),
            Ok(float((TWO_53 / 2) as f64 - 1.5))
        );
        // Absent: created with the increment, if it is exact.
        assert_eq!(incr(None, int(TWO_53)), Ok(json!(TWO_53)));
        // Refused: beyond ±2^53 (as an integer, or over a double that cannot hold it), or
        // past 64 bits; nothing is changed (the caller's copy is thrown away).
        for (current, by, expected) in [
            (Some(json!(TWO_53)), int(1), "beyond"),
            (Some(json!(-TWO_53)), int(-1), "beyond"),
            (Some(json!(0)), int(TWO_53 + 1), "beyond"),
            (Some(float(TWO_53 as f64)), int(1), "beyond"),
            (Some(float(1e300)), int(1), "beyond"),
            (Some(float(0.5)), int(TWO_53), "fraction"),
            (Some(float(0.5)), int(TWO_53 / 2), "fraction"),
            (Some(float(-0.5)), int(-TWO_53 / 2), "fraction"),
            (Some(json!(TWO_53)), int(i64::MAX), "overflows"),
            (Some(json!(u64::MAX)), int(1), "overflows"),
            (Some(json!(u64::MAX)), int(-1), "overflows"),
            (Some(json!(i64::MIN)), int(-1), "overflows"),
            (None, int(TWO_53 + 1), "beyond"),
            (None, int(i64::MIN), "beyond"),
        ] {
            let err = incr(current.clone(), by.clone()).expect_err("refused");
            let InvalidInput::Patch {
                index: 0,
                op: "incr",
                reason,
                ..
            } = &err
            else {
                panic!("{current:?} + {by}: {err}");
            };
            assert!(reason.contains(expected), "{current:?} + {by}: {reason}");
        }
        // A float increment keeps double arithmetic (`number` makes a float).
        assert_eq!(
            incr(Some(json!(1)), Number::from_f64(0.5).expect("finite")),
            Ok(json!(1.5))
        );
    }

    #[test]
    fn create_parents_makes_missing_objects_for_add_set_and_incr_only() {
        let with_parents = |start: Value, ops: Vec<PatchOp>| {
            let Value::Object(mut d) = start else {
                unreachable!("an object")
            };
            apply(&mut d, &ops, true).map(|()| Value::Object(d))
        };
        let incr = |path: &str| PatchOp::Incr {
            path: p(path),
            by: Number::from(2),
        };
        // The cart line item: `incr /items/sku1/qty` on an empty document.
        assert_eq!(
            with_parents(json!({}), vec![incr("/items/sku1/qty")]),
            Ok(json!({"items": {"sku1": {"qty": 2}}}))
        );
        // Existing objects are kept; only what is missing is made.
        assert_eq!(
            with_parents(
                json!({"items": {"sku0": {"qty": 1}}}),
                vec![
                    incr("/items/sku1/qty"),
                    incr("/items/sku0/qty"),
                    PatchOp::Set {
                        path: p("/a/b/c"),
                        value: json!("x"),
                    },
                    PatchOp::Add {
                        path: p("/tags/x~1y/z"),
                        value: json!(1),
                    },
                ]
            ),
            Ok(json!({
                "items": {"sku0": {"qty": 3}, "sku1": {"qty": 2}},
                "a": {"b": {"c": "x"}},
                "tags": {"x/y": {"z": 1}}
            }))
        );
        // Only object members: a missing array element, or a member under a value that holds
        // none, stays an error; so do replace, remove and move.
        for (start, op, expected) in [
            (
                json!({"list": [{"a": 1}]}),
                PatchOp::Set {
                    path: p("/list/1/a"),
                    value: json!(1),
                },
                "/list/1 does not exist",
            ),
            (json!({"s": "text"}), incr("/s/n"), "holds no members"),
            (json!({"n": null}), incr("/n/m/o"), "holds no members"),
            (
                json!({}),
                PatchOp::Replace {
                    path: p("/a/b"),
                    value: json!(1),
                },
                "/a does not exist",
            ),
            (
                json!({}),
                PatchOp::Remove { path: p("/a/b") },
                "/a does not exist",
            ),
            (
                json!({"x": 1}),
                PatchOp::Move {
                    from: p("/x"),
                    path: p("/a/b"),
                },
                "/a does not exist",
            ),
        ] {
            let err = with_parents(start, vec![op.clone()]).expect_err("refused");
            let InvalidInput::Patch { reason, .. } = &err else {
                panic!("{op:?}: {err}")
            };
            assert!(reason.contains(expected), "{op:?}: {reason}");
        }
        // Without the flag, nothing changes: a missing parent is an error.
        let mut d = Map::new();
        let err = apply(&mut d, &[incr("/items/sku1/qty")], false).expect_err("no parents");
        assert!(err.to_string().contains("/items does not exist"), "{err}");
    }

    #[test]
    fn a_patch_applies_all_or_nothing_to_its_copy() {
        let mut d = doc();
        let before = d.clone();
        let ops = vec![
            PatchOp::Set {
                path: p("/status"),
                value: json!("x"),
            },
            PatchOp::Remove { path: p("/nope") },
        ];
        let err = apply(&mut d, &ops, false).expect_err("second fails");
        assert!(matches!(err, InvalidInput::Patch { index: 1, .. }));
        // The caller's copy is partly changed; the engine throws it away.
        assert_ne!(d, before);
    }
}
