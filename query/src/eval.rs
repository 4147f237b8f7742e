//! Evaluating expressions for one row, with Cosmos DB's semantics: `undefined` propagates,
//! comparisons across types are undefined, `AND`/`OR`/`NOT` are three-valued, and arithmetic
//! on anything but numbers is undefined.
//!
//! Arithmetic is IEEE 754, as in JavaScript, whose number model the dialect shares: `1/0` is
//! `Infinity`, `0/0` is `NaN` (see `value` for how such numbers compare and are returned).
//! Bitwise operators (`& | ^ ~ << >> >>>`) work on 32-bit integers as in JavaScript (`Infinity`
//! and `NaN` count as 0); the `Int*` functions are the 64-bit alternative.

use std::{
    cell::{Cell, RefCell},
    cmp::Ordering,
    collections::HashMap,
    rc::Rc,
    time::Instant,
};

use serde_json::{Map, Value};

use crate::{
    ast::{BinaryOp, Expr, UnaryOp},
    error::{ErrorKind, QueryError},
    functions::Context,
    like::Like,
    value::{Val, equals, number, relate},
};

/// Rows a query may enumerate (joins, subqueries) per document before it is stopped: bounds
/// the work of a cross join of large arrays.
pub(crate) const MAX_ROWS_PER_DOCUMENT: u64 = 100_000;
/// Expressions a query may evaluate per document: bounds long `IN` lists over many rows and
/// the like.
pub(crate) const MAX_STEPS_PER_DOCUMENT: u64 = 2_000_000;
/// Longest `LIKE` pattern, in characters (see `functions::string::MAX_PATTERN_CHARS`).
const MAX_LIKE_CHARS: usize = 512;

/// The aliases bound for one row: a chain from the innermost binding outwards.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Env<'a> {
    pub(crate) slot: usize,
    pub(crate) value: &'a Value,
    pub(crate) parent: Option<&'a Env<'a>>,
}

impl<'a> Env<'a> {
    /// The value bound to `slot`.
    pub(crate) fn get(&self, slot: usize) -> Option<&'a Value> {
        let mut env = Some(self);
        while let Some(e) = env {
            if e.slot == slot {
                return Some(e.value);
            }
            env = e.parent;
        }
        None
    }
}

/// Compiled `LIKE` patterns by pattern and escape character.
type LikeCache = HashMap<(String, Option<char>), Rc<Like>>;

/// Asks whether the caller wants the run stopped.
pub(crate) struct Stop<'p>(pub(crate) Box<dyn Fn() -> bool + 'p>);

impl std::fmt::Debug for Stop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stop")
    }
}

/// What every evaluation of one query shares: the clock reading, parameters, the work budget
/// and compiled `LIKE` patterns.
#[derive(Debug)]
pub(crate) struct Evaluator<'p> {
    pub(crate) context: Context,
    params: &'p Map<String, Value>,
    /// Rows left before the current document's budget runs out.
    pub(crate) budget: Cell<u64>,
    /// Expression evaluations left for the current document.
    steps: Cell<u64>,
    /// When to stop, whatever the budget says (see `Execution::interrupt_at`).
    pub(crate) deadline: Option<Instant>,
    /// Whether to stop now, whatever the budget says (see `Execution::interrupt_when`).
    pub(crate) stop: Option<Stop<'p>>,
    /// Charges since the deadline was last looked at.
    ticks: Cell<u32>,
    likes: RefCell<LikeCache>,
}

impl<'p> Evaluator<'p> {
    pub(crate) fn new(context: Context, params: &'p Map<String, Value>) -> Self {
        Evaluator {
            context,
            params,
            budget: Cell::new(MAX_ROWS_PER_DOCUMENT),
            steps: Cell::new(MAX_STEPS_PER_DOCUMENT),
            deadline: None,
            stop: None,
            ticks: Cell::new(0),
            likes: RefCell::new(HashMap::new()),
        }
    }

    /// Starts a new document's work budget.
    pub(crate) fn reset_budget(&self) {
        self.budget.set(MAX_ROWS_PER_DOCUMENT);
        self.steps.set(MAX_STEPS_PER_DOCUMENT);
    }

    /// Charges copying (or building) `v`: in proportion to its size, so that no document's
    /// evaluation can build more than the budget's worth of values (a parameter or literal
    /// repeated in an array, or copied into every row of a join, included).
    fn charge_copy(&self, v: &Value) -> Result<(), QueryError> {
        if matches!(v, Value::Array(_) | Value::Object(_) | Value::String(_)) {
            self.charge_steps(cost(v))?;
        }
        Ok(())
    }

    /// Fails once the deadline has passed or the caller asks to stop, looking every 256
    /// charges.
    fn tick(&self) -> Result<(), QueryError> {
        if self.deadline.is_none() && self.stop.is_none() {
            return Ok(());
        }
        let ticks = self.ticks.get().wrapping_add(1);
        self.ticks.set(ticks);
        if !ticks.is_multiple_of(256) {
            return Ok(());
        }
        if self.deadline.is_some_and(|d| Instant::now() > d)
            || self.stop.as_ref().is_some_and(|s| (s.0)())
        {
            return Err(QueryError::new(
                ErrorKind::Interrupted,
                None,
                "the query ran past its caller's deadline or was stopped",
            ));
        }
        Ok(())
    }

    /// Counts `n` evaluation steps against the document's budget.
    pub(crate) fn charge_steps(&self, n: u64) -> Result<(), QueryError> {
        self.tick()?;
        let left = self.steps.get();
        if left < n {
            return Err(QueryError::limit(format!(
                "the query evaluates more than {MAX_STEPS_PER_DOCUMENT} expressions (or copies as many values) for one document; simplify it or filter earlier"
            )));
        }
        self.steps.set(left - n);
        Ok(())
    }

    /// Counts one enumerated row against the budget.
    pub(crate) fn charge_row(&self) -> Result<(), QueryError> {
        self.tick()?;
        let left = self.budget.get();
        if left == 0 {
            return Err(QueryError::limit(format!(
                "the query enumerates more than {MAX_ROWS_PER_DOCUMENT} rows (JOIN or subquery rows) for one document; narrow the JOINs or filter earlier"
            )));
        }
        self.budget.set(left - 1);
        Ok(())
    }

    /// The value of a parameter the query names.
    pub(crate) fn param(&self, name: &str) -> Result<&'p Value, QueryError> {
        self.params.get(&format!("@{name}")).ok_or_else(|| {
            QueryError::invalid(None, format!("parameter @{name} is used but not given"))
        })
    }

    /// Evaluates `expr` for the row `env`.
    pub(crate) fn eval(&self, expr: &Expr, env: Option<&Env<'_>>) -> Result<Val, QueryError> {
        self.charge_steps(1)?;
        if let Some(found) = self.path(expr, env)? {
            if let Some(v) = found {
                self.charge_copy(v)?;
            }
            return Ok(found.cloned().into());
        }
        Ok(match expr {
            Expr::Literal(v) => {
                if let Some(v) = v {
                    self.charge_copy(v)?;
                }
                v.clone().into()
            }
            Expr::NonFinite(n) => Val::NonFinite(n.0),
            Expr::Param(name) => {
                let v = self.param(name)?;
                self.charge_copy(v)?;
                Val::Json(v.clone())
            }
            Expr::Name(name, at) => {
                return Err(QueryError::invalid(
                    Some(*at),
                    format!("'{name}' is not bound"),
                ));
            }
            // Paths over aliases were answered above; these are over computed values.
            Expr::Alias(_) => Val::Undefined,
            Expr::Property(base, name) => match self.eval(base, env)? {
                Val::Json(Value::Object(mut map)) => map.remove(name).into(),
                _ => Val::Undefined,
            },
            Expr::Index(base, index) => {
                let index = self.eval(index, env)?;
                let base = self.eval(base, env)?;
                base.json()
                    .and_then(|b| index_into(b, &index))
                    .cloned()
                    .into()
            }
            Expr::Unary(op, operand) => unary(*op, self.eval(operand, env)?),
            Expr::Chain(first, rest) => {
                let mut acc = self.eval(first, env)?;
                for (op, e) in rest {
                    acc = match op {
                        BinaryOp::And => {
                            let a = truth(&acc);
                            if a == Some(false) {
                                acc
                            } else {
                                match (a, truth(&self.eval(e, env)?)) {
                                    (_, Some(false)) => bool_val(false),
                                    (Some(true), Some(true)) => bool_val(true),
                                    _ => Val::Undefined,
                                }
                            }
                        }
                        BinaryOp::Or => {
                            let a = truth(&acc);
                            if a == Some(true) {
                                acc
                            } else {
                                match (a, truth(&self.eval(e, env)?)) {
                                    (_, Some(true)) => bool_val(true),
                                    (Some(false), Some(false)) => bool_val(false),
                                    _ => Val::Undefined,
                                }
                            }
                        }
                        op => binary(*op, &acc, &self.eval(e, env)?)?,
                    };
                }
                acc
            }
            Expr::Binary(BinaryOp::And, a, b) => {
                let a = truth(&self.eval(a, env)?);
                if a == Some(false) {
                    return Ok(bool_val(false));
                }
                match (a, truth(&self.eval(b, env)?)) {
                    (_, Some(false)) => bool_val(false),
                    (Some(true), Some(true)) => bool_val(true),
                    _ => Val::Undefined,
                }
            }
            Expr::Binary(BinaryOp::Or, a, b) => {
                let a = truth(&self.eval(a, env)?);
                if a == Some(true) {
                    return Ok(bool_val(true));
                }
                match (a, truth(&self.eval(b, env)?)) {
                    (_, Some(true)) => bool_val(true),
                    (Some(false), Some(false)) => bool_val(false),
                    _ => Val::Undefined,
                }
            }
            Expr::Binary(op, a, b) => binary(*op, &self.eval(a, env)?, &self.eval(b, env)?)?,
            Expr::Coalesce(a, b) => match self.eval(a, env)? {
                Val::Undefined => self.eval(b, env)?,
                v => v,
            },
            Expr::Conditional(cond, then, otherwise) => {
                if truth(&self.eval(cond, env)?) == Some(true) {
                    self.eval(then, env)?
                } else {
                    self.eval(otherwise, env)?
                }
            }
            Expr::Between {
                expr,
                low,
                high,
                negated,
            } => {
                let v = self.eval(expr, env)?;
                let low = relate(&v, &self.eval(low, env)?, Ordering::is_ge);
                let high = relate(&v, &self.eval(high, env)?, Ordering::is_le);
                // `NOT BETWEEN` is the negation: with a `NaN`, `x BETWEEN` is false and
                // `x NOT BETWEEN` true, as `!(a <= x && x <= b)` is in JavaScript.
                match (low, high) {
                    (Some(l), Some(h)) => bool_val((l && h) != *negated),
                    _ => Val::Undefined,
                }
            }
            Expr::In {
                expr,
                list,
                negated,
            } => {
                let v = self.eval(expr, env)?;
                // `x IN (a, b)` is `x = a OR x = b`, three-valued.
                let mut result = Some(false);
                for item in list {
                    match equals(&v, &self.eval(item, env)?) {
                        Some(true) => {
                            result = Some(true);
                            break;
                        }
                        Some(false) => {}
                        None => result = None,
                    }
                }
                result.map_or(Val::Undefined, |r| bool_val(r != *negated))
            }
            Expr::Like {
                expr,
                pattern,
                escape,
                negated,
            } => {
                let (Val::Json(Value::String(s)), Val::Json(Value::String(p))) =
                    (self.eval(expr, env)?, self.eval(pattern, env)?)
                else {
                    return Ok(Val::Undefined);
                };
                bool_val(self.like(&s, &p, *escape)? != *negated)
            }
            Expr::Call(function, args) => {
                let args = args
                    .iter()
                    .map(|a| self.eval(a, env))
                    .collect::<Result<Vec<_>, _>>()?;
                if let Some(cost) = function.cost {
                    let cost = cost(&args);
                    if cost > self.steps.get() {
                        return Err(QueryError::limit(format!(
                            "{}: this call could take more work than one document's evaluation is allowed ({MAX_STEPS_PER_DOCUMENT} steps, this call up to {cost}); use a shorter pattern or match a shorter text",
                            function.name
                        )));
                    }
                    self.charge_steps(cost)?;
                }
                let result = function.invoke(&self.context, &args).map_err(|e| {
                    QueryError::new(
                        ErrorKind::Evaluation,
                        None,
                        format!("{}: {}", function.name, e.0),
                    )
                })?;
                if let Some(v) = result.json() {
                    self.charge_copy(v)?;
                }
                result
            }
            Expr::Aggregate(..) => {
                return Err(QueryError::invalid(
                    None,
                    "an aggregate is evaluated only over groups of rows",
                ));
            }
            Expr::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    // Undefined elements are left out, as undefined properties are; a number
                    // JSON cannot hold is null (an array holds JSON).
                    out.extend(self.eval(item, env)?.into_json_lossy());
                }
                Val::Json(Value::Array(out))
            }
            Expr::Object(fields) => {
                let mut out = Map::new();
                for (name, e) in fields {
                    if let Some(v) = self.eval(e, env)?.into_json_lossy() {
                        out.insert(name.clone(), v);
                    }
                }
                Val::Json(Value::Object(out))
            }
            Expr::Exists(query) => {
                let mut any = false;
                self.subquery(query, env, &mut |_| {
                    any = true;
                    false
                })?;
                bool_val(any)
            }
            Expr::ArraySubquery(query) => {
                let mut out = Vec::new();
                self.subquery(query, env, &mut |v| {
                    out.push(v);
                    true
                })?;
                Val::Json(Value::Array(out))
            }
            Expr::Subquery(query) => {
                let mut out = None;
                let mut many = false;
                self.subquery(query, env, &mut |v| {
                    if out.is_some() {
                        many = true;
                        return false;
                    }
                    out = Some(v);
                    true
                })?;
                if many {
                    return Err(QueryError::new(
                        ErrorKind::Evaluation,
                        None,
                        "a scalar subquery returned more than one value; use ARRAY(...) for many, or TOP 1",
                    ));
                }
                out.into()
            }
        })
    }

    /// A path over aliases (`c.a.b`, `c["x"]`, `c.arr[0]`), answered by reference so that only
    /// the value reached is copied. `None` if `expr` is not such a path.
    fn path<'e>(
        &self,
        expr: &Expr,
        env: Option<&Env<'e>>,
    ) -> Result<Option<Option<&'e Value>>, QueryError> {
        Ok(match expr {
            Expr::Alias(slot) => Some(env.and_then(|e| e.get(*slot))),
            Expr::Property(base, name) => self
                .path(base, env)?
                .map(|b| b.and_then(|b| b.as_object()).and_then(|m| m.get(name))),
            Expr::Index(base, index) if matches!(**index, Expr::Literal(_) | Expr::Param(_)) => {
                let Some(base) = self.path(base, env)? else {
                    return Ok(None);
                };
                let index = self.eval(index, env)?;
                Some(base.and_then(|b| index_into(b, &index)))
            }
            _ => None,
        })
    }

    /// `s LIKE pattern`: `%` any run of characters, `_` one character, `[abc]`, `[a-z]` and
    /// `[^...]` one of (or none of) a set, and `escape` before a wildcard to match it as is.
    fn like(&self, s: &str, pattern: &str, escape: Option<char>) -> Result<bool, QueryError> {
        if pattern.chars().count() > MAX_LIKE_CHARS {
            return Err(QueryError::limit(format!(
                "a LIKE pattern is longer than {MAX_LIKE_CHARS} characters"
            )));
        }
        let key = (pattern.to_owned(), escape);
        let cached = self.likes.borrow().get(&key).cloned();
        let like = match cached {
            Some(like) => like,
            None => {
                let like = Rc::new(Like::compile(pattern, escape)?);
                let mut likes = self.likes.borrow_mut();
                if likes.len() < 64 {
                    likes.insert(key, like.clone());
                }
                like
            }
        };
        // Charged as it goes: a pattern's work grows with the text times the pattern.
        like.matches(s, |n| self.charge_steps(n))
    }
}

/// Bytes of strings copied per evaluation step: with [`MAX_STEPS_PER_DOCUMENT`], one
/// document's evaluation copies at most 32 MiB, twice the largest message a result can travel
/// in, so no result is built far past what can be sent.
const BYTES_PER_STEP: usize = 16;

/// What copying `v` costs in evaluation steps: one per [`BYTES_PER_STEP`] of strings and per element,
/// counted to a bound (a value larger than the whole budget stops counting there).
fn cost(v: &Value) -> u64 {
    let mut cost = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => cost += (s.len() / BYTES_PER_STEP) as u64,
            Value::Array(items) => {
                cost += items.len() as u64;
                stack.extend(items);
            }
            Value::Object(map) => {
                cost += map.len() as u64;
                stack.extend(map.values());
            }
            _ => {}
        }
        if cost > MAX_STEPS_PER_DOCUMENT {
            break;
        }
    }
    cost
}

/// `true`/`false` for booleans, `None` (undefined) for anything else.
pub(crate) fn truth(v: &Val) -> Option<bool> {
    match v {
        Val::Json(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

/// A boolean value.
fn bool_val(b: bool) -> Val {
    Val::Json(Value::Bool(b))
}

/// `base[index]`: a whole non-negative number indexes an array, a string an object.
fn index_into<'v>(base: &'v Value, index: &Val) -> Option<&'v Value> {
    match (base, index.json()?) {
        (Value::Array(items), Value::Number(n)) => {
            let n = n.as_f64()?;
            if n >= 0.0 && n.fract() == 0.0 && n < items.len() as f64 {
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "checked"
                )]
                items.get(n as usize)
            } else {
                None
            }
        }
        (Value::Object(map), Value::String(key)) => map.get(key),
        _ => None,
    }
}

fn unary(op: UnaryOp, v: Val) -> Val {
    match (op, v) {
        (UnaryOp::Not, Val::Json(Value::Bool(b))) => bool_val(!b),
        (UnaryOp::Not, _) => Val::Undefined,
        (op, v) => match (op, v.as_f64()) {
            (UnaryOp::Neg, Some(n)) => number(-n),
            (UnaryOp::Plus, Some(n)) => number(n),
            (UnaryOp::BitNot, Some(n)) => number(f64::from(!to_int32(n))),
            _ => Val::Undefined,
        },
    }
}

fn binary(op: BinaryOp, a: &Val, b: &Val) -> Result<Val, QueryError> {
    if let (BinaryOp::Concat, Val::Json(Value::String(x)), Val::Json(Value::String(y))) = (op, a, b)
        && x.len() + y.len() > crate::functions::MAX_STRING_BYTES
    {
        return Err(QueryError::limit(format!(
            "'||' would build a string over {} bytes",
            crate::functions::MAX_STRING_BYTES
        )));
    }
    Ok(operate(op, a, b))
}

fn operate(op: BinaryOp, a: &Val, b: &Val) -> Val {
    let truth_value = |t: Option<bool>| t.map_or(Val::Undefined, bool_val);
    match op {
        BinaryOp::Eq => truth_value(equals(a, b)),
        // `!=` is an ordering comparison in Cosmos DB: undefined for arrays and objects.
        BinaryOp::Ne if matches!(a, Val::Json(Value::Array(_) | Value::Object(_))) => {
            Val::Undefined
        }
        // IEEE: `NaN != x` is true, `NaN = x` false.
        BinaryOp::Ne => truth_value(equals(a, b).map(|e| !e)),
        BinaryOp::Lt => truth_value(relate(a, b, Ordering::is_lt)),
        BinaryOp::Le => truth_value(relate(a, b, Ordering::is_le)),
        BinaryOp::Gt => truth_value(relate(a, b, Ordering::is_gt)),
        BinaryOp::Ge => truth_value(relate(a, b, Ordering::is_ge)),
        BinaryOp::Concat => match (a, b) {
            (Val::Json(Value::String(x)), Val::Json(Value::String(y))) => {
                Val::Json(Value::String(format!("{x}{y}")))
            }
            _ => Val::Undefined,
        },
        BinaryOp::And | BinaryOp::Or => unreachable!("evaluated with short-circuiting"),
        _ => {
            let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) else {
                return Val::Undefined;
            };
            let n = match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                BinaryOp::Mod => x % y,
                BinaryOp::BitAnd => f64::from(to_int32(x) & to_int32(y)),
                BinaryOp::BitOr => f64::from(to_int32(x) | to_int32(y)),
                BinaryOp::BitXor => f64::from(to_int32(x) ^ to_int32(y)),
                BinaryOp::Shl => f64::from(to_int32(x).wrapping_shl(shift_count(y))),
                BinaryOp::Shr => f64::from(to_int32(x).wrapping_shr(shift_count(y))),
                #[allow(clippy::cast_sign_loss, reason = "ToUint32 reinterprets the bits")]
                BinaryOp::ShrZero => f64::from((to_int32(x) as u32).wrapping_shr(shift_count(y))),
                _ => unreachable!("handled above"),
            };
            number(n)
        }
    }
}

/// JavaScript's ToInt32: truncate, then wrap modulo 2^32.
pub(crate) fn to_int32(n: f64) -> i32 {
    if !n.is_finite() {
        return 0;
    }
    let wrapped = n.trunc().rem_euclid(4_294_967_296.0);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "0 ≤ wrapped < 2^32"
    )]
    let bits = wrapped as u64 as u32;
    #[allow(
        clippy::cast_possible_wrap,
        reason = "reinterpreting the bits is ToInt32"
    )]
    let result = bits as i32;
    result
}

/// A shift count: the low five bits, as JavaScript takes them.
fn shift_count(n: f64) -> u32 {
    #[allow(clippy::cast_sign_loss, reason = "reinterpreting the bits")]
    let count = to_int32(n) as u32 & 31;
    count
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn int32_conversion_wraps_like_javascript() {
        assert_eq!(to_int32(1.9), 1);
        assert_eq!(to_int32(-1.9), -1);
        assert_eq!(to_int32(4_294_967_296.0 + 5.0), 5);
        assert_eq!(to_int32(2_147_483_648.0), i32::MIN);
        assert_eq!(to_int32(f64::NAN), 0);
    }

    fn j(v: Value) -> Val {
        Val::Json(v)
    }

    const INF: Val = Val::NonFinite(f64::INFINITY);
    const NEG_INF: Val = Val::NonFinite(f64::NEG_INFINITY);
    const NAN: Val = Val::NonFinite(f64::NAN);

    #[test]
    fn arithmetic_and_logic() {
        assert_eq!(
            operate(BinaryOp::Add, &j(json!(1)), &j(json!(2))),
            j(json!(3))
        );
        assert_eq!(
            operate(BinaryOp::Add, &j(json!(1)), &j(json!("2"))),
            Val::Undefined
        );
        assert_eq!(
            operate(BinaryOp::ShrZero, &j(json!(-1)), &j(json!(28))),
            j(json!(15))
        );
        assert_eq!(
            operate(BinaryOp::Shl, &j(json!(1)), &j(json!(33))),
            j(json!(2))
        );
        assert_eq!(unary(UnaryOp::BitNot, j(json!(5))), j(json!(-6)));
        assert_eq!(unary(UnaryOp::Not, j(json!(1))), Val::Undefined);
        assert_eq!(
            operate(BinaryOp::Concat, &j(json!("a")), &j(json!("b"))),
            j(json!("ab"))
        );
    }

    #[test]
    fn arithmetic_is_ieee() {
        let (zero, one) = (j(json!(0)), j(json!(1)));
        assert_eq!(operate(BinaryOp::Div, &one, &zero), INF);
        assert_eq!(operate(BinaryOp::Div, &j(json!(-1)), &zero), NEG_INF);
        assert_eq!(operate(BinaryOp::Div, &zero, &zero), NAN);
        assert_eq!(operate(BinaryOp::Mod, &one, &zero), NAN);
        assert_eq!(
            operate(BinaryOp::Mul, &j(json!(1e300)), &j(json!(1e300))),
            INF
        );
        assert_eq!(operate(BinaryOp::Sub, &INF, &INF), NAN);
        assert_eq!(operate(BinaryOp::Mul, &INF, &zero), NAN);
        assert_eq!(operate(BinaryOp::Div, &one, &INF), zero);
        assert_eq!(operate(BinaryOp::Add, &NEG_INF, &one), NEG_INF);
        assert_eq!(unary(UnaryOp::Neg, INF), NEG_INF);
        assert_eq!(unary(UnaryOp::Plus, NAN), NAN);
        // Bitwise operators take Infinity and NaN as 0, as JavaScript's ToInt32 does.
        assert_eq!(unary(UnaryOp::BitNot, INF), j(json!(-1)));
        assert_eq!(operate(BinaryOp::BitOr, &NAN, &one), one);
        assert_eq!(operate(BinaryOp::Shl, &one, &INF), one);
        assert_eq!(operate(BinaryOp::Add, &INF, &j(json!("1"))), Val::Undefined);
    }

    #[test]
    fn comparisons_with_non_finite_numbers_are_ieee() {
        let (t, f) = (j(json!(true)), j(json!(false)));
        let max = j(json!(f64::MAX));
        assert_eq!(operate(BinaryOp::Lt, &max, &INF), t);
        assert_eq!(operate(BinaryOp::Gt, &NEG_INF, &j(json!(f64::MIN))), f);
        assert_eq!(operate(BinaryOp::Eq, &INF, &INF), t);
        assert_eq!(operate(BinaryOp::Ge, &INF, &INF), t);
        for op in [
            BinaryOp::Eq,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
        ] {
            assert_eq!(operate(op, &NAN, &NAN), f, "{op:?}");
            assert_eq!(operate(op, &NAN, &max), f, "{op:?}");
            assert_eq!(operate(op, &max, &NAN), f, "{op:?}");
        }
        assert_eq!(operate(BinaryOp::Ne, &NAN, &NAN), t);
        assert_eq!(operate(BinaryOp::Ne, &INF, &max), t);
        // Across types, still undefined.
        assert_eq!(operate(BinaryOp::Eq, &NAN, &j(json!(null))), Val::Undefined);
        assert_eq!(operate(BinaryOp::Lt, &INF, &j(json!("z"))), Val::Undefined);
        assert_eq!(operate(BinaryOp::Ne, &INF, &Val::Undefined), Val::Undefined);
    }
}
