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
//! use mayfly_client::{Client, DefaultTtl, DocumentTtl};
//!
//! let client = Client::connect(address).await?;
//! let db = client.create_database("app").await?;
//! let sessions = db
//!     .create_collection("sessions", "/user")
//!     .default_ttl(DefaultTtl::After(Duration::from_secs(1800)))
//!     .await?;
//! sessions.create(&serde_json::json!({"id": "s1", "user": "ann"})).await?;
//! sessions.create(&serde_json::json!({"id": "s2", "user": "bob"}))
//!     .ttl(DocumentTtl::After(Duration::from_secs(60)))
//!     .await?;
//! sessions.touch("s1", "ann").await?; // another 30 minutes
//! let s2 = sessions.read("s2", "bob").await?.expect("alive");
//! assert!(s2.remaining() <= Some(Duration::from_secs(60)));
//! # Ok(()) }
//! ```
//!
//! [Mayfly]: https://example.invalid/mayfly

mod client;
mod collection;
mod document;
mod error;
mod feed;
mod requests;
mod ttl;

pub use client::{Client, CreateCollection, Database};
pub use collection::{Collection, CollectionInfo, CollectionSettings, IndexingMode};
pub use document::{DeleteOutcome, Document, PartitionKey, TouchOutcome, UpsertOutcome};
pub use error::Error;
pub use feed::{Feed, FeedPage, ReadFeed};
pub use requests::{
    CreateDocument, DeleteDocument, ReplaceDocument, TouchDocument, UpsertDocument,
};
pub use ttl::{DefaultTtl, DocumentTtl};
