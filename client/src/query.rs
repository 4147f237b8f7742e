//! Queries in the Azure Cosmos DB for NoSQL SQL dialect, page by page or as a stream of
//! results.

use std::{
    collections::{HashMap, VecDeque},
    future::IntoFuture,
    marker::PhantomData,
    pin::Pin,
    task::{Context, Poll},
};

use mayfly_proto::{json, v1};
use serde::{Serialize, de::DeserializeOwned};
use tokio_stream::Stream;

use crate::{
    client::{BoxFuture, Call},
    collection::Collection,
    document::{PartitionKey, from_json},
    error::Error,
    feed::checked_page_size,
    pages::Pages,
};

/// A query request; see [`Collection::query`].
#[derive(Debug)]
#[must_use = "nothing is run until the request is awaited"]
pub struct Query<'a, T> {
    collection: &'a Collection,
    text: String,
    parameters: Result<HashMap<String, json::JsonValue>, Error>,
    partition_key: Option<PartitionKey>,
    page_size: Option<u32>,
    continuation: Option<String>,
    enable_scan: bool,
    results: PhantomData<fn() -> T>,
}

impl<'a, T> Query<'a, T> {
    pub(crate) fn new(collection: &'a Collection, text: &str) -> Self {
        Query {
            collection,
            text: text.to_owned(),
            parameters: Ok(HashMap::new()),
            partition_key: None,
            page_size: None,
            continuation: None,
            enable_scan: false,
            results: PhantomData,
        }
    }

    /// Gives the parameter `name` (written with its `@`) a value.
    ///
    /// Every parameter given must be used by the query, and every one the query uses must be
    /// given: the server refuses the query otherwise, before reading anything, with
    /// [`Error::InvalidArgument`] and [`Reason::QueryInvalid`](crate::Reason::QueryInvalid),
    /// naming the parameter (`query: parameter '@x' is not used by the query (parameters are
    /// named with '@', as in @status)`, or `query: parameter @x is used but not given`), the
    /// server's message as it sent it; a name without its `@` is refused too (`query: query
    /// parameter name 'x' must be '@' followed by letters, digits or '_'`). So a typo in a
    /// name (`@satus`) fails loudly instead of leaving a filter unapplied. Setting a parameter
    /// twice keeps the last value.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": 1, "n": 5})).await?;
    /// let ids: Vec<String> = c
    ///     .query("SELECT VALUE c.id FROM c WHERE c.n > @min")
    ///     .param("@min", 3)
    ///     .await?
    ///     .collect_all()
    ///     .await?;
    /// assert_eq!(ids, ["a"]);
    ///
    /// use mayfly_client::{Error, Reason};
    /// let typo = c.query::<String>("SELECT VALUE c.id FROM c WHERE c.n > @min").param("@min", 3).param("@max", 9).await;
    /// let Err(Error::InvalidArgument(details)) = typo else { panic!("refused") };
    /// assert_eq!(details.reason(), Some(&Reason::QueryInvalid));
    /// assert!(details.message().contains("parameter '@max' is not used by the query"), "{details}");
    /// # Ok(()) }
    /// ```
    pub fn param(mut self, name: &str, value: impl Serialize) -> Self {
        let converted = serde_json::to_value(value)
            .map_err(|e| Error::Serialization(format!("query parameter {name}: {e}")));
        self.parameters = match (self.parameters, converted) {
            (Ok(mut map), Ok(v)) => {
                map.insert(name.to_owned(), json::JsonValue::new(v));
                Ok(map)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        self
    }

    /// Queries one partition only; without it the query reads every partition.
    pub fn partition_key(mut self, partition_key: impl Into<PartitionKey>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// Results per page, 1 to 1000 (default 100); any other value fails the request with
    /// [`Error::InvalidArgument`] ([`Reason::InvalidPageSize`](crate::Reason::InvalidPageSize))
    /// before it is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let page = c.query::<serde_json::Value>("SELECT * FROM c").page_size(10).await?.next_page().await?;
    /// let zero = c.query::<serde_json::Value>("SELECT * FROM c").page_size(0).await.unwrap_err();
    /// assert_eq!(zero.reason(), Some(&mayfly_client::Reason::InvalidPageSize));
    /// # Ok(()) }
    /// ```
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = Some(page_size);
        self
    }

    /// Allows reading every document of the scope on a collection without an index (indexing
    /// mode none); without it such a query fails with `InvalidArgument`.
    pub fn enable_scan(mut self) -> Self {
        self.enable_scan = true;
        self
    }

    /// Resumes after the page that returned this token.
    pub fn continuation(mut self, token: &str) -> Self {
        self.continuation = Some(token.to_owned());
        self
    }
}

impl<'a, T: DeserializeOwned + 'a> IntoFuture for Query<'a, T> {
    type Output = Result<QueryResults<T>, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let request = v1::QueryRequest {
                database: self.collection.database.clone(),
                collection: self.collection.id.clone(),
                query: self.text,
                parameters: self.parameters?,
                partition_key: self.partition_key.map(PartitionKey::into_proto),
                page_size: checked_page_size(self.page_size)?,
                continuation: self.continuation.unwrap_or_default(),
                enable_scan: self.enable_scan,
            };
            let client = &self.collection.client;
            let stream = client
                .call(Call::Idempotent, || {
                    let mut documents = client.documents.clone();
                    let request = request.clone();
                    async move { documents.query(request).await }
                })
                .await?;
            Ok(QueryResults {
                stream: Pages::new(stream, client.clone()),
                buffered: VecDeque::new(),
                buffered_continuation: None,
                results: PhantomData,
            })
        })
    }
}

/// What producing a page took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryMetrics {
    /// Live documents read and evaluated.
    pub documents_examined: u64,
    /// Index entries read.
    pub index_entries_examined: u64,
    /// Results on the page.
    pub results_returned: u64,
    /// The index used (an indexing-policy path); `None` for a full scan.
    pub index: Option<String>,
}

/// One page of results.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryPage<T> {
    pub results: Vec<T>,
    /// Token to resume after this page; `None` on the last page.
    pub continuation: Option<String>,
    pub metrics: QueryMetrics,
    /// What this page cost, in request units: from its metrics and the size of its results
    /// (README, "Request units"); the pages of a query sum to its charge.
    pub request_charge: f64,
}

/// A running query: read it page by page with [`QueryResults::next_page`], or as a
/// [`Stream`] of results.
#[derive(Debug)]
pub struct QueryResults<T> {
    stream: Pages<v1::QueryPage>,
    /// Results of a page taken by the `Stream`, not yet handed out (each converted on its
    /// own, so one that fails does not take the others with it).
    buffered: VecDeque<Result<T, Error>>,
    /// The continuation of the page `buffered` came from.
    buffered_continuation: Option<String>,
    results: PhantomData<fn() -> T>,
}

// Results are never pinned in place: they are moved out of the buffer.
impl<T> Unpin for QueryResults<T> {}

/// One result as `T`; a failure names the result's `id`, if it has one, and the JSON path.
fn result<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, Error> {
    let id = v
        .get("id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    from_json(v, || match id {
        Some(id) => format!("query result '{id}'"),
        None => "a query result".to_owned(),
    })
}

fn metrics(page: &v1::QueryPage) -> QueryMetrics {
    let m = page.metrics.clone().unwrap_or_default();
    QueryMetrics {
        documents_examined: m.documents_examined,
        index_entries_examined: m.index_entries_examined,
        results_returned: m.results_returned,
        index: m.index_used.then_some(m.index),
    }
}

fn convert<T: DeserializeOwned>(page: v1::QueryPage) -> Result<QueryPage<T>, Error> {
    let metrics = metrics(&page);
    let results = page
        .results
        .into_iter()
        .map(result)
        .collect::<Result<_, _>>()?;
    Ok(QueryPage {
        results,
        continuation: (!page.continuation.is_empty()).then_some(page.continuation),
        metrics,
        request_charge: page.request_charge,
    })
}

impl<T: DeserializeOwned> QueryResults<T> {
    /// The next page, or `None` after the last.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// # c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let mut results = c.query::<serde_json::Value>("SELECT VALUE COUNT(1) FROM c").await?;
    /// let page = results.next_page().await?.expect("one page");
    /// assert_eq!(page.results, [serde_json::json!(1)]);
    /// println!("read {} documents", page.metrics.documents_examined);
    /// # Ok(()) }
    /// ```
    pub async fn next_page(&mut self) -> Result<Option<QueryPage<T>>, Error> {
        if !self.buffered.is_empty() {
            // The rest of a page the `Stream` began.
            let results = self.buffered.drain(..).collect::<Result<Vec<T>, Error>>()?;
            return Ok(Some(QueryPage {
                results,
                continuation: self.buffered_continuation.take(),
                // The page's metrics and charge went with its first part.
                metrics: QueryMetrics::default(),
                request_charge: 0.0,
            }));
        }
        match self.stream.next().await? {
            Some(page) => convert(page).map(Some),
            None => Ok(None),
        }
    }

    /// Every remaining result.
    pub async fn collect_all(mut self) -> Result<Vec<T>, Error> {
        let mut all: Vec<T> = self.buffered.drain(..).collect::<Result<_, _>>()?;
        while let Some(page) = self.next_page().await? {
            all.extend(page.results);
        }
        Ok(all)
    }
}

impl<T: DeserializeOwned> Stream for QueryResults<T> {
    type Item = Result<T, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(next) = this.buffered.pop_front() {
                return Poll::Ready(Some(next));
            }
            match this.stream.poll_page(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(page))) => {
                    this.buffered_continuation =
                        (!page.continuation.is_empty()).then_some(page.continuation);
                    this.buffered.extend(page.results.into_iter().map(result));
                }
            }
        }
    }
}
