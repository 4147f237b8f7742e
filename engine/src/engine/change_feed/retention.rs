//! Retention: a background task removes each collection's change log records older than its
//! `change_feed_retention` (all of them once its feed is turned off), in batches, one
//! tombstone per record. A reader behind what it removed is told so (see
//! [`Error::ChangesTrimmed`]).

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::engine::{Engine, Error};

/// How often retention runs.
const RETENTION_INTERVAL: Duration = Duration::from_secs(10);
/// Records removed per storage batch.
const TRIM_BATCH: usize = 4096;

/// The background retention task; dropping the guard stops it.
#[derive(Debug)]
pub struct RetentionGuard {
    task: JoinHandle<()>,
}

impl Drop for RetentionGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Engine {
    /// Starts change feed retention on the current tokio runtime. Its rounds read and write
    /// storage, so they run on blocking threads.
    pub fn spawn_feed_retention(&self) -> RetentionGuard {
        let engine = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(RETENTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let worker = engine.clone();
                match tokio::task::spawn_blocking(move || worker.trim_change_feeds()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "change feed retention failed; will retry")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "a change feed retention round panicked; will retry")
                    }
                }
            }
        });
        RetentionGuard { task }
    }

    /// Removes every change log record retention no longer keeps; returns how many. Blocks
    /// on storage.
    pub(crate) fn trim_change_feeds(&self) -> Result<usize, Error> {
        let now = self.inner.clock.now();
        let collections: Vec<_> = self
            .inner
            .catalog
            .read()
            .all_collections()
            .cloned()
            .collect();
        let mut removed = 0;
        for info in collections {
            let retention = info.settings.change_feed_retention();
            for (i, shard) in self.shards().iter().enumerate() {
                let below = if retention.is_on() {
                    self.first_at_or_after(info.uid, i, now.saturating_sub(retention.millis()))?
                } else {
                    shard.log_tip().seq + 1
                };
                loop {
                    let n = shard.trim_log(info.uid, below, TRIM_BATCH)?;
                    removed += n;
                    if n < TRIM_BATCH {
                        break;
                    }
                }
            }
        }
        Ok(removed)
    }
}
