//! Collections as the catalog records them: numbers, settings, expiry rules.

use std::sync::Arc;

use super::{
    ids::{CollectionId, DatabaseId},
    index_paths::IndexPaths,
    invalid::InvalidInput,
    must_live::MustLive,
    partition_key::PartitionKeyPath,
    throughput::Throughput,
    ttl::{DefaultTtl, ExpiredThrough, Rules},
};

/// Internal, never reused number of a collection. Documents are keyed by it, so a collection
/// deleted and created again under the same id never sees the old documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollectionUid(pub u64);

/// Internal, never reused number of a database, from the counter collections' uids come
/// from: a database deleted and created again under the same id is another database, and
/// what was granted on the first (a resource token) grants nothing on the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DatabaseUid(pub u64);

/// How a collection indexes its documents (SPEC §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IndexingMode {
    /// Index updated with each write.
    #[default]
    Consistent,
    /// Index updated in the background.
    Lazy,
    /// No index.
    None,
}

/// How long a collection's change feed keeps its events; zero: the collection has no feed,
/// and its changes are not logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FeedRetention(u32);

impl FeedRetention {
    /// A day, the default: long enough for a consumer to be down overnight.
    pub const DEFAULT: FeedRetention = FeedRetention(86_400);
    /// Thirty days, the longest kept.
    pub const MAX_SECS: u32 = 30 * 86_400;
    /// No feed.
    pub const OFF: FeedRetention = FeedRetention(0);

    /// Validates a retention in seconds: 0 (off) to [`FeedRetention::MAX_SECS`].
    pub fn from_secs(secs: i64) -> Result<Self, InvalidInput> {
        u32::try_from(secs)
            .ok()
            .filter(|&s| s <= Self::MAX_SECS)
            .map(FeedRetention)
            .ok_or(InvalidInput::FeedRetention { raw: secs })
    }

    /// In seconds.
    pub fn secs(self) -> u32 {
        self.0
    }

    /// In milliseconds.
    pub fn millis(self) -> u64 {
        u64::from(self.0) * 1_000
    }

    /// Whether the collection has a feed.
    pub fn is_on(self) -> bool {
        self.0 > 0
    }
}

impl Default for FeedRetention {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A collection's settings, valid together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CollectionSettings {
    default_ttl: DefaultTtl,
    indexing_mode: IndexingMode,
    change_feed_retention: FeedRetention,
    /// When the change feed was last turned on (0: with the collection).
    change_feed_since: u64,
    /// What it may spend per second (`None`: unlimited, or its database's if shared).
    throughput: Option<Throughput>,
}

impl CollectionSettings {
    /// Checks the one cross-field rule: TTL (even -1) needs an index.
    pub fn new(default_ttl: DefaultTtl, indexing_mode: IndexingMode) -> Result<Self, InvalidInput> {
        if default_ttl.is_on() && indexing_mode == IndexingMode::None {
            return Err(InvalidInput::TtlWithoutIndex);
        }
        Ok(CollectionSettings {
            default_ttl,
            indexing_mode,
            change_feed_retention: FeedRetention::DEFAULT,
            change_feed_since: 0,
            throughput: None,
        })
    }

    /// The same settings with another change feed retention.
    pub fn with_change_feed_retention(self, retention: FeedRetention) -> Self {
        CollectionSettings {
            change_feed_retention: retention,
            ..self
        }
    }

    /// How long the change feed keeps events.
    pub fn change_feed_retention(&self) -> FeedRetention {
        self.change_feed_retention
    }

    /// The same settings, the change feed last turned on at `at` (Unix ms; 0: with the
    /// collection). Changes made while it was off are in no feed: a continuation from before
    /// is refused.
    pub fn with_change_feed_since(self, at: u64) -> Self {
        CollectionSettings {
            change_feed_since: at,
            ..self
        }
    }

    /// The same settings with another provisioned throughput (`None`: unlimited).
    pub fn with_throughput(self, throughput: Option<Throughput>) -> Self {
        CollectionSettings { throughput, ..self }
    }

    /// What the collection may spend per second, if provisioned.
    pub fn throughput(&self) -> Option<Throughput> {
        self.throughput
    }

    /// When the change feed was last turned on (0: with the collection).
    pub fn change_feed_since(&self) -> u64 {
        self.change_feed_since
    }

    /// The default TTL.
    pub fn default_ttl(&self) -> DefaultTtl {
        self.default_ttl
    }

    /// The indexing mode.
    pub fn indexing_mode(&self) -> IndexingMode {
        self.indexing_mode
    }
}

/// A collection as the catalog describes it. Immutable: a settings change publishes a new one.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectionInfo {
    /// Database it belongs to.
    pub database: DatabaseId,
    /// Its id in the database.
    pub id: CollectionId,
    /// Internal number documents are keyed by.
    pub uid: CollectionUid,
    /// Where documents carry their partition key.
    pub partition_key_path: PartitionKeyPath,
    /// Its settings.
    pub settings: CollectionSettings,
    /// What earlier default TTLs made final; recorded with every settings change.
    pub expired: ExpiredThrough,
    /// Which paths the index covers (its mode is in `settings`).
    pub index_paths: Arc<IndexPaths>,
    /// Whether the stored index covers every document under `index_paths`. A policy change
    /// that adds paths (or turns indexing on) clears it: queries then read documents instead
    /// of the index until a rebuild sets it again.
    pub index_complete: bool,
    /// Kinds of documents that must say `"ttl": -1` (none by default).
    pub must_live: Arc<MustLive>,
}

impl CollectionInfo {
    /// The expiry rules its documents are judged by.
    pub fn rules(&self) -> Rules {
        Rules {
            default_ttl: self.settings.default_ttl(),
            expired: self.expired,
        }
    }

    /// The paths documents are indexed under; `None` when the collection does not index.
    pub fn indexed_paths(&self) -> Option<&IndexPaths> {
        (self.settings.indexing_mode() != IndexingMode::None).then_some(&*self.index_paths)
    }

    /// [`CollectionInfo::indexed_paths`], shared.
    pub fn indexed_paths_arc(&self) -> Option<Arc<IndexPaths>> {
        (self.settings.indexing_mode() != IndexingMode::None).then(|| self.index_paths.clone())
    }

    /// Whether queries may answer from the index: when it is complete, or in `lazy` mode,
    /// whose queries may miss what the background indexer has not reached yet.
    pub fn index_usable(&self) -> bool {
        self.indexed_paths().is_some()
            && (self.index_complete || self.settings.indexing_mode() == IndexingMode::Lazy)
    }
}

/// What `replace_collection` changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsChange {
    /// The new default TTL; always explicit, since Off is what Cosmos DB does with an omitted one.
    pub default_ttl: DefaultTtl,
    /// The new indexing mode; `None` keeps the current one.
    pub indexing_mode: Option<IndexingMode>,
    /// The new indexed paths; `None` keeps the current ones.
    pub index_paths: Option<Arc<IndexPaths>>,
    /// The new must-live rules; `None` keeps the current ones.
    pub must_live: Option<Arc<MustLive>>,
    /// The new change feed retention; `None` keeps the current one.
    pub change_feed_retention: Option<FeedRetention>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TtlSeconds;

    #[test]
    fn ttl_needs_an_index_in_both_directions() {
        let n = DefaultTtl::After(TtlSeconds::new(10).expect("in range"));
        for ttl in [DefaultTtl::NoDefault, n] {
            let err = CollectionSettings::new(ttl, IndexingMode::None).expect_err("rejected");
            assert_eq!(
                err.to_string(),
                "Indexing mode value cannot be 'none' when 'defaultTtl' is specified in the collection"
            );
        }
        assert!(CollectionSettings::new(DefaultTtl::Off, IndexingMode::None).is_ok());
        assert!(CollectionSettings::new(n, IndexingMode::Lazy).is_ok());
    }
}
