//! Continuation tokens: one format for feeds and every kind of query page, sealed by
//! [`super::TokenKey`]. A token names what made it (a feed, a query's key-order scan, index
//! read or ordered walk, or the offset into a whole-scope query's results), the collection by
//! uid, the scope, the number of shards (which decides the order), the query's and the plan's
//! fingerprints, and the position, so it resumes only what made it.
//!
//! Layout (little-endian): `version u8 | kind u8 | uid u64 | shards u32 | scope | query u64 |
//! plan u64 | skipped u64 | returned u64 | shard u32 | range u32 | phase u8 | key | term |
//! value`, where `scope` is `0` or `1` and a partition key, `key` is `0` or `1`, a partition key
//! and an id, `term` is a `u16` length and bytes, and `value` (the value an ordered walk's tied
//! group resumes after) is `0` or `1`, a `u32` length and JSON. Fields a kind does not use are
//! zero.

use super::{
    CollectionInfo, CollectionUid, Engine, Error, IdKind, InvalidInput, ResourceId,
    feed::{Cursor, FeedScope},
    index::{ordered::OrderedPos, read::EntryCursor},
    partition_key::PartitionKeyValue,
};
use crate::storage::{DocKey, IndexEntry};

/// Version 3: one format for feeds and queries.
const VERSION: u8 = 3;

/// Where a query stands between pages.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryCursor {
    /// A streaming query: the next document, and the rows skipped and results returned.
    Stream {
        cursor: Cursor,
        skipped: u64,
        returned: u64,
    },
    /// A streaming query reading index entries: the next entry under the plan with this
    /// fingerprint, and the counts.
    Index {
        at: EntryCursor,
        plan: u64,
        skipped: u64,
        returned: u64,
    },
    /// An `ORDER BY` read from the index in order: where the walk stands under the plan with
    /// this fingerprint, and the counts.
    Ordered {
        at: OrderedPos,
        plan: u64,
        skipped: u64,
        returned: u64,
    },
    /// A query that reads its whole scope: results already returned.
    Offset(u64),
}

/// What a token belongs to: checked on every token before its position is used.
pub(crate) struct Binding<'a> {
    pub(crate) uid: CollectionUid,
    pub(crate) scope: &'a FeedScope,
    pub(crate) shards: usize,
    /// The query's fingerprint; `None` for a feed.
    pub(crate) query: Option<u64>,
}

/// Where a token resumes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resume {
    Feed(Cursor),
    Query(QueryCursor),
}

/// The fields of one token, each kind using some.
#[derive(Default)]
struct Fields {
    kind: u8,
    plan: u64,
    skipped: u64,
    returned: u64,
    shard: usize,
    range: usize,
    phase: u8,
    key: Option<DocKey>,
    term: Vec<u8>,
    /// JSON.
    value: Option<Vec<u8>>,
}

const FEED: u8 = 0;
const SCAN: u8 = 1;
const INDEX: u8 = 2;
const ORDERED: u8 = 3;
const OFFSET: u8 = 4;

fn fields(resume: &Resume) -> Fields {
    match resume {
        Resume::Feed(cursor) => Fields {
            kind: FEED,
            shard: cursor.shard,
            key: cursor.after.clone(),
            ..Fields::default()
        },
        Resume::Query(QueryCursor::Stream {
            cursor,
            skipped,
            returned,
        }) => Fields {
            kind: SCAN,
            skipped: *skipped,
            returned: *returned,
            shard: cursor.shard,
            key: cursor.after.clone(),
            ..Fields::default()
        },
        Resume::Query(QueryCursor::Index {
            at,
            plan,
            skipped,
            returned,
        }) => Fields {
            kind: INDEX,
            plan: *plan,
            skipped: *skipped,
            returned: *returned,
            shard: at.shard,
            range: at.range,
            key: at.after.as_ref().map(|e| e.key.clone()),
            term: at
                .after
                .as_ref()
                .map(|e| e.term.clone())
                .unwrap_or_default(),
            ..Fields::default()
        },
        Resume::Query(QueryCursor::Ordered {
            at,
            plan,
            skipped,
            returned,
        }) => {
            let (phase, key, term, value) = match at {
                OrderedPos::Undefined(after) => (0, after.clone(), Vec::new(), None),
                OrderedPos::Entries(None) => (1, None, Vec::new(), None),
                OrderedPos::Entries(Some(e)) => (1, Some(e.key.clone()), e.term.clone(), None),
                OrderedPos::Group { term, last, value } => (
                    2,
                    Some(last.clone()),
                    term.clone(),
                    value.as_ref().map(|v| v.to_string().into_bytes()),
                ),
            };
            Fields {
                kind: ORDERED,
                plan: *plan,
                skipped: *skipped,
                returned: *returned,
                phase,
                key,
                term,
                value,
                ..Fields::default()
            }
        }
        Resume::Query(QueryCursor::Offset(n)) => Fields {
            kind: OFFSET,
            returned: *n,
            ..Fields::default()
        },
    }
}

/// A token's bytes (to be sealed).
pub(crate) fn encode(binding: &Binding<'_>, resume: &Resume) -> Vec<u8> {
    let f = fields(resume);
    let mut out = vec![VERSION, f.kind];
    out.extend_from_slice(&binding.uid.0.to_le_bytes());
    out.extend_from_slice(&(binding.shards as u32).to_le_bytes());
    match binding.scope {
        FeedScope::Collection => out.push(0),
        FeedScope::Partition(pk) => {
            out.push(1);
            pk.encode_ordered(&mut out);
        }
    }
    for word in [binding.query.unwrap_or(0), f.plan, f.skipped, f.returned] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&(f.shard as u32).to_le_bytes());
    out.extend_from_slice(&(f.range as u32).to_le_bytes());
    out.push(f.phase);
    match &f.key {
        None => out.push(0),
        Some(key) => {
            out.push(1);
            key.partition_key.encode_ordered(&mut out);
            out.extend_from_slice(&(key.id.as_str().len() as u32).to_le_bytes());
            out.extend_from_slice(key.id.as_str().as_bytes());
        }
    }
    out.extend_from_slice(
        &u16::try_from(f.term.len())
            .expect("terms are bounded far below 64 KiB")
            .to_le_bytes(),
    );
    out.extend_from_slice(&f.term);
    match &f.value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
    }
    out
}

fn bad(reason: &'static str) -> InvalidInput {
    InvalidInput::Continuation { reason }
}

/// Reads a token made by [`encode`], if it belongs to `binding`. The caller checks what needs
/// the collection's current state: the shard against the scope's, the plan's fingerprint.
pub(crate) fn decode(bytes: &[u8], binding: &Binding<'_>) -> Result<Resume, InvalidInput> {
    let mut r = Reader(bytes);
    if r.u8()? != VERSION {
        return Err(bad("it was issued by an incompatible server version"));
    }
    let kind = r.u8()?;
    if r.u64()? != binding.uid.0 {
        return Err(bad("it belongs to another collection"));
    }
    let shards = r.u32()? as usize;
    let scope = match r.u8()? {
        0 => FeedScope::Collection,
        1 => FeedScope::Partition(r.partition_key()?),
        _ => return Err(bad("it is corrupt")),
    };
    if scope != *binding.scope {
        return Err(bad(
            "it belongs to a read of another partition; resend the partition_key it was issued for",
        ));
    }
    if shards != binding.shards {
        return Err(bad(
            "it was issued by a server with a different number of shards; start again",
        ));
    }
    let query = r.u64()?;
    match (binding.query, kind) {
        (None, FEED) => {}
        (None, _) | (Some(_), FEED) => return Err(bad("it was issued for another kind of read")),
        (Some(fingerprint), _) if query != fingerprint => {
            return Err(bad(
                "it was issued for another query text or other parameters",
            ));
        }
        _ => {}
    }
    let mut f = Fields {
        kind,
        plan: r.u64()?,
        skipped: r.u64()?,
        returned: r.u64()?,
        shard: r.u32()? as usize,
        range: r.u32()? as usize,
        phase: r.u8()?,
        ..Fields::default()
    };
    f.key = match r.u8()? {
        0 => None,
        1 => {
            let partition_key = r.partition_key()?;
            let id = r.str()?;
            // As stored: a read may stand at a document whose id is refused in requests since
            // it was written.
            let id =
                ResourceId::parse_stored(IdKind::Document, id).map_err(|_| bad("it is corrupt"))?;
            Some(DocKey { partition_key, id })
        }
        _ => return Err(bad("it is corrupt")),
    };
    let term_len = usize::from(u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes")));
    f.term = r.take(term_len)?.to_vec();
    f.value = match r.u8()? {
        0 => None,
        1 => {
            let len = r.u32()? as usize;
            Some(r.take(len)?.to_vec())
        }
        _ => return Err(bad("it is corrupt")),
    };
    if !r.0.is_empty() {
        return Err(bad("it is corrupt"));
    }
    if f.shard >= shards {
        return Err(bad("it is corrupt"));
    }
    resume(f)
}

/// The position a token's fields describe, if they make sense for its kind.
fn resume(f: Fields) -> Result<Resume, InvalidInput> {
    let corrupt = || bad("it is corrupt");
    let cursor = |key| Cursor {
        shard: f.shard,
        after: key,
    };
    Ok(match f.kind {
        FEED => Resume::Feed(cursor(f.key)),
        SCAN => Resume::Query(QueryCursor::Stream {
            cursor: cursor(f.key),
            skipped: f.skipped,
            returned: f.returned,
        }),
        INDEX => {
            let after = match (f.key, f.term.is_empty()) {
                (None, true) => None,
                (Some(key), false) => Some(IndexEntry { term: f.term, key }),
                _ => return Err(corrupt()),
            };
            Resume::Query(QueryCursor::Index {
                at: EntryCursor {
                    shard: f.shard,
                    range: f.range,
                    after,
                },
                plan: f.plan,
                skipped: f.skipped,
                returned: f.returned,
            })
        }
        ORDERED => {
            let at = match (f.phase, f.key, f.term.is_empty()) {
                (0, after, true) => OrderedPos::Undefined(after),
                (1, None, true) => OrderedPos::Entries(None),
                (1, Some(key), false) => {
                    OrderedPos::Entries(Some(IndexEntry { term: f.term, key }))
                }
                (2, Some(last), false) => OrderedPos::Group {
                    term: f.term,
                    last,
                    value: match f.value {
                        Some(json) => Some(serde_json::from_slice(&json).map_err(|_| corrupt())?),
                        None => None,
                    },
                },
                _ => return Err(corrupt()),
            };
            Resume::Query(QueryCursor::Ordered {
                at,
                plan: f.plan,
                skipped: f.skipped,
                returned: f.returned,
            })
        }
        OFFSET => Resume::Query(QueryCursor::Offset(f.returned)),
        _ => return Err(corrupt()),
    })
}

impl Engine {
    fn binding<'a>(
        &self,
        info: &CollectionInfo,
        scope: &'a FeedScope,
        query: Option<u64>,
    ) -> Binding<'a> {
        Binding {
            uid: info.uid,
            scope,
            shards: self.shard_count(),
            query,
        }
    }

    /// A continuation token resuming `resume` in a feed (`query: None`) or the query with
    /// this fingerprint of `info`.
    pub(super) fn seal_cursor(
        &self,
        info: &CollectionInfo,
        scope: &FeedScope,
        query: Option<u64>,
        resume: &Resume,
    ) -> String {
        let bytes = encode(&self.binding(info, scope, query), resume);
        self.inner.token_key.seal(&bytes)
    }

    /// Where a client's token resumes, if this server sealed it for this feed or query.
    pub(super) fn open_cursor(
        &self,
        token: &str,
        info: &CollectionInfo,
        scope: &FeedScope,
        query: Option<u64>,
    ) -> Result<Resume, Error> {
        let bytes = self.inner.token_key.open(token)?;
        Ok(decode(&bytes, &self.binding(info, scope, query))?)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], InvalidInput> {
        let (head, tail) = self.0.split_at_checked(n).ok_or(bad("it is truncated"))?;
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, InvalidInput> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, InvalidInput> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, InvalidInput> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn str(&mut self) -> Result<&'a str, InvalidInput> {
        let len = self.u32()? as usize;
        std::str::from_utf8(self.take(len)?).map_err(|_| bad("it is corrupt"))
    }

    /// A partition key value, held to the limits a request's would be.
    fn partition_key(&mut self) -> Result<PartitionKeyValue, InvalidInput> {
        let (pk, rest) = PartitionKeyValue::decode_ordered(self.0).ok_or(bad("it is corrupt"))?;
        self.0 = rest;
        match pk {
            PartitionKeyValue::Number(x) if !x.is_finite() => Err(bad("it is corrupt")),
            PartitionKeyValue::Number(x) => Ok(PartitionKeyValue::number(x)),
            PartitionKeyValue::String(s) => {
                PartitionKeyValue::string(&s).map_err(|_| bad("it is corrupt"))
            }
            pk => Ok(pk),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pk: PartitionKeyValue, id: &str) -> DocKey {
        DocKey {
            partition_key: pk,
            id: ResourceId::parse(IdKind::Document, id).expect("valid"),
        }
    }

    fn binding(scope: &FeedScope, query: Option<u64>) -> Binding<'_> {
        Binding {
            uid: CollectionUid(7),
            scope,
            shards: 4,
            query,
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let entry = |pk: &PartitionKeyValue| IndexEntry {
            term: vec![b'n', 0, 1, 0, 0, 0x30, 9],
            key: key(pk.clone(), "doc-1"),
        };
        for pk in [
            PartitionKeyValue::Undefined,
            PartitionKeyValue::Null,
            PartitionKeyValue::Bool(true),
            PartitionKeyValue::number(-2.5),
            PartitionKeyValue::String("ü/x".into()),
        ] {
            let scope = FeedScope::Partition(pk.clone());
            let feed = Resume::Feed(Cursor {
                shard: 1,
                after: Some(key(pk.clone(), "doc-1")),
            });
            assert_eq!(
                decode(
                    &encode(&binding(&scope, None), &feed),
                    &binding(&scope, None)
                ),
                Ok(feed)
            );
            let queries = [
                QueryCursor::Stream {
                    cursor: Cursor {
                        shard: 3,
                        after: Some(key(pk.clone(), "d")),
                    },
                    skipped: 1,
                    returned: 2,
                },
                QueryCursor::Index {
                    at: EntryCursor {
                        shard: 2,
                        range: 1,
                        after: Some(entry(&pk)),
                    },
                    plan: 99,
                    skipped: 0,
                    returned: 5,
                },
                QueryCursor::Ordered {
                    at: OrderedPos::Undefined(Some(key(pk.clone(), "u"))),
                    plan: 9,
                    skipped: 0,
                    returned: 1,
                },
                QueryCursor::Ordered {
                    at: OrderedPos::Entries(Some(entry(&pk))),
                    plan: 9,
                    skipped: 0,
                    returned: 1,
                },
                QueryCursor::Ordered {
                    at: OrderedPos::Group {
                        term: vec![1, 2, 3],
                        last: key(pk.clone(), "g"),
                        value: Some(serde_json::json!({"a": [1, "x"]})),
                    },
                    plan: 9,
                    skipped: 3,
                    returned: 1,
                },
                QueryCursor::Ordered {
                    at: OrderedPos::Group {
                        term: vec![1, 2, 3],
                        last: key(pk.clone(), "g"),
                        value: None,
                    },
                    plan: 9,
                    skipped: 3,
                    returned: 1,
                },
                QueryCursor::Offset(12),
            ];
            for q in queries {
                let b = binding(&scope, Some(42));
                let resume = Resume::Query(q);
                assert_eq!(decode(&encode(&b, &resume), &b), Ok(resume));
            }
        }
    }

    #[test]
    fn tokens_resume_only_what_made_them() {
        let all = FeedScope::Collection;
        let feed = encode(
            &binding(&all, None),
            &Resume::Feed(Cursor {
                shard: 0,
                after: None,
            }),
        );
        let query = encode(
            &binding(&all, Some(1)),
            &Resume::Query(QueryCursor::Offset(3)),
        );
        assert!(decode(&feed, &binding(&all, None)).is_ok());
        assert!(
            decode(&feed, &binding(&all, Some(1))).is_err(),
            "a feed's, to a query"
        );
        assert!(
            decode(&query, &binding(&all, None)).is_err(),
            "a query's, to a feed"
        );
        assert!(
            decode(&query, &binding(&all, Some(2))).is_err(),
            "another query"
        );
        let other = FeedScope::Partition(PartitionKeyValue::Null);
        assert!(
            decode(&feed, &binding(&other, None)).is_err(),
            "another scope"
        );
        let mut b = binding(&all, None);
        b.uid = CollectionUid(8);
        assert!(decode(&feed, &b).is_err(), "another collection");
        // A server with more shards orders reads differently: its pages would skip or repeat
        // documents, so the token is refused rather than misread.
        b = binding(&all, None);
        b.shards = 8;
        assert!(decode(&feed, &b).is_err(), "another shard count");
        assert!(decode(&feed[..feed.len() - 2], &binding(&all, None)).is_err());
        assert!(decode(b"not a token!", &binding(&all, None)).is_err());
    }
}
