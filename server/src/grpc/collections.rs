//! `mayfly.v1.Collections`.

use mayfly_proto::v1::{
    Collection, CreateCollectionRequest, DeleteCollectionRequest, DeleteCollectionResponse,
    GetCollectionRequest, ListCollectionsRequest, ListCollectionsResponse,
    ReplaceCollectionRequest, server,
};
use tonic::{Request, Response, Status};

use super::{blocking, caller, convert, status::to_status};
use crate::{
    auth::{Action, Authenticator, Target},
    current_engine::CurrentEngine,
    engine::{CollectionSettings, DefaultTtl, FeedRetention, PartitionKeyPath, SettingsChange},
};

/// Serves collections from the engine.
#[derive(Debug, Clone)]
pub struct CollectionsService {
    engine: CurrentEngine,
    auth: Authenticator,
}

impl CollectionsService {
    /// A service over whichever engine `engine` holds, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        CollectionsService { engine, auth }
    }
}

#[tonic::async_trait]
impl server::Collections for CollectionsService {
    async fn create_collection(
        &self,
        request: Request<CreateCollectionRequest>,
    ) -> Result<Response<Collection>, Status> {
        let caller = caller(&self.auth, &request)?;
        let CreateCollectionRequest {
            database,
            id,
            partition_key_path,
            default_ttl,
            indexing_mode,
            indexing_paths,
            must_live,
            change_feed_retention,
        } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::Database(&database), &engine)?;
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
        let settings =
            CollectionSettings::new(DefaultTtl::from_raw(default_ttl).map_err(to_status)?, mode)
                .map_err(to_status)?
                .with_change_feed_retention(retention);
        let paths = convert::index_paths(indexing_paths)
            .map_err(to_status)?
            .unwrap_or_default();
        let must_live = convert::must_live(must_live)
            .map_err(to_status)?
            .unwrap_or_default();
        let info = blocking(move || {
            engine.create_collection_with(&database, id, path, settings, paths, must_live)
        })
        .await?;
        Ok(Response::new(convert::collection(&info)))
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
        Ok(Response::new(convert::collection(&info)))
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
        Ok(Response::new(ListCollectionsResponse {
            collections: collections.iter().map(|c| convert::collection(c)).collect(),
        }))
    }

    async fn replace_collection(
        &self,
        request: Request<ReplaceCollectionRequest>,
    ) -> Result<Response<Collection>, Status> {
        let caller = caller(&self.auth, &request)?;
        let ReplaceCollectionRequest {
            database,
            id,
            default_ttl,
            indexing_mode,
            indexing_paths,
            must_live,
            change_feed_retention,
        } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::collection(&database, &id), &engine)?;
        let path = convert::collection_path(&database, &id).map_err(to_status)?;
        let change = SettingsChange {
            default_ttl: convert::default_ttl_change(default_ttl).map_err(to_status)?,
            indexing_mode: convert::indexing_mode(indexing_mode).map_err(to_status)?,
            index_paths: convert::index_paths(indexing_paths).map_err(to_status)?,
            must_live: convert::must_live(must_live).map_err(to_status)?,
            change_feed_retention: change_feed_retention
                .map(FeedRetention::from_secs)
                .transpose()
                .map_err(to_status)?,
        };
        let info = blocking(move || engine.replace_collection(&path, change)).await?;
        Ok(Response::new(convert::collection(&info)))
    }

    async fn delete_collection(
        &self,
        request: Request<DeleteCollectionRequest>,
    ) -> Result<Response<DeleteCollectionResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let DeleteCollectionRequest { database, id } = request.into_inner();
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Manage, Target::collection(&database, &id), &engine)?;
        let path = convert::collection_path(&database, &id).map_err(to_status)?;
        blocking(move || engine.delete_collection(&path)).await?;
        Ok(Response::new(DeleteCollectionResponse {}))
    }
}
