//! Running a query over documents: rows from `FROM` and `JOIN`, filtered by `WHERE`, then
//! projected and streamed, or sorted (`ORDER BY`), grouped (`GROUP BY`, aggregates) or
//! de-duplicated (`DISTINCT`) once every document has been seen.

use std::{cmp::Ordering, collections::HashMap, collections::HashSet, fmt::Write as _};

use serde_json::{Map, Value};

use crate::{
    ast::{Aggregate, Expr, Query, Select, Step},
    error::QueryError,
    eval::{Env, Evaluator, truth},
    functions::Context,
    value::{Val, ValRef, approximate_size, number, sort_order, type_rank},
};

/// Most rows a query holds at once to sort, group or de-duplicate.
pub const MAX_HELD_ROWS: usize = 100_000;
/// Most bytes (roughly, as JSON) a query holds at once to sort, group or de-duplicate.
pub const MAX_HELD_BYTES: usize = 64 << 20;

/// Whether a query's results can be produced document by document, so that a page can end
/// after any document and resume from the next (no `ORDER BY`, grouping, aggregate or
/// `DISTINCT`).
pub fn is_streaming(query: &Query) -> bool {
    query.order_by.is_empty() && query.group_by.is_empty() && !query.aggregates && !query.distinct
}

/// Whether to go on feeding documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    More,
    /// `TOP` or `LIMIT` is reached: later documents cannot change the results.
    Done,
}

/// One run of a query: documents in, results out.
#[derive(Debug)]
pub struct Execution<'q, 'p> {
    eval: Evaluator<'p>,
    sink: Sink<'q>,
}

impl<'q, 'p> Execution<'q, 'p> {
    /// Starts `query` with `params` (names with their `@`), at the clock reading in `context`.
    pub fn new(
        query: &'q Query,
        params: &'p Map<String, Value>,
        context: Context,
    ) -> Result<Self, QueryError> {
        let eval = Evaluator::new(context, params);
        for name in query.parameters() {
            eval.param(name)?;
        }
        let sink = Sink::new(query, &eval)?;
        Ok(Execution { eval, sink })
    }

    /// Continues a streaming run that already skipped `skipped` rows (for `OFFSET`) and
    /// returned `returned` (for `TOP`/`LIMIT`) in earlier pages.
    pub fn resume(mut self, skipped: u64, returned: u64) -> Self {
        self.sink.skipped = skipped;
        self.sink.returned = returned;
        self
    }

    /// Treats `ORDER BY` as satisfied by the order documents arrive in (the caller reads them
    /// from an index in that order): results stream, and `TOP` ends the run early. Only for a
    /// query without grouping, aggregates or `DISTINCT`, ordered by one key.
    #[must_use]
    pub fn presorted(mut self) -> Self {
        if self.sink.mode == Mode::Sort {
            self.sink.mode = Mode::Stream;
        }
        self
    }

    /// Stops the run with an [`crate::ErrorKind::Interrupted`] error once `deadline` has
    /// passed (looked at every few hundred evaluation steps and rows): for a caller that may
    /// only spend so long where it runs the query, and runs it again elsewhere if it must.
    #[must_use]
    pub fn interrupt_at(mut self, deadline: std::time::Instant) -> Self {
        self.eval.deadline = Some(deadline);
        self
    }

    /// Stops the run with an [`crate::ErrorKind::Interrupted`] error once `stop` says so
    /// (asked as often as the deadline of [`Self::interrupt_at`] is looked at): for a caller
    /// whose client left, or that is shutting down.
    #[must_use]
    pub fn interrupt_when(mut self, stop: impl Fn() -> bool + 'p) -> Self {
        self.eval.stop = Some(crate::eval::Stop(Box::new(stop)));
        self
    }

    /// Rows skipped and results returned so far, for a continuation.
    pub fn counters(&self) -> (u64, u64) {
        (self.sink.skipped, self.sink.returned)
    }

    /// Feeds one document (the body with its system properties).
    pub fn push(&mut self, document: &Value) -> Result<Flow, QueryError> {
        self.feed(document, |eval, sink, env| sink.accept(eval, env))
    }

    /// Binds `document`'s rows, filtered, handing each to `on_row`.
    fn feed(
        &mut self,
        document: &Value,
        mut on_row: impl FnMut(&Evaluator<'p>, &mut Sink<'q>, &Env<'_>) -> Result<Flow, QueryError>,
    ) -> Result<Flow, QueryError> {
        if self.sink.done() {
            return Ok(Flow::Done);
        }
        self.eval.reset_budget();
        let (eval, sink) = (&self.eval, &mut self.sink);
        rows(eval, sink.query, None, Some(document), &mut |env| {
            on_row(eval, sink, env)
        })?;
        Ok(self.sink.flow())
    }

    /// [`Self::push`] for a document the caller is done with: a streaming `SELECT * FROM c`
    /// without joins (the common "documents matching a filter") returns the document itself,
    /// not a copy.
    pub fn push_owned(&mut self, document: Value) -> Result<Flow, QueryError> {
        let query = self.sink.query;
        let whole_document = matches!(query.select, Select::Star)
            && self.sink.mode == Mode::Stream
            && query.joins.is_empty()
            && query
                .from
                .as_ref()
                .is_some_and(|f| f.root.is_none() && f.path.is_empty() && !f.iterate);
        if !whole_document {
            return self.push(&document);
        }
        // Without joins the document binds one row: if it passes the filter, it is the result.
        let mut matched = false;
        self.feed(&document, |_, _, _| {
            matched = true;
            Ok(Flow::More)
        })?;
        if matched {
            self.sink.emit(document)?;
        }
        Ok(self.sink.flow())
    }

    /// Results ready now (a streaming query's, as documents are pushed).
    pub fn take_ready(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.sink.out)
    }

    /// Every result not yet taken, once all documents were pushed.
    pub fn finish(mut self) -> Result<Vec<Value>, QueryError> {
        self.sink.finish(&self.eval)?;
        Ok(self.sink.out)
    }
}

impl Evaluator<'_> {
    /// Runs a subquery for the row `env`, handing each result to `emit` until it returns
    /// false.
    pub(crate) fn subquery(
        &self,
        query: &Query,
        env: Option<&Env<'_>>,
        emit: &mut dyn FnMut(Value) -> bool,
    ) -> Result<(), QueryError> {
        let mut sink = Sink::new(query, self)?;
        let streaming = sink.mode == Mode::Stream;
        let mut stopped = false;
        rows(self, query, env, None, &mut |row| {
            let flow = sink.accept(self, row)?;
            if streaming {
                for v in sink.out.drain(..) {
                    if !emit(v) {
                        stopped = true;
                        return Ok(Flow::Done);
                    }
                }
            }
            Ok(flow)
        })?;
        if stopped {
            return Ok(());
        }
        sink.finish(self)?;
        for v in sink.out {
            if !emit(v) {
                break;
            }
        }
        Ok(())
    }
}

/// Enumerates the rows of `query`, each passing `WHERE`: from `document` at the top level, or
/// from an alias of `outer` in a subquery.
fn rows<'e>(
    eval: &Evaluator<'_>,
    query: &Query,
    outer: Option<&Env<'e>>,
    document: Option<&'e Value>,
    f: &mut dyn FnMut(&Env<'_>) -> Result<Flow, QueryError>,
) -> Result<Flow, QueryError> {
    let Some(from) = &query.from else {
        // No FROM: one row, seeing the outer query's aliases.
        let empty = Value::Null;
        let env = match outer {
            Some(o) => *o,
            None => Env {
                slot: usize::MAX,
                value: &empty,
                parent: None,
            },
        };
        return joins(eval, query, 0, &env, f);
    };
    let start = match from.root {
        Some(slot) => outer.and_then(|o| o.get(slot)),
        None => document,
    };
    let Some(source) = start.and_then(|v| walk(v, &from.path)) else {
        return Ok(Flow::More);
    };
    let mut bind = |value: &Value| -> Result<Flow, QueryError> {
        eval.charge_row()?;
        let env = Env {
            slot: from.slot,
            value,
            parent: outer,
        };
        joins(eval, query, 0, &env, f)
    };
    if from.iterate {
        if let Value::Array(items) = source {
            for item in items {
                if bind(item)? == Flow::Done {
                    return Ok(Flow::Done);
                }
            }
        }
        Ok(Flow::More)
    } else {
        bind(source)
    }
}

/// The value at `path` below `value`.
fn walk<'v>(mut value: &'v Value, path: &[Step]) -> Option<&'v Value> {
    for step in path {
        value = match (step, value) {
            (Step::Property(p), Value::Object(m)) => m.get(p)?,
            (Step::Index(i), Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(value)
}

/// Binds the joins from `index` on, then filters.
fn joins(
    eval: &Evaluator<'_>,
    query: &Query,
    index: usize,
    env: &Env<'_>,
    f: &mut dyn FnMut(&Env<'_>) -> Result<Flow, QueryError>,
) -> Result<Flow, QueryError> {
    let Some(join) = query.joins.get(index) else {
        if let Some(filter) = &query.filter
            && truth(&eval.eval(filter, Some(env))?) != Some(true)
        {
            return Ok(Flow::More);
        }
        return f(env);
    };
    let source = eval.eval(&join.source, Some(env))?;
    if let Val::Json(Value::Array(items)) = &source {
        for item in items {
            eval.charge_row()?;
            let inner = Env {
                slot: join.slot,
                value: item,
                parent: Some(env),
            };
            if joins(eval, query, index + 1, &inner, f)? == Flow::Done {
                return Ok(Flow::Done);
            }
        }
    }
    Ok(Flow::More)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Stream,
    Sort,
    Group,
}

/// Where rows go: projected and counted, or held for sorting or grouping.
#[derive(Debug)]
struct Sink<'q> {
    query: &'q Query,
    mode: Mode,
    offset: u64,
    /// At most this many results (`TOP` and `LIMIT` together).
    limit: Option<u64>,
    skipped: u64,
    returned: u64,
    seen: HashSet<String>,
    sorted: Vec<(Vec<Val>, Value)>,
    /// Approximate bytes of what `sorted`, `groups` and `seen` hold.
    held_bytes: usize,
    groups: Vec<Group>,
    group_index: HashMap<String, usize>,
    out: Vec<Value>,
}

#[derive(Debug)]
struct Group {
    keys: Vec<Val>,
    accumulators: Vec<Accumulator>,
}

impl<'q> Sink<'q> {
    fn new(query: &'q Query, eval: &Evaluator<'_>) -> Result<Self, QueryError> {
        let count =
            |e: &Option<crate::ast::Expr>, clause: &str| -> Result<Option<u64>, QueryError> {
                let Some(e) = e else { return Ok(None) };
                match eval.eval(e, None)? {
                    Val::Json(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
                    Val::Json(Value::Number(n))
                        if n.as_f64().is_some_and(|f| f >= 0.0 && f.fract() == 0.0) =>
                    {
                        Ok(Some(u64::MAX))
                    }
                    other => Err(QueryError::invalid(
                        None,
                        format!(
                            "{clause} takes a non-negative integer, not {}",
                            crate::value::type_name(&other)
                        ),
                    )),
                }
            };
        let top = count(&query.top, "TOP")?;
        let (offset, limit) = match &query.offset_limit {
            Some((o, l)) => (
                count(&Some(o.clone()), "OFFSET")?.unwrap_or(0),
                count(&Some(l.clone()), "LIMIT")?,
            ),
            None => (0, None),
        };
        let limit = match (top, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mode = if query.aggregates || !query.group_by.is_empty() {
            Mode::Group
        } else if !query.order_by.is_empty() {
            Mode::Sort
        } else {
            Mode::Stream
        };
        Ok(Sink {
            query,
            mode,
            offset,
            limit,
            skipped: 0,
            returned: 0,
            seen: HashSet::new(),
            sorted: Vec::new(),
            held_bytes: 0,
            groups: Vec::new(),
            group_index: HashMap::new(),
            out: Vec::new(),
        })
    }

    fn flow(&self) -> Flow {
        if self.done() { Flow::Done } else { Flow::More }
    }

    fn done(&self) -> bool {
        self.mode == Mode::Stream && self.limit.is_some_and(|l| self.returned >= l)
    }

    fn accept(&mut self, eval: &Evaluator<'_>, env: &Env<'_>) -> Result<Flow, QueryError> {
        match self.mode {
            Mode::Stream => {
                if let Some(v) = project(eval, self.query, env)? {
                    self.emit(v)?;
                }
                Ok(if self.done() { Flow::Done } else { Flow::More })
            }
            Mode::Sort => {
                let Some(v) = project(eval, self.query, env)? else {
                    return Ok(Flow::More);
                };
                let keys = self
                    .query
                    .order_by
                    .iter()
                    .map(|k| eval.eval(&k.expr, Some(env)))
                    .collect::<Result<Vec<_>, _>>()?;
                self.held_bytes += row_size(&keys, &v);
                self.sorted.push((keys, v));
                if let Some(limit) = self.limit.filter(|_| !self.query.distinct) {
                    // Only the first offset + limit can be returned: keep the buffer small.
                    let keep =
                        usize::try_from(self.offset.saturating_add(limit)).unwrap_or(usize::MAX);
                    if self.sorted.len() > keep.saturating_mul(2).max(1024) {
                        self.sort();
                        self.sorted.truncate(keep);
                        self.held_bytes = self.sorted.iter().map(|(k, v)| row_size(k, v)).sum();
                    }
                }
                held(self.sorted.len(), self.held_bytes)?;
                Ok(Flow::More)
            }
            Mode::Group => {
                let keys = self
                    .query
                    .group_by
                    .iter()
                    .map(|k| eval.eval(k, Some(env)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut name = String::new();
                for k in &keys {
                    canonical(k.view(), &mut name);
                    name.push(',');
                }
                let index = match self.group_index.get(&name) {
                    Some(&i) => i,
                    None => {
                        self.held_bytes += name.len() + row_size(&keys, &Value::Null);
                        held(self.groups.len() + 1, self.held_bytes)?;
                        self.groups.push(Group {
                            keys,
                            accumulators: aggregates(self.query)
                                .iter()
                                .map(|(a, _)| Accumulator::new(*a))
                                .collect(),
                        });
                        self.group_index.insert(name, self.groups.len() - 1);
                        self.groups.len() - 1
                    }
                };
                let group = &mut self.groups[index];
                for ((_, arg), acc) in aggregates(self.query).iter().zip(&mut group.accumulators) {
                    acc.add(eval.eval(arg, Some(env))?);
                }
                Ok(Flow::More)
            }
        }
    }

    /// Counts a result against `DISTINCT`, `OFFSET` and the limit, and keeps it if it passes.
    fn emit(&mut self, v: Value) -> Result<(), QueryError> {
        if self.query.distinct {
            let mut key = String::new();
            canonical(ValRef::Json(&v), &mut key);
            let size = key.len();
            if !self.seen.insert(key) {
                return Ok(());
            }
            self.held_bytes += size;
            held(self.seen.len(), self.held_bytes)?;
        }
        if self.skipped < self.offset {
            self.skipped = self.skipped.saturating_add(1);
            return Ok(());
        }
        if self.limit.is_some_and(|l| self.returned >= l) {
            return Ok(());
        }
        self.returned = self.returned.saturating_add(1);
        self.out.push(v);
        Ok(())
    }

    fn sort(&mut self) {
        let order = &self.query.order_by;
        self.sorted.sort_by(|(a, _), (b, _)| {
            for ((x, y), key) in a.iter().zip(b).zip(order) {
                let o = sort_order(x, y);
                let o = if key.descending { o.reverse() } else { o };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
    }

    fn finish(&mut self, eval: &Evaluator<'_>) -> Result<(), QueryError> {
        match self.mode {
            Mode::Stream => {}
            Mode::Sort => {
                self.sort();
                for (_, v) in std::mem::take(&mut self.sorted) {
                    self.emit(v)?;
                }
            }
            Mode::Group => {
                if self.groups.is_empty() && self.query.group_by.is_empty() {
                    // Aggregates over no rows: one result (COUNT 0, SUM 0, the rest undefined).
                    self.groups.push(Group {
                        keys: Vec::new(),
                        accumulators: aggregates(self.query)
                            .iter()
                            .map(|(a, _)| Accumulator::new(*a))
                            .collect(),
                    });
                }
                for group in std::mem::take(&mut self.groups) {
                    let results: Vec<Val> =
                        group.accumulators.iter().map(Accumulator::result).collect();
                    let mut next = 0;
                    let value = match &self.query.select {
                        Select::Star => None,
                        Select::Value(e) => {
                            let e = substitute(
                                e,
                                &self.query.group_by,
                                &group.keys,
                                &results,
                                &mut next,
                            );
                            eval.eval(&e, None)?.into_json_lossy()
                        }
                        Select::List(items) => {
                            let mut map = Map::new();
                            for (e, name) in items {
                                let e = substitute(
                                    e,
                                    &self.query.group_by,
                                    &group.keys,
                                    &results,
                                    &mut next,
                                );
                                if let Some(v) = eval.eval(&e, None)?.into_json_lossy() {
                                    map.insert(name.clone(), v);
                                }
                            }
                            Some(Value::Object(map))
                        }
                    };
                    if let Some(v) = value {
                        self.emit(v)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn held(rows: usize, bytes: usize) -> Result<(), QueryError> {
    if rows > MAX_HELD_ROWS || bytes > MAX_HELD_BYTES {
        return Err(QueryError::limit(format!(
            "the query holds more than {MAX_HELD_ROWS} rows or {} MiB to sort, group or de-duplicate; filter further, select less, or add TOP or OFFSET/LIMIT to an ORDER BY",
            MAX_HELD_BYTES >> 20
        )));
    }
    Ok(())
}

fn row_size(keys: &[Val], v: &Value) -> usize {
    approximate_size(v)
        + keys
            .iter()
            .filter_map(Val::json)
            .map(approximate_size)
            .sum::<usize>()
}

/// A row's result: the `SELECT` applied to it (`None` when `SELECT VALUE` is undefined), as
/// JSON: a number JSON cannot hold (`SELECT VALUE 1/0`, `SELECT 1/0 AS x`) is `null`.
fn project(
    eval: &Evaluator<'_>,
    query: &Query,
    env: &Env<'_>,
) -> Result<Option<Value>, QueryError> {
    Ok(match &query.select {
        Select::Star => query.from.as_ref().and_then(|f| env.get(f.slot)).cloned(),
        Select::Value(e) => eval.eval(e, Some(env))?.into_json_lossy(),
        Select::List(items) => {
            let mut map = Map::new();
            for (e, name) in items {
                if let Some(v) = eval.eval(e, Some(env))?.into_json_lossy() {
                    map.insert(name.clone(), v);
                }
            }
            Some(Value::Object(map))
        }
    })
}

/// The aggregates of the select list, in the order [`substitute`] meets them.
fn aggregates(query: &Query) -> Vec<(Aggregate, &Expr)> {
    let mut out = Vec::new();
    let items: Vec<&Expr> = match &query.select {
        Select::Star => vec![],
        Select::Value(e) => vec![e],
        Select::List(items) => items.iter().map(|(e, _)| e).collect(),
    };
    for item in items {
        collect_aggregates(item, &query.group_by, &mut out);
    }
    out
}

fn collect_aggregates<'q>(expr: &'q Expr, keys: &[Expr], out: &mut Vec<(Aggregate, &'q Expr)>) {
    if keys.contains(expr) {
        return;
    }
    if let Expr::Aggregate(a, arg) = expr {
        out.push((*a, arg));
        return;
    }
    for child in expr.children() {
        collect_aggregates(child, keys, out);
    }
}

/// `expr` with its grouping expressions and aggregates replaced by their values for a group.
fn substitute(
    expr: &Expr,
    keys: &[Expr],
    key_values: &[Val],
    results: &[Val],
    next: &mut usize,
) -> Expr {
    if let Some(i) = keys.iter().position(|k| k == expr) {
        return Expr::constant(key_values[i].clone());
    }
    if let Expr::Aggregate(..) = expr {
        *next += 1;
        return Expr::constant(results[*next - 1].clone());
    }
    let mut copy = expr.clone();
    let originals = expr.children();
    for (child, original) in copy.children_mut().into_iter().zip(originals) {
        *child = substitute(original, keys, key_values, results, next);
    }
    copy
}

/// A running aggregate.
#[derive(Debug)]
enum Accumulator {
    Count(u64),
    /// Sum and count of numbers; `poisoned` once a defined non-number was seen (the result is
    /// then undefined, as in Cosmos DB).
    Sum {
        sum: f64,
        n: u64,
        poisoned: bool,
        average: bool,
    },
    Extreme {
        best: Val,
        poisoned: bool,
        max: bool,
    },
}

impl Accumulator {
    fn new(a: Aggregate) -> Self {
        match a {
            Aggregate::Count => Accumulator::Count(0),
            Aggregate::Sum | Aggregate::Avg => Accumulator::Sum {
                sum: 0.0,
                n: 0,
                poisoned: false,
                average: a == Aggregate::Avg,
            },
            Aggregate::Min | Aggregate::Max => Accumulator::Extreme {
                best: Val::Undefined,
                poisoned: false,
                max: a == Aggregate::Max,
            },
        }
    }

    /// Adds one row's value; undefined values are skipped. `Infinity`, `-Infinity` and `NaN`
    /// are numbers: they add up by IEEE rules, and `MIN`/`MAX` order them as `ORDER BY` does.
    fn add(&mut self, v: Val) {
        if !v.is_defined() {
            return;
        }
        match self {
            Accumulator::Count(n) => *n += 1,
            Accumulator::Sum {
                sum, n, poisoned, ..
            } => match v.as_f64() {
                Some(x) => {
                    *sum += x;
                    *n += 1;
                }
                None => *poisoned = true,
            },
            Accumulator::Extreme {
                best,
                poisoned,
                max,
            } => {
                if matches!(v, Val::Json(Value::Array(_) | Value::Object(_))) {
                    *poisoned = true;
                    return;
                }
                let better = match &*best {
                    Val::Undefined => true,
                    b => {
                        let o = sort_order(&v, b);
                        if *max { o.is_gt() } else { o.is_lt() }
                    }
                };
                if better {
                    *best = v;
                }
            }
        }
    }

    fn result(&self) -> Val {
        match self {
            #[allow(clippy::cast_precision_loss, reason = "counts stay far below 2^53")]
            Accumulator::Count(n) => number(*n as f64),
            Accumulator::Sum {
                sum,
                n,
                poisoned,
                average,
            } => {
                if *poisoned {
                    Val::Undefined
                } else if *average {
                    #[allow(clippy::cast_precision_loss, reason = "counts stay far below 2^53")]
                    let mean = (*n > 0).then(|| sum / *n as f64);
                    mean.map_or(Val::Undefined, number)
                } else {
                    number(*sum)
                }
            }
            Accumulator::Extreme { best, poisoned, .. } => {
                if *poisoned {
                    Val::Undefined
                } else {
                    best.clone()
                }
            }
        }
    }
}

/// A text form equal for values `=` deems equal (numbers by value), for grouping and
/// `DISTINCT` (where, unlike `=`, all `NaN`s are one value, as `ORDER BY` ties them).
pub(crate) fn canonical(v: ValRef<'_>, out: &mut String) {
    match v {
        ValRef::Undefined => out.push('~'),
        // `inf`, `-inf` and `NaN` for the non-finite ones: no finite number is written so.
        ValRef::NonFinite(n) => {
            let _ = write!(out, "n{n}");
        }
        ValRef::Json(Value::Number(n)) => {
            let _ = write!(out, "n{}", n.as_f64().unwrap_or(0.0));
        }
        ValRef::Json(Value::Array(items)) => {
            out.push('[');
            for item in items {
                canonical(ValRef::Json(item), out);
                out.push(',');
            }
            out.push(']');
        }
        ValRef::Json(Value::Object(map)) => {
            out.push('{');
            for (k, v) in map {
                let _ = write!(out, "{k:?}:");
                canonical(ValRef::Json(v), out);
                out.push(',');
            }
            out.push('}');
        }
        ValRef::Json(other) => {
            let _ = write!(out, "{}{other}", type_rank(other));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A run with a deadline stops inside one document's evaluation once it has passed (a
    /// cross join of one document's arrays), and one without runs to the end.
    #[test]
    fn a_run_past_its_deadline_is_interrupted_inside_a_document() {
        let items: Vec<i64> = (0..40).collect();
        let doc = json!({"id": "a", "xs": items});
        let params = Map::new();
        let query = crate::parse(
            "SELECT VALUE COUNT(1) FROM c JOIN a IN c.xs JOIN b IN c.xs JOIN d IN c.xs",
        )
        .expect("parses");
        let past = std::time::Instant::now() - std::time::Duration::from_millis(1);
        let mut late = Execution::new(&query, &params, Context::new(0, 1))
            .expect("starts")
            .interrupt_at(past);
        let err = late.push(&doc).expect_err("interrupted");
        assert_eq!(err.kind, crate::ErrorKind::Interrupted, "{err:?}");
        let mut run = Execution::new(&query, &params, Context::new(0, 1)).expect("starts");
        run.push(&doc).expect("runs");
        assert_eq!(run.finish().expect("finishes"), [json!(64_000)]);
    }

    /// `push_owned` returns what `push` does, for queries it takes the document for and for
    /// those it hands to `push`.
    #[test]
    fn push_owned_returns_what_push_does() {
        let docs: Vec<Value> = (0..20)
            .map(|i| json!({"id": i.to_string(), "n": i, "g": i % 3, "arr": [i, i + 1]}))
            .collect();
        let params = Map::new();
        for text in [
            "SELECT * FROM c",
            "SELECT * FROM c WHERE c.g = 1",
            "SELECT TOP 3 * FROM c WHERE c.n > 4",
            "SELECT * FROM c WHERE c.g = 2 OFFSET 2 LIMIT 3",
            "SELECT * FROM c WHERE c.missing = 1",
            "SELECT VALUE c FROM c JOIN a IN c.arr WHERE a > 15",
            "SELECT * FROM c IN c.arr",
            "SELECT * FROM c.arr",
            "SELECT c.id FROM c WHERE c.g = 0",
            "SELECT DISTINCT VALUE c.g FROM c",
        ] {
            let query = crate::parse(text).expect("parses");
            let collect = |owned: bool| {
                let mut run = Execution::new(&query, &params, Context::new(0, 1)).expect("starts");
                let mut out = Vec::new();
                for doc in &docs {
                    let flow = if owned {
                        run.push_owned(doc.clone())
                    } else {
                        run.push(doc)
                    }
                    .expect("runs");
                    out.extend(run.take_ready());
                    if flow == Flow::Done {
                        break;
                    }
                }
                out.extend(run.finish().expect("finishes"));
                out
            };
            let expected = collect(false);
            assert_eq!(collect(true), expected, "{text}");
        }
    }
}
