//! Array functions.
//!
//! Values compare as `value::deep_equal` does: deeply, numbers by value (`1` matches `1.0`),
//! never across types (`1` does not match `"1"`). Choices where the reference is silent:
//!
//! - An argument of the wrong type (a non-array where an array belongs, a non-number index, a
//!   non-boolean flag) makes the result `undefined`.
//! - `ARRAY_CONTAINS(arr, v, true)` matches objects partially at the top level: an element
//!   matches if it is an object holding every property of `v` with a deeply equal value.
//!   `Infinity`, `-Infinity` and `NaN` match no element (an array holds JSON, which has none).
//!   `ARRAY_CONTAINS(arr, undefined)` is `undefined`, as a lone `undefined` search value is for
//!   `ARRAY_CONTAINS_ANY`/`ALL` (which follow the reference's examples: an `undefined` search
//!   value is unknown, so `ANY` is `true` if another value matches and `undefined` otherwise,
//!   and `ALL` is `false` if another value is missing and `undefined` otherwise).
//! - `ARRAY_SLICE(arr, start[, length])` truncates its numbers toward zero; a negative start
//!   counts from the end (clamped to the first element), and a negative length gives `[]`.
//!   `Infinity` is past the end and `NaN` counts as 0, as in JavaScript.
//! - `SetIntersect(a, b)` lists the distinct values of `b` that are in `a`, in `b`'s order (as
//!   the reference's `SetIntersect([1, 2, "A", "B"], ["A", 1])` is `["A", 1]`); `SetUnion`
//!   lists the distinct values of `a` then of `b`, in order. `SetDifference(a, b)` lists the
//!   distinct values of `a` that are not in `b`, in `a`'s order; `SetEqual(a, b)` is whether
//!   the two hold the same distinct values.
//! - `ARRAY_SUM`, `ARRAY_AVG` and `ARRAY_MEDIAN` take arrays of numbers only: any other
//!   element (a string, boolean, null, array or object) makes the result `undefined`, as the
//!   reference's examples show (an `undefined` element is left out when the array is built).
//!   `ARRAY_SUM([])` is `0`; `ARRAY_AVG([])` and `ARRAY_MEDIAN([])` are `undefined` (there is
//!   no average of nothing, as for the `AVG` aggregate). A sum past the doubles is `Infinity`.
//!   The median of an even count is the mean of the two middle values.
//! - `ARRAY_MAX` and `ARRAY_MIN` take numbers, strings, booleans and nulls, ordered across
//!   types null < boolean < number < string (the reference's priority order) and within a type
//!   by value (strings by code point, so `"abc"` > `"ABC"`); an array or object element, or an
//!   empty array, gives `undefined`.
//! - `CHOOSE(i, e1, e2, ...)` counts from 1 and truncates a fractional index toward zero; an
//!   index out of range or not a number gives `undefined`. The value chosen is returned as it
//!   is (`CHOOSE(1, 1/0)` is `Infinity`).
//! - `ObjectToArray(obj[, keyName[, valueName]])` lists the object's members in key order (the
//!   order Mayfly keeps members in) as `{"k": name, "v": value}` objects, or with the given
//!   names; a non-object, or a name that is not a string, gives `undefined`. Where both names
//!   are the same, the member holds the value.
//!
//! Each of these walks its arrays (`ARRAY_MEDIAN` also sorts), so each is charged its work in
//! evaluation steps before it runs (see `Function::cost`).

use std::cmp::Ordering;
use std::collections::HashSet;

use serde_json::{Map, Value};

use super::string::{count, int_arg, write_json};
use super::{Context, Function, FunctionError, any_function, costly, costly_any, function};
use crate::value::{
    Val, approximate_size, as_f64, boolean, deep_equal, json_number, number, sort_order,
};

pub(super) const FUNCTIONS: &[Function] = &[
    function("ARRAY_CONCAT", 2, usize::MAX, array_concat),
    function("ARRAY_CONTAINS", 2, 3, array_contains),
    function("ARRAY_CONTAINS_ANY", 2, usize::MAX, |_, a| {
        Ok(contains_many(a, true))
    }),
    function("ARRAY_CONTAINS_ALL", 2, usize::MAX, |_, a| {
        Ok(contains_many(a, false))
    }),
    function("ARRAY_LENGTH", 1, 1, |_, a| {
        Ok(array_arg(a, 0).and_then(|items| json_number(items.len() as f64)))
    }),
    function("ARRAY_SLICE", 2, 3, array_slice),
    function("SetIntersect", 2, 2, set_intersect),
    function("SetUnion", 2, 2, set_union),
    costly("SetDifference", 2, 2, set_difference, size_cost),
    costly("SetEqual", 2, 2, set_equal, size_cost),
    costly_any("ARRAY_SUM", 1, 1, array_sum, length_cost),
    costly_any("ARRAY_AVG", 1, 1, array_avg, length_cost),
    costly_any("ARRAY_MEDIAN", 1, 1, array_median, sort_cost),
    costly(
        "ARRAY_MAX",
        1,
        1,
        |_, a| Ok(extreme(a, Ordering::Greater)),
        length_cost,
    ),
    costly(
        "ARRAY_MIN",
        1,
        1,
        |_, a| Ok(extreme(a, Ordering::Less)),
        length_cost,
    ),
    any_function("CHOOSE", 2, usize::MAX, choose),
    costly("ObjectToArray", 1, 3, object_to_array, size_cost),
];

/// Bytes of an argument's JSON per evaluation step, for the functions that write their
/// arguments out (the set functions compare values by their canonical text).
const BYTES_PER_STEP: u64 = 16;

/// One step per element of the first argument (an array), for the functions that walk it once.
fn length_cost(args: &[Val]) -> u64 {
    array_arg(args, 0).map_or(0, |items| items.len() as u64)
}

/// `n log2 n` steps for sorting the first argument's `n` elements (and one per element).
fn sort_cost(args: &[Val]) -> u64 {
    let n = length_cost(args);
    n.saturating_mul(u64::from(n.max(1).ilog2() + 1))
}

/// One step per [`BYTES_PER_STEP`] of every argument's JSON, and one per top-level element.
fn size_cost(args: &[Val]) -> u64 {
    args.iter()
        .filter_map(Val::json)
        .map(|v| {
            let elements = match v {
                Value::Array(items) => items.len() as u64,
                Value::Object(map) => map.len() as u64,
                _ => 0,
            };
            (approximate_size(v) as u64 / BYTES_PER_STEP).saturating_add(elements)
        })
        .fold(0, u64::saturating_add)
}

/// Argument `i` if it is an array.
fn array_arg(args: &[Val], i: usize) -> Option<&[Value]> {
    match args.get(i)? {
        Val::Json(Value::Array(items)) => Some(items),
        _ => None,
    }
}

fn array_concat(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let mut out = Vec::new();
    for i in 0..args.len() {
        let Some(items) = array_arg(args, i) else {
            return Ok(None);
        };
        out.extend_from_slice(items);
    }
    Ok(Some(Value::Array(out)))
}

/// `ARRAY_CONTAINS(arr, v[, partial])`.
fn array_contains(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(items), Some(wanted)) = (array_arg(args, 0), args.get(1)) else {
        return Ok(None);
    };
    let partial = match args.get(2) {
        None => false,
        Some(Val::Json(Value::Bool(b))) => *b,
        Some(_) => return Ok(None),
    };
    let wanted = match wanted {
        Val::Undefined => return Ok(None),
        // No element is one: arrays hold JSON.
        Val::NonFinite(_) => return Ok(boolean(false)),
        Val::Json(wanted) => wanted,
    };
    Ok(boolean(items.iter().any(|item| {
        match (partial, item, wanted) {
            (true, Value::Object(item), Value::Object(wanted)) => wanted
                .iter()
                .all(|(k, v)| item.get(k).is_some_and(|w| deep_equal(v, w))),
            _ => deep_equal(item, wanted),
        }
    })))
}

/// `ARRAY_CONTAINS_ANY` (`any`) or `ARRAY_CONTAINS_ALL` (`!any`) of `arr, v1, v2, ...`, with
/// an `undefined` search value counting as unknown.
fn contains_many(args: &[Val], any: bool) -> Option<Value> {
    let items = array_arg(args, 0)?;
    let mut unknown = false;
    for wanted in args.iter().skip(1) {
        let found = match wanted {
            Val::Undefined => {
                unknown = true;
                continue;
            }
            // No element is one: arrays hold JSON.
            Val::NonFinite(_) => false,
            Val::Json(wanted) => items.iter().any(|item| deep_equal(item, wanted)),
        };
        if found == any {
            // ANY found one, or ALL missed one: decided.
            return boolean(any);
        }
    }
    if unknown { None } else { boolean(!any) }
}

/// `ARRAY_SLICE(arr, start[, length])`.
fn array_slice(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(items), Some(start)) = (array_arg(args, 0), int_arg(args, 1)) else {
        return Ok(None);
    };
    let length = match args.get(2) {
        None => usize::MAX,
        Some(_) => match int_arg(args, 2) {
            Some(n) => count(n),
            None => return Ok(None),
        },
    };
    let start = if start < 0 {
        items.len().saturating_sub(count(start.saturating_neg()))
    } else {
        count(start)
    };
    let rest = items.get(start..).unwrap_or_default();
    Ok(Some(Value::Array(
        rest.iter().take(length).cloned().collect(),
    )))
}

/// A canonical text for `v`: two values have the same key exactly when they are `deep_equal`.
fn key(v: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, v, true);
    out
}

fn set_intersect(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (array_arg(args, 0), array_arg(args, 1)) else {
        return Ok(None);
    };
    let in_a: HashSet<String> = a.iter().map(key).collect();
    let mut seen = HashSet::new();
    let out = b
        .iter()
        .filter(|v| {
            let k = key(v);
            in_a.contains(&k) && seen.insert(k)
        })
        .cloned()
        .collect();
    Ok(Some(Value::Array(out)))
}

fn set_union(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (array_arg(args, 0), array_arg(args, 1)) else {
        return Ok(None);
    };
    let mut seen = HashSet::new();
    let out = a
        .iter()
        .chain(b)
        .filter(|v| seen.insert(key(v)))
        .cloned()
        .collect();
    Ok(Some(Value::Array(out)))
}

fn set_difference(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (array_arg(args, 0), array_arg(args, 1)) else {
        return Ok(None);
    };
    let in_b: HashSet<String> = b.iter().map(key).collect();
    let mut seen = HashSet::new();
    let out = a
        .iter()
        .filter(|v| {
            let k = key(v);
            !in_b.contains(&k) && seen.insert(k)
        })
        .cloned()
        .collect();
    Ok(Some(Value::Array(out)))
}

fn set_equal(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (array_arg(args, 0), array_arg(args, 1)) else {
        return Ok(None);
    };
    let a: HashSet<String> = a.iter().map(key).collect();
    let b: HashSet<String> = b.iter().map(key).collect();
    Ok(boolean(a == b))
}

/// The first argument's elements as numbers, if it is an array of numbers only.
fn numbers(args: &[Val]) -> Option<Vec<f64>> {
    array_arg(args, 0)?.iter().map(as_f64).collect()
}

/// A sum past the doubles is `Infinity` (`ARRAY_SUM([1e308, 1e308])`), as the `SUM` aggregate.
fn array_sum(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    Ok(numbers(args).map_or(Val::Undefined, |xs| number(xs.iter().sum())))
}

fn array_avg(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(xs) = numbers(args).filter(|xs| !xs.is_empty()) else {
        return Ok(Val::Undefined);
    };
    #[allow(clippy::cast_precision_loss, reason = "an array's length")]
    let n = xs.len() as f64;
    Ok(number(xs.iter().sum::<f64>() / n))
}

fn array_median(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(mut xs) = numbers(args).filter(|xs| !xs.is_empty()) else {
        return Ok(Val::Undefined);
    };
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    let median = if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    };
    Ok(number(median))
}

/// `ARRAY_MAX` (`want` is `Greater`) or `ARRAY_MIN` (`Less`).
fn extreme(args: &[Val], want: Ordering) -> Option<Value> {
    let items = array_arg(args, 0)?;
    let mut best: Option<&Value> = None;
    for item in items {
        if matches!(item, Value::Array(_) | Value::Object(_)) {
            return None;
        }
        if best.is_none_or(|b| sort_order(Some(item), Some(b)) == want) {
            best = Some(item);
        }
    }
    best.cloned()
}

/// `CHOOSE(i, e1, e2, ...)`: `e_i`, counting from 1.
fn choose(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(i) = int_arg(args, 0) else {
        return Ok(Val::Undefined);
    };
    let choices = &args[1..];
    Ok(usize::try_from(i)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| choices.get(i))
        .cloned()
        .unwrap_or_default())
}

/// `ObjectToArray(obj[, keyName[, valueName]])`.
fn object_to_array(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let Some(Val::Json(Value::Object(object))) = args.first() else {
        return Ok(None);
    };
    let name = |i: usize, default: &str| match args.get(i) {
        None => Some(default.to_owned()),
        Some(Val::Json(Value::String(s))) => Some(s.clone()),
        Some(_) => None,
    };
    let (Some(k), Some(v)) = (name(1, "k"), name(2, "v")) else {
        return Ok(None);
    };
    let out = object
        .iter()
        .map(|(key, value)| {
            let mut pair = Map::new();
            pair.insert(k.clone(), Value::String(key.clone()));
            pair.insert(v.clone(), value.clone());
            Value::Object(pair)
        })
        .collect();
    Ok(Some(Value::Array(out)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::lookup;
    use super::*;

    fn call(name: &str, args: &[Option<Value>]) -> Option<Value> {
        let f = lookup(name).expect("known function");
        assert!(
            args.len() >= f.min_args && args.len() <= f.max_args,
            "{name} arity"
        );
        super::super::call_json(f, &Context::new(0, 1), args).expect("no error")
    }

    fn v(value: Value) -> Option<Value> {
        Some(value)
    }

    #[test]
    fn concat_and_length() {
        // The reference's examples.
        let args = [v(json!(["apples", "strawberries"])), v(json!(["bananas"]))];
        let expected = json!(["apples", "strawberries", "bananas"]);
        assert_eq!(call("ARRAY_CONCAT", &args), v(expected));
        assert_eq!(
            call("ARRAY_LENGTH", &[v(json!([70, 86, 92, 99, 85, 90, 82]))]),
            v(json!(7))
        );
        assert_eq!(call("ARRAY_LENGTH", &[v(json!([]))]), v(json!(0)));
        assert_eq!(call("ARRAY_LENGTH", &[v(json!(null))]), None);
        // Edges.
        let args = [v(json!([])), v(json!([1])), v(json!([[2], {"a": 3}]))];
        assert_eq!(call("array_concat", &args), v(json!([1, [2], {"a": 3}])));
        assert_eq!(call("ARRAY_CONCAT", &[v(json!([1])), v(json!("2"))]), None);
        assert_eq!(call("ARRAY_CONCAT", &[None, v(json!([1]))]), None);
        assert_eq!(call("ARRAY_LENGTH", &[None]), None);
        assert_eq!(call("ARRAY_LENGTH", &[v(json!("abc"))]), None);
        assert_eq!(call("ARRAY_LENGTH", &[v(json!({"length": 1}))]), None);
    }

    #[test]
    fn array_contains() {
        // The reference's examples.
        let clothes = v(json!(["coats", "jackets", "sweatshirts"]));
        assert_eq!(
            call("ARRAY_CONTAINS", &[clothes.clone(), v(json!("coats"))]),
            boolean(true)
        );
        assert_eq!(
            call("ARRAY_CONTAINS", &[clothes, v(json!("hoodies"))]),
            boolean(false)
        );
        let shirts = v(json!([{ "category": "shirts", "color": "blue" }]));
        let full = v(json!({ "category": "shirts", "color": "blue" }));
        let part = v(json!({ "category": "shirts" }));
        let other = v(json!({ "category": "shorts", "color": "blue" }));
        let yes = v(json!(true));
        assert_eq!(
            call("ARRAY_CONTAINS", &[shirts.clone(), full]),
            boolean(true)
        );
        assert_eq!(
            call("ARRAY_CONTAINS", &[shirts.clone(), part.clone()]),
            boolean(false)
        );
        let args = [shirts.clone(), part.clone(), yes.clone()];
        assert_eq!(call("ARRAY_CONTAINS", &args), boolean(true));
        let args = [shirts.clone(), other, yes.clone()];
        assert_eq!(call("ARRAY_CONTAINS", &args), boolean(false));
        // Numbers by value, never across types; deep values; partial only for objects.
        let mixed = v(json!([1.0, "2", [3, {"a": 4}], null]));
        assert_eq!(
            call("ARRAY_CONTAINS", &[mixed.clone(), v(json!(1))]),
            boolean(true)
        );
        assert_eq!(
            call("ARRAY_CONTAINS", &[mixed.clone(), v(json!(2))]),
            boolean(false)
        );
        let deep = v(json!([3.0, {"a": 4.0}]));
        assert_eq!(
            call("ARRAY_CONTAINS", &[mixed.clone(), deep]),
            boolean(true)
        );
        assert_eq!(
            call("ARRAY_CONTAINS", &[mixed.clone(), v(json!(null))]),
            boolean(true)
        );
        let args = [mixed.clone(), v(json!([3])), yes.clone()];
        assert_eq!(call("ARRAY_CONTAINS", &args), boolean(false));
        assert_eq!(
            call("ARRAY_CONTAINS", &[v(json!([])), v(json!(1))]),
            boolean(false)
        );
        let args = [v(json!([{"a": 1}])), v(json!({})), yes];
        assert_eq!(call("ARRAY_CONTAINS", &args), boolean(true));
        // Wrong types and undefined.
        assert_eq!(call("ARRAY_CONTAINS", &[mixed.clone(), None]), None);
        assert_eq!(
            call("ARRAY_CONTAINS", &[v(json!("1")), v(json!("1"))]),
            None
        );
        assert_eq!(
            call("ARRAY_CONTAINS", &[mixed.clone(), v(json!(1)), v(json!(1))]),
            None
        );
        assert_eq!(call("ARRAY_CONTAINS", &[mixed, v(json!(1)), None]), None);
    }

    #[test]
    fn contains_any_and_all() {
        // The reference's examples, run through both functions: (arguments, ANY, ALL).
        let cases = [
            (
                vec![
                    v(json!([1, true, "3", [1, 2, 3]])),
                    v(json!(1)),
                    v(json!(true)),
                    v(json!("3")),
                    v(json!([1, 2, 3])),
                ],
                boolean(true),
                boolean(true),
            ),
            (
                vec![
                    v(json!([1, 2, 3, 4])),
                    v(json!(2)),
                    v(json!(3)),
                    v(json!(4)),
                    v(json!(5)),
                ],
                boolean(true),
                boolean(false),
            ),
            (
                vec![v(json!([1, 2, 3, 4])), v(json!(1)), None],
                boolean(true),
                None,
            ),
            (
                vec![
                    v(json!([1, 2, 3, 4])),
                    v(json!(5)),
                    v(json!(6)),
                    v(json!(7)),
                ],
                boolean(false),
                boolean(false),
            ),
            (
                vec![v(json!([])), v(json!(1)), v(json!(2)), v(json!(3))],
                boolean(false),
                boolean(false),
            ),
            (
                vec![v(json!([1, 2, 3, 4])), v(json!(5)), None],
                None,
                boolean(false),
            ),
        ];
        for (args, any, all) in cases {
            assert_eq!(call("ARRAY_CONTAINS_ANY", &args), any, "ANY {args:?}");
            assert_eq!(call("ARRAY_CONTAINS_ALL", &args), all, "ALL {args:?}");
        }
        // Edges: numbers by value, a lone undefined, a non-array.
        let args = [
            v(json!([1.5, {"a": [1]}])),
            v(json!({"a": [1.0]})),
            v(json!(1.5)),
        ];
        assert_eq!(call("ARRAY_CONTAINS_ALL", &args), boolean(true));
        assert_eq!(call("ARRAY_CONTAINS_ANY", &[v(json!([1])), None]), None);
        assert_eq!(call("ARRAY_CONTAINS_ALL", &[v(json!([1])), None]), None);
        assert_eq!(
            call("ARRAY_CONTAINS_ANY", &[v(json!({"a": 1})), v(json!(1))]),
            None
        );
        assert_eq!(call("ARRAY_CONTAINS_ALL", &[None, v(json!(1))]), None);
    }

    #[test]
    fn array_slice() {
        // The reference's examples.
        let scores = v(json!([70, 86, 92, 99, 85, 90, 82]));
        let slice = |args: &[f64]| {
            let mut all = vec![scores.clone()];
            all.extend(args.iter().map(|&x| json_number(x)));
            call("ARRAY_SLICE", &all)
        };
        assert_eq!(slice(&[0.0]), scores.clone());
        assert_eq!(slice(&[1.0]), v(json!([86, 92, 99, 85, 90, 82])));
        assert_eq!(slice(&[-1.0]), v(json!([82])));
        assert_eq!(slice(&[-2.0]), v(json!([90, 82])));
        assert_eq!(slice(&[0.0, 3.0]), v(json!([70, 86, 92])));
        assert_eq!(slice(&[0.0, 12.0]), scores.clone());
        assert_eq!(slice(&[3.0, 5.0]), v(json!([99, 85, 90, 82])));
        assert_eq!(slice(&[-2.0, 1.0]), v(json!([90])));
        // Edges: out of range, negative length, fractions, huge values.
        assert_eq!(slice(&[7.0]), v(json!([])));
        assert_eq!(slice(&[100.0, 2.0]), v(json!([])));
        assert_eq!(slice(&[-100.0, 2.0]), v(json!([70, 86])));
        assert_eq!(slice(&[1.0, 0.0]), v(json!([])));
        assert_eq!(slice(&[1.0, -100.0]), v(json!([])));
        assert_eq!(slice(&[1.9, 1.9]), v(json!([86])));
        assert_eq!(slice(&[-1.9]), v(json!([82])));
        assert_eq!(slice(&[1e300, 1e300]), v(json!([])));
        assert_eq!(slice(&[-1e300, 1e300]), scores.clone());
        assert_eq!(slice(&[f64::MIN, 1.0]), v(json!([70])));
        assert_eq!(
            call("ARRAY_SLICE", &[v(json!([])), json_number(-1.0)]),
            v(json!([]))
        );
        // Wrong types.
        assert_eq!(call("ARRAY_SLICE", &[scores.clone(), v(json!("1"))]), None);
        assert_eq!(
            call("ARRAY_SLICE", &[scores.clone(), json_number(1.0), None]),
            None
        );
        assert_eq!(
            call("ARRAY_SLICE", &[v(json!("abc")), json_number(1.0)]),
            None
        );
        assert_eq!(call("ARRAY_SLICE", &[None, json_number(1.0)]), None);
    }

    #[test]
    fn set_intersect_and_union() {
        // The reference's examples: (a, b, SetIntersect, SetUnion).
        let cases = [
            (
                json!([1, 2, 3, 4]),
                json!([3, 4, 5, 6]),
                json!([3, 4]),
                json!([1, 2, 3, 4, 5, 6]),
            ),
            (
                json!([1, 2, 3, 4]),
                json!([]),
                json!([]),
                json!([1, 2, 3, 4]),
            ),
            (
                json!([1, 2, 3, 4]),
                json!([1, 1, 1, 1]),
                json!([1]),
                json!([1, 2, 3, 4]),
            ),
            (
                json!([1, 2, 3, 4]),
                json!(["A", "B"]),
                json!([]),
                json!([1, 2, 3, 4, "A", "B"]),
            ),
            (
                json!([1, 2, "A", "B"]),
                json!(["A", 1]),
                json!(["A", 1]),
                json!([1, 2, "A", "B"]),
            ),
            (
                json!(["Cutty Sark", "Horizon", "Russet", "Fuscous"]),
                json!(["Fuscous", "Horizon", "Tacha"]),
                json!(["Fuscous", "Horizon"]),
                json!(["Cutty Sark", "Horizon", "Russet", "Fuscous", "Tacha"]),
            ),
        ];
        for (a, b, intersect, union) in cases {
            let args = [v(a), v(b)];
            assert_eq!(call("SetIntersect", &args), v(intersect), "{args:?}");
            assert_eq!(call("SETUNION", &args), v(union), "{args:?}");
        }
        // Distinct by deep equality: numbers by value, objects whatever their key order, and
        // never across types.
        let a = v(json!([1, 1.0, {"x": 1, "y": [2]}, "1", null, [null]]));
        let b = v(json!([{"y": [2.0], "x": 1.0}, 1.0, -0.0, "1", [null], null, true]));
        let expected = json!([{"y": [2.0], "x": 1.0}, 1.0, "1", [null], null]);
        assert_eq!(call("SetIntersect", &[a.clone(), b.clone()]), v(expected));
        let expected = json!([1, {"x": 1, "y": [2]}, "1", null, [null], -0.0, true]);
        assert_eq!(call("SetUnion", &[a.clone(), b]), v(expected));
        assert_eq!(
            call("SetUnion", &[v(json!([0])), v(json!([-0.0]))]),
            v(json!([0]))
        );
        // Wrong types.
        assert_eq!(call("SetIntersect", &[a.clone(), None]), None);
        assert_eq!(call("SetUnion", &[v(json!({})), a]), None);
    }

    #[test]
    fn numeric_reductions() {
        let xs = [v(json!([3, 1.5, -2, 10]))];
        assert_eq!(call("ARRAY_SUM", &xs), v(json!(12.5)));
        assert_eq!(call("ARRAY_AVG", &xs), v(json!(3.125)));
        assert_eq!(call("ARRAY_MEDIAN", &xs), v(json!(2.25)));
        assert_eq!(call("ARRAY_MAX", &xs), v(json!(10)));
        assert_eq!(call("ARRAY_MIN", &xs), v(json!(-2)));
        // Past the doubles: Infinity, as the aggregates give (never a panic).
        let inf = crate::value::Val::NonFinite(f64::INFINITY);
        let huge = [crate::value::Val::Json(json!([1e308, 1e308]))];
        let call_any = |name: &str| {
            let f = lookup(name).expect("known function");
            f.invoke(&Context::new(0, 1), &huge).expect("no error")
        };
        assert_eq!(call_any("ARRAY_SUM"), inf);
        assert_eq!(call_any("ARRAY_AVG"), inf);
        assert_eq!(call_any("ARRAY_MEDIAN"), inf);
        assert_eq!(
            call("ARRAY_MAX", &[v(json!([1e308, 1e308]))]),
            v(json!(1e308))
        );
    }

    #[test]
    fn non_finite_arguments() {
        use crate::value::Val;
        let call_any = |name: &str, args: &[Val]| {
            let f = lookup(name).expect("known function");
            f.invoke(&Context::new(0, 1), args).expect("no error")
        };
        let (inf, nan) = (Val::NonFinite(f64::INFINITY), Val::NonFinite(f64::NAN));
        let arr = Val::Json(json!([1, null, 2]));
        // No element of an array is one, so none is found; an index of Infinity is past the
        // end, NaN is 0 (as in JavaScript).
        let f = Some(json!(false));
        assert_eq!(call_any("ARRAY_CONTAINS", &[arr.clone(), inf.clone()]), f);
        assert_eq!(call_any("ARRAY_CONTAINS", &[arr.clone(), nan.clone()]), f);
        let any = [arr.clone(), nan.clone(), Val::Json(json!(2))];
        assert_eq!(call_any("ARRAY_CONTAINS_ANY", &any), Some(json!(true)));
        assert_eq!(call_any("ARRAY_CONTAINS_ALL", &any), f);
        let slice = [arr.clone(), Val::Json(json!(1)), inf.clone()];
        assert_eq!(call_any("ARRAY_SLICE", &slice), Some(json!([null, 2])));
        let slice = [arr.clone(), nan.clone()];
        assert_eq!(call_any("ARRAY_SLICE", &slice), Some(json!([1, null, 2])));
        // CHOOSE hands its choice back as it is.
        let choose = [Val::Json(json!(2)), Val::Json(json!("a")), inf.clone()];
        assert_eq!(call_any("CHOOSE", &choose), inf);
        assert_eq!(call_any("CHOOSE", &[inf.clone(), nan.clone()]), None);
        assert_eq!(call_any("ARRAY_LENGTH", &[inf]), None);
    }

    #[test]
    fn costs_grow_with_the_arrays() {
        let f = lookup("ARRAY_MEDIAN").expect("known");
        let median_cost = f.cost.expect("costly");
        let cost = |args: &[Option<Value>]| {
            let args: Vec<crate::value::Val> = args.iter().cloned().map(Into::into).collect();
            median_cost(&args)
        };
        assert_eq!(cost(&[v(json!([]))]), 0);
        assert_eq!(cost(&[v(json!([1]))]), 1);
        let big: Vec<Value> = (0..1024).map(|i| json!(i)).collect();
        assert_eq!(cost(&[v(Value::Array(big))]), 1024 * 11);
        assert_eq!(cost(&[None]), 0);
        for name in [
            "ARRAY_SUM",
            "ARRAY_AVG",
            "ARRAY_MAX",
            "ARRAY_MIN",
            "SetDifference",
            "SetEqual",
            "ObjectToArray",
        ] {
            let cost = lookup(name).and_then(|f| f.cost).expect(name);
            let args = [json!([1, 2, 3]).into(), json!([4]).into()];
            assert!(cost(&args) >= 3, "{name}");
        }
    }
}
