//! A local cache kept in sync with a collection through its change feed, printing
//! "session X expired" at the instant each session expires (not when storage is freed).
//!
//! The cache starts from the feed's beginning, applies every create, replace, patch, delete and
//! expiry, and keeps the continuation after each batch: a restart of this program would resume
//! from it and see every later change once.
//!
//! ```text
//! cargo run -p mayfly-server --bin mayfly &          # a server on 127.0.0.1:7070
//! MAYFLY_KEY=$(cat mayfly-data/keys/primary) cargo run -p mayfly-client --example cache_sync -- 127.0.0.1:7070
//! ```
//! Without a server address argument it starts one in-process, so it also runs on its own.

mod support;

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use mayfly_client::{ChangeKind, DefaultTtl, DocumentTtl, Error, StartFrom};
use serde_json::{Map, Value, json};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args().nth(1);
    let (client, _embedded) = support::connect(address).await?;
    let db = client
        .create_database_if_not_exists("webapp")
        .await?
        .into_inner();
    let sessions = db
        .create_collection_if_not_exists("feed-sessions", "/user")
        .default_ttl(DefaultTtl::NoDefault)
        .await?
        .into_inner();

    // The feed first, from now: everything below is seen.
    let mut feed = sessions
        .changes()
        .all_versions_and_deletes()
        .start(StartFrom::Now)
        .await?;

    // Three sessions living 1, 2 and 3 seconds; one updated, one logged out.
    for (user, secs) in [("ann", 1), ("bob", 2), ("cid", 3)] {
        sessions
            .upsert(&json!({"id": format!("{user}-session"), "user": user, "page": "/"}))
            .ttl(DocumentTtl::After(Duration::from_secs(secs)))
            .await?;
    }
    sessions
        .patch("bob-session", "bob")
        .set("/page", "/cart")
        .await?;
    sessions.delete_document("cid-session", "cid").await?;

    let mut cache: HashMap<String, Map<String, Value>> = HashMap::new();
    let mut expired = Vec::new();
    let mut continuation = String::new();
    // Ann and Bob expire; Cid logged out first, so nothing expires for Cid.
    while expired.len() < 2 {
        let batch = tokio::time::timeout(Duration::from_secs(10), feed.next_batch())
            .await
            .map_err(|_| "no change for 10 s")??
            .ok_or("the server ended the feed")?;
        for change in batch.changes {
            match change.kind {
                ChangeKind::Create | ChangeKind::Replace | ChangeKind::Patch => {
                    let document = change.document.ok_or("a write carries its document")?;
                    cache.insert(change.id, document.body().clone());
                }
                ChangeKind::Delete => {
                    cache.remove(&change.id);
                    println!("session {} logged out", change.id);
                }
                ChangeKind::Expire => {
                    cache.remove(&change.id);
                    let late = SystemTime::now()
                        .duration_since(change.committed_at)
                        .unwrap_or_default();
                    println!(
                        "session {} expired ({} ms after its expiry instant)",
                        change.id,
                        late.as_millis()
                    );
                    expired.push(change.id);
                }
            }
        }
        // Kept after each batch: `StartFrom::Continuation(continuation)` resumes here.
        continuation = batch.continuation;
    }
    assert_eq!(expired, ["ann-session", "bob-session"], "in expiry order");
    assert!(
        cache.is_empty(),
        "the cache follows the collection: {cache:?}"
    );
    assert!(!continuation.is_empty());
    // The collection agrees: nothing is left to read.
    match sessions.read("ann-session", "ann").await {
        Ok(None) | Err(Error::NotFound(_)) => {}
        other => return Err(format!("ann's session is still there: {other:?}").into()),
    }
    println!("cache in sync: {} sessions", cache.len());
    Ok(())
}
