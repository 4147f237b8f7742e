//! Mayfly server: a document database served over gRPC whose reason to exist is time to live.
//!
//! Layers, top to bottom: [`grpc`] (validation, proto ↔ domain conversion, error → status) →
//! [`engine`] (shards, TTL rules, expiry, feed) → [`storage`] (where records live).
//! [`RunningServer`] assembles them; the `mayfly` binary only parses flags and calls it.

pub mod auth;
pub mod current_engine;
pub mod engine;
/// The shared entry points of the fuzz targets (`fuzz/`) and of the corpus replay test.
#[doc(hidden)]
pub mod fuzz_entry;
pub mod grpc;
mod metrics_http;
pub mod model;
pub mod net;
mod server;
pub mod storage;

pub use current_engine::CurrentEngine;
pub use server::{
    AuthConfig, Config, MAX_MESSAGE_BYTES, Network, RunningServer, ServeError, StorageConfig,
    default_shards, serve,
};
