//! Collection handles: settings and the entry points for document requests.

use std::time::Duration;

use mayfly_proto::json::JsonValue;
use mayfly_proto::v1::{
    self, DeleteCollectionRequest, GetCollectionRequest, ReadDocumentRequest,
    ReplaceCollectionRequest, oneofs::DefaultTtlState,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Map, Value};

use crate::{
    batch::Batch,
    client::{Call, Client},
    document::{Document, Item, PartitionKey, ReplaceOutcome, UpdateOutcome},
    error::{Error, ErrorDetails, Reason},
    feed::ReadFeed,
    patch::Patch,
    query::Query,
    requests::{
        CreateDocument, DeleteDocument, ReplaceDocument, TouchDocument, UpsertDocument,
        conflict_backoff, send_replace,
    },
    ttl::{DefaultTtl, wire_seconds},
};

/// How many conflicts [`Collection::update`] takes before giving up.
pub(crate) const UPDATE_MAX_CONFLICTS: u32 = 100;

/// How a collection indexes its documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IndexingMode {
    /// Index updated with every write.
    #[default]
    Consistent,
    /// Index updated in the background.
    Lazy,
    /// No index (not allowed together with TTL).
    None,
}

impl IndexingMode {
    pub(crate) fn to_wire(self) -> i32 {
        let mode = match self {
            IndexingMode::Consistent => v1::IndexingMode::Consistent,
            IndexingMode::Lazy => v1::IndexingMode::Lazy,
            IndexingMode::None => v1::IndexingMode::None,
        };
        mode as i32
    }
}

/// Which document paths a collection indexes, as in a Cosmos DB indexing policy: `/*` (the
/// whole document), `/a/b/?` (the value at exactly that path), `/a/*` (everything under it);
/// the most precise matching path decides. Both lists empty means the default: everything
/// but `_etag`.
///
/// ```
/// use mayfly_client::IndexingPaths;
/// // Only `status` and `owner/*` are indexed:
/// let paths = IndexingPaths::new(["/status/?", "/owner/*"], ["/*"]);
/// assert_eq!(paths.excluded, ["/*"]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexingPaths {
    /// Paths indexed.
    pub included: Vec<String>,
    /// Paths not indexed.
    pub excluded: Vec<String>,
}

impl IndexingPaths {
    /// Paths from two lists of strings.
    pub fn new<I, E>(included: I, excluded: E) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
        E: IntoIterator,
        E::Item: Into<String>,
    {
        IndexingPaths {
            included: included.into_iter().map(Into::into).collect(),
            excluded: excluded.into_iter().map(Into::into).collect(),
        }
    }

    pub(crate) fn to_wire(&self) -> v1::IndexingPaths {
        v1::IndexingPaths {
            included_paths: self.included.clone(),
            excluded_paths: self.excluded.clone(),
        }
    }
}

/// A kind of document that must never expire, named by the value at a path: documents whose
/// value at `path` is one of `values` must carry `"ttl": -1`
/// ([`DocumentTtl::Never`](crate::DocumentTtl::Never)), or the server refuses the write with
/// [`Reason::MustLive`] and changes nothing. Inheriting a default of off or -1 is not enough,
/// so that a later default TTL cannot make those documents expire either. Documents stored
/// before a rule is set are not checked until they are written again.
///
/// ```
/// use mayfly_client::MustLiveRule;
/// let rule = MustLiveRule::new("/type", ["order", "invoice"]);
/// assert_eq!(rule.values, [serde_json::json!("order"), serde_json::json!("invoice")]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MustLiveRule {
    /// Where the kind is read, written like a partition key path: `/type`, `/meta/kind`.
    pub path: String,
    /// 1 to 64 strings, numbers, bools or nulls; numbers compare as numbers.
    pub values: Vec<Value>,
}

impl MustLiveRule {
    /// A rule: documents whose value at `path` is one of `values` must live.
    pub fn new<V>(path: impl Into<String>, values: impl IntoIterator<Item = V>) -> Self
    where
        V: Into<Value>,
    {
        MustLiveRule {
            path: path.into(),
            values: values.into_iter().map(Into::into).collect(),
        }
    }

    /// Rules as a request carries them (`None` for none, which a create takes as none).
    pub(crate) fn to_wire(rules: &[MustLiveRule]) -> Option<v1::MustLive> {
        (!rules.is_empty()).then(|| Self::to_wire_set(rules))
    }

    /// Rules as a replace carries them: present even when empty (which removes them all).
    pub(crate) fn to_wire_set(rules: &[MustLiveRule]) -> v1::MustLive {
        v1::MustLive {
            rules: rules
                .iter()
                .map(|rule| v1::MustLiveRule {
                    path: rule.path.clone(),
                    values: rule.values.iter().cloned().map(JsonValue::new).collect(),
                })
                .collect(),
        }
    }

    fn from_wire(rule: v1::MustLiveRule) -> Self {
        MustLiveRule {
            path: rule.path,
            values: rule
                .values
                .into_iter()
                .filter_map(|v| v.into_checked().ok())
                .collect(),
        }
    }
}

/// A collection's description.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectionInfo {
    /// Database id.
    pub database: String,
    /// Collection id.
    pub id: String,
    /// Partition key path, e.g. `/customerId`.
    pub partition_key_path: String,
    /// Default TTL.
    pub default_ttl: DefaultTtl,
    /// Indexing mode.
    pub indexing_mode: IndexingMode,
    /// The paths the index covers.
    pub indexing_paths: IndexingPaths,
    /// False while documents may lack entries the paths call for (after the paths changed, or
    /// indexing was turned on): queries then read documents instead of the index.
    pub index_complete: bool,
    /// Kinds of documents that must never expire ([`MustLiveRule`]); empty if none.
    pub must_live: Vec<MustLiveRule>,
    /// How long the change feed keeps events (zero: the collection keeps no feed).
    pub change_feed_retention: Duration,
    /// What it may spend per second, if provisioned.
    pub throughput: Option<Throughput>,
}

/// A provisioned throughput, in request units per second (README, "Request units"), as
/// Cosmos DB has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Throughput {
    /// This many RU/s every second: at least 400, in steps of 100.
    Manual(u32),
    /// Between a tenth of `max` and all of it, as used: `max` at least 1,000, in steps of
    /// 1,000.
    Autoscale { max: u32 },
}

impl Throughput {
    pub(crate) fn to_wire(self) -> v1::Throughput {
        match self {
            Throughput::Manual(ru) => v1::Throughput {
                manual: Some(f64::from(ru)),
                autoscale_max: None,
            },
            Throughput::Autoscale { max } => v1::Throughput {
                manual: None,
                autoscale_max: Some(f64::from(max)),
            },
        }
    }

    fn from_wire(t: v1::Throughput) -> Option<Self> {
        // The server sends whole numbers within u32.
        let whole =
            |v: f64| (v.is_finite() && v >= 0.0 && v <= f64::from(u32::MAX)).then_some(v as u32);
        match (t.manual, t.autoscale_max) {
            (Some(ru), _) => whole(ru).map(Throughput::Manual),
            (None, Some(max)) => whole(max).map(|max| Throughput::Autoscale { max }),
            (None, None) => None,
        }
    }
}

/// What a database or a collection is provisioned (Cosmos DB's `ThroughputProperties`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThroughputProperties {
    /// Its own throughput; `None` if it has none (unlimited, or, for a collection, drawing on
    /// its database's shared throughput: see `shared`).
    pub throughput: Option<Throughput>,
    /// For a collection without throughput of its own: whether it draws on its database's.
    pub shared: bool,
    /// Request units per second provisioned now on the server answering: the manual rate, or
    /// what autoscale scaled to (between a tenth of its maximum and the maximum).
    pub provisioned: Option<u32>,
}

impl ThroughputProperties {
    pub(crate) fn from_proto(p: v1::ThroughputProperties) -> Self {
        ThroughputProperties {
            throughput: p.throughput.and_then(Throughput::from_wire),
            shared: p.shared,
            provisioned: p
                .provisioned
                .filter(|v| v.is_finite() && *v >= 0.0 && *v <= f64::from(u32::MAX))
                .map(|v| v as u32),
        }
    }
}

impl CollectionInfo {
    pub(crate) fn from_proto(c: v1::Collection) -> Self {
        let v1::Collection {
            database,
            id,
            partition_key_path,
            default_ttl,
            indexing_mode,
            indexing_paths,
            index_complete,
            must_live,
            change_feed_retention,
            throughput,
        } = c;
        let paths = indexing_paths.unwrap_or_default();
        CollectionInfo {
            throughput: throughput.and_then(Throughput::from_wire),
            indexing_paths: IndexingPaths {
                included: paths.included_paths,
                excluded: paths.excluded_paths,
            },
            index_complete,
            change_feed_retention: Duration::from_secs(change_feed_retention.max(0) as u64),
            must_live: must_live
                .map(|m| m.rules.into_iter().map(MustLiveRule::from_wire).collect())
                .unwrap_or_default(),
            database,
            id,
            partition_key_path,
            default_ttl: DefaultTtl::from_wire(default_ttl),
            indexing_mode: match v1::IndexingMode::try_from(indexing_mode) {
                Ok(v1::IndexingMode::Lazy) => IndexingMode::Lazy,
                Ok(v1::IndexingMode::None) => IndexingMode::None,
                _ => IndexingMode::Consistent,
            },
        }
    }
}

/// New settings for [`Collection::replace_settings`]. The default TTL is a required argument:
/// as in Cosmos DB, replacing settings decides the TTL state, and forgetting it must not turn
/// TTL off silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectionSettings {
    default_ttl: DefaultTtl,
    indexing_mode: Option<IndexingMode>,
    indexing_paths: Option<IndexingPaths>,
    must_live: Option<Vec<MustLiveRule>>,
    change_feed_retention: Option<Duration>,
}

impl CollectionSettings {
    /// Settings with this default TTL, keeping the current indexing mode.
    ///
    /// ```
    /// use mayfly_client::{CollectionSettings, DefaultTtl};
    /// let settings = CollectionSettings::new(DefaultTtl::Off);
    /// ```
    pub fn new(default_ttl: DefaultTtl) -> Self {
        CollectionSettings {
            default_ttl,
            indexing_mode: None,
            indexing_paths: None,
            must_live: None,
            change_feed_retention: None,
        }
    }

    /// Also changes how long the change feed keeps events (whole seconds, up to 30 days);
    /// `Duration::ZERO` turns the feed off and drops its events. Not called: it stays.
    pub fn change_feed_retention(mut self, retention: Duration) -> Self {
        self.change_feed_retention = Some(retention);
        self
    }

    /// Also replaces the must-live rules with these ([`MustLiveRule`]); an empty list removes
    /// them all. Not called: the current rules stay.
    ///
    /// ```
    /// use mayfly_client::{CollectionSettings, DefaultTtl, MustLiveRule};
    /// let settings = CollectionSettings::new(DefaultTtl::NoDefault)
    ///     .must_live([MustLiveRule::new("/type", ["order"])]);
    /// ```
    pub fn must_live(mut self, rules: impl IntoIterator<Item = MustLiveRule>) -> Self {
        self.must_live = Some(rules.into_iter().collect());
        self
    }

    /// Also changes the indexed paths. Documents indexed under the old paths lack entries the
    /// new ones call for, so queries read documents instead of the index until it is rebuilt.
    ///
    /// ```
    /// use mayfly_client::{CollectionSettings, DefaultTtl, IndexingPaths};
    /// let settings = CollectionSettings::new(DefaultTtl::Off)
    ///     .indexing_paths(IndexingPaths::new(["/*"], ["/blob/*"]));
    /// ```
    pub fn indexing_paths(mut self, paths: IndexingPaths) -> Self {
        self.indexing_paths = Some(paths);
        self
    }

    /// Also changes the indexing mode.
    ///
    /// ```
    /// use mayfly_client::{CollectionSettings, DefaultTtl, IndexingMode};
    /// let settings = CollectionSettings::new(DefaultTtl::Off).indexing_mode(IndexingMode::None);
    /// ```
    pub fn indexing_mode(mut self, mode: IndexingMode) -> Self {
        self.indexing_mode = Some(mode);
        self
    }
}

/// A collection handle: settings, and documents.
#[derive(Clone, Debug)]
pub struct Collection {
    pub(crate) client: Client,
    pub(crate) database: String,
    pub(crate) id: String,
}

/// Serializes a document; it must be a JSON object.
pub(crate) fn to_object<T: Serialize + ?Sized>(doc: &T) -> Result<Map<String, Value>, Error> {
    match serde_json::to_value(doc)? {
        Value::Object(map) => Ok(map),
        other => Err(Error::Serialization(format!(
            "a document must serialize to a JSON object, not {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a bool",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        ))),
    }
}

impl Collection {
    pub(crate) fn new(client: Client, database: String, id: String) -> Self {
        Collection {
            client,
            database,
            id,
        }
    }

    /// The collection id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// assert_eq!(client.database("salesdb").collection("orders").id(), "orders");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Reads the collection's description.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// let orders = db.create_collection("orders", "/customerId").await?;
    /// let info = orders.info().await?;
    /// assert_eq!(info.default_ttl, mayfly_client::DefaultTtl::Off);
    /// # Ok(()) }
    /// ```
    pub async fn info(&self) -> Result<CollectionInfo, Error> {
        let request = GetCollectionRequest {
            database: self.database.clone(),
            id: self.id.clone(),
        };
        let collection = self
            .client
            .call(Call::Idempotent, || {
                let mut collections = self.client.collections.clone();
                let request = request.clone();
                async move { collections.get_collection(request).await }
            })
            .await?;
        Ok(CollectionInfo::from_proto(collection))
    }

    /// Reads the collection's own throughput ([`ThroughputProperties::shared`] if it draws on
    /// its database's).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::Throughput;
    /// let db = client.create_database("salesdb").await?;
    /// let orders = db.create_collection("orders", "/customerId").throughput(Throughput::Manual(400)).await?;
    /// orders.replace_throughput(Throughput::Autoscale { max: 4_000 }).await?;
    /// let now = orders.read_throughput().await?;
    /// assert_eq!(now.throughput, Some(Throughput::Autoscale { max: 4_000 }));
    /// assert_eq!(now.provisioned, Some(400), "idle: a tenth of its maximum");
    /// # Ok(()) }
    /// ```
    pub async fn read_throughput(&self) -> Result<ThroughputProperties, Error> {
        self.client.read_throughput(&self.database, &self.id).await
    }

    /// Replaces the collection's own throughput; its next request is held to it. A
    /// collection drawing on its database's shared throughput has none of its own to replace
    /// ([`Error::InvalidArgument`]): replace the database's.
    pub async fn replace_throughput(
        &self,
        throughput: Throughput,
    ) -> Result<ThroughputProperties, Error> {
        self.client
            .replace_throughput(&self.database, &self.id, throughput)
            .await
    }

    /// Changes the default TTL; it applies at once to every document that inherits it.
    /// Documents already expired stay expired.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// use std::time::Duration;
    /// use mayfly_client::DefaultTtl;
    /// let orders = db.create_collection("orders", "/customerId").await?;
    /// let info = orders.set_default_ttl(DefaultTtl::After(Duration::from_secs(60))).await?;
    /// assert_eq!(info.default_ttl, DefaultTtl::After(Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub async fn set_default_ttl(&self, ttl: DefaultTtl) -> Result<CollectionInfo, Error> {
        self.replace_settings(CollectionSettings::new(ttl)).await
    }

    /// Replaces the collection's settings.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// use mayfly_client::{CollectionSettings, DefaultTtl, IndexingMode};
    /// let orders = db.create_collection("orders", "/customerId").await?;
    /// let info = orders
    ///     .replace_settings(CollectionSettings::new(DefaultTtl::Off).indexing_mode(IndexingMode::Lazy))
    ///     .await?;
    /// assert_eq!(info.indexing_mode, IndexingMode::Lazy);
    /// # Ok(()) }
    /// ```
    pub async fn replace_settings(
        &self,
        settings: CollectionSettings,
    ) -> Result<CollectionInfo, Error> {
        let CollectionSettings {
            default_ttl,
            indexing_mode,
            indexing_paths,
            must_live,
            change_feed_retention,
        } = settings;
        let state = match default_ttl {
            DefaultTtl::Off => DefaultTtlState::Off(()),
            DefaultTtl::NoDefault => DefaultTtlState::Seconds(wire_seconds(None)),
            DefaultTtl::After(d) => DefaultTtlState::Seconds(wire_seconds(Some(d))),
        };
        let request = ReplaceCollectionRequest {
            database: self.database.clone(),
            id: self.id.clone(),
            default_ttl: Some(v1::DefaultTtl { state: Some(state) }),
            indexing_mode: indexing_mode
                .map_or(v1::IndexingMode::Unspecified as i32, IndexingMode::to_wire),
            indexing_paths: indexing_paths.as_ref().map(IndexingPaths::to_wire),
            must_live: must_live.as_deref().map(MustLiveRule::to_wire_set),
            change_feed_retention: change_feed_retention.map(wire_retention),
        };
        let collection = self
            .client
            .call(Call::Write, || {
                let mut collections = self.client.collections.clone();
                let request = request.clone();
                async move { collections.replace_collection(request).await }
            })
            .await?;
        Ok(CollectionInfo::from_proto(collection))
    }

    /// Deletes the collection and its documents.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// let scratch = db.create_collection("scratch", "/k").await?;
    /// scratch.delete().await?;
    /// assert!(db.list_collections().await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self) -> Result<(), Error> {
        let request = DeleteCollectionRequest {
            database: self.database.clone(),
            id: self.id.clone(),
        };
        self.client
            .call(Call::Write, || {
                let mut collections = self.client.collections.clone();
                let request = request.clone();
                async move { collections.delete_collection(request).await }
            })
            .await?;
        Ok(())
    }

    /// Creates a document from any value that serializes to a JSON object with a string `id`
    /// (a typed struct, or `serde_json::json!({...})`). Fails with [`Error::Conflict`] if a
    /// live document has the id in the same partition.
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
    /// let doc = orders
    ///     .create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "total": 42.5}))
    ///     .ttl(DocumentTtl::After(Duration::from_secs(60)))
    ///     .await?;
    /// assert_eq!(doc.body()["ttl"], 60);
    /// assert!(doc.remaining() <= mayfly_client::Lifetime::Remaining(Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub fn create<T: Serialize + ?Sized>(&self, document: &T) -> CreateDocument<'_> {
        CreateDocument::new(self, to_object(document))
    }

    /// Creates or replaces a document; the outcome says which.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// use mayfly_client::UpsertOutcome;
    /// let doc = serde_json::json!({"id": "SO05", "customerId": "CO1"});
    /// assert!(matches!(orders.upsert(&doc).await?, UpsertOutcome::Created(_)));
    /// assert!(matches!(orders.upsert(&doc).await?, UpsertOutcome::Replaced(_)));
    /// # Ok(()) }
    /// ```
    pub fn upsert<T: Serialize + ?Sized>(&self, document: &T) -> UpsertDocument<'_> {
        UpsertDocument::new(self, to_object(document))
    }

    /// Replaces a live document; [`ReplaceOutcome::Missing`] if there is none. Without a
    /// `ttl` (in the body or via `.ttl(...)`) it inherits the collection default again;
    /// `.ttl(DocumentTtl::Keep)` keeps the document's own.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// let v1 = orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1", "n": 1})).await?;
    /// let v2 = orders
    ///     .replace("SO05", "CO1", &serde_json::json!({"id": "SO05", "customerId": "CO1", "n": 2}))
    ///     .if_match(v1.etag())
    ///     .await?;
    /// assert_eq!(v2.into_document().expect("was there").body()["n"], 2);
    /// # Ok(()) }
    /// ```
    pub fn replace<T: Serialize + ?Sized>(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
        document: &T,
    ) -> ReplaceDocument<'_> {
        ReplaceDocument::new(self, id, partition_key.into(), to_object(document))
    }

    /// Reads a live document; `None` if it does not exist or has expired.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// let doc = orders.read("SO05", "CO1").await?.expect("just written");
    /// assert_eq!(doc.id(), "SO05");
    /// assert!(orders.read("SO06", "CO1").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn read(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
    ) -> Result<Option<Document>, Error> {
        let request = ReadDocumentRequest {
            database: self.database.clone(),
            collection: self.id.clone(),
            id: id.to_owned(),
            partition_key: Some(partition_key.into().into_proto()),
        };
        let read = self
            .client
            .call_response(Call::Idempotent, || {
                let mut documents = self.client.documents_for(
                    &request.database,
                    &request.collection,
                    request.partition_key.as_ref(),
                );
                let request = request.clone();
                async move { documents.read_document(request).await }
            })
            .await;
        match read {
            Ok(document) => Ok(Some(Document::from_response(document))),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a live document into a typed value; `None` if it does not exist or has expired.
    /// `T` sees what a query's `SELECT *` returns: the body with `_ts` and `_etag` (see
    /// [`Document::deserialize`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    /// #[serde(rename_all = "camelCase")]
    /// struct Order { id: String, customer_id: String, total: f64 }
    ///
    /// let order = Order { id: "SO05".into(), customer_id: "CO1".into(), total: 42.5 };
    /// orders.create(&order).await?;
    /// assert_eq!(orders.get::<Order>("SO05", "CO1").await?, Some(order));
    /// # Ok(()) }
    /// ```
    pub async fn get<T: DeserializeOwned>(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
    ) -> Result<Option<T>, Error> {
        self.read(id, partition_key)
            .await?
            .map(|d| d.deserialize())
            .transpose()
    }

    /// Reads a live document as an [`Item`]: the typed value with its etag, `_ts`, TTL,
    /// expiry instant and remaining lifetime; `None` if it does not exist or has expired.
    /// The value is the document as a query's `SELECT *` returns it, system properties
    /// included, so fields of `T` renamed `_ts` or `_etag` are filled (see [`Item`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// use mayfly_client::{DocumentTtl, Lifetime};
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// #[serde(rename_all = "camelCase")]
    /// struct Order { id: String, customer_id: String, total: f64 }
    ///
    /// let order = Order { id: "SO05".into(), customer_id: "CO1".into(), total: 42.5 };
    /// orders.create(&order).ttl(DocumentTtl::After(Duration::from_secs(60))).await?;
    /// let item = orders.read_item::<Order>("SO05", "CO1").await?.expect("alive");
    /// assert_eq!(item.value().total, 42.5);
    /// assert!(item.lifetime() <= Lifetime::Remaining(Duration::from_secs(60)));
    /// println!("etag {}, written at {}", item.etag(), item.ts());
    ///
    /// // `T` sees the document as a query's `SELECT *` does: `_ts`, `_etag` and `ttl` included.
    /// #[derive(serde::Deserialize)]
    /// struct Versioned { #[serde(rename = "_ts")] ts: i64, #[serde(rename = "_etag")] etag: String, ttl: i64 }
    /// let read = orders.read_item::<Versioned>("SO05", "CO1").await?.expect("alive");
    /// assert_eq!((read.value().ts, read.value().etag.as_str(), read.value().ttl), (read.ts(), read.etag(), 60));
    /// let query = orders.query::<Versioned>("SELECT * FROM o").await?.collect_all().await?;
    /// assert_eq!((query[0].ts, query[0].etag.as_str()), (read.ts(), read.etag()));
    /// # Ok(()) }
    /// ```
    pub async fn read_item<T: DeserializeOwned>(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
    ) -> Result<Option<Item<T>>, Error> {
        self.read(id, partition_key)
            .await?
            .map(Document::into_item)
            .transpose()
    }

    /// Replaces the document an [`Item`] was read from with its (changed) value, if nobody
    /// wrote it since (`if_match` on the item's etag), keeping the item's TTL (as read, or
    /// as set with [`Item::set_ttl`]). See [`Collection::update`] for the loop around it.
    /// Fields of `T` holding system properties (`_ts`, `_etag`) are sent back and ignored by
    /// the server.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::Error;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Counter { id: String, k: i64, n: i64 }
    /// c.create(&Counter { id: "a".into(), k: 1, n: 0 }).await?;
    /// let mut item = c.read_item::<Counter>("a", 1).await?.expect("there");
    /// item.value_mut().n += 1;
    /// c.replace_item(&item).await?;
    /// let stale = c.replace_item(&item).await.unwrap_err(); // its etag is the old one
    /// assert!(matches!(stale, Error::PreconditionFailed(_)));
    /// # Ok(()) }
    /// ```
    pub async fn replace_item<T: Serialize>(
        &self,
        item: &Item<T>,
    ) -> Result<ReplaceOutcome, Error> {
        let mut body = to_object(item.value())?;
        body.remove("ttl");
        send_replace(
            self,
            item.id(),
            item.partition_key(),
            (
                mayfly_proto::json::JsonObject::new(body),
                item.ttl().to_wire(),
            ),
            (Some(item.etag().to_owned()), None),
        )
        .await
    }

    /// Read-modify-write of one document: reads it as an [`Item`], lets `change` modify it,
    /// and writes it back with `if_match`; if another write landed in between, reads again
    /// and calls `change` again (after a short random backoff, at most 100 times, then
    /// [`Error::PreconditionFailed`]). The document keeps its own TTL unless `change` sets
    /// another with [`Item::set_ttl`]; a `ttl` field of `T` is ignored. `change` gets the
    /// [`Item`]: its value is [`Item::value_mut`]. The outcome says how many conflicts were retried, or that the
    /// document was missing (nothing is written then). The whole document is written from `T`:
    /// give `T` the `id`, the partition key and every property to keep (a
    /// `#[serde(flatten)] rest: serde_json::Map<..>` field keeps the ones it does not name).
    /// For a counter, [`patch`](Self::patch) with `incr` needs no read and no retries.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// use mayfly_client::{DocumentTtl, UpdateOutcome};
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Counter { id: String, k: String, n: i64 }
    /// c.create(&Counter { id: "hits".into(), k: "x".into(), n: 0 })
    ///     .ttl(DocumentTtl::After(Duration::from_secs(60))).await?;
    /// let outcome = c.update::<Counter, _>("hits", "x", |item| item.value_mut().n += 1).await?;
    /// let UpdateOutcome::Updated { item, conflicts } = outcome else { panic!("there") };
    /// assert_eq!((item.value().n, conflicts), (1, 0));
    /// assert_eq!(item.ttl(), DocumentTtl::After(Duration::from_secs(60)), "TTL kept");
    /// let gone = c.update::<Counter, _>("nope", "x", |item| item.value_mut().n += 1).await?;
    /// assert!(matches!(gone, UpdateOutcome::Missing));
    /// # Ok(()) }
    /// ```
    pub async fn update<T, F>(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
        mut change: F,
    ) -> Result<UpdateOutcome<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut Item<T>),
    {
        let partition_key = partition_key.into();
        let mut conflicts = 0;
        loop {
            let Some(mut item) = self.read_item::<T>(id, partition_key.clone()).await? else {
                return Ok(UpdateOutcome::Missing);
            };
            change(&mut item);
            match self.replace_item(&item).await {
                Ok(ReplaceOutcome::Replaced(written)) => {
                    return Ok(UpdateOutcome::Updated {
                        item: written.into_item()?,
                        conflicts,
                    });
                }
                Ok(ReplaceOutcome::Missing) => return Ok(UpdateOutcome::Missing),
                Err(e) if e.reason() == Some(&Reason::EtagMismatch) => {
                    if conflicts == UPDATE_MAX_CONFLICTS {
                        return Err(Error::PreconditionFailed(ErrorDetails::new(
                            tonic::Code::FailedPrecondition,
                            format!(
                                "document '{id}': gave up after {conflicts} conflicting writes"
                            ),
                            Some(Reason::EtagMismatch),
                        )));
                    }
                    conflicts += 1;
                    tokio::time::sleep(conflict_backoff(conflicts)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Restarts a document's TTL clock without resending its body.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use std::time::Duration;
    /// use mayfly_client::{DefaultTtl, TouchOutcome};
    /// let sessions = db.create_collection("sessions", "/user")
    ///     .default_ttl(DefaultTtl::After(Duration::from_secs(1800))).await?;
    /// sessions.create(&serde_json::json!({"id": "s1", "user": "ann"})).await?;
    /// assert!(matches!(sessions.touch("s1", "ann").await?, TouchOutcome::Touched(_)));
    /// assert_eq!(sessions.touch("gone", "ann").await?, TouchOutcome::Missing);
    /// # Ok(()) }
    /// ```
    pub fn touch(&self, id: &str, partition_key: impl Into<PartitionKey>) -> TouchDocument<'_> {
        TouchDocument::new(self, id, partition_key.into())
    }

    /// Deletes a live document.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// use mayfly_client::DeleteOutcome;
    /// orders.create(&serde_json::json!({"id": "SO05", "customerId": "CO1"})).await?;
    /// assert_eq!(orders.delete_document("SO05", "CO1").await?, DeleteOutcome::Deleted);
    /// assert_eq!(orders.delete_document("SO05", "CO1").await?, DeleteOutcome::Missing);
    /// # Ok(()) }
    /// ```
    pub fn delete_document(
        &self,
        id: &str,
        partition_key: impl Into<PartitionKey>,
    ) -> DeleteDocument<'_> {
        DeleteDocument::new(self, id, partition_key.into())
    }

    /// Starts a patch of a live document: add operations (at most 10), then `.await`. The
    /// server applies them as one write (new etag, TTL clock restarted); concurrent patches of
    /// one document all apply, one after the other, so increments from many clients all count
    /// without conflicts to retry. See [`Patch`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let pages = db.create_collection("pages", "/site").await?;
    /// use mayfly_client::PatchOutcome;
    /// pages.create(&serde_json::json!({"id": "home", "site": "a", "views": 0})).await?;
    /// let viewed = pages.patch("home", "a").incr("/views", 1).set("/status", "live").await?;
    /// assert!(matches!(viewed, PatchOutcome::Patched(ref d) if d.body()["views"] == 1));
    /// assert_eq!(pages.patch("gone", "a").incr("/views", 1).await?, PatchOutcome::Missing);
    /// # Ok(()) }
    /// ```
    pub fn patch(&self, id: &str, partition_key: impl Into<PartitionKey>) -> Patch<'_> {
        Patch::new(self, id, partition_key.into())
    }

    /// Starts a transactional batch on the documents of one partition: up to 100 operations,
    /// applied all together or not at all. See [`Batch`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let results = c.batch("k1")
    ///     .create(&serde_json::json!({"id": "a", "k": "k1"}))
    ///     .create(&serde_json::json!({"id": "b", "k": "k1"}))
    ///     .await?;
    /// assert_eq!(results.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn batch(&self, partition_key: impl Into<PartitionKey>) -> Batch<'_> {
        Batch::new(self, partition_key.into())
    }

    /// Streams the collection's live documents page by page.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("salesdb").await?;
    /// # let orders = db.create_collection("orders", "/customerId").await?;
    /// for i in 0..5 {
    ///     orders.create(&serde_json::json!({"id": format!("SO{i}"), "customerId": "CO1"})).await?;
    /// }
    /// let all = orders.read_feed().page_size(2).await?.collect_all().await?;
    /// assert_eq!(all.len(), 5);
    /// # Ok(()) }
    /// ```
    pub fn read_feed(&self) -> ReadFeed<'_> {
        ReadFeed::new(self)
    }

    /// Runs a query in the Azure Cosmos DB for NoSQL SQL dialect; results arrive as `T`
    /// (use `serde_json::Value` for any shape). Await it for [`QueryResults`](crate::QueryResults), a stream of
    /// results that also reads page by page. Parameters ([`Query::param`](crate::Query::param))
    /// must be the ones the query uses: one it does not use is refused, by name. `SELECT *`
    /// returns each document with `_ts` and `_etag`, as [`read_item`](Self::read_item) does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let orders = db.create_collection("orders", "/customer").await?;
    /// use mayfly_client::StreamExt as _;
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: String, total: f64 }
    /// orders.create(&serde_json::json!({"id": "o1", "customer": "ann", "total": 30})).await?;
    /// orders.create(&serde_json::json!({"id": "o2", "customer": "ann", "total": 5})).await?;
    /// let mut big = orders
    ///     .query::<Order>("SELECT * FROM o WHERE o.total >= @min ORDER BY o.total DESC")
    ///     .param("@min", 10)
    ///     .partition_key("ann")
    ///     .await?;
    /// while let Some(order) = big.next().await {
    ///     let order = order?;
    ///     assert_eq!((order.id.as_str(), order.total), ("o1", 30.0));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn query<T>(&self, text: &str) -> Query<'_, T> {
        Query::new(self, text)
    }
}

/// A retention as the wire carries it: whole seconds (a fraction is dropped; the server
/// refuses what is out of range).
pub(crate) fn wire_retention(retention: Duration) -> i64 {
    i64::try_from(retention.as_secs()).unwrap_or(i64::MAX)
}
