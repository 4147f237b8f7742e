//! A partition's snapshot in its own log (docs/cluster.md, "Snapshots and retention"): the
//! engine's [`ShardSnapshot`] as bytes, split into parts that follow each other on the
//! partition's subject, chained like any message, and put back together by a node that lacks
//! the log before it.
//!
//! Layout, big-endian: `format (u8) | seq (u64) | versions below (u64) | time (u64) | document
//! count (u32) | (collection uid (u64) | head length (u32) | head | body length (u32) | body)*
//! | remembered count (u32) | remembered (as in a log message)* | the partition's epoch table
//! ([`Epochs::encode`]) | xxh3-64 of all before (u64)`.

use bytes::Bytes;
use mayfly_engine::{engine::ShardSnapshot, model::CollectionUid, storage::LogRecord};
use xxhash_rust::xxh3::xxh3_64;

use crate::{
    chain::{Chain, Divergence},
    epochs::Epochs,
    log_message::{DecodeError, LogMessage, MessageKind, Reader, Remembered, link},
};

/// The largest part of a snapshot one message carries: two fit in a frame.
pub const PART_BYTES: usize = 256 * 1024;

const FORMAT: u8 = 2;

/// The snapshot's bytes, with the owner epochs of the history it ends (`epochs`).
pub fn encode(s: &ShardSnapshot, epochs: &Epochs) -> Vec<u8> {
    let bytes: usize = s.documents.iter().map(|(_, r)| r.len() + 16).sum();
    let mut out = Vec::with_capacity(64 + bytes + 64 * s.remembered.len());
    out.push(FORMAT);
    for word in [s.seq, s.versions_below, s.time] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    out.extend_from_slice(&count(s.documents.len()).to_be_bytes());
    for (collection, record) in &s.documents {
        out.extend_from_slice(&collection.0.to_be_bytes());
        for part in [&record.head, &record.body] {
            out.extend_from_slice(&count(part.len()).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out.extend_from_slice(&count(s.remembered.len()).to_be_bytes());
    for (collection, key, record) in &s.remembered {
        Remembered {
            collection: *collection,
            key: key.clone(),
            record: *record,
        }
        .encode(&mut out);
    }
    epochs.encode(&mut out);
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_be_bytes());
    out
}

/// Parses a snapshot's bytes (records share `bytes`), and its epoch table. Refuses anything
/// damaged.
pub fn decode(bytes: &Bytes) -> Result<(ShardSnapshot, Epochs), DecodeError> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(DecodeError("a snapshot shorter than its checksum"));
    };
    let sum = u64::from_be_bytes(bytes[body_len..].try_into().expect("8 bytes"));
    if xxh3_64(&bytes[..body_len]) != sum {
        return Err(DecodeError("a snapshot whose checksum does not match"));
    }
    let body = bytes.slice(..body_len);
    let mut r = Reader {
        bytes: &body,
        at: 0,
    };
    if r.u8()? != FORMAT {
        return Err(DecodeError("unknown snapshot format"));
    }
    let (seq, versions_below, time) = (r.u64()?, r.u64()?, r.u64()?);
    let n = r.u32()?;
    let mut documents = Vec::new();
    for _ in 0..n {
        let collection = CollectionUid(r.u64()?);
        let len = r.u32()? as usize;
        let head = r.take(len)?;
        let len = r.u32()? as usize;
        let body = r.take(len)?;
        documents.push((collection, LogRecord { head, body }));
    }
    let n = r.u32()?;
    let mut remembered = Vec::new();
    for _ in 0..n {
        let m = Remembered::decode(&mut r)?;
        remembered.push((m.collection, m.key, m.record));
    }
    let epochs = Epochs::decode(&mut r)?;
    if r.at != body.len() {
        return Err(DecodeError("bytes after the snapshot"));
    }
    Ok((
        ShardSnapshot {
            seq,
            versions_below,
            time,
            documents,
            remembered,
        },
        epochs,
    ))
}

/// The snapshot's bytes in parts of at most [`PART_BYTES`] (one, empty or not, at least).
pub fn split(encoded: Vec<u8>) -> Vec<Bytes> {
    let encoded = Bytes::from(encoded);
    let mut parts: Vec<Bytes> = (0..encoded.len())
        .step_by(PART_BYTES)
        .map(|at| encoded.slice(at..(at + PART_BYTES).min(encoded.len())))
        .collect();
    if parts.is_empty() {
        parts.push(Bytes::new());
    }
    parts
}

/// A snapshot being read from the log, part by part, by a node that lacks the log before it.
#[derive(Debug, Clone)]
pub struct Assembly {
    /// The history after the parts taken so far.
    pub chain: Chain,
    /// The stream sequence of the last part taken.
    pub subject_seq: u64,
    /// The stream sequence of its first part.
    pub first_seq: u64,
    parts: u32,
    next: u32,
    bytes: Vec<u8>,
    /// Decoded, its load refused for now (kept for the next try).
    decoded: Option<(ShardSnapshot, Epochs)>,
}

impl Assembly {
    /// Starts from a snapshot's first part (`raw`, stored at stream sequence `subject_seq`):
    /// `None` if the message is not one.
    pub fn start(partition: u32, raw: &Bytes, subject_seq: u64) -> Option<Self> {
        let m = LogMessage::decode(raw).ok()?;
        let MessageKind::Snapshot {
            part: 0,
            parts,
            bytes,
        } = &m.kind
        else {
            return None;
        };
        if m.partition != partition || bytes.len() > PART_BYTES {
            return None;
        }
        Some(Assembly {
            chain: Chain {
                partition,
                last: m.after,
                link: link(m.previous_link, raw),
                epoch: m.epoch,
            },
            subject_seq,
            first_seq: subject_seq,
            parts: *parts,
            next: 1,
            bytes: bytes.to_vec(),
            decoded: None,
        })
    }

    /// Takes the next part (`raw`, at stream sequence `subject_seq`); the snapshot once every
    /// part is in. A message that is not the next part of this snapshot is refused.
    pub fn add(&mut self, raw: &Bytes, subject_seq: u64) -> Result<(), Divergence> {
        let mut chain = self.chain;
        let m = chain.accept(raw)?;
        match m.kind {
            MessageKind::Snapshot { part, parts, bytes }
                if part == self.next && parts == self.parts && bytes.len() <= PART_BYTES =>
            {
                self.bytes.extend_from_slice(&bytes);
                self.next += 1;
                self.chain = chain;
                self.subject_seq = subject_seq;
                Ok(())
            }
            _ => Err(Divergence::Corrupt(DecodeError(
                "a snapshot's parts do not follow each other",
            ))),
        }
    }

    /// Keeps `snapshot` (from [`Assembly::snapshot`]) for another try at loading it.
    pub fn keep(&mut self, snapshot: (ShardSnapshot, Epochs)) {
        self.decoded = Some(snapshot);
    }

    /// Whether every part is in.
    pub fn complete(&self) -> bool {
        self.next == self.parts
    }

    /// The snapshot and its epoch table, once [`Assembly::complete`] (its bytes are taken);
    /// checked against its position in the log.
    pub fn snapshot(&mut self) -> Result<(ShardSnapshot, Epochs), Divergence> {
        if let Some(snapshot) = self.decoded.take() {
            return Ok(snapshot);
        }
        let snapshot =
            decode(&Bytes::from(std::mem::take(&mut self.bytes))).map_err(Divergence::Corrupt)?;
        if snapshot.0.seq != self.chain.last {
            return Err(Divergence::Corrupt(DecodeError(
                "a snapshot at another position than its message's",
            )));
        }
        Ok(snapshot)
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).expect("a snapshot holds fewer than 2^32 items and bytes per item")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mayfly_engine::{
        model::{DocumentId, IdKind, PartitionKeyValue},
        storage::{DocKey, RequestRecord},
    };

    fn snapshot(documents: usize) -> ShardSnapshot {
        ShardSnapshot {
            seq: 41,
            versions_below: 900,
            time: 1_764_000_000_000,
            documents: (0..documents)
                .map(|i| {
                    (
                        CollectionUid(7),
                        LogRecord {
                            head: Bytes::from(format!("head {i}")),
                            body: Bytes::from(vec![b'x'; 1000 + i]),
                        },
                    )
                })
                .collect(),
            remembered: vec![(
                CollectionUid(7),
                DocKey {
                    partition_key: PartitionKeyValue::String("t".into()),
                    id: DocumentId::parse_stored(IdKind::IdempotencyKey, "once").expect("id"),
                },
                RequestRecord {
                    fingerprint: [3; 16],
                    applied_at: 5,
                    forget_at: 6,
                },
            )],
        }
    }

    /// The owner epochs of the tests' history.
    fn epochs() -> Epochs {
        let mut e = Epochs::default();
        e.note(1, 0);
        e.note(3, 30);
        e
    }

    /// The parts of `s` as an owner publishes them after a log ending at `link` (epoch 3).
    fn parts(s: &ShardSnapshot, mut previous: u64) -> Vec<Bytes> {
        let chunks = split(encode(s, &epochs()));
        let n = chunks.len() as u32;
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, bytes)| {
                let raw = Bytes::from(
                    LogMessage {
                        kind: MessageKind::Snapshot {
                            part: i as u32,
                            parts: n,
                            bytes,
                        },
                        partition: 2,
                        epoch: 3,
                        after: s.seq,
                        previous_link: previous,
                        watermark: 0,
                        catalog_seq: 0,
                        versions_below: 0,
                        records: Vec::new(),
                        remembered: Vec::new(),
                    }
                    .encode(),
                );
                previous = link(previous, &raw);
                raw
            })
            .collect()
    }

    #[test]
    fn a_snapshot_round_trips_through_its_parts() {
        for documents in [0, 3, 600] {
            let s = snapshot(documents);
            let raw = parts(&s, 99);
            assert_eq!(
                raw.len(),
                encode(&s, &epochs()).len().div_ceil(PART_BYTES).max(1)
            );
            let mut assembly = Assembly::start(2, &raw[0], 10).expect("a first part");
            for (i, part) in raw.iter().enumerate().skip(1) {
                assert!(!assembly.complete());
                assembly.add(part, 10 + i as u64).expect("the next part");
            }
            assert!(assembly.complete());
            let whole = assembly.snapshot().expect("whole");
            assert_eq!(whole, (s.clone(), epochs()));
            assembly.keep(whole);
            assert_eq!(
                assembly.snapshot().expect("kept"),
                (s, epochs()),
                "kept for another try"
            );
            assert_eq!(assembly.chain.last, 41);
        }
    }

    #[test]
    fn a_damaged_or_missing_part_is_refused() {
        let s = snapshot(600);
        let raw = parts(&s, 0);
        assert!(raw.len() >= 3);
        let mut assembly = Assembly::start(2, &raw[0], 1).expect("first");
        assert!(assembly.add(&raw[2], 3).is_err(), "a part skipped");
        assert!(Assembly::start(2, &raw[1], 2).is_none(), "not a first part");
        let mut bytes = encode(&s, &epochs());
        bytes[20] ^= 1;
        assert!(decode(&Bytes::from(bytes)).is_err(), "a flipped bit");
        assert!(decode(&Bytes::from_static(b"short")).is_err());
    }
}
