//! Ids of databases, collections and documents.

use std::{borrow::Borrow, fmt, sync::Arc};

use super::invalid::InvalidInput;

/// Longest id, in characters.
pub const MAX_ID_CHARS: usize = 255;

/// What an id names, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// A database id.
    Database,
    /// A collection id.
    Collection,
    /// A document id.
    Document,
    /// A write request's idempotency key (it follows the rules of a document id).
    IdempotencyKey,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::Database => "database",
            IdKind::Collection => "collection",
            IdKind::Document => "document",
            IdKind::IdempotencyKey => "idempotency key",
        })
    }
}

/// Why a string is not an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdProblem {
    /// No characters.
    Empty,
    /// More than [`MAX_ID_CHARS`] characters.
    TooLong { chars: usize },
    /// One of `/ \ ? #`, which would make a resource address ambiguous.
    Separator(char),
    /// A control character (U+0000 to U+001F, U+007F to U+009F): NUL, a newline, a tab...
    Control(char),
    /// Nothing but whitespace.
    Blank,
}

/// A validated id: 1-255 characters, none of `/ \ ? #` (characters that would make a
/// resource address ambiguous), no control characters, not only whitespace. Shared: the
/// index, the metadata and storage hold one copy.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(Arc<str>);

impl ResourceId {
    /// Validates `raw` as an id of the given kind: what a request may name or create.
    pub fn parse(kind: IdKind, raw: &str) -> Result<Self, InvalidInput> {
        let problem = if let Some(c) = raw.chars().find(|c| c.is_control()) {
            Some(IdProblem::Control(c))
        } else if !raw.is_empty() && raw.chars().all(char::is_whitespace) {
            Some(IdProblem::Blank)
        } else {
            Self::stored_problem(raw)
        };
        match problem {
            Some(problem) => Err(InvalidInput::Id {
                kind,
                value: raw.to_owned(),
                problem,
            }),
            None => Ok(ResourceId(raw.into())),
        }
    }

    /// Validates an id read back from storage by the rules it was written under: ids with
    /// control characters or only whitespace, refused since, may be stored from earlier
    /// versions and stay readable, listable and expirable.
    pub fn parse_stored(kind: IdKind, raw: &str) -> Result<Self, InvalidInput> {
        match Self::stored_problem(raw) {
            Some(problem) => Err(InvalidInput::Id {
                kind,
                value: raw.to_owned(),
                problem,
            }),
            None => Ok(ResourceId(raw.into())),
        }
    }

    /// What every id ever accepted satisfies.
    fn stored_problem(raw: &str) -> Option<IdProblem> {
        let chars = raw.chars().count();
        if chars == 0 {
            Some(IdProblem::Empty)
        } else if chars > MAX_ID_CHARS {
            Some(IdProblem::TooLong { chars })
        } else {
            raw.chars()
                .find(|c| matches!(c, '/' | '\\' | '?' | '#'))
                .map(IdProblem::Separator)
        }
    }

    /// The empty string: sorts before every valid id, for range bounds only.
    pub(crate) fn min_value() -> Self {
        ResourceId("".into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ResourceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Id of a database.
pub type DatabaseId = ResourceId;
/// Id of a collection within its database.
pub type CollectionId = ResourceId;
/// Id of a document within its partition.
pub type DocumentId = ResourceId;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_1_to_255_characters_without_separators() {
        assert!(ResourceId::parse(IdKind::Document, "a").is_ok());
        assert!(
            ResourceId::parse(IdKind::Document, &"é".repeat(255)).is_ok(),
            "characters, not bytes"
        );
        assert!(ResourceId::parse(IdKind::Document, "SO05 spaces-and_ünïcode.ok").is_ok());
    }

    /// Regression (issue 23): ids could hold NUL, newlines and other control characters, or
    /// be only whitespace.
    #[test]
    fn rejects_control_characters_and_blank_ids_naming_the_code_point() {
        for (bad, code_point) in [
            ("a\0b", Some("U+0000")),
            ("line\nbreak", Some("U+000A")),
            ("tab\t", Some("U+0009")),
            ("\r", Some("U+000D")),
            ("del\u{7f}", Some("U+007F")),
            ("c1\u{85}", Some("U+0085")),
            (" ", None),
            ("   ", None),
            ("\u{a0}\u{3000}", None),
        ] {
            for kind in [IdKind::Database, IdKind::Collection, IdKind::Document] {
                let err = ResourceId::parse(kind, bad).expect_err(bad);
                assert!(
                    matches!(err, InvalidInput::Id { kind: k, .. } if k == kind),
                    "{err}"
                );
                let message = err.to_string();
                assert!(message.contains(&format!("{kind} id")), "{message}");
                match code_point {
                    Some(point) => assert!(
                        message.contains(point) && message.contains("control character"),
                        "{message}"
                    ),
                    None => assert!(message.contains("only whitespace"), "{message}"),
                }
            }
            // Stored by an earlier version: still read back.
            assert!(
                ResourceId::parse_stored(IdKind::Document, bad).is_ok(),
                "{bad:?}"
            );
        }
        for good in [" a", "a b ", "é\u{200b}", "tab-less"] {
            assert!(
                ResourceId::parse(IdKind::Document, good).is_ok(),
                "{good:?}"
            );
        }
        assert!(ResourceId::parse_stored(IdKind::Document, "a/b").is_err());
        assert!(ResourceId::parse_stored(IdKind::Document, "").is_err());
    }

    #[test]
    fn rejects_empty_long_and_separator_ids() {
        for bad in ["", "a/b", "a\\b", "a?b", "a#b"] {
            let err = ResourceId::parse(IdKind::Document, bad).expect_err(bad);
            assert!(err.to_string().contains("document id"), "{err}");
        }
        let err = ResourceId::parse(IdKind::Collection, &"x".repeat(256)).expect_err("too long");
        assert!(err.to_string().contains("256 characters"), "{err}");
    }
}
