//! Values as queries see them: JSON, `undefined`, and the numbers JSON has no form for
//! (±`Infinity`, `NaN`), with Cosmos DB's rules for equality, comparison and the order
//! `ORDER BY` sorts mixed types in.
//!
//! Numbers are IEEE doubles, as in Cosmos DB (and JavaScript); a result that is a whole number
//! within ±2^53 is written as a JSON integer, so `1 + 1` shows as `2`, not `2.0`. Arithmetic
//! follows IEEE 754: `1/0` is `Infinity`, `-1/0` is `-Infinity`, `0/0` and `SQRT(-1)` are
//! `NaN`. Such a number stays a number while a query computes with it ([`Val::NonFinite`]:
//! `IS_NUMBER(1/0)` is true, `TOSTRING(1/0)` is `"Infinity"`), but JSON cannot hold it: put
//! into an array or object the query builds, or returned as a result, it becomes `null`
//! ([`Val::into_json_lossy`]). Documents never hold one.
//!
//! Comparisons follow IEEE (and JavaScript): `Infinity` is above every finite number and
//! `-Infinity` below, and `NaN` is unordered, so `=`, `<`, `<=`, `>`, `>=` with a `NaN` are
//! `false` and `!=` is `true` (`NaN = NaN` is `false`). `ORDER BY` and the other sorts (`MIN`,
//! `MAX`, `ARRAY_MIN`, `ARRAY_MAX`) order numbers `NaN` < `-Infinity` < finite < `Infinity`, as
//! .NET's `double.CompareTo` does (which the Cosmos DB SDKs merge ordered results with).

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// The largest integer a double holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

/// A query value.
#[derive(Debug, Clone, Default)]
pub enum Val {
    /// `undefined`: a missing property, an operation on the wrong types, ...
    #[default]
    Undefined,
    /// A JSON value (whose numbers are all finite).
    Json(Value),
    /// `Infinity`, `-Infinity` or `NaN`: a number JSON cannot hold (never a finite one).
    NonFinite(f64),
}

/// A borrowed [`Val`]: what comparisons take, so that a document's values compare without
/// being copied.
#[derive(Debug, Clone, Copy)]
pub enum ValRef<'a> {
    Undefined,
    Json(&'a Value),
    NonFinite(f64),
}

impl Val {
    /// The value as JSON, if it is JSON (not `undefined`, not a non-finite number).
    pub fn json(&self) -> Option<&Value> {
        match self {
            Val::Json(v) => Some(v),
            _ => None,
        }
    }

    /// [`Val::json`], by value.
    pub fn into_json(self) -> Option<Value> {
        match self {
            Val::Json(v) => Some(v),
            _ => None,
        }
    }

    /// The value as it leaves the query or enters an array or object: JSON, with a non-finite
    /// number as `null` (JSON has no form for it); `None` for `undefined`.
    pub fn into_json_lossy(self) -> Option<Value> {
        match self {
            Val::Undefined => None,
            Val::Json(v) => Some(v),
            Val::NonFinite(_) => Some(Value::Null),
        }
    }

    /// Whether the value is defined.
    pub fn is_defined(&self) -> bool {
        !matches!(self, Val::Undefined)
    }

    /// A number's value, finite or not (`None` for anything else).
    pub fn as_f64(&self) -> Option<f64> {
        self.view().as_f64()
    }

    /// The value, borrowed.
    pub fn view(&self) -> ValRef<'_> {
        match self {
            Val::Undefined => ValRef::Undefined,
            Val::Json(v) => ValRef::Json(v),
            Val::NonFinite(n) => ValRef::NonFinite(*n),
        }
    }
}

impl From<Option<Value>> for Val {
    fn from(v: Option<Value>) -> Self {
        v.map_or(Val::Undefined, Val::Json)
    }
}

impl From<Value> for Val {
    fn from(v: Value) -> Self {
        Val::Json(v)
    }
}

impl PartialEq for Val {
    /// Structural equality (two `NaN`s are the same value here); the query's `=` is
    /// [`equals`].
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Val::Undefined, Val::Undefined) => true,
            (Val::Json(a), Val::Json(b)) => a == b,
            (Val::NonFinite(a), Val::NonFinite(b)) => a == b || (a.is_nan() && b.is_nan()),
            _ => false,
        }
    }
}

/// A value equals the `Option` of its JSON form, for tests (`None` is `undefined`).
#[cfg(test)]
impl PartialEq<Option<Value>> for Val {
    fn eq(&self, other: &Option<Value>) -> bool {
        match (self, other) {
            (Val::Undefined, None) => true,
            (Val::Json(a), Some(b)) => a == b,
            _ => false,
        }
    }
}

impl<'a> ValRef<'a> {
    /// A number's value, finite or not (`None` for anything else).
    pub fn as_f64(self) -> Option<f64> {
        match self {
            ValRef::Json(v) => as_f64(v),
            ValRef::NonFinite(n) => Some(n),
            ValRef::Undefined => None,
        }
    }

    /// The value as JSON, if it is JSON.
    pub fn json(self) -> Option<&'a Value> {
        match self {
            ValRef::Json(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> From<Option<&'a Value>> for ValRef<'a> {
    fn from(v: Option<&'a Value>) -> Self {
        v.map_or(ValRef::Undefined, ValRef::Json)
    }
}

impl<'a> From<&'a Value> for ValRef<'a> {
    fn from(v: &'a Value) -> Self {
        ValRef::Json(v)
    }
}

impl<'a> From<&'a Val> for ValRef<'a> {
    fn from(v: &'a Val) -> Self {
        v.view()
    }
}

/// A number: JSON when finite, else [`Val::NonFinite`] (every `NaN` the same one).
pub fn number(n: f64) -> Val {
    if n.is_nan() {
        return Val::NonFinite(f64::NAN);
    }
    json_number(n).map_or(Val::NonFinite(n), Val::Json)
}

/// A finite number as JSON; `None` if it is not finite.
pub fn json_number(n: f64) -> Option<Value> {
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

/// A JSON number's value as a double (`None` for anything else).
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// A string value.
pub fn string(s: impl Into<String>) -> Option<Value> {
    Some(Value::String(s.into()))
}

/// A boolean value.
pub fn boolean(b: bool) -> Option<Value> {
    Some(Value::Bool(b))
}

/// Cosmos DB's rank of a type in `ORDER BY`: undefined < null < boolean < number < string <
/// array < object.
pub fn type_rank<'a>(v: impl Into<ValRef<'a>>) -> u8 {
    match v.into() {
        ValRef::Undefined => 0,
        ValRef::Json(Value::Null) => 1,
        ValRef::Json(Value::Bool(_)) => 2,
        ValRef::Json(Value::Number(_)) | ValRef::NonFinite(_) => 3,
        ValRef::Json(Value::String(_)) => 4,
        ValRef::Json(Value::Array(_)) => 5,
        ValRef::Json(Value::Object(_)) => 6,
    }
}

/// `a = b`: `undefined` across types or if either side is undefined; arrays and objects compare
/// deeply, numbers by IEEE rules (`NaN` equals nothing, itself included).
pub fn equals<'a, 'b>(a: impl Into<ValRef<'a>>, b: impl Into<ValRef<'b>>) -> Option<bool> {
    let (a, b) = (a.into(), b.into());
    if let (ValRef::Json(x), ValRef::Json(y)) = (a, b) {
        return (type_rank(x) == type_rank(y)).then(|| deep_equal(x, y));
    }
    // A non-finite number, or undefined, on one side: only numbers compare.
    #[allow(clippy::float_cmp, reason = "IEEE equality is the rule")]
    Some(a.as_f64()? == b.as_f64()?)
}

/// Structural equality of JSON, numbers by value (`1 = 1.0`).
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

/// `a < b` and friends, as `test` applied to how `a` orders against `b`: only null, booleans,
/// numbers and strings of the same type compare, anything else is `undefined`; numbers compare
/// by IEEE rules, so every ordering test with a `NaN` is `false`.
pub fn relate<'a, 'b>(
    a: impl Into<ValRef<'a>>,
    b: impl Into<ValRef<'b>>,
    test: fn(Ordering) -> bool,
) -> Option<bool> {
    let (a, b) = (a.into(), b.into());
    if let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) {
        return Some(x.partial_cmp(&y).is_some_and(test));
    }
    compare(a, b).map(test)
}

/// How `a` orders against `b` where both are null, booleans, numbers or strings of one type;
/// `None` (undefined) for anything else, and for numbers a `NaN` leaves unordered (see
/// [`relate`], which tells the two apart).
pub fn compare<'a, 'b>(a: impl Into<ValRef<'a>>, b: impl Into<ValRef<'b>>) -> Option<Ordering> {
    let (a, b) = (a.into(), b.into());
    if let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) {
        return x.partial_cmp(&y);
    }
    match (a.json()?, b.json()?) {
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// How numbers sort: `NaN` first (all `NaN`s tie), then `-Infinity`, the finite numbers and
/// `Infinity`, as .NET's `double.CompareTo` orders them.
pub fn number_order(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => x.total_cmp(&y),
    }
}

/// The total order `ORDER BY` sorts by: type rank first, then within a type by value (numbers
/// by [`number_order`]). Arrays and objects (which Cosmos DB orders by an internal hash) are
/// ordered here element by element and key by key, which is deterministic and documented in
/// the README.
pub fn sort_order<'a, 'b>(a: impl Into<ValRef<'a>>, b: impl Into<ValRef<'b>>) -> Ordering {
    let (a, b) = (a.into(), b.into());
    let rank = type_rank(a).cmp(&type_rank(b));
    if rank != Ordering::Equal {
        return rank;
    }
    if let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) {
        return number_order(x, y);
    }
    match (a.json(), b.json()) {
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (Some(Value::String(x)), Some(Value::String(y))) => x.cmp(y),
        (Some(Value::Array(x)), Some(Value::Array(y))) => x
            .iter()
            .zip(y)
            .map(|(x, y)| sort_order(x, y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Some(Value::Object(x)), Some(Value::Object(y))) => object_order(x, y),
        _ => Ordering::Equal,
    }
}

fn object_order(x: &Map<String, Value>, y: &Map<String, Value>) -> Ordering {
    // serde_json's map iterates in key order.
    for ((kx, vx), (ky, vy)) in x.iter().zip(y) {
        let o = kx.cmp(ky).then_with(|| sort_order(vx, vy));
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
pub fn type_name<'a>(v: impl Into<ValRef<'a>>) -> &'static str {
    match v.into() {
        ValRef::Undefined => "undefined",
        ValRef::Json(Value::Null) => "null",
        ValRef::Json(Value::Bool(_)) => "boolean",
        ValRef::Json(Value::Number(_)) | ValRef::NonFinite(_) => "number",
        ValRef::Json(Value::String(_)) => "string",
        ValRef::Json(Value::Array(_)) => "array",
        ValRef::Json(Value::Object(_)) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const INF: Val = Val::NonFinite(f64::INFINITY);
    const NEG_INF: Val = Val::NonFinite(f64::NEG_INFINITY);
    const NAN: Val = Val::NonFinite(f64::NAN);

    fn j(v: Value) -> Val {
        Val::Json(v)
    }

    #[test]
    fn whole_numbers_are_integers_and_non_finite_stays_a_number() {
        assert_eq!(number(2.0), Some(json!(2)));
        assert_eq!(number(-0.0), Some(json!(0)));
        assert_eq!(number(2.5), Some(json!(2.5)));
        assert_eq!(number(1e300), Some(json!(1e300)));
        assert_eq!(number(f64::INFINITY), INF);
        assert_eq!(number(f64::NEG_INFINITY), NEG_INF);
        assert_eq!(number(-f64::NAN), NAN);
        assert!(matches!(number(-f64::NAN), Val::NonFinite(n) if n.is_sign_positive()));
        assert_eq!(json_number(f64::INFINITY), None);
        assert_eq!(number(f64::NAN).as_f64().map(f64::is_nan), Some(true));
        // Leaving the query, or entering an array or object, a non-finite number is null.
        assert_eq!(INF.into_json_lossy(), Some(json!(null)));
        assert_eq!(Val::Undefined.into_json_lossy(), None);
        assert_eq!(INF.into_json(), None);
        assert_eq!(type_name(&NAN), "number");
        assert_eq!(type_rank(&NEG_INF), type_rank(&json!(1)));
    }

    #[test]
    fn a_value_is_no_larger_than_optional_json() {
        // What every evaluation step moves around: the non-finite numbers cost nothing.
        assert_eq!(
            std::mem::size_of::<Val>(),
            std::mem::size_of::<Option<Value>>()
        );
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
    fn non_finite_numbers_compare_by_ieee_rules() {
        let one = j(json!(1));
        let big = j(json!(1e308));
        assert_eq!(equals(&INF, &INF), Some(true));
        assert_eq!(equals(&INF, &NEG_INF), Some(false));
        assert_eq!(equals(&NAN, &NAN), Some(false));
        assert_eq!(equals(&NAN, &one), Some(false));
        assert_eq!(equals(&INF, &j(json!("Infinity"))), None);
        assert_eq!(equals(&INF, &Val::Undefined), None);
        assert_eq!(relate(&big, &INF, Ordering::is_lt), Some(true));
        assert_eq!(relate(&NEG_INF, &one, Ordering::is_lt), Some(true));
        assert_eq!(relate(&INF, &INF, Ordering::is_le), Some(true));
        for test in [
            Ordering::is_lt,
            Ordering::is_le,
            Ordering::is_gt,
            Ordering::is_ge,
        ] {
            assert_eq!(relate(&NAN, &one, test), Some(false));
            assert_eq!(relate(&one, &NAN, test), Some(false));
            assert_eq!(relate(&NAN, &NAN, test), Some(false));
        }
        assert_eq!(relate(&INF, &j(json!("a")), Ordering::is_lt), None);
        assert_eq!(compare(&NAN, &one), None);
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
            j(json!({"a": 1})),
            j(json!([1])),
            j(json!("a")),
            INF,
            j(json!(2)),
            NAN,
            j(json!(-1.5)),
            NEG_INF,
            j(json!(true)),
            j(json!(false)),
            j(json!(null)),
            Val::Undefined,
        ];
        values.sort_by(|a, b| sort_order(a, b));
        assert_eq!(
            values,
            vec![
                Val::Undefined,
                j(json!(null)),
                j(json!(false)),
                j(json!(true)),
                NAN,
                NEG_INF,
                j(json!(-1.5)),
                j(json!(2)),
                INF,
                j(json!("a")),
                j(json!([1])),
                j(json!({"a": 1})),
            ]
        );
        assert_eq!(sort_order(&NAN, &NAN), Ordering::Equal);
        assert_eq!(
            sort_order(Some(&json!(1)), Some(&json!(1.0))),
            Ordering::Equal
        );
    }
}
