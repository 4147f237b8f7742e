//! What the engine returns for documents, and the small types write requests carry.

use std::fmt;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{clock::Millis, ttl::DocumentTtl};
use crate::storage::DocKey;

/// A document as a client sees it, judged at `read_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentView {
    /// Partition key value and id.
    pub key: DocKey,
    /// The stored body, as the `google.protobuf.Struct` encoding of the JSON object.
    pub body: Bytes,
    /// Last write, Unix epoch ms (`_ts` is this in seconds).
    pub last_write: Millis,
    /// Version tag.
    pub etag: Etag,
    /// The document's own TTL as stored.
    pub ttl: Option<DocumentTtl>,
    /// When it expires under the rules at `read_at`; `None` = never.
    pub expires_at: Option<Millis>,
    /// The clock reading the request was judged by.
    pub read_at: Millis,
}

impl DocumentView {
    /// The body as a JSON object.
    pub fn body_map(&self) -> Map<String, Value> {
        mayfly_json::decode(&self.body)
    }
}

/// `_etag`: a document version, unique per write across the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Etag(pub u64);

impl Etag {
    /// Whether an etag a client sent names this version.
    pub fn matches(self, sent: &str) -> bool {
        // from_str_radix alone would also take a leading '+'.
        sent.len() == 16
            && sent.bytes().all(|b| b.is_ascii_hexdigit())
            && u64::from_str_radix(sent, 16) == Ok(self.0)
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// How a put treats an existing document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Fail if a live document exists.
    Create,
    /// Create or replace.
    Upsert,
    /// Fail unless a live document exists.
    Replace,
}

/// What an upsert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// No live document had the id.
    Created,
    /// A live document was replaced.
    Replaced,
}

/// A document as queries see it: its body with `_ts` (seconds) and `_etag`.
pub(crate) fn as_document(view: &DocumentView) -> Value {
    let mut map = view.body_map();
    map.insert("_ts".to_owned(), Value::from(view.last_write / 1000));
    map.insert("_etag".to_owned(), Value::String(view.etag.to_string()));
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_round_trip_and_reject_lookalikes() {
        let etag = Etag(0xabc);
        assert_eq!(etag.to_string(), "0000000000000abc");
        assert!(etag.matches("0000000000000abc"));
        assert!(etag.matches("0000000000000ABC"));
        assert!(!etag.matches("abc"), "only the exact form the server sent");
        assert!(!etag.matches("\"0000000000000abc\""));
        assert!(!etag.matches(""));
        // Regression: a leading '+' parsed as hex.
        assert!(!etag.matches("+000000000000abc"));
    }
}
