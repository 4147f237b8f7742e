//! Serves HTTP/2 on the connections the listener accepts, with the server's own settings.
//!
//! tonic's server would do this too, but keeps hyper's send buffer of 400 KiB per stream: what
//! HTTP/2 may hold for one response whose client has granted window but does not take it off
//! the socket. Every streaming response is charged that in the response budget, so at 400 KiB
//! a client address could keep only ~140 change feed streams open, each of them idle. Here the
//! buffer is [`SEND_BUFFER`], one data slice, so that an open stream costs what it holds.
//!
//! Beside the settings, what tonic's server did per request is done here: the connection's
//! [`ConnectionInfo`] goes into the request's extensions, and a call's `grpc-timeout` bounds
//! how long its answer may take (as tonic did, the wait for the response headers only: a
//! stream, once answered, runs as long as its client reads it).

use std::{convert::Infallible, future::Future, io, pin::pin, time::Duration};

use hyper::{body::Incoming, server::conn::http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::{Status, body::Body, transport::server::Connected};
use tower_service::Service;

use super::{Connection, Limits, request_limits::SEND_BUFFER};

/// How many locally caused stream resets a connection may provoke: tonic turned h2's cap
/// off; a client provoking them without end is the "MadeYouReset" attack. hyper's default.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Serves `service` on every connection `incoming` yields until `shutdown` completes, then
/// lets the connections finish what they are answering (new calls are refused) and returns
/// once they all have.
pub(crate) async fn serve<S, B>(
    service: S,
    incoming: impl Stream<Item = Result<Connection, io::Error>>,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .keep_alive_interval(Some(limits.keepalive_interval))
        .keep_alive_timeout(limits.keepalive_timeout)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .max_send_buf_size(SEND_BUFFER);
    let (stop, stopping) = watch::channel(false);
    {
        // Dropped when accepting stops, so that the listener stops with it.
        let mut incoming = pin!(incoming);
        let mut shutdown = pin!(shutdown);
        loop {
            let connection = tokio::select! {
                () = &mut shutdown => break,
                next = incoming.next() => match next {
                    Some(Ok(connection)) => connection,
                    Some(Err(e)) => {
                        tracing::trace!(error = %e, "accepting a connection failed");
                        continue;
                    }
                    None => break,
                },
            };
            tokio::spawn(serve_connection(
                connection,
                service.clone(),
                http2.clone(),
                stopping.clone(),
            ));
        }
    }
    let _ = stop.send(true);
    drop(stopping);
    // Every connection holds a receiver until it has closed.
    stop.closed().await;
}

async fn serve_connection<S, B>(
    connection: Connection,
    service: S,
    http2: http2::Builder<TokioExecutor>,
    mut stopping: watch::Receiver<bool>,
) where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let info = connection.connect_info();
    let calls = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let mut service = service.clone();
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(info.clone());
        let deadline = grpc_timeout(&parts.headers);
        let request = http::Request::from_parts(parts, Body::new(body));
        async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            let answer = service.call(request);
            let response = match deadline {
                None => answer.await?.map(Body::new),
                Some(deadline) => match tokio::time::timeout(deadline, answer).await {
                    Ok(response) => response?.map(Body::new),
                    Err(_) => Status::deadline_exceeded(format!(
                        "the call's deadline (grpc-timeout, {deadline:?}) passed before it was \
                         answered"
                    ))
                    .into_http(),
                },
            };
            Ok::<_, Infallible>(response)
        }
    });
    let mut served = pin!(http2.serve_connection(TokioIo::new(connection), calls));
    let mut told_to_stop = false;
    loop {
        tokio::select! {
            result = &mut served => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // Once: GOAWAY, then the calls under way finish.
            changed = stopping.changed(), if !told_to_stop => {
                told_to_stop = true;
                if changed.is_ok() {
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A call's `grpc-timeout` header: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`). A malformed one is ignored, as gRPC servers do.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match &value[digits.len()..] {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().expect("a header value"));
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_writes_them() {
        assert_eq!(timeout("500m"), Some(Duration::from_millis(500)));
        assert_eq!(timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
        for bad in ["", "m", "100", "123456789m", "1x", "-1m", "1.5S", "+1S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
    }
}
