//! A shard's side of the change feed: where its log ends, what of it is durable, and reading it.

use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::Shard;
use crate::engine::CollectionUid;
use crate::storage::{LogRecord, Lsn, StorageError};

/// Where a shard's change log ends: its last position, and where the commit that appended it
/// is in storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogTip {
    pub(crate) seq: u64,
    pub(crate) lsn: Lsn,
}

impl Shard {
    /// The end of this shard's change log now (records there may not be durable yet).
    pub(crate) fn log_tip(&self) -> LogTip {
        let st = self.lock();
        LogTip {
            seq: st.log_seq,
            lsn: st.log_lsn,
        }
    }

    /// Where this shard's records of `uid` end, as far as it knows: at most its last record's
    /// position (after a restart, the shard's last position, whatever the collection).
    pub(crate) fn collection_tip(&self, uid: CollectionUid) -> LogTip {
        let st = self.lock();
        let (seq, lsn) = st
            .collections
            .get(&uid)
            .map_or((0, Lsn::ZERO), |cs| cs.log_tip);
        LogTip { seq, lsn }
    }

    /// A receiver that sees a change whenever a commit appends records of `uid` (in any shard);
    /// `None` if the collection is not attached.
    pub(crate) fn feed_signal(&self, uid: CollectionUid) -> Option<watch::Receiver<()>> {
        self.lock()
            .collections
            .get(&uid)
            .map(|c| c.feed_signal.subscribe())
    }

    /// Waits until the log up to `tip` is durable, then lets readers read up to it.
    pub(crate) async fn make_log_durable(&self, tip: LogTip) -> Result<(), StorageError> {
        if let Some(durable) = self.store.durable(tip.lsn) {
            durable.await?;
        }
        self.durable_log.fetch_max(tip.seq, Ordering::AcqRel);
        Ok(())
    }

    /// Every position up to this one is durable and may be read.
    pub(crate) fn durable_log_seq(&self) -> u64 {
        self.durable_log.load(Ordering::Acquire)
    }

    /// One past the highest position of `uid`'s records retention removed (0: none), or
    /// past the snapshot this shard was loaded from.
    pub(crate) fn log_floor(&self, uid: CollectionUid) -> Result<u64, StorageError> {
        let loaded = self.history_from.load(Ordering::Acquire);
        Ok(self.store.change_log().log_floor(uid)?.max(loaded))
    }

    /// Removes up to `limit` of `uid`'s records below `below`; returns how many.
    pub(crate) fn trim_log(
        &self,
        uid: CollectionUid,
        below: u64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        self.store.change_log().trim_log(uid, below, limit)
    }

    /// Up to `limit` of a collection's records from position `from`, in order. Blocks on
    /// storage.
    pub(crate) fn read_log(
        &self,
        uid: CollectionUid,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogRecord)>, StorageError> {
        self.store.change_log().read_log(uid, from, limit)
    }
}
