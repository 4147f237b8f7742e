//! The catalog keyspace: databases, collections and counters, as small records.
//!
//! Keys: `db/<database id>` (its uid, u64 BE; empty in records written before databases had
//! uids, which opening the directory gives one), `coll/<uid, u64 BE>` (a JSON record: readable
//! with any tool and open to new fields), `last-uid` (the highest uid handed out, of a
//! collection or a database) and `shards` (u64 BE), `versions/<shard>` and
//! `versions/catalog` (u64 BE: the version floors recorded with deletions).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::model::{
    CollectionId, CollectionInfo, CollectionSettings, CollectionUid, DatabaseId, DatabaseUid,
    DefaultTtl, ExpiredThrough, FeedRetention, IdKind, IndexPaths, IndexingMode, MustLive,
    MustLiveRule, PartitionKeyPath, Throughput,
};
use crate::storage::{StorageError, TERMS_LAYOUT};

pub(super) const DATABASE_PREFIX: &[u8] = b"db/";
pub(super) const COLLECTION_PREFIX: &[u8] = b"coll/";
pub(super) const LAST_UID: &[u8] = b"last-uid";
pub(super) const SHARDS: &[u8] = b"shards";
pub(super) const VERSIONS_PREFIX: &[u8] = b"versions/";
/// The version floor recorded with collection and database deletions (under the prefix, so
/// recovery reads it with the shards' floors).
pub(super) const CATALOG_VERSIONS: &[u8] = b"versions/catalog";

pub(super) fn database_key(id: &DatabaseId) -> Vec<u8> {
    [DATABASE_PREFIX, id.as_str().as_bytes()].concat()
}

pub(super) fn collection_key(uid: CollectionUid) -> Vec<u8> {
    [COLLECTION_PREFIX, &uid.0.to_be_bytes()].concat()
}

/// Where a shard's highest change log position is kept, written with every batch that appends.
pub(super) const LOG_SEQ_PREFIX: &[u8] = b"log-seq/";

pub(super) fn log_seq_key(shard: u16) -> Vec<u8> {
    [LOG_SEQ_PREFIX, &shard.to_be_bytes()].concat()
}

pub(super) const LOG_FLOOR_PREFIX: &[u8] = b"log-floor/";

/// Where a collection's change log floor in a shard is kept (see `ChangeLog::log_floor`).
pub(super) fn log_floor_key(shard: u16, uid: CollectionUid) -> Vec<u8> {
    [LOG_FLOOR_PREFIX, &shard.to_be_bytes(), &uid.0.to_be_bytes()].concat()
}

/// Where a value the node keeps beside its documents is (see `Storage::node_state`).
pub(super) fn node_state_key(key: &str) -> Vec<u8> {
    [b"node/", key.as_bytes()].concat()
}

pub(super) fn versions_key(shard: u16) -> Vec<u8> {
    [VERSIONS_PREFIX, &shard.to_be_bytes()].concat()
}

pub(super) fn decode_u64(value: &[u8], what: &str) -> Result<u64, StorageError> {
    value
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StorageError::new(format!("corrupt {what} in the data directory")))
}

/// The value of a database's record: its uid, then, if its collections share a throughput, a
/// JSON object `{"throughput": ...}` (as a collection record's).
pub(super) fn encode_database(uid: DatabaseUid, throughput: Option<Throughput>) -> Vec<u8> {
    let mut value = uid.0.to_be_bytes().to_vec();
    if throughput.is_some() {
        let record = json!({ "throughput": encode_throughput(throughput) });
        value.extend_from_slice(record.to_string().as_bytes());
    }
    value
}

/// A database record: its id, its uid unless the record predates them (an empty value), and
/// the throughput its collections share.
pub(super) fn decode_database(
    key: &[u8],
    value: &[u8],
) -> Result<(DatabaseId, Option<DatabaseUid>, Option<Throughput>), StorageError> {
    let corrupt = || StorageError::new("corrupt database record in the data directory");
    let id = key
        .strip_prefix(DATABASE_PREFIX)
        .and_then(|id| std::str::from_utf8(id).ok())
        .and_then(|id| DatabaseId::parse_stored(IdKind::Database, id).ok())
        .ok_or_else(corrupt)?;
    if value.is_empty() {
        return Ok((id, None, None));
    }
    let (uid, rest) = value.split_first_chunk::<8>().ok_or_else(corrupt)?;
    let uid = DatabaseUid(u64::from_be_bytes(*uid));
    let throughput = if rest.is_empty() {
        None
    } else {
        // Written only with a throughput: anything else after the uid is damage.
        let record: Value = serde_json::from_slice(rest).map_err(|_| corrupt())?;
        match decode_throughput(&record["throughput"]) {
            Some(Some(throughput)) if record.is_object() => Some(throughput),
            _ => return Err(corrupt()),
        }
    };
    Ok((id, Some(uid), throughput))
}

pub(super) fn encode_collection(info: &CollectionInfo) -> Vec<u8> {
    let record = json!({
        "database": info.database.as_str(),
        "id": info.id.as_str(),
        "uid": info.uid.0,
        "partitionKeyPath": info.partition_key_path.as_str(),
        "defaultTtl": info.settings.default_ttl().to_raw(),
        "indexingMode": match info.settings.indexing_mode() {
            IndexingMode::Consistent => "consistent",
            IndexingMode::Lazy => "lazy",
            IndexingMode::None => "none",
        },
        "expiredThrough": {
            "inheritedWrittenBy": info.expired.inherited_written_by,
            "ownExpiredBy": info.expired.own_expired_by,
            "defaultSince": info.expired.default_since,
        },
        "indexingPolicy": {
            "includedPaths": info.index_paths.included(),
            "excludedPaths": info.index_paths.excluded(),
            "complete": info.index_complete,
            "termsLayout": TERMS_LAYOUT,
        },
        "changeFeedRetention": info.settings.change_feed_retention().secs(),
        "changeFeedSince": info.settings.change_feed_since(),
        "throughput": encode_throughput(info.settings.throughput()),
        "mustLive": info.must_live.rules().iter().map(|rule| json!({
            "path": rule.path(),
            "values": rule.values(),
        })).collect::<Vec<_>>(),
    });
    record.to_string().into_bytes()
}

/// A throughput as collection and database records hold it.
fn encode_throughput(throughput: Option<Throughput>) -> Value {
    match throughput {
        None => Value::Null,
        Some(Throughput::Manual { ru_per_second }) => json!({"manual": ru_per_second}),
        Some(Throughput::Autoscale { max_ru_per_second }) => {
            json!({"autoscaleMax": max_ru_per_second})
        }
    }
}

/// A collection record's throughput: absent (unlimited, and every record written before
/// throughput existed), or one of the two kinds; `None` if it is neither.
fn decode_throughput(value: &Value) -> Option<Option<Throughput>> {
    // Held to the rules a request is: a damaged value is not a budget that admits nothing.
    let ru = |field: &str| value[field].as_u64().map(|v| v as f64);
    match value {
        Value::Null => Some(None),
        _ => match (ru("manual"), ru("autoscaleMax")) {
            (Some(ru), None) => Throughput::manual("throughput", ru).ok().map(Some),
            (None, Some(max)) => Throughput::autoscale("throughput", max).ok().map(Some),
            _ => None,
        },
    }
}

pub(super) fn decode_collection(value: &[u8]) -> Result<CollectionInfo, StorageError> {
    let bad = |what: &str| StorageError::new(format!("corrupt collection record: {what}"));
    let record: Value = serde_json::from_slice(value).map_err(|e| bad(&e.to_string()))?;
    let text = |field: &str| record[field].as_str().ok_or_else(|| bad(field));
    let database = DatabaseId::parse_stored(IdKind::Database, text("database")?)
        .map_err(|_| bad("database"))?;
    let id = CollectionId::parse_stored(IdKind::Collection, text("id")?).map_err(|_| bad("id"))?;
    let uid = record["uid"].as_u64().ok_or_else(|| bad("uid"))?;
    let partition_key_path =
        PartitionKeyPath::parse(text("partitionKeyPath")?).map_err(|_| bad("partitionKeyPath"))?;
    let default_ttl =
        DefaultTtl::from_raw(record["defaultTtl"].as_i64()).map_err(|_| bad("defaultTtl"))?;
    let indexing_mode = match text("indexingMode")? {
        "consistent" => IndexingMode::Consistent,
        "lazy" => IndexingMode::Lazy,
        "none" => IndexingMode::None,
        _ => return Err(bad("indexingMode")),
    };
    // Absent in records written before the change feed existed: the default.
    let retention = match &record["changeFeedRetention"] {
        Value::Null => FeedRetention::DEFAULT,
        v => v
            .as_i64()
            .and_then(|secs| FeedRetention::from_secs(secs).ok())
            .ok_or_else(|| bad("changeFeedRetention"))?,
    };
    let settings = CollectionSettings::new(default_ttl, indexing_mode)
        .map_err(|_| bad("settings"))?
        .with_change_feed_retention(retention)
        .with_change_feed_since(record["changeFeedSince"].as_u64().unwrap_or(0))
        .with_throughput(
            decode_throughput(&record["throughput"]).ok_or_else(|| bad("throughput"))?,
        );
    // Absent in records written before expired marks existed: nothing was marked then.
    let marks = &record["expiredThrough"];
    let mark = |field: &str| match &marks[field] {
        Value::Null => Ok(0),
        v => v.as_u64().ok_or_else(|| bad(field)),
    };
    let expired = ExpiredThrough {
        inherited_written_by: mark("inheritedWrittenBy")?,
        own_expired_by: mark("ownExpiredBy")?,
        // Absent in records written before the change feed: expiry instants then are only
        // reported, never relied on, so "since creation" is safe.
        default_since: mark("defaultSince")?,
    };
    // Absent in records written before indexes existed: those collections have documents
    // without index entries, so their index is incomplete until rebuilt.
    let policy = &record["indexingPolicy"];
    let (index_paths, index_complete) = if policy.is_null() {
        (IndexPaths::default(), indexing_mode == IndexingMode::None)
    } else {
        let list = |field: &str| -> Result<Vec<String>, StorageError> {
            policy[field]
                .as_array()
                .ok_or_else(|| bad(field))?
                .iter()
                .map(|p| p.as_str().map(str::to_owned).ok_or_else(|| bad(field)))
                .collect()
        };
        let paths = IndexPaths::new(&list("includedPaths")?, &list("excludedPaths")?)
            .map_err(|_| bad("indexingPolicy"))?;
        let complete = policy["complete"]
            .as_bool()
            .ok_or_else(|| bad("complete"))?;
        // Entries written in an older layout of terms are made again: the index is
        // incomplete (and not read by `consistent` queries) until the rebuild is done.
        let current = policy["termsLayout"].as_u64() == Some(TERMS_LAYOUT);
        (
            paths,
            complete && (current || indexing_mode == IndexingMode::None),
        )
    };
    // Absent in records written before must-live rules existed: none.
    let must_live = match &record["mustLive"] {
        Value::Null => MustLive::default(),
        Value::Array(rules) => MustLive::new(
            rules
                .iter()
                .map(|rule| {
                    let path = rule["path"].as_str().ok_or_else(|| bad("mustLive"))?;
                    let values = rule["values"].as_array().ok_or_else(|| bad("mustLive"))?;
                    MustLiveRule::new(path, values).map_err(|_| bad("mustLive"))
                })
                .collect::<Result<_, _>>()?,
        )
        .map_err(|_| bad("mustLive"))?,
        _ => return Err(bad("mustLive")),
    };
    Ok(CollectionInfo {
        database,
        id,
        uid: CollectionUid(uid),
        partition_key_path,
        settings,
        expired,
        index_paths: Arc::new(index_paths),
        index_complete,
        must_live: Arc::new(must_live),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TtlSeconds;

    #[test]
    fn database_records_with_and_without_uids() {
        let key = database_key(&DatabaseId::parse(IdKind::Database, "app").expect("valid"));
        let (id, uid, throughput) =
            decode_database(&key, &encode_database(DatabaseUid(9), None)).expect("decodes");
        assert_eq!(
            (id.as_str(), uid, throughput),
            ("app", Some(DatabaseUid(9)), None)
        );
        let shared = Throughput::Autoscale {
            max_ru_per_second: 4_000,
        };
        let (_, uid, throughput) =
            decode_database(&key, &encode_database(DatabaseUid(9), Some(shared))).expect("decodes");
        assert_eq!((uid, throughput), (Some(DatabaseUid(9)), Some(shared)));
        // Written before databases had uids.
        let (id, uid, throughput) = decode_database(&key, b"").expect("decodes");
        assert_eq!((id.as_str(), uid, throughput), ("app", None, None));
        assert!(decode_database(&key, b"\0\0\0").is_err());
        for damaged in [
            &br#"{"throughput":{}}"#[..],
            br#"5"#,
            br#"{"throughput":null}"#,
            br#"{"throughput":{"manual":0}}"#,
            br#"{"throughput":{"manual":450}}"#,
        ] {
            let value = [&9u64.to_be_bytes()[..], damaged].concat();
            assert!(
                decode_database(&key, &value).is_err(),
                "{}",
                String::from_utf8_lossy(damaged)
            );
        }
    }

    #[test]
    fn records_without_expired_marks_read_as_none() {
        let old = br#"{"database":"app","id":"c","uid":7,"partitionKeyPath":"/pk","defaultTtl":60,"indexingMode":"consistent"}"#;
        let info = decode_collection(old).expect("decodes");
        assert_eq!(info.expired, ExpiredThrough::default());
    }

    #[test]
    fn indexes_of_an_older_terms_layout_are_incomplete() {
        let old = br#"{"database":"app","id":"c","uid":7,"partitionKeyPath":"/pk","defaultTtl":60,"indexingMode":"consistent","indexingPolicy":{"includedPaths":["/*"],"excludedPaths":[],"complete":true}}"#;
        assert!(!decode_collection(old).expect("decodes").index_complete);
        let current = String::from_utf8(old.to_vec())
            .expect("utf-8")
            .replace("true}", &format!("true,\"termsLayout\":{TERMS_LAYOUT}}}"));
        assert!(
            decode_collection(current.as_bytes())
                .expect("decodes")
                .index_complete
        );
    }

    #[test]
    fn collections_round_trip() {
        for (ttl, mode, throughput) in [
            (DefaultTtl::Off, IndexingMode::None, None),
            (
                DefaultTtl::NoDefault,
                IndexingMode::Lazy,
                Some(Throughput::Manual { ru_per_second: 400 }),
            ),
            (
                DefaultTtl::After(TtlSeconds::new(3600).expect("valid")),
                IndexingMode::Consistent,
                Some(Throughput::Autoscale {
                    max_ru_per_second: 20_000,
                }),
            ),
        ] {
            let info = CollectionInfo {
                database: DatabaseId::parse(IdKind::Database, "app").expect("valid"),
                id: CollectionId::parse(IdKind::Collection, "sessions").expect("valid"),
                uid: CollectionUid(42),
                partition_key_path: PartitionKeyPath::parse("/user/id").expect("valid"),
                settings: CollectionSettings::new(ttl, mode)
                    .expect("valid")
                    .with_change_feed_retention(FeedRetention::from_secs(3600).expect("valid"))
                    .with_throughput(throughput),
                expired: ExpiredThrough {
                    inherited_written_by: 1_790_000_000_000,
                    own_expired_by: 1_790_000_360_000,
                    default_since: 1_790_000_720_000,
                },
                index_paths: Arc::new(
                    IndexPaths::new(&["/*".to_owned()], &["/a/b/?".to_owned()]).expect("valid"),
                ),
                index_complete: mode != IndexingMode::Lazy,
                must_live: Arc::new(
                    MustLive::new(vec![
                        MustLiveRule::new("/type", &[json!("order"), json!(7), json!(null)])
                            .expect("valid"),
                    ])
                    .expect("valid"),
                ),
            };
            assert_eq!(
                decode_collection(&encode_collection(&info)).expect("decodes"),
                info
            );
        }
    }
}
