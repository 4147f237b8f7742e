//! Reads across a cluster's nodes (docs/cluster.md, "Cross-partition queries"). The node a
//! client calls answers the whole request:
//! - a read feed, and a streaming query (no `ORDER BY`, grouping, aggregate, `DISTINCT`), read
//!   partition after partition, as on a single node; their pages are computed where each
//!   partition is served, a page ending where one node's partitions end (a *handoff*), and this
//!   node relays them in order (see [`super::relay`]);
//! - a query that reads its whole scope gathers, from every partition's owner at once, the
//!   documents its plan selects there (`Cluster/GatherDocuments`), and runs once over them
//!   here, so `ORDER BY`, aggregates, `GROUP BY`, `DISTINCT` and `OFFSET`/`LIMIT` mean what
//!   they mean on one node; its continuation counts the results sent, as on one node;
//! - a query or feed of one partition is that partition's owner's to answer, relayed as it
//!   comes.
//!
//! Continuation tokens are sealed with the cluster's key, so any node resumes any token.

use std::future::Future;
use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures_util::StreamExt;
use mayfly_proto::v1::{
    GatherDocumentsRequest, QueryPage, QueryRequest, ReadFeedPage, ReadFeedRequest,
    client::{ClusterClient, DocumentsClient},
    server::Cluster,
};
use serde_json::Value;
use tonic::{Request, Response, Status, metadata::MetadataMap, transport::Channel};

use super::{
    DocumentsService, convert,
    documents::Feed,
    forward::{self, FORWARDED, Forwarder},
    query::{Plan, StreamingQuery, page_message, parameters_json},
    relay::relay,
    status::to_status,
    stream::{CancelOnDrop, Grant, PageStream},
};
use crate::{
    engine::{self, QueryCursor, QueryReads, QuerySpec},
    net::{Charge, PeerShare},
};

/// Where a query that reads partitions this node does not serve is answered.
#[derive(Debug, Clone, Copy)]
pub(super) enum Route {
    /// Page by page, at each partition's owner in turn.
    Relay,
    /// Here, over the documents gathered from every partition's owner.
    Gather,
}

impl DocumentsService {
    /// Whether a request, not forwarded to this node, reads partitions `scope` of `path` that
    /// other nodes serve (in a cluster); if not, this node answers it as a single node does.
    pub(super) fn reads_elsewhere(
        &self,
        headers: &http::HeaderMap,
        path: &engine::CollectionPath,
        scope: &engine::FeedScope,
    ) -> Result<bool, Status> {
        if self.forwarder.is_none() || headers.contains_key(FORWARDED) {
            return Ok(false);
        }
        let engine = self.engine()?;
        Ok(match engine.scope_shard(path, scope).map_err(to_status)? {
            Some(shard) => !engine.serves(shard),
            None => !(0..engine.shard_count()).all(|s| engine.serves(s)),
        })
    }

    /// How a query, not forwarded to this node, is answered in a cluster: `None` where this
    /// node serves every partition it reads (then it answers it as a single node does).
    pub(super) fn cluster_route(
        &self,
        headers: &http::HeaderMap,
        plan: &Plan,
        cursor: &QueryCursor,
    ) -> Result<Option<Route>, Status> {
        if !plan.spec.reads_documents()
            || !self.reads_elsewhere(headers, &plan.path, &plan.scope)?
        {
            return Ok(None);
        }
        Ok(Some(match (cursor.shard(), plan.scope.partition()) {
            (None, None) => Route::Gather,
            _ => Route::Relay,
        }))
    }

    /// Who asks other nodes on behalf of the caller of a request with `headers`.
    fn onward(
        &self,
        headers: &http::HeaderMap,
        grant: Grant,
        share: Option<PeerShare>,
    ) -> Result<Onward, Status> {
        let forwarder = self
            .forwarder
            .clone()
            .ok_or_else(|| Status::internal("a cluster route without a cluster"))?;
        Ok(Onward {
            service: self.clone(),
            forwarder,
            metadata: MetadataMap::from_headers(headers.clone()),
            grant,
            share,
        })
    }

    /// A read feed that reads partitions other nodes serve: relayed from each in turn.
    pub(super) async fn feed_across_nodes(
        &self,
        headers: &http::HeaderMap,
        grant: Grant,
        share: Option<PeerShare>,
        feed: Feed,
        request: ReadFeedRequest,
        token: Option<String>,
    ) -> Result<PageStream<ReadFeedPage>, Status> {
        let hops = FeedHops {
            on: self.onward(headers, grant, share)?,
            feed,
            request,
        };
        let page = (hops.feed.page_size, self.engine()?.page_bytes());
        relay(token, page, move |token, size| {
            let hops = hops.clone();
            async move { hops.hop(token, size).await }
        })
        .await
    }

    /// Answers a query `route` says other nodes take part in.
    #[allow(
        clippy::too_many_arguments,
        reason = "the query's parts, as start_query has them"
    )]
    pub(super) async fn fan_out(
        &self,
        route: Route,
        headers: &http::HeaderMap,
        grant: Grant,
        share: Option<PeerShare>,
        plan: Arc<Plan>,
        request: QueryRequest,
        token: Option<String>,
    ) -> Result<PageStream<QueryPage>, Status> {
        let hops = Hops {
            on: self.onward(headers, grant, share)?,
            plan,
            request,
        };
        match route {
            Route::Relay => hops.relay(token).await,
            Route::Gather => {
                let offset = match token {
                    None => 0,
                    Some(token) => match self
                        .engine()?
                        .query_cursor(
                            &hops.plan.path,
                            &hops.plan.spec,
                            &hops.plan.scope,
                            Some(&token),
                        )
                        .map_err(to_status)?
                    {
                        QueryCursor::Offset(offset) => offset,
                        _ => {
                            return Err(to_status(engine::Error::Invalid(
                                engine::InvalidInput::Continuation {
                                    reason: "it does not belong to this query",
                                },
                            )));
                        }
                    },
                };
                hops.gather(offset).await
            }
        }
    }
}

/// A request's calls to the nodes that serve its partitions: who asked, and how.
#[derive(Clone)]
struct Onward {
    service: DocumentsService,
    forwarder: Forwarder,
    /// The caller's request metadata: its credentials and deadline travel on.
    metadata: MetadataMap,
    grant: Grant,
    share: Option<PeerShare>,
}

/// One query's calls to the nodes that serve its partitions.
#[derive(Clone)]
struct Hops {
    on: Onward,
    plan: Arc<Plan>,
    request: QueryRequest,
}

/// One read feed's calls to the nodes that serve its partitions.
#[derive(Clone)]
struct FeedHops {
    on: Onward,
    feed: Feed,
    request: ReadFeedRequest,
}

impl Hops {
    /// The query's pages from `token` on, each from the node serving it.
    async fn relay(self, token: Option<String>) -> Result<PageStream<QueryPage>, Status> {
        let page = (self.plan.page_size, self.on.service.engine()?.page_bytes());
        relay(token, page, move |token, size| {
            let hops = self.clone();
            async move { hops.hop(token, size).await }
        })
        .await
    }

    /// The pages of the node serving the partition `token` starts in, up to that node's last
    /// (a handoff, or the query's end).
    async fn hop(
        &self,
        token: Option<String>,
        page_size: usize,
    ) -> Result<PageStream<QueryPage>, Status> {
        let engine = self.on.service.engine()?;
        let plan = &self.plan;
        let cursor = engine
            .query_cursor(&plan.path, &plan.spec, &plan.scope, token.as_deref())
            .map_err(to_status)?;
        let shard = match cursor.shard() {
            Some(shard) => shard,
            None => engine
                .scope_shard(&plan.path, &plan.scope)
                .map_err(to_status)?
                .ok_or_else(|| Status::internal("a relayed query reads one shard at a time"))?,
        };
        if cursor.shard().is_some() && engine.serves(shard) {
            let source = StreamingQuery {
                plan: plan.clone(),
                page_size,
            };
            return self
                .on
                .service
                .open_stream(self.on.grant.clone(), self.on.share.clone(), source, token)
                .await;
        }
        let mut request = self.request.clone();
        request.continuation = token.unwrap_or_default();
        request.page_size = page_size as u32;
        let request = self.on.forwarded(request);
        self.on
            .pages_at(shard, |mut owner| async move { owner.query(request).await })
            .await
    }

    /// Every result of the query, from `offset` on, run here over the documents each
    /// partition's owner selects.
    async fn gather(self, offset: u64) -> Result<PageStream<QueryPage>, Status> {
        let engine = self.on.service.engine()?;
        let cancel = CancelOnDrop::new(&self.on.service.stop);
        // What the gathered documents take, charged as they arrive and released once the
        // query has run over them.
        let held = Arc::new(AtomicUsize::new(0));
        let charge = Arc::new(parking_lot::Mutex::new(Charge::default()));
        let parts = (0..engine.shard_count()).map(|shard| {
            let (this, held, charge, cancel) =
                (self.clone(), held.clone(), charge.clone(), &cancel);
            async move {
                let docs = match engine_serves(&this.on.service, shard)? {
                    true => {
                        let plan = this.plan.clone();
                        this.on
                            .service
                            .run_paged(
                                (QueryReads::inline(), cancel.signal(), false),
                                None,
                                move |e, reads| {
                                    e.gather_documents(&plan.path, &plan.spec, shard, reads)
                                },
                            )
                            .await?
                    }
                    false => this.gather_there(shard).await?,
                };
                let bytes: usize = docs.iter().map(mayfly_query::value::approximate_size).sum();
                let total = held.fetch_add(bytes, Ordering::Relaxed) + bytes;
                if total > engine::MAX_GATHERED_BYTES {
                    return Err(to_status(engine::gathered_too_much()));
                }
                this.on.service.budget.grow_leaving(
                    &mut charge.lock(),
                    this.on.share.as_ref(),
                    total.saturating_mul(2),
                    0,
                )?;
                Ok::<_, Status>(docs)
            }
        });
        let gathered = futures_util::future::try_join_all(parts).await?;
        let docs: Vec<Value> = gathered.into_iter().flatten().collect();
        let spec = self.plan.clone();
        let stop = cancel.signal().clone();
        let read_at = engine.query_reading();
        let ran = tokio::task::spawn_blocking(move || {
            let reads = QueryReads::unlimited().cancelled_by(stop);
            engine.query_gathered(&spec.spec, docs, read_at, reads)
        })
        .await
        .map_err(|e| Status::internal(format!("query task failed: {e}")))?
        .map_err(to_status)?;
        drop(charge);
        self.on
            .service
            .held_results(self.on.grant, self.on.share, self.plan, ran, offset)
            .await
    }

    /// The documents the partition `shard`'s owner selects for the query.
    async fn gather_there(&self, shard: usize) -> Result<Vec<Value>, Status> {
        let address = self.on.owner(shard).await?;
        let mut client = ClusterClient::new(self.on.forwarder.channel(&address)?)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
        let request = GatherDocumentsRequest {
            query: Some(self.request.clone()),
            partitions: vec![shard as u32],
        };
        let mut pages = client
            .gather_documents(self.on.forwarded(request))
            .await
            .map_err(|status| self.on.answered(shard, status))?
            .into_inner();
        let mut docs = Vec::new();
        let mut bytes = 0;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|status| self.on.answered(shard, status))?;
            bytes += page
                .results
                .iter()
                .map(mayfly_query::value::approximate_size)
                .sum::<usize>();
            if bytes > engine::MAX_GATHERED_BYTES {
                return Err(to_status(engine::gathered_too_much()));
            }
            docs.extend(page.results);
        }
        Ok(docs)
    }
}

impl FeedHops {
    /// The pages of the node serving the partition `token` starts in, up to that node's last.
    async fn hop(
        &self,
        token: Option<String>,
        page_size: usize,
    ) -> Result<PageStream<ReadFeedPage>, Status> {
        let engine = self.on.service.engine()?;
        let feed = &self.feed;
        let shard = engine
            .feed_shard(&feed.path, &feed.scope, token.as_deref())
            .map_err(to_status)?;
        if engine.serves(shard) {
            return self
                .on
                .service
                .open_stream(
                    self.on.grant.clone(),
                    self.on.share.clone(),
                    Feed {
                        page_size,
                        ..feed.clone()
                    },
                    token,
                )
                .await;
        }
        let mut request = self.request.clone();
        request.continuation = token.unwrap_or_default();
        request.page_size = page_size as u32;
        let request = self.on.forwarded(request);
        self.on
            .pages_at(
                shard,
                |mut owner| async move { owner.read_feed(request).await },
            )
            .await
    }
}

impl Onward {
    /// The pages of the stream `open` opens at the node serving partition `shard`, its
    /// refusals as [`Onward::answered`] says.
    async fn pages_at<M, O, F>(&self, shard: usize, open: O) -> Result<PageStream<M>, Status>
    where
        M: Send + 'static,
        O: FnOnce(DocumentsClient<Channel>) -> F,
        F: Future<Output = Result<Response<tonic::Streaming<M>>, Status>>,
    {
        let address = self.owner(shard).await?;
        let owner = DocumentsClient::new(self.forwarder.channel(&address)?)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
        let pages = open(owner)
            .await
            .map_err(|status| self.answered(shard, status))?
            .into_inner();
        let on = self.clone();
        Ok(Box::pin(pages.map(move |page| {
            page.map_err(|status| on.answered(shard, status))
        })))
    }

    /// The address of the node serving partition `shard`.
    async fn owner(&self, shard: usize) -> Result<String, Status> {
        self.forwarder
            .owner_address(shard as u32)
            .await
            .ok_or_else(|| to_status(engine::Error::NotOwner { partition: shard }))
    }

    /// `message`, sent on with the caller's credentials and deadline.
    fn forwarded<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        *request.metadata_mut() =
            forward::forwarded_metadata(&self.metadata, self.forwarder.node());
        request
    }

    /// What the client is told of a node's refusal: as it is, the node's view of `shard`'s
    /// owner forgotten if it was out of date.
    fn answered(&self, shard: usize, status: Status) -> Status {
        if forward::not_owned(&status).is_some() {
            self.forwarder.stale(shard as u32);
        }
        status
    }
}

fn engine_serves(service: &DocumentsService, shard: usize) -> Result<bool, Status> {
    Ok(service.engine()?.serves(shard))
}

/// `Cluster`: what nodes ask of each other.
#[derive(Debug, Clone)]
pub struct ClusterService(DocumentsService);

impl ClusterService {
    pub fn new(documents: DocumentsService) -> Self {
        ClusterService(documents)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    type GatherDocumentsStream = PageStream<QueryPage>;

    async fn gather_documents(
        &self,
        request: Request<GatherDocumentsRequest>,
    ) -> Result<Response<Self::GatherDocumentsStream>, Status> {
        let service = &self.0;
        let share = request
            .extensions()
            .get::<crate::net::ConnectionInfo>()
            .map(|c| c.share.clone());
        let (metadata, _, request) = request.into_parts();
        let GatherDocumentsRequest { query, partitions } = request;
        let query = query.ok_or_else(|| Status::invalid_argument("query is required"))?;
        let path =
            convert::collection_path(&query.database, &query.collection).map_err(to_status)?;
        Grant::read(
            &service.auth,
            &service.engine,
            &metadata.into_headers(),
            &query.database,
            &query.collection,
            None,
        )?;
        let params = parameters_json(query.parameters).map_err(to_status)?;
        let mut spec =
            QuerySpec::parse_cached(&service.queries, &query.query, params).map_err(to_status)?;
        spec.enable_scan = query.enable_scan;
        let engine = service.engine()?;
        let mut wanted = partitions;
        wanted.sort_unstable();
        wanted.dedup();
        if let Some(&p) = wanted.iter().find(|&&p| p as usize >= engine.shard_count()) {
            return Err(Status::invalid_argument(format!(
                "partition {p} is past the cluster's {} partitions",
                engine.shard_count()
            )));
        }
        let spec = Arc::new(spec);
        let path = Arc::new(path);
        let cancel = CancelOnDrop::new(&service.stop);
        // Held until the stream has sent them: charged like a query's held results.
        let mut charge = Charge::default();
        let (mut docs, mut held) = (Vec::new(), 0);
        for shard in wanted {
            let (spec, path) = (spec.clone(), path.clone());
            let more = service
                .run_paged(
                    (QueryReads::inline(), cancel.signal(), false),
                    None,
                    move |e, reads| e.gather_documents(&path, &spec, shard as usize, reads),
                )
                .await?;
            held += more
                .iter()
                .map(mayfly_query::value::approximate_size)
                .sum::<usize>();
            if held > engine::MAX_GATHERED_BYTES {
                return Err(to_status(engine::gathered_too_much()));
            }
            service
                .budget
                .grow_leaving(&mut charge, share.as_ref(), held.saturating_mul(2), 0)?;
            docs.extend(more);
        }
        // In pages of a page's bytes, as query pages travel.
        let page_bytes = engine.page_bytes();
        let mut pages = Vec::new();
        let mut page = Vec::new();
        let mut bytes = 0;
        for doc in docs {
            bytes += mayfly_proto::json::value_field_len(1, &doc);
            page.push(doc);
            if bytes >= page_bytes {
                pages.push(std::mem::take(&mut page));
                bytes = 0;
            }
        }
        pages.push(page);
        let pages = pages.into_iter().map(move |results| {
            let _held = &charge;
            Ok(page_message(engine::QueryPage {
                results,
                continuation: None,
                metrics: engine::QueryMetrics::default(),
                handoff: false,
            }))
        });
        Ok(Response::new(Box::pin(futures_util::stream::iter(pages))))
    }
}
