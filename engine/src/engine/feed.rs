//! Read feed: the live documents of a collection or partition, page by page, resumable from
//! an opaque continuation token.
//!
//! Order: shard by shard, and within a shard by (partition key, id). Each page is judged by its
//! own clock reading. Documents that exist for the whole iteration appear exactly once; ones
//! written during it may or may not. A page can hold fewer documents than asked (expired ones
//! are skipped within a bounded amount of work); only an empty continuation means the end.

use super::{
    CollectionUid, IdKind, InvalidInput, ResourceId, document::DocumentView,
    partition_key::PartitionKeyValue,
};
use crate::storage::{DocKey, Lsn};

/// Largest page a client may ask for.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// Page size when the client asks for 0.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// Most body bytes (as stored) in one page, as Cosmos DB caps a page at about 4 MB: a page of
/// large documents stays well under the gRPC message limit. A page always holds at least one
/// document, so a single document of any allowed size still pages.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// Documents read from storage per page, at most, as a multiple of the page size: bounds the
/// work a page does when most documents it meets are expired.
pub(super) const SCAN_FACTOR: usize = 8;
/// Version 2: partition keys in the ordered encoding storage keys use.
const TOKEN_VERSION: u8 = 2;

/// Which documents a feed reads.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedScope {
    /// Every partition of the collection.
    Collection,
    /// One partition.
    Partition(PartitionKeyValue),
}

impl FeedScope {
    /// The partition, if the scope is one.
    pub fn partition(&self) -> Option<&PartitionKeyValue> {
        match self {
            FeedScope::Partition(pk) => Some(pk),
            FeedScope::Collection => None,
        }
    }
}

/// One page of a feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedPage {
    /// Live documents in feed order.
    pub documents: Vec<DocumentView>,
    /// Where the next page starts; `None` after the last page.
    pub continuation: Option<String>,
}

/// Validates a requested page size (0 = default).
pub fn page_size(requested: u32) -> Result<usize, InvalidInput> {
    match requested {
        0 => Ok(DEFAULT_PAGE_SIZE as usize),
        n if n <= MAX_PAGE_SIZE => Ok(n as usize),
        n => Err(InvalidInput::PageSize {
            value: n,
            max: MAX_PAGE_SIZE,
        }),
    }
}

/// Position in a feed: the shard being read and the last key read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    pub(crate) shard: usize,
    pub(crate) after: Option<DocKey>,
}

/// What a shard returned for one page.
#[derive(Debug)]
pub(crate) struct ShardPage {
    pub(crate) documents: Vec<DocumentView>,
    /// Body bytes of `documents`.
    pub(crate) bytes: usize,
    /// What the page reflects (documents shown, and omitted) is durable at this position.
    pub(crate) settle_at: Lsn,
    /// Last key examined (live or not): the next page starts after it.
    pub(crate) last: Option<DocKey>,
    /// The shard has nothing after `last`.
    pub(crate) exhausted: bool,
    /// It ended at a document it could not keep (see `Shard::scan_page`): that document's
    /// size.
    pub(crate) next_size: Option<usize>,
}

/// Encodes a cursor, bound to the collection and scope it belongs to (sealed by the caller:
/// see [`super::TokenKey`]).
pub(crate) fn encode_token(
    uid: CollectionUid,
    scope: &FeedScope,
    shards: usize,
    cursor: &Cursor,
) -> Vec<u8> {
    let mut out = vec![TOKEN_VERSION];
    out.extend_from_slice(&uid.0.to_le_bytes());
    // Shards decide the feed's order: a token is only valid with the same number of them.
    out.extend_from_slice(&(shards as u32).to_le_bytes());
    match scope {
        FeedScope::Collection => out.push(0),
        FeedScope::Partition(pk) => {
            out.push(1);
            pk.encode_ordered(&mut out);
        }
    }
    out.extend_from_slice(&(cursor.shard as u32).to_le_bytes());
    match &cursor.after {
        None => out.push(0),
        Some(key) => {
            out.push(1);
            key.partition_key.encode_ordered(&mut out);
            put_str(&mut out, key.id.as_str());
        }
    }
    out
}

/// Decodes a token made by [`encode_token`] for the same collection and scope.
pub(crate) fn decode_token(
    bytes: &[u8],
    uid: CollectionUid,
    scope: &FeedScope,
    shards: usize,
) -> Result<Cursor, InvalidInput> {
    let bad = |reason| InvalidInput::Continuation { reason };
    let mut r = Reader(bytes);
    if r.u8()? != TOKEN_VERSION {
        return Err(bad("it was issued by an incompatible server version"));
    }
    if r.u64()? != uid.0 {
        return Err(bad("it belongs to another collection"));
    }
    let token_shards = r.u32()? as usize;
    let token_scope = match r.u8()? {
        0 => FeedScope::Collection,
        1 => FeedScope::Partition(r.partition_key()?),
        _ => return Err(bad("it is not a token this server issued")),
    };
    if token_scope != *scope {
        return Err(bad(
            "it belongs to a feed of another partition; resend the partition_key it was issued for",
        ));
    }
    let shard = r.u32()? as usize;
    if token_shards != shards || shard >= shards {
        return Err(bad(
            "it was issued by a server with a different number of shards; restart the feed",
        ));
    }
    let after = match r.u8()? {
        0 => None,
        1 => {
            let partition_key = r.partition_key()?;
            let id =
                // As stored: a feed may stand at a document whose id is refused in requests
                // since it was written.
                ResourceId::parse_stored(IdKind::Document, r.str()?)
                    .map_err(|_| bad("it is corrupt"))?;
            Some(DocKey { partition_key, id })
        }
        _ => return Err(bad("it is corrupt")),
    };
    if !r.0.is_empty() {
        return Err(bad("it is corrupt"));
    }
    Ok(Cursor { shard, after })
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], InvalidInput> {
        if self.0.len() < n {
            return Err(InvalidInput::Continuation {
                reason: "it is truncated",
            });
        }
        let (head, tail) = self.0.split_at(n);
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
        std::str::from_utf8(self.take(len)?).map_err(|_| InvalidInput::Continuation {
            reason: "it is corrupt",
        })
    }

    /// A partition key value, held to the limits a request's would be.
    fn partition_key(&mut self) -> Result<PartitionKeyValue, InvalidInput> {
        let corrupt = InvalidInput::Continuation {
            reason: "it is corrupt",
        };
        let (pk, rest) = PartitionKeyValue::decode_ordered(self.0).ok_or(corrupt.clone())?;
        self.0 = rest;
        match pk {
            PartitionKeyValue::Number(x) if !x.is_finite() => Err(corrupt),
            PartitionKeyValue::Number(x) => Ok(PartitionKeyValue::number(x)),
            PartitionKeyValue::String(s) => PartitionKeyValue::string(&s).map_err(|_| corrupt),
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

    #[test]
    fn tokens_round_trip_for_every_key_type() {
        let uid = CollectionUid(7);
        for pk in [
            PartitionKeyValue::Undefined,
            PartitionKeyValue::Null,
            PartitionKeyValue::Bool(true),
            PartitionKeyValue::number(-2.5),
            PartitionKeyValue::String("ü/x".into()),
        ] {
            let cursor = Cursor {
                shard: 1,
                after: Some(key(pk.clone(), "doc-1")),
            };
            let scope = FeedScope::Partition(pk);
            let token = encode_token(uid, &scope, 2, &cursor);
            assert_eq!(decode_token(&token, uid, &scope, 2), Ok(cursor.clone()));
        }
    }

    #[test]
    fn tokens_are_bound_to_their_feed() {
        let cursor = Cursor {
            shard: 0,
            after: None,
        };
        let token = encode_token(CollectionUid(1), &FeedScope::Collection, 2, &cursor);
        assert!(decode_token(&token, CollectionUid(2), &FeedScope::Collection, 2).is_err());
        let other = FeedScope::Partition(PartitionKeyValue::Null);
        assert!(decode_token(&token, CollectionUid(1), &other, 2).is_err());
        assert!(
            decode_token(b"not a token!", CollectionUid(1), &FeedScope::Collection, 2).is_err()
        );
        assert!(
            decode_token(
                &token[..token.len() - 2],
                CollectionUid(1),
                &FeedScope::Collection,
                2
            )
            .is_err()
        );
        // A server with more shards orders the feed differently: its pages would skip or
        // repeat documents, so the token is refused rather than misread.
        assert!(decode_token(&token, CollectionUid(1), &FeedScope::Collection, 4).is_err());
        assert!(decode_token(&token, CollectionUid(1), &FeedScope::Collection, 2).is_ok());
    }
}
