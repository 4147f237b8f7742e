//! `mayfly` processes for tests: started from the built binary on a free port, with a data
//! directory of their own, killed when dropped.

#![allow(dead_code, reason = "each test file uses part of this")]

pub(crate) mod clients;
pub(crate) mod cluster;
pub(crate) mod nats;
pub(crate) mod patch_ops;
pub(crate) mod pip_tool;
pub(crate) mod raw;
mod scrape;

#[allow(unused_imports, reason = "each test file uses part of this")]
pub(crate) use scrape::scrape;

use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    time::Duration,
};

/// A running `mayfly`.
pub(crate) struct Mayfly {
    pub(crate) child: Child,
    pub(crate) addr: String,
    pub(crate) stdout: BufReader<ChildStdout>,
}

/// How a `mayfly` that was expected to start ended instead.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) status: ExitStatus,
    pub(crate) stderr: String,
}

impl Mayfly {
    /// Starts `mayfly` with `--listen 127.0.0.1:0 --shards 2` and the given data directory and
    /// extra flags; panics if it does not print its address.
    /// Its log goes to the test's stderr with `MAYFLY_TEST_STDERR=1` (to debug a test).
    pub(crate) fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let stderr = match std::env::var_os("MAYFLY_TEST_STDERR") {
            Some(_) => Stdio::inherit(),
            None => Stdio::null(),
        };
        Self::spawn(data_dir, extra, stderr).unwrap_or_else(|f| {
            panic!("mayfly did not start: {f:?}");
        })
    }

    /// Starts `mayfly`, or reports how it exited (with its stderr).
    pub(crate) fn try_start(data_dir: &Path, extra: &[&str]) -> Result<Self, Failed> {
        let mut server = Self::spawn(data_dir, extra, Stdio::piped())?;
        // Drain stderr so the server never blocks on a full pipe (shown with
        // MAYFLY_TEST_STDERR=1, to debug a test).
        if let Some(mut err) = server.child.stderr.take() {
            std::thread::spawn(move || {
                if std::env::var_os("MAYFLY_TEST_STDERR").is_some() {
                    let _ = std::io::copy(&mut err, &mut std::io::stderr());
                } else {
                    let mut sink = Vec::new();
                    let _ = err.read_to_end(&mut sink);
                }
            });
        }
        Ok(server)
    }

    /// Starts `mayfly` with `--listen 127.0.0.1:0 --shards 2` and the keys of its data
    /// directory (made on first start, under `keys/`) in force.
    pub(crate) fn start_with_keys(data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn_with(data_dir, extra, Stdio::null(), true, &[]).unwrap_or_else(|f| {
            panic!("mayfly did not start: {f:?}");
        })
    }

    /// Without keys (`--insecure-no-auth`): tests of other things than access.
    pub(crate) fn spawn(data_dir: &Path, extra: &[&str], stderr: Stdio) -> Result<Self, Failed> {
        Self::spawn_with(data_dir, extra, stderr, false, &[])
    }

    /// [`Mayfly::start_with_keys`], or how it exited (with its stderr).
    #[allow(
        dead_code,
        reason = "not every test binary starts a keyed server that fails"
    )]
    pub(crate) fn try_start_with_keys(data_dir: &Path, extra: &[&str]) -> Result<Self, Failed> {
        Self::spawn_with(data_dir, extra, Stdio::piped(), true, &[])
    }

    /// [`Mayfly::start`] with environment variables set for the server.
    pub(crate) fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_with(data_dir, extra, Stdio::null(), false, env).unwrap_or_else(|f| {
            panic!("mayfly did not start: {f:?}");
        })
    }

    fn spawn_with(
        data_dir: &Path,
        extra: &[&str],
        stderr: Stdio,
        keys: bool,
        env: &[(&str, &str)],
    ) -> Result<Self, Failed> {
        let mut args = Vec::new();
        if !extra.contains(&"--listen") {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        if !keys {
            args.push("--insecure-no-auth");
        }
        let data_dir = data_dir.to_str().expect("utf-8 temp path");
        args.extend(["--data-dir", data_dir]);
        if !extra.contains(&"--shards") {
            args.extend(["--shards", "2"]);
        }
        args.extend(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_mayfly"))
            .args(&args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("mayfly spawns");
        // The first stdout line names the bound address: no sleeping until it is up.
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read stdout");
        match line.trim().strip_prefix("mayfly listening on ") {
            Some(addr) => Ok(Mayfly {
                child,
                addr: addr.to_owned(),
                stdout,
            }),
            None => {
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = err.read_to_string(&mut stderr);
                }
                let status = child.wait().expect("wait for mayfly");
                Err(Failed { status, stderr })
            }
        }
    }

    /// The gRPC endpoint URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL: no chance to flush or clean up.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal}");
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    pub(crate) fn terminate(mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        // A cluster node hands its partitions over first (up to 15 s).
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("mayfly did not exit within 30 s of SIGTERM");
    }
}

impl Drop for Mayfly {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}
