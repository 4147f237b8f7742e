//! `Documents.ExecuteBatch`: operations converted from the proto (a bad one fails the batch
//! naming its index, as the engine's failures do), run off the async workers (a batch may
//! read and write a hundred documents), answered once its write is durable.

use mayfly_proto::v1::{
    BatchCreate, BatchDelete, BatchOperation, BatchPatch, BatchRead, BatchReplace, BatchResult,
    BatchTouch, BatchUpsert, ExecuteBatchRequest, ExecuteBatchResponse, UpsertOutcome,
    oneofs::BatchOp as ProtoOp,
};
use std::mem;

use tonic::{Response, Status};

use super::{
    DocumentsService, convert, documents::settle_blocking, idempotency, patch, status::to_status,
};
use crate::auth::{Action, Principal, Target};
use crate::engine::{
    self, BatchOp, BatchOutput, Error, IdKind, InvalidInput, MAX_BATCH_OPERATIONS, ResourceId,
};

impl DocumentsService {
    /// Runs a batch for `caller`.
    pub(super) async fn run_batch(
        &self,
        caller: &Principal,
        mut request: ExecuteBatchRequest,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        let key = mem::take(&mut request.idempotency_key);
        let request_key = idempotency::request_key("ExecuteBatch", key, &request)?;
        let ExecuteBatchRequest {
            database,
            collection,
            partition_key,
            operations,
            idempotency_key: _,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let partition_key =
            convert::partition_key_value(partition_key).map_err(to_status)?.ok_or(InvalidInput::MissingField {
                field: "partition_key",
                hint: "a batch names the partition of all its documents: {\"value\": <value>} or {\"undefined\": {}}",
            }).map_err(to_status)?;
        let target = Target::documents(&database, &collection, Some(&partition_key));
        // Checked before the operations are converted (bodies, conditions); a batch that
        // turns out to write needs write access, checked once known.
        let engine = self.engine()?;
        caller.allow(Action::Read, target, &engine)?;
        if operations.is_empty() || operations.len() > MAX_BATCH_OPERATIONS {
            return Err(to_status(InvalidInput::BatchSize {
                count: operations.len(),
                max: MAX_BATCH_OPERATIONS,
            }));
        }
        let ops = operations
            .into_iter()
            .enumerate()
            .map(|(index, op)| operation(index, op))
            .collect::<Result<Vec<_>, Error>>()
            .map_err(to_status)?;
        let writes = ops.iter().any(BatchOp::writes);
        if writes {
            caller.allow(Action::Write, target, &engine)?;
        }
        // Reads are safe to repeat: a batch of reads only is not remembered (and a caller
        // allowed to read only cannot fill the server's table of keys).
        let request_key = request_key.filter(|_| writes);
        let keyed = request_key.is_some();
        let (answer, charge) =
            settle_blocking(engine.clone(), self.admit(&engine, &path)?, move |e| {
                e.keyed(request_key.as_ref())
                    .execute_batch(&path, partition_key, &ops)
            })
            .await?;
        let response = idempotency::response(keyed, answer, |outputs| ExecuteBatchResponse {
            results: outputs.into_iter().map(result).collect(),
            request_charge: charge.units(),
        });
        Ok(super::request_charge::charged(response, charge))
    }
}

fn result(output: BatchOutput) -> BatchResult {
    let (document, outcome, created) = match output {
        BatchOutput::Document(view) => (Some(view), UpsertOutcome::Unspecified, false),
        BatchOutput::Upserted(engine::UpsertOutcome::Created, view) => {
            (Some(view), UpsertOutcome::Created, false)
        }
        BatchOutput::Upserted(engine::UpsertOutcome::Replaced, view) => {
            (Some(view), UpsertOutcome::Replaced, false)
        }
        // A patch that created its document from its initial body.
        BatchOutput::Created(view) => (Some(view), UpsertOutcome::Unspecified, true),
        BatchOutput::Deleted => (None, UpsertOutcome::Unspecified, false),
    };
    BatchResult {
        document: document.map(convert::document),
        upsert_outcome: outcome as i32,
        created,
    }
}

fn if_match(etag: String) -> Option<String> {
    (!etag.is_empty()).then_some(etag)
}

/// One operation; a bad one fails the batch as [`Error::BatchOperation`].
fn operation(index: usize, op: BatchOperation) -> Result<BatchOp, Error> {
    let name = match &op.op {
        None => "unset",
        Some(ProtoOp::Create(_)) => "create",
        Some(ProtoOp::Upsert(_)) => "upsert",
        Some(ProtoOp::Replace(_)) => "replace",
        Some(ProtoOp::Read(_)) => "read",
        Some(ProtoOp::Delete(_)) => "delete",
        Some(ProtoOp::Patch(_)) => "patch",
        Some(ProtoOp::Touch(_)) => "touch",
    };
    let id = |raw: &str| ResourceId::parse(IdKind::Document, raw);
    let converted: Result<BatchOp, Error> = (|| {
        Ok(match op.op {
            None => {
                return Err(InvalidInput::MissingField {
                    field: "op",
                    hint: "set exactly one of create, upsert, replace, read, delete, patch or touch",
                }
                .into());
            }
            Some(ProtoOp::Create(BatchCreate { body, ttl })) => BatchOp::Create {
                body: convert::document_body(body, ttl)?,
            },
            Some(ProtoOp::Upsert(BatchUpsert {
                body,
                ttl,
                if_match: etag,
            })) => BatchOp::Upsert {
                body: convert::document_body(body, ttl)?,
                if_match: if_match(etag),
            },
            Some(ProtoOp::Replace(BatchReplace {
                id: raw,
                body,
                ttl,
                if_match: etag,
            })) => BatchOp::Replace {
                id: id(&raw)?,
                body: convert::document_body(body, ttl)?,
                if_match: if_match(etag),
            },
            Some(ProtoOp::Read(BatchRead { id: raw })) => BatchOp::Read { id: id(&raw)? },
            Some(ProtoOp::Delete(BatchDelete {
                id: raw,
                if_match: etag,
            })) => BatchOp::Delete {
                id: id(&raw)?,
                if_match: if_match(etag),
            },
            Some(ProtoOp::Patch(BatchPatch {
                id: raw,
                operations,
                if_match: etag,
                condition,
                create_if_missing,
                create_parents,
            })) => BatchOp::Patch {
                id: id(&raw)?,
                ops: patch::operations(operations)?,
                condition: patch::condition(&condition)?,
                if_match: if_match(etag),
                options: patch::options(create_if_missing, create_parents)?,
            },
            Some(ProtoOp::Touch(BatchTouch {
                id: raw,
                if_match: etag,
            })) => BatchOp::Touch {
                id: id(&raw)?,
                if_match: if_match(etag),
            },
        })
    })();
    converted.map_err(|e| Error::BatchOperation {
        index,
        op: name,
        source: Box::new(e),
    })
}
