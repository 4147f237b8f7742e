//! The query conformance suite, end to end: every case of `tests/queries/*.json` (written from
//! the Azure Cosmos DB for NoSQL reference) runs through the real client and the real gRPC API
//! against a server on 127.0.0.1:0, over documents created through the API; and the same
//! cases against a three-node cluster, through one node, most partitions served by the others.

use std::{fs, path::Path};

use mayfly_client::{Client, Collection, Error, PartitionKey};
use mayfly_server::RunningServer;
use serde_json::{Map, Value};

#[path = "support/json_compare.rs"]
mod json_compare;

#[path = "support/cluster.rs"]
mod cluster;

use json_compare::{matches, same};

/// Removes `_ts` and `_etag` from whole documents among the results, after checking that
/// every whole document carries both.
fn strip_system_properties(results: &mut [Value], documents: &[Value]) -> Result<(), String> {
    for r in results.iter_mut() {
        let Value::Object(map) = r else { continue };
        let ts = map.remove("_ts");
        let etag = map.remove("_etag");
        let stripped = Value::Object(map.clone());
        if documents.iter().any(|d| same(d, &stripped))
            && !(ts.as_ref().is_some_and(Value::is_u64)
                && etag.as_ref().is_some_and(Value::is_string))
        {
            return Err(format!("document {stripped} lacks _ts or _etag"));
        }
    }
    Ok(())
}

async fn load(db: &mayfly_client::Database, name: &str, docs: &[Value]) -> Collection {
    let collection = db.create_collection(name, "/pk").await.expect("collection");
    for doc in docs {
        collection.create(doc).await.expect("document");
    }
    collection
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_over_grpc() {
    let server = RunningServer::start(Default::default())
        .await
        .expect("server");
    let client = Client::connect(server.local_addr().to_string())
        .await
        .expect("client");
    every_case(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_through_a_three_node_cluster() {
    let (_cluster, client) = cluster::three_nodes().await;
    every_case(&client).await;
}

/// Runs every case through `client`, failing with every case that failed.
async fn every_case(client: &Client) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/queries");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut passed, mut failures) = (0, Vec::new());
    for (n, file) in files.iter().enumerate() {
        let suite: Value =
            serde_json::from_str(&fs::read_to_string(file).expect("read")).expect("json");
        let db = client
            .create_database(&format!("suite{n}"))
            .await
            .expect("db");
        let datasets = suite["datasets"].as_object().expect("datasets");
        let mut collections = Map::new();
        for (name, docs) in datasets {
            let docs = docs.as_array().expect("documents");
            load(&db, name, docs).await;
            collections.insert(name.clone(), Value::Array(docs.clone()));
        }
        for case in suite["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let dataset = case["dataset"].as_str().unwrap_or_else(|| {
                datasets
                    .keys()
                    .next()
                    .map(String::as_str)
                    .expect("a dataset")
            });
            let docs = collections[dataset].as_array().expect("documents").clone();
            let collection = db.collection(dataset);
            let text = case["query"].as_str().expect("query");
            let mut query = collection.query::<Value>(text);
            for (k, v) in case
                .get("params")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                query = query.param(k, v);
            }
            if let Some(pk) = case.get("partition_key").and_then(Value::as_str) {
                query = query.partition_key(PartitionKey::from(pk));
            }
            let result = match query.await {
                Ok(results) => results.collect_all().await,
                Err(e) => Err(e),
            };
            let outcome = match (result, case.get("error")) {
                (Ok(mut got), None) => {
                    let expected = case["expected"].as_array().expect("expected");
                    let ordered = case
                        .get("ordered")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    match strip_system_properties(&mut got, &docs) {
                        Err(why) => Err(why),
                        Ok(()) if matches(&got, expected, ordered) => Ok(()),
                        Ok(()) => Err(format!("got {}", Value::Array(got))),
                    }
                }
                (Ok(got), Some(_)) => Err(format!("expected an error, got {}", Value::Array(got))),
                (Err(Error::InvalidArgument(message)), Some(code))
                    if code == "INVALID_ARGUMENT" =>
                {
                    let want = case
                        .get("error_contains")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if message.message().to_lowercase().contains(want) {
                        Ok(())
                    } else {
                        Err(format!("message without '{want}': {message}"))
                    }
                }
                (Err(e), _) => Err(format!("error: {e:?}")),
            };
            match outcome {
                Ok(()) => passed += 1,
                Err(why) => failures.push(format!("{name}: {text}\n    {why}")),
            }
        }
    }
    assert!(
        passed >= 250,
        "the suite has at least 250 cases ({passed} passed)"
    );
    assert!(
        failures.is_empty(),
        "{passed} passed, {} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
