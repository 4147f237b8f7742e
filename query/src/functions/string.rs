//! String functions, and the JSON conversions (`StringTo*`, `ToString`).
//!
//! Choices where the Cosmos DB reference is silent, or where Mayfly differs:
//!
//! - **Positions and lengths count characters (Unicode scalar values)**, not UTF-16 code units
//!   as Cosmos DB does. The two agree except for characters outside the Basic Multilingual
//!   Plane (most emoji), which Cosmos DB counts as 2 and Mayfly as 1. `LENGTH`, `LEFT`, `RIGHT`,
//!   `SUBSTRING`, `INDEX_OF` and `REPLICATE`'s limit all use the same unit, and a result never
//!   splits a character.
//! - **Numeric arguments that must be integers are truncated toward zero** (`LEFT("abc", 1.9)`
//!   is `"a"`); a non-number is `undefined`. Out-of-range values clamp: a negative start of
//!   `SUBSTRING` or `INDEX_OF` counts as 0, a negative length or count gives `""`, a start past
//!   the end gives `""` (`INDEX_OF`: -1). As in JavaScript, `Infinity` is past any end,
//!   `-Infinity` before any start, and `NaN` counts as 0 (`LEFT("abc", 1/0)` is `"abc"`).
//! - **Ignoring case** (the optional last argument of `CONTAINS`, `STARTSWITH`, `ENDSWITH`,
//!   `StringEquals`) compares the Unicode lower-case forms. That argument must be a boolean if
//!   given; anything else makes the result `undefined`.
//! - **`LTRIM`/`RTRIM`/`TRIM` with a second argument** strip any of that string's characters
//!   (`TRIM("-_-x-_-", "-_")` is `"x"`, as in the reference); without it, Unicode whitespace.
//! - **`REPLICATE`** returns `undefined` when the result would exceed 10,000 characters (the
//!   documented limit) or the count is negative. **`REPLACE`** with an empty search string
//!   returns the input unchanged, and returns `undefined` rather than build a string over
//!   16 MiB.
//! - **`ToString`** writes numbers as JavaScript does (`1`, `0.1234`, `1e+21`, `Infinity`,
//!   `-Infinity`, `NaN`) and arrays and objects as compact JSON; `ToString(undefined)` is
//!   `undefined`.
//! - **`StringToNumber`/`Array`/`Boolean`/`Null`/`Object`** parse the whole string as strict
//!   JSON, allowing JSON whitespace around it, and are `undefined` unless it parses to a value
//!   of the named type (`"NaN"`, `"Infinity"`, `"1e999"`, `"'a'"` or `"True"` are not JSON, so
//!   `StringToNumber` never gives a number JSON cannot hold).
//! - **`RegexMatch`** uses the `regex` crate's syntax, not PCRE: look-around and
//!   back-references are rejected, matching finds the pattern anywhere in the string
//!   (unanchored), and modifiers are `i` (ignore case), `m` (multi-line), `s` (dot matches
//!   newline) and `x` (ignore whitespace). A pattern that does not compile, that compiles larger
//!   than 1 MiB, or an unknown modifier fails the query.
//! - **`SubstringAfter`/`SubstringBefore`/`LastSubstringAfter`/`LastSubstringBefore`** give
//!   `""` when the delimiter does not occur (the reference does not say). **`LastIndexOf`**'s
//!   optional start is where the backward search begins, as in .NET: the match must end at or
//!   before that character (a negative start finds nothing, one past the end searches all).
//! - **`StringSplit`** with an empty delimiter gives `[s]`; **`StringJoin`** is `undefined` if
//!   an element is not a string, or past 2 MiB as `CONCAT` is.
//! - **`CONTAINS_ALL_CI`/`_CS`** and **`CONTAINS_ANY_CI`/`_CS`** are `CONTAINS(s, e, ci)` joined
//!   by `AND`/`OR` with three-valued logic, as the reference defines them (its
//!   `CONTAINS_ALL_CS` page's first example, `true` for "have" in "Have a nice day!",
//!   contradicts that definition; the definition is followed).

use std::collections::HashSet;

use regex::RegexBuilder;
use serde_json::{Number, Value};

use super::{Context, Function, FunctionError, costly, function};
use crate::value::{Val, as_f64, boolean, json_number, string};

/// `REPLICATE`'s documented limit on its result, in characters.
const MAX_REPLICATE_CHARS: usize = 10_000;
/// The longest string `REPLACE` builds, in bytes.
/// Largest string `REPLACE`, `CONCAT` and `||` build: a document's size limit (2 MiB), so no
/// query builds a value larger than a stored one.
pub(crate) const MAX_REPLACE_BYTES: usize = 2 * 1024 * 1024;
/// The most memory a compiled `RegexMatch` pattern may take.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Longest `RegexMatch` pattern, in characters: matching time grows with pattern length times
/// text length when the regex engine cannot use its DFA, so long patterns are refused.
pub(crate) const MAX_PATTERN_CHARS: usize = 512;
/// The largest integer a double holds exactly (2^53).
const MAX_SAFE_INTEGER: u64 = 1 << 53;

pub(super) const FUNCTIONS: &[Function] = &[
    function("CONCAT", 2, usize::MAX, concat),
    function("CONTAINS", 2, 3, |_, a| {
        Ok(compare(a, |s, t| s.contains(t)))
    }),
    function("ENDSWITH", 2, 3, |_, a| {
        Ok(compare(a, |s, t| s.ends_with(t)))
    }),
    function("STARTSWITH", 2, 3, |_, a| {
        Ok(compare(a, |s, t| s.starts_with(t)))
    }),
    function("StringEquals", 2, 3, |_, a| Ok(compare(a, |s, t| s == t))),
    function("INDEX_OF", 2, 3, index_of),
    function("LEFT", 2, 2, left),
    function("RIGHT", 2, 2, right),
    function("LENGTH", 1, 1, |_, a| {
        Ok(str_arg(a, 0).and_then(|s| json_number(s.chars().count() as f64)))
    }),
    function("LOWER", 1, 1, |_, a| {
        Ok(str_arg(a, 0).and_then(|s| string(s.to_lowercase())))
    }),
    function("UPPER", 1, 1, |_, a| {
        Ok(str_arg(a, 0).and_then(|s| string(s.to_uppercase())))
    }),
    function("LTRIM", 1, 2, |_, a| Ok(trim(a, Side::Start))),
    function("RTRIM", 1, 2, |_, a| Ok(trim(a, Side::End))),
    function("TRIM", 1, 2, |_, a| Ok(trim(a, Side::Both))),
    function("REPLACE", 3, 3, replace),
    function("REPLICATE", 2, 2, replicate),
    function("REVERSE", 1, 1, |_, a| {
        Ok(str_arg(a, 0).and_then(|s| string(s.chars().rev().collect::<String>())))
    }),
    function("SUBSTRING", 3, 3, substring),
    function("StringToArray", 1, 1, |_, a| {
        Ok(parse_json(a).filter(Value::is_array))
    }),
    function("StringToBoolean", 1, 1, |_, a| {
        Ok(parse_json(a).filter(Value::is_boolean))
    }),
    function("StringToNull", 1, 1, |_, a| {
        Ok(parse_json(a).filter(Value::is_null))
    }),
    function("StringToNumber", 1, 1, |_, a| {
        Ok(parse_json(a)
            .as_ref()
            .and_then(as_f64)
            .and_then(json_number))
    }),
    function("StringToObject", 1, 1, |_, a| {
        Ok(parse_json(a).filter(Value::is_object))
    }),
    function("ToString", 1, 1, to_string),
    costly("RegexMatch", 2, 3, regex_match, regex_cost),
    function("LastIndexOf", 2, 3, last_index_of),
    costly("StringSplit", 2, 2, string_split, string_split_cost),
    function("StringJoin", 2, 2, string_join),
    function("SubstringAfter", 2, 2, |_, a| {
        Ok(split_at_delimiter(a, Occurrence::First, Part::After))
    }),
    function("SubstringBefore", 2, 2, |_, a| {
        Ok(split_at_delimiter(a, Occurrence::First, Part::Before))
    }),
    function("LastSubstringAfter", 2, 2, |_, a| {
        Ok(split_at_delimiter(a, Occurrence::Last, Part::After))
    }),
    function("LastSubstringBefore", 2, 2, |_, a| {
        Ok(split_at_delimiter(a, Occurrence::Last, Part::Before))
    }),
    costly(
        "CONTAINS_ALL_CI",
        2,
        usize::MAX,
        |_, a| Ok(contains_many(a, true, true)),
        contains_many_cost,
    ),
    costly(
        "CONTAINS_ALL_CS",
        2,
        usize::MAX,
        |_, a| Ok(contains_many(a, true, false)),
        contains_many_cost,
    ),
    costly(
        "CONTAINS_ANY_CI",
        2,
        usize::MAX,
        |_, a| Ok(contains_many(a, false, true)),
        contains_many_cost,
    ),
    costly(
        "CONTAINS_ANY_CS",
        2,
        usize::MAX,
        |_, a| Ok(contains_many(a, false, false)),
        contains_many_cost,
    ),
];

/// Argument `i`, if given and JSON.
fn arg(args: &[Val], i: usize) -> Option<&Value> {
    args.get(i)?.json()
}

/// Argument `i` if it is a string.
fn str_arg(args: &[Val], i: usize) -> Option<&str> {
    match arg(args, i)? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// Argument `i` as an integer, truncated toward zero (saturating at the `i64` range), if it is
/// a number: as JavaScript's `ToIntegerOrInfinity` then clamped, `Infinity` is the largest,
/// `-Infinity` the smallest and `NaN` is 0.
pub(super) fn int_arg(args: &[Val], i: usize) -> Option<i64> {
    let n = args.get(i)?.as_f64()?;
    // `as` saturates, and takes NaN to 0.
    Some(n.trunc() as i64)
}

/// A non-negative integer as a count (negative counts are 0).
pub(super) fn count(n: i64) -> usize {
    usize::try_from(n.max(0)).unwrap_or(usize::MAX)
}

/// The byte offset of character `chars` in `s` (its length if `s` is shorter).
fn byte_offset(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map_or(s.len(), |(i, _)| i)
}

/// The `len` characters of `s` from character `start`, or fewer where `s` ends first.
fn char_slice(s: &str, start: usize, len: usize) -> &str {
    let rest = &s[byte_offset(s, start)..];
    &rest[..byte_offset(rest, len)]
}

fn concat(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let mut out = String::new();
    for i in 0..args.len() {
        let Some(s) = str_arg(args, i) else {
            return Ok(None);
        };
        if out.len() + s.len() > MAX_REPLACE_BYTES {
            return Ok(None);
        }
        out.push_str(s);
    }
    Ok(string(out))
}

/// `test(a, b)` of two strings, with the optional third argument to ignore case.
fn compare(args: &[Val], test: fn(&str, &str) -> bool) -> Option<Value> {
    let (s, t) = (str_arg(args, 0)?, str_arg(args, 1)?);
    let ignore_case = match args.get(2) {
        None => false,
        Some(Val::Json(Value::Bool(b))) => *b,
        Some(_) => return None,
    };
    boolean(if ignore_case {
        test(&s.to_lowercase(), &t.to_lowercase())
    } else {
        test(s, t)
    })
}

/// `INDEX_OF(s, sub[, start])`: the character position of the first `sub` at or after `start`,
/// or -1.
fn index_of(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(sub)) = (str_arg(args, 0), str_arg(args, 1)) else {
        return Ok(None);
    };
    let start = match args.get(2) {
        None => 0,
        Some(_) => match int_arg(args, 2) {
            Some(n) => count(n),
            None => return Ok(None),
        },
    };
    let from = byte_offset(s, start);
    // A start past the end finds nothing, not even "" (`byte_offset` stops at the end).
    if from == s.len() && s.chars().count() < start {
        return Ok(json_number(-1.0));
    }
    Ok(match s[from..].find(sub) {
        Some(at) => json_number((start + s[from..from + at].chars().count()) as f64),
        None => json_number(-1.0),
    })
}

fn left(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(n)) = (str_arg(args, 0), int_arg(args, 1)) else {
        return Ok(None);
    };
    Ok(string(char_slice(s, 0, count(n))))
}

fn right(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(n)) = (str_arg(args, 0), int_arg(args, 1)) else {
        return Ok(None);
    };
    let skip = s.chars().count().saturating_sub(count(n));
    Ok(string(&s[byte_offset(s, skip)..]))
}

fn substring(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(start), Some(len)) = (str_arg(args, 0), int_arg(args, 1), int_arg(args, 2))
    else {
        return Ok(None);
    };
    Ok(string(char_slice(s, count(start), count(len))))
}

/// Which end(s) a trim strips.
#[derive(Debug, Clone, Copy)]
enum Side {
    Start,
    End,
    Both,
}

/// `LTRIM`/`RTRIM`/`TRIM(s[, chars])`: strips whitespace, or any of `chars`.
fn trim(args: &[Val], side: Side) -> Option<Value> {
    let s = str_arg(args, 0)?;
    // A set, so that trimming stays linear however long both strings are.
    let chars: Option<HashSet<char>> = match args.get(1) {
        None => None,
        Some(_) => Some(str_arg(args, 1)?.chars().collect()),
    };
    let strip = |c: char| {
        chars
            .as_ref()
            .map_or(c.is_whitespace(), |set| set.contains(&c))
    };
    string(match side {
        Side::Start => s.trim_start_matches(strip),
        Side::End => s.trim_end_matches(strip),
        Side::Both => s.trim_matches(strip),
    })
}

fn replace(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(find), Some(with)) = (str_arg(args, 0), str_arg(args, 1), str_arg(args, 2))
    else {
        return Ok(None);
    };
    if find.is_empty() {
        return Ok(string(s));
    }
    let matches = s.matches(find).count();
    let len = (s.len() - matches * find.len()).checked_add(matches.saturating_mul(with.len()));
    if len.is_none_or(|len| len > MAX_REPLACE_BYTES) {
        return Ok(None);
    }
    Ok(string(s.replace(find, with)))
}

fn replicate(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(n)) = (str_arg(args, 0), int_arg(args, 1)) else {
        return Ok(None);
    };
    if n < 0 {
        return Ok(None);
    }
    let times = count(n);
    match s.chars().count().checked_mul(times) {
        Some(chars) if chars <= MAX_REPLICATE_CHARS => Ok(string(s.repeat(times))),
        _ => Ok(None),
    }
}

/// The string argument parsed as JSON (`None` if it is not a string or not JSON).
fn parse_json(args: &[Val]) -> Option<Value> {
    serde_json::from_str(str_arg(args, 0)?).ok()
}

fn to_string(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    Ok(match &args[0] {
        Val::Undefined => None,
        // As JavaScript writes them: "Infinity", "-Infinity", "NaN".
        Val::NonFinite(n) => string(format_double(*n)),
        Val::Json(Value::String(s)) => string(s.as_str()),
        Val::Json(v) => {
            let mut out = String::new();
            write_json(&mut out, v, false);
            string(out)
        }
    })
}

/// `LastIndexOf(s, sub[, start])`: the character position of the last `sub` that ends at or
/// before character `start` (the search runs from `start` toward the beginning, as .NET's
/// `LastIndexOf` does), or -1.
fn last_index_of(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(sub)) = (str_arg(args, 0), str_arg(args, 1)) else {
        return Ok(None);
    };
    let window = match args.get(2) {
        None => s,
        Some(_) => match int_arg(args, 2) {
            Some(n) if n < 0 => return Ok(json_number(-1.0)),
            // Characters 0..=start.
            Some(n) => &s[..byte_offset(s, count(n).saturating_add(1))],
            None => return Ok(None),
        },
    };
    Ok(match window.rfind(sub) {
        Some(at) => json_number(window[..at].chars().count() as f64),
        None => json_number(-1.0),
    })
}

/// Text bytes one evaluation step pays for when a function scans a string (`StringSplit`,
/// `CONTAINS_ALL_*`/`CONTAINS_ANY_*`): these calls are charged before they run, in proportion
/// to the text they scan, so that no one call takes far longer than the document's budget.
const SCAN_BYTES_PER_STEP: u64 = 64;

/// `StringSplit(s, delimiter)`: the pieces of `s` between non-overlapping occurrences of
/// `delimiter`, left to right; an empty delimiter gives `[s]`.
fn string_split(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(s), Some(delimiter)) = (str_arg(args, 0), str_arg(args, 1)) else {
        return Ok(None);
    };
    let pieces: Vec<Value> = if delimiter.is_empty() {
        vec![Value::String(s.to_owned())]
    } else {
        s.split(delimiter)
            .map(|piece| Value::String(piece.to_owned()))
            .collect()
    };
    Ok(Some(Value::Array(pieces)))
}

/// One step per piece `StringSplit` would build, plus the scan: counted (without building
/// anything) before the call, so that splitting a large string into many small pieces is
/// refused by the document's budget rather than allocated first.
fn string_split_cost(args: &[Val]) -> u64 {
    let (Some(s), Some(delimiter)) = (str_arg(args, 0), str_arg(args, 1)) else {
        return 0;
    };
    let pieces = if delimiter.is_empty() {
        1
    } else {
        s.matches(delimiter).count() as u64 + 1
    };
    pieces + s.len() as u64 / SCAN_BYTES_PER_STEP
}

/// `StringJoin(array, separator)`: the array's strings with `separator` between them;
/// `undefined` if any element is not a string, or if the result would exceed the largest
/// string a query builds.
fn string_join(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(Value::Array(items)), Some(separator)) = (arg(args, 0), str_arg(args, 1)) else {
        return Ok(None);
    };
    let mut len = separator
        .len()
        .saturating_mul(items.len().saturating_sub(1));
    for item in items {
        let Value::String(s) = item else {
            return Ok(None);
        };
        len = len.saturating_add(s.len());
    }
    if len > MAX_REPLACE_BYTES {
        return Ok(None);
    }
    let mut out = String::with_capacity(len);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        if let Value::String(s) = item {
            out.push_str(s);
        }
    }
    Ok(string(out))
}

/// Which occurrence of the delimiter the `Substring*` functions split at.
#[derive(Debug, Clone, Copy)]
enum Occurrence {
    First,
    Last,
}

/// Which side of the delimiter they return.
#[derive(Debug, Clone, Copy)]
enum Part {
    Before,
    After,
}

/// `SubstringAfter`/`SubstringBefore`/`LastSubstringAfter`/`LastSubstringBefore(s,
/// delimiter)`: the text after or before the first or last occurrence of `delimiter`; `""`
/// when `delimiter` does not occur.
fn split_at_delimiter(args: &[Val], occurrence: Occurrence, part: Part) -> Option<Value> {
    let (s, delimiter) = (str_arg(args, 0)?, str_arg(args, 1)?);
    let found = match occurrence {
        Occurrence::First => s.find(delimiter),
        Occurrence::Last => s.rfind(delimiter),
    };
    let Some(at) = found else {
        return string("");
    };
    string(match part {
        Part::Before => &s[..at],
        Part::After => &s[at + delimiter.len()..],
    })
}

/// `CONTAINS_ALL_*(s, e1, ...)` (`all`) and `CONTAINS_ANY_*` (not `all`): `CONTAINS(s, e1,
/// ignore_case) AND ...` or `OR ...`, with the query language's three-valued logic — a
/// non-string argument makes its own test `undefined`, which a `false` (`ALL`) or a `true`
/// (`ANY`) elsewhere overrides.
fn contains_many(args: &[Val], all: bool, ignore_case: bool) -> Option<Value> {
    let haystack = str_arg(args, 0).map(|s| {
        if ignore_case {
            std::borrow::Cow::Owned(s.to_lowercase())
        } else {
            std::borrow::Cow::Borrowed(s)
        }
    });
    let mut unknown = false;
    for i in 1..args.len() {
        let test = match (&haystack, str_arg(args, i)) {
            (Some(s), Some(t)) if ignore_case => Some(s.contains(&t.to_lowercase())),
            (Some(s), Some(t)) => Some(s.contains(t)),
            _ => None,
        };
        match test {
            // `false` decides `ALL`, `true` decides `ANY`.
            Some(found) if found != all => return boolean(found),
            Some(_) => {}
            None => unknown = true,
        }
    }
    if unknown { None } else { boolean(all) }
}

/// One scan of the text per substring looked for.
fn contains_many_cost(args: &[Val]) -> u64 {
    let text = str_arg(args, 0).map_or(0, |s: &str| s.len() as u64);
    let needles: u64 = (1..args.len())
        .map(|i| str_arg(args, i).map_or(0, |t: &str| t.len() as u64 + text))
        .sum();
    needles / SCAN_BYTES_PER_STEP
}

/// Text bytes times pattern bytes per evaluation step that a `RegexMatch` is charged: the
/// regular expression engine usually runs in time linear in the text, but a pattern its
/// lazy DFA cannot hold falls back to simulating the pattern's automaton at every byte, and
/// that cannot be interrupted. Charged before the match runs, this bounds it with the
/// document's evaluation budget: a 2 MiB text takes patterns of up to about 60 characters,
/// a 100 KiB text patterns of any allowed length.
const REGEX_WORK_PER_STEP: u64 = 64;

fn regex_cost(args: &[Val]) -> u64 {
    let len = |i| str_arg(args, i).map_or(0, |s: &str| s.len() as u64);
    len(0).saturating_mul(len(1).max(1)) / REGEX_WORK_PER_STEP
}

fn regex_match(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let Some(pattern) = str_arg(args, 1) else {
        return Ok(None);
    };
    let modifiers = match args.get(2) {
        None => "",
        Some(_) => match str_arg(args, 2) {
            Some(m) => m,
            None => return Ok(None),
        },
    };
    let invalid = |reason: &str| {
        let mut shown: String = pattern.chars().take(100).collect();
        if shown.len() < pattern.len() {
            shown.push('…');
        }
        FunctionError(format!(
            "RegexMatch: invalid regular expression {shown:?}: {reason}"
        ))
    };
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        return Err(invalid(&format!(
            "the pattern is longer than {MAX_PATTERN_CHARS} characters"
        )));
    }
    let mut builder = RegexBuilder::new(pattern);
    builder
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT);
    for modifier in modifiers.chars() {
        match modifier {
            'i' => builder.case_insensitive(true),
            'm' => builder.multi_line(true),
            's' => builder.dot_matches_new_line(true),
            'x' => builder.ignore_whitespace(true),
            other => {
                return Err(invalid(&format!(
                    "unknown modifier {other:?} (expected i, m, s or x)"
                )));
            }
        };
    }
    let regex = builder.build().map_err(|e| invalid(&e.to_string()))?;
    // The pattern is checked first, so a bad one fails the query whatever the rows hold.
    Ok(str_arg(args, 0).and_then(|s| boolean(regex.is_match(s))))
}

/// Appends `v` as compact JSON, numbers written as JavaScript writes them; with `sort_keys`,
/// object members in key order (a canonical form: values that are `deep_equal` write the same).
pub(super) fn write_json(out: &mut String, v: &Value, sort_keys: bool) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_text(n)),
        Value::String(s) => write_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, item, sort_keys);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            if sort_keys {
                members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, key);
                out.push(':');
                write_json(out, value, sort_keys);
            }
            out.push('}');
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number as JavaScript's `String(n)` writes the double it stands for.
fn number_text(n: &Number) -> String {
    match (n.as_i64(), n.as_u64()) {
        (Some(i), _) if i.unsigned_abs() <= MAX_SAFE_INTEGER => i.to_string(),
        (_, Some(u)) if u <= MAX_SAFE_INTEGER => u.to_string(),
        _ => format_double(n.as_f64().unwrap_or(0.0)),
    }
}

/// JavaScript's `Number.prototype.toString()`: the shortest digits that round-trip, in plain
/// notation for 1e-7 < |n| < 1e21 and in exponent notation (`1.5e+21`, `1e-7`) outside it.
pub(super) fn format_double(n: f64) -> String {
    if n == 0.0 {
        return "0".to_owned(); // -0 too, as in JavaScript.
    }
    if !n.is_finite() {
        let text = if n.is_nan() {
            "NaN"
        } else if n > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        return text.to_owned();
    }
    // `{:e}` writes the shortest round-tripping digits as `d.ddde±x`.
    let scientific = format!("{:e}", n.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i64;
    // The value is 0.digits × 10^point.
    let point = exponent.parse::<i64>().unwrap_or(0) + 1;
    let mut out = String::from(if n < 0.0 { "-" } else { "" });
    if k <= point && point <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', count(point - k)));
    } else if 0 < point && point <= 21 {
        let (int, frac) = digits.split_at(count(point));
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else if -6 < point && point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', count(-point)));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let e = point - 1;
        out.push_str(&format!("e{}{}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
    out
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

    fn s(text: &str) -> Option<Value> {
        Some(json!(text))
    }

    /// A call with any arguments, numbers JSON cannot hold included.
    fn call_val(name: &str, args: &[Val]) -> Option<Value> {
        let f = lookup(name).expect("known function");
        f.invoke(&Context::new(0, 1), args)
            .expect("no error")
            .into_json()
    }

    fn n(x: f64) -> Option<Value> {
        json_number(x)
    }

    const AW: &str = "AdventureWorks";

    fn cost(name: &str, args: &[Option<Value>]) -> u64 {
        let f = lookup(name).expect("known function");
        let args: Vec<Val> = args.iter().cloned().map(Val::from).collect();
        f.cost.expect("a costly function")(&args)
    }

    fn strings(items: &[&str]) -> Option<Value> {
        Some(json!(items))
    }

    #[test]
    fn string_split() {
        // The reference's examples.
        assert_eq!(
            call("StringSplit", &[s("Handlebar"), s("e")]),
            strings(&["Handl", "bar"])
        );
        assert_eq!(
            call("StringSplit", &[s("CARBON_STEEL_BIKE_WHEEL"), s("_")]),
            strings(&["CARBON", "STEEL", "BIKE", "WHEEL"])
        );
        assert_eq!(
            call("StringSplit", &[s("Road Bike"), s(" ")]),
            strings(&["Road", "Bike"])
        );
        assert_eq!(
            call("StringSplit", &[s("xenmoun mountain bike"), s("moun")]),
            strings(&["xen", " ", "tain bike"])
        );
        assert_eq!(call("StringSplit", &[s("AluminumBikeFrame"), None]), None);
        assert_eq!(
            call("StringSplit", &[s("Helmet"), s("")]),
            strings(&["Helmet"])
        );
        assert_eq!(call("StringSplit", &[s(""), s("")]), strings(&[""]));
        // Edges.
        assert_eq!(call("StringSplit", &[s(""), s(",")]), strings(&[""]));
        assert_eq!(
            call("StringSplit", &[s(",a,,b,"), s(",")]),
            strings(&["", "a", "", "b", ""])
        );
        assert_eq!(
            call("StringSplit", &[s("aaa"), s("aa")]),
            strings(&["", "a"])
        );
        assert_eq!(call("StringSplit", &[n(1.0), s(",")]), None);
        assert_eq!(call("StringSplit", &[s("a"), n(1.0)]), None);
    }

    #[test]
    fn string_split_is_charged_per_piece_before_it_runs() {
        // 2 MiB split into one-character pieces costs more than one document's budget, so
        // the evaluator refuses it before any piece is built.
        let big = ",".repeat(MAX_REPLACE_BYTES);
        let charged = cost("StringSplit", &[s(&big), s(",")]);
        assert!(charged > crate::eval::MAX_STEPS_PER_DOCUMENT, "{charged}");
        // A large text split into few pieces costs little.
        let few = format!("{}|{}", "x".repeat(MAX_REPLACE_BYTES / 2), "y".repeat(10));
        assert!(cost("StringSplit", &[s(&few), s("|")]) < 50_000);
        assert_eq!(cost("StringSplit", &[s("a,b"), s("")]), 1);
        assert_eq!(cost("StringSplit", &[None, s(",")]), 0);
    }

    #[test]
    fn string_join() {
        // The reference's examples.
        let words = strings(&["Iropa", "Mountain", "Bike"]);
        assert_eq!(
            call("StringJoin", &[words.clone(), s(" ")]),
            s("Iropa Mountain Bike")
        );
        assert_eq!(
            call("StringJoin", &[words.clone(), s("")]),
            s("IropaMountainBike")
        );
        assert_eq!(call("StringJoin", &[words, None]), None);
        assert_eq!(
            call("StringJoin", &[strings(&["6", "7", "4", "3"]), s("A")]),
            s("6A7A4A3")
        );
        assert_eq!(
            call("StringJoin", &[strings(&["Adventure", "LT"]), s("Works")]),
            s("AdventureWorksLT")
        );
        // Edges: empty and one-element arrays, non-string elements, the size limit.
        assert_eq!(call("StringJoin", &[strings(&[]), s(",")]), s(""));
        assert_eq!(call("StringJoin", &[strings(&["a"]), s(",")]), s("a"));
        assert_eq!(call("StringJoin", &[Some(json!(["a", 1])), s(",")]), None);
        assert_eq!(call("StringJoin", &[s("abc"), s(",")]), None);
        let half = "x".repeat(MAX_REPLACE_BYTES / 2);
        let two = Some(json!([half, half]));
        assert!(call("StringJoin", &[two.clone(), s("")]).is_some());
        assert_eq!(call("StringJoin", &[two, s("-")]), None);
    }

    #[test]
    fn substring_after_and_before() {
        // The reference's examples.
        let cases = [
            ("SubstringAfter", "contoso|north|2026", "|", "north|2026"),
            ("SubstringAfter", "a/b/c", "/", "b/c"),
            (
                "SubstringAfter",
                "bike::touring::frame",
                "::",
                "touring::frame",
            ),
            ("SubstringBefore", "contoso|north|2026", "|", "contoso"),
            ("SubstringBefore", "a/b/c", "/", "a"),
            ("SubstringBefore", "bike::touring::frame", "::", "bike"),
            ("LastSubstringAfter", "/products/shoes/boots", "/", "boots"),
            ("LastSubstringAfter", "A-B-C", "-", "C"),
            ("LastSubstringAfter", "bike::touring::frame", "::", "frame"),
            (
                "LastSubstringBefore",
                "/products/shoes/boots",
                "/",
                "/products/shoes",
            ),
            ("LastSubstringBefore", "A-B-C", "-", "A-B"),
            (
                "LastSubstringBefore",
                "bike::touring::frame",
                "::",
                "bike::touring",
            ),
            // No delimiter: "".
            ("SubstringAfter", "abc", "|", ""),
            ("SubstringBefore", "abc", "|", ""),
            ("LastSubstringAfter", "abc", "|", ""),
            ("LastSubstringBefore", "abc", "|", ""),
            // Multi-byte characters are never split.
            ("SubstringAfter", "é😀é", "😀", "é"),
            ("LastSubstringBefore", "a😀b😀c", "😀", "a😀b"),
        ];
        for (name, text, delimiter, expected) in cases {
            assert_eq!(
                call(name, &[s(text), s(delimiter)]),
                s(expected),
                "{name}({text:?}, {delimiter:?})"
            );
        }
        for name in [
            "SubstringAfter",
            "SubstringBefore",
            "LastSubstringAfter",
            "LastSubstringBefore",
        ] {
            assert_eq!(call(name, &[None, s("/")]), None, "{name}");
            assert_eq!(call(name, &[s("a/b"), None]), None, "{name}");
            assert_eq!(call(name, &[n(1.0), s("/")]), None, "{name}");
        }
    }

    #[test]
    fn last_index_of() {
        // The reference's examples.
        assert_eq!(call("LastIndexOf", &[s("abcdeabc"), s("abc")]), n(5.0));
        assert_eq!(
            call("LastIndexOf", &[s("abcdeabc"), s("abc"), n(6.0)]),
            n(0.0)
        );
        assert_eq!(
            call("LastIndexOf", &[s("abcdeabc"), s("abc"), n(7.0)]),
            n(5.0)
        );
        assert_eq!(call("LastIndexOf", &[s("abcdeabc"), s("fg")]), n(-1.0));
        // Edges: a start past the end searches everything, a negative one finds nothing;
        // positions count characters.
        assert_eq!(
            call("LastIndexOf", &[s("abcdeabc"), s("abc"), n(100.0)]),
            n(5.0)
        );
        assert_eq!(
            call("LastIndexOf", &[s("abcdeabc"), s("abc"), n(-1.0)]),
            n(-1.0)
        );
        assert_eq!(call("LastIndexOf", &[s("😀a😀a"), s("a")]), n(3.0));
        assert_eq!(call("LastIndexOf", &[s("abc"), s("")]), n(3.0));
        assert_eq!(call("LastIndexOf", &[s("abc"), n(1.0)]), None);
        assert_eq!(call("LastIndexOf", &[s("abc"), s("a"), s("1")]), None);
    }

    #[test]
    fn contains_all_and_any() {
        // The reference's examples, in order: ALL_CI, ALL_CS, ANY_CI, ANY_CS. One differs:
        // the CONTAINS_ALL_CS page shows `true` for "have" in "Have a nice day!", which
        // contradicts the same page's definition (`CONTAINS(s, "have", false) AND ...`);
        // the definition is followed.
        let t = boolean(true);
        let f = boolean(false);
        let day = "Have a nice day!";
        type Arg = Option<Value>;
        let cases: [(&[Arg], [Arg; 4]); 5] = [
            (
                &[s("have"), s("nice"), s("day!")],
                [t.clone(), f.clone(), t.clone(), t.clone()],
            ),
            (
                &[s("HAVE"), s("NICE"), s("DAY!")],
                [t.clone(), f.clone(), t.clone(), f.clone()],
            ),
            (
                &[s("had"), s("nice"), s("day!")],
                [f.clone(), f.clone(), t.clone(), t.clone()],
            ),
            (
                &[None, s("nice"), s("day!")],
                [None, None, t.clone(), t.clone()],
            ),
            (&[None, s("had")], [f.clone(), f.clone(), None, None]),
        ];
        let names = [
            "CONTAINS_ALL_CI",
            "CONTAINS_ALL_CS",
            "CONTAINS_ANY_CI",
            "CONTAINS_ANY_CS",
        ];
        for (needles, expected) in cases {
            let mut args = vec![s(day)];
            args.extend(needles.iter().cloned());
            for (name, want) in names.iter().zip(expected) {
                assert_eq!(call(name, &args), want, "{name}{args:?}");
            }
        }
        // A non-string text leaves every test undefined.
        for name in names {
            assert_eq!(call(name, &[n(1.0), s("1")]), None, "{name}");
            assert_eq!(call(name, &[s("Straße"), s("")]), t, "{name}");
        }
        assert_eq!(call("CONTAINS_ALL_CI", &[s("ÉTÉ"), s("été")]), t);
        // Charged one scan of the text per substring.
        let text = "x".repeat(64 * 1000);
        assert_eq!(cost("CONTAINS_ANY_CS", &[s(&text), s("a"), s("b")]), 2000);
    }

    #[test]
    fn concat_strings_only() {
        assert_eq!(
            call("CONCAT", &[s("adventure"), s("works")]),
            s("adventureworks")
        );
        assert_eq!(call("concat", &[s("a"), s(""), s("b"), s("c")]), s("abc"));
        assert_eq!(call("CONCAT", &[s("a"), n(1.0)]), None);
        assert_eq!(call("CONCAT", &[s("a"), None]), None);
        assert_eq!(call("CONCAT", &[Some(json!(null)), s("a")]), None);
    }

    #[test]
    fn contains_starts_ends_equals() {
        // The reference's CONTAINS, ENDSWITH and StringEquals examples.
        assert_eq!(call("CONTAINS", &[s(AW), s("Adventure")]), boolean(true));
        assert_eq!(call("CONTAINS", &[s(AW), s("Works")]), boolean(true));
        assert_eq!(call("CONTAINS", &[s(AW), s("adventure")]), boolean(false));
        let no = Some(json!(false));
        assert_eq!(
            call("CONTAINS", &[s(AW), s("adventure"), no]),
            boolean(false)
        );
        let yes = Some(json!(true));
        assert_eq!(
            call("CONTAINS", &[s(AW), s("works"), yes.clone()]),
            boolean(true)
        );
        assert_eq!(call("CONTAINS", &[s(AW), s("Contoso")]), boolean(false));
        assert_eq!(call("ENDSWITH", &[s(AW), s("Adventure")]), boolean(false));
        assert_eq!(call("ENDSWITH", &[s(AW), s("Works")]), boolean(true));
        assert_eq!(call("ENDSWITH", &[s(AW), s("works")]), boolean(false));
        assert_eq!(
            call("ENDSWITH", &[s(AW), s("works"), yes.clone()]),
            boolean(true)
        );
        assert_eq!(call("STARTSWITH", &[s(AW), s("Adv")]), boolean(true));
        assert_eq!(
            call("STARTSWITH", &[s(AW), s("adv"), yes.clone()]),
            boolean(true)
        );
        assert_eq!(call("STARTSWITH", &[s(AW), s("")]), boolean(true));
        assert_eq!(call("StringEquals", &[s(AW), s(AW)]), boolean(true));
        assert_eq!(
            call("STRINGEQUALS", &[s(AW), s("adventureworks")]),
            boolean(false)
        );
        let args = [s(AW), s("adventureworks"), yes.clone()];
        assert_eq!(call("StringEquals", &args), boolean(true));
        assert_eq!(
            call("StringEquals", &[s("ÄÖ"), s("äö"), yes]),
            boolean(true)
        );
        // Wrong types, or a non-boolean ignore-case flag: undefined.
        assert_eq!(call("CONTAINS", &[n(1.0), s("1")]), None);
        assert_eq!(call("STARTSWITH", &[s(AW), None]), None);
        assert_eq!(call("ENDSWITH", &[s(AW), s("s"), s("true")]), None);
        assert_eq!(call("StringEquals", &[s("a"), s("a"), None]), None);
    }

    #[test]
    fn index_of_counts_characters() {
        // The reference's examples.
        assert_eq!(call("INDEX_OF", &[s(AW), s("A")]), n(0.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("s")]), n(13.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("Works")]), n(9.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("tureW")]), n(5.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("Cosmos")]), n(-1.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("Works"), n(5.0)]), n(9.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("Adventure"), n(5.0)]), n(-1.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("aD")]), n(-1.0));
        // Edges: negative start is 0, a start past the end finds nothing, unicode positions.
        assert_eq!(call("INDEX_OF", &[s(AW), s("A"), n(-5.0)]), n(0.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s(""), n(14.0)]), n(14.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s(""), n(15.0)]), n(-1.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("s"), n(1e300)]), n(-1.0));
        assert_eq!(call("INDEX_OF", &[s("héllo😀x"), s("x")]), n(6.0));
        assert_eq!(call("INDEX_OF", &[s("ééé"), s("é"), n(1.0)]), n(1.0));
        assert_eq!(call("INDEX_OF", &[s(AW), s("A"), s("0")]), None);
        assert_eq!(call("INDEX_OF", &[s(AW), n(1.0)]), None);
    }

    #[test]
    fn left_right_substring_length() {
        // The reference's LEFT, RIGHT, SUBSTRING and LENGTH examples.
        for (k, left, right) in [
            (0.0, "", ""),
            (1.0, "A", "s"),
            (5.0, "Adven", "Works"),
            (14.0, AW, AW),
            (100.0, AW, AW),
        ] {
            assert_eq!(call("LEFT", &[s(AW), n(k)]), s(left));
            assert_eq!(call("RIGHT", &[s(AW), n(k)]), s(right));
        }
        assert_eq!(call("SUBSTRING", &[s(AW), n(0.0), n(9.0)]), s("Adventure"));
        assert_eq!(call("SUBSTRING", &[s(AW), n(9.0), n(5.0)]), s("Works"));
        assert_eq!(call("SUBSTRING", &[s(AW), n(0.0), n(14.0)]), s(AW));
        assert_eq!(call("SUBSTRING", &[s(AW), n(0.0), n(-1.0)]), s(""));
        assert_eq!(call("LENGTH", &[s(AW)]), n(14.0));
        assert_eq!(call("LENGTH", &[s("")]), n(0.0));
        assert_eq!(call("LENGTH", &[Some(json!(null))]), None);
        assert_eq!(call("LENGTH", &[n(0.0)]), None);
        assert_eq!(call("LENGTH", &[Some(json!(["Adventure", "Works"]))]), None);
        // Edges: out of range, negative, fractional, huge, unicode.
        assert_eq!(call("LEFT", &[s(AW), n(-3.0)]), s(""));
        assert_eq!(call("RIGHT", &[s(AW), n(-3.0)]), s(""));
        assert_eq!(call("LEFT", &[s(AW), n(2.9)]), s("Ad"));
        assert_eq!(call("LEFT", &[s(AW), n(1e300)]), s(AW));
        assert_eq!(call("RIGHT", &[s(AW), n(-1e300)]), s(""));
        assert_eq!(call("SUBSTRING", &[s(AW), n(-2.0), n(3.0)]), s("Adv"));
        assert_eq!(call("SUBSTRING", &[s(AW), n(20.0), n(3.0)]), s(""));
        assert_eq!(call("SUBSTRING", &[s(AW), n(12.0), n(1e300)]), s("ks"));
        assert_eq!(call("SUBSTRING", &[s(""), n(0.0), n(1.0)]), s(""));
        let emoji = "a😀é👍b";
        assert_eq!(call("LENGTH", &[s(emoji)]), n(5.0));
        assert_eq!(call("LEFT", &[s(emoji), n(2.0)]), s("a😀"));
        assert_eq!(call("RIGHT", &[s(emoji), n(2.0)]), s("👍b"));
        assert_eq!(call("SUBSTRING", &[s(emoji), n(1.0), n(3.0)]), s("😀é👍"));
        // Wrong types.
        assert_eq!(call("LEFT", &[s(AW), s("1")]), None);
        assert_eq!(call("RIGHT", &[None, n(1.0)]), None);
        assert_eq!(call("SUBSTRING", &[s(AW), n(0.0), None]), None);
        assert_eq!(call("SUBSTRING", &[n(12.0), n(0.0), n(1.0)]), None);
    }

    #[test]
    fn case_reverse_replace() {
        // The reference's LOWER, REVERSE and REPLACE examples.
        assert_eq!(call("LOWER", &[s("ADVENTURE_WORKS")]), s("adventure_works"));
        assert_eq!(call("LOWER", &[s("adventureWorks")]), s("adventureworks"));
        assert_eq!(call("UPPER", &[s("AdventureWorks")]), s("ADVENTUREWORKS"));
        assert_eq!(call("UPPER", &[s("straße")]), s("STRASSE"));
        assert_eq!(call("LOWER", &[n(1.0)]), None);
        assert_eq!(call("REVERSE", &[s(AW)]), s("skroWerutnevdA"));
        assert_eq!(call("REVERSE", &[s("a😀é")]), s("é😀a"));
        assert_eq!(call("REVERSE", &[s("")]), s(""));
        assert_eq!(call("REVERSE", &[Some(json!([1, 2]))]), None);
        let args = [s("AdventureWorksLT"), s("LT"), s("LT2")];
        assert_eq!(call("REPLACE", &args), s("AdventureWorksLT2"));
        assert_eq!(call("REPLACE", &[s("aXbXc"), s("X"), s("")]), s("abc"));
        assert_eq!(call("REPLACE", &[s("abc"), s(""), s("-")]), s("abc"));
        assert_eq!(call("REPLACE", &[s("abc"), s("b"), n(1.0)]), None);
        // A result over the limit is undefined, not built.
        let big = "x".repeat(MAX_REPLACE_BYTES / 4 + 1);
        let args = [s("abcd"), s("b"), s(&big)];
        assert!(call("REPLACE", &args).is_some());
        let args = [s(&"b".repeat(8)), s("b"), s(&big)];
        assert_eq!(call("REPLACE", &args), None);
    }

    #[test]
    fn trims() {
        // The reference's LTRIM, RTRIM and TRIM examples.
        let cases = [
            (
                "  AdventureWorks",
                None,
                "AdventureWorks",
                "  AdventureWorks",
            ),
            (
                "  AdventureWorks  ",
                None,
                "AdventureWorks  ",
                "  AdventureWorks",
            ),
            (
                "AdventureWorks  ",
                None,
                "AdventureWorks  ",
                "AdventureWorks",
            ),
            (AW, Some("Works"), AW, "Adventure"),
            (AW, Some("Adventure"), "Works", AW),
            (AW, Some(AW), "", ""),
            (AW, Some(""), AW, AW),
        ];
        for (input, chars, ltrim, rtrim) in cases {
            let mut args = vec![s(input)];
            args.extend(chars.map(s));
            assert_eq!(call("LTRIM", &args), s(ltrim), "LTRIM {args:?}");
            assert_eq!(call("RTRIM", &args), s(rtrim), "RTRIM {args:?}");
        }
        assert_eq!(call("TRIM", &[s("   AdventureWorks   ")]), s(AW));
        assert_eq!(call("TRIM", &[s("\t\n\u{3000}x\u{a0}")]), s("x"));
        assert_eq!(
            call("TRIM", &[s("---AdventureWorks---")]),
            s("---AdventureWorks---")
        );
        assert_eq!(call("TRIM", &[s("___AdventureWorks___"), s("_")]), s(AW));
        let args = [s("-- AdventureWorks --"), s("-")];
        assert_eq!(call("TRIM", &args), s(" AdventureWorks "));
        assert_eq!(call("TRIM", &[s("-_-AdventureWorks-_-"), s("-_")]), s(AW));
        assert_eq!(call("TRIM", &[s("😀x😀"), s("😀")]), s("x"));
        assert_eq!(call("TRIM", &[n(1.0)]), None);
        assert_eq!(call("LTRIM", &[s(" a"), n(1.0)]), None);
        assert_eq!(call("RTRIM", &[s("a "), None]), None);
    }

    #[test]
    fn replicate_is_bounded() {
        // The reference's example, and its limits: 10,000 characters, negative is undefined.
        assert_eq!(
            call("REPLICATE", &[s("Cosmic"), n(3.0)]),
            s("CosmicCosmicCosmic")
        );
        assert_eq!(call("REPLICATE", &[s("a"), n(0.0)]), s(""));
        assert_eq!(call("REPLICATE", &[s("ab"), n(2.7)]), s("abab"));
        assert_eq!(call("REPLICATE", &[s("a"), n(-1.0)]), None);
        let ten_thousand = call("REPLICATE", &[s("é"), n(10_000.0)]);
        assert_eq!(ten_thousand, s(&"é".repeat(10_000)));
        assert_eq!(call("REPLICATE", &[s("ab"), n(5_001.0)]), None);
        assert_eq!(call("REPLICATE", &[s("x"), n(1e15)]), None);
        assert_eq!(call("REPLICATE", &[s("x"), n(f64::MAX)]), None);
        assert_eq!(call("REPLICATE", &[s(""), n(1e15)]), s(""));
        assert_eq!(call("REPLICATE", &[s("x"), s("3")]), None);
        assert_eq!(call("REPLICATE", &[n(1.0), n(3.0)]), None);
    }

    #[test]
    fn string_to_values() {
        // The reference's StringToNumber examples.
        assert_eq!(call("StringToNumber", &[s("100")]), n(100.0));
        assert_eq!(call("StringToNumber", &[s("3.25")]), n(3.25)); // The reference has 3.14.
        assert_eq!(call("StringToNumber", &[s("   60   ")]), n(60.0));
        assert_eq!(
            call("StringToNumber", &[s("-1.79769e+308")]),
            n(-1.79769e308)
        );
        assert_eq!(call("StringToNumber", &[s("Hello")]), None);
        assert_eq!(call("StringToNumber", &[None]), None);
        assert_eq!(call("StringToNumber", &[Some(json!(null))]), None);
        assert_eq!(call("StringToNumber", &[s(" 1.0 ")]), Some(json!(1)));
        for bad in [
            "NaN", "Infinity", "1e400", "0x10", "1 2", "", "\"1\"", "+1", ".5",
        ] {
            assert_eq!(call("StringToNumber", &[s(bad)]), None, "{bad:?}");
        }
        // StringToBoolean / StringToNull examples.
        assert_eq!(call("StringToBoolean", &[s("true")]), boolean(true));
        assert_eq!(call("StringToBoolean", &[s("true  ")]), boolean(true));
        assert_eq!(call("StringToBoolean", &[s("  false  ")]), boolean(false));
        assert_eq!(call("StringToBoolean", &[Some(json!(true))]), None);
        assert_eq!(call("StringToBoolean", &[s("False")]), None);
        assert_eq!(call("StringToNull", &[s("  null  ")]), Some(json!(null)));
        assert_eq!(call("StringToNull", &[s("NULL")]), None);
        assert_eq!(call("StringToNull", &[s("Null")]), None);
        assert_eq!(call("StringToNull", &[Some(json!(null))]), None);
        // StringToArray / StringToObject examples.
        assert_eq!(call("StringToArray", &[s("[]")]), Some(json!([])));
        let text = r#"[ { "types": [ "coats", "gloves" ] }, [ "hats" ], 76, false, null ]"#;
        let parsed = json!([{ "types": ["coats", "gloves"] }, ["hats"], 76, false, null]);
        assert_eq!(call("StringToArray", &[s(text)]), Some(parsed));
        assert_eq!(
            call("StringToArray", &[s("[ 'coats', 'gloves', 'hats' ]")]),
            None
        );
        assert_eq!(call("StringToArray", &[s("{}")]), None);
        assert_eq!(call("StringToObject", &[s("{}")]), Some(json!({})));
        let text = r#"{"division": {"name": "Sales"}}"#;
        let parsed = json!({"division": {"name": "Sales"}});
        assert_eq!(call("StringToObject", &[s(text)]), Some(parsed));
        assert_eq!(call("StringToObject", &[s("{'price': 27.55}")]), None);
        assert_eq!(call("StringToObject", &[s("[]")]), None);
        // Deep nesting is refused by the parser, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(call("StringToArray", &[s(&deep)]), None);
    }

    #[test]
    fn to_string_writes_javascript_numbers_and_compact_json() {
        // The reference's examples.
        assert_eq!(call("ToString", &[n(125.0)]), s("125"));
        assert_eq!(call("ToString", &[n(0.1234)]), s("0.1234"));
        assert_eq!(call("ToString", &[Some(json!(false))]), s("false"));
        assert_eq!(call("ToString", &[Some(json!([1, 2, 3]))]), s("[1,2,3]"));
        let object = Some(json!({ "department": "Bicycles" }));
        assert_eq!(
            call("ToString", &[object]),
            s(r#"{"department":"Bicycles"}"#)
        );
        assert_eq!(call("ToString", &[s("Hello World")]), s("Hello World"));
        assert_eq!(call("ToString", &[None]), None);
        assert_eq!(call("ToString", &[Some(json!(null))]), s("null"));
        // Whole doubles lose the ".0", inside arrays too; strings are escaped.
        let mixed = Some(json!([1.0, -2.5, "a\"\n", {"k": [null, 1e21]}]));
        let text = r#"[1,-2.5,"a\"\n",{"k":[null,1e+21]}]"#;
        assert_eq!(call("ToString", &[mixed]), s(text));
        assert_eq!(
            call("ToString", &[Some(json!(u64::MAX))]),
            s("18446744073709552000")
        );
        for (x, text) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(call_val("ToString", &[Val::NonFinite(x)]), s(text));
        }
    }

    #[test]
    fn non_finite_numbers_as_arguments() {
        let (inf, nan) = (Val::NonFinite(f64::INFINITY), Val::NonFinite(f64::NAN));
        let neg_inf = Val::NonFinite(f64::NEG_INFINITY);
        let abc = Val::Json(json!("abc"));
        let one = Val::Json(json!(1));
        // Integer arguments as in JavaScript: Infinity past the end, NaN as 0.
        assert_eq!(call_val("LEFT", &[abc.clone(), inf.clone()]), s("abc"));
        assert_eq!(call_val("LEFT", &[abc.clone(), nan.clone()]), s(""));
        assert_eq!(call_val("RIGHT", &[abc.clone(), inf.clone()]), s("abc"));
        let args = [abc.clone(), neg_inf.clone(), inf.clone()];
        assert_eq!(call_val("SUBSTRING", &args), s("abc"));
        let args = [abc.clone(), one.clone(), nan.clone()];
        assert_eq!(call_val("SUBSTRING", &args), s(""));
        let args = [abc.clone(), Val::Json(json!("c")), nan.clone()];
        assert_eq!(call_val("INDEX_OF", &args), n(2.0));
        assert_eq!(call_val("REPLICATE", &[abc.clone(), inf.clone()]), None);
        assert_eq!(call_val("REPLICATE", &[abc.clone(), nan.clone()]), s(""));
        // Not strings.
        assert_eq!(call_val("StringToNumber", std::slice::from_ref(&nan)), None);
        assert_eq!(call_val("StringToNumber", std::slice::from_ref(&inf)), None);
        assert_eq!(call_val("CONCAT", &[abc.clone(), inf.clone()]), None);
        assert_eq!(call_val("LENGTH", &[inf]), None);
        assert_eq!(call_val("UPPER", &[nan]), None);
    }

    #[test]
    fn doubles_format_as_in_javascript() {
        for (x, text) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (100.0, "100"),
            (123.456, "123.456"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (1e-6, "0.000001"),
            (1.5e-6, "0.0000015"),
            (1e-7, "1e-7"),
            (-2.5e-7, "-2.5e-7"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (9007199254740993.0, "9007199254740992"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(format_double(x), text, "{x:e}");
        }
    }

    #[test]
    fn regex_match() {
        // The reference's examples.
        let cases = [
            ("abcd", "ABC", None, false),
            ("abcd", "ABC", Some("i"), true),
            ("abcd", "ab.", Some(""), true),
            ("abcd", "ab c", Some("x"), true),
            ("abcd", "aB c", Some("ix"), true),
            ("03a", "[0-9]", None, true),
            ("salt3824908", "salt{1}", None, true),
            ("shame", "s....", Some("i"), true),
        ];
        for (text, pattern, modifiers, expected) in cases {
            let mut args = vec![s(text), s(pattern)];
            args.extend(modifiers.map(s));
            assert_eq!(call("RegexMatch", &args), boolean(expected), "{args:?}");
        }
        assert_eq!(call("RegexMatch", &[s("a\nb"), s("^b$")]), boolean(false));
        assert_eq!(
            call("RegexMatch", &[s("a\nb"), s("^b$"), s("m")]),
            boolean(true)
        );
        assert_eq!(call("RegexMatch", &[s("a\nb"), s("a.b")]), boolean(false));
        assert_eq!(
            call("RegexMatch", &[s("a\nb"), s("a.b"), s("s")]),
            boolean(true)
        );
        assert_eq!(
            call("RegexMatch", &[s("ÉTÉ"), s("été"), s("i")]),
            boolean(true)
        );
        // Wrong types: undefined.
        assert_eq!(call("RegexMatch", &[n(1.0), s("1")]), None);
        assert_eq!(call("RegexMatch", &[s("1"), n(1.0)]), None);
        assert_eq!(
            call("RegexMatch", &[s("1"), s("1"), Some(json!(true))]),
            None
        );
    }

    #[test]
    fn regex_match_errors() {
        let f = lookup("REGEXMATCH").expect("known function");
        let ctx = Context::new(0, 1);
        let error = |args: &[Option<Value>]| {
            super::super::call_json(f, &ctx, args)
                .expect_err("an error")
                .0
        };
        let message = error(&[s("a"), s("(a")]);
        assert!(message.starts_with("RegexMatch: invalid regular expression \"(a\": "));
        assert!(error(&[s("a"), s("a"), s("g")]).contains("unknown modifier 'g'"));
        // PCRE-only syntax is rejected rather than misread.
        error(&[s("aa"), s("(a)\\1")]);
        error(&[s("ab"), s("a(?=b)")]);
        // A pattern too big to compile within the limit is an error, even for undefined input.
        let message = error(&[None, s(r"\w{1000}\w{1000}\w{1000}")]);
        assert!(message.contains("size limit"), "{message}");
    }
}
