//! `google.protobuf.Struct` on the wire, a JSON object in memory.
//!
//! Document bodies travel as `google.protobuf.Struct` so that grpcurl and every protobuf JSON
//! mapping show them as plain JSON. This type decodes that wire format straight into a
//! `serde_json` object instead of going through `prost_types::Struct`, for two reasons:
//! - prost's recursion limit (100 message levels) is reached by a Struct nested ~33 JSON levels
//!   deep, and its error becomes an INTERNAL status; Mayfly allows 128 levels and must report a
//!   deeper document as bad input. Decoding here counts JSON levels, stops descending past
//!   [`MAX_DEPTH`] and records a [`JsonDefect`] for the server to reject with a clear message.
//! - a server can keep a document as its encoded bytes ([`JsonObject::from_encoded`]) and send
//!   them as they are, without rebuilding a JSON tree for every read.
//!
//! [`JsonValue`] does the same for `google.protobuf.Value` (patch values, query parameters,
//! partition keys): every JSON-carrying field of a request is decoded here, with one depth
//! limit, [`MAX_DEPTH`], whatever the field.
//!
//! Numbers are doubles on the wire (as in Cosmos DB). Integral values within ±2^53 decode as
//! JSON integers so that typed clients can read them back into integer fields.

use std::{fmt, sync::Arc};

use prost::{
    DecodeError, Message as _,
    bytes::{Buf, BufMut, Bytes},
    encoding::{
        DecodeContext, WireType, check_wire_type, decode_key, decode_varint, encode_key,
        encode_varint, encoded_len_varint, skip_field,
    },
};
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted: the top-level object is level 1, each nested object or array
/// adds one.
pub const MAX_DEPTH: usize = 128;

/// Largest object accepted, in bytes of compact JSON (Cosmos DB's document size limit).
/// Decoding measures each property before building it, so a larger body is rejected without
/// its JSON tree ever being allocated.
pub const MAX_JSON_BYTES: usize = 2 * 1024 * 1024;

/// Largest integer a double represents exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

/// A JSON object carried as `google.protobuf.Struct`.
#[derive(Clone, Default, PartialEq)]
pub struct JsonObject {
    repr: Repr,
    defect: Option<JsonDefect>,
    /// Compact JSON bytes of the properties received so far, braces and commas included.
    received_json_bytes: usize,
}

#[derive(Clone, PartialEq)]
enum Repr {
    /// Decoded: what a received message holds.
    Map(Arc<Map<String, Value>>),
    /// Already encoded as a Struct: what a server sends from storage.
    Encoded(Bytes),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Map(Arc::default())
    }
}

/// Why a decoded object cannot be accepted as a document body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonDefect {
    /// Nested deeper than [`MAX_DEPTH`] levels.
    TooDeep,
    /// A number was NaN or infinite, which JSON cannot represent.
    NonFiniteNumber,
    /// A string or property name was not valid UTF-8.
    InvalidUtf8,
    /// Larger than [`MAX_JSON_BYTES`] of compact JSON, as sent (a property sent twice counts
    /// twice).
    TooLarge {
        /// Compact JSON bytes of the object as sent.
        bytes: usize,
    },
}

impl fmt::Display for JsonDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonDefect::TooDeep => write!(
                f,
                "the document is nested deeper than {MAX_DEPTH} levels; flatten it or move deep parts to another document"
            ),
            JsonDefect::NonFiniteNumber => f.write_str(
                "the document contains NaN or an infinite number, which JSON cannot represent",
            ),
            JsonDefect::InvalidUtf8 => {
                f.write_str("the document contains a string that is not valid UTF-8")
            }
            JsonDefect::TooLarge { bytes } => write!(
                f,
                "the document is {bytes} bytes of JSON; the limit is {MAX_JSON_BYTES} bytes (2 MiB)"
            ),
        }
    }
}

impl std::error::Error for JsonDefect {}

impl JsonObject {
    /// Wraps an object.
    pub fn new(map: Map<String, Value>) -> Self {
        Self::from_arc(Arc::new(map))
    }

    /// Wraps a shared object without copying it.
    pub fn from_arc(map: Arc<Map<String, Value>>) -> Self {
        JsonObject {
            repr: Repr::Map(map),
            defect: None,
            received_json_bytes: 0,
        }
    }

    /// Wraps bytes made by [`encode`]; they are sent as they are.
    pub fn from_encoded(bytes: Bytes) -> Self {
        JsonObject {
            repr: Repr::Encoded(bytes),
            defect: None,
            received_json_bytes: 0,
        }
    }

    /// The object, or why it was rejected while decoding.
    pub fn into_checked(self) -> Result<Arc<Map<String, Value>>, JsonDefect> {
        match self.defect {
            Some(defect) => Err(defect),
            None => Ok(self.into_arc()),
        }
    }

    /// The object, copied out only if it is shared.
    pub fn into_map(self) -> Map<String, Value> {
        Arc::unwrap_or_clone(self.into_arc())
    }

    fn into_arc(self) -> Arc<Map<String, Value>> {
        match self.repr {
            Repr::Map(map) => map,
            Repr::Encoded(bytes) => Arc::new(decode(&bytes)),
        }
    }

    fn map_mut(&mut self) -> &mut Map<String, Value> {
        if let Repr::Encoded(bytes) = &self.repr {
            self.repr = Repr::Map(Arc::new(decode(bytes)));
        }
        match &mut self.repr {
            Repr::Map(map) => Arc::make_mut(map),
            Repr::Encoded(_) => unreachable!("decoded just above"),
        }
    }

    fn note(&mut self, defect: JsonDefect) {
        self.defect.get_or_insert(defect);
    }
}

/// The `google.protobuf.Struct` encoding of an object.
pub fn encode(map: &Map<String, Value>) -> Bytes {
    let mut buf = Vec::with_capacity(struct_len(map));
    encode_struct(map, &mut buf);
    Bytes::from(buf)
}

/// Decodes bytes made by [`encode`]. Bytes that are not a valid encoding (never produced by
/// `encode`) decode to whatever part of them is readable.
pub fn decode(bytes: &[u8]) -> Map<String, Value> {
    // What `encode` made is within the limits: no need to measure it first.
    if let Ok(map) = decode_struct(bytes, 1, &mut None) {
        return map;
    }
    let mut object = JsonObject::default();
    let _ = object.merge(bytes);
    match object.repr {
        Repr::Map(map) => Arc::unwrap_or_clone(map),
        Repr::Encoded(_) => Map::new(),
    }
}

impl fmt::Debug for JsonObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.defect, &self.repr) {
            (Some(defect), _) => write!(f, "JsonObject(rejected: {defect})"),
            (None, Repr::Map(map)) => write!(f, "{}", Value::Object((**map).clone())),
            (None, Repr::Encoded(bytes)) => write!(f, "{}", Value::Object(decode(bytes))),
        }
    }
}

impl From<Map<String, Value>> for JsonObject {
    fn from(map: Map<String, Value>) -> Self {
        JsonObject::new(map)
    }
}

/// A JSON value carried as `google.protobuf.Value`: a patch operation's value, a query
/// parameter, a partition key value.
///
/// prost's own `prost_types::Value` counts each JSON level as two or three message levels
/// against its recursion limit (100), so such a value failed to decode at about 32 levels of
/// objects or 48 of lists, with no reason. This type decodes with Mayfly's limit instead, the
/// one document bodies have: a list or object at the top is level 1, at most [`MAX_DEPTH`]
/// levels. Deeper parts are not descended into (hostile nesting cannot exhaust the stack)
/// but recorded as a [`JsonDefect`], which the server refuses naming the field, as it does
/// NaN or an infinite number. A string that is not UTF-8 fails decoding, as protobuf strings
/// must be UTF-8.
#[derive(Clone, Default, PartialEq)]
pub struct JsonValue {
    value: Value,
    defect: Option<JsonDefect>,
    /// What is sent instead of `value`: the encoding of a prost value that JSON cannot hold
    /// (NaN), so that the receiver refuses it rather than getting a null.
    raw: Option<Bytes>,
}

impl JsonValue {
    /// Wraps a value.
    pub fn new(value: Value) -> Self {
        JsonValue {
            value,
            defect: None,
            raw: None,
        }
    }

    /// The value, or why it was rejected while decoding.
    pub fn into_checked(self) -> Result<Value, JsonDefect> {
        match self.defect {
            Some(defect) => Err(defect),
            None => Ok(self.value),
        }
    }

    /// The value, or why it was rejected while decoding.
    pub fn checked(&self) -> Result<&Value, &JsonDefect> {
        match &self.defect {
            Some(defect) => Err(defect),
            None => Ok(&self.value),
        }
    }
}

impl fmt::Debug for JsonValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.defect {
            Some(defect) => write!(f, "JsonValue(rejected: {defect})"),
            None => write!(f, "{}", self.value),
        }
    }
}

impl From<Value> for JsonValue {
    fn from(value: Value) -> Self {
        JsonValue::new(value)
    }
}

impl From<prost_types::Value> for JsonValue {
    /// A value built with prost's types, checked as a received one is (NaN, depth). One
    /// that is refused is sent as it was built.
    fn from(value: prost_types::Value) -> Self {
        let bytes = Bytes::from(value.encode_to_vec());
        let mut out = JsonValue::default();
        // Its strings are Rust strings, so its encoding always decodes.
        let _ = out.merge(bytes.clone());
        if out.defect.is_some() {
            out.raw = Some(bytes);
        }
        out
    }
}

// Field numbers of google/protobuf/struct.proto.
const STRUCT_FIELDS: u32 = 1;
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;
const VALUE_NULL: u32 = 1;
const VALUE_NUMBER: u32 = 2;
const VALUE_STRING: u32 = 3;
const VALUE_BOOL: u32 = 4;
const VALUE_STRUCT: u32 = 5;
const VALUE_LIST: u32 = 6;
const LIST_VALUES: u32 = 1;

impl prost::Message for JsonObject {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match &self.repr {
            Repr::Map(map) => encode_struct(map, buf),
            Repr::Encoded(bytes) => buf.put_slice(bytes),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != STRUCT_FIELDS {
            return skip_field(wire_type, tag, buf, ctx);
        }
        let bytes = take_delimited(wire_type, buf)?;
        // Measured before it is built: past the limit, nothing more is allocated.
        let entry_json = measure_entry(&bytes, 1)?;
        self.received_json_bytes = if self.received_json_bytes == 0 {
            2 + entry_json // {…}
        } else {
            self.received_json_bytes + 1 + entry_json // ,…
        };
        if self.received_json_bytes > MAX_JSON_BYTES {
            self.defect = Some(JsonDefect::TooLarge {
                bytes: self.received_json_bytes,
            });
            if let Repr::Map(map) = &mut self.repr {
                *map = Arc::default();
            }
            return Ok(());
        }
        let mut defect = None;
        let (key, value) = decode_entry(&bytes, 1, &mut defect)?;
        if let Some(defect) = defect {
            self.note(defect);
        }
        self.map_mut().insert(key, value);
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        match &self.repr {
            Repr::Map(map) => struct_len(map),
            Repr::Encoded(bytes) => bytes.len(),
        }
    }

    fn clear(&mut self) {
        *self = JsonObject::default();
    }
}

impl prost::Message for JsonValue {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match &self.raw {
            Some(raw) => buf.put_slice(raw),
            None => encode_value(&self.value, buf),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        self.raw = None;
        let mut defect = None;
        // Each field is one kind of value; the last one sent wins.
        self.value = match tag {
            VALUE_NULL => {
                check_wire_type(WireType::Varint, wire_type)?;
                decode_varint(buf)?;
                Value::Null
            }
            VALUE_NUMBER => {
                check_wire_type(WireType::SixtyFourBit, wire_type)?;
                if buf.remaining() < 8 {
                    return Err(underflow());
                }
                number(buf.get_f64_le(), &mut defect)
            }
            VALUE_STRING => {
                let bytes = take_delimited(wire_type, buf)?;
                Value::String(string(&bytes, &mut defect))
            }
            VALUE_BOOL => {
                check_wire_type(WireType::Varint, wire_type)?;
                Value::Bool(decode_varint(buf)? != 0)
            }
            VALUE_STRUCT | VALUE_LIST => {
                let bytes = take_delimited(wire_type, buf)?;
                // The top-level value is level 0: a list or struct here is level 1.
                container(tag, &bytes, 0, &mut defect)?
            }
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        if defect == Some(JsonDefect::InvalidUtf8) {
            #[allow(deprecated)]
            return Err(DecodeError::new(
                "google.protobuf.Value: a string is not valid UTF-8",
            ));
        }
        self.defect = defect;
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        match &self.raw {
            Some(raw) => raw.len(),
            None => value_len(&self.value),
        }
    }

    fn clear(&mut self) {
        *self = JsonValue::default();
    }
}

fn underflow() -> DecodeError {
    // prost offers custom Message impls no other way to build this error.
    #[allow(deprecated)]
    DecodeError::new("google.protobuf.Struct: buffer underflow")
}

fn take_delimited(
    wire_type: WireType,
    buf: &mut impl Buf,
) -> Result<prost::bytes::Bytes, DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        return Err(underflow());
    }
    // `len` fits in usize: it is at most `buf.remaining()`.
    Ok(buf.copy_to_bytes(len as usize))
}

fn read_delimited<'a>(wire_type: WireType, buf: &mut &'a [u8]) -> Result<&'a [u8], DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = decode_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(underflow());
    }
    let (head, tail) = buf.split_at(len as usize);
    *buf = tail;
    Ok(head)
}

fn read_string(
    wire_type: WireType,
    buf: &mut &[u8],
    defect: &mut Option<JsonDefect>,
) -> Result<String, DecodeError> {
    let bytes = read_delimited(wire_type, buf)?;
    Ok(string(bytes, defect))
}

fn string(bytes: &[u8], defect: &mut Option<JsonDefect>) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            defect.get_or_insert(JsonDefect::InvalidUtf8);
            String::from_utf8_lossy(bytes).into_owned()
        }
    }
}

/// One `fields` map entry of a Struct that sits at nesting level `depth`.
fn decode_entry(
    mut buf: &[u8],
    depth: usize,
    defect: &mut Option<JsonDefect>,
) -> Result<(String, Value), DecodeError> {
    let mut key = String::new();
    let mut value = Value::Null;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            ENTRY_KEY => key = read_string(wire_type, &mut buf, defect)?,
            ENTRY_VALUE => {
                value = decode_value(read_delimited(wire_type, &mut buf)?, depth, defect)?
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    Ok((key, value))
}

/// A Value held by a container at nesting level `depth`.
fn decode_value(
    mut buf: &[u8],
    depth: usize,
    defect: &mut Option<JsonDefect>,
) -> Result<Value, DecodeError> {
    // A Value without any kind set is treated as null, as protobuf's JSON mapping does.
    let mut value = Value::Null;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        value = match tag {
            VALUE_NULL => {
                check_wire_type(WireType::Varint, wire_type)?;
                decode_varint(&mut buf)?;
                Value::Null
            }
            VALUE_NUMBER => {
                check_wire_type(WireType::SixtyFourBit, wire_type)?;
                if buf.len() < 8 {
                    return Err(underflow());
                }
                number(buf.get_f64_le(), defect)
            }
            VALUE_STRING => Value::String(read_string(wire_type, &mut buf, defect)?),
            VALUE_BOOL => {
                check_wire_type(WireType::Varint, wire_type)?;
                Value::Bool(decode_varint(&mut buf)? != 0)
            }
            VALUE_STRUCT | VALUE_LIST => {
                container(tag, read_delimited(wire_type, &mut buf)?, depth, defect)?
            }
            _ => {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                continue;
            }
        };
    }
    Ok(value)
}

/// The Struct (`tag` 5) or ListValue (6) `inner` of a Value held at nesting level `depth`.
fn container(
    tag: u32,
    inner: &[u8],
    depth: usize,
    defect: &mut Option<JsonDefect>,
) -> Result<Value, DecodeError> {
    Ok(if depth + 1 > MAX_DEPTH {
        // Not descending is what keeps hostile input from exhausting the stack.
        defect.get_or_insert(JsonDefect::TooDeep);
        Value::Null
    } else if tag == VALUE_STRUCT {
        Value::Object(decode_struct(inner, depth + 1, defect)?)
    } else {
        Value::Array(decode_list(inner, depth + 1, defect)?)
    })
}

fn decode_struct(
    mut buf: &[u8],
    depth: usize,
    defect: &mut Option<JsonDefect>,
) -> Result<Map<String, Value>, DecodeError> {
    let mut map = Map::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag == STRUCT_FIELDS {
            let (key, value) = decode_entry(read_delimited(wire_type, &mut buf)?, depth, defect)?;
            map.insert(key, value);
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
        }
    }
    Ok(map)
}

fn decode_list(
    mut buf: &[u8],
    depth: usize,
    defect: &mut Option<JsonDefect>,
) -> Result<Vec<Value>, DecodeError> {
    let mut values = Vec::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag == LIST_VALUES {
            values.push(decode_value(
                read_delimited(wire_type, &mut buf)?,
                depth,
                defect,
            )?);
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
        }
    }
    Ok(values)
}

fn number(x: f64, defect: &mut Option<JsonDefect>) -> Value {
    if !x.is_finite() {
        defect.get_or_insert(JsonDefect::NonFiniteNumber);
        return Value::Null;
    }
    if x.fract() == 0.0 && x.abs() <= MAX_SAFE_INTEGER {
        // Exact: |x| <= 2^53 and integral.
        Value::Number(Number::from(x as i64))
    } else {
        // Finite, so from_f64 succeeds; Null is unreachable.
        Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// Compact JSON bytes of one `fields` entry (`"key":value`) of a Struct at nesting level
/// `depth`, read from its encoding without building it. Matches what serde_json writes for the
/// decoded value; past [`MAX_DEPTH`] it stops descending (decoding rejects such a body).
fn measure_entry(mut buf: &[u8], depth: usize) -> Result<usize, DecodeError> {
    let mut key = 2; // ""
    let mut value = 4; // null
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            ENTRY_KEY => key = json_string_len(read_delimited(wire_type, &mut buf)?),
            ENTRY_VALUE => value = measure_value(read_delimited(wire_type, &mut buf)?, depth)?,
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(key + 1 + value)
}

fn measure_value(mut buf: &[u8], depth: usize) -> Result<usize, DecodeError> {
    let mut len = 4; // a Value with no kind is null
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        len = match tag {
            VALUE_NULL => {
                check_wire_type(WireType::Varint, wire_type)?;
                decode_varint(&mut buf)?;
                4
            }
            VALUE_NUMBER => {
                check_wire_type(WireType::SixtyFourBit, wire_type)?;
                if buf.len() < 8 {
                    return Err(underflow());
                }
                let mut ignored = None;
                compact_len(&number(buf.get_f64_le(), &mut ignored))
            }
            VALUE_STRING => json_string_len(read_delimited(wire_type, &mut buf)?),
            VALUE_BOOL => {
                check_wire_type(WireType::Varint, wire_type)?;
                if decode_varint(&mut buf)? != 0 { 4 } else { 5 }
            }
            VALUE_STRUCT | VALUE_LIST => {
                let mut inner = read_delimited(wire_type, &mut buf)?;
                if depth + 1 > MAX_DEPTH {
                    // Not descending bounds the work; decoding flags the body as too deep.
                    2
                } else {
                    let mut items = 0;
                    let mut len = 2; // {} or []
                    // Struct.fields and ListValue.values are both field 1.
                    let object = tag == VALUE_STRUCT;
                    while !inner.is_empty() {
                        let (item_tag, wire_type) = decode_key(&mut inner)?;
                        if item_tag != STRUCT_FIELDS {
                            skip_field(wire_type, item_tag, &mut inner, DecodeContext::default())?;
                            continue;
                        }
                        let item = read_delimited(wire_type, &mut inner)?;
                        len += if object {
                            measure_entry(item, depth + 1)?
                        } else {
                            measure_value(item, depth + 1)?
                        };
                        items += 1;
                    }
                    len + items.max(1) - 1 // commas
                }
            }
            _ => {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                continue;
            }
        };
    }
    Ok(len)
}

/// Bytes serde_json writes for a string: quotes, two-character escapes for `"`, backslash,
/// backspace, form feed, newline, carriage return and tab, six (`\u00XX`) for other control
/// characters.
fn json_string_len(bytes: &[u8]) -> usize {
    2 + bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Bytes of a scalar's compact JSON, written to a counter (no allocation).
fn compact_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a number to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

fn delimited_len(tag_len: usize, len: usize) -> usize {
    tag_len + encoded_len_varint(len as u64) + len
}

fn struct_len(map: &Map<String, Value>) -> usize {
    map.iter()
        .map(|(k, v)| delimited_len(1, entry_len(k, v)))
        .sum()
}

fn entry_len(key: &str, value: &Value) -> usize {
    delimited_len(1, key.len()) + delimited_len(1, value_len(value))
}

fn list_len(values: &[Value]) -> usize {
    values.iter().map(|v| delimited_len(1, value_len(v))).sum()
}

fn value_len(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 2,
        Value::Number(_) => 9,
        Value::String(s) => delimited_len(1, s.len()),
        Value::Object(map) => delimited_len(1, struct_len(map)),
        Value::Array(values) => delimited_len(1, list_len(values)),
    }
}

fn encode_struct(map: &Map<String, Value>, buf: &mut impl BufMut) {
    for (key, value) in map {
        encode_key(STRUCT_FIELDS, WireType::LengthDelimited, buf);
        encode_varint(entry_len(key, value) as u64, buf);
        encode_key(ENTRY_KEY, WireType::LengthDelimited, buf);
        encode_varint(key.len() as u64, buf);
        buf.put_slice(key.as_bytes());
        encode_key(ENTRY_VALUE, WireType::LengthDelimited, buf);
        encode_varint(value_len(value) as u64, buf);
        encode_value(value, buf);
    }
}

fn encode_value(value: &Value, buf: &mut impl BufMut) {
    match value {
        Value::Null => {
            encode_key(VALUE_NULL, WireType::Varint, buf);
            encode_varint(0, buf);
        }
        Value::Bool(b) => {
            encode_key(VALUE_BOOL, WireType::Varint, buf);
            encode_varint(u64::from(*b), buf);
        }
        Value::Number(n) => {
            encode_key(VALUE_NUMBER, WireType::SixtyFourBit, buf);
            // Every serde_json number converts to f64 (large integers lose precision, as JSON
            // numbers do in Cosmos DB).
            buf.put_f64_le(n.as_f64().unwrap_or(0.0));
        }
        Value::String(s) => {
            encode_key(VALUE_STRING, WireType::LengthDelimited, buf);
            encode_varint(s.len() as u64, buf);
            buf.put_slice(s.as_bytes());
        }
        Value::Object(map) => {
            encode_key(VALUE_STRUCT, WireType::LengthDelimited, buf);
            encode_varint(struct_len(map) as u64, buf);
            encode_struct(map, buf);
        }
        Value::Array(values) => {
            encode_key(VALUE_LIST, WireType::LengthDelimited, buf);
            encode_varint(list_len(values) as u64, buf);
            for v in values {
                encode_key(LIST_VALUES, WireType::LengthDelimited, buf);
                encode_varint(value_len(v) as u64, buf);
                encode_value(v, buf);
            }
        }
    }
}

/// Encodes `value` as the `google.protobuf.Value` field `tag`.
pub fn encode_value_field(tag: u32, value: &Value, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value_len(value) as u64, buf);
    encode_value(value, buf);
}

/// Encoded length of [`encode_value_field`]'s output.
pub fn value_field_len(tag: u32, value: &Value) -> usize {
    delimited_len(prost::encoding::key_len(tag), value_len(value))
}

/// Decodes one `google.protobuf.Value` field into JSON. A value nested deeper than
/// [`MAX_DEPTH`], a NaN or infinite number, or a string that is not UTF-8 is an error.
pub fn decode_value_field(wire_type: WireType, buf: &mut impl Buf) -> Result<Value, DecodeError> {
    let bytes = take_delimited(wire_type, buf)?;
    let mut defect = None;
    // A list or struct at the top is level 1, as a document body is.
    let value = decode_value(&bytes, 0, &mut defect)?;
    match defect {
        None => Ok(value),
        #[allow(deprecated)]
        Some(defect) => Err(DecodeError::new(format!("google.protobuf.Value: {defect}"))),
    }
}

/// A JSON value as a `google.protobuf.Value` (query results travel so, and grpcurl shows them
/// as JSON).
pub fn to_proto_value(value: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_proto_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), to_proto_value(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A `google.protobuf.Value` a client sent (a query parameter) as JSON: at most
/// [`MAX_DEPTH`] levels, finite numbers. An unset value is `null`.
pub fn from_proto_value(value: prost_types::Value) -> Result<Value, JsonDefect> {
    /// `depth`: the level a list or struct here would be; scalars add no level (as in
    /// [`MAX_DEPTH`] and the Struct decoder).
    fn convert(value: prost_types::Value, depth: usize) -> Result<Value, JsonDefect> {
        use prost_types::value::Kind;
        if depth > MAX_DEPTH
            && matches!(value.kind, Some(Kind::ListValue(_) | Kind::StructValue(_)))
        {
            return Err(JsonDefect::TooDeep);
        }
        Ok(match value.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::BoolValue(b)) => Value::Bool(b),
            Some(Kind::NumberValue(x)) => {
                let mut defect = None;
                let v = number(x, &mut defect);
                if let Some(d) = defect {
                    return Err(d);
                }
                v
            }
            Some(Kind::StringValue(s)) => Value::String(s),
            Some(Kind::ListValue(list)) => Value::Array(
                list.values
                    .into_iter()
                    .map(|v| convert(v, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Some(Kind::StructValue(s)) => Value::Object(
                s.fields
                    .into_iter()
                    .map(|(k, v)| Ok((k, convert(v, depth + 1)?)))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
    convert(value, 1)
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use serde_json::json;

    use super::*;

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn nested(depth: usize) -> Map<String, Value> {
        // depth 1 is {"leaf": 1}; each extra level wraps it in {"a": ...}.
        let mut v = json!({"leaf": 1});
        for _ in 1..depth {
            v = json!({ "a": v });
        }
        object(v)
    }

    #[test]
    fn round_trips_through_prost_types_struct() {
        let doc = object(json!({
            "id": "a", "n": 3, "f": 1.5, "neg": -7, "t": true, "z": null,
            "list": [1, "two", {"three": [3.25]}], "obj": {"k": "v"}
        }));
        let bytes = JsonObject::new(doc.clone()).encode_to_vec();
        // The wire format is the real google.protobuf.Struct.
        let st = prost_types::Struct::decode(bytes.as_slice()).expect("decodes as Struct");
        assert_eq!(st.fields.len(), doc.len());
        let back = JsonObject::decode(st.encode_to_vec().as_slice()).expect("decodes back");
        assert_eq!(back.into_checked().expect("no defect").as_ref(), &doc);
    }

    #[test]
    fn integral_doubles_decode_as_integers() {
        let back = JsonObject::decode(
            JsonObject::new(object(json!({"ttl": 60})))
                .encode_to_vec()
                .as_slice(),
        )
        .expect("decodes");
        let map = back.into_map();
        assert_eq!(map["ttl"], json!(60));
        assert!(map["ttl"].is_i64());
    }

    #[test]
    fn accepts_exactly_max_depth_and_flags_one_more() {
        let ok = JsonObject::decode(
            JsonObject::new(nested(MAX_DEPTH))
                .encode_to_vec()
                .as_slice(),
        )
        .expect("decodes");
        assert_eq!(
            ok.clone()
                .into_checked()
                .expect("128 levels are fine")
                .as_ref(),
            &nested(MAX_DEPTH)
        );
        let deep = JsonObject::decode(
            JsonObject::new(nested(MAX_DEPTH + 1))
                .encode_to_vec()
                .as_slice(),
        )
        .expect("decodes without error");
        assert_eq!(deep.into_checked(), Err(JsonDefect::TooDeep));
    }

    /// Regression: a scalar inside the 128th level counted as level 129, so a value as deep
    /// as a document may be was refused (found by the `json_decoder` fuzz target).
    #[test]
    fn proto_values_accept_exactly_max_depth_levels() {
        let ok = Value::Object(nested(MAX_DEPTH));
        assert_eq!(from_proto_value(to_proto_value(&ok)), Ok(ok));
        let deep = Value::Object(nested(MAX_DEPTH + 1));
        assert_eq!(
            from_proto_value(to_proto_value(&deep)),
            Err(JsonDefect::TooDeep)
        );
        let empty_leaf = json!([[]]);
        assert_eq!(
            from_proto_value(to_proto_value(&empty_leaf)),
            Ok(empty_leaf)
        );
    }

    #[test]
    fn hostile_depth_does_not_exhaust_the_stack() {
        // {"x": [[[[...]]]]} one million lists deep: far beyond what recursion on a thread
        // stack survives. Lengths are computed inside out, bytes written outside in.
        const LEVELS: usize = 1_000_000;
        let mut value_lens = vec![0usize; LEVELS + 1]; // value_lens[0]: an empty (null) Value
        let mut list_lens = vec![0usize; LEVELS + 1];
        for i in 1..=LEVELS {
            list_lens[i] = delimited_len(1, value_lens[i - 1]);
            value_lens[i] = delimited_len(1, list_lens[i]);
        }
        let mut value = Vec::with_capacity(value_lens[LEVELS]);
        for i in (1..=LEVELS).rev() {
            encode_key(VALUE_LIST, WireType::LengthDelimited, &mut value);
            encode_varint(list_lens[i] as u64, &mut value);
            encode_key(LIST_VALUES, WireType::LengthDelimited, &mut value);
            encode_varint(value_lens[i - 1] as u64, &mut value);
        }
        let mut entry = Vec::new();
        encode_key(ENTRY_KEY, WireType::LengthDelimited, &mut entry);
        encode_varint(1, &mut entry);
        entry.push(b'x');
        encode_key(ENTRY_VALUE, WireType::LengthDelimited, &mut entry);
        encode_varint(value.len() as u64, &mut entry);
        entry.extend_from_slice(&value);
        let mut st = Vec::new();
        encode_key(STRUCT_FIELDS, WireType::LengthDelimited, &mut st);
        encode_varint(entry.len() as u64, &mut st);
        st.extend_from_slice(&entry);
        let decoded = JsonObject::decode(st.as_slice()).expect("decodes");
        assert_eq!(decoded.into_checked(), Err(JsonDefect::TooDeep));
    }

    /// `depth` levels of lists (`[[...[1]...]]`) or of objects (`{"a": {"a": ... 1}}`).
    #[test]
    fn json_values_travel_as_google_protobuf_value() {
        for value in [
            json!(null),
            json!(true),
            json!(-7),
            json!(2.5),
            json!("text"),
            json!([1, "two", {"three": [3.25, null]}]),
            json!({"k": "v", "n": 9007199254740992_i64}),
        ] {
            let ours = JsonValue::new(value.clone());
            let theirs = to_proto_value(&value);
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec(), "{value}");
            assert_eq!(ours.encoded_len(), theirs.encoded_len(), "{value}");
            let back = JsonValue::decode(theirs.encode_to_vec().as_slice()).expect("decodes");
            assert_eq!(back.checked(), Ok(&value));
            assert_eq!(JsonValue::from(theirs), ours);
        }
        // An empty Value (no kind set) is null, as in protobuf's JSON mapping.
        assert_eq!(
            JsonValue::decode(&[][..]).expect("decodes").into_checked(),
            Ok(Value::Null)
        );
        let nan = prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
        };
        let nan_bytes = nan.encode_to_vec();
        let ours = JsonValue::from(nan);
        assert_eq!(
            ours.encode_to_vec(),
            nan_bytes,
            "sent as built, for the receiver to refuse"
        );
        assert_eq!(ours.into_checked(), Err(JsonDefect::NonFiniteNumber));
        // A string that is not UTF-8 does not decode (protobuf strings are UTF-8).
        let mut bad = Vec::new();
        encode_key(VALUE_LIST, WireType::LengthDelimited, &mut bad);
        encode_varint(5, &mut bad);
        encode_key(LIST_VALUES, WireType::LengthDelimited, &mut bad);
        encode_varint(3, &mut bad);
        bad.extend_from_slice(&[(VALUE_STRING << 3 | 2) as u8, 1, 0xff]);
        let err = JsonValue::decode(bad.as_slice()).expect_err("refused");
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    }

    #[test]
    fn a_hostile_deep_value_does_not_exhaust_the_stack() {
        // Value.list_value holding one Value, a million levels deep: lengths computed inside
        // out, bytes written outside in.
        const LEVELS: usize = 1_000_000;
        let mut value_lens = vec![0usize; LEVELS + 1]; // value_lens[0]: an empty (null) Value
        let mut list_lens = vec![0usize; LEVELS + 1];
        for i in 1..=LEVELS {
            list_lens[i] = delimited_len(1, value_lens[i - 1]);
            value_lens[i] = delimited_len(1, list_lens[i]);
        }
        let mut bytes = Vec::with_capacity(value_lens[LEVELS]);
        for i in (1..=LEVELS).rev() {
            encode_key(VALUE_LIST, WireType::LengthDelimited, &mut bytes);
            encode_varint(list_lens[i] as u64, &mut bytes);
            encode_key(LIST_VALUES, WireType::LengthDelimited, &mut bytes);
            encode_varint(value_lens[i - 1] as u64, &mut bytes);
        }
        let decoded = std::thread::Builder::new()
            .stack_size(1536 * 1024)
            .spawn(move || JsonValue::decode(bytes.as_slice()).map(JsonValue::into_checked))
            .expect("spawns")
            .join()
            .expect("no stack overflow");
        assert_eq!(decoded.expect("decodes"), Err(JsonDefect::TooDeep));
    }

    #[test]
    fn non_finite_numbers_are_flagged() {
        let st = prost_types::Struct {
            fields: [(
                "x".to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
                },
            )]
            .into(),
        };
        let decoded = JsonObject::decode(st.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(decoded.into_checked(), Err(JsonDefect::NonFiniteNumber));
    }

    #[test]
    fn encoded_bodies_are_sent_byte_for_byte() {
        let doc = object(json!({"id": "a", "nested": {"list": [1, "x", null]}}));
        let bytes = encode(&doc);
        let pre = JsonObject::from_encoded(bytes.clone());
        assert_eq!(pre.encoded_len(), bytes.len());
        assert_eq!(
            pre.encode_to_vec(),
            JsonObject::new(doc.clone()).encode_to_vec()
        );
        assert_eq!(decode(&bytes), doc);
        assert_eq!(pre.into_map(), doc);
    }

    #[test]
    fn measured_sizes_match_what_serde_json_writes() {
        let docs = [
            json!({}),
            json!({"id": "a"}),
            json!({"id": "q\"b\\s\n\t\r\u{8}\u{c}\u{1}\u{1f}\u{7f}é😀", "": ""}),
            json!({"n": [0, -0.0, 1.5, -7, 1e21, 1e-7, 0.1, 9007199254740993.0, 123456789012.0]}),
            json!({"t": true, "f": false, "z": null, "e": {}, "l": [], "ll": [[], [{}], [null, 1]]}),
            json!({"deep": {"a": {"b": [1, {"c": "d"}]}}, "x": "y"}),
        ];
        for doc in docs {
            let map = object(doc);
            let bytes = JsonObject::new(map.clone()).encode_to_vec();
            let mut decoded = JsonObject::decode(bytes.as_slice()).expect("decodes");
            let expected = serde_json::to_vec(&decoded.map_mut().clone())
                .expect("writes")
                .len();
            let measured = if map.is_empty() {
                2
            } else {
                decoded.received_json_bytes
            };
            assert_eq!(measured, expected, "{map:?}");
        }
    }

    /// Regression: a 16 MiB body used to be decoded into a JSON tree (100+ MiB) before the
    /// 2 MiB check rejected it. Past the limit nothing more is built.
    #[test]
    fn an_oversize_body_is_flagged_without_building_it() {
        let chunk = "x".repeat(64 * 1024);
        let mut map = Map::new();
        for i in 0..48 {
            map.insert(format!("p{i}"), Value::String(chunk.clone())); // 3 MiB in all
        }
        let bytes = JsonObject::new(map.clone()).encode_to_vec();
        let decoded = JsonObject::decode(bytes.as_slice()).expect("decodes");
        let expected = serde_json::to_vec(&map).expect("writes").len();
        assert!(
            matches!(&decoded.repr, Repr::Map(m) if m.is_empty()),
            "nothing kept"
        );
        assert_eq!(
            decoded.into_checked(),
            Err(JsonDefect::TooLarge { bytes: expected })
        );

        // Exactly at the limit is accepted.
        let pad = MAX_JSON_BYTES - r#"{"id":"a","p":""}"#.len();
        let at_limit = object(json!({"id": "a", "p": "y".repeat(pad)}));
        let decoded =
            JsonObject::decode(JsonObject::new(at_limit.clone()).encode_to_vec().as_slice())
                .expect("decodes");
        assert_eq!(decoded.into_checked().expect("fits").as_ref(), &at_limit);
    }

    #[test]
    fn truncated_input_is_a_decode_error() {
        let bytes = JsonObject::new(object(json!({"id": "abc", "n": 1}))).encode_to_vec();
        assert!(JsonObject::decode(&bytes[..bytes.len() - 3]).is_err());
    }
}
