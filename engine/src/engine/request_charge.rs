//! Request units: what an operation cost, shaped like Azure Cosmos DB's charges (README,
//! "Request units"). A charge is a pure function of what the operation did (bytes read or
//! written, index terms written or removed, documents and index entries examined), so the
//! same operation on the same data always costs the same. Held in hundredths of a unit: sums
//! are exact and the wire shows at most two decimals, as Cosmos does.
//!
//! The expiry purge, the change feed's expiry events and the lazy indexer are never charged:
//! they are not requests (and a lazy collection's writes are charged without the index terms
//! the indexer writes later).

use std::{fmt, ops::Add};

/// Bytes in the kilobyte the rates below are per (1 KiB).
const KB: u64 = 1024;

/// A charge, in hundredths of a request unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestCharge(u64);

impl RequestCharge {
    /// Nothing: a request refused before it did any work (bad input, no access, throttled).
    pub const ZERO: RequestCharge = RequestCharge(0);

    /// The smallest charge of a request that reached the data: a point read of a missing
    /// document, or a write refused by a condition or a conflict (the lookup that found it).
    pub const LOOKUP: RequestCharge = RequestCharge(100);

    /// From hundredths of a unit.
    pub const fn from_hundredths(hundredths: u64) -> Self {
        RequestCharge(hundredths)
    }

    /// From request units as the wire carries them (two decimals); anything but a finite,
    /// non-negative number is nothing.
    pub fn from_units(units: f64) -> Self {
        match units.is_finite() && units >= 0.0 {
            true => RequestCharge((units * 100.0).round() as u64),
            false => RequestCharge::ZERO,
        }
    }

    /// In hundredths of a unit.
    pub const fn hundredths(self) -> u64 {
        self.0
    }

    /// In request units.
    pub fn units(self) -> f64 {
        self.0 as f64 / 100.0
    }

    /// A point read of a document whose stored body is `bytes` long: 1 unit up to 1 KB, then
    /// rising linearly to 10 units at 100 KB (Cosmos's published figures for 1 KB and 100 KB).
    pub fn point_read(bytes: usize) -> Self {
        let over = (bytes as u64).saturating_sub(KB);
        RequestCharge(100 + over * 900 / (99 * KB))
    }

    /// A create, upsert, replace or patch writing a body of `bytes`, with `terms` index terms
    /// written or removed (the terms of the new version not in the old, and of the old not in
    /// the new): 4 units, 1 per KB written, 0.1 per term.
    pub fn write(bytes: usize, terms: usize) -> Self {
        RequestCharge(400 + per_kb(bytes, 100) + 10 * terms as u64)
    }

    /// A touch rewriting a body of `bytes` with the same index terms: 2 units and 0.5 per KB,
    /// cheaper than the rewrite of the same document.
    pub fn touch(bytes: usize) -> Self {
        RequestCharge(200 + per_kb(bytes, 50))
    }

    /// A delete of a document with `terms` index terms: 4 units and 0.1 per term removed.
    pub fn delete(terms: usize) -> Self {
        RequestCharge(400 + 10 * terms as u64)
    }

    /// A page of a query or of a read feed: 2.5 units for the page, 0.02 per index entry
    /// read, 0.3 per document read and evaluated, and 0.1 per KB of results returned.
    pub fn page(index_entries: u64, documents: u64, returned_bytes: usize) -> Self {
        RequestCharge(250 + 2 * index_entries + 30 * documents + per_kb(returned_bytes, 10))
    }

    /// A batch of the change feed with `events` events of `bytes` in all, expiry events not
    /// counted (they are free): 1 unit for a batch with any, 0.3 per event and 0.1 per KB; a
    /// heartbeat or a batch of expiry events only is free.
    pub fn change_batch(events: u64, bytes: usize) -> Self {
        if events == 0 {
            return RequestCharge::ZERO;
        }
        RequestCharge(100 + 30 * events + per_kb(bytes, 10))
    }

    /// A request about databases, collections, keys or throughput (no documents read).
    pub const fn metadata() -> Self {
        RequestCharge(100)
    }
}

/// `rate` hundredths per KB of `bytes`, rounded down.
fn per_kb(bytes: usize, rate: u64) -> u64 {
    bytes as u64 * rate / KB
}

impl Add for RequestCharge {
    type Output = RequestCharge;
    fn add(self, other: RequestCharge) -> RequestCharge {
        RequestCharge(self.0.saturating_add(other.0))
    }
}

impl std::iter::Sum for RequestCharge {
    fn sum<I: Iterator<Item = RequestCharge>>(iter: I) -> Self {
        iter.fold(RequestCharge::ZERO, Add::add)
    }
}

/// As the `x-request-charge` header shows it: units with two decimals ("5.71").
impl fmt::Display for RequestCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.0 / 100, self.0 % 100)
    }
}

/// How many of two sorted, deduplicated term lists' terms are in one only: what replacing
/// `old` by `new` writes and removes in the index.
pub(crate) fn changed_terms<T: Ord>(old: &[T], new: &[T]) -> usize {
    let (mut i, mut j, mut changed) = (0, 0, 0);
    while i < old.len() && j < new.len() {
        match old[i].cmp(&new[j]) {
            std::cmp::Ordering::Less => {
                changed += 1;
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                changed += 1;
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    changed + (old.len() - i) + (new.len() - j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_read_is_one_unit_to_1_kb_and_ten_at_100_kb() {
        assert_eq!(RequestCharge::point_read(0).to_string(), "1.00");
        assert_eq!(RequestCharge::point_read(1024).to_string(), "1.00");
        assert_eq!(RequestCharge::point_read(100 * 1024).to_string(), "10.00");
        assert_eq!(RequestCharge::point_read(2 * 1024).to_string(), "1.09");
    }

    #[test]
    fn charges_are_monotone_in_size_and_in_terms() {
        let sizes = [0, 1, 100, 1023, 1024, 1025, 4096, 65_536, 2 << 20];
        for pair in sizes.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(RequestCharge::point_read(a) <= RequestCharge::point_read(b));
            assert!(RequestCharge::write(a, 5) <= RequestCharge::write(b, 5));
            assert!(RequestCharge::touch(a) <= RequestCharge::touch(b));
            assert!(RequestCharge::page(3, 2, a) <= RequestCharge::page(3, 2, b));
            assert!(RequestCharge::change_batch(2, a) <= RequestCharge::change_batch(2, b));
        }
        for terms in 0..50 {
            assert!(RequestCharge::write(1024, terms) < RequestCharge::write(1024, terms + 1));
            assert!(RequestCharge::delete(terms) < RequestCharge::delete(terms + 1));
        }
        assert!(RequestCharge::page(10, 1, 0) < RequestCharge::page(11, 1, 0));
        assert!(RequestCharge::page(10, 1, 0) < RequestCharge::page(10, 2, 0));
    }

    #[test]
    fn the_same_operation_costs_the_same() {
        for _ in 0..3 {
            assert_eq!(RequestCharge::write(1000, 12).hundredths(), 617);
            assert_eq!(RequestCharge::page(40, 10, 5000).hundredths(), 678);
        }
    }

    #[test]
    fn a_touch_is_cheaper_than_a_rewrite_and_expiry_events_are_free() {
        for bytes in [0, 1024, 100 * 1024] {
            assert!(RequestCharge::touch(bytes) < RequestCharge::write(bytes, 0));
        }
        assert_eq!(RequestCharge::change_batch(0, 0), RequestCharge::ZERO);
    }

    #[test]
    fn sums_are_exact_and_shown_with_two_decimals() {
        let total: RequestCharge = [RequestCharge::from_hundredths(571); 3].into_iter().sum();
        assert_eq!(total.to_string(), "17.13");
        assert_eq!(total.units(), 17.13);
        assert_eq!(RequestCharge::from_hundredths(5).to_string(), "0.05");
        assert_eq!(
            RequestCharge::from_units(5.71),
            RequestCharge::from_hundredths(571)
        );
        assert_eq!(RequestCharge::from_units(f64::NAN), RequestCharge::ZERO);
        assert_eq!(RequestCharge::from_units(-1.0), RequestCharge::ZERO);
    }

    #[test]
    fn changed_terms_counts_the_symmetric_difference() {
        assert_eq!(changed_terms::<u8>(&[], &[1, 2, 3]), 3);
        assert_eq!(changed_terms(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(changed_terms(&[1, 2, 3], &[2, 3, 4]), 2);
        assert_eq!(changed_terms(&[1, 5], &[]), 2);
    }
}
