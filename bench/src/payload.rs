//! Document payloads: random text, different for every document.
//!
//! A repeated character compresses to almost nothing, which flatters on-disk size and makes
//! the storage engine's work unrealistically light. Random letters and digits are about as
//! incompressible as text gets (real JSON compresses better), so figures measured with them
//! are the conservative ones.

/// Bytes of random text that payloads are cut from; large enough that two payloads in the same
/// storage block almost never overlap (which a compressor could exploit).
const POOL_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub(crate) struct Payloads {
    pool: String,
    len: usize,
}

impl Payloads {
    /// Payloads of `len` bytes each.
    pub(crate) fn new(len: usize) -> Self {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        // xorshift64: a benchmark needs varied bytes, not cryptographic randomness.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let pool = (0..POOL_BYTES + len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(ALPHABET[(state % ALPHABET.len() as u64) as usize])
            })
            .collect();
        Payloads { pool, len }
    }

    /// Document `n`'s payload.
    pub(crate) fn get(&self, n: u64) -> &str {
        // A multiplicative hash spreads consecutive documents across the pool.
        let offset = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44) as usize % POOL_BYTES;
        &self.pool[offset..offset + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_have_the_length_asked_and_differ() {
        let payloads = Payloads::new(1000);
        assert_eq!(payloads.get(0).len(), 1000);
        assert_eq!(payloads.get(u64::MAX).len(), 1000);
        assert_ne!(payloads.get(1), payloads.get(2));
    }
}
