//! Partition key paths (`/customerId`, `/address/zip`) and the values found at them.

use std::{cmp::Ordering, fmt, hash::Hash, sync::Arc};

use serde_json::{Map, Value};

use super::invalid::InvalidInput;

/// Longest string partition key value, in bytes of UTF-8 (Cosmos DB's limit for large
/// partition keys). Bounds storage keys, which the disk backend caps at 64 KiB.
pub const MAX_PARTITION_KEY_BYTES: usize = 2048;
/// Most segments in a partition key path.
pub(crate) const MAX_PATH_SEGMENTS: usize = 16;
/// Properties the server owns; a partition key cannot point at them.
pub(crate) const SYSTEM_PROPERTIES: [&str; 5] = ["_rid", "_self", "_etag", "_ts", "_attachments"];

/// A validated partition key path.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PartitionKeyPath {
    raw: Box<str>,
    segments: Box<[Box<str>]>,
}

impl PartitionKeyPath {
    /// Parses `/a` or `/a/b/...`: segments are non-empty property names without `/`, `\` or `"`.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let invalid = |reason: &str| InvalidInput::PartitionKeyPath {
            path: raw.to_owned(),
            reason: reason.to_owned(),
        };
        let Some(rest) = raw.strip_prefix('/') else {
            return Err(invalid("it must start with '/', e.g. \"/customerId\""));
        };
        let segments: Vec<Box<str>> = rest.split('/').map(Box::from).collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(invalid("property names between '/' must not be empty"));
        }
        if segments.len() > MAX_PATH_SEGMENTS {
            return Err(invalid(&format!(
                "it has more than {MAX_PATH_SEGMENTS} levels"
            )));
        }
        if segments.iter().any(|s| s.contains(['"', '\\'])) {
            return Err(invalid(
                "quoted or escaped property names are not supported",
            ));
        }
        if segments.iter().any(|s| s.chars().count() > 255) {
            return Err(invalid("a property name is longer than 255 characters"));
        }
        if SYSTEM_PROPERTIES.contains(&&*segments[0]) {
            return Err(invalid(
                "it names a system property, which the server sets itself",
            ));
        }
        Ok(PartitionKeyPath {
            raw: raw.into(),
            segments: segments.into(),
        })
    }

    /// The path as given.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The value at this path in `body`: undefined if any level is missing or not an object.
    pub fn extract(&self, body: &Map<String, Value>) -> Result<PartitionKeyValue, InvalidInput> {
        let mut map = body;
        let (last, parents) = self
            .segments
            .split_last()
            .expect("parse guarantees one segment");
        for segment in parents {
            match map.get(&**segment) {
                Some(Value::Object(inner)) => map = inner,
                _ => return Ok(PartitionKeyValue::Undefined),
            }
        }
        match map.get(&**last) {
            None => Ok(PartitionKeyValue::Undefined),
            Some(value) => PartitionKeyValue::from_json(value).map_err(|e| match e {
                InvalidInput::PartitionKeyValueType { found, .. } => {
                    InvalidInput::PartitionKeyValueType {
                        path: self.raw.to_string(),
                        found,
                    }
                }
                other => other,
            }),
        }
    }
}

impl fmt::Display for PartitionKeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl fmt::Debug for PartitionKeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.raw, f)
    }
}

const TAG_UNDEFINED: u8 = 0;
const TAG_NULL: u8 = 1;
const TAG_FALSE: u8 = 2;
const TAG_TRUE: u8 = 3;
const TAG_NUMBER: u8 = 4;
const TAG_STRING: u8 = 5;

/// A partition key value. Documents without the property share the `Undefined` partition.
#[derive(Clone, Debug)]
pub enum PartitionKeyValue {
    /// No property at the path.
    Undefined,
    /// JSON null.
    Null,
    /// JSON true or false.
    Bool(bool),
    /// A JSON number (a double, as in Cosmos DB; -0 is stored as 0).
    Number(f64),
    /// A JSON string (shared, like ids, between index, metadata and storage).
    String(Arc<str>),
}

impl PartitionKeyValue {
    /// A scalar JSON value as a key; objects and arrays are rejected.
    pub fn from_json(value: &Value) -> Result<Self, InvalidInput> {
        Ok(match value {
            Value::Null => PartitionKeyValue::Null,
            Value::Bool(b) => PartitionKeyValue::Bool(*b),
            // serde_json numbers are always finite.
            Value::Number(n) => PartitionKeyValue::number(n.as_f64().unwrap_or(0.0)),
            Value::String(s) => PartitionKeyValue::string(s)?,
            Value::Object(_) | Value::Array(_) => {
                return Err(InvalidInput::PartitionKeyValueType {
                    path: String::new(),
                    found: json_type(value),
                });
            }
        })
    }

    /// A string key, if it is at most [`MAX_PARTITION_KEY_BYTES`] long.
    pub fn string(s: &str) -> Result<Self, InvalidInput> {
        if s.len() > MAX_PARTITION_KEY_BYTES {
            return Err(InvalidInput::PartitionKeyTooLong {
                bytes: s.len(),
                limit: MAX_PARTITION_KEY_BYTES,
            });
        }
        Ok(PartitionKeyValue::String(s.into()))
    }

    /// A number key, normalised so that equal numbers are one key.
    pub fn number(x: f64) -> Self {
        PartitionKeyValue::Number(if x == 0.0 { 0.0 } else { x })
    }

    /// The value as JSON (`None` for undefined).
    pub fn to_json(&self) -> Option<Value> {
        Some(match self {
            PartitionKeyValue::Undefined => return None,
            PartitionKeyValue::Null => Value::Null,
            PartitionKeyValue::Bool(b) => Value::Bool(*b),
            PartitionKeyValue::Number(x) => {
                serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number)
            }
            PartitionKeyValue::String(s) => Value::String(s.to_string()),
        })
    }

    /// Appends the value's one byte encoding, used by storage keys and continuation tokens
    /// alike. Byte order equals key order, and the encoding is self-delimiting: strings are
    /// escaped (0x00 → 0x00 0xFF) and end with 0x00 0x01, so one partition's encoding is
    /// never a prefix of another's.
    pub fn encode_ordered(&self, out: &mut Vec<u8>) {
        match self {
            PartitionKeyValue::Undefined => out.push(TAG_UNDEFINED),
            PartitionKeyValue::Null => out.push(TAG_NULL),
            PartitionKeyValue::Bool(false) => out.push(TAG_FALSE),
            PartitionKeyValue::Bool(true) => out.push(TAG_TRUE),
            PartitionKeyValue::Number(x) => {
                out.push(TAG_NUMBER);
                // Flip so that unsigned byte order is numeric order.
                let bits = x.to_bits();
                let ordered = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits | 1 << 63
                };
                out.extend_from_slice(&ordered.to_be_bytes());
            }
            PartitionKeyValue::String(s) => {
                out.push(TAG_STRING);
                for &b in s.as_bytes() {
                    out.push(b);
                    if b == 0 {
                        out.push(0xFF);
                    }
                }
                out.extend_from_slice(&[0x00, 0x01]);
            }
        }
    }

    /// Reads a value written by [`PartitionKeyValue::encode_ordered`] from the front of
    /// `bytes`, returning it and what follows; `None` if the bytes are not such an encoding.
    /// Only the structure is checked (not the length limit, which stored data may predate):
    /// input from clients goes through [`PartitionKeyValue::string`] as well.
    pub fn decode_ordered(bytes: &[u8]) -> Option<(Self, &[u8])> {
        let (&tag, rest) = bytes.split_first()?;
        Some(match tag {
            TAG_UNDEFINED => (PartitionKeyValue::Undefined, rest),
            TAG_NULL => (PartitionKeyValue::Null, rest),
            TAG_FALSE => (PartitionKeyValue::Bool(false), rest),
            TAG_TRUE => (PartitionKeyValue::Bool(true), rest),
            TAG_NUMBER => {
                let ordered = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
                let bits = if ordered >> 63 == 1 {
                    ordered & !(1 << 63)
                } else {
                    !ordered
                };
                (PartitionKeyValue::Number(f64::from_bits(bits)), &rest[8..])
            }
            TAG_STRING => {
                let mut s = Vec::new();
                let mut i = 0;
                loop {
                    match (rest.get(i), rest.get(i + 1)) {
                        (Some(0), Some(0xFF)) => {
                            s.push(0);
                            i += 2;
                        }
                        (Some(0), Some(1)) => break,
                        (Some(&b), _) if b != 0 => {
                            s.push(b);
                            i += 1;
                        }
                        _ => return None,
                    }
                }
                let s = String::from_utf8(s).ok()?;
                (PartitionKeyValue::String(s.into()), &rest[i + 2..])
            }
            _ => return None,
        })
    }

    fn rank(&self) -> u8 {
        match self {
            PartitionKeyValue::Undefined => 0,
            PartitionKeyValue::Null => 1,
            PartitionKeyValue::Bool(_) => 2,
            PartitionKeyValue::Number(_) => 3,
            PartitionKeyValue::String(_) => 4,
        }
    }
}

impl PartialEq for PartitionKeyValue {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PartitionKeyValue {}

impl PartialOrd for PartitionKeyValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PartitionKeyValue {
    fn cmp(&self, other: &Self) -> Ordering {
        use PartitionKeyValue as P;
        match (self, other) {
            (P::Bool(a), P::Bool(b)) => a.cmp(b),
            // Numbers are finite and -0 is normalised, so total_cmp agrees with ==.
            (P::Number(a), P::Number(b)) => a.total_cmp(b),
            (P::String(a), P::String(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl Hash for PartitionKeyValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.rank().hash(state);
        match self {
            PartitionKeyValue::Bool(b) => b.hash(state),
            PartitionKeyValue::Number(x) => x.to_bits().hash(state),
            PartitionKeyValue::String(s) => s.hash(state),
            PartitionKeyValue::Undefined | PartitionKeyValue::Null => {}
        }
    }
}

impl fmt::Display for PartitionKeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_json() {
            None => f.write_str("undefined"),
            Some(v) => write!(f, "{}", super::echo::Echo(&v.to_string())),
        }
    }
}

pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("object expected"),
        }
    }

    #[test]
    fn extracts_top_level_and_nested_values() {
        let top = PartitionKeyPath::parse("/customerId").expect("valid");
        let nested = PartitionKeyPath::parse("/address/zip").expect("valid");
        let doc = body(json!({"customerId": "c1", "address": {"zip": 98052}}));
        assert_eq!(
            top.extract(&doc).expect("scalar"),
            PartitionKeyValue::String("c1".into())
        );
        assert_eq!(
            nested.extract(&doc).expect("scalar"),
            PartitionKeyValue::number(98052.0)
        );
        assert_eq!(
            nested.extract(&body(json!({"address": "x"}))).expect("ok"),
            PartitionKeyValue::Undefined
        );
        assert_eq!(
            top.extract(&body(json!({}))).expect("ok"),
            PartitionKeyValue::Undefined
        );
        assert_eq!(
            top.extract(&body(json!({"customerId": null}))).expect("ok"),
            PartitionKeyValue::Null
        );
    }

    #[test]
    fn rejects_object_and_array_values() {
        let path = PartitionKeyPath::parse("/k").expect("valid");
        let err = path
            .extract(&body(json!({"k": {"a": 1}})))
            .expect_err("object");
        assert!(err.to_string().contains("an object"), "{err}");
        assert!(path.extract(&body(json!({"k": [1]}))).is_err());
    }

    #[test]
    fn rejects_bad_paths() {
        for bad in [
            "",
            "customerId",
            "/",
            "/a//b",
            "/a/",
            "/\"a b\"",
            "/_ts",
            "/_etag",
        ] {
            assert!(PartitionKeyPath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PartitionKeyPath::parse(&"/a".repeat(MAX_PATH_SEGMENTS + 1)).is_err());
    }

    #[test]
    fn values_of_different_types_never_collide() {
        let all = [
            PartitionKeyValue::Undefined,
            PartitionKeyValue::Null,
            PartitionKeyValue::Bool(false),
            PartitionKeyValue::number(0.0),
            PartitionKeyValue::String("0".into()),
        ];
        for (i, a) in all.iter().enumerate() {
            for (j, b) in all.iter().enumerate() {
                assert_eq!(a == b, i == j);
            }
        }
        assert_eq!(
            PartitionKeyValue::number(-0.0),
            PartitionKeyValue::number(0.0)
        );
    }
}
