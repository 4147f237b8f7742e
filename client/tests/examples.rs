//! The examples in `client/examples/` run to completion (each asserts what it shows), as a
//! user would run them: `cargo test` builds them before any test runs; each starts its own
//! server in-process.

use std::{path::PathBuf, process::Command, time::Instant};

/// Where cargo put the example `name`: `target/<profile>/examples/`, beside this test's
/// `deps/` directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    profile.join("examples").join(name)
}

fn run(name: &str, args: &[&str]) {
    let path = example(name);
    assert!(
        path.exists(),
        "{} not built: cargo test builds the examples first",
        path.display()
    );
    let began = Instant::now();
    let output = Command::new(&path)
        .args(args)
        .env_remove("MAYFLY_KEY")
        .output()
        .expect("example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{name} {args:?} ({:?}):\n{stdout}", began.elapsed());
    assert!(
        output.status.success(),
        "{name} failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn session_store_runs() {
    run("session_store", &["--idle-secs", "1"]);
}

#[test]
fn event_log_runs() {
    run("event_log", &["--ttl-secs", "1"]);
}

#[test]
fn idempotency_keys_and_rate_limiter_run() {
    run("idempotency", &[]);
}

#[test]
fn shopping_cart_runs() {
    run("shopping_cart", &["--idle-secs", "1"]);
}

#[test]
fn cache_sync_runs() {
    run("cache_sync", &[]);
}
