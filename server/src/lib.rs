//! Mayfly server: a document database served over gRPC whose reason to exist is time to live.
//!
//! Layers, top to bottom: [`grpc`] (validation, proto ↔ domain conversion, error → status) →
//! [`engine`] (shards, TTL rules, expiry, feed) → [`storage`] (where records live).

pub mod engine;
pub mod storage;
