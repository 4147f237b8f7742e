//! The change feed: a collection's changes as they become durable, each expiry at its expiry
//! instant. See [`Collection::changes`].

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::{SystemTime, UNIX_EPOCH},
};

use mayfly_proto::v1::{self, ChangeFeedRequest, GetFeedRangesRequest, oneofs::ChangeFeedStart};
use tokio_stream::Stream;
use tonic::Streaming;

use crate::{
    client::{Call, Client},
    collection::Collection,
    document::{Document, PartitionKey, system_time},
    error::{Error, Reason},
};

/// Where a change feed starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartFrom {
    /// After every change committed so far.
    Now,
    /// At the oldest event the collection's retention keeps.
    Beginning,
    /// At the first event committed at or after this instant.
    Time(SystemTime),
    /// After the batch that carried this continuation ([`ChangeBatch::continuation`]), with
    /// that feed's partition, range and mode.
    Continuation(String),
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// A write with no live version before it.
    Create,
    /// A replace, an upsert of a live document, a touch, or a transactional batch's write.
    Replace,
    /// A patch.
    Patch,
    /// A client's delete.
    Delete,
    /// The document expired, at [`Change::committed_at`] (its expiry instant).
    Expire,
}

/// One event of a change feed.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// What happened.
    pub kind: ChangeKind,
    /// Its position in its shard's log: later events of a partition key value have larger
    /// positions.
    pub lsn: u64,
    /// The shard whose log holds it.
    pub shard: u32,
    /// When it was committed; for an expiry, the expiry instant.
    pub committed_at: SystemTime,
    /// The position of the document's previous event (0: none known).
    pub previous_lsn: u64,
    /// The document's id.
    pub id: String,
    /// The document's partition key value.
    pub partition_key: PartitionKey,
    /// The new version, for creates, replaces and patches.
    pub document: Option<Document>,
}

impl Change {
    /// Whether the document expired (Cosmos DB's `timeToLiveExpired`).
    pub fn time_to_live_expired(&self) -> bool {
        self.kind == ChangeKind::Expire
    }

    fn from_proto(e: v1::ChangeEvent) -> Self {
        let kind = match v1::ChangeOperation::try_from(e.operation_type) {
            Ok(v1::ChangeOperation::Create) => ChangeKind::Create,
            Ok(v1::ChangeOperation::Patch) => ChangeKind::Patch,
            Ok(v1::ChangeOperation::Delete) => ChangeKind::Delete,
            Ok(v1::ChangeOperation::Expire) => ChangeKind::Expire,
            // A newer server's kinds read as the nearest this client knows.
            _ if e.time_to_live_expired => ChangeKind::Expire,
            _ => ChangeKind::Replace,
        };
        Change {
            kind,
            lsn: e.lsn,
            shard: e.shard.unwrap_or(0),
            committed_at: e.crts.map_or(UNIX_EPOCH, system_time),
            previous_lsn: e.previous_lsn,
            id: e.id,
            partition_key: PartitionKey::from_proto(e.partition_key),
            document: e.document.map(Document::from_proto),
        }
    }
}

/// The events of one message of the feed, and where to resume after them: keep the
/// continuation once they are handled (an empty batch is a heartbeat that moves it on).
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeBatch {
    pub changes: Vec<Change>,
    pub continuation: String,
    /// What this batch cost, in request units; expiry events are free.
    pub request_charge: f64,
}

/// A part of a collection's change feed that consumers share ([`Collection::feed_ranges`]):
/// every partition key value's events are in exactly one range of a split.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FeedRange(String);

impl FeedRange {
    /// A range kept as text ([`FeedRange::as_str`]), as a consumer group stores its leases.
    pub fn new(text: impl Into<String>) -> Self {
        FeedRange(text.into())
    }

    /// The range as text, to store beside a checkpoint.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A change feed request; see [`Collection::changes`].
#[derive(Debug)]
#[must_use = "nothing is read until the feed is started"]
pub struct ChangeFeed<'a> {
    collection: &'a Collection,
    mode: v1::ChangeFeedMode,
    partition_key: Option<PartitionKey>,
    feed_range: Option<FeedRange>,
    max_events: u32,
}

impl<'a> ChangeFeed<'a> {
    pub(crate) fn new(collection: &'a Collection) -> Self {
        ChangeFeed {
            collection,
            mode: v1::ChangeFeedMode::Unspecified,
            partition_key: None,
            feed_range: None,
            max_events: 0,
        }
    }

    /// Every create, replace, patch, delete and expiry (Cosmos DB's "all versions and
    /// deletes" mode).
    pub fn all_versions_and_deletes(mut self) -> Self {
        self.mode = v1::ChangeFeedMode::AllVersionsAndDeletes;
        self
    }

    /// Creates, replaces and patches only (the default).
    pub fn latest_version(mut self) -> Self {
        self.mode = v1::ChangeFeedMode::LatestVersion;
        self
    }

    /// One partition key value's events only.
    pub fn partition_key(mut self, partition_key: impl Into<PartitionKey>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// One range of [`Collection::feed_ranges`] only.
    pub fn feed_range(mut self, range: &FeedRange) -> Self {
        self.feed_range = Some(range.clone());
        self
    }

    /// Most events per batch, 1 to 1000 (default 100).
    pub fn max_events(mut self, max: u32) -> Self {
        self.max_events = max;
        self
    }

    /// Opens the feed from `from`. The stream stays open, yielding batches as changes become
    /// durable (and an empty one every 10 s while nothing does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// use mayfly_client::{ChangeKind, StartFrom};
    /// let sessions = db.create_collection("sessions", "/user").await?;
    /// let mut changes = sessions.changes().all_versions_and_deletes().start(StartFrom::Now).await?;
    /// sessions.create(&serde_json::json!({"id": "s1", "user": "ann"})).await?;
    /// sessions.delete_document("s1", "ann").await?;
    /// let mut seen = Vec::new();
    /// while seen.len() < 2 {
    ///     let batch = changes.next_batch().await?.expect("the feed stays open");
    ///     seen.extend(batch.changes.iter().map(|c| (c.kind, c.id.clone())));
    /// }
    /// assert_eq!(seen, [(ChangeKind::Create, "s1".to_owned()), (ChangeKind::Delete, "s1".to_owned())]);
    /// # Ok(()) }
    /// ```
    pub async fn start(self, from: StartFrom) -> Result<ChangeStream, Error> {
        let ChangeFeed {
            collection,
            mode,
            partition_key,
            feed_range,
            max_events,
        } = self;
        if max_events > 1000 {
            return Err(Error::invalid(
                format!("max_events {max_events} is out of range; use 1..=1000"),
                Some(Reason::InvalidPageSize),
            ));
        }
        let start = match from {
            StartFrom::Now => ChangeFeedStart::Now(()),
            StartFrom::Beginning => ChangeFeedStart::Beginning(()),
            StartFrom::Time(at) => {
                let since = at.duration_since(UNIX_EPOCH).map_err(|_| {
                    Error::invalid(
                        "start time before 1970".to_owned(),
                        Some(Reason::InvalidStartTime),
                    )
                })?;
                ChangeFeedStart::StartTime(prost_types::Timestamp {
                    seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                    nanos: since.subsec_nanos() as i32,
                })
            }
            StartFrom::Continuation(token) => ChangeFeedStart::Continuation(token),
        };
        let request = ChangeFeedRequest {
            database: collection.database.clone(),
            collection: collection.id.clone(),
            partition_key: partition_key.map(PartitionKey::into_proto),
            feed_range: feed_range.map(|r| r.0).unwrap_or_default(),
            mode: mode as i32,
            start: Some(start),
            max_events,
        };
        let client = &collection.client;
        let stream = client
            .call(Call::Idempotent, || {
                let mut documents = client.documents.clone();
                let request = request.clone();
                async move { documents.change_feed(request).await }
            })
            .await?;
        Ok(ChangeStream {
            stream,
            client: client.clone(),
        })
    }
}

/// An open change feed: batches as changes become durable. It has no end; the request timeout
/// does not apply to waiting for the next batch (a heartbeat comes every 10 s).
pub struct ChangeStream {
    stream: Streaming<v1::ChangeFeedResponse>,
    client: Client,
}

impl std::fmt::Debug for ChangeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeStream").finish_non_exhaustive()
    }
}

impl ChangeStream {
    /// The next batch; `None` if the server ended the stream (it is shutting down: resume
    /// from the last continuation on a running server).
    pub async fn next_batch(&mut self) -> Result<Option<ChangeBatch>, Error> {
        std::future::poll_fn(|cx| self.poll_batch(cx))
            .await
            .transpose()
    }

    fn poll_batch(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<ChangeBatch, Error>>> {
        match Pin::new(&mut self.stream).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(self.client.error(status)))),
            Poll::Ready(Some(Ok(message))) => Poll::Ready(Some(Ok(ChangeBatch {
                changes: message.events.into_iter().map(Change::from_proto).collect(),
                continuation: message.continuation,
                request_charge: message.request_charge,
            }))),
        }
    }
}

impl Stream for ChangeStream {
    type Item = Result<ChangeBatch, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_batch(cx)
    }
}

impl Collection {
    /// The collection's change feed: configure it, then [`ChangeFeed::start`] it.
    pub fn changes(&self) -> ChangeFeed<'_> {
        ChangeFeed::new(self)
    }

    /// Splits the change feed into `count` ranges (1 to 1024) for a group of consumers:
    /// each partition key value's events are in exactly one.
    pub async fn feed_ranges(&self, count: u32) -> Result<Vec<FeedRange>, Error> {
        let request = GetFeedRangesRequest {
            database: self.database.clone(),
            collection: self.id.clone(),
            count,
        };
        let response = self
            .client
            .call(Call::Idempotent, || {
                let mut documents = self.client.documents.clone();
                let request = request.clone();
                async move { documents.get_feed_ranges(request).await }
            })
            .await?;
        Ok(response.feed_ranges.into_iter().map(FeedRange).collect())
    }
}
