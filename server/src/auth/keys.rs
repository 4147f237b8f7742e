//! The four account keys: two read-write, two read-only, so that either of a pair can be
//! regenerated while clients use the other. Kept in the data directory's `keys/` (one file
//! each), or given on the command line for this run only.

use std::{fmt, io};

use parking_lot::{Mutex, RwLock};
use subtle::ConstantTimeEq;

use super::secrets::{SecretsDir, random_secret};

/// One of the four keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySlot {
    Primary,
    Secondary,
    PrimaryReadOnly,
    SecondaryReadOnly,
}

impl KeySlot {
    /// Every slot, in file order.
    pub const ALL: [KeySlot; 4] = [
        KeySlot::Primary,
        KeySlot::Secondary,
        KeySlot::PrimaryReadOnly,
        KeySlot::SecondaryReadOnly,
    ];

    /// The file in `keys/` holding it.
    pub fn file_name(self) -> &'static str {
        match self {
            KeySlot::Primary => "primary",
            KeySlot::Secondary => "secondary",
            KeySlot::PrimaryReadOnly => "primary-readonly",
            KeySlot::SecondaryReadOnly => "secondary-readonly",
        }
    }

    /// Whether it may write and manage.
    pub fn read_write(self) -> bool {
        matches!(self, KeySlot::Primary | KeySlot::Secondary)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for KeySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeySlot::Primary => "primary key",
            KeySlot::Secondary => "secondary key",
            KeySlot::PrimaryReadOnly => "primary read-only key",
            KeySlot::SecondaryReadOnly => "secondary read-only key",
        })
    }
}

/// Bytes of randomness in a generated key (encoded as 43 characters of URL-safe base64).
const KEY_BYTES: usize = 32;

/// Shortest key accepted from the command line: a short key is a guessable one.
pub const MIN_GIVEN_KEY_CHARS: usize = 16;

/// The keys in force, and where they are kept.
#[derive(Debug)]
pub struct KeyRing {
    keys: RwLock<[Option<String>; 4]>,
    /// `None`: the keys were given for this run and cannot be regenerated.
    kept_in: Option<SecretsDir>,
    /// One regeneration at a time, so that the files and `keys` agree.
    regenerating: Mutex<()>,
}

/// Why a key could not be regenerated or a token minted.
#[derive(Debug)]
pub enum KeyAdminError {
    /// The server runs without keys.
    NoKeys,
    /// The keys were given on the command line or in the environment.
    Given,
    /// The new key could not be written; the old one stays in force.
    Io(io::Error),
}

impl fmt::Display for KeyAdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyAdminError::NoKeys => f.write_str(
                "this server runs without keys (--insecure-no-auth, or memory storage on loopback with none given): there is no key to regenerate or to mint tokens with",
            ),
            KeyAdminError::Given => f.write_str(
                "this server's keys were given on its command line or environment: change them there and restart",
            ),
            KeyAdminError::Io(e) => write!(f, "the new key could not be written, the old one stays in force: {e}"),
        }
    }
}

impl std::error::Error for KeyAdminError {}

impl KeyRing {
    /// The keys of a data directory's `keys/`, each generated on first start.
    pub fn kept_in(secrets: SecretsDir) -> io::Result<Self> {
        let mut keys: [Option<String>; 4] = Default::default();
        for slot in KeySlot::ALL {
            keys[slot.index()] =
                Some(secrets.get_or_create(slot.file_name(), || random_secret(KEY_BYTES))?);
        }
        Ok(KeyRing {
            keys: RwLock::new(keys),
            kept_in: Some(secrets),
            regenerating: Mutex::new(()),
        })
    }

    /// Keys given for this run (a slot without a key accepts nothing).
    pub fn given(keys: [Option<String>; 4]) -> Self {
        KeyRing {
            keys: RwLock::new(keys),
            kept_in: None,
            regenerating: Mutex::new(()),
        }
    }

    /// The slot whose key `presented` is, comparing in constant time against every key.
    pub fn slot_of(&self, presented: &str) -> Option<KeySlot> {
        let keys = self.keys.read();
        let mut found = None;
        for slot in KeySlot::ALL {
            if let Some(key) = &keys[slot.index()] {
                // `ct_eq` on slices returns false at once for unequal lengths: a key's length
                // is not a secret (generated keys all have the same).
                if bool::from(key.as_bytes().ct_eq(presented.as_bytes())) {
                    found = Some(slot);
                }
            }
        }
        found
    }

    /// The key in `slot` (to verify the tokens it minted).
    pub fn key(&self, slot: KeySlot) -> Option<String> {
        self.keys.read()[slot.index()].clone()
    }

    /// Replaces the key in `slot`: written durably first, then in force.
    pub fn regenerate(&self, slot: KeySlot) -> Result<String, KeyAdminError> {
        let Some(secrets) = &self.kept_in else {
            return Err(KeyAdminError::Given);
        };
        let key = random_secret(KEY_BYTES);
        // The file first (fsynced), then memory: requests authenticating meanwhile take the
        // read lock and never wait on the disk.
        let _one_at_a_time = self.regenerating.lock();
        secrets
            .replace(slot.file_name(), &key)
            .map_err(KeyAdminError::Io)?;
        self.keys.write()[slot.index()] = Some(key.clone());
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_kept_found_by_value_and_regenerated_one_at_a_time() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ring = KeyRing::kept_in(SecretsDir::open(dir.path()).expect("dir")).expect("keys");
        let primary = ring.key(KeySlot::Primary).expect("made");
        let secondary = ring.key(KeySlot::Secondary).expect("made");
        assert_ne!(primary, secondary);
        assert_eq!(ring.slot_of(&primary), Some(KeySlot::Primary));
        assert_eq!(ring.slot_of("nope"), None);
        assert_eq!(ring.slot_of(&primary[..primary.len() - 1]), None);

        let new = ring.regenerate(KeySlot::Primary).expect("regenerated");
        assert_eq!(ring.slot_of(&primary), None, "the old key stops working");
        assert_eq!(ring.slot_of(&new), Some(KeySlot::Primary));
        assert_eq!(ring.slot_of(&secondary), Some(KeySlot::Secondary));

        let reopened = KeyRing::kept_in(SecretsDir::open(dir.path()).expect("dir")).expect("keys");
        assert_eq!(reopened.slot_of(&new), Some(KeySlot::Primary), "kept");

        let given = KeyRing::given([Some("k".repeat(20)), None, None, None]);
        assert_eq!(given.slot_of(&"k".repeat(20)), Some(KeySlot::Primary));
        assert!(matches!(
            given.regenerate(KeySlot::Secondary),
            Err(KeyAdminError::Given)
        ));
    }
}
