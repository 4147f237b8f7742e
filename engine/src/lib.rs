//! Mayfly's engine as a library: the TTL engine over sharded in-memory state ([`engine`]), the
//! domain types it shares with storage ([`model`]) and where records live ([`storage`]).
//!
//! Layers, top to bottom: [`engine`] → [`storage`] → [`model`]. None of them knows gRPC or the
//! network: this crate depends on neither tonic nor any socket or HTTP crate
//! (`cargo tree -p mayfly-engine -e normal` shows it). The server (`mayfly-server`) re-exports
//! these modules under the same names.

pub mod engine;
pub mod model;
pub mod storage;
/// Checks shared by the engine's tests and the server's fuzz entry points.
#[doc(hidden)]
#[cfg(any(test, feature = "testing"))]
pub mod testing;
