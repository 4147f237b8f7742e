//! Server CPU per operation: the server's user + system CPU time read before and after a timed
//! phase, divided by the operations the phase completed. Where the load generator shares the
//! cores with the server, throughput mostly measures the clients; the server's CPU per
//! operation does not, and it is what a user pays for.
//!
//! Sources, in order: `--server-pid` (`/proc/PID/stat`, any local server); otherwise the
//! server's own report: Mayfly's `mayfly_process_cpu_seconds_total` at `--metrics`, etcd's
//! `process_cpu_seconds_total` at its client address's `/metrics`, Redis's `INFO cpu`.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{Args, metrics};

/// Where the server's CPU time is read.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// `/proc/PID/stat` of a local process.
    Pid(u32),
    /// A Prometheus text endpoint and the counter to read there.
    Prometheus(SocketAddr, &'static str),
    /// A Redis server's `INFO cpu`.
    Redis(SocketAddr),
    /// Nothing to read: CPU is not reported.
    Unknown,
}

/// Which server a workload drives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Server {
    Mayfly,
    Etcd,
    Redis,
}

impl Source {
    /// The source for `server` given the command line.
    pub(crate) fn of(args: &Args, server: Server) -> Self {
        if let Some(pid) = args.server_pid {
            return Source::Pid(pid);
        }
        match server {
            Server::Mayfly => args.metrics.map_or(Source::Unknown, |addr| {
                Source::Prometheus(addr, "mayfly_process_cpu_seconds_total")
            }),
            Server::Etcd => Source::Prometheus(args.etcd_addr, "process_cpu_seconds_total"),
            Server::Redis => Source::Redis(args.redis_addr),
        }
    }

    /// The server's CPU seconds so far; `None` if they cannot be read.
    pub(crate) async fn seconds(&self) -> Option<f64> {
        match self {
            Source::Pid(pid) => proc_seconds(*pid),
            Source::Prometheus(addr, name) => {
                let scrape = tokio::time::timeout(Duration::from_secs(5), metrics::scrape(*addr))
                    .await
                    .ok()?
                    .ok()?;
                scrape.get(name)
            }
            Source::Redis(addr) => redis_seconds(*addr).await,
            Source::Unknown => None,
        }
    }

    /// Starts measuring a phase.
    pub(crate) async fn start(&self) -> Meter {
        Meter {
            source: self.clone(),
            before: self.seconds().await,
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Pid(pid) => format!("/proc/{pid}/stat"),
            Source::Prometheus(addr, name) => format!("{name} at {addr}"),
            Source::Redis(addr) => format!("INFO cpu at {addr}"),
            Source::Unknown => String::new(),
        }
    }
}

/// CPU time at the start of a phase.
#[derive(Debug)]
pub(crate) struct Meter {
    source: Source,
    before: Option<f64>,
}

impl Meter {
    /// Prints the server's CPU per operation over the phase: `ops` of `what` completed.
    pub(crate) async fn report(self, what: &str, ops: u64) {
        if let Source::Unknown = self.source {
            println!("server cpu: not measured (give --server-pid, or --metrics for Mayfly)");
            return;
        }
        let after = self.source.seconds().await;
        match (self.before, after) {
            (Some(before), Some(after)) if ops > 0 => println!(
                "server cpu: {:.1} us per {what} ({:.2} s for {ops}; {})",
                (after - before) * 1e6 / ops as f64,
                after - before,
                self.source.describe()
            ),
            _ => println!(
                "server cpu: not measured ({} unreadable, or no operations)",
                self.source.describe()
            ),
        }
    }
}

/// utime + stime of a local process, in seconds.
fn proc_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its closing parenthesis.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // USER_HZ: 100 ticks per second on every Linux target.
    Some((utime + stime) as f64 / 100.0)
}

/// `used_cpu_sys + used_cpu_user` from a Redis server's `INFO cpu`.
async fn redis_seconds(addr: SocketAddr) -> Option<f64> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"INFO cpu\r\n").await.ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        // A bulk string: `$LEN\r\n` then LEN bytes and `\r\n`.
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            reply.extend_from_slice(&buf[..n]);
            let text = std::str::from_utf8(&reply).ok()?;
            if let Some((len, body)) = text.strip_prefix('$').and_then(|t| t.split_once("\r\n"))
                && body.len() >= len.parse::<usize>().ok()?
            {
                return Some(info_cpu_seconds(body));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
        .flatten()
}

fn info_cpu_seconds(info: &str) -> Option<f64> {
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_info_adds_system_and_user_time() {
        let info = "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n";
        assert_eq!(info_cpu_seconds(info), Some(3.75));
        assert_eq!(info_cpu_seconds("# CPU\r\n"), None);
    }

    #[test]
    fn own_process_cpu_is_readable() {
        assert!(proc_seconds(std::process::id()).is_some());
    }
}
