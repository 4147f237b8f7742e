//! Mayfly's query language: the SQL dialect of Azure Cosmos DB for NoSQL, parsed into a
//! syntax tree and evaluated over JSON documents with Cosmos DB's semantics (`undefined`
//! versus `null`, comparisons across types, three-valued logic, the `ORDER BY` type order).
//!
//! This crate knows nothing of storage, expiry or gRPC: the engine hands it the documents that
//! are live at the query's clock reading and it computes the results.

pub mod ast;
pub mod error;
mod eval;
pub mod exec;
pub mod functions;
mod lexer;
mod like;
pub mod parser;
pub mod value;

pub use error::{ErrorKind, Position, QueryError};
pub use exec::{Execution, Flow, MAX_HELD_ROWS, is_streaming};
pub use functions::Context;
pub use parser::parse;

/// Runs `text` over `documents` in one go: for tests and tools.
pub fn run(
    text: &str,
    params: &serde_json::Map<String, serde_json::Value>,
    documents: &[serde_json::Value],
    context: Context,
) -> Result<Vec<serde_json::Value>, QueryError> {
    let query = parse(text)?;
    let mut run = Execution::new(&query, params, context)?;
    let mut out = Vec::new();
    // Without FROM, one evaluation whatever the documents (Cosmos DB: `SELECT VALUE 1` is
    // `[1]` on any collection, an empty one too).
    let once = [serde_json::Value::Null];
    let documents = if query.from.is_none() {
        &once[..]
    } else {
        documents
    };
    for doc in documents {
        let flow = run.push(doc)?;
        out.extend(run.take_ready());
        if flow == Flow::Done {
            break;
        }
    }
    out.extend(run.finish()?);
    Ok(out)
}
