//! `mayfly`: parses flags, starts the server, stops it on SIGINT or SIGTERM.

use std::{io::IsTerminal, net::SocketAddr, process::ExitCode};

use clap::Parser;
use mayfly_server::{Config, RunningServer, default_shards};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

// Documents are allocated by request threads and freed by purge threads; glibc's allocator
// spent close to half of the purge's time on that pattern (measured with perf), mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Mayfly: a document database served over gRPC that expires data by Cosmos DB's TTL rules.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address for gRPC (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Engine shards (default: one per core).
    #[arg(long, default_value_t = default_shards().clamp(1, 1024) as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    shards: u16,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Logs go to stderr: stdout carries only the address line that scripts read.
    let stderr = std::io::stderr();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(stderr.is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        shards: usize::from(args.shards),
        metrics_listen: args.metrics_listen,
    };
    // Handlers first: a supervisor may signal as soon as it reads the address line, and a
    // signal arriving before them would kill the process instead of stopping it gracefully.
    let mut signals = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("mayfly: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = match RunningServer::start(config).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("mayfly: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address goes to stdout so that scripts (and tests) can read the port picked for :0.
    println!("mayfly listening on {}", server.local_addr());
    tracing::info!(
        listen = %server.local_addr(),
        shards = server.engine().shard_count(),
        metrics = ?server.metrics_addr(),
        "serving (memory storage: data does not survive a restart)"
    );
    tokio::select! {
        _ = signals.0.recv() => {}
        _ = signals.1.recv() => {}
    }
    tracing::info!("shutting down");
    match server.shutdown().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mayfly: {e}");
            ExitCode::FAILURE
        }
    }
}
