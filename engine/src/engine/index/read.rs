//! Queries that read the index: the documents a plan's entries name, judged at the query's
//! clock reading like any scanned document, so an expired one is left out whatever the purge
//! is doing; and counts from entries or metadata alone, without reading document bodies.

use std::time::Instant;

use serde_json::Value;

use super::{plan::IndexPlan, terms::term_at};
use crate::engine::{
    CollectionInfo, Engine, Error, FeedScope, Millis, QueryReads,
    document::{DocumentView, as_document},
    walk::{QueryMetrics, Sink, Step, Walk, check_time},
};
use crate::storage::{DocKey, IndexEntry, IndexRange, prefix_end};

/// Index entries read at a time.
pub(crate) const ENTRY_BATCH: usize = 256;

/// Where an index read stands in one shard's ranges.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryCursor {
    pub(crate) shard: usize,
    pub(crate) range: usize,
    pub(crate) after: Option<IndexEntry>,
}

/// A batch of entries from one shard and range, and where the next one starts.
pub(crate) struct EntryBatch {
    pub(crate) entries: Vec<IndexEntry>,
    /// `None`: the plan has no entries left in the scope.
    pub(crate) next: Option<EntryCursor>,
}

/// Whether a key is in the scope (entries of a shard hold every partition's).
pub(crate) fn in_scope(scope: &FeedScope, key: &DocKey) -> bool {
    match scope {
        FeedScope::Collection => true,
        FeedScope::Partition(pk) => key.partition_key == *pk,
    }
}

/// A walk's step for a document fetched by its entry: the document, or (if it moved off the
/// entry) a step past it, counted as examined.
pub(crate) fn entry_step<P>(
    entry: &IndexEntry,
    view: DocumentView,
    plan: &IndexPlan,
    pos: P,
    examined: &mut QueryMetrics,
) -> Step<P> {
    let size = view.body.len();
    match named_by(entry, view, plan) {
        Some(doc) => Step::Doc { pos, doc, size },
        None => {
            examined.documents_examined += 1;
            Step::Passed(pos)
        }
    }
}

/// A fetched document as queries see it, if it still has the entry it was found by. One
/// rewritten after its entry was read (or, in a `lazy` collection, not yet indexed since) may
/// have left that term: it is skipped there, so a document is never fed twice (at its old and
/// new entry) nor out of an ordered read's order.
pub(crate) fn named_by(entry: &IndexEntry, view: DocumentView, plan: &IndexPlan) -> Option<Value> {
    let doc = as_document(&view);
    let body = doc.as_object().expect("documents are objects");
    (term_at(body, &plan.path).as_ref() == Some(&entry.term)).then_some(doc)
}

impl Engine {
    /// The next batch of a plan's entries from `at`, ascending, in the scope's shards up to
    /// `last`. Entries of other partitions are dropped (they still count as examined).
    #[allow(
        clippy::too_many_arguments,
        reason = "one read's inputs, each distinct"
    )]
    pub(crate) fn entry_batch(
        &self,
        info: &CollectionInfo,
        plan: &IndexPlan,
        scope: &FeedScope,
        at: &EntryCursor,
        last: usize,
        examined: &mut u64,
        reads: &mut QueryReads,
    ) -> Result<EntryBatch, Error> {
        let range = &plan.ranges[at.range];
        // One term's entries are in partition key order: a partition's are a range of theirs.
        let narrowed = match scope {
            FeedScope::Partition(pk) if range.one_term => {
                let mut low = range.low.clone();
                pk.encode_ordered(&mut low);
                prefix_end(&low).map(|high| (low, high))
            }
            _ => None,
        };
        let (low, high) = match &narrowed {
            Some((low, high)) => (low, high),
            None => (&range.low, &range.high),
        };
        let entries = self.inner.shards[at.shard].scan_index(
            info,
            IndexRange {
                low,
                high: Some(high),
                descending: false,
                after: at.after.as_ref(),
            },
            ENTRY_BATCH,
        )?;
        *examined += entries.len() as u64;
        reads.spend(entries.len())?;
        let next = if entries.len() == ENTRY_BATCH {
            Some(EntryCursor {
                after: entries.last().cloned(),
                ..at.clone()
            })
        } else if at.range + 1 < plan.ranges.len() {
            Some(EntryCursor {
                shard: at.shard,
                range: at.range + 1,
                after: None,
            })
        } else if at.shard < last {
            Some(EntryCursor {
                shard: at.shard + 1,
                range: 0,
                after: None,
            })
        } else {
            None
        };
        let entries = entries
            .into_iter()
            .filter(|e| in_scope(scope, &e.key))
            .collect();
        Ok(EntryBatch { entries, next })
    }

    /// The live documents an entry batch names, with the entry each came from.
    pub(crate) fn entry_documents(
        &self,
        info: &CollectionInfo,
        shard: usize,
        entries: Vec<IndexEntry>,
        read_at: Millis,
        reads: &mut QueryReads,
    ) -> Result<Vec<(IndexEntry, DocumentView)>, Error> {
        reads.spend(entries.len())?;
        let keys: Vec<DocKey> = entries.iter().map(|e| e.key.clone()).collect();
        let (views, settle) = self.inner.shards[shard].fetch_live(info, &keys, read_at)?;
        reads.reflect(settle);
        // Views come in entry order, without the entries whose documents are gone.
        let mut entries = entries.into_iter();
        let mut out = Vec::with_capacity(views.len());
        for view in views {
            for entry in entries.by_ref() {
                if entry.key == view.key {
                    out.push((entry, view));
                    break;
                }
            }
        }
        Ok(out)
    }

    /// `SELECT VALUE COUNT(1)` with the plan's filter (or none), from entries or metadata
    /// alone; `None` if it must read documents.
    #[allow(clippy::too_many_arguments, reason = "one run's inputs, each distinct")]
    pub(crate) fn count_without_bodies(
        &self,
        info: &CollectionInfo,
        plan: Option<&IndexPlan>,
        scope: &FeedScope,
        (first, last): (usize, usize),
        read_at: Millis,
        metrics: &mut QueryMetrics,
        reads: &mut QueryReads,
    ) -> Result<Option<u64>, Error> {
        let mut count = 0;
        match plan {
            // Every live document, counted in memory.
            None if matches!(scope, FeedScope::Collection) => {
                reads.unbounded()?;
                for shard in first..=last {
                    let (n, settle) = self.inner.shards[shard].count_live(info, read_at)?;
                    count += n;
                    reads.reflect(settle);
                }
            }
            Some(plan) if plan.counts_exactly() && plan.ordered.is_none() => {
                let mut at = Some(EntryCursor {
                    shard: first,
                    range: 0,
                    after: None,
                });
                let started = Instant::now();
                while let Some(cursor) = at {
                    check_time(started, reads)?;
                    let batch = self.entry_batch(
                        info,
                        plan,
                        scope,
                        &cursor,
                        last,
                        &mut metrics.index_entries_examined,
                        reads,
                    )?;
                    let keys: Vec<DocKey> = batch.entries.into_iter().map(|e| e.key).collect();
                    let (n, settle) =
                        self.inner.shards[cursor.shard].count_live_keys(info, &keys, read_at)?;
                    count += n;
                    reads.reflect(settle);
                    at = batch.next;
                }
            }
            _ => return Ok(None),
        }
        Ok(Some(count))
    }
}

/// The documents a plan's entries name, in entry order: shard by shard, range by range.
pub(crate) struct IndexWalk<'a> {
    info: &'a CollectionInfo,
    plan: &'a IndexPlan,
    scope: &'a FeedScope,
    read_at: Millis,
    /// The scope's last shard.
    last: usize,
    examined: QueryMetrics,
    started: Instant,
}

impl<'a> IndexWalk<'a> {
    pub(crate) fn new(
        info: &'a CollectionInfo,
        plan: &'a IndexPlan,
        scope: &'a FeedScope,
        read_at: Millis,
        last: usize,
    ) -> Self {
        IndexWalk {
            info,
            plan,
            scope,
            read_at,
            last,
            examined: QueryMetrics::default(),
            started: Instant::now(),
        }
    }
}

impl Walk for IndexWalk<'_> {
    type Pos = EntryCursor;

    fn walk(
        &mut self,
        engine: &Engine,
        from: EntryCursor,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, EntryCursor>,
    ) -> Result<bool, Error> {
        let mut at = from;
        loop {
            check_time(self.started, reads)?;
            let batch = engine.entry_batch(
                self.info,
                self.plan,
                self.scope,
                &at,
                self.last,
                &mut self.examined.index_entries_examined,
                reads,
            )?;
            for (entry, view) in
                engine.entry_documents(self.info, at.shard, batch.entries, self.read_at, reads)?
            {
                reads.check_time()?;
                let pos = EntryCursor {
                    after: Some(entry.clone()),
                    ..at.clone()
                };
                let step = entry_step(&entry, view, self.plan, pos, &mut self.examined);
                if sink(step, reads)? {
                    return Ok(true);
                }
            }
            let Some(next) = batch.next else {
                return Ok(false);
            };
            if next.shard != at.shard && !engine.serves(next.shard) {
                return sink(
                    Step::Unserved {
                        shard: next.shard,
                        pos: next,
                    },
                    reads,
                );
            }
            if sink(Step::Passed(next.clone()), reads)? {
                return Ok(true);
            }
            at = next;
        }
    }

    fn examined(&self) -> &QueryMetrics {
        &self.examined
    }
}
