//! Why a query was refused or stopped.

use std::fmt;

/// Where in the query text something is: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// What kind of mistake or limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The text is not a query: a token out of place.
    Syntax,
    /// Well-formed, but meaningless: an unknown function or alias, a misplaced aggregate, a
    /// missing or wrongly typed parameter.
    Invalid,
    /// A construct of the Cosmos DB dialect Mayfly does not run.
    Unsupported,
    /// A limit on the query's size or work was reached.
    Limit,
    /// Evaluating it failed (a function refused its arguments).
    Evaluation,
    /// The caller's deadline passed (see `Execution::interrupt_at`): not the query's fault;
    /// the caller runs it again where it may take longer.
    Interrupted,
}

/// A refused or failed query, with a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    pub kind: ErrorKind,
    pub position: Option<Position>,
    pub message: String,
}

impl QueryError {
    pub(crate) fn new(
        kind: ErrorKind,
        position: Option<Position>,
        message: impl Into<String>,
    ) -> Self {
        QueryError {
            kind,
            position,
            message: message.into(),
        }
    }

    /// A syntax error: `expected` at `at`.
    pub(crate) fn syntax(at: Position, expected: &str) -> Self {
        Self::new(
            ErrorKind::Syntax,
            Some(at),
            format!("syntax error: expected {expected}"),
        )
    }

    /// A syntax error: `expected` at `at`, where `found` was.
    pub(crate) fn syntax_found(at: Position, expected: &str, found: &str) -> Self {
        Self::new(
            ErrorKind::Syntax,
            Some(at),
            format!("syntax error: expected {expected}, found {found}"),
        )
    }

    pub(crate) fn invalid(at: Option<Position>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, at, message)
    }

    pub(crate) fn unsupported(at: Option<Position>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, at, message)
    }

    pub(crate) fn limit(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Limit, None, message)
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(at) => write!(f, "{at}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for QueryError {}
