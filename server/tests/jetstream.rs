//! What cluster mode relies on JetStream for (docs/cluster.md), checked against three real
//! `nats-server` processes with `sync_interval: always`: replicated streams acknowledge with a
//! quorum, a stale writer is fenced by its expected sequence, and a refused per-subject
//! expectation says so with one of the two error codes the design handles. If a NATS upgrade
//! changes any of this, the design's assumptions fail here first. And the first piece built
//! on it: partition leases in a KV bucket.

mod support;

use std::time::{Duration, Instant};

use async_nats::{
    HeaderMap,
    jetstream::{self, Context, stream},
};
use bytes::Bytes;
use mayfly_cluster::{LeaseTiming, Leases, SystemClocks, Watch, lease_store::renew_interval};

use support::nats::NatsCluster;

/// The error codes JetStream answers a wrong expected sequence with: 10071 names the sequence
/// it found; 10164 does not (a replicated stream's per-subject check, or a message of the same
/// subject still being applied).
const WRONG_LAST_SEQUENCE: u16 = 10071;
const WRONG_LAST_SEQUENCE_CONSTANT: u16 = 10164;

async fn client(cluster: &NatsCluster) -> Context {
    let client = async_nats::connect(cluster.urls()).await.expect("connects");
    jetstream::new(client)
}

/// Creates an R3 stream, retrying while the cluster's JetStream is still forming.
async fn replicated_stream(js: &Context, name: &str, subjects: &str) -> stream::Stream {
    let deadline = Instant::now() + Duration::from_secs(20);
    // Asked again every half second rather than after the default 5 s timeout.
    let mut impatient = js.clone();
    impatient.set_timeout(Duration::from_millis(500));
    loop {
        let created = impatient
            .create_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![subjects.to_string()],
                num_replicas: 3,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await;
        match created {
            Ok(mut stream) => {
                // Created is not yet writable: its own Raft group elects a leader first
                // (until then a publish finds no stream to answer it).
                while stream
                    .info()
                    .await
                    .ok()
                    .and_then(|i| i.cluster.clone())
                    .and_then(|c| c.leader)
                    .is_none()
                {
                    assert!(
                        Instant::now() < deadline,
                        "the stream elected no leader in 20 s"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return stream;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("stream not created yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no R3 stream within 20 s: {e}"),
        }
    }
}

/// Why a publish was not acknowledged.
#[derive(Debug, PartialEq)]
enum Refused {
    /// Its expectation was wrong: the JetStream error code (see [`WRONG_LAST_SEQUENCE`]).
    WrongSequence(u16),
    /// Nothing answered it in time, or no stream leader took it (while one is elected): it
    /// may be sent again (with the same message id, in case it was stored after all).
    Unanswered(String),
}

/// Publishes `body` on `subject` with one expectation header; the stream sequence it got, or
/// why not.
async fn publish(
    js: &Context,
    subject: &str,
    header: (&str, u64),
    body: &'static [u8],
) -> Result<u64, Refused> {
    publish_once(js, subject, header, None, body).await
}

/// [`publish`], with a message id when given: JetStream stores a message once per id, so a
/// publish whose acknowledgement was lost can be sent again.
async fn publish_once(
    js: &Context,
    subject: &str,
    header: (&str, u64),
    id: Option<&str>,
    body: &'static [u8],
) -> Result<u64, Refused> {
    let mut headers = HeaderMap::new();
    headers.insert(header.0, header.1.to_string().as_str());
    if let Some(id) = id {
        headers.insert("Nats-Msg-Id", id);
    }
    let sent = js
        .publish_with_headers(subject.to_string(), headers, Bytes::from_static(body))
        .await
        .map_err(|e| Refused::Unanswered(e.to_string()))?;
    let e = match tokio::time::timeout(Duration::from_secs(2), sent).await {
        Ok(Ok(ack)) => return Ok(ack.sequence),
        Ok(Err(e)) => e,
        Err(_) => return Err(Refused::Unanswered("no acknowledgement in 2 s".into())),
    };
    let text = format!("{e:?}");
    if !text.contains("wrong last sequence") {
        return Err(Refused::Unanswered(text));
    }
    Err(Refused::WrongSequence(
        [WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT]
            .into_iter()
            .find(|code| text.contains(&code.to_string()))
            .unwrap_or_else(|| panic!("a wrong-sequence refusal with another code: {text}")),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_stream_fences_a_stale_writer() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    let stream = replicated_stream(&js, "FENCE", "fence.>").await;
    assert_eq!(stream.cached_info().config.num_replicas, 3);

    // Stream-wide expectations: the first owner writes at 1 and 2, a new owner takes over at
    // the sequence it read, and the old owner's next publish (expecting its own last) fails.
    let expect_last = "Nats-Expected-Last-Sequence";
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 0), b"first").await,
        Ok(1)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 1), b"second").await,
        Ok(2)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 2), b"takeover").await,
        Ok(3)
    );
    assert_eq!(
        publish(&js, "fence.p0", (expect_last, 2), b"stale").await,
        Err(Refused::WrongSequence(WRONG_LAST_SEQUENCE))
    );

    // Per-subject expectations, as partitions sharing a stream use them: another subject's
    // messages do not disturb p1's, and a stale expectation is refused with one of the two
    // codes (the design then reads the subject's last message to tell a fence from a conflict).
    let expect_subject = "Nats-Expected-Last-Subject-Sequence";
    let p1 = publish(&js, "fence.p1", (expect_subject, 0), b"p1 first").await;
    assert_eq!(p1, Ok(4));
    assert_eq!(
        publish(&js, "fence.p2", (expect_subject, 0), b"p2 first").await,
        Ok(5)
    );
    assert_eq!(
        publish(&js, "fence.p1", (expect_subject, 4), b"p1 takeover").await,
        Ok(6)
    );
    let stale = publish(&js, "fence.p1", (expect_subject, 4), b"p1 stale").await;
    assert!(
        matches!(
            stale,
            Err(Refused::WrongSequence(
                WRONG_LAST_SEQUENCE | WRONG_LAST_SEQUENCE_CONSTANT
            ))
        ),
        "{stale:?}"
    );

    // Nothing refused was stored.
    let mut stream = js.get_stream("FENCE").await.expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_with_one_server_of_three_killed() {
    let mut cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    replicated_stream(&js, "QUORUM", "quorum.>").await;
    let expect = "Nats-Expected-Last-Subject-Sequence";
    let mut last = publish(&js, "quorum.p", (expect, 0), b"before")
        .await
        .expect("acked");
    // Kill a server the client is not necessarily using: two of three are a quorum.
    drop(cluster.servers.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    while acked < 20 {
        // The same id on every try of one message: a try that timed out but was stored is
        // acknowledged as a duplicate, at its sequence, instead of failing its expectation.
        let id = format!("after-{acked}");
        match publish_once(&js, "quorum.p", (expect, last), Some(&id), b"after").await {
            Ok(seq) => {
                last = seq;
                acked += 1;
            }
            Err(Refused::WrongSequence(code)) => {
                panic!("refused with {code} while only this test writes")
            }
            // A stream leader on the killed server is re-elected among the other two.
            Err(Refused::Unanswered(why)) => {
                assert!(
                    Instant::now() < deadline,
                    "no quorum write within 20 s: {why}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(last, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_passes_only_after_its_owner_has_stopped_serving() {
    let cluster = NatsCluster::start(3);
    let js = client(&cluster).await;
    // Created once the cluster takes replicated writes (the stream creation retries until it
    // does).
    replicated_stream(&js, "READY", "ready.>").await;
    // The design's 2 s lease: a replicated, fsynced renewal on a loaded machine can take a
    // good part of a second.
    let timing = LeaseTiming::DEFAULT;
    let leases = Leases::open(&js, 3, timing).await.expect("bucket");
    // Shared by the test's two "nodes": one real clock, so that their lease decisions can be
    // compared on one time line.
    let clocks = SystemClocks;

    // Node a takes partition 0; node b cannot while a renews.
    let mut b_watch = Watch::default();
    let mut a = leases
        .try_acquire(0, "a", &mut Watch::default(), &clocks)
        .await
        .expect("answers")
        .expect("a free partition is taken");
    assert_eq!(a.epoch, 1);
    for _ in 0..4 {
        assert!(leases.renew(&mut a, "a", &clocks).await.expect("answers"));
        assert!(a.serves(&clocks));
        let b = leases.try_acquire(0, "b", &mut b_watch, &clocks).await;
        assert!(b.expect("answers").is_none(), "taken while renewed");
        tokio::time::sleep(renew_interval(&timing)).await;
    }

    // a stops renewing (a pause): b takes over once a whole lease has passed since it saw the
    // last renewal, and by then a has stopped serving by its own clock.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        assert!(Instant::now() < deadline, "b never took the lapsed lease");
        if let Some(b) = leases
            .try_acquire(0, "b", &mut b_watch, &clocks)
            .await
            .expect("answers")
        {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!a.serves(&clocks), "a still served when b took over");
    assert_eq!(b.epoch, 2);
    let (record, _) = leases.read(0).await.expect("answers").expect("held");
    assert_eq!((record.owner.as_str(), record.epoch), ("b", 2));
    // a wakes: its renewal is refused, and it knows it lost the partition.
    assert!(!leases.renew(&mut a, "a", &clocks).await.expect("answers"));
    assert!(!a.serves(&clocks));
}
