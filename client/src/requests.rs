//! Document write requests: set options, then `.await` to send.

use std::future::IntoFuture;

use mayfly_proto::{
    json::JsonObject,
    v1::{
        self, CreateDocumentRequest, DeleteDocumentRequest, ReplaceDocumentRequest,
        TouchDocumentRequest, UpsertDocumentRequest,
    },
};
use serde_json::{Map, Value};

use crate::{
    client::{BoxFuture, Call},
    collection::Collection,
    document::{
        DeleteOutcome, Document, PartitionKey, ReplaceOutcome, TouchOutcome, UpsertOutcome,
    },
    error::{Error, ErrorDetails, Reason},
    retry::jitter,
    ttl::DocumentTtl,
};

/// The one place a document's TTL choice meets its body: an explicit choice replaces any
/// `ttl` property in the body and travels as the request's `ttl` field. `Keep` must have been
/// resolved to the TTL read (only replace can).
pub(crate) fn body_and_ttl(
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
) -> Result<(JsonObject, Option<i64>), Error> {
    let mut body = body?;
    let field = match ttl {
        None => None,
        Some(DocumentTtl::Keep) => {
            return Err(Error::invalid(
                "DocumentTtl::Keep keeps the TTL of the version a replace overwrites: use it \
                 with replace (or update), not create or upsert",
                Some(Reason::InvalidTtl),
            ));
        }
        Some(ttl) => {
            body.remove("ttl");
            ttl.to_wire()
        }
    };
    Ok((JsonObject::new(body), field))
}

/// Maps "no such document" to an outcome instead of an error (see the crate's table).
fn missing_or<T>(result: Result<T, Error>, missing: T) -> Result<T, Error> {
    match result {
        Err(Error::NotFound(_)) => Ok(missing),
        other => other,
    }
}

/// Idempotent without `if_match` (a second try has the effect of the first); with it a second
/// try after a first that landed would fail on the new etag.
fn call_for(if_match: &Option<String>) -> Call {
    match if_match {
        None => Call::Idempotent,
        Some(_) => Call::Once,
    }
}

/// An `if_match` mismatch found by the client, worded as the server's.
pub(crate) fn stale(id: &str) -> Error {
    Error::PreconditionFailed(ErrorDetails::new(
        tonic::Code::FailedPrecondition,
        format!("document '{id}' has changed: the etag given is no longer its etag"),
        Some(Reason::EtagMismatch),
    ))
}

/// How many times a replace keeping the TTL reads again after another write landed.
const KEEP_ATTEMPTS: u32 = 20;

/// A document being created; see [`Collection::create`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct CreateDocument<'a> {
    collection: &'a Collection,
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
    partition_key: Option<PartitionKey>,
    idempotency_key: Option<String>,
}

impl<'a> CreateDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, body: Result<Map<String, Value>, Error>) -> Self {
        CreateDocument {
            collection,
            body,
            ttl: None,
            partition_key: None,
            idempotency_key: None,
        }
    }

    /// Sets the document's own TTL (overriding any `ttl` in the body).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use mayfly_client::DocumentTtl;
    /// let doc = c.create(&serde_json::json!({"id": "a", "k": 1})).ttl(DocumentTtl::Never).await?;
    /// assert_eq!(doc.ttl(), DocumentTtl::Never);
    /// assert_eq!(doc.expires_at(), None);
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: DocumentTtl) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// States the partition key; the server rejects the write if the body disagrees.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let err = c.create(&serde_json::json!({"id": "a", "k": "x"})).partition_key("y").await.unwrap_err();
    /// assert!(matches!(err, mayfly_client::Error::InvalidArgument(_)));
    /// # Ok(()) }
    /// ```
    pub fn partition_key(mut self, partition_key: impl Into<PartitionKey>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// Sends the write with an idempotency key: the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl<'a> IntoFuture for CreateDocument<'a> {
    type Output = Result<Document, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let CreateDocument {
                collection,
                body,
                ttl,
                partition_key,
                idempotency_key,
            } = self;
            let (body, ttl) = body_and_ttl(body, ttl)?;
            let request = CreateDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                body: Some(body),
                partition_key: partition_key.map(PartitionKey::into_proto),
                ttl,
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let document = client
                .call_response(Call::Write.keyed(&idempotency_key), || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.create_document(request).await }
                })
                .await?;
            Ok(Document::from_response(document))
        })
    }
}

/// A document being upserted; see [`Collection::upsert`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct UpsertDocument<'a> {
    collection: &'a Collection,
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
    partition_key: Option<PartitionKey>,
    if_match: Option<String>,
    idempotency_key: Option<String>,
}

impl<'a> UpsertDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, body: Result<Map<String, Value>, Error>) -> Self {
        UpsertDocument {
            collection,
            body,
            ttl: None,
            partition_key: None,
            if_match: None,
            idempotency_key: None,
        }
    }

    /// Sets the document's own TTL (overriding any `ttl` in the body).
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
    /// let outcome = c.upsert(&serde_json::json!({"id": "a", "k": 1}))
    ///     .ttl(DocumentTtl::After(Duration::from_secs(30)))
    ///     .await?;
    /// assert_eq!(outcome.document().ttl(), DocumentTtl::After(Duration::from_secs(30)));
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: DocumentTtl) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// States the partition key; the server rejects the write if the body disagrees.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.upsert(&serde_json::json!({"id": "a", "k": 7})).partition_key(7).await?;
    /// # Ok(()) }
    /// ```
    pub fn partition_key(mut self, partition_key: impl Into<PartitionKey>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// Writes only if the live document still has this etag (and fails if there is none).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let v1 = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.upsert(&serde_json::json!({"id": "a", "k": 1, "n": 2})).if_match(v1.etag()).await?;
    /// let stale = c.upsert(&serde_json::json!({"id": "a", "k": 1})).if_match(v1.etag()).await;
    /// assert!(matches!(stale, Err(mayfly_client::Error::PreconditionFailed(_))));
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        self.if_match = Some(etag.to_owned());
        self
    }

    /// Sends the write with an idempotency key: the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl<'a> IntoFuture for UpsertDocument<'a> {
    type Output = Result<UpsertOutcome, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let UpsertDocument {
                collection,
                body,
                ttl,
                partition_key,
                if_match,
                idempotency_key,
            } = self;
            let (body, ttl) = body_and_ttl(body, ttl)?;
            let request = UpsertDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                body: Some(body),
                partition_key: partition_key.map(PartitionKey::into_proto),
                ttl,
                if_match: if_match.unwrap_or_default(),
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let response = client
                .call_response(Call::Write.keyed(&idempotency_key), || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.upsert_document(request).await }
                })
                .await?;
            let (metadata, v1::UpsertDocumentResponse { document, outcome }, extensions) =
                response.into_parts();
            let document = Document::from_response(tonic::Response::from_parts(
                metadata,
                document.ok_or_else(|| {
                    Error::Other(ErrorDetails::new(
                        tonic::Code::Internal,
                        "upsert returned no document",
                        None,
                    ))
                })?,
                extensions,
            ));
            Ok(match v1::UpsertOutcome::try_from(outcome) {
                Ok(v1::UpsertOutcome::Created) => UpsertOutcome::Created(document),
                _ => UpsertOutcome::Replaced(document),
            })
        })
    }
}

/// A document being replaced; see [`Collection::replace`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct ReplaceDocument<'a> {
    collection: &'a Collection,
    id: String,
    partition_key: PartitionKey,
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
    if_match: Option<String>,
    idempotency_key: Option<String>,
}

impl<'a> ReplaceDocument<'a> {
    pub(crate) fn new(
        collection: &'a Collection,
        id: &str,
        partition_key: PartitionKey,
        body: Result<Map<String, Value>, Error>,
    ) -> Self {
        ReplaceDocument {
            collection,
            id: id.to_owned(),
            partition_key,
            body,
            ttl: None,
            if_match: None,
            idempotency_key: None,
        }
    }

    /// Sets the document's own TTL (overriding any `ttl` in the body); `Inherit` removes it,
    /// [`DocumentTtl::Keep`] keeps the one of the version replaced.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use mayfly_client::DocumentTtl;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "ttl": 30})).await?;
    /// let doc = c.replace("a", 1, &serde_json::json!({"id": "a", "k": 1, "ttl": 30}))
    ///     .ttl(DocumentTtl::Inherit)
    ///     .await?
    ///     .into_document()
    ///     .expect("was there");
    /// assert!(!doc.body().contains_key("ttl"));
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: DocumentTtl) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Writes only if the live document still has this etag.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let v1 = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.replace("a", 1, &serde_json::json!({"id": "a", "k": 1})).if_match(v1.etag()).await?;
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        self.if_match = Some(etag.to_owned());
        self
    }

    /// Sends the write with an idempotency key: the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl<'a> IntoFuture for ReplaceDocument<'a> {
    type Output = Result<ReplaceOutcome, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let ReplaceDocument {
                collection,
                id,
                partition_key,
                body,
                ttl,
                if_match,
                idempotency_key,
            } = self;
            if ttl != Some(DocumentTtl::Keep) {
                let (body, ttl) = body_and_ttl(body, ttl)?;
                let send = (if_match, idempotency_key);
                return send_replace(collection, &id, &partition_key, (body, ttl), send).await;
            }
            // Keep: the TTL of the version overwritten, made sure of by writing with if_match
            // on the version read.
            let body = body?;
            let mut conflicts = 0;
            loop {
                let Some(current) = collection.read(&id, partition_key.clone()).await? else {
                    return Ok(ReplaceOutcome::Missing);
                };
                if if_match.as_ref().is_some_and(|etag| etag != current.etag()) {
                    return Err(stale(&id));
                }
                let (body, ttl) = body_and_ttl(Ok(body.clone()), Some(current.ttl()))?;
                let send = (Some(current.etag().to_owned()), idempotency_key.clone());
                match send_replace(collection, &id, &partition_key, (body, ttl), send).await {
                    Err(e)
                        if if_match.is_none()
                            && e.reason() == Some(&Reason::EtagMismatch)
                            && conflicts < KEEP_ATTEMPTS =>
                    {
                        conflicts += 1;
                        tokio::time::sleep(conflict_backoff(conflicts)).await;
                    }
                    other => return other,
                }
            }
        })
    }
}

/// The wait before trying a read-modify-write again after the `conflicts`-th conflict:
/// random up to 1 ms × 2ⁿ⁻¹, at most 64 ms, so that writers contending for one document
/// spread out instead of colliding again.
pub(crate) fn conflict_backoff(conflicts: u32) -> std::time::Duration {
    let ceiling = std::time::Duration::from_millis(1 << conflicts.saturating_sub(1).min(6));
    jitter(ceiling)
}

/// Sends one replace.
pub(crate) async fn send_replace(
    collection: &Collection,
    id: &str,
    partition_key: &PartitionKey,
    (body, ttl): (JsonObject, Option<i64>),
    (if_match, idempotency_key): (Option<String>, Option<String>),
) -> Result<ReplaceOutcome, Error> {
    let request = ReplaceDocumentRequest {
        database: collection.database.clone(),
        collection: collection.id.clone(),
        id: id.to_owned(),
        partition_key: Some(partition_key.clone().into_proto()),
        body: Some(body),
        ttl,
        if_match: if_match.unwrap_or_default(),
        idempotency_key: idempotency_key.clone().unwrap_or_default(),
    };
    // With if_match (every replace of `update` and `Keep`), a second try after a first that
    // landed would fail on its own etag, and `update` would apply its change again.
    let call = if request.if_match.is_empty() {
        Call::Write
    } else {
        Call::Once
    };
    let call = call.keyed(&idempotency_key);
    let client = &collection.client;
    let written = client
        .call_response(call, || {
            let mut documents = client.documents_for(
                &request.database,
                &request.collection,
                request.partition_key.as_ref(),
            );
            let request = request.clone();
            async move { documents.replace_document(request).await }
        })
        .await;
    missing_or(
        written.map(|d| ReplaceOutcome::Replaced(Document::from_response(d))),
        ReplaceOutcome::Missing,
    )
}

/// A touch; see [`Collection::touch`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct TouchDocument<'a> {
    collection: &'a Collection,
    id: String,
    partition_key: PartitionKey,
    if_match: Option<String>,
    idempotency_key: Option<String>,
}

impl<'a> TouchDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, id: &str, partition_key: PartitionKey) -> Self {
        TouchDocument {
            collection,
            id: id.to_owned(),
            partition_key,
            if_match: None,
            idempotency_key: None,
        }
    }

    /// Touches only if the live document still has this etag.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let v1 = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let touched = c.touch("a", 1).if_match(v1.etag()).await?;
    /// assert!(matches!(touched, mayfly_client::TouchOutcome::Touched(_)));
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        self.if_match = Some(etag.to_owned());
        self
    }

    /// Sends the write with an idempotency key: the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl<'a> IntoFuture for TouchDocument<'a> {
    type Output = Result<TouchOutcome, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let TouchDocument {
                collection,
                id,
                partition_key,
                if_match,
                idempotency_key,
            } = self;
            let call = call_for(&if_match).keyed(&idempotency_key);
            let request = TouchDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into_proto()),
                if_match: if_match.unwrap_or_default(),
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let touched = client
                .call_response(call, || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.touch_document(request).await }
                })
                .await;
            missing_or(
                touched.map(|d| TouchOutcome::Touched(Document::from_response(d))),
                TouchOutcome::Missing,
            )
        })
    }
}

/// A delete; see [`Collection::delete_document`].
#[derive(Debug)]
#[must_use = "nothing is deleted until the request is awaited"]
pub struct DeleteDocument<'a> {
    collection: &'a Collection,
    id: String,
    partition_key: PartitionKey,
    if_match: Option<String>,
    idempotency_key: Option<String>,
}

impl<'a> DeleteDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, id: &str, partition_key: PartitionKey) -> Self {
        DeleteDocument {
            collection,
            id: id.to_owned(),
            partition_key,
            if_match: None,
            idempotency_key: None,
        }
    }

    /// Deletes only if the live document still has this etag.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let v1 = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.delete_document("a", 1).if_match(v1.etag()).await?;
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        self.if_match = Some(etag.to_owned());
        self
    }

    /// Sends the write with an idempotency key: the server applies it at most once while it
    /// remembers the key (10 minutes by default), so the client's retry policy sends it again
    /// after any failure, a timeout or a broken connection included, and a second copy gets
    /// the first answer. Use a new key per logical write ([`new_idempotency_key`](crate::new_idempotency_key)); see the
    /// crate's "Idempotency keys".
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

impl<'a> IntoFuture for DeleteDocument<'a> {
    type Output = Result<DeleteOutcome, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let DeleteDocument {
                collection,
                id,
                partition_key,
                if_match,
                idempotency_key,
            } = self;
            let call = call_for(&if_match).keyed(&idempotency_key);
            let request = DeleteDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into_proto()),
                if_match: if_match.unwrap_or_default(),
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let deleted = client
                .call(call, || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.delete_document(request).await }
                })
                .await;
            missing_or(
                deleted.map(|_| DeleteOutcome::Deleted),
                DeleteOutcome::Missing,
            )
        })
    }
}
