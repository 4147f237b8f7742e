//! Byte layouts of the disk backend's keys and values.
//!
//! Document keys are `shard (u16) | collection uid (u64) | partition key | id`, all
//! order-preserving, so one shard's documents, one collection's and one partition's are each
//! a contiguous key range. Values start with the same 20-byte header in both keyspaces:
//! `version (u64) | last write (u64, Unix ms) | own ttl (i32: 0 inherit, -1 never, n seconds)`;
//! the documents keyspace appends the body. The expiry instant is a function of absolute values
//! only (last write + ttl, or + the collection default): a restart never extends a life.

use crate::model::{CollectionUid, DocumentId, DocumentTtl, IdKind, Millis, PartitionKeyValue};
use crate::storage::{DocKey, RequestRecord, StorageError};

/// Longest key fjall accepts (it asserts this, so a longer one would panic the writer).
pub(super) const MAX_KEY_BYTES: usize = u16::MAX as usize;

/// Bytes of the value header.
pub(super) const HEADER_BYTES: usize = 20;

/// The key prefix of one shard.
pub(super) fn shard_prefix(shard: u16) -> Vec<u8> {
    shard.to_be_bytes().to_vec()
}

/// The key prefix of one collection within a shard.
pub(super) fn collection_prefix(shard: u16, uid: CollectionUid) -> Vec<u8> {
    let mut key = Vec::with_capacity(10);
    key.extend_from_slice(&shard.to_be_bytes());
    key.extend_from_slice(&uid.0.to_be_bytes());
    key
}

/// The key prefix of one partition within a collection.
pub(super) fn partition_prefix(
    shard: u16,
    uid: CollectionUid,
    partition_key: &PartitionKeyValue,
) -> Vec<u8> {
    let mut key = collection_prefix(shard, uid);
    partition_key.encode_ordered(&mut key);
    key
}

/// A document's key.
pub(super) fn document_key(shard: u16, uid: CollectionUid, key: &DocKey) -> Vec<u8> {
    let mut out = partition_prefix(shard, uid, &key.partition_key);
    out.extend_from_slice(key.id.as_str().as_bytes());
    out
}

/// A remembered request's value: its fingerprint, then when it applied and when it is
/// forgotten (big-endian ms).
pub(super) fn encode_request(record: &RequestRecord) -> [u8; 32] {
    let mut out = [0; 32];
    out[..16].copy_from_slice(&record.fingerprint);
    out[16..24].copy_from_slice(&record.applied_at.to_be_bytes());
    out[24..].copy_from_slice(&record.forget_at.to_be_bytes());
    out
}

pub(super) fn decode_request(value: &[u8]) -> Result<RequestRecord, StorageError> {
    let value: &[u8; 32] = value
        .try_into()
        .map_err(|_| corrupt("remembered request"))?;
    let ms = |at: usize| u64::from_be_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    Ok(RequestRecord {
        fingerprint: value[..16].try_into().expect("16 bytes"),
        applied_at: ms(16),
        forget_at: ms(24),
    })
}

fn corrupt(what: &str) -> StorageError {
    StorageError::new(format!("corrupt {what} in the data directory"))
}

/// Splits a document key into its collection and address.
pub(super) fn decode_document_key(key: &[u8]) -> Result<(CollectionUid, DocKey), StorageError> {
    let bad = || corrupt("document key");
    let uid = key
        .get(2..10)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(bad)?;
    let rest = &key[10..];
    let (partition_key, id) = PartitionKeyValue::decode_ordered(rest).ok_or_else(bad)?;
    let id = std::str::from_utf8(id).map_err(|_| bad())?;
    let id = DocumentId::parse_stored(IdKind::Document, id).map_err(|_| bad())?;
    Ok((CollectionUid(uid), DocKey { partition_key, id }))
}

/// The header fields of a stored value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Header {
    pub(super) version: u64,
    pub(super) last_write: Millis,
    pub(super) ttl: Option<DocumentTtl>,
}

impl Header {
    pub(super) fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.last_write.to_be_bytes());
        out.extend_from_slice(&DocumentTtl::to_stored(self.ttl).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// Parses a value's header; returns it with the rest of the value (the body, if any).
    pub(super) fn decode(value: &[u8]) -> Result<(Header, &[u8]), StorageError> {
        let bad = || corrupt("document header");
        let field = |range: std::ops::Range<usize>| value.get(range).ok_or_else(bad);
        let version = u64::from_be_bytes(field(0..8)?.try_into().map_err(|_| bad())?);
        let last_write = u64::from_be_bytes(field(8..16)?.try_into().map_err(|_| bad())?);
        let raw_ttl = i32::from_be_bytes(field(16..20)?.try_into().map_err(|_| bad())?);
        let ttl = DocumentTtl::from_stored(raw_ttl).ok_or_else(bad)?;
        Ok((
            Header {
                version,
                last_write,
                ttl,
            },
            &value[HEADER_BYTES..],
        ))
    }
}

/// A headers-keyspace value: the header, then the position of the document's latest change
/// log record (u64) and a flags byte (bit 0: its expiry is logged). Values written before the
/// change feed existed hold the header alone.
pub(super) fn encode_meta(header: &Header, seq: u64, expiry_logged: bool) -> Vec<u8> {
    let mut out = header.encode(&[]);
    out.extend_from_slice(&seq.to_be_bytes());
    out.push(u8::from(expiry_logged));
    out
}

/// Parses a headers-keyspace value: the header, the document's latest log position and
/// whether its expiry is logged.
pub(super) fn decode_meta(value: &[u8]) -> Result<(Header, u64, bool), StorageError> {
    let (header, rest) = Header::decode(value)?;
    match rest {
        [] => Ok((header, 0, false)),
        [seq @ .., flags] if seq.len() == 8 && *flags <= 1 => Ok((
            header,
            u64::from_be_bytes(seq.try_into().expect("8 bytes")),
            *flags == 1,
        )),
        _ => Err(corrupt("document header")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TtlSeconds;

    fn key(pk: PartitionKeyValue, id: &str) -> DocKey {
        DocKey {
            partition_key: pk,
            // As stored: "a\0", no longer accepted in requests, may be stored by an earlier
            // version, and its NUL must still encode and sort right.
            id: DocumentId::parse_stored(IdKind::Document, id).expect("valid id"),
        }
    }

    fn samples() -> Vec<DocKey> {
        let mut out = Vec::new();
        let pks = [
            PartitionKeyValue::Undefined,
            PartitionKeyValue::Null,
            PartitionKeyValue::Bool(false),
            PartitionKeyValue::Bool(true),
            PartitionKeyValue::number(-1e300),
            PartitionKeyValue::number(-2.5),
            PartitionKeyValue::number(0.0),
            PartitionKeyValue::number(3.0),
            PartitionKeyValue::number(1e300),
            PartitionKeyValue::String("".into()),
            PartitionKeyValue::String("a".into()),
            PartitionKeyValue::String("a\0".into()),
            PartitionKeyValue::String("a\0b".into()),
            PartitionKeyValue::String("ab".into()),
            PartitionKeyValue::String("é".into()),
        ];
        for pk in pks {
            for id in ["a", "a\0", "b", "zz", "ü"] {
                out.push(key(pk.clone(), id));
            }
        }
        out
    }

    #[test]
    fn keys_round_trip_and_sort_like_the_engine() {
        let mut keys = samples();
        keys.sort();
        let encoded: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| document_key(3, CollectionUid(7), k))
            .collect();
        let mut sorted = encoded.clone();
        sorted.sort();
        assert_eq!(sorted, encoded, "byte order is the engine's key order");
        for (k, bytes) in keys.iter().zip(&encoded) {
            let (uid, decoded) = decode_document_key(bytes).expect("decodes");
            assert_eq!(uid, CollectionUid(7));
            assert_eq!(&decoded, k);
            let prefix = partition_prefix(3, CollectionUid(7), &k.partition_key);
            assert!(bytes.starts_with(&prefix));
            // No other partition's keys share this partition's prefix.
            for (other, other_bytes) in keys.iter().zip(&encoded) {
                if other.partition_key != k.partition_key {
                    assert!(!other_bytes.starts_with(&prefix), "{other:?} under {k:?}");
                }
            }
        }
    }

    #[test]
    fn headers_round_trip() {
        for ttl in [
            None,
            Some(DocumentTtl::Never),
            Some(DocumentTtl::After(TtlSeconds::new(1).expect("valid"))),
            Some(DocumentTtl::After(
                TtlSeconds::new(i64::from(i32::MAX)).expect("valid"),
            )),
        ] {
            let header = Header {
                version: u64::MAX - 3,
                last_write: 1_700_000_000_123,
                ttl,
            };
            let value = header.encode(b"body");
            let (decoded, body) = Header::decode(&value).expect("decodes");
            assert_eq!(decoded, header);
            assert_eq!(body, b"body");
        }
        assert!(Header::decode(&[0; 19]).is_err());
    }

    #[test]
    fn meta_values_round_trip_and_read_the_old_layout() {
        let header = Header {
            version: 9,
            last_write: 1_700_000_000_000,
            ttl: None,
        };
        for (seq, logged) in [(0, false), (77, false), (u64::MAX, true)] {
            let value = encode_meta(&header, seq, logged);
            assert_eq!(decode_meta(&value).expect("decodes"), (header, seq, logged));
        }
        // Written before the change feed: the header alone.
        assert_eq!(
            decode_meta(&header.encode(&[])).expect("decodes"),
            (header, 0, false)
        );
        let mut bad = encode_meta(&header, 1, true);
        *bad.last_mut().expect("flags") = 2;
        assert!(decode_meta(&bad).is_err());
        assert!(decode_meta(&encode_meta(&header, 1, true)[..HEADER_BYTES + 4]).is_err());
    }
}
