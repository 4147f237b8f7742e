//! Which shard holds a partition. The function is fixed by the storage that holds the
//! documents (a data directory's format), since a document looked for with another function
//! than the one that placed it is not found.

use std::hash::{DefaultHasher, Hash, Hasher};

use xxhash_rust::xxh3::xxh3_64;

use crate::model::{CollectionInfo, CollectionUid, PartitionKeyValue};

/// How partitions are spread over shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// xxh3-64 (seed 0) of [`placement_key`], modulo the shard count: specified, so that a data
    /// directory reads the same with every build, and computable by any client from what it
    /// sends (cluster mode routes by it, see `docs/cluster.md`).
    Xxh3,
    /// Data directories of format 1: Rust's `DefaultHasher` over the collection's uid and the
    /// partition key's derived `Hash`. Rust does not promise to keep that algorithm across
    /// releases; it is kept only to read the directories written with it
    /// (`the_format_1_placement_is_unchanged` fails if a toolchain changes it).
    Format1,
}

impl Placement {
    /// The shard of `shards` that holds partition `partition_key` of collection `info`.
    pub fn shard(
        self,
        info: &CollectionInfo,
        partition_key: &PartitionKeyValue,
        shards: usize,
    ) -> usize {
        let hash = self.hash(
            info.database.as_str(),
            info.id.as_str(),
            info.uid,
            partition_key,
        );
        (hash % shards as u64) as usize
    }

    /// The 64-bit hash [`Placement::shard`] reduces.
    fn hash(
        self,
        database: &str,
        collection: &str,
        uid: CollectionUid,
        partition_key: &PartitionKeyValue,
    ) -> u64 {
        match self {
            Placement::Xxh3 => xxh3_64(&placement_key(database, collection, partition_key)),
            Placement::Format1 => {
                let mut hasher = DefaultHasher::new();
                uid.hash(&mut hasher);
                partition_key.hash(&mut hasher);
                hasher.finish()
            }
        }
    }
}

/// The partition of `partitions` that [`Placement::Xxh3`] places partition key
/// `partition_key` of collection `database`/`collection` in: what a cluster client routes by.
pub fn xxh3_partition(
    database: &str,
    collection: &str,
    partition_key: &PartitionKeyValue,
    partitions: usize,
) -> usize {
    (xxh3_64(&placement_key(database, collection, partition_key)) % partitions as u64) as usize
}

/// What [`Placement::Xxh3`] hashes: `database id | 0x00 | collection id | 0x00 | partition
/// key in its order-preserving encoding`. Names rather than uids, so that a client computes it
/// from what it sends. (Ids accepted today hold no NUL; two inputs that give one key would
/// only share a placement, which is harmless.)
pub fn placement_key(
    database: &str,
    collection: &str,
    partition_key: &PartitionKeyValue,
) -> Vec<u8> {
    let mut key = Vec::with_capacity(database.len() + collection.len() + 16);
    key.extend_from_slice(database.as_bytes());
    key.push(0);
    key.extend_from_slice(collection.as_bytes());
    key.push(0);
    partition_key.encode_ordered(&mut key);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pks() -> Vec<PartitionKeyValue> {
        vec![
            PartitionKeyValue::String("tenant-1".into()),
            PartitionKeyValue::String("".into()),
            PartitionKeyValue::Number(42.0),
            PartitionKeyValue::Bool(true),
            PartitionKeyValue::Null,
            PartitionKeyValue::Undefined,
        ]
    }

    fn hashes(placement: Placement, database: &str, collection: &str, uid: u64) -> Vec<u64> {
        pks()
            .iter()
            .map(|pk| placement.hash(database, collection, CollectionUid(uid), pk))
            .collect()
    }

    /// Pinned values: a change to either function moves documents away from where stored
    /// directories hold them, so it must fail here first. The xxh3 values are also what Python's
    /// `xxhash.xxh3_64_intdigest` gives for the same bytes (checked when they were pinned).
    #[test]
    fn the_xxh3_placement_is_specified() {
        assert_eq!(hashes(Placement::Xxh3, "db", "sessions", 7), XXH3_PINNED);
        // The names decide, not the uid.
        assert_eq!(hashes(Placement::Xxh3, "db", "sessions", 8), XXH3_PINNED);
        assert_ne!(hashes(Placement::Xxh3, "db", "events", 7), XXH3_PINNED);
        assert_ne!(hashes(Placement::Xxh3, "dbs", "essions", 7), XXH3_PINNED);
        // The key is the names and the encoded partition key, nothing else.
        let mut key = b"db\0sessions\0".to_vec();
        pks()[0].encode_ordered(&mut key);
        assert_eq!(placement_key("db", "sessions", &pks()[0]), key);
        assert_eq!(xxh3_64(&key), XXH3_PINNED[0]);
    }

    #[test]
    fn the_format_1_placement_is_unchanged() {
        assert_eq!(
            hashes(Placement::Format1, "db", "sessions", 7),
            FORMAT1_PINNED
        );
    }

    #[test]
    fn partitions_spread_evenly() {
        let mut counts = [0usize; 8];
        for i in 0..80_000 {
            let pk = PartitionKeyValue::String(format!("user-{i}").into());
            let hash = Placement::Xxh3.hash("db", "sessions", CollectionUid(7), &pk);
            counts[(hash % 8) as usize] += 1;
        }
        for n in counts {
            assert!((9_000..11_000).contains(&n), "{counts:?}");
        }
    }

    const XXH3_PINNED: [u64; 6] = [
        1370303312518718521,
        2344811827768200880,
        7738286169093152821,
        2635637288490116806,
        6091110332402289851,
        12148756949252696728,
    ];
    const FORMAT1_PINNED: [u64; 6] = [
        12852918071651483008,
        956621874545183836,
        1088696514230575309,
        17005388778289604685,
        13749632800056763445,
        12155392730883087895,
    ];
}
