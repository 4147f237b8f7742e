//! The cluster's secrets at rest on the NATS servers (docs/cluster.md, "Security"): the four
//! account keys in `mayfly-keys` and the continuation key in `mayfly-cluster`. With
//! `--cluster-key-file` (32 random bytes, written as 64 hex digits; every node of the cluster
//! is given the same file) each value is sealed with ChaCha20-Poly1305 under that key, its
//! name as associated data (a value moved to another name does not open), so that the NATS
//! servers, their disks and their backups hold nothing a client could use. Without it the
//! values are kept as they are, and NATS permissions must keep the buckets to the nodes.
//!
//! A sealed value is `mfs1:` then the 12-byte nonce and the ciphertext with its tag. A node
//! refuses a value sealed when it has no key, a value in clear when it has one, and a value
//! its key does not open: a cluster's nodes either all have the same key file or none has.

use std::path::Path;

use ring::{
    aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    rand::{SecureRandom, SystemRandom},
};

/// What a sealed value starts with.
const SEALED: &[u8] = b"mfs1:";

/// Seals and opens the cluster's secrets (see the module's note).
pub(crate) struct ClusterSeal {
    key: Option<LessSafeKey>,
}

impl std::fmt::Debug for ClusterSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSeal")
            .field("sealed", &self.key.is_some())
            .finish()
    }
}

impl ClusterSeal {
    /// Values kept as they are.
    pub(crate) fn clear() -> Self {
        ClusterSeal { key: None }
    }

    /// The key in `path`: 64 hex digits (`openssl rand -hex 32`), surrounding whitespace
    /// ignored.
    pub(crate) fn from_file(path: &Path) -> Result<Self, String> {
        let named = |why: &str| format!("--cluster-key-file {}: {why}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| named(&e.to_string()))?;
        let hex = text.trim();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(named(
                "not 64 hex digits (make one with `openssl rand -hex 32`)",
            ));
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|e| named(&e.to_string()))?;
        }
        Ok(Self::with_key(bytes))
    }

    fn with_key(bytes: [u8; 32]) -> Self {
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes).expect("a 32-byte key");
        ClusterSeal {
            key: Some(LessSafeKey::new(key)),
        }
    }

    /// `value` as stored under `name`: sealed with the key if there is one.
    pub(crate) fn seal(&self, name: &str, value: &[u8]) -> Vec<u8> {
        let Some(key) = &self.key else {
            return value.to_vec();
        };
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the OS random source works");
        let mut sealed = value.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(name.as_bytes()),
            &mut sealed,
        )
        .expect("a value far below ChaCha20-Poly1305's limit");
        let mut out = Vec::with_capacity(SEALED.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(SEALED);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The value stored under `name`, opened; why not, in words an operator can act on.
    pub(crate) fn open(&self, name: &str, stored: &[u8]) -> Result<Vec<u8>, String> {
        match (&self.key, stored.strip_prefix(SEALED)) {
            (None, None) => Ok(stored.to_vec()),
            (None, Some(_)) => Err(format!(
                "the cluster's {name} is sealed with a cluster key: give this node the cluster's --cluster-key-file"
            )),
            (Some(_), None) => Err(format!(
                "the cluster's {name} is stored in clear, but this node has a --cluster-key-file: every node of a cluster has the same key file, or none has, from the cluster's start"
            )),
            (Some(key), Some(sealed)) => {
                if sealed.len() < NONCE_LEN {
                    return Err(format!("the cluster's {name} is cut short"));
                }
                let (nonce, body) = sealed.split_at(NONCE_LEN);
                let nonce = Nonce::try_assume_unique_for_key(nonce).expect("NONCE_LEN bytes");
                let mut body = body.to_vec();
                let opened = key
                    .open_in_place(nonce, Aad::from(name.as_bytes()), &mut body)
                    .map_err(|_| {
                        format!(
                            "the cluster's {name} does not open with this node's --cluster-key-file (the nodes' key files differ?)"
                        )
                    })?;
                Ok(opened.to_vec())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_under_its_name_and_key() {
        let seal = ClusterSeal::with_key([7; 32]);
        let sealed = seal.seal("primary", b"the-primary-key-value");
        assert!(sealed.starts_with(SEALED));
        assert!(
            !sealed
                .windows(b"primary-key".len())
                .any(|w| w == b"primary-key"),
            "nothing of the value in clear"
        );
        assert_ne!(
            sealed,
            seal.seal("primary", b"the-primary-key-value"),
            "a fresh nonce"
        );
        assert_eq!(
            seal.open("primary", &sealed).expect("opens"),
            b"the-primary-key-value"
        );
        assert!(seal.open("secondary", &sealed).is_err(), "another name");
        assert!(
            ClusterSeal::with_key([8; 32])
                .open("primary", &sealed)
                .expect_err("refused")
                .contains("does not open")
        );
        let mut flipped = sealed.clone();
        *flipped.last_mut().expect("bytes") ^= 1;
        assert!(seal.open("primary", &flipped).is_err(), "tampered");
        assert!(
            ClusterSeal::clear()
                .open("primary", &sealed)
                .expect_err("refused")
                .contains("give this node")
        );
        assert!(
            seal.open("primary", b"in-clear")
                .expect_err("refused")
                .contains("stored in clear")
        );
        assert_eq!(
            ClusterSeal::clear()
                .open("primary", b"in-clear")
                .expect("clear"),
            b"in-clear"
        );
        assert_eq!(ClusterSeal::clear().seal("primary", b"x"), b"x");
    }

    #[test]
    fn a_key_file_is_64_hex_digits() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("cluster.key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).expect("write");
        let seal = ClusterSeal::from_file(&path).expect("a key");
        assert_eq!(seal.open("k", &seal.seal("k", b"v")).expect("opens"), b"v");
        for bad in ["ab".repeat(31), "zz".repeat(32), String::new()] {
            std::fs::write(&path, bad).expect("write");
            assert!(
                ClusterSeal::from_file(&path)
                    .expect_err("refused")
                    .contains("64 hex digits")
            );
        }
    }
}
