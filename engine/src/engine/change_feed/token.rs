//! A change feed continuation's bytes (sealed by the engine's token key before they leave):
//! `magic (u8) | layout (u8) | mode (u8) | collection uid (u64) | feed since (u64) | shard
//! count (u32) | scope |
//! positions (u16 count, then shard u16 | next position u64 each)`, little-endian.

use super::{ChangeFeedCursor, ChangeFeedMode, ChangeFeedScope, FeedRange};
use crate::engine::CollectionUid;
use crate::model::{InvalidInput, PartitionKeyValue};

/// Tells a change feed token from a read feed's or a query's.
const MAGIC: u8 = 0xCF;
const LAYOUT: u8 = 1;

pub(super) fn encode(cursor: &ChangeFeedCursor, shards: usize) -> Vec<u8> {
    let mut out = vec![MAGIC, LAYOUT];
    out.push(match cursor.mode {
        ChangeFeedMode::LatestVersion => 0,
        ChangeFeedMode::AllVersionsAndDeletes => 1,
    });
    out.extend_from_slice(&cursor.uid.0.to_le_bytes());
    out.extend_from_slice(&cursor.since.to_le_bytes());
    out.extend_from_slice(&(shards as u32).to_le_bytes());
    match &cursor.scope {
        ChangeFeedScope::Collection => out.push(0),
        ChangeFeedScope::Partition(pk) => {
            out.push(1);
            pk.encode_ordered(&mut out);
        }
        ChangeFeedScope::Range(r) => {
            out.push(2);
            out.extend_from_slice(&r.first.to_le_bytes());
            out.extend_from_slice(&r.last.to_le_bytes());
            out.extend_from_slice(&r.low.to_le_bytes());
            out.extend_from_slice(&r.high.to_le_bytes());
        }
    }
    out.extend_from_slice(&(cursor.next.len() as u16).to_le_bytes());
    for &(shard, next) in &cursor.next {
        out.extend_from_slice(&(shard as u16).to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
    }
    out
}

fn bad(reason: &'static str) -> InvalidInput {
    InvalidInput::Continuation { reason }
}

/// Reads a token's bytes, if they resume a feed on an engine of `shards` shards; the caller
/// checks the collection ([`ChangeFeedCursor::uid`]).
pub(super) fn decode(bytes: &[u8], shards: usize) -> Result<ChangeFeedCursor, InvalidInput> {
    let corrupt = || bad("it is corrupt");
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8], InvalidInput> {
        let out = bytes.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(out)
    };
    if take(1)? != [MAGIC] {
        return Err(bad("it is not a change feed continuation"));
    }
    if take(1)? != [LAYOUT] {
        return Err(bad("it was issued by an incompatible server version"));
    }
    let mode = match take(1)?[0] {
        0 => ChangeFeedMode::LatestVersion,
        1 => ChangeFeedMode::AllVersionsAndDeletes,
        _ => return Err(corrupt()),
    };
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let uid = CollectionUid(u64_at(take(8)?));
    let since = u64_at(take(8)?);
    if u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize != shards {
        return Err(bad(
            "it was issued by a server with a different number of shards; start again",
        ));
    }
    let u16_of = |b: &[u8]| u16::from_le_bytes(b.try_into().expect("2 bytes"));
    let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let scope = match take(1)?[0] {
        0 => ChangeFeedScope::Collection,
        1 => {
            let (pk, rest) = PartitionKeyValue::decode_ordered(&bytes[at..]).ok_or_else(corrupt)?;
            at = bytes.len() - rest.len();
            ChangeFeedScope::Partition(pk)
        }
        2 => {
            let range = FeedRange {
                first: u16_of(take(2)?),
                last: u16_of(take(2)?),
                low: u32_of(take(4)?),
                high: u32_of(take(4)?),
            };
            // As checked as one a client names: a made-up range in a token is refused too.
            let range = FeedRange::parse(&range.to_string(), shards).map_err(|_| corrupt())?;
            ChangeFeedScope::Range(range)
        }
        _ => return Err(corrupt()),
    };
    let mut take = |n: usize| -> Result<&[u8], InvalidInput> {
        let out = bytes.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(out)
    };
    let count = usize::from(u16_of(take(2)?));
    let mut next = Vec::with_capacity(count.min(shards));
    for _ in 0..count {
        let shard = usize::from(u16_of(take(2)?));
        let seq = u64_at(take(8)?);
        if shard >= shards || next.last().is_some_and(|&(s, _)| s >= shard) {
            return Err(corrupt());
        }
        next.push((shard, seq));
    }
    if at != bytes.len() || next.is_empty() {
        return Err(corrupt());
    }
    Ok(ChangeFeedCursor {
        uid,
        since,
        mode,
        scope,
        next,
        turn: 0,
    })
}
