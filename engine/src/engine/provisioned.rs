//! Provisioned throughput in the catalog (README, "Request units"): which budget a
//! collection's requests draw on, and reading and replacing a database's or a collection's
//! throughput. Enforcing it is the server's (`throughput_limit`): the engine only keeps it,
//! durably, beside the rest of the catalog.

use std::{collections::HashSet, sync::Arc};

use super::{CollectionPath, Engine, Error};
use crate::model::{
    CollectionInfo, CollectionUid, DatabaseId, DatabaseUid, InvalidInput, Throughput,
};
use crate::storage::CatalogChange;

/// Whose budget a collection's requests draw on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// Its own throughput.
    Collection(CollectionUid),
    /// Its database's, shared with the database's other collections that have none of
    /// their own.
    Database(DatabaseUid),
}

/// A database's uid and the throughput it shares among its collections.
pub type SharedThroughput = (DatabaseUid, Throughput);

impl Engine {
    /// The budget the requests on `info`'s collection draw on, with its throughput: its own,
    /// else its database's shared one; `None` if neither has one (unlimited).
    pub fn budget(&self, info: &CollectionInfo) -> Option<(Budget, Throughput)> {
        if let Some(own) = info.settings.throughput() {
            return Some((Budget::Collection(info.uid), own));
        }
        let catalog = self.inner.catalog.read();
        let shared = catalog.database_throughput(&info.database)??;
        let uid = catalog.database_uid(&info.database)?;
        Some((Budget::Database(uid), shared))
    }

    /// The uids of every collection there is now.
    pub fn collection_uids(&self) -> HashSet<CollectionUid> {
        self.inner
            .catalog
            .read()
            .all_collections()
            .map(|info| info.uid)
            .collect()
    }

    /// Every collection of every database, with the throughput its database shares.
    pub fn all_collections(&self) -> Vec<(Arc<CollectionInfo>, Option<SharedThroughput>)> {
        let catalog = self.inner.catalog.read();
        catalog
            .all_collections()
            .map(|info| {
                let shared = catalog
                    .database_throughput(&info.database)
                    .flatten()
                    .zip(catalog.database_uid(&info.database))
                    .map(|(t, uid)| (uid, t));
                (info.clone(), shared)
            })
            .collect()
    }

    /// The throughput database `id` shares among its collections (`None`: none).
    pub fn database_throughput(&self, id: &DatabaseId) -> Result<Option<Throughput>, Error> {
        self.inner
            .catalog
            .read()
            .database_throughput(id)
            .ok_or_else(|| Error::DatabaseNotFound {
                database: id.to_string(),
            })
    }

    /// Replaces the throughput database `id` shares among its collections, durably; the
    /// collections drawing on it are held to the new one from their next request. A database
    /// created without one has none to replace (as in Cosmos DB, whether a database shares a
    /// throughput is decided when it is created): refused, rather than throttle at once every
    /// collection of it that was unlimited.
    pub fn replace_database_throughput(
        &self,
        id: &DatabaseId,
        throughput: Throughput,
    ) -> Result<(), Error> {
        let _ddl = self.inner.ddl.lock();
        let uid = self.get_database(id)?;
        if self.database_throughput(id)?.is_none() {
            return Err(InvalidInput::NoSharedThroughput {
                database: id.to_string(),
            }
            .into());
        }
        let lsn = self.inner.storage.put_database(id, uid, Some(throughput))?;
        self.catalog_durable(lsn)?;
        self.inner
            .catalog
            .write()
            .set_database_throughput(id, Some(throughput));
        Ok(())
    }

    /// Replaces collection `path`'s own throughput, durably. A collection drawing on its
    /// database's shared throughput has none of its own to replace: refused, as Cosmos DB
    /// refuses it; the database's is the one to replace.
    pub fn replace_collection_throughput(
        &self,
        path: &CollectionPath,
        throughput: Throughput,
    ) -> Result<Arc<CollectionInfo>, Error> {
        let _ddl = self.inner.ddl.lock();
        let current = self.get_collection(path)?;
        if current.settings.throughput().is_none()
            && self.database_throughput(&path.database)?.is_some()
        {
            return Err(InvalidInput::SharedThroughput {
                database: path.database.to_string(),
                collection: path.collection.to_string(),
            }
            .into());
        }
        let info = Arc::new(CollectionInfo {
            settings: current.settings.with_throughput(Some(throughput)),
            ..(*current).clone()
        });
        let lsn = self
            .inner
            .storage
            .write_catalog(CatalogChange::PutCollection(&info))?;
        self.catalog_durable(lsn)?;
        self.inner.catalog.write().put_collection(info.clone());
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::{CollectionSettings, PartitionKeyPath, catalog::tests::disk_engine},
        model::{CollectionId, IdKind},
    };

    fn path(database: &str, collection: &str) -> CollectionPath {
        CollectionPath {
            database: DatabaseId::parse(IdKind::Database, database).expect("valid"),
            collection: CollectionId::parse(IdKind::Collection, collection).expect("valid"),
        }
    }

    fn create(engine: &Engine, at: &CollectionPath, own: Option<Throughput>) -> CollectionUid {
        engine
            .create_collection(
                &at.database,
                at.collection.clone(),
                PartitionKeyPath::parse("/pk").expect("path"),
                CollectionSettings::default().with_throughput(own),
                Default::default(),
            )
            .expect("created")
            .uid
    }

    const SHARED: Throughput = Throughput::Manual {
        ru_per_second: 1_000,
    };
    const OWN: Throughput = Throughput::Autoscale {
        max_ru_per_second: 4_000,
    };

    /// A database's shared throughput is the budget of its collections without one of their
    /// own; replacing a shared collection's is refused and changes nothing; both kinds of
    /// replacement are durable across a restart.
    #[test]
    fn shared_and_own_throughput_are_budgets_kept_across_restarts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (shared, own, plain) = (path("d", "shared"), path("d", "own"), path("e", "plain"));
        let db = {
            let engine = disk_engine(dir.path());
            let db = engine
                .create_database_with(shared.database.clone(), Some(SHARED))
                .expect("created");
            engine
                .create_database(plain.database.clone())
                .expect("created");
            let shared_uid = create(&engine, &shared, None);
            let own_uid = create(
                &engine,
                &own,
                Some(Throughput::Manual { ru_per_second: 400 }),
            );
            let plain_uid = create(&engine, &plain, None);
            let budget =
                |p: &CollectionPath| engine.budget(&engine.get_collection(p).expect("there"));
            assert_eq!(budget(&shared), Some((Budget::Database(db), SHARED)));
            assert_ne!(Budget::Database(db), Budget::Collection(shared_uid));
            assert_eq!(
                budget(&own),
                Some((
                    Budget::Collection(own_uid),
                    Throughput::Manual { ru_per_second: 400 }
                ))
            );
            assert_eq!(budget(&plain), None, "unlimited");
            assert_eq!(
                engine.collection_uids(),
                HashSet::from([shared_uid, own_uid, plain_uid])
            );

            let refused = engine
                .replace_collection_throughput(&shared, OWN)
                .expect_err("draws on the database's");
            assert!(
                matches!(
                    &refused,
                    Error::Invalid(InvalidInput::SharedThroughput { collection, .. })
                        if collection == "shared"
                ),
                "{refused:?}"
            );
            assert_eq!(budget(&shared), Some((Budget::Database(db), SHARED)));
            engine
                .replace_collection_throughput(&own, OWN)
                .expect("its own");
            engine
                .replace_collection_throughput(&plain, OWN)
                .expect("an unlimited collection may be given one");
            let doubled = Throughput::Manual {
                ru_per_second: 2_000,
            };
            engine
                .replace_database_throughput(&shared.database, doubled)
                .expect("the database's");
            assert_eq!(budget(&shared), Some((Budget::Database(db), doubled)));
            db
        };
        let engine = disk_engine(dir.path());
        let budget = |p: &CollectionPath| engine.budget(&engine.get_collection(p).expect("there"));
        assert_eq!(
            engine.database_throughput(&shared.database),
            Ok(Some(Throughput::Manual {
                ru_per_second: 2_000
            }))
        );
        assert_eq!(engine.get_database(&shared.database), Ok(db));
        assert_eq!(engine.database_throughput(&plain.database), Ok(None));
        assert!(matches!(budget(&shared), Some((Budget::Database(uid), _)) if uid == db));
        assert!(matches!(budget(&own), Some((Budget::Collection(_), OWN))));
        assert!(matches!(budget(&plain), Some((Budget::Collection(_), OWN))));
        assert!(matches!(
            engine.replace_database_throughput(&path("gone", "c").database, SHARED),
            Err(Error::DatabaseNotFound { .. })
        ));
        assert!(
            matches!(
                engine.replace_database_throughput(&plain.database, SHARED),
                Err(Error::Invalid(InvalidInput::NoSharedThroughput { .. }))
            ),
            "a database made without shared throughput has none to replace"
        );
        assert_eq!(engine.database_throughput(&plain.database), Ok(None));
    }
}
