//! Group commit: one fsync makes every write applied before it durable, so concurrent writers
//! share fsyncs instead of paying one each.
//!
//! Writes are applied to the journal and numbered ([`Lsn`]). A caller that must wait for a
//! position queues it with a channel, wakes the syncer thread and waits until a sync covering
//! that position has finished. The syncer reads the applied count *before* each sync, writes
//! fjall's journal buffer out to the OS, fsyncs, then answers exactly the waiters whose
//! positions the sync covered; while it syncs, new writes accumulate for the next one. A sync
//! starts as soon as the previous one ends if anyone is waiting, so the group size adapts to
//! the disk: a fast fsync is never padded to a fixed interval, a slow one gathers more writers.
//!
//! The syncer fsyncs the active journal file through a descriptor of its own rather than with
//! `Database::persist`, which holds fjall's journal lock for the whole fsync and so stalls every
//! writer (and, through the shard locks they hold, every request) for its duration: measured,
//! that halved durable write throughput. This relies on fjall 3.1's journal layout, pinned in
//! Cargo.toml and checked by a test: journals are `<n>.jnl` in the database directory, the
//! highest `n` is the active one, and a journal is fsynced before it is sealed. If no journal
//! is found, the syncer falls back to `persist`.

use std::{
    collections::BTreeMap,
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
use tokio::sync::oneshot;

use crate::storage::{DurableFuture, Lsn, StorageError};

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
    /// Writes known durable: the count read before the last successful fsync.
    synced: AtomicU64,
    /// An fsync or a write failed: nothing more becomes durable until storage is reopened.
    failed: AtomicBool,
    /// What failed, for the operator (set before `failed`).
    failure: std::sync::OnceLock<String>,
    /// Makes the next sync fail, as a failing disk would.
    #[cfg(any(test, feature = "fault-injection"))]
    fail_next_sync: AtomicBool,
    waiting: Mutex<Waiting>,
    wake: Condvar,
    stop: AtomicBool,
}

/// Callers waiting for an fsync, by the position each must see synced.
#[derive(Default)]
struct Waiting {
    /// Set by a waiter, cleared by the syncer when it starts a sync.
    wanted: bool,
    /// A sync releases the positions it covered, a prefix of the map: only the callers it made
    /// durable wake.
    queue: BTreeMap<u64, Vec<oneshot::Sender<()>>>,
}

impl GroupCommit {
    pub(super) fn start(db: Database, db_path: PathBuf, mode: Durability) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            db,
            db_path,
            mode,
            applied: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
            #[cfg(any(test, feature = "fault-injection"))]
            fail_next_sync: AtomicBool::new(false),
            waiting: Mutex::default(),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
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

    /// How a batch's commit must persist it to count as applied. Buffered mode acknowledges
    /// without waiting, so each commit writes through to the OS at once (what makes it survive
    /// kill -9). Fsync mode leaves it in fjall's buffer: acknowledgements wait for the syncer,
    /// which writes the buffer out before each fsync, one system call for the whole group.
    pub(super) fn batch_persist(&self) -> Option<PersistMode> {
        match self.shared.mode {
            Durability::Fsync => None,
            Durability::Buffered => Some(PersistMode::Buffer),
        }
    }

    /// Counts a write just applied to the journal and returns its position. Counted after the
    /// append: a sync that reads a count has every write up to it in fjall's buffer.
    pub(super) fn applied(&self) -> Lsn {
        Lsn(self.shared.applied.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// The position of the latest write applied.
    pub(super) fn last_applied(&self) -> Lsn {
        Lsn(self.shared.applied.load(Ordering::SeqCst))
    }

    /// Refuses a write once syncing has failed: it could never be made durable.
    pub(super) fn check(&self) -> Result<(), StorageError> {
        self.shared.check()
    }

    /// Fails storage after a write failed partway (see [`Shared::fail`]) and returns the
    /// error for that write, whose outcome is unknown.
    pub(super) fn write_failed(&self, what: &str, e: &fjall::Error) -> StorageError {
        self.shared
            .fail(format!("{what} failed in the storage engine: {e}"));
        StorageError::outcome_unknown(format!(
            "{what} failed in the storage engine partway ({e}); it may or may not survive a restart, and the server refuses writes until it reopens the data directory"
        ))
    }

    /// Why writes can no longer be made durable, once an fsync or a write failed.
    pub(super) fn failure(&self) -> Option<StorageError> {
        self.shared.check().err()
    }

    /// Makes the next sync fail.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(super) fn fail_next_sync(&self) {
        self.shared.fail_next_sync.store(true, Ordering::SeqCst);
    }

    /// `None` if every write up to `lsn` is durable (or the mode does not wait).
    pub(super) fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        let target = lsn.0;
        // What a sync covered stays durable, failure or not: most reads stop here, without
        // the lock, and reads of synced data go on after a failure.
        if self.shared.synced.load(Ordering::SeqCst) >= target {
            return None;
        }
        if self.shared.mode == Durability::Buffered {
            // Nothing waits, but nothing a sync has not covered is acknowledged after a
            // failure either: a failed fsync may have dropped it from the page cache.
            return self
                .shared
                .check()
                .err()
                .map(|e| Box::pin(std::future::ready(Err(e))) as DurableFuture);
        }
        let done = {
            let mut waiting = self.shared.waiting.lock();
            // Again under the lock: a sync may have finished, and released its waiters, since.
            if self.shared.synced.load(Ordering::SeqCst) >= target {
                return None;
            }
            // Both are set under this lock: if neither is, the syncer will answer.
            if self.shared.failed.load(Ordering::SeqCst) || self.shared.stop.load(Ordering::SeqCst)
            {
                return Some(Box::pin(std::future::ready(
                    self.shared.check().and(Err(closed())),
                )));
            }
            let (tell, done) = oneshot::channel();
            waiting.queue.entry(target).or_default().push(tell);
            waiting.wanted = true;
            self.shared.wake.notify_one();
            done
        };
        let shared = self.shared.clone();
        Some(Box::pin(async move {
            // Dropped unanswered when the syncer stops or fails.
            let answered = done.await.is_ok();
            shared.check()?;
            if answered { Ok(()) } else { Err(closed()) }
        }))
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("mode", &self.mode)
            .field("applied", &self.applied)
            .field("synced", &self.synced)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn check(&self) -> Result<(), StorageError> {
        if !self.failed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let dir = self.db_path.parent().unwrap_or(&self.db_path);
        Err(StorageError::unavailable(format!(
            "data directory {} cannot make writes durable since {}; writes are refused until the server reopens it, which it does once the directory takes a durable write again (free disk space or file descriptors)",
            dir.display(),
            self.failure
                .get()
                .map_or("a write to it failed (see the server log)", String::as_str),
        )))
    }

    /// Stops every acknowledgement for good: nothing more becomes durable, and writes
    /// waiting for a sync learn that their outcome is unknown.
    fn fail(&self, what: String) {
        tracing::error!(error = %what, "storage failed; refusing every write until the data directory is reopened");
        let _ = self.failure.set(what);
        let mut waiting = self.waiting.lock();
        self.failed.store(true, Ordering::SeqCst);
        // Dropping the senders answers every waiter with the failure.
        waiting.queue.clear();
    }

    fn run(&self) {
        let mut journal = None;
        loop {
            {
                let mut waiting = self.waiting.lock();
                match self.mode {
                    Durability::Fsync => {
                        while !waiting.wanted && !self.stop.load(Ordering::SeqCst) {
                            self.wake.wait(&mut waiting);
                        }
                    }
                    Durability::Buffered => {
                        if !self.stop.load(Ordering::SeqCst) {
                            self.wake.wait_for(&mut waiting, BUFFERED_SYNC_INTERVAL);
                        }
                    }
                }
                waiting.wanted = false;
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let target = self.applied.load(Ordering::SeqCst);
            if self.synced.load(Ordering::SeqCst) >= target {
                continue;
            }
            if let Err(e) = self.sync_journal(&mut journal) {
                self.fail(format!("an fsync of the journal failed: {e}"));
                return;
            }
            // Stored before the queue is locked: a waiter that queues after this sees it.
            self.synced.store(target, Ordering::SeqCst);
            let released = {
                let mut waiting = self.waiting.lock();
                let later = waiting.queue.split_off(&(target + 1));
                std::mem::replace(&mut waiting.queue, later)
            };
            // Answered after the lock is released: waking them needs nothing it guards.
            for tell in released.into_values().flatten() {
                let _ = tell.send(());
            }
        }
    }

    /// Fsyncs the active journal (see the module docs), moving on to a newer one when fjall
    /// has rotated, and syncing the directory entry of a journal the first time it is used.
    fn sync_journal(&self, journal: &mut Option<(u64, File)>) -> Result<(), String> {
        #[cfg(any(test, feature = "fault-injection"))]
        if self.fail_next_sync.swap(false, Ordering::SeqCst) {
            return Err("injected fsync failure".to_owned());
        }
        if journal.is_none() {
            let Some(n) = active_journal(&self.db_path).map_err(|e| e.to_string())? else {
                return self
                    .db
                    .persist(PersistMode::SyncData)
                    .map_err(|e| e.to_string());
            };
            *journal = Some((n, self.open_journal(n)?));
        }
        // Counted writes still in fjall's buffer go to the OS, into the active journal.
        self.db
            .persist(PersistMode::Buffer)
            .map_err(|e| e.to_string())?;
        // Every counted write went to a journal that existed before the count was read, so
        // looking for newer ones after reading it finds the one the last write went to. Older
        // journals are fsynced by fjall before it seals them.
        let (n, _) = journal.as_ref().expect("opened above");
        let mut newest = *n;
        while journal_path(&self.db_path, newest + 1).exists() {
            newest += 1;
        }
        if newest != *n {
            *journal = Some((newest, self.open_journal(newest)?));
        }
        let (n, file) = journal.as_ref().expect("opened above");
        file.sync_data()
            .map_err(|e| format!("{}: {e}", journal_path(&self.db_path, *n).display()))
    }

    fn open_journal(&self, n: u64) -> Result<File, String> {
        let path = journal_path(&self.db_path, n);
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        File::open(&self.db_path)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| format!("{}: {e}", self.db_path.display()))?;
        Ok(file)
    }
}

fn closed() -> StorageError {
    StorageError::unavailable(
        "storage closed (the server is shutting down) before the write was durable",
    )
}

fn journal_path(db_path: &Path, n: u64) -> PathBuf {
    db_path.join(format!("{n}.jnl"))
}

/// The number of the journal fjall appends to: the highest-numbered `<n>.jnl` in its directory.
pub(super) fn active_journal(db_path: &Path) -> std::io::Result<Option<u64>> {
    let mut best = None;
    for entry in std::fs::read_dir(db_path)? {
        let name = entry?.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        best = best.max(Some(n));
    }
    Ok(best)
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        {
            let _waiting = self.shared.waiting.lock();
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Waiters hold the shared state, so it outlives this: answer them ("closed") rather
        // than leave them waiting.
        self.shared.waiting.lock().queue.clear();
    }
}
