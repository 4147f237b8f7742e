//! A document body checked against SPEC §1 and §3: a JSON object with a valid string `id`, a
//! valid `ttl` if any, at most 2 MiB of JSON and 128 levels of nesting. System properties a
//! client sends are dropped.

use std::{io, sync::Arc};

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{
    DocumentId, IdKind, InvalidInput, ResourceId,
    partition_key::{SYSTEM_PROPERTIES, json_type},
    ttl::DocumentTtl,
};

/// Largest document, in bytes of compact JSON.
pub const MAX_DOCUMENT_BYTES: usize = mayfly_json::MAX_JSON_BYTES;
/// Deepest nesting: the document is level 1.
pub const MAX_DEPTH: usize = mayfly_json::MAX_DEPTH;

/// A validated document body.
#[derive(Debug, Clone)]
pub struct DocumentBody {
    map: Arc<Map<String, Value>>,
    id: DocumentId,
    ttl: Option<DocumentTtl>,
}

impl DocumentBody {
    /// Checks a body. `ttl_field` is the request's optional `ttl` shorthand: it is written into
    /// the body as `ttl`, and must equal the body's own `ttl` if both are given.
    pub fn parse(
        mut map: Arc<Map<String, Value>>,
        ttl_field: Option<i64>,
    ) -> Result<Self, InvalidInput> {
        if SYSTEM_PROPERTIES.iter().any(|p| map.contains_key(*p)) {
            let m = Arc::make_mut(&mut map);
            for p in SYSTEM_PROPERTIES {
                m.remove(p);
            }
        }
        let body_ttl = map.get("ttl").map(DocumentTtl::from_json).transpose()?;
        let ttl = match (ttl_field, body_ttl) {
            (None, ttl) => ttl,
            (Some(field), None) => {
                let ttl = DocumentTtl::from_i64(field)?;
                Arc::make_mut(&mut map).insert("ttl".to_owned(), ttl.to_json());
                Some(ttl)
            }
            (Some(field), Some(ttl)) => {
                let field_ttl = DocumentTtl::from_i64(field)?;
                if field_ttl != ttl {
                    return Err(InvalidInput::ConflictingTtl {
                        field,
                        body: ttl.to_string(),
                    });
                }
                Some(ttl)
            }
        };
        let id = match map.get("id") {
            Some(Value::String(s)) => ResourceId::parse(IdKind::Document, s)?,
            Some(other) => {
                return Err(InvalidInput::MissingId {
                    found: Some(json_type(other)),
                });
            }
            None => return Err(InvalidInput::MissingId { found: None }),
        };
        if depth_exceeds(&map, MAX_DEPTH) {
            return Err(InvalidInput::DocumentTooDeep { limit: MAX_DEPTH });
        }
        let bytes = json_len(&map);
        if bytes > MAX_DOCUMENT_BYTES {
            return Err(InvalidInput::DocumentTooLarge {
                bytes,
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        Ok(DocumentBody { map, id, ttl })
    }

    /// The document id.
    pub fn id(&self) -> &DocumentId {
        &self.id
    }

    /// The document's own TTL (`None` = inherits the collection default).
    pub fn ttl(&self) -> Option<DocumentTtl> {
        self.ttl
    }

    /// The JSON object.
    pub fn map(&self) -> &Arc<Map<String, Value>> {
        &self.map
    }

    /// The body in its stored form (the `google.protobuf.Struct` encoding) and its TTL.
    /// Encoding here, on the request's thread, means the JSON tree is also freed there: the
    /// stored document is a single buffer, cheap to send and cheap for the purge to free.
    #[doc(hidden)]
    pub fn into_stored(self) -> (Bytes, Option<DocumentTtl>) {
        (mayfly_json::encode(&self.map), self.ttl)
    }
}

/// Whether an object nests deeper than `limit` levels (itself being level 1). Recursion is
/// bounded by `limit`.
fn depth_exceeds(map: &Map<String, Value>, limit: usize) -> bool {
    fn value_exceeds(value: &Value, remaining: usize) -> bool {
        match value {
            Value::Object(m) => {
                remaining == 0 || m.values().any(|v| value_exceeds(v, remaining - 1))
            }
            Value::Array(a) => remaining == 0 || a.iter().any(|v| value_exceeds(v, remaining - 1)),
            _ => false,
        }
    }
    map.values().any(|v| value_exceeds(v, limit - 1))
}

/// Length of the compact JSON encoding, without building it.
fn json_len(map: &Map<String, Value>) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a Map to a counter cannot fail: keys are strings and numbers are finite.
    let _ = serde_json::to_writer(&mut counter, map);
    counter.0
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value, ttl_field: Option<i64>) -> Result<DocumentBody, InvalidInput> {
        match v {
            Value::Object(m) => DocumentBody::parse(Arc::new(m), ttl_field),
            _ => panic!("object expected"),
        }
    }

    fn nested(levels: usize) -> Value {
        let mut v = json!(1);
        for _ in 1..levels {
            v = json!({ "a": v });
        }
        json!({"id": "deep", "a": v})
    }

    #[test]
    fn keeps_the_body_as_sent_and_never_adds_ttl() {
        let body = parse(json!({"id": "a", "x": 1}), None).expect("valid");
        assert_eq!(
            **body.map(),
            *json!({"id": "a", "x": 1}).as_object().expect("object")
        );
        assert_eq!(body.ttl(), None);
        let (stored, _) = body.into_stored();
        assert_eq!(
            mayfly_json::decode(&stored),
            *json!({"id": "a", "x": 1}).as_object().expect("object")
        );
    }

    #[test]
    fn drops_system_properties_a_client_sends() {
        let body = parse(json!({"id": "a", "_ts": 1, "_etag": "x", "_rid": "r", "_self": "s", "_attachments": "a", "_mine": 1}), None)
            .expect("valid");
        assert_eq!(
            **body.map(),
            *json!({"id": "a", "_mine": 1}).as_object().expect("object")
        );
    }

    #[test]
    fn the_ttl_field_is_shorthand_for_the_body_property() {
        let body = parse(json!({"id": "a"}), Some(30)).expect("valid");
        assert_eq!(body.map()["ttl"], json!(30));
        assert!(parse(json!({"id": "a", "ttl": 30}), Some(30)).is_ok());
        let err = parse(json!({"id": "a", "ttl": 30}), Some(31)).expect_err("conflict");
        assert!(matches!(err, InvalidInput::ConflictingTtl { .. }), "{err}");
        let err = parse(json!({"id": "a"}), Some(0)).expect_err("invalid field");
        assert_eq!(err, InvalidInput::DocumentTtl { raw: "0".into() });
    }

    #[test]
    fn rejects_missing_or_bad_ids() {
        assert_eq!(
            parse(json!({"x": 1}), None).expect_err("no id"),
            InvalidInput::MissingId { found: None }
        );
        assert_eq!(
            parse(json!({"id": 5}), None).expect_err("number id"),
            InvalidInput::MissingId {
                found: Some("a number")
            }
        );
        assert!(matches!(
            parse(json!({"id": "a/b"}), None).expect_err("slash"),
            InvalidInput::Id { .. }
        ));
    }

    #[test]
    fn size_limit_is_2_mib_of_json() {
        // {"id":"a","p":""} is 17 bytes, plus the padding.
        let fits = "x".repeat(MAX_DOCUMENT_BYTES - 17);
        let body = parse(json!({"id": "a", "p": fits}), None).expect("exactly 2 MiB");
        assert_eq!(json_len(body.map()), MAX_DOCUMENT_BYTES);
        let err =
            parse(json!({"id": "a", "p": format!("{fits}x")}), None).expect_err("one byte over");
        assert_eq!(
            err,
            InvalidInput::DocumentTooLarge {
                bytes: MAX_DOCUMENT_BYTES + 1,
                limit: MAX_DOCUMENT_BYTES
            }
        );
    }

    #[test]
    fn depth_limit_is_128_levels() {
        // nested(n) is n levels deep, the document itself included.
        assert!(parse(nested(MAX_DEPTH), None).is_ok());
        let err = parse(nested(MAX_DEPTH + 1), None).expect_err("129 levels");
        assert_eq!(err, InvalidInput::DocumentTooDeep { limit: MAX_DEPTH });
    }
}
