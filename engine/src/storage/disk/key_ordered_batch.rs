//! A write batch handed to fjall in key order.
//!
//! fjall applies a batch to each keyspace's memtable (a skip list) one key at a time, each
//! insert a fresh walk from the top. A purge batch deletes hundreds of documents' index entries,
//! scattered over the whole index: in arrival order every walk misses the CPU caches at almost
//! every level. In key order, consecutive walks share all but their last few levels, which are
//! then still cached.

use fjall::{Keyspace, OwnedWriteBatch};

/// One change: the keyspace (compared by address, which only groups a batch's changes by
/// keyspace), the key, and the value (`None`: a delete).
struct Item<'a> {
    keyspace: &'a Keyspace,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
}

/// Collects a batch's changes, then passes them to fjall sorted by keyspace and key.
pub(super) struct KeyOrderedBatch<'a> {
    items: Vec<Item<'a>>,
}

impl<'a> KeyOrderedBatch<'a> {
    pub(super) fn new() -> Self {
        KeyOrderedBatch { items: Vec::new() }
    }

    pub(super) fn insert(&mut self, keyspace: &'a Keyspace, key: Vec<u8>, value: Vec<u8>) {
        self.items.push(Item {
            keyspace,
            key,
            value: Some(value),
        });
    }

    pub(super) fn remove(&mut self, keyspace: &'a Keyspace, key: Vec<u8>) {
        self.items.push(Item {
            keyspace,
            key,
            value: None,
        });
    }

    /// Moves the changes into `batch`, in order. The sort is stable: two changes of one key
    /// keep the order they were made in.
    pub(super) fn apply_to(mut self, batch: &mut OwnedWriteBatch) {
        self.items.sort_by(|a, b| {
            std::ptr::from_ref(a.keyspace)
                .cmp(&std::ptr::from_ref(b.keyspace))
                .then_with(|| a.key.cmp(&b.key))
        });
        for item in self.items {
            match item.value {
                Some(value) => batch.insert(item.keyspace, item.key, value),
                None => batch.remove(item.keyspace, item.key),
            }
        }
    }
}
