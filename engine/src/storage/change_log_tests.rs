//! What both backends promise about the change log, checked on each.

use bytes::Bytes;

use super::{DocumentWrite, LogRecord, ShardStore, WriteBatch};
use crate::model::CollectionUid;

fn append(shard: &dyn ShardStore, records: &[(CollectionUid, u64, &[u8])]) {
    let records: Vec<_> = records
        .iter()
        .map(|&(collection, seq, record)| (collection, seq, LogRecord::whole(record.to_vec())))
        .collect();
    let writes: Vec<_> = records
        .iter()
        .map(|(collection, seq, record)| DocumentWrite::Append {
            collection: *collection,
            seq: *seq,
            record,
        })
        .collect();
    shard
        .write(WriteBatch {
            writes: &writes,
            versions_below: 1,
            keep_floor: false,
            replicated: false,
        })
        .expect("appends");
}

fn seqs(shard: &dyn ShardStore, collection: CollectionUid, from: u64, limit: usize) -> Vec<u64> {
    shard
        .change_log()
        .read_log(collection, from, limit)
        .expect("reads")
        .into_iter()
        .map(|(seq, _)| seq)
        .collect()
}

/// Appends to two collections of an empty shard, reads from every kind of position, trims,
/// and drops one collection: each collection's records come back in position order, a trim
/// removes only what is below its bound, and the highest position stays known.
pub(super) fn check_change_log(shard: &dyn ShardStore) {
    let (a, b) = (CollectionUid(1), CollectionUid(2));
    assert_eq!(shard.change_log().last_log_seq().expect("reads"), 0);
    append(shard, &[(a, 1, b"a1"), (b, 2, b"b2"), (a, 3, b"a3")]);
    append(shard, &[(a, 4, b"a4")]);
    assert_eq!(shard.change_log().last_log_seq().expect("reads"), 4);
    assert_eq!(
        shard
            .change_log()
            .read_log(a, 0, 10)
            .expect("reads")
            .into_iter()
            .map(|(seq, record)| (seq, record.to_bytes()))
            .collect::<Vec<_>>(),
        vec![
            (1, Bytes::from_static(b"a1")),
            (3, Bytes::from_static(b"a3")),
            (4, Bytes::from_static(b"a4"))
        ]
    );
    assert_eq!(seqs(shard, a, 2, 10), [3, 4]);
    assert_eq!(seqs(shard, a, 3, 1), [3]);
    assert_eq!(seqs(shard, a, 5, 10), Vec::<u64>::new());
    assert_eq!(seqs(shard, b, 0, 10), [2]);
    assert_eq!(seqs(shard, CollectionUid(9), 0, 10), Vec::<u64>::new());

    assert_eq!(shard.change_log().log_floor(a).expect("reads"), 0);
    assert_eq!(shard.change_log().trim_log(a, 4, 1).expect("trims"), 1);
    assert_eq!(seqs(shard, a, 0, 10), [3, 4]);
    assert_eq!(shard.change_log().log_floor(a).expect("reads"), 2);
    assert_eq!(shard.change_log().trim_log(a, 4, 10).expect("trims"), 1);
    assert_eq!(shard.change_log().trim_log(a, 4, 10).expect("trims"), 0);
    assert_eq!(seqs(shard, a, 0, 10), [4]);
    assert_eq!(shard.change_log().log_floor(a).expect("reads"), 4);
    assert_eq!(shard.change_log().log_floor(b).expect("reads"), 0);
    assert_eq!(seqs(shard, b, 0, 10), [2]);

    shard.drop_collection(b).expect("drops");
    assert_eq!(seqs(shard, b, 0, 10), Vec::<u64>::new());
    assert_eq!(
        shard.change_log().last_log_seq().expect("reads"),
        4,
        "positions are never reused"
    );
}
