//! What the disk backend keeps of recent reads, decoded, so that reading it again skips fjall:
//! documents by key, and the index entries of single terms (what an equality query reads). A
//! point read that finds its document in a memtable walks a skip list with a cache miss per
//! level, and one in a table searches a cached block; a range over the index opens an
//! iterator on every memtable and table. Those are most of a point read's storage time, and
//! most of an indexed query's.
//!
//! Neither cache ever holds more than what fjall holds once the writes in progress are done.
//! Writes to one shard are serialized (see [`crate::storage::ShardStore`]): after fjall has
//! applied a batch, the write updates what it changed (it replaces a cached document it
//! overwrote and drops one it deleted, adding none, so a write load does not evict what reads
//! keep hot; it drops the cached entries of every term it added or removed an entry of) and
//! counts itself, under the shard's fill lock. A read that missed fills in what it read under
//! that lock only if no write was counted since before it read fjall: a write that ran beside
//! it may have made what it read stale, and the next read fetches again. (The engine also
//! checks every fetched document's version against its own metadata.)

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use quick_cache::{Weighter, sync::Cache};

use crate::storage::{IndexEntry, StoredDocument};

/// Terms with more entries than this are not kept: an equality on them reads many documents
/// anyway, and their lists would crowd out the small ones.
pub(super) const MAX_CACHED_ENTRIES: usize = 64;

/// The share of the budget the entries take (the rest is documents).
const ENTRIES_SHARE: u64 = 8;

#[derive(Debug, Clone)]
struct DocumentBytes;

impl Weighter<Vec<u8>, Arc<StoredDocument>> for DocumentBytes {
    /// Its key (as the cache keeps it and as the document holds it), its body, and the fixed
    /// part of the record and of the cache's entry.
    fn weight(&self, key: &Vec<u8>, doc: &Arc<StoredDocument>) -> u64 {
        (2 * key.len() + doc.body.len() + 128) as u64
    }
}

#[derive(Debug, Clone)]
struct EntryBytes;

impl Weighter<Vec<u8>, Arc<[IndexEntry]>> for EntryBytes {
    /// The term once per entry and in the key, and each entry's document key.
    fn weight(&self, key: &Vec<u8>, entries: &Arc<[IndexEntry]>) -> u64 {
        let each: usize = entries
            .iter()
            .map(|e| e.term.len() + e.key.id.as_str().len() + 96)
            .sum();
        (key.len() + each + 64) as u64
    }
}

/// Every shard's cached reads, within one byte budget. Keys are storage keys: a document's,
/// and for a term, its collection's prefix followed by the term; both start with the shard.
pub(super) struct ReadCache {
    documents: Cache<Vec<u8>, Arc<StoredDocument>, DocumentBytes>,
    entries: Cache<Vec<u8>, Arc<[IndexEntry]>, EntryBytes>,
}

impl ReadCache {
    /// A cache of at most about `bytes`; `None` for 0 (no cache).
    pub(super) fn new(bytes: u64) -> Option<Arc<Self>> {
        if bytes == 0 {
            return None;
        }
        let entry_bytes = (bytes / ENTRIES_SHARE).max(1);
        let document_bytes = (bytes - entry_bytes).max(1);
        // Estimates of the items, for the caches' initial tables: ~1 KB documents, terms with
        // a few entries.
        let items = |bytes: u64, each: u64| (bytes / each).clamp(16, 1 << 20) as usize;
        Some(Arc::new(ReadCache {
            documents: Cache::with_weighter(
                items(document_bytes, 1024),
                document_bytes,
                DocumentBytes,
            ),
            entries: Cache::with_weighter(items(entry_bytes, 512), entry_bytes, EntryBytes),
        }))
    }
}

/// One shard's view of the cache.
pub(super) struct ShardCache {
    cache: Arc<ReadCache>,
    /// Writes applied to the cache so far; held while a write updates the cache and while a
    /// read decides whether it may fill in.
    writes: Mutex<u64>,
}

/// A read's note of the writes counted before it read fjall.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadMark(u64);

/// What one write did to a document, for the cache.
#[derive(Clone, Copy)]
pub(super) enum Written<'a> {
    Put(&'a Arc<StoredDocument>),
    Deleted,
}

/// What a write changed, for the cache: documents by key, and the terms (as cache keys) it
/// added or removed an entry of.
#[derive(Default)]
pub(super) struct Changed<'a> {
    pub(super) documents: Vec<(Vec<u8>, Written<'a>)>,
    pub(super) terms: Vec<Vec<u8>>,
}

impl ShardCache {
    pub(super) fn new(cache: Arc<ReadCache>) -> Self {
        ShardCache {
            cache,
            writes: Mutex::new(0),
        }
    }

    fn writes(&self) -> MutexGuard<'_, u64> {
        // The count is a plain number, valid whatever a panicking holder was doing.
        self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached document at `key`, if any.
    pub(super) fn document(&self, key: &[u8]) -> Option<Arc<StoredDocument>> {
        self.cache.documents.get(key)
    }

    /// Every entry of the term whose cache key is `key`, ascending, if cached.
    pub(super) fn entries(&self, key: &[u8]) -> Option<Arc<[IndexEntry]>> {
        self.cache.entries.get(key)
    }

    /// To take before reading fjall for something that missed.
    pub(super) fn mark(&self) -> ReadMark {
        ReadMark(*self.writes())
    }

    /// Keeps `doc`, read from fjall at `key` after `mark`, unless a write came since.
    pub(super) fn fill_document(&self, mark: ReadMark, key: Vec<u8>, doc: Arc<StoredDocument>) {
        let writes = self.writes();
        if *writes == mark.0 {
            self.cache.documents.insert(key, doc);
        }
    }

    /// Keeps every entry of one term (ascending), read from fjall after `mark`, unless a write
    /// came since.
    pub(super) fn fill_entries(&self, mark: ReadMark, key: Vec<u8>, entries: Arc<[IndexEntry]>) {
        let writes = self.writes();
        if *writes == mark.0 {
            self.cache.entries.insert(key, entries);
        }
    }

    /// After fjall applied a batch: brings the cache in line with what it changed.
    pub(super) fn wrote(&self, changed: &Changed<'_>) {
        let mut writes = self.writes();
        for (key, change) in &changed.documents {
            match change {
                Written::Put(doc) => {
                    if self.cache.documents.contains_key(&key[..]) {
                        // Fails only if an eviction just took the key: nothing stale is left.
                        let _ = self
                            .cache
                            .documents
                            .replace(key.clone(), Arc::clone(doc), false);
                    }
                }
                Written::Deleted => {
                    self.cache.documents.remove(&key[..]);
                }
            }
        }
        for term in &changed.terms {
            self.cache.entries.remove(&term[..]);
        }
        *writes += 1;
    }

    /// After fjall removed everything under `prefix` (a dropped collection).
    pub(super) fn dropped(&self, prefix: &[u8]) {
        let mut writes = self.writes();
        self.cache
            .documents
            .retain(|key, _| !key.starts_with(prefix));
        self.cache.entries.retain(|key, _| !key.starts_with(prefix));
        *writes += 1;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::model::{CollectionUid, DocKey, DocumentId, IdKind, PartitionKeyValue};

    fn doc(version: u64) -> Arc<StoredDocument> {
        Arc::new(StoredDocument {
            collection: CollectionUid(1),
            key: DocKey {
                partition_key: PartitionKeyValue::String("p".into()),
                id: DocumentId::parse(IdKind::Document, "a").expect("valid"),
            },
            body: Bytes::from_static(b"{}"),
            last_write: 1,
            version,
            ttl: None,
        })
    }

    /// A read that missed, read fjall, and was overtaken by a write of the same document
    /// before it could fill in must not fill in: what it read is the old version, and the
    /// write (which found nothing cached to replace) left the cache empty.
    #[test]
    fn a_read_overtaken_by_a_write_does_not_fill_in() {
        let cache = ShardCache::new(ReadCache::new(1 << 20).expect("a cache"));
        let key = b"doc".to_vec();
        let mark = cache.mark();
        let (old, new) = (doc(1), doc(2));
        cache.wrote(&Changed {
            documents: vec![(key.clone(), Written::Put(&new))],
            terms: vec![b"term".to_vec()],
        });
        cache.fill_document(mark, key.clone(), old);
        cache.fill_entries(mark, b"term".to_vec(), Arc::from(Vec::new()));
        assert!(cache.document(&key).is_none());
        assert!(cache.entries(b"term").is_none());
        // A read after the write fills in, and a later write replaces what it filled.
        let mark = cache.mark();
        cache.fill_document(mark, key.clone(), new);
        assert_eq!(cache.document(&key).map(|d| d.version), Some(2));
        let newer = doc(3);
        cache.wrote(&Changed {
            documents: vec![(key.clone(), Written::Put(&newer))],
            terms: Vec::new(),
        });
        assert_eq!(cache.document(&key).map(|d| d.version), Some(3));
        cache.wrote(&Changed {
            documents: vec![(key.clone(), Written::Deleted)],
            terms: Vec::new(),
        });
        assert!(cache.document(&key).is_none());
    }
}
