//! One accepted client connection: plain TCP or TLS over it, counted against the connection
//! limits while it lives, and closed once it has carried no request for the idle timeout (or
//! sent none at all within the first-request timeout).

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use futures_util::task::AtomicWaker;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use super::{budget::PeerShare, listener::Slot};

/// How long a connection that seemed idle but just received bytes gets before another look.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// A client connection as the gRPC transport sees it.
#[derive(Debug)]
pub(crate) struct Connection {
    io: Io,
    info: ConnectionInfo,
    timeouts: IdleTimeouts,
    idle_check: Pin<Box<Sleep>>,
    /// Bytes arrived since the idle check last looked: a request may be on its way to the
    /// service without being counted yet.
    read_since_check: bool,
    /// A place under the connection limits, given back when the connection closes.
    _slot: Slot,
}

/// When a connection without a request in flight is closed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdleTimeouts {
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
    pub(crate) activity: Arc<Activity>,
}

/// Requests in flight on a connection, and when the last one started or ended.
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
        }
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
    fn idle_due(&self, timeouts: IdleTimeouts) -> Option<Instant> {
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
        timeouts: IdleTimeouts,
        slot: Slot,
    ) -> Self {
        Self::new(Io::Plain(stream), remote, timeouts, slot)
    }

    pub(crate) fn tls(
        stream: TlsStream<TcpStream>,
        remote: SocketAddr,
        timeouts: IdleTimeouts,
        slot: Slot,
    ) -> Self {
        Self::new(Io::Tls(Box::new(stream)), remote, timeouts, slot)
    }

    fn new(io: Io, remote: SocketAddr, timeouts: IdleTimeouts, slot: Slot) -> Self {
        Connection {
            io,
            info: ConnectionInfo {
                remote,
                share: slot.share().clone(),
                activity: Arc::new(Activity::new()),
            },
            timeouts,
            idle_check: Box::pin(tokio::time::sleep(
                timeouts.first_request.min(timeouts.idle),
            )),
            read_since_check: false,
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
                Some(due) if due <= Instant::now() && self.read_since_check => {
                    self.read_since_check = false;
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
        // The transport always has a read pending: the place to learn it must close.
        this.info.activity.closer.register(cx.waker());
        if this.info.activity.closing.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection closed: a streaming response was not read within the send timeout",
            )));
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

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
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
