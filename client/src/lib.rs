//! Rust client for [Mayfly], a document database served over gRPC whose reason to exist is
//! time to live: documents expire by Azure Cosmos DB's TTL rules, invisible from their expiry
//! instant on.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = mayfly_server::RunningServer::start(Default::default()).await?;
//! # let address = server.local_addr().to_string();
//! use std::time::Duration;
//! use mayfly_client::{Client, DefaultTtl, DocumentTtl, Lifetime, TouchOutcome};
//! use serde_json::json;
//!
//! let client = Client::connect(address).await?;
//! let db = client.create_database("app").await?;
//! let sessions = db.create_collection("sessions", "/user")
//!     .default_ttl(DefaultTtl::After(Duration::from_secs(1800))).await?; // gone 30 min after last write
//! sessions.create(&json!({"id": "s1", "user": "ann"})).await?;            // or any serde type
//! sessions.create(&json!({"id": "s2", "user": "bob"})).ttl(DocumentTtl::After(Duration::from_secs(60))).await?;
//! if let TouchOutcome::Touched(s1) = sessions.touch("s1", "ann").await? { println!("{:?} left", s1.remaining()); }
//! let s2 = sessions.read("s2", "bob").await?;                             // None once expired
//! assert!(s2.expect("alive").remaining() <= Lifetime::Remaining(Duration::from_secs(60)));
//! # Ok(()) }
//! ```
//!
//! # Outcomes
//!
//! A document that is not there (never written, deleted, or expired: from its expiry instant on
//! it does not exist) is an ordinary outcome for every verb that names one by id, never an
//! error: with TTL, documents disappearing is the normal course of things. A missing database
//! or collection is an error, and so is a stale `if_match`.
//!
//! | verb | document there | no document | stale `if_match` |
//! | --- | --- | --- | --- |
//! | [`read`](Collection::read), [`read_item`](Collection::read_item), [`get`](Collection::get) | `Ok(Some(..))` | `Ok(None)` | — |
//! | [`create`](Collection::create) | `Err(`[`Error::Conflict`]`)`, reason `DOCUMENT_EXISTS` | `Ok(Document)` | — |
//! | [`upsert`](Collection::upsert) | `Ok(`[`UpsertOutcome::Replaced`]`)` | `Ok(`[`UpsertOutcome::Created`]`)`; with `if_match`, `Err(`[`Error::PreconditionFailed`]`)` | `Err(`[`Error::PreconditionFailed`]`)` |
//! | [`replace`](Collection::replace), [`replace_item`](Collection::replace_item) | `Ok(`[`ReplaceOutcome::Replaced`]`)` | `Ok(`[`ReplaceOutcome::Missing`]`)` | `Err(`[`Error::PreconditionFailed`]`)` |
//! | [`update`](Collection::update) | `Ok(`[`UpdateOutcome::Updated`]`)` | `Ok(`[`UpdateOutcome::Missing`]`)` | retried (its own `if_match`) |
//! | [`touch`](Collection::touch) | `Ok(`[`TouchOutcome::Touched`]`)` | `Ok(`[`TouchOutcome::Missing`]`)` | `Err(`[`Error::PreconditionFailed`]`)` |
//! | [`delete_document`](Collection::delete_document) | `Ok(`[`DeleteOutcome::Deleted`]`)` | `Ok(`[`DeleteOutcome::Missing`]`)` | `Err(`[`Error::PreconditionFailed`]`)` |
//! | [`patch`](Collection::patch) | `Ok(`[`PatchOutcome::Patched`]`)`, or `Ok(`[`PatchOutcome::Created`]`)` with [`create_if_missing`](Patch::create_if_missing) | `Ok(`[`PatchOutcome::Missing`]`)` | `Err(`[`Error::PreconditionFailed`]`)`, also for a false condition ([`Reason::ConditionNotMet`]) |
//! | [`batch`](Collection::batch) | `Ok(Vec<`[`BatchResult`]`>)` | the operation's error, [`Error::operation_index`] naming it: a batch is all or nothing, so a missing document fails it | the operation's error, likewise |
//!
//! Every error the server sends carries its [`Reason`] ([`Error::reason`]); which errors are
//! worth sending again is [`Error::is_retryable`], and which requests the client sends again
//! by itself is [`RetryPolicy`].
//!
//! # Idempotency keys
//!
//! A write whose answer was lost (a timeout, a broken connection: [`Error::may_have_applied`])
//! may or may not have been applied. Send it with an idempotency key and sending it again is
//! safe: every write, patch and batch takes `.idempotency_key(key)`, the server applies a
//! request at most once while it remembers its key (10 minutes by default, per collection and
//! partition, kept across restarts), and a copy of an applied request gets the first answer
//! again. The client's [`RetryPolicy`] then retries keyed writes after timeouts and broken
//! connections too. After a server restart (or once many newer answers took its place) the
//! answer itself is gone and a copy fails with [`Error::Conflict`], reason
//! [`Reason::RequestAlreadyApplied`]: applied once, nothing applied now. The same key with a
//! different request is [`Reason::IdempotencyKeyReused`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = mayfly_server::RunningServer::start(Default::default()).await?;
//! # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
//! # let db = client.create_database("app").await?;
//! # let carts = db.create_collection("carts", "/user").await?;
//! use mayfly_client::{PatchOps, new_idempotency_key};
//! carts.create(&serde_json::json!({"id": "c1", "user": "ann", "apples": 0})).await?;
//! let key = new_idempotency_key(); // one per logical write, reused by each of its tries
//! for _ in 0..3 {
//!     carts.patch("c1", "ann").ops(PatchOps::new().incr("/apples", 1)).idempotency_key(&key).await?;
//! }
//! let cart = carts.read("c1", "ann").await?.expect("there");
//! assert_eq!(cart.body()["apples"], 1); // applied once
//! # Ok(()) }
//! ```
//!
//! # Mixed lifetimes
//!
//! A collection whose carts expire beside orders that must not relies on every order being
//! written with [`DocumentTtl::Never`]. A [`MustLiveRule`] makes the server hold writers to it:
//! `.must_live(MustLiveRule::new("/type", ["order"]))` on
//! [`create_collection`](Database::create_collection) (or
//! [`CollectionSettings::must_live`]), and an order written without `ttl: -1` fails with
//! [`Reason::MustLive`] instead of expiring an hour later. See [`CreateCollection::must_live`].
//!
//! # Connections
//!
//! [`Client::builder`] sets a connect timeout (5 s), a per-request timeout (30 s, failing
//! with [`Error::Timeout`]), HTTP/2 keepalive (a ping every 30 s, answered within 10 s) and
//! [`RetryPolicy::default`]; [`ClientBuilder::connect_lazy`] makes a client without dialing.
//! A server that cannot be reached is [`Error::Connect`], naming the address and the cause.
//!
//! # Streams
//!
//! Feeds ([`Feed::into_stream`]) and queries ([`QueryResults`]) are [`Stream`]s that fetch
//! pages as they are read. [`StreamExt`] (tokio-stream's, re-exported) gives them `next`,
//! `map`, `filter`, `take`, `collect`, ..., without a dependency on `tokio-stream`:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = mayfly_server::RunningServer::start(Default::default()).await?;
//! # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
//! # let db = client.create_database("app").await?;
//! # let events = db.create_collection("events", "/user").await?;
//! use mayfly_client::StreamExt as _;
//! for n in 0..5 {
//!     events.create(&serde_json::json!({"id": format!("e{n}"), "user": "ann", "n": n})).await?;
//! }
//! let mut big = events.query::<u32>("SELECT VALUE e.n FROM e WHERE e.n >= 2").await?;
//! let mut sum = 0;
//! while let Some(n) = big.next().await {
//!     sum += n?;
//! }
//! assert_eq!(sum, 2 + 3 + 4);
//! let ids: Vec<String> = events.read_feed().await?.into_stream::<serde_json::Value>()
//!     .map(|item| item.map(|item| item.id().to_owned()))
//!     .collect::<Result<_, _>>()
//!     .await?;
//! assert_eq!(ids.len(), 5);
//! # Ok(()) }
//! ```
//!
//! (Import it as `_`: another `StreamExt` in scope, `futures`' say, would make `next`
//! ambiguous.)
//!
//! [Mayfly]: https://example.invalid/mayfly

mod batch;
mod changes;
mod client;
mod collection;
mod consumer_group;
mod document;
mod error;
mod feed;
mod pages;
mod patch;
mod query;
mod requests;
mod retry;
mod routing;
mod tls;
mod ttl;

pub use batch::{Batch, BatchResult, MAX_BATCH_OPERATIONS};
pub use changes::{
    Change, ChangeBatch, ChangeFeed, ChangeKind, ChangeStream, FeedRange, StartFrom,
};
pub use client::{Client, ClientBuilder, CreateCollection, Database, EnsureCollection, Ensured};
pub use collection::{
    Collection, CollectionInfo, CollectionSettings, IndexingMode, IndexingPaths, MustLiveRule,
    Throughput, ThroughputProperties,
};
pub use consumer_group::{ClaimedRange, ConsumerGroup};
pub use document::{
    DeleteOutcome, Document, Item, Lifetime, PartitionKey, ReplaceOutcome, TouchOutcome,
    UpdateOutcome, UpsertOutcome,
};
pub use error::{Error, ErrorDetails, Reason, StatusCode};
pub use feed::{Feed, FeedPage, FeedStream, ReadFeed};
pub use patch::{Patch, PatchOps, PatchOutcome, json_pointer};
pub use query::{Query, QueryMetrics, QueryPage, QueryResults};
pub use requests::{
    CreateDocument, DeleteDocument, ReplaceDocument, TouchDocument, UpsertDocument,
};
pub use retry::{RetryPolicy, new_idempotency_key};
pub use tls::Tls;
/// The streams of feeds and queries, and their combinators (`next`, `map`, `collect`, ...),
/// re-exported from `tokio-stream` so that consuming them needs no dependency of its own.
pub use tokio_stream::{Stream, StreamExt};
pub use ttl::{DefaultTtl, DocumentTtl};

/// The README's examples, compiled with the doctests (they need a server to run).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
