//! The engine requests go to. Storage that failed is reopened by building a new engine over
//! the data directory (recovery from the journal then decides every write whose outcome was
//! unknown); switching this slot moves every service to it at once.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::{
    engine::{Engine, EngineMetrics, Error},
    storage::StorageError,
};

/// A shared slot holding the engine in service, or nothing while storage is being reopened.
/// Cheap to clone: clones share the slot.
#[derive(Debug, Clone)]
pub struct CurrentEngine {
    slot: Arc<RwLock<Option<Engine>>>,
    /// Counters every engine in this slot updates, so exported counts survive a reopen.
    metrics: Arc<EngineMetrics>,
}

impl CurrentEngine {
    /// A slot serving `engine`.
    pub fn new(engine: Engine) -> Self {
        CurrentEngine {
            metrics: engine.metrics().clone(),
            slot: Arc::new(RwLock::new(Some(engine))),
        }
    }

    /// The counters engines in this slot update.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    /// The engine in service. A request takes it once and uses it throughout: the position
    /// a write waits for belongs to the storage that applied it.
    pub fn get(&self) -> Result<Engine, Error> {
        self.slot.read().clone().ok_or_else(|| {
            Error::Storage(StorageError::unavailable(
                "the data directory is being reopened after a storage failure; retry shortly",
            ))
        })
    }

    /// Takes the engine out of service: requests are refused as unavailable until
    /// [`CurrentEngine::put`]. Requests already running keep the engine they took.
    pub(crate) fn take(&self) -> Option<Engine> {
        self.slot.write().take()
    }

    /// Puts `engine` in service.
    pub(crate) fn put(&self, engine: Engine) {
        *self.slot.write() = Some(engine);
    }
}
