//! The secrets a data directory keeps: `keys/` (mode 0700) holds one file per secret (mode
//! 0600), so that an operator reads a key with `cat` and replaces one without editing a
//! format. Each file is written whole (temporary file, fsync, rename, fsync of the directory):
//! a crash leaves the old secret or the new one, never half of either.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};

/// Directory of the secrets inside a data directory.
pub const SECRETS_DIR: &str = "keys";

/// A data directory's `keys/`.
#[derive(Debug, Clone)]
pub struct SecretsDir {
    path: PathBuf,
}

impl SecretsDir {
    /// `keys/` of `data_dir`, created (0700) if missing.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        let path = data_dir.join(SECRETS_DIR);
        match fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Ok(SecretsDir { path })
    }

    /// Where secret `name` lives.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Secret `name`, created from `make` (and kept) on first use.
    pub fn get_or_create(&self, name: &str, make: impl FnOnce() -> String) -> io::Result<String> {
        match fs::read_to_string(self.path_of(name)) {
            Ok(text) => Ok(text.trim().to_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let value = make();
                self.replace(name, &value)?;
                Ok(value)
            }
            Err(e) => Err(e),
        }
    }

    /// Replaces secret `name` durably.
    pub fn replace(&self, name: &str, value: &str) -> io::Result<()> {
        let tmp = self.path.join(format!(".{name}.tmp"));
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A file left by an older run may carry wider permissions than `mode` sets on create.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(value.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        fs::rename(&tmp, self.path_of(name))?;
        File::open(&self.path)?.sync_all()
    }
}

/// `bytes` random bytes as URL-safe base64: keys and secrets.
pub fn random_secret(bytes: usize) -> String {
    let mut raw = vec![0; bytes];
    getrandom::fill(&mut raw).expect("the OS random source works");
    URL_SAFE_NO_PAD.encode(raw)
}

/// A secret written by [`random_secret`] as the 32 bytes it encodes, if it is one.
pub fn secret_bytes(text: &str) -> Option<[u8; 32]> {
    URL_SAFE_NO_PAD.decode(text).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_created_once_private_and_replaced_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let secrets = SecretsDir::open(dir.path()).expect("opens");
        let first = secrets
            .get_or_create("primary", || random_secret(32))
            .expect("created");
        assert_eq!(secret_bytes(&first).map(|b| b.len()), Some(32));
        let again = SecretsDir::open(dir.path())
            .expect("reopens")
            .get_or_create("primary", || unreachable!("kept"))
            .expect("read");
        assert_eq!(first, again);
        let mode = |p: &Path| fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode(&secrets.path_of("primary")), 0o600);
        assert_eq!(mode(&dir.path().join(SECRETS_DIR)), 0o700);
        secrets.replace("primary", "new").expect("replaced");
        assert_eq!(
            fs::read_to_string(secrets.path_of("primary")).expect("read"),
            "new\n"
        );
    }
}
