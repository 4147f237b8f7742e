//! Values as queries see them: JSON plus `undefined` (`None`), with Cosmos DB's rules for
//! equality, comparison and the order `ORDER BY` sorts mixed types in.
//!
//! Numbers are IEEE doubles, as in Cosmos DB (and JavaScript); a result that is a whole number
//! within ±2^53 is written as a JSON integer, so `1 + 1` shows as `2`, not `2.0`. A result that
//! is not finite (`SQRT(-1)`, `1/0`) has no JSON form and is `undefined`.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// The largest integer a double holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

/// A query value: `None` is `undefined`.
pub type Val = Option<Value>;

/// A number as a JSON value; `undefined` if it is not finite.
pub fn number(n: f64) -> Val {
    if !n.is_finite() {
        return None;
    }
    if n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER {
        // Exact: |n| ≤ 2^53. `-0.0` becomes 0, as JSON has no negative zero either.
        #[allow(clippy::cast_possible_truncation, reason = "integral and in range")]
        return Some(Value::Number(Number::from(n as i64)));
    }
    Number::from_f64(n).map(Value::Number)
}

/// A number's value as a double (`None` for anything else).
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// A string value.
pub fn string(s: impl Into<String>) -> Val {
    Some(Value::String(s.into()))
}

/// A boolean value.
pub fn boolean(b: bool) -> Val {
    Some(Value::Bool(b))
}

/// Cosmos DB's rank of a type in `ORDER BY`: undefined < null < boolean < number < string <
/// array < object.
pub fn type_rank(v: Option<&Value>) -> u8 {
    match v {
        None => 0,
        Some(Value::Null) => 1,
        Some(Value::Bool(_)) => 2,
        Some(Value::Number(_)) => 3,
        Some(Value::String(_)) => 4,
        Some(Value::Array(_)) => 5,
        Some(Value::Object(_)) => 6,
    }
}

/// `a = b`: `undefined` across types or if either side is undefined; arrays and objects compare
/// deeply.
pub fn equals(a: Option<&Value>, b: Option<&Value>) -> Option<bool> {
    let (a, b) = (a?, b?);
    if type_rank(Some(a)) != type_rank(Some(b)) {
        return None;
    }
    Some(deep_equal(a, b))
}

/// Structural equality, numbers by value (`1 = 1.0`).
pub fn deep_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| deep_equal(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| deep_equal(v, w)))
        }
        _ => a == b,
    }
}

/// `a < b` and friends: only null, booleans, numbers and strings of the same type compare;
/// anything else is `undefined`.
pub fn compare(a: Option<&Value>, b: Option<&Value>) -> Option<Ordering> {
    match (a?, b?) {
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// The total order `ORDER BY` sorts by: type rank first, then within a type by value. Arrays
/// and objects (which Cosmos DB orders by an internal hash) are ordered here element by element
/// and key by key, which is deterministic and documented in the README.
pub fn sort_order(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    let rank = type_rank(a).cmp(&type_rank(b));
    if rank != Ordering::Equal {
        return rank;
    }
    match (a, b) {
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x.total_cmp(&y)
        }
        (Some(Value::String(x)), Some(Value::String(y))) => x.cmp(y),
        (Some(Value::Array(x)), Some(Value::Array(y))) => x
            .iter()
            .zip(y)
            .map(|(x, y)| sort_order(Some(x), Some(y)))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Some(Value::Object(x)), Some(Value::Object(y))) => object_order(x, y),
        _ => Ordering::Equal,
    }
}

fn object_order(x: &Map<String, Value>, y: &Map<String, Value>) -> Ordering {
    // serde_json's map iterates in key order.
    for ((kx, vx), (ky, vy)) in x.iter().zip(y) {
        let o = kx.cmp(ky).then_with(|| sort_order(Some(vx), Some(vy)));
        if o.is_ne() {
            return o;
        }
    }
    x.len().cmp(&y.len())
}

/// Roughly the bytes a value takes as JSON, to bound what a query holds and sends.
pub fn approximate_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| approximate_size(i) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + approximate_size(v))
                .sum::<usize>()
        }
        _ => 8,
    }
}

/// The name of a value's type, for messages.
pub fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "undefined",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "boolean",
        Some(Value::Number(_)) => "number",
        Some(Value::String(_)) => "string",
        Some(Value::Array(_)) => "array",
        Some(Value::Object(_)) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn whole_numbers_are_integers_and_non_finite_is_undefined() {
        assert_eq!(number(2.0), Some(json!(2)));
        assert_eq!(number(-0.0), Some(json!(0)));
        assert_eq!(number(2.5), Some(json!(2.5)));
        assert_eq!(number(1e300), Some(json!(1e300)));
        assert_eq!(number(f64::NAN), None);
        assert_eq!(number(f64::INFINITY), None);
    }

    #[test]
    fn equality_is_undefined_across_types_and_deep_within() {
        assert_eq!(equals(Some(&json!(1)), Some(&json!(1.0))), Some(true));
        assert_eq!(equals(Some(&json!(1)), Some(&json!("1"))), None);
        assert_eq!(equals(None, Some(&json!(null))), None);
        assert_eq!(equals(Some(&json!(null)), Some(&json!(null))), Some(true));
        assert_eq!(
            equals(Some(&json!({"a": [1, 2]})), Some(&json!({"a": [1, 2.0]}))),
            Some(true)
        );
        assert_eq!(equals(Some(&json!([1])), Some(&json!([1, 2]))), Some(false));
    }

    #[test]
    fn comparison_is_undefined_for_mixed_types_arrays_and_objects() {
        assert_eq!(
            compare(Some(&json!(1)), Some(&json!(2))),
            Some(Ordering::Less)
        );
        assert_eq!(
            compare(Some(&json!("b")), Some(&json!("a"))),
            Some(Ordering::Greater)
        );
        assert_eq!(compare(Some(&json!(1)), Some(&json!("a"))), None);
        assert_eq!(compare(Some(&json!([1])), Some(&json!([1]))), None);
        assert_eq!(compare(Some(&json!({})), Some(&json!({}))), None);
    }

    #[test]
    fn sort_order_ranks_types_then_values() {
        let mut values = vec![
            Some(json!({"a": 1})),
            Some(json!([1])),
            Some(json!("a")),
            Some(json!(2)),
            Some(json!(-1.5)),
            Some(json!(true)),
            Some(json!(false)),
            Some(json!(null)),
            None,
        ];
        values.sort_by(|a, b| sort_order(a.as_ref(), b.as_ref()));
        assert_eq!(
            values,
            vec![
                None,
                Some(json!(null)),
                Some(json!(false)),
                Some(json!(true)),
                Some(json!(-1.5)),
                Some(json!(2)),
                Some(json!("a")),
                Some(json!([1])),
                Some(json!({"a": 1})),
            ]
        );
    }
}
