//! The message a partition's owner publishes to its log subject: one commit's change log
//! records and what a follower needs to apply them as the owner did, or a `takeover` (a new
//! owner fencing the old one), or one part of a snapshot (the partition's state at the
//! position, for a node that lacks the log before it). See `docs/cluster.md`, "What is
//! replicated" and "Snapshots and retention".
//!
//! Layout, big-endian: `format (u8) | kind (u8) | partition (u32) | epoch (u64) | after (u64) |
//! previous link (u64) | watermark (u64) | catalog seq (u64) | versions below (u64) | record
//! count (u32) | records | remembered count (u32) | remembered | part (u32) | parts (u32) |
//! length (u32) | bytes (a snapshot's part only)`. A record is `collection uid (u64) | length (u32) | bytes`, at positions
//! `after + 1`, `after + 2`, …; a remembered request is `collection uid (u64) | partition key
//! (order-preserving) | key length (u16) | key | fingerprint (16) | applied at (u64) | forget at
//! (u64)`.

use std::fmt;

use bytes::Bytes;
use mayfly_engine::{
    model::{CollectionUid, DocKey, DocumentId, IdKind, PartitionKeyValue},
    storage::RequestRecord,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The layout written; a message of another is refused rather than misread.
const FORMAT: u8 = 1;

/// What a message does to its partition's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageKind {
    /// A commit's records (none for a commit that only remembered requests or kept the
    /// version floor).
    Commit,
    /// A new owner's first message: no records, it only moves the subject on so that the old
    /// owner's next publish fails its expectation.
    Takeover,
    /// Part `part` (from 0) of `parts` of the partition's snapshot at position `after`
    /// (`snapshot.rs`): no records; the parts follow each other in the log.
    Snapshot { part: u32, parts: u32, bytes: Bytes },
}

impl MessageKind {
    fn code(&self) -> u8 {
        match self {
            MessageKind::Commit => 1,
            MessageKind::Takeover => 2,
            // 3 was a `rebase`, never written.
            MessageKind::Snapshot { .. } => 4,
        }
    }
}

/// A request remembered by its idempotency key, written by the commit (so that a retry
/// replays on a new owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub collection: CollectionUid,
    /// `id` is the idempotency key, in the partition the request wrote to.
    pub key: DocKey,
    pub record: RequestRecord,
}

impl Remembered {
    /// Appends its bytes to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.collection.0.to_be_bytes());
        self.key.partition_key.encode_ordered(out);
        let key = self.key.id.as_str().as_bytes();
        // Idempotency keys are ids: at most 255 characters.
        out.extend_from_slice(&(key.len() as u16).to_be_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&self.record.fingerprint);
        out.extend_from_slice(&self.record.applied_at.to_be_bytes());
        out.extend_from_slice(&self.record.forget_at.to_be_bytes());
    }

    /// Reads one from `r`.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let collection = CollectionUid(r.u64()?);
        let (partition_key, rest) = PartitionKeyValue::decode_ordered(&r.bytes[r.at..])
            .filter(|(pk, _)| match pk {
                // What the engine stores: finite, and 0 for -0.
                PartitionKeyValue::Number(x) => x.is_finite() && x.to_bits() != (-0.0f64).to_bits(),
                _ => true,
            })
            .ok_or(DecodeError("bad partition key"))?;
        r.at = r.bytes.len() - rest.len();
        let len = usize::from(r.u16()?);
        let key = std::str::from_utf8(&r.take(len)?)
            .map_err(|_| DecodeError("idempotency key is not UTF-8"))?
            .to_string();
        let id = DocumentId::parse_stored(IdKind::IdempotencyKey, &key)
            .map_err(|_| DecodeError("bad idempotency key"))?;
        let fingerprint = r.take(16)?.as_ref().try_into().expect("16 bytes");
        let record = RequestRecord {
            fingerprint,
            applied_at: r.u64()?,
            forget_at: r.u64()?,
        };
        Ok(Remembered {
            collection,
            key: DocKey { partition_key, id },
            record,
        })
    }
}

/// One message of a partition's log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMessage {
    pub kind: MessageKind,
    pub partition: u32,
    /// The owner's lease generation.
    pub epoch: u64,
    /// The partition's last position before this message's records.
    pub after: u64,
    /// The chain's link after the partition's previous message (0 before the first).
    pub previous_link: u64,
    /// The owner's shard clock at the commit (Unix ms): a new owner's clock starts above it.
    pub watermark: u64,
    /// The catalog stream's position the commit ran under.
    pub catalog_seq: u64,
    /// Every version the owner had handed out is below this.
    pub versions_below: u64,
    /// The change log records, by collection, at positions `after + 1` on.
    pub records: Vec<(CollectionUid, Bytes)>,
    pub remembered: Vec<Remembered>,
}

/// Why bytes are not a log message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a Mayfly log message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

impl LogMessage {
    /// The partition's last position once this message is applied.
    pub fn last(&self) -> u64 {
        self.after + self.records.len() as u64
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let bytes: usize = self.records.iter().map(|(_, r)| r.len() + 12).sum();
        let mut out = Vec::with_capacity(64 + bytes);
        out.push(FORMAT);
        out.push(self.kind.code());
        out.extend_from_slice(&self.partition.to_be_bytes());
        for word in [
            self.epoch,
            self.after,
            self.previous_link,
            self.watermark,
            self.catalog_seq,
            self.versions_below,
        ] {
            out.extend_from_slice(&word.to_be_bytes());
        }
        out.extend_from_slice(&count(self.records.len()).to_be_bytes());
        for (collection, record) in &self.records {
            out.extend_from_slice(&collection.0.to_be_bytes());
            out.extend_from_slice(&count(record.len()).to_be_bytes());
            out.extend_from_slice(record);
        }
        out.extend_from_slice(&count(self.remembered.len()).to_be_bytes());
        for r in &self.remembered {
            r.encode(&mut out);
        }
        if let MessageKind::Snapshot { part, parts, bytes } = &self.kind {
            out.extend_from_slice(&part.to_be_bytes());
            out.extend_from_slice(&parts.to_be_bytes());
            out.extend_from_slice(&count(bytes.len()).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        out
    }

    /// Parses a message's bytes; records share `bytes` rather than copying it. Refuses
    /// anything malformed, truncated or with bytes left over.
    pub fn decode(bytes: &Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        if r.u8()? != FORMAT {
            return Err(DecodeError("unknown format"));
        }
        let kind_code = r.u8()?;
        let partition = r.u32()?;
        let (epoch, after, previous_link) = (r.u64()?, r.u64()?, r.u64()?);
        let (watermark, catalog_seq, versions_below) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.u32()?;
        let mut records = Vec::new();
        for _ in 0..n {
            let collection = CollectionUid(r.u64()?);
            let len = r.u32()? as usize;
            records.push((collection, r.take(len)?));
        }
        let n = r.u32()?;
        let mut remembered = Vec::new();
        for _ in 0..n {
            remembered.push(Remembered::decode(&mut r)?);
        }
        let kind = match kind_code {
            // A commit may hold no record: it remembered requests, or kept the version floor.
            1 => MessageKind::Commit,
            2 if records.is_empty() => MessageKind::Takeover,
            4 if records.is_empty() && remembered.is_empty() => {
                let (part, parts) = (r.u32()?, r.u32()?);
                if part >= parts {
                    return Err(DecodeError("a snapshot part past its count"));
                }
                let len = r.u32()? as usize;
                MessageKind::Snapshot {
                    part,
                    parts,
                    bytes: r.take(len)?,
                }
            }
            2 | 4 => return Err(DecodeError("records do not fit the kind")),
            _ => return Err(DecodeError("unknown kind")),
        };
        if r.at != bytes.len() {
            return Err(DecodeError("bytes after the message"));
        }
        if after.checked_add(records.len() as u64).is_none() {
            return Err(DecodeError("positions past the largest"));
        }
        Ok(LogMessage {
            kind,
            partition,
            epoch,
            after,
            previous_link,
            watermark,
            catalog_seq,
            versions_below,
            records,
            remembered,
        })
    }
}

/// The commits of one publish, in order, as one NATS message: the publish queue sends those
/// queued behind the previous publish together (docs/cluster.md, "Streams"). Layout,
/// big-endian: `count (u32) | (length (u32) | message)*`.
pub fn encode_frame<M: AsRef<[u8]>>(messages: &[M]) -> Vec<u8> {
    let bytes: usize = messages.iter().map(|m| m.as_ref().len() + 4).sum();
    let mut out = Vec::with_capacity(4 + bytes);
    out.extend_from_slice(&count(messages.len()).to_be_bytes());
    for m in messages {
        out.extend_from_slice(&count(m.as_ref().len()).to_be_bytes());
        out.extend_from_slice(m.as_ref());
    }
    out
}

/// The messages of a frame, sharing its bytes; refuses a malformed, empty or truncated frame.
pub fn decode_frame(bytes: &Bytes) -> Result<Vec<Bytes>, DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    let n = r.u32()?;
    if n == 0 {
        return Err(DecodeError("an empty frame"));
    }
    // Each message needs at least its length: a count past that is a lie.
    if n as usize > bytes.len() / 4 {
        return Err(DecodeError("more messages than the frame holds"));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = r.u32()? as usize;
        out.push(r.take(len)?);
    }
    if r.at != bytes.len() {
        return Err(DecodeError("bytes after the frame"));
    }
    Ok(out)
}

/// The chain's link after a message whose bytes are `encoded`, following `previous`: xxh3-64
/// of the bytes, seeded with the previous link (the bytes name that link too, so a message
/// fits only where it was written).
pub fn link(previous: u64, encoded: &[u8]) -> u64 {
    xxh3_64_with_seed(encoded, previous)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).expect("a message holds fewer than 2^32 items and bytes per item")
}

pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a Bytes,
    pub(crate) at: usize,
}

impl Reader<'_> {
    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError("truncated"))?;
        let out = self.bytes.slice(self.at..end);
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.as_ref().try_into().expect("N bytes"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn commit(partition: u32, after: u64, previous_link: u64, n: usize) -> LogMessage {
        LogMessage {
            kind: MessageKind::Commit,
            partition,
            epoch: 3,
            after,
            previous_link,
            watermark: 1_764_000_000_000,
            catalog_seq: 12,
            versions_below: 900,
            records: (0..n)
                .map(|i| (CollectionUid(7), Bytes::from(format!("record {i}"))))
                .collect(),
            remembered: vec![Remembered {
                collection: CollectionUid(7),
                key: DocKey {
                    partition_key: PartitionKeyValue::String("tenant\0a".into()),
                    id: DocumentId::parse_stored(IdKind::IdempotencyKey, "retry-1").expect("id"),
                },
                record: RequestRecord {
                    fingerprint: [9; 16],
                    applied_at: 5,
                    forget_at: 6,
                },
            }],
        }
    }

    #[test]
    fn frames_round_trip_and_damage_is_refused() {
        let messages: Vec<Vec<u8>> = (0..3).map(|i| commit(1, i, 0, 1).encode()).collect();
        let frame = Bytes::from(encode_frame(&messages));
        let parts = decode_frame(&frame).expect("decodes");
        assert_eq!(parts.len(), 3);
        for (part, message) in parts.iter().zip(&messages) {
            assert_eq!(part.as_ref(), message.as_slice());
        }
        assert!(decode_frame(&frame.slice(..frame.len() - 1)).is_err());
        let mut longer = frame.to_vec();
        longer.push(0);
        assert!(decode_frame(&Bytes::from(longer)).is_err());
        assert!(decode_frame(&Bytes::from(encode_frame::<Vec<u8>>(&[]))).is_err());
        assert!(decode_frame(&Bytes::from_static(&[255, 255, 255, 255, 0, 0, 0, 0])).is_err());
    }

    #[test]
    fn every_kind_round_trips() {
        let takeover = LogMessage {
            kind: MessageKind::Takeover,
            records: Vec::new(),
            remembered: Vec::new(),
            ..commit(4, 10, 77, 0)
        };
        let part = LogMessage {
            kind: MessageKind::Snapshot {
                part: 1,
                parts: 3,
                bytes: Bytes::from_static(b"state"),
            },
            ..takeover.clone()
        };
        for message in [commit(4, 10, 77, 3), takeover, part] {
            let bytes = Bytes::from(message.encode());
            assert_eq!(LogMessage::decode(&bytes), Ok(message));
        }
        assert_eq!(commit(4, 10, 77, 3).last(), 13);
    }

    #[test]
    fn a_commit_without_records_or_a_takeover_with_some_is_refused() {
        // A commit without records (it remembered a request) is one.
        let empty_commit = LogMessage {
            records: Vec::new(),
            ..commit(0, 0, 0, 0)
        };
        let bytes = Bytes::from(empty_commit.encode());
        assert_eq!(LogMessage::decode(&bytes), Ok(empty_commit));
        let full_takeover = LogMessage {
            kind: MessageKind::Takeover,
            ..commit(0, 0, 0, 2)
        };
        let bytes = Bytes::from(full_takeover.encode());
        assert_eq!(
            LogMessage::decode(&bytes),
            Err(DecodeError("records do not fit the kind"))
        );
    }

    #[test]
    fn every_truncation_and_any_extra_byte_is_refused() {
        let bytes = commit(1, 0, 0, 2).encode();
        for cut in 0..bytes.len() {
            assert!(
                LogMessage::decode(&Bytes::copy_from_slice(&bytes[..cut])).is_err(),
                "{cut}"
            );
        }
        let mut longer = bytes;
        longer.push(0);
        assert!(LogMessage::decode(&Bytes::from(longer)).is_err());
    }

    #[test]
    fn the_link_depends_on_the_previous_one_and_every_byte() {
        let bytes = commit(1, 0, 0, 2).encode();
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert_ne!(link(0, &bytes), link(1, &bytes));
        assert_ne!(link(0, &bytes), link(0, &flipped));
    }

    proptest! {
        /// Whatever a valid message's bytes become (bytes changed, cut, inserted), decoding
        /// answers: it never panics, and counts it is told (records, remembered requests)
        /// allocate nothing before the bytes they name are there.
        #[test]
        fn decoding_damaged_messages_answers(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
            kind in 0u8..3,
        ) {
            let mut message = commit(2, 40, 99, 3);
            if kind > 0 {
                message.records.clear();
                message.kind = if kind == 1 {
                    MessageKind::Takeover
                } else {
                    message.remembered.clear();
                    MessageKind::Snapshot { part: 0, parts: 2, bytes: Bytes::from_static(b"s") }
                };
            }
            let mut bytes = message.encode();
            for (at, byte, how) in edits {
                let i = at.index(bytes.len());
                match how {
                    0 => bytes[i] = byte,
                    1 => bytes.truncate(i),
                    _ => bytes.insert(i, byte),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = LogMessage::decode(&Bytes::from(bytes));
        }
    }

    #[test]
    fn positions_past_the_largest_are_refused() {
        let bytes = Bytes::from(commit(2, u64::MAX - 1, 0, 3).encode());
        assert_eq!(
            LogMessage::decode(&bytes),
            Err(DecodeError("positions past the largest"))
        );
    }
}
