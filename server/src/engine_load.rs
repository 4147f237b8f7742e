//! Opening an engine over what a storage holds: its catalog and documents loaded, then its
//! expiry tracking rebuilt in the background. A single server does it at start and when it
//! reopens failed storage; a cluster node over its own data directory.

use std::{io, sync::Arc, thread};

use crate::{
    engine::{self, Engine, EngineConfig, EngineMetrics, SystemClock},
    storage::Storage,
};

/// Why an engine was not loaded.
#[derive(Debug)]
pub(crate) enum LoadFailed {
    /// What the storage holds could not be loaded.
    Recovery(engine::Error),
    /// The background thread could not be started.
    Thread(io::Error),
}

/// Loads what `storage` holds into a new engine, and rebuilds its expiry tracking on a thread
/// of its own (the engine serves correctly meanwhile).
pub(crate) fn load_engine(
    storage: Arc<dyn Storage>,
    config: EngineConfig,
    metrics: Arc<EngineMetrics>,
) -> Result<Engine, LoadFailed> {
    let (engine, recovery) =
        Engine::open_counting_into(config, storage, Arc::new(SystemClock), metrics)
            .map_err(LoadFailed::Recovery)?;
    if recovery.documents > 0 || recovery.collections > 0 {
        tracing::info!(
            databases = recovery.databases,
            collections = recovery.collections,
            documents = recovery.documents,
            ms = recovery.elapsed.as_millis() as u64,
            "recovered"
        );
    }
    let background = engine.clone();
    thread::Builder::new()
        .name("mayfly-recovery".into())
        .spawn(move || {
            let rebuild = background.rebuild_expiry();
            if rebuild.entries() > 0 {
                let secs = rebuild.elapsed.as_secs_f64().max(1e-9);
                tracing::info!(
                    timers = rebuild.timers,
                    queued = rebuild.queued,
                    past_due = rebuild.past_due,
                    ms = rebuild.elapsed.as_millis() as u64,
                    entries_per_sec = (rebuild.entries() as f64 / secs) as u64,
                    "expiry tracking rebuilt"
                );
            }
            if !recovery.unfinished_deletions.is_empty() {
                match background.free_collections(&recovery.unfinished_deletions) {
                    Ok(()) => tracing::info!(
                        collections = recovery.unfinished_deletions.len(),
                        "finished freeing collections deleted before a crash"
                    ),
                    Err(e) => tracing::warn!(error = %e, "could not free collections deleted before a crash"),
                }
            }
        })
        .map_err(LoadFailed::Thread)?;
    Ok(engine)
}
