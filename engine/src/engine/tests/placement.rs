//! Which shard a partition lives on is fixed by the data directory: a new directory places by
//! the specified xxh3 function, one of format 1 keeps the function it was written with.

use super::*;

/// Writes documents over many partitions, reopens the directory and reads every one back;
/// returns the engine's placement, each partition's shard and the collection.
async fn write_reopen_read(dir: &std::path::Path) -> (Placement, Vec<usize>, Arc<CollectionInfo>) {
    let clock = Arc::new(ManualClock::new(T0));
    let partitions: Vec<String> = (0..40).map(|i| format!("tenant-{i}")).collect();
    {
        let (engine, path) = disk_engine(dir, clock.clone());
        create_db_and_c(&engine, default_ttl(None));
        for p in &partitions {
            let doc = body(json!({"id": "d", "pk": p}));
            engine
                .create_document(&path, doc, None)
                .result
                .expect("create");
        }
        engine.durable().await.expect("durable");
    }
    let (engine, path) = disk_engine(dir, clock);
    let info = engine.get_collection(&path).expect("collection");
    let shards = partitions
        .iter()
        .map(|p| {
            engine
                .read_document(&path, &key(p, "d"))
                .result
                .unwrap_or_else(|e| panic!("{p} is found after reopening: {e:?}"));
            engine.shard_index(&info, &pk(p))
        })
        .collect();
    (engine.inner.placement, shards, info)
}

#[tokio::test]
async fn a_new_directory_places_by_xxh3_and_says_format_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (placement, shards, _) = write_reopen_read(dir.path()).await;
    assert_eq!(placement, Placement::Xxh3);
    let format = std::fs::read_to_string(dir.path().join("FORMAT")).expect("format marker");
    assert_eq!(format.trim(), "mayfly-data-format 2");
    // Both shards hold partitions: the placement spreads them.
    assert!(shards.contains(&0) && shards.contains(&1), "{shards:?}");
}

#[tokio::test]
async fn a_format_1_directory_keeps_its_placement() {
    let dir = tempfile::tempdir().expect("temp dir");
    // What a build before format 2 left in a new directory before its first write.
    std::fs::write(dir.path().join("FORMAT"), "mayfly-data-format 1\n").expect("marker");
    let (placement, shards, info) = write_reopen_read(dir.path()).await;
    assert_eq!(placement, Placement::Format1);
    let format = std::fs::read_to_string(dir.path().join("FORMAT")).expect("format marker");
    assert_eq!(format.trim(), "mayfly-data-format 1", "never rewritten");
    // Where format 1 put them, which is not where xxh3 would have for every partition.
    let xxh3: Vec<usize> = (0..40)
        .map(|i| Placement::Xxh3.shard(&info, &pk(&format!("tenant-{i}")), 2))
        .collect();
    assert_ne!(shards, xxh3);
}
