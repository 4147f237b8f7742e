//! Who is calling (from the `authorization` metadata) and whether they may do what they ask.
//! Every RPC handler asks both before it touches the engine. A resource token is held to its
//! scope by name, and to the identity of what it was minted for by uid ([`Resources`]).

use std::{fmt, sync::Arc};

use super::{
    keys::{KeyRing, KeySlot},
    token::{ResourceToken, TokenError},
};
use crate::{
    engine::{Clock, CollectionPath, Engine},
    model::{CollectionUid, DatabaseUid, Echo, IdKind, Millis, PartitionKeyValue, ResourceId},
};

/// Who sent a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Principal {
    /// The server runs without keys: everyone may do everything.
    Open,
    /// An account key.
    Key(KeySlot),
    /// A resource token.
    Token(ResourceToken),
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reads documents or settings, lists, feeds, queries.
    Read,
    /// Creates, replaces, touches or deletes documents.
    Write,
    /// Creates or deletes databases and collections, changes settings, keys and tokens.
    Manage,
}

/// What a request is about.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Every database (listing them, keys, tokens).
    Account,
    Database(&'a str),
    Collection {
        database: &'a str,
        collection: &'a str,
    },
    /// Documents of a collection; `partition` when the request names one.
    Documents {
        database: &'a str,
        collection: &'a str,
        partition: Option<&'a PartitionKeyValue>,
    },
}

impl<'a> Target<'a> {
    /// Collection `database/collection` itself (its settings).
    pub fn collection(database: &'a str, collection: &'a str) -> Self {
        Target::Collection {
            database,
            collection,
        }
    }

    /// Documents of `database/collection`, of one partition if the request names it.
    pub fn documents(
        database: &'a str,
        collection: &'a str,
        partition: Option<&'a PartitionKeyValue>,
    ) -> Self {
        Target::Documents {
            database,
            collection,
            partition,
        }
    }
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Account => f.write_str("the whole account"),
            Target::Database(d) => write!(f, "database '{}'", Echo(d)),
            Target::Collection {
                database,
                collection,
            } => write!(f, "collection '{}/{}'", Echo(database), Echo(collection)),
            Target::Documents {
                database,
                collection,
                partition: None,
            } => write!(
                f,
                "every partition of collection '{}/{}'",
                Echo(database),
                Echo(collection)
            ),
            Target::Documents {
                database,
                collection,
                partition: Some(pk),
            } => write!(
                f,
                "partition {pk} of collection '{}/{}'",
                Echo(database),
                Echo(collection)
            ),
        }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Denied {
    /// No `authorization` metadata.
    Missing,
    /// `authorization` is not `Bearer <key-or-token>`.
    Malformed,
    /// Not one of the server's keys.
    UnknownKey,
    /// A token that is altered or whose key was regenerated.
    InvalidToken,
    /// A token of the format before tokens were bound to resource identity (`mft1`).
    OutdatedToken,
    /// A token past its expiry.
    ExpiredToken { at: Millis, now: Millis },
    /// A read-only key asked to write or manage.
    ReadOnlyKey { action: Action },
    /// A read-only token asked to write.
    ReadOnlyToken,
    /// A token asked to manage.
    TokenCannotManage,
    /// A token asked for something outside its scope.
    OutOfScope { scope: String, target: String },
    /// The database or collection a token was minted for (`resource`, as [`Target`] names
    /// it) was deleted since; one of that name now, if any, is another.
    ResourceDeleted { resource: String },
    /// A cluster node has not confirmed the cluster's keys for `age_ms` ms, longer than it
    /// trusts them for: one may have been regenerated meanwhile.
    KeysUnconfirmed { age_ms: u64 },
}

impl Denied {
    /// UNAUTHENTICATED (who is calling is unknown) rather than PERMISSION_DENIED.
    pub fn unauthenticated(&self) -> bool {
        matches!(
            self,
            Denied::Missing
                | Denied::Malformed
                | Denied::UnknownKey
                | Denied::InvalidToken
                | Denied::OutdatedToken
                | Denied::ExpiredToken { .. }
        )
    }

    /// The `ErrorInfo.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Missing => "MISSING_CREDENTIALS",
            Denied::Malformed
            | Denied::UnknownKey
            | Denied::InvalidToken
            | Denied::OutdatedToken => "INVALID_CREDENTIALS",
            Denied::ExpiredToken { .. } => "TOKEN_EXPIRED",
            Denied::ReadOnlyKey { .. } => "READ_ONLY_KEY",
            Denied::ReadOnlyToken => "READ_ONLY_TOKEN",
            Denied::TokenCannotManage => "KEY_REQUIRED",
            Denied::OutOfScope { .. } => "OUT_OF_TOKEN_SCOPE",
            Denied::ResourceDeleted { .. } => "TOKEN_RESOURCE_DELETED",
            Denied::KeysUnconfirmed { .. } => "KEYS_UNCONFIRMED",
        }
    }

    /// UNAVAILABLE: the credential may be good, and a retry (here later, or at another node)
    /// may find it so.
    pub fn unavailable(&self) -> bool {
        matches!(self, Denied::KeysUnconfirmed { .. })
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::Missing => f.write_str(
                "this server needs a key or resource token: send the metadata `authorization: Bearer <key-or-token>`",
            ),
            Denied::Malformed => f.write_str(
                "the `authorization` metadata must be `Bearer <key-or-token>`",
            ),
            Denied::UnknownKey => f.write_str(
                "the key is not one of this server's keys (it may have been regenerated)",
            ),
            Denied::InvalidToken => f.write_str(
                "the resource token is not valid: it was altered, or the key that minted it has been regenerated since",
            ),
            Denied::OutdatedToken => f.write_str(
                "the resource token is of an earlier format (mft1), bound to names rather than to the resources it was minted for, and is no longer accepted; mint a new one",
            ),
            Denied::ExpiredToken { at, now } => write!(
                f,
                "the resource token expired {:.1} s ago (at {at} ms since the Unix epoch); mint a new one",
                now.saturating_sub(*at) as f64 / 1000.0
            ),
            Denied::ReadOnlyKey { action } => write!(
                f,
                "a read-only key can only read; {} needs a read-write key",
                match action {
                    Action::Manage => "managing databases, collections, keys and tokens",
                    Action::Write | Action::Read => "writing documents",
                }
            ),
            Denied::ReadOnlyToken => f.write_str(
                "this resource token is read-only; writing needs a token minted with permission ALL",
            ),
            Denied::TokenCannotManage => f.write_str(
                "resource tokens give access to documents only; managing databases, collections, keys and tokens needs a read-write key",
            ),
            Denied::OutOfScope { scope, target } => write!(
                f,
                "this resource token is scoped to {scope}; the request is for {target}"
            ),
            Denied::ResourceDeleted { resource } => write!(
                f,
                "this resource token was minted for {resource}, which has been deleted since; one created later under the same name is another resource, on which the token grants nothing: mint a new token"
            ),
            Denied::KeysUnconfirmed { age_ms } => write!(
                f,
                "this cluster node has not been able to confirm the cluster's keys with NATS for {:.1} s (a key regenerated meanwhile must not work here), so it accepts no key or token until it can; retry, or call another node",
                *age_ms as f64 / 1000.0
            ),
        }
    }
}

impl std::error::Error for Denied {}

/// Turns `authorization` metadata into a [`Principal`].
#[derive(Debug, Clone)]
pub struct Authenticator {
    keys: Option<Arc<KeyRing>>,
    clock: Arc<dyn Clock>,
}

impl Authenticator {
    /// No keys: every request is allowed (loopback or `--insecure-no-auth`).
    pub fn open(clock: Arc<dyn Clock>) -> Self {
        Authenticator { keys: None, clock }
    }

    /// Requests need one of `keys`, or a token one of them minted.
    pub fn with_keys(keys: KeyRing, clock: Arc<dyn Clock>) -> Self {
        Authenticator {
            keys: Some(Arc::new(keys)),
            clock,
        }
    }

    /// Requests need one of the keys a cluster keeps (`keys`, which the node keeps confirming
    /// with the cluster), or a token one of them minted.
    pub fn with_shared_keys(keys: Arc<KeyRing>, clock: Arc<dyn Clock>) -> Self {
        Authenticator {
            keys: Some(keys),
            clock,
        }
    }

    /// The keys, unless the server runs open.
    pub fn keys(&self) -> Option<&KeyRing> {
        self.keys.as_deref()
    }

    /// Now, by the clock tokens expire by.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Who sent a request with this `authorization` value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Denied> {
        let Some(keys) = &self.keys else {
            return Ok(Principal::Open);
        };
        let credential = bearer(authorization.ok_or(Denied::Missing)?)?;
        if let Some(age) = keys.unconfirmed_for() {
            return Err(Denied::KeysUnconfirmed {
                age_ms: age.as_millis() as u64,
            });
        }
        if ResourceToken::is_token(credential) {
            let now = self.clock.now();
            return match ResourceToken::verify(credential, keys, now) {
                Ok(token) => Ok(Principal::Token(token)),
                Err(TokenError::Invalid) => Err(Denied::InvalidToken),
                Err(TokenError::Outdated) => Err(Denied::OutdatedToken),
                Err(TokenError::Expired { at }) => Err(Denied::ExpiredToken { at, now }),
            };
        }
        keys.slot_of(credential)
            .map(Principal::Key)
            .ok_or(Denied::UnknownKey)
    }
}

/// The credential in an `authorization` value (`Bearer <key-or-token>`).
pub fn bearer(value: &str) -> Result<&str, Denied> {
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .ok_or(Denied::Malformed)
}

/// Who sent a request with these headers: its `authorization` value, as
/// [`Authenticator::authenticate`] judges it (a value that is not visible ASCII is malformed).
/// The server's edge checks it before a request message is read, and each RPC again.
pub fn authenticate_headers(
    auth: &Authenticator,
    headers: &http::HeaderMap,
) -> Result<Principal, Denied> {
    let authorization = match headers.get("authorization") {
        None => None,
        Some(value) => Some(value.to_str().map_err(|_| Denied::Malformed)?),
    };
    auth.authenticate(authorization)
}

/// The databases and collections there are now, by uid: what a resource token is checked
/// against, so that it grants nothing on a database or collection of the same name as the
/// one it was minted for, created after that one was deleted.
pub trait Resources {
    /// The uid of database `database`, if there is one.
    fn database_uid(&self, database: &str) -> Option<DatabaseUid>;

    /// The uid of collection `database/collection`, if there is one.
    fn collection_uid(&self, database: &str, collection: &str) -> Option<CollectionUid>;
}

/// No databases or collections: for requests about the account alone (keys, minting tokens),
/// which no token may make, so that the check needs no engine. (A token checked against it is
/// refused: nothing it was minted for is there.)
#[derive(Debug, Clone, Copy)]
pub struct NoResources;

impl Resources for NoResources {
    fn database_uid(&self, _: &str) -> Option<DatabaseUid> {
        None
    }

    fn collection_uid(&self, _: &str, _: &str) -> Option<CollectionUid> {
        None
    }
}

impl Resources for Engine {
    fn database_uid(&self, database: &str) -> Option<DatabaseUid> {
        self.get_database(&ResourceId::parse_stored(IdKind::Database, database).ok()?)
            .ok()
    }

    fn collection_uid(&self, database: &str, collection: &str) -> Option<CollectionUid> {
        let path = CollectionPath {
            database: ResourceId::parse_stored(IdKind::Database, database).ok()?,
            collection: ResourceId::parse_stored(IdKind::Collection, collection).ok()?,
        };
        self.get_collection(&path).ok().map(|info| info.uid)
    }
}

impl Principal {
    /// Whether this principal may do `action` on `target`, `resources` being the databases
    /// and collections there are now (a token is refused once what it was minted for is
    /// deleted).
    pub fn allow(
        &self,
        action: Action,
        target: Target<'_>,
        resources: &dyn Resources,
    ) -> Result<(), Denied> {
        match self {
            Principal::Open => Ok(()),
            Principal::Key(slot) if slot.read_write() || action == Action::Read => Ok(()),
            Principal::Key(_) => Err(Denied::ReadOnlyKey { action }),
            Principal::Token(token) => {
                match action {
                    Action::Manage => return Err(Denied::TokenCannotManage),
                    Action::Write if !token.write => return Err(Denied::ReadOnlyToken),
                    Action::Write | Action::Read => {}
                }
                if !token_covers(token, target) {
                    return Err(Denied::OutOfScope {
                        scope: token_scope(token),
                        target: target.to_string(),
                    });
                }
                // Within its scope by name: is it still what the token was minted for? (The
                // target is in the token's database, or collection, so these are the ones
                // it reaches.)
                if resources.database_uid(&token.database) != Some(token.database_uid) {
                    return Err(Denied::ResourceDeleted {
                        resource: Target::Database(&token.database).to_string(),
                    });
                }
                if let Some(collection) = &token.collection
                    && resources.collection_uid(&token.database, collection) != token.collection_uid
                {
                    return Err(Denied::ResourceDeleted {
                        resource: Target::collection(&token.database, collection).to_string(),
                    });
                }
                Ok(())
            }
        }
    }
}

fn token_covers(token: &ResourceToken, target: Target<'_>) -> bool {
    let collection_matches =
        |collection: &str| token.collection.as_deref().is_none_or(|c| c == collection);
    match target {
        Target::Account => false,
        // Listing a database's collections shows more than one collection.
        Target::Database(database) => token.database == database && token.collection.is_none(),
        // Any token within a collection may read its settings (clients need its partition
        // key path).
        Target::Collection {
            database,
            collection,
        } => token.database == database && collection_matches(collection),
        Target::Documents {
            database,
            collection,
            partition,
        } => {
            token.database == database
                && collection_matches(collection)
                && match (&token.partition_key, partition) {
                    (None, _) => true,
                    (Some(scoped), Some(asked)) => scoped == asked,
                    // A request without a partition key may reach every partition.
                    (Some(_), None) => false,
                }
        }
    }
}

fn token_scope(token: &ResourceToken) -> String {
    let database = Target::Database(&token.database);
    match (&token.collection, &token.partition_key) {
        (None, _) => database.to_string(),
        (Some(collection), None) => Target::collection(&token.database, collection).to_string(),
        (Some(collection), Some(pk)) => format!(
            "{}: set partition_key on the request",
            Target::Documents {
                database: &token.database,
                collection,
                partition: Some(pk),
            }
        ),
    }
}
