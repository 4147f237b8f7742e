//! Documents as the client returns them, partition keys, and write outcomes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mayfly_proto::v1::{self, oneofs::PartitionKeyKind};
use prost_types::value::Kind;
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

impl From<i64> for PartitionKey {
    fn from(x: i64) -> Self {
        PartitionKey::Number(x as f64)
    }
}

impl From<bool> for PartitionKey {
    fn from(b: bool) -> Self {
        PartitionKey::Bool(b)
    }
}

impl From<PartitionKey> for v1::PartitionKey {
    fn from(pk: PartitionKey) -> Self {
        let value = |kind| PartitionKeyKind::Value(prost_types::Value { kind: Some(kind) });
        let kind = match pk {
            PartitionKey::Undefined => PartitionKeyKind::Undefined(()),
            PartitionKey::Null => value(Kind::NullValue(0)),
            PartitionKey::Bool(b) => value(Kind::BoolValue(b)),
            PartitionKey::Number(x) => value(Kind::NumberValue(x)),
            PartitionKey::String(s) => value(Kind::StringValue(s)),
        };
        v1::PartitionKey { kind: Some(kind) }
    }
}

impl PartitionKey {
    fn from_proto(pk: Option<v1::PartitionKey>) -> Self {
        match pk.and_then(|p| p.kind) {
            Some(PartitionKeyKind::Value(prost_types::Value { kind })) => match kind {
                Some(Kind::BoolValue(b)) => PartitionKey::Bool(b),
                Some(Kind::NumberValue(x)) => PartitionKey::Number(x),
                Some(Kind::StringValue(s)) => PartitionKey::String(s),
                // The server only sends scalars.
                _ => PartitionKey::Null,
            },
            _ => PartitionKey::Undefined,
        }
    }
}

/// A document with its system properties.
#[derive(Clone, Debug, PartialEq)]
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
}

fn system_time(ts: prost_types::Timestamp) -> SystemTime {
    let secs = Duration::from_secs(u64::try_from(ts.seconds).unwrap_or(0));
    UNIX_EPOCH + secs + Duration::from_nanos(u64::try_from(ts.nanos).unwrap_or(0))
}

impl From<v1::Document> for Document {
    fn from(doc: v1::Document) -> Self {
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
        }
    }
}

impl Document {
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

    /// The JSON body as stored (including `ttl` if it has one).
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

    /// The body as a typed value.
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
        Ok(T::deserialize(Value::Object(self.body.clone()))?)
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

    /// Time it had left when the server answered (free of clock skew); `None` = never expires.
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
    /// assert!(doc.remaining().is_some_and(|left| left <= Duration::from_secs(60)));
    /// let forever = orders.create(&serde_json::json!({"id": "SO06", "customerId": "CO1"})).await?;
    /// assert_eq!(forever.remaining(), None);
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Option<Duration> {
        self.expires_in
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
