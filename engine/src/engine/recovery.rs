//! Starting from what storage holds. The catalog and every document's metadata (never its
//! body) are loaded before the engine serves; visibility is judged by the rules and the
//! stored absolute instants, so reads are right from the first request, documents that
//! expired while the server was down included. Expiry tracking (timers, inherit queues) is
//! rebuilt afterwards in the background, in short holds of each shard lock; documents already
//! past due go straight to the purge backlog.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use super::{CollectionUid, Engine, EngineConfig, EngineMetrics, Error, clock::Clock};
use crate::storage::{Storage, StorageError};

/// What [`Engine::open`] found in storage.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Databases restored.
    pub databases: usize,
    /// Collections restored.
    pub collections: usize,
    /// Documents restored (expired ones included: they are invisible and due for purge).
    pub documents: usize,
    /// Collections deleted before a crash whose documents were not all freed yet; see
    /// [`Engine::free_collections`].
    pub unfinished_deletions: Vec<CollectionUid>,
    /// Time spent.
    pub elapsed: Duration,
}

/// What [`Engine::rebuild_expiry`] did.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpiryRebuild {
    /// Own-ttl documents given a timer.
    pub timers: usize,
    /// Inheriting documents put back in their collection's queue, in write order.
    pub queued: usize,
    /// Own-ttl documents already past due: marked expired and handed to the purge.
    pub past_due: usize,
    /// Time spent.
    pub elapsed: Duration,
}

impl ExpiryRebuild {
    /// Entries rebuilt.
    pub fn entries(&self) -> usize {
        self.timers + self.queued + self.past_due
    }
}

/// One shard's part of a recovery.
#[derive(Debug, Default)]
pub(super) struct ShardLoad {
    pub(super) documents: usize,
    pub(super) max_version: u64,
    pub(super) orphans: HashSet<CollectionUid>,
}

impl Engine {
    /// An engine over `storage` with everything it holds: catalog and document metadata are
    /// loaded (shards in parallel) before this returns. Call [`Engine::rebuild_expiry`] next,
    /// off the async threads; the engine serves correctly meanwhile.
    pub fn open(
        config: EngineConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Engine, Recovery), Error> {
        Engine::open_counting_into(config, storage, clock, Arc::default())
    }

    /// [`Engine::open`], counting into `metrics`: a server that reopens its storage keeps the
    /// counters it exports going.
    pub fn open_counting_into(
        config: EngineConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
        metrics: Arc<EngineMetrics>,
    ) -> Result<(Engine, Recovery), Error> {
        let started = Instant::now();
        let engine = Engine::with_metrics(config, storage.clone(), clock, metrics);
        let stored = storage.load_catalog()?;
        let mut recovery = Recovery {
            databases: stored.databases.len(),
            ..Recovery::default()
        };
        let mut known = HashSet::new();
        {
            let mut catalog = engine.inner.catalog.write();
            // Every uid handed out before is passed first: databases a backend kept no uid
            // for are given new ones after them.
            catalog.restore_last_uid(stored.last_uid);
            for info in &stored.collections {
                catalog.restore_last_uid(info.uid.0);
            }
            for (_, uid) in &stored.databases.0 {
                catalog.restore_last_uid(uid.map_or(0, |uid| uid.0));
            }
            let shared: HashMap<_, _> = stored.database_throughputs.into_iter().collect();
            for (database, uid) in stored.databases {
                let uid = uid.unwrap_or_else(|| catalog.next_database_uid());
                let throughput = shared.get(&database).copied();
                catalog.add_database(database, uid, throughput);
            }
            for info in stored.collections {
                if !catalog.has_database(&info.database) {
                    continue; // Cannot happen: databases are deleted with their collections.
                }
                engine.attach_collection(&info);
                known.insert(info.uid);
                catalog.put_collection(Arc::new(info));
                recovery.collections += 1;
            }
        }

        let next = AtomicUsize::new(0);
        let workers = thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(engine.shard_count());
        let loads: Vec<Result<ShardLoad, StorageError>> = thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut total = ShardLoad::default();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(shard) = engine.shards().get(i) else {
                                return Ok(total);
                            };
                            let load = shard.load(&known)?;
                            total.documents += load.documents;
                            total.max_version = total.max_version.max(load.max_version);
                            total.orphans.extend(load.orphans);
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("recovery workers do not panic"))
                .collect()
        });
        let mut orphans = HashSet::new();
        let mut versions_below = stored.versions_below;
        for load in loads {
            let load = load?;
            recovery.documents += load.documents;
            versions_below = versions_below.max(load.max_version.saturating_add(1));
            orphans.extend(load.orphans);
        }
        engine
            .inner
            .versions
            .fetch_max(versions_below, Ordering::SeqCst);
        recovery.unfinished_deletions = orphans.into_iter().collect();
        recovery.elapsed = started.elapsed();
        Ok((engine, recovery))
    }

    /// Gives every document loaded by [`Engine::open`] its expiry tracking. Blocks (run it on
    /// its own thread); catalog changes wait for it, since a settings change must find every
    /// document tracked.
    pub fn rebuild_expiry(&self) -> ExpiryRebuild {
        let started = Instant::now();
        let _ddl = self.inner.ddl.lock();
        let mut report = ExpiryRebuild::default();
        for shard in self.shards() {
            shard.rebuild_expiry(&*self.inner.clock, &mut report);
        }
        report.elapsed = started.elapsed();
        report
    }

    /// Frees the stored documents of collections whose deletion a crash interrupted.
    pub fn free_collections(&self, uids: &[CollectionUid]) -> Result<(), Error> {
        for &uid in uids {
            for shard in self.shards() {
                shard.drop_stored_collection(uid)?;
            }
        }
        Ok(())
    }
}
