//! Cluster mode on NATS JetStream (issue 28; the design is `docs/cluster.md`). Built so far:
//! the message a partition's owner publishes for each commit, the check a follower makes of
//! every message before applying it, the coordinator's assignment of partitions to nodes, and
//! the lease timing that keeps two owners from serving at once.
//! On NATS so far: the leases, in a KV bucket, and an owner's commit path: each partition's
//! publish queue (fenced, batched publishes to its log subject) under the node's storage, so
//! that a write is durable once it is on the local disk and on a JetStream quorum; followers
//! applying the log; snapshots in the log, below which the owner purges it.

pub mod assignment;
pub mod catalog_log;
pub mod chain;
pub mod copy_state;
pub mod epochs;
pub mod follower;
pub mod lease;
pub mod lease_store;
pub mod log_message;
pub mod publish_queue;
pub mod replicated_storage;
pub mod snapshot;

pub use assignment::{Assignment, NodeId, Replicas, assign, ranked_standbys};
pub use catalog_log::{Apply, CatalogError, CatalogLog};
pub use chain::{Chain, Divergence};
pub use epochs::Epochs;
pub use follower::{CatchUpError, Followed, become_owner, catch_up};
pub use lease::{LeaseTiming, OwnerLease};
pub use lease_store::{Clocks, Held, LeaseError, LeaseRecord, Leases, SystemClocks, Watch};
pub use log_message::{DecodeError, LogMessage, MessageKind, Remembered};
pub use publish_queue::{Commit, LogPosition, PublishQueue, TakeoverError};
pub use replicated_storage::ReplicatedStorage;
