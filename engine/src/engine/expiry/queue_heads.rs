//! Which collection's inherit queue is due first, per shard. The purge serves inherit queues
//! earliest head first, so a collection is never starved behind others however many there
//! are, and finding the next due queue costs a lookup, not a pass over every collection.

use std::collections::BTreeSet;

use crate::engine::{CollectionUid, Millis};

/// Each collection whose inherit queue has a head that will come due, by that instant.
#[derive(Debug, Default)]
pub(crate) struct QueueHeads {
    set: BTreeSet<(Millis, CollectionUid)>,
}

impl QueueHeads {
    /// Moves collection `uid`'s entry from `*current` to `due` (`None`: no entry).
    pub(crate) fn update(
        &mut self,
        uid: CollectionUid,
        current: &mut Option<Millis>,
        due: Option<Millis>,
    ) {
        if *current == due {
            return;
        }
        if let Some(old) = current.take() {
            self.set.remove(&(old, uid));
        }
        if let Some(due) = due {
            self.set.insert((due, uid));
        }
        *current = due;
    }

    /// The collection due first, and when.
    pub(crate) fn first(&self) -> Option<(Millis, CollectionUid)> {
        self.set.first().copied()
    }

    /// When the collection after the first is due.
    pub(crate) fn second_due(&self) -> Option<Millis> {
        self.set.iter().nth(1).map(|&(due, _)| due)
    }

    /// Collections due at or before `now`.
    pub(crate) fn due_by(&self, now: Millis) -> impl Iterator<Item = CollectionUid> + '_ {
        self.set
            .iter()
            .take_while(move |&&(due, _)| due <= now)
            .map(|&(_, uid)| uid)
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_move_and_order_by_due_then_collection() {
        let mut heads = QueueHeads::default();
        let (mut a, mut b, mut c) = (None, None, None);
        heads.update(CollectionUid(1), &mut a, Some(30));
        heads.update(CollectionUid(2), &mut b, Some(10));
        heads.update(CollectionUid(3), &mut c, Some(10));
        assert_eq!(heads.first(), Some((10, CollectionUid(2))));
        assert_eq!(heads.second_due(), Some(10));
        heads.update(CollectionUid(2), &mut b, Some(40));
        assert_eq!(b, Some(40));
        assert_eq!(heads.first(), Some((10, CollectionUid(3))));
        assert_eq!(
            heads.due_by(30).collect::<Vec<_>>(),
            [CollectionUid(3), CollectionUid(1)]
        );
        heads.update(CollectionUid(3), &mut c, None);
        heads.update(CollectionUid(1), &mut a, None);
        assert_eq!(heads.len(), 1);
        assert_eq!(heads.first(), Some((40, CollectionUid(2))));
    }
}
