//! Index terms: a document path and the value there, encoded so that byte order is the order
//! queries compare in (Cosmos DB's type order, then the value).
//!
//! A term is `path | tag | value`. The path is each property name escaped (`0x00` becomes
//! `0x00 0xFF`) and followed by `0x00 0x01`, then `0x00 0x00`. Tags rank the types as `ORDER BY`
//! does: null < false < true < numbers < strings < arrays < objects. Numbers are 8 bytes whose
//! order is `f64::total_cmp`'s; strings are escaped and end with `0x00 0x00`, so a term is
//! self-delimiting and a string's encoding is a prefix of every string it prefixes (what
//! `STARTSWITH` scans). A string longer than [`MAX_STRING_TERM`] bytes is known by its first
//! bytes and ends with `0x00 0x01` instead: it sorts right after the string equal to its prefix
//! and before every string greater than that prefix, as it does in queries, so only strings
//! sharing a prefix tie (lookups that reach them read the document to decide). Arrays and
//! objects get a term without a value (for `IS_DEFINED`, and to sort after the scalars);
//! what is inside them is not indexed (a change here is a new
//! [`TERMS_LAYOUT`](crate::storage::TERMS_LAYOUT)). Terms that tie in place of their values are
//! [`is_orderable`]'s exceptions, which an ordered read sorts by reading their documents.

use serde_json::{Map, Value};

use crate::model::{IndexPaths, InvalidInput};
use crate::storage::Term;
#[cfg(test)]
use crate::storage::prefix_end;

/// String bytes a term holds exactly; longer strings are indexed by this prefix.
pub(crate) const MAX_STRING_TERM: usize = 256;
/// Encoded path bytes a term may have; deeper or longer paths are not indexed (and the planner
/// never asks for them).
pub(crate) const MAX_PATH_TERM: usize = 1024;

pub(crate) const TAG_NULL: u8 = 0x10;
pub(crate) const TAG_FALSE: u8 = 0x20;
pub(crate) const TAG_TRUE: u8 = 0x21;
pub(crate) const TAG_NUMBER: u8 = 0x30;
pub(crate) const TAG_STRING: u8 = 0x40;
pub(crate) const TAG_ARRAY: u8 = 0x50;
pub(crate) const TAG_OBJECT: u8 = 0x60;

/// Appends `bytes`, escaped so that `0x00` never appears alone.
pub(crate) fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
}

/// The encoded path, the prefix of every term at it; `None` if it is too long to index.
pub(crate) fn path_prefix<S: AsRef<str>>(path: &[S]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for segment in path {
        escape_into(segment.as_ref().as_bytes(), &mut out);
        out.extend_from_slice(&[0, 1]);
    }
    out.extend_from_slice(&[0, 0]);
    (out.len() <= MAX_PATH_TERM).then_some(out)
}

/// An `f64` as 8 bytes in `total_cmp` order, with -0 as 0 (they are equal in queries, and
/// stored bodies may carry either).
pub(crate) fn number_bytes(n: f64) -> [u8; 8] {
    let n = if n == 0.0 { 0.0 } else { n };
    let bits = n.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    };
    ordered.to_be_bytes()
}

/// Appends the tag and value of a scalar or container (the term after its path).
pub(crate) fn push_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.push(TAG_NULL),
        Value::Bool(false) => out.push(TAG_FALSE),
        Value::Bool(true) => out.push(TAG_TRUE),
        Value::Number(n) => {
            out.push(TAG_NUMBER);
            out.extend_from_slice(&number_bytes(n.as_f64().unwrap_or(0.0)));
        }
        Value::String(s) => push_string(s, out),
        Value::Array(_) => out.push(TAG_ARRAY),
        Value::Object(_) => out.push(TAG_OBJECT),
    }
}

/// Ends a string known exactly.
const EXACT_END: [u8; 2] = [0, 0];
/// Ends a string known by its first [`MAX_STRING_TERM`] bytes: above [`EXACT_END`] (the
/// string equal to the prefix), below any escaped byte (a string going on from it).
const PREFIX_END: [u8; 2] = [0, 1];

/// Appends a string's tag and value: exact if short, else its prefix and [`PREFIX_END`].
pub(crate) fn push_string(s: &str, out: &mut Vec<u8>) {
    out.push(TAG_STRING);
    if s.len() <= MAX_STRING_TERM {
        escape_into(s.as_bytes(), out);
        out.extend_from_slice(&EXACT_END);
    } else {
        escape_into(&s.as_bytes()[..MAX_STRING_TERM], out);
        out.extend_from_slice(&PREFIX_END);
    }
}

/// Appends the bytes every string starting with `prefix` begins with (no terminator): the
/// lower bound of a `STARTSWITH` scan. A prefix longer than [`MAX_STRING_TERM`] gives the
/// term of the long strings that share its first bytes (a range that may hold others).
pub(crate) fn push_string_prefix(prefix: &str, out: &mut Vec<u8>) {
    out.push(TAG_STRING);
    if prefix.len() <= MAX_STRING_TERM {
        escape_into(prefix.as_bytes(), out);
    } else {
        escape_into(&prefix.as_bytes()[..MAX_STRING_TERM], out);
        out.extend_from_slice(&PREFIX_END);
    }
}

/// Bytes of index terms a write may give one document (its entries' keys hold about as many
/// again). Without a bound, a 2 MiB document of many properties under a 1 KiB nested path
/// would write hundreds of MiB of entries.
pub(crate) const MAX_DOCUMENT_TERM_BYTES: usize = 4 << 20;

/// The terms of a document body under `paths`, sorted and without duplicates.
pub(crate) fn document_terms(body: &Map<String, Value>, paths: &IndexPaths) -> Vec<Term> {
    let (mut terms, mut unbounded) = (Vec::new(), usize::MAX);
    walk(body, paths, &mut Vec::new(), &mut terms, &mut unbounded);
    terms.sort_unstable();
    terms.dedup();
    terms
}

/// [`document_terms`], refused past [`MAX_DOCUMENT_TERM_BYTES`] (what writes compute; the
/// walk stops there, so a refusal costs no more than the limit).
pub(crate) fn bounded_document_terms(
    body: &Map<String, Value>,
    paths: &IndexPaths,
) -> Result<Vec<Term>, InvalidInput> {
    let mut terms = Vec::new();
    let mut budget = MAX_DOCUMENT_TERM_BYTES;
    if !walk(body, paths, &mut Vec::new(), &mut terms, &mut budget) {
        return Err(InvalidInput::IndexTermsTooLarge {
            limit: MAX_DOCUMENT_TERM_BYTES,
        });
    }
    terms.sort_unstable();
    terms.dedup();
    Ok(terms)
}

/// Appends the terms under `object`; `false` once they would take more than `budget` bytes.
fn walk<'a>(
    object: &'a Map<String, Value>,
    paths: &IndexPaths,
    path: &mut Vec<&'a str>,
    terms: &mut Vec<Term>,
    budget: &mut usize,
) -> bool {
    for (name, value) in object {
        path.push(name);
        if paths.includes(path)
            && let Some(mut term) = path_prefix(path)
        {
            push_value(value, &mut term);
            match budget.checked_sub(term.len()) {
                Some(left) => *budget = left,
                None => return false,
            }
            terms.push(term);
        }
        if let Value::Object(inner) = value
            && !walk(inner, paths, path, terms, budget)
        {
            return false;
        }
        path.pop();
    }
    true
}

/// The path part of a term.
pub(crate) fn term_path(term: &[u8]) -> &[u8] {
    let mut i = 0;
    while i + 1 < term.len() {
        if term[i] == 0 {
            match term[i + 1] {
                0 => return &term[..i + 2],
                _ => i += 2,
            }
        } else {
            i += 1;
        }
    }
    term
}

/// The value a document has at an encoded path (see [`path_prefix`]); `None` where the path
/// is undefined.
pub(crate) fn value_at<'a>(body: &'a Map<String, Value>, path: &[u8]) -> Option<&'a Value> {
    let mut object = body;
    let mut segment = Vec::new();
    let mut i = 0;
    loop {
        match (path.get(i)?, path.get(i + 1)) {
            (0, Some(0xFF)) => {
                segment.push(0);
                i += 2;
            }
            (0, Some(1)) => {
                let value = object.get(std::str::from_utf8(&segment).ok()?)?;
                segment.clear();
                i += 2;
                if path.get(i..) == Some(&[0, 0]) {
                    return Some(value);
                }
                object = value.as_object()?;
            }
            // The end of an empty path, or not a path.
            (0, _) => return None,
            (&b, _) => {
                segment.push(b);
                i += 1;
            }
        }
    }
}

/// The term a document has at an encoded path; `None` where the path is undefined. What a
/// query checks an entry against: an entry read before its document was rewritten no longer
/// names it.
pub(crate) fn term_at(body: &Map<String, Value>, path: &[u8]) -> Option<Term> {
    let value = value_at(body, path)?;
    let mut term = path.to_vec();
    push_value(value, &mut term);
    Some(term)
}

/// Whether a term's value sorts among others by its bytes (exact scalars). Long strings,
/// arrays and objects sort by their bytes only among other values; equal terms of theirs may
/// hold different values.
pub(crate) fn is_orderable(term: &[u8]) -> bool {
    let path = term_path(term);
    match term.get(path.len()) {
        Some(&TAG_STRING) => !term.ends_with(&PREFIX_END),
        Some(&tag) => tag < TAG_STRING,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn term(path: &[&str], value: &Value) -> Vec<u8> {
        let mut t = path_prefix(path).expect("short");
        push_value(value, &mut t);
        t
    }

    #[test]
    fn writes_refuse_documents_whose_terms_pass_the_limit() {
        // 20,000 properties under an 840-byte path: ~17 MB of terms from a ~250 KB document.
        let mut inner = Value::Object((0..20_000).map(|i| (format!("p{i}"), json!(i))).collect());
        for level in 0..40 {
            inner = json!({ format!("level-{level:013}"): inner });
        }
        let body = inner.as_object().expect("object");
        let refused = bounded_document_terms(body, &IndexPaths::default());
        assert!(matches!(
            refused,
            Err(InvalidInput::IndexTermsTooLarge { .. })
        ));
        let small = json!({"a": {"b": 1}, "c": "x"});
        let small = small.as_object().expect("object");
        assert_eq!(
            bounded_document_terms(small, &IndexPaths::default()).expect("fits"),
            document_terms(small, &IndexPaths::default())
        );
    }

    #[test]
    fn term_at_finds_what_document_terms_indexed() {
        let body = json!({"a": {"b\u{0}c": "x", "n": 2}, "s": "y".repeat(300), "arr": [1]});
        let body = body.as_object().expect("object");
        let all = document_terms(body, &IndexPaths::default());
        for path in [&["a", "b\u{0}c"][..], &["a", "n"], &["a"], &["s"], &["arr"]] {
            let found = term_at(body, &path_prefix(path).expect("short")).expect("defined");
            assert!(all.contains(&found), "{path:?}");
        }
        for path in [&["a", "zz"][..], &["s", "t"], &["none"]] {
            assert_eq!(term_at(body, &path_prefix(path).expect("short")), None);
        }
    }

    #[test]
    fn terms_sort_in_the_query_type_order() {
        let values = [
            json!(null),
            json!(false),
            json!(true),
            json!(-1e300),
            json!(-2),
            json!(-0.5),
            json!(0),
            json!(0.25),
            json!(3),
            json!(1e300),
            json!(""),
            json!("A"),
            json!("a"),
            json!("a\u{0}"),
            json!("ab"),
            json!("b"),
            json!("x".repeat(MAX_STRING_TERM)),
            json!("x".repeat(MAX_STRING_TERM + 1)),
            json!(format!("{}y", "x".repeat(MAX_STRING_TERM - 1))),
            json!("é"),
            json!([1]),
            json!({"a": 1}),
        ];
        let terms: Vec<_> = values.iter().map(|v| term(&["p"], v)).collect();
        for pair in terms.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
        }
        // Each is self-delimiting: no term is a prefix of another.
        for (i, a) in terms.iter().enumerate() {
            for b in &terms[i + 1..] {
                assert!(!b.starts_with(a));
            }
        }
    }

    #[test]
    fn a_string_prefix_bounds_the_strings_it_starts() {
        let mut low = path_prefix(&["p"]).expect("short");
        push_string_prefix("ab", &mut low);
        let high = prefix_end(&low).expect("bounded");
        for (s, inside) in [
            ("ab", true),
            ("abc", true),
            ("ab\u{0}", true),
            ("aa", false),
            ("ac", false),
            ("a", false),
        ] {
            let t = term(&["p"], &json!(s));
            assert_eq!(t >= low && t < high, inside, "{s:?}");
        }
    }

    #[test]
    fn documents_give_a_term_per_included_path() {
        let body = json!({"id": "1", "a": {"b": 2, "c": [1, 2]}, "_etag": "x", "s": "t"});
        let Value::Object(body) = body else {
            unreachable!()
        };
        let terms = document_terms(&body, &IndexPaths::default());
        let mut expected = vec![
            term(&["id"], &json!("1")),
            term(&["a"], &json!({})),
            term(&["a", "b"], &json!(2)),
            term(&["a", "c"], &json!([])),
            term(&["s"], &json!("t")),
        ];
        expected.sort();
        assert_eq!(terms, expected);
        assert!(
            terms
                .iter()
                .all(|t| term_path(t) != path_prefix(&["_etag"]).expect("short"))
        );
        assert_eq!(
            term_path(&terms[0]),
            &path_prefix(&["a"]).expect("short")[..]
        );
        assert!(is_orderable(&term(&["a"], &json!(1))));
        assert!(!is_orderable(&term(&["a"], &json!([]))));
        assert!(!is_orderable(&term(&["a"], &json!("y".repeat(300)))));
        assert!(is_orderable(&term(&["a"], &json!("y\u{1}"))));
        assert!(is_orderable(&term(&["a"], &json!(null))));
    }

    #[test]
    fn paths_do_not_prefix_each_other() {
        let a = path_prefix(&["a"]).expect("short");
        let ab = path_prefix(&["a", "b"]).expect("short");
        let a0 = path_prefix(&["a\u{0}"]).expect("short");
        assert!(!ab.starts_with(&a) && !a0.starts_with(&a));
        assert!(path_prefix(&["x".repeat(MAX_PATH_TERM)]).is_none());
    }
}
