//! File descriptors, shared at start between connections and the storage engine's cache of
//! open files. Every connection takes one; a default that the process's limit cannot hold
//! would fail accepts under load, so the default shrinks to fit (as Redis does with
//! `maxclients`) and an explicit `--max-connections` beyond it is kept with a warning.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors kept for everything but connections and storage files: listeners, the journal
/// and its sync descriptor, the metrics endpoint, logs, temporary files.
const OTHER: u64 = 64;
/// The storage engine's own default for its cache of open files.
const MAX_STORAGE_FILES: u64 = 900;
/// Fewer would have the storage engine reopen files on most reads.
const MIN_STORAGE_FILES: u64 = 64;

/// Raises the soft limit on open files to the hard limit, the most an unprivileged process may
/// have; returns the limit now in force (`None`: unlimited or unknown).
pub fn raise_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum || (limit.current.is_some() && limit.maximum.is_none()) {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        // Some systems refuse "unlimited" as a soft limit: the one in force then stays.
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

/// How the descriptor limit is shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorPlan {
    /// Connections served at once.
    pub max_connections: usize,
    /// Files the storage engine keeps open (`None`: its own default).
    pub storage_files: Option<usize>,
    /// Why the operator should look at the limit, if they should.
    pub warning: Option<String>,
}

/// Shares `limit` descriptors (`None`: unlimited) between connections and, with `disk`
/// storage, its open files. `requested` is `--max-connections` if given, else `default`
/// applies, reduced to what fits.
pub fn plan(
    limit: Option<u64>,
    disk: bool,
    requested: Option<usize>,
    default: usize,
) -> DescriptorPlan {
    let Some(limit) = limit else {
        return DescriptorPlan {
            max_connections: requested.unwrap_or(default),
            storage_files: None,
            warning: None,
        };
    };
    let storage_files = disk.then(|| (limit / 4).clamp(MIN_STORAGE_FILES, MAX_STORAGE_FILES));
    let fit = usize::try_from(limit.saturating_sub(storage_files.unwrap_or(0) + OTHER))
        .unwrap_or(usize::MAX);
    let storage_files = storage_files.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let (max_connections, warning) = match requested {
        Some(n) if n > fit => (
            n,
            Some(format!(
                "--max-connections {n} is more than the open-file limit ({limit}) leaves for \
                 connections ({fit}): past that, accepts fail and wait for descriptors; raise \
                 the limit (ulimit -n, LimitNOFILE=) above {}",
                n as u64 + storage_files.unwrap_or(0) as u64 + OTHER
            )),
        ),
        Some(n) => (n, None),
        None if default > fit => (
            fit.max(1),
            Some(format!(
                "serving at most {} connections instead of {default}: the open-file limit \
                 ({limit}) leaves no more once storage has its share; raise the limit (ulimit \
                 -n, LimitNOFILE=) above {} for the default",
                fit.max(1),
                default as u64 + storage_files.unwrap_or(0) as u64 + OTHER
            )),
        ),
        None => (default, None),
    };
    DescriptorPlan {
        max_connections,
        storage_files,
        warning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generous_limit_serves_the_default() {
        let plan = plan(Some(1 << 20), true, None, 4096);
        assert_eq!(plan.max_connections, 4096);
        assert_eq!(plan.storage_files, Some(900));
        assert_eq!(plan.warning, None);
    }

    #[test]
    fn the_common_soft_limit_shrinks_the_default_and_says_so() {
        let plan = plan(Some(1024), true, None, 4096);
        assert_eq!(plan.storage_files, Some(256));
        assert_eq!(plan.max_connections, 1024 - 256 - 64);
        let warning = plan.warning.expect("a warning");
        assert!(warning.contains("704 connections"), "{warning}");
        // Memory storage keeps no files open.
        let memory = super::plan(Some(1024), false, None, 4096);
        assert_eq!(memory.max_connections, 960);
        assert_eq!(memory.storage_files, None);
    }

    #[test]
    fn an_explicit_limit_is_kept_with_a_warning_when_it_does_not_fit() {
        let plan = plan(Some(1024), true, Some(2000), 4096);
        assert_eq!(plan.max_connections, 2000);
        assert!(plan.warning.expect("a warning").contains("above 2320"));
        let fits = super::plan(Some(1024), true, Some(100), 4096);
        assert_eq!((fits.max_connections, fits.warning), (100, None));
    }

    #[test]
    fn a_tiny_limit_still_serves_one_connection() {
        let plan = plan(Some(48), false, None, 4096);
        assert_eq!(plan.max_connections, 1);
        assert!(plan.warning.is_some());
        assert_eq!(
            super::plan(None, true, None, 4096),
            DescriptorPlan {
                max_connections: 4096,
                storage_files: None,
                warning: None
            }
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_limit_is_raised_to_the_hard_limit() {
        let raised = raise_limit();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(raised, now.current);
        assert_eq!(now.current, now.maximum);
    }
}
