//! Byte layouts both backends give index entries and terms records.
//!
//! An entry's key is `prefix | term | partition key | id` (the prefix names the collection,
//! the term is self-delimiting and order-preserving, the document key is the documents' own
//! encoding), so one term's entries, one path's and one collection's are each a key range; its
//! value is the term's length, which is how a scan splits the key again. A terms record is
//! `version (u64) | count (u32) | (length (u16) | term)*`.

use std::ops::Bound;

/// The layout of the terms in index entries (made by the engine's `index::terms`), kept in
/// each collection's record: entries of an older layout are made again at start (layout 2
/// sorts long strings among the others by their prefix).
pub const TERMS_LAYOUT: u64 = 2;

use super::{DocKey, IndexEntry, IndexRange, StorageError, StoredTerms, Term};
use crate::model::{DocumentId, IdKind, PartitionKeyValue};

/// The key of one entry.
pub(super) fn entry_key(prefix: &[u8], term: &[u8], key: &DocKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + term.len() + 32);
    out.extend_from_slice(prefix);
    out.extend_from_slice(term);
    key.partition_key.encode_ordered(&mut out);
    out.extend_from_slice(key.id.as_str().as_bytes());
    out
}

/// The value stored with an entry: its term's length.
pub(super) fn entry_value(term: &[u8]) -> [u8; 2] {
    u16::try_from(term.len())
        .expect("terms are bounded far below 64 KiB")
        .to_be_bytes()
}

fn corrupt(what: &str) -> StorageError {
    StorageError::new(format!("corrupt {what} in the index"))
}

/// Splits an entry's key (with `prefix_len` bytes of prefix) by the length in its value.
pub(super) fn decode_entry(
    prefix_len: usize,
    key: &[u8],
    value: &[u8],
) -> Result<IndexEntry, StorageError> {
    let bad = || corrupt("index entry");
    let len = usize::from(u16::from_be_bytes(value.try_into().map_err(|_| bad())?));
    let rest = key.get(prefix_len..).ok_or_else(bad)?;
    let (term, doc) = rest.split_at_checked(len).ok_or_else(bad)?;
    let (partition_key, id) = PartitionKeyValue::decode_ordered(doc).ok_or_else(bad)?;
    let id = std::str::from_utf8(id).map_err(|_| bad())?;
    let id = DocumentId::parse_stored(IdKind::Document, id).map_err(|_| bad())?;
    Ok(IndexEntry {
        term: term.to_vec(),
        key: DocKey { partition_key, id },
    })
}

/// The smallest byte string greater than every string `prefix` starts: the exclusive end of a
/// prefix scan (`None` if there is none: every byte is `0xFF`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The key bounds of a scan of `range` under `prefix`.
pub(super) fn scan_bounds(
    prefix: &[u8],
    range: &IndexRange<'_>,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let with_prefix = |b: &[u8]| [prefix, b].concat();
    let mut low = Bound::Included(with_prefix(range.low));
    let mut high = match range.high {
        Some(h) => Bound::Excluded(with_prefix(h)),
        // The end of the prefix's keys.
        None => match prefix_end(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        },
    };
    if let Some(after) = range.after {
        let at = entry_key(prefix, &after.term, &after.key);
        if range.descending {
            high = tighter_high(high, at);
        } else {
            low = tighter_low(low, at);
        }
    }
    (low, high)
}

/// Whether bounds select nothing (`BTreeMap::range` panics on such bounds).
pub(super) fn is_empty(bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> bool {
    match bounds {
        (Bound::Included(l), Bound::Included(h)) => l > h,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(h))
        | (Bound::Excluded(l), Bound::Included(h)) => l >= h,
        _ => false,
    }
}

fn tighter_low(low: Bound<Vec<u8>>, after: Vec<u8>) -> Bound<Vec<u8>> {
    match low {
        Bound::Included(l) if l > after => Bound::Included(l),
        _ => Bound::Excluded(after),
    }
}

fn tighter_high(high: Bound<Vec<u8>>, before: Vec<u8>) -> Bound<Vec<u8>> {
    match high {
        Bound::Excluded(h) if h <= before => Bound::Excluded(h),
        _ => Bound::Excluded(before),
    }
}

/// The terms `update` removes (old, not new) and adds (new, not old); both lists are sorted.
pub(super) fn changed_terms<'a>(
    old: &'a [Term],
    new: &'a [Term],
) -> (Vec<&'a Term>, Vec<&'a Term>) {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o == n => {
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if o < n => {
                removed.push(o);
                i += 1;
            }
            (Some(o), None) => {
                removed.push(o);
                i += 1;
            }
            (_, Some(n)) => {
                added.push(n);
                j += 1;
            }
            (None, None) => unreachable!("the loop condition"),
        }
    }
    (removed, added)
}

/// A terms record.
pub(super) fn encode_terms(version: u64, terms: &[Term]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + terms.iter().map(|t| t.len() + 2).sum::<usize>());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&u32::try_from(terms.len()).unwrap_or(u32::MAX).to_be_bytes());
    for t in terms {
        out.extend_from_slice(&entry_value(t));
        out.extend_from_slice(t);
    }
    out
}

pub(super) fn decode_terms(value: &[u8]) -> Result<StoredTerms, StorageError> {
    let bad = || corrupt("terms record");
    let version = u64::from_be_bytes(
        value
            .get(..8)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let count = u32::from_be_bytes(
        value
            .get(8..12)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let mut rest = &value[12..];
    let mut terms = Vec::with_capacity((count as usize).min(rest.len() / 2));
    for _ in 0..count {
        let (len, after) = rest.split_at_checked(2).ok_or_else(bad)?;
        let len = usize::from(u16::from_be_bytes(len.try_into().map_err(|_| bad())?));
        let (term, after) = after.split_at_checked(len).ok_or_else(bad)?;
        terms.push(term.to_vec());
        rest = after;
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok(StoredTerms { version, terms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_records_round_trip() {
        let key = DocKey {
            partition_key: PartitionKeyValue::String("p\u{0}q".into()),
            id: DocumentId::parse(IdKind::Document, "doc-1").expect("valid"),
        };
        let term = vec![b'a', 0, 1, 0, 0, 0x30, 1, 2, 3, 4, 5, 6, 7, 8];
        let k = entry_key(b"PFX", &term, &key);
        let e = decode_entry(3, &k, &entry_value(&term)).expect("decodes");
        assert_eq!(
            e,
            IndexEntry {
                term: term.clone(),
                key
            }
        );
        let record = StoredTerms {
            version: 9,
            terms: vec![term, vec![1]],
        };
        assert_eq!(
            decode_terms(&encode_terms(9, &record.terms)).expect("decodes"),
            record
        );
        assert!(decode_terms(&[0; 5]).is_err());
    }

    #[test]
    fn changed_terms_are_the_differences() {
        let t = |b: u8| vec![b];
        let (old, new) = ([t(1), t(2), t(4)], [t(2), t(3), t(5)]);
        let (removed, added) = changed_terms(&old, &new);
        assert_eq!(removed, vec![&t(1), &t(4)]);
        assert_eq!(added, vec![&t(3), &t(5)]);
    }
}
