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
//! use mayfly_client::{Client, DefaultTtl, DocumentTtl, TouchOutcome};
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
//! assert!(s2.expect("alive").remaining() <= Some(Duration::from_secs(60)));
//! # Ok(()) }
//! ```
//!
//! [Mayfly]: https://example.invalid/mayfly

mod client;
mod collection;
mod document;
mod error;
mod feed;
mod query;
mod requests;
mod tls;
mod ttl;

pub use client::{Client, ClientBuilder, CreateCollection, Database};
pub use collection::{Collection, CollectionInfo, CollectionSettings, IndexingMode, IndexingPaths};
pub use document::{DeleteOutcome, Document, PartitionKey, TouchOutcome, UpsertOutcome};
pub use error::Error;
pub use feed::{Feed, FeedPage, ReadFeed};
pub use query::{Query, QueryMetrics, QueryPage, QueryResults};
pub use requests::{
    CreateDocument, DeleteDocument, ReplaceDocument, TouchDocument, UpsertDocument,
};
pub use tls::Tls;
pub use ttl::{DefaultTtl, DocumentTtl};
