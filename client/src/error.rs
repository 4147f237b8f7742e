//! Errors, converted from gRPC statuses in one place ([`Error::from_status`]).

use std::{fmt, io, sync::Arc, time::Duration};

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// What can go wrong talking to Mayfly.
///
/// Every error the server sends names its cause in [`Error::reason`] (the `ErrorInfo` reason
/// of the gRPC status), so that, say, a [`Conflict`](Error::Conflict) on a database can be
/// told from one on a document without reading the message. A document that is not there is
/// not an error for the verbs that name one (see the crate's table of outcomes).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The document does not exist: never written, deleted, or expired.
    NotFound(ErrorDetails),
    /// The database does not exist.
    DatabaseNotFound(ErrorDetails),
    /// The collection does not exist.
    CollectionNotFound(ErrorDetails),
    /// The database, collection or document already exists ([`Reason::DatabaseExists`],
    /// [`Reason::CollectionExists`], [`Reason::DocumentExists`]).
    Conflict(ErrorDetails),
    /// An `if_match` etag no longer matches ([`Reason::EtagMismatch`]), or a condition was
    /// false ([`Reason::ConditionNotMet`]).
    PreconditionFailed(ErrorDetails),
    /// The request was rejected as malformed; the message says what to fix and the reason
    /// which rule it broke (e.g. [`Reason::InvalidTtl`], [`Reason::PartitionKeyMismatch`]).
    InvalidArgument(ErrorDetails),
    /// The server could not serve the request now, or the connection broke during it. With
    /// [`Reason::OutcomeUnknown`] a write may or may not have been applied.
    Unavailable(ErrorDetails),
    /// The server is out of a budget (throughput, memory for responses); nothing was changed
    /// and the request may be sent again later.
    ResourceExhausted(ErrorDetails),
    /// No answer within the request timeout (see
    /// [`ClientBuilder::request_timeout`](crate::ClientBuilder::request_timeout)), or the
    /// server's `DEADLINE_EXCEEDED`. A write that timed out may or may not have been applied.
    Timeout(ErrorDetails),
    /// The server could not be reached at all: the request was never sent.
    Connect {
        /// The address as given to [`Client::builder`](crate::Client::builder).
        address: String,
        /// The cause: the operating system's error (with its [`io::ErrorKind`], e.g.
        /// `ConnectionRefused`) or the TLS library's, with the layers around it in its text.
        source: Arc<io::Error>,
    },
    /// A document body could not be converted to or from JSON.
    Serialization(String),
    /// The server needs a key or resource token, and none was given, or the one given is
    /// not valid (unknown, altered, regenerated since, or an expired token).
    Unauthenticated(ErrorDetails),
    /// The key or token is valid but does not allow this request: a read-only key asked to
    /// write, or a token used outside its database, collection or partition.
    PermissionDenied(ErrorDetails),
    /// Any other gRPC failure ([`ErrorDetails::code`] says which).
    Other(ErrorDetails),
}

/// What the server (or this client, for checks it makes before sending) said about a failed
/// request.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// use mayfly_client::{Error, Reason};
/// let db = client.create_database("app").await?;
/// let c = db.create_collection("c", "/k").await?;
/// let err = c.create(&serde_json::json!({"id": "a", "k": 1, "ttl": 0})).await.unwrap_err();
/// let details = err.details().expect("from the server");
/// assert_eq!(details.reason(), Some(&Reason::InvalidTtl));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorDetails {
    code: StatusCode,
    message: String,
    reason: Option<Reason>,
    operation_index: Option<usize>,
    /// What the failed request cost, in hundredths of a request unit.
    request_charge: u64,
    /// How long the server asked the client to wait before sending it again.
    retry_after: Option<Duration>,
}

/// The `x-request-charge` header of an answer, in hundredths of a request unit (0 where it is
/// absent or not a charge).
pub(crate) fn charge_of(metadata: &tonic::metadata::MetadataMap) -> u64 {
    metadata
        .get("x-request-charge")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map_or(0, |v| (v * 100.0).round() as u64)
}

impl ErrorDetails {
    pub(crate) fn new(code: Code, message: impl Into<String>, reason: Option<Reason>) -> Self {
        ErrorDetails {
            code: StatusCode::from(code),
            message: message.into(),
            reason,
            operation_index: None,
            request_charge: 0,
            retry_after: None,
        }
    }

    /// How long the server asked to wait before the request is sent again (a throttled
    /// request's delay, `google.rpc.RetryInfo`), if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// What the failed request cost, in request units: a request that reached the data
    /// costs at least a lookup (a missing document, a failed condition); one refused before
    /// (bad input, no access, throttled) or never answered costs 0.
    pub fn request_charge(&self) -> f64 {
        self.request_charge as f64 / 100.0
    }

    /// The gRPC status code, typed: [`StatusCode::AlreadyExists`], [`StatusCode::NotFound`],
    /// ... Its number and wire name are [`StatusCode::as_i32`] and [`StatusCode::as_str`].
    /// Which rule the server applied is finer than the code: see [`reason`](Self::reason).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::{Error, StatusCode};
    /// client.create_database("app").await?;
    /// match client.create_database("app").await {
    ///     Err(Error::Conflict(details)) => {
    ///         assert_eq!(details.code(), StatusCode::AlreadyExists);
    ///         assert_eq!((details.code().as_i32(), details.code().as_str()), (6, "ALREADY_EXISTS"));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn code(&self) -> StatusCode {
        self.code
    }

    /// The message, meant for a person.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// match client.database("nope").collection("c").info().await {
    ///     Err(mayfly_client::Error::DatabaseNotFound(details)) => assert!(details.message().contains("nope")),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The server's `ErrorInfo` reason, typed ([`Reason::Other`] keeps a name this client
    /// does not know); its wire name is [`Reason::as_str`]. `None` for a status without one
    /// (sent by the HTTP/2 layer, or made by this client from a broken connection).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::{Error, Reason};
    /// client.create_database("app").await?;
    /// if let Err(Error::Conflict(details)) = client.create_database("app").await {
    ///     assert_eq!(details.reason(), Some(&Reason::DatabaseExists));
    ///     assert_eq!(details.reason().map(Reason::as_str), Some("DATABASE_EXISTS"));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn reason(&self) -> Option<&Reason> {
        self.reason.as_ref()
    }

    /// The index (from 0) of the operation of a transactional batch that failed, when the
    /// server names one.
    ///
    /// ```
    /// use mayfly_client::ErrorDetails;
    /// # fn check(details: &ErrorDetails) {
    /// if let Some(i) = details.operation_index() {
    ///     eprintln!("operation {i} of the batch failed: {}", details.message());
    /// }
    /// # }
    /// ```
    pub fn operation_index(&self) -> Option<usize> {
        self.operation_index
    }
}

impl fmt::Display for ErrorDetails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Declares [`StatusCode`], its numbers and wire names in one table.
macro_rules! status_codes {
    ($($(#[$doc:meta])* $variant:ident = $number:literal $wire:literal,)*) => {
        /// A gRPC status code ([`ErrorDetails::code`]): the coarse class of a failure, which
        /// the [`Error`] variants follow. Its number ([`as_i32`](Self::as_i32)) and wire name
        /// ([`as_str`](Self::as_str)) are gRPC's. The finer cause is the [`Reason`].
        ///
        /// ```
        /// use mayfly_client::StatusCode;
        /// assert_eq!(StatusCode::from_i32(5), Some(StatusCode::NotFound));
        /// assert_eq!(StatusCode::NotFound.as_i32(), 5);
        /// assert_eq!(StatusCode::NotFound.as_str(), "NOT_FOUND");
        /// assert_eq!(StatusCode::from_i32(99), None);
        /// ```
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum StatusCode {
            $($(#[$doc])* $variant,)*
        }

        impl StatusCode {
            /// The code numbered `n` by gRPC; `None` for a number gRPC does not define.
            ///
            /// ```
            /// assert_eq!(mayfly_client::StatusCode::from_i32(14), Some(mayfly_client::StatusCode::Unavailable));
            /// ```
            pub fn from_i32(n: i32) -> Option<Self> {
                match n {
                    $($number => Some(StatusCode::$variant),)*
                    _ => None,
                }
            }

            /// gRPC's number for the code (`5` for `NOT_FOUND`).
            ///
            /// ```
            /// assert_eq!(mayfly_client::StatusCode::AlreadyExists.as_i32(), 6);
            /// ```
            pub fn as_i32(self) -> i32 {
                match self {
                    $(StatusCode::$variant => $number,)*
                }
            }

            /// gRPC's name for the code (`"NOT_FOUND"`).
            ///
            /// ```
            /// assert_eq!(mayfly_client::StatusCode::FailedPrecondition.as_str(), "FAILED_PRECONDITION");
            /// ```
            pub fn as_str(self) -> &'static str {
                match self {
                    $(StatusCode::$variant => $wire,)*
                }
            }
        }
    };
}

status_codes! {
    /// Not an error.
    Ok = 0 "OK",
    /// The request was cancelled.
    Cancelled = 1 "CANCELLED",
    /// An error without a better code.
    Unknown = 2 "UNKNOWN",
    /// The request is malformed.
    InvalidArgument = 3 "INVALID_ARGUMENT",
    /// No answer in time.
    DeadlineExceeded = 4 "DEADLINE_EXCEEDED",
    /// A database, collection or document that is not there.
    NotFound = 5 "NOT_FOUND",
    /// A database, collection or document that is there already.
    AlreadyExists = 6 "ALREADY_EXISTS",
    /// Valid credentials that do not allow the request.
    PermissionDenied = 7 "PERMISSION_DENIED",
    /// Out of a budget (throughput, memory), or a message too large.
    ResourceExhausted = 8 "RESOURCE_EXHAUSTED",
    /// A stale `if_match` or a false condition.
    FailedPrecondition = 9 "FAILED_PRECONDITION",
    /// Aborted, as a contended batch.
    Aborted = 10 "ABORTED",
    /// Out of range.
    OutOfRange = 11 "OUT_OF_RANGE",
    /// Not implemented by the server.
    Unimplemented = 12 "UNIMPLEMENTED",
    /// A fault in the server.
    Internal = 13 "INTERNAL",
    /// The server cannot serve now, or the connection broke.
    Unavailable = 14 "UNAVAILABLE",
    /// Data lost.
    DataLoss = 15 "DATA_LOSS",
    /// No or invalid credentials.
    Unauthenticated = 16 "UNAUTHENTICATED",
}

impl From<Code> for StatusCode {
    fn from(code: Code) -> Self {
        // tonic's codes are gRPC's: every one has its number here.
        StatusCode::from_i32(code as i32).unwrap_or(StatusCode::Unknown)
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Declares [`Reason`] and its wire names in one table, so that the two cannot drift apart.
macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident = $wire:literal,)*) => {
        /// Why the server refused a request: the `reason` of the `google.rpc.ErrorInfo` that
        /// every Mayfly error carries (domain `mayfly.v1`). A reason this client does not know
        /// (from a newer server) arrives as [`Reason::Other`] with its name.
        ///
        /// ```
        /// use mayfly_client::Reason;
        /// assert_eq!(Reason::from_wire("ETAG_MISMATCH"), Reason::EtagMismatch);
        /// assert_eq!(Reason::EtagMismatch.as_str(), "ETAG_MISMATCH");
        /// assert_eq!(Reason::from_wire("SOMETHING_NEW"), Reason::Other("SOMETHING_NEW".into()));
        /// ```
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
            /// A reason this client does not know, as the server named it.
            Other(String),
        }

        impl Reason {
            /// The reason from its wire name (`"DOCUMENT_NOT_FOUND"`).
            ///
            /// ```
            /// use mayfly_client::Reason;
            /// assert_eq!(Reason::from_wire("INVALID_TTL"), Reason::InvalidTtl);
            /// ```
            pub fn from_wire(name: &str) -> Self {
                match name {
                    $($wire => Reason::$variant,)*
                    other => Reason::Other(other.to_owned()),
                }
            }

            /// The wire name (`"DOCUMENT_NOT_FOUND"`).
            ///
            /// ```
            /// use mayfly_client::Reason;
            /// assert_eq!(Reason::OutcomeUnknown.as_str(), "OUTCOME_UNKNOWN");
            /// ```
            pub fn as_str(&self) -> &str {
                match self {
                    $(Reason::$variant => $wire,)*
                    Reason::Other(name) => name,
                }
            }
        }
    };
}

reasons! {
    /// The database does not exist.
    DatabaseNotFound = "DATABASE_NOT_FOUND",
    /// The collection does not exist.
    CollectionNotFound = "COLLECTION_NOT_FOUND",
    /// The document does not exist (never written, deleted, or expired).
    DocumentNotFound = "DOCUMENT_NOT_FOUND",
    /// A database with the id exists.
    DatabaseExists = "DATABASE_EXISTS",
    /// A collection with the id exists (or exists with another partition key path, for
    /// [`Database::create_collection_if_not_exists`](crate::Database::create_collection_if_not_exists)).
    CollectionExists = "COLLECTION_EXISTS",
    /// A live document with the id exists in the partition.
    DocumentExists = "DOCUMENT_EXISTS",
    /// The `if_match` etag is not the live document's.
    EtagMismatch = "ETAG_MISMATCH",
    /// A patch's condition was false for the document.
    ConditionNotMet = "CONDITION_NOT_MET",
    /// Storage cannot make writes durable now; nothing was changed, retry later.
    StorageUnavailable = "STORAGE_UNAVAILABLE",
    /// A fault in storage.
    StorageFailure = "STORAGE_FAILURE",
    /// Storage failed partway through a write: it may or may not have been applied. Never
    /// retried automatically, a write sent again could apply twice.
    OutcomeUnknown = "OUTCOME_UNKNOWN",
    /// A query that does not parse.
    QuerySyntax = "QUERY_SYNTAX",
    /// A query that parses but is not valid (unknown name, wrong arity, ...).
    QueryInvalid = "QUERY_INVALID",
    /// A query using something Mayfly does not support.
    QueryUnsupported = "QUERY_UNSUPPORTED",
    /// A query beyond a limit (size, nesting, results held).
    QueryLimit = "QUERY_LIMIT",
    /// A query that failed while running.
    QueryEvaluation = "QUERY_EVALUATION",
    /// A collection's `defaultTtl` out of range.
    InvalidDefaultTtl = "INVALID_DEFAULT_TTL",
    /// A document's `ttl` out of range or not a whole number.
    InvalidTtl = "INVALID_TTL",
    /// A default TTL on a collection without an index.
    TtlWithoutIndex = "TTL_WITHOUT_INDEX",
    /// A document, collection or database id that is empty, too long or has `/ \ ? #`.
    InvalidId = "INVALID_ID",
    /// A partition key path that is not a JSON path.
    InvalidPartitionKeyPath = "INVALID_PARTITION_KEY_PATH",
    /// A partition key value that is not a string, number, bool or null.
    InvalidPartitionKey = "INVALID_PARTITION_KEY",
    /// A partition key value too long.
    PartitionKeyTooLong = "PARTITION_KEY_TOO_LONG",
    /// The partition key given differs from the one in the body.
    PartitionKeyMismatch = "PARTITION_KEY_MISMATCH",
    /// The id given differs from the one in the body.
    IdMismatch = "ID_MISMATCH",
    /// A body without a string `id`.
    MissingId = "MISSING_ID",
    /// A `ttl` in the body and another in the request.
    ConflictingTtl = "CONFLICTING_TTL",
    /// A document above 2 MiB of JSON.
    DocumentTooLarge = "DOCUMENT_TOO_LARGE",
    /// A document nested deeper than 128 levels.
    DocumentTooDeep = "DOCUMENT_TOO_DEEP",
    /// A body that is not valid JSON.
    InvalidJson = "INVALID_JSON",
    /// A patch operation that cannot apply (its index and path in the message).
    InvalidPatch = "INVALID_PATCH",
    /// A patch condition that is not a valid `FROM c WHERE ...` predicate.
    InvalidPatchCondition = "INVALID_PATCH_CONDITION",
    /// A document that a collection's must-live rule keeps forever, written without
    /// `"ttl": -1` ([`DocumentTtl::Never`](crate::DocumentTtl::Never)); nothing was written.
    MustLive = "MUST_LIVE",
    /// A must-live rule that cannot be used (its path, its values, too many rules).
    InvalidMustLiveRule = "INVALID_MUST_LIVE_RULE",
    /// A required request field left out.
    MissingField = "MISSING_FIELD",
    /// An enum value the server does not know.
    UnknownEnumValue = "UNKNOWN_ENUM_VALUE",
    /// A page size outside 1–1000.
    InvalidPageSize = "INVALID_PAGE_SIZE",
    /// A continuation token that is not one of this collection's.
    InvalidContinuation = "INVALID_CONTINUATION",
    /// An indexing policy that is not valid.
    InvalidIndexingPolicy = "INVALID_INDEXING_POLICY",
    /// A query that would read every document of a collection without an index, without
    /// `enable_scan`.
    ScanNotEnabled = "SCAN_NOT_ENABLED",
    /// A document whose index entries are too large.
    IndexTermsTooLarge = "INDEX_TERMS_TOO_LARGE",
    /// A resource token lifetime out of range.
    InvalidTokenTtl = "INVALID_TOKEN_TTL",
    /// A transactional batch that is empty, spans partitions or is otherwise malformed.
    InvalidBatch = "INVALID_BATCH",
    /// A transactional batch above its size limits.
    BatchTooLarge = "BATCH_TOO_LARGE",
    /// A request message that does not decode as protobuf (status `INVALID_ARGUMENT`).
    UndecodableMessage = "UNDECODABLE_MESSAGE",
    /// A request message larger than the server takes (16 MiB; status `RESOURCE_EXHAUSTED`,
    /// never retried: the same request would be refused again).
    MessageTooLarge = "MESSAGE_TOO_LARGE",
    /// Other writes changed a batch's documents during each of its attempts on the server;
    /// nothing was applied and it may be sent again (status `ABORTED`).
    Contended = "CONTENDED",
    /// The idempotency key was used for a different request while the server remembers it;
    /// nothing was applied (status `INVALID_ARGUMENT`). Use a new key for a new request.
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED",
    /// The request with this idempotency key was applied before and its first answer is no
    /// longer kept (the server restarted since, or many answers came after it); nothing was
    /// applied now (status `ALREADY_EXISTS`, so [`Error::Conflict`]).
    RequestAlreadyApplied = "REQUEST_ALREADY_APPLIED",
    /// The server remembers as many idempotency keys as it may; nothing was applied, and the
    /// request may be sent again later (status `RESOURCE_EXHAUSTED`).
    IdempotencyKeysFull = "IDEMPOTENCY_KEYS_FULL",
    /// The collection spent the throughput it is provisioned for now (Cosmos DB's 429); nothing
    /// was applied, and the client sends the request again after the server's delay
    /// ([`ErrorDetails::retry_after`]; see [`RetryPolicy::throttle_retries`](crate::RetryPolicy::throttle_retries);
    /// status `RESOURCE_EXHAUSTED`).
    RequestRateTooLarge = "REQUEST_RATE_TOO_LARGE",
    /// A provisioned throughput out of its bounds (status `INVALID_ARGUMENT`).
    InvalidThroughput = "INVALID_THROUGHPUT",
    /// Cluster mode: the node does not serve the partition now (it moved, or its owner's lease
    /// lapsed; status `UNAVAILABLE`, retried by the SDK's policy).
    NotOwner = "NOT_OWNER",
    /// Cluster mode: the partition's log does not continue the history the cluster
    /// acknowledged and no node holds a history to re-base it on, so no node serves it until
    /// an operator restores the log (status `FAILED_PRECONDITION`, never retried).
    LogDiverged = "LOG_DIVERGED",
    /// Cluster mode: the partition's log diverged and its owner is re-basing it on its copy;
    /// nothing was changed (status `UNAVAILABLE`, retried by the SDK's policy).
    LogRepairing = "LOG_REPAIRING",
    /// Cluster mode: the node could not confirm the cluster's keys with NATS lately, so it
    /// takes no key or token (status `UNAVAILABLE`).
    KeysUnconfirmed = "KEYS_UNCONFIRMED",
    /// The server needs a key or token and none was sent.
    MissingCredentials = "MISSING_CREDENTIALS",
    /// The key or token is not valid.
    InvalidCredentials = "INVALID_CREDENTIALS",
    /// The resource token has expired.
    TokenExpired = "TOKEN_EXPIRED",
    /// A read-only key asked to write.
    ReadOnlyKey = "READ_ONLY_KEY",
    /// A read-only token asked to write.
    ReadOnlyToken = "READ_ONLY_TOKEN",
    /// A request only a key may make (managing databases, collections, keys).
    KeyRequired = "KEY_REQUIRED",
    /// A token used outside its database, collection or partition.
    OutOfTokenScope = "OUT_OF_TOKEN_SCOPE",
    /// A token whose database or collection was deleted since it was minted: it grants
    /// nothing on one created later under the same name; mint a new one.
    TokenResourceDeleted = "TOKEN_RESOURCE_DELETED",
    /// A change feed asked of a collection that keeps none (its `change_feed_retention` is 0;
    /// status `FAILED_PRECONDITION`).
    ChangeFeedOff = "CHANGE_FEED_OFF",
    /// A change feed continuation behind what retention kept: resuming it would skip events
    /// (status `OUT_OF_RANGE`; the message names the oldest position kept). Start again from
    /// the beginning and rebuild what depends on the feed.
    ChangeFeedTrimmed = "CHANGE_FEED_TRIMMED",
    /// A feed range this server did not make, a count of ranges out of range, or a partition
    /// key given with a feed range.
    InvalidFeedRange = "INVALID_FEED_RANGE",
    /// A change feed retention outside 0 to 30 days.
    InvalidChangeFeedRetention = "INVALID_CHANGE_FEED_RETENTION",
    /// A change feed start time before 1970.
    InvalidStartTime = "INVALID_START_TIME",
    /// Key administration on a server without keys.
    NoKeys = "NO_KEYS",
    /// Key administration on a server whose keys were given on its command line.
    KeysGiven = "KEYS_GIVEN",
    /// A new key that could not be written to disk.
    KeyNotWritten = "KEY_NOT_WRITTEN",
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The message, without the kind.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// let err = db.collection("nope").info().await.unwrap_err();
    /// assert!(matches!(err, mayfly_client::Error::CollectionNotFound(_)));
    /// assert!(err.message().contains("'nope'"), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn message(&self) -> &str {
        match self {
            Error::Serialization(m) => m,
            Error::Connect { .. } => "cannot connect",
            _ => self.details().map_or("", ErrorDetails::message),
        }
    }

    /// What the server said: code, message, reason. `None` for [`Error::Connect`] and
    /// [`Error::Serialization`], which arise in this client.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let err = client.database("nope").delete().await.unwrap_err();
    /// assert_eq!(err.details().map(|d| d.code()), Some(mayfly_client::StatusCode::NotFound));
    /// # Ok(()) }
    /// ```
    pub fn details(&self) -> Option<&ErrorDetails> {
        match self {
            Error::NotFound(d)
            | Error::DatabaseNotFound(d)
            | Error::CollectionNotFound(d)
            | Error::Conflict(d)
            | Error::PreconditionFailed(d)
            | Error::InvalidArgument(d)
            | Error::Unavailable(d)
            | Error::ResourceExhausted(d)
            | Error::Timeout(d)
            | Error::Unauthenticated(d)
            | Error::PermissionDenied(d)
            | Error::Other(d) => Some(d),
            Error::Connect { .. } | Error::Serialization(_) => None,
        }
    }

    /// The server's reason for the error ([`ErrorDetails::reason`]); `None` for errors that
    /// arise in this client or statuses without one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use mayfly_client::Reason;
    /// let bad_ttl = c.create(&serde_json::json!({"id": "a", "k": 1, "ttl": 0})).await.unwrap_err();
    /// assert_eq!(bad_ttl.reason(), Some(&Reason::InvalidTtl));
    /// let wrong_key = c.create(&serde_json::json!({"id": "a", "k": 1})).partition_key(2).await.unwrap_err();
    /// assert_eq!(wrong_key.reason(), Some(&Reason::PartitionKeyMismatch));
    /// # Ok(()) }
    /// ```
    pub fn reason(&self) -> Option<&Reason> {
        self.details().and_then(ErrorDetails::reason)
    }

    /// The failing operation of a transactional batch ([`ErrorDetails::operation_index`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let err = client.database("nope").delete().await.unwrap_err();
    /// assert_eq!(err.operation_index(), None, "not a batch");
    /// # Ok(()) }
    /// ```
    pub fn operation_index(&self) -> Option<usize> {
        self.details().and_then(ErrorDetails::operation_index)
    }

    /// Whether sending the same request again later may succeed and cannot apply it twice,
    /// because nothing was applied: [`Error::Connect`] (never sent) unless retrying cannot
    /// help (an invalid address, a certificate refused), [`Error::Unavailable`]
    /// with a reason other than [`Reason::OutcomeUnknown`] (storage refusing writes),
    /// [`Error::ResourceExhausted`]
    /// (throttled, not [`Reason::MessageTooLarge`]) and a batch that failed as [`Reason::Contended`]. Not [`Error::Timeout`],
    /// nor `OUTCOME_UNKNOWN`, which is also what a connection broken during a request reports:
    /// the request may have been applied, which only the caller can judge (a read may be
    /// sent again; a create, an `incr` or an [`update`](crate::Collection::update) may not).
    ///
    /// The client's [`RetryPolicy`](crate::RetryPolicy) retries these errors by itself
    /// (for reads always, for writes on request).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let err = mayfly_client::Client::connect("127.0.0.1:1").await.unwrap_err();
    /// assert!(err.is_retryable());
    /// # Ok(()) }
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            // A refused, reset or timed-out connection may succeed later; a bad address or a
            // certificate the client refuses will not.
            Error::Connect { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::AddrNotAvailable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
            ),
            // Throttled, unless the request itself is too large to ever be taken.
            Error::ResourceExhausted(d) => d.reason != Some(Reason::MessageTooLarge),
            // The server says why (storage refusing writes): nothing was applied. Without a
            // reason the status came from elsewhere (a proxy, the HTTP/2 layer): unknown.
            Error::Unavailable(d) => d.reason.is_some() && d.reason != Some(Reason::OutcomeUnknown),
            Error::Other(d) => d.reason == Some(Reason::Contended),
            _ => false,
        }
    }

    /// Whether the request may have been applied although this error came back, so that
    /// sending a write again could apply it twice: the client's deadline passed
    /// ([`Error::Timeout`]), the connection broke during the request or an unavailable status
    /// came from something other than the server ([`Error::Unavailable`] with
    /// [`Reason::OutcomeUnknown`] or without a reason), or the call ended as cancelled,
    /// unknown or internal. Every other error is the server's (or this client's) word that
    /// nothing was applied. The counterpart of [`Error::is_retryable`]: no error is both.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let again = c.create(&serde_json::json!({"id": "a", "k": 1})).await.unwrap_err();
    /// assert!(!again.may_have_applied()); // the server says: it exists, nothing written
    /// # Ok(()) }
    /// ```
    pub fn may_have_applied(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Unavailable(d) => d.reason.is_none() || d.reason == Some(Reason::OutcomeUnknown),
            Error::Other(d) => matches!(
                d.code,
                StatusCode::Cancelled | StatusCode::Unknown | StatusCode::Internal
            ),
            _ => false,
        }
    }

    /// An error found by this client before sending, with the reason the server would give.
    pub(crate) fn invalid(message: impl Into<String>, reason: Option<Reason>) -> Self {
        Error::InvalidArgument(ErrorDetails::new(Code::InvalidArgument, message, reason))
    }

    /// The client's own deadline passed.
    pub(crate) fn timeout(after: Duration) -> Self {
        Error::Timeout(ErrorDetails::new(
            Code::DeadlineExceeded,
            format!("no answer within {after:?} (the client's request timeout)"),
            None,
        ))
    }

    /// A failure to reach `address`, with its cause chain folded into one `io::Error` that
    /// keeps the operating system's error kind.
    pub(crate) fn connect(address: &str, cause: &(dyn std::error::Error + 'static)) -> Self {
        let mut kind = io::ErrorKind::Other;
        let mut parts: Vec<String> = Vec::new();
        let mut next = Some(cause);
        while let Some(e) = next {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                kind = io.kind();
            }
            let text = e.to_string();
            // tonic and hyper wrap the cause in layers that name only themselves.
            if !matches!(text.as_str(), "transport error" | "client error (Connect)")
                && !parts.iter().any(|p| p == &text)
            {
                parts.push(text);
            }
            next = e.source();
        }
        Error::Connect {
            address: address.to_owned(),
            source: Arc::new(io::Error::new(kind, parts.join(": "))),
        }
    }

    /// The one conversion from a gRPC status; `address` names the server for connection
    /// failures.
    pub(crate) fn from_status(status: Status, address: &str) -> Self {
        // A status made on this side from a failed connection carries its cause.
        if let Some(cause) = std::error::Error::source(&status) {
            let mut next = Some(cause);
            while let Some(e) = next {
                if e.is::<tonic::ConnectError>() {
                    return Error::connect(address, e);
                }
                next = e.source();
            }
            let mut text = status.message().to_owned();
            let mut next = Some(cause);
            while let Some(e) = next {
                let part = e.to_string();
                if part != text && !text.ends_with(&part) {
                    text.push_str(": ");
                    text.push_str(&part);
                }
                next = e.source();
            }
            return match status.code() {
                Code::DeadlineExceeded => {
                    Error::Timeout(ErrorDetails::new(status.code(), text, None))
                }
                Code::ResourceExhausted => {
                    Error::ResourceExhausted(ErrorDetails::new(status.code(), text, None))
                }
                // The server was reached, or not to the end: the connection broke (or hyper
                // cancelled the request when it did). What the server did is unknown.
                _ => Error::Unavailable(ErrorDetails::new(
                    Code::Unavailable,
                    format!(
                        "the connection to {address} broke during the request, which may or may not have been applied: {text}"
                    ),
                    Some(Reason::OutcomeUnknown),
                )),
            };
        }
        // The server names the cause in a google.rpc.ErrorInfo (domain "mayfly.v1").
        let info = status
            .get_error_details()
            .error_info()
            // A proxy's ErrorInfo is not Mayfly's word on the cause.
            .filter(|info| info.domain == "mayfly.v1")
            .cloned();
        let reason = info.as_ref().map(|i| Reason::from_wire(&i.reason));
        let operation_index = info
            .as_ref()
            .and_then(|i| i.metadata.get("operation_index"))
            .and_then(|i| i.parse().ok());
        let details = ErrorDetails {
            code: StatusCode::from(status.code()),
            message: status.message().to_owned(),
            reason,
            operation_index,
            request_charge: charge_of(status.metadata()),
            retry_after: status
                .get_error_details()
                .retry_info()
                .and_then(|r| r.retry_delay),
        };
        match status.code() {
            Code::NotFound => match details.reason {
                Some(Reason::DatabaseNotFound) => Error::DatabaseNotFound(details),
                Some(Reason::CollectionNotFound) => Error::CollectionNotFound(details),
                _ => Error::NotFound(details),
            },
            Code::AlreadyExists => Error::Conflict(details),
            Code::FailedPrecondition => Error::PreconditionFailed(details),
            Code::InvalidArgument => Error::InvalidArgument(details),
            Code::Unavailable => Error::Unavailable(details),
            Code::ResourceExhausted => Error::ResourceExhausted(details),
            Code::DeadlineExceeded => Error::Timeout(details),
            Code::Unauthenticated => Error::Unauthenticated(details),
            Code::PermissionDenied => Error::PermissionDenied(details),
            _ => Error::Other(details),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Error::NotFound(_) => "document not found",
            Error::DatabaseNotFound(_) => "database not found",
            Error::CollectionNotFound(_) => "collection not found",
            Error::Conflict(_) => "already exists",
            Error::PreconditionFailed(_) => "precondition failed",
            Error::InvalidArgument(_) => "invalid argument",
            Error::Unavailable(_) => "unavailable",
            Error::ResourceExhausted(_) => "resource exhausted",
            Error::Timeout(_) => "timeout",
            Error::Connect { address, source } => {
                return write!(f, "cannot connect to {address}: {source}");
            }
            Error::Serialization(_) => "serialization",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission denied",
            Error::Other(_) => "error",
        };
        write!(f, "{kind}: {}", self.message())?;
        if let Some(reason) = self.reason() {
            write!(f, " ({reason})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connect { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Serialization(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_typed_with_grpc_numbers_and_names() {
        for n in 0..=16 {
            let code = StatusCode::from_i32(n).expect("gRPC defines 0 to 16");
            assert_eq!(code.as_i32(), n);
            assert_eq!(StatusCode::from(Code::from_i32(n)), code);
        }
        assert_eq!(StatusCode::from_i32(17), None);
        assert_eq!(StatusCode::from(Code::NotFound), StatusCode::NotFound);
        assert_eq!(StatusCode::Unauthenticated.as_str(), "UNAUTHENTICATED");
        assert_eq!(
            StatusCode::DeadlineExceeded.to_string(),
            "DEADLINE_EXCEEDED"
        );
        let e = Error::from_status(Status::already_exists("there"), "here");
        let details = e.details().expect("from the server");
        assert_eq!(details.code(), StatusCode::AlreadyExists);
        assert_eq!(details.code().as_i32(), 6);
    }

    #[test]
    fn an_error_may_have_applied_only_where_the_server_did_not_say_it_did_not() {
        let unknown = Error::from_status(
            Status::with_error_details(
                Code::Unavailable,
                "broke",
                tonic_types::ErrorDetails::with_error_info("OUTCOME_UNKNOWN", "mayfly.v1", []),
            ),
            "here",
        );
        let refusing = Error::from_status(
            Status::with_error_details(
                Code::Unavailable,
                "disk full",
                tonic_types::ErrorDetails::with_error_info("STORAGE_UNAVAILABLE", "mayfly.v1", []),
            ),
            "here",
        );
        let cases = [
            (Error::timeout(Duration::from_secs(1)), true),
            (unknown, true),
            (
                Error::from_status(Status::unavailable("proxy"), "here"),
                true,
            ),
            (Error::from_status(Status::internal("oops"), "here"), true),
            (Error::from_status(Status::cancelled("gone"), "here"), true),
            (refusing, false),
            (
                Error::from_status(Status::already_exists("there"), "here"),
                false,
            ),
            (Error::from_status(Status::not_found("none"), "here"), false),
            (
                Error::from_status(Status::failed_precondition("etag"), "here"),
                false,
            ),
            (
                Error::from_status(Status::resource_exhausted("slow"), "here"),
                false,
            ),
            (Error::invalid("bad", None), false),
        ];
        for (error, may) in cases {
            assert_eq!(error.may_have_applied(), may, "{error:?}");
            assert!(!(may && error.is_retryable()), "never both: {error:?}");
        }
    }

    #[test]
    fn reasons_round_trip_through_their_wire_names() {
        for reason in [
            Reason::DocumentNotFound,
            Reason::OutcomeUnknown,
            Reason::BatchTooLarge,
            Reason::Other("NEW".into()),
        ] {
            assert_eq!(Reason::from_wire(reason.as_str()), reason);
        }
    }

    #[test]
    fn batch_statuses_name_their_operation() {
        let details = tonic_types::ErrorDetails::with_error_info(
            "ETAG_MISMATCH",
            "mayfly.v1",
            [("operation_index".to_owned(), "56".to_owned())],
        );
        let status = Status::with_error_details(Code::FailedPrecondition, "stale", details);
        let e = Error::from_status(status, "here");
        assert!(matches!(e, Error::PreconditionFailed(_)));
        assert_eq!(e.operation_index(), Some(56));
        assert_eq!(e.reason(), Some(&Reason::EtagMismatch));
        assert_eq!(e.to_string(), "precondition failed: stale (ETAG_MISMATCH)");
    }

    #[test]
    fn outcome_unknown_is_not_retryable() {
        let details = tonic_types::ErrorDetails::with_error_info(
            "OUTCOME_UNKNOWN",
            "mayfly.v1",
            std::collections::HashMap::<String, String>::new(),
        );
        let status = Status::with_error_details(Code::Unavailable, "?", details);
        assert!(!Error::from_status(status, "here").is_retryable());
        assert!(
            !Error::from_status(Status::unavailable("draining"), "here").is_retryable(),
            "no reason: not the server's word that nothing was applied"
        );
        let storage = tonic_types::ErrorDetails::with_error_info(
            "STORAGE_UNAVAILABLE",
            "mayfly.v1",
            std::collections::HashMap::<String, String>::new(),
        );
        let status = Status::with_error_details(Code::Unavailable, "disk full", storage);
        assert!(Error::from_status(status, "here").is_retryable());
        assert!(!Error::timeout(Duration::from_secs(1)).is_retryable());
    }

    #[test]
    fn a_message_too_large_is_not_retried_while_throttling_is() {
        let exhausted = |reason: Option<&str>| {
            let status = match reason {
                Some(reason) => Status::with_error_details(
                    Code::ResourceExhausted,
                    "?",
                    tonic_types::ErrorDetails::with_error_info(
                        reason,
                        "mayfly.v1",
                        std::collections::HashMap::<String, String>::new(),
                    ),
                ),
                None => Status::resource_exhausted("budget in use"),
            };
            Error::from_status(status, "here")
        };
        let too_large = exhausted(Some("MESSAGE_TOO_LARGE"));
        assert_eq!(too_large.reason(), Some(&Reason::MessageTooLarge));
        assert!(!too_large.is_retryable());
        assert!(exhausted(None).is_retryable());
    }
}
