//! Partial document updates (Cosmos DB's patch): operations on JSON-pointer paths, applied by
//! the server as one write.

use std::future::IntoFuture;

use mayfly_proto::{
    json,
    v1::{
        PatchDocumentRequest, PatchIncrement, PatchMove, PatchOperation, PatchValue,
        oneofs::{PatchIncrementBy, PatchOp},
    },
};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{
    client::{BoxFuture, Call},
    collection::Collection,
    document::{Document, PartitionKey},
    error::Error,
    ttl::DocumentTtl,
};

/// A JSON pointer (RFC 6901) to the value reached through `segments`, each a property name
/// or an array index, escaped so that any text is one segment: `~` becomes `~0` and `/`
/// becomes `~1`. Build patch paths from user-supplied keys with it: `format!("/items/{key}")`
/// with a key `a/b` would patch `/items/a/b`, another place.
///
/// No segments is `""`, the whole document.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let carts = db.create_collection("carts", "/user").await?;
/// use mayfly_client::json_pointer;
/// let sku = "tea/green~1kg"; // from the user: may hold '/' and '~'
/// assert_eq!(json_pointer(["items", sku, "qty"]), "/items/tea~1green~01kg/qty");
///
/// carts.create(&serde_json::json!({"id": "c1", "user": "ann", "items": {sku: {"qty": 1}}})).await?;
/// carts.patch("c1", "ann").incr(&json_pointer(["items", sku, "qty"]), 2).await?;
/// let cart = carts.read("c1", "ann").await?.expect("there");
/// assert_eq!(cart.body()["items"][sku]["qty"], 3);
/// # Ok(()) }
/// ```
pub fn json_pointer<I>(segments: I) -> String
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut pointer = String::new();
    for segment in segments {
        pointer.push('/');
        for c in segment.as_ref().chars() {
            match c {
                '~' => pointer.push_str("~0"),
                '/' => pointer.push_str("~1"),
                c => pointer.push(c),
            }
        }
    }
    pointer
}

/// Patch operations (at most 10), applied in order; see [`Collection::patch`] and
/// [`Batch::patch`](crate::Batch::patch). Paths are JSON pointers: `/status`, `/address/city`,
/// `/tags/0`, `/tags/-` (the end of an array); `~1` stands for `/` and `~0` for `~` in a
/// property name. [`json_pointer`] escapes them for property names that come from users.
/// `/id`, system properties and the partition key cannot be patched.
///
/// ```
/// use mayfly_client::PatchOps;
/// let ops = PatchOps::new()
///     .incr("/count", 1)
///     .set("/status", "active")
///     .add("/tags/-", "new")
///     .remove("/draft")
///     .move_value("/old", "/new");
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "operations do nothing until sent"]
pub struct PatchOps {
    ops: Vec<PatchOperation>,
    /// A value that did not serialize: reported when the patch is sent.
    error: Option<String>,
}

impl PatchOps {
    /// No operations yet.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().incr("/visits", 1);
    /// ```
    pub fn new() -> Self {
        PatchOps::default()
    }

    fn push(mut self, op: PatchOp) -> Self {
        self.ops.push(PatchOperation { op: Some(op) });
        self
    }

    fn value(mut self, path: &str, value: impl Serialize, make: fn(PatchValue) -> PatchOp) -> Self {
        match serde_json::to_value(value) {
            Ok(value) => self.push(make(PatchValue {
                path: path.to_owned(),
                value: Some(json::JsonValue::new(value)),
            })),
            Err(e) => {
                self.error
                    .get_or_insert(format!("the value for {path}: {e}"));
                self
            }
        }
    }

    /// Sets an object member (created or replaced), or inserts into an array before the
    /// index (`/tags/-` appends).
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().add("/tags/0", "first");
    /// ```
    pub fn add(self, path: &str, value: impl Serialize) -> Self {
        self.value(path, value, PatchOp::Add)
    }

    /// Sets an object member (created or replaced), or replaces an array element.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().set("/address/city", "Lyon");
    /// ```
    pub fn set(self, path: &str, value: impl Serialize) -> Self {
        self.value(path, value, PatchOp::Set)
    }

    /// Replaces a value that must exist.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().replace("/status", "closed");
    /// ```
    pub fn replace(self, path: &str, value: impl Serialize) -> Self {
        self.value(path, value, PatchOp::Replace)
    }

    /// Removes a value that must exist.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().remove("/draft");
    /// ```
    pub fn remove(self, path: &str) -> Self {
        self.push(PatchOp::Remove(path.to_owned()))
    }

    /// Adds `by` to the integer at `path`, exactly (created with `by` if absent). A result
    /// beyond ±2^53, where numbers (doubles) stop holding every integer, is refused with
    /// `InvalidPatch` and changes nothing. Concurrent increments of one document all count.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().incr("/count", -1);
    /// ```
    pub fn incr(self, path: &str, by: i64) -> Self {
        self.push(PatchOp::Incr(PatchIncrement {
            path: path.to_owned(),
            by: Some(PatchIncrementBy::Integer(by)),
        }))
    }

    /// Adds `by` to the number at `path`, as a floating-point number.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().incr_float("/balance", 2.5);
    /// ```
    pub fn incr_float(self, path: &str, by: f64) -> Self {
        self.push(PatchOp::Incr(PatchIncrement {
            path: path.to_owned(),
            by: Some(PatchIncrementBy::Number(by)),
        }))
    }

    /// Moves the value at `from`, which must exist, to `to`.
    ///
    /// ```
    /// let ops = mayfly_client::PatchOps::new().move_value("/pending", "/done");
    /// ```
    pub fn move_value(self, from: &str, to: &str) -> Self {
        self.push(PatchOp::Move(PatchMove {
            from: from.to_owned(),
            path: to.to_owned(),
        }))
    }

    /// Sets the document's own TTL (the patch is a write: its clock restarts either way).
    /// [`DocumentTtl::Inherit`] removes the `ttl` property, and fails the patch if the document
    /// has none; [`DocumentTtl::Keep`] adds no operation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mayfly_client::{DocumentTtl, PatchOps};
    /// let ops = PatchOps::new().ttl(DocumentTtl::After(Duration::from_secs(60)));
    /// ```
    pub fn ttl(self, ttl: DocumentTtl) -> Self {
        match ttl {
            DocumentTtl::Keep => self,
            DocumentTtl::Inherit => self.remove("/ttl"),
            DocumentTtl::Never | DocumentTtl::After(_) => {
                self.set("/ttl", ttl.to_wire().unwrap_or(-1))
            }
        }
    }

    pub(crate) fn into_wire(self) -> Result<Vec<PatchOperation>, Error> {
        match self.error {
            Some(message) => Err(Error::Serialization(message)),
            None => Ok(self.ops),
        }
    }
}

/// What a patch did.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let c = db.create_collection("c", "/k").await?;
/// use mayfly_client::PatchOutcome;
/// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
/// match c.patch("a", 1).incr("/n", 5).await? {
///     PatchOutcome::Patched(doc) => assert_eq!(doc.body()["n"], 5),
///     PatchOutcome::Created(_) => unreachable!("only with create_if_missing"),
///     PatchOutcome::Missing => unreachable!("just created"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum PatchOutcome {
    /// The document was patched; this is the new version.
    Patched(Document),
    /// There was no live document and the patch was sent with
    /// [`Patch::create_if_missing`]: the document was created from that body, with the
    /// operations applied, in one write; this is its first version.
    Created(Document),
    /// No live document: never written, deleted, or expired already. Nothing was written.
    Missing,
}

impl PatchOutcome {
    /// The new version, if the document was there.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// assert!(c.patch("nobody", 1).incr("/n", 1).await?.into_document().is_none());
    /// # Ok(()) }
    /// ```
    pub fn into_document(self) -> Option<Document> {
        match self {
            PatchOutcome::Patched(d) | PatchOutcome::Created(d) => Some(d),
            PatchOutcome::Missing => None,
        }
    }
}

/// A patch being built; see [`Collection::patch`]. `.await` sends it. The client's
/// [`RetryPolicy`](crate::RetryPolicy) sends a patch again only after failures that
/// guarantee it was not applied: an `incr` sent twice would count twice.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let c = db.create_collection("c", "/k").await?;
/// c.create(&serde_json::json!({"id": "a", "k": 1, "tags": []})).await?;
/// let doc = c.patch("a", 1)
///     .incr("/count", 1)
///     .set("/status", "active")
///     .add("/tags/-", "new")
///     .await?
///     .into_document()
///     .expect("there");
/// assert_eq!(doc.body()["tags"], serde_json::json!(["new"]));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "nothing is written until the request is awaited"]
pub struct Patch<'a> {
    collection: &'a Collection,
    id: String,
    partition_key: PartitionKey,
    ops: PatchOps,
    if_match: Option<String>,
    condition: Option<String>,
    create_if_missing: Option<Result<Map<String, Value>, Error>>,
    create_parents: bool,
    idempotency_key: Option<String>,
}

impl<'a> Patch<'a> {
    pub(crate) fn new(collection: &'a Collection, id: &str, partition_key: PartitionKey) -> Self {
        Patch {
            collection,
            id: id.to_owned(),
            partition_key,
            ops: PatchOps::new(),
            if_match: None,
            condition: None,
            create_if_missing: None,
            create_parents: false,
            idempotency_key: None,
        }
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

    /// Adds the operations of `ops` after those already added.
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
    /// let visit = PatchOps::new().incr("/visits", 1).set("/last", "home");
    /// let doc = c.patch("a", 1).ops(visit).await?.into_document().expect("there");
    /// assert_eq!(doc.body()["visits"], 1);
    /// # Ok(()) }
    /// ```
    pub fn ops(mut self, ops: PatchOps) -> Self {
        self.ops.ops.extend(ops.ops);
        if self.ops.error.is_none() {
            self.ops.error = ops.error;
        }
        self
    }

    /// See [`PatchOps::add`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "tags": ["x"]})).await?;
    /// let doc = c.patch("a", 1).add("/tags/-", "y").await?.into_document().expect("there");
    /// assert_eq!(doc.body()["tags"], serde_json::json!(["x", "y"]));
    /// # Ok(()) }
    /// ```
    pub fn add(mut self, path: &str, value: impl Serialize) -> Self {
        self.ops = self.ops.add(path, value);
        self
    }

    /// See [`PatchOps::set`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let doc = c.patch("a", 1).set("/status", "open").await?.into_document().expect("there");
    /// assert_eq!(doc.body()["status"], "open");
    /// # Ok(()) }
    /// ```
    pub fn set(mut self, path: &str, value: impl Serialize) -> Self {
        self.ops = self.ops.set(path, value);
        self
    }

    /// See [`PatchOps::replace`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let err = c.patch("a", 1).replace("/status", "x").await.unwrap_err();
    /// assert_eq!(err.reason(), Some(&mayfly_client::Reason::InvalidPatch)); // nothing at /status
    /// # Ok(()) }
    /// ```
    pub fn replace(mut self, path: &str, value: impl Serialize) -> Self {
        self.ops = self.ops.replace(path, value);
        self
    }

    /// See [`PatchOps::remove`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "draft": true})).await?;
    /// let doc = c.patch("a", 1).remove("/draft").await?.into_document().expect("there");
    /// assert!(doc.body().get("draft").is_none());
    /// # Ok(()) }
    /// ```
    pub fn remove(mut self, path: &str) -> Self {
        self.ops = self.ops.remove(path);
        self
    }

    /// See [`PatchOps::incr`]: the counter case.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "hits", "k": 1})).await?;
    /// let tasks: Vec<_> = (0..4).map(|_| {
    ///     let c = c.clone();
    ///     tokio::spawn(async move { c.patch("hits", 1).incr("/n", 1).await })
    /// }).collect();
    /// for t in tasks { t.await??; }
    /// assert_eq!(c.read("hits", 1).await?.expect("there").body()["n"], 4);
    /// # Ok(()) }
    /// ```
    pub fn incr(mut self, path: &str, by: i64) -> Self {
        self.ops = self.ops.incr(path, by);
        self
    }

    /// See [`PatchOps::incr_float`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "balance": 1})).await?;
    /// let doc = c.patch("a", 1).incr_float("/balance", 0.5).await?.into_document().expect("there");
    /// assert_eq!(doc.body()["balance"], 1.5);
    /// # Ok(()) }
    /// ```
    pub fn incr_float(mut self, path: &str, by: f64) -> Self {
        self.ops = self.ops.incr_float(path, by);
        self
    }

    /// See [`PatchOps::move_value`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "todo": "x"})).await?;
    /// let doc = c.patch("a", 1).move_value("/todo", "/done").await?.into_document().expect("there");
    /// assert_eq!(doc.body()["done"], "x");
    /// # Ok(()) }
    /// ```
    pub fn move_value(mut self, from: &str, to: &str) -> Self {
        self.ops = self.ops.move_value(from, to);
        self
    }

    /// See [`PatchOps::ttl`].
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
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let doc = c.patch("a", 1).incr("/n", 1).ttl(DocumentTtl::After(Duration::from_secs(30)))
    ///     .await?.into_document().expect("there");
    /// assert_eq!(doc.ttl(), DocumentTtl::After(Duration::from_secs(30)));
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: DocumentTtl) -> Self {
        self.ops = self.ops.ttl(ttl);
        self
    }

    /// Patches only this version of the document ([`Error::PreconditionFailed`] otherwise).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let doc = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// c.patch("a", 1).set("/n", 1).if_match(doc.etag()).await?;
    /// let stale = c.patch("a", 1).set("/n", 2).if_match(doc.etag()).await.unwrap_err();
    /// assert!(matches!(stale, mayfly_client::Error::PreconditionFailed(_)));
    /// # Ok(()) }
    /// ```
    pub fn if_match(mut self, etag: &str) -> Self {
        self.if_match = Some(etag.to_owned());
        self
    }

    /// Patches only if the document matches `condition`, a query without `SELECT`
    /// (`"FROM c WHERE c.count < 100"`); otherwise [`Error::PreconditionFailed`] with
    /// [`Reason::ConditionNotMet`](crate::Reason::ConditionNotMet).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::Reason;
    /// c.create(&serde_json::json!({"id": "quota", "k": 1, "used": 2})).await?;
    /// let take = || c.patch("quota", 1).incr("/used", 1).condition("FROM c WHERE c.used < 3");
    /// take().await?;
    /// let refused = take().await.unwrap_err();
    /// assert_eq!(refused.reason(), Some(&Reason::ConditionNotMet));
    /// # Ok(()) }
    /// ```
    pub fn condition(mut self, condition: &str) -> Self {
        self.condition = Some(condition.to_owned());
        self
    }

    /// Creates the document from `body` if there is no live one (never written, deleted or
    /// expired), then applies the operations to it, all in one write
    /// ([`PatchOutcome::Created`]); a live document is patched as without it
    /// ([`PatchOutcome::Patched`], `body` unused). The body is checked as a create's is: its
    /// `id` and partition key must be the patch's. Concurrent patches creating one document
    /// never conflict: one creates, the others patch what it created. Cannot be combined with
    /// [`Patch::if_match`] (an etag names a version that exists). A `condition` is checked
    /// against a live document only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("shop").await?;
    /// # let carts = db.create_collection("carts", "/user").await?;
    /// use mayfly_client::{PatchOutcome, json_pointer};
    /// let add = |sku: &str| {
    ///     carts.patch("cart-ann", "ann")
    ///         .create_if_missing(serde_json::json!({"id": "cart-ann", "user": "ann"}))
    ///         .create_parents()
    ///         .incr(&json_pointer(["items", sku, "qty"]), 1)
    /// };
    /// assert!(matches!(add("sku/1").await?, PatchOutcome::Created(_)));
    /// let PatchOutcome::Patched(cart) = add("sku/1").await? else { panic!("patched") };
    /// assert_eq!(cart.body()["items"]["sku/1"]["qty"], 2);
    /// # Ok(()) }
    /// ```
    pub fn create_if_missing(mut self, body: impl Serialize) -> Self {
        self.create_if_missing = Some(crate::collection::to_object(&body));
        self
    }

    /// Lets `set`, `add` and `incr` create the missing objects on their paths, as empty
    /// objects (`/items/sku1/qty` on `{}` makes `{"items": {"sku1": {"qty": ...}}}`); a missing
    /// array element is still an error. See [`Patch::create_if_missing`] for an example.
    pub fn create_parents(mut self) -> Self {
        self.create_parents = true;
        self
    }
}

impl<'a> IntoFuture for Patch<'a> {
    type Output = Result<PatchOutcome, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Patch {
                collection,
                id,
                partition_key,
                ops,
                if_match,
                condition,
                create_if_missing,
                create_parents,
                idempotency_key,
            } = self;
            let request = PatchDocumentRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                id,
                partition_key: Some(partition_key.into_proto()),
                operations: ops.into_wire()?,
                if_match: if_match.unwrap_or_default(),
                condition: condition.unwrap_or_default(),
                create_if_missing: create_if_missing.transpose()?.map(json::JsonObject::new),
                create_parents,
                idempotency_key: idempotency_key.clone().unwrap_or_default(),
            };
            let client = &collection.client;
            let answer = client
                .call_response(Call::Once.keyed(&idempotency_key), || {
                    let mut documents = client.documents_for(
                        &request.database,
                        &request.collection,
                        request.partition_key.as_ref(),
                    );
                    let request = request.clone();
                    async move { documents.patch_document(request).await }
                })
                .await;
            match answer {
                Ok(response) => {
                    // The server says which happened (see `PatchDocumentRequest`).
                    let created = response
                        .metadata()
                        .get("mayfly-created")
                        .is_some_and(|v| v.as_bytes() == b"true");
                    let document = Document::from_response(response);
                    Ok(match created {
                        true => PatchOutcome::Created(document),
                        false => PatchOutcome::Patched(document),
                    })
                }
                Err(Error::NotFound(_)) => Ok(PatchOutcome::Missing),
                Err(e) => Err(e),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_pointers_escape_tilde_then_slash() {
        assert_eq!(json_pointer(["items", "a/b", "qty"]), "/items/a~1b/qty");
        assert_eq!(json_pointer(["m~n"]), "/m~0n");
        // `~1` in a key is not a slash: the `~` is escaped first.
        assert_eq!(json_pointer(["~1"]), "/~01");
        assert_eq!(json_pointer(["/~", "", "0"]), "/~1~0//0");
        assert_eq!(json_pointer(Vec::<String>::new()), "");
        let key = String::from("ünï/cödé");
        assert_eq!(json_pointer(&["items", key.as_str()]), "/items/ünï~1cödé");
    }
}
