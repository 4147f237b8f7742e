//! Per path, how many of a collection shard's documents have an index entry there, and how
//! many of those entries do not sort by their bytes. `ORDER BY` on a path can read the index
//! in order only if every document has an entry there (none is undefined, which sorts first)
//! and every entry is orderable; these counts tell, without reading anything.

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
}

#[derive(Debug, Default)]
pub(in crate::engine) struct PathStats {
    counts: HashMap<Vec<u8>, PathCount>,
    /// A path went uncounted for want of room: absent paths are then unknown, not zero.
    overflowed: bool,
}

impl PathStats {
    /// Counts `added` terms in and `removed` ones out.
    pub(in crate::engine) fn update(&mut self, removed: &[Term], added: &[Term]) {
        for t in removed {
            let path = terms::term_path(t);
            if let Some(c) = self.counts.get_mut(path) {
                c.documents -= 1;
                c.unorderable -= u64::from(!terms::is_orderable(t));
                if c.documents == 0 && !self.overflowed {
                    self.counts.remove(path);
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
            count.documents += 1;
            count.unorderable += u64::from(!terms::is_orderable(t));
        }
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
    fn counts_follow_updates() {
        let mut s = PathStats::default();
        let p = terms::path_prefix(&["a"]).expect("short");
        s.update(&[], &[term("a", json!(1)), term("b", json!(2))]);
        s.update(&[], &[term("a", json!([1]))]);
        assert_eq!(
            s.get(&p),
            Some(PathCount {
                documents: 2,
                unorderable: 1
            })
        );
        s.update(&[term("a", json!([1]))], &[term("a", json!("x"))]);
        assert_eq!(
            s.get(&p),
            Some(PathCount {
                documents: 2,
                unorderable: 0
            })
        );
        s.update(&[term("a", json!(1)), term("a", json!("x"))], &[]);
        assert_eq!(s.get(&p), Some(PathCount::default()));
    }

    #[test]
    fn past_the_cap_unknown_paths_are_unknown() {
        let mut s = PathStats::default();
        for i in 0..=MAX_COUNTED_PATHS {
            s.update(&[], &[term(&format!("p{i}"), json!(1))]);
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
