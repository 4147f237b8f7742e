//! `mayfly.v1.Databases`.

use mayfly_proto::v1::{
    CreateDatabaseRequest, Database, DeleteDatabaseRequest, DeleteDatabaseResponse,
    GetDatabaseRequest, ListDatabasesRequest, ListDatabasesResponse, server,
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
};

/// Serves databases from the engine.
#[derive(Debug, Clone)]
pub struct DatabasesService {
    engine: CurrentEngine,
    auth: Authenticator,
    catalog: CatalogRoute,
}

impl DatabasesService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        DatabasesService {
            engine,
            auth,
            catalog: CatalogRoute::Local,
        }
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
        engine
            .get_database(&convert::database_id(&id).map_err(to_status)?)
            .map_err(to_status)?;
        Ok(super::request_charge::metadata_response(Database { id }))
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
            .map(|id| Database { id: id.to_string() })
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
}

/// A catalog answer of another kind than the change asked for: a bug, said so.
pub(super) fn unexpected(answer: CatalogAnswer) -> Status {
    Status::internal(format!("a catalog change answered {answer:?}"))
}
