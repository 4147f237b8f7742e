//! The connection and database handles.

use mayfly_proto::v1::{
    CreateCollectionRequest as CreateCollectionProto, CreateDatabaseRequest, DeleteDatabaseRequest,
    GetDatabaseRequest, ListCollectionsRequest, ListDatabasesRequest, ReadThroughputRequest,
    ReplaceThroughputRequest,
    client::{CollectionsClient, DatabasesClient, DocumentsClient},
};
use std::{future::IntoFuture, io, pin::Pin, sync::Arc, time::Duration};
use tonic::{
    Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use crate::{
    PartitionKey,
    collection::{
        Collection, CollectionInfo, IndexingMode, IndexingPaths, MustLiveRule, Throughput,
        ThroughputProperties, wire_retention,
    },
    error::{Error, ErrorDetails, Reason},
    retry::RetryPolicy,
    routing::{Connector, Router},
    tls::Tls,
    ttl::DefaultTtl,
};

/// Largest message accepted from the server: a 2 MiB JSON document takes several times that
/// as a protobuf Struct.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the service stubs send through: the channel, adding the client's credentials.
pub(crate) type Transport = InterceptedService<Channel, Credentials>;

/// A connection to a Mayfly server. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) databases: DatabasesClient<Transport>,
    pub(crate) collections: CollectionsClient<Transport>,
    pub(crate) documents: DocumentsClient<Transport>,
    settings: Arc<Settings>,
    /// In a cluster: sends requests that name their partition to its owner.
    router: Option<Router>,
}

/// What every request of a client shares.
#[derive(Debug)]
struct Settings {
    /// The address as given, to name in errors.
    address: String,
    request_timeout: Option<Duration>,
    retry: RetryPolicy,
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

/// Options for [`Client::builder`]: credentials, TLS, timeouts, keepalive, retries.
///
/// Defaults: connect timeout 5 s, request timeout 30 s, HTTP/2 keepalive pings every 30 s
/// (also while idle) answered within 10 s, [`RetryPolicy::default`] (3 attempts for reads).
///
/// ```
/// use std::time::Duration;
/// let builder = mayfly_client::Client::builder("127.0.0.1:7070")
///     .key("a-key-of-at-least-16-characters")
///     .request_timeout(Duration::from_secs(5));
/// assert!(!format!("{builder:?}").contains("a-key-of"), "the key is not printed");
/// ```
pub struct ClientBuilder {
    address: String,
    credential: Option<String>,
    tls: Option<Tls>,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    retry: RetryPolicy,
    route_to_owners: bool,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key or token stays out of logs.
        f.debug_struct("ClientBuilder")
            .field("address", &self.address)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("retry", &self.retry)
            .field("route_to_owners", &self.route_to_owners)
            .finish()
    }
}

/// The environment variable [`ClientBuilder::key_from_env`] reads.
const KEY_VARIABLE: &str = "MAYFLY_KEY";

/// The key in [`KEY_VARIABLE`]; `None` if it is unset or empty.
fn key_in_env() -> Result<Option<String>, Error> {
    match std::env::var(KEY_VARIABLE) {
        Ok(key) if key.is_empty() => Ok(None),
        Ok(key) => Ok(Some(key)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid(
            format!("{KEY_VARIABLE} is set but not Unicode: a key or token is printable ASCII"),
            Some(Reason::InvalidCredentials),
        )),
    }
}

/// Default limit on establishing a connection (TCP, then TLS).
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default limit on one request (each page of a feed or query counts as one).
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default HTTP/2 keepalive: a ping this often ...
const DEFAULT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ... that must be answered this fast, or the connection is taken as dead.
const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Sends the key or token in the environment variable `MAYFLY_KEY`. If it is not set (or
    /// empty, or not Unicode), fails at once with [`Error::InvalidArgument`] (reason
    /// [`Reason::MissingCredentials`]) naming the variable and how to set it, rather than
    /// connecting without a key and being refused as unauthenticated later. For a server
    /// that may or may not need a key, [`key_from_env_if_set`](Self::key_from_env_if_set).
    ///
    /// ```
    /// # // SAFETY: each doctest runs in a process of its own, with no other thread yet.
    /// # unsafe { std::env::remove_var("MAYFLY_KEY") };
    /// let err = mayfly_client::Client::builder("127.0.0.1:7070").key_from_env().unwrap_err();
    /// assert!(err.to_string().contains("MAYFLY_KEY is not set"), "{err}");
    /// ```
    pub fn key_from_env(self) -> Result<Self, Error> {
        match key_in_env()? {
            Some(key) => Ok(self.key(&key)),
            None => Err(Error::invalid(
                format!(
                    "{KEY_VARIABLE} is not set: key_from_env() sends the key in it; set it to the \
                     server's key or a resource token (the key of a server keeping its data on \
                     disk is in its data directory: export {KEY_VARIABLE}=$(cat \
                     mayfly-data/keys/primary)), or use key_from_env_if_set() for a server \
                     that needs no key"
                ),
                Some(Reason::MissingCredentials),
            )),
        }
    }

    /// Sends the key or token in the environment variable `MAYFLY_KEY` if it is set (and not
    /// empty), and no key otherwise: for a program that talks to servers with and without
    /// keys (a server keeping its data in memory, on loopback, needs none). A variable that
    /// is set but not Unicode is an error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// let client = mayfly_client::Client::builder(&address).key_from_env_if_set()?.connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn key_from_env_if_set(self) -> Result<Self, Error> {
        Ok(match key_in_env()? {
            Some(key) => self.key(&key),
            None => self,
        })
    }

    /// Sends a resource token (minted by `mayfly.v1.Admin/CreateResourceToken` with a
    /// read-write key) with every request.
    pub fn token(self, token: &str) -> Self {
        self.key(token)
    }

    /// Connects over TLS, checking the server's certificate as `tls` says. An address
    /// without a scheme then means `https://`; an `https://` address without TLS configured
    /// is refused (rather than sent in plaintext).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use mayfly_client::{Client, Tls};
    ///
    /// let client = Client::builder("db.example.com:7070")
    ///     .tls(Tls::ca_file("ca.pem")?)
    ///     .key_from_env()?
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The longest [`connect`](Self::connect) may take, TCP and TLS handshakes included; 5 s
    /// by default. A lazy client's first request, or any request after the connection
    /// dropped, connects too: there this limit covers the TCP connect, and the request
    /// timeout the rest.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// use std::time::Duration;
    /// let client = mayfly_client::Client::builder(&address)
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest the client waits for the answer to one request, retries not counted
    /// (each attempt has its own); 30 s by default. Each page of a feed or query counts as
    /// one request. Past it the request fails with [`Error::Timeout`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// use std::time::Duration;
    /// let client = mayfly_client::Client::builder(&address)
    ///     .request_timeout(Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// client.list_databases().await?;
    /// # Ok(()) }
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// No request timeout: a request waits for its answer as long as the connection lives
    /// (HTTP/2 keepalive still detects a dead one).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// let client = mayfly_client::Client::builder(&address).no_request_timeout().connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn no_request_timeout(mut self) -> Self {
        self.request_timeout = None;
        self
    }

    /// HTTP/2 keepalive: a ping every `interval`, even without requests in flight, which the
    /// server must answer within `timeout` or the connection is closed (and requests on it
    /// fail with [`Error::Unavailable`]). 30 s and 10 s by default.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// use std::time::Duration;
    /// let client = mayfly_client::Client::builder(&address)
    ///     .keep_alive(Duration::from_secs(10), Duration::from_secs(5))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// No HTTP/2 keepalive pings.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// let client = mayfly_client::Client::builder(&address).no_keep_alive().connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn no_keep_alive(mut self) -> Self {
        self.keep_alive = None;
        self
    }

    /// How failed requests are sent again; [`RetryPolicy::default`] if not called.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// use std::time::Duration;
    /// use mayfly_client::{Client, RetryPolicy};
    /// let client = Client::builder(&address)
    ///     .retry(RetryPolicy::default().max_attempts(5).base_delay(Duration::from_millis(20)))
    ///     .connect()
    ///     .await?;
    /// let no_retries = Client::builder(&address).retry(RetryPolicy::none()).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// In a cluster, whether requests that name their partition key (reads, replaces, deletes,
    /// patches, batches, and writes given a key) go straight to the node that owns the
    /// partition, by the partition map the client fetches from its server in the background
    /// (and again every 10 s, or after a request fails as one to a moved partition would). On
    /// by default; off, every request goes to the address given, which forwards it (one more
    /// hop). A single server is unaffected either way. Turn it off where the nodes' advertised
    /// addresses cannot be reached from the client (behind a load balancer, say).
    ///
    /// ```
    /// let builder = mayfly_client::Client::builder("127.0.0.1:7070").route_to_owners(false);
    /// ```
    pub fn route_to_owners(mut self, route: bool) -> Self {
        self.route_to_owners = route;
        self
    }

    /// Connects, failing with [`Error::Connect`] (naming the address and the cause) if the
    /// server cannot be reached within the connect timeout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let err = mayfly_client::Client::builder("127.0.0.1:1").connect().await.unwrap_err();
    /// assert!(err.to_string().starts_with("cannot connect to 127.0.0.1:1: "), "{err}");
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<Client, Error> {
        let limit = self.connect_timeout;
        let (endpoint, credentials, settings, connector) = self.prepare()?;
        // The endpoint's own timeout covers the TCP connect only; this one the TLS and HTTP/2
        // handshakes too (a server that accepts and never answers a ClientHello).
        let channel = match tokio::time::timeout(limit, endpoint.connect()).await {
            Ok(connected) => connected.map_err(|e| Error::connect(&settings.address, &e))?,
            Err(_) => {
                let cause = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {limit:?} (the connect timeout)"),
                );
                return Err(Error::connect(&settings.address, &cause));
            }
        };
        Ok(Client::with_credentials(
            channel,
            credentials,
            settings,
            connector,
        ))
    }

    /// A client that connects on its first request (and again after the connection drops),
    /// so that building it needs no server. Address and TLS settings are checked at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = mayfly_client::Client::builder("127.0.0.1:1").connect_lazy()?;
    /// let err = client.list_databases().await.unwrap_err(); // nobody there
    /// assert!(matches!(err, mayfly_client::Error::Connect { .. }), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn connect_lazy(self) -> Result<Client, Error> {
        let (endpoint, credentials, settings, connector) = self.prepare()?;
        Ok(Client::with_credentials(
            endpoint.connect_lazy(),
            credentials,
            settings,
            connector,
        ))
    }

    /// The endpoint, credentials and settings, and (when routing) how to reach other nodes
    /// the same way.
    fn prepare(self) -> Result<(Endpoint, Credentials, Settings, Option<Nodes>), Error> {
        let address = self.address.as_str();
        let uri = match (address.split_once("://"), &self.tls) {
            (None, None) => format!("http://{address}"),
            (None, Some(_)) => format!("https://{address}"),
            (Some(("http", _)), None) | (Some(("https", _)), Some(_)) => address.to_owned(),
            (Some(("https", _)), None) => {
                return Err(Error::invalid(
                    format!(
                        "{address} asks for TLS: give .tls(Tls::system_roots()) or a CA, so \
                         that the server's certificate is checked"
                    ),
                    None,
                ));
            }
            (Some(("http", _)), Some(_)) => {
                return Err(Error::invalid(
                    format!(
                        "{address} asks for plaintext but TLS is configured: use https:// or \
                         no scheme"
                    ),
                    None,
                ));
            }
            (Some((scheme, _)), _) => {
                return Err(Error::invalid(
                    format!(
                        "bad server address {address:?}: the scheme {scheme:?} is neither \
                         http nor https"
                    ),
                    None,
                ));
            }
        };
        // An address that does not parse (a port above 65535, say) cannot be connected to:
        // reported like any other connect failure, with the address and why.
        let options = EndpointOptions {
            tls: self.tls.as_ref().map(Tls::config),
            connect_timeout: self.connect_timeout,
            keep_alive: self.keep_alive,
        };
        let endpoint = options.endpoint(uri).map_err(|e| match e {
            EndpointError::Address(e) => {
                let cause = io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not a valid server address: {e}"),
                );
                Error::connect(address, &cause)
            }
            EndpointError::Tls(e) => Error::invalid(format!("TLS settings: {e}"), None),
        })?;
        let credentials = match self.credential {
            None => Credentials(None),
            Some(credential) => {
                let mut value: MetadataValue<Ascii> =
                    format!("Bearer {credential}").parse().map_err(|_| {
                        Error::invalid("a key or token is printable ASCII; this one is not", None)
                    })?;
                // Kept out of HPACK's table and out of debug output.
                value.set_sensitive(true);
                Credentials(Some(value))
            }
        };
        let settings = Settings {
            address: self.address,
            request_timeout: self.request_timeout,
            retry: self.retry,
        };
        let nodes = self.route_to_owners.then(|| {
            let tls = options.tls.is_some();
            let connector: Connector = Arc::new(move |address: &str| {
                options
                    .endpoint(address.to_owned())
                    .ok()
                    .map(|e| e.connect_lazy())
            });
            Nodes { connector, tls }
        });
        Ok((endpoint, credentials, settings, nodes))
    }
}

/// How the client reaches the cluster's other nodes, when it routes to them.
struct Nodes {
    connector: Connector,
    tls: bool,
}

/// What every connection of a client is made with.
struct EndpointOptions {
    tls: Option<ClientTlsConfig>,
    connect_timeout: Duration,
    keep_alive: Option<(Duration, Duration)>,
}

enum EndpointError {
    Address(String),
    Tls(String),
}

impl EndpointOptions {
    fn endpoint(&self, uri: String) -> Result<Endpoint, EndpointError> {
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| EndpointError::Address(e.to_string()))?
            .tcp_nodelay(true)
            .connect_timeout(self.connect_timeout);
        if let Some((interval, timeout)) = self.keep_alive {
            endpoint = endpoint
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true);
        }
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| EndpointError::Tls(with_sources(&e)))?;
        }
        Ok(endpoint)
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

/// Whether a request may be sent twice (see [`RetryPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// Sending it twice has the effect of sending it once: reads, and a few writes.
    Idempotent,
    /// Sent again after a failure that may have come after it applied only with
    /// [`RetryPolicy::retry_writes`] (create, upsert, replace without `if_match`).
    Write,
    /// Sent again only after failures that guarantee nothing was applied: a second try
    /// could apply it twice (a patch `incr`, a batch) or report its own first try as a
    /// conflict (any write with `if_match`, which `update` would then apply again).
    Once,
    /// A write with an idempotency key: the server applies it at most once, so it is sent
    /// again after any failure a retry could mend, a timeout included.
    Keyed,
}

impl Call {
    /// [`Call::Keyed`] if the write has an idempotency key, else this.
    pub(crate) fn keyed(self, key: &Option<String>) -> Call {
        match key {
            Some(_) => Call::Keyed,
            None => self,
        }
    }
}

impl Client {
    /// Sends a request through `send` (called once per attempt) under the request timeout,
    /// retrying as the policy says.
    pub(crate) async fn call<R, F, Fut>(&self, call: Call, send: F) -> Result<R, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.call_response(call, send)
            .await
            .map(tonic::Response::into_inner)
    }

    /// [`Self::call`], keeping the response's metadata.
    pub(crate) async fn call_response<R, F, Fut>(
        &self,
        call: Call,
        mut send: F,
    ) -> Result<tonic::Response<R>, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let settings = &*self.settings;
        let mut attempt = 1;
        let (mut throttled, mut waited) = (0, Duration::ZERO);
        loop {
            let outcome = match settings.request_timeout {
                Some(limit) => match tokio::time::timeout(limit, send()).await {
                    Ok(answer) => answer.map_err(|s| self.error(s)),
                    Err(_) => Err(Error::timeout(limit)),
                },
                None => send().await.map_err(|s| self.error(s)),
            };
            if let (Err(e), Some(router)) = (&outcome, &self.router)
                && matches!(
                    e,
                    Error::Unavailable(_) | Error::Connect { .. } | Error::Timeout(_)
                )
            {
                // Perhaps sent to a node that lost the partition, or died: the map is
                // fetched again before requests are routed by it.
                router.suspect();
                // Not connected at all (nothing was sent): if it was routed, to an address
                // perhaps unreachable from here, sent again at once to the client's server.
                if matches!(e, Error::Connect { .. }) && router.pause() {
                    continue;
                }
            }
            if let Err(e) = &outcome
                && let Some(delay) = settings.retry.throttled_delay(e, throttled, waited)
            {
                // Throttled: nothing was applied; sent again after the server's delay.
                tokio::time::sleep(delay).await;
                throttled += 1;
                waited += delay;
                continue;
            }
            match outcome {
                Ok(response) => return Ok(response),
                Err(e) if settings.retry.may_retry(call, &e, attempt) => {
                    tokio::time::sleep(settings.retry.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Where to send a request for `partition_key`'s partition of `database`/`collection`: its
    /// owner, when the client routes and knows it, else the client's server (a request without
    /// a partition key, the server's to find from the body, goes there too).
    pub(crate) fn documents_for(
        &self,
        database: &str,
        collection: &str,
        partition_key: Option<&mayfly_proto::v1::PartitionKey>,
    ) -> DocumentsClient<Transport> {
        self.router
            .as_ref()
            .zip(partition_key)
            .and_then(|(router, pk)| {
                let pk = PartitionKey::from_proto(Some(pk.clone()));
                router.documents_for(database, collection, &pk)
            })
            .unwrap_or_else(|| self.documents.clone())
    }

    /// A status from this client's server as an [`Error`].
    pub(crate) fn error(&self, status: Status) -> Error {
        Error::from_status(status, &self.settings.address)
    }

    /// The request timeout, if any.
    pub(crate) fn request_timeout(&self) -> Option<Duration> {
        self.settings.request_timeout
    }
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

    /// A client with options: a key or token, TLS, timeouts, keepalive, retries (see
    /// [`ClientBuilder`] for the defaults).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let address = server.local_addr().to_string();
    /// use std::time::Duration;
    /// let client = mayfly_client::Client::builder(&address)
    ///     .request_timeout(Duration::from_secs(2))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(address: impl AsRef<str>) -> ClientBuilder {
        ClientBuilder {
            address: address.as_ref().to_owned(),
            credential: None,
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            keep_alive: Some((DEFAULT_KEEP_ALIVE_INTERVAL, DEFAULT_KEEP_ALIVE_TIMEOUT)),
            retry: RetryPolicy::default(),
            route_to_owners: true,
        }
    }

    /// The same client (sharing its connection) retrying by `policy` instead: e.g. one that
    /// hands throttled requests back, for a caller that handles them itself.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use std::time::Duration;
    /// use mayfly_client::RetryPolicy;
    /// let own_backoff = client.with_retry(RetryPolicy::default().throttle_retries(0, Duration::ZERO));
    /// # let _ = own_backoff;
    /// # Ok(()) }
    /// ```
    pub fn with_retry(&self, policy: RetryPolicy) -> Client {
        Client {
            settings: Arc::new(Settings {
                address: self.settings.address.clone(),
                request_timeout: self.settings.request_timeout,
                retry: policy,
            }),
            ..self.clone()
        }
    }

    fn with_credentials(
        channel: Channel,
        credentials: Credentials,
        settings: Settings,
        nodes: Option<Nodes>,
    ) -> Self {
        let router = nodes.map(|nodes| {
            Router::new(
                channel.clone(),
                credentials.clone(),
                nodes.connector,
                nodes.tls,
            )
        });
        Client {
            router,
            settings: Arc::new(settings),
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
        self.create_database_with(id, None).await
    }

    /// Creates a database whose collections share `throughput` (Cosmos DB's database-level
    /// `OfferThroughput`): every collection created in it without a throughput of its own
    /// draws on it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::Throughput;
    /// let db = client.create_database_with_throughput("shared", Throughput::Manual(1_000)).await?;
    /// let sessions = db.create_collection("sessions", "/user").await?;
    /// assert!(sessions.read_throughput().await?.shared);
    /// assert_eq!(db.read_throughput().await?.throughput, Some(Throughput::Manual(1_000)));
    /// # Ok(()) }
    /// ```
    pub async fn create_database_with_throughput(
        &self,
        id: &str,
        throughput: Throughput,
    ) -> Result<Database, Error> {
        self.create_database_with(id, Some(throughput)).await
    }

    async fn create_database_with(
        &self,
        id: &str,
        throughput: Option<Throughput>,
    ) -> Result<Database, Error> {
        let request = CreateDatabaseRequest {
            id: id.to_owned(),
            throughput: throughput.map(Throughput::to_wire),
        };
        self.call(Call::Write, || {
            let mut databases = self.databases.clone();
            let request = request.clone();
            async move { databases.create_database(request).await }
        })
        .await?;
        Ok(self.database(id))
    }

    /// Creates a database unless one with the id exists: [`Ensured::Created`] or
    /// [`Ensured::Existing`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::Ensured;
    /// assert!(matches!(client.create_database_if_not_exists("app").await?, Ensured::Created(_)));
    /// let db = client.create_database_if_not_exists("app").await?;
    /// assert!(matches!(db, Ensured::Existing(_, ())));
    /// assert_eq!(db.into_inner().id(), "app");
    /// # Ok(()) }
    /// ```
    pub async fn create_database_if_not_exists(
        &self,
        id: &str,
    ) -> Result<Ensured<Database>, Error> {
        match self.create_database(id).await {
            Ok(db) => Ok(Ensured::Created(db)),
            Err(e) if e.reason() == Some(&Reason::DatabaseExists) => {
                Ok(Ensured::Existing(self.database(id), ()))
            }
            Err(e) => Err(e),
        }
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
            .call(Call::Idempotent, || {
                let mut databases = self.databases.clone();
                async move { databases.list_databases(ListDatabasesRequest {}).await }
            })
            .await?;
        Ok(response.databases.into_iter().map(|d| d.id).collect())
    }
}

impl Client {
    /// `ReadThroughput` of a database (`collection` empty) or a collection.
    pub(crate) async fn read_throughput(
        &self,
        database: &str,
        collection: &str,
    ) -> Result<ThroughputProperties, Error> {
        let request = ReadThroughputRequest {
            database: database.to_owned(),
            collection: collection.to_owned(),
        };
        let properties = self
            .call(Call::Idempotent, || {
                let mut databases = self.databases.clone();
                let request = request.clone();
                async move { databases.read_throughput(request).await }
            })
            .await?;
        Ok(ThroughputProperties::from_proto(properties))
    }

    /// `ReplaceThroughput` of a database (`collection` empty) or a collection. Setting a
    /// value is idempotent: sent again, it sets the same.
    pub(crate) async fn replace_throughput(
        &self,
        database: &str,
        collection: &str,
        throughput: Throughput,
    ) -> Result<ThroughputProperties, Error> {
        let request = ReplaceThroughputRequest {
            database: database.to_owned(),
            collection: collection.to_owned(),
            throughput: Some(throughput.to_wire()),
        };
        let properties = self
            .call(Call::Idempotent, || {
                let mut databases = self.databases.clone();
                let request = request.clone();
                async move { databases.replace_throughput(request).await }
            })
            .await?;
        Ok(ThroughputProperties::from_proto(properties))
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
        let request = GetDatabaseRequest {
            id: self.id.clone(),
        };
        let found = self
            .client
            .call(Call::Idempotent, || {
                let mut databases = self.client.databases.clone();
                let request = request.clone();
                async move { databases.get_database(request).await }
            })
            .await;
        match found {
            Ok(_) => Ok(true),
            Err(Error::DatabaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
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
        let request = DeleteDatabaseRequest {
            id: self.id.clone(),
        };
        self.client
            .call(Call::Write, || {
                let mut databases = self.client.databases.clone();
                let request = request.clone();
                async move { databases.delete_database(request).await }
            })
            .await?;
        Ok(())
    }

    /// Reads the throughput the database shares among its collections (`None` if it has
    /// none).
    pub async fn read_throughput(&self) -> Result<ThroughputProperties, Error> {
        self.client.read_throughput(&self.id, "").await
    }

    /// Replaces the throughput the database shares among its collections, or gives it one;
    /// the collections drawing on it are held to it from their next request.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use mayfly_client::Throughput;
    /// let db = client.create_database_with_throughput("shared", Throughput::Manual(1_000)).await?;
    /// let now = db.replace_throughput(Throughput::Manual(2_000)).await?;
    /// assert_eq!((now.throughput, now.provisioned), (Some(Throughput::Manual(2_000)), Some(2_000)));
    /// # Ok(()) }
    /// ```
    pub async fn replace_throughput(
        &self,
        throughput: Throughput,
    ) -> Result<ThroughputProperties, Error> {
        self.client
            .replace_throughput(&self.id, "", throughput)
            .await
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
            must_live: Vec::new(),
            change_feed_retention: None,
            throughput: None,
        }
    }

    /// Creates a collection unless one with the id exists: [`Ensured::Created`] or
    /// [`Ensured::Existing`]. Settings given to the builder apply only when it is created; an
    /// existing collection keeps its own, except that one partitioned by another path is an
    /// error ([`Error::Conflict`] with [`Reason::CollectionExists`]): its documents would be
    /// addressed by another value. The database must exist.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// use std::time::Duration;
    /// use mayfly_client::{DefaultTtl, Ensured};
    /// let db = client.create_database_if_not_exists("app").await?.into_inner();
    /// let sessions = db
    ///     .create_collection_if_not_exists("sessions", "/user")
    ///     .default_ttl(DefaultTtl::After(Duration::from_secs(1800)))
    ///     .await?;
    /// assert!(matches!(sessions, Ensured::Created(_)));
    /// let again = db.create_collection_if_not_exists("sessions", "/user").await?;
    /// let Ensured::Existing(sessions, settings) = again else { panic!("exists") };
    /// assert_eq!(settings.default_ttl, DefaultTtl::After(Duration::from_secs(1800)));
    ///
    /// let err = db.create_collection_if_not_exists("sessions", "/tenant").await.unwrap_err();
    /// assert_eq!(err.reason(), Some(&mayfly_client::Reason::CollectionExists));
    /// # Ok(()) }
    /// ```
    pub fn create_collection_if_not_exists(
        &self,
        id: &str,
        partition_key_path: &str,
    ) -> EnsureCollection<'_> {
        EnsureCollection(self.create_collection(id, partition_key_path))
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
        let request = ListCollectionsRequest {
            database: self.id.clone(),
        };
        let response = self
            .client
            .call(Call::Idempotent, || {
                let mut collections = self.client.collections.clone();
                let request = request.clone();
                async move { collections.list_collections(request).await }
            })
            .await?;
        Ok(response
            .collections
            .into_iter()
            .map(CollectionInfo::from_proto)
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
    must_live: Vec<MustLiveRule>,
    change_feed_retention: Option<Duration>,
    throughput: Option<Throughput>,
}

impl CreateCollection<'_> {
    /// What the collection may spend per second, in request units (Cosmos DB's
    /// `OfferThroughput`; unlimited if not called). A request past it is throttled
    /// ([`Reason::RequestRateTooLarge`](crate::Reason::RequestRateTooLarge)), which the client
    /// retries after the server's delay ([`RetryPolicy::throttle_retries`](crate::RetryPolicy::throttle_retries)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::Throughput;
    /// let sessions = db.create_collection("sessions", "/user").throughput(Throughput::Manual(20_000)).await?;
    /// assert_eq!(sessions.info().await?.throughput, Some(Throughput::Manual(20_000)));
    /// # Ok(()) }
    /// ```
    pub fn throughput(mut self, throughput: Throughput) -> Self {
        self.throughput = Some(throughput);
        self
    }

    /// How long the collection's change feed keeps events (whole seconds, up to 30 days; a day
    /// if not called). `Duration::ZERO`: the collection keeps no change feed, and its writes
    /// skip the cost of one.
    pub fn change_feed_retention(mut self, retention: Duration) -> Self {
        self.change_feed_retention = Some(retention);
        self
    }

    /// Documents that must never expire: a write storing one without `"ttl": -1`
    /// ([`DocumentTtl::Never`](crate::DocumentTtl::Never)) is refused with
    /// [`Reason::MustLive`](crate::Reason::MustLive). Call it once per rule. For a collection
    /// where short-lived documents sit beside ones that must stay, such as carts beside orders:
    /// forgetting `.ttl(DocumentTtl::Never)` on an order is then an error, not a lost order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("shop").await?;
    /// use std::time::Duration;
    /// use mayfly_client::{DefaultTtl, DocumentTtl, MustLiveRule, Reason};
    /// use serde_json::json;
    /// let shop = db
    ///     .create_collection("shop", "/customer")
    ///     .default_ttl(DefaultTtl::After(Duration::from_secs(3600)))
    ///     .must_live(MustLiveRule::new("/type", ["order"]))
    ///     .await?;
    /// let order = json!({"id": "o1", "customer": "ann", "type": "order"});
    /// let err = shop.create(&order).await.unwrap_err();
    /// assert_eq!(err.reason(), Some(&Reason::MustLive));
    /// shop.create(&order).ttl(DocumentTtl::Never).await?;
    /// # Ok(()) }
    /// ```
    pub fn must_live(mut self, rule: MustLiveRule) -> Self {
        self.must_live.push(rule);
        self
    }

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
                must_live,
                change_feed_retention,
                throughput,
            } = self;
            let request = CreateCollectionProto {
                throughput: throughput.map(Throughput::to_wire),
                change_feed_retention: change_feed_retention.map(wire_retention),
                database: database.id.clone(),
                id: id.clone(),
                partition_key_path,
                default_ttl: default_ttl.to_wire(),
                indexing_mode: indexing_mode.to_wire(),
                indexing_paths: indexing_paths.as_ref().map(IndexingPaths::to_wire),
                must_live: MustLiveRule::to_wire(&must_live),
            };
            database
                .client
                .call(Call::Write, || {
                    let mut collections = database.client.collections.clone();
                    let request = request.clone();
                    async move { collections.create_collection(request).await }
                })
                .await?;
            Ok(database.collection(&id))
        })
    }
}

/// The outcome of `create_*_if_not_exists`: `S` is what was found of an existing one's
/// settings (a [`CollectionInfo`] for a collection, nothing for a database).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// use mayfly_client::Ensured;
/// let first = client.create_database_if_not_exists("app").await?;
/// assert!(first.is_created());
/// let again = client.create_database_if_not_exists("app").await?;
/// assert!(matches!(again, Ensured::Existing(_, ())));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub enum Ensured<T, S = ()> {
    /// It did not exist, and was created with the settings given.
    Created(T),
    /// It existed already, with these settings.
    Existing(T, S),
}

impl<T, S> Ensured<T, S> {
    /// The database or collection, created or not.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// let db = client.create_database_if_not_exists("app").await?.into_inner();
    /// assert!(db.exists().await?);
    /// # Ok(()) }
    /// ```
    pub fn into_inner(self) -> T {
        match self {
            Ensured::Created(t) | Ensured::Existing(t, _) => t,
        }
    }

    /// Whether it was created by this call.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// assert!(client.create_database_if_not_exists("app").await?.is_created());
    /// assert!(!client.create_database_if_not_exists("app").await?.is_created());
    /// # Ok(()) }
    /// ```
    pub fn is_created(&self) -> bool {
        matches!(self, Ensured::Created(_))
    }
}

/// A collection being created unless it exists; see
/// [`Database::create_collection_if_not_exists`]. `.await` it to send.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// use std::time::Duration;
/// use mayfly_client::DefaultTtl;
/// let db = client.create_database("app").await?;
/// let sessions = db.create_collection_if_not_exists("sessions", "/user")
///     .default_ttl(DefaultTtl::After(Duration::from_secs(1800)))
///     .await?
///     .into_inner();
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "nothing is created until the request is awaited"]
pub struct EnsureCollection<'a>(CreateCollection<'a>);

impl EnsureCollection<'_> {
    /// The default TTL if it is created ([`CreateCollection::default_ttl`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::DefaultTtl;
    /// db.create_collection_if_not_exists("events", "/source").default_ttl(DefaultTtl::NoDefault).await?;
    /// # Ok(()) }
    /// ```
    pub fn default_ttl(self, ttl: DefaultTtl) -> Self {
        EnsureCollection(self.0.default_ttl(ttl))
    }

    /// The indexing mode if it is created ([`CreateCollection::indexing_mode`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::IndexingMode;
    /// db.create_collection_if_not_exists("logs", "/host").indexing_mode(IndexingMode::Lazy).await?;
    /// # Ok(()) }
    /// ```
    pub fn indexing_mode(self, mode: IndexingMode) -> Self {
        EnsureCollection(self.0.indexing_mode(mode))
    }

    /// The indexed paths if it is created ([`CreateCollection::indexing_paths`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::IndexingPaths;
    /// db.create_collection_if_not_exists("logs", "/host")
    ///     .indexing_paths(IndexingPaths::new(["/*"], ["/message/?"]))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn indexing_paths(self, paths: IndexingPaths) -> Self {
        EnsureCollection(self.0.indexing_paths(paths))
    }

    /// A must-live rule if it is created ([`CreateCollection::must_live`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::MustLiveRule;
    /// db.create_collection_if_not_exists("shop", "/customer")
    ///     .must_live(MustLiveRule::new("/type", ["order", "invoice"]))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn must_live(self, rule: MustLiveRule) -> Self {
        EnsureCollection(self.0.must_live(rule))
    }
}

impl<'a> IntoFuture for EnsureCollection<'a> {
    type Output = Result<Ensured<Collection, CollectionInfo>, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let database = self.0.database;
            let id = self.0.id.clone();
            let path = self.0.partition_key_path.clone();
            match self.0.await {
                Ok(collection) => Ok(Ensured::Created(collection)),
                Err(e) if e.reason() == Some(&Reason::CollectionExists) => {
                    let info = database.collection(&id).info().await?;
                    if info.partition_key_path != path {
                        return Err(Error::Conflict(ErrorDetails::new(
                            tonic::Code::AlreadyExists,
                            format!(
                                "collection '{id}' exists with partition key path '{}', not \
                                 '{path}'",
                                info.partition_key_path
                            ),
                            Some(Reason::CollectionExists),
                        )));
                    }
                    Ok(Ensured::Existing(database.collection(&id), info))
                }
                Err(e) => Err(e),
            }
        })
    }
}
