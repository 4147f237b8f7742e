//! `recovery`: how fast a `mayfly` comes back. Starts `--server-bin` on `--data-dir` (which
//! must not exist yet), loads `--documents` documents with a long ttl through 64 concurrent
//! durable writes, kills the server with SIGKILL, restarts it and measures: start to serving
//! (address line), start to the first successful read, the expiry-timer rebuild (from the
//! server's log line), on-disk bytes per document and resident memory per document.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use crate::{Args, Bench, connect, payload::Payloads};

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
    pub(crate) logs: mpsc::Receiver<String>,
}

/// Starts `bin` on a free loopback port over `data_dir`, without keys (these workloads
/// measure the engine, not access), with `extra` flags.
pub(crate) fn start(
    bin: &Path,
    data_dir: &Path,
    cache_mb: u64,
    extra: &[&str],
) -> Result<Server, Box<dyn std::error::Error>> {
    let mut child = Command::new(bin)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--cache-mb",
            &cache_mb.to_string(),
            "--insecure-no-auth",
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or("stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("mayfly listening on ")
        .ok_or_else(|| format!("unexpected first line from mayfly: {line:?}"))?
        .to_owned();
    let stderr = BufReader::new(child.stderr.take().ok_or("stderr")?);
    let (tx, logs) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Ok(Server { child, addr, logs })
}

/// `--server-bin` and `--data-dir`, which must not exist yet: `workload` starts from nothing.
pub(crate) fn server_and_new_dir(
    args: &Args,
    workload: &str,
) -> Result<(PathBuf, PathBuf), Box<dyn std::error::Error>> {
    let bin = args
        .server_bin
        .clone()
        .ok_or_else(|| format!("{workload} needs --server-bin"))?;
    let data_dir = args
        .data_dir
        .clone()
        .ok_or_else(|| format!("{workload} needs --data-dir"))?;
    if data_dir.exists() {
        return Err(format!(
            "{} exists: {workload} starts from a new data dir",
            data_dir.display()
        )
        .into());
    }
    Ok((bin, data_dir))
}

pub(crate) fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `key=value` out of a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

pub(crate) async fn run(mut args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let (bin, data_dir) = server_and_new_dir(&args, "recovery")?;
    // Cache kept small so that resident memory shows the engine's own per-document state.
    let cache_mb = 8;
    let server = start(&bin, &data_dir, cache_mb, &[])?;
    let empty_rss = rss_bytes(server.child.id());
    args.addr = server.addr.parse()?;
    let bench = Arc::new(Bench::start(args).await?);
    let loaded = Instant::now();
    let documents = bench.args.documents;
    bench.load(documents, Arc::new(|_| 86_400)).await?;
    let load_secs = loaded.elapsed().as_secs_f64();
    println!(
        "loaded {documents} documents in {load_secs:.1} s ({:.0} durable writes/s)",
        documents as f64 / load_secs
    );
    let Server { mut child, .. } = server;
    child.kill()?;
    child.wait()?;
    let disk = dir_bytes(&data_dir);

    let started = Instant::now();
    let server = start(&bin, &data_dir, cache_mb, &[])?;
    let serving = started.elapsed();
    let mut args = bench.args.clone();
    args.addr = server.addr.parse()?;
    let channels = connect(&args).await?;
    let reader = Bench {
        channels,
        collection: bench.collection.clone(),
        payloads: Payloads::new(0),
        args,
    };
    reader
        .documents(0)
        .read_document(reader.read_request(documents - 1))
        .await?;
    let first_read = started.elapsed();
    let rebuild = loop {
        let line = server.logs.recv_timeout(Duration::from_secs(120))?;
        if line.contains("expiry tracking rebuilt") {
            break line;
        }
    };
    let rss = rss_bytes(server.child.id());
    let Server { mut child, .. } = server;
    child.kill()?;
    child.wait()?;

    println!("after SIGKILL, restart with {documents} documents:");
    println!(
        "  start to serving (address line):  {:.3} s",
        serving.as_secs_f64()
    );
    println!(
        "  start to first read answered:     {:.3} s",
        first_read.as_secs_f64()
    );
    let entries = field(&rebuild, "timers").unwrap_or(0)
        + field(&rebuild, "queued").unwrap_or(0)
        + field(&rebuild, "past_due").unwrap_or(0);
    let ms = field(&rebuild, "ms").unwrap_or(0);
    println!(
        "  expiry rebuild (background):      {entries} entries in {ms} ms ({} entries/s)",
        field(&rebuild, "entries_per_sec").unwrap_or(0)
    );
    println!(
        "  on disk:                          {:.1} MiB, {:.0} bytes per ~{} B document",
        disk as f64 / 1_048_576.0,
        disk as f64 / documents as f64,
        bench.args.doc_bytes
    );
    println!(
        "  resident memory:                  {:.1} MiB empty, {:.1} MiB recovered: {:.0} bytes per document (block cache {cache_mb} MiB)",
        empty_rss as f64 / 1_048_576.0,
        rss as f64 / 1_048_576.0,
        rss.saturating_sub(empty_rss) as f64 / documents as f64
    );
    Ok(())
}
