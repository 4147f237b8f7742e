//! Errors, converted from gRPC statuses in one place.

use std::fmt;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// What can go wrong talking to Mayfly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The document does not exist: never written, deleted, or expired.
    NotFound(String),
    /// The database does not exist.
    DatabaseNotFound(String),
    /// The collection does not exist.
    CollectionNotFound(String),
    /// The database, collection or document already exists.
    Conflict(String),
    /// An `if_match` etag no longer matches.
    PreconditionFailed(String),
    /// The request was rejected as malformed; the message says what to fix.
    InvalidArgument(String),
    /// The server could not be reached or is shutting down; the request may be retried.
    Unavailable(String),
    /// A document body could not be converted to or from JSON.
    Serialization(String),
    /// The server needs a key or resource token, and none was given, or the one given is
    /// not valid (unknown, altered, regenerated since, or an expired token).
    Unauthenticated(String),
    /// The key or token is valid but does not allow this request: a read-only key asked to
    /// write, or a token used outside its database, collection or partition.
    PermissionDenied(String),
    /// Any other gRPC failure.
    Other {
        /// The gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },
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
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let err = orders.replace("nope", "CO1", &serde_json::json!({"id": "nope", "customerId": "CO1"})).await.unwrap_err();
    /// assert!(matches!(err, mayfly_client::Error::NotFound(_)));
    /// assert!(err.message().starts_with("document 'nope' does not exist"));
    /// # Ok(()) }
    /// ```
    pub fn message(&self) -> &str {
        match self {
            Error::NotFound(m)
            | Error::DatabaseNotFound(m)
            | Error::CollectionNotFound(m)
            | Error::Conflict(m)
            | Error::PreconditionFailed(m)
            | Error::InvalidArgument(m)
            | Error::Unavailable(m)
            | Error::Serialization(m)
            | Error::Unauthenticated(m)
            | Error::PermissionDenied(m)
            | Error::Other { message: m, .. } => m,
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
            Error::Serialization(_) => "serialization",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission denied",
            Error::Other { .. } => "error",
        };
        write!(f, "{kind}: {}", self.message())
    }
}

impl std::error::Error for Error {}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        // The server names the cause in a google.rpc.ErrorInfo (domain "mayfly.v1").
        let details = status.get_error_details();
        let reason = details.error_info().map(|info| info.reason.as_str());
        let message = status.message().to_owned();
        // A status made on this side from a failed connection (TLS refused, connection reset)
        // carries its cause: the server was not reached, or not to the end.
        if status.code() == Code::Unknown
            && let Some(cause) = std::error::Error::source(&status)
        {
            let mut text = format!("{message}: {cause}");
            let mut next = cause.source();
            while let Some(e) = next {
                text.push_str(&format!(": {e}"));
                next = e.source();
            }
            return Error::Unavailable(text);
        }
        match status.code() {
            Code::NotFound => match reason {
                Some("DATABASE_NOT_FOUND") => Error::DatabaseNotFound(message),
                Some("COLLECTION_NOT_FOUND") => Error::CollectionNotFound(message),
                _ => Error::NotFound(message),
            },
            Code::AlreadyExists => Error::Conflict(message),
            Code::FailedPrecondition => Error::PreconditionFailed(message),
            Code::InvalidArgument => Error::InvalidArgument(message),
            Code::Unavailable => Error::Unavailable(message),
            Code::Unauthenticated => Error::Unauthenticated(message),
            Code::PermissionDenied => Error::PermissionDenied(message),
            code => Error::Other { code, message },
        }
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::Unavailable(format!("cannot connect: {e}"))
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Serialization(e.to_string())
    }
}
