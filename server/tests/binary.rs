//! The `mayfly` binary as operators use it: started from the command line, driven with
//! grpcurl through every grpcurl session of the README (replayed word for word, outputs
//! compared: the rules are in `readme/mod.rs`), stopped with SIGTERM.

use std::{
    io::Read,
    process::{Command, Stdio},
    time::Duration,
};

use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

mod readme;
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

/// Every grpcurl example of the README lies in a session that a test below replays.
#[test]
fn every_readme_grpcurl_example_is_in_a_replayed_session() {
    let parsed = readme::parse(&readme::readme());
    assert!(
        parsed.unreplayed.is_empty(),
        "README lines {:?}: grpcurl examples outside any session, so no test runs them; \
         put them in one (server/tests/readme/mod.rs says how)",
        parsed.unreplayed
    );
    let names: Vec<&str> = parsed.sessions.keys().map(String::as_str).collect();
    assert_eq!(names, ["main", "tls"], "each session has its test here");
}

/// The README's session: the grpcurl examples under Keys, "A grpcurl session" and "Patch
/// and transactional batch", in order, on one fresh server started as "Run it" says, each
/// output shown compared with what grpcurl prints.
#[test]
fn the_readme_grpcurl_session_works_as_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let replay = readme::replay("main", dir.path());
    // What the session is there to show: a document gone once its TTL has passed.
    assert!(
        replay
            .ran
            .iter()
            .any(|r| r.block.script.text.contains("sleep ")
                && r.block
                    .shown
                    .as_ref()
                    .is_some_and(|s| s.text.contains("DOCUMENT_NOT_FOUND"))),
        "the session waits for the TTL and shows the read that follows fail"
    );
}

/// The README's TLS session: OpenSSL makes a CA and a server certificate, the server starts
/// with the flags the README gives, and grpcurl talks to it with `-cacert`.
#[test]
fn the_readme_tls_session_works_as_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let replay = readme::replay("tls", dir.path());
    let server = replay
        .server
        .as_ref()
        .expect("the session starts the server");
    let created = replay.ran.iter().any(|r| {
        r.block.script.text.contains("CreateDatabase")
            && String::from_utf8_lossy(&r.output.stdout).contains("\"securedb\"")
    });
    assert!(created, "a database created over TLS");
    // The same server refuses grpcurl in plaintext (grpcurl gives up on the handshake after
    // its connect timeout, 10 s unless told).
    let plaintext = Command::new(readme::grpcurl())
        .args(["-plaintext", "-connect-timeout", "2", &server.addr, "list"])
        .output()
        .expect("grpcurl runs");
    assert!(!plaintext.status.success(), "plaintext is refused");
}

/// The replay's comparison: placeholders stand for what varies, nothing else may differ.
#[test]
fn readme_outputs_are_compared_strictly_but_for_placeholders() {
    use readme::{compare_json, compare_text, matches};

    assert!(matches("<ts>", "1795636178"));
    assert!(matches(
        "etag <etag> at <time>.",
        "etag 0001 at 2026-11-25T19:49:40.978Z."
    ));
    assert!(!matches("<ts>", ""), "a placeholder stands for something");
    assert!(!matches("a <x> b", "a  c"));
    assert!(
        matches("map<string, int>", "map<string, int>"),
        "not a placeholder"
    );
    assert!(!matches("map<string, int>", "map<bytes, int>"));
    let printed = "{\n  \"id\": \"SO05\",\n  \"body\": {\n      \"total\": 42.5\n    },\n  \"ts\": \"179\"\n}\n";
    assert_eq!(
        compare_json(
            r#"{"ts": "<ts>", "body": {"total": 42.5}, "id": "SO05"}"#,
            printed
        ),
        Ok(())
    );
    for diverging in [
        r#"{"ts": "<ts>", "body": {"total": 42}, "id": "SO05"}"#,
        r#"{"ts": "<ts>", "body": {"total": 42.5}}"#,
        r#"{"ts": "<ts>", "body": {"total": 42.5}, "id": "SO05", "ttl": "<ttl>"}"#,
        r#"{"ts": "<ts>", "body": {"total": 42.5}, "id": "SO05"} {}"#,
        r#"{"ts": "1", "body": {"total": 42.5}, "id": "SO05"}"#,
    ] {
        assert!(compare_json(diverging, printed).is_err(), "{diverging}");
    }
    let error = "ERROR:\n  Code: NotFound\n  Details:\n  1)\t{\"reason\":\"X\"}\n";
    assert_eq!(
        compare_text(
            "ERROR:\nCode: NotFound\nDetails:\n1) {\"reason\":\"<reason>\"}",
            error
        ),
        Ok(())
    );
    assert!(
        compare_text("ERROR:\nCode: NotFound", error).is_err(),
        "lines left out"
    );
    assert!(compare_text("ERROR:\nCode: Internal\nDetails:\n1) <x>", error).is_err());
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
    let before = support::scrape(metrics).await;
    assert_eq!(
        support::metric(&before, "mayfly_expiry_tracked_documents"),
        3.0
    );
    assert!(support::metric(&before, "mayfly_expiry_bookkeeping_bytes") > 0.0);
    assert!(support::metric(&before, "mayfly_process_resident_memory_bytes") > 0.0);
    // The process's CPU time so far (this test's too: the server runs in it), a counter.
    let cpu = support::metric(&before, "mayfly_process_cpu_seconds_total");
    assert!(cpu >= 0.0, "{cpu}");
    assert!(
        before.contains("# TYPE mayfly_process_cpu_seconds counter"),
        "{before}"
    );
    // The purge runs in the background; wait (bounded) for it to free all three.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let text = support::scrape(metrics).await;
        if support::metric(&text, "mayfly_documents_purged_total") == 3.0 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "not purged:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        support::metric(&after, "mayfly_documents_expired_total"),
        3.0
    );
    assert_eq!(
        support::metric(&after, "mayfly_purge_lag_seconds_count"),
        3.0
    );
    assert_eq!(support::metric(&after, "mayfly_documents"), 0.0);
    assert_eq!(
        support::metric(&after, "mayfly_purge_backlog_documents"),
        0.0
    );
    assert_eq!(
        support::metric(&after, "mayfly_expiry_tracked_documents"),
        0.0
    );
}
