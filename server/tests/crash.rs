//! Crash test: `mayfly` on a data directory under concurrent writes with TTLs, killed with
//! SIGKILL at a random moment, restarted, for several rounds. After every restart, every
//! document is read back at once and checked against what the server acknowledged:
//!
//! - every acknowledged write is there with its body, `_etag`, last-write instant and expiry
//!   instant (so nothing was extended), unless that instant has passed;
//! - nothing is visible once its expiry instant has passed;
//! - acknowledged deletes stay deleted;
//! - a write in flight at the kill is either wholly there or wholly absent;
//! - a query answered from the index returns exactly the live documents, at the versions just
//!   read back (the index entries were written and removed in the documents' own batches);
//! - at the end, the change feed from its beginning has an event for every acknowledged write,
//!   once, its positions never repeat or go backwards in a shard, and resuming it from a
//!   continuation sees exactly the rest.
//!
//! The seed is printed; `MAYFLY_CRASH_SEED` replays it, `MAYFLY_CRASH_ROUNDS` sets the rounds.

mod support;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        ChangeEvent, ChangeFeedMode, ChangeFeedRequest, CreateCollectionRequest,
        CreateDatabaseRequest, DeleteDocumentRequest, Document, PartitionKey, QueryRequest,
        ReadDocumentRequest, UpsertDocumentRequest,
        client::{CollectionsClient, DatabasesClient, DocumentsClient},
        oneofs::{ChangeFeedStart, PartitionKeyKind},
    },
};
use serde_json::{Map, json};
use tonic::{Code, transport::Channel};

const DATABASE: &str = "crash";
const COLLECTION: &str = "events";
/// The collection's default TTL: inheriting documents expire within the test.
const DEFAULT_TTL: i64 = 4;
const WRITERS: usize = 24;
const DEFAULT_ROUNDS: usize = 5;

/// Small deterministic generator (xorshift64*), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// A document version as the server acknowledged it.
#[derive(Debug, Clone, PartialEq)]
struct Version {
    etag: String,
    modified_ms: i64,
    ttl: Option<i32>,
    expires_ms: Option<i64>,
    marker: u64,
}

impl Version {
    fn of(doc: &Document) -> Version {
        let ms = |t: &prost_types::Timestamp| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000;
        let body = doc.body.clone().expect("body").into_map();
        Version {
            etag: doc.etag.clone(),
            modified_ms: ms(doc.modified_at.as_ref().expect("modified_at")),
            ttl: doc.ttl,
            expires_ms: doc.expires_at.as_ref().map(ms),
            // JSON numbers travel as doubles: markers stay below 2^53.
            marker: body["marker"].as_f64().expect("marker") as u64,
        }
    }
}

/// What the server said about one document id, and what was in flight when it died.
#[derive(Debug, Default, Clone)]
struct Expected {
    /// The last acknowledged state: `Some` = this version, `None` = deleted (or never
    /// acknowledged, if `written` is false).
    acked: Option<Version>,
    written: bool,
    /// The etag of every acknowledged upsert of this id, in order.
    etags: Vec<String>,
    /// A write sent but not answered when the server died.
    in_flight: Option<InFlight>,
}

#[derive(Debug, Clone, Copy)]
enum InFlight {
    Delete,
    /// An upsert with this marker and this TTL in ms (`None`: never expires), sent at
    /// `sent_at` (ms): if applied, it was applied between then and the kill.
    Upsert {
        marker: u64,
        ttl_ms: Option<i64>,
        sent_at: i64,
    },
}

type Ledger = Arc<Mutex<HashMap<String, Expected>>>;

fn partition(id: &str) -> String {
    format!("p{}", id.len() % 7)
}

fn pk(id: &str) -> Option<PartitionKey> {
    Some(PartitionKey {
        kind: Some(PartitionKeyKind::Value(mayfly_proto::json::JsonValue::new(
            serde_json::Value::String(partition(id)),
        ))),
    })
}

/// One writer: its own ids, upserts (new and existing ids, random TTLs) and deletes, one at a
/// time, until the server dies under it.
async fn writer(channel: Channel, ledger: Ledger, round: usize, w: usize, seed: u64) -> u64 {
    let mut rng = Rng(seed | 1);
    let mut docs = DocumentsClient::new(channel);
    let mut mine: Vec<String> = ledger
        .lock()
        .expect("ledger")
        .keys()
        .filter(|id| id.starts_with(&format!("w{w}-")))
        .cloned()
        .collect();
    mine.sort();
    let mut acked = 0;
    for n in 0.. {
        let roll = rng.below(100);
        let id = if roll < 55 || mine.is_empty() {
            let id = format!("w{w}-r{round}-{n}");
            mine.push(id.clone());
            id
        } else {
            mine[rng.below(mine.len() as u64) as usize].clone()
        };
        if roll >= 90 {
            ledger
                .lock()
                .expect("ledger")
                .entry(id.clone())
                .or_default()
                .in_flight = Some(InFlight::Delete);
            let result = docs
                .delete_document(DeleteDocumentRequest {
                    database: DATABASE.into(),
                    collection: COLLECTION.into(),
                    id: id.clone(),
                    partition_key: pk(&id),
                    if_match: String::new(),
                    ..Default::default()
                })
                .await;
            let answered_at = now_ms();
            let mut ledger = ledger.lock().expect("ledger");
            let entry = ledger.get_mut(&id).expect("entry");
            match result {
                Ok(_) => {
                    entry.acked = None;
                    entry.written = true;
                    entry.in_flight = None;
                    acked += 1;
                }
                Err(status) if status.code() == Code::NotFound => {
                    // Already gone (expired or never there): the state stands. Not for a
                    // version acknowledged and still live when the answer came: that would be
                    // a live document reported missing.
                    if let Some(a) = &entry.acked {
                        assert!(
                            a.expires_ms.is_some_and(|e| e <= answered_at),
                            "deleting {id} answered NotFound ({}) while its acknowledged version was live: {a:?}, answered at {answered_at}",
                            status.message()
                        );
                    }
                    entry.in_flight = None;
                }
                Err(_) => return acked, // the server died; the delete stays in flight
            }
            continue;
        }
        let marker = rng.next() >> 12;
        let ttl: Option<i64> = match rng.below(7) {
            0 => None,
            1 => Some(1),
            2 => Some(2),
            3 => Some(3),
            4 => Some(6),
            5 => Some(3600),
            _ => Some(-1),
        };
        let ttl_ms = match ttl {
            None => Some(DEFAULT_TTL * 1000),
            Some(-1) => None,
            Some(s) => Some(s * 1000),
        };
        let mut body = Map::new();
        body.insert("id".into(), json!(id));
        body.insert("pk".into(), json!(partition(&id)));
        body.insert("marker".into(), json!(marker));
        body.insert(
            "pad".into(),
            json!("x".repeat(200 + (marker % 300) as usize)),
        );
        ledger
            .lock()
            .expect("ledger")
            .entry(id.clone())
            .or_default()
            .in_flight = Some(InFlight::Upsert {
            marker,
            ttl_ms,
            sent_at: now_ms(),
        });
        let result = docs
            .upsert_document(UpsertDocumentRequest {
                database: DATABASE.into(),
                collection: COLLECTION.into(),
                body: Some(JsonObject::new(body)),
                partition_key: None,
                ttl,
                if_match: String::new(),
                ..Default::default()
            })
            .await;
        match result {
            Ok(response) => {
                let doc = response.into_inner().document.expect("document");
                let version = Version::of(&doc);
                assert_eq!(version.marker, marker);
                assert_eq!(version.ttl, ttl.map(|t| t as i32));
                let mut ledger = ledger.lock().expect("ledger");
                let entry = ledger.get_mut(&id).expect("entry");
                entry.etags.push(version.etag.clone());
                entry.acked = Some(version);
                entry.written = true;
                entry.in_flight = None;
                acked += 1;
            }
            Err(_) => return acked,
        }
    }
    acked
}

/// Every event of the change feed from a start, read until none comes for 2 s (the server is
/// idle, and the feed sends what it has at once), with the continuation after each message.
async fn read_feed(channel: Channel, start: ChangeFeedStart) -> Vec<(ChangeEvent, String)> {
    let mut stream = DocumentsClient::new(channel)
        .change_feed(ChangeFeedRequest {
            database: DATABASE.into(),
            collection: COLLECTION.into(),
            mode: ChangeFeedMode::AllVersionsAndDeletes as i32,
            start: Some(start),
            max_events: 100,
            ..Default::default()
        })
        .await
        .expect("the feed opens")
        .into_inner();
    let mut out = Vec::new();
    while let Ok(message) = tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
        let message = message
            .expect("the feed reads")
            .expect("the feed stays open");
        for event in message.events {
            out.push((event, message.continuation.clone()));
        }
    }
    out
}

/// The change feed after the last restart: every acknowledged write has its event, once;
/// positions never repeat or go backwards within a shard; a continuation resumes exactly
/// after its message. Returns the events checked.
async fn verify_feed(channel: Channel, ledger: &Ledger) -> usize {
    let events = read_feed(channel.clone(), ChangeFeedStart::Beginning(())).await;
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut written: HashMap<String, usize> = HashMap::new();
    for (event, _) in &events {
        let shard = event.shard.expect("every event names its shard");
        if let Some(&before) = last.get(&shard) {
            assert!(
                event.lsn > before,
                "shard {shard}: position {} after {before}",
                event.lsn
            );
        }
        last.insert(shard, event.lsn);
        if let Some(doc) = &event.document {
            *written.entry(doc.etag.clone()).or_default() += 1;
        }
    }
    for (id, expected) in ledger.lock().expect("ledger").iter() {
        for etag in &expected.etags {
            assert_eq!(
                written.get(etag),
                Some(&1),
                "acknowledged write {etag} of {id}: not once in the change feed"
            );
        }
    }
    // Resumed after the first message: exactly what came after it.
    if let Some(i) = events.iter().position(|(_, token)| *token != events[0].1) {
        let token = events[i - 1].1.clone();
        let rest = read_feed(channel, ChangeFeedStart::Continuation(token)).await;
        let key = |(e, _): &(ChangeEvent, String)| (e.shard, e.lsn);
        // Shards interleave differently from read to read: compared as sets.
        let mut want: Vec<_> = events[i..].iter().map(key).collect();
        let mut got: Vec<_> = rest.iter().map(key).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "resumed after the first message");
    }
    events.len()
}

#[derive(Debug, Default)]
struct Checked {
    present: u64,
    expired: u64,
    deleted: u64,
    resolved_in_flight: u64,
    queried: usize,
}

/// Reads every id back and checks it against the ledger; resolves writes that were in flight
/// when the server was killed at `killed_at` (ms).
async fn verify(channel: Channel, ledger: &Ledger, killed_at: i64) -> Checked {
    let mut docs = DocumentsClient::new(channel);
    let ids: Vec<String> = ledger.lock().expect("ledger").keys().cloned().collect();
    let mut checked = Checked::default();
    for id in ids {
        let expected = ledger.lock().expect("ledger")[&id].clone();
        let before = now_ms();
        let result = docs
            .read_document(ReadDocumentRequest {
                database: DATABASE.into(),
                collection: COLLECTION.into(),
                id: id.clone(),
                partition_key: pk(&id),
            })
            .await;
        let after = now_ms();
        // What a NotFound said (a missing document, or a missing collection: which tells a
        // lost document from a lost catalog change when this fails).
        let mut absent = String::new();
        let found = match result {
            Ok(doc) => Some(Version::of(&doc.into_inner())),
            Err(status) if status.code() == Code::NotFound => {
                absent = status.message().to_string();
                None
            }
            Err(status) => panic!("reading {id} after restart: {status}"),
        };
        if let Some(v) = &found {
            assert!(
                v.expires_ms.is_none_or(|e| e > before),
                "{id} is visible after its expiry instant: {v:?}, read at {before}"
            );
        }
        let in_flight_marker = match expected.in_flight {
            Some(InFlight::Upsert { marker, .. }) => Some(marker),
            _ => None,
        };
        let entry_acked = expected.acked.clone();
        let resolved = match (&found, &entry_acked) {
            // Exactly the acknowledged version: body, etag, last write and expiry.
            (Some(v), Some(a)) if v == a => {
                checked.present += 1;
                Some(a.clone())
            }
            // The write in flight at the kill made it, whole.
            (Some(v), _) if Some(v.marker) == in_flight_marker => {
                checked.resolved_in_flight += 1;
                Some(v.clone())
            }
            (Some(v), _) => panic!(
                "{id} has a version nobody was told of or that was overwritten: found {v:?}, expected {expected:?}"
            ),
            (None, Some(a)) => {
                let expired = a.expires_ms.is_some_and(|e| e <= after);
                // Or the write in flight replaced it and may have expired since: it was
                // applied after it was sent (and before the kill), so it expired by `after`
                // at the latest if it was sent `ttl` before.
                let replaced = match expected.in_flight {
                    Some(InFlight::Delete) => true,
                    Some(InFlight::Upsert {
                        ttl_ms, sent_at, ..
                    }) => ttl_ms.is_some_and(|t| sent_at + t <= after),
                    None => false,
                };
                assert!(
                    expired || replaced,
                    "acknowledged write of {id} lost: expected {a:?}, read at {before}..{after} ({absent}; killed at {killed_at})"
                );
                if expired {
                    checked.expired += 1;
                } else {
                    checked.resolved_in_flight += 1;
                }
                None
            }
            (None, None) => {
                if expected.written {
                    checked.deleted += 1;
                }
                None
            }
        };
        let mut ledger = ledger.lock().expect("ledger");
        let entry = ledger.get_mut(&id).expect("entry");
        entry.acked = resolved;
        entry.written = true;
        entry.in_flight = None;
    }
    checked
}

/// Runs an index query over every document and checks it against the ledger as `verify`
/// resolved it: each result is a live version (id and marker), and every version that cannot
/// have expired while the query ran is among them. Returns the results checked.
async fn verify_query(channel: Channel, ledger: &Ledger) -> usize {
    let mut docs = DocumentsClient::new(channel);
    let before = now_ms();
    let mut pages = docs
        .query(QueryRequest {
            database: DATABASE.into(),
            collection: COLLECTION.into(),
            query: "SELECT c.id, c.marker FROM c WHERE c.marker >= 0".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("query after restart")
        .into_inner();
    let mut found: HashMap<String, u64> = HashMap::new();
    while let Some(page) = pages.message().await.expect("query page") {
        let metrics = page.metrics.expect("metrics");
        assert_eq!(metrics.index, "/marker/?", "the query reads the index");
        for row in page.results {
            let Some(id) = row["id"].as_str().map(str::to_owned) else {
                panic!("a row has its id: {row}");
            };
            let Some(marker) = row["marker"].as_f64() else {
                panic!("a row has its marker: {row}");
            };
            assert!(
                found.insert(id.clone(), marker as u64).is_none(),
                "{id} returned twice"
            );
        }
    }
    let after = now_ms();
    let ledger = ledger.lock().expect("ledger");
    for (id, marker) in &found {
        let acked = ledger.get(id).and_then(|e| e.acked.as_ref());
        assert!(
            acked.is_some_and(|a| a.marker == *marker && a.expires_ms.is_none_or(|e| e > before)),
            "the query returned {id} (marker {marker}), which is not live as acknowledged: {acked:?}"
        );
    }
    for (id, entry) in ledger.iter() {
        if let Some(a) = &entry.acked
            && a.expires_ms.is_none_or(|e| e > after)
        {
            assert!(
                found.contains_key(id),
                "the query missed {id}, live as acknowledged: {a:?}"
            );
        }
    }
    found.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill_and_nothing_outlives_its_ttl() {
    let seed = std::env::var("MAYFLY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() as u64);
    let rounds = std::env::var("MAYFLY_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    eprintln!("crash test seed {seed} (MAYFLY_CRASH_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let ledger: Ledger = Arc::default();
    let mut acked_total = 0;
    let mut totals = Checked::default();
    let mut killed_at = 0;

    for round in 0..rounds {
        let server = support::Mayfly::start(&data, &[]);
        let channel = support::clients::channel(&server.url()).await;
        if round == 0 {
            DatabasesClient::new(channel.clone())
                .create_database(CreateDatabaseRequest {
                    id: DATABASE.into(),
                    ..Default::default()
                })
                .await
                .expect("database");
            CollectionsClient::new(channel.clone())
                .create_collection(CreateCollectionRequest {
                    database: DATABASE.into(),
                    id: COLLECTION.into(),
                    partition_key_path: "/pk".into(),
                    default_ttl: Some(DEFAULT_TTL),
                    ..Default::default()
                })
                .await
                .expect("collection");
        } else {
            // Straight after the restart: reads must already be right.
            let checked = verify(channel.clone(), &ledger, killed_at).await;
            totals.queried += verify_query(channel.clone(), &ledger).await;
            totals.present += checked.present;
            totals.expired += checked.expired;
            totals.deleted += checked.deleted;
            totals.resolved_in_flight += checked.resolved_in_flight;
        }

        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                tokio::spawn(writer(
                    channel.clone(),
                    ledger.clone(),
                    round,
                    w,
                    rng.next(),
                ))
            })
            .collect();
        let run_for = Duration::from_millis(300 + rng.below(1200));
        tokio::time::sleep(run_for).await;
        server.kill9();
        killed_at = now_ms();
        for w in writers {
            acked_total += tokio::time::timeout(Duration::from_secs(30), w)
                .await
                .expect("writers notice the kill")
                .expect("writer task");
        }
    }
    let server = support::Mayfly::start(&data, &[]);
    let channel = support::clients::channel(&server.url()).await;
    let checked = verify(channel.clone(), &ledger, killed_at).await;
    totals.queried += verify_query(channel.clone(), &ledger).await;
    totals.present += checked.present;
    totals.expired += checked.expired;
    totals.deleted += checked.deleted;
    totals.resolved_in_flight += checked.resolved_in_flight;
    let events = verify_feed(channel, &ledger).await;
    drop(server);

    let ids = ledger.lock().expect("ledger").len();
    eprintln!(
        "crash test: {rounds} SIGKILL rounds, {acked_total} acknowledged writes over {ids} ids; \
         checks after restarts: {} present exactly as acknowledged, {} expired and invisible, \
         {} deleted and absent, {} in-flight writes resolved; {} index query results checked; \
         {events} change feed events checked",
        totals.present, totals.expired, totals.deleted, totals.resolved_in_flight, totals.queried
    );
    assert!(acked_total > 0, "the load must have written something");
    assert!(
        totals.present > 0,
        "some acknowledged documents must be checked present"
    );
}
