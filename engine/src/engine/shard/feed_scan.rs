//! A shard's part of a feed page: documents scanned outside the lock, judged under it.

use std::sync::Arc;

use crate::engine::feed::{FeedScope, SCAN_FACTOR, ShardPage};
use crate::engine::{
    CollectionInfo, Millis,
    clock::Clock,
    document::DocumentView,
    error::Error,
    index::path_stats::OrderSupport,
    shard::{Shard, collection_gone, observed, view},
};
use crate::storage::{DocKey, IndexEntry, IndexRange, Lsn, ScanRange, StoredDocument};

/// Slots [`Shard::count_live`] reads per hold of the lock.
const COUNT_CHUNK: usize = 16_384;

impl Shard {
    /// Up to `want` live documents of `scope` after `after`, each kept only if `admit(bytes,
    /// first)` allows the page's body bytes to reach `bytes` with it (`first`: it would be the
    /// first kept); the page ends before the first one refused. Storage is scanned outside the
    /// shard lock; each batch is then judged under it, and a document written between the two
    /// is fetched again once (one rewritten even then counts as written during the feed).
    /// `admit` runs outside the lock.
    pub(crate) fn scan_page(
        &self,
        info: &CollectionInfo,
        scope: &FeedScope,
        after: Option<&DocKey>,
        want: usize,
        admit: &mut dyn FnMut(usize, bool) -> bool,
        reading: Reading<'_>,
    ) -> Result<ShardPage, Error> {
        let mut page = ShardPage {
            documents: Vec::new(),
            bytes: 0,
            settle_at: Lsn::ZERO,
            last: after.cloned(),
            exhausted: false,
            next_size: None,
        };
        let mut scanned = 0;
        while page.documents.len() < want && scanned < want * SCAN_FACTOR {
            let limit = want - page.documents.len();
            let range = match scope {
                FeedScope::Collection => ScanRange::Collection {
                    after: page.last.as_ref(),
                },
                FeedScope::Partition(pk) => ScanRange::Partition {
                    partition_key: pk,
                    after: page.last.as_ref().map(|k| &k.id),
                },
            };
            let mut batch = self.store.scan(info.uid, range, limit)?;
            scanned += batch.len();
            let judged = self.judge_fetched(info, &mut batch, reading)?;
            page.settle_at = page.settle_at.max(judged.settle_at);
            for (record, judged) in batch.iter().zip(judged.views) {
                if let Judged::Live(view) = judged {
                    let size = record.body.len();
                    if !admit(page.bytes + size, page.documents.is_empty()) {
                        // Full: the next page starts at this document.
                        page.next_size = Some(size);
                        return Ok(page);
                    }
                    page.bytes += size;
                    page.documents.push(*view);
                }
                page.last = Some(record.key.clone());
            }
            if batch.len() < limit {
                page.exhausted = true;
                break;
            }
        }
        Ok(page)
    }

    /// The live documents among `keys` (found in the index), in that order, judged at
    /// `read_at`: fetched outside the lock, judged under it, and fetched once more if written
    /// in between. Returns them with the position they settle at.
    pub(crate) fn fetch_live(
        &self,
        info: &CollectionInfo,
        keys: &[DocKey],
        read_at: Millis,
    ) -> Result<(Vec<DocumentView>, Lsn), Error> {
        let mut batch = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(record) = self.store.get(info.uid, key)? {
                batch.push(record);
            }
        }
        let judged = self.judge_fetched(info, &mut batch, Reading::At(read_at))?;
        let live = judged
            .views
            .into_iter()
            .filter_map(|j| match j {
                Judged::Live(view) => Some(*view),
                Judged::Absent | Judged::Changed => None,
            })
            .collect();
        Ok((live, judged.settle_at))
    }

    /// How many of `keys` are live documents at `read_at`, judged by metadata alone. A
    /// document owed an index update (`lazy` mode) is left out: its entry may be of a version
    /// it no longer is, and without its body there is no telling.
    pub(crate) fn count_live_keys(
        &self,
        info: &CollectionInfo,
        keys: &[DocKey],
        read_at: Millis,
    ) -> Result<(u64, Lsn), Error> {
        let state = self.lock();
        if let Some(refused) = self.not_serving(&state) {
            return Err(refused);
        }
        let cs = state
            .collections
            .get(&info.uid)
            .ok_or_else(|| collection_gone(info))?;
        let live = keys
            .iter()
            .filter_map(|k| cs.index.get(k))
            .map(|&slot| state.docs.get(slot))
            .filter(|m| !m.stale && m.is_visible(&cs.rules, read_at))
            .count();
        Ok((live as u64, observed(&state, cs)))
    }

    /// How many documents of a collection are live at `read_at`, from metadata alone: the
    /// slots are read in chunks, each under one short hold of the lock.
    pub(crate) fn count_live(
        &self,
        info: &CollectionInfo,
        read_at: Millis,
    ) -> Result<(u64, Lsn), Error> {
        let (mut live, mut settle_at, mut next) = (0, Lsn::ZERO, 0);
        loop {
            let state = self.lock();
            if let Some(refused) = self.not_serving(&state) {
                return Err(refused);
            }
            let cs = state
                .collections
                .get(&info.uid)
                .ok_or_else(|| collection_gone(info))?;
            settle_at = settle_at.max(observed(&state, cs));
            let end = (next + COUNT_CHUNK).min(state.docs.slot_count());
            if next >= end {
                return Ok((live, settle_at));
            }
            live += (next..end)
                .filter_map(|slot| state.docs.try_get(slot as u32))
                .filter(|m| m.collection == info.uid && m.is_visible(&cs.rules, read_at))
                .count() as u64;
            next = end;
        }
    }

    /// See [`ShardState::order_support`](super::state::ShardState::order_support).
    pub(crate) fn order_support(&self, info: &CollectionInfo, path: &[u8]) -> Option<OrderSupport> {
        self.lock().order_support(info.uid, path)
    }

    /// Up to `limit` keys of documents in `scope` without `bit` (undefined at an `ORDER BY`'s
    /// path), the first in the order's key order past `after`, found in memory.
    pub(crate) fn undefined_keys(
        &self,
        info: &CollectionInfo,
        bit: u8,
        after: Option<&DocKey>,
        descending: bool,
        limit: usize,
        scope: &FeedScope,
    ) -> Vec<DocKey> {
        let mut found = std::collections::BinaryHeap::with_capacity(limit + 1);
        let mut from = Some(0);
        while let Some(slot) = from {
            from = self.lock().undefined_keys(
                info.uid, bit, after, descending, slot, limit, &mut found, scope,
            );
        }
        let mut keys: Vec<DocKey> = found.into_sorted_vec().into_iter().map(|k| k.key).collect();
        // A key deleted and written again into a later slot during the visit is seen twice.
        keys.dedup();
        keys
    }

    /// Index entries of a collection, read from storage without the lock.
    pub(crate) fn scan_index(
        &self,
        info: &CollectionInfo,
        range: IndexRange<'_>,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, Error> {
        Ok(self.store.scan_index(info.uid, range, limit)?)
    }

    /// Judges fetched documents, then fetches those written in between once more and judges
    /// them again (one rewritten even then counts as written during the read).
    fn judge_fetched(
        &self,
        info: &CollectionInfo,
        batch: &mut [Arc<StoredDocument>],
        reading: Reading<'_>,
    ) -> Result<JudgedBatch, Error> {
        let mut judged = self.judge(info, batch, reading)?;
        let stale: Vec<usize> = (0..batch.len())
            .filter(|&i| judged.views[i] == Judged::Changed)
            .collect();
        if !stale.is_empty() {
            for &i in &stale {
                if let Some(record) = self.store.get(info.uid, &batch[i].key)? {
                    batch[i] = record;
                }
            }
            let again = self.judge(info, batch, reading)?;
            judged.settle_at = judged.settle_at.max(again.settle_at);
            for i in stale {
                judged.views[i] = again.views[i].clone();
            }
        }
        Ok(judged)
    }

    /// Judges scanned documents under the shard lock, by one clock reading.
    fn judge(
        &self,
        info: &CollectionInfo,
        batch: &[Arc<StoredDocument>],
        reading: Reading<'_>,
    ) -> Result<JudgedBatch, Error> {
        let mut state = self.lock();
        // Every document a query or feed shows is judged here.
        if let Some(refused) = self.not_serving(&state) {
            return Err(refused);
        }
        let now = match reading {
            Reading::Clock(clock) => state.now(clock),
            Reading::At(at) => at,
        };
        let st = &*state;
        let cs = st
            .collections
            .get(&info.uid)
            .ok_or_else(|| collection_gone(info))?;
        let views = batch
            .iter()
            .map(|record| match cs.index.get(&record.key) {
                None => Judged::Absent,
                Some(&slot) => {
                    let meta = st.docs.get(slot);
                    if meta.version != record.version {
                        Judged::Changed
                    } else if meta.is_visible(&cs.rules, now) {
                        Judged::Live(Box::new(view(record, cs.rules.default_ttl, now)))
                    } else {
                        Judged::Absent
                    }
                }
            })
            .collect();
        Ok(JudgedBatch {
            views,
            settle_at: observed(st, cs),
        })
    }
}

/// The instant a scan judges expiry at.
#[derive(Clone, Copy)]
pub(crate) enum Reading<'a> {
    /// Each batch by its own reading of the shard's clock (a feed page).
    Clock(&'a dyn Clock),
    /// One instant for the whole scan (a query, which judges every document at the clock
    /// reading it started with).
    At(Millis),
}

/// What the shard's index says of a scanned document.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Judged {
    /// Live, as scanned.
    Live(Box<DocumentView>),
    /// Deleted, expired, or not (yet) in the index.
    Absent,
    /// Written again since it was scanned.
    Changed,
}

#[derive(Debug)]
pub(super) struct JudgedBatch {
    views: Vec<Judged>,
    settle_at: Lsn,
}
