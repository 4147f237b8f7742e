//! The one mapping from engine errors to gRPC statuses. Each status carries a
//! `google.rpc.ErrorInfo` whose `reason` lets clients tell, say, a missing document from a
//! missing collection without parsing messages.

use std::collections::HashMap;

use mayfly_query::ErrorKind;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{
    auth::{Denied, KeyAdminError},
    engine::{Error, InvalidInput},
    storage::StorageErrorKind,
};

/// `ErrorInfo.domain` of every Mayfly error.
pub(crate) use mayfly_proto::ERROR_DOMAIN;

fn code_and_reason(error: &Error) -> (Code, &'static str) {
    match error {
        Error::Invalid(invalid) => (Code::InvalidArgument, invalid_reason(invalid)),
        Error::DatabaseNotFound { .. } => (Code::NotFound, "DATABASE_NOT_FOUND"),
        Error::CollectionNotFound { .. } => (Code::NotFound, "COLLECTION_NOT_FOUND"),
        Error::DocumentNotFound { .. } => (Code::NotFound, "DOCUMENT_NOT_FOUND"),
        Error::DatabaseExists { .. } => (Code::AlreadyExists, "DATABASE_EXISTS"),
        Error::CollectionExists { .. } => (Code::AlreadyExists, "COLLECTION_EXISTS"),
        Error::DocumentExists { .. } => (Code::AlreadyExists, "DOCUMENT_EXISTS"),
        Error::PreconditionFailed { .. } => (Code::FailedPrecondition, "ETAG_MISMATCH"),
        Error::ConditionNotMet { .. } => (Code::FailedPrecondition, "CONDITION_NOT_MET"),
        Error::Contended { .. } => (Code::Aborted, "CONTENDED"),
        Error::BatchOperation { source, .. } => code_and_reason(source),
        Error::Storage(e) => match e.kind() {
            StorageErrorKind::Unavailable => (Code::Unavailable, "STORAGE_UNAVAILABLE"),
            StorageErrorKind::Failed => (Code::Internal, "STORAGE_FAILURE"),
            StorageErrorKind::OutcomeUnknown => (Code::Unavailable, "OUTCOME_UNKNOWN"),
        },
        Error::NotDurable(_) => (Code::Unavailable, "OUTCOME_UNKNOWN"),
        // The edge reruns such a query off the async workers; reaching here is a bug.
        Error::ReadBudgetSpent => (Code::Internal, "INTERNAL"),
        Error::Cancelled => (Code::Cancelled, "CANCELLED"),
        Error::ShuttingDown => (Code::Unavailable, "SHUTTING_DOWN"),
        Error::NotOwner { .. } => (Code::Unavailable, "NOT_OWNER"),
        Error::LogDiverged { .. } => (Code::FailedPrecondition, "LOG_DIVERGED"),
        Error::LogRepairing { .. } => (Code::Unavailable, "LOG_REPAIRING"),
        Error::NoMemory => (Code::ResourceExhausted, "RESPONSE_BUDGET_EXHAUSTED"),
        Error::ContinuationStale { .. } => (Code::FailedPrecondition, "CONTINUATION_STALE"),
        Error::KeyReused { .. } => (Code::InvalidArgument, "IDEMPOTENCY_KEY_REUSED"),
        Error::RequestApplied { .. } => (Code::AlreadyExists, "REQUEST_ALREADY_APPLIED"),
        Error::KeysFull { .. } => (Code::ResourceExhausted, "IDEMPOTENCY_KEYS_FULL"),
        Error::RequestRateTooLarge { .. } => (Code::ResourceExhausted, "REQUEST_RATE_TOO_LARGE"),
        Error::NoChangeFeed { .. } => (Code::FailedPrecondition, "CHANGE_FEED_OFF"),
        Error::ChangesTrimmed { .. } | Error::FeedRestarted { .. } => {
            (Code::OutOfRange, "CHANGE_FEED_TRIMMED")
        }
        Error::Query(e) => (
            Code::InvalidArgument,
            match e.kind {
                ErrorKind::Syntax => "QUERY_SYNTAX",
                ErrorKind::Invalid => "QUERY_INVALID",
                ErrorKind::Unsupported => "QUERY_UNSUPPORTED",
                ErrorKind::Limit => "QUERY_LIMIT",
                ErrorKind::Evaluation => "QUERY_EVALUATION",
                // The engine turns it into ReadBudgetSpent; never sent.
                ErrorKind::Interrupted => "INTERNAL",
            },
        ),
    }
}

fn invalid_reason(invalid: &InvalidInput) -> &'static str {
    match invalid {
        InvalidInput::DefaultTtl { .. } => "INVALID_DEFAULT_TTL",
        InvalidInput::DocumentTtl { .. } => "INVALID_TTL",
        InvalidInput::TtlWithoutIndex => "TTL_WITHOUT_INDEX",
        InvalidInput::Id { .. } => "INVALID_ID",
        InvalidInput::PartitionKeyPath { .. } => "INVALID_PARTITION_KEY_PATH",
        InvalidInput::PartitionKeyValueType { .. } => "INVALID_PARTITION_KEY",
        InvalidInput::PartitionKeyTooLong { .. } => "PARTITION_KEY_TOO_LONG",
        InvalidInput::PartitionKeyMismatch { .. } => "PARTITION_KEY_MISMATCH",
        InvalidInput::IdMismatch { .. } => "ID_MISMATCH",
        InvalidInput::MissingId { .. } => "MISSING_ID",
        InvalidInput::ConflictingTtl { .. } => "CONFLICTING_TTL",
        InvalidInput::DocumentTooLarge { .. } => "DOCUMENT_TOO_LARGE",
        // One reason for every JSON value nested too deep, a body or not.
        InvalidInput::DocumentTooDeep { .. } | InvalidInput::ValueTooDeep { .. } => {
            "DOCUMENT_TOO_DEEP"
        }
        InvalidInput::BadJson { .. } => "INVALID_JSON",
        InvalidInput::Patch { .. } | InvalidInput::PatchSize { .. } => "INVALID_PATCH",
        InvalidInput::MissingField { .. } => "MISSING_FIELD",
        InvalidInput::UnknownEnumValue { .. } => "UNKNOWN_ENUM_VALUE",
        InvalidInput::PageSize { .. } => "INVALID_PAGE_SIZE",
        InvalidInput::Continuation { .. } => "INVALID_CONTINUATION",
        InvalidInput::IndexPath { .. } | InvalidInput::IndexPolicy { .. } => {
            "INVALID_INDEXING_POLICY"
        }
        InvalidInput::ScanNotEnabled { .. } => "SCAN_NOT_ENABLED",
        InvalidInput::IndexTermsTooLarge { .. } => "INDEX_TERMS_TOO_LARGE",
        InvalidInput::TokenTtl { .. } => "INVALID_TOKEN_TTL",
        InvalidInput::BatchSize { .. } => "INVALID_BATCH",
        InvalidInput::BatchTooLarge { .. } => "BATCH_TOO_LARGE",
        InvalidInput::PatchCondition { .. } => "INVALID_PATCH_CONDITION",
        // The body's own reason (ID_MISMATCH, INVALID_TTL, ...), its message naming the body.
        InvalidInput::CreateIfMissing(inner) => invalid_reason(inner),
        InvalidInput::IfMatchWithCreate => "INVALID_PATCH",
        InvalidInput::MustLiveRule { .. } | InvalidInput::MustLiveRules { .. } => {
            "INVALID_MUST_LIVE_RULE"
        }
        InvalidInput::MustLive { .. } => "MUST_LIVE",
        InvalidInput::FeedRetention { .. } => "INVALID_CHANGE_FEED_RETENTION",
        InvalidInput::Throughput { .. }
        | InvalidInput::SharedThroughput { .. }
        | InvalidInput::NoSharedThroughput { .. } => "INVALID_THROUGHPUT",
        InvalidInput::FeedRangeCount { .. }
        | InvalidInput::FeedRange { .. }
        | InvalidInput::FeedScopeConflict => "INVALID_FEED_RANGE",
        InvalidInput::MaxEvents { .. } => "INVALID_PAGE_SIZE",
        InvalidInput::StartTime { .. } => "INVALID_START_TIME",
    }
}

/// `ErrorInfo.metadata` key naming the failing operation of a batch (decimal, from 0).
pub(crate) const BATCH_OPERATION_INDEX: &str = "operation_index";

/// The header a throttled request's retry delay travels in (milliseconds), beside the
/// `google.rpc.RetryInfo` detail.
pub(crate) const RETRY_AFTER_MS: &str = "retry-after-ms";

/// Longest status message, in bytes. The message travels twice (percent-encoded in
/// `grpc-message`, inside the base64 details), and gRPC-core clients refuse trailers past
/// 8 KiB: echoed input is already cut to [`crate::model::ECHO_CHARS`] characters, this bounds
/// the rest (a query error quoting a long token, several echoes in one message).
pub(crate) const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// `message`, cut at a character boundary to fit [`MAX_STATUS_MESSAGE_BYTES`].
fn bounded(mut message: String) -> String {
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message;
    }
    let marker = |n: usize| format!("…({n} more bytes)");
    let mut cut = MAX_STATUS_MESSAGE_BYTES - marker(message.len()).len();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let rest = message.len() - cut;
    message.truncate(cut);
    message.push_str(&marker(rest));
    message
}

/// The status of an engine error or of bad input: `.map_err(to_status)?` where `?` alone
/// would do, since `Status` and the engine's errors are other crates' types (no `From`).
pub(crate) fn to_status(error: impl Into<Error>) -> Status {
    let error = error.into();
    let (code, reason) = code_and_reason(&error);
    let mut metadata = HashMap::<String, String>::new();
    if let Error::BatchOperation { index, .. } = &error {
        // Clients find the failing operation without parsing the message.
        metadata.insert(BATCH_OPERATION_INDEX.to_owned(), index.to_string());
    }
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
    let retry_after_ms = match &error {
        Error::KeysFull { retry_after_ms, .. }
        | Error::RequestRateTooLarge { retry_after_ms, .. } => Some(*retry_after_ms),
        _ => None,
    };
    if let Some(ms) = retry_after_ms {
        details.set_retry_info(Some(std::time::Duration::from_millis(ms)));
    }
    let mut status = Status::with_error_details(code, bounded(error.to_string()), details);
    if let Some(ms) = retry_after_ms {
        // As Cosmos DB's x-ms-retry-after-ms, for clients that read headers, not details.
        status
            .metadata_mut()
            .insert(RETRY_AFTER_MS, ms.to_string().parse().expect("digits"));
    }
    if let Error::NotOwner { partition } = &error {
        // Where a forwarding node (or a client) finds which partition moved.
        status.metadata_mut().insert(
            super::forward::PARTITION,
            partition.to_string().parse().expect("digits"),
        );
    }
    status
}

impl From<Denied> for Status {
    fn from(denied: Denied) -> Self {
        let code = if denied.unauthenticated() {
            Code::Unauthenticated
        } else if denied.unavailable() {
            Code::Unavailable
        } else {
            Code::PermissionDenied
        };
        let details = ErrorDetails::with_error_info(
            denied.reason(),
            ERROR_DOMAIN,
            HashMap::<String, String>::new(),
        );
        Status::with_error_details(code, bounded(denied.to_string()), details)
    }
}

impl From<KeyAdminError> for Status {
    fn from(error: KeyAdminError) -> Self {
        let (code, reason) = match &error {
            KeyAdminError::NoKeys => (Code::FailedPrecondition, "NO_KEYS"),
            KeyAdminError::Given => (Code::FailedPrecondition, "KEYS_GIVEN"),
            KeyAdminError::Io(_) => (Code::Unavailable, "KEY_NOT_WRITTEN"),
        };
        let details =
            ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::<String, String>::new());
        Status::with_error_details(code, bounded(error.to_string()), details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{engine::PartitionKeyValue, storage::StorageError};

    #[test]
    fn messages_echoing_long_input_stay_small() {
        let long = "ü".repeat(10_000);
        let status = to_status(Error::DocumentNotFound {
            id: long.clone(),
            partition_key: PartitionKeyValue::string(&long[..2000]).expect("fits"),
        });
        assert!(status.message().len() < 800, "{}", status.message().len());
        assert!(
            status.message().contains("…(9872 more)"),
            "{}",
            status.message()
        );
        let query = to_status(Error::Query(mayfly_query::QueryError {
            kind: ErrorKind::Invalid,
            position: None,
            message: format!("unknown name {long}"),
        }));
        assert!(query.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        assert!(
            query.message().ends_with(" more bytes)"),
            "{}",
            query.message()
        );
        assert_eq!(bounded("fits".to_owned()), "fits");
    }

    #[test]
    fn every_error_kind_has_its_code_and_reason() {
        let cases = [
            (
                Error::Invalid(InvalidInput::TtlWithoutIndex),
                Code::InvalidArgument,
                "TTL_WITHOUT_INDEX",
            ),
            (
                Error::DatabaseNotFound {
                    database: "d".into(),
                },
                Code::NotFound,
                "DATABASE_NOT_FOUND",
            ),
            (
                Error::CollectionNotFound {
                    database: "d".into(),
                    collection: "c".into(),
                },
                Code::NotFound,
                "COLLECTION_NOT_FOUND",
            ),
            (
                Error::DocumentNotFound {
                    id: "x".into(),
                    partition_key: PartitionKeyValue::Null,
                },
                Code::NotFound,
                "DOCUMENT_NOT_FOUND",
            ),
            (
                Error::DatabaseExists {
                    database: "d".into(),
                },
                Code::AlreadyExists,
                "DATABASE_EXISTS",
            ),
            (
                Error::CollectionExists {
                    database: "d".into(),
                    collection: "c".into(),
                },
                Code::AlreadyExists,
                "COLLECTION_EXISTS",
            ),
            (
                Error::DocumentExists {
                    id: "x".into(),
                    partition_key: PartitionKeyValue::Null,
                },
                Code::AlreadyExists,
                "DOCUMENT_EXISTS",
            ),
            (
                Error::PreconditionFailed {
                    id: "x".into(),
                    if_match: "e".into(),
                },
                Code::FailedPrecondition,
                "ETAG_MISMATCH",
            ),
            (
                Error::Storage(StorageError::new("disk")),
                Code::Internal,
                "STORAGE_FAILURE",
            ),
            (
                Error::Storage(StorageError::unavailable("fsync failed")),
                Code::Unavailable,
                "STORAGE_UNAVAILABLE",
            ),
            (
                Error::NotDurable(StorageError::unavailable("fsync failed")),
                Code::Unavailable,
                "OUTCOME_UNKNOWN",
            ),
            (
                Error::KeyReused {
                    key: "k".into(),
                    applied_at: 0,
                },
                Code::InvalidArgument,
                "IDEMPOTENCY_KEY_REUSED",
            ),
            (
                Error::RequestApplied {
                    key: "k".into(),
                    applied_at: 0,
                },
                Code::AlreadyExists,
                "REQUEST_ALREADY_APPLIED",
            ),
            (
                Error::KeysFull {
                    max: 1,
                    retry_after_ms: 5,
                },
                Code::ResourceExhausted,
                "IDEMPOTENCY_KEYS_FULL",
            ),
            (
                Error::RequestRateTooLarge {
                    budget: "collection db/c".into(),
                    limit: 400,
                    retry_after_ms: 7,
                },
                Code::ResourceExhausted,
                "REQUEST_RATE_TOO_LARGE",
            ),
        ];
        for (error, code, reason) in cases {
            let message = error.to_string();
            let status = to_status(error);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
            let details = status.get_error_details();
            let info = details.error_info().expect("error info attached");
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (reason, ERROR_DOMAIN)
            );
        }
    }
}
