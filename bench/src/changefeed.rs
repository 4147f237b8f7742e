//! Change feed workloads (issue 27).
//!
//! `changefeed`: --subscribers consumers follow the collection (all versions and deletes) while
//! writes come at --rate per second for --duration seconds, --expire-percent of them with a 1 s
//! ttl (their expiry events come back during the run), the rest with --ttl. Prints the delivery
//! latency of write events (commit instant → each subscriber) and of expiry events (expiry
//! instant → each subscriber), p50/p99/max, and the write rate reached. The server's clock
//! stamps each event (`crts`, in ms) and this machine's clock reads it on arrival: run the
//! server on the same machine.
//!
//! `changefeed-catch-up`: --documents writes, then one consumer reads the feed from the
//! beginning: events per second.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use mayfly_proto::v1::{self, ChangeFeedRequest, oneofs::ChangeFeedStart};
use std::sync::Mutex as StdMutex;
use tokio::sync::Semaphore;

use crate::{Bench, DATABASE, now_ms};

/// Delivery latencies, in ms, by kind of event.
pub(crate) struct Latencies {
    writes: StdMutex<Histogram<u64>>,
    expiries: StdMutex<Histogram<u64>>,
}

/// Consumers following the collection's feed from now, recording each event's delivery
/// latency until stopped.
pub(crate) struct Subscribers {
    latencies: Arc<Latencies>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Subscribers {
    /// Stops them, and prints what they measured.
    pub(crate) async fn report(self) -> Result<(), Box<dyn std::error::Error>> {
        self.stop.store(true, Ordering::Relaxed);
        let n = self.tasks.len();
        for task in self.tasks {
            task.await?;
        }
        println!("subscribers: {n} reading");
        print_latency(
            "write events, commit → subscriber",
            &self.latencies.writes.lock().expect("not poisoned"),
        );
        print_latency(
            "expiry events, expiry instant → subscriber",
            &self.latencies.expiries.lock().expect("not poisoned"),
        );
        Ok(())
    }
}

fn print_latency(what: &str, h: &Histogram<u64>) {
    if h.is_empty() {
        println!("{what}: no events");
        return;
    }
    println!(
        "{what}: {} events delivered, latency p50 {} ms, p99 {} ms, max {} ms",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    );
}

impl Bench {
    fn change_feed_request(&self, start: ChangeFeedStart) -> ChangeFeedRequest {
        ChangeFeedRequest {
            database: DATABASE.into(),
            collection: self.collection.clone(),
            mode: v1::ChangeFeedMode::AllVersionsAndDeletes as i32,
            start: Some(start),
            max_events: 1000,
            ..Default::default()
        }
    }

    /// `n` consumers of the collection's feed (all versions and deletes) from now.
    pub(crate) async fn subscribe(
        &self,
        n: usize,
    ) -> Result<Subscribers, Box<dyn std::error::Error>> {
        let latencies = Arc::new(Latencies {
            writes: StdMutex::new(Histogram::new(3)?),
            expiries: StdMutex::new(Histogram::new(3)?),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut subscribers = Vec::new();
        for i in 0..n {
            let mut client = self.documents(i);
            let mut events = client
                .change_feed(self.change_feed_request(ChangeFeedStart::Now(())))
                .await?
                .into_inner();
            let (latencies, stop) = (latencies.clone(), stop.clone());
            subscribers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let message = match tokio::time::timeout(
                        Duration::from_secs(1),
                        events.message(),
                    )
                    .await
                    {
                        Err(_) => continue,
                        Ok(Ok(Some(message))) => message,
                        Ok(Ok(None)) => {
                            eprintln!("subscriber {i}: the server ended the stream");
                            return;
                        }
                        Ok(Err(status)) => {
                            eprintln!("subscriber {i}: the server ended the stream: {status}");
                            return;
                        }
                    };
                    let arrived = now_ms();
                    for event in message.events {
                        let Some(crts) = event.crts else { continue };
                        let at = (crts.seconds.max(0) as u64) * 1_000
                            + (crts.nanos.max(0) as u64) / 1_000_000;
                        let lag = arrived.saturating_sub(at);
                        let h = if event.time_to_live_expired {
                            &latencies.expiries
                        } else {
                            &latencies.writes
                        };
                        let _ = h.lock().expect("not poisoned").record(lag);
                    }
                }
            }));
        }
        Ok(Subscribers {
            latencies,
            stop,
            tasks: subscribers,
        })
    }

    /// See the module documentation.
    pub(crate) async fn changefeed(self: &Arc<Self>) -> Result<(), Box<dyn std::error::Error>> {
        let subscribers = self.subscribe(self.args.subscribers).await?;
        // Opened and never read: each takes what the server sends until its HTTP/2 window (the
        // stream's, or its connection's, whichever fills first) is full, then holds it. On
        // connections of their own, --idle-per-connection to one: sharing the writers'
        // connections, their unread data would stall the writers' answers (HTTP/2's window is
        // per connection too), which is the load generator's problem, not the server's. From
        // --idle-from, another client as the server counts them: what they hold comes out of
        // that address's share of the response budget, not the reading subscriber's.
        let mut idle = Vec::with_capacity(self.args.idle_subscribers);
        let mut idle_channels = Vec::new();
        let per_connection = self.args.idle_per_connection.max(1);
        for i in 0..self.args.idle_subscribers {
            if i % per_connection == 0 {
                let mut endpoint =
                    tonic::transport::Endpoint::from_shared(format!("http://{}", self.args.addr))?
                        .local_address(match self.args.idle_from.as_str() {
                            "" => None,
                            from => Some(from.parse()?),
                        });
                if let Some(kb) = self.args.idle_window_kb {
                    endpoint = endpoint
                        .initial_connection_window_size(kb * 1024)
                        .initial_stream_window_size(kb * 1024);
                }
                idle_channels.push(endpoint.connect().await?);
            }
            let channel = idle_channels.last().expect("made above").clone();
            let mut client = v1::client::DocumentsClient::with_interceptor(
                channel,
                crate::KeyHeader::of(&self.args),
            );
            idle.push(
                client
                    .change_feed(self.change_feed_request(ChangeFeedStart::Now(())))
                    .await?
                    .into_inner(),
            );
        }
        if !idle.is_empty() {
            println!("# {} idle subscribers opened", idle.len());
        }
        // Writes at --rate per second, --concurrency in flight at most.
        let rate = self.args.rate.max(1);
        let expiring = self.args.expire_percent.min(100) as u64;
        let in_flight = Arc::new(Semaphore::new(self.args.concurrency.max(1)));
        let written = Arc::new(AtomicU64::new(0));
        let behind = Arc::new(AtomicU64::new(0));
        let cpu = self.cpu().start().await;
        let started = Instant::now();
        let duration = Duration::from_secs(self.args.duration);
        let mut n = 0u64;
        // Writes acknowledged in each second, so that a cost paid once (never-reading streams
        // taking what their windows allow) shows apart from the steady state after it.
        let mut timeline = Vec::new();
        let mut second = (1u64, 0u64);
        while started.elapsed() < duration {
            if started.elapsed() >= Duration::from_secs(second.0) {
                let now = written.load(Ordering::Relaxed);
                timeline.push(now - second.1);
                second = (second.0 + 1, now);
            }
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while n < due {
                let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                    // Offered faster than the server answers: counted, not queued.
                    behind.fetch_add(due - n, Ordering::Relaxed);
                    n = due;
                    break;
                };
                let ttl = if n % 100 < expiring { 1 } else { self.args.ttl };
                let request = self.create_request(n, ttl);
                let mut client = self.documents(n as usize);
                let written = written.clone();
                tokio::spawn(async move {
                    if client.create_document(request).await.is_ok() {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(permit);
                });
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let writes = written.load(Ordering::Relaxed);
        cpu.report("write-with-ttl under the feed", writes).await;
        // The last expiries (1 s ttl) and their events.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        println!(
            "writes: {writes} acknowledged in {elapsed:.1} s ({:.0}/s; offered {rate}/s, {} not sent: --concurrency {} in flight were busy)",
            writes as f64 / elapsed,
            behind.load(Ordering::Relaxed),
            self.args.concurrency
        );
        println!(
            "writes acknowledged in each second: {}",
            timeline
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!(
            "subscribers never reading: {}, {per_connection} to a connection, receive windows {}",
            self.args.idle_subscribers,
            self.args.idle_window_kb.map_or(
                "tonic's (5 MiB a connection, 2 MiB a stream)".to_owned(),
                |kb| { format!("{kb} KiB") }
            )
        );
        if let Some(addr) = self.args.metrics {
            let after = crate::metrics::scrape(addr).await?;
            println!(
                "server resident memory at the end: {:.0} MiB; change feed streams open: {:.0}",
                after.value("mayfly_process_resident_memory_bytes") / (1024.0 * 1024.0),
                after.value("mayfly_change_feed_streams")
            );
        }
        drop(idle);
        subscribers.report().await
    }

    /// See the module documentation.
    pub(crate) async fn changefeed_catch_up(
        self: &Arc<Self>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let k = self.args.documents;
        let started = Instant::now();
        self.load(k, Arc::new(|_| 86_400)).await?;
        println!(
            "# wrote {k} documents in {:.1} s ({:.0}/s)",
            started.elapsed().as_secs_f64(),
            k as f64 / started.elapsed().as_secs_f64()
        );
        let cpu = self.cpu().start().await;
        let started = Instant::now();
        let mut events = self
            .documents(0)
            .change_feed(self.change_feed_request(ChangeFeedStart::Beginning(())))
            .await?
            .into_inner();
        let mut seen = 0u64;
        while seen < k {
            let message = tokio::time::timeout(Duration::from_secs(30), events.message())
                .await
                .map_err(|_| "no event for 30 s")??
                .ok_or("the feed ended")?;
            seen += message.events.len() as u64;
        }
        let secs = started.elapsed().as_secs_f64();
        cpu.report("change feed event read from the beginning", seen)
            .await;
        println!(
            "catch-up: {seen} events from the beginning in {secs:.2} s ({:.0} events/s)",
            seen as f64 / secs
        );
        Ok(())
    }
}
