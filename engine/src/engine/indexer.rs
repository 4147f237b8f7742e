//! The background indexer: one task that gives documents owed an index update their entries,
//! shard by shard in short batches, and records a rebuilt index complete once every shard has
//! caught up. `lazy` collections rely on it for every write; any collection relies on it after
//! a policy change (a rebuild). Its writes are never acknowledged to anyone: after a crash,
//! what it had not made durable is owed again (see [`Engine::open`]).

use std::{sync::Arc, time::Duration};

use tokio::task::JoinHandle;

use super::{CollectionInfo, CollectionPath, Engine, Error};
use crate::storage::CatalogChange;

/// Documents indexed per shard per batch: bounds each hold of a shard lock and each read.
const INDEX_BATCH: usize = 256;
/// How long the indexer waits before retrying after a failure.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The background indexer task; dropping the guard stops it.
#[derive(Debug)]
pub struct IndexerGuard {
    task: JoinHandle<()>,
}

impl Drop for IndexerGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Engine {
    /// Starts the background indexer on the current tokio runtime. Its rounds read storage,
    /// so they run on blocking threads.
    pub fn spawn_indexer(&self) -> IndexerGuard {
        let engine = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let worker = engine.clone();
                match tokio::task::spawn_blocking(move || worker.index_round()).await {
                    Ok(Ok(true)) => tokio::task::yield_now().await,
                    // A write owing an update, or a policy change, leaves a permit behind.
                    Ok(Ok(false)) => engine.inner.indexer_wake.notified().await,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "the indexer failed; will retry");
                        tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "an indexer round panicked; will retry");
                        tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                    }
                }
            }
        });
        IndexerGuard { task }
    }

    /// One round: a batch in every shard, then every rebuild that has caught up recorded
    /// complete. Returns whether more is owed.
    pub(crate) fn index_round(&self) -> Result<bool, Error> {
        let mut more = false;
        for shard in self.shards() {
            more |= shard.index_batch(INDEX_BATCH)?.more;
        }
        self.finish_rebuilds()?;
        Ok(more)
    }

    /// Indexes everything owed now, synchronously (tests; servers run
    /// [`Engine::spawn_indexer`]).
    #[cfg(test)]
    pub(crate) fn index_now(&self) {
        while self.index_round().expect("indexes") {}
    }

    /// Records complete, durably, the index of every collection whose shards have all caught
    /// up with its policy: from then on `consistent` queries read it again.
    pub(crate) fn finish_rebuilds(&self) -> Result<(), Error> {
        let incomplete: Vec<Arc<CollectionInfo>> = self
            .inner
            .catalog
            .read()
            .all_collections()
            .filter(|info| !info.index_complete)
            .cloned()
            .collect();
        if incomplete.is_empty() {
            return Ok(());
        }
        // Under the catalog lock, no settings change can restart a rebuild meanwhile.
        let _ddl = self.inner.ddl.lock();
        for info in incomplete {
            let path = CollectionPath {
                database: info.database.clone(),
                collection: info.id.clone(),
            };
            let Ok(current) = self.get_collection(&path) else {
                continue;
            };
            if current.uid != info.uid
                || current.index_complete
                || !self.shards().iter().all(|s| s.index_caught_up(info.uid))
            {
                continue;
            }
            let done = Arc::new(CollectionInfo {
                index_complete: true,
                ..(*current).clone()
            });
            // After the entries it vouches for: durable, it makes them durable too.
            let lsn = self
                .inner
                .storage
                .write_catalog(CatalogChange::PutCollection(&done))?;
            self.catalog_durable(lsn)?;
            self.inner.catalog.write().put_collection(done);
        }
        Ok(())
    }
}
