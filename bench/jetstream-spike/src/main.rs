//! The JetStream spike behind docs/cluster.md: how fast R3 streams acknowledge fenced
//! publishes, in the shapes the design weighed, and whether a stale writer is refused.
//! `run.sh` starts three local NATS servers and runs every shape of the note's table.
//!
//! ```text
//! jetstream-spike URL pipelined STREAMS WINDOW SIZE SECONDS
//!     one writer per stream, WINDOW publishes in flight, each fenced by the stream-wide
//!     Nats-Expected-Last-Sequence (predictable: the writer is the stream's only one)
//! jetstream-spike URL subjects STREAMS SUBJECTS SIZE SECONDS
//!     SUBJECTS writers per stream, one publish in flight each, fenced by
//!     Nats-Expected-Last-Subject-Sequence
//! jetstream-spike URL fence
//!     a takeover at the expected sequence, then the stale writer's publish at the same one
//! ```

use std::time::{Duration, Instant};

use async_nats::{
    HeaderMap,
    jetstream::{self, Context, stream},
};
use bytes::Bytes;
use futures::stream::{FuturesOrdered, StreamExt};

type Result<T> = std::result::Result<T, async_nats::Error>;

/// Replaces stream `name` with an empty R3 file stream on `subjects`.
async fn fresh_stream(js: &Context, name: &str, subjects: String) -> Result<()> {
    let _ = js.delete_stream(name).await;
    js.create_stream(stream::Config {
        name: name.to_string(),
        subjects: vec![subjects],
        num_replicas: 3,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    Ok(())
}

fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.insert(*name, value.as_str());
    }
    h
}

/// One writer's acknowledgement latencies and the publishes refused.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    refused: u64,
    /// Refusals with error 10164 that a retry got through (see docs/cluster.md, "Streams").
    conflicts: u64,
}

async fn pipelined(js: Context, stream: usize, window: usize, payload: Bytes, end: Instant) -> Tally {
    let subject = format!("spike.p{stream}.0");
    let mut next = 1u64; // the stream sequence the next publish gets
    let mut in_flight = FuturesOrdered::new();
    let mut tally = Tally::default();
    loop {
        while in_flight.len() < window && Instant::now() < end {
            let h = headers(&[
                ("Nats-Expected-Last-Sequence", (next - 1).to_string()),
                ("Nats-Msg-Id", format!("{stream}:1:{next}")),
            ]);
            let started = Instant::now();
            let ack = js
                .publish_with_headers(subject.clone(), h, payload.clone())
                .await
                .expect("the publish is sent");
            next += 1;
            in_flight.push_back(async move { (ack.await, started) });
        }
        match in_flight.next().await {
            None => return tally,
            Some((Ok(_), started)) => tally.latencies.push(started.elapsed()),
            Some((Err(_), _)) => tally.refused += 1,
        }
    }
}

async fn one_in_flight(js: Context, subject: String, payload: Bytes, end: Instant) -> Tally {
    let mut last = 0u64;
    let mut tally = Tally::default();
    while Instant::now() < end {
        let started = Instant::now();
        loop {
            let h = headers(&[("Nats-Expected-Last-Subject-Sequence", last.to_string())]);
            let sent = js
                .publish_with_headers(subject.clone(), h, payload.clone())
                .await
                .expect("the publish is sent");
            match sent.await {
                Ok(ack) => {
                    last = ack.sequence;
                    break;
                }
                // Only this writer writes the subject: a refusal is a conflict with its own
                // previous message, still being applied. Retry, as the design does after
                // checking the subject's last message.
                Err(e) if format!("{e:?}").contains("10164") => {
                    tally.conflicts += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) => panic!("{subject}: refused: {e:?}"),
            }
        }
        tally.latencies.push(started.elapsed());
    }
    tally
}

fn report(shape: &str, tallies: Vec<Tally>, took: f64) {
    let mut all: Vec<Duration> = tallies.iter().flat_map(|t| t.latencies.clone()).collect();
    let refused: u64 = tallies.iter().map(|t| t.refused).sum();
    let conflicts: u64 = tallies.iter().map(|t| t.conflicts).sum();
    all.sort();
    let q = |f: f64| all[((all.len() as f64 * f) as usize).min(all.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "{shape}: {} acknowledged in {took:.1} s = {:.0}/s; latency p50 {:.2} ms, p99 {:.2} ms; refused {refused}; conflicts retried {conflicts}",
        all.len(),
        all.len() as f64 / took,
        q(0.5),
        q(0.99)
    );
}

async fn fence(js: &Context) -> Result<()> {
    fresh_stream(js, "SPIKE_FENCE", "spike.fence".into()).await?;
    let publish = |expected: u64, body: &'static [u8]| {
        let js = js.clone();
        async move {
            let h = headers(&[("Nats-Expected-Last-Sequence", expected.to_string())]);
            js.publish_with_headers("spike.fence", h, Bytes::from_static(body))
                .await?
                .await
                .map(|ack| ack.sequence)
                .map_err(|e| e.to_string())
                .map_err(async_nats::Error::from)
        }
    };
    let owned = publish(0, b"the first owner's write").await?;
    println!("first owner wrote at {owned}");
    println!("takeover at expected {owned}: {:?}", publish(owned, b"takeover").await.map_err(|e| e.to_string()));
    println!(
        "stale owner's publish at expected {owned}: {:?}",
        publish(owned, b"stale").await.map_err(|e| e.to_string())
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: jetstream-spike URL pipelined STREAMS WINDOW SIZE SECONDS | URL subjects STREAMS SUBJECTS SIZE SECONDS | URL fence";
    let (Some(url), Some(mode)) = (args.get(1), args.get(2)) else {
        return Err(usage.into());
    };
    let js = jetstream::new(async_nats::connect(url.as_str()).await?);
    if mode == "fence" {
        return fence(&js).await;
    }
    let number = |i: usize| -> Result<usize> { Ok(args.get(i).ok_or(usage)?.parse()?) };
    let (streams, per_stream, size, seconds) = (number(3)?, number(4)?, number(5)?, number(6)?);
    let payload = Bytes::from(vec![b'x'; size]);
    for s in 0..streams {
        fresh_stream(&js, &format!("SPIKE_P{s}"), format!("spike.p{s}.>")).await?;
    }
    let end = Instant::now() + Duration::from_secs(seconds as u64);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        match mode.as_str() {
            "pipelined" => tasks.push(tokio::spawn(pipelined(js.clone(), s, per_stream, payload.clone(), end))),
            "subjects" => {
                for subject in 0..per_stream {
                    let subject = format!("spike.p{s}.{subject}");
                    tasks.push(tokio::spawn(one_in_flight(js.clone(), subject, payload.clone(), end)));
                }
            }
            _ => return Err(usage.into()),
        }
    }
    let mut tallies = Vec::new();
    for task in tasks {
        tallies.push(task.await?);
    }
    let shape = format!("{mode}: {streams} streams × {per_stream}, {size}-byte messages");
    report(&shape, tallies, started.elapsed().as_secs_f64());
    Ok(())
}
