//! The design rule "no module imports a module above it", checked on the source: within each
//! layer of modules below (the engine's, the engine crate's, the server's), the graph of which
//! sibling module a file's `use` lines name has no cycle. Importing the parent module's own
//! items (`Engine`, re-exported types) is how submodules add to it, and is not an edge.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// The `.rs` files under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The `use` declarations of a file, each with its whitespace removed.
fn uses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("use ") {
        let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        let before = rest[line_start..at].trim();
        let after = &rest[at + 4..];
        let Some(end) = after.find(';') else { break };
        if before.is_empty() || before == "pub" || before.starts_with("pub(") {
            out.push(
                after[..end]
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect(),
            );
        }
        rest = &after[end..];
    }
    out
}

/// The first segments of what `path` imports below `base` (`base::{a, b::c}` names a and b).
fn named_below<'a>(path: &'a str, base: &str) -> Vec<&'a str> {
    let Some(rest) = path.strip_prefix(base) else {
        return Vec::new();
    };
    let rest = rest.strip_prefix("::").unwrap_or(rest);
    let inner = match rest.strip_prefix('{') {
        Some(braced) => braced.strip_suffix('}').unwrap_or(braced),
        None => rest,
    };
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter_map(|p| p.split([':', '{']).next())
        .filter(|name| name.starts_with(|c: char| c.is_ascii_lowercase()))
        .collect()
}

/// Which sibling modules each module of the layer at `dir` (named `crate_path` from inside
/// the crate) imports.
fn layer(dir: &Path, crate_path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(dir) {
        let relative = file.strip_prefix(dir).expect("below the layer");
        let mut parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let module = parts[0].trim_end_matches(".rs").to_owned();
        if ["mod", "lib", "main"].contains(&module.as_str()) {
            continue;
        }
        // `super::` from this file reaches the layer's parent after this many steps.
        let file_name = parts.pop().expect("a file");
        let depth = parts.len() + usize::from(file_name != "mod.rs");
        let supers = vec!["super"; depth].join("::");
        let text = fs::read_to_string(&file).expect("readable");
        let names = graph.entry(module.clone()).or_default();
        for path in uses(&text) {
            for base in [crate_path, supers.as_str()] {
                for name in named_below(&path, base) {
                    if name != module && name != "self" && name != "super" {
                        names.insert(name.to_owned());
                    }
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for names in graph.values_mut() {
        names.retain(|n| modules.contains(n));
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_a_module_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (dir, crate_path) in [
        ("engine/src/engine", "crate::engine"),
        ("engine/src", "crate"),
        ("server/src", "crate"),
        ("server/src/grpc", "crate::grpc"),
        ("server/src/net", "crate::net"),
    ] {
        let graph = layer(&root.join(dir), crate_path);
        assert!(graph.len() > 1, "{dir}: modules found");
        if let Some(found) = cycle(&graph) {
            panic!("{dir}: modules import each other: {}", found.join(" -> "));
        }
    }
}

#[test]
fn the_check_finds_a_cycle() {
    let dir = tempfile_dir();
    fs::write(dir.join("a.rs"), "use super::b::B;\npub struct A;\n").expect("write");
    fs::write(
        dir.join("b.rs"),
        "use crate::x::{a::A, c};\npub struct B;\n",
    )
    .expect("write");
    fs::write(dir.join("c.rs"), "//! Nothing to use here; no imports.\n").expect("write");
    let graph = layer(&dir, "crate::x");
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()])
    );
    fs::write(dir.join("a.rs"), "pub struct A;\n").expect("write");
    assert_eq!(cycle(&layer(&dir, "crate::x")), None);
    fs::remove_dir_all(&dir).expect("clean up");
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mayfly-layering-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("temp dir");
    dir
}
