//! What one client, or many, may hold of the server: each limit is a `mayfly` flag, and these
//! defaults are the ones the README documents.

use std::time::Duration;

use crate::engine::{IdempotencyConfig, MAX_PAGE_BYTES};

/// Largest request or response message: a 2 MiB JSON document can take several times that
/// as a protobuf Struct (every array element carries tags), and must reach the size check.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Resource limits of the gRPC listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv6: one /64 network), so that one
    /// client cannot take every place.
    pub max_connections_per_ip: usize,
    /// Requests in flight on one HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_streams_per_connection: u32,
    /// How often an HTTP/2 PING checks that a quiet connection's peer is still there.
    pub keepalive_interval: Duration,
    /// How long the PING's answer may take before the connection is closed.
    pub keepalive_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// A connection that has sent no request this long after it was accepted (and its TLS
    /// handshake done) is closed.
    pub first_request_timeout: Duration,
    /// How long a request message may take to arrive once its call has started; a client
    /// that stalls mid-upload is answered DEADLINE_EXCEEDED and its buffer freed.
    pub request_read_timeout: Duration,
    /// Bytes at which a feed or query page ends (one result at least): a stream whose reader
    /// stops reading holds one page, so at most this (or one larger document).
    pub page_bytes: usize,
    /// Bytes of responses the server holds for all clients at once, waiting for them to be
    /// read; a response beyond it ends with RESOURCE_EXHAUSTED.
    pub response_budget_bytes: usize,
    /// The part of `response_budget_bytes` that the clients at one address (IPv6: one /64
    /// network) may hold together.
    pub response_budget_per_ip_bytes: usize,
    /// A streaming response whose client takes none of it for this long has its connection
    /// closed, giving back what it held of the budget.
    pub send_timeout: Duration,
    /// Bytes of request messages on their way in, for all clients at once (each counted at
    /// its declared length from its first bytes); a request beyond it is answered
    /// RESOURCE_EXHAUSTED, unread.
    pub request_budget_bytes: usize,
    /// The part of `request_budget_bytes` that the clients at one address (IPv6: one /64
    /// network) may hold together, so that one client's stalled uploads leave the rest to
    /// the others.
    pub request_budget_per_ip_bytes: usize,
    /// How long idempotency keys are remembered, and how many (see the README's "Idempotency
    /// keys").
    pub idempotency: IdempotencyConfig,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_connections_per_ip: 1024,
            max_streams_per_connection: 256,
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(300),
            first_request_timeout: Duration::from_secs(20),
            request_read_timeout: Duration::from_secs(30),
            page_bytes: MAX_PAGE_BYTES,
            response_budget_bytes: 256 * 1024 * 1024,
            response_budget_per_ip_bytes: 64 * 1024 * 1024,
            send_timeout: Duration::from_secs(60),
            request_budget_bytes: 256 * 1024 * 1024,
            request_budget_per_ip_bytes: 64 * 1024 * 1024,
            idempotency: IdempotencyConfig::default(),
        }
    }
}

impl Limits {
    /// Why these limits cannot serve, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == 0
            || self.max_connections_per_ip == 0
            || self.max_streams_per_connection == 0
        {
            return Err("connection and stream limits must be at least 1".into());
        }
        if self.keepalive_interval.is_zero()
            || self.keepalive_timeout.is_zero()
            || self.idle_timeout.is_zero()
            || self.first_request_timeout.is_zero()
            || self.request_read_timeout.is_zero()
            || self.send_timeout.is_zero()
        {
            return Err("timeouts must be longer than zero".into());
        }
        if self.idempotency.window == 0 || self.idempotency.max_keys == 0 {
            return Err(
                "--idempotency-window-secs and --idempotency-max-keys must be at least 1".into(),
            );
        }
        if self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err("--max-connections is beyond what can be counted".into());
        }
        // Pages past 4 MiB of JSON could pass the 16 MiB message limit once encoded.
        if !(64 * 1024..=MAX_PAGE_BYTES).contains(&self.page_bytes) {
            return Err(format!(
                "the page byte limit must be between 64 KiB and {} KiB",
                MAX_PAGE_BYTES / 1024
            ));
        }
        let mib = |bytes: usize| bytes / (1024 * 1024);
        for (name, bytes, least) in [
            // The largest single response (charged twice its size, see the budget) must fit
            // when nothing else is held, or it could never be sent; so must the largest
            // request message.
            (
                "--response-budget-mb",
                self.response_budget_bytes,
                2 * MAX_MESSAGE_BYTES,
            ),
            (
                "--response-budget-per-ip-mb",
                self.response_budget_per_ip_bytes,
                2 * MAX_MESSAGE_BYTES,
            ),
            (
                "--request-budget-mb",
                self.request_budget_bytes,
                MAX_MESSAGE_BYTES,
            ),
            (
                "--request-budget-per-ip-mb",
                self.request_budget_per_ip_bytes,
                MAX_MESSAGE_BYTES,
            ),
        ] {
            if bytes / 1024 > u32::MAX as usize {
                return Err(format!("{name} must be under 4 TiB"));
            }
            if bytes < least {
                return Err(format!(
                    "{name} must be at least {} MiB (what the largest message needs)",
                    mib(least)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_serve_and_nonsense_is_refused() {
        assert_eq!(Limits::default().check(), Ok(()));
        let small_budget = Limits {
            response_budget_bytes: MAX_MESSAGE_BYTES,
            ..Limits::default()
        };
        assert!(small_budget.check().is_err());
        let no_streams = Limits {
            max_streams_per_connection: 0,
            ..Limits::default()
        };
        assert!(no_streams.check().is_err());
        let small_share = Limits {
            request_budget_per_ip_bytes: MAX_MESSAGE_BYTES - 1,
            ..Limits::default()
        };
        assert!(small_share.check().is_err());
    }
}
