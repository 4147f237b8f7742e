//! Why a request's input was rejected: the domain types validate themselves with these.

use std::fmt;

use super::{
    echo::Echo,
    ids::{IdKind, IdProblem},
    partition_key::PartitionKeyValue,
};

/// Why a request's input was rejected.
#[derive(Debug, Clone, PartialEq)]
pub enum InvalidInput {
    /// A collection `defaultTtl` out of range (Cosmos DB's message).
    DefaultTtl { raw: String },
    /// A document `ttl` out of range or of the wrong type (Cosmos DB's message).
    DocumentTtl { raw: String },
    /// A default TTL on a collection that does not index (Cosmos DB's message).
    TtlWithoutIndex,
    /// A change feed retention out of range.
    FeedRetention { raw: i64 },
    /// A provisioned throughput (field `field`) breaking `rule`.
    Throughput {
        field: &'static str,
        value: String,
        rule: String,
    },
    /// A throughput replaced on a collection that has none of its own: it draws on its
    /// database's shared throughput (field `collection`).
    SharedThroughput {
        database: String,
        collection: String,
    },
    /// A database's shared throughput replaced where it was created without one (field
    /// `throughput`).
    NoSharedThroughput { database: String },
    /// A count of feed ranges out of range.
    FeedRangeCount { asked: usize, max: usize },
    /// A feed range that no split of this server made.
    FeedRange { raw: String },
    /// Both a partition key and a feed range for one change feed.
    FeedScopeConflict,
    /// A change feed message size out of range.
    MaxEvents { value: u32, max: u32 },
    /// A change feed start time before 1970 or out of range.
    StartTime { seconds: i64 },
    /// An id breaking the id rules.
    Id {
        kind: IdKind,
        value: String,
        problem: IdProblem,
    },
    /// A partition key path that cannot be used.
    PartitionKeyPath { path: String, reason: String },
    /// The partition key property holds an object or array.
    PartitionKeyValueType { path: String, found: &'static str },
    /// A string partition key value longer than the limit.
    PartitionKeyTooLong { bytes: usize, limit: usize },
    /// The request's partition key differs from the body's.
    PartitionKeyMismatch {
        request: PartitionKeyValue,
        body: PartitionKeyValue,
        path: String,
    },
    /// The request's id differs from the body's.
    IdMismatch { request: String, body: String },
    /// The body has no string `id`.
    MissingId { found: Option<&'static str> },
    /// The request field `ttl` and the body's `ttl` disagree.
    ConflictingTtl { field: i64, body: String },
    /// A patch operation that cannot apply to the document.
    Patch {
        index: usize,
        op: &'static str,
        path: String,
        reason: String,
    },
    /// The body's JSON is larger than the limit.
    DocumentTooLarge { bytes: usize, limit: usize },
    /// The body is nested deeper than the limit.
    DocumentTooDeep { limit: usize },
    /// Another JSON value of a request (a patch value, a query parameter, a partition key
    /// value), named by `field` (client input in it already cut short with `Echo`), is
    /// nested deeper than the limit bodies have.
    ValueTooDeep { field: String, limit: usize },
    /// The body is not representable as JSON (NaN, invalid UTF-8, ...).
    BadJson { reason: String },
    /// A required field is missing from the request.
    MissingField {
        field: &'static str,
        hint: &'static str,
    },
    /// An enum field holds a value this server does not know.
    UnknownEnumValue { field: &'static str, value: i32 },
    /// A read-feed page size out of range.
    PageSize { value: u32, max: u32 },
    /// A continuation token that this feed did not produce.
    Continuation { reason: &'static str },
    /// An indexing policy path that cannot be used.
    IndexPath { path: String, reason: String },
    /// An indexing policy whose paths do not fit together.
    IndexPolicy { reason: String },
    /// A query on a collection without an index, without `enable_scan`.
    ScanNotEnabled { collection: String },
    /// A document whose index terms would exceed the per-document limit.
    IndexTermsTooLarge { limit: usize },
    /// A resource token lifetime out of range.
    TokenTtl { value: u32, max: u32 },
    /// A batch with no operations, or too many.
    BatchSize { count: usize, max: usize },
    /// A patch with no operations, or too many.
    PatchSize { count: usize, max: usize },
    /// A batch reading, returning or indexing more bytes than the limit.
    BatchTooLarge { what: &'static str, limit: usize },
    /// A patch condition that is not `FROM <alias> [JOIN ...] [WHERE ...]`.
    PatchCondition { reason: String },
    /// What is wrong with a patch's `create_if_missing` body (a body rule, or an id or
    /// partition key other than the patched document's): the same reason, named as that body's.
    CreateIfMissing(Box<InvalidInput>),
    /// A patch with both an `if_match` and a `create_if_missing` body.
    IfMatchWithCreate,
    /// A must-live rule that cannot be used.
    MustLiveRule { path: String, reason: String },
    /// More must-live rules, or more bytes of them, than a collection may have.
    MustLiveRules { reason: String },
    /// A document a must-live rule matches, written without `"ttl": -1`.
    MustLive {
        collection: String,
        path: String,
        value: String,
        ttl: Option<String>,
    },
}

const TTL_RULE: &str = "is invalid. Ensure to provide a nonzero positive integer less than or equal to '2147483647', or '-1' which means never expire.";

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidInput::DefaultTtl { raw } => write!(f, "The input defaultTtl '{}' {TTL_RULE}", Echo(raw)),
            InvalidInput::DocumentTtl { raw } => write!(f, "The input ttl '{}' {TTL_RULE}", Echo(raw)),
            InvalidInput::FeedRetention { raw } => write!(
                f,
                "change_feed_retention {raw} is out of range: give seconds from 0 (no change feed) to {} (30 days)",
                super::collection::FeedRetention::MAX_SECS
            ),
            InvalidInput::Throughput { field, value, rule } => write!(
                f,
                "{field} {value} is not a throughput this server provisions: give {rule}"
            ),
            InvalidInput::SharedThroughput {
                database,
                collection,
            } => write!(
                f,
                "collection {:?} has no throughput of its own to replace: it draws on database {:?}'s shared throughput; replace the database's (leave collection empty)",
                Echo(collection),
                Echo(database)
            ),
            InvalidInput::NoSharedThroughput { database } => write!(
                f,
                "throughput: database {:?} shares no throughput among its collections (that is chosen when a database is created); replace a collection's own throughput instead (give collection)",
                Echo(database)
            ),
            InvalidInput::FeedRangeCount { asked, max } => write!(
                f,
                "cannot split a change feed into {asked} ranges: ask for 1 to {max}"
            ),
            InvalidInput::FeedRange { raw } => write!(
                f,
                "feed range {:?} is not one GetFeedRanges returns on this server: ask GetFeedRanges again",
                Echo(raw)
            ),
            InvalidInput::FeedScopeConflict => f.write_str(
                "give a change feed partition_key or a feed_range, not both: a feed range already names the partitions it holds",
            ),
            InvalidInput::MaxEvents { value, max } => {
                write!(f, "max_events {value} is out of range; use 1..={max}, or 0 for 100")
            }
            InvalidInput::StartTime { seconds } => write!(
                f,
                "start_time {seconds} s is before 1970 or out of range: give an instant since the Unix epoch"
            ),
            InvalidInput::TtlWithoutIndex => {
                f.write_str("Indexing mode value cannot be 'none' when 'defaultTtl' is specified in the collection")
            }
            InvalidInput::Id { kind, value, problem } => {
                match kind {
                    IdKind::IdempotencyKey => write!(f, "invalid {kind} {:?}: ", Echo(value))?,
                    _ => write!(f, "invalid {kind} id {:?}: ", Echo(value))?,
                }
                match problem {
                    IdProblem::Separator(c) => write!(f, "it contains {c:?}; ids cannot contain '/', '\\', '?' or '#'"),
                    IdProblem::Control(c) => write!(
                        f,
                        "it contains U+{:04X}, a control character; ids cannot contain control characters (U+0000 to U+001F, U+007F to U+009F)",
                        u32::from(*c)
                    ),
                    IdProblem::Blank => f.write_str("it is only whitespace; ids need a visible character"),
                    IdProblem::Empty => f.write_str("ids must not be empty"),
                    IdProblem::TooLong { chars } => write!(f, "it has {chars} characters; ids have at most 255"),
                }
            }
            InvalidInput::PartitionKeyPath { path, reason } => {
                write!(f, "invalid partition key path {:?}: {reason}", Echo(path))
            }
            InvalidInput::PartitionKeyValueType { path, found } => write!(
                f,
                "the partition key value{} is {found}; it must be a string, number, bool or null",
                if path.is_empty() { String::new() } else { format!(" at {}", Echo(path)) }
            ),
            InvalidInput::PartitionKeyTooLong { bytes, limit } => write!(
                f,
                "the partition key value is {bytes} bytes of UTF-8; the limit is {limit} bytes"
            ),
            InvalidInput::PartitionKeyMismatch { request, body, path } => write!(
                f,
                "the request's partition key {request} does not match the body's value at {}, which is {body}",
                Echo(path)
            ),
            InvalidInput::IdMismatch { request, body } => {
                write!(f, "the request's id '{}' does not match the body's \"id\" '{}'", Echo(request), Echo(body))
            }
            InvalidInput::MissingId { found: None } => f.write_str("the document body needs a string \"id\" property"),
            InvalidInput::MissingId { found: Some(t) } => {
                write!(f, "the document's \"id\" property is {t}; it must be a string")
            }
            InvalidInput::ConflictingTtl { field, body } => write!(
                f,
                "the request's ttl field ({field}) and the body's \"ttl\" property ({}) differ; send one of them, or the same value in both",
                Echo(body)
            ),
            InvalidInput::DocumentTooLarge { bytes, limit } => {
                write!(f, "the document is {bytes} bytes of JSON; the limit is {limit} bytes (2 MiB)")
            }
            InvalidInput::DocumentTooDeep { limit } => write!(
                f,
                "the document is nested deeper than {limit} levels; flatten it or move deep parts to another document"
            ),
            InvalidInput::ValueTooDeep { field, limit } => write!(
                f,
                "{field} is nested deeper than {limit} levels, the limit for every JSON value (document bodies, patch values, query parameters, partition keys)"
            ),
            InvalidInput::BadJson { reason } => write!(f, "{}", Echo(reason)),
            InvalidInput::Patch { index, op, path, reason } => write!(
                f,
                "patch operation {index} ({op} {}): {}",
                Echo(path),
                Echo(reason)
            ),
            InvalidInput::MissingField { field, hint } => write!(f, "the request needs '{field}': {hint}"),
            InvalidInput::UnknownEnumValue { field, value } => {
                write!(f, "'{field}' has the value {value}, which this server does not know")
            }
            InvalidInput::PageSize { value, max } => {
                write!(f, "page_size {value} is out of range; use 1..={max}, or 0 for the default")
            }
            InvalidInput::Continuation { reason } => write!(f, "invalid continuation token: {reason}"),
            InvalidInput::IndexPath { path, reason } => write!(f, "invalid indexing policy path '{}': {reason}", Echo(path)),
            InvalidInput::IndexPolicy { reason } => write!(f, "invalid indexing policy: {reason}"),
            InvalidInput::ScanNotEnabled { collection } => write!(
                f,
                "collection '{}' has indexing mode none, so this query would read every document: set enable_scan on the request to allow it, or give the collection an index",
                Echo(collection)
            ),
            InvalidInput::TokenTtl { value, max } => write!(
                f,
                "ttl_seconds {value} is out of range for a resource token: use 1..={max}, or leave it unset for an hour"
            ),
            InvalidInput::BatchSize { count, max } => {
                write!(f, "a batch has 1 to {max} operations; this one has {count}")
            }
            InvalidInput::PatchSize { count, max } => {
                write!(f, "a patch has 1 to {max} operations; this one has {count}")
            }
            InvalidInput::BatchTooLarge { what, limit } => write!(
                f,
                "with this operation the batch {what} more than {limit} bytes; split it into smaller batches"
            ),
            InvalidInput::PatchCondition { reason } => write!(
                f,
                "invalid patch condition: {}; write it as a query without SELECT, such as \"FROM c WHERE c.status = 'active'\"",
                Echo(reason)
            ),
            InvalidInput::CreateIfMissing(inner) => write!(f, "create_if_missing: {inner}"),
            InvalidInput::IfMatchWithCreate => f.write_str(
                "if_match cannot be combined with create_if_missing: an etag names a version of a live document, and a patch that may create has none to name; send one or the other"
            ),
            InvalidInput::MustLiveRule { path, reason } => {
                write!(f, "invalid must-live rule for path {:?}: {reason}", Echo(path))
            }
            InvalidInput::MustLiveRules { reason } => f.write_str(reason),
            InvalidInput::MustLive { collection, path, value, ttl } => {
                write!(
                    f,
                    "collection '{}' keeps documents whose {} is {value} forever (a must-live rule), and this one ",
                    Echo(collection),
                    Echo(path)
                )?;
                match ttl {
                    None => f.write_str("has no \"ttl\": -1, so it would inherit the collection's default TTL")?,
                    Some(ttl) => write!(f, "has \"ttl\": {ttl}, so it would expire")?,
                }
                f.write_str("; give it \"ttl\": -1 (DocumentTtl::Never in the Rust client), or change the rule with ReplaceCollection")
            }
            InvalidInput::IndexTermsTooLarge { limit } => write!(
                f,
                "the document's index terms (each indexed path with its value) would exceed {limit} bytes: many properties under long nested paths; exclude those paths from the collection's indexing policy or flatten the document"
            ),
        }
    }
}

impl std::error::Error for InvalidInput {}
