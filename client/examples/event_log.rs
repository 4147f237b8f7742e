//! An event log whose events expire after `--ttl-secs` (default 5), queried with SQL.
//!
//! Events are written with a level and a sequence number; queries find the errors (an index
//! lookup with a parameter), the latest events (`ORDER BY` read from the index), counts per
//! level, and one service's events (a single-partition query). Once the TTL runs out, every
//! query leaves the events out at once, whether or not the purge has removed them yet.
//!
//! ```text
//! cargo run -p mayfly-server --bin mayfly &          # a server on 127.0.0.1:7070
//! cargo run -p mayfly-client --example event_log -- 127.0.0.1:7070 --ttl-secs 2
//! ```
//! Without a server address argument it starts one in-process, so it also runs on its own.

mod support;

use std::time::Duration;

use mayfly_client::StreamExt as _;
use mayfly_client::{Client, Collection, DefaultTtl, Error};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Serialize, Deserialize)]
struct Event {
    id: String,
    service: String,
    level: String,
    seq: u64,
    message: String,
}

async fn open(client: &Client, ttl: Duration) -> Result<Collection, Error> {
    let db = match client.create_database("observability").await {
        Ok(db) => db,
        Err(Error::Conflict(_)) => client.database("observability"),
        Err(e) => return Err(e),
    };
    // A fresh log each run: the example's counts start from zero.
    let _ = db.collection("events").delete().await;
    db.create_collection("events", "/service")
        .default_ttl(DefaultTtl::After(ttl))
        .await
}

async fn report(events: &Collection) -> Result<(), Error> {
    // Errors, found through the index on /level (the page metrics say which index was used).
    let mut pages = events
        .query::<Event>("SELECT * FROM c WHERE c.level = @level")
        .param("@level", "error")
        .await?;
    let mut errors = 0;
    while let Some(page) = pages.next_page().await? {
        errors += page.results.len();
        if let Some(index) = page.metrics.index {
            println!("  errors: read from index {index}");
        }
    }
    println!("  errors: {errors}");

    // The three latest events: entries of /seq read in descending order, stopping after 3.
    let latest: Vec<u64> = events
        .query::<u64>("SELECT TOP 3 VALUE c.seq FROM c ORDER BY c.seq DESC")
        .await?
        .collect::<Result<_, _>>()
        .await?;
    println!("  latest: {latest:?}");

    let per_level: Vec<Value> = events
        .query::<Value>("SELECT c.level, COUNT(1) AS n FROM c GROUP BY c.level")
        .await?
        .collect_all()
        .await?;
    println!("  per level: {}", Value::Array(per_level));

    // One service's events: a single-partition query.
    let billing: Vec<Value> = events
        .query::<Value>("SELECT VALUE COUNT(1) FROM c")
        .partition_key("billing")
        .await?
        .collect_all()
        .await?;
    println!("  billing events: {}", Value::Array(billing));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut ttl = Duration::from_secs(5);
    let mut address = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ttl-secs" => {
                ttl = Duration::from_secs(args.next().ok_or("--ttl-secs needs a value")?.parse()?)
            }
            other => address = Some(other.to_owned()),
        }
    }
    let (client, _embedded) = support::connect(address).await?;
    let events = open(&client, ttl).await?;

    for seq in 0..20u64 {
        let service = ["billing", "search", "auth"][seq as usize % 3];
        let level = if seq % 7 == 0 { "error" } else { "info" };
        events
            .create(&Event {
                id: format!("e{seq}"),
                service: service.to_owned(),
                level: level.to_owned(),
                seq,
                message: format!("{service} did thing {seq}"),
            })
            .await?;
    }
    println!("20 events written; they expire after {ttl:?}");
    report(&events).await?;

    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    println!("after {ttl:?}: every query leaves the expired events out");
    report(&events).await?;
    Ok(())
}
