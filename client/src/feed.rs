//! Read feeds: a collection's or partition's live documents, page by page.

use std::future::IntoFuture;

use mayfly_proto::v1::{self, ReadFeedRequest};
use tonic::Streaming;

use crate::{
    client::BoxFuture,
    collection::Collection,
    document::{Document, PartitionKey},
    error::Error,
};

/// A feed request; see [`Collection::read_feed`].
#[derive(Debug)]
#[must_use = "nothing is read until the request is awaited"]
pub struct ReadFeed<'a> {
    collection: &'a Collection,
    partition_key: Option<PartitionKey>,
    page_size: u32,
    continuation: Option<String>,
}

impl<'a> ReadFeed<'a> {
    pub(crate) fn new(collection: &'a Collection) -> Self {
        ReadFeed {
            collection,
            partition_key: None,
            page_size: 0,
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

    /// Documents per page, 1 to 1000 (default 100).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").await?;
    /// let mut feed = c.read_feed().page_size(500).await?;
    /// # Ok(()) }
    /// ```
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
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
                partition_key: partition_key.map(v1::PartitionKey::from),
                page_size,
                continuation: continuation.unwrap_or_default(),
            };
            let stream = collection
                .client
                .documents
                .clone()
                .read_feed(request)
                .await?
                .into_inner();
            Ok(Feed { stream })
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
}

/// An open feed.
#[derive(Debug)]
pub struct Feed {
    stream: Streaming<v1::ReadFeedPage>,
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
    ///         println!("{} expires in {:?}", doc.id(), doc.remaining());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn next_page(&mut self) -> Result<Option<FeedPage>, Error> {
        Ok(self.stream.message().await?.map(|page| {
            let v1::ReadFeedPage {
                documents,
                continuation,
            } = page;
            FeedPage {
                documents: documents.into_iter().map(Document::from).collect(),
                continuation: (!continuation.is_empty()).then_some(continuation),
            }
        }))
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
