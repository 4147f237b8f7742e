//! The change feed across a cluster's nodes (docs/cluster.md, "Cross-partition queries and
//! the change feed"). A continuation holds the next position in each partition's log, and
//! positions are the same on every node that serves a partition (its log is the partition's),
//! so the node a client calls serves a feed whose partitions other nodes serve by asking them:
//! - a feed whose partitions one other node serves (one partition's, or a range's) is that
//!   node's stream, relayed as it comes;
//! - a feed over partitions several nodes serve is merged here from one feed per run of
//!   consecutive partitions served by the same node (a feed range of its own, resumed from the
//!   positions this feed's continuation holds for those partitions): each message passes on as
//!   it arrives, with a continuation holding every partition's position after it, so resuming
//!   it anywhere, after any failover, shows each event once.
//!
//! A node that stops serving a partition ends its feed with `NOT_OWNER`: the stream ends with
//! it, and the client resumes from its last continuation.

use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream::select_all};
use mayfly_proto::v1::{
    ChangeFeedRequest, ChangeFeedResponse, client::DocumentsClient,
    oneofs::ChangeFeedStart as Start,
};
use tonic::{Request, Status, metadata::MetadataMap};

use super::{
    DocumentsService,
    forward::{self, FORWARDED},
    status::to_status,
    stream::PageStream,
};
use crate::engine::{self, ChangeFeedCursor, FeedRange};
use crate::net::PeerShare;

/// A merged stream sends a message without events at most this often (each node's feed sends
/// one every 10 s).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Where a run of a feed's partitions is served.
#[derive(Debug, Clone, PartialEq)]
enum Server {
    Here,
    At(String),
}

impl DocumentsService {
    /// A change feed, not forwarded to this node, that reads partitions other nodes serve (in
    /// a cluster): `None` where this node serves all it reads. `at` is this node's reading of
    /// where the feed starts: a continuation's positions, or (`fresh`) placeholders that the
    /// nodes serving the partitions replace.
    pub(super) async fn change_feed_across_nodes(
        &self,
        headers: &http::HeaderMap,
        share: Option<PeerShare>,
        request: &ChangeFeedRequest,
        at: ChangeFeedCursor,
        fresh: bool,
    ) -> Result<Option<PageStream<ChangeFeedResponse>>, Status> {
        let Some(forwarder) = &self.forwarder else {
            return Ok(None);
        };
        if headers.contains_key(FORWARDED) {
            return Ok(None);
        }
        let engine = self.engine()?;
        if at.positions().iter().all(|&(s, _)| engine.serves(s)) {
            return Ok(None);
        }
        // Runs of consecutive partitions served by one node.
        let mut runs: Vec<(usize, usize, Server)> = Vec::new();
        for &(shard, _) in at.positions() {
            let server = match engine.serves(shard) {
                true => Server::Here,
                false => Server::At(
                    forwarder
                        .owner_address(shard as u32)
                        .await
                        .ok_or_else(|| to_status(engine::Error::NotOwner { partition: shard }))?,
                ),
            };
            match runs.last_mut() {
                Some((_, last, s)) if *last + 1 == shard && *s == server => *last = shard,
                _ => runs.push((shard, shard, server)),
            }
        }
        let metadata = MetadataMap::from_headers(headers.clone());
        let forwarded = |message: ChangeFeedRequest| {
            let mut request = Request::new(message);
            *request.metadata_mut() = forward::forwarded_metadata(&metadata, forwarder.node());
            request
        };
        let answered = |shard: usize| {
            let forwarder = forwarder.clone();
            move |status: Status| {
                if forward::not_owned(&status).is_some() {
                    forwarder.stale(shard as u32);
                }
                status
            }
        };
        if let [(first, _, Server::At(address))] = runs.as_slice() {
            // One node serves it all: its stream, as it comes.
            let mut client = DocumentsClient::new(forwarder.channel(address)?)
                .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
            let pages = client
                .change_feed(forwarded(request.clone()))
                .await
                .map_err(answered(*first))?
                .into_inner();
            let answered = answered(*first);
            return Ok(Some(Box::pin(pages.map(move |m| m.map_err(&answered)))));
        }
        let mut parts = Vec::with_capacity(runs.len());
        for (first, last, server) in runs {
            let mut part = request.clone();
            part.partition_key = None;
            if fresh {
                part.feed_range = FeedRange::whole_shards(first, last).to_string();
            } else {
                let cursor = at.part(first, last).ok_or_else(|| {
                    Status::internal("a run of partitions the feed does not read")
                })?;
                part.feed_range = String::new();
                part.start = Some(Start::Continuation(engine.change_feed_token(&cursor)));
            }
            let stream: PageStream<ChangeFeedResponse> = match server {
                // Served here: as a single node serves it.
                Server::Here => {
                    Box::pin(self.start_change_feed(headers, share.clone(), part)).await?
                }
                Server::At(address) => {
                    let mut client = DocumentsClient::new(forwarder.channel(&address)?)
                        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
                    let pages = client
                        .change_feed(forwarded(part))
                        .await
                        .map_err(answered(first))?
                        .into_inner();
                    let answered = answered(first);
                    Box::pin(pages.map(move |m| m.map_err(&answered)))
                }
            };
            parts.push(stream);
        }
        Ok(Some(merged(engine, at, parts).await?))
    }
}

/// One stream of `parts`' messages as they arrive, each with a continuation holding every
/// part's position after it (`at` holds the rest). Each part's first message comes at once
/// (a feed answers its opening without waiting): they make the first message, so that the
/// first continuation already holds every position.
async fn merged(
    engine: engine::Engine,
    mut at: ChangeFeedCursor,
    mut parts: Vec<PageStream<ChangeFeedResponse>>,
) -> Result<PageStream<ChangeFeedResponse>, Status> {
    let firsts = futures_util::future::join_all(parts.iter_mut().map(|p| p.next())).await;
    let mut events = Vec::new();
    let mut charge = 0.0;
    for first in firsts {
        let message = first.ok_or_else(|| Status::unavailable("a node's change feed ended"))??;
        moved(&engine, &mut at, &message)?;
        events.extend(message.events);
        charge = super::request_charge::sum_units(charge, message.request_charge);
    }
    let first = ChangeFeedResponse {
        events,
        continuation: engine.change_feed_token(&at),
        // Each node's first batch's charge, summed.
        request_charge: charge,
    };
    let (messages, out) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        if messages.send(Ok(first)).await.is_err() {
            return;
        }
        let mut sent = Instant::now();
        let mut parts = select_all(parts);
        loop {
            // A client that left ends every part, even one whose node stopped answering.
            let message = tokio::select! {
                message = parts.next() => message,
                () = messages.closed() => return,
            };
            let message = match message {
                Some(Ok(message)) => message,
                Some(Err(status)) => {
                    let _ = messages.send(Err(status)).await;
                    return;
                }
                None => {
                    let _ = messages
                        .send(Err(Status::unavailable(
                            "a node's change feed ended; resume from the last continuation",
                        )))
                        .await;
                    return;
                }
            };
            if let Err(status) = moved(&engine, &mut at, &message) {
                let _ = messages.send(Err(status)).await;
                return;
            }
            if message.events.is_empty() && sent.elapsed() < HEARTBEAT {
                continue;
            }
            let merged = ChangeFeedResponse {
                events: message.events,
                continuation: engine.change_feed_token(&at),
                request_charge: message.request_charge,
            };
            if messages.send(Ok(merged)).await.is_err() {
                return;
            }
            sent = Instant::now();
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out)))
}

/// Moves `at` to the positions a part's `message` reached.
fn moved(
    engine: &engine::Engine,
    at: &mut ChangeFeedCursor,
    message: &ChangeFeedResponse,
) -> Result<(), Status> {
    let part = engine
        .open_change_feed_token(&message.continuation)
        .map_err(to_status)?;
    for &(shard, next) in part.positions() {
        at.advance(shard, next);
    }
    Ok(())
}
