//! `mayfly.v1.Databases`.

use mayfly_proto::v1::{
    CreateDatabaseRequest, Database, DeleteDatabaseRequest, DeleteDatabaseResponse,
    GetDatabaseRequest, ListDatabasesRequest, ListDatabasesResponse, server,
};
use tonic::{Request, Response, Status};

use super::{blocking, caller, convert, status::to_status};
use crate::{
    auth::{Action, Authenticator, Target},
    current_engine::CurrentEngine,
};

/// Serves databases from the engine.
#[derive(Debug, Clone)]
pub struct DatabasesService {
    engine: CurrentEngine,
    auth: Authenticator,
}

impl DatabasesService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        DatabasesService { engine, auth }
    }
}

#[tonic::async_trait]
impl server::Databases for DatabasesService {
    async fn create_database(
        &self,
        request: Request<CreateDatabaseRequest>,
    ) -> Result<Response<Database>, Status> {
        let caller = caller(&self.auth, &request)?;
        let CreateDatabaseRequest { id } = request.into_inner();
        let database = convert::new_database_id(&id).map_err(to_status)?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&id), &engine)?;
        blocking(move || engine.create_database(database)).await?;
        Ok(Response::new(Database { id }))
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
        Ok(Response::new(Database { id }))
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
        Ok(Response::new(ListDatabasesResponse { databases }))
    }

    async fn delete_database(
        &self,
        request: Request<DeleteDatabaseRequest>,
    ) -> Result<Response<DeleteDatabaseResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let DeleteDatabaseRequest { id } = request.into_inner();
        let database = convert::database_id(&id).map_err(to_status)?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&id), &engine)?;
        blocking(move || engine.delete_database(&database)).await?;
        Ok(Response::new(DeleteDatabaseResponse {}))
    }
}
