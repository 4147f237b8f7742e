//! The accept loop: counts connections against the limits (in all and per client address),
//! performs TLS handshakes off the loop, and backs off (logging once per interval) when the
//! process runs out of descriptors instead of spinning on the error.

use std::{io, sync::Arc, time::Duration};

use tokio::{net::TcpListener, sync::mpsc, time::Instant};
use tokio_stream::wrappers::ReceiverStream;

use super::{
    Limits, ServerTls,
    budget::Budgets,
    connection::{Connection, Timeouts},
    slots::{Refused, Slots},
};

/// Longest a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pauses between accepts while out of descriptors: short at first, doubling to the bound.
const OUT_OF_DESCRIPTORS_PAUSE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));
/// The same warning is logged at most once per interval.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Connections as the gRPC transport takes them. The loop ends when the stream is dropped,
/// closing the listening socket.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    limits: &Limits,
    budgets: &Budgets,
) -> ReceiverStream<Result<Connection, io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(
        listener,
        tls,
        Slots::new(limits, budgets.clone()),
        Timeouts {
            send: limits.send_timeout,
            idle: limits.idle_timeout,
            first_request: limits.first_request_timeout,
        },
        tx,
    ));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    slots: Slots,
    timeouts: Timeouts,
    tx: mpsc::Sender<Result<Connection, io::Error>>,
) {
    let mut out_of_descriptors = Throttled::default();
    let mut over_limit = Throttled::default();
    let mut over_peer_limit = Throttled::default();
    let mut pause = OUT_OF_DESCRIPTORS_PAUSE.0;
    loop {
        let accepted = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => {
                pause = OUT_OF_DESCRIPTORS_PAUSE.0;
                accepted
            }
            Err(e) if out_of_resources(&e) => {
                // The connection stays in the kernel's queue: accepting again at once fails
                // again at once, which is the spin this pause prevents.
                if let Some(more) = out_of_descriptors.note() {
                    tracing::warn!(
                        error = %e,
                        failed_accepts_since_last_warning = more,
                        "cannot accept connections: the process is out of file descriptors; \
                         raise the limit (ulimit -n) or lower --max-connections"
                    );
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(OUT_OF_DESCRIPTORS_PAUSE.1);
                continue;
            }
            // The connection failed before it was accepted (reset, aborted): the next one
            // is unaffected. A short pause all the same: an error that persists must not spin.
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(OUT_OF_DESCRIPTORS_PAUSE.0).await;
                continue;
            }
        };
        let slot = match slots.take(remote.ip()) {
            Ok(slot) => slot,
            // Closed at once: the client gets a prompt error rather than a hang.
            Err(Refused::Server) => {
                drop(stream);
                if let Some(more) = over_limit.note() {
                    tracing::warn!(
                        %remote,
                        max_connections = slots.max,
                        refused_since_last_warning = more,
                        "connection refused: --max-connections reached"
                    );
                }
                continue;
            }
            Err(Refused::Peer) => {
                drop(stream);
                if let Some(more) = over_peer_limit.note() {
                    tracing::warn!(
                        %remote,
                        max_connections_per_ip = slots.max_per_peer,
                        refused_since_last_warning = more,
                        "connection refused: this client address has --max-connections-per-ip open"
                    );
                }
                continue;
            }
        };
        // Small request/response exchanges must not wait on Nagle's algorithm.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        match &tls {
            None => {
                let connection = Connection::plain(stream, remote, timeouts, slot);
                if tx.send(Ok(connection)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                // Off the loop: a client that stalls its handshake delays no one else.
                let acceptor = tls.acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let connection = Connection::tls(stream, remote, timeouts, slot);
                            let _ = tx.send(Ok(connection)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Errors that say the process or system is out of descriptors or memory for sockets.
fn out_of_resources(e: &io::Error) -> bool {
    // EMFILE, ENFILE, ENOMEM: the same numbers on Linux and macOS; ENOBUFS differs.
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOMEM: i32 = 12;
    const ENOBUFS: i32 = if cfg!(target_os = "linux") { 105 } else { 55 };
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE | ENOMEM | ENOBUFS))
}

/// Says when a recurring condition is worth logging again: its first time, then once per
/// interval with the number of times it happened in between.
#[derive(Debug, Default)]
struct Throttled {
    last: Option<Instant>,
    since: u64,
}

impl Throttled {
    /// `Some(occurrences not logged since the last time)` when this one should be logged.
    fn note(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < WARN_INTERVAL => {
                self.since += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.since))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_recurring_warning_is_logged_once_per_interval() {
        let mut throttled = Throttled::default();
        assert_eq!(throttled.note(), Some(0));
        for _ in 0..5 {
            assert_eq!(throttled.note(), None);
        }
        tokio::time::advance(WARN_INTERVAL).await;
        assert_eq!(throttled.note(), Some(5));
        assert_eq!(throttled.note(), None);
    }

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        assert!(out_of_resources(&io::Error::from_raw_os_error(24)));
        assert!(out_of_resources(&io::Error::from_raw_os_error(23)));
        assert!(!out_of_resources(&io::Error::from_raw_os_error(104)));
    }
}
