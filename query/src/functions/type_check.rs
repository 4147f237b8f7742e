//! Type checking functions, and `IIF`.

use serde_json::Value;

use super::{Context, Function, FunctionError, function};
use crate::value::{Val, boolean};

pub(super) const FUNCTIONS: &[Function] = &[
    unary("IS_ARRAY", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::Array(_)))))
    }),
    unary("IS_BOOL", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::Bool(_)))))
    }),
    unary("IS_DEFINED", |_, a| Ok(boolean(a[0].is_some()))),
    unary("IS_NULL", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::Null))))
    }),
    unary("IS_NUMBER", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::Number(_)))))
    }),
    unary("IS_OBJECT", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::Object(_)))))
    }),
    unary("IS_PRIMITIVE", |_, a| {
        Ok(boolean(matches!(
            a[0],
            Some(Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_))
        )))
    }),
    unary("IS_STRING", |_, a| {
        Ok(boolean(matches!(a[0], Some(Value::String(_)))))
    }),
    function("IIF", 3, 3, iif),
];

const fn unary(
    name: &'static str,
    call: fn(&Context, &[Val]) -> Result<Val, FunctionError>,
) -> Function {
    function(name, 1, 1, call)
}

/// `IIF(condition, a, b)`: `a` if the condition is exactly `true`, else `b` (a non-boolean
/// condition picks `b`).
fn iif(_: &Context, args: &[Val]) -> Result<Val, FunctionError> {
    Ok(if args[0] == Some(Value::Bool(true)) {
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

    fn call(name: &str, args: &[Val]) -> Val {
        let f = lookup(name).expect("known function");
        (f.call)(&Context::new(0, 1), args).expect("no error")
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
    fn iif_takes_only_true() {
        let (a, b) = (Some(json!("a")), Some(json!("b")));
        assert_eq!(call("IIF", &[Some(json!(true)), a.clone(), b.clone()]), a);
        assert_eq!(call("IIF", &[Some(json!(1)), a.clone(), b.clone()]), b);
        assert_eq!(call("IIF", &[None, a, b.clone()]), b);
    }
}
