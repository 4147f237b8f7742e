//! Expiry bookkeeping: a timer wheel for documents with their own ttl, per-collection queues
//! in write order for documents that inherit the default, and an index of when each queue is
//! next due.

pub(crate) mod inherit_queue;
pub(crate) mod queue_heads;
pub(crate) mod wheel;
