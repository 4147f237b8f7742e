//! A cross-partition query in a cluster that reads its whole scope (`ORDER BY`, aggregates,
//! `GROUP BY`, `DISTINCT`, `OFFSET`): each partition's owner reads the documents the query's
//! plan selects from that partition ([`Engine::gather_documents`]), and the node the client
//! called runs the query once over all of them ([`Engine::query_gathered`]), so every clause
//! means what it means on a single node. A streaming query needs none of this: its pages
//! hand off from owner to owner (see [`super::QueryPage::handoff`]).

use serde_json::Value;

use super::{
    CollectionPath, Engine, Error, FeedScope, Millis, Outcome, QueryCursor, QueryReads, QuerySpec,
    feed::Cursor,
    index::read::{EntryCursor, IndexWalk},
    query::ScanWalk,
    query_reads::context,
    walk::{QueryMetrics, Sink, Step, Walk},
};

/// Documents a gather may collect for one query, in their stored size: the node running the
/// query holds them all at once.
pub const MAX_GATHERED_BYTES: usize = 64 * 1024 * 1024;

impl QueryCursor {
    /// The shard a streaming query's next page starts in; `None` for a cursor that is not a
    /// shard-by-shard walk.
    pub fn shard(&self) -> Option<usize> {
        match self {
            QueryCursor::Stream { cursor, .. } => Some(cursor.shard),
            QueryCursor::Index { at, .. } => Some(at.shard),
            QueryCursor::Ordered { .. } | QueryCursor::Offset(_) => None,
        }
    }
}

/// Refuses a gather past [`MAX_GATHERED_BYTES`].
pub fn gathered_too_much() -> Error {
    Error::Query(mayfly_query::QueryError {
        kind: mayfly_query::ErrorKind::Limit,
        position: None,
        message: format!(
            "a cross-partition query with ORDER BY, GROUP BY, DISTINCT, OFFSET or an aggregate gathers the documents its filter selects from every partition, at most {} MiB of them in a cluster; filter by partition key or narrow the filter",
            MAX_GATHERED_BYTES >> 20
        ),
    })
}

impl Engine {
    /// The one shard `scope` reads in `path`; `None` for the whole collection.
    pub fn scope_shard(
        &self,
        path: &CollectionPath,
        scope: &FeedScope,
    ) -> Result<Option<usize>, Error> {
        match scope {
            FeedScope::Collection => Ok(None),
            FeedScope::Partition(pk) => {
                let info = self.get_collection(path)?;
                Ok(Some(self.shard_index(&info, pk)))
            }
        }
    }

    /// The live documents of shard `shard` of `path` that `spec`'s plan selects (every live
    /// document where the plan reads no index), judged at this node's reading of the shard,
    /// as the query would be fed them. Refused with [`Error::NotOwner`] unless this node
    /// serves the shard. Blocks on storage: unless inline, call it off the async runtime.
    pub fn gather_documents(
        &self,
        path: &CollectionPath,
        spec: &QuerySpec,
        shard: usize,
        mut reads: QueryReads,
    ) -> Outcome<Vec<Value>> {
        let result = self.gather(path, spec, shard, &mut reads);
        Outcome::new(result.map_err(|e| reads.explain(e)), reads.settle_at)
    }

    fn gather(
        &self,
        path: &CollectionPath,
        spec: &QuerySpec,
        shard: usize,
        reads: &mut QueryReads,
    ) -> Result<Vec<Value>, Error> {
        let info = self.get_collection(path)?;
        if shard >= self.shard_count() {
            return Err(Error::NotOwner { partition: shard });
        }
        self.inner.shards[shard].check_serving()?;
        let read_at = self.shard_time(shard);
        let scope = FeedScope::Collection;
        let mut docs = Vec::new();
        let mut bytes = 0;
        let mut sink = |step: Step<_>, _: &QueryReads| match step {
            Step::Doc { doc, size, .. } => {
                bytes += size;
                if bytes > MAX_GATHERED_BYTES {
                    return Err(gathered_too_much());
                }
                docs.push(doc);
                Ok(false)
            }
            Step::Passed(_) => Ok(false),
            Step::Unserved { shard, .. } => Err(Error::NotOwner { partition: shard }),
        };
        // An ordered plan's index leaves out documents without the ordered path, which the
        // query still returns: those are read by the scan.
        match self
            .query_plan(&info, spec)?
            .filter(|p| p.ordered.is_none())
        {
            Some(plan) => {
                let mut walk = IndexWalk::new(&info, &plan, &scope, read_at, shard);
                let from = EntryCursor {
                    shard,
                    range: 0,
                    after: None,
                };
                walk.walk(self, from, reads, &mut forgetting(&mut sink))?;
            }
            None => {
                let mut walk = ScanWalk::new(&info, &scope, read_at, shard);
                let from = Cursor { shard, after: None };
                walk.walk(self, from, reads, &mut forgetting(&mut sink))?;
            }
        }
        Ok(docs)
    }

    /// Every result of `spec` over `docs` (what [`Engine::gather_documents`] read from each
    /// partition, in partition order), evaluated at `read_at`, with the run's metrics.
    pub fn query_gathered(
        &self,
        spec: &QuerySpec,
        docs: Vec<Value>,
        read_at: Millis,
        mut reads: QueryReads,
    ) -> Result<(Vec<Value>, QueryMetrics), Error> {
        let mut run = reads.execution(&spec.query, &spec.params, context(read_at))?;
        let mut results = Vec::new();
        let mut metrics = QueryMetrics::default();
        let mut walk = Gathered {
            docs,
            examined: QueryMetrics::default(),
        };
        self.drive_all(
            &mut walk,
            0,
            &mut run,
            &mut results,
            &mut metrics,
            &mut reads,
        )?;
        reads.check_time()?;
        results.extend(run.finish()?);
        metrics.results_returned = results.len() as u64;
        Ok((results, metrics))
    }
}

/// Adapts one document sink to a walk's positions (a gather keeps none).
fn forgetting<'s, P>(
    sink: &'s mut Sink<'_, ()>,
) -> impl FnMut(Step<P>, &QueryReads) -> Result<bool, Error> + 's {
    move |step, reads| sink(forget(step), reads)
}

fn forget<P>(step: Step<P>) -> Step<()> {
    match step {
        Step::Doc { doc, size, .. } => Step::Doc { pos: (), doc, size },
        Step::Passed(_) => Step::Passed(()),
        Step::Unserved { shard, .. } => Step::Unserved { pos: (), shard },
    }
}

/// Documents already read, fed in their order.
struct Gathered {
    docs: Vec<Value>,
    examined: QueryMetrics,
}

impl Walk for Gathered {
    type Pos = usize;

    fn walk(
        &mut self,
        _: &Engine,
        from: usize,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, usize>,
    ) -> Result<bool, Error> {
        for (i, doc) in std::mem::take(&mut self.docs)
            .into_iter()
            .enumerate()
            .skip(from)
        {
            reads.check_time()?;
            if sink(
                Step::Doc {
                    pos: i + 1,
                    doc,
                    size: 0,
                },
                reads,
            )? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn examined(&self) -> &QueryMetrics {
        &self.examined
    }
}
