//! Resource tokens, as in Cosmos DB: read or read-write access to one database, collection or
//! partition, until an expiry. A token is `mft2.<p|s>.<claims>.<tag>`: the read-write key that
//! minted it (primary or secondary), its claims as URL-safe base64 JSON, and an HMAC-SHA256
//! tag under that key. Regenerating the key revokes every token it minted.
//!
//! The claims name the database and collection and carry their uids: a token is bound to the
//! resources it was minted for, not to their names, and grants nothing on a database or
//! collection created later under the same name (see `Principal::allow`). Tokens of the
//! earlier format, `mft1`, carried names only and are refused.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::keys::{KeyRing, KeySlot};
use crate::model::{CollectionUid, DatabaseUid, Millis, PartitionKeyValue};

const VERSION: &str = "mft2";
/// The format before tokens carried uids: refused, with a word on why.
const OUTDATED_VERSION: &str = "mft1";
/// Separates token MACs from any other use of the keys (the format's version is in what is
/// signed).
const DOMAIN: &[u8] = b"mayfly resource token v1\n";
/// Longest token worth looking at: real ones are a few hundred bytes (ids are at most 255
/// characters, a partition key 2 KiB).
const MAX_TOKEN_CHARS: usize = 8 * 1024;

/// Default and longest lifetime of a token, in seconds.
pub const DEFAULT_TOKEN_SECS: u32 = 3600;
pub const MAX_TOKEN_SECS: u32 = 24 * 3600;

/// What a token grants.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceToken {
    /// The read-write key that minted it.
    pub minted_by: KeySlot,
    pub database: String,
    /// Which database named `database` it was minted for.
    pub database_uid: DatabaseUid,
    /// `None`: every collection of the database.
    pub collection: Option<String>,
    /// Which collection named `collection` it was minted for: `Some` exactly when
    /// `collection` is.
    pub collection_uid: Option<CollectionUid>,
    /// `None`: every partition of the collection.
    pub partition_key: Option<PartitionKeyValue>,
    /// Document writes too, not only reads.
    pub write: bool,
    pub expires_at: Millis,
}

/// Why a presented token is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenError {
    /// Not a token, altered, or minted with a key that was regenerated since.
    Invalid,
    /// A token of the earlier format (`mft1`), bound to names rather than resources.
    Outdated,
    /// Valid, but past its expiry.
    Expired { at: Millis },
}

fn mac(key: &str, signed: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key.as_bytes())
        .expect("HMAC takes any key length");
    mac.update(DOMAIN);
    mac.update(signed.as_bytes());
    mac
}

fn slot_letter(slot: KeySlot) -> Option<&'static str> {
    match slot {
        KeySlot::Primary => Some("p"),
        KeySlot::Secondary => Some("s"),
        KeySlot::PrimaryReadOnly | KeySlot::SecondaryReadOnly => None,
    }
}

impl ResourceToken {
    /// The token text, signed with `key` (the key in `self.minted_by`, a read-write one).
    pub fn mint(&self, key: &str) -> String {
        let letter = slot_letter(self.minted_by).expect("tokens are minted by read-write keys");
        let mut pk = Vec::new();
        if let Some(value) = &self.partition_key {
            value.encode_ordered(&mut pk);
        }
        let claims = json!({
            "db": self.database,
            "dbUid": self.database_uid.0,
            "coll": self.collection,
            "collUid": self.collection_uid.map(|uid| uid.0),
            "pk": self.partition_key.as_ref().map(|_| URL_SAFE_NO_PAD.encode(&pk)),
            "write": self.write,
            "exp": self.expires_at,
        });
        let signed = format!(
            "{VERSION}.{letter}.{}",
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let tag = mac(key, &signed).finalize().into_bytes();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// Whether `text` looks like a token (as opposed to a key), of this format or an earlier.
    pub fn is_token(text: &str) -> bool {
        [VERSION, OUTDATED_VERSION].iter().any(|version| {
            text.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('.'))
        })
    }

    /// The token `text` stands for, if a current key of `keys` minted it and it is not
    /// expired at `now`.
    pub fn verify(text: &str, keys: &KeyRing, now: Millis) -> Result<Self, TokenError> {
        if text.len() > MAX_TOKEN_CHARS {
            return Err(TokenError::Invalid);
        }
        if text
            .strip_prefix(OUTDATED_VERSION)
            .is_some_and(|rest| rest.starts_with('.'))
        {
            return Err(TokenError::Outdated);
        }
        let (signed, tag) = text.rsplit_once('.').ok_or(TokenError::Invalid)?;
        let mut parts = signed.split('.');
        let (Some(VERSION), Some(letter), Some(claims), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Invalid);
        };
        let minted_by = match letter {
            "p" => KeySlot::Primary,
            "s" => KeySlot::Secondary,
            _ => return Err(TokenError::Invalid),
        };
        let key = keys.key(minted_by).ok_or(TokenError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Invalid)?;
        mac(&key, signed)
            .verify_slice(&tag)
            .map_err(|_| TokenError::Invalid)?;
        // Authentic from here on: the claims are ours.
        let claims: Value = URL_SAFE_NO_PAD
            .decode(claims)
            .ok()
            .and_then(|raw| serde_json::from_slice(&raw).ok())
            .ok_or(TokenError::Invalid)?;
        let text_of = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
        let number = |name: &str| claims.get(name).and_then(Value::as_u64);
        let collection = text_of("coll");
        let collection_uid = number("collUid").map(CollectionUid);
        if collection.is_some() != collection_uid.is_some() {
            return Err(TokenError::Invalid);
        }
        let partition_key = match claims.get("pk").and_then(Value::as_str) {
            None => None,
            Some(encoded) => {
                let raw = URL_SAFE_NO_PAD
                    .decode(encoded)
                    .map_err(|_| TokenError::Invalid)?;
                match PartitionKeyValue::decode_ordered(&raw) {
                    Some((value, [])) => Some(value),
                    _ => return Err(TokenError::Invalid),
                }
            }
        };
        let token = ResourceToken {
            minted_by,
            database: text_of("db").ok_or(TokenError::Invalid)?,
            database_uid: DatabaseUid(number("dbUid").ok_or(TokenError::Invalid)?),
            collection,
            collection_uid,
            partition_key,
            write: claims
                .get("write")
                .and_then(Value::as_bool)
                .ok_or(TokenError::Invalid)?,
            expires_at: claims
                .get("exp")
                .and_then(Value::as_u64)
                .ok_or(TokenError::Invalid)?,
        };
        if now >= token.expires_at {
            return Err(TokenError::Expired {
                at: token.expires_at,
            });
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        KeyRing::given([
            Some("p".repeat(32)),
            Some("s".repeat(32)),
            Some("r".repeat(32)),
            None,
        ])
    }

    fn token(slot: KeySlot) -> ResourceToken {
        ResourceToken {
            minted_by: slot,
            database: "d".into(),
            database_uid: DatabaseUid(3),
            collection: Some("c".into()),
            collection_uid: Some(CollectionUid(u64::MAX)),
            partition_key: Some(PartitionKeyValue::string("ü/1").expect("short")),
            write: true,
            expires_at: 10_000,
        }
    }

    #[test]
    fn tokens_verify_until_expiry_under_the_key_that_minted_them() {
        let keys = ring();
        for slot in [KeySlot::Primary, KeySlot::Secondary] {
            let minted = token(slot);
            let text = minted.mint(&keys.key(slot).expect("key"));
            assert!(ResourceToken::is_token(&text));
            assert_eq!(ResourceToken::verify(&text, &keys, 9_999), Ok(minted));
            assert_eq!(
                ResourceToken::verify(&text, &keys, 10_000),
                Err(TokenError::Expired { at: 10_000 })
            );
        }
        let scoped_to_database = ResourceToken {
            collection: None,
            collection_uid: None,
            partition_key: None,
            write: false,
            ..token(KeySlot::Primary)
        };
        let text = scoped_to_database.mint(&keys.key(KeySlot::Primary).expect("key"));
        assert_eq!(
            ResourceToken::verify(&text, &keys, 0),
            Ok(scoped_to_database)
        );
    }

    #[test]
    fn altered_or_revoked_tokens_are_invalid() {
        let keys = ring();
        let text = token(KeySlot::Primary).mint(&keys.key(KeySlot::Primary).expect("key"));
        for at in 0..text.len() {
            let mut altered = text.clone().into_bytes();
            altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).expect("ascii");
            assert!(
                ResourceToken::verify(&altered, &keys, 0).is_err(),
                "character {at} changed still verifies"
            );
        }
        // The same claims under the other key's letter do not verify.
        let swapped = text.replacen("mft2.p.", "mft2.s.", 1);
        assert_eq!(
            ResourceToken::verify(&swapped, &keys, 0),
            Err(TokenError::Invalid)
        );
        let other = ring();
        let dir = tempfile::tempdir().expect("temp dir");
        let kept = KeyRing::kept_in(super::super::SecretsDir::open(dir.path()).expect("dir"))
            .expect("keys");
        let minted = token(KeySlot::Primary).mint(&kept.key(KeySlot::Primary).expect("key"));
        assert!(ResourceToken::verify(&minted, &kept, 0).is_ok());
        kept.regenerate(KeySlot::Primary).expect("regenerated");
        assert_eq!(
            ResourceToken::verify(&minted, &kept, 0),
            Err(TokenError::Invalid),
            "regenerating the key revokes its tokens"
        );
        assert!(ResourceToken::verify(&minted, &other, 0).is_err());
        assert!(ResourceToken::verify(&"x".repeat(MAX_TOKEN_CHARS + 1), &keys, 0).is_err());
    }

    /// Signs `claims` as a token of format `version` under the primary key of [`ring`].
    fn signed(version: &str, claims: &Value) -> String {
        let signed = format!("{version}.p.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
        let tag = mac(&"p".repeat(32), &signed).finalize().into_bytes();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    #[test]
    fn tokens_carry_the_uids_of_what_they_were_minted_for() {
        let keys = ring();
        let minted = token(KeySlot::Primary);
        let text = minted.mint(&keys.key(KeySlot::Primary).expect("key"));
        assert!(text.starts_with("mft2.p."), "{text}");
        let verified = ResourceToken::verify(&text, &keys, 0).expect("verifies");
        assert_eq!(verified.database_uid, DatabaseUid(3));
        assert_eq!(verified.collection_uid, Some(CollectionUid(u64::MAX)));
        // Claims without the uids, or with a collection's name and not its uid, are no token
        // this server mints, however well signed.
        for claims in [
            json!({"db": "d", "coll": null, "collUid": null, "pk": null, "write": false, "exp": 5}),
            json!({"db": "d", "dbUid": 3, "coll": "c", "collUid": null, "pk": null, "write": false, "exp": 5}),
            json!({"db": "d", "dbUid": 3, "coll": null, "collUid": 4, "pk": null, "write": false, "exp": 5}),
            json!({"db": "d", "dbUid": -3, "coll": null, "collUid": null, "pk": null, "write": false, "exp": 5}),
        ] {
            assert_eq!(
                ResourceToken::verify(&signed(VERSION, &claims), &keys, 0),
                Err(TokenError::Invalid),
                "{claims}"
            );
        }
        let database_only = json!({"db": "d", "dbUid": 3, "coll": null, "collUid": null, "pk": null, "write": false, "exp": 5});
        assert!(ResourceToken::verify(&signed(VERSION, &database_only), &keys, 0).is_ok());
    }

    /// Tokens of the format before uids (`mft1`, names only) are refused as outdated, however
    /// well signed: they could grant access to a later resource of the same name.
    #[test]
    fn tokens_of_the_earlier_format_are_outdated() {
        let keys = ring();
        let old = signed(
            "mft1",
            &json!({"db": "d", "coll": "c", "pk": null, "write": true, "exp": 10_000}),
        );
        assert!(ResourceToken::is_token(&old), "not taken for a key");
        assert_eq!(
            ResourceToken::verify(&old, &keys, 0),
            Err(TokenError::Outdated)
        );
        assert!(!ResourceToken::is_token("mft2-not-a-token"));
    }
}
