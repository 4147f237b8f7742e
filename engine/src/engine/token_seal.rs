//! Continuation tokens leave the server and come back from clients: each carries an
//! HMAC-SHA256 tag (truncated to 16 bytes) under a secret of the server's, so a token that was
//! altered, or made up, is refused instead of resuming a read somewhere else.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::model::InvalidInput;

/// Bytes of tag each token carries: 128 bits, well past guessing.
const TAG_BYTES: usize = 16;

/// The secret tokens are sealed with. A data directory keeps its own, so tokens survive a
/// restart; without one, each process draws a new one.
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// A key from the operating system's random source.
    pub fn random() -> Self {
        let mut key = [0; 32];
        getrandom::fill(&mut key).expect("the OS random source works");
        TokenKey(key)
    }

    /// A key kept elsewhere (a data directory's secrets).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        TokenKey(key)
    }

    /// The key's bytes, to keep it elsewhere (a cluster's settings).
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }

    /// `payload` with its tag, as URL-safe base64.
    #[doc(hidden)]
    pub fn seal(&self, payload: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(payload);
        let tag = mac.finalize().into_bytes();
        let mut out = Vec::with_capacity(payload.len() + TAG_BYTES);
        out.extend_from_slice(payload);
        out.extend_from_slice(&tag[..TAG_BYTES]);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The payload of a token [`seal`](Self::seal) made with this key; anything else is
    /// refused (in constant time for the tag).
    #[doc(hidden)]
    pub fn open(&self, token: &str) -> Result<Vec<u8>, InvalidInput> {
        let forged = InvalidInput::Continuation {
            reason: "it was altered or not issued by this server (or its data directory was replaced)",
        };
        let mut bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| forged.clone())?;
        let Some(at) = bytes.len().checked_sub(TAG_BYTES) else {
            return Err(forged);
        };
        let mut mac = self.mac();
        mac.update(&bytes[..at]);
        mac.verify_truncated_left(&bytes[at..])
            .map_err(|_| forged)?;
        bytes.truncate(at);
        Ok(bytes)
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_token_opens_and_every_single_change_is_refused() {
        let key = TokenKey::random();
        let payload = b"shard 3 after key k".to_vec();
        let token = key.seal(&payload);
        assert_eq!(key.open(&token), Ok(payload.clone()));
        assert!(
            TokenKey::random().open(&token).is_err(),
            "another server's key"
        );
        let raw = URL_SAFE_NO_PAD.decode(&token).expect("base64");
        for at in 0..raw.len() {
            for bit in 0..8 {
                let mut flipped = raw.clone();
                flipped[at] ^= 1 << bit;
                let result = key.open(&URL_SAFE_NO_PAD.encode(&flipped));
                assert!(result.is_err(), "byte {at} bit {bit} still opens");
            }
        }
        for bad in ["", "AAAA", "not base64!", &token[..token.len() - 1]] {
            assert!(key.open(bad).is_err(), "{bad:?}");
        }
    }
}
