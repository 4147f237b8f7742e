//! One page driver for every query source. A source (a [`Walk`]: the key-order scan, an index
//! read, an ordered walk) feeds its documents in its order, each with the position just after
//! it; the driver fills a page from them by count, bytes, reserved memory and time, and its
//! continuation is the position after the last document the page kept. A query that reads its
//! whole scope takes every document of the same walks.

use std::time::{Duration, Instant};

use mayfly_query::{Execution, Flow, QueryError};
use serde_json::Value;

use super::{Engine, Error, QUERY_TIME_LIMIT, QueryReads};

/// Documents a streaming page examines at most: a selective filter returns a short page (and
/// a continuation) rather than reading the whole collection in one request.
pub const MAX_EXAMINED_PER_PAGE: u64 = 50_000;
/// How long a streaming page may read before it ends with a continuation (it may end short).
pub const PAGE_TIME_LIMIT: Duration = Duration::from_secs(2);

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
    /// The page ended where the shards this node serves end (in a cluster): the next page,
    /// at `continuation`, is another node's to compute.
    pub handoff: bool,
}

/// The largest result a query may return, in its protobuf encoding: results travel in
/// messages of at most 16 MiB, a page ends past 4 MiB (a document is at most 2 MiB; a
/// projection may build more).
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;

/// Moves the results `run` has ready into `out`, refusing one too large to send; returns
/// their size.
pub(crate) fn take_results(
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

/// What a walk hands its consumer.
pub(crate) enum Step<P> {
    /// A document, and the position just after it.
    Doc { pos: P, doc: Value, size: usize },
    /// The walk went past documents it does not feed (expired, gone, rewritten off their
    /// entry, of another partition): a page may end here.
    Passed(P),
    /// The walk reached shard `shard`, which this node does not serve (another node owns it,
    /// in a cluster): a page ends here, and a run over the whole scope cannot go on.
    Unserved { pos: P, shard: usize },
}

/// Takes a walk's steps; `true` stops the walk.
pub(crate) type Sink<'s, P> = dyn FnMut(Step<P>, &QueryReads) -> Result<bool, Error> + 's;

/// A source of documents in an order it can resume from any position.
pub(crate) trait Walk {
    type Pos: Clone;

    /// Feeds `sink` each document from `from` on, judged at the walk's reading; `Ok(true)`
    /// if the sink stopped it, `Ok(false)` at the end of the source.
    fn walk(
        &mut self,
        engine: &Engine,
        from: Self::Pos,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, Self::Pos>,
    ) -> Result<bool, Error>;

    /// What it read beyond the documents it fed: index entries, and documents left out.
    fn examined(&self) -> &QueryMetrics;
}

/// A page, and where the next one resumes with the run's counters (rows skipped, results
/// returned) there; `None` when the walk or the query is done.
pub(crate) struct Driven<P> {
    pub(crate) page: QueryPage,
    pub(crate) next: Option<(P, (u64, u64))>,
}

/// Fails a walk past [`QUERY_TIME_LIMIT`] (or the limit `reads` holds it to).
pub(crate) fn check_time(started: Instant, reads: &QueryReads) -> Result<(), Error> {
    if started.elapsed() > QUERY_TIME_LIMIT {
        return Err(Error::Query(QueryError {
            kind: mayfly_query::ErrorKind::Limit,
            position: None,
            message: format!(
                "the query ran longer than {} s; filter by partition key or narrow it",
                QUERY_TIME_LIMIT.as_secs()
            ),
        }));
    }
    reads.check_time()
}

impl Engine {
    /// One page of `walk` from `from` into `fill`, and where the next page starts (`None`
    /// when the walk or the query is done), with the run's counters there.
    pub(crate) fn drive_page<W: Walk>(
        &self,
        walk: &mut W,
        from: W::Pos,
        run: &mut Execution<'_, '_>,
        mut fill: PageFill,
        reads: &mut QueryReads,
    ) -> Result<Driven<W::Pos>, Error> {
        let started = Instant::now();
        let mut kept = from.clone();
        let mut done = false;
        let mut handoff = false;
        let stopped = walk.walk(self, from, reads, &mut |step, reads| {
            let (pos, stop) = match step {
                Step::Passed(pos) => (pos, None),
                Step::Unserved { pos, .. } => {
                    kept = pos;
                    handoff = true;
                    return Ok(true);
                }
                Step::Doc { pos, doc, size } => (pos, fill.feed(run, || doc, size, reads)?),
            };
            Ok(match stop {
                // Documents left out cost reading too: a page also ends on time.
                None => {
                    kept = pos;
                    started.elapsed() > PAGE_TIME_LIMIT
                }
                Some(Stop::Done) => {
                    done = true;
                    true
                }
                Some(Stop::After) => {
                    kept = pos;
                    true
                }
                Some(Stop::Before) => true,
            })
        })?;
        let counters = fill.counters(run);
        let mut page = fill.page;
        page.handoff = handoff;
        page.metrics.index_entries_examined += walk.examined().index_entries_examined;
        page.metrics.documents_examined += walk.examined().documents_examined;
        Ok(Driven {
            page,
            next: (stopped && !done).then_some((kept, counters)),
        })
    }

    /// Every document of `walk` into `run`, its results into `results` (a query that reads
    /// its whole scope).
    pub(crate) fn drive_all<W: Walk>(
        &self,
        walk: &mut W,
        from: W::Pos,
        run: &mut Execution<'_, '_>,
        results: &mut Vec<Value>,
        metrics: &mut QueryMetrics,
        reads: &mut QueryReads,
    ) -> Result<(), Error> {
        let mut fed = 0;
        walk.walk(self, from, reads, &mut |step, _| {
            let doc = match step {
                Step::Doc { doc, .. } => doc,
                Step::Passed(_) => return Ok(false),
                Step::Unserved { shard, .. } => {
                    return Err(Error::NotOwner { partition: shard });
                }
            };
            fed += 1;
            let flow = run.push_owned(doc)?;
            take_results(run, results)?;
            // Results a run streams are held here until the last page is sent.
            if results.len() > mayfly_query::MAX_HELD_ROWS {
                return Err(Error::Query(QueryError {
                    kind: mayfly_query::ErrorKind::Limit,
                    position: None,
                    message: format!(
                        "the query would hold more than {} results; add TOP or a filter",
                        mayfly_query::MAX_HELD_ROWS
                    ),
                }));
            }
            Ok(flow == Flow::Done)
        })?;
        metrics.documents_examined += fed + walk.examined().documents_examined;
        metrics.index_entries_examined += walk.examined().index_entries_examined;
        Ok(())
    }
}

/// Where a streaming page stops.
pub(crate) enum Stop {
    /// The run is done: the page is the last.
    Done,
    /// After the document just fed: the page is full.
    After,
    /// Before it: its results do not fit what the page could reserve.
    Before,
}

/// A streaming page being filled, within its size, its bytes and the memory `QueryReads` can
/// reserve: one fill for pages of documents and of index entries alike.
pub(crate) struct PageFill {
    pub(crate) page: QueryPage,
    /// What the results take, as they will travel.
    bytes: usize,
    /// The run's counters from before a document that was taken back.
    resume: Option<(u64, u64)>,
    page_size: usize,
    page_bytes: usize,
}

impl PageFill {
    pub(crate) fn new(page_size: usize, page_bytes: usize, index: Option<String>) -> Self {
        PageFill {
            page: QueryPage {
                results: Vec::new(),
                continuation: None,
                metrics: QueryMetrics {
                    index,
                    ..QueryMetrics::default()
                },
                handoff: false,
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
    pub(crate) fn feed(
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
    pub(crate) fn counters(&self, run: &mayfly_query::Execution<'_, '_>) -> (u64, u64) {
        self.resume.unwrap_or_else(|| run.counters())
    }
}
