//! Per-request limits at the HTTP level, for every RPC alike: a deadline for the request
//! message to arrive, a shared memory budget for responses waiting to be read, and the count
//! of requests in flight that the idle timeout reads.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use super::connection::{ConnectionInfo, InFlight};

/// The budget counts kibibytes, so that a `u32` of permits covers any response.
const UNIT: usize = 1024;

/// Applies the limits to every request of a service.
#[derive(Debug, Clone)]
pub(crate) struct RequestLimitsLayer {
    read_timeout: Duration,
    budget: Arc<Semaphore>,
    total_units: u32,
    budget_bytes: usize,
}

impl RequestLimitsLayer {
    pub(crate) fn new(read_timeout: Duration, budget_bytes: usize) -> Self {
        let total_units = u32::try_from(budget_bytes / UNIT).unwrap_or(u32::MAX);
        RequestLimitsLayer {
            read_timeout,
            budget: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            budget_bytes,
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

impl<S, B> Service<http::Request<tonic::body::Body>> for RequestLimits<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
    B: Body<Data = Bytes>,
{
    type Response = http::Response<Budgeted<B>>;
    type Error = S::Error;
    type Future = LimitsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let in_flight = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|c| c.activity.begin());
        let read_timeout = self.limits.read_timeout;
        let budgeted = streams_responses(request.uri().path());
        let request = request.map(|body| {
            tonic::body::Body::new(ReadDeadline {
                inner: body,
                deadline: Box::pin(tokio::time::sleep(read_timeout)),
                timeout: read_timeout,
            })
        });
        LimitsFuture {
            inner: self.inner.call(request),
            rest: Some((in_flight, budgeted.then(|| self.limits.clone()))),
        }
    }
}

/// Methods whose responses stream for as long as their reader takes: what the budget covers.
/// Unary answers are never refused (a write's answer reports what has already happened), and
/// health stays answerable whatever the load.
fn streams_responses(path: &str) -> bool {
    matches!(
        path,
        "/mayfly.v1.Documents/ReadFeed" | "/mayfly.v1.Documents/Query"
    ) || path.starts_with("/grpc.reflection.")
}

pin_project_lite::pin_project! {
    /// The response of a [`RequestLimits`] service.
    pub(crate) struct LimitsFuture<F> {
        #[pin]
        inner: F,
        rest: Option<(Option<InFlight>, Option<RequestLimitsLayer>)>,
    }
}

impl<F, B, E> Future for LimitsFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Budgeted<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let Some((in_flight, limits)) = this.rest.take() else {
            unreachable!("a future is not polled after it completes")
        };
        Poll::Ready(Ok(response.map(|body| Budgeted {
            inner: body,
            limits,
            charge: None,
            slicing: Bytes::new(),
            refused: false,
            _in_flight: in_flight,
        })))
    }
}

/// A request body that fails with DEADLINE_EXCEEDED if it has not arrived by the deadline.
/// Handlers take their one message before they run, so the deadline only covers uploads.
struct ReadDeadline {
    inner: tonic::body::Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl Body for ReadDeadline {
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
    /// A response body charged against the shared budget for the largest message it has
    /// sent, from that message until the body ends: the encoder keeps a buffer of that size
    /// (up to twice it, as it grows by doubling) for the stream's life, and a reader that
    /// stops reading keeps the stream alive.
    /// Messages go to HTTP/2 in copied slices, so that what HTTP/2 holds once the body has
    /// moved on is a slice or two, never a whole page.
    pub(crate) struct Budgeted<B> {
        #[pin]
        inner: B,
        limits: Option<RequestLimitsLayer>,
        charge: Option<OwnedSemaphorePermit>,
        slicing: Bytes,
        refused: bool,
        _in_flight: Option<InFlight>,
    }
}

/// Largest data frame handed to HTTP/2 at once.
const SLICE: usize = 32 * 1024;

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
        if !this.slicing.is_empty() {
            let n = this.slicing.len().min(SLICE);
            let slice = Bytes::copy_from_slice(&this.slicing[..n]);
            this.slicing.advance(n);
            if this.slicing.is_empty() {
                *this.slicing = Bytes::new();
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
        // The encoder's buffer grows by doubling: it may hold up to twice the message.
        if let Some(limits) = this.limits.as_ref() {
            // The encoder's buffer grows by doubling: it may hold up to twice the message. A
            // response alone may always have the whole budget, so none is refused forever.
            let units = u32::try_from((2 * frame.len()).div_ceil(UNIT))
                .unwrap_or(u32::MAX)
                .min(limits.total_units);
            let held = this
                .charge
                .as_ref()
                .map_or(0, |c| u32::try_from(c.num_permits()).unwrap_or(u32::MAX));
            if units > held {
                match limits.budget.clone().try_acquire_many_owned(units - held) {
                    Ok(more) => match this.charge {
                        Some(charge) => charge.merge(more),
                        None => *this.charge = Some(more),
                    },
                    Err(_) => {
                        *this.refused = true;
                        return Poll::Ready(Some(Ok(Frame::trailers(exhausted(
                            limits.budget_bytes,
                        )))));
                    }
                }
            }
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

/// The trailers that end a response the budget cannot hold.
fn exhausted(budget_bytes: usize) -> http::HeaderMap {
    let status = Status::resource_exhausted(format!(
        "the server's memory for responses waiting to be read ({} MiB, --response-budget-mb) is \
         in use by other clients; retry later (a feed or query resumes from its last \
         continuation)",
        budget_bytes / (1024 * 1024)
    ));
    let mut trailers = http::HeaderMap::new();
    // Only fails on a message that cannot be a header, which this one can.
    let _ = status.add_header(&mut trailers);
    trailers
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;

    use super::*;

    fn budgeted(
        chunks: Vec<usize>,
        limits: &RequestLimitsLayer,
    ) -> Budgeted<impl Body<Data = Bytes, Error = Infallible>> {
        let frames = chunks
            .into_iter()
            .map(|n| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![0u8; n]))));
        Budgeted {
            inner: http_body_util::StreamBody::new(tokio_stream::iter(frames)),
            limits: Some(limits.clone()),
            charge: None,
            slicing: Bytes::new(),
            refused: false,
            _in_flight: None,
        }
    }

    #[tokio::test]
    async fn a_response_is_charged_its_largest_message_until_it_ends() {
        let limits = RequestLimitsLayer::new(Duration::from_secs(1), 128 * UNIT);
        let mut first = budgeted(vec![40 * UNIT, 10], &limits);
        let mut sent = 0;
        // The 40 KiB message leaves in slices, charged whole from its first slice.
        while sent < 40 * UNIT {
            let data = first.frame().await.expect("a frame").expect("data");
            let data = data.into_data().expect("data");
            assert!(data.len() <= SLICE);
            sent += data.len();
            assert_eq!(limits.budget.available_permits(), 48);
        }
        // A second response needs more than what is left: it ends with RESOURCE_EXHAUSTED.
        let mut second = budgeted(vec![30 * UNIT], &limits);
        let frame = second.frame().await.expect("a frame").expect("trailers");
        let trailers = frame.into_trailers().expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"8"[..])
        );
        assert!(second.frame().await.is_none(), "nothing after the status");
        // A smaller message later costs nothing more; the charge ends with the body.
        let _ = first.frame().await.expect("a frame").expect("data");
        assert_eq!(limits.budget.available_permits(), 48);
        assert!(first.frame().await.is_none());
        drop(first);
        assert_eq!(limits.budget.available_permits(), 128);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_stops_arriving_ends_at_the_deadline() {
        let stalled = http_body_util::StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, Status>,
        >());
        let mut body = ReadDeadline {
            inner: tonic::body::Body::new(stalled),
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(30))),
            timeout: Duration::from_secs(30),
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
}
