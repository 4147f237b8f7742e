//! Group commit: one fsync makes every write applied before it durable, so concurrent writers
//! share fsyncs instead of paying one each.
//!
//! Writes are applied to the journal (written through to the OS) under their shard's lock and
//! counted. A writer that must wait notes the count, wakes the syncer thread and waits until a
//! sync that began after its write has finished. The syncer reads the count *before* each
//! fsync, so everything counted is covered by it; while it syncs, new writes accumulate for the
//! next one.
//!
//! The syncer fsyncs the active journal file through a descriptor of its own rather than with
//! `Database::persist`, which holds fjall's journal lock for the whole fsync and so stalls every
//! writer (and, through the shard locks they hold, every request) for its duration: measured,
//! that halved durable write throughput. This relies on fjall 3.1's journal layout, pinned in
//! Cargo.toml and checked by a test: journals are `<n>.jnl` in the database directory, the
//! highest `n` is the active one, and a journal is fsynced before it is sealed. If no journal
//! is found, the syncer falls back to `persist`.

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use fjall::{Database, PersistMode};
use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::storage::{DurableFuture, StorageError};

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// After an fsync covering it: survives a crash of the process, the OS or the machine.
    #[default]
    Fsync,
    /// Once it reaches the OS: survives a crash of the process (kill -9 included), but a power
    /// loss or OS crash loses writes acknowledged in the last [`BUFFERED_SYNC_INTERVAL`].
    Buffered,
}

/// How often `Durability::Buffered` fsyncs in the background.
pub const BUFFERED_SYNC_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Synced {
    /// Writes known durable: the count read before the last successful fsync.
    through: u64,
    /// An fsync failed: the journal is poisoned and nothing more becomes durable.
    failed: bool,
}

#[derive(Debug)]
pub(super) struct GroupCommit {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    db: Database,
    /// fjall's directory, where its journals are.
    db_path: PathBuf,
    mode: Durability,
    /// Writes applied to the journal so far.
    applied: AtomicU64,
    /// Set under `lock` by a waiter, cleared by the syncer when it starts a sync.
    wanted: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
    synced: watch::Sender<Synced>,
}

impl GroupCommit {
    pub(super) fn start(db: Database, db_path: PathBuf, mode: Durability) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            db,
            db_path,
            mode,
            applied: AtomicU64::new(0),
            wanted: Mutex::new(false),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            synced: watch::Sender::new(Synced {
                through: 0,
                failed: false,
            }),
        });
        let thread = thread::Builder::new().name("mayfly-fsync".into()).spawn({
            let shared = shared.clone();
            move || shared.run()
        })?;
        Ok(GroupCommit {
            shared,
            thread: Some(thread),
        })
    }

    /// Counts a write just applied to the journal.
    pub(super) fn applied(&self) {
        self.shared.applied.fetch_add(1, Ordering::SeqCst);
    }

    /// `None` if everything applied so far is durable (or the mode does not wait).
    pub(super) fn durable(&self) -> Option<DurableFuture> {
        let target = self.pending_target()?;
        let mut synced = self.shared.synced.subscribe();
        Some(Box::pin(async move {
            let state = synced
                .wait_for(|s| s.through >= target || s.failed)
                .await
                .map_err(|_| StorageError::new("storage closed before the write was durable"))?;
            check(*state)
        }))
    }

    /// Blocks until everything applied so far is durable.
    pub(super) fn sync_blocking(&self) -> Result<(), StorageError> {
        let Some(target) = self.pending_target() else {
            return Ok(());
        };
        let mut synced = self.shared.synced.subscribe();
        loop {
            let state = *synced.borrow_and_update();
            if state.through >= target || state.failed {
                return check(state);
            }
            // A short park instead of an async wait: callers are purge batches, off the
            // request path, and the syncer is already working on it.
            thread::sleep(Duration::from_micros(50));
        }
    }

    /// The count a waiter must see synced, having asked the syncer for it; `None` if there is
    /// nothing to wait for.
    fn pending_target(&self) -> Option<u64> {
        if self.shared.mode == Durability::Buffered {
            return None;
        }
        let target = self.shared.applied.load(Ordering::SeqCst);
        if self.shared.synced.borrow().through >= target {
            return None;
        }
        // Set under the lock so the syncer cannot miss it between its check and its wait.
        *self.shared.wanted.lock() = true;
        self.shared.wake.notify_one();
        Some(target)
    }
}

fn check(state: Synced) -> Result<(), StorageError> {
    if state.failed {
        Err(StorageError::new(
            "the data directory could not be synced to disk; the write may not be durable (see the server log)",
        ))
    } else {
        Ok(())
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("mode", &self.mode)
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn run(&self) {
        let mut journal: Option<(PathBuf, File)> = None;
        loop {
            {
                let mut wanted = self.wanted.lock();
                match self.mode {
                    Durability::Fsync => {
                        while !*wanted && !self.stop.load(Ordering::SeqCst) {
                            self.wake.wait(&mut wanted);
                        }
                    }
                    Durability::Buffered => {
                        if !self.stop.load(Ordering::SeqCst) {
                            self.wake.wait_for(&mut wanted, BUFFERED_SYNC_INTERVAL);
                        }
                    }
                }
                *wanted = false;
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let target = self.applied.load(Ordering::SeqCst);
            if self.synced.borrow().through >= target {
                continue;
            }
            match self.sync_journal(&mut journal) {
                Ok(()) => {
                    self.synced.send_modify(|s| s.through = target);
                }
                Err(e) => {
                    tracing::error!(error = %e, "fsync of the journal failed; refusing further durable acknowledgements");
                    self.synced.send_modify(|s| s.failed = true);
                    return;
                }
            }
        }
    }
}

impl Shared {
    /// Fsyncs the active journal (see the module docs), reopening it when fjall has moved on
    /// to a new one, whose directory entry is synced too.
    fn sync_journal(&self, journal: &mut Option<(PathBuf, File)>) -> Result<(), String> {
        let Some(active) = active_journal(&self.db_path).map_err(|e| e.to_string())? else {
            return self
                .db
                .persist(PersistMode::SyncData)
                .map_err(|e| e.to_string());
        };
        if journal.as_ref().is_none_or(|(path, _)| *path != active) {
            let file = File::open(&active).map_err(|e| format!("{}: {e}", active.display()))?;
            File::open(&self.db_path)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| format!("{}: {e}", self.db_path.display()))?;
            *journal = Some((active, file));
        }
        let (path, file) = journal.as_ref().expect("opened above");
        file.sync_data()
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The journal fjall appends to: the highest-numbered `<n>.jnl` in its directory.
pub(super) fn active_journal(db_path: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(db_path)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if best.as_ref().is_none_or(|(b, _)| n > *b) {
            best = Some((n, entry.path()));
        }
    }
    Ok(best.map(|(_, path)| path))
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _wanted = self.shared.wanted.lock();
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
