//! Robustness of the query language against hostile input: query text, parameters and
//! document contents all come from clients, so nothing reachable from them may panic,
//! overflow the stack, hang or allocate without bound.
//!
//! Tests that could crash the process (stack overflow, allocation failure) or hang run in a
//! child process of this test binary ([`isolated`]): on a thread with a 1.5 MiB stack (a
//! tokio worker's 2 MiB, less room for the server's own frames), with its address space limited and a deadline, so that a
//! failure is reported as a failed test rather than taking the whole binary down.
//!
//! Tests written as the behavior we want, which the code may not (yet) have, say so in their
//! doc comment.

use std::{
    fmt::Write as _,
    fs,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use mayfly_query::{
    Context, ErrorKind, QueryError, functions, parse, parser::KEYWORDS, run, value::Val,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

// ---- Harness ----

const CHILD_TEST: &str = "MAYFLY_ROBUSTNESS_CHILD_TEST";
const CHILD_CASE: &str = "MAYFLY_ROBUSTNESS_CHILD_CASE";
/// Address space a child may use (KiB): enough for the test binary, small enough that an
/// unbounded allocation fails fast instead of swapping the machine.
const CHILD_MEMORY_KIB: u64 = 1536 * 1024;
/// The stack of a tokio worker thread (2 MiB), less 0.5 MiB for the frames a small query runs
/// under when the server evaluates it on the async worker itself (see the server's `QueryReads`).
const SERVER_STACK: usize = 1536 << 10;

/// How many child processes one test runs at once.
const PARALLEL_CHILDREN: usize = 3;

/// How long a case of bounded (linear) work may take: far past what it takes in a debug build
/// on a loaded 2-core machine (well under a second alone, up to 2 s when every test of this
/// file runs at once), far below what super-linear work on these sizes would take (minutes).
const LINEAR_WORK_LIMIT: Duration = Duration::from_secs(10);

/// Runs `body(case)` on a thread with a [`SERVER_STACK`] stack. In the parent test process this
/// spawns a child process running just `test` (which must be the calling test's name) for each
/// case, each with the memory limit and `timeout`, and fails listing every case that crashed,
/// failed or timed out. In the child it runs the body.
fn isolated(test: &str, cases: &[&str], timeout: Duration, body: fn(&str)) {
    if std::env::var(CHILD_TEST).as_deref() == Ok(test) {
        let case = std::env::var(CHILD_CASE).unwrap_or_default();
        let handle = thread::Builder::new()
            .name(format!("{test}/{case}"))
            .stack_size(SERVER_STACK)
            .spawn(move || body(&case))
            .expect("spawn");
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
        return;
    }
    let mut failures = Vec::new();
    for batch in cases.chunks(PARALLEL_CHILDREN) {
        let children: Vec<_> = batch.iter().map(|case| spawn_child(test, case)).collect();
        for (case, (mut child, log, started)) in batch.iter().zip(children) {
            let status = loop {
                if let Some(status) = child.try_wait().expect("wait") {
                    break Some(status);
                }
                if started.elapsed() > timeout {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                thread::sleep(Duration::from_millis(5));
            };
            let text = fs::read_to_string(&log).unwrap_or_default();
            let _ = fs::remove_file(&log);
            assert!(
                !text.contains("running 0 tests"),
                "isolated(): '{test}' is not this test's name"
            );
            let message = child_message(&text);
            match status {
                None => failures.push(format!(
                    "[{case}] still running after {timeout:?}: killed (a hang or super-linear work)\n    {message}"
                )),
                Some(s) if !s.success() => failures.push(format!(
                    "[{case}] crashed or failed ({s}) after {:?}\n    {message}",
                    started.elapsed()
                )),
                Some(_) => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} case(s) failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Starts this test binary running only `test`, for `case`, with its output to a log file.
fn spawn_child(test: &str, case: &str) -> (std::process::Child, std::path::PathBuf, Instant) {
    let exe = std::env::current_exe().expect("test binary");
    let log = std::env::temp_dir().join(format!(
        "mayfly-robustness-{}-{test}-{}.log",
        std::process::id(),
        case.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let out = fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {CHILD_MEMORY_KIB} 2>/dev/null; exec \"$0\" \"$@\""
        ))
        .arg(&exe)
        .args([
            test,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_TEST, test)
        .env(CHILD_CASE, case)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn child test");
    (child, log, Instant::now())
}

/// The child's own words: a panic message, a stack overflow, an allocation failure.
fn child_message(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines
        .iter()
        .position(|l| {
            l.contains("panicked at")
                || l.contains("overflowed its stack")
                || l.contains("memory allocation of")
        })
        .unwrap_or(lines.len());
    lines[from..]
        .iter()
        .take_while(|l| !l.starts_with("stack backtrace") && !l.starts_with("note:"))
        .take(4)
        .copied()
        .collect::<Vec<_>>()
        .join("\n    ")
}

fn ctx() -> Context {
    Context::new(1_700_000_000_000, 42)
}

fn no_params() -> Map<String, Value> {
    Map::new()
}

/// Runs `text` over `docs` with `params`.
fn run_with(
    text: &str,
    params: &Map<String, Value>,
    docs: &[Value],
) -> Result<Vec<Value>, QueryError> {
    run(text, params, docs, ctx())
}

/// Runs `text` over one small document.
fn run1(text: &str) -> Result<Vec<Value>, QueryError> {
    run_with(
        text,
        &no_params(),
        &[json!({"id": "1", "a": [1, 2, 3], "n": 5, "s": "x"})],
    )
}

/// A short description of a result, never the whole (possibly huge) value.
fn brief(r: &Result<Vec<Value>, QueryError>) -> String {
    match r {
        Err(e) => format!(
            "Err({:?}: {})",
            e.kind,
            e.message.chars().take(120).collect::<String>()
        ),
        Ok(values) => {
            let bytes: usize = values.iter().map(approximate_size).sum();
            let first = match values.first() {
                Some(v) if approximate_size(v) < 4096 => v.to_string().chars().take(80).collect(),
                Some(_) => "(large)".to_owned(),
                None => String::new(),
            };
            format!("Ok({} values, ~{bytes} bytes: {first})", values.len())
        }
    }
}

/// About how many bytes `v` takes as JSON, without writing it.
fn approximate_size(v: &Value) -> usize {
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

/// The result is a refusal for a limit (the query is too big, deep or costly).
#[track_caller]
fn assert_limit(text_for_message: &str, r: &Result<Vec<Value>, QueryError>) {
    match r {
        Err(e) if e.kind == ErrorKind::Limit => {}
        other => panic!(
            "{}: expected a Limit error, got {}",
            text_for_message.chars().take(60).collect::<String>(),
            brief(other)
        ),
    }
}

/// `"{open}" × n, inner, "{close}" × n`.
fn nest(open: &str, inner: &str, close: &str, n: usize) -> String {
    let mut s = String::with_capacity(n * (open.len() + close.len()) + inner.len());
    for _ in 0..n {
        s.push_str(open);
    }
    s.push_str(inner);
    for _ in 0..n {
        s.push_str(close);
    }
    s
}

/// `first (sep next) × (n - 1)`.
fn chain(first: &str, sep_next: &str, n: usize) -> String {
    let mut s = String::with_capacity(first.len() + n * sep_next.len());
    s.push_str(first);
    for _ in 1..n {
        s.push_str(sep_next);
    }
    s
}

/// A JSON value nested `depth` levels: arrays and objects alternating, a string at the bottom.
fn deep_json(depth: usize) -> Value {
    let mut v = json!("bottom");
    for i in 0..depth.saturating_sub(1) {
        v = if i % 2 == 0 {
            json!([v, i])
        } else {
            json!({"k": v, "i": i})
        };
    }
    json!({ "deep": v })
}

// ---- Deep nesting: each must be refused with a Limit error, not overflow a 2 MiB stack ----

/// The nesting constructs the parser counts (`MAX_DEPTH`): `(open, inner, close)`.
const NESTINGS: &[(&str, &str, &str, &str)] = &[
    ("parentheses", "(", "1", ")"),
    ("not", "NOT ", "true", ""),
    ("unary-minus", "- ", "1", ""),
    ("unary-plus", "+ ", "1", ""),
    ("bit-not", "~ ", "1", ""),
    ("unary-mixed", "-~+(", "1", ")"),
    ("array-literal", "[", "1", "]"),
    ("object-literal", "{\"a\":", "1", "}"),
    ("function-call", "ABS(", "1", ")"),
    ("iif", "IIF(true, ", "1", ", 2)"),
    ("coalesce", "1 ?? (", "1", ")"),
    ("coalesce-chain", "undefined ?? ", "1", ""),
    ("conditional", "true ? ", "1", " : 2"),
    ("conditional-else", "false ? 2 : ", "1", ""),
    ("index", "[1][", "0", "]"),
    ("in-list", "1 IN (", "1", ")"),
    ("scalar-subquery", "(SELECT VALUE ", "1", ")"),
    ("exists", "EXISTS(SELECT VALUE ", "1", ")"),
    ("array-subquery", "ARRAY(SELECT VALUE ", "1", ")"),
    ("between", "1 BETWEEN (", "0", ") AND 2"),
];

fn nesting_case(name: &str) -> (&'static str, &'static str, &'static str) {
    NESTINGS
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|&(_, o, i, c)| (o, i, c))
        .expect("known case")
}

/// 10,000 levels of each nesting construct (`((((1))))`, `NOT NOT ... true`, `- - - 1`,
/// `[[[1]]]`, `{"a":{"a":1}}`, `(SELECT VALUE (SELECT VALUE ...))`, ...) are refused with a
/// Limit error, on a 2 MiB stack, by `parse` and by `run`.
#[test]
fn nesting_10000_levels_is_refused() {
    let cases: Vec<&str> = NESTINGS.iter().map(|(n, ..)| *n).collect();
    isolated(
        "nesting_10000_levels_is_refused",
        &cases,
        Duration::from_secs(20),
        |case| {
            let (open, inner, close) = nesting_case(case);
            let text = format!("SELECT VALUE {}", nest(open, inner, close, 10_000));
            assert!(text.len() < 256 * 1024, "stays under the text limit");
            let parsed = parse(&text).map(|_| Vec::new());
            assert_limit(&text, &parsed);
            assert_limit(&text, &run1(&text));
            // Nested JOIN subqueries, whose depth the parser counts too.
            if case == "parentheses" {
                let text = format!(
                    "SELECT VALUE 1 FROM c {}",
                    nest("JOIN (SELECT VALUE 1 FROM c ", "", ") j ", 5_000)
                );
                assert_limit(&text, &parse(&text).map(|_| Vec::new()));
            }
        },
    );
}

/// The deepest nesting the parser accepts, of each construct, parses, runs, clones,
/// Debug-formats and drops on a 2 MiB stack: `MAX_DEPTH` must leave room for the evaluator.
#[test]
fn deepest_accepted_nesting_fits_a_server_stack() {
    let cases: Vec<&str> = NESTINGS.iter().map(|(n, ..)| *n).collect();
    isolated(
        "deepest_accepted_nesting_fits_a_server_stack",
        &cases,
        Duration::from_secs(20),
        |case| {
            let (open, inner, close) = nesting_case(case);
            let mut deepest = None;
            for n in 1..=300 {
                let text = format!("SELECT VALUE {}", nest(open, inner, close, n));
                match parse(&text) {
                    Ok(q) => deepest = Some((n, text, q)),
                    Err(e) if e.kind == ErrorKind::Limit => break,
                    Err(e) => panic!("{case} at depth {n}: {e}"),
                }
            }
            let (n, text, query) = deepest.expect("some depth parses");
            assert!(n < 300, "{case}: depth {n} accepted: no limit?");
            let copy = query.clone();
            assert_eq!(copy, query);
            let debug = format!("{query:?}");
            assert!(!debug.is_empty());
            drop(copy);
            let docs = [json!({"id": "1"}), deep_json(128)];
            let r = run_with(&text, &no_params(), &docs);
            assert!(r.is_ok(), "{case} at depth {n}: {}", brief(&r));
            // The same expression once per row of a subquery, and in WHERE.
            let expr = &text["SELECT VALUE ".len()..];
            for q in [
                format!("SELECT VALUE ARRAY(SELECT VALUE {expr} FROM x IN c.a) FROM c"),
                format!("SELECT * FROM c WHERE IS_DEFINED({expr}) OR true"),
            ] {
                // One level of nesting more than measured may tip it over the limit: fine.
                match run_with(&q, &no_params(), &[json!({"a": [1, 2]})]) {
                    Ok(_) => {}
                    Err(e) if e.kind == ErrorKind::Limit => {}
                    Err(e) => panic!("{case}: {e}"),
                }
            }
        },
    );
}

// ---- Long left-associative chains: the parser loops, but builds a tree as deep as the chain ----

/// `(name, first, repeated)`: `first`, then `repeated` many times.
const CHAINS: &[(&str, &str, &str)] = &[
    ("add", "1", "+1"),
    ("sub", "1", "-1"),
    ("mul", "1", "*1"),
    ("concat", "'a'", "||'a'"),
    ("bit-or", "1", "|1"),
    ("shift", "1", "<<0"),
    ("eq", "1", "=1"),
    ("and", "true", " AND true"),
    ("or", "false", " OR false"),
    ("in", "1", " IN (1)"),
    ("like", "'a'", " LIKE 'a'"),
    ("property", "c", ".a"),
    ("index", "c", "[0]"),
    ("computed-index", "c", "[@i]"),
];

fn chain_text(first: &str, repeated: &str) -> (usize, String) {
    // 100,000 terms of `+1`; 25,000 of the others (deep enough for any build, and under the
    // 256 KB text limit).
    let terms = if repeated == "+1" { 100_000 } else { 25_000 };
    (
        terms,
        format!("SELECT VALUE {} FROM c", chain(first, repeated, terms)),
    )
}

/// A 100,000-term `1+1+...+1` (and its cousins: `*`, `||`, `=`, `AND`, `OR`, `IN`, `LIKE`,
/// `.a.a.a`, `[0][0]`) must not overflow a 2 MiB stack anywhere: not in the parser, the binder,
/// the evaluator, nor when the tree is dropped. Either it runs (and gives the right answer for
/// `+`) or it is refused with a Limit error.
///
/// Regression test; it failed before the fix (every case overflows): the loops of `Parser::or`/`and`/`comparison`/
/// `binary_level`/`postfix` (parser.rs ~438-640) build a left spine as deep as the chain without
/// counting it (`enter()`), and every later pass recurses on it: `Binder::bind_expr`
/// (parser.rs ~972; overflows at ~3,000 terms in a debug build), `Evaluator::eval` (eval.rs ~96;
/// ~250 terms in debug, its frame is ~8 KB), `Expr::visit`, and the derived `Drop`, `Clone`,
/// `Debug` and `PartialEq`. Fix: build associative chains flat (n-ary `And`/`Or`/`Add`/...
/// nodes, evaluated in a loop) and cap the remaining spine depth (e.g. count chain length
/// toward `MAX_DEPTH` in steps, or a separate `MAX_CHAIN`), so every recursive pass is bounded.
#[test]
fn long_operator_chains_do_not_overflow() {
    let cases: Vec<&str> = CHAINS.iter().map(|(n, ..)| *n).collect();
    isolated(
        "long_operator_chains_do_not_overflow",
        &cases,
        Duration::from_secs(20),
        |case| {
            let &(_, first, repeated) = CHAINS.iter().find(|(n, ..)| *n == case).expect("case");
            let (terms, text) = chain_text(first, repeated);
            let mut params = Map::new();
            params.insert("@i".into(), json!(0));
            let doc = json!({"a": {"a": 1}});
            match parse(&text) {
                Err(e) => assert_eq!(e.kind, ErrorKind::Limit, "{case}: {e}"),
                Ok(q) => {
                    let copy = q.clone();
                    drop(copy);
                    let r = run_with(&text, &params, &[doc]);
                    match (&r, case) {
                        (Ok(v), "add") => assert_eq!(v, &vec![json!(terms)]),
                        (Ok(_), _) => {}
                        (Err(e), _) => assert_eq!(e.kind, ErrorKind::Limit, "{case}: {e}"),
                    }
                }
            }
        },
    );
}

/// A chain that fails to parse at its very end must not overflow either: the half-built tree
/// is dropped on the error path.
///
/// Regression test; it failed before the fix (same cause as `long_operator_chains_do_not_overflow`: the recursive
/// drop of a 100,000-deep `Box<Expr>` spine).
#[test]
fn long_chain_with_a_syntax_error_at_the_end_does_not_overflow() {
    isolated(
        "long_chain_with_a_syntax_error_at_the_end_does_not_overflow",
        &["add", "property"],
        Duration::from_secs(20),
        |case| {
            let text = match case {
                "add" => format!("SELECT VALUE {} )", chain("1", "+1", 100_000)),
                _ => format!("SELECT VALUE {} )", chain("c", ".a", 100_000)),
            };
            let e = parse(&text).expect_err("a syntax error or a limit");
            assert!(
                matches!(e.kind, ErrorKind::Syntax | ErrorKind::Limit),
                "{e}"
            );
        },
    );
}

/// Long but legitimate chains, as generated `OR` filters have, keep working: whatever limit
/// fixes the deep-chain overflow must not be as low as the nesting limit (64).
///
/// Regression test; it failed before the fix on `or` and `add` in a debug build: a 500-term chain overflows a
/// 2 MiB stack in `Evaluator::eval`, which recurses once per operator (see
/// `long_operator_chains_do_not_overflow`).
#[test]
fn moderately_long_chains_keep_working() {
    isolated(
        "moderately_long_chains_keep_working",
        &["or", "add", "in"],
        Duration::from_secs(20),
        |case| {
            let docs: Vec<Value> = (0..5)
                .map(|i| json!({"id": i.to_string(), "n": i}))
                .collect();
            let text = match case {
                "or" => format!(
                    "SELECT VALUE c.id FROM c WHERE {}",
                    (0..500)
                        .map(|i| format!("c.n = {i}"))
                        .collect::<Vec<_>>()
                        .join(" OR ")
                ),
                "add" => format!("SELECT VALUE {} FROM c", chain("c.n", " + 1", 500)),
                _ => format!(
                    "SELECT VALUE c.id FROM c WHERE c.n IN ({})",
                    (0..20_000)
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            let r = run_with(&text, &no_params(), &docs);
            assert!(
                r.as_ref().is_ok_and(|v| v.len() == 5),
                "{case}: {}",
                brief(&r)
            );
        },
    );
}

/// Thousands of JOINs: each JOIN is a level of recursion in `exec::joins` and a link in the
/// `Env` chain every alias lookup walks, so the number of JOINs must be limited (Limit error)
/// or the recursion removed.
///
/// Regression test; it failed before the fix (overflows): `Parser::query` (parser.rs ~229, `while
/// self.eat_keyword("JOIN")`) accepts any number of JOINs, and `exec::joins` (exec.rs ~197-221)
/// recurses once per JOIN. Cap JOINs (Cosmos DB documents no number; 16 or 32 is plenty) in
/// the parser with a Limit error.
#[test]
fn thousands_of_joins_do_not_overflow() {
    isolated(
        "thousands_of_joins_do_not_overflow",
        &["joins"],
        Duration::from_secs(20),
        |_| {
            let joins: String = (0..10_000).map(|i| format!(" JOIN j{i} IN c.a")).collect();
            let text = format!("SELECT VALUE 1 FROM c{joins}");
            assert!(text.len() < 256 * 1024);
            let r = run_with(&text, &no_params(), &[json!({"a": [1]})]);
            match &r {
                Ok(v) => assert_eq!(v, &vec![json!(1)]),
                Err(e) => assert_eq!(e.kind, ErrorKind::Limit, "{e}"),
            }
        },
    );
}

// ---- Size limits ----

/// Query text over the limit is refused with a Limit error before any work.
#[test]
fn one_mebibyte_query_is_refused() {
    let big = format!("SELECT VALUE '{}'", "x".repeat(1 << 20));
    assert_limit("1 MiB string", &run1(&big));
    let nested = nest("(", "1", ")", 512 * 1024);
    assert_limit(
        "1 MiB parentheses",
        &run1(&format!("SELECT VALUE {nested}")),
    );
    let limit = mayfly_query::parser::MAX_QUERY_BYTES;
    let mut at_limit = String::from("SELECT VALUE 1");
    at_limit.push_str(&" ".repeat(limit - at_limit.len()));
    assert_eq!(run1(&at_limit), Ok(vec![json!(1)]));
    at_limit.push(' ');
    assert_limit("limit + 1", &run1(&at_limit));
    // Multi-byte text is measured in bytes.
    let wide = format!("SELECT VALUE '{}'", "é".repeat(limit / 2));
    assert_limit("é", &run1(&wide));
}

/// Text just under the limit, made of the tokens that are costliest to lex or parse, is
/// handled quickly (the parser is linear).
///
/// Regression test; it failed before the fix on `object-keys` (times out): `Parser::primary` checks each object key
/// against all earlier ones (parser.rs ~705, `fields.iter().any(..)`), quadratic in the number
/// of keys: 16,000 keys take 1.2 s and 32,000 (250 KB) about 5 s in a debug build. Keep a
/// `HashSet` of the keys seen.
#[test]
fn big_queries_parse_in_linear_time() {
    let cases = [
        "comment",
        "string",
        "number",
        "identifiers",
        "in-list",
        "select-list",
        "object-keys",
        "array",
    ];
    isolated(
        "big_queries_parse_in_linear_time",
        &cases,
        LINEAR_WORK_LIMIT,
        |case| {
            let budget = 250 * 1024;
            let text = match case {
                "comment" => format!("SELECT VALUE 1 --{}", "x".repeat(budget)),
                "string" => format!("SELECT VALUE '{}'", "\\u00e9".repeat(budget / 6)),
                "number" => format!("SELECT VALUE 0.{}1", "0".repeat(budget)),
                "identifiers" => format!("SELECT VALUE c.{} FROM c", "a".repeat(budget)),
                "in-list" => format!("SELECT VALUE 1 IN ({})", vec!["1"; budget / 2].join(",")),
                "select-list" => format!("SELECT {}", vec!["1"; budget / 2].join(",")),
                "object-keys" => {
                    let mut s = String::from("SELECT VALUE {");
                    let mut i = 0;
                    while s.len() < budget {
                        let _ = write!(s, "k{i}:1,");
                        i += 1;
                    }
                    s.push_str("z:1}");
                    s
                }
                _ => format!("SELECT VALUE [{}]", vec!["[]"; budget / 3].join(",")),
            };
            let r = run1(&text);
            assert!(r.is_ok(), "{case}: {}", brief(&r));
        },
    );
}

// ---- Work limits ----

/// A cross join of three 1,000-element arrays in one document (10^9 rows) ends with a Limit
/// error after the per-document row budget, quickly, in every position it can be written.
#[test]
fn cross_join_of_big_arrays_is_stopped() {
    isolated(
        "cross_join_of_big_arrays_is_stopped",
        &["top", "array-subquery", "exists", "where-false", "sorted"],
        Duration::from_secs(20),
        |case| {
            let arr: Vec<usize> = (0..1000).collect();
            let doc = json!({"id": "1", "a": arr, "b": arr, "c": arr});
            let text = match case {
                "top" => "SELECT VALUE [x, y, z] FROM d JOIN x IN d.a JOIN y IN d.b JOIN z IN d.c",
                "array-subquery" => {
                    "SELECT VALUE ARRAY(SELECT VALUE 1 FROM x IN d.a JOIN y IN d.b JOIN z IN d.c) FROM d"
                }
                "exists" => {
                    "SELECT * FROM d WHERE EXISTS(SELECT VALUE 1 FROM x IN d.a JOIN y IN d.b JOIN z IN d.c WHERE x + y + z < 0)"
                }
                "where-false" => {
                    "SELECT VALUE 1 FROM d JOIN x IN d.a JOIN y IN d.b JOIN z IN d.c WHERE false"
                }
                _ => "SELECT VALUE x FROM d JOIN x IN d.a JOIN y IN d.b JOIN z IN d.c ORDER BY x",
            };
            let started = Instant::now();
            assert_limit(text, &run_with(text, &no_params(), &[doc]));
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                started.elapsed()
            );
        },
    );
}

/// The per-document budget counts rows (100,000), not work, and the work per row is
/// unbounded:
/// - `copy-big-value`: `eval` clones every value a path reaches, so `IS_STRING(c.big)` copies
///   the whole string: 90,000 rows × a 1 MiB property is 90 GiB of copying (about 6 s, bound
///   by memory bandwidth, so no faster in a release build) for one document.
/// - `big-in-list`: a 20,000-item `IN` list (120 KB of text) evaluated on each of 90,000 rows
///   is 1.8 × 10^9 comparisons for one small document (about 100 s in a debug build).
///
/// Each should end within a bound proportional to the document and the query (an answer, or a
/// Limit error), not seconds to minutes of CPU per document.
///
/// Regression test; it failed before the fix (both time out). `Evaluator::eval` (eval.rs ~98, `found.cloned()`)
/// clones what a path reaches (function arguments are owned `Val`s): evaluate paths by
/// reference (`Cow<Value>`). And charge the budget (`Evaluator::charge_row`, eval.rs ~77) per
/// evaluated node and per byte built or copied (a fuel budget), not per row only.
#[test]
fn per_document_work_is_bounded() {
    isolated(
        "per_document_work_is_bounded",
        &["copy-big-value", "big-in-list"],
        LINEAR_WORK_LIMIT,
        |case| {
            let arr: Vec<usize> = (0..300).collect();
            let (doc, text) = if case == "copy-big-value" {
                (
                    json!({"a": arr, "big": "x".repeat(1 << 20)}),
                    "SELECT VALUE COUNT(1) FROM c JOIN x IN c.a JOIN y IN c.a WHERE IS_STRING(c.big)"
                        .to_owned(),
                )
            } else {
                let list: Vec<String> = (1_000..21_000).map(|i| i.to_string()).collect();
                (
                    json!({"a": arr}),
                    format!(
                        "SELECT VALUE COUNT(1) FROM c JOIN x IN c.a JOIN y IN c.a WHERE NOT (x IN ({}))",
                        list.join(",")
                    ),
                )
            };
            let r = run_with(&text, &no_params(), &[doc]);
            assert!(
                matches!(&r, Ok(v) if v == &vec![json!(90_000)])
                    || matches!(&r, Err(e) if e.kind == ErrorKind::Limit),
                "{}",
                brief(&r)
            );
        },
    );
}

/// Values a query builds are bounded in size: a result (or the results one document yields)
/// far larger than anything stored is refused with a Limit error (or the building function
/// gives `undefined`, as `REPLACE` and `REPLICATE` do), not allocated. Each case here would
/// build at least 128 MiB from a query of a few KB (or a 1 MiB document); scaled up, they build
/// terabytes.
///
/// Regression test; it failed before the fix (every case builds its 128 MiB): only `REPLICATE` (10,000 characters)
/// and `REPLACE` (16 MiB) bound their results. `CONCAT` (string.rs ~154), `||` (eval.rs ~371,
/// also quadratic along a chain), `ARRAY_CONCAT` (array.rs ~67), array literals, `ARRAY(...)`
/// (eval.rs ~249) and the results of one `push` (exec.rs ~386 `Sink::emit`) grow without
/// limit; `MAX_HELD_ROWS` counts rows, not bytes. A 60 KB query of 1,000 `REPLACE`s in one
/// `CONCAT` asks for 16 GiB. Add a byte budget per query, checked where values are built and
/// results held.
#[test]
fn built_values_are_bounded() {
    let cases = [
        "concat",
        "concat-operator",
        "array-literal",
        "array-concat",
        "array-subquery",
        "streamed-results",
    ];
    isolated(
        "built_values_are_bounded",
        &cases,
        Duration::from_secs(20),
        |case| {
            // A 16 MiB string from a few dozen bytes of query.
            let r16 = "REPLACE(REPLICATE('x', 10000), 'x', REPLICATE('y', 1677))";
            let eight = [r16; 8].join(", ");
            let mut docs = vec![json!({"id": "1"})];
            let text = match case {
                "concat" => format!("SELECT VALUE LENGTH(CONCAT({eight}))"),
                "concat-operator" => format!("SELECT VALUE LENGTH({})", [r16; 8].join(" || ")),
                "array-literal" => format!("SELECT VALUE ARRAY_LENGTH([{eight}])"),
                "array-concat" => format!(
                    "SELECT VALUE ARRAY_LENGTH(ARRAY_CONCAT({}))",
                    vec![format!("[{r16}]"); 8].join(", ")
                ),
                "array-subquery" => {
                    docs = vec![json!({"a": vec![0; 128], "big": "x".repeat(1 << 20)})];
                    "SELECT VALUE ARRAY_LENGTH(ARRAY(SELECT VALUE c.big FROM x IN c.a)) FROM c"
                        .to_owned()
                }
                _ => {
                    docs = vec![json!({"a": vec![0; 128], "big": "x".repeat(1 << 20)})];
                    "SELECT VALUE c.big FROM c JOIN x IN c.a".to_owned()
                }
            };
            let r = run_with(&text, &no_params(), &docs);
            let ok = match &r {
                Err(e) => e.kind == ErrorKind::Limit,
                // `undefined` (no result) is an acceptable refusal for a function, and so is a
                // result that shows the big value was never built (a function over the 2 MiB
                // string limit is undefined, so an array of them is short).
                Ok(v) => v.iter().all(|x| x.as_u64().is_some_and(|n| n < 1 << 20)),
            };
            assert!(ok, "{case}: built at least 128 MiB: {}", brief(&r));
        },
    );
}

/// `REPLICATE` with huge, negative and fractional counts: `undefined`, never an allocation.
#[test]
fn replicate_with_huge_counts_is_undefined() {
    for n in [
        "1e15",
        "1e308",
        "-1e308",
        "10001",
        "4294967296",
        "18446744073709551616",
        "-1",
        "@n",
    ] {
        let mut params = Map::new();
        params.insert("@n".into(), json!(u64::MAX));
        let text = format!("SELECT VALUE REPLICATE('x', {n})");
        let r = run_with(&text, &params, &[json!({})]);
        assert_eq!(r, Ok(vec![]), "{text}");
    }
    assert_eq!(
        run1("SELECT VALUE LENGTH(REPLICATE('x', 10000))"),
        Ok(vec![json!(10000)])
    );
    assert_eq!(
        run1("SELECT VALUE REPLICATE('', 1e15)"),
        Ok(vec![json!("")])
    );
}

/// `TOP`, `OFFSET` and `LIMIT` with huge values: no overflow, no allocation by count.
#[test]
fn huge_top_offset_and_limit() {
    let docs: Vec<Value> = (0..20)
        .map(|i| json!({"id": i.to_string(), "n": i}))
        .collect();
    let p = no_params();
    for text in [
        "SELECT TOP 1e300 * FROM c",
        "SELECT TOP 18446744073709551615 * FROM c",
        "SELECT TOP 18446744073709551616 * FROM c",
        "SELECT TOP 1e300 * FROM c ORDER BY c.n",
        "SELECT DISTINCT TOP 1e300 VALUE c.n FROM c ORDER BY c.n",
        "SELECT * FROM c OFFSET 0 LIMIT 1e300",
        "SELECT * FROM c ORDER BY c.n OFFSET 0 LIMIT 1e300",
        "SELECT TOP 1e300 * FROM c ORDER BY c.n OFFSET 1 LIMIT 1e300",
        "SELECT VALUE COUNT(1) FROM c OFFSET 0 LIMIT 1e300",
    ] {
        let r = run_with(text, &p, &docs);
        let n = r.as_ref().map(Vec::len).unwrap_or(usize::MAX);
        assert!(n == 20 || n == 19 || n == 1, "{text}: {}", brief(&r));
    }
    for text in [
        "SELECT * FROM c OFFSET 1e20 LIMIT 1",
        "SELECT * FROM c ORDER BY c.n OFFSET 1e20 LIMIT 1",
        "SELECT DISTINCT VALUE c.n FROM c OFFSET 1e20 LIMIT 1",
        "SELECT VALUE COUNT(1) FROM c OFFSET 1e300 LIMIT 1e300",
        "SELECT * FROM c OFFSET 18446744073709551615 LIMIT 18446744073709551615",
        "SELECT TOP 0 * FROM c",
        "SELECT * FROM c OFFSET 0 LIMIT 0",
        "SELECT VALUE ARRAY(SELECT VALUE x FROM x IN c.a OFFSET 1e20 LIMIT 1e20) FROM c WHERE false",
    ] {
        assert_eq!(run_with(text, &p, &docs), Ok(vec![]), "{text}");
    }
    for text in [
        "SELECT TOP -1 * FROM c",
        "SELECT TOP 1.5 * FROM c",
        "SELECT TOP 'a' * FROM c",
        "SELECT TOP @p * FROM c",
        "SELECT * FROM c OFFSET -1 LIMIT 1",
        "SELECT * FROM c OFFSET 1 LIMIT -1e300",
        "SELECT TOP c.n * FROM c",
        "SELECT TOP (1) * FROM c",
        "SELECT TOP",
        "SELECT * FROM c OFFSET",
        "SELECT * FROM c OFFSET 1",
        "SELECT * FROM c OFFSET 1 LIMIT",
    ] {
        let r = run_with(text, &p, &docs);
        assert!(r.is_err(), "{text}: {}", brief(&r));
    }
    // Parameters of every type as counts.
    for v in [
        json!(null),
        json!(true),
        json!(-1),
        json!(0.5),
        json!("1"),
        json!([1]),
        json!({}),
        json!(1e300),
        json!(u64::MAX),
        json!(i64::MIN),
    ] {
        let mut params = Map::new();
        params.insert("@p".into(), v.clone());
        for text in [
            "SELECT TOP @p * FROM c",
            "SELECT * FROM c OFFSET @p LIMIT @p",
            "SELECT * FROM c ORDER BY c.n OFFSET @p LIMIT @p",
        ] {
            let _ = run_with(text, &params, &docs);
        }
    }
}

/// `LIKE` patterns built for backtracking matchers (`%a%a%a...%b` against `aaaa...`), and
/// large patterns, are matched or refused quickly.
///
/// Regression test; it failed before the fix on `percent-a` and `classes` (time out): the `regex` crate has no
/// exponential backtracking, but when its lazy DFA gives up (as on `.*a.*a.*a...`) it falls
/// back to the PikeVM, which is O(pattern × text), and `like_regex` (eval.rs ~480) allows a
/// compiled pattern of 1 MiB. Time grows with pattern length × string length (measured in a
/// debug build: 2,000 `%a` × 20,000 characters ≈ 20 s; doubling either doubles it), so a 100 KB
/// pattern against a 2 MiB document string is hours of CPU in any build. Cap the pattern (its
/// wildcard count or compiled size, e.g. 10-20 KiB) and/or pattern length × text length.
#[test]
fn like_patterns_cannot_backtrack_catastrophically() {
    let cases = [
        "percent-a",
        "classes",
        "underscores",
        "wide-window",
        "huge-pattern",
        "bad-class",
    ];
    isolated(
        "like_patterns_cannot_backtrack_catastrophically",
        &cases,
        Duration::from_millis(1500),
        |case| {
            let (pattern, subject) = match case {
                "percent-a" => (format!("{}b", "%a".repeat(2000)), "a".repeat(20_000)),
                "classes" => (format!("{}z", "%[a-y]".repeat(1000)), "ab".repeat(10_000)),
                "underscores" => (format!("{}b", "_%".repeat(2000)), "a".repeat(20_000)),
                "wide-window" => (format!("%a{}", "_".repeat(3000)), "ab".repeat(100_000)),
                "huge-pattern" => ("_".repeat(200_000), "a".repeat(200_000)),
                _ => ("[z-a]%[%[^]]][".to_owned(), "abc".to_owned()),
            };
            let mut params = Map::new();
            params.insert("@p".into(), json!(pattern));
            params.insert("@s".into(), json!(subject));
            let r = run_with("SELECT VALUE @s LIKE @p", &params, &[json!({})]);
            assert!(
                matches!(&r, Ok(v) if v.len() <= 1)
                    || matches!(&r, Err(e) if e.kind != ErrorKind::Syntax),
                "{case}: {}",
                brief(&r)
            );
        },
    );
}

/// `RegexMatch` with huge or pathological patterns: an error or an answer, quickly.
///
/// Regression test; it failed before the fix on `dot-star-chain` (times out), for the reason `LIKE` does
/// (`like_patterns_cannot_backtrack_catastrophically`): O(pattern × text) with a pattern of up
/// to `REGEX_SIZE_LIMIT` = 1 MiB compiled (string.rs ~47). `RegexMatch` also compiles its
/// pattern again for every row (no cache, unlike `LIKE`).
#[test]
fn regex_match_with_huge_patterns() {
    let cases = [
        "dot-star-chain",
        "literal",
        "nested-groups",
        "repetition",
        "alternation",
        "backtracking",
        "wide-window",
        "unicode-classes",
    ];
    isolated(
        "regex_match_with_huge_patterns",
        &cases,
        LINEAR_WORK_LIMIT,
        |case| {
            let (pattern, subject) = match case {
                "dot-star-chain" => (format!("^{}b", ".*a".repeat(2000)), "a".repeat(20_000)),
                "literal" => ("a".repeat(50_000), "a".repeat(1000)),
                "nested-groups" => (nest("(", "a", ")", 20_000), "a".to_owned()),
                "repetition" => ("((a{1000}){1000}){1000}".to_owned(), "a".to_owned()),
                "alternation" => (
                    (0..20_000)
                        .map(|i| format!("w{i}"))
                        .collect::<Vec<_>>()
                        .join("|"),
                    "w19999".to_owned(),
                ),
                "backtracking" => ("(a+)+$".to_owned(), format!("{}!", "a".repeat(100_000))),
                "wide-window" => ("a[ab]{200}b".to_owned(), "ab".repeat(50_000)),
                _ => (r"\w{50}\W{50}\p{L}{50}".to_owned(), "é".repeat(10_000)),
            };
            let mut params = Map::new();
            params.insert("@p".into(), json!(pattern));
            params.insert("@s".into(), json!(subject));
            for text in [
                "SELECT VALUE RegexMatch(@s, @p)",
                "SELECT VALUE RegexMatch(@s, @p, 'imsx')",
            ] {
                let r = run_with(text, &params, &[json!({})]);
                assert!(
                    matches!(&r, Ok(v) if v.len() <= 1)
                        || matches!(&r, Err(e) if e.kind == ErrorKind::Evaluation),
                    "{case}: {}",
                    brief(&r)
                );
            }
        },
    );
}

// ---- Parameters and documents ----

/// Parameters and documents nested 128 levels deep (the server's limit), and deeper, go
/// through every operation that walks a value: copy, compare, sort, group, de-duplicate,
/// serialize, parse back.
#[test]
fn deeply_nested_parameters_and_documents() {
    isolated(
        "deeply_nested_parameters_and_documents",
        &["128", "512"],
        Duration::from_secs(20),
        |case| {
            let depth: usize = case.parse().expect("depth");
            let deep = deep_json(depth);
            let mut params = Map::new();
            params.insert("@p".into(), deep.clone());
            params.insert("@q".into(), deep_json(depth));
            let docs = vec![
                json!({"id": "1", "v": deep.clone(), "a": [deep.clone(), deep.clone()]}),
                json!({"id": "2", "v": deep_json(depth), "a": []}),
                json!({"id": "3", "v": [deep.clone()], "a": [1]}),
            ];
            let wrapped = nest("[", "@p", "]", 30);
            for text in [
                "SELECT VALUE @p".to_owned(),
                "SELECT VALUE @p = @q".to_owned(),
                "SELECT VALUE @p != @q".to_owned(),
                "SELECT VALUE ToString(@p)".to_owned(),
                "SELECT VALUE StringToObject(ToString(@p))".to_owned(),
                "SELECT VALUE ARRAY_CONTAINS([@q], @p)".to_owned(),
                "SELECT VALUE ARRAY_CONTAINS([@q], @p, true)".to_owned(),
                "SELECT VALUE SetUnion([@p, @q], [@q])".to_owned(),
                "SELECT VALUE SetIntersect([@p], [@q])".to_owned(),
                "SELECT VALUE @p IN (@q, 1)".to_owned(),
                format!("SELECT VALUE {wrapped}"),
                format!("SELECT VALUE ToString({wrapped})"),
                "SELECT DISTINCT VALUE c.v FROM c".to_owned(),
                "SELECT DISTINCT VALUE @p FROM c".to_owned(),
                "SELECT * FROM c ORDER BY c.v".to_owned(),
                "SELECT * FROM c ORDER BY c.v DESC".to_owned(),
                "SELECT c.v, COUNT(1) AS n FROM c GROUP BY c.v".to_owned(),
                "SELECT VALUE MIN(c.v) FROM c".to_owned(),
                "SELECT VALUE MAX(c.a) FROM c".to_owned(),
                "SELECT VALUE x FROM c JOIN x IN c.a WHERE x = @p".to_owned(),
                "SELECT VALUE ARRAY(SELECT VALUE x FROM x IN c.a WHERE x = @p) FROM c".to_owned(),
                "SELECT VALUE [c.v, @p] FROM c WHERE c.v = @p".to_owned(),
            ] {
                let r = run_with(&text, &params, &docs);
                assert!(r.is_ok(), "{text}: {}", brief(&r));
                for v in r.expect("ok") {
                    drop(serde_json::to_string(&v).expect("serializes"));
                }
            }
        },
    );
}

/// Parameters of every type, anywhere a value can go, including where a number is expected.
#[test]
fn parameters_of_every_type() {
    let docs = vec![json!({"id": "1", "a": [1, "x", null], "n": 2, "s": "abc"})];
    let queries = [
        "SELECT VALUE @p",
        "SELECT VALUE c.a[@p] FROM c",
        "SELECT VALUE c[@p] FROM c",
        "SELECT VALUE @p + 1",
        "SELECT VALUE -@p",
        "SELECT VALUE ~@p",
        "SELECT VALUE NOT @p",
        "SELECT VALUE @p << @p",
        "SELECT VALUE @p || 'x'",
        "SELECT VALUE @p ?? 1",
        "SELECT VALUE @p ? 1 : 2",
        "SELECT VALUE @p BETWEEN @p AND @p",
        "SELECT VALUE 'abc' LIKE @p",
        "SELECT VALUE @p LIKE '%'",
        "SELECT VALUE x FROM c JOIN x IN @p",
        "SELECT * FROM c WHERE @p",
        "SELECT VALUE COUNT(1) FROM c GROUP BY @p",
        "SELECT VALUE SUM(@p) FROM c",
        "SELECT VALUE AVG(@p) FROM c",
        "SELECT DISTINCT VALUE @p FROM c",
        "SELECT VALUE [@p, {'k': @p}]",
        "SELECT TOP @p VALUE 1",
        "SELECT VALUE (SELECT VALUE @p)",
        "SELECT VALUE EXISTS(SELECT VALUE x FROM x IN c.a WHERE x = @p) FROM c",
    ];
    for v in value_zoo() {
        let mut params = Map::new();
        if let Some(v) = v.into_json() {
            params.insert("@p".into(), v);
        }
        for q in queries {
            let _ = run_with(q, &params, &docs);
        }
    }
    // A missing parameter is an error, not a panic; extra ones are ignored.
    let r = run_with("SELECT VALUE @missing", &no_params(), &docs);
    assert!(
        matches!(&r, Err(e) if e.kind == ErrorKind::Invalid),
        "{}",
        brief(&r)
    );
    let mut params = Map::new();
    params.insert("no_at".into(), json!(1));
    params.insert("@".into(), json!(1));
    params.insert("@é😀".into(), json!(1));
    assert_eq!(run_with("SELECT VALUE @é", &params, &docs).ok(), None);
}

// ---- Lexical edge cases ----

/// Escapes with lone surrogates, truncated escapes, and odd numbers: errors or values, never
/// a panic, and never an invalid `String`.
#[test]
fn string_escapes_and_numbers() {
    for (text, ok) in [
        (r"SELECT VALUE '\ud800'", false),
        (r"SELECT VALUE '\udc00'", false),
        (r"SELECT VALUE '\udfff\ud800'", false),
        (r"SELECT VALUE '\ud800\u0041'", false),
        (r"SELECT VALUE '\ud800\ud800'", false),
        (r"SELECT VALUE '\ud800\'", false),
        (r"SELECT VALUE '\ud800\u'", false),
        (r"SELECT VALUE '\ud800", false),
        (r"SELECT VALUE '\u12'", false),
        (r"SELECT VALUE '\u'", false),
        (r"SELECT VALUE '\uZZZZ'", false),
        (r"SELECT VALUE '\x41'", false),
        (r"SELECT VALUE '\", false),
        (r"SELECT VALUE '", false),
        (r#"SELECT VALUE ""#, false),
        (r"SELECT VALUE '\ud83d\ude00'", true),
        (r"SELECT VALUE '\u0000'", true),
        (r"SELECT VALUE '\uFFFF'", true),
        ("SELECT VALUE '\u{10FFFF}'", true),
        ("SELECT VALUE 1e309", false),
        ("SELECT VALUE -1e309", false),
        ("SELECT VALUE 1e-400", true),
        ("SELECT VALUE 0xFFFFFFFFFFFFFFFFFFFF", false),
        ("SELECT VALUE 0xFFFFFFFFFFFFFFFF", true),
        ("SELECT VALUE 0x", false),
        ("SELECT VALUE 0xG", false),
        ("SELECT VALUE 1e", false),
        ("SELECT VALUE 1e+", false),
        ("SELECT VALUE 1.", false),
        ("SELECT VALUE .5", true),
        ("SELECT VALUE 1..2", false),
        ("SELECT VALUE 00001", true),
        ("SELECT VALUE 9007199254740993", true),
        ("SELECT VALUE 123456789012345678901234567890", true),
        ("SELECT VALUE -9223372036854775809", true),
        ("SELECT VALUE 1.7976931348623157e308 * 10", true),
        ("SELECT VALUE 5e-324 / 2", true),
        ("SELECT VALUE 1 / 0", true),
        ("SELECT VALUE 0 / 0", true),
        ("SELECT VALUE -0", true),
        ("SELECT VALUE 1 % 0", true),
        ("SELECT VALUE 1 << 1e300", true),
        ("SELECT VALUE 1e300 >>> -1e300", true),
        ("SELECT VALUE ~1e300", true),
        ("SELECT VALUE -(-9223372036854775808)", true),
        ("SELECT VALUE 1abc", false),
        ("SELECT VALUE 1_000", false),
    ] {
        let r = run1(text);
        assert_eq!(r.is_ok(), ok, "{text}: {}", brief(&r));
        if let Ok(values) = r {
            for v in values {
                drop(serde_json::to_string(&v).expect("serializes"));
            }
        }
    }
    // 250 KB of digits.
    let long = format!("SELECT VALUE {}", "9".repeat(250_000));
    assert!(run1(&long).is_err(), "not a finite double");
    let long = format!("SELECT VALUE 0.{}1", "0".repeat(250_000));
    assert_eq!(run1(&long), Ok(vec![json!(0)]));
}

/// Identifiers and strings in any script, odd whitespace and control characters.
#[test]
fn unicode_identifiers_and_odd_characters() {
    let doc = json!({"名前": "n", "ç": {"ǅ": 1}, "ß": 2, "İ": 3, "\u{301}": 4, "😀": 5});
    for text in [
        "SELECT VALUE ç.名前 FROM ç",
        "SELECT VALUE Ω.ç.ǅ FROM Ω",
        "SELECT VALUE ß.ß FROM ß",
        "SELECT VALUE İ.İ FROM İ",
        "SELECT VALUE c['😀'] FROM c",
        "SELECT VALUE c.😀 FROM c",
        "SELECT VALUE 😀 FROM c",
        "SELECT VALUE c.\u{301} FROM c",
        "SELECT VALUE c\u{301} FROM c\u{301}",
        "SELECT VALUE ſelect FROM ſelect",
        "ſELECT VALUE 1",
        "SELECT\u{a0}VALUE\u{2003}1\u{3000}",
        "\u{feff}SELECT VALUE 1",
        "SELECT VALUE 1\u{0}",
        "SELECT VALUE '\u{0}\u{1}\u{7f}\u{200b}\u{202e}'",
        "SELECT VALUE c.\u{200b} FROM c",
        "SELECT VALUE ٣ FROM c",
        "SELECT VALUE c.a٣ FROM c",
        "SELECT VALUE Ⅻ FROM Ⅻ",
        "SELECT VALUE $ FROM $",
        "SELECT VALUE _ FROM _",
        "SELECT VALUE @名前",
        "SELECT VALUE @😀",
        "SELECT VALUE @",
        "SELECT VALUE c.@p FROM c",
        "SELECT VALUE `x`",
        "SELECT VALUE #x",
        "SELECT VALUE c..a FROM c",
        "SELECT VALUE c.[a] FROM c",
        "SELECT VALUE LOWER('İ'), UPPER('ß'), LENGTH('😀'), REVERSE('e\u{301}')",
        "SELECT VALUE SUBSTRING('😀é', 1, 1) || LEFT('😀', 1) || RIGHT('é😀', 1)",
        "SELECT VALUE INDEX_OF('ǅǅ😀', '😀', 1)",
    ] {
        let _ = run_with(text, &no_params(), std::slice::from_ref(&doc));
    }
    assert_eq!(
        run_with(
            "SELECT VALUE ç.名前 FROM ç",
            &no_params(),
            std::slice::from_ref(&doc)
        ),
        Ok(vec![json!("n")])
    );
}

/// Empty and degenerate texts, and every prefix of a complicated query: errors, never panics.
#[test]
fn empty_and_truncated_queries() {
    for text in [
        "",
        " ",
        "\n\t\r ",
        "-- only a comment",
        "--",
        "-",
        "SELECT",
        "select",
        "SELECT *",
        "SELECT VALUE",
        "SELECT DISTINCT",
        "SELECT TOP",
        "SELECT FROM",
        "SELECT 1 FROM",
        "FROM c",
        "SELECT ,",
        "SELECT 1,",
        "SELECT (",
        ")",
        "SELECT 1 AS",
        "SELECT * FROM c JOIN",
        "SELECT * FROM c WHERE",
        "SELECT * FROM c ORDER",
        "SELECT * FROM c ORDER BY",
        "SELECT * FROM c GROUP BY",
        "SELECT VALUE udf.f(1)",
        "SELECT VALUE NOSUCH(1)",
        "SELECT * FROM (SELECT VALUE 1)",
        "SELECT VALUE 1 ESCAPE 'x'",
    ] {
        let r = run1(text);
        assert!(r.is_err(), "{text:?}: {}", brief(&r));
    }
    let full = "SELECT DISTINCT TOP 5 VALUE {'a': c.a[0], \"b\": [1, -2.5e3, 0x1F], 'c': (SELECT VALUE COUNT(1) FROM t IN c.a WHERE t > 1), 'd': EXISTS(SELECT VALUE 1), 'e': ARRAY(SELECT VALUE x FROM x IN c.a), 'f': c.s LIKE '%x[a-c]_' ESCAPE '!', 'g': c.n BETWEEN 1 AND 10, 'h': c.n NOT IN (1, 2), 'i': c.n ?? 1 ? 'y' : 'n', 'j': IIF(c.n > 1, c.n >>> 1, ~c.n), 'k': CONCAT(c.s, 'é😀') || @p} FROM c JOIN x IN c.a JOIN (SELECT VALUE 1 FROM y IN c.a) z WHERE NOT (c.n = 1 OR c.n != 2 AND c.n <> 3) -- done\n ORDER BY c.n DESC OFFSET 0 LIMIT 10";
    let mut params = Map::new();
    params.insert("@p".into(), json!("p"));
    let docs = [json!({"a": [1, 2], "n": 5, "s": "sx"})];
    assert!(
        run_with(full, &params, &docs).is_ok(),
        "{}",
        brief(&run_with(full, &params, &docs))
    );
    for (i, _) in full.char_indices() {
        let _ = run_with(&full[..i], &params, &docs);
        let _ = run_with(&full[i..], &params, &docs);
    }
}

// ---- Functions ----

/// Values of every type and edge: undefined, null, booleans, numbers (zero, negative zero,
/// tiny, huge, beyond i64 and 2^53, ones that give NaN or infinity, and Infinity, -Infinity
/// and NaN themselves), strings (empty, non-BMP, dates, part names, regex syntax, JSON), arrays
/// and objects, nested.
fn value_zoo() -> Vec<Val> {
    let mut values: Vec<Option<Value>> = vec![
        None,
        Some(json!(null)),
        Some(json!(true)),
        Some(json!(false)),
        Some(json!(0)),
        Some(json!(-0.0)),
        Some(json!(1)),
        Some(json!(-1)),
        Some(json!(2)),
        Some(json!(0.5)),
        Some(json!(-2.5)),
        Some(json!(7.9)),
        Some(json!(64)),
        Some(json!(100)),
        Some(json!(10_000)),
        Some(json!(1e15)),
        Some(json!(1e300)),
        Some(json!(-1e300)),
        Some(json!(f64::MAX)),
        Some(json!(f64::MIN)),
        Some(json!(f64::MIN_POSITIVE)),
        Some(json!(5e-324)),
        Some(json!(9_007_199_254_740_993_u64)),
        Some(json!(i64::MAX)),
        Some(json!(i64::MIN)),
        Some(json!(u64::MAX)),
        Some(json!(9.3e18)),
        Some(json!(-9.3e18)),
        Some(json!(253_402_300_799_999_i64)),
        Some(json!(2_534_023_007_999_999_999_i64)),
        Some(json!(-62_135_596_800_001_i64)),
        Some(json!("")),
        Some(json!(" ")),
        Some(json!("a")),
        Some(json!("abc")),
        Some(json!("é")),
        Some(json!("😀")),
        Some(json!("a😀é\u{301}b")),
        Some(json!("\u{0}")),
        Some(json!("İ")),
        Some(json!("ß")),
        Some(json!("x".repeat(5000))),
        Some(json!("2020-01-31T23:59:59.9999999Z")),
        Some(json!("9999-12-31T23:59:59.9999999Z")),
        Some(json!("0001-01-01T00:00:00.0000000Z")),
        Some(json!("0000-01-01")),
        Some(json!("2020-02-30")),
        Some(json!("2020-01-01T24:00:00")),
        Some(json!("2020-01-01T00:00:00.")),
        Some(json!("2020-01-01T00:00:00.12345678Z")),
        Some(json!("2020-01-01 00:00:00")),
        Some(json!("2020-01-01Z")),
        Some(json!("2020-01-01T")),
        Some(json!("２０２０-01-01")),
        Some(json!("year")),
        Some(json!("mm")),
        Some(json!("dd")),
        Some(json!("hh")),
        Some(json!("ns")),
        Some(json!("mcs")),
        Some(json!("ms")),
        Some(json!("ss")),
        Some(json!("i")),
        Some(json!("imsx")),
        Some(json!("g")),
        Some(json!("(")),
        Some(json!("[")),
        Some(json!("\\")),
        Some(json!("a{1000}{1000}")),
        Some(json!("(?=a)")),
        Some(json!("%")),
        Some(json!("[1, 2]")),
        Some(json!("{\"a\": 1}")),
        Some(json!("null")),
        Some(json!("true")),
        Some(json!("1e400")),
        Some(json!("-0")),
        Some(json!("NaN")),
        Some(json!([])),
        Some(json!([1, "a", null, true, [2], {"b": 3}])),
        Some(json!([1, 1.0, 1])),
        Some(json!([[[[[1]]]]])),
        Some(json!({})),
        Some(json!({"a": 1, "b": [1, 2], "c": {"d": null}})),
        Some(deep_json(128)),
    ];
    values.push(Some(Value::Array((0..1000).map(Value::from).collect())));
    let mut values: Vec<Val> = values.into_iter().map(Val::from).collect();
    values.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN].map(Val::NonFinite));
    values
}

/// Every system function with every arity it takes, over every kind of value (all pairs for
/// up to two arguments; for more, each position varied over all values with the others drawn
/// from a fixed pseudo-random sequence): no panic. Errors are allowed only as `FunctionError`s.
#[test]
fn every_function_with_every_kind_of_argument() {
    isolated(
        "every_function_with_every_kind_of_argument",
        &["all"],
        Duration::from_secs(60),
        |_| {
            let zoo = value_zoo();
            let ctx = ctx();
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
            let mut next = |n: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                usize::try_from(rng % n as u64).expect("small")
            };
            let mut calls = 0_u64;
            for f in functions::all() {
                // Variadic functions (`CONCAT`, `ARRAY_CONCAT`, ...) are tried with up to four.
                let max = f.max_args.min(f.min_args.max(1) + 3);
                for arity in f.min_args..=max {
                    let mut tuples: Vec<Vec<usize>> = Vec::new();
                    match arity {
                        0 => tuples.push(vec![]),
                        1 => tuples.extend((0..zoo.len()).map(|i| vec![i])),
                        _ => {
                            // All pairs of a representative subset...
                            if arity == 2 {
                                for i in (0..zoo.len()).step_by(3) {
                                    for j in (1..zoo.len()).step_by(3) {
                                        tuples.push(vec![i, j]);
                                    }
                                }
                            }
                            // ... and each position over every value, with random partners.
                            for position in 0..arity {
                                for v in 0..zoo.len() {
                                    for _ in 0..4 {
                                        let mut t: Vec<usize> =
                                            (0..arity).map(|_| next(zoo.len())).collect();
                                        t[position] = v;
                                        tuples.push(t);
                                    }
                                }
                            }
                        }
                    }
                    for t in tuples {
                        let args: Vec<Val> = t.iter().map(|&i| zoo[i].clone()).collect();
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            f.invoke(&ctx, &args)
                        }));
                        calls += 1;
                        match result {
                            Ok(Ok(Val::Json(v))) => {
                                // Whatever comes back must be writable as JSON.
                                drop(serde_json::to_string(&v).expect("serializes"));
                            }
                            Ok(_) => {}
                            Err(_) => {
                                let shown: Vec<String> = args
                                    .iter()
                                    .map(|a| match a {
                                        Val::Undefined => "undefined".to_owned(),
                                        Val::NonFinite(n) => n.to_string(),
                                        Val::Json(v) => v.to_string().chars().take(40).collect(),
                                    })
                                    .collect();
                                panic!("{} panicked on ({})", f.name, shown.join(", "));
                            }
                        }
                    }
                }
            }
            assert!(calls > 10_000, "{calls}");
        },
    );
}

/// The same, through the query text: every function called with literal arguments of each
/// kind (so the parser's arity checks and the evaluator are on the path too).
#[test]
fn every_function_through_query_text() {
    let literals = [
        "undefined",
        "null",
        "true",
        "0",
        "-0",
        "-1",
        "0.5",
        "1e308",
        "-1e308",
        "9223372036854775807",
        "''",
        "'a'",
        "'😀'",
        "'2020-01-01'",
        "'year'",
        "'('",
        "[]",
        "[1, 'a']",
        "{}",
        "{'a': [1]}",
        "c",
        "c.a",
        "c.nope",
        "@p",
    ];
    let mut params = Map::new();
    params.insert("@p".into(), json!({"x": [1, 2, {"y": "z"}]}));
    let docs = [json!({"a": [3, 2, 1], "s": "abc"})];
    for f in functions::all() {
        let max = f.max_args.min(f.min_args + 2);
        for arity in f.min_args..=max {
            for lit in literals {
                let args = vec![lit; arity].join(", ");
                let _ = run_with(
                    &format!("SELECT VALUE {}({args}) FROM c", f.name),
                    &params,
                    &docs,
                );
            }
        }
        // Arity errors are errors.
        if f.min_args > 0 {
            let args = vec!["1"; f.min_args - 1].join(", ");
            let r = run_with(&format!("SELECT VALUE {}({args})", f.name), &params, &docs);
            assert!(
                matches!(&r, Err(e) if e.kind == ErrorKind::Invalid),
                "{}: {}",
                f.name,
                brief(&r)
            );
        }
    }
}

// ---- Random input ----

/// Tokens the query language has, and some it does not.
const VOCABULARY: &[&str] = &[
    "COUNT",
    "SUM",
    "MIN",
    "MAX",
    "AVG",
    "ABS",
    "CONCAT",
    "IIF",
    "LENGTH",
    "ARRAY_CONTAINS",
    "RegexMatch",
    "ToString",
    "DateTimeAdd",
    "c",
    "x",
    "t",
    "root",
    "é",
    "_",
    "$1",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ":",
    "?",
    "??",
    "*",
    "/",
    "%",
    "+",
    "-",
    "=",
    "!=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "||",
    "|",
    "&",
    "^",
    "~",
    "<<",
    ">>",
    ">>>",
    "0",
    "1",
    "-1",
    "2.5",
    "1e300",
    "0x1F",
    "'a'",
    "\"b\"",
    "'%a_'",
    "''",
    "@p",
    "@q",
    "--",
    "\n",
    "'\\u00e9'",
    "'",
    "!",
    "#",
    ";",
];

fn token_soup() -> impl Strategy<Value = String> {
    let words: Vec<&str> = KEYWORDS.iter().chain(VOCABULARY).copied().collect();
    prop::collection::vec((0..words.len(), prop::bool::ANY), 0..40).prop_map(move |tokens| {
        let mut s = String::new();
        for (i, glue) in tokens {
            if !glue && !s.is_empty() {
                s.push(' ');
            }
            s.push_str(words[i]);
        }
        s
    })
}

fn soup_params() -> Map<String, Value> {
    let mut params = Map::new();
    params.insert("@p".into(), json!(1));
    params.insert("@q".into(), json!(["a", {"b": null}]));
    params
}

fn soup_docs() -> Vec<Value> {
    vec![
        json!({"id": "1", "a": [1, 2], "n": 1, "s": "ab", "o": {"k": [true]}}),
        json!({"id": "2", "a": [], "n": "x", "t": null}),
        json!({"id": "3", "a": [[1], {"b": 2}], "n": 2.5, "s": "é😀"}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random token soups: `parse` never panics; what parses runs without panicking.
    #[test]
    fn random_token_soup_never_panics(text in token_soup()) {
        if let Ok(query) = parse(&text) {
            let _ = format!("{query:?}");
            let _ = run_with(&text, &soup_params(), &soup_docs());
        }
        let _ = parse(&format!("SELECT VALUE {text}"));
        let _ = run_with(&format!("SELECT * FROM c WHERE {text}"), &soup_params(), &soup_docs());
    }

    /// Random bytes of query text: never a panic.
    #[test]
    fn random_text_never_panics(text in "\\PC{0,60}") {
        let _ = parse(&text);
        let _ = parse(&format!("SELECT VALUE {text}"));
    }
}

/// A small random expression over the aliases `c` (a document) and `x` (an element of `c.a`).
fn expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("c".to_owned()),
        Just("x".to_owned()),
        Just("c.n".to_owned()),
        Just("c.s".to_owned()),
        Just("c.a".to_owned()),
        Just("c.o.k[0]".to_owned()),
        Just("c['id']".to_owned()),
        Just("@p".to_owned()),
        Just("@q".to_owned()),
        Just("undefined".to_owned()),
        Just("null".to_owned()),
        Just("true".to_owned()),
        (-3i32..1000).prop_map(|n| n.to_string()),
        Just("1e308".to_owned()),
        Just("0.5".to_owned()),
        Just("'é😀'".to_owned()),
        Just("''".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
    ];
    // Each function with an argument count it takes (variadic ones: up to four).
    let calls: Vec<(&'static str, usize)> = functions::all()
        .flat_map(|f| {
            (f.min_args..=f.max_args.min(f.min_args.max(1) + 2)).map(move |n| (f.name, n))
        })
        .collect();
    leaf.prop_recursive(4, 32, 4, move |inner| {
        let calls = calls.clone();
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec![
                    "+", "-", "*", "/", "%", "||", "=", "!=", "<", ">=", "AND", "OR", "??", "&",
                    "<<", ">>>"
                ]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (prop::sample::select(vec!["-", "NOT ", "~"]), inner.clone())
                .prop_map(|(op, a)| format!("{op}({a})")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(a, b, c)| format!("({a} ? {b} : {c})")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(a, b, c)| format!("({a} BETWEEN {b} AND {c})")),
            (inner.clone(), prop::collection::vec(inner.clone(), 0..3))
                .prop_map(|(a, l)| format!("({a} IN ({}))", l.join(", "))),
            (
                inner.clone(),
                prop::sample::select(vec!["'%'", "'a%'", "'_[a-z]%'", "'[^x]'", "c.s", "@p"])
            )
                .prop_map(|(a, p)| format!("({a} LIKE {p})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a})[{b}]")),
            (inner.clone()).prop_map(|a| format!("({a}).k")),
            (
                prop::sample::select(calls),
                prop::collection::vec(inner.clone(), 7)
            )
                .prop_map(|((f, n), args)| format!("{f}({})", args[..n].join(", "))),
            prop::collection::vec(inner.clone(), 0..3)
                .prop_map(|items| format!("[{}]", items.join(", "))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{{'a': {a}, 'b': {b}}}")),
            (inner.clone()).prop_map(|a| format!("ARRAY(SELECT VALUE {a} FROM y IN c.a)")),
            (inner.clone())
                .prop_map(|a| format!("EXISTS(SELECT VALUE {a} FROM y IN c.a WHERE y = {a})")),
            (inner.clone()).prop_map(|a| format!("(SELECT VALUE {a})")),
        ]
    })
}

/// A small random well-formed query: row-by-row or aggregating.
fn query() -> impl Strategy<Value = String> {
    let rows = (
        prop::sample::select(vec![
            "",
            "DISTINCT ",
            "TOP 3 ",
            "DISTINCT TOP 2 ",
            "TOP @p ",
        ]),
        prop::sample::select(vec!["VALUE {e}", "{e} AS a, {f} AS b", "VALUE [{e}, {f}]"]),
        prop::sample::select(vec![
            "",
            " ORDER BY c.n",
            " ORDER BY c.s DESC, c.n",
            " OFFSET 1 LIMIT 2",
            " ORDER BY c['id'] OFFSET 0 LIMIT 1",
        ]),
    );
    let groups = (
        prop::sample::select(vec!["", "TOP 1 ", "DISTINCT "]),
        prop::sample::select(vec![
            "VALUE COUNT({e})",
            "VALUE [MIN({e}), MAX({f}), SUM({e}), AVG({f})]",
            "c.n, COUNT({e}) AS k, SUM({f}) AS s",
        ]),
        prop::sample::select(vec![
            "",
            " GROUP BY c.n",
            " GROUP BY c.n, c.s",
            " OFFSET 0 LIMIT 5",
        ]),
    );
    (
        prop_oneof![rows, groups],
        expression(),
        expression(),
        prop::sample::select(vec![
            "FROM c",
            "FROM c JOIN x IN c.a",
            "FROM c JOIN x IN c.a JOIN y IN c.a",
            "FROM c JOIN (SELECT VALUE y FROM y IN c.a) x",
        ]),
        prop::option::of(expression()),
    )
        .prop_map(|((prefix, select, tail), e, f, from, filter)| {
            let mut select = select.replace("{e}", &e).replace("{f}", &f);
            if select.starts_with("c.n") && !tail.contains("GROUP BY") {
                select = select.replacen("c.n, ", "", 1);
            }
            let filter = filter.map(|w| format!(" WHERE {w}")).unwrap_or_default();
            format!("SELECT {prefix}{select} {from}{filter}{tail}")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 800, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random small well-formed queries over a small data set: `run` never panics, and what it
    /// returns serializes.
    #[test]
    fn random_well_formed_queries_never_panic(text in query()) {
        let r = run_with(&text, &soup_params(), &soup_docs());
        if let Ok(values) = r {
            for v in values {
                drop(serde_json::to_string(&v).expect("serializes"));
            }
        }
    }
}

/// Sorting, grouping and de-duplicating hold rows up to a byte bound, not only a row count:
/// 70 rows of 1 MiB each (over the 64 MiB bound) are refused, however few rows that is.
#[test]
fn held_rows_are_bounded_by_bytes() {
    let big = "x".repeat(1 << 20);
    let docs: Vec<Value> = (0..70)
        .map(|i| json!({"id": i.to_string(), "n": i, "big": format!("{big}{i}")}))
        .collect();
    for text in [
        "SELECT c.big FROM c ORDER BY c.n",
        "SELECT DISTINCT VALUE c.big FROM c",
        "SELECT c.big, COUNT(1) AS n FROM c GROUP BY c.big",
    ] {
        let r = run_with(text, &no_params(), &docs);
        assert_limit(text, &r);
    }
    // With TOP, ORDER BY holds only what it can return.
    let r = run_with(
        "SELECT TOP 2 VALUE c.n FROM c ORDER BY c.n DESC",
        &no_params(),
        &docs,
    );
    assert_eq!(r.expect("runs"), [json!(69), json!(68)]);
}

/// A large parameter or literal repeated in an array, or copied into every row of a join,
/// costs by its size: the document's budget stops it long before memory runs out.
#[test]
fn repeated_large_parameters_are_bounded() {
    let params: Map<String, Value> = [("@p".to_owned(), json!("x".repeat(4 << 20)))]
        .into_iter()
        .collect();
    let docs = vec![json!({"id": "1", "arr": (0..300).collect::<Vec<_>>()})];
    let many = vec!["@p"; 2_000].join(",");
    for text in [
        format!("SELECT VALUE ARRAY_LENGTH([{many}]) FROM c"),
        "SELECT VALUE LENGTH(@p) FROM c JOIN a IN c.arr JOIN b IN c.arr".to_owned(),
    ] {
        let r = run_with(&text, &params, &docs);
        assert_limit(&text, &r);
    }
}
