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

/// The data format this build writes; it reads every format from 1 up to it.
///
/// - 1: documents placed on shards by Rust's `DefaultHasher` (`Placement::Format1`).
/// - 2: placed by xxh3-64 of the names and partition key (`Placement::Xxh3`); otherwise as 1.
pub const FORMAT_VERSION: u32 = 2;
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
    /// Its format (see [`FORMAT_VERSION`]): what it was created with, never changed after.
    format: u32,
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
        let found = match fs::read_to_string(&format_path) {
            Ok(text) => {
                let found = parse_format(&text).ok_or_else(|| OpenError::NotMayfly {
                    path: path.to_path_buf(),
                })?;
                if found > FORMAT_VERSION {
                    return Err(OpenError::NewerFormat {
                        path: path.to_path_buf(),
                        found,
                    });
                }
                Some(found)
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
                None
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
        let format = match found {
            Some(format) => format,
            None if format_path.exists() => match read_format(&format_path) {
                Some(found) if found <= FORMAT_VERSION => found,
                Some(found) => {
                    return Err(OpenError::NewerFormat {
                        path: path.to_path_buf(),
                        found,
                    });
                }
                None => {
                    return Err(OpenError::NotMayfly {
                        path: path.to_path_buf(),
                    });
                }
            },
            None => {
                write_format(path).map_err(io("write the format marker in"))?;
                FORMAT_VERSION
            }
        };
        Ok(DataDir {
            path: path.to_path_buf(),
            format,
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

    /// The format it was created with.
    pub(super) fn format(&self) -> u32 {
        self.format
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

/// The format a marker names, if it is one.
fn parse_format(text: &str) -> Option<u32> {
    text.trim()
        .strip_prefix("mayfly-data-format ")
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|&n| n >= 1)
}

fn read_format(path: &Path) -> Option<u32> {
    parse_format(&fs::read_to_string(path).ok()?)
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
