//! Built-in (system) functions of the Cosmos DB for NoSQL query language, by family. Names
//! match case-insensitively, as in Cosmos DB. Aggregates (`COUNT`, `SUM`, ...) are not here:
//! they fold over rows, not over arguments (see `aggregate.rs`).

use std::cell::Cell;

use serde_json::Value;

use crate::value::Val;

mod array;
mod datetime;
mod math;
mod spatial;
mod string;
mod type_check;

/// Largest string a query builds (`CONCAT`, `REPLACE`, `||`): a stored document's limit.
pub(crate) const MAX_STRING_BYTES: usize = string::MAX_REPLACE_BYTES;

/// What a function may read besides its arguments.
#[derive(Debug)]
pub struct Context {
    /// The query's one clock reading, Unix epoch milliseconds: the `GetCurrent*` functions
    /// return it, the same instant the query judges expiry by.
    pub now_ms: i64,
    /// State of `RAND()`'s generator (xorshift64*), seeded per query.
    pub rand_state: Cell<u64>,
}

impl Context {
    /// A context reading `now_ms`, with `RAND()` seeded from `seed` (any value).
    pub fn new(now_ms: i64, seed: u64) -> Self {
        Context {
            now_ms,
            // xorshift needs a non-zero state.
            rand_state: Cell::new(seed | 1),
        }
    }
}

/// A function's failure that ends the query (most bad arguments give `undefined` instead, as
/// in Cosmos DB); the message is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionError(pub String);

/// How a function is evaluated.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// A function whose result is JSON or `undefined` (most of them: strings, arrays, dates,
    /// type tests, ...).
    Json(fn(&Context, &[Val]) -> Result<Option<Value>, FunctionError>),
    /// A function whose result may be any value, a number JSON cannot hold included (the
    /// mathematical functions: `SQRT(-1)` is `NaN`; and those that pass an argument through).
    Any(fn(&Context, &[Val]) -> Result<Val, FunctionError>),
}

/// One system function.
#[derive(Debug)]
pub struct Function {
    /// Its name as the Cosmos DB reference spells it.
    pub name: &'static str,
    /// Fewest arguments.
    pub min_args: usize,
    /// Most arguments.
    pub max_args: usize,
    /// Evaluates a call; `args.len()` is within `min_args..=max_args`.
    pub call: Call,
    /// For a function whose work can grow past its arguments' sizes: the evaluation steps a
    /// call may take at most, charged before it runs (it cannot be interrupted).
    pub cost: Option<fn(&[Val]) -> u64>,
}

impl Function {
    /// Evaluates a call with `args` (as many as the function takes).
    pub fn invoke(&self, context: &Context, args: &[Val]) -> Result<Val, FunctionError> {
        match self.call {
            Call::Json(call) => call(context, args).map(Val::from),
            Call::Any(call) => call(context, args),
        }
    }
}

impl PartialEq for Function {
    /// Functions are one per name.
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// A function's entry in its family's table: one whose result is JSON or `undefined`.
const fn function(
    name: &'static str,
    min_args: usize,
    max_args: usize,
    call: fn(&Context, &[Val]) -> Result<Option<Value>, FunctionError>,
) -> Function {
    Function {
        name,
        min_args,
        max_args,
        call: Call::Json(call),
        cost: None,
    }
}

/// [`function`] for a function whose result may be a number JSON cannot hold (see
/// [`Call::Any`]).
const fn any_function(
    name: &'static str,
    min_args: usize,
    max_args: usize,
    call: fn(&Context, &[Val]) -> Result<Val, FunctionError>,
) -> Function {
    Function {
        name,
        min_args,
        max_args,
        call: Call::Any(call),
        cost: None,
    }
}

/// [`function`] with a worst-case cost (see [`Function::cost`]).
const fn costly(
    name: &'static str,
    min_args: usize,
    max_args: usize,
    call: fn(&Context, &[Val]) -> Result<Option<Value>, FunctionError>,
    cost: fn(&[Val]) -> u64,
) -> Function {
    Function {
        cost: Some(cost),
        ..function(name, min_args, max_args, call)
    }
}

/// [`any_function`] with a worst-case cost (see [`Function::cost`]).
const fn costly_any(
    name: &'static str,
    min_args: usize,
    max_args: usize,
    call: fn(&Context, &[Val]) -> Result<Val, FunctionError>,
    cost: fn(&[Val]) -> u64,
) -> Function {
    Function {
        cost: Some(cost),
        ..any_function(name, min_args, max_args, call)
    }
}

const FAMILIES: &[&[Function]] = &[
    type_check::FUNCTIONS,
    string::FUNCTIONS,
    math::FUNCTIONS,
    array::FUNCTIONS,
    datetime::FUNCTIONS,
    spatial::FUNCTIONS,
];

/// The function called `name`, in any letter case.
pub fn lookup(name: &str) -> Option<&'static Function> {
    FAMILIES
        .iter()
        .flat_map(|family| family.iter())
        .find(|f| f.name.eq_ignore_ascii_case(name))
}

/// Functions of the Cosmos DB reference that Mayfly refuses by name, with why: the full-text
/// and vector search functions (it has no full-text or vector indexes to score against), and
/// `DocumentId` (an internal per-partition document number it does not have).
const UNSUPPORTED: &[(&str, &str)] = &[
    ("FullTextContains", FULL_TEXT),
    ("FullTextContainsAll", FULL_TEXT),
    ("FullTextContainsAny", FULL_TEXT),
    ("FullTextScore", FULL_TEXT),
    ("VectorDistance", FULL_TEXT),
    ("RRF", FULL_TEXT),
    (
        "DocumentId",
        "it returns Cosmos DB's internal per-partition document number, which Mayfly does not have; use the document's id",
    ),
];

const FULL_TEXT: &str = "Mayfly has no full-text or vector search";

/// The reference's spelling of `name` (in any letter case) and why Mayfly refuses it, if it
/// does.
pub fn unsupported(name: &str) -> Option<(&'static str, &'static str)> {
    UNSUPPORTED
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .copied()
}

/// Calls `f` with JSON (or undefined) arguments, for the families' tests: its result as JSON
/// (a number JSON cannot hold fails the test).
#[cfg(test)]
pub(crate) fn call_json(
    f: &Function,
    context: &Context,
    args: &[Option<Value>],
) -> Result<Option<Value>, FunctionError> {
    let args: Vec<Val> = args.iter().cloned().map(Val::from).collect();
    f.invoke(context, &args).map(|v| match v {
        Val::NonFinite(n) => panic!("{} gave {n}", f.name),
        v => v.into_json(),
    })
}

/// Every function, for documentation and tests.
pub fn all() -> impl Iterator<Item = &'static Function> {
    FAMILIES.iter().flat_map(|family| family.iter())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_in_any_case() {
        let mut seen = HashSet::new();
        for f in all() {
            assert!(seen.insert(f.name.to_ascii_lowercase()), "{} twice", f.name);
            assert!(f.min_args <= f.max_args, "{}", f.name);
        }
    }

    #[test]
    fn lookup_ignores_case() {
        assert_eq!(lookup("is_string").map(|f| f.name), Some("IS_STRING"));
        assert!(lookup("NO_SUCH_FUNCTION").is_none());
    }

    #[test]
    fn refused_names_are_not_functions() {
        for (name, _) in UNSUPPORTED {
            assert!(lookup(name).is_none(), "{name}");
        }
        assert_eq!(
            unsupported("vectordistance").map(|(name, _)| name),
            Some("VectorDistance")
        );
        assert_eq!(
            unsupported("DOCUMENTID").map(|(name, _)| name),
            Some("DocumentId")
        );
        assert_eq!(unsupported("ARRAY_LENGTH"), None);
    }
}
