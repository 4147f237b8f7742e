//! The catalog: databases and their collections, by name.

use std::{collections::BTreeMap, sync::Arc};

use super::error::Error;
use crate::model::{CollectionId, CollectionInfo, CollectionUid, DatabaseId};

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

    /// Every collection of every database.
    pub(crate) fn all_collections(&self) -> impl Iterator<Item = &Arc<CollectionInfo>> {
        self.databases.values().flat_map(|c| c.values())
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
