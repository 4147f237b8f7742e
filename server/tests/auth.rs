//! Keys and resource tokens against the real binary, for every RPC: no credentials, a key that
//! is not the server's, a read-only key, tokens out of scope or expired, and key rotation.

mod support;

use std::{path::Path, time::Duration};

use mayfly_proto::{
    json::JsonObject,
    v1::{
        BatchCreate, BatchOperation, ChangeFeedRequest, CreateCollectionRequest,
        CreateDatabaseRequest, CreateDocumentRequest, CreateResourceTokenRequest,
        DeleteCollectionRequest, DeleteDatabaseRequest, DeleteDocumentRequest, ExecuteBatchRequest,
        GetCollectionRequest, GetDatabaseRequest, GetFeedRangesRequest, KeyKind,
        ListCollectionsRequest, ListDatabasesRequest, PatchDocumentRequest, PatchOperation,
        QueryRequest, ReadDocumentRequest, ReadFeedRequest, RegenerateKeyRequest,
        ReplaceCollectionRequest, ReplaceDocumentRequest, TokenPermission, TouchDocumentRequest,
        UpsertDocumentRequest,
        oneofs::{BatchOp, PatchOp},
    },
};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use support::{
    Mayfly,
    clients::{self, Clients, string_pk, with},
    cluster::{keyed_cluster_node, settled_map_with},
    nats::NatsCluster,
};

/// Every RPC of the Mayfly services.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rpc {
    CreateDatabase,
    GetDatabase,
    ListDatabases,
    DeleteDatabase,
    CreateCollection,
    GetCollection,
    ListCollections,
    ReplaceCollection,
    DeleteCollection,
    CreateDocument,
    UpsertDocument,
    ReplaceDocument,
    ReadDocument,
    DeleteDocument,
    TouchDocument,
    PatchDocument,
    ExecuteBatch,
    ReadFeed,
    Query,
    ChangeFeed,
    GetFeedRanges,
    RegenerateKey,
    CreateResourceToken,
    GetPartitionMap,
}

/// What an RPC needs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Needs {
    Read,
    Write,
    Manage,
}

const EVERY_RPC: [(Rpc, Needs); 24] = [
    (Rpc::CreateDatabase, Needs::Manage),
    (Rpc::GetDatabase, Needs::Read),
    (Rpc::ListDatabases, Needs::Read),
    (Rpc::DeleteDatabase, Needs::Manage),
    (Rpc::CreateCollection, Needs::Manage),
    (Rpc::GetCollection, Needs::Read),
    (Rpc::ListCollections, Needs::Read),
    (Rpc::ReplaceCollection, Needs::Manage),
    (Rpc::DeleteCollection, Needs::Manage),
    (Rpc::CreateDocument, Needs::Write),
    (Rpc::UpsertDocument, Needs::Write),
    (Rpc::ReplaceDocument, Needs::Write),
    (Rpc::ReadDocument, Needs::Read),
    (Rpc::DeleteDocument, Needs::Write),
    (Rpc::TouchDocument, Needs::Write),
    (Rpc::PatchDocument, Needs::Write),
    (Rpc::ExecuteBatch, Needs::Write),
    (Rpc::ReadFeed, Needs::Read),
    (Rpc::Query, Needs::Read),
    (Rpc::ChangeFeed, Needs::Read),
    (Rpc::GetFeedRanges, Needs::Read),
    (Rpc::RegenerateKey, Needs::Manage),
    (Rpc::CreateResourceToken, Needs::Manage),
    (Rpc::GetPartitionMap, Needs::Read),
];

fn key(data_dir: &Path, name: &str) -> String {
    std::fs::read_to_string(data_dir.join("keys").join(name))
        .expect("key file")
        .trim()
        .to_owned()
}

fn body(id: &str, pk: &str) -> Option<JsonObject> {
    let serde_json::Value::Object(map) = serde_json::json!({"id": id, "pk": pk}) else {
        unreachable!("an object")
    };
    Some(JsonObject::new(map))
}

/// Calls `rpc` on database `d`, collection `c` (documents of partition `pk`, or of every
/// partition where the RPC allows it and `pk` is `None`). Targets are chosen so that a call
/// let through changes nothing the other calls rely on: deletes name absent things, creates
/// existing ones.
async fn call(
    c: &mut Clients,
    rpc: Rpc,
    credential: Option<&str>,
    collection: &str,
    pk: Option<&str>,
) -> Result<(), Status> {
    let cred = credential;
    let partition = pk.map(string_pk);
    let doc_pk = || partition.clone().or_else(|| Some(string_pk("p1")));
    let (d, coll) = ("d".to_owned(), collection.to_owned());
    match rpc {
        Rpc::CreateDatabase => c
            .databases
            .create_database(with(
                cred,
                CreateDatabaseRequest {
                    id: d,
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::GetDatabase => c
            .databases
            .get_database(with(cred, GetDatabaseRequest { id: d }))
            .await
            .map(drop),
        Rpc::ListDatabases => c
            .databases
            .list_databases(with(cred, ListDatabasesRequest {}))
            .await
            .map(drop),
        Rpc::DeleteDatabase => c
            .databases
            .delete_database(with(
                cred,
                DeleteDatabaseRequest {
                    id: "absent".into(),
                },
            ))
            .await
            .map(drop),
        Rpc::CreateCollection => c
            .collections
            .create_collection(with(
                cred,
                CreateCollectionRequest {
                    database: d,
                    id: coll,
                    partition_key_path: "/pk".into(),
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::GetCollection => c
            .collections
            .get_collection(with(
                cred,
                GetCollectionRequest {
                    database: d,
                    id: coll,
                },
            ))
            .await
            .map(drop),
        Rpc::ListCollections => c
            .collections
            .list_collections(with(cred, ListCollectionsRequest { database: d }))
            .await
            .map(drop),
        Rpc::ReplaceCollection => c
            .collections
            .replace_collection(with(
                cred,
                ReplaceCollectionRequest {
                    database: d,
                    id: "absent".into(),
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::DeleteCollection => c
            .collections
            .delete_collection(with(
                cred,
                DeleteCollectionRequest {
                    database: d,
                    id: "absent".into(),
                },
            ))
            .await
            .map(drop),
        Rpc::CreateDocument => c
            .documents
            .create_document(with(
                cred,
                CreateDocumentRequest {
                    database: d,
                    collection: coll,
                    body: body("x", pk.unwrap_or("p1")),
                    partition_key: partition,
                    ttl: None,
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::UpsertDocument => c
            .documents
            .upsert_document(with(
                cred,
                UpsertDocumentRequest {
                    database: d,
                    collection: coll,
                    body: body("x", pk.unwrap_or("p1")),
                    partition_key: partition,
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::ReplaceDocument => c
            .documents
            .replace_document(with(
                cred,
                ReplaceDocumentRequest {
                    database: d,
                    collection: coll,
                    id: "x".into(),
                    partition_key: doc_pk(),
                    body: body("x", pk.unwrap_or("p1")),
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::ReadDocument => c
            .documents
            .read_document(with(
                cred,
                ReadDocumentRequest {
                    database: d,
                    collection: coll,
                    id: "x".into(),
                    partition_key: doc_pk(),
                },
            ))
            .await
            .map(drop),
        Rpc::DeleteDocument => c
            .documents
            .delete_document(with(
                cred,
                DeleteDocumentRequest {
                    database: d,
                    collection: coll,
                    id: "absent".into(),
                    partition_key: doc_pk(),
                    if_match: String::new(),
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::TouchDocument => c
            .documents
            .touch_document(with(
                cred,
                TouchDocumentRequest {
                    database: d,
                    collection: coll,
                    id: "absent".into(),
                    partition_key: doc_pk(),
                    if_match: String::new(),
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::PatchDocument => c
            .documents
            .patch_document(with(
                cred,
                PatchDocumentRequest {
                    database: d,
                    collection: coll,
                    id: "absent".into(),
                    partition_key: doc_pk(),
                    operations: vec![PatchOperation {
                        op: Some(PatchOp::Remove("/x".into())),
                    }],
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        // Creates a document that exists once a call was let through: the batch fails whole.
        Rpc::ExecuteBatch => c
            .documents
            .execute_batch(with(
                cred,
                ExecuteBatchRequest {
                    database: d,
                    collection: coll,
                    partition_key: doc_pk(),
                    operations: vec![BatchOperation {
                        op: Some(BatchOp::Create(BatchCreate {
                            body: body("x", pk.unwrap_or("p1")),
                            ttl: None,
                        })),
                    }],
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::ReadFeed => {
            let mut pages = c
                .documents
                .read_feed(with(
                    cred,
                    ReadFeedRequest {
                        database: d,
                        collection: coll,
                        partition_key: partition,
                        page_size: 10,
                        continuation: String::new(),
                    },
                ))
                .await?
                .into_inner();
            while pages.message().await?.is_some() {}
            Ok(())
        }
        Rpc::Query => {
            let mut pages = c
                .documents
                .query(with(
                    cred,
                    QueryRequest {
                        database: d,
                        collection: coll,
                        query: "SELECT * FROM c".into(),
                        partition_key: partition,
                        ..Default::default()
                    },
                ))
                .await?
                .into_inner();
            while pages.message().await?.is_some() {}
            Ok(())
        }
        // The first message comes at once, before any change: the stream is then dropped.
        Rpc::ChangeFeed => {
            let mut events = c
                .documents
                .change_feed(with(
                    cred,
                    ChangeFeedRequest {
                        database: d,
                        collection: coll,
                        partition_key: partition,
                        ..Default::default()
                    },
                ))
                .await?
                .into_inner();
            events.message().await?;
            Ok(())
        }
        Rpc::GetFeedRanges => c
            .documents
            .get_feed_ranges(with(
                cred,
                GetFeedRangesRequest {
                    database: d,
                    collection: coll,
                    count: 2,
                },
            ))
            .await
            .map(drop),
        // Only the secondary read-only key, which no test here uses.
        Rpc::RegenerateKey => c
            .admin
            .regenerate_key(with(
                cred,
                RegenerateKeyRequest {
                    kind: KeyKind::SecondaryReadOnly as i32,
                },
            ))
            .await
            .map(drop),
        Rpc::CreateResourceToken => c
            .admin
            .create_resource_token(with(
                cred,
                CreateResourceTokenRequest {
                    database: d,
                    collection: coll,
                    ..Default::default()
                },
            ))
            .await
            .map(drop),
        Rpc::GetPartitionMap => c
            .admin
            .get_partition_map(with(cred, mayfly_proto::v1::GetPartitionMapRequest {}))
            .await
            .map(|map| {
                // Every partition owned, placed by the specified hash; the node answering
                // serves its own. A single server: its shards, every one its own.
                let map = map.into_inner();
                assert_eq!(map.placement, "xxh3-64");
                assert_eq!(map.owners.len(), map.partitions as usize);
                assert!(
                    map.owners
                        .iter()
                        .all(|o| !o.owner.is_empty() && o.served_here == (o.owner == map.node))
                );
                if map.node == "local" {
                    assert!(map.owners.iter().all(|o| o.owner == "local"));
                }
            }),
    }
}

fn reason(status: &Status) -> String {
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// Let through: whatever else happened, it was not refused for access.
fn let_through(result: &Result<(), Status>) -> bool {
    !matches!(result, Err(s) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied))
}

async fn mint(
    c: &mut Clients,
    credential: &str,
    collection: &str,
    pk: Option<&str>,
    permission: TokenPermission,
    ttl_seconds: Option<u32>,
) -> String {
    c.admin
        .create_resource_token(with(
            Some(credential),
            CreateResourceTokenRequest {
                database: "d".into(),
                collection: collection.into(),
                partition_key: pk.map(string_pk),
                permission: permission as i32,
                ttl_seconds,
            },
        ))
        .await
        .expect("minted")
        .into_inner()
        .token
}

/// Where the cases run: one server, or a node of a three-node cluster.
#[derive(Debug, Clone, Copy)]
enum Target {
    Single,
    Cluster,
}

/// Where a target keeps the keys it accepts (a cluster node: its copy of the cluster's).
struct KeysDir {
    _tmp: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl KeysDir {
    fn path(&self) -> &Path {
        &self.path
    }
}

/// A server with its keys, database `d` and collections `c` and `c2` (partition key `/pk`):
/// one server, or three cluster nodes (the clients call the first, which forwards to the
/// others) once their partitions' ownership has settled.
async fn secured(target: Target) -> (KeysDir, Box<dyn std::any::Any>, Clients, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (keys_in, servers, mut c): (_, Box<dyn std::any::Any>, _) = match target {
        Target::Single => {
            let server = Mayfly::start_with_keys(dir.path(), &[]);
            let c = clients::connect(&server).await;
            (dir.path().to_owned(), Box::new(server), c)
        }
        Target::Cluster => {
            let nats = NatsCluster::start(3);
            let nodes: Vec<Mayfly> = ["a", "b", "c"]
                .into_iter()
                .map(|node| keyed_cluster_node(&nats, dir.path(), node))
                .collect();
            let c = clients::connect(&nodes[0]).await;
            let keys_in = dir.path().join("a");
            settled_map_with(&c.admin, &["a", "b", "c"], Some(&key(&keys_in, "primary"))).await;
            // Fields drop in order: the nodes before the NATS servers.
            (keys_in, Box::new((nodes, nats)), c)
        }
    };
    let (primary, read_only) = (key(&keys_in, "primary"), key(&keys_in, "primary-readonly"));
    for rpc in [Rpc::CreateDatabase, Rpc::CreateCollection] {
        for collection in ["c", "c2"] {
            let _ = call(&mut c, rpc, Some(&primary), collection, None).await;
        }
    }
    let dir = KeysDir {
        _tmp: dir,
        path: keys_in,
    };
    (dir, servers, c, primary, read_only)
}

/// The cases below, each on a three-node cluster of its own, through its first node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_hold_on_a_three_node_cluster() {
    every_rpc_needs_a_key_and_read_only_keys_only_read_at(Target::Cluster).await;
    resource_tokens_are_held_to_their_scope_permission_and_expiry_at(Target::Cluster).await;
    rotating_keys_never_refuses_a_client_holding_the_current_key_at(Target::Cluster).await;
    a_token_grants_nothing_on_a_resource_created_again_under_its_name_at(Target::Cluster).await;
    a_regenerated_key_ends_the_change_feeds_it_opened_at(Target::Cluster).await;
}

#[tokio::test]
async fn every_rpc_needs_a_key_and_read_only_keys_only_read() {
    every_rpc_needs_a_key_and_read_only_keys_only_read_at(Target::Single).await;
}

async fn every_rpc_needs_a_key_and_read_only_keys_only_read_at(target: Target) {
    let (dir, _server, mut c, primary, read_only) = secured(target).await;
    assert_eq!(primary.len(), 43, "32 random bytes");
    for (rpc, needs) in EVERY_RPC {
        let none = call(&mut c, rpc, None, "c", None)
            .await
            .expect_err("refused");
        assert_eq!(none.code(), Code::Unauthenticated, "{rpc:?}: {none:?}");
        assert_eq!(reason(&none), "MISSING_CREDENTIALS", "{rpc:?}");
        let wrong = call(&mut c, rpc, Some("not-a-key-of-this-server"), "c", None)
            .await
            .expect_err("refused");
        assert_eq!(wrong.code(), Code::Unauthenticated, "{rpc:?}: {wrong:?}");

        let result = call(&mut c, rpc, Some(&read_only), "c", None).await;
        if needs == Needs::Read {
            assert!(
                let_through(&result),
                "{rpc:?} with a read-only key: {result:?}"
            );
        } else {
            let denied = result.expect_err("refused");
            assert_eq!(denied.code(), Code::PermissionDenied, "{rpc:?}: {denied:?}");
            assert_eq!(reason(&denied), "READ_ONLY_KEY", "{rpc:?}");
        }
        let result = call(&mut c, rpc, Some(&primary), "c", None).await;
        assert!(
            let_through(&result),
            "{rpc:?} with the primary key: {result:?}"
        );
    }
    // Keys are files of their own, readable by the server's user only.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.path().join("keys/primary"))
        .expect("key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[tokio::test]
async fn resource_tokens_are_held_to_their_scope_permission_and_expiry() {
    resource_tokens_are_held_to_their_scope_permission_and_expiry_at(Target::Single).await;
}

async fn resource_tokens_are_held_to_their_scope_permission_and_expiry_at(target: Target) {
    let (_dir, _server, mut c, primary, _) = secured(target).await;
    let collection_read = mint(&mut c, &primary, "c", None, TokenPermission::Read, None).await;
    let partition_all = mint(
        &mut c,
        &primary,
        "c",
        Some("p1"),
        TokenPermission::All,
        None,
    )
    .await;
    for (rpc, needs) in EVERY_RPC {
        // A read token for collection c: reads of c only.
        let result = call(&mut c, rpc, Some(&collection_read), "c", None).await;
        let expected = match (rpc, needs) {
            (
                Rpc::GetCollection
                | Rpc::ReadDocument
                | Rpc::ReadFeed
                | Rpc::Query
                | Rpc::ChangeFeed
                | Rpc::GetFeedRanges,
                _,
            ) => None,
            (_, Needs::Write) => Some("READ_ONLY_TOKEN"),
            (_, Needs::Manage) => Some("KEY_REQUIRED"),
            // Listing databases or collections, or the partition map, reaches beyond one
            // collection.
            (_, Needs::Read) => Some("OUT_OF_TOKEN_SCOPE"),
        };
        match expected {
            None => assert!(let_through(&result), "{rpc:?}: {result:?}"),
            Some(why) => {
                let denied = result.expect_err("refused");
                assert_eq!(denied.code(), Code::PermissionDenied, "{rpc:?}: {denied:?}");
                assert_eq!(reason(&denied), why, "{rpc:?}: {}", denied.message());
            }
        }
        if needs != Needs::Manage && rpc != Rpc::ListDatabases && rpc != Rpc::ListCollections {
            let other = call(&mut c, rpc, Some(&collection_read), "c2", None)
                .await
                .expect_err("another collection");
            assert_eq!(
                other.code(),
                Code::PermissionDenied,
                "{rpc:?} on c2: {other:?}"
            );
        }

        // A read-write token for partition p1 of c. Splitting the feed of the whole
        // collection is not its to ask (it reads its partition's feed by the partition key).
        if needs == Needs::Manage
            || matches!(
                rpc,
                Rpc::ListDatabases
                    | Rpc::ListCollections
                    | Rpc::GetDatabase
                    | Rpc::GetFeedRanges
                    | Rpc::GetPartitionMap
            )
        {
            continue;
        }
        let inside = call(&mut c, rpc, Some(&partition_all), "c", Some("p1")).await;
        assert!(let_through(&inside), "{rpc:?} in p1: {inside:?}");
        if rpc == Rpc::GetCollection {
            continue;
        }
        let outside = call(&mut c, rpc, Some(&partition_all), "c", Some("p2"))
            .await
            .expect_err("another partition");
        assert_eq!(
            reason(&outside),
            "OUT_OF_TOKEN_SCOPE",
            "{rpc:?}: {outside:?}"
        );
        assert!(
            outside.message().contains("\"p1\""),
            "{}",
            outside.message()
        );
    }
    // Without a partition key, a feed or query could reach every partition.
    for rpc in [
        Rpc::ReadFeed,
        Rpc::Query,
        Rpc::ChangeFeed,
        Rpc::CreateDocument,
    ] {
        let unscoped = call(&mut c, rpc, Some(&partition_all), "c", None)
            .await
            .expect_err("no partition named");
        assert_eq!(reason(&unscoped), "OUT_OF_TOKEN_SCOPE", "{rpc:?}");
        assert!(
            unscoped.message().contains("set partition_key"),
            "{}",
            unscoped.message()
        );
    }

    let short = mint(&mut c, &primary, "c", None, TokenPermission::All, Some(1)).await;
    assert!(let_through(
        &call(&mut c, Rpc::ReadDocument, Some(&short), "c", None).await
    ));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired = call(&mut c, Rpc::ReadDocument, Some(&short), "c", None)
        .await
        .expect_err("expired");
    assert_eq!(expired.code(), Code::Unauthenticated);
    assert_eq!(reason(&expired), "TOKEN_EXPIRED", "{}", expired.message());

    // An altered token is not one.
    let mut altered = collection_read.clone().into_bytes();
    let at = altered.len() / 2;
    altered[at] = if altered[at] == b'x' { b'y' } else { b'x' };
    let altered = String::from_utf8(altered).expect("ascii");
    let refused = call(&mut c, Rpc::ReadDocument, Some(&altered), "c", None)
        .await
        .expect_err("altered");
    assert_eq!(refused.code(), Code::Unauthenticated);

    // Tokens live at most a day.
    let too_long = c
        .admin
        .create_resource_token(with(
            Some(&primary),
            CreateResourceTokenRequest {
                database: "d".into(),
                ttl_seconds: Some(86_401),
                ..Default::default()
            },
        ))
        .await
        .expect_err("too long");
    assert_eq!(too_long.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn rotating_keys_never_refuses_a_client_holding_the_current_key() {
    rotating_keys_never_refuses_a_client_holding_the_current_key_at(Target::Single).await;
}

async fn rotating_keys_never_refuses_a_client_holding_the_current_key_at(target: Target) {
    let (dir, _server, mut c, primary, _) = secured(target).await;
    let regenerate = async |c: &mut Clients, credential: &str, kind: KeyKind| {
        c.admin
            .regenerate_key(with(
                Some(credential),
                RegenerateKeyRequest { kind: kind as i32 },
            ))
            .await
            .expect("regenerated")
            .into_inner()
            .key
    };
    let token = mint(&mut c, &primary, "c", None, TokenPermission::Read, None).await;
    // 1. A fresh secondary; clients on the primary go on meanwhile.
    let secondary = regenerate(&mut c, &primary, KeyKind::Secondary).await;
    assert_eq!(
        secondary,
        key(dir.path(), "secondary"),
        "written to the key file"
    );
    for credential in [&primary, &secondary, &token] {
        let read = call(&mut c, Rpc::ReadDocument, Some(credential), "c", None).await;
        assert!(let_through(&read), "{read:?}");
    }
    // 2. Clients move to the secondary; 3. the primary is regenerated.
    let new_primary = regenerate(&mut c, &secondary, KeyKind::Primary).await;
    for credential in [&secondary, &new_primary] {
        let read = call(&mut c, Rpc::ReadDocument, Some(credential), "c", None).await;
        assert!(let_through(&read), "{read:?}");
    }
    for revoked in [&primary, &token] {
        let refused = call(&mut c, Rpc::ReadDocument, Some(revoked), "c", None)
            .await
            .expect_err("the old primary and its tokens are revoked");
        assert_eq!(refused.code(), Code::Unauthenticated);
    }
}

#[test]
fn a_server_without_keys_stays_on_loopback_unless_told_otherwise() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mayfly"))
        .args(["--storage", "memory", "--listen", "0.0.0.0:0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--primary-key") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mayfly"))
        .args(["--storage", "memory", "--primary-key", "short"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
}

/// Deletes collection `d/<collection>` and creates it again, with the key `primary`.
async fn recreate_collection(c: &mut Clients, primary: &str, collection: &str) {
    c.collections
        .delete_collection(with(
            Some(primary),
            DeleteCollectionRequest {
                database: "d".into(),
                id: collection.into(),
            },
        ))
        .await
        .expect("deleted");
    call(c, Rpc::CreateCollection, Some(primary), collection, None)
        .await
        .expect("created again");
}

/// Asserts that `result` is the refusal of a token whose `resource` was deleted since.
fn refused_as_deleted(result: Result<(), Status>, resource: &str, rpc: Rpc) {
    let denied = result.expect_err("the token's resource was deleted");
    assert_eq!(denied.code(), Code::PermissionDenied, "{rpc:?}: {denied:?}");
    assert_eq!(reason(&denied), "TOKEN_RESOURCE_DELETED", "{rpc:?}");
    let message = denied.message();
    assert!(
        message.contains(resource)
            && message.contains("deleted since")
            && message.contains("mint a new token"),
        "{rpc:?}: {message}"
    );
}

/// Regression (issue 23, defect 7): tokens were scoped by name, so a token for `d/c` read and
/// wrote a new `d/c` created after the first was deleted, and a database token listed a
/// recreated database. A token is now bound to the uids of what it was minted for, as Cosmos
/// DB binds permissions to resource ids.
#[tokio::test]
async fn a_token_grants_nothing_on_a_resource_created_again_under_its_name() {
    a_token_grants_nothing_on_a_resource_created_again_under_its_name_at(Target::Single).await;
}

async fn a_token_grants_nothing_on_a_resource_created_again_under_its_name_at(target: Target) {
    let (_dir, _server, mut c, primary, _) = secured(target).await;
    let document_rpcs = [
        Rpc::CreateDocument,
        Rpc::UpsertDocument,
        Rpc::ReplaceDocument,
        Rpc::ReadDocument,
        Rpc::DeleteDocument,
        Rpc::TouchDocument,
        Rpc::PatchDocument,
        Rpc::ExecuteBatch,
        Rpc::ReadFeed,
        Rpc::Query,
        Rpc::GetCollection,
    ];
    let collection_all = mint(&mut c, &primary, "c", None, TokenPermission::All, None).await;
    let partition_all = mint(
        &mut c,
        &primary,
        "c",
        Some("p1"),
        TokenPermission::All,
        None,
    )
    .await;
    let database_read = mint(&mut c, &primary, "", None, TokenPermission::Read, None).await;
    for rpc in document_rpcs {
        let result = call(&mut c, rpc, Some(&collection_all), "c", None).await;
        assert!(let_through(&result), "{rpc:?} before: {result:?}");
    }

    // The collection is deleted and created again: its tokens grant nothing on the new one,
    // reads, writes, feeds and queries alike.
    recreate_collection(&mut c, &primary, "c").await;
    for rpc in document_rpcs {
        let result = call(&mut c, rpc, Some(&collection_all), "c", None).await;
        refused_as_deleted(result, "collection 'd/c'", rpc);
        let result = call(&mut c, rpc, Some(&partition_all), "c", Some("p1")).await;
        refused_as_deleted(result, "collection 'd/c'", rpc);
    }
    let in_new = call(&mut c, Rpc::ReadDocument, Some(&primary), "c", None)
        .await
        .expect_err("nothing was written through the old token");
    assert_eq!(in_new.code(), Code::NotFound, "{in_new:?}");
    // The database is the same one: its token reads the new collection; so does a token
    // minted for the new collection.
    let fresh = mint(&mut c, &primary, "c", None, TokenPermission::All, None).await;
    for (credential, rpcs) in [
        (
            &database_read,
            &[Rpc::ReadFeed, Rpc::Query, Rpc::ListCollections][..],
        ),
        (
            &fresh,
            &[Rpc::ReadFeed, Rpc::Query, Rpc::CreateDocument][..],
        ),
    ] {
        for &rpc in rpcs {
            let result = call(&mut c, rpc, Some(credential), "c", None).await;
            assert!(let_through(&result), "{rpc:?}: {result:?}");
        }
    }

    // The database is deleted and created again: its token lists nothing of the new one, and
    // tokens for its collections, fresh ones included, grant nothing either.
    c.databases
        .delete_database(with(
            Some(&primary),
            DeleteDatabaseRequest { id: "d".into() },
        ))
        .await
        .expect("deleted");
    for rpc in [Rpc::CreateDatabase, Rpc::CreateCollection] {
        call(&mut c, rpc, Some(&primary), "c", None)
            .await
            .expect("created again");
    }
    for rpc in [
        Rpc::GetDatabase,
        Rpc::ListCollections,
        Rpc::GetCollection,
        Rpc::ReadDocument,
        Rpc::ReadFeed,
        Rpc::Query,
    ] {
        let result = call(&mut c, rpc, Some(&database_read), "c", None).await;
        refused_as_deleted(result, "database 'd'", rpc);
    }
    for rpc in [Rpc::CreateDocument, Rpc::ReadDocument, Rpc::Query] {
        let result = call(&mut c, rpc, Some(&fresh), "c", None).await;
        refused_as_deleted(result, "database 'd'", rpc);
    }

    // Deleted and not created again: refused the same way, not NOT_FOUND.
    call(&mut c, Rpc::CreateCollection, Some(&primary), "c2", None)
        .await
        .expect("created");
    let gone = mint(&mut c, &primary, "c2", None, TokenPermission::All, None).await;
    c.collections
        .delete_collection(with(
            Some(&primary),
            DeleteCollectionRequest {
                database: "d".into(),
                id: "c2".into(),
            },
        ))
        .await
        .expect("deleted");
    let result = call(&mut c, Rpc::ReadDocument, Some(&gone), "c2", None).await;
    refused_as_deleted(result, "collection 'd/c2'", Rpc::ReadDocument);

    // Minting for what does not exist is NOT_FOUND.
    let absent = c
        .admin
        .create_resource_token(with(
            Some(&primary),
            CreateResourceTokenRequest {
                database: "d".into(),
                collection: "c2".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("no such collection");
    assert_eq!(absent.code(), Code::NotFound, "{absent:?}");

    // Tokens of the format before uids are refused, saying why.
    let old = call(
        &mut c,
        Rpc::ReadDocument,
        Some("mft1.p.e30.AAAA"),
        "c",
        None,
    )
    .await
    .expect_err("an outdated token");
    assert_eq!(old.code(), Code::Unauthenticated, "{old:?}");
    assert_eq!(reason(&old), "INVALID_CREDENTIALS");
    assert!(
        old.message().contains("mft1") && old.message().contains("mint a new one"),
        "{}",
        old.message()
    );
}

/// A change feed stream waiting for changes is authorized again every second: regenerating
/// the key it was opened with ends it, though nothing is written.
#[tokio::test]
async fn a_regenerated_key_ends_the_change_feeds_it_opened() {
    a_regenerated_key_ends_the_change_feeds_it_opened_at(Target::Single).await;
}

async fn a_regenerated_key_ends_the_change_feeds_it_opened_at(target: Target) {
    let (_dir, _server, mut c, primary, _) = secured(target).await;
    let secondary = c
        .admin
        .regenerate_key(with(
            Some(&primary),
            RegenerateKeyRequest {
                kind: KeyKind::Secondary as i32,
            },
        ))
        .await
        .expect("regenerated")
        .into_inner()
        .key;
    let mut events = c
        .documents
        .change_feed(with(
            Some(&primary),
            ChangeFeedRequest {
                database: "d".into(),
                collection: "c".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("opens")
        .into_inner();
    events
        .message()
        .await
        .expect("the first message")
        .expect("open");
    c.admin
        .regenerate_key(with(
            Some(&secondary),
            RegenerateKeyRequest {
                kind: KeyKind::Primary as i32,
            },
        ))
        .await
        .expect("regenerated");
    // Within its next check (a second), not at its next heartbeat (ten).
    let ended = tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .expect("ended within 5 s")
        .expect_err("refused");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
}
