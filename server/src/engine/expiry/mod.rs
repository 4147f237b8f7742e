//! Expiry bookkeeping: a timer wheel for documents with their own ttl, and per-collection
//! queues in write order for documents that inherit the default.

pub(crate) mod inherit_queue;
pub(crate) mod wheel;
