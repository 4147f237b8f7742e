//! The change log records one commit appends (see `docs/changefeed.md`): built under the shard
//! lock from the changes and the documents' state before them, each at the shard's next
//! position, and written in the commit's storage batch.

use std::collections::HashMap;

use crate::engine::{
    CollectionUid,
    change_feed::{ChangeOp, ChangeRecord},
    clock::Millis,
    shard::DocMeta,
};
use crate::storage::{DocumentWrite, LogRecord, StoredDocument};

/// One commit's records.
#[derive(Debug)]
pub(super) struct LogAppends {
    /// The last position given out.
    last: u64,
    /// The shard's time at the commit.
    now: Millis,
    records: Vec<(CollectionUid, u64, LogRecord)>,
    /// Documents whose expiry this commit logs (slot, position), in the order logged.
    expired: Vec<(u32, u64)>,
    /// The same, by slot.
    expired_slots: HashMap<u32, u64>,
}

impl LogAppends {
    /// Records to come after position `last`, appended at shard time `now`.
    pub(super) fn after(last: u64, now: Millis) -> Self {
        LogAppends {
            last,
            now,
            records: Vec::new(),
            expired: Vec::new(),
            expired_slots: HashMap::new(),
        }
    }

    /// Records made elsewhere (an owner's, applied by a follower), in order, ending the commit
    /// at position `last`, and the documents whose expiry they log (slot, position).
    pub(super) fn given(
        last: u64,
        records: Vec<(CollectionUid, u64, LogRecord)>,
        expired: Vec<(u32, u64)>,
    ) -> Self {
        LogAppends {
            last,
            now: 0,
            expired_slots: expired.iter().copied().collect(),
            expired,
            records,
        }
    }

    fn push(&mut self, collection: CollectionUid, record: &ChangeRecord) -> u64 {
        self.last += 1;
        self.records
            .push((collection, self.last, record.log_record()));
        self.last
    }

    /// Logs the expiry of the document in `slot` at instant `at`, unless this commit already
    /// did; returns its position.
    pub(super) fn expire(&mut self, slot: u32, meta: &DocMeta, at: Millis) -> u64 {
        if let Some(seq) = self.expired_at(slot) {
            return seq;
        }
        let seq = self.push(
            meta.collection,
            &ChangeRecord {
                op: ChangeOp::Expire,
                crts: at,
                logged_at: self.now,
                version: meta.version,
                previous: meta.seq,
                ttl: meta.ttl,
                key: meta.key.clone(),
                body: None,
            },
        );
        self.expired.push((slot, seq));
        self.expired_slots.insert(slot, seq);
        seq
    }

    /// The position of the expiry this commit logs for the document in `slot`, if any.
    pub(super) fn expired_at(&self, slot: u32) -> Option<u64> {
        self.expired_slots.get(&slot).copied()
    }

    /// Logs a new version; returns its position.
    pub(super) fn write(&mut self, doc: &StoredDocument, op: ChangeOp, previous: u64) -> u64 {
        self.push(
            doc.collection,
            &ChangeRecord {
                op,
                crts: doc.last_write,
                logged_at: self.now.max(doc.last_write),
                version: doc.version,
                previous,
                ttl: doc.ttl,
                key: doc.key.clone(),
                body: Some(doc.body.clone()),
            },
        )
    }

    /// Logs a client's delete of the document `meta` describes, at `at`; returns its position.
    pub(super) fn delete(&mut self, meta: &DocMeta, at: Millis) -> u64 {
        self.push(
            meta.collection,
            &ChangeRecord {
                op: ChangeOp::Delete,
                crts: at,
                logged_at: self.now,
                version: meta.version,
                previous: meta.seq,
                ttl: meta.ttl,
                key: meta.key.clone(),
                body: None,
            },
        )
    }

    /// The documents whose expiry this commit logs, with their positions.
    pub(super) fn expired(&self) -> &[(u32, u64)] {
        &self.expired
    }

    /// The collections records were appended for, each once, with its last position.
    pub(super) fn collections(&self) -> HashMap<CollectionUid, u64> {
        let mut out = HashMap::new();
        for &(uid, seq, _) in &self.records {
            out.insert(uid, seq);
        }
        out
    }

    /// The last position given out (the shard's, once the commit is stored).
    pub(super) fn last(&self) -> u64 {
        self.last
    }

    /// The storage writes that append the records.
    pub(super) fn writes(&self) -> impl Iterator<Item = DocumentWrite<'_>> {
        self.records
            .iter()
            .map(|(collection, seq, record)| DocumentWrite::Append {
                collection: *collection,
                seq: *seq,
                record,
            })
    }
}
