//! Proto ↔ domain conversions. Requests are destructured field by field in the service
//! handlers, so a field added to the proto breaks the build until it is handled.

use std::sync::Arc;

use mayfly_proto::{
    json::{JsonDefect, JsonObject, JsonValue},
    v1::{self, oneofs::DefaultTtlState, oneofs::PartitionKeyKind},
};
use serde_json::{Map, Number, Value};

use crate::engine::{
    CollectionId, CollectionInfo, CollectionPath, DatabaseId, DefaultTtl, DocumentBody,
    DocumentView, FeedScope, IdKind, IndexPaths, IndexingMode, InvalidInput, MAX_DEPTH,
    MAX_DOCUMENT_BYTES, Millis, MustLive, MustLiveRule, PartitionKeyValue, ResourceId,
};
use crate::model::Throughput;
use crate::storage::DocKey;

/// The id of a database to create: every rule of today applies.
pub(crate) fn new_database_id(raw: &str) -> Result<DatabaseId, InvalidInput> {
    ResourceId::parse(IdKind::Database, raw)
}

/// The id of a collection to create.
pub(crate) fn new_collection_id(raw: &str) -> Result<CollectionId, InvalidInput> {
    ResourceId::parse(IdKind::Collection, raw)
}

/// The id of an existing database. Ids are named by the rules they were created under: one
/// made by an earlier version (with a control character, say) stays addressable.
pub(crate) fn database_id(raw: &str) -> Result<DatabaseId, InvalidInput> {
    ResourceId::parse_stored(IdKind::Database, raw)
}

pub(crate) fn collection_path(
    database: &str,
    collection: &str,
) -> Result<CollectionPath, InvalidInput> {
    Ok(CollectionPath {
        database: database_id(database)?,
        collection: collection_id(collection)?,
    })
}

/// The id of an existing collection (see [`database_id`]).
pub(crate) fn collection_id(raw: &str) -> Result<CollectionId, InvalidInput> {
    ResourceId::parse_stored(IdKind::Collection, raw)
}

/// A point operation's address: the partition key is required.
pub(crate) fn doc_key(
    id: &str,
    partition_key: Option<v1::PartitionKey>,
) -> Result<DocKey, InvalidInput> {
    let partition_key = partition_key_value(partition_key)?.ok_or(InvalidInput::MissingField {
        field: "partition_key",
        hint: "point operations name the partition: {\"value\": <value>} or {\"undefined\": {}}",
    })?;
    Ok(DocKey {
        partition_key,
        // An existing document's (see [`database_id`]); new ones' ids are checked in their
        // bodies.
        id: ResourceId::parse_stored(IdKind::Document, id)?,
    })
}

/// A feed's or query's scope: one partition if the request names it, else the collection.
pub(crate) fn feed_scope(pk: Option<v1::PartitionKey>) -> Result<FeedScope, InvalidInput> {
    Ok(match partition_key_value(pk)? {
        Some(pk) => FeedScope::Partition(pk),
        None => FeedScope::Collection,
    })
}

/// An optional partition key (create, upsert, feed).
pub(crate) fn partition_key_value(
    pk: Option<v1::PartitionKey>,
) -> Result<Option<PartitionKeyValue>, InvalidInput> {
    let Some(v1::PartitionKey { kind }) = pk else {
        return Ok(None);
    };
    let scalar = |value: JsonValue| -> Result<PartitionKeyValue, InvalidInput> {
        let wrong = |found| InvalidInput::PartitionKeyValueType {
            path: String::new(),
            found,
        };
        let value = match value.into_checked() {
            Ok(value) => value,
            Err(JsonDefect::NonFiniteNumber) => return Err(wrong("NaN or infinite")),
            Err(defect) => return Err(value_defect("the partition_key value", defect)),
        };
        Ok(match value {
            Value::Null => PartitionKeyValue::Null,
            Value::Bool(b) => PartitionKeyValue::Bool(b),
            // Decoded from a finite double: always a finite f64.
            Value::Number(n) => PartitionKeyValue::number(n.as_f64().unwrap_or(0.0)),
            Value::String(s) => PartitionKeyValue::string(&s)?,
            Value::Object(_) => return Err(wrong("an object")),
            Value::Array(_) => return Err(wrong("a list")),
        })
    };
    match kind {
        Some(PartitionKeyKind::Value(value)) => scalar(value).map(Some),
        Some(PartitionKeyKind::Undefined(())) => Ok(Some(PartitionKeyValue::Undefined)),
        None => Err(InvalidInput::MissingField {
            field: "partition_key",
            hint: "set exactly one of {\"value\": <value>} or {\"undefined\": {}}",
        }),
    }
}

/// Why a received JSON value other than a body (`field`: a partition key, a patch value, a
/// query parameter) cannot be used: one depth limit and one reason for every JSON field.
pub(crate) fn value_defect(field: impl Into<String>, defect: JsonDefect) -> InvalidInput {
    match defect {
        JsonDefect::TooDeep => InvalidInput::ValueTooDeep {
            field: field.into(),
            limit: MAX_DEPTH,
        },
        other => InvalidInput::BadJson {
            reason: format!("{}: {}", field.into(), value_defect_reason(&other)),
        },
    }
}

fn value_defect_reason(defect: &JsonDefect) -> &'static str {
    match defect {
        JsonDefect::NonFiniteNumber => {
            "it holds NaN or an infinite number, which JSON cannot represent"
        }
        JsonDefect::InvalidUtf8 => "it holds a string that is not valid UTF-8",
        JsonDefect::TooDeep => "nested too deep",
        JsonDefect::TooLarge { .. } => "too large",
    }
}

pub(crate) fn partition_key_proto(value: &PartitionKeyValue) -> v1::PartitionKey {
    let json = |value: Value| PartitionKeyKind::Value(JsonValue::new(value));
    let kind = match value {
        PartitionKeyValue::Undefined => PartitionKeyKind::Undefined(()),
        PartitionKeyValue::Null => json(Value::Null),
        PartitionKeyValue::Bool(b) => json(Value::Bool(*b)),
        // Partition key numbers are finite (checked on the way in).
        PartitionKeyValue::Number(x) => {
            json(Number::from_f64(*x).map_or(Value::Null, Value::Number))
        }
        PartitionKeyValue::String(s) => json(Value::String(s.to_string())),
    };
    v1::PartitionKey { kind: Some(kind) }
}

/// A request body: present, decodable as JSON, and valid as a document.
pub(crate) fn document_body(
    body: Option<JsonObject>,
    ttl: Option<i64>,
) -> Result<DocumentBody, InvalidInput> {
    let body = body.ok_or(InvalidInput::MissingField {
        field: "body",
        hint: "send the document as a JSON object",
    })?;
    let map: Arc<Map<String, Value>> = body.into_checked().map_err(|defect| match defect {
        JsonDefect::TooDeep => InvalidInput::DocumentTooDeep { limit: MAX_DEPTH },
        JsonDefect::TooLarge { bytes } => InvalidInput::DocumentTooLarge {
            bytes,
            limit: MAX_DOCUMENT_BYTES,
        },
        other => InvalidInput::BadJson {
            reason: other.to_string(),
        },
    })?;
    DocumentBody::parse(map, ttl)
}

pub(crate) fn timestamp(ms: Millis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1_000) as i64,
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

/// A document as the API shows it.
pub(crate) fn document(view: DocumentView) -> v1::Document {
    let DocumentView {
        key,
        body,
        last_write,
        etag,
        ttl,
        expires_at,
        read_at,
    } = view;
    v1::Document {
        id: key.id.to_string(),
        partition_key: Some(partition_key_proto(&key.partition_key)),
        body: Some(JsonObject::from_encoded(body)),
        ts: (last_write / 1_000) as i64,
        etag: etag.to_string(),
        ttl: ttl.map(|t| t.to_raw()),
        expires_at: expires_at.map(timestamp),
        expires_in: expires_at.map(|at| {
            let left = at.saturating_sub(read_at);
            prost_types::Duration {
                seconds: (left / 1_000) as i64,
                nanos: ((left % 1_000) * 1_000_000) as i32,
            }
        }),
        modified_at: Some(timestamp(last_write)),
    }
}

pub(crate) fn indexing_mode(raw: i32) -> Result<Option<IndexingMode>, InvalidInput> {
    match v1::IndexingMode::try_from(raw) {
        Ok(v1::IndexingMode::Unspecified) => Ok(None),
        Ok(v1::IndexingMode::Consistent) => Ok(Some(IndexingMode::Consistent)),
        Ok(v1::IndexingMode::Lazy) => Ok(Some(IndexingMode::Lazy)),
        Ok(v1::IndexingMode::None) => Ok(Some(IndexingMode::None)),
        Err(_) => Err(InvalidInput::UnknownEnumValue {
            field: "indexing_mode",
            value: raw,
        }),
    }
}

/// The replace request's explicit TTL state.
pub(crate) fn default_ttl_change(
    setting: Option<v1::DefaultTtl>,
) -> Result<DefaultTtl, InvalidInput> {
    const HINT: &str = "replacing settings decides the TTL state, so it must be explicit: {\"off\": {}}, {\"seconds\": -1} or {\"seconds\": n}";
    match setting {
        None | Some(v1::DefaultTtl { state: None }) => Err(InvalidInput::MissingField {
            field: "default_ttl",
            hint: HINT,
        }),
        Some(v1::DefaultTtl {
            state: Some(DefaultTtlState::Off(())),
        }) => Ok(DefaultTtl::Off),
        Some(v1::DefaultTtl {
            state: Some(DefaultTtlState::Seconds(n)),
        }) => DefaultTtl::from_raw(Some(n)),
    }
}

/// A collection as the API shows it.
pub(crate) fn collection(info: &CollectionInfo) -> v1::Collection {
    let CollectionInfo {
        database,
        id,
        uid: _,
        partition_key_path,
        settings,
        // Internal: what earlier defaults made final is not a setting a client reads.
        expired: _,
        index_paths,
        index_complete,
        must_live,
    } = info;
    v1::Collection {
        database: database.to_string(),
        id: id.to_string(),
        partition_key_path: partition_key_path.to_string(),
        default_ttl: settings.default_ttl().to_raw(),
        change_feed_retention: i64::from(settings.change_feed_retention().secs()),
        throughput: settings.throughput().map(throughput_proto),
        indexing_mode: match settings.indexing_mode() {
            IndexingMode::Consistent => v1::IndexingMode::Consistent,
            IndexingMode::Lazy => v1::IndexingMode::Lazy,
            IndexingMode::None => v1::IndexingMode::None,
        } as i32,
        indexing_paths: Some(v1::IndexingPaths {
            included_paths: index_paths.included(),
            excluded_paths: index_paths.excluded(),
        }),
        index_complete: *index_complete,
        // Absent when there are none, as a collection without rules was shown before.
        must_live: (!must_live.is_empty()).then(|| v1::MustLive {
            rules: must_live
                .rules()
                .iter()
                .map(|rule| v1::MustLiveRule {
                    path: rule.path().to_owned(),
                    values: rule.values().into_iter().map(JsonValue::new).collect(),
                })
                .collect(),
        }),
    }
}

/// A request's must-live rules (`None` if absent).
pub(crate) fn must_live(
    rules: Option<v1::MustLive>,
) -> Result<Option<Arc<MustLive>>, InvalidInput> {
    let Some(v1::MustLive { rules }) = rules else {
        return Ok(None);
    };
    let rules = rules
        .into_iter()
        .map(|v1::MustLiveRule { path, values }| {
            let values = values
                .into_iter()
                .map(|value| {
                    value.into_checked().map_err(|defect| {
                        value_defect(
                            format!(
                                "a value of the must-live rule for {:?}",
                                crate::model::Echo(&path)
                            ),
                            defect,
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            MustLiveRule::new(&path, &values)
        })
        .collect::<Result<Vec<_>, _>>()?;
    MustLive::new(rules).map(|rules| Some(Arc::new(rules)))
}

/// The paths of a request's indexing policy (`None` if absent).
pub(crate) fn index_paths(
    paths: Option<v1::IndexingPaths>,
) -> Result<Option<std::sync::Arc<IndexPaths>>, InvalidInput> {
    paths
        .map(|p| IndexPaths::new(&p.included_paths, &p.excluded_paths).map(std::sync::Arc::new))
        .transpose()
}

/// A provisioned throughput from a request: absent (unlimited), or exactly one of manual and
/// autoscale, each within its bounds.
pub(crate) fn throughput(
    given: Option<v1::Throughput>,
) -> Result<Option<Throughput>, InvalidInput> {
    let Some(given) = given else {
        return Ok(None);
    };
    match (given.manual, given.autoscale_max) {
        (Some(ru), None) => Throughput::manual("throughput.manual", ru).map(Some),
        (None, Some(max)) => Throughput::autoscale("throughput.autoscale_max", max).map(Some),
        (manual, autoscale) => Err(InvalidInput::Throughput {
            field: "throughput",
            value: format!("{{manual: {manual:?}, autoscale_max: {autoscale:?}}}"),
            rule: "exactly one of manual and autoscale_max".into(),
        }),
    }
}

/// A provisioned throughput as clients read it.
pub(crate) fn throughput_proto(throughput: Throughput) -> v1::Throughput {
    match throughput {
        Throughput::Manual { ru_per_second } => v1::Throughput {
            manual: Some(f64::from(ru_per_second)),
            autoscale_max: None,
        },
        Throughput::Autoscale { max_ru_per_second } => v1::Throughput {
            manual: None,
            autoscale_max: Some(f64::from(max_ru_per_second)),
        },
    }
}
