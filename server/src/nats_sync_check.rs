//! Whether the NATS servers fsync before they acknowledge (docs/cluster.md, "Operations").
//! JetStream by default acknowledges a message before it is on disk (`sync_interval` of two
//! minutes), and Jepsen lost acknowledged writes to a coordinated power failure that way; a
//! Mayfly write is acknowledged on the strength of a NATS quorum's acknowledgement, so every
//! NATS server must run with `sync_interval: always`. A node reads each NATS server's
//! monitoring endpoint it is given (`GET /varz`, which reports
//! `jetstream.config.sync_always`), refuses to start when one runs JetStream without it, and
//! warns loudly (and says so in a metric) when it cannot tell.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

/// How long a NATS server's monitoring endpoint has to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of `/varz` read (a few KiB in practice): a wrong endpoint cannot fill memory.
const MAX_VARZ_BYTES: usize = 1 << 20;

/// What one NATS server's `/varz` says of its JetStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sync {
    /// `sync_interval: always`: it fsyncs before it acknowledges.
    Always,
    /// It acknowledges before it fsyncs; it fsyncs every `interval`, where it says.
    Interval(Option<Duration>),
    /// JetStream is off on it: it keeps none of the cluster's streams.
    NoJetStream,
}

/// Reads what the `/varz` document `varz` says of the server's JetStream.
pub(crate) fn sync_of(varz: &serde_json::Value) -> Sync {
    let Some(config) = varz.pointer("/jetstream/config") else {
        return Sync::NoJetStream;
    };
    if config
        .get("sync_always")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        return Sync::Always;
    }
    // Absent where it is `false` (NATS leaves false flags out).
    Sync::Interval(
        config
            .get("sync_interval")
            .and_then(serde_json::Value::as_u64)
            .map(Duration::from_nanos),
    )
}

/// A NATS server's monitoring endpoint, from `--cluster-nats-monitor`: `http://HOST:PORT`
/// (the server's `http:` setting), returned as `HOST:PORT`.
pub(crate) fn monitor_authority(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!(
            "--cluster-nats-monitor {url}: give a NATS server's monitoring endpoint as http://HOST:PORT (its `http:` setting; over https it is not checked)"
        )
    })?;
    let authority = rest.trim_end_matches('/');
    let valid = authority
        .parse::<http::uri::Authority>()
        .is_ok_and(|a| a.port_u16().is_some() && !a.as_str().contains('@'));
    if !valid {
        return Err(format!(
            "--cluster-nats-monitor {url}: give a NATS server's monitoring endpoint as http://HOST:PORT"
        ));
    }
    Ok(authority.to_owned())
}

/// Reads `/varz` from the monitoring endpoint at `authority` (`HOST:PORT`).
async fn varz(authority: &str) -> Result<serde_json::Value, String> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    // Drives the connection until the answer is read (dropped with this function's future).
    let connection = tokio::spawn(connection);
    let request = http::Request::get("/varz")
        .header(http::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET /varz answered {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_VARZ_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading /varz: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("/varz is not JSON: {e}"))
    }
    .await;
    connection.abort();
    answer
}

/// Checks the NATS servers at the monitoring endpoints `monitors` (`http://HOST:PORT`) for a
/// cluster reached through `urls`: an error naming each server that acknowledges before it
/// fsyncs; otherwise whether every server was confirmed to fsync first (warning loudly of
/// each one it could not tell about).
pub(crate) async fn check(monitors: &[String], urls: &[String]) -> Result<bool, String> {
    if monitors.is_empty() {
        tracing::warn!(
            "WARNING: cannot tell whether the NATS servers fsync before they acknowledge: \
             every NATS server must run JetStream with `sync_interval: always`, or a power \
             failure can lose acknowledged writes; give --cluster-nats-monitor with their \
             monitoring endpoints (http://HOST:PORT) to have this node check"
        );
        return Ok(false);
    }
    let authorities = monitors
        .iter()
        .map(|url| monitor_authority(url))
        .collect::<Result<Vec<_>, _>>()?;
    let answers = futures_util::future::join_all(monitors.iter().zip(&authorities).map(
        |(url, authority)| async move {
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, varz(authority))
                .await
                .unwrap_or_else(|_| Err(format!("no answer in {ANSWER_TIMEOUT:?}")));
            (url, answer)
        },
    ))
    .await;
    let mut confirmed = monitors.len() >= urls.len();
    let mut lax = Vec::new();
    for (url, answer) in answers {
        match answer {
            Err(e) => {
                confirmed = false;
                tracing::warn!(
                    "WARNING: cannot tell whether the NATS server at {url} fsyncs before it \
                     acknowledges (it must run JetStream with `sync_interval: always`): {e}"
                );
            }
            Ok(varz) => {
                let name = varz
                    .get("server_name")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("?");
                match sync_of(&varz) {
                    Sync::Always => {
                        tracing::info!(%url, server = name, "NATS server fsyncs before it acknowledges");
                    }
                    Sync::NoJetStream => {
                        tracing::info!(%url, server = name, "NATS server runs without JetStream: it keeps none of the cluster's logs");
                    }
                    Sync::Interval(interval) => lax.push(format!(
                        "{name} ({url}) fsyncs {}",
                        match interval {
                            Some(interval) => format!("every {interval:?}"),
                            None => "on its own schedule".into(),
                        }
                    )),
                }
            }
        }
    }
    if !lax.is_empty() {
        return Err(format!(
            "NATS servers that acknowledge writes before they are on disk: {}; a power failure \
             can lose what they acknowledged. Run every NATS server with \
             `jetstream {{ sync_interval: always }}` (docs/cluster.md)",
            lax.join(", ")
        ));
    }
    if monitors.len() < urls.len() {
        tracing::warn!(
            "WARNING: {} NATS monitoring endpoints for {} NATS URLs: the servers not given in \
             --cluster-nats-monitor are not checked for `sync_interval: always`",
            monitors.len(),
            urls.len()
        );
    }
    Ok(confirmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varz_says_whether_a_server_fsyncs_before_it_acknowledges() {
        // As nats-server 2.15.1 answers, with and without `sync_interval: always`.
        let always = serde_json::json!({"server_name": "n0", "jetstream": {"config": {
            "store_dir": "/s", "sync_interval": 120_000_000_000u64, "sync_always": true}}});
        let default = serde_json::json!({"jetstream": {"config": {
            "store_dir": "/s", "sync_interval": 120_000_000_000u64, "strict": true}}});
        let off = serde_json::json!({"server_name": "n2", "jetstream": {}});
        assert_eq!(sync_of(&always), Sync::Always);
        assert_eq!(
            sync_of(&default),
            Sync::Interval(Some(Duration::from_secs(120)))
        );
        assert_eq!(sync_of(&off), Sync::NoJetStream);
    }

    #[test]
    fn a_monitoring_endpoint_is_http_host_and_port() {
        assert_eq!(
            monitor_authority("http://127.0.0.1:8222/").as_deref(),
            Ok("127.0.0.1:8222")
        );
        assert_eq!(
            monitor_authority("http://nats-1.internal:8222").as_deref(),
            Ok("nats-1.internal:8222")
        );
        for bad in [
            "https://n:8222",
            "127.0.0.1:8222",
            "http://n",
            "http://n:8222/varz",
            "http://u@n:1",
        ] {
            let e = monitor_authority(bad).expect_err(bad);
            assert!(e.contains("http://HOST:PORT"), "{bad}: {e}");
        }
    }
}
