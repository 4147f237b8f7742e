//! Queries over a collection: the live documents of the scope, judged at the one clock
//! reading the query started with, fed to the query language (`mayfly-query`).
//!
//! A streaming query (no `ORDER BY`, grouping, aggregate or `DISTINCT`) reads documents in
//! feed order and ends a page after any document, so its continuation is a feed position plus
//! the `OFFSET`/`TOP` counts so far. Any other query reads its whole scope before its first
//! result; its continuation is the number of results already returned, and resuming runs it
//! again (at a new clock reading) and skips them.
//!
//! A query on an indexed collection reads the documents its plan's index entries name (see
//! [`super::index`]); its streaming continuation is then a position among those entries.

use std::time::{Duration, Instant};

use mayfly_query::{Context, Flow, QueryError, ast::Query};
use serde_json::{Map, Value};

use super::{
    CollectionInfo, Engine, Error, FeedScope, InvalidInput, Millis, Outcome, QueryReads,
    document::DocumentView,
    feed::{self, Cursor},
    index::{
        ordered::{OrderedPos, OrderedWalk},
        plan::{self, IndexPlan, is_plain_count},
        read::{EntryCursor, named_by},
    },
    shard::Reading,
};
use crate::storage::{DocKey, IndexEntry};

/// Documents read from a shard at a time.
const SCAN_BATCH: usize = 256;
/// Documents a streaming page examines at most: a selective filter returns a short page (and
/// a continuation) rather than reading the whole collection in one request.
pub const MAX_EXAMINED_PER_PAGE: u64 = 50_000;
/// How long a streaming page may read before it ends with a continuation (it may end short).
pub const PAGE_TIME_LIMIT: Duration = Duration::from_secs(2);
/// How long a query that reads its whole scope may run.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(30);
/// Version 2: a stable fingerprint of the query, and an index position names its plan.
const TOKEN_VERSION: u8 = 2;

/// A query and its parameters, parsed and checked at the edge.
#[derive(Debug)]
pub struct QuerySpec {
    pub query: Query,
    /// Parameter values by name, with their `@`.
    pub params: Map<String, Value>,
    /// Whether a collection without an index may be read document by document.
    pub enable_scan: bool,
    /// Identifies the query and parameters in continuation tokens.
    fingerprint: u64,
}

impl QuerySpec {
    /// Parses `text`; refuses parameters the query does not use so a typo is caught.
    pub fn parse(text: &str, params: Map<String, Value>) -> Result<Self, Error> {
        let query = mayfly_query::parse(text)?;
        let used = query.parameters();
        if let Some(missing) = used.iter().find(|n| !params.contains_key(&format!("@{n}"))) {
            return Err(Error::Query(QueryError {
                kind: mayfly_query::ErrorKind::Invalid,
                position: None,
                message: format!("parameter @{missing} is used but not given"),
            }));
        }
        if let Some(unused) = params
            .keys()
            .find(|k| !k.strip_prefix('@').is_some_and(|n| used.contains(&n)))
        {
            return Err(Error::Query(QueryError {
                kind: mayfly_query::ErrorKind::Invalid,
                position: None,
                message: format!(
                    "parameter '{unused}' is not used by the query (parameters are named with '@', as in @status)"
                ),
            }));
        }
        let params_text = Value::Object(params.clone()).to_string();
        let fingerprint = stable_hash(&[text.as_bytes(), params_text.as_bytes()]);
        Ok(QuerySpec {
            query,
            params,
            enable_scan: false,
            fingerprint,
        })
    }

    /// Whether pages can end after any document.
    pub fn is_streaming(&self) -> bool {
        mayfly_query::is_streaming(&self.query)
    }
}

/// What a page did, for the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryMetrics {
    pub documents_examined: u64,
    pub index_entries_examined: u64,
    pub results_returned: u64,
    /// The index used, as a policy path; `None` for a full scan.
    pub index: Option<String>,
}

/// One page of results.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPage {
    pub results: Vec<Value>,
    pub continuation: Option<String>,
    pub metrics: QueryMetrics,
}

/// Where a query stands between pages.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryCursor {
    /// A streaming query: the next document, and the rows skipped and results returned.
    Stream {
        cursor: Cursor,
        skipped: u64,
        returned: u64,
    },
    /// A streaming query reading index entries: the next entry under the plan with this
    /// fingerprint, and the counts.
    Index {
        at: EntryCursor,
        plan: u64,
        skipped: u64,
        returned: u64,
    },
    /// An `ORDER BY` read from the index in order: where the walk stands under the plan with
    /// this fingerprint, and the counts.
    Ordered {
        at: OrderedPos,
        plan: u64,
        skipped: u64,
        returned: u64,
    },
    /// A query that reads its whole scope: results already returned.
    Offset(u64),
}

impl Engine {
    /// Whether a storage read may wait on a disk or a network (see
    /// [`crate::storage::Storage::reads_may_block`]): queries then run off the async workers.
    pub fn reads_may_block(&self) -> bool {
        self.inner.storage.reads_may_block()
    }

    /// The clock reading a query judges expiry at.
    pub fn query_reading(&self) -> Millis {
        // The latest reading any shard acted on: shard time never steps back, so a document
        // a read already found expired stays out of every query.
        self.inner
            .shards
            .iter()
            .map(|s| s.reading(&*self.inner.clock))
            .max()
            .unwrap_or_else(|| self.inner.clock.now())
    }

    /// Decodes a client's continuation token for `spec` over `scope`.
    pub fn query_cursor(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        token: Option<&str>,
    ) -> Result<QueryCursor, Error> {
        let info = self.get_collection(path)?;
        let plan = self.query_plan(&info, spec)?;
        let Some(token) = token else {
            // An ordered walk streams where every shard can serve it; a walk that cannot go
            // on later ends with `CONTINUATION_STALE` (see `ordered_stream_page`).
            if let Some(plan) = plan.as_ref()
                && let Some(descending) = plan.ordered
                && self
                    .order_support(&info, plan, self.shard_range(&info, scope))
                    .is_some()
            {
                return Ok(QueryCursor::Ordered {
                    at: OrderedPos::start(descending),
                    plan: plan_fingerprint(plan),
                    skipped: 0,
                    returned: 0,
                });
            }
            return Ok(
                if let Some(plan) = plan.as_ref().filter(|_| spec.is_streaming()) {
                    QueryCursor::Index {
                        at: EntryCursor {
                            shard: self.first_shard(&info, scope),
                            range: 0,
                            after: None,
                        },
                        plan: plan_fingerprint(plan),
                        skipped: 0,
                        returned: 0,
                    }
                } else if spec.is_streaming() {
                    QueryCursor::Stream {
                        cursor: Cursor {
                            shard: self.first_shard(&info, scope),
                            after: None,
                        },
                        skipped: 0,
                        returned: 0,
                    }
                } else {
                    QueryCursor::Offset(0)
                },
            );
        };
        let bad = |reason| Error::Invalid(InvalidInput::Continuation { reason });
        let bytes = self.inner.token_key.open(token)?;
        let (head, rest) = bytes
            .split_at_checked(18)
            .ok_or_else(|| bad("it is not a token this server issued"))?;
        if head[0] != TOKEN_VERSION {
            return Err(bad("it was issued by an incompatible server version"));
        }
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or_default());
        if word(1) != spec.fingerprint {
            return Err(bad(
                "it was issued for another query text or other parameters",
            ));
        }
        match (head[9], spec.is_streaming()) {
            (2, true) => {
                let (counts, rest) = rest
                    .split_at_checked(8 + 8 + 4 + 2)
                    .ok_or_else(|| bad("it is not a token this server issued"))?;
                let returned = u64::from_le_bytes(counts[..8].try_into().unwrap_or_default());
                let made_under = u64::from_le_bytes(counts[8..16].try_into().unwrap_or_default());
                // Entries are positions in one plan's ranges: under another plan they would
                // skip or repeat results.
                let plan = plan
                    .filter(|p| plan_fingerprint(p) == made_under)
                    .ok_or(Error::ContinuationStale {
                        reason: "the collection's indexing policy changed since it was issued, so the query now reads another index",
                    })?;
                let range =
                    u32::from_le_bytes(counts[16..20].try_into().unwrap_or_default()) as usize;
                let term_len = usize::from(u16::from_le_bytes(
                    counts[20..22].try_into().unwrap_or_default(),
                ));
                let (term, feed_token) = rest
                    .split_at_checked(term_len)
                    .ok_or_else(|| bad("it is not a token this server issued"))?;
                let cursor = feed::decode_token(feed_token, info.uid, scope, self.shard_count())?;
                let (first, last) = self.shard_range(&info, scope);
                if cursor.shard < first || cursor.shard > last || range >= plan.ranges.len() {
                    return Err(bad("it does not belong to this query"));
                }
                Ok(QueryCursor::Index {
                    at: EntryCursor {
                        shard: cursor.shard,
                        range,
                        after: cursor.after.map(|key| IndexEntry {
                            term: term.to_vec(),
                            key,
                        }),
                    },
                    plan: made_under,
                    skipped: word(10),
                    returned,
                })
            }
            (0, false) => {
                feed::decode_token(rest, info.uid, scope, self.shard_count())?;
                Ok(QueryCursor::Offset(word(10)))
            }
            (3, false) => {
                let not_ours = || bad("it is not a token this server issued");
                let (counts, rest) = rest.split_at_checked(8 + 8 + 1 + 2).ok_or_else(not_ours)?;
                let returned = u64::from_le_bytes(counts[..8].try_into().unwrap_or_default());
                let made_under = u64::from_le_bytes(counts[8..16].try_into().unwrap_or_default());
                if plan.as_ref().map(plan_fingerprint) != Some(made_under) {
                    return Err(Error::ContinuationStale {
                        reason: "the collection's indexing policy changed since it was issued, so the query now reads another index",
                    });
                }
                let term_len = usize::from(u16::from_le_bytes(
                    counts[17..19].try_into().unwrap_or_default(),
                ));
                let (term, rest) = rest.split_at_checked(term_len).ok_or_else(not_ours)?;
                let (skip, feed_token) = rest.split_at_checked(8).ok_or_else(not_ours)?;
                let skip = u64::from_le_bytes(skip.try_into().unwrap_or_default());
                let cursor = feed::decode_token(feed_token, info.uid, scope, self.shard_count())?;
                let at = match (counts[16], term.is_empty(), cursor.after) {
                    (0, true, after) => OrderedPos::Undefined(after),
                    (1, true, None) => OrderedPos::Entries(None),
                    (1, false, Some(key)) => OrderedPos::Entries(Some(IndexEntry {
                        term: term.to_vec(),
                        key,
                    })),
                    (2, false, None) => OrderedPos::Group {
                        term: term.to_vec(),
                        skip,
                    },
                    _ => return Err(not_ours()),
                };
                Ok(QueryCursor::Ordered {
                    at,
                    plan: made_under,
                    skipped: word(10),
                    returned,
                })
            }
            (1, true) => {
                let (counts, feed_token) = rest
                    .split_at_checked(8)
                    .ok_or_else(|| bad("it is not a token this server issued"))?;
                let returned = u64::from_le_bytes(counts.try_into().unwrap_or_default());
                let cursor = feed::decode_token(feed_token, info.uid, scope, self.shard_count())?;
                let (first, last) = self.shard_range(&info, scope);
                if cursor.shard < first || cursor.shard > last {
                    return Err(bad("it does not belong to this query"));
                }
                Ok(QueryCursor::Stream {
                    cursor,
                    skipped: word(10),
                    returned,
                })
            }
            _ => Err(bad("it is not a token this server issued")),
        }
    }

    pub(super) fn encode_query_cursor(
        &self,
        info: &CollectionInfo,
        spec: &QuerySpec,
        scope: &FeedScope,
        cursor: &QueryCursor,
    ) -> String {
        let mut out = vec![TOKEN_VERSION];
        out.extend_from_slice(&spec.fingerprint.to_le_bytes());
        match cursor {
            QueryCursor::Offset(n) => {
                out.push(0);
                out.extend_from_slice(&n.to_le_bytes());
                // Bound to the collection and scope as a feed token is.
                let start = Cursor {
                    shard: self.first_shard(info, scope),
                    after: None,
                };
                out.extend_from_slice(&feed::encode_token(
                    info.uid,
                    scope,
                    self.shard_count(),
                    &start,
                ));
            }
            QueryCursor::Index {
                at,
                plan,
                skipped,
                returned,
            } => {
                out.push(2);
                out.extend_from_slice(&skipped.to_le_bytes());
                out.extend_from_slice(&returned.to_le_bytes());
                out.extend_from_slice(&plan.to_le_bytes());
                out.extend_from_slice(&(at.range as u32).to_le_bytes());
                let term = at.after.as_ref().map_or(&[][..], |e| &e.term[..]);
                out.extend_from_slice(&(term.len() as u16).to_le_bytes());
                out.extend_from_slice(term);
                let cursor = Cursor {
                    shard: at.shard,
                    after: at.after.as_ref().map(|e| e.key.clone()),
                };
                out.extend_from_slice(&feed::encode_token(
                    info.uid,
                    scope,
                    self.shard_count(),
                    &cursor,
                ));
            }
            QueryCursor::Ordered {
                at,
                plan,
                skipped,
                returned,
            } => {
                out.push(3);
                out.extend_from_slice(&skipped.to_le_bytes());
                out.extend_from_slice(&returned.to_le_bytes());
                out.extend_from_slice(&plan.to_le_bytes());
                let (phase, term, skip, after): (u8, &[u8], u64, Option<DocKey>) = match at {
                    OrderedPos::Undefined(after) => (0, &[], 0, after.clone()),
                    OrderedPos::Entries(None) => (1, &[], 0, None),
                    OrderedPos::Entries(Some(e)) => (1, &e.term, 0, Some(e.key.clone())),
                    OrderedPos::Group { term, skip } => (2, term, *skip, None),
                };
                out.push(phase);
                out.extend_from_slice(&(term.len() as u16).to_le_bytes());
                out.extend_from_slice(term);
                out.extend_from_slice(&skip.to_le_bytes());
                let cursor = Cursor {
                    shard: self.first_shard(info, scope),
                    after,
                };
                out.extend_from_slice(&feed::encode_token(
                    info.uid,
                    scope,
                    self.shard_count(),
                    &cursor,
                ));
            }
            QueryCursor::Stream {
                cursor,
                skipped,
                returned,
            } => {
                out.push(1);
                out.extend_from_slice(&skipped.to_le_bytes());
                out.extend_from_slice(&returned.to_le_bytes());
                out.extend_from_slice(&feed::encode_token(
                    info.uid,
                    scope,
                    self.shard_count(),
                    cursor,
                ));
            }
        }
        self.inner.token_key.seal(&out)
    }

    fn shard_range(&self, info: &CollectionInfo, scope: &FeedScope) -> (usize, usize) {
        match scope {
            FeedScope::Collection => (0, self.shard_count() - 1),
            FeedScope::Partition(pk) => {
                let i = self.shard_index(info.uid, pk);
                (i, i)
            }
        }
    }

    fn first_shard(&self, info: &CollectionInfo, scope: &FeedScope) -> usize {
        self.shard_range(info, scope).0
    }

    /// One page of a streaming query from `cursor`, judged at `read_at`, within `reads`
    /// (with [`QueryReads::inline`], a page that needs more fails with
    /// [`Error::ReadBudgetSpent`]). Blocks on storage: unless inline, call it off the async
    /// runtime.
    #[allow(
        clippy::too_many_arguments,
        reason = "one page's inputs, each distinct"
    )]
    pub fn query_stream_page(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        page_size: usize,
        cursor: QueryCursor,
        read_at: Millis,
        mut reads: QueryReads,
    ) -> Outcome<QueryPage> {
        let result = self.stream_page(path, spec, scope, page_size, cursor, read_at, &mut reads);
        Outcome::new(result.map_err(|e| reads.explain(e)), reads.settle_at)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one page's inputs, each distinct"
    )]
    fn stream_page(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        page_size: usize,
        cursor: QueryCursor,
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<QueryPage, Error> {
        let info = self.get_collection(path)?;
        let (mut cursor, skipped, returned) = match cursor {
            QueryCursor::Stream {
                cursor,
                skipped,
                returned,
            } => (cursor, skipped, returned),
            QueryCursor::Index {
                at,
                plan: made_under,
                skipped,
                returned,
            } => {
                // Checked against the cursor's plan when it was decoded, and again here: the
                // policy may have changed in between.
                let plan = self
                    .query_plan(&info, spec)?
                    .filter(|p| made_under == plan_fingerprint(p))
                    .ok_or(Error::ContinuationStale {
                        reason: "the collection's indexing policy changed while the query ran, so it now reads another index",
                    })?;
                return self.index_stream_page(
                    &info,
                    spec,
                    &plan,
                    scope,
                    page_size,
                    (at, skipped, returned),
                    read_at,
                    reads,
                );
            }
            QueryCursor::Ordered {
                at,
                plan: made_under,
                skipped,
                returned,
            } => {
                let plan = self
                    .query_plan(&info, spec)?
                    .filter(|p| made_under == plan_fingerprint(p))
                    .ok_or(Error::ContinuationStale {
                        reason: "the collection's indexing policy changed while the query ran, so it now reads another index",
                    })?;
                return self.ordered_stream_page(
                    &info,
                    spec,
                    &plan,
                    scope,
                    page_size,
                    (at, skipped, returned),
                    read_at,
                    reads,
                );
            }
            QueryCursor::Offset(_) => {
                return Err(Error::Invalid(InvalidInput::Continuation {
                    reason: "it does not belong to this query",
                }));
            }
        };
        let (_, last) = self.shard_range(&info, scope);
        let mut run = reads
            .execution(&spec.query, &spec.params, context(read_at))?
            .resume(skipped, returned);
        let mut fill = PageFill::new(page_size, self.page_bytes(), None);
        let started = Instant::now();
        loop {
            let scanned = self.scan_batch(&info, scope, &cursor, read_at, reads)?;
            let mut stopped_at = None;
            for (i, view) in scanned.documents.iter().enumerate() {
                reads.check_time()?;
                let doc = || as_document(view);
                if let Some(stop) = fill.feed(&mut run, doc, view.body.len(), reads)? {
                    stopped_at = Some(match stop {
                        Stop::Done => return Ok(fill.page),
                        Stop::After => Some(view.key.clone()),
                        Stop::Before if i == 0 => cursor.after.clone(),
                        Stop::Before => Some(scanned.documents[i - 1].key.clone()),
                    });
                    break;
                }
            }
            // Expired and deleted documents cost scanning too: a page also ends on time.
            let full = stopped_at.is_some() || started.elapsed() > PAGE_TIME_LIMIT;
            if let Some(after) = stopped_at {
                cursor.after = after;
            } else if !scanned.exhausted {
                cursor.after = scanned.last;
            } else if cursor.shard == last {
                return Ok(fill.page);
            } else {
                cursor = Cursor {
                    shard: cursor.shard + 1,
                    after: None,
                };
            }
            if full {
                break;
            }
        }
        let (skipped, returned) = fill.counters(&run);
        let mut page = fill.page;
        page.continuation = Some(self.encode_query_cursor(
            &info,
            spec,
            scope,
            &QueryCursor::Stream {
                cursor,
                skipped,
                returned,
            },
        ));
        Ok(page)
    }

    /// The next batch of live documents at `cursor`, judged at `read_at`; what it reflects is
    /// noted in `reads`.
    fn scan_batch(
        &self,
        info: &CollectionInfo,
        scope: &FeedScope,
        cursor: &Cursor,
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<feed::ShardPage, Error> {
        reads.spend(SCAN_BATCH)?;
        let scanned = self.inner.shards[cursor.shard].scan_page(
            info,
            scope,
            cursor.after.as_ref(),
            SCAN_BATCH,
            &mut |_, _| true,
            Reading::At(read_at),
        )?;
        reads.reflect(scanned.settle_at);
        Ok(scanned)
    }

    /// Every result of a query that reads its whole scope, judged at `read_at`, with the
    /// metrics of the run, within `reads` (see [`Self::query_stream_page`]). Blocks on
    /// storage: unless inline, call it off the async runtime.
    pub fn query_all(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        read_at: Millis,
        mut reads: QueryReads,
    ) -> Outcome<(Vec<Value>, QueryMetrics)> {
        let result = self.run_all(path, spec, scope, read_at, &mut reads);
        Outcome::new(result.map_err(|e| reads.explain(e)), reads.settle_at)
    }

    fn run_all(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<(Vec<Value>, QueryMetrics), Error> {
        let started = Instant::now();
        let info = self.get_collection(path)?;
        let (first, last) = self.shard_range(&info, scope);
        let plan = self.query_plan(&info, spec)?;
        let mut metrics = QueryMetrics {
            index: plan.as_ref().map(|p| p.name.clone()),
            ..QueryMetrics::default()
        };
        // Without a plan, only an unfiltered count may be answered from metadata.
        if is_plain_count(&spec.query)
            && info.indexed_paths().is_some()
            && (plan.is_some() || spec.query.filter.is_none())
            && let Some(n) = self.count_without_bodies(
                &info,
                plan.as_ref(),
                scope,
                (first, last),
                read_at,
                &mut metrics,
                reads,
            )?
        {
            metrics.results_returned = 1;
            return Ok((vec![Value::from(n)], metrics));
        }
        if let Some(plan) = &plan {
            let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
            if plan.ordered.is_some() {
                run = run.presorted();
            }
            let mut results = Vec::new();
            if self.feed_from_index(
                &info,
                plan,
                scope,
                (first, last),
                read_at,
                &mut run,
                &mut results,
                &mut metrics,
                reads,
            )? {
                reads.check_time()?;
                results.extend(run.finish()?);
                metrics.results_returned = results.len() as u64;
                return Ok((results, metrics));
            }
            // An ordered plan some shard cannot serve: read the documents instead.
            metrics = QueryMetrics::default();
        }
        let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
        let mut results = Vec::new();
        'shards: for shard in first..=last {
            let mut cursor = Cursor { shard, after: None };
            loop {
                if started.elapsed() > QUERY_TIME_LIMIT {
                    return Err(Error::Query(QueryError {
                        kind: mayfly_query::ErrorKind::Limit,
                        position: None,
                        message: format!(
                            "the query ran longer than {} s after reading {} documents; filter by partition key or narrow it",
                            QUERY_TIME_LIMIT.as_secs(),
                            metrics.documents_examined
                        ),
                    }));
                }
                let scanned = self.scan_batch(&info, scope, &cursor, read_at, reads)?;
                for view in &scanned.documents {
                    metrics.documents_examined += 1;
                    let flow = run.push_owned(as_document(view))?;
                    take_results(&mut run, &mut results)?;
                    if flow == Flow::Done {
                        break 'shards;
                    }
                }
                if scanned.exhausted {
                    break;
                }
                cursor.after = scanned.last;
            }
        }
        reads.check_time()?;
        results.extend(run.finish()?);
        metrics.results_returned = results.len() as u64;
        Ok((results, metrics))
    }

    /// The token that resumes a query reading its whole scope after `offset` results.
    pub fn query_offset_token(
        &self,
        path: &super::CollectionPath,
        spec: &QuerySpec,
        scope: &FeedScope,
        offset: u64,
    ) -> Result<String, Error> {
        let info = self.get_collection(path)?;
        Ok(self.encode_query_cursor(&info, spec, scope, &QueryCursor::Offset(offset)))
    }
}

impl Engine {
    /// How `spec` reads `info`: the index plan, or `None` to read every document. A collection
    /// that does not index is read only if the request allows it.
    fn query_plan(
        &self,
        info: &CollectionInfo,
        spec: &QuerySpec,
    ) -> Result<Option<IndexPlan>, Error> {
        if info.indexed_paths().is_none() && !spec.enable_scan {
            return Err(Error::Invalid(InvalidInput::ScanNotEnabled {
                collection: info.id.to_string(),
            }));
        }
        if !info.index_usable() {
            return Ok(None);
        }
        Ok(plan::plan(&spec.query, &spec.params, &info.index_paths))
    }

    /// One page of a streaming query that reads index entries from `at`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one page's inputs, each distinct"
    )]
    fn index_stream_page(
        &self,
        info: &CollectionInfo,
        spec: &QuerySpec,
        plan: &IndexPlan,
        scope: &FeedScope,
        page_size: usize,
        (at, skipped, returned): (EntryCursor, u64, u64),
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<QueryPage, Error> {
        let (_, last) = self.shard_range(info, scope);
        let mut run = reads
            .execution(&spec.query, &spec.params, context(read_at))?
            .resume(skipped, returned);
        let mut fill = PageFill::new(page_size, self.page_bytes(), Some(plan.name.clone()));
        let started = Instant::now();
        let mut at = Some(at);
        while let Some(cursor) = at.take() {
            let batch = self.entry_batch(
                info,
                plan,
                scope,
                &cursor,
                last,
                &mut fill.page.metrics.index_entries_examined,
                reads,
            )?;
            let docs = self.entry_documents(info, cursor.shard, batch.entries, read_at, reads)?;
            // The last entry this page is done with, and where it ends, if before the batch's.
            let mut done = cursor.after.clone();
            let mut stopped = None;
            for (entry, view) in docs {
                reads.check_time()?;
                let size = view.body.len();
                let Some(doc) = named_by(&entry, view, plan) else {
                    fill.page.metrics.documents_examined += 1;
                    done = Some(entry);
                    continue;
                };
                if let Some(stop) = fill.feed(&mut run, || doc, size, reads)? {
                    stopped = Some(match stop {
                        Stop::Done => return Ok(fill.page),
                        Stop::After => Some(entry),
                        Stop::Before => done,
                    });
                    break;
                }
                done = Some(entry);
            }
            let full = stopped.is_some();
            at = match stopped {
                Some(after) => Some(EntryCursor { after, ..cursor }),
                None => batch.next,
            };
            if full || started.elapsed() > PAGE_TIME_LIMIT {
                break;
            }
        }
        let (skipped, returned) = fill.counters(&run);
        let mut page = fill.page;
        if let Some(at) = at {
            page.continuation = Some(self.encode_query_cursor(
                info,
                spec,
                scope,
                &QueryCursor::Index {
                    at,
                    plan: plan_fingerprint(plan),
                    skipped,
                    returned,
                },
            ));
        }
        Ok(page)
    }
}

impl Engine {
    /// One page of an `ORDER BY` read from the index in order, from `at`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one page's inputs, each distinct"
    )]
    fn ordered_stream_page(
        &self,
        info: &CollectionInfo,
        spec: &QuerySpec,
        plan: &IndexPlan,
        scope: &FeedScope,
        page_size: usize,
        (at, skipped, returned): (OrderedPos, u64, u64),
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<QueryPage, Error> {
        let descending = plan.ordered.expect("an ordered plan");
        let shards = self.shard_range(info, scope);
        let undefined = self
            .order_support(info, plan, shards)
            .ok_or(Error::ContinuationStale {
                reason: "the index can no longer give this ORDER BY in order (its documents now have more than 64 distinct paths); run the query again",
            })?;
        let mut run = reads
            .execution(&spec.query, &spec.params, context(read_at))?
            .resume(skipped, returned)
            .presorted();
        let mut fill = PageFill::new(page_size, self.page_bytes(), Some(plan.name.clone()));
        let started = Instant::now();
        // Where the page ends: after the last document it kept.
        let mut kept = at.clone();
        let mut done = false;
        let mut sink = |pos: &OrderedPos, doc: Value, size: usize, reads: &QueryReads| {
            Ok(match fill.feed(&mut run, || doc, size, reads)? {
                None => {
                    kept = pos.clone();
                    // Expired and skipped documents cost reading too: a page also ends on time.
                    started.elapsed() > PAGE_TIME_LIMIT
                }
                Some(Stop::Done) => {
                    done = true;
                    true
                }
                Some(Stop::After) => {
                    kept = pos.clone();
                    true
                }
                Some(Stop::Before) => true,
            })
        };
        let mut walk = OrderedWalk {
            info,
            plan,
            scope,
            descending,
            read_at,
            reads,
            examined: QueryMetrics::default(),
            started,
            sink: &mut sink,
        };
        let stopped = walk.run(self, at, shards, &undefined)?;
        let examined = walk.examined;
        let (skipped, returned) = fill.counters(&run);
        let mut page = fill.page;
        page.metrics.index_entries_examined += examined.index_entries_examined;
        page.metrics.documents_examined += examined.documents_examined;
        if stopped && !done {
            page.continuation = Some(self.encode_query_cursor(
                info,
                spec,
                scope,
                &QueryCursor::Ordered {
                    at: kept,
                    plan: plan_fingerprint(plan),
                    skipped,
                    returned,
                },
            ));
        }
        Ok(page)
    }
}

/// The largest result a query may return, in its protobuf encoding: results travel in
/// messages of at most 16 MiB, a page ends past 4 MiB (a document is at most 2 MiB; a
/// projection may build more).
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;

/// Moves the results `run` has ready into `out`, refusing one too large to send; returns
/// their size.
pub(super) fn take_results(
    run: &mut mayfly_query::Execution<'_, '_>,
    out: &mut Vec<Value>,
) -> Result<usize, Error> {
    let mut bytes = 0;
    for r in run.take_ready() {
        // JSON size, cheap to measure; a large result is measured as it will travel too, as
        // a small number takes up to 11 bytes as protobuf (below this, a result stays below
        // the limit either way).
        let mut size = mayfly_query::value::approximate_size(&r);
        if size > MAX_RESULT_BYTES / 16 {
            size = size.max(mayfly_json::value_field_len(1, &r));
        }
        if size > MAX_RESULT_BYTES {
            return Err(Error::Query(QueryError {
                kind: mayfly_query::ErrorKind::Limit,
                position: None,
                message: format!(
                    "a result of about {} MiB is larger than the largest a query may return ({} MiB); project fewer or smaller values",
                    size >> 20,
                    MAX_RESULT_BYTES >> 20
                ),
            }));
        }
        bytes += size;
        out.push(r);
    }
    Ok(bytes)
}

/// Where a streaming page stops.
enum Stop {
    /// The run is done: the page is the last.
    Done,
    /// After the document just fed: the page is full.
    After,
    /// Before it: its results do not fit what the page could reserve.
    Before,
}

/// A streaming page being filled, within its size, its bytes and the memory `QueryReads` can
/// reserve: one fill for pages of documents and of index entries alike.
struct PageFill {
    page: QueryPage,
    /// What the results take, as they will travel.
    bytes: usize,
    /// The run's counters from before a document that was taken back.
    resume: Option<(u64, u64)>,
    page_size: usize,
    page_bytes: usize,
}

impl PageFill {
    fn new(page_size: usize, page_bytes: usize, index: Option<String>) -> Self {
        PageFill {
            page: QueryPage {
                results: Vec::new(),
                continuation: None,
                metrics: QueryMetrics {
                    index,
                    ..QueryMetrics::default()
                },
            },
            bytes: 0,
            resume: None,
            page_size,
            page_bytes,
        }
    }

    /// Feeds the document `doc` makes (whose stored body is `size` bytes) to `run`, keeping
    /// its results only within what `reads` can reserve for them: before they are built, by
    /// the document's size, and once built, by theirs. A page with no results yet fails
    /// instead (there is nothing to send). `None`: the page goes on.
    fn feed(
        &mut self,
        run: &mut mayfly_query::Execution<'_, '_>,
        doc: impl FnOnce() -> Value,
        size: usize,
        reads: &QueryReads,
    ) -> Result<Option<Stop>, Error> {
        let refused = |page: &QueryPage| match page.results.is_empty() {
            true => Err(Error::NoMemory),
            false => Ok(Some(Stop::Before)),
        };
        if !reads.hold(self.bytes + size) {
            return refused(&self.page);
        }
        self.page.metrics.documents_examined += 1;
        let before = run.counters();
        let flow = run.push_owned(doc())?;
        let kept = self.page.results.len();
        let added = take_results(run, &mut self.page.results)?;
        if added > size && !reads.hold(self.bytes + added) {
            self.page.results.truncate(kept);
            self.resume = Some(before);
            return refused(&self.page);
        }
        self.bytes += added;
        self.page.metrics.results_returned = self.page.results.len() as u64;
        let full = self.page.results.len() >= self.page_size
            || self.bytes >= self.page_bytes
            || self.page.metrics.documents_examined >= MAX_EXAMINED_PER_PAGE;
        Ok(match flow {
            Flow::Done => Some(Stop::Done),
            Flow::More if full => Some(Stop::After),
            Flow::More => None,
        })
    }

    /// Rows skipped and results returned by the page's end, for its continuation.
    fn counters(&self, run: &mayfly_query::Execution<'_, '_>) -> (u64, u64) {
        self.resume.unwrap_or_else(|| run.counters())
    }
}

/// A hash of `parts` that every build and release of the server computes alike (tokens
/// outlive a process).
fn stable_hash(parts: &[&[u8]]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
}

/// Identifies a plan: a continuation's index position means something under that plan only.
fn plan_fingerprint(plan: &IndexPlan) -> u64 {
    let mut parts: Vec<&[u8]> = vec![&plan.path];
    let order = [plan.ordered.map_or(0, |d| 1 + u8::from(d))];
    parts.push(&order);
    let exact: Vec<u8> = plan.ranges.iter().map(|r| u8::from(r.exact)).collect();
    parts.push(&exact);
    for r in &plan.ranges {
        parts.push(&r.low);
        parts.push(&r.high);
    }
    stable_hash(&parts)
}

pub(super) fn context(read_at: Millis) -> Context {
    #[allow(
        clippy::cast_possible_wrap,
        reason = "epoch milliseconds stay below 2^63"
    )]
    let now = read_at as i64;
    Context::new(now, read_at ^ 0x9E37_79B9_7F4A_7C15)
}

/// A document as queries see it: its body with `_ts` (seconds) and `_etag`.
pub(super) fn as_document(view: &DocumentView) -> Value {
    let mut map = view.body_map();
    map.insert("_ts".to_owned(), Value::from(view.last_write / 1000));
    map.insert("_etag".to_owned(), Value::String(view.etag.to_string()));
    Value::Object(map)
}
