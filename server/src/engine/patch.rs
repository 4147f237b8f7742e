//! Partial document update (Cosmos DB's patch): operations on JSON-pointer paths, applied in
//! order to a copy of the document; any that cannot apply fails the whole patch, naming it.

use serde_json::{Map, Number, Value};

use super::InvalidInput;
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
    /// Adds a number to a number (created with it if absent): integer stays integer unless
    /// either side is fractional.
    Incr { path: String, by: Number },
    /// Moves a value that must exist to another path (as `add` there).
    Move { from: String, path: String },
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
/// validity (TTL, size, depth) are the caller's to check, as for any body.
pub(super) fn apply(doc: &mut Map<String, Value>, ops: &[PatchOp]) -> Result<(), InvalidInput> {
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
        apply_one(doc, op).map_err(failed)?;
    }
    Ok(())
}

fn apply_one(doc: &mut Map<String, Value>, op: &PatchOp) -> Result<(), String> {
    match op {
        PatchOp::Add { path, value } => insert(doc, &segments(path)?, value.clone(), true),
        PatchOp::Set { path, value } => insert(doc, &segments(path)?, value.clone(), false),
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
                None => insert(doc, &segments, Value::Number(by.clone()), false),
            }
        }
        PatchOp::Move { from, path } => {
            let (from, to) = (segments(from)?, segments(path)?);
            if to.len() > from.len() && to[..from.len()] == from[..] {
                return Err("a value cannot move into itself".into());
            }
            let value = remove(doc, &from).map_err(|e| format!("from: {e}"))?;
            insert(doc, &to, value, true)
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
    let (parent, last) = parent(doc, segments)?;
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
    let (parent, last) = parent(doc, segments)?;
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
/// inserts at the index (or appends for `-` or the length) and `set` replaces the element
/// there (or appends).
fn insert(
    doc: &mut Map<String, Value>,
    segments: &[String],
    value: Value,
    inserting: bool,
) -> Result<(), String> {
    let (parent, last) = parent(doc, segments)?;
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

/// The container holding the last segment, which must exist, and that segment.
fn parent<'a, 's>(
    doc: &'a mut Map<String, Value>,
    segments: &'s [String],
) -> Result<(Parent<'a>, &'s str), String> {
    let Some((last, path)) = segments.split_last() else {
        return Err("an empty path".into());
    };
    let mut current = Parent::Object(doc);
    for (depth, s) in path.iter().enumerate() {
        let next = match current {
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

fn add(current: &Number, by: &Number) -> Result<Number, String> {
    if let (Some(a), Some(b)) = (current.as_i64(), by.as_i64()) {
        return a
            .checked_add(b)
            .map(Number::from)
            .ok_or_else(|| format!("{a} + {b} overflows a 64-bit integer"));
    }
    let (Some(a), Some(b)) = (current.as_f64(), by.as_f64()) else {
        return Err("the numbers cannot be added".into());
    };
    Number::from_f64(a + b).ok_or_else(|| format!("{a} + {b} is not a finite number"))
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
        apply(&mut d, &ops)?;
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
        let err = apply(&mut d, &ops).expect_err("second fails");
        assert!(matches!(err, InvalidInput::Patch { index: 1, .. }));
        // The caller's copy is partly changed; the engine throws it away.
        assert_ne!(d, before);
    }
}
