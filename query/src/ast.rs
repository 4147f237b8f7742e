//! The syntax tree of a query, as the parser builds it and the evaluator runs it. Aliases are
//! resolved to slots and function names to their definitions while parsing, so evaluating
//! never looks a name up.

use serde_json::Value;

use crate::{error::Position, functions::Function, value::Val};

/// A `SELECT` query, or a subquery.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub distinct: bool,
    pub top: Option<Expr>,
    pub select: Select,
    pub from: Option<From>,
    pub joins: Vec<Join>,
    pub filter: Option<Expr>,
    pub group_by: Vec<Expr>,
    pub order_by: Vec<SortKey>,
    /// `OFFSET n LIMIT m`.
    pub offset_limit: Option<(Expr, Expr)>,
    /// Whether the select list holds an aggregate (so the rows fold into groups).
    pub aggregates: bool,
}

/// What the query returns per row.
#[derive(Debug, Clone, PartialEq)]
pub enum Select {
    /// `SELECT *`: the `FROM` alias's value.
    Star,
    /// `SELECT VALUE expr`: the value itself, not wrapped in an object.
    Value(Expr),
    /// `SELECT a, b AS x, ...`: an object with one property per item.
    List(Vec<(Expr, String)>),
}

/// The `FROM` clause: one alias bound per document.
#[derive(Debug, Clone, PartialEq)]
pub struct From {
    pub alias: String,
    pub alias_at: Position,
    /// The slot the alias is bound to.
    pub slot: usize,
    /// In a subquery, the outer alias the path starts from (`EXISTS(SELECT ... FROM t IN
    /// c.tags)`); `None` at the top level, where the path starts from each document.
    pub root: Option<usize>,
    /// The name the path starts from, as written.
    pub root_name: (String, Position),
    /// The path below the document the alias stands for (`FROM c.children[0] x`), empty for
    /// the document itself.
    pub path: Vec<Step>,
    /// `FROM x IN c.arr`: the alias ranges over the elements of the value at `path`.
    pub iterate: bool,
}

/// One step of a path written in `FROM`.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Property(String),
    Index(usize),
}

/// `JOIN alias IN source`.
#[derive(Debug, Clone, PartialEq)]
pub struct Join {
    pub alias: String,
    pub alias_at: Position,
    pub slot: usize,
    pub source: Expr,
}

/// `ORDER BY expr [ASC|DESC]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    pub expr: Expr,
    pub descending: bool,
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A constant: `None` is `undefined`.
    Literal(Option<Value>),
    /// A number constant JSON cannot hold: `Infinity` or `NaN` as written (`-Infinity` is
    /// `Infinity` negated), or a value computed while running (an aggregate's or a group key's,
    /// put back into the select list).
    NonFinite(Bits),
    /// `@name`.
    Param(String),
    /// A name as written, before the parser binds it to an alias.
    Name(String, Position),
    /// An alias, by slot.
    Alias(usize),
    /// `base.name` or `base["name"]`.
    Property(Box<Expr>, String),
    /// `base[index]` with a computed index (a number indexes arrays, a string objects).
    Index(Box<Expr>, Box<Expr>),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// A left-associative chain `first op1 e1 op2 e2 ...` of one precedence level, kept flat
    /// so that a long `OR` list or sum is evaluated in a loop, not by recursion.
    Chain(Box<Expr>, Vec<(BinaryOp, Expr)>),
    /// `a ?? b`: `a` unless it is undefined.
    Coalesce(Box<Expr>, Box<Expr>),
    /// `cond ? a : b`.
    Conditional(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `x [NOT] BETWEEN low AND high`.
    Between {
        expr: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
    },
    /// `x [NOT] IN (a, b, ...)`.
    In {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
    },
    /// `x [NOT] LIKE pattern [ESCAPE 'c']`.
    Like {
        expr: Box<Expr>,
        pattern: Box<Expr>,
        escape: Option<char>,
        negated: bool,
    },
    Call(&'static Function, Vec<Expr>),
    /// An aggregate in a select list, by its index in the query's aggregate list.
    Aggregate(Aggregate, Box<Expr>),
    Array(Vec<Expr>),
    Object(Vec<(String, Expr)>),
    /// `EXISTS(subquery)`.
    Exists(Box<Query>),
    /// `ARRAY(subquery)`.
    ArraySubquery(Box<Query>),
    /// `(subquery)`: its single value, or undefined.
    Subquery(Box<Query>),
}

/// A double compared by its bits, so that an expression holding `NaN` equals itself (as
/// `GROUP BY` needs to match a select item with its key).
#[derive(Debug, Clone, Copy)]
pub struct Bits(pub f64);

impl PartialEq for Bits {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

/// `- + ~ NOT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Plus,
    BitNot,
    Not,
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    And,
    Or,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Concat,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    /// `>>>`: shift right, filling with zeros.
    ShrZero,
}

/// The aggregate functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

impl Aggregate {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        [
            ("COUNT", Aggregate::Count),
            ("SUM", Aggregate::Sum),
            ("MIN", Aggregate::Min),
            ("MAX", Aggregate::Max),
            ("AVG", Aggregate::Avg),
        ]
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, a)| a)
    }
}

impl Query {
    /// Every expression of this query's clauses, in evaluation order (not entering subqueries).
    pub(crate) fn expressions(&self) -> Vec<&Expr> {
        let mut out: Vec<&Expr> = Vec::new();
        out.extend(&self.top);
        if let Some((offset, limit)) = &self.offset_limit {
            out.push(offset);
            out.push(limit);
        }
        out.extend(self.joins.iter().map(|j| &j.source));
        out.extend(&self.filter);
        out.extend(&self.group_by);
        out.extend(self.order_by.iter().map(|k| &k.expr));
        match &self.select {
            Select::Star => {}
            Select::Value(e) => out.push(e),
            Select::List(items) => out.extend(items.iter().map(|(e, _)| e)),
        }
        out
    }

    /// Names of the parameters used anywhere in the query, subqueries included.
    pub fn parameters(&self) -> Vec<&str> {
        let mut names = Vec::new();
        self.collect_parameters(&mut names);
        names.sort_unstable();
        names.dedup();
        names
    }

    fn collect_parameters<'q>(&'q self, names: &mut Vec<&'q str>) {
        for e in self.expressions() {
            e.visit_all(&mut |e| match e {
                Expr::Param(name) => names.push(name),
                Expr::Exists(q) | Expr::ArraySubquery(q) | Expr::Subquery(q) => {
                    q.collect_parameters(names);
                }
                _ => {}
            });
        }
    }
}

impl Expr {
    /// The constant `v`.
    pub(crate) fn constant(v: Val) -> Expr {
        match v {
            Val::Undefined => Expr::Literal(None),
            Val::Json(v) => Expr::Literal(Some(v)),
            Val::NonFinite(n) => Expr::NonFinite(Bits(n)),
        }
    }

    /// [`Expr::visit`] with the lifetime of the tree, for collecting references into it.
    fn visit_all<'q>(&'q self, f: &mut dyn FnMut(&'q Expr)) {
        f(self);
        for child in self.children() {
            child.visit_all(f);
        }
    }

    /// Whether an aggregate occurs in this expression outside subqueries.
    pub(crate) fn has_aggregate(&self) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(e, Expr::Aggregate(..)));
        found
    }

    /// Calls `f` on this expression and every expression inside it, not entering subqueries.
    pub(crate) fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        for child in self.children() {
            child.visit(f);
        }
    }

    /// The expressions directly inside this one (subqueries are not entered).
    pub(crate) fn children(&self) -> Vec<&Expr> {
        match self {
            Expr::Literal(_)
            | Expr::NonFinite(_)
            | Expr::Param(_)
            | Expr::Name(..)
            | Expr::Alias(_)
            | Expr::Exists(_)
            | Expr::ArraySubquery(_)
            | Expr::Subquery(_) => vec![],
            Expr::Property(e, _) | Expr::Unary(_, e) | Expr::Aggregate(_, e) => vec![e],
            Expr::Index(a, b) | Expr::Binary(_, a, b) | Expr::Coalesce(a, b) => vec![a, b],
            Expr::Conditional(a, b, c) => vec![a, b, c],
            Expr::Chain(first, rest) => std::iter::once(&**first)
                .chain(rest.iter().map(|(_, e)| e))
                .collect(),
            Expr::Between {
                expr, low, high, ..
            } => vec![expr, low, high],
            Expr::In { expr, list, .. } => std::iter::once(&**expr).chain(list).collect(),
            Expr::Like { expr, pattern, .. } => vec![expr, pattern],
            Expr::Call(_, args) | Expr::Array(args) => args.iter().collect(),
            Expr::Object(fields) => fields.iter().map(|(_, e)| e).collect(),
        }
    }

    /// [`Expr::children`], mutable.
    pub(crate) fn children_mut(&mut self) -> Vec<&mut Expr> {
        match self {
            Expr::Literal(_)
            | Expr::NonFinite(_)
            | Expr::Param(_)
            | Expr::Name(..)
            | Expr::Alias(_)
            | Expr::Exists(_)
            | Expr::ArraySubquery(_)
            | Expr::Subquery(_) => vec![],
            Expr::Property(e, _) | Expr::Unary(_, e) | Expr::Aggregate(_, e) => vec![e],
            Expr::Index(a, b) | Expr::Binary(_, a, b) | Expr::Coalesce(a, b) => vec![a, b],
            Expr::Conditional(a, b, c) => vec![a, b, c],
            Expr::Chain(first, rest) => std::iter::once(&mut **first)
                .chain(rest.iter_mut().map(|(_, e)| e))
                .collect(),
            Expr::Between {
                expr, low, high, ..
            } => vec![expr, low, high],
            Expr::In { expr, list, .. } => std::iter::once(&mut **expr).chain(list).collect(),
            Expr::Like { expr, pattern, .. } => vec![expr, pattern],
            Expr::Call(_, args) | Expr::Array(args) => args.iter_mut().collect(),
            Expr::Object(fields) => fields.iter_mut().map(|(_, e)| e).collect(),
        }
    }
}
