//! Feed ranges: parts of a collection's change feed that consumers share, as Cosmos DB's change
//! feed processor shares leases. A range is a run of shards, or one shard's partitions whose
//! partition key hashes into an interval; every partition key value is in exactly one range of
//! a split, so n consumers of n ranges see every event once.

use std::fmt;

use crate::model::{InvalidInput, PartitionKeyValue};

/// Most ranges one split makes.
pub const MAX_FEED_RANGES: usize = 1024;

/// A part of a collection's change feed: shards `first..=last`, partitions whose hash (see
/// [`partition_hash`]) is in `low..=high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeedRange {
    pub(crate) first: u16,
    pub(crate) last: u16,
    pub(crate) low: u32,
    pub(crate) high: u32,
}

/// A partition key value's place in a shard's hash space: FNV-1a over its order-preserving
/// encoding, folded to 32 bits. Fixed forever: ranges in continuation tokens depend on it.
pub fn partition_hash(pk: &PartitionKeyValue) -> u32 {
    let mut bytes = Vec::new();
    pk.encode_ordered(&mut bytes);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 32) as u32 ^ h as u32
}

impl FeedRange {
    /// `n` ranges covering the feed of an engine with `shards` shards: runs of whole shards
    /// while `n` is at most the shard count, else each shard's hash space split evenly.
    pub fn split(shards: usize, n: usize) -> Result<Vec<FeedRange>, InvalidInput> {
        if n == 0 || n > MAX_FEED_RANGES {
            return Err(InvalidInput::FeedRangeCount {
                asked: n,
                max: MAX_FEED_RANGES,
            });
        }
        let mut out = Vec::with_capacity(n);
        if n <= shards {
            for i in 0..n {
                let (first, last) = (i * shards / n, (i + 1) * shards / n - 1);
                out.push(FeedRange {
                    first: first as u16,
                    last: last as u16,
                    low: 0,
                    high: u32::MAX,
                });
            }
            return Ok(out);
        }
        // Each shard gets n / shards parts, the first n % shards one more.
        for shard in 0..shards {
            let parts = (n / shards + usize::from(shard < n % shards)) as u64;
            let span = 1u64 << 32;
            for p in 0..parts {
                out.push(FeedRange {
                    first: shard as u16,
                    last: shard as u16,
                    low: (p * span / parts) as u32,
                    high: ((p + 1) * span / parts - 1) as u32,
                });
            }
        }
        Ok(out)
    }

    /// Every partition of shards `first..=last`.
    pub fn whole_shards(first: usize, last: usize) -> FeedRange {
        FeedRange {
            first: first as u16,
            last: last as u16,
            low: 0,
            high: u32::MAX,
        }
    }

    /// Whether an event of `pk` in `shard` belongs to this range.
    pub(crate) fn holds(&self, shard: usize, pk: &PartitionKeyValue) -> bool {
        let whole = self.low == 0 && self.high == u32::MAX;
        (usize::from(self.first)..=usize::from(self.last)).contains(&shard)
            && (whole || (self.low..=self.high).contains(&partition_hash(pk)))
    }

    /// The shards it reads.
    pub(crate) fn shards(&self) -> std::ops::RangeInclusive<usize> {
        usize::from(self.first)..=usize::from(self.last)
    }

    /// Parses [`FeedRange`]'s text form, for an engine with `shards` shards.
    pub fn parse(text: &str, shards: usize) -> Result<Self, InvalidInput> {
        let bad = || InvalidInput::FeedRange {
            raw: text.to_owned(),
        };
        let (shard_part, hash_part) = text.split_once('/').ok_or_else(bad)?;
        let pair = |s: &str, radix: u32| -> Option<(u32, u32)> {
            let (a, b) = s.split_once('-')?;
            Some((
                u32::from_str_radix(a, radix).ok()?,
                u32::from_str_radix(b, radix).ok()?,
            ))
        };
        let (first, last) =
            pair(shard_part.strip_prefix("shards:").ok_or_else(bad)?, 10).ok_or_else(bad)?;
        let (low, high) =
            pair(hash_part.strip_prefix("hash:").ok_or_else(bad)?, 16).ok_or_else(bad)?;
        if first > last
            || last as usize >= shards
            || low > high
            || (first != last && (low, high) != (0, u32::MAX))
        {
            return Err(bad());
        }
        Ok(FeedRange {
            first: first as u16,
            last: last as u16,
            low,
            high,
        })
    }
}

/// `shards:FIRST-LAST/hash:LOW-HIGH` (hash bounds in hex): opaque to clients, readable to
/// operators.
impl fmt::Display for FeedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shards:{}-{}/hash:{:08x}-{:08x}",
            self.first, self.last, self.low, self.high
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pks() -> Vec<PartitionKeyValue> {
        (0..2000)
            .map(|i| PartitionKeyValue::String(format!("p{i}").into()))
            .chain([
                PartitionKeyValue::Null,
                PartitionKeyValue::Undefined,
                PartitionKeyValue::number(1.5),
            ])
            .collect()
    }

    #[test]
    fn every_partition_is_in_exactly_one_range_of_a_split() {
        for shards in [1, 2, 3, 16] {
            for n in [1, 2, 3, 5, 16, 17, 40] {
                let ranges = FeedRange::split(shards, n).expect("valid");
                assert_eq!(ranges.len(), n);
                for pk in pks() {
                    for shard in 0..shards {
                        let holders = ranges.iter().filter(|r| r.holds(shard, &pk)).count();
                        assert_eq!(
                            holders, 1,
                            "{shards} shards, {n} ranges, {pk:?} in shard {shard}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn hash_splits_share_partitions_roughly_evenly() {
        let ranges = FeedRange::split(1, 4).expect("valid");
        for r in &ranges {
            let n = pks().iter().filter(|pk| r.holds(0, pk)).count();
            assert!((350..650).contains(&n), "{r}: {n} of 2003");
        }
    }

    #[test]
    fn ranges_round_trip_as_text_and_bad_text_is_refused() {
        for r in FeedRange::split(4, 9).expect("valid") {
            assert_eq!(FeedRange::parse(&r.to_string(), 4).expect("parses"), r);
        }
        for bad in [
            "",
            "shards:0-1",
            "shards:1-0/hash:00000000-ffffffff",
            "shards:0-4/hash:00000000-ffffffff",
            "shards:0-1/hash:00000000-0000ffff",
            "shards:0-0/hash:ffffffff-00000000",
            "shards:x-0/hash:00000000-ffffffff",
        ] {
            assert!(FeedRange::parse(bad, 4).is_err(), "{bad}");
        }
        assert!(FeedRange::split(4, 0).is_err());
        assert!(FeedRange::split(4, MAX_FEED_RANGES + 1).is_err());
    }

    #[test]
    fn the_partition_hash_is_fixed() {
        // Ranges and tokens handed out depend on these values: they never change.
        let got: Vec<u32> = [
            PartitionKeyValue::Null,
            PartitionKeyValue::String("a".into()),
            PartitionKeyValue::number(1.5),
        ]
        .iter()
        .map(partition_hash)
        .collect();
        assert_eq!(got, [694_291_040, 3_941_766_572, 747_929_557]);
    }
}
