//! What can go wrong in the engine, with messages a person can act on. The gRPC edge maps
//! each variant to a status code in exactly one place (`grpc::status`).

use std::fmt;

use super::clock::Millis;
use crate::model::{Echo, InvalidInput, PartitionKeyValue};
use crate::storage::{StorageError, StorageErrorKind};

/// Every failure an engine call can report.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The request is malformed; nothing was changed.
    Invalid(InvalidInput),
    /// No database with that id.
    DatabaseNotFound { database: String },
    /// A database with that id exists.
    DatabaseExists { database: String },
    /// No collection with that id in the database.
    CollectionNotFound {
        database: String,
        collection: String,
    },
    /// A collection with that id exists in the database.
    CollectionExists {
        database: String,
        collection: String,
    },
    /// No live document with that id in that partition (absent, deleted or expired).
    DocumentNotFound {
        id: String,
        partition_key: PartitionKeyValue,
    },
    /// A live document with that id exists in that partition.
    DocumentExists {
        id: String,
        partition_key: PartitionKeyValue,
    },
    /// `if_match` named an etag the live document no longer has (or it is gone).
    PreconditionFailed { id: String, if_match: String },
    /// The storage backend failed or refused; the write was not applied.
    Storage(StorageError),
    /// The result could not be confirmed durable: a write it made or reflects may or may not
    /// survive a restart.
    NotDurable(StorageError),
    /// A patch's condition does not hold for the live document; nothing was changed.
    ConditionNotMet { id: String, condition: String },
    /// An operation of a transactional batch failed, so nothing in the batch was applied.
    BatchOperation {
        /// Its position in the batch, from 0.
        index: usize,
        /// What it is: create, upsert, replace, read, delete, patch or touch.
        op: &'static str,
        /// Why it failed.
        source: Box<Error>,
    },
    /// Other writes changed a batch's documents during each of its attempts; nothing was
    /// changed, and it may be retried. Single-document writes never fail so.
    Contended { attempts: usize },
    /// A query was refused (syntax, unknown name, limit) or failed while running; nothing was
    /// changed.
    Query(mayfly_query::QueryError),
    /// A query tried on an async worker needed more reads than it may make there (see
    /// [`super::QueryReads::inline`]); the edge runs it again on a blocking thread. Never
    /// shown to a client.
    ReadBudgetSpent,
    /// The request's client went away before its work was done; nobody sees this.
    Cancelled,
    /// This node does not serve the document's partition now: in cluster mode it follows the
    /// partition's owner elsewhere. Nothing was changed; the request may be retried, through
    /// a client that routes it to the owner.
    NotOwner { partition: usize },
    /// The partition's log does not continue the history the cluster acknowledged (a message
    /// missing, out of order or damaged): no node serves it until an operator restores the
    /// log, rather than serve a history that may have lost an acknowledged write.
    LogDiverged { partition: usize, why: String },
    /// The partition's log diverged as for [`Error::LogDiverged`], and its owner, which holds
    /// the history the divergence was found in, is re-basing the log on its copy: nothing was
    /// changed; retry in a few seconds.
    LogRepairing { partition: usize, why: String },
    /// The server began shutting down before the request's work was done; nothing was
    /// changed, and a feed or query resumes from its last continuation on a running server.
    ShuttingDown,
    /// The memory a page needs could not be reserved (see [`super::PageMemory`]); nothing
    /// was held.
    NoMemory,
    /// A continuation made under another plan (the collection's indexing policy changed
    /// since it was issued): resuming it would skip or repeat results.
    ContinuationStale { reason: &'static str },
    /// An idempotency key remembered for another request (see the `idempotency` module);
    /// nothing was changed.
    KeyReused { key: String, applied_at: Millis },
    /// The request with this idempotency key was applied before, and its answer is no longer
    /// kept; nothing was changed now.
    RequestApplied { key: String, applied_at: Millis },
    /// The shard remembers as many idempotency keys as it may; nothing was changed, and the
    /// request may be retried after `retry_after_ms`, when the oldest key is forgotten.
    KeysFull { max: usize, retry_after_ms: Millis },
    /// The collection (or its database, whose throughput it shares) spent what it is
    /// provisioned for now; nothing was changed, and the request may be retried after
    /// `retry_after_ms`. Decided at the edge, before the engine is asked anything.
    RequestRateTooLarge {
        /// "collection db/c" or "database db".
        budget: String,
        limit: u32,
        retry_after_ms: Millis,
    },
    /// The collection keeps no change feed (its `change_feed_retention` is 0).
    NoChangeFeed {
        database: String,
        collection: String,
    },
    /// A change feed continuation from before the feed was last turned on: the changes made
    /// while it was off are in no feed.
    FeedRestarted { since: Millis },
    /// A change feed continuation points at events retention has removed: resuming it would
    /// skip them. `oldest` is the oldest position still kept in that shard, written at `at`.
    ChangesTrimmed {
        shard: usize,
        oldest: u64,
        at: Option<Millis>,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(e) => e.fmt(f),
            Error::DatabaseNotFound { database } => {
                write!(f, "database '{}' does not exist", Echo(database))
            }
            Error::DatabaseExists { database } => {
                write!(f, "database '{}' already exists", Echo(database))
            }
            Error::CollectionNotFound {
                database,
                collection,
            } => {
                write!(
                    f,
                    "collection '{}' does not exist in database '{}'",
                    Echo(collection),
                    Echo(database)
                )
            }
            Error::CollectionExists {
                database,
                collection,
            } => {
                write!(
                    f,
                    "collection '{}' already exists in database '{}'",
                    Echo(collection),
                    Echo(database)
                )
            }
            Error::DocumentNotFound { id, partition_key } => write!(
                f,
                "document '{}' does not exist in partition {partition_key} (never written, deleted, or expired)",
                Echo(id)
            ),
            Error::DocumentExists { id, partition_key } => write!(
                f,
                "document '{}' already exists in partition {partition_key}; use upsert or replace to overwrite it",
                Echo(id)
            ),
            Error::PreconditionFailed { id, if_match } => write!(
                f,
                "document '{}' no longer has etag '{}' (it was written, deleted or expired since); read it again and retry",
                Echo(id),
                Echo(if_match)
            ),
            Error::ConditionNotMet { id, condition } => write!(
                f,
                "document '{}' does not match the patch condition \"{}\"; nothing was changed",
                Echo(id),
                Echo(condition)
            ),
            Error::BatchOperation { index, op, source } => write!(
                f,
                "batch operation {index} ({op}) failed, so nothing in the batch was applied: {source}"
            ),
            Error::Contended { attempts } => write!(
                f,
                "other requests wrote the documents during each of this request's {attempts} attempts, so nothing was applied; retry it after a short, random delay"
            ),
            Error::Storage(e) => write!(f, "storage failure, nothing was written: {e}"),
            Error::Query(e) => write!(f, "query: {e}"),
            Error::ReadBudgetSpent => {
                f.write_str("internal: a query tried on an async worker was not run again off it")
            }
            Error::Cancelled => f.write_str("the request was cancelled by its client"),
            Error::NotOwner { partition } => write!(
                f,
                "this node does not serve partition {partition} now (it follows the partition's owner); nothing was changed: retry, through a client that routes to the owner"
            ),
            Error::LogDiverged { partition, why } => write!(
                f,
                "partition {partition}'s log does not continue the history the cluster acknowledged ({why}); no node holds a history to re-base it on, and it serves nothing until an operator restores the log and clears the alarm (docs/cluster.md, \"Repair\")"
            ),
            Error::LogRepairing { partition, why } => write!(
                f,
                "partition {partition}'s log does not continue the history the cluster acknowledged ({why}); its owner is re-basing the log on its copy; nothing was changed: retry in a few seconds"
            ),
            Error::ShuttingDown => f.write_str(
                "the server is shutting down; retry on a running server (a feed or query resumes from its last continuation)",
            ),
            Error::NoMemory => f.write_str(
                "the server's memory for responses is in use by other calls; retry later (a feed or query resumes from its last continuation)",
            ),
            Error::ContinuationStale { reason } => write!(
                f,
                "the continuation no longer applies: {reason}; start the query again without it"
            ),
            Error::KeyReused { key, applied_at } => write!(
                f,
                "idempotency key '{}' was used at {} for a different request (another operation, document or body); a key names one request: use a new key for a new request",
                Echo(key),
                Rfc3339(*applied_at)
            ),
            Error::RequestApplied { key, applied_at } => write!(
                f,
                "the request with idempotency key '{}' was applied at {}, and its answer is no longer kept (the server restarted since, or newer answers took its place); nothing was changed now: read the documents for their current state",
                Echo(key),
                Rfc3339(*applied_at)
            ),
            Error::RequestRateTooLarge {
                budget,
                limit,
                retry_after_ms,
            } => write!(
                f,
                "the {budget} is provisioned {limit} request units per second and has spent them; retry in {retry_after_ms} ms, or raise its throughput"
            ),
            Error::KeysFull { max, retry_after_ms } => write!(
                f,
                "the server remembers {max} idempotency keys for this partition's shard, its most; retry in {retry_after_ms} ms, when the oldest is forgotten, or send the write without a key"
            ),
            Error::NotDurable(e) => write!(
                f,
                "the outcome is unknown: storage could not confirm it durable, so a write this request made or read may or may not survive a restart: {e}"
            ),
            Error::NoChangeFeed {
                database,
                collection,
            } => write!(
                f,
                "collection '{}' in database '{}' keeps no change feed: set its change_feed_retention above 0 (ReplaceCollection); changes made before that are not in any feed",
                Echo(collection),
                Echo(database)
            ),
            Error::FeedRestarted { since } => write!(
                f,
                "the continuation is from before the collection's change feed was turned on again (at {since} ms since the Unix epoch): changes made while it was off are in no feed; start again from `beginning` and rebuild what depends on the feed"
            ),
            Error::ChangesTrimmed { shard, oldest, at } => {
                write!(
                    f,
                    "the continuation points at change feed events that retention has removed; the oldest kept in shard {shard} is at position {oldest}"
                )?;
                if let Some(at) = at {
                    write!(f, ", committed at {at} ms since the Unix epoch")?;
                }
                f.write_str(": start again from `beginning` (or a point in time) and rebuild what depends on the feed, or raise change_feed_retention")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<InvalidInput> for Error {
    fn from(e: InvalidInput) -> Self {
        Error::Invalid(e)
    }
}

impl From<mayfly_query::QueryError> for Error {
    fn from(e: mayfly_query::QueryError) -> Self {
        match e.kind {
            // Only runs tried inline set a deadline (see `QueryReads::execution`).
            mayfly_query::ErrorKind::Interrupted => Error::ReadBudgetSpent,
            _ => Error::Query(e),
        }
    }
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        match e.kind() {
            StorageErrorKind::OutcomeUnknown => Error::NotDurable(e),
            StorageErrorKind::Failed | StorageErrorKind::Unavailable => Error::Storage(e),
        }
    }
}

/// An instant (Unix epoch ms) written as RFC 3339 UTC, to the millisecond.
struct Rfc3339(Millis);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = i64::try_from(self.0)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis);
        match at {
            Some(at) => f.write_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            None => write!(f, "{} ms after the Unix epoch", self.0),
        }
    }
}
