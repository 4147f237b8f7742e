//! Which document paths a collection indexes: the included and excluded paths of a Cosmos DB
//! indexing policy (`/*`, `/path/?`, `/path/*`), and the rule that decides a path.

use std::fmt;

use super::invalid::InvalidInput;

/// Paths a policy may list, in all.
pub const MAX_INDEX_PATHS: usize = 100;
/// Bytes of one policy path.
pub const MAX_INDEX_PATH_BYTES: usize = 1024;

/// One policy path: property names from the root, then `?` (the value at exactly that path)
/// or `*` (that path and everything under it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexPath {
    segments: Vec<String>,
    subtree: bool,
}

impl IndexPath {
    /// Parses `/a/b/?`, `/a/*`, `/*`, with `"quoted"` names for names holding `/` or
    /// starting with a quote (`/"_etag"/?`).
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: &str| InvalidInput::IndexPath {
            path: text.chars().take(200).collect(),
            reason: reason.to_owned(),
        };
        if text.len() > MAX_INDEX_PATH_BYTES {
            return Err(bad(&format!(
                "it is longer than {MAX_INDEX_PATH_BYTES} bytes"
            )));
        }
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| bad("it must start with '/'"))?;
        let mut segments = Vec::new();
        let mut rest = rest;
        loop {
            if rest == "?" || rest == "*" {
                if rest == "?" && segments.is_empty() {
                    return Err(bad(
                        "'/?' names no property; use '/*' for the whole document",
                    ));
                }
                return Ok(IndexPath {
                    segments,
                    subtree: rest == "*",
                });
            }
            let (name, after) = if let Some(quoted) = rest.strip_prefix('"') {
                let end = quoted
                    .find('"')
                    .ok_or_else(|| bad("a quoted name has no closing '\"'"))?;
                (&quoted[..end], &quoted[end + 1..])
            } else {
                let end = rest.find('/').unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if name.is_empty() {
                return Err(bad("it has an empty property name"));
            }
            if name == "[]" {
                return Err(bad(
                    "array element paths ('[]') are not indexed: index the array's property with '/*' and query its elements with a scan",
                ));
            }
            segments.push(name.to_owned());
            rest = after.strip_prefix('/').ok_or_else(|| {
                bad("it must end with '/?' (one value) or '/*' (everything under a path)")
            })?;
        }
    }

    /// How well this path matches a document path: `None` if it does not, else a rank (more
    /// precise is higher).
    fn rank(&self, path: &[&str]) -> Option<usize> {
        let n = self.segments.len();
        let matches = path.len() >= n
            && self.segments.iter().zip(path).all(|(a, b)| a == b)
            && (self.subtree || path.len() == n);
        // At equal depth, '?' (exactly this path) is more precise than '*'.
        matches.then_some(2 * n + usize::from(!self.subtree))
    }

    fn is_root(&self) -> bool {
        self.segments.is_empty() && self.subtree
    }
}

impl fmt::Display for IndexPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.segments {
            if s.contains('/') || s.starts_with('"') || s == "?" || s == "*" {
                write!(f, "/\"{s}\"")?;
            } else {
                write!(f, "/{s}")?;
            }
        }
        f.write_str(if self.subtree { "/*" } else { "/?" })
    }
}

/// A collection's included and excluded paths. The most precise matching path decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexPaths {
    included: Vec<IndexPath>,
    excluded: Vec<IndexPath>,
}

impl Default for IndexPaths {
    /// Cosmos DB's default: everything, but `_etag`.
    fn default() -> Self {
        IndexPaths {
            included: vec![IndexPath {
                segments: Vec::new(),
                subtree: true,
            }],
            excluded: vec![IndexPath {
                segments: vec!["_etag".to_owned()],
                subtree: false,
            }],
        }
    }
}

impl IndexPaths {
    /// Checks a policy's paths: each valid, none listed twice, and the root (`/*`) included or
    /// excluded, as Cosmos DB requires. Both lists empty means the default policy.
    pub fn new(included: &[String], excluded: &[String]) -> Result<Self, InvalidInput> {
        if included.is_empty() && excluded.is_empty() {
            return Ok(IndexPaths::default());
        }
        if included.len() + excluded.len() > MAX_INDEX_PATHS {
            return Err(InvalidInput::IndexPolicy {
                reason: format!(
                    "it lists {} paths; at most {MAX_INDEX_PATHS} are allowed",
                    included.len() + excluded.len()
                ),
            });
        }
        let parse = |paths: &[String]| {
            paths
                .iter()
                .map(|p| IndexPath::parse(p))
                .collect::<Result<Vec<_>, _>>()
        };
        let (included, excluded) = (parse(included)?, parse(excluded)?);
        let all: Vec<&IndexPath> = included.iter().chain(&excluded).collect();
        for (i, a) in all.iter().enumerate() {
            if all[..i].contains(a) {
                return Err(InvalidInput::IndexPolicy {
                    reason: format!("the path '{a}' is listed more than once"),
                });
            }
        }
        if !all.iter().any(|p| p.is_root()) {
            return Err(InvalidInput::IndexPolicy {
                reason: "the root path '/*' must be either included or excluded".to_owned(),
            });
        }
        Ok(IndexPaths { included, excluded })
    }

    /// Whether the value at `path` (property names from the root) is indexed.
    pub fn includes(&self, path: &[&str]) -> bool {
        let best = |paths: &[IndexPath]| paths.iter().filter_map(|p| p.rank(path)).max();
        match (best(&self.included), best(&self.excluded)) {
            (Some(i), Some(e)) => i > e,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// Included paths, as text.
    pub fn included(&self) -> Vec<String> {
        self.included.iter().map(ToString::to_string).collect()
    }

    /// Excluded paths, as text.
    pub fn excluded(&self) -> Vec<String> {
        self.excluded.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(included: &[&str], excluded: &[&str]) -> Result<IndexPaths, InvalidInput> {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        IndexPaths::new(&own(included), &own(excluded))
    }

    #[test]
    fn the_default_indexes_everything_but_etag() {
        let p = IndexPaths::default();
        assert!(p.includes(&["a"]));
        assert!(p.includes(&["a", "b", "c"]));
        assert!(!p.includes(&["_etag"]));
        assert!(
            p.includes(&["_etag", "x"]),
            "'?' covers the value at the path only"
        );
        assert_eq!(paths(&[], &[]).expect("default"), p);
        assert_eq!(p.included(), vec!["/*"]);
        assert_eq!(p.excluded(), vec!["/_etag/?"]);
    }

    #[test]
    fn the_most_precise_path_decides() {
        let p = paths(&["/*", "/a/keep/?"], &["/a/*", "/b/?"]).expect("valid");
        assert!(p.includes(&["x"]));
        assert!(!p.includes(&["a"]));
        assert!(!p.includes(&["a", "other"]));
        assert!(p.includes(&["a", "keep"]));
        assert!(!p.includes(&["a", "keep", "deeper"]));
        assert!(!p.includes(&["b"]));
        assert!(p.includes(&["b", "c"]));

        let only = paths(&["/status/?"], &["/*"]).expect("valid");
        assert!(only.includes(&["status"]));
        assert!(!only.includes(&["other"]));
        assert!(!only.includes(&["status", "x"]));
    }

    #[test]
    fn paths_parse_and_print_back() {
        for text in ["/*", "/a/?", "/a/b/*", "/\"x/y\"/?", "/\"_etag\"/?"] {
            let p = IndexPath::parse(text).expect(text);
            assert_eq!(IndexPath::parse(&p.to_string()).expect("again"), p);
        }
        assert_eq!(
            IndexPath::parse("/\"_etag\"/?").expect("valid").to_string(),
            "/_etag/?"
        );
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        for (bad, why) in [
            ("a/?", "start with '/'"),
            ("/a", "must end with"),
            ("/a/b", "must end with"),
            ("//?", "empty property name"),
            ("/?", "names no property"),
            ("/tags/[]/?", "not indexed"),
            ("/\"open/?", "closing"),
        ] {
            let err = IndexPath::parse(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let err = paths(&["/a/?"], &[]).expect_err("no root").to_string();
        assert!(err.contains("'/*' must be"), "{err}");
        let err = paths(&["/*"], &["/*"]).expect_err("twice").to_string();
        assert!(err.contains("more than once"), "{err}");
        let many: Vec<String> = (0..=MAX_INDEX_PATHS).map(|i| format!("/p{i}/?")).collect();
        let err = IndexPaths::new(&many, &["/*".to_owned()])
            .expect_err("too many")
            .to_string();
        assert!(err.contains("at most"), "{err}");
    }
}
