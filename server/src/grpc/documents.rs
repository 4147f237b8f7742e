//! `mayfly.v1.Documents`.

use mayfly_proto::v1::{
    ChangeFeedRequest, ChangeFeedResponse, CreateDocumentRequest, DeleteDocumentRequest,
    DeleteDocumentResponse, Document, ExecuteBatchRequest, ExecuteBatchResponse,
    GetFeedRangesRequest, GetFeedRangesResponse, PatchDocumentRequest, QueryPage, QueryRequest,
    ReadDocumentRequest, ReadFeedPage, ReadFeedRequest, ReplaceDocumentRequest,
    TouchDocumentRequest, UpsertDocumentRequest, UpsertDocumentResponse, UpsertOutcome, server,
};
use tonic::{Request, Response, Status};

use std::mem;

use super::{
    DocumentsService, caller, convert, idempotency, patch,
    request_charge::{charged, charged_status},
    status::to_status,
    stream::{Grant, PageSource, PageStream},
};
use crate::{
    auth::{Action, Target},
    engine::{self, RequestCharge},
    net::ConnectionInfo,
    throughput_limit::Admitted,
};

/// Runs `op` on `engine`, the one the request took (and was authorized against), and releases
/// its answer once the writes it reflects are durable: a client is never told of (or shown) a
/// change that a crash could take back. One engine serves both steps: a position belongs to
/// the storage that made it.
/// With what it cost: a request that reached the data costs at least a lookup, answered or
/// refused (a missing document, a failed condition, a repeated idempotency key).
/// `admitted`: the collection's budget it was admitted by, charged what it cost.
async fn settle<T>(
    engine: &engine::Engine,
    admitted: Option<Admitted>,
    op: impl FnOnce(&engine::Engine) -> engine::Outcome<T>,
) -> Result<(T, RequestCharge), Status> {
    settled(engine, admitted, op(engine)).await
}

/// [`settle`] for operations that may take a while (a batch of a hundred documents, a patch
/// re-applied under contention): run off the async workers.
pub(super) async fn settle_blocking<T: Send + 'static>(
    engine: engine::Engine,
    admitted: Option<Admitted>,
    op: impl FnOnce(&engine::Engine) -> engine::Outcome<T> + Send + 'static,
) -> Result<(T, RequestCharge), Status> {
    let outcome = tokio::task::spawn_blocking({
        let engine = engine.clone();
        move || op(&engine)
    })
    .await
    .map_err(|e| Status::internal(format!("document task failed: {e}")))?;
    settled(&engine, admitted, outcome).await
}

async fn settled<T>(
    engine: &engine::Engine,
    admitted: Option<Admitted>,
    outcome: engine::Outcome<T>,
) -> Result<(T, RequestCharge), Status> {
    let charge = outcome.charge.max(RequestCharge::LOOKUP);
    if let Some(admitted) = admitted {
        admitted.charge_now(charge);
    }
    match engine.settle(outcome).await {
        Ok(value) => Ok((value, charge)),
        Err(e) => Err(charged_status(to_status(e), charge)),
    }
}

fn if_match(etag: &str) -> Option<&str> {
    (!etag.is_empty()).then_some(etag)
}

#[tonic::async_trait]
impl server::Documents for DocumentsService {
    async fn create_document(
        &self,
        request: Request<CreateDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        self.routed(
            request,
            |r| self.create_document_here(r),
            |mut c, r| async move { c.create_document(r).await },
        )
        .await
    }

    async fn upsert_document(
        &self,
        request: Request<UpsertDocumentRequest>,
    ) -> Result<Response<UpsertDocumentResponse>, Status> {
        self.routed(
            request,
            |r| self.upsert_document_here(r),
            |mut c, r| async move { c.upsert_document(r).await },
        )
        .await
    }

    async fn replace_document(
        &self,
        request: Request<ReplaceDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        self.routed(
            request,
            |r| self.replace_document_here(r),
            |mut c, r| async move { c.replace_document(r).await },
        )
        .await
    }

    async fn read_document(
        &self,
        request: Request<ReadDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        self.routed(
            request,
            |r| self.read_document_here(r),
            |mut c, r| async move { c.read_document(r).await },
        )
        .await
    }

    async fn delete_document(
        &self,
        request: Request<DeleteDocumentRequest>,
    ) -> Result<Response<DeleteDocumentResponse>, Status> {
        self.routed(
            request,
            |r| self.delete_document_here(r),
            |mut c, r| async move { c.delete_document(r).await },
        )
        .await
    }

    async fn touch_document(
        &self,
        request: Request<TouchDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        self.routed(
            request,
            |r| self.touch_document_here(r),
            |mut c, r| async move { c.touch_document(r).await },
        )
        .await
    }

    async fn patch_document(
        &self,
        request: Request<PatchDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        self.routed(
            request,
            |r| self.patch_document_here(r),
            |mut c, r| async move { c.patch_document(r).await },
        )
        .await
    }

    async fn execute_batch(
        &self,
        request: Request<ExecuteBatchRequest>,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        self.routed(
            request,
            |r| self.execute_batch_here(r),
            |mut c, r| async move { c.execute_batch(r).await },
        )
        .await
    }

    type ReadFeedStream = PageStream<ReadFeedPage>;
    type QueryStream = PageStream<QueryPage>;
    type ChangeFeedStream = PageStream<ChangeFeedResponse>;

    async fn change_feed(
        &self,
        request: Request<ChangeFeedRequest>,
    ) -> Result<Response<Self::ChangeFeedStream>, Status> {
        let share = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|c| c.share.clone());
        let (metadata, _, request) = request.into_parts();
        let events = self
            .start_change_feed(&metadata.into_headers(), share, request)
            .await?;
        Ok(Response::new(events))
    }

    async fn get_feed_ranges(
        &self,
        request: Request<GetFeedRangesRequest>,
    ) -> Result<Response<GetFeedRangesResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let ranges = self.feed_ranges(&metadata.into_headers(), request).await?;
        Ok(Response::new(ranges))
    }

    async fn query(
        &self,
        request: Request<QueryRequest>,
    ) -> Result<Response<Self::QueryStream>, Status> {
        let share = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|c| c.share.clone());
        let (metadata, _, request) = request.into_parts();
        let pages = self
            .start_query(&metadata.into_headers(), share, request)
            .await?;
        Ok(Response::new(pages))
    }

    async fn read_feed(
        &self,
        request: Request<ReadFeedRequest>,
    ) -> Result<Response<Self::ReadFeedStream>, Status> {
        let share = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|c| c.share.clone());
        let (metadata, _, request) = request.into_parts();
        // Sent on to other nodes as asked, in a cluster (see `cluster_reads`).
        let original = self.forwarder.is_some().then(|| request.clone());
        let headers = metadata.into_headers();
        let ReadFeedRequest {
            database,
            collection,
            partition_key,
            page_size,
            continuation,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let scope = convert::feed_scope(partition_key).map_err(to_status)?;
        let grant = Grant::read(
            &self.auth,
            &self.engine,
            &headers,
            &database,
            &collection,
            scope.partition(),
        )?;
        let page_size = engine::page_size(page_size).map_err(to_status)?;
        let token = (!continuation.is_empty()).then_some(continuation);
        let feed = Feed {
            path,
            scope,
            page_size,
        };
        if let Some(original) = original
            && self.reads_elsewhere(&headers, &feed.path, &feed.scope)?
        {
            let pages = self
                .feed_across_nodes(&headers, grant, share, feed, original, token)
                .await?;
            return Ok(Response::new(pages));
        }
        let pages = self.open_stream(grant, share, feed, token).await?;
        Ok(Response::new(pages))
    }
}

/// A read feed: each page read from the continuation the one before left. In a cluster, the
/// stream ends at a page that hands off to another node (see [`engine::FeedPage::handoff`]).
#[derive(Debug, Clone)]
pub(super) struct Feed {
    pub(super) path: engine::CollectionPath,
    pub(super) scope: engine::FeedScope,
    pub(super) page_size: usize,
}

/// How long a feed page may take on an async worker: it evaluates nothing and reads at most
/// its size times a small factor, so on memory storage it is rarely more than a millisecond.
/// It runs there as before this driver, sparing a blocking thread per page (and the memory
/// of many threads when many readers stall).
const FEED_INLINE_TIME: std::time::Duration = std::time::Duration::from_millis(50);

impl PageSource for Feed {
    type Message = ReadFeedPage;
    /// The continuation; `None` for the first page of a feed started without one.
    type Cursor = Option<String>;

    fn pays(&self) -> bool {
        true
    }

    fn charge(&self, page: &ReadFeedPage) -> RequestCharge {
        RequestCharge::from_units(page.request_charge)
    }

    fn inline(&self) -> engine::QueryReads {
        engine::QueryReads::inline_within(u64::MAX, FEED_INLINE_TIME)
    }

    fn page(
        &self,
        engine: &engine::Engine,
        at: &Option<String>,
        reads: engine::QueryReads,
    ) -> engine::Outcome<(ReadFeedPage, Option<Option<String>>)> {
        engine
            .read_feed_page(
                &self.path,
                &self.scope,
                self.page_size,
                at.as_deref(),
                reads,
            )
            .map(|page| {
                let next = match page.handoff {
                    true => None,
                    false => page.continuation.clone().map(Some),
                };
                (feed_message(page), next)
            })
    }
}

fn feed_message(page: engine::FeedPage) -> ReadFeedPage {
    let bytes = page.documents.iter().map(|d| d.body.len()).sum();
    let charge = RequestCharge::page(0, page.documents.len() as u64, bytes);
    ReadFeedPage {
        documents: page.documents.into_iter().map(convert::document).collect(),
        continuation: page.continuation.unwrap_or_default(),
        request_charge: charge.units(),
    }
}

/// The document calls answered on this node (see [`DocumentsService::routed`]).
impl DocumentsService {
    async fn create_document_here(
        &self,
        request: Request<CreateDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("CreateDocument", key, &request)?;
        let CreateDocumentRequest {
            database,
            collection,
            body,
            partition_key,
            ttl,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let body = convert::document_body(body, ttl).map_err(to_status)?;
        let partition_key = convert::partition_key_value(partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, partition_key.as_ref()),
            &engine,
        )?;
        let (answer, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.keyed(request_key.as_ref())
                .create_document(&path, body, partition_key)
        })
        .await?;
        let keyed = request_key.is_some();
        let response = idempotency::response(keyed, answer, convert::document);
        Ok(charged(response, charge))
    }

    async fn upsert_document_here(
        &self,
        request: Request<UpsertDocumentRequest>,
    ) -> Result<Response<UpsertDocumentResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("UpsertDocument", key, &request)?;
        let UpsertDocumentRequest {
            database,
            collection,
            body,
            partition_key,
            ttl,
            if_match: etag,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let body = convert::document_body(body, ttl).map_err(to_status)?;
        let partition_key = convert::partition_key_value(partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, partition_key.as_ref()),
            &engine,
        )?;
        let (answer, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.keyed(request_key.as_ref()).upsert_document(
                &path,
                body,
                partition_key,
                if_match(&etag),
            )
        })
        .await?;
        let keyed = request_key.is_some();
        let response = idempotency::response(keyed, answer, |(outcome, view)| {
            let outcome = match outcome {
                engine::UpsertOutcome::Created => UpsertOutcome::Created,
                engine::UpsertOutcome::Replaced => UpsertOutcome::Replaced,
            };
            UpsertDocumentResponse {
                document: Some(convert::document(view)),
                outcome: outcome as i32,
            }
        });
        Ok(charged(response, charge))
    }

    async fn replace_document_here(
        &self,
        request: Request<ReplaceDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("ReplaceDocument", key, &request)?;
        let ReplaceDocumentRequest {
            database,
            collection,
            id,
            partition_key,
            body,
            ttl,
            if_match: etag,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let key = convert::doc_key(&id, partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, Some(&key.partition_key)),
            &engine,
        )?;
        let body = convert::document_body(body, ttl).map_err(to_status)?;
        let (answer, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.keyed(request_key.as_ref())
                .replace_document(&path, key, body, if_match(&etag))
        })
        .await?;
        let keyed = request_key.is_some();
        let response = idempotency::response(keyed, answer, convert::document);
        Ok(charged(response, charge))
    }

    async fn read_document_here(
        &self,
        request: Request<ReadDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        let caller = caller(&self.auth, &request)?;
        let ReadDocumentRequest {
            database,
            collection,
            id,
            partition_key,
        } = request.into_inner();
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let key = convert::doc_key(&id, partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Read,
            Target::documents(&database, &collection, Some(&key.partition_key)),
            &engine,
        )?;
        let (view, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.read_document(&path, &key)
        })
        .await?;
        Ok(charged(Response::new(convert::document(view)), charge))
    }

    async fn delete_document_here(
        &self,
        request: Request<DeleteDocumentRequest>,
    ) -> Result<Response<DeleteDocumentResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("DeleteDocument", key, &request)?;
        let DeleteDocumentRequest {
            database,
            collection,
            id,
            partition_key,
            if_match: etag,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let key = convert::doc_key(&id, partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, Some(&key.partition_key)),
            &engine,
        )?;
        let (answer, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.keyed(request_key.as_ref())
                .delete_document(&path, &key, if_match(&etag))
        })
        .await?;
        let keyed = request_key.is_some();
        let response = idempotency::response(keyed, answer, |()| DeleteDocumentResponse {});
        Ok(charged(response, charge))
    }

    async fn touch_document_here(
        &self,
        request: Request<TouchDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("TouchDocument", key, &request)?;
        let TouchDocumentRequest {
            database,
            collection,
            id,
            partition_key,
            if_match: etag,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let key = convert::doc_key(&id, partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, Some(&key.partition_key)),
            &engine,
        )?;
        let (answer, charge) = settle(&engine, self.admit(&engine, &path)?, |e| {
            e.keyed(request_key.as_ref())
                .touch_document(&path, &key, if_match(&etag))
        })
        .await?;
        let keyed = request_key.is_some();
        let response = idempotency::response(keyed, answer, convert::document);
        Ok(charged(response, charge))
    }

    async fn patch_document_here(
        &self,
        request: Request<PatchDocumentRequest>,
    ) -> Result<Response<Document>, Status> {
        let caller = caller(&self.auth, &request)?;
        let mut request = request.into_inner();
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("PatchDocument", key, &request)?;
        let PatchDocumentRequest {
            database,
            collection,
            id,
            partition_key,
            operations,
            if_match: etag,
            condition,
            create_if_missing,
            create_parents,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let key = convert::doc_key(&id, partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        caller.allow(
            Action::Write,
            Target::documents(&database, &collection, Some(&key.partition_key)),
            &engine,
        )?;
        let ops = patch::operations(operations).map_err(to_status)?;
        let condition = patch::condition(&condition).map_err(to_status)?;
        let options = patch::options(create_if_missing, create_parents).map_err(to_status)?;
        // Off the async workers: a patch re-encodes its document (up to 2 MiB) on each of up
        // to 9 attempts under contention, the last holding its shard's lock.
        let keyed = request_key.is_some();
        let (answer, charge) =
            settle_blocking(engine.clone(), self.admit(&engine, &path)?, move |e| {
                let patch = (ops.as_slice(), condition.as_deref());
                e.keyed(request_key.as_ref()).patch_document_with(
                    &path,
                    &key,
                    patch,
                    if_match(&etag),
                    &options,
                )
            })
            .await?;
        let created = answer.value.1;
        let mut response =
            idempotency::response(keyed, answer, |(view, _)| convert::document(view));
        response
            .metadata_mut()
            .insert(patch::CREATED_HEADER, patch::created_value(created));
        Ok(charged(response, charge))
    }

    async fn execute_batch_here(
        &self,
        request: Request<ExecuteBatchRequest>,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        self.run_batch(&caller, request.into_inner()).await
    }
}
