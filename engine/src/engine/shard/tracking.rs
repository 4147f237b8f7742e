//! Starting and stopping the tracking of a document's expiry: a timer for an own ttl, an
//! inherit-queue entry for a document that follows its collection's default.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;

/// Gives an own-ttl document in `slot` the timer its collection's rules call for and returns
/// when it fires; `None` leaves it untimed (TTL is off). The one place an own-ttl document is
/// timed: on a write, when TTL is turned on, when a timer fires early, and at recovery.
pub(in crate::engine) fn time_own_ttl(
    wheel: &mut TimerWheel,
    meta: &mut DocMeta,
    slot: u32,
    rules: &Rules,
) -> Option<Millis> {
    debug_assert!(matches!(meta.ttl, Some(DocumentTtl::After(_))));
    let due = meta.own_ttl_due(rules)?;
    meta.tracking = Tracking::Timer(wheel.schedule(due, slot));
    Some(due)
}

/// Starts tracking a document's expiry according to its collection's current rules. Documents
/// that inherit always join the queue (even while TTL is off or -1) so that any later default
/// applies to them in write order; own-ttl documents get a timer only while TTL is on.
pub(in crate::engine) fn attach(
    docs: &mut DocSlab,
    wheel: &mut TimerWheel,
    heads: &mut QueueHeads,
    cs: &mut CollectionShard,
    r: SlotRef,
) -> Option<Millis> {
    let meta = docs.get_mut(r.slot);
    debug_assert_eq!(meta.tracking, Tracking::None);
    match meta.ttl {
        None => {
            cs.inherit.push(meta.last_write, r);
            meta.tracking = Tracking::Queue;
            let due = cs.inheritor_due(meta.last_write);
            if due.is_some_and(|d| cs.head_due.is_none_or(|h| d < h)) {
                cs.refresh_head(heads);
            }
            due
        }
        Some(DocumentTtl::Never) => None,
        Some(DocumentTtl::After(_)) => time_own_ttl(wheel, meta, r.slot, &cs.rules),
    }
}

/// Stops tracking a document's expiry.
pub(in crate::engine) fn detach(
    docs: &mut DocSlab,
    wheel: &mut TimerWheel,
    cs: &mut CollectionShard,
    slot: u32,
) {
    let meta = docs.get_mut(slot);
    match mem::replace(&mut meta.tracking, Tracking::None) {
        Tracking::None | Tracking::Unscheduled => {}
        Tracking::Timer(handle) => {
            wheel.cancel(handle);
        }
        Tracking::Queue => {
            let docs = &*docs;
            cs.inherit
                .forget_one(|r| docs.is_current(r) && docs.get(r.slot).tracking == Tracking::Queue);
        }
    }
}
