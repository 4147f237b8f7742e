//! Documents as the client returns them, partition keys, and write outcomes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mayfly_proto::{
    json::JsonValue,
    v1::{self, oneofs::PartitionKeyKind},
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::{error::Error, ttl::DocumentTtl};

/// A partition key value: the JSON value at the collection's partition key path.
#[derive(Clone, Debug, PartialEq)]
pub enum PartitionKey {
    /// The document has no property at the path.
    Undefined,
    /// JSON null.
    Null,
    /// A bool.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(String),
}

impl From<&str> for PartitionKey {
    fn from(s: &str) -> Self {
        PartitionKey::String(s.to_owned())
    }
}

impl From<String> for PartitionKey {
    fn from(s: String) -> Self {
        PartitionKey::String(s)
    }
}

impl From<&String> for PartitionKey {
    fn from(s: &String) -> Self {
        PartitionKey::String(s.clone())
    }
}

impl From<f64> for PartitionKey {
    fn from(x: f64) -> Self {
        PartitionKey::Number(x)
    }
}

/// Integers become numbers (JSON numbers are doubles): exact up to ±2^53, the nearest double
/// beyond, as the server would store the number in a body.
///
/// ```
/// use mayfly_client::PartitionKey;
/// assert_eq!(PartitionKey::from(7), PartitionKey::Number(7.0)); // i32
/// assert_eq!(PartitionKey::from(7_u32), PartitionKey::Number(7.0));
/// assert_eq!(PartitionKey::from(7_i64), PartitionKey::Number(7.0));
/// assert_eq!(PartitionKey::from(7_u64), PartitionKey::Number(7.0));
/// ```
macro_rules! integer_partition_keys {
    ($($int:ty),*) => {$(
        impl From<$int> for PartitionKey {
            fn from(x: $int) -> Self {
                PartitionKey::Number(x as f64)
            }
        }
    )*};
}

integer_partition_keys!(i32, u32, i64, u64);

impl From<bool> for PartitionKey {
    fn from(b: bool) -> Self {
        PartitionKey::Bool(b)
    }
}

impl PartitionKey {
    /// The value as JSON, for messages (`"ann"`, `42`, `undefined`).
    fn describe(&self) -> String {
        match self {
            PartitionKey::Undefined => "undefined".to_owned(),
            PartitionKey::Null => "null".to_owned(),
            PartitionKey::Bool(b) => b.to_string(),
            PartitionKey::Number(x) => {
                serde_json::Number::from_f64(*x).map_or_else(|| x.to_string(), |n| n.to_string())
            }
            PartitionKey::String(s) => Value::String(s.clone()).to_string(),
        }
    }

    pub(crate) fn into_proto(self) -> v1::PartitionKey {
        let pk = self;
        let value = |value: Value| PartitionKeyKind::Value(JsonValue::new(value));
        let kind = match pk {
            PartitionKey::Undefined => PartitionKeyKind::Undefined(()),
            PartitionKey::Null => value(Value::Null),
            PartitionKey::Bool(b) => value(Value::Bool(b)),
            // NaN or infinity (not JSON) goes as NaN, for the server to refuse.
            PartitionKey::Number(x) => match serde_json::Number::from_f64(x) {
                Some(n) => value(Value::Number(n)),
                None => PartitionKeyKind::Value(JsonValue::from(prost_types::Value {
                    kind: Some(prost_types::value::Kind::NumberValue(x)),
                })),
            },
            PartitionKey::String(s) => value(Value::String(s)),
        };
        v1::PartitionKey { kind: Some(kind) }
    }

    pub(crate) fn from_proto(pk: Option<v1::PartitionKey>) -> Self {
        match pk.and_then(|p| p.kind) {
            Some(PartitionKeyKind::Value(value)) => match value.into_checked() {
                Ok(Value::Bool(b)) => PartitionKey::Bool(b),
                Ok(Value::Number(n)) => PartitionKey::Number(n.as_f64().unwrap_or(0.0)),
                Ok(Value::String(s)) => PartitionKey::String(s),
                // The server only sends scalars.
                _ => PartitionKey::Null,
            },
            _ => PartitionKey::Undefined,
        }
    }
}

/// `value` as a `T`; a failure names `what` (the document or result) and the JSON path within
/// it where the value did not fit (`items[2].qty`).
pub(crate) fn from_json<T: DeserializeOwned>(
    value: Value,
    what: impl FnOnce() -> String,
) -> Result<T, Error> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        Error::Serialization(format!(
            "{} does not deserialize as {}{at}: {}",
            what(),
            std::any::type_name::<T>(),
            e.inner()
        ))
    })
}

/// A document with its system properties.
#[derive(Clone, Debug)]
pub struct Document {
    id: String,
    partition_key: PartitionKey,
    body: Map<String, Value>,
    ts: i64,
    etag: String,
    ttl: DocumentTtl,
    modified_at: SystemTime,
    expires_at: Option<SystemTime>,
    expires_in: Option<Duration>,
    /// What the request that answered it cost, in hundredths of a request unit.
    request_charge: u64,
}

/// Documents are equal when the documents are: what the requests that answered them cost is
/// not part of them.
impl PartialEq for Document {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.id,
            &self.partition_key,
            &self.body,
            self.ts,
            &self.etag,
            &self.ttl,
            self.modified_at,
            self.expires_at,
            self.expires_in,
        ) == (
            &other.id,
            &other.partition_key,
            &other.body,
            other.ts,
            &other.etag,
            &other.ttl,
            other.modified_at,
            other.expires_at,
            other.expires_in,
        )
    }
}

pub(crate) fn system_time(ts: prost_types::Timestamp) -> SystemTime {
    let secs = Duration::from_secs(u64::try_from(ts.seconds).unwrap_or(0));
    let nanos = Duration::from_nanos(u64::try_from(ts.nanos).unwrap_or(0));
    // Checked: a timestamp past what SystemTime holds (from a broken or hostile server)
    // must not panic; it reads as the far future.
    UNIX_EPOCH
        .checked_add(secs)
        .and_then(|t| t.checked_add(nanos))
        .unwrap_or_else(|| UNIX_EPOCH + Duration::from_secs(1 << 40))
}

impl Document {
    /// The document as the server sent it. (Not a `From` impl: that would show the
    /// protobuf type in the public API.)
    pub(crate) fn from_proto(doc: v1::Document) -> Self {
        let v1::Document {
            id,
            partition_key,
            body,
            ts,
            etag,
            ttl,
            expires_at,
            expires_in,
            modified_at,
        } = doc;
        Document {
            id,
            partition_key: PartitionKey::from_proto(partition_key),
            body: body.map(|b| b.into_map()).unwrap_or_default(),
            ts,
            etag,
            ttl: DocumentTtl::from_wire(ttl),
            modified_at: modified_at.map_or(UNIX_EPOCH, system_time),
            expires_at: expires_at.map(system_time),
            expires_in: expires_in.map(|d| {
                Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
                    + Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0))
            }),
            request_charge: 0,
        }
    }

    /// The document answered by `response`, with what the request cost.
    pub(crate) fn from_response(response: tonic::Response<v1::Document>) -> Self {
        let charge = crate::error::charge_of(response.metadata());
        Document {
            request_charge: charge,
            ..Document::from_proto(response.into_inner())
        }
    }

    /// What the request that answered this document cost, in request units (the server's
    /// `x-request-charge`; README, "Request units"): a create, read, replace, upsert, patch
    /// or touch. 0 for a document that came in a page (the page has the charge).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// let created = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// let read = orders.read("SO05", "CO1").await?.expect("alive");
    /// assert!(created.request_charge() > read.request_charge());
    /// assert_eq!(read.request_charge(), 1.0); // a point read of up to 1 KB
    /// # Ok(()) }
    /// ```
    pub fn request_charge(&self) -> f64 {
        self.request_charge as f64 / 100.0
    }

    /// The document id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// assert_eq!(doc.id(), "SO05");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The partition the document is stored in.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use mayfly_client::PartitionKey;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// assert_eq!(doc.partition_key(), &PartitionKey::from("CO1"));
    /// let loose = orders.create(&serde_json::json!({"id": "SO06"})).await?;
    /// assert_eq!(loose.partition_key(), &PartitionKey::Undefined);
    /// # Ok(()) }
    /// ```
    pub fn partition_key(&self) -> &PartitionKey {
        &self.partition_key
    }

    /// The JSON body as stored (including `id`, and `ttl` if it has one), without the system
    /// properties `_ts` and `_etag` ([`ts`](Self::ts), [`etag`](Self::etag)); the typed
    /// conversions ([`deserialize`](Self::deserialize), [`into_item`](Self::into_item)) add
    /// them, as a query's `SELECT *` does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "total": 42.5})).await?;
    /// assert_eq!(doc.body()["total"], 42.5);
    /// # Ok(()) }
    /// ```
    pub fn body(&self) -> &Map<String, Value> {
        &self.body
    }

    /// The document as a typed value, exactly as a query's `SELECT *` returns it: the body
    /// (`id`, the document's own `ttl` if it has one, every other property) with the system
    /// properties `_ts` (seconds) and `_etag`, so that a field `#[serde(rename = "_ts")]` of
    /// `T` is filled by a read as by a query. A `T` with `#[serde(deny_unknown_fields)]` must
    /// name `_ts` and `_etag` (or not deny unknown fields). When the body does not fit `T`,
    /// [`Error::Serialization`] names the document, its partition key and the JSON path of
    /// the value that did not fit (`document 'SO05' (partition key "CO1") does not
    /// deserialize as Order at lines[1].qty: invalid type: ...`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// #[derive(serde::Deserialize)]
    /// struct Order { total: f64 }
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "total": 42.5})).await?;
    /// assert_eq!(doc.deserialize::<Order>()?.total, 42.5);
    /// # Ok(()) }
    /// ```
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, Error> {
        self.typed(self.body.clone())
    }

    /// `body` with `_ts` and `_etag` as a `T`: the document as a query's `SELECT *` shows it.
    fn typed<T: DeserializeOwned>(&self, mut body: Map<String, Value>) -> Result<T, Error> {
        body.insert("_ts".to_owned(), Value::from(self.ts));
        body.insert("_etag".to_owned(), Value::String(self.etag.clone()));
        from_json(Value::Object(body), || {
            format!(
                "document '{}' (partition key {})",
                self.id,
                self.partition_key.describe()
            )
        })
    }

    /// `_ts`: the last write, in Unix seconds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    /// assert!((now - doc.ts()).abs() <= 1);
    /// # Ok(()) }
    /// ```
    pub fn ts(&self) -> i64 {
        self.ts
    }

    /// The last write, with millisecond precision.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// let ts = doc.modified_at().duration_since(std::time::UNIX_EPOCH)?;
    /// assert_eq!(ts.as_secs() as i64, doc.ts());
    /// # Ok(()) }
    /// ```
    pub fn modified_at(&self) -> SystemTime {
        self.modified_at
    }

    /// `_etag`: pass it to `if_match` to write only if nobody wrote in between.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let v1 = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// let v2 = orders.upsert(&serde_json::json!({"id": "SO05", "customerId": "CO1", "n": 2})).if_match(v1.etag()).await?;
    /// assert_ne!(v2.document().etag(), v1.etag());
    /// # Ok(()) }
    /// ```
    pub fn etag(&self) -> &str {
        &self.etag
    }

    /// The document's own TTL as stored.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// use mayfly_client::DocumentTtl;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "ttl": 60})).await?;
    /// assert_eq!(doc.ttl(), DocumentTtl::After(Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> DocumentTtl {
        self.ttl
    }

    /// When the document expires under the collection's current rules; `None` = never.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "ttl": 60})).await?;
    /// assert_eq!(doc.expires_at(), Some(doc.modified_at() + Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }

    /// Time it had left when the server answered (measured by the server, so free of clock
    /// skew), or [`Lifetime::Never`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// let doc = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "ttl": 60})).await?;
    /// use mayfly_client::Lifetime;
    /// assert!(doc.remaining() <= Lifetime::Remaining(Duration::from_secs(60)));
    /// let forever = orders.create(&serde_json::json!({"id": "SO06", "customerId": "CO1"})).await?;
    /// assert_eq!(forever.remaining(), Lifetime::Never);
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Lifetime {
        Lifetime::from(self.expires_in)
    }

    /// The document as an [`Item`]: its value as a `T` (the body with `_ts` and `_etag`, as
    /// in [`deserialize`](Self::deserialize) and a query's `SELECT *`), with its system
    /// properties.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// #[serde(rename_all = "camelCase")]
    /// struct Order { id: String, customer_id: String, total: f64 }
    /// let order = Order { id: "SO05".into(), customer_id: "CO1".into(), total: 42.5 };
    /// let item = orders.create(&order).await?.into_item::<Order>()?;
    /// assert_eq!((item.value().total, item.etag().is_empty()), (42.5, false));
    /// # Ok(()) }
    /// ```
    pub fn into_item<T: DeserializeOwned>(mut self) -> Result<Item<T>, Error> {
        let body = std::mem::take(&mut self.body);
        let value = self.typed(body)?;
        Ok(Item {
            value,
            id: self.id,
            partition_key: self.partition_key,
            ts: self.ts,
            etag: self.etag,
            ttl: self.ttl,
            modified_at: self.modified_at,
            expires_at: self.expires_at,
            lifetime: Lifetime::from(self.expires_in),
        })
    }
}

/// How long a document has left.
///
/// `Remaining` sorts before `Never`, so `lifetime <= Lifetime::Remaining(limit)` reads as
/// "expires within `limit`".
///
/// ```
/// use std::time::Duration;
/// use mayfly_client::Lifetime;
/// assert!(Lifetime::Remaining(Duration::from_secs(5)) < Lifetime::Never);
/// assert_eq!(Lifetime::Never.remaining(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lifetime {
    /// It expires after this long (measured by the server when it answered).
    Remaining(Duration),
    /// It never expires under the collection's current settings.
    Never,
}

impl Lifetime {
    /// The time left, or `None` for [`Lifetime::Never`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use mayfly_client::Lifetime;
    /// assert_eq!(Lifetime::Remaining(Duration::from_secs(5)).remaining(), Some(Duration::from_secs(5)));
    /// ```
    pub fn remaining(self) -> Option<Duration> {
        match self {
            Lifetime::Remaining(left) => Some(left),
            Lifetime::Never => None,
        }
    }
}

impl From<Option<Duration>> for Lifetime {
    fn from(left: Option<Duration>) -> Self {
        left.map_or(Lifetime::Never, Lifetime::Remaining)
    }
}

/// A typed document: its value as a `T`, with its etag, `_ts`, own TTL, expiry instant and
/// remaining [`Lifetime`], all from one request.
///
/// The value is what a query's `SELECT *` returns for the document: the body (`id`, `ttl` if
/// the document has its own, every other property) and the system properties `_ts` and
/// `_etag`, so a `T` with `#[serde(rename = "_ts")] ts: i64` is filled alike by
/// [`read_item`](crate::Collection::read_item), a feed and a query.
///
/// # The value and the item's own properties, kept apart
///
/// `Item<T>` does not dereference to `T`: the value is [`value`](Self::value),
/// [`value_mut`](Self::value_mut) or [`into_value`](Self::into_value), and the methods of
/// `Item` ([`id`](Self::id), [`ts`](Self::ts), [`etag`](Self::etag), [`ttl`](Self::ttl), ...)
/// are always the server's system properties. With `Deref`, `item.ts` (a field of `T`) sat
/// next to `item.ts()` (the item's), and a method of `T` named like one of `Item`'s (an
/// `id()`, a `ttl()`) was silently shadowed by it; `item.value().ts` says which one is meant.
/// (`Item` is not a smart pointer, the one kind of type Rust's API guidelines let implement
/// `Deref`.)
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// # let db = client.create_database("app").await?;
/// # let sessions = db.create_collection("sessions", "/user").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
/// use std::time::Duration;
/// use mayfly_client::{DocumentTtl, Lifetime};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Session { id: String, user: String, clicks: u32 }
/// sessions.create(&Session { id: "s1".into(), user: "ann".into(), clicks: 0 })
///     .ttl(DocumentTtl::After(Duration::from_secs(60))).await?;
/// let s1 = sessions.read_item::<Session>("s1", "ann").await?.expect("alive");
/// assert_eq!(s1.value().clicks, 0);
/// assert_eq!(s1.ttl(), DocumentTtl::After(Duration::from_secs(60)));
/// assert!(s1.lifetime() <= Lifetime::Remaining(Duration::from_secs(60)));
/// assert!(s1.expires_at().is_some());
/// # Ok(()) }
/// ```
///
/// The value's own fields are reached through [`value`](Self::value), never on the item:
///
/// ```compile_fail
/// struct Session { clicks: u32 }
/// fn clicks(item: &mayfly_client::Item<Session>) -> u32 {
///     item.clicks // no `Deref`: `item.value().clicks`
/// }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Item<T> {
    value: T,
    id: String,
    partition_key: PartitionKey,
    ts: i64,
    etag: String,
    ttl: DocumentTtl,
    modified_at: SystemTime,
    expires_at: Option<SystemTime>,
    lifetime: Lifetime,
}

impl<T> Item<T> {
    /// The value.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "n": 5})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.value()["n"], 5);
    /// # Ok(()) }
    /// ```
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, to change (for [`Collection::replace_item`](crate::Collection::replace_item)
    /// or in [`Collection::update`](crate::Collection::update)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "n": 5})).await?;
    /// let mut item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// item.value_mut()["n"] = 6.into();
    /// c.replace_item(&item).await?;
    /// # Ok(()) }
    /// ```
    pub fn value_mut(&mut self) -> &mut T {
        &mut self.value
    }

    /// The value, without the system properties.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let value = c.read_item::<serde_json::Value>("a", 1).await?.expect("there").into_value();
    /// assert_eq!(value["id"], "a");
    /// # Ok(()) }
    /// ```
    pub fn into_value(self) -> T {
        self.value
    }

    /// The document id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// assert_eq!(c.read_item::<serde_json::Value>("a", 1).await?.expect("there").id(), "a");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The partition the document is stored in.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.partition_key(), &mayfly_client::PartitionKey::from(1));
    /// # Ok(()) }
    /// ```
    pub fn partition_key(&self) -> &PartitionKey {
        &self.partition_key
    }

    /// `_ts`: the last write, in Unix seconds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert!(item.ts() > 1_700_000_000);
    /// # Ok(()) }
    /// ```
    pub fn ts(&self) -> i64 {
        self.ts
    }

    /// The last write, with millisecond precision.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert!(item.modified_at() <= std::time::SystemTime::now() + std::time::Duration::from_secs(1));
    /// # Ok(()) }
    /// ```
    pub fn modified_at(&self) -> SystemTime {
        self.modified_at
    }

    /// `_etag` of the version read or written.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let written = c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.etag(), written.etag());
    /// # Ok(()) }
    /// ```
    pub fn etag(&self) -> &str {
        &self.etag
    }

    /// The document's own TTL ([`DocumentTtl::Inherit`] when it has none).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::DocumentTtl;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).ttl(DocumentTtl::Never).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.ttl(), DocumentTtl::Never);
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> DocumentTtl {
        self.ttl
    }

    /// Sets the TTL the item is written back with (by
    /// [`Collection::replace_item`](crate::Collection::replace_item) or
    /// [`Collection::update`](crate::Collection::update)); it keeps the one read otherwise.
    /// [`DocumentTtl::Keep`] is the TTL read.
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
    /// let mut item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// item.set_ttl(DocumentTtl::After(Duration::from_secs(30)));
    /// let written = c.replace_item(&item).await?.into_document().expect("still there");
    /// assert_eq!(written.ttl(), DocumentTtl::After(Duration::from_secs(30)));
    /// # Ok(()) }
    /// ```
    pub fn set_ttl(&mut self, ttl: DocumentTtl) {
        if ttl != DocumentTtl::Keep {
            self.ttl = ttl;
        }
    }

    /// When the document expires under the collection's settings at the time of the
    /// request; `None` = never.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "ttl": 60})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.expires_at(), Some(item.modified_at() + std::time::Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }

    /// The time it had left when the server answered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let item = c.read_item::<serde_json::Value>("a", 1).await?.expect("there");
    /// assert_eq!(item.lifetime(), mayfly_client::Lifetime::Never, "TTL is off");
    /// # Ok(()) }
    /// ```
    pub fn lifetime(&self) -> Lifetime {
        self.lifetime
    }
}

/// What an upsert did.
#[derive(Clone, Debug, PartialEq)]
pub enum UpsertOutcome {
    /// No live document had the id: it was created.
    Created(Document),
    /// A live document was replaced.
    Replaced(Document),
}

impl TouchOutcome {
    /// The touched document, if it was there.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// assert!(c.touch("nobody", 1).await?.into_document().is_none());
    /// # Ok(()) }
    /// ```
    pub fn into_document(self) -> Option<Document> {
        match self {
            TouchOutcome::Touched(d) => Some(d),
            TouchOutcome::Missing => None,
        }
    }
}

impl UpsertOutcome {
    /// The stored document, whichever happened.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// let outcome = orders.upsert(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// assert_eq!(outcome.document().id(), "SO05");
    /// # Ok(()) }
    /// ```
    pub fn document(&self) -> &Document {
        match self {
            UpsertOutcome::Created(d) | UpsertOutcome::Replaced(d) => d,
        }
    }
}

/// What a replace did.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplaceOutcome {
    /// The document was replaced; this is the new version.
    Replaced(Document),
    /// No live document: never written, deleted, or expired already. Nothing was written.
    Missing,
}

impl ReplaceOutcome {
    /// The new version, if the document was there.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let doc = c.replace("a", 1, &serde_json::json!({"id": "a", "k": 1, "n": 2})).await?.into_document();
    /// assert_eq!(doc.expect("was there").body()["n"], 2);
    /// # Ok(()) }
    /// ```
    pub fn into_document(self) -> Option<Document> {
        match self {
            ReplaceOutcome::Replaced(d) => Some(d),
            ReplaceOutcome::Missing => None,
        }
    }
}

/// What an [`update`](crate::Collection::update) did.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// use mayfly_client::UpdateOutcome;
/// let db = client.create_database("app").await?;
/// let c = db.create_collection("c", "/k").await?;
/// c.create(&serde_json::json!({"id": "a", "k": 1, "n": 1})).await?;
/// let outcome = c.update::<serde_json::Value, _>("a", 1, |item| item.value_mut()["n"] = 2.into()).await?;
/// assert!(matches!(outcome, UpdateOutcome::Updated { conflicts: 0, .. }));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateOutcome<T> {
    /// The change was written.
    Updated {
        /// The version written.
        item: Item<T>,
        /// How many times another write landed between the read and the write, so that the
        /// change was made again on a fresh read.
        conflicts: u32,
    },
    /// No live document: never written, deleted, or expired already.
    Missing,
}

/// What a touch did.
#[derive(Clone, Debug, PartialEq)]
pub enum TouchOutcome {
    /// The document's TTL clock restarted.
    Touched(Document),
    /// No live document: never written, deleted, or expired already.
    Missing,
}

/// What a delete did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The document was deleted.
    Deleted,
    /// No live document: never written, deleted, or expired already.
    Missing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_partition_keys_are_numbers() {
        let seven = PartitionKey::Number(7.0);
        assert_eq!(PartitionKey::from(7_i32), seven);
        assert_eq!(PartitionKey::from(7_u32), seven);
        assert_eq!(PartitionKey::from(7_i64), seven);
        assert_eq!(PartitionKey::from(7_u64), seven);
        assert_eq!(
            PartitionKey::from(u32::MAX),
            PartitionKey::Number(4_294_967_295.0)
        );
        assert_eq!(PartitionKey::from(-3_i32), PartitionKey::Number(-3.0));
        // Integer literals still work where a partition key is taken (they fall back to i32).
        fn take(pk: impl Into<PartitionKey>) -> PartitionKey {
            pk.into()
        }
        assert_eq!(take(7), seven);
    }

    #[test]
    fn a_value_that_does_not_fit_names_the_document_and_the_path() {
        #[derive(Debug, serde::Deserialize)]
        struct Line {
            #[allow(dead_code)]
            qty: u32,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Cart {
            #[allow(dead_code)]
            items: std::collections::BTreeMap<String, Line>,
        }
        let doc = Document {
            id: "cart1".into(),
            partition_key: PartitionKey::from("ann"),
            body: serde_json::json!({"id": "cart1", "items": {"tea": {"qty": 1}, "cup": {"qty": "two"}}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ts: 1,
            etag: "e".into(),
            ttl: DocumentTtl::Inherit,
            modified_at: UNIX_EPOCH,
            expires_at: None,
            expires_in: None,
            request_charge: 0,
        };
        let Err(Error::Serialization(message)) = doc.clone().into_item::<Cart>() else {
            panic!("qty is not a number")
        };
        assert!(
            message
                .starts_with("document 'cart1' (partition key \"ann\") does not deserialize as "),
            "{message}"
        );
        assert!(
            message.ends_with(r#" at items.cup.qty: invalid type: string "two", expected u32"#),
            "{message}"
        );
        let Err(Error::Serialization(same)) = doc.deserialize::<Cart>() else {
            panic!("qty is not a number")
        };
        assert_eq!(same, message);
        // A missing field is named at the level that misses it.
        let Err(Error::Serialization(missing)) = doc.deserialize::<Line>() else {
            panic!("no qty at the top")
        };
        assert!(missing.ends_with("Line: missing field `qty`"), "{missing}");
    }

    #[test]
    fn typed_values_carry_ts_and_etag_like_select_star() {
        let doc = Document {
            id: "a".into(),
            partition_key: PartitionKey::Number(1.0),
            body: serde_json::json!({"id": "a", "k": 1, "ttl": 60})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ts: 1_790_000_000,
            etag: "0000000000000abc".into(),
            ttl: DocumentTtl::After(Duration::from_secs(60)),
            modified_at: UNIX_EPOCH,
            expires_at: None,
            expires_in: None,
            request_charge: 0,
        };
        let value = serde_json::json!({"id": "a", "k": 1, "ttl": 60, "_ts": 1_790_000_000, "_etag": "0000000000000abc"});
        assert_eq!(doc.deserialize::<Value>().ok(), Some(value.clone()));
        assert_eq!(
            doc.clone().into_item::<Value>().ok().map(Item::into_value),
            Some(value)
        );
        assert!(!doc.body().contains_key("_ts"), "the body stays as stored");
    }
}
