//! Type checking functions, and `IIF`.
//!
//! - **`IS_NUMBER`** and **`IS_PRIMITIVE`** are `true` for `Infinity`, `-Infinity` and `NaN`
//!   too (`IS_NUMBER(1/0)`): they are numbers while a query computes.
//! - **`IS_FINITE_NUMBER`** is `true` for a finite number and `false` for anything else
//!   (`Infinity`, `NaN`, a non-number or `undefined`).
//! - **`IS_INTEGER`** is `true` for a number with no fractional part from -2^63 through 2^63,
//!   `false` for anything else (`Infinity` and `NaN` included). Numbers in queries are doubles, so the literal
//!   `9223372036854775807` (the largest 64-bit integer, which the reference says is an
//!   integer) is read as 2^63 and counts as one; `18446744073709551615` is 2^64 and does not.
//!   A document's integers beyond a double's precision are judged exactly.
//! - **`IS_DATETIME`** is `true` for a string the date and time functions accept (the format
//!   the reference's `IS_DATETIME` page lists), `false` for anything else.

use serde_json::{Number, Value};

use super::{Context, Function, FunctionError, any_function, function};
use crate::value::{Val, boolean};

pub(super) const FUNCTIONS: &[Function] = &[
    unary("IS_ARRAY", |_, a| {
        Ok(boolean(matches!(a[0], Val::Json(Value::Array(_)))))
    }),
    unary("IS_BOOL", |_, a| {
        Ok(boolean(matches!(a[0], Val::Json(Value::Bool(_)))))
    }),
    unary("IS_DEFINED", |_, a| Ok(boolean(a[0].is_defined()))),
    unary("IS_NULL", |_, a| {
        Ok(boolean(matches!(a[0], Val::Json(Value::Null))))
    }),
    // `Infinity`, `-Infinity` and `NaN` are numbers.
    unary("IS_NUMBER", |_, a| Ok(boolean(a[0].as_f64().is_some()))),
    unary("IS_OBJECT", |_, a| {
        Ok(boolean(matches!(a[0], Val::Json(Value::Object(_)))))
    }),
    unary("IS_PRIMITIVE", |_, a| {
        Ok(boolean(matches!(
            a[0],
            Val::Json(Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_))
                | Val::NonFinite(_)
        )))
    }),
    unary("IS_STRING", |_, a| {
        Ok(boolean(matches!(a[0], Val::Json(Value::String(_)))))
    }),
    unary("IS_FINITE_NUMBER", |_, a| {
        Ok(boolean(a[0].as_f64().is_some_and(f64::is_finite)))
    }),
    unary("IS_INTEGER", |_, a| {
        Ok(boolean(
            matches!(&a[0], Val::Json(Value::Number(n)) if is_integer(n)),
        ))
    }),
    unary("IS_DATETIME", |_, a| {
        Ok(boolean(matches!(
            &a[0],
            Val::Json(Value::String(s)) if super::datetime::parse(s).is_some()
        )))
    }),
    any_function("IIF", 3, 3, iif),
];

/// 2^63, the first double past the 64-bit integers.
const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;

/// Whether `n` is a whole number in the 64-bit range (see the module's notes for 2^63).
fn is_integer(n: &Number) -> bool {
    if n.is_i64() {
        return true;
    }
    if let Some(u) = n.as_u64() {
        return i64::try_from(u).is_ok();
    }
    n.as_f64()
        .is_some_and(|x| x.fract() == 0.0 && (-TWO_TO_63..=TWO_TO_63).contains(&x))
}

const fn unary(
    name: &'static str,
    call: fn(&Context, &[Val]) -> Result<Option<Value>, FunctionError>,
) -> Function {
    function(name, 1, 1, call)
}

/// `IIF(condition, a, b)`: `a` if the condition is exactly `true`, else `b` (a non-boolean
/// condition picks `b`).
fn iif(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    Ok(if args[0] == Val::Json(Value::Bool(true)) {
        args[1].clone()
    } else {
        args[2].clone()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::lookup;
    use super::*;

    fn call(name: &str, args: &[Option<Value>]) -> Val {
        let args: Vec<Val> = args.iter().cloned().map(Val::from).collect();
        call_val(name, &args)
    }

    fn call_val(name: &str, args: &[Val]) -> Val {
        let f = lookup(name).expect("known function");
        f.invoke(&Context::new(0, 1), args).expect("no error")
    }

    #[test]
    fn type_tests() {
        assert_eq!(call("IS_ARRAY", &[Some(json!([]))]), Some(json!(true)));
        assert_eq!(call("IS_ARRAY", &[None]), Some(json!(false)));
        assert_eq!(call("IS_DEFINED", &[Some(json!(null))]), Some(json!(true)));
        assert_eq!(call("IS_DEFINED", &[None]), Some(json!(false)));
        assert_eq!(call("IS_PRIMITIVE", &[Some(json!("x"))]), Some(json!(true)));
        assert_eq!(call("IS_PRIMITIVE", &[Some(json!({}))]), Some(json!(false)));
        assert_eq!(call("IS_NULL", &[None]), Some(json!(false)));
    }

    #[test]
    fn finite_integer_and_date_time_tests() {
        let t = Some(json!(true));
        let f = Some(json!(false));
        assert_eq!(call("IS_FINITE_NUMBER", &[Some(json!(1234.567))]), t);
        assert_eq!(call("IS_FINITE_NUMBER", &[Some(json!("1"))]), f);
        assert_eq!(call("IS_FINITE_NUMBER", &[None]), f);
        assert_eq!(call("IS_INTEGER", &[Some(json!(3454.123))]), f);
        assert_eq!(call("IS_INTEGER", &[Some(json!(5523432))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!(i64::MIN))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!(i64::MAX))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!(u64::MAX))]), f);
        assert_eq!(call("IS_INTEGER", &[Some(json!(1u64 << 63))]), f);
        assert_eq!(call("IS_INTEGER", &[Some(json!(TWO_TO_63))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!(-TWO_TO_63))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!(2.0 * TWO_TO_63))]), f);
        assert_eq!(call("IS_INTEGER", &[Some(json!(5.0))]), t);
        assert_eq!(call("IS_INTEGER", &[Some(json!("5"))]), f);
        assert_eq!(call("IS_INTEGER", &[None]), f);
        for (text, expected) in [
            ("2024-12-12", true),
            ("2024-12-12Z", true),
            ("2024-12-12 20:21:25", true),
            ("2024-12-12T20:21:25Z", true),
            ("2024-12-12T20:21:25.123", true),
            ("2024-12-12 20:21:25.123Z", true),
            ("2024-12-12T20Z", false),
            ("2024-12-12 20:21:25.", false),
        ] {
            let got = call("IS_DATETIME", &[Some(json!(text))]);
            assert_eq!(got, Some(json!(expected)), "{text}");
        }
        assert_eq!(call("IS_DATETIME", &[Some(json!(20241212))]), f);
        assert_eq!(call("IS_DATETIME", &[None]), f);
    }

    #[test]
    fn non_finite_numbers_are_numbers_but_not_finite_or_integers() {
        let (t, f) = (Some(json!(true)), Some(json!(false)));
        for x in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let v = [Val::NonFinite(x)];
            assert_eq!(call_val("IS_NUMBER", &v), t, "{x}");
            assert_eq!(call_val("IS_PRIMITIVE", &v), t, "{x}");
            assert_eq!(call_val("IS_DEFINED", &v), t, "{x}");
            assert_eq!(call_val("IS_FINITE_NUMBER", &v), f, "{x}");
            assert_eq!(call_val("IS_INTEGER", &v), f, "{x}");
            assert_eq!(call_val("IS_NULL", &v), f, "{x}");
            assert_eq!(call_val("IS_STRING", &v), f, "{x}");
        }
        let inf = Val::NonFinite(f64::INFINITY);
        let picked = call_val(
            "IIF",
            &[Val::Json(json!(true)), inf.clone(), Val::Undefined],
        );
        assert_eq!(picked, inf);
    }

    #[test]
    fn iif_takes_only_true() {
        let (a, b) = (Some(json!("a")), Some(json!("b")));
        assert_eq!(call("IIF", &[Some(json!(true)), a.clone(), b.clone()]), a);
        assert_eq!(call("IIF", &[Some(json!(1)), a.clone(), b.clone()]), b);
        assert_eq!(call("IIF", &[None, a, b.clone()]), b);
    }
}
