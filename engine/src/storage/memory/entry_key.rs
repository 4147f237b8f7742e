//! The memory backend's key for an index entry: the entry's bytes, with their head inline.
//!
//! An ordered map of `Vec<u8>` keeps every key on the heap, so each comparison of a lookup (a
//! dozen per tree level) is a cache miss; removing a purged document's entries was over half of
//! the memory purge's CPU, most of it in those misses. Here the first [`HEAD`] bytes sit in the
//! map's node (a term's path, type and the start of its value), which decides most
//! comparisons without touching the heap.

use std::cmp::Ordering;

/// Bytes kept inline, as big-endian words: compared as integers, in byte order.
const HEAD_WORDS: usize = 3;
const HEAD: usize = HEAD_WORDS * 8;

/// An entry key that orders exactly as its bytes do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EntryKey {
    /// The first bytes, zero-padded.
    head: [u64; HEAD_WORDS],
    /// The bytes after the head (empty if the key fits in it).
    rest: Box<[u8]>,
    /// The key's length, up to `HEAD` (only a key that fits in the head needs it, to tell
    /// `ab` from `ab\0`).
    short_len: u8,
}

impl EntryKey {
    pub(super) fn new(bytes: &[u8]) -> Self {
        let n = bytes.len().min(HEAD);
        let mut padded = [0; HEAD];
        padded[..n].copy_from_slice(&bytes[..n]);
        let mut head = [0; HEAD_WORDS];
        for (word, chunk) in head.iter_mut().zip(padded.chunks_exact(8)) {
            *word = u64::from_be_bytes(chunk.try_into().expect("8 bytes"));
        }
        EntryKey {
            head,
            rest: bytes[n..].into(),
            short_len: u8::try_from(n).expect("HEAD fits in a byte"),
        }
    }

    /// Writes the key's bytes over `out` (a scan reuses one buffer for all its entries).
    pub(super) fn write_to(&self, out: &mut Vec<u8>) {
        out.clear();
        for word in self.head {
            out.extend_from_slice(&word.to_be_bytes());
        }
        out.truncate(usize::from(self.short_len));
        out.extend_from_slice(&self.rest);
    }
}

impl Ord for EntryKey {
    /// Byte order. The heads decide unless equal: zero padding puts a shorter key before any
    /// key it starts, except one that goes on with zeros, which the rests and then the lengths
    /// decide.
    fn cmp(&self, other: &Self) -> Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.rest.cmp(&other.rest))
            .then_with(|| self.short_len.cmp(&other.short_len))
    }
}

impl PartialOrd for EntryKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of every length around the head's, with zeros and 0xFF at the edges, order as
    /// their bytes do and give their bytes back.
    #[test]
    fn orders_as_bytes() {
        let mut keys: Vec<Vec<u8>> = vec![Vec::new()];
        for len in [1, 2, HEAD - 1, HEAD, HEAD + 1, HEAD + 5] {
            for fill in [0u8, 1, 0x7F, 0xFF] {
                let mut k = vec![b'a'; len];
                *k.last_mut().expect("len > 0") = fill;
                keys.push(k.clone());
                k[0] = fill;
                keys.push(k);
            }
        }
        for a in &keys {
            let ka = EntryKey::new(a);
            let mut bytes = vec![7; 3];
            ka.write_to(&mut bytes);
            assert_eq!(&bytes, a);
            for b in &keys {
                assert_eq!(ka.cmp(&EntryKey::new(b)), a.cmp(b), "{a:?} against {b:?}");
            }
        }
    }
}
