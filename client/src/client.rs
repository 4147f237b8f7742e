//! The connection and database handles.

use mayfly_proto::v1::{
    CreateCollectionRequest as CreateCollectionProto, CreateDatabaseRequest, DeleteDatabaseRequest,
    GetDatabaseRequest, ListCollectionsRequest, ListDatabasesRequest,
    client::{CollectionsClient, DatabasesClient, DocumentsClient},
};
use std::{future::IntoFuture, pin::Pin};
use tonic::{
    Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, Endpoint},
};

use crate::{
    collection::{Collection, CollectionInfo, IndexingMode, IndexingPaths},
    error::Error,
    tls::Tls,
    ttl::DefaultTtl,
};

/// Largest message accepted from the server: a 2 MiB JSON document takes several times that
/// as a protobuf Struct.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the service stubs send through: the channel, adding the client's credentials.
pub(crate) type Transport = InterceptedService<Channel, Credentials>;

/// A connection to a Mayfly server. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) databases: DatabasesClient<Transport>,
    pub(crate) collections: CollectionsClient<Transport>,
    pub(crate) documents: DocumentsClient<Transport>,
}

/// The `authorization` metadata every request carries, if any.
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials(Option<MetadataValue<Ascii>>);

impl Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Options for [`Client::builder`]: credentials, TLS.
#[derive(Debug)]
pub struct ClientBuilder {
    address: String,
    credential: Option<String>,
    tls: Option<Tls>,
}

impl ClientBuilder {
    /// Sends an account key (read-write or read-only) with every request. The key of a server
    /// keeping its data on disk is in its data directory, `keys/primary`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let key = "a-key-of-at-least-16-characters".to_owned();
    /// # let server = mayfly_server::RunningServer::start(mayfly_server::Config {
    /// #     auth: mayfly_server::AuthConfig::Given([Some(key.clone()), None, None, None]),
    /// #     ..Default::default()
    /// # }).await?;
    /// # let address = server.local_addr().to_string();
    /// let client = mayfly_client::Client::builder(&address).key(&key).connect().await?;
    /// client.create_database("salesdb").await?;
    ///
    /// let anonymous = mayfly_client::Client::connect(&address).await?;
    /// let refused = anonymous.list_databases().await.unwrap_err();
    /// assert!(matches!(refused, mayfly_client::Error::Unauthenticated(_)));
    /// # Ok(()) }
    /// ```
    pub fn key(mut self, key: &str) -> Self {
        self.credential = Some(key.to_owned());
        self
    }

    /// Sends the key or token in the environment variable `MAYFLY_KEY`, if it is set.
    pub fn key_from_env(self) -> Self {
        match std::env::var("MAYFLY_KEY") {
            Ok(key) => self.key(&key),
            Err(_) => self,
        }
    }

    /// Sends a resource token (minted by `mayfly.v1.Admin/CreateResourceToken` with a
    /// read-write key) with every request.
    pub fn token(self, token: &str) -> Self {
        self.key(token)
    }

    /// Connects over TLS, checking the server's certificate as `tls` says. An address
    /// without a scheme then means `https://`.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use mayfly_client::{Client, Tls};
    ///
    /// let client = Client::builder("db.example.com:7070")
    ///     .tls(Tls::ca_file("ca.pem")?)
    ///     .key_from_env()
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Connects.
    pub async fn connect(self) -> Result<Client, Error> {
        let address = self.address.as_str();
        let uri = match (address.split_once("://"), &self.tls) {
            (None, None) => format!("http://{address}"),
            (None, Some(_)) => format!("https://{address}"),
            (Some(("http", _)), None) | (Some(("https", _)), Some(_)) => address.to_owned(),
            (Some(("https", _)), None) => {
                return Err(Error::InvalidArgument(format!(
                    "{address} asks for TLS: give .tls(Tls::system_roots()) or a CA, so that \
                     the server's certificate is checked"
                )));
            }
            (Some(("http", _)), Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "{address} asks for plaintext but TLS is configured: use https:// or no scheme"
                )));
            }
            (Some((scheme, _)), _) => {
                return Err(Error::InvalidArgument(format!(
                    "bad server address {address:?}: the scheme {scheme:?} is neither http nor https"
                )));
            }
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| Error::InvalidArgument(format!("bad server address {address:?}: {e}")))?
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.config()).map_err(|e| {
                Error::InvalidArgument(format!("TLS settings: {}", with_sources(&e)))
            })?;
        }
        let credentials = match self.credential {
            None => Credentials(None),
            Some(credential) => Credentials(Some(format!("Bearer {credential}").parse().map_err(
                |_| {
                    Error::InvalidArgument(
                        "a key or token is printable ASCII; this one is not".into(),
                    )
                },
            )?)),
        };
        let channel = endpoint.connect().await.map_err(|e| {
            Error::Unavailable(format!("cannot connect to {address}: {}", with_sources(&e)))
        })?;
        Ok(Client::with_credentials(channel, credentials))
    }
}

/// An error and its causes, one after the other: a transport error's own text says little.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Client {
    /// Connects to a server: `"127.0.0.1:7070"` or `"http://127.0.0.1:7070"`, without
    /// credentials (see [`Client::builder`] for a key or token).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// let client = mayfly_client::Client::connect(address).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(address: impl AsRef<str>) -> Result<Self, Error> {
        Self::builder(address).connect().await
    }

    /// A client with options: a key or token, TLS.
    pub fn builder(address: impl AsRef<str>) -> ClientBuilder {
        ClientBuilder {
            address: address.as_ref().to_owned(),
            credential: None,
            tls: None,
        }
    }

    /// Uses an existing tonic channel (for TLS, timeouts, load balancing, ...).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = format!("http://{}", server.local_addr());
    /// let channel = tonic::transport::Endpoint::from_shared(address)?
    ///     .timeout(std::time::Duration::from_secs(5))
    ///     .connect()
    ///     .await?;
    /// let client = mayfly_client::Client::from_channel(channel);
    /// # Ok(()) }
    /// ```
    pub fn from_channel(channel: Channel) -> Self {
        Self::with_credentials(channel, Credentials::default())
    }

    fn with_credentials(channel: Channel, credentials: Credentials) -> Self {
        Client {
            databases: DatabasesClient::with_interceptor(channel.clone(), credentials.clone()),
            collections: CollectionsClient::with_interceptor(channel.clone(), credentials.clone()),
            documents: DocumentsClient::with_interceptor(channel, credentials)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// Creates a database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.create_database("salesdb").await?;
    /// assert_eq!(db.id(), "salesdb");
    /// # Ok(()) }
    /// ```
    pub async fn create_database(&self, id: &str) -> Result<Database, Error> {
        self.databases
            .clone()
            .create_database(CreateDatabaseRequest { id: id.to_owned() })
            .await?;
        Ok(self.database(id))
    }

    /// A handle on a database (no request is made).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.database("salesdb");
    /// assert!(!db.exists().await?);
    /// # Ok(()) }
    /// ```
    pub fn database(&self, id: &str) -> Database {
        Database {
            client: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Ids of every database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// client.create_database("a").await?;
    /// client.create_database("b").await?;
    /// assert_eq!(client.list_databases().await?, ["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub async fn list_databases(&self) -> Result<Vec<String>, Error> {
        let response = self
            .databases
            .clone()
            .list_databases(ListDatabasesRequest {})
            .await?;
        Ok(response
            .into_inner()
            .databases
            .into_iter()
            .map(|d| d.id)
            .collect())
    }
}

/// A database handle.
#[derive(Clone, Debug)]
pub struct Database {
    client: Client,
    id: String,
}

impl Database {
    /// The database id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// assert_eq!(client.database("salesdb").id(), "salesdb");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the database exists.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.create_database("salesdb").await?;
    /// assert!(db.exists().await?);
    /// # Ok(()) }
    /// ```
    pub async fn exists(&self) -> Result<bool, Error> {
        match self
            .client
            .databases
            .clone()
            .get_database(GetDatabaseRequest {
                id: self.id.clone(),
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(status) => match Error::from(status) {
                Error::DatabaseNotFound(_) => Ok(false),
                e => Err(e),
            },
        }
    }

    /// Deletes the database with all its collections and documents.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.create_database("scratch").await?;
    /// db.delete().await?;
    /// assert!(!db.exists().await?);
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self) -> Result<(), Error> {
        self.client
            .databases
            .clone()
            .delete_database(DeleteDatabaseRequest {
                id: self.id.clone(),
            })
            .await?;
        Ok(())
    }

    /// Starts creating a collection partitioned by `partition_key_path` (e.g. `"/customerId"`).
    /// TTL is off unless [`CreateCollection::default_ttl`] says otherwise.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use std::time::Duration;
    /// use mayfly_client::DefaultTtl;
    ///
    /// let db = client.create_database("salesdb").await?;
    /// let orders = db
    ///     .create_collection("orders", "/customerId")
    ///     .default_ttl(DefaultTtl::After(Duration::from_secs(3600)))
    ///     .await?;
    /// assert_eq!(orders.info().await?.default_ttl, DefaultTtl::After(Duration::from_secs(3600)));
    /// # Ok(()) }
    /// ```
    pub fn create_collection(&self, id: &str, partition_key_path: &str) -> CreateCollection<'_> {
        CreateCollection {
            database: self,
            id: id.to_owned(),
            partition_key_path: partition_key_path.to_owned(),
            default_ttl: DefaultTtl::Off,
            indexing_mode: IndexingMode::Consistent,
            indexing_paths: None,
        }
    }

    /// A handle on a collection (no request is made).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # client.create_database("salesdb").await?.create_collection("orders", "/customerId").await?;
    /// let orders = client.database("salesdb").collection("orders");
    /// assert_eq!(orders.info().await?.partition_key_path, "/customerId");
    /// # Ok(()) }
    /// ```
    pub fn collection(&self, id: &str) -> Collection {
        Collection::new(self.client.clone(), self.id.clone(), id.to_owned())
    }

    /// Every collection of the database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.create_database("salesdb").await?;
    /// db.create_collection("orders", "/customerId").await?;
    /// let ids: Vec<String> = db.list_collections().await?.into_iter().map(|c| c.id).collect();
    /// assert_eq!(ids, ["orders"]);
    /// # Ok(()) }
    /// ```
    pub async fn list_collections(&self) -> Result<Vec<CollectionInfo>, Error> {
        let response = self
            .client
            .collections
            .clone()
            .list_collections(ListCollectionsRequest {
                database: self.id.clone(),
            })
            .await?;
        Ok(response
            .into_inner()
            .collections
            .into_iter()
            .map(CollectionInfo::from)
            .collect())
    }
}

/// A collection being created; `.await` it to send.
#[derive(Debug)]
#[must_use = "nothing is created until the request is awaited"]
pub struct CreateCollection<'a> {
    database: &'a Database,
    id: String,
    partition_key_path: String,
    default_ttl: DefaultTtl,
    indexing_mode: IndexingMode,
    indexing_paths: Option<IndexingPaths>,
}

impl CreateCollection<'_> {
    /// The paths to index (everything but `_etag` if not called).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::IndexingPaths;
    /// let logs = db
    ///     .create_collection("logs", "/host")
    ///     .indexing_paths(IndexingPaths::new(["/*"], ["/message/?"]))
    ///     .await?;
    /// let info = logs.info().await?;
    /// assert_eq!(info.indexing_paths.excluded, ["/message/?"]);
    /// # Ok(()) }
    /// ```
    pub fn indexing_paths(mut self, paths: IndexingPaths) -> Self {
        self.indexing_paths = Some(paths);
        self
    }

    /// The collection's default TTL (off if not called).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::DefaultTtl;
    /// // Only documents that carry their own TTL expire:
    /// let events = db.create_collection("events", "/source").default_ttl(DefaultTtl::NoDefault).await?;
    /// # Ok(()) }
    /// ```
    pub fn default_ttl(mut self, ttl: DefaultTtl) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// The indexing mode (consistent if not called).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::{DefaultTtl, Error, IndexingMode};
    /// let err = db
    ///     .create_collection("blobs", "/owner")
    ///     .indexing_mode(IndexingMode::None)
    ///     .default_ttl(DefaultTtl::NoDefault)
    ///     .await
    ///     .unwrap_err();
    /// assert!(matches!(err, Error::InvalidArgument(_)), "TTL needs an index");
    /// # Ok(()) }
    /// ```
    pub fn indexing_mode(mut self, mode: IndexingMode) -> Self {
        self.indexing_mode = mode;
        self
    }
}

impl<'a> IntoFuture for CreateCollection<'a> {
    type Output = Result<Collection, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let CreateCollection {
                database,
                id,
                partition_key_path,
                default_ttl,
                indexing_mode,
                indexing_paths,
            } = self;
            let request = CreateCollectionProto {
                database: database.id.clone(),
                id: id.clone(),
                partition_key_path,
                default_ttl: default_ttl.to_wire(),
                indexing_mode: indexing_mode.to_wire(),
                indexing_paths: indexing_paths.as_ref().map(IndexingPaths::to_wire),
            };
            database
                .client
                .collections
                .clone()
                .create_collection(request)
                .await?;
            Ok(database.collection(&id))
        })
    }
}
