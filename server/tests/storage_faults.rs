//! Real storage faults on the real `mayfly` binary: the process runs out of file descriptors,
//! and its data directory's filesystem (a 64 MiB tmpfs) fills up. Either way a write the
//! server could not make durable is reported UNAVAILABLE (never "nothing was written" when it
//! may have been), health turns NOT_SERVING while reads go on, and once the cause is gone the
//! server reopens its data directory by itself: SERVING again, every acknowledged write there,
//! new writes accepted.

use std::{
    collections::BTreeSet,
    fs,
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        CreateCollectionRequest, CreateDatabaseRequest, CreateDocumentRequest, GetDatabaseRequest,
        ReadDocumentRequest,
    },
};
use serde_json::json;
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_types::StatusExt as _;

mod support;

use support::Mayfly;
use support::clients::{Clients, connect, string_pk};

const DATABASE: &str = "faults";
const COLLECTION: &str = "events";

/// The reason code of a Mayfly error.
fn reason(status: &Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// A write that storage could not confirm (`OUTCOME_UNKNOWN`: it may or may not have happened)
/// or refused (`STORAGE_UNAVAILABLE`: it did not): UNAVAILABLE either way, never INTERNAL.
fn assert_unavailable(status: &Status, want: &str, what: &str) {
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "{what}: a storage fault must be UNAVAILABLE, got {status:?}"
    );
    assert_eq!(reason(status), want, "{what}: {status:?}");
    assert!(
        status.message().contains("data directory"),
        "{what}: the message names the data directory: {status:?}"
    );
}

impl Clients {
    async fn status(&mut self) -> i32 {
        self.health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health is always answered")
            .into_inner()
            .status
    }

    /// Polls health until it reports `want`, for at most `limit`.
    async fn wait_for(&mut self, want: ServingStatus, limit: Duration) {
        let started = Instant::now();
        loop {
            if self.status().await == want as i32 {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "health did not turn {want:?} within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn create_database(&mut self) -> Result<(), Status> {
        self.databases
            .create_database(CreateDatabaseRequest {
                id: DATABASE.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn database_exists(&mut self) -> bool {
        match self
            .databases
            .get_database(GetDatabaseRequest {
                id: DATABASE.into(),
            })
            .await
        {
            Ok(_) => true,
            Err(e) if e.code() == Code::NotFound => false,
            Err(e) => panic!("reading the catalog must work during a storage fault: {e:?}"),
        }
    }

    async fn create_collection(&mut self) {
        self.collections
            .create_collection(CreateCollectionRequest {
                database: DATABASE.into(),
                id: COLLECTION.into(),
                partition_key_path: "/pk".into(),
                default_ttl: None,
                indexing_mode: 0,
                indexing_paths: None,
                must_live: None,
                change_feed_retention: None,
                throughput: None,
            })
            .await
            .expect("create collection");
    }

    /// Writes a document with `filler` bytes of text the storage engine cannot compress.
    async fn write(&mut self, id: &str, filler: usize) -> Result<(), Status> {
        let mut state = id.bytes().fold(0x9e37_79b9_7f4a_7c15_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let filler: String = (0..filler)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                char::from(b'a' + (state >> 59) as u8 % 26)
            })
            .collect();
        let body = json!({"id": id, "pk": "p", "filler": filler});
        let serde_json::Value::Object(body) = body else {
            unreachable!("an object literal")
        };
        self.documents
            .create_document(CreateDocumentRequest {
                database: DATABASE.into(),
                collection: COLLECTION.into(),
                body: Some(JsonObject::new(body)),
                partition_key: None,
                ttl: None,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn read(&mut self, id: &str) -> Result<(), Status> {
        self.documents
            .read_document(ReadDocumentRequest {
                database: DATABASE.into(),
                collection: COLLECTION.into(),
                id: id.into(),
                partition_key: Some(string_pk("p")),
            })
            .await
            .map(drop)
    }

    async fn assert_all_present(&mut self, ids: &BTreeSet<String>, when: &str) {
        for id in ids {
            if let Err(e) = self.read(id).await {
                panic!("acknowledged document {id} unreadable {when}: {e:?}");
            }
        }
    }
}

fn open_descriptors(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list the server's descriptors")
        .count()
}

/// Regression: with descriptors exhausted, the fsync thread could not open the journal; the
/// write was reported INTERNAL "nothing was written" yet was there after a restart, and every
/// later request failed until a restart, with health SERVING throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_exhaustion_is_reported_and_recovered_from() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let server = Mayfly::start(&data, &[]);
    let pid = server.child.id();
    let mut clients = connect(&server).await;
    assert_eq!(clients.status().await, ServingStatus::Serving as i32);

    // A limit just above what the server holds now, then idle connections to use it up: the
    // first write needs a descriptor for the journal and finds none.
    let limit = open_descriptors(pid) + 24;
    let prlimit = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(prlimit.success(), "prlimit failed");
    let idle: Vec<TcpStream> = (0..limit)
        .map(|_| TcpStream::connect(&server.addr).expect("the kernel queues connections"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_descriptors(pid) < limit {
        assert!(
            Instant::now() < deadline,
            "the server did not use up its descriptors"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let failed = clients
        .create_database()
        .await
        .expect_err("no descriptor for the journal");
    assert_unavailable(&failed, "OUTCOME_UNKNOWN", "the first write");
    clients
        .wait_for(ServingStatus::NotServing, Duration::from_secs(5))
        .await;
    let refused = clients
        .create_database()
        .await
        .expect_err("writes are refused while storage has failed");
    assert_unavailable(&refused, "STORAGE_UNAVAILABLE", "a write after the failure");
    // Reads are served meanwhile (the answer itself may be either: the outcome is unknown).
    let existed = clients.database_exists().await;

    drop(idle);
    clients
        .wait_for(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    // The write whose outcome was unknown either happened or did not, and the server now says
    // which, consistently.
    let exists = clients.database_exists().await;
    assert!(
        exists || !existed,
        "a database seen during the fault vanished"
    );
    match clients.create_database().await {
        Ok(()) => assert!(!exists, "created twice"),
        Err(e) => {
            assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
            assert!(exists);
        }
    }
    clients.create_collection().await;
    let mut acknowledged = BTreeSet::new();
    for i in 0..20 {
        let id = format!("after-{i}");
        clients.write(&id, 100).await.expect("writes work again");
        acknowledged.insert(id);
    }

    // And they are durable: a restart without the limit finds them.
    drop(clients);
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    let server = Mayfly::start(&data, &[]);
    let mut clients = connect(&server).await;
    clients
        .assert_all_present(&acknowledged, "after a restart")
        .await;
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// `None` where this process may not mount (it needs root, or CAP_SYS_ADMIN).
    fn mount(path: &Path, size_mib: u32) -> Option<Self> {
        fs::create_dir_all(path).expect("mount point");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(path)
            .output()
            .expect("mount runs");
        if !output.status.success() {
            eprintln!(
                "SKIPPED: cannot mount a tmpfs here ({}); run this test as root to cover a full disk",
                String::from_utf8_lossy(&output.stderr).trim()
            );
            return None;
        }
        Some(Tmpfs {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Regression: a full disk poisoned the storage engine and every write failed ("Poisoned")
/// even after space was freed, until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_reported_and_recovered_from_once_space_is_freed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(tmpfs) = Tmpfs::mount(&dir.path().join("mnt"), 64) else {
        return;
    };
    // Space an operator can free later.
    let ballast = tmpfs.path.join("ballast");
    fs::write(&ballast, vec![1u8; 40 << 20]).expect("ballast fits");
    let data = tmpfs.path.join("data");
    let server = Mayfly::start(&data, &["--cache-mb", "8"]);
    let mut clients = connect(&server).await;
    clients.create_database().await.expect("create database");
    clients.create_collection().await;

    let mut acknowledged = BTreeSet::new();
    let mut failure = None;
    for i in 0..1000 {
        let id = format!("doc-{i}");
        match clients.write(&id, 256 * 1024).await {
            Ok(()) => {
                acknowledged.insert(id);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failed = failure.expect("24 MiB fill up before 1000 writes of 256 KiB");
    assert_unavailable(
        &failed,
        "OUTCOME_UNKNOWN",
        "the write that found the disk full",
    );
    assert!(acknowledged.len() > 20, "{} writes", acknowledged.len());
    clients
        .wait_for(ServingStatus::NotServing, Duration::from_secs(5))
        .await;
    let refused = clients
        .write("refused", 10)
        .await
        .expect_err("writes are refused while the disk is full");
    assert_unavailable(&refused, "STORAGE_UNAVAILABLE", "a write after the failure");
    clients
        .assert_all_present(&acknowledged, "while the disk is full")
        .await;

    fs::remove_file(&ballast).expect("free the ballast");
    clients
        .wait_for(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    clients
        .assert_all_present(&acknowledged, "after the server reopened its storage")
        .await;
    clients
        .write("after", 10)
        .await
        .expect("writes work again once space is free");

    drop(clients);
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
}
