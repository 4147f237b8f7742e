//! One accepted client connection: plain TCP or TLS over it, counted against the connection
//! limits while it lives, and closed once it has carried no request for the idle timeout (or
//! sent none at all within the first-request timeout). Only calls with a key (or resource
//! token) count as requests here: calls that need none (health, reflection) and calls refused
//! for want of one leave a connection as idle as a silent one.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use super::{budget::PeerShare, slots::Slot};

/// How long a connection that seemed idle but just received bytes gets before another look.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// A client connection as the gRPC transport sees it.
#[derive(Debug)]
pub(crate) struct Connection {
    io: Io,
    info: ConnectionInfo,
    timeouts: Timeouts,
    idle_check: Pin<Box<Sleep>>,
    /// Bytes arrived since the idle check last looked: a request may be on its way to the
    /// service without being counted yet.
    read_since_check: bool,
    /// The activity mark at which a second look was last granted: once per change, so that
    /// bytes trickling in (PINGs) cannot keep an idle connection open.
    graced_at: Option<u64>,
    /// A place under the connection limits, given back when the connection closes.
    _slot: Slot,
}

/// When a connection is closed for what its client does not do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// A response its client takes nothing of for this long closes the connection.
    pub(crate) send: Duration,
    /// Once it has carried a request.
    pub(crate) idle: Duration,
    /// Before its first request: a client that connects and never asks holds a place under
    /// the limits for this long only.
    pub(crate) first_request: Duration,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// What requests learn of their connection (through the request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// Its address's share of the response budget.
    pub(crate) share: PeerShare,
    /// Its address's share of the request budget.
    pub(crate) request_share: PeerShare,
    /// Its address's share of the request budget of health and reflection.
    pub(crate) open_request_share: PeerShare,
    /// Its address's share of the response budget of reflection.
    pub(crate) open_response_share: PeerShare,
    pub(crate) activity: Arc<Activity>,
}

/// Requests (calls with a key) in flight on a connection, and when the last one started or
/// ended.
#[derive(Debug)]
pub(crate) struct Activity {
    opened: Instant,
    /// Whether a request has started on the connection.
    used: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened`.
    last_change_ms: AtomicU64,
    /// Set to have the connection closed; `closer` wakes its reader to do it.
    closing: AtomicBool,
    closer: AtomicWaker,
    /// Responses on the connection, for the send timeout.
    responses: Mutex<Vec<Weak<Progress>>>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            opened: Instant::now(),
            used: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            closer: AtomicWaker::new(),
            responses: Mutex::new(Vec::new()),
        }
    }

    /// Changes whenever a request starts or ends.
    fn mark(&self) -> u64 {
        self.last_change_ms.load(Ordering::Relaxed)
    }

    /// Watches a new response for the send timeout, from now: it has to be taken from.
    pub(crate) fn track(&self) -> Arc<Progress> {
        let progress = Arc::new(Progress::new());
        progress.wait();
        self.responses.lock().push(Arc::downgrade(&progress));
        progress
    }

    /// Closes the connection once one of its responses has waited `timeout` for the client to
    /// take from it: HTTP/2 gives the server no other way to end a stream it no longer polls,
    /// and the transport, blocked on writing, might not read either. One task per connection,
    /// ending with it.
    pub(crate) fn watch_sends(self: &Arc<Self>, timeout: Duration) {
        let activity = Arc::downgrade(self);
        let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(activity) = activity.upgrade() else {
                    return;
                };
                let now = Instant::now();
                let stalled = {
                    let mut responses = activity.responses.lock();
                    responses.retain(|r| r.strong_count() > 0);
                    responses
                        .iter()
                        .filter_map(Weak::upgrade)
                        .any(|r| r.due(timeout).is_some_and(|due| due <= now))
                };
                if stalled {
                    tracing::info!(
                        timeout_s = timeout.as_secs_f64(),
                        "closing a connection whose client took nothing of a response for \
                         --send-timeout"
                    );
                    activity.close();
                    return;
                }
            }
        });
    }

    #[cfg(test)]
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Has the connection closed, with every request on it.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.closer.wake();
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_change_ms.store(ms, Ordering::Relaxed);
    }

    /// Counts a request until the returned guard (kept with its response) is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.used.store(true, Ordering::Relaxed);
        self.touch();
        InFlight(self.clone())
    }

    /// When the connection is due to close if nothing starts meanwhile; `None` while a
    /// request is in flight.
    fn idle_due(&self, timeouts: Timeouts) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if !self.used.load(Ordering::Relaxed) {
            return Some(self.opened + timeouts.first_request.min(timeouts.idle));
        }
        let since =
            self.opened + Duration::from_millis(self.last_change_ms.load(Ordering::Relaxed));
        Some(since + timeouts.idle)
    }
}

/// When a response last handed the transport a frame that the transport has not yet asked to
/// follow: it asks once the client has made room (HTTP/2 flow control), so a client that reads
/// nothing leaves the response waiting here.
#[derive(Debug)]
pub(crate) struct Progress {
    base: Instant,
    /// Milliseconds after `base`; `u64::MAX` while not waiting.
    waiting_since_ms: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Progress {
            base: Instant::now(),
            waiting_since_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// The response waits for the transport to ask for more.
    pub(crate) fn wait(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.waiting_since_ms.store(ms, Ordering::Relaxed);
    }

    /// The transport asked: whatever comes next is the response's own doing.
    pub(crate) fn go_on(&self) {
        self.waiting_since_ms.store(u64::MAX, Ordering::Relaxed);
    }

    /// When the response will have waited `timeout`, if it is waiting.
    fn due(&self, timeout: Duration) -> Option<Instant> {
        match self.waiting_since_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(self.base + Duration::from_millis(ms) + timeout),
        }
    }
}

/// A request in flight, from its headers until its response has been handed to the transport.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection {
    pub(crate) fn plain(
        stream: TcpStream,
        remote: SocketAddr,
        timeouts: Timeouts,
        slot: Slot,
    ) -> Self {
        Self::new(Io::Plain(stream), remote, timeouts, slot)
    }

    pub(crate) fn tls(
        stream: TlsStream<TcpStream>,
        remote: SocketAddr,
        timeouts: Timeouts,
        slot: Slot,
    ) -> Self {
        Self::new(Io::Tls(Box::new(stream)), remote, timeouts, slot)
    }

    fn new(io: Io, remote: SocketAddr, timeouts: Timeouts, slot: Slot) -> Self {
        let activity = Arc::new(Activity::new());
        activity.watch_sends(timeouts.send);
        Connection {
            io,
            info: ConnectionInfo {
                remote,
                share: slot.shares().responses.clone(),
                request_share: slot.shares().requests.clone(),
                open_request_share: slot.shares().open_requests.clone(),
                open_response_share: slot.shares().open_responses.clone(),
                activity,
            },
            timeouts,
            idle_check: Box::pin(tokio::time::sleep(
                timeouts.first_request.min(timeouts.idle),
            )),
            read_since_check: false,
            graced_at: None,
            _slot: slot,
        }
    }

    /// Whether the connection has been idle for the timeout. The transport always has a read
    /// pending, so checking from `poll_read` (with a timer that wakes it) is enough.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.idle_check.as_mut().poll(cx));
            match self.info.activity.idle_due(self.timeouts) {
                // A request read just now is counted only once its task runs: look again
                // shortly rather than close under it.
                Some(due)
                    if due <= Instant::now()
                        && self.read_since_check
                        && self.graced_at != Some(self.info.activity.mark()) =>
                {
                    self.read_since_check = false;
                    self.graced_at = Some(self.info.activity.mark());
                    self.idle_check.as_mut().reset(Instant::now() + IDLE_GRACE);
                }
                Some(due) if due <= Instant::now() => return Poll::Ready(()),
                // Busy now: look again a full timeout later (it cannot be idle long enough
                // before then).
                Some(due) => self.idle_check.as_mut().reset(due),
                None => self
                    .idle_check
                    .as_mut()
                    .reset(Instant::now() + self.timeouts.idle),
            }
        }
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The transport usually has a read pending: a place to learn it must close.
        if let Some(e) = this.closed(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let read = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if buf.filled().len() > before {
            this.read_since_check = true;
        }
        if read.is_pending() && this.poll_idle(cx).is_ready() {
            // An error ends the connection; nothing is in flight on it.
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "idle connection closed",
            )));
        }
        read
    }
}

impl Connection {
    /// The error that ends a connection the send timeout closed. Checked on writes as well as
    /// reads: a transport blocked flushing to a client that reads nothing never reads.
    fn closed(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.info.activity.closer.register(cx.waker());
        self.info.activity.closing.load(Ordering::Acquire).then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "connection closed: a response was not taken within the send timeout",
            )
        })
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.closed(cx) {
            return Poll::Ready(Err(e));
        }
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.closed(cx) {
            return Poll::Ready(Err(e));
        }
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.closed(cx) {
            return Poll::Ready(Err(e));
        }
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
