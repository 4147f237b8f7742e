//! Who may do what: the secrets a data directory keeps, account keys, resource tokens, and
//! the check every RPC makes.

mod secrets;

pub use secrets::{SECRETS_DIR, SecretsDir, random_secret, secret_bytes};
