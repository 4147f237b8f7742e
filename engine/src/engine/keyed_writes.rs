//! The document writes, each optionally remembered under an idempotency key (see
//! [`super::idempotency`]): [`Engine::keyed`] with a key makes a retry of the same request
//! safe; without one they are the engine's plain writes ([`Engine::create_document`] and the
//! rest call them so).

use super::{
    BatchOp, BatchOutput, CollectionInfo, CollectionPath, DocumentBody, DocumentView, Engine,
    IndexingMode, InvalidInput, Outcome, PartitionKeyValue, PatchOp, PatchOptions, UpsertOutcome,
    batch::MAX_BATCH_OPERATIONS,
    condition::PatchCondition,
    document::WriteMode,
    idempotency::{Answered, RequestKey},
    index,
    shard::Keyed,
};
use crate::storage::DocKey;

/// The engine's writes, remembered under `request`'s key if there is one. Each answers with
/// its value and whether it is the replayed answer of an earlier, identical request.
#[derive(Debug, Clone, Copy)]
pub struct KeyedWrites<'a> {
    engine: &'a Engine,
    request: Option<&'a RequestKey>,
}

impl Engine {
    /// The document writes, remembered under `request`'s idempotency key if given.
    pub fn keyed<'a>(&'a self, request: Option<&'a RequestKey>) -> KeyedWrites<'a> {
        KeyedWrites {
            engine: self,
            request,
        }
    }
}

impl KeyedWrites<'_> {
    fn keyed<'k>(
        &'k self,
        info: &CollectionInfo,
        partition_key: &'k PartitionKeyValue,
    ) -> Option<Keyed<'k>> {
        self.request.map(|request| Keyed {
            collection: info.uid,
            partition_key,
            request,
        })
    }

    /// Creates a document; `DocumentExists` if a live one has its id in its partition. The
    /// partition key comes from the body; `partition_key`, if given, must agree with it.
    pub fn create_document(
        &self,
        path: &CollectionPath,
        body: DocumentBody,
        partition_key: Option<PartitionKeyValue>,
    ) -> Outcome<Answered<DocumentView>> {
        let info = match self.engine.get_collection(path) {
            Ok(info) => info,
            Err(e) => return Outcome::failed(e),
        };
        match Engine::key_for(&info, &body, partition_key) {
            Ok(key) => self
                .put(&info, key, body, WriteMode::Create, None)
                .map(|a| a.map(|(view, _)| view)),
            Err(e) => Outcome::failed(e),
        }
    }

    /// Creates or replaces a document.
    pub fn upsert_document(
        &self,
        path: &CollectionPath,
        body: DocumentBody,
        partition_key: Option<PartitionKeyValue>,
        if_match: Option<&str>,
    ) -> Outcome<Answered<(UpsertOutcome, DocumentView)>> {
        let info = match self.engine.get_collection(path) {
            Ok(info) => info,
            Err(e) => return Outcome::failed(e),
        };
        let key = match Engine::key_for(&info, &body, partition_key) {
            Ok(key) => key,
            Err(e) => return Outcome::failed(e),
        };
        self.put(&info, key, body, WriteMode::Upsert, if_match)
            .map(|a| {
                a.map(|(view, created)| {
                    let outcome = if created {
                        UpsertOutcome::Created
                    } else {
                        UpsertOutcome::Replaced
                    };
                    (outcome, view)
                })
            })
    }

    /// Replaces a live document; its id and partition key must match the body's.
    pub fn replace_document(
        &self,
        path: &CollectionPath,
        key: DocKey,
        body: DocumentBody,
        if_match: Option<&str>,
    ) -> Outcome<Answered<DocumentView>> {
        let info = match self.engine.get_collection(path) {
            Ok(info) => info,
            Err(e) => return Outcome::failed(e),
        };
        if body.id() != &key.id {
            return Outcome::failed(InvalidInput::IdMismatch {
                request: key.id.to_string(),
                body: body.id().to_string(),
            });
        }
        match Engine::key_for(&info, &body, Some(key.partition_key)) {
            Ok(body_key) => self
                .put(&info, body_key, body, WriteMode::Replace, if_match)
                .map(|a| a.map(|(view, _)| view)),
            Err(e) => Outcome::failed(e),
        }
    }

    fn put(
        &self,
        info: &CollectionInfo,
        key: DocKey,
        body: DocumentBody,
        mode: WriteMode,
        if_match: Option<&str>,
    ) -> Outcome<Answered<(DocumentView, bool)>> {
        // Terms are computed here, outside the shard lock; the shard recomputes them only if
        // the policy changed in between.
        // The bound on terms is checked for `lazy` writes too, whose entries the background
        // indexer writes later; their terms are not kept.
        let policy = info.indexed_paths_arc();
        let terms = match &policy {
            Some(p) => match index::terms::bounded_document_terms(body.map(), p) {
                Ok(terms) => terms,
                Err(e) => return Outcome::failed(e),
            },
            None => Vec::new(),
        };
        let terms = (info.settings.indexing_mode() != IndexingMode::Lazy).then_some(terms);
        let map = body.map().clone();
        let (stored, ttl) = body.into_stored();
        let partition_key = key.partition_key.clone();
        let shard = self.engine.shard_for(info, &partition_key);
        shard.put(
            info,
            key,
            (stored, &map, ttl),
            (policy, terms),
            mode,
            if_match,
            (self.engine.next_version(), self.keyed(info, &partition_key)),
            &*self.engine.inner.clock,
        )
    }

    /// [`Engine::patch_document_with`], remembered.
    pub fn patch_document_with(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        (ops, condition): (&[PatchOp], Option<&PatchCondition>),
        if_match: Option<&str>,
        options: &PatchOptions,
    ) -> Outcome<Answered<(DocumentView, bool)>> {
        let info = match self.engine.get_collection(path) {
            Ok(info) => info,
            Err(e) => return Outcome::failed(e),
        };
        if let Some(initial) = &options.create_if_missing
            && let Err(e) = Engine::check_initial_body(&info, key, initial, if_match)
        {
            return Outcome::failed(e);
        }
        self.engine.shard_for(&info, &key.partition_key).patch(
            &info,
            key,
            (ops, condition, options),
            if_match,
            &*self.engine.inner.clock,
            self.keyed(&info, &key.partition_key),
        )
    }

    /// Deletes a live document.
    pub fn delete_document(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        if_match: Option<&str>,
    ) -> Outcome<Answered<()>> {
        match self.engine.get_collection(path) {
            Ok(info) => self.engine.shard_for(&info, &key.partition_key).delete(
                &info,
                key,
                if_match,
                &*self.engine.inner.clock,
                self.keyed(&info, &key.partition_key),
            ),
            Err(e) => Outcome::failed(e),
        }
    }

    /// Restarts a live document's TTL clock: a write with its current body (new `_ts`, new etag).
    pub fn touch_document(
        &self,
        path: &CollectionPath,
        key: &DocKey,
        if_match: Option<&str>,
    ) -> Outcome<Answered<DocumentView>> {
        match self.engine.get_collection(path) {
            Ok(info) => self.engine.shard_for(&info, &key.partition_key).touch(
                &info,
                key,
                if_match,
                (
                    self.engine.next_version(),
                    self.keyed(&info, &key.partition_key),
                ),
                &*self.engine.inner.clock,
            ),
            Err(e) => Outcome::failed(e),
        }
    }

    /// [`Engine::execute_batch`], remembered.
    pub fn execute_batch(
        &self,
        path: &CollectionPath,
        partition_key: PartitionKeyValue,
        ops: &[BatchOp],
    ) -> Outcome<Answered<Vec<BatchOutput>>> {
        if ops.is_empty() || ops.len() > MAX_BATCH_OPERATIONS {
            return Outcome::failed(InvalidInput::BatchSize {
                count: ops.len(),
                max: MAX_BATCH_OPERATIONS,
            });
        }
        let info = match self.engine.get_collection(path) {
            Ok(info) => info,
            Err(e) => return Outcome::failed(e),
        };
        if let Err(e) = Engine::check_batch(&info, &partition_key, ops) {
            return Outcome::failed(e);
        }
        self.engine.shard_for(&info, &partition_key).batch(
            &info,
            &partition_key,
            ops,
            &*self.engine.inner.clock,
            self.keyed(&info, &partition_key),
        )
    }
}
