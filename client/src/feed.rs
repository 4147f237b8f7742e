//! Read feeds: a collection's or partition's live documents, page by page.

use std::{
    collections::VecDeque,
    future::IntoFuture,
    marker::PhantomData,
    pin::Pin,
    task::{Context, Poll},
};

use mayfly_proto::v1::{self, ReadFeedRequest};
use serde::de::DeserializeOwned;
use tokio_stream::Stream;

use crate::{
    client::{BoxFuture, Call},
    collection::Collection,
    document::{Document, Item, PartitionKey},
    error::{Error, Reason},
    pages::Pages,
};

/// A page size given to a feed or query: 1 to 1000, checked here so that 0 (which the wire
/// reads as "the default") is not taken silently.
pub(crate) fn checked_page_size(size: Option<u32>) -> Result<u32, Error> {
    match size {
        None => Ok(0),
        Some(n @ 1..=1000) => Ok(n),
        Some(n) => Err(Error::invalid(
            format!(
                "page_size {n} is out of range; use 1..=1000, or leave it unset for the default"
            ),
            Some(Reason::InvalidPageSize),
        )),
    }
}

/// A feed request; see [`Collection::read_feed`].
#[derive(Debug)]
#[must_use = "nothing is read until the request is awaited"]
pub struct ReadFeed<'a> {
    collection: &'a Collection,
    partition_key: Option<PartitionKey>,
    page_size: Option<u32>,
    continuation: Option<String>,
}

impl<'a> ReadFeed<'a> {
    pub(crate) fn new(collection: &'a Collection) -> Self {
        ReadFeed {
            collection,
            partition_key: None,
            page_size: None,
            continuation: None,
        }
    }

    /// Reads one partition only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// c.create(&serde_json::json!({"id": "a", "k": "x"})).await?;
    /// c.create(&serde_json::json!({"id": "b", "k": "y"})).await?;
    /// let docs = c.read_feed().partition_key("x").await?.collect_all().await?;
    /// assert_eq!(docs.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn partition_key(mut self, partition_key: impl Into<PartitionKey>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// Documents per page, 1 to 1000 (default 100); any other value fails the request with
    /// [`Error::InvalidArgument`] ([`Reason::InvalidPageSize`]) before it is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let mut feed = c.read_feed().page_size(500).await?;
    /// assert!(c.read_feed().page_size(0).await.is_err());
    /// # Ok(()) }
    /// ```
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = Some(page_size);
        self
    }

    /// Resumes after the page that returned this token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// for i in 0..3 {
    ///     c.create(&serde_json::json!({"id": format!("d{i}"), "k": 1})).await?;
    /// }
    /// let first = c.read_feed().page_size(2).await?.next_page().await?.expect("a page");
    /// let token = first.continuation.expect("more to come");
    /// // ... later, perhaps after a disconnect:
    /// let rest = c.read_feed().page_size(2).continuation(&token).await?.collect_all().await?;
    /// assert_eq!(first.documents.len() + rest.len(), 3);
    /// # Ok(()) }
    /// ```
    pub fn continuation(mut self, token: &str) -> Self {
        self.continuation = Some(token.to_owned());
        self
    }
}

impl<'a> IntoFuture for ReadFeed<'a> {
    type Output = Result<Feed, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let ReadFeed {
                collection,
                partition_key,
                page_size,
                continuation,
            } = self;
            let request = ReadFeedRequest {
                database: collection.database.clone(),
                collection: collection.id.clone(),
                partition_key: partition_key.map(PartitionKey::into_proto),
                page_size: checked_page_size(page_size)?,
                continuation: continuation.unwrap_or_default(),
            };
            let client = &collection.client;
            let stream = client
                .call(Call::Idempotent, || {
                    let mut documents = client.documents.clone();
                    let request = request.clone();
                    async move { documents.read_feed(request).await }
                })
                .await?;
            Ok(Feed {
                pages: Pages::new(stream, client.clone()),
            })
        })
    }
}

/// One page of a feed.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedPage {
    /// Live documents.
    pub documents: Vec<Document>,
    /// Token to resume after this page; `None` on the last page.
    pub continuation: Option<String>,
    /// What this page cost, in request units (README, "Request units").
    pub request_charge: f64,
}

/// An open feed: read it page by page, or as a typed [`Stream`] with [`Feed::into_stream`].
/// Pages are produced by the server as they are read, each within the request timeout.
#[derive(Debug)]
pub struct Feed {
    pages: Pages<v1::ReadFeedPage>,
}

fn feed_page(page: v1::ReadFeedPage) -> FeedPage {
    let v1::ReadFeedPage {
        documents,
        continuation,
        request_charge,
    } = page;
    FeedPage {
        documents: documents.into_iter().map(Document::from_proto).collect(),
        continuation: (!continuation.is_empty()).then_some(continuation),
        request_charge,
    }
}

impl Feed {
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
    /// let mut feed = c.read_feed().await?;
    /// while let Some(page) = feed.next_page().await? {
    ///     for doc in page.documents {
    ///         println!("{} has {:?} left", doc.id(), doc.remaining());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn next_page(&mut self) -> Result<Option<FeedPage>, Error> {
        Ok(self.pages.next().await?.map(feed_page))
    }

    /// Every remaining document, in feed order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// # c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
    /// let docs = c.read_feed().await?.collect_all().await?;
    /// assert_eq!(docs[0].id(), "a");
    /// # Ok(()) }
    /// ```
    pub async fn collect_all(mut self) -> Result<Vec<Document>, Error> {
        let mut all = Vec::new();
        while let Some(page) = self.next_page().await? {
            all.extend(page.documents);
        }
        Ok(all)
    }
}

impl Feed {
    /// The rest of the feed as a [`Stream`] of typed [`Item`]s, one document at a time; pages
    /// are fetched as the stream is read. A document that does not deserialize as `T` is an
    /// `Err` item of its own; the stream goes on after it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// use mayfly_client::StreamExt as _;
    /// #[derive(serde::Deserialize)]
    /// struct Event { id: String, n: u32 }
    /// for n in 0..5 {
    ///     c.create(&serde_json::json!({"id": format!("e{n}"), "k": 1, "n": n})).await?;
    /// }
    /// let mut events = c.read_feed().page_size(2).await?.into_stream::<Event>();
    /// let mut total = 0;
    /// while let Some(event) = events.next().await {
    ///     let event = event?;
    ///     total += event.value().n;
    ///     println!("{} (etag {})", event.value().id, event.etag());
    /// }
    /// assert_eq!(total, 10);
    /// # Ok(()) }
    /// ```
    pub fn into_stream<T: DeserializeOwned>(self) -> FeedStream<T> {
        FeedStream {
            pages: self.pages,
            buffered: VecDeque::new(),
            items: PhantomData,
        }
    }
}

/// A feed as a [`Stream`] of typed [`Item`]s; see [`Feed::into_stream`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
/// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
/// use mayfly_client::StreamExt as _;
/// let db = client.create_database("app").await?;
/// let c = db.create_collection("c", "/k").await?;
/// c.create(&serde_json::json!({"id": "a", "k": 1})).await?;
/// let mut docs = c.read_feed().await?.into_stream::<serde_json::Value>();
/// while let Some(item) = docs.next().await {
///     assert_eq!(item?.id(), "a");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FeedStream<T> {
    pages: Pages<v1::ReadFeedPage>,
    /// Documents of the last page, not yet handed out.
    buffered: VecDeque<v1::Document>,
    items: PhantomData<fn() -> T>,
}

// Nothing is pinned in place: documents are moved out of the buffer.
impl<T> Unpin for FeedStream<T> {}

impl<T: DeserializeOwned> Stream for FeedStream<T> {
    type Item = Result<Item<T>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(document) = this.buffered.pop_front() {
                return Poll::Ready(Some(Document::from_proto(document).into_item()));
            }
            match this.pages.poll_page(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(page))) => this.buffered.extend(page.documents),
            }
        }
    }
}
