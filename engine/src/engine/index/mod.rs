//! Secondary indexes: what a document's index terms are, what the stored index holds per
//! path, and how a query uses it.

pub(crate) mod ordered;
pub(crate) mod path_stats;
pub(crate) mod plan;
pub(crate) mod read;
pub(crate) mod terms;
