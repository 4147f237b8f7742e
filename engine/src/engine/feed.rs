//! Read feed: the live documents of a collection or partition, page by page, resumable from
//! an opaque continuation token.
//!
//! Order: shard by shard, and within a shard by (partition key, id). Each page is judged by its
//! own clock reading. Documents that exist for the whole iteration appear exactly once; ones
//! written during it may or may not. A page can hold fewer documents than asked (expired ones
//! are skipped within a bounded amount of work); only an empty continuation means the end.

use super::{InvalidInput, document::DocumentView, partition_key::PartitionKeyValue};
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
    /// The page ended where the shards this node serves end (in a cluster): the next page,
    /// at `continuation`, is another node's to read.
    pub handoff: bool,
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
