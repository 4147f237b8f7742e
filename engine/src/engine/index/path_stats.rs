//! Per path, how many of a collection shard's documents have an index entry there, and how
//! many of those entries do not sort by their bytes. `ORDER BY` reads a path's entries in
//! order; the documents without one (undefined there, which sorts first) it finds by a bit:
//! the first 64 paths counted each get one, and every document keeps the bits of the paths it
//! has entries at ([`PathBits`]), so they are found in memory without reading anything.

use std::collections::HashMap;

use super::terms;
use crate::storage::Term;

/// Paths counted per collection shard. A collection with more distinct paths stops counting
/// new ones (their `ORDER BY` reads documents instead).
const MAX_COUNTED_PATHS: usize = 1024;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct PathCount {
    /// Documents with an entry at the path.
    pub(in crate::engine) documents: u64,
    /// Of those, entries that do not sort by their bytes (long strings, arrays, objects).
    pub(in crate::engine) unorderable: u64,
    /// The bit documents with an entry here have set in their [`PathBits`], if it has one.
    pub(in crate::engine) bit: Option<u8>,
}

/// Which of its collection shard's bit-holding paths a document has index entries at.
pub(in crate::engine) type PathBits = u64;

/// How one document's [`PathBits`] change with an update of its terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[must_use = "the document's bits follow its terms"]
pub(in crate::engine) struct BitChange {
    clear: PathBits,
    set: PathBits,
}

impl BitChange {
    pub(in crate::engine) fn apply(self, bits: PathBits) -> PathBits {
        (bits & !self.clear) | self.set
    }
}

#[derive(Debug)]
pub(in crate::engine) struct PathStats {
    counts: HashMap<Vec<u8>, PathCount>,
    /// A path went uncounted for want of room: absent paths are then unknown, not zero.
    overflowed: bool,
    /// Bits no counted path holds. A path frees its bit when no document has it any more, so
    /// no document has a free bit set.
    free_bits: PathBits,
}

impl Default for PathStats {
    fn default() -> Self {
        Self {
            counts: HashMap::new(),
            overflowed: false,
            free_bits: PathBits::MAX,
        }
    }
}

impl PathStats {
    /// Counts one document's `added` terms in and `removed` ones out; its bits change by
    /// what this returns.
    pub(in crate::engine) fn update(&mut self, removed: &[Term], added: &[Term]) -> BitChange {
        let mut change = BitChange::default();
        for t in removed {
            let path = terms::term_path(t);
            if let Some(c) = self.counts.get_mut(path) {
                c.documents -= 1;
                c.unorderable -= u64::from(!terms::is_orderable(t));
                if let Some(bit) = c.bit {
                    change.clear |= 1 << bit;
                    change.set &= !(1 << bit);
                }
                if c.documents == 0 {
                    if let Some(bit) = c.bit.take() {
                        self.free_bits |= 1 << bit;
                    }
                    if !self.overflowed {
                        self.counts.remove(path);
                    }
                }
            }
        }
        for t in added {
            let path = terms::term_path(t);
            if !self.counts.contains_key(path) {
                if self.overflowed || self.counts.len() >= MAX_COUNTED_PATHS {
                    self.overflowed = true;
                    continue;
                }
                self.counts.insert(path.to_vec(), PathCount::default());
            }
            let count = self.counts.get_mut(path).expect("inserted above");
            if count.documents == 0 && count.bit.is_none() && self.free_bits != 0 {
                let bit = self.free_bits.trailing_zeros() as u8;
                self.free_bits &= !(1 << bit);
                count.bit = Some(bit);
            }
            count.documents += 1;
            count.unorderable += u64::from(!terms::is_orderable(t));
            if let Some(bit) = count.bit {
                change.set |= 1 << bit;
            }
        }
        change
    }

    /// The counts at an encoded path, if known.
    pub(in crate::engine) fn get(&self, path: &[u8]) -> Option<PathCount> {
        match self.counts.get(path) {
            Some(c) => Some(*c),
            None if self.overflowed => None,
            None => Some(PathCount::default()),
        }
    }
}

/// Whether a shard can serve an `ORDER BY` on a path from its index, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OrderSupport {
    /// The path's bit, which documents with an entry there have.
    pub(crate) bit: Option<u8>,
    /// Documents without an entry at the path (some may be expired, not yet purged).
    pub(crate) undefined: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn term(path: &str, v: serde_json::Value) -> Term {
        let mut t = terms::path_prefix(&[path]).expect("short");
        terms::push_value(&v, &mut t);
        t
    }

    #[test]
    fn counts_and_bits_follow_updates() {
        let mut s = PathStats::default();
        let p = terms::path_prefix(&["a"]).expect("short");
        let one = s
            .update(&[], &[term("a", json!(1)), term("b", json!(2))])
            .apply(0);
        let two = s.update(&[], &[term("a", json!([1]))]).apply(0);
        assert_eq!(
            s.get(&p),
            Some(PathCount {
                documents: 2,
                unorderable: 1,
                bit: Some(0),
            })
        );
        assert_eq!((one, two), (0b11, 0b01));
        let two = s
            .update(&[term("a", json!([1]))], &[term("a", json!("x"))])
            .apply(two);
        assert_eq!(two, 0b01, "a value change keeps the path's bit");
        assert_eq!(s.get(&p).map(|c| c.unorderable), Some(0));
        let one = s.update(&[term("a", json!(1))], &[]).apply(one);
        assert_eq!(one, 0b10);
        let two = s.update(&[term("a", json!("x"))], &[]).apply(two);
        assert_eq!((two, s.get(&p)), (0, Some(PathCount::default())));
        // The freed bit goes to the next new path.
        assert_eq!(s.update(&[], &[term("c", json!(1))]).apply(0), 0b01);
    }

    #[test]
    fn paths_past_the_64th_have_no_bit() {
        let mut s = PathStats::default();
        let all: Vec<Term> = (0..70)
            .map(|i| term(&format!("p{i:02}"), json!(i)))
            .collect();
        let bits = s.update(&[], &all).apply(0);
        assert_eq!(bits, PathBits::MAX);
        let with_bit = (0..70)
            .filter(|i| {
                s.get(&terms::path_prefix(&[format!("p{i:02}")]).expect("short"))
                    .and_then(|c| c.bit)
                    .is_some()
            })
            .count();
        assert_eq!(with_bit, 64);
    }

    #[test]
    fn past_the_cap_unknown_paths_are_unknown() {
        let mut s = PathStats::default();
        for i in 0..=MAX_COUNTED_PATHS {
            let _ = s.update(&[], &[term(&format!("p{i}"), json!(1))]);
        }
        assert_eq!(
            s.get(&terms::path_prefix(&["p0"]).expect("short"))
                .map(|c| c.documents),
            Some(1)
        );
        assert_eq!(
            s.get(&terms::path_prefix(&[format!("p{MAX_COUNTED_PATHS}")]).expect("short")),
            None
        );
        assert_eq!(s.get(&terms::path_prefix(&["never"]).expect("short")), None);
    }
}
