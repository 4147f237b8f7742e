//! The one driver of long-lived response streams: read feeds, queries and the change feed
//! differ only in how a page is computed ([`PageSource`]), and, for the change feed, in waiting
//! for something to send. Every page, the first included:
//! - is computed when the transport asks for the next message, that is once the one before has
//!   left, so a client that stops reading holds one page, not a queue of them;
//! - is authorized again, so a token that expired or a key regenerated ends the stream at its
//!   next page with UNAUTHENTICATED or PERMISSION_DENIED;
//! - reserves the memory its results take in the response budget before it holds them (see
//!   [`engine::PageMemory`]), so stalled streams cannot hold more than the budget;
//! - is read at its own clock reading: nothing expired by then appears on it;
//! - is tried on the async worker when small, else run on a blocking thread;
//! - stops when its client leaves (the stream is dropped) or the server shuts down, inside a
//!   document's evaluation if need be.

use std::{pin::Pin, sync::Arc, time::Duration};

use futures_util::future::BoxFuture;

use parking_lot::Mutex;
use tokio_stream::Stream;
use tonic::Status;

use super::{DocumentsService, status::to_status};
use crate::{
    CurrentEngine,
    auth::{Action, Authenticator, Target, authenticate_headers},
    engine::{
        self, Cancel, Engine, Outcome, PageMemory, PartitionKeyValue, QueryReads, RequestCharge,
    },
    net::{Charge, HTTP2_HOLDS, PeerShare, ResponseBudget},
    throughput_limit::Admitted,
};

/// A stream of pages, as the service's RPCs return it.
pub(super) type PageStream<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// How one kind of stream computes its pages.
pub(super) trait PageSource: Send + Sync + 'static {
    /// What a page is sent as.
    type Message: Send + 'static;
    /// Where a page starts.
    type Cursor: Clone + Send + Sync + 'static;

    /// What a page may do on the async worker before it is run again on a blocking thread
    /// (less on storage whose reads may wait, see [`DocumentsService::run_paged`]).
    fn inline(&self) -> QueryReads {
        QueryReads::inline()
    }

    /// The page at `at`, and where the next one starts (`None` after the last), within
    /// `reads`. Blocks on storage unless `reads` is inline.
    fn page(
        &self,
        engine: &Engine,
        at: &Self::Cursor,
        reads: QueryReads,
    ) -> Outcome<(Self::Message, Option<Self::Cursor>)>;

    /// Whether its collection's provisioned throughput pays for its pages: a stream whose
    /// pages are computed here (a relay of other nodes' pages is paid for there). Such a
    /// stream's pages are admitted by the budget, the first refused with a delay like any
    /// request, the next ones waiting it out, and each charged [`PageSource::charge`].
    fn pays(&self) -> bool {
        false
    }

    /// What a page cost.
    fn charge(&self, _message: &Self::Message) -> RequestCharge {
        RequestCharge::ZERO
    }

    /// Waits, at most `wait`, until the page at `at` may have something to send; `Ok(false)`
    /// when the wait ran out. A finite stream's pages are always ready.
    fn ready<'a>(
        &'a self,
        _engine: &'a Engine,
        _at: &'a Self::Cursor,
        _wait: Duration,
    ) -> BoxFuture<'a, Result<bool, engine::Error>> {
        Box::pin(std::future::ready(Ok(true)))
    }

    /// Whether a page is sent, or held back while its stream waits for more (a change feed
    /// page with no events, between heartbeats). A finite stream sends every page.
    fn send_empty(&self, _message: &Self::Message) -> bool {
        true
    }

    /// Whether its pages take their blocking threads from the bounded share (see
    /// [`super::blocking_pages`]): pages of bounded work, of which many streams may want one at
    /// the same instant (every change feed subscriber after a write). A query's page, which may
    /// scan a whole collection, takes its own thread, so as not to hold the share for long.
    fn bounded_blocking(&self) -> bool {
        false
    }

    /// Whether the next page is sent without waiting for [`PageSource::ready`] (a finite
    /// stream's, a change feed's first, or its heartbeat carrying its latest continuation).
    fn heartbeat_due(&self) -> bool {
        true
    }
}

/// How long a waiting stream goes between checks that its caller may still read and that the
/// server is not stopping.
const RECHECK_WAITING: Duration = Duration::from_secs(1);

/// What a stream's caller was allowed, checked again before every page.
#[derive(Debug, Clone)]
pub(super) struct Grant {
    auth: Authenticator,
    /// What a token is checked against: the databases and collections there are now.
    engine: CurrentEngine,
    /// The request's `authorization` value, as sent.
    authorization: Option<String>,
    database: String,
    collection: String,
    partition: Option<PartitionKeyValue>,
}

impl Grant {
    /// Reading documents of `database/collection` (of `partition` only, if given) of
    /// `engine`, by the caller whose request carried `headers`; checked now, and again before
    /// every page.
    pub(super) fn read(
        auth: &Authenticator,
        engine: &CurrentEngine,
        headers: &http::HeaderMap,
        database: &str,
        collection: &str,
        partition: Option<&PartitionKeyValue>,
    ) -> Result<Self, Status> {
        let grant = Grant {
            auth: auth.clone(),
            engine: engine.clone(),
            authorization: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            database: database.to_owned(),
            collection: collection.to_owned(),
            partition: partition.cloned(),
        };
        // The headers themselves, so that a malformed value gets the edge's own answer.
        authenticate_headers(auth, headers)?;
        grant.check()?;
        Ok(grant)
    }

    /// The collection the stream reads, if its names are valid ones.
    fn path(&self) -> Option<engine::CollectionPath> {
        super::convert::collection_path(&self.database, &self.collection).ok()
    }

    /// Whether the caller may still read what the stream reads: a token that expired, or
    /// whose database or collection was deleted since, ends the stream.
    fn check(&self) -> Result<(), Status> {
        let caller = self.auth.authenticate(self.authorization.as_deref())?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(
            Action::Read,
            Target::documents(&self.database, &self.collection, self.partition.as_ref()),
            &engine,
        )?;
        Ok(())
    }
}

/// Raises a call's [`Cancel`] when dropped: when its client leaves, the stream (or the
/// handler computing its first page) is dropped, and the work running for it stops.
#[derive(Debug)]
pub(super) struct CancelOnDrop(Cancel);

impl CancelOnDrop {
    /// A new call's signal, raised too when the server's `stop` is.
    pub(super) fn new(stop: &Cancel) -> Self {
        CancelOnDrop(stop.for_call())
    }

    pub(super) fn signal(&self) -> &Cancel {
        &self.0
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// How much a page's reservation grows by at a time.
const RESERVATION_STEP: usize = 64 * 1024;

/// A page's reservation in the response budget: what its stream holds once the page is handed
/// over, as the response layer charges it: twice the bytes it builds (values in memory now,
/// the encoder's buffer then) and HTTP/2's send buffer.
pub(super) struct Reservation {
    budget: ResponseBudget,
    share: Option<PeerShare>,
    charge: Mutex<Charge>,
    /// Why the budget last refused, for the client.
    refused: Mutex<Option<Status>>,
}

impl PageMemory for Reservation {
    fn hold(&self, bytes: usize) -> bool {
        let mut charge = self.charge.lock();
        // What the stream will hold once the page is handed over (see `net::HTTP2_HOLDS`),
        // in steps, so that a page of small documents takes the budget a few times, not once
        // per document.
        let held = bytes
            .saturating_mul(2)
            .saturating_add(HTTP2_HOLDS)
            .next_multiple_of(RESERVATION_STEP);
        match self.budget.reserve(&mut charge, self.share.as_ref(), held) {
            Ok(()) => true,
            Err(status) => {
                *self.refused.lock() = Some(status);
                false
            }
        }
    }
}

/// Where a stream is between messages.
enum Next<S: PageSource> {
    /// A page computed, held against the budget until the transport takes it.
    Ready(S::Message, Charge, Option<S::Cursor>),
    /// The page to compute next.
    At(S::Cursor),
    Done,
}

/// Everything a stream's pages share. Page work on a blocking thread holds it too, so the
/// guard that cancels that work is not in it: the stream (or the handler computing the first
/// page) owns the guard, and the call only its signal.
struct Call<S> {
    service: DocumentsService,
    source: S,
    grant: Grant,
    share: Option<PeerShare>,
    cancel: Cancel,
}

impl DocumentsService {
    /// A stream of `source`'s pages from `start`. The first is computed before answering, so
    /// that a bad request or token fails the call itself.
    pub(super) async fn open_stream<S: PageSource>(
        &self,
        grant: Grant,
        share: Option<PeerShare>,
        source: S,
        start: S::Cursor,
    ) -> Result<PageStream<S::Message>, Status> {
        let guard = CancelOnDrop::new(&self.stop);
        let call = Arc::new(Call {
            service: self.clone(),
            source,
            grant,
            share,
            cancel: guard.signal().clone(),
        });
        let (first, charge, next) = call.page(start, true).await?;
        let stream =
            futures_util::stream::unfold(Next::<S>::Ready(first, charge, next), move |next| {
                // Owned by the stream: dropped, with the stream, when its client leaves.
                let _guard = &guard;
                let call = call.clone();
                async move {
                    let at = match next {
                        Next::Done => return None,
                        Next::Ready(page, charge, next) => {
                            // Handed to the encoder now: the response's own charge covers it.
                            drop(charge);
                            return Some((Ok(page), next.map_or(Next::Done, Next::At)));
                        }
                        Next::At(at) => at,
                    };
                    Some(match call.page(at, false).await {
                        Ok((page, charge, next)) => {
                            drop(charge);
                            (Ok(page), next.map_or(Next::Done, Next::At))
                        }
                        Err(status) => (Err(status), Next::Done),
                    })
                }
            });
        Ok(Box::pin(stream))
    }

    /// Runs `op` (a page, or a query's whole run) with the engine in service and waits until
    /// what it reflects is durable. It is tried here, on the async worker, within
    /// [`engine::INLINE_READS`] storage reads ([`engine::INLINE_READS_MAY_BLOCK`] on storage
    /// whose reads may wait on the disk, as a point read's one read does); one that needs more
    /// runs on a blocking thread without that limit. Either stops once `cancel` is raised.
    pub(super) async fn run_paged<T: Send + 'static>(
        &self,
        (inline, cancel, bounded): (QueryReads, &Cancel, bool),
        memory: Option<&Arc<Reservation>>,
        op: impl Fn(&Engine, QueryReads) -> Outcome<T> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.engine()?;
        let mut reads = inline.cancelled_by(cancel.clone());
        if engine.reads_may_block() {
            reads = reads.at_most(engine::INLINE_READS_MAY_BLOCK);
        }
        if let Some(memory) = memory {
            reads = reads.reserving_in(memory.clone());
        }
        let inline = op(&engine, reads);
        let outcome =
            (!matches!(inline.result, Err(engine::Error::ReadBudgetSpent))).then_some(inline);
        let outcome = match outcome {
            Some(inline) => inline,
            None => {
                let worker = engine.clone();
                let (cancel, memory) = (cancel.clone(), memory.cloned());
                // Waited for here, on the async worker: a stream beyond the bound waits for a
                // thread without holding one. (The semaphore is never closed.)
                let permit = match bounded {
                    true => self.blocking_pages.clone().acquire_owned().await.ok(),
                    false => None,
                };
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    // Made here: time spent waiting for a thread is not the run's.
                    let mut reads = QueryReads::unlimited().cancelled_by(cancel);
                    if let Some(memory) = memory {
                        reads = reads.reserving_in(memory);
                    }
                    op(&worker, reads)
                })
                .await
                .map_err(|e| Status::internal(format!("page task failed: {e}")))?
            }
        };
        engine.settle(outcome).await.map_err(|e| match e {
            // The budget's own words: which limit, and which flag sets it.
            engine::Error::NoMemory => memory
                .and_then(|m| m.refused.lock().take())
                .unwrap_or_else(|| to_status(e)),
            e => to_status(e),
        })
    }
}

impl<S: PageSource> Call<S> {
    /// The page at `at`, with its reservation, after checking that the caller may still read
    /// it and that the server is not stopping.
    async fn page(
        self: &Arc<Self>,
        mut at: S::Cursor,
        first: bool,
    ) -> Result<(S::Message, Charge, Option<S::Cursor>), Status> {
        loop {
            if let Some(reason) = self.cancel.reason() {
                return Err(to_status(reason));
            }
            self.grant.check()?;
            // A page due anyway (a finite stream's, a first, or a heartbeat) is computed at
            // once, with what is ready by then; else the stream waits for something to send.
            let due = self.source.heartbeat_due();
            let wait = if due { Duration::ZERO } else { RECHECK_WAITING };
            let engine = self.service.engine()?;
            match self.source.ready(&engine, &at, wait).await {
                Ok(ready) if ready || due => {}
                Ok(_) => continue,
                // A collection deleted meanwhile is the grant's NOT_FOUND.
                Err(e) => {
                    self.grant.check()?;
                    return Err(to_status(e));
                }
            }
            let admitted = match self.admitted(&engine, first).await? {
                Some(admitted) => admitted,
                // Throttled, and waited: asked again.
                None => continue,
            };
            drop(engine);
            let (page, charge, next) = self.compute(at.clone()).await?;
            if let Some(admitted) = admitted {
                admitted.charge_now(self.source.charge(&page));
            }
            match next {
                Some(next) if !self.source.send_empty(&page) => at = next,
                next => return Ok((page, charge, next)),
            }
        }
    }

    /// Admission of a page by its collection's throughput, for a stream that pays for its
    /// pages: `Some(None)` without a budget, `Some(Some(_))` admitted, `None` after waiting
    /// out a refusal (a page after the first; the first is refused like any request).
    async fn admitted(
        self: &Arc<Self>,
        engine: &Engine,
        first: bool,
    ) -> Result<Option<Option<Admitted>>, Status> {
        let Some(path) = self.grant.path().filter(|_| self.source.pays()) else {
            return Ok(Some(None));
        };
        match self.service.admission(engine, &path) {
            Ok(admitted) => Ok(Some(admitted)),
            Err((status, _)) if first => Err(status),
            Err((_, wait)) => {
                // At most a second at a time: the page loop checks for a stop between.
                tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
                Ok(None)
            }
        }
    }

    /// The page at `at`, with its reservation.
    async fn compute(
        self: &Arc<Self>,
        at: S::Cursor,
    ) -> Result<(S::Message, Charge, Option<S::Cursor>), Status> {
        let reservation = Arc::new(Reservation {
            budget: self.service.budget.clone(),
            share: self.share.clone(),
            charge: Mutex::new(Charge::default()),
            refused: Mutex::new(None),
        });
        let call = self.clone();
        let (page, next) = self
            .service
            .run_paged(
                (
                    self.source.inline(),
                    &self.cancel,
                    self.source.bounded_blocking(),
                ),
                Some(&reservation),
                move |e, reads| call.source.page(e, &at, reads),
            )
            .await?;
        let charge = std::mem::take(&mut *reservation.charge.lock());
        Ok((page, charge, next))
    }
}
