//! A change to databases and collections as one value: made from a client's request, checked,
//! applied to an engine, and, in a cluster, carried by the catalog log (`mayfly_cluster::
//! CatalogLog`) to every node, which applies it in the log's order (docs/cluster.md). The
//! entry is the request's protobuf encoding after a one-byte kind: what every node decodes and
//! applies the same way.

use std::sync::Arc;

use bytes::Bytes;
use mayfly_cluster::{CatalogError, CatalogLog};
use mayfly_proto::v1::{
    Collection, CreateCollectionRequest, CreateDatabaseRequest, Database, DeleteCollectionRequest,
    DeleteDatabaseRequest, ReplaceCollectionRequest, ReplaceThroughputRequest,
    ThroughputProperties,
};
use prost::Message;
use tonic::Status;

use super::{convert, status::to_status};
use crate::{
    engine::{
        CollectionPath, CollectionSettings, DefaultTtl, Engine, Error, FeedRetention, InvalidInput,
        PartitionKeyPath, SettingsChange, Throughput,
    },
    storage::StorageError,
};

/// A catalog change a client asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogChange {
    CreateDatabase(CreateDatabaseRequest),
    DeleteDatabase(DeleteDatabaseRequest),
    CreateCollection(CreateCollectionRequest),
    ReplaceCollection(ReplaceCollectionRequest),
    DeleteCollection(DeleteCollectionRequest),
    ReplaceThroughput(ReplaceThroughputRequest),
}

/// What a catalog change answers.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogAnswer {
    Database(Database),
    Collection(Collection),
    /// What a database or collection is provisioned now (without this node's autoscale
    /// figure: the service adds it).
    Throughput(ThroughputProperties),
    Deleted,
}

/// A change checked and converted: what the engine is asked to do.
enum Planned {
    CreateDatabase(crate::engine::DatabaseId, String, Option<Throughput>),
    DeleteDatabase(crate::engine::DatabaseId),
    CreateCollection {
        database: crate::engine::DatabaseId,
        id: crate::engine::CollectionId,
        path: PartitionKeyPath,
        settings: CollectionSettings,
        paths: Arc<crate::engine::IndexPaths>,
        must_live: Arc<crate::engine::MustLive>,
    },
    ReplaceCollection(CollectionPath, SettingsChange),
    DeleteCollection(CollectionPath),
    ReplaceDatabaseThroughput(crate::engine::DatabaseId, Throughput),
    ReplaceCollectionThroughput(CollectionPath, Throughput),
}

impl CatalogChange {
    fn kind(&self) -> u8 {
        match self {
            CatalogChange::CreateDatabase(_) => 1,
            CatalogChange::DeleteDatabase(_) => 2,
            CatalogChange::CreateCollection(_) => 3,
            CatalogChange::ReplaceCollection(_) => 4,
            CatalogChange::DeleteCollection(_) => 5,
            CatalogChange::ReplaceThroughput(_) => 6,
        }
    }

    /// The catalog log's entry, made at instant `at` (Unix ms): every node applies a settings
    /// change at that instant.
    pub fn encode(&self, at: u64) -> Bytes {
        let mut out = vec![self.kind()];
        out.extend_from_slice(&at.to_be_bytes());
        match self {
            CatalogChange::CreateDatabase(r) => r.encode(&mut out),
            CatalogChange::DeleteDatabase(r) => r.encode(&mut out),
            CatalogChange::CreateCollection(r) => r.encode(&mut out),
            CatalogChange::ReplaceCollection(r) => r.encode(&mut out),
            CatalogChange::DeleteCollection(r) => r.encode(&mut out),
            CatalogChange::ReplaceThroughput(r) => r.encode(&mut out),
        }
        .expect("a Vec grows as needed");
        out.into()
    }

    /// Reads an entry back, with the instant it was made at; a refusal names what is wrong
    /// with it.
    pub fn decode(entry: &[u8]) -> Result<(Self, u64), Status> {
        let (&kind, rest) = entry
            .split_first()
            .ok_or_else(|| Status::internal("an empty catalog log entry"))?;
        let (at, body) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| Status::internal("a catalog log entry without its instant"))?;
        let at = u64::from_be_bytes(*at);
        let bad = |e: prost::DecodeError| Status::internal(format!("a catalog log entry: {e}"));
        let change = match kind {
            1 => CatalogChange::CreateDatabase(Message::decode(body).map_err(bad)?),
            2 => CatalogChange::DeleteDatabase(Message::decode(body).map_err(bad)?),
            3 => CatalogChange::CreateCollection(Message::decode(body).map_err(bad)?),
            4 => CatalogChange::ReplaceCollection(Message::decode(body).map_err(bad)?),
            5 => CatalogChange::DeleteCollection(Message::decode(body).map_err(bad)?),
            6 => CatalogChange::ReplaceThroughput(Message::decode(body).map_err(bad)?),
            _ => {
                return Err(Status::internal(format!(
                    "a catalog log entry of kind {kind}, which this version does not know"
                )));
            }
        };
        Ok((change, at))
    }

    /// Checks the request as the engine will take it, without applying it: a proposer refuses
    /// bad input before it reaches the log.
    pub fn check(&self) -> Result<(), Status> {
        self.clone().plan().map(|_| ())
    }

    fn plan(self) -> Result<Planned, Status> {
        Ok(match self {
            CatalogChange::CreateDatabase(CreateDatabaseRequest { id, throughput }) => {
                Planned::CreateDatabase(
                    convert::new_database_id(&id).map_err(to_status)?,
                    id,
                    convert::throughput(throughput).map_err(to_status)?,
                )
            }
            CatalogChange::DeleteDatabase(DeleteDatabaseRequest { id }) => {
                Planned::DeleteDatabase(convert::database_id(&id).map_err(to_status)?)
            }
            CatalogChange::CreateCollection(CreateCollectionRequest {
                database,
                id,
                partition_key_path,
                default_ttl,
                indexing_mode,
                indexing_paths,
                must_live,
                change_feed_retention,
                throughput,
            }) => {
                // Checked in the order a single node always checked them: which status a
                // request with several faults gets does not change.
                let database = convert::database_id(&database).map_err(to_status)?;
                let id = convert::new_collection_id(&id).map_err(to_status)?;
                let path = PartitionKeyPath::parse(&partition_key_path).map_err(to_status)?;
                let mode = convert::indexing_mode(indexing_mode)
                    .map_err(to_status)?
                    .unwrap_or_default();
                let retention = change_feed_retention
                    .map(FeedRetention::from_secs)
                    .transpose()
                    .map_err(to_status)?
                    .unwrap_or_default();
                let settings = CollectionSettings::new(
                    DefaultTtl::from_raw(default_ttl).map_err(to_status)?,
                    mode,
                )
                .map_err(to_status)?
                .with_change_feed_retention(retention)
                .with_throughput(convert::throughput(throughput).map_err(to_status)?);
                Planned::CreateCollection {
                    database,
                    id,
                    path,
                    settings,
                    paths: convert::index_paths(indexing_paths)
                        .map_err(to_status)?
                        .unwrap_or_default(),
                    must_live: convert::must_live(must_live)
                        .map_err(to_status)?
                        .unwrap_or_default(),
                }
            }
            CatalogChange::ReplaceCollection(ReplaceCollectionRequest {
                database,
                id,
                default_ttl,
                indexing_mode,
                indexing_paths,
                must_live,
                change_feed_retention,
            }) => Planned::ReplaceCollection(
                convert::collection_path(&database, &id).map_err(to_status)?,
                SettingsChange {
                    default_ttl: convert::default_ttl_change(default_ttl).map_err(to_status)?,
                    indexing_mode: convert::indexing_mode(indexing_mode).map_err(to_status)?,
                    index_paths: convert::index_paths(indexing_paths).map_err(to_status)?,
                    must_live: convert::must_live(must_live).map_err(to_status)?,
                    change_feed_retention: change_feed_retention
                        .map(FeedRetention::from_secs)
                        .transpose()
                        .map_err(to_status)?,
                },
            ),
            CatalogChange::DeleteCollection(DeleteCollectionRequest { database, id }) => {
                Planned::DeleteCollection(
                    convert::collection_path(&database, &id).map_err(to_status)?,
                )
            }
            CatalogChange::ReplaceThroughput(ReplaceThroughputRequest {
                database,
                collection,
                throughput,
            }) => {
                let throughput = convert::throughput(throughput)
                    .map_err(to_status)?
                    .ok_or_else(|| {
                        to_status(InvalidInput::Throughput {
                            field: "throughput",
                            value: "(absent)".into(),
                            rule: "one: manual or autoscale_max".into(),
                        })
                    })?;
                if collection.is_empty() {
                    Planned::ReplaceDatabaseThroughput(
                        convert::database_id(&database).map_err(to_status)?,
                        throughput,
                    )
                } else {
                    Planned::ReplaceCollectionThroughput(
                        convert::collection_path(&database, &collection).map_err(to_status)?,
                        throughput,
                    )
                }
            }
        })
    }

    /// Applies the change to `engine`, a settings change at instant `at` if given (the
    /// catalog log's; else now). Blocks until it is durable: call it off the async workers.
    pub fn apply(self, engine: &Engine, at: Option<u64>) -> Result<CatalogAnswer, Status> {
        Ok(match self.plan()? {
            Planned::CreateDatabase(database, id, throughput) => {
                engine
                    .create_database_with(database, throughput)
                    .map_err(to_status)?;
                CatalogAnswer::Database(Database {
                    id,
                    throughput: throughput.map(convert::throughput_proto),
                })
            }
            Planned::DeleteDatabase(database) => {
                engine.delete_database(&database).map_err(to_status)?;
                CatalogAnswer::Deleted
            }
            Planned::CreateCollection {
                database,
                id,
                path,
                settings,
                paths,
                must_live,
            } => {
                let info = engine
                    .create_collection_with(&database, id, path, settings, paths, must_live)
                    .map_err(to_status)?;
                CatalogAnswer::Collection(convert::collection(&info))
            }
            Planned::ReplaceCollection(path, change) => {
                let info = engine
                    .replace_collection_at(&path, change, at)
                    .map_err(to_status)?;
                CatalogAnswer::Collection(convert::collection(&info))
            }
            Planned::DeleteCollection(path) => {
                engine.delete_collection(&path).map_err(to_status)?;
                CatalogAnswer::Deleted
            }
            Planned::ReplaceDatabaseThroughput(database, throughput) => {
                engine
                    .replace_database_throughput(&database, throughput)
                    .map_err(to_status)?;
                CatalogAnswer::Throughput(ThroughputProperties {
                    database: database.to_string(),
                    throughput: Some(convert::throughput_proto(throughput)),
                    ..ThroughputProperties::default()
                })
            }
            Planned::ReplaceCollectionThroughput(path, throughput) => {
                engine
                    .replace_collection_throughput(&path, throughput)
                    .map_err(to_status)?;
                CatalogAnswer::Throughput(ThroughputProperties {
                    database: path.database.to_string(),
                    collection: path.collection.to_string(),
                    throughput: Some(convert::throughput_proto(throughput)),
                    ..ThroughputProperties::default()
                })
            }
        })
    }
}

/// The catalog log's answers on this node: what a change got where it was applied.
pub type CatalogLogAnswer = Result<CatalogAnswer, Status>;

/// Where catalog changes go: applied to this node's engine, or, in a cluster, proposed to the
/// catalog log that every node applies.
#[derive(Debug, Clone, Default)]
pub enum CatalogRoute {
    #[default]
    Local,
    Log(Arc<CatalogLog<CatalogLogAnswer>>),
}

impl CatalogRoute {
    /// In a cluster, waits (at most `within`) until this node has applied the catalog log to
    /// where it ends now; whether that applied anything new. Another node's collection made a
    /// moment ago may not be applied here yet: a request naming it waits for it rather than
    /// be told it does not exist.
    pub async fn caught_up(&self, within: std::time::Duration) -> bool {
        let CatalogRoute::Log(log) = self else {
            return false;
        };
        let before = log.applied();
        let Ok(Ok(end)) = tokio::time::timeout(within, log.end()).await else {
            return false;
        };
        if end <= before {
            return false;
        }
        tokio::time::timeout(within, log.applied_to(end))
            .await
            .is_ok()
    }

    /// Makes `change`, checked first, and answers as the engine did.
    pub async fn run(
        &self,
        engine: Engine,
        change: CatalogChange,
    ) -> Result<CatalogAnswer, Status> {
        change.check()?;
        match self {
            CatalogRoute::Local => {
                match tokio::task::spawn_blocking(move || change.apply(&engine, None)).await {
                    Ok(answer) => answer,
                    Err(e) => Err(Status::internal(format!("catalog task failed: {e}"))),
                }
            }
            CatalogRoute::Log(log) => {
                match log.propose(change.encode(engine.clock().now())).await {
                    Ok(answer) => answer,
                    Err(CatalogError::Unavailable(e)) => {
                        Err(to_status(Error::Storage(StorageError::unavailable(
                            format!("the cluster's catalog log did not take the change: {e}"),
                        ))))
                    }
                    Err(CatalogError::OutcomeUnknown(e)) => Err(to_status(Error::Storage(
                        StorageError::outcome_unknown(format!(
                            "{e}; it applies on every node or on none: read the catalog before trying again"
                        )),
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_with_their_instant_and_junk_is_refused() {
        let change = CatalogChange::DeleteCollection(DeleteCollectionRequest {
            database: "d".into(),
            id: "c".into(),
        });
        let entry = change.encode(1_764_000_000_123);
        assert_eq!(
            CatalogChange::decode(&entry).expect("decodes"),
            (change, 1_764_000_000_123)
        );
        let throughput = CatalogChange::ReplaceThroughput(ReplaceThroughputRequest {
            database: "d".into(),
            collection: String::new(),
            throughput: Some(convert::throughput_proto(Throughput::Manual {
                ru_per_second: 2_000,
            })),
        });
        assert_eq!(
            CatalogChange::decode(&throughput.encode(7)).expect("decodes"),
            (throughput, 7)
        );
        for junk in [
            &b""[..],
            &[3][..],
            &[3, 0, 0][..],
            &[9, 0, 0, 0, 0, 0, 0, 0, 0][..],
        ] {
            assert!(CatalogChange::decode(junk).is_err(), "{junk:?}");
        }
    }
}
