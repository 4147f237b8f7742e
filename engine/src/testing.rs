//! Checks shared by the engine's own tests and the server's fuzz entry points (`fuzz/`, and
//! the corpus replay test). Not part of the API.

use crate::engine::{Error, QueryReads};

/// What `run` returns with no read limit; run as an async worker would run it (inline), it
/// must give up or return the same.
pub fn same_inline<T: std::fmt::Debug>(
    run: impl Fn(QueryReads) -> Result<T, Error>,
) -> Result<T, Error> {
    let all = run(QueryReads::unlimited());
    let inline = run(QueryReads::inline());
    if !matches!(inline, Err(Error::ReadBudgetSpent)) {
        assert_eq!(
            format!("{inline:?}"),
            format!("{all:?}"),
            "a query run inline differs from the same query off the async workers"
        );
    }
    all
}
