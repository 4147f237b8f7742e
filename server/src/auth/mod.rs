//! Who may do what: the secrets a data directory keeps, the four account keys, resource
//! tokens, and the check every RPC makes ([`Authenticator`], [`Principal::allow`]). Nothing here
//! knows gRPC: the edge hands in the `authorization` value and maps [`Denied`] to a status.

mod access;
mod keys;
mod secrets;
mod token;

pub use access::{
    Action, Authenticator, Denied, NoResources, Principal, Resources, Target, authenticate_headers,
    bearer,
};
pub use keys::{
    KeyAdminError, KeyRing, KeySlot, MIN_GIVEN_KEY_CHARS, SHARED_KEYS_TRUSTED_FOR, SharedKeys,
    new_key,
};
pub use secrets::{SECRETS_DIR, SecretsDir, random_secret, secret_bytes};
pub use token::{DEFAULT_TOKEN_SECS, MAX_TOKEN_SECS, ResourceToken, TokenError};
