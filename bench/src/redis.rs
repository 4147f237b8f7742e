//! Redis workloads: the write and read shapes replayed against Redis (`--redis-addr`) by this
//! same load generator, so that its throughput and server CPU per operation compare with
//! Mayfly's and etcd's on equal terms.
//!
//! - `redis-set`: `SET key value EX --ttl` of `--doc-bytes` values under fresh keys.
//! - `redis-get`: `GET` of `--preload` keys set first.
//!
//! RESP is one request at a time per connection, so each of `--concurrency` requests in flight
//! has its own connection (as `redis-benchmark -c` does). Keys live under
//! `mayfly-bench:<run start, unix ms>:`; a `--ttl` removes what `redis-set` leaves.

use std::{
    error::Error,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use crate::{
    Args, REQUEST_TIMEOUT, Workload,
    cpu::{self, Server},
    now_ms,
    payload::Payloads,
    report, split,
};

pub(crate) async fn run(args: Args) -> Result<(), Box<dyn Error>> {
    println!(
        "# redis at {}, {} B values, SET ... EX {}",
        args.redis_addr, args.doc_bytes, args.ttl
    );
    let redis = Arc::new(Redis {
        prefix: format!("mayfly-bench:{}:", now_ms()),
        payloads: Payloads::new(args.doc_bytes),
        args,
    });
    match redis.args.workload {
        Workload::RedisSet => redis.timed(false).await,
        Workload::RedisGet => {
            redis.preload().await?;
            redis.timed(true).await
        }
        other => Err(format!("{other:?} is not a redis workload").into()),
    }
}

struct Redis {
    prefix: String,
    payloads: Payloads,
    args: Args,
}

/// One connection: requests written whole, replies read one at a time.
struct Connection(BufReader<TcpStream>);

impl Connection {
    async fn open(redis: &Redis) -> Result<Self, Box<dyn Error + Send + Sync>> {
        let stream = TcpStream::connect(redis.args.redis_addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection(BufReader::new(stream)))
    }

    /// Sends one command (its arguments as RESP bulk strings) and reads its reply: `Ok(true)`
    /// for a value or `+OK`, `Ok(false)` for a nil.
    async fn call(&mut self, parts: &[&[u8]]) -> Result<bool, Box<dyn Error + Send + Sync>> {
        let mut request = format!("*{}\r\n", parts.len()).into_bytes();
        for part in parts {
            request.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
            request.extend_from_slice(part);
            request.extend_from_slice(b"\r\n");
        }
        let exchange = async {
            self.0.get_mut().write_all(&request).await?;
            let mut line = String::new();
            self.0.read_line(&mut line).await?;
            match line.as_bytes().first() {
                Some(b'+') => Ok(true),
                Some(b'$') => {
                    let len: i64 = line[1..].trim().parse()?;
                    if len < 0 {
                        return Ok(false);
                    }
                    let mut value = vec![0u8; len as usize + 2];
                    self.0.read_exact(&mut value).await?;
                    Ok(true)
                }
                _ => Err(format!("redis replied {:?}", line.trim()).into()),
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange).await?
    }
}

impl Redis {
    fn key(&self, n: u64) -> Vec<u8> {
        format!("{}{n}", self.prefix).into_bytes()
    }

    async fn set(
        &self,
        conn: &mut Connection,
        n: u64,
    ) -> Result<bool, Box<dyn Error + Send + Sync>> {
        let ttl = self.args.ttl.to_string();
        let value = self.payloads.get(n).as_bytes();
        conn.call(&[b"SET", &self.key(n), value, b"EX", ttl.as_bytes()])
            .await
    }

    /// Sets keys 0..preload, `concurrency` at a time.
    async fn preload(self: &Arc<Self>) -> Result<(), Box<dyn Error>> {
        let started = Instant::now();
        let tasks: Vec<_> = split(self.args.preload, self.args.concurrency)
            .map(|(_, range)| {
                let redis = self.clone();
                tokio::spawn(async move {
                    let mut conn = Connection::open(&redis).await?;
                    for n in range {
                        redis.set(&mut conn, n).await?;
                    }
                    Ok::<_, Box<dyn Error + Send + Sync>>(())
                })
            })
            .collect();
        for task in tasks {
            task.await?.map_err(|e| e.to_string())?;
        }
        println!(
            "# preloaded {} keys in {:.1} s",
            self.args.preload,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Sets fresh keys, or gets preloaded ones, `concurrency` at a time for `--duration` s.
    async fn timed(self: &Arc<Self>, get: bool) -> Result<(), Box<dyn Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(self.args.preload));
        let errors = Arc::new(AtomicU64::new(0));
        let mut connections = Vec::new();
        for _ in 0..self.args.concurrency {
            connections.push(Connection::open(self).await.map_err(|e| e.to_string())?);
        }
        let cpu = cpu::Source::of(&self.args, Server::Redis).start().await;
        let deadline = Instant::now() + Duration::from_secs(self.args.duration);
        let started = Instant::now();
        let tasks: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(worker, mut conn)| {
                let (redis, stop, next, errors) =
                    (self.clone(), stop.clone(), next.clone(), errors.clone());
                tokio::spawn(async move {
                    let mut latency = Histogram::<u64>::new(3).expect("valid histogram");
                    let mut rng = crate::WorkerRng::new(worker as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let done = if get {
                            let n = rng.next() % redis.args.preload.max(1);
                            conn.call(&[b"GET", &redis.key(n)]).await
                        } else {
                            redis
                                .set(&mut conn, next.fetch_add(1, Ordering::Relaxed))
                                .await
                        };
                        match done {
                            Ok(true) => {
                                let _ = latency.record(began.elapsed().as_micros() as u64);
                            }
                            Ok(false) | Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    latency
                })
            })
            .collect();
        let mut latency = Histogram::<u64>::new(3)?;
        for task in tasks {
            latency.add(task.await?)?;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let name = if get { "redis get" } else { "redis set-ex" };
        report(name, &latency, elapsed);
        cpu.report("operation", latency.len()).await;
        println!("errors: {}", errors.load(Ordering::Relaxed));
        Ok(())
    }
}
