//! Physical deletion of expired documents, and the rule changes it must respect.
//!
//! Visibility never waits for the purge: reads compare against the clock. The purge only frees
//! storage, in batches of bounded size, each under one short hold of the shard lock and in one
//! storage write. Its lag (expiry instant to storage freed) is recorded per document.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{clock::Clock, shard::Shard};

#[cfg(test)]
pub(crate) use super::shard::purge_batch::PURGE_BATCH;
#[cfg(test)]
pub(crate) use super::shard::purge_batch::Undurable;

/// Background purge tasks, one per shard; dropping the guard stops them.
#[derive(Debug)]
pub struct PurgeGuard {
    tasks: Vec<JoinHandle<()>>,
}

impl PurgeGuard {
    pub(crate) fn spawn(shards: &[Arc<Shard>], clock: &Arc<dyn Clock>) -> Self {
        let tasks = shards
            .iter()
            .map(|shard| tokio::spawn(Shard::run_purge(shard.clone(), clock.clone())))
            .collect();
        PurgeGuard { tasks }
    }
}

impl Drop for PurgeGuard {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
