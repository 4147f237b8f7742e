//! The bytes of one change log record: enough to re-apply the change without reading anything
//! else (see `docs/changefeed.md`). Storage keeps them opaque, keyed by position.
//!
//! Layout, big-endian: `format (u8) | operation (u8) | crts (u64, Unix ms) | logged at (u64,
//! Unix ms) | version (u64) | previous position of the document (u64, 0: none) | own ttl (i32,
//! 0: inherits) | partition key (order-preserving encoding) | id length (u16) | id | body
//! (writes only)`.

use bytes::Bytes;

use crate::engine::document::{DocumentView, Etag};
use crate::model::{
    DefaultTtl, DocKey, DocumentId, DocumentTtl, IdKind, Millis, PartitionKeyValue,
};
use crate::storage::{LogRecord, StorageError};

/// The layout written; a record of another is refused rather than misread.
const FORMAT: u8 = 1;
/// Bytes before the partition key.
const FIXED: usize = 38;

/// What a change did to its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeOp {
    /// A write with no live version before it.
    Create,
    /// A write over a live version (a replace, an upsert or a touch).
    Replace,
    /// A patch of a live version.
    Patch,
    /// A client's delete.
    Delete,
    /// The document expired: its instant passed (`crts` is that instant).
    Expire,
}

impl ChangeOp {
    fn code(self) -> u8 {
        match self {
            ChangeOp::Create => 1,
            ChangeOp::Replace => 2,
            ChangeOp::Patch => 3,
            ChangeOp::Delete => 4,
            ChangeOp::Expire => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => ChangeOp::Create,
            2 => ChangeOp::Replace,
            3 => ChangeOp::Patch,
            4 => ChangeOp::Delete,
            5 => ChangeOp::Expire,
            _ => return None,
        })
    }

    /// Whether the record carries the new version's body.
    pub fn is_write(self) -> bool {
        matches!(self, ChangeOp::Create | ChangeOp::Replace | ChangeOp::Patch)
    }
}

/// One change, as the log keeps it (its position is the record's key).
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeRecord {
    pub op: ChangeOp,
    /// When it was committed (Unix ms); for an expiry, the expiry instant.
    pub crts: Millis,
    /// When it was appended, by the shard's clock: never decreasing along a shard's log (an
    /// expiry found late is appended after its instant), so searches by time use it.
    pub logged_at: Millis,
    /// The version written, or the version deleted or expired.
    pub version: u64,
    /// The position of the document's previous record in this log (0: none known).
    pub previous: u64,
    /// The version's own ttl (`None`: it inherits the collection's default).
    pub ttl: Option<DocumentTtl>,
    pub key: DocKey,
    /// The new version's body, for writes.
    pub body: Option<Bytes>,
}

impl ChangeRecord {
    /// The version a write record carries, as a read at `read_at` under the collection's
    /// `default` TTL would view it; `None` for deletes and expiries.
    pub fn document(&self, default: DefaultTtl, read_at: Millis) -> Option<DocumentView> {
        let body = self.body.clone()?;
        Some(DocumentView {
            key: self.key.clone(),
            body,
            last_write: self.crts,
            etag: Etag(self.version),
            ttl: self.ttl,
            expires_at: crate::model::ttl::expires_at(self.crts, self.ttl, default),
            read_at,
        })
    }

    /// Appends the record's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_head(out);
        if let Some(body) = self.write_body() {
            out.extend_from_slice(body);
        }
    }

    /// The record's bytes for storage: the body shared, not copied (see [`LogRecord`]).
    pub fn log_record(&self) -> LogRecord {
        let mut head = Vec::new();
        self.encode_head(&mut head);
        LogRecord {
            head: head.into(),
            body: self.write_body().cloned().unwrap_or_default(),
        }
    }

    /// The body the record's bytes end with: a write's new version.
    fn write_body(&self) -> Option<&Bytes> {
        self.body.as_ref().filter(|_| self.op.is_write())
    }

    /// Appends the record's bytes before the body to `out`.
    fn encode_head(&self, out: &mut Vec<u8>) {
        let id = self.key.id.as_str().as_bytes();
        out.reserve(FIXED + 16 + id.len());
        out.push(FORMAT);
        out.push(self.op.code());
        out.extend_from_slice(&self.crts.to_be_bytes());
        out.extend_from_slice(&self.logged_at.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.previous.to_be_bytes());
        out.extend_from_slice(&DocumentTtl::to_stored(self.ttl).to_be_bytes());
        self.key.partition_key.encode_ordered(out);
        // Ids are bounded far below 64 KiB at the edge (and by storage's key limit).
        out.extend_from_slice(&(id.len() as u16).to_be_bytes());
        out.extend_from_slice(id);
    }

    /// Parses a record as storage returns it: its head, and its body kept apart or not.
    pub fn decode_log(record: &LogRecord) -> Result<Self, StorageError> {
        let mut decoded = Self::decode(&record.head)?;
        if !record.body.is_empty() && decoded.op.is_write() {
            decoded.body = Some(record.body.clone());
        }
        Ok(decoded)
    }

    /// Parses a record's bytes; `bytes` is shared, not copied, for the body.
    pub fn decode(bytes: &Bytes) -> Result<Self, StorageError> {
        let bad = || StorageError::new("corrupt change log record in the data directory");
        if bytes.len() < FIXED || bytes[0] != FORMAT {
            return Err(bad());
        }
        let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let op = ChangeOp::from_code(bytes[1]).ok_or_else(bad)?;
        let raw_ttl = i32::from_be_bytes(bytes[34..38].try_into().expect("4 bytes"));
        let ttl = DocumentTtl::from_stored(raw_ttl).ok_or_else(bad)?;
        let (partition_key, rest) =
            PartitionKeyValue::decode_ordered(&bytes[FIXED..]).ok_or_else(bad)?;
        let (len, rest) = rest.split_at_checked(2).ok_or_else(bad)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let (id, body) = rest.split_at_checked(len).ok_or_else(bad)?;
        let id = std::str::from_utf8(id).map_err(|_| bad())?;
        let id = DocumentId::parse_stored(IdKind::Document, id).map_err(|_| bad())?;
        let body_at = bytes.len() - body.len();
        Ok(ChangeRecord {
            op,
            crts: word(2),
            logged_at: word(10),
            version: word(18),
            previous: word(26),
            ttl,
            key: DocKey { partition_key, id },
            body: op.is_write().then(|| bytes.slice(body_at..)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TtlSeconds;

    fn record(op: ChangeOp, pk: PartitionKeyValue, id: &str, body: Option<&str>) -> ChangeRecord {
        ChangeRecord {
            op,
            crts: 1_700_000_000_123,
            logged_at: 1_700_000_000_456,
            version: 42,
            previous: 7,
            ttl: Some(DocumentTtl::After(TtlSeconds::new(30).expect("valid"))),
            key: DocKey {
                partition_key: pk,
                id: DocumentId::parse_stored(IdKind::Document, id).expect("valid id"),
            },
            body: body.map(|b| Bytes::copy_from_slice(b.as_bytes())),
        }
    }

    #[test]
    fn records_round_trip() {
        let cases = [
            record(
                ChangeOp::Create,
                PartitionKeyValue::String("a\0b".into()),
                "x",
                Some(r#"{"id":"x"}"#),
            ),
            record(
                ChangeOp::Replace,
                PartitionKeyValue::number(-2.5),
                "ü",
                Some("{}"),
            ),
            record(
                ChangeOp::Patch,
                PartitionKeyValue::Undefined,
                "p",
                Some(r#"{"n":1}"#),
            ),
            record(ChangeOp::Delete, PartitionKeyValue::Null, "gone", None),
            ChangeRecord {
                ttl: None,
                ..record(ChangeOp::Expire, PartitionKeyValue::Bool(true), "e", None)
            },
            ChangeRecord {
                ttl: Some(DocumentTtl::Never),
                ..record(
                    ChangeOp::Create,
                    PartitionKeyValue::String("".into()),
                    "n",
                    Some("{}"),
                )
            },
        ];
        for case in cases {
            let mut out = Vec::new();
            case.encode(&mut out);
            // The parts storage keeps are the same bytes, the body shared with the record's.
            let parts = case.log_record();
            assert_eq!(parts.to_bytes(), out);
            if case.op.is_write() {
                assert_eq!(
                    parts.body.as_ptr(),
                    case.body.as_ref().expect("a body").as_ptr()
                );
            }
            let decoded = ChangeRecord::decode(&Bytes::from(out)).expect("decodes");
            assert_eq!(decoded, case);
        }
    }

    #[test]
    fn deletes_and_expiries_carry_no_body() {
        let mut out = Vec::new();
        record(ChangeOp::Expire, PartitionKeyValue::Null, "e", Some("{}")).encode(&mut out);
        let decoded = ChangeRecord::decode(&Bytes::from(out)).expect("decodes");
        assert_eq!(decoded.body, None);
    }

    #[test]
    fn damaged_records_are_refused() {
        let mut out = Vec::new();
        record(
            ChangeOp::Create,
            PartitionKeyValue::String("pk".into()),
            "id",
            Some("{}"),
        )
        .encode(&mut out);
        for cut in 0..out.len() - 2 {
            // Cut inside the fixed part, the partition key or the id: every one is refused.
            assert!(
                ChangeRecord::decode(&Bytes::copy_from_slice(&out[..cut])).is_err(),
                "{cut}"
            );
        }
        let mut other_format = out.clone();
        other_format[0] = 2;
        assert!(ChangeRecord::decode(&Bytes::from(other_format)).is_err());
        let mut bad_op = out;
        bad_op[1] = 9;
        assert!(ChangeRecord::decode(&Bytes::from(bad_op)).is_err());
    }
}
