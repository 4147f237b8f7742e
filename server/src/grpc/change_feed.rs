//! `Documents/ChangeFeed` and `Documents/GetFeedRanges`: the change feed over gRPC. The stream
//! is the shared page driver's ([`super::stream`]): each message is authorized again, its
//! memory reserved in the response budget, and computed only once the one before has left, so
//! a consumer that stops reading holds one page. Between messages it waits for durable events
//! of its collection, checking every second that its caller may still read.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tonic::Status;

use super::{
    DocumentsService, blocking, convert,
    status::to_status,
    stream::{Grant, PageSource, PageStream},
};
use crate::engine::{
    self, ChangeEvent, ChangeFeedCursor, ChangeFeedMode, ChangeFeedScope, ChangeFeedStart,
    ChangeOp, Engine, FeedScope, InvalidInput, Outcome, QueryReads,
};
use crate::net::PeerShare;
use mayfly_proto::v1::{
    self, ChangeFeedRequest, ChangeFeedResponse, GetFeedRangesRequest, GetFeedRangesResponse,
    oneofs::ChangeFeedStart as Start,
};

/// Events per message when the request does not say.
const DEFAULT_EVENTS: u32 = 100;
/// Most events per message.
const MAX_EVENTS: u32 = 1000;
/// A stream with nothing to send sends an empty message with its continuation this often,
/// so that a consumer can checkpoint past other partitions' events and tell a quiet feed from
/// a dead connection.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// A change feed stream's pages.
struct ChangeFeedPages {
    path: engine::CollectionPath,
    max_events: usize,
    /// When the stream last sent a message (`None`: never; its first is sent at once, so
    /// that opening it answers without waiting for a change).
    sent: Mutex<Option<Instant>>,
}

impl PageSource for ChangeFeedPages {
    type Message = ChangeFeedResponse;
    type Cursor = ChangeFeedCursor;

    fn pays(&self) -> bool {
        true
    }

    fn charge(&self, page: &ChangeFeedResponse) -> engine::RequestCharge {
        engine::RequestCharge::from_units(page.request_charge)
    }

    fn inline(&self) -> QueryReads {
        // A page reads records in order and evaluates nothing: on memory storage it is
        // answered on the async worker (see the read feed's `FEED_INLINE_TIME`).
        QueryReads::inline_within(u64::MAX, Duration::from_millis(50))
    }

    fn page(
        &self,
        engine: &Engine,
        at: &ChangeFeedCursor,
        reads: QueryReads,
    ) -> Outcome<(ChangeFeedResponse, Option<ChangeFeedCursor>)> {
        engine
            .change_feed_page(&self.path, at, self.max_events, reads)
            .map(|page| {
                let default_ttl = page.default_ttl;
                let read_at = page.read_at;
                // Expiry events are free (docs: "Request units").
                let (charged, bytes) = page
                    .events
                    .iter()
                    .filter(|e| e.record.op != ChangeOp::Expire)
                    .fold((0, 0), |(n, bytes), e| {
                        (n + 1, bytes + e.record.body.as_ref().map_or(0, |b| b.len()))
                    });
                let charge = engine::RequestCharge::change_batch(charged, bytes);
                let events = page
                    .events
                    .into_iter()
                    .map(|e| event(e, default_ttl, read_at))
                    .collect();
                let message = ChangeFeedResponse {
                    events,
                    continuation: page.continuation,
                    request_charge: charge.units(),
                };
                (message, Some(page.next))
            })
    }

    fn ready<'a>(
        &'a self,
        engine: &'a Engine,
        at: &'a ChangeFeedCursor,
        wait: Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, engine::Error>> {
        Box::pin(engine.wait_for_changes(at, wait))
    }

    fn send_empty(&self, message: &ChangeFeedResponse) -> bool {
        let mut sent = self.sent.lock();
        if message.events.is_empty() && sent.is_some_and(|at| at.elapsed() < HEARTBEAT) {
            return false;
        }
        *sent = Some(Instant::now());
        true
    }

    /// A page scans at most a bounded run of the log, and every subscriber wants one after
    /// each write.
    fn bounded_blocking(&self) -> bool {
        true
    }

    fn heartbeat_due(&self) -> bool {
        self.sent.lock().is_none_or(|at| at.elapsed() >= HEARTBEAT)
    }
}

/// An event as the wire carries it; a write's document is viewed under the collection's
/// current default TTL, at `read_at`.
fn event(
    e: ChangeEvent,
    default_ttl: engine::DefaultTtl,
    read_at: engine::Millis,
) -> v1::ChangeEvent {
    let r = e.record;
    let operation = match r.op {
        ChangeOp::Create => v1::ChangeOperation::Create,
        ChangeOp::Replace => v1::ChangeOperation::Replace,
        ChangeOp::Patch => v1::ChangeOperation::Patch,
        ChangeOp::Delete => v1::ChangeOperation::Delete,
        ChangeOp::Expire => v1::ChangeOperation::Expire,
    };
    let document = r.document(default_ttl, read_at).map(convert::document);
    v1::ChangeEvent {
        operation_type: operation as i32,
        lsn: e.lsn,
        crts: Some(convert::timestamp(r.crts)),
        previous_lsn: r.previous,
        time_to_live_expired: r.op == ChangeOp::Expire,
        id: r.key.id.as_str().to_owned(),
        partition_key: Some(convert::partition_key_proto(&r.key.partition_key)),
        document,
        shard: Some(e.shard as u32),
    }
}

fn mode(raw: i32) -> Result<Option<ChangeFeedMode>, InvalidInput> {
    match v1::ChangeFeedMode::try_from(raw) {
        Ok(v1::ChangeFeedMode::Unspecified) => Ok(None),
        Ok(v1::ChangeFeedMode::LatestVersion) => Ok(Some(ChangeFeedMode::LatestVersion)),
        Ok(v1::ChangeFeedMode::AllVersionsAndDeletes) => {
            Ok(Some(ChangeFeedMode::AllVersionsAndDeletes))
        }
        Err(_) => Err(InvalidInput::UnknownEnumValue {
            field: "mode",
            value: raw,
        }),
    }
}

fn start(start: Option<Start>) -> Result<ChangeFeedStart, InvalidInput> {
    Ok(match start {
        None | Some(Start::Now(())) => ChangeFeedStart::Now,
        Some(Start::Beginning(())) => ChangeFeedStart::Beginning,
        Some(Start::StartTime(t)) => {
            let ms = t
                .seconds
                .checked_mul(1000)
                .and_then(|ms| ms.checked_add(i64::from(t.nanos) / 1_000_000))
                .and_then(|ms| u64::try_from(ms).ok())
                .ok_or(InvalidInput::StartTime { seconds: t.seconds })?;
            ChangeFeedStart::Time(ms)
        }
        Some(Start::Continuation(token)) => ChangeFeedStart::Continuation(token),
    })
}

impl DocumentsService {
    /// Opens a change feed stream: the request checked, the caller authorized for what it
    /// reads (a partition-scoped token only for its partition), the start resolved.
    pub(super) async fn start_change_feed(
        &self,
        headers: &http::HeaderMap,
        share: Option<PeerShare>,
        request: ChangeFeedRequest,
    ) -> Result<PageStream<ChangeFeedResponse>, Status> {
        // Sent on to other nodes as asked, in a cluster (see `cluster_feed`).
        let original = self.forwarder.is_some().then(|| request.clone());
        let ChangeFeedRequest {
            database,
            collection,
            partition_key,
            feed_range,
            mode: raw_mode,
            start: raw_start,
            max_events,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        let partition = convert::feed_scope(partition_key).map_err(to_status)?;
        let engine = self.engine()?;
        let scope = match (partition, feed_range.is_empty()) {
            (FeedScope::Collection, true) => None,
            (FeedScope::Partition(pk), true) => Some(ChangeFeedScope::Partition(pk)),
            (FeedScope::Collection, false) => Some(ChangeFeedScope::Range(
                engine.parse_feed_range(&feed_range).map_err(to_status)?,
            )),
            (FeedScope::Partition(_), false) => {
                return Err(to_status(InvalidInput::FeedScopeConflict));
            }
        };
        let mode = mode(raw_mode).map_err(to_status)?;
        let start = start(raw_start).map_err(to_status)?;
        // What the caller reads is authorized before anything is read: the partition it names,
        // or, resuming without naming one, the partition in its continuation (a token that does
        // not open fails below, on its own terms).
        let resumed = match (&start, &scope) {
            (ChangeFeedStart::Continuation(token), None) => engine
                .open_change_feed_token(token)
                .map(|c| c.scope().clone())
                .ok(),
            _ => None,
        };
        let partition = match scope.as_ref().or(resumed.as_ref()) {
            Some(ChangeFeedScope::Partition(pk)) => Some(pk),
            _ => None,
        };
        let grant = Grant::read(
            &self.auth,
            &self.engine,
            headers,
            &database,
            &collection,
            partition,
        )?;
        let max_events = match max_events {
            0 => DEFAULT_EVENTS,
            n if n <= MAX_EVENTS => n,
            n => {
                return Err(to_status(InvalidInput::MaxEvents {
                    value: n,
                    max: MAX_EVENTS,
                }));
            }
        } as usize;
        if let Some(original) = original {
            // Where this node reads the feed to start: a continuation's positions, or
            // placeholders (`Now` reads only each shard's log end) that the nodes serving the
            // partitions replace.
            let (opened, fresh) = (
                path.clone(),
                !matches!(start, ChangeFeedStart::Continuation(_)),
            );
            let (scope, start) = (scope.clone(), start.clone());
            let at = blocking(move || match start {
                ChangeFeedStart::Continuation(token) => {
                    engine.change_feed_cursor(&opened, scope.as_ref(), mode, &token)
                }
                _ => engine.open_change_feed(&opened, scope, mode, ChangeFeedStart::Now),
            })
            .await?;
            if let Some(stream) = self
                .change_feed_across_nodes(headers, share.clone(), &original, at, fresh)
                .await?
            {
                let open = OpenFeed::new(&self.feed_streams);
                return Ok(Box::pin(stream.inspect(move |_| {
                    let _ = &open;
                })));
            }
        }
        let engine = self.engine()?;
        let opened = path.clone();
        let cursor = blocking(move || engine.open_change_feed(&opened, scope, mode, start)).await?;
        let pages = ChangeFeedPages {
            path,
            max_events,
            sent: Mutex::new(None),
        };
        let stream = self.open_stream(grant, share, pages, cursor).await?;
        let open = OpenFeed::new(&self.feed_streams);
        Ok(Box::pin(stream.inspect(move |_| {
            // Owned by the stream: counted until its client leaves or it ends.
            let _ = &open;
        })))
    }

    /// `n` feed ranges of a collection, for a group of consumers to share its change feed.
    pub(super) async fn feed_ranges(
        &self,
        headers: &http::HeaderMap,
        request: GetFeedRangesRequest,
    ) -> Result<GetFeedRangesResponse, Status> {
        let GetFeedRangesRequest {
            database,
            collection,
            count,
        } = request;
        let path = convert::collection_path(&database, &collection).map_err(to_status)?;
        Grant::read(
            &self.auth,
            &self.engine,
            headers,
            &database,
            &collection,
            None,
        )?;
        let ranges = self
            .engine()?
            .feed_ranges(&path, count as usize)
            .map_err(to_status)?;
        Ok(GetFeedRangesResponse {
            feed_ranges: ranges.iter().map(ToString::to_string).collect(),
        })
    }
}

/// One open change feed stream, counted in the service's gauge for as long as it lives.
struct OpenFeed(Gauge);

impl OpenFeed {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        OpenFeed(gauge.clone())
    }
}

impl Drop for OpenFeed {
    fn drop(&mut self) {
        self.0.dec();
    }
}
