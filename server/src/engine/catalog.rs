//! Databases and collections: names, partition key paths and settings.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    error::{Error, InvalidInput},
    ids::{CollectionId, DatabaseId},
    partition_key::PartitionKeyPath,
    ttl::{DefaultTtl, ExpiredThrough, Rules},
};

/// Internal, never reused number of a collection. Documents are keyed by it, so a collection
/// deleted and created again under the same id never sees the old documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollectionUid(pub u64);

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

/// A collection's settings, valid together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CollectionSettings {
    default_ttl: DefaultTtl,
    indexing_mode: IndexingMode,
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
        })
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
}

impl CollectionInfo {
    /// The expiry rules its documents are judged by.
    pub fn rules(&self) -> Rules {
        Rules {
            default_ttl: self.settings.default_ttl(),
            expired: self.expired,
        }
    }
}

/// What `replace_collection` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettingsChange {
    /// The new default TTL; always explicit, since Off is what Cosmos DB does with an omitted one.
    pub default_ttl: DefaultTtl,
    /// The new indexing mode; `None` keeps the current one.
    pub indexing_mode: Option<IndexingMode>,
}

/// Names to collections. The engine guards it with a lock; all methods are plain lookups.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    databases: BTreeMap<DatabaseId, BTreeMap<CollectionId, Arc<CollectionInfo>>>,
    next_uid: u64,
}

impl Catalog {
    pub(crate) fn has_database(&self, database: &DatabaseId) -> bool {
        self.databases.contains_key(database)
    }

    pub(crate) fn databases(&self) -> impl Iterator<Item = &DatabaseId> {
        self.databases.keys()
    }

    pub(crate) fn collections(
        &self,
        database: &DatabaseId,
    ) -> Result<impl Iterator<Item = &Arc<CollectionInfo>>, Error> {
        self.databases
            .get(database)
            .map(|c| c.values())
            .ok_or_else(|| Error::DatabaseNotFound {
                database: database.to_string(),
            })
    }

    pub(crate) fn collection(
        &self,
        database: &DatabaseId,
        id: &CollectionId,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let collections = self
            .databases
            .get(database)
            .ok_or_else(|| Error::DatabaseNotFound {
                database: database.to_string(),
            })?;
        collections
            .get(id)
            .cloned()
            .ok_or_else(|| Error::CollectionNotFound {
                database: database.to_string(),
                collection: id.to_string(),
            })
    }

    pub(crate) fn add_database(&mut self, database: DatabaseId) {
        self.databases.entry(database).or_default();
    }

    pub(crate) fn remove_database(&mut self, database: &DatabaseId) {
        self.databases.remove(database);
    }

    pub(crate) fn next_uid(&mut self) -> CollectionUid {
        self.next_uid += 1;
        CollectionUid(self.next_uid)
    }

    /// Adds or replaces a collection (its database must exist).
    /// Makes sure uids up to `last` are never handed out again.
    pub(crate) fn restore_last_uid(&mut self, last: u64) {
        self.next_uid = self.next_uid.max(last);
    }

    pub(crate) fn put_collection(&mut self, info: Arc<CollectionInfo>) {
        if let Some(collections) = self.databases.get_mut(&info.database) {
            collections.insert(info.id.clone(), info);
        }
    }

    pub(crate) fn remove_collection(&mut self, database: &DatabaseId, id: &CollectionId) {
        if let Some(collections) = self.databases.get_mut(database) {
            collections.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ttl::TtlSeconds;

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
