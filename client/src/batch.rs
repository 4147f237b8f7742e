//! Transactional batches: operations on documents of one partition, applied by the server all
//! together or not at all.

use std::future::IntoFuture;

use mayfly_proto::v1::{
    BatchCreate, BatchDelete, BatchOperation, BatchPatch, BatchRead, BatchReplace, BatchTouch,
    BatchUpsert, ExecuteBatchRequest, oneofs::BatchOp,
};
use serde::Serialize;

use crate::{
    client::{BoxFuture, Call},
    collection::{Collection, to_object},
    document::{Document, PartitionKey, UpsertOutcome},
    error::{Error, Reason},
    patch::PatchOps,
    requests::body_and_ttl,
    ttl::DocumentTtl,
};

/// Most operations one batch may carry.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let c = db.create_collection("c", "/k").await?;
/// use mayfly_client::{MAX_BATCH_OPERATIONS, Reason};
/// let too_many = (0..=MAX_BATCH_OPERATIONS).fold(c.batch(1), |b, i| b.read(&format!("d{i}")));
/// assert_eq!(too_many.await.unwrap_err().reason(), Some(&Reason::InvalidBatch));
/// # Ok(()) }
/// ```
pub const MAX_BATCH_OPERATIONS: usize = 100;

/// What one operation of a committed batch did, in the batch's order.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let c = db.create_collection("c", "/k").await?;
/// use mayfly_client::{BatchResult, UpsertOutcome};
/// let results = c.batch(1)
///     .create(&serde_json::json!({"id": "a", "k": 1}))
///     .upsert(&serde_json::json!({"id": "a", "k": 1, "n": 2}))
///     .delete("a")
///     .await?;
/// assert!(matches!(results[0], BatchResult::Document(_)));
/// assert!(matches!(results[1], BatchResult::Upserted(UpsertOutcome::Replaced(_))));
/// assert_eq!(results[2], BatchResult::Deleted);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum BatchResult {
    /// The document as a create, replace, patch or touch left it, or as a read found it.
    Document(Document),
    /// What an upsert did.
    Upserted(UpsertOutcome),
    /// A delete.
    Deleted,
    /// A patch sent with [`Batch::create_if_missing`] that found no live document and created
    /// it, with its operations applied.
    Created(Document),
}

impl BatchResult {
    /// The document the operation left or read; `None` for a delete.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let results = c.batch(1)
    ///     .create(&serde_json::json!({"id": "a", "k": 1}))
    ///     .delete("a")
    ///     .await?;
    /// assert_eq!(results[0].document().map(|d| d.id()), Some("a"));
    /// assert!(results[1].document().is_none());
    /// # Ok(()) }
    /// ```
    pub fn document(&self) -> Option<&Document> {
        match self {
            BatchResult::Document(d) | BatchResult::Created(d) => Some(d),
            BatchResult::Upserted(outcome) => Some(outcome.document()),
            BatchResult::Deleted => None,
        }
    }
}

/// A transactional batch being built; see [`Collection::batch`]. `.await` sends it.
///
/// Operations apply in order, each seeing what the ones before it did, and are committed as
/// one write. If one fails, nothing is changed and the error is that operation's, with
/// [`Error::operation_index`] naming it (from 0); a document that is not there fails the batch
/// (unlike a single read or replace, where it is an outcome). [`ttl`](Batch::ttl),
/// [`if_match`](Batch::if_match), [`condition`](Batch::condition),
/// [`create_if_missing`](Batch::create_if_missing) and
/// [`create_parents`](Batch::create_parents) modify the operation added just before them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("shop").await?;
/// # let orders = db.create_collection("orders", "/customer").await?;
/// use mayfly_client::PatchOps;
/// use serde_json::json;
/// orders.create(&json!({"id": "summary", "customer": "ann", "orders": 0})).await?;
/// // An order and the customer's summary change together, or not at all.
/// orders.batch("ann")
///     .create(&json!({"id": "o-1", "customer": "ann", "total": 30}))
///     .patch("summary", PatchOps::new().incr("/orders", 1))
///     .await?;
/// let failed = orders.batch("ann")
///     .create(&json!({"id": "o-2", "customer": "ann", "total": 12}))
///     .patch("summary", PatchOps::new().incr("/orders", 1))
///     .read("no-such-document")
///     .await
///     .unwrap_err();
/// assert_eq!(failed.operation_index(), Some(2));
/// assert!(orders.read("o-2", "ann").await?.is_none(), "nothing was applied");
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "nothing is written until the batch is awaited"]
pub struct Batch<'a> {
    collection: &'a Collection,
    partition_key: PartitionKey,
    ops: Vec<BatchOperation>,
    /// The first mistake made building it, reported when it is sent.
    error: Option<Error>,
    idempotency_key: Option<String>,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(collection: &'a Collection, partition_key: PartitionKey) -> Self {
        Batch {
            collection,
            partition_key,
            ops: Vec::new(),
            error: None,
            idempotency_key: None,
        }
    }

    /// Sends the batch with an idempotency key (a batch of reads only is not remembered: reads are safe to repeat): the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    fn push(mut self, op: BatchOp) -> Self {
        self.ops.push(BatchOperation { op: Some(op) });
        self
    }

    fn fail(mut self, error: Error) -> Self {
        self.error.get_or_insert(error);
        self
    }

    fn body<T: Serialize + ?Sized>(
        self,
        doc: &T,
        make: impl FnOnce(mayfly_proto::json::JsonObject) -> BatchOp,
    ) -> Self {
        match body_and_ttl(to_object(doc), None) {
            Ok((body, _)) => self.push(make(body)),
            Err(e) => self.fail(e),
        }
    }

    /// Creates a document (of this batch's partition).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.batch(1).create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// # Ok(()) }
    /// ```
    pub fn create<T: Serialize + ?Sized>(self, document: &T) -> Self {
        self.body(document, |body| {
            BatchOp::Create(BatchCreate {
                body: Some(body),
                ttl: None,
            })
        })
    }

    /// Creates or replaces a document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::{BatchResult, UpsertOutcome};
    /// let results = c.batch(1).upsert(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// assert!(matches!(results[0], BatchResult::Upserted(UpsertOutcome::Created(_))));
    /// # Ok(()) }
    /// ```
    pub fn upsert<T: Serialize + ?Sized>(self, document: &T) -> Self {
        self.body(document, |body| {
            BatchOp::Upsert(BatchUpsert {
                body: Some(body),
                ..Default::default()
            })
        })
    }

    /// Replaces a live document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let results = c.batch(1).replace("a", &serde_json::json!({"id": "a", "k": 1, "n": 2})).await?;
    /// assert_eq!(results[0].document().expect("replaced").body()["n"], 2);
    /// # Ok(()) }
    /// ```
    pub fn replace<T: Serialize + ?Sized>(self, id: &str, document: &T) -> Self {
        let id = id.to_owned();
        self.body(document, |body| {
            BatchOp::Replace(BatchReplace {
                id,
                body: Some(body),
                ..Default::default()
            })
        })
    }

    /// Reads a live document, as the operations before it left it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::PatchOps;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "n": 1})).await?;
    /// let results = c.batch(1).patch("a", PatchOps::new().incr("/n", 1)).read("a").await?;
    /// assert_eq!(results[1].document().expect("read").body()["n"], 2);
    /// # Ok(()) }
    /// ```
    pub fn read(self, id: &str) -> Self {
        self.push(BatchOp::Read(BatchRead { id: id.to_owned() }))
    }

    /// Deletes a live document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.batch(1).delete("a").await?;
    /// assert!(c.read("a", 1).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn delete(self, id: &str) -> Self {
        self.push(BatchOp::Delete(BatchDelete {
            id: id.to_owned(),
            ..Default::default()
        }))
    }

    /// Restarts a live document's TTL clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let before = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let results = c.batch(1).touch("a").await?;
    /// assert_ne!(results[0].document().expect("touched").etag(), before.etag());
    /// # Ok(()) }
    /// ```
    pub fn touch(self, id: &str) -> Self {
        self.push(BatchOp::Touch(BatchTouch {
            id: id.to_owned(),
            ..Default::default()
        }))
    }

    /// Patches a live document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::PatchOps;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let results = c.batch(1).patch("a", PatchOps::new().set("/done", true)).await?;
    /// assert_eq!(results[0].document().expect("patched").body()["done"], true);
    /// # Ok(()) }
    /// ```
    pub fn patch(self, id: &str, ops: PatchOps) -> Self {
        match ops.into_wire() {
            Ok(operations) => self.push(BatchOp::Patch(BatchPatch {
                id: id.to_owned(),
                operations,
                ..Default::default()
            })),
            Err(e) => self.fail(e),
        }
    }

    /// Sets the own TTL of the document the operation just added (a create, upsert or
    /// replace) writes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// use mayfly_client::DocumentTtl;
    /// let ttl = DocumentTtl::After(Duration::from_secs(60));
    /// let results = c.batch(1).create(&serde_json::json!({"id": "a", "k": 1})).ttl(ttl).await?;
    /// assert_eq!(results[0].document().expect("created").ttl(), ttl);
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: DocumentTtl) -> Self {
        if ttl == DocumentTtl::Keep {
            return self.fail(Error::invalid(
                "DocumentTtl::Keep is for replace and update, not for a batch's writes",
                Some(Reason::InvalidTtl),
            ));
        }
        let wire = ttl.to_wire();
        let strip = |body: &mut Option<mayfly_proto::json::JsonObject>| {
            // An explicit choice replaces any `ttl` in the body, as for single writes.
            if let Some(b) = body.take() {
                let mut map = b.into_map();
                map.remove("ttl");
                *body = Some(mayfly_proto::json::JsonObject::new(map));
            }
        };
        match self.ops.last_mut().and_then(|o| o.op.as_mut()) {
            Some(BatchOp::Create(BatchCreate { body, ttl }))
            | Some(BatchOp::Upsert(BatchUpsert { body, ttl, .. }))
            | Some(BatchOp::Replace(BatchReplace { body, ttl, .. })) => {
                strip(body);
                *ttl = wire;
                self
            }
            _ => self.fail(misplaced("ttl", "a create, upsert or replace")),
        }
    }

    /// Makes the operation just added apply only to this version of its document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let doc = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.touch("a", 1).await?;
    /// let stale = c.batch(1).delete("a").if_match(doc.etag()).await.unwrap_err();
    /// assert!(matches!(stale, mayfly_client::Error::PreconditionFailed(_)));
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        let etag = etag.to_owned();
        match self.ops.last_mut().and_then(|o| o.op.as_mut()) {
            Some(BatchOp::Upsert(BatchUpsert { if_match, .. }))
            | Some(BatchOp::Replace(BatchReplace { if_match, .. }))
            | Some(BatchOp::Delete(BatchDelete { if_match, .. }))
            | Some(BatchOp::Patch(BatchPatch { if_match, .. }))
            | Some(BatchOp::Touch(BatchTouch { if_match, .. })) => {
                *if_match = etag;
                self
            }
            _ => self.fail(misplaced(
                "if_match",
                "an upsert, replace, delete, patch or touch",
            )),
        }
    }

    /// Makes the patch just added apply only if its document matches `condition`
    /// (`"FROM c WHERE ..."`); otherwise the batch fails.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::{PatchOps, Reason};
    /// c.create(&serde_json::json!({"id": "stock", "k": 1, "left": 0})).await?;
    /// let sold_out = c.batch(1)
    ///     .patch("stock", PatchOps::new().incr("/left", -1))
    ///     .condition("FROM c WHERE c.left > 0")
    ///     .create(&serde_json::json!({"id": "order-1", "k": 1}))
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(sold_out.reason(), Some(&Reason::ConditionNotMet));
    /// # Ok(()) }
    /// ```
    pub fn condition(mut self, text: &str) -> Self {
        match self.ops.last_mut().and_then(|o| o.op.as_mut()) {
            Some(BatchOp::Patch(BatchPatch { condition, .. })) => {
                *condition = text.to_owned();
                self
            }
            _ => self.fail(misplaced("condition", "a patch")),
        }
    }

    /// Makes the patch just added create its document from `body` if there is none live, as
    /// [`Patch::create_if_missing`](crate::Patch::create_if_missing) does
    /// ([`BatchResult::Created`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::{BatchResult, PatchOps};
    /// let results = c.batch(1)
    ///     .patch("stats", PatchOps::new().incr("/orders/count", 1))
    ///     .create_if_missing(serde_json::json!({"id": "stats", "k": 1}))
    ///     .create_parents()
    ///     .await?;
    /// assert!(matches!(&results[0], BatchResult::Created(d) if d.body()["orders"]["count"] == 1));
    /// # Ok(()) }
    /// ```
    pub fn create_if_missing(mut self, body: impl Serialize) -> Self {
        let body = match crate::collection::to_object(&body) {
            Ok(map) => mayfly_proto::json::JsonObject::new(map),
            Err(e) => return self.fail(e),
        };
        match self.ops.last_mut().and_then(|o| o.op.as_mut()) {
            Some(BatchOp::Patch(BatchPatch {
                create_if_missing, ..
            })) => {
                *create_if_missing = Some(body);
                self
            }
            _ => self.fail(misplaced("create_if_missing", "a patch")),
        }
    }

    /// Lets the patch just added create the missing objects on its paths, as
    /// [`Patch::create_parents`](crate::Patch::create_parents) does.
    pub fn create_parents(mut self) -> Self {
        match self.ops.last_mut().and_then(|o| o.op.as_mut()) {
            Some(BatchOp::Patch(BatchPatch { create_parents, .. })) => {
                *create_parents = true;
                self
            }
            _ => self.fail(misplaced("create_parents", "a patch")),
        }
    }
}

fn misplaced(modifier: &str, what: &str) -> Error {
    Error::invalid(
        format!(
            "Batch::{modifier} applies to the operation added just before it, which must be {what}"
        ),
        Some(Reason::InvalidBatch),
    )
}

impl<'a> IntoFuture for Batch<'a> {
    type Output = Result<Vec<BatchResult>, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Batch {
                collection,
                partition_key,
                ops,
                error,
                idempotency_key,
            } = self;
            if let Some(e) = error {
                return Err(e);
            }
            if ops.is_empty() || ops.len() > MAX_BATCH_OPERATIONS {
                return Err(Error::invalid(
                    format!(
                        "a batch has 1 to {MAX_BATCH_OPERATIONS} operations; this one has {}",
                        ops.len()
                    ),
                    Some(Reason::InvalidBatch),
                ));
            }
            // A batch of reads can be sent twice; one that writes only if it was not applied.
            let call = if ops.iter().all(|o| matches!(o.op, Some(BatchOp::Read(_)))) {
                Call::Idempotent
            } else {
                Call::Once
            }
            .keyed(&idempotency_key);
            // Which results may come without a document.
            let kinds: Vec<bool> = ops
                .iter()
                .map(|o| matches!(o.op, Some(BatchOp::Delete(_))))
                .collect();
            let request = ExecuteBatchRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                partition_key: Some(partition_key.into_proto()),
                operations: ops,
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let response = client
                .call(call, || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.execute_batch(request).await }
                })
                .await?;
            if response.results.len() != kinds.len() {
                return Err(Error::invalid(
                    format!(
                        "the server answered a batch of {} operations with {} results",
                        kinds.len(),
                        response.results.len()
                    ),
                    None,
                ));
            }
            response
                .results
                .into_iter()
                .zip(kinds)
                .map(|(r, deleted)| {
                    let outcome = mayfly_proto::v1::UpsertOutcome::try_from(r.upsert_outcome);
                    let created = r.created;
                    Ok(match (r.document.map(Document::from_proto), outcome) {
                        (None, _) if deleted => BatchResult::Deleted,
                        (Some(d), _) if created => BatchResult::Created(d),
                        (None, _) => {
                            return Err(Error::invalid(
                                "the server answered a batch operation other than a delete without its document",
                                None,
                            ));
                        }
                        (Some(d), Ok(mayfly_proto::v1::UpsertOutcome::Created)) => {
                            BatchResult::Upserted(UpsertOutcome::Created(d))
                        }
                        (Some(d), Ok(mayfly_proto::v1::UpsertOutcome::Replaced)) => {
                            BatchResult::Upserted(UpsertOutcome::Replaced(d))
                        }
                        (Some(d), _) => BatchResult::Document(d),
                    })
                })
                .collect()
        })
    }
}
