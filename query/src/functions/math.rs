//! Mathematical functions (`ABS` ... `TRUNC`, `NumberBin`) and the 64-bit integer family
//! (`IntAdd` ... `IntSub`).
//!
//! Every argument must be a number; anything else (undefined, null, a string ...) makes the
//! result `undefined`. They compute in IEEE doubles, so a result may be a number JSON cannot
//! hold (`SQRT(-1)` is `NaN`, `LOG(0)` is `-Infinity`, `POWER(10, 400)` is `Infinity`), and
//! they take such numbers as arguments (`ABS(-Infinity)` is `Infinity`, `FLOOR(NaN)` is
//! `NaN`); see `value` for how those numbers behave and are returned.
//!
//! The `Int*` functions work on signed 64-bit integers as the Cosmos DB reference describes:
//! an argument that is not a whole number within the `i64` range (`Infinity` and `NaN` are
//! not) gives `undefined`, overflow
//! wraps around (two's complement, as C++ does in practice), and their results are exact JSON
//! integers even beyond ±2^53.

use serde_json::Value;

use super::{Context, Function, FunctionError, any_function, function};
use crate::value::{Val, number};

pub(super) const FUNCTIONS: &[Function] = &[
    any_function("ABS", 1, 1, |_, a| Ok(unary(a, f64::abs))),
    any_function("ACOS", 1, 1, |_, a| Ok(unary(a, f64::acos))),
    any_function("ASIN", 1, 1, |_, a| Ok(unary(a, f64::asin))),
    any_function("ATAN", 1, 1, |_, a| Ok(unary(a, f64::atan))),
    // ATN2(y, x): the reference's example ATN2(35.175643, 129.44) = 0.265344532064832 is
    // atan2(35.175643, 129.44).
    any_function("ATN2", 2, 2, |_, a| Ok(binary(a, f64::atan2))),
    any_function("CEILING", 1, 1, |_, a| Ok(unary(a, f64::ceil))),
    any_function("COS", 1, 1, |_, a| Ok(unary(a, f64::cos))),
    any_function("COT", 1, 1, |_, a| Ok(unary(a, |x| 1.0 / x.tan()))),
    any_function("DEGREES", 1, 1, |_, a| Ok(unary(a, f64::to_degrees))),
    any_function("EXP", 1, 1, |_, a| Ok(unary(a, f64::exp))),
    any_function("FLOOR", 1, 1, |_, a| Ok(unary(a, f64::floor))),
    any_function("LOG", 1, 2, log),
    any_function("LOG10", 1, 1, |_, a| Ok(unary(a, f64::log10))),
    any_function("PI", 0, 0, |_, _| Ok(number(std::f64::consts::PI))),
    any_function("POWER", 2, 2, |_, a| Ok(binary(a, f64::powf))),
    any_function("RADIANS", 1, 1, |_, a| Ok(unary(a, f64::to_radians))),
    any_function("RAND", 0, 0, rand),
    any_function("ROUND", 1, 2, round),
    any_function("SIGN", 1, 1, |_, a| Ok(unary(a, sign))),
    any_function("SIN", 1, 1, |_, a| Ok(unary(a, f64::sin))),
    any_function("SQRT", 1, 1, |_, a| Ok(unary(a, f64::sqrt))),
    any_function("SQUARE", 1, 1, |_, a| Ok(unary(a, |x| x * x))),
    any_function("TAN", 1, 1, |_, a| Ok(unary(a, f64::tan))),
    any_function("TRUNC", 1, 1, |_, a| Ok(unary(a, f64::trunc))),
    any_function("NumberBin", 1, 2, number_bin),
    function("IntAdd", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x.wrapping_add(y))))
    }),
    function("IntBitAnd", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x & y)))
    }),
    function("IntBitLeftShift", 2, 2, |_, a| {
        Ok(int_binary(a, shift_left))
    }),
    function("IntBitNot", 1, 1, |_, a| {
        Ok(int_result(int_arg(&a[0]).map(|x| !x)))
    }),
    function("IntBitOr", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x | y)))
    }),
    function("IntBitRightShift", 2, 2, |_, a| {
        Ok(int_binary(a, shift_right))
    }),
    function("IntBitXor", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x ^ y)))
    }),
    // Division by zero is undefined; i64::MIN / -1 wraps to i64::MIN.
    function("IntDiv", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| (y != 0).then(|| x.wrapping_div(y))))
    }),
    // The remainder takes the dividend's sign, as in C++: IntMod(-12, 5) = -2.
    function("IntMod", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| (y != 0).then(|| x.wrapping_rem(y))))
    }),
    function("IntMul", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x.wrapping_mul(y))))
    }),
    function("IntSub", 2, 2, |_, a| {
        Ok(int_binary(a, |x, y| Some(x.wrapping_sub(y))))
    }),
];

/// A number argument as a double, finite or not; `None` for anything else.
fn num(v: &Val) -> Option<f64> {
    v.as_f64()
}

fn unary(args: &[Val], f: fn(f64) -> f64) -> Val {
    num(&args[0]).map_or(Val::Undefined, |x| number(f(x)))
}

fn binary(args: &[Val], f: fn(f64, f64) -> f64) -> Val {
    match (num(&args[0]), num(&args[1])) {
        (Some(x), Some(y)) => number(f(x, y)),
        _ => Val::Undefined,
    }
}

/// `SIGN`: -1, 0 or 1 (and 0 for -0; `NaN` for `NaN`, as JavaScript's `Math.sign`).
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x.is_nan() {
        x
    } else {
        0.0
    }
}

/// `LOG(n [, base])`: the natural logarithm, or the logarithm in `base`. Bases 10 and 2 use
/// the exact library functions (`LOG(2, 10)` = `LOG10(2)` = 0.3010299956639812, as the
/// reference shows; `LOG(8, 2)` = 3 exactly).
fn log(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(x) = num(&args[0]) else {
        return Ok(Val::Undefined);
    };
    let Some(base) = args.get(1) else {
        return Ok(number(x.ln()));
    };
    let Some(base) = num(base) else {
        return Ok(Val::Undefined);
    };
    #[allow(clippy::float_cmp, reason = "exact bases with exact library functions")]
    let result = if base == 10.0 {
        x.log10()
    } else if base == 2.0 {
        x.log2()
    } else {
        x.ln() / base.ln()
    };
    Ok(number(result))
}

/// `RAND()`: a double in [0, 1) from xorshift64* over the query's generator state.
fn rand(ctx: &Context, _: &[Val]) -> Result<Val, FunctionError> {
    let mut x = ctx.rand_state.get();
    if x == 0 {
        // The state is never zero when built by `Context::new`; keep the generator alive anyway.
        x = 0x9E37_79B9_7F4A_7C15;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    ctx.rand_state.set(x);
    let out = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
    // The top 53 bits, scaled to [0, 1): exact in a double.
    #[allow(clippy::cast_precision_loss, reason = "53 bits fit a double exactly")]
    let r = (out >> 11) as f64 / (1u64 << 53) as f64;
    Ok(number(r))
}

/// Rounds half away from zero (`f64::round`), the rule the reference states for `ROUND`.
fn round_half_away(x: f64) -> f64 {
    x.round()
}

/// `ROUND(n [, precision])`: to the nearest integer, midpoints away from zero; with a
/// precision, to that many decimal places (negative: to tens, hundreds, ...). The precision
/// must be a whole number (not `Infinity` or `NaN`), else the result is undefined.
fn round(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(x) = num(&args[0]) else {
        return Ok(Val::Undefined);
    };
    let precision = match args.get(1) {
        None => 0.0,
        Some(p) => match num(p) {
            Some(p) if p.fract() == 0.0 => p,
            _ => return Ok(Val::Undefined),
        },
    };
    Ok(number(round_to(x, precision)))
}

fn round_to(x: f64, precision: f64) -> f64 {
    if precision == 0.0 {
        return round_half_away(x);
    }
    if precision > 0.0 {
        // A double has at most 17 significant digits; past 2^52 it has no fraction at all.
        if precision > 22.0 || x.abs() >= 4_503_599_627_370_496.0 {
            return x;
        }
        let scale = 10f64.powf(precision);
        let scaled = x * scale;
        if !scaled.is_finite() {
            return x;
        }
        round_half_away(scaled) / scale
    } else {
        if precision < -308.0 {
            return 0.0;
        }
        let scale = 10f64.powf(-precision);
        round_half_away(x / scale) * scale
    }
}

/// `NumberBin(n [, binSize])`: `n` rounded down to a multiple of `binSize` (default 1), i.e.
/// `FLOOR(n / binSize) * binSize`; a bin size of 0 gives undefined.
fn number_bin(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    let Some(x) = num(&args[0]) else {
        return Ok(Val::Undefined);
    };
    let bin = match args.get(1) {
        None => 1.0,
        Some(b) => match num(b) {
            Some(b) if b != 0.0 => b,
            _ => return Ok(Val::Undefined),
        },
    };
    Ok(number((x / bin).floor() * bin))
}

/// An `Int*` argument: a whole number within the `i64` range, else `None`. Also the rule for
/// the integer arguments of the date and time functions.
pub(super) fn int_arg(v: &Val) -> Option<i64> {
    let Val::Json(Value::Number(n)) = v else {
        return None;
    };
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    if n.is_u64() {
        // Above i64::MAX.
        return None;
    }
    let f = n.as_f64()?;
    // -2^63 ≤ f < 2^63: the doubles that convert to an i64 exactly (when whole).
    if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f)
    {
        #[allow(clippy::cast_possible_truncation, reason = "whole and in range")]
        return Some(f as i64);
    }
    None
}

/// An `Int*` result: an exact JSON integer.
pub(super) fn int_result(i: Option<i64>) -> Option<Value> {
    i.map(|i| Value::Number(i.into()))
}

fn int_binary(args: &[Val], f: fn(i64, i64) -> Option<i64>) -> Option<Value> {
    let (x, y) = (int_arg(&args[0])?, int_arg(&args[1])?);
    int_result(f(x, y))
}

/// `IntBitLeftShift`: shift amounts outside 0..=63 (undefined behavior in C++) give undefined.
fn shift_left(x: i64, n: i64) -> Option<i64> {
    let n = u32::try_from(n).ok().filter(|&n| n < 64)?;
    Some(x << n)
}

/// `IntBitRightShift`: arithmetic (sign-extending), as C++ compilers do for signed values;
/// shift amounts outside 0..=63 give undefined.
fn shift_right(x: i64, n: i64) -> Option<i64> {
    let n = u32::try_from(n).ok().filter(|&n| n < 64)?;
    Some(x >> n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::lookup;
    use super::*;

    fn call_with(ctx: &Context, name: &str, args: &[Val]) -> Val {
        let f = lookup(name).expect("known function");
        assert!(
            (f.min_args..=f.max_args).contains(&args.len()),
            "{name} arity"
        );
        f.invoke(ctx, args).expect("no error")
    }

    /// A call with JSON (or undefined) arguments.
    fn call(name: &str, args: &[Option<Value>]) -> Val {
        let args: Vec<Val> = args.iter().cloned().map(Val::from).collect();
        call_with(&Context::new(0, 1), name, &args)
    }

    fn call_val(name: &str, args: &[Val]) -> Val {
        call_with(&Context::new(0, 1), name, args)
    }

    fn n(x: f64) -> Option<Value> {
        crate::value::json_number(x)
    }

    fn i(x: i64) -> Option<Value> {
        Some(json!(x))
    }

    const INF: Val = Val::NonFinite(f64::INFINITY);
    const NEG_INF: Val = Val::NonFinite(f64::NEG_INFINITY);
    const NAN: Val = Val::NonFinite(f64::NAN);

    fn approx(v: Val, expected: f64) {
        let got = v.as_f64().expect("a number");
        assert!(
            (got - expected).abs() <= 1e-12 * expected.abs().max(1.0),
            "{got} != {expected}"
        );
    }

    #[test]
    fn every_function_is_registered() {
        for name in [
            "ABS",
            "ACOS",
            "ASIN",
            "ATAN",
            "ATN2",
            "CEILING",
            "COS",
            "COT",
            "DEGREES",
            "EXP",
            "FLOOR",
            "LOG",
            "LOG10",
            "PI",
            "POWER",
            "RADIANS",
            "RAND",
            "ROUND",
            "SIGN",
            "SIN",
            "SQRT",
            "SQUARE",
            "TAN",
            "TRUNC",
            "NumberBin",
            "IntAdd",
            "IntBitAnd",
            "IntBitLeftShift",
            "IntBitNot",
            "IntBitOr",
            "IntBitRightShift",
            "IntBitXor",
            "IntDiv",
            "IntMod",
            "IntMul",
            "IntSub",
        ] {
            assert_eq!(lookup(name).map(|f| f.name), Some(name));
        }
        assert_eq!(lookup("numberbin").map(|f| f.name), Some("NumberBin"));
    }

    #[test]
    fn reference_examples() {
        // ABS: ABS(-1), ABS(0), ABS(1).
        assert_eq!(call("ABS", &[n(-1.0)]), i(1));
        assert_eq!(call("ABS", &[n(0.0)]), i(0));
        assert_eq!(call("ABS", &[n(1.0)]), i(1));
        // ATN2 example: ATN2(35.175643, 129.44) = 0.265344532064832.
        assert_eq!(
            call("ATN2", &[n(35.175643), n(129.44)]),
            n(0.265_344_532_064_832)
        );
        // COT example: COT(124.1332) = -0.040311998371148884.
        assert_eq!(call("COT", &[n(124.1332)]), n(-0.040_311_998_371_148_884));
        // DEGREES example: 1.5707963267948966, 3.141592653589793, 4.71238898038469 and
        // 6.283185307179586 radians (PI/2, PI, 3PI/2, 2PI) are 90, 180, 270, 360 degrees.
        assert_eq!(call("DEGREES", &[n(std::f64::consts::FRAC_PI_2)]), i(90));
        assert_eq!(call("DEGREES", &[n(std::f64::consts::PI)]), i(180));
        assert_eq!(call("DEGREES", &[n(4.712_388_980_384_69)]), i(270));
        assert_eq!(call("DEGREES", &[n(std::f64::consts::TAU)]), i(360));
        // LOG example: LOG(5) = 1.6094379124341003, LOG(2, 10) = 0.3010299956639812.
        assert_eq!(call("LOG", &[n(5.0)]), n(1.609_437_912_434_100_3));
        assert_eq!(
            call("LOG", &[n(2.0), n(10.0)]),
            n(std::f64::consts::LOG10_2)
        );
        // LOG10 example: LOG10(5), LOG10(2), LOG10(100).
        assert_eq!(call("LOG10", &[n(5.0)]), n(0.698_970_004_336_018_9));
        assert_eq!(call("LOG10", &[n(2.0)]), n(std::f64::consts::LOG10_2));
        assert_eq!(call("LOG10", &[n(100.0)]), i(2));
        // ROUND example: 2.4, 2.6, 2.5, -2.4, -2.6 and the midpoint table.
        assert_eq!(call("ROUND", &[n(2.4)]), i(2));
        assert_eq!(call("ROUND", &[n(2.6)]), i(3));
        assert_eq!(call("ROUND", &[n(2.5)]), i(3));
        assert_eq!(call("ROUND", &[n(-2.4)]), i(-2));
        assert_eq!(call("ROUND", &[n(-2.6)]), i(-3));
        assert_eq!(call("ROUND", &[n(-6.5)]), i(-7));
        assert_eq!(call("ROUND", &[n(-0.5)]), i(-1));
        assert_eq!(call("ROUND", &[n(0.5)]), i(1));
        assert_eq!(call("ROUND", &[n(6.5)]), i(7));
        // NumberBin example: 37.752 with bin sizes -100, 10, 1, 0, 0.1, 0.01.
        let x = n(37.752);
        assert_eq!(call("NumberBin", &[x.clone(), n(-100.0)]), i(100));
        assert_eq!(call("NumberBin", &[x.clone(), n(10.0)]), i(30));
        assert_eq!(call("NumberBin", &[x.clone(), n(1.0)]), i(37));
        assert_eq!(call("NumberBin", &[x.clone(), n(0.0)]), None);
        assert_eq!(call("NumberBin", &[x.clone(), n(0.1)]), n(37.7));
        assert_eq!(call("NumberBin", &[x.clone(), n(0.01)]), n(37.75));
        assert_eq!(call("NumberBin", &[x]), i(37));
        // NumberBin field example: 155.23478 with bin size 0.01 is 155.23.
        assert_eq!(call("NumberBin", &[n(155.234_78), n(0.01)]), n(155.23));
    }

    #[test]
    fn int_reference_examples() {
        // IntAdd: (20, 10) = 30, (20, 0) = 20, (20, 0.10) undefined.
        assert_eq!(call("IntAdd", &[i(20), i(10)]), i(30));
        assert_eq!(call("IntAdd", &[i(20), i(0)]), i(20));
        assert_eq!(call("IntAdd", &[i(20), n(0.1)]), None);
        // IntDiv: 10/2 = 5, 10/-2 = -5, -10/-2 = 5, 10/10 = 1, 10/0 and 10/0.1 undefined.
        assert_eq!(call("IntDiv", &[i(10), i(2)]), i(5));
        assert_eq!(call("IntDiv", &[i(10), i(-2)]), i(-5));
        assert_eq!(call("IntDiv", &[i(-10), i(-2)]), i(5));
        assert_eq!(call("IntDiv", &[i(10), i(10)]), i(1));
        assert_eq!(call("IntDiv", &[i(10), i(0)]), None);
        assert_eq!(call("IntDiv", &[i(10), n(0.1)]), None);
        // IntMod: 12%5 = 2, 12%-5 = 2, -12%-5 = -2, 15%5 = 0, 12%0 and 12%0.2 undefined.
        assert_eq!(call("IntMod", &[i(12), i(5)]), i(2));
        assert_eq!(call("IntMod", &[i(12), i(-5)]), i(2));
        assert_eq!(call("IntMod", &[i(-12), i(-5)]), i(-2));
        assert_eq!(call("IntMod", &[i(15), i(5)]), i(0));
        assert_eq!(call("IntMod", &[i(12), i(0)]), None);
        assert_eq!(call("IntMod", &[i(12), n(0.2)]), None);
        // IntBitLeftShift: (16, 4) = 256, (16, 0.4) undefined.
        assert_eq!(call("IntBitLeftShift", &[i(16), i(4)]), i(256));
        assert_eq!(call("IntBitLeftShift", &[i(16), n(0.4)]), None);
        // IntBitRightShift: (16, 4) = 1, (16, 0.4) undefined.
        assert_eq!(call("IntBitRightShift", &[i(16), i(4)]), i(1));
        assert_eq!(call("IntBitRightShift", &[i(16), n(0.4)]), None);
        // IntMul, IntSub, bitwise.
        assert_eq!(call("IntMul", &[i(5), i(-2)]), i(-10));
        assert_eq!(call("IntSub", &[i(20), i(10)]), i(10));
        assert_eq!(call("IntBitAnd", &[i(12), i(10)]), i(8));
        assert_eq!(call("IntBitOr", &[i(12), i(10)]), i(14));
        assert_eq!(call("IntBitXor", &[i(12), i(10)]), i(6));
        assert_eq!(call("IntBitNot", &[i(12)]), i(-13));
        assert_eq!(call("IntBitNot", &[n(0.5)]), None);
    }

    #[test]
    fn int_functions_wrap_and_never_panic() {
        let (min, max) = (i(i64::MIN), i(i64::MAX));
        assert_eq!(call("IntAdd", &[max.clone(), i(1)]), min);
        assert_eq!(call("IntSub", &[min.clone(), i(1)]), max);
        assert_eq!(call("IntMul", &[max.clone(), i(2)]), i(-2));
        assert_eq!(call("IntDiv", &[min.clone(), i(-1)]), min);
        assert_eq!(call("IntMod", &[min.clone(), i(-1)]), i(0));
        assert_eq!(call("IntBitLeftShift", &[i(1), i(63)]), min);
        assert_eq!(call("IntBitLeftShift", &[i(1), i(64)]), None);
        assert_eq!(call("IntBitLeftShift", &[i(1), i(-1)]), None);
        assert_eq!(call("IntBitRightShift", &[i(-16), i(2)]), i(-4));
        assert_eq!(call("IntBitRightShift", &[i(1), i(1000)]), None);
        // Results beyond 2^53 stay exact.
        assert_eq!(
            call("IntAdd", &[i(9_007_199_254_740_993), i(0)]),
            i(9_007_199_254_740_993)
        );
        // Whole doubles are integers; out-of-range or non-numbers are not.
        assert_eq!(
            call("IntAdd", &[n(1e15), Some(json!(2.0))]),
            i(1_000_000_000_000_002)
        );
        assert_eq!(call("IntAdd", &[n(1e19), i(0)]), None);
        assert_eq!(call("IntAdd", &[Some(json!(u64::MAX)), i(0)]), None);
        assert_eq!(call("IntAdd", &[Some(json!(-(2f64.powi(63)))), i(0)]), min);
        assert_eq!(call("IntAdd", &[Some(json!("1")), i(0)]), None);
        assert_eq!(call("IntAdd", &[None, i(0)]), None);
        assert_eq!(call("IntAdd", &[Some(json!(null)), i(0)]), None);
    }

    #[test]
    fn wrong_types_are_undefined() {
        for name in [
            "ABS",
            "ACOS",
            "ASIN",
            "ATAN",
            "CEILING",
            "COS",
            "COT",
            "DEGREES",
            "EXP",
            "FLOOR",
            "LOG",
            "LOG10",
            "RADIANS",
            "ROUND",
            "SIGN",
            "SIN",
            "SQRT",
            "SQUARE",
            "TAN",
            "TRUNC",
            "NumberBin",
        ] {
            for arg in [
                None,
                Some(json!(null)),
                Some(json!("1")),
                Some(json!(true)),
                Some(json!([1])),
                Some(json!({})),
            ] {
                assert_eq!(call(name, &[arg]), None, "{name}");
            }
        }
        assert_eq!(call("ATN2", &[n(1.0), Some(json!("1"))]), None);
        assert_eq!(call("POWER", &[Some(json!("2")), n(2.0)]), None);
        assert_eq!(call("LOG", &[n(8.0), Some(json!(null))]), None);
        assert_eq!(call("ROUND", &[n(8.0), Some(json!("1"))]), None);
        assert_eq!(call("NumberBin", &[n(8.0), None]), None);
    }

    #[test]
    fn non_finite_results_are_numbers() {
        assert_eq!(call("SQRT", &[n(-1.0)]), NAN);
        assert_eq!(call("LOG", &[n(0.0)]), NEG_INF);
        assert_eq!(call("LOG", &[n(-1.0)]), NAN);
        assert_eq!(call("LOG", &[n(5.0), n(1.0)]), INF);
        assert_eq!(call("LOG10", &[n(0.0)]), NEG_INF);
        assert_eq!(call("ACOS", &[n(2.0)]), NAN);
        assert_eq!(call("ASIN", &[n(-2.0)]), NAN);
        assert_eq!(call("COT", &[n(0.0)]), INF);
        assert_eq!(call("EXP", &[n(1000.0)]), INF);
        assert_eq!(call("POWER", &[n(10.0), n(400.0)]), INF);
        assert_eq!(call("POWER", &[n(0.0), n(-1.0)]), INF);
        assert_eq!(call("SQUARE", &[n(1e200)]), INF);
    }

    #[test]
    fn non_finite_arguments_follow_ieee() {
        assert_eq!(call_val("ABS", &[NEG_INF]), INF);
        assert_eq!(call_val("ABS", &[NAN]), NAN);
        assert_eq!(call_val("SIGN", &[NEG_INF]), i(-1));
        assert_eq!(call_val("SIGN", &[NAN]), NAN);
        assert_eq!(call_val("FLOOR", &[INF]), INF);
        assert_eq!(call_val("CEILING", &[NAN]), NAN);
        assert_eq!(call_val("ROUND", &[NEG_INF]), NEG_INF);
        assert_eq!(call_val("ROUND", &[INF, Val::from(n(2.0))]), INF);
        assert_eq!(call_val("ROUND", &[NAN, Val::from(n(-2.0))]), NAN);
        assert_eq!(call_val("ROUND", &[Val::from(n(1.5)), INF]), None);
        assert_eq!(call_val("TRUNC", &[INF]), INF);
        assert_eq!(call_val("EXP", &[NEG_INF]), i(0));
        assert_eq!(call_val("ATAN", &[INF]), n(std::f64::consts::FRAC_PI_2));
        assert_eq!(call_val("POWER", &[NAN, Val::from(n(0.0))]), i(1));
        assert_eq!(call_val("SQRT", &[INF]), INF);
        assert_eq!(call_val("SIN", &[INF]), NAN);
        assert_eq!(call_val("NumberBin", &[INF]), INF);
        assert_eq!(call_val("NumberBin", &[Val::from(n(5.0)), NAN]), NAN);
        // The Int* functions take whole numbers only.
        for x in [INF, NEG_INF, NAN] {
            assert_eq!(call_val("IntAdd", &[x.clone(), Val::from(i(1))]), None);
            assert_eq!(call_val("IntBitNot", &[x]), None);
        }
    }

    #[test]
    fn elementary_values() {
        assert_eq!(call("PI", &[]), n(std::f64::consts::PI));
        assert_eq!(call("POWER", &[n(2.0), n(10.0)]), i(1024));
        assert_eq!(call("POWER", &[n(4.0), n(0.5)]), i(2));
        assert_eq!(call("SQRT", &[n(9.0)]), i(3));
        assert_eq!(call("SQUARE", &[n(-3.0)]), i(9));
        assert_eq!(call("SIGN", &[n(-2.5)]), i(-1));
        assert_eq!(call("SIGN", &[n(0.0)]), i(0));
        assert_eq!(call("SIGN", &[n(0.1)]), i(1));
        assert_eq!(call("CEILING", &[n(-0.5)]), i(0));
        assert_eq!(call("CEILING", &[n(0.1)]), i(1));
        assert_eq!(call("FLOOR", &[n(-0.5)]), i(-1));
        assert_eq!(call("TRUNC", &[n(-2.7)]), i(-2));
        assert_eq!(call("TRUNC", &[n(2.7)]), i(2));
        assert_eq!(call("EXP", &[n(0.0)]), i(1));
        assert_eq!(call("RADIANS", &[n(180.0)]), n(std::f64::consts::PI));
        assert_eq!(call("LOG", &[n(8.0), n(2.0)]), i(3));
        approx(call("LOG", &[n(27.0), n(3.0)]), 3.0);
        approx(call("SIN", &[n(std::f64::consts::FRAC_PI_2)]), 1.0);
        approx(call("COS", &[n(0.0)]), 1.0);
        approx(call("TAN", &[n(std::f64::consts::FRAC_PI_4)]), 1.0);
        approx(call("ATAN", &[n(1.0)]), std::f64::consts::FRAC_PI_4);
        approx(call("ACOS", &[n(-1.0)]), std::f64::consts::PI);
        approx(call("ASIN", &[n(1.0)]), std::f64::consts::FRAC_PI_2);
        // Huge inputs stay finite where the math does.
        assert_eq!(call("FLOOR", &[n(1e300)]), n(1e300));
        assert_eq!(call("ROUND", &[n(-1e300)]), n(-1e300));
    }

    #[test]
    fn round_with_precision() {
        assert_eq!(call("ROUND", &[n(2.345), n(0.0)]), i(2));
        assert_eq!(call("ROUND", &[n(1.23456), n(2.0)]), n(1.23));
        assert_eq!(call("ROUND", &[n(-1.23456), n(3.0)]), n(-1.235));
        assert_eq!(call("ROUND", &[n(1234.5678), n(-2.0)]), i(1200));
        assert_eq!(call("ROUND", &[n(-1250.0), n(-2.0)]), i(-1300));
        assert_eq!(call("ROUND", &[n(1234.5), n(-10.0)]), i(0));
        assert_eq!(call("ROUND", &[n(1234.5), n(-400.0)]), i(0));
        assert_eq!(call("ROUND", &[n(1.5), n(400.0)]), n(1.5));
        assert_eq!(call("ROUND", &[n(1e300), n(5.0)]), n(1e300));
        assert_eq!(call("ROUND", &[n(1.5), n(0.5)]), None);
    }

    #[test]
    fn number_bin_edges() {
        assert_eq!(call("NumberBin", &[n(-0.5)]), i(-1));
        assert_eq!(call("NumberBin", &[n(-37.752), n(10.0)]), i(-40));
        assert_eq!(call("NumberBin", &[n(1e300), n(1e-300)]), INF);
    }

    #[test]
    fn rand_is_in_unit_interval_and_follows_the_seed() {
        let a = Context::new(0, 42);
        let b = Context::new(0, 42);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let x = call_with(&a, "RAND", &[]);
            assert_eq!(x, call_with(&b, "RAND", &[]));
            let f = x.as_f64().expect("a number");
            assert!((0.0..1.0).contains(&f), "{f}");
            seen.insert(f.to_bits());
        }
        assert!(seen.len() > 990);
        let c = Context::new(0, 7);
        assert_ne!(
            call_with(&c, "RAND", &[]),
            call_with(&Context::new(0, 42), "RAND", &[])
        );
    }
}
