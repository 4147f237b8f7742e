//! The data directory: its lock and its format marker, checked before the storage engine
//! touches anything.
//!
//! Layout: `LOCK` (held with an OS file lock while a server uses the directory), `FORMAT`
//! (`mayfly-data-format <n>`), and `db/` (the fjall database).

use std::{
    fs::{self, File, OpenOptions, TryLockError},
    io::{self, Write},
    path::{Path, PathBuf},
};

use super::OpenError;

/// The data format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_FILE: &str = "FORMAT";
const FORMAT_TMP: &str = "FORMAT.tmp";
const LOCK_FILE: &str = "LOCK";
const DB_DIR: &str = "db";
const PROBE_FILE: &str = "PROBE";
/// What the probe writes and fsyncs before storage that failed is reopened: room for the
/// journal to grow again and for a memtable flush to start, not a guarantee of either.
const PROBE_BYTES: usize = 4 * 1024 * 1024;

/// A data directory held by this process; the lock is released when this is dropped (or the
/// process dies, however it dies).
#[derive(Debug)]
pub(super) struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates the directory if needed, locks it and checks its format.
    pub(super) fn open(path: &Path) -> Result<Self, OpenError> {
        let io = |action: &'static str| {
            let path = path.to_path_buf();
            move |source| OpenError::Io {
                path: path.clone(),
                action,
                source,
            }
        };
        fs::create_dir_all(path).map_err(io("create the data directory"))?;
        // Refusals come before the lock file is created: a refused directory is left as it was.
        let format_path = path.join(FORMAT_FILE);
        let new = match fs::read_to_string(&format_path) {
            Ok(text) => {
                let found = text
                    .trim()
                    .strip_prefix("mayfly-data-format ")
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or_else(|| OpenError::NotMayfly {
                        path: path.to_path_buf(),
                    })?;
                if found > FORMAT_VERSION {
                    return Err(OpenError::NewerFormat {
                        path: path.to_path_buf(),
                        found,
                    });
                }
                false
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // New only if empty (but for our own files): never adopt someone else's.
                let foreign = fs::read_dir(path)
                    .map_err(io("list"))?
                    .filter_map(Result::ok)
                    .any(|entry| {
                        ![LOCK_FILE, FORMAT_TMP, PROBE_FILE]
                            .contains(&&*entry.file_name().to_string_lossy())
                    });
                if foreign {
                    return Err(OpenError::NotMayfly {
                        path: path.to_path_buf(),
                    });
                }
                true
            }
            Err(e) => return Err(io("read the format marker in")(e)),
        };
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join(LOCK_FILE))
            .map_err(io("create the lock file in"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(OpenError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io("lock")(e)),
        }
        // Under the lock: another server may have created it meanwhile.
        if new && !format_path.exists() {
            write_format(path).map_err(io("write the format marker in"))?;
        }
        Ok(DataDir {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// Where the storage engine keeps its files.
    pub(super) fn db_path(&self) -> PathBuf {
        self.path.join(DB_DIR)
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory takes a durable write now: a file is created (a descriptor is
    /// free), filled with [`PROBE_BYTES`] (there is space), fsynced, and removed.
    pub(super) fn probe(&self) -> Result<(), String> {
        let path = self.path.join(PROBE_FILE);
        let result = File::create(&path)
            .and_then(|mut file| {
                file.write_all(&vec![0; PROBE_BYTES])?;
                file.sync_all()
            })
            .map_err(|e| {
                format!(
                    "data directory {} does not take a durable write yet: {e}",
                    self.path.display()
                )
            });
        // Removed whatever happened: a half-written probe must not hold the space it found.
        let _ = fs::remove_file(&path);
        result
    }
}

/// Writes the marker atomically (temp file, fsync, rename, fsync the directory).
fn write_format(dir: &Path) -> io::Result<()> {
    let tmp = dir.join(FORMAT_TMP);
    let mut file = File::create(&tmp)?;
    writeln!(file, "mayfly-data-format {FORMAT_VERSION}")?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(FORMAT_FILE))?;
    File::open(dir)?.sync_all()
}
