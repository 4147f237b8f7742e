//! The four account keys: two read-write, two read-only, so that either of a pair can be
//! regenerated while clients use the other. Kept in the data directory's `keys/` (one file
//! each), or given on the command line for this run only.

use std::{
    fmt, io,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::future::BoxFuture;
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
    /// `None`: the keys were given for this run, or are kept by a cluster.
    kept_in: Option<SecretsDir>,
    /// One regeneration at a time, so that the files and `keys` agree.
    regenerating: Mutex<()>,
    /// Kept by a cluster: every node's, replaced on any.
    shared: Option<Shared>,
}

/// Keys a cluster keeps for all its nodes (`cluster_keys`): a node replaces one there, and
/// confirms the ones it holds with it again and again.
pub trait SharedKeys: Send + Sync + fmt::Debug {
    /// Replaces the key in `slot` for every node; done once the cluster keeps it.
    fn replace(&self, slot: KeySlot, key: String) -> BoxFuture<'static, Result<(), String>>;

    /// How long after a replacement every node takes the new key and none the old one.
    fn settles_in(&self) -> Duration;
}

/// How long a cluster node accepts the keys it holds after it last began reading them from
/// the cluster: a key regenerated on any node stops working on every node at most this long
/// after the regeneration was answered.
pub const SHARED_KEYS_TRUSTED_FOR: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Shared {
    store: Arc<dyn SharedKeys>,
    /// When the last read that confirmed the keys began, in ms after `base`.
    confirmed_ms: AtomicU64,
    /// When this node last replaced a key itself, in ms after `base`: a read that began
    /// before it holds the old key, which it must not put back.
    set_ms: AtomicU64,
    base: Instant,
}

impl Shared {
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64
    }
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
            shared: None,
        })
    }

    /// Keys a cluster keeps (`store`), as read from it by a read that began at `read_at`.
    pub fn shared(keys: [String; 4], store: Arc<dyn SharedKeys>, read_at: Instant) -> Self {
        let ring = KeyRing {
            keys: RwLock::new(keys.map(Some)),
            kept_in: None,
            regenerating: Mutex::new(()),
            shared: Some(Shared {
                store,
                confirmed_ms: AtomicU64::new(0),
                set_ms: AtomicU64::new(0),
                base: read_at,
            }),
        };
        ring.confirmed(keys_unchanged(), read_at);
        ring
    }

    /// Where the keys are kept if a cluster keeps them.
    pub fn shared_store(&self) -> Option<Arc<dyn SharedKeys>> {
        self.shared.as_ref().map(|s| s.store.clone())
    }

    /// The cluster's keys, as read by a read that began at `read_at` (`None` for a slot: as
    /// held); they are trusted for [`SHARED_KEYS_TRUSTED_FOR`] from then.
    pub fn confirmed(&self, keys: [Option<String>; 4], read_at: Instant) {
        let Some(shared) = &self.shared else { return };
        let ms = shared.ms(read_at);
        {
            let mut held = self.keys.write();
            if ms >= shared.set_ms.load(Ordering::Acquire) {
                for (held, read) in held.iter_mut().zip(keys) {
                    if let Some(read) = read {
                        *held = Some(read);
                    }
                }
            }
        }
        shared.confirmed_ms.fetch_max(ms, Ordering::Release);
    }

    /// How long since the keys were last confirmed, once that is longer than they are trusted
    /// for (a cluster's keys only).
    pub fn unconfirmed_for(&self) -> Option<Duration> {
        let shared = self.shared.as_ref()?;
        let confirmed =
            shared.base + Duration::from_millis(shared.confirmed_ms.load(Ordering::Acquire));
        Some(confirmed.elapsed()).filter(|age| *age > SHARED_KEYS_TRUSTED_FOR)
    }

    /// Keys given for this run (a slot without a key accepts nothing).
    pub fn given(keys: [Option<String>; 4]) -> Self {
        KeyRing {
            keys: RwLock::new(keys),
            kept_in: None,
            regenerating: Mutex::new(()),
            shared: None,
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

    /// Puts `key` in `slot` here (a cluster's key, replaced in the cluster already).
    pub fn set(&self, slot: KeySlot, key: String) {
        let mut held = self.keys.write();
        if let Some(shared) = &self.shared {
            // Rounded up: a read that began in the same millisecond may predate the change.
            shared
                .set_ms
                .fetch_max(shared.ms(Instant::now()) + 1, Ordering::Release);
        }
        held[slot.index()] = Some(key);
    }

    /// Replaces the key in `slot`: written durably first, then in force. (A cluster's keys are
    /// replaced through [`KeyRing::shared_store`].)
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

/// No slot read: [`KeyRing::confirmed`] keeps every key as held.
fn keys_unchanged() -> [Option<String>; 4] {
    Default::default()
}

/// A new random key.
pub fn new_key() -> String {
    random_secret(KEY_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nowhere;

    impl SharedKeys for Nowhere {
        fn replace(&self, _: KeySlot, _: String) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(std::future::ready(Ok(())))
        }

        fn settles_in(&self) -> Duration {
            Duration::ZERO
        }
    }

    #[test]
    fn a_clusters_keys_are_trusted_only_for_a_while_after_a_read_began() {
        let keys = ["p", "s", "pr", "sr"].map(|k| k.repeat(20));
        let now = Instant::now();
        let ring = KeyRing::shared(
            keys.clone(),
            Arc::new(Nowhere),
            now - Duration::from_secs(3),
        );
        let age = ring.unconfirmed_for().expect("read 3 s ago");
        assert!(age >= Duration::from_secs(3), "{age:?}");
        ring.confirmed(keys.clone().map(Some), now);
        assert_eq!(ring.unconfirmed_for(), None);
        assert_eq!(ring.slot_of(&keys[0]), Some(KeySlot::Primary));
        // Replaced here: a read that began before does not bring the old key back; one that
        // began after brings what the cluster holds.
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        ring.set(KeySlot::Primary, "n".repeat(20));
        ring.confirmed(keys.clone().map(Some), before);
        assert_eq!(ring.slot_of(&keys[0]), None);
        assert_eq!(ring.slot_of(&"n".repeat(20)), Some(KeySlot::Primary));
        std::thread::sleep(Duration::from_millis(2));
        let mut later = keys.clone();
        later[0] = "m".repeat(20);
        ring.confirmed(later.map(Some), Instant::now());
        assert_eq!(ring.slot_of(&"m".repeat(20)), Some(KeySlot::Primary));
        assert!(ring.shared_store().is_some());
        assert!(
            KeyRing::given([None, None, None, None])
                .unconfirmed_for()
                .is_none()
        );
    }

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
