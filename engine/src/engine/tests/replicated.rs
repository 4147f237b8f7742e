//! Cluster mode's follower (`shard/replicated.rs`): an owner's commits, applied in order to
//! another engine, leave it holding what the owner holds (documents, versions, write instants,
//! index entries, remembered requests, the change log at the same positions), deciding no
//! expiry of its own while it follows, and purging what the owner expired once promoted.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::engine::{ReplicatedCommit, idempotency::RequestKey};
use crate::storage::{
    ChangeLog, DocumentWrite, IndexEntry, IndexRange, LogRecord, RequestRecord, StoredTerms,
};

/// One commit as the owner's storage saw it: what cluster mode ships.
#[derive(Debug, Clone)]
struct Shipped {
    shard: usize,
    after: u64,
    records: Vec<(CollectionUid, LogRecord)>,
    remembered: Vec<(CollectionUid, DocKey, RequestRecord)>,
    versions_below: u64,
}

/// Memory storage that keeps every commit with change log records, as an owner ships them.
#[derive(Debug, Default)]
struct Shipping {
    inner: MemoryStorage,
    shipped: Arc<StdMutex<Vec<Shipped>>>,
}

#[derive(Debug)]
struct ShippingShard {
    index: usize,
    inner: Arc<dyn ShardStore>,
    shipped: Arc<StdMutex<Vec<Shipped>>>,
}

impl Storage for Shipping {
    fn placement(&self) -> crate::engine::Placement {
        self.inner.placement()
    }
    fn shard(&self, index: usize) -> Arc<dyn ShardStore> {
        Arc::new(ShippingShard {
            index,
            inner: self.inner.shard(index),
            shipped: self.shipped.clone(),
        })
    }
    fn write_catalog(&self, change: CatalogChange<'_>) -> Result<Lsn, StorageError> {
        self.inner.write_catalog(change)
    }
    fn load_catalog(&self) -> Result<StoredCatalog, StorageError> {
        self.inner.load_catalog()
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn last_applied(&self) -> Lsn {
        self.inner.last_applied()
    }
    fn failure(&self) -> Option<StorageError> {
        None
    }
}

impl ShardStore for ShippingShard {
    fn write(&self, batch: WriteBatch<'_>) -> Result<Lsn, StorageError> {
        let mut first = None;
        let mut records = Vec::new();
        let mut remembered = Vec::new();
        for write in batch.writes {
            match *write {
                DocumentWrite::Append {
                    collection,
                    seq,
                    record,
                } => {
                    first.get_or_insert(seq);
                    records.push((collection, record.clone()));
                }
                DocumentWrite::Remember {
                    collection,
                    key,
                    record,
                } => remembered.push((collection, key.clone(), record)),
                _ => {}
            }
        }
        let lsn = self.inner.write(batch)?;
        if let Some(first) = first {
            self.shipped.lock().expect("not poisoned").push(Shipped {
                shard: self.index,
                after: first - 1,
                records,
                remembered,
                versions_below: batch.versions_below,
            });
        }
        Ok(lsn)
    }
    fn durable(&self, lsn: Lsn) -> Option<DurableFuture> {
        self.inner.durable(lsn)
    }
    fn load(&self, each: &mut dyn FnMut(StoredMeta)) -> Result<(), StorageError> {
        self.inner.load(each)
    }
    fn load_terms(
        &self,
        each: &mut dyn FnMut(CollectionUid, DocKey, StoredTerms),
    ) -> Result<(), StorageError> {
        self.inner.load_terms(each)
    }
    fn get_terms(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<StoredTerms>, StorageError> {
        self.inner.get_terms(collection, key)
    }
    fn scan_index(
        &self,
        collection: CollectionUid,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, StorageError> {
        self.inner.scan_index(collection, range, limit)
    }
    fn get(
        &self,
        collection: CollectionUid,
        key: &DocKey,
    ) -> Result<Option<Arc<StoredDocument>>, StorageError> {
        self.inner.get(collection, key)
    }
    fn scan(
        &self,
        collection: CollectionUid,
        range: ScanRange<'_>,
        limit: usize,
    ) -> Result<Vec<Arc<StoredDocument>>, StorageError> {
        self.inner.scan(collection, range, limit)
    }
    fn drop_collection(&self, collection: CollectionUid) -> Result<(), StorageError> {
        self.inner.drop_collection(collection)
    }
    fn change_log(&self) -> &dyn ChangeLog {
        self.inner.change_log()
    }
}

const SHARDS: usize = 4;

fn cluster_config() -> EngineConfig {
    EngineConfig {
        log_every_commit: true,
        ..EngineConfig::new(SHARDS)
    }
}

/// An engine and its storage.
struct Node {
    f: Fixture,
    storage: Arc<dyn Storage>,
}

/// An owner whose commits are shipped, and a follower of every shard (its catalog made the
/// same way, so its uids are the owner's: the catalog stream's job in a cluster).
fn owner_and_follower() -> (Node, Arc<StdMutex<Vec<Shipped>>>, Node) {
    let storage = Shipping::default();
    let shipped = storage.shipped.clone();
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let owner = Node {
        f: Fixture::with_config(Some(100), storage.clone(), cluster_config()),
        storage,
    };
    let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    let follower = Node {
        f: Fixture::with_config(Some(100), storage.clone(), cluster_config()),
        storage,
    };
    for shard in 0..SHARDS {
        follower.f.engine.set_following(shard, true);
    }
    (owner, shipped, follower)
}

/// Applies one shipped commit to `follower`.
fn apply(follower: &Engine, c: &Shipped) -> Result<Lsn, Error> {
    follower.apply_replicated(
        c.shard,
        ReplicatedCommit {
            after: c.after,
            records: &c.records,
            remembered: &c.remembered,
            versions_below: c.versions_below,
        },
    )
}

/// Applies what the owner shipped since the last call, in order.
fn ship(shipped: &StdMutex<Vec<Shipped>>, follower: &Engine) -> usize {
    let commits = std::mem::take(&mut *shipped.lock().expect("not poisoned"));
    for c in &commits {
        apply(follower, c).expect("the follower takes the owner's commit");
    }
    commits.len()
}

fn in_partition(id: &str, pk: &str, extra: Value) -> DocumentBody {
    let mut v = json!({"id": id, "pk": pk, "tag": format!("t-{id}")});
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    body(v)
}

/// What a read of `id` in `pk` answers, in a form two engines can be compared by.
fn seen(f: &Fixture, id: &str, pk: &str) -> Option<(u64, Millis, Option<String>, String)> {
    match f.engine.read_document(&f.path, &key(pk, id)).result {
        Ok(view) => Some((
            view.etag.0,
            view.last_write,
            view.ttl.map(|t| format!("{t:?}")),
            serde_json::to_string(&view.body_map()).expect("json"),
        )),
        Err(Error::DocumentNotFound { .. }) => None,
        Err(e) => panic!("read {id}: {e}"),
    }
}

#[tokio::test]
async fn a_follower_applying_an_owners_commits_holds_what_the_owner_holds() {
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    let uid = owner.engine.get_collection(&owner.path).expect("c").uid;
    assert_eq!(
        follower
            .engine
            .get_collection(&follower.path)
            .expect("c")
            .uid,
        uid
    );
    let docs = [
        ("a", "p1"),
        ("b", "p2"),
        ("c", "p3"),
        ("d", "p4"),
        ("e", "p5"),
        ("f", "p6"),
    ];

    for (i, &(id, pk)) in docs.iter().enumerate() {
        let ttl = match id {
            "b" | "e" => json!({"ttl": 5}),
            "c" => json!({"ttl": -1}),
            _ => json!({"n": i}),
        };
        owner
            .engine
            .create_document(&owner.path, in_partition(id, pk, ttl), None)
            .result
            .expect("create");
        owner.advance(10);
    }
    owner
        .engine
        .replace_document(
            &owner.path,
            key("p1", "a"),
            in_partition("a", "p1", json!({"n": 9})),
            None,
        )
        .result
        .expect("replace");
    owner
        .engine
        .patch_document(
            &owner.path,
            &key("p3", "c"),
            &[PatchOp::Set {
                path: "/x".into(),
                value: json!(1),
            }],
            None,
            None,
        )
        .result
        .expect("patch");
    owner
        .engine
        .delete_document(&owner.path, &key("p4", "d"), None)
        .result
        .expect("delete");
    let request = RequestKey {
        key: ResourceId::parse(IdKind::IdempotencyKey, "once").expect("key"),
        fingerprint: [7; 16],
    };
    owner
        .engine
        .keyed(Some(&request))
        .create_document(&owner.path, in_partition("g", "p7", json!({})), None)
        .result
        .expect("keyed create");
    // b and e expire; the owner's purge logs it. b is written again after.
    owner.advance(6_000);
    assert_eq!(owner.engine.purge_now(), 2);
    owner
        .engine
        .create_document(
            &owner.path,
            in_partition("b", "p2", json!({"again": true})),
            None,
        )
        .result
        .expect("create again");

    assert!(ship(&shipped, &follower.engine) >= 9);
    follower.clock.set(owner.clock.now());
    // Following, it decides nothing by its clock, and serves no client.
    assert_eq!(follower.engine.purge_now(), 0);
    let read = follower
        .engine
        .read_document(&follower.path, &key("p1", "a"));
    assert!(
        matches!(read.result, Err(Error::NotOwner { .. })),
        "{:?}",
        read.result
    );
    let write =
        follower
            .engine
            .create_document(&follower.path, in_partition("z", "p1", json!({})), None);
    assert!(
        matches!(write.result, Err(Error::NotOwner { .. })),
        "{:?}",
        write.result
    );
    for shard in 0..SHARDS {
        assert_eq!(follower.engine.log_end(shard), owner.engine.log_end(shard));
        let log = |n: &Node| {
            n.storage
                .shard(shard)
                .change_log()
                .read_log(uid, 0, 1000)
                .expect("log")
        };
        assert_eq!(
            log(&follower_node),
            log(&owner_node),
            "shard {shard}'s change log"
        );
        // e waits, dead, for the purge it gets once promoted (below).
        for &(id, pk) in docs.iter().filter(|(id, _)| *id != "e") {
            let terms = |n: &Node| {
                n.storage
                    .shard(shard)
                    .get_terms(uid, &key(pk, id))
                    .expect("terms")
            };
            assert_eq!(
                terms(&follower_node),
                terms(&owner_node),
                "{id}'s index entries"
            );
        }
    }
    for shard in 0..SHARDS {
        follower.engine.set_following(shard, false);
    }
    for &(id, pk) in docs.iter().chain([("g", "p7")].iter()) {
        assert_eq!(seen(follower, id, pk), seen(owner, id, pk), "{id}");
    }
    assert!(seen(follower, "d", "p4").is_none() && seen(follower, "e", "p5").is_none());
    assert!(
        seen(follower, "z", "p1").is_none(),
        "the refused write changed nothing"
    );
    // The remembered request is known on the follower: a retry after a failover is not applied
    // twice. Its answer is not shipped, so it is refused as applied, as after a restart.
    let before = seen(follower, "g", "p7");
    let retried = follower
        .engine
        .keyed(Some(&request))
        .create_document(&follower.path, in_partition("g", "p7", json!({})), None)
        .result;
    assert!(
        matches!(retried, Err(Error::RequestApplied { .. })),
        "{retried:?}"
    );
    assert_eq!(seen(follower, "g", "p7"), before);

    // Promoted: what the owner expired is purged (its record logged once, not again), and new
    // versions are above every version the owner handed out.
    let ends: Vec<u64> = (0..SHARDS).map(|s| follower.engine.log_end(s)).collect();
    assert_eq!(
        follower.engine.purge_now(),
        1,
        "e, whose expiry the owner logged"
    );
    assert_eq!(
        (0..SHARDS)
            .map(|s| follower.engine.log_end(s))
            .collect::<Vec<_>>(),
        ends,
        "nothing logged twice"
    );
    let newer = follower
        .engine
        .create_document(&follower.path, in_partition("h", "p8", json!({})), None)
        .result
        .expect("create on the promoted follower");
    let owner_newest = seen(owner, "b", "p2").expect("b").0;
    assert!(newer.etag.0 > owner_newest);
}

#[tokio::test]
async fn a_commit_that_does_not_continue_the_log_changes_nothing() {
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    owner.create("a", None);
    owner.create("b", None);
    let commits = std::mem::take(&mut *shipped.lock().expect("not poisoned"));
    assert_eq!(commits.len(), 2);
    let second = &commits[1];
    // Applied before the first: a gap.
    let err = apply(&follower.engine, second).expect_err("a gap");
    assert!(err.to_string().contains("does not fit"), "{err}");
    assert_eq!(follower.engine.log_end(second.shard), 0);
    follower.engine.set_following(second.shard, false);
    assert!(!follower.visible("b"));
}

/// A lease clock the test moves by hand.
#[derive(Debug, Default)]
struct HandLeaseClock(std::sync::atomic::AtomicU64);

impl crate::engine::LeaseClock for HandLeaseClock {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_shard_whose_lease_ended_answers_nothing_until_it_is_renewed() {
    let lease = Arc::new(HandLeaseClock::default());
    let config = EngineConfig {
        lease_clock: Some(lease.clone()),
        ..cluster_config()
    };
    let f = Fixture::with_config(Some(100), Arc::new(MemoryStorage::new()), config);
    f.create("a", None);
    let shard = f
        .engine
        .shard_index(&f.engine.get_collection(&f.path).expect("c"), &pk("p"));
    f.engine.serve_until(shard, 100, u64::MAX);
    lease.0.store(99, std::sync::atomic::Ordering::SeqCst);
    assert!(f.visible("a"), "served within its lease");
    // An owner paused past its lease wakes here: its first answer is a refusal.
    lease.0.store(100, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(f.read("a"), Err(Error::NotOwner { .. })));
    let write = f.engine.create_document(&f.path, doc("b", None), None);
    assert!(matches!(write.result, Err(Error::NotOwner { .. })));
    f.engine.serve_until(shard, 200, u64::MAX);
    assert!(f.visible("a"));
    assert!(!f.visible("b"), "the refused write changed nothing");
}

#[tokio::test]
async fn a_commit_naming_a_document_twice_is_refused() {
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    owner.create("a", None);
    let mut commits = std::mem::take(&mut *shipped.lock().expect("not poisoned"));
    let mut c = commits.remove(0);
    c.records.push(c.records[0].clone());
    let err = apply(&follower.engine, &c).expect_err("refused");
    assert!(err.to_string().contains("twice"), "{err}");
    assert_eq!(follower.engine.log_end(c.shard), 0);
}

#[tokio::test]
async fn the_records_of_a_collection_deleted_since_are_passed_over() {
    // A new owner replays the log against today's catalog: a collection deleted after it was
    // written to must not stop the replay.
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    let (_, gone) = owner.collection("gone", IndexingMode::Consistent, IndexPaths::default());
    owner
        .engine
        .create_document(&gone, in_partition("x", "p", json!({})), None)
        .result
        .expect("create");
    owner.create("kept", None);
    owner.engine.delete_collection(&gone).expect("delete");
    // The follower's catalog went the same way (the catalog log's job).
    let (_, follower_gone) =
        follower.collection("gone", IndexingMode::Consistent, IndexPaths::default());
    follower
        .engine
        .delete_collection(&follower_gone)
        .expect("delete");
    ship(&shipped, &follower.engine);
    for shard in 0..SHARDS {
        assert_eq!(follower.engine.log_end(shard), owner.engine.log_end(shard));
        follower.engine.set_following(shard, false);
    }
    assert!(follower.visible("kept"));
}

#[tokio::test]
async fn a_settings_change_applied_late_at_its_given_instant_judges_as_it_did_on_time() {
    // Two nodes apply "default TTL off" from the catalog log: one at once, one (a node that
    // joined later and replays the log) 500 s on. At the change's own instant the document,
    // which inherits 100 s, was live: it stays live on both.
    let on_time = Fixture::new(Some(100));
    let late = Fixture::new(Some(100));
    for f in [&on_time, &late] {
        f.create("a", None);
    }
    let instant = on_time.clock.now() + 10_000;
    on_time.advance(10_000);
    late.advance(500_000);
    let off = || SettingsChange {
        default_ttl: DefaultTtl::Off,
        indexing_mode: None,
        index_paths: None,
        must_live: None,
        change_feed_retention: None,
    };
    for f in [&on_time, &late] {
        f.engine
            .replace_collection_at(&f.path, off(), Some(instant))
            .expect("replace");
    }
    assert!(on_time.visible("a"));
    assert!(
        late.visible("a"),
        "the late node expired what the change kept"
    );
}

#[tokio::test]
async fn a_leased_shard_acts_on_no_time_past_its_cap_nor_below_a_raised_floor() {
    let lease = Arc::new(HandLeaseClock::default());
    let config = EngineConfig {
        lease_clock: Some(lease.clone()),
        ..cluster_config()
    };
    let f = Fixture::with_config(Some(-1), Arc::new(MemoryStorage::new()), config);
    f.create("a", Some(1));
    let shard = f
        .engine
        .shard_index(&f.engine.get_collection(&f.path).expect("c"), &pk("p"));
    // The lease lets the shard act on times up to T0 + 500: its time holds there, so "a"
    // (due at T0 + 1,000) is not judged expired by a clock its lease does not cover.
    f.engine.serve_until(shard, u64::MAX, T0 + 500);
    f.advance(2_000);
    assert_eq!(f.engine.shard_time(shard), T0 + 500);
    assert!(f.visible("a"));
    // A renewal moves the cap: the time catches up with the clock.
    f.engine.serve_until(shard, u64::MAX, T0 + 4_000);
    assert!(!f.visible("a"));
    // Under a lease, shard time never follows the clock back, however far (the next owner
    // starts where this one's lease ended, and this one must not go back below what it did).
    f.clock.set(T0 - 60_000);
    assert_eq!(f.engine.shard_time(shard), T0 + 2_000);
    assert!(!f.visible("a"));
    // A floor (an earlier owner's lease end) moves it forward at once.
    f.engine.raise_time(shard, T0 + 3_000);
    assert_eq!(f.engine.shard_time(shard), T0 + 3_000);
}

/// Every shard's snapshot of `owner`, taken now.
fn snapshots(owner: &Engine) -> Vec<crate::engine::ShardSnapshot> {
    (0..SHARDS)
        .map(|shard| owner.snapshot_shard(shard, |s| s).expect("snapshot"))
        .collect()
}

/// Applies the shipped commits after each shard's snapshot, in order.
fn ship_after(commits: &[Shipped], snaps: &[crate::engine::ShardSnapshot], follower: &Engine) {
    for c in commits.iter().filter(|c| c.after >= snaps[c.shard].seq) {
        apply(follower, c).expect("the follower takes the owner's commit after the snapshot");
    }
}

#[tokio::test]
async fn a_node_loading_a_snapshot_and_the_log_after_it_holds_what_the_owner_holds() {
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    let uid = owner.engine.get_collection(&owner.path).expect("c").uid;
    let docs = [
        ("a", "p1"),
        ("b", "p2"),
        ("c", "p3"),
        ("d", "p4"),
        ("e", "p5"),
        ("f", "p6"),
    ];
    for (i, &(id, pk)) in docs.iter().enumerate() {
        let ttl = match id {
            "b" | "e" => json!({"ttl": 5}),
            "c" => json!({"ttl": -1}),
            _ => json!({"n": i}),
        };
        owner
            .engine
            .create_document(&owner.path, in_partition(id, pk, ttl), None)
            .result
            .expect("create");
        owner.advance(10);
    }
    owner
        .engine
        .delete_document(&owner.path, &key("p4", "d"), None)
        .result
        .expect("delete");
    let request = RequestKey {
        key: ResourceId::parse(IdKind::IdempotencyKey, "once").expect("key"),
        fingerprint: [7; 16],
    };
    owner
        .engine
        .keyed(Some(&request))
        .create_document(&owner.path, in_partition("g", "p7", json!({})), None)
        .result
        .expect("keyed create");
    // e expires and the owner logs it; b is due but not purged yet when the snapshot is taken.
    owner.advance(5_000);
    owner
        .engine
        .touch_document(&owner.path, &key("p2", "b"), None)
        .result
        .ok();
    let snaps = snapshots(&owner.engine);
    assert!(snaps.iter().map(|s| s.documents.len()).sum::<usize>() >= 5);
    // The owner goes on after the snapshot: the follower applies only what follows it.
    owner
        .engine
        .replace_document(
            &owner.path,
            key("p1", "a"),
            in_partition("a", "p1", json!({"n": 9})),
            None,
        )
        .result
        .expect("replace");
    owner.advance(1_000);
    assert!(owner.engine.purge_now() >= 1, "b and e expire");
    owner
        .engine
        .delete_document(&owner.path, &key("p6", "f"), None)
        .result
        .expect("delete after the snapshot");
    let commits = std::mem::take(&mut *shipped.lock().expect("not poisoned"));
    for (shard, snap) in snaps.iter().enumerate() {
        follower
            .engine
            .load_snapshot(shard, snap)
            .expect("loads into an empty shard");
        assert_eq!(follower.engine.log_end(shard), snap.seq);
    }
    ship_after(&commits, &snaps, &follower.engine);
    follower.clock.set(owner.clock.now());
    for shard in 0..SHARDS {
        assert_eq!(follower.engine.log_end(shard), owner.engine.log_end(shard));
        for &(id, pk) in &docs {
            if matches!(id, "b" | "e" | "d" | "f") {
                continue;
            }
            let terms = |n: &Node| {
                n.storage
                    .shard(shard)
                    .get_terms(uid, &key(pk, id))
                    .expect("terms")
            };
            assert_eq!(
                terms(&follower_node),
                terms(&owner_node),
                "{id}'s index entries"
            );
        }
        follower.engine.set_following(shard, false);
    }
    for &(id, pk) in docs.iter().chain([("g", "p7")].iter()) {
        assert_eq!(seen(follower, id, pk), seen(owner, id, pk), "{id}");
    }
    assert!(seen(follower, "a", "p1").is_some_and(|(_, _, _, body)| body.contains("\"n\":9")));
    // The remembered request came with the snapshot: a retry is not applied twice.
    let retried = follower
        .engine
        .keyed(Some(&request))
        .create_document(&follower.path, in_partition("g", "p7", json!({})), None)
        .result;
    assert!(
        matches!(retried, Err(Error::RequestApplied { .. })),
        "{retried:?}"
    );
    // Versions handed out after promotion are above the owner's.
    let newer = follower
        .engine
        .create_document(&follower.path, in_partition("h", "p8", json!({})), None)
        .result
        .expect("create on the promoted node");
    let owner_newest = seen(owner, "a", "p1").expect("a").0;
    assert!(newer.etag.0 > owner_newest);
    // The default TTL (100 s) still runs from each document's own write: a expires on both.
    owner.advance(100_000);
    follower.clock.set(owner.clock.now());
    assert_eq!(seen(follower, "a", "p1"), None);
    assert!(seen(follower, "c", "p3").is_some(), "ttl -1 lives on");
}

#[tokio::test]
async fn a_snapshot_replaces_a_copy_left_behind_and_its_feed_before_it_is_behind() {
    let (owner_node, shipped, follower_node) = owner_and_follower();
    let (owner, follower) = (&owner_node.f, &follower_node.f);
    for id in ["a", "b", "c"] {
        owner.create(id, None);
    }
    assert!(ship(&shipped, &follower.engine) >= 3);
    // Missed by the follower: the log before the snapshot is gone.
    owner
        .engine
        .delete_document(&owner.path, &key("p", "a"), None)
        .result
        .expect("delete");
    owner
        .engine
        .replace_document(
            &owner.path,
            key("p", "b"),
            body(json!({"id": "b", "pk": "p", "v": 2})),
            None,
        )
        .result
        .expect("replace");
    owner.create("d", None);
    shipped.lock().expect("not poisoned").clear();
    let snaps = snapshots(&owner.engine);
    for (shard, snap) in snaps.iter().enumerate() {
        follower.engine.load_snapshot(shard, snap).expect("loads");
    }
    // Loaded again (or an older one): behind this copy now, refused.
    let ahead = snaps
        .iter()
        .position(|s| s.seq > 0)
        .expect("a shard with records");
    let older = crate::engine::ShardSnapshot {
        seq: snaps[ahead].seq - 1,
        ..snaps[ahead].clone()
    };
    assert!(follower.engine.load_snapshot(ahead, &older).is_err());
    owner.create("e", None);
    ship_after(
        &std::mem::take(&mut *shipped.lock().expect("not poisoned")),
        &snaps,
        &follower.engine,
    );
    follower.clock.set(owner.clock.now());
    for shard in 0..SHARDS {
        follower.engine.set_following(shard, false);
    }
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(seen(follower, id, "p"), seen(owner, id, "p"), "{id}");
    }
    assert_eq!(
        seen(follower, "a", "p"),
        None,
        "deleted while the copy was behind"
    );
    // This copy's change log starts after the snapshot: a feed reader from before it is
    // behind (the floor), never handed a history with the missed changes left out.
    let uid = owner.engine.get_collection(&owner.path).expect("c").uid;
    let floor = follower.engine.inner.shards[ahead]
        .log_floor(uid)
        .expect("floor");
    assert_eq!(floor, snaps[ahead].seq + 1);
    assert!(
        follower_node
            .storage
            .shard(ahead)
            .change_log()
            .read_log(uid, 0, 100)
            .expect("log")
            .iter()
            .all(|(seq, _)| *seq > snaps[ahead].seq)
    );
}
