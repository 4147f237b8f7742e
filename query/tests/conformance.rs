//! The query conformance cases (`client/tests/queries/*.json`, written from the Cosmos DB
//! reference) run directly against the language, without a server: quick to iterate on. The
//! client crate runs the same cases end to end over gRPC.

use std::{fs, path::Path};

use mayfly_query::{Context, run};
use serde_json::{Map, Value};

#[path = "../../client/tests/support/json_compare.rs"]
mod json_compare;

use json_compare::matches;

#[test]
fn conformance_cases_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/tests/queries");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .expect("cases dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut passed, mut failures) = (0, Vec::new());
    for file in files {
        let suite: Value =
            serde_json::from_str(&fs::read_to_string(&file).expect("read")).expect("json");
        let datasets = suite["datasets"].as_object().expect("datasets");
        for case in suite["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let mut docs: Vec<Value> = datasets
                .get(case["dataset"].as_str().unwrap_or(""))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if let Some(pk) = case.get("partition_key").and_then(Value::as_str) {
                docs.retain(|d| d["pk"] == pk);
            }
            // The engine feeds documents in (partition key, id) order within a shard.
            docs.sort_by(|a, b| {
                (a["pk"].as_str(), a["id"].as_str()).cmp(&(b["pk"].as_str(), b["id"].as_str()))
            });
            let params: Map<String, Value> = case
                .get("params")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let query = case["query"].as_str().expect("query");
            let result = run(query, &params, &docs, Context::new(1_700_000_000_000, 7));
            let outcome = match (result, case.get("error")) {
                (Ok(got), None) => {
                    let expected = case["expected"].as_array().expect("expected");
                    let ordered = case
                        .get("ordered")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    if matches(&got, expected, ordered) {
                        Ok(())
                    } else {
                        Err(format!("got {}", Value::Array(got)))
                    }
                }
                (Ok(got), Some(_)) => Err(format!("expected an error, got {}", Value::Array(got))),
                (Err(e), Some(_)) => {
                    let want = case
                        .get("error_contains")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if e.to_string().to_lowercase().contains(want) {
                        Ok(())
                    } else {
                        Err(format!("error without '{want}': {e}"))
                    }
                }
                (Err(e), None) => Err(format!("error: {e}")),
            };
            match outcome {
                Ok(()) => passed += 1,
                Err(why) => failures.push(format!("{name}: {query}\n    {why}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{passed} passed, {} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
