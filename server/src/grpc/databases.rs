//! `mayfly.v1.Databases`.

use std::sync::Arc;

use mayfly_proto::v1::{
    CreateDatabaseRequest, Database, DeleteDatabaseRequest, DeleteDatabaseResponse,
    GetDatabaseRequest, ListDatabasesRequest, ListDatabasesResponse, ReadThroughputRequest,
    ReplaceThroughputRequest, ThroughputProperties, server,
};
use tonic::{Request, Response, Status};

use super::{
    caller,
    catalog_change::{CatalogAnswer, CatalogChange, CatalogRoute},
    convert,
    status::to_status,
};
use crate::{
    auth::{Action, Authenticator, Target},
    current_engine::CurrentEngine,
    engine::{Budget, Engine},
    throughput_limit::Provisioned,
};

/// Serves databases, and the throughput of databases and collections, from the engine.
#[derive(Debug, Clone)]
pub struct DatabasesService {
    engine: CurrentEngine,
    auth: Authenticator,
    catalog: CatalogRoute,
    /// The budgets enforced: what autoscale provisions now is read from them.
    provisioned: Arc<Provisioned>,
}

impl DatabasesService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        DatabasesService {
            engine,
            auth,
            catalog: CatalogRoute::Local,
            provisioned: Arc::default(),
        }
    }

    /// The same service, reading what is provisioned now from `provisioned` (the budgets the
    /// documents service enforces).
    pub(crate) fn with_provisioned(self, provisioned: Arc<Provisioned>) -> Self {
        DatabasesService {
            provisioned,
            ..self
        }
    }

    /// A database's or a collection's throughput, with what its budget provisions now.
    fn throughput_of(
        &self,
        engine: &Engine,
        database: String,
        collection: String,
    ) -> Result<ThroughputProperties, Status> {
        let now = |budget, throughput| f64::from(self.provisioned.provisioned(budget, throughput));
        if collection.is_empty() {
            let id = convert::database_id(&database).map_err(to_status)?;
            let shared = engine.database_throughput(&id).map_err(to_status)?;
            let uid = engine.get_database(&id).map_err(to_status)?;
            return Ok(ThroughputProperties {
                database,
                collection,
                throughput: shared.map(convert::throughput_proto),
                shared: false,
                provisioned: shared.map(|t| now(Budget::Database(uid), t)),
            });
        }
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let info = engine.get_collection(&path).map_err(to_status)?;
        let own = info.settings.throughput();
        Ok(ThroughputProperties {
            throughput: own.map(convert::throughput_proto),
            shared: own.is_none()
                && engine
                    .database_throughput(&path.database)
                    .map_err(to_status)?
                    .is_some(),
            provisioned: own.map(|t| now(Budget::Collection(info.uid), t)),
            database,
            collection,
        })
    }

    /// The same service, its changes going `catalog`'s way (a cluster's catalog log).
    pub fn with_catalog(self, catalog: CatalogRoute) -> Self {
        DatabasesService { catalog, ..self }
    }
}

#[tonic::async_trait]
impl server::Databases for DatabasesService {
    async fn create_database(
        &self,
        request: Request<CreateDatabaseRequest>,
    ) -> Result<Response<Database>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        convert::new_database_id(&request.id).map_err(to_status)?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&request.id), &engine)?;
        match self
            .catalog
            .run(engine, CatalogChange::CreateDatabase(request))
            .await?
        {
            CatalogAnswer::Database(database) => {
                Ok(super::request_charge::metadata_response(database))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn get_database(
        &self,
        request: Request<GetDatabaseRequest>,
    ) -> Result<Response<Database>, Status> {
        let caller = caller(&self.auth, &request)?;
        let GetDatabaseRequest { id } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Read, Target::Database(&id), &engine)?;
        let throughput = engine
            .database_throughput(&convert::database_id(&id).map_err(to_status)?)
            .map_err(to_status)?;
        Ok(super::request_charge::metadata_response(Database {
            id,
            throughput: throughput.map(convert::throughput_proto),
        }))
    }

    async fn list_databases(
        &self,
        request: Request<ListDatabasesRequest>,
    ) -> Result<Response<ListDatabasesResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let ListDatabasesRequest {} = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Read, Target::Account, &engine)?;
        let databases = engine
            .list_databases()
            .into_iter()
            .map(|id| Database {
                throughput: engine
                    .database_throughput(&id)
                    .ok()
                    .flatten()
                    .map(convert::throughput_proto),
                id: id.to_string(),
            })
            .collect();
        Ok(super::request_charge::metadata_response(
            ListDatabasesResponse { databases },
        ))
    }

    async fn delete_database(
        &self,
        request: Request<DeleteDatabaseRequest>,
    ) -> Result<Response<DeleteDatabaseResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        convert::database_id(&request.id).map_err(to_status)?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&request.id), &engine)?;
        self.catalog
            .run(engine, CatalogChange::DeleteDatabase(request))
            .await?;
        Ok(super::request_charge::metadata_response(
            DeleteDatabaseResponse {},
        ))
    }

    async fn read_throughput(
        &self,
        request: Request<ReadThroughputRequest>,
    ) -> Result<Response<ThroughputProperties>, Status> {
        let caller = caller(&self.auth, &request)?;
        let ReadThroughputRequest {
            database,
            collection,
        } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        let target = if collection.is_empty() {
            Target::Database(&database)
        } else {
            Target::collection(&database, &collection)
        };
        caller.allow(Action::Read, target, &engine)?;
        let properties = self.throughput_of(&engine, database, collection)?;
        Ok(super::request_charge::metadata_response(properties))
    }

    async fn replace_throughput(
        &self,
        request: Request<ReplaceThroughputRequest>,
    ) -> Result<Response<ThroughputProperties>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        let target = if request.collection.is_empty() {
            Target::Database(&request.database)
        } else {
            Target::collection(&request.database, &request.collection)
        };
        caller.allow(Action::Manage, target, &engine)?;
        let (database, collection) = (request.database.clone(), request.collection.clone());
        match self
            .catalog
            .run(engine.clone(), CatalogChange::ReplaceThroughput(request))
            .await?
        {
            CatalogAnswer::Throughput(_) => {
                let properties = self.throughput_of(&engine, database, collection)?;
                Ok(super::request_charge::metadata_response(properties))
            }
            other => Err(unexpected(other)),
        }
    }
}

/// A catalog answer of another kind than the change asked for: a bug, said so.
pub(super) fn unexpected(answer: CatalogAnswer) -> Status {
    Status::internal(format!("a catalog change answered {answer:?}"))
}
