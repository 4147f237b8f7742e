//! The catalog: databases and their collections, by name, each with the uid that tells it
//! from an earlier one of the same name.

use std::{collections::BTreeMap, sync::Arc};

use super::error::Error;
use crate::model::{
    CollectionId, CollectionInfo, CollectionUid, DatabaseId, DatabaseUid, Throughput,
};

/// Names to collections. The engine guards it with a lock; all methods are plain lookups.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    databases: BTreeMap<DatabaseId, Database>,
    /// The highest uid handed out, of a database or a collection: both come from it.
    next_uid: u64,
}

/// A database: its uid, the throughput its collections share, and its collections.
#[derive(Debug)]
struct Database {
    uid: DatabaseUid,
    throughput: Option<Throughput>,
    collections: BTreeMap<CollectionId, Arc<CollectionInfo>>,
}

impl Catalog {
    pub(crate) fn has_database(&self, database: &DatabaseId) -> bool {
        self.databases.contains_key(database)
    }

    /// The uid of database `database`, if there is one.
    pub(crate) fn database_uid(&self, database: &DatabaseId) -> Option<DatabaseUid> {
        self.databases.get(database).map(|d| d.uid)
    }

    /// The throughput database `database` shares among its collections (`Some(None)`: none).
    pub(crate) fn database_throughput(&self, database: &DatabaseId) -> Option<Option<Throughput>> {
        self.databases.get(database).map(|d| d.throughput)
    }

    /// Sets the throughput a database shares (it must exist).
    pub(crate) fn set_database_throughput(
        &mut self,
        database: &DatabaseId,
        throughput: Option<Throughput>,
    ) {
        if let Some(database) = self.databases.get_mut(database) {
            database.throughput = throughput;
        }
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
            .map(|d| d.collections.values())
            .ok_or_else(|| Error::DatabaseNotFound {
                database: database.to_string(),
            })
    }

    /// Every collection of every database.
    pub(crate) fn all_collections(&self) -> impl Iterator<Item = &Arc<CollectionInfo>> {
        self.databases.values().flat_map(|d| d.collections.values())
    }

    pub(crate) fn collection(
        &self,
        database: &DatabaseId,
        id: &CollectionId,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let database_entry =
            self.databases
                .get(database)
                .ok_or_else(|| Error::DatabaseNotFound {
                    database: database.to_string(),
                })?;
        database_entry
            .collections
            .get(id)
            .cloned()
            .ok_or_else(|| Error::CollectionNotFound {
                database: database.to_string(),
                collection: id.to_string(),
            })
    }

    /// Adds a database (a database already there keeps its uid and collections).
    pub(crate) fn add_database(
        &mut self,
        database: DatabaseId,
        uid: DatabaseUid,
        throughput: Option<Throughput>,
    ) {
        self.next_uid = self.next_uid.max(uid.0);
        self.databases.entry(database).or_insert_with(|| Database {
            uid,
            throughput,
            collections: BTreeMap::new(),
        });
    }

    pub(crate) fn remove_database(&mut self, database: &DatabaseId) {
        self.databases.remove(database);
    }

    /// A collection uid never handed out before.
    pub(crate) fn next_uid(&mut self) -> CollectionUid {
        CollectionUid(self.next())
    }

    /// A database uid never handed out before, from the collections' counter.
    pub(crate) fn next_database_uid(&mut self) -> DatabaseUid {
        DatabaseUid(self.next())
    }

    fn next(&mut self) -> u64 {
        self.next_uid += 1;
        self.next_uid
    }

    /// The highest uid handed out so far (0: none).
    pub(crate) fn last_uid(&self) -> u64 {
        self.next_uid
    }

    /// Makes sure uids up to `last` are never handed out again.
    pub(crate) fn restore_last_uid(&mut self, last: u64) {
        self.next_uid = self.next_uid.max(last);
    }

    /// Adds or replaces a collection (its database must exist).
    pub(crate) fn put_collection(&mut self, info: Arc<CollectionInfo>) {
        if let Some(database) = self.databases.get_mut(&info.database) {
            database.collections.insert(info.id.clone(), info);
        }
    }

    pub(crate) fn remove_collection(&mut self, database: &DatabaseId, id: &CollectionId) {
        if let Some(database) = self.databases.get_mut(database) {
            database.collections.remove(id);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::{
        engine::{CollectionSettings, Engine, EngineConfig, ManualClock, PartitionKeyPath},
        model::IdKind,
        storage::{DiskOptions, DiskStorage, Durability, MemoryStorage},
    };

    fn id(kind: IdKind, s: &str) -> DatabaseId {
        DatabaseId::parse(kind, s).expect("valid")
    }

    /// An engine of one shard on a data directory in `dir`, with a manual clock.
    pub(in crate::engine) fn disk_engine(dir: &std::path::Path) -> Engine {
        let storage = DiskStorage::open(&DiskOptions {
            path: dir.to_path_buf(),
            durability: Durability::Fsync,
            shards: Some(1),
            cache_bytes: 1 << 20,
            read_cache_bytes: 1 << 20,
            open_files: None,
        })
        .expect("opens");
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        Engine::open(EngineConfig::new(1), Arc::new(storage), clock)
            .expect("loads")
            .0
    }

    /// A database keeps its uid across restarts; one deleted and created again under the same
    /// name is another database, with a uid no database or collection had before, across
    /// restarts too.
    #[test]
    fn a_recreated_database_is_another_one_across_restarts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = id(IdKind::Database, "d");
        let create_collection = |engine: &Engine| {
            engine
                .create_collection(
                    &d,
                    id(IdKind::Collection, "c"),
                    PartitionKeyPath::parse("/pk").expect("path"),
                    CollectionSettings::default(),
                    Default::default(),
                )
                .expect("collection")
                .uid
        };
        let (first, collection) = {
            let engine = disk_engine(dir.path());
            let first = engine.create_database(d.clone()).expect("created");
            (first, create_collection(&engine))
        };
        assert!(collection.0 > first.0, "one counter");
        let second = {
            let engine = disk_engine(dir.path());
            assert_eq!(engine.get_database(&d), Ok(first), "kept across a restart");
            engine.delete_database(&d).expect("deleted");
            let second = engine.create_database(d.clone()).expect("created again");
            assert!(second.0 > collection.0, "{second:?} after {collection:?}");
            second
        };
        let engine = disk_engine(dir.path());
        assert_eq!(engine.get_database(&d), Ok(second));
        assert!(create_collection(&engine).0 > second.0);
    }

    /// On memory storage nothing survives a restart, uids included: each run starts its uids
    /// at a random point, so a restarted server does not hand out its earlier run's again.
    #[test]
    fn memory_storage_runs_do_not_share_uids() {
        let d = id(IdKind::Database, "d");
        let run = || {
            let clock = Arc::new(ManualClock::new(1_700_000_000_000));
            let (engine, _) =
                Engine::open(EngineConfig::new(1), Arc::new(MemoryStorage::new()), clock)
                    .expect("opens");
            engine.create_database(d.clone()).expect("created")
        };
        assert_ne!(run(), run());
    }

    #[test]
    fn databases_and_collections_share_one_counter_and_uids_are_never_reused() {
        let mut catalog = Catalog::default();
        let d = id(IdKind::Database, "d");
        let first = catalog.next_database_uid();
        catalog.add_database(d.clone(), first, None);
        assert_eq!(catalog.database_uid(&d), Some(first));
        let collection = catalog.next_uid();
        assert!(collection.0 > first.0);
        catalog.remove_database(&d);
        assert_eq!(catalog.database_uid(&d), None);
        let again = catalog.next_database_uid();
        catalog.add_database(d.clone(), again, None);
        assert!(
            again.0 > collection.0,
            "a recreated database is another one"
        );
        assert_eq!(catalog.database_uid(&d), Some(again));
        // A database loaded with its uid moves the counter past it.
        let mut loaded = Catalog::default();
        loaded.add_database(d, DatabaseUid(40), None);
        assert_eq!(loaded.next_uid(), CollectionUid(41));
    }
}
