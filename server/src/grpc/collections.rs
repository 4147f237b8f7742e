//! `mayfly.v1.Collections`.

use mayfly_proto::v1::{
    Collection, CreateCollectionRequest, DeleteCollectionRequest, DeleteCollectionResponse,
    GetCollectionRequest, ListCollectionsRequest, ListCollectionsResponse,
    ReplaceCollectionRequest, server,
};
use tonic::{Request, Response, Status};

use super::{
    caller,
    catalog_change::{CatalogAnswer, CatalogChange, CatalogRoute},
    convert,
    databases::unexpected,
    status::to_status,
};
use crate::{
    auth::{Action, Authenticator, Target},
    current_engine::CurrentEngine,
};

/// Serves collections from the engine.
#[derive(Debug, Clone)]
pub struct CollectionsService {
    engine: CurrentEngine,
    auth: Authenticator,
    catalog: CatalogRoute,
}

impl CollectionsService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        CollectionsService {
            engine,
            auth,
            catalog: CatalogRoute::Local,
        }
    }

    /// The same service, its changes going `catalog`'s way (a cluster's catalog log).
    pub fn with_catalog(self, catalog: CatalogRoute) -> Self {
        CollectionsService { catalog, ..self }
    }
}

#[tonic::async_trait]
impl server::Collections for CollectionsService {
    async fn create_collection(
        &self,
        request: Request<CreateCollectionRequest>,
    ) -> Result<Response<Collection>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&request.database), &engine)?;
        match self
            .catalog
            .run(engine, CatalogChange::CreateCollection(request))
            .await?
        {
            CatalogAnswer::Collection(collection) => {
                Ok(super::request_charge::metadata_response(collection))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn get_collection(
        &self,
        request: Request<GetCollectionRequest>,
    ) -> Result<Response<Collection>, Status> {
        let caller = caller(&self.auth, &request)?;
        let GetCollectionRequest { database, id } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Read, Target::collection(&database, &id), &engine)?;
        let info = engine
            .get_collection(&convert::collection_path(&database, &id).map_err(to_status)?)
            .map_err(to_status)?;
        Ok(super::request_charge::metadata_response(
            convert::collection(&info),
        ))
    }

    async fn list_collections(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let ListCollectionsRequest { database } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Read, Target::Database(&database), &engine)?;
        let collections = engine
            .list_collections(&convert::database_id(&database).map_err(to_status)?)
            .map_err(to_status)?;
        Ok(super::request_charge::metadata_response(
            ListCollectionsResponse {
                collections: collections.iter().map(|c| convert::collection(c)).collect(),
            },
        ))
    }

    async fn replace_collection(
        &self,
        request: Request<ReplaceCollectionRequest>,
    ) -> Result<Response<Collection>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        let target = Target::collection(&request.database, &request.id);
        caller.allow(Action::Manage, target, &engine)?;
        match self
            .catalog
            .run(engine, CatalogChange::ReplaceCollection(request))
            .await?
        {
            CatalogAnswer::Collection(collection) => {
                Ok(super::request_charge::metadata_response(collection))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn delete_collection(
        &self,
        request: Request<DeleteCollectionRequest>,
    ) -> Result<Response<DeleteCollectionResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let request = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        let target = Target::collection(&request.database, &request.id);
        caller.allow(Action::Manage, target, &engine)?;
        self.catalog
            .run(engine, CatalogChange::DeleteCollection(request))
            .await?;
        Ok(super::request_charge::metadata_response(
            DeleteCollectionResponse {},
        ))
    }
}
