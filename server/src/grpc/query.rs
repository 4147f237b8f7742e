//! `Documents.Query`: a query's pages, computed off the async workers (a page reads storage
//! and evaluates up to tens of thousands of documents) and released once what they reflect is
//! durable.

use std::sync::Arc;

use mayfly_proto::{
    json,
    v1::{QueryMetrics, QueryPage, QueryRequest},
};
use prost::Message;
use serde_json::{Map, Value};
use tokio_stream::Stream;
use tonic::Status;

use super::{
    convert,
    documents::{DocumentsService, QueryStream},
};
use crate::auth::{Action, Principal, Target};
use crate::engine::{
    self, CollectionPath, Engine, FeedScope, InvalidInput, Outcome, QueryCursor, QueryReads,
    QuerySpec,
};
use crate::net::{Charge, PeerShare};

/// Most parameters a query may carry.
pub(crate) const MAX_PARAMETERS: usize = 256;

/// What a streaming query sends next.
enum Next {
    /// The first page, computed before answering, with what it holds of the response
    /// budget, and what comes after it.
    First(QueryPage, Charge, Box<Next>),
    /// The page after this continuation.
    After(String),
    Done,
}

/// Where a query that computed all its results is in sending them.
struct Results {
    rest: std::iter::Skip<std::vec::IntoIter<Value>>,
    at: u64,
    total: u64,
    metrics: engine::QueryMetrics,
    /// The results' memory, held against the response budget until the stream ends.
    _charge: Charge,
}

/// Everything a query's pages share.
struct Plan {
    path: CollectionPath,
    scope: FeedScope,
    spec: QuerySpec,
    page_size: usize,
}

impl Plan {
    /// The streaming page at `cursor`.
    fn page(
        &self,
        engine: &Engine,
        cursor: QueryCursor,
        read_at: engine::Millis,
        reads: QueryReads,
    ) -> Outcome<engine::QueryPage> {
        engine.query_stream_page(
            &self.path,
            &self.spec,
            &self.scope,
            self.page_size,
            cursor,
            read_at,
            reads,
        )
    }
}

impl DocumentsService {
    /// Checks a query request and starts its pages: the first is computed before answering, so
    /// a bad query fails the call itself.
    pub(crate) async fn start_query(
        &self,
        caller: &Principal,
        share: Option<PeerShare>,
        request: QueryRequest,
    ) -> Result<QueryStream, Status> {
        let QueryRequest {
            database,
            collection,
            query,
            parameters,
            partition_key,
            page_size,
            continuation,
            enable_scan,
        } = request;
        let path = convert::collection_path(&database, &collection)?;
        let scope = convert::feed_scope(partition_key)?;
        caller.allow(
            Action::Read,
            Target::documents(&database, &collection, scope.partition()),
        )?;
        let page_size = engine::page_size(page_size)?;
        let params = parameters_json(parameters)?;
        let mut spec = QuerySpec::parse(&query, params)?;
        spec.enable_scan = enable_scan;
        let plan = Arc::new(Plan {
            path,
            scope,
            spec,
            page_size,
        });
        let token = (!continuation.is_empty()).then_some(continuation);
        let (cursor, read_at) = {
            // Not held across the pages' awaits: a storage reopen must be able to drop it.
            let engine = self.engine()?;
            let cursor =
                engine.query_cursor(&plan.path, &plan.spec, &plan.scope, token.as_deref())?;
            // One clock reading for the whole call: every page judges expiry by it.
            (cursor, engine.query_reading())
        };
        // Pages are computed when the transport asks for the next message (see read_feed).
        let pages: QueryStream = match cursor {
            QueryCursor::Offset(offset) => {
                let p = plan.clone();
                let (results, metrics) = self
                    .run_query(move |e, reads| {
                        e.query_all(&p.path, &p.spec, &p.scope, read_at, reads)
                    })
                    .await?;
                // Held from page to page: charged like a response waiting to be read (twice
                // the JSON size, for what values take in memory), refused if that is full.
                let bytes: usize = results
                    .iter()
                    .map(mayfly_query::value::approximate_size)
                    .sum();
                let mut charge = Charge::default();
                // Room is left for the pages themselves, charged as they leave: twice a page
                // of the largest size, which its last result may pass by one document.
                let page_bytes = self.engine()?.page_bytes();
                self.budget.grow_leaving(
                    &mut charge,
                    share.as_ref(),
                    bytes.saturating_mul(2),
                    2 * (page_bytes + engine::MAX_DOCUMENT_BYTES),
                )?;
                Box::pin(
                    self.clone()
                        .result_pages(plan, results, metrics, offset, charge),
                )
            }
            cursor @ (QueryCursor::Stream { .. } | QueryCursor::Index { .. }) => {
                let p = plan.clone();
                let first = self
                    .run_query(move |e, reads| p.page(e, cursor.clone(), read_at, reads))
                    .await?;
                let next = first.continuation.clone().map_or(Next::Done, Next::After);
                let first = page_message(first);
                // Held until the transport asks for it (see read_feed): charged meanwhile.
                let mut charge = Charge::default();
                self.budget
                    .grow(&mut charge, share.as_ref(), 2 * first.encoded_len())?;
                Box::pin(self.clone().stream_pages(
                    plan,
                    Next::First(first, charge, Box::new(next)),
                    read_at,
                ))
            }
        };
        Ok(pages)
    }

    /// Pages of a streaming query, each computed once the client has taken the one before.
    fn stream_pages(
        self,
        plan: Arc<Plan>,
        first: Next,
        read_at: engine::Millis,
    ) -> impl Stream<Item = Result<QueryPage, Status>> + Send {
        futures_util::stream::unfold(first, move |next| {
            let (service, plan) = (self.clone(), plan.clone());
            async move {
                let page = match next {
                    Next::Done => return None,
                    Next::First(page, charge, then) => {
                        // Handed to the encoder now: the response's own charge covers it.
                        drop(charge);
                        return Some((Ok(page), *then));
                    }
                    Next::After(token) => {
                        service
                            .run_query(move |e, reads| {
                                match e.query_cursor(
                                    &plan.path,
                                    &plan.spec,
                                    &plan.scope,
                                    Some(&token),
                                ) {
                                    Ok(cursor) => plan.page(e, cursor, read_at, reads),
                                    Err(err) => Outcome::failed(err),
                                }
                            })
                            .await
                    }
                };
                Some(match page {
                    Ok(page) => {
                        let next = page.continuation.clone().map_or(Next::Done, Next::After);
                        (Ok(page_message(page)), next)
                    }
                    Err(status) => (Err(status), Next::Done),
                })
            }
        })
    }

    /// Pages of a query that computed all its results at once, from `offset` on.
    fn result_pages(
        self,
        plan: Arc<Plan>,
        results: Vec<Value>,
        metrics: engine::QueryMetrics,
        offset: u64,
        charge: Charge,
    ) -> impl Stream<Item = Result<QueryPage, Status>> + Send {
        let total = results.len() as u64;
        let at = offset.min(total);
        let rest = results
            .into_iter()
            .skip(usize::try_from(at).unwrap_or(usize::MAX));
        let state = Some(Results {
            rest,
            at,
            total,
            metrics,
            _charge: charge,
        });
        futures_util::stream::unfold(state, move |state| {
            let (service, plan) = (self.clone(), plan.clone());
            async move {
                let mut s = state?;
                // Pages end at the page size or the page byte limit, with one result at least.
                let mut chunk: Vec<Value> = Vec::new();
                let mut bytes = 0;
                let page_bytes = service
                    .engine()
                    .map_or(engine::MAX_PAGE_BYTES, |e| e.page_bytes());
                while chunk.len() < plan.page_size && (chunk.is_empty() || bytes < page_bytes) {
                    let Some(v) = s.rest.next() else { break };
                    bytes += mayfly_query::value::approximate_size(&v);
                    chunk.push(v);
                }
                s.at += chunk.len() as u64;
                s.metrics.results_returned = chunk.len() as u64;
                let continuation = if s.at < s.total {
                    match service.engine().and_then(|e| {
                        e.query_offset_token(&plan.path, &plan.spec, &plan.scope, s.at)
                            .map_err(Status::from)
                    }) {
                        Ok(token) => Some(token),
                        Err(status) => return Some((Err(status), None)),
                    }
                } else {
                    None
                };
                let done = continuation.is_none();
                let page = engine::QueryPage {
                    results: chunk,
                    continuation,
                    metrics: s.metrics.clone(),
                };
                // Later pages read nothing: the documents were counted on the first.
                s.metrics.documents_examined = 0;
                Some((Ok(page_message(page)), (!done).then_some(s)))
            }
        })
    }

    /// Runs `op` with the engine in service, then waits until what it reflects is durable.
    /// On storage whose reads never wait, it is tried here, on the async worker, within
    /// [`engine::INLINE_READS`] storage reads; one that needs more, and any query on storage
    /// that may wait (the disk), runs on a blocking thread without that limit.
    async fn run_query<T: Send + 'static>(
        &self,
        op: impl Fn(&Engine, QueryReads) -> Outcome<T> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.engine()?;
        if !engine.reads_may_block() {
            let inline = op(&engine, QueryReads::inline());
            if !matches!(inline.result, Err(engine::Error::ReadBudgetSpent)) {
                return Ok(engine.settle(inline).await?);
            }
        }
        let worker = engine.clone();
        let outcome = tokio::task::spawn_blocking(move || op(&worker, QueryReads::unlimited()))
            .await
            .map_err(|e| Status::internal(format!("query task failed: {e}")))?;
        Ok(engine.settle(outcome).await?)
    }
}

fn page_message(page: engine::QueryPage) -> QueryPage {
    let m = page.metrics;
    QueryPage {
        results: page.results,
        continuation: page.continuation.unwrap_or_default(),
        metrics: Some(QueryMetrics {
            documents_examined: m.documents_examined,
            index_entries_examined: m.index_entries_examined,
            results_returned: m.results_returned,
            index_used: m.index.is_some(),
            index: m.index.unwrap_or_default(),
        }),
    }
}

/// Query parameters as JSON, each named with its '@'.
fn parameters_json(
    parameters: std::collections::HashMap<String, prost_types::Value>,
) -> Result<Map<String, Value>, InvalidInput> {
    if parameters.len() > MAX_PARAMETERS {
        return Err(InvalidInput::BadJson {
            reason: format!(
                "{} query parameters given; at most {MAX_PARAMETERS} are allowed",
                parameters.len()
            ),
        });
    }
    let mut out = Map::new();
    for (name, value) in parameters {
        let bare = name.strip_prefix('@').unwrap_or("");
        if bare.is_empty() || !bare.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return Err(InvalidInput::BadJson {
                reason: format!(
                    "query parameter name '{name}' must be '@' followed by letters, digits or '_'"
                ),
            });
        }
        let value = json::from_proto_value(value).map_err(|e| InvalidInput::BadJson {
            reason: format!("query parameter {name}: {e}"),
        })?;
        out.insert(name, value);
    }
    Ok(out)
}
