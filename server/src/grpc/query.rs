//! `Documents.Query`: a query's pages, driven by the one stream driver (see [`super::stream`]).
//! A streaming query computes each page from its continuation; any other query computes all
//! its results first and the stream pages through them.

use std::sync::Arc;

use mayfly_proto::{
    json,
    v1::{QueryMetrics, QueryPage, QueryRequest},
};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use tonic::Status;

use super::{
    DocumentsService, convert,
    status::to_status,
    stream::{CancelOnDrop, Grant, PageSource, PageStream},
};
use crate::engine::{
    self, CollectionPath, Engine, FeedScope, InvalidInput, Outcome, QueryCursor, QueryReads,
    QuerySpec,
};
use crate::net::{Charge, PeerShare};

/// Most parameters a query may carry.
pub(crate) const MAX_PARAMETERS: usize = 256;

/// Everything a query's pages share.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) path: CollectionPath,
    pub(super) scope: FeedScope,
    pub(super) spec: QuerySpec,
    pub(super) page_size: usize,
}

/// A streaming query: each page is computed from the continuation the one before left, at
/// its own clock reading. In a cluster, the stream ends at a page that hands off to another
/// node (see [`engine::QueryPage::handoff`]): its continuation goes on there.
pub(super) struct StreamingQuery {
    pub(super) plan: Arc<Plan>,
    /// Results per page: the plan's, or fewer to fill a page another node began.
    pub(super) page_size: usize,
}

impl PageSource for StreamingQuery {
    type Message = QueryPage;
    /// The continuation; `None` for the first page of a query started without one.
    type Cursor = Option<String>;

    fn pays(&self) -> bool {
        true
    }

    fn charge(&self, page: &QueryPage) -> engine::RequestCharge {
        engine::RequestCharge::from_units(page.request_charge)
    }

    fn page(
        &self,
        engine: &Engine,
        at: &Self::Cursor,
        reads: QueryReads,
    ) -> Outcome<(QueryPage, Option<Self::Cursor>)> {
        let plan = &self.plan;
        let cursor = match engine.query_cursor(&plan.path, &plan.spec, &plan.scope, at.as_deref()) {
            Ok(cursor) => cursor,
            Err(e) => return Outcome::failed(e),
        };
        engine
            .query_stream_page(
                &plan.path,
                &plan.spec,
                &plan.scope,
                self.page_size,
                cursor,
                engine.query_reading(),
                reads,
            )
            .map(|page| {
                let next = match page.handoff {
                    true => None,
                    false => page.continuation.clone().map(Some),
                };
                (page_message(page), next)
            })
    }
}

/// A query that computed all its results: its pages are taken from them in order.
struct HeldResults {
    plan: Arc<Plan>,
    /// The results not yet sent, and how many were before them.
    rest: Mutex<(u64, std::vec::IntoIter<Value>)>,
    total: u64,
    metrics: engine::QueryMetrics,
    /// The results' memory, held against the response budget until the stream ends.
    _charge: Charge,
}

impl PageSource for HeldResults {
    type Message = QueryPage;
    /// How many results were sent before the page.
    type Cursor = u64;

    fn pays(&self) -> bool {
        true
    }

    fn charge(&self, page: &QueryPage) -> engine::RequestCharge {
        engine::RequestCharge::from_units(page.request_charge)
    }

    fn page(&self, engine: &Engine, at: &u64, _: QueryReads) -> Outcome<(QueryPage, Option<u64>)> {
        let mut rest = self.rest.lock();
        // Pages are asked for in order, each once (this source never asks to be run again).
        debug_assert_eq!(rest.0, *at);
        // Pages end at the page size or the page byte limit, with one result at least.
        let mut chunk: Vec<Value> = Vec::new();
        let mut bytes = 0;
        while chunk.len() < self.plan.page_size && (chunk.is_empty() || bytes < engine.page_bytes())
        {
            let Some(v) = rest.1.next() else { break };
            bytes += json::value_field_len(1, &v);
            chunk.push(v);
        }
        rest.0 += chunk.len() as u64;
        let sent = rest.0;
        let mut metrics = self.metrics.clone();
        metrics.results_returned = chunk.len() as u64;
        if *at > 0 {
            // Only the first page read anything: the documents were counted there.
            metrics.documents_examined = 0;
            metrics.index_entries_examined = 0;
        }
        let continuation = if sent < self.total {
            let plan = &self.plan;
            match engine.query_offset_token(&plan.path, &plan.spec, &plan.scope, sent) {
                Ok(token) => Some(token),
                Err(e) => return Outcome::failed(e),
            }
        } else {
            None
        };
        let next = continuation.is_some().then_some(sent);
        let page = engine::QueryPage {
            results: chunk,
            continuation,
            metrics,
            handoff: false,
        };
        Outcome::done((page_message(page), next))
    }
}

impl DocumentsService {
    /// Checks a query request and starts its pages: the first is computed before answering, so
    /// a bad query fails the call itself.
    pub(crate) async fn start_query(
        &self,
        headers: &http::HeaderMap,
        share: Option<PeerShare>,
        request: QueryRequest,
    ) -> Result<PageStream<QueryPage>, Status> {
        // Sent on to other nodes as asked, in a cluster (see `cluster_reads`).
        let original = self.forwarder.is_some().then(|| request.clone());
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
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let scope = convert::feed_scope(partition_key).map_err(to_status)?;
        let grant = Grant::read(
            &self.auth,
            &self.engine,
            headers,
            &database,
            &collection,
            scope.partition(),
        )?;
        let page_size = engine::page_size(page_size).map_err(to_status)?;
        let params = parameters_json(parameters).map_err(to_status)?;
        let mut spec = QuerySpec::parse_cached(&self.queries, &query, params).map_err(to_status)?;
        spec.enable_scan = enable_scan;
        let plan = Arc::new(Plan {
            path,
            scope,
            spec,
            page_size,
        });
        let token = (!continuation.is_empty()).then_some(continuation);
        let cursor = self
            .engine()?
            .query_cursor(&plan.path, &plan.spec, &plan.scope, token.as_deref())
            .map_err(to_status)?;
        if let Some(original) = original
            && let Some(route) = self.cluster_route(headers, &plan, &cursor)?
        {
            return self
                .fan_out(route, headers, grant, share, plan, original, token)
                .await;
        }
        let QueryCursor::Offset(offset) = cursor else {
            return self
                .open_stream(
                    grant,
                    share,
                    StreamingQuery {
                        page_size: plan.page_size,
                        plan,
                    },
                    token,
                )
                .await;
        };
        // A collection out of throughput is refused before the run, not after it (its
        // pages pay for it).
        self.admit(&self.engine()?, &plan.path)?;
        // Every result first, at one clock reading; stopped if the client leaves meanwhile.
        let cancel = CancelOnDrop::new(&self.stop);
        let p = plan.clone();
        let (results, metrics) = self
            .run_paged(
                (QueryReads::inline(), cancel.signal(), false),
                None,
                move |e, reads| e.query_all(&p.path, &p.spec, &p.scope, e.query_reading(), reads),
            )
            .await?;
        // Held from page to page: charged like a response waiting to be read (twice the JSON
        // size, for what values take in memory), refused if that is full.
        self.held_results(grant, share, plan, (results, metrics), offset)
            .await
    }

    /// Pages of a query's `results`, from `offset` on.
    pub(super) async fn held_results(
        &self,
        grant: Grant,
        share: Option<PeerShare>,
        plan: Arc<Plan>,
        (results, metrics): (Vec<Value>, engine::QueryMetrics),
        offset: u64,
    ) -> Result<PageStream<QueryPage>, Status> {
        let mut charge = Charge::default();
        let bytes: usize = results
            .iter()
            .map(mayfly_query::value::approximate_size)
            .sum();
        // Room is left for the pages themselves, charged as they leave: twice a page of the
        // largest size, which its last result may pass by about a document, and HTTP/2's
        // buffer.
        let page_bytes = self.engine()?.page_bytes();
        self.budget.grow_leaving(
            &mut charge,
            share.as_ref(),
            bytes.saturating_mul(2),
            2 * (page_bytes + engine::MAX_DOCUMENT_BYTES) + crate::net::HTTP2_HOLDS,
        )?;
        let total = results.len() as u64;
        let at = offset.min(total);
        let mut results = results;
        // Not sent again: the token says the client has them.
        results.drain(..usize::try_from(at).unwrap_or(usize::MAX));
        let held = HeldResults {
            plan,
            rest: Mutex::new((at, results.into_iter())),
            total,
            metrics,
            _charge: charge,
        };
        self.open_stream(grant, share, held, at).await
    }
}

pub(super) fn page_message(page: engine::QueryPage) -> QueryPage {
    let m = page.metrics;
    let charge = super::request_charge::page(
        m.index_entries_examined,
        m.documents_examined,
        &page.results,
    );
    QueryPage {
        request_charge: charge.units(),
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

/// Query parameters as JSON, each named with its '@'. Too many is a query limit
/// (`QUERY_LIMIT`), a bad name a query mistake (`QUERY_INVALID`), a value nested too deep the
/// one reason every JSON field has (`DOCUMENT_TOO_DEEP`); only a value JSON cannot hold (NaN)
/// is `INVALID_JSON`.
pub(super) fn parameters_json(
    parameters: std::collections::HashMap<String, json::JsonValue>,
) -> Result<Map<String, Value>, engine::Error> {
    let refused = |kind, message: String| {
        engine::Error::Query(mayfly_query::QueryError {
            kind,
            position: None,
            message,
        })
    };
    if parameters.len() > MAX_PARAMETERS {
        return Err(refused(
            mayfly_query::ErrorKind::Limit,
            format!(
                "{} query parameters given; at most {MAX_PARAMETERS} are allowed",
                parameters.len()
            ),
        ));
    }
    let mut out = Map::new();
    for (name, value) in parameters {
        let bare = name.strip_prefix('@').unwrap_or("");
        if bare.is_empty() || !bare.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return Err(refused(
                mayfly_query::ErrorKind::Invalid,
                format!(
                    "query parameter name '{}' must be '@' followed by letters, digits or '_'",
                    crate::model::Echo(&name)
                ),
            ));
        }
        let value = value.into_checked().map_err(|defect| -> InvalidInput {
            convert::value_defect(
                format!("query parameter {}", crate::model::Echo(&name)),
                defect,
            )
        })?;
        out.insert(name, value);
    }
    Ok(out)
}
