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

use std::{sync::Arc, time::Instant};

use mayfly_query::{QueryError, ast::Query};
use serde_json::{Map, Value};

use super::{
    CollectionInfo, Engine, Error, FeedScope, InvalidInput, Millis, Outcome, QueryReads,
    cursor::{QueryCursor, Resume},
    document::as_document,
    feed::Cursor,
    index::{
        ordered::{OrderedPos, OrderedWalk},
        plan::{self, IndexPlan, is_plain_count},
        read::{EntryCursor, IndexWalk},
    },
    query_reads::context,
    shard::Reading,
    walk::{Driven, PageFill, QueryMetrics, QueryPage, Sink, Step, Walk, check_time, take_results},
};

/// A query and its parameters, parsed and checked at the edge.
#[derive(Debug)]
pub struct QuerySpec {
    /// Shared with the [`QueryCache`] that parsed it, if any.
    pub query: Arc<Query>,
    /// Parameter values by name, with their `@`.
    pub params: Map<String, Value>,
    /// Whether a collection without an index may be read document by document.
    pub enable_scan: bool,
    /// Identifies the query and parameters in continuation tokens.
    fingerprint: u64,
}

/// Longest query text a [`QueryCache`] keeps: services send the same few short texts with
/// different parameters; a long text is more likely generated, and parsed each time.
const CACHED_TEXT_BYTES: usize = 2 * 1024;
/// Query text a [`QueryCache`] holds in all. A syntax tree takes a few times its text's bytes
/// (about 40 per token at most), so this bounds the cache to a few megabytes.
const CACHE_TEXT_BYTES: u64 = 256 * 1024;

/// Parsed queries by text, so that a service repeating a query with new parameters (the usual
/// case) skips the parse: about 4 % of an indexed one-document query's server time.
#[derive(Debug)]
pub struct QueryCache(quick_cache::sync::Cache<String, Arc<Query>, TextBytes>);

#[derive(Debug, Clone)]
struct TextBytes;

impl quick_cache::Weighter<String, Arc<Query>> for TextBytes {
    fn weight(&self, text: &String, _: &Arc<Query>) -> u64 {
        text.len() as u64
    }
}

impl Default for QueryCache {
    fn default() -> Self {
        QueryCache(quick_cache::sync::Cache::with_weighter(
            1024,
            CACHE_TEXT_BYTES,
            TextBytes,
        ))
    }
}

impl QueryCache {
    /// `text` parsed, from the cache if it was parsed before. A text that does not parse is
    /// not kept: its error is computed again, with its position.
    fn parse(&self, text: &str) -> Result<Arc<Query>, Error> {
        if text.len() > CACHED_TEXT_BYTES {
            return Ok(Arc::new(mayfly_query::parse(text)?));
        }
        if let Some(query) = self.0.get(text) {
            return Ok(query);
        }
        let query = Arc::new(mayfly_query::parse(text)?);
        self.0.insert(text.to_owned(), query.clone());
        Ok(query)
    }
}

impl QuerySpec {
    /// Parses `text`; refuses parameters the query does not use so a typo is caught.
    pub fn parse(text: &str, params: Map<String, Value>) -> Result<Self, Error> {
        Self::checked(text, Arc::new(mayfly_query::parse(text)?), params)
    }

    /// [`QuerySpec::parse`], reusing `cache`'s parse of the same text.
    pub fn parse_cached(
        cache: &QueryCache,
        text: &str,
        params: Map<String, Value>,
    ) -> Result<Self, Error> {
        Self::checked(text, cache.parse(text)?, params)
    }

    fn checked(text: &str, query: Arc<Query>, params: Map<String, Value>) -> Result<Self, Error> {
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

    /// Identifies the query and its parameters.
    pub(crate) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether it reads the collection's documents: a query without `FROM` is evaluated
    /// once, whatever the collection holds (as in Cosmos DB, `SELECT VALUE 1` is `[1]`).
    pub fn reads_documents(&self) -> bool {
        self.query.from.is_some()
    }

    /// Whether pages can end after any document.
    pub fn is_streaming(&self) -> bool {
        mayfly_query::is_streaming(&self.query)
    }
}

impl Engine {
    /// Whether a storage read may wait on a disk or a network (see
    /// [`crate::storage::Storage::reads_may_block`]): queries then get a smaller inline attempt.
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
        // A query without FROM reads no document: it runs once, whole.
        let plan = match spec.reads_documents() {
            true => self.query_plan(&info, spec)?,
            false => None,
        };
        let streams = spec.is_streaming() && spec.reads_documents();
        let Some(token) = token else {
            // An ordered walk streams where every shard can serve it; a walk that cannot go
            // on later ends with `CONTINUATION_STALE` (see `stream_page`).
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
            return Ok(if let Some(plan) = plan.as_ref().filter(|_| streams) {
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
            } else if streams {
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
            });
        };
        let cursor = match self.open_cursor(token, &info, scope, Some(spec.fingerprint()))? {
            Resume::Query(cursor) => cursor,
            Resume::Feed(_) => unreachable!("a query's binding opens query tokens"),
        };
        let not_this = || {
            Error::Invalid(InvalidInput::Continuation {
                reason: "it does not belong to this query",
            })
        };
        let (first, last) = self.shard_range(&info, scope);
        let in_scope = |shard: usize| (first..=last).contains(&shard);
        // Index positions mean something under one plan only: under another they would skip
        // or repeat results.
        let same_plan = |made_under: u64| {
            plan.as_ref()
                .filter(|p| plan_fingerprint(p) == made_under)
                .ok_or(Error::ContinuationStale {
                    reason: "the collection's indexing policy changed since it was issued, so the query now reads another index",
                })
        };
        match (&cursor, streams) {
            (QueryCursor::Stream { cursor: c, .. }, true) if in_scope(c.shard) => {}
            (QueryCursor::Index { at, plan: p, .. }, true) if in_scope(at.shard) => {
                if at.range >= same_plan(*p)?.ranges.len() {
                    return Err(not_this());
                }
            }
            (QueryCursor::Ordered { plan: p, .. }, _) => {
                same_plan(*p)?;
            }
            (QueryCursor::Offset(_), false) => {}
            _ => return Err(not_this()),
        }
        Ok(cursor)
    }

    pub(super) fn encode_query_cursor(
        &self,
        info: &CollectionInfo,
        spec: &QuerySpec,
        scope: &FeedScope,
        cursor: &QueryCursor,
    ) -> String {
        self.seal_cursor(
            info,
            scope,
            Some(spec.fingerprint()),
            &Resume::Query(cursor.clone()),
        )
    }

    fn shard_range(&self, info: &CollectionInfo, scope: &FeedScope) -> (usize, usize) {
        match scope {
            FeedScope::Collection => (0, self.shard_count() - 1),
            FeedScope::Partition(pk) => {
                let i = self.shard_index(info, pk);
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
        let shards = self.shard_range(&info, scope);
        // Checked against the cursor's plan when it was decoded, and again here: the policy
        // may have changed in between.
        let same_plan = |made_under: u64| {
            self.query_plan(&info, spec)?
                .filter(|p| made_under == plan_fingerprint(p))
                .ok_or(Error::ContinuationStale {
                    reason: "the collection's indexing policy changed while the query ran, so it now reads another index",
                })
        };
        let page = Paging {
            info: &info,
            spec,
            scope,
            page_size,
            read_at,
        };
        match cursor {
            QueryCursor::Stream {
                cursor,
                skipped,
                returned,
            } => {
                let mut walk = ScanWalk::new(&info, scope, read_at, shards.1);
                page.of(self, &mut walk, cursor, (skipped, returned), None, reads)
            }
            QueryCursor::Index {
                at,
                plan,
                skipped,
                returned,
            } => {
                let plan = same_plan(plan)?;
                let mut walk = IndexWalk::new(&info, &plan, scope, read_at, shards.1);
                page.of(self, &mut walk, at, (skipped, returned), Some(&plan), reads)
            }
            QueryCursor::Ordered {
                at,
                plan,
                skipped,
                returned,
            } => {
                let plan = same_plan(plan)?;
                let mut walk = self.ordered_walk(&info, &plan, scope, read_at)?.ok_or(
                    Error::ContinuationStale {
                        reason: "the index can no longer give this ORDER BY in order (its documents now have more than 64 distinct paths); run the query again",
                    },
                )?;
                page.of(self, &mut walk, at, (skipped, returned), Some(&plan), reads)
            }
            QueryCursor::Offset(_) => Err(Error::Invalid(InvalidInput::Continuation {
                reason: "it does not belong to this query",
            })),
        }
    }

    /// An ordered walk of `plan` over the scope, if every shard can serve it.
    fn ordered_walk<'a>(
        &self,
        info: &'a CollectionInfo,
        plan: &'a IndexPlan,
        scope: &'a FeedScope,
        read_at: Millis,
    ) -> Result<Option<OrderedWalk<'a>>, Error> {
        let descending = plan.ordered.expect("an ordered plan");
        let shards = self.shard_range(info, scope);
        Ok(self
            .order_support(info, plan, shards)
            .map(|undefined| OrderedWalk {
                info,
                plan,
                scope,
                descending,
                read_at,
                shards,
                undefined,
                examined: QueryMetrics::default(),
                started: Instant::now(),
            }))
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
        let info = self.get_collection(path)?;
        if !spec.reads_documents() {
            let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
            // One row, bound to nothing: the query's only evaluation.
            run.push_owned(Value::Null)?;
            let mut results = Vec::new();
            take_results(&mut run, &mut results)?;
            results.extend(run.finish()?);
            let metrics = QueryMetrics {
                results_returned: results.len() as u64,
                ..QueryMetrics::default()
            };
            return Ok((results, metrics));
        }
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
        let mut results = Vec::new();
        if let Some(plan) = &plan {
            let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
            let fed = if let Some(descending) = plan.ordered {
                match self.ordered_walk(&info, plan, scope, read_at)? {
                    Some(mut walk) => {
                        run = run.presorted();
                        let from = OrderedPos::start(descending);
                        self.drive_all(
                            &mut walk,
                            from,
                            &mut run,
                            &mut results,
                            &mut metrics,
                            reads,
                        )?;
                        true
                    }
                    // Some shard cannot give it in order: read the documents instead.
                    None => false,
                }
            } else {
                let mut walk = IndexWalk::new(&info, plan, scope, read_at, last);
                let from = EntryCursor {
                    shard: first,
                    range: 0,
                    after: None,
                };
                self.drive_all(&mut walk, from, &mut run, &mut results, &mut metrics, reads)?;
                true
            };
            if fed {
                reads.check_time()?;
                results.extend(run.finish()?);
                metrics.results_returned = results.len() as u64;
                return Ok((results, metrics));
            }
            metrics = QueryMetrics::default();
        }
        let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
        let mut walk = ScanWalk::new(&info, scope, read_at, last);
        let from = Cursor {
            shard: first,
            after: None,
        };
        self.drive_all(&mut walk, from, &mut run, &mut results, &mut metrics, reads)?;
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
    pub(super) fn query_plan(
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
}

/// Documents read from a shard at a time by a scan.
const SCAN_BATCH: usize = 256;

/// The live documents of a scope in key order: shard by shard, within a shard by (partition
/// key, id).
pub(crate) struct ScanWalk<'a> {
    info: &'a CollectionInfo,
    scope: &'a FeedScope,
    read_at: Millis,
    /// The scope's last shard.
    last: usize,
    examined: QueryMetrics,
    started: Instant,
}

impl<'a> ScanWalk<'a> {
    pub(crate) fn new(
        info: &'a CollectionInfo,
        scope: &'a FeedScope,
        read_at: Millis,
        last: usize,
    ) -> Self {
        ScanWalk {
            info,
            scope,
            read_at,
            last,
            examined: QueryMetrics::default(),
            started: Instant::now(),
        }
    }
}

impl Walk for ScanWalk<'_> {
    type Pos = Cursor;

    fn walk(
        &mut self,
        engine: &Engine,
        mut from: Cursor,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, Cursor>,
    ) -> Result<bool, Error> {
        loop {
            check_time(self.started, reads)?;
            reads.spend(SCAN_BATCH)?;
            let scanned = engine.inner.shards[from.shard].scan_page(
                self.info,
                self.scope,
                from.after.as_ref(),
                SCAN_BATCH,
                &mut |_, _| true,
                Reading::At(self.read_at),
            )?;
            reads.reflect(scanned.settle_at);
            for view in &scanned.documents {
                reads.check_time()?;
                let pos = Cursor {
                    shard: from.shard,
                    after: Some(view.key.clone()),
                };
                let step = Step::Doc {
                    pos,
                    doc: as_document(view),
                    size: view.body.len(),
                };
                if sink(step, reads)? {
                    return Ok(true);
                }
            }
            from = if !scanned.exhausted {
                Cursor {
                    shard: from.shard,
                    after: scanned.last,
                }
            } else if from.shard == self.last {
                return Ok(false);
            } else if !engine.serves(from.shard + 1) {
                let shard = from.shard + 1;
                let pos = Cursor { shard, after: None };
                return sink(Step::Unserved { pos, shard }, reads);
            } else {
                Cursor {
                    shard: from.shard + 1,
                    after: None,
                }
            };
            if sink(Step::Passed(from.clone()), reads)? {
                return Ok(true);
            }
        }
    }

    fn examined(&self) -> &QueryMetrics {
        &self.examined
    }
}

/// What every page of one query shares.
struct Paging<'a> {
    info: &'a CollectionInfo,
    spec: &'a QuerySpec,
    scope: &'a FeedScope,
    page_size: usize,
    read_at: Millis,
}

impl Paging<'_> {
    /// One page of `walk` from `from` (with the run's counters there), under `plan` if it
    /// reads the index.
    fn of<W: Walk>(
        &self,
        engine: &Engine,
        walk: &mut W,
        from: W::Pos,
        (skipped, returned): (u64, u64),
        plan: Option<&IndexPlan>,
        reads: &mut QueryReads,
    ) -> Result<QueryPage, Error>
    where
        W::Pos: Resumable,
    {
        let mut run = reads
            .execution(&self.spec.query, &self.spec.params, context(self.read_at))?
            .resume(skipped, returned);
        if plan.is_some_and(|p| p.ordered.is_some()) {
            run = run.presorted();
        }
        let fill = PageFill::new(
            self.page_size,
            engine.page_bytes(),
            plan.map(|p| p.name.clone()),
        );
        let Driven { mut page, next } = engine.drive_page(walk, from, &mut run, fill, reads)?;
        if let Some((at, counts)) = next {
            let cursor = at.resumed(plan.map_or(0, plan_fingerprint), counts);
            page.continuation =
                Some(engine.encode_query_cursor(self.info, self.spec, self.scope, &cursor));
        }
        Ok(page)
    }
}

/// A walk's position as a query cursor.
trait Resumable {
    /// The cursor resuming here, under the plan with fingerprint `plan` (if it reads the
    /// index), with the run's counters.
    fn resumed(self, plan: u64, counts: (u64, u64)) -> QueryCursor;
}

impl Resumable for Cursor {
    fn resumed(self, _: u64, (skipped, returned): (u64, u64)) -> QueryCursor {
        QueryCursor::Stream {
            cursor: self,
            skipped,
            returned,
        }
    }
}

impl Resumable for EntryCursor {
    fn resumed(self, plan: u64, (skipped, returned): (u64, u64)) -> QueryCursor {
        QueryCursor::Index {
            at: self,
            plan,
            skipped,
            returned,
        }
    }
}

impl Resumable for OrderedPos {
    fn resumed(self, plan: u64, (skipped, returned): (u64, u64)) -> QueryCursor {
        QueryCursor::Ordered {
            at: self,
            plan,
            skipped,
            returned,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn a_cached_parse_is_shared_and_still_checks_each_calls_parameters() {
        let cache = QueryCache::default();
        let text = "SELECT * FROM c WHERE c.n = @n";
        let a = QuerySpec::parse_cached(&cache, text, params(&[("@n", Value::from(1))]))
            .expect("valid");
        let b = QuerySpec::parse_cached(&cache, text, params(&[("@n", Value::from(2))]))
            .expect("valid");
        assert!(Arc::ptr_eq(&a.query, &b.query), "parsed once");
        assert_ne!(
            a.fingerprint(),
            b.fingerprint(),
            "parameters are the call's own"
        );
        let missing = QuerySpec::parse_cached(&cache, text, Map::new()).expect_err("no @n");
        assert!(
            missing.to_string().contains("@n is used but not given"),
            "{missing}"
        );
        let unused = QuerySpec::parse_cached(
            &cache,
            text,
            params(&[("@n", Value::from(1)), ("@m", Value::from(1))]),
        )
        .expect_err("@m unused");
        assert!(unused.to_string().contains("'@m' is not used"), "{unused}");
    }

    #[test]
    fn bad_and_long_texts_are_parsed_each_time() {
        let cache = QueryCache::default();
        for _ in 0..2 {
            let e = QuerySpec::parse_cached(&cache, "SELECT FROM", Map::new()).expect_err("bad");
            assert!(matches!(e, Error::Query(_)), "{e}");
        }
        let long = format!(
            "SELECT VALUE 1 FROM c WHERE c.s != '{}'",
            "x".repeat(CACHED_TEXT_BYTES)
        );
        let a = QuerySpec::parse_cached(&cache, &long, Map::new()).expect("valid");
        let b = QuerySpec::parse_cached(&cache, &long, Map::new()).expect("valid");
        assert!(!Arc::ptr_eq(&a.query, &b.query), "not kept");
        assert_eq!(cache.0.len(), 0);
    }
}
