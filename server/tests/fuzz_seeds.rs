//! Replays the committed seed corpus of every fuzz target (`fuzz/seeds/<target>/`) through the
//! entry functions the fuzz targets call (`mayfly_server::fuzz_entry`), so that
//! `cargo test` checks on every change what the fuzzers start from. A target without seeds
//! fails. To replay a crash a fuzz run found, copy the artifact into the target's seeds.
//!
//! The seeds that need the fixture's keys (sealed continuation tokens, minted resource tokens)
//! are written by `cargo test -p mayfly-server --test fuzz_seeds -- --ignored`.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use mayfly_server::fuzz_entry::{TARGETS, generated_seeds};

fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds")
}

fn seeds_of(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = seeds_dir().join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, bytes)
        })
        .collect()
}

fn replay(target: &str) {
    let (_, entry) = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a target of fuzz_entry");
    let seeds = seeds_of(target);
    assert!(
        !seeds.is_empty(),
        "fuzz/seeds/{target}/ has no seeds: the fuzzer would start from nothing"
    );
    let started = Instant::now();
    for (path, bytes) in &seeds {
        // A panic names the seed that caused it.
        eprintln!("{target}: {}", path.display());
        entry(bytes);
    }
    eprintln!("{target}: {} seeds in {:?}", seeds.len(), started.elapsed());
}

#[test]
fn every_target_has_a_seed_directory() {
    for (target, _) in TARGETS {
        assert!(
            seeds_dir().join(target).is_dir(),
            "fuzz/seeds/{target}/ is missing"
        );
    }
    let targets: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    for entry in fs::read_dir(seeds_dir()).expect("fuzz/seeds") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            targets.contains(&&*name),
            "fuzz/seeds/{name}/ belongs to no target of fuzz_entry"
        );
    }
}

#[test]
fn json_decoder_seeds() {
    replay("json_decoder");
}

#[test]
fn document_seeds() {
    replay("document");
}

#[test]
fn continuation_seeds() {
    replay("continuation");
}

#[test]
fn query_seeds() {
    replay("query");
}

#[test]
fn auth_seeds() {
    replay("auth");
}

/// Writes the seeds only the fixture's keys can make (see the module doc).
#[test]
#[ignore = "writes fuzz/seeds; run by hand when the token formats change"]
fn write_generated_seeds() {
    for (target, name, bytes) in generated_seeds() {
        let path = seeds_dir().join(target).join(name);
        fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
