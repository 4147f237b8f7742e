//! Comparing query results with expected JSON: numbers by value within a relative 1e-9, and
//! result lists in order or as multisets. Shared by the conformance runners of the client
//! (over gRPC) and of the query crate (in process).

use serde_json::Value;

fn numbers_close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// JSON equality with numbers by value, within a relative 1e-9.
pub(crate) fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => numbers_close(
            x.as_f64().unwrap_or(f64::NAN),
            y.as_f64().unwrap_or(f64::NAN),
        ),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

pub(crate) fn matches(got: &[Value], expected: &[Value], ordered: bool) -> bool {
    if got.len() != expected.len() {
        return false;
    }
    if ordered {
        return got.iter().zip(expected).all(|(g, e)| same(g, e));
    }
    let mut left: Vec<&Value> = expected.iter().collect();
    got.iter()
        .all(|g| match left.iter().position(|e| same(g, e)) {
            Some(i) => {
                left.swap_remove(i);
                true
            }
            None => false,
        })
}
