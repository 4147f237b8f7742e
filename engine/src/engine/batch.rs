//! Transactional batch (Cosmos DB's `TransactionalBatch`): operations on documents of one
//! partition key value, each seeing what the ones before it did, committed as one write or
//! not at all. One partition means one shard: the batch is one check-and-write on it.

use std::sync::Arc;

use crate::storage::DocKey;

use super::{
    CollectionInfo, CollectionPath, DocumentBody, DocumentId, DocumentView, Engine, Error,
    InvalidInput, Outcome, PartitionKeyValue, PatchOp, PatchOptions, UpsertOutcome,
    condition::PatchCondition,
};

/// Most operations one batch may carry (Cosmos DB's limit).
pub const MAX_BATCH_OPERATIONS: usize = 100;

/// Most bytes of stored documents a batch may read, and (separately) return: what one batch
/// holds in memory, and what keeps its response within a gRPC message.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// One operation of a batch. Documents are addressed by id; the partition is the batch's.
#[derive(Debug)]
pub enum BatchOp {
    /// Creates a document (it must not exist).
    Create { body: DocumentBody },
    /// Creates or replaces a document.
    Upsert {
        body: DocumentBody,
        if_match: Option<String>,
    },
    /// Replaces a live document.
    Replace {
        id: DocumentId,
        body: DocumentBody,
        if_match: Option<String>,
    },
    /// Reads a live document.
    Read { id: DocumentId },
    /// Deletes a live document.
    Delete {
        id: DocumentId,
        if_match: Option<String>,
    },
    /// Patches a live document; with `options.create_if_missing`, creates it from that body
    /// first if it is not live at this point of the batch (see [`PatchOptions`]).
    Patch {
        id: DocumentId,
        ops: Vec<PatchOp>,
        condition: Option<Arc<PatchCondition>>,
        if_match: Option<String>,
        options: PatchOptions,
    },
    /// Restarts a live document's TTL clock.
    Touch {
        id: DocumentId,
        if_match: Option<String>,
    },
}

impl BatchOp {
    /// The operation's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            BatchOp::Create { .. } => "create",
            BatchOp::Upsert { .. } => "upsert",
            BatchOp::Replace { .. } => "replace",
            BatchOp::Read { .. } => "read",
            BatchOp::Delete { .. } => "delete",
            BatchOp::Patch { .. } => "patch",
            BatchOp::Touch { .. } => "touch",
        }
    }

    /// The id of the document it acts on.
    pub fn id(&self) -> &DocumentId {
        match self {
            BatchOp::Create { body } | BatchOp::Upsert { body, .. } => body.id(),
            BatchOp::Replace { id, .. }
            | BatchOp::Read { id }
            | BatchOp::Delete { id, .. }
            | BatchOp::Patch { id, .. }
            | BatchOp::Touch { id, .. } => id,
        }
    }

    /// Whether it changes anything (a batch of reads only needs read permission).
    pub fn writes(&self) -> bool {
        !matches!(self, BatchOp::Read { .. })
    }

    /// `error`, as this operation's (at `index`) failure of the whole batch.
    pub(super) fn failed(&self, index: usize, error: impl Into<Error>) -> Error {
        Error::BatchOperation {
            index,
            op: self.name(),
            source: Box::new(error.into()),
        }
    }
}

/// What one operation of a committed batch did.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOutput {
    /// The document as the operation left it (create, replace, patch, touch) or read it.
    Document(DocumentView),
    /// An upsert: whether it created or replaced, and the document.
    Upserted(UpsertOutcome, DocumentView),
    /// A patch that created its document from its `create_if_missing` body: the document as
    /// its operations left it. (A patch of a live document is a [`BatchOutput::Document`].)
    Created(DocumentView),
    /// A delete.
    Deleted,
}

impl Engine {
    /// Runs `ops` on documents of partition `partition_key`, in order, each seeing what the
    /// ones before it did; commits all of their changes as one write, or, if any fails, none
    /// (the error is [`Error::BatchOperation`], naming it).
    pub fn execute_batch(
        &self,
        path: &CollectionPath,
        partition_key: PartitionKeyValue,
        ops: &[BatchOp],
    ) -> Outcome<Vec<BatchOutput>> {
        self.keyed(None)
            .execute_batch(path, partition_key, ops)
            .map(|a| a.value)
    }

    /// Bodies name their partition themselves: each must be the batch's.
    pub(super) fn check_batch(
        info: &CollectionInfo,
        partition_key: &PartitionKeyValue,
        ops: &[BatchOp],
    ) -> Result<(), Error> {
        for (index, op) in ops.iter().enumerate() {
            let checked = match op {
                BatchOp::Create { body } | BatchOp::Upsert { body, .. } => {
                    Self::key_for(info, body, Some(partition_key.clone())).map(drop)
                }
                BatchOp::Replace { id, body, .. } if body.id() != id => {
                    Err(InvalidInput::IdMismatch {
                        request: id.to_string(),
                        body: body.id().to_string(),
                    })
                }
                BatchOp::Replace { body, .. } => {
                    Self::key_for(info, body, Some(partition_key.clone())).map(drop)
                }
                BatchOp::Patch {
                    id,
                    if_match,
                    options:
                        PatchOptions {
                            create_if_missing: Some(initial),
                            ..
                        },
                    ..
                } => {
                    let key = DocKey {
                        partition_key: partition_key.clone(),
                        id: id.clone(),
                    };
                    Self::check_initial_body(info, &key, initial, if_match.as_deref())
                }
                _ => Ok(()),
            };
            if let Err(e) = checked {
                return Err(op.failed(index, e));
            }
        }
        Ok(())
    }
}
