//! Tokens to a syntax tree: a recursive-descent parser with one function per precedence
//! level, then a pass that binds aliases to slots and checks what a query may say where.
//!
//! Precedence, loosest first: `?:`, `??`, `OR`, `AND`, `NOT`, comparisons with `IN`,
//! `BETWEEN` and `LIKE`, `|`, `^`, `&`, shifts, `+ - ||`, `* / %`, unary `- + ~`, then `.`
//! and `[]`.

use serde_json::{Map, Value};

use crate::{
    ast::{Aggregate, BinaryOp, Bits, Expr, From, Join, Query, Select, SortKey, Step, UnaryOp},
    error::{Position, QueryError},
    functions,
    lexer::{Token, tokenize},
    value::number,
};

/// Longest query text accepted, in bytes (Cosmos DB's limit is 256 KB as well).
pub const MAX_QUERY_BYTES: usize = 256 * 1024;
/// Deepest nesting of expressions and subqueries.
pub const MAX_DEPTH: usize = 64;
/// Deepest expression tree a query may build: evaluating, binding and freeing a tree recurse
/// once per level. Chains of one operator (`a OR b OR c ...`) are kept flat and count as one
/// level.
pub const MAX_CHAIN: usize = 64;
/// Most terms in one flat operator chain (`a OR b OR ...`, `a + b + ...`).
pub const MAX_CHAIN_TERMS: usize = 10_000;
/// Most `JOIN`s in one query.
pub const MAX_JOINS: usize = 16;

/// The reserved words, matched in any letter case.
pub const KEYWORDS: &[&str] = &[
    "SELECT",
    "DISTINCT",
    "TOP",
    "VALUE",
    "AS",
    "FROM",
    "IN",
    "JOIN",
    "WHERE",
    "GROUP",
    "BY",
    "ORDER",
    "ASC",
    "DESC",
    "OFFSET",
    "LIMIT",
    "AND",
    "OR",
    "NOT",
    "BETWEEN",
    "LIKE",
    "ESCAPE",
    "EXISTS",
    "ARRAY",
    "TRUE",
    "FALSE",
    "NULL",
    "UNDEFINED",
    "UDF",
];

/// Parses and checks a query.
pub fn parse(text: &str) -> Result<Query, QueryError> {
    if text.len() > MAX_QUERY_BYTES {
        return Err(QueryError::limit(format!(
            "the query text is {} bytes; at most {MAX_QUERY_BYTES} are allowed",
            text.len()
        )));
    }
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        at: 0,
        depth: 0,
    };
    let mut query = parser.query()?;
    parser.expect_end()?;
    Binder::default().bind(&mut query, &mut Vec::new())?;
    Ok(query)
}

struct Parser {
    tokens: Vec<(Token, Position)>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.at.min(self.tokens.len() - 1)].0
    }

    fn peek_at(&self, ahead: usize) -> &Token {
        &self.tokens[(self.at + ahead).min(self.tokens.len() - 1)].0
    }

    fn position(&self) -> Position {
        self.tokens[self.at.min(self.tokens.len() - 1)].1
    }

    fn advance(&mut self) -> Token {
        let token = self.peek().clone();
        if self.at < self.tokens.len() - 1 {
            self.at += 1;
        }
        token
    }

    fn is_keyword(&self, keyword: &str) -> bool {
        matches!(self.peek(), Token::Word(w) if w.eq_ignore_ascii_case(keyword))
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let found = self.is_keyword(keyword);
        if found {
            self.advance();
        }
        found
    }

    fn expect_keyword(&mut self, keyword: &str) -> Result<(), QueryError> {
        if self.eat_keyword(keyword) {
            Ok(())
        } else {
            Err(self.error(keyword))
        }
    }

    fn is_sym(&self, sym: &str) -> bool {
        matches!(self.peek(), Token::Sym(s) if *s == sym)
    }

    fn eat_sym(&mut self, sym: &str) -> bool {
        let found = self.is_sym(sym);
        if found {
            self.advance();
        }
        found
    }

    fn expect_sym(&mut self, sym: &str) -> Result<(), QueryError> {
        if self.eat_sym(sym) {
            Ok(())
        } else {
            Err(self.error(&format!("'{sym}'")))
        }
    }

    fn expect_end(&mut self) -> Result<(), QueryError> {
        if *self.peek() == Token::End {
            Ok(())
        } else {
            Err(self.error("the end of the query (or a clause: WHERE, GROUP BY, ORDER BY, OFFSET)"))
        }
    }

    fn error(&self, expected: &str) -> QueryError {
        QueryError::syntax_found(self.position(), expected, &self.peek().to_string())
    }

    /// An identifier that is not a keyword.
    fn identifier(&mut self, what: &str) -> Result<(String, Position), QueryError> {
        let at = self.position();
        match self.peek() {
            Token::Word(w) if !is_keyword(w) => {
                let w = w.clone();
                self.advance();
                Ok((w, at))
            }
            _ => Err(self.error(what)),
        }
    }

    /// `first op e ...` as one flat node (a single binary operation stays [`Expr::Binary`]).
    fn chain(&self, first: Expr, mut rest: Vec<(BinaryOp, Expr)>) -> Result<Expr, QueryError> {
        if rest.len() >= MAX_CHAIN_TERMS {
            return Err(QueryError::limit(format!(
                "{}: an operator chain has more than {MAX_CHAIN_TERMS} terms",
                self.position()
            )));
        }
        let expr = match rest.len() {
            0 => first,
            1 => {
                let (op, right) = rest.remove(0);
                Expr::Binary(op, Box::new(first), Box::new(right))
            }
            _ => Expr::Chain(Box::new(first), rest),
        };
        self.bounded(expr)
    }

    /// `expr` if its tree, subqueries included, is at most [`MAX_CHAIN`] levels deep. Every
    /// node an operator chain builds passes here, so no tree ever grows deeper than one level
    /// past the bound (and freeing a refused one recurses no further).
    fn bounded(&self, expr: Expr) -> Result<Expr, QueryError> {
        if deeper_than(&expr, MAX_CHAIN) {
            return Err(QueryError::limit(format!(
                "{}: the expression nests more than {MAX_CHAIN} operators deep",
                self.position()
            )));
        }
        Ok(expr)
    }

    fn enter(&mut self) -> Result<(), QueryError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(QueryError::limit(format!(
                "{}: the query nests deeper than {MAX_DEPTH} levels",
                self.position()
            )));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ---- Clauses ----

    fn query(&mut self) -> Result<Query, QueryError> {
        self.enter()?;
        self.expect_keyword("SELECT")?;
        let distinct = self.eat_keyword("DISTINCT");
        let top = if self.eat_keyword("TOP") {
            Some(self.count_operand("TOP")?)
        } else {
            None
        };
        let select = if self.eat_sym("*") {
            Select::Star
        } else if self.eat_keyword("VALUE") {
            Select::Value(self.expr()?)
        } else {
            let mut items = Vec::new();
            loop {
                let expr = self.expr()?;
                let name = if self.eat_keyword("AS") {
                    Some(self.identifier("a name after AS")?.0)
                } else if matches!(self.peek(), Token::Word(w) if !is_keyword(w)) {
                    Some(self.identifier("a name")?.0)
                } else {
                    None
                };
                items.push((expr, name));
                if !self.eat_sym(",") {
                    break;
                }
            }
            Select::List(name_items(items))
        };
        let mut query = Query {
            distinct,
            top,
            select,
            from: None,
            joins: Vec::new(),
            filter: None,
            group_by: Vec::new(),
            order_by: Vec::new(),
            offset_limit: None,
            aggregates: false,
        };
        if self.eat_keyword("FROM") {
            query.from = Some(self.from()?);
            while self.eat_keyword("JOIN") {
                if query.joins.len() == MAX_JOINS {
                    return Err(QueryError::limit(format!(
                        "{}: a query may have at most {MAX_JOINS} JOINs",
                        self.position()
                    )));
                }
                query.joins.push(self.join()?);
            }
        }
        if self.eat_keyword("WHERE") {
            query.filter = Some(self.expr()?);
        }
        if self.eat_keyword("GROUP") {
            self.expect_keyword("BY")?;
            loop {
                query.group_by.push(self.expr()?);
                if !self.eat_sym(",") {
                    break;
                }
            }
        }
        if self.eat_keyword("ORDER") {
            self.expect_keyword("BY")?;
            loop {
                let expr = self.expr()?;
                let descending = if self.eat_keyword("DESC") {
                    true
                } else {
                    self.eat_keyword("ASC");
                    false
                };
                query.order_by.push(SortKey { expr, descending });
                if !self.eat_sym(",") {
                    break;
                }
            }
        }
        if self.eat_keyword("OFFSET") {
            let offset = self.count_operand("OFFSET")?;
            self.expect_keyword("LIMIT")?;
            let limit = self.count_operand("LIMIT")?;
            query.offset_limit = Some((offset, limit));
        }
        self.leave();
        Ok(query)
    }

    /// The operand of `TOP`, `OFFSET` or `LIMIT`: a number or a parameter.
    fn count_operand(&mut self, clause: &str) -> Result<Expr, QueryError> {
        let _at = self.position();
        match self.advance() {
            Token::Number(n) => Ok(Expr::constant(number(n))),
            Token::Param(p) => Ok(Expr::Param(p)),
            _ => {
                self.at -= 1;
                Err(self.error(&format!("a number or parameter after {clause}")))
            }
        }
    }

    fn from(&mut self) -> Result<From, QueryError> {
        let at = self.position();
        // `FROM x IN c.path`
        if matches!(self.peek_at(1), Token::Word(w) if w.eq_ignore_ascii_case("IN")) {
            let (alias, alias_at) = self.identifier("an alias")?;
            self.advance();
            let (root_name, path) = self.source_path()?;
            return Ok(From {
                alias,
                alias_at,
                slot: 0,
                root: None,
                root_name,
                path,
                iterate: true,
            });
        }
        if self.is_sym("(") {
            return Err(QueryError::unsupported(
                Some(at),
                "a subquery in FROM is not supported; use JOIN or a subquery in WHERE/SELECT",
            ));
        }
        let (root, path) = self.source_path()?;
        let alias = if self.eat_keyword("AS") {
            Some(self.identifier("an alias after AS")?)
        } else if matches!(self.peek(), Token::Word(w) if !is_keyword(w)) {
            Some(self.identifier("an alias")?)
        } else {
            None
        };
        let (alias, alias_at) = match alias {
            Some(a) => a,
            // Without an alias, the last name of the path names the alias (`FROM c` is `c`).
            None => match path.last() {
                None => root.clone(),
                Some(Step::Property(p)) => (p.clone(), root.1),
                Some(Step::Index(_)) => {
                    return Err(QueryError::syntax(
                        self.position(),
                        "an alias for a FROM path ending in an index",
                    ));
                }
            },
        };
        Ok(From {
            alias,
            alias_at,
            slot: 0,
            root: None,
            root_name: root,
            path,
            iterate: false,
        })
    }

    /// `name(.prop | ["prop"] | [n])*` in `FROM`: the collection's name (any identifier, or
    /// `ROOT`), then a path below its documents.
    fn source_path(&mut self) -> Result<((String, Position), Vec<Step>), QueryError> {
        let root = self.identifier("a collection name or alias")?;
        let mut path = Vec::new();
        loop {
            if self.eat_sym(".") {
                path.push(Step::Property(self.property_name()?));
            } else if self.eat_sym("[") {
                let at = self.position();
                match self.advance() {
                    Token::Str(s) => path.push(Step::Property(s)),
                    Token::Number(n) if n >= 0.0 && n.fract() == 0.0 && n <= 1e9 => {
                        #[allow(
                            clippy::cast_possible_truncation,
                            clippy::cast_sign_loss,
                            reason = "checked"
                        )]
                        path.push(Step::Index(n as usize));
                    }
                    _ => {
                        return Err(QueryError::syntax(at, "a property name or array index"));
                    }
                }
                self.expect_sym("]")?;
            } else {
                return Ok((root, path));
            }
        }
    }

    fn join(&mut self) -> Result<Join, QueryError> {
        if self.eat_sym("(") {
            // `JOIN (SELECT ...) [AS] alias`: the alias ranges over the subquery's results.
            self.enter()?;
            let query = self.query()?;
            self.leave();
            self.expect_sym(")")?;
            self.eat_keyword("AS");
            let (alias, alias_at) = self.identifier("an alias after a JOIN subquery")?;
            return Ok(Join {
                alias,
                alias_at,
                slot: 0,
                source: Expr::ArraySubquery(Box::new(query)),
            });
        }
        let (alias, alias_at) = self.identifier("an alias after JOIN")?;
        self.expect_keyword("IN")?;
        let source = self.expr()?;
        Ok(Join {
            alias,
            alias_at,
            slot: 0,
            source,
        })
    }

    /// A property name after `.`: any word, keywords included (`c.value`).
    fn property_name(&mut self) -> Result<String, QueryError> {
        match self.peek() {
            Token::Word(w) => {
                let w = w.clone();
                self.advance();
                Ok(w)
            }
            _ => Err(self.error("a property name after '.'")),
        }
    }

    // ---- Expressions, loosest first ----

    fn expr(&mut self) -> Result<Expr, QueryError> {
        self.enter()?;
        let cond = self.coalesce()?;
        let result = if self.eat_sym("?") {
            let then = self.expr()?;
            self.expect_sym(":")?;
            let otherwise = self.expr()?;
            Expr::Conditional(Box::new(cond), Box::new(then), Box::new(otherwise))
        } else {
            cond
        };
        self.leave();
        Ok(result)
    }

    fn coalesce(&mut self) -> Result<Expr, QueryError> {
        let left = self.or()?;
        if self.eat_sym("??") {
            self.enter()?;
            let right = self.coalesce()?;
            self.leave();
            return Ok(Expr::Coalesce(Box::new(left), Box::new(right)));
        }
        Ok(left)
    }

    fn or(&mut self) -> Result<Expr, QueryError> {
        let first = self.and()?;
        let mut rest = Vec::new();
        while self.eat_keyword("OR") {
            rest.push((BinaryOp::Or, self.and()?));
        }
        self.chain(first, rest)
    }

    fn and(&mut self) -> Result<Expr, QueryError> {
        let first = self.not()?;
        let mut rest = Vec::new();
        while self.eat_keyword("AND") {
            rest.push((BinaryOp::And, self.not()?));
        }
        self.chain(first, rest)
    }

    fn not(&mut self) -> Result<Expr, QueryError> {
        if self.eat_keyword("NOT") {
            self.enter()?;
            let operand = self.not()?;
            self.leave();
            return Ok(Expr::Unary(UnaryOp::Not, Box::new(operand)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr, QueryError> {
        let mut left = self.bit_or()?;
        loop {
            let op = match self.peek() {
                Token::Sym("=") => Some(BinaryOp::Eq),
                Token::Sym("!=" | "<>") => Some(BinaryOp::Ne),
                Token::Sym("<") => Some(BinaryOp::Lt),
                Token::Sym("<=") => Some(BinaryOp::Le),
                Token::Sym(">") => Some(BinaryOp::Gt),
                Token::Sym(">=") => Some(BinaryOp::Ge),
                _ => None,
            };
            if let Some(op) = op {
                self.advance();
                let right = self.bit_or()?;
                left = self.bounded(Expr::Binary(op, Box::new(left), Box::new(right)))?;
                continue;
            }
            let negated = self.is_keyword("NOT")
                && matches!(self.peek_at(1), Token::Word(w)
                    if ["IN", "BETWEEN", "LIKE"].iter().any(|k| w.eq_ignore_ascii_case(k)));
            if negated {
                self.advance();
            }
            if self.eat_keyword("IN") {
                self.expect_sym("(")?;
                let mut list = Vec::new();
                if !self.is_sym(")") {
                    loop {
                        list.push(self.expr()?);
                        if !self.eat_sym(",") {
                            break;
                        }
                    }
                }
                self.expect_sym(")")?;
                left = self.bounded(Expr::In {
                    expr: Box::new(left),
                    list,
                    negated,
                })?;
            } else if self.eat_keyword("BETWEEN") {
                let low = self.bit_or()?;
                self.expect_keyword("AND")?;
                let high = self.bit_or()?;
                left = self.bounded(Expr::Between {
                    expr: Box::new(left),
                    low: Box::new(low),
                    high: Box::new(high),
                    negated,
                })?;
            } else if self.eat_keyword("LIKE") {
                let pattern = self.bit_or()?;
                let escape = if self.eat_keyword("ESCAPE") {
                    let at = self.position();
                    match self.advance() {
                        Token::Str(s) if s.chars().count() == 1 => s.chars().next(),
                        _ => {
                            return Err(QueryError::syntax(
                                at,
                                "a one-character string after ESCAPE",
                            ));
                        }
                    }
                } else {
                    None
                };
                left = self.bounded(Expr::Like {
                    expr: Box::new(left),
                    pattern: Box::new(pattern),
                    escape,
                    negated,
                })?;
            } else {
                return Ok(left);
            }
        }
    }

    fn bit_or(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(&[("|", BinaryOp::BitOr)], Self::bit_xor)
    }

    fn bit_xor(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(&[("^", BinaryOp::BitXor)], Self::bit_and)
    }

    fn bit_and(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(&[("&", BinaryOp::BitAnd)], Self::shift)
    }

    fn shift(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(
            &[
                ("<<", BinaryOp::Shl),
                (">>", BinaryOp::Shr),
                (">>>", BinaryOp::ShrZero),
            ],
            Self::additive,
        )
    }

    fn additive(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(
            &[
                ("+", BinaryOp::Add),
                ("-", BinaryOp::Sub),
                ("||", BinaryOp::Concat),
            ],
            Self::multiplicative,
        )
    }

    fn multiplicative(&mut self) -> Result<Expr, QueryError> {
        self.binary_level(
            &[
                ("*", BinaryOp::Mul),
                ("/", BinaryOp::Div),
                ("%", BinaryOp::Mod),
            ],
            Self::unary,
        )
    }

    /// A left-associative level: `next (op next)*`.
    fn binary_level(
        &mut self,
        ops: &[(&str, BinaryOp)],
        next: fn(&mut Self) -> Result<Expr, QueryError>,
    ) -> Result<Expr, QueryError> {
        let first = next(self)?;
        let mut rest = Vec::new();
        while let Some(&(_, op)) = ops.iter().find(|(sym, _)| self.is_sym(sym)) {
            self.advance();
            rest.push((op, next(self)?));
        }
        self.chain(first, rest)
    }

    fn unary(&mut self) -> Result<Expr, QueryError> {
        let op = match self.peek() {
            Token::Sym("-") => Some(UnaryOp::Neg),
            Token::Sym("+") => Some(UnaryOp::Plus),
            Token::Sym("~") => Some(UnaryOp::BitNot),
            _ => None,
        };
        if let Some(op) = op {
            self.advance();
            self.enter()?;
            let operand = self.unary()?;
            self.leave();
            // Fold `-1` into a literal, so it is a constant like any other.
            if let (UnaryOp::Neg, Expr::Literal(Some(Value::Number(n)))) = (op, &operand)
                && let Some(f) = n.as_f64()
            {
                return Ok(Expr::constant(number(-f)));
            }
            return Ok(Expr::Unary(op, Box::new(operand)));
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, QueryError> {
        let mut expr = self.primary()?;
        loop {
            if self.eat_sym(".") {
                let name = self.property_name()?;
                expr = self.bounded(Expr::Property(Box::new(expr), name))?;
            } else if self.eat_sym("[") {
                let index = self.expr()?;
                self.expect_sym("]")?;
                expr = self.bounded(match index {
                    Expr::Literal(Some(Value::String(s))) => Expr::Property(Box::new(expr), s),
                    index => Expr::Index(Box::new(expr), Box::new(index)),
                })?;
            } else {
                return Ok(expr);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, QueryError> {
        let at = self.position();
        match self.peek().clone() {
            Token::Number(n) => {
                self.advance();
                Ok(Expr::constant(number(n)))
            }
            Token::Str(s) => {
                self.advance();
                Ok(Expr::Literal(Some(Value::String(s))))
            }
            Token::Param(p) => {
                self.advance();
                Ok(Expr::Param(p))
            }
            Token::Sym("(") => {
                self.advance();
                self.enter()?;
                let inner = if self.is_keyword("SELECT") {
                    Expr::Subquery(Box::new(self.query()?))
                } else {
                    self.expr()?
                };
                self.leave();
                self.expect_sym(")")?;
                Ok(inner)
            }
            Token::Sym("[") => {
                self.advance();
                self.enter()?;
                let mut items = Vec::new();
                if !self.is_sym("]") {
                    loop {
                        items.push(self.expr()?);
                        if !self.eat_sym(",") {
                            break;
                        }
                    }
                }
                self.expect_sym("]")?;
                self.leave();
                Ok(Expr::Array(items))
            }
            Token::Sym("{") => {
                self.advance();
                self.enter()?;
                let mut fields: Vec<(String, Expr)> = Vec::new();
                let mut keys = std::collections::HashSet::new();
                if !self.is_sym("}") {
                    loop {
                        let key_at = self.position();
                        let key = match self.advance() {
                            Token::Str(s) | Token::Word(s) => s,
                            _ => {
                                return Err(QueryError::syntax(
                                    key_at,
                                    "a property name in an object",
                                ));
                            }
                        };
                        if !keys.insert(key.clone()) {
                            return Err(QueryError::invalid(
                                Some(key_at),
                                format!("property '{key}' is given twice in one object"),
                            ));
                        }
                        self.expect_sym(":")?;
                        fields.push((key, self.expr()?));
                        if !self.eat_sym(",") {
                            break;
                        }
                    }
                }
                self.expect_sym("}")?;
                self.leave();
                Ok(Expr::Object(fields))
            }
            Token::Word(w) => self.word(w, at),
            _ => Err(self.error("an expression")),
        }
    }

    /// A primary that starts with a word: a constant, a subquery form, a call, or an alias.
    fn word(&mut self, word: String, at: Position) -> Result<Expr, QueryError> {
        let upper = word.to_ascii_uppercase();
        let constant = match upper.as_str() {
            "TRUE" => Some(Some(Value::Bool(true))),
            "FALSE" => Some(Some(Value::Bool(false))),
            "NULL" => Some(Some(Value::Null)),
            "UNDEFINED" => Some(None),
            _ => None,
        };
        if let Some(constant) = constant {
            self.advance();
            return Ok(Expr::Literal(constant));
        }
        let called = matches!(self.peek_at(1), Token::Sym("("));
        match upper.as_str() {
            "EXISTS" | "ARRAY" if called => {
                self.advance();
                self.advance();
                self.enter()?;
                let query = Box::new(self.query()?);
                self.leave();
                self.expect_sym(")")?;
                return Ok(if upper == "EXISTS" {
                    Expr::Exists(query)
                } else {
                    Expr::ArraySubquery(query)
                });
            }
            "UDF" => {
                return Err(QueryError::unsupported(
                    Some(at),
                    "user-defined functions (udf.*) are not supported",
                ));
            }
            _ => {}
        }
        if called {
            self.advance();
            self.advance();
            self.enter()?;
            let mut args = Vec::new();
            if !self.is_sym(")") {
                loop {
                    args.push(self.expr()?);
                    if !self.eat_sym(",") {
                        break;
                    }
                }
            }
            self.expect_sym(")")?;
            self.leave();
            return call(&word, at, args);
        }
        if is_keyword(&word) {
            return Err(self.error("an expression"));
        }
        self.advance();
        Ok(Expr::Name(word, at))
    }
}

/// Whether a path from `expr` down its tree (into subqueries too) is longer than `limit`.
fn deeper_than(expr: &Expr, limit: usize) -> bool {
    if limit == 0 {
        return true;
    }
    let subquery = match expr {
        Expr::Exists(q) | Expr::ArraySubquery(q) | Expr::Subquery(q) => Some(q),
        _ => None,
    };
    expr.children()
        .into_iter()
        .any(|c| deeper_than(c, limit - 1))
        || subquery.is_some_and(|q| {
            q.expressions()
                .into_iter()
                .any(|e| deeper_than(e, limit - 1))
        })
}

fn is_keyword(word: &str) -> bool {
    KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(word))
}

/// A function call: an aggregate or a system function, checked for its argument count.
fn call(name: &str, at: Position, mut args: Vec<Expr>) -> Result<Expr, QueryError> {
    if let Some(aggregate) = Aggregate::from_name(name) {
        if args.len() != 1 {
            return Err(QueryError::invalid(
                Some(at),
                format!(
                    "{} takes 1 argument, {} given",
                    name.to_ascii_uppercase(),
                    args.len()
                ),
            ));
        }
        return Ok(Expr::Aggregate(aggregate, Box::new(args.remove(0))));
    }
    if let Some((refused, why)) = functions::unsupported(name) {
        return Err(QueryError::unsupported(
            Some(at),
            format!("{refused} is not supported: {why}"),
        ));
    }
    let Some(function) = functions::lookup(name) else {
        return Err(QueryError::invalid(
            Some(at),
            format!("unknown function '{name}'"),
        ));
    };
    if args.len() < function.min_args || args.len() > function.max_args {
        let expected = if function.min_args == function.max_args {
            format!("{}", function.min_args)
        } else {
            format!("{} to {}", function.min_args, function.max_args)
        };
        return Err(QueryError::invalid(
            Some(at),
            format!(
                "{} takes {expected} argument{}, {} given",
                function.name,
                if function.max_args == 1 { "" } else { "s" },
                args.len()
            ),
        ));
    }
    Ok(Expr::Call(function, args))
}

/// Names the select list's items: an alias, else the last property name of a path, else
/// `$1`, `$2`, ... (as Cosmos DB does).
fn name_items(items: Vec<(Expr, Option<String>)>) -> Vec<(Expr, String)> {
    let mut unnamed = 0;
    items
        .into_iter()
        .map(|(expr, name)| {
            let name = name.unwrap_or_else(|| match &expr {
                Expr::Property(_, p) => p.clone(),
                // `NaN` and `Infinity` are constants (the binder makes them numbers, unless an
                // alias has the name), named as constants are.
                Expr::Name(n, _) if non_finite_constant(n).is_none() => n.clone(),
                _ => {
                    unnamed += 1;
                    format!("${unnamed}")
                }
            });
            (expr, name)
        })
        .collect()
}

/// Binds aliases to slots, scope by scope, and checks where aggregates and grouping may be.
#[derive(Default)]
struct Binder {
    slots: usize,
}

/// The aliases in scope: innermost query last.
type Scopes = Vec<Vec<(String, usize)>>;

impl Binder {
    fn bind(&mut self, query: &mut Query, scopes: &mut Scopes) -> Result<(), QueryError> {
        let mut scope = Vec::new();
        if let Some(from) = &mut query.from {
            if !scopes.is_empty() {
                // A subquery ranges over a value of the outer query.
                let (name, at) = &from.root_name;
                from.root = Some(lookup(scopes, name).ok_or_else(|| {
                    QueryError::invalid(
                        Some(*at),
                        format!("'{name}' is not an alias of the outer query: a subquery's FROM ranges over one (e.g. FROM t IN c.tags)"),
                    )
                })?);
            }
            from.slot = self.new_slot();
            scope.push((from.alias.clone(), from.slot));
        }
        scopes.push(scope);
        let result = self.bind_clauses(query, scopes);
        scopes.pop();
        result
    }

    fn bind_clauses(&mut self, query: &mut Query, scopes: &mut Scopes) -> Result<(), QueryError> {
        for join in &mut query.joins {
            // A join's source sees the aliases before it, not its own.
            self.bind_expr(&mut join.source, scopes, Place::Row)?;
            let scope = scopes.last_mut().expect("pushed by bind");
            if scope.iter().any(|(name, _)| *name == join.alias) {
                return Err(QueryError::invalid(
                    Some(join.alias_at),
                    format!("alias '{}' is defined twice", join.alias),
                ));
            }
            join.slot = self.slots;
            self.slots += 1;
            scope.push((join.alias.clone(), join.slot));
        }
        if matches!(query.select, Select::Star) && !query.joins.is_empty() {
            return Err(QueryError::invalid(
                None,
                "SELECT * is valid only with a single input set: with JOIN, name what to select",
            ));
        }
        if let Some(top) = &mut query.top {
            self.bind_expr(top, scopes, Place::Constant)?;
        }
        if let Some((offset, limit)) = &mut query.offset_limit {
            self.bind_expr(offset, scopes, Place::Constant)?;
            self.bind_expr(limit, scopes, Place::Constant)?;
        }
        if let Some(filter) = &mut query.filter {
            self.bind_expr(filter, scopes, Place::Row)?;
        }
        for key in &mut query.group_by {
            if matches!(
                key,
                Expr::Exists(_) | Expr::ArraySubquery(_) | Expr::Subquery(_)
            ) {
                return Err(QueryError::invalid(
                    None,
                    "a GROUP BY expression cannot be a subquery",
                ));
            }
            self.bind_expr(key, scopes, Place::Row)?;
        }
        for key in &mut query.order_by {
            self.bind_expr(&mut key.expr, scopes, Place::Row)?;
            if !is_path(&key.expr) {
                return Err(QueryError::invalid(
                    None,
                    "ORDER BY takes a property path (such as c.name or c[\"a-b\"]), not a computed expression",
                ));
            }
        }
        match &mut query.select {
            Select::Star => {
                if query.from.is_none() {
                    return Err(QueryError::invalid(None, "SELECT * needs a FROM clause"));
                }
            }
            Select::Value(e) => self.bind_expr(e, scopes, Place::Select)?,
            Select::List(items) => {
                for (e, _) in items.iter_mut() {
                    self.bind_expr(e, scopes, Place::Select)?;
                }
            }
        }
        query.aggregates = match &query.select {
            Select::Star => false,
            Select::Value(e) => e.has_aggregate(),
            Select::List(items) => items.iter().any(|(e, _)| e.has_aggregate()),
        };
        if query.aggregates || !query.group_by.is_empty() {
            self.check_grouping(query)?;
            if !query.order_by.is_empty() {
                return Err(QueryError::unsupported(
                    None,
                    "ORDER BY cannot be combined with GROUP BY or aggregates",
                ));
            }
        }
        Ok(())
    }

    fn new_slot(&mut self) -> usize {
        self.slots += 1;
        self.slots - 1
    }

    fn bind_expr(
        &mut self,
        expr: &mut Expr,
        scopes: &mut Scopes,
        place: Place,
    ) -> Result<(), QueryError> {
        match expr {
            Expr::Name(name, at) => {
                if place == Place::Constant {
                    return Err(QueryError::invalid(
                        Some(*at),
                        format!(
                            "'{name}' is not allowed here: TOP, OFFSET and LIMIT take a number or a parameter"
                        ),
                    ));
                }
                // `NaN` and `Infinity` are numbers, unless an alias has the name. (No `if let`
                // guard: the workspace's Rust 1.90 does not have them.)
                match (lookup(scopes, name), non_finite_constant(name)) {
                    (Some(slot), _) => *expr = Expr::Alias(slot),
                    (None, Some(n)) => *expr = Expr::NonFinite(Bits(n)),
                    (None, None) => {
                        return Err(QueryError::invalid(
                            Some(*at),
                            format!("'{name}' is not an alias defined in FROM or JOIN"),
                        ));
                    }
                }
            }
            Expr::Aggregate(_, arg) => {
                if place != Place::Select {
                    return Err(QueryError::invalid(
                        None,
                        "aggregates (COUNT, SUM, MIN, MAX, AVG) are allowed only in the SELECT list",
                    ));
                }
                if arg.has_aggregate() {
                    return Err(QueryError::invalid(
                        None,
                        "an aggregate cannot contain an aggregate",
                    ));
                }
                self.bind_expr(arg, scopes, Place::Row)?;
            }
            Expr::Exists(q) | Expr::ArraySubquery(q) | Expr::Subquery(q) => {
                self.bind(q, scopes)?;
            }
            _ => {
                for child in expr.children_mut() {
                    self.bind_expr(child, scopes, place)?;
                }
            }
        }
        Ok(())
    }

    /// With `GROUP BY` or aggregates, each select item must be an aggregate, a grouping
    /// expression, or built from those and constants.
    fn check_grouping(&self, query: &Query) -> Result<(), QueryError> {
        let items: Vec<&Expr> = match &query.select {
            Select::Star => {
                return Err(QueryError::invalid(
                    None,
                    "SELECT * cannot be used with GROUP BY",
                ));
            }
            Select::Value(e) => vec![e],
            Select::List(items) => items.iter().map(|(e, _)| e).collect(),
        };
        for item in items {
            if !grouped(item, &query.group_by) {
                return Err(QueryError::invalid(
                    None,
                    "with GROUP BY or an aggregate, every SELECT item must be an aggregate or a GROUP BY expression",
                ));
            }
        }
        Ok(())
    }
}

/// Whether `expr` is a path below an alias: what `ORDER BY` can sort by.
fn is_path(expr: &Expr) -> bool {
    match expr {
        Expr::Alias(_) => true,
        Expr::Property(base, _) => is_path(base),
        Expr::Index(base, index) => matches!(**index, Expr::Literal(_)) && is_path(base),
        _ => false,
    }
}

/// The number the name `NaN` or `Infinity` stands for: like JavaScript's globals, these are
/// spelled in exactly that case, and are not reserved (`c.NaN` is a property, and an alias may
/// be so named, which then hides the number). `-Infinity` is `Infinity` negated.
fn non_finite_constant(name: &str) -> Option<f64> {
    match name {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        _ => None,
    }
}

/// The slot of the innermost alias called `name`.
fn lookup(scopes: &Scopes, name: &str) -> Option<usize> {
    scopes
        .iter()
        .rev()
        .find_map(|scope| scope.iter().find(|(n, _)| n == name).map(|(_, s)| *s))
}

/// Whether `expr` can be computed from the group keys and aggregates alone.
fn grouped(expr: &Expr, keys: &[Expr]) -> bool {
    if keys.contains(expr) {
        return true;
    }
    match expr {
        Expr::Literal(_) | Expr::Param(..) | Expr::Aggregate(..) => true,
        Expr::Alias(_) | Expr::Name(..) => false,
        Expr::Exists(_) | Expr::ArraySubquery(_) | Expr::Subquery(_) => false,
        _ => expr
            .children()
            .into_iter()
            .all(|child| grouped(child, keys)),
    }
}

/// Where an expression stands, which decides what it may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Evaluated per row: aliases, no aggregates.
    Row,
    /// In the select list: aggregates allowed.
    Select,
    /// `TOP`, `OFFSET`, `LIMIT`: no aliases.
    Constant,
}

/// A JSON object from parameter pairs, for tests and callers.
pub fn params<I, K>(pairs: I) -> Map<String, Value>
where
    I: IntoIterator<Item = (K, Value)>,
    K: Into<String>,
{
    pairs.into_iter().map(|(k, v)| (k.into(), v)).collect()
}
