//! Per-request limits at the HTTP level, for every RPC alike: the caller's key checked before
//! any of its request is read, a deadline and a shared memory budget for request messages on
//! their way in, a shared memory budget for responses waiting to be read (each budget with a
//! share per client address; responses with a deadline for the client to take them), the
//! count of calls with a key in flight that the idle timeout reads, and reasons for the
//! refusals that tonic makes without one (a message over the size limit, a health request
//! that does not decode).

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use futures_util::future::{Either, Ready};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower_layer::Layer;
use tower_service::Service;

use super::{
    Limits, MAX_MESSAGE_BYTES,
    budget::{Budgets, Charge, PeerShare, RequestBudget, ResponseBudget},
    connection::{Activity, ConnectionInfo, InFlight, Progress},
};
use crate::auth::{Authenticator, authenticate_headers};

/// Applies the limits to every request of a service.
#[derive(Debug, Clone)]
pub(crate) struct RequestLimitsLayer {
    read_timeout: Duration,
    budgets: Budgets,
    auth: Authenticator,
}

/// The largest request message of the services that need no key (health, reflection).
pub(crate) const OPEN_MESSAGE_BYTES: usize = 64 * 1024;

impl RequestLimitsLayer {
    pub(crate) fn new(limits: &Limits, budgets: &Budgets, auth: Authenticator) -> Self {
        RequestLimitsLayer {
            read_timeout: limits.request_read_timeout,
            budgets: budgets.clone(),
            auth,
        }
    }
}

impl<S> Layer<S> for RequestLimitsLayer {
    type Service = RequestLimits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestLimits {
            inner,
            limits: self.clone(),
        }
    }
}

/// See [`RequestLimitsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RequestLimits<S> {
    inner: S,
    limits: RequestLimitsLayer,
}

type Response = http::Response<tonic::body::Body>;

impl<S> Service<http::Request<tonic::body::Body>> for RequestLimits<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = Response>,
{
    type Response = http::Response<Budgeted<tonic::body::Body>>;
    type Error = S::Error;
    type Future = LimitsFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let path = request.uri().path();
        let streaming = streams_responses(path);
        // Mayfly's own services need a key; health and reflection stay open. Checked here,
        // before the request message is read, so that an unknown caller cannot have the
        // server buffer (up to 16 MiB of) it; the service checks again when it runs.
        let keyed = path.starts_with("/mayfly.");
        if keyed && let Err(denied) = authenticate_headers(&self.limits.auth, request.headers()) {
            let status = Status::from(denied);
            return LimitsFuture {
                inner: Either::Right(futures_util::future::ready(Ok(status.into_http()))),
                health: false,
                rest: Some((None, None, None)),
            };
        }
        // Only calls with a key keep their connection open: one carrying nothing but calls
        // that need none (a health Watch lasts as long as its client likes) or calls refused
        // for want of one is as idle as a silent one, and holds its place under the
        // connection limits no longer.
        let in_flight = connection
            .as_ref()
            .filter(|_| keyed)
            .map(|c| c.activity.begin());
        // Callers without a key stream from a budget of their own, so that they cannot take
        // the memory of those with one.
        let charging = streaming.then(|| match keyed {
            true => Charging {
                budget: self.limits.budgets.responses.clone(),
                share: connection.as_ref().map(|c| c.share.clone()),
            },
            false => Charging {
                budget: self.limits.budgets.open_responses.clone(),
                share: connection.as_ref().map(|c| c.open_response_share.clone()),
            },
        });
        let read_timeout = self.limits.read_timeout;
        let (requests, share, largest) = if keyed {
            (
                self.limits.budgets.requests.clone(),
                connection.as_ref().map(|c| c.request_share.clone()),
                MAX_MESSAGE_BYTES,
            )
        } else {
            (
                self.limits.budgets.open_requests.clone(),
                connection.as_ref().map(|c| c.open_request_share.clone()),
                OPEN_MESSAGE_BYTES,
            )
        };
        let activity = connection.map(|c| c.activity);
        let health = path.starts_with("/grpc.health.v1.Health/");
        let request = request.map(|body| {
            tonic::body::Body::new(Upload {
                inner: body,
                deadline: Box::pin(tokio::time::sleep(read_timeout)),
                timeout: read_timeout,
                framing: Framing::default(),
                budget: requests,
                share,
                largest,
                charge: Charge::default(),
            })
        });
        LimitsFuture {
            inner: Either::Left(self.inner.call(request)),
            health,
            rest: Some((in_flight, charging, activity)),
        }
    }
}

/// Methods whose responses stream for as long as their reader takes: what the budget covers.
/// Unary answers are never refused (a write's answer reports what has already happened), and
/// health stays answerable whatever the load.
fn streams_responses(path: &str) -> bool {
    matches!(
        path,
        "/mayfly.v1.Documents/ReadFeed"
            | "/mayfly.v1.Documents/Query"
            | "/mayfly.v1.Documents/ChangeFeed"
            | "/mayfly.v1.Cluster/GatherDocuments"
    ) || path.starts_with("/grpc.reflection.")
}

/// How a streaming response is charged.
#[derive(Debug)]
struct Charging {
    budget: ResponseBudget,
    share: Option<PeerShare>,
}

pin_project_lite::pin_project! {
    /// The response of a [`RequestLimits`] service.
    pub(crate) struct LimitsFuture<F, E> {
        #[pin]
        inner: Either<F, Ready<Result<Response, E>>>,
        // A call of grpc.health.v1.Health, whose refusals get Mayfly's reasons here.
        health: bool,
        rest: Option<(Option<InFlight>, Option<Charging>, Option<Arc<Activity>>)>,
    }
}

impl<F, E> Future for LimitsFuture<F, E>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<http::Response<Budgeted<tonic::body::Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if *this.health {
            response = undecodable_health_request(response);
        }
        let Some((in_flight, charging, activity)) = this.rest.take() else {
            unreachable!("a future is not polled after it completes")
        };
        Poll::Ready(Ok(response.map(|body| {
            Budgeted::new(body, charging, activity.as_deref(), in_flight)
        })))
    }
}

/// tonic-health decodes its requests with prost's codec, which answers a request that does not
/// decode INTERNAL (the code Mayfly keeps for its own failures) before the service is called,
/// in a response of headers only. Nothing else in a health call is INTERNAL (the service
/// answers OK or NOT_FOUND), so such an answer becomes INVALID_ARGUMENT with the reason every
/// Mayfly service gives an undecodable request.
fn undecodable_health_request(response: Response) -> Response {
    match Status::from_header_map(response.headers()) {
        Some(status) if status.code() == Code::Internal => {
            mayfly_proto::codec::undecodable(status.message()).into_http()
        }
        _ => response,
    }
}

/// `ErrorInfo.reason` of a request message longer than its method takes.
pub(crate) const MESSAGE_TOO_LARGE: &str = "MESSAGE_TOO_LARGE";

/// RESOURCE_EXHAUSTED (what gRPC answers a message over the receiver's limit), with the reason
/// [`MESSAGE_TOO_LARGE`]: a request message of `declared` bytes where the method takes
/// `largest`. tonic would say OUT_OF_RANGE with no reason; this is said first, unread.
fn message_too_large(declared: usize, largest: usize) -> Status {
    let advice = if largest >= MAX_MESSAGE_BYTES {
        "send less in one request: a document is at most 2 MiB of JSON, and a batch that \
         does not fit in one message can be sent as several"
    } else {
        "health and reflection requests are small: this one is not what a client sends"
    };
    let limit = if largest.is_multiple_of(1024 * 1024) {
        format!("{} MiB", largest / (1024 * 1024))
    } else {
        format!("{} KiB", largest / 1024)
    };
    let details = ErrorDetails::with_error_info(
        MESSAGE_TOO_LARGE,
        mayfly_proto::ERROR_DOMAIN,
        HashMap::<String, String>::new(),
    );
    Status::with_error_details(
        Code::ResourceExhausted,
        format!(
            "the request message is {declared} bytes, more than the {largest} bytes ({limit}) \
             a message to this method may have; {advice}"
        ),
        details,
    )
}

/// Where a request body is in gRPC's framing: each message is a flag byte and a 4-byte
/// big-endian length, then that many bytes.
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    header_read: usize,
    /// Bytes of the current message still to come.
    remaining: usize,
    /// The longest message declared so far.
    longest: usize,
}

impl Framing {
    /// Reads `data`; returns the declared lengths of the messages it starts, summed.
    fn started(&mut self, mut data: &[u8]) -> usize {
        let mut declared = 0usize;
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.header_read).min(data.len());
            self.header[self.header_read..self.header_read + n].copy_from_slice(&data[..n]);
            self.header_read += n;
            data = &data[n..];
            if self.header_read == 5 {
                self.header_read = 0;
                let [_, a, b, c, d] = self.header;
                self.remaining = u32::from_be_bytes([a, b, c, d]) as usize;
                self.longest = self.longest.max(self.remaining);
                declared = declared.saturating_add(self.remaining);
            }
        }
        declared
    }
}

/// A request body that fails with DEADLINE_EXCEEDED if it has not arrived by the deadline, and
/// with RESOURCE_EXHAUSTED if it declares a message longer than its method takes
/// ([`MESSAGE_TOO_LARGE`]) or if the request budget cannot hold the messages it declares (the
/// decoder reserves a message's declared length as soon as it reads it).
/// Handlers take their one message before they run, so the deadline only covers uploads.
struct Upload {
    inner: tonic::body::Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    framing: Framing,
    budget: RequestBudget,
    /// The caller's address's share of `budget`.
    share: Option<PeerShare>,
    /// The method's message size limit: a message declared longer is refused unread (the
    /// services' decoders, which would refuse it without a reason, have limits no lower).
    largest: usize,
    charge: Charge,
}

impl Body for Upload {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                    "the request message did not arrive within {} s of the call's start \
                     (the server's --request-read-timeout)",
                    this.timeout.as_secs_f64()
                )))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let declared = this.framing.started(data).min(this.largest);
                    if this.framing.longest > this.largest {
                        let status = message_too_large(this.framing.longest, this.largest);
                        return Poll::Ready(Some(Err(status)));
                    }
                    if let Err(status) =
                        this.budget
                            .take(&mut this.charge, this.share.as_ref(), declared)
                    {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            ready => ready,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A response body, watched for the send timeout; a streaming one is charged against the
    /// shared budget for the largest message it has sent, from that message until the body
    /// ends: the encoder keeps a buffer of that size (up to twice it, as it grows by
    /// doubling) for the stream's life, and a reader that stops reading keeps the stream
    /// alive, for the send timeout at most.
    /// Messages go to HTTP/2 in copied slices, so that what HTTP/2 holds once the body has
    /// moved on is a slice or two, never a whole page.
    pub(crate) struct Budgeted<B> {
        #[pin]
        inner: B,
        charging: Option<Charging>,
        charge: Charge,
        progress: Option<Arc<Progress>>,
        slicing: Bytes,
        refused: bool,
        _in_flight: Option<InFlight>,
    }
}

impl<B> Budgeted<B> {
    fn new(
        inner: B,
        charging: Option<Charging>,
        activity: Option<&Activity>,
        in_flight: Option<InFlight>,
    ) -> Self {
        Budgeted {
            inner,
            charging,
            charge: Charge::default(),
            // Watched from the start: a client that grants no window at all never has its
            // response polled, yet the handler has its answer (or a first page) in memory.
            progress: activity.map(Activity::track),
            slicing: Bytes::new(),
            refused: false,
            _in_flight: in_flight,
        }
    }
}

/// Largest data frame handed to HTTP/2 at once: one DATA frame at HTTP/2's default frame
/// size.
const SLICE: usize = 16 * 1024;

/// HTTP/2's send buffer for one stream, as the server sets it (see `net::serve`): hyper asks a
/// body for its next slice while the stream buffers less than this.
pub(crate) const SEND_BUFFER: usize = SLICE;

/// The most HTTP/2 holds for one stream whose client does not take what it is sent: a full
/// send buffer, less a byte, the slice handed over then, and the next one, which hyper takes
/// from the body before it waits for room.
pub(crate) const HTTP2_HOLDS: usize = SEND_BUFFER + 2 * SLICE;

impl<B: Body<Data = Bytes>> Body for Budgeted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if *this.refused {
            return Poll::Ready(None);
        }
        if let Some(progress) = this.progress.as_ref() {
            progress.go_on();
        }
        if !this.slicing.is_empty() {
            let n = this.slicing.len().min(SLICE);
            let slice = Bytes::copy_from_slice(&this.slicing[..n]);
            this.slicing.advance(n);
            if this.slicing.is_empty() {
                *this.slicing = Bytes::new();
            }
            if let Some(progress) = this.progress.as_ref() {
                progress.wait();
            }
            return Poll::Ready(Some(Ok(Frame::data(slice))));
        }
        let frame = ready!(this.inner.poll_frame(cx));
        let Some(Ok(frame)) = frame else {
            return Poll::Ready(frame);
        };
        let frame = match frame.into_data() {
            Ok(data) => data,
            Err(other) => return Poll::Ready(Some(Ok(other))),
        };
        if let Some(charging) = this.charging.as_ref() {
            // The encoder's buffer grows by doubling: it may hold up to twice the message;
            // HTTP/2 holds what it was handed and could not send (`HTTP2_HOLDS` at most).
            if let Err(status) = charging.budget.grow(
                this.charge,
                charging.share.as_ref(),
                2 * frame.len() + HTTP2_HOLDS,
            ) {
                *this.refused = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
            }
        }
        if let Some(progress) = this.progress.as_ref() {
            progress.wait();
        }
        // Copied even when small: a slice of the encoder's buffer would keep all of it alive
        // for as long as HTTP/2 holds the slice.
        if frame.len() <= SLICE {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(&frame)))));
        }
        *this.slicing = frame;
        let slice = Bytes::copy_from_slice(&this.slicing[..SLICE]);
        this.slicing.advance(SLICE);
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.refused || (self.slicing.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.refused {
            SizeHint::with_exact(0)
        } else {
            let mut hint = self.inner.size_hint();
            let pending = self.slicing.len() as u64;
            hint.set_lower(hint.lower() + pending);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + pending);
            }
            hint
        }
    }
}

/// The trailers that end a response with `status`.
fn trailers(status: &Status) -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    // Only fails on a message that cannot be a header, which these are not.
    let _ = status.add_header(&mut trailers);
    trailers
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;

    use super::*;
    use crate::net::budget::UNIT;

    fn budgeted(
        chunks: Vec<usize>,
        budget: &ResponseBudget,
        activity: Option<Arc<Activity>>,
    ) -> Budgeted<impl Body<Data = Bytes, Error = Infallible>> {
        let frames = chunks
            .into_iter()
            .map(|n| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![0u8; n]))));
        Budgeted::new(
            http_body_util::StreamBody::new(tokio_stream::iter(frames)),
            Some(Charging {
                budget: budget.clone(),
                share: None,
            }),
            activity.as_deref(),
            None,
        )
    }

    #[tokio::test]
    async fn a_response_is_charged_its_largest_message_until_it_ends() {
        let budget = ResponseBudget::new(1024 * UNIT, 1024 * UNIT);
        let mut first = budgeted(vec![40 * UNIT, 10], &budget, None);
        let mut sent = 0;
        // The 40 KiB message leaves in slices, charged whole (twice, and HTTP/2's send
        // buffer) from its first slice.
        let left = 1024 - 80 - HTTP2_HOLDS / UNIT;
        while sent < 40 * UNIT {
            let data = first.frame().await.expect("a frame").expect("data");
            let data = data.into_data().expect("data");
            assert!(data.len() <= SLICE);
            sent += data.len();
            assert_eq!(budget.available_units(), left);
        }
        // A second response needs more than what is left: it ends with RESOURCE_EXHAUSTED.
        let mut second = budgeted(vec![(left / 2) * UNIT], &budget, None);
        let frame = second.frame().await.expect("a frame").expect("trailers");
        let trailers = frame.into_trailers().expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"8"[..])
        );
        assert!(second.frame().await.is_none(), "nothing after the status");
        // A smaller message later costs nothing more; the charge ends with the body.
        let _ = first.frame().await.expect("a frame").expect("data");
        assert_eq!(budget.available_units(), left);
        assert!(first.frame().await.is_none());
        drop(first);
        assert_eq!(budget.available_units(), 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_its_client_stops_taking_closes_its_connection() {
        let budget = ResponseBudget::new(1024 * UNIT, 1024 * UNIT);
        let watched = || {
            let activity = Arc::new(Activity::new());
            activity.watch_sends(Duration::from_secs(60));
            activity
        };
        let activity = watched();
        let mut body = budgeted(vec![10, 10, 10], &budget, Some(activity.clone()));
        // Taken promptly: nothing happens, however long the stream lives.
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            body.frame().await.expect("a frame").expect("data");
        }
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert!(!activity.is_closing());
        // Then the transport asks for nothing more (the client grants no window).
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(activity.is_closing(), "closed once the send timeout passed");
        // A body taken to its end is forgotten: its connection stays open.
        let other = watched();
        let mut short = budgeted(vec![10], &budget, Some(other.clone()));
        short.frame().await.expect("a frame").expect("data");
        assert!(short.frame().await.is_none());
        drop(short);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(!other.is_closing());
        // A response the transport never polls at all (the client grants no window).
        let unpolled = watched();
        let _never = budgeted(vec![10], &budget, Some(unpolled.clone()));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!unpolled.is_closing());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(unpolled.is_closing());
    }

    #[test]
    fn request_framing_is_followed_across_frames() {
        let mut framing = Framing::default();
        let message = |len: u32| {
            let mut m = vec![0u8];
            m.extend_from_slice(&len.to_be_bytes());
            m.extend(std::iter::repeat_n(7u8, len as usize));
            m
        };
        let mut stream = message(300);
        stream.extend(message(0));
        stream.extend(message(16 << 20));
        // Split at awkward places: inside a header, between messages.
        assert_eq!(framing.started(&stream[..3]), 0);
        assert_eq!(framing.started(&stream[3..200]), 300);
        assert_eq!(framing.started(&stream[200..308]), 0);
        assert_eq!(framing.started(&stream[308..]), 16 << 20);
        assert_eq!(framing.remaining, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_stops_arriving_ends_at_the_deadline() {
        let stalled = http_body_util::StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, Status>,
        >());
        let mut body = Upload {
            inner: tonic::body::Body::new(stalled),
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(30))),
            timeout: Duration::from_secs(30),
            framing: Framing::default(),
            budget: RequestBudget::new(16 << 20, 16 << 20),
            share: None,
            largest: MAX_MESSAGE_BYTES,
            charge: Charge::default(),
        };
        let started = tokio::time::Instant::now();
        let err = body
            .frame()
            .await
            .expect("a frame")
            .expect_err("the deadline");
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
        assert!(
            err.message().contains("--request-read-timeout"),
            "{}",
            err.message()
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_request_declaring_more_than_the_budget_has_is_refused_unread() {
        let budget = RequestBudget::new(16 << 20, 16 << 20);
        let upload = |len: u32| {
            let mut header = vec![0u8];
            header.extend_from_slice(&len.to_be_bytes());
            let frames = vec![Ok::<_, Status>(Frame::data(Bytes::from(header)))];
            Upload {
                inner: tonic::body::Body::new(http_body_util::StreamBody::new(tokio_stream::iter(
                    frames,
                ))),
                deadline: Box::pin(tokio::time::sleep(Duration::from_secs(30))),
                timeout: Duration::from_secs(30),
                framing: Framing::default(),
                budget: budget.clone(),
                share: None,
                largest: MAX_MESSAGE_BYTES,
                charge: Charge::default(),
            }
        };
        let mut first = upload(10 << 20);
        first.frame().await.expect("a frame").expect("declared");
        let mut second = upload(10 << 20);
        let err = second.frame().await.expect("a frame").expect_err("no room");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        drop(first);
        let mut third = upload(10 << 20);
        third.frame().await.expect("a frame").expect("room again");
    }
}
