//! Mayfly server: a document database served over gRPC whose reason to exist is time to live.
//!
//! Layers, top to bottom: [`grpc`] (validation, proto ↔ domain conversion, error → status) →
//! [`engine`] (shards, TTL rules, expiry, feed) → [`storage`] (where records live), with
//! [`net`] (the listener and its limits) and [`auth`] beside the edge. The engine, its
//! [`model`] and its storage are the `mayfly-engine` crate, re-exported here under the same
//! paths. [`RunningServer`] assembles them; the `mayfly` binary only parses flags and calls it.

pub mod auth;
mod cluster_directory;
mod cluster_keys;
mod cluster_metrics;
pub mod cluster_node;
pub mod cluster_report;
mod cluster_seal;
pub mod current_engine;
mod engine_load;
/// The shared entry points of the fuzz targets (`fuzz/`) and of the corpus replay test; only
/// with the `fuzzing` feature (which the tests of this package turn on), never in a server.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_entry;
pub mod grpc;
mod metrics_http;
mod nats_sync_check;
pub mod net;
mod server;
mod throughput_limit;

/// The engine, its domain model and its storage: the `mayfly-engine` crate, under the paths
/// the server has always used.
pub use mayfly_engine::{engine, model, storage};

pub use cluster_node::{ClusterConfig, DEFAULT_SNAPSHOT_RECORDS, NatsAuth};
pub use current_engine::CurrentEngine;
pub use net::MAX_MESSAGE_BYTES;
pub use server::{AuthConfig, Config, Network, RunningServer, ServeError, StorageConfig, serve};
pub use storage::default_shards;
