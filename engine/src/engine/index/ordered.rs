//! `ORDER BY` on one indexed path as an index walk, in Cosmos DB's type order: the documents
//! undefined at the path first (found in memory by their path bits, in key order), then the
//! path's entries merged across shards in term order. Entries whose terms stand for several
//! values (long strings sharing a prefix, arrays, objects) are read as a group and sorted by
//! their documents' values. Descending is the exact reverse.
//!
//! A walk can stop after any document and resume from its [`OrderedPos`], so an ordered
//! query streams page by page, however many results it has.

use std::{cmp::Ordering, collections::VecDeque, time::Instant};

use mayfly_query::{
    QueryError,
    value::{approximate_size, sort_order},
};
use serde_json::Value;

use super::{
    path_stats::OrderSupport,
    plan::IndexPlan,
    read::{ENTRY_BATCH, entry_step, in_scope, named_by},
    terms::{is_orderable, value_at},
};
use crate::engine::{
    CollectionInfo, Engine, Error, FeedScope, INLINE_READS, Millis, QueryReads,
    document::as_document,
    walk::{QueryMetrics, Sink, Step, Walk, check_time},
};
use crate::storage::{DocKey, IndexEntry, IndexRange, prefix_end};

/// Entries or keys an ordered walk first asks each shard for.
const FIRST_BATCH: usize = 16;
/// The most undefined documents' keys asked for at once: finding them visits every slot of
/// the shard, so they are taken in large batches (keys are small).
const UNDEFINED_BATCH: usize = 4096;

/// Where an ordered walk stands: just after the document it last fed.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedPos {
    /// Among the documents undefined at the path, after this key (`None`: at their start).
    Undefined(Option<DocKey>),
    /// Among the entries, after this one (`None`: at their start).
    Entries(Option<IndexEntry>),
    /// In the group of entries with this term (sorted by value, then key), after the document
    /// with this key and value at the path (`None`: a value too large to carry, found again
    /// by the key).
    Group {
        term: Vec<u8>,
        last: DocKey,
        value: Option<Value>,
    },
}

impl OrderedPos {
    /// Where a walk starts: undefined sorts first.
    pub(crate) fn start(descending: bool) -> Self {
        if descending {
            OrderedPos::Entries(None)
        } else {
            OrderedPos::Undefined(None)
        }
    }
}

/// An ordered walk over the scope's shards.
pub(crate) struct OrderedWalk<'a> {
    pub(crate) info: &'a CollectionInfo,
    pub(crate) plan: &'a IndexPlan,
    pub(crate) scope: &'a FeedScope,
    pub(crate) descending: bool,
    pub(crate) read_at: Millis,
    /// The scope's shards, first and last.
    pub(crate) shards: (usize, usize),
    /// The shards with documents undefined at the path, and the path's bit in each (see
    /// [`Engine::order_support`]).
    pub(crate) undefined: Vec<(usize, u8)>,
    /// Entries read, and documents read but not fed (gone, or moved off their entry).
    pub(crate) examined: QueryMetrics,
    pub(crate) started: Instant,
}

/// The most a group of tied entries may hold of its documents, as stored (the in-memory
/// sort's limit).
const MAX_GROUP_BYTES: usize = 64 << 20;
/// The largest value a continuation carries to resume a group after; a larger one is found
/// again by its document's key.
const MAX_VALUE_IN_CURSOR: usize = 4096;

/// One document of a group of tied entries.
struct Member {
    key: DocKey,
    /// Its value at the path.
    value: Option<Value>,
    doc: Value,
    size: usize,
}

/// Where a walk stands in one shard.
struct Head<T> {
    shard: usize,
    buffer: VecDeque<T>,
    /// The last one read: the next read starts after it.
    after: Option<T>,
    exhausted: bool,
    /// What the next read asks for: few at first (a `TOP 10` needs about 10 in all),
    /// doubling up to a most.
    batch: usize,
}

impl<T> Head<T> {
    fn new(shard: usize, batch: usize, after: Option<T>) -> Self {
        Head {
            shard,
            buffer: VecDeque::new(),
            after,
            exhausted: false,
            batch,
        }
    }

    fn took(&mut self, read: usize, most: usize) {
        self.exhausted = read < self.batch;
        self.batch = (self.batch * 2).min(most);
    }
}

/// The order entries are stored in: by term, then by the document key's encoding (each shard
/// resumes after an entry by it, so the merge across shards must agree).
fn entry_order(a: &IndexEntry, b: &IndexEntry) -> Ordering {
    a.term.cmp(&b.term).then_with(|| {
        let encoded = |k: &DocKey| {
            let mut out = Vec::new();
            k.partition_key.encode_ordered(&mut out);
            out.extend_from_slice(k.id.as_str().as_bytes());
            out
        };
        encoded(&a.key).cmp(&encoded(&b.key))
    })
}

/// The head whose front comes first in the walk's direction.
fn first_head<T>(
    heads: &[Head<T>],
    descending: bool,
    order: impl Fn(&T, &T) -> Ordering,
) -> Option<usize> {
    heads
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.buffer.front().map(|x| (i, x)))
        .reduce(|a, b| {
            let o = order(b.1, a.1);
            let b_first = if descending { o.is_gt() } else { o.is_lt() };
            if b_first { b } else { a }
        })
        .map(|(i, _)| i)
}

impl Engine {
    /// Per shard in `first..=last`, how an ordered walk finds the documents undefined at the
    /// plan's path (the shards that have some, with the path's bit); `None` if some shard
    /// cannot tell (a path without a bit, or uncounted).
    pub(crate) fn order_support(
        &self,
        info: &CollectionInfo,
        plan: &IndexPlan,
        (first, last): (usize, usize),
    ) -> Option<Vec<(usize, u8)>> {
        let mut undefined = Vec::new();
        for shard in first..=last {
            match self.inner.shards[shard].order_support(info, &plan.path)? {
                OrderSupport { undefined: 0, .. } => {}
                OrderSupport { bit: Some(bit), .. } => undefined.push((shard, bit)),
                OrderSupport { bit: None, .. } => return None,
            }
        }
        Some(undefined)
    }
}

impl Walk for OrderedWalk<'_> {
    type Pos = OrderedPos;

    fn walk(
        &mut self,
        engine: &Engine,
        from: OrderedPos,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, OrderedPos>,
    ) -> Result<bool, Error> {
        match (from, self.descending) {
            (OrderedPos::Undefined(after), false) => Ok(self
                .undefined(engine, after, reads, sink)?
                || self.entries(engine, OrderedPos::Entries(None), reads, sink)?),
            (OrderedPos::Undefined(after), true) => self.undefined(engine, after, reads, sink),
            (from, false) => self.entries(engine, from, reads, sink),
            (from, true) => Ok(self.entries(engine, from, reads, sink)?
                || self.undefined(engine, None, reads, sink)?),
        }
    }

    fn examined(&self) -> &QueryMetrics {
        &self.examined
    }
}

impl OrderedWalk<'_> {
    /// The documents without the path's bit, after `after` in key order (reversed if
    /// descending), merged across shards.
    fn undefined(
        &mut self,
        engine: &Engine,
        after: Option<DocKey>,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, OrderedPos>,
    ) -> Result<bool, Error> {
        let shards = std::mem::take(&mut self.undefined);
        let fed = self.undefined_of(engine, &shards, after, reads, sink);
        self.undefined = shards;
        fed
    }

    fn undefined_of(
        &mut self,
        engine: &Engine,
        shards: &[(usize, u8)],
        after: Option<DocKey>,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, OrderedPos>,
    ) -> Result<bool, Error> {
        let mut heads: Vec<Head<DocKey>> = shards
            .iter()
            .map(|&(shard, _)| Head::new(shard, FIRST_BATCH, after.clone()))
            .collect();
        loop {
            check_time(self.started, reads)?;
            for (head, &(_, bit)) in heads.iter_mut().zip(shards) {
                if head.buffer.is_empty() && !head.exhausted {
                    let keys = engine.inner.shards[head.shard].undefined_keys(
                        self.info,
                        bit,
                        head.after.as_ref(),
                        self.descending,
                        head.batch,
                        self.scope,
                    );
                    reads.spend(keys.len())?;
                    head.took(keys.len(), UNDEFINED_BATCH);
                    head.after = keys.last().cloned();
                    head.buffer = keys
                        .into_iter()
                        .filter(|k| in_scope(self.scope, k))
                        .collect();
                }
            }
            let Some(i) = first_head(&heads, self.descending, DocKey::cmp) else {
                if heads.iter().all(|h| h.exhausted) {
                    return Ok(false);
                }
                continue;
            };
            let head = &mut heads[i];
            let key = head.buffer.pop_front().expect("has a front");
            let shard = head.shard;
            reads.spend(1)?;
            let (views, settle) =
                engine.inner.shards[shard].fetch_live(self.info, &[key], self.read_at)?;
            reads.reflect(settle);
            for view in views {
                let size = view.body.len();
                let pos = OrderedPos::Undefined(Some(view.key.clone()));
                let doc = as_document(&view);
                let body = doc.as_object().expect("documents are objects");
                // Written with the path since its key was found: its entry feeds it.
                let step = if value_at(body, &self.plan.path).is_some() {
                    self.examined.documents_examined += 1;
                    Step::Passed(pos)
                } else {
                    Step::Doc { pos, doc, size }
                };
                if sink(step, reads)? {
                    return Ok(true);
                }
            }
        }
    }

    /// The path's entries from `from` (an `Entries` or `Group` position) on, merged across
    /// shards in term order.
    fn entries(
        &mut self,
        engine: &Engine,
        from: OrderedPos,
        reads: &mut QueryReads,
        sink: &mut Sink<'_, OrderedPos>,
    ) -> Result<bool, Error> {
        let (first, last) = self.shards;
        let range = &self.plan.ranges[0];
        let (mut low, mut high) = (range.low.clone(), range.high.clone());
        let mut after = None;
        // A group is read again from its term, and resumed after the last document fed.
        let mut resume_group = None;
        match from {
            OrderedPos::Entries(entry) => after = entry,
            OrderedPos::Group { term, last, value } => {
                if self.descending {
                    high = prefix_end(&term).unwrap_or(high).min(range.high.clone());
                } else {
                    low = term.clone().max(low);
                }
                resume_group = Some((term, last, value));
            }
            OrderedPos::Undefined(_) => unreachable!("undefined documents are not entries"),
        }
        // With many shards, a smaller first read each keeps a `TOP 10` within an inline
        // run's reads.
        let first_batch =
            FIRST_BATCH.min((INLINE_READS as usize / (2 * (last - first + 1))).max(2));
        let mut heads: Vec<Head<IndexEntry>> = (first..=last)
            .map(|shard| Head::new(shard, first_batch, after.clone()))
            .collect();
        let bounds = (low, high);
        loop {
            check_time(self.started, reads)?;
            for head in &mut heads {
                self.refill(engine, &bounds, head, reads)?;
            }
            let Some(i) = first_head(&heads, self.descending, entry_order) else {
                if heads.iter().all(|h| h.exhausted || !h.buffer.is_empty()) {
                    return Ok(false);
                }
                // A partition's walk has one shard, whose last batch held only other
                // partitions' entries: a page may end past them (and on time).
                if let ([head], FeedScope::Partition(_)) = (&heads[..], self.scope)
                    && let Some(last) = &head.after
                    && resume_group.is_none()
                    && sink(Step::Passed(OrderedPos::Entries(Some(last.clone()))), reads)?
                {
                    return Ok(true);
                }
                continue;
            };
            let entry = heads[i].buffer.pop_front().expect("has a front");
            let shard = heads[i].shard;
            let resume = resume_group.take().filter(|(term, ..)| *term == entry.term);
            if !is_orderable(&entry.term) {
                let term = entry.term.clone();
                let group = self.tied_group(engine, &bounds, &mut heads, shard, entry, reads)?;
                let start = match resume {
                    Some((_, last, value)) => self.group_resumes_at(&group, &last, value)?,
                    None => 0,
                };
                for member in group.into_iter().skip(start) {
                    let value = member
                        .value
                        .filter(|v| approximate_size(v) <= MAX_VALUE_IN_CURSOR);
                    let pos = OrderedPos::Group {
                        term: term.clone(),
                        last: member.key,
                        value,
                    };
                    let (doc, size) = (member.doc, member.size);
                    if sink(Step::Doc { pos, doc, size }, reads)? {
                        return Ok(true);
                    }
                }
                continue;
            }
            for (entry, view) in
                engine.entry_documents(self.info, shard, vec![entry], self.read_at, reads)?
            {
                let pos = OrderedPos::Entries(Some(entry.clone()));
                let step = entry_step(&entry, view, self.plan, pos, &mut self.examined);
                if sink(step, reads)? {
                    return Ok(true);
                }
            }
        }
    }

    /// Reads a head's next entries if it has none buffered.
    fn refill(
        &mut self,
        engine: &Engine,
        (low, high): &(Vec<u8>, Vec<u8>),
        head: &mut Head<IndexEntry>,
        reads: &mut QueryReads,
    ) -> Result<(), Error> {
        if !head.buffer.is_empty() || head.exhausted {
            return Ok(());
        }
        let entries = engine.inner.shards[head.shard].scan_index(
            self.info,
            IndexRange {
                low,
                high: Some(high),
                descending: self.descending,
                after: head.after.as_ref(),
            },
            head.batch,
        )?;
        self.examined.index_entries_examined += entries.len() as u64;
        reads.spend(entries.len())?;
        head.took(entries.len(), ENTRY_BATCH);
        head.after = entries.last().cloned();
        head.buffer = entries
            .into_iter()
            .filter(|e| in_scope(self.scope, &e.key))
            .collect();
        Ok(())
    }

    /// Where a group resumes after the document `last` with `value` at the path: the first
    /// member after it in the walk's order. Without the value (it was too large to carry), by
    /// the key, if that document is still in the group with a value there.
    fn group_resumes_at(
        &self,
        group: &[Member],
        last: &DocKey,
        value: Option<Value>,
    ) -> Result<usize, Error> {
        match value {
            Some(value) => Ok(group
                .iter()
                .position(|m| {
                    let o = sort_order(m.value.as_ref(), Some(&value)).then_with(|| m.key.cmp(last));
                    if self.descending { o.is_lt() } else { o.is_gt() }
                })
                .unwrap_or(group.len())),
            None => group
                .iter()
                .position(|m| m.key == *last)
                .map(|i| i + 1)
                .ok_or(Error::ContinuationStale {
                    reason: "the document this ORDER BY's page ended at changed or is gone, and its value was too large to carry in the continuation; run the query again",
                }),
        }
    }

    /// Every live document whose entry has `first`'s term (which stands for several values),
    /// in the order of their values at the path, then of their keys (reversed if descending).
    /// At most [`mayfly_query::MAX_HELD_ROWS`] documents and [`MAX_GROUP_BYTES`] are held.
    fn tied_group(
        &mut self,
        engine: &Engine,
        bounds: &(Vec<u8>, Vec<u8>),
        heads: &mut [Head<IndexEntry>],
        shard: usize,
        first: IndexEntry,
        reads: &mut QueryReads,
    ) -> Result<Vec<Member>, Error> {
        let term = first.term.clone();
        let mut by_shard: Vec<(usize, Vec<IndexEntry>)> = vec![(shard, vec![first])];
        let mut size = 1;
        for head in heads.iter_mut() {
            loop {
                self.refill(engine, bounds, head, reads)?;
                match head.buffer.front() {
                    Some(e) if e.term == term => {
                        let e = head.buffer.pop_front().expect("has a front");
                        match by_shard.iter_mut().find(|(s, _)| *s == head.shard) {
                            Some((_, entries)) => entries.push(e),
                            None => by_shard.push((head.shard, vec![e])),
                        }
                        size += 1;
                        if size > mayfly_query::MAX_HELD_ROWS {
                            return Err(Error::Query(QueryError {
                                kind: mayfly_query::ErrorKind::Limit,
                                position: None,
                                message: format!(
                                    "more than {} documents have arrays, objects or long strings that the index cannot tell apart at the ORDER BY path; filter further",
                                    mayfly_query::MAX_HELD_ROWS
                                ),
                            }));
                        }
                    }
                    _ => break,
                }
                check_time(self.started, reads)?;
            }
        }
        let too_large = || {
            Error::Query(QueryError {
                kind: mayfly_query::ErrorKind::Limit,
                position: None,
                message: format!(
                    "the documents whose arrays, objects or long strings the index cannot tell apart at the ORDER BY path take more than {} MiB; filter further",
                    MAX_GROUP_BYTES >> 20
                ),
            })
        };
        let (mut group, mut bytes) = (Vec::with_capacity(size), 0usize);
        for (shard, entries) in by_shard {
            for (entry, view) in
                engine.entry_documents(self.info, shard, entries, self.read_at, reads)?
            {
                let key = view.key.clone();
                let size = view.body.len();
                bytes = bytes.saturating_add(size);
                if bytes > MAX_GROUP_BYTES {
                    return Err(too_large());
                }
                match named_by(&entry, view, self.plan) {
                    Some(doc) => {
                        let path = &self.plan.path;
                        let body = doc.as_object().expect("documents are objects");
                        let value = value_at(body, path).cloned();
                        group.push(Member {
                            key,
                            value,
                            doc,
                            size,
                        });
                    }
                    None => self.examined.documents_examined += 1,
                }
            }
        }
        group.sort_by(|a, b| {
            sort_order(a.value.as_ref(), b.value.as_ref()).then_with(|| a.key.cmp(&b.key))
        });
        if self.descending {
            group.reverse();
        }
        Ok(group)
    }
}
