//! One accepted client connection: plain TCP or TLS over it, counted against the connection
//! limit while it lives, and closed once it has carried no request for the idle timeout.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::OwnedSemaphorePermit,
    time::{Instant, Sleep},
};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

/// How long a connection that seemed idle but just received bytes gets before another look.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// A client connection as the gRPC transport sees it.
#[derive(Debug)]
pub(crate) struct Connection {
    io: Io,
    info: ConnectionInfo,
    idle_timeout: Duration,
    idle_check: Pin<Box<Sleep>>,
    /// Bytes arrived since the idle check last looked: a request may be on its way to the
    /// service without being counted yet.
    read_since_check: bool,
    /// A place under the connection limit, given back when the connection closes.
    _slot: OwnedSemaphorePermit,
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
    pub(crate) activity: Arc<Activity>,
}

/// Requests in flight on a connection, and when the last one started or ended.
#[derive(Debug)]
pub(crate) struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened`.
    last_change_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_change_ms.store(ms, Ordering::Relaxed);
    }

    /// Counts a request until the returned guard (kept with its response) is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight(self.clone())
    }

    /// When the connection became idle, if it is.
    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Relaxed) == 0).then(|| {
            self.opened + Duration::from_millis(self.last_change_ms.load(Ordering::Relaxed))
        })
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
        idle_timeout: Duration,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        Self::new(Io::Plain(stream), remote, idle_timeout, slot)
    }

    pub(crate) fn tls(
        stream: TlsStream<TcpStream>,
        remote: SocketAddr,
        idle_timeout: Duration,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        Self::new(Io::Tls(Box::new(stream)), remote, idle_timeout, slot)
    }

    fn new(io: Io, remote: SocketAddr, idle_timeout: Duration, slot: OwnedSemaphorePermit) -> Self {
        Connection {
            io,
            info: ConnectionInfo {
                remote,
                activity: Arc::new(Activity::new()),
            },
            idle_timeout,
            idle_check: Box::pin(tokio::time::sleep(idle_timeout)),
            read_since_check: false,
            _slot: slot,
        }
    }

    /// Whether the connection has been idle for the timeout. The transport always has a read
    /// pending, so checking from `poll_read` (with a timer that wakes it) is enough.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.idle_check.as_mut().poll(cx));
            let due = self
                .info
                .activity
                .idle_since()
                .map(|since| since + self.idle_timeout);
            match due {
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
                    .reset(Instant::now() + self.idle_timeout),
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
