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
    client::BoxFuture,
    collection::Collection,
    document::{DeleteOutcome, Document, PartitionKey, TouchOutcome, UpsertOutcome},
    error::Error,
    ttl::DocumentTtl,
};

/// The one place a document's TTL choice meets its body: an explicit choice replaces any
/// `ttl` property in the body and travels as the request's `ttl` field.
fn body_and_ttl(
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
) -> Result<(JsonObject, Option<i64>), Error> {
    let mut body = body?;
    let field = match ttl {
        None => None,
        Some(ttl) => {
            body.remove("ttl");
            ttl.to_wire()
        }
    };
    Ok((JsonObject::new(body), field))
}

/// Maps NOT_FOUND to an outcome instead of an error.
fn missing_or<T>(status: tonic::Status, missing: T) -> Result<T, Error> {
    match Error::from(status) {
        Error::NotFound(_) => Ok(missing),
        e => Err(e),
    }
}

/// A document being created; see [`Collection::create`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct CreateDocument<'a> {
    collection: &'a Collection,
    body: Result<Map<String, Value>, Error>,
    ttl: Option<DocumentTtl>,
    partition_key: Option<PartitionKey>,
}

impl<'a> CreateDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, body: Result<Map<String, Value>, Error>) -> Self {
        CreateDocument {
            collection,
            body,
            ttl: None,
            partition_key: None,
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
            } = self;
            let (body, ttl) = body_and_ttl(body, ttl)?;
            let request = CreateDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                body: Some(body),
                partition_key: partition_key.map(v1::PartitionKey::from),
                ttl,
            };
            Ok(collection
                .client
                .documents
                .clone()
                .create_document(request)
                .await?
                .into_inner()
                .into())
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
}

impl<'a> UpsertDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, body: Result<Map<String, Value>, Error>) -> Self {
        UpsertDocument {
            collection,
            body,
            ttl: None,
            partition_key: None,
            if_match: None,
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
            } = self;
            let (body, ttl) = body_and_ttl(body, ttl)?;
            let request = UpsertDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                body: Some(body),
                partition_key: partition_key.map(v1::PartitionKey::from),
                ttl,
                if_match: if_match.unwrap_or_default(),
            };
            let v1::UpsertDocumentResponse { document, outcome } = collection
                .client
                .documents
                .clone()
                .upsert_document(request)
                .await?
                .into_inner();
            let document: Document = document
                .ok_or_else(|| Error::Other {
                    code: tonic::Code::Internal,
                    message: "upsert returned no document".into(),
                })?
                .into();
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
        }
    }

    /// Sets the document's own TTL (overriding any `ttl` in the body); `Inherit` removes it.
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
    ///     .await?;
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
}

impl<'a> IntoFuture for ReplaceDocument<'a> {
    type Output = Result<Document, Error>;
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
            } = self;
            let (body, ttl) = body_and_ttl(body, ttl)?;
            let request = ReplaceDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into()),
                body: Some(body),
                ttl,
                if_match: if_match.unwrap_or_default(),
            };
            Ok(collection
                .client
                .documents
                .clone()
                .replace_document(request)
                .await?
                .into_inner()
                .into())
        })
    }
}

/// A touch; see [`Collection::touch`].
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct TouchDocument<'a> {
    collection: &'a Collection,
    id: String,
    partition_key: PartitionKey,
    if_match: Option<String>,
}

impl<'a> TouchDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, id: &str, partition_key: PartitionKey) -> Self {
        TouchDocument {
            collection,
            id: id.to_owned(),
            partition_key,
            if_match: None,
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
            } = self;
            let request = TouchDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into()),
                if_match: if_match.unwrap_or_default(),
            };
            match collection
                .client
                .documents
                .clone()
                .touch_document(request)
                .await
            {
                Ok(response) => Ok(TouchOutcome::Touched(response.into_inner().into())),
                Err(status) => missing_or(status, TouchOutcome::Missing),
            }
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
}

impl<'a> DeleteDocument<'a> {
    pub(crate) fn new(collection: &'a Collection, id: &str, partition_key: PartitionKey) -> Self {
        DeleteDocument {
            collection,
            id: id.to_owned(),
            partition_key,
            if_match: None,
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
            } = self;
            let request = DeleteDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into()),
                if_match: if_match.unwrap_or_default(),
            };
            match collection
                .client
                .documents
                .clone()
                .delete_document(request)
                .await
            {
                Ok(_) => Ok(DeleteOutcome::Deleted),
                Err(status) => missing_or(status, DeleteOutcome::Missing),
            }
        })
    }
}
